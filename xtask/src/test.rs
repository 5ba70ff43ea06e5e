//! `cargo xtask test`: every check of the project, with a summary table at the end.
//!
//! Test-bed tests live in the integration-test binaries of `vfpoll-tests` (`tests/tests/*.rs`):
//! `#[ignore = "test bed"]` functions named `guest_*` run inside the guest, one boot per binary
//! and mode; `#[ignore]` functions named `host_check_*` then run on the host against the boot's
//! run dir (`VFPOLL_RUN_DIR`): the NVMe image files and `gpubar.shm` are the oracle.
//!
//! A boot in which QEMU's vIOMMU refused a device DMA ([`vm::console::is_iommu_fault`]) fails, whatever
//! the tests said: the driver let a device reach memory it never mapped. The one exception
//! proves that this check works: a test named `guest_expect_iommu_fault_*` runs alone in a boot
//! of its own (IOMMU mode only), writes to `/out/expect-iommu-fault` the text its fault line
//! must contain (e.g. `iova=0x4000000000`), makes a device DMA there, and its boot passes only
//! if QEMU reported that fault.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::build::{self, capi_flags, fio_engine, install_capi};
use crate::cli::TestArgs;
use crate::fuzz;
use crate::json;
use crate::mode::Mode;
use crate::setup::{self, Assets};
use crate::setup_qemu::{self, Qemu};
use crate::util::{err, random_u64, run, secs, stdout_of, Context, Result};
use crate::vm::{self, Boot, Outcome, DEFAULT_MODULES, EXIT_NO_CODE, EXIT_TIMEOUT};
use crate::Workspace;

/// The crate whose integration tests run in the guest.
const TEST_PACKAGE: &str = "vfpoll-tests";
/// Name prefix of the tests that run in the guest.
const GUEST_PREFIX: &str = "guest_";
/// Name prefix of the tests that check a boot's run dir on the host.
const HOST_CHECK_PREFIX: &str = "host_check_";
/// Name prefix of the guest tests that must make QEMU's vIOMMU report a fault (the proof that
/// the fault check works); each runs alone in its own boot, in IOMMU mode only.
const EXPECT_FAULT_PREFIX: &str = "guest_expect_iommu_fault_";
/// Where such a test writes, in the guest's `/out`, the text its fault line must contain.
const EXPECT_FAULT_FILE: &str = "expect-iommu-fault";
/// Test binaries that also boot the guest kernels other than the default (`--kernel`), in
/// rows of their own.
const OTHER_KERNEL_BINS: &[&str] = &["foundation", "nvme", "formats", "nvmf_auth"];
/// Test binaries that also boot in mode `iommufd`, on the kernels with iommufd (6.12), in rows
/// of their own.
const IOMMUFD_BINS: &[&str] = &["foundation", "nvme", "p2p", "store_p2p", "unprivileged", "nic"];
/// Test binaries whose boots get hot-pluggable NVMe controller R ([`Boot::hotplug`]).
const HOTPLUG_BINS: &[&str] = &["recovery_removal"];
/// Test binaries that also boot the emulators other than the host's QEMU 7.2 (`--qemu`), on
/// the default kernel, in rows of their own: the NVMe suites, whose device model changed most
/// (with p2p's DMA to a CMB and a peer BAR through the vIOMMU, and recovery_reset's controller
/// resets), and the harness's self-test, whose expected-fault boot proves that the vIOMMU fault
/// check every other row relies on ([`vm::console::is_iommu_fault`]) reads that emulator's messages.
/// Each is a short boot (12-50 s).
const OTHER_QEMU_BINS: &[&str] = &["nvme", "formats", "p2p", "recovery_reset", "xtask_selftest"];
/// Test binaries whose boots get 1 GiB hugepages and two NUMA nodes ([`vm::Machine`]).
const HUGE_1G_BINS: &[&str] = &["hugepages_1g"];
/// Guest memory, 1 GiB pages and NUMA nodes of a [`HUGE_1G_BINS`] boot: 4 pages in 8 GiB (4 GiB
/// per node). The kernel finds aligned free gigabytes for one page on node 0 (below 4 GiB the
/// PCI hole, above it the node's struct pages) and three on node 1; with 6 GiB, none on node 0.
const HUGE_1G_MACHINE: (&str, u32, u32) = ("8G", 4, 2);
/// Test binaries whose boots get the two big namespaces (NVMe controllers G and H,
/// [`vm::BIG_NS`]), with their size in MiB: the store's, which formats a store over both and
/// needs more than the fixed 64 MiB namespaces hold. The images are sparse: only what the
/// tests write takes host disk space.
const BIG_NS_BINS: &[(&str, u64)] = &[("store", 1024)];

