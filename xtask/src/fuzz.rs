//! `cargo xtask fuzz`: coverage-guided fuzzing of vfpoll-nvmf's wire-facing code and
//! vfpoll-store's on-disk parsers with libFuzzer, on stable Rust; `cargo xtask test` runs it
//! for a bounded time.
//!
//! The targets live in `driver/nvmf/fuzz` (crate `vfpoll-nvmf-fuzz`): `fuzz_pdu` (the NVMe/TCP
//! PDU parser, builders, digests, ICReq/ICResp negotiation), `fuzz_auth` (DH-HMAC-CHAP), `fuzz_resv` (the reservation state file) and `fuzz_fabrics` (Connect, admin
//! and I/O command decoding); and in `store/fuzz` (crate `vfpoll-store-fuzz`): `fuzz_superblock`,
//! `fuzz_root`, `fuzz_catalog`, `fuzz_manifest` and `fuzz_slot` (the store's format parsers).
//! They are built with the crate's `libfuzzer` feature (libFuzzer
//! from `libfuzzer-sys`, compiled by the C++ compiler) and LLVM's SanitizerCoverage passes, which
//! stable rustc runs with `-Cpasses=sancov-module` (no sanitizer, which would need nightly:
//! safe Rust panics on an out-of-bounds read anyway), into `target/fuzz/`, with overflow checks
//! and debug assertions on, at opt-level 1. `--target <host>` keeps the instrumentation out of
//! build scripts.
//!
//! Each run first proves it can fail: a self-test runs `fuzz_pdu` with `VFPOLL_FUZZ_PLANT=1`,
//! which plants a crash the seeds do not reach, and expects libFuzzer to find it and save it.
//! Then every target runs for the given time (in parallel), seeded by code
//! (`VFPOLL_FUZZ_SEEDS`), its corpus kept in `target/fuzz/corpus/<target>/` between runs. A
//! crash, hang or out-of-memory fails the run with the input, where libFuzzer saved it
//! (`target/fuzz/artifacts/<target>/`) and the commands that reproduce it.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant, SystemTime};

use crate::build;
use crate::util::{err, mkdir, run, stdout_of, Context, Lock, Result};
use crate::Workspace;

pub const HELP: &str = "\
Fuzz vfpoll-nvmf's NVMe/TCP PDU parser and fabrics command decoding, and vfpoll-store's on-disk
parsers, with libFuzzer

Usage: cargo xtask fuzz [OPTIONS]

Builds the targets of driver/nvmf/fuzz and store/fuzz with coverage instrumentation (stable Rust, libFuzzer
built by the C++ compiler) into target/fuzz/, checks that a planted crash is found (the proof
that a real one would be), then runs each target for SECS seconds, in parallel. Fails on a crash,
hang or out-of-memory, printing the input and the commands that reproduce it. The corpus grows
in target/fuzz/corpus/<target>/; inputs that fail are saved in target/fuzz/artifacts/<target>/.
`cargo xtask test` runs the same for VFPOLL_FUZZ_SECS seconds per target (default 30; 0 skips).

Options:
      --secs <SECS>      Seconds per target [default: 300]
      --target <NAME>    Only this target: pdu, fabrics, auth, resv, superblock, root, catalog, manifest or
                         slot [default: all]
      --no-selftest      Skip the planted-crash check
  -h, --help             Print this help";

/// Seconds per target in `cargo xtask test`, unless `VFPOLL_FUZZ_SECS` says otherwise.
pub const TEST_SECS: u64 = 30;
/// The environment variable that sets [`TEST_SECS`].
pub const SECS_ENV: &str = "VFPOLL_FUZZ_SECS";
/// `cargo xtask fuzz` without `--secs`.
const DEFAULT_SECS: u64 = 300;
/// The crates of the targets.
const PACKAGES: [&str; 2] = ["vfpoll-nvmf-fuzz", "vfpoll-store-fuzz"];
/// The environment variables and the message of `vfpoll_nvmf_fuzz` (`PLANT_ENV`, `SEEDS_ENV`,
/// `PLANTED_MESSAGE`; a unit test checks they match).
const PLANT_ENV: &str = "VFPOLL_FUZZ_PLANT";
const SEEDS_ENV: &str = "VFPOLL_FUZZ_SEEDS";
const PLANTED_MESSAGE: &str = "planted crash (VFPOLL_FUZZ_PLANT=1)";
/// The most time the self-test gives libFuzzer to find the planted crash (it takes about a
/// second).
const SELFTEST_SECS: u64 = 60;

