//! Admin commands (NVMe Base 2.0 §5) and the Fabrics commands of the admin queue
//! (Property Get/Set, NVMe-oF 1.1 §3): what a controller answers, what a discovery controller
//! answers (Identify Controller, the Discovery log page, Keep Alive, Asynchronous Event
//! Requests and their two features; NVMe-oF 1.1 "Discovery Controller"), and what neither does.

use std::sync::atomic::Ordering;

use vfpoll_nvme_spec::cmd::{admin_op, feature};
use vfpoll_nvme_spec::status::Status;

use super::ana::{self, AnaPorts};
use super::config::{Listener, NamespaceInfo, Subsystem, TargetOptions, DISCOVERY_NQN};
use super::controller::{csts, CcChange, Controller, Features, WCE_DEFAULT};
use super::identify::{self, ctrl_val, ControllerPage, IDENTIFY_BYTES};
use super::logpage::{self, lid, subtype, DiscoveryEntry, Health};
use super::target::{SubsysState, Target};
use super::types::{Cntlid, QueueRef, SubsystemId, ADMIN_QUEUE_ENTRIES, DISCOVERY_KATO_MS};
use super::wire::{check_flags, cqe, expect_to_host, fctype, fctype_of, status, Cqe, Sqe, FABRICS_OPCODE};

/// The Keep Alive opcode (NVMe Base 2.0 Figure 138).
const KEEP_ALIVE: u8 = 0x18;
/// Host Identifier feature (NVMe Base 2.0 §5.27.1).
const FEATURE_HOST_ID: u8 = 0x81;
/// Temperature Threshold feature.
const FEATURE_TEMPERATURE: u8 = feature::TEMPERATURE_THRESHOLD;
/// SMART critical warnings a host may enable events for (AEC bits 4:0).
const AEC_SMART: u32 = 0x1f;

/// The answer to an admin command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminOutcome {
    /// Send `data` to the host (C2HData; empty: none), then `cqe`.
    Complete {
        /// The completion.
        cqe: Cqe,
        /// Data for the host, exactly as long as the command asked for.
        data: Vec<u8>,
        /// What the runtime should do besides.
        effect: Option<AdminEffect>,
    },
    /// An Asynchronous Event Request, held: its completion comes from a later event
    /// ([`AerCompletion`](super::AerCompletion)), or never if the controller goes away.
    Held,
}

impl AdminOutcome {
    fn refused(cqe: Cqe) -> Self {
        AdminOutcome::Complete {
            cqe,
            data: Vec::new(),
            effect: None,
        }
    }

    /// The completion, unless held.
    pub fn cqe(&self) -> Option<&Cqe> {
        match self {
            AdminOutcome::Complete { cqe, .. } => Some(cqe),
            AdminOutcome::Held => None,
        }
    }
}

/// What an admin command asks of the runtime beyond its completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminEffect {
    /// The host shut the controller down (CC.SHN; CSTS.SHST already reports it complete):
    /// a good moment to flush the backends' volatile caches.
    Shutdown,
    /// The host reset the controller (CC.EN 1→0): close these I/O queues; held Asynchronous
    /// Event Requests are gone.
    Reset {
        /// The I/O queues the controller had.
        io_queues: Vec<QueueRef>,
    },
}

struct Reply {
    dw0: u32,
    dw1: u32,
    data: Vec<u8>,
    effect: Option<AdminEffect>,
}

impl Reply {
    fn dw0(dw0: u32) -> Self {
        Reply {
            dw0,
            dw1: 0,
            data: Vec::new(),
            effect: None,
        }
    }

    fn data(data: Vec<u8>) -> Self {
        Reply {
            data,
            ..Reply::dw0(0)
        }
    }
}

enum Outcome {
    Reply(Reply),
    Held,
}

/// What a command may read beyond its controller.
struct Cx<'a> {
    opts: &'a TargetOptions,
    listeners: &'a [Listener],
    subsystems: &'a std::collections::BTreeMap<SubsystemId, SubsysState>,
    /// The controller's subsystem (`None` for a discovery controller).
    sub: Option<&'a SubsysState>,
    genctr: u64,
    ana: &'a AnaPorts,
    /// Reservations persist through power loss (the target has a state file).
    ptpl: bool,
}

