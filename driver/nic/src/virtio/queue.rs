//! Split virtqueues (VIRTIO 1.2 §2.7; 1.1 §2.6) and the network device's receive and transmit
//! queues on them (§5.1.6).
//!
//! One DMA region per queue holds, in this order: the descriptor table (16 bytes per entry,
//! 16-byte aligned), the available ring (`flags`, `idx`, `ring[size]`, `used_event`), the used
//! ring at the next 4-byte boundary (`flags`, `idx`, `ring[size]` of `{id: u32, len: u32}`,
//! `avail_event`), then 16 bytes of `virtio_net_hdr` per packet slot. Every field is reached
//! through volatile loads and stores in the crate's `mem` module.
//!
//! Each packet takes a chain of two descriptors, fixed per slot: descriptor `2s` is the 12-byte
//! `virtio_net_hdr` (§5.1.6, with VIRTIO_F_VERSION_1), descriptor `2s + 1` the packet buffer.
//! Only the second one is rewritten per packet (the buffer address, and the length on
//! transmit), so a queue of `size` descriptors carries `size / 2` packets.
//!
//! Polled: the available ring's flags say VRING_AVAIL_F_NO_INTERRUPT (§2.7.10; cleared only
//! while a receive queue in interrupt mode sleeps, see [`crate::irq`]), and a burst
//! publishes its entries with one store of `avail.idx`, then notifies the device (one write to
//! the notification area, §4.1.4.4) unless the used ring's flags say VRING_USED_F_NO_NOTIFY.

use std::cell::Cell;
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vfpoll_dma::{DmaContext, PageSize};
use vfpoll_pci::mmio::Mmio;
use vfpoll_pci::BusAddr;

use super::Shared;
use crate::error::{NicError, Result};
use crate::irq::{self, CompletionMode, Sleeper};
use crate::mem::{mb, rmb, wmb, RingMem, DESC_SIZE};
use crate::pool::{free_iter, Packet, PoolShared};
use crate::port::{RxQueue, TxQueue};
use crate::stats::{RxQueueStats, TxQueueStats};

/// `struct virtio_net_hdr` with VIRTIO_F_VERSION_1 (`num_buffers` included): 12 bytes (§5.1.6).
pub const NET_HDR_LEN: usize = 12;
/// Descriptor flag: the chain continues at `next` (§2.7.5).
const DESC_F_NEXT: u16 = 1;
/// Descriptor flag: the device writes this buffer.
const DESC_F_WRITE: u16 = 2;
/// Available ring flag: no used-buffer notifications (interrupts) wanted (§2.7.10).
const AVAIL_F_NO_INTERRUPT: u16 = 1;
/// Used ring flag: the device does not need available-buffer notifications now (§2.7.10).
const USED_F_NO_NOTIFY: u16 = 1;
/// Most completions reclaimed per pool lock.
pub const RECLAIM_BATCH: usize = 32;
/// Buffers the receive queue takes from the pool at once when its cache runs dry.
const CACHE_REFILL: usize = 64;

/// Byte offsets of one split virtqueue's parts in its memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Entries (a power of two).
    pub size: usize,
    /// Available ring.
    pub avail: usize,
    /// Used ring.
    pub used: usize,
    /// The per-slot `virtio_net_hdr` area.
    pub hdrs: usize,
    /// Total bytes.
    pub len: usize,
}

impl Layout {
    /// The layout for `size` entries (§2.7: descriptor table aligned to 16, available ring to
    /// 2, used ring to 4) with `size / 2` header slots of 16 bytes.
    pub fn new(size: usize) -> Self {
        let avail = size * DESC_SIZE;
        let used = (avail + 6 + 2 * size).next_multiple_of(16);
        let hdrs = (used + 6 + 8 * size).next_multiple_of(16);
        Layout {
            size,
            avail,
            used,
            hdrs,
            len: hdrs + 16 * (size / 2),
        }
    }
}

/// One split virtqueue's memory.
pub(super) struct Vring {
    mem: RingMem,
    lay: Layout,
    mask: u16,
}

