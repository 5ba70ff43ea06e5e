//! The apt logic against a fake that answers as Debian 12's apt (2.6) does. Each answer below
//! was read off a Debian 12 machine: exit codes, and the messages on stderr.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::{Answer, Apt, System, DEB_SRC_FILE};
use crate::util::Result;

/// apt's answer when its sources hold no `deb-src` line, or hold one whose lists were never
/// fetched (`apt-cache showsrc`, `apt-get source`).
const NO_DEB_SRC: &str = "E: You must put some 'deb-src' URIs in your sources.list\n";

/// Debian 12's apt and dpkg, in memory.
struct Debian12 {
    /// Sources files setup wrote, by path.
    written: BTreeMap<PathBuf, String>,
    /// Whether the fetched lists include `deb-src` ones (after an update with such a file).
    src_lists: bool,
    /// Binary packages of the release's main component, with their versions.
    archive: BTreeMap<&'static str, &'static str>,
    /// Source packages the `deb-src` lists carry.
    sources: BTreeMap<&'static str, &'static str>,
    installed: BTreeSet<String>,
    /// Every command, as `prog arg arg`.
    calls: Vec<String>,
    /// A failure to give instead of any `apt-cache showsrc` answer.
    showsrc_fails: Option<Answer>,
}

impl Debian12 {
    /// A fresh image: `deb` lines only, fio not installed.
    fn fresh() -> Self {
        Debian12 {
            written: BTreeMap::new(),
            src_lists: false,
            archive: [
                ("fio", "3.33-3"),
                ("dpkg-dev", "1.21.22"),
                ("nvme-cli", "2.4+really2.3-3"),
            ]
            .into_iter()
            .collect(),
            sources: [("fio", "3.33-3")].into_iter().collect(),
            installed: ["dpkg-dev".to_string()].into_iter().collect(),
            calls: Vec::new(),
            showsrc_fails: None,
        }
    }

    fn code(code: i32, stdout: &str, stderr: &str) -> Answer {
        Answer {
            code: Some(code),
            stdout: stdout.into(),
            stderr: stderr.into(),
        }
    }

    fn updates(&self) -> usize {
        self.calls.iter().filter(|c| *c == "apt-get update -q").count()
    }
}

impl System for Debian12 {
    fn run(&mut self, prog: &str, args: &[&str], _dir: Option<&Path>) -> Result<Answer> {
        self.calls.push(
            std::iter::once(prog)
                .chain(args.iter().copied())
                .collect::<Vec<_>>()
                .join(" "),
        );
        let no_src = || Self::code(100, "", NO_DEB_SRC);
        Ok(match (prog, args) {
            ("apt-get", ["update", "-q"]) => {
                self.src_lists = self.written.values().any(|t| t.contains("Types: deb-src"));
                Self::code(0, "Reading package lists...\n", "")
            }
            ("apt-cache", ["showsrc", pkg]) => {
                if let Some(a) = &self.showsrc_fails {
                    return Ok(a.clone());
                }
                if !self.src_lists {
                    return Ok(no_src());
                }
                match self.sources.get(pkg) {
                    Some(v) => Self::code(0, &format!("Package: {pkg}\nBinary: {pkg}\nVersion: {v}\n\n"), ""),
                    None => Self::code(0, "", &format!("W: Unable to locate package {pkg}\n")),
                }
            }
            ("apt-get", ["source", "-q", spec]) => {
                let pkg = spec.split('=').next().unwrap_or(spec);
                match (self.src_lists, self.sources.contains_key(pkg)) {
                    (false, _) => no_src(),
                    (true, true) => Self::code(0, "", ""),
                    (true, false) => Self::code(
                        100,
                        "",
                        &format!("E: Unable to find a source package for {pkg}\n"),
                    ),
                }
            }
            ("apt-get", ["install", "-y", "-q", "--no-install-recommends", pkgs @ ..]) => {
                let head =
                    "Reading package lists...\nBuilding dependency tree...\nReading state information...\n";
                if let Some(p) = pkgs.iter().find(|p| !self.archive.contains_key(*p)) {
                    return Ok(Self::code(
                        100,
                        head,
                        &format!("E: Unable to locate package {p}\n"),
                    ));
                }
                self.installed.extend(pkgs.iter().map(|p| p.to_string()));
                Self::code(0, head, "")
            }
            ("dpkg-query", ["-W", "-f", "${db:Status-Status} ${Version}", pkg]) => {
                match (self.installed.contains(*pkg), self.archive.get(pkg)) {
                    (true, Some(v)) => Self::code(0, &format!("installed {v}"), ""),
                    _ => Self::code(1, "", &format!("dpkg-query: no packages found matching {pkg}\n")),
                }
            }
            ("dpkg-query", ["-W", "-f", _, pkgs @ ..]) => {
                let mut out = String::new();
                let mut err = String::new();
                for p in pkgs {
                    if self.installed.contains(*p) {
                        out += &format!("{p} installed\n");
                    } else {
                        err += &format!("dpkg-query: no packages found matching {p}\n");
                    }
                }
                Self::code(if err.is_empty() { 0 } else { 1 }, &out, &err)
            }
            ("apt-cache", ["depends", pkg]) => match self.archive.get(pkg) {
                Some(_) => Self::code(0, &format!("{pkg}\n  Depends: libc6\n"), ""),
                None => Self::code(100, "", "E: No packages found\n"),
            },
            _ => panic!("the fake does not know {prog} {args:?}"),
        })
    }

