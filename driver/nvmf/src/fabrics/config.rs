//! What a target serves: subsystems with their namespaces and allowed hosts, the listeners the
//! discovery log names, and the limits every controller reports. NQNs are checked here (NVMe
//! Base 2.0 §4.5), and a namespace's identifiers are derived so that they survive restarts.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use super::ana::{valid_group, AnaState, ANAGRPMAX};

/// The well-known NQN of the discovery subsystem (NVMe Base 2.0 §4.5, NVMe Qualified Names).
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

/// The longest NQN in bytes (NVMe Base 2.0 §4.5: 223 bytes of UTF-8, without the NUL that the
/// 256-byte fields carry).
pub const NQN_MAX: usize = 223;

/// The largest namespace ID a subsystem reports at least (NN of Identify Controller), so that
/// namespaces can be added later without changing NN (Linux's target uses the same 1024).
pub const DEFAULT_MAX_NSID: u32 = 1024;

/// Why a configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// An NQN that is not one.
    #[error(
        "NQN {nqn:?} is invalid: {why}; an NQN is nqn.yyyy-mm.<reversed domain>[:<name>] or \
         nqn.2014-08.org.nvmexpress:uuid:<uuid>, at most 223 bytes (NVMe Base 2.0 §4.5)"
    )]
    BadNqn {
        /// The NQN as given.
        nqn: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A subsystem named with the discovery NQN.
    #[error("{DISCOVERY_NQN} is the discovery subsystem's NQN: give the subsystem its own NQN")]
    DiscoveryNqn,
    /// Two subsystems with one NQN.
    #[error("subsystem {0} is configured twice: give each subsystem its own NQN")]
    DuplicateSubsystem(String),
    /// A subsystem this target does not have.
    #[error("no subsystem {0} on this target")]
    NoSuchSubsystem(String),
    /// A text field that does not fit its Identify field.
    #[error("{field} {value:?} is invalid: {why}")]
    BadField {
        /// Which field.
        field: &'static str,
        /// The value as given.
        value: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A namespace the target cannot serve.
    #[error("namespace {nsid} of {subsystem}: {why}")]
    BadNamespace {
        /// The subsystem's NQN.
        subsystem: String,
        /// The namespace ID.
        nsid: u32,
        /// What is wrong, and the fix.
        why: String,
    },
    /// A namespace that is not there.
    #[error("subsystem {subsystem} has no namespace {nsid}")]
    NoSuchNamespace {
        /// The subsystem's NQN.
        subsystem: String,
        /// The namespace ID.
        nsid: u32,
    },
    /// A listener the discovery log cannot name, or a port ID used twice.
    #[error("listener {what}: {why}")]
    BadListener {
        /// The listener (port ID and address).
        what: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A target option out of range.
    #[error("target option {option} = {value}: {why}")]
    BadOption {
        /// Which option.
        option: &'static str,
        /// The value given.
        value: u64,
        /// The range it must be in.
        why: &'static str,
    },
}

/// Checks `nqn` against NVMe Base 2.0 §4.5: UTF-8, 1 to 223 bytes, and one of the two forms
/// `nqn.yyyy-mm.<reversed domain>[:<anything>]` or `nqn.2014-08.org.nvmexpress:uuid:<UUID>`.
pub fn validate_nqn(nqn: &str) -> Result<(), ConfigError> {
    let bad = |why| {
        Err(ConfigError::BadNqn {
            nqn: nqn.to_owned(),
            why,
        })
    };
    if nqn.is_empty() || nqn.len() > NQN_MAX {
        return bad("it must be 1 to 223 bytes long");
    }
    if nqn.contains('\0') {
        return bad("it contains a NUL byte");
    }
    if let Some(uuid) = nqn.strip_prefix("nqn.2014-08.org.nvmexpress:uuid:") {
        return if is_uuid(uuid) {
            Ok(())
        } else {
            bad("the UUID form needs a UUID as 8-4-4-4-12 hexadecimal digits")
        };
    }
    let Some(rest) = nqn.strip_prefix("nqn.") else {
        return bad("it does not start with \"nqn.\"");
    };
    let date = rest.as_bytes();
    let date_ok = date.len() > 8
        && date[..4].iter().all(u8::is_ascii_digit)
        && date[4] == b'-'
        && date[5..7].iter().all(u8::is_ascii_digit)
        && matches!(
            &rest[5..7],
            "01" | "02" | "03" | "04" | "05" | "06" | "07" | "08" | "09" | "10" | "11" | "12"
        )
        && date[7] == b'.';
    if !date_ok {
        return bad("\"nqn.\" must be followed by a year and month, yyyy-mm, and a dot");
    }
    let domain = rest[8..].split(':').next().unwrap_or("");
    let domain_ok = !domain.is_empty()
        && domain
            .split('.')
            .all(|label| !label.is_empty() && label.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-'));
    if !domain_ok {
        return bad("the date must be followed by a reversed domain name such as com.example");
    }
    Ok(())
}

fn is_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// FNV-1a, 128 bits (a fixed, published function: the derived identifiers must not change
/// with the Rust toolchain, which `std`'s hashers may).
fn fnv1a128(parts: &[&[u8]]) -> [u8; 16] {
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
    let mut h = OFFSET;
    for p in parts {
        // Each part ends in a NUL so that ("ab", "c") and ("a", "bc") differ.
        for &b in p.iter().chain(&[0u8]) {
            h ^= b as u128;
            h = h.wrapping_mul(PRIME);
        }
    }
    h.to_be_bytes()
}

/// A namespace's identifiers (NGUID, UUID, EUI-64), derived from the subsystem NQN, the
/// namespace ID and the backend's identity: the same namespace gets the same identifiers after
/// a restart, and no two namespaces of one target share one (Linux refuses duplicates across
/// its whole host, and multipath recognises paths by them).
///
/// They are not IEEE-assigned: the EUI-64 has the locally administered bit set, the UUID is a
/// version 8 ("custom", RFC 9562) UUID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamespaceIds {
    /// Namespace Globally Unique Identifier.
    pub nguid: [u8; 16],
    /// Namespace UUID.
    pub uuid: [u8; 16],
    /// IEEE Extended Unique Identifier.
    pub eui64: [u8; 8],
}

impl NamespaceIds {
    /// Derives the identifiers; `backend` names the storage (e.g. `nvme:<serial>:<nsid>` or
    /// `malloc:<name>`), so that a namespace moved to other storage is a different namespace.
    pub fn derive(subsystem_nqn: &str, nsid: u32, backend: &str) -> Self {
        let id = |kind: &str| {
            fnv1a128(&[
                b"vfpoll-nvmf namespace",
                kind.as_bytes(),
                subsystem_nqn.as_bytes(),
                &nsid.to_le_bytes(),
                backend.as_bytes(),
            ])
        };
        let nguid = id("nguid");
        let mut uuid = id("uuid");
        uuid[6] = (uuid[6] & 0x0f) | 0x80;
        uuid[8] = (uuid[8] & 0x3f) | 0x80;
        let mut eui64 = [0u8; 8];
        eui64.copy_from_slice(&id("eui64")[..8]);
        // Unicast, locally administered (IEEE 802 bit 0 clear, bit 1 set in the first byte).
        eui64[0] = (eui64[0] & 0xfc) | 0x02;
        NamespaceIds { nguid, uuid, eui64 }
    }
}

/// One namespace of a subsystem.
///
/// The target serves plain data formats only: 512 to 4096-byte blocks without metadata or
/// protection information (NVMe/TCP carries no separate metadata buffer, and a host cannot
/// tell the target's PI from its own); [`NamespaceInfo::from_format`] refuses a backend
/// formatted otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceInfo {
    /// Namespace ID, 1 to the subsystem's NN.
    pub nsid: u32,
    /// Data bytes per block: 512, 1024, 2048 or 4096.
    pub block_size: u32,
    /// Size in blocks.
    pub blocks: u64,
    /// Namespace Globally Unique Identifier.
    pub nguid: [u8; 16],
    /// Namespace UUID.
    pub uuid: [u8; 16],
    /// IEEE Extended Unique Identifier.
    pub eui64: [u8; 8],
    /// Writes may sit in a volatile cache until a Flush (reported in VWC and honoured through
    /// the Volatile Write Cache feature).
    pub volatile_write_cache: bool,
    /// The backend implements Write Zeroes.
    pub write_zeroes: bool,
    /// The backend implements deallocation (Dataset Management with the Deallocate attribute).
    pub deallocate: bool,
    /// The namespace's ANA group (ANAGRPID, NVMe Base 2.0 §8.1.3): 1 to
    /// [`ANAGRPMAX`]; 1 unless set. Each port has a state per group
    /// ([`Listener::ana`], [`Target::set_ana_state`](super::Target::set_ana_state)).
    pub ana_group: u32,
}

impl NamespaceInfo {
    /// A namespace of `blocks` blocks of `block_size` bytes with identifiers derived from
    /// `subsystem_nqn`, `nsid` and `backend` ([`NamespaceIds::derive`]); no volatile write
    /// cache, Write Zeroes or deallocation until set; ANA group 1.
    pub fn new(subsystem_nqn: &str, nsid: u32, backend: &str, block_size: u32, blocks: u64) -> Self {
        let ids = NamespaceIds::derive(subsystem_nqn, nsid, backend);
        NamespaceInfo {
            nsid,
            block_size,
            blocks,
            nguid: ids.nguid,
            uuid: ids.uuid,
            eui64: ids.eui64,
            volatile_write_cache: false,
            write_zeroes: false,
            deallocate: false,
            ana_group: 1,
        }
    }

    /// log2 of the block size.
    pub fn block_shift(&self) -> u8 {
        self.block_size.trailing_zeros() as u8
    }

    pub(crate) fn validate(&self, subsystem: &str, max_nsid: u32) -> Result<(), ConfigError> {
        let bad = |why: String| ConfigError::BadNamespace {
            subsystem: subsystem.to_owned(),
            nsid: self.nsid,
            why,
        };
        if self.nsid == 0 || self.nsid > max_nsid {
            return Err(bad(format!("namespace IDs run from 1 to {max_nsid}")));
        }
        if !matches!(self.block_size, 512 | 1024 | 2048 | 4096) {
            return Err(bad(format!(
                "{}-byte blocks: the target serves 512, 1024, 2048 or 4096-byte blocks",
                self.block_size
            )));
        }
        if self.blocks == 0 || self.blocks.checked_mul(self.block_size as u64).is_none() {
            return Err(bad(format!("a size of {} blocks cannot be served", self.blocks)));
        }
        if !valid_group(self.ana_group) {
            return Err(bad(format!(
                "ANA group {}: ANA group IDs run from 1 to {ANAGRPMAX}",
                self.ana_group
            )));
        }
        if self.nguid == [0; 16] && self.uuid == [0; 16] && self.eui64 == [0; 8] {
            return Err(bad(
                "it has no identifier (NGUID, UUID or EUI-64): derive them with NamespaceIds::derive".into(),
            ));
        }
        Ok(())
    }
}

/// An NVM subsystem the target exposes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subsystem {
    /// The subsystem's NQN.
    pub nqn: String,
    /// Serial Number (Identify Controller SN, up to 20 printable ASCII characters).
    pub serial: String,
    /// Model Number (MN, up to 40 printable ASCII characters).
    pub model: String,
    /// Firmware Revision (FR, up to 8 printable ASCII characters).
    pub firmware: String,
    /// Namespaces, any order.
    pub namespaces: Vec<NamespaceInfo>,
    /// Host NQNs that may connect; `None`: any host.
    pub allowed_hosts: Option<Vec<String>>,
    /// Rate limits per host and per namespace (none by default).
    pub limits: super::qos::Limits,
    /// Hosts that must authenticate with DH-HMAC-CHAP, by host NQN, with their secrets (none
    /// by default). Other hosts the subsystem allows connect without authentication: restrict
    /// them with [`Subsystem::allowed_hosts`].
    pub host_auth: std::collections::BTreeMap<String, std::sync::Arc<crate::auth::HostAuth>>,
}

