//! `vfpoll perf`: measure NVMe I/O through vfpoll's driver (spdk_nvme_perf and fio in one), or
//! verify that data reads back as written. The I/O runs on `vfpoll-engine` workers; this module
//! parses the options, opens the controllers (VFIO, or the in-process model), and prints.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context};
use serde_json::json;
use vfpoll_dma::{DmaContext, PageSize};
use vfpoll_engine::affinity::{allowed_cores, parse_cores, set_current};
use vfpoll_engine::{split_evenly, Engine, JobSpec, Limit, Namespace, Workload};
use vfpoll_nvme::{CompletionMode, Controller, ControllerOptions, QpairOptions};
use vfpoll_pci::vfio::Backend;
use vfpoll_pci::Bdf;

use crate::cpu_time::process_cpu;
use crate::ctx::Ctx;
use crate::units::parse_nonzero_bytes as parse_size;
use crate::units::parse_page_size;

mod output;
mod reset_every;

use output::{human_bytes, print_breakdown, print_histogram, print_text, thousands, to_json};

/// Options of `vfpoll perf`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// NVMe controller to drive, by PCI address (bound to vfio-pci: `vfpoll bind BDF`).
    /// Repeat for several; every worker gets a queue pair on each.
    #[arg(
        long = "device",
        short = 'd',
        value_name = "BDF",
        required_unless_present = "model"
    )]
    pub devices: Vec<Bdf>,
    /// Namespaces to drive on every device: a list such as `1,2`, or `all` for every active
    /// namespace.
    #[arg(long, short = 'n', value_name = "LIST", default_value = "1")]
    pub nsid: String,
    /// Access pattern: randread, randwrite, read, write, randrw, rw. On a zoned namespace:
    /// write (each worker resets its zones, then writes them in order at their write pointers,
    /// several zones at once with one write in flight each), read and randread; randwrite,
    /// randrw and rw are refused.
    #[arg(long, short = 'w', default_value = "randread", value_parser = parse_workload)]
    pub workload: Workload,
    /// Percent of reads for randrw and rw.
    #[arg(long, value_name = "PERCENT", default_value_t = 50,
          value_parser = clap::value_parser!(u8).range(0..=100))]
    pub rwmix: u8,
    /// Bytes per I/O: 4k, 128k, 1m, 512 ... (binary units).
    #[arg(long, short = 'o', value_name = "SIZE", default_value = "4k", value_parser = parse_size)]
    pub io_size: u64,
    /// I/Os in flight per queue pair (one queue pair per worker and device).
    #[arg(long, short = 'q', value_name = "N", default_value_t = 32)]
    pub queue_depth: u16,
    /// Run for this many seconds [default: 10].
    #[arg(long, short = 't', value_name = "SECS", conflicts_with = "ios", value_parser = parse_secs)]
    pub time: Option<Duration>,
    /// Run for this many I/Os in all, instead of a time.
    #[arg(long, value_name = "N")]
    pub ios: Option<u64>,
    /// Run the workload this many seconds before the measured --time and count none of it:
    /// the figures start from zero when it ends (errors are kept). It takes the first touches
    /// of buffers and queues, the caches' and (under an emulator) the code translation's
    /// start out of the figures. 0: none [default: 1; none with --ios or --verify, which take
    /// no warm-up].
    #[arg(long, value_name = "SECS", value_parser = parse_warmup)]
    pub warmup: Option<Duration>,
    /// Cores to run workers on, one worker each: `0`, `0,1`, `2-5` [default: the first core
    /// this process may use].
    #[arg(long, short = 'c', value_name = "LIST")]
    pub cores: Option<String>,
    /// Use only this many bytes of each namespace, from LBA 0 [default: all of it]. Zoned
    /// namespaces are shared out in whole zones (the size rounded down to whole zones).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub size: Option<u64>,
    /// Write every I/O unit of the range once with a seeded, LBA-tagged pattern (in random
    /// order for rand* workloads), then read each back and check it. Reports the LBA of each
    /// block that differs and exits 1. Makes one pass: --time and --ios do not apply. On a
    /// zoned namespace the writes go zone by zone in order (below each zone's capacity; a
    /// remainder smaller than an I/O is skipped and the zone finished), the reads in the
    /// workload's order (-w write or randread).
    #[arg(long, conflicts_with_all = ["time", "ios"])]
    pub verify: bool,
    /// Seed of offsets, mixes and the verify pattern [default: from the clock; printed].
    #[arg(long)]
    pub seed: Option<u64>,
    /// No IOMMU: open the devices through vfio's no-IOMMU mode (the same as --iommu-backend
    /// noiommu).
    #[arg(long)]
    pub noiommu: bool,
    #[arg(long, value_name = "BACKEND", default_value = "auto", help = crate::iommu_backend::HELP,
          conflicts_with = "model")]
    pub iommu_backend: Backend,
    /// Run against vfpoll's in-process NVMe model (one 64 MiB namespace of 512-byte blocks)
    /// instead of a device: needs no NVMe, no VFIO and no hugepages.
    #[arg(long, conflicts_with_all = ["devices", "noiommu"])]
    pub model: bool,
    /// Core for the model's controller thread [default: a core without a worker, if any].
    #[arg(long, value_name = "CORE", requires = "model")]
    pub model_core: Option<usize>,
    /// Do not use shadow doorbells (Doorbell Buffer Config) even where the controller offers
    /// them: every doorbell update is an MMIO write.
    #[arg(long)]
    pub no_shadow_doorbell: bool,
    /// Ring the completion-queue head doorbell at the end of every poll that reaped
    /// completions, instead of deferring it until half the queue could be in use (the
    /// driver's default, QpairOptions::defer_cq_doorbell).
    #[arg(long)]
    pub no_cq_defer: bool,
    /// Page size of the data buffers: 2M or 1G (hugepages; 1 GiB pages are reserved at boot,
    /// `hugepagesz=1G hugepages=N`), or 4K behind an IOMMU (refused with --noiommu). Default:
    /// the controller's, 2M.
    #[arg(long, value_parser = parse_page_size, conflicts_with = "model")]
    pub page_size: Option<PageSize>,
    /// Put each queue pair's submission queue in the controller memory buffer (CMBSZ.SQS):
    /// the controller reads commands from its own memory. Needs a device with a CMB.
    #[arg(long, conflicts_with = "model")]
    pub cmb_sq: bool,
    /// Describe data with SGLs where the controller supports them (PRPs otherwise).
    #[arg(long)]
    pub sgl: bool,
    /// After the results, print the latency histogram of reads and of writes as SPDK perf's
    /// -LL does: ranges in microseconds with their I/O count, percent and cumulative percent
    /// (only ranges that hold I/Os). Each power of two of nanoseconds is cut into BUCKETS equal
    /// ranges (a power of two from 1 to 1024; SPDK's are 128) [default: 16, ranges at most
    /// 6.25% wide]. With --json: `latency_histogram`.
    #[arg(long, value_name = "BUCKETS", num_args = 0..=1, default_missing_value = "16",
          value_parser = parse_per_octave)]
    pub latency_histogram: Option<u32>,
    /// Queue depth 1 only: stamp every I/O (TSC; CLOCK_MONOTONIC where the TSC is not usable:
    /// the output says which) when it is submitted, after its doorbell write, at the start of the
    /// poll that finds its completion and in its completion callback, and print mean, p50 and
    /// p99 of each segment (submit to doorbell, doorbell to completion seen, completion seen to
    /// callback, callback to the next submit), which add up to one I/O's cycle. Costs a clock
    /// read per poll; without it the I/O loop takes no stamps. With --json: `latency_breakdown`.
    #[arg(long, conflicts_with = "verify")]
    pub breakdown: bool,
    /// How workers learn of completions: poll (spin on the completion queue), irq (sleep until
    /// the queue pair's MSI-X interrupt; one vector per queue pair), or hybrid (spin for
    /// --hybrid-spin-us after the last completion, then sleep). The process CPU time of the run
    /// is printed with the results.
    #[arg(long, value_name = "MODE", default_value = "poll", value_parser = CompletionMode::NAMES)]
    pub completion: String,
    /// How long hybrid mode spins before it sleeps, in microseconds (up to 20 times as long
    /// when a completion is late in a stream that came within the spin).
    #[arg(long, value_name = "US", default_value_t = 50)]
    pub hybrid_spin_us: u64,
    /// Reset every controller this often while the workers run (Controller::reset from
    /// another thread: CC.EN 1 -> 0 -> 1, admin queue and features again, every queue pair
    /// re-created in place). I/Os a reset interrupts are issued again, so --verify still holds.
    /// Prints each reset's time and the longest gap between completions.
    #[arg(long, value_name = "SECS", value_parser = parse_secs)]
    pub reset_every: Option<Duration>,
    /// Print the results as JSON (fio-like field names) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// The --completion mode.
