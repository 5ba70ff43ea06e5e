//! Driver cost per I/O, without a VM: the in-process NVMe model on one core, the driver on the
//! other; CPU time and instructions the driver spends to submit and to complete 4 KiB reads
//! with pool buffers, at queue depths 1 to 128.
//!
//! ```text
//! cargo bench -p vfpoll-engine --bench driver_cost                 # ns per I/O
//! cargo bench -p vfpoll-engine --bench driver_cost -- --callgrind  # + instructions per I/O
//! ```
//!
//! Each round submits `qd` reads (`DmaPool::alloc` + `QueuePair::read`, then one
//! `flush_submissions`), waits *outside the driver* until the model has posted all `qd`
//! completions (it watches the model's counters), then reaps them with one `QueuePair::poll`
//! whose callback gives each buffer back to the pool. So the measured code is exactly the
//! driver's submit and complete paths, with no empty polls; the doorbells are rung once per
//! round (a batch of `qd`). Time comes from the TSC (calibrated), minus the cost of reading it;
//! the table shows the median round divided by `qd` (robust to the host preempting the thread).
//!
//! With `--callgrind` the binary runs itself again under `valgrind --tool=callgrind`, collecting
//! only inside `drv_submit` (`DmaPool::alloc` + `QueuePair::read`, once per I/O), `drv_flush`
//! (`QueuePair::flush_submissions`, once per round) and `complete_batch` (one `QueuePair::poll`
//! whose callback checks the result and calls `DmaPool::free`), and divides their inclusive
//! instruction counts by the I/Os. The benchmark's own loop (the random LBA) is outside; the
//! calls into those functions, which an application would inline, are inside. Options: `--ios N` (per queue depth), `--qd 1,4,32`, `--model-core C`,
//! `--driver-core C`, `--mmio-doorbells` (no shadow doorbells: the model's BAR is plain memory,
//! so this shows only the driver-side difference).

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use vfpoll_dma::{DmaBuf, DmaContext, DmaPool, FakeMapper, PageSize};
use vfpoll_engine::affinity::{allowed_cores, pin_current};
use vfpoll_engine::clock::Clock;
use vfpoll_nvme::{Controller, ControllerOptions, QpairOptions, QueuePair};
use vfpoll_nvme_model::{ModelConfig, NamespaceConfig, NvmeModel};

struct Opts {
    ios: u64,
    qds: Vec<u16>,
    model_core: Option<usize>,
    driver_core: Option<usize>,
    mmio: bool,
    callgrind: bool,
    /// Set in the run under valgrind: one queue depth, print the I/O count only.
    inner: bool,
}

fn parse() -> Opts {
    let cores = allowed_cores().unwrap_or_default();
    let mut o = Opts {
        ios: 400_000,
        qds: vec![1, 2, 4, 8, 16, 32, 64, 128],
        model_core: cores.first().copied(),
        driver_core: cores.get(1).copied(),
        mmio: false,
        callgrind: false,
        inner: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--ios" => o.ios = val().parse().expect("--ios N"),
            "--qd" => o.qds = val().split(',').map(|q| q.parse().expect("--qd 1,2,4")).collect(),
            "--model-core" => o.model_core = Some(val().parse().expect("--model-core C")),
            "--driver-core" => o.driver_core = Some(val().parse().expect("--driver-core C")),
            "--mmio-doorbells" => o.mmio = true,
            "--callgrind" => o.callgrind = true,
            "--inner" => o.inner = true,
            "--bench" => {} // cargo bench passes it
            _ => panic!("unknown option {a}; see the file's docs"),
        }
    }
    o
}

/// One submission as an application makes it: a buffer from the pool, a read into it. Not
/// inlined, so that callgrind can count exactly this (plus one call and return).
#[inline(never)]
fn drv_submit(qp: &mut QueuePair<DmaBuf>, pool: &mut DmaPool, lba: u64, tag: u64) {
    let buf = pool.alloc().expect("a free buffer");
    if let Err(r) = qp.read(1, lba * 8, buf, tag) {
        panic!("submit: {}", r.error);
    }
}

/// Rings the submission doorbell (once per batch).
#[inline(never)]
fn drv_flush(qp: &mut QueuePair<DmaBuf>) {
    qp.flush_submissions();
}

/// Submits `qd` 4 KiB reads and rings the doorbell once.
#[inline(never)]
fn submit_batch(qp: &mut QueuePair<DmaBuf>, pool: &mut DmaPool, qd: u16, lba: &mut u64, blocks: u64) {
    for i in 0..qd {
        // A cheap LCG over the namespace, in 4 KiB steps (`blocks / 8` is a power of two: a mask,
        // not a division, so the benchmark's own share of the count stays small).
        *lba = (lba
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407)
            >> 11)
            & (blocks / 8 - 1);
        drv_submit(qp, pool, *lba, i as u64);
    }
    drv_flush(qp);
}

