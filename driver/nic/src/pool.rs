//! Packet buffers: a [`Mempool`] of fixed-size DMA buffers and the [`Packet`] handle that owns
//! one of them.
//!
//! A pool is one [`DmaRegion`] (hugepages in production) carved into `count` buffers of
//! `buf_size` bytes, a power of two that divides the page size, so each buffer is contiguous on
//! the bus in both IOMMU modes. The free list is a stack of buffer indices behind a mutex; the
//! hot path takes and gives back buffers in bulk (one lock per burst: an RX queue refills its
//! private cache, a TX queue frees a reclaimed batch), so the lock is not per packet.
//!
//! A [`Packet`] is 16 bytes: a pointer to its pool, the buffer index and the length. It holds
//! no reference count of its own: the pool keeps *itself* alive while any buffer is out of its
//! free list (the free list holds an `Arc` of the pool from the moment the first buffer leaves
//! it until the last one comes back), so the pool's memory outlives every packet, ring slot and
//! cache that holds one of its buffers, whichever thread gives it back last, at the cost of one
//! reference-count change when the pool goes from all-free to in use and back, not one per
//! packet. Dropping a packet gives its buffer back; [`free_bulk`] gives many back with one lock
//! per run of packets from the same pool. Packets move between queues by value: what
//! [`crate::RxQueue::rx_burst`] returns, [`crate::TxQueue::tx_burst`] takes, zero-copy, also
//! across ports that share a pool (or not: each packet goes back to its own pool).

use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use vfpoll_dma::{DmaContext, DmaRegion, PageSize, PoolLayout};
use vfpoll_pci::BusAddr;

use crate::error::{NicError, Result};

/// The buffer size a NIC driver here receives into (82574: RCTL.BSIZE = 2048).
pub const DEFAULT_BUF_SIZE: usize = 2048;

/// What the pool's handles, queues and packets share.
pub(crate) struct PoolShared {
    /// `None` only while being dropped.
    region: Option<DmaRegion>,
    /// The bus address of each buffer, worked out once (in no-IOMMU mode it is a page lookup).
    bus: Box<[BusAddr]>,
    pub(crate) buf_size: u32,
    count: u32,
    free: Mutex<FreeList>,
    /// Set when a device may still write into buffers it was given (a queue could not be
    /// stopped): the region is then never freed.
    leak: AtomicBool,
}

/// The free list and the pool's hold on itself.
pub(crate) struct FreeList {
    idx: Vec<u32>,
    /// Buffers in the pool.
    count: usize,
    /// `Some` exactly while a buffer is out of `idx` (in a packet, a ring slot or a queue's
    /// cache): the pool then lives at least until it comes back, so nothing that holds a buffer
    /// needs a reference count of its own.
    keepalive: Option<Arc<PoolShared>>,
}

impl FreeList {
    /// Puts buffer `i` back.
    #[inline(always)]
    pub(crate) fn push(&mut self, i: u32) {
        debug_assert!(self.idx.len() < self.count, "double free of buffer {i}");
        self.idx.push(i);
    }

    /// After buffers came back: when all are home, the pool's hold on itself, for the caller
    /// to drop once it no longer uses the pool (dropping it may free the pool).
    #[inline(always)]
    #[must_use]
    pub(crate) fn release_if_home(&mut self) -> Option<Arc<PoolShared>> {
        if self.idx.len() == self.count {
            self.keepalive.take()
        } else {
            None
        }
    }
}

impl std::fmt::Debug for PoolShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mempool")
            .field("buf_size", &self.buf_size)
            .field("count", &self.count)
            .field("available", &self.lock().idx.len())
            .field("region", &self.region)
            .finish()
    }
}

impl PoolShared {
    /// The free list. Never held across anything but pushes and pops; poisoning is ignored
    /// (no code panics while holding it with the list half-updated).
    #[inline]
    pub(crate) fn lock(&self) -> MutexGuard<'_, FreeList> {
        self.free.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[inline]
    fn region(&self) -> &DmaRegion {
        self.region
            .as_ref()
            .expect("the region lives until the pool is dropped")
    }

    /// CPU address of buffer `index`.
    #[inline]
    pub(crate) fn buf_ptr(&self, index: u32) -> *mut u8 {
        let off = index as usize * self.buf_size as usize;
        debug_assert!(index < self.count);
        self.region().as_ptr().wrapping_add(off)
    }

