//! Raw access to memory a NIC reads and writes: descriptor rings and packet buffers.
//!
//! This is the only module of the crate with `unsafe` code. Descriptor rings are touched only
//! with volatile 64-bit loads and stores at checked, aligned offsets, never through a
//! reference. Packet buffers are reached through the [`Packet`] that owns them: copies in and
//! out, and slice views whose soundness rests on that ownership (see [`Packet::data`]); a
//! packet reaches its pool through a raw pointer that the pool's self-reference keeps valid
//! (see `Packet::pool`).
//!
//! Device BARs are mapped here too ([`map_bar`]): a register write can start DMA to any bus
//! address (a ring base), so the drivers keep the mappings to themselves.
//!
//! Virtqueues (the `virtio` driver) use the same memory type with 16- and 32-bit fields at
//! checked, aligned byte offsets ([`RingMem::load16`], [`RingMem::store16`], [`RingMem::load32`]).
//!
//! Ordering against the device (SPDK's `spdk_wmb`/`spdk_rmb`): descriptor and buffer stores,
//! then [`wmb`], then the tail register write; a descriptor's status load, then [`rmb`], then
//! the loads of its other fields and of the buffer.

use std::ptr::{self, NonNull};
use std::sync::atomic::{compiler_fence, fence, Ordering};

use vfpoll_dma::DmaRegion;
use vfpoll_pci::BusAddr;

use crate::error::{NicError, Result};
use crate::pool::{Packet, PoolShared};

/// Size of one descriptor (82574 legacy and extended formats alike).
pub(crate) const DESC_SIZE: usize = 16;

/// Maps BAR `bar` of `device` for the driver's own register accesses.
pub(crate) fn map_bar(device: &vfpoll_pci::vfio::Device, bar: u32) -> Result<vfpoll_pci::mmio::Mmio> {
    // SAFETY: the mapping stays inside the crate (no public API returns it or a window of it);
    // the drivers write into registers that take bus addresses only those of rings and packet
    // buffers they allocated and keep mapped while the device runs.
    Ok(unsafe { device.map_bar(bar) }?)
}

/// Orders earlier stores to DMA memory before a following MMIO store (the tail register).
///
/// On x86-64 stores are not reordered with other stores and an uncached MMIO store is not
/// reordered with earlier write-back stores, so a compiler barrier is enough; elsewhere a full
/// fence.
#[inline(always)]
pub(crate) fn wmb() {
    if cfg!(target_arch = "x86_64") {
        compiler_fence(Ordering::SeqCst);
    } else {
        fence(Ordering::SeqCst);
    }
}

/// Orders the load of a descriptor's status before the loads of its other fields and of the
/// buffer it describes.
#[inline(always)]
pub(crate) fn rmb() {
    if cfg!(target_arch = "x86_64") {
        compiler_fence(Ordering::SeqCst);
    } else {
        fence(Ordering::SeqCst);
    }
}

/// Orders earlier stores to DMA memory before later loads from it (VIRTIO 1.2 §2.7.10: the
/// available index store before the load of the used ring's notification flags). x86-64 may
/// reorder a store with a later load, so this is a full fence everywhere.
#[inline(always)]
pub(crate) fn mb() {
    fence(Ordering::SeqCst);
}

/// One descriptor ring's memory, owned by its queue.
pub(crate) struct RingMem {
    /// `None` only after [`RingMem::leak`] gave it up.
    region: Option<DmaRegion>,
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the memory is owned by the region (Send); the raw base pointer is derived from it and
// used only through `&mut self` (stores) or `&self` (volatile loads).
unsafe impl Send for RingMem {}

impl std::fmt::Debug for RingMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RingMem({:?})", self.region)
    }
}

impl RingMem {
    /// Takes `region` over, zeroed (no descriptor reads as done).
    pub(crate) fn new(mut region: DmaRegion) -> Self {
        let len = region.len();
        region.fill(0, len, 0).expect("whole region is in bounds");
        let base = NonNull::new(region.as_ptr()).expect("region pointers are non-null");
        RingMem {
            region: Some(region),
            base,
            len,
        }
    }

    fn region(&self) -> &DmaRegion {
        self.region
            .as_ref()
            .expect("ring memory used after it was leaked")
    }

    /// Bus address of byte `off`.
    pub(crate) fn bus(&self, off: usize) -> BusAddr {
        self.region().bus_addr(off)
    }

    /// Bus-contiguous bytes from `off`.
    pub(crate) fn contiguous_len(&self, off: usize) -> usize {
        self.region().contiguous_len(off)
    }

    /// Never free (nor unmap) this memory: the device may still write it.
    pub(crate) fn leak(&mut self) {
        std::mem::forget(self.region.take());
    }

    #[inline(always)]
    fn at(&self, slot: usize) -> *mut u64 {
        let off = slot * DESC_SIZE;
        assert!(
            off + DESC_SIZE <= self.len,
            "descriptor {slot} outside the ring memory"
        );
        self.base.as_ptr().wrapping_add(off).cast()
    }

