//! I/O queue pairs: submit, poll, complete (NVMe Base 2.0 §3.3, NVM Command Set 1.0 §3).
//!
//! One queue pair belongs to one thread: it is `Send` but not `Sync`, and every operation takes
//! `&mut self`, so the hot path needs no lock and no atomic. Submitting writes the command into
//! the submission queue but does not ring the doorbell; [`QueuePair::poll`] (or
//! [`QueuePair::flush`]) rings it once for the whole batch, then consumes completions and rings
//! the completion doorbell once.
//!
//! Completions are delivered to a closure given to `poll`, with the caller's 64-bit tag and the
//! buffer given back. A tag (rather than a boxed callback per request) costs no allocation,
//! maps directly onto C (`void *` context / index) and onto async runtimes (a slot index), and
//! lets one closure capture the caller's state for the whole batch.

//!
//! The module's files follow its seams: `slot` (command ids, requests and their buffers),
//! `xfer` (sizing and building every data and metadata pointer), `submit` (the submission
//! paths), `complete` (polling completions), `health` (timeouts, a failed controller, drain);
//! creation and teardown are here.

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::buffer::IoBuffer;
use crate::cmd::{Command, CommandExt as _};
use crate::cmd::{CQE_SIZE, SQE_SIZE};
use crate::ctrlr::{Controller, Shared, PAGE_SIZE};
use crate::error::{NvmeError, Result};
use crate::format::{Access, PiMode, Refusal};
use crate::prp::{self, PrpListMem};
use crate::qmem::Layout;
use crate::qmem::QueueMem;
use crate::queue::Ring;

mod complete;
mod health;
mod recover;
mod slot;
mod submit;
mod wait;
mod xfer;
mod zone;

use slot::Slot;
pub use slot::MAX_QUEUE_ENTRIES;
pub use wait::CompletionMode;
use wait::QpIrq;
use xfer::NsInfo;

/// Options of an I/O queue pair.
#[derive(Debug, Clone)]
pub struct QpairOptions {
    /// Queue entries (2..=CAP.MQES); at most `entries - 1` commands are in flight.
    pub entries: u16,
    /// Describe data with an SGL Data Block descriptor where the controller supports SGLs and
    /// the buffer is bus-contiguous (one descriptor instead of a PRP list); PRPs otherwise.
    pub sgl: bool,
    /// Put the submission queue in the controller memory buffer (CMBSZ.SQS): the controller
    /// reads commands from its own memory instead of fetching them by DMA. Needs a controller
    /// opened through VFIO with a CMB.
    pub sq_in_cmb: bool,
    /// How long a command may take before the queue pair asks the controller to abort it.
    pub timeout: Duration,
    /// Largest transfer per command in bytes (rounded down to a power of two); larger requests are
    /// split. `None`: MDTS, or 2 MiB where the controller sets no limit.
    pub max_transfer: Option<usize>,
    /// Split requests larger than the maximum transfer into several commands (one completion
    /// for the whole request). When off, such a request is refused with [`NvmeError::TooLarge`].
    pub split: bool,
    /// How commands to namespaces formatted with protection information use it.
    pub protection: PiMode,
    /// Polling, or interrupts that [`QueuePair::wait`] sleeps on (one vector per queue pair).
    pub completion: CompletionMode,
    /// After a controller reset, submit the commands it interrupted once more (reads, writes,
    /// flushes and the other commands that may run twice; see [`Controller::reset`]) instead of
    /// completing them with [`NvmeError::Reset`]. Costs a copy of each command (64 bytes) at
    /// submission; a command interrupted by a second reset completes with the error.
    pub resubmit_on_reset: bool,
    /// Defer the completion-queue head doorbell: consumed entries are released in batches, the
    /// doorbell rung only once released entries plus commands in flight could fill half the
    /// queue (one MMIO write, or shadow-doorbell update, per many completions). Off: rung at
    /// the end of every poll that consumed entries (once per poll batch, as SPDK does). On by
    /// default; the switch is for measuring what the deferral buys on a given device.
    pub defer_cq_doorbell: bool,
}

