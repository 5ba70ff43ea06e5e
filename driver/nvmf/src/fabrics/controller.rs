//! One controller's state: its properties (CAP, VS, CC, CSTS; NVMe Base 2.0 §3.1.3, read and
//! written with Property Get/Set), features, asynchronous events, keep-alive bookkeeping, and
//! the part I/O queue workers share with it.

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use vfpoll_nvme_spec::status::Status;

use super::ana::AnaCell;
use super::config::TargetOptions;
use super::identify::ctrl_val;
use super::logpage::{lid, ChangedNs, ErrorLog};
use super::types::{Cntlid, ConnInfo, SubsystemId, ADMIN_QUEUE_ENTRIES};

/// Property offsets (NVMe Base 2.0 §3.1.3; NVMe-oF 1.1 names the subset a fabrics
/// controller has: no doorbells, no admin queue attributes or bases).
pub mod prop {
    /// Controller Capabilities, 8 bytes.
    pub const CAP: u32 = 0x00;
    /// Version, 4 bytes.
    pub const VS: u32 = 0x08;
    /// Controller Configuration, 4 bytes.
    pub const CC: u32 = 0x14;
    /// Controller Status, 4 bytes.
    pub const CSTS: u32 = 0x1c;
}

/// Controller Configuration fields (NVMe Base 2.0 §3.1.3.5).
pub mod cc {
    /// Enable.
    pub const EN: u32 = 1;
    /// I/O Command Set Selected, bits 6:4.
    pub const CSS_SHIFT: u32 = 4;
    /// Memory Page Size, bits 10:7.
    pub const MPS_SHIFT: u32 = 7;
    /// Arbitration Mechanism Selected, bits 13:11.
    pub const AMS_SHIFT: u32 = 11;
    /// Shutdown Notification, bits 15:14.
    pub const SHN_SHIFT: u32 = 14;
    /// I/O Submission Queue Entry Size, bits 19:16.
    pub const IOSQES_SHIFT: u32 = 16;
    /// I/O Completion Queue Entry Size, bits 23:20.
    pub const IOCQES_SHIFT: u32 = 20;
    /// The fields the target stores (bits 23:0; CRIME, bit 24, needs CAP.CRMS, which the
    /// target does not report).
    pub const STORED: u32 = 0x00ff_ffff;
}

/// Controller Status fields (NVMe Base 2.0 §3.1.3.6).
pub mod csts {
    /// Ready.
    pub const RDY: u32 = 1;
    /// Controller Fatal Status.
    pub const CFS: u32 = 1 << 1;
    /// Shutdown Status "shutdown processing complete" (bits 3:2 = 10b).
    pub const SHST_COMPLETE: u32 = 0b10 << 2;
}

/// CAP.TO: how long the host waits for CSTS.RDY, in 500 ms units (7.5 s, as Linux's target).
const CAP_TIMEOUT: u64 = 15;

/// Default Temperature Threshold feature values (NVMe Base 2.0 §5.27.1): over-temperature
/// 358 K (85 °C), under-temperature 0 (none).
const TEMP_OVER_DEFAULT: u16 = 358;

/// The Volatile Write Cache feature's default: enabled, as drives ship. Linux never changes it;
/// it flushes when a file system asks. Disabled, every write to a namespace with a volatile
/// cache must reach the media before it completes.
pub(crate) const WCE_DEFAULT: bool = true;

/// Asynchronous events a controller reports (NVMe Base 2.0 §5.2: completion
/// dword 0 holds the type in bits 2:0, the information in 15:8, the log page in 23:16).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// Notice: Namespace Attribute Changed; read log 04h.
    NamespaceChanged,
    /// Notice: Discovery Log Page Change; read log 70h.
    DiscoveryChanged,
    /// SMART / Health status with its information (00h reliability, 01h temperature, 02h
    /// spare); read log 02h.
    Smart(u8),
    /// Notice: Asymmetric Namespace Access Change (information 03h); read log 0Ch.
    AnaChange,
    /// I/O command set specific: Reservation Log Page Available (information 00h); read
    /// log 80h. Enabled per namespace by the Reservation Notification Mask, not by AEC.
    ReservationLog,
}

