//! Device removal in the test bed (issue 12, item 3). The boot has NVMe controller R behind a
//! PCIe root port (xtask gives this binary's boots `Boot::hotplug`), unplugged and plugged back
//! with QMP through the harness's agent ([`vfpoll_tests::qmp`]).
//!
//! `vfpoll perf --verify` runs over R and B; R is unplugged (`device_del`) mid-I/O. The guest
//! must complete the removal within 2 s of the request (R gone from its sysfs, and QEMU's
//! `DEVICE_DELETED`, timed on the host), perf must report R's removal within that time and exit
//! non-zero naming it, and B's I/O must run to the end and verify. Then R is plugged back
//! (`device_add`): bound to vfio-pci, identified and verified again. QEMU 7.2 now and then
//! sends no `DEVICE_DELETED` for a vfio-bound controller unplugged under load in IOMMU mode
//! although the guest let it go (and then cannot plug it back): the test says so and skips the
//! re-add, and the guest's side is still checked. Runs the `vfpoll` on the guest's PATH (the harness's debug
//! build), or `VFPOLL_REMOVAL_BIN`. Besides: a BAR mapping that vanishes under the process
//! (vfio-pci zaps it while memory decode is off) costs a SIGBUS that vfpoll's handler repairs.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use vfpoll_tests::qmp::{self, NVME_R, NVME_R_ID};
use vfpoll_tests::*;

/// Issue 12: the guest lets the device go within this of the removal request.
const REMOVAL_BOUND: Duration = Duration::from_secs(2);
/// Bytes of each namespace the verify run covers: long enough (two passes, 4 KiB I/Os) that the
/// removal, 3 s in, comes while I/O runs.
const VERIFY_BYTES: &str = "48M";
/// When R is unplugged, after perf's start.
const UNPLUG_AFTER: Duration = Duration::from_secs(3);
/// The manifest the host check reads.
const MANIFEST: &str = "recovery-removal.txt";

fn vfpoll_bin() -> String {
    std::env::var("VFPOLL_REMOVAL_BIN").unwrap_or_else(|_| "vfpoll".into())
}

/// `args`, plus `--noiommu` in no-IOMMU boots.
fn with_mode<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut v = args.to_vec();
    if mode_name() == "noiommu" {
        v.push("--noiommu");
    }
    v
}