    /// Bus address of buffer `index`.
    #[inline]
    pub(crate) fn buf_bus(&self, index: u32) -> BusAddr {
        self.bus[index as usize]
    }

    /// Takes up to `n` buffers off the free list with one lock, calling `f` with each index;
    /// returns how many.
    #[inline]
    fn take_with(self: &Arc<Self>, n: usize, mut f: impl FnMut(u32)) -> usize {
        let mut free = self.lock();
        let k = n.min(free.idx.len());
        if k != 0 && free.keepalive.is_none() {
            free.keepalive = Some(Arc::clone(self));
        }
        for _ in 0..k {
            f(free.idx.pop().expect("counted above"));
        }
        k
    }

    /// Moves up to `n` free buffer indices to `out`; returns how many.
    #[inline]
    pub(crate) fn take(self: &Arc<Self>, out: &mut Vec<u32>, n: usize) -> usize {
        self.take_with(n, |i| out.push(i))
    }

    /// One free buffer for a receive slot, from a queue's private `cache` of indices; when the
    /// cache is empty it first moves up to `refill` from the pool (one lock for the lot).
    /// `None` when the pool has no free buffer either.
    #[inline]
    pub(crate) fn take_cached(self: &Arc<Self>, cache: &mut Vec<u32>, refill: usize) -> Option<u32> {
        if let Some(i) = cache.pop() {
            return Some(i);
        }
        self.take(cache, refill);
        cache.pop()
    }

    /// Gives indices back (the caller holds an `Arc` of the pool, so it outlives the call).
    #[inline]
    pub(crate) fn give(self: &Arc<Self>, idx: impl IntoIterator<Item = u32>) {
        let home = {
            let mut free = self.lock();
            for i in idx {
                free.push(i);
            }
            free.release_if_home()
        };
        drop(home);
    }

    /// Never free the region: a device may still write into it.
    pub(crate) fn leak(&self) {
        self.leak.store(true, Ordering::Relaxed);
    }

    pub(crate) fn available(&self) -> usize {
        self.lock().idx.len()
    }

    pub(crate) fn capacity(&self) -> usize {
        self.count as usize
    }
}

impl Drop for PoolShared {
    fn drop(&mut self) {
        // Last reference: no handle or queue is left, and every buffer is home (while one is
        // out, the free list holds a reference), unless a device could not be stopped.
        let out = self.count as usize - self.lock().idx.len();
        if self.leak.load(Ordering::Relaxed) || out != 0 {
            log::warn!(
                "packet pool dropped with {out} buffers out or a device not stopped: leaking its {:#x}-byte region so no device writes into freed memory",
                self.region().len()
            );
            std::mem::forget(self.region.take());
        }
    }
}

/// A pool of packet buffers in DMA memory. Cheap to clone (a reference count); `Send + Sync`:
/// the free list is locked once per bulk operation.
#[derive(Clone, Debug)]
pub struct Mempool {
    pub(crate) shared: Arc<PoolShared>,
}

impl Mempool {
    /// A pool of `count` buffers of [`DEFAULT_BUF_SIZE`] bytes on `page_size` pages
    /// (hugepages in production; [`PageSize::Base4K`] for device models).
    pub fn new(dma: &DmaContext, count: usize, page_size: PageSize) -> Result<Self> {
        Self::with_buf_size(dma, DEFAULT_BUF_SIZE, count, page_size)
    }

    /// A pool of `count` buffers of `buf_size` bytes (a power of two, 512 to the page size).
    pub fn with_buf_size(
        dma: &DmaContext,
        buf_size: usize,
        count: usize,
        page_size: PageSize,
    ) -> Result<Self> {
        let layout = PoolLayout::new(buf_size, count, page_size)?;
        let region = dma.alloc_region(layout.region_len, page_size)?;
        log::debug!("packet pool: {count} buffers of {buf_size} bytes, region {region:?}");
        let bus = (0..count).map(|i| region.bus_addr(i * buf_size)).collect();
        // Reversed so the first allocation hands out buffer 0; room for all, so giving back
        // never allocates.
        let mut idx = Vec::with_capacity(count);
        idx.extend((0..count as u32).rev());
        Ok(Mempool {
            shared: Arc::new(PoolShared {
                region: Some(region),
                bus,
                buf_size: buf_size as u32,
                count: count as u32,
                free: Mutex::new(FreeList {
                    idx,
                    count,
                    keepalive: None,
                }),
                leak: AtomicBool::new(false),
            }),
        })
    }

