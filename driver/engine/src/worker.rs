//! One pinned worker thread: its queue pairs, its buffers, its histograms, its hot loop.
//!
//! The hot loop touches only what this thread owns: queue pairs (`&mut`, no lock), slot
//! buffers, the slot table and the histograms. It reads the clock once per batch of
//! completions, and looks at the control channel and publishes its progress counters only every
//! [`CONTROL_EVERY`] rounds.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, TryRecvError};
use std::ops::Range;

use vfpoll_nvme::{Controller, NvmeError, QpairOptions, QpairStats, QueuePair};

use crate::affinity::pin_current;
use crate::breakdown::{Off, On, Stamps};
use crate::clock::Clock;
use crate::job::{JobSpec, Target, WorkerSpec};
use crate::layout::{largest_buffer, IoLayout};
use crate::pattern;
use crate::report::{
    Mismatch, OpStats, QueueReport, VerifyReport, WorkerReport, ZoneReport, MAX_ERROR_SAMPLES,
};
use crate::slots::{PoolSlots, RegionSlots, Slots};
use crate::workload::{mix64, Cursor, Rng};
use crate::zoned::{self, ZoneCmd, ZoneGeom, ZoneWriter, ZONE_TAG};
use crate::EngineError;

/// Rounds of the hot loop between two looks at the control channel.
const CONTROL_EVERY: u32 = 256;
/// Longest sleep of an interrupt-mode worker before it polls again on its own.
const IRQ_WAIT_LIMIT: std::time::Duration = std::time::Duration::from_millis(10);

/// Main thread → worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Control {
    /// Begin I/O.
    Start,
    /// The warm-up is over: count from zero from here on.
    Measure,
    /// Submit nothing more; finish what is in flight and report.
    Stop,
    /// Set-up failed elsewhere: tear down without running.
    Abort,
}

/// Worker → main thread.
#[derive(Debug)]
pub(crate) enum Event {
    /// Set up (pinned, queue pairs and buffers made); waiting for `Start`.
    Ready,
    /// Set-up failed, or the worker panicked.
    Failed { worker: usize, error: EngineError },
    /// Finished; its report.
    Done(Box<WorkerReport>),
}

/// Progress counters of one worker, read by the main thread (own cache lines: the worker
/// stores, nobody else does).
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Counters {
    pub ios: AtomicU64,
    pub bytes: AtomicU64,
}

/// Everything a worker thread starts with.
pub(crate) struct Setup {
    pub index: usize,
    pub spec: WorkerSpec,
    pub job: Arc<JobSpec>,
    pub clock: Clock,
    pub control: Receiver<Control>,
    pub events: Sender<Event>,
    pub counters: Arc<Counters>,
    /// Submission quota of each of `spec.targets` (`u64::MAX`: until stopped).
    pub quotas: Vec<u64>,
    /// Zones each of `spec.targets` writes at once (0: not a zoned range the job writes).
    pub lanes: Vec<u32>,
}

/// The worker thread's body.
pub(crate) fn main(s: Setup) {
    let events = s.events.clone();
    let index = s.index;
    let page = s.job.buffer_page.bytes() as usize;
    let largest = match largest_buffer(&s.job, &s.spec) {
        Ok(b) => b,
        Err(error) => {
            let _ = events.send(Event::Failed { worker: index, error });
            return;
        }
    };
    let buffer_fits_page = largest <= page;
    // The breakdown's stamps are a type parameter: without it the hot loop has none.
    let r = catch_unwind(AssertUnwindSafe(move || {
        match (buffer_fits_page, s.job.breakdown) {
            (true, false) => run::<PoolSlots, Off>(s),
            (false, false) => run::<RegionSlots, Off>(s),
            (true, true) => run::<PoolSlots, On>(s),
            (false, true) => run::<RegionSlots, On>(s),
        }
    }));
    if let Err(p) = r {
        let message = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(no message)".into());
        let _ = events.send(Event::Failed {
            worker: index,
            error: EngineError::Panicked {
                worker: index,
                message,
            },
        });
    }
}

fn run<S: Slots, T: Stamps>(s: Setup) {
    let fail = |error| {
        let _ = s.events.send(Event::Failed {
            worker: s.index,
            error,
        });
    };
    if let Some(core) = s.spec.core {
        if let Err(e) = pin_current(core) {
            return fail(e);
        }
    }
    let mut queues = match build::<S, T>(&s) {
        Ok(q) => q,
        Err(e) => return fail(e),
    };
    if s.events.send(Event::Ready).is_err() {
        return;
    }
    match s.control.recv() {
        Ok(Control::Start) => {}
        _ => return,
    }
    let mut st = State::new(&s);
    let elapsed = hot_loop(&mut queues, &mut st, &s.control, &s.counters);
    let report = WorkerReport {
        worker: s.index,
        core: s.spec.core,
        elapsed,
        queues: queues.iter().map(|q| q.report(&st.clock)).collect(),
        read: st.read,
        write: st.write,
        errors: st.errors,
        error_samples: st.error_samples,
        verify: st.verify,
        breakdown: queues
            .iter()
            .filter_map(|q| q.stamps.report())
            .reduce(|mut a, b| {
                a.merge(&b);
                a
            }),
    };
    // Delete the queue pairs (admin commands) before reporting, so the run's end is clean.
    drop(queues);
    let _ = s.events.send(Event::Done(Box::new(report)));
}

