//! Tests of the controller against byte-level expectations: the spec's field offsets, the
//! sequence Linux's initiator runs at connect time, and what it checks.

mod admin;
mod ana;
mod connect;
mod io;
mod props;
mod qos;

use vfpoll_nvme_spec::cmd::{admin_op, Command};
use vfpoll_nvme_spec::status::Status;

use super::*;

pub(super) const SUB: &str = "nqn.2024-01.io.vfpoll:test";
pub(super) const OTHER: &str = "nqn.2024-01.io.vfpoll:other";
pub(super) const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555";
pub(super) const HOST2: &str = "nqn.2014-08.org.nvmexpress:uuid:66666666-7777-8888-9999-000000000000";
pub(super) const HOSTID: [u8; 16] = *b"host-identifier!";

/// Namespace 1: 1000 blocks of 512 B, volatile write cache, Write Zeroes, deallocation;
/// namespace 2: 100 blocks of 4 KiB, none of those.
pub(super) fn subsystem(nqn: &str) -> Subsystem {
    let mut s = Subsystem::new(nqn);
    let mut a = NamespaceInfo::new(nqn, 1, "malloc:a", 512, 1000);
    a.volatile_write_cache = true;
    a.write_zeroes = true;
    a.deallocate = true;
    s.namespaces.push(a);
    s.namespaces
        .push(NamespaceInfo::new(nqn, 2, "malloc:b", 4096, 100));
    s
}

pub(super) fn listeners() -> Vec<Listener> {
    vec![
        Listener::tcp(1, "127.0.0.1:4420".parse().unwrap()),
        Listener::tcp(2, "0.0.0.0:4421".parse().unwrap()),
    ]
}

pub(super) fn target() -> Target {
    let mut other = subsystem(OTHER);
    other.allowed_hosts = Some(vec![HOST2.to_owned()]);
    Target::new(TargetOptions::default(), listeners(), vec![subsystem(SUB), other]).unwrap()
}

pub(super) fn conn(portid: u16) -> ConnInfo {
    ConnInfo {
        portid,
        local_addr: Some("10.0.0.5".into()),
        peer: "10.0.0.9:50000".into(),
    }
}

/// A command as Linux's TCP host sends it: PSDT 01b, a command ID, a null transport SGL.
pub(super) fn sqe(opcode: u8, nsid: u32) -> Sqe {
    let mut c = Command::new(opcode, nsid);
    c.set_cid(0x1234);
    c.dw[0] |= 1 << 14;
    c.dw[9] = (SGL_TRANSPORT as u32) << 24;
    c
}

/// `s` with an SGL descriptor: identifier `id`, `len` bytes (address 0).
pub(super) fn sgl(mut s: Sqe, id: u8, len: u32) -> Sqe {
    s.dw[6] = 0;
    s.dw[7] = 0;
    s.dw[8] = len;
    s.dw[9] = (id as u32) << 24;
    s
}

pub(super) fn fabrics_sqe(fct: u8) -> Sqe {
    let mut s = sqe(FABRICS_OPCODE, 0);
    s.dw[1] = fct as u32;
    s
}

pub(super) fn connect_sqe(qid: u16, sqsize: u16, kato_ms: u32) -> Sqe {
    let mut s = sgl(fabrics_sqe(fctype::CONNECT), SGL_IN_CAPSULE, 1024);
    s.dw[10] = (qid as u32) << 16;
    s.dw[11] = sqsize as u32;
    s.dw[12] = kato_ms;
    s
}

pub(super) fn connect_data(subnqn: &str, hostnqn: &str, cntlid: u16, hostid: [u8; 16]) -> [u8; 1024] {
    let mut d = [0u8; 1024];
    d[..16].copy_from_slice(&hostid);
    d[16..18].copy_from_slice(&cntlid.to_le_bytes());
    d[256..256 + subnqn.len()].copy_from_slice(subnqn.as_bytes());
    d[512..512 + hostnqn.len()].copy_from_slice(hostnqn.as_bytes());
    d
}

pub(super) fn admin_connect_as(t: &mut Target, subnqn: &str, hostnqn: &str, kato_ms: u32) -> Cntlid {
    let o = t
        .connect(
            &connect_sqe(0, 31, kato_ms),
            &connect_data(subnqn, hostnqn, 0xffff, HOSTID),
            conn(1),
        )
        .unwrap_or_else(|c| panic!("admin connect refused: {c:?}"));
    assert_eq!(o.queue.qid, 0);
    Cntlid(o.cqe.dw0 as u16)
}

pub(super) fn admin_connect(t: &mut Target) -> Cntlid {
    admin_connect_as(t, SUB, HOST, 15_000)
}

pub(super) fn complete(o: AdminOutcome) -> (Cqe, Vec<u8>) {
    match o {
        AdminOutcome::Complete { cqe, data, .. } => {
            assert_eq!(cqe.status & 1, 0, "no phase tag on fabrics");
            (cqe, data)
        }
        AdminOutcome::Held => panic!("held"),
    }
}

pub(super) fn prop_set(t: &mut Target, c: Cntlid, offset: u32, value: u32) -> (Cqe, Option<AdminEffect>) {
    let mut s = fabrics_sqe(fctype::PROPERTY_SET);
    s.dw[11] = offset;
    s.dw[12] = value;
    match t.admin(c, &s, &[]) {
        AdminOutcome::Complete { cqe, effect, .. } => (cqe, effect),
        AdminOutcome::Held => panic!("held"),
    }
}

