//! Connect conformance over loopback TCP: Connect capsules built by hand the way different
//! initiators build them, each answer checked against what the NVMe over Fabrics 1.1
//! specification (§3.3, Connect command and response) and NVMe Base 2.0 require, and where
//! the specification leaves room, against what Linux's `nvmet` does.
//!
//! Cases: an empty HOSTNQN (a userspace initiator that was given none) on a subsystem that
//! allows any host and on one with an allow list; an empty HOSTNQN with a zero HOSTID; a
//! zero HOSTID with a host NQN; host NQNs of exactly 223 bytes and one past; SQSIZE at the
//! admin and I/O queue limits and one past; KATO 0 on an I/O and a discovery controller;
//! CATTR's bits; an I/O-queue Connect on another connection before the controller is
//! enabled. Every refusal must come with a `warn` log line naming the peer, the field, its
//! value and the rule.

use std::net::SocketAddr;
use std::sync::{Mutex, Once};

use vfpoll_nvme_spec::status::Sct;
use vfpoll_nvmf::backend::MallocBackend;
use vfpoll_nvmf::fabrics::{host_label, Cqe, NamespaceInfo, Subsystem, DISCOVERY_NQN, NQN_MAX};
use vfpoll_nvmf::pdu::Digests;
use vfpoll_nvmf::server::Server;
use vfpoll_nvmf::testing::*;

/// A subsystem that lists its hosts.
const LISTED: &str = "nqn.2024-01.io.vfpoll:listed";

/// A host NQN of exactly [`NQN_MAX`] (223) bytes.
fn max_nqn() -> String {
    let head = "nqn.2024-01.io.vfpoll:";
    let n = format!("{head}{}", "h".repeat(NQN_MAX - head.len()));
    assert_eq!(n.len(), NQN_MAX);
    n
}

/// Log lines at `warn` and above, gathered by a logger installed once for this binary.
static LOGS: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Gather;

impl log::Log for Gather {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Warn
    }

    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            LOGS.lock().unwrap().push(r.args().to_string());
        }
    }

    fn flush(&self) {}
}

fn gather_logs() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        static GATHER: Gather = Gather;
        log::set_logger(&GATHER).unwrap();
        log::set_max_level(log::LevelFilter::Warn);
    });
}

/// The warn lines of refused Connects that mention `needle`.
fn refusal_lines(needle: &str) -> Vec<String> {
    LOGS.lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains("Connect refused") && l.contains(needle))
        .cloned()
        .collect()
}

/// [`SUB`] (any host, a RAM namespace) and [`LISTED`] (only [`HOST`] and [`max_nqn`]).
fn server() -> Server {
    gather_logs();
    let mut sub = Subsystem::new(SUB);
    sub.namespaces.push(NamespaceInfo::new(
        SUB,
        1,
        "malloc:conformance",
        BS as u32,
        BLOCKS,
    ));
    let mut listed = Subsystem::new(LISTED);
    listed.allowed_hosts = Some(vec![HOST.to_owned(), max_nqn()]);
    let storage = MallocBackend::storage(BLOCKS as usize * BS);
    serve(vec![sub, listed], vec![Box::new(MallocBackend::new(storage, BS))])
}

/// Connect data as an initiator builds it; `hostnqn` bytes go in as given (no NUL added
/// past 255 bytes), so malformed fields can be sent.
fn data(cntlid: u16, subnqn: &str, hostnqn: &[u8], hostid: [u8; 16]) -> Vec<u8> {
    let mut d = vec![0u8; 1024];
    d[..16].copy_from_slice(&hostid);
    d[16..18].copy_from_slice(&cntlid.to_le_bytes());
    d[256..256 + subnqn.len()].copy_from_slice(subnqn.as_bytes());
    let n = hostnqn.len().min(256);
    d[512..512 + n].copy_from_slice(&hostnqn[..n]);
    d
}