impl Vring {
    fn new(dma: &DmaContext, size: usize, page_size: PageSize) -> Result<Self> {
        let lay = Layout::new(size);
        let mem = RingMem::new(dma.alloc_region(lay.len, page_size)?);
        if mem.contiguous_len(0) < lay.len {
            return Err(NicError::InvalidOption(format!(
                "a virtqueue of {size} entries needs {} bus-contiguous bytes, more than one {page_size} page",
                lay.len
            )));
        }
        Ok(Vring {
            mem,
            lay,
            mask: (size - 1) as u16,
        })
    }

    /// Bus addresses of the descriptor table, available ring and used ring.
    pub(super) fn areas(&self) -> (BusAddr, BusAddr, BusAddr) {
        (
            self.mem.bus(0),
            self.mem.bus(self.lay.avail),
            self.mem.bus(self.lay.used),
        )
    }

    fn hdr_bus(&self, slot: usize) -> BusAddr {
        self.mem.bus(self.lay.hdrs + 16 * slot)
    }

    /// Descriptor `i` (§2.7.5: `addr` u64, `len` u32, `flags` u16, `next` u16).
    #[inline(always)]
    fn set_desc(&mut self, i: usize, addr: BusAddr, len: u32, flags: u16, next: u16) {
        let hi = len as u64 | (flags as u64) << 32 | (next as u64) << 48;
        self.mem.write_desc(i, addr.get(), hi);
    }

    #[inline(always)]
    fn set_avail_flags(&mut self, f: u16) {
        self.mem.store16(self.lay.avail, f);
    }

    /// `avail.ring[idx mod size] = head`.
    #[inline(always)]
    fn set_avail(&mut self, idx: u16, head: u16) {
        let off = self.lay.avail + 4 + 2 * (idx & self.mask) as usize;
        self.mem.store16(off, head);
    }

    /// Publishes the entries before `idx` (after a [`wmb`]).
    #[inline(always)]
    fn publish(&mut self, idx: u16) {
        wmb();
        self.mem.store16(self.lay.avail + 2, idx);
    }

    #[inline(always)]
    fn used_idx(&self) -> u16 {
        self.mem.load16(self.lay.used + 2)
    }

    /// `used.ring[idx mod size]` as `(id, len)`.
    #[inline(always)]
    fn used_elem(&self, idx: u16) -> (u32, u32) {
        let off = self.lay.used + 4 + 8 * (idx & self.mask) as usize;
        (self.mem.load32(off), self.mem.load32(off + 4))
    }

    /// Whether the device asks for an available-buffer notification now. Called after
    /// [`Vring::publish`]; the full barrier orders that store before this load (§2.7.13.4).
    #[inline(always)]
    fn wants_notify(&self) -> bool {
        mb();
        self.mem.load16(self.lay.used) & USED_F_NO_NOTIFY == 0
    }
}

/// The slot of a chain head, if it is one of ours (even and in range).
#[inline(always)]
fn slot_of(id: u32, slots: usize) -> Option<usize> {
    let s = (id / 2) as usize;
    (id.is_multiple_of(2) && s < slots).then_some(s)
}

/// The receive queue (`receiveq1`, virtqueue 0, §5.1.2).
pub struct VirtioRx {
    ring: Vring,
    /// The buffer behind each slot (all of them are always with the device).
    slots: Box<[u32]>,
    avail_idx: u16,
    last_used: u16,
    pool: Arc<PoolShared>,
    cache: Vec<u32>,
    stats: RxQueueStats,
    notify: Mmio,
    shared: Arc<Shared>,
    /// Interrupt mode (not read by `rx_burst`).
    mode: CompletionMode,
    _not_sync: PhantomData<Cell<()>>,
}

impl std::fmt::Debug for VirtioRx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VirtioRx")
            .field("port", &self.shared.name)
            .field("slots", &self.slots.len())
            .finish_non_exhaustive()
    }
}

