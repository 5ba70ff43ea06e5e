//! Zoned namespaces (NVMe Zoned Namespace Command Set 1.1, command set identifier 02h): the
//! Identify data, zone reports, and the zone management and append commands.
//!
//! A zoned namespace is divided into zones of a fixed size; each zone is written sequentially
//! at its write pointer (or appended to, the controller choosing the LBA), can be opened,
//! closed, finished and reset, and at most a number of zones may be open or active at once.
//! The I/O side lives in [`crate::QueuePair`] (`report_zones`, `zone_action`, `zone_append`).

use core::fmt;

/// The Zoned Namespace command set identifier (CSI).
pub const CSI_ZONED: u8 = 0x02;
/// The NVM command set identifier.
pub const CSI_NVM: u8 = 0x00;

/// Zoned I/O opcodes (ZNS 1.1 Figure 17).
pub mod op {
    /// Zone Management Send.
    pub const ZONE_MGMT_SEND: u8 = 0x79;
    /// Zone Management Receive.
    pub const ZONE_MGMT_RECV: u8 = 0x7a;
    /// Zone Append.
    pub const ZONE_APPEND: u8 = 0x7d;
}

fn le16(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn le32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}
fn le64(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
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
}

/// The zoned command set's Identify Controller (CNS 06h, CSI 02h): the Zone Append Size
/// Limit, as a power of two of CAP.MPSMIN (0: MDTS applies).
pub fn parse_zasl(b: &[u8]) -> u8 {
    b[0]
}

/// A zone's state (ZNS 1.1 §2.1.1, Figure 37).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

impl ZoneState {
    /// From the ZS field (byte 1 bits 7:4 of a zone descriptor).
    pub const fn from_bits(v: u8) -> Self {
        match v {
            0x1 => ZoneState::Empty,
            0x2 => ZoneState::ImplicitlyOpened,
            0x3 => ZoneState::ExplicitlyOpened,
            0x4 => ZoneState::Closed,
            0xd => ZoneState::ReadOnly,
            0xe => ZoneState::Full,
            0xf => ZoneState::Offline,
            r => ZoneState::Reserved(r),
        }
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
    pub fn remaining(&self) -> u64 {
        if self.state.writable() {
            (self.start + self.capacity).saturating_sub(self.write_pointer)
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
    Close = 0x1,
    /// Finish Zone.
    Finish = 0x2,
    /// Open Zone.
    Open = 0x3,
    /// Reset Zone.
    Reset = 0x4,
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
}
