//! The transmit queue (82574 datasheet §7.2, legacy transmit descriptors; initialization
//! §4.6.6).
//!
//! One descriptor per packet (EOP | IFCS). The device owns the slots from its head (TDH) to the
//! tail (TDT); the driver keeps at most `entries - 1` packets in flight so that a full ring
//! never looks empty. A burst writes descriptors and moves the tail once, and asks for a status
//! write-back (RS) on its last descriptor only (DPDK's `tx_rs_thresh`; the device writes DD back
//! only for descriptors with RS, §7.2). The device finishes descriptors in order, so when a
//! burst's last descriptor reads DD the whole burst is done: reclaim gives its buffers back
//! straight from the ring slots, in batches of up to [`RECLAIM_BATCH`], one pool lock per batch
//! (per run of one pool's packets) and no per-packet reference counting.

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vfpoll_dma::{DmaContext, PageSize};
use vfpoll_pci::mmio::Mmio;

use super::desc::{tx_hi, TX_DD, TX_MAX_LEN};
use super::regs::{off, Tctl};
use super::Shared;
use crate::error::{NicError, Result};
use crate::mem::{wmb, RingMem, DESC_SIZE};
use crate::pool::{free_iter, Packet};
use crate::port::TxQueue;
use crate::stats::TxQueueStats;

/// Most completions reclaimed per pool lock.
pub const RECLAIM_BATCH: usize = 32;

/// The 82574's transmit queue 0. See the module docs.
pub struct E1000eTx {
    ring: RingMem,
    /// The packet behind each descriptor in flight.
    slots: Box<[Option<Packet>]>,
    /// The next slot to fill.
    tail: usize,
    /// The oldest slot in flight.
    clean: usize,
    in_flight: usize,
    entries: usize,
    /// The last slot of each burst in flight (the one with RS), oldest first: a ring of
    /// `entries` with `rs_head` and `rs_len`.
    rs: Box<[u32]>,
    rs_head: usize,
    rs_len: usize,
    stats: TxQueueStats,
    tdt: Mmio,
    shared: Arc<Shared>,
    _not_sync: PhantomData<Cell<()>>,
}

impl std::fmt::Debug for E1000eTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("E1000eTx")
            .field("port", &self.shared.name)
            .field("entries", &self.entries)
            .field("in_flight", &self.in_flight)
            .finish_non_exhaustive()
    }
}

impl E1000eTx {
    /// Allocates the ring and programs the ring registers (§4.6.6); TCTL is written by the
    /// caller.
    pub(super) fn new(
        shared: &Arc<Shared>,
        dma: &DmaContext,
        entries: usize,
        page_size: PageSize,
    ) -> Result<Self> {
        let bytes = entries * DESC_SIZE;
        let ring = RingMem::new(dma.alloc_region(bytes, page_size)?);
        if ring.contiguous_len(0) < bytes {
            return Err(NicError::InvalidOption(format!(
                "a transmit ring of {entries} descriptors needs {bytes} bus-contiguous bytes, more than one {page_size} page"
            )));
        }
        let bar = &shared.bar;
        let base = ring.bus(0).get();
        bar.write32(off::TDBAL, base as u32);
        bar.write32(off::TDBAH, (base >> 32) as u32);
        bar.write32(off::TDLEN, bytes as u32);
        bar.write32(off::TDH, 0);
        bar.write32(off::TDT, 0);
        Ok(E1000eTx {
            ring,
            slots: (0..entries).map(|_| None).collect(),
            tail: 0,
            clean: 0,
            in_flight: 0,
            entries,
            rs: vec![0; entries].into_boxed_slice(),
            rs_head: 0,
            rs_len: 0,
            stats: TxQueueStats::default(),
            tdt: bar.window(off::TDT, 4).expect("TDT inside BAR0"),
            shared: Arc::clone(shared),
            _not_sync: PhantomData,
        })
    }

    /// Descriptors in the ring.
    pub fn entries(&self) -> usize {
        self.entries
    }
}

