//! `cargo xtask bench`: vfpoll against the guest kernel's NVMe driver, on the same emulated
//! controller, in one boot of the test bed.
//!
//! The guest runs every measurement on NVMe A (0000:00:03.0), namespace 1, on CPU 1, for the
//! same time, queue depth and I/O size:
//! 1. the kernel's nvme driver (interrupts): fio with io_uring and with libaio;
//! 2. the kernel's nvme driver with a poll queue (`nvme.poll_queues`; the module is reloaded
//!    with `poll_queues=1` if it has none): fio with io_uring and `hipri` (polled completions);
//! 3. the device on vfio-pci (`vfpoll bind`): `vfpoll perf` (release build), with the driver's
//!    defaults (shadow doorbells on: QEMU offers Doorbell Buffer Config), then with
//!    `--no-shadow-doorbell` (every doorbell an MMIO write) and with `--cmb-sq` (submission
//!    queues in the controller memory buffer), which measures what those two options do;
//!    and fio with vfpoll's fio engine (`fio-engine/`, release build of `libvfpoll_fio.so`):
//!    engine `fio-vfpoll`, against `vfpoll perf` in the options table.
//!
//! fio runs with `clocksource=cpu` (the TSC, as vfpoll's own clock): the guest's clocksource is
//! the HPET, and fio's default `clock_gettime` would spend more time reading it than the kernel
//! spends on the I/O, which would make the kernel look slower than it is. Every run writes JSON
//! into the guest's `/out`; the host reads those files and prints one table.
//!
//! `cargo xtask bench --nvmf` runs another comparison in the same style: `vfpoll target` against
//! the kernel's NVMe/TCP target (module `nvmf`, `bench/nvmf.rs`).

use std::ffi::OsString;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::build;
use crate::json;
use crate::mode::Mode;
use crate::setup;
use crate::util::{err, run, Result};
use crate::vm::{self, Boot, DEFAULT_MODULES};
use crate::Workspace;

mod nvmf;
mod plot;
mod results;

use results::{control_line, table};

/// `cargo xtask bench --help`.
pub const HELP: &str = "\
Benchmark vfpoll against the guest kernel's NVMe driver (fio) on the test bed

Usage: cargo xtask bench [OPTIONS]

One boot of the QEMU guest (IOMMU mode). On NVMe A (0000:00:03.0, namespace 1), CPU 1, the same
time, queue depth and I/O size for everyone: fio with io_uring and libaio on the kernel's nvme
driver, fio with io_uring hipri on a poll queue (nvme reloaded with poll_queues=1 if needed),
then `vfpoll perf` with the device on vfio-pci: with its defaults (shadow doorbells on), with
--no-shadow-doorbell (engine vfpoll-mmio-db) and with --cmb-sq (engine vfpoll-cmb-sq), and fio
with vfpoll's engine (engine fio-vfpoll, target/release/libvfpoll_fio.so). Cases:
4 KiB random read at queue depth 1 and 32, 128 KiB sequential read at queue depth 32. Prints two
tables: vfpoll against the kernel (IOPS, median and range over the repetitions, p50 and p99
latency, medians, and the ratios vfpoll/kernel), and vfpoll's options against its defaults.
The guest's JSON files stay in target/testbed/run/bench-iommu/out.

With --nvmf: vfpoll target (release build, `--ns 0000:00:04.0/1`, on CPU 0) against the kernel's
NVMe/TCP target nvmet-tcp (configfs, exporting the same NVMe B namespace 1 on the kernel's nvme
driver), both on 127.0.0.1:4420 to the guest kernel's initiator, alternating per repetition;
fio io_uring direct on the fabric namespace on CPU 1: 4 KiB randread QD32 and QD1, 128 KiB read
QD32, 4 KiB randwrite QD32. The table shows IOPS, p99, busy cores and the target's CPU time per
I/O (method: xtask/src/bench/nvmf.rs), with the ratios vfpoll/kernel. Files in
target/testbed/run/bench-nvmf-iommu/out.

