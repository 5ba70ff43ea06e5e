//! Block sources and sinks: where a load reads from and a save writes to.
//!
//! [`BlockSource`] is a submit / poll interface over slots, shaped like the NVMe queue pair
//! under it: `submit_read(offset, len, slot)` starts a transfer into a slot, `poll` reports the
//! slots whose transfers finished. Implementations: [`NvmeSource`] (a namespace through a
//! vfpoll queue pair, on a real controller or the in-process model), [`crate::FileSource`]
//! (`pread`/`pwrite` into hugepage slots), [`PatternSource`] (data already resident in the
//! slots: isolates the hugepage ↔ GPU stage), and [`crate::fake::MemSource`] for tests.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use vfpoll_nvme::{Controller, NvmeError, QpairOptions, QueuePair, Rejected};

use crate::error::SourceError;
use crate::slots::{SlotBuf, Slots};

/// A finished transfer: the slot, and how it went.
pub type Completion = (usize, Result<(), SourceError>);

/// Where a load reads from and a save writes to. Driven by one thread: submit, then poll.
///
/// A slot given to `submit_read` or `submit_write` belongs to the source until `poll` reports
/// it (with success or an error); the source must not touch it after that. A source whose
/// device takes the slot itself ([`Slots::io_buf`]) gives it back ([`Slots::give_back`])
/// before reporting it.
pub trait BlockSource {
    /// What it is, for reports ("NVMe 0000:00:03.0 namespace 1").
    fn describe(&self) -> String;
    /// Offsets and lengths must be multiples of this (the LBA size; 1 for files).
    fn block_size(&self) -> usize;
    /// Bytes that can be read.
    fn capacity(&self) -> u64;
    /// Starts reading `len` bytes at byte `offset` into the start of `slot`.
    fn submit_read(
        &mut self,
        slots: &mut Slots,
        offset: u64,
        len: usize,
        slot: usize,
    ) -> Result<(), SourceError>;
    /// Starts writing the first `len` bytes of `slot` to byte `offset`.
    fn submit_write(
        &mut self,
        slots: &mut Slots,
        offset: u64,
        len: usize,
        slot: usize,
    ) -> Result<(), SourceError>;
    /// Appends the transfers that finished to `done`.
    fn poll(&mut self, slots: &mut Slots, done: &mut Vec<Completion>);
    /// Transfers submitted and not yet reported by `poll`.
    fn outstanding(&self) -> usize;
    /// Tells the source that something other than it wrote into `slot` (a copy from the GPU).
    fn slot_overwritten(&mut self, _slot: usize) {}
    /// Makes what was written durable (NVMe Flush, `fdatasync`); called after the last write.
    fn flush(&mut self) -> Result<(), SourceError> {
        Ok(())
    }
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Read,
    Write,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
        }
    }
}

#[derive(Debug)]
struct Pending {
    op: Op,
    slot: usize,
    lba: u64,
    buf: SlotBuf,
}

/// A namespace read and written through a vfpoll NVMe queue pair, straight into the slots
/// (the controller writes them by DMA; no CPU copy).
///
/// One request per slot (the queue pair splits it at MDTS into commands); a request that finds
/// the queue full waits in a small queue here and is submitted as completions free entries.
pub struct NvmeSource {
    qp: QueuePair<SlotBuf>,
    nsid: u32,
    lba_size: usize,
    blocks: u64,
    name: String,
    /// Per slot: the operation, byte offset and length in flight (for error reports).
    inflight: Vec<Option<(Op, u64, usize)>>,
    pending: VecDeque<Pending>,
    timeout: Duration,
}

impl std::fmt::Debug for NvmeSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmeSource")
            .field("name", &self.name)
            .field("qp", &self.qp)
            .field("pending", &self.pending.len())
            .finish()
    }
}

impl NvmeSource {
    /// A source over namespace `nsid` of `ctrl`, with a new queue pair made with `opts`, for
    /// transfers through `slots` (which must come from `ctrl.dma()`). `name` names the
    /// controller in reports.
    pub fn new(
        ctrl: &Controller,
        nsid: u32,
        slots: &Slots,
        opts: &QpairOptions,
        name: &str,
    ) -> Result<Self, SourceError> {
        let nvme = |source| SourceError::Nvme {
            op: "set-up",
            offset: 0,
            len: 0,
            source,
        };
        let ns = ctrl.namespace(nsid).map_err(nvme)?.clone();
        if !slots.slot_size().is_multiple_of(ns.lba_size) {
            return Err(SourceError::Invalid(format!(
                "the slot size {} is not a multiple of namespace {nsid}'s {}-byte blocks",
                slots.slot_size(),
                ns.lba_size
            )));
        }
        let qp = ctrl.create_qpair::<SlotBuf>(opts).map_err(nvme)?;
        let per_slot = slots.slot_size().div_ceil(qp.max_transfer());
        if per_slot > qp.free_slots() {
            return Err(SourceError::Invalid(format!(
                "a {}-byte slot needs {per_slot} commands of at most {} bytes, more than the {} entries of the queue: use smaller slots or a deeper queue",
                slots.slot_size(),
                qp.max_transfer(),
                qp.free_slots()
            )));
        }
        Ok(NvmeSource {
            qp,
            nsid,
            lba_size: ns.lba_size,
            blocks: ns.blocks,
            name: format!("NVMe {name} namespace {nsid}"),
            inflight: (0..slots.count()).map(|_| None).collect(),
            pending: VecDeque::with_capacity(slots.count()),
            timeout: opts.timeout,
        })
    }