/// SanitizerCoverage as cargo-fuzz asks for it, minus the sanitizer: 8-bit edge counters and
/// the PC table libFuzzer's coverage feedback reads, comparison tracing for its value
/// mutations; overflow checks and debug assertions as in a debug build.
const RUSTFLAGS: &[&str] = &[
    "-Cpasses=sancov-module",
    "-Cllvm-args=-sanitizer-coverage-level=4",
    "-Cllvm-args=-sanitizer-coverage-inline-8bit-counters",
    "-Cllvm-args=-sanitizer-coverage-pc-table",
    "-Cllvm-args=-sanitizer-coverage-trace-compares",
    "-Cdebug-assertions",
    "-Coverflow-checks",
];

/// A fuzz target: the binary is `fuzz_<name>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    pub name: &'static str,
    /// libFuzzer's `-max_len`: the seeds fit.
    max_len: usize,
    /// Its crate, and the crate's directory in the workspace.
    package: &'static str,
    dir: &'static str,
}

const NVMF: (&str, &str) = ("vfpoll-nvmf-fuzz", "driver/nvmf/fuzz");
const STORE: (&str, &str) = ("vfpoll-store-fuzz", "store/fuzz");

const fn target(name: &'static str, max_len: usize, (package, dir): (&'static str, &'static str)) -> Target {
    Target {
        name,
        max_len,
        package,
        dir,
    }
}

pub const TARGETS: [Target; 9] = [
    target("pdu", 16384, NVMF),
    target("fabrics", 16384, NVMF),
    target("auth", 4096, NVMF),
    target("resv", 4096, NVMF),
    target("superblock", 4200, STORE),
    target("root", 4200, STORE),
    target("catalog", 16384, STORE),
    target("manifest", 16384, STORE),
    target("slot", 128, STORE),
];

/// Options of `cargo xtask fuzz`.
#[derive(Debug, Clone)]
pub struct FuzzArgs {
    /// Seconds per target.
    pub secs: u64,
    pub targets: Vec<Target>,
    /// Run the planted-crash check first.
    pub selftest: bool,
}

impl FuzzArgs {
    /// What `cargo xtask test` runs: every target, `secs` each, with the self-test.
    pub fn test(secs: u64) -> Self {
        FuzzArgs {
            secs,
            targets: TARGETS.to_vec(),
            selftest: true,
        }
    }
}

/// Parses the arguments after `cargo xtask fuzz`; `None`: `--help` asked for [`HELP`].
pub fn parse(args: &[String]) -> Result<Option<FuzzArgs>> {
    let mut a = FuzzArgs {
        secs: DEFAULT_SECS,
        targets: TARGETS.to_vec(),
        selftest: true,
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
                .ok_or_else(|| err!("fuzz: {name} needs a value"))
        };
        match name {
            "-h" | "--help" => return Ok(None),
            "--no-selftest" => a.selftest = false,
            "--secs" => {
                let v = value()?;
                a.secs = v
                    .parse()
                    .ok()
                    .filter(|&s| s > 0)
                    .ok_or_else(|| err!("fuzz: --secs takes whole seconds above 0, not {v:?}"))?;
            }
            "--target" => {
                let v = value()?;
                let t = TARGETS.iter().find(|t| t.name == v).ok_or_else(|| {
                    let names: Vec<&str> = TARGETS.iter().map(|t| t.name).collect();
                    err!("fuzz: --target takes one of {}, not {v:?}", names.join(", "))
                })?;
                a.targets = vec![*t];
            }
            _ => {
                return Err(err!(
                    "fuzz: unexpected argument {s:?}; try `cargo xtask fuzz --help`"
                ))
            }
        }
    }
    Ok(Some(a))
}

/// `cargo xtask fuzz`.
pub fn main(ws: &Workspace, a: &FuzzArgs) -> Result<u8> {
    let note = run_all(ws, a)?;
    eprintln!("fuzz: ok: {note}");
    Ok(0)
}

/// Seconds per target for `cargo xtask test`: `VFPOLL_FUZZ_SECS`, else [`TEST_SECS`]; 0 skips.
pub fn test_secs() -> Result<u64> {
    match std::env::var(SECS_ENV) {
        Ok(v) => v
            .trim()
            .parse()
            .map_err(|_| err!("{SECS_ENV} takes whole seconds (0 skips fuzzing), not {v:?}")),
        Err(_) => Ok(TEST_SECS),
    }
}

