//! Reservations on the [`Target`]: the four I/O commands (decoded by the I/O queues, run
//! under the target's lock since they change state every controller of the subsystem
//! sees), the Reservation Notification log page, the two features, notices with their
//! Asynchronous Events, and the state file of namespaces with Persist Through Power Loss.

use std::collections::BTreeMap;
use std::path::Path;

use vfpoll_nvme_spec::cmd::admin_op;
use vfpoll_nvme_spec::status::Status;

use super::store::{Record, ResvStore, StoreError};
use super::ResvCommand;
use super::{
    opcode, AcquireAction, Notices, NsResv, RegisterAction, ReleaseAction, ResvType, HOST_ID_INCONSISTENT,
    LOG_PAGE, LOG_PAGE_BYTES,
};
use crate::fabrics::admin::AdminOutcome;
use crate::fabrics::controller::Event;
use crate::fabrics::io::{IoOp, IoRequest};
use crate::fabrics::target::Target;
use crate::fabrics::types::{AerCompletion, Cntlid, SubsystemId};
use crate::fabrics::wire::{self, check_flags, cqe, data_xfer, status, DataXfer, Sqe};

impl Target {
    /// Keeps the reservation state of namespaces with Persist Through Power Loss in
    /// `store`: the states it read apply to the served namespaces it names (by subsystem NQN
    /// and NSID, when the NGUID matches), RESCAP reports PTPL from now on, and every change
    /// of such a state is written before its command completes. Records of namespaces not
    /// served stay in the file. The file is rewritten at once (dropping records whose NGUID
    /// no longer matches).
    pub fn set_reservation_store(&mut self, store: ResvStore) -> Result<(), StoreError> {
        self.resv.store = Some(store);
        let ids: Vec<SubsystemId> = self.subsystems.keys().copied().collect();
        for id in ids {
            self.resv_attach(id);
        }
        let served = self.ptpl_records(None);
        let saved = self.resv.store.as_ref().map_or(Ok(()), |s| s.save(&served));
        if saved.is_err() {
            // No PTPL without a file that takes writes.
            self.resv.store = None;
        }
        saved
    }

    /// Namespaces of subsystem `id` that came to be served (at start, or added by a reload)
    /// take the state the file keeps for them, if they have none.
    pub(crate) fn resv_attach(&mut self, id: SubsystemId) {
        let (Some(store), Some(s)) = (self.resv.store.as_mut(), self.subsystems.get(&id)) else {
            return;
        };
        let mut states = s.cell.resv.lock();
        for ns in &s.cfg.namespaces {
            if states.contains_key(&ns.nsid) {
                continue;
            }
            if let Some(st) = store.take(&s.cfg.nqn, ns.nsid, &ns.nguid) {
                log::info!(
                    "namespace {} of {}: reservation state restored ({} registrant(s))",
                    ns.nsid,
                    s.cfg.nqn,
                    st.registrants.len()
                );
                s.cell.resv.store(&mut states, ns.nsid, st);
            }
        }
    }

    /// Namespace `nsid` of subsystem `id` stops being served: its state goes, except that one
    /// with PTPL stays in the file (and comes back with the namespace).
    pub(crate) fn resv_detach(&mut self, id: SubsystemId, nsid: u32) {
        let Some(s) = self.subsystems.get(&id) else { return };
        let mut states = s.cell.resv.lock();
        let Some(st) = states.get(&nsid).cloned() else {
            return;
        };
        s.cell.resv.store(&mut states, nsid, NsResv::default());
        drop(states);
        let nguid = s.namespace(nsid).map(|n| n.nguid);
        if let (Some(store), Some(nguid), true) = (self.resv.store.as_mut(), nguid, st.ptpl) {
            store.keep(&s.cfg.nqn, nsid, Record { nguid, state: st });
        }
    }

