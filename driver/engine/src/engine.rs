//! The control path: start the workers, let them run, stop them, collect their reports.
//!
//! The main thread and the workers talk over `crossbeam-channel`s only at the edges of a run
//! (ready, start, stop, done). While I/O runs, a worker looks at its control channel every few
//! hundred rounds of its poll loop and publishes its counters there too; the main thread reads
//! them for the progress callback. Nothing on the per-I/O path is shared between threads.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use vfpoll_nvme::Controller;

use crate::clock::Clock;
use crate::job::{JobSpec, Limit, WorkerSpec};
use crate::report::{per_second, Report, WorkerReport};
use crate::worker::{self, queue_entries, same_controller, Control, Counters, Event, Setup};
use crate::{zoned, EngineError};

/// A progress sample for the main thread's callback.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    /// Since the start (of the warm-up, if any).
    pub elapsed: Duration,
    /// Still in the warm-up: the counters restart from zero when it ends.
    pub warming_up: bool,
    /// I/Os completed so far, the warm-up's included (as last published by the workers).
    pub ios: u64,
    /// Bytes moved so far, the warm-up's included.
    pub bytes: u64,
    /// I/Os per second since the previous sample.
    pub iops: f64,
    /// Bytes per second since the previous sample.
    pub bw_bytes: f64,
}

/// Workers that are set up and waiting to start (see [`Engine::start`] and [`Engine::run`]).
/// Dropping it without running tears them down.
#[derive(Debug)]
pub struct Engine {
    job: Arc<JobSpec>,
    control: Vec<Sender<Control>>,
    events: Receiver<Event>,
    threads: Vec<JoinHandle<()>>,
    counters: Vec<Arc<Counters>>,
    clock: Clock,
}

impl Engine {
    /// Checks the job, spawns one thread per worker, and waits until each has pinned itself
    /// and made its queue pairs and buffers. Any failure tears down the others and is returned.
    pub fn start(job: JobSpec, workers: Vec<WorkerSpec>) -> Result<Engine, EngineError> {
        let (quotas, lanes) = check(&job, &workers)?;
        let clock = Clock::calibrate(Duration::from_millis(20));
        let job = Arc::new(job);
        let (ev_tx, events) = crossbeam_channel::unbounded();
        let mut engine = Engine {
            job: Arc::clone(&job),
            control: Vec::new(),
            events,
            threads: Vec::new(),
            counters: Vec::new(),
            clock,
        };
        for (((index, spec), quotas), lanes) in workers.into_iter().enumerate().zip(quotas).zip(lanes) {
            let (tx, control) = crossbeam_channel::bounded(4);
            let counters = Arc::new(Counters::default());
            let setup = Setup {
                index,
                spec,
                job: Arc::clone(&job),
                clock,
                control,
                events: ev_tx.clone(),
                counters: Arc::clone(&counters),
                quotas,
                lanes,
            };
            let t = std::thread::Builder::new()
                .name(format!("vfpoll-worker-{index}"))
                .spawn(move || worker::main(setup))
                .map_err(EngineError::Spawn)?;
            engine.control.push(tx);
            engine.threads.push(t);
            engine.counters.push(counters);
        }
        drop(ev_tx);
        let mut ready = 0;
        while ready < engine.threads.len() {
            match engine.events.recv() {
                Ok(Event::Ready) => ready += 1,
                Ok(Event::Failed { worker, error }) => {
                    return Err(EngineError::Worker {
                        worker,
                        source: Box::new(error),
                    })
                }
                Ok(Event::Done(_)) | Err(_) => return Err(EngineError::Lost(ready)),
            }
        }
        Ok(engine)
    }

    /// The clock the workers time I/O with.
    pub fn clock(&self) -> Clock {
        self.clock
    }