impl Event {
    pub fn dw0(self) -> u32 {
        let (ty, info, page) = match self {
            Event::NamespaceChanged => (2, 0x00, lid::CHANGED_NS),
            Event::DiscoveryChanged => (2, 0xf0, lid::DISCOVERY),
            Event::Smart(info) => (1, info, lid::SMART),
            Event::AnaChange => (2, 0x03, lid::ANA),
            Event::ReservationLog => (6, 0x00, super::resv::LOG_PAGE),
        };
        ty | (info as u32) << 8 | (page as u32) << 16
    }

    /// The log page whose reading (without Retain Asynchronous Event) re-arms the event.
    fn mask_bit(self) -> u8 {
        match self {
            Event::NamespaceChanged => 1,
            Event::DiscoveryChanged => 2,
            Event::Smart(_) => 4,
            Event::AnaChange => 8,
            Event::ReservationLog => 16,
        }
    }
}

/// The Asynchronous Event Configuration bit that enables `ev` (NVMe Base 2.0 §5.27.1).
fn aec_enables(aec: u32, ev: Event, warning: u8) -> bool {
    match ev {
        Event::NamespaceChanged => aec & ctrl_val::OAES_NS_ATTR != 0,
        Event::DiscoveryChanged => aec & ctrl_val::OAES_DISCOVERY != 0,
        Event::Smart(_) => aec as u8 & warning != 0,
        Event::AnaChange => aec & ctrl_val::OAES_ANA != 0,
        Event::ReservationLog => true,
    }
}

/// Feature values a controller keeps (NVMe Base 2.0 §5.27.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Features {
    pub arbitration: u32,
    pub power_management: u32,
    pub temp_over: u16,
    pub temp_under: u16,
    pub error_recovery: u32,
    pub write_atomicity: u32,
    pub aec: u32,
}

impl Default for Features {
    fn default() -> Self {
        Features {
            arbitration: 0,
            power_management: 0,
            temp_over: TEMP_OVER_DEFAULT,
            temp_under: 0,
            error_recovery: 0,
            write_atomicity: 0,
            aec: 0,
        }
    }
}

/// What a controller shares with the workers of its I/O queues, which decode commands
/// without the target (see `IoQueue`).
#[derive(Debug, Default)]
pub(crate) struct CtrlShared {
    /// A command arrived since the last `Target::tick` (Traffic Based Keep Alive).
    traffic: AtomicBool,
    /// CC.EN and CSTS.RDY, not failed, not torn down: I/O commands are processed.
    pub ready: AtomicBool,
    /// The Volatile Write Cache feature's WCE.
    pub write_cache: AtomicBool,
    /// The ANA states of the port the controller's admin queue connected through.
    pub ana: Arc<AnaCell>,
    /// The host's identifier (HOSTID of Connect), which names it as a reservation registrant.
    pub hostid: [u8; 16],
    errors: Mutex<ErrorLog>,
}

impl CtrlShared {
    /// Notes a command for the keep-alive timer; a load first, so that workers of one
    /// controller do not write the shared line on every command.
    pub fn touch(&self) {
        if !self.traffic.load(Ordering::Relaxed) {
            self.traffic.store(true, Ordering::Relaxed);
        }
    }