    /// Stores descriptor `slot` as two little-endian quadwords, low first.
    #[inline]
    pub(crate) fn write_desc(&mut self, slot: usize, lo: u64, hi: u64) {
        let p = self.at(slot);
        // SAFETY: `at` checked that the 16 bytes are inside the region, which `self` keeps alive;
        // the base is page aligned, so the offset (a multiple of 16) is 8-byte aligned. Volatile:
        // the device reads this memory.
        unsafe { p.write_volatile(lo.to_le()) };
        // SAFETY: as above, for the second quadword of the same descriptor.
        unsafe { p.wrapping_add(1).write_volatile(hi.to_le()) };
    }

    /// Stores the high quadword of descriptor `slot`.
    #[inline]
    pub(crate) fn write_hi(&mut self, slot: usize, hi: u64) {
        let p = self.at(slot).wrapping_add(1);
        // SAFETY: in bounds and aligned (see `write_desc`); volatile because the device reads it.
        unsafe { p.write_volatile(hi.to_le()) };
    }

    /// Loads the high quadword of descriptor `slot` (where the 82574 writes status back).
    #[inline]
    pub(crate) fn read_hi(&self, slot: usize) -> u64 {
        let p = self.at(slot).wrapping_add(1);
        // SAFETY: in bounds and aligned (see `write_desc`); volatile because the device writes it.
        u64::from_le(unsafe { p.read_volatile() })
    }

    /// A pointer to the `T` at byte `off`, checked to lie inside the memory and to be aligned
    /// (virtqueue rings: 16- and 32-bit fields).
    #[inline(always)]
    fn field<T>(&self, off: usize) -> *mut T {
        let size = std::mem::size_of::<T>();
        assert!(
            off.is_multiple_of(size) && off + size <= self.len,
            "ring field of {size} bytes at {off:#x} outside or misaligned in {:#x} bytes",
            self.len
        );
        self.base.as_ptr().wrapping_add(off).cast()
    }

    /// Loads the little-endian `u16` at byte `off` (a virtqueue index or flags field).
    #[inline]
    pub(crate) fn load16(&self, off: usize) -> u16 {
        let p = self.field::<u16>(off);
        // SAFETY: `field` checked bounds and alignment; the region is alive while `self` is.
        // Volatile: the device writes this memory.
        u16::from_le(unsafe { p.read_volatile() })
    }

    /// Stores the little-endian `u16` at byte `off`.
    #[inline]
    pub(crate) fn store16(&mut self, off: usize, v: u16) {
        let p = self.field::<u16>(off);
        // SAFETY: as in `load16`; volatile because the device reads it.
        unsafe { p.write_volatile(v.to_le()) };
    }

    /// Loads the little-endian `u32` at byte `off` (a used-ring element's id or length).
    #[inline]
    pub(crate) fn load32(&self, off: usize) -> u32 {
        let p = self.field::<u32>(off);
        // SAFETY: as in `load16`.
        u32::from_le(unsafe { p.read_volatile() })
    }

    /// Loads the low quadword of descriptor `slot`.
    #[cfg(test)]
    pub(crate) fn read_lo(&self, slot: usize) -> u64 {
        let p = self.at(slot);
        // SAFETY: in bounds and aligned (see `write_desc`); volatile because the device may write it.
        u64::from_le(unsafe { p.read_volatile() })
    }
}

// SAFETY: a Packet is the unique owner of its buffer (see `Packet::data`) and its pool is alive
// while it exists (see `Packet::pool`); `PoolShared` is `Send + Sync` (its free list is behind a
// mutex), nothing in a packet is tied to a thread, so it can be moved to and dropped on another
// one.
unsafe impl Send for Packet {}
// SAFETY: through `&Packet` one can only read the buffer (copies out, `&[u8]`) and the pool's
// immutable fields or its mutex; every write to the buffer takes `&mut Packet`. Concurrent reads
// of the same bytes are no data race.
unsafe impl Sync for Packet {}

impl Packet {
    /// The pool this packet's buffer belongs to.
    ///
    /// The pointer is live for as long as the packet: a `Packet` is only made for a buffer just
    /// taken off its pool's free list (`Packet::new`), and while any buffer is off the list the
    /// list holds an `Arc` of the pool (`FreeList::keepalive`), which it gives up only when the
    /// last buffer is back, after this packet's drop. So the `PoolShared` is neither dropped
    /// nor moved while `&self` lives.
    #[inline(always)]
    pub(crate) fn pool(&self) -> &PoolShared {
        // SAFETY: see above; `PoolShared` is only ever used through shared references (its
        // mutable state is behind a mutex or atomic), so this aliases no `&mut`.
        unsafe { self.pool.as_ref() }
    }

    /// CPU address of the first byte.
    #[inline(always)]
    fn ptr(&self) -> *mut u8 {
        self.pool().buf_ptr(self.index)
    }

    /// Copies `data` to the start of the buffer and sets the length to `data.len()`.
    #[inline]
    pub fn fill(&mut self, data: &[u8]) -> Result<()> {
        self.write_at(0, data)?;
        self.len = data.len() as u32;
        Ok(())
    }