/// What the hot loop shares between the worker's queues.
struct State {
    clock: Clock,
    rng: Rng,
    read_pct: u8,
    io_size: usize,
    /// The pattern seed when verifying.
    verify_seed: Option<u64>,
    read: OpStats,
    write: OpStats,
    errors: u64,
    error_samples: Vec<String>,
    verify: Option<VerifyReport>,
}

impl State {
    fn new(s: &Setup) -> Self {
        let j = &s.job;
        State {
            clock: s.clock,
            rng: Rng::new(mix64(j.seed ^ (s.index as u64).wrapping_mul(0x1000_0000_01b3))),
            read_pct: j.workload.read_percent(j.rwmix_read),
            io_size: j.io_size,
            verify_seed: j.verify.then_some(j.seed),
            read: OpStats::default(),
            write: OpStats::default(),
            errors: 0,
            error_samples: Vec::new(),
            verify: j.verify.then(VerifyReport::default),
        }
    }

    /// The end of the warm-up: the measured window's statistics start empty (errors stay).
    #[cold]
    fn restart_counts(&mut self) {
        self.read = OpStats::default();
        self.write = OpStats::default();
    }

    #[cold]
    fn error(&mut self, msg: impl FnOnce() -> String) {
        self.errors += 1;
        if self.error_samples.len() < MAX_ERROR_SAMPLES {
            self.error_samples.push(msg());
        }
    }

    /// Read or write, by the mix.
    #[inline]
    fn pick_write(&mut self) -> bool {
        match self.read_pct {
            100 => false,
            0 => true,
            p => !self.rng.percent(p),
        }
    }
}

fn hot_loop<S: Slots, T: Stamps>(
    queues: &mut [Queue<S, T>],
    st: &mut State,
    control: &Receiver<Control>,
    counters: &Counters,
) -> Duration {
    let mut start = st.clock.ticks();
    for q in queues.iter_mut() {
        q.last_done = start;
        q.refill(start, st);
        q.qp.flush_submissions();
        q.stamps.rang();
    }
    let mut round = 0u32;
    // The warm-up's I/Os and bytes: the published progress counts on through the warm-up's end.
    let (mut warm_ios, mut warm_bytes) = (0, 0);
    loop {
        let mut active = false;
        for q in queues.iter_mut() {
            active |= q.step(st);
        }
        if !active {
            break;
        }
        round = round.wrapping_add(1);
        if round.is_multiple_of(CONTROL_EVERY) {
            counters
                .ios
                .store(warm_ios + st.read.ios + st.write.ios, Ordering::Relaxed);
            counters
                .bytes
                .store(warm_bytes + st.read.bytes + st.write.bytes, Ordering::Relaxed);
            match control.try_recv() {
                Err(TryRecvError::Empty) | Ok(Control::Start) => {}
                Ok(Control::Measure) => {
                    warm_ios += st.read.ios + st.write.ios;
                    warm_bytes += st.read.bytes + st.write.bytes;
                    start = st.clock.ticks();
                    st.restart_counts();
                    queues.iter_mut().for_each(|q| q.restart_counts(start, &st.clock));
                }
                Ok(Control::Stop | Control::Abort) | Err(TryRecvError::Disconnected) => {
                    queues.iter_mut().for_each(Queue::stop)
                }
            }
        }
    }
    let end = st.clock.ticks();
    counters
        .ios
        .store(warm_ios + st.read.ios + st.write.ios, Ordering::Relaxed);
    counters
        .bytes
        .store(warm_bytes + st.read.bytes + st.write.bytes, Ordering::Relaxed);
    Duration::from_nanos(st.clock.ns(end.wrapping_sub(start)))
}

/// One in-flight slot.
#[derive(Debug, Clone, Copy, Default)]
struct SlotMeta {
    submitted: u64,
    lba: u64,
    ns: u16,
    /// The zone lane of a write to a zoned namespace.
    lane: u16,
    write: bool,
    failed: bool,
    lost: bool,
    /// A controller reset interrupted it: issue it again (same operation, LBA and data).
    again: bool,
}

