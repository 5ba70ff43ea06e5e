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

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::buffer::IoBuffer;
use crate::cmd::{io_op, rw_words, Command, DataPtr, SglDescriptor};
use crate::ctrlr::{Controller, Shared, PAGE_SIZE};
use crate::error::{NvmeError, Result};
use crate::prp::{self, PrpListMem};
use crate::qmem::QueueMem;
use crate::queue::{Layout, Ring, CQE_SIZE, SQE_SIZE};
use crate::status::Status;

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
        }
    }
}

/// A completed request.
#[derive(Debug)]
pub struct Done<B> {
    /// The tag given at submit.
    pub tag: u64,
    /// Command specific DW0 on success, the error otherwise (of the first failing part of a
    /// split request).
    pub result: Result<u32>,
    /// The buffer given at submit, back to the caller. `None` for commands without data, and
    /// for a buffer the device may still write into after an unrecoverable failure (it is
    /// leaked, never freed).
    pub buf: Option<B>,
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
}

/// A command slot: the command in flight in it, and the request that lives in it. The command
/// id on the wire is `slot | gen << 12`: the 4-bit generation, bumped each time the slot is
/// reused, lets a stale or duplicated completion be told apart from one for the slot's current
/// command (Linux's nvme driver does the same).
///
/// A request lives in its first command's slot; that slot goes back to the free list when the
/// whole request completes, the slots of a split request's other parts as each part completes.
/// Everything the hot path touches for one I/O is in one slot (one cache line for a `DmaBuf`).
#[derive(Debug)]
struct Slot<B> {
    /// The request the command in flight in this slot belongs to (`UNUSED`: none).
    owner: u16,
    gen: u8,
    /// The request living here (`parts == 0`: none).
    req: Request,
    /// Its buffer.
    buf: Option<B>,
}

const SLOT_BITS: u32 = 12;
const SLOT_MASK: u16 = (1 << SLOT_BITS) - 1;

/// The most entries a queue pair may have: slot numbers fit in 12 bits of the command id.
pub const MAX_QUEUE_ENTRIES: u16 = 1 << SLOT_BITS;

/// What a request does, for its error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Read,
    Write,
    WriteFua,
    Compare,
    Flush,
    WriteZeroes,
    DatasetManagement,
    Raw,
}

impl Op {
    /// The opcode of a data transfer, and whether it sets FUA.
    #[inline]
    const fn io_opcode(self) -> (u8, bool) {
        match self {
            Op::Read => (io_op::READ, false),
            Op::Write => (io_op::WRITE, false),
            Op::WriteFua => (io_op::WRITE, true),
            Op::Compare => (io_op::COMPARE, false),
            Op::Flush => (io_op::FLUSH, false),
            Op::WriteZeroes => (io_op::WRITE_ZEROES, false),
            Op::DatasetManagement => (io_op::DATASET_MANAGEMENT, false),
            // Never used for one: raw commands carry their own opcode.
            Op::Raw => (0xff, false),
        }
    }

    const fn name(self) -> &'static str {
        match self {
            Op::Read => "Read",
            Op::Write => "Write",
            Op::WriteFua => "Write (FUA)",
            Op::Compare => "Compare",
            Op::Flush => "Flush",
            Op::WriteZeroes => "Write Zeroes",
            Op::DatasetManagement => "Dataset Management",
            Op::Raw => "raw I/O command",
        }
    }
}

impl<B> Slot<B> {
    /// Gives this slot (number `slot`) to request `rid`: a new generation; returns the command
    /// id for it.
    #[inline]
    fn claim(&mut self, slot: u16, rid: u16) -> u16 {
        self.owner = rid;
        self.gen = (self.gen + 1) & 0xf;
        slot | (self.gen as u16) << SLOT_BITS
    }
}

/// A request in flight, in its first command's slot. 16 bytes and `Copy`: the hot path writes
/// it whole at submit and touches a few fields at completion.
#[derive(Debug, Clone, Copy)]
struct Request {
    tag: u64,
    /// When a health check first saw the request in flight, in milliseconds since the queue
    /// pair was created, plus one (0: not seen yet). Submitting reads no clock (a clock read
    /// costs a system call in some guests); timeouts are therefore measured from the first
    /// check after submission, at most one check interval late.
    seen_ms: u32,
    /// Commands of the request still in flight; 0 for a free entry.
    parts: u16,
    /// The status of the first part that failed; success until one does.
    error: Status,
    op: Op,
    aborted: bool,
}

const _: () = assert!(std::mem::size_of::<Request>() <= 24);