    /// The namespaces (subsystem NQN and NSID) the state file keeps reservations for that no
    /// served namespace took, as text for a message.
    pub fn reservations_not_served(&self) -> Vec<String> {
        self.resv
            .store
            .iter()
            .flat_map(|s| s.pending())
            .map(|(nqn, nsid)| format!("namespace {nsid} of {nqn}"))
            .collect()
    }

    /// The reservation state file, if PTPL is supported.
    pub fn reservation_store(&self) -> Option<&Path> {
        self.resv.store.as_ref().map(ResvStore::path)
    }

    /// The completions of held Asynchronous Event Requests that reservation notices
    /// completed since the last call, to send on their controllers' admin queues.
    pub fn take_reservation_events(&mut self) -> Vec<AerCompletion> {
        std::mem::take(&mut self.resv.events)
    }

    /// The reservation state of namespace `nsid` of subsystem `id` (empty without one).
    pub fn reservation_state(&self, id: SubsystemId, nsid: u32) -> NsResv {
        self.subsystems
            .get(&id)
            .and_then(|s| s.cell.resv.lock().get(&nsid).cloned())
            .unwrap_or_default()
    }

    /// The records of every served namespace with PTPL; `this` replaces one subsystem's
    /// states (whose lock the caller holds).
    fn ptpl_records(
        &self,
        this: Option<(SubsystemId, &BTreeMap<u32, NsResv>)>,
    ) -> BTreeMap<(String, u32), Record> {
        let mut out = BTreeMap::new();
        for (&id, s) in &self.subsystems {
            let mut add = |states: &BTreeMap<u32, NsResv>| {
                for (&nsid, st) in states.iter().filter(|(_, st)| st.ptpl) {
                    if let Some(ns) = s.namespace(nsid) {
                        out.insert(
                            (s.cfg.nqn.clone(), nsid),
                            Record {
                                nguid: ns.nguid,
                                state: st.clone(),
                            },
                        );
                    }
                }
            };
            match this {
                Some((t, states)) if t == id => add(states),
                _ => add(&s.cell.resv.lock()),
            }
        }
        out
    }

    /// Runs a reservation command of controller `cntlid` (an [`IoOp::Reservation`] from its
    /// I/O queue) with `data`, the bytes the host sent (Register, Acquire, Release): the
    /// completion status, and for a Report the data for the host (exactly the length the
    /// command asked for).
    ///
    /// A command that changes the state of a namespace with PTPL (or sets or clears PTPL)
    /// completes only once the state file holds the change; if the file cannot be written
    /// the command fails with Internal Error and the state stays as it was.
    pub fn reservation(&mut self, cntlid: Cntlid, req: &IoRequest, data: &[u8]) -> (Status, Vec<u8>) {
        let IoOp::Reservation(cmd) = req.op else {
            return (Status::INVALID_OPCODE, Vec::new());
        };
        let Some(c) = self.controllers.get(&cntlid) else {
            return (status::COMMAND_SEQUENCE_ERROR, Vec::new());
        };
        let (Some(sid), host) = (c.subsystem, c.hostid) else {
            return (status::COMMAND_SEQUENCE_ERROR, Vec::new());
        };
        let Some(sub) = self.subsystems.get(&sid) else {
            return (status::COMMAND_SEQUENCE_ERROR, Vec::new());
        };
        let nsid = req.nsid;
        let mut states = sub.cell.resv.lock();
        let old = states.get(&nsid).cloned().unwrap_or_default();
        if cmd.opcode == opcode::REPORT {
            // Hosts on fabrics have 128-bit identifiers (CTRATT bit 0): only the extended
            // data structure can name them (NVMe Base 2.0 §7.4, EDS).
            if cmd.cdw11 & 1 == 0 {
                return (HOST_ID_INCONSISTENT, Vec::new());
            }
            let controllers = |h: &[u8; 16]| {
                self.controllers
                    .values()
                    .filter(|c| c.subsystem == Some(sid) && c.hostid == *h)
                    .map(|c| c.cntlid.0)
                    .collect()
            };
            let mut page = old.report(controllers);
            page.resize(cmd.data.len() as usize, 0);
            return (Status::SUCCESS, page);
        }
        // A host without an identifier cannot be told from another (Host Identifier
        // feature: reservations need one).
        if host == [0; 16] {
            return (status::COMMAND_SEQUENCE_ERROR, Vec::new());
        }
        let ptpl_capable = self.resv.store.is_some();
        let mut st = old.clone();
        let result = run(&mut st, &host, &cmd, data, ptpl_capable);
        let notices = match result {
            Ok(n) => n,
            Err(e) => return (e, Vec::new()),
        };
        if (st.ptpl || old.ptpl) && st != old {
            if let Some(store) = &self.resv.store {
                let mut next = states.clone();
                next.insert(nsid, st.clone());
                let records = self.ptpl_records(Some((sid, &next)));
                if let Err(e) = store.save(&records) {
                    log::error!("namespace {nsid} of {}: {e}; the command fails", sub.cfg.nqn);
                    return (status::INTERNAL_ERROR, Vec::new());
                }
            }
        }
        sub.cell.resv.store(&mut states, nsid, st);
        drop(states);
        self.notify(sid, nsid, notices);
        (Status::SUCCESS, Vec::new())
    }