Options:
      --time <SECS>       Seconds per run, after the warm-up [default: 5]
      --warmup <SECS>     Seconds of I/O before each run's measured time, counted nowhere:
                          vfpoll perf --warmup, fio --ramp_time (not with --nvmf) [default: 1]
      --repeat <N>        Runs per engine and case, kernel and vfpoll in alternating order;
                          the table shows the median IOPS, p50 and p99 [default: 3]
      --engines <LIST>    Only these of vfpoll,vfpoll-mmio-db,vfpoll-cmb-sq,fio-vfpoll,io_uring,
                          libaio,io_uring-hipri [default: all]
      --cases <LIST>      Only these of 4k-randread-qd1,4k-randread-qd32,128k-read-qd32
                          (the default) and 4k-randread-qd4,4k-randread-qd8,4k-randread-qd16
                          (more queue depths for --plot's IOPS curve)
      --plot              Then draw latency-qd1.svg (4 KiB randread QD1: latency by percentile
                          per engine, from the run with the median IOPS) and iops-qd.svg (4 KiB
                          randread IOPS against queue depth) into
                          target/testbed/run/bench-iommu/plots (plotters, SVG)
      --plot-only         Only draw the figures of --plot from the last run's JSON files (no
                          boot); give the same --engines, --cases and --repeat as that run
      --nvmf              NVMe/TCP: vfpoll target against nvmet-tcp (see above; --time 3 and up)
      --no-build          Do not build vfpoll (release) first
      --vfpoll <PATH>     Run this vfpoll binary instead of target/release/vfpoll (implies
                          --no-build; e.g. a release build of a clean checkout)
      --target-args <ARGS>
                          More options for vfpoll target with --nvmf, e.g. --target-args='--spin-us 0'
  -v, --verbose           Show the guest init's lines and kernel warnings
  -h, --help              Print this help";

/// Options of `cargo xtask bench`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchArgs {
    /// Seconds per run.
    pub time: u32,
    /// Seconds of uncounted I/O before each run (`vfpoll perf --warmup`, fio `--ramp_time`).
    pub warmup: u32,
    /// Runs per engine and case; the table shows medians.
    pub repeat: u32,
    /// Which engines run.
    pub engines: Vec<Engine>,
    /// Which cases run (ids of [`CASES`]; empty: all).
    pub cases: Vec<String>,
    /// Skip the release build.
    pub no_build: bool,
    /// Show init lines and kernel warnings.
    pub verbose: bool,
    /// Run the NVMe/TCP target comparison instead (`bench/nvmf.rs`).
    pub nvmf: bool,
    /// The vfpoll binary; `None`: `target/release/vfpoll`, built first unless `no_build`.
    pub vfpoll: Option<std::path::PathBuf>,
    /// More arguments for `vfpoll target` (`--nvmf`), split at spaces.
    pub target_args: Vec<String>,
    /// Draw the figures (`bench/plot.rs`): after the run, or instead of it.
    pub plot: Plot,
}

/// `--plot` and `--plot-only`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plot {
    /// No figures.
    No,
    /// Run, then draw.
    After,
    /// Draw from the last run's files; no boot.
    Only,
}

/// Who does the I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// `vfpoll perf`.
    Vfpoll,
    /// `vfpoll perf --no-shadow-doorbell`.
    VfpollMmioDb,
    /// `vfpoll perf --cmb-sq`.
    VfpollCmbSq,
    /// fio, io_uring, interrupts.
    IoUring,
    /// fio, libaio.
    Libaio,
    /// fio, io_uring with `hipri` on a poll queue.
    IoUringHipri,
    /// fio with vfpoll's fio engine (`libvfpoll_fio.so`).
    FioVfpoll,
}

impl Engine {
    const ALL: [Engine; 7] = [
        Engine::Vfpoll,
        Engine::VfpollMmioDb,
        Engine::VfpollCmbSq,
        Engine::FioVfpoll,
        Engine::IoUring,
        Engine::IoUringHipri,
        Engine::Libaio,
    ];

