//! Zones of a zoned namespace (Zoned Namespace Command Set 1.1 §2.1): their states, write
//! pointers, the open and active resource limits, and the state transitions of writes and of
//! Zone Management Send; and the Report Zones data of Zone Management Receive (§4.3, §4.4).
//!
//! Where the specification leaves room this follows QEMU 7.2 (`hw/nvme/ctrl.c`, the `nvme_zrm_*`
//! functions): a write to an empty or closed zone opens it implicitly; when that would exceed
//! the open limit and auto transition is on, the oldest implicitly opened zone is closed first;
//! Select All acts on the zones of the states the action applies to (Open: closed zones; Close:
//! open ones; Finish: open and closed; Reset: open, closed and full; Offline: read-only ones),
//! in zone order, stopping at the first failure. Unlike QEMU, a single Reset of a read-only or
//! offline zone fails with Invalid Zone State Transition (QEMU moves on and resets the next zone
//! that is not empty), and a command fails before it changes any zone.

use std::collections::VecDeque;

use crate::nsconfig::ZonedConfig;
use crate::Status;

/// The state of a zone (ZNS 1.1 §2.1.1): the specification's, with its Report Zones code. The
/// model never puts a zone in a reserved state.
pub use vfpoll_nvme_spec::zns::ZoneState;

/// Whether Report Zones reports the write pointer (ZNS 1.1 §4.3.1.1: not for full, read-only
/// and offline zones, whose descriptors carry all ones).
const fn wp_valid(s: ZoneState) -> bool {
    !matches!(s, ZoneState::Full | ZoneState::ReadOnly | ZoneState::Offline)
}

/// A zone as [`crate::NvmeModel::zones`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ZoneInfo {
    /// Zone Start LBA.
    pub start: u64,
    /// Zone capacity in blocks.
    pub capacity: u64,
    /// Write pointer (meaningful while the state reports one; see [`ZoneState`]).
    pub write_pointer: u64,
    /// State.
    pub state: ZoneState,
}

/// Zone Management Send actions (ZNS 1.1 §4.4.1, CDW13 bits 7:0).
pub(crate) use vfpoll_nvme_spec::zns::send_action as action;

/// Bytes of the Report Zones header and of one zone descriptor (ZNS 1.1 Figures 35, 36).
pub(crate) const REPORT_HEADER: usize = 64;
pub(crate) const DESCRIPTOR: usize = 64;
/// Zone Type: Sequential Write Required.
const ZT_SEQUENTIAL: u8 = 0x2;

#[derive(Debug, Clone, Copy)]
struct Zone {
    state: ZoneState,
    wp: u64,
}

/// The zones of one namespace.
#[derive(Debug, Clone)]
pub(crate) struct Zones {
    cfg: ZonedConfig,
    zones: Vec<Zone>,
    open: u32,
    active: u32,
    /// Implicitly opened zones, oldest first: auto transition closes the first.
    implicit: VecDeque<usize>,
}

impl Zones {
    /// `blocks / zone_size` empty zones.
    pub(crate) fn new(cfg: ZonedConfig, blocks: u64) -> Zones {
        let n = (blocks / cfg.zone_size) as usize;
        Zones {
            zones: (0..n)
                .map(|i| Zone {
                    state: ZoneState::Empty,
                    wp: i as u64 * cfg.zone_size,
                })
                .collect(),
            cfg,
            open: 0,
            active: 0,
            implicit: VecDeque::with_capacity(n),
        }
    }

    pub(crate) fn count(&self) -> usize {
        self.zones.len()
    }

    /// The zone holding `lba` (which the caller has checked is inside the namespace).
    pub(crate) fn index(&self, lba: u64) -> usize {
        (lba / self.cfg.zone_size) as usize
    }

    pub(crate) fn start(&self, i: usize) -> u64 {
        i as u64 * self.cfg.zone_size
    }

    #[cfg(test)]
    fn state(&self, i: usize) -> ZoneState {
        self.zones[i].state
    }

    pub(crate) fn write_pointer(&self, i: usize) -> u64 {
        self.zones[i].wp
    }

    pub(crate) fn info(&self, i: usize) -> ZoneInfo {
        ZoneInfo {
            start: self.start(i),
            capacity: self.cfg.zone_capacity,
            write_pointer: self.zones[i].wp,
            state: self.zones[i].state,
        }
    }

    /// End of the writable part of zone `i` (ZSLBA + ZCAP).
    fn write_boundary(&self, i: usize) -> u64 {
        self.start(i) + self.cfg.zone_capacity
    }

