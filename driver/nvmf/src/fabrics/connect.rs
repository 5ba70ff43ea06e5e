//! Connect (NVMe-oF 1.1 §3.3; the dynamic controller model), the I/O queues it opens, the
//! keep-alive timer and teardown: the part of [`Target`] a connection meets first and last.

use std::time::Instant;

use vfpoll_nvme_spec::status::Status;

use super::config::{DISCOVERY_NQN, NQN_MAX};
use super::controller::{csts, Controller};
use super::io::{self, IoLimits, IoQueue, IoRequest};
use super::target::Target;
use super::types::{
    Cntlid, ConnInfo, QueueRef, SubsystemId, ADMIN_IN_CAPSULE, ADMIN_QUEUE_ENTRIES, DISCOVERY_KATO_MS,
};
use super::wire::{self, check_flags, cqe, data_xfer, status, Cqe, Sqe};

/// Bytes of the Connect command's data.
pub const CONNECT_DATA_BYTES: usize = 1024;

/// The highest controller ID (FFF0h to FFFFh are reserved; NVMe Base 2.0 Figure 275, CNTLID).
const CNTLID_MAX: u16 = 0xffef;

/// Byte offsets of the Connect command fields in the SQE, for IPO (NVMe-oF 1.1, Connect
/// command).
pub mod connect_off {
    /// Record Format.
    pub const RECFMT: u16 = 40;
    /// Queue ID.
    pub const QID: u16 = 42;
    /// Submission Queue Size (0's based).
    pub const SQSIZE: u16 = 44;
    /// Connect Attributes.
    pub const CATTR: u16 = 46;
    /// Keep Alive Timeout (ms).
    pub const KATO: u16 = 48;
}

/// Byte offsets of the Connect data fields, for IPO with IATTR 1.
pub mod connect_data_off {
    /// Host Identifier, 16 bytes.
    pub const HOSTID: u16 = 0;
    /// Controller ID.
    pub const CNTLID: u16 = 16;
    /// Subsystem NQN, 256 bytes.
    pub const SUBNQN: u16 = 256;
    /// Host NQN, 256 bytes.
    pub const HOSTNQN: u16 = 512;
}

/// Completion dword 0 of Connect Invalid Parameters: IATTR in bits 23:16 (bit 16 set: the
/// parameter is in the Connect data, clear: in the SQE) and IPO, the byte offset, in 15:0
/// (NVMe-oF 1.1 Connect response; Linux's host reads it so).
pub fn connect_ipo(in_data: bool, offset: u16) -> u32 {
    (in_data as u32) << 16 | offset as u32
}

/// A queue connected by Connect.
#[derive(Debug)]
pub struct ConnectOutcome {
    /// The queue: its controller and QID.
    pub queue: QueueRef,
    /// The Connect response: CNTLID in dword 0.
    pub cqe: Cqe,
    /// Submission queue entries (SQSIZE + 1): commands the host may have outstanding.
    pub entries: u32,
    /// The host disabled SQ flow control (CATTR bit 2): SQHD is not reported.
    pub sq_flow_control_disabled: bool,
    /// In-capsule data the queue accepts in bytes.
    pub in_capsule_max: u32,
    /// A connection to the discovery controller.
    pub discovery: bool,
    /// For an I/O queue: its decoder, for the worker that serves it.
    pub io: Option<IoQueue>,
    /// The host as logs and metrics name it ([`host_label`]).
    pub host: String,
}