impl Target {
    /// Executes an admin command of controller `cntlid`: the completion and the data for
    /// the host, or [`AdminOutcome::Held`] for an Asynchronous Event Request. `in_data` is
    /// the data the command carried (in the capsule or after R2T; see
    /// [`data_xfer`](super::data_xfer)); Authentication Send is the only command that takes any
    /// ([`Target::authenticate`]).
    ///
    /// A failed command is recorded in the controller's Error Information log. Any command
    /// counts as traffic for the keep-alive timer.
    pub fn admin(&mut self, cntlid: Cntlid, sqe: &Sqe, in_data: &[u8]) -> AdminOutcome {
        let cid = sqe.cid();
        // Before a host that must authenticate has, only authentication (`auth`).
        if let Some(out) = self.auth_gate(QueueRef { cntlid, qid: 0 }, sqe, in_data) {
            return out;
        }
        // Log page 80h and features 82h/83h live with the reservations (`resv`).
        if let Some(out) = self.reservation_admin(cntlid, sqe) {
            return out;
        }
        let Target {
            opts,
            listeners,
            subsystems,
            controllers,
            genctr,
            ana,
            resv,
            ..
        } = self;
        let Some(ctrl) = controllers.get_mut(&cntlid) else {
            return AdminOutcome::refused(cqe(cid, status::COMMAND_SEQUENCE_ERROR, 0));
        };
        ctrl.shared.touch();
        let cx = Cx {
            opts,
            listeners,
            subsystems,
            sub: ctrl.subsystem.and_then(|id| subsystems.get(&id)),
            genctr: *genctr,
            ana,
            ptpl: resv.ptpl_capable(),
        };
        match dispatch(&cx, ctrl, sqe) {
            Ok(Outcome::Held) => AdminOutcome::Held,
            Ok(Outcome::Reply(r)) => AdminOutcome::Complete {
                cqe: Cqe {
                    dw1: r.dw1,
                    ..cqe(cid, Status::SUCCESS, r.dw0)
                },
                data: r.data,
                effect: r.effect,
            },
            Err(st) => {
                ctrl.shared.errors().record(0, cid, st, sqe.nsid(), 0);
                AdminOutcome::refused(cqe(cid, st, 0))
            }
        }
    }
}

fn dispatch(cx: &Cx<'_>, ctrl: &mut Controller, sqe: &Sqe) -> Result<Outcome, Status> {
    if ctrl.expired {
        return Err(status::COMMAND_SEQUENCE_ERROR);
    }
    check_flags(sqe)?;
    let op = sqe.opcode();
    if op == FABRICS_OPCODE {
        return fabrics(cx, ctrl, sqe).map(Outcome::Reply);
    }
    // Commands other than Fabrics commands need an enabled, ready controller (CC.EN and
    // CSTS.RDY); Linux's target answers others with Command Sequence Error too.
    if !ctrl.enabled() || ctrl.csts & csts::CFS != 0 {
        return Err(status::COMMAND_SEQUENCE_ERROR);
    }
    let reply = match op {
        admin_op::IDENTIFY => identify(cx, ctrl, sqe)?,
        admin_op::GET_LOG_PAGE => get_log_page(cx, ctrl, sqe)?,
        admin_op::GET_FEATURES => get_features(cx, ctrl, sqe)?,
        admin_op::SET_FEATURES => set_features(cx, ctrl, sqe)?,
        admin_op::ASYNC_EVENT_REQUEST => {
            return Ok(match ctrl.request_event(sqe.cid())? {
                Some(dw0) => Outcome::Reply(Reply::dw0(dw0)),
                None => Outcome::Held,
            })
        }
        // Keep Alive: the timer restarted when the command arrived.
        KEEP_ALIVE => Reply::dw0(0),
        // Abort: commands in flight are the runtime's and run to completion; dword 0
        // bit 0 set says "not aborted", which the specification allows for any command.
        admin_op::ABORT if !ctrl.is_discovery() => Reply::dw0(1),
        // Queue creation and deletion do not exist on fabrics (I/O queues are connected),
        // nor does anything else this target does not implement.
        _ => return Err(Status::INVALID_OPCODE),
    };
    Ok(Outcome::Reply(reply))
}

