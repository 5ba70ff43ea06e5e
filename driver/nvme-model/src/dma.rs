//! Host memory as the controller sees it: bus addresses turned into CPU pointers.
//!
//! Trust model. The "device" here is a thread of the same process, so DMA is a memory copy
//! through a pointer that a [`DmaSpace`] hands out for a bus address. All `unsafe` code of the
//! crate lives in this module, and rests on one contract, the one real hardware imposes on a
//! driver too: memory that the host gave the controller (a queue, a PRP list, a data buffer, the
//! shadow doorbell pages) stays mapped until the controller is done with it (the command's
//! completion is posted, the queue deleted, the controller reset). A bus address that does not
//! translate, because it was never mapped or has been unmapped, is not a crash: it comes back as
//! a [`DmaFault`], which the controller reports as an NVMe status or a fatal status (the
//! IOMMU-fault analogue), and which is also handed to [`DmaSpace::fault`], the IOMMU's fault
//! log. A status alone is easy to miss (a test that expects an error status, or a driver that
//! retries, would not notice that the error came from a stray DMA), so tests keep the log with
//! a [`FaultLog`] and check at teardown that it is empty.
//!
//! The memory is shared with the host thread, so no Rust reference into it is ever made:
//! registers-like words (CQ entries, PRP list entries, shadow doorbells) are read and written
//! with single volatile accesses, bulk data with `copy_nonoverlapping` into or out of the
//! controller's own buffers.

use std::alloc::{self, Layout};
use std::collections::BTreeMap;
use std::ptr::{self, NonNull};
use std::sync::atomic::{fence, Ordering};
use std::sync::{Mutex, MutexGuard};

use vfpoll_pci::BusAddr;

/// How the model turns a bus address into a pointer: the IOMMU of the simulated platform.
///
/// # Safety
/// A pointer returned by `translate(bus, len)` must be valid for reads and writes of `len` bytes,
/// at any alignment, from any thread, for as long as the mapping that covers it is live; and the
/// memory must not be owned by a Rust reference anywhere (it is shared with a device).
/// Implementations may assume the host keeps a mapping live while the controller may still use
/// it (see the module documentation); they must return `None` rather than a pointer for any
/// range that is not mapped in full.
pub unsafe trait DmaSpace: Send + Sync {
    /// The CPU address behind `len` bytes at `bus`, if one live mapping covers all of them.
    fn translate(&self, bus: BusAddr, len: u64) -> Option<*mut u8>;

    /// Told of each DMA the controller gave up on because it did not translate, once per
    /// access (after any retry in 4 KiB pieces): what a real IOMMU records in its fault log.
    /// Accesses of the test's host side (the [`HeapDma`] accessors) are not reported: they
    /// panic. The default keeps nothing; [`FaultLog`] keeps the faults for a test to check.
    fn fault(&self, fault: DmaFault) {
        let _ = fault;
    }
}

/// A DMA access to a bus address that does not translate: the IOMMU-fault analogue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("DMA of {len:#x} bytes at bus address {bus} does not translate")]
pub struct DmaFault {
    /// Where the access started.
    pub bus: BusAddr,
    /// Its length.
    pub len: u64,
}

/// When a range does not translate as a whole, it is retried in pieces of this size: IOMMU pages
/// are 4 KiB, and a buffer contiguous in bus space may be scattered in CPU space.
const SPLIT: u64 = 4096;

/// A translated piece of host memory the controller may access while the current command runs,
/// or a bit bucket (SGL, NVMe Base 2.0 §4.1.2.1.2): data for it is discarded.
///
/// Made only by [`Guest`] from a [`DmaSpace`] translation; it holds a raw pointer, so it is
/// neither `Send` nor `Sync` and stays on the controller thread.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Seg {
    ptr: *mut u8,
    len: usize,
}

impl Seg {
    /// A bit bucket of `len` bytes.
    pub(crate) const fn bucket(len: usize) -> Self {
        Seg {
            ptr: ptr::null_mut(),
            len,
        }
    }