impl Target {
    /// Handles the Connect command that opens a queue (NVMe-oF 1.1 §3.3, Connect command):
    /// `connect_data` is its 1024-byte data, `peer` the connection. QID 0 creates a controller
    /// (CNTLID FFFFh in the data: the target allocates one); an I/O queue joins the
    /// controller named by CNTLID, which must belong to the same host NQN and host ID.
    ///
    /// An empty HOSTNQN (the first byte NUL) is accepted where the subsystem allows any host,
    /// as Linux's target does: the host is then known by its HOSTID ([`host_label`]), and its
    /// I/O queues must name the same (empty) host NQN and HOSTID. Where an allow list exists
    /// it is Connect Invalid Host, and so is an empty HOSTNQN with a zero HOSTID, which leaves
    /// the host no identity at all.
    ///
    /// Refusals carry DNR and are logged at `warn` with the peer, the field, its value and
    /// the rule broken: Connect Incompatible Format for RECFMT ≠ 0; Connect Invalid
    /// Parameters with IATTR/IPO (dword 0, [`connect_ipo`]) naming the field for an unknown
    /// subsystem NQN, a malformed NQN, a CNTLID that names no controller of this host, a QID
    /// beyond the I/O queues granted, or an SQSIZE of 0 or past the queue limit; Connect
    /// Invalid Host for a host the subsystem does not allow; Command Sequence Error for a QID
    /// already connected or an I/O queue before the controller is enabled.
    pub fn connect(
        &mut self,
        sqe: &Sqe,
        connect_data: &[u8; CONNECT_DATA_BYTES],
        peer: ConnInfo,
    ) -> Result<ConnectOutcome, Cqe> {
        let who = peer.peer.clone();
        let mut out = self.connect_checked(sqe, connect_data, peer).map_err(|r| {
            log::warn!(
                "{who}: Connect refused ({}): {} = {}: {}",
                r.cqe.status(),
                r.field,
                r.value,
                r.rule
            );
            if let Some(id) = r.subsystem {
                self.refused_connects
                    .entry(id)
                    .and_modify(|n| *n += 1)
                    .or_insert(1);
            }
            r.cqe
        })?;
        // A host with a secret must authenticate the queue (AUTHREQ; `auth`).
        self.auth_connected(&mut out);
        Ok(out)
    }

    /// Connects refused per subsystem since the start (the Connects that named no known
    /// subsystem are not counted).
    pub fn refused_connects(&self, id: SubsystemId) -> u64 {
        self.refused_connects.get(&id).copied().unwrap_or(0)
    }

