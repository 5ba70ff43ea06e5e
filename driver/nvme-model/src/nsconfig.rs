//! How a namespace is configured: its LBA formats, the one it is formatted with (metadata
//! placement, protection information), what Format NVM may choose, and zoned geometry.
//!
//! References: NVM Command Set 1.0 §4.1.5.1 (Identify Namespace: NLBAF, FLBAS, MC, DPC, DPS,
//! LBAF), §5.2 and §5.3 (metadata and end-to-end data protection); Zoned Namespace Command
//! Set 1.1 §2.1 (zone model) and §4.1.5.1 (Identify Namespace for the Zoned Namespace Command
//! Set).

use crate::ModelError;

/// Most LBA formats a namespace may list: LBAF0 to LBAF63 (NLBAF is 0's based, FLBAS and Format
/// NVM carry a 6-bit index).
pub const MAX_LBA_FORMATS: usize = 64;

/// One LBA format (NVM Command Set 1.0 §4.1.5.1, LBA Format Data Structure): the data size of a
/// logical block and the metadata bytes that go with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LbaFormat {
    /// Logical block data size in bytes (LBADS): a power of two from 512 to 64 KiB.
    pub data_size: u32,
    /// Metadata bytes per logical block (MS); 0 for none.
    pub metadata_size: u16,
}

impl LbaFormat {
    /// A format of `data_size`-byte blocks with `metadata_size` metadata bytes each.
    pub const fn new(data_size: u32, metadata_size: u16) -> Self {
        LbaFormat {
            data_size,
            metadata_size,
        }
    }

    /// Data and metadata bytes of one block.
    pub const fn block_bytes(self) -> u64 {
        self.data_size as u64 + self.metadata_size as u64
    }
}

/// Protection information type (NVM Command Set 1.0 §5.2.1.1; DPS bits 2:0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PiType {
    /// Type 1: the reference tag is the low 32 bits of the LBA, checked when asked.
    Type1 = 1,
    /// Type 2: the reference tag starts at the command's ILBRT and counts up per block.
    Type2 = 2,
    /// Type 3: the reference tag is opaque (never checked by the model).
    Type3 = 3,
}

impl PiType {
    /// The type for a DPS or Format NVM PI value 1-3.
    pub const fn from_code(code: u8) -> Option<PiType> {
        match code {
            1 => Some(PiType::Type1),
            2 => Some(PiType::Type2),
            3 => Some(PiType::Type3),
            _ => None,
        }
    }
}

/// End-to-end data protection as a namespace is formatted (DPS): the 8-byte protection
/// information tuple (16-bit guard, PIF 00b) in each block's metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Protection {
    /// The protection information type.
    pub pi_type: PiType,
    /// Whether the tuple is the first 8 bytes of the metadata (DPS bit 3, Format NVM PIL = 1);
    /// otherwise it is the last 8 bytes, and the guard also covers the metadata before it.
    pub first: bool,
}

impl Protection {
    /// `pi_type` in the last 8 bytes of the metadata (the usual placement, DIF style).
    pub const fn last(pi_type: PiType) -> Self {
        Protection {
            pi_type,
            first: false,
        }
    }

    /// `pi_type` in the first 8 bytes of the metadata.
    pub const fn first(pi_type: PiType) -> Self {
        Protection { pi_type, first: true }
    }

    /// The DPS byte of Identify Namespace.
    pub const fn dps(self) -> u8 {
        self.pi_type as u8 | (self.first as u8) << 3
    }
}

/// How a namespace is formatted: what Format NVM (NVMe Base 2.0 §5.14) selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NamespaceFormat {
    /// Index into [`NamespaceConfig::formats`] (FLBAS bits 3:0 and 6:5).
    pub index: u8,
    /// Metadata as an extended LBA, at the end of each block in the data buffer (FLBAS bit 4,
    /// MSET); otherwise in a separate buffer at MPTR. Meaningless without metadata.
    pub extended: bool,
    /// Protection information, if any (needs at least 8 metadata bytes).
    pub protection: Option<Protection>,
}

impl NamespaceFormat {
    /// LBA format `index`, separate metadata, no protection information.
    pub const fn new(index: u8) -> Self {
        NamespaceFormat {
            index,
            extended: false,
            protection: None,
        }
    }

    /// The FLBAS byte of Identify Namespace.
    pub const fn flbas(self) -> u8 {
        (self.index & 0xf) | (self.extended as u8) << 4 | (self.index >> 4 & 0x3) << 5
    }
}

