//! `cargo xtask test`: every check of the project, with a summary table at the end.
//!
//! Test-bed tests live in the integration-test binaries of `vfpoll-tests` (`tests/tests/*.rs`):
//! `#[ignore = "test bed"]` functions named `guest_*` run inside the guest, one boot per binary
//! and mode; `#[ignore]` functions named `host_check_*` then run on the host against the boot's
//! run dir (`VFPOLL_RUN_DIR`): the NVMe image files and `gpubar.shm` are the oracle.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::cli::TestArgs;
use crate::json;
use crate::setup::{self, Assets};
use crate::util::{err, random_u64, run, secs, stdout_of, Context, Result};
use crate::vm::{self, Boot, Mode, DEFAULT_MODULES, EXIT_NO_CODE, EXIT_TIMEOUT};
use crate::Workspace;

/// The crate whose integration tests run in the guest.
const TEST_PACKAGE: &str = "vfpoll-tests";
/// Name prefix of the tests that run in the guest.
const GUEST_PREFIX: &str = "guest_";
/// Name prefix of the tests that check a boot's run dir on the host.
const HOST_CHECK_PREFIX: &str = "host_check_";

/// `cargo xtask test`.
pub fn main(ws: &Workspace, a: &TestArgs) -> Result<u8> {
    let mut r = Report::default();
    let assets = if a.host_only {
        None
    } else {
        r.step("setup", || {
            let assets = setup::setup(ws)?;
            let note = format!("kernel {}", assets.kver);
            Ok((assets, note))
        })
    };

    r.cargo(ws, "cargo fmt --check", &["fmt", "--all", "--", "--check"]);
    r.cargo(
        ws,
        "cargo clippy",
        &["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"],
    );
    // The API docs stay true to the code: broken intra-doc links fail the run.
    r.cargo_env(
        ws,
        "cargo doc",
        &["doc", "--no-deps", "--workspace"],
        &[("RUSTDOCFLAGS", "-D warnings")],
    );
    let mut host_test = vec!["test", "--workspace"];
    if let Some(f) = &a.filter {
        host_test.extend(["--", f]);
    }
    r.cargo(ws, "cargo test (host)", &host_test);

    if let Some(assets) = assets {
        test_bed(ws, a, &assets, &mut r);
    }
    Ok(r.summary())
}

/// Part c: the guest boots and the host checks.
fn test_bed(ws: &Workspace, a: &TestArgs, assets: &Assets, r: &mut Report) {
    let Some(()) = r.step("cargo build --bins", || {
        vm::build_bins(ws).map(|()| ((), String::new()))
    }) else {
        return;
    };
    let Some(bins) = r.step("build test-bed tests", || {
        let bins = test_binaries(ws)?;
        let note = format!("{} binaries", bins.len());
        Ok((bins, note))
    }) else {
        return;
    };
    if bins.is_empty() {
        eprintln!("test: {TEST_PACKAGE} has no integration-test binaries (tests/tests/*.rs)");
    }
    for bin in &bins {
        let listed = match list_ignored(&bin.exe) {
            Ok(l) => l,
            Err(e) => {
                r.record(&format!("list {}", bin.name), Some(false), 0.0, e.to_string());
                continue;
            }
        };
        let selected = |prefix: &str| -> Vec<String> {
            listed
                .iter()
                .filter(|t| t.rsplit("::").next().unwrap_or(t).starts_with(prefix))
                .filter(|t| {
                    a.filter
                        .as_ref()
                        .is_none_or(|f| t.contains(f.as_str()) || bin.name.contains(f.as_str()))
                })
                .cloned()
                .collect()
        };
        let guest = selected(GUEST_PREFIX);
        let host = selected(HOST_CHECK_PREFIX);
        if guest.is_empty() {
            eprintln!("test: {}: no {GUEST_PREFIX}* tests selected", bin.name);
            continue;
        }
        for &mode in &a.modes {
            run_pair(ws, a, assets, r, bin, mode, &guest, &host);
        }
    }
}