    /// Sets a zone's state, keeping the resource counts and the implicitly-opened queue.
    fn set(&mut self, i: usize, state: ZoneState) {
        let old = self.zones[i].state;
        if old.is_open() {
            self.open -= 1;
        }
        if old.is_active() {
            self.active -= 1;
        }
        if old == ZoneState::ImplicitlyOpened {
            self.implicit.retain(|&z| z != i);
        }
        if state.is_open() {
            self.open += 1;
        }
        if state.is_active() {
            self.active += 1;
        }
        if state == ZoneState::ImplicitlyOpened {
            self.implicit.push_back(i);
        }
        self.zones[i].state = state;
    }

    /// Whether the zone may be read: everything but offline (ZNS 1.1 §2.1.1.7).
    fn readable(&self, i: usize) -> Result<(), Status> {
        match self.zones[i].state {
            ZoneState::Offline => Err(Status::ZONE_IS_OFFLINE),
            _ => Ok(()),
        }
    }

    /// Read checks (QEMU's `nvme_check_zone_read`): the first zone readable; a read past its
    /// end needs Read Across Zone Boundaries and every zone it touches readable.
    pub(crate) fn check_read(&self, slba: u64, nlb: u64) -> Result<(), Status> {
        let first = self.index(slba);
        self.readable(first)?;
        let last = self.index(slba + nlb - 1);
        if last != first {
            if !self.cfg.cross_zone_read {
                return Err(Status::ZONE_BOUNDARY_ERROR);
            }
            (first + 1..=last).try_for_each(|i| self.readable(i))?;
        }
        Ok(())
    }

    /// Write checks (QEMU's `nvme_check_zone_write` and the resource check of `nvme_zrm_auto`),
    /// changing nothing: the zone writable, the write starting at the write pointer and ending
    /// within the zone's capacity, and, for a zone that is not open yet, room to open it.
    pub(crate) fn check_write(&self, slba: u64, nlb: u64) -> Result<usize, Status> {
        let i = self.index(slba);
        match self.zones[i].state {
            ZoneState::Full => return Err(Status::ZONE_IS_FULL),
            ZoneState::ReadOnly => return Err(Status::ZONE_IS_READ_ONLY),
            ZoneState::Offline => return Err(Status::ZONE_IS_OFFLINE),
            _ => {}
        }
        if slba != self.zones[i].wp {
            return Err(Status::ZONE_INVALID_WRITE);
        }
        if slba + nlb > self.write_boundary(i) {
            return Err(Status::ZONE_BOUNDARY_ERROR);
        }
        self.can_open(i)?;
        Ok(i)
    }

    /// Whether zone `i` could be opened now (a no-op for an open zone): active and open
    /// resources, counting the zone that auto transition would close.
    fn can_open(&self, i: usize) -> Result<(), Status> {
        let act = match self.zones[i].state {
            ZoneState::Empty => 1,
            ZoneState::Closed => 0,
            ZoneState::ImplicitlyOpened | ZoneState::ExplicitlyOpened => return Ok(()),
            _ => return Err(Status::INVALID_ZONE_STATE_TRANSITION),
        };
        let c = &self.cfg;
        let mut open = self.open;
        if c.auto_transition && c.max_open != 0 && open == c.max_open && !self.implicit.is_empty() {
            open -= 1;
        }
        if c.max_active != 0 && self.active + act > c.max_active {
            return Err(Status::TOO_MANY_ACTIVE_ZONES);
        }
        if c.max_open != 0 && open + 1 > c.max_open {
            return Err(Status::TOO_MANY_OPEN_ZONES);
        }
        Ok(())
    }

    /// Opens zone `i` (QEMU's `nvme_zrm_open_flags`): implicitly for a write, explicitly for
    /// Open Zone (which also turns an implicitly opened zone explicit).
    fn open_zone(&mut self, i: usize, explicit: bool) -> Result<(), Status> {
        let state = self.zones[i].state;
        match state {
            ZoneState::Empty | ZoneState::Closed => {
                self.can_open(i)?;
                let c = self.cfg;
                if c.auto_transition && c.max_open != 0 && self.open == c.max_open {
                    if let Some(&oldest) = self.implicit.front() {
                        self.set(oldest, ZoneState::Closed);
                    }
                }
                let to = match explicit {
                    true => ZoneState::ExplicitlyOpened,
                    false => ZoneState::ImplicitlyOpened,
                };
                self.set(i, to);
            }
            ZoneState::ImplicitlyOpened if explicit => self.set(i, ZoneState::ExplicitlyOpened),
            ZoneState::ImplicitlyOpened | ZoneState::ExplicitlyOpened => {}
            _ => return Err(Status::INVALID_ZONE_STATE_TRANSITION),
        }
        Ok(())
    }