    fn connect_checked(
        &mut self,
        sqe: &Sqe,
        connect_data: &[u8; CONNECT_DATA_BYTES],
        peer: ConnInfo,
    ) -> Result<ConnectOutcome, Refusal> {
        let cid = sqe.cid();
        let refuse = |st: Status, dw0: u32, field: &'static str, value: String, rule: &str| Refusal {
            cqe: cqe(cid, st, dw0),
            field,
            value,
            rule: rule.to_owned(),
            subsystem: None,
        };
        let invalid = |in_data: bool, off: u16, field: &'static str, value: String, rule: &str| {
            refuse(
                status::CONNECT_INVALID_PARAMETERS,
                connect_ipo(in_data, off),
                field,
                value,
                rule,
            )
        };
        if !wire::is_connect(sqe) {
            // Linux's target: any other command on an unconnected queue.
            return Err(refuse(
                Status::INVALID_OPCODE,
                0,
                "opcode",
                format!("{:#04x}/fctype {:#04x}", sqe.opcode(), sqe.dw[1] as u8),
                "the first command of a queue must be Connect (NVMe-oF 1.1 §3.3)",
            ));
        }
        if let Err(st) = check_flags(sqe) {
            return Err(refuse(
                st,
                0,
                "CDW0 flags",
                format!("{:#010x}", sqe.dw[0]),
                "fabrics commands use SGLs (PSDT 01b or 10b) and no fused operation",
            ));
        }
        match data_xfer(sqe, ADMIN_IN_CAPSULE) {
            Ok(d) if d.len() as usize == CONNECT_DATA_BYTES => {}
            Ok(d) => {
                return Err(refuse(
                    status::DATA_SGL_LENGTH_INVALID,
                    0,
                    "SGL length",
                    d.len().to_string(),
                    "Connect carries exactly 1024 bytes of data",
                ))
            }
            Err(st) => {
                return Err(refuse(
                    st,
                    0,
                    "SGL",
                    format!("{:#010x}", sqe.dw[9]),
                    "Connect data comes in the capsule or through R2T",
                ))
            }
        }
        let recfmt = sqe.dw[10] as u16;
        let qid = (sqe.dw[10] >> 16) as u16;
        let sqsize = sqe.dw[11] as u16;
        let cattr = (sqe.dw[11] >> 16) as u8;
        let kato_ms = sqe.dw[12];
        if recfmt != 0 {
            return Err(refuse(
                status::CONNECT_INCOMPATIBLE_FORMAT,
                0,
                "RECFMT",
                recfmt.to_string(),
                "record format 0 is the only one defined",
            ));
        }
        let subnqn = match nqn_field(connect_data, connect_data_off::SUBNQN) {
            Ok(s) if !s.is_empty() => s,
            r => {
                return Err(invalid(
                    true,
                    connect_data_off::SUBNQN,
                    "SUBNQN",
                    field_text(connect_data, connect_data_off::SUBNQN),
                    match r {
                        Ok(_) => "a Connect names its subsystem",
                        Err(why) => why,
                    },
                ))
            }
        };
        let hostnqn = match nqn_field(connect_data, connect_data_off::HOSTNQN) {
            Ok(h) => h,
            Err(why) => {
                return Err(invalid(
                    true,
                    connect_data_off::HOSTNQN,
                    "HOSTNQN",
                    field_text(connect_data, connect_data_off::HOSTNQN),
                    why,
                ))
            }
        };
        let mut hostid = [0u8; 16];
        hostid.copy_from_slice(&connect_data[..16]);
        let subsystem = if subnqn == DISCOVERY_NQN {
            None
        } else {
            let Some(id) = self.subsystem_id(subnqn) else {
                return Err(invalid(
                    true,
                    connect_data_off::SUBNQN,
                    "SUBNQN",
                    subnqn.to_owned(),
                    "no such subsystem on this target",
                ));
            };
            let cfg = &self.subsystems[&id].cfg;
            let host_refused = |value: String, rule: &str| {
                let mut r = refuse(
                    status::CONNECT_INVALID_HOST,
                    connect_ipo(true, connect_data_off::HOSTNQN),
                    "HOSTNQN",
                    value,
                    rule,
                );
                r.subsystem = Some(id);
                r
            };
            if hostnqn.is_empty() && cfg.allowed_hosts.is_some() {
                return Err(host_refused(
                    "\"\"".into(),
                    &format!("{subnqn} allows only the hosts it lists, and an empty host NQN names none"),
                ));
            }
            if hostnqn.is_empty() && hostid == [0; 16] {
                return Err(host_refused(
                    "\"\" with HOSTID 0".into(),
                    "a host without a host NQN is known by its HOSTID, and a zero HOSTID names no host",
                ));
            }
            if !cfg.host_allowed(hostnqn) {
                return Err(host_refused(
                    hostnqn.to_owned(),
                    &format!("not among the allowed hosts of {subnqn}"),
                ));
            }
            Some(id)
        };
        let data_cntlid = wire::le16(connect_data, connect_data_off::CNTLID as usize);
        let flow_off = cattr & 1 << 2 != 0;
        let hostnqn = hostnqn.to_owned();
        let in_subsystem = |mut r: Refusal| {
            r.subsystem = subsystem;
            r
        };

        if qid == 0 {
            if data_cntlid != 0xffff {
                return Err(in_subsystem(invalid(
                    true,
                    connect_data_off::CNTLID,
                    "CNTLID",
                    format!("{data_cntlid:#06x}"),
                    "an admin queue's Connect asks for a new controller with FFFFh (dynamic controller model)",
                )));
            }
            if sqsize == 0 || sqsize as u32 >= ADMIN_QUEUE_ENTRIES {
                return Err(in_subsystem(invalid(
                    false,
                    connect_off::SQSIZE,
                    "SQSIZE",
                    sqsize.to_string(),
                    "an admin queue has 2 to 32 entries (SQSIZE 1 to 31, 0's based)",
                )));
            }
            let Some(cntlid) = self.allocate_cntlid() else {
                return Err(in_subsystem(refuse(
                    status::CONNECT_CONTROLLER_BUSY,
                    0,
                    "CNTLID",
                    "FFFFh".into(),
                    "every controller ID is in use",
                )));
            };
            let kato_ms = if subsystem.is_none() && kato_ms == 0 {
                DISCOVERY_KATO_MS
            } else {
                kato_ms
            };
            let granted = if subsystem.is_some() {
                self.opts.max_io_queues
            } else {
                0
            };
            let ana = self.ana.cell(peer.portid);
            let host = host_label(&hostnqn, &hostid);
            let c = Controller::new(cntlid, subsystem, hostnqn, hostid, peer, kato_ms, granted, ana);
            self.controllers.insert(cntlid, c);
            log::debug!("controller {} created for {} by {host}", cntlid.0, subnqn);
            return Ok(ConnectOutcome {
                queue: QueueRef { cntlid, qid: 0 },
                cqe: cqe(cid, Status::SUCCESS, cntlid.0.into()),
                entries: sqsize as u32 + 1,
                sq_flow_control_disabled: flow_off,
                in_capsule_max: ADMIN_IN_CAPSULE,
                discovery: subsystem.is_none(),
                io: None,
                host,
            });
        }

        let Some(sid) = subsystem else {
            return Err(invalid(
                false,
                connect_off::QID,
                "QID",
                qid.to_string(),
                "a discovery controller has no I/O queues",
            ));
        };
        let cntlid = Cntlid(data_cntlid);
        let Some(c) = self
            .controllers
            .get_mut(&cntlid)
            .filter(|c| c.subsystem == Some(sid) && c.hostnqn == hostnqn && c.hostid == hostid && !c.expired)
        else {
            return Err(in_subsystem(invalid(
                true,
                connect_data_off::CNTLID,
                "CNTLID",
                data_cntlid.to_string(),
                "an I/O queue joins a live controller of the same subsystem, host NQN and HOSTID",
            )));
        };
        if !c.enabled() {
            return Err(in_subsystem(refuse(
                status::COMMAND_SEQUENCE_ERROR,
                0,
                "QID",
                qid.to_string(),
                "I/O queues connect once the controller is enabled (CC.EN and CSTS.RDY)",
            )));
        }
        if qid > c.granted {
            let rule = format!("the controller was granted {} I/O queues", c.granted);
            return Err(in_subsystem(invalid(
                false,
                connect_off::QID,
                "QID",
                qid.to_string(),
                &rule,
            )));
        }
        if c.io_queues.contains(&qid) {
            return Err(in_subsystem(refuse(
                status::COMMAND_SEQUENCE_ERROR,
                0,
                "QID",
                qid.to_string(),
                "the queue is connected already",
            )));
        }
        if sqsize == 0 || sqsize as u32 >= self.opts.max_queue_entries {
            let rule = format!(
                "an I/O queue has 2 to {} entries (CAP.MQES + 1)",
                self.opts.max_queue_entries
            );
            return Err(in_subsystem(invalid(
                false,
                connect_off::SQSIZE,
                "SQSIZE",
                sqsize.to_string(),
                &rule,
            )));
        }
        c.io_queues.insert(qid);
        c.shared.touch();
        let queue = QueueRef { cntlid, qid };
        let ioq = IoQueue::new(
            queue,
            sid,
            c.shared.clone(),
            self.subsystems[&sid].cell.clone(),
            self.io_limits(),
            host_label(&hostnqn, &hostid),
        );
        Ok(ConnectOutcome {
            queue,
            cqe: cqe(cid, Status::SUCCESS, cntlid.0.into()),
            entries: sqsize as u32 + 1,
            sq_flow_control_disabled: flow_off,
            in_capsule_max: self.opts.in_capsule_data,
            discovery: false,
            io: Some(ioq),
            host: host_label(&hostnqn, &hostid),
        })
    }

    fn io_limits(&self) -> IoLimits {
        IoLimits {
            max_transfer: self.opts.max_transfer,
            in_capsule: self.opts.in_capsule_data,
        }
    }

    /// The next free controller ID after the last one given (so that a host's stale
    /// references to a dropped controller do not meet a new one at once).
    fn allocate_cntlid(&mut self) -> Option<Cntlid> {
        for _ in 0..CNTLID_MAX {
            let c = Cntlid(self.next_cntlid);
            self.next_cntlid = if self.next_cntlid >= CNTLID_MAX {
                1
            } else {
                self.next_cntlid + 1
            };
            if !self.controllers.contains_key(&c) {
                return Some(c);
            }
        }
        None
    }

    /// The decoder of a connected I/O queue (another for the same queue, e.g. after a worker
    /// restarts).
    pub fn io_queue(&self, queue: QueueRef) -> Option<IoQueue> {
        // None before the queue authenticated (`auth`).
        if !self.queue_authenticated(queue) {
            return None;
        }
        let c = self.controllers.get(&queue.cntlid)?;
        let sid = c.subsystem?;
        c.io_queues.contains(&queue.qid).then(|| {
            IoQueue::new(
                queue,
                sid,
                c.shared.clone(),
                self.subsystems[&sid].cell.clone(),
                self.io_limits(),
                host_label(&c.hostnqn, &c.hostid),
            )
        })
    }

    /// Decodes an I/O command of controller `cntlid` (as [`IoQueue::decode`], for callers
    /// that hold the target; errors are logged with SQID FFFFh, the queue not being known).
    pub fn io_command(&self, cntlid: Cntlid, sqe: &Sqe) -> Result<IoRequest, Cqe> {
        let refuse = |st| Err(cqe(sqe.cid(), st, 0));
        if !self.queue_authenticated(QueueRef { cntlid, qid: 0 }) {
            return refuse(super::auth::AUTHENTICATION_REQUIRED);
        }
        let Some(c) = self.controllers.get(&cntlid) else {
            return refuse(status::COMMAND_SEQUENCE_ERROR);
        };
        let Some(sid) = c.subsystem else {
            return refuse(status::COMMAND_SEQUENCE_ERROR);
        };
        let table = self.subsystems[&sid].cell.current();
        let resv = &self.subsystems[&sid].cell.resv;
        io::decode(&table, resv, &c.shared, self.io_limits(), sid, sqe).map_err(|st| {
            c.shared
                .errors()
                .record(0xffff, sqe.cid(), st, sqe.nsid(), io::error_lba(sqe));
            cqe(sqe.cid(), st, 0)
        })
    }

    /// Records a failed command (e.g. a backend error) in the controller's Error
    /// Information log.
    pub fn record_error(&self, queue: QueueRef, cid: u16, status: Status, nsid: u32, lba: u64) {
        if let Some(c) = self.controllers.get(&queue.cntlid) {
            c.shared.errors().record(queue.qid, cid, status, nsid, lba);
        }
    }

    /// A queue's connection ended. The admin queue's end ends the association (NVMe-oF
    /// 1.1: a controller lives as long as its admin queue): the controller is removed, and
    /// its I/O queues are returned for the runtime to close. An I/O queue's end frees its QID.
    pub fn disconnect(&mut self, queue: QueueRef) -> Vec<QueueRef> {
        if queue.qid != 0 {
            if let Some(c) = self.controllers.get_mut(&queue.cntlid) {
                c.io_queues.remove(&queue.qid);
            }
            self.auth_forget(queue);
            return Vec::new();
        }
        let mut rest = self.drop_controller(queue.cntlid);
        rest.retain(|q| q.qid != 0);
        rest
    }

    /// Removes a controller (its keep-alive expired, or the runtime tears it down): every
    /// queue it had, admin queue first, for the runtime to close. Decoders of its I/O queues
    /// refuse further commands.
    pub fn drop_controller(&mut self, cntlid: Cntlid) -> Vec<QueueRef> {
        let Some(c) = self.controllers.remove(&cntlid) else {
            return Vec::new();
        };
        c.shared.ready.store(false, std::sync::atomic::Ordering::Release);
        self.auth_forget(QueueRef { cntlid, qid: 0 });
        log::debug!("controller {} of {} removed", cntlid.0, c.hostnqn);
        std::iter::once(0)
            .chain(c.io_queues.iter().copied())
            .map(|qid| QueueRef { cntlid, qid })
            .collect()
    }

    /// Advances the keep-alive timers to `now` (NVMe Base 2.0 §3.9, Keep Alive; with
    /// Traffic Based Keep Alive, CTRATT bit 6, any command restarts a timer): returns the
    /// controllers whose KATO passed without a command, each once. They stop processing
    /// commands (CSTS.CFS); the runtime drops them with [`Target::drop_controller`].
    ///
    /// A timer restarts at the first tick after a command, so expiry is detected up to one
    /// tick interval late: tick at least every second (KAS is 1 s).
    pub fn tick(&mut self, now: Instant) -> Vec<Cntlid> {
        let mut expired = Vec::new();
        for c in self.controllers.values_mut() {
            if c.expired {
                continue;
            }
            if c.shared.take_traffic() || c.last_activity.is_none() {
                c.last_activity = Some(now);
                continue;
            }
            let (Some(kato), Some(last)) = (c.kato(), c.last_activity) else {
                continue;
            };
            if now.saturating_duration_since(last) >= kato {
                c.expired = true;
                c.csts |= csts::CFS;
                c.publish_ready();
                log::info!(
                    "controller {} of {}: keep-alive timeout ({} ms) expired",
                    c.cntlid.0,
                    c.hostnqn,
                    c.kato_ms
                );
                expired.push(c.cntlid);
            }
        }
        expired
    }
}