impl Default for QpairOptions {
    fn default() -> Self {
        QpairOptions {
            entries: 256,
            sgl: false,
            sq_in_cmb: false,
            timeout: Duration::from_secs(30),
            max_transfer: None,
            split: true,
            protection: PiMode::Controller,
            completion: CompletionMode::Poll,
            resubmit_on_reset: false,
            defer_cq_doorbell: true,
        }
    }
}

/// A completed request.
#[derive(Debug)]
pub struct Done<B> {
    /// The tag given at submit.
    pub tag: u64,
    /// The command specific result on success: DW0, and DW1 in the upper half (a Zone Append
    /// gives the LBA it wrote there); the error otherwise (of the first failing part of a
    /// split request).
    pub result: Result<u64>,
    /// The buffer given at submit, back to the caller. `None` for commands without data, and
    /// for a buffer the device may still write into after an unrecoverable failure (it is
    /// leaked, never freed).
    pub buf: Option<B>,
    /// The separate metadata buffer given at submit, back likewise (`None` without one).
    pub meta: Option<B>,
}

/// A submission that was refused; the buffer comes back.
#[derive(Debug)]
pub struct Rejected<B> {
    /// Why.
    pub error: NvmeError,
    /// The buffer, untouched.
    pub buf: B,
}

/// Counters of one queue pair.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QpairStats {
    /// Requests accepted.
    pub requests: u64,
    /// Commands written to the submission queue (split requests count once per part).
    pub commands: u64,
    /// Completions consumed.
    pub completions: u64,
    /// Requests completed with an error.
    pub errors: u64,
    /// SQ tail MMIO doorbell writes.
    pub sq_doorbells: u64,
    /// CQ head MMIO doorbell writes.
    pub cq_doorbells: u64,
    /// Doorbell updates that went only to the shadow doorbell (no MMIO write needed).
    pub shadow_only: u64,
    /// Completions whose command id matched no command in flight.
    pub bogus_completions: u64,
    /// Commands the queue pair asked the controller to abort after a timeout.
    pub aborts: u64,
    /// Controller resets this queue pair went through (its queues re-created).
    pub resets: u64,
    /// Requests completed with [`NvmeError::Reset`] because a reset interrupted them.
    pub reset_errors: u64,
    /// Requests submitted again after a reset ([`QpairOptions::resubmit_on_reset`]).
    pub resubmitted: u64,
}

/// An I/O submission + completion queue pair with its request trackers. See the module docs.
pub struct QueuePair<B: IoBuffer> {
    ring: Ring,
    /// The submission fast path's namespace (`submit.rs`).
    hot: submit::HotNs,
    mem: QueueMem,
    slots: Box<[Slot<B>]>,
    free_cids: Vec<u16>,
    /// Requests in flight.
    live: usize,
    /// Commands beyond one per request (the parts of split requests after their first):
    /// `QpairStats::commands` is `requests` plus this.
    extra_commands: u64,
    /// `poll` rings the completion doorbell once released-but-unannounced completion entries
    /// plus taken slots reach half the queue (`R`): `unacked + (slots - free) >= R`, kept as
    /// `unacked + cq_release_bias >= free` with `cq_release_bias = slots - R` (one compare).
    cq_release_bias: usize,
    /// When the queue pair was created: the origin of `Request::seen_ms`.
    created: Instant,
    lists_off: usize,
    list_pages: usize,
    max_xfer: usize,
    split: bool,
    use_sgl: bool,
    protection: PiMode,
    namespaces: Vec<NsInfo>,
    /// The format of each of `namespaces`, for messages.
    formats: Vec<crate::format::NsFormat>,
    /// The generation of the controller's namespace table `namespaces` was made from.
    ns_gen: u64,
    stats: QpairStats,
    timeout: Duration,
    /// When to look for timed-out commands and a failed controller (`health.rs`).
    health: health::HealthClock,
    failed: Option<String>,
    /// The controller's reset epoch the queues were created in (`recover.rs`): a doorbell is
    /// rung only while the controller's is the same.
    epoch: u64,
    /// Whether the queues exist in the controller, or are being re-created after a reset.
    queues: recover::Queues,
    /// Each slot's command as written, for submitting it again after a reset (empty unless
    /// `QpairOptions::resubmit_on_reset`).
    saved: Box<[[u64; 8]]>,
    /// Aborts submitted and not yet collected: (admin command id, I/O command id).
    aborts: Vec<(u16, u16)>,
    /// The shadow doorbells while a reset has the queues (`recover.rs`).
    parked_shadow: Option<crate::qmem::ShadowSlot>,
    /// The submission queue's slots in the CMB, when there.
    sq_cmb: Option<crate::cmb::CmbSlice>,
    /// The interrupt vector in interrupt mode (`wait.rs`); never touched by `poll`.
    irq: Option<QpIrq>,
    ctrl: Arc<Shared>,
    _not_sync: PhantomData<Cell<()>>,
}

