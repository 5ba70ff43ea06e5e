//! A queue's zone commands: the Zone Management Send commands (reset, finish) that let its
//! lanes write zones in order, and what a completed write or zone command does next.

use vfpoll_nvme::NvmeError;

use super::{Queue, SlotMeta};
use crate::breakdown::Stamps;
use crate::slots::Slots;
use crate::worker::verify::Phase;
use crate::worker::State;
use crate::zoned::{self, ZoneCmd};

/// Zone commands of one queue pair.
pub(super) struct ZoneCmds {
    /// Those (by tag, with the error of a failed one) whose completions came in this poll.
    pub(super) done: Vec<(u64, Option<NvmeError>)>,
    /// Those in flight.
    pub(super) in_flight: u32,
}

impl ZoneCmds {
    /// Room for `lanes` zone commands at once: nothing is allocated per command.
    pub(super) fn new(lanes: usize) -> Self {
        ZoneCmds {
            done: Vec::with_capacity(lanes),
            in_flight: 0,
        }
    }
}

impl<S: Slots, T: Stamps> Queue<S, T> {
    /// Sends a zone command for lane `lane` of namespace `k`.
    #[cold]
    fn zone_cmd(&mut self, k: usize, lane: u16, cmd: ZoneCmd, st: &mut State) {
        let ns = &mut self.ranges.list[k];
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
            Ok(()) => self.zones.in_flight += 1,
            Err(e) => {
                let dev = &self.device;
                st.error(|| format!("{dev}: {} of namespace {nsid} LBA {zslba}: {e}", action.name()));
                self.broken = true;
            }
        }
    }

    /// Zone commands completed: their lanes go on (a failed one ends the run).
    #[cold]
    pub(super) fn zone_complete(&mut self, st: &mut State) {
        let mut done = std::mem::take(&mut self.zones.done);
        for (tag, error) in done.drain(..) {
            self.zones.in_flight -= 1;
            let (k, lane) = zoned::untag(tag);
            let ns = &mut self.ranges.list[k];
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
        self.zones.done = done;
    }

    /// A write to a zoned range completed: its lane goes on.
    #[inline]
    pub(super) fn zone_written(&mut self, m: SlotMeta, st: &mut State) {
        let k = m.ns as usize;
        let ns = &mut self.ranges.list[k];
        let more = ns.left > 0;
        let Some(w) = ns.writer.as_mut() else { return };
        let after = w.write_done(m.lane, !m.failed, more);
        if self.verify.phase == Phase::VerifyWrite {
            // Units of a zone given up after a failed write are not written in this pass.
            ns.left = ns.left.saturating_sub(after.skipped);
        }
        if let Some(cmd) = after.cmd {
            self.zone_cmd(k, m.lane, cmd, st);
        }
    }
}
