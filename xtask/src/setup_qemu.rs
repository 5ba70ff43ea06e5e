//! A second emulator: QEMU 10.0 from Debian 12's `bookworm-backports`, side by side with the
//! host's QEMU 7.2 (`cargo xtask vm --qemu 10`, `cargo xtask test --qemu 7.2,10`).
//!
//! Nothing is installed on the host: `apt-get download` fetches `qemu-system-x86` and the
//! packages it needs at run time from backports (`qemu-system-common`, `qemu-system-data` with
//! the option ROMs a `-kernel` boot loads, `pvh.bin` and `linuxboot_dma.bin`, and `seabios`,
//! whose `bios-256k.bin` QEMU 10 needs at 1.16.3 or newer where bookworm has 1.16.2), and
//! `dpkg -x` unpacks them under `target/testbed/qemu-<version>/root`. Shared libraries whose
//! host version is older than the binary's `Depends` ask for (or that are not installed at all)
//! are unpacked there as well and found through `LD_LIBRARY_PATH`; `ldd` must then resolve
//! everything. The NICs' iPXE ROMs are not needed: the test bed passes `romfile=`.
//!
//! The unpacked QEMU must not see the host's 7.2 files: it runs with `-L` naming its own data
//! directories first (BIOS, option ROMs, keymaps) and `QEMU_MODULE_DIR` naming its own modules
//! (7.2's refuse to load into 10 with an assertion failure, even for `-device help`).

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::apt::Apt;
use crate::util::{err, mkdir, read_opt, run_quiet, stdout_of, step, write, Context, Lock, Note, Result};
use crate::Workspace;

/// The host's emulator binary (Debian 12's QEMU 7.2), found on `PATH`.
const HOST_BINARY: &str = "qemu-system-x86_64";

/// Backports packages unpacked for QEMU 10, besides the shared libraries [`missing_libraries`]
/// finds.
/// `qemu-system-modules-opengl` and `-spice` hold `ui-opengl.so` and `ui-spice-core.so`, which
/// QEMU 10 loads at every start (display and SPICE set-up, even with `-display none`): without
/// its own it finds 7.2's in the compiled-in module directory, which it also searches, and
/// complains ("Only modules from the same build can be loaded", "undefined symbol").
const PACKAGES: &[&str] = &[
    "qemu-system-x86",
    "qemu-system-common",
    "qemu-system-data",
    "qemu-system-modules-opengl",
    "qemu-system-modules-spice",
    "seabios",
];

/// An emulator the test bed can run (`--qemu NAME`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Emulator {
    /// The name `--qemu` takes, e.g. `10`.
    pub name: &'static str,
    /// `None`: the host's `qemu-system-x86_64`; `Some(prefix)`: `qemu-system-x86` from
    /// `<codename>-backports`, whose upstream version must start with `prefix`.
    backports: Option<&'static str>,
}

/// The host's QEMU 7.2: what every command runs unless told otherwise.
pub const DEFAULT_EMULATOR: Emulator = Emulator {
    name: "7.2",
    backports: None,
};

/// QEMU 10.0 from `bookworm-backports`.
pub const QEMU_10: Emulator = Emulator {
    name: "10",
    backports: Some("10."),
};

/// Every emulator, the default first.
pub const EMULATORS: &[Emulator] = &[DEFAULT_EMULATOR, QEMU_10];

impl Default for Emulator {
    fn default() -> Self {
        DEFAULT_EMULATOR
    }
}

/// The emulator `--qemu NAME` names (`7.2`, `10`; `10.0` is taken for `10`).
pub fn emulator_by_name(name: &str) -> Result<Emulator> {
    let name = name
        .strip_suffix(".0")
        .filter(|n| !n.contains('.'))
        .unwrap_or(name);
    EMULATORS.iter().copied().find(|e| e.name == name).ok_or_else(|| {
        let names: Vec<&str> = EMULATORS.iter().map(|e| e.name).collect();
        err!(
            "unknown emulator {name:?}: use one of {} (or all)",
            names.join(", ")
        )
    })
}