fn vfpoll(args: &[&str]) -> Output {
    let all = with_mode(args);
    let out = Command::new(vfpoll_bin())
        .args(&all)
        .output()
        .expect("run vfpoll (target/debug is on the guest's PATH)");
    println!(
        "$ vfpoll {}\n{}{}",
        all.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn pci_present(bdf: &str) -> bool {
    Path::new("/sys/bus/pci/devices").join(bdf).exists()
}

/// Whether `bdf` is on the kernel's nvme driver with its controller live (its probe done).
fn nvme_live(bdf: &str) -> bool {
    let dir = Path::new("/sys/bus/pci/devices").join(bdf).join("nvme");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return false;
    };
    entries
        .filter_map(|e| e.ok())
        .any(|e| std::fs::read_to_string(e.path().join("state")).is_ok_and(|s| s.trim() == "live"))
}

/// Waits up to `limit` for `cond`; returns how long it took.
fn wait_until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) -> Duration {
    let t = Instant::now();
    while !cond() {
        assert!(t.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    t.elapsed()
}

#[test]
#[ignore = "test bed"]
fn guest_removal_mid_io_then_readd() {
    assert!(
        pci_present(NVME_R),
        "controller R ({NVME_R}) is missing: this boot has no hot-pluggable controller (xtask's HOTPLUG_BINS)"
    );
    bind_all(&[NVME_R, NVME_B]);
    reserve_hugepages(64);
    let seed = seed().to_string();

    // 1. perf --verify over R and B; R unplugged mid-I/O.
    let args = with_mode(&[
        "perf",
        "--verify",
        "-d",
        NVME_R,
        "-d",
        NVME_B,
        "--size",
        VERIFY_BYTES,
        "--queue-depth",
        "8",
        "--seed",
        &seed,
        "--json",
    ]);
    println!("$ {} {}", vfpoll_bin(), args.join(" "));
    let mut perf = Command::new(vfpoll_bin())
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start vfpoll perf");
    // stderr line by line, with its arrival time; stdout (the JSON) whole.
    let (tx, rx) = mpsc::channel::<(Instant, String)>();
    let err = perf.stderr.take().expect("piped");
    let err_reader = std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(|l| l.ok()) {
            let _ = tx.send((Instant::now(), line));
        }
    });
    let mut out = perf.stdout.take().expect("piped");
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    std::thread::sleep(UNPLUG_AFTER);
    assert!(
        perf.try_wait().expect("perf").is_none(),
        "perf ended before the removal: make VERIFY_BYTES larger"
    );
    // The guest's side of the removal ends when the kernel drops R from sysfs (after vfio-pci
    // got the device back from vfpoll); watched from here, in the guest's clock.
    let gone_watch = std::thread::spawn(|| {
        let t = Instant::now();
        while pci_present(NVME_R) && t.elapsed() < Duration::from_secs(45) {
            std::thread::sleep(Duration::from_millis(5));
        }
        (!pci_present(NVME_R)).then(Instant::now)
    });
    let del = qmp::device_del(NVME_R_ID, Duration::from_secs(30));
    let del_sent = del.sent;
    let reply = del.wait(Duration::from_secs(60));
    println!("device_del: {}", reply.text.trim());
    assert!(reply.error.is_none(), "device_del: {}", reply.text);
    let gone_at = gone_watch.join().expect("sysfs watch");
    let guest_ms = gone_at
        .unwrap_or_else(|| {
            panic!(
                "{NVME_R} is still in the guest's sysfs 45 s after device_del: {}",
                reply.text
            )
        })
        .saturating_duration_since(del_sent)
        .as_secs_f64()
        * 1e3;
    // QEMU 7.2 now and then never finalizes a vfio-bound controller unplugged under load in
    // IOMMU mode (no DEVICE_DELETED although the guest let it go; BENCHMARKS.md, "Device
    // removal"). The guest's side is what vfpoll controls and is checked either way; without
    // QEMU's event, QEMU still holds R's block node and cannot plug it back.
    let event_ms = reply.event_ms;
    if event_ms.is_none() {
        println!(
            "QEMU sent no DEVICE_DELETED although the guest removed {NVME_R} {guest_ms:.1} ms after \
             device_del (QEMU 7.2's anomaly); the re-add step is skipped"
        );
    }

    let status = {
        let t = Instant::now();
        loop {
            if let Some(s) = perf.try_wait().expect("perf") {
                break s;
            }
            assert!(t.elapsed() < Duration::from_secs(600), "perf did not end");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    err_reader.join().unwrap();
    let json_text = out_reader.join().unwrap();
    let lines: Vec<(Instant, String)> = rx.try_iter().collect();
    for (_, l) in &lines {
        println!("perf stderr: {l}");
    }
    println!("perf stdout:\n{json_text}");
    assert!(
        !status.success(),
        "perf passed although {NVME_R} was removed mid-run"
    );
    let (reported_at, _) = lines
        .iter()
        .find(|(_, l)| l.contains(&format!("vfpoll perf: {NVME_R} was removed")))
        .unwrap_or_else(|| panic!("perf never reported the removal of {NVME_R}"));
    let report_ms = reported_at.saturating_duration_since(del_sent).as_secs_f64() * 1e3;
    assert!(
        lines
            .iter()
            .any(|(_, l)| l.contains("FAILED") && l.contains(NVME_R) && l.contains("removed")),
        "perf's last word names the removed controller"
    );
    println!(
        "removal: DEVICE_DELETED {} after device_del (host), R gone from the guest's sysfs \
         {guest_ms:.1} ms after it, perf reported it {report_ms:.1} ms after it (guest)",
        event_ms.map_or("never came".to_string(), |e| format!("{e:.1} ms"))
    );
    let bound_ms = REMOVAL_BOUND.as_secs_f64() * 1e3;
    assert!(
        guest_ms < bound_ms,
        "the guest took {guest_ms:.1} ms to let {NVME_R} go (bound {REMOVAL_BOUND:?})"
    );
    if let Some(e) = event_ms {
        assert!(
            e < bound_ms,
            "DEVICE_DELETED came {e:.1} ms after device_del (bound {REMOVAL_BOUND:?})"
        );
    }
    assert!(
        report_ms < REMOVAL_BOUND.as_secs_f64() * 1e3,
        "perf reported the removal {report_ms:.1} ms after the request (bound {REMOVAL_BOUND:?})"
    );

    // B ran to the end and verified; every error is R's.
    let v: serde_json::Value = serde_json::from_str(&json_text).expect("perf's JSON");
    assert_eq!(v["verify"]["mismatches"], 0, "mismatches: {}", v["verify"]);
    let samples = v["error_samples"].as_array().expect("error_samples");
    assert!(!samples.is_empty(), "R's I/O in flight failed");
    for s in samples {
        let s = s.as_str().unwrap_or_default();
        assert!(
            s.starts_with(NVME_R) && s.contains("was removed"),
            "an error that is not R's removal: {s}"
        );
    }
    let units = 48u64 << 20 >> 12;
    let b_ios: u64 = v["workers"]
        .as_array()
        .expect("workers")
        .iter()
        .flat_map(|w| w["queues"].as_array().cloned().unwrap_or_default())
        .filter(|q| q["device"] == NVME_B)
        .map(|q| {
            assert_eq!(q["errors"], 0, "B's queue had errors: {q}");
            q["ios"].as_u64().unwrap_or(0)
        })
        .sum();
    assert_eq!(b_ios, 2 * units, "B's verify wrote and read every unit");

    let manifest = |readded: bool| {
        write_manifest(
            MANIFEST,
            &[
                (
                    "event_ms".into(),
                    event_ms.map_or("none".into(), |e| format!("{e:.1}")),
                ),
                ("guest_ms".into(), format!("{guest_ms:.1}")),
                ("report_ms".into(), format!("{report_ms:.1}")),
                ("readded".into(), readded.to_string()),
                ("binary".into(), vfpoll_bin()),
            ],
        )
    };
    if event_ms.is_none() {
        manifest(false);
        return;
    }

    // 2. R plugged back in: the same BDF, bound, identified, verified.
    qmp::device_add(qmp::nvme_r_device());
    let took = wait_until(Duration::from_secs(30), "R back in sysfs", || pci_present(NVME_R));
    println!("{NVME_R} back {took:?} after device_add");
    // The kernel's nvme driver takes it first (its probe runs on): let it finish before
    // vfio-pci takes over, as the guest's init does for the boot-time controllers.
    let took = wait_until(Duration::from_secs(30), "R live on the nvme driver", || {
        nvme_live(NVME_R)
    });
    println!("{NVME_R} live on nvme {took:?} later");
    bind_all(&[NVME_R]);
    let id = vfpoll(&["identify", "-d", NVME_R]);
    assert!(
        id.status.success(),
        "identify of the re-added controller failed: {:?}",
        id.status
    );
    assert!(String::from_utf8_lossy(&id.stdout).contains("vfpoll-r"));
    let again = vfpoll(&["perf", "--verify", "-d", NVME_R, "--size", "4M", "--seed", &seed]);
    assert!(again.status.success(), "I/O on the re-added controller failed");

    manifest(true);
}

/// A surprise removal as the process sees it, on a real vfio-pci device: with memory decode off,
/// vfio-pci zaps the BAR mapping and an access raises SIGBUS. vfpoll's handler replaces the
/// mapping with all-ones memory and the access completes: the process goes on, and reads say
/// the device is gone. Controller A, opened through vfpoll-pci alone.
#[test]
#[ignore = "test bed"]
fn guest_a_bar_that_vanishes_reads_all_ones_instead_of_killing() {
    use vfpoll_pci::vfio::{pci_cfg, Container};
    bind_all(&[NVME_A]);
    let c = Container::open(mode()).expect("container");
    let dev = c.device(bdf(NVME_A)).expect("NVMe A");
    let cmd = dev.enable_bus_master().expect("memory space and bus master on");
    // SAFETY: the test only reads registers through it.
    let bar = unsafe { dev.map_bar(0) }.expect("BAR0");
    let vs = bar.read32(0x08);
    assert_ne!(vs, u32::MAX, "VS reads before");
    dev.config_write_u16(pci_cfg::COMMAND, cmd & !pci_cfg::COMMAND_MEMORY)
        .expect("memory space off");
    // vfio-pci zapped the mapping: this read faults (SIGBUS) and is repaired.
    assert_eq!(bar.read32(0x08), u32::MAX, "the repaired mapping reads all-ones");
    assert!(bar.gone() && dev.mapping_faulted(), "the fault was counted");
    assert_eq!(bar.mapping().faults(), 1);
    // The device is back (memory decode on): a new mapping reaches it again.
    dev.config_write_u16(pci_cfg::COMMAND, cmd)
        .expect("memory space on");
    // SAFETY: as above.
    let again = unsafe { dev.map_bar(0) }.expect("BAR0 again");
    assert_eq!(again.read32(0x08), vs);
    assert_eq!(bar.read32(0x08), u32::MAX, "the old mapping stays replaced");
}

#[test]
#[ignore = "host check"]
fn host_check_removal_within_bound_and_logged() {
    let m = read_manifest(MANIFEST);
    let event = manifest_get(&m, "event_ms");
    let guest_ms: f64 = manifest_get(&m, "guest_ms").parse().unwrap();
    let report_ms: f64 = manifest_get(&m, "report_ms").parse().unwrap();
    println!(
        "{}: device_del -> DEVICE_DELETED {event} ms, R gone in the guest {guest_ms} ms, perf's report \
         {report_ms} ms, re-added: {} ({})",
        run_mode(),
        manifest_get(&m, "readded"),
        manifest_get(&m, "binary")
    );
    let bound_ms = REMOVAL_BOUND.as_secs_f64() * 1e3;
    assert!(guest_ms < bound_ms && report_ms < bound_ms);
    // The agent's log has the exchange: QEMU's own event, or the wait for it that ran out.
    let log = std::fs::read_to_string(run_dir().join("qmp.log")).expect("qmp.log");
    match event {
        "none" => assert!(log.contains("event-timeout DEVICE_DELETED"), "{log}"),
        e => {
            assert!(e.parse::<f64>().unwrap() < bound_ms);
            assert!(
                log.contains("DEVICE_DELETED") && manifest_get(&m, "readded") == "true",
                "{log}"
            );
        }
    }
}