/// Reaps every completion there is; gives the buffers back to the pool. Returns how many
/// completed and how many of those failed (the caller checks: no panic machinery in the
/// completion callback, as in an application's).
#[inline(never)]
fn complete_batch(qp: &mut QueuePair<DmaBuf>, pool: &mut DmaPool) -> (usize, usize) {
    let mut failed = 0;
    let n = qp.poll(usize::MAX, |d| {
        failed += d.result.is_err() as usize;
        if let Some(b) = d.buf {
            pool.free(b);
        }
    });
    (n, failed)
}

/// Waits (outside the driver) until the model has posted `target` completions in all.
#[inline(never)]
fn wait_posted(model: &NvmeModel, target: u64) {
    while model.stats().completions_posted < target {
        std::thread::yield_now();
    }
}

struct Row {
    qd: u16,
    ios: u64,
    submit_ns: f64,
    complete_ns: f64,
    mmio_doorbells: u64,
}

fn run_qd(o: &Opts, model: &NvmeModel, ctrl: &Controller, qd: u16, clock: &Clock, overhead: u64) -> Row {
    let mut pool = ctrl.dma().pool(4096, 128, PageSize::Base4K).expect("pool");
    let opts = QpairOptions {
        entries: 256,
        ..Default::default()
    };
    let mut qp = ctrl.create_qpair::<DmaBuf>(&opts).expect("queue pair");
    let blocks = ctrl.namespace(1).expect("ns 1").blocks;
    assert!(
        (blocks / 8).is_power_of_two(),
        "the LBA mask needs a power-of-two namespace"
    );
    let mut lba = 1u64;
    let rounds = (o.ios / qd as u64).max(1);
    let warmup = if o.inner { 10 } else { (2000 / qd as u64).max(20) };
    // Per-round times: the median is what one round costs when the thread runs undisturbed
    // (a round in which the host preempted the thread would skew a mean).
    let mut sub = Vec::with_capacity(rounds as usize);
    let mut com = Vec::with_capacity(rounds as usize);
    for r in 0..warmup + rounds {
        let posted = model.stats().completions_posted;
        let t0 = clock.ticks();
        submit_batch(&mut qp, &mut pool, qd, &mut lba, blocks);
        let t1 = clock.ticks();
        wait_posted(model, posted + qd as u64);
        let t2 = clock.ticks();
        let (n, failed) = complete_batch(&mut qp, &mut pool);
        let t3 = clock.ticks();
        assert_eq!(
            (n, failed),
            (qd as usize, 0),
            "one poll reaps the whole batch, no errors"
        );
        if r >= warmup {
            sub.push((t1 - t0).saturating_sub(overhead));
            com.push((t3 - t2).saturating_sub(overhead));
        }
    }
    let ios = rounds * qd as u64;
    let st = qp.stats();
    let per_io = |mut v: Vec<u64>| {
        v.sort_unstable();
        clock.ns(v[v.len() / 2]) as f64 / qd as f64
    };
    Row {
        qd,
        ios,
        submit_ns: per_io(sub),
        complete_ns: per_io(com),
        mmio_doorbells: st.sq_doorbells + st.cq_doorbells,
    }
}

/// Instructions per I/O at one queue depth, from a callgrind run of this binary.
struct Instr {
    submit: f64,
    complete: f64,
    /// Of the two, the benchmark's own code: the measured functions' frames (prologue,
    /// epilogue, call), its completion callback's body, its result checks. Everything else is
    /// the driver's (`vfpoll-nvme`, `vfpoll-dma`'s pool, and the standard library code they
    /// inline).
    harness: f64,
}

