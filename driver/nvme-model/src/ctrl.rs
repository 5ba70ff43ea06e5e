//! The controller thread: register state machine, doorbell polling, round-robin arbitration,
//! completion posting, delayed completions and the idle policy.
//!
//! One thread owns all controller state; the host reaches it only through BAR0 (registers and
//! doorbells in shared memory) and host memory, as with real hardware. The model handle reaches
//! it through [`Shared`] (stop flag, statistics, faults to arm, namespaces).

use std::collections::BinaryHeap;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vfpoll_nvme_spec::regs::{off, Cc};
use vfpoll_pci::mmio::Mmio;

use crate::config::ShutdownBehavior;
use crate::dma::{Guest, Seg};
use crate::events::Events;
use crate::fault::{Fault, FaultKind, FaultTable};
use crate::ns::Namespace;
use crate::queue::{cqe_dwords, Command, Completion, Cq, PostMode, Sq, CQE_SIZE, SQE_SIZE};
use crate::stats::{bump, Stats};
use crate::{ModelConfig, Status};

/// VS: NVMe 1.4.0 (§3.1.3.2).
pub(crate) const VERSION: u32 = 0x0001_0400;
/// CSTS bits (§3.1.3.6).
const CSTS_RDY: u32 = 1 << 0;
const CSTS_CFS: u32 = 1 << 1;
const CSTS_SHST_OCCURRING: u32 = 0b01 << 2;
const CSTS_SHST_COMPLETE: u32 = 0b10 << 2;
const CSTS_SHST: u32 = 0b11 << 2;
/// Number of Error Information log entries kept (Identify Controller ELPE + 1).
pub(crate) const ERROR_LOG_ENTRIES: usize = 64;
/// Size of the scratch buffer for admin data, DSM ranges and compares.
const SCRATCH: usize = 64 * 1024;
/// Asynchronous Event Configuration bit 8: Namespace Attribute Notices (§5.27.1.9).
const AEC_NS_ATTR: u32 = 1 << 8;
/// First sleep when idle; doubles up to `ModelConfig::max_idle_sleep`.
const MIN_IDLE_SLEEP: Duration = Duration::from_micros(2);

/// CC.CSS values (§3.1.3.5): NVM command set, all supported I/O command sets, admin only.
pub(crate) const CSS_NVM: u32 = 0b000;
pub(crate) const CSS_ALL_IOCS: u32 = 0b110;
pub(crate) const CSS_ADMIN_ONLY: u32 = 0b111;

/// CC fields the driver's `regs::Cc` has builders for but no getters (§3.1.3.5).
pub(crate) fn cc_css(cc: Cc) -> u32 {
    (cc.0 >> 4) & 0x7
}
fn cc_ams(cc: Cc) -> u32 {
    (cc.0 >> 11) & 0x7
}
fn cc_shn(cc: Cc) -> u32 {
    (cc.0 >> 14) & 0x3
}
fn cc_iosqes(cc: Cc) -> u32 {
    (cc.0 >> 16) & 0xf
}
fn cc_iocqes(cc: Cc) -> u32 {
    (cc.0 >> 20) & 0xf
}

/// Sets the registers of a controller that was just powered on: CAP, VS, CSTS = 0.
pub(crate) fn init_registers(bar: &Mmio, cfg: &ModelConfig) {
    bar.write64(off::CAP, cfg.cap());
    bar.write32(off::VS, VERSION);
    bar.write32(off::CSTS, 0);
}

/// What the handle and the controller thread share.
pub(crate) struct Shared {
    pub(crate) stop: AtomicBool,
    pub(crate) stats: Stats,
    /// Faults injected but not yet taken over by the thread, and a generation counter bumped on
    /// each change so the thread looks at the mutex only when there is something new.
    pub(crate) faults: Mutex<FaultInbox>,
    pub(crate) fault_gen: AtomicU64,
    /// Faults armed in the thread's table (updated by the thread).
    pub(crate) armed: AtomicUsize,
    pub(crate) fatal_now: AtomicBool,
    pub(crate) namespaces: Vec<Arc<Namespace>>,
    /// Namespaces the handle changed, for the thread to report (Namespace Attribute Changed),
    /// and a flag so the thread looks at the mutex only when there is something new.
    pub(crate) ns_changes: Mutex<Vec<u32>>,
    pub(crate) ns_changed: AtomicBool,
    /// The MSI-X table: the eventfd each interrupt vector signals ([`crate::NvmeModel::msix`]).
    pub(crate) msix: Mutex<Vec<Arc<vfpoll_pci::vfio::EventFd>>>,
    /// Normal and abrupt shutdowns completed.
    pub(crate) shutdowns: [AtomicU64; 2],
    /// CC.EN 1 → 0 transitions left to hang on (the controller stops, CSTS.RDY stays 1).
    pub(crate) hang_disable: AtomicU32,
    /// CC.EN 0 → 1 transitions left to hang on (CSTS.RDY never comes).
    pub(crate) hang_enable: AtomicU32,
    /// Function resets asked for through the handle, and done by the thread.
    pub(crate) flr_asked: AtomicU64,
    pub(crate) flr_done: AtomicU64,
    /// Controller resets (CC.EN 1 → 0 that completed) and function resets done.
    pub(crate) resets: [AtomicU64; 2],
}