impl VirtioRx {
    /// Allocates the queue of `size` entries and puts a pool buffer behind every slot, all of
    /// them published; the device is told by [`Self::start`], after DRIVER_OK.
    pub(super) fn new(
        shared: &Arc<Shared>,
        dma: &DmaContext,
        pool: &crate::Mempool,
        size: usize,
        page_size: PageSize,
        notify: Mmio,
    ) -> Result<Self> {
        let mut ring = Vring::new(dma, size, page_size)?;
        let n = size / 2;
        let pool = Arc::clone(&pool.shared);
        let mut bufs = Vec::with_capacity(n);
        let got = pool.take(&mut bufs, n);
        if got < n {
            pool.give(bufs);
            return Err(NicError::PoolExhausted {
                what: "the receive queue",
                need: n,
                available: got,
                capacity: pool.capacity(),
            });
        }
        ring.set_avail_flags(AVAIL_F_NO_INTERRUPT);
        for (s, &b) in bufs.iter().enumerate() {
            let hdr = ring.hdr_bus(s);
            ring.set_desc(
                2 * s,
                hdr,
                NET_HDR_LEN as u32,
                DESC_F_WRITE | DESC_F_NEXT,
                2 * s as u16 + 1,
            );
            ring.set_desc(2 * s + 1, pool.buf_bus(b), pool.buf_size, DESC_F_WRITE, 0);
            ring.set_avail(s as u16, 2 * s as u16);
        }
        ring.publish(n as u16);
        Ok(VirtioRx {
            ring,
            slots: bufs.into_boxed_slice(),
            avail_idx: n as u16,
            last_used: 0,
            pool,
            cache: Vec::with_capacity(2 * CACHE_REFILL),
            stats: RxQueueStats::default(),
            notify,
            shared: Arc::clone(shared),
            mode: CompletionMode::Poll,
            _not_sync: PhantomData,
        })
    }

    pub(super) fn ring(&self) -> &Vring {
        &self.ring
    }

    /// Sets interrupt mode up (the queue's vector is programmed by the caller).
    pub(super) fn set_completion(&mut self, mode: CompletionMode) {
        if mode.interrupts() && self.shared.irq.is_some() {
            self.mode = mode;
        }
    }

    /// Notifies the device of the buffers published at set-up (after DRIVER_OK, §3.1.1).
    pub(super) fn start(&mut self) {
        self.notify.write16(0, 0);
        self.stats.doorbells += 1;
    }

    /// Packet slots (buffers the device holds).
    pub fn slots(&self) -> usize {
        self.slots.len()
    }
}

impl RxQueue for VirtioRx {
    #[inline]
    fn rx_burst(&mut self, out: &mut Vec<Packet>, max: usize) -> usize {
        self.stats.bursts += 1;
        let used_idx = self.ring.used_idx();
        if used_idx == self.last_used {
            return 0;
        }
        // The index load before the loads of the elements and the buffers it covers.
        rmb();
        let pool = &*self.pool;
        let buf_size = pool.buf_size;
        let nslots = self.slots.len();
        let (mut delivered, mut used, mut bytes, mut errors) = (0usize, 0u16, 0u64, 0u64);
        let mut last = self.last_used;
        let mut avail = self.avail_idx;
        while last != used_idx && delivered < max {
            let (id, len) = self.ring.used_elem(last);
            let Some(s) = slot_of(id, nslots) else {
                // Not a chain we made: nothing to give back for it.
                log::error!(
                    "{}: receive queue: used id {id} is no chain head",
                    self.shared.name
                );
                errors += 1;
                last = last.wrapping_add(1);
                continue;
            };
            let Some(fresh) = self.pool.take_cached(&mut self.cache, CACHE_REFILL) else {
                // No buffer to put in its place: leave the chain with the device's used entries
                // until one comes back.
                self.stats.no_buffer += 1;
                break;
            };
            let buf = std::mem::replace(&mut self.slots[s], fresh);
            self.ring
                .set_desc(2 * s + 1, pool.buf_bus(fresh), buf_size, DESC_F_WRITE, 0);
            self.ring.set_avail(avail, 2 * s as u16);
            avail = avail.wrapping_add(1);
            let frame = (len as usize).wrapping_sub(NET_HDR_LEN);
            if (len as usize) < NET_HDR_LEN + 14 || frame > buf_size as usize {
                errors += 1;
                self.cache.push(buf);
            } else {
                bytes += frame as u64;
                out.push(Packet::new(pool, buf, frame as u32));
                delivered += 1;
            }
            used += 1;
            last = last.wrapping_add(1);
        }
        self.last_used = last;
        if used != 0 {
            self.avail_idx = avail;
            self.ring.publish(avail);
            if self.ring.wants_notify() {
                self.notify.write16(0, 0);
                self.stats.doorbells += 1;
            }
        }
        self.stats.packets += delivered as u64;
        self.stats.bytes += bytes;
        self.stats.errors += errors;
        delivered
    }

    fn stats(&self) -> RxQueueStats {
        self.stats
    }