/// Instructions per I/O of submit and complete at one queue depth, from a callgrind run of
/// this binary.
fn callgrind(o: &Opts, qd: u16) -> Option<Instr> {
    let exe = std::env::current_exe().ok()?;
    let out = std::env::temp_dir().join(format!(
        "vfpoll-driver-cost-{}-qd{qd}.callgrind",
        std::process::id()
    ));
    let ios = 20_000u64.min(o.ios);
    let mut cmd = Command::new("valgrind");
    // Exact names: a pattern such as `*complete_batch*` also matches the completion callback
    // (`complete_batch::{{closure}}`) when the compiler keeps it out of line, and entering a
    // matching function toggles collection *off* until it returns, so the callback (the
    // pool's `free`, the error count) went uncounted.
    cmd.args([
        "--tool=callgrind",
        "--toggle-collect=driver_cost::drv_submit",
        "--toggle-collect=driver_cost::drv_flush",
        "--toggle-collect=driver_cost::complete_batch",
    ])
    .arg(format!("--callgrind-out-file={}", out.display()))
    .arg(&exe)
    .args(["--inner", "--ios", &ios.to_string(), "--qd", &qd.to_string()]);
    if o.mmio {
        cmd.arg("--mmio-doorbells");
    }
    let r = cmd.output().ok()?;
    if !r.status.success() {
        eprintln!("valgrind failed: {}", String::from_utf8_lossy(&r.stderr));
        return None;
    }
    let measured: u64 = String::from_utf8_lossy(&r.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("ios "))?
        .trim()
        .parse()
        .ok()?;
    let annotate = |inclusive: &str| -> Option<String> {
        let ann = Command::new("callgrind_annotate")
            .args([inclusive, "--threshold=100"])
            .arg(&out)
            .output()
            .ok()?;
        Some(String::from_utf8_lossy(&ann.stdout).into_owned())
    };
    let text = annotate("--inclusive=yes")?;
    let own = annotate("--inclusive=no")?;
    let _ = std::fs::remove_file(&out);
    // Self cost per file and function: the lines of this file inside the measured functions.
    let harness: u64 = own
        .lines()
        .filter(|l| l.contains("driver_cost.rs:driver_cost::") && !l.contains("=>"))
        .filter_map(|l| l.split_whitespace().next()?.replace(',', "").parse::<u64>().ok())
        .sum();
    // The inclusive line of exactly `driver_cost::<name>` (not a call line, not its closure).
    let count = |name: &str| -> Option<u64> {
        let fun = format!(":driver_cost::{name}");
        text.lines()
            .find(|l| !l.contains("=>") && l.split_whitespace().any(|f| f.ends_with(&fun)))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|n| n.replace(',', "").parse().ok())
    };
    // Warm-up rounds run under collection too: 10 rounds of `qd`.
    let total = measured + 10 * qd as u64;
    Some(Instr {
        submit: (count("drv_submit")? + count("drv_flush")?) as f64 / total as f64,
        complete: count("complete_batch")? as f64 / total as f64,
        harness: harness as f64 / total as f64,
    })
}

fn main() {
    let o = parse();
    let mapper = Arc::new(FakeMapper::new());
    let cfg = ModelConfig {
        namespaces: vec![NamespaceConfig::new(1, 512, 1 << 17)],
        idle_spin: Duration::from_secs(5),
        ..Default::default()
    };
    // The model's thread inherits this thread's affinity.
    if let Some(c) = o.model_core {
        pin_current(c).expect("pin to the model core");
    }
    let model = NvmeModel::start(cfg, mapper.clone()).expect("model");
    if let Some(c) = o.driver_core {
        pin_current(c).expect("pin to the driver core");
    }
    let copts = ControllerOptions {
        page_size: PageSize::Base4K,
        shadow_doorbells: !o.mmio,
        ..Default::default()
    };
    let ctrl = Controller::new(model.bar0(), DmaContext::new(mapper), copts).expect("controller");
    let clock = Clock::calibrate(Duration::from_millis(50));
    // What a back-to-back pair of clock reads costs, subtracted from every interval.
    let overhead = (0..1000)
        .map(|_| {
            let a = clock.ticks();
            clock.ticks() - a
        })
        .min()
        .unwrap_or(0);
    if o.inner {
        let row = run_qd(&o, &model, &ctrl, o.qds[0], &clock, overhead);
        println!("ios {}", row.ios);
        return;
    }
    println!(
        "driver cost per 4 KiB read (pool buffers): model on core {:?}, driver on core {:?}, {} doorbells, TSC clock ({} ns per read subtracted)",
        o.model_core,
        o.driver_core,
        if ctrl.shadow_doorbells() { "shadow" } else { "MMIO" },
        clock.ns(overhead)
    );
    print!(
        "{:>5} {:>9} {:>11} {:>13} {:>10} {:>10}",
        "QD", "I/Os", "submit ns", "complete ns", "total ns", "MMIO dbs"
    );
    if o.callgrind {
        print!(
            " {:>12} {:>14} {:>11} {:>13} {:>12}",
            "submit instr", "complete instr", "total instr", "of which bench", "driver instr"
        );
    }
    println!();
    for &qd in &o.qds {
        let r = run_qd(&o, &model, &ctrl, qd, &clock, overhead);
        print!(
            "{:>5} {:>9} {:>11.1} {:>13.1} {:>10.1} {:>10}",
            r.qd,
            r.ios,
            r.submit_ns,
            r.complete_ns,
            r.submit_ns + r.complete_ns,
            r.mmio_doorbells
        );
        if o.callgrind {
            match callgrind(&o, qd) {
                Some(i) => print!(
                    " {:>12.0} {:>14.0} {:>11.0} {:>13.0} {:>12.0}",
                    i.submit,
                    i.complete,
                    i.submit + i.complete,
                    i.harness,
                    i.submit + i.complete - i.harness
                ),
                None => print!(" {:>12}", "(failed)"),
            }
        }
        println!();
    }
    drop(ctrl);
    let _ = model.stop();
}
