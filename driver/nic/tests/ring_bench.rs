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

mod model;

use std::time::{Duration, Instant};

use model::NicModel;
use vfpoll_dma::PageSize;
use vfpoll_nic::e1000e::E1000e;
use vfpoll_nic::{free_bulk, MacAddr, Mempool, Port, PortOptions};

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

fn rx(batch: usize) -> Row {
    let (model, _pool, mut port) = port(512);
    let mut frame = vec![0u8; 60];
    frame[..6].copy_from_slice(&MAC.0);
    frame[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
    model.generate(&frame, u64::MAX);
    let mut pkts = Vec::with_capacity(batch);
    // Warm-up: caches, the pool's free list, the model's spin.
    let warm = Instant::now();
    while warm.elapsed() < Duration::from_millis(300) {
        port.rx_burst(&mut pkts, batch);
        free_bulk(&mut pkts);
    }
    let before = port.rx().stats();
    let (mut packets, mut busy) = (0u64, Duration::ZERO);
    let start = Instant::now();
    while start.elapsed() < MEASURE {
        let t = Instant::now();
        let n = port.rx_burst(&mut pkts, batch);
        free_bulk(&mut pkts);
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
    let mut send = |pkts: &mut Vec<_>| {
        pool.alloc_bulk(pkts, batch - pkts.len());
        for p in pkts.iter_mut() {
            let p: &mut vfpoll_nic::Packet = p;
            p.set_len(60).unwrap();
        }
        port.tx_burst(pkts)
    };
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
