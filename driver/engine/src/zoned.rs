//! Zoned namespaces in a run (NVMe Zoned Namespace Command Set 1.1): which worker writes which
//! zones, in what order, and how a verify pass stays exact.
//!
//! A zone takes writes only at its write pointer, in order, and only below its capacity (which
//! may be smaller than the zone size); a write anywhere else fails with Zone Invalid Write or
//! Zone Boundary Error. At most a number of zones may be open, and a larger number active (open
//! or closed), at once; a zone written to its capacity, or finished, is full and holds neither
//! (ZNS 1.1 §2.1.1, the zone state machine).
//!
//! # How `vfpoll perf` writes zones
//! - **Ownership.** Every worker gets whole zones, disjoint from every other worker's
//!   ([`crate::split_evenly`]); [`crate::Engine::start`] refuses a writing job whose ranges
//!   split a zone or share one between workers.
//! - **Set-up.** Before it reports ready, each worker reads its zones (Report Zones). A run that
//!   writes (a write workload, or `--verify`) first resets every zone of its range that is not
//!   empty (Zone Management Send, Reset Zone, one command per zone) and reads them again; an
//!   offline or read-only zone in a writing run, or an offline one in a reading run, is refused
//!   with its LBA.
//! - **Units.** Every zone of a range takes the same number of I/Os: the smallest zone
//!   capacity of the range divided by the I/O size, rounded down. I/O unit `u` of a range lies
//!   in its zone `u / per_zone`, `u % per_zone` I/Os from the zone's start. When the I/O size
//!   does not divide a zone's capacity, the rest of the zone is **skipped**, never written
//!   short: after the zone's last I/O the worker finishes it (Finish Zone), so it goes full and
//!   frees its open and active resources as one written to capacity does. Reads (of any
//!   workload, and of the verify pass) stay within the same units.
//! - **Order.** Writes are ordinary Writes at the write pointer, with **at most one write in
//!   flight per zone** (Linux's zone write locking does the same): a controller may run the
//!   commands of a queue in any order, so two writes in flight to one zone could reach it in the
//!   wrong order. The queue depth is reached by writing several zones at once instead: each
//!   worker keeps `lanes` zones open, `lanes` = the least of the queue depth, the zones it owns,
//!   and its share of the namespace's limits (the smaller of max open and max active zones,
//!   divided evenly among the workers writing it). A lane writes its zone to the end, finishes
//!   it if a remainder was skipped, and takes the worker's next zone. A write larger than one
//!   command would go out as several commands in flight to one zone: such I/O sizes are
//!   refused, and queue pairs that write zones do not split requests.
//! - **Why not Zone Append.** An append lets the controller choose the LBA and names it only in
//!   the completion, while the verify pattern ([`crate::pattern`]) tags each block with the LBA
//!   it is written *for*, before it is written. Appends in flight together to one zone land in
//!   an order only their completions tell, so verifying them would need a map from every written
//!   LBA to the I/O that landed there. Ordinary writes, one per zone at a time, keep every
//!   block's LBA known at submission and need no such map.
//! - **Long runs.** A timed (or counted) write run that has written all of a worker's zones
//!   wraps: a lane takes the worker's first zone again, and resets it first (Reset Zone, counted
//!   in [`crate::ZoneReport::resets`]). A run that stops leaves the zones it was writing
//!   open and partly written; the next writing run resets them. `--verify` writes each unit
//!   exactly once and never wraps.
//! - **Refused.** `randwrite`, `randrw` and `rw` on a zoned namespace (random writes, or reads
//!   interleaved with the sequential writes, would leave holes below a write pointer). Zones
//!   outside the run's range that are open or closed take from the same open and active limits:
//!   if the controller reports Too Many Open or Active Zones, reset or finish those zones, or run
//!   over the whole namespace.
//!
//! A write that fails leaves its zone's write pointer unknown: the lane finishes that zone and
//! moves on; in a verify run the zone's unwritten units then read back as what they hold
//! (zeroes), each reported with its LBA.

use vfpoll_nvme::zns::ZoneAction;
use vfpoll_nvme::Namespace;

use crate::job::{JobSpec, WorkerSpec};
use crate::workload::Workload;
use crate::EngineError;

/// The bit that marks a completion's tag as a zone command's (slot tags are small).
pub(crate) const ZONE_TAG: u64 = 1 << 63;

/// The tag of a zone command of lane `lane` of namespace `ns` (an index into the queue's).
pub(crate) fn zone_tag(ns: usize, lane: u16) -> u64 {
    ZONE_TAG | (ns as u64) << 16 | lane as u64
}

/// `(namespace index, lane)` of a zone command's tag.
pub(crate) fn untag(tag: u64) -> (usize, u16) {
    (((tag & !ZONE_TAG) >> 16) as usize, tag as u16)
}

/// Where I/O units lie in a zoned range: `per_zone` units of the I/O size from the start of
/// each zone of `zone_blocks` blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ZoneGeom {
    pub zone_blocks: u64,
    pub per_zone: u64,
}

impl ZoneGeom {
    /// The first LBA of unit `unit`, from the range's start.
    #[inline]
    pub(crate) fn offset(&self, unit: u64, io_blocks: u64) -> u64 {
        unit / self.per_zone * self.zone_blocks + unit % self.per_zone * io_blocks
    }
}

/// Why a workload cannot run on a zoned namespace, if it cannot.
fn refusal(workload: Workload) -> Option<&'static str> {
    match workload {
        Workload::RandWrite | Workload::RandRw => Some("it writes at random offsets"),
        Workload::Rw => {
            Some("it interleaves reads with the sequential writes, so the writes would skip the blocks read")
        }
        Workload::Write | Workload::Read | Workload::RandRead => None,
    }
}