    /// The queue pair's counters.
    pub fn stats(&self) -> vfpoll_nvme::QpairStats {
        self.qp.stats()
    }

    fn submit(
        &mut self,
        op: Op,
        slots: &mut Slots,
        offset: u64,
        len: usize,
        slot: usize,
    ) -> Result<(), SourceError> {
        let err = |source| SourceError::Nvme {
            op: op.name(),
            offset,
            len,
            source,
        };
        if slot >= self.inflight.len() || self.inflight[slot].is_some() {
            return Err(SourceError::Invalid(format!("slot {slot} is not free")));
        }
        if !offset.is_multiple_of(self.lba_size as u64) {
            return Err(SourceError::Invalid(format!(
                "byte offset {offset} is not a multiple of the {}-byte blocks",
                self.lba_size
            )));
        }
        let buf = slots.io_buf(slot, len)?;
        let lba = offset / self.lba_size as u64;
        self.inflight[slot] = Some((op, offset, len));
        let p = Pending { op, slot, lba, buf };
        if !self.pending.is_empty() {
            self.pending.push_back(p);
            return Ok(());
        }
        match self.start(p) {
            Ok(None) => Ok(()),
            Ok(Some(p)) => {
                self.pending.push_back(p);
                Ok(())
            }
            Err((e, buf)) => {
                self.inflight[slot] = None;
                if let Err(back) = slots.give_back(buf) {
                    log::error!("slot {slot}: {back}");
                }
                Err(err(e))
            }
        }
    }

    /// Submits `p`; gives it back if the queue is full, and its buffer with the error if the
    /// queue pair refused it.
    fn start(&mut self, p: Pending) -> Result<Option<Pending>, (NvmeError, SlotBuf)> {
        let tag = p.slot as u64;
        let r = match p.op {
            Op::Read => self.qp.read(self.nsid, p.lba, p.buf, tag),
            Op::Write => self.qp.write(self.nsid, p.lba, p.buf, tag),
        };
        match r {
            Ok(()) => Ok(None),
            Err(Rejected {
                error: NvmeError::QueueFull { .. },
                buf,
            }) => Ok(Some(Pending { buf, ..p })),
            Err(Rejected { error, buf }) => Err((error, buf)),
        }
    }
}

impl BlockSource for NvmeSource {
    fn describe(&self) -> String {
        self.name.clone()
    }

    fn block_size(&self) -> usize {
        self.lba_size
    }

    fn capacity(&self) -> u64 {
        self.blocks * self.lba_size as u64
    }

    fn submit_read(
        &mut self,
        slots: &mut Slots,
        offset: u64,
        len: usize,
        slot: usize,
    ) -> Result<(), SourceError> {
        self.submit(Op::Read, slots, offset, len, slot)
    }

    fn submit_write(
        &mut self,
        slots: &mut Slots,
        offset: u64,
        len: usize,
        slot: usize,
    ) -> Result<(), SourceError> {
        self.submit(Op::Write, slots, offset, len, slot)
    }

    fn poll(&mut self, slots: &mut Slots, done: &mut Vec<Completion>) {
        let inflight = &mut self.inflight;
        self.qp.poll(usize::MAX, |d| {
            let slot = d.tag as usize;
            let Some((op, offset, len)) = inflight.get_mut(slot).and_then(Option::take) else {
                log::error!("NVMe completion for slot {slot}, which has nothing in flight");
                return;
            };
            let mut result = d.result.map(drop).map_err(|source| SourceError::Nvme {
                op: op.name(),
                offset,
                len,
                source,
            });
            // A buffer the queue pair kept (`None`) was leaked by it: the slot stays lent for
            // good (the CPU never touches it again), and the leaked `SlotBuf` keeps the region.
            if let Some(buf) = d.buf {
                if let Err(e) = slots.give_back(buf) {
                    result = result.and(Err(e.into()));
                }
            }
            done.push((slot, result));
        });
        while let Some(p) = self.pending.pop_front() {
            let slot = p.slot;
            match self.start(p) {
                Ok(None) => {}
                Ok(Some(p)) => {
                    self.pending.push_front(p);
                    break;
                }
                Err((source, buf)) => {
                    let (op, offset, len) = self.inflight[slot].take().expect("pending slots are in flight");
                    let back = slots.give_back(buf);
                    if let Err(e) = &back {
                        log::error!("slot {slot}: {e}");
                    }
                    done.push((
                        slot,
                        Err(SourceError::Nvme {
                            op: op.name(),
                            offset,
                            len,
                            source,
                        }),
                    ));
                }
            }
        }
    }