/// Builds, self-tests and fuzzes; a one-line note on success, the full report of a failure.
pub fn run_all(ws: &Workspace, a: &FuzzArgs) -> Result<String> {
    let root = mkdir(ws.target.join("fuzz"))?;
    // One run at a time: runs share the binaries, corpora, logs and artifact directories.
    let _lock = Lock::acquire(&root.join("lock"))?;
    let bins = build(ws)?;
    let mut notes = Vec::new();
    if a.selftest {
        notes.push(self_test(ws, &bins, &root)?);
    }
    eprintln!(
        "fuzz: {} for {} s each",
        a.targets.iter().map(|t| t.name).collect::<Vec<_>>().join(" and "),
        a.secs
    );
    let mut running = Vec::new();
    for t in &a.targets {
        let job = Job {
            target: *t,
            secs: a.secs,
            corpus: mkdir(root.join("corpus").join(t.name))?,
            artifacts: mkdir(root.join("artifacts").join(t.name))?,
            log: root.join(format!("{}.log", t.name)),
            plant: false,
        };
        running.push(job.start(&bins)?);
    }
    // Every target runs to its end, so that one report shows all that failed.
    let mut failures = Vec::new();
    for r in running {
        let name = r.job.target.name;
        match r.finish(ws) {
            Ok(Verdict::Clean(stats)) => notes.push(format!("{name}: {stats}")),
            Ok(Verdict::Failed(report)) => failures.push(report),
            Err(e) => failures.push(e.to_string()),
        }
    }
    if failures.is_empty() {
        Ok(notes.join("; "))
    } else {
        Err(err!("{}", failures.join("\n\n")))
    }
}

/// The host's target triple (`rustc -vV`).
fn host_triple() -> Result<String> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let text = stdout_of(Command::new(rustc).arg("-vV"))?;
    text.lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(|h| h.trim().to_string())
        .ok_or_else(|| err!("`rustc -vV` names no host triple:\n{text}"))
}

/// Builds the libFuzzer binaries; returns their directory.
fn build(ws: &Workspace) -> Result<PathBuf> {
    let triple = host_triple()?;
    let dir = ws.target.join("fuzz");
    let mut cmd = build::cargo(ws);
    cmd.args(["build", "--release"]);
    for p in PACKAGES {
        cmd.args(["--package", p]);
    }
    let features: Vec<String> = PACKAGES.iter().map(|p| format!("{p}/libfuzzer")).collect();
    cmd.args(["--features", &features.join(",")])
        .args(["--bins", "--target", &triple])
        .env("CARGO_TARGET_DIR", &dir)
        .env("RUSTFLAGS", RUSTFLAGS.join(" "))
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS")
        // opt-level 1 halves the build (about 50 instead of 100 CPU seconds) for 5-10 % fewer
        // runs per second.
        .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "1");
    eprintln!(
        "fuzz: building the targets with coverage instrumentation into {}",
        dir.display()
    );
    run(&mut cmd).context(
        "building the fuzz targets (libFuzzer needs a C++ compiler: `cargo xtask setup` installs g++)",
    )?;
    Ok(dir.join(triple).join("release"))
}

/// Runs `fuzz_pdu` with the planted crash and expects libFuzzer to find it: the proof that
/// the instrumentation, the seeds, the crash detection and the reporting work.
fn self_test(ws: &Workspace, bins: &Path, root: &Path) -> Result<String> {
    let dir = root.join("selftest");
    if dir.exists() {
        fs::remove_dir_all(&dir).context(format_args!("removing {}", dir.display()))?;
    }
    let job = Job {
        target: TARGETS[0],
        secs: SELFTEST_SECS,
        corpus: mkdir(dir.join("corpus"))?,
        artifacts: mkdir(dir.join("artifacts"))?,
        log: dir.join("fuzz.log"),
        plant: true,
    };
    eprintln!("fuzz: self-test: {PLANT_ENV}=1 fuzz_pdu must find the planted crash");
    let t0 = Instant::now();
    match job.start(bins)?.finish(ws)? {
        Verdict::Failed(report) if report.contains(PLANTED_MESSAGE) => Ok(format!(
            "self-test found the planted crash in {:.1} s",
            t0.elapsed().as_secs_f64()
        )),
        Verdict::Failed(report) => Err(err!("self-test: a crash other than the planted one:\n{report}")),
        Verdict::Clean(stats) => Err(err!(
            "self-test: libFuzzer did not find the planted crash ({PLANT_ENV}=1) in {SELFTEST_SECS} s \
             ({stats}); this fuzz step could not find a real crash either: check the coverage \
             flags, the seeds (vfpoll_nvmf_fuzz::seeds) and the log, {}",
            dir.join("fuzz.log").display()
        )),
    }
}

