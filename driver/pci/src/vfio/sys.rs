//! The system calls of the VFIO layer, behind a trait so tests can replace the kernel.
//!
//! Trust model: [`RealSys`] hands the kernel exactly the buffers the caller passed, sized by the
//! slice, so the kernel never writes past them; file descriptors are owned by [`OwnedFd`] and
//! closed once. Everything above this module is safe code that builds and parses byte buffers.

use std::ffi::CString;
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::ptr::NonNull;

/// The argument of an ioctl.
#[derive(Debug)]
pub enum IoctlArg<'a> {
    /// No argument.
    None,
    /// An integer passed by value.
    Value(u64),
    /// A pointer to this buffer; the kernel may read and write all of it.
    Buf(&'a mut [u8]),
    /// A pointer to `arg`, whose `u64` at offset `ptr_at` is set to the address of `array`
    /// just before the call (iommufd's `IOMMU_IOAS_IOVA_RANGES`: the struct points at an
    /// output array). The kernel may read and write all of `arg`, and write into `array` as
    /// many elements as a count field in `arg` allows, which the caller sets to at most what
    /// `array` holds.
    BufArray {
        /// The argument struct.
        arg: &'a mut [u8],
        /// Where in `arg` the array's address goes.
        ptr_at: usize,
        /// The output array.
        array: &'a mut [u8],
    },
}

/// The system calls VFIO needs. [`RealSys`] is the kernel; tests use the fake in
/// [`super::fake`].
pub trait SysOps: Send + Sync + fmt::Debug {
    /// `open(path, O_RDWR | O_CLOEXEC)`.
    fn open(&self, path: &Path) -> io::Result<OwnedFd>;
    /// `ioctl(fd, req, arg)`; returns the non-negative result.
    fn ioctl(&self, fd: RawFd, req: u64, arg: IoctlArg<'_>) -> io::Result<i32>;
    /// An ioctl that returns a new file descriptor (`VFIO_GROUP_GET_DEVICE_FD`), owned by the
    /// caller from then on.
    fn ioctl_new_fd(&self, fd: RawFd, req: u64, arg: IoctlArg<'_>) -> io::Result<OwnedFd>;
    /// A second descriptor of the same open file (`fcntl(F_DUPFD_CLOEXEC)`): a device cdev
    /// can be bound to iommufd only once, so a second open of the same device in one process
    /// shares the first one's file, as the group path does.
    fn dup(&self, fd: &OwnedFd) -> io::Result<OwnedFd> {
        fd.try_clone()
    }
    /// `pread(fd, buf, off)`: reads exactly `buf.len()` bytes or fails.
    fn pread(&self, fd: RawFd, buf: &mut [u8], off: u64) -> io::Result<()>;
    /// `pwrite(fd, buf, off)`: writes exactly `buf.len()` bytes or fails.
    fn pwrite(&self, fd: RawFd, buf: &[u8], off: u64) -> io::Result<()>;
    /// `mmap(NULL, len, PROT_READ|PROT_WRITE, MAP_SHARED, fd, off)`.
    fn mmap(&self, fd: RawFd, off: u64, len: usize) -> io::Result<NonNull<u8>>;
    /// `munmap(ptr, len)` of a mapping made by [`SysOps::mmap`].
    ///
    /// # Safety
    /// `ptr`/`len` come from one earlier `mmap` of this object, and nothing uses the range
    /// afterwards.
    unsafe fn munmap(&self, ptr: NonNull<u8>, len: usize) -> io::Result<()>;
}

/// The real kernel.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealSys;

fn cvt(r: libc::c_int) -> io::Result<i32> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

impl SysOps for RealSys {
    fn open(&self, path: &Path) -> io::Result<OwnedFd> {
        use std::os::unix::ffi::OsStrExt;
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))?;
        // SAFETY: `c` is a valid NUL-terminated string that outlives the call.
        let fd = cvt(unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) })?;
        // SAFETY: `open` just returned this descriptor and nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn ioctl(&self, fd: RawFd, req: u64, arg: IoctlArg<'_>) -> io::Result<i32> {
        let r = match arg {
            // SAFETY: VFIO ioctls without an argument read nothing from user memory.
            IoctlArg::None => unsafe { libc::ioctl(fd, req as libc::c_ulong) },
            // SAFETY: a by-value argument is never dereferenced by the kernel.
            IoctlArg::Value(v) => unsafe { libc::ioctl(fd, req as libc::c_ulong, v as libc::c_ulong) },
            // SAFETY: the kernel reads/writes at most `argsz` bytes, which every caller sets to
            // at most `buf.len()`; the buffer is exclusively borrowed for the call.
            IoctlArg::Buf(b) => unsafe { libc::ioctl(fd, req as libc::c_ulong, b.as_mut_ptr()) },
            IoctlArg::BufArray { arg, ptr_at, array } => {
                let addr = array.as_mut_ptr() as u64;
                arg.get_mut(ptr_at..ptr_at + 8)
                    .ok_or_else(|| {
                        io::Error::new(io::ErrorKind::InvalidInput, "array pointer outside the argument")
                    })?
                    .copy_from_slice(&addr.to_ne_bytes());
                // SAFETY: the kernel reads/writes at most the struct's `size` bytes of `arg`
                // (at most `arg.len()`, as every caller sets it) and writes into `array` at most
                // the element count the caller put in `arg`, which it keeps within
                // `array.len()`; both buffers are exclusively borrowed for the call.
                unsafe { libc::ioctl(fd, req as libc::c_ulong, arg.as_mut_ptr()) }
            }
        };
        cvt(r)
    }

    fn ioctl_new_fd(&self, fd: RawFd, req: u64, arg: IoctlArg<'_>) -> io::Result<OwnedFd> {
        let new = self.ioctl(fd, req, arg)?;
        // SAFETY: the ioctl succeeded and returned a fresh descriptor that this process owns and
        // that nothing else will close.
        Ok(unsafe { OwnedFd::from_raw_fd(new) })
    }

    fn pread(&self, fd: RawFd, buf: &mut [u8], off: u64) -> io::Result<()> {
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes for the duration of the call.
        let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), off as libc::off_t) };
        match n {
            n if n < 0 => Err(io::Error::last_os_error()),
            n if n as usize == buf.len() => Ok(()),
            n => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("short read: {n} of {} bytes", buf.len()),
            )),
        }
    }

    fn pwrite(&self, fd: RawFd, buf: &[u8], off: u64) -> io::Result<()> {
        // SAFETY: `buf` is valid for reads of `buf.len()` bytes for the duration of the call.
        let n = unsafe { libc::pwrite(fd, buf.as_ptr().cast(), buf.len(), off as libc::off_t) };
        match n {
            n if n < 0 => Err(io::Error::last_os_error()),
            n if n as usize == buf.len() => Ok(()),
            n => Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("short write: {n} of {} bytes", buf.len()),
            )),
        }
    }

    fn mmap(&self, fd: RawFd, off: u64, len: usize) -> io::Result<NonNull<u8>> {
        // SAFETY: a new shared mapping at an address the kernel chooses; it aliases no Rust
        // object, and the returned pointer is only used through raw/volatile accesses.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                off as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned NULL"))
    }

    unsafe fn munmap(&self, ptr: NonNull<u8>, len: usize) -> io::Result<()> {
        // SAFETY: the caller guarantees that `ptr`/`len` is one earlier mapping, unused after.
        cvt(unsafe { libc::munmap(ptr.as_ptr().cast(), len) }).map(|_| ())
    }
}

