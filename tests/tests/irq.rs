//! Interrupt mode in the test bed (issue 13, part 3): QEMU's NVMe controller interrupts through
//! MSI-X and vfio-pci (both IOMMU modes: vfio-pci offers MSI-X in no-IOMMU mode too), `vfpoll
//! perf --completion irq` and `hybrid` complete with `--verify`, and an idle interrupt-mode
//! queue pair sleeping in `QueuePair::wait` costs the process less than 1 % of a core.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use vfpoll_nvme::{CompletionMode, Controller, ControllerOptions, Done, QpairOptions, RegionBuf};
use vfpoll_pci::vfio::{Container, IrqIndex};
use vfpoll_tests::*;

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

/// User + system CPU time of this process.
fn process_cpu() -> Duration {
    let mut u = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one rusage into the valid, exclusively borrowed buffer.
    let r = unsafe { libc::getrusage(libc::RUSAGE_SELF, u.as_mut_ptr()) };
    assert_eq!(r, 0, "getrusage");
    // SAFETY: getrusage succeeded and filled it (and zeroed memory is a valid rusage anyway).
    let u = unsafe { u.assume_init() };
    let d = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    d(u.ru_utime) + d(u.ru_stime)
}

#[test]
#[ignore = "test bed"]
fn guest_perf_verify_in_irq_and_hybrid_mode() {
    bind_all(&[NVME_B]);
    reserve_hugepages(64);
    for mode in ["irq", "hybrid"] {
        let out = vfpoll(&[
            "perf",
            "--verify",
            "-d",
            NVME_B,
            "--size",
            "2m",
            "-q",
            "8",
            "--completion",
            mode,
            "--json",
        ]);
        let t = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{mode}: {t}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("perf --json prints JSON");
        assert_eq!(v["completion"], mode);
        assert_eq!(v["verify"]["passed"], true, "{t}");
        assert_eq!(v["verify"]["mismatches"], 0, "{t}");
        let cpu = v["cpu"]["process_s"].as_f64().expect("cpu.process_s");
        assert!(cpu > 0.0 && v["cpu"]["percent_of_core"].as_f64().is_some(), "{t}");
        // A timed QD1 run, text output: the CPU line is there.
        let out = vfpoll(&["perf", "-d", NVME_B, "-q", "1", "-t", "2", "--completion", mode]);
        let t = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{t}");
        assert!(
            t.contains(&format!("completion {mode}")) && t.contains("of one core"),
            "{t}"
        );
    }
}

#[test]
#[ignore = "test bed"]
fn guest_an_idle_interrupt_mode_queue_pair_sleeps() {
    bind_all(&[NVME_A]);
    reserve_hugepages(64);
    let c = Container::open(mode()).expect("container");
    let (ctrl, dma) =
        Controller::open_first(&c, bdf(NVME_A), ControllerOptions::default()).expect("controller A");
    let _dma_back = DmaReturnCheck::new(&dma);
    let msix = ctrl.irq_info(IrqIndex::MSIX).unwrap().expect("through VFIO");
    println!("MSI-X ({}): {msix:?}", mode_name());
    assert!(msix.count > 1 && msix.eventfd(), "{msix:?}");
    let opts = QpairOptions {
        completion: CompletionMode::Irq,
        ..Default::default()
    };
    let mut qp = ctrl
        .create_qpair::<RegionBuf>(&opts)
        .expect("interrupt-mode queue pair");
    assert_eq!(qp.vector(), Some(1));
    let mut poll_qp = ctrl.create_qpair::<RegionBuf>(&QpairOptions::default()).unwrap();
    let mut qp2 = ctrl.create_qpair::<RegionBuf>(&opts).unwrap();
    assert_eq!((poll_qp.vector(), qp2.vector()), (None, Some(2)));

    // Reads complete by interrupt: wait() wakes, poll() finds them.
    let region = dma.alloc_region(64 << 10, vfpoll_dma::PageSize::Huge2M).unwrap();
    let mut buf = Some(RegionBuf::new(region, 0, 4096).unwrap());
    for round in 0..20u64 {
        qp.read(1, round * 8, buf.take().unwrap(), round)
            .map_err(|r| r.error)
            .unwrap();
        let start = Instant::now();
        let mut done: Option<Done<RegionBuf>> = None;
        while done.is_none() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "no interrupt within 10 s"
            );
            qp.wait(Some(Duration::from_secs(10))).unwrap();
            qp.poll(1, |d| done = Some(d));
        }
        let d = done.unwrap();
        assert_eq!(d.tag, round);
        d.result.unwrap();
        buf = d.buf;
    }
    let s = qp.stats();
    println!("after 20 reads: {s:?}");

    // Idle: two seconds asleep in wait() cost the process under 1 % of a core.
    let (cpu, t) = (process_cpu(), Instant::now());
    assert!(
        !qp.wait(Some(Duration::from_secs(2))).unwrap(),
        "no completion, no wakeup"
    );
    let (used, slept) = (process_cpu() - cpu, t.elapsed());
    let pct = 100.0 * used.as_secs_f64() / slept.as_secs_f64();
    println!(
        "idle interrupt-mode wait ({}): {used:?} of CPU in {slept:?} = {pct:.3}% of a core",
        mode_name()
    );
    assert!(slept >= Duration::from_millis(1990), "{slept:?}");
    assert!(pct < 1.0, "{pct:.3}% of a core while idle");

    // The queue pairs' vectors are independent: qp2 wakes for its own read, not qp's.
    qp2.read(1, 0, buf.take().unwrap(), 7)
        .map_err(|r| r.error)
        .unwrap();
    assert!(qp2.wait(Some(Duration::from_secs(10))).unwrap());
    assert!(
        !qp.wait(Some(Duration::from_millis(100))).unwrap(),
        "qp's vector stayed quiet"
    );
    let mut got = None;
    let start = Instant::now();
    while got.is_none() && start.elapsed() < Duration::from_secs(10) {
        qp2.poll(1, |d| got = Some(d));
    }
    got.expect("qp2's read").result.unwrap();
    assert_idle(&qp, "interrupt-mode queue pair");
    assert_idle(&poll_qp, "polled queue pair");
    let _ = poll_qp.poll(1, |_| {});
}