/// Sends a Connect on a fresh connection: the host, if connected, and the completion.
fn connect(addr: SocketAddr, sqe: vfpoll_nvmf::fabrics::Sqe, data: &[u8]) -> (Host, Cqe) {
    let mut h = Host::new(addr, Digests::NONE);
    let (cqe, _) = h.run(sqe, data, &[], false);
    (h, cqe)
}

/// Sends the Connect of an admin queue (QID 0, CNTLID FFFFh: the target allocates one) with
/// these Connect data fields on a fresh connection: the host, if connected, and the completion.
fn connect_admin(addr: SocketAddr, subnqn: &str, hostnqn: &[u8], hostid: [u8; 16]) -> (Host, Cqe) {
    connect(addr, connect_sqe(0, 31), &data(0xffff, subnqn, hostnqn, hostid))
}

/// Asserts a refused Connect: DNR set, `sct`/`sc`, and dword 0 (IATTR and IPO) `dw0`.
fn refused(cqe: &Cqe, sc: u8, dw0: u32, why: &str) {
    let st = cqe.status();
    assert!(!st.is_success(), "{why}: accepted");
    assert!(st.dnr(), "{why}: Connect refusals carry DNR: {st:?}");
    let sct = if sc >= 0x80 {
        Sct::CommandSpecific
    } else {
        Sct::Generic
    };
    assert_eq!((st.sct(), st.sc()), (sct, sc), "{why}: {st:?}");
    assert_eq!(cqe.dw0, dw0, "{why}: IATTR/IPO");
}

const SC_INVALID_PARAMETERS: u8 = 0x82;
const SC_INVALID_HOST: u8 = 0x84;
const SC_COMMAND_SEQUENCE_ERROR: u8 = 0x0c;
/// Connect data offsets (NVMe-oF 1.1 Figure 20): IATTR 1 (bit 16) with the byte offset.
const IPO_HOSTNQN: u32 = 1 << 16 | 512;
const IPO_CNTLID: u32 = 1 << 16 | 16;
/// SQE offset of SQSIZE (IATTR 0).
const IPO_SQSIZE: u32 = 44;

/// Get Features Keep Alive Timer (FID 0Fh) on an admin queue.
fn get_kato(a: &mut Host) -> u32 {
    let mut g = sqe(0x0a, 0, 0);
    g.dw[10] = 0x0f;
    let (cqe, _) = a.run(g, &[], &[], false);
    ok(&cqe);
    cqe.dw0
}