/// Fault changes requested through the handle.
#[derive(Debug, Default)]
pub(crate) struct FaultInbox {
    pub(crate) new: Vec<Fault>,
    pub(crate) clear: bool,
}

/// What an admin or I/O command handler decided.
pub(crate) enum Outcome {
    /// Complete with this status and dwords 0 (low half) and 1 (high half).
    Done(Status, u64),
    /// No completion now (an Asynchronous Event Request).
    Pending,
}

impl From<Status> for Outcome {
    fn from(s: Status) -> Self {
        Outcome::Done(s, 0)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// CC.EN = 0, or shut down.
    Disabled,
    /// CSTS.RDY = 1: queues are processed.
    Running,
    /// CSTS.CFS = 1: nothing is processed until CC.EN is cleared.
    Failed,
    /// Hung (an injected fault): nothing is processed, CSTS stays as it was, CC.EN is ignored;
    /// only a function reset ends it.
    Hung,
}

/// A completion held back until `due` (completion latency or a `Delay` fault).
struct Delayed {
    due: Instant,
    seq: u64,
    cqid: u16,
    c: Completion,
}

impl PartialEq for Delayed {
    fn eq(&self, o: &Self) -> bool {
        self.seq == o.seq
    }
}
impl Eq for Delayed {}
impl PartialOrd for Delayed {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Delayed {
    /// Reversed, so the `BinaryHeap` pops the earliest (then the oldest) first.
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (o.due, o.seq).cmp(&(self.due, self.seq))
    }
}

/// One Error Information log entry's content (§5.16.1.2).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ErrorEntry {
    pub(crate) count: u64,
    pub(crate) sqid: u16,
    pub(crate) cid: u16,
    pub(crate) status: Status,
    pub(crate) lba: u64,
    pub(crate) nsid: u32,
}

/// The shadow doorbell and EventIdx buffers of Doorbell Buffer Config (§5.8).
#[derive(Debug, Clone, Copy)]
pub(crate) struct DbBuf {
    pub(crate) shadow: u64,
    pub(crate) eventidx: u64,
}

/// The controller.
pub(crate) struct Controller {
    pub(crate) cfg: ModelConfig,
    pub(crate) bar: Mmio,
    pub(crate) mem: Guest,
    pub(crate) shared: Arc<Shared>,
    pub(crate) ns: Vec<Arc<Namespace>>,
    pub(crate) stride: usize,
    state: State,
    cc: Cc,
    /// CC.MPS in bytes, fixed while enabled.
    pub(crate) page: u64,
    pub(crate) sqs: Vec<Option<Sq>>,
    pub(crate) cqs: Vec<Option<Cq>>,
    /// IDs of existing queues, ascending.
    pub(crate) active_sqs: Vec<u16>,
    pub(crate) active_cqs: Vec<u16>,
    rr: usize,
    delayed: BinaryHeap<Delayed>,
    seq: u64,
    /// Completions swallowed by a `Drop` fault, with their CQ: Abort and SQ deletion find them.
    lost: Vec<(u16, Completion)>,
    faults: FaultTable,
    fault_gen: u64,
    /// Current feature values by feature ID (§5.27.1); Number of Queues is `nq`.
    pub(crate) features: [u32; 16],
    /// Allocated I/O submission and completion queues (Number of Queues), 1-based.
    pub(crate) nq: (u16, u16),
    /// CC.CSS while enabled: which I/O command sets the namespaces use.
    pub(crate) css: u32,
    pub(crate) events: Events,
    pub(crate) dbbuf: Option<DbBuf>,
    pub(crate) errors: [ErrorEntry; ERROR_LOG_ENTRIES],
    pub(crate) error_count: u64,
    /// Per-command scratch, allocated once: data and metadata segments, a byte buffer, and a
    /// buffer of one block with its metadata (the largest any namespace lists).
    pub(crate) segs: Vec<Seg>,
    pub(crate) msegs: Vec<Seg>,
    pub(crate) buf: Vec<u8>,
    pub(crate) block: Vec<u8>,
    pub(crate) id_ctrl: Box<[u8; 4096]>,
}

