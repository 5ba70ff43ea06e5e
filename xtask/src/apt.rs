//! apt and dpkg, behind one seam.
//!
//! Every question setup asks the host's package manager (`apt-cache`, `apt-get`, `dpkg-query`)
//! and every sources file it writes goes through [`System`]. [`Host`] runs the real programs;
//! the tests run the same logic against a fake that answers exactly as Debian 12's apt does,
//! including on a fresh machine whose apt knows no `deb-src` lines, where `apt-cache showsrc`
//! exits 100 with `E: You must put some 'deb-src' URIs in your sources.list`.
//!
//! A probe that fails because a source is missing leads to adding that source (and refreshing
//! the lists once); any other failure is reported with apt's own message and what to do.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::util::{err, show, Context, Error, Note, Result};

/// Where setup writes the `deb-src` lines (fio's source, for the fio engine).
pub const DEB_SRC_FILE: &str = "/etc/apt/sources.list.d/vfpoll-deb-src.sources";
/// Where setup writes `<codename>-backports` (the 6.12 guest kernel, QEMU 10).
pub const BACKPORTS_FILE: &str = "/etc/apt/sources.list.d/vfpoll-backports.sources";
/// Debian's archive key, which signs every suite setup adds.
const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

/// What a program answered: its exit code (`None`: killed by a signal) and its output.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answer {
    /// The exit code.
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl Answer {
    /// Exit code 0.
    pub fn ok(&self) -> bool {
        self.code == Some(0)
    }

    /// Whether this is apt's answer for "no `deb-src` lines in the sources" (exit 100).
    fn no_deb_src(&self) -> bool {
        self.code == Some(100) && self.stderr.contains("You must put some 'deb-src' URIs")
    }
}

/// The host's package manager: runs programs and writes apt sources files.
pub trait System {
    /// Runs `prog args` (in `dir` when given) with `DEBIAN_FRONTEND=noninteractive` and stdin
    /// closed; an error only when the program cannot be started at all.
    fn run(&mut self, prog: &str, args: &[&str], dir: Option<&Path>) -> Result<Answer>;
    /// Writes apt sources file `path`.
    fn write_sources(&mut self, path: &Path, text: &str) -> Result<()>;
    /// `VERSION_CODENAME` of `/etc/os-release` (`bookworm`).
    fn codename(&mut self) -> Result<String>;
}

/// The real host.
#[derive(Default)]
pub struct Host;