/// Property Get and Property Set (NVMe-oF 1.1 §3): ATTRIB bits 2:0 give the size (0: 4 bytes,
/// 1: 8 bytes), OFST the property; the value travels in dwords 12-13 (Set) or the
/// completion's dwords 0-1 (Get).
fn fabrics(cx: &Cx<'_>, ctrl: &mut Controller, sqe: &Sqe) -> Result<Reply, Status> {
    let size = |attrib: u32| match attrib & 0b111 {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(Status::INVALID_FIELD),
    };
    match fctype_of(sqe) {
        fctype::PROPERTY_GET => {
            let v = ctrl.property_get(cx.opts, sqe.dw[11], size(sqe.dw[10])?)?;
            Ok(Reply {
                dw1: (v >> 32) as u32,
                ..Reply::dw0(v as u32)
            })
        }
        fctype::PROPERTY_SET => {
            let io_queues: Vec<QueueRef> = ctrl
                .io_queues
                .iter()
                .map(|&qid| QueueRef {
                    cntlid: ctrl.cntlid,
                    qid,
                })
                .collect();
            let value = sqe.dw[12] as u64 | (sqe.dw[13] as u64) << 32;
            let effect = match ctrl.property_set(sqe.dw[11], size(sqe.dw[10])?, value)? {
                CcChange::None => None,
                CcChange::Shutdown => Some(AdminEffect::Shutdown),
                CcChange::Reset => {
                    if !ctrl.is_discovery() {
                        ctrl.granted = cx.opts.max_io_queues;
                    }
                    Some(AdminEffect::Reset { io_queues })
                }
            };
            Ok(Reply {
                effect,
                ..Reply::dw0(0)
            })
        }
        // A queue is connected once.
        fctype::CONNECT => Err(status::COMMAND_SEQUENCE_ERROR),
        // Authentication of a host that needs none (`auth` takes the others), and Disconnect
        // (OFCS 0).
        _ => Err(Status::INVALID_OPCODE),
    }
}

/// ONCS (Figure 275): Dataset Management when a namespace can deallocate, Write Zeroes when
/// every namespace can (a host may send it to any of them).
fn oncs(s: &Subsystem) -> u16 {
    // Bit 5: reservations (`resv`), on every namespace.
    let mut oncs = 1 << 5;
    if s.namespaces.iter().any(|n| n.deallocate) {
        oncs |= vfpoll_nvme_spec::identify::oncs::DSM;
    }
    if !s.namespaces.is_empty() && s.namespaces.iter().all(|n| n.write_zeroes) {
        oncs |= vfpoll_nvme_spec::identify::oncs::WRITE_ZEROES;
    }
    oncs
}

/// Identify (NVMe Base 2.0 §5.17): CNS 01h controller, 00h namespace, 02h active namespace
/// list, 03h namespace identification descriptors, 08h the command-set independent namespace
/// structure. The I/O command set specific structures (05h, 06h) and the rest are Invalid
/// Field in Command (Linux falls back without them); a discovery controller has only 01h.
fn identify(cx: &Cx<'_>, ctrl: &Controller, sqe: &Sqe) -> Result<Reply, Status> {
    expect_to_host(sqe, IDENTIFY_BYTES as u32)?;
    let cns = sqe.dw[10] as u8;
    let nsid = sqe.nsid();
    let Some(sub) = cx.sub else {
        if cns != 0x01 {
            return Err(Status::INVALID_FIELD);
        }
        let serial = Subsystem::derived_serial(DISCOVERY_NQN);
        return Ok(Reply::data(identify::controller(&ControllerPage {
            cntlid: ctrl.cntlid.0,
            discovery: true,
            subnqn: DISCOVERY_NQN,
            serial: &serial,
            model: "vfpoll discovery",
            firmware: &super::config::crate_firmware(),
            mdts: cx.opts.mdts(),
            maxcmd: ADMIN_QUEUE_ENTRIES as u16,
            nn: 0,
            oncs: 0,
            vwc_present: false,
            ioccsz: 0,
            mnan: 0,
        })));
    };
    let s = &sub.cfg;
    // An NSID of the namespace structures: 1 to NN; an inactive one gets a zeroed page.
    let ns_page = |build: &dyn Fn(&NamespaceInfo) -> Vec<u8>| {
        if nsid == 0 || nsid > sub.max_nsid {
            return Err(Status::INVALID_NAMESPACE);
        }
        Ok(Reply::data(
            sub.namespace(nsid).map_or_else(|| vec![0; IDENTIFY_BYTES], build),
        ))
    };
    // Reservation capabilities: PTPL where the target keeps a state file.
    let rescap = super::resv::rescap(cx.ptpl);
    // The namespace's ANA state as this controller's port shows it.
    let ana_of = |ns: &NamespaceInfo| cx.ana.state(ctrl.conn.portid, ns.ana_group);
    match cns {
        0x01 => Ok(Reply::data(identify::controller(&ControllerPage {
            cntlid: ctrl.cntlid.0,
            discovery: false,
            subnqn: &s.nqn,
            serial: &s.serial,
            model: &s.model,
            firmware: &s.firmware,
            mdts: cx.opts.mdts(),
            maxcmd: cx.opts.max_queue_entries.min(u16::MAX.into()) as u16,
            nn: sub.max_nsid,
            oncs: oncs(s),
            vwc_present: s.namespaces.iter().any(|n| n.volatile_write_cache),
            ioccsz: cx.opts.ioccsz(),
            mnan: ana::mnan(cx.opts.max_transfer, sub.max_nsid),
        }))),
        0x00 => ns_page(&|ns| {
            let mut b = identify::namespace(ns, ana_of(ns));
            b[identify::ns_off::RESCAP] = rescap;
            b
        }),
        0x08 => ns_page(&|ns| {
            let mut b = identify::ns_cs_independent(ns);
            b[identify::cs_indep_off::RESCAP] = rescap;
            b
        }),
        0x02 => {
            if nsid >= 0xffff_fffe {
                return Err(Status::INVALID_NAMESPACE);
            }
            Ok(Reply::data(identify::ns_list(
                s.namespaces.iter().map(|n| n.nsid),
                nsid,
            )))
        }
        0x03 => match sub.namespace(nsid) {
            Some(ns) => Ok(Reply::data(identify::ns_descriptors(ns))),
            None => Err(Status::INVALID_NAMESPACE),
        },
        _ => Err(Status::INVALID_FIELD),
    }
}

