//! The receive queue (82574 datasheet §7.1: legacy descriptors §7.1.4, ring structure §7.1.8;
//! initialization §4.6.5).
//!
//! Every ring slot always holds a buffer. The device owns the slots from its head (RDH) up to
//! but not including the tail (RDT); the driver owns the rest, and keeps the tail one behind
//! the next slot it will look at, so one slot is always empty and head == tail means "no
//! buffers". A burst takes completed slots in order (DD set), hands their buffers out as
//! packets, puts a fresh buffer from its private cache into each slot, and then moves the tail
//! once. The cache refills from the pool in bulk, one lock per [`CACHE_REFILL`] buffers; when
//! the pool is empty a completed slot stays where it is (counted in
//! [`RxQueueStats::no_buffer`]) and the device drops frames until buffers come back.

use std::cell::Cell;
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use vfpoll_dma::{DmaContext, PageSize};
use vfpoll_pci::mmio::Mmio;

use super::desc::{RxErrors, RxStatus, RxWriteBack};
use super::regs::{intr, off, Rctl};
use super::Shared;
use crate::error::{NicError, Result};
use crate::irq::{self, CompletionMode, IrqKind, Sleeper};
use crate::mem::{rmb, wmb, RingMem, DESC_SIZE};
use crate::pool::{Mempool, Packet, PoolShared};
use crate::port::RxQueue;
use crate::stats::RxQueueStats;

/// Buffers moved from the pool into the private cache per refill (one lock).
pub const CACHE_REFILL: usize = 64;

/// The 82574's receive queue 0. See the module docs.
pub struct E1000eRx {
    ring: RingMem,
    /// Buffer index in each slot.
    slots: Box<[u32]>,
    /// The next slot to look at.
    next: usize,
    entries: usize,
    pool: Arc<PoolShared>,
    cache: Vec<u32>,
    /// Inside a frame that spans descriptors (dropped whole).
    discarding: bool,
    stats: RxQueueStats,
    rdt: Mmio,
    shared: Arc<Shared>,
    /// Interrupt mode: how, and the cause to unmask (RXQ0 with MSI-X, RXT0 with MSI); 0 when
    /// polling. Not read by `rx_burst`.
    mode: CompletionMode,
    cause: u32,
    _not_sync: PhantomData<Cell<()>>,
}

impl std::fmt::Debug for E1000eRx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("E1000eRx")
            .field("port", &self.shared.name)
            .field("entries", &self.entries)
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

impl E1000eRx {
    /// Allocates the ring, fills every slot with a buffer from `pool` and programs the ring
    /// registers (§4.6.5), with the tail at 0: the device gets no buffer before [`Self::start`].
    pub(super) fn new(
        shared: &Arc<Shared>,
        dma: &DmaContext,
        pool: &Mempool,
        entries: usize,
        page_size: PageSize,
    ) -> Result<Self> {
        let bytes = entries * DESC_SIZE;
        let mut ring = RingMem::new(dma.alloc_region(bytes, page_size)?);
        if ring.contiguous_len(0) < bytes {
            return Err(NicError::InvalidOption(format!(
                "a receive ring of {entries} descriptors needs {bytes} bus-contiguous bytes, more than one {page_size} page"
            )));
        }
        let pool = Arc::clone(&pool.shared);
        let mut bufs = Vec::with_capacity(entries);
        let got = pool.take(&mut bufs, entries);
        if got < entries {
            pool.give(bufs);
            return Err(NicError::PoolExhausted {
                what: "the receive ring",
                need: entries,
                available: got,
                capacity: pool.capacity(),
            });
        }
        for (slot, &b) in bufs.iter().enumerate() {
            ring.write_desc(slot, pool.buf_bus(b).get(), 0);
        }
        let bar = &shared.bar;
        let base = ring.bus(0).get();
        bar.write32(off::RDBAL, base as u32);
        bar.write32(off::RDBAH, (base >> 32) as u32);
        bar.write32(off::RDLEN, bytes as u32);
        bar.write32(off::RDH, 0);
        bar.write32(off::RDT, 0);
        Ok(E1000eRx {
            ring,
            slots: bufs.into_boxed_slice(),
            next: 0,
            entries,
            pool,
            cache: Vec::with_capacity(2 * CACHE_REFILL),
            discarding: false,
            stats: RxQueueStats::default(),
            rdt: bar.window(off::RDT, 4).expect("RDT inside BAR0"),
            shared: Arc::clone(shared),
            mode: CompletionMode::Poll,
            cause: 0,
            _not_sync: PhantomData,
        })
    }

    /// Sets interrupt mode up (the device's routing is programmed by the caller).
    pub(super) fn set_completion(&mut self, mode: CompletionMode) {
        if let (true, Some(i)) = (mode.interrupts(), &self.shared.irq) {
            self.mode = mode;
            self.cause = match i.kind {
                IrqKind::Msix => intr::RXQ0,
                IrqKind::Msi => intr::RXT0,
            };
        }
    }

