//! Reservations (NVMe Base 2.0 §8.19; the commands in §7.2 to §7.5 of the NVM Command Set
//! 1.0 and the Base specification's Reservation Register, Report, Acquire and Release):
//! hosts that share a namespace register keys, one of them (or all registrants) holds a
//! reservation of one of six types, and commands of the other hosts that the type fences
//! off fail with Reservation Conflict.
//!
//! This module is the per-namespace state machine ([`NsResv`], pure logic, tested against
//! the specification's tables), the per-controller Reservation Notification log
//! ([`NoticeLog`], log page 80h), and the per-subsystem cell that I/O queues check without
//! the target's lock (`SubsysResv`). `resv/target.rs` wires them to the [`Target`]
//! (commands, features, log page, events); `resv/store.rs` keeps the state of namespaces with
//! Persist Through Power Loss on disk.
//!
//! Registrants are hosts, named by their 128-bit Host Identifier from Connect (§8.19.1: a
//! host with several controllers, one per path, is one registrant). Preempt and Abort
//! preempts as Preempt does; commands of the preempted host that already passed the
//! conflict check complete (they were admitted before the preemption), and the next ones
//! fail with Reservation Conflict.
//!
//! [`Target`]: super::Target

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use vfpoll_nvme_spec::status::{Sct, Status};

use super::bytes::{put16, put32, put64};
use super::types::AerCompletion;
use super::wire::{data_xfer, status, DataXfer, Sqe};

mod store;
pub(crate) mod target;
#[cfg(test)]
mod tests;

pub use store::{canonical_state, ResvStore, StoreError, STATE_FILE};

/// A host's 128-bit Host Identifier (HOSTID of Connect).
pub type HostId = [u8; 16];

/// Reservation Conflict (NVMe Base 2.0 Figure 94, 83h), with DNR: the host must not retry.
pub const RESERVATION_CONFLICT: Status = Status::new(Sct::Generic, 0x83, true);

/// Host Identifier Inconsistent Format (command specific 18h): a Reservation Report without
/// the extended data structure from a controller whose hosts have 128-bit identifiers.
pub const HOST_ID_INCONSISTENT: Status = Status::new(Sct::CommandSpecific, 0x18, true);

/// I/O command opcodes of reservations (NVMe Base 2.0 Figure 392).
pub mod opcode {
    /// Reservation Register.
    pub const REGISTER: u8 = 0x0d;
    /// Reservation Report.
    pub const REPORT: u8 = 0x0e;
    /// Reservation Acquire.
    pub const ACQUIRE: u8 = 0x11;
    /// Reservation Release.
    pub const RELEASE: u8 = 0x15;
}

/// Feature identifiers of reservations (NVMe Base 2.0 Figure 386).
pub mod feature {
    /// Reservation Notification Mask (namespace specific).
    pub const NOTIFICATION_MASK: u8 = 0x82;
    /// Reservation Persistence (namespace specific): PTPL in bit 0.
    pub const PERSISTENCE: u8 = 0x83;
}

/// The Reservation Notification log page identifier.
pub const LOG_PAGE: u8 = 0x80;

/// Bytes of the Reservation Notification log page.
pub const LOG_PAGE_BYTES: usize = 64;

/// RESCAP (Identify Namespace byte 31): the six reservation types (bits 1 to 6) and IEKEY as
/// NVMe 1.3 and later define it (bit 7: Acquire and Release refuse IEKEY, Register honours
/// it); bit 0, Persist Through Power Loss, only where the target has a state file.
pub fn rescap(ptpl_capable: bool) -> u8 {
    0b1111_1110 | ptpl_capable as u8
}

/// The reservation types (NVMe Base 2.0 Figure 8.19 and the RTYPE field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ResvType {
    /// Write Exclusive: only the holder writes; everyone reads.
    WriteExclusive = 1,
    /// Exclusive Access: only the holder reads or writes.
    ExclusiveAccess = 2,
    /// Write Exclusive - Registrants Only: registrants write; everyone reads.
    WriteExclusiveRegistrantsOnly = 3,
    /// Exclusive Access - Registrants Only: only registrants read or write.
    ExclusiveAccessRegistrantsOnly = 4,
    /// Write Exclusive - All Registrants: every registrant holds it; registrants write.
    WriteExclusiveAllRegistrants = 5,
    /// Exclusive Access - All Registrants: every registrant holds it; only they read or write.
    ExclusiveAccessAllRegistrants = 6,
}

