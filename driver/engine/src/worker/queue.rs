//! One queue pair of a worker (one per controller) and its slots: building it, submitting,
//! polling, completing. Its other concerns have their own modules: the namespace ranges it
//! drives (`ranges`), verify (`verify`), zone commands (`queue/zones.rs`), statistics (`stats`)
//! and interrupt mode's sleep (`sleep`); the latency breakdown is its `Stamps` type parameter.

use vfpoll_nvme::{Controller, NvmeError, QpairOptions, QueuePair};

use super::ranges::{NsState, Ranges};
use super::sleep::Sleep;
use super::stats::QueueStats;
use super::verify::{Phase, Verify};
use super::{Setup, State};
use crate::breakdown::Stamps;
use crate::clock::Clock;
use crate::job::{JobSpec, Target};
use crate::layout::IoLayout;
use crate::report::{QueueReport, ZoneReport};
use crate::slots::Slots;
use crate::workload::{mix64, Cursor};
use crate::zoned::{self, ZoneWriter, ZONE_TAG};
use crate::EngineError;

mod zones;

use zones::ZoneCmds;

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

/// One queue pair of the worker (one per controller), with its slots.
pub(super) struct Queue<S: Slots, T: Stamps> {
    // Declared first: dropped (queues deleted on the controller) before the buffers.
    qp: QueuePair<S::Buf>,
    slots: S,
    /// Separate metadata buffers, when the namespaces' format has them.
    mslots: Option<S>,
    meta: Box<[SlotMeta]>,
    /// Slots whose completions came in this poll.
    ready: Vec<u32>,
    /// Slots in hand, not submitted.
    free: Vec<u32>,
    inflight: u32,
    /// A submission was refused or a buffer was lost: submit nothing more.
    broken: bool,
    device: String,
    ranges: Ranges,
    verify: Verify,
    zones: ZoneCmds,
    stats: QueueStats,
    sleep: Sleep,
    /// The latency breakdown's stamps (`Off`: none).
    pub(super) stamps: T,
}

