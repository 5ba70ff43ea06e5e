//! The zones one worker writes in one range: lanes, each a zone written in order.

use super::ZoneCmd;

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