impl ResvType {
    /// The type of an RTYPE value (1 to 6).
    pub fn from_rtype(v: u8) -> Option<Self> {
        use ResvType::*;
        Some(match v {
            1 => WriteExclusive,
            2 => ExclusiveAccess,
            3 => WriteExclusiveRegistrantsOnly,
            4 => ExclusiveAccessRegistrantsOnly,
            5 => WriteExclusiveAllRegistrants,
            6 => ExclusiveAccessAllRegistrants,
            _ => return None,
        })
    }

    /// Every registrant is a holder.
    pub fn all_registrants(self) -> bool {
        matches!(
            self,
            ResvType::WriteExclusiveAllRegistrants | ResvType::ExclusiveAccessAllRegistrants
        )
    }

    /// Registrants that do not hold it still have access (the "Registrants Only" and "All
    /// Registrants" types); releasing such a reservation tells them (Reservation Released).
    pub fn registrants_have_access(self) -> bool {
        !matches!(self, ResvType::WriteExclusive | ResvType::ExclusiveAccess)
    }

    /// Reads are fenced off too.
    pub fn exclusive_access(self) -> bool {
        matches!(
            self,
            ResvType::ExclusiveAccess
                | ResvType::ExclusiveAccessRegistrantsOnly
                | ResvType::ExclusiveAccessAllRegistrants
        )
    }
}

/// Which command group a command belongs to (NVMe Base 2.0 Figure 8.20): the read group
/// (Read, Compare, Verify) or the write group (Write, Write Zeroes, Dataset Management,
/// Flush, Write Uncorrectable, Copy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The read command group.
    Read,
    /// The write command group.
    Write,
}

/// Reservation notification types (NVMe Base 2.0 Figure 8.21, log page 80h byte 8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Notice {
    /// Another host's Preempt removed this host's registration.
    RegistrationPreempted = 1,
    /// The holder released (or unregistered from) a reservation registrants had access to.
    ReservationReleased = 2,
    /// Another host preempted or cleared the reservation.
    ReservationPreempted = 3,
}

impl Notice {
    /// The Reservation Notification Mask bit that suppresses it (Set Features 82h, CDW11).
    pub fn mask_bit(self) -> u32 {
        1 << (self as u32)
    }
}

/// A registration: the host and its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registrant {
    /// The host.
    pub host: HostId,
    /// Its reservation key.
    pub key: u64,
}

/// A reservation held on a namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// The type.
    pub rtype: ResvType,
    /// The host that acquired it (for the All Registrants types, every registrant holds it
    /// and this is the one that acquired it).
    pub holder: HostId,
}

/// A host to tell of a change, and what changed.
pub type Notices = Vec<(HostId, Notice)>;

/// The reservation state of one namespace (NVMe Base 2.0 §8.19): registrants in the order
/// they registered, the reservation if any, the generation counter and Persist Through Power
/// Loss.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NsResv {
    /// PRGEN: counts successful Register commands, Preempts and Clears (NVMe Base 2.0
    /// Figure 8.22, Generation).
    pub generation: u32,
    /// The registrants.
    pub registrants: Vec<Registrant>,
    /// The reservation.
    pub held: Option<Held>,
    /// Persist Through Power Loss: the state survives a target restart.
    pub ptpl: bool,
}

/// Reservation Register's action (RREGA, CDW10 bits 2:0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegisterAction {
    /// Register a key.
    Register,
    /// Unregister.
    Unregister,
    /// Replace the key.
    Replace,
}

/// Reservation Acquire's action (RACQA, CDW10 bits 2:0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireAction {
    /// Acquire a reservation.
    Acquire,
    /// Preempt registrants (and the reservation) with key PRKEY.
    Preempt,
    /// Preempt, and abort the preempted hosts' commands.
    PreemptAndAbort,
}

/// Reservation Release's action (RRELA, CDW10 bits 2:0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseAction {
    /// Release the reservation.
    Release,
    /// Clear: release, and unregister every host.
    Clear,
}

impl NsResv {
    fn find(&self, host: &HostId) -> Option<usize> {
        self.registrants.iter().position(|r| r.host == *host)
    }

    /// The host's key, if it is a registrant.
    pub fn key_of(&self, host: &HostId) -> Option<u64> {
        self.find(host).map(|i| self.registrants[i].key)
    }