    /// Starts every worker at once, calls `on_tick` about every `tick` on this thread while
    /// they run, stops them at the time limit, and merges their reports.
    pub fn run(mut self, tick: Duration, mut on_tick: impl FnMut(&Progress)) -> Result<Report, EngineError> {
        for c in &self.control {
            let _ = c.send(Control::Start);
        }
        let t0 = Instant::now();
        // The warm-up ends with `Control::Measure`; the time limit counts from then.
        let (mut measure_at, mut deadline) = match self.job.limit {
            Limit::Time(d) if !self.job.verify => {
                let w = self.job.warmup;
                ((w > Duration::ZERO).then_some(t0 + w), Some(t0 + w + d))
            }
            _ => (None, None),
        };
        let n = self.threads.len();
        let mut reports: Vec<WorkerReport> = Vec::with_capacity(n);
        let mut failure = None;
        let mut stopped = false;
        let tick = tick.max(Duration::from_millis(10));
        let mut next_tick = t0 + tick;
        let (mut last_t, mut last_ios, mut last_bytes) = (t0, 0, 0);
        while reports.len() < n && failure.is_none() {
            let mut wake = next_tick;
            if let (false, Some(d)) = (stopped, measure_at.or(deadline)) {
                wake = wake.min(d);
            }
            match self
                .events
                .recv_timeout(wake.saturating_duration_since(Instant::now()))
            {
                Ok(Event::Done(r)) => reports.push(*r),
                Ok(Event::Failed { worker, error }) => {
                    failure = Some(EngineError::Worker {
                        worker,
                        source: Box::new(error),
                    })
                }
                Ok(Event::Ready) | Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            let now = Instant::now();
            if !stopped && deadline.is_some_and(|d| now >= d) {
                stopped = true;
                for c in &self.control {
                    let _ = c.send(Control::Stop);
                }
            }
            if now >= next_tick {
                let (ios, bytes) = self.counters.iter().fold((0, 0), |(i, b), c| {
                    (
                        i + c.ios.load(std::sync::atomic::Ordering::Relaxed),
                        b + c.bytes.load(std::sync::atomic::Ordering::Relaxed),
                    )
                });
                let dt = now - last_t;
                on_tick(&Progress {
                    elapsed: now - t0,
                    warming_up: measure_at.is_some(),
                    ios,
                    bytes,
                    iops: per_second(ios - last_ios.min(ios), dt),
                    bw_bytes: per_second(bytes - last_bytes.min(bytes), dt),
                });
                (last_t, last_ios, last_bytes) = (now, ios, bytes);
                while next_tick <= now {
                    next_tick += tick;
                }
            }
            // After the tick, which still counts as the warm-up's at its end.
            if measure_at.is_some_and(|m| now >= m) {
                measure_at = None;
                for c in &self.control {
                    let _ = c.send(Control::Measure);
                }
                // Only a time-limited run has a warm-up (`measure_at`).
                if let Limit::Time(d) = self.job.limit {
                    deadline = Some(now + d);
                }
            }
        }
        if failure.is_some() {
            for c in &self.control {
                let _ = c.send(Control::Abort);
            }
        }
        self.join();
        if let Some(e) = failure {
            return Err(e);
        }
        if reports.len() < n {
            return Err(EngineError::Lost(n - reports.len()));
        }
        Ok(Report::merge(reports))
    }

    fn join(&mut self) {
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        for c in &self.control {
            let _ = c.send(Control::Abort);
        }
        self.join();
    }
}

/// Per worker and target: a submission quota, and zones written at once.
type Plans = (Vec<Vec<u64>>, Vec<Vec<u32>>);

/// Checks the job against the workers' targets; returns each worker's per-target quotas and
/// zone lanes.
fn check(job: &JobSpec, workers: &[WorkerSpec]) -> Result<Plans, EngineError> {
    let bad = |s: String| Err(EngineError::Invalid(s));
    if workers.is_empty() {
        return bad("no workers".into());
    }
    if job.queue_depth == 0 {
        return bad("the queue depth must be at least 1".into());
    }
    if job.io_size == 0 {
        return bad("the I/O size must not be 0".into());
    }
    if job.rwmix_read > 100 {
        return bad(format!("rwmix {} is over 100 percent", job.rwmix_read));
    }
    if job.limit == Limit::Ios(0) || job.limit == Limit::Time(Duration::ZERO) {
        return bad("the run must have a non-zero time or I/O count".into());
    }
    if job.warmup > Duration::ZERO && (job.verify || matches!(job.limit, Limit::Ios(_))) {
        return bad(format!(
            "a warm-up ({:?}) precedes a timed run only: a verify pass or an I/O-count run has none (set it to zero)",
            job.warmup
        ));
    }
    if job.breakdown && job.queue_depth != 1 {
        return bad(format!(
            "the latency breakdown times one I/O at a time per queue pair: it needs queue depth 1, not {} (with more in flight the stages of different I/Os overlap)",
            job.queue_depth
        ));
    }
    if job.breakdown && job.verify {
        return bad("the latency breakdown times a perf run, not a verify pass: use one or the other".into());
    }
    let lanes = zoned::plan(job, workers)?;
    let mut per_ctrl: Vec<(Controller, String, usize)> = Vec::new();
    for (i, w) in workers.iter().enumerate() {
        if w.targets.is_empty() {
            return bad(format!("worker {i} has no namespace to drive"));
        }
        let mut seen: Vec<&Controller> = Vec::new();
        for t in &w.targets {
            let ns = t.ctrl.namespace(t.nsid).map_err(|source| EngineError::Nvme {
                device: t.device.clone(),
                source,
            })?;
            let io_blocks = (job.io_size / ns.lba_size) as u64;
            if !job.io_size.is_multiple_of(ns.lba_size) {
                return bad(format!(
                    "{} namespace {}: the I/O size {} is not a multiple of its {}-byte blocks",
                    t.device, t.nsid, job.io_size, ns.lba_size
                ));
            }
            let r = &t.lbas;
            if r.start >= r.end || r.end > ns.blocks || r.end - r.start < io_blocks {
                return bad(format!(
                    "{} namespace {}: LBAs {}..{} do not hold one I/O of {} blocks inside its {} blocks",
                    t.device, t.nsid, r.start, r.end, io_blocks, ns.blocks
                ));
            }
            if !seen.iter().any(|c| same_controller(c, &t.ctrl)) {
                seen.push(&t.ctrl);
                let zone_cmds: u32 = w
                    .targets
                    .iter()
                    .zip(&lanes[i])
                    .filter(|(o, _)| same_controller(&o.ctrl, &t.ctrl))
                    .map(|(_, &l)| l)
                    .sum();
                queue_entries(job, &t.ctrl, zone_cmds as usize)?;
                match per_ctrl.iter_mut().find(|(c, _, _)| same_controller(c, &t.ctrl)) {
                    Some(e) => e.2 += 1,
                    None => per_ctrl.push((t.ctrl.clone(), t.device.clone(), 1)),
                }
            }
        }
    }
    for (c, dev, n) in &per_ctrl {
        if *n > c.io_queues_granted() as usize {
            return bad(format!(
                "{dev}: {n} workers need {n} I/O queue pairs; the controller granted {}",
                c.io_queues_granted()
            ));
        }
    }
    // Quotas: `--ios` spread evenly over every namespace range of every worker.
    let ranges: usize = workers.iter().map(|w| w.targets.len()).sum();
    let mut k = 0u64;
    let quotas = workers
        .iter()
        .map(|w| {
            w.targets
                .iter()
                .map(|_| {
                    let q = match job.limit {
                        Limit::Ios(total) => {
                            let r = ranges as u64;
                            total / r + u64::from(k < total % r)
                        }
                        Limit::Time(_) => u64::MAX,
                    };
                    k += 1;
                    q
                })
                .collect()
        })
        .collect();
    Ok((quotas, lanes))
}