/// Releases the idle controller thread in steps: spin first, then sleep, longer each time.
///
/// Trade-off: spinning answers a doorbell within a poll (tens of nanoseconds) but burns a core;
/// sleeping frees the core but a command that arrives while the thread sleeps waits for the
/// sleep to end, and Linux rounds short sleeps up (timer slack, typically 50 µs). So the thread
/// spins for `idle_spin` after the last activity, which covers the gaps inside a burst of I/O and
/// keeps benchmarks on the fast path, and only a controller left alone that long pays the wake-up
/// latency. Set `idle_spin` large for benchmarks, and at least the completion latency for
/// latency-shape tests (a delayed completion is otherwise posted up to one sleep late).
struct Idle {
    since: Option<Instant>,
    sleep: Duration,
    spin: Duration,
    max: Duration,
}

impl Idle {
    fn new(cfg: &ModelConfig) -> Self {
        Idle {
            since: None,
            sleep: MIN_IDLE_SLEEP,
            spin: cfg.idle_spin,
            max: cfg.max_idle_sleep.max(MIN_IDLE_SLEEP),
        }
    }

    fn busy(&mut self) {
        self.since = None;
        self.sleep = MIN_IDLE_SLEEP;
    }

    fn wait(&mut self, deadline: Option<Instant>) {
        let now = Instant::now();
        let since = *self.since.get_or_insert(now);
        if now - since < self.spin {
            std::hint::spin_loop();
            return;
        }
        let nap = match deadline {
            Some(d) => self.sleep.min(d.saturating_duration_since(now)),
            None => self.sleep,
        };
        if nap.is_zero() {
            std::hint::spin_loop();
        } else {
            std::thread::sleep(nap);
            self.sleep = (self.sleep * 2).min(self.max);
        }
    }
}

impl Controller {
    pub(crate) fn new(cfg: ModelConfig, bar: Mmio, mem: Guest, shared: Arc<Shared>) -> Self {
        let qs = cfg.max_io_queue_pairs as usize + 1;
        let max_segs = cfg
            .max_transfer()
            .map_or(4096, |m| (m / 4096) as usize + 2)
            .max(4096);
        let max_block = cfg
            .namespaces
            .iter()
            .flat_map(|n| n.lba_formats())
            .map(|f| f.block_bytes() as usize)
            .max()
            .unwrap_or(0);
        let mut c = Controller {
            stride: cfg.doorbell_stride(),
            ns: shared.namespaces.clone(),
            bar,
            mem,
            shared,
            state: State::Disabled,
            cc: Cc(0),
            page: 4096,
            sqs: (0..qs).map(|_| None).collect(),
            cqs: (0..qs).map(|_| None).collect(),
            active_sqs: Vec::with_capacity(qs),
            active_cqs: Vec::with_capacity(qs),
            rr: 0,
            delayed: BinaryHeap::new(),
            seq: 0,
            lost: Vec::new(),
            faults: FaultTable::default(),
            fault_gen: 0,
            features: [0; 16],
            nq: (cfg.max_io_queue_pairs, cfg.max_io_queue_pairs),
            css: 0,
            events: Events::default(),
            dbbuf: None,
            errors: [ErrorEntry::default(); ERROR_LOG_ENTRIES],
            error_count: 0,
            segs: Vec::with_capacity(max_segs),
            msegs: Vec::with_capacity(max_segs),
            buf: vec![0; SCRATCH],
            block: vec![0; max_block],
            id_ctrl: Box::new([0; 4096]),
            cfg,
        };
        c.build_identify_controller();
        c.default_features();
        c
    }

    /// The thread's main loop, until the handle asks it to stop.
    pub(crate) fn run(mut self) {
        let mut idle = Idle::new(&self.cfg);
        while !self.shared.stop.load(Ordering::Relaxed) {
            let asked = self.shared.flr_asked.load(Ordering::Acquire);
            if asked != self.shared.flr_done.load(Ordering::Relaxed) {
                self.function_reset();
                self.shared.flr_done.store(asked, Ordering::Release);
            }
            let mut busy = self.poll_cc();
            // A request made while the controller is not running is dropped.
            let fatal = &self.shared.fatal_now;
            if fatal.load(Ordering::Relaxed)
                && fatal.swap(false, Ordering::Relaxed)
                && self.state == State::Running
            {
                self.fail(format_args!("fatal error requested through the model handle"));
            }
            if self.shared.ns_changed.load(Ordering::Relaxed) {
                busy = true;
                self.take_ns_changes();
            }
            if self.state == State::Running {
                busy |= self.poll_queues();
                if !self.delayed.is_empty() {
                    busy |= self.post_due(Instant::now());
                }
            }
            if busy {
                idle.busy();
            } else {
                idle.wait(self.delayed.peek().map(|d| d.due));
            }
        }
    }

    // ---- Registers (§3.1.3, §3.5: controller initialization, reset and shutdown) ----

    fn csts(&self) -> u32 {
        self.bar.read32(off::CSTS)
    }

    fn set_csts(&self, v: u32) {
        self.bar.write32(off::CSTS, v);
    }

