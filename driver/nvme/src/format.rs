//! Namespace formats: data and metadata per logical block, where the metadata travels, and
//! end-to-end protection information (NVM Command Set 1.0 §5.2, §5.3; NVMe Base 2.0 §5.17.2).
//!
//! A namespace's format decides how many bytes a command moves per block and through which
//! pointer: with metadata at the end of each block (an *extended* LBA, FLBAS bit 4) the data
//! pointer carries `data + metadata` bytes per block; with a separate metadata buffer the data
//! pointer carries the data and the metadata pointer (MPTR) the metadata; with protection
//! information and PRACT set, a namespace whose metadata is the PI alone moves no metadata at
//! all. [`Access`] turns a format and the queue pair's [`PiMode`] into those numbers, once per
//! namespace; the I/O path sizes every data and metadata pointer from them, so the controller
//! never moves more bytes than the pointers describe. A format vfpoll cannot drive safely is
//! refused here, before any command is built, with the namespace, its format and the fix.

use core::fmt;

use crate::identify::IdentifyNamespace;

/// The protection information type of a namespace (DPS bits 2:0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PiType {
    /// Type 1: the reference tag is the low 32 bits of the LBA, checked.
    Type1,
    /// Type 2: the reference tag starts at the command's initial reference tag, checked.
    Type2,
    /// Type 3: the reference tag is not checked.
    Type3,
}

/// The size of the PI guard (PIF in the extended LBA format, NVM Command Set 1.0 §5.3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PiFormat {
    /// 16-bit guard (CRC-16 T10-DIF), 8 bytes of PI: every PI controller.
    Guard16,
    /// 32-bit guard (CRC-32C), 16 bytes of PI.
    Guard32,
    /// 64-bit guard (CRC-64 NVMe), 16 bytes of PI.
    Guard64,
}

impl PiFormat {
    /// Bytes of PI per block.
    pub const fn size(self) -> usize {
        match self {
            PiFormat::Guard16 => 8,
            PiFormat::Guard32 | PiFormat::Guard64 => 16,
        }
    }
}

/// Protection information in use on a namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Protection {
    /// The PI type.
    pub ty: PiType,
    /// PI in the first bytes of the metadata (DPS bit 3), else in the last.
    pub first: bool,
    /// The guard size.
    pub format: PiFormat,
    /// Bits of the PI given to a storage tag (STS of the extended LBA format; 0: none). With
    /// a 16-bit guard they are taken from the 32-bit reference tag field (NVM Command Set 1.0
    /// §5.3.1.2), so the reference tag is no longer the LBA's low 32 bits: refused for I/O.
    pub storage_tag_bits: u8,
}

/// The format a namespace is formatted with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NsFormat {
    /// Index of the LBA format (FLBAS, with its upper bits).
    pub index: u8,
    /// How many LBA formats the namespace lists.
    pub count: u8,
    /// Data bytes per logical block.
    pub data_size: usize,
    /// Metadata bytes per logical block.
    pub metadata_size: usize,
    /// Metadata at the end of each block in the data buffer (FLBAS bit 4); else in a separate
    /// buffer. Meaningless without metadata.
    pub extended: bool,
    /// Protection information, when enabled (DPS).
    pub protection: Option<Protection>,
}

/// Why a format could not be read from the Identify data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FormatError {
    /// FLBAS selects a format the namespace does not list.
    NoSuchFormat {
        /// FLBAS's index.
        index: u8,
        /// Formats listed.
        count: u8,
    },
    /// LBADS is below 9 (512 bytes) or absurd.
    BadDataSize(u8),
    /// DPS names a reserved PI type.
    BadPiType(u8),
    /// PI is enabled but the metadata is smaller than the PI.
    PiLargerThanMetadata {
        /// PI bytes.
        pi: usize,
        /// Metadata bytes.
        ms: usize,
    },
    /// The extended LBA format names a reserved PI format.
    BadPiFormat(u8),
}

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FormatError::NoSuchFormat { index, count } => {
                write!(f, "FLBAS selects LBA format {index}, but only {count} are listed")
            }
            FormatError::BadDataSize(l) => write!(f, "LBA data size 2^{l} is not supported"),
            FormatError::BadPiType(t) => write!(f, "reserved protection information type {t}"),
            FormatError::PiLargerThanMetadata { pi, ms } => {
                write!(
                    f,
                    "{pi} bytes of protection information in {ms} bytes of metadata"
                )
            }
            FormatError::BadPiFormat(p) => write!(f, "reserved protection information format {p}"),
        }
    }
}