impl Subsystem {
    /// A subsystem named `nqn` with a serial number derived from it (stable across restarts),
    /// model "vfpoll", this crate's version as firmware, no namespaces, any host allowed.
    pub fn new(nqn: &str) -> Self {
        Subsystem {
            nqn: nqn.to_owned(),
            serial: Subsystem::derived_serial(nqn),
            model: "vfpoll".to_owned(),
            firmware: crate_firmware(),
            namespaces: Vec::new(),
            allowed_hosts: None,
            limits: super::qos::Limits::default(),
            host_auth: Default::default(),
        }
    }

    /// A 20-character serial number derived from `nqn`: "VF" and 18 hexadecimal digits.
    pub fn derived_serial(nqn: &str) -> String {
        let h = fnv1a128(&[b"vfpoll-nvmf serial", nqn.as_bytes()]);
        let mut s = String::from("VF");
        for b in &h[..9] {
            s.push_str(&format!("{b:02X}"));
        }
        s
    }

    /// Whether `hostnqn` may connect.
    pub fn host_allowed(&self, hostnqn: &str) -> bool {
        match &self.allowed_hosts {
            None => true,
            Some(hosts) => hosts.iter().any(|h| h == hostnqn),
        }
    }

    /// The NN this subsystem reports: the largest namespace ID it may hold.
    pub(crate) fn max_nsid(&self) -> u32 {
        self.namespaces
            .iter()
            .map(|n| n.nsid)
            .max()
            .unwrap_or(0)
            .clamp(DEFAULT_MAX_NSID, u32::MAX - 1)
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        validate_nqn(&self.nqn)?;
        if self.nqn == DISCOVERY_NQN {
            return Err(ConfigError::DiscoveryNqn);
        }
        ascii_field("serial number", &self.serial, 20)?;
        ascii_field("model number", &self.model, 40)?;
        ascii_field("firmware revision", &self.firmware, 8)?;
        if let Some(hosts) = &self.allowed_hosts {
            for h in hosts {
                validate_nqn(h)?;
            }
        }
        for h in self.host_auth.keys() {
            validate_nqn(h)?;
        }
        let max = self.max_nsid();
        let mut seen = std::collections::BTreeSet::new();
        for ns in &self.namespaces {
            ns.validate(&self.nqn, max)?;
            if !seen.insert(ns.nsid) {
                return Err(ConfigError::BadNamespace {
                    subsystem: self.nqn.clone(),
                    nsid: ns.nsid,
                    why: "the namespace ID is used twice".into(),
                });
            }
        }
        Ok(())
    }
}