    fn outstanding(&self) -> usize {
        self.qp.outstanding() + self.pending.len()
    }

    fn flush(&mut self) -> Result<(), SourceError> {
        let err = |source| SourceError::Nvme {
            op: "flush",
            offset: 0,
            len: 0,
            source,
        };
        const FLUSH_TAG: u64 = u64::MAX;
        self.qp.flush(self.nsid, FLUSH_TAG).map_err(err)?;
        let start = Instant::now();
        let mut result = None;
        while result.is_none() {
            self.qp.poll(usize::MAX, |d| {
                if d.tag == FLUSH_TAG {
                    result = Some(d.result.map(drop));
                }
            });
            if start.elapsed() > self.timeout && result.is_none() {
                return Err(err(NvmeError::Timeout {
                    op: "Flush",
                    qid: self.qp.qid(),
                    cid: 0,
                    timeout: self.timeout,
                }));
            }
            std::hint::spin_loop();
        }
        result.expect("loop ends with a result").map_err(err)
    }
}

/// Data already in hugepage memory: reads complete at once and move nothing, so a load measures
/// the hugepage → GPU stage alone (and a save, with writes discarded, the GPU → hugepage stage).
///
/// Resident mode ([`PatternSource::resident`]): every slot holds the same [`crate::pattern`]
/// bytes, written once at set-up, so the data reads as that pattern repeated every slot size
/// (offsets must be multiples of the slot size). Generated mode ([`PatternSource::generated`]):
/// each read writes the pattern of its own offsets into the slot (a CPU write; for seeding and
/// tests, not for measuring).
#[derive(Debug)]
pub struct PatternSource {
    seed: u64,
    resident: bool,
    slot_size: usize,
    dirty: Vec<bool>,
    ready: VecDeque<Completion>,
}

impl PatternSource {
    /// Resident data: fills every slot now.
    pub fn resident(slots: &mut Slots, seed: u64) -> Result<Self, SourceError> {
        for s in 0..slots.count() {
            slots.fill_pattern(s, slots.slot_size(), 0, seed)?;
        }
        Ok(Self::new(slots, seed, true))
    }

    /// Generated data: each read writes the pattern of its offsets.
    pub fn generated(slots: &Slots, seed: u64) -> Self {
        Self::new(slots, seed, false)
    }

    fn new(slots: &Slots, seed: u64, resident: bool) -> Self {
        PatternSource {
            seed,
            resident,
            slot_size: slots.slot_size(),
            dirty: vec![false; slots.count()],
            ready: VecDeque::with_capacity(slots.count()),
        }
    }
}

impl BlockSource for PatternSource {
    fn describe(&self) -> String {
        if self.resident {
            "hugepage-resident data (no source reads)".into()
        } else {
            "generated pattern".into()
        }
    }

    fn block_size(&self) -> usize {
        1
    }

    fn capacity(&self) -> u64 {
        u64::MAX
    }

    fn submit_read(
        &mut self,
        slots: &mut Slots,
        offset: u64,
        len: usize,
        slot: usize,
    ) -> Result<(), SourceError> {
        if slot >= self.dirty.len() || len > self.slot_size {
            return Err(SourceError::Invalid(format!("slot {slot}, {len} bytes")));
        }
        if !self.resident {
            slots.fill_pattern(slot, len, offset, self.seed)?;
        } else {
            if !offset.is_multiple_of(self.slot_size as u64) {
                return Err(SourceError::Invalid(format!(
                    "resident data is read in whole slots: offset {offset} is not a multiple of {}",
                    self.slot_size
                )));
            }
            if self.dirty[slot] {
                slots.fill_pattern(slot, self.slot_size, 0, self.seed)?;
                self.dirty[slot] = false;
            }
        }
        self.ready.push_back((slot, Ok(())));
        Ok(())
    }

    fn submit_write(
        &mut self,
        _slots: &mut Slots,
        _offset: u64,
        _len: usize,
        slot: usize,
    ) -> Result<(), SourceError> {
        if slot >= self.dirty.len() {
            return Err(SourceError::Invalid(format!("slot {slot}")));
        }
        self.dirty[slot] = true;
        self.ready.push_back((slot, Ok(())));
        Ok(())
    }

    fn poll(&mut self, _slots: &mut Slots, done: &mut Vec<Completion>) {
        done.extend(self.ready.drain(..));
    }

    fn outstanding(&self) -> usize {
        self.ready.len()
    }

    fn slot_overwritten(&mut self, slot: usize) {
        if let Some(d) = self.dirty.get_mut(slot) {
            *d = true;
        }
    }
}