    /// Gives the device every slot but one (the tail one behind slot 0). Call after RCTL.EN.
    pub(super) fn start(&mut self) {
        wmb();
        self.rdt.write32(0, self.entries as u32 - 1);
        self.stats.doorbells += 1;
    }

    /// Descriptors in the ring.
    pub fn entries(&self) -> usize {
        self.entries
    }
}

impl RxQueue for E1000eRx {
    #[inline]
    fn rx_burst(&mut self, out: &mut Vec<Packet>, max: usize) -> usize {
        self.stats.bursts += 1;
        // Fields in locals: the descriptor stores are volatile, after which the compiler would
        // otherwise load them again for every packet.
        let entries = self.entries;
        let pool = &*self.pool;
        let buf_size = pool.buf_size;
        let mut discarding = self.discarding;
        let mut delivered = 0usize;
        let mut used = 0usize;
        let mut bytes = 0u64;
        let mut errors = 0u64;
        let mut i = self.next;
        while delivered < max {
            let wb = RxWriteBack(self.ring.read_hi(i));
            if !wb.done() {
                break;
            }
            let Some(fresh) = self.pool.take_cached(&mut self.cache, CACHE_REFILL) else {
                // No buffer to put in its place: leave the frame in the ring until one comes
                // back.
                self.stats.no_buffer += 1;
                break;
            };
            rmb();
            let buf = std::mem::replace(&mut self.slots[i], fresh);
            self.ring.write_desc(i, pool.buf_bus(fresh).get(), 0);
            let eop = wb.status().contains(RxStatus::EOP);
            let len = wb.length();
            if discarding || !eop || wb.errors().intersects(RxErrors::FATAL) || len as u32 > buf_size {
                // Frames longer than one buffer cannot happen with RCTL.LPE clear; drop them
                // (and frames with receive errors, or a length no buffer holds) whole.
                errors += eop as u64;
                discarding = !eop;
                self.cache.push(buf);
            } else {
                bytes += len as u64;
                out.push(Packet::new(pool, buf, len as u32));
                delivered += 1;
            }
            used += 1;
            i = if i + 1 == entries { 0 } else { i + 1 };
        }
        self.discarding = discarding;
        if used != 0 {
            self.next = i;
            // The fresh descriptors before the tail write that hands them to the device.
            wmb();
            let tail = if i == 0 { entries - 1 } else { i - 1 };
            self.rdt.write32(0, tail as u32);
            self.stats.doorbells += 1;
            self.stats.packets += delivered as u64;
            self.stats.bytes += bytes;
            self.stats.errors += errors;
        }
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
        if self.cause != 0 {
            self.disarm_device();
        }
    }

    fn wait(&mut self, timeout: Option<Duration>) -> Result<bool> {
        irq::wait_on(self, timeout)
    }
}

impl Sleeper for E1000eRx {
    fn irq(&self) -> Option<(&vfpoll_pci::vfio::EventFd, CompletionMode)> {
        match (&self.shared.irq, self.cause) {
            (Some(i), c) if c != 0 => Some((&i.fd, self.mode)),
            _ => None,
        }
    }

    fn name(&self) -> &str {
        &self.shared.name
    }

    fn ready(&self) -> bool {
        RxWriteBack(self.ring.read_hi(self.next)).done()
    }

    /// Clears the cause (ICR is write-1-to-clear, §10.2.4), then unmasks it: a cause left
    /// from frames already polled would otherwise interrupt at once.
    fn arm_device(&mut self) {
        let bar = &self.shared.bar;
        bar.write32(off::ICR, self.cause);
        bar.write32(off::IMS, self.cause);
    }

    fn disarm_device(&mut self) {
        self.shared.bar.write32(off::IMC, self.cause);
    }
}

/// The interrupt eventfd (see [`RxQueue::event_fd`]).
///
/// # Panics
/// In poll mode, which has none.
impl AsRawFd for E1000eRx {
    fn as_raw_fd(&self) -> RawFd {
        match irq::borrowed(self) {
            Some(fd) => fd.as_raw_fd(),
            None => panic!("{}: the receive queue polls and has no eventfd", self.shared.name),
        }
    }
}

impl Drop for E1000eRx {
    fn drop(&mut self) {
        let _g = self.shared.ctl();
        let bar = &self.shared.bar;
        let rctl = bar.read32(off::RCTL);
        if rctl == u32::MAX {
            // The device does not answer: it may still write into the ring and the buffers.
            log::error!(
                "{}: device gone while its receive queue is live; leaking the ring and the packet pool",
                self.shared.name
            );
            self.ring.leak();
            self.pool.leak();
            return;
        }
        // Stop the receiver, then let a frame in progress land (as Linux's e1000e does), after
        // which the device no longer touches the ring or its buffers.
        bar.write32(off::RCTL, rctl & !Rctl::EN.bits());
        let _ = bar.read32(off::STATUS);
        std::thread::sleep(Duration::from_millis(10));
        bar.write32(off::RDLEN, 0);
        self.pool
            .give(self.slots.iter().copied().chain(self.cache.drain(..)));
    }
}