impl Request {
    const FREE: Request = Request::new(0, 0, Op::Raw);

    #[inline]
    const fn new(tag: u64, parts: u16, op: Op) -> Self {
        Request {
            tag,
            seen_ms: 0,
            parts,
            error: Status::SUCCESS,
            op,
            aborted: false,
        }
    }
}

#[cold]
#[inline(never)]
fn reject_len<B: IoBuffer>(ns: NsInfo, buf: B) -> Result<(), Rejected<B>> {
    let error = NvmeError::BadLength {
        nsid: ns.nsid,
        len: buf.len(),
        lba_size: 1 << ns.lba_shift,
    };
    Err(Rejected { error, buf })
}

#[cold]
#[inline(never)]
fn reject_misaligned<B>(start: u64, buf: B) -> Result<(), Rejected<B>> {
    let error = NvmeError::Buffer(prp::PrpError::Misaligned(start));
    Err(Rejected { error, buf })
}

#[derive(Debug, Clone, Copy)]
struct NsInfo {
    nsid: u32,
    lba_shift: u32,
    /// LBA size - 1.
    lba_mask: usize,
    blocks: u64,
    /// The longest transfer that always fits one command, wherever the buffer starts.
    one_command: usize,
}

const UNUSED: u16 = u16::MAX;

/// Polls (with work outstanding) between two looks for timed-out commands and a failed
/// controller. Each look reads the clock once and scans the request table.
const HEALTH_CHECK_POLLS: u32 = 256;

/// An I/O submission + completion queue pair with its request trackers. See the module docs.
pub struct QueuePair<B: IoBuffer> {
    ring: Ring,
    mem: QueueMem,
    slots: Box<[Slot<B>]>,
    free_cids: Vec<u16>,
    /// Requests in flight.
    live: usize,
    /// Commands beyond one per request (the parts of split requests after their first):
    /// `QpairStats::commands` is `requests` plus this.
    extra_commands: u64,
    /// Released-but-unannounced completion entries plus taken slots at which `poll` rings the
    /// completion doorbell: half the queue.
    cq_release_at: usize,
    /// When the queue pair was created: the origin of `Request::seen_ms`.
    created: Instant,
    lists_off: usize,
    list_pages: usize,
    max_xfer: usize,
    split: bool,
    use_sgl: bool,
    namespaces: Vec<NsInfo>,
    stats: QpairStats,
    timeout: Duration,
    idle_polls: u32,
    failed: Option<String>,
    /// The submission queue's slots in the CMB, when there.
    sq_cmb: Option<crate::cmb::CmbSlice>,
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
struct TrackerLists<'a> {
    mem: &'a mut QueueMem,
    off: usize,
    pages: usize,
}