/// A refused Connect: the completion, and what the log says about it.
struct Refusal {
    cqe: Cqe,
    /// The field at fault.
    field: &'static str,
    /// Its value, as text.
    value: String,
    /// The rule it broke.
    rule: String,
    /// The subsystem the Connect named, when it names one of this target's.
    subsystem: Option<SubsystemId>,
}

/// An NQN field of the Connect data: UTF-8 up to the first NUL, which must come within the
/// 256 bytes, at most 223 bytes, starting "nqn." unless empty (an empty field is the
/// caller's to judge). Only that much of the NQN forms is checked (hosts name themselves
/// freely; a subsystem that restricts hosts compares exactly).
fn nqn_field(data: &[u8], offset: u16) -> Result<&str, &'static str> {
    let f = &data[offset as usize..offset as usize + 256];
    let end = f
        .iter()
        .position(|&b| b == 0)
        .ok_or("an NQN field ends with a NUL within its 256 bytes (NVMe Base 2.0 §4.5)")?;
    let s = std::str::from_utf8(&f[..end]).map_err(|_| "an NQN is UTF-8 (NVMe Base 2.0 §4.5)")?;
    if s.len() > NQN_MAX {
        return Err("an NQN is at most 223 bytes (NVMe Base 2.0 §4.5)");
    }
    if !s.is_empty() && !s.starts_with("nqn.") {
        return Err("an NQN starts with \"nqn.\" (NVMe Base 2.0 §4.5)");
    }
    Ok(s)
}

/// An NQN field as text for a log line: up to its first NUL (or all 256 bytes), lossily
/// decoded, control characters escaped, cut at 64 characters.
fn field_text(data: &[u8], offset: u16) -> String {
    let f = &data[offset as usize..offset as usize + 256];
    let end = f.iter().position(|&b| b == 0).unwrap_or(f.len());
    let text: String = String::from_utf8_lossy(&f[..end]).chars().take(64).collect();
    format!("{text:?}{}", if end > 64 { "..." } else { "" })
}

/// How a host is named in logs and metrics: its host NQN, or, for a host that sent an empty
/// one, `hostid:` and its HOSTID as a UUID.
pub fn host_label(hostnqn: &str, hostid: &[u8; 16]) -> String {
    if !hostnqn.is_empty() {
        return hostnqn.to_owned();
    }
    let h: String = hostid.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "hostid:{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}