impl<B: IoBuffer> std::fmt::Debug for QueuePair<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuePair")
            .field("qid", &self.ring.qid)
            .field("entries", &self.ring.entries)
            .field("outstanding", &self.outstanding())
            .field("max_transfer", &self.max_xfer)
            .finish()
    }
}

/// The list pages of one tracker.
pub(super) struct TrackerLists<'a> {
    mem: &'a mut QueueMem,
    off: usize,
    pages: usize,
}

impl PrpListMem for TrackerLists<'_> {
    fn pages(&self) -> usize {
        self.pages
    }
    fn page_bus(&self, page: usize) -> vfpoll_pci::BusAddr {
        self.mem.bus(self.off + page * PAGE_SIZE)
    }
    fn write(&mut self, page: usize, idx: usize, entry: vfpoll_pci::BusAddr) {
        self.mem
            .write_u64(self.off + page * PAGE_SIZE + idx * 8, entry.get());
    }
}

impl Controller {
    /// Creates an I/O queue pair (Create I/O CQ, then Create I/O SQ), for buffers of type `B`.
    pub fn create_qpair<B: IoBuffer>(&self, opts: &QpairOptions) -> Result<QueuePair<B>> {
        QueuePair::create(self, opts)
    }
}

impl<B: IoBuffer> QueuePair<B> {
    fn create(ctrl: &Controller, opts: &QpairOptions) -> Result<Self> {
        let sh = &ctrl.shared;
        let mqes = sh.cap.max_queue_entries().min(65536);
        let most = mqes.min(MAX_QUEUE_ENTRIES as u32);
        if opts.entries < 2 || opts.entries as u32 > most {
            return Err(NvmeError::InvalidOption(format!(
                "queue entries {} not in 2..={most} (CAP.MQES {mqes}; vfpoll's limit {MAX_QUEUE_ENTRIES})",
                opts.entries
            )));
        }
        let mdts = sh.identify.mdts_bytes(sh.cap.mps_min()).unwrap_or(2 << 20);
        let mut max_xfer = opts.max_transfer.unwrap_or(mdts).min(mdts);
        // NLB is 16 bits: at most 65536 blocks of the smallest LBA size in use.
        let min_lba = sh.namespaces().iter().map(|n| n.lba_size).min().unwrap_or(512);
        max_xfer = max_xfer.min(65536 * min_lba);
        if max_xfer < PAGE_SIZE {
            return Err(NvmeError::InvalidOption(format!(
                "max transfer {max_xfer} below {PAGE_SIZE} bytes"
            )));
        }
        max_xfer = 1 << max_xfer.ilog2();
        // List pages per tracker: enough for a max_xfer PRP list at the worst offset.
        let mut list_pages = 1;
        while prp::max_transfer(list_pages, PAGE_SIZE) < max_xfer {
            list_pages += 1;
        }
        let entries = opts.entries as usize;
        let sq_bytes = (entries * SQE_SIZE).next_multiple_of(PAGE_SIZE);
        let cq_bytes = (entries * CQE_SIZE).next_multiple_of(PAGE_SIZE);
        let lists_off = sq_bytes + cq_bytes;
        let total = lists_off + (entries - 1) * list_pages * PAGE_SIZE;
        let region = sh.dma.alloc_region(total, sh.opts.page_size)?;
        let mut mem = QueueMem::new(
            region,
            Layout {
                sq_off: 0,
                cq_off: sq_bytes,
                entries: opts.entries,
            },
        );
        // Each queue must be physically contiguous (CAP.CQR): both fit in the region's first page
        // or are covered by its contiguity.
        if mem.region().contiguous_len(0) < lists_off {
            return Err(NvmeError::InvalidOption(format!(
                "{entries} entries need {lists_off} contiguous bytes for the queues, more than one {} page",
                sh.opts.page_size
            )));
        }
        let sq_cmb = if opts.sq_in_cmb {
            let cmb = ctrl.cmb()?;
            if !cmb.capabilities().sqs() {
                return Err(NvmeError::Unsupported(
                    "the CMB cannot hold submission queues (CMBSZ.SQS = 0)".into(),
                ));
            }
            Some(cmb.alloc(entries * SQE_SIZE, PAGE_SIZE)?)
        } else {
            None
        };
        let irq = match opts.completion {
            CompletionMode::Poll => None,
            mode => Some(QpIrq::new(ctrl, mode)?),
        };
        let qid = sh.alloc_qid()?;
        // Shadow doorbells of a new queue start at 0, before the controller learns of it.
        let shadow = sh
            .shadow
            .as_ref()
            .map(|p| p.slot(qid, sh.cap.doorbell_stride(), PAGE_SIZE));
        let sq_bus = sq_cmb.as_ref().map_or(mem.bus(0), |s| s.bus_addr());
        let cq_bus = mem.bus(sq_bytes);
        let create_cq = match &irq {
            Some(i) => {
                ctrl.unmask_vector(i.vector());
                Command::create_io_cq_irq(qid, entries as u32, cq_bus, i.vector())
            }
            None => Command::create_io_cq(qid, entries as u32, cq_bus),
        };
        let create_sq = Command::create_io_sq(qid, entries as u32, sq_bus, qid);
        // Under one hold of the admin queue, with the epoch read there: a reset cannot come
        // between the creation and the epoch the queue pair records for it.
        let created = sh.with_admin(|q, epoch| {
            let none = crate::admin::DataDir::None;
            let check = &mut || crate::ctrlr::check_csts(&sh.bar);
            q.exec("Create I/O Completion Queue", create_cq, none, &[], check)?;
            if let Err(e) = q.exec("Create I/O Submission Queue", create_sq, none, &[], check) {
                let _ = q.exec(
                    "Delete I/O Completion Queue",
                    Command::delete_io_cq(qid),
                    none,
                    &[],
                    check,
                );
                return Err(e);
            }
            Ok(epoch)
        });
        let created_epoch = match created {
            Ok(epoch) => epoch,
            Err(e) => {
                sh.free_qid(qid);
                return Err(e);
            }
        };
        let mut ring = Ring::new(&sh.bar, sh.cap.doorbell_stride(), qid, opts.entries);
        if let Some(slot) = shadow {
            ring.set_shadow(slot);
        }
        if let Some(s) = &sq_cmb {
            mem.put_sq_in_cmb(s.mmio());
        }
        let n = entries - 1;
        let epoch = created_epoch;
        log::debug!("I/O queue pair {qid}: {entries} entries, max transfer {max_xfer}, {list_pages} list page(s) per command");
        let mut qp = QueuePair {
            ring,
            hot: submit::HotNs::NONE,
            mem,
            slots: (0..n).map(|_| Slot::new()).collect(),
            free_cids: (0..n as u16).rev().collect(),
            live: 0,
            extra_commands: 0,
            // n >= entries / 2 >= 1 for entries >= 2: no underflow.
            cq_release_bias: n - if opts.defer_cq_doorbell { entries / 2 } else { 1 },
            created: Instant::now(),
            lists_off,
            list_pages,
            max_xfer,
            split: opts.split,
            use_sgl: opts.sgl && sh.identify.sgl_supported(),
            protection: opts.protection,
            namespaces: Vec::new(),
            formats: Vec::new(),
            ns_gen: u64::MAX,
            stats: QpairStats::default(),
            timeout: opts.timeout,
            health: health::HealthClock::new(),
            failed: None,
            epoch,
            queues: recover::Queues::Live,
            saved: if opts.resubmit_on_reset {
                vec![[0u64; 8]; n].into_boxed_slice()
            } else {
                Box::default()
            },
            aborts: Vec::new(),
            parked_shadow: None,
            sq_cmb,
            irq,
            ctrl: Arc::clone(sh),
            _not_sync: PhantomData,
        };
        qp.refresh_view();
        Ok(qp)
    }

