//! End-to-end data protection (NVM Command Set 1.0 §5.2, §5.3; 16-bit guard): PRACT inserting
//! and stripping tuples, PRCHK checking guard, application tag and reference tag on writes and
//! reads, each error status, the Type 1 ILBRT rule, Types 2 and 3, the escape values, and PRINFO
//! on Compare and Write Zeroes. Expected tuples are computed here with `crc16_t10dif`.

mod common;

use common::*;
use vfpoll_nvme_model::{
    crc16_t10dif, io_opcode as io, ModelConfig, NamespaceConfig, PiTuple, PiType, Protection, Status,
};
use vfpoll_pci::BusAddr;

const DS: usize = 512;

/// PRINFO bits (CDW12 bits 29:26).
const PRACT: u32 = 0b1000;
const GUARD: u32 = 0b0100;
const APP: u32 = 0b0010;
const REF: u32 = 0b0001;

fn host(ns: NamespaceConfig) -> Host {
    let mut h = Host::started(ModelConfig {
        namespaces: vec![ns],
        ..Default::default()
    });
    h.create_qp(1, 16);
    h
}

/// A Read/Write/Compare with PRINFO, ILBRT, LBAT and LBATM.
fn rw(op: u8, slba: u64, n: u32, prinfo: u32, ilbrt: u32, lbat: u16, lbatm: u16) -> Sqe {
    Sqe::rw(op, 1, slba, n)
        .cdw(12, (n - 1) | prinfo << 26)
        .cdw(14, ilbrt)
        .cdw(15, lbat as u32 | (lbatm as u32) << 16)
}

fn with_mptr(sqe: Sqe, at: BusAddr) -> Sqe {
    sqe.cdw(4, at.get() as u32).cdw(5, (at.get() >> 32) as u32)
}

/// Extended-LBA blocks of `ms` metadata bytes with correct tuples at `at` (PI last unless
/// `first`): reference tags from `ref0`, application tag `app`, the rest of the metadata from
/// `fill`.
fn protected(data: &[u8], ms: usize, first: bool, ref0: u32, app: u16, fill: u8) -> Vec<u8> {
    let at = if first { 0 } else { ms - 8 };
    let mut out = Vec::new();
    for (i, d) in data.chunks(DS).enumerate() {
        let mut m = vec![fill; ms];
        let guard = crc16_t10dif(crc16_t10dif(0, d), &m[..at]);
        PiTuple {
            guard,
            app_tag: app,
            ref_tag: ref0.wrapping_add(i as u32),
        }
        .write(&mut m[at..]);
        out.extend_from_slice(d);
        out.extend_from_slice(&m);
    }
    out
}

#[test]
fn crc16_t10dif_known_vector() {
    assert_eq!(crc16_t10dif(0, b"123456789"), 0xd0db);
}

#[test]
fn pract_with_8_byte_metadata_inserts_and_strips() {
    let ns = NamespaceConfig::new(1, 512, 1024)
        .with_metadata(8, true)
        .with_protection(Protection::last(PiType::Type1));
    let mut h = host(ns);
    let data = pattern(4 * DS, 1);
    // Only the data crosses the bus: an SGL of NLB × (LBA + MS) bytes is the wrong length.
    let src = h.buffer_with(&data);
    let long = rw(io::WRITE, 40, 4, PRACT, 40, 0x55aa, 0).sgl(sgl_desc(src.get(), 4 * 520, SGL_DATA));
    assert_eq!(h.cmd(1, long).status, Status::DATA_SGL_LENGTH_INVALID);
    let write = rw(io::WRITE, 40, 4, PRACT | REF, 40, 0x55aa, 0).sgl(sgl_desc(src.get(), 4 * 512, SGL_DATA));
    h.cmd(1, write).ok();
    let stored = h.model.read_ns_meta(1, 40, 4).unwrap();
    let want = protected(&data, 8, false, 40, 0x55aa, 0);
    let want_meta: Vec<u8> = want.chunks(520).flat_map(|b| b[512..].to_vec()).collect();
    assert_eq!(stored, want_meta, "guard, LBAT, reference tags 40..44");

    // Read with PRACT: checked and stripped, data only.
    let dst = h.mem.alloc(PAGE);
    let read = rw(io::READ, 40, 4, PRACT | GUARD | APP | REF, 40, 0x55aa, 0xffff);
    h.cmd(1, read.sgl(sgl_desc(dst.get(), 4 * 512, SGL_DATA))).ok();
    assert_eq!(h.mem.read_vec(dst, 4 * DS), data);
    // Without PRACT: the tuples come along.
    let c = h.cmd(
        1,
        rw(io::READ, 40, 4, GUARD | APP | REF, 40, 0x55aa, 0xffff).prp(dst.get(), 0),
    );
    c.ok();
    assert_eq!(h.mem.read_vec(dst, 4 * 520), want);
}