    /// Whether a command arrived since the last call.
    pub fn take_traffic(&self) -> bool {
        self.traffic.swap(false, Ordering::Relaxed)
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// The error log; a worker that panicked holding it leaves it usable.
    pub fn errors(&self) -> MutexGuard<'_, ErrorLog> {
        self.errors.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Asynchronous Event Requests held and events not yet reported.
#[derive(Debug, Default)]
pub(crate) struct Aer {
    /// Command IDs of held requests, oldest first.
    pub held: VecDeque<u16>,
    /// Completion dword 0 of events waiting for a request.
    pub pending: VecDeque<u32>,
    /// Events reported and not yet cleared by reading their log page.
    masked: u8,
}

/// What a write to CC asks of the target beyond the new CC and CSTS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CcChange {
    None,
    /// SHN set: the host is shutting the controller down.
    Shutdown,
    /// EN cleared: a controller reset.
    Reset,
}

#[derive(Debug)]
pub(crate) struct Controller {
    pub cntlid: Cntlid,
    /// `None`: a discovery controller.
    pub subsystem: Option<SubsystemId>,
    pub hostnqn: String,
    pub hostid: [u8; 16],
    pub conn: ConnInfo,
    pub kato_ms: u32,
    pub cc: u32,
    pub csts: u32,
    /// I/O queues granted (Number of Queues feature).
    pub granted: u16,
    pub io_queues: BTreeSet<u16>,
    pub features: Features,
    pub aer: Aer,
    pub changed: ChangedNs,
    /// Reservation notices not yet read (log 80h) and the notification masks.
    pub resv_log: super::resv::NoticeLog,
    pub shared: Arc<CtrlShared>,
    /// When the Keep Alive Timer last restarted, as `Target::tick` saw it.
    pub last_activity: Option<Instant>,
    /// The Keep Alive Timer expired; reported once.
    pub expired: bool,
}

impl Controller {
    // One argument per thing Connect decides; a parameter struct would only restate them.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cntlid: Cntlid,
        subsystem: Option<SubsystemId>,
        hostnqn: String,
        hostid: [u8; 16],
        conn: ConnInfo,
        kato_ms: u32,
        granted: u16,
        ana: Arc<AnaCell>,
    ) -> Self {
        let shared = Arc::new(CtrlShared {
            ana,
            hostid,
            ..CtrlShared::default()
        });
        shared.touch();
        shared.write_cache.store(WCE_DEFAULT, Ordering::Relaxed);
        Controller {
            cntlid,
            subsystem,
            hostnqn,
            hostid,
            conn,
            kato_ms,
            cc: 0,
            csts: 0,
            granted,
            io_queues: BTreeSet::new(),
            features: Features::default(),
            aer: Aer::default(),
            changed: ChangedNs::default(),
            resv_log: Default::default(),
            shared,
            last_activity: None,
            expired: false,
        }
    }

    pub fn is_discovery(&self) -> bool {
        self.subsystem.is_none()
    }

    /// CC.EN and CSTS.RDY: admin and I/O commands other than Fabrics commands are processed.
    pub fn enabled(&self) -> bool {
        self.cc & cc::EN != 0 && self.csts & csts::RDY != 0
    }

    /// CAP (NVMe Base 2.0 §3.1.3.1): MQES, CQR set (as fabrics controllers report), TO,
    /// DSTRD 0, CSS bit 0 (the NVM command set), MPSMIN = MPSMAX = 4 KiB.
    pub fn cap(&self, opts: &TargetOptions) -> u64 {
        let entries = if self.is_discovery() {
            ADMIN_QUEUE_ENTRIES
        } else {
            opts.max_queue_entries
        };
        let mqes = (entries - 1) as u64;
        mqes | 1 << 16 | CAP_TIMEOUT << 24 | 1 << 37
    }

    /// Property Get (NVMe-oF 1.1, Property Get command): CAP as 8 bytes; VS, CC, CSTS as 4.
    /// Anything else is Invalid Field in Command, as Linux's target answers.
    pub fn property_get(&self, opts: &TargetOptions, offset: u32, eight: bool) -> Result<u64, Status> {
        match (offset, eight) {
            (prop::CAP, true) => Ok(self.cap(opts)),
            (prop::VS, false) => Ok(ctrl_val::VERSION.into()),
            (prop::CC, false) => Ok(self.cc.into()),
            (prop::CSTS, false) => Ok(self.csts.into()),
            _ => Err(Status::INVALID_FIELD),
        }
    }

    /// Property Set: only CC (4 bytes) is writable.
    pub fn property_set(&mut self, offset: u32, eight: bool, value: u64) -> Result<CcChange, Status> {
        if (offset, eight) != (prop::CC, false) {
            return Err(Status::INVALID_FIELD);
        }
        Ok(self.write_cc(value as u32 & cc::STORED))
    }