    /// Copies `src` into the buffer at `off`, growing the length to `off + src.len()` if it was
    /// shorter.
    #[inline]
    pub fn write_at(&mut self, off: usize, src: &[u8]) -> Result<()> {
        let cap = self.capacity();
        let end = off.checked_add(src.len()).filter(|&e| e <= cap);
        let Some(end) = end else {
            return Err(NicError::TooLong {
                len: off.saturating_add(src.len()),
                capacity: cap,
            });
        };
        let dst = self.ptr().wrapping_add(off);
        // SAFETY: `off..end` lies inside the buffer (checked), which this packet owns exclusively
        // and which its pool keeps allocated (see `data`); `src` is a Rust slice, so it cannot
        // overlap memory no reference may point into.
        unsafe { ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        self.len = self.len.max(end as u32);
        Ok(())
    }

    /// Copies the packet's bytes `off..off + dst.len()` into `dst`.
    #[inline]
    pub fn read_at(&self, off: usize, dst: &mut [u8]) -> Result<()> {
        let end = off.checked_add(dst.len()).filter(|&e| e <= self.len as usize);
        if end.is_none() {
            return Err(NicError::OutOfBounds {
                off,
                end: off.saturating_add(dst.len()),
                len: self.len as usize,
            });
        }
        let src = self.ptr().wrapping_add(off);
        // SAFETY: inside the packet's data (checked), owned by this packet (see `data`); `dst` is
        // an exclusive Rust slice disjoint from DMA memory.
        unsafe { ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// The packet's data, copied out.
    pub fn to_vec(&self) -> Vec<u8> {
        self.data().to_vec()
    }

    /// The packet's data in place (zero-copy parsing).
    ///
    /// Sound although the buffer is DMA memory, because of who may touch it while the borrow
    /// lives:
    /// - the memory stays allocated and mapped: the pool frees its region only when it is
    ///   dropped, which is after every buffer is back on its free list (see `Packet::pool`);
    /// - no other code reaches these bytes: a buffer index is, at any time, in exactly one place
    ///   (the pool's free list, a queue's private cache, one ring slot, or one `Packet`), and
    ///   only this packet maps index to pointer while it lives;
    /// - no device writes them: a device is only ever told about buffers in ring slots (RX
    ///   descriptors from head to tail, TX descriptors not yet reclaimed). A received buffer
    ///   becomes a `Packet` only after the device wrote its descriptor back with DD set (82574
    ///   §7.1.8: written back just before the head advances past it, never written again), and
    ///   the status load is ordered before this access by `rmb`.
    ///
    /// The bytes are initialized: the pool's memory is zero-filled anonymous memory, and a
    /// device only stores bytes into it.
    #[inline]
    pub fn data(&self) -> &[u8] {
        // SAFETY: see above: `ptr..ptr+len` (len <= cap) is live, initialized and, for the
        // lifetime of `&self`, written by nobody.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len as usize) }
    }

    /// The packet's data in place, writable (zero-copy rewriting, e.g. swapping addresses before
    /// sending a reply). Sound for the reasons given at [`Packet::data`]; `&mut self` makes the
    /// view exclusive.
    #[inline]
    pub fn data_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `data`, and `&mut self` guarantees no other view exists.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(), self.len as usize) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vfpoll_dma::{DmaContext, PageSize};

    #[test]
    fn descriptors_round_trip_little_endian() {
        let dma = DmaContext::for_testing();
        let mut r = RingMem::new(dma.alloc_region(4096, PageSize::Base4K).unwrap());
        r.write_desc(3, 0x1122_3344_5566_7788, 0x8000_0000_0000_0040);
        assert_eq!(r.read_lo(3), 0x1122_3344_5566_7788);
        assert_eq!(r.read_hi(3), 0x8000_0000_0000_0040);
        assert_eq!(r.read_hi(2), 0);
        assert_eq!(r.bus(48).get(), r.bus(0).get() + 48);
    }

    #[test]
    #[should_panic(expected = "outside the ring")]
    fn out_of_ring_access_panics() {
        let dma = DmaContext::for_testing();
        let r = RingMem::new(dma.alloc_region(4096, PageSize::Base4K).unwrap());
        r.read_hi(256);
    }

    #[test]
    fn packet_copies_and_views() {
        let dma = DmaContext::for_testing();
        let pool = crate::Mempool::new(&dma, 4, PageSize::Base4K).unwrap();
        let mut p = pool.alloc().unwrap();
        p.fill(b"abcdef").unwrap();
        assert_eq!(p.data(), b"abcdef");
        p.data_mut()[0] = b'A';
        p.write_at(6, b"gh").unwrap();
        let mut b = [0u8; 4];
        p.read_at(4, &mut b).unwrap();
        assert_eq!(&b, b"efgh");
        assert_eq!(p.to_vec(), b"Abcdefgh");
        assert!(matches!(p.read_at(6, &mut b), Err(NicError::OutOfBounds { .. })));
        assert!(matches!(p.write_at(2046, b"xyz"), Err(NicError::TooLong { .. })));
        assert!(p.set_len(2049).is_err());
        p.set_len(2).unwrap();
        assert_eq!(p.data(), b"Ab");
    }
}
