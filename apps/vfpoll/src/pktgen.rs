//! `vfpoll pktgen`: transmit generated frames as fast as possible or at a set rate.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args as ClapArgs;
use vfpoll_nic::{free_bulk, MacAddr};
use vfpoll_pci::Bdf;

use crate::ctx::Ctx;
use crate::nic_common::{mega_per_sec, print_port, NicArgs, Stop};

/// `vfpoll pktgen` options.
#[derive(Debug, ClapArgs)]
pub struct Args {
    /// The NIC (PCI address, e.g. 0000:00:05.0), bound to vfio-pci (`vfpoll bind`).
    #[arg(long, short = 'd', value_name = "BDF")]
    pub device: Bdf,
    /// Packets per second (default: as fast as the NIC takes them).
    #[arg(long, value_name = "PPS")]
    pub rate: Option<f64>,
    /// Frame size in bytes, without the 4-byte FCS the NIC appends (60 to 1514).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u16).range(60..=1514))]
    pub size: u16,
    /// Stop after N packets.
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
    /// Stop after SECS seconds (default: run until --count, or SIGINT/SIGTERM).
    #[arg(long, value_name = "SECS")]
    pub time: Option<f64>,
    /// Destination MAC address.
    #[arg(long, default_value = "ff:ff:ff:ff:ff:ff", value_name = "MAC")]
    pub dst_mac: MacAddr,
    /// Send raw frames of this EtherType (e.g. 0x88b5) with a 32-bit big-endian sequence number
    /// right after the Ethernet header, instead of IPv4/UDP (198.18.0.1:9 -> 198.18.0.2:9, the
    /// sequence number first in the UDP payload).
    #[arg(long, value_parser = parse_u16_hex, value_name = "HEX")]
    pub ethertype: Option<u16>,
    #[command(flatten)]
    pub nic: NicArgs,
}

fn parse_u16_hex(s: &str) -> Result<u16, String> {
    let t = s.trim_start_matches("0x").trim_start_matches("0X");
    u16::from_str_radix(t, 16).map_err(|_| format!("`{s}` is not a 16-bit hex EtherType such as 0x88b5"))
}

/// The frame to send (without sequence number) and where the sequence number goes.
fn template(src: MacAddr, dst: MacAddr, size: usize, ethertype: Option<u16>) -> (Vec<u8>, usize) {
    let mut f = Vec::with_capacity(size);
    f.extend_from_slice(&dst.0);
    f.extend_from_slice(&src.0);
    match ethertype {
        Some(t) => {
            f.extend_from_slice(&t.to_be_bytes());
            f.resize(size, 0);
            (f, 14)
        }
        None => {
            f.extend_from_slice(&0x0800u16.to_be_bytes());
            let ip_len = (size - 14) as u16;
            let mut ip = [
                0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0, 198, 18, 0, 1, 198, 18, 0, 2,
            ];
            ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
            let sum = crate::responder::checksum(&ip);
            ip[10..12].copy_from_slice(&sum.to_be_bytes());
            f.extend_from_slice(&ip);
            let udp_len = ip_len - 20;
            f.extend_from_slice(&9u16.to_be_bytes());
            f.extend_from_slice(&9u16.to_be_bytes());
            f.extend_from_slice(&udp_len.to_be_bytes());
            f.extend_from_slice(&[0, 0]); // no UDP checksum (allowed over IPv4)
            f.resize(size, 0);
            (f, 42)
        }
    }
}