    /// Reacts to a change of CC. Returns whether there was one.
    fn poll_cc(&mut self) -> bool {
        let cc = Cc(self.bar.read32(off::CC));
        if cc == self.cc {
            return false;
        }
        let old = std::mem::replace(&mut self.cc, cc);
        if self.state == State::Hung {
            return true;
        }
        if old.enabled() && !cc.enabled() {
            if take_one(&self.shared.hang_disable) {
                self.state = State::Hung;
                log::warn!("controller hangs on CC.EN 1 -> 0 (injected): CSTS.RDY stays 1");
                return true;
            }
            self.reset();
            self.shared.resets[0].fetch_add(1, Ordering::Relaxed);
            log::debug!("controller reset (CC.EN 1 -> 0)");
        } else if !old.enabled() && cc.enabled() {
            if take_one(&self.shared.hang_enable) {
                log::warn!("controller never gets ready after CC.EN 0 -> 1 (injected)");
                return true;
            }
            self.enable(cc);
        }
        let shn = cc_shn(cc);
        if cc.enabled() && shn != 0 && shn != cc_shn(old) {
            // §3.6: shutdown (SHN 01b normal, 10b abrupt; an abrupt one may follow a normal one
            // in progress). Memory-backed data needs no flushing: complete at once, unless the
            // configuration says otherwise. Queues keep being processed, which a host that
            // follows the spec never notices.
            let completes = match self.cfg.shutdown {
                ShutdownBehavior::Complete => true,
                ShutdownBehavior::AbruptOnly => shn == 2,
                ShutdownBehavior::Never => false,
            };
            let shst = if completes {
                if let Some(n) = self.shared.shutdowns.get(shn as usize - 1) {
                    n.fetch_add(1, Ordering::Relaxed);
                }
                CSTS_SHST_COMPLETE
            } else {
                CSTS_SHST_OCCURRING
            };
            self.set_csts((self.csts() & !CSTS_SHST) | shst);
            log::debug!("shutdown notification {shn} acknowledged (complete: {completes})");
        }
        true
    }

    /// CC.EN 0 → 1: validates the configuration and the admin queues (§3.5.1), then sets
    /// CSTS.RDY, or CSTS.CFS if anything is invalid (as QEMU's controller does).
    fn enable(&mut self, cc: Cc) {
        match self.check_enable(cc) {
            Ok(()) => {
                self.state = State::Running;
                self.set_csts(CSTS_RDY);
                log::debug!("controller enabled: page size {}, CC {cc:?}", self.page);
            }
            Err(why) => {
                self.state = State::Failed;
                self.set_csts(CSTS_CFS);
                log::warn!("CC.EN = 1 refused ({why}): CSTS.CFS set");
            }
        }
    }

    fn check_enable(&mut self, cc: Cc) -> Result<(), String> {
        let page = cc.page_size() as u64;
        if page > 4096 << self.cfg.mps_max {
            return Err(format!("CC.MPS page size {page} is over CAP.MPSMAX"));
        }
        match cc_css(cc) {
            CSS_NVM | CSS_ALL_IOCS | CSS_ADMIN_ONLY => {}
            css => return Err(format!("CC.CSS {css:#05b} is reserved (000b, 110b or 111b)")),
        }
        if cc_ams(cc) != 0 {
            return Err(format!("CC.AMS {} is not round robin", cc_ams(cc)));
        }
        if cc_iosqes(cc) != 6 || cc_iocqes(cc) != 4 {
            return Err(format!(
                "CC.IOSQES/IOCQES {}/{} are not 6/4",
                cc_iosqes(cc),
                cc_iocqes(cc)
            ));
        }
        let aqa = self.bar.read32(off::AQA);
        let (sq_size, cq_size) = ((aqa & 0xfff) + 1, ((aqa >> 16) & 0xfff) + 1);
        if sq_size < 2 || cq_size < 2 {
            return Err(format!("AQA {aqa:#x}: admin queues need at least 2 entries"));
        }
        let (asq, acq) = (self.bar.read64(off::ASQ), self.bar.read64(off::ACQ));
        if asq % page != 0 || acq % page != 0 {
            return Err(format!("ASQ {asq:#x} or ACQ {acq:#x} is not page aligned"));
        }
        self.mem
            .check(asq, (sq_size as u64 * SQE_SIZE) as usize)
            .map_err(|e| format!("ASQ: {e}"))?;
        self.mem
            .check(acq, (cq_size as u64 * CQE_SIZE) as usize)
            .map_err(|e| format!("ACQ: {e}"))?;
        self.page = page;
        self.css = cc_css(cc);
        let mut cq = Cq::new(acq, cq_size);
        cq.sqs = 1;
        self.cqs[0] = Some(cq);
        self.sqs[0] = Some(Sq::new(asq, sq_size, 0));
        self.active_sqs.push(0);
        self.active_cqs.push(0);
        Ok(())
    }