impl System for Host {
    fn run(&mut self, prog: &str, args: &[&str], dir: Option<&Path>) -> Result<Answer> {
        let mut cmd = Command::new(prog);
        cmd.args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null());
        if let Some(d) = dir {
            cmd.current_dir(d);
        }
        let out = cmd.output().context(format_args!("cannot run {}", show(&cmd)))?;
        Ok(Answer {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    fn write_sources(&mut self, path: &Path, text: &str) -> Result<()> {
        fs::write(path, text).context(path.display())
    }

    fn codename(&mut self) -> Result<String> {
        let os = fs::read_to_string("/etc/os-release").context("/etc/os-release")?;
        os.lines()
            .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
            .map(|c| c.trim_matches('"').to_string())
            .ok_or_else(|| err!("/etc/os-release names no VERSION_CODENAME (a Debian host is required)"))
    }
}

/// The error for a failed apt command: the command, apt's own message, and what to do.
fn failed(what: &str, a: &Answer, todo: &str) -> Error {
    let code = a
        .code
        .map_or_else(|| "killed by a signal".to_string(), |c| format!("exit {c}"));
    let said = [a.stderr.trim(), a.stdout.trim()]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("\n");
    err!("{what} failed ({code}):\n{said}\n{todo}")
}

/// What to do when apt cannot reach or read its sources.
const CHECK_SOURCES: &str = "Check apt's sources (/etc/apt/sources.list and /etc/apt/sources.list.d/) and \
     that deb.debian.org is reachable: run `apt-get update` by hand, fix what it reports, then run \
     this command again.";

/// apt, refreshing its package lists at most once per run, when they turn out to be missing or
/// stale.
pub struct Apt<S: System = Host> {
    sys: S,
    updated: bool,
}

impl Default for Apt<Host> {
    fn default() -> Self {
        Apt::with(Host)
    }
}

impl<S: System> Apt<S> {
    /// apt on `sys`.
    pub fn with(sys: S) -> Self {
        Apt { sys, updated: false }
    }

    /// The system underneath (tests look at what the fake saw).
    #[cfg(test)]
    pub fn system(&self) -> &S {
        &self.sys
    }

    fn run(&mut self, prog: &str, args: &[&str]) -> Result<Answer> {
        self.sys.run(prog, args, None)
    }

    /// `apt-get update`, once; whether it ran now.
    pub fn update(&mut self) -> Result<bool> {
        if self.updated {
            return Ok(false);
        }
        eprintln!("setup: apt-get update");
        let a = self.run("apt-get", &["update", "-q"])?;
        if !a.ok() {
            return Err(failed("apt-get update", &a, CHECK_SOURCES));
        }
        self.updated = true;
        Ok(true)
    }

    /// Which of `pkgs` dpkg has installed.
    pub fn installed(&mut self, pkgs: &[&str]) -> Result<Vec<String>> {
        let mut args = vec!["-W", "-f", "${Package} ${db:Status-Status}\\n"];
        args.extend_from_slice(pkgs);
        // Exit 1 with `no packages found matching` for packages dpkg never heard of: not an
        // error, those are simply not installed.
        let a = self.run("dpkg-query", &args)?;
        Ok(a.stdout
            .lines()
            .filter_map(|l| l.strip_suffix(" installed"))
            .map(str::to_string)
            .collect())
    }

    /// The installed version of `pkg`, if dpkg has it installed.
    pub fn installed_version(&mut self, pkg: &str) -> Result<Option<String>> {
        let a = self.run("dpkg-query", &["-W", "-f", "${db:Status-Status} ${Version}", pkg])?;
        Ok(a.stdout.strip_prefix("installed ").map(|v| v.trim().to_string()))
    }

    /// Installs those of `pkgs` that are missing (refreshing the lists and trying once more
    /// when the first try fails).
    pub fn ensure_packages(&mut self, pkgs: &[&str]) -> Result<((), Note)> {
        let installed = self.installed(pkgs)?;
        let missing: Vec<&str> = pkgs
            .iter()
            .copied()
            .filter(|p| !installed.iter().any(|i| i == p))
            .collect();
        if missing.is_empty() {
            return Ok(((), Note::Cached));
        }
        eprintln!("setup: apt-get install {}", missing.join(" "));
        let mut args = vec!["install", "-y", "-q", "--no-install-recommends"];
        args.extend_from_slice(&missing);
        let mut a = self.run("apt-get", &args)?;
        if !a.ok() && self.update()? {
            a = self.run("apt-get", &args)?;
        }
        if !a.ok() {
            return Err(failed(
                &format!("apt-get install {}", missing.join(" ")),
                &a,
                "These are packages of Debian 12's main component: check that apt's sources name \
                 the release's main suites (a fresh Debian 12 image has them in \
                 /etc/apt/sources.list.d/debian.sources), run `apt-get update`, then run this \
                 command again.",
            ));
        }
        Ok(((), Note::Text(format!("installed {}", missing.join(" ")))))
    }

    /// Whether `apt-cache showsrc pkg` lists `version`; `Ok(None)` when apt has no `deb-src`
    /// lines at all (the answer of a fresh machine).
    fn source_listed(&mut self, pkg: &str, version: &str) -> Result<Option<bool>> {
        let a = self.run("apt-cache", &["showsrc", pkg])?;
        if a.no_deb_src() {
            return Ok(None);
        }
        if !a.ok() {
            return Err(failed(&format!("apt-cache showsrc {pkg}"), &a, CHECK_SOURCES));
        }
        let want = format!("Version: {version}");
        Ok(Some(a.stdout.lines().any(|l| l.trim() == want)))
    }

    /// Makes sure apt can fetch source package `pkg` at `version`: where apt knows no `deb-src`
    /// lines, or knows them but not this version, adds the release's `deb-src` lines
    /// ([`DEB_SRC_FILE`]) when they are not there yet and refreshes the lists.
    pub fn ensure_deb_src(&mut self, pkg: &str, version: &str) -> Result<()> {
        if self.source_listed(pkg, version)? == Some(true) {
            return Ok(());
        }
        let codename = self.sys.codename()?;
        let path = Path::new(DEB_SRC_FILE);
        let sources = format!(
            "# Added by `cargo xtask setup` for fio's source (vfpoll's fio engine).\n\
             Types: deb-src\nURIs: http://deb.debian.org/debian\n\
             Suites: {codename} {codename}-updates\nComponents: main\nSigned-By: {KEYRING}\n\n\
             Types: deb-src\nURIs: http://deb.debian.org/debian-security\n\
             Suites: {codename}-security\nComponents: main\nSigned-By: {KEYRING}\n"
        );
        eprintln!("setup: adding deb-src lines for {codename} to {}", path.display());
        self.sys.write_sources(path, &sources)?;
        // The lists must be fetched again for the new lines, even if this run refreshed them.
        self.updated = false;
        self.update()?;
        match self.source_listed(pkg, version)? {
            Some(true) => Ok(()),
            None => Err(err!(
                "apt still reports no deb-src lines after {} was written: check that apt reads \
                 /etc/apt/sources.list.d (`apt-config dump | grep SourceParts`), then run this \
                 command again",
                path.display()
            )),
            Some(false) => Err(err!(
                "apt knows no source package {pkg} {version}, even with the deb-src lines for \
                 {codename} in {}: is the installed {pkg} from another release? \
                 (`apt-cache policy {pkg}` tells where it came from; install {codename}'s {pkg} \
                 or build the fio engine against a matching source with FIO_SRC=...)",
                path.display()
            )),
        }
    }

    /// `apt-get source pkg=version` into `dir`.
    pub fn source(&mut self, dir: &Path, pkg: &str, version: &str) -> Result<()> {
        let spec = format!("{pkg}={version}");
        let a = self.sys.run("apt-get", &["source", "-q", &spec], Some(dir))?;
        if !a.ok() {
            return Err(failed(&format!("apt-get source {spec}"), &a, CHECK_SOURCES));
        }
        Ok(())
    }

    /// `apt-cache depends pkg` (its candidate version's), refreshing the lists once when apt
    /// knows no `pkg`; `Ok(None)` when it still knows none.
    pub fn depends(&mut self, pkg: &str) -> Result<Option<String>> {
        loop {
            let a = self.run("apt-cache", &["depends", pkg])?;
            if a.ok() {
                return Ok(Some(a.stdout));
            }
            // `E: No packages found` (exit 100): unknown to these lists.
            if !a.stderr.contains("No packages found") {
                return Err(failed(&format!("apt-cache depends {pkg}"), &a, CHECK_SOURCES));
            }
            if !self.update()? {
                return Ok(None);
            }
        }
    }

    /// The `Depends: X` of `pkg` whose name starts with `prefix` (`linux-kbuild-`,
    /// `linux-headers-`).
    pub fn dependency(&mut self, pkg: &str, prefix: &str) -> Result<String> {
        let text = self
            .depends(pkg)?
            .ok_or_else(|| err!("apt knows no {pkg}, even after `apt-get update`"))?;
        text.lines()
            .find_map(|l| {
                let d = l.trim().trim_start_matches('|').trim();
                d.strip_prefix("Depends: ")
                    .filter(|d| d.starts_with(prefix))
                    .map(|d| d.trim().to_string())
            })
            .ok_or_else(|| err!("{pkg} depends on no {prefix}* package\n{text}"))
    }

    /// `apt-cache show target` (`pkg` or `pkg/suite`): empty when apt knows no such package.
    pub fn show(&mut self, target: &str) -> Result<String> {
        let a = self.run("apt-cache", &["show", target])?;
        Ok(if a.ok() { a.stdout } else { String::new() })
    }

    /// Adds `<codename>-backports` to apt's sources ([`BACKPORTS_FILE`]) when it has none, and
    /// refreshes the lists; returns the suite.
    pub fn ensure_backports(&mut self) -> Result<String> {
        let codename = self.sys.codename()?;
        let suite = format!("{codename}-backports");
        let a = self.run("apt-cache", &["policy"])?;
        if !a.ok() {
            return Err(failed("apt-cache policy", &a, CHECK_SOURCES));
        }
        if a.stdout.contains(&format!("{suite}/main")) {
            return Ok(suite);
        }
        let path = Path::new(BACKPORTS_FILE);
        eprintln!("setup: adding {suite} to {}", path.display());
        self.sys.write_sources(
            path,
            &format!(
                "# Added by `cargo xtask setup` for the 6.12 guest kernel and QEMU 10 (nothing is \
                 installed from it).\nTypes: deb\nURIs: http://deb.debian.org/debian\nSuites: {suite}\n\
                 Components: main\nSigned-By: {KEYRING}\n"
            ),
        )?;
        self.updated = false;
        self.update()?;
        Ok(suite)
    }

    /// `apt-get download pkgs` (each `name` or `name=version`) into `dir`; the `.deb` files, in
    /// the order of `pkgs`.
    pub fn download(&mut self, dir: &Path, pkgs: &[String]) -> Result<Vec<PathBuf>> {
        if pkgs.is_empty() {
            return Ok(Vec::new());
        }
        fs::create_dir_all(dir).context(dir.display())?;
        let mut args = vec!["download"];
        args.extend(pkgs.iter().map(String::as_str));
        let mut a = self.sys.run("apt-get", &args, Some(dir))?;
        if !a.ok() && self.update()? {
            a = self.sys.run("apt-get", &args, Some(dir))?;
        }
        if !a.ok() {
            return Err(failed(
                &format!("apt-get download {}", pkgs.join(" ")),
                &a,
                CHECK_SOURCES,
            ));
        }
        let files: Vec<PathBuf> = fs::read_dir(dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        pkgs.iter()
            .map(|p| {
                let prefix = format!("{}_", p.split('=').next().unwrap_or(p));
                files
                    .iter()
                    .find(|f| {
                        let n = f.file_name().unwrap_or_default().to_string_lossy();
                        n.starts_with(&prefix) && n.ends_with(".deb")
                    })
                    .cloned()
                    .ok_or_else(|| err!("apt-get download left no {prefix}*.deb in {}", dir.display()))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
