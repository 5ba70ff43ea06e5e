//! `vfpoll fwd`: forward every frame received on one port out of the other, both ways, on one
//! core, zero-copy (testpmd's `io` forwarding).

use std::process::ExitCode;
use std::time::Instant;

use clap::Args as ClapArgs;
use vfpoll_nic::{free_bulk, MacAddr, Mempool, Port};
use vfpoll_pci::Bdf;

use crate::ctx::Ctx;
use crate::nic_common::{mega_per_sec, print_port, NicArgs, Stop};

/// `vfpoll fwd` options.
#[derive(Debug, ClapArgs)]
pub struct Args {
    /// The two NICs (PCI addresses; give --device twice), bound to vfio-pci.
    #[arg(
        long = "device",
        short = 'd',
        value_name = "BDF",
        required = true,
        num_args = 1
    )]
    pub devices: Vec<Bdf>,
    /// Stop after forwarding N packets (both directions together).
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
    /// Stop after SECS seconds (default: run until --count, or SIGINT/SIGTERM).
    #[arg(long, value_name = "SECS")]
    pub time: Option<f64>,
    /// Send one burst of broadcast frames out of each port before forwarding (testpmd's
    /// --tx-first), to start traffic in a loop.
    #[arg(long)]
    pub tx_first: bool,
    /// Receive only frames for the ports' own addresses (by default the ports are promiscuous).
    #[arg(long)]
    pub no_promisc: bool,
    #[command(flatten)]
    pub nic: NicArgs,
}

#[derive(Debug, Default, Clone, Copy)]
struct Dir {
    rx: u64,
    tx: u64,
    dropped: u64,
}

/// One burst of 60-byte broadcast frames (EtherType 0x88b5, a sequence number after the
/// header) out of `port`.
fn kick(port: &mut Port, pool: &Mempool, n: usize) -> anyhow::Result<usize> {
    let mut pkts = Vec::with_capacity(n);
    pool.alloc_exact(&mut pkts, n)?;
    let src = port.mac();
    for (i, p) in pkts.iter_mut().enumerate() {
        let mut f = [0u8; 60];
        f[..6].copy_from_slice(&MacAddr::BROADCAST.0);
        f[6..12].copy_from_slice(&src.0);
        f[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
        f[14..18].copy_from_slice(&(i as u32).to_be_bytes());
        p.fill(&f)?;
    }
    let sent = port.tx_burst(&mut pkts);
    free_bulk(&mut pkts);
    Ok(sent)
}

/// One burst from `from` to `to`.
#[inline]
fn forward(from: &mut Port, to: &mut Port, pkts: &mut Vec<vfpoll_nic::Packet>, burst: usize, d: &mut Dir) {
    let n = from.rx_burst(pkts, burst);
    if n == 0 {
        if to.tx().in_flight() != 0 {
            to.tx().reclaim();
        }
        return;
    }
    d.rx += n as u64;
    d.tx += to.tx_burst(pkts) as u64;
    // What the ring had no room for is dropped, as a forwarder does.
    d.dropped += pkts.len() as u64;
    free_bulk(pkts);
}

/// Runs `vfpoll fwd`.
pub fn run(_ctx: &Ctx, a: Args) -> anyhow::Result<ExitCode> {
    if a.devices.len() != 2 || a.devices[0] == a.devices[1] {
        anyhow::bail!(
            "fwd forwards between two different ports: give --device twice (got {})",
            a.devices
                .iter()
                .map(Bdf::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let mut stop = Stop::new(a.time)?;
    let (mut ports, pool) = a.nic.open(&a.devices, !a.no_promisc)?;
    let burst = a.nic.burst as usize;
    println!(
        "fwd: {} ({}) <-> {} ({}), bursts of {burst}{}",
        a.devices[0],
        ports[0].mac(),
        a.devices[1],
        ports[1].mac(),
        if a.no_promisc { "" } else { ", promiscuous" }
    );
    if a.tx_first {
        for p in ports.iter_mut() {
            let n = kick(p, &pool, burst)?;
            println!("fwd: tx-first: {n} frames out of {}", p.info().name);
        }
    }
    let (first, second) = ports.split_at_mut(1);
    let (p0, p1) = (&mut first[0], &mut second[0]);
    let mut dirs = [Dir::default(); 2];
    let mut pkts = Vec::with_capacity(burst);
    let start = Instant::now();
    while !stop.now() {
        if a.count.is_some_and(|n| dirs[0].tx + dirs[1].tx >= n) {
            break;
        }
        forward(p0, p1, &mut pkts, burst, &mut dirs[0]);
        forward(p1, p0, &mut pkts, burst, &mut dirs[1]);
    }
    for p in [&mut *p0, &mut *p1] {
        let _ = p.tx().flush(std::time::Duration::from_secs(2));
    }
    let elapsed = start.elapsed();
    let names = [p0.info().name.clone(), p1.info().name.clone()];
    for (d, (f, t)) in [(0, 1), (1, 0)].into_iter().enumerate() {
        println!(
            "fwd: {} -> {}: received {}, forwarded {}, dropped {}",
            names[f], names[t], dirs[d].rx, dirs[d].tx, dirs[d].dropped
        );
    }
    let total = dirs[0].tx + dirs[1].tx;
    println!(
        "fwd: {total} packets forwarded in {:.3} s: {:.4} Mpps{}",
        elapsed.as_secs_f64(),
        mega_per_sec(total, elapsed),
        if stop.by_signal() {
            " (stopped by signal)"
        } else {
            ""
        }
    );
    print_port(p0);
    print_port(p1);
    Ok(ExitCode::SUCCESS)
}