/// A comma-separated list of emulators, or `all`.
pub fn emulators_by_names(list: &str) -> Result<Vec<Emulator>> {
    if list == "all" {
        return Ok(EMULATORS.to_vec());
    }
    let mut v = Vec::new();
    for n in list.split(',').filter(|n| !n.is_empty()) {
        let e = emulator_by_name(n)?;
        if !v.contains(&e) {
            v.push(e);
        }
    }
    if v.is_empty() {
        return Err(err!("--qemu needs at least one emulator"));
    }
    Ok(v)
}

/// An emulator ready to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Qemu {
    /// Which one.
    pub emulator: Emulator,
    /// The `qemu-system-x86_64` to run.
    pub binary: PathBuf,
    /// `-L` directories, searched before the compiled-in ones (empty for the host's QEMU).
    pub data_dirs: Vec<PathBuf>,
    /// Variables its process needs (`QEMU_MODULE_DIR`, `LD_LIBRARY_PATH`).
    pub env: Vec<(OsString, OsString)>,
}

impl Default for Qemu {
    fn default() -> Self {
        Qemu::host()
    }
}

impl Qemu {
    /// The host's QEMU 7.2.
    pub fn host() -> Qemu {
        Qemu {
            emulator: DEFAULT_EMULATOR,
            binary: HOST_BINARY.into(),
            data_dirs: Vec::new(),
            env: Vec::new(),
        }
    }

    /// The unpacked QEMU under `root` (a `dpkg -x` target).
    fn unpacked(emulator: Emulator, root: &Path) -> Qemu {
        let libs = [
            root.join("usr/lib/x86_64-linux-gnu"),
            root.join("lib/x86_64-linux-gnu"),
        ];
        // Only its own libraries: not the caller's (cargo's target/debug/deps, ...).
        let ld_path = std::env::join_paths(libs.iter().filter(|d| d.is_dir())).unwrap_or_default();
        Qemu {
            emulator,
            binary: root.join("usr/bin").join(HOST_BINARY),
            data_dirs: vec![root.join("usr/share/qemu"), root.join("usr/share/seabios")],
            env: vec![
                (
                    "QEMU_MODULE_DIR".into(),
                    root.join("usr/lib/x86_64-linux-gnu/qemu").into(),
                ),
                ("LD_LIBRARY_PATH".into(), ld_path),
            ],
        }
    }

    /// A command running this QEMU, with its environment and `-L` directories.
    pub fn command(&self) -> Command {
        let mut c = Command::new(&self.binary);
        c.envs(self.env.iter().map(|(k, v)| (k, v)));
        for d in &self.data_dirs {
            c.arg("-L").arg(d);
        }
        c
    }

    /// `QEMU emulator version 10.0.2 (...)` -> `10.0.2`.
    pub fn version(&self) -> Result<String> {
        let out = stdout_of(self.command().arg("--version"))
            .context(format_args!("{} --version", self.binary.display()))?;
        out.lines()
            .next()
            .and_then(|l| l.strip_prefix("QEMU emulator version "))
            .and_then(|v| v.split_whitespace().next())
            .map(str::to_string)
            .ok_or_else(|| err!("{} --version said {out:?}", self.binary.display()))
    }
}

/// `dpkg -x deb into`.
fn dpkg_x(deb: &Path, into: &Path) -> Result<()> {
    run_quiet(Command::new("dpkg").arg("-x").arg(deb).arg(into)).map(|_| ())
}

/// `target/testbed/current-qemu-<name>`: the directory name of the unpacked emulator.
fn current_file(ws: &Workspace, e: Emulator) -> PathBuf {
    ws.testbed().join(format!("current-qemu-{}", e.name))
}

/// The directory of the unpacked emulator whose Debian version is `version`.
fn qemu_dir(ws: &Workspace, version: &str) -> PathBuf {
    ws.testbed().join(format!("qemu-{}", upstream(version)))
}

/// `1:10.0.2+ds-2+deb13u1~bpo12+1` -> `10.0.2`.
fn upstream(version: &str) -> &str {
    let v = version.split_once(':').map_or(version, |(_, v)| v);
    v.split(['+', '-', '~']).next().unwrap_or(v)
}