pub(super) fn build<S: Slots, T: Stamps>(s: &Setup) -> Result<Vec<Queue<S, T>>, EngineError> {
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
            meta: vec![SlotMeta::default(); qd].into_boxed_slice(),
            ready: Vec::with_capacity(qd),
            free: (0..qd as u32).rev().collect(),
            inflight: 0,
            broken: false,
            device,
            ranges: Ranges::new(ns),
            verify: Verify::new(job.verify, data_len, meta_len),
            zones: ZoneCmds::new(lanes as usize),
            stats: QueueStats::default(),
            sleep: Sleep::new(job.qpair.completion.interrupts()),
            stamps: T::new(&s.clock),
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
    /// The first submissions, at tick `now`.
    pub(super) fn start(&mut self, now: u64, st: &mut State) {
        self.stats.last_done = now;
        self.refill(now, st);
        self.qp.flush_submissions();
        self.stamps.rang();
    }

    /// Submit nothing more; finish what is in flight.
    pub(super) fn stop(&mut self) {
        self.ranges.stop();
        self.verify.phase = Phase::Run;
    }

    fn can_submit(&self) -> bool {
        !self.broken && self.ranges.have_work()
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
        let Some(k) = self.ranges.pick() else {
            return false;
        };
        let ns = &mut self.ranges.list[k];
        // A zoned range being written takes only writes, each the next of one of its zones.
        let (write, lba, lane) = match ns.writer.as_mut().and_then(ZoneWriter::next_write) {
            Some((lane, unit)) => (true, ns.lba_of(unit), lane),
            None => {
                let write = match self.verify.phase {
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
        let ns = &self.ranges.list[k];
        let nsid = ns.nsid;
        if let Some(seed) = st.verify_seed {
            let r = self.verify.prepare(
                &mut self.slots,
                self.mslots.as_mut(),
                slot,
                (write, lba),
                ns,
                seed,
            );
            if let Err((what, e)) = r {
                let dev = &self.device;
                st.error(|| format!("{dev}: {what}: {e}"));
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
    pub(super) fn step(&mut self, st: &mut State) -> bool {
        self.stamps.polling();
        let Queue {
            qp,
            slots,
            mslots,
            meta,
            ready,
            zones,
            device,
            stamps,
            ..
        } = self;
        let n = qp.poll(usize::MAX, |d| {
            if d.tag & ZONE_TAG != 0 {
                zones.done.push((d.tag, d.result.err()));
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
        self.stats.polls += 1;
        if n == 0 {
            self.stats.empty_polls += 1;
            if self.sleep.due(self.inflight) {
                if let Err(e) = Sleep::sleep(&mut self.qp) {
                    let device = &self.device;
                    st.error(|| format!("{device}: waiting for an interrupt: {e}"));
                }
            }
        } else {
            let now = st.clock.ticks();
            self.stats.completions_at(now);
            self.complete(now, st);
            if !self.zones.done.is_empty() {
                self.zone_complete(st);
            }
            self.refill(now, st);
            self.qp.flush_submissions();
            self.stamps.rang();
        }
        if self.inflight == 0 && self.zones.in_flight == 0 && !self.can_submit() {
            return self.next_phase(st);
        }
        true
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
            self.stats.ios += 1;
            let lat = st.clock.ns(now.wrapping_sub(m.submitted));
            let op = if m.write { &mut st.write } else { &mut st.read };
            op.ios += 1;
            op.latency.saturating_record(lat);
            if !m.failed {
                op.bytes += st.io_size as u64;
            }
            if m.write && self.ranges.list[m.ns as usize].writer.is_some() {
                self.zone_written(m, st);
            }
            if m.lost {
                // The queue pair failed and kept the buffer: this slot is gone.
                self.broken = true;
                continue;
            }
            if self.verify.phase != Phase::Run && !m.failed {
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
        let zoned = self.ranges.list[m.ns as usize].writer.is_some();
        if !zoned && !self.broken && self.issue(slot, m.ns as usize, m.write, m.lba, m.lane, m.submitted, st)
        {
            self.stats.reissued += 1;
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

    /// Verify bookkeeping for a completed slot: count written blocks, check read ones.
    #[cold]
    fn verified(&mut self, slot: usize, m: SlotMeta, st: &mut State) {
        let ns = &self.ranges.list[m.ns as usize];
        let (Some(seed), Some(v)) = (st.verify_seed, st.verify.as_mut()) else {
            return;
        };
        if m.write {
            v.blocks_written += ns.io_blocks;
            return;
        }
        let device = &self.device;
        let r = self.verify.check(
            &self.slots,
            self.mslots.as_ref(),
            slot,
            m.lba,
            ns,
            seed,
            (device, v),
        );
        if let Err(e) = r {
            st.error(|| format!("{device}: reading a buffer: {e}"));
        }
    }

    /// All done in this phase: start the next one (verify: read back) or finish. Returns
    /// whether there is work again.
    fn next_phase(&mut self, st: &mut State) -> bool {
        if self.verify.phase != Phase::VerifyWrite || self.broken {
            return false;
        }
        self.verify.phase = Phase::VerifyRead;
        self.ranges.read_back();
        let now = st.clock.ticks();
        self.refill(now, st);
        self.qp.flush_submissions();
        self.inflight != 0
    }

    /// The end of the warm-up at tick `now`: the measured window's counters start from zero
    /// (the queue pair's from its current values; reissued I/Os are kept).
    #[cold]
    pub(super) fn restart_counts(&mut self, now: u64, clock: &Clock) {
        self.stats.restart(now, self.qp.stats());
        self.stamps = T::new(clock);
    }

    pub(super) fn report(&self, clock: &Clock) -> QueueReport {
        QueueReport {
            device: self.device.clone(),
            qid: self.qp.qid(),
            nsids: self.ranges.list.iter().map(|n| n.nsid).collect(),
            ios: self.stats.ios,
            polls: self.stats.polls,
            empty_polls: self.stats.empty_polls,
            stats: self.stats.traffic(self.qp.stats()),
            max_gap: self.stats.max_gap(clock),
            reissued: self.stats.reissued,
            zoned: self
                .ranges
                .list
                .iter()
                .filter_map(|n| n.zone_report.clone())
                .collect(),
        }
    }
}

fn op(write: bool) -> &'static str {
    if write {
        "write"
    } else {
        "read"
    }
}