fn completion_mode(a: &Args) -> anyhow::Result<CompletionMode> {
    Ok(CompletionMode::from_name(
        &a.completion,
        Duration::from_micros(a.hybrid_spin_us),
    )?)
}

fn parse_per_octave(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(n) if n.is_power_of_two() && n <= 1024 => Ok(n),
        _ => Err(format!(
            "{s:?} ranges per power of two: give a power of two from 1 to 1024 (16, 128 ...)"
        )),
    }
}

/// Which build this binary is (`cfg!(debug_assertions)`), where it runs from, and the warning
/// a debug build's figures carry.
fn build() -> (&'static str, String, Option<String>) {
    let exe = std::env::current_exe().map_or_else(|_| "vfpoll".into(), |p| p.display().to_string());
    if !cfg!(debug_assertions) {
        return ("release", exe, None);
    }
    let warning = format!(
        "{exe} is a debug build: its IOPS and latencies are not vfpoll's (a release build gives \
         about twice the IOPS); for figures run the release build: cargo build --release -p vfpoll, \
         then target/release/vfpoll perf ..."
    );
    ("debug", exe, Some(warning))
}

fn parse_workload(s: &str) -> Result<Workload, String> {
    s.parse().map_err(|e: vfpoll_engine::EngineError| e.to_string())
}