/// One boot of `bin` in `mode`, then its host checks.
#[allow(clippy::too_many_arguments)]
fn run_pair(
    ws: &Workspace,
    a: &TestArgs,
    assets: &Assets,
    r: &mut Report,
    bin: &TestBin,
    mode: Mode,
    guest: &[String],
    host: &[String],
) {
    let label = format!("{} ({})", bin.name, mode.name());
    let seed = match random_u64() {
        Ok(s) => s.to_string(),
        Err(e) => {
            r.record(&format!("guest {label}"), Some(false), 0.0, e.to_string());
            return;
        }
    };
    let run_dir = vm::default_run_dir(ws, &format!("{}-{}", bin.name, mode.name()));
    let pkg_dir = ws.root.join("tests");
    let mut command: Vec<OsString> = vec![
        bin.exe.clone().into(),
        "--ignored".into(),
        "--test-threads=1".into(),
        "--exact".into(),
    ];
    command.extend(guest.iter().map(OsString::from));
    let boot = Boot {
        mode,
        timeout: a.timeout,
        mem: "2G".into(),
        smp: 2,
        modules: DEFAULT_MODULES.iter().map(|m| m.to_string()).collect(),
        hugepages: 0,
        run_dir: run_dir.clone(),
        keep_run_dir: false,
        verbose: a.verbose,
        cwd: pkg_dir.clone(),
        env: vec![("VFPOLL_SEED".into(), seed.clone().into())],
        command,
    };
    eprintln!("test: {label}: {} guest tests, VFPOLL_SEED={seed}", guest.len());
    let lock = match vm::lock_run_dir(&run_dir) {
        Ok(l) => l,
        Err(e) => {
            r.record(&format!("guest {label}"), Some(false), 0.0, e.to_string());
            return;
        }
    };
    let guest_ok = r.step(&format!("guest {label}"), || {
        let out = vm::run_boot(ws, assets, &boot, &lock)?;
        match out.code {
            0 => Ok((
                (),
                format!(
                    "{} tests; job started after {}",
                    guest.len(),
                    out.boot.map_or("-".into(), secs)
                ),
            )),
            EXIT_TIMEOUT => Err(err!("timeout after {} s", a.timeout.as_secs())),
            EXIT_NO_CODE => Err(err!("the guest reported no exit code")),
            c => Err(err!("guest exit code {c}")),
        }
    });
    if host.is_empty() {
        return;
    }
    let name = format!("host_check {label}");
    if guest_ok.is_none() {
        r.record(&name, None, 0.0, "skipped: guest step failed".into());
        return;
    }
    r.step(&name, || {
        run(Command::new(&bin.exe)
            .args(["--ignored", "--test-threads=1", "--exact"])
            .args(host)
            .current_dir(&pkg_dir)
            .env("VFPOLL_RUN_DIR", &run_dir)
            .env("VFPOLL_RUN_MODE", mode.name())
            .env("VFPOLL_SEED", &seed))?;
        Ok(((), format!("{} checks", host.len())))
    });
}

/// An integration-test executable of [`TEST_PACKAGE`].
#[derive(Debug)]
struct TestBin {
    /// The target name (the file stem in `tests/tests/`).
    name: String,
    exe: PathBuf,
}

/// Builds the integration tests of [`TEST_PACKAGE`] and returns their executables.
fn test_binaries(ws: &Workspace) -> Result<Vec<TestBin>> {
    let mut cmd = vm::cargo(ws);
    cmd.args(["test", "-p", TEST_PACKAGE, "--no-run", "--message-format=json"])
        .stderr(Stdio::inherit());
    let text = stdout_of(&mut cmd)?;
    let manifest = ws.root.join("tests/Cargo.toml");
    let mut bins = Vec::new();
    for line in text.lines().filter(|l| l.starts_with('{')) {
        let v = json::parse(line).map_err(|e| err!("cargo output: {e}"))?;
        let field = |k: &str| v.get(k).and_then(json::Value::as_str);
        if field("reason") != Some("compiler-artifact")
            || field("manifest_path").map(Path::new) != Some(manifest.as_path())
        {
            continue;
        }
        let target = v.get("target");
        let kind = target.and_then(|t| t.get("kind")).and_then(json::Value::as_array);
        if kind != Some(&[json::Value::Str("test".into())][..]) {
            continue;
        }
        if let (Some(exe), Some(name)) = (
            field("executable"),
            target.and_then(|t| t.get("name")).and_then(json::Value::as_str),
        ) {
            bins.push(TestBin {
                name: name.to_string(),
                exe: exe.into(),
            });
        }
    }
    bins.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(bins)
}

