//! Packet buffers: a [`Mempool`] of fixed-size DMA buffers and the [`Packet`] handle that owns
//! one of them.
//!
//! A pool is one [`DmaRegion`] (hugepages in production) carved into `count` buffers of
//! `buf_size` bytes, a power of two that divides the page size, so each buffer is contiguous on
//! the bus in both IOMMU modes. The free list is a stack of buffer indices behind a mutex; the
//! hot path takes and gives back buffers in bulk (one lock per burst: an RX queue refills its
//! private cache, a TX queue frees a reclaimed batch), so the lock is not per packet.
//!
//! A [`Packet`] holds its buffer exclusively and a reference count on the pool, so the pool's
//! memory outlives every packet, whichever thread drops it last. Dropping a packet gives its
//! buffer back. Packets move between queues by value: what [`crate::RxQueue::rx_burst`] returns,
//! [`crate::TxQueue::tx_burst`] takes, zero-copy, also across ports that share a pool (or not:
//! each packet goes back to its own pool).

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
    pub(crate) buf_size: u32,
    count: u32,
    free: Mutex<Vec<u32>>,
    /// Set when a device may still write into buffers it was given (a queue could not be
    /// stopped): the region is then never freed.
    leak: AtomicBool,
}

impl std::fmt::Debug for PoolShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mempool")
            .field("buf_size", &self.buf_size)
            .field("count", &self.count)
            .field("available", &self.lock().len())
            .field("region", &self.region)
            .finish()
    }
}

impl PoolShared {
    /// The free list. Never held across anything but pushes and pops; poisoning is ignored
    /// (no code panics while holding it with the list half-updated).
    #[inline]
    fn lock(&self) -> MutexGuard<'_, Vec<u32>> {
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
    pub(crate) fn buf_ptr(&self, index: u32) -> NonNull<u8> {
        let off = index as usize * self.buf_size as usize;
        NonNull::new(self.region().as_ptr().wrapping_add(off)).expect("region pointers are non-null")
    }

    /// Bus address of buffer `index`.
    #[inline]
    pub(crate) fn buf_bus(&self, index: u32) -> BusAddr {
        self.region().bus_addr(index as usize * self.buf_size as usize)
    }

    /// Moves up to `n` free buffer indices to `out`; returns how many.
    #[inline]
    pub(crate) fn take(&self, out: &mut Vec<u32>, n: usize) -> usize {
        let mut free = self.lock();
        let k = n.min(free.len());
        let at = free.len() - k;
        out.extend(free.drain(at..));
        k
    }

    /// Gives indices back.
    #[inline]
    pub(crate) fn give(&self, idx: impl IntoIterator<Item = u32>) {
        let mut free = self.lock();
        for i in idx {
            debug_assert!(
                i < self.count && free.len() < self.count as usize,
                "double free of buffer {i}"
            );
            free.push(i);
        }
    }

    /// Never free the region: a device may still write into it.
    pub(crate) fn leak(&self) {
        self.leak.store(true, Ordering::Relaxed);
    }

    pub(crate) fn available(&self) -> usize {
        self.lock().len()
    }

    pub(crate) fn capacity(&self) -> usize {
        self.count as usize
    }
}