    fn completion_mode(&self) -> CompletionMode {
        self.mode
    }

    fn event_fd(&self) -> Option<BorrowedFd<'_>> {
        irq::borrowed(self)
    }

    fn arm(&mut self) -> Result<bool> {
        irq::arm_on(self)
    }

    fn disarm(&mut self) {
        if self.mode.interrupts() {
            self.disarm_device();
        }
    }

    fn wait(&mut self, timeout: Option<Duration>) -> Result<bool> {
        irq::wait_on(self, timeout)
    }
}

impl Sleeper for VirtioRx {
    fn irq(&self) -> Option<(&vfpoll_pci::vfio::EventFd, CompletionMode)> {
        match &self.shared.irq {
            Some(i) if self.mode.interrupts() => Some((&i.fd, self.mode)),
            _ => None,
        }
    }

    fn name(&self) -> &str {
        &self.shared.name
    }

    fn ready(&self) -> bool {
        self.ring.used_idx() != self.last_used
    }

    /// Asks for used-buffer notifications (§2.7.10), then a full barrier: the flag store is
    /// ordered before the used-index load in `ready` (the device does the mirror image:
    /// used-index store, barrier, flag load, §2.7.10).
    fn arm_device(&mut self) {
        self.ring.set_avail_flags(0);
        mb();
    }

    fn disarm_device(&mut self) {
        self.ring.set_avail_flags(AVAIL_F_NO_INTERRUPT);
    }
}

/// The interrupt eventfd (see [`RxQueue::event_fd`]).
///
/// # Panics
/// In poll mode, which has none.
impl AsRawFd for VirtioRx {
    fn as_raw_fd(&self) -> RawFd {
        match irq::borrowed(self) {
            Some(fd) => fd.as_raw_fd(),
            None => panic!("{}: the receive queue polls and has no eventfd", self.shared.name),
        }
    }
}

impl Drop for VirtioRx {
    fn drop(&mut self) {
        // A virtio 1.x device stops using its queues only at a reset (§2.4); the transmit
        // queue's packets are then given back without waiting.
        if !self.shared.stop() {
            log::error!(
                "{}: device did not reset while its receive queue is live; leaking the queue and the packet pool",
                self.shared.name
            );
            self.ring.mem.leak();
            self.pool.leak();
            return;
        }
        self.pool
            .give(self.slots.iter().copied().chain(self.cache.drain(..)));
    }
}

/// The transmit queue (`transmitq1`, virtqueue 1, §5.1.6.2).
pub struct VirtioTx {
    ring: Vring,
    /// The packet behind each slot in flight.
    slots: Box<[Option<Packet>]>,
    /// Free slots (a stack; the device may complete chains out of order).
    free: Vec<u16>,
    avail_idx: u16,
    last_used: u16,
    stats: TxQueueStats,
    notify: Mmio,
    shared: Arc<Shared>,
    _not_sync: PhantomData<Cell<()>>,
}

impl std::fmt::Debug for VirtioTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VirtioTx")
            .field("port", &self.shared.name)
            .field("slots", &self.slots.len())
            .field("in_flight", &self.in_flight())
            .finish_non_exhaustive()
    }
}

impl VirtioTx {
    /// Allocates the queue of `size` entries; every slot's header descriptor points at a zeroed
    /// `virtio_net_hdr` (no checksum offload, no GSO).
    pub(super) fn new(
        shared: &Arc<Shared>,
        dma: &DmaContext,
        size: usize,
        page_size: PageSize,
        notify: Mmio,
    ) -> Result<Self> {
        let mut ring = Vring::new(dma, size, page_size)?;
        let n = size / 2;
        ring.set_avail_flags(AVAIL_F_NO_INTERRUPT);
        for s in 0..n {
            let hdr = ring.hdr_bus(s);
            ring.set_desc(2 * s, hdr, NET_HDR_LEN as u32, DESC_F_NEXT, 2 * s as u16 + 1);
        }
        Ok(VirtioTx {
            ring,
            slots: (0..n).map(|_| None).collect(),
            free: (0..n as u16).rev().collect(),
            avail_idx: 0,
            last_used: 0,
            stats: TxQueueStats::default(),
            notify,
            shared: Arc::clone(shared),
            _not_sync: PhantomData,
        })
    }

    pub(super) fn ring(&self) -> &Vring {
        &self.ring
    }
}