    /// Brings this queue pair's view of the namespaces up to date with the controller's
    /// table (after a format or a namespace notice): one relaxed load when nothing changed.
    #[inline]
    fn sync_view(&mut self) {
        if self.ctrl.ns_gen.load(Ordering::Acquire) != self.ns_gen {
            self.refresh_view();
        }
    }

    #[cold]
    #[inline(never)]
    fn refresh_view(&mut self) {
        let gen = self.ctrl.ns_gen.load(Ordering::Acquire);
        let table = self.ctrl.namespaces();
        self.namespaces = Self::ns_infos(&table, self.protection, self.max_xfer);
        if self.ctrl.identify.vid == crate::identify::QEMU_VID {
            // QEMU's metadata transfers (xfer::MetadataQuirk).
            for n in &mut self.namespaces {
                n.md_quirk = if n.meta_bytes != 0 {
                    n.meta_bytes
                } else {
                    n.block_bytes - n.data_size
                };
            }
        }
        self.formats = table
            .iter()
            .map(|n| n.format.unwrap_or(crate::format::NsFormat::plain(n.lba_size)))
            .collect();
        self.ns_gen = gen;
        // Made again from the new view by the next submission that takes the checked path.
        self.hot = submit::HotNs::NONE;
    }

    /// This queue pair's view of every namespace under `protection`.
    fn ns_infos(table: &[crate::ctrlr::Namespace], protection: PiMode, max_xfer: usize) -> Vec<NsInfo> {
        table
            .iter()
            .map(|n| {
                let access = match (n.command_set, n.format) {
                    (crate::zns::CSI_ZONED, _) if n.zoned.is_none() => {
                        Err(Refusal::CommandSet(n.command_set))
                    }
                    (crate::zns::CSI_NVM | crate::zns::CSI_ZONED, Ok(f)) => Access::new(&f, protection)
                        .and_then(|a| {
                            if a.block_bytes > max_xfer {
                                Err(Refusal::BlockTooLarge {
                                    block: a.block_bytes,
                                    max: max_xfer,
                                })
                            } else {
                                Ok(a)
                            }
                        }),
                    (crate::zns::CSI_NVM | crate::zns::CSI_ZONED, Err(e)) => Err(Refusal::BadFormat(e)),
                    (csi, _) => Err(Refusal::CommandSet(csi)),
                };
                let format = n.format.unwrap_or(crate::format::NsFormat::plain(n.lba_size));
                let mut info = NsInfo::new(n.nsid, n.blocks, format, access, max_xfer);
                if let Some(z) = n.zoned {
                    info.zone_size = z.identify.zone_size;
                    info.append_max = z.zasl_bytes.unwrap_or(max_xfer).min(max_xfer);
                }
                info
            })
            .collect()
    }