    /// Logs `notices` in the Reservation Notification logs of the hosts' controllers in
    /// subsystem `sid` and raises their Asynchronous Events (I/O command set specific,
    /// Reservation Log Page Available).
    fn notify(&mut self, sid: SubsystemId, nsid: u32, notices: Notices) {
        for (host, notice) in notices {
            for c in self
                .controllers
                .values_mut()
                .filter(|c| c.subsystem == Some(sid) && c.hostid == host)
            {
                if c.resv_log.push(nsid, notice) {
                    if let Some((cid, dw0)) = c.raise(Event::ReservationLog, 0) {
                        self.resv.events.push(AerCompletion {
                            cntlid: c.cntlid,
                            cqe: cqe(cid, Status::SUCCESS, dw0),
                        });
                    }
                }
            }
        }
    }

    /// The admin commands of reservations: Get Log Page 80h, Get and Set Features 82h and
    /// 83h, on an enabled I/O controller (anything else, and errors of the command's form
    /// that every admin command shares, are `None`: the general admin path answers).
    pub(crate) fn reservation_admin(&mut self, cntlid: Cntlid, sqe: &Sqe) -> Option<AdminOutcome> {
        let op = sqe.opcode();
        let id = sqe.dw[10] as u8;
        let ours = match op {
            admin_op::GET_LOG_PAGE => id == LOG_PAGE,
            admin_op::GET_FEATURES | admin_op::SET_FEATURES => {
                id == super::feature::NOTIFICATION_MASK || id == super::feature::PERSISTENCE
            }
            _ => false,
        };
        let c = self.controllers.get(&cntlid)?;
        if !ours
            || c.is_discovery()
            || c.expired
            || !c.enabled()
            || c.csts & crate::fabrics::controller::csts::CFS != 0
            || check_flags(sqe).is_err()
        {
            return None;
        }
        c.shared.touch();
        let cid = sqe.cid();
        let r = match op {
            admin_op::GET_LOG_PAGE => self.resv_log_page(cntlid, sqe),
            admin_op::GET_FEATURES => self.resv_get_feature(cntlid, sqe),
            _ => self.resv_set_feature(cntlid, sqe),
        };
        Some(match r {
            Ok((dw0, data)) => AdminOutcome::Complete {
                cqe: cqe(cid, Status::SUCCESS, dw0),
                data,
                effect: None,
            },
            Err(st) => {
                if let Some(c) = self.controllers.get(&cntlid) {
                    c.shared.errors().record(0, cid, st, sqe.nsid(), 0);
                }
                AdminOutcome::Complete {
                    cqe: cqe(cid, st, 0),
                    data: Vec::new(),
                    effect: None,
                }
            }
        })
    }