/// One namespace range on a queue pair.
struct NsState {
    nsid: u32,
    /// Bytes per block in the data buffer (data, plus metadata for an extended LBA).
    block_bytes: usize,
    /// Bytes per block in the separate metadata buffer (0: none).
    meta_bytes: usize,
    /// Bytes of each block (data buffer) and of each block's metadata (separate buffer) that
    /// the controller writes itself (its protection information), not checked by verify.
    data_skip: Option<Range<usize>>,
    meta_skip: Option<Range<usize>>,
    io_blocks: u64,
    first_lba: u64,
    units: u64,
    /// Where units lie in a zoned range (`None`: one after the other).
    zone: Option<ZoneGeom>,
    /// The zones being written, while a zoned range is written.
    writer: Option<ZoneWriter>,
    /// What was done to the zones of a zoned range.
    zone_report: Option<ZoneReport>,
    cursor: Cursor,
    /// Submissions left in this pass (`u64::MAX`: until stopped).
    left: u64,
    seed: u64,
}

impl NsState {
    /// The first LBA of I/O unit `unit` of the range.
    #[inline]
    fn lba_of(&self, unit: u64) -> u64 {
        self.first_lba
            + match &self.zone {
                None => unit * self.io_blocks,
                Some(g) => g.offset(unit, self.io_blocks),
            }
    }

    /// Whether an I/O can be submitted now.
    #[inline]
    fn ready(&self) -> bool {
        self.left > 0 && self.writer.as_ref().is_none_or(ZoneWriter::can_write)
    }

