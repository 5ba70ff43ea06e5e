//! Zoned namespaces (NVMe Zoned Namespace Command Set 1.1, command set identifier 02h): the
//! Identify data, zone reports, and the zone management and append commands.
//!
//! A zoned namespace is divided into zones of a fixed size; each zone is written sequentially
//! at its write pointer (or appended to, the controller choosing the LBA), can be opened,
//! closed, finished and reset, and at most a number of zones may be open or active at once.
//! This module holds the data layouts; the driver's I/O side is `vfpoll_nvme::QueuePair`'s
//! `report_zones`, `zone_action` and `zone_append`.

use core::fmt;

use crate::bytes::{le16, le32, le64};

/// The Zoned Namespace command set identifier (CSI).
pub const CSI_ZONED: u8 = 0x02;
/// The NVM command set identifier.
pub const CSI_NVM: u8 = 0x00;

/// Zoned I/O opcodes (ZNS 1.1 Figure 17), from the one opcode table ([`crate::cmd::io_op`]).
pub mod op {
    pub use crate::cmd::io_op::{ZONE_APPEND, ZONE_MGMT_RECV, ZONE_MGMT_SEND};
}

/// The zoned command set's Identify Namespace (CNS 05h, CSI 02h; ZNS 1.1 Figure 49).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdentifyZonedNamespace {
    /// Zone Operation Characteristics (bit 0: variable zone capacity, bit 1: zone active
    /// excursions).
    pub zoc: u16,
    /// Optional Zoned Command Support (bit 0: read across zone boundaries).
    pub ozcs: u16,
    /// Maximum Active Resources (0's based; `u32::MAX`: no limit).
    pub mar: u32,
    /// Maximum Open Resources (0's based; `u32::MAX`: no limit).
    pub mor: u32,
    /// Zone size in logical blocks of the LBA format in use (ZSZE of its LBAFE).
    pub zone_size: u64,
    /// Zone descriptor extension size in bytes (ZDES × 64).
    pub zone_ext_size: usize,
}

impl IdentifyZonedNamespace {
    /// Parses the 4096-byte page for LBA format `format_index`; `None` if the page names no
    /// zone size for it.
    pub fn parse(b: &[u8], format_index: u8) -> Option<Self> {
        assert!(b.len() >= 4096, "an Identify page is 4096 bytes");
        let lbafe = 2816 + 16 * format_index as usize;
        if lbafe + 16 > 3840 {
            return None;
        }
        let zone_size = le64(b, lbafe);
        (zone_size != 0).then(|| IdentifyZonedNamespace {
            zoc: le16(b, 0),
            ozcs: le16(b, 2),
            mar: le32(b, 4),
            mor: le32(b, 8),
            zone_size,
            zone_ext_size: b[lbafe + 8] as usize * 64,
        })
    }

    /// Zones that may be active at once (`None`: no limit).
    pub fn max_active(&self) -> Option<u32> {
        (self.mar != u32::MAX).then(|| self.mar + 1)
    }

    /// Zones that may be open at once (`None`: no limit).
    pub fn max_open(&self) -> Option<u32> {
        (self.mor != u32::MAX).then(|| self.mor + 1)
    }

    /// Whether reads may cross zone boundaries (OZCS bit 0).
    pub fn read_across_zones(&self) -> bool {
        self.ozcs & 1 != 0
    }

    /// Variable Zone Capacity (ZOC bit 0; ZNS 1.1 Figure 49): a zone's capacity may change when
    /// the zone is reset, so it is read from a zone report, never assumed.
    pub fn variable_capacity(&self) -> bool {
        self.zoc & 1 != 0
    }

    /// Zone Active Excursions (ZOC bit 1): the controller may finish an active zone on its own.
    pub fn active_excursions(&self) -> bool {
        self.zoc & 2 != 0
    }
}

/// The zoned command set's Identify Controller (CNS 06h, CSI 02h): the Zone Append Size
/// Limit, as a power of two of CAP.MPSMIN (0: MDTS applies).
pub fn parse_zasl(b: &[u8]) -> u8 {
    b[0]
}

/// A zone's state (ZNS 1.1 §2.1.1, Figure 37).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ZoneState {
    /// ZSE: empty.
    Empty,
    /// ZSIO: implicitly opened.
    ImplicitlyOpened,
    /// ZSEO: explicitly opened.
    ExplicitlyOpened,
    /// ZSC: closed.
    Closed,
    /// ZSRO: read only.
    ReadOnly,
    /// ZSF: full.
    Full,
    /// ZSO: offline.
    Offline,
    /// A reserved value.
    Reserved(u8),
}

