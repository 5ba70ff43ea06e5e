//! What a run is asked to do: the job every worker runs ([`JobSpec`], [`Limit`]), the
//! namespace ranges each worker drives ([`WorkerSpec`], [`Target`]) and the usual way to
//! share namespaces out ([`split_evenly`]). The bottom of the crate's run path: the engine,
//! its workers, the zoned writer and the I/O layout import these types, and this module
//! imports none of them.

use std::ops::Range;
use std::time::Duration;

use vfpoll_dma::PageSize;
use vfpoll_nvme::{Controller, QpairOptions};

use crate::workload::Workload;
use crate::EngineError;

/// When a run ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// After this long (then the I/O in flight completes).
    Time(Duration),
    /// After this many I/Os in all, spread evenly over every worker and namespace range.
    Ios(u64),
}

/// What every worker does.
#[derive(Debug, Clone)]
pub struct JobSpec {
    /// The access pattern.
    pub workload: Workload,
    /// Percent reads of mixed workloads (`randrw`, `rw`).
    pub rwmix_read: u8,
    /// Bytes per I/O: a multiple of every target's LBA size.
    pub io_size: usize,
    /// I/Os in flight per queue pair (each worker has one queue pair per controller).
    pub queue_depth: u16,
    /// When to stop (ignored by verify runs, which make exactly one pass).
    pub limit: Limit,
    /// Run the workload this long before the measured window of a [`Limit::Time`] run, and
    /// count nothing of it: latencies, I/Os, polls and doorbells start from zero when it ends
    /// (errors and reissued I/Os are kept). `Duration::ZERO`: none. Not for [`Limit::Ios`] or
    /// verify runs (refused by `Engine::start`).
    pub warmup: Duration,
    /// Verify instead of measuring: write every I/O unit of each worker's ranges once with the
    /// pattern of [`crate::pattern`] (in random order for random workloads; zoned namespaces
    /// zone by zone, in order, see the `zoned` module), then read each back (in random order for
    /// random workloads) and check it.
    pub verify: bool,
    /// Time each I/O's stages (submit, doorbell rung, completion seen, callback, next submit;
    /// see the `breakdown` module) into `Report::breakdown`. Queue depth 1 only, and not with
    /// `verify`; off, the hot loop has no stamp at all.
    pub breakdown: bool,
    /// Seed of offsets, mixes and the verify pattern: the same seed gives the same run.
    pub seed: u64,
    /// Queue pair options. `entries` is raised to what the queue depth needs (and lowered to
    /// CAP.MQES when it asks for more than the controller has, but never below that need).
    pub qpair: QpairOptions,
    /// Page size of the data buffers' DMA memory (hugepages on hardware, 4 KiB for models).
    /// I/O sizes up to it come from a pool, larger ones get a region per slot.
    pub buffer_page: PageSize,
}

/// A namespace range a worker drives.
///
/// On a zoned namespace the range is whole zones (and no other worker's, when the job writes);
/// its I/O units lie in each zone below the zone capacity (see the `zoned` module).
#[derive(Debug, Clone)]
pub struct Target {
    /// The controller (targets of one controller share the worker's queue pair on it).
    pub ctrl: Controller,
    /// Its name in reports (a BDF, or "model").
    pub device: String,
    /// The namespace.
    pub nsid: u32,
    /// The LBAs it uses: `start` and `end` aligned to the I/O size (to the zone size on a
    /// zoned namespace).
    pub lbas: Range<u64>,
}

/// One worker: a thread pinned to `core`, with one queue pair per controller of its targets.
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    /// The core to pin to (`None`: not pinned).
    pub core: Option<usize>,
    /// Its namespace ranges.
    pub targets: Vec<Target>,
}

/// A namespace to spread over workers: `(controller, device label, nsid, byte range or None
/// for the whole namespace)`.
#[derive(Debug, Clone)]
pub struct Namespace {
    /// The controller.
    pub ctrl: Controller,
    /// Its name in reports.
    pub device: String,
    /// The namespace.
    pub nsid: u32,
    /// Bytes from the start of the namespace to use (`None`: all of it).
    pub size: Option<u64>,
}

/// The usual layout, as fio's `numjobs` with `offset_increment`: every worker gets a queue
/// pair on every controller and an equal, disjoint share of every namespace (in whole I/O
/// units). Disjoint shares keep sequential streams apart and make verify runs well defined.
///
/// A zoned namespace is shared out in whole zones (a `size` that is not a whole number of
/// zones is rounded down to one), so that every zone has one writer: each worker gets an equal
/// run of zones, and there must be at least as many zones as workers. See the `zoned` module.
pub fn split_evenly(
    cores: &[Option<usize>],
    namespaces: &[Namespace],
    io_size: usize,
) -> Result<Vec<WorkerSpec>, EngineError> {
    if cores.is_empty() || namespaces.is_empty() {
        return Err(EngineError::Invalid("no cores or no namespaces to run on".into()));
    }
    let w = cores.len() as u64;
    let mut specs: Vec<WorkerSpec> = cores
        .iter()
        .map(|&core| WorkerSpec {
            core,
            targets: Vec::new(),
        })
        .collect();
    for n in namespaces {
        let ns = n.ctrl.namespace(n.nsid).map_err(|source| EngineError::Nvme {
            device: n.device.clone(),
            source,
        })?;
        let lba = ns.lba_size as u64;
        if io_size == 0 || !(io_size as u64).is_multiple_of(lba) {
            return Err(EngineError::Invalid(format!(
                "{} namespace {}: the I/O size {io_size} is not a multiple of its {lba}-byte blocks",
                n.device, n.nsid
            )));
        }
        let bytes = match n.size {
            Some(s) if s > ns.bytes() => {
                return Err(EngineError::Invalid(format!(
                    "{} namespace {}: size {s} is larger than the namespace ({} bytes)",
                    n.device,
                    n.nsid,
                    ns.bytes()
                )))
            }
            Some(s) => s,
            None => ns.bytes(),
        };
        let io_blocks = io_size as u64 / lba;
        if let Some(z) = ns.zoned {
            let zb = z.identify.zone_size;
            let zones = bytes / lba / zb;
            if zones < w {
                return Err(EngineError::Invalid(format!(
                    "{} namespace {} is zoned: {bytes} bytes hold {zones} whole zone(s) of {} bytes, fewer than the {w} workers, and each worker needs zones of its own: use fewer workers (--cores) or more of the namespace (--size)",
                    n.device,
                    n.nsid,
                    zb * lba
                )));
            }
            for (i, spec) in specs.iter_mut().enumerate() {
                let (a, b) = (zones * i as u64 / w, zones * (i as u64 + 1) / w);
                spec.targets.push(Target {
                    ctrl: n.ctrl.clone(),
                    device: n.device.clone(),
                    nsid: n.nsid,
                    lbas: a * zb..b * zb,
                });
            }
            continue;
        }
        let units = bytes / io_size as u64;
        if units < w {
            return Err(EngineError::Invalid(format!(
                "{} namespace {}: {bytes} bytes hold {units} I/Os of {io_size} bytes, fewer than the {w} workers",
                n.device, n.nsid
            )));
        }
        for (i, spec) in specs.iter_mut().enumerate() {
            let (a, b) = (units * i as u64 / w, units * (i as u64 + 1) / w);
            spec.targets.push(Target {
                ctrl: n.ctrl.clone(),
                device: n.device.clone(),
                nsid: n.nsid,
                lbas: a * io_blocks..b * io_blocks,
            });
        }
    }
    Ok(specs)
}