impl TxQueue for VirtioTx {
    #[inline]
    fn tx_burst(&mut self, pkts: &mut Vec<Packet>) -> usize {
        self.stats.bursts += 1;
        if self.free.len() != self.slots.len() {
            self.reclaim();
        }
        let n = pkts.len().min(self.free.len());
        if n < pkts.len() {
            self.stats.ring_full += 1;
        }
        if n == 0 {
            return 0;
        }
        let (mut placed, mut bytes, mut dropped) = (0u64, 0u64, 0u64);
        let mut avail = self.avail_idx;
        for pkt in pkts.drain(..n) {
            let len = pkt.len();
            if len == 0 {
                dropped += 1;
                continue;
            }
            let s = self.free.pop().expect("n <= free slots") as usize;
            self.ring.set_desc(2 * s + 1, pkt.bus_addr(), len as u32, 0, 0);
            self.ring.set_avail(avail, 2 * s as u16);
            avail = avail.wrapping_add(1);
            self.slots[s] = Some(pkt);
            placed += 1;
            bytes += len as u64;
        }
        self.stats.dropped_empty += dropped;
        if placed != 0 {
            self.avail_idx = avail;
            // Descriptors, ring entries and packet data before the index store (in `publish`).
            self.ring.publish(avail);
            if self.ring.wants_notify() {
                self.notify.write16(0, 1);
                self.stats.doorbells += 1;
            }
            self.stats.packets += placed;
            self.stats.bytes += bytes;
        }
        n
    }

    fn reclaim(&mut self) -> usize {
        let used_idx = self.ring.used_idx();
        let mut k = used_idx.wrapping_sub(self.last_used) as usize;
        if k == 0 {
            return 0;
        }
        rmb();
        let total = k;
        let nslots = self.slots.len();
        while k != 0 {
            let b = k.min(RECLAIM_BATCH);
            let mut last = self.last_used;
            let (ring, slots, free, name) = (&self.ring, &mut self.slots, &mut self.free, &self.shared.name);
            free_iter((0..b).filter_map(|_| {
                let (id, _) = ring.used_elem(last);
                last = last.wrapping_add(1);
                let p = slot_of(id, nslots).and_then(|s| {
                    let p = slots[s].take()?;
                    free.push(s as u16);
                    Some(p)
                });
                if p.is_none() {
                    log::error!("{name}: transmit queue: used id {id} is not in flight");
                }
                p
            }));
            self.last_used = last;
            self.stats.reclaim_batches += 1;
            k -= b;
        }
        self.stats.reclaimed += total as u64;
        total
    }

    fn in_flight(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    fn capacity(&self) -> usize {
        self.slots.len()
    }

    fn flush(&mut self, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            self.reclaim();
            if self.in_flight() == 0 {
                return Ok(());
            }
            if start.elapsed() > timeout {
                return Err(NicError::TxTimeout {
                    port: self.shared.name.clone(),
                    pending: self.in_flight(),
                    timeout,
                });
            }
            std::thread::yield_now();
        }
    }

    fn stats(&self) -> TxQueueStats {
        self.stats
    }
}

