//! The receive side's staging buffer: one `recv` takes what the socket has (several PDU
//! headers and capsules at once, as a busy host sends them) and the parser takes it from
//! here, so a queue deep in small commands costs one system call per batch, not two or three
//! per PDU. Write data that has not been staged is received straight into its DMA buffer.

use std::io::{self, Read};
use std::net::TcpStream;

/// Bytes the staging buffer holds: enough for dozens of command capsules; a few KiB of the
/// write data that follows an H2CData header may land here too and are copied on.
pub(crate) const STAGE_BYTES: usize = 8 << 10;

/// What a read gave.
pub(crate) enum ReadResult {
    /// This many bytes (0: interrupted, try again).
    Data(usize),
    /// Nothing now.
    Again,
    /// The peer closed the connection (or it failed).
    Closed,
}

/// Received bytes not yet parsed.
pub(crate) struct RxStage {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

impl RxStage {
    pub(crate) fn new() -> Self {
        RxStage {
            buf: vec![0; STAGE_BYTES].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }

    /// Staged bytes not yet taken.
    pub(crate) fn available(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// Marks `n` staged bytes as taken.
    pub(crate) fn consume(&mut self, n: usize) {
        self.start = (self.start + n).min(self.end);
    }

    /// Fills `dst` from the staged bytes, receiving more first when none are staged.
    pub(crate) fn read(&mut self, s: &mut TcpStream, dst: &mut [u8]) -> ReadResult {
        if dst.is_empty() {
            return ReadResult::Data(0);
        }
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
            match read_some(s, &mut self.buf) {
                ReadResult::Data(n) => self.end = n,
                other => return other,
            }
        }
        let n = dst.len().min(self.end - self.start);
        dst[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
        self.start += n;
        ReadResult::Data(n)
    }
}

/// One `read` from the socket into `buf`.
pub(crate) fn read_some(s: &mut TcpStream, buf: &mut [u8]) -> ReadResult {
    if buf.is_empty() {
        return ReadResult::Data(0);
    }
    match s.read(buf) {
        Ok(0) => ReadResult::Closed,
        Ok(n) => ReadResult::Data(n),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => ReadResult::Again,
        Err(e) if e.kind() == io::ErrorKind::Interrupted => ReadResult::Data(0),
        Err(_) => ReadResult::Closed,
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::net::TcpListener;

    use super::*;

    #[test]
    fn one_receive_serves_several_reads() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        s.set_nonblocking(true).unwrap();
        let mut st = RxStage::new();
        let mut a = [0u8; 3];
        assert!(matches!(st.read(&mut s, &mut a), ReadResult::Again));
        c.write_all(b"abcdefgh").unwrap();
        let t0 = std::time::Instant::now();
        while st.available().is_empty() {
            let mut one = [0u8; 0];
            assert!(matches!(st.read(&mut s, &mut one), ReadResult::Data(0)));
            match st.read(&mut s, &mut a) {
                ReadResult::Data(n) => {
                    assert_eq!(&a[..n], &b"abc"[..n]);
                    break;
                }
                ReadResult::Again => assert!(t0.elapsed().as_secs() < 5),
                ReadResult::Closed => panic!("closed"),
            }
        }
        // The rest came in the same receive (loopback delivers the 8 bytes at once).
        assert_eq!(st.available(), b"defgh");
        st.consume(2);
        let mut b = [0u8; 10];
        assert!(matches!(st.read(&mut s, &mut b), ReadResult::Data(3)));
        assert_eq!(&b[..3], b"fgh");
        drop(c);
        let mut z = [0u8; 1];
        let t0 = std::time::Instant::now();
        loop {
            match st.read(&mut s, &mut z) {
                ReadResult::Closed => break,
                ReadResult::Again => assert!(t0.elapsed().as_secs() < 5),
                ReadResult::Data(_) => panic!("no more data was sent"),
            }
        }
    }
}
