//! `vfpoll responder`: answer ARP requests and ICMP echo requests for one IPv4 address, count
//! what arrives. The replies are the received buffers rewritten in place (zero-copy).
//!
//! With `--completion irq` (or `hybrid`) the receive queue interrupts and the responder sleeps
//! in `Port::wait` whenever the ring is empty, so an idle responder costs no CPU; the process
//! CPU time is printed at the end either way.

use std::io::Write as _;
use std::net::Ipv4Addr;
use std::process::ExitCode;
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args as ClapArgs;
use vfpoll_nic::{free_bulk, CompletionMode, MacAddr};
use vfpoll_pci::Bdf;

use crate::cpu_time::process_cpu;
use crate::ctx::Ctx;
use crate::nic_common::{print_port, NicArgs, Stop};

/// An IPv4 address with a prefix length, `ADDR/PREFIX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Net {
    /// The address.
    pub addr: Ipv4Addr,
    /// The prefix length (0-32).
    pub prefix: u8,
}

impl Ipv4Net {
    /// Whether `ip` is in this subnet.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        let mask = if self.prefix == 0 {
            0
        } else {
            u32::MAX << (32 - self.prefix)
        };
        u32::from(ip) & mask == u32::from(self.addr) & mask
    }
}

impl FromStr for Ipv4Net {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("`{s}` is not ADDR/PREFIX, e.g. 169.254.1.2/16");
        let (a, p) = s.split_once('/').ok_or_else(bad)?;
        let addr: Ipv4Addr = a.parse().map_err(|_| bad())?;
        let prefix: u8 = p.parse().map_err(|_| bad())?;
        if prefix > 32 {
            return Err(bad());
        }
        if addr.is_unspecified() || addr.is_broadcast() || addr.is_multicast() {
            return Err(format!("{addr} cannot be a host address"));
        }
        Ok(Ipv4Net { addr, prefix })
    }
}

impl std::fmt::Display for Ipv4Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// `vfpoll responder` options.
#[derive(Debug, ClapArgs)]
pub struct Args {
    /// The NIC (PCI address, e.g. 0000:00:05.0), bound to vfio-pci (`vfpoll bind`).
    #[arg(long, short = 'd', value_name = "BDF")]
    pub device: Bdf,
    /// The address to answer for, with its prefix length (ADDR/PREFIX).
    #[arg(long, value_name = "ADDR/PREFIX")]
    pub ip: Ipv4Net,
    /// Stop after answering N requests (ARP and ICMP echo together).
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
    /// Stop after SECS seconds (default: run until --count, or SIGINT/SIGTERM).
    #[arg(long, value_name = "SECS")]
    pub time: Option<f64>,
    /// How the responder learns of frames: poll (spin on the receive ring), irq (sleep until
    /// the receive queue's interrupt: MSI-X, or MSI on an 82574 without it), or hybrid (spin
    /// for --hybrid-spin-us after the last frame, then sleep).
    #[arg(long, value_name = "MODE", default_value = "poll", value_parser = CompletionMode::NAMES)]
    pub completion: String,
    /// How long hybrid mode spins before it sleeps, in microseconds.
    #[arg(long, value_name = "US", default_value_t = 50)]
    pub hybrid_spin_us: u64,
    #[command(flatten)]
    pub nic: NicArgs,
}

/// The --completion mode.
fn completion_mode(a: &Args) -> anyhow::Result<CompletionMode> {
    Ok(CompletionMode::from_name(
        &a.completion,
        Duration::from_micros(a.hybrid_spin_us),
    )?)
}

/// What came in.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counters {
    /// Frames received.
    pub frames: u64,
    /// ARP requests (for any address).
    pub arp_requests: u64,
    /// ARP requests for our address.
    pub arp_for_us: u64,
    /// ICMP echo requests for our address.
    pub icmp_echo: u64,
    /// Replies handed to the NIC (ARP and ICMP).
    pub replies: u64,
    /// Requests from outside our subnet (answered anyway, as a host does).
    pub off_subnet: u64,
    /// Other IPv4 frames (other protocols, other destinations).
    pub other_ipv4: u64,
    /// IPv6 frames.
    pub ipv6: u64,
    /// Frames of any other EtherType, or too short to parse.
    pub other: u64,
    /// Replies dropped because the transmit ring was full.
    pub tx_dropped: u64,
}