    /// Whether I/O is still to be submitted (now, or once zone commands complete).
    fn has_work(&self) -> bool {
        self.left > 0 && self.writer.as_ref().is_none_or(ZoneWriter::live)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// A perf run.
    Run,
    /// Verify: writing the pattern.
    VerifyWrite,
    /// Verify: reading back.
    VerifyRead,
}

/// One queue pair of the worker (one per controller), with its slots.
struct Queue<S: Slots, T: Stamps> {
    // Declared first: dropped (queues deleted on the controller) before the buffers.
    qp: QueuePair<S::Buf>,
    slots: S,
    /// Separate metadata buffers, when the namespaces' format has them.
    mslots: Option<S>,
    /// Verify: one I/O's data and metadata, copied out or to be copied in.
    scratch: Vec<u8>,
    mscratch: Vec<u8>,
    meta: Box<[SlotMeta]>,
    /// Slots whose completions came in this poll.
    ready: Vec<u32>,
    /// Zone commands (by tag, with the error of a failed one) whose completions came in this
    /// poll.
    zone_done: Vec<(u64, Option<NvmeError>)>,
    /// Zone commands in flight.
    zone_cmds: u32,
    /// Slots in hand, not submitted.
    free: Vec<u32>,
    ns: Vec<NsState>,
    next_ns: usize,
    inflight: u32,
    phase: Phase,
    /// A submission was refused or a buffer was lost: submit nothing more.
    broken: bool,
    ios: u64,
    /// Polls, and those that found no completion (how long the worker waited on the device).
    polls: u64,
    empty_polls: u64,
    /// Clock ticks of the last poll that found completions (or of the first submission), and
    /// the longest gap between two such polls.
    last_done: u64,
    max_gap: u64,
    /// I/Os issued again after a controller reset.
    reissued: u64,
    device: String,
    /// Interrupt mode (`CompletionMode::Irq`/`Hybrid`): an empty poll with commands in flight
    /// sleeps in `QueuePair::wait` instead of polling again.
    sleepy: bool,
    /// The latency breakdown's stamps (`Off`: none).
    stamps: T,
    /// The queue pair's counters when the warm-up ended (zero without one).
    stats_base: QpairStats,
}

fn build<S: Slots, T: Stamps>(s: &Setup) -> Result<Vec<Queue<S, T>>, EngineError> {
    let job = &s.job;
    let qd = job.queue_depth as usize;
    // One queue pair per controller: group the targets by controller.
    let mut groups: Vec<Vec<(usize, &Target)>> = Vec::new();
    for (i, t) in s.spec.targets.iter().enumerate() {
        match groups.iter_mut().find(|g| same_controller(&g[0].1.ctrl, &t.ctrl)) {
            Some(g) => g.push((i, t)),
            None => groups.push(vec![(i, t)]),
        }
    }
    if groups.len() > 1 && job.qpair.completion.interrupts() {
        return Err(EngineError::Invalid(format!(
            "in interrupt mode a worker sleeps on one queue pair, but this one drives {} controllers: \
             give each worker one controller (more cores), or poll",
            groups.len()
        )));
    }
    let mut queues = Vec::new();
    for (gi, g) in groups.iter().enumerate() {
        let ctrl = &g[0].1.ctrl;
        let device = g[0].1.device.clone();
        let nvme = |source| EngineError::Nvme {
            device: device.clone(),
            source,
        };
        // Zones written at once in this queue pair: each may have a zone command in flight
        // besides the slots' I/O. A queue pair that writes zones never splits a request (the
        // parts would be writes in flight together to one zone).
        let lanes: u32 = g.iter().map(|&(ti, _)| s.lanes[ti]).sum();
        let opts = QpairOptions {
            entries: queue_entries(job, ctrl, lanes as usize)?,
            split: job.qpair.split && lanes == 0,
            ..job.qpair.clone()
        };
        let mut qp = ctrl.create_qpair::<S::Buf>(&opts).map_err(nvme)?;
        let mut ns = Vec::new();
        let mut lens: Option<(usize, usize)> = None;
        for (k, &(ti, t)) in g.iter().enumerate() {
            let n = ctrl.namespace(t.nsid).map_err(nvme)?;
            let io = IoLayout::of(job, &device, &n)?;
            let write_zones = s.lanes[ti] != 0;
            if write_zones {
                let one = zoned::one_command(qp.max_transfer(), io.block_bytes);
                if io.data_len > one {
                    return Err(EngineError::Invalid(format!(
                        "{device} namespace {}: an I/O of {} bytes takes more than one command (at most {one} bytes each here): on a zoned namespace each write must be one command, so that writes reach a zone in order; use an I/O size of at most {one} bytes",
                        t.nsid, job.io_size
                    )));
                }
            }
            match lens {
                None => lens = Some((io.data_len, io.meta_len)),
                Some(l) if l != (io.data_len, io.meta_len) => {
                    return Err(EngineError::Invalid(format!(
                        "{device}: namespaces {} move {} + {} bytes per I/O of {} bytes, but namespace {} moves {} + {}: their formats differ; run them in separate runs",
                        g[0].1.nsid, l.0, l.1, job.io_size, t.nsid, io.data_len, io.meta_len
                    )))
                }
                Some(_) => {}
            }
            let io_blocks = (job.io_size / n.lba_size) as u64;
            let mut units = (t.lbas.end - t.lbas.start) / io_blocks;
            let (mut zone, mut writer, mut zone_report) = (None, None, None);
            if n.zoned.is_some() {
                let p = zoned::prepare::<S>(
                    &mut qp,
                    ctrl,
                    job.buffer_page,
                    opts.timeout,
                    &device,
                    &n,
                    t.lbas.clone(),
                    io_blocks,
                    zoned::writes(job),
                )?;
                units = p.zones * p.geom.per_zone;
                zone = Some(p.geom);
                if write_zones {
                    writer = Some(ZoneWriter::new(
                        p.zones,
                        p.geom.per_zone,
                        p.finish,
                        !job.verify,
                        s.lanes[ti],
                    ));
                }
                zone_report = Some(ZoneReport {
                    nsid: t.nsid,
                    zones: p.zones,
                    ios_per_zone: p.geom.per_zone,
                    at_once: s.lanes[ti],
                    resets: p.resets,
                    finishes: 0,
                });
            }
            let seed = mix64(job.seed ^ ((s.index as u64) << 40) ^ ((gi as u64) << 20) ^ k as u64);
            let left = if job.verify { units } else { s.quotas[ti] };
            ns.push(NsState {
                nsid: t.nsid,
                block_bytes: io.block_bytes,
                meta_bytes: io.meta_bytes,
                data_skip: io.data_skip,
                meta_skip: io.meta_skip,
                io_blocks,
                first_lba: t.lbas.start,
                units,
                zone,
                writer,
                zone_report,
                cursor: Cursor::new(units, job.workload.random(), job.verify, seed),
                left,
                seed,
            });
        }
        let (data_len, meta_len) = lens.expect("a group has a target");
        let dma_err = |source| EngineError::Dma {
            device: device.clone(),
            source,
        };
        let slots = S::new(ctrl.dma(), data_len, qd, job.buffer_page).map_err(dma_err)?;
        let mslots = match meta_len {
            0 => None,
            m => Some(S::new(ctrl.dma(), m, qd, job.buffer_page).map_err(dma_err)?),
        };
        queues.push(Queue {
            qp,
            slots,
            mslots,
            scratch: if job.verify { vec![0; data_len] } else { Vec::new() },
            mscratch: if job.verify { vec![0; meta_len] } else { Vec::new() },
            meta: vec![SlotMeta::default(); qd].into_boxed_slice(),
            ready: Vec::with_capacity(qd),
            zone_done: Vec::with_capacity(lanes as usize),
            zone_cmds: 0,
            free: (0..qd as u32).rev().collect(),
            ns,
            next_ns: 0,
            inflight: 0,
            phase: if job.verify {
                Phase::VerifyWrite
            } else {
                Phase::Run
            },
            broken: false,
            ios: 0,
            polls: 0,
            empty_polls: 0,
            last_done: 0,
            max_gap: 0,
            reissued: 0,
            device,
            sleepy: job.qpair.completion.interrupts(),
            stamps: T::new(&s.clock),
            stats_base: QpairStats::default(),
        });
    }
    Ok(queues)
}

/// Queue entries for the job on `ctrl`: at least every slot's command (split into parts if the
/// I/O is larger than the maximum transfer), `zone_cmds` zone commands, plus the one entry a
/// full queue leaves empty; the template's `entries` when that is more (and the controller
/// allows it), so that a completion queue larger than the queue depth lets the driver
/// acknowledge completions in batches.
pub(crate) fn queue_entries(job: &JobSpec, ctrl: &Controller, zone_cmds: usize) -> Result<u16, EngineError> {
    let mdts = ctrl.mdts_bytes().unwrap_or(2 << 20);
    let max = job.qpair.max_transfer.map_or(mdts, |m| m.min(mdts)).max(4096);
    // A part never spans more pages than MDTS allows bytes: unaligned buffers lose a page.
    let parts = if job.io_size <= max {
        1
    } else {
        job.io_size.div_ceil(max.saturating_sub(4096).max(4096))
    };
    let want = job.queue_depth as usize * parts + zone_cmds + 1;
    let mqes = ctrl.cap().max_queue_entries().min(65535) as usize;
    if want > mqes {
        let zones = match zone_cmds {
            0 => String::new(),
            z => format!(" and {z} zone command(s)"),
        };
        return Err(EngineError::Invalid(format!(
            "queue depth {} with {} command(s) per I/O{zones} needs {want} queue entries; the controller allows {mqes} (CAP.MQES)",
            job.queue_depth, parts
        )));
    }
    Ok(want.max(job.qpair.entries as usize).min(mqes).max(want).max(2) as u16)
}

/// Whether two handles are the same controller.
pub(crate) fn same_controller(a: &Controller, b: &Controller) -> bool {
    a.same_as(b)
}

impl<S: Slots, T: Stamps> Queue<S, T> {
    fn stop(&mut self) {
        for n in &mut self.ns {
            n.left = 0;
        }
        self.phase = Phase::Run;
    }

