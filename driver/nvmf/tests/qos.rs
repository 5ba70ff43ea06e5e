//! Rate limits over loopback: a host limited at run time has its commands held back (and
//! all of them complete, in order), another host of the same subsystem is never held back,
//! and lifting the limit ends the holding back. Counted, not timed: the metrics say which
//! commands waited for credit.

use std::collections::BTreeMap;

use vfpoll_nvmf::fabrics::{Limits, RateLimit};
use vfpoll_nvmf::pdu::Digests;
use vfpoll_nvmf::testing::*;

const HOST2: &str = "nqn.2014-08.org.nvmexpress:uuid:66666666-7777-8888-9999-000000000000";

fn throttled(srv: &vfpoll_nvmf::server::Server, host: &str) -> u64 {
    srv.metrics().subsystems[SUB]
        .io
        .get(&(1, host.to_owned()))
        .map_or(0, |s| s.throttled)
}

#[test]
fn a_limited_host_waits_for_credit_and_others_do_not() {
    let srv = server_with(2);
    let addr = srv.local_addrs()[0];
    // 20 IOPS for HOST: a burst of one command (50 ms at 20/s), then one every 50 ms.
    let limits = Limits {
        hosts: BTreeMap::from([(
            HOST.to_owned(),
            RateLimit {
                iops: Some(20),
                bytes_per_s: None,
            },
        )]),
        namespaces: BTreeMap::new(),
    };
    srv.set_limits(SUB, limits).unwrap();
    let (_a, cntlid) = admin(addr, Digests::NONE);
    let mut q = io(addr, cntlid, Digests::NONE);
    let data = pattern(BS, 1);
    ok(&q.run(in_capsule(rw(WRITE, 0, 1), BS as u32), &data, &[], false).0);
    // 8 reads in flight at once: all complete, with the data, though most waited.
    for i in 0..8u16 {
        let mut r = rw(READ, 0, 1);
        r.set_cid(500 + i);
        q.send_capsule(&r, &[]);
    }
    let mut done = 0;
    while done < 8 {
        let rx = q.recv().expect("a PDU");
        match rx.pdu {
            vfpoll_nvmf::pdu::CtrlPdu::C2hData(_) => assert_eq!(rx.data, data),
            vfpoll_nvmf::pdu::CtrlPdu::CapsuleResp(r) => {
                assert_eq!(u16::from_le_bytes([r.cqe[12], r.cqe[13]]), 500 + done, "in order");
                done += 1;
            }
            other => panic!("{other:?}"),
        }
    }
    let held = throttled(&srv, HOST);
    assert!(
        held >= 6,
        "at most the write and one read pass at once: {held} held"
    );

    // HOST2, on the same subsystem and namespace, is not limited.
    let (_b, c2) = admin_to(addr, SUB, HOST2).unwrap();
    let mut q2 = Host::new(addr, Digests::NONE);
    ok(&q2
        .run(connect_sqe(1, 31), &connect_data_for(c2, SUB, HOST2), &[], false)
        .0);
    for _ in 0..20 {
        ok(&q2.run(rw(READ, 0, 1), &[], &[], false).0);
    }
    assert_eq!(throttled(&srv, HOST2), 0);

    // Lifted: HOST's next commands pass at once.
    srv.set_limits(SUB, Limits::default()).unwrap();
    for _ in 0..20 {
        ok(&q.run(rw(READ, 0, 1), &[], &[], false).0);
    }
    assert_eq!(throttled(&srv, HOST), held);
    srv.stop();
}
