//! `vfpoll target --metrics ADDR`: the Prometheus text endpoint, served by `tiny_http` on a
//! thread of its own (never a worker's): `GET /metrics` reads the workers' counters
//! ([`vfpoll_nvmf::server::Server::metrics`]) at each scrape; any other path is 404.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Context as _;

/// The content type of the Prometheus text exposition format.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A running metrics endpoint; dropping it stops the thread.
pub struct Endpoint {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Endpoint {
    /// Listens on `addr` (port 0 picks one) and answers each scrape with `render()`.
    pub fn start(addr: SocketAddr, render: impl Fn() -> String + Send + 'static) -> anyhow::Result<Self> {
        let http = tiny_http::Server::http(addr)
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(|| format!("--metrics {addr}: cannot listen (is the port in use?)"))?;
        let addr = http
            .server_addr()
            .to_ip()
            .context("the metrics listener has no IP address")?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("nvmf-metrics".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    let req = match http.recv_timeout(Duration::from_millis(200)) {
                        Ok(Some(r)) => r,
                        Ok(None) => continue,
                        Err(e) => {
                            log::warn!("metrics endpoint: {e}");
                            continue;
                        }
                    };
                    let answer = if req.url() == "/metrics" || req.url().starts_with("/metrics?") {
                        let header = tiny_http::Header::from_bytes("Content-Type", CONTENT_TYPE)
                            .expect("a valid header");
                        req.respond(tiny_http::Response::from_string(render()).with_header(header))
                    } else {
                        req.respond(
                            tiny_http::Response::from_string("vfpoll target: scrape /metrics\n")
                                .with_status_code(404),
                        )
                    };
                    if let Err(e) = answer {
                        log::debug!("metrics endpoint: answering a scrape: {e}");
                    }
                }
            })
            .context("starting the metrics thread")?;
        Ok(Endpoint {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            drop(t.join());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpStream;

    use super::*;

    fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn scrapes_get_the_text_and_other_paths_404() {
        let n = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let m = n.clone();
        let ep = Endpoint::start("127.0.0.1:0".parse().unwrap(), move || {
            format!("x_total {}\n", m.fetch_add(1, Ordering::Relaxed))
        })
        .unwrap();
        let a = get(ep.addr(), "/metrics");
        assert!(a.starts_with("HTTP/1.1 200"), "{a}");
        assert!(a.contains("text/plain; version=0.0.4"), "{a}");
        assert!(a.ends_with("x_total 0\n"), "{a}");
        assert!(
            get(ep.addr(), "/metrics").ends_with("x_total 1\n"),
            "rendered at each scrape"
        );
        assert!(get(ep.addr(), "/").starts_with("HTTP/1.1 404"));
        let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let e = Endpoint::start(busy.local_addr().unwrap(), String::new)
            .err()
            .unwrap();
        assert!(format!("{e:#}").contains("in use"), "{e:#}");
    }
}