/// The Internet checksum (RFC 1071) of `data`: the one's complement of the one's complement sum
/// of its 16-bit big-endian words. Over data that holds a correct checksum it gives 0.
pub fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u16::from_be_bytes([c[0], c[1]]) as u32;
    }
    if let [last] = chunks.remainder() {
        sum += (*last as u32) << 8;
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn ip_at(f: &[u8], off: usize) -> Ipv4Addr {
    Ipv4Addr::new(f[off], f[off + 1], f[off + 2], f[off + 3])
}

/// Looks at one frame; if it is an ARP request or ICMP echo request for `net.addr`, rewrites it
/// in place into the reply and returns true.
pub fn respond(f: &mut [u8], mac: MacAddr, net: Ipv4Net, c: &mut Counters) -> bool {
    c.frames += 1;
    if f.len() < 14 {
        c.other += 1;
        return false;
    }
    let me = net.addr.octets();
    match u16::from_be_bytes([f[12], f[13]]) {
        0x0806 => {
            // ARP for IPv4 over Ethernet (RFC 826): htype 1, ptype 0x0800, hlen 6, plen 4.
            if f.len() < 42 || f[14..20] != [0, 1, 8, 0, 6, 4] || f[20..22] != [0, 1] {
                c.other += 1;
                return false;
            }
            c.arp_requests += 1;
            if f[38..42] != me {
                return false;
            }
            c.arp_for_us += 1;
            if !net.contains(ip_at(f, 28)) {
                c.off_subnet += 1;
            }
            let mut sha = [0u8; 6];
            sha.copy_from_slice(&f[22..28]);
            let mut spa = [0u8; 4];
            spa.copy_from_slice(&f[28..32]);
            f[0..6].copy_from_slice(&sha);
            f[6..12].copy_from_slice(&mac.0);
            f[20..22].copy_from_slice(&[0, 2]); // reply
            f[22..28].copy_from_slice(&mac.0);
            f[28..32].copy_from_slice(&me);
            f[32..38].copy_from_slice(&sha);
            f[38..42].copy_from_slice(&spa);
            true
        }
        0x0800 => {
            let ihl = (f.get(14).copied().unwrap_or(0) & 0x0f) as usize * 4;
            if f.len() < 14 + 20 || f[14] >> 4 != 4 || ihl < 20 || f.len() < 14 + ihl + 8 {
                c.other += 1;
                return false;
            }
            let total = u16::from_be_bytes([f[16], f[17]]) as usize;
            let fragment = u16::from_be_bytes([f[20], f[21]]) & 0x3fff != 0;
            if f[23] != 1
                || f[30..34] != me
                || fragment
                || total < ihl + 8
                || 14 + total > f.len()
                || f[14 + ihl] != 8
            {
                c.other_ipv4 += 1;
                return false;
            }
            c.icmp_echo += 1;
            if !net.contains(ip_at(f, 26)) {
                c.off_subnet += 1;
            }
            // Ethernet: back to the sender.
            let mut src = [0u8; 6];
            src.copy_from_slice(&f[6..12]);
            f[0..6].copy_from_slice(&src);
            f[6..12].copy_from_slice(&mac.0);
            // IPv4: swap the addresses, fresh TTL, new header checksum.
            let mut sip = [0u8; 4];
            sip.copy_from_slice(&f[26..30]);
            f[30..34].copy_from_slice(&sip);
            f[26..30].copy_from_slice(&me);
            f[22] = 64;
            f[24..26].fill(0);
            let hc = checksum(&f[14..14 + ihl]);
            f[24..26].copy_from_slice(&hc.to_be_bytes());
            // ICMP: echo reply (type 0), same identifier, sequence and data.
            let icmp = 14 + ihl..14 + total;
            f[icmp.start] = 0;
            f[icmp.start + 2..icmp.start + 4].fill(0);
            let ic = checksum(&f[icmp.clone()]);
            f[icmp.start + 2..icmp.start + 4].copy_from_slice(&ic.to_be_bytes());
            true
        }
        0x86dd => {
            c.ipv6 += 1;
            false
        }
        _ => {
            c.other += 1;
            false
        }
    }
}

/// Runs `vfpoll responder`.
pub fn run(_ctx: &Ctx, a: Args) -> anyhow::Result<ExitCode> {
    let mut stop = Stop::new(a.time)?;
    let mode = completion_mode(&a)?;
    let (mut ports, _pool) = a.nic.open_with(&[a.device], false, mode)?;
    let port = &mut ports[0];
    let mac = port.mac();
    let burst = a.nic.burst as usize;
    println!(
        "responder: {} ({mac}) answering ARP and ICMP echo for {} (completion {})",
        a.device, a.ip, a.completion
    );
    let _ = std::io::stdout().flush();
    let (cpu0, t0) = (process_cpu()?, Instant::now());
    let mut c = Counters::default();
    let mut sleeps = 0u64;
    let (mut rx, mut tx, mut drop) = (
        Vec::with_capacity(burst),
        Vec::with_capacity(burst),
        Vec::with_capacity(burst),
    );
    while !stop.now() {
        if a.count.is_some_and(|n| c.replies >= n) {
            break;
        }
        if port.rx_burst(&mut rx, burst) == 0 {
            if port.tx().in_flight() != 0 {
                port.tx().reclaim();
            }
            if mode.interrupts() {
                // Sleep until a frame, the --time limit, or a signal (which ends the sleep;
                // stop.now() then sees it). At most a second, so a missed limit costs little.
                let left = stop.left().unwrap_or(Duration::from_secs(1));
                if left.is_zero() {
                    break;
                }
                port.wait(Some(left.min(Duration::from_secs(1))))
                    .context("waiting for the receive queue's interrupt")?;
                sleeps += 1;
            }
            continue;
        }
        for mut p in rx.drain(..) {
            if respond(p.data_mut(), mac, a.ip, &mut c) {
                tx.push(p);
            } else {
                drop.push(p);
            }
        }
        if !tx.is_empty() {
            c.replies += port.tx_burst(&mut tx) as u64;
            c.tx_dropped += tx.len() as u64;
            free_bulk(&mut tx);
        }
        free_bulk(&mut drop);
    }
    let _ = port.tx().flush(std::time::Duration::from_secs(2));
    println!(
        "responder: {} frames; ARP requests {} ({} for {}), ICMP echo requests {}, replies {}, from outside {} {}, other IPv4 {}, IPv6 {}, other {}, replies dropped {}{}",
        c.frames,
        c.arp_requests,
        c.arp_for_us,
        a.ip.addr,
        c.icmp_echo,
        c.replies,
        a.ip,
        c.off_subnet,
        c.other_ipv4,
        c.ipv6,
        c.other,
        c.tx_dropped,
        if stop.by_signal() { " (stopped by signal)" } else { "" }
    );
    let (cpu, secs) = (process_cpu()? - cpu0, t0.elapsed().as_secs_f64());
    println!(
        "cpu: {:.3} s of process CPU in {secs:.2} s ({:.1}% of one core), completion {}, {sleeps} waits",
        cpu.as_secs_f64(),
        100.0 * cpu.as_secs_f64() / secs.max(1e-9),
        a.completion
    );
    print_port(port);
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: MacAddr = MacAddr([0x52, 0x54, 0, 0, 0, 1]);
    const PEER: [u8; 6] = [0x52, 0x54, 0, 0, 0, 2];

    fn net() -> Ipv4Net {
        "169.254.77.2/16".parse().unwrap()
    }

    fn arp_request(target: [u8; 4]) -> Vec<u8> {
        let mut f = vec![0xff; 6];
        f.extend_from_slice(&PEER);
        f.extend_from_slice(&[0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 1]);
        f.extend_from_slice(&PEER);
        f.extend_from_slice(&[169, 254, 77, 1]);
        f.extend_from_slice(&[0; 6]);
        f.extend_from_slice(&target);
        f.resize(60, 0);
        f
    }

    fn echo_request(dst: [u8; 4], payload: &[u8]) -> Vec<u8> {
        let mut f = MAC.0.to_vec();
        f.extend_from_slice(&PEER);
        f.extend_from_slice(&[0x08, 0x00]);
        let total = (20 + 8 + payload.len()) as u16;
        let mut ip = vec![0x45, 0, 0, 0, 0x12, 0x34, 0x40, 0, 63, 1, 0, 0, 169, 254, 77, 1];
        ip[2..4].copy_from_slice(&total.to_be_bytes());
        ip.extend_from_slice(&dst);
        let s = checksum(&ip);
        ip[10..12].copy_from_slice(&s.to_be_bytes());
        f.extend_from_slice(&ip);
        let mut icmp = vec![8, 0, 0, 0, 0xbe, 0xef, 0, 7];
        icmp.extend_from_slice(payload);
        let s = checksum(&icmp);
        icmp[2..4].copy_from_slice(&s.to_be_bytes());
        f.extend_from_slice(&icmp);
        f.resize(f.len().max(60), 0);
        f
    }

    #[test]
    fn checksum_rfc1071_example() {
        // RFC 1071 §3: the sum of 0001 f203 f4f5 f6f7 is ddf2 (so the checksum is 220d).
        assert_eq!(
            checksum(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]),
            0x220d
        );
        assert_eq!(checksum(&[0xff]), 0x00ff);
    }

    #[test]
    fn answers_arp_for_its_address_only() {
        let mut c = Counters::default();
        let mut f = arp_request([169, 254, 77, 2]);
        assert!(respond(&mut f, MAC, net(), &mut c));
        assert_eq!(&f[0..6], &PEER, "back to the asker");
        assert_eq!(&f[6..12], &MAC.0);
        assert_eq!(&f[20..22], &[0, 2], "reply");
        assert_eq!(&f[22..28], &MAC.0, "our hardware address");
        assert_eq!(&f[28..32], &[169, 254, 77, 2]);
        assert_eq!(&f[32..38], &PEER);
        assert_eq!(&f[38..42], &[169, 254, 77, 1]);
        let mut other = arp_request([169, 254, 77, 3]);
        assert!(!respond(&mut other, MAC, net(), &mut c));
        assert_eq!((c.arp_requests, c.arp_for_us, c.frames), (2, 1, 2));
    }

    #[test]
    fn answers_icmp_echo_with_valid_checksums() {
        let mut c = Counters::default();
        let payload: Vec<u8> = (0..56).collect();
        let mut f = echo_request([169, 254, 77, 2], &payload);
        assert!(respond(&mut f, MAC, net(), &mut c));
        assert_eq!(&f[0..6], &PEER);
        assert_eq!(&f[26..30], &[169, 254, 77, 2]);
        assert_eq!(&f[30..34], &[169, 254, 77, 1]);
        assert_eq!(checksum(&f[14..34]), 0, "IPv4 header checksum");
        let icmp = &f[34..34 + 8 + 56];
        assert_eq!(icmp[0], 0, "echo reply");
        assert_eq!(checksum(icmp), 0, "ICMP checksum");
        assert_eq!(&icmp[4..8], &[0xbe, 0xef, 0, 7], "identifier and sequence kept");
        assert_eq!(&icmp[8..], &payload[..]);
        // Not ours, not ICMP echo, IPv6, runts: counted, left alone.
        let mut other = echo_request([169, 254, 77, 9], &payload);
        assert!(!respond(&mut other, MAC, net(), &mut c));
        let mut v6 = vec![0u8; 60];
        v6[12..14].copy_from_slice(&[0x86, 0xdd]);
        assert!(!respond(&mut v6, MAC, net(), &mut c));
        assert!(!respond(&mut [0u8; 10], MAC, net(), &mut c));
        assert_eq!((c.icmp_echo, c.other_ipv4, c.ipv6, c.other), (1, 1, 1, 1));
    }

    #[test]
    fn parses_addresses_with_prefix() {
        let n = net();
        assert!(n.contains(Ipv4Addr::new(169, 254, 1, 1)));
        assert!(!n.contains(Ipv4Addr::new(10, 0, 0, 1)));
        assert_eq!(n.to_string(), "169.254.77.2/16");
        for bad in [
            "169.254.77.2",
            "169.254.77.2/33",
            "x/8",
            "0.0.0.0/8",
            "224.0.0.1/4",
        ] {
            assert!(bad.parse::<Ipv4Net>().is_err(), "{bad}");
        }
    }
}