/// `cargo xtask setup`'s part: every emulator besides the host's, one line per step.
pub fn setup(ws: &Workspace) -> Result<()> {
    for &e in &EMULATORS[1..] {
        setup_emulator(ws, e)?;
    }
    Ok(())
}

/// Fetches and checks emulator `e` (nothing to fetch for the host's).
pub fn setup_emulator(ws: &Workspace, e: Emulator) -> Result<Qemu> {
    let Some(prefix) = e.backports else {
        return Ok(Qemu::host());
    };
    let _lock = Lock::acquire(&mkdir(ws.testbed())?.join("setup-qemu.lock"))?;
    let p = &format!("setup qemu {}", e.name);
    let mut apt = Apt::default();
    let mut suite = String::new();
    let version = step(p, "qemu version", || {
        suite = apt.ensure_backports()?;
        let v = candidate(&mut apt, "qemu-system-x86", &suite)?;
        if !upstream(&v).starts_with(prefix) {
            return Err(err!(
                "{suite} carries qemu-system-x86 {v}, not QEMU {}: the test bed's --qemu {} \
                 expects {prefix}x",
                e.name,
                e.name
            ));
        }
        Ok((v.clone(), Note::Text(v)))
    })?;
    let dir = qemu_dir(ws, &version);
    let root = dir.join("root");
    let done = dir.join("done");
    // What was unpacked: the version and the package list.
    let stamp = format!("{version} {}", PACKAGES.join(" "));
    step(p, "packages", || {
        if read_opt(&done).as_deref() == Some(&stamp) {
            return Ok(((), Note::Cached));
        }
        let _ = fs::remove_dir_all(&dir);
        let debs = mkdir(dir.join("debs"))?;
        let mut pkgs = Vec::new();
        for pkg in PACKAGES {
            pkgs.push(format!("{pkg}={}", candidate(&mut apt, pkg, &suite)?));
        }
        let files = apt.download(&debs, &pkgs)?;
        for f in &files {
            dpkg_x(f, &root)?;
        }
        // Libraries the host lacks or has too old, from the packages' own Depends.
        let mut libs = Vec::new();
        for f in &files {
            let depends = stdout_of(Command::new("dpkg-deb").args(["-f"]).arg(f).arg("Depends"))?;
            libs.extend(missing_libraries(&depends, |p| {
                apt.installed_version(p).ok().flatten()
            })?);
        }
        libs.sort();
        libs.dedup();
        let mut lib_pkgs = Vec::new();
        for (lib, need) in &libs {
            let v = candidate(&mut apt, lib, &suite)
                .ok()
                .filter(|v| satisfies(v, need))
                .or_else(|| candidate(&mut apt, lib, "").ok().filter(|v| satisfies(v, need)))
                .ok_or_else(|| {
                    err!("QEMU {version} needs {lib} {need}, which neither the host nor apt has")
                })?;
            lib_pkgs.push(format!("{lib}={v}"));
        }
        for f in &apt.download(&debs, &lib_pkgs)? {
            dpkg_x(f, &root)?;
        }
        fs::remove_dir_all(&debs)?;
        write(&done, &stamp)?;
        let note = match lib_pkgs.len() {
            0 => format!("{} packages", pkgs.len()),
            _ => format!("{} packages, libraries {}", pkgs.len(), lib_pkgs.join(" ")),
        };
        Ok(((), Note::Text(note)))
    })?;
    let q = Qemu::unpacked(e, &root);
    step(p, "libraries (ldd)", || check_ldd(&q).map(|()| ((), Note::None)))?;
    let v = step(p, "qemu --version", || {
        let v = q.version()?;
        Ok((v.clone(), Note::Text(v)))
    })?;
    if !v.starts_with(prefix) {
        return Err(err!("{} says it is QEMU {v}, not {prefix}x", q.binary.display()));
    }
    step(p, "drive options", || check_drive_options(ws, &q))?;
    write(
        &current_file(ws, e),
        dir.file_name().unwrap_or_default().as_encoded_bytes(),
    )?;
    Ok(q)
}

