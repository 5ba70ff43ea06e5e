//! The NVMe/TCP target over loopback TCP, driven by a test host built from the PDU module's
//! host-side builders: ICReq, Connect of an admin and an I/O queue to a RAM namespace,
//! Identify, writes with in-capsule data and through R2T, reads back, flush, Write Zeroes,
//! Dataset Management, with and without digests; bad PDUs end only their own connection; two
//! workers sharing connections (and a controller's queues) between them.

use std::io::Write;
use std::net::{Shutdown, SocketAddr};
use std::time::Duration;

use vfpoll_dma::{DmaBuf, DmaPool};
use vfpoll_nvmf::backend::{Backend, Busy, Completion, MallocBackend, Op};
use vfpoll_nvmf::fabrics::{fctype, prop, FABRICS_OPCODE};
use vfpoll_nvmf::pdu::{h2c_data_header, ic_req, Digests, Fes, H2cData, IcReq};
use vfpoll_nvmf::server::Server;
use vfpoll_nvmf::testing::*;

/// Writes in-capsule and through R2T, reads back, flush, Write Zeroes, DSM, an LBA past the
/// end, on connections with `digests`.
fn exercise(addr: SocketAddr, digests: Digests) {
    let (mut a, cntlid) = admin(addr, digests);
    let mut q = io(addr, cntlid, digests);
    // 1 KiB in the capsule.
    let small = pattern(ICD as usize, 1);
    let (cqe, _) = q.run(in_capsule(rw(WRITE, 8, 2), ICD), &small, &[], false);
    ok(&cqe);
    let (cqe, got) = q.run(rw(READ, 8, 2), &[], &[], false);
    ok(&cqe);
    assert_eq!(got, small);
    // 64 KiB through R2T in 4 KiB commands (an R2T each, 4 H2CData PDUs per R2T).
    let big = pattern(64 << 10, 7);
    for (i, chunk) in big.chunks(4096).enumerate() {
        let (cqe, _) = q.run(rw(WRITE, 100 + 8 * i as u64, 8), &[], chunk, false);
        ok(&cqe);
    }
    let mut got = Vec::new();
    for i in 0..16 {
        let (cqe, part) = q.run(rw(READ, 100 + 8 * i, 8), &[], &[], false);
        ok(&cqe);
        got.extend(part);
    }
    assert!(got == big, "64 KiB read back differs");
    // Flush, Write Zeroes of 2 blocks, Deallocate 2 more (reads back as zeroes here).
    ok(&q.run(sqe(0x00, 1, 0), &[], &[], false).0);
    let mut wz = sqe(0x08, 1, 0);
    wz.set_lba_range(101, 2);
    ok(&q.run(wz, &[], &[], false).0);
    let mut dsm = in_capsule(sqe(0x09, 1, 0), 16);
    dsm.dw[10] = 0;
    dsm.dw[11] = 1 << 2;
    let mut range = [0u8; 16];
    range[4..8].copy_from_slice(&2u32.to_le_bytes());
    range[8..16].copy_from_slice(&104u64.to_le_bytes());
    ok(&q.run(dsm, &range, &[], false).0);
    let (cqe, got) = q.run(rw(READ, 100, 8), &[], &[], false);
    ok(&cqe);
    let mut want = big[..8 * BS].to_vec();
    want[BS..3 * BS].fill(0);
    want[4 * BS..6 * BS].fill(0);
    assert!(got == want, "zeroed and deallocated blocks");
    // An LBA past the end: LBA Out of Range, the connection goes on.
    let (cqe, _) = q.run(rw(READ, BLOCKS - 1, 2), &[], &[], false);
    assert_eq!(
        (cqe.status().sct().bits(), cqe.status().sc()),
        (0, 0x80),
        "{:?}",
        cqe.status()
    );
    // An unknown opcode: Invalid Opcode, the connection goes on.
    let (cqe, _) = q.run(sqe(0xe7, 1, 0), &[], &[], false);
    assert_eq!(cqe.status().sc(), 0x01, "{:?}", cqe.status());
    let (cqe, got) = q.run(rw(READ, 8, 2), &[], &[], false);
    ok(&cqe);
    assert_eq!(got, small);
    if digests.data {
        // A data digest error fails its command with Transient Transport Error only.
        let (cqe, _) = q.run(rw(WRITE, 200, 8), &[], &big[..8 * BS], true);
        assert_eq!(cqe.status().sc(), 0x22, "{:?}", cqe.status());
        ok(&q.run(rw(READ, 8, 1), &[], &[], false).0);
    }
    // Keep Alive on the admin queue still answers.
    ok(&a.run(sqe(KEEP_ALIVE, 0, 0), &[], &[], false).0);
}

