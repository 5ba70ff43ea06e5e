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

use std::ops::Range;
use std::time::{Duration, Instant};

use vfpoll_dma::{DmaContext, PageSize};
use vfpoll_nvme::zns::{self, Zone, ZoneAction, ZoneFilter, ZoneState};
use vfpoll_nvme::{Controller, Namespace, QueuePair};

use crate::job::{JobSpec, WorkerSpec};
use crate::slots::Slots;
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LaneState {
    /// May submit the next write of its zone.
    Ready,
    /// A write in flight.
    Writing,
    /// A zone command in flight.
    Command(ZoneCmd),
    /// No zone: the run wants no more writes, or every zone is taken.
    Parked,
}

#[derive(Debug, Clone, Copy)]
struct Lane {
    zone: u64,
    /// I/Os of its zone submitted so far.
    done: u64,
    state: LaneState,
}

/// The zones one worker writes in one range: its lanes, each a zone being written with at most
/// one write in flight (see the module docs). Pure bookkeeping: the queue sends the writes and
/// zone commands it hands out.
#[derive(Debug)]
pub(crate) struct ZoneWriter {
    zones: u64,
    per_zone: u64,
    /// Finish each zone after its last I/O (a remainder of some zone is skipped).
    finish: bool,
    /// Take the first zone again after the last (timed and counted runs; not verify).
    wrap: bool,
    /// Zones taken again after a wrap must be reset first.
    wrapped: bool,
    lanes: Box<[Lane]>,
    next_zone: u64,
    next_lane: usize,
    ready: u32,
    live: u32,
}

/// What a lane needs after a write completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct After {
    /// A zone command to send for the lane.
    pub cmd: Option<ZoneCmd>,
    /// I/Os of the lane's zone that will not be written (after a failed write).
    pub skipped: u64,
}

impl ZoneWriter {
    /// `lanes` (1 ..= `zones`) lanes over `zones` zones of `per_zone` (>= 1) I/Os each, all
    /// empty (reset at set-up); the lanes start on the first zones.
    pub(crate) fn new(zones: u64, per_zone: u64, finish: bool, wrap: bool, lanes: u32) -> Self {
        assert!(lanes >= 1 && u64::from(lanes) <= zones && per_zone >= 1);
        ZoneWriter {
            zones,
            per_zone,
            finish,
            wrap,
            wrapped: false,
            lanes: (0..u64::from(lanes))
                .map(|zone| Lane {
                    zone,
                    done: 0,
                    state: LaneState::Ready,
                })
                .collect(),
            next_zone: u64::from(lanes),
            next_lane: 0,
            ready: lanes,
            live: lanes,
        }
    }

    /// Whether a lane may submit a write now.
    #[inline]
    pub(crate) fn can_write(&self) -> bool {
        self.ready != 0
    }

    /// Whether any lane still has a zone (may write again).
    #[inline]
    pub(crate) fn live(&self) -> bool {
        self.live != 0
    }

    /// The next write: `(lane, unit)`, the unit being the next I/O of the lane's zone, in the
    /// range's units. The lane has a write in flight until [`ZoneWriter::write_done`].
    #[inline]
    pub(crate) fn next_write(&mut self) -> Option<(u16, u64)> {
        if self.ready == 0 {
            return None;
        }
        let n = self.lanes.len();
        for _ in 0..n {
            let i = self.next_lane;
            self.next_lane = if i + 1 == n { 0 } else { i + 1 };
            let l = &mut self.lanes[i];
            if l.state == LaneState::Ready {
                l.state = LaneState::Writing;
                self.ready -= 1;
                let unit = l.zone * self.per_zone + l.done;
                l.done += 1;
                return Some((i as u16, unit));
            }
        }
        None
    }

    /// A write of `lane` completed (`ok`: successfully); `more`: whether the run wants more
    /// writes.
    pub(crate) fn write_done(&mut self, lane: u16, ok: bool, more: bool) -> After {
        let per_zone = self.per_zone;
        let l = &mut self.lanes[lane as usize];
        debug_assert_eq!(l.state, LaneState::Writing);
        if !ok {
            // The write pointer is unknown now: give the zone up (finished, so it frees its
            // resources) and do not write the rest of it.
            let skipped = per_zone - l.done;
            l.done = per_zone;
            l.state = LaneState::Command(ZoneCmd::Finish(l.zone));
            return After {
                cmd: Some(ZoneCmd::Finish(l.zone)),
                skipped,
            };
        }
        if l.done < per_zone {
            l.state = LaneState::Ready;
            self.ready += 1;
            return After::default();
        }
        if self.finish {
            l.state = LaneState::Command(ZoneCmd::Finish(l.zone));
            return After {
                cmd: Some(ZoneCmd::Finish(l.zone)),
                skipped: 0,
            };
        }
        After {
            cmd: self.advance(lane, more),
            skipped: 0,
        }
    }

