//! Transmit rate on the test bed's emulated 82574 (QEMU e1000e under TCG): `vfpoll pktgen`
//! against the guest kernel (an AF_PACKET send loop, and the kernel's pktgen module) and DPDK's
//! `dpdk-testpmd --forward-mode=txonly` where it runs. Every sender uses NIC 0 (00:05.0) and
//! sends 60-byte frames to NIC 1 (00:06.0), which stays on the kernel's e1000e, up, as the
//! receiver. Prints one table with the ratios. Run inside the guest:
//!
//! ```text
//! cargo build --release -p vfpoll-tests --bin nic-bench && cargo build --release --bins
//! cargo xtask vm -- target/release/nic-bench          # or: cargo xtask vm --noiommu -- ...
//! ```

use std::io;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use vfpoll_pci::bind::{self, BindOptions};
use vfpoll_pci::{sysfs, Host};
use vfpoll_tests::*;

/// How long each sender runs.
const SECS: u64 = 5;

fn sh(cmd: &str) -> String {
    let o = Command::new("sh").args(["-c", cmd]).output().expect("sh");
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn netdev(b: &str) -> String {
    let dir = Host::default().pci_device_dir(bdf(b)).join("net");
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .next()
        .expect("an interface")
        .unwrap()
        .file_name()
        .to_string_lossy()
        .into_owned()
}

/// Gives `b` to the kernel's e1000e and brings its interface up; returns the name and MAC.
fn on_kernel(b: &str) -> (String, String) {
    let host = Host::default();
    if sysfs::device(&host, bdf(b)).unwrap().driver.as_deref() != Some("e1000e") {
        bind::unbind_to_kernel(&host, bdf(b), &BindOptions::default()).expect("back to e1000e");
    }
    let ifname = netdev(b);
    sh(&format!("ip link set {ifname} up"));
    let start = Instant::now();
    while std::fs::read_to_string(format!("/sys/class/net/{ifname}/carrier"))
        .map_or(true, |s| s.trim() != "1")
    {
        assert!(start.elapsed() < Duration::from_secs(10), "{ifname}: no carrier");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mac = std::fs::read_to_string(format!("/sys/class/net/{ifname}/address")).unwrap();
    (ifname, mac.trim().to_owned())
}

fn to_vfio(b: &str) {
    if let Ok(name) = std::fs::read_dir(Host::default().pci_device_dir(bdf(b)).join("net")) {
        for n in name.flatten() {
            sh(&format!("ip link set {} down", n.file_name().to_string_lossy()));
        }
    }
    bind_all(&[b]);
}

fn noiommu() -> bool {
    mode() == vfpoll_pci::vfio::IommuMode::NoIommu
}

/// `vfpoll pktgen` for SECS seconds: Mpps.
fn vfpoll_pktgen(dst: &str) -> (f64, String) {
    to_vfio(NIC_0);
    let mut args = vec![
        "pktgen".to_string(),
        "--device".into(),
        NIC_0.into(),
        "--time".into(),
        SECS.to_string(),
        "--size".into(),
        "60".into(),
        "--dst-mac".into(),
        dst.into(),
    ];
    if noiommu() {
        args.push("--noiommu".into());
    }
    // The `vfpoll` built beside this binary (release next to release), else the one on PATH.
    let exe = std::env::current_exe()
        .ok()
        .and_then(|e| Some(e.parent()?.join("vfpoll")))
        .filter(|p| p.exists())
        .unwrap_or_else(|| "vfpoll".into());
    println!("running {} {}", exe.display(), args.join(" "));
    let o = Command::new(&exe).args(&args).output().expect("vfpoll");
    let t = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let mpps = t
        .split_once(" Mpps")
        .and_then(|(a, _)| a.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(f64::NAN);
    (mpps, t)
}

/// An AF_PACKET send loop of 60-byte frames on `ifname` for SECS seconds: Mpps.
fn af_packet(ifname: &str, dst: &str, src: &str) -> (f64, String) {
    let mac = |s: &str| -> Vec<u8> { s.split(':').map(|o| u8::from_str_radix(o, 16).unwrap()).collect() };
    let mut frame = mac(dst);
    frame.extend(mac(src));
    frame.extend([0x88, 0xb5]);
    frame.resize(60, 0);
    let proto = 0x88b5u16.to_be() as i32;
    // SAFETY: plain socket(2); the result is checked.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, proto) };
    assert!(fd >= 0, "socket: {}", io::Error::last_os_error());
    let name = std::ffi::CString::new(ifname).unwrap();
    // SAFETY: a NUL-terminated name that outlives the call.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    // SAFETY: an all-zero sockaddr_ll is valid; fields set below.
    let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sa.sll_family = libc::AF_PACKET as u16;
    sa.sll_protocol = 0x88b5u16.to_be();
    sa.sll_ifindex = index as i32;
    let sap = (&sa as *const libc::sockaddr_ll).cast::<libc::sockaddr>();
    // SAFETY: `sap` points at a live sockaddr_ll of the size given.
    let r = unsafe { libc::bind(fd, sap, std::mem::size_of::<libc::sockaddr_ll>() as u32) };
    assert_eq!(r, 0, "bind: {}", io::Error::last_os_error());
    let (mut sent, mut failed) = (0u64, 0u64);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(SECS) {
        for _ in 0..64 {
            // SAFETY: `frame` is a live slice of the length given.
            let n = unsafe { libc::send(fd, frame.as_ptr().cast(), frame.len(), 0) };
            if n == frame.len() as isize {
                sent += 1;
            } else {
                failed += 1;
            }
        }
    }
    let t = start.elapsed();
    // SAFETY: our descriptor, closed once.
    unsafe { libc::close(fd) };
    let mpps = sent as f64 / t.as_secs_f64() / 1e6;
    (
        mpps,
        format!(
            "AF_PACKET: {sent} frames sent ({failed} send errors) in {:.3} s",
            t.as_secs_f64()
        ),
    )
}

/// The kernel's pktgen module on `ifname`: Mpps from its result line.
fn kernel_pktgen(ifname: &str, dst: &str) -> (f64, String) {
    let load = sh("busybox modprobe pktgen 2>&1; ls /proc/net/pktgen 2>&1");
    if !load.contains("pgctrl") {
        return (f64::NAN, format!("pktgen module not available: {load}"));
    }
    let w = |f: &str, s: &str| sh(&format!("echo '{s}' > /proc/net/pktgen/{f}"));
    w("kpktgend_0", "rem_device_all");
    w("kpktgend_0", &format!("add_device {ifname}"));
    for s in [
        "count 10000000".to_string(),
        "pkt_size 64".into(), // with the FCS: 60 bytes of frame
        format!("dst_mac {dst}"),
        "dst 169.254.77.1".into(),
        "delay 0".into(),
    ] {
        w(ifname, &s);
    }
    let stopper = std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(SECS));
        sh("echo stop > /proc/net/pktgen/pgctrl");
    });
    sh("echo start > /proc/net/pktgen/pgctrl");
    stopper.join().unwrap();
    let res = std::fs::read_to_string(format!("/proc/net/pktgen/{ifname}")).unwrap_or_default();
    let line = res
        .lines()
        .skip_while(|l| !l.contains("Result:"))
        .collect::<Vec<_>>()
        .join(" ");
    let pps = line
        .split_once("pps")
        .and_then(|(a, _)| a.rsplit(' ').next())
        .and_then(|n| n.parse::<f64>().ok())
        .unwrap_or(f64::NAN);
    (pps / 1e6, format!("kernel pktgen: {}", line.trim()))
}