impl NsFormat {
    /// The format in use, from Identify Namespace and (for PI formats on controllers with
    /// extended LBA formats) the PIF of the NVM command set specific Identify Namespace
    /// (`pif`: 0 16-bit, 1 32-bit, 2 64-bit guard; `None` = 16-bit).
    pub fn parse(id: &IdentifyNamespace, pif: Option<u8>) -> Result<Self, FormatError> {
        let count = id.lba_formats.len() as u8;
        let f = *id
            .lba_formats
            .get(id.format_index as usize)
            .ok_or(FormatError::NoSuchFormat {
                index: id.format_index,
                count,
            })?;
        // 512 bytes to 2 GiB: anything else is a broken Identify page.
        if !(9..=31).contains(&f.lbads) {
            return Err(FormatError::BadDataSize(f.lbads));
        }
        let ms = f.ms as usize;
        let protection = match id.dps & 7 {
            0 => None,
            t @ 1..=3 => {
                let format = match pif.unwrap_or(0) {
                    0 => PiFormat::Guard16,
                    1 => PiFormat::Guard32,
                    2 => PiFormat::Guard64,
                    p => return Err(FormatError::BadPiFormat(p)),
                };
                if format.size() > ms {
                    return Err(FormatError::PiLargerThanMetadata {
                        pi: format.size(),
                        ms,
                    });
                }
                let ty = [PiType::Type1, PiType::Type2, PiType::Type3][t as usize - 1];
                Some(Protection {
                    ty,
                    first: id.dps & 8 != 0,
                    format,
                    storage_tag_bits: 0,
                })
            }
            t => return Err(FormatError::BadPiType(t)),
        };
        Ok(NsFormat {
            index: id.format_index,
            count,
            data_size: 1 << f.lbads,
            metadata_size: ms,
            extended: id.extended_lba && ms != 0,
            protection,
        })
    }

    /// The format in use, as [`NsFormat::parse`], from the extended LBA format `elbaf` of the
    /// NVM command set's Identify Namespace (CNS 05h, CSI 00h; bits 6:0 STS, the storage tag
    /// size, and 8:7 PIF), read for PI namespaces on controllers with extended LBA formats.
    pub fn parse_elbaf(id: &IdentifyNamespace, elbaf: Option<u32>) -> Result<Self, FormatError> {
        let mut f = Self::parse(id, elbaf.map(|e| ((e >> 7) & 3) as u8))?;
        if let (Some(p), Some(e)) = (f.protection.as_mut(), elbaf) {
            p.storage_tag_bits = (e & 0x7f) as u8;
        }
        Ok(f)
    }

    /// A format without metadata (tests, device models).
    pub const fn plain(data_size: usize) -> Self {
        NsFormat {
            index: 0,
            count: 1,
            data_size,
            metadata_size: 0,
            extended: false,
            protection: None,
        }
    }
}

impl fmt::Display for NsFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LBA format {}: {} B", self.index, self.data_size)?;
        if self.metadata_size != 0 {
            let place = if self.extended {
                "at the end of each block"
            } else {
                "in a separate buffer"
            };
            write!(f, " + {} B metadata {place}", self.metadata_size)?;
        }
        if let Some(p) = self.protection {
            let guard = match p.format {
                PiFormat::Guard16 => "16-bit",
                PiFormat::Guard32 => "32-bit",
                PiFormat::Guard64 => "64-bit",
            };
            let at = if p.first { "first" } else { "last" };
            write!(f, ", PI {:?} ({guard} guard, {at} bytes", p.ty)?;
            if p.storage_tag_bits != 0 {
                write!(f, ", {}-bit storage tag", p.storage_tag_bits)?;
            }
            write!(f, ")")?;
        }
        Ok(())
    }
}

/// Which protection information checks the controller makes (PRCHK, CDW12 bits 28:26).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PiCheck {
    /// Check the guard (the CRC of the block's data).
    pub guard: bool,
    /// Check the application tag against CDW15 (tag 0, mask 0xffff).
    pub app_tag: bool,
    /// Check the reference tag (types 1 and 2; type 1: the LBA's low 32 bits).
    pub ref_tag: bool,
}

/// How a queue pair uses protection information on namespaces formatted with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PiMode {
    /// The controller generates PI on writes and checks, then strips it on reads (PRACT = 1),
    /// checking the guard and, for types 1 and 2, the reference tag. Where the metadata is the
    /// PI alone, no metadata moves over the bus and buffers hold data only; with more
    /// metadata than PI it still moves (the PI bytes in it are the controller's).
    #[default]
    Controller,
    /// As [`PiMode::Controller`], but reads are not checked (PRACT = 1, PRCHK = 0): the PI is
    /// stripped whatever it holds. For reading blocks that were never written with PI (their
    /// PI is not valid) in order to save them; writes still get valid PI.
    ControllerUnchecked,
    /// The host supplies PI in the metadata it writes and gets it back on reads (PRACT = 0);
    /// the controller checks what `PiCheck` says. [`pi`] generates and verifies 16-bit guard PI.
    Host(PiCheck),
}

/// PRINFO bits of CDW12 (NVM Command Set 1.0 Figure 34/Figure 68).
pub mod prinfo {
    /// PRACT: the controller inserts or strips PI.
    pub const PRACT: u32 = 1 << 29;
    /// PRCHK: check the guard.
    pub const GUARD: u32 = 1 << 28;
    /// PRCHK: check the application tag.
    pub const APP_TAG: u32 = 1 << 27;
    /// PRCHK: check the reference tag.
    pub const REF_TAG: u32 = 1 << 26;
}

/// How commands to one namespace move bytes, for one queue pair's [`PiMode`]: what every data
/// and metadata pointer of that namespace is sized from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    /// Bytes per block in the data buffer (data, plus metadata for an extended LBA unless
    /// PRACT strips it).
    pub block_bytes: usize,
    /// Bytes per block in the separate metadata buffer (0: no metadata buffer; commands
    /// without one are refused when this is not 0).
    pub meta_bytes: usize,
    /// PRINFO bits for CDW12 of reads, writes and compares.
    pub prinfo: u32,
    /// Whether CDW14 carries the initial reference tag (the part's first LBA, low 32 bits).
    pub ref_tag: bool,
}

