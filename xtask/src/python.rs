//! `cargo xtask test`'s Python step: the `vfpoll` package (`python/`) built as a wheel with
//! maturin into `target/wheels`, installed into a virtual environment under `target/python`,
//! and tested with pytest (`python/tests`).
//!
//! The environment (`target/python/venv`) is made with the host's `python3 -m venv` and gets the
//! packages of `python/requirements-test.txt` from PyPI (maturin, pytest, numpy, safetensors);
//! it is kept between runs and refreshed when that file changes. Where `python3 -m venv` fails
//! because Debian's `python3-venv` is missing (Debian splits ensurepip out of python3), the step
//! installs it with apt-get when it runs as root, and otherwise says what to install. Tests that
//! need torch or a GPU skip themselves here (they run on the GPU machine).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::{err, run, run_quiet, show, Context, Result};
use crate::Workspace;

/// The requirements file, relative to the workspace root.
const REQUIREMENTS: &str = "python/requirements-test.txt";
/// Where the step notes which requirements the environment has.
const STAMP: &str = ".vfpoll-requirements";

/// The virtual environment's directory.
pub fn venv_dir(ws: &Workspace) -> PathBuf {
    ws.target.join("python/venv")
}

/// Builds the wheel, installs it, runs pytest; the note is pytest's summary line.
pub fn test(ws: &Workspace) -> Result<String> {
    let venv = ensure_venv(ws)?;
    let py = venv.join("bin/python");
    let wheel = build_wheel(ws, &venv)?;
    run_quiet(
        Command::new(&py)
            .args(["-m", "pip", "install", "-q", "--no-deps", "--force-reinstall"])
            .arg(&wheel),
    )?;
    let out = Command::new(&py)
        .args([
            "-m",
            "pytest",
            "-q",
            "-ra",
            "-p",
            "no:cacheprovider",
            "python/tests",
        ])
        .current_dir(&ws.root)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .context("cannot run pytest")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary = stdout
        .lines()
        .rev()
        .find(|l| l.contains(" passed") || l.contains(" failed") || l.contains(" error"))
        .unwrap_or("")
        .trim_matches(|c: char| c == '=' || c.is_whitespace())
        .to_string();
    if out.status.success() {
        Ok(format!(
            "{} ({})",
            summary,
            wheel.file_name().unwrap_or_default().to_string_lossy()
        ))
    } else {
        eprint!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
        Err(err!("pytest python/tests failed ({}): {summary}", out.status))
    }
}

/// The environment, made and filled when missing or stale.
fn ensure_venv(ws: &Workspace) -> Result<PathBuf> {
    let venv = venv_dir(ws);
    let py = venv.join("bin/python");
    if !py.exists() {
        if let Err(first) = make_venv(&venv) {
            install_python3_venv().map_err(|e| err!("{first}\n{e}"))?;
            make_venv(&venv)?;
        }
    }
    let want = fs::read_to_string(ws.root.join(REQUIREMENTS)).context(REQUIREMENTS)?;
    let stamp = venv.join(STAMP);
    if fs::read_to_string(&stamp).ok().as_deref() != Some(want.as_str()) {
        run(Command::new(&py)
            .args(["-m", "pip", "install", "-q", "--disable-pip-version-check", "-r"])
            .arg(ws.root.join(REQUIREMENTS)))?;
        fs::write(&stamp, &want).context(stamp.display())?;
    }
    Ok(venv)
}

fn make_venv(venv: &Path) -> Result<()> {
    // A half-made environment (ensurepip missing) would be taken as ready next time.
    let _ = fs::remove_dir_all(venv);
    let mut cmd = Command::new("python3");
    cmd.args(["-m", "venv"]).arg(venv);
    run_quiet(&mut cmd).map(drop).map_err(|e| {
        let _ = fs::remove_dir_all(venv);
        err!("{e}")
    })
}

/// Debian's `python3-venv` (ensurepip), with apt-get when we are root.
fn install_python3_venv() -> Result<()> {
    let root = is_root();
    if !root || !Path::new("/usr/bin/apt-get").exists() {
        return Err(err!(
            "`python3 -m venv` failed: install Python's venv module (on Debian: `apt-get install python3-venv`)"
        ));
    }
    let mut install = Command::new("apt-get");
    install
        .args(["install", "-y", "-q", "python3-venv"])
        .env("DEBIAN_FRONTEND", "noninteractive");
    if run_quiet(&mut install).is_err() {
        run_quiet(Command::new("apt-get").args(["update", "-q"]))?;
        run_quiet(&mut install).map_err(|e| err!("{}: {e}", show(&install)))?;
    }
    Ok(())
}

fn is_root() -> bool {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// `maturin build --release` of `python/` into `target/wheels`; returns the wheel's path.
fn build_wheel(ws: &Workspace, venv: &Path) -> Result<PathBuf> {
    let out = ws.target.join("wheels");
    // Only this build's wheel in the folder, so that the newest is not a guess.
    if let Ok(rd) = fs::read_dir(&out) {
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().starts_with("vfpoll-") {
                let _ = fs::remove_file(e.path());
            }
        }
    }
    run(Command::new(venv.join("bin/maturin"))
        .args(["build", "--release", "--quiet", "--manifest-path"])
        .arg(ws.root.join("python/Cargo.toml"))
        .arg("--out")
        .arg(&out)
        .env("CARGO_TARGET_DIR", &ws.target))?;
    fs::read_dir(&out)
        .context(out.display())?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name().is_some_and(|n| {
                let n = n.to_string_lossy();
                n.starts_with("vfpoll-") && n.ends_with(".whl")
            })
        })
        .ok_or_else(|| err!("maturin left no vfpoll wheel in {}", out.display()))
}

#[cfg(test)]
mod tests {
    /// The step alone, as `cargo xtask test` runs it: `cargo test -p xtask -- --ignored
    /// python_step --nocapture` (builds the wheel, makes the environment when missing).
    #[test]
    #[ignore = "builds the wheel and runs pytest (minutes)"]
    fn python_step() {
        let ws = crate::Workspace::locate();
        match super::test(&ws) {
            Ok(note) => eprintln!("python: {note}"),
            Err(e) => panic!("{e}"),
        }
    }
}