    /// The zone command `lane` has in flight, if any.
    pub(crate) fn pending(&self, lane: u16) -> Option<ZoneCmd> {
        match self.lanes[lane as usize].state {
            LaneState::Command(c) => Some(c),
            _ => None,
        }
    }

    /// The zone command of `lane` completed successfully (a failed one ends the run).
    pub(crate) fn command_done(&mut self, lane: u16, more: bool) -> Option<ZoneCmd> {
        match self.lanes[lane as usize].state {
            LaneState::Command(ZoneCmd::Reset(_)) => {
                self.lanes[lane as usize].state = LaneState::Ready;
                self.ready += 1;
                None
            }
            LaneState::Command(ZoneCmd::Finish(_)) => self.advance(lane, more),
            s => unreachable!("a zone command completed for lane {lane}, which is {s:?}"),
        }
    }

    /// `lane` is done with its zone: it takes the next one (reset first after a wrap), or parks.
    fn advance(&mut self, lane: u16, more: bool) -> Option<ZoneCmd> {
        let li = lane as usize;
        if more && self.next_zone == self.zones && self.wrap {
            self.next_zone = 0;
            self.wrapped = true;
        }
        if !more || self.next_zone == self.zones {
            self.lanes[li].state = LaneState::Parked;
            self.live -= 1;
            return None;
        }
        // After a wrap the next zone may still be another lane's: take the next free one (a
        // zone is free: the one this lane leaves).
        let mut z = self.next_zone;
        while self
            .lanes
            .iter()
            .enumerate()
            .any(|(j, o)| j != li && o.state != LaneState::Parked && o.zone == z)
        {
            z = if z + 1 == self.zones { 0 } else { z + 1 };
        }
        self.next_zone = z + 1;
        let l = &mut self.lanes[li];
        l.zone = z;
        l.done = 0;
        if self.wrapped {
            l.state = LaneState::Command(ZoneCmd::Reset(z));
            Some(ZoneCmd::Reset(z))
        } else {
            l.state = LaneState::Ready;
            self.ready += 1;
            None
        }
    }
}

/// What a worker learned of one zoned range at set-up.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Prepared {
    pub geom: ZoneGeom,
    pub zones: u64,
    /// Zones that need a Finish after their last I/O.
    pub finish: bool,
    /// Zones reset at set-up.
    pub resets: u64,
}

/// Set-up of one zoned range on the worker's queue pair: read its zones, reset them when the
/// run writes (and read them again), check their states, and work out the units per zone.
#[allow(clippy::too_many_arguments)]
pub(crate) fn prepare<S: Slots>(
    qp: &mut QueuePair<S::Buf>,
    ctrl: &Controller,
    page: PageSize,
    timeout: Duration,
    device: &str,
    ns: &Namespace,
    lbas: Range<u64>,
    io_blocks: u64,
    write: bool,
) -> Result<Prepared, EngineError> {
    let z = ns.zoned.expect("a zoned namespace");
    let nsid = ns.nsid;
    let zb = z.identify.zone_size;
    let first = lbas.start / zb;
    let count = (lbas.end - lbas.start) / zb;
    let mut rep = Reporter::<S>::new(ctrl.dma(), page, qp.max_transfer(), device)?;
    let mut zones = rep.zones(qp, nsid, zb, first, count, z.identify.zone_ext_size, timeout)?;
    let bad = |why: String| Err(EngineError::Invalid(format!("{device} namespace {nsid}: {why}")));
    let mut resets = 0;
    if write {
        for zn in &zones {
            if matches!(zn.state, ZoneState::Offline | ZoneState::ReadOnly) {
                return bad(format!(
                    "the zone at LBA {} is {}: it cannot be written; run on a range without it (--size)",
                    zn.start, zn.state
                ));
            }
        }
        let dirty: Vec<u64> = zones
            .iter()
            .filter(|zn| zn.state != ZoneState::Empty)
            .map(|zn| zn.start)
            .collect();
        resets = dirty.len() as u64;
        reset(qp, device, nsid, &dirty, timeout)?;
        if !dirty.is_empty() {
            zones = rep.zones(qp, nsid, zb, first, count, z.identify.zone_ext_size, timeout)?;
        }
        if let Some(zn) = zones
            .iter()
            .find(|zn| zn.state != ZoneState::Empty || zn.write_pointer != zn.start)
        {
            return bad(format!(
                "the zone at LBA {} is {} with its write pointer at {} after Reset Zone; expected empty at its start",
                zn.start, zn.state, zn.write_pointer
            ));
        }
    } else if let Some(zn) = zones.iter().find(|zn| zn.state == ZoneState::Offline) {
        return bad(format!(
            "the zone at LBA {} is offline: reads of it fail; run on a range without it (--size)",
            zn.start
        ));
    }
    let cap = zones.iter().map(|zn| zn.capacity).min().unwrap_or(0);
    let per_zone = cap / io_blocks;
    if per_zone == 0 {
        return bad(format!(
            "its zones can be written up to {cap} blocks ({} bytes; the zone capacity), less than one I/O of {io_blocks} blocks: use an I/O size of at most the zone capacity",
            cap * ns.lba_size as u64
        ));
    }
    Ok(Prepared {
        geom: ZoneGeom {
            zone_blocks: zb,
            per_zone,
        },
        zones: count,
        finish: zones.iter().any(|zn| zn.capacity != per_zone * io_blocks),
        resets,
    })
}