    /// Whether the host holds the reservation (any registrant, for the All Registrants types).
    pub fn is_holder(&self, host: &HostId) -> bool {
        match self.held {
            Some(h) if h.rtype.all_registrants() => self.find(host).is_some(),
            Some(h) => h.holder == *host,
            None => false,
        }
    }

    /// Whether a command of `access`'s group from `host` may proceed (NVMe Base 2.0 Figure
    /// 8.20): without a reservation always; the holder always; other registrants unless the
    /// type is Write Exclusive (writes) or Exclusive Access (both); non-registrants only
    /// reads, and only for the Write Exclusive types.
    pub fn allows(&self, host: &HostId, access: Access) -> bool {
        let Some(h) = self.held else { return true };
        if self.is_holder(host) {
            return true;
        }
        let registrant = self.find(host).is_some();
        if registrant && h.rtype.registrants_have_access() {
            return true;
        }
        access == Access::Read && !h.rtype.exclusive_access()
    }

    /// The host's key must be `crkey` (NVMe Base 2.0 §8.19.3 to §8.19.6: a non-registrant or
    /// a wrong key is Reservation Conflict).
    fn check_key(&self, host: &HostId, crkey: u64) -> Result<usize, Status> {
        match self.find(host) {
            Some(i) if self.registrants[i].key == crkey => Ok(i),
            _ => Err(RESERVATION_CONFLICT),
        }
    }

    /// Registrants other than `except` with key `key`, removed; the hosts removed.
    fn remove_by_key(&mut self, key: u64, except: &HostId) -> Vec<HostId> {
        let mut gone = Vec::new();
        self.registrants.retain(|r| {
            let go = r.key == key && r.host != *except;
            if go {
                gone.push(r.host);
            }
            !go
        });
        gone
    }

    fn others(&self, except: &HostId, notice: Notice) -> Notices {
        self.registrants
            .iter()
            .filter(|r| r.host != *except)
            .map(|r| (r.host, notice))
            .collect()
    }

    /// A registrant left (unregistered): the reservation it held goes (NVMe Base 2.0
    /// §8.19.4: an All Registrants reservation goes with its last registrant), and for the
    /// types registrants had access to the others hear Reservation Released.
    fn registrant_left(&mut self, host: &HostId) -> Notices {
        let Some(h) = self.held else { return Vec::new() };
        if h.rtype.all_registrants() {
            if self.registrants.is_empty() {
                self.held = None;
            } else if h.holder == *host {
                // Still held by the others; name one that holds it.
                self.held = Some(Held {
                    holder: self.registrants[0].host,
                    ..h
                });
            }
            return Vec::new();
        }
        if h.holder != *host {
            return Vec::new();
        }
        self.held = None;
        if h.rtype.registrants_have_access() {
            self.others(host, Notice::ReservationReleased)
        } else {
            Vec::new()
        }
    }

    /// Reservation Register (NVMe Base 2.0 §8.19.3, §8.19.4): register `nrkey` (a host
    /// registered with the same key succeeds, with another is Reservation Conflict),
    /// unregister, or replace the key; `crkey` must be the host's key unless `iekey`.
    /// `ptpl` (CPTPL) applies when the command succeeds.
    pub fn register(
        &mut self,
        host: &HostId,
        action: RegisterAction,
        iekey: bool,
        crkey: u64,
        nrkey: u64,
        ptpl: Option<bool>,
    ) -> Result<Notices, Status> {
        let check = |s: &Self| match s.find(host) {
            Some(i) if iekey || s.registrants[i].key == crkey => Ok(i),
            _ => Err(RESERVATION_CONFLICT),
        };
        let notices = match action {
            RegisterAction::Register => match self.find(host) {
                Some(i) if self.registrants[i].key == nrkey => {
                    self.generation = self.generation.wrapping_add(1);
                    Vec::new()
                }
                Some(_) => return Err(RESERVATION_CONFLICT),
                None => {
                    self.registrants.push(Registrant {
                        host: *host,
                        key: nrkey,
                    });
                    self.generation = self.generation.wrapping_add(1);
                    Vec::new()
                }
            },
            RegisterAction::Unregister => {
                let i = check(self)?;
                self.registrants.remove(i);
                self.generation = self.generation.wrapping_add(1);
                self.registrant_left(host)
            }
            RegisterAction::Replace => {
                let i = check(self)?;
                self.registrants[i].key = nrkey;
                self.generation = self.generation.wrapping_add(1);
                Vec::new()
            }
        };
        if let Some(p) = ptpl {
            self.ptpl = p;
        }
        Ok(notices)
    }