/// Zone State codes (ZNS 1.1 Figure 37: byte 1 bits 7:4 of a zone descriptor).
pub mod state {
    /// ZSE: empty.
    pub const EMPTY: u8 = 0x1;
    /// ZSIO: implicitly opened.
    pub const IMPLICITLY_OPENED: u8 = 0x2;
    /// ZSEO: explicitly opened.
    pub const EXPLICITLY_OPENED: u8 = 0x3;
    /// ZSC: closed.
    pub const CLOSED: u8 = 0x4;
    /// ZSRO: read only.
    pub const READ_ONLY: u8 = 0xd;
    /// ZSF: full.
    pub const FULL: u8 = 0xe;
    /// ZSO: offline.
    pub const OFFLINE: u8 = 0xf;
}

/// Zone Send Action codes (ZNS 1.1 Figure 32, Zone Management Send CDW13 bits 7:0).
pub mod send_action {
    /// Close Zone.
    pub const CLOSE: u8 = 0x01;
    /// Finish Zone.
    pub const FINISH: u8 = 0x02;
    /// Open Zone.
    pub const OPEN: u8 = 0x03;
    /// Reset Zone.
    pub const RESET: u8 = 0x04;
    /// Offline Zone.
    pub const OFFLINE: u8 = 0x05;
    /// Set Zone Descriptor Extension.
    pub const SET_ZDE: u8 = 0x10;
}

impl ZoneState {
    /// From the ZS field (byte 1 bits 7:4 of a zone descriptor).
    pub const fn from_bits(v: u8) -> Self {
        match v {
            state::EMPTY => ZoneState::Empty,
            state::IMPLICITLY_OPENED => ZoneState::ImplicitlyOpened,
            state::EXPLICITLY_OPENED => ZoneState::ExplicitlyOpened,
            state::CLOSED => ZoneState::Closed,
            state::READ_ONLY => ZoneState::ReadOnly,
            state::FULL => ZoneState::Full,
            state::OFFLINE => ZoneState::Offline,
            r => ZoneState::Reserved(r),
        }
    }

    /// The ZS field's code (the inverse of [`ZoneState::from_bits`]).
    pub const fn code(self) -> u8 {
        match self {
            ZoneState::Empty => state::EMPTY,
            ZoneState::ImplicitlyOpened => state::IMPLICITLY_OPENED,
            ZoneState::ExplicitlyOpened => state::EXPLICITLY_OPENED,
            ZoneState::Closed => state::CLOSED,
            ZoneState::ReadOnly => state::READ_ONLY,
            ZoneState::Full => state::FULL,
            ZoneState::Offline => state::OFFLINE,
            ZoneState::Reserved(v) => v,
        }
    }

    /// Implicitly or explicitly opened (ZNS 1.1 §2.1.1.3, §2.1.1.4): holds an open resource.
    pub const fn is_open(self) -> bool {
        matches!(self, ZoneState::ImplicitlyOpened | ZoneState::ExplicitlyOpened)
    }

    /// Open or closed (ZNS 1.1 §2.1.1.2): holds an active resource.
    pub const fn is_active(self) -> bool {
        self.is_open() || matches!(self, ZoneState::Closed)
    }

    /// Whether the zone can be written at its write pointer now (resources permitting).
    pub const fn writable(self) -> bool {
        matches!(
            self,
            ZoneState::Empty | ZoneState::ImplicitlyOpened | ZoneState::ExplicitlyOpened | ZoneState::Closed
        )
    }
}

impl fmt::Display for ZoneState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ZoneState::Empty => f.write_str("empty"),
            ZoneState::ImplicitlyOpened => f.write_str("implicitly opened"),
            ZoneState::ExplicitlyOpened => f.write_str("explicitly opened"),
            ZoneState::Closed => f.write_str("closed"),
            ZoneState::ReadOnly => f.write_str("read only"),
            ZoneState::Full => f.write_str("full"),
            ZoneState::Offline => f.write_str("offline"),
            ZoneState::Reserved(v) => write!(f, "reserved state {v:#x}"),
        }
    }
}

/// One zone descriptor of a zone report (ZNS 1.1 Figure 37).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Zone {
    /// Zone type (2: sequential write required).
    pub zone_type: u8,
    /// State.
    pub state: ZoneState,
    /// Zone attributes.
    pub attributes: u8,
    /// Zone capacity: writable blocks from the start (at most the zone size).
    pub capacity: u64,
    /// Zone start LBA.
    pub start: u64,
    /// Write pointer.
    pub write_pointer: u64,
}

