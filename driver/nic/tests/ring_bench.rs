//! The driver's ring cost against the device model, per packet, on one core (the model runs on
//! another). Ignored by default; prints a table:
//!
//! ```text
//! cargo test --release -p vfpoll-nic --test ring_bench -- --ignored --nocapture
//! VFPOLL_BENCH_CPUS=2,3 cargo test ...   # pin the driver to CPU 2 and the model to CPU 3
//! ```
//!
//! "busy ns/pkt" is the time spent inside the driver's calls that moved packets (RX:
//! `rx_burst` + giving the packets back with `free_bulk`; TX: `alloc_bulk` + `set_len` +
//! `tx_burst`, which includes reclaim) divided by the packets moved: the driver's cost, what a
//! core would spend per packet if the device were never the bottleneck. "wall ns/pkt" is the
//! elapsed time per packet, bounded by the model's own speed. Empty polls are not counted as
//! busy time.
//!
//! Instructions per packet (reliable on a noisy machine, where the ns figures are not):
//!
//! ```text
//! cargo test --release -p vfpoll-nic --test ring_bench -- --ignored --nocapture ring_instructions
//! ```
//!
//! runs this binary again under `valgrind --tool=callgrind` once per row, in lockstep: each
//! round waits *outside the driver* until the model has done its part (RX: posted `batch`
//! frames; TX: sent everything placed so far), then makes one measured call, so no empty poll
//! is counted. Collection is on only inside [`rx_round`] (`rx_burst` + `free_bulk`) and
//! [`tx_round`] (`alloc_bulk` + `set_len` + `tx_burst`, which reclaims the previous round).

mod model;

use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use model::NicModel;
use vfpoll_dma::PageSize;
use vfpoll_nic::e1000e::E1000e;
use vfpoll_nic::{free_bulk, MacAddr, Mempool, Packet, Port, PortOptions};

const MAC: MacAddr = MacAddr([0x52, 0x54, 0x00, 0x12, 0x34, 0x56]);
const MEASURE: Duration = Duration::from_secs(2);

/// `VFPOLL_BENCH_CPUS=DRIVER,MODEL`.
fn cpus() -> Option<(usize, usize)> {
    let v = std::env::var("VFPOLL_BENCH_CPUS").ok()?;
    let (a, b) = v.split_once(',')?;
    Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
}

fn port(entries: u16) -> (NicModel, Mempool, Port) {
    let mapper = std::sync::Arc::new(vfpoll_dma::FakeMapper::new());
    let dma = vfpoll_dma::DmaContext::new(mapper.clone());
    let model = NicModel::start_with(MAC, mapper, cpus().map(|c| c.1));
    model.record_tx(false);
    let pool = Mempool::new(&dma, 8192, PageSize::Base4K).unwrap();
    let opts = PortOptions {
        rx_entries: entries,
        tx_entries: entries,
        page_size: PageSize::Base4K,
        ..PortOptions::default()
    };
    let (c, r, t) = E1000e::new(model.bar(), "model", &dma, &pool, &opts).unwrap();
    (
        model,
        pool,
        Port::from_parts(Box::new(c), Box::new(r), Box::new(t)),
    )
}

struct Row {
    dir: &'static str,
    batch: usize,
    packets: u64,
    busy: Duration,
    wall: Duration,
    doorbells: u64,
}

/// One receive burst and the packets given back: what RX costs the driver.
#[inline(never)]
fn rx_round(port: &mut Port, pkts: &mut Vec<Packet>, batch: usize) -> usize {
    let n = port.rx_burst(pkts, batch);
    free_bulk(pkts);
    n
}

/// Fills `pkts` up to `batch` fresh 60-byte packets and sends them: what TX costs the driver.
#[inline(never)]
fn tx_round(port: &mut Port, pool: &Mempool, pkts: &mut Vec<Packet>, batch: usize) -> usize {
    pool.alloc_bulk(pkts, batch - pkts.len());
    for p in pkts.iter_mut() {
        p.set_len(60).unwrap();
    }
    port.tx_burst(pkts)
}