    /// Bytes per buffer: the largest packet.
    pub fn buf_size(&self) -> usize {
        self.shared.buf_size as usize
    }

    /// Buffers in all.
    pub fn capacity(&self) -> usize {
        self.shared.capacity()
    }

    /// Buffers free now.
    pub fn available(&self) -> usize {
        self.shared.available()
    }

    /// A packet of length 0; `None` when the pool is exhausted.
    pub fn alloc(&self) -> Option<Packet> {
        let mut one = None;
        self.shared
            .take_with(1, |i| one = Some(Packet::new(&self.shared, i, 0)));
        one
    }

    /// Appends up to `n` packets of length 0 to `out` with one lock; returns how many (fewer when
    /// the pool runs out). Allocates nothing when `out` has room.
    #[inline]
    pub fn alloc_bulk(&self, out: &mut Vec<Packet>, n: usize) -> usize {
        out.reserve(n.min(self.capacity()));
        let sh = &self.shared;
        sh.take_with(n, |i| out.push(Packet::new(sh, i, 0)))
    }

    /// Like [`Mempool::alloc_bulk`], but all or nothing: [`NicError::PoolExhausted`] when fewer
    /// than `n` are free.
    pub fn alloc_exact(&self, out: &mut Vec<Packet>, n: usize) -> Result<()> {
        let available = self.available();
        if available < n {
            return Err(NicError::PoolExhausted {
                what: "alloc_exact",
                need: n,
                available,
                capacity: self.capacity(),
            });
        }
        let before = out.len();
        if self.alloc_bulk(out, n) < n {
            // Another thread took buffers in between: give back what we got.
            let got = out.split_off(before);
            let available = self.available() + got.len();
            drop(got);
            return Err(NicError::PoolExhausted {
                what: "alloc_exact",
                need: n,
                available,
                capacity: self.capacity(),
            });
        }
        Ok(())
    }

    /// Whether `pkt`'s buffer belongs to this pool.
    pub fn owns(&self, pkt: &Packet) -> bool {
        std::ptr::eq(Arc::as_ptr(&self.shared), pkt.pool.as_ptr())
    }
}

/// One packet buffer, owned: while the handle exists no device reads or writes the buffer and
/// no other handle refers to it. Dropping it gives the buffer back to its pool.
///
/// The data is reached by copies ([`Packet::write_at`], [`Packet::read_at`], [`Packet::fill`])
/// or, for zero-copy parsing and in-place rewriting, through [`Packet::data`] and
/// [`Packet::data_mut`] (see there why that is sound).
///
/// 16 bytes: the pool, the buffer index and the length; the pool is kept alive by the buffer
/// being out of its free list (see the module docs), not by a reference count per packet.
pub struct Packet {
    /// The pool the buffer belongs to (see `Packet::pool` in `mem` for why it is live).
    pub(crate) pool: NonNull<PoolShared>,
    pub(crate) index: u32,
    pub(crate) len: u32,
}

const _: () = assert!(std::mem::size_of::<Packet>() == 16);
const _: () = assert!(std::mem::size_of::<Option<Packet>>() == 16);

impl std::fmt::Debug for Packet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Packet")
            .field("index", &self.index)
            .field("len", &self.len)
            .field("bus", &self.bus_addr())
            .finish()
    }
}

impl Packet {
    /// A handle for buffer `index` of `pool`, which the caller took off the free list (so the
    /// free list's `keepalive` is set and stays set while the handle lives).
    #[inline(always)]
    pub(crate) fn new(pool: &PoolShared, index: u32, len: u32) -> Self {
        Packet {
            pool: NonNull::from(pool),
            index,
            len,
        }
    }

    /// Length of the packet data in bytes (a received frame's length without the FCS).
    #[inline]
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether the packet holds no data.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The buffer size: the largest length.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.pool().buf_size as usize
    }

    /// Sets the length (the bytes up to it are whatever the buffer holds).
    #[inline]
    pub fn set_len(&mut self, len: usize) -> Result<()> {
        let cap = self.capacity();
        if len > cap {
            return Err(NicError::TooLong { len, capacity: cap });
        }
        self.len = len as u32;
        Ok(())
    }

    /// The bus address of the first byte (what a descriptor gets).
    #[inline]
    pub fn bus_addr(&self) -> BusAddr {
        self.pool().buf_bus(self.index)
    }

    /// The buffer's index in its pool.
    #[inline]
    pub fn buf_index(&self) -> usize {
        self.index as usize
    }
}