    fn can_submit(&self) -> bool {
        !self.broken && self.ns.iter().any(NsState::has_work)
    }

    /// The next namespace that can take an I/O now (round robin).
    #[inline]
    fn pick_ns(&mut self) -> Option<usize> {
        let n = self.ns.len();
        for _ in 0..n {
            let k = self.next_ns;
            self.next_ns = if k + 1 == n { 0 } else { k + 1 };
            if self.ns[k].ready() {
                return Some(k);
            }
        }
        None
    }

    /// Submits into free slots while there is work left.
    #[inline]
    fn refill(&mut self, now: u64, st: &mut State) {
        while !self.broken {
            let Some(slot) = self.free.pop() else { break };
            if !self.submit(slot as usize, now, st) {
                self.free.push(slot);
                break;
            }
        }
    }

    /// One I/O into `slot`; false when there is nothing to submit or it was refused.
    #[inline]
    fn submit(&mut self, slot: usize, now: u64, st: &mut State) -> bool {
        let Some(k) = self.pick_ns() else {
            return false;
        };
        let ns = &mut self.ns[k];
        // A zoned range being written takes only writes, each the next of one of its zones.
        let (write, lba, lane) = match ns.writer.as_mut().and_then(ZoneWriter::next_write) {
            Some((lane, unit)) => (true, ns.lba_of(unit), lane),
            None => {
                let write = match self.phase {
                    Phase::Run => st.pick_write(),
                    Phase::VerifyWrite => true,
                    Phase::VerifyRead => false,
                };
                let unit = ns.cursor.next_unit(&mut st.rng);
                (write, ns.lba_of(unit), 0)
            }
        };
        if ns.left != u64::MAX {
            ns.left -= 1;
        }
        self.issue(slot, k, write, lba, lane, now, st)
    }