    /// A write of CC (NVMe Base 2.0 §3.1.3.5; shutdown as §3.6 describes it): EN 0→1 brings
    /// the controller ready if the configuration is one it supports (NVM command set, 4 KiB
    /// pages, round robin, 64/16-byte entries) and fails it (CSTS.CFS) otherwise, as Linux's
    /// target does; EN 1→0 resets it; SHN completes the shutdown at once (nothing is buffered
    /// here: the runtime flushes the backends' caches when told).
    fn write_cc(&mut self, new: u32) -> CcChange {
        let old = self.cc;
        self.cc = new;
        let mut change = CcChange::None;
        if new & cc::EN != 0 && old & cc::EN == 0 {
            let field = |shift: u32, bits: u32| (new >> shift) & ((1 << bits) - 1);
            let supported = field(cc::CSS_SHIFT, 3) == 0
                && field(cc::MPS_SHIFT, 4) == 0
                && field(cc::AMS_SHIFT, 3) == 0
                && field(cc::IOSQES_SHIFT, 4) == 6
                && field(cc::IOCQES_SHIFT, 4) == 4;
            self.csts = if supported { csts::RDY } else { csts::CFS };
        }
        if new & cc::EN == 0 && old & cc::EN != 0 {
            self.reset();
            change = CcChange::Reset;
        }
        let shn = |v: u32| (v >> cc::SHN_SHIFT) & 0b11;
        if shn(new) != 0 && shn(old) == 0 {
            self.csts |= csts::SHST_COMPLETE;
            change = CcChange::Shutdown;
        } else if shn(new) == 0 && shn(old) != 0 {
            self.csts &= !csts::SHST_COMPLETE;
        }
        self.publish_ready();
        change
    }

    /// A Controller Level Reset (NVMe Base 2.0 §3.7.2): not ready, outstanding Asynchronous
    /// Event Requests gone without completions, features back to their defaults, I/O queues
    /// dropped (the runtime closes their connections). The keep-alive timeout stays: it
    /// belongs to the association, set by Connect.
    fn reset(&mut self) {
        self.csts = 0;
        self.aer = Aer::default();
        self.features = Features::default();
        self.io_queues.clear();
        self.shared.write_cache.store(WCE_DEFAULT, Ordering::Relaxed);
    }

    pub fn publish_ready(&self) {
        let ready = self.enabled() && self.csts & csts::CFS == 0 && !self.expired;
        self.shared.ready.store(ready, Ordering::Release);
    }

    /// Reports `ev` if the host enabled it and the same kind is not already reported and
    /// unread: the command ID and completion dword 0 of the held request it completes, or
    /// `None` (queued for the next request, masked, or disabled). `warning` is the SMART
    /// critical warning bits behind a SMART event.
    pub fn raise(&mut self, ev: Event, warning: u8) -> Option<(u16, u32)> {
        if !aec_enables(self.features.aec, ev, warning) || self.aer.masked & ev.mask_bit() != 0 {
            return None;
        }
        self.aer.masked |= ev.mask_bit();
        match self.aer.held.pop_front() {
            Some(cid) => Some((cid, ev.dw0())),
            None => {
                self.aer.pending.push_back(ev.dw0());
                None
            }
        }
    }

    /// A log page was read without Retain Asynchronous Event: its event may be reported again.
    pub fn log_read(&mut self, page: u8) {
        let bit = match page {
            lid::CHANGED_NS => Event::NamespaceChanged.mask_bit(),
            lid::DISCOVERY => Event::DiscoveryChanged.mask_bit(),
            lid::SMART => Event::Smart(0).mask_bit(),
            lid::ANA => Event::AnaChange.mask_bit(),
            super::resv::LOG_PAGE => Event::ReservationLog.mask_bit(),
            _ => return,
        };
        self.aer.masked &= !bit;
        if page == lid::CHANGED_NS {
            self.changed.clear();
        }
    }

    /// An Asynchronous Event Request (NVMe Base 2.0 §5.2): `Ok(Some(dw0))` completes it now
    /// with a pending event, `Ok(None)` holds it, and more than AERL + 1 outstanding is
    /// Asynchronous Event Request Limit Exceeded.
    pub fn request_event(&mut self, cid: u16) -> Result<Option<u32>, Status> {
        if let Some(dw0) = self.aer.pending.pop_front() {
            return Ok(Some(dw0));
        }
        if self.aer.held.len() > ctrl_val::AERL as usize {
            return Err(super::wire::status::AER_LIMIT_EXCEEDED);
        }
        self.aer.held.push_back(cid);
        Ok(None)
    }