    /// Controller Level Reset (§3.7.2): deletes all queues, forgets outstanding commands and
    /// Doorbell Buffer Config, restores feature defaults, zeroes the doorbells, clears CSTS.
    /// Namespace contents, logs and statistics survive.
    fn reset(&mut self) {
        self.sqs.iter_mut().for_each(|q| *q = None);
        self.cqs.iter_mut().for_each(|q| *q = None);
        self.active_sqs.clear();
        self.active_cqs.clear();
        self.delayed.clear();
        self.lost.clear();
        self.events.reset();
        self.dbbuf = None;
        self.default_features();
        for at in (off::DOORBELLS..self.bar.len()).step_by(4) {
            self.bar.write32(at, 0);
        }
        self.state = State::Disabled;
        self.set_csts(0);
    }

    /// A PCI function reset (FLR through VFIO): the controller as after power-on, registers
    /// included (CC, AQA, ASQ, ACQ zeroed; CAP and VS kept), a hang ended.
    fn function_reset(&mut self) {
        self.reset();
        for reg in [off::CC, off::AQA, off::INTMS] {
            self.bar.write32(reg, 0);
        }
        self.bar.write64(off::ASQ, 0);
        self.bar.write64(off::ACQ, 0);
        self.cc = Cc(0);
        self.shared.resets[1].fetch_add(1, Ordering::Relaxed);
        log::debug!("function reset");
    }

    pub(crate) fn default_features(&mut self) {
        self.features = self.cfg.feature_defaults();
        self.nq = (self.cfg.max_io_queue_pairs, self.cfg.max_io_queue_pairs);
    }

    /// Sets CSTS.CFS and stops processing (§9.5: controller fatal status).
    pub(crate) fn fail(&mut self, why: std::fmt::Arguments<'_>) {
        log::error!("controller fatal status: {why}");
        self.state = State::Failed;
        self.set_csts(self.csts() | CSTS_CFS);
    }

    // ---- Doorbells (NVMe over PCIe 1.0 §3.1.2; shadow doorbells: NVMe Base 2.0 §5.8) ----

    /// Offset of a doorbell from the start of the doorbell area (also its offset in the shadow
    /// doorbell and EventIdx buffers).
    pub(crate) fn db_index(&self, qid: u16, cq: bool) -> u64 {
        ((2 * qid as usize + cq as usize) * self.stride) as u64
    }

    /// Reads the MMIO doorbell and, for I/O queues once Doorbell Buffer Config is in use, the
    /// shadow doorbell of a queue. Returns the new value if the one in force changed. The host
    /// must update the shadow doorbell of an I/O queue on every change (it may also write the
    /// MMIO register, which then only counts in the statistics); admin queue doorbells are
    /// always taken from MMIO (the Linux and SPDK convention).
    fn read_doorbell(&mut self, qid: u16, cq: bool) -> Option<u32> {
        let index = self.db_index(qid, cq);
        let mmio = self.bar.read32(off::DOORBELLS + index as usize);
        let shadow = match self.dbbuf {
            Some(db) if qid != 0 => match self.mem.read_u32(db.shadow + index) {
                Ok(v) => Some(v),
                Err(e) => {
                    self.fail(format_args!("shadow doorbell buffer: {e}"));
                    return None;
                }
            },
            _ => None,
        };
        let stats = &self.shared.stats;
        let (last_mmio, last_shadow) = match cq {
            false => self.sqs[qid as usize]
                .as_mut()
                .map(|q| (&mut q.mmio_db, &mut q.shadow_db))?,
            true => self.cqs[qid as usize]
                .as_mut()
                .map(|q| (&mut q.mmio_db, &mut q.shadow_db))?,
        };
        let mut new = None;
        if mmio != *last_mmio {
            *last_mmio = mmio;
            bump(&stats.mmio_doorbell_writes);
            new = Some(mmio);
        }
        if let Some(s) = shadow {
            new = None;
            if s != *last_shadow {
                *last_shadow = s;
                bump(&stats.shadow_doorbell_updates);
                new = Some(s);
            }
        }
        // What the host wrote before the doorbell (entries, consumed slots) is read after it.
        fence(Ordering::Acquire);
        new
    }

    /// Writes the EventIdx entry of a queue whose doorbell just moved to `value` (§5.8).
    pub(crate) fn write_eventidx(&mut self, qid: u16, cq: bool, value: u32, size: u32) {
        let Some(db) = self.dbbuf else { return };
        if qid == 0 {
            return;
        }
        let idx = self.cfg.event_idx.index(value, size);
        if let Err(e) = self.mem.write_u32(db.eventidx + self.db_index(qid, cq), idx) {
            self.fail(format_args!("EventIdx buffer: {e}"));
        }
    }