/// Size of a zone report's header and of each zone descriptor.
pub const ZONE_DESCRIPTOR_BYTES: usize = 64;

impl Zone {
    /// Parses one 64-byte descriptor.
    pub fn parse(b: &[u8]) -> Self {
        Zone {
            zone_type: b[0] & 0xf,
            state: ZoneState::from_bits(b[1] >> 4),
            attributes: b[2],
            capacity: le64(b, 8),
            start: le64(b, 16),
            write_pointer: le64(b, 24),
        }
    }

    /// Blocks still writable at the write pointer (0 for a zone that cannot be written).
    /// Saturating: the descriptor comes from the controller and may hold any values.
    pub fn remaining(&self) -> u64 {
        if self.state.writable() {
            self.start
                .saturating_add(self.capacity)
                .saturating_sub(self.write_pointer)
        } else {
            0
        }
    }
}

/// Parses a Report Zones buffer (ZNS 1.1 Figure 36): the header's zone count, then as many
/// descriptors (of `64 + ext` bytes each) as both it and the buffer hold.
pub fn parse_report(b: &[u8], ext: usize) -> (u64, Vec<Zone>) {
    if b.len() < ZONE_DESCRIPTOR_BYTES {
        return (0, Vec::new());
    }
    let count = le64(b, 0);
    let per = ZONE_DESCRIPTOR_BYTES + ext;
    let zones = b[ZONE_DESCRIPTOR_BYTES..]
        .chunks_exact(per)
        .take(count.min(usize::MAX as u64) as usize)
        .map(Zone::parse)
        .collect();
    (count, zones)
}

/// Zone Send Actions (ZNS 1.1 Figure 32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZoneAction {
    /// Close Zone.
    Close = send_action::CLOSE as isize,
    /// Finish Zone.
    Finish = send_action::FINISH as isize,
    /// Open Zone.
    Open = send_action::OPEN as isize,
    /// Reset Zone.
    Reset = send_action::RESET as isize,
}

impl ZoneAction {
    /// The spec's name of the command it makes.
    pub const fn name(self) -> &'static str {
        match self {
            ZoneAction::Close => "Zone Management Send (Close Zone)",
            ZoneAction::Finish => "Zone Management Send (Finish Zone)",
            ZoneAction::Open => "Zone Management Send (Open Zone)",
            ZoneAction::Reset => "Zone Management Send (Reset Zone)",
        }
    }
}

/// Which zones a report lists (Zone Receive Action Specific Field, ZNS 1.1 Figure 35).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ZoneFilter {
    /// Every zone.
    #[default]
    All = 0x0,
    /// Empty zones.
    Empty = 0x1,
    /// Implicitly opened zones.
    ImplicitlyOpened = 0x2,
    /// Explicitly opened zones.
    ExplicitlyOpened = 0x3,
    /// Closed zones.
    Closed = 0x4,
    /// Full zones.
    Full = 0x5,
    /// Read-only zones.
    ReadOnly = 0x6,
    /// Offline zones.
    Offline = 0x7,
}

