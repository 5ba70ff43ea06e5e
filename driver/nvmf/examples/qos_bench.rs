//! Rate-limit benchmark: two hosts read 4 KiB blocks from one RAM namespace over loopback
//! NVMe/TCP, each with its own controller and queue depth; first host B alone, then both
//! unlimited, then host A limited to `--iops` (default 2000) by a per-host limit set at run
//! time. Prints each host's IOPS per phase, how far A lands from its limit, and B's IOPS
//! beside its figures without a limited neighbour. Figures, not assertions.
//!
//! `cargo run --release -p vfpoll-nvmf --example qos_bench -- [--iops N] [--secs S] [--qd Q]`

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vfpoll_nvmf::fabrics::{Limits, RateLimit};
use vfpoll_nvmf::pdu::{CtrlPdu, Digests};
use vfpoll_nvmf::testing::*;

const HOST_B: &str = "nqn.2014-08.org.nvmexpress:uuid:66666666-7777-8888-9999-000000000000";

/// Runs `qd` 4 KiB reads at a time as `host` until `stop`; returns the completions counted
/// after `warm` and the seconds they took.
fn reader(
    addr: SocketAddr,
    host: &'static str,
    qd: u16,
    warm: Duration,
    stop: Arc<AtomicBool>,
) -> (u64, f64) {
    let (_admin, cntlid) = admin_to(addr, SUB, host).expect("admin queue");
    let mut q = Host::new(addr, Digests::NONE);
    let (cqe, _) = q.run(
        connect_sqe(1, 127),
        &connect_data_for(cntlid, SUB, host),
        &[],
        false,
    );
    ok(&cqe);
    let blocks = (4096 / BS) as u32;
    let send = |q: &mut Host, cid: u16, n: u64| {
        let slba = (n * 7919) % (BLOCKS / blocks as u64) * blocks as u64;
        let mut r = rw(READ, slba, blocks);
        r.set_cid(cid);
        q.send_capsule(&r, &[]);
    };
    let mut issued = 0u64;
    for cid in 0..qd {
        send(&mut q, cid, issued);
        issued += 1;
    }
    let t0 = Instant::now();
    let (mut counted, mut from) = (0u64, None);
    while !stop.load(Ordering::Relaxed) {
        let rx = q.recv().expect("a PDU");
        if let CtrlPdu::CapsuleResp(r) = rx.pdu {
            let cid = u16::from_le_bytes([r.cqe[12], r.cqe[13]]);
            if t0.elapsed() >= warm {
                from.get_or_insert_with(Instant::now);
                counted += 1;
            }
            send(&mut q, cid, issued);
            issued += 1;
        }
    }
    (counted, from.map_or(0.0, |f| f.elapsed().as_secs_f64()))
}

/// Runs the readers named in `hosts` together for `secs`; their IOPS in order.
fn phase(addr: SocketAddr, hosts: &[&'static str], qd: u16, secs: f64) -> Vec<f64> {
    let stop = Arc::new(AtomicBool::new(false));
    let warm = Duration::from_millis(500);
    let threads: Vec<_> = hosts
        .iter()
        .map(|&h| {
            let stop = stop.clone();
            std::thread::spawn(move || reader(addr, h, qd, warm, stop))
        })
        .collect();
    std::thread::sleep(warm + Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    threads
        .into_iter()
        .map(|t| {
            let (n, s) = t.join().expect("reader");
            n as f64 / s.max(1e-9)
        })
        .collect()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut iops, mut secs, mut qd) = (2000u64, 5.0f64, 16u16);
    while let Some(a) = args.next() {
        let v = args.next().unwrap_or_default();
        match a.as_str() {
            "--iops" => iops = v.parse().expect("--iops N"),
            "--secs" => secs = v.parse().expect("--secs S"),
            "--qd" => qd = v.parse().expect("--qd Q"),
            _ => panic!("usage: qos_bench [--iops N] [--secs S] [--qd Q]"),
        }
    }
    let srv = server_with(2);
    let addr = srv.local_addrs()[0];
    println!(
        "qos_bench: 4 KiB reads, QD {qd} per host, {secs} s per phase, 2 workers, RAM namespace, loopback"
    );
    let alone = phase(addr, &[HOST_B], qd, secs)[0];
    println!("B alone:                 B {alone:>9.0} IOPS");
    let both = phase(addr, &[HOST, HOST_B], qd, secs);
    println!(
        "A and B, no limits:      A {:>9.0} IOPS   B {:>9.0} IOPS",
        both[0], both[1]
    );
    let limits = Limits {
        hosts: BTreeMap::from([(
            HOST.to_owned(),
            RateLimit {
                iops: Some(iops),
                bytes_per_s: None,
            },
        )]),
        namespaces: BTreeMap::new(),
    };
    srv.set_limits(SUB, limits).expect("limits");
    let lim = phase(addr, &[HOST, HOST_B], qd, secs);
    println!(
        "A limited to {iops} IOPS: A {:>9.0} IOPS   B {:>9.0} IOPS",
        lim[0], lim[1]
    );
    println!(
        "A off its limit by {:+.2} %; B at {:.2}x its IOPS beside an unlimited A, {:.2}x alone",
        (lim[0] / iops as f64 - 1.0) * 100.0,
        lim[1] / both[1],
        lim[1] / alone
    );
    let m = srv.metrics();
    let s = &m.subsystems[SUB];
    for h in [HOST, HOST_B] {
        let st = &s.io[&(1, h.to_owned())];
        println!("metrics {h}: {} reads, {} throttled", st.reads, st.throttled);
    }
    srv.stop();
}
