//! Zoned namespaces (Zoned Namespace Command Set 1.1): command set selection by CC.CSS, Identify
//! data, the zone state machine driven by writes and Zone Management Send, open and active
//! limits, every zoned status code, Zone Append and its LBA in the completion, and Report Zones
//! with its filters and partial reports. The model's zone list (`NvmeModel::zones`) and the
//! namespace contents are the oracles.

mod common;

use common::*;
use vfpoll_nvme_model::{
    admin_opcode as adm, io_opcode as io, ModelConfig, NamespaceConfig, PiTuple, PiType, Protection, Status,
    ZoneInfo, ZoneState, ZonedConfig,
};

/// Zones of 64 blocks with 48 writable, at most 2 open and 3 active.
const ZONE: u64 = 64;
const CAP: u64 = 48;

fn zoned(nsid: u32) -> NamespaceConfig {
    let z = ZonedConfig {
        zone_capacity: CAP,
        max_open: 2,
        max_active: 3,
        ..ZonedConfig::new(ZONE)
    };
    NamespaceConfig::new(nsid, 512, 8 * ZONE).zoned(z)
}

fn config(ns: Vec<NamespaceConfig>) -> ModelConfig {
    ModelConfig {
        namespaces: ns,
        zasl: 1, // 8 KiB: 16 blocks
        ..Default::default()
    }
}

/// A model enabled with CC.CSS `css` and I/O queue pair 1.
fn host_css(cfg: ModelConfig, css: u32) -> Host {
    let mut h = Host::new(cfg);
    let csts = h.enable(good_cc().with_command_set(css), 32);
    assert!(csts.ready(), "{csts:?}");
    h.create_qp(1, 32);
    h
}

/// All I/O command sets (CC.CSS 110b), zoned namespace 1 and NVM namespace 2.
fn host() -> Host {
    host_css(config(vec![zoned(1), NamespaceConfig::new(2, 512, 64)]), 0b110)
}

fn send(h: &mut Host, slba: u64, action: u32, all: bool) -> Status {
    let sqe = Sqe::new(io::ZONE_MGMT_SEND)
        .nsid(1)
        .cdw(10, slba as u32)
        .cdw(11, (slba >> 32) as u32)
        .cdw(13, action | (all as u32) << 8);
    h.cmd(1, sqe).status
}
const CLOSE: u32 = 1;
const FINISH: u32 = 2;
const OPEN: u32 = 3;
const RESET: u32 = 4;
const OFFLINE: u32 = 5;

fn write(h: &mut Host, slba: u64, n: u32) -> Status {
    let buf = h.buffer_with(&pattern(n as usize * 512, slba as u8));
    let sqe = Sqe::rw(io::WRITE, 1, slba, n).sgl(sgl_desc(buf.get(), n * 512, SGL_DATA));
    h.cmd(1, sqe).status
}

fn read(h: &mut Host, slba: u64, n: u32) -> Status {
    let buf = h.mem.alloc(n as usize * 512);
    let sqe = Sqe::rw(io::READ, 1, slba, n).sgl(sgl_desc(buf.get(), n * 512, SGL_DATA));
    h.cmd(1, sqe).status
}

fn states(h: &Host) -> Vec<ZoneState> {
    h.model.zones(1).unwrap().iter().map(|z| z.state).collect()
}

fn zone(h: &Host, i: usize) -> ZoneInfo {
    h.model.zones(1).unwrap()[i]
}

/// Dword 1 of the last completion reaped on `qid` (the upper half of a Zone Append's LBA).
fn last_dw1(h: &Host, qid: u16) -> u32 {
    let qp = h.qp(qid);
    let i = (qp.head + qp.cq_size - 1) % qp.cq_size;
    h.mem.read_u32(qp.cq.add(i as u64 * 16 + 4))
}