/// Get Log Page (NVMe Base 2.0 §5.16): NUMD dwords (NUMDL, NUMDU) from byte offset LPO
/// (dword aligned, not past the page), zero-filled past the page's end. Without RAE, reading
/// a page re-arms its asynchronous event (and empties the Changed Namespace List). The ANA
/// log page (0Ch) is the one the controller's port shows.
fn get_log_page(cx: &Cx<'_>, ctrl: &mut Controller, sqe: &Sqe) -> Result<Reply, Status> {
    let page_id = sqe.dw[10] as u8;
    let lsp = (sqe.dw[10] >> 8) & 0x7f;
    let rae = sqe.dw[10] & 1 << 15 != 0;
    let numd = ((sqe.dw[11] & 0xffff) as u64) << 16 | (sqe.dw[10] >> 16) as u64;
    let len = (numd + 1) * 4;
    let offset = sqe.dw[12] as u64 | (sqe.dw[13] as u64) << 32;
    // Offset Type (CDW14 bit 23: LPO as an index) is not supported.
    if sqe.dw[14] & 1 << 23 != 0 || !offset.is_multiple_of(4) || len > cx.opts.max_transfer as u64 {
        return Err(Status::INVALID_FIELD);
    }
    expect_to_host(sqe, len as u32)?;
    let page = match (page_id, cx.sub) {
        (lid::DISCOVERY, None) => discovery_log(cx, ctrl, lsp & 1 != 0),
        (_, None) => return Err(status::INVALID_LOG_PAGE),
        (lid::ERROR, Some(_)) => ctrl.shared.errors().page(),
        (lid::SMART, Some(sub)) => {
            let nsid = sqe.nsid();
            let errors = ctrl.shared.errors().count();
            let health = if nsid == 0 || nsid == u32::MAX {
                Health::combine(sub.health.values())
            } else if sub.namespace(nsid).is_some() {
                sub.health.get(&nsid).copied().unwrap_or_default()
            } else {
                return Err(Status::INVALID_NAMESPACE);
            };
            logpage::smart(&health, errors)
        }
        (lid::FIRMWARE_SLOT, Some(sub)) => logpage::firmware_slot(&sub.cfg.firmware),
        (lid::CHANGED_NS, Some(_)) => ctrl.changed.page(),
        // LSP bit 0: Return Groups Only.
        (lid::ANA, Some(sub)) => cx.ana.log_page(
            ctrl.conn.portid,
            sub.cfg.namespaces.iter().map(|ns| (ns.nsid, ns.ana_group)),
            lsp & 1 != 0,
        ),
        _ => return Err(status::INVALID_LOG_PAGE),
    };
    if offset > page.len() as u64 {
        return Err(Status::INVALID_FIELD);
    }
    let mut data = vec![0u8; len as usize];
    let from = &page[offset as usize..];
    let n = from.len().min(data.len());
    data[..n].copy_from_slice(&from[..n]);
    if !rae {
        ctrl.log_read(page_id);
    }
    Ok(Reply::data(data))
}

