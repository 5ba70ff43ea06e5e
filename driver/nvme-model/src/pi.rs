//! End-to-end data protection (NVM Command Set 1.0 §5.2 and §5.3) with the 16-bit guard
//! protection information format (PIF 00b): the CRC, the 8-byte tuple, and the checks and
//! insertion that PRINFO (CDW12 bits 29:26) asks of Read, Write, Compare, Write Zeroes and Zone
//! Append.
//!
//! Rules, from the specification, and where it leaves room from QEMU 7.2 (`hw/nvme/dif.c`):
//! - the guard is CRC-16 T10-DIF of the block's data, followed, when the tuple is the last 8
//!   bytes of the metadata, by the metadata bytes before it (§5.3.1);
//! - Type 1 and 2 reference tags start at the command's ILBRT (CDW14) and count up per block;
//!   Type 1 with the reference tag check asks that ILBRT equal the SLBA's low 32 bits, or the
//!   command fails with Invalid Protection Information before any check (QEMU's
//!   `nvme_check_prinfo`); Type 3 reference tags are kept and never checked (the model follows
//!   the specification here: QEMU compares them with ILBRT when asked);
//! - a block whose application tag is FFFFh (Type 1, 2), or whose application tag is FFFFh and
//!   reference tag FFFFFFFFh (Type 3), is not checked (§5.3.1.4);
//! - checks run guard, application tag, reference tag, block by block, and the first failure
//!   is the command's status (End-to-end Guard/Application Tag/Reference Tag Check Error);
//! - a namespace formatted without protection information ignores PRINFO (QEMU's behaviour).

use crate::nsconfig::{PiType, Protection};
use crate::queue::Command;
use crate::Status;

/// The CRC-16 T10-DIF polynomial (x^16 + x^15 + x^11 + x^9 + x^8 + x^7 + x^5 + x^4 + x^2 + x
/// + 1), not reflected.
const POLY: u16 = 0x8bb7;

/// Byte-at-a-time table for [`crc16_t10dif`].
const TABLE: [u16; 256] = {
    let mut t = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                crc << 1 ^ POLY
            } else {
                crc << 1
            };
            bit += 1;
        }
        t[i] = crc;
        i += 1;
    }
    t
};

/// CRC-16 T10-DIF of `data`, continuing from `crc` (0 to start): polynomial 8BB7h, initial
/// value 0, no reflection, no final XOR (NVM Command Set 1.0 §5.3.1.2, the 16-bit guard).
///
/// ```
/// use vfpoll_nvme_model::crc16_t10dif;
/// assert_eq!(crc16_t10dif(0, b"123456789"), 0xd0db);
/// // In pieces: the CRC of data followed by metadata, as a guard covers both.
/// assert_eq!(crc16_t10dif(crc16_t10dif(0, b"1234"), b"56789"), 0xd0db);
/// ```
pub fn crc16_t10dif(crc: u16, data: &[u8]) -> u16 {
    data.iter()
        .fold(crc, |crc, &b| crc << 8 ^ TABLE[((crc >> 8) as u8 ^ b) as usize])
}

/// A protection information tuple in the 16-bit guard format (NVM Command Set 1.0 §5.3.1,
/// Figure 9): Guard, Application Tag, Reference Tag, each big-endian, 8 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PiTuple {
    /// CRC-16 T10-DIF of the block (see [`PiTuple::guard_of`]).
    pub guard: u16,
    /// Application tag.
    pub app_tag: u16,
    /// Reference tag.
    pub ref_tag: u32,
}

impl PiTuple {
    /// Bytes of a tuple.
    pub const LEN: usize = 8;
    /// The tuple of a deallocated or never written block: every bit set, which turns all
    /// checks off (§5.3.1.4).
    pub const UNWRITTEN: PiTuple = PiTuple {
        guard: 0xffff,
        app_tag: 0xffff,
        ref_tag: 0xffff_ffff,
    };

    /// Decodes the first 8 bytes of `b`.
    ///
    /// # Panics
    /// If `b` is shorter than 8 bytes.
    pub fn read(b: &[u8]) -> PiTuple {
        PiTuple {
            guard: u16::from_be_bytes([b[0], b[1]]),
            app_tag: u16::from_be_bytes([b[2], b[3]]),
            ref_tag: u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
        }
    }

    /// Encodes into the first 8 bytes of `b`.
    ///
    /// # Panics
    /// If `b` is shorter than 8 bytes.
    pub fn write(self, b: &mut [u8]) {
        b[0..2].copy_from_slice(&self.guard.to_be_bytes());
        b[2..4].copy_from_slice(&self.app_tag.to_be_bytes());
        b[4..8].copy_from_slice(&self.ref_tag.to_be_bytes());
    }

    /// The encoded tuple.
    pub fn to_bytes(self) -> [u8; 8] {
        let mut b = [0; 8];
        self.write(&mut b);
        b
    }