/// Whether the job writes (a write workload, or the write pass of a verify run).
pub(crate) fn writes(job: &JobSpec) -> bool {
    job.verify || job.workload.read_percent(job.rwmix_read) < 100
}

/// Checks the zoned targets of a job and returns, per worker and target, how many zones it
/// writes at once (its lanes; 0 for a target that is not zoned or not written).
pub(crate) fn plan(job: &JobSpec, workers: &[WorkerSpec]) -> Result<Vec<Vec<u32>>, EngineError> {
    let bad = |s: String| Err(EngineError::Invalid(s));
    let mut lanes: Vec<Vec<u32>> = workers.iter().map(|w| vec![0; w.targets.len()]).collect();
    // The zoned targets a job writes: (worker, target, namespace).
    let mut written: Vec<(usize, usize, Namespace)> = Vec::new();
    for (wi, w) in workers.iter().enumerate() {
        for (ti, t) in w.targets.iter().enumerate() {
            let ns = t.ctrl.namespace(t.nsid).map_err(|source| EngineError::Nvme {
                device: t.device.clone(),
                source,
            })?;
            let Some(z) = ns.zoned else { continue };
            let (dev, nsid) = (&t.device, t.nsid);
            if let Some(why) = refusal(job.workload) {
                return bad(format!(
                    "{dev} namespace {nsid} is zoned, and {} cannot run on it: {why}, but a zone takes writes only in order at its write pointer. On a zoned namespace use `write` (sequential writes, zone by zone; with --verify each block is read back and checked), `read` or `randread`",
                    job.workload
                ));
            }
            let zb = z.identify.zone_size;
            let r = &t.lbas;
            if !r.start.is_multiple_of(zb) || !r.end.is_multiple_of(zb) || r.start >= r.end {
                return bad(format!(
                    "{dev} namespace {nsid}: LBAs {}..{} are not whole zones of {zb} blocks: give each worker whole zones of a zoned namespace (split_evenly does)",
                    r.start, r.end
                ));
            }
            let io_blocks = (job.io_size / ns.lba_size.max(1)) as u64;
            if io_blocks > zb {
                return bad(format!(
                    "{dev} namespace {nsid}: an I/O of {} bytes is larger than its zones of {zb} blocks ({} bytes): an I/O must fit in one zone",
                    job.io_size,
                    zb * ns.lba_size as u64
                ));
            }
            if writes(job) {
                written.push((wi, ti, ns));
            }
        }
    }
    for (wi, ti, ns) in &written {
        let t = &workers[*wi].targets[*ti];
        let z = ns.zoned.expect("zoned");
        let same: Vec<&(usize, usize, Namespace)> = written
            .iter()
            .filter(|(w, u, _)| {
                let o = &workers[*w].targets[*u];
                o.nsid == t.nsid && o.ctrl.same_as(&t.ctrl)
            })
            .collect();
        for (w, u, _) in &same {
            let o = &workers[*w].targets[*u];
            if (*w, *u) != (*wi, *ti) && o.lbas.start < t.lbas.end && t.lbas.start < o.lbas.end {
                return bad(format!(
                    "{} namespace {}: workers {wi} and {w} both write zones in LBAs {}..{}: a zone must have one writer",
                    t.device,
                    t.nsid,
                    o.lbas.start.max(t.lbas.start),
                    o.lbas.end.min(t.lbas.end)
                ));
            }
        }
        let limits = [z.identify.max_open(), z.identify.max_active()];
        let limit = limits.into_iter().flatten().min().unwrap_or(u32::MAX);
        let share = limit / same.len() as u32;
        if share == 0 {
            return bad(format!(
                "{} namespace {} lets {limit} zones be open at once (max open {}, max active {}), fewer than the {} workers writing it, and each needs a zone of its own: use at most {limit} workers (--cores)",
                t.device,
                t.nsid,
                show(limits[0]),
                show(limits[1]),
                same.len()
            ));
        }
        let zones = (t.lbas.end - t.lbas.start) / z.identify.zone_size;
        lanes[*wi][*ti] = share
            .min(u32::from(job.queue_depth))
            .min(zones.min(u64::from(u32::MAX)) as u32);
    }
    Ok(lanes)
}

fn show(limit: Option<u32>) -> String {
    limit.map_or("unlimited".into(), |l| l.to_string())
}

/// The longest I/O of `block_bytes`-byte blocks that one command moves from a page-aligned
/// buffer on a queue pair whose commands move at most `max_xfer` bytes (the driver's split rule:
/// a whole number of blocks that spans no more pages than `max_xfer` allows bytes).
pub(crate) fn one_command(max_xfer: usize, block_bytes: usize) -> usize {
    let room = if block_bytes.is_power_of_two() || max_xfer <= 4096 {
        max_xfer
    } else {
        max_xfer.saturating_sub(block_bytes.max(4096))
    };
    room / block_bytes * block_bytes
}

/// A zone command a lane asks for, on the zone with this index in the range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ZoneCmd {
    /// Reset Zone: before writing a zone again.
    Reset(u64),
    /// Finish Zone: after a zone's last I/O, when a remainder was skipped (or a write failed).
    Finish(u64),
}

impl ZoneCmd {
    pub(crate) fn action(self) -> (ZoneAction, u64) {
        match self {
            ZoneCmd::Reset(z) => (ZoneAction::Reset, z),
            ZoneCmd::Finish(z) => (ZoneAction::Finish, z),
        }
    }
}

mod prepare;
#[cfg(test)]
mod tests;
mod writer;

pub(crate) use prepare::prepare;
pub(crate) use writer::ZoneWriter;