    /// Reservation Acquire (NVMe Base 2.0 §8.19.5, §8.19.7). The host must be a registrant
    /// with key `crkey`. Acquire: a namespace without a reservation gets one of `rtype` held
    /// by the host; the holder acquiring the type it holds succeeds; anything else is
    /// Reservation Conflict. Preempt (and Preempt and Abort) with `prkey`:
    /// - without a reservation, registrants with key `prkey` are removed;
    /// - an All Registrants reservation with `prkey` 0 removes every other registrant and
    ///   becomes the host's, of `rtype`; another `prkey` removes the registrants with it;
    /// - a reservation whose holder's key is `prkey` becomes the host's, of `rtype`, and the
    ///   registrants with that key are removed (a holder preempting itself changes the type);
    ///   another non-zero `prkey` removes the registrants with it, and 0 is Invalid Field.
    ///
    /// A Preempt that removes nobody and takes no reservation is Reservation Conflict. The
    /// hosts removed hear Registration Preempted; when the reservation changes hands or type,
    /// the remaining registrants hear Reservation Preempted.
    pub fn acquire(
        &mut self,
        host: &HostId,
        action: AcquireAction,
        rtype: ResvType,
        crkey: u64,
        prkey: u64,
    ) -> Result<Notices, Status> {
        self.check_key(host, crkey)?;
        if action == AcquireAction::Acquire {
            return match self.held {
                None => {
                    self.held = Some(Held { rtype, holder: *host });
                    Ok(Vec::new())
                }
                Some(h) if h.rtype == rtype && self.is_holder(host) => Ok(Vec::new()),
                Some(_) => Err(RESERVATION_CONFLICT),
            };
        }
        let mut notices = Vec::new();
        let taken = match self.held {
            Some(h) if h.rtype.all_registrants() && prkey == 0 => {
                let others: Vec<HostId> = self
                    .registrants
                    .iter()
                    .filter(|r| r.host != *host)
                    .map(|r| r.host)
                    .collect();
                self.registrants.retain(|r| r.host == *host);
                notices.extend(others.into_iter().map(|h| (h, Notice::RegistrationPreempted)));
                true
            }
            Some(h) if !h.rtype.all_registrants() && self.key_of(&h.holder) == Some(prkey) => {
                let gone = self.remove_by_key(prkey, host);
                notices.extend(gone.into_iter().map(|h| (h, Notice::RegistrationPreempted)));
                true
            }
            Some(h) if !h.rtype.all_registrants() && prkey == 0 => return Err(Status::INVALID_FIELD),
            _ => {
                let gone = self.remove_by_key(prkey, host);
                if gone.is_empty() {
                    return Err(RESERVATION_CONFLICT);
                }
                notices.extend(gone.into_iter().map(|h| (h, Notice::RegistrationPreempted)));
                // A holder among those removed takes its reservation with it.
                if let Some(h) = self.held {
                    if !h.rtype.all_registrants() && self.find(&h.holder).is_none() {
                        self.held = None;
                    }
                }
                false
            }
        };
        if taken {
            let before = self.held;
            let new = Held { rtype, holder: *host };
            self.held = Some(new);
            let changed = before.is_none_or(|b| b.rtype != rtype || b.holder != *host);
            if changed {
                notices.extend(self.others(host, Notice::ReservationPreempted));
            }
        }
        self.generation = self.generation.wrapping_add(1);
        Ok(notices)
    }

    /// Reservation Release (NVMe Base 2.0 §8.19.6, §8.19.8). The host must be a registrant
    /// with key `crkey`. Release by the holder (any registrant for the All Registrants types)
    /// ends the reservation; `rtype` must be its type (else Invalid Field); registrants that
    /// had access hear Reservation Released. Release by anyone else, or without a
    /// reservation, succeeds and changes nothing. Clear ends the reservation and every
    /// registration; the other registrants hear Reservation Preempted.
    pub fn release(
        &mut self,
        host: &HostId,
        action: ReleaseAction,
        rtype: u8,
        crkey: u64,
    ) -> Result<Notices, Status> {
        self.check_key(host, crkey)?;
        match action {
            ReleaseAction::Release => {
                let Some(h) = self.held else { return Ok(Vec::new()) };
                if !self.is_holder(host) {
                    return Ok(Vec::new());
                }
                if h.rtype as u8 != rtype {
                    return Err(Status::INVALID_FIELD);
                }
                self.held = None;
                Ok(if h.rtype.registrants_have_access() {
                    self.others(host, Notice::ReservationReleased)
                } else {
                    Vec::new()
                })
            }
            ReleaseAction::Clear => {
                let notices = self.others(host, Notice::ReservationPreempted);
                self.registrants.clear();
                self.held = None;
                self.generation = self.generation.wrapping_add(1);
                Ok(notices)
            }
        }
    }

