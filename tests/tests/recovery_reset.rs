//! Controller reset and recovery in the test bed (issue 12, part 5): `vfpoll perf --verify` at
//! QD32 on NVMe A while `--reset-every` resets the controller (CC.EN 1 -> 0 -> 1, admin queue
//! and features again, every queue pair re-created in place) several times: zero mismatches and
//! zero I/O errors, the interrupted I/Os issued again, and the host finds the pattern in the
//! image file. And through the library: a reset from another thread while a queue pair has
//! reads in flight hands their buffers back with the reset's error, and the same queue pair
//! (same queue id) then reads and writes correctly; a feature set before the reset is set again
//! after it.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use vfpoll_dma::PageSize;
use vfpoll_nvme::{Controller, ControllerOptions, NvmeError, QpairOptions, RegionBuf};
use vfpoll_pci::vfio::Container;
use vfpoll_tests::*;

/// Bytes of NVMe A namespace 1 (512-byte blocks) the verify run covers.
const VERIFY_BYTES: u64 = 16 << 20;
/// Where the library test writes (past the verify range).
const API_LBA: u64 = (VERIFY_BYTES / 512) + 1024;

fn vfpoll(args: &[&str]) -> Output {
    let mut all: Vec<&str> = args.to_vec();
    if mode_name() == "noiommu" {
        all.push("--noiommu");
    }
    let out = Command::new("vfpoll")
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

#[test]
#[ignore = "test bed"]
fn guest_reset_during_perf_verify_qd32() {
    bind_all(&[NVME_A]);
    reserve_hugepages(64);
    let seed = seed().to_string();
    let size = VERIFY_BYTES.to_string();
    let out = vfpoll(&[
        "perf",
        "--verify",
        "-d",
        NVME_A,
        "--nsid",
        "1",
        "--size",
        &size,
        "-w",
        "randwrite",
        "-o",
        "4k",
        "-q",
        "32",
        "--reset-every",
        "0.3",
        "--seed",
        &seed,
        "--json",
    ]);
    let t = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "verify under resets failed: {t}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("perf --json prints JSON");
    assert_eq!(v["verify"]["mismatches"], 0, "{v}");
    assert_eq!(v["errors"], 0, "{v}");
    assert_eq!(v["verify"]["passed"], true, "{v}");
    let blocks = VERIFY_BYTES / 512;
    assert_eq!(v["verify"]["blocks_written"], blocks, "{v}");
    assert_eq!(v["verify"]["blocks_checked"], blocks, "{v}");
    let resets = &v["resets"];
    let done = resets["done"].as_u64().expect("resets.done");
    assert!(done >= 2, "only {done} resets during the run: {resets}");
    assert_eq!(resets["failed"].as_array().map(Vec::len), Some(0), "{resets}");
    // At QD32 every reset finds I/Os in flight: they were issued again, not failed.
    assert!(v["reissued"].as_u64().unwrap() >= 1, "{v}");
    println!(
        "{done} resets: {} ms min / {} mean / {} max; longest gap between completions {} ms; {} I/Os issued again",
        resets["min_ms"], resets["mean_ms"], resets["max_ms"], v["max_gap_ms"], v["reissued"]
    );
    write_manifest("recovery_reset.txt", &[("seed".into(), seed)]);
}

#[test]
#[ignore = "test bed"]
fn host_check_reset_during_perf_verify_qd32() {
    let m = read_manifest("recovery_reset.txt");
    let seed: u64 = manifest_get(&m, "seed").parse().unwrap();
    let path = run_dir().join("nvme-a-ns1.img");
    let data = read_file_range(&path, 0, VERIFY_BYTES as usize);
    for (i, block) in data.chunks_exact(512).enumerate() {
        let word = |o: usize| u64::from_le_bytes(block[o..o + 8].try_into().unwrap());
        assert_eq!(
            (word(0), word(8), &block[20..24]),
            (i as u64, seed, &b"vfpl"[..]),
            "nvme-a-ns1.img: block {i} does not carry its own LBA and the run's seed"
        );
    }
}

#[test]
#[ignore = "test bed"]
fn guest_api_reset_with_reads_in_flight() {
    bind_all(&[NVME_A]);
    reserve_hugepages(64);
    let c = Container::open(mode()).expect("container");
    let (ctrl, dma) =
        Controller::open_first(&c, bdf(NVME_A), ControllerOptions::default()).expect("controller A");
    let _dma_back = DmaReturnCheck::new(&dma);
    let mut qp = ctrl
        .create_qpair::<RegionBuf>(&QpairOptions::default())
        .expect("qpair");
    let qid = qp.qid();
    let buf = |fill: u8| {
        let mut r = dma.alloc_region(128 << 10, PageSize::Huge2M).unwrap();
        r.fill(0, 128 << 10, fill).unwrap();
        RegionBuf::new(r, 0, 128 << 10).unwrap()
    };
    // A known pattern to read back later.
    let pattern: Vec<u8> = Pattern::new(seed(), 12).bytes(128 << 10);
    let mut w = buf(0);
    w.write(0, &pattern).unwrap();
    qp.write(1, API_LBA, w, 0).map_err(|r| r.error).unwrap();
    let d = drain_one(&mut qp);
    d.result.expect("write before the reset");
    // 32 large reads in flight, then a reset from another thread while this one polls.
    for tag in 1..=32u64 {
        qp.read(1, (tag - 1) * 256, buf(0xee), tag)
            .map_err(|r| r.error)
            .unwrap();
    }
    qp.flush_submissions();
    let c2 = ctrl.clone();
    let resetter = std::thread::spawn(move || c2.reset());
    let (mut ok, mut reset) = (0, 0);
    let start = Instant::now();
    while ok + reset < 32 {
        qp.poll(usize::MAX, |d| {
            assert!(d.buf.is_some(), "tag {}: buffer handed back", d.tag);
            match d.result {
                Ok(_) => ok += 1,
                Err(NvmeError::Reset { qid: q, .. }) if q == qid => reset += 1,
                Err(e) => panic!("tag {}: {e}", d.tag),
            }
        });
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{ok} + {reset} of 32 back"
        );
    }
    let report = resetter.join().unwrap().expect("the reset");
    println!(
        "reset took {:?} ({} attempt(s), function reset: {}); {ok} reads completed before it, {reset} ended by it",
        report.took, report.attempts, report.function_reset
    );
    assert_eq!(ctrl.resets().0, 1);
    // The same queue pair reads the pattern back; admin works.
    qp.read(1, API_LBA, buf(0), 99).map_err(|r| r.error).unwrap();
    let d = drain_one(&mut qp);
    d.result.expect("read after the reset");
    let mut got = vec![0; 128 << 10];
    d.buf.unwrap().read(0, &mut got).unwrap();
    assert!(got == pattern, "the data written before the reset reads back");
    assert_eq!(qp.qid(), qid);
    assert_eq!(qp.stats().resets, 1);
    ctrl.smart_log().expect("admin after the reset");
    // A feature set before a reset is set again after it (Temperature Threshold, 04h: the
    // composite sensor's over-temperature threshold, 352 K).
    ctrl.set_feature(0x04, 0x0160).expect("temperature threshold");
    ctrl.reset().expect("second reset");
    assert_eq!(ctrl.get_feature(0x04).unwrap() & 0xffff, 0x0160);
    assert_eq!(ctrl.failed(), None);
    drop(qp);
}

fn drain_one(qp: &mut vfpoll_nvme::QueuePair<RegionBuf>) -> vfpoll_nvme::Done<RegionBuf> {
    let mut out = None;
    let start = Instant::now();
    while out.is_none() {
        qp.poll(1, |d| out = Some(d));
        assert!(start.elapsed() < Duration::from_secs(60), "no completion");
    }
    out.unwrap()
}