fn parse_secs(s: &str) -> Result<Duration, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(v > 0.0 && v < 1e9) {
        return Err(format!("the time must be above 0 seconds, not {s}"));
    }
    Ok(Duration::from_secs_f64(v))
}

fn parse_warmup(s: &str) -> Result<Duration, String> {
    match s.parse::<f64>() {
        Ok(0.0) => Ok(Duration::ZERO),
        _ => parse_secs(s),
    }
}

/// Which namespaces to drive on one controller.
fn namespaces_of(spec: &str, ctrl: &Controller, device: &str) -> anyhow::Result<Vec<u32>> {
    let active: Vec<u32> = ctrl.namespaces().iter().map(|n| n.nsid).collect();
    if spec == "all" {
        if active.is_empty() {
            bail!("{device} has no active namespace");
        }
        return Ok(active);
    }
    let mut out = Vec::new();
    for p in spec.split(',') {
        let n: u32 = p
            .trim()
            .parse()
            .ok()
            .filter(|&n| n != 0)
            .with_context(|| format!("--nsid {spec:?}: {p:?} is not a namespace ID (or `all`)"))?;
        if !active.contains(&n) {
            bail!("{device} has no active namespace {n}; its namespaces are {active:?}");
        }
        if !out.contains(&n) {
            out.push(n);
        }
    }
    Ok(out)
}

/// The controllers of a run and what keeps them alive. Field order is drop order: the
/// controllers shut down before the model thread stops.
struct Devices {
    ctrls: Vec<(Controller, String)>,
    _model: Option<crate::model::NvmeModel>,
    page: PageSize,
}

fn open_devices(a: &Args, worker_cores: &[usize]) -> anyhow::Result<Devices> {
    let opts = ControllerOptions {
        shadow_doorbells: !a.no_shadow_doorbell,
        ..Default::default()
    };
    if a.model {
        return open_model(a, worker_cores, opts);
    }
    let (container, _) = crate::iommu_backend::open(a.noiommu, a.iommu_backend, &a.devices)?;
    let mut ctrls: Vec<(Controller, String)> = Vec::new();
    let mut dma: Option<DmaContext> = None;
    for &bdf in &a.devices {
        if ctrls.iter().any(|(_, d)| *d == bdf.to_string()) {
            bail!("--device {bdf} is given twice");
        }
        let hint = || format!("opening NVMe controller {bdf} (bound to vfio-pci? `vfpoll bind {bdf}`)");
        let ctrl = match &dma {
            None => {
                let (c, d) = Controller::open_first(&container, bdf, opts.clone()).with_context(hint)?;
                dma = Some(d);
                c
            }
            Some(d) => Controller::open(&container, bdf, d.clone(), opts.clone()).with_context(hint)?,
        };
        ctrls.push((ctrl, bdf.to_string()));
    }
    let page = a.page_size.unwrap_or(opts.page_size);
    if page == PageSize::Base4K && dma.is_some_and(|d| d.kind() == vfpoll_dma::MapKind::NoIommu) {
        bail!(
            "--page-size 4K needs an IOMMU: without one the kernel may move 4 KiB pages while the device \
             writes them; use 2M or 1G"
        );
    }
    Ok(Devices {
        ctrls,
        _model: None,
        page,
    })
}