    /// The Reservation Status data structure with the extended (64-byte, 128-bit host
    /// identifier) entries (NVMe Base 2.0 Figures 8.22 and 8.24): the 64-byte header (GEN,
    /// RTYPE, REGCTL, PTPLS) and one Registered Controller entry per controller of each
    /// registrant (CNTLID, RCSTS bit 0: holds the reservation, RKEY, HOSTID). `controllers`
    /// names a host's connected controllers in the subsystem; a registrant without one (it
    /// registered before a restart) has one entry with CNTLID FFFFh.
    pub fn report(&self, controllers: impl Fn(&HostId) -> Vec<u16>) -> Vec<u8> {
        let mut entries = Vec::new();
        for r in &self.registrants {
            let mut ids = controllers(&r.host);
            if ids.is_empty() {
                ids.push(0xffff);
            }
            for c in ids {
                entries.push((c, r));
            }
        }
        let mut b = vec![0u8; 64 * (1 + entries.len())];
        put32(&mut b, 0, self.generation);
        b[4] = self.held.map_or(0, |h| h.rtype as u8);
        put16(&mut b, 5, entries.len().min(u16::MAX as usize) as u16);
        b[9] = self.ptpl as u8;
        for (i, (cntlid, r)) in entries.iter().enumerate() {
            let o = 64 * (i + 1);
            put16(&mut b, o, *cntlid);
            b[o + 2] = self.is_holder(&r.host) as u8;
            put64(&mut b, o + 8, r.key);
            b[o + 16..o + 32].copy_from_slice(&r.host);
        }
        b
    }
}

/// Notices a controller keeps unread at most (the log page's Number of Available Log Pages
/// is one byte); past that the oldest go, and the count's jump tells the host.
const NOTICES_KEPT: usize = 255;

/// One controller's Reservation Notification log (NVMe Base 2.0 §5.16.1.24, log 80h): a
/// queue of notices, each read once, and the Reservation Notification Mask per namespace.
#[derive(Debug, Clone, Default)]
pub struct NoticeLog {
    /// Log Page Count of the newest notice (wraps to 1; 0: none yet).
    count: u64,
    /// (count, notice, NSID), oldest first.
    queue: VecDeque<(u64, Notice, u32)>,
    /// Mask bits (1: Registration Preempted, 2: Released, 3: Preempted) by NSID.
    masks: BTreeMap<u32, u32>,
}

impl NoticeLog {
    /// The mask of namespace `nsid` (Get Features 82h).
    pub fn mask(&self, nsid: u32) -> u32 {
        self.masks.get(&nsid).copied().unwrap_or(0)
    }

    /// Sets the mask of `nsids` (Set Features 82h; NSID FFFFFFFFh names every namespace).
    pub fn set_mask(&mut self, nsids: impl IntoIterator<Item = u32>, mask: u32) {
        for n in nsids {
            self.masks.insert(n, mask & 0b1110);
        }
    }

    /// Logs `notice` for namespace `nsid` unless masked: true if logged.
    pub fn push(&mut self, nsid: u32, notice: Notice) -> bool {
        if self.mask(nsid) & notice.mask_bit() != 0 {
            return false;
        }
        self.count = self.count.wrapping_add(1).max(1);
        if self.queue.len() == NOTICES_KEPT {
            self.queue.pop_front();
        }
        self.queue.push_back((self.count, notice, nsid));
        true
    }