/// This crate's version, as a firmware revision (8 characters at most).
pub(crate) fn crate_firmware() -> String {
    let mut firmware = env!("CARGO_PKG_VERSION").to_owned();
    firmware.truncate(8);
    firmware
}

fn ascii_field(field: &'static str, value: &str, max: usize) -> Result<(), ConfigError> {
    let why = if value.trim().is_empty() {
        "it is empty"
    } else if value.len() > max {
        match max {
            20 => "it is longer than 20 characters",
            40 => "it is longer than 40 characters",
            _ => "it is longer than 8 characters",
        }
    } else if !value.bytes().all(|c| (0x20..0x7f).contains(&c)) {
        "it has characters other than printable ASCII"
    } else {
        return Ok(());
    };
    Err(ConfigError::BadField {
        field,
        value: value.to_owned(),
        why,
    })
}

/// Address family of a listener (ADRFAM of the discovery log entry; NVMe-oF 1.1 Discovery
/// Log Page Entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdrFam {
    /// IPv4 (1).
    Ipv4 = 1,
    /// IPv6 (2).
    Ipv6 = 2,
}

/// A TCP listener of the target, as the discovery log names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    /// NVM subsystem port ID (PORTID), unique on the target.
    pub portid: u16,
    /// Transport address (TRADDR): the IP address as text. `0.0.0.0` and `::` (all
    /// addresses) are reported as the address the host connected to.
    pub traddr: String,
    /// Transport service ID (TRSVCID): the TCP port as text.
    pub trsvcid: String,
    /// Address family.
    pub adrfam: AdrFam,
    /// ANA states of this port by ANA group ID (NVMe Base 2.0 §8.1.3): what controllers
    /// connected through the port report for the namespaces of each group. Groups not named
    /// are Optimized. [`Target::set_ana_state`](super::Target::set_ana_state) changes them
    /// at run time (and keeps this map up to date in [`Target::listeners`](super::Target::listeners)).
    pub ana: BTreeMap<u32, AnaState>,
}