#[test]
fn pract_with_larger_metadata_moves_it_and_fills_the_tuple() {
    for first in [false, true] {
        let p = Protection {
            pi_type: PiType::Type2,
            first,
        };
        let ns = NamespaceConfig::new(1, 512, 64)
            .with_metadata(16, false)
            .with_protection(p);
        let mut h = host(ns);
        let data = pattern(2 * DS, 2);
        let (src, msrc) = (h.buffer_with(&data), h.buffer_with(&[0x77; 32]));
        let w = with_mptr(
            rw(io::WRITE, 5, 2, PRACT, 1000, 0x1234, 0).prp(src.get(), 0),
            msrc,
        );
        h.cmd(1, w).ok();
        let want = protected(&data, 16, first, 1000, 0x1234, 0x77);
        let want_meta: Vec<u8> = want.chunks(528).flat_map(|b| b[512..].to_vec()).collect();
        assert_eq!(
            h.model.read_ns_meta(1, 5, 2).unwrap(),
            want_meta,
            "first = {first}"
        );
        // Reading with PRACT and 16-byte metadata still moves the metadata, tuple included.
        let (dst, mdst) = (h.mem.alloc(PAGE), h.mem.alloc(PAGE));
        let r = with_mptr(
            rw(io::READ, 5, 2, PRACT | GUARD | REF, 1000, 0, 0).prp(dst.get(), 0),
            mdst,
        );
        h.cmd(1, r).ok();
        assert_eq!(h.mem.read_vec(mdst, 32), want_meta);
    }
}

#[test]
fn host_tuples_are_checked_on_write_and_each_error_named() {
    let ns = NamespaceConfig::new(1, 512, 64)
        .with_metadata(8, true)
        .with_protection(Protection::last(PiType::Type1));
    let mut h = host(ns);
    let data = pattern(3 * DS, 3);
    let good = protected(&data, 8, false, 7, 0xbeef, 0);
    let all = GUARD | APP | REF;
    let write = |h: &mut Host, buf: &[u8], prinfo, ilbrt, lbat, lbatm| {
        let b = h.buffer_with(buf);
        h.cmd(1, rw(io::WRITE, 7, 3, prinfo, ilbrt, lbat, lbatm).prp(b.get(), 0))
            .status
    };
    let before = h.model.read_ns_meta(1, 7, 3).unwrap();
    // Block 2's guard, application tag and reference tag broken in turn.
    let mut bad_guard = good.clone();
    bad_guard[2 * 520 + 100] ^= 1;
    assert_eq!(
        write(&mut h, &bad_guard, all, 7, 0xbeef, 0xffff),
        Status::GUARD_CHECK_ERROR
    );
    let mut bad_app = good.clone();
    bad_app[2 * 520 + 512 + 3] ^= 0x10;
    assert_eq!(
        write(&mut h, &bad_app, all, 7, 0xbeef, 0xffff),
        Status::APP_TAG_CHECK_ERROR
    );
    assert_eq!(
        write(&mut h, &bad_app, all, 7, 0xbeef, 0xffef),
        Status::SUCCESS,
        "LBATM masks the bit"
    );
    let mut bad_ref = good.clone();
    bad_ref[2 * 520 + 512 + 7] ^= 1;
    assert_eq!(
        write(&mut h, &bad_ref, all, 7, 0xbeef, 0xffff),
        Status::REF_TAG_CHECK_ERROR
    );
    assert_eq!(
        write(&mut h, &bad_ref, GUARD | APP, 7, 0xbeef, 0xffff),
        Status::SUCCESS,
        "not asked to check the reference tag"
    );
    // Type 1: ILBRT must be the SLBA's low 32 bits when the reference tag is checked.
    assert_eq!(
        write(&mut h, &good, REF, 8, 0, 0),
        Status::INVALID_PROTECTION_INFO
    );
    assert_eq!(Status::INVALID_PROTECTION_INFO.sct, 1, "command specific");
    assert_eq!(
        h.model.read_ns_meta(1, 7, 3).unwrap()[..2 * 8],
        bad_ref
            .chunks(520)
            .flat_map(|b| b[512..].to_vec())
            .collect::<Vec<_>>()[..2 * 8],
        "the last accepted write is what is stored"
    );
    assert_ne!(before, h.model.read_ns_meta(1, 7, 3).unwrap());
    // A rejected write stores nothing.
    let stored = (
        h.model.read_ns(1, 7, 3).unwrap(),
        h.model.read_ns_meta(1, 7, 3).unwrap(),
    );
    let mut other = protected(&pattern(3 * DS, 9), 8, false, 7, 0xbeef, 0);
    other[100] ^= 1;
    assert_eq!(write(&mut h, &other, GUARD, 7, 0, 0), Status::GUARD_CHECK_ERROR);
    assert_eq!(
        (
            h.model.read_ns(1, 7, 3).unwrap(),
            h.model.read_ns_meta(1, 7, 3).unwrap()
        ),
        stored
    );
}