/// The Discovery log page as this host sees it: for each listener (only the host's own with
/// LSP bit 0, Port Local Entries Only) an entry for this discovery subsystem, then an entry
/// per (subsystem the host may use, listener).
fn discovery_log(cx: &Cx<'_>, ctrl: &Controller, port_local: bool) -> Vec<u8> {
    let listeners: Vec<&Listener> = cx
        .listeners
        .iter()
        .filter(|l| !port_local || l.portid == ctrl.conn.portid)
        .collect();
    let local = ctrl.conn.local_addr.as_deref();
    let entry = |subtype, listener, subnqn| DiscoveryEntry {
        subtype,
        listener,
        local_addr: local,
        subnqn,
    };
    let mut entries: Vec<DiscoveryEntry<'_>> = listeners
        .iter()
        .map(|l| entry(subtype::CURRENT_DISCOVERY, *l, DISCOVERY_NQN))
        .collect();
    for s in cx
        .subsystems
        .values()
        .filter(|s| s.cfg.host_allowed(&ctrl.hostnqn))
    {
        entries.extend(
            listeners
                .iter()
                .map(|l| entry(subtype::NVM, *l, s.cfg.nqn.as_str())),
        );
    }
    logpage::discovery(cx.genctr, &entries)
}

/// Whether the controller implements feature `fid`, and whether Set Features may change it.
fn feature_supported(ctrl: &Controller, cx: &Cx<'_>, fid: u8) -> Option<bool> {
    if ctrl.is_discovery() {
        return matches!(fid, feature::ASYNC_EVENT_CONFIG | feature::KEEP_ALIVE).then_some(true);
    }
    let vwc = cx
        .sub
        .is_some_and(|s| s.cfg.namespaces.iter().any(|n| n.volatile_write_cache));
    match fid {
        feature::ARBITRATION
        | feature::POWER_MANAGEMENT
        | FEATURE_TEMPERATURE
        | feature::ERROR_RECOVERY
        | feature::NUMBER_OF_QUEUES
        | feature::WRITE_ATOMICITY
        | feature::ASYNC_EVENT_CONFIG
        | feature::KEEP_ALIVE => Some(true),
        feature::VOLATILE_WRITE_CACHE if vwc => Some(true),
        FEATURE_HOST_ID => Some(false),
        _ => None,
    }
}

/// TMPSEL (dword 11 bits 19:16) and THSEL (21:20) of the Temperature Threshold feature: the
/// composite temperature only (the target reports no other sensor), over (0) or under (1).
fn temperature_select(dw11: u32) -> Result<bool, Status> {
    match ((dw11 >> 16) & 0xf, (dw11 >> 20) & 0b11) {
        (0, 0) => Ok(true),
        (0, 1) => Ok(false),
        _ => Err(Status::INVALID_FIELD),
    }
}

/// Get Features (NVMe Base 2.0 §5.15): SEL current (000b), default (001b), saved (010b: the
/// default, nothing is saveable) or capabilities (011b: changeable, not saveable, not
/// namespace specific).
fn get_features(cx: &Cx<'_>, ctrl: &Controller, sqe: &Sqe) -> Result<Reply, Status> {
    let fid = sqe.dw[10] as u8;
    let sel = (sqe.dw[10] >> 8) & 0b111;
    let dw11 = sqe.dw[11];
    let changeable = feature_supported(ctrl, cx, fid).ok_or(Status::INVALID_FIELD)?;
    if sel == 0b011 {
        return Ok(Reply::dw0((changeable as u32) << 2));
    }
    if sel > 0b011 {
        return Err(Status::INVALID_FIELD);
    }
    let defaults = Features::default();
    let f = if sel == 0 { &ctrl.features } else { &defaults };
    let max_q = (cx.opts.max_io_queues - 1) as u32;
    let v = match fid {
        feature::ARBITRATION => f.arbitration,
        feature::POWER_MANAGEMENT => f.power_management,
        FEATURE_TEMPERATURE => {
            let t = if temperature_select(dw11)? {
                f.temp_over
            } else {
                f.temp_under
            };
            t as u32 | (dw11 & 0x003f_0000)
        }
        feature::ERROR_RECOVERY => f.error_recovery,
        feature::VOLATILE_WRITE_CACHE if sel == 0 => ctrl.shared.write_cache.load(Ordering::Relaxed) as u32,
        feature::VOLATILE_WRITE_CACHE => WCE_DEFAULT as u32,
        feature::NUMBER_OF_QUEUES if sel == 0 => {
            let g = (ctrl.granted.max(1) - 1) as u32;
            g | g << 16
        }
        feature::NUMBER_OF_QUEUES => max_q | max_q << 16,
        feature::WRITE_ATOMICITY => f.write_atomicity,
        feature::ASYNC_EVENT_CONFIG => f.aec,
        feature::KEEP_ALIVE => ctrl.kato_ms,
        _ => {
            // Host Identifier: the 128-bit one from Connect (EXHID, dword 11 bit 0, must ask
            // for it), 16 bytes of data.
            if dw11 & 1 == 0 {
                return Err(Status::INVALID_FIELD);
            }
            expect_to_host(sqe, 16)?;
            return Ok(Reply::data(ctrl.hostid.to_vec()));
        }
    };
    Ok(Reply::dw0(v))
}