    /// `vfpoll perf`'s extra options for a vfpoll engine; `None` for a kernel engine.
    fn vfpoll_flags(self) -> Option<&'static str> {
        match self {
            Engine::Vfpoll => Some(""),
            Engine::VfpollMmioDb => Some(" --no-shadow-doorbell"),
            Engine::VfpollCmbSq => Some(" --cmb-sq"),
            _ => None,
        }
    }

    /// Whether it runs on the kernel's nvme driver.
    fn is_kernel(self) -> bool {
        matches!(self, Engine::IoUring | Engine::Libaio | Engine::IoUringHipri)
    }

    fn name(self) -> &'static str {
        match self {
            Engine::Vfpoll => "vfpoll",
            Engine::VfpollMmioDb => "vfpoll-mmio-db",
            Engine::VfpollCmbSq => "vfpoll-cmb-sq",
            Engine::IoUring => "io_uring",
            Engine::Libaio => "libaio",
            Engine::IoUringHipri => "io_uring-hipri",
            Engine::FioVfpoll => "fio-vfpoll",
        }
    }
}

/// One workload, run by every engine.
struct Case {
    /// File-name stem.
    id: &'static str,
    /// In the table.
    label: &'static str,
    /// fio's `rw` and vfpoll's `--workload`.
    rw: &'static str,
    /// Bytes per I/O (fio's `bs`, vfpoll's `--io-size`).
    bs: &'static str,
    qd: u32,
    /// Run when `--cases` is not given.
    default: bool,
}

const CASES: &[Case] = &[
    Case {
        id: "4k-randread-qd1",
        label: "4 KiB randread QD1",
        rw: "randread",
        bs: "4k",
        qd: 1,
        default: true,
    },
    Case {
        id: "4k-randread-qd4",
        label: "4 KiB randread QD4",
        rw: "randread",
        bs: "4k",
        qd: 4,
        default: false,
    },
    Case {
        id: "4k-randread-qd8",
        label: "4 KiB randread QD8",
        rw: "randread",
        bs: "4k",
        qd: 8,
        default: false,
    },
    Case {
        id: "4k-randread-qd16",
        label: "4 KiB randread QD16",
        rw: "randread",
        bs: "4k",
        qd: 16,
        default: false,
    },
    Case {
        id: "4k-randread-qd32",
        label: "4 KiB randread QD32",
        rw: "randread",
        bs: "4k",
        qd: 32,
        default: true,
    },
    Case {
        id: "128k-read-qd32",
        label: "128 KiB read QD32",
        rw: "read",
        bs: "128k",
        qd: 32,
        default: true,
    },
];

impl BenchArgs {
    /// The cases to run: `--cases` (in the order of [`CASES`]), or the default ones.
    fn cases(&self) -> Vec<&'static Case> {
        CASES
            .iter()
            .filter(|c| {
                if self.cases.is_empty() {
                    c.default
                } else {
                    self.cases.iter().any(|x| x == c.id)
                }
            })
            .collect()
    }
}

/// The controller and the CPU everything runs on.
const BDF: &str = "0000:00:03.0";
const CPU: u32 = 1;