fn frame() -> Vec<u8> {
    let mut frame = vec![0u8; 60];
    frame[..6].copy_from_slice(&MAC.0);
    frame[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
    frame
}

/// Spins (yielding) until `cond` holds.
fn wait_for(mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < Duration::from_secs(60), "model stuck");
        std::thread::yield_now();
    }
}

/// `rounds` lockstep rounds of `dir` ("rx" or "tx") at `batch`; returns the packets the
/// measured calls moved.
fn lockstep(dir: &str, batch: usize, rounds: u64) -> u64 {
    let (model, pool, mut port) = port(512);
    let mut pkts = Vec::with_capacity(batch);
    let mut moved = 0u64;
    let c = model.counters();
    if dir == "rx" {
        let f = frame();
        for r in 1..=rounds {
            model.generate(&f, batch as u64);
            wait_for(|| c.rx_frames.load(Ordering::Acquire) >= r * batch as u64);
            moved += rx_round(&mut port, &mut pkts, batch) as u64;
        }
    } else {
        for _ in 0..rounds {
            moved += tx_round(&mut port, &pool, &mut pkts, batch) as u64;
            wait_for(|| c.tx_frames.load(Ordering::Acquire) >= moved);
        }
        free_bulk(&mut pkts);
    }
    moved
}

