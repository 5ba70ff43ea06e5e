//! # vfpoll-engine: the per-core I/O engine
//!
//! Runs NVMe I/O the way SPDK's perf does: one thread per core, pinned
//! (`sched_setaffinity`), each owning one [`vfpoll_nvme::QueuePair`] per controller it drives,
//! its own DMA buffers and its own latency histograms. The hot path of a worker polls its queue
//! pairs, records latencies and resubmits; it takes no lock, shares no cache line with another
//! thread and allocates nothing. The control path (ready, start, stop, report) runs over
//! `crossbeam-channel`s and is looked at only every few hundred rounds of the poll loop.
//!
//! Layers:
//! - [`affinity`]: core lists and pinning;
//! - [`clock`]: the per-I/O clock (the TSC, calibrated);
//! - [`workload`]: access patterns, the read/write mix, generators;
//! - [`pattern`]: the LBA-tagged verify pattern and its checker;
//! - the private `job` module: [`JobSpec`], [`Limit`], [`WorkerSpec`], [`Target`],
//!   [`split_evenly`]: what a run is asked to do, imported by the engine, its workers, the
//!   zoned writer and the I/O layout (and importing none of them); the private `histogram`
//!   module: the latency histogram under both [`report`] and [`breakdown`];
//! - [`report`]: per-worker and merged results (`hdrhistogram`s, merged at the end), and
//!   SPDK-style latency histogram ranges;
//! - [`breakdown`]: the queue-depth-1 latency breakdown (where an I/O's microseconds go);
//! - [`zoned`]: zoned namespaces (whole zones per worker, one write in flight per zone,
//!   several zones at once, resets and finishes);
//! - [`Engine`]: spawns workers from [`WorkerSpec`]s, runs, stops, collects.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let ctrl: vfpoll_nvme::Controller = unimplemented!();
//! use std::time::Duration;
//! use vfpoll_engine::{split_evenly, Engine, JobSpec, Limit, Namespace, Workload};
//! let ns = [Namespace { ctrl, device: "0000:00:03.0".into(), nsid: 1, size: None }];
//! let workers = split_evenly(&[Some(0), Some(1)], &ns, 4096)?;
//! let job = JobSpec {
//!     workload: Workload::RandRead,
//!     rwmix_read: 100,
//!     io_size: 4096,
//!     queue_depth: 32,
//!     limit: Limit::Time(Duration::from_secs(10)),
//!     warmup: Duration::ZERO,
//!     verify: false,
//!     breakdown: false,
//!     seed: 1,
//!     qpair: Default::default(),
//!     buffer_page: vfpoll_dma::PageSize::Huge2M,
//! };
//! let report = Engine::start(job, workers)?.run(Duration::from_secs(1), |p| {
//!     eprintln!("{:.0} IOPS", p.iops);
//! })?;
//! println!("{:.0} IOPS", report.iops());
//! # Ok(()) }
//! ```

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks, missing_docs)]

pub mod affinity;
pub mod breakdown;
pub mod clock;
mod engine;
mod histogram;
mod job;
mod layout;
pub mod pattern;
pub mod report;
mod slots;
mod worker;
pub mod workload;
pub mod zoned;

pub use breakdown::Breakdown;
pub use engine::{Engine, Progress};
pub use hdrhistogram::Histogram;
pub use job::{split_evenly, JobSpec, Limit, Namespace, Target, WorkerSpec};
pub use report::{LatencySummary, Report, ZoneReport};
pub use workload::Workload;

use vfpoll_dma::DmaError;
use vfpoll_nvme::NvmeError;

/// Why a run could not start or finish.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The job or its layout does not make sense.
    #[error("{0}")]
    Invalid(String),
    /// Pinning a worker failed.
    #[error("cannot pin a worker thread to core {core} (does it exist, is it online and in this process's cpuset?)")]
    Affinity {
        /// The core.
        core: usize,
        /// From `sched_setaffinity`.
        #[source]
        source: nix::Error,
    },
    /// Reading the process's affinity failed.
    #[error("cannot read this thread's CPU affinity")]
    AffinityQuery(#[source] nix::Error),
    /// A driver call failed.
    #[error("{device}")]
    Nvme {
        /// The controller.
        device: String,
        /// The driver's error.
        #[source]
        source: NvmeError,
    },
    /// DMA memory for buffers could not be had.
    #[error("{device}: data buffers")]
    Dma {
        /// The controller.
        device: String,
        /// Why.
        #[source]
        source: DmaError,
    },
    /// A worker thread could not be started.
    #[error("cannot start a worker thread")]
    Spawn(#[source] std::io::Error),
    /// A worker failed.
    #[error("worker {worker}")]
    Worker {
        /// Its index.
        worker: usize,
        /// What went wrong.
        #[source]
        source: Box<EngineError>,
    },
    /// A worker thread panicked (a bug).
    #[error("worker {worker} panicked: {message}")]
    Panicked {
        /// Its index.
        worker: usize,
        /// The panic message.
        message: String,
    },
    /// Workers ended without a report.
    #[error("{0} worker(s) ended without a report")]
    Lost(usize),
}