    /// The guard of a block: the CRC of its data, then of `meta_before`, the metadata bytes
    /// before the tuple (empty when the tuple is the first 8 bytes of the metadata).
    pub fn guard_of(data: &[u8], meta_before: &[u8]) -> u16 {
        crc16_t10dif(crc16_t10dif(0, data), meta_before)
    }
}

/// PRINFO bits in CDW12 (NVM Command Set 1.0 §3.2.4, Figure 42): PRACT bit 29, PRCHK bits 28:26
/// (guard, application tag, reference tag).
const PRACT: u32 = 1 << 29;
const PRCHK_GUARD: u32 = 1 << 28;
const PRCHK_APP: u32 = 1 << 27;
const PRCHK_REF: u32 = 1 << 26;
/// Zone Append, CDW12 bit 25: Protection Information Remap (ZNS 1.1 §4.4.1).
const PIREMAP: u32 = 1 << 25;

/// What a command asks of protection information: PRINFO, ILBRT (CDW14), LBAT and LBATM
/// (CDW15).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PiArgs {
    pub(crate) pract: bool,
    pub(crate) guard: bool,
    pub(crate) app: bool,
    pub(crate) reftag: bool,
    pub(crate) remap: bool,
    pub(crate) ilbrt: u32,
    pub(crate) lbat: u16,
    pub(crate) lbatm: u16,
}

impl PiArgs {
    pub(crate) fn of(cmd: &Command) -> PiArgs {
        let (dw12, dw15) = (cmd.cdw(12), cmd.cdw(15));
        PiArgs {
            pract: dw12 & PRACT != 0,
            guard: dw12 & PRCHK_GUARD != 0,
            app: dw12 & PRCHK_APP != 0,
            reftag: dw12 & PRCHK_REF != 0,
            remap: dw12 & PIREMAP != 0,
            ilbrt: cmd.cdw(14),
            lbat: dw15 as u16,
            lbatm: (dw15 >> 16) as u16,
        }
    }

    /// Whether any PRCHK bit is set.
    pub(crate) fn checks(&self) -> bool {
        self.guard || self.app || self.reftag
    }

    /// Type 1 with the reference tag check: ILBRT must be the SLBA's low 32 bits.
    pub(crate) fn check_ilbrt(&self, p: Protection, slba: u64) -> Result<(), Status> {
        if p.pi_type == PiType::Type1 && self.reftag && slba as u32 != self.ilbrt {
            return Err(Status::INVALID_PROTECTION_INFO);
        }
        Ok(())
    }

    /// The reference tag of the `i`th block of the command.
    fn ref_tag(&self, p: Protection, i: usize) -> u32 {
        match p.pi_type {
            PiType::Type1 | PiType::Type2 => self.ilbrt.wrapping_add(i as u32),
            PiType::Type3 => self.ilbrt,
        }
    }
}

/// Where a namespace's tuple sits in a block's `ms` metadata bytes.
pub(crate) fn tuple_offset(p: Protection, ms: usize) -> usize {
    if p.first {
        0
    } else {
        ms - PiTuple::LEN
    }
}

/// Writes the tuple of the `i`th block of a command (PRACT = 1 on a write): guard over `data`
/// and the metadata before the tuple, LBAT, the block's reference tag.
pub(crate) fn insert(p: Protection, args: &PiArgs, i: usize, data: &[u8], meta: &mut [u8]) {
    let at = tuple_offset(p, meta.len());
    let t = PiTuple {
        guard: PiTuple::guard_of(data, &meta[..at]),
        app_tag: args.lbat,
        ref_tag: args.ref_tag(p, i),
    };
    t.write(&mut meta[at..]);
}

/// Checks the tuple of the `i`th block of a command as PRCHK asks.
pub(crate) fn check(p: Protection, args: &PiArgs, i: usize, data: &[u8], meta: &[u8]) -> Result<(), Status> {
    let at = tuple_offset(p, meta.len());
    let t = PiTuple::read(&meta[at..]);
    let off = match p.pi_type {
        PiType::Type1 | PiType::Type2 => t.app_tag == 0xffff,
        PiType::Type3 => t.app_tag == 0xffff && t.ref_tag == 0xffff_ffff,
    };
    if off {
        return Ok(());
    }
    if args.guard && t.guard != PiTuple::guard_of(data, &meta[..at]) {
        return Err(Status::GUARD_CHECK_ERROR);
    }
    if args.app && (t.app_tag & args.lbatm) != (args.lbat & args.lbatm) {
        return Err(Status::APP_TAG_CHECK_ERROR);
    }
    if args.reftag && p.pi_type != PiType::Type3 && t.ref_tag != args.ref_tag(p, i) {
        return Err(Status::REF_TAG_CHECK_ERROR);
    }
    Ok(())
}