    /// Whether notices wait to be read.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// The log page (64 bytes: Log Page Count, type, Number of Available Log Pages after
    /// this one, NSID), taking the oldest notice; with none, an empty page (type 0).
    /// `consume` false (Retain Asynchronous Event) leaves it queued.
    pub fn page(&mut self, consume: bool) -> Vec<u8> {
        let mut b = vec![0u8; LOG_PAGE_BYTES];
        let Some(&(count, notice, nsid)) = self.queue.front() else {
            return b;
        };
        put64(&mut b, 0, count);
        b[8] = notice as u8;
        b[9] = (self.queue.len() - 1).min(255) as u8;
        put32(&mut b, 12, nsid);
        if consume {
            self.queue.pop_front();
        }
        b
    }

    /// Forgets a removed namespace's mask.
    pub fn forget(&mut self, nsid: u32) {
        self.masks.remove(&nsid);
    }
}

/// The reservation states of a subsystem's namespaces, shared by the target (commands,
/// under its lock) and the I/O queues (conflict checks, without it).
#[derive(Debug, Default)]
pub(crate) struct SubsysResv {
    /// Namespaces with a reservation held: while 0, I/O takes no lock.
    reserved: AtomicUsize,
    states: Mutex<BTreeMap<u32, NsResv>>,
}

impl SubsysResv {
    /// The states; a worker that panicked holding them left each namespace's consistent
    /// (every change is made on a copy and stored whole).
    pub fn lock(&self) -> MutexGuard<'_, BTreeMap<u32, NsResv>> {
        self.states.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stores namespace `nsid`'s new state (an empty one is dropped).
    pub fn store(&self, states: &mut BTreeMap<u32, NsResv>, nsid: u32, st: NsResv) {
        if st == NsResv::default() {
            states.remove(&nsid);
        } else {
            states.insert(nsid, st);
        }
        let n = states.values().filter(|s| s.held.is_some()).count();
        self.reserved.store(n, Ordering::Release);
    }

    /// Whether a command of `access`'s group from `host` to `nsid` may proceed.
    pub fn allows(&self, nsid: u32, host: &HostId, access: Access) -> bool {
        if self.reserved.load(Ordering::Acquire) == 0 {
            return true;
        }
        self.lock().get(&nsid).is_none_or(|s| s.allows(host, access))
    }
}

/// A reservation command as an I/O queue decoded it ([`IoOp::Reservation`]).
///
/// [`IoOp::Reservation`]: super::IoOp::Reservation
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResvCommand {
    /// Register (0Dh), Report (0Eh), Acquire (11h) or Release (15h).
    pub opcode: u8,
    /// Command dword 10 (action, IEKEY, RTYPE, CPTPL; Report: NUMD).
    pub cdw10: u32,
    /// Command dword 11 (Report: EDS in bit 0).
    pub cdw11: u32,
    /// The data: 16 bytes from the host (Register, Acquire), 8 (Release), or the report's
    /// bytes to the host.
    pub data: DataXfer,
}

/// What the target keeps for reservations besides each subsystem's states.
#[derive(Debug, Default)]
pub(crate) struct TargetResv {
    /// Where the states of namespaces with PTPL persist (`None`: PTPL is not supported).
    store: Option<ResvStore>,
    /// Completions of held Asynchronous Event Requests that notices completed, for the
    /// runtime ([`Target::take_reservation_events`](super::Target::take_reservation_events)).
    events: Vec<AerCompletion>,
}

impl TargetResv {
    /// Whether reservations may persist through power loss (a state file is set).
    pub fn ptpl_capable(&self) -> bool {
        self.store.is_some()
    }
}

/// Decodes a reservation command's data transfer (the namespace is checked by the caller):
/// Register and Acquire carry 16 bytes, Release 8, Report sends (NUMD + 1) dwords, at most
/// `max_transfer` bytes; another length is Data SGL Length Invalid.
pub(crate) fn decode(sqe: &Sqe, in_capsule: u32, max_transfer: u32) -> Result<ResvCommand, Status> {
    let op = sqe.opcode();
    let want = match op {
        opcode::REGISTER | opcode::ACQUIRE => 16,
        opcode::RELEASE => 8,
        _ => {
            let bytes = (sqe.dw[10] as u64 + 1) * 4;
            if bytes > max_transfer as u64 {
                return Err(Status::INVALID_FIELD);
            }
            bytes as u32
        }
    };
    let data = data_xfer(sqe, in_capsule)?;
    if data.len() != want {
        return Err(status::DATA_SGL_LENGTH_INVALID);
    }
    Ok(ResvCommand {
        opcode: op,
        cdw10: sqe.dw[10],
        cdw11: sqe.dw[11],
        data,
    })
}
