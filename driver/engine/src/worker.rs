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

use crate::affinity::pin_current;
use crate::breakdown::{Off, On, Stamps};
use crate::clock::Clock;
use crate::job::{JobSpec, WorkerSpec};
use crate::layout::largest_buffer;
use crate::report::{OpStats, VerifyReport, WorkerReport, MAX_ERROR_SAMPLES};
use crate::slots::{PoolSlots, RegionSlots, Slots};
use crate::workload::{mix64, Rng};
use crate::EngineError;

mod queue;
mod ranges;
mod sleep;
mod stats;
mod verify;

use queue::Queue;
pub(crate) use queue::{queue_entries, same_controller};

/// Rounds of the hot loop between two looks at the control channel.
const CONTROL_EVERY: u32 = 256;

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

impl Counters {
    /// Publishes the I/Os and bytes done: the warm-up's (`warm_ios`, `warm_bytes`), and the
    /// measured window's so far.
    fn publish(&self, warm_ios: u64, warm_bytes: u64, st: &State) {
        let (ios, bytes) = (st.read.ios + st.write.ios, st.read.bytes + st.write.bytes);
        self.ios.store(warm_ios + ios, Ordering::Relaxed);
        self.bytes.store(warm_bytes + bytes, Ordering::Relaxed);
    }
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
    let mut queues = match queue::build::<S, T>(&s) {
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
        q.start(start, st);
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
            counters.publish(warm_ios, warm_bytes, st);
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
    counters.publish(warm_ios, warm_bytes, st);
    Duration::from_nanos(st.clock.ns(end.wrapping_sub(start)))
}