pub(super) fn prop_get(t: &mut Target, c: Cntlid, offset: u32, eight: bool) -> Result<u64, Status> {
    let mut s = fabrics_sqe(fctype::PROPERTY_GET);
    s.dw[10] = eight as u32;
    s.dw[11] = offset;
    let (cqe, data) = complete(t.admin(c, &s, &[]));
    assert!(data.is_empty());
    if cqe.status().is_success() {
        Ok(cqe.dw0 as u64 | (cqe.dw1 as u64) << 32)
    } else {
        Err(cqe.status())
    }
}

/// CC as Linux's nvme_enable_ctrl writes it: EN, IOSQES 6, IOCQES 4, 4 KiB pages, NVM.
pub(super) const LINUX_CC: u32 = 1 | 6 << 16 | 4 << 20;

pub(super) fn enable(t: &mut Target, c: Cntlid) {
    let (cqe, _) = prop_set(t, c, prop::CC, LINUX_CC);
    assert!(cqe.status().is_success());
    assert_eq!(prop_get(t, c, prop::CSTS, false), Ok(csts::RDY as u64));
}

pub(super) fn identify(t: &mut Target, c: Cntlid, cns: u8, nsid: u32) -> Result<Vec<u8>, Status> {
    let mut s = sgl(sqe(admin_op::IDENTIFY, nsid), SGL_TRANSPORT, 4096);
    s.dw[10] = cns as u32;
    let (cqe, data) = complete(t.admin(c, &s, &[]));
    if cqe.status().is_success() {
        assert_eq!(data.len(), 4096);
        Ok(data)
    } else {
        assert!(data.is_empty());
        Err(cqe.status())
    }
}

pub(super) fn get_log(
    t: &mut Target,
    c: Cntlid,
    lid: u8,
    nsid: u32,
    len: u32,
    offset: u64,
    rae: bool,
) -> Result<Vec<u8>, Status> {
    log_data(t, c, &log_sqe(lid, nsid, len, offset, rae), len)
}

/// Get Log Page `lid` of `len` bytes from `offset` (RAE: Retain Asynchronous Event).
pub(super) fn log_sqe(lid: u8, nsid: u32, len: u32, offset: u64, rae: bool) -> Sqe {
    let mut s = sgl(sqe(admin_op::GET_LOG_PAGE, nsid), SGL_TRANSPORT, len);
    let numd = len / 4 - 1;
    s.dw[10] = lid as u32 | (rae as u32) << 15 | (numd & 0xffff) << 16;
    s.dw[11] = numd >> 16;
    s.dw[12] = offset as u32;
    s.dw[13] = (offset >> 32) as u32;
    s
}

/// Runs Get Log Page `s` of `len` bytes: the page, exactly that long, or the status.
pub(super) fn log_data(t: &mut Target, c: Cntlid, s: &Sqe, len: u32) -> Result<Vec<u8>, Status> {
    let (cqe, data) = complete(t.admin(c, s, &[]));
    if cqe.status().is_success() {
        assert_eq!(data.len(), len as usize);
        Ok(data)
    } else {
        Err(cqe.status())
    }
}

/// Get or Set Features with CDW10 `dw10` (FID, SEL or SV) and CDW11 `dw11`.
pub(super) fn features(t: &mut Target, c: Cntlid, set: bool, dw10: u32, dw11: u32) -> Result<u32, Status> {
    let op = if set {
        admin_op::SET_FEATURES
    } else {
        admin_op::GET_FEATURES
    };
    let mut s = sgl(sqe(op, 0), SGL_TRANSPORT, 0);
    s.dw[10] = dw10;
    s.dw[11] = dw11;
    let (cqe, _) = complete(t.admin(c, &s, &[]));
    if cqe.status().is_success() {
        Ok(cqe.dw0)
    } else {
        Err(cqe.status())
    }
}

pub(super) fn io_connect(t: &mut Target, c: Cntlid, qid: u16) -> IoQueue {
    let o = t
        .connect(
            &connect_sqe(qid, 127, 0),
            &connect_data(SUB, HOST, c.0, HOSTID),
            conn(1),
        )
        .unwrap_or_else(|e| panic!("I/O connect refused: {e:?}"));
    assert_eq!(o.queue, QueueRef { cntlid: c, qid });
    assert_eq!((o.cqe.dw0, o.entries, o.in_capsule_max), (c.0 as u32, 128, 8192));
    o.io.expect("an I/O queue decoder")
}

/// A controller of `SUB` connected, enabled, with its AEN configured as Linux does.
pub(super) fn ready(t: &mut Target) -> Cntlid {
    let c = admin_connect(t);
    enable(t, c);
    features(t, c, true, 0x0b, ctrl_val::OAES_NS_ATTR).unwrap();
    c
}

pub(super) fn le16(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}

pub(super) fn le32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}

pub(super) fn le64(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

pub(super) fn cstr(b: &[u8]) -> &str {
    let end = b.iter().position(|&x| x == 0).unwrap_or(b.len());
    std::str::from_utf8(&b[..end]).unwrap()
}
