//! `cargo xtask bench --nvmf`: `vfpoll target` against the Linux kernel's NVMe/TCP target
//! (`nvmet-tcp`), both serving NVMe B (0000:00:04.0) namespace 1 to the guest kernel's NVMe/TCP
//! initiator over loopback, in one boot of the test bed.
//!
//! Each repetition runs both targets, in alternating order (kernel first in odd repetitions,
//! vfpoll first in even ones), so that a drift of the host's load favours neither:
//! - kernel: B on the kernel's nvme driver; nvmet exports its block device through configfs
//!   (`device_path`, direct bios), port 127.0.0.1:4420;
//! - vfpoll: B on vfio-pci (`vfpoll bind`), `vfpoll target --ns B/1` (release build) pinned to
//!   CPU 0 with `taskset`; after it, `vfpoll reset` gives B back to the kernel's nvme driver.
//!
//! The initiator (`nvme connect`, default queues) is the same for both, and fio (io_uring,
//! direct, `clocksource=cpu`) runs on the fabric namespace pinned to CPU 1.
//!
//! CPU time: around the middle of each fio run (from 1 s after its start to 1 s before its end,
//! so that fio's start and exit are not counted) the guest samples `/proc/uptime`, the `cpu` line
//! of `/proc/stat` (busy = user + nice + system + irq + softirq + steal, both vCPUs) and, for
//! vfpoll, `/proc/<pid>/stat` utime + stime of the target process (all its threads). fio's own
//! CPU time comes from its JSON (`usr_cpu` + `sys_cpu`, percent of its runtime). The target's
//! cores are then:
//! - vfpoll: the target process's CPU time over the window. Its workers poll without blocking
//!   and sleep (epoll on their sockets and their queue pairs' interrupt eventfds) only after
//!   `--spin-us` without work, so under load this is close to one core whatever the IOPS, and
//!   "I/Os per target core-second" is its IOPS over that.
//! - kernel: nvmet-tcp does its work in kworkers (`nvmet_tcp_wq`, queued on the CPU that received
//!   the data, `sk_incoming_cpu`, which cannot be pinned) and in softirq context, shared with the
//!   initiator's `nvme_tcp_wq` kworkers, so no thread's time is the target's alone. The table
//!   takes the guest's busy time minus fio's own: an upper bound on the kernel target's cost,
//!   which also holds the initiator's work outside fio's context (its kworkers and softirqs).

use std::fmt::Write as _;
use std::fs;
use std::path::Path;
use std::time::Duration;

use super::results::{load_json, median, num};
use super::{cpu_model, describe_binary, vfpoll_binary, BenchArgs, GuestRun};
use crate::json::Value;
use crate::util::{err, Result};
use crate::vm;
use crate::Workspace;

/// The backing controller, served by both targets.
const BDF: &str = "0000:00:04.0";
/// The target's CPU (vfpoll target is pinned to it) and the initiator's fio CPU.
const TARGET_CPU: u32 = 0;
const FIO_CPU: u32 = 1;

/// One workload, run through both targets.
struct Case {
    /// File-name stem.
    id: &'static str,
    /// In the table.
    label: &'static str,
    /// fio's `rw`.
    rw: &'static str,
    /// fio's `bs`.
    bs: &'static str,
    qd: u32,
}

const CASES: &[Case] = &[
    Case {
        id: "4k-randread-qd32",
        label: "4 KiB randread QD32",
        rw: "randread",
        bs: "4k",
        qd: 32,
    },
    Case {
        id: "4k-randread-qd1",
        label: "4 KiB randread QD1",
        rw: "randread",
        bs: "4k",
        qd: 1,
    },
    Case {
        id: "128k-read-qd32",
        label: "128 KiB read QD32",
        rw: "read",
        bs: "128k",
        qd: 32,
    },
    Case {
        id: "4k-randwrite-qd32",
        label: "4 KiB randwrite QD32",
        rw: "randwrite",
        bs: "4k",
        qd: 32,
    },
];

/// The two targets, by file-name stem and table name.
const KERNEL: (&str, &str) = ("kernel", "nvmet-tcp");
const VFPOLL: (&str, &str) = ("vfpoll", "vfpoll target");

/// Shortest `--time` that leaves a CPU-sampling window (1 s after the start, 1 s before the end).
pub const MIN_TIME: u32 = 3;