/// Reset Zone for each zone starting at `starts`, several in flight.
fn reset<B: vfpoll_nvme::IoBuffer>(
    qp: &mut QueuePair<B>,
    device: &str,
    nsid: u32,
    starts: &[u64],
    timeout: Duration,
) -> Result<(), EngineError> {
    let (mut sent, mut done) = (0, 0);
    let mut failed: Option<EngineError> = None;
    let limit = timeout * 2 + Duration::from_secs(10);
    let deadline = Instant::now() + limit;
    while done < starts.len() {
        while sent < starts.len() && qp.free_slots() > 0 && failed.is_none() {
            let zslba = starts[sent];
            qp.zone_action(nsid, zslba, ZoneAction::Reset, false, zslba)
                .map_err(|source| EngineError::Nvme {
                    device: format!("{device} namespace {nsid}: Reset Zone of the zone at LBA {zslba}"),
                    source,
                })?;
            sent += 1;
        }
        if failed.is_some() && done == sent {
            break;
        }
        qp.poll(usize::MAX, |d| {
            done += 1;
            if let Err(source) = d.result {
                failed.get_or_insert(EngineError::Nvme {
                    device: format!(
                        "{device} namespace {nsid}: Reset Zone of the zone at LBA {}",
                        d.tag
                    ),
                    source,
                });
            }
        });
        if Instant::now() > deadline {
            return Err(EngineError::Invalid(format!(
                "{device} namespace {nsid}: {} of {} Reset Zone commands did not complete within {limit:?}",
                sent - done,
                starts.len(),
            )));
        }
    }
    failed.map_or(Ok(()), Err)
}

/// Reads zone reports through one small buffer of the worker's buffer kind.
struct Reporter<S: Slots> {
    buf: S,
    len: usize,
    device: String,
}

impl<S: Slots> Reporter<S> {
    fn new(dma: &DmaContext, page: PageSize, max_xfer: usize, device: &str) -> Result<Self, EngineError> {
        let len = (page.bytes() as usize).min(64 << 10).min(max_xfer);
        let buf = S::new(dma, len, 1, page).map_err(|source| EngineError::Dma {
            device: device.into(),
            source,
        })?;
        Ok(Reporter {
            buf,
            len,
            device: device.into(),
        })
    }