    /// Applies a write that [`Zones::check_write`] accepted: opens the zone implicitly,
    /// advances the write pointer, and makes the zone full at its capacity.
    pub(crate) fn commit_write(&mut self, i: usize, nlb: u64) {
        if self.open_zone(i, false).is_err() {
            unreachable!("check_write accepted the write");
        }
        self.zones[i].wp += nlb;
        if self.zones[i].wp == self.write_boundary(i) {
            self.set(i, ZoneState::Full);
        }
    }

    /// Close Zone (QEMU's `nvme_zrm_close`): an open zone becomes closed; closed stays closed.
    fn close(&mut self, i: usize) -> Result<(), Status> {
        match self.zones[i].state {
            s if s.is_open() => self.set(i, ZoneState::Closed),
            ZoneState::Closed => {}
            _ => return Err(Status::INVALID_ZONE_STATE_TRANSITION),
        }
        Ok(())
    }

    /// Finish Zone (QEMU's `nvme_zrm_finish`): empty, open or closed zones become full.
    fn finish(&mut self, i: usize) -> Result<(), Status> {
        match self.zones[i].state {
            ZoneState::Empty | ZoneState::Closed => self.set(i, ZoneState::Full),
            s if s.is_open() => self.set(i, ZoneState::Full),
            ZoneState::Full => {}
            _ => return Err(Status::INVALID_ZONE_STATE_TRANSITION),
        }
        self.zones[i].wp = self.write_boundary(i);
        Ok(())
    }

    /// Reset Zone (QEMU's `nvme_zrm_reset`): open, closed or full zones become empty with the
    /// write pointer at the start. Returns whether the zone's blocks are to be deallocated.
    fn reset(&mut self, i: usize) -> Result<bool, Status> {
        match self.zones[i].state {
            ZoneState::Empty => Ok(false),
            ZoneState::ReadOnly | ZoneState::Offline => Err(Status::INVALID_ZONE_STATE_TRANSITION),
            _ => {
                self.set(i, ZoneState::Empty);
                self.zones[i].wp = self.start(i);
                Ok(true)
            }
        }
    }

    /// Offline Zone: a read-only zone goes offline; offline stays offline.
    fn offline(&mut self, i: usize) -> Result<(), Status> {
        match self.zones[i].state {
            ZoneState::ReadOnly => self.set(i, ZoneState::Offline),
            ZoneState::Offline => {}
            _ => return Err(Status::INVALID_ZONE_STATE_TRANSITION),
        }
        Ok(())
    }

    /// Zone Management Send on zone `i`, or with Select All on every zone the action applies
    /// to. `deallocate` is called for each zone a reset empties (its blocks read as zeroes
    /// afterwards).
    pub(crate) fn send(
        &mut self,
        act: u8,
        target: Option<usize>,
        mut deallocate: impl FnMut(u64, u64),
    ) -> Result<(), Status> {
        let size = self.cfg.zone_size;
        let mut one = |z: &mut Zones, i: usize| -> Result<(), Status> {
            match act {
                action::OPEN => z.open_zone(i, true),
                action::CLOSE => z.close(i),
                action::FINISH => z.finish(i),
                action::RESET => {
                    if z.reset(i)? {
                        deallocate(z.start(i), size);
                    }
                    Ok(())
                }
                action::OFFLINE => z.offline(i),
                _ => Err(Status::INVALID_FIELD),
            }
        };
        if let Some(i) = target {
            return one(self, i);
        }
        let applies = |s: ZoneState| match act {
            action::OPEN => s == ZoneState::Closed,
            action::CLOSE => s.is_open(),
            action::FINISH => s.is_active(),
            action::RESET => s.is_active() || s == ZoneState::Full,
            action::OFFLINE => s == ZoneState::ReadOnly,
            _ => false,
        };
        if !matches!(
            act,
            action::OPEN | action::CLOSE | action::FINISH | action::RESET | action::OFFLINE
        ) {
            return Err(Status::INVALID_FIELD);
        }
        for i in 0..self.zones.len() {
            if applies(self.zones[i].state) {
                one(self, i)?;
            }
        }
        Ok(())
    }

    /// Puts a zone into the read-only or offline state (the handle's hook for media failures).
    pub(crate) fn degrade(&mut self, i: usize, state: ZoneState) {
        self.set(i, state);
    }

