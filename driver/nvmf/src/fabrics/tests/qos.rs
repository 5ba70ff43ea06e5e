//! Rate limits through the I/O queue decoders, counted against a fake clock: a limited host
//! gets its rate and no more while another host of the same subsystem is not held back; a
//! namespace limit holds over all hosts together; a change of limits reaches connected
//! queues at their next command.

use std::collections::BTreeMap;

use super::*;

/// An I/O queue of `host` (a new controller, enabled, one I/O queue).
fn queue_of(t: &mut Target, host: &str) -> IoQueue {
    let c = admin_connect_as(t, SUB, host, 0);
    enable(t, c);
    features(t, c, true, 0x07, 0).unwrap();
    let o = t
        .connect(
            &connect_sqe(1, 127, 0),
            &connect_data(SUB, host, c.0, HOSTID),
            conn(1),
        )
        .unwrap();
    o.io.unwrap()
}

fn read(nsid: u32, blocks: u32, bs: u32) -> Sqe {
    let mut r = sgl(
        sqe(vfpoll_nvme_spec::cmd::io_op::READ, nsid),
        SGL_TRANSPORT,
        blocks * bs,
    );
    r.dw[12] = blocks - 1;
    r
}

/// Offers a command every `step_ns` of fake time for `secs` seconds, as many as admitted at
/// each instant (a host with a deep queue); returns how many were admitted.
fn admitted(q: &mut IoQueue, cmd: &Sqe, start_ns: u64, step_ns: u64, secs: u64) -> u64 {
    let req = q.decode(cmd).unwrap();
    let mut n = 0;
    let mut t = start_ns;
    while t < start_ns + secs * 1_000_000_000 {
        while q.admit(&req, t) {
            n += 1;
            assert!(n < 10_000_000, "no limit");
        }
        t += step_ns;
    }
    n
}

fn limit(iops: Option<u64>, bytes_per_s: Option<u64>) -> RateLimit {
    RateLimit { iops, bytes_per_s }
}

#[test]
fn a_host_limit_holds_and_leaves_other_hosts_alone() {
    let mut t = target();
    let id = t.subsystem_id(SUB).unwrap();
    t.set_limits(
        id,
        Limits {
            hosts: BTreeMap::from([(HOST.to_owned(), limit(Some(1000), None))]),
            namespaces: BTreeMap::new(),
        },
    )
    .unwrap();
    let mut a = queue_of(&mut t, HOST);
    let mut b = queue_of(&mut t, HOST2);
    let r = read(1, 8, 512);
    let (ra, rb) = (a.decode(&r).unwrap(), b.decode(&r).unwrap());
    assert!(a.is_limited(&ra));
    assert!(!b.is_limited(&rb));
    // 10 s at a 100 us clock: 10,000 and the 50 ms burst.
    let n = admitted(&mut a, &r, 0, 100_000, 10);
    assert!((10_000..=10_051).contains(&n), "{n}");
    // The other host is not limited: each offer is admitted (the loop stops it at 10^7).
    let req = b.decode(&r).unwrap();
    assert!((0..100_000).all(|_| b.admit(&req, 0)));
    // A second queue of the limited host shares its bucket: together they get the rate.
    let mut a2 = queue_of(&mut t, HOST);
    let half = admitted(&mut a2, &r, 10_000_000_000, 100_000, 1);
    assert!((1_000..=1_051).contains(&half), "{half}");
}

#[test]
fn namespace_limits_hold_over_all_hosts_and_reloads_reach_connected_queues() {
    let mut t = target();
    let id = t.subsystem_id(SUB).unwrap();
    // Namespace 2 (4 KiB blocks): 1 MB/s.
    let mut limits = Limits::default();
    limits.namespaces.insert(2, limit(None, Some(1_000_000)));
    t.set_limits(id, limits.clone()).unwrap();
    let mut a = queue_of(&mut t, HOST);
    let mut b = queue_of(&mut t, HOST2);
    let r = read(2, 16, 4096); // 64 KiB
    let ra = a.decode(&r).unwrap();
    let rb = b.decode(&r).unwrap();
    let (mut bytes, mut tick) = (0u64, 0u64);
    while tick < 10_000_000_000 {
        for (q, req) in [(&a, &ra), (&b, &rb)] {
            if q.admit(req, tick) {
                bytes += 64 << 10;
            }
        }
        tick += 1_000_000;
    }
    assert!(
        (10_000_000..=10_000_000 + 3 * (64 << 10)).contains(&bytes),
        "{bytes} bytes in 10 s at 1 MB/s"
    );
    // Namespace 1 is not limited.
    let r1 = a.decode(&read(1, 1, 512)).unwrap();
    assert!(!a.is_limited(&r1));
    // A reload: 4 MB/s; the connected queues see it at their next command.
    limits.namespaces.insert(2, limit(None, Some(4_000_000)));
    t.set_limits(id, limits.clone()).unwrap();
    let n = admitted(&mut a, &r, tick, 1_000_000, 5);
    let bytes = n * (64 << 10);
    // It starts from the credit (or debt, at most one command) the 1 MB/s bucket had.
    assert!(
        (20_000_000 - 2 * (64 << 10)..=20_000_000 + 3 * (64 << 10)).contains(&bytes),
        "{bytes}"
    );
    // Removing the limit: unlimited from the next command on.
    limits.namespaces.clear();
    t.set_limits(id, limits).unwrap();
    let req = a.decode(&r).unwrap();
    assert!(!a.is_limited(&req));
    assert!(a.admit(&req, 0), "an unlimited command is always admitted");
}