    /// The descriptors of `count` zones from zone index `first`.
    #[allow(clippy::too_many_arguments)]
    fn zones(
        &mut self,
        qp: &mut QueuePair<S::Buf>,
        nsid: u32,
        zb: u64,
        first: u64,
        count: u64,
        ext: usize,
        timeout: Duration,
    ) -> Result<Vec<Zone>, EngineError> {
        let err = |why: String| EngineError::Invalid(format!("{} namespace {nsid}: {why}", self.device));
        let mut out: Vec<Zone> = Vec::with_capacity(count as usize);
        let mut bytes = vec![0u8; self.len];
        while (out.len() as u64) < count {
            let slba = (first + out.len() as u64) * zb;
            let b = self.buf.take(0);
            if let Err(r) = qp.report_zones(nsid, slba, ZoneFilter::All, true, b, 0) {
                self.buf.put(0, r.buf);
                return Err(EngineError::Nvme {
                    device: format!("{} namespace {nsid}: Report Zones from LBA {slba}", self.device),
                    source: r.error,
                });
            }
            let deadline = Instant::now() + timeout * 2 + Duration::from_secs(10);
            let mut got = None;
            while got.is_none() {
                qp.poll(1, |d| got = Some(d));
                if got.is_none() && Instant::now() > deadline {
                    return Err(err(format!("Report Zones from LBA {slba} did not complete")));
                }
            }
            let d = got.expect("a completion");
            let Some(b) = d.buf else {
                return Err(err(
                    "the queue pair kept the zone report buffer after a failure".into()
                ));
            };
            self.buf.put(0, b);
            d.result.map_err(|source| EngineError::Nvme {
                device: format!("{} namespace {nsid}: Report Zones from LBA {slba}", self.device),
                source,
            })?;
            self.buf.load(0, &mut bytes).map_err(|source| EngineError::Dma {
                device: self.device.clone(),
                source,
            })?;
            let (_, zones) = zns::parse_report(&bytes, ext);
            if zones.is_empty() {
                return Err(err(format!("Report Zones from LBA {slba} listed no zone")));
            }
            for zn in zones {
                if out.len() as u64 == count {
                    break;
                }
                let want = (first + out.len() as u64) * zb;
                if zn.start != want {
                    return Err(err(format!(
                        "Report Zones listed a zone at LBA {} where the zone at {want} was expected",
                        zn.start
                    )));
                }
                out.push(zn);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Rng;

    /// Drives a writer as a queue would, completing writes and commands in random order, and
    /// checks the zone rules on the way: one write in flight per zone, writes in order at each
    /// zone's write pointer, at most `lanes` zones open, a finish exactly when a remainder is
    /// skipped, a reset before a zone is written again.
    fn drive(zones: u64, per_zone: u64, finish: bool, wrap: bool, lanes: u32, writes: u64, seed: u64) -> Sim {
        let mut w = ZoneWriter::new(zones, per_zone, finish, wrap, lanes);
        let mut sim = Sim {
            wp: vec![0; zones as usize],
            full: vec![false; zones as usize],
            passes: vec![0; zones as usize],
            ..Default::default()
        };
        let mut rng = Rng::new(seed);
        // In flight: (lane, unit) writes and (lane, cmd) commands.
        let mut writes_out: Vec<(u16, u64)> = Vec::new();
        let mut cmds_out: Vec<(u16, ZoneCmd)> = Vec::new();
        let mut left = writes;
        loop {
            while left > 0 {
                let Some((lane, unit)) = w.next_write() else { break };
                let (z, k) = (unit / per_zone, unit % per_zone);
                assert!(
                    !writes_out.iter().any(|&(_, u)| u / per_zone == z),
                    "two writes in flight to zone {z}"
                );
                assert!(!sim.full[z as usize], "write to full zone {z}");
                assert_eq!(sim.wp[z as usize], k, "zone {z}: write not at the write pointer");
                sim.wp[z as usize] += 1;
                writes_out.push((lane, unit));
                left -= 1;
                sim.written += 1;
                let open = sim
                    .wp
                    .iter()
                    .zip(&sim.full)
                    .filter(|(&p, &f)| p > 0 && !f)
                    .count();
                sim.max_open = sim.max_open.max(open);
            }
            if writes_out.is_empty() && cmds_out.is_empty() {
                break;
            }
            let n = writes_out.len() + cmds_out.len();
            let pick = rng.below(n as u64) as usize;
            if pick < writes_out.len() {
                let (lane, unit) = writes_out.swap_remove(pick);
                let z = unit / per_zone;
                if sim.wp[z as usize] == per_zone && !finish {
                    sim.full[z as usize] = true; // written to capacity
                }
                let a = w.write_done(lane, true, left > 0);
                assert_eq!(a.skipped, 0);
                if let Some(c) = a.cmd {
                    cmds_out.push((lane, c));
                }
            } else {
                let (lane, c) = cmds_out.swap_remove(pick - writes_out.len());
                match c {
                    ZoneCmd::Finish(z) => {
                        assert!(finish, "finish without a skipped remainder");
                        assert_eq!(sim.wp[z as usize], per_zone, "zone {z} finished early");
                        sim.full[z as usize] = true;
                        sim.finishes += 1;
                    }
                    ZoneCmd::Reset(z) => {
                        assert!(sim.full[z as usize], "zone {z} reset before it was full");
                        sim.wp[z as usize] = 0;
                        sim.full[z as usize] = false;
                        sim.passes[z as usize] += 1;
                        sim.resets += 1;
                    }
                }
                if let Some(c) = w.command_done(lane, left > 0) {
                    cmds_out.push((lane, c));
                }
            }
        }
        sim.left = left;
        sim
    }

    #[derive(Default, Debug)]
    struct Sim {
        wp: Vec<u64>,
        full: Vec<bool>,
        passes: Vec<u32>,
        written: u64,
        left: u64,
        max_open: usize,
        finishes: u64,
        resets: u64,
    }

    #[test]
    fn one_pass_writes_every_unit_once_in_order() {
        for (zones, per_zone, finish, lanes) in [
            (16, 48, false, 4),
            (16, 19, true, 4),
            (5, 3, true, 5),
            (3, 7, false, 1),
        ] {
            for seed in 0..20 {
                let total = zones * per_zone;
                let s = drive(zones, per_zone, finish, false, lanes, total, seed);
                assert_eq!((s.written, s.left), (total, 0));
                assert!(s.wp.iter().all(|&p| p == per_zone), "{:?}", s.wp);
                assert!(s.full.iter().all(|&f| f), "every zone ends full");
                assert!(s.max_open <= lanes as usize, "{} open", s.max_open);
                assert_eq!(s.finishes, if finish { zones } else { 0 });
                assert_eq!(s.resets, 0);
            }
        }
    }

    #[test]
    fn long_runs_wrap_and_reset_each_zone_before_rewriting_it() {
        for (zones, lanes) in [(4, 4), (6, 4), (2, 1)] {
            for seed in 0..20 {
                let per_zone = 5;
                let writes = zones * per_zone * 3 + 2;
                let s = drive(zones, per_zone, seed % 2 == 0, true, lanes, writes, seed);
                assert_eq!(s.written, writes);
                assert!(s.max_open <= lanes as usize);
                // Two more passes' worth of zones, each reset when taken again (a zone another
                // lane still holds is passed over, so the count per zone varies).
                assert!(s.resets >= zones * 2 - u64::from(lanes), "{} resets", s.resets);
                assert_eq!(s.passes.iter().map(|&p| u64::from(p)).sum::<u64>(), s.resets);
            }
        }
    }

    #[test]
    fn a_failed_write_gives_its_zone_up_and_parked_lanes_end() {
        let mut w = ZoneWriter::new(2, 4, false, false, 2);
        let (l0, u0) = w.next_write().unwrap();
        let (l1, u1) = w.next_write().unwrap();
        assert_eq!((u0, u1), (0, 4));
        assert!(w.next_write().is_none() && !w.can_write());
        // The first write of zone 0 fails: the 3 units left are skipped, the zone finished.
        let a = w.write_done(l0, false, true);
        assert_eq!(
            a,
            After {
                cmd: Some(ZoneCmd::Finish(0)),
                skipped: 3
            }
        );
        // No zone left to take (verify never wraps): the lane parks.
        assert_eq!(w.command_done(l0, true), None);
        assert!(w.live());
        assert_eq!(w.write_done(l1, true, true), After::default());
        for _ in 0..3 {
            let (l, _) = w.next_write().unwrap();
            assert_eq!(l, l1);
            w.write_done(l, true, true);
        }
        assert!(!w.live() && !w.can_write());
        assert_eq!(untag(zone_tag(3, 7)), (3, 7));
        assert_ne!(zone_tag(0, 0) & ZONE_TAG, 0);
    }

    #[test]
    fn units_map_to_zones_below_capacity() {
        let g = ZoneGeom {
            zone_blocks: 256,
            per_zone: 19,
        };
        assert_eq!(g.offset(0, 10), 0);
        assert_eq!(g.offset(18, 10), 180);
        assert_eq!(g.offset(19, 10), 256);
        assert_eq!(g.offset(40, 10), 512 + 20);
        assert_eq!(one_command(512 << 10, 4096), 512 << 10);
        assert_eq!(one_command(512 << 10, 520), ((512 << 10) - 4096) / 520 * 520);
    }
}
