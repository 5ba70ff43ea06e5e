//! QMP for the test bed: QEMU's control socket of a boot (`<run-dir>/qmp.sock`, or a short
//! path under the temp dir when that one is too long for a socket: [`socket_path`]), and an
//! agent that runs QMP commands a guest test asks for.
//!
//! The guest cannot reach the host's socket, so requests travel over the `out` share (9p,
//! uncached: each side sees the other's files at once). A guest test (see `vfpoll-tests`'
//! `qmp` module) writes `/out/qmp/<name>.req`, under a temporary name first and then renamed,
//! so that the agent never reads half a request:
//!
//! ```text
//! {"execute":"device_del","arguments":{"id":"nvmer"}}   line 1: the command, as QMP takes it
//! wait DEVICE_DELETED 10000                             optional: wait up to 10 s for the event
//! ```
//!
//! The agent, a thread of `cargo xtask vm` that looks at the directory every [`POLL`], sends the
//! command, waits for the event if asked (counting events that came after the command was sent,
//! also those before its reply), and writes `/out/qmp/<name>.resp` the same way:
//!
//! ```text
//! return {"return": {}}                                 QEMU's reply line (or: error <why>)
//! event {"event": "DEVICE_DELETED", ...}                the event line (or: event-timeout)
//! event_ms 812.4                                        command sent -> event seen, host clock
//! ```
//!
//! Every exchange is also logged to `<run-dir>/qmp.log`. Times are the host's: the time from
//! `device_del` to `DEVICE_DELETED` is how long the guest took to let the device go.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::json;
use crate::util::{err, Result};

/// The socket's file name in the run dir.
pub const SOCKET: &str = "qmp.sock";
/// The longest path a UNIX socket address holds (`sun_path` is 108 bytes, NUL included).
const SUN_PATH_MAX: usize = 107;

/// Where a boot's QMP socket lives: `<run_dir>/qmp.sock` when that path fits a UNIX socket
/// address, else `<temp dir>/vfpoll-qmp-<hash of run_dir>.sock` (a checkout under a long path
/// with a long run-dir name would otherwise make QEMU refuse to start: `-qmp unix:` cannot
/// bind a longer path). The same run dir always gets the same socket.
pub fn socket_path(run_dir: &Path) -> PathBuf {
    let own = run_dir.join(SOCKET);
    if own.as_os_str().len() <= SUN_PATH_MAX {
        return own;
    }
    // FNV-1a over the run dir's bytes: stable across runs, no dependency.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in run_dir.as_os_str().as_encoded_bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    std::env::temp_dir().join(format!("vfpoll-qmp-{h:016x}.sock"))
}
/// The request directory's name in the run dir's `out/`.
pub const REQUEST_DIR: &str = "qmp";
/// How often the agent looks for requests.
const POLL: Duration = Duration::from_millis(10);
/// Longest wait for QEMU's reply to a command.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// One event QEMU sent: when it was read, its name and its line.
#[derive(Debug, Clone)]
struct Event {
    at: Instant,
    name: String,
    line: String,
}

#[derive(Default)]
struct Events {
    list: Mutex<Vec<Event>>,
    more: Condvar,
}

/// A QMP connection in command mode.
pub struct Qmp {
    stream: UnixStream,
    replies: mpsc::Receiver<String>,
    events: Arc<Events>,
}

