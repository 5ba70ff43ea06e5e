//! Asymmetric Namespace Access (NVMe Base 2.0 §8.1.3): every namespace belongs to an ANA
//! group, and each (port, group) pair has an ANA state that the controllers connected through
//! that port report, so that a multipath host (Linux's native multipath,
//! `drivers/nvme/host/multipath.c`) prefers optimized paths and stops using inaccessible ones.
//!
//! ANA group IDs are the target's (as Linux's target numbers them): a group may hold namespaces
//! of several subsystems, and each subsystem's controllers list only their own namespaces. A
//! controller's view is the port its admin queue connected through.
//!
//! The states a port shows are published in an [`AnaCell`] of atomics that every controller of
//! the port shares with its I/O queues: I/O decoding reads one byte, without a lock.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use vfpoll_nvme_spec::status::Status;

use super::bytes::{put32, put64};
use super::wire::status;

/// The largest ANA group ID (ANAGRPMAX of Identify Controller), and the number of groups a
/// controller supports (NANAGRPID): Linux's target uses the same 128.
pub const ANAGRPMAX: u32 = 128;
// Error messages name the range.
const _: () = assert!(ANAGRPMAX == 128);

/// ANATT: seconds a namespace may stay in the ANA Change state before the host gives up on
/// the path (Linux resets the controller after twice that).
pub const ANATT_SECONDS: u8 = 10;

/// Bytes of the ANA log page's header (NVMe Base 2.0 §5.16.1.13: change count, number of
/// descriptors, reserved).
pub const ANA_HEADER_BYTES: usize = 16;

/// Bytes of an ANA Group Descriptor without its NSID list (ANAGRPID, number of NSIDs, change
/// count, state, reserved).
pub const ANA_DESCRIPTOR_BYTES: usize = 32;

/// An ANA state (NVMe Base 2.0 §8.1.3.1 to §8.1.3.5; the codes of the ANA Group Descriptor's
/// ANA State field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum AnaState {
    /// ANA Optimized (01h): the best path; commands are processed.
    #[default]
    Optimized,
    /// ANA Non-Optimized (02h): commands are processed, possibly slower; hosts prefer
    /// optimized paths.
    NonOptimized,
    /// ANA Inaccessible (03h): I/O commands fail with Asymmetric Access Inaccessible.
    Inaccessible,
    /// ANA Persistent Loss (04h): I/O commands fail with Asymmetric Access Persistent Loss.
    PersistentLoss,
    /// ANA Change (0Fh): a transition; I/O commands fail with Asymmetric Access Transition
    /// and the host waits up to ANATT for the next state.
    Change,
}

impl AnaState {
    /// The state's code in the ANA log page.
    pub const fn code(self) -> u8 {
        match self {
            AnaState::Optimized => 0x01,
            AnaState::NonOptimized => 0x02,
            AnaState::Inaccessible => 0x03,
            AnaState::PersistentLoss => 0x04,
            AnaState::Change => 0x0f,
        }
    }

    /// The state with code `code`, if it names one.
    pub const fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0x01 => AnaState::Optimized,
            0x02 => AnaState::NonOptimized,
            0x03 => AnaState::Inaccessible,
            0x04 => AnaState::PersistentLoss,
            0x0f => AnaState::Change,
            _ => return None,
        })
    }

    /// The name Linux and nvme-cli use ("optimized", "non-optimized", "inaccessible",
    /// "persistent-loss", "change").
    pub const fn name(self) -> &'static str {
        match self {
            AnaState::Optimized => "optimized",
            AnaState::NonOptimized => "non-optimized",
            AnaState::Inaccessible => "inaccessible",
            AnaState::PersistentLoss => "persistent-loss",
            AnaState::Change => "change",
        }
    }

    /// The state named `name` (as [`AnaState::name`] writes it).
    pub fn from_name(name: &str) -> Option<Self> {
        [
            AnaState::Optimized,
            AnaState::NonOptimized,
            AnaState::Inaccessible,
            AnaState::PersistentLoss,
            AnaState::Change,
        ]
        .into_iter()
        .find(|s| s.name() == name)
    }

    /// Whether the namespace's data can be reached in this state (NUSE is reported, I/O is
    /// processed: Optimized and Non-Optimized).
    pub const fn accessible(self) -> bool {
        matches!(self, AnaState::Optimized | AnaState::NonOptimized)
    }
}