/// Zone Append of `data` to the zone starting at `zslba`; the completion and the LBA written.
fn append(h: &mut Host, zslba: u64, data: &[u8], cdw12_flags: u32) -> (Cqe, u64) {
    let n = (data.len() / 512) as u32;
    let buf = h.buffer_with(data);
    let sqe = Sqe::rw(io::ZONE_APPEND, 1, zslba, n)
        .cdw(12, (n - 1) | cdw12_flags)
        .sgl(sgl_desc(buf.get(), data.len() as u32, SGL_DATA));
    let c = h.cmd(1, sqe);
    (c, c.dw0 as u64 | (last_dw1(h, 1) as u64) << 32)
}

fn le(b: &[u8], off: usize, len: usize) -> u64 {
    let mut v = [0u8; 8];
    v[..len].copy_from_slice(&b[off..off + len]);
    u64::from_le_bytes(v)
}

#[test]
fn identify_zoned_structures() {
    let mut h = host();
    let id = |h: &mut Host, cns: u32, nsid: u32, csi: u32| {
        let buf = h.mem.alloc(PAGE);
        let sqe = Sqe::new(adm::IDENTIFY)
            .nsid(nsid)
            .prp(buf.get(), 0)
            .cdw(10, cns)
            .cdw(11, csi << 24);
        let c = h.admin(sqe);
        (c.status, h.mem.read_vec(buf, PAGE))
    };
    let (s, z) = id(&mut h, 0x05, 1, 2);
    assert_eq!(s, Status::SUCCESS);
    assert_eq!((le(&z, 0, 2), le(&z, 2, 2)), (0, 0), "ZOC, OZCS: no RAZB");
    assert_eq!((le(&z, 4, 4), le(&z, 8, 4)), (2, 1), "MAR, MOR: 0's based");
    assert_eq!((le(&z, 2816, 8), z[2824]), (ZONE, 0), "LBAFE0: ZSZE, ZDES");
    let (_, ctrl) = id(&mut h, 0x06, 0, 2);
    assert_eq!(ctrl[0], 1, "ZASL");
    let (_, d) = id(&mut h, 0x03, 1, 0);
    assert_eq!(
        (d[20], d[21], d[24]),
        (0x04, 1, 2),
        "CSI descriptor: Zoned Namespace"
    );
    let (_, d) = id(&mut h, 0x03, 2, 0);
    assert_eq!(d[24], 0, "CSI descriptor: NVM");
    let (_, list) = id(&mut h, 0x07, 0, 2);
    assert_eq!((le(&list, 0, 4), le(&list, 4, 4)), (1, 0), "zoned namespaces: 1");
    let (_, ns) = id(&mut h, 0x00, 1, 0);
    assert_eq!(le(&ns, 0, 8), 8 * ZONE, "NSZE");
    assert_eq!(
        id(&mut h, 0x05, 2, 2).0,
        Status::INVALID_FIELD,
        "namespace 2 is not zoned"
    );
    let (s, nvm) = id(&mut h, 0x05, 1, 0);
    assert!(
        s.is_success() && nvm.iter().all(|&b| b == 0),
        "the NVM structure of a zoned namespace"
    );
    // Limits of 0 are "no limit": all ones.
    let mut h = host_css(
        config(vec![NamespaceConfig::new(1, 512, 128).zoned(ZonedConfig::new(64))]),
        6,
    );
    let (_, z) = id(&mut h, 0x05, 1, 2);
    assert_eq!((le(&z, 4, 4), le(&z, 8, 4)), (0xffff_ffff, 0xffff_ffff));
}

#[test]
fn the_command_set_follows_cc_css() {
    // CC.CSS 000b: the zoned namespace takes NVM commands, zone commands are unknown, and
    // writes still keep to the write pointer (QEMU 7.2's nvme_select_iocs_ns).
    let mut h = host_css(config(vec![zoned(1)]), 0b000);
    assert_eq!(send(&mut h, 0, OPEN, false), Status::INVALID_OPCODE);
    let (c, _) = append(&mut h, 0, &[0; 512], 0);
    assert_eq!(c.status, Status::INVALID_OPCODE);
    assert_eq!(write(&mut h, 1, 1), Status::ZONE_INVALID_WRITE);
    assert_eq!(write(&mut h, 0, 1), Status::SUCCESS);
    assert_eq!(zone(&h, 0).state, ZoneState::ImplicitlyOpened);
    // CC.CSS 110b: an NVM namespace knows no zone commands.
    let mut h = host();
    let c = h.cmd(1, Sqe::new(io::ZONE_MGMT_SEND).nsid(2).cdw(13, OPEN));
    assert_eq!(c.status, Status::INVALID_OPCODE);
    // CC.CSS 111b, admin only: no I/O command set (Flush aside, as QEMU).
    let mut h = host_css(config(vec![zoned(1)]), 0b111);
    assert_eq!(read(&mut h, 0, 1), Status::INVALID_OPCODE);
    h.cmd(1, Sqe::new(io::FLUSH).nsid(1)).ok();
}