    /// Takes a new SQ tail from the doorbells. Returns whether it moved.
    fn refresh_sq_tail(&mut self, qid: u16) -> bool {
        let Some(tail) = self.read_doorbell(qid, false) else {
            return false;
        };
        let Some(sq) = self.sqs[qid as usize].as_mut() else {
            return false;
        };
        if tail >= sq.size {
            // §4.1: an invalid doorbell value; a real controller may post an asynchronous event.
            log::warn!(
                "SQ {qid} tail doorbell {tail} is not below the queue size {}: ignored",
                sq.size
            );
            return false;
        }
        sq.tail = tail;
        let size = sq.size;
        self.write_eventidx(qid, false, tail, size);
        true
    }

    /// Takes a new CQ head from the doorbells. Returns whether it moved.
    fn refresh_cq_head(&mut self, qid: u16) -> bool {
        let Some(head) = self.read_doorbell(qid, true) else {
            return false;
        };
        let Some(cq) = self.cqs[qid as usize].as_mut() else {
            return false;
        };
        let n = cq.size;
        // The head may only move forward, and not past the entries posted so far.
        if head >= n || (head + n - cq.head) % n > (cq.tail + n - cq.head) % n {
            log::warn!(
                "CQ {qid} head doorbell {head} is outside the posted entries (head {}, tail {}): ignored",
                cq.head,
                cq.tail
            );
            return false;
        }
        cq.head = head;
        self.write_eventidx(qid, true, head, n);
        true
    }

    // ---- Arbitration and command processing (§3.4.4: round robin) ----

    /// Commands taken from one SQ per round: the Arbitration Burst of feature 01h.
    fn burst(&self) -> u32 {
        match self.features[0x01] & 0x7 {
            0x7 => u32::MAX,
            ab => 1 << ab,
        }
    }

    /// One round: CQ heads and waiting completions first, then up to a burst of commands from
    /// each SQ, starting one queue further each round.
    fn poll_queues(&mut self) -> bool {
        let mut busy = false;
        let mut i = 0;
        while let Some(&qid) = self.active_cqs.get(i) {
            busy |= self.refresh_cq_head(qid);
            busy |= self.drain_backlog(qid);
            i += 1;
        }
        let n = self.active_sqs.len();
        for k in 0..n {
            if self.state != State::Running {
                break;
            }
            let len = self.active_sqs.len();
            if len == 0 {
                break;
            }
            let qid = self.active_sqs[(self.rr + k) % len];
            busy |= self.service_sq(qid);
        }
        self.rr = self.rr.wrapping_add(1);
        busy
    }

    fn service_sq(&mut self, qid: u16) -> bool {
        let mut busy = self.refresh_sq_tail(qid);
        for _ in 0..self.burst() {
            let Some(sq) = self.sqs[qid as usize].as_ref() else {
                break;
            };
            if sq.is_empty() || self.state != State::Running {
                break;
            }
            let cqid = sq.cqid;
            if !self.cq_has_room(cqid) {
                self.refresh_cq_head(cqid);
                if !self.cq_has_room(cqid) {
                    break;
                }
            }
            self.fetch(qid, cqid);
            busy = true;
        }
        busy
    }

    fn cq_has_room(&self, cqid: u16) -> bool {
        self.cqs[cqid as usize].as_ref().is_some_and(Cq::has_room)
    }

    /// Fetches, executes and completes the command at the head of SQ `qid`.
    fn fetch(&mut self, qid: u16, cqid: u16) {
        let Some(sq) = self.sqs[qid as usize].as_mut() else {
            return;
        };
        let addr = sq.head_addr();
        let mut raw = [0u8; SQE_SIZE as usize];
        if let Err(e) = self.mem.read(addr, &mut raw) {
            self.fail(format_args!("SQ {qid} entry: {e}"));
            return;
        }
        sq.advance();
        let head = sq.head as u16;
        let cmd = Command::from_le_bytes(&raw);
        let op = cmd.opcode();
        let stats = &self.shared.stats;
        bump(if qid == 0 {
            &stats.admin[op as usize]
        } else {
            &stats.io[op as usize]
        });
        let fault = self.take_fault(qid, op);
        let outcome = match fault {
            Some(FaultKind::ControllerFatal) => {
                self.fail(format_args!(
                    "injected fault on SQ {qid} command {:#06x}",
                    cmd.cid()
                ));
                return;
            }
            Some(FaultKind::Status(s)) => Outcome::Done(s, 0),
            _ if qid == 0 => self.admin(&cmd),
            _ => self.io(&cmd),
        };
        let Outcome::Done(status, result) = outcome else {
            return;
        };
        if !status.is_success() {
            let lba = if qid != 0 { cmd.slba() } else { 0 };
            self.record_error(qid, cmd.cid(), status, lba, cmd.nsid());
            log::debug!(
                "SQ {qid} command {:#06x} (opcode {op:#04x}) failed: {status}",
                cmd.cid()
            );
        }
        let mut c = Completion {
            dw0: result as u32,
            dw1: (result >> 32) as u32,
            sqid: qid,
            cid: cmd.cid(),
            orig_cid: cmd.cid(),
            status,
            mode: PostMode::Normal,
            sq_head: head,
        };
        let mut delay = if qid == 0 {
            None
        } else {
            self.cfg.completion_latency
        };
        match fault {
            Some(FaultKind::Delay(d)) => delay = Some(d),
            Some(FaultKind::Drop) => {
                self.lost.push((cqid, c));
                return;
            }
            Some(FaultKind::BogusCid(cid)) => c.cid = cid,
            Some(FaultKind::WrongPhase) => c.mode = PostMode::WrongPhase,
            Some(FaultKind::Duplicate) => c.mode = PostMode::Duplicate,
            _ => {}
        }
        match delay {
            Some(d) => self.schedule(cqid, c, Instant::now() + d),
            None => self.post(cqid, c),
        }
    }