/// `cargo xtask test`.
pub fn main(ws: &Workspace, a: &TestArgs) -> Result<u8> {
    let mut r = Report::default();
    let mut assets = Vec::new();
    if !a.host_only {
        // The default kernel's setup (host packages, fio's source) is needed whatever kernels run.
        let default = r.step("setup", || {
            let assets = setup::setup_kernel(ws, setup::DEFAULT_KERNEL)?;
            let note = format!("kernel {}", assets.kver);
            Ok((assets, note))
        });
        assets.extend(default.filter(|d| a.kernels.contains(&d.kernel)));
        for &k in a.kernels.iter().filter(|&&k| k != setup::DEFAULT_KERNEL) {
            let other = r.step(&format!("setup (kernel {})", k.name), || {
                let assets = setup::setup_kernel(ws, k)?;
                let note = format!("kernel {}", assets.kver);
                Ok((assets, note))
            });
            assets.extend(other);
        }
    }
    let mut qemus = Vec::new();
    if !a.host_only {
        for &e in &a.qemus {
            if e == setup_qemu::DEFAULT_EMULATOR {
                qemus.push(Qemu::host());
                continue;
            }
            let q = r.step(&format!("setup (qemu {})", e.name), || {
                let q = setup_qemu::setup_emulator(ws, e)?;
                let note = q.version()?;
                Ok((q, note))
            });
            qemus.extend(q);
        }
    }

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
    // Coverage-guided fuzzing of vfpoll-nvmf's wire parsers and vfpoll-store's on-disk parsers
    // for a bounded time (fuzz.rs).
    match fuzz::test_secs() {
        Ok(0) => r.record("fuzz", None, 0.0, format!("{}=0", fuzz::SECS_ENV)),
        Ok(secs) => {
            r.step("fuzz", || {
                fuzz::run_all(ws, &fuzz::FuzzArgs::test(secs)).map(|n| ((), n))
            });
        }
        Err(e) => r.record("fuzz", Some(false), 0.0, e.to_string()),
    }
    // libvfpoll's C examples, for the test bed's capi tests (tests/tests/capi.rs).
    r.step("C examples", || c_examples(ws).map(|n| ((), n)));
    // README.md and docs/*.md: command lines through the real parsers, C examples built
    // (docs.rs; the Rust examples are doctests of vfpoll-tests, run by `cargo test` above).
    r.step("docs", || crate::docs::check(ws).map(|n| ((), n)));
    // The Python package: wheel built with maturin, installed in target/python/venv, pytest
    // (python.rs).
    r.step("python", || crate::python::test(ws).map(|n| ((), n)));
    // vfpoll's fio engine, for the test bed's fio_engine tests (tests/tests/fio_engine.rs).
    r.step("fio engine", || {
        fio_engine(ws, "debug").map(|so| ((), so.display().to_string()))
    });

    if !assets.is_empty() && !qemus.is_empty() {
        test_bed(ws, a, &assets, &qemus, &mut r);
    }
    Ok(r.summary())
}

