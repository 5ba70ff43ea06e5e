//! A running target changed under its hosts (`Server::add_listener`, `remove_listener`,
//! `add_namespace`, `remove_namespace`, `add_subsystem`, `remove_subsystem`,
//! `set_allowed_hosts`, `set_ana_state`): what hosts see on the wire (held Asynchronous Event
//! Requests completed, connections of a removed listener or subsystem closed, I/O to a removed
//! namespace or through an inaccessible path refused) and the per-subsystem counters.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use vfpoll_nvme_spec::cmd::admin_op;
use vfpoll_nvme_spec::status::{Sct, Status};
use vfpoll_nvmf::backend::{Backend, MallocBackend};
use vfpoll_nvmf::fabrics::{AnaState, Cqe, Listener, NamespaceInfo, Subsystem};
use vfpoll_nvmf::pdu::CtrlPdu;
use vfpoll_nvmf::server::Server;
use vfpoll_nvmf::testing::*;

/// Completion dword 0 of a Namespace Attribute Changed notice: type 2 (notice), information
/// 00h, log page 04h (NVMe Base 2.0 §5.2, Figure 146).
const NS_CHANGED: u32 = 0x0004_0002;
/// An Asymmetric Namespace Access Change notice: information 03h, log page 0Ch.
const ANA_CHANGED: u32 = 0x000c_0302;

/// Enables the notices in `aec` (Set Features 0Bh) and sends an Asynchronous Event Request,
/// which the target holds; returns its CID.
fn arm_aer(a: &mut Host, aec: u32) -> u16 {
    let mut set = sqe(admin_op::SET_FEATURES, 0, 0);
    set.dw[10] = 0x0b;
    set.dw[11] = aec;
    ok(&a.run(set, &[], &[], false).0);
    let mut aer = sqe(admin_op::ASYNC_EVENT_REQUEST, 0, 0);
    a.cid = a.cid.wrapping_add(1);
    aer.set_cid(a.cid);
    a.send_capsule(&aer, &[]);
    a.cid
}

/// The next completion on `h` (nothing else may come first).
fn next_cqe(h: &mut Host) -> Cqe {
    match h.recv().map(|r| r.pdu) {
        Some(CtrlPdu::CapsuleResp(r)) => Cqe::from_dwords(core::array::from_fn(|i| {
            u32::from_le_bytes(r.cqe[4 * i..4 * i + 4].try_into().unwrap())
        })),
        other => panic!("expected a completion, got {other:?}"),
    }
}