    /// Length in bytes.
    pub(crate) const fn len(&self) -> usize {
        self.len
    }

    /// Copies `src` to host memory at offset `off` of this segment (nothing for a bit bucket).
    ///
    /// # Panics
    /// If `off + src.len()` exceeds the segment (a bug in the controller, not the host).
    pub(crate) fn store(&self, off: usize, src: &[u8]) {
        assert!(off + src.len() <= self.len, "store past the end of a DMA segment");
        if self.ptr.is_null() {
            return;
        }
        let dst = self.ptr.wrapping_add(off);
        // SAFETY: `ptr..ptr+len` came from `DmaSpace::translate`, valid for writes while the
        // command runs (module contract); the range written is inside it (checked above), and
        // `src` is controller memory, so the two cannot overlap.
        unsafe { ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
    }

    /// Copies host memory at offset `off` of this segment into `dst` (zeroes for a bit bucket).
    ///
    /// # Panics
    /// If `off + dst.len()` exceeds the segment.
    pub(crate) fn load(&self, off: usize, dst: &mut [u8]) {
        assert!(off + dst.len() <= self.len, "load past the end of a DMA segment");
        if self.ptr.is_null() {
            dst.fill(0);
            return;
        }
        let src = self.ptr.wrapping_add(off);
        // SAFETY: as in `store`, for reads; `dst` is controller memory.
        unsafe { ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
    }

    /// A little-endian 64-bit word at `off` (one volatile, possibly unaligned read).
    pub(crate) fn load_u64(&self, off: usize) -> u64 {
        assert!(
            !self.ptr.is_null() && off + 8 <= self.len,
            "u64 load outside a DMA segment"
        );
        let p = self.ptr.wrapping_add(off).cast::<u64>();
        // SAFETY: inside a translated range (checked above), valid for reads per the contract.
        u64::from_le(unsafe { p.read_unaligned() })
    }
}

/// The controller's view of host memory: a [`DmaSpace`] plus safe accessors.
#[derive(Clone)]
pub(crate) struct Guest {
    space: std::sync::Arc<dyn DmaSpace>,
}

impl Guest {
    pub(crate) fn new(space: std::sync::Arc<dyn DmaSpace>) -> Self {
        Guest { space }
    }

    /// Passes a fault of a finished access to the fault log.
    fn logged<T>(&self, r: Result<T, DmaFault>) -> Result<T, DmaFault> {
        r.inspect_err(|&f| self.space.fault(f))
    }

    /// `len` bytes at `bus` as one segment, if one mapping covers them (not logged: callers
    /// may retry in pieces).
    fn try_seg(&self, bus: u64, len: usize) -> Result<Seg, DmaFault> {
        translate(&*self.space, bus, len).map(|ptr| Seg { ptr, len })
    }

    /// `len` bytes at `bus` as one segment, if one mapping covers them.
    pub(crate) fn seg(&self, bus: u64, len: usize) -> Result<Seg, DmaFault> {
        self.logged(self.try_seg(bus, len))
    }

    /// Appends segments covering `len` bytes at `bus` to `out`: one if a single mapping covers
    /// the range, else one per 4 KiB piece.
    pub(crate) fn map(&self, bus: u64, len: usize, out: &mut Vec<Seg>) -> Result<(), DmaFault> {
        if len == 0 {
            return Ok(());
        }
        if let Ok(s) = self.try_seg(bus, len) {
            out.push(s);
            return Ok(());
        }
        self.logged(for_each_piece(bus, len, |b, l| {
            out.push(self.try_seg(b, l)?);
            Ok(())
        }))
    }

    /// Whether all `len` bytes at `bus` translate (in 4 KiB pieces if need be).
    pub(crate) fn check(&self, bus: u64, len: usize) -> Result<(), DmaFault> {
        if self.try_seg(bus, len).is_ok() {
            return Ok(());
        }
        self.logged(for_each_piece(bus, len, |b, l| self.try_seg(b, l).map(drop)))
    }

    /// Copies `dst.len()` bytes at `bus` into `dst`.
    pub(crate) fn read(&self, bus: u64, dst: &mut [u8]) -> Result<(), DmaFault> {
        self.logged(copy_out(&*self.space, bus, dst))
    }

    /// One volatile 32-bit read (a shadow doorbell).
    pub(crate) fn read_u32(&self, bus: u64) -> Result<u32, DmaFault> {
        self.logged(read_u32(&*self.space, bus))
    }

    /// One volatile 32-bit write (an EventIdx entry).
    pub(crate) fn write_u32(&self, bus: u64, v: u32) -> Result<(), DmaFault> {
        self.logged(write_u32(&*self.space, bus, v))
    }

    /// Posts a 16-byte completion queue entry (NVMe Base 2.0 §4.2.4): dwords 0-2 first, then,
    /// after a release fence, dword 3 with the phase tag in one 32-bit store, so a host that sees
    /// the new phase (and then fences) sees the whole entry.
    pub(crate) fn write_cqe(&self, bus: u64, dw: [u32; 4]) -> Result<(), DmaFault> {
        let p = self.logged(translate(&*self.space, bus, 16))?.cast::<u32>();
        for (i, &d) in dw.iter().take(3).enumerate() {
            // SAFETY: dword `i < 3` of the 16 translated bytes.
            unsafe { write_volatile_u32(p.wrapping_add(i), d.to_le()) };
        }
        fence(Ordering::Release);
        // SAFETY: dword 3 of the 16 translated bytes.
        unsafe { write_volatile_u32(p.wrapping_add(3), dw[3].to_le()) };
        Ok(())
    }
}

/// `translate` with the model's error type and overflow check.
fn translate(space: &dyn DmaSpace, bus: u64, len: usize) -> Result<*mut u8, DmaFault> {
    let fault = DmaFault {
        bus: BusAddr(bus),
        len: len as u64,
    };
    if len == 0 || bus.checked_add(len as u64).is_none() {
        return Err(fault);
    }
    space.translate(BusAddr(bus), len as u64).ok_or(fault)
}

/// Calls `f` for each piece of `[bus, bus+len)` cut at 4 KiB boundaries.
fn for_each_piece(
    bus: u64,
    len: usize,
    mut f: impl FnMut(u64, usize) -> Result<(), DmaFault>,
) -> Result<(), DmaFault> {
    let (mut at, mut left) = (bus, len);
    while left > 0 {
        let n = ((SPLIT - at % SPLIT) as usize).min(left);
        f(at, n)?;
        at += n as u64;
        left -= n;
    }
    Ok(())
}

/// Copies `src` to host memory at `bus`, in pieces if no single mapping covers it.
fn copy_in(space: &dyn DmaSpace, bus: u64, src: &[u8]) -> Result<(), DmaFault> {
    if let Ok(ptr) = translate(space, bus, src.len()) {
        Seg { ptr, len: src.len() }.store(0, src);
        return Ok(());
    }
    let mut done = 0;
    for_each_piece(bus, src.len(), |b, l| {
        let ptr = translate(space, b, l)?;
        Seg { ptr, len: l }.store(0, &src[done..done + l]);
        done += l;
        Ok(())
    })
}

/// Copies host memory at `bus` into `dst`, in pieces if no single mapping covers it.
fn copy_out(space: &dyn DmaSpace, bus: u64, dst: &mut [u8]) -> Result<(), DmaFault> {
    if let Ok(ptr) = translate(space, bus, dst.len()) {
        Seg { ptr, len: dst.len() }.load(0, dst);
        return Ok(());
    }
    let mut done = 0;
    for_each_piece(bus, dst.len(), |b, l| {
        let ptr = translate(space, b, l)?;
        Seg { ptr, len: l }.load(0, &mut dst[done..done + l]);
        done += l;
        Ok(())
    })
}

/// One volatile little-endian 32-bit read at `bus`.
fn read_u32(space: &dyn DmaSpace, bus: u64) -> Result<u32, DmaFault> {
    let p = translate(space, bus, 4)?.cast::<u32>();
    // SAFETY: 4 translated bytes, valid for reads (contract).
    Ok(u32::from_le(unsafe { read_volatile_u32(p) }))
}

/// One volatile little-endian 32-bit write at `bus`.
fn write_u32(space: &dyn DmaSpace, bus: u64, v: u32) -> Result<(), DmaFault> {
    let p = translate(space, bus, 4)?.cast::<u32>();
    // SAFETY: 4 translated bytes, valid for writes (contract).
    unsafe { write_volatile_u32(p, v.to_le()) };
    Ok(())
}

/// # Safety
/// `p` is valid for a 4-byte read (any alignment).
unsafe fn read_volatile_u32(p: *const u32) -> u32 {
    if p.is_aligned() {
        // SAFETY: valid and aligned (caller, check above).
        unsafe { p.read_volatile() }
    } else {
        // SAFETY: valid for 4 bytes (caller); the unaligned read is not one bus access, which
        // only a host placing a doorbell word misaligned could notice.
        unsafe { p.read_unaligned() }
    }
}

/// # Safety
/// `p` is valid for a 4-byte write (any alignment).
unsafe fn write_volatile_u32(p: *mut u32, v: u32) {
    if p.is_aligned() {
        // SAFETY: valid and aligned (caller, check above).
        unsafe { p.write_volatile(v) }
    } else {
        // SAFETY: valid for 4 bytes (caller).
        unsafe { p.write_unaligned(v) }
    }
}

/// Host memory for tests and benchmarks that do not use `vfpoll-dma`: page-aligned, zeroed heap
/// buffers at made-up bus addresses, behind a strict "IOMMU" that translates only what is mapped.
///
/// Bus addresses start at 4 GiB (so 64-bit address handling is exercised) and each buffer is
/// followed by an unmapped guard page, so running off the end of a buffer is a [`DmaFault`].
/// [`HeapDma::unmap`] revokes a buffer's translation but keeps its memory until the `HeapDma`
/// is dropped, so a controller that still held a pointer could not touch freed memory.
///
/// The accessor methods are for the test's "host" side; they panic on addresses that do not
/// translate, since that is a bug in the test itself.
pub struct HeapDma {
    state: Mutex<HeapState>,
}

struct HeapState {
    /// Live translations: bus address → (CPU pointer, length).
    live: BTreeMap<u64, (NonNull<u8>, u64)>,
    /// Every allocation, freed on drop.
    allocs: Vec<(NonNull<u8>, Layout)>,
    next: u64,
}

// SAFETY: the raw pointers in `HeapState` are owned heap allocations, only ever handed out as
// raw pointers (never references) and freed in `Drop`, which needs exclusive access; the state
// itself is behind a mutex.
unsafe impl Send for HeapDma {}
// SAFETY: as above; all access to the state goes through the mutex.
unsafe impl Sync for HeapDma {}

impl Default for HeapDma {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for HeapDma {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.lock();
        f.debug_struct("HeapDma")
            .field("live", &st.live.len())
            .field("next", &st.next)
            .finish()
    }
}

const PAGE: u64 = 4096;

impl HeapDma {
    /// An empty address space.
    pub fn new() -> Self {
        HeapDma {
            state: Mutex::new(HeapState {
                live: BTreeMap::new(),
                allocs: Vec::new(),
                next: 1 << 32,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HeapState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn alloc_pages(st: &mut HeapState, len: u64) -> NonNull<u8> {
        let layout = Layout::from_size_align(len as usize, PAGE as usize).expect("buffer layout");
        // SAFETY: `layout` has a non-zero size (callers round up to at least one page).
        let p = unsafe { alloc::alloc_zeroed(layout) };
        let p = NonNull::new(p).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        st.allocs.push((p, layout));
        p
    }

    /// A zeroed buffer of `len` bytes (rounded up to whole 4 KiB pages), mapped at the returned
    /// page-aligned bus address and followed by an unmapped guard page.
    pub fn alloc(&self, len: usize) -> BusAddr {
        self.alloc_aligned(len, PAGE)
    }

    /// Like [`HeapDma::alloc`], with the bus address a multiple of `align` (a power of two of
    /// at least 4 KiB), as for queues with a memory page size over 4 KiB.
    pub fn alloc_aligned(&self, len: usize, align: u64) -> BusAddr {
        assert!(align.is_power_of_two() && align >= PAGE, "alignment {align:#x}");
        let len = (len.max(1) as u64).div_ceil(PAGE) * PAGE;
        let mut st = self.lock();
        let p = Self::alloc_pages(&mut st, len);
        let bus = st.next.next_multiple_of(align);
        st.live.insert(bus, (p, len));
        st.next = bus + len + PAGE;
        BusAddr(bus)
    }

    /// Like [`HeapDma::alloc`], but each 4 KiB page is a separate allocation: contiguous in bus
    /// space, scattered in CPU space, as buffers behind a real IOMMU often are.
    pub fn alloc_scattered(&self, len: usize) -> BusAddr {
        let pages = (len.max(1) as u64).div_ceil(PAGE);
        let mut st = self.lock();
        let bus = st.next;
        for i in 0..pages {
            let p = Self::alloc_pages(&mut st, PAGE);
            st.live.insert(bus + i * PAGE, (p, PAGE));
        }
        st.next += (pages + 1) * PAGE;
        BusAddr(bus)
    }

    /// Revokes the translation of the buffer (or scattered page) mapped at `bus`; the memory
    /// itself stays allocated until `self` is dropped. Returns whether something was mapped there.
    pub fn unmap(&self, bus: BusAddr) -> bool {
        self.lock().live.remove(&bus.get()).is_some()
    }

    /// Copies `data` to `bus`.
    ///
    /// # Panics
    /// If the range does not translate.
    #[track_caller]
    pub fn write(&self, bus: BusAddr, data: &[u8]) {
        if let Err(e) = copy_in(self, bus.get(), data) {
            panic!("HeapDma::write: {e}");
        }
    }

    /// Copies `out.len()` bytes at `bus` into `out`.
    ///
    /// # Panics
    /// If the range does not translate.
    #[track_caller]
    pub fn read(&self, bus: BusAddr, out: &mut [u8]) {
        if let Err(e) = copy_out(self, bus.get(), out) {
            panic!("HeapDma::read: {e}");
        }
    }

    /// `len` bytes at `bus`.
    ///
    /// # Panics
    /// If the range does not translate.
    #[track_caller]
    pub fn read_vec(&self, bus: BusAddr, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.read(bus, &mut v);
        v
    }

    /// One volatile 32-bit read (polling a completion entry's phase tag).
    ///
    /// # Panics
    /// If the word does not translate.
    #[track_caller]
    pub fn read_u32(&self, bus: BusAddr) -> u32 {
        match read_u32(self, bus.get()) {
            Ok(v) => v,
            Err(e) => panic!("HeapDma::read_u32: {e}"),
        }
    }

    /// One volatile 32-bit write.
    ///
    /// # Panics
    /// If the word does not translate.
    #[track_caller]
    pub fn write_u32(&self, bus: BusAddr, v: u32) {
        if let Err(e) = write_u32(self, bus.get(), v) {
            panic!("HeapDma::write_u32: {e}");
        }
    }
}

// SAFETY: `translate` returns pointers into live heap allocations owned by `self` and freed only
// when `self` is dropped (never by `unmap`), covering the whole requested range, which lies in a
// single allocation; the memory is never borrowed as a Rust reference.
unsafe impl DmaSpace for HeapDma {
    fn translate(&self, bus: BusAddr, len: u64) -> Option<*mut u8> {
        let st = self.lock();
        let (&start, &(p, map_len)) = st.live.range(..=bus.get()).next_back()?;
        let off = bus.get() - start;
        if len == 0 || off.checked_add(len)? > map_len {
            return None;
        }
        Some(p.as_ptr().wrapping_add(off as usize))
    }
}

// SAFETY: `FakeMapper::translate` returns pointers only inside live mappings, covering the whole
// range; `DmaMapper::map`'s contract makes whoever mapped the memory keep it mapped, at the same
// pages, until the matching `unmap` returns, and `vfpoll-dma` forms no references into it.
unsafe impl DmaSpace for vfpoll_dma::FakeMapper {
    fn translate(&self, bus: BusAddr, len: u64) -> Option<*mut u8> {
        vfpoll_dma::FakeMapper::translate(self, bus, len)
    }
}

/// The IOMMU fault log of a test: a [`DmaSpace`] that forwards to another (a [`HeapDma`], or
/// the `vfpoll_dma::FakeMapper` the driver maps through) and keeps every [`DmaFault`] the
/// controller reports.
///
/// Give the model the `FaultLog` and keep a handle: at teardown, [`FaultLog::assert_none`]
/// fails the test if the controller ever reached outside what was mapped, even where the
/// command's error status went unnoticed. A test that provokes faults on purpose takes them
/// with [`FaultLog::take`] and checks that they are the ones it meant.
pub struct FaultLog {
    inner: std::sync::Arc<dyn DmaSpace>,
    faults: Mutex<Vec<DmaFault>>,
}

impl std::fmt::Debug for FaultLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultLog")
            .field("faults", &self.faults())
            .finish()
    }
}

/// Fails the test, when it is dropped at the test's end, if the controller made a DMA access
/// outside the host's mappings (an overrun into a guard page, an unmapped address) that the
/// test did not take with [`FaultLog::take`]. Not checked while the test is already failing.
#[derive(Debug)]
pub struct FaultCheck(pub std::sync::Arc<FaultLog>);

impl Drop for FaultCheck {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.0.assert_none();
        }
    }
}

impl FaultLog {
    /// A log in front of `inner`.
    pub fn new(inner: std::sync::Arc<dyn DmaSpace>) -> Self {
        FaultLog {
            inner,
            faults: Mutex::new(Vec::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<DmaFault>> {
        self.faults.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The faults so far, oldest first.
    pub fn faults(&self) -> Vec<DmaFault> {
        self.lock().clone()
    }

    /// The faults so far, oldest first, clearing the log.
    pub fn take(&self) -> Vec<DmaFault> {
        std::mem::take(&mut *self.lock())
    }

    /// Panics, naming each fault, if the log is not empty.
    #[track_caller]
    pub fn assert_none(&self) {
        let faults = self.faults();
        if !faults.is_empty() {
            let list: Vec<String> = faults.iter().map(ToString::to_string).collect();
            panic!(
                "the controller made {} DMA access(es) outside the host's mappings (a data pointer, \
                 queue or buffer the host described wrongly, or memory unmapped too early): {}; \
                 a test that provokes this on purpose must take the faults with FaultLog::take",
                faults.len(),
                list.join("; ")
            );
        }
    }
}

// SAFETY: `translate` is `inner`'s, whose contract it inherits unchanged.
unsafe impl DmaSpace for FaultLog {
    fn translate(&self, bus: BusAddr, len: u64) -> Option<*mut u8> {
        self.inner.translate(bus, len)
    }

    fn fault(&self, fault: DmaFault) {
        log::debug!("IOMMU fault: {fault}");
        self.lock().push(fault);
        self.inner.fault(fault);
    }
}

impl Drop for HeapDma {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        for (p, layout) in st.allocs.drain(..) {
            // SAFETY: allocated in `alloc_pages` with this layout, freed exactly once, here; the
            // model that used it is gone or holds no pointer past a command (contract).
            unsafe { alloc::dealloc(p.as_ptr(), layout) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn heap_translates_only_live_mappings() {
        let h = HeapDma::new();
        let a = h.alloc(100);
        let b = h.alloc(PAGE as usize);
        assert_eq!(a.get() % PAGE, 0);
        assert_eq!(b.get(), a.get() + 2 * PAGE, "one guard page between buffers");
        assert!(h.translate(a, PAGE).is_some());
        assert!(h.translate(a, PAGE + 1).is_none(), "runs into the guard page");
        assert!(h.translate(a.add(PAGE), 1).is_none());
        h.write(a.add(10), b"hello");
        assert_eq!(h.read_vec(a.add(10), 5), b"hello");
        assert!(h.unmap(a));
        assert!(h.translate(a, 1).is_none());
        assert!(!h.unmap(a));
    }

    #[test]
    fn faults_are_logged_once_per_access_and_retries_are_not_faults() {
        let h = Arc::new(HeapDma::new());
        let log = Arc::new(FaultLog::new(h.clone()));
        let g = Guest::new(log.clone());
        // Scattered pages translate only piece by piece: a retry, not a fault.
        let s = h.alloc_scattered(2 * PAGE as usize);
        let mut segs = Vec::new();
        g.map(s.get() + 8, PAGE as usize, &mut segs).unwrap();
        g.check(s.get(), 2 * PAGE as usize).unwrap();
        assert_eq!(log.faults(), vec![]);
        // Eight bytes past the end of a buffer land in its guard page.
        let a = h.alloc(100);
        let mut out = [0u8; 16];
        assert!(g.read(a.get() + PAGE - 8, &mut out).is_err());
        let guard = DmaFault {
            bus: a.add(PAGE),
            len: 8,
        };
        assert_eq!(
            log.take(),
            vec![guard],
            "one fault, at the first byte that missed"
        );
        assert!(g.write_u32(a.get() + PAGE, 1).is_err());
        assert!(g.write_cqe(a.get() + PAGE - 8, [0; 4]).is_err());
        assert!(g.map(a.get(), PAGE as usize + 1, &mut segs).is_err());
        assert_eq!(log.take().len(), 3);
        log.assert_none();
    }

    #[test]
    #[should_panic(expected = "1 DMA access(es) outside the host's mappings")]
    fn an_unchecked_fault_fails_the_check() {
        let h = Arc::new(HeapDma::new());
        let log = Arc::new(FaultLog::new(h.clone()));
        let g = Guest::new(log.clone());
        let a = h.alloc(PAGE as usize);
        let _ = g.read_u32(a.get() + PAGE);
        log.assert_none();
    }

    #[test]
    fn scattered_buffers_copy_across_pages() {
        let h = Arc::new(HeapDma::new());
        let s = h.alloc_scattered(3 * PAGE as usize);
        assert!(
            h.translate(s, 2 * PAGE).is_none(),
            "pages are separate allocations"
        );
        let data: Vec<u8> = (0..3 * PAGE as usize).map(|i| (i * 7) as u8).collect();
        h.write(s.add(1), &data[..data.len() - 1]);
        assert_eq!(h.read_vec(s.add(1), data.len() - 1), &data[..data.len() - 1]);
        let g = Guest::new(h.clone());
        let mut segs = Vec::new();
        g.map(s.get() + 100, 2 * PAGE as usize, &mut segs).unwrap();
        assert_eq!(
            segs.iter().map(Seg::len).collect::<Vec<_>>(),
            vec![3996, 4096, 100]
        );
        let mut out = vec![0; 2 * PAGE as usize];
        let fault = g.read(s.get() + 2 * PAGE, &mut out).unwrap_err();
        assert_eq!(
            fault,
            DmaFault {
                bus: s.add(3 * PAGE),
                len: 4096
            },
            "the guard page after the buffer"
        );
        g.write_cqe(s.get(), [1, 2, 3, 4]).unwrap();
        assert_eq!(h.read_u32(s.add(12)), 4);
        assert!(g.write_cqe(s.get() + 3 * PAGE, [0; 4]).is_err());
    }
}