/// Set Features (NVMe Base 2.0 §5.27). Nothing is saveable (SV: Feature Identifier Not
/// Saveable). Number of Queues grants up to the target's limit and only before I/O queues
/// exist; the Host Identifier comes from Connect on fabrics (Command Sequence Error).
fn set_features(cx: &Cx<'_>, ctrl: &mut Controller, sqe: &Sqe) -> Result<Reply, Status> {
    let fid = sqe.dw[10] as u8;
    let dw11 = sqe.dw[11];
    if sqe.dw[10] & 1 << 31 != 0 {
        return Err(status::FEATURE_NOT_SAVEABLE);
    }
    if !feature_supported(ctrl, cx, fid).ok_or(Status::INVALID_FIELD)? {
        return Err(status::COMMAND_SEQUENCE_ERROR);
    }
    let f = &mut ctrl.features;
    let mut dw0 = 0;
    match fid {
        feature::ARBITRATION => f.arbitration = dw11,
        feature::POWER_MANAGEMENT => {
            // One power state (NPSS 0).
            if dw11 & 0x1f != 0 {
                return Err(Status::INVALID_FIELD);
            }
            f.power_management = dw11 & 0xff;
        }
        FEATURE_TEMPERATURE => {
            if temperature_select(dw11)? {
                f.temp_over = dw11 as u16;
            } else {
                f.temp_under = dw11 as u16;
            }
        }
        feature::ERROR_RECOVERY => {
            // DULBE needs deallocated-block errors, which the target does not report.
            if dw11 & 1 << 16 != 0 {
                return Err(Status::INVALID_FIELD);
            }
            f.error_recovery = dw11 & 0xffff;
        }
        feature::VOLATILE_WRITE_CACHE => ctrl.shared.write_cache.store(dw11 & 1 != 0, Ordering::Relaxed),
        feature::NUMBER_OF_QUEUES => {
            if !ctrl.io_queues.is_empty() {
                return Err(status::COMMAND_SEQUENCE_ERROR);
            }
            let (nsqr, ncqr) = (dw11 & 0xffff, dw11 >> 16);
            if nsqr == 0xffff || ncqr == 0xffff {
                return Err(Status::INVALID_FIELD);
            }
            let max = cx.opts.max_io_queues as u32;
            let (nsqa, ncqa) = ((nsqr + 1).min(max), (ncqr + 1).min(max));
            ctrl.granted = nsqa.min(ncqa) as u16;
            dw0 = (nsqa - 1) | (ncqa - 1) << 16;
        }
        feature::WRITE_ATOMICITY => f.write_atomicity = dw11 & 1,
        feature::ASYNC_EVENT_CONFIG => {
            let allowed = if ctrl.subsystem.is_none() {
                ctrl_val::OAES_DISCOVERY
            } else {
                ctrl_val::OAES_NS_ATTR | ctrl_val::OAES_ANA | AEC_SMART
            };
            if dw11 & !allowed != 0 {
                return Err(Status::INVALID_FIELD);
            }
            f.aec = dw11;
        }
        _ => {
            // Keep Alive Timer: KATO in ms; the timer restarts with this command.
            ctrl.kato_ms = if ctrl.is_discovery() && dw11 == 0 {
                DISCOVERY_KATO_MS
            } else {
                dw11
            };
        }
    }
    Ok(Reply::dw0(dw0))
}