    /// Whether zone `i` matches a Report Zones filter (ZRASF, ZNS 1.1 Figure 41): 0 all,
    /// 1-7 one state each.
    fn matches(&self, i: usize, filter: u8) -> bool {
        let want = match filter {
            0 => return true,
            1 => ZoneState::Empty,
            2 => ZoneState::ImplicitlyOpened,
            3 => ZoneState::ExplicitlyOpened,
            4 => ZoneState::Closed,
            5 => ZoneState::Full,
            6 => ZoneState::ReadOnly,
            _ => ZoneState::Offline,
        };
        self.zones[i].state == want
    }

    /// Writes a Report Zones answer (ZNS 1.1 §4.3.1.1) into `out` (zeroed by the caller, at
    /// least the header long): from the zone holding `slba`, the zones matching `filter`, as
    /// many descriptors as fit. The header counts every matching zone to the end, or with
    /// `partial` only those whose descriptors fit (QEMU's `nvme_zone_mgmt_recv`).
    pub(crate) fn report(&self, slba: u64, filter: u8, partial: bool, out: &mut [u8]) {
        let room = (out.len() - REPORT_HEADER) / DESCRIPTOR;
        let from = self.index(slba);
        let mut matching = (from..self.zones.len()).filter(|&i| self.matches(i, filter));
        let mut at = REPORT_HEADER;
        let mut reported = 0u64;
        for i in matching.by_ref().take(room) {
            let z = self.zones[i];
            let d = &mut out[at..at + DESCRIPTOR];
            d[0] = ZT_SEQUENTIAL;
            d[1] = z.state.code() << 4;
            d[8..16].copy_from_slice(&self.cfg.zone_capacity.to_le_bytes());
            d[16..24].copy_from_slice(&self.start(i).to_le_bytes());
            let wp = if wp_valid(z.state) { z.wp } else { u64::MAX };
            d[24..32].copy_from_slice(&wp.to_le_bytes());
            at += DESCRIPTOR;
            reported += 1;
        }
        let count = match partial {
            true => reported,
            false => reported + matching.count() as u64,
        };
        out[0..8].copy_from_slice(&count.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zones(max_open: u32, max_active: u32) -> Zones {
        let cfg = ZonedConfig {
            zone_capacity: 48,
            max_open,
            max_active,
            ..ZonedConfig::new(64)
        };
        Zones::new(cfg, 8 * 64)
    }

    fn states(z: &Zones) -> Vec<ZoneState> {
        (0..z.count()).map(|i| z.state(i)).collect()
    }

    #[test]
    fn writes_open_advance_and_fill() {
        let mut z = zones(0, 0);
        assert_eq!(
            z.check_write(1, 1),
            Err(Status::ZONE_INVALID_WRITE),
            "not at the write pointer"
        );
        assert_eq!(
            z.check_write(0, 49),
            Err(Status::ZONE_BOUNDARY_ERROR),
            "past the capacity"
        );
        let i = z.check_write(0, 40).unwrap();
        z.commit_write(i, 40);
        assert_eq!(
            (z.state(0), z.write_pointer(0)),
            (ZoneState::ImplicitlyOpened, 40)
        );
        let i = z.check_write(40, 8).unwrap();
        z.commit_write(i, 8);
        assert_eq!(z.state(0), ZoneState::Full, "at capacity");
        assert_eq!((z.open, z.active), (0, 0), "a full zone holds no resources");
        assert_eq!(z.check_write(48, 1), Err(Status::ZONE_IS_FULL));
        z.check_read(0, 64).unwrap();
        assert_eq!(z.check_read(60, 8), Err(Status::ZONE_BOUNDARY_ERROR));
    }

    #[test]
    fn open_limit_auto_transition_and_active_limit() {
        let mut z = zones(2, 3);
        for zone in 0..2 {
            let i = z.check_write(zone * 64, 1).unwrap();
            z.commit_write(i, 1);
        }
        // A third write closes the oldest implicitly opened zone.
        let i = z.check_write(128, 1).unwrap();
        z.commit_write(i, 1);
        assert_eq!(
            states(&z)[..3],
            [
                ZoneState::Closed,
                ZoneState::ImplicitlyOpened,
                ZoneState::ImplicitlyOpened
            ]
        );
        assert_eq!((z.open, z.active), (2, 3));
        assert_eq!(z.check_write(192, 1), Err(Status::TOO_MANY_ACTIVE_ZONES));
        // Explicitly opened zones are never closed automatically.
        z.send(action::OPEN, Some(1), |_, _| {}).unwrap();
        z.send(action::OPEN, Some(2), |_, _| {}).unwrap();
        assert_eq!(
            z.check_write(1, 1),
            Err(Status::TOO_MANY_OPEN_ZONES),
            "closed zone 0, both open explicit"
        );
        let mut z2 = zones(2, 0);
        z2.cfg.auto_transition = false;
        for zone in 0..2 {
            let i = z2.check_write(zone * 64, 1).unwrap();
            z2.commit_write(i, 1);
        }
        assert_eq!(z2.check_write(128, 1), Err(Status::TOO_MANY_OPEN_ZONES));
    }

    #[test]
    fn management_transitions() {
        let mut z = zones(0, 0);
        let bad = Err(Status::INVALID_ZONE_STATE_TRANSITION);
        assert_eq!(
            z.send(action::CLOSE, Some(0), |_, _| {}),
            bad,
            "close an empty zone"
        );
        z.send(action::OPEN, Some(0), |_, _| {}).unwrap();
        assert_eq!(z.state(0), ZoneState::ExplicitlyOpened);
        z.send(action::CLOSE, Some(0), |_, _| {}).unwrap();
        assert_eq!(z.state(0), ZoneState::Closed);
        z.send(action::FINISH, Some(0), |_, _| {}).unwrap();
        assert_eq!(z.state(0), ZoneState::Full);
        assert_eq!(z.send(action::OPEN, Some(0), |_, _| {}), bad, "open a full zone");
        let mut freed = Vec::new();
        z.send(action::RESET, Some(0), |a, n| freed.push((a, n))).unwrap();
        assert_eq!((z.state(0), z.write_pointer(0)), (ZoneState::Empty, 0));
        assert_eq!(freed, [(0, 64)]);
        z.degrade(3, ZoneState::ReadOnly);
        assert_eq!(z.send(action::RESET, Some(3), |_, _| {}), bad);
        assert_eq!(z.check_write(192, 1), Err(Status::ZONE_IS_READ_ONLY));
        z.check_read(192, 1).unwrap();
        z.send(action::OFFLINE, None, |_, _| {}).unwrap();
        assert_eq!(z.state(3), ZoneState::Offline);
        assert_eq!(z.check_read(192, 1), Err(Status::ZONE_IS_OFFLINE));
        assert_eq!(z.check_write(192, 1), Err(Status::ZONE_IS_OFFLINE));
        assert_eq!(
            z.send(action::OFFLINE, Some(1), |_, _| {}),
            bad,
            "only read-only zones go offline"
        );
        assert_eq!(z.send(0x7, Some(1), |_, _| {}), Err(Status::INVALID_FIELD));
    }

    #[test]
    fn select_all_and_report() {
        let mut z = zones(0, 0);
        for zone in [1, 2, 5] {
            let i = z.check_write(zone * 64, 4).unwrap();
            z.commit_write(i, 4);
        }
        z.send(action::CLOSE, None, |_, _| {}).unwrap();
        assert_eq!(states(&z)[1..3], [ZoneState::Closed; 2]);
        z.send(action::OPEN, None, |_, _| {}).unwrap();
        assert_eq!(z.state(5), ZoneState::ExplicitlyOpened);
        z.send(action::FINISH, Some(2), |_, _| {}).unwrap();

        let mut buf = vec![0u8; REPORT_HEADER + 2 * DESCRIPTOR];
        z.report(0, 0, false, &mut buf);
        assert_eq!(
            u64::from_le_bytes(buf[..8].try_into().unwrap()),
            8,
            "all zones counted"
        );
        assert_eq!(buf[64 + 1] >> 4, 0x1, "zone 0 empty");
        assert_eq!(buf[128 + 1] >> 4, 0x3, "zone 1 explicitly opened");
        assert_eq!(
            u64::from_le_bytes(buf[128 + 24..128 + 32].try_into().unwrap()),
            68,
            "its write pointer"
        );
        buf.fill(0);
        z.report(64, 5, true, &mut buf);
        assert_eq!(
            u64::from_le_bytes(buf[..8].try_into().unwrap()),
            1,
            "one full zone"
        );
        assert_eq!(
            u64::from_le_bytes(buf[64 + 16..64 + 24].try_into().unwrap()),
            128,
            "ZSLBA"
        );
        assert_eq!(
            u64::from_le_bytes(buf[64 + 24..64 + 32].try_into().unwrap()),
            u64::MAX,
            "no wp when full"
        );
        buf.fill(0);
        z.report(0, 1, true, &mut buf);
        assert_eq!(
            u64::from_le_bytes(buf[..8].try_into().unwrap()),
            2,
            "partial: what fits"
        );

        let mut freed = 0;
        z.send(action::RESET, None, |_, n| freed += n).unwrap();
        assert!(states(&z).iter().all(|&s| s == ZoneState::Empty));
        assert_eq!(freed, 3 * 64);
        assert_eq!((z.open, z.active), (0, 0));
    }
}
