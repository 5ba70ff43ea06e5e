//! Transmit rate on the test bed's emulated 82574 (QEMU e1000e under TCG): `vfpoll pktgen`
//! against DPDK's `dpdk-testpmd --forward-mode=txonly` and the guest kernel (an AF_PACKET send
//! loop, and the kernel's pktgen module). Every sender uses NIC 0 (00:05.0) and sends 60-byte
//! frames to NIC 1 (00:06.0), which stays on the kernel's e1000e, up, as the receiver.
//!
//! ```text
//! cargo build --release --bins && cargo build --release -p vfpoll-tests --bin nic-bench
//! target/release/nic-bench [--mode iommu|noiommu|both] [--runs 5] [--secs 5] [--burst 32] [--no-kernel]
//! ```
//!
//! Started on the host, it installs DPDK when it is missing (`apt-get install dpdk-dev
//! librte-net-e1000-23`, as root or through `sudo -n`; the guest runs the host's `/`), then
//! boots the test bed once per mode (`cargo xtask vm [--noiommu] -- nic-bench ...`) and runs
//! itself inside. In the guest (`VFPOLL_TESTBED` set) it measures.
//!
//! Fair comparison: vfpoll and testpmd alternate, `--runs` times each, with the same frame size,
//! burst size and duration; each run's figure is the average rate over `--secs` seconds
//! (vfpoll: packets placed on the ring over the run's time; testpmd: the mean of `--secs`
//! consecutive 1-second Tx-pps samples after its first non-zero one, i.e. after EAL start-up,
//! the same count: packets its PMD accepted). The table gives median, min and max. The kernel
//! senders run once each (they are 20-30x slower).

use std::io::{self, BufRead, BufReader};
use std::process::{Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use vfpoll_pci::bind::{self, BindOptions};
use vfpoll_pci::{sysfs, Host};
use vfpoll_tests::*;

/// Options (see the module docs).
#[derive(Debug, Clone)]
struct Opts {
    modes: Vec<&'static str>,
    runs: usize,
    secs: u64,
    burst: u16,
    kernel: bool,
}

fn parse() -> Opts {
    let mut o = Opts {
        modes: vec!["iommu", "noiommu"],
        runs: 5,
        secs: 5,
        burst: 32,
        kernel: true,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--mode" => {
                o.modes = match val().as_str() {
                    "iommu" => vec!["iommu"],
                    "noiommu" => vec!["noiommu"],
                    "both" => vec!["iommu", "noiommu"],
                    m => panic!("--mode {m}: iommu, noiommu or both"),
                }
            }
            "--runs" => o.runs = val().parse().expect("--runs N"),
            "--secs" => o.secs = val().parse().expect("--secs S"),
            "--burst" => o.burst = val().parse().expect("--burst B"),
            "--no-kernel" => o.kernel = false,
            _ => panic!("unknown option {a}; see the docs at the top of nic-bench.rs"),
        }
    }
    assert!(o.runs >= 1 && o.secs >= 1, "--runs and --secs must be at least 1");
    o
}

/// The Debian packages DPDK's testpmd and the e1000 PMD come in.
const DPDK_PACKAGES: [&str; 2] = ["dpdk-dev", "librte-net-e1000-23"];