    /// Issues one I/O (`write` or read of `lba` in namespace range `k`) from `slot`: fills or
    /// poisons the buffer when verifying, submits; false when refused.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn issue(
        &mut self,
        slot: usize,
        k: usize,
        write: bool,
        lba: u64,
        lane: u16,
        now: u64,
        st: &mut State,
    ) -> bool {
        let ns = &self.ns[k];
        let nsid = ns.nsid;
        if let (false, Some(_)) = (write, st.verify_seed) {
            // Verify reads go into poisoned buffers: a read that moves nothing cannot pass
            // for one through what the slot held before.
            self.scratch.fill(0xee);
            self.mscratch.fill(0xee);
            let mut r = self.slots.store(slot, &self.scratch);
            if let (Some(m), true) = (self.mslots.as_mut(), r.is_ok()) {
                r = m.store(slot, &self.mscratch);
            }
            if let Err(e) = r {
                let dev = &self.device;
                st.error(|| format!("{dev}: poisoning a buffer: {e}"));
                self.broken = true;
                return false;
            }
        }
        if let (true, Some(seed)) = (write, st.verify_seed) {
            pattern::fill(&mut self.scratch, ns.block_bytes, lba, nsid, seed);
            let mut r = self.slots.store(slot, &self.scratch);
            if let (Some(m), true) = (self.mslots.as_mut(), r.is_ok()) {
                pattern::fill_meta(&mut self.mscratch, ns.meta_bytes, lba, nsid, seed);
                r = m.store(slot, &self.mscratch);
            }
            if let Err(e) = r {
                let dev = &self.device;
                st.error(|| format!("{dev}: filling a buffer: {e}"));
                self.broken = true;
                return false;
            }
        }
        self.meta[slot] = SlotMeta {
            submitted: now,
            lba,
            ns: k as u16,
            lane,
            write,
            failed: false,
            lost: false,
            again: false,
        };
        self.stamps.submitting();
        let buf = self.slots.take(slot);
        let r = match self.mslots.as_mut() {
            None => {
                let r = if write {
                    self.qp.write(nsid, lba, buf, slot as u64)
                } else {
                    self.qp.read(nsid, lba, buf, slot as u64)
                };
                r.map_err(|rej| (rej.error, rej.buf, None))
            }
            Some(m) => {
                let mb = m.take(slot);
                let r = if write {
                    self.qp.write_with_metadata(nsid, lba, buf, mb, slot as u64)
                } else {
                    self.qp.read_with_metadata(nsid, lba, buf, mb, slot as u64)
                };
                r.map_err(|rej| (rej.error, rej.buf.0, Some(rej.buf.1)))
            }
        };
        match r {
            Ok(()) => {
                self.inflight += 1;
                true
            }
            Err((e, buf, mb)) => {
                self.slots.put(slot, buf);
                if let (Some(m), Some(mb)) = (self.mslots.as_mut(), mb) {
                    m.put(slot, mb);
                }
                let dev = &self.device;
                st.error(|| format!("{dev}: submitting to namespace {nsid} LBA {lba}: {e}"));
                self.broken = true;
                false
            }
        }
    }

    /// Polls once; handles completions and refills. Returns whether the queue has work
    /// (in flight or still to submit).
    #[inline]
    fn step(&mut self, st: &mut State) -> bool {
        self.stamps.polling();
        let Queue {
            qp,
            slots,
            mslots,
            meta,
            ready,
            zone_done,
            device,
            stamps,
            ..
        } = self;
        let n = qp.poll(usize::MAX, |d| {
            if d.tag & ZONE_TAG != 0 {
                zone_done.push((d.tag, d.result.err()));
                return;
            }
            stamps.called_back();
            let slot = d.tag as usize;
            let m = &mut meta[slot];
            if let Err(NvmeError::Reset { .. }) = &d.result {
                // Interrupted by a controller reset: issued again (`complete`), not an error.
                m.again = true;
            } else if let Err(e) = &d.result {
                m.failed = true;
                let ns = m.ns;
                st.error(|| {
                    format!(
                        "{device}: {} of LBA {} (namespace index {ns}): {e}",
                        op(m.write),
                        m.lba
                    )
                });
            }
            match d.buf {
                Some(b) => slots.put(slot, b),
                None => m.lost = true,
            }
            match (mslots.as_mut(), d.meta) {
                (Some(ms), Some(b)) => ms.put(slot, b),
                (Some(_), None) => m.lost = true,
                _ => {}
            }
            ready.push(slot as u32);
        });
        self.polls += 1;
        if n == 0 {
            self.empty_polls += 1;
            if self.sleepy && self.inflight != 0 {
                self.sleep(st);
            }
        } else {
            let now = st.clock.ticks();
            let gap = now.wrapping_sub(self.last_done);
            self.last_done = now;
            if gap > self.max_gap {
                self.max_gap = gap;
            }
            self.complete(now, st);
            if !self.zone_done.is_empty() {
                self.zone_complete(st);
            }
            self.refill(now, st);
            self.qp.flush_submissions();
            self.stamps.rang();
        }
        if self.inflight == 0 && self.zone_cmds == 0 && !self.can_submit() {
            return self.next_phase(st);
        }
        true
    }