    /// The namespace IDs a namespace-specific feature command names: one active namespace,
    /// or every one for FFFFFFFFh (Set Features only).
    fn feature_nsids(
        &self,
        cntlid: Cntlid,
        nsid: u32,
        broadcast: bool,
    ) -> Result<(SubsystemId, Vec<u32>), Status> {
        let sid = self
            .controllers
            .get(&cntlid)
            .and_then(|c| c.subsystem)
            .ok_or(status::COMMAND_SEQUENCE_ERROR)?;
        let s = &self.subsystems[&sid];
        if nsid == u32::MAX && broadcast {
            return Ok((sid, s.cfg.namespaces.iter().map(|n| n.nsid).collect()));
        }
        match s.namespace(nsid) {
            Some(_) => Ok((sid, vec![nsid])),
            None => Err(Status::INVALID_NAMESPACE),
        }
    }

    /// Get Log Page 80h (NVMe Base 2.0 §5.16.1.24): the oldest notice, taken unless RAE.
    fn resv_log_page(&mut self, cntlid: Cntlid, sqe: &Sqe) -> Result<(u32, Vec<u8>), Status> {
        let rae = sqe.dw[10] & 1 << 15 != 0;
        let numd = ((sqe.dw[11] & 0xffff) as u64) << 16 | (sqe.dw[10] >> 16) as u64;
        let len = (numd + 1) * 4;
        let offset = sqe.dw[12] as u64 | (sqe.dw[13] as u64) << 32;
        if sqe.dw[14] & 1 << 23 != 0 || !offset.is_multiple_of(4) || offset > LOG_PAGE_BYTES as u64 {
            return Err(Status::INVALID_FIELD);
        }
        if len > self.opts.max_transfer as u64 {
            return Err(Status::INVALID_FIELD);
        }
        match data_xfer(sqe, 0)? {
            DataXfer::ToHost { len: l } if l as u64 == len => {}
            _ => return Err(status::DATA_SGL_LENGTH_INVALID),
        }
        let c = self
            .controllers
            .get_mut(&cntlid)
            .ok_or(status::COMMAND_SEQUENCE_ERROR)?;
        let page = c.resv_log.page(!rae);
        if !rae {
            c.log_read(LOG_PAGE);
        }
        let mut data = vec![0u8; len as usize];
        let from = &page[offset as usize..];
        let n = from.len().min(data.len());
        data[..n].copy_from_slice(&from[..n]);
        Ok((0, data))
    }

    /// Get Features 82h (the namespace's notification mask) and 83h (PTPL), SEL current,
    /// default (0), saved (as default: nothing is saveable) or capabilities (changeable,
    /// namespace specific).
    fn resv_get_feature(&self, cntlid: Cntlid, sqe: &Sqe) -> Result<(u32, Vec<u8>), Status> {
        let fid = sqe.dw[10] as u8;
        let sel = (sqe.dw[10] >> 8) & 0b111;
        let (sid, nsids) = self.feature_nsids(cntlid, sqe.nsid(), false)?;
        let nsid = nsids[0];
        match sel {
            0b011 => return Ok((1 << 2 | 1 << 1, Vec::new())),
            0b001 | 0b010 => return Ok((0, Vec::new())),
            0b000 => {}
            _ => return Err(Status::INVALID_FIELD),
        }
        let v = if fid == super::feature::NOTIFICATION_MASK {
            self.controllers[&cntlid].resv_log.mask(nsid)
        } else {
            self.reservation_state(sid, nsid).ptpl as u32
        };
        Ok((v, Vec::new()))
    }

