//! The operators' counters after real traffic over loopback: per subsystem, namespace and
//! host, summed over two workers, as Prometheus text.

use vfpoll_nvmf::pdu::Digests;
use vfpoll_nvmf::testing::*;

#[test]
fn metrics_count_each_hosts_io_connections_and_refusals() {
    let srv = server_with(2);
    let addr = srv.local_addrs()[0];
    let (mut a, cntlid) = admin(addr, Digests::NONE);
    // Two I/O queues: on two workers (the admin queue took the first).
    let mut q1 = io(addr, cntlid, Digests::NONE);
    let mut q2 = Host::new(addr, Digests::NONE);
    ok(&q2.run(connect_sqe(2, 31), &connect_data(cntlid), &[], false).0);
    let data = pattern(4 * BS, 5);
    for q in [&mut q1, &mut q2] {
        ok(&q.run(rw(WRITE, 0, 4), &[], &data, false).0);
        for _ in 0..3 {
            ok(&q.run(rw(READ, 0, 4), &[], &[], false).0);
        }
        ok(&q.run(sqe(0x00, 1, 0), &[], &[], false).0);
        // Past the end: an error, counted.
        assert!(!q
            .run(rw(READ, BLOCKS, 1), &[], &[], false)
            .0
            .status()
            .is_success());
    }
    // A refused Connect (another subsystem's CNTLID rule: no such controller).
    let mut bad = Host::new(addr, Digests::NONE);
    assert!(!bad
        .run(connect_sqe(1, 31), &connect_data(999), &[], false)
        .0
        .status()
        .is_success());
    ok(&a.run(sqe(KEEP_ALIVE, 0, 0), &[], &[], false).0);

    let m = srv.metrics();
    let s = &m.subsystems[SUB];
    assert_eq!(s.connect_refusals, 1);
    assert_eq!(s.hosts[HOST].connections, 3, "admin and two I/O queues");
    let st = &s.io[&(1, HOST.to_owned())];
    // Out-of-range reads are refused at decoding, before a namespace is reached: counted as
    // I/O errors of the target (Server::stats), not here.
    assert_eq!((st.reads, st.writes, st.others), (6, 2, 2), "{st:?}");
    assert_eq!(
        (st.read_bytes, st.written_bytes),
        (6 * 4 * BS as u64, 2 * 4 * BS as u64)
    );
    assert_eq!(st.latency.iter().sum::<u64>(), 10);
    let text = m.to_prometheus();
    let l = format!("subsystem=\"{SUB}\",nsid=\"1\",host=\"{HOST}\"");
    for want in [
        format!("vfpoll_nvmf_io_commands_total{{{l},op=\"read\"}} 6"),
        format!(
            "vfpoll_nvmf_io_bytes_total{{{l},direction=\"write\"}} {}",
            2 * 4 * BS
        ),
        format!("vfpoll_nvmf_io_latency_seconds_count{{{l}}} 10"),
        format!("vfpoll_nvmf_connections{{subsystem=\"{SUB}\",host=\"{HOST}\"}} 3"),
        format!("vfpoll_nvmf_connect_refusals_total{{subsystem=\"{SUB}\"}} 1"),
    ] {
        assert!(text.lines().any(|x| x == want), "missing {want:?} in\n{text}");
    }
    drop((q1, q2));
    // Closed queues leave the gauge (the workers notice the close within a round).
    let t = std::time::Instant::now();
    while srv.metrics().subsystems[SUB].hosts[HOST].connections != 1 {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(5),
            "{:?}",
            srv.metrics()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(srv.metrics().subsystems[SUB].hosts[HOST].connections_total, 3);
    srv.stop();
}