/// The in-process NVMe model and the driver's controller on it (`--model`).
#[cfg(feature = "model")]
fn open_model(a: &Args, worker_cores: &[usize], opts: ControllerOptions) -> anyhow::Result<Devices> {
    use crate::model::{ModelConfig, NamespaceConfig, NvmeModel};
    use vfpoll_dma::FakeMapper;
    use vfpoll_engine::affinity::pin_current;

    let mapper = Arc::new(FakeMapper::new());
    let cfg = ModelConfig {
        namespaces: vec![NamespaceConfig::new(1, 512, 64 << 11)],
        mdts: 7,
        max_queue_entries: 4096,
        // Poll without sleeping for as long as a run may pause between I/Os.
        idle_spin: Duration::from_secs(2),
        ..Default::default()
    };
    // The model's thread inherits this thread's affinity: pin it to its own core.
    let before = allowed_cores()?;
    let core = a
        .model_core
        .or_else(|| before.iter().copied().find(|c| !worker_cores.contains(c)));
    if let Some(c) = core {
        pin_current(c).with_context(|| format!("model core {c}"))?;
    }
    let model = NvmeModel::start(cfg, mapper.clone()).context("starting the NVMe model")?;
    set_current(&before)?;
    let opts = ControllerOptions {
        page_size: PageSize::Base4K,
        ..opts
    };
    let ctrl = Controller::new(model.bar0(), DmaContext::new(mapper), opts)
        .context("bringing up the model's controller")?;
    if completion_mode(a)?.interrupts() {
        // The model's MSI-X table: one vector per I/O queue pair and the admin queue's.
        let fds = model
            .msix(ctrl.io_queues_granted() + 1)
            .context("eventfds for the model's interrupts")?;
        ctrl.use_interrupts(fds)?;
    }
    Ok(Devices {
        ctrls: vec![(ctrl, "model".into())],
        _model: Some(model),
        page: PageSize::Base4K,
    })
}

#[cfg(not(feature = "model"))]
fn open_model(_: &Args, _: &[usize], _: ControllerOptions) -> anyhow::Result<Devices> {
    Err(crate::model::unavailable("--model"))
}