#[test]
fn writes_follow_the_write_pointer_up_to_capacity() {
    let mut h = host();
    assert_eq!(write(&mut h, 0, 8), Status::SUCCESS);
    assert_eq!(
        (zone(&h, 0).state, zone(&h, 0).write_pointer),
        (ZoneState::ImplicitlyOpened, 8)
    );
    assert_eq!(
        write(&mut h, 4, 1),
        Status::ZONE_INVALID_WRITE,
        "behind the write pointer"
    );
    assert_eq!(write(&mut h, 9, 1), Status::ZONE_INVALID_WRITE, "ahead of it");
    assert_eq!(
        write(&mut h, 8, 41),
        Status::ZONE_BOUNDARY_ERROR,
        "past the zone capacity"
    );
    assert_eq!(zone(&h, 0).write_pointer, 8, "failed writes move nothing");
    assert_eq!(write(&mut h, 8, 40), Status::SUCCESS);
    assert_eq!(zone(&h, 0).state, ZoneState::Full, "written to capacity");
    assert_eq!(write(&mut h, 48, 1), Status::ZONE_IS_FULL);
    assert_eq!(h.model.read_ns(1, 8, 40).unwrap(), pattern(40 * 512, 8));
    // Reads: anywhere in the zone, but not across zones without RAZB.
    assert_eq!(
        read(&mut h, 40, 24),
        Status::SUCCESS,
        "beyond the capacity reads zeroes"
    );
    assert_eq!(read(&mut h, 60, 8), Status::ZONE_BOUNDARY_ERROR);
    // Write Zeroes is a write at the write pointer too.
    let wz = |h: &mut Host, slba, n| h.cmd(1, Sqe::rw(io::WRITE_ZEROES, 1, slba, n)).status;
    assert_eq!(wz(&mut h, 65, 2), Status::ZONE_INVALID_WRITE);
    assert_eq!(wz(&mut h, 64, 2), Status::SUCCESS);
    assert_eq!(zone(&h, 1).write_pointer, 66);

    let mut cross = zoned(1);
    cross.zoned.as_mut().unwrap().cross_zone_read = true;
    let mut h = host_css(config(vec![cross]), 6);
    assert_eq!(read(&mut h, 60, 8), Status::SUCCESS, "RAZB");
    h.model.set_zone_state(1, 64, ZoneState::Offline).unwrap();
    assert_eq!(
        read(&mut h, 60, 8),
        Status::ZONE_IS_OFFLINE,
        "into an offline zone"
    );
}

#[test]
fn zone_append_returns_the_lba() {
    let mut h = host();
    let (c, lba) = append(&mut h, 64, &pattern(4 * 512, 1), 0);
    c.ok();
    assert_eq!((lba, last_dw1(&h, 1)), (64, 0), "DW0 and DW1: the LBA");
    let (c, lba) = append(&mut h, 64, &pattern(2 * 512, 2), 0);
    c.ok();
    assert_eq!(lba, 68);
    assert_eq!(
        h.model.read_ns(1, 64, 6).unwrap(),
        [pattern(4 * 512, 1), pattern(2 * 512, 2)].concat()
    );
    assert_eq!(zone(&h, 1).write_pointer, 70);
    let (c, _) = append(&mut h, 65, &[0; 512], 0);
    assert_eq!(c.status, Status::INVALID_FIELD, "not a zone start");
    let (c, _) = append(&mut h, 64, &[0; 17 * 512], 0);
    assert_eq!(c.status, Status::INVALID_FIELD, "over ZASL (16 blocks)");
    let (c, _) = append(&mut h, 64, &[0; 16 * 512], 0);
    c.ok();
    // 22 blocks so far; the zone's capacity is 48.
    for n in [8, 8, 8, 2] {
        append(&mut h, 64, &vec![0; n * 512], 0).0.ok();
    }
    assert_eq!(zone(&h, 1).state, ZoneState::Full);
    let (c, _) = append(&mut h, 64, &[0; 512], 0);
    assert_eq!(c.status, Status::ZONE_IS_FULL);
}