/// The guest's job: per repetition both targets, each case once per target; fio's JSON in
/// `/out/<target>-<case>-r<rep>.json`, the CPU samples in `.cpu` beside it (two lines,
/// `uptime utime stime <cpu fields of /proc/stat>`, before and after).
fn job_script(a: &BenchArgs, vfpoll: &Path) -> String {
    let t = a.time;
    let mut s = format!(
        r#"set -u
B={BDF}
V={vfpoll}
K=/sys/kernel/config/nvmet
KNQN=nqn.2026-11.io.vfpoll:bench-kernel
VNQN=nqn.2026-11.io.vfpoll:bench-vfpoll
HOST="--hostnqn nqn.2014-08.org.nvmexpress:uuid:5f1c1a52-7a8e-4c8b-9d0e-76667061726b --hostid 5f1c1a52-7a8e-4c8b-9d0e-76667061726b"
TPID=
uname -r > /out/kernel.txt
getconf CLK_TCK > /out/clk_tck.txt
for m in crc32c_generic configfs nvmet nvmet-tcp nvme-tcp; do
  [ -d /sys/module/$(echo $m | tr - _) ] || busybox modprobe $m || {{ echo "bench: modprobe $m failed"; exit 1; }}
done
busybox ip link set lo up
grep -q ' /sys/kernel/config configfs' /proc/mounts || busybox mount -t configfs configfs /sys/kernel/config
ns1() {{ ls /sys/bus/pci/devices/$B/nvme/*/ 2>/dev/null | grep -m1 '^nvme[0-9]*n1$'; }}
wait_ns1() {{
  for _ in $(seq 100); do d=$(ns1); [ -n "$d" ] && [ -b /dev/$d ] && return 0; sleep 0.2; done
  echo "bench: no namespace 1 block device for $B"; return 1
}}
fabric_dev() {{ # NQN: the block device of namespace 1 of its TCP controller
  for c in /sys/class/nvme/nvme*; do
    [ "$(cat $c/transport 2>/dev/null)" = tcp ] && [ "$(cat $c/subsysnqn 2>/dev/null)" = "$1" ] || continue
    ls $c | grep -m1 -E '^nvme[0-9]+(c[0-9]+)?n1$' | sed -E 's/c[0-9]+n/n/'
    return
  done
}}
connect() {{ # NQN
  nvme connect -t tcp -a 127.0.0.1 -s 4420 -n $1 $HOST >/dev/null || {{ echo "bench: nvme connect $1 failed"; return 1; }}
  for _ in $(seq 100); do DEV=$(fabric_dev $1); [ -n "$DEV" ] && [ -b /dev/$DEV ] && return 0; sleep 0.2; done
  echo "bench: no fabric namespace for $1"; return 1
}}
snap() {{
  p="0 0"; [ -n "$TPID" ] && p=$(cut -d' ' -f14,15 /proc/$TPID/stat)
  echo "$(cut -d' ' -f1 /proc/uptime) $p $(head -1 /proc/stat | cut -c5-)"
}}
fio_run() {{ # NAME FIO-OPTIONS...
  name=$1; shift
  echo "bench: fio $name on /dev/$DEV"
  fio --name="$name" --filename=/dev/$DEV --ioengine=io_uring --direct=1 --size=64M --time_based \
      --runtime={t} --cpus_allowed={FIO_CPU} --numjobs=1 --lat_percentiles=1 --clocksource=cpu \
      --output-format=json --eta=never --output=/out/$name.json "$@" &
  f=$!
  sleep 1; snap > /out/$name.cpu; sleep {mid}; snap >> /out/$name.cpu
  wait $f || echo "bench: fio $name failed"
}}
cases() {{ # TARGET REP
"#,
        vfpoll = vfpoll.display(),
        mid = t - 2,
    );
    for c in CASES {
        let _ = writeln!(
            s,
            "  fio_run $1-{}-r$2 --rw={} --bs={} --iodepth={}",
            c.id, c.rw, c.bs, c.qd
        );
    }
    let _ = write!(
        s,
        r#"}}
kernel() {{ # REP
  wait_ns1 || exit 1
  S=$K/subsystems/$KNQN; P=$K/ports/1
  mkdir $S && echo 1 > $S/attr_allow_any_host && mkdir $S/namespaces/1 &&
  echo /dev/$(ns1) > $S/namespaces/1/device_path && echo 1 > $S/namespaces/1/enable &&
  mkdir $P && echo tcp > $P/addr_trtype && echo ipv4 > $P/addr_adrfam &&
  echo 127.0.0.1 > $P/addr_traddr && echo 4420 > $P/addr_trsvcid &&
  ln -s $S $P/subsystems/$KNQN || {{ echo "bench: nvmet configfs setup failed"; dmesg | tail -5; exit 1; }}
  connect $KNQN && cases kernel $1
  nvme disconnect -n $KNQN >/dev/null
  rm $P/subsystems/$KNQN; rmdir $P; echo 0 > $S/namespaces/1/enable; rmdir $S/namespaces/1 $S
}}
vfpoll() {{ # REP
  $V bind $B >/dev/null || exit 1
  taskset -c {TARGET_CPU} $V target --ns $B/1 --listen 127.0.0.1:4420 --nqn $VNQN {targs} > /out/target-r$1.log 2>&1 &
  TPID=$!
  for _ in $(seq 300); do grep -q '^vfpoll target:' /out/target-r$1.log && break; sleep 0.2; done
  if grep -q '^vfpoll target:' /out/target-r$1.log; then
    connect $VNQN && cases vfpoll $1
    nvme disconnect -n $VNQN >/dev/null
  else
    echo "bench: vfpoll target did not start:"; cat /out/target-r$1.log
  fi
  kill -INT $TPID; wait $TPID; TPID=
  $V reset $B >/dev/null
}}
for rep in $(seq {}); do
  if [ $((rep % 2)) = 1 ]; then kernel $rep; vfpoll $rep; else vfpoll $rep; kernel $rep; fi
done
"#,
        a.repeat,
        targs = a.target_args.join(" "),
    );
    s
}

/// `cargo xtask bench --nvmf`.
pub fn main(ws: &Workspace, a: &BenchArgs) -> Result<u8> {
    let vfpoll = vfpoll_binary(ws, a)?;
    if !vfpoll.exists() {
        return Err(err!(
            "{} is missing: build it (cargo build --release -p vfpoll)",
            vfpoll.display()
        ));
    }
    let run_dir = vm::default_run_dir(ws, "bench-nvmf-iommu");
    let runs = CASES.len() as u64 * 2 * a.repeat as u64;
    let timeout = Duration::from_secs(300 + runs * (a.time as u64 + 30));
    let g = GuestRun::boot(ws, &run_dir, timeout, a.verbose, &job_script(a, &vfpoll))?;
    let (load_before, load_after) = (&g.load.0, &g.load.1);
    let dir = run_dir.join("out");
    let read = |f: &str| g.read(f);
    println!(
        "\ncargo xtask bench --nvmf: NVMe B {BDF} ns 1 (QEMU 7.2 nvme, 64 MiB, 512 B blocks) served \
         over NVMe/TCP on 127.0.0.1 to the guest kernel's initiator, in the TCG guest (kernel {}, \
         2 vCPUs, IOMMU); fio io_uring direct on CPU {FIO_CPU}, vfpoll target on CPU {TARGET_CPU} \
         ({}); {} s per run, median of {}",
        read("kernel.txt"),
        describe_binary(&vfpoll),
        a.time,
        a.repeat,
    );
    println!(
        "host: {}, {} CPUs; load average (1 min) {load_before} before, {load_after} after\n",
        cpu_model(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let clk_tck = read("clk_tck.txt").parse().unwrap_or(100.0);
    print!("{}", table(&dir, a.repeat, clk_tck));
    Ok(g.exit_code())
}

/// One run through one target.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Run {
    iops: f64,
    p99_us: f64,
    /// Busy cores of the whole guest (both vCPUs) in the sampling window.
    guest_cores: f64,
    /// fio's own cores (user + system).
    fio_cores: f64,
    /// The target's cores: vfpoll target's process; for the kernel, guest minus fio.
    target_cores: f64,
}

impl Run {
    /// Target CPU µs per I/O.
    fn target_us_per_io(&self) -> f64 {
        self.target_cores / self.iops.max(f64::MIN_POSITIVE) * 1e6
    }

    /// The guest's CPU µs per I/O outside fio (the target and the initiator's kernel work
    /// outside fio's context), measured the same way for both targets.
    fn non_fio_us_per_io(&self) -> f64 {
        (self.guest_cores - self.fio_cores).max(0.0) / self.iops.max(f64::MIN_POSITIVE) * 1e6
    }
}

/// One `snap` line: uptime (s), the process's utime + stime (ticks), the guest's busy ticks.
fn sample(line: &str) -> Option<(f64, f64, f64)> {
    let f: Vec<f64> = line
        .split_whitespace()
        .map(|w| w.parse().ok())
        .collect::<Option<_>>()?;
    // /proc/stat: user nice system idle iowait irq softirq steal ...
    let cpu = f.get(3..)?;
    let busy = [0, 1, 2, 5, 6, 7]
        .iter()
        .map(|&i| cpu.get(i).copied().unwrap_or(0.0))
        .sum();
    Some((*f.first()?, f.get(1)? + f.get(2)?, busy))
}

/// fio's JSON: IOPS and p99 of the direction that ran, its CPU share (cores).
fn fio_numbers(v: &Value, write: bool) -> Option<(f64, f64, f64)> {
    let job = v.get("jobs")?.as_array()?.first()?;
    let d = job.get(if write { "write" } else { "read" })?;
    let p99 = num(d.get("lat_ns")?.get("percentile")?.get("99.000000"))? / 1000.0;
    let cpu = (num(job.get("usr_cpu"))? + num(job.get("sys_cpu"))?) / 100.0;
    Some((num(d.get("iops"))?, p99, cpu))
}

fn run_of(dir: &Path, target: &str, c: &Case, rep: u32, clk_tck: f64) -> Option<Run> {
    let stem = format!("{target}-{}-r{rep}", c.id);
    let (iops, p99_us, fio_cores) = fio_numbers(
        &load_json(&dir.join(format!("{stem}.json")))?,
        c.rw.contains("write"),
    )?;
    let text = fs::read_to_string(dir.join(format!("{stem}.cpu"))).ok()?;
    let mut lines = text.lines();
    let (t0, p0, b0) = sample(lines.next()?)?;
    let (t1, p1, b1) = sample(lines.next()?)?;
    let secs = t1 - t0;
    if secs <= 0.0 {
        return None;
    }
    let guest_cores = (b1 - b0) / clk_tck / secs;
    let target_cores = if target == VFPOLL.0 {
        (p1 - p0) / clk_tck / secs
    } else {
        (guest_cores - fio_cores).max(0.0)
    };
    Some(Run {
        iops,
        p99_us,
        guest_cores,
        fio_cores,
        target_cores,
    })
}

/// Medians of every column over the repetitions that produced a result, the IOPS range, and
/// how many did.
fn summary(dir: &Path, target: &str, c: &Case, repeat: u32, clk_tck: f64) -> Option<(Run, f64, f64, usize)> {
    let rs: Vec<Run> = (1..=repeat)
        .filter_map(|r| run_of(dir, target, c, r, clk_tck))
        .collect();
    if rs.is_empty() {
        return None;
    }
    let col = |f: fn(&Run) -> f64| median(rs.iter().map(f).collect());
    let (lo, hi) = rs
        .iter()
        .fold((f64::MAX, 0f64), |(l, h), r| (l.min(r.iops), h.max(r.iops)));
    Some((
        Run {
            iops: col(|r| r.iops),
            p99_us: col(|r| r.p99_us),
            guest_cores: col(|r| r.guest_cores),
            fio_cores: col(|r| r.fio_cores),
            target_cores: col(|r| r.target_cores),
        },
        lo,
        hi,
        rs.len(),
    ))
}

/// The table: per case a row per target (medians) and a row of ratios vfpoll/kernel.
fn table(dir: &Path, repeat: u32, clk_tck: f64) -> String {
    let mut s = format!(
        "{:<21} {:<13} {:>7} {:>16} {:>8} {:>6} {:>6} {:>6} {:>9} {:>9} {:>10}\n",
        "case",
        "target",
        "IOPS",
        "IOPS range",
        "p99 us",
        "guest",
        "fio",
        "target",
        "g-f us/IO",
        "tgt us/IO",
        "IO/tgt c-s"
    );
    for c in CASES {
        let k = summary(dir, KERNEL.0, c, repeat, clk_tck);
        let v = summary(dir, VFPOLL.0, c, repeat, clk_tck);
        let mut label = c.label;
        for ((_, name), r) in [(KERNEL, &k), (VFPOLL, &v)] {
            let cells = match r {
                Some((m, lo, hi, n)) => [
                    format!("{:.0}", m.iops),
                    if *n == repeat as usize {
                        format!("{lo:.0}-{hi:.0}")
                    } else {
                        format!("{lo:.0}-{hi:.0} ({n})")
                    },
                    format!("{:.1}", m.p99_us),
                    format!("{:.2}", m.guest_cores),
                    format!("{:.2}", m.fio_cores),
                    format!("{:.2}", m.target_cores),
                    format!("{:.1}", m.non_fio_us_per_io()),
                    format!("{:.1}", m.target_us_per_io()),
                    format!("{:.0}", m.iops / m.target_cores.max(f64::MIN_POSITIVE)),
                ],
                None => ["-", "", "-", "-", "-", "-", "-", "-", "-"].map(String::from),
            };
            let [iops, range, p99, guest, fio, tgt, gf, us, per] = cells;
            let _ = writeln!(
                s,
                "{label:<21} {name:<13} {iops:>7} {range:>16} {p99:>8} {guest:>6} {fio:>6} {tgt:>6} {gf:>9} {us:>9} {per:>10}"
            );
            label = "";
        }
        if let (Some((k, ..)), Some((v, ..))) = (k, v) {
            let x = |a: f64, b: f64| format!("{:.2}x", a / b.max(f64::MIN_POSITIVE));
            let _ = writeln!(
                s,
                "{:<21} {:<13} {:>7} {:>16} {:>8} {:>6} {:>6} {:>6} {:>9} {:>9} {:>10}",
                "",
                "vfpoll/kernel",
                x(v.iops, k.iops),
                "",
                x(v.p99_us, k.p99_us),
                "",
                "",
                x(v.target_cores, k.target_cores),
                x(v.non_fio_us_per_io(), k.non_fio_us_per_io()),
                x(v.target_us_per_io(), k.target_us_per_io()),
                ""
            );
        }
    }
    s.push_str(
        "\nMedians over the repetitions. guest, fio, target: busy cores (of 2) in the middle of the \
         run; target = vfpoll target's process (it polls, sleeping only after --spin-us idle: near 1 core under load), for \
         the kernel target the guest's busy time minus fio's own (an upper bound: it also holds the \
         initiator's kworker and softirq work). g-f us/IO: the guest's CPU time per I/O outside \
         fio (target plus the initiator's kernel work outside fio's context), the same method for \
         both targets; tgt us/IO: target CPU time per I/O (vfpoll's own process against the \
         kernel's upper bound, which favours vfpoll); IO/tgt c-s: I/Os per target core-second. Ratios vfpoll/kernel: IOPS higher is better, p99 and CPU \
         lower is better.\n",
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_runs_both_targets_on_b_pinned_and_alternating() {
        let a = BenchArgs {
            time: 6,
            warmup: 1,
            repeat: 3,
            engines: Vec::new(),
            cases: Vec::new(),
            no_build: true,
            verbose: false,
            nvmf: true,
            vfpoll: None,
            target_args: vec!["--spin-us".into(), "0".into()],
            plot: super::super::Plot::No,
        };
        let s = job_script(&a, Path::new("/t/release/vfpoll"));
        for want in [
            "B=0000:00:04.0",
            "--nqn $VNQN --spin-us 0 > /out/target-r$1.log",
            "V=/t/release/vfpoll",
            "fio_run $1-4k-randread-qd32-r$2 --rw=randread --bs=4k --iodepth=32",
            "fio_run $1-4k-randread-qd1-r$2 --rw=randread --bs=4k --iodepth=1",
            "fio_run $1-128k-read-qd32-r$2 --rw=read --bs=128k --iodepth=32",
            "fio_run $1-4k-randwrite-qd32-r$2 --rw=randwrite --bs=4k --iodepth=32",
            "--runtime=6 --cpus_allowed=1",
            "sleep 1; snap > /out/$name.cpu; sleep 4; snap >> /out/$name.cpu",
            "taskset -c 0 $V target --ns $B/1 --listen 127.0.0.1:4420 --nqn $VNQN",
            "echo /dev/$(ns1) > $S/namespaces/1/device_path",
            "$V bind $B",
            "$V reset $B",
            "for rep in $(seq 3); do",
            "then kernel $rep; vfpoll $rep; else vfpoll $rep; kernel $rep; fi",
        ] {
            assert!(s.contains(want), "no {want:?} in\n{s}");
        }
    }

    #[test]
    fn cpu_samples_and_fio_json_are_read() {
        // uptime, utime stime, then /proc/stat: user nice system idle iowait irq softirq steal.
        let (t, p, busy) = sample("12.5 300 20 100 1 50 900 7 3 2 1 0 0").unwrap();
        assert_eq!((t, p, busy), (12.5, 320.0, 157.0));
        assert!(sample("12.5 x").is_none());
        let fio = crate::json::parse(
            r#"{"jobs":[{"usr_cpu":10.0,"sys_cpu":40.0,"read":{"iops":100,"lat_ns":{"percentile":{"99.000000":1}}},
                "write":{"iops":2000,"lat_ns":{"percentile":{"99.000000":250000}}}}]}"#,
        )
        .unwrap();
        assert_eq!(fio_numbers(&fio, true), Some((2000.0, 250.0, 0.5)));
        assert_eq!(fio_numbers(&fio, false).unwrap().0, 100.0);
    }

    #[test]
    fn table_medians_cpu_per_io_and_ratios() {
        let dir = std::env::temp_dir().join(format!("xtask-bench-nvmf-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let fio = |iops: u32, p99: u32, dir: &str| {
            format!(
                r#"{{"jobs":[{{"usr_cpu":10,"sys_cpu":40,"{dir}":{{"iops":{iops},"lat_ns":{{"percentile":{{"99.000000":{p99}}}}}}}}}]}}"#
            )
        };
        // 4 s windows at 100 ticks/s. Kernel: guest busy 600 ticks = 1.5 cores, fio 0.5, so the
        // target has 1.0 core. vfpoll: its process 400 ticks = 1.0 core.
        let cpu = |proc1: u32, busy1: u32| format!("10 0 0 0 0 0 0\n14 {proc1} 0 {busy1} 0 0 0\n");
        for c in CASES {
            let d = if c.rw.contains("write") { "write" } else { "read" };
            for (rep, (k, v)) in [(1000, 2000), (1100, 3000), (900, 2500)].into_iter().enumerate() {
                let w = |t: &str, ext: &str, text: String| {
                    fs::write(dir.join(format!("{t}-{}-r{}.{ext}", c.id, rep + 1)), text).unwrap()
                };
                w("kernel", "json", fio(k, 400_000, d));
                w("kernel", "cpu", cpu(0, 600));
                w("vfpoll", "json", fio(v, 100_000, d));
                w("vfpoll", "cpu", cpu(400, 700));
            }
        }
        // The third repetition of one case lost its CPU samples: two runs remain.
        fs::remove_file(dir.join("vfpoll-4k-randwrite-qd32-r3.cpu")).unwrap();
        let t = table(&dir, 3, 100.0);
        fs::remove_dir_all(&dir).unwrap();
        let rows = |name: &str| {
            t.lines()
                .filter(|l| l.contains(name))
                .map(|l| l.split_whitespace().collect::<Vec<_>>())
                .collect::<Vec<_>>()
        };
        let kernel = rows("nvmet-tcp ");
        assert_eq!(kernel.len(), 4, "{t}");
        for r in &kernel {
            // IOPS 1000 (median), range, p99 400.0, guest 1.50, fio 0.50, target 1.00, 1000 us/IO.
            assert!(
                r.ends_with(&[
                    "1000", "900-1100", "400.0", "1.50", "0.50", "1.00", "1000.0", "1000.0", "1000"
                ]),
                "{t}"
            );
        }
        let ours = rows("vfpoll target ");
        // guest - fio = 1.25 cores over 2500 IOPS: 500 us per I/O.
        assert!(
            ours[0].ends_with(&[
                "2500",
                "2000-3000",
                "100.0",
                "1.75",
                "0.50",
                "1.00",
                "500.0",
                "400.0",
                "2500"
            ]),
            "{t}"
        );
        assert!(ours[3].contains(&"2000-3000") && ours[3].contains(&"(2)"), "{t}");
        assert!(ours[3].contains(&"2500"), "median of 2000 and 3000: {t}");
        let ratio = rows("vfpoll/kernel ");
        assert_eq!(ratio.len(), 4, "{t}");
        assert!(
            ratio[0].ends_with(&["2.50x", "0.25x", "1.00x", "0.50x", "0.40x"]),
            "{t}"
        );
    }
}
