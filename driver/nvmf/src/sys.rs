//! Socket I/O straight from and into DMA buffers, and the epoll and eventfd system calls: the
//! only `unsafe` code of the crate.
//!
//! Read data goes to the socket from the DMA buffer the backend read it into, and write data
//! comes from the socket into the DMA buffer the backend then writes: no copy in between. The
//! kernel reads or writes those bytes through raw pointers (`sendmsg`/`recv`); no Rust
//! reference to DMA memory is ever made.
//!
//! Trust model: a [`DmaBuf`] is a unique handle (not `Clone`) to memory that stays mapped while
//! its pool lives; a queue pair takes buffers by value while the device owns them. So a
//! `&DmaBuf` or `&mut DmaBuf` held by the caller proves the device does not own those bytes now,
//! and the range checks below keep every access inside the buffer.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use vfpoll_dma::DmaBuf;

/// Checks that `off..off + len` is inside `buf`.
fn check(buf: &DmaBuf, off: usize, len: usize) -> io::Result<()> {
    match off.checked_add(len) {
        Some(end) if end <= buf.len() => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{len} bytes at {off} outside a {}-byte buffer", buf.len()),
        )),
    }
}

/// One piece of a gathered send: bytes in ordinary memory, or `len` bytes of a DMA buffer from
/// `off`.
#[derive(Clone, Copy)]
pub(crate) enum Piece<'a> {
    /// Ordinary bytes.
    Bytes(&'a [u8]),
    /// A range of a DMA buffer.
    Dma(&'a DmaBuf, usize, usize),
}

/// At most this many pieces go into one `sendmsg`.
pub(crate) const MAX_PIECES: usize = 64;

/// Sends `pieces` in order in one `sendmsg` without blocking (empty ones skipped, at most
/// [`MAX_PIECES`]). Returns the bytes sent (possibly fewer than offered; `WouldBlock` when
/// none could be).
pub(crate) fn send_many(fd: RawFd, pieces: &[Piece<'_>]) -> io::Result<usize> {
    let mut iov = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; MAX_PIECES];
    let mut n = 0;
    for p in pieces.iter().take(MAX_PIECES) {
        let (base, len) = match *p {
            Piece::Bytes(b) => (b.as_ptr(), b.len()),
            Piece::Dma(buf, off, len) => {
                check(buf, off, len)?;
                (buf.as_ptr().wrapping_add(off).cast_const(), len)
            }
        };
        if len != 0 {
            iov[n] = libc::iovec {
                iov_base: base.cast_mut().cast(),
                iov_len: len,
            };
            n += 1;
        }
    }
    if n == 0 {
        return Ok(0);
    }
    // SAFETY: a zeroed msghdr is a valid "no address, no control data" header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = n as _;
    // SAFETY: every iovec points at memory valid for reads of its length for the duration of
    // the call: ordinary pieces are borrowed slices; each DMA range is inside its buffer
    // (checked), whose memory stays mapped while the caller holds it and which no device owns
    // now (module docs). The kernel only reads them.
    let r = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// Receives up to `len` bytes into `buf` at `off` without blocking. `Ok(0)`: the peer closed.
pub(crate) fn recv_into(fd: RawFd, buf: &mut DmaBuf, off: usize, len: usize) -> io::Result<usize> {
    check(buf, off, len)?;
    // SAFETY: `off..off + len` is inside `buf` (checked), writable memory that stays mapped
    // while the caller holds the buffer (`&mut`: no one else uses it, and no device owns it
    // now, module docs); the kernel writes at most `len` bytes there.
    let r = unsafe { libc::recv(fd, buf.as_ptr().wrapping_add(off).cast(), len, libc::MSG_DONTWAIT) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// An epoll instance an idle worker sleeps on until one of its sockets has data.
pub(crate) struct Epoll {
    fd: OwnedFd,
}

impl Epoll {
    /// A new epoll instance.
    pub(crate) fn new() -> io::Result<Epoll> {
        // SAFETY: epoll_create1 takes no pointers; a non-negative result is a new descriptor
        // that only this `OwnedFd` owns.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by epoll_create1 and is owned by no one else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Epoll { fd })
    }

    /// Watches `fd` for input (data, or the peer closing) for as long as there is some.
    /// Closing `fd` ends the watch.
    pub(crate) fn add(&self, fd: RawFd) -> io::Result<()> {
        self.add_keyed(fd, fd as u64)
    }

    /// Like [`Epoll::add`]; [`Epoll::ready`] reports `fd` as `key`.
    pub(crate) fn add_keyed(&self, fd: RawFd, key: u64) -> io::Result<()> {
        self.ctl_add(fd, libc::EPOLLIN as u32 | libc::EPOLLRDHUP as u32, key)
    }

    /// Watches `fd` for new input only (edge-triggered): an eventfd whose count nobody reads
    /// wakes the waiter once per signal, not at every wait.
    pub(crate) fn add_edge(&self, fd: RawFd) -> io::Result<()> {
        self.ctl_add(fd, libc::EPOLLIN as u32 | libc::EPOLLET as u32, fd as u64)
    }

    fn ctl_add(&self, fd: RawFd, events: u32, key: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: key };
        // SAFETY: `ev` is a valid epoll_event for the duration of the call; both descriptors
        // are open (the kernel checks them and fails the call otherwise).
        let r = unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Sleeps until a watched descriptor has input or `timeout_ms` passes; returns how many
    /// are ready (0 on timeout or a signal).
    pub(crate) fn wait(&self, timeout_ms: i32) -> usize {
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 16];
        // SAFETY: `evs` has room for the 16 events the kernel may write.
        let r = unsafe {
            libc::epoll_wait(
                self.fd.as_raw_fd(),
                evs.as_mut_ptr(),
                evs.len() as i32,
                timeout_ms,
            )
        };
        usize::try_from(r).unwrap_or(0)
    }

    /// The keys of the watched descriptors that have input now, without waiting (one system
    /// call however many are watched); `None` when the call failed (the caller then looks at
    /// every descriptor itself).
    pub(crate) fn ready(&self, keys: &mut Vec<u64>) -> Option<()> {
        keys.clear();
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 64];
        // SAFETY: `evs` has room for the 64 events the kernel may write.
        let r = unsafe { libc::epoll_wait(self.fd.as_raw_fd(), evs.as_mut_ptr(), evs.len() as i32, 0) };
        // More than 64 ready: the others (level-triggered) are reported by the next call.
        let n = usize::try_from(r).ok()?;
        keys.extend(evs[..n].iter().map(|e| e.u64));
        Some(())
    }
}

/// An eventfd another thread writes to wake a thread sleeping in [`Epoll::wait`] (a message in
/// its inbox, a stop). Watched edge-triggered, it is never read: each [`Waker::wake`] is one
/// new event.
pub(crate) struct Waker {
    fd: OwnedFd,
}

impl Waker {
    /// A new eventfd (non-blocking, so a wake never blocks even with the count at its maximum).
    pub(crate) fn new() -> io::Result<Waker> {
        // SAFETY: eventfd takes no pointers; a non-negative result is a new descriptor that only
        // this `OwnedFd` owns.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by eventfd and is owned by no one else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Waker { fd })
    }

    /// Signals the eventfd: a sleeper watching it wakes.
    pub(crate) fn wake(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: `one` is 8 readable bytes for the duration of the call; the descriptor is
        // open while `self` lives. A full count (EAGAIN) still leaves the eventfd readable.
        unsafe { libc::write(self.fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }

    /// The descriptor to watch.
    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// The CRC32C of `len` bytes of `buf` from `off`, continuing `crc` (data digests over DMA
/// buffers). The bytes are copied out in pieces first: no reference into DMA memory is made.
pub(crate) fn crc32c_of(mut crc: u32, buf: &DmaBuf, off: usize, len: usize) -> io::Result<u32> {
    check(buf, off, len)?;
    let mut chunk = [0u8; 4096];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(chunk.len());
        // SAFETY: `off + done .. + n` is inside `buf` (checked above), memory that stays mapped
        // and that no device owns while the caller holds the buffer (module docs); `chunk` is
        // a local array of at least `n` bytes, so the two cannot overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(buf.as_ptr().wrapping_add(off + done), chunk.as_mut_ptr(), n)
        };
        crc = crc32c::crc32c_append(crc, &chunk[..n]);
        done += n;
    }
    Ok(crc)
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;
    use std::sync::Arc;

    use vfpoll_dma::{DmaContext, FakeMapper, PageSize};

    use super::*;

    #[test]
    fn sends_and_receives_through_dma_buffers() {
        let dma = DmaContext::new(Arc::new(FakeMapper::new()));
        let mut pool = dma.pool(4096, 2, PageSize::Base4K).unwrap();
        let a = pool.alloc().unwrap();
        let mut b = pool.alloc().unwrap();
        let data: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
        pool.write(&a, 0, &data).unwrap();
        let (mut x, mut y) = UnixStream::pair().unwrap();
        // Header + 100 bytes of the buffer from offset 7 + a tail, in one call.
        let head = [Piece::Bytes(b"HEAD"), Piece::Dma(&a, 7, 100), Piece::Bytes(b"TL")];
        let n = send_many(x.as_raw_fd(), &head).unwrap();
        assert_eq!(n, 106);
        let mut got = vec![0u8; 106];
        y.read_exact(&mut got).unwrap();
        assert_eq!(&got[..4], b"HEAD");
        assert_eq!(got[4..104], data[7..107]);
        assert_eq!(&got[104..], b"TL");
        // Into a buffer at an offset.
        y.write_all(&data[..300]).unwrap();
        let mut have = 0;
        while have < 300 {
            have += recv_into(x.as_raw_fd(), &mut b, 1000 + have, 300 - have).unwrap();
        }
        let mut back = vec![0u8; 300];
        pool.read(&b, 1000, &mut back).unwrap();
        assert_eq!(back, data[..300]);
        // Gathered: bytes, a DMA range, bytes again, in one call.
        let pieces = [
            Piece::Bytes(b"AB"),
            Piece::Dma(&a, 1, 3),
            Piece::Bytes(b""),
            Piece::Bytes(b"Z"),
        ];
        assert_eq!(send_many(x.as_raw_fd(), &pieces).unwrap(), 6);
        let mut got = [0u8; 6];
        y.read_exact(&mut got).unwrap();
        assert_eq!(got, [b'A', b'B', 1, 2, 3, b'Z']);
        assert!(send_many(x.as_raw_fd(), &[Piece::Dma(&a, 4090, 10)]).is_err());
        // Outside the buffer: refused, nothing sent.
        assert!(send_many(x.as_raw_fd(), &[Piece::Dma(&a, 4000, 100)]).is_err());
        assert!(recv_into(x.as_raw_fd(), &mut b, 4090, 10).is_err());
        // Nothing to read: WouldBlock, not a hang.
        let e = recv_into(x.as_raw_fd(), &mut b, 0, 10).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        // The digest over DMA memory equals the one over the same bytes.
        assert_eq!(crc32c_of(0, &a, 7, 100).unwrap(), crc32c::crc32c(&data[7..107]));
        assert_eq!(crc32c_of(0, &a, 0, 4096).unwrap(), crc32c::crc32c(&data));
        // An idle epoll wait times out; data wakes it.
        let ep = Epoll::new().unwrap();
        ep.add(x.as_raw_fd()).unwrap();
        assert_eq!(ep.wait(10), 0);
        y.write_all(b"wake").unwrap();
        assert_eq!(ep.wait(5000), 1);
        assert_eq!(ep.wait(0), 1, "level-triggered: still readable");
        assert!(ep.add(-1).is_err());
        // Edge-triggered: one wake per new input, however long it stays unread.
        let (mut u, v) = UnixStream::pair().unwrap();
        let ep = Epoll::new().unwrap();
        ep.add_edge(v.as_raw_fd()).unwrap();
        u.write_all(b"1").unwrap();
        assert_eq!(ep.wait(5000), 1);
        assert_eq!(ep.wait(0), 0, "no new input");
        u.write_all(b"2").unwrap();
        assert_eq!(ep.wait(5000), 1);
        pool.free(a);
        pool.free(b);
        drop(x.flush());
    }
}