/// Installs DPDK on the host when a package is missing: `apt-get` as root, else `sudo -n`.
fn ensure_dpdk() -> Result<(), String> {
    let installed = |p: &str| {
        Command::new("dpkg-query")
            .args(["-W", "-f=${Status}", p])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
    };
    let missing: Vec<&str> = DPDK_PACKAGES.into_iter().filter(|p| !installed(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    // SAFETY: geteuid(2) has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let apt = |args: &[&str]| -> bool {
        let mut c = if root {
            Command::new("apt-get")
        } else {
            let mut c = Command::new("sudo");
            c.args(["-n", "apt-get"]);
            c
        };
        c.env("DEBIAN_FRONTEND", "noninteractive")
            .args(args)
            .status()
            .is_ok_and(|s| s.success())
    };
    println!(
        "nic-bench: installing {} (DPDK for the comparison)",
        missing.join(" ")
    );
    let mut install = vec!["install", "-y", "--no-install-recommends"];
    install.extend(&missing);
    if apt(&install) || (apt(&["update"]) && apt(&install)) {
        return Ok(());
    }
    Err(format!(
        "could not install {}: run `apt-get install {}` as root",
        missing.join(" "),
        DPDK_PACKAGES.join(" ")
    ))
}

/// On the host: DPDK, then one boot per mode running this binary with the same options.
fn host(o: &Opts) -> ExitCode {
    if let Err(e) = ensure_dpdk() {
        eprintln!("nic-bench: {e}; testpmd will be skipped");
    }
    let exe = std::env::current_exe().expect("own path");
    let mut pass: Vec<String> = vec![
        "--runs".into(),
        o.runs.to_string(),
        "--secs".into(),
        o.secs.to_string(),
        "--burst".into(),
        o.burst.to_string(),
    ];
    if !o.kernel {
        pass.push("--no-kernel".into());
    }
    let mut rc = ExitCode::SUCCESS;
    for m in &o.modes {
        let mut c = Command::new("cargo");
        c.args(["xtask", "vm"]);
        if *m == "noiommu" {
            c.arg("--noiommu");
        }
        c.arg("--").arg(&exe).args(&pass);
        println!("nic-bench: {m} mode: {c:?}");
        match c.status() {
            Ok(s) if s.success() => {}
            r => {
                eprintln!("nic-bench: the {m} run failed: {r:?}");
                rc = ExitCode::FAILURE;
            }
        }
    }
    rc
}

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

/// `vfpoll pktgen` for `o.secs` seconds: Mpps.
fn vfpoll_pktgen(o: &Opts, dst: &str) -> (f64, String) {
    to_vfio(NIC_0);
    let mut args = vec![
        "pktgen".to_string(),
        "--device".into(),
        NIC_0.into(),
        "--time".into(),
        o.secs.to_string(),
        "--size".into(),
        "60".into(),
        "--burst".into(),
        o.burst.to_string(),
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

/// An AF_PACKET send loop of 60-byte frames on `ifname` for `secs` seconds: Mpps.
fn af_packet(secs: u64, ifname: &str, dst: &str, src: &str) -> (f64, String) {
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
    while start.elapsed() < Duration::from_secs(secs) {
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
fn kernel_pktgen(secs: u64, ifname: &str, dst: &str) -> (f64, String) {
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
    let stopper = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(secs));
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

/// `dpdk-testpmd --forward-mode=txonly` on NIC 0: the mean of `o.secs` consecutive 1-s Tx-pps
/// samples after the first non-zero one (the first sample of a run is always 0: testpmd has no
/// earlier count to take a difference from), in Mpps.
fn dpdk(o: &Opts, dst: &str) -> (f64, String) {
    if Command::new("dpdk-testpmd").arg("--version").output().is_err() {
        return (
            f64::NAN,
            "dpdk-testpmd not installed: run nic-bench on the host (it installs dpdk-dev librte-net-e1000-23)".into(),
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
            &format!("--burst={}", o.burst),
            &format!("--eth-peer=0,{dst}"),
            "--nb-cores=1",
            "--txd=512",
            "--rxd=512",
            "--auto-start",
            "--stats-period=1",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("dpdk-testpmd");
    let (tx, lines) = mpsc::channel::<String>();
    let readers: Vec<_> = [
        Box::new(child.stdout.take().unwrap()) as Box<dyn io::Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ]
    .into_iter()
    .map(|r| {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(r).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        })
    })
    .collect();
    drop(tx);
    // EAL start-up is slow under TCG (tens of seconds); then `secs` samples.
    let deadline = Instant::now() + Duration::from_secs(90 + o.secs);
    let mut all: Vec<f64> = Vec::new();
    let mut used: Vec<f64> = Vec::new();
    let mut text: Vec<String> = Vec::new();
    while used.len() < o.secs as usize {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(l) = lines.recv_timeout(left) else {
            break; // exited or timed out
        };
        if let Some(pps) = l
            .split_once("Tx-pps:")
            .and_then(|(_, r)| r.split_whitespace().next()?.parse::<f64>().ok())
        {
            all.push(pps);
            if pps > 0.0 || !used.is_empty() {
                used.push(pps);
            }
        }
        text.push(l);
    }
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let stop = Instant::now() + Duration::from_secs(20);
    while child.try_wait().ok().flatten().is_none() && Instant::now() < stop {
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    text.extend(lines.iter());
    for r in readers {
        let _ = r.join();
    }
    let mpps = if used.len() == o.secs as usize {
        used.iter().sum::<f64>() / used.len() as f64 / 1e6
    } else {
        f64::NAN
    };
    let tail: Vec<&str> = text.iter().rev().take(30).map(String::as_str).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    (
        mpps,
        format!(
            "dpdk-testpmd: Tx-pps samples {all:?}, averaged {used:?}\n{}",
            tail.join("\n")
        ),
    )
}

/// Frames NIC 1's kernel driver has counted.
fn rx_count(ifname: &str) -> u64 {
    std::fs::read_to_string(format!("/sys/class/net/{ifname}/statistics/rx_packets"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Median, min and max of the finite values.
fn summary(v: &[f64]) -> (f64, f64, f64) {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let med = if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    };
    (med, s[0], s[n - 1])
}

fn main() -> ExitCode {
    let o = parse();
    if std::env::var_os("VFPOLL_TESTBED").is_none() {
        return host(&o);
    }
    reserve_hugepages(256);
    println!(
        "nic-bench: {} mode, {} runs of {} s per sender, burst {}, 60-byte frames, NIC 0 -> NIC 1",
        mode_name(),
        o.runs,
        o.secs,
        o.burst
    );
    let (rx_if, rx_mac) = on_kernel(NIC_1);
    let (mut v, mut d) = (Vec::new(), Vec::new());
    for r in 1..=o.runs {
        for (name, f, out) in [
            (
                "vfpoll pktgen",
                vfpoll_pktgen as fn(&Opts, &str) -> (f64, String),
                &mut v,
            ),
            ("dpdk-testpmd", dpdk, &mut d),
        ] {
            let before = rx_count(&rx_if);
            let (m, t) = f(&o, &rx_mac);
            println!("{t}");
            println!(
                "run {r}: {name}: {m:.4} Mpps; the receiver counted {} frames",
                rx_count(&rx_if) - before
            );
            out.push(m);
        }
    }
    let mut rows: Vec<(String, (f64, f64, f64))> = vec![
        (format!("vfpoll pktgen ({} runs)", v.len()), summary(&v)),
        (format!("dpdk-testpmd txonly ({} runs)", d.len()), summary(&d)),
    ];
    if o.kernel {
        let (tx_if, tx_mac) = on_kernel(NIC_0);
        let (k, t) = af_packet(o.secs, &tx_if, &rx_mac, &tx_mac);
        println!("{t}");
        rows.push(("kernel AF_PACKET send loop (1 run)".into(), (k, k, k)));
        let (p, t) = kernel_pktgen(o.secs, &tx_if, &rx_mac);
        println!("{t}");
        rows.push(("kernel pktgen.ko (1 run)".into(), (p, p, p)));
    }
    let vm = rows[0].1 .0;
    println!(
        "\n| sender ({} mode, {} s, burst {}) | median Mpps | min | max | vfpoll median / this |",
        mode_name(),
        o.secs,
        o.burst
    );
    println!("|---|---:|---:|---:|---:|");
    for (name, (med, min, max)) in &rows {
        println!("| {name} | {med:.4} | {min:.4} | {max:.4} | {:.2} |", vm / med);
    }
    ExitCode::SUCCESS
}