/// Sets the tuples of `blocks` deallocated blocks in `meta` (`ms` bytes each) to
/// [`PiTuple::UNWRITTEN`].
pub(crate) fn mark_unwritten(p: Protection, ms: usize, meta: &mut [u8]) {
    let at = tuple_offset(p, ms);
    for m in meta.chunks_exact_mut(ms) {
        PiTuple::UNWRITTEN.write(&mut m[at..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(prchk: u32, ilbrt: u32, lbat: u16, lbatm: u16) -> PiArgs {
        let mut c = Command { dw: [0; 16] };
        c.dw[12] = prchk << 26;
        c.dw[14] = ilbrt;
        c.dw[15] = lbat as u32 | (lbatm as u32) << 16;
        PiArgs::of(&c)
    }

    #[test]
    fn crc_known_vectors() {
        assert_eq!(
            crc16_t10dif(0, b"123456789"),
            0xd0db,
            "CRC-16/T10-DIF check value"
        );
        assert_eq!(crc16_t10dif(0, &[0; 512]), 0, "init 0: zeroes give 0");
        assert_eq!(crc16_t10dif(0, &[0xff; 512]), 0xe6a1, "computed bit by bit");
        let data: Vec<u8> = (0..=255).collect();
        let whole = crc16_t10dif(0, &data);
        assert_eq!(crc16_t10dif(crc16_t10dif(0, &data[..100]), &data[100..]), whole);
    }

    #[test]
    fn insert_then_check_passes_and_each_field_is_caught() {
        for p in [
            Protection::last(PiType::Type1),
            Protection::first(PiType::Type2),
            Protection::last(PiType::Type3),
        ] {
            let data = [0x5au8; 512];
            let mut meta = [0x11u8; 16];
            let a = args(0b111, 100, 0x1234, 0xffff);
            insert(p, &a, 3, &data, &mut meta);
            check(p, &a, 3, &data, &meta).unwrap();
            let at = tuple_offset(p, 16);
            assert_eq!(at, if p.first { 0 } else { 8 });
            let t = PiTuple::read(&meta[at..]);
            let want_ref = if p.pi_type == PiType::Type3 { 100 } else { 103 };
            assert_eq!((t.app_tag, t.ref_tag), (0x1234, want_ref));
            let mut bad = data;
            bad[7] ^= 1;
            assert_eq!(check(p, &a, 3, &bad, &meta), Err(Status::GUARD_CHECK_ERROR));
            if !p.first {
                let mut m = meta;
                m[0] ^= 1;
                assert_eq!(
                    check(p, &a, 3, &data, &m),
                    Err(Status::GUARD_CHECK_ERROR),
                    "the guard covers metadata before a last-bytes tuple"
                );
            }
            let other_app = args(0b111, 100, 0x1235, 0xffff);
            assert_eq!(
                check(p, &other_app, 3, &data, &meta),
                Err(Status::APP_TAG_CHECK_ERROR)
            );
            let masked = args(0b111, 100, 0x1235, 0xfff0);
            check(p, &masked, 3, &data, &meta).unwrap();
            let wrong_block = check(p, &a, 4, &data, &meta);
            if p.pi_type == PiType::Type3 {
                wrong_block.unwrap();
            } else {
                assert_eq!(wrong_block, Err(Status::REF_TAG_CHECK_ERROR));
            }
            check(p, &args(0, 0, 0, 0), 9, &bad, &meta).expect("PRCHK 0: nothing checked");
        }
    }

    #[test]
    fn escape_values_turn_checks_off() {
        let data = [1u8; 512];
        let mut meta = [0u8; 8];
        let a = args(0b111, 7, 0, 0xffff);
        PiTuple {
            guard: 0,
            app_tag: 0xffff,
            ref_tag: 0,
        }
        .write(&mut meta);
        check(Protection::last(PiType::Type1), &a, 0, &data, &meta).unwrap();
        assert_eq!(
            check(Protection::last(PiType::Type3), &a, 0, &data, &meta),
            Err(Status::GUARD_CHECK_ERROR),
            "Type 3 also needs the reference tag escape"
        );
        mark_unwritten(Protection::last(PiType::Type3), 8, &mut meta);
        check(Protection::last(PiType::Type3), &a, 0, &data, &meta).unwrap();
    }

    #[test]
    fn type1_ilbrt_must_match_the_slba() {
        let p = Protection::last(PiType::Type1);
        args(0b001, 0x2_0000, 0, 0).check_ilbrt(p, 0x1_0002_0000).unwrap();
        assert_eq!(
            args(0b001, 5, 0, 0).check_ilbrt(p, 6),
            Err(Status::INVALID_PROTECTION_INFO)
        );
        args(0b110, 5, 0, 0)
            .check_ilbrt(p, 6)
            .expect("no reference tag check asked");
        args(0b001, 5, 0, 0)
            .check_ilbrt(Protection::last(PiType::Type2), 6)
            .expect("Type 2 ILBRT is free");
    }
}