/// Which metadata placements Format NVM may choose (Identify Namespace MC).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MetadataCaps {
    /// Extended LBAs (MC bit 0).
    pub extended: bool,
    /// A separate metadata buffer (MC bit 1).
    pub separate: bool,
}

impl MetadataCaps {
    /// Both placements, as QEMU offers.
    pub const BOTH: MetadataCaps = MetadataCaps {
        extended: true,
        separate: true,
    };

    /// The MC byte.
    pub const fn mc(self) -> u8 {
        self.extended as u8 | (self.separate as u8) << 1
    }
}

impl Default for MetadataCaps {
    fn default() -> Self {
        MetadataCaps::BOTH
    }
}

/// Which protection information Format NVM may choose (Identify Namespace DPC).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PiCaps {
    /// Type 1 (DPC bit 0).
    pub type1: bool,
    /// Type 2 (DPC bit 1).
    pub type2: bool,
    /// Type 3 (DPC bit 2).
    pub type3: bool,
    /// PI in the first 8 bytes of metadata (DPC bit 3).
    pub first: bool,
    /// PI in the last 8 bytes of metadata (DPC bit 4).
    pub last: bool,
}

impl PiCaps {
    /// Every type in either place (DPC 1Fh, as QEMU reports).
    pub const ALL: PiCaps = PiCaps {
        type1: true,
        type2: true,
        type3: true,
        first: true,
        last: true,
    };
    /// No end-to-end protection.
    pub const NONE: PiCaps = PiCaps {
        type1: false,
        type2: false,
        type3: false,
        first: false,
        last: false,
    };

    /// The DPC byte.
    pub const fn dpc(self) -> u8 {
        self.type1 as u8
            | (self.type2 as u8) << 1
            | (self.type3 as u8) << 2
            | (self.first as u8) << 3
            | (self.last as u8) << 4
    }

    /// Whether `p` is offered.
    pub const fn allows(self, p: Protection) -> bool {
        let kind = match p.pi_type {
            PiType::Type1 => self.type1,
            PiType::Type2 => self.type2,
            PiType::Type3 => self.type3,
        };
        kind && if p.first { self.first } else { self.last }
    }
}

impl Default for PiCaps {
    fn default() -> Self {
        PiCaps::ALL
    }
}

/// Zoned geometry and limits of a namespace of the Zoned Namespace Command Set (CSI 02h).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ZonedConfig {
    /// Zone size in logical blocks (ZSZE); the namespace is a whole number of zones.
    pub zone_size: u64,
    /// Writable blocks of each zone (ZCAP), 1 ..= `zone_size`.
    pub zone_capacity: u64,
    /// Maximum open zones (MOR + 1); 0 for no limit.
    pub max_open: u32,
    /// Maximum active zones (MAR + 1); 0 for no limit.
    pub max_active: u32,
    /// Read Across Zone Boundaries (OZCS bit 0): reads may span zones.
    pub cross_zone_read: bool,
    /// When opening a zone would exceed `max_open`, close the oldest implicitly opened zone
    /// first (QEMU's `zoned.auto_transition`, on by default there and here).
    pub auto_transition: bool,
}

impl ZonedConfig {
    /// Zones of `zone_size` blocks, all writable, no open or active limit.
    pub const fn new(zone_size: u64) -> Self {
        ZonedConfig {
            zone_size,
            zone_capacity: zone_size,
            max_open: 0,
            max_active: 0,
            cross_zone_read: false,
            auto_transition: true,
        }
    }
}

/// One namespace, held in memory.
///
/// The format it is in is `lba_size` + `metadata_size`, with `extended` and `protection`; the
/// formats Format NVM may choose are `formats` (listed in Identify Namespace in this order), or
/// that one alone if `formats` is empty.
///
/// Its storage is a fixed number of bytes, data and metadata together, as a QEMU namespace is
/// an image of a fixed size: `blocks` blocks of the format it starts in. Another format (Format
/// NVM, [`crate::NvmeModel::change_namespace`]) divides the same bytes into
/// `bytes / (data_size + metadata_size)` blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceConfig {
    /// Namespace ID (1 ..= `0xffff_fffe`).
    pub nsid: u32,
    /// Logical block data size of the format it is in: a power of two from 512 to 64 KiB (512
    /// and 4096 are usual).
    pub lba_size: u32,
    /// Size in logical blocks (NSZE = NCAP = NUSE).
    pub blocks: u64,
    /// Metadata bytes per block of the format it is in (MS).
    pub metadata_size: u16,
    /// Metadata as extended LBAs, at the end of each block in the data buffer (FLBAS bit 4,
    /// MSET); otherwise in a separate buffer at MPTR. Meaningless without metadata.
    pub extended: bool,
    /// Protection information, if any (needs at least 8 metadata bytes).
    pub protection: Option<Protection>,
    /// Every LBA format the namespace supports (1 to 64), the one it is in among them; empty
    /// for that one alone.
    pub formats: Vec<LbaFormat>,
    /// The metadata placements it supports.
    pub metadata_caps: MetadataCaps,
    /// The protection information it supports.
    pub pi_caps: PiCaps,
    /// Zoned geometry: `Some` makes it a namespace of the Zoned Namespace Command Set.
    pub zoned: Option<ZonedConfig>,
}