    /// The fault for a command just fetched. Faults injected before the host rang the doorbell
    /// are seen here: the doorbell read is followed by an acquire fence, and the generation
    /// counter is bumped with release ordering.
    fn take_fault(&mut self, qid: u16, op: u8) -> Option<FaultKind> {
        let generation = self.shared.fault_gen.load(Ordering::Acquire);
        if generation != self.fault_gen {
            self.fault_gen = generation;
            let mut inbox = self.shared.faults.lock().unwrap_or_else(|e| e.into_inner());
            if std::mem::take(&mut inbox.clear) {
                self.faults.clear();
            }
            self.faults.arm(inbox.new.drain(..));
            self.shared.armed.store(self.faults.len(), Ordering::Release);
        }
        let kind = self.faults.take(qid, op)?;
        bump(&self.shared.stats.faults_applied);
        self.shared.armed.store(self.faults.len(), Ordering::Release);
        log::debug!("fault {kind:?} applied to SQ {qid} opcode {op:#04x}");
        Some(kind)
    }

    /// Counts an error completion and adds it to the Error Information log.
    fn record_error(&mut self, sqid: u16, cid: u16, status: Status, lba: u64, nsid: u32) {
        bump(&self.shared.stats.errors);
        self.error_count += 1;
        self.errors[(self.error_count as usize - 1) % ERROR_LOG_ENTRIES] = ErrorEntry {
            count: self.error_count,
            sqid,
            cid,
            status,
            lba,
            nsid,
        };
    }

    // ---- Completions (§4.2, §3.3.1.2: a full CQ is never overwritten) ----

    fn schedule(&mut self, cqid: u16, c: Completion, due: Instant) {
        if let Some(cq) = self.cqs[cqid as usize].as_mut() {
            cq.owed += 1;
        }
        self.seq += 1;
        self.delayed.push(Delayed {
            due,
            seq: self.seq,
            cqid,
            c,
        });
    }

    /// Posts the held-back completions that are due. Returns whether there were any.
    fn post_due(&mut self, now: Instant) -> bool {
        let mut any = false;
        while self.delayed.peek().is_some_and(|d| d.due <= now) {
            let d = self.delayed.pop().expect("peeked");
            if let Some(cq) = self.cqs[d.cqid as usize].as_mut() {
                cq.owed -= 1;
            }
            self.post(d.cqid, d.c);
            any = true;
        }
        any
    }

    /// Posts a completion, or queues it behind others waiting for room.
    pub(crate) fn post(&mut self, cqid: u16, c: Completion) {
        let Some(cq) = self.cqs[cqid as usize].as_mut() else {
            log::debug!("completion for deleted CQ {cqid} discarded");
            return;
        };
        if cq.stalled || !cq.backlog.is_empty() || cq.free() == 0 {
            cq.backlog.push_back(c);
            return;
        }
        self.write_entry(cqid, c);
    }

    /// Writes a completion into the tail slot of a CQ that has room and is not stalled.
    fn write_entry(&mut self, cqid: u16, c: Completion) {
        let sq_head = match self.sqs[c.sqid as usize].as_ref() {
            Some(sq) => sq.head as u16,
            None => c.sq_head,
        };
        let Some(cq) = self.cqs[cqid as usize].as_mut() else {
            return;
        };
        let phase = cq.phase ^ (c.mode == PostMode::WrongPhase);
        if let Err(e) = self.mem.write_cqe(cq.tail_addr(), cqe_dwords(&c, sq_head, phase)) {
            self.fail(format_args!("CQ {cqid} entry: {e}"));
            return;
        }
        bump(&self.shared.stats.completions_posted);
        match c.mode {
            PostMode::WrongPhase => {
                cq.stalled = true;
                log::debug!("CQ {cqid} stalled behind a wrong-phase entry (injected)");
            }
            PostMode::Normal => {
                cq.advance();
                cq.interrupt();
            }
            PostMode::Duplicate => {
                cq.advance();
                cq.interrupt();
                // The copy goes next: at once if there is room, else first in line.
                let again = Completion {
                    mode: PostMode::Normal,
                    ..c
                };
                if cq.free() == 0 {
                    cq.backlog.push_front(again);
                } else {
                    self.write_entry(cqid, again);
                }
            }
        }
    }