/// Reads the Changed Namespace List (log page 04h): its first NSIDs.
fn changed_namespaces(a: &mut Host) -> Vec<u32> {
    let mut get = sqe(admin_op::GET_LOG_PAGE, 0, 4096);
    get.dw[10] = 0x04 | (1023 << 16);
    let (c, data) = a.run(get, &[], &[], false);
    ok(&c);
    data.chunks(4)
        .take(4)
        .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

fn ram(blocks: u64) -> Box<dyn Backend> {
    Box::new(MallocBackend::new(
        MallocBackend::storage(blocks as usize * BS),
        BS,
    ))
}

/// A write then a read of namespace `nsid` through I/O queue `q`: the completions' statuses.
fn write_read(q: &mut Host, nsid: u32, seed: u8) -> (Cqe, Cqe) {
    let data = pattern(2 * BS, seed);
    let mut w = rw(WRITE, 8, 2);
    w.dw[1] = nsid;
    let (wc, _) = q.run(w, &[], &data, false);
    let mut r = rw(READ, 8, 2);
    r.dw[1] = nsid;
    let (rc, back) = q.run(r, &[], &[], false);
    if rc.status().is_success() {
        assert_eq!(back, data, "namespace {nsid} read back");
    }
    (wc, rc)
}

/// Whether the peer closed `h`'s connection (within the host's read timeout).
fn closed(h: &mut Host) -> bool {
    h.recv().is_none()
}

fn refused(addr: SocketAddr) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(5) {
        if TcpStream::connect(addr).is_err() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

#[test]
fn a_listener_added_at_run_time_serves_and_removing_it_closes_only_its_connections() {
    let srv = server();
    let first = srv.local_addrs()[0];
    let second = srv
        .add_listener(Listener::tcp(2, "127.0.0.1:0".parse().unwrap()))
        .unwrap();
    assert_eq!(srv.local_addrs(), vec![first, second]);
    assert!(
        srv.add_listener(Listener::tcp(2, "127.0.0.1:0".parse().unwrap()))
            .is_err(),
        "port ID 2 twice"
    );
    let (_a1, c1) = admin(first, Default::default());
    let mut q1 = io(first, c1, Default::default());
    let (mut a2, c2) = admin(second, Default::default());
    let mut q2 = io(second, c2, Default::default());
    ok(&write_read(&mut q2, 1, 1).1);

    srv.remove_listener(2).unwrap();
    assert!(
        closed(&mut q2) && closed(&mut a2),
        "the removed listener's connections close"
    );
    assert!(refused(second), "{second} still accepts");
    ok(&write_read(&mut q1, 1, 2).1);
    assert_eq!(srv.local_addrs(), vec![first]);
    assert!(srv.remove_listener(2).is_err(), "removing it twice");
}

/// The test target's 4 KiB transfers leave room for one namespace (MNAN: its ANA log must fit
/// one transfer), so namespace 1 itself is removed and added back.
#[test]
fn a_namespace_removed_and_added_at_run_time_raises_events_and_serves_io_meanwhile() {
    let srv = server();
    let addr = srv.local_addrs()[0];
    let (mut a, cntlid) = admin(addr, Default::default());
    let mut q = io(addr, cntlid, Default::default());
    ok(&write_read(&mut q, 1, 1).1);

    let aer = arm_aer(&mut a, 1 << 8);
    srv.remove_namespace(SUB, 1).unwrap();
    let c = next_cqe(&mut a);
    assert_eq!((c.cid, c.dw0), (aer, NS_CHANGED), "the held AER completes");
    let (w, _) = write_read(&mut q, 1, 2);
    assert_eq!(w.status(), Status::INVALID_NAMESPACE);
    assert!(srv.remove_namespace(SUB, 1).is_err(), "removed twice");
    // The host reads the Changed Namespace List, as Linux does: that re-arms the notice.
    assert_eq!(&changed_namespaces(&mut a)[..2], &[1, 0]);

    let mut ns = NamespaceInfo::new(SUB, 1, "malloc:runtime", BS as u32, 256);
    ns.write_zeroes = true;
    assert!(
        srv.add_namespace(SUB, ns.clone(), vec![]).is_err(),
        "one backend per worker"
    );
    let aer = arm_aer(&mut a, 1 << 8);
    srv.add_namespace(SUB, ns.clone(), vec![ram(256)]).unwrap();
    let c = next_cqe(&mut a);
    assert_eq!((c.cid, c.dw0), (aer, NS_CHANGED));
    assert!(
        srv.add_namespace(SUB, ns, vec![ram(256)]).is_err(),
        "NSID 1 twice"
    );
    let (w, r) = write_read(&mut q, 1, 3);
    ok(&w);
    ok(&r);

    // Counted per subsystem: the admin and I/O queues, and the commands on them.
    let stats: HashMap<String, _> = srv.subsystem_stats().into_iter().collect();
    let s = stats[SUB];
    assert_eq!((s.active, s.accepted), (2, 2), "{s:?}");
    assert!(s.io_commands >= 6 && s.io_errors >= 1, "{s:?}");
    assert_eq!(s.written_bytes, 2 * 2 * BS as u64, "{s:?}");
    assert_eq!(s.read_bytes, 2 * 2 * BS as u64, "{s:?}");
}

#[test]
fn subsystems_added_and_removed_at_run_time_and_their_allowed_hosts() {
    const SUB2: &str = "nqn.2024-01.io.vfpoll:runtime-two";
    const OTHER: &str = "nqn.2014-08.org.nvmexpress:uuid:99999999-2222-3333-4444-555555555555";
    let srv = server();
    let addr = srv.local_addrs()[0];
    assert!(admin_to(addr, SUB2, HOST).is_err(), "no such subsystem yet");
    let mut sub = Subsystem::new(SUB2);
    sub.namespaces
        .push(NamespaceInfo::new(SUB2, 1, "malloc:runtime-two", BS as u32, 64));
    assert!(
        srv.add_subsystem(sub.clone(), HashMap::new()).is_err(),
        "backends missing"
    );
    srv.add_subsystem(sub, HashMap::from([(1, vec![ram(64)])]))
        .unwrap();
    let (mut a, cntlid) = admin_to(addr, SUB2, HOST).unwrap();
    let mut q = io_to(addr, SUB2, cntlid);
    ok(&write_read(&mut q, 1, 6).1);

    // Only OTHER may connect from now on; the controller already there stays.
    srv.set_allowed_hosts(SUB2, Some(vec![OTHER.into()])).unwrap();
    let no = admin_to(addr, SUB2, HOST).unwrap_err();
    assert_eq!(
        (no.status().sct(), no.status().sc()),
        (Sct::CommandSpecific, 0x84),
        "Connect Invalid Host"
    );
    assert!(admin_to(addr, SUB2, OTHER).is_ok());
    ok(&write_read(&mut q, 1, 7).1);
    assert!(srv
        .set_allowed_hosts(SUB2, Some(vec!["not an nqn".into()]))
        .is_err());

    srv.remove_subsystem(SUB2).unwrap();
    assert!(
        closed(&mut q) && closed(&mut a),
        "the removed subsystem's controllers end"
    );
    assert!(admin_to(addr, SUB2, OTHER).is_err());
    assert!(srv.remove_subsystem(SUB2).is_err());
    let (_a, c1) = admin(addr, Default::default());
    ok(&write_read(&mut io(addr, c1, Default::default()), 1, 8).1);
}

#[test]
fn an_inaccessible_path_refuses_io_with_a_path_error_and_tells_the_host() {
    let srv: Server = server();
    let addr = srv.local_addrs()[0];
    let (mut a, cntlid) = admin(addr, Default::default());
    let mut q = io(addr, cntlid, Default::default());
    let aer = arm_aer(&mut a, 1 << 11);
    srv.set_ana_state(1, 1, AnaState::Inaccessible).unwrap();
    let c = next_cqe(&mut a);
    assert_eq!((c.cid, c.dw0), (aer, ANA_CHANGED));
    let (w, _) = write_read(&mut q, 1, 9);
    assert_eq!(
        (w.status().sct(), w.status().sc(), w.status().dnr()),
        (Sct::Path, 0x02, false)
    );
    srv.set_ana_state(1, 1, AnaState::Optimized).unwrap();
    ok(&write_read(&mut q, 1, 10).1);
    assert!(
        srv.set_ana_state(9, 1, AnaState::Optimized).is_err(),
        "no listener 9"
    );
}