impl NamespaceConfig {
    /// A namespace of `blocks` blocks of `lba_size` bytes, with one LBA format and no metadata.
    pub fn new(nsid: u32, lba_size: u32, blocks: u64) -> Self {
        NamespaceConfig {
            nsid,
            lba_size,
            blocks,
            metadata_size: 0,
            extended: false,
            protection: None,
            formats: Vec::new(),
            metadata_caps: MetadataCaps::BOTH,
            pi_caps: PiCaps::ALL,
            zoned: None,
        }
    }

    /// With `metadata_size` metadata bytes per block, as extended LBAs or in a separate buffer.
    #[must_use]
    pub fn with_metadata(self, metadata_size: u16, extended: bool) -> Self {
        NamespaceConfig {
            metadata_size,
            extended,
            ..self
        }
    }

    /// Formatted with protection information `p`.
    #[must_use]
    pub fn with_protection(self, p: Protection) -> Self {
        NamespaceConfig {
            protection: Some(p),
            ..self
        }
    }

    /// Listing these LBA formats (the one it is in among them).
    #[must_use]
    pub fn with_formats(self, formats: Vec<LbaFormat>) -> Self {
        NamespaceConfig { formats, ..self }
    }

    /// A zoned namespace.
    #[must_use]
    pub fn zoned(self, z: ZonedConfig) -> Self {
        NamespaceConfig {
            zoned: Some(z),
            ..self
        }
    }

    /// The LBA format it is in.
    pub fn lba_format(&self) -> LbaFormat {
        LbaFormat::new(self.lba_size, self.metadata_size)
    }

    /// The LBA formats Identify Namespace lists.
    pub fn lba_formats(&self) -> Vec<LbaFormat> {
        match self.formats.is_empty() {
            true => vec![self.lba_format()],
            false => self.formats.clone(),
        }
    }

    /// How it is formatted, if its format is among the listed ones.
    pub fn format(&self) -> Option<NamespaceFormat> {
        let index = self.lba_formats().iter().position(|&f| f == self.lba_format())?;
        Some(NamespaceFormat {
            index: index as u8,
            extended: self.extended,
            protection: self.protection,
        })
    }

    /// Size in data bytes.
    pub fn bytes(&self) -> u64 {
        self.blocks * self.lba_size as u64
    }

    /// Checks the configuration, naming the first problem.
    pub(crate) fn validate(&self) -> Result<(), ModelError> {
        let nsid = self.nsid;
        let bad = |why: String| Err(ModelError::Config(format!("namespace {nsid}: {why}")));
        let formats = self.lba_formats();
        if formats.len() > MAX_LBA_FORMATS {
            return bad(format!(
                "{} LBA formats; list at most {MAX_LBA_FORMATS}",
                formats.len()
            ));
        }
        for (i, f) in formats.iter().enumerate() {
            if !f.data_size.is_power_of_two() || !(512..=65536).contains(&f.data_size) {
                return bad(format!(
                    "LBA format {i}: LBA size {} is not a power of two in 512..=65536",
                    f.data_size
                ));
            }
        }
        let Some(format) = self.format() else {
            return bad(format!(
                "its format ({} + {} metadata bytes) is not among its LBA formats",
                self.lba_size, self.metadata_size
            ));
        };
        check_format(self, self.lba_format(), format)
            .map_err(|why| ModelError::Config(format!("namespace {nsid}: {why}")))?;
        let fits = self
            .blocks
            .checked_mul(self.lba_format().block_bytes())
            .is_some_and(|b| b <= isize::MAX as u64);
        if self.blocks == 0 || !fits {
            return bad(format!("{} blocks do not fit in memory", self.blocks));
        }
        if let Some(z) = self.zoned {
            if z.zone_size == 0 || z.zone_capacity == 0 || z.zone_capacity > z.zone_size {
                return bad(format!(
                    "zone capacity {} is not in 1..=zone size {}",
                    z.zone_capacity, z.zone_size
                ));
            }
            if !self.blocks.is_multiple_of(z.zone_size) {
                return bad(format!(
                    "{} blocks are not a whole number of {}-block zones",
                    self.blocks, z.zone_size
                ));
            }
            if z.max_open != 0 && z.max_active != 0 && z.max_open > z.max_active {
                return bad(format!(
                    "max_open {} is over max_active {}",
                    z.max_open, z.max_active
                ));
            }
        }
        Ok(())
    }
}