/// Runs `vfpoll perf`.
pub fn run(_ctx: &Ctx, a: Args) -> anyhow::Result<ExitCode> {
    if a.breakdown && a.queue_depth != 1 {
        bail!(
            "--breakdown needs --queue-depth 1, not {}: it times the stages of one I/O at a time, and with more in flight those of different I/Os overlap",
            a.queue_depth
        );
    }
    if let (_, _, Some(w)) = build() {
        eprintln!("vfpoll perf: warning: {w}");
    }
    let cores = match &a.cores {
        Some(s) => parse_cores(s)?,
        None => vec![*allowed_cores()?
            .first()
            .context("this process may run on no core")?],
    };
    let io_size = usize::try_from(a.io_size).context("--io-size is too large")?;
    let seed = a.seed.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let limit = match (a.time, a.ios) {
        (_, Some(0)) => bail!("--ios must be at least 1"),
        (_, Some(n)) => Limit::Ios(n),
        (Some(t), None) => Limit::Time(t),
        (None, None) => Limit::Time(Duration::from_secs(10)),
    };
    // An explicit warm-up before an --ios or --verify run is refused by Engine::start.
    let warmup = match a.warmup {
        Some(w) => w,
        None if a.verify || matches!(limit, Limit::Ios(_)) => Duration::ZERO,
        None => Duration::from_secs(1),
    };
    let devices = open_devices(&a, &cores)?;
    let mut spaces = Vec::new();
    for (ctrl, device) in &devices.ctrls {
        for nsid in namespaces_of(&a.nsid, ctrl, device)? {
            spaces.push(Namespace {
                ctrl: ctrl.clone(),
                device: device.clone(),
                nsid,
                size: a.size,
            });
        }
    }
    let workers = split_evenly(
        &cores.iter().map(|&c| Some(c)).collect::<Vec<_>>(),
        &spaces,
        io_size,
    )?;
    let job = JobSpec {
        workload: a.workload,
        rwmix_read: a.rwmix,
        io_size,
        queue_depth: a.queue_depth,
        limit,
        warmup,
        verify: a.verify,
        breakdown: a.breakdown,
        seed,
        qpair: QpairOptions {
            sgl: a.sgl,
            sq_in_cmb: a.cmb_sq,
            completion: completion_mode(&a)?,
            defer_cq_doorbell: !a.no_cq_defer,
            ..Default::default()
        },
        buffer_page: devices.page,
    };
    let header = describe(&a, &job, &cores, &spaces);
    // Keep this (control) thread off the workers' cores where there is room.
    let spare: Vec<usize> = allowed_cores()?
        .into_iter()
        .filter(|c| !cores.contains(c))
        .collect();
    if !spare.is_empty() {
        set_current(&spare)?;
    }
    let engine = Engine::start(job.clone(), workers)?;
    let live = !a.json && std::io::stdout().is_terminal();
    if !a.json {
        println!("{header}");
    }
    let mut out = std::io::stdout();
    let (cpu_before, wall) = (process_cpu()?, std::time::Instant::now());
    let removals = RemovalWatch::start(&devices.ctrls);
    let resetter = a
        .reset_every
        .map(|every| reset_every::ResetEvery::start(&devices.ctrls, every));
    let report = engine.run(Duration::from_secs(1), |p| {
        if live {
            let _ = write!(
                out,
                "\r[{:>4.0} s{}] {:>12} IOPS {:>10.1} MiB/s  ({} I/Os)\x1b[K",
                p.elapsed.as_secs_f64(),
                if p.warming_up { ", warm-up" } else { "" },
                thousands(p.iops),
                p.bw_bytes / (1 << 20) as f64,
                p.ios
            );
            let _ = out.flush();
        }
    })?;
    let cpu = Cpu {
        used: process_cpu()?.saturating_sub(cpu_before),
        wall: wall.elapsed(),
    };
    let removed = removals.stop();
    let resets = resetter.map(reset_every::ResetEvery::stop);
    let max_gap = report
        .workers
        .iter()
        .flat_map(|w| &w.queues)
        .map(|q| q.max_gap)
        .max()
        .unwrap_or_default();
    let reissued: u64 = report
        .workers
        .iter()
        .flat_map(|w| &w.queues)
        .map(|q| q.reissued)
        .sum();
    if live {
        print!("\r\x1b[K");
    }
    if a.json {
        let mut v = to_json(&a, &job, &cores, &devices, &report);
        v["completion"] = json!(a.completion);
        v["max_gap_ms"] = json!(max_gap.as_secs_f64() * 1e3);
        v["reissued"] = json!(reissued);
        if let Some(r) = &resets {
            v["resets"] = r.json();
        }
        v["cpu"] = json!({
            "process_s": cpu.used.as_secs_f64(),
            "wall_s": cpu.wall.as_secs_f64(),
            "percent_of_core": cpu.percent(),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_text(&job, &report);
        println!(
            "cpu: {:.3} s of process CPU in {:.2} s ({:.1}% of one core), completion {}",
            cpu.used.as_secs_f64(),
            cpu.wall.as_secs_f64(),
            cpu.percent(),
            a.completion
        );
        if let Some(per) = a.latency_histogram {
            for (name, op) in [("read", &report.read), ("write", &report.write)] {
                if op.ios != 0 {
                    print_histogram(name, &op.latency, per);
                }
            }
        }
        if let Some(b) = &report.breakdown {
            print_breakdown(b);
        }
        if let Some(r) = &resets {
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            match r.times() {
                Some((min, mean, max)) => println!(
                    "resets: {} ({} with a function reset), each took {:.2} / {:.2} / {:.2} ms (min / mean / max); longest gap between completions {:.2} ms; {reissued} I/Os issued again",
                    r.done.len(),
                    r.done.iter().filter(|d| d.2).count(),
                    ms(min),
                    ms(mean),
                    ms(max),
                    ms(max_gap)
                ),
                None => println!("resets: none done (the run ended first)"),
            }
        }
    }
    let reset_failed = resets.as_ref().is_some_and(|r| !r.failed.is_empty());
    if let Some(r) = &resets {
        for (dev, e) in &r.failed {
            eprintln!("vfpoll perf: FAILED: resetting {dev}: {e}");
        }
    }
    if !removed.is_empty() {
        eprintln!(
            "vfpoll perf: FAILED: {} removed during the run (its I/O failed; the other devices ran to the end)",
            removed.join(", ")
        );
    }
    Ok(if report.passed() && removed.is_empty() && !reset_failed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Reports a controller's removal (the kernel asked for the device back, see `vfpoll-nvme`'s
/// removal) on stderr as it happens, while the workers go on with the other controllers; a
/// thread that looks every 10 ms, so the engine's progress ticks stay as they are.
struct RemovalWatch {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Vec<String>>,
}

impl RemovalWatch {
    fn start(ctrls: &[(Controller, String)]) -> Self {
        let ctrls = ctrls.to_vec();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let t0 = std::time::Instant::now();
        let thread = std::thread::spawn(move || {
            let mut removed: Vec<String> = Vec::new();
            loop {
                let last = s.load(std::sync::atomic::Ordering::Acquire);
                for (c, dev) in &ctrls {
                    if removed.contains(dev) {
                        continue;
                    }
                    if let Some(r) = c.removed() {
                        eprintln!(
                            "vfpoll perf: {dev} was removed {:.2} s into the run (released {:.1} ms after the kernel's request); its I/O fails, the other devices go on",
                            r.requested.saturating_duration_since(t0).as_secs_f64(),
                            r.released_in.as_secs_f64() * 1e3
                        );
                        removed.push(dev.clone());
                    }
                }
                if last {
                    return removed;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        RemovalWatch { stop, thread }
    }

    /// The devices removed during the run.
    fn stop(self) -> Vec<String> {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        self.thread.join().unwrap_or_default()
    }
}

/// The process CPU time a run took.
struct Cpu {
    used: Duration,
    wall: Duration,
}

impl Cpu {
    fn percent(&self) -> f64 {
        100.0 * self.used.as_secs_f64() / self.wall.as_secs_f64().max(f64::MIN_POSITIVE)
    }
}

fn describe(a: &Args, job: &JobSpec, cores: &[usize], spaces: &[Namespace]) -> String {
    let zoned = spaces
        .iter()
        .any(|n| n.ctrl.namespace(n.nsid).is_ok_and(|ns| ns.zoned.is_some()));
    let what = if a.verify {
        format!(
            "verify ({} order{})",
            if job.workload.random() {
                "random"
            } else {
                "sequential"
            },
            if zoned && job.workload.random() {
                "; zoned namespaces written zone by zone, read at random"
            } else {
                ""
            }
        )
    } else if matches!(job.workload, Workload::RandRw | Workload::Rw) {
        format!("{} {}% reads", job.workload, job.rwmix_read)
    } else {
        job.workload.to_string()
    };
    let limit = match job.limit {
        _ if a.verify => "one pass".to_string(),
        Limit::Time(t) if job.warmup > Duration::ZERO => format!(
            "{} s after a {} s warm-up",
            t.as_secs_f64(),
            job.warmup.as_secs_f64()
        ),
        Limit::Time(t) => format!("{} s", t.as_secs_f64()),
        Limit::Ios(n) => format!("{n} I/Os"),
    };
    let targets: Vec<String> = spaces
        .iter()
        .map(|n| format!("{} ns {}", n.device, n.nsid))
        .collect();
    format!(
        "vfpoll perf: {what}, {} per I/O, queue depth {}, {} worker(s) on core(s) {:?}, {limit}, seed {}\n  {}",
        human_bytes(job.io_size as u64),
        job.queue_depth,
        cores.len(),
        cores,
        job.seed,
        targets.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_times_parse() {
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("128K"), Ok(128 << 10));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("512"), Ok(512));
        assert!(parse_size("4q").unwrap_err().contains("unknown size unit"));
        assert!(parse_size("k").is_err() && parse_size("0").is_err());
        assert_eq!(parse_secs("0.5"), Ok(Duration::from_millis(500)));
        assert!(parse_secs("-1").is_err() && parse_secs("x").is_err());
        assert_eq!(thousands(1234567.4), "1,234,567");
        assert_eq!(thousands(12.0), "12");
        assert_eq!(human_bytes(128 << 10), "128 KiB");
    }
}