    /// The keep-alive deadline in effect: KATO, or none when 0.
    pub fn kato(&self) -> Option<std::time::Duration> {
        (self.kato_ms != 0).then(|| std::time::Duration::from_millis(self.kato_ms.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctrl() -> Controller {
        Controller::new(
            Cntlid(1),
            Some(SubsystemId(0)),
            "h".into(),
            [1; 16],
            ConnInfo::default(),
            5000,
            4,
            Arc::default(),
        )
    }

    const GOOD_CC: u32 = cc::EN | 6 << cc::IOSQES_SHIFT | 4 << cc::IOCQES_SHIFT;

    #[test]
    fn cap_fields_are_where_linux_reads_them() {
        let c = ctrl();
        let cap = c.cap(&TargetOptions::default());
        assert_eq!(cap & 0xffff, 127, "MQES");
        assert_eq!((cap >> 16) & 1, 1, "CQR");
        assert_eq!((cap >> 24) & 0xff, 15, "TO");
        assert_eq!((cap >> 32) & 0xf, 0, "DSTRD");
        assert_eq!(
            (cap >> 37) & 0xff,
            1,
            "CSS: NVM only (no CSI: Linux keeps CC.CSS = 000b)"
        );
        assert_eq!((cap >> 48) & 0xff, 0, "MPSMIN = MPSMAX = 4 KiB");
        assert_eq!((cap >> 59) & 3, 0, "no CRMS: Linux reads no CRTO");
    }

    #[test]
    fn enable_checks_the_configuration() {
        let mut c = ctrl();
        assert_eq!(
            c.property_set(prop::CC, false, GOOD_CC.into()),
            Ok(CcChange::None)
        );
        assert_eq!(c.csts, csts::RDY);
        assert!(c.shared.is_ready());
        let mut bad = ctrl();
        let wrong_sqes = cc::EN | 7 << cc::IOSQES_SHIFT | 4 << cc::IOCQES_SHIFT;
        bad.property_set(prop::CC, false, wrong_sqes.into()).unwrap();
        assert_eq!(bad.csts, csts::CFS);
        assert!(!bad.shared.is_ready());
        let shutdown = GOOD_CC | 1 << cc::SHN_SHIFT;
        assert_eq!(
            c.property_set(prop::CC, false, shutdown.into()),
            Ok(CcChange::Shutdown)
        );
        assert_eq!(c.csts, csts::RDY | csts::SHST_COMPLETE);
        assert_eq!(c.property_set(prop::CC, false, 0), Ok(CcChange::Reset));
        assert_eq!(c.csts, 0);
        assert!(!c.shared.is_ready());
        assert_eq!(c.property_set(prop::CSTS, false, 1), Err(Status::INVALID_FIELD));
        assert_eq!(
            c.property_get(&TargetOptions::default(), prop::VS, true),
            Err(Status::INVALID_FIELD)
        );
    }

    #[test]
    fn events_are_masked_until_their_log_is_read() {
        let mut c = ctrl();
        assert_eq!(c.raise(Event::NamespaceChanged, 0), None, "AEC not enabled");
        assert!(c.aer.pending.is_empty());
        c.features.aec = ctrl_val::OAES_NS_ATTR;
        assert_eq!(c.request_event(9), Ok(None));
        assert_eq!(c.raise(Event::NamespaceChanged, 0), Some((9, 0x0004_0002)));
        assert_eq!(c.raise(Event::NamespaceChanged, 0), None, "masked");
        c.log_read(lid::CHANGED_NS);
        assert_eq!(
            c.raise(Event::NamespaceChanged, 0),
            None,
            "queued: no request held"
        );
        assert_eq!(c.request_event(10), Ok(Some(0x0004_0002)));
        for cid in 0..4 {
            assert_eq!(c.request_event(cid), Ok(None));
        }
        assert_eq!(
            c.request_event(4),
            Err(super::super::wire::status::AER_LIMIT_EXCEEDED)
        );
        assert_eq!(Event::DiscoveryChanged.dw0(), 0x0070_f002);
        assert_eq!(Event::Smart(1).dw0(), 0x0002_0101);
        assert_eq!(Event::AnaChange.dw0(), 0x000c_0302);
    }
}