impl Qmp {
    /// Connects to `socket` (retrying while QEMU starts, up to `wait`), reads the greeting
    /// and enters command mode (`qmp_capabilities`).
    pub fn connect(socket: &Path, wait: Duration) -> Result<Qmp> {
        let t0 = Instant::now();
        let stream = loop {
            match UnixStream::connect(socket) {
                Ok(s) => break s,
                Err(e) if t0.elapsed() < wait => {
                    let _ = e;
                    thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(err!("QMP socket {}: {e}", socket.display())),
            }
        };
        let reader = BufReader::new(stream.try_clone()?);
        let (tx, replies) = mpsc::channel();
        let events = Arc::new(Events::default());
        let ev = Arc::clone(&events);
        thread::spawn(move || {
            for line in reader.lines().map_while(|l| l.ok()) {
                let Ok(v) = json::parse(&line) else { continue };
                if let Some(name) = v.get("event").and_then(json::Value::as_str) {
                    let e = Event {
                        at: Instant::now(),
                        name: name.to_string(),
                        line: line.clone(),
                    };
                    ev.list.lock().unwrap_or_else(|e| e.into_inner()).push(e);
                    ev.more.notify_all();
                } else if (v.get("return").is_some() || v.get("error").is_some()) && tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut q = Qmp {
            stream,
            replies,
            events,
        };
        q.execute(r#"{"execute":"qmp_capabilities"}"#)?;
        Ok(q)
    }

    /// Sends one command (a JSON object) and returns QEMU's reply line; a reply with `error`
    /// is an error.
    pub fn execute(&mut self, command: &str) -> Result<String> {
        json::parse(command).map_err(|e| err!("QMP command {command:?} is not JSON: {e}"))?;
        self.stream.write_all(command.trim().as_bytes())?;
        self.stream.write_all(b"\n")?;
        let reply = self
            .replies
            .recv_timeout(REPLY_TIMEOUT)
            .map_err(|_| err!("QEMU did not answer {command} within {REPLY_TIMEOUT:?}"))?;
        match json::parse(&reply).ok().and_then(|v| v.get("error").cloned()) {
            Some(e) => Err(err!("QEMU refused {command}: {e:?}")),
            None => Ok(reply),
        }
    }

    /// The first event `name` seen at or after `since`, waiting until `deadline`.
    fn event_after(&self, name: &str, since: Instant, deadline: Instant) -> Option<(Instant, String)> {
        let mut list = self.events.list.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(e) = list.iter().find(|e| e.name == name && e.at >= since) {
                return Some((e.at, e.line.clone()));
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            list = self
                .events
                .more
                .wait_timeout(list, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// A parsed request file.
#[derive(Debug, PartialEq)]
struct Request {
    command: String,
    wait: Option<(String, Duration)>,
}

fn parse_request(text: &str) -> Result<Request> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let command = lines
        .next()
        .ok_or_else(|| err!("empty request"))?
        .trim()
        .to_string();
    let wait = match lines.next() {
        None => None,
        Some(l) => {
            let w: Vec<&str> = l.split_whitespace().collect();
            match w[..] {
                ["wait", event, ms] => Some((
                    event.to_string(),
                    Duration::from_millis(ms.parse().map_err(|_| err!("bad wait time {ms:?}"))?),
                )),
                _ => return Err(err!("second line must be `wait <EVENT> <ms>`, not {l:?}")),
            }
        }
    };
    Ok(Request { command, wait })
}

/// The agent of one boot: runs requests until dropped.
pub struct Agent {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Agent {
    /// Starts the agent for a boot whose run dir is `run_dir` (QEMU started with
    /// `-qmp unix:<socket_path(run_dir)>,server=on,wait=off`).
    pub fn start(run_dir: &Path) -> Result<Agent> {
        let dir = run_dir.join("out").join(REQUEST_DIR);
        fs::create_dir_all(&dir)?;
        let socket = socket_path(run_dir);
        let log = run_dir.join("qmp.log");
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let thread = thread::Builder::new()
            .name("qmp-agent".into())
            .spawn(move || agent(&socket, &dir, &log, &s))?;
        Ok(Agent {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn agent(socket: &Path, dir: &Path, log_path: &Path, stop: &AtomicBool) {
    let mut log = fs::File::create(log_path).ok();
    let mut note = |s: String| {
        if let Some(f) = log.as_mut() {
            let _ = writeln!(f, "{s}");
        }
    };
    let mut qmp: Option<Qmp> = None;
    let mut done: Vec<PathBuf> = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        let mut reqs: Vec<PathBuf> = fs::read_dir(dir)
            .map(|d| {
                d.filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|x| x == "req"))
                    .filter(|p| !done.contains(p))
                    .collect()
            })
            .unwrap_or_default();
        reqs.sort();
        for path in reqs {
            done.push(path.clone());
            if qmp.is_none() {
                match Qmp::connect(socket, Duration::from_secs(10)) {
                    Ok(q) => qmp = Some(q),
                    Err(e) => note(format!("connect: {e}")),
                }
            }
            let resp = match (fs::read_to_string(&path), qmp.as_mut()) {
                (Err(e), _) => format!("error reading {}: {e}\n", path.display()),
                (_, None) => "error no QMP connection (see qmp.log)\n".to_string(),
                (Ok(text), Some(q)) => serve(q, &text),
            };
            note(format!(
                "{}:\n  {}",
                path.display(),
                resp.trim_end().replace('\n', "\n  ")
            ));
            let out = path.with_extension("resp");
            let tmp = path.with_extension("resp.tmp");
            if fs::write(&tmp, resp)
                .and_then(|()| fs::rename(&tmp, &out))
                .is_err()
            {
                note(format!("cannot write {}", out.display()));
            }
        }
        thread::sleep(POLL);
    }
}

/// Runs one request; the response file's text.
fn serve(q: &mut Qmp, text: &str) -> String {
    let r = match parse_request(text) {
        Ok(r) => r,
        Err(e) => return format!("error {e}\n"),
    };
    let sent = Instant::now();
    let reply = match q.execute(&r.command) {
        Ok(l) => l,
        Err(e) => return format!("error {e}\n"),
    };
    let mut out = format!("return {reply}\n");
    if let Some((event, limit)) = r.wait {
        match q.event_after(&event, sent, sent + limit) {
            Some((at, line)) => {
                out.push_str(&format!("event {line}\n"));
                out.push_str(&format!(
                    "event_ms {:.1}\n",
                    at.duration_since(sent).as_secs_f64() * 1e3
                ));
            }
            None => out.push_str(&format!("event-timeout {event} after {} ms\n", limit.as_millis())),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_and_bad_ones_say_why() {
        let r = parse_request("{\"execute\":\"device_del\"}\nwait DEVICE_DELETED 5000\n").unwrap();
        assert_eq!(r.command, "{\"execute\":\"device_del\"}");
        assert_eq!(r.wait, Some(("DEVICE_DELETED".into(), Duration::from_secs(5))));
        assert_eq!(parse_request("{}\n").unwrap().wait, None);
        assert!(parse_request("").is_err());
        let e = parse_request("{}\nsleep 3\n").unwrap_err().to_string();
        assert!(e.contains("wait <EVENT> <ms>"), "{e}");
    }

    #[test]
    fn a_run_dir_too_long_for_a_socket_gets_a_short_stable_socket_elsewhere() {
        let short = Path::new("/w/target/testbed/run/nvme-iommu");
        assert_eq!(socket_path(short), short.join(SOCKET));
        let long = PathBuf::from(format!(
            "/{}/run/xtask_selftest-fault-x-iommu-qemu10",
            "d".repeat(90)
        ));
        let s = socket_path(&long);
        assert!(s.as_os_str().len() <= SUN_PATH_MAX, "{}", s.display());
        assert!(s.starts_with(std::env::temp_dir()), "{}", s.display());
        assert_eq!(s, socket_path(&long), "the same run dir gets the same socket");
        assert_ne!(
            s,
            socket_path(&long.with_extension("2")),
            "another run dir another one"
        );
        // A path that just fits stays in the run dir.
        let fits = PathBuf::from(format!("/{}", "e".repeat(SUN_PATH_MAX - 1 - SOCKET.len() - 1)));
        assert_eq!(socket_path(&fits), fits.join(SOCKET));
        assert_eq!(socket_path(&fits).as_os_str().len(), SUN_PATH_MAX);
    }

    /// A fake QEMU on a socket pair: greeting, replies, an event sent between the command and
    /// its reply (as QEMU may), then the agent's answer.
    #[test]
    fn a_request_waits_for_its_event_even_one_sent_before_the_reply() {
        let dir = tempfile_dir();
        let sock = dir.join(SOCKET);
        let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let qemu = thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let mut w = s.try_clone().unwrap();
            let mut r = BufReader::new(s);
            writeln!(w, r#"{{"QMP": {{"version": {{}}, "capabilities": []}}}}"#).unwrap();
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            assert!(line.contains("qmp_capabilities"));
            writeln!(w, r#"{{"return": {{}}}}"#).unwrap();
            line.clear();
            r.read_line(&mut line).unwrap();
            assert!(line.contains("device_del"));
            thread::sleep(Duration::from_millis(30));
            writeln!(
                w,
                r#"{{"event": "DEVICE_DELETED", "data": {{"device": "nvmer"}}}}"#
            )
            .unwrap();
            writeln!(w, r#"{{"return": {{}}}}"#).unwrap();
            line.clear();
            r.read_line(&mut line).unwrap();
            writeln!(
                w,
                r#"{{"error": {{"class": "GenericError", "desc": "no such device"}}}}"#
            )
            .unwrap();
            thread::sleep(Duration::from_millis(200));
        });
        let agent = Agent::start(&dir).unwrap();
        let req = dir.join("out/qmp/001.req");
        fs::write(
            &req,
            "{\"execute\":\"device_del\",\"arguments\":{\"id\":\"nvmer\"}}\nwait DEVICE_DELETED 5000\n",
        )
        .unwrap();
        let resp = wait_file(&dir.join("out/qmp/001.resp"));
        assert!(resp.starts_with("return {\"return\": {}}\n"), "{resp}");
        assert!(resp.contains("event {\"event\": \"DEVICE_DELETED\""), "{resp}");
        let ms: f64 = resp
            .lines()
            .find_map(|l| l.strip_prefix("event_ms "))
            .unwrap()
            .parse()
            .unwrap();
        assert!((20.0..5000.0).contains(&ms), "{ms}");
        fs::write(dir.join("out/qmp/002.req"), "{\"execute\":\"device_del\"}\n").unwrap();
        let resp = wait_file(&dir.join("out/qmp/002.resp"));
        assert!(
            resp.starts_with("error QEMU refused") && resp.contains("no such device"),
            "{resp}"
        );
        drop(agent);
        qemu.join().unwrap();
        let log = fs::read_to_string(dir.join("qmp.log")).unwrap();
        assert!(log.contains("001.req") && log.contains("002.req"), "{log}");
        let _ = fs::remove_dir_all(&dir);
    }

    fn tempfile_dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("xtask-qmp-{}-{:?}", std::process::id(), Instant::now()));
        let d = PathBuf::from(d.to_string_lossy().replace([' ', '{', '}', ':'], "_"));
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn wait_file(p: &Path) -> String {
        let t0 = Instant::now();
        loop {
            if let Ok(s) = fs::read_to_string(p) {
                return s;
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "no {}", p.display());
            thread::sleep(Duration::from_millis(5));
        }
    }
}