/// Run by [`ring_instructions_per_packet`] under callgrind: `VFPOLL_BENCH_LOCKSTEP=rx32`.
#[test]
#[ignore = "run by ring_instructions_per_packet"]
fn ring_lockstep() {
    let Ok(row) = std::env::var("VFPOLL_BENCH_LOCKSTEP") else {
        return;
    };
    let (dir, batch) = row.split_at(2);
    let rounds = std::env::var("VFPOLL_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(2000);
    let moved = lockstep(dir, batch.parse().expect("rx32 or tx32"), rounds);
    println!("moved {moved}");
}

/// Instructions per packet from callgrind, per direction and batch.
#[test]
#[ignore = "benchmark: run with --release -- --ignored --nocapture"]
fn ring_instructions_per_packet() {
    if cfg!(debug_assertions) {
        println!("note: a debug build; the figures mean something only with --release");
    }
    let exe = std::env::current_exe().unwrap();
    println!();
    println!("| dir | batch | packets | instructions/pkt |");
    println!("|-----|------:|--------:|-----------------:|");
    for batch in [8, 32, 64] {
        for dir in ["rx", "tx"] {
            let out = std::env::temp_dir().join(format!(
                "vfpoll-ring-bench-{}-{dir}{batch}.callgrind",
                std::process::id()
            ));
            let r = Command::new("valgrind")
                .args([
                    "--tool=callgrind",
                    "--toggle-collect=*rx_round*",
                    "--toggle-collect=*tx_round*",
                ])
                .arg(format!("--callgrind-out-file={}", out.display()))
                .arg(&exe)
                .args(["--ignored", "--exact", "ring_lockstep", "--nocapture"])
                .env("VFPOLL_BENCH_LOCKSTEP", format!("{dir}{batch}"))
                .env_remove("VFPOLL_BENCH_CPUS")
                .output();
            let r = match r {
                Ok(r) if r.status.success() => r,
                Ok(r) => panic!("valgrind failed: {}", String::from_utf8_lossy(&r.stderr)),
                Err(e) => {
                    println!("valgrind not runnable ({e}): apt-get install valgrind");
                    return;
                }
            };
            let moved: u64 = String::from_utf8_lossy(&r.stdout)
                .lines()
                .find_map(|l| l.strip_prefix("moved "))
                .and_then(|n| n.trim().parse().ok())
                .expect("the lockstep run prints what it moved");
            let ann = Command::new("callgrind_annotate")
                .args(["--inclusive=yes", "--threshold=100"])
                .arg(&out)
                .output()
                .expect("callgrind_annotate");
            let _ = std::fs::remove_file(&out);
            let text = String::from_utf8_lossy(&ann.stdout);
            let name = format!("{dir}_round");
            let ir: u64 = text
                .lines()
                .find(|l| l.contains(&name))
                .and_then(|l| l.split_whitespace().next())
                .and_then(|n| n.replace(',', "").parse().ok())
                .unwrap_or_else(|| panic!("no {name} in callgrind's output:\n{text}"));
            println!(
                "| {} | {batch} | {moved} | {:.1} |",
                dir.to_uppercase(),
                ir as f64 / moved as f64
            );
        }
    }
}

fn rx(batch: usize) -> Row {
    let (model, _pool, mut port) = port(512);
    model.generate(&frame(), u64::MAX);
    let mut pkts = Vec::with_capacity(batch);
    // Warm-up: caches, the pool's free list, the model's spin.
    let warm = Instant::now();
    while warm.elapsed() < Duration::from_millis(300) {
        rx_round(&mut port, &mut pkts, batch);
    }
    let before = port.rx().stats();
    let (mut packets, mut busy) = (0u64, Duration::ZERO);
    let start = Instant::now();
    while start.elapsed() < MEASURE {
        let t = Instant::now();
        let n = rx_round(&mut port, &mut pkts, batch);
        if n != 0 {
            busy += t.elapsed();
            packets += n as u64;
        }
    }
    let wall = start.elapsed();
    model.stop_generating();
    Row {
        dir: "RX",
        batch,
        packets,
        busy,
        wall,
        doorbells: port.rx().stats().doorbells - before.doorbells,
    }
}

fn tx(batch: usize) -> Row {
    let (_model, pool, mut port) = port(512);
    let mut pkts = Vec::with_capacity(batch);
    let mut send = |pkts: &mut Vec<_>| tx_round(&mut port, &pool, pkts, batch);
    let warm = Instant::now();
    while warm.elapsed() < Duration::from_millis(300) {
        send(&mut pkts);
    }
    let (mut packets, mut busy) = (0u64, Duration::ZERO);
    let start = Instant::now();
    while start.elapsed() < MEASURE {
        let t = Instant::now();
        let n = send(&mut pkts);
        if n != 0 {
            busy += t.elapsed();
            packets += n as u64;
        }
    }
    let wall = start.elapsed();
    free_bulk(&mut pkts);
    let s = port.tx().stats();
    Row {
        dir: "TX",
        batch,
        packets,
        busy,
        wall,
        doorbells: s.doorbells,
    }
}

#[test]
#[ignore = "benchmark: run with --release -- --ignored --nocapture"]
fn ring_cost_per_packet() {
    if cfg!(debug_assertions) {
        println!("note: a debug build; the figures mean something only with --release");
    }
    match cpus() {
        Some((d, m)) => {
            model::pin_to(d);
            println!("driver on CPU {d}, model on CPU {m}");
        }
        None => println!("threads not pinned (set VFPOLL_BENCH_CPUS=DRIVER,MODEL)"),
    }
    let rows: Vec<Row> = [8, 32, 64].iter().flat_map(|&b| [rx(b), tx(b)]).collect();
    println!();
    println!(
        "| dir | batch | packets | busy ns/pkt | Mpps (busy) | wall ns/pkt | Mpps (wall) | pkts/doorbell |"
    );
    println!(
        "|-----|------:|--------:|------------:|------------:|------------:|------------:|--------------:|"
    );
    for r in &rows {
        let busy = r.busy.as_nanos() as f64 / r.packets as f64;
        let wall = r.wall.as_nanos() as f64 / r.packets as f64;
        println!(
            "| {} | {} | {} | {busy:.1} | {:.1} | {wall:.1} | {:.1} | {:.1} |",
            r.dir,
            r.batch,
            r.packets,
            1e3 / busy,
            1e3 / wall,
            r.packets as f64 / r.doorbells.max(1) as f64
        );
    }
}