/// An empty HOSTNQN is what an initiator sends when it was given no host NQN (the issue's
/// userspace initiator). NVMe-oF 1.1 §3.3 says the host NQN identifies the host, and NVMe
/// Base 2.0 §4.5 has no empty NQN; Linux's `nvmet` accepts it on a subsystem that allows any
/// host (its allow-any-host check never looks at the NQN), so this target does too, and the
/// host is known by HOSTID. Where a subsystem lists its hosts, an empty NQN names none of
/// them: Connect Invalid Host (SC 84h), IPO at HOSTNQN.
#[test]
fn an_empty_host_nqn_is_accepted_where_any_host_may_connect() {
    let srv = server();
    let addr = srv.local_addrs()[0];
    let hostid = *b"anonymous-host-1";
    let (mut a, cqe) = connect_admin(addr, SUB, b"", hostid);
    ok(&cqe);
    let cntlid = cqe.dw0 as u16;
    enable(&mut a);
    let info = srv.with_target(|t| t.controllers());
    let c = info.iter().find(|c| c.cntlid.0 == cntlid).unwrap();
    assert_eq!(c.hostnqn, "");
    assert_eq!(
        host_label(&c.hostnqn, &c.hostid),
        "hostid:616e6f6e-796d-6f75-732d-686f73742d31"
    );
    // Its I/O queue names the same empty NQN and HOSTID, on another connection; I/O works.
    let (mut q, cqe) = connect(addr, connect_sqe(1, 31), &data(cntlid, SUB, b"", hostid));
    ok(&cqe);
    let block = pattern(BS, 9);
    ok(&q
        .run(in_capsule(rw(WRITE, 3, 1), BS as u32), &block, &[], false)
        .0);
    let (cqe, back) = q.run(rw(READ, 3, 1), &[], &[], false);
    ok(&cqe);
    assert_eq!(back, block);
    // Another HOSTID cannot join that controller: it is another host (IPO at CNTLID).
    let (_, cqe) = connect(
        addr,
        connect_sqe(2, 31),
        &data(cntlid, SUB, b"", *b"anonymous-host-2"),
    );
    refused(&cqe, SC_INVALID_PARAMETERS, IPO_CNTLID, "another HOSTID");

    // The listing subsystem: Connect Invalid Host, and a warn line that says why.
    let (_, cqe) = connect_admin(addr, LISTED, b"", hostid);
    refused(&cqe, SC_INVALID_HOST, IPO_HOSTNQN, "empty NQN, allow list");
    let lines = refusal_lines("allows only the hosts it lists");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("127.0.0.1:") && l.contains("HOSTNQN = \"\"")),
        "{lines:?}"
    );
    // No NQN and a zero HOSTID leave the host no identity: refused even where any host may
    // connect (nvmet would accept it; a target that must tell hosts apart cannot).
    let (_, cqe) = connect_admin(addr, SUB, b"", [0; 16]);
    refused(&cqe, SC_INVALID_HOST, IPO_HOSTNQN, "empty NQN, zero HOSTID");
    assert!(!refusal_lines("zero HOSTID names no host").is_empty());
    // The refusals are counted for the listing subsystem and SUB.
    let ids: Vec<u64> = srv.with_target(|t| {
        [SUB, LISTED]
            .iter()
            .map(|n| t.refused_connects(t.subsystem_id(n).unwrap()))
            .collect()
    });
    assert_eq!(
        ids,
        [2, 1],
        "SUB: another HOSTID and no identity; LISTED: empty NQN"
    );
    srv.stop();
}

/// NVMe Base 2.0 §4.5: an NQN is at most 223 bytes, its 256-byte field NUL-terminated. A
/// 223-byte host NQN connects (and matches an allow list entry); 224 bytes, and 256 bytes
/// without a NUL, are Connect Invalid Parameters at HOSTNQN (nvmet truncates the field at
/// 255 bytes instead and would compare the truncated name).
#[test]
fn host_nqns_of_the_maximal_length_connect_and_longer_ones_are_refused() {
    let srv = server();
    let addr = srv.local_addrs()[0];
    let max = max_nqn();
    for sub in [SUB, LISTED] {
        let (mut a, cqe) = connect_admin(addr, sub, max.as_bytes(), HOSTID);
        ok(&cqe);
        enable(&mut a);
        assert!(srv.with_target(|t| t.controllers().iter().any(|c| c.hostnqn == max)));
    }
    let long = format!("{max}x");
    let (_, cqe) = connect_admin(addr, SUB, long.as_bytes(), HOSTID);
    refused(&cqe, SC_INVALID_PARAMETERS, IPO_HOSTNQN, "224 bytes");
    assert!(!refusal_lines("at most 223 bytes").is_empty());
    let unterminated = vec![b'n'; 256];
    let (_, cqe) = connect_admin(addr, SUB, &unterminated, HOSTID);
    refused(&cqe, SC_INVALID_PARAMETERS, IPO_HOSTNQN, "no NUL");
    assert!(!refusal_lines("ends with a NUL").is_empty());
    // A host the list does not name: Connect Invalid Host, the NQN in the log.
    let other = "nqn.2024-01.io.vfpoll:not-listed";
    let (_, cqe) = connect_admin(addr, LISTED, other.as_bytes(), HOSTID);
    refused(&cqe, SC_INVALID_HOST, IPO_HOSTNQN, "not listed");
    assert!(!refusal_lines(other).is_empty());
    srv.stop();
}