#[test]
fn stored_tuples_are_checked_on_read() {
    let ns = NamespaceConfig::new(1, 512, 64)
        .with_metadata(8, false)
        .with_protection(Protection::last(PiType::Type1));
    let mut h = host(ns);
    let (dst, mdst) = (h.mem.alloc(PAGE), h.mem.alloc(PAGE));
    let read = |h: &mut Host, prinfo, ilbrt, lbat| {
        let r = with_mptr(
            rw(io::READ, 20, 2, prinfo, ilbrt, lbat, 0xffff).prp(dst.get(), 0),
            mdst,
        );
        h.cmd(1, r).status
    };
    // Never written: all-ones tuples turn every check off.
    assert_eq!(read(&mut h, GUARD | APP | REF, 20, 0x1111), Status::SUCCESS);
    assert_eq!(h.mem.read_vec(mdst, 16), vec![0xff; 16]);
    let data = pattern(2 * DS, 4);
    let blocks = protected(&data, 8, false, 20, 0x1111, 0);
    let meta: Vec<u8> = blocks.chunks(520).flat_map(|b| b[512..].to_vec()).collect();
    h.model.write_ns(1, 20, &data).unwrap();
    h.model.write_ns_meta(1, 20, &meta).unwrap();
    assert_eq!(read(&mut h, GUARD | APP | REF, 20, 0x1111), Status::SUCCESS);
    assert_eq!(read(&mut h, APP, 20, 0x1112), Status::APP_TAG_CHECK_ERROR);
    assert_eq!(
        read(&mut h, REF, 21, 0),
        Status::INVALID_PROTECTION_INFO,
        "ILBRT is not the SLBA"
    );
    let mut corrupt = data.clone();
    corrupt[DS + 1] ^= 0x80;
    h.model.write_ns(1, 20, &corrupt).unwrap();
    assert_eq!(read(&mut h, GUARD, 20, 0), Status::GUARD_CHECK_ERROR);
    assert_eq!(
        read(&mut h, APP | REF, 20, 0x1111),
        Status::SUCCESS,
        "guard not checked"
    );
    // An application tag of FFFFh turns Type 1 checks off for its block.
    let mut escaped = meta.clone();
    escaped[8 + 2..8 + 4].copy_from_slice(&[0xff, 0xff]);
    h.model.write_ns_meta(1, 20, &escaped).unwrap();
    assert_eq!(read(&mut h, GUARD, 20, 0), Status::SUCCESS);
    assert_eq!(
        h.model.stats().bytes_read,
        4 * 2 * DS as u64,
        "failed reads move nothing"
    );
}

#[test]
fn type2_and_type3_reference_tags() {
    let ns = NamespaceConfig::new(1, 512, 64)
        .with_metadata(8, true)
        .with_protection(Protection::last(PiType::Type2));
    let mut h = host(ns);
    let data = pattern(2 * DS, 5);
    // Type 2: any ILBRT, counting up per block.
    let b = h.buffer_with(&protected(&data, 8, false, 0xabc0, 0, 0));
    h.cmd(1, rw(io::WRITE, 3, 2, REF, 0xabc0, 0, 0).prp(b.get(), 0))
        .ok();
    let c = h.cmd(1, rw(io::READ, 3, 2, REF, 0xabc1, 0, 0).prp(b.get(), 0));
    assert_eq!(c.status, Status::REF_TAG_CHECK_ERROR);

    let ns = NamespaceConfig::new(1, 512, 64)
        .with_metadata(8, true)
        .with_protection(Protection::last(PiType::Type3));
    let mut h = host(ns);
    // Type 3: PRACT writes ILBRT into every block; the reference tag is never checked.
    let src = h.buffer_with(&data);
    h.cmd(1, rw(io::WRITE, 3, 2, PRACT, 0x77, 0x99, 0).prp(src.get(), 0))
        .ok();
    let meta = h.model.read_ns_meta(1, 3, 2).unwrap();
    assert_eq!(PiTuple::read(&meta[8..]).ref_tag, 0x77, "not incremented");
    let dst = h.mem.alloc(PAGE);
    h.cmd(
        1,
        rw(io::READ, 3, 2, GUARD | APP | REF, 0x1234, 0x99, 0xffff).prp(dst.get(), 0),
    )
    .ok();
    // Escape: application tag FFFFh alone is not enough for Type 3.
    let mut m = meta.clone();
    m[2..4].copy_from_slice(&[0xff, 0xff]);
    m[0] ^= 1;
    h.model.write_ns_meta(1, 3, &m).unwrap();
    let c = h.cmd(1, rw(io::READ, 3, 1, GUARD, 0, 0, 0).prp(dst.get(), 0));
    assert_eq!(c.status, Status::GUARD_CHECK_ERROR);
    m[4..8].copy_from_slice(&[0xff; 4]);
    h.model.write_ns_meta(1, 3, &m).unwrap();
    h.cmd(1, rw(io::READ, 3, 1, GUARD, 0, 0, 0).prp(dst.get(), 0))
        .ok();
}

