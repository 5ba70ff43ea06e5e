//! A typed accessor for memory-mapped device registers.
//!
//! [`Mmio`] hands out no references into device memory: every access is one volatile load or
//! store of the register's width, at an offset that is checked against the mapping's length and
//! the access's alignment. The check is always on: it costs a compare next to an uncached MMIO
//! access that costs hundreds of cycles, and it keeps the API safe in release builds too.
//!
//! Accesses are memory-safe for this process, but a device register can take a bus address and
//! start DMA there: that is why a window over a device's BAR comes only from the `unsafe`
//! [`crate::vfio::Device::map_bar`], whose caller answers for what it writes.

use std::fmt;
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::vfio::sys::SysOps;

/// One mmap of a BAR; unmapped when the last [`Mmio`] over it is dropped.
///
/// A mapping of a VFIO device is guarded ([`crate::fault`]): a SIGBUS inside it (vfio-pci
/// zapped it) replaces it with memory that reads all-ones instead of killing the process, and
/// [`BarMapping::revoke`] does the same on purpose when the device goes away, so that the
/// device file can be closed while other threads still hold (and use) the mapping.
pub struct BarMapping {
    sys: Arc<dyn SysOps>,
    ptr: NonNull<u8>,
    len: usize,
    /// Registered with the SIGBUS handler (device mappings only).
    guard: Option<crate::fault::Guard>,
    revoked: AtomicBool,
}

impl BarMapping {
    pub(crate) fn new(sys: Arc<dyn SysOps>, ptr: NonNull<u8>, len: usize) -> Self {
        BarMapping {
            sys,
            ptr,
            len,
            guard: None,
            revoked: AtomicBool::new(false),
        }
    }

    /// A mapping registered with the SIGBUS handler.
    ///
    /// # Safety
    /// `ptr`/`len` is one mapping returned by `sys.mmap`, owned by the result (nothing else
    /// unmaps it) and only accessed through raw pointers.
    pub(crate) unsafe fn guarded(sys: Arc<dyn SysOps>, ptr: NonNull<u8>, len: usize) -> Self {
        let mut m = Self::new(sys, ptr, len);
        // SAFETY: the caller's promise: the mapping lives (and is accessed by raw pointers only)
        // as long as `m`, which drops the guard before unmapping.
        m.guard = unsafe { crate::fault::Guard::new(ptr, len) };
        m
    }

    /// Replaces the mapping in place with anonymous memory that reads all-ones (the first
    /// [`crate::fault::FILL_BYTES`]; zeros after) and takes writes: from now on accesses through
    /// any [`Mmio`] over it no longer reach the device, and the device mapping no longer holds
    /// the device file open. Idempotent. For a device that is being removed: its registers then
    /// read as a vanished device's do.
    pub fn revoke(&self) -> io::Result<()> {
        if self.revoked.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        // SAFETY: `ptr`/`len` is this object's own mapping, alive until drop and accessed only
        // through raw pointers; replacing it keeps the range mapped.
        let r = unsafe { crate::fault::replace_with_ones(self.ptr, self.len) };
        if r.is_err() {
            self.revoked.store(false, Ordering::SeqCst);
        }
        r
    }

    /// Whether the mapping no longer reaches the device: revoked, or replaced after a SIGBUS.
    pub fn gone(&self) -> bool {
        self.revoked.load(Ordering::SeqCst) || self.guard.as_ref().is_some_and(|g| g.faults() > 0)
    }