/// A zero HOSTID with a host NQN: NVMe Base 2.0 (Host Identifier feature, FID 81h) lets a
/// Host Identifier of 0h mean "none specified", and nvmet copies it without a check; the
/// controller connects and the host is known by its NQN.
#[test]
fn a_zero_host_id_with_a_host_nqn_connects() {
    let srv = server();
    let addr = srv.local_addrs()[0];
    let (mut a, cqe) = connect_admin(addr, SUB, HOST.as_bytes(), [0; 16]);
    ok(&cqe);
    let cntlid = cqe.dw0 as u16;
    enable(&mut a);
    let (_, cqe) = connect(
        addr,
        connect_sqe(1, 31),
        &data(cntlid, SUB, HOST.as_bytes(), [0; 16]),
    );
    ok(&cqe);
    let info = srv.with_target(|t| t.controllers());
    assert_eq!(host_label(&info[0].hostnqn, &info[0].hostid), HOST);
    srv.stop();
}

/// NVMe-oF 1.1 §3.3: SQSIZE is 0's based and at least 1; an admin queue holds at most 32
/// entries here (ASQSZ of the discovery log) and an I/O queue CAP.MQES + 1 (128 by default).
/// At the limit the queue connects and takes that many commands at once; one past is Connect
/// Invalid Parameters with IATTR 0 and IPO 44 (SQSIZE in the SQE).
#[test]
fn sqsize_at_the_limit_connects_and_one_past_is_refused() {
    let srv = server();
    let addr = srv.local_addrs()[0];
    let d = data(0xffff, SUB, HOST.as_bytes(), HOSTID);
    let (_, cqe) = connect(addr, connect_sqe(0, 32), &d);
    refused(&cqe, SC_INVALID_PARAMETERS, IPO_SQSIZE, "admin SQSIZE 32");
    let (_, cqe) = connect(addr, connect_sqe(0, 0), &d);
    refused(&cqe, SC_INVALID_PARAMETERS, IPO_SQSIZE, "admin SQSIZE 0");
    let (mut a, cqe) = connect(addr, connect_sqe(0, 31), &d);
    ok(&cqe);
    let cntlid = cqe.dw0 as u16;
    enable(&mut a);
    let io = data(cntlid, SUB, HOST.as_bytes(), HOSTID);
    let (_, cqe) = connect(addr, connect_sqe(1, 128), &io);
    refused(&cqe, SC_INVALID_PARAMETERS, IPO_SQSIZE, "I/O SQSIZE 128");
    assert!(!refusal_lines("SQSIZE = 128").is_empty());
    let (mut q, cqe) = connect(addr, connect_sqe(1, 127), &io);
    ok(&cqe);
    // 128 Flushes in flight at once: each completes, the SQHD of the last wraps to 0.
    let mut cids = Vec::new();
    for i in 0..128u16 {
        let mut f = sqe(0x00, 1, 0);
        f.set_cid(1000 + i);
        q.send_capsule(&f, &[]);
        cids.push(1000 + i);
    }
    let mut heads = Vec::new();
    while heads.len() < 128 {
        let rx = q.recv().expect("a completion");
        let vfpoll_nvmf::pdu::CtrlPdu::CapsuleResp(r) = rx.pdu else {
            panic!("{:?}", rx.pdu)
        };
        let cqe = Cqe::from_dwords(core::array::from_fn(|i| {
            u32::from_le_bytes(r.cqe[4 * i..4 * i + 4].try_into().unwrap())
        }));
        ok(&cqe);
        cids.retain(|&c| c != cqe.cid);
        heads.push(cqe.sq_head);
    }
    assert!(cids.is_empty(), "every command completed once");
    assert!(heads.contains(&0), "SQHD wrapped past entry 127: {heads:?}");
    srv.stop();
}