/// Emulator `e` as the last setup left it, set up first when it is missing.
pub fn ensure(ws: &Workspace, e: Emulator) -> Result<Qemu> {
    match current(ws, e) {
        Ok(q) if e.backports.is_none() || q.binary.is_file() => Ok(q),
        _ => {
            eprintln!("vm: QEMU {} is not set up yet, fetching it", e.name);
            setup_emulator(ws, e)
        }
    }
}

/// Emulator `e` as the last setup left it, without fetching anything (for `--print-cmd`).
pub fn current(ws: &Workspace, e: Emulator) -> Result<Qemu> {
    if e.backports.is_none() {
        return Ok(Qemu::host());
    }
    let name = read_opt(&current_file(ws, e))
        .ok_or_else(|| err!("QEMU {} is not set up yet: run `cargo xtask setup`", e.name))?;
    let root = ws.testbed().join(name.trim()).join("root");
    Ok(Qemu::unpacked(e, &root))
}

/// The version of `pkg` apt would take from `suite` (its default candidate when `suite` is
/// empty).
fn candidate(apt: &mut Apt, pkg: &str, suite: &str) -> Result<String> {
    let target = if suite.is_empty() {
        pkg.to_string()
    } else {
        format!("{pkg}/{suite}")
    };
    let version = |apt: &mut Apt| -> Result<Option<String>> {
        // The first record is the candidate of that release.
        Ok(apt
            .show(&target)?
            .lines()
            .find_map(|l| l.strip_prefix("Version:"))
            .map(|v| v.trim().to_string()))
    };
    if let Some(v) = version(apt)? {
        return Ok(v);
    }
    if apt.update()? {
        if let Some(v) = version(apt)? {
            return Ok(v);
        }
    }
    Err(err!("apt knows no {target} (is {suite} in apt's sources?)"))
}

/// Whether Debian version `have` meets `need`, e.g. `>= 2.3` (empty: any version).
fn satisfies(have: &str, need: &str) -> bool {
    let Some((op, v)) = need.split_once(' ') else {
        return true;
    };
    let op = match op {
        ">=" => "ge",
        "<=" => "le",
        ">>" => "gt",
        "<<" => "lt",
        "=" => "eq",
        _ => return false,
    };
    Command::new("dpkg")
        .args(["--compare-versions", have, op, v.trim()])
        .status()
        .is_ok_and(|s| s.success())
}

/// From a package's `Depends`: the shared-library packages (`lib*`, `zlib1g`) the host lacks
/// or has older than asked, with what is asked (`>= 2.3`, or empty). Other dependencies (the
/// QEMU packages themselves, firmware) are fetched as [`PACKAGES`] or not needed.
fn missing_libraries(
    depends: &str,
    mut installed: impl FnMut(&str) -> Option<String>,
) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for dep in depends.split(',') {
        // Alternatives (`a | b`): the first one is taken.
        let dep = dep.split('|').next().unwrap_or(dep).trim();
        let (name, need) = match dep.split_once('(') {
            Some((n, rest)) => (n.trim(), rest.trim_end_matches(')').trim()),
            None => (dep, ""),
        };
        let name = name.split(':').next().unwrap_or(name);
        if !(name.starts_with("lib") || name == "zlib1g") {
            continue;
        }
        let ok = installed(name).is_some_and(|have| satisfies(&have, need));
        if !ok {
            out.push((name.to_string(), need.to_string()));
        }
    }
    Ok(out)
}

/// `ldd` on the binary, with its `LD_LIBRARY_PATH`: every library found, every symbol version
/// there.
fn check_ldd(q: &Qemu) -> Result<()> {
    let mut c = Command::new("ldd");
    c.arg(&q.binary).envs(q.env.iter().map(|(k, v)| (k, v)));
    let text = stdout_of(&mut c)?;
    let bad: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("not found"))
        .map(str::trim)
        .collect();
    if bad.is_empty() {
        return Ok(());
    }
    Err(err!(
        "{} needs libraries the host lacks and that setup did not unpack: {}",
        q.binary.display(),
        bad.join("; ")
    ))
}