/// What vfpoll knows of a zoned namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZonedInfo {
    /// The command set's Identify Namespace.
    pub identify: IdentifyZonedNamespace,
    /// Zone Append Size Limit in bytes (`None`: MDTS applies).
    pub zasl_bytes: Option<usize>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_zoned_identify_page() {
        let mut b = vec![0u8; 4096];
        b[0..2].copy_from_slice(&1u16.to_le_bytes());
        b[4..8].copy_from_slice(&13u32.to_le_bytes());
        b[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        // LBAFE 1: 4096-block zones, 2 x 64 bytes of extension.
        b[2816 + 16..2816 + 24].copy_from_slice(&4096u64.to_le_bytes());
        b[2816 + 24] = 2;
        assert!(IdentifyZonedNamespace::parse(&b, 0).is_none());
        let z = IdentifyZonedNamespace::parse(&b, 1).unwrap();
        assert_eq!((z.zone_size, z.zone_ext_size, z.zoc), (4096, 128, 1));
        assert_eq!((z.max_active(), z.max_open()), (Some(14), None));
        assert!(z.variable_capacity() && !z.active_excursions());
        b[0] = 2;
        let z = IdentifyZonedNamespace::parse(&b, 1).unwrap();
        assert!(!z.variable_capacity() && z.active_excursions());
        assert!(IdentifyZonedNamespace::parse(&b, 63).is_none());
    }

    #[test]
    fn parses_a_zone_report() {
        let mut b = vec![0u8; 64 * 4];
        b[0..8].copy_from_slice(&5u64.to_le_bytes()); // more zones than the buffer holds
        for (i, (state, wp)) in [(0x1u8, 0u64), (0x2, 4100), (0xe, 8192)].iter().enumerate() {
            let d = &mut b[64 * (i + 1)..64 * (i + 2)];
            d[0] = 2;
            d[1] = state << 4;
            d[8..16].copy_from_slice(&4000u64.to_le_bytes());
            d[16..24].copy_from_slice(&(4096 * i as u64).to_le_bytes());
            d[24..32].copy_from_slice(&wp.to_le_bytes());
        }
        let (n, z) = parse_report(&b, 0);
        assert_eq!((n, z.len()), (5, 3));
        assert_eq!(z[0].state, ZoneState::Empty);
        assert_eq!(z[0].remaining(), 4000);
        assert_eq!(
            (z[1].state, z[1].start, z[1].remaining()),
            (ZoneState::ImplicitlyOpened, 4096, 3996)
        );
        assert_eq!((z[2].state, z[2].remaining()), (ZoneState::Full, 0));
        assert_eq!(z[2].state.to_string(), "full");
        // A header that claims fewer zones than the buffer holds.
        b[0..8].copy_from_slice(&1u64.to_le_bytes());
        assert_eq!(parse_report(&b, 0).1.len(), 1);
        assert_eq!(parse_report(&b[..10], 0), (0, vec![]));
    }

    /// Property tests: the zoned Identify page and zone reports from any bytes, and built from
    /// random values. 256 cases per property (see [`crate::proptest_support`]).
    mod props {
        use super::*;
        use crate::proptest_support::{config, page};
        use proptest::prelude::*;

        /// A zone descriptor's fields, and noise for its reserved bits and bytes.
        fn zone() -> impl Strategy<Value = (Zone, [u8; 64])> {
            (0u8..16, 0u8..16, any::<(u8, u64, u64, u64)>(), any::<[u8; 64]>()).prop_map(
                |(zone_type, zs, (attributes, capacity, start, write_pointer), noise)| {
                    let z = Zone {
                        zone_type,
                        state: ZoneState::from_bits(zs),
                        attributes,
                        capacity,
                        start,
                        write_pointer,
                    };
                    (z, noise)
                },
            )
        }

        /// The 64-byte descriptor of `z` (ZNS 1.1 Figure 37) over `noise`.
        fn encode_zone(z: &Zone, noise: &[u8; 64]) -> [u8; 64] {
            let mut d = *noise;
            let zs = match z.state {
                ZoneState::Empty => 0x1,
                ZoneState::ImplicitlyOpened => 0x2,
                ZoneState::ExplicitlyOpened => 0x3,
                ZoneState::Closed => 0x4,
                ZoneState::ReadOnly => 0xd,
                ZoneState::Full => 0xe,
                ZoneState::Offline => 0xf,
                ZoneState::Reserved(v) => v,
            };
            // Bits 7:4 of byte 0 and 3:0 of byte 1 are reserved: left as noise.
            d[0] = d[0] & 0xf0 | z.zone_type;
            d[1] = d[1] & 0x0f | zs << 4;
            d[2] = z.attributes;
            d[8..16].copy_from_slice(&z.capacity.to_le_bytes());
            d[16..24].copy_from_slice(&z.start.to_le_bytes());
            d[24..32].copy_from_slice(&z.write_pointer.to_le_bytes());
            d
        }

        /// Found by `any_zone_report_parses`: a writable zone whose start plus capacity
        /// passes `u64::MAX` made `remaining` overflow (a panic in debug builds).
        #[test]
        fn remaining_of_a_garbage_descriptor_saturates() {
            let z = Zone {
                zone_type: 2,
                state: ZoneState::Empty,
                attributes: 0,
                capacity: 1,
                start: u64::MAX,
                write_pointer: 0,
            };
            assert_eq!(z.remaining(), u64::MAX);
        }

        proptest! {
            #![proptest_config(config(256))]

            /// Any page and any format index: `None` past the 64 LBA format extensions or for
            /// a zone size of 0, the fields of the page otherwise; the limits never overflow.
            #[test]
            fn any_zoned_identify_page_parses(b in page(), index in any::<u8>()) {
                let z = IdentifyZonedNamespace::parse(&b, index);
                prop_assert_eq!(z, IdentifyZonedNamespace::parse(&b[..4096], index));
                if index >= 64 {
                    prop_assert!(z.is_none());
                }
                if let Some(z) = z {
                    prop_assert!(z.zone_size != 0);
                    prop_assert!(z.zone_ext_size.is_multiple_of(64) && z.zone_ext_size <= 255 * 64);
                    prop_assert_eq!(z.max_active(), z.mar.checked_add(1));
                    prop_assert_eq!(z.max_open(), z.mor.checked_add(1));
                }
            }

            /// A page built from random values for format `index` parses back to them; the
            /// other formats (zone size 0) have none.
            #[test]
            fn zoned_identify_round_trips(
                (zoc, ozcs, mar, mor) in any::<(u16, u16, u32, u32)>(),
                index in 0u8..64,
                other in 0u8..64,
                zone_size in 1u64..,
                zdes in any::<u8>(),
                mut b in page(),
            ) {
                b[0..2].copy_from_slice(&zoc.to_le_bytes());
                b[2..4].copy_from_slice(&ozcs.to_le_bytes());
                b[4..8].copy_from_slice(&mar.to_le_bytes());
                b[8..12].copy_from_slice(&mor.to_le_bytes());
                let lbafe = 2816 + 16 * index as usize;
                b[lbafe..lbafe + 8].copy_from_slice(&zone_size.to_le_bytes());
                b[lbafe + 8] = zdes;
                if other != index {
                    let o = 2816 + 16 * other as usize;
                    b[o..o + 8].fill(0);
                    prop_assert_eq!(IdentifyZonedNamespace::parse(&b, other), None);
                }
                let zone_ext_size = zdes as usize * 64;
                let want = IdentifyZonedNamespace { zoc, ozcs, mar, mor, zone_size, zone_ext_size };
                prop_assert_eq!(IdentifyZonedNamespace::parse(&b, index), Some(want));
                prop_assert_eq!(want.read_across_zones(), ozcs & 1 != 0);
            }

            /// A report built from random descriptors (with extensions, a header count below,
            /// at or above what the buffer holds, the buffer cut anywhere) parses back to the
            /// descriptors the header counts and the buffer holds whole.
            #[test]
            fn zone_report_round_trips(
                zones in prop::collection::vec(zone(), 0..12),
                zdes in 0usize..4,
                count_delta in -3i64..4,
                cut in 0usize..64 * 4 + 64,
                fill in any::<u8>(),
            ) {
                let ext = zdes * 64;
                let mut b = vec![fill; 64];
                let count = (zones.len() as i64 + count_delta).max(0) as u64;
                b[0..8].copy_from_slice(&count.to_le_bytes());
                for (z, noise) in &zones {
                    b.extend_from_slice(&encode_zone(z, noise));
                    b.extend(std::iter::repeat_n(fill, ext));
                }
                let whole = b.len().saturating_sub(cut).max(if cut % 2 == 0 { 64 } else { 0 });
                let b = &b[..whole.min(b.len())];
                let (n, got) = parse_report(b, ext);
                if b.len() < 64 {
                    prop_assert_eq!((n, got.len()), (0, 0));
                } else {
                    let held = (b.len() - 64) / (64 + ext);
                    let listed = held.min(count as usize);
                    let want: Vec<Zone> = zones.iter().map(|(z, _)| *z).take(listed).collect();
                    prop_assert_eq!(n, count);
                    prop_assert_eq!(got, want);
                }
            }

            /// Any bytes and any extension size: no panic, no more zones than the header
            /// counts or the buffer holds, and what is left to write in a zone is asked for
            /// safely whatever the descriptor says.
            #[test]
            fn any_zone_report_parses(
                b in prop::collection::vec(any::<u8>(), 0..800),
                ext in prop_oneof![0usize..=256, 0usize..=255 * 64],
            ) {
                let (n, zones) = parse_report(&b, ext);
                prop_assert!(zones.len() as u64 <= n);
                prop_assert!(zones.len() <= b.len().saturating_sub(64) / (64 + ext));
                for z in &zones {
                    let left = z.remaining();
                    if !z.state.writable() {
                        prop_assert_eq!(left, 0);
                    } else if z.write_pointer >= z.start {
                        prop_assert!(left <= z.capacity);
                    }
                    let _ = z.state.to_string();
                }
            }

            /// `Zone::parse` reads the descriptor's fields and ignores its reserved bits.
            #[test]
            fn zone_descriptor_round_trips((z, noise) in zone()) {
                prop_assert_eq!(Zone::parse(&encode_zone(&z, &noise)), z);
            }
        }
    }
}