/// Whether `f` (with LBA format `lbaf`) is a format the namespace offers: the placement in
/// MC and the protection in DPC, with room for the 8-byte tuple.
pub(crate) fn check_format(ns: &NamespaceConfig, lbaf: LbaFormat, f: NamespaceFormat) -> Result<(), String> {
    if lbaf.metadata_size > 0 {
        let (ok, what) = match f.extended {
            true => (ns.metadata_caps.extended, "extended LBAs"),
            false => (ns.metadata_caps.separate, "a separate metadata buffer"),
        };
        if !ok {
            return Err(format!("metadata as {what} is not in its metadata capabilities"));
        }
    }
    if let Some(p) = f.protection {
        if lbaf.metadata_size < 8 {
            return Err(format!(
                "protection information needs 8 metadata bytes, the format has {}",
                lbaf.metadata_size
            ));
        }
        if !ns.pi_caps.allows(p) {
            return Err(format!("{p:?} is not in its protection capabilities"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identify_bytes() {
        let f = NamespaceFormat {
            index: 0x25,
            extended: true,
            protection: None,
        };
        assert_eq!(
            f.flbas(),
            0x5 | 0x10 | 0x2 << 5,
            "low index, MSET, high index bits"
        );
        assert_eq!(Protection::first(PiType::Type3).dps(), 0xb);
        assert_eq!(Protection::last(PiType::Type1).dps(), 0x1);
        assert_eq!(PiCaps::ALL.dpc(), 0x1f);
        assert_eq!(MetadataCaps::BOTH.mc(), 0x3);
        let caps = PiCaps {
            type2: false,
            first: false,
            ..PiCaps::ALL
        };
        assert!(caps.allows(Protection::last(PiType::Type1)));
        assert!(!caps.allows(Protection::last(PiType::Type2)));
        assert!(!caps.allows(Protection::first(PiType::Type1)));
    }

    #[test]
    fn validation_names_the_problem() {
        let err = |c: NamespaceConfig| c.validate().unwrap_err().to_string();
        NamespaceConfig::new(1, 512, 8)
            .with_metadata(8, true)
            .validate()
            .unwrap();
        assert!(err(NamespaceConfig::new(1, 1000, 8)).contains("power of two"));
        assert!(
            err(NamespaceConfig::new(1, 512, 8).with_protection(Protection::last(PiType::Type1)))
                .contains("needs 8 metadata bytes")
        );
        let mut c = NamespaceConfig::new(1, 512, 8).with_metadata(8, false);
        c.metadata_caps.separate = false;
        assert!(err(c).contains("separate metadata buffer"));
        let c = NamespaceConfig::new(1, 512, 8).with_formats(vec![LbaFormat::new(4096, 0)]);
        assert!(err(c).contains("not among its LBA formats"));
        let c = NamespaceConfig::new(1, 4096, 8)
            .with_metadata(8, false)
            .with_formats(vec![
                LbaFormat::new(512, 0),
                LbaFormat::new(4096, 0),
                LbaFormat::new(4096, 8),
            ]);
        assert_eq!(c.format().map(|f| f.index), Some(2));
        assert!(err(NamespaceConfig::new(1, 512, 100).zoned(ZonedConfig::new(64))).contains("whole number"));
        let z = ZonedConfig {
            zone_capacity: 65,
            ..ZonedConfig::new(64)
        };
        assert!(err(NamespaceConfig::new(1, 512, 128).zoned(z)).contains("capacity"));
        let z = ZonedConfig {
            max_open: 4,
            max_active: 2,
            ..ZonedConfig::new(64)
        };
        assert!(err(NamespaceConfig::new(1, 512, 128).zoned(z)).contains("max_open"));
    }
}