/// One libFuzzer run.
#[derive(Debug, Clone)]
struct Job {
    target: Target,
    secs: u64,
    corpus: PathBuf,
    artifacts: PathBuf,
    log: PathBuf,
    plant: bool,
}

/// A started [`Job`].
struct Running {
    job: Job,
    child: Child,
    exe: PathBuf,
    started: Instant,
    /// The artifact directory's files and their modification times before the run.
    before: Vec<(PathBuf, SystemTime)>,
}

/// How a run ended.
#[derive(Debug)]
enum Verdict {
    /// No failure: libFuzzer's statistics.
    Clean(String),
    /// A failing input (or libFuzzer failed): the report.
    Failed(String),
}

impl Job {
    fn start(self, bins: &Path) -> Result<Running> {
        let exe = bins.join(format!("fuzz_{}", self.target.name));
        let log = File::create(&self.log).context(format_args!("creating {}", self.log.display()))?;
        let mut cmd = Command::new(&exe);
        cmd.arg(format!("-max_total_time={}", self.secs))
            .arg(format!("-max_len={}", self.target.max_len))
            .arg(format!("-artifact_prefix={}/", self.artifacts.display()))
            // An input that takes 10 s or 2 GiB is a bug too (a hang, a runaway allocation).
            .args(["-timeout=10", "-rss_limit_mb=2048", "-print_final_stats=1"])
            .arg(&self.corpus)
            .env(SEEDS_ENV, &self.corpus)
            .env(PLANT_ENV, if self.plant { "1" } else { "0" })
            .env("RUST_BACKTRACE", "1")
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let before = artifacts(&self.artifacts)?;
        let child = cmd
            .spawn()
            .context(format_args!("cannot run {}", exe.display()))?;
        Ok(Running {
            job: self,
            child,
            exe,
            started: Instant::now(),
            before,
        })
    }
}

impl Running {
    /// Waits for the run (killing it if it outlives its time by a minute) and judges it.
    fn finish(mut self, ws: &Workspace) -> Result<Verdict> {
        let deadline = Duration::from_secs(self.job.secs + 60);
        let status = loop {
            if let Some(s) = self.child.try_wait()? {
                break s;
            }
            if self.started.elapsed() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return Ok(Verdict::Failed(format!(
                    "fuzz_{}: still running {} s after its -max_total_time; killed; see {}",
                    self.job.target.name,
                    deadline.as_secs(),
                    self.job.log.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let log = fs::read_to_string(&self.job.log).unwrap_or_default();
        // What libFuzzer saved (crash-, timeout-, oom-...): new files, or old ones rewritten.
        let mut saved: Vec<(SystemTime, PathBuf)> = artifacts(&self.job.artifacts)?
            .into_iter()
            .filter(|f| !self.before.contains(f))
            .map(|(p, t)| (t, p))
            .collect();
        saved.sort();
        let saved: Vec<PathBuf> = saved.into_iter().map(|(_, p)| p).collect();
        Ok(judge(ws, &self, status, &log, &saved))
    }
}

/// The files in `dir` with their modification times.
fn artifacts(dir: &Path) -> Result<Vec<(PathBuf, SystemTime)>> {
    let mut found = Vec::new();
    for e in fs::read_dir(dir).context(format_args!("listing {}", dir.display()))? {
        let e = e?;
        if e.file_type()?.is_file() {
            found.push((e.path(), e.metadata()?.modified()?));
        }
    }
    Ok(found)
}

/// The verdict on a finished run.
fn judge(ws: &Workspace, r: &Running, status: ExitStatus, log: &str, saved: &[PathBuf]) -> Verdict {
    let name = r.job.target.name;
    if status.success() && saved.is_empty() {
        return Verdict::Clean(stats(log));
    }
    let Some(input) = saved.first() else {
        return Verdict::Failed(format!(
            "fuzz_{name}: libFuzzer exited with {status} without saving an input; the end of {}:\n{}",
            r.job.log.display(),
            tail(log, 30)
        ));
    };
    let kind = input
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.split('-').next())
        .unwrap_or("crash");
    let bytes = fs::read(input).unwrap_or_default();
    let rel = |p: &Path| p.strip_prefix(&ws.root).unwrap_or(p).display().to_string();
    let report = format!(
        "fuzz_{name}: libFuzzer found a failing input ({kind}, {} bytes) after {:.1} s\n{}\n\
         input (hex{}): {}\n\
         saved as {}\n\
         reproduce: {} {}\n\
         or, without libFuzzer and with a plain panic: cargo run -p {} --bin fuzz_{name} -- {}\n\
         full log: {}",
        bytes.len(),
        r.started.elapsed().as_secs_f64(),
        panic_lines(log),
        if bytes.len() > 512 {
            ", the first 512 bytes"
        } else {
            ""
        },
        hex(&bytes[..bytes.len().min(512)]),
        rel(input),
        rel(&r.exe),
        rel(input),
        r.job.target.package,
        rel(input),
        rel(&r.job.log),
    );
    Verdict::Failed(report)
}

/// The panic message (or libFuzzer's error) of a failed run: the lines from `panicked at` up
/// to the backtrace, else libFuzzer's `ERROR:` line.
fn panic_lines(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    if let Some(i) = lines.iter().position(|l| l.contains("panicked at")) {
        let end = lines[i..]
            .iter()
            .position(|l| l.starts_with("stack backtrace") || l.starts_with("note: "))
            .map_or(lines.len(), |n| i + n)
            .min(i + 12);
        return lines[i..end].join("\n");
    }
    lines
        .iter()
        .find(|l| l.contains("ERROR: libFuzzer"))
        .map_or_else(|| tail(log, 10), |l| l.to_string())
}

/// libFuzzer's closing statistics: runs, coverage, corpus.
fn stats(log: &str) -> String {
    let stat = |key: &str| {
        log.lines()
            .find_map(|l| l.strip_prefix(key))
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|| "?".into())
    };
    let last = log.lines().rev().find(|l| l.contains(" cov: "));
    let field = |key: &str| {
        last.and_then(|l| l.split_once(key))
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .unwrap_or("?")
            .to_string()
    };
    format!(
        "{} runs ({}/s), {} coverage points, {} features, corpus {}",
        stat("stat::number_of_executed_units:"),
        stat("stat::average_exec_per_sec:"),
        field(" cov: "),
        field(" ft: "),
        field(" corp: "),
    )
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names this module shares with the fuzz crate are the crate's.
    #[test]
    fn shared_names_match_the_fuzz_crate() {
        let lib = fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../driver/nvmf/fuzz/src/lib.rs"
        ))
        .expect("the fuzz crate");
        for (name, value) in [
            ("PLANT_ENV", PLANT_ENV),
            ("SEEDS_ENV", SEEDS_ENV),
            ("PLANTED_MESSAGE", PLANTED_MESSAGE),
        ] {
            let line = format!("pub const {name}: &str = \"{value}\";");
            assert!(lib.contains(&line), "{line} is not in the fuzz crate's lib.rs");
        }
        for t in TARGETS {
            assert!(PACKAGES.contains(&t.package), "{}", t.package);
            let bin = format!(
                "{}/../{}/src/bin/fuzz_{}.rs",
                env!("CARGO_MANIFEST_DIR"),
                t.dir,
                t.name
            );
            assert!(Path::new(&bin).exists(), "{bin}");
        }
    }