/// Why a namespace cannot be used for I/O by this driver as formatted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// PI with a 32- or 64-bit guard: vfpoll builds the 16-bit guard's commands only.
    PiFormat(PiFormat),
    /// PI with a storage tag of this many bits (ELBAF.STS): vfpoll's reference tag is the whole
    /// 32-bit field, and it sets no storage tag (CDW2/3 LBST, LBSTM).
    StorageTag(u8),
    /// The Identify data describe no usable format.
    BadFormat(FormatError),
    /// The namespace belongs to an I/O command set vfpoll does not drive (CSI).
    CommandSet(u8),
    /// One block moves more bytes than one command may.
    BlockTooLarge {
        /// Bytes per block through the data pointer.
        block: usize,
        /// The queue pair's maximum transfer.
        max: usize,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::PiFormat(p) => write!(
                f,
                "protection information with a {} guard is not supported (only the 16-bit guard is); format the namespace to a 16-bit guard PI format or one without PI (`vfpoll format --lbaf N --pi 1|none`)",
                match p {
                    PiFormat::Guard16 => "16-bit",
                    PiFormat::Guard32 => "32-bit",
                    PiFormat::Guard64 => "64-bit",
                }
            ),
            Refusal::StorageTag(bits) => write!(
                f,
                "protection information with a {bits}-bit storage tag (STS of its extended LBA format) is not supported: vfpoll uses the whole reference tag field for the LBA and sets no storage tag; format the namespace to an LBA format without a storage tag, or without PI (`vfpoll format --lbaf N --pi 1|none`)"
            ),
            Refusal::BadFormat(e) => write!(f, "its Identify Namespace data are inconsistent ({e}); the controller's firmware is at fault"),
            Refusal::CommandSet(csi) => write!(
                f,
                "it belongs to I/O command set {csi:#x} ({}), which vfpoll does not drive",
                match csi {
                    0 => "NVM",
                    1 => "Key Value",
                    2 => "Zoned Namespace",
                    _ => "unknown",
                }
            ),
            Refusal::BlockTooLarge { block, max } => write!(
                f,
                "one block moves {block} bytes but a command may move at most {max} (MDTS or the queue pair's max_transfer)"
            ),
        }
    }
}

impl Access {
    /// The access for `fmt` under `mode`, or why the format is refused.
    pub fn new(fmt: &NsFormat, mode: PiMode) -> Result<Self, Refusal> {
        let ms = fmt.metadata_size;
        let meta_moves = |moves: bool| {
            let (block_bytes, meta_bytes) = match (moves, fmt.extended) {
                (false, _) => (fmt.data_size, 0),
                (true, true) => (fmt.data_size + ms, 0),
                (true, false) => (fmt.data_size, ms),
            };
            (block_bytes, meta_bytes)
        };
        let Some(p) = fmt.protection else {
            let (block_bytes, meta_bytes) = meta_moves(ms != 0);
            return Ok(Access {
                block_bytes,
                meta_bytes,
                prinfo: 0,
                ref_tag: false,
            });
        };
        if p.format != PiFormat::Guard16 {
            // The 32- and 64-bit guards carry a 48-bit reference tag split over CDW3 and
            // CDW14 and storage tags; vfpoll does not build those commands.
            return Err(Refusal::PiFormat(p.format));
        }
        if p.storage_tag_bits != 0 {
            return Err(Refusal::StorageTag(p.storage_tag_bits));
        }
        let checks_ref = matches!(p.ty, PiType::Type1 | PiType::Type2);
        let (moves, prinfo, ref_tag) = match mode {
            PiMode::Controller => {
                let mut bits = prinfo::PRACT | prinfo::GUARD;
                if checks_ref {
                    bits |= prinfo::REF_TAG;
                }
                // With metadata that is the PI alone, PRACT means none moves (§5.2.1.2).
                (ms != p.format.size(), bits, checks_ref)
            }
            // The reference tag still goes in CDW14: writes generate PI from it.
            PiMode::ControllerUnchecked => (ms != p.format.size(), prinfo::PRACT, checks_ref),
            PiMode::Host(c) => {
                let mut bits = 0;
                if c.guard {
                    bits |= prinfo::GUARD;
                }
                if c.app_tag {
                    bits |= prinfo::APP_TAG;
                }
                let r = c.ref_tag && checks_ref;
                if r {
                    bits |= prinfo::REF_TAG;
                }
                (true, bits, r || p.ty == PiType::Type2)
            }
        };
        let (block_bytes, meta_bytes) = meta_moves(moves);
        Ok(Access {
            block_bytes,
            meta_bytes,
            prinfo,
            ref_tag,
        })
    }

    /// The bytes a command of `blocks` blocks moves through the data pointer and the metadata
    /// pointer: what the pointers must describe, no more and no less.
    pub const fn transfer(&self, blocks: u64) -> (u64, u64) {
        (blocks * self.block_bytes as u64, blocks * self.meta_bytes as u64)
    }
}