    /// Interrupt mode: sleeps until the queue pair interrupts (bounded, so that a stop request
    /// is seen within a few milliseconds even if a completion were lost).
    #[cold]
    #[inline(never)]
    fn sleep(&mut self, st: &mut State) {
        if let Err(e) = self.qp.wait(Some(IRQ_WAIT_LIMIT)) {
            let device = &self.device;
            st.error(|| format!("{device}: waiting for an interrupt: {e}"));
        }
    }

    /// Sends a zone command for lane `lane` of namespace `k`.
    #[cold]
    fn zone_cmd(&mut self, k: usize, lane: u16, cmd: ZoneCmd, st: &mut State) {
        let ns = &mut self.ns[k];
        let g = ns.zone.expect("a zoned range");
        let (action, zone) = cmd.action();
        let zslba = ns.first_lba + zone * g.zone_blocks;
        if let Some(r) = ns.zone_report.as_mut() {
            match cmd {
                ZoneCmd::Reset(_) => r.resets += 1,
                ZoneCmd::Finish(_) => r.finishes += 1,
            }
        }
        let nsid = ns.nsid;
        match self
            .qp
            .zone_action(nsid, zslba, action, false, zoned::zone_tag(k, lane))
        {
            Ok(()) => self.zone_cmds += 1,
            Err(e) => {
                let dev = &self.device;
                st.error(|| format!("{dev}: {} of namespace {nsid} LBA {zslba}: {e}", action.name()));
                self.broken = true;
            }
        }
    }

    /// Zone commands completed: their lanes go on (a failed one ends the run).
    #[cold]
    fn zone_complete(&mut self, st: &mut State) {
        let mut done = std::mem::take(&mut self.zone_done);
        for (tag, error) in done.drain(..) {
            self.zone_cmds -= 1;
            let (k, lane) = zoned::untag(tag);
            let ns = &mut self.ns[k];
            if let Some(e) = error {
                let (dev, nsid) = (&self.device, ns.nsid);
                let what = match ns.writer.as_ref().and_then(|w| w.pending(lane)) {
                    Some(cmd) => {
                        let (action, zone) = cmd.action();
                        let zslba = ns.first_lba + zone * ns.zone.map_or(0, |g| g.zone_blocks);
                        format!("{} of the zone at LBA {zslba}", action.name())
                    }
                    None => "a zone command".into(),
                };
                st.error(|| format!("{dev}: namespace {nsid}: {what}: {e}"));
                self.broken = true;
                continue;
            }
            let more = ns.left > 0;
            let next = ns.writer.as_mut().and_then(|w| w.command_done(lane, more));
            if let Some(cmd) = next {
                self.zone_cmd(k, lane, cmd, st);
            }
        }
        // The (empty) vector back, its capacity kept: nothing is allocated per command.
        self.zone_done = done;
    }

    #[inline]
    fn complete(&mut self, now: u64, st: &mut State) {
        for i in 0..self.ready.len() {
            let slot = self.ready[i] as usize;
            let mut m = self.meta[slot];
            self.inflight -= 1;
            if m.again && !m.lost {
                if self.again(slot, m, st) {
                    continue;
                }
                m.failed = true;
            }
            self.ios += 1;
            let lat = st.clock.ns(now.wrapping_sub(m.submitted));
            let op = if m.write { &mut st.write } else { &mut st.read };
            op.ios += 1;
            op.latency.saturating_record(lat);
            if !m.failed {
                op.bytes += st.io_size as u64;
            }
            if m.write && self.ns[m.ns as usize].writer.is_some() {
                self.zone_written(m, st);
            }
            if m.lost {
                // The queue pair failed and kept the buffer: this slot is gone.
                self.broken = true;
                continue;
            }
            if self.phase != Phase::Run && !m.failed {
                self.verified(slot, m, st);
            }
            self.free.push(slot as u32);
        }
        self.ready.clear();
    }

    /// Issues the I/O in `slot` again after a controller reset interrupted it: the same
    /// operation on the same blocks (a write with the same data), its latency still counted
    /// from the first submission. A write to a zoned range is not repeated (its zone's write
    /// pointer may have moved): it counts as failed.
    /// Returns whether it was issued; if not, the error is counted and the caller completes
    /// it as failed.
    #[cold]
    #[inline(never)]
    fn again(&mut self, slot: usize, m: SlotMeta, st: &mut State) -> bool {
        let zoned = self.ns[m.ns as usize].writer.is_some();
        if !zoned && !self.broken && self.issue(slot, m.ns as usize, m.write, m.lba, m.lane, m.submitted, st)
        {
            self.reissued += 1;
            return true;
        }
        let device = &self.device;
        st.error(|| {
            format!(
                "{device}: {} of LBA {} interrupted by a controller reset",
                op(m.write),
                m.lba
            )
        });
        false
    }