    /// Gives slot `slot` to request `rid` and returns the command id for it.
    #[inline]
    fn claim(&mut self, slot: u16, rid: u16) -> u16 {
        self.slots[slot as usize].claim(slot, rid)
    }

    /// The PRP list pages of slot `slot`.
    #[inline]
    fn lists(&mut self, slot: u16) -> TrackerLists<'_> {
        TrackerLists {
            off: self.lists_off + slot as usize * self.list_pages * PAGE_SIZE,
            mem: &mut self.mem,
            pages: self.list_pages,
        }
    }

    /// The queue id.
    pub fn qid(&self) -> u16 {
        self.ring.qid
    }

    /// Requests in flight.
    pub fn outstanding(&self) -> usize {
        self.live
    }

    /// Commands that can still be submitted now.
    pub fn free_slots(&self) -> usize {
        self.free_cids.len()
    }

    /// How this queue pair uses protection information.
    pub fn protection(&self) -> PiMode {
        self.protection
    }

    /// The largest transfer of one command (larger requests are split).
    pub fn max_transfer(&self) -> usize {
        self.max_xfer
    }

    /// Counters.
    pub fn stats(&self) -> QpairStats {
        QpairStats {
            commands: self.stats.requests + self.extra_commands,
            completions: self.ring.consumed(),
            // The SQ doorbell's counts are the ring's (`Ring::ring_sq`), the CQ's this pair's.
            sq_doorbells: self.ring.sq_rung.mmio,
            shadow_only: self.stats.shadow_only + self.ring.sq_rung.shadow_only,
            ..self.stats
        }
    }

    #[inline]
    fn ns(&self, nsid: u32) -> Result<NsInfo> {
        match self.namespaces.iter().find(|n| n.nsid == nsid) {
            Some(n) => Ok(*n),
            None => Err(NvmeError::NoSuchNamespace {
                nsid,
                active: self.namespaces.iter().map(|n| n.nsid).collect(),
            }),
        }
    }

    #[inline]
    fn check_range(&self, ns: &NsInfo, slba: u64, blocks: u64) -> Result<()> {
        match slba.checked_add(blocks) {
            Some(end) if end <= ns.blocks && blocks > 0 => Ok(()),
            _ => Err(NvmeError::LbaOutOfRange {
                nsid: ns.nsid,
                slba,
                end: slba.saturating_add(blocks),
                blocks: ns.blocks,
                lba_size: ns.data_size,
            }),
        }
    }

    fn check_usable(&self) -> Result<()> {
        match &self.failed {
            // NvmeError::Removed once the device was removed (removal.rs).
            Some(why) => Err(self.ctrl.failed_error(why)),
            None => Ok(()),
        }
    }
}