impl TxQueue for E1000eTx {
    #[inline]
    fn tx_burst(&mut self, pkts: &mut Vec<Packet>) -> usize {
        self.stats.bursts += 1;
        if self.in_flight != 0 {
            self.reclaim();
        }
        let room = self.entries - 1 - self.in_flight;
        let n = pkts.len().min(room);
        if n < pkts.len() {
            self.stats.ring_full += 1;
        }
        if n == 0 {
            return 0;
        }
        // Fields in locals: the descriptor stores are volatile, after which the compiler would
        // otherwise load them again for every packet.
        let entries = self.entries;
        let mut placed = 0usize;
        let mut bytes = 0u64;
        let mut dropped = 0u64;
        let mut t = self.tail;
        let mut last = (t, 0u16);
        for pkt in pkts.drain(..n) {
            let len = pkt.len();
            if len == 0 || len > TX_MAX_LEN {
                dropped += 1;
                continue;
            }
            self.ring
                .write_desc(t, pkt.bus_addr().get(), tx_hi(len as u16, false));
            self.slots[t] = Some(pkt);
            bytes += len as u64;
            placed += 1;
            last = (t, len as u16);
            t = if t + 1 == entries { 0 } else { t + 1 };
        }
        self.stats.dropped_empty += dropped;
        if placed != 0 {
            // Status write-back for the burst's last descriptor only.
            self.ring.write_hi(last.0, tx_hi(last.1, true));
            let at = (self.rs_head + self.rs_len) % self.entries;
            self.rs[at] = last.0 as u32;
            self.rs_len += 1;
            self.tail = t;
            self.in_flight += placed;
            // Descriptors (and the packet data the caller wrote) before the tail write.
            wmb();
            self.tdt.write32(0, t as u32);
            self.stats.doorbells += 1;
            self.stats.packets += placed as u64;
            self.stats.bytes += bytes;
        }
        n
    }

    fn reclaim(&mut self) -> usize {
        let mut total = 0;
        while self.rs_len != 0 {
            let end = self.rs[self.rs_head] as usize;
            if self.ring.read_hi(end) & TX_DD == 0 {
                break;
            }
            // The whole burst up to `end` is done.
            let mut k = (end + self.entries - self.clean) % self.entries + 1;
            self.rs_head = if self.rs_head + 1 == self.entries {
                0
            } else {
                self.rs_head + 1
            };
            self.rs_len -= 1;
            self.in_flight -= k;
            total += k;
            while k != 0 {
                let b = k.min(RECLAIM_BATCH);
                let mut c = self.clean;
                let entries = self.entries;
                let slots = &mut self.slots;
                free_iter((0..b).map(|_| {
                    let p = slots[c]
                        .take()
                        .expect("a packet behind every descriptor in flight");
                    c = if c + 1 == entries { 0 } else { c + 1 };
                    p
                }));
                self.clean = c;
                self.stats.reclaim_batches += 1;
                k -= b;
            }
        }
        self.stats.reclaimed += total as u64;
        total
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }

    fn capacity(&self) -> usize {
        self.entries - 1
    }

    fn flush(&mut self, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            self.reclaim();
            if self.in_flight == 0 {
                return Ok(());
            }
            if start.elapsed() > timeout {
                return Err(NicError::TxTimeout {
                    port: self.shared.name.clone(),
                    pending: self.in_flight,
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

impl Drop for E1000eTx {
    fn drop(&mut self) {
        let drained = self.flush(Duration::from_millis(200));
        let _g = self.shared.ctl();
        let bar = &self.shared.bar;
        let tctl = bar.read32(off::TCTL);
        if tctl == u32::MAX || drained.is_err() {
            // The device may still write descriptors back: keep the ring. The packets it may
            // still read can go back to their pools (a stale read harms no memory).
            log::warn!(
                "{}: {} transmissions still pending at close; leaking the transmit ring",
                self.shared.name,
                self.in_flight
            );
            self.ring.leak();
        }
        if tctl != u32::MAX {
            bar.write32(off::TCTL, tctl & !Tctl::EN.bits());
            bar.write32(off::TDLEN, 0);
        }
    }
}