#[test]
fn admin_and_io_queues_without_digests() {
    let srv = server();
    exercise(srv.local_addrs()[0], Digests::NONE);
    let st = srv.stats();
    assert!(
        st.commands > 10 && st.read_bytes >= 64 << 10 && st.written_bytes >= 64 << 10,
        "{st:?}"
    );
    srv.stop();
}

#[test]
fn admin_and_io_queues_with_header_and_data_digests() {
    let srv = server();
    exercise(
        srv.local_addrs()[0],
        Digests {
            header: true,
            data: true,
        },
    );
    srv.stop();
}

#[test]
fn bad_pdus_end_only_their_connection() {
    let srv = server();
    let addr = srv.local_addrs()[0];
    let (mut a, cntlid) = admin(addr, Digests::NONE);
    let mut q = io(addr, cntlid, Digests::NONE);
    let data = pattern(ICD as usize, 3);
    ok(&q.run(in_capsule(rw(WRITE, 0, 2), ICD), &data, &[], false).0);

    // ICReq with PFV 1: Unsupported Parameter.
    let mut h = Host::tcp(addr);
    let mut out = [0u8; 128];
    let n = ic_req(
        &mut out,
        &IcReq {
            pfv: 1,
            hpda: 0,
            digests: Digests::NONE,
            maxr2t: 0,
        },
    )
    .unwrap();
    h.s.write_all(&out[..n]).unwrap();
    h.expect_term(Some(Fes::UnsupportedParameter));

    // An unknown PDU type after the ICReq: Invalid PDU Header Field.
    let mut h = Host::new(addr, Digests::NONE);
    h.s.write_all(&[0x0a, 0, 24, 0, 24, 0, 0, 0]).unwrap();
    h.expect_term(Some(Fes::InvalidHeaderField));

    // A capsule whose HLEN is wrong: Invalid PDU Header Field.
    let mut h = Host::new(addr, Digests::NONE);
    h.s.write_all(&[0x04, 0, 24, 0, 72, 0, 0, 0]).unwrap();
    h.expect_term(Some(Fes::InvalidHeaderField));

    // H2CData for no command: Invalid PDU Header Field (CCCID).
    let mut h = Host::new(addr, Digests::NONE);
    let d = H2cData {
        cccid: 77,
        ttag: 77,
        datao: 0,
        datal: 4,
        last: true,
    };
    let n = h2c_data_header(&mut out, &d, &h.params).unwrap().len;
    let mut msg = out[..n].to_vec();
    msg.extend_from_slice(&[1, 2, 3, 4]);
    h.s.write_all(&msg).unwrap();
    h.expect_term(Some(Fes::InvalidHeaderField));

    // A truncated capsule, then the host closes: the connection just ends.
    let mut h = Host::new(addr, Digests::NONE);
    h.s.write_all(&[0x04, 0, 72, 0, 72, 0, 0, 0, 1, 2, 3]).unwrap();
    h.s.shutdown(Shutdown::Write).unwrap();
    h.expect_term(None);

    // A command before Connect on a new queue: refused with a completion (Invalid Opcode).
    let mut h = Host::new(addr, Digests::NONE);
    let (cqe, _) = h.run(rw(READ, 0, 1), &[], &[], false);
    assert!(!cqe.status().is_success());

    // The first connections still work.
    let (cqe, got) = q.run(rw(READ, 0, 2), &[], &[], false);
    ok(&cqe);
    assert_eq!(got, data);
    ok(&a.run(sqe(KEEP_ALIVE, 0, 0), &[], &[], false).0);
    assert!(srv.stats().protocol_errors >= 4, "{:?}", srv.stats());
    srv.stop();
}

#[test]
fn closing_the_admin_queue_ends_the_controller() {
    let srv = server();
    let addr = srv.local_addrs()[0];
    let (a, cntlid) = admin(addr, Digests::NONE);
    let mut q = io(addr, cntlid, Digests::NONE);
    drop(a);
    // The I/O queue's connection is closed by the target once the association is gone.
    assert!(q.recv().is_none());
    // The CNTLID is gone: a new I/O queue cannot join it.
    let mut q = Host::new(addr, Digests::NONE);
    let (cqe, _) = q.run(connect_sqe(1, 31), &connect_data(cntlid), &[], false);
    assert!(!cqe.status().is_success());
    srv.stop();
}

/// An enabled admin queue whose Connect asked for a keep-alive timeout of `kato_ms`, and an
/// I/O queue of its controller.
fn admin_and_io_with_kato(addr: SocketAddr, kato_ms: u32) -> (Host, Host) {
    let mut a = Host::new(addr, Digests::NONE);
    let (cqe, _) = a.run(connect_kato(kato_ms), &connect_data(0xffff), &[], false);
    ok(&cqe);
    enable(&mut a);
    let q = io(addr, cqe.dw0 as u16, Digests::NONE);
    (a, q)
}