impl<B: IoBuffer> Drop for QueuePair<B> {
    fn drop(&mut self) {
        let qid = self.ring.qid;
        if self.outstanding() != 0 && self.failed.is_none() {
            let _ = self.drain(Duration::from_millis(500).min(self.timeout), |_| {});
        }
        let epoch = self.ctrl.reset.epoch.load(Ordering::Acquire);
        // Which of the queues the controller has: none after a reset the queue pair did not
        // re-create them from, or once it failed.
        let (cq, sq) = match self.queues {
            _ if self.failed.is_some() => (false, false),
            recover::Queues::Live => (epoch == self.epoch, epoch == self.epoch),
            recover::Queues::CreatingCq { epoch: e, .. } => (e == epoch, false),
            recover::Queues::CreatingSq { epoch: e, .. } => (e == epoch, e == epoch),
            recover::Queues::Down => (false, false),
        };
        // Deleting the SQ aborts whatever is left (§5.6); after both deletions succeed the
        // controller no longer touches this queue's memory or its buffers.
        let none = crate::admin::DataDir::None;
        let deleted = (!sq
            || self
                .ctrl
                .admin_exec(
                    "Delete I/O Submission Queue",
                    Command::delete_io_sq(qid),
                    none,
                    &[],
                )
                .is_ok())
            && (!cq
                || self
                    .ctrl
                    .admin_exec(
                        "Delete I/O Completion Queue",
                        Command::delete_io_cq(qid),
                        none,
                        &[],
                    )
                    .is_ok());
        // A controller declared failed without being stopped may still write anywhere.
        let stopped = self.ctrl.reset.failure().is_none_or(|f| f.dma_stopped);
        if deleted && stopped {
            self.ctrl.free_qid(qid);
        } else {
            log::error!(
                "queue pair {qid} could not be deleted; leaking its memory and {} buffers",
                self.outstanding()
            );
            for s in self.slots.iter_mut() {
                std::mem::forget(s.buf.take());
                std::mem::forget(s.meta.take());
            }
            self.mem.leak();
            std::mem::forget(self.sq_cmb.take());
            // The CQ may still interrupt on its vector: never hand the vector to another queue.
            std::mem::forget(self.irq.take());
        }
    }
}
