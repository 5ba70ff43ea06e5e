//! What the connection's unit tests share: a socket pair on loopback (the connection's end
//! non-blocking), a DMA pool in plain memory, and a host end that reads the PDUs the
//! connection sends.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vfpoll_dma::{DmaContext, DmaPool, PageSize};

use super::Conn;
use crate::fabrics::ConnInfo;
use crate::pdu::{read_c2h_header, ConnParams, CtrlPdu, TargetLimits};
use crate::server::metrics::Stats;

/// A connected pair: the target's end (non-blocking) and the host's (blocking, with a
/// timeout so that a missing PDU fails the test instead of hanging it).
pub(super) fn socket_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let host = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (target, _) = l.accept().unwrap();
    target.set_nonblocking(true).unwrap();
    host.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    host.set_nodelay(true).unwrap();
    (target, host)
}

/// A pool of `count` buffers of `size` bytes in plain memory.
pub(super) fn pool(size: usize, count: usize) -> DmaPool {
    DmaContext::for_testing()
        .pool(size, count, PageSize::Base4K)
        .unwrap()
}

/// Where the tests' connections come from.
pub(super) fn info() -> ConnInfo {
    ConnInfo {
        portid: 1,
        local_addr: Some("127.0.0.1".into()),
        peer: "test-host".into(),
    }
}

/// A connection before its ICReq, and the host's end of its socket.
pub(super) fn conn() -> (Conn, Host) {
    let (t, h) = socket_pair();
    let c = Conn::new(7, t, info(), &TargetLimits::default(), Arc::new(Stats::default()));
    (c, Host::new(h))
}

/// The host's end: reads controller PDUs as a host does.
pub(super) struct Host {
    pub s: TcpStream,
    /// What the host believes was negotiated (digests decide what it reads).
    pub params: ConnParams,
}

impl Host {
    pub(super) fn new(s: TcpStream) -> Self {
        let mut params = ConnParams::new(&TargetLimits::default());
        params.phase = crate::pdu::Phase::Ready;
        Host { s, params }
    }

    /// Sends `bytes`.
    pub(super) fn send(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).unwrap();
    }

    /// Reads one PDU: its header, its data (without padding and digest) and the raw bytes.
    pub(super) fn recv(&mut self) -> (CtrlPdu, Vec<u8>, Vec<u8>) {
        let (h, mut raw) = read_c2h_header(&mut self.s, &self.params).unwrap();
        let have = raw.len();
        raw.resize(have + h.layout.after_header() as usize, 0);
        self.s.read_exact(&mut raw[have..]).unwrap();
        let at = have + h.layout.pad as usize;
        let data = raw[at..at + h.layout.data_len as usize].to_vec();
        (h.pdu, data, raw)
    }

    /// True when nothing more arrives within 50 ms.
    pub(super) fn quiet(&mut self) -> bool {
        self.s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let mut b = [0u8; 1];
        let quiet = match self.s.peek(&mut b) {
            Ok(n) => n == 0,
            Err(e) => matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
        };
        self.s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        quiet
    }
}

/// Retries `f` until it gives `Some`, for at most 10 s (bytes sent on loopback arrive
/// promptly but not within the same instant).
pub(super) fn eventually<T>(mut f: impl FnMut() -> Option<T>) -> T {
    let t0 = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "timed out");
        std::thread::sleep(Duration::from_millis(1));
    }
}