/// QEMU `q` starts a q35 machine quietly (no module of another build tried) and takes the drive
/// options the test bed's images use (`target/testbed/drive-options`, which setup found with the
/// host's QEMU).
fn check_drive_options(ws: &Workspace, q: &Qemu) -> Result<((), Note)> {
    let Some(opts) = read_opt(&ws.testbed().join("drive-options")) else {
        return Ok(((), Note::Text("no drive-options yet".into())));
    };
    let opts = opts.trim().to_string();
    let dir = mkdir(ws.testbed().join("run"))?;
    let img = dir.join(format!("probe-qemu-{}.img", q.emulator.name));
    fs::File::create(&img)?.set_len(1 << 20)?;
    let mut c = q.command();
    c.args([
        "-machine",
        "q35",
        "-accel",
        "tcg",
        "-nodefaults",
        "-display",
        "none",
        "-monitor",
        "none",
    ])
    .args(["-drive"])
    .arg(format!("file={},if=none,id=d0,format=raw,{opts}", img.display()))
    .args(["-S", "-qmp", "stdio"]);
    // QMP on stdin: the greeting, then quit. A rejected option ends QEMU before that.
    c.stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = c.spawn().context(q.binary.display())?;
    if let Some(mut stdin) = child.stdin.take() {
        use std::io::Write;
        let _ = stdin.write_all(b"{\"execute\":\"qmp_capabilities\"}\n{\"execute\":\"quit\"}\n");
    }
    let out = child.wait_with_output()?;
    fs::remove_file(&img)?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(err!(
            "QEMU {} refuses the test bed's drive options {opts:?}: {}",
            q.emulator.name,
            stderr.trim()
        ));
    }
    if stderr.contains("module") {
        return Err(err!(
            "QEMU {} loads modules that are not its own (a package of its build is missing \
             from setup_qemu::PACKAGES): {}",
            q.emulator.name,
            stderr.trim()
        ));
    }
    Ok(((), Note::Text(opts)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(emulator_by_name("10").unwrap(), QEMU_10);
        assert_eq!(emulator_by_name("10.0").unwrap(), QEMU_10);
        assert_eq!(emulator_by_name("7.2").unwrap(), DEFAULT_EMULATOR);
        assert!(emulator_by_name("9").is_err());
        assert_eq!(emulators_by_names("7.2,10").unwrap(), EMULATORS);
        assert_eq!(emulators_by_names("10,10").unwrap(), [QEMU_10]);
        assert_eq!(emulators_by_names("all").unwrap(), EMULATORS);
        assert!(emulators_by_names(",").is_err());
    }

    #[test]
    fn upstream_versions() {
        assert_eq!(upstream("1:10.0.2+ds-2+deb13u1~bpo12+1"), "10.0.2");
        assert_eq!(upstream("1.16.3-2~bpo12+1"), "1.16.3");
        assert_eq!(upstream("7.2"), "7.2");
    }

    #[test]
    fn libraries_the_host_lacks_or_has_too_old() {
        let host = |p: &str| match p {
            "liburing2" => Some("2.3-3".to_string()),
            "libc6" => Some("2.36-9+deb12u10".to_string()),
            "libfdt1" => Some("1.6.1-4+b1".to_string()),
            _ => None,
        };
        let deps = "libaio1 (>= 0.3.93), libc6 (>= 2.34), liburing2 (>= 2.5), \
                    libfdt1 (>= 1.6.1), qemu-system-common (= 1:10.0.2), seabios (>> 1.16.3-1~), \
                    libpmem1 | libpmem2, zlib1g (>= 1:1.2.0)";
        let got = missing_libraries(deps, host).unwrap();
        assert_eq!(
            got,
            [
                ("libaio1".to_string(), ">= 0.3.93".to_string()),
                ("liburing2".to_string(), ">= 2.5".to_string()),
                ("libpmem1".to_string(), String::new()),
                ("zlib1g".to_string(), ">= 1:1.2.0".to_string()),
            ]
        );
        assert!(satisfies("2.3-3", ">= 2.3"));
        assert!(!satisfies("2.3-3", ">= 2.5"));
        assert!(satisfies("anything", ""));
    }
}