#[test]
fn management_actions_and_resource_limits() {
    let mut h = host();
    let bad = Status::INVALID_ZONE_STATE_TRANSITION;
    assert_eq!(send(&mut h, 0, CLOSE, false), bad, "close an empty zone");
    assert_eq!(send(&mut h, 64 * 2, OPEN, false), Status::SUCCESS);
    assert_eq!(send(&mut h, 64 * 3, OPEN, false), Status::SUCCESS);
    assert_eq!(states(&h)[2..4], [ZoneState::ExplicitlyOpened; 2]);
    // Two open: explicitly opened zones are never closed for room.
    assert_eq!(write(&mut h, 64 * 4, 1), Status::TOO_MANY_OPEN_ZONES);
    assert_eq!(send(&mut h, 64 * 2, CLOSE, false), Status::SUCCESS);
    assert_eq!(write(&mut h, 64 * 4, 1), Status::SUCCESS);
    assert_eq!(
        states(&h)[2..5],
        [
            ZoneState::Closed,
            ZoneState::ExplicitlyOpened,
            ZoneState::ImplicitlyOpened
        ]
    );
    // Three active (closed 2, open 3 and 4).
    assert_eq!(write(&mut h, 64 * 5, 1), Status::TOO_MANY_ACTIVE_ZONES);
    assert_eq!(send(&mut h, 64 * 5, OPEN, false), Status::TOO_MANY_ACTIVE_ZONES);
    assert_eq!(send(&mut h, 64 * 2, FINISH, false), Status::SUCCESS);
    assert_eq!(zone(&h, 2).state, ZoneState::Full);
    // Now two active, two open: the implicitly opened zone 4 is closed to open zone 5.
    assert_eq!(write(&mut h, 64 * 5, 1), Status::SUCCESS);
    assert_eq!(
        states(&h)[3..6],
        [
            ZoneState::ExplicitlyOpened,
            ZoneState::Closed,
            ZoneState::ImplicitlyOpened
        ]
    );
    assert_eq!(send(&mut h, 64 * 2, OPEN, false), bad, "open a full zone");
    assert_eq!(send(&mut h, 64 * 6, FINISH, false), Status::SUCCESS);
    assert_eq!(
        zone(&h, 6).state,
        ZoneState::Full,
        "an empty zone finishes without resources"
    );

    // Addressing: a zone start inside the namespace; unknown actions and ZRWA are refused.
    assert_eq!(send(&mut h, 65, OPEN, false), Status::INVALID_FIELD);
    assert_eq!(send(&mut h, 8 * 64, OPEN, false), Status::LBA_OUT_OF_RANGE);
    assert_eq!(send(&mut h, 0, 0x7, false), Status::INVALID_FIELD);
    assert_eq!(
        send(&mut h, 0, 0x10, false),
        Status::INVALID_FIELD,
        "no descriptor extensions"
    );
    assert_eq!(
        send(&mut h, 0, OPEN | 1 << 9, false),
        Status::INVALID_ZONE_OPERATION,
        "no ZRWA"
    );

    // Select All: close the open ones, then reset everything written.
    assert_eq!(send(&mut h, 12345, CLOSE, true), Status::SUCCESS, "SLBA ignored");
    assert_eq!(states(&h)[3..6], [ZoneState::Closed; 3]);
    assert_eq!(
        send(&mut h, 0, OPEN, true),
        Status::TOO_MANY_OPEN_ZONES,
        "three closed, two may open"
    );
    assert_eq!(
        states(&h)[3..6],
        [
            ZoneState::ExplicitlyOpened,
            ZoneState::ExplicitlyOpened,
            ZoneState::Closed
        ]
    );
    assert_eq!(send(&mut h, 0, RESET, true), Status::SUCCESS);
    assert!(
        states(&h).iter().all(|&s| s == ZoneState::Empty),
        "{:?}",
        states(&h)
    );
    assert!(
        h.model.namespace_data(1).unwrap().iter().all(|&b| b == 0),
        "reset deallocates"
    );
    assert_eq!(zone(&h, 5).write_pointer, 5 * 64);
    // Resources are free again.
    for z in 0..3 {
        assert_eq!(write(&mut h, z * 64, 1), Status::SUCCESS, "zone {z}");
    }
}