/// Parses the options after `cargo xtask bench`; `None`: `--help` asked for [`HELP`].
pub fn parse(args: &[String]) -> Result<Option<BenchArgs>> {
    let mut a = BenchArgs {
        time: 5,
        warmup: 1,
        repeat: 3,
        engines: Engine::ALL.to_vec(),
        cases: Vec::new(),
        no_build: false,
        verbose: false,
        nvmf: false,
        vfpoll: None,
        target_args: Vec::new(),
        plot: Plot::No,
    };
    let mut it = args.iter();
    while let Some(s) = it.next() {
        let (name, inline) = match s.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
            _ => (s.as_str(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .ok_or_else(|| err!("bench: {name} needs a value"))
        };
        match name {
            "-h" | "--help" => return Ok(None),
            "--no-build" => a.no_build = true,
            "--nvmf" => a.nvmf = true,
            "--plot" => a.plot = Plot::After,
            "--plot-only" => a.plot = Plot::Only,
            "--target-args" => {
                let v = value()?;
                if v.contains(|c: char| !(c.is_ascii_alphanumeric() || " -_.=,:/".contains(c))) {
                    return Err(err!("bench: --target-args {v:?}: only options of vfpoll target (letters, digits, - _ . = , : / and spaces)"));
                }
                a.target_args = v.split_whitespace().map(String::from).collect();
            }
            "--vfpoll" => {
                a.vfpoll = Some(value()?.into());
                a.no_build = true;
            }
            "-v" | "--verbose" => a.verbose = true,
            "--time" => {
                let v = value()?;
                a.time = v
                    .parse()
                    .ok()
                    .filter(|&t| t > 0)
                    .ok_or_else(|| err!("bench: --time takes whole seconds above 0, not {v:?}"))?;
            }
            "--warmup" => {
                let v = value()?;
                a.warmup = v
                    .parse()
                    .map_err(|_| err!("bench: --warmup takes whole seconds, not {v:?}"))?;
            }
            "--repeat" => {
                let v = value()?;
                a.repeat = v
                    .parse()
                    .ok()
                    .filter(|&t| t > 0)
                    .ok_or_else(|| err!("bench: --repeat takes a count above 0, not {v:?}"))?;
            }
            "--engines" => {
                let v = value()?;
                a.engines = v
                    .split(',')
                    .map(|e| {
                        Engine::ALL.into_iter().find(|x| x.name() == e).ok_or_else(|| {
                            err!("bench: unknown engine {e:?}; one of vfpoll, vfpoll-mmio-db, vfpoll-cmb-sq, fio-vfpoll, io_uring, io_uring-hipri, libaio")
                        })
                    })
                    .collect::<Result<_>>()?;
            }
            "--cases" => {
                let v = value()?;
                a.cases = v
                    .split(',')
                    .map(|c| {
                        CASES
                            .iter()
                            .find(|x| x.id == c)
                            .map(|x| x.id.to_string())
                            .ok_or_else(|| {
                                let all: Vec<&str> = CASES.iter().map(|c| c.id).collect();
                                err!("bench: unknown case {c:?}; one of {}", all.join(", "))
                            })
                    })
                    .collect::<Result<_>>()?;
            }
            _ => return Err(err!("bench: unexpected argument {s:?}")),
        }
    }
    if a.nvmf && a.plot != Plot::No {
        return Err(err!(
            "bench: --plot draws the NVMe comparison's figures; it does not go with --nvmf"
        ));
    }
    if a.nvmf && a.time < nvmf::MIN_TIME {
        return Err(err!(
            "bench: --nvmf samples CPU time from 1 s after fio's start to 1 s before its end: give --time {} or more",
            nvmf::MIN_TIME
        ));
    }
    Ok(Some(a))
}

/// The guest's job: every run of every engine, results as JSON in `/out`
/// (`<engine>-<case>-r<rep>.json`).
///
/// The nvme module is reloaded with a poll queue first (when hipri runs and it has none);
/// interrupt-driven io_uring and libaio use its default queues as before. Each repetition runs
/// the kernel engines and vfpoll (binding the device to vfio-pci and back), in alternating
/// order, so that a drift of the host's load does not favour one side.
fn job_script(a: &BenchArgs, vfpoll: &Path, engine_so: &Path) -> String {
    let t = a.time;
    let ramp = if a.warmup > 0 {
        format!(" --ramp_time={}", a.warmup)
    } else {
        String::new()
    };
    let has = |e| a.engines.contains(&e);
    let mut s = format!(
        r#"set -u
BDF={BDF}
V={vfpoll}
uname -r > /out/kernel.txt
ns1() {{ ls /sys/bus/pci/devices/$BDF/nvme/*/ 2>/dev/null | grep -m1 '^nvme[0-9]*n1$'; }}
wait_ns1() {{
  for _ in $(seq 100); do d=$(ns1); [ -n "$d" ] && [ -b /dev/$d ] && return 0; sleep 0.2; done
  echo "bench: no namespace 1 block device for $BDF"; return 1
}}
fio_run() {{ # NAME FIO-OPTIONS...
  name=$1; shift
  echo "bench: fio $name"
  fio --name="$name" --filename=/dev/$(ns1) --direct=1 --size=64M --time_based --runtime={t}{ramp} \
      --cpus_allowed={CPU} --numjobs=1 --lat_percentiles=1 --clocksource=cpu \
      --output-format=json --eta=never --output=/out/$name.json "$@" || echo "bench: fio $name failed"
}}
# The test bed's own noise: one fixed single-thread computation on the benchmark CPU.
control() {{ # LABEL
  taskset -c {CPU} python3 -c 'import hashlib, time
b = bytes(32 << 20); t = time.perf_counter()
for _ in range(3): hashlib.sha256(b).digest()
print(time.perf_counter() - t)' > /out/control-$1.txt 2>/dev/null
}}
wait_ns1 || exit 1
"#,
        vfpoll = vfpoll.display(),
        ramp = ramp,
    );
    if has(Engine::IoUringHipri) {
        s.push_str(
            r#"if [ "$(cat /sys/module/nvme/parameters/poll_queues)" = 0 ]; then
  echo "bench: nvme has no poll queues: reloading it with poll_queues=1"
  busybox modprobe -r nvme && busybox modprobe nvme poll_queues=1 && wait_ns1 || exit 1
fi
"#,
        );
    }
    s.push_str("cat /sys/module/nvme/parameters/poll_queues > /out/poll_queues.txt\n");
    let mut kernel = "kernel() { # REP\n  control k-r$1\n  wait_ns1 || exit 1\n".to_string();
    for c in a.cases() {
        let fio = format!("--rw={} --bs={} --iodepth={}", c.rw, c.bs, c.qd);
        for e in [Engine::IoUring, Engine::Libaio, Engine::IoUringHipri] {
            if has(e) {
                let (name, engine) = match e {
                    Engine::IoUringHipri => ("io_uring-hipri", "io_uring --hipri"),
                    _ => (e.name(), e.name()),
                };
                let _ = writeln!(kernel, "  fio_run {name}-{}-r$1 --ioengine={engine} {fio}", c.id);
            }
        }
    }
    kernel.push_str("}\n");
    let mut ours = "vfpoll() { # REP\n  control v-r$1\n  $V bind $BDF >/dev/null || exit 1\n".to_string();
    for c in a.cases() {
        for e in Engine::ALL.into_iter().filter(|&e| has(e)) {
            let Some(flags) = e.vfpoll_flags() else { continue };
            let _ = writeln!(
                ours,
                "  echo \"bench: {name} {id}-r$1\"; $V perf --device $BDF --nsid 1 --cores {CPU} --time {t} \
                 --warmup {w} --workload {} --io-size {} --queue-depth {}{flags} --json > /out/{name}-{id}-r$1.json \
                 || echo 'bench: {name} failed'",
                c.rw,
                c.bs,
                c.qd,
                name = e.name(),
                id = c.id,
                w = a.warmup,
            );
        }
        if has(Engine::FioVfpoll) {
            // fio's options as fio_run's, the device named as the engine takes it.
            let _ = writeln!(
                ours,
                "  echo \"bench: fio-vfpoll {id}-r$1\"; fio --name=fio-vfpoll-{id}-r$1 --thread \
                 --ioengine=external:{so} --filename={dev}/1 --size=64M --time_based --runtime={t}{ramp} \
                 --cpus_allowed={CPU} --numjobs=1 --lat_percentiles=1 --clocksource=cpu \
                 --output-format=json --eta=never --output=/out/fio-vfpoll-{id}-r$1.json \
                 --rw={} --bs={} --iodepth={} || echo 'bench: fio-vfpoll failed'",
                c.rw,
                c.bs,
                c.qd,
                id = c.id,
                so = engine_so.display(),
                dev = BDF.replace(':', "."),
            );
        }
    }
    ours.push_str("  $V reset $BDF >/dev/null\n}\n");
    s.push_str(&kernel);
    s.push_str(&ours);
    let kernel_on = a.engines.iter().any(|e| e.is_kernel());
    let vfpoll_on = a.engines.iter().any(|e| !e.is_kernel());
    let _ = writeln!(s, "for rep in $(seq {}); do", a.repeat);
    let (k, v) = (
        if kernel_on { "kernel $rep" } else { ":" },
        if vfpoll_on { "vfpoll $rep" } else { ":" },
    );
    let _ = writeln!(
        s,
        "  if [ $((rep % 2)) = 1 ]; then {k}; {v}; else {v}; {k}; fi\ndone"
    );
    s
}

/// `cargo xtask bench`.
pub fn main(ws: &Workspace, a: &BenchArgs) -> Result<u8> {
    if a.nvmf {
        return nvmf::main(ws, a);
    }
    let run_dir = vm::default_run_dir(ws, "bench-iommu");
    if a.plot == Plot::Only {
        let kernel = fs::read_to_string(run_dir.join("out/kernel.txt")).unwrap_or_default();
        let title = format!(
            "QEMU TCG test bed (emulated CPU: compare engines, not devices), kernel {}, median of {}, \
             redrawn from the last run",
            kernel.trim(),
            a.repeat
        );
        draw_plots(&run_dir, a, &title)?;
        return Ok(0);
    }
    let vfpoll = vfpoll_binary(ws, a)?;
    if a.engines.iter().any(|e| e.vfpoll_flags().is_some()) && !vfpoll.exists() {
        return Err(err!(
            "{} is missing: build it (cargo build --release -p vfpoll)",
            vfpoll.display()
        ));
    }
    let engine_so = ws.target.join("release/libvfpoll_fio.so");
    if a.engines.contains(&Engine::FioVfpoll) {
        if !a.no_build {
            crate::build::fio_engine(ws, "release")?;
        } else if !engine_so.exists() {
            return Err(err!(
                "{} is missing: drop --no-build (or leave fio-vfpoll out of --engines)",
                engine_so.display()
            ));
        }
    }
    let runs = a.cases().len() as u64 * a.engines.len() as u64 * a.repeat as u64;
    let timeout = Duration::from_secs(300 + runs * (a.time as u64 + a.warmup as u64 + 30));
    let script = job_script(a, &vfpoll, &engine_so);
    let g = GuestRun::boot(ws, &run_dir, timeout, a.verbose, &script)?;
    let (load_before, load_after) = (&g.load.0, &g.load.1);
    let dir = run_dir.join("out");
    let read = |f: &str| g.read(f);
    println!(
        "\ncargo xtask bench: NVMe A {BDF} ns 1 (QEMU 7.2 nvme, 64 MiB, 512 B blocks) in the TCG guest \
         (kernel {}, 2 vCPUs, IOMMU), CPU {CPU}, {} s per run after {} s of warm-up, median of {}; \
         nvme poll_queues={}",
        read("kernel.txt"),
        a.time,
        a.warmup,
        a.repeat,
        read("poll_queues.txt"),
    );
    println!(
        "host: {}, {} CPUs; load average (1 min) {load_before} before, {load_after} after",
        cpu_model(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!("vfpoll: {}\n", describe_binary(&vfpoll));
    print!("{}", table(&dir, &a.cases(), &a.engines, a.repeat));
    println!("{}", control_line(&dir, a.repeat));
    if a.plot == Plot::After {
        let title = format!(
            "QEMU TCG test bed (emulated CPU: compare engines, not devices), kernel {}, {} s per run, \
             median of {}, {}",
            read("kernel.txt"),
            a.time,
            a.repeat,
            std::process::Command::new("date")
                .args(["-u", "+%F"])
                .output()
                .ok()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
                .unwrap_or_default()
        );
        draw_plots(&run_dir, a, &title)?;
    }
    Ok(g.exit_code())
}

/// What one bench boot left: the guest job's outcome, where its files are, and the host's
/// load average (1 min) before and after it.
struct GuestRun {
    out: vm::Outcome,
    run_dir: PathBuf,
    load: (String, String),
}

impl GuestRun {
    /// Boots the bench guest (IOMMU mode, 2 vCPUs, 2 GiB, 64 hugepages) in `run_dir` with
    /// `bash -c script` as its job, for at most `timeout`. A job that fails is told on stderr
    /// (the table shows what finished).
    fn boot(
        ws: &Workspace,
        run_dir: &Path,
        timeout: Duration,
        verbose: bool,
        script: &str,
    ) -> Result<GuestRun> {
        let assets = setup::ensure(ws)?;
        let boot = Boot {
            mode: Mode::Iommu,
            timeout,
            mem: "2G".into(),
            smp: 2,
            modules: DEFAULT_MODULES.iter().map(|m| m.to_string()).collect(),
            hugepages: 64,
            run_dir: run_dir.to_path_buf(),
            keep_run_dir: false,
            verbose,
            cwd: ws.root.clone(),
            env: Vec::new(),
            command: ["bash", "-c", script].iter().map(OsString::from).collect(),
            hotplug: false,
            machine: vm::Machine::default(),
        };
        let load_before = loadavg();
        let lock = vm::lock_run_dir(run_dir)?;
        let out = vm::run_boot(ws, &assets, &boot, &lock)?;
        let load_after = loadavg();
        if out.code != 0 {
            eprintln!(
                "bench: the guest job exited with {}; the table shows what finished",
                out.code
            );
        }
        Ok(GuestRun {
            out,
            run_dir: run_dir.to_path_buf(),
            load: (load_before, load_after),
        })
    }

    /// The guest job's file `/out/<name>`, trimmed (empty if it wrote none).
    fn read(&self, name: &str) -> String {
        fs::read_to_string(self.run_dir.join("out").join(name))
            .unwrap_or_default()
            .trim()
            .to_string()
    }

    /// The command's exit code: the job's, or [`vm::EXIT_IOMMU_FAULT`] for a job that passed
    /// while QEMU's vIOMMU refused a device DMA (figures from a run whose device reached
    /// unmapped memory are not to be trusted; stderr says so).
    fn exit_code(&self) -> u8 {
        if self.out.iommu_faults.is_empty() {
            return self.out.code;
        }
        let file = self.run_dir.join(vm::IOMMU_FAULTS_FILE);
        eprintln!(
            "bench: error: {}",
            vm::fault_report(&self.out.iommu_faults, &file)
        );
        if self.out.code == 0 {
            vm::EXIT_IOMMU_FAULT
        } else {
            self.out.code
        }
    }
}

/// Draws `--plot`'s figures from `run_dir/out` into `run_dir/plots` and names them.
fn draw_plots(run_dir: &Path, a: &BenchArgs, title: &str) -> Result<()> {
    let out = run_dir.join("plots");
    let files = plot::draw(
        &run_dir.join("out"),
        &a.cases(),
        &a.engines,
        a.repeat,
        &out,
        title,
    )?;
    if files.is_empty() {
        return Err(err!(
            "bench --plot: no results to draw in {} (a 4 KiB randread QD1 case, or two 4 KiB randread queue depths)",
            run_dir.join("out").display()
        ));
    }
    for f in files {
        println!("plot: {}", f.display());
    }
    Ok(())
}

/// The vfpoll binary the guest runs: `--vfpoll PATH` (absolute: the guest's `/` is the host's),
/// or `target/release/vfpoll`, built first unless `--no-build`.
fn vfpoll_binary(ws: &Workspace, a: &BenchArgs) -> Result<std::path::PathBuf> {
    if let Some(p) = &a.vfpoll {
        let p = fs::canonicalize(p).map_err(|e| {
            err!(
                "bench: --vfpoll {}: {e}: give the path of a vfpoll binary",
                p.display()
            )
        })?;
        return Ok(p);
    }
    if !a.no_build {
        run(build::cargo(ws).args(["build", "--release", "-p", "vfpoll"]))?;
    }
    Ok(ws.target.join("release/vfpoll"))
}

/// `PATH (release build)`, or a plain warning when `vfpoll` is a debug build (whose figures
/// are about half a release build's), from what the binary says of itself: the `build` of
/// `vfpoll perf --model --ios 1 --json`, run on the host (the guest runs the same file).
pub(crate) fn describe_binary(vfpoll: &Path) -> String {
    let out = std::process::Command::new(vfpoll)
        .args(["perf", "--model", "--ios", "1", "--json"])
        .stderr(std::process::Stdio::null())
        .output();
    let profile = out.ok().and_then(|o| {
        let v = json::parse(String::from_utf8_lossy(&o.stdout).trim()).ok()?;
        v.get("build")?.get("profile")?.as_str().map(str::to_string)
    });
    build_note(vfpoll, profile.as_deref())
}

fn build_note(vfpoll: &Path, profile: Option<&str>) -> String {
    let p = vfpoll.display();
    match profile {
        Some("release") => format!("{p} (release build)"),
        Some("debug") => format!(
            "{p} is a DEBUG build: its figures are not vfpoll's (a release build gives about twice \
             the IOPS); drop --vfpoll to run target/release/vfpoll"
        ),
        _ => format!("{p} (build not known: it does not report one in `vfpoll perf --json`)"),
    }
}

fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(String::from))
        .unwrap_or_else(|| "?".into())
}

fn cpu_model() -> String {
    fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

#[cfg(test)]
mod tests;