/// Runs `vfpoll pktgen`.
pub fn run(_ctx: &Ctx, a: Args) -> anyhow::Result<ExitCode> {
    if let Some(r) = a.rate {
        if !(r > 0.0 && r.is_finite()) {
            anyhow::bail!("--rate {r} is not a positive number of packets per second");
        }
    }
    let mut stop = Stop::new(a.time)?;
    let (mut ports, pool) = a.nic.open(&[a.device], false)?;
    let port = &mut ports[0];
    let size = a.size as usize;
    let (tpl, seq_off) = template(port.mac(), a.dst_mac, size, a.ethertype);
    let burst = a.nic.burst as usize;
    println!(
        "pktgen: {} ({}), {} -> {}, {size}-byte frames, {}",
        a.device,
        port.mac(),
        port.mac(),
        a.dst_mac,
        match a.rate {
            Some(r) => format!("{r} packets/s"),
            None => "as fast as possible".into(),
        }
    );
    // Write the frame into every free buffer once: only pktgen's transmit queue uses them (its
    // receive ring keeps its own buffers, as nothing here receives), and a sent buffer comes
    // back unchanged, so each packet needs only its length and sequence number.
    let mut pkts = Vec::with_capacity(pool.available().max(burst));
    pool.alloc_bulk(&mut pkts, pool.available());
    for p in &mut pkts {
        p.fill(&tpl).expect("the frame fits a buffer");
    }
    free_bulk(&mut pkts);
    let mut sent = 0u64;
    let mut seq = 0u32;
    let mut pool_empty = 0u64;
    let start = Instant::now();
    loop {
        if stop.now() {
            break;
        }
        let mut want = burst;
        if let Some(c) = a.count {
            if sent >= c {
                break;
            }
            want = want.min((c - sent) as usize);
        }
        if let Some(r) = a.rate {
            let due = (start.elapsed().as_secs_f64() * r) as u64 + 1;
            let allowed = due.saturating_sub(sent) as usize;
            if allowed == 0 {
                let next = Duration::from_secs_f64((sent as f64) / r);
                let wait = next.saturating_sub(start.elapsed());
                if wait > Duration::from_millis(1) {
                    std::thread::sleep(wait - Duration::from_micros(500));
                } else {
                    std::hint::spin_loop();
                }
                continue;
            }
            want = want.min(allowed);
        }
        // Packets left over from a full ring keep their contents; only new ones are written.
        let have = pkts.len();
        if have < want {
            pool.alloc_bulk(&mut pkts, want - have);
            for p in &mut pkts[have..] {
                p.set_len(size).expect("the frame fits a buffer");
                p.write_at(seq_off, &seq.to_be_bytes()).expect("inside the frame");
                seq = seq.wrapping_add(1);
            }
        }
        if pkts.is_empty() {
            // Every buffer is on the ring: reclaim and retry.
            pool_empty += 1;
            port.tx().reclaim();
            continue;
        }
        sent += port.tx_burst(&mut pkts) as u64;
    }
    let unsent = pkts.len();
    free_bulk(&mut pkts);
    let flushed = port.tx().flush(Duration::from_secs(5));
    let elapsed = start.elapsed();
    let bytes = sent * size as u64;
    println!(
        "pktgen: sent {sent} packets, {bytes} bytes in {:.3} s: {:.4} Mpps, {:.4} Gb/s (with FCS){}",
        elapsed.as_secs_f64(),
        mega_per_sec(sent, elapsed),
        mega_per_sec((bytes + 4 * sent) * 8, elapsed) / 1e3,
        if stop.by_signal() {
            " (stopped by signal)"
        } else {
            ""
        }
    );
    if unsent != 0 || pool_empty != 0 {
        println!("  {unsent} generated packets not sent at the end; {pool_empty} waits for free buffers");
    }
    print_port(port);
    flushed?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates() {
        let src: MacAddr = "52:54:00:00:00:01".parse().unwrap();
        let (f, off) = template(src, MacAddr::BROADCAST, 60, Some(0x88b5));
        assert_eq!((f.len(), off), (60, 14));
        assert_eq!(&f[12..14], &[0x88, 0xb5]);
        let (f, off) = template(src, MacAddr::BROADCAST, 128, None);
        assert_eq!((f.len(), off), (128, 42));
        assert_eq!(
            crate::responder::checksum(&f[14..34]),
            0,
            "valid IPv4 header checksum"
        );
        assert_eq!(u16::from_be_bytes([f[16], f[17]]), 114);
        assert_eq!(u16::from_be_bytes([f[38], f[39]]), 94);
        assert_eq!(parse_u16_hex("0x88b5"), Ok(0x88b5));
        assert!(parse_u16_hex("zz").is_err());
    }
}