impl Drop for PoolShared {
    fn drop(&mut self) {
        // Last reference: no handle, queue or packet is left, so every buffer is either free or
        // was given to a device that could not be stopped (then `leak` is set).
        let out = self.count as usize - self.lock().len();
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
        Ok(Mempool {
            shared: Arc::new(PoolShared {
                region: Some(region),
                buf_size: buf_size as u32,
                count: count as u32,
                // Reversed so the first allocation hands out buffer 0.
                free: Mutex::new((0..count as u32).rev().collect()),
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
        let mut one = Vec::with_capacity(1);
        self.shared.take(&mut one, 1);
        one.pop().map(|i| Packet::new(&self.shared, i, 0))
    }

    /// Appends up to `n` packets of length 0 to `out` with one lock; returns how many (fewer when
    /// the pool runs out). Allocates nothing when `out` has room.
    pub fn alloc_bulk(&self, out: &mut Vec<Packet>, n: usize) -> usize {
        let mut free = self.shared.lock();
        let k = n.min(free.len());
        for _ in 0..k {
            let i = free.pop().expect("counted above");
            out.push(Packet::new(&self.shared, i, 0));
        }
        k
    }

    /// Like [`Mempool::alloc_bulk`], but all or nothing: [`NicError::PoolExhausted`] when fewer
    /// than `n` are free.
    pub fn alloc_exact(&self, out: &mut Vec<Packet>, n: usize) -> Result<()> {
        let mut free = self.shared.lock();
        if free.len() < n {
            return Err(NicError::PoolExhausted {
                what: "alloc_exact",
                need: n,
                available: free.len(),
                capacity: self.capacity(),
            });
        }
        for _ in 0..n {
            let i = free.pop().expect("counted above");
            out.push(Packet::new(&self.shared, i, 0));
        }
        Ok(())
    }

    /// Whether `pkt`'s buffer belongs to this pool.
    pub fn owns(&self, pkt: &Packet) -> bool {
        Arc::ptr_eq(&self.shared, &pkt.pool)
    }
}

/// Buffer index of a packet whose buffer was already given back (by [`free_bulk`]).
const GIVEN_BACK: u32 = u32::MAX;

/// One packet buffer, owned: while the handle exists no device reads or writes the buffer and
/// no other handle refers to it. Dropping it gives the buffer back to its pool.
///
/// The data is reached by copies ([`Packet::write_at`], [`Packet::read_at`], [`Packet::fill`])
/// or, for zero-copy parsing and in-place rewriting, through [`Packet::data`] and
/// [`Packet::data_mut`] (see there why that is sound).
pub struct Packet {
    pub(crate) ptr: NonNull<u8>,
    pub(crate) bus: BusAddr,
    pub(crate) index: u32,
    pub(crate) len: u32,
    pub(crate) cap: u32,
    pub(crate) pool: Arc<PoolShared>,
}

impl std::fmt::Debug for Packet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Packet")
            .field("index", &self.index)
            .field("len", &self.len)
            .field("bus", &self.bus)
            .finish()
    }
}

impl Packet {
    /// A handle for buffer `index` of `pool`, which the caller took off the free list.
    #[inline]
    pub(crate) fn new(pool: &Arc<PoolShared>, index: u32, len: u32) -> Self {
        Packet {
            ptr: pool.buf_ptr(index),
            bus: pool.buf_bus(index),
            index,
            len,
            cap: pool.buf_size,
            pool: Arc::clone(pool),
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
        self.cap as usize
    }

    /// Sets the length (the bytes up to it are whatever the buffer holds).
    #[inline]
    pub fn set_len(&mut self, len: usize) -> Result<()> {
        if len > self.cap as usize {
            return Err(NicError::TooLong {
                len,
                capacity: self.cap as usize,
            });
        }
        self.len = len as u32;
        Ok(())
    }

    /// The bus address of the first byte (what a descriptor gets).
    #[inline]
    pub fn bus_addr(&self) -> BusAddr {
        self.bus
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
        if self.index != GIVEN_BACK {
            self.pool.give([self.index]);
        }
    }
}

/// Drops every packet of `pkts` (leaving it empty, its capacity kept), giving the buffers back
/// with one lock per run of packets from the same pool instead of one per packet.
pub fn free_bulk(pkts: &mut Vec<Packet>) {
    let mut i = 0;
    while i < pkts.len() {
        let pool = Arc::clone(&pkts[i].pool);
        let mut free = pool.lock();
        while i < pkts.len() && Arc::ptr_eq(&pkts[i].pool, &pool) {
            let p = &mut pkts[i];
            if p.index != GIVEN_BACK {
                free.push(p.index);
                p.index = GIVEN_BACK;
            }
            i += 1;
        }
    }
    pkts.clear();
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
    fn a_packet_keeps_its_pool_alive() {
        let p = pool(2);
        let pkt = p.alloc().unwrap();
        drop(p);
        let mut pkt = pkt;
        pkt.fill(b"still here").unwrap();
        assert_eq!(pkt.to_vec(), b"still here");
    }
}