    const CRASH_LOG: &str = "\
INFO: Seed: 1
#12795\tREDUCE cov: 552 ft: 1307 corp: 96/150Kb lim: 8192 exec/s: 0 rss: 28Mb
\nthread '<unnamed>' (14460) panicked at driver/nvmf/fuzz/src/pdu.rs:542:39:
assertion `left == right` failed: rebuilt
  left: 1
 right: 2
stack backtrace:
   0: __rustc::rust_begin_unwind
==1== ERROR: libFuzzer: deadly signal";

    #[test]
    fn the_panic_is_quoted() {
        let p = panic_lines(CRASH_LOG);
        assert!(
            p.starts_with("thread '<unnamed>'") && p.ends_with(" right: 2"),
            "{p}"
        );
        assert_eq!(
            panic_lines("x\n==1== ERROR: libFuzzer: out-of-memory"),
            "==1== ERROR: libFuzzer: out-of-memory"
        );
    }

    #[test]
    fn statistics_are_read() {
        let log = "#5000\tDONE   cov: 600 ft: 2000 corp: 120/200Kb lim: 16384 exec/s: 250 rss: 40Mb\n\
                   stat::number_of_executed_units: 5000\nstat::average_exec_per_sec:     250\n";
        assert_eq!(
            stats(log),
            "5000 runs (250/s), 600 coverage points, 2000 features, corpus 120/200Kb"
        );
    }

    #[test]
    fn options() {
        let Some(a) = parse(&["--secs=5".into(), "--target".into(), "fabrics".into()]).unwrap() else {
            panic!("not fuzz")
        };
        assert_eq!((a.secs, a.targets[0].name, a.selftest), (5, "fabrics", true));
        assert!(parse(&["--secs".into(), "0".into()]).is_err());
        assert!(parse(&["--target".into(), "nvme".into()]).is_err());
    }
}