/// Protection information with a 16-bit guard (NVM Command Set 1.0 §5.3.1.1): the guard
/// (CRC-16 T10-DIF of the block's data), the application tag and the reference tag, each big
/// endian, 8 bytes.
pub mod pi {
    use super::{NsFormat, PiFormat, PiType};

    /// CRC-16 T10-DIF (polynomial 0x8BB7, initial value 0, not reflected), continuing `crc`.
    pub fn crc16_t10dif(mut crc: u16, data: &[u8]) -> u16 {
        for &b in data {
            crc = (crc << 8) ^ TABLE[((crc >> 8) as u8 ^ b) as usize];
        }
        crc
    }

    const TABLE: [u16; 256] = {
        let mut t = [0u16; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = (i as u16) << 8;
            let mut k = 0;
            while k < 8 {
                c = if c & 0x8000 != 0 {
                    (c << 1) ^ 0x8bb7
                } else {
                    c << 1
                };
                k += 1;
            }
            t[i] = c;
            i += 1;
        }
        t
    };

    /// Where the 8 PI bytes sit in a block's metadata.
    fn pi_offset(fmt: &NsFormat) -> Option<usize> {
        let p = fmt.protection?;
        (p.format == PiFormat::Guard16 && p.storage_tag_bits == 0).then(|| {
            if p.first {
                0
            } else {
                fmt.metadata_size - 8
            }
        })
    }

    /// The PI of one block: the guard covers the data and, with PI in the last bytes, the
    /// metadata before it (§5.3.1.1).
    fn tuple(data: &[u8], meta_before: &[u8], app: u16, reference: u32) -> [u8; 8] {
        let guard = crc16_t10dif(crc16_t10dif(0, data), meta_before);
        let mut t = [0u8; 8];
        t[0..2].copy_from_slice(&guard.to_be_bytes());
        t[2..4].copy_from_slice(&app.to_be_bytes());
        t[4..8].copy_from_slice(&reference.to_be_bytes());
        t
    }

    /// The reference tag of block `i` of a command starting at `slba`.
    fn reference(fmt: &NsFormat, slba: u64, i: u64) -> u32 {
        match fmt.protection.map(|p| p.ty) {
            Some(PiType::Type3) => u32::MAX,
            _ => (slba + i) as u32,
        }
    }

    /// Writes the PI of `blocks` blocks from `slba` into their metadata, for a write with
    /// [`super::PiMode::Host`]. `data` holds the blocks' data and `meta` their metadata: for an
    /// extended LBA both are the one buffer of `data + metadata` per block (pass it as `data`
    /// and an empty `meta`), otherwise the data buffer and the separate metadata buffer.
    /// Returns `false` (and writes nothing) if the format has no 16-bit guard PI without a
    /// storage tag or the buffers do not hold `blocks` blocks.
    pub fn generate(fmt: &NsFormat, slba: u64, blocks: u64, data: &mut [u8], meta: &mut [u8]) -> bool {
        walk(fmt, blocks, data, meta, |i, d, m_before, pi| {
            pi.copy_from_slice(&tuple(d, m_before, 0, reference(fmt, slba, i)));
            true
        })
    }

    /// Checks the PI that [`generate`] wrote (guard, application tag 0, reference tag);
    /// returns the index of the first block whose PI does not match.
    pub fn verify(
        fmt: &NsFormat,
        slba: u64,
        blocks: u64,
        data: &mut [u8],
        meta: &mut [u8],
    ) -> Result<(), u64> {
        let mut bad = None;
        walk(fmt, blocks, data, meta, |i, d, m_before, pi| {
            let ok = *pi == tuple(d, m_before, 0, reference(fmt, slba, i));
            if !ok {
                bad = Some(i);
            }
            ok
        });
        bad.map_or(Ok(()), Err)
    }

    /// Calls `f(block, data, metadata before the PI, PI)` for each block until it returns
    /// false; `false` if the layout does not fit.
    fn walk(
        fmt: &NsFormat,
        blocks: u64,
        data: &mut [u8],
        meta: &mut [u8],
        mut f: impl FnMut(u64, &[u8], &[u8], &mut [u8]) -> bool,
    ) -> bool {
        let Some(pi_off) = pi_offset(fmt) else {
            return false;
        };
        let (ds, ms) = (fmt.data_size, fmt.metadata_size);
        let n = blocks as usize;
        // One block: its data and its metadata, split at the PI.
        let mut block = |i: usize, d: &[u8], m: &mut [u8]| {
            let (before, rest) = m.split_at_mut(pi_off);
            f(
                i as u64,
                d,
                if pi_off == 0 { &[] } else { before },
                &mut rest[..8],
            )
        };
        if fmt.extended {
            if data.len() != n * (ds + ms) {
                return false;
            }
            for (i, b) in data.chunks_exact_mut(ds + ms).enumerate() {
                let (d, m) = b.split_at_mut(ds);
                if !block(i, d, m) {
                    break;
                }
            }
        } else {
            if data.len() != n * ds || meta.len() != n * ms {
                return false;
            }
            for (i, (d, m)) in data.chunks_exact(ds).zip(meta.chunks_exact_mut(ms)).enumerate() {
                if !block(i, d, m) {
                    break;
                }
            }
        }
        true
    }
}