#[test]
fn read_only_and_offline_zones() {
    let mut h = host();
    write(&mut h, 64, 4);
    h.model.set_zone_state(1, 64, ZoneState::ReadOnly).unwrap();
    assert_eq!(write(&mut h, 68, 1), Status::ZONE_IS_READ_ONLY);
    assert_eq!(read(&mut h, 64, 4), Status::SUCCESS);
    assert_eq!(
        send(&mut h, 64, RESET, false),
        Status::INVALID_ZONE_STATE_TRANSITION
    );
    assert_eq!(
        send(&mut h, 0, OFFLINE, false),
        Status::INVALID_ZONE_STATE_TRANSITION,
        "only read-only zones"
    );
    assert_eq!(send(&mut h, 0, OFFLINE, true), Status::SUCCESS);
    assert_eq!(zone(&h, 1).state, ZoneState::Offline);
    assert_eq!(read(&mut h, 64, 1), Status::ZONE_IS_OFFLINE);
    assert_eq!(write(&mut h, 64, 1), Status::ZONE_IS_OFFLINE);
    let (c, _) = append(&mut h, 64, &[0; 512], 0);
    assert_eq!(c.status, Status::ZONE_IS_OFFLINE);
    // The read-only zone gave its resources back: three other zones can be active.
    for z in [2, 3] {
        assert_eq!(write(&mut h, z * 64, 1), Status::SUCCESS);
    }
    assert!(
        h.model.set_zone_state(1, 64, ZoneState::Full).is_err(),
        "only media failures"
    );
    assert!(
        h.model.set_zone_state(1, 65, ZoneState::Offline).is_err(),
        "not a zone start"
    );
    assert!(
        h.model.set_zone_state(2, 0, ZoneState::Offline).is_err(),
        "not zoned"
    );
}

/// Report Zones into a fresh buffer of `dwords` dwords.
fn report(h: &mut Host, slba: u64, filter: u32, partial: bool, dwords: u32) -> (Status, Vec<u8>) {
    let len = dwords as usize * 4;
    let buf = h.mem.alloc(len);
    h.mem.write(buf, &vec![0xee; len]);
    let sqe = Sqe::new(io::ZONE_MGMT_RECV)
        .nsid(1)
        .sgl(sgl_desc(buf.get(), len as u32, SGL_DATA))
        .cdw(10, slba as u32)
        .cdw(12, dwords - 1)
        .cdw(13, filter << 8 | (partial as u32) << 16);
    let c = h.cmd(1, sqe);
    (c.status, h.mem.read_vec(buf, len))
}