#[test]
fn compare_and_write_zeroes_with_protection() {
    let ns = NamespaceConfig::new(1, 512, 64)
        .with_metadata(16, true)
        .with_protection(Protection::last(PiType::Type1));
    let mut h = host(ns);
    let data = pattern(2 * DS, 6);
    let blocks = protected(&data, 16, false, 8, 0x42, 0x3c);
    let b = h.buffer_with(&blocks);
    h.cmd(
        1,
        rw(io::WRITE, 8, 2, GUARD | APP | REF, 8, 0x42, 0xffff).prp(b.get(), 0),
    )
    .ok();
    // Compare: PRACT is refused; PRCHK checks the stored tuples; the tuple itself is not compared.
    assert_eq!(
        h.cmd(1, rw(io::COMPARE, 8, 2, PRACT, 8, 0, 0).prp(b.get(), 0))
            .status,
        Status::INVALID_PROTECTION_INFO
    );
    let mut other_tuple = blocks.clone();
    other_tuple[512 + 8] ^= 0xff;
    let o = h.buffer_with(&other_tuple);
    h.cmd(1, rw(io::COMPARE, 8, 2, REF, 8, 0, 0).prp(o.get(), 0)).ok();
    let mut other_meta = blocks.clone();
    other_meta[528 + 512 + 1] ^= 1;
    let o = h.buffer_with(&other_meta);
    assert_eq!(
        h.cmd(1, rw(io::COMPARE, 8, 2, 0, 0, 0, 0).prp(o.get(), 0)).status,
        Status::COMPARE_FAILURE
    );
    assert_eq!(
        h.cmd(1, rw(io::COMPARE, 8, 2, APP, 8, 0x43, 0xffff).prp(b.get(), 0))
            .status,
        Status::APP_TAG_CHECK_ERROR
    );

    // Write Zeroes: PRCHK is refused, PRACT inserts tuples of the zeroes, else all ones.
    let wz = |prinfo: u32| rw(io::WRITE_ZEROES, 8, 2, prinfo, 8, 0x66, 0);
    assert_eq!(h.cmd(1, wz(GUARD)).status, Status::INVALID_PROTECTION_INFO);
    h.cmd(1, wz(PRACT)).ok();
    let meta = h.model.read_ns_meta(1, 8, 2).unwrap();
    let zero_guard = crc16_t10dif(crc16_t10dif(0, &[0; DS]), &[0; 8]);
    assert_eq!(
        PiTuple::read(&meta[16 + 8..]),
        PiTuple {
            guard: zero_guard,
            app_tag: 0x66,
            ref_tag: 9
        }
    );
    assert_eq!(&meta[..8], &[0; 8], "the rest of the metadata zeroed");
    h.cmd(1, wz(0)).ok();
    assert_eq!(
        PiTuple::read(&h.model.read_ns_meta(1, 8, 1).unwrap()[8..]),
        PiTuple::UNWRITTEN
    );
}

#[test]
fn prinfo_is_ignored_without_protection() {
    // QEMU's behaviour: PRACT does nothing on a namespace formatted without protection.
    let mut h = host(NamespaceConfig::new(1, 512, 64).with_metadata(8, true));
    let blocks = pattern(2 * 520, 7);
    let b = h.buffer_with(&blocks);
    h.cmd(
        1,
        rw(io::WRITE, 0, 2, PRACT | GUARD | APP | REF, 99, 0, 0).prp(b.get(), 0),
    )
    .ok();
    let meta = h.model.read_ns_meta(1, 0, 2).unwrap();
    assert_eq!(
        meta,
        [&blocks[512..520], &blocks[1032..1040]].concat(),
        "metadata stored as sent"
    );
}