impl PrpListMem for TrackerLists<'_> {
    fn pages(&self) -> usize {
        self.pages
    }
    fn page_bus(&self, page: usize) -> u64 {
        self.mem.bus(self.off + page * PAGE_SIZE)
    }
    fn write(&mut self, page: usize, idx: usize, entry: u64) {
        self.mem.write_u64(self.off + page * PAGE_SIZE + idx * 8, entry);
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
        let min_lba = sh.namespaces.iter().map(|n| n.lba_size).min().unwrap_or(512);
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
        let qid = sh.alloc_qid()?;
        // Shadow doorbells of a new queue start at 0, before the controller learns of it.
        let shadow = sh
            .shadow
            .as_ref()
            .map(|p| p.slot(qid, sh.cap.doorbell_stride(), PAGE_SIZE));
        let sq_bus = sq_cmb.as_ref().map_or(mem.bus(0), |s| s.bus_addr().get());
        let cq_bus = mem.bus(sq_bytes);
        let created = (|| {
            sh.admin_exec(
                "Create I/O Completion Queue",
                Command::create_io_cq(qid, entries as u32, cq_bus),
                crate::admin::DataDir::None,
                &[],
            )?;
            if let Err(e) = sh.admin_exec(
                "Create I/O Submission Queue",
                Command::create_io_sq(qid, entries as u32, sq_bus, qid),
                crate::admin::DataDir::None,
                &[],
            ) {
                let _ = sh.admin_exec(
                    "Delete I/O Completion Queue",
                    Command::delete_io_cq(qid),
                    crate::admin::DataDir::None,
                    &[],
                );
                return Err(e);
            }
            Ok(())
        })();
        if let Err(e) = created {
            sh.free_qid(qid);
            return Err(e);
        }
        let mut ring = Ring::new(&sh.bar, sh.cap.doorbell_stride(), qid, opts.entries);
        if let Some(slot) = shadow {
            ring.set_shadow(slot);
        }
        if let Some(s) = &sq_cmb {
            mem.put_sq_in_cmb(s.mmio());
        }
        let n = entries - 1;
        log::debug!("I/O queue pair {qid}: {entries} entries, max transfer {max_xfer}, {list_pages} list page(s) per command");
        Ok(QueuePair {
            ring,
            mem,
            slots: (0..n)
                .map(|_| Slot {
                    owner: UNUSED,
                    gen: 0,
                    req: Request::FREE,
                    buf: None,
                })
                .collect(),
            free_cids: (0..n as u16).rev().collect(),
            live: 0,
            extra_commands: 0,
            cq_release_at: entries / 2,
            created: Instant::now(),
            lists_off,
            list_pages,
            max_xfer,
            split: opts.split,
            use_sgl: opts.sgl && sh.identify.sgl_supported(),
            namespaces: sh
                .namespaces
                .iter()
                .map(|n| NsInfo {
                    nsid: n.nsid,
                    lba_shift: n.lba_size.trailing_zeros(),
                    lba_mask: n.lba_size - 1,
                    blocks: n.blocks,
                    one_command: Self::part_step(max_xfer, n.lba_size, false),
                })
                .collect(),
            stats: QpairStats::default(),
            timeout: opts.timeout,
            idle_polls: 0,
            failed: None,
            sq_cmb,
            ctrl: Arc::clone(sh),
            _not_sync: PhantomData,
        })
    }

    /// Gives slot `slot` to request `rid` and returns the command id for it.
    #[inline]
    fn claim(&mut self, slot: u16, rid: u16) -> u16 {
        self.slots[slot as usize].claim(slot, rid)
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

    /// The largest transfer of one command (larger requests are split).
    pub fn max_transfer(&self) -> usize {
        self.max_xfer
    }

    /// Counters.
    pub fn stats(&self) -> QpairStats {
        QpairStats {
            commands: self.stats.requests + self.extra_commands,
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
    fn check_range(&self, ns: NsInfo, slba: u64, blocks: u64) -> Result<()> {
        match slba.checked_add(blocks) {
            Some(end) if end <= ns.blocks && blocks > 0 => Ok(()),
            _ => Err(NvmeError::LbaOutOfRange {
                nsid: ns.nsid,
                slba,
                end: slba.saturating_add(blocks),
                blocks: ns.blocks,
                lba_size: 1 << ns.lba_shift,
            }),
        }
    }

    fn check_usable(&self) -> Result<()> {
        match &self.failed {
            Some(why) => Err(NvmeError::Failed(why.clone())),
            None => Ok(()),
        }
    }

    /// Reads `buf.len()` bytes from `slba` of `nsid` into `buf`.
    #[inline]
    pub fn read(&mut self, nsid: u32, slba: u64, buf: B, tag: u64) -> Result<(), Rejected<B>> {
        self.submit_data(Op::Read, nsid, slba, buf, tag)
    }

    /// Writes `buf` to `slba` of `nsid`.
    #[inline]
    pub fn write(&mut self, nsid: u32, slba: u64, buf: B, tag: u64) -> Result<(), Rejected<B>> {
        self.submit_data(Op::Write, nsid, slba, buf, tag)
    }

    /// Writes with Force Unit Access: completes only once the data is on non-volatile media.
    #[inline]
    pub fn write_fua(&mut self, nsid: u32, slba: u64, buf: B, tag: u64) -> Result<(), Rejected<B>> {
        self.submit_data(Op::WriteFua, nsid, slba, buf, tag)
    }

    /// Compares `buf` with the blocks at `slba`: completes with "Compare Failure" on a mismatch.
    #[inline]
    pub fn compare(&mut self, nsid: u32, slba: u64, buf: B, tag: u64) -> Result<(), Rejected<B>> {
        self.submit_data(Op::Compare, nsid, slba, buf, tag)
    }

    /// Bytes per command when a request is split: the maximum transfer, but a part never spans
    /// more memory pages than that allows bytes, so when the buffer does not start on a page
    /// (`aligned` false) each part is one page (or block) shorter. (Controllers size their
    /// internal scatter lists by MDTS; QEMU's fails a 4 MiB transfer that touches 1025 pages.)
    const fn part_step(max_xfer: usize, lba_size: usize, aligned: bool) -> usize {
        if !aligned && max_xfer > PAGE_SIZE {
            let shorter = if PAGE_SIZE > lba_size { PAGE_SIZE } else { lba_size };
            // At least one block (blocks of the maximum transfer or more leave nothing to take
            // off), so a split always makes progress.
            let step = max_xfer.saturating_sub(shorter);
            if step > lba_size {
                step
            } else {
                lba_size
            }
        } else {
            max_xfer
        }
    }

    /// The common submission: checks, one command (the request fits one whatever the buffer's
    /// offset), its data pointer, the request entry. Larger requests go to `submit_split`.
    #[inline]
    fn submit_data(&mut self, op: Op, nsid: u32, slba: u64, buf: B, tag: u64) -> Result<(), Rejected<B>> {
        if self.failed.is_some() {
            return self.reject_failed(buf);
        }
        let Some(ns) = self.namespaces.iter().find(|n| n.nsid == nsid).copied() else {
            return self.reject_ns(nsid, buf);
        };
        let len = buf.len();
        if len == 0 || len & ns.lba_mask != 0 {
            return reject_len(ns, buf);
        }
        let blocks = (len >> ns.lba_shift) as u64;
        if let Err(e) = self.check_range(ns, slba, blocks) {
            return Err(Rejected { error: e, buf });
        }
        if len > ns.one_command {
            return self.submit_split(op, ns, slba, buf, tag);
        }
        let Some(&slot) = self.free_cids.last() else {
            return self.reject_full(buf);
        };
        let start = buf.bus_addr(0).get();
        if start & 3 != 0 {
            return reject_misaligned(start, buf);
        }
        let dp = match self.data_ptr(slot, &buf, 0, len, start) {
            Ok(dp) => dp,
            Err(error) => return Err(Rejected { error, buf }),
        };
        self.free_cids.pop();
        let s = &mut self.slots[slot as usize];
        let cid = s.claim(slot, slot);
        s.req = Request::new(tag, 1, op);
        s.buf = Some(buf);
        let (opcode, fua) = op.io_opcode();
        self.ring.push(
            &mut self.mem,
            &rw_words(opcode, nsid, cid, slba, blocks as u32, fua, dp),
        );
        self.stats.requests += 1;
        self.live += 1;
        Ok(())
    }

    #[cold]
    #[inline(never)]
    fn reject_failed(&self, buf: B) -> Result<(), Rejected<B>> {
        let error = self.check_usable().expect_err("failed");
        Err(Rejected { error, buf })
    }

    #[cold]
    #[inline(never)]
    fn reject_ns(&self, nsid: u32, buf: B) -> Result<(), Rejected<B>> {
        let error = self.ns(nsid).expect_err("no such namespace");
        Err(Rejected { error, buf })
    }

    #[cold]
    #[inline(never)]
    fn reject_full(&self, buf: B) -> Result<(), Rejected<B>> {
        let error = NvmeError::QueueFull {
            qid: self.ring.qid,
            outstanding: self.outstanding(),
        };
        Err(Rejected { error, buf })
    }

    /// A request larger than one command: split at `part_step` when splitting is on.
    #[inline(never)]
    fn submit_split(&mut self, op: Op, ns: NsInfo, slba: u64, buf: B, tag: u64) -> Result<(), Rejected<B>> {
        let len = buf.len();
        let lba_size = 1usize << ns.lba_shift;
        let start = buf.bus_addr(0).get();
        let step = Self::part_step(self.max_xfer, lba_size, start & (PAGE_SIZE as u64 - 1) == 0);
        let parts = len.div_ceil(step);
        if parts > self.slots.len() {
            let error = NvmeError::TooLarge {
                len,
                mdts: step * self.slots.len(),
            };
            return Err(Rejected { error, buf });
        }
        if parts > 1 && !self.split {
            let error = NvmeError::TooLarge {
                len,
                mdts: self.max_xfer,
            };
            return Err(Rejected { error, buf });
        }
        if parts > self.free_cids.len() {
            return self.reject_full(buf);
        }
        if start & 3 != 0 {
            return reject_misaligned(start, buf);
        }
        // The request lives at its first command's slot.
        let rid = *self.free_cids.last().expect("checked above");
        let (opcode, fua) = op.io_opcode();
        let mut done = 0usize;
        for part in 0..parts {
            let plen = step.min(len - done);
            let slot = self.free_cids.pop().expect("checked above");
            let dp = match self.data_ptr(slot, &buf, done, plen, buf.bus_addr(done).get()) {
                Ok(dp) => dp,
                Err(e) => {
                    // Take back the parts already written: none was announced to the controller
                    // (the doorbell rings only in `poll`/`flush_submissions`), so rewinding the
                    // tail removes them.
                    self.ring.unpush(part as u16);
                    self.free_cids.push(slot);
                    for (c, t) in self.slots.iter_mut().enumerate() {
                        if t.owner == rid {
                            t.owner = UNUSED;
                            self.free_cids.push(c as u16);
                        }
                    }
                    return Err(Rejected { error: e, buf });
                }
            };
            let cid = self.claim(slot, rid);
            let words = rw_words(
                opcode,
                ns.nsid,
                cid,
                slba + (done >> ns.lba_shift) as u64,
                (plen >> ns.lba_shift) as u32,
                fua,
                dp,
            );
            self.ring.push(&mut self.mem, &words);
            done += plen;
        }
        self.stats.requests += 1;
        self.extra_commands += parts as u64 - 1;
        self.live += 1;
        let s = &mut self.slots[rid as usize];
        s.req = Request::new(tag, parts as u16, op);
        s.buf = Some(buf);
        Ok(())
    }

    /// The data pointer for `len` bytes of `buf` from `off` (bus address `start`), dword
    /// aligned: an SGL data block where enabled and contiguous, PRP1 alone for one memory page,
    /// PRP1 + PRP2 for two, a PRP list in tracker `slot`'s list pages otherwise.
    #[inline]
    fn data_ptr(&mut self, slot: u16, buf: &B, off: usize, len: usize, start: u64) -> Result<DataPtr> {
        if self.use_sgl && buf.contiguous_len(off) >= len {
            return Ok(DataPtr::sgl(SglDescriptor::data_block(start, len as u32)));
        }
        let end = (start as usize & (PAGE_SIZE - 1)) + len;
        if end <= PAGE_SIZE {
            return Ok(DataPtr::prp(start, 0));
        }
        if end <= 2 * PAGE_SIZE {
            let second = buf
                .bus_addr(off + PAGE_SIZE - (start as usize & (PAGE_SIZE - 1)))
                .get();
            if second & (PAGE_SIZE as u64 - 1) == 0 {
                return Ok(DataPtr::prp(start, second));
            }
        }
        self.prp_list(slot, buf, off, len, start)
    }

    /// PRPs through `prp::build`, with a list in tracker `slot`'s list pages.
    #[inline(never)]
    fn prp_list(&mut self, slot: u16, buf: &B, off: usize, len: usize, start: u64) -> Result<DataPtr> {
        let first = start as usize & (PAGE_SIZE - 1);
        let lists_off = self.lists_off + slot as usize * self.list_pages * PAGE_SIZE;
        let mut lists = TrackerLists {
            mem: &mut self.mem,
            off: lists_off,
            pages: self.list_pages,
        };
        // Page i (i >= 1) of the transfer starts at byte i * PAGE - first of the part.
        let (p1, p2) = prp::build(
            start,
            len,
            PAGE_SIZE,
            |i| buf.bus_addr(off + i * PAGE_SIZE - first).get(),
            &mut lists,
        )?;
        Ok(DataPtr::prp(p1, p2))
    }

    fn submit_nodata(&mut self, cmd: Command, op: Op, tag: u64) -> Result<()> {
        self.check_usable()?;
        let Some(slot) = self.free_cids.pop() else {
            return Err(NvmeError::QueueFull {
                qid: self.ring.qid,
                outstanding: self.outstanding(),
            });
        };
        let cid = self.claim(slot, slot);
        let mut cmd = cmd;
        cmd.set_cid(cid);
        self.ring.push(&mut self.mem, &cmd.to_words());
        self.stats.requests += 1;
        self.live += 1;
        self.slots[slot as usize].req = Request::new(tag, 1, op);
        Ok(())
    }

    /// Submits `cmd` as it is (opcode, namespace, CDW10-15), with its data pointer set from
    /// `buf` if given: I/O passthrough for commands this API does not cover, or to see what the
    /// controller says about a command the safe methods would refuse. No check is made.
    ///
    /// # Safety
    /// The command must not make the controller access memory outside `buf` (for a read or
    /// write, the block count times the LBA size must not exceed `buf.len()`), nor anything else
    /// the caller does not own.
    pub unsafe fn submit_raw(
        &mut self,
        cmd: Command,
        buf: Option<B>,
        tag: u64,
    ) -> Result<(), Rejected<Option<B>>> {
        if let Err(error) = self.check_usable() {
            return Err(Rejected { error, buf });
        }
        if self.free_cids.is_empty() {
            let error = NvmeError::QueueFull {
                qid: self.ring.qid,
                outstanding: self.outstanding(),
            };
            return Err(Rejected { error, buf });
        }
        let slot = *self.free_cids.last().expect("checked");
        let mut cmd = cmd;
        if let Some(b) = &buf {
            let start = b.bus_addr(0).get();
            let dp = if start & 3 != 0 {
                Err(NvmeError::Buffer(prp::PrpError::Misaligned(start)))
            } else {
                self.data_ptr(slot, b, 0, b.len(), start)
            };
            match dp {
                Ok(dp) => {
                    cmd.set_psdt(dp.psdt);
                    cmd.set_prp1(dp.lo);
                    cmd.set_prp2(dp.hi);
                }
                Err(error) => return Err(Rejected { error, buf }),
            }
        }
        self.free_cids.pop();
        let cid = self.claim(slot, slot);
        cmd.set_cid(cid);
        self.ring.push(&mut self.mem, &cmd.to_words());
        self.stats.requests += 1;
        self.live += 1;
        let s = &mut self.slots[slot as usize];
        s.req = Request::new(tag, 1, Op::Raw);
        s.buf = buf;
        Ok(())
    }

    /// Flush: commits the namespace's volatile write cache to media.
    pub fn flush(&mut self, nsid: u32, tag: u64) -> Result<()> {
        self.ns(nsid)?;
        self.submit_nodata(Command::new(io_op::FLUSH, nsid), Op::Flush, tag)
    }

    /// Write Zeroes: `blocks` (1..=65536) blocks from `slba` read back as zeroes.
    pub fn write_zeroes(&mut self, nsid: u32, slba: u64, blocks: u32, tag: u64) -> Result<()> {
        let ns = self.ns(nsid)?;
        if !(1..=65536).contains(&blocks) {
            return Err(NvmeError::InvalidOption(format!(
                "write zeroes of {blocks} blocks: must be 1..=65536"
            )));
        }
        self.check_range(ns, slba, blocks as u64)?;
        self.submit_nodata(
            Command::rw(io_op::WRITE_ZEROES, nsid, slba, blocks),
            Op::WriteZeroes,
            tag,
        )
    }

    /// Dataset Management / Deallocate (trim) of up to 256 ranges `(slba, blocks)`.
    pub fn deallocate(&mut self, nsid: u32, ranges: &[(u64, u32)], tag: u64) -> Result<()> {
        let ns = self.ns(nsid)?;
        if ranges.is_empty() || ranges.len() > 256 {
            return Err(NvmeError::InvalidOption(format!(
                "{} deallocate ranges: must be 1..=256",
                ranges.len()
            )));
        }
        for &(slba, n) in ranges {
            self.check_range(ns, slba, n as u64)?;
        }
        self.check_usable()?;
        let Some(&slot) = self.free_cids.last() else {
            return Err(NvmeError::QueueFull {
                qid: self.ring.qid,
                outstanding: self.outstanding(),
            });
        };
        // The range list (16 bytes per range, NVM Command Set 1.0 Figure 39) goes into the list
        // page of the tracker this command will get.
        let off = self.lists_off + slot as usize * self.list_pages * PAGE_SIZE;
        for (i, &(slba, n)) in ranges.iter().enumerate() {
            self.mem.write_u64(off + i * 16, (n as u64) << 32);
            self.mem.write_u64(off + i * 16 + 8, slba);
        }
        let mut cmd = Command::deallocate(nsid, ranges.len() as u32);
        cmd.set_prp1(self.mem.bus(off));
        self.submit_nodata(cmd, Op::DatasetManagement, tag)
    }

    /// Rings the submission doorbell for everything submitted since the last ring.
    #[inline]
    pub fn flush_submissions(&mut self) {
        if self.ring.unrung != 0 {
            if self.ring.ring_sq() {
                self.stats.sq_doorbells += 1;
            } else {
                self.stats.shadow_only += 1;
            }
        }
    }

    /// Rings the submission doorbell, then delivers up to `max` completed requests to `f` and
    /// rings the completion doorbell once. Returns how many requests completed.
    ///
    /// Also detects, every few hundred polls with work outstanding, commands past their timeout (asks the
    /// controller to abort them) and a controller fatal status (fails every request).
    #[inline]
    pub fn poll(&mut self, max: usize, mut f: impl FnMut(Done<B>)) -> usize {
        self.flush_submissions();
        let mut delivered = 0;
        let mut consumed = 0u32;
        while delivered < max {
            let Some(c) = self.ring.pop(&self.mem) else { break };
            consumed += 1;
            let slot = (c.cid & SLOT_MASK) as usize;
            let gen = (c.cid >> SLOT_BITS) as u8;
            let Some(t) = self
                .slots
                .get_mut(slot)
                .filter(|t| t.owner != UNUSED && t.gen == gen)
            else {
                self.bogus(c);
                continue;
            };
            let rid = t.owner as usize;
            t.owner = UNUSED;
            let s = if slot == rid {
                t
            } else {
                // Another part of a split request: its slot is free now; the request's own slot
                // (its first part's) stays taken until the whole request completes.
                self.free_cids.push(slot as u16);
                &mut self.slots[rid]
            };
            let st = c.status();
            let req = &mut s.req;
            debug_assert!(req.parts != 0, "slot points at a live request");
            if !st.is_success() && req.error.is_success() {
                req.error = st;
            }
            req.parts -= 1;
            if req.parts == 0 {
                let (tag, error, op) = (req.tag, req.error, req.op);
                let buf = s.buf.take();
                self.free_cids.push(rid as u16);
                self.live -= 1;
                delivered += 1;
                if error.is_success() {
                    // DW0 of the part that completed last (a split request's parts all carry
                    // the same command, so any part's DW0 would do).
                    f(Done {
                        tag,
                        result: Ok(c.dw0),
                        buf,
                    });
                } else {
                    self.stats.errors += 1;
                    f(Done {
                        tag,
                        result: Err(NvmeError::Status {
                            op: op.name(),
                            status: error,
                        }),
                        buf,
                    });
                }
            }
        }
        if consumed != 0 {
            self.stats.completions += consumed as u64;
        }
        // The completion-queue head doorbell is deferred: consumed entries are released in
        // batches (one MMIO write per many completions, which matters most at low queue depth).
        // It is rung as soon as released-but-unannounced entries plus commands in flight could
        // fill half the queue, so the controller always has room to post (this check runs at
        // every poll, busy or not, so a controller waiting for room is never left waiting).
        let taken = self.slots.len() - self.free_cids.len();
        let unacked = self.ring.unacked as usize;
        if unacked != 0 && unacked + taken >= self.cq_release_at {
            if self.ring.ring_cq() {
                self.stats.cq_doorbells += 1;
            } else {
                self.stats.shadow_only += 1;
            }
        }
        if self.outstanding() != 0 {
            // Every HEALTH_CHECK_POLLS polls with work outstanding (busy or not), look for commands
            // past their deadline and a failed controller.
            self.idle_polls = self.idle_polls.wrapping_add(1);
            if self.idle_polls.is_multiple_of(HEALTH_CHECK_POLLS) {
                delivered += self.check_health(&mut f);
            }
        }
        delivered
    }

    /// A completion for no command in flight: counted and logged.
    #[cold]
    #[inline(never)]
    fn bogus(&mut self, c: crate::cmd::Completion) {
        self.stats.bogus_completions += 1;
        log::error!(
            "queue {}: completion for command id {} which is not in flight: {c:?}",
            self.ring.qid,
            c.cid
        );
    }

    /// Timeouts and controller health, off the hot path.
    #[cold]
    fn check_health(&mut self, f: &mut impl FnMut(Done<B>)) -> usize {
        let s = crate::regs::Csts(self.ctrl.bar.read32(crate::regs::off::CSTS));
        if s.device_gone() || s.fatal() {
            let why = if s.device_gone() {
                NvmeError::DeviceGone
            } else {
                NvmeError::ControllerFatal { csts: s.0 }
            };
            return self.fail_all(why.to_string(), f);
        }
        // Milliseconds since creation, plus one (0 means "not seen" in `Request::seen_ms`);
        // wrapping arithmetic keeps working past 49 days.
        let now = (self.created.elapsed().as_millis() as u32).wrapping_add(1).max(1);
        let timeout = self.timeout.as_millis().min(u32::MAX as u128 / 2) as u32;
        let mut timed_out = Vec::new();
        for (rid, s) in self.slots.iter_mut().enumerate() {
            let r = &mut s.req;
            if r.parts == 0 {
                continue;
            }
            if r.seen_ms == 0 {
                r.seen_ms = now;
            }
            if now.wrapping_sub(r.seen_ms) > timeout {
                timed_out.push((rid as u16, r.aborted));
                r.aborted = true;
                r.seen_ms = now;
            }
        }
        // Every part of those requests still in flight (a split request's other parts may have
        // completed, and their slots now belong to other requests).
        let mut expired = Vec::new();
        for (rid, already) in timed_out {
            for (slot, t) in self.slots.iter().enumerate() {
                if t.owner == rid {
                    expired.push((slot as u16 | (t.gen as u16) << SLOT_BITS, already));
                }
            }
        }
        for (cid, already) in expired {
            if already {
                // Asked to abort one timeout ago and still nothing: the controller is not
                // processing this queue. Give up on it.
                let why = format!(
                    "command id {cid} on queue {} did not complete even after an abort",
                    self.ring.qid
                );
                return self.fail_all(why, f);
            }
            self.stats.aborts += 1;
            log::warn!(
                "queue {}: command id {cid} timed out after {:?}; aborting it",
                self.ring.qid,
                self.timeout
            );
            if let Err(e) = (Controller {
                shared: Arc::clone(&self.ctrl),
            })
            .abort(self.ring.qid, cid)
            {
                log::warn!("abort of command id {cid} failed: {e}");
            }
        }
        0
    }

    /// Completes every request with an error after an unrecoverable failure. The buffers are
    /// leaked, never returned: the device may still write into them.
    #[cold]
    fn fail_all(&mut self, why: String, f: &mut impl FnMut(Done<B>)) -> usize {
        log::error!(
            "queue {}: {why}; failing {} requests",
            self.ring.qid,
            self.outstanding()
        );
        self.failed = Some(why.clone());
        let mut n = 0;
        for t in self.slots.iter_mut() {
            t.owner = UNUSED;
        }
        for s in self.slots.iter_mut() {
            let req = &mut s.req;
            if req.parts != 0 {
                req.parts = 0;
                std::mem::forget(s.buf.take());
                self.stats.errors += 1;
                n += 1;
                self.live -= 1;
                f(Done {
                    tag: req.tag,
                    result: Err(NvmeError::Failed(why.clone())),
                    buf: None,
                });
            }
        }
        n
    }

    /// Polls until every request in flight has completed or `timeout` passes; returns how many
    /// completed. For tests, teardown and simple synchronous use.
    pub fn drain(&mut self, timeout: Duration, mut f: impl FnMut(Done<B>)) -> Result<usize> {
        let start = Instant::now();
        let mut n = 0;
        while self.outstanding() != 0 {
            n += self.poll(usize::MAX, &mut f);
            if start.elapsed() > timeout {
                let cid = self
                    .slots
                    .iter()
                    .position(|s| s.req.parts != 0)
                    .map_or(0, |rid| rid as u16 | (self.slots[rid].gen as u16) << SLOT_BITS);
                return Err(NvmeError::Timeout {
                    op: "drain",
                    qid: self.ring.qid,
                    cid,
                    timeout,
                });
            }
            std::hint::spin_loop();
        }
        Ok(n)
    }
}

impl<B: IoBuffer> Drop for QueuePair<B> {
    fn drop(&mut self) {
        let qid = self.ring.qid;
        if self.outstanding() != 0 {
            let _ = self.drain(Duration::from_millis(500).min(self.timeout), |_| {});
        }
        // Deleting the SQ aborts whatever is left (§5.6); after both deletions succeed the
        // controller no longer touches this queue's memory or its buffers.
        let none = crate::admin::DataDir::None;
        let deleted = self.failed.is_none()
            && self
                .ctrl
                .admin_exec(
                    "Delete I/O Submission Queue",
                    Command::delete_io_sq(qid),
                    none,
                    &[],
                )
                .is_ok()
            && self
                .ctrl
                .admin_exec(
                    "Delete I/O Completion Queue",
                    Command::delete_io_cq(qid),
                    none,
                    &[],
                )
                .is_ok();
        if deleted {
            self.ctrl.free_qid(qid);
        } else {
            log::error!(
                "queue pair {qid} could not be deleted; leaking its memory and {} buffers",
                self.outstanding()
            );
            for s in self.slots.iter_mut() {
                std::mem::forget(s.buf.take());
            }
            self.mem.leak();
            std::mem::forget(self.sq_cmb.take());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Qp = QueuePair<vfpoll_dma::DmaBuf>;

    #[test]
    fn split_steps_respect_the_page_rule_and_always_progress() {
        // Aligned buffers take the whole maximum transfer per command.
        assert_eq!(Qp::part_step(512 << 10, 512, true), 512 << 10);
        // Unaligned ones one page less (the part then touches at most MDTS / page pages).
        assert_eq!(Qp::part_step(512 << 10, 512, false), (512 << 10) - 4096);
        assert_eq!(Qp::part_step(512 << 10, 4096, false), (512 << 10) - 4096);
        // A transfer limit of one page leaves nothing to take off.
        assert_eq!(Qp::part_step(4096, 512, false), 4096);
        // Blocks of the maximum transfer or larger: one block per command, never 0.
        assert_eq!(Qp::part_step(8192, 8192, false), 8192);
        assert_eq!(Qp::part_step(8192, 16384, false), 16384);
    }
}