/// Builds libvfpoll (`cargo build -p vfpoll-capi`), installs it into `target/debug/capi` with
/// `capi/install.sh`, and compiles each `examples/c/*.c` with the system C compiler (`-Wall
/// -Wextra -Werror`) through the installed pkg-config file into `target/debug/vfpoll-c-<name>`
/// (on the guest's PATH), and again with `-fsanitize=address,undefined` into
/// `vfpoll-c-<name>-asan`.
fn c_examples(ws: &Workspace) -> Result<String> {
    let prefix = install_capi(ws, "debug")?;
    let pc = capi_flags(&prefix)?;
    let debug = ws.target.join("debug");
    let dir = ws.root.join("examples/c");
    let mut sources: Vec<PathBuf> = fs::read_dir(&dir)
        .context(format_args!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "c"))
        .collect();
    sources.sort();
    let asan: &[&str] = &["-fsanitize=address,undefined", "-fno-omit-frame-pointer"];
    for src in &sources {
        let name = src.file_stem().unwrap_or_default().to_string_lossy();
        for (suffix, extra) in [("", &[][..]), ("-asan", asan)] {
            run(Command::new("cc")
                .args(["-std=c11", "-O1", "-g", "-Wall", "-Wextra", "-Werror"])
                .args(extra)
                .arg(src)
                .args(pc.split_whitespace())
                .arg(format!("-Wl,-rpath,{}", prefix.join("lib").display()))
                .arg("-o")
                .arg(debug.join(format!("vfpoll-c-{name}{suffix}"))))?;
        }
    }
    Ok(format!("{} examples, plain and ASan/UBSan", sources.len()))
}

/// Part c: the guest boots and the host checks, on each kernel of `kernels` and emulator of
/// `qemus` (the default kernel on the host's QEMU runs every binary, another kernel
/// [`OTHER_KERNEL_BINS`] on the host's QEMU, another emulator [`OTHER_QEMU_BINS`] on the
/// default kernel).
fn test_bed(ws: &Workspace, a: &TestArgs, kernels: &[Assets], qemus: &[Qemu], r: &mut Report) {
    let Some(()) = r.step("cargo build --bins", || {
        build::build_bins(ws).map(|()| ((), String::new()))
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
        let (expect_fault, guest): (Vec<String>, Vec<String>) = selected(GUEST_PREFIX)
            .into_iter()
            .partition(|t| short_name(t).starts_with(EXPECT_FAULT_PREFIX));
        let host = selected(HOST_CHECK_PREFIX);
        if guest.is_empty() && expect_fault.is_empty() {
            eprintln!("test: {}: no {GUEST_PREFIX}* tests selected", bin.name);
            continue;
        }
        let name = bin.name.as_str();
        let machines = kernels
            .iter()
            .flat_map(|k| qemus.iter().map(move |q| (k, q)))
            .filter(|(k, q)| {
                let default_kernel = k.kernel == setup::DEFAULT_KERNEL;
                let host_qemu = q.emulator == setup_qemu::DEFAULT_EMULATOR;
                match (default_kernel, host_qemu) {
                    (true, true) => true,
                    (false, true) => OTHER_KERNEL_BINS.contains(&name) || IOMMUFD_BINS.contains(&name),
                    (true, false) => OTHER_QEMU_BINS.contains(&name),
                    (false, false) => false,
                }
            });
        for ((assets, qemu), &mode) in machines.flat_map(|kq| a.modes.iter().map(move |m| (kq, m))) {
            // Mode iommufd: IOMMUFD_BINS on a kernel with iommufd; other modes on another
            // kernel: OTHER_KERNEL_BINS.
            let row = match mode {
                Mode::Iommufd => assets.kernel.iommufd && IOMMUFD_BINS.contains(&name),
                _ => assets.kernel == setup::DEFAULT_KERNEL || OTHER_KERNEL_BINS.contains(&name),
            };
            if !row {
                continue;
            }
            if !guest.is_empty() {
                let job = Job {
                    guest: &guest,
                    host: &host,
                    faults: Faults::None,
                };
                run_pair(ws, a, (assets, qemu), r, bin, mode, job);
            }
            for t in &expect_fault {
                if mode == Mode::Iommu {
                    let job = Job {
                        guest: std::slice::from_ref(t),
                        host: &[],
                        faults: Faults::Expected,
                    };
                    run_pair(ws, a, (assets, qemu), r, bin, mode, job);
                } else {
                    let name = format!(
                        "guest {} {} ({}{})",
                        bin.name,
                        short_name(t),
                        mode.name(),
                        machine_tag(assets, qemu, ", ")
                    );
                    r.record(&name, None, 0.0, "IOMMU mode only: no vIOMMU, no fault".into());
                }
            }
        }
    }
}

/// The function name of a listed test (`module::name` -> `name`).
fn short_name(test: &str) -> &str {
    test.rsplit("::").next().unwrap_or(test)
}

/// What a boot expects of QEMU's vIOMMU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Faults {
    /// No fault: any fails the boot (every ordinary boot).
    None,
    /// A fault whose line contains what the test wrote to [`EXPECT_FAULT_FILE`].
    Expected,
}