/// The ignored tests of a libtest binary (`--list --ignored`), run on the host.
fn list_ignored(exe: &Path) -> Result<Vec<String>> {
    let text = stdout_of(Command::new(exe).args(["--list", "--ignored"]))
        .context(format_args!("listing the tests of {}", exe.display()))?;
    Ok(text
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .map(String::from)
        .collect())
}

/// The rows of the summary table.
#[derive(Default)]
struct Report {
    rows: Vec<Row>,
}

struct Row {
    name: String,
    /// `None`: skipped.
    ok: Option<bool>,
    secs: f64,
    note: String,
}

impl Report {
    /// Runs `f` as the step `name`, prints a line, records a row; `Some` when it succeeded.
    fn step<T>(&mut self, name: &str, f: impl FnOnce() -> Result<(T, String)>) -> Option<T> {
        eprintln!("test: ── {name}");
        let t0 = Instant::now();
        let res = f();
        let secs = t0.elapsed().as_secs_f64();
        match res {
            Ok((v, note)) => {
                self.record(name, Some(true), secs, note);
                Some(v)
            }
            Err(e) => {
                self.record(name, Some(false), secs, e.to_string());
                None
            }
        }
    }

    fn record(&mut self, name: &str, ok: Option<bool>, secs: f64, note: String) {
        let result = match ok {
            Some(true) => "ok",
            Some(false) => "FAILED",
            None => "skipped",
        };
        let sep = if note.is_empty() { "" } else { ": " };
        eprintln!("test: {name}: {result} in {secs:.1} s{sep}{note}");
        self.rows.push(Row {
            name: name.to_string(),
            ok,
            secs,
            note,
        });
    }

    /// A cargo command as one step.
    fn cargo(&mut self, ws: &Workspace, name: &str, args: &[&str]) {
        self.cargo_env(ws, name, args, &[]);
    }

    /// [`Report::cargo`] with extra environment variables.
    fn cargo_env(&mut self, ws: &Workspace, name: &str, args: &[&str], env: &[(&str, &str)]) {
        self.step(name, || {
            let status = vm::cargo(ws).args(args).envs(env.iter().copied()).status()?;
            if status.success() {
                Ok(((), String::new()))
            } else {
                Err(err!("{status}"))
            }
        });
    }

    /// Prints the table; the exit code (1 when a step failed).
    fn summary(&self) -> u8 {
        let width = self.rows.iter().map(|r| r.name.len()).max().unwrap_or(4).max(4);
        eprintln!("\n{:width$}  {:7}  {:>7}", "step", "result", "seconds");
        let mut failed = 0;
        for r in &self.rows {
            let result = match r.ok {
                Some(true) => "ok",
                Some(false) => {
                    failed += 1;
                    "FAILED"
                }
                None => "skipped",
            };
            let note = r.note.lines().next().unwrap_or("");
            eprintln!("{:width$}  {result:7}  {:7.1}  {note}", r.name, r.secs);
        }
        let total: f64 = self.rows.iter().map(|r| r.secs).sum();
        eprintln!(
            "{:width$}  {:7}  {total:7.1}",
            "total",
            if failed == 0 { "ok" } else { "FAILED" }
        );
        if failed == 0 {
            0
        } else {
            eprintln!("test: {failed} step(s) failed");
            1
        }
    }
}