    /// Posts waiting completions while the CQ has room. Returns whether any was posted.
    fn drain_backlog(&mut self, cqid: u16) -> bool {
        let mut any = false;
        loop {
            let Some(cq) = self.cqs[cqid as usize].as_mut() else {
                return any;
            };
            if cq.stalled || cq.free() == 0 {
                return any;
            }
            let Some(c) = cq.backlog.pop_front() else {
                return any;
            };
            self.write_entry(cqid, c);
            any = true;
        }
    }

    /// Completes, with `status`, the outstanding (delayed or dropped) commands that `pick`
    /// selects, oldest first. Returns how many there were.
    pub(crate) fn complete_outstanding(
        &mut self,
        status: Status,
        pick: impl Fn(&Completion) -> bool,
    ) -> usize {
        let mut found: Vec<(u64, u16, Completion)> = Vec::new();
        self.delayed.retain(|d| {
            let hit = pick(&d.c);
            if hit {
                found.push((d.seq, d.cqid, d.c));
            }
            !hit
        });
        for &(_, cqid, _) in &found {
            if let Some(cq) = self.cqs[cqid as usize].as_mut() {
                cq.owed -= 1;
            }
        }
        found.sort_by_key(|f| f.0);
        let mut i = 0;
        while i < self.lost.len() {
            if pick(&self.lost[i].1) {
                let (cqid, c) = self.lost.remove(i);
                found.push((0, cqid, c));
            } else {
                i += 1;
            }
        }
        let n = found.len();
        for (_, cqid, c) in found {
            let c = Completion {
                status,
                dw0: 0,
                dw1: 0,
                cid: c.orig_cid,
                mode: PostMode::Normal,
                ..c
            };
            self.record_error(c.sqid, c.cid, status, 0, 0);
            self.post(cqid, c);
        }
        n
    }

    /// Completes held Asynchronous Event Requests for the events waiting (§5.2).
    pub(crate) fn deliver_events(&mut self) {
        while let Some((cid, dw0)) = self.events.next() {
            let c = Completion {
                dw0,
                dw1: 0,
                sqid: 0,
                cid,
                orig_cid: cid,
                status: Status::SUCCESS,
                mode: PostMode::Normal,
                sq_head: 0,
            };
            self.post(0, c);
        }
    }

    /// A namespace's Identify data changed: lists it in the Changed Namespace List and, if
    /// Asynchronous Event Configuration bit 8 allows, raises Namespace Attribute Changed.
    pub(crate) fn namespace_changed(&mut self, nsid: u32) {
        let notify =
            self.features[vfpoll_nvme_spec::cmd::feature::ASYNC_EVENT_CONFIG as usize] & AEC_NS_ATTR != 0;
        self.events.namespace_changed(nsid, notify);
        if self.state == State::Running {
            self.deliver_events();
        }
    }

    /// Reports the namespaces the handle changed.
    fn take_ns_changes(&mut self) {
        self.shared.ns_changed.store(false, Ordering::Relaxed);
        let changed = std::mem::take(&mut *self.shared.ns_changes.lock().unwrap_or_else(|e| e.into_inner()));
        for nsid in changed {
            self.namespace_changed(nsid);
        }
    }

    /// Makes room for `n` more delayed completions, so scheduling one never allocates
    /// (called when a submission queue of `n` entries is created).
    pub(crate) fn reserve_in_flight(&mut self, n: usize) {
        self.delayed.reserve(n);
    }

    /// Whether a namespace with this ID exists; its index in `ns`.
    pub(crate) fn ns_index(&self, nsid: u32) -> Option<usize> {
        self.ns.binary_search_by_key(&nsid, |n| n.nsid).ok()
    }

    /// Number of Namespaces (NN): the largest NSID.
    pub(crate) fn nn(&self) -> u32 {
        self.ns.last().map_or(0, |n| n.nsid)
    }
}

/// Takes one from a fault counter; true if there was one.
fn take_one(n: &AtomicU32) -> bool {
    n.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| v.checked_sub(1))
        .is_ok()
}

/// Marks the controller fatal if its thread panics, so a host polling CSTS notices at once.
pub(crate) struct PanicGuard(pub(crate) Mmio);

impl Drop for PanicGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let csts = self.0.read32(off::CSTS);
            self.0.write32(off::CSTS, csts | CSTS_CFS);
        }
    }
}