/// The tests of one boot, and what it expects of the vIOMMU.
struct Job<'a> {
    /// `guest_*` tests, run in the guest.
    guest: &'a [String],
    /// `host_check_*` tests, run on the host after the boot.
    host: &'a [String],
    faults: Faults,
}

/// One boot of `bin` in `mode`, then its host checks.
fn run_pair(
    ws: &Workspace,
    a: &TestArgs,
    (assets, qemu): (&Assets, &Qemu),
    r: &mut Report,
    bin: &TestBin,
    mode: Mode,
    job: Job,
) {
    let Job { guest, host, faults } = job;
    // An expected-fault boot is named after its one test; a kernel other than the default
    // is named in the row and the run dir.
    let (kl, kd) = (machine_tag(assets, qemu, ", "), machine_tag(assets, qemu, "-"));
    let (label, dir_name) = match faults {
        Faults::None => (
            format!("{} ({}{kl})", bin.name, mode.name()),
            format!("{}-{}{kd}", bin.name, mode.name()),
        ),
        Faults::Expected => {
            let t = short_name(&guest[0]);
            // The run dir drops the common prefix, to keep paths short (a QMP socket path
            // longer than a UNIX socket address moves to the temp dir: qmp::socket_path).
            let short = t.strip_prefix(EXPECT_FAULT_PREFIX).unwrap_or(t);
            (
                format!("{} {t} ({}{kl})", bin.name, mode.name()),
                format!("{}-fault-{short}-{}{kd}", bin.name, mode.name()),
            )
        }
    };
    let seed = match random_u64() {
        Ok(s) => s.to_string(),
        Err(e) => {
            r.record(&format!("guest {label}"), Some(false), 0.0, e.to_string());
            return;
        }
    };
    let run_dir = vm::default_run_dir(ws, &dir_name);
    let pkg_dir = ws.root.join("tests");
    let mut command: Vec<OsString> = vec![
        bin.exe.clone().into(),
        "--ignored".into(),
        "--test-threads=1".into(),
        "--exact".into(),
    ];
    command.extend(guest.iter().map(OsString::from));
    let huge_1g = HUGE_1G_BINS.contains(&bin.name.as_str());
    let boot = Boot {
        mode,
        timeout: a.timeout,
        mem: if huge_1g { HUGE_1G_MACHINE.0 } else { "2G" }.into(),
        smp: 2,
        modules: DEFAULT_MODULES.iter().map(|m| m.to_string()).collect(),
        hugepages: 0,
        run_dir: run_dir.clone(),
        keep_run_dir: false,
        verbose: a.verbose,
        cwd: pkg_dir.clone(),
        env: vec![("VFPOLL_SEED".into(), seed.clone().into())],
        command,
        hotplug: HOTPLUG_BINS.contains(&bin.name.as_str()),
        machine: vm::Machine {
            qemu: qemu.clone(),
            hugepages_1g: if huge_1g { HUGE_1G_MACHINE.1 } else { 0 },
            numa_nodes: if huge_1g { HUGE_1G_MACHINE.2 } else { 1 },
            big_ns_mib: BIG_NS_BINS
                .iter()
                .find(|(b, _)| *b == bin.name)
                .map_or(0, |&(_, mib)| mib),
        },
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
        let mut out = vm::run_boot(ws, assets, &boot, &lock)?;
        // QEMU 7.2 itself crashes now and then (SIGSEGV seen during a controller reset and
        // during CMB DMA under the vIOMMU), and under TCG a guest kernel can die while it boots
        // (6.12 hit an int3 Oops in code that was being live-patched, seconds before the job
        // would start): such a boot says nothing about the code under test, so it runs once
        // more, and the row says so. One with a vIOMMU fault, or a second one, fails.
        let mut again = None;
        if out.code == vm::EXIT_NO_CODE && out.iommu_faults.is_empty() {
            let why = if let Some(sig) = out.qemu_signal {
                Some(format!("QEMU died of signal {sig}"))
            } else if out.boot.is_none()
                && fs::read_to_string(run_dir.join("console.log")).is_ok_and(|c| c.contains("Kernel panic"))
            {
                Some("the guest kernel panicked before the job started".to_string())
            } else {
                None
            };
            if let Some(why) = why {
                eprintln!("test: {label}: {why} (not the code under test): booting once more");
                out = vm::run_boot(ws, assets, &boot, &lock)?;
                again = Some(why);
            }
        }
        let marker = match faults {
            Faults::None => None,
            Faults::Expected => fs::read_to_string(run_dir.join("out").join(EXPECT_FAULT_FILE))
                .ok()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty()),
        };
        let note = verdict(&out, a.timeout, faults, marker.as_deref(), &run_dir)?;
        let again = again.map_or(String::new(), |why| {
            format!(" (on a second boot: {why} in the first)")
        });
        Ok(((), format!("{} tests; {note}{again}", guest.len())))
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

/// `<sep><kernel name>` for a kernel other than the default and `<sep>qemu<name>` for an
/// emulator other than the host's, empty for the defaults (whose rows and run dirs keep their
/// names): `, 6.12`, `, qemu 10` in rows, `-6.12`, `-qemu10` in run dirs.
fn machine_tag(assets: &Assets, qemu: &Qemu, sep: &str) -> String {
    let mut t = String::new();
    if assets.kernel != setup::DEFAULT_KERNEL {
        t.push_str(&format!("{sep}{}", assets.kernel.name));
    }
    if qemu.emulator != setup_qemu::DEFAULT_EMULATOR {
        let space = if sep.contains(' ') { " " } else { "" };
        t.push_str(&format!("{sep}qemu{space}{}", qemu.emulator.name));
    }
    t
}

/// What a boot's outcome means: the note of a pass, or why it failed. `marker` is what an
/// expected-fault test wrote to [`EXPECT_FAULT_FILE`].
fn verdict(
    out: &Outcome,
    timeout: Duration,
    faults: Faults,
    marker: Option<&str>,
    run_dir: &Path,
) -> Result<String> {
    let code = match out.code {
        0 => None,
        EXIT_TIMEOUT => Some(format!("timeout after {} s", timeout.as_secs())),
        EXIT_NO_CODE => Some(match &out.qemu_error {
            Some(e) => format!("QEMU exited before the guest ran the job: {e}"),
            None => "the guest reported no exit code".to_string(),
        }),
        c => Some(format!("guest exit code {c}")),
    };
    let report = || vm::fault_report(&out.iommu_faults, &run_dir.join(vm::IOMMU_FAULTS_FILE));
    let started = format!("job started after {}", out.boot.map_or("-".into(), secs));
    match faults {
        Faults::None => match (code, out.iommu_faults.is_empty()) {
            (None, true) => Ok(started),
            (Some(c), true) => Err(err!("{c}")),
            (None, false) => Err(err!("{}", report())),
            (Some(c), false) => Err(err!("{c}; {}", report())),
        },
        Faults::Expected => {
            if let Some(c) = code {
                return Err(err!("{c}"));
            }
            let Some(m) = marker else {
                return Err(err!(
                    "the test wrote nothing to /out/{EXPECT_FAULT_FILE}: a {EXPECT_FAULT_PREFIX}* \
                     test writes there the text its fault line will contain (e.g. \
                     iova=0x4000000000) before it makes the device DMA"
                ));
            };
            if out.iommu_faults.is_empty() {
                return Err(err!(
                    "the test made a device DMA to an unmapped address ({m}), but no vIOMMU \
                     fault was seen in QEMU's stderr: the fault check every boot relies on \
                     (vm::is_iommu_fault) is broken, or QEMU's messages changed; see {}",
                    run_dir.display()
                ));
            }
            match out.iommu_faults.iter().find(|l| l.contains(m)) {
                Some(l) => Ok(format!("{started}; the expected vIOMMU fault: {l}")),
                None => Err(err!("no vIOMMU fault with {m:?}, but others: {}", report())),
            }
        }
    }
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
    let mut cmd = build::cargo(ws);
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
            let status = build::cargo(ws).args(args).envs(env.iter().copied()).status()?;
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

#[cfg(test)]
mod tests {
    use super::*;

    const FAULT: &str = "qemu-system-x86_64: vtd_iommu_translate: detected translation failure \
                         (dev=00:04:00, iova=0x4000000000)";

    fn outcome(code: u8, faults: &[&str]) -> Outcome {
        Outcome {
            code,
            boot: Some(Duration::from_secs(5)),
            iommu_faults: faults.iter().map(|s| s.to_string()).collect(),
            qemu_signal: None,
            qemu_error: None,
        }
    }

    fn judge(out: &Outcome, faults: Faults, marker: Option<&str>) -> std::result::Result<String, String> {
        verdict(out, Duration::from_secs(900), faults, marker, Path::new("/run/x")).map_err(|e| e.to_string())
    }

    #[test]
    fn qemu_that_refused_to_start_is_named_as_the_cause() {
        let mut out = outcome(vm::EXIT_NO_CODE, &[]);
        out.boot = None;
        let e = judge(&out, Faults::None, None).unwrap_err();
        assert_eq!(e, "the guest reported no exit code");
        out.qemu_error = Some("qemu-system-x86_64: -qmp unix:/long: UNIX socket path too long".into());
        let e = judge(&out, Faults::Expected, Some("iova=0x1")).unwrap_err();
        assert!(
            e.starts_with("QEMU exited before the guest ran the job: qemu-system"),
            "{e}"
        );
    }

    #[test]
    fn an_ordinary_boot_fails_on_any_iommu_fault() {
        assert!(judge(&outcome(0, &[]), Faults::None, None).is_ok());
        let e = judge(&outcome(0, &[FAULT]), Faults::None, None).unwrap_err();
        assert!(e.contains("never mapped") && e.contains(FAULT), "{e}");
        assert!(e.contains("/run/x/iommu-faults.txt"), "{e}");
        let e = judge(&outcome(101, &[FAULT]), Faults::None, None).unwrap_err();
        assert!(e.starts_with("guest exit code 101; ") && e.contains(FAULT), "{e}");
        let e = judge(&outcome(EXIT_TIMEOUT, &[]), Faults::None, None).unwrap_err();
        assert_eq!(e, "timeout after 900 s");
    }

    #[test]
    fn an_expected_fault_boot_needs_that_very_fault() {
        let m = Some("iova=0x4000000000");
        let ok = judge(&outcome(0, &[FAULT]), Faults::Expected, m).unwrap();
        assert!(
            ok.contains("the expected vIOMMU fault") && ok.contains(FAULT),
            "{ok}"
        );
        // The detector saw nothing: this is what catches a broken fault check.
        let e = judge(&outcome(0, &[]), Faults::Expected, m).unwrap_err();
        assert!(
            e.contains("no vIOMMU fault was seen") && e.contains("broken"),
            "{e}"
        );
        // A fault elsewhere is not the one the test provoked.
        let other = FAULT.replace("0x4000000000", "0x1000");
        let e = judge(&outcome(0, &[&other]), Faults::Expected, m).unwrap_err();
        assert!(e.contains("no vIOMMU fault with") && e.contains(&other), "{e}");
        // The test must say what it provoked, and must itself pass.
        let e = judge(&outcome(0, &[FAULT]), Faults::Expected, None).unwrap_err();
        assert!(e.contains(EXPECT_FAULT_FILE), "{e}");
        let e = judge(&outcome(101, &[FAULT]), Faults::Expected, m).unwrap_err();
        assert_eq!(e, "guest exit code 101");
    }

    #[test]
    fn test_names() {
        assert_eq!(short_name("a::b::guest_x"), "guest_x");
        assert_eq!(short_name("guest_x"), "guest_x");
        assert!(short_name("m::guest_expect_iommu_fault_nvme").starts_with(EXPECT_FAULT_PREFIX));
        assert!(EXPECT_FAULT_PREFIX.starts_with(GUEST_PREFIX));
    }
}