/// KATO 0 (NVMe Base 2.0 §3.9): no keep-alive timer on an I/O controller, and Get Features
/// reports 0; a discovery controller that asks for none gets 2 minutes (NVMe-oF 1.1 §3.3,
/// as nvmet).
#[test]
fn kato_zero_means_no_timer_except_on_discovery() {
    let srv = server();
    let addr = srv.local_addrs()[0];
    let mut s = connect_sqe(0, 31);
    s.dw[12] = 0;
    let (mut a, cqe) = connect(addr, s, &data(0xffff, SUB, HOST.as_bytes(), HOSTID));
    ok(&cqe);
    enable(&mut a);
    assert_eq!(get_kato(&mut a), 0);
    let (mut d, cqe) = connect(addr, s, &data(0xffff, DISCOVERY_NQN, HOST.as_bytes(), HOSTID));
    ok(&cqe);
    enable(&mut d);
    assert_eq!(get_kato(&mut d), 120_000);
    srv.stop();
}

/// CATTR (NVMe-oF 1.1 §3.3): bits 1:0 are the priority class, ignored without weighted round
/// robin arbitration (CAP.AMS reports none); bit 2 disables SQ flow control, after which the
/// SQHD of completions is reserved (reported as 0) rather than advancing; the other bits are
/// reserved and ignored, as nvmet ignores them.
#[test]
fn cattr_bits() {
    let srv = server();
    let addr = srv.local_addrs()[0];
    let (mut a, cqe) = connect_admin(addr, SUB, HOST.as_bytes(), HOSTID);
    ok(&cqe);
    let cntlid = cqe.dw0 as u16;
    enable(&mut a);
    let io = data(cntlid, SUB, HOST.as_bytes(), HOSTID);
    // Priority class 3 and reserved bits: connected, SQHD advances.
    let mut s = connect_sqe(1, 31);
    s.dw[11] |= (0b1111_1011u32) << 16;
    let (mut q, cqe) = connect(addr, s, &io);
    ok(&cqe);
    let heads: Vec<u16> = (0..3)
        .map(|_| q.run(sqe(0x00, 1, 0), &[], &[], false).0.sq_head)
        .collect();
    assert_eq!(heads, [2, 3, 4], "the Connect took entry 1");
    // SQ flow control disabled.
    let mut s = connect_sqe(2, 31);
    s.dw[11] |= (1u32 << 2) << 16;
    let (mut q, cqe) = connect(addr, s, &io);
    ok(&cqe);
    assert_eq!(cqe.sq_head, 0);
    for _ in 0..3 {
        assert_eq!(q.run(sqe(0x00, 1, 0), &[], &[], false).0.sq_head, 0);
    }
    srv.stop();
}

/// An I/O queue's Connect that arrives on its own connection before the host enabled the
/// controller (CC.EN and CSTS.RDY) is Command Sequence Error, as SPDK and nvmet answer (NVMe
/// Base 2.0 §3.5.1: I/O queues are set up after the controller is ready); once it is enabled,
/// the same Connect on the same connection succeeds.
#[test]
fn an_io_queue_before_the_controller_is_enabled_is_a_sequence_error() {
    let srv = server();
    let addr = srv.local_addrs()[0];
    let (mut a, cqe) = connect_admin(addr, SUB, HOST.as_bytes(), HOSTID);
    ok(&cqe);
    let cntlid = cqe.dw0 as u16;
    let io = data(cntlid, SUB, HOST.as_bytes(), HOSTID);
    let (mut q, cqe) = connect(addr, connect_sqe(1, 31), &io);
    refused(&cqe, SC_COMMAND_SEQUENCE_ERROR, 0, "before CC.EN");
    assert!(!refusal_lines("once the controller is enabled").is_empty());
    enable(&mut a);
    let (cqe, _) = q.run(connect_sqe(1, 31), &io, &[], false);
    ok(&cqe);
    ok(&q.run(rw(READ, 0, 1), &[], &[], false).0);
    srv.stop();
}