impl Listener {
    /// The listener on `addr` with port ID `portid`, every ANA group Optimized.
    pub fn tcp(portid: u16, addr: SocketAddr) -> Self {
        Listener {
            portid,
            traddr: addr.ip().to_string(),
            trsvcid: addr.port().to_string(),
            adrfam: if addr.is_ipv4() {
                AdrFam::Ipv4
            } else {
                AdrFam::Ipv6
            },
            ana: BTreeMap::new(),
        }
    }

    /// This listener with ANA group `group` in `state` (e.g. a second path to a subsystem,
    /// [`AnaState::NonOptimized`]).
    pub fn with_ana(mut self, group: u32, state: AnaState) -> Self {
        self.ana.insert(group, state);
        self
    }

    /// Whether the listener accepts on every address (its discovery entries name the address
    /// the host used instead).
    pub fn is_wildcard(&self) -> bool {
        matches!(self.traddr.as_str(), "0.0.0.0" | "::" | "[::]")
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let bad = |why| ConfigError::BadListener {
            what: format!("port {} at {}:{}", self.portid, self.traddr, self.trsvcid),
            why,
        };
        if self.traddr.is_empty() || self.traddr.len() > 255 || !self.traddr.is_ascii() {
            return Err(bad("TRADDR must be 1 to 255 ASCII characters"));
        }
        if self.trsvcid.is_empty() || self.trsvcid.len() > 31 || !self.trsvcid.is_ascii() {
            return Err(bad("TRSVCID must be 1 to 31 ASCII characters"));
        }
        if !self.ana.keys().all(|&g| valid_group(g)) {
            return Err(bad("ANA group IDs run from 1 to 128"));
        }
        Ok(())
    }
}