impl Drop for Packet {
    #[inline]
    fn drop(&mut self) {
        let home = {
            let mut free = self.pool().lock();
            free.push(self.index);
            free.release_if_home()
        };
        // The pool may be freed here (this was its last buffer out and no handle is left); it
        // is not touched after.
        drop(home);
    }
}

/// Gives the buffers of `pkts` back with one lock per run of packets from the same pool, with
/// no per-packet reference counting.
#[inline]
pub(crate) fn free_iter(pkts: impl Iterator<Item = Packet>) {
    let mut rest = pkts.map(ManuallyDrop::new).peekable();
    while let Some(first) = rest.next() {
        let home = {
            let mut free = first.pool().lock();
            free.push(first.index);
            while let Some(p) = rest.next_if(|p| p.pool == first.pool) {
                free.push(p.index);
            }
            free.release_if_home()
        };
        drop(home);
    }
}

/// Drops every packet of `pkts` (leaving it empty, its capacity kept), giving the buffers back
/// with one lock per run of packets from the same pool instead of one per packet.
#[inline]
pub fn free_bulk(pkts: &mut Vec<Packet>) {
    free_iter(pkts.drain(..));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(n: usize) -> Mempool {
        Mempool::new(&DmaContext::for_testing(), n, PageSize::Base4K).unwrap()
    }

    #[test]
    fn alloc_free_and_exhaustion() {
        let p = pool(6);
        assert_eq!((p.capacity(), p.available(), p.buf_size()), (6, 6, 2048));
        let a = p.alloc().unwrap();
        assert_eq!((a.buf_index(), a.len(), a.capacity()), (0, 0, 2048));
        let mut v = Vec::with_capacity(8);
        assert_eq!(p.alloc_bulk(&mut v, 8), 5);
        assert!(p.alloc().is_none());
        let e = p.alloc_exact(&mut v, 1).unwrap_err();
        assert!(
            matches!(
                e,
                NicError::PoolExhausted {
                    need: 1,
                    available: 0,
                    capacity: 6,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("make the pool larger"), "{e}");
        drop(a);
        assert_eq!(p.available(), 1);
        free_bulk(&mut v);
        assert!(v.is_empty() && v.capacity() >= 8);
        assert_eq!(p.available(), 6);
        // Distinct, page-contained buffers with distinct bus addresses.
        p.alloc_exact(&mut v, 6).unwrap();
        let mut bus: Vec<u64> = v.iter().map(|p| p.bus_addr().get()).collect();
        bus.sort();
        bus.dedup();
        assert_eq!(bus.len(), 6);
    }

    #[test]
    fn packets_go_back_to_their_own_pool() {
        let (a, b) = (pool(2), pool(2));
        let mut v = Vec::new();
        a.alloc_exact(&mut v, 1).unwrap();
        b.alloc_exact(&mut v, 2).unwrap();
        a.alloc_exact(&mut v, 1).unwrap();
        assert!(a.owns(&v[0]) && !a.owns(&v[1]));
        free_bulk(&mut v);
        assert_eq!((a.available(), b.available()), (2, 2));
    }

    #[test]
    fn the_pool_lives_exactly_while_a_handle_or_a_buffer_is_out() {
        let p = pool(4);
        let weak = Arc::downgrade(&p.shared);
        let mut v = Vec::new();
        p.alloc_exact(&mut v, 3).unwrap();
        assert_eq!(std::mem::size_of_val(&v[0]), 16);
        drop(p);
        assert!(weak.upgrade().is_some(), "buffers out keep the pool");
        // Given back from another thread, in two steps: the last one frees the pool.
        let last = v.pop().unwrap();
        std::thread::spawn(move || free_bulk(&mut v)).join().unwrap();
        assert!(weak.upgrade().is_some());
        drop(last);
        assert!(weak.upgrade().is_none(), "freed with the last buffer");
        // A pool with every buffer home goes with its last handle.
        let p = pool(2);
        let weak = Arc::downgrade(&p.shared);
        drop(p.alloc().unwrap());
        drop(p);
        assert!(weak.upgrade().is_none());
    }

    #[test]
    fn a_packet_keeps_its_pool_alive() {
        let p = pool(2);
        let pkt = p.alloc().unwrap();
        drop(p);
        let mut pkt = pkt;
        pkt.fill(b"still here").unwrap();
        assert_eq!(pkt.to_vec(), b"still here");
    }
}