    /// Set Features 82h (mask bits 1 to 3 of CDW11, per controller) and 83h (PTPL, CDW11 bit
    /// 0: Invalid Field unless the target has a state file; a change is written to it before
    /// the command completes). Save (SV) is Feature Identifier Not Saveable.
    fn resv_set_feature(&mut self, cntlid: Cntlid, sqe: &Sqe) -> Result<(u32, Vec<u8>), Status> {
        if sqe.dw[10] & 1 << 31 != 0 {
            return Err(status::FEATURE_NOT_SAVEABLE);
        }
        let fid = sqe.dw[10] as u8;
        let dw11 = sqe.dw[11];
        let (sid, nsids) = self.feature_nsids(cntlid, sqe.nsid(), true)?;
        if fid == super::feature::NOTIFICATION_MASK {
            if dw11 & !0b1110 != 0 {
                return Err(Status::INVALID_FIELD);
            }
            let c = self
                .controllers
                .get_mut(&cntlid)
                .ok_or(status::COMMAND_SEQUENCE_ERROR)?;
            c.resv_log.set_mask(nsids, dw11);
            return Ok((0, Vec::new()));
        }
        let ptpl = dw11 & 1 != 0;
        if dw11 & !1 != 0 || (ptpl && self.resv.store.is_none()) {
            return Err(Status::INVALID_FIELD);
        }
        let s = &self.subsystems[&sid];
        let mut states = s.cell.resv.lock();
        let mut next = states.clone();
        for &n in &nsids {
            next.entry(n).or_default().ptpl = ptpl;
        }
        if let Some(store) = &self.resv.store {
            if next
                .iter()
                .any(|(n, st)| states.get(n).is_none_or(|o| o.ptpl != st.ptpl))
            {
                let records = self.ptpl_records(Some((sid, &next)));
                if let Err(e) = store.save(&records) {
                    log::error!("{}: {e}; Set Features (PTPL) fails", s.cfg.nqn);
                    return Err(status::INTERNAL_ERROR);
                }
            }
        }
        for n in nsids {
            let st = next.remove(&n).unwrap_or_default();
            s.cell.resv.store(&mut states, n, st);
        }
        Ok((0, Vec::new()))
    }
}

/// Runs one state-changing reservation command on `st` (NVMe Base 2.0 §7.3, §7.5, §7.6).
fn run(
    st: &mut NsResv,
    host: &[u8; 16],
    cmd: &ResvCommand,
    data: &[u8],
    ptpl_capable: bool,
) -> Result<Notices, Status> {
    if data.len() != cmd.data.len() as usize {
        return Err(status::DATA_SGL_LENGTH_INVALID);
    }
    let key = |o: usize| wire::le64(data, o);
    let action = cmd.cdw10 & 0b111;
    let iekey = cmd.cdw10 & 1 << 3 != 0;
    let rtype = (cmd.cdw10 >> 8) as u8;
    match cmd.opcode {
        opcode::REGISTER => {
            let action = match action {
                0 => RegisterAction::Register,
                1 => RegisterAction::Unregister,
                2 => RegisterAction::Replace,
                _ => return Err(Status::INVALID_FIELD),
            };
            // CPTPL, bits 31:30: 00b no change, 01b reserved, 10b clear, 11b set.
            let ptpl = match cmd.cdw10 >> 30 {
                0 => None,
                2 => Some(false),
                3 if ptpl_capable => Some(true),
                _ => return Err(Status::INVALID_FIELD),
            };
            st.register(host, action, iekey, key(0), key(8), ptpl)
        }
        opcode::ACQUIRE => {
            // IEKEY is reserved for Acquire and Release since NVMe 1.3 (RESCAP bit 7).
            if iekey {
                return Err(Status::INVALID_FIELD);
            }
            let action = match action {
                0 => AcquireAction::Acquire,
                1 => AcquireAction::Preempt,
                2 => AcquireAction::PreemptAndAbort,
                _ => return Err(Status::INVALID_FIELD),
            };
            let rtype = ResvType::from_rtype(rtype).ok_or(Status::INVALID_FIELD)?;
            st.acquire(host, action, rtype, key(0), key(8))
        }
        opcode::RELEASE => {
            if iekey {
                return Err(Status::INVALID_FIELD);
            }
            let action = match action {
                0 => ReleaseAction::Release,
                1 => ReleaseAction::Clear,
                _ => return Err(Status::INVALID_FIELD),
            };
            st.release(host, action, rtype, key(0))
        }
        _ => Err(Status::INVALID_OPCODE),
    }
}