    fn write_sources(&mut self, path: &Path, text: &str) -> Result<()> {
        self.written.insert(path.to_path_buf(), text.to_string());
        Ok(())
    }

    fn codename(&mut self) -> Result<String> {
        Ok("bookworm".into())
    }
}

#[test]
fn fresh_machine_gets_deb_src_lines() {
    let mut apt = Apt::with(Debian12::fresh());
    apt.ensure_deb_src("fio", "3.33-3").expect("deb-src lines added");
    let d = apt.system();
    let text = &d.written[Path::new(DEB_SRC_FILE)];
    assert!(text.contains("Types: deb-src"), "{text}");
    assert!(text.contains("Suites: bookworm bookworm-updates"), "{text}");
    assert!(text.contains("Suites: bookworm-security"), "{text}");
    // Probe, write, refresh, probe again.
    assert_eq!(d.updates(), 1);
    let showsrc = d
        .calls
        .iter()
        .filter(|c| c.starts_with("apt-cache showsrc"))
        .count();
    assert_eq!(showsrc, 2, "{:?}", d.calls);
}

#[test]
fn refreshes_again_for_new_deb_src_lines() {
    // An earlier step of the same run refreshed the lists (an install); the new deb-src lines
    // still need lists of their own.
    let mut apt = Apt::with(Debian12::fresh());
    apt.ensure_packages(&["fio"]).unwrap();
    apt.update().unwrap();
    apt.ensure_deb_src("fio", "3.33-3").expect("deb-src lines added");
    assert_eq!(apt.system().updates(), 2);
}

#[test]
fn deb_src_already_there_adds_nothing() {
    let mut d = Debian12::fresh();
    d.src_lists = true;
    let mut apt = Apt::with(d);
    apt.ensure_deb_src("fio", "3.33-3").unwrap();
    assert!(apt.system().written.is_empty());
    assert_eq!(apt.system().updates(), 0);
}

#[test]
fn unknown_source_package_is_a_clear_error() {
    let mut apt = Apt::with(Debian12::fresh());
    let e = apt.ensure_deb_src("nosuchpkg", "1.0-1").unwrap_err().to_string();
    assert!(e.contains("apt knows no source package nosuchpkg 1.0-1"), "{e}");
    assert!(e.contains("apt-cache policy nosuchpkg"), "{e}");
    assert_eq!(apt.system().updates(), 1);
}

#[test]
fn other_failures_carry_apts_message() {
    let mut d = Debian12::fresh();
    let lock = "E: Could not open lock file /var/lib/apt/lists/lock - open (13: Permission denied)\n";
    d.showsrc_fails = Some(Debian12::code(100, "", lock));
    let mut apt = Apt::with(d);
    let e = apt.ensure_deb_src("fio", "3.33-3").unwrap_err().to_string();
    assert!(e.contains("apt-cache showsrc fio failed (exit 100)"), "{e}");
    assert!(e.contains("Could not open lock file"), "{e}");
    assert!(e.contains("run `apt-get update` by hand"), "{e}");
    // Nothing was added for a failure that is not a missing source.
    assert!(apt.system().written.is_empty());
}

#[test]
fn unknown_package_install_is_a_clear_error() {
    let mut apt = Apt::with(Debian12::fresh());
    let Err(e) = apt.ensure_packages(&["fio", "nosuchpkg"]) else {
        panic!("installing an unknown package succeeded");
    };
    let e = e.to_string();
    assert!(
        e.contains("apt-get install fio nosuchpkg failed (exit 100)"),
        "{e}"
    );
    assert!(e.contains("E: Unable to locate package nosuchpkg"), "{e}");
    // One refresh, then the same answer.
    assert_eq!(apt.system().updates(), 1);
    assert!(!apt.system().installed.contains("fio"));
}

#[test]
fn installs_what_is_missing_only() {
    let mut apt = Apt::with(Debian12::fresh());
    apt.ensure_packages(&["dpkg-dev", "fio"]).unwrap();
    let d = apt.system();
    assert!(d.installed.contains("fio"));
    assert!(d
        .calls
        .contains(&"apt-get install -y -q --no-install-recommends fio".to_string()));
}

#[test]
fn unknown_package_depends_is_none_after_one_refresh() {
    let mut apt = Apt::with(Debian12::fresh());
    assert_eq!(apt.depends("linux-image-6.12-amd64").unwrap(), None);
    assert_eq!(apt.system().updates(), 1);
    assert!(apt.depends("fio").unwrap().is_some());
}

#[test]
fn fio_source_on_a_fresh_machine() {
    // What the fio engine's build asks of apt: fio and dpkg-dev installed, fio's source known.
    let mut apt = Apt::with(Debian12::fresh());
    let version = crate::setup::fio_source_apt(&mut apt).expect("fio source reachable");
    assert_eq!(version, "3.33-3");
    apt.source(Path::new("/nonexistent"), "fio", &version).unwrap();
    assert!(apt.system().written.contains_key(Path::new(DEB_SRC_FILE)));
}