impl std::fmt::Display for AnaState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The status that refuses an I/O command in the state with code `code` (NVMe Base 2.0
/// §8.1.3.3 to §8.1.3.5, as Linux's target applies it to every I/O command), or `None`.
fn refusal(code: u8) -> Option<Status> {
    match code {
        0x03 => Some(status::ANA_INACCESSIBLE),
        0x04 => Some(status::ANA_PERSISTENT_LOSS),
        0x0f => Some(status::ANA_TRANSITION),
        _ => None,
    }
}

/// The ANA states of one port, group by group, shared by its controllers and their I/O
/// queues (index: the ANA group ID; 0 is unused).
#[derive(Debug)]
pub(crate) struct AnaCell {
    states: [AtomicU8; ANAGRPMAX as usize + 1],
}

impl Default for AnaCell {
    fn default() -> Self {
        AnaCell {
            states: std::array::from_fn(|_| AtomicU8::new(AnaState::Optimized.code())),
        }
    }
}

impl AnaCell {
    /// The state of `group` (Optimized for an ID out of range, which validation keeps out).
    pub fn state(&self, group: u32) -> AnaState {
        self.states
            .get(group as usize)
            .and_then(|s| AnaState::from_code(s.load(Ordering::Acquire)))
            .unwrap_or_default()
    }

    /// The hot path's check: the status that refuses I/O to a namespace of `group`, if any.
    pub fn io_refusal(&self, group: u32) -> Option<Status> {
        refusal(self.states.get(group as usize)?.load(Ordering::Acquire))
    }

    fn set(&self, group: u32, state: AnaState) {
        if let Some(s) = self.states.get(group as usize) {
            s.store(state.code(), Ordering::Release);
        }
    }
}

/// One port's ANA states and the change counts its ANA log pages report.
#[derive(Debug, Default)]
struct PortAna {
    cell: Arc<AnaCell>,
    /// The log page's change count: bumped whenever a descriptor this port reports may have
    /// changed.
    count: u64,
    /// Each group's descriptor change count.
    group_counts: BTreeMap<u32, u64>,
}

/// A change count's next value: it starts at 0 and rolls over from FFFFFFFF_FFFFFFFFh to 1
/// (NVMe Base 2.0 §5.16.1.13).
fn bump(count: &mut u64) {
    *count = if *count == u64::MAX { 1 } else { *count + 1 };
}

impl PortAna {
    fn bump(&mut self, group: u32) {
        bump(&mut self.count);
        bump(self.group_counts.entry(group).or_default());
    }
}

/// The ANA states of every port the target has had, by port ID (a removed listener's
/// connections keep their view).
#[derive(Debug, Default)]
pub(crate) struct AnaPorts {
    ports: BTreeMap<u16, PortAna>,
}

impl AnaPorts {
    /// The cell of port `portid`, for a controller connecting through it.
    pub fn cell(&mut self, portid: u16) -> Arc<AnaCell> {
        self.ports.entry(portid).or_default().cell.clone()
    }

    pub fn has_port(&self, portid: u16) -> bool {
        self.ports.contains_key(&portid)
    }

    /// The state of `group` on port `portid`.
    pub fn state(&self, portid: u16, group: u32) -> AnaState {
        self.ports
            .get(&portid)
            .map_or(AnaState::Optimized, |p| p.cell.state(group))
    }

    /// The groups of port `portid` in a state other than Optimized.
    pub fn non_optimized(&self, portid: u16) -> Vec<u32> {
        (1..=ANAGRPMAX)
            .filter(|&g| self.state(portid, g) != AnaState::Optimized)
            .collect()
    }

    /// Sets a state; whether it changed.
    pub fn set(&mut self, portid: u16, group: u32, state: AnaState) -> bool {
        let port = self.ports.entry(portid).or_default();
        if port.cell.state(group) == state {
            return false;
        }
        port.cell.set(group, state);
        port.bump(group);
        true
    }

    /// Namespaces joined or left `groups`: every port's descriptors of them changed.
    pub fn membership_changed(&mut self, groups: &[u32]) {
        for port in self.ports.values_mut() {
            for &g in groups {
                port.bump(g);
            }
        }
    }

    /// The ANA log page (log 0Ch, NVMe Base 2.0 §5.16.1.13) as port `portid` shows a
    /// subsystem whose namespaces are `members`, (NSID, ANA group) pairs: the header (change
    /// count, number of descriptors), then one descriptor per group holding a namespace, by
    /// group ID, each with its NSIDs in ascending order. With RGO (Return Groups Only, LSP bit
    /// 0) the descriptors carry no NSIDs (NNSID 0).
    pub fn log_page(&self, portid: u16, members: impl IntoIterator<Item = (u32, u32)>, rgo: bool) -> Vec<u8> {
        let mut groups: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        let mut count = 0;
        for (nsid, group) in members {
            groups.entry(group).or_default().push(nsid);
            count += 1;
        }
        let nsids: usize = if rgo { 0 } else { count };
        let mut b = vec![0u8; ANA_HEADER_BYTES + groups.len() * ANA_DESCRIPTOR_BYTES + 4 * nsids];
        let port = self.ports.get(&portid);
        put64(&mut b, 0, port.map_or(0, |p| p.count));
        b[8..10].copy_from_slice(&(groups.len() as u16).to_le_bytes());
        let mut at = ANA_HEADER_BYTES;
        for (group, mut ids) in groups {
            ids.sort_unstable();
            if rgo {
                ids.clear();
            }
            put32(&mut b, at, group);
            put32(&mut b, at + 4, ids.len() as u32);
            let count = port.and_then(|p| p.group_counts.get(&group)).copied();
            put64(&mut b, at + 8, count.unwrap_or(0));
            b[at + 16] = self.state(portid, group).code();
            at += ANA_DESCRIPTOR_BYTES;
            for id in ids {
                put32(&mut b, at, id);
                at += 4;
            }
        }
        b
    }
}

/// MNAN, the most namespaces a subsystem holds, as Identify Controller reports it: NN, or
/// fewer where the ANA log page of that many namespaces in [`ANAGRPMAX`] groups would not fit
/// one transfer of `max_transfer` bytes. Linux sizes its ANA log buffer as header + NANAGRPID
/// descriptors + MNAN NSIDs (`nvme_mpath_init_identify`), refuses a controller whose MNAN is
/// 0 or above NN, and turns ANA off when that size passes MDTS.
pub(crate) fn mnan(max_transfer: u32, nn: u32) -> u32 {
    let room = (max_transfer as usize)
        .saturating_sub(ANA_HEADER_BYTES + ANAGRPMAX as usize * ANA_DESCRIPTOR_BYTES)
        / 4;
    nn.min(u32::try_from(room).unwrap_or(u32::MAX)).max(1)
}

/// Checks an ANA group ID: 1 to [`ANAGRPMAX`].
pub(crate) fn valid_group(group: u32) -> bool {
    (1..=ANAGRPMAX).contains(&group)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_through_codes_and_names() {
        for s in [
            AnaState::Optimized,
            AnaState::NonOptimized,
            AnaState::Inaccessible,
            AnaState::PersistentLoss,
            AnaState::Change,
        ] {
            assert_eq!(AnaState::from_code(s.code()), Some(s));
            assert_eq!(AnaState::from_name(s.name()), Some(s));
            assert_eq!(s.accessible(), refusal(s.code()).is_none(), "{s}");
        }
        assert_eq!(AnaState::from_code(0), None);
        assert_eq!(AnaState::from_code(5), None);
        assert_eq!(AnaState::from_name("standby"), None);
    }

    #[test]
    fn change_counts_roll_over_to_one() {
        let mut c = u64::MAX - 1;
        bump(&mut c);
        assert_eq!(c, u64::MAX);
        bump(&mut c);
        assert_eq!(c, 1);
    }

    #[test]
    fn mnan_keeps_the_log_within_one_transfer() {
        // 16 + 128 × 32 + 1020 × 4 = 8192.
        assert_eq!(mnan(8192, 1024), 1020);
        assert_eq!(mnan(16384, 1024), 1024);
        assert_eq!(mnan(1 << 20, 5000), 5000);
        for mt in [8192u32, 16384, 1 << 17] {
            let n = mnan(mt, 1024) as usize;
            assert!(ANA_HEADER_BYTES + ANAGRPMAX as usize * ANA_DESCRIPTOR_BYTES + 4 * n <= mt as usize);
        }
    }
}