/// Limits every I/O controller of the target reports and enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetOptions {
    /// I/O queues a controller may have (Number of Queues feature; default 64).
    pub max_io_queues: u16,
    /// Entries of an I/O submission queue at most (CAP.MQES + 1, MAXCMD; default 128, as
    /// Linux's default queue size).
    pub max_queue_entries: u32,
    /// In-capsule data an I/O queue accepts in bytes (IOCCSZ = 4 + this / 16; default 8192:
    /// writes of up to 8 KiB need no R2T round trip). A multiple of 16.
    pub in_capsule_data: u32,
    /// The largest transfer of one command in bytes (MDTS; default 1 MiB): a power of two, at
    /// least 8 KiB (MDTS 0 means no limit, so 4 KiB cannot be reported). Bounds the memory a
    /// command can make the target hold.
    pub max_transfer: u32,
}

impl Default for TargetOptions {
    fn default() -> Self {
        TargetOptions {
            max_io_queues: 64,
            max_queue_entries: 128,
            in_capsule_data: 8192,
            max_transfer: 1 << 20,
        }
    }
}

impl TargetOptions {
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let bad = |option, value: u64, why| Err(ConfigError::BadOption { option, value, why });
        if !(1..=1024).contains(&self.max_io_queues) {
            return bad("max_io_queues", self.max_io_queues.into(), "1 to 1024");
        }
        if !(2..=65536).contains(&self.max_queue_entries) {
            return bad("max_queue_entries", self.max_queue_entries.into(), "2 to 65536");
        }
        if !self.in_capsule_data.is_multiple_of(16) || self.in_capsule_data > 1 << 20 {
            return bad(
                "in_capsule_data",
                self.in_capsule_data.into(),
                "a multiple of 16 up to 1 MiB",
            );
        }
        // MDTS counts 4 KiB pages as a power of two, and 0 means "no limit": 8 KiB is the
        // smallest limit a host can be told (NVMe Base 2.0, Identify Controller, MDTS).
        if !self.max_transfer.is_power_of_two() || !(8192..=1 << 30).contains(&self.max_transfer) {
            return bad(
                "max_transfer",
                self.max_transfer.into(),
                "a power of two from 8 KiB (MDTS cannot say 4 KiB: 0 means no limit) to 1 GiB",
            );
        }
        Ok(())
    }

    /// MDTS as Identify Controller reports it: log2 of the maximum transfer in units of the
    /// minimum memory page size (CAP.MPSMIN = 4 KiB).
    pub(crate) fn mdts(&self) -> u8 {
        (self.max_transfer.trailing_zeros() - 12) as u8
    }

    /// IOCCSZ: the I/O command capsule in 16-byte units, the 64-byte SQE included.
    pub(crate) fn ioccsz(&self) -> u32 {
        4 + self.in_capsule_data / 16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nqns_are_checked_against_both_forms() {
        for good in [
            DISCOVERY_NQN,
            "nqn.2014-08.org.nvmexpress:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf6",
            "nqn.2024-01.io.vfpoll:appliance-1",
            "nqn.2019-08.org.qemu:x",
            "nqn.2016-06.io.spdk:cnode1",
        ] {
            assert_eq!(validate_nqn(good), Ok(()), "{good}");
        }
        for (bad, why) in [
            ("", "1 to 223"),
            ("iqn.2024-01.io.vfpoll:x", "does not start"),
            ("nqn.24-01.io.vfpoll:x", "year and month"),
            ("nqn.2024-13.io.vfpoll:x", "year and month"),
            ("nqn.2024-01.:x", "reversed domain"),
            ("nqn.2024-01.io..vfpoll", "reversed domain"),
            ("nqn.2014-08.org.nvmexpress:uuid:not-a-uuid", "UUID"),
        ] {
            match validate_nqn(bad) {
                Err(ConfigError::BadNqn { why: w, .. }) => assert!(w.contains(why), "{bad}: {w}"),
                r => panic!("{bad}: {r:?}"),
            }
        }
        let long = format!("nqn.2024-01.io.vfpoll:{}", "x".repeat(NQN_MAX));
        assert!(validate_nqn(&long).is_err());
        let max = format!("nqn.2024-01.io.vfpoll:{}", "x".repeat(NQN_MAX - 22));
        assert_eq!(max.len(), NQN_MAX);
        assert_eq!(validate_nqn(&max), Ok(()));
    }

    #[test]
    fn identifiers_are_stable_and_distinct() {
        let a = NamespaceIds::derive("nqn.2024-01.io.vfpoll:a", 1, "malloc:0");
        // A fixed function: these bytes must not change between builds or toolchains.
        assert_eq!(a, NamespaceIds::derive("nqn.2024-01.io.vfpoll:a", 1, "malloc:0"));
        assert_eq!(
            fnv1a128(&[]),
            0x6c62_272e_07bb_0142_62b8_2175_6295_c58du128.to_be_bytes()
        );
        let others = [
            NamespaceIds::derive("nqn.2024-01.io.vfpoll:b", 1, "malloc:0"),
            NamespaceIds::derive("nqn.2024-01.io.vfpoll:a", 2, "malloc:0"),
            NamespaceIds::derive("nqn.2024-01.io.vfpoll:a", 1, "malloc:1"),
        ];
        for o in others {
            assert_ne!(a.nguid, o.nguid);
            assert_ne!(a.uuid, o.uuid);
            assert_ne!(a.eui64, o.eui64);
        }
        assert_eq!(a.uuid[6] >> 4, 8, "UUID version 8");
        assert_eq!(a.uuid[8] >> 6, 0b10, "RFC 9562 variant");
        assert_eq!(a.eui64[0] & 3, 2, "unicast, locally administered");
        let s = Subsystem::derived_serial("nqn.2024-01.io.vfpoll:a");
        assert_eq!(s.len(), 20);
        assert_eq!(s, Subsystem::derived_serial("nqn.2024-01.io.vfpoll:a"));
        assert_ne!(s, Subsystem::derived_serial("nqn.2024-01.io.vfpoll:b"));
    }

    #[test]
    fn subsystems_and_options_are_validated() {
        let mut s = Subsystem::new("nqn.2024-01.io.vfpoll:a");
        assert_eq!(s.validate(), Ok(()));
        assert_eq!(s.max_nsid(), DEFAULT_MAX_NSID);
        s.namespaces
            .push(NamespaceInfo::new(&s.nqn, 5000, "malloc:0", 512, 8));
        assert_eq!(s.max_nsid(), 5000);
        s.namespaces
            .push(NamespaceInfo::new(&s.nqn, 5000, "malloc:1", 512, 8));
        assert!(matches!(
            s.validate(),
            Err(ConfigError::BadNamespace { nsid: 5000, .. })
        ));
        s.namespaces.pop();
        s.serial = "x".repeat(21);
        assert!(s.validate().unwrap_err().to_string().contains("20 characters"));
        let d = Subsystem::new(DISCOVERY_NQN);
        assert_eq!(d.validate(), Err(ConfigError::DiscoveryNqn));
        let mut h = Subsystem::new("nqn.2024-01.io.vfpoll:a");
        h.allowed_hosts = Some(vec![
            "nqn.2014-08.org.nvmexpress:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf6".into(),
        ]);
        assert!(h.host_allowed("nqn.2014-08.org.nvmexpress:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf6"));
        assert!(!h.host_allowed("nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000000"));
        let o = TargetOptions::default();
        assert_eq!((o.mdts(), o.ioccsz()), (8, 4 + 512));
        for max_transfer in [3 << 12, 4096, 2 << 30] {
            let bad = TargetOptions { max_transfer, ..o };
            assert!(bad.validate().is_err(), "{max_transfer}");
        }
        let small = TargetOptions {
            max_transfer: 8192,
            ..o
        };
        assert_eq!((small.validate(), small.mdts()), (Ok(()), 1));
        let l = Listener::tcp(1, "[::]:4420".parse().unwrap());
        assert_eq!(
            (l.adrfam, l.traddr.as_str(), l.trsvcid.as_str()),
            (AdrFam::Ipv6, "::", "4420")
        );
        assert!(l.is_wildcard());
    }
}