/// A format for tests: LBA format 0 of 1, `ds` data and `ms` metadata bytes per block (in the
/// block with `extended`), protection information of type `pi` with a 16-bit guard in the
/// last 8 metadata bytes.
#[cfg(test)]
pub(crate) fn test_format(ds: usize, ms: usize, extended: bool, pi: Option<PiType>) -> NsFormat {
    NsFormat {
        index: 0,
        count: 1,
        data_size: ds,
        metadata_size: ms,
        extended,
        protection: pi.map(|ty| Protection {
            ty,
            first: false,
            format: PiFormat::Guard16,
            storage_tag_bits: 0,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identify::LbaFormat;

    fn id(formats: &[(u8, u16)], index: u8, extended: bool, dps: u8) -> IdentifyNamespace {
        IdentifyNamespace {
            nsze: 1000,
            ncap: 1000,
            nuse: 0,
            nsfeat: 0,
            lba_formats: formats
                .iter()
                .map(|&(lbads, ms)| LbaFormat { ms, lbads, rp: 0 })
                .collect(),
            format_index: index,
            extended_lba: extended,
            mc: 3,
            dpc: 0x1f,
            dps,
            nmic: 0,
            nguid: [0; 16],
            eui64: [0; 8],
        }
    }

    #[test]
    fn parses_every_kind_of_format() {
        let f = NsFormat::parse(&id(&[(9, 0), (9, 8), (12, 64)], 1, true, 0), None).unwrap();
        assert_eq!(
            (f.data_size, f.metadata_size, f.extended, f.protection),
            (512, 8, true, None)
        );
        assert_eq!(
            f.to_string(),
            "LBA format 1: 512 B + 8 B metadata at the end of each block"
        );
        let f = NsFormat::parse(&id(&[(9, 0), (9, 8), (12, 64)], 2, false, 1 | 8), None).unwrap();
        assert_eq!(
            f.protection,
            Some(Protection {
                ty: PiType::Type1,
                first: true,
                format: PiFormat::Guard16,
                storage_tag_bits: 0,
            })
        );
        assert_eq!(
            f.to_string(),
            "LBA format 2: 4096 B + 64 B metadata in a separate buffer, PI Type1 (16-bit guard, first bytes)"
        );
        // No metadata: never "extended".
        let f = NsFormat::parse(&id(&[(12, 0)], 0, true, 0), None).unwrap();
        assert!(!f.extended);
        // The upper index bits select format 17.
        let mut formats = vec![(9u8, 0u16); 17];
        formats.push((12, 16));
        let f = NsFormat::parse(&id(&formats, 17, false, 3), Some(2)).unwrap();
        assert_eq!(
            (f.index, f.data_size, f.protection.unwrap().format),
            (17, 4096, PiFormat::Guard64)
        );
        // Broken pages are errors, not guesses.
        assert_eq!(
            NsFormat::parse(&id(&[(9, 0)], 3, false, 0), None),
            Err(FormatError::NoSuchFormat { index: 3, count: 1 })
        );
        assert_eq!(
            NsFormat::parse(&id(&[(8, 0)], 0, false, 0), None),
            Err(FormatError::BadDataSize(8))
        );
        assert_eq!(
            NsFormat::parse(&id(&[(9, 8)], 0, false, 5), None),
            Err(FormatError::BadPiType(5))
        );
        assert_eq!(
            NsFormat::parse(&id(&[(9, 4)], 0, false, 1), None),
            Err(FormatError::PiLargerThanMetadata { pi: 8, ms: 4 })
        );
        assert_eq!(
            NsFormat::parse(&id(&[(9, 16)], 0, false, 1), Some(3)),
            Err(FormatError::BadPiFormat(3))
        );
    }

    #[test]
    fn access_sizes_each_pointer() {
        let host = PiMode::Host(PiCheck {
            guard: true,
            app_tag: false,
            ref_tag: true,
        });
        let a = |f: NsFormat, m: PiMode| Access::new(&f, m).unwrap();
        // Plain, extended, separate.
        assert_eq!(
            a(test_format(512, 0, false, None), PiMode::Controller).transfer(8),
            (4096, 0)
        );
        assert_eq!(
            a(test_format(512, 8, true, None), PiMode::Controller).transfer(8),
            (8 * 520, 0)
        );
        assert_eq!(
            a(test_format(512, 8, false, None), PiMode::Controller).transfer(8),
            (4096, 64)
        );
        // PI alone in the metadata with PRACT: nothing but data moves, either placement.
        for ext in [true, false] {
            let x = a(test_format(512, 8, ext, Some(PiType::Type1)), PiMode::Controller);
            assert_eq!(x.transfer(8), (4096, 0));
            assert_eq!(x.prinfo, prinfo::PRACT | prinfo::GUARD | prinfo::REF_TAG);
            assert!(x.ref_tag);
        }
        // More metadata than PI: it still moves with PRACT.
        assert_eq!(
            a(
                test_format(4096, 64, true, Some(PiType::Type1)),
                PiMode::Controller
            )
            .transfer(2),
            (2 * 4160, 0)
        );
        assert_eq!(
            a(
                test_format(4096, 64, false, Some(PiType::Type1)),
                PiMode::Controller
            )
            .transfer(2),
            (8192, 128)
        );
        // Unchecked: PRACT alone, same sizes.
        let x = a(
            test_format(512, 8, true, Some(PiType::Type1)),
            PiMode::ControllerUnchecked,
        );
        assert_eq!(
            (x.transfer(8), x.prinfo, x.ref_tag),
            ((4096, 0), prinfo::PRACT, true)
        );
        // Type 3 checks no reference tag.
        let x = a(test_format(512, 8, true, Some(PiType::Type3)), PiMode::Controller);
        assert_eq!((x.prinfo, x.ref_tag), (prinfo::PRACT | prinfo::GUARD, false));
        // Host PI: the metadata always moves; the checks asked for.
        let x = a(test_format(512, 8, false, Some(PiType::Type1)), host);
        assert_eq!(
            (x.transfer(1), x.prinfo, x.ref_tag),
            ((512, 8), prinfo::GUARD | prinfo::REF_TAG, true)
        );
        // 32/64-bit guards are refused.
        let mut f = test_format(4096, 16, false, Some(PiType::Type1));
        f.protection.as_mut().unwrap().format = PiFormat::Guard64;
        assert_eq!(
            Access::new(&f, PiMode::Controller),
            Err(Refusal::PiFormat(PiFormat::Guard64))
        );
    }

    #[test]
    fn a_storage_tag_is_read_shown_and_refused_in_every_pi_mode() {
        // ELBAF of format 1: STS 8, PIF 0 (16-bit guard).
        let page = id(&[(9, 0), (9, 8)], 1, true, 1);
        let f = NsFormat::parse_elbaf(&page, Some(8)).unwrap();
        assert_eq!(
            f.protection.map(|p| (p.format, p.storage_tag_bits)),
            Some((PiFormat::Guard16, 8))
        );
        assert_eq!(
            f.to_string(),
            "LBA format 1: 512 B + 8 B metadata at the end of each block, PI Type1 (16-bit guard, last bytes, 8-bit storage tag)"
        );
        let host = PiMode::Host(PiCheck {
            guard: true,
            app_tag: true,
            ref_tag: true,
        });
        for mode in [PiMode::Controller, PiMode::ControllerUnchecked, host] {
            assert_eq!(Access::new(&f, mode), Err(Refusal::StorageTag(8)), "{mode:?}");
        }
        let why = Refusal::StorageTag(8).to_string();
        assert!(
            why.contains("8-bit storage tag") && why.contains("vfpoll format --lbaf N"),
            "{why}"
        );
        // Host PI helpers do not write a reference tag the controller reads otherwise.
        let mut blocks = vec![0u8; 520];
        assert!(!pi::generate(&f, 0, 1, &mut blocks, &mut []));
        // STS 0 and the PIF bits: as `parse` with that PIF.
        let g = NsFormat::parse_elbaf(&page, Some(2 << 7)).unwrap_err();
        assert_eq!(g, FormatError::PiLargerThanMetadata { pi: 16, ms: 8 });
        let plain = NsFormat::parse_elbaf(&page, Some(0)).unwrap();
        assert_eq!(plain, NsFormat::parse(&page, Some(0)).unwrap());
        assert!(Access::new(&plain, PiMode::Controller).is_ok());
        // Without PI the storage tag size means nothing and is not kept.
        let no_pi = NsFormat::parse_elbaf(&id(&[(9, 8)], 0, true, 0), Some(8)).unwrap();
        assert_eq!(no_pi.protection, None);
    }

    #[test]
    fn crc16_t10dif_known_answers() {
        // The CRC catalogue's check value of CRC-16/T10-DIF.
        assert_eq!(pi::crc16_t10dif(0, b"123456789"), 0xd0db);
        assert_eq!(pi::crc16_t10dif(0, &[]), 0);
        // Continuing a CRC equals one pass over the concatenation.
        assert_eq!(pi::crc16_t10dif(pi::crc16_t10dif(0, b"12345"), b"6789"), 0xd0db);
    }

    #[test]
    fn pi_generate_and_verify() {
        for (ext, ms, first) in [
            (true, 8, false),
            (false, 8, true),
            (false, 16, false),
            (true, 16, true),
        ] {
            let mut f = test_format(512, ms, ext, Some(PiType::Type1));
            f.protection.as_mut().unwrap().first = first;
            let per = if ext { 512 + ms } else { 512 };
            let mut data: Vec<u8> = (0..4 * per).map(|i| (i * 7) as u8).collect();
            let mut meta = if ext { vec![] } else { vec![0u8; 4 * ms] };
            assert!(pi::generate(&f, 100, 4, &mut data, &mut meta));
            assert_eq!(pi::verify(&f, 100, 4, &mut data, &mut meta), Ok(()));
            // Another LBA: the reference tag of block 0 no longer matches.
            assert_eq!(pi::verify(&f, 101, 4, &mut data, &mut meta), Err(0));
            // A flipped data bit in block 2: its guard no longer matches.
            data[2 * per + 5] ^= 1;
            assert_eq!(pi::verify(&f, 100, 4, &mut data, &mut meta), Err(2));
            // Wrong sizes are refused.
            assert!(!pi::generate(&f, 100, 5, &mut data, &mut meta));
        }
        assert!(!pi::generate(
            &test_format(512, 8, true, None),
            0,
            1,
            &mut [0; 520],
            &mut []
        ));
    }

    /// Property tests: formats from any Identify Namespace data are consistent or refused, the
    /// sizes every pointer is built from follow from them, and host PI round trips and catches
    /// every single flipped bit it covers. 256 cases per property (see
    /// [`vfpoll_nvme_spec::proptest_support`]).
    mod props {
        use super::*;
        use proptest::prelude::*;
        use vfpoll_nvme_spec::proptest_support::{config, page};

        fn pi_mode() -> impl Strategy<Value = PiMode> {
            prop_oneof![
                Just(PiMode::Controller),
                any::<(bool, bool, bool)>().prop_map(|(guard, app_tag, ref_tag)| PiMode::Host(PiCheck {
                    guard,
                    app_tag,
                    ref_tag
                })),
            ]
        }

        /// What holds for every format vfpoll accepts, and for the access it derives from it
        /// under `mode`.
        fn check_format(f: &NsFormat, id: &IdentifyNamespace, mode: PiMode) -> Result<(), TestCaseError> {
            prop_assert!(f.data_size.is_power_of_two() && (512..=1 << 31).contains(&f.data_size));
            prop_assert_eq!(
                (f.index, f.count as usize),
                (id.format_index, id.lba_formats.len())
            );
            prop_assert_eq!(f.metadata_size, id.lba_format().ms as usize);
            prop_assert_eq!(f.extended, id.extended_lba && f.metadata_size != 0);
            if let Some(p) = f.protection {
                prop_assert!(p.format.size() <= f.metadata_size);
                prop_assert_eq!(p.first, id.dps & 8 != 0);
            }
            let _ = f.to_string();
            let Ok(a) = Access::new(f, mode) else {
                let guard = f.protection.map(|p| p.format);
                prop_assert!(matches!(guard, Some(PiFormat::Guard32 | PiFormat::Guard64)));
                return Ok(());
            };
            let (ds, ms) = (f.data_size, f.metadata_size);
            // Metadata moves through one pointer or none, never both.
            prop_assert!(
                (a.block_bytes, a.meta_bytes) == (ds, 0)
                    || (f.extended && (a.block_bytes, a.meta_bytes) == (ds + ms, 0))
                    || (!f.extended && (a.block_bytes, a.meta_bytes) == (ds, ms))
            );
            // Without PI metadata always moves; with it, only PRACT with PI-only metadata
            // keeps it off the bus.
            let stays = f.protection.is_some_and(|p| p.format.size() == ms) && mode == PiMode::Controller;
            prop_assert_eq!(a.block_bytes + a.meta_bytes == ds, ms == 0 || stays);
            prop_assert_eq!(
                a.prinfo & prinfo::PRACT != 0,
                f.protection.is_some() && mode == PiMode::Controller
            );
            prop_assert_eq!(a.transfer(3), (3 * a.block_bytes as u64, 3 * a.meta_bytes as u64));
            Ok(())
        }

        /// The LBA format, FLBAS index and extended bit, DPS, PIF of a namespace.
        type Picked = (Vec<(u8, u16)>, u8, bool, u8, Option<u8>);

        fn picked() -> impl Strategy<Value = Picked> {
            let lbads = prop_oneof![9u8..=12, 9u8..=31, any::<u8>()];
            let ms = prop_oneof![Just(0u16), Just(8), Just(16), Just(64), 0u16..=128, any::<u16>()];
            (
                prop::collection::vec((lbads, ms), 1..=64),
                prop_oneof![0u8..4, 0u8..64],
                any::<bool>(),
                prop_oneof![0u8..16, any::<u8>()],
                prop_oneof![Just(None), (0u8..3).prop_map(Some), any::<u8>().prop_map(Some)],
            )
        }

        proptest! {
            #![proptest_config(config(256))]

            /// Any Identify Namespace page and any PIF: an error, or a consistent format.
            #[test]
            fn any_namespace_page_gives_a_consistent_format_or_an_error(
                b in page(),
                pif in prop::option::of(any::<u8>()),
                mode in pi_mode(),
            ) {
                if let Some(id) = IdentifyNamespace::parse(&b) {
                    if let Ok(f) = NsFormat::parse(&id, pif) {
                        check_format(&f, &id, mode)?;
                    }
                }
            }

            /// Identify data from random fields: the format they describe, or the error that
            /// names what is wrong with them.
            #[test]
            fn namespace_fields_give_their_format(
                (formats, index, extended, dps, pif) in picked(),
                mode in pi_mode(),
            ) {
                let id = id(&formats, index, extended, dps);
                let got = NsFormat::parse(&id, pif);
                let count = formats.len() as u8;
                let want = (|| {
                    let &(lbads, ms) =
                        formats.get(index as usize).ok_or(FormatError::NoSuchFormat { index, count })?;
                    if !(9..=31).contains(&lbads) {
                        return Err(FormatError::BadDataSize(lbads));
                    }
                    let ty = match dps & 7 {
                        0 => None,
                        1 => Some(PiType::Type1),
                        2 => Some(PiType::Type2),
                        3 => Some(PiType::Type3),
                        t => return Err(FormatError::BadPiType(t)),
                    };
                    let protection = match ty {
                        None => None,
                        Some(ty) => {
                            let format = match pif {
                                None | Some(0) => PiFormat::Guard16,
                                Some(1) => PiFormat::Guard32,
                                Some(2) => PiFormat::Guard64,
                                Some(p) => return Err(FormatError::BadPiFormat(p)),
                            };
                            if format.size() > ms as usize {
                                let (pi, ms) = (format.size(), ms as usize);
                                return Err(FormatError::PiLargerThanMetadata { pi, ms });
                            }
                            Some(Protection { ty, first: dps & 8 != 0, format, storage_tag_bits: 0 })
                        }
                    };
                    Ok(NsFormat {
                        index,
                        count,
                        data_size: 1 << lbads,
                        metadata_size: ms as usize,
                        extended: extended && ms != 0,
                        protection,
                    })
                })();
                prop_assert_eq!(got, want);
                if let Ok(f) = got {
                    check_format(&f, &id, mode)?;
                }
            }
        }

        /// A 16-bit guard PI format: data 512..=4096, metadata 8..=128, either placement.
        fn pi_format() -> impl Strategy<Value = NsFormat> {
            (9u32..=12, 8usize..=128, any::<bool>(), any::<bool>(), 0usize..3).prop_map(
                |(lbads, ms, extended, first, t)| NsFormat {
                    index: 0,
                    count: 1,
                    data_size: 1 << lbads,
                    metadata_size: ms,
                    extended,
                    protection: Some(Protection {
                        ty: [PiType::Type1, PiType::Type2, PiType::Type3][t],
                        first,
                        format: PiFormat::Guard16,
                        storage_tag_bits: 0,
                    }),
                },
            )
        }

        /// Buffers for `blocks` blocks of `f` (data, separate metadata) filled from `seed`.
        fn buffers(f: &NsFormat, blocks: usize, seed: u64) -> (Vec<u8>, Vec<u8>) {
            let mut x = seed | 1;
            let mut noise = |n: usize| -> Vec<u8> {
                (0..n)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x as u8
                    })
                    .collect()
            };
            if f.extended {
                (noise(blocks * (f.data_size + f.metadata_size)), Vec::new())
            } else {
                (noise(blocks * f.data_size), noise(blocks * f.metadata_size))
            }
        }

        proptest! {
            #![proptest_config(config(256))]

            /// PI generated for any blocks verifies; any one flipped bit of a block's data,
            /// of the metadata before its PI (covered by the guard when the PI is last) or of
            /// its PI is caught in that block; metadata after the PI is not covered.
            #[test]
            fn host_pi_round_trips_and_catches_any_flipped_bit(
                f in pi_format(),
                slba in any::<u64>(),
                blocks in 1usize..=4,
                seed in any::<u64>(),
                (block, at, bit) in (0usize..4, any::<prop::sample::Index>(), 0u8..8),
            ) {
                let (mut data, mut meta) = buffers(&f, blocks, seed);
                prop_assert!(pi::generate(&f, slba, blocks as u64, &mut data, &mut meta));
                prop_assert_eq!(pi::verify(&f, slba, blocks as u64, &mut data, &mut meta), Ok(()));
                // Type 1 and 2 tags follow the LBA; type 3's do not.
                let other = slba.wrapping_add(1);
                let want = match f.protection.unwrap().ty {
                    PiType::Type3 => Ok(()),
                    _ => Err(0),
                };
                prop_assert_eq!(pi::verify(&f, other, blocks as u64, &mut data, &mut meta), want);
                // Flip one bit of block `block`'s data or metadata.
                let block = block % blocks;
                let (ds, ms) = (f.data_size, f.metadata_size);
                let pi_at = if f.protection.unwrap().first { 0 } else { ms - 8 };
                let i = at.index(ds + ms);
                let covered = i < ds + pi_at + 8;
                if f.extended {
                    data[block * (ds + ms) + i] ^= 1 << bit;
                } else if i < ds {
                    data[block * ds + i] ^= 1 << bit;
                } else {
                    meta[block * ms + i - ds] ^= 1 << bit;
                }
                let got = pi::verify(&f, slba, blocks as u64, &mut data, &mut meta);
                let want = if covered { Err(block as u64) } else { Ok(()) };
                prop_assert_eq!(got, want, "byte {} of the block", i);
            }

            /// Buffers that do not hold the blocks (or a format without 16-bit guard PI) are
            /// refused, and nothing is written.
            #[test]
            fn host_pi_refuses_buffers_of_the_wrong_size(
                f in pi_format(),
                blocks in 1usize..=4,
                (dd, md) in (-2isize..=2, -2isize..=2),
                seed in any::<u64>(),
            ) {
                let (data, meta) = buffers(&f, blocks, seed);
                let resize = |mut v: Vec<u8>, d: isize| {
                    v.resize((v.len() as isize + d).max(0) as usize, 0xa5);
                    v
                };
                let (mut d, mut m) = (resize(data, dd), resize(meta, if f.extended { 0 } else { md }));
                let (d0, m0) = (d.clone(), m.clone());
                let fits = dd == 0 && (f.extended || md == 0);
                prop_assert_eq!(pi::generate(&f, 0, blocks as u64, &mut d, &mut m), fits);
                if !fits {
                    prop_assert!(d == d0 && m == m0);
                }
                let plain = NsFormat { protection: None, ..f };
                prop_assert!(!pi::generate(&plain, 0, blocks as u64, &mut d, &mut m));
            }
        }
    }
}