/// `dpdk-testpmd --forward-mode=txonly` on NIC 0: the last Tx-pps it reported.
fn dpdk(dst: &str) -> (f64, String) {
    if Command::new("dpdk-testpmd").arg("--version").output().is_err() {
        return (
            f64::NAN,
            "dpdk-testpmd not installed (apt-get install dpdk-dev librte-net-e1000-23)".into(),
        );
    }
    to_vfio(NIC_0);
    let iova = if noiommu() { "pa" } else { "va" };
    let mut child = Command::new("dpdk-testpmd")
        .args([
            "-l",
            "0-1",
            "-n",
            "1",
            "-a",
            NIC_0,
            &format!("--iova-mode={iova}"),
            "--file-prefix=vfpoll-bench",
            "--",
            "--forward-mode=txonly",
            "--txpkts=60",
            &format!("--eth-peer=0,{dst}"),
            "--nb-cores=1",
            "--txd=512",
            "--rxd=512",
            "--auto-start",
            "--stats-period=1",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("dpdk-testpmd");
    // EAL start-up is slow under TCG; then SECS seconds of forwarding.
    std::thread::sleep(Duration::from_secs(SECS + 15));
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let o = child.wait_with_output().unwrap();
    let t = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let pps: Vec<f64> = t
        .lines()
        .filter_map(|l| l.split_once("Tx-pps:"))
        .filter_map(|(_, r)| r.split_whitespace().next()?.parse().ok())
        .collect();
    let best = pps.iter().copied().fold(f64::NAN, f64::max);
    let tail: Vec<&str> = t.lines().rev().take(40).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    (
        best / 1e6,
        format!("dpdk-testpmd (Tx-pps samples {pps:?}):\n{}", tail.join("\n")),
    )
}

fn main() {
    reserve_hugepages(256);
    println!(
        "nic-bench: {} mode, {SECS} s per sender, 60-byte frames, NIC 0 -> NIC 1",
        mode_name()
    );
    let (_rx_if, rx_mac) = on_kernel(NIC_1);
    let mut rows: Vec<(&str, f64)> = Vec::new();
    let (v, t) = vfpoll_pktgen(&rx_mac);
    println!("{t}");
    rows.push(("vfpoll pktgen", v));
    let (d, t) = dpdk(&rx_mac);
    println!("{t}");
    rows.push(("dpdk-testpmd txonly", d));
    let (tx_if, tx_mac) = on_kernel(NIC_0);
    let (k, t) = af_packet(&tx_if, &rx_mac, &tx_mac);
    println!("{t}");
    rows.push(("kernel AF_PACKET send loop", k));
    let (p, t) = kernel_pktgen(&tx_if, &rx_mac);
    println!("{t}");
    rows.push(("kernel pktgen.ko", p));
    println!(
        "\n| sender ({} mode) | Mpps | vfpoll pktgen / this |",
        mode_name()
    );
    println!("|---|---:|---:|");
    for (name, m) in &rows {
        println!("| {name} | {m:.4} | {:.2} |", v / m);
    }
}