    /// SIGBUS faults repaired in this mapping.
    pub fn faults(&self) -> u32 {
        self.guard.as_ref().map_or(0, |g| g.faults())
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty (never: BARs have a size).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl fmt::Debug for BarMapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BarMapping({:p}, {:#x})", self.ptr, self.len)
    }
}

impl Drop for BarMapping {
    fn drop(&mut self) {
        // Out of the SIGBUS handler's registry before the range is unmapped.
        drop(self.guard.take());
        // SAFETY: `ptr`/`len` is the mapping `SysOps::mmap` returned; this is its last owner, so
        // no accessor uses it afterwards.
        if let Err(e) = unsafe { self.sys.munmap(self.ptr, self.len) } {
            log::warn!("munmap of a BAR mapping failed: {e}");
        }
    }
}

// SAFETY: the mapping is device memory shared with hardware, accessed only through volatile
// single-register loads and stores by raw pointer; it holds no Rust data, and the pointer stays
// valid until drop, which needs exclusive ownership.
unsafe impl Send for BarMapping {}
// SAFETY: as above; concurrent volatile accesses to device registers are the device's business
// (each is one bus transaction), and no `&` or `&mut` into the mapping is ever created.
unsafe impl Sync for BarMapping {}

/// A window into a mapped BAR: volatile, bounds-checked register access.
///
/// Cloning is cheap (the mapping is reference-counted), so a queue pair can own the window that
/// holds its doorbells.
#[derive(Clone)]
pub struct Mmio {
    map: Arc<BarMapping>,
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: `base` points into `map`, which the window keeps alive and which is itself Send and
// Sync (see above); every access through the window is a single volatile load or store.
unsafe impl Send for Mmio {}
// SAFETY: as above; `&Mmio` only allows volatile register accesses, never references.
unsafe impl Sync for Mmio {}

impl fmt::Debug for Mmio {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Mmio({:p}, {:#x})", self.base, self.len)
    }
}

/// An access outside the window or misaligned.
#[derive(Debug, thiserror::Error)]
#[error("MMIO window {off:#x}+{len:#x} is outside the {size:#x}-byte BAR mapping")]
pub struct WindowError {
    off: usize,
    len: usize,
    size: usize,
}

impl Mmio {
    pub(crate) fn new(map: Arc<BarMapping>) -> Self {
        let (base, len) = (map.ptr, map.len);
        Mmio { map, base, len }
    }

    /// The whole mapping this window is part of.
    pub fn mapping(&self) -> &Arc<BarMapping> {
        &self.map
    }

    /// Whether the mapping no longer reaches the device ([`BarMapping::gone`]).
    pub fn gone(&self) -> bool {
        self.map.gone()
    }

    /// Length of the window in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the window is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The CPU virtual address of the window's start, for registering the BAR as a DMA target
    /// (peer-to-peer). Never dereference it as a Rust reference.
    pub fn as_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// A sub-window `[off, off + len)` of this one.
    pub fn window(&self, off: usize, len: usize) -> Result<Mmio, WindowError> {
        match off.checked_add(len) {
            Some(end) if end <= self.len => {
                // SAFETY: `off <= self.len`, so the result stays inside (or one past) the mapping.
                let base = unsafe { self.base.add(off) };
                Ok(Mmio {
                    map: Arc::clone(&self.map),
                    base,
                    len,
                })
            }
            _ => Err(WindowError {
                off,
                len,
                size: self.len,
            }),
        }
    }

    #[inline(always)]
    #[track_caller]
    fn at<T>(&self, off: usize) -> *mut T {
        let size = core::mem::size_of::<T>();
        assert!(
            off.is_multiple_of(size) && off.checked_add(size).is_some_and(|e| e <= self.len),
            "MMIO access of {size} bytes at {off:#x} outside or misaligned in a {:#x}-byte window",
            self.len
        );
        // SAFETY: checked just above: `off + size <= len`, so the pointer is inside the mapping.
        unsafe { self.base.as_ptr().add(off).cast() }
    }

    /// Reads a 32-bit register.
    #[inline]
    #[track_caller]
    pub fn read32(&self, off: usize) -> u32 {
        let p = self.at::<u32>(off);
        // SAFETY: `at` checked bounds and alignment; the mapping is live while `self` holds it.
        unsafe { p.read_volatile() }
    }

    /// Writes a 32-bit register.
    #[inline]
    #[track_caller]
    pub fn write32(&self, off: usize, v: u32) {
        let p = self.at::<u32>(off);
        // SAFETY: `at` checked bounds and alignment; the mapping is live while `self` holds it.
        unsafe { p.write_volatile(v) }
    }

    /// Reads a 64-bit register as two 32-bit reads, low dword first.
    ///
    /// NVMe Base 2.0 §3.1.4 lets hosts read 64-bit properties as two 32-bit accesses, and some
    /// bridges split 64-bit reads anyway; for registers that do not change (CAP) this is exact.
    #[inline]
    #[track_caller]
    pub fn read64(&self, off: usize) -> u64 {
        let lo = self.read32(off) as u64;
        let hi = self.read32(off + 4) as u64;
        lo | (hi << 32)
    }

    /// Writes a 64-bit register as two 32-bit writes, low dword first (ASQ/ACQ: the controller
    /// is disabled while they are written, so the order is not observable).
    #[inline]
    #[track_caller]
    pub fn write64(&self, off: usize, v: u64) {
        self.write32(off, v as u32);
        self.write32(off + 4, (v >> 32) as u32);
    }

    /// Reads a 16-bit register.
    #[inline]
    #[track_caller]
    pub fn read16(&self, off: usize) -> u16 {
        let p = self.at::<u16>(off);
        // SAFETY: `at` checked bounds and alignment; the mapping is live while `self` holds it.
        unsafe { p.read_volatile() }
    }

    /// Writes a 16-bit register.
    #[inline]
    #[track_caller]
    pub fn write16(&self, off: usize, v: u16) {
        let p = self.at::<u16>(off);
        // SAFETY: `at` checked bounds and alignment; the mapping is live while `self` holds it.
        unsafe { p.write_volatile(v) }
    }

    /// Reads an 8-bit register.
    #[inline]
    #[track_caller]
    pub fn read8(&self, off: usize) -> u8 {
        let p = self.at::<u8>(off);
        // SAFETY: `at` checked bounds; the mapping is live while `self` holds it.
        unsafe { p.read_volatile() }
    }

    /// Writes an 8-bit register.
    #[inline]
    #[track_caller]
    pub fn write8(&self, off: usize, v: u8) {
        let p = self.at::<u8>(off);
        // SAFETY: `at` checked bounds; the mapping is live while `self` holds it.
        unsafe { p.write_volatile(v) }
    }

    /// Stores `words` at `off` (8-byte aligned) with one 64-bit volatile store each: for memory
    /// BARs that take 64-bit writes (a controller memory buffer holding submission queues).
    #[inline]
    #[track_caller]
    pub fn write_u64s(&self, off: usize, words: &[u64]) {
        for (i, &w) in words.iter().enumerate() {
            let p = self.at::<u64>(off + 8 * i);
            // SAFETY: `at` checked bounds and alignment; the mapping is live while `self` holds it.
            unsafe { p.write_volatile(w) }
        }
    }

    /// Copies `buf` into device memory at `off` with 32-bit volatile stores where aligned and
    /// byte stores at the ragged ends (for BARs used as memory, such as a CMB or a GPU BAR).
    pub fn copy_to(&self, off: usize, buf: &[u8]) -> Result<(), WindowError> {
        self.check_range(off, buf.len())?;
        let mut i = 0;
        while i < buf.len() {
            let o = off + i;
            if o.is_multiple_of(4) && i + 4 <= buf.len() {
                self.write32(o, u32::from_ne_bytes(buf[i..i + 4].try_into().expect("4 bytes")));
                i += 4;
            } else {
                self.write8(o, buf[i]);
                i += 1;
            }
        }
        Ok(())
    }

    /// Copies device memory at `off` into `buf` (volatile loads, as [`Mmio::copy_to`]).
    pub fn copy_from(&self, off: usize, buf: &mut [u8]) -> Result<(), WindowError> {
        self.check_range(off, buf.len())?;
        let mut i = 0;
        while i < buf.len() {
            let o = off + i;
            if o.is_multiple_of(4) && i + 4 <= buf.len() {
                buf[i..i + 4].copy_from_slice(&self.read32(o).to_ne_bytes());
                i += 4;
            } else {
                buf[i] = self.read8(o);
                i += 1;
            }
        }
        Ok(())
    }

    fn check_range(&self, off: usize, len: usize) -> Result<(), WindowError> {
        match off.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(WindowError {
                off,
                len,
                size: self.len,
            }),
        }
    }
}

/// An [`Mmio`] over ordinary memory, for device models and tests: the "BAR" is an anonymous
/// mapping of `len` bytes (rounded up to the page size), zero-filled.
pub fn anonymous(len: usize) -> io::Result<Mmio> {
    let sys: Arc<dyn SysOps> = Arc::new(AnonSys);
    let ptr = sys.mmap(-1, 0, len)?;
    Ok(Mmio::new(Arc::new(BarMapping::new(sys, ptr, len))))
}

/// The system calls of [`anonymous`]: an anonymous shared mapping stands in for a BAR.
#[derive(Debug)]
struct AnonSys;

impl SysOps for AnonSys {
    fn open(&self, _: &std::path::Path) -> io::Result<std::os::fd::OwnedFd> {
        Err(io::Error::from_raw_os_error(libc::ENOSYS))
    }
    fn ioctl(&self, _: i32, _: u64, _: crate::vfio::sys::IoctlArg<'_>) -> io::Result<i32> {
        Err(io::Error::from_raw_os_error(libc::ENOSYS))
    }
    fn ioctl_new_fd(
        &self,
        _: i32,
        _: u64,
        _: crate::vfio::sys::IoctlArg<'_>,
    ) -> io::Result<std::os::fd::OwnedFd> {
        Err(io::Error::from_raw_os_error(libc::ENOSYS))
    }
    fn pread(&self, _: i32, _: &mut [u8], _: u64) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(libc::ENOSYS))
    }
    fn pwrite(&self, _: i32, _: &[u8], _: u64) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(libc::ENOSYS))
    }
    fn mmap(&self, _: i32, _: u64, len: usize) -> io::Result<NonNull<u8>> {
        // SAFETY: a fresh anonymous shared mapping; it aliases nothing and is used only through
        // raw pointers by `Mmio`.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len.max(1),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned NULL"))
    }
    unsafe fn munmap(&self, ptr: NonNull<u8>, len: usize) -> io::Result<()> {
        // SAFETY: the caller passes back the mapping `mmap` returned, unused afterwards.
        let r = unsafe { libc::munmap(ptr.as_ptr().cast(), len.max(1)) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volatile_access_round_trips_and_windows_nest() {
        let m = anonymous(4096).unwrap();
        m.write32(0x14, 0xdead_beef);
        assert_eq!(m.read32(0x14), 0xdead_beef);
        m.write64(0x28, 0x0123_4567_89ab_cdef);
        assert_eq!(m.read64(0x28), 0x0123_4567_89ab_cdef);
        assert_eq!(m.read32(0x28), 0x89ab_cdef);
        let w = m.window(0x1000 - 8, 8).unwrap();
        w.write32(4, 7);
        assert_eq!(m.read32(0xffc), 7);
        assert!(m.window(0x1000 - 8, 9).is_err());
        assert!(m.window(usize::MAX, 2).is_err());
        let data: Vec<u8> = (0..37u8).collect();
        m.copy_to(0x101, &data).unwrap();
        let mut back = vec![0u8; 37];
        m.copy_from(0x101, &mut back).unwrap();
        assert_eq!(back, data);
        assert!(m.copy_to(4090, &data).is_err());
    }

    #[test]
    #[should_panic(expected = "outside or misaligned")]
    fn out_of_bounds_access_panics() {
        let m = anonymous(4096).unwrap();
        let w = m.window(0, 16).unwrap();
        w.read32(16);
    }

    #[test]
    #[should_panic(expected = "outside or misaligned")]
    fn misaligned_access_panics() {
        anonymous(4096).unwrap().read32(2);
    }
}