impl Drop for VirtioTx {
    fn drop(&mut self) {
        if !self.shared.stopped() {
            let _ = self.flush(Duration::from_millis(200));
        }
        if !self.shared.stop() {
            // The device may still read descriptors and write the used ring: keep the ring.
            // The packets it may still read go back to their pools (a stale read harms no
            // memory).
            log::warn!(
                "{}: device did not reset with {} transmissions pending; leaking the transmit queue",
                self.shared.name,
                self.in_flight()
            );
            self.ring.mem.leak();
        }
        free_iter(self.slots.iter_mut().filter_map(Option::take));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Mutex;

    use crate::irq::{IrqKind, PortIrq};
    use vfpoll_pci::vfio::EventFd;

    /// A receive queue over plain memory (no device): the test plays the device, writing used
    /// entries and signalling the eventfd.
    fn irq_rx(mode: CompletionMode) -> (VirtioRx, EventFd, crate::Mempool) {
        let dma = DmaContext::new(Arc::new(vfpoll_dma::FakeMapper::new()));
        let pool = crate::Mempool::new(&dma, 64, PageSize::Base4K).unwrap();
        let fd = EventFd::new().unwrap();
        let anon = || vfpoll_pci::mmio::anonymous(4096).unwrap();
        let shared = Arc::new(Shared {
            name: "fake".into(),
            common: anon(),
            devcfg: None,
            features: 0,
            stopped: AtomicBool::new(false),
            stop_lock: Mutex::new(()),
            irq: Some(PortIrq::supplied(fd.try_clone().unwrap(), IrqKind::Msix)),
            device: None,
        });
        let mut rx = VirtioRx::new(&shared, &dma, &pool, 16, PageSize::Base4K, anon()).unwrap();
        rx.set_completion(mode);
        (rx, fd, pool)
    }

    fn avail_flags(rx: &VirtioRx) -> u16 {
        rx.ring.mem.load16(rx.ring.lay.avail)
    }

    /// The device's side: chain 0 used with a 60-byte frame, then the used index.
    fn device_uses_slot_0(rx: &mut VirtioRx) {
        let used = rx.ring.lay.used;
        let len = (NET_HDR_LEN + 60) as u16;
        for (o, v) in [(4, 0), (6, 0), (8, len), (10, 0)] {
            rx.ring.mem.store16(used + o, v);
        }
        wmb();
        rx.ring.mem.store16(used + 2, 1);
    }

    #[test]
    fn interrupt_mode_asks_for_notifications_only_while_asleep() {
        let (mut rx, fd, _pool) = irq_rx(CompletionMode::Irq);
        assert_eq!(rx.completion_mode(), CompletionMode::Irq);
        assert_eq!(
            avail_flags(&rx),
            AVAIL_F_NO_INTERRUPT,
            "polling: no notifications"
        );
        // Idle: the wait times out, and the flag is back on return.
        assert!(!rx.wait(Some(Duration::from_millis(20))).unwrap());
        assert_eq!(avail_flags(&rx), AVAIL_F_NO_INTERRUPT);
        // Armed by hand: flag clear, nothing there yet.
        assert!(!rx.arm().unwrap());
        assert_eq!(avail_flags(&rx), 0, "armed: used-buffer notifications wanted");
        // The device uses a buffer and notifies: the eventfd wakes the next wait at once.
        device_uses_slot_0(&mut rx);
        fd.signal().unwrap();
        assert!(rx.wait(Some(Duration::from_secs(5))).unwrap());
        assert_eq!(avail_flags(&rx), AVAIL_F_NO_INTERRUPT, "disarmed on return");
        let mut out = Vec::with_capacity(4);
        assert_eq!(rx.rx_burst(&mut out, 4), 1);
        assert_eq!(out[0].len(), 60);
        crate::free_bulk(&mut out);
        // Nothing left: a short wait times out even though the stale signal was taken.
        assert!(!rx.wait(Some(Duration::from_millis(20))).unwrap());
    }

    #[test]
    fn a_used_entry_before_arming_means_no_sleep() {
        let (mut rx, _fd, _pool) = irq_rx(CompletionMode::Irq);
        device_uses_slot_0(&mut rx);
        let t = Instant::now();
        assert!(
            rx.wait(Some(Duration::from_secs(5))).unwrap(),
            "no interrupt needed"
        );
        assert!(t.elapsed() < Duration::from_secs(1));
        let mut out = Vec::with_capacity(4);
        assert_eq!(rx.rx_burst(&mut out, 4), 1);
        crate::free_bulk(&mut out);
    }

    #[test]
    fn poll_mode_keeps_notifications_off_and_refuses_to_wait() {
        let (mut rx, _fd, _pool) = irq_rx(CompletionMode::Poll);
        assert!(rx.event_fd().is_none());
        assert!(rx.wait(Some(Duration::from_millis(1))).is_err());
        rx.disarm();
        assert_eq!(avail_flags(&rx), AVAIL_F_NO_INTERRUPT);
    }

    #[test]
    fn layout_follows_the_alignment_rules() {
        let l = Layout::new(256);
        assert_eq!(l.avail, 4096);
        assert_eq!(l.used % 4, 0);
        assert!(l.used >= l.avail + 6 + 512);
        assert!(l.hdrs >= l.used + 6 + 8 * 256);
        assert_eq!(l.len, l.hdrs + 16 * 128);
        assert_eq!(slot_of(6, 128), Some(3));
        assert_eq!(slot_of(7, 128), None);
        assert_eq!(slot_of(256, 128), None);
    }
}