/// A new eventfd with counter 0, close-on-exec and non-blocking (a read of a zero counter fails
/// with `WouldBlock` instead of sleeping). Always the real kernel: an eventfd is plain memory
/// shared with whoever signals it, so the fake VFIO layer uses real ones too.
pub(crate) fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd takes no pointers; it returns a new descriptor or -1.
    let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
    // SAFETY: `eventfd` just returned this descriptor and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Sleeps until `fd` is readable or `timeout` passes (`None`: no limit). Returns whether it is
/// readable. A signal that interrupts the sleep ends it early (`Ok(false)`); callers loop.
pub(crate) fn poll_readable(fd: RawFd, timeout: Option<std::time::Duration>) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = match timeout {
        None => -1,
        // Round up, so a short timeout does not become a busy poll of 0 ms.
        Some(t) => t.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as libc::c_int,
    };
    // SAFETY: `p` is one valid pollfd, exclusively borrowed for the call; nfds is 1.
    let r = unsafe { libc::poll(&mut p, 1, ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::Interrupted => Ok(false),
            _ => Err(e),
        };
    }
    Ok(r > 0 && p.revents & libc::POLLIN != 0)
}

/// Sleeps until one of `fds` is readable or `timeout` passes (`None`: no limit). Returns a
/// readable flag per descriptor (all false after a timeout or a signal).
pub(crate) fn poll_any(fds: &[RawFd], timeout: Option<std::time::Duration>) -> io::Result<Vec<bool>> {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = match timeout {
        None => -1,
        Some(t) => t.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as libc::c_int,
    };
    // SAFETY: `p` holds `p.len()` valid pollfds, exclusively borrowed for the call.
    let r = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::Interrupted => Ok(vec![false; fds.len()]),
            _ => Err(e),
        };
    }
    Ok(p.iter().map(|p| p.revents & libc::POLLIN != 0).collect())
}

/// Adds 1 to the eventfd `fd` as the kernel does when an interrupt fires (the fake kernel's
/// way to raise an interrupt bound by number).
pub(crate) fn signal_eventfd(fd: RawFd) -> io::Result<()> {
    let one = 1u64.to_ne_bytes();
    // SAFETY: writes 8 bytes from a local buffer valid for the call; `fd` is only written to.
    let n = unsafe { libc::write(fd, one.as_ptr().cast(), one.len()) };
    if n == 8 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A raw descriptor of an owned fd, for passing to [`SysOps`].
pub(crate) fn raw(fd: &OwnedFd) -> RawFd {
    fd.as_raw_fd()
}