#[test]
fn an_idle_controller_expires_after_its_keep_alive_timeout() {
    let srv = server();
    let addr = srv.local_addrs()[0];
    let (mut a, mut q) = admin_and_io_with_kato(addr, 1000);
    // Traffic keeps it alive (any command counts)...
    for _ in 0..4 {
        std::thread::sleep(Duration::from_millis(400));
        ok(&q.run(rw(READ, 0, 1), &[], &[], false).0);
    }
    // ...silence ends it: the target drops the controller and closes both connections
    // (KATO 1 s, detected at the next 1 s tick).
    let t = std::time::Instant::now();
    assert!(a.recv().is_none());
    assert!(q.recv().is_none());
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    srv.stop();
}

/// Waits until the server's per-worker connection counts are `want`.
fn wait_loads(srv: &Server, want: &[u64]) {
    let t = std::time::Instant::now();
    while srv.worker_connections() != want {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "connections per worker {:?}, want {want:?}",
            srv.worker_connections()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn connections_spread_over_two_workers_all_serve_io() {
    let srv = server_with(2);
    assert_eq!(srv.workers(), 2);
    let addr = srv.local_addrs()[0];
    // Connected one after another, each goes to the worker with fewer connections: every
    // controller has its admin queue on one worker and its I/O queues on the other.
    let mut ctrls = Vec::new();
    for _ in 0..3 {
        let (a, cntlid) = admin(addr, Digests::NONE);
        let q1 = io(addr, cntlid, Digests::NONE);
        ctrls.push((a, q1));
    }
    wait_loads(&srv, &[3, 3]);
    // I/O on all I/O queues at once, each in its own LBA range, with in-capsule and R2T writes.
    let threads: Vec<_> = ctrls
        .into_iter()
        .enumerate()
        .map(|(i, (mut a, mut q))| {
            std::thread::spawn(move || {
                let base = 512 * i as u64;
                for round in 0..8u8 {
                    let data = pattern(4096, round.wrapping_mul(13).wrapping_add(i as u8));
                    let slba = base + 8 * round as u64;
                    ok(&q.run(rw(WRITE, slba, 8), &[], &data, false).0);
                    let small = pattern(ICD as usize, round ^ 0x5a);
                    ok(&q
                        .run(in_capsule(rw(WRITE, slba + 256, 2), ICD), &small, &[], false)
                        .0);
                    let (cqe, got) = q.run(rw(READ, slba, 8), &[], &[], false);
                    ok(&cqe);
                    assert!(got == data, "controller {i} round {round}: read back differs");
                    let (cqe, got) = q.run(rw(READ, slba + 256, 2), &[], &[], false);
                    ok(&cqe);
                    assert_eq!(got, small, "controller {i} round {round}: in-capsule write");
                }
                ok(&a.run(sqe(KEEP_ALIVE, 0, 0), &[], &[], false).0);
                (a, q)
            })
        })
        .collect();
    let mut ctrls: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    // The workers' backends share the storage: what one controller wrote, another reads.
    let want = pattern(4096, 0);
    let (cqe, got) = ctrls[2].1.run(rw(READ, 0, 8), &[], &[], false);
    ok(&cqe);
    assert!(
        got == want,
        "controller 0's first write read through controller 2"
    );
    let st = srv.stats();
    assert_eq!((st.accepted, st.active, st.protocol_errors), (6, 6, 0), "{st:?}");
    // 8 rounds of 4 commands on each of 3 I/O queues, and the read above.
    assert_eq!(st.io_commands, 3 * 8 * 4 + 1, "{st:?}");
    drop(ctrls);
    wait_loads(&srv, &[0, 0]);
    assert_eq!(srv.stats().active, 0);
    srv.stop();
}

#[test]
fn a_controllers_queues_on_two_workers_end_together() {
    let srv = server_with(2);
    let addr = srv.local_addrs()[0];
    // Closing the admin queue (worker 0) closes the I/O queues on worker 1 and on worker 0.
    let (a, cntlid) = admin(addr, Digests::NONE);
    let mut q1 = io(addr, cntlid, Digests::NONE);
    let mut q2 = Host::new(addr, Digests::NONE);
    let (cqe, _) = q2.run(connect_sqe(2, 31), &connect_data(cntlid), &[], false);
    ok(&cqe);
    wait_loads(&srv, &[2, 1]);
    ok(&q1.run(rw(READ, 0, 1), &[], &[], false).0);
    ok(&q2.run(rw(READ, 0, 1), &[], &[], false).0);
    drop(a);
    assert!(q1.recv().is_none(), "the I/O queue on the other worker is closed");
    assert!(q2.recv().is_none(), "the I/O queue on the same worker is closed");
    wait_loads(&srv, &[0, 0]);
    let mut q = Host::new(addr, Digests::NONE);
    let (cqe, _) = q.run(connect_sqe(1, 31), &connect_data(cntlid), &[], false);
    assert!(!cqe.status().is_success(), "the controller is gone");
    drop(q);
    // A controller reset (CC.EN cleared) on the admin queue ends its I/O queue on the other
    // worker.
    wait_loads(&srv, &[0, 0]);
    let (mut a, cntlid) = admin(addr, Digests::NONE);
    let mut q = io(addr, cntlid, Digests::NONE);
    wait_loads(&srv, &[1, 1]);
    let mut set = sqe(FABRICS_OPCODE, 0, 0);
    set.dw[1] = fctype::PROPERTY_SET as u32;
    set.dw[11] = prop::CC;
    set.dw[12] = LINUX_CC & !1;
    ok(&a.run(set, &[], &[], false).0);
    assert!(
        q.recv().is_none(),
        "a reset closes the I/O queue on the other worker"
    );
    // The admin queue stays: the host enables the controller again and connects a new queue.
    enable(&mut a);
    let mut q = io(addr, cntlid, Digests::NONE);
    ok(&q.run(rw(READ, 0, 1), &[], &[], false).0);
    srv.stop();
}

#[test]
fn a_controller_on_two_workers_expires_as_one() {
    let srv = server_with(2);
    let addr = srv.local_addrs()[0];
    let (mut a, mut q) = admin_and_io_with_kato(addr, 1000);
    wait_loads(&srv, &[1, 1]);
    // Traffic on the I/O queue (worker 1) keeps the controller alive for both...
    for _ in 0..4 {
        std::thread::sleep(Duration::from_millis(400));
        ok(&q.run(rw(READ, 0, 1), &[], &[], false).0);
    }
    // ...silence drops it, closing the connections on both workers.
    assert!(a.recv().is_none());
    assert!(q.recv().is_none());
    wait_loads(&srv, &[0, 0]);
    srv.stop();
}

/// A RAM backend whose completions arrive `DELAY` late, like a slow device; on drop it records
/// how many it still held.
struct SlowBackend {
    inner: MallocBackend,
    held: Vec<(std::time::Instant, Completion)>,
    dropped_with: std::sync::Arc<std::sync::atomic::AtomicI64>,
}

impl SlowBackend {
    const DELAY: Duration = Duration::from_millis(300);
}

impl Backend for SlowBackend {
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }

    fn blocks(&self) -> u64 {
        self.inner.blocks()
    }

    fn submit(
        &mut self,
        pool: &mut DmaPool,
        op: Op,
        slba: u64,
        nlb: u32,
        buf: Option<DmaBuf>,
        tag: u64,
    ) -> Result<(), Busy> {
        self.inner.submit(pool, op, slba, nlb, buf, tag)
    }

    fn poll(&mut self, done: &mut dyn FnMut(Completion)) -> usize {
        let now = std::time::Instant::now();
        let held = &mut self.held;
        self.inner.poll(&mut |c| held.push((now, c)));
        let mut n = 0;
        while self.held.first().is_some_and(|(t, _)| t.elapsed() >= Self::DELAY) {
            done(self.held.remove(0).1);
            n += 1;
        }
        n
    }
}

impl Drop for SlowBackend {
    fn drop(&mut self) {
        self.dropped_with
            .store(self.held.len() as i64, std::sync::atomic::Ordering::SeqCst);
    }
}

#[test]
fn stopping_waits_for_the_backends_operations_in_flight() {
    let dropped_with = std::sync::Arc::new(std::sync::atomic::AtomicI64::new(-1));
    let srv = server_over(vec![Box::new(SlowBackend {
        inner: MallocBackend::new(MallocBackend::storage(BLOCKS as usize * BS), BS),
        held: Vec::new(),
        dropped_with: dropped_with.clone(),
    })]);
    let addr = srv.local_addrs()[0];
    let (_a, cntlid) = admin(addr, Digests::NONE);
    let mut q = io(addr, cntlid, Digests::NONE);
    let mut read = rw(READ, 0, 8);
    read.set_cid(1);
    q.send_capsule(&read, &[]);
    let t = std::time::Instant::now();
    while srv.stats().io_commands == 0 {
        assert!(t.elapsed() < Duration::from_secs(5), "the read never arrived");
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(20));
    // The read sits in the backend: stopping waits for it before dropping the backend (and
    // freeing its buffer).
    srv.stop();
    assert_eq!(dropped_with.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert!(t.elapsed() >= SlowBackend::DELAY, "{:?}", t.elapsed());
}