#[test]
fn report_zones_filters_and_partial_reports() {
    let mut h = host();
    write(&mut h, 0, 48); // zone 0 full
    write(&mut h, 64, 5); // zone 1 implicitly opened
    send(&mut h, 128, OPEN, false); // zone 2 explicitly opened
    let (s, r) = report(&mut h, 0, 0, false, (64 + 8 * 64) / 4);
    assert_eq!(s, Status::SUCCESS);
    assert_eq!(le(&r, 0, 8), 8, "all zones");
    let d = |i: usize| &r[64 + 64 * i..128 + 64 * i];
    assert_eq!((d(0)[0], d(0)[1]), (0x2, 0xe0), "sequential write required, full");
    assert_eq!(
        (le(d(0), 8, 8), le(d(0), 16, 8), le(d(0), 24, 8)),
        (CAP, 0, u64::MAX),
        "ZCAP, ZSLBA, no WP"
    );
    assert_eq!((d(1)[1], le(d(1), 24, 8)), (0x20, 69), "implicitly opened at 69");
    assert_eq!((d(2)[1], le(d(2), 24, 8)), (0x30, 128), "explicitly opened");
    assert_eq!(
        (d(3)[1], le(d(3), 16, 8), le(d(3), 24, 8)),
        (0x10, 192, 192),
        "empty"
    );

    // Room for two descriptors: the header still counts every match unless partial.
    let (_, r) = report(&mut h, 0, 0, false, (64 + 2 * 64 + 32) / 4);
    assert_eq!(le(&r, 0, 8), 8);
    assert!(
        r[192..].iter().all(|&b| b == 0),
        "zero filled past the descriptors"
    );
    let (_, r) = report(&mut h, 0, 0, true, (64 + 2 * 64) / 4);
    assert_eq!(le(&r, 0, 8), 2, "partial: those reported");
    // Filters, and a start inside a zone.
    let (_, r) = report(&mut h, 70, 1, false, 64);
    assert_eq!(le(&r, 0, 8), 5, "empty zones from zone 1 on: 3..=7");
    assert_eq!(le(&r, 64 + 16, 8), 192);
    for (filter, count) in [(2, 1), (3, 1), (4, 0), (5, 1), (6, 0), (7, 0)] {
        assert_eq!(
            le(&report(&mut h, 0, filter, false, 64).1, 0, 8),
            count,
            "filter {filter}"
        );
    }
    assert_eq!(
        report(&mut h, 0, 8, false, 64).0,
        Status::INVALID_FIELD,
        "no filter 8"
    );
    assert_eq!(
        report(&mut h, 0, 0, false, 15).0,
        Status::INVALID_FIELD,
        "shorter than the header"
    );
    assert_eq!(report(&mut h, 8 * 64, 0, false, 64).0, Status::LBA_OUT_OF_RANGE);
    let ext = Sqe::new(io::ZONE_MGMT_RECV).nsid(1).cdw(12, 63).cdw(13, 1);
    assert_eq!(
        h.cmd(1, ext).status,
        Status::INVALID_FIELD,
        "extended report: no extensions"
    );
}

#[test]
fn zone_append_with_protection_information() {
    let ns = |p| {
        NamespaceConfig::new(1, 512, 4 * ZONE)
            .with_metadata(8, true)
            .with_protection(p)
            .zoned(ZonedConfig::new(ZONE))
    };
    const PRACT: u32 = 1 << 29;
    const PIREMAP: u32 = 1 << 25;
    let mut h = host_css(config(vec![ns(Protection::last(PiType::Type1))]), 6);
    h.cmd(1, Sqe::rw(io::WRITE_ZEROES, 1, 64, 3)).ok();
    let data = pattern(2 * 512, 3);
    let (c, _) = append(&mut h, 64, &data, PRACT);
    assert_eq!(c.status, Status::INVALID_PROTECTION_INFO, "Type 1 needs PIREMAP");
    // ILBRT names the zone start; PIREMAP moves it to where the data lands.
    let buf = h.buffer_with(&data);
    let sqe = Sqe::rw(io::ZONE_APPEND, 1, 64, 2)
        .cdw(12, 1 | PRACT | PIREMAP)
        .cdw(14, 64)
        .sgl(sgl_desc(buf.get(), 1024, SGL_DATA));
    let c = h.cmd(1, sqe).ok();
    assert_eq!(c.dw0, 67);
    let meta = h.model.read_ns_meta(1, 67, 2).unwrap();
    assert_eq!(
        (PiTuple::read(&meta).ref_tag, PiTuple::read(&meta[8..]).ref_tag),
        (67, 68)
    );

    let mut h = host_css(config(vec![ns(Protection::last(PiType::Type3))]), 6);
    let (c, _) = append(&mut h, 0, &[0; 512], PRACT | PIREMAP);
    assert_eq!(
        c.status,
        Status::INVALID_PROTECTION_INFO,
        "Type 3 refuses PIREMAP"
    );
}