    /// A write to a zoned range completed: its lane goes on.
    #[inline]
    fn zone_written(&mut self, m: SlotMeta, st: &mut State) {
        let k = m.ns as usize;
        let ns = &mut self.ns[k];
        let more = ns.left > 0;
        let Some(w) = ns.writer.as_mut() else { return };
        let after = w.write_done(m.lane, !m.failed, more);
        if self.phase == Phase::VerifyWrite {
            // Units of a zone given up after a failed write are not written in this pass.
            ns.left = ns.left.saturating_sub(after.skipped);
        }
        if let Some(cmd) = after.cmd {
            self.zone_cmd(k, m.lane, cmd, st);
        }
    }

    /// Verify bookkeeping for a completed slot: count written blocks, check read ones.
    #[cold]
    fn verified(&mut self, slot: usize, m: SlotMeta, st: &mut State) {
        let ns = &self.ns[m.ns as usize];
        let (Some(seed), Some(v)) = (st.verify_seed, st.verify.as_mut()) else {
            return;
        };
        if m.write {
            v.blocks_written += ns.io_blocks;
            return;
        }
        let mut r = self.slots.load(slot, &mut self.scratch);
        if let (Some(m), true) = (self.mslots.as_ref(), r.is_ok()) {
            r = m.load(slot, &mut self.mscratch);
        }
        if let Err(e) = r {
            st.errors += 1;
            if st.error_samples.len() < MAX_ERROR_SAMPLES {
                st.error_samples
                    .push(format!("{}: reading a buffer: {e}", self.device));
            }
            return;
        }
        v.blocks_checked += ns.io_blocks;
        let device = &self.device;
        let nsid = ns.nsid;
        let mut bad = |lba, found| {
            if v.samples.len() < VerifyReport::MAX_SAMPLES {
                v.samples.push(Mismatch {
                    device: device.clone(),
                    nsid,
                    lba,
                    found,
                });
            }
        };
        let mut wrong = pattern::check(
            &self.scratch,
            ns.block_bytes,
            m.lba,
            nsid,
            seed,
            ns.data_skip.clone(),
            &mut bad,
        );
        if ns.meta_bytes != 0 {
            wrong += pattern::check_meta(
                &self.mscratch,
                ns.meta_bytes,
                m.lba,
                nsid,
                seed,
                ns.meta_skip.clone(),
                &mut bad,
            );
        }
        v.mismatches += wrong;
    }

    /// All done in this phase: start the next one (verify: read back) or finish. Returns
    /// whether there is work again.
    fn next_phase(&mut self, st: &mut State) -> bool {
        if self.phase != Phase::VerifyWrite || self.broken {
            return false;
        }
        self.phase = Phase::VerifyRead;
        for n in &mut self.ns {
            n.writer = None;
            n.left = n.units;
            n.seed = mix64(n.seed);
            n.cursor = Cursor::new(n.units, n.cursor.is_random(), true, n.seed);
        }
        let now = st.clock.ticks();
        self.refill(now, st);
        self.qp.flush_submissions();
        self.inflight != 0
    }

    /// The end of the warm-up at tick `now`: the measured window's counters start from zero
    /// (the queue pair's from its current values; reissued I/Os are kept).
    #[cold]
    fn restart_counts(&mut self, now: u64, clock: &Clock) {
        self.ios = 0;
        self.polls = 0;
        self.empty_polls = 0;
        self.max_gap = 0;
        self.last_done = now;
        self.stats_base = self.qp.stats();
        self.stamps = T::new(clock);
    }

    fn report(&self, clock: &Clock) -> QueueReport {
        QueueReport {
            device: self.device.clone(),
            qid: self.qp.qid(),
            nsids: self.ns.iter().map(|n| n.nsid).collect(),
            ios: self.ios,
            polls: self.polls,
            empty_polls: self.empty_polls,
            stats: traffic_since(self.qp.stats(), &self.stats_base),
            max_gap: Duration::from_nanos(clock.ns(self.max_gap)),
            reissued: self.reissued,
            zoned: self.ns.iter().filter_map(|n| n.zone_report.clone()).collect(),
        }
    }
}

/// `now`'s traffic counters (requests, commands, completions, doorbells) counted from
/// `base` on; its fault and recovery counters (errors, bogus completions, aborts, resets and
/// what they did) as they are, so that faults of a warm-up still show.
fn traffic_since(now: QpairStats, base: &QpairStats) -> QpairStats {
    QpairStats {
        requests: now.requests - base.requests,
        commands: now.commands - base.commands,
        completions: now.completions - base.completions,
        sq_doorbells: now.sq_doorbells - base.sq_doorbells,
        cq_doorbells: now.cq_doorbells - base.cq_doorbells,
        shadow_only: now.shadow_only - base.shadow_only,
        ..now
    }
}

fn op(write: bool) -> &'static str {
    if write {
        "write"
    } else {
        "read"
    }
}
