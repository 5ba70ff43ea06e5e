//! The cargo builds the test bed, the docs check and the benches need: the workspace's
//! binaries, libvfpoll installed with its pkg-config file, and the fio engine.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::setup;
use crate::util::{run, stdout_of, Result};
use crate::Workspace;

/// `cargo build --workspace --bins`, so that the guest runs the current binaries.
pub fn build_bins(ws: &Workspace) -> Result<()> {
    run(cargo(ws).args(["build", "--workspace", "--bins"]))
}

/// The cargo that runs us (or `cargo`), in the workspace root.
pub fn cargo(ws: &Workspace) -> Command {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    c.current_dir(&ws.root);
    c
}

/// Builds libvfpoll for `profile` (`debug` or `release`) and installs it into
/// `target/<profile>/capi` with `capi/install.sh`; returns that prefix.
pub fn install_capi(ws: &Workspace, profile: &str) -> Result<PathBuf> {
    let mut build = cargo(ws);
    build.args(["build", "-p", "vfpoll-capi"]);
    if profile == "release" {
        build.arg("--release");
    }
    run(&mut build)?;
    let prefix = ws.target.join(profile).join("capi");
    run(Command::new("sh")
        .arg(ws.root.join("capi/install.sh"))
        .arg(&prefix)
        .arg(profile))?;
    Ok(prefix)
}

/// `pkg-config --cflags --libs vfpoll` of the libvfpoll installed under `prefix`.
pub fn capi_flags(prefix: &Path) -> Result<String> {
    stdout_of(
        Command::new("pkg-config")
            .args(["--cflags", "--libs", "vfpoll"])
            .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig")),
    )
}

/// Builds vfpoll's fio engine (`fio-engine/`, GPL-2.0) for `profile` (`debug` or `release`):
/// libvfpoll built and installed into `target/<profile>/capi`, fio's source fetched and
/// configured ([`setup::fio_source`]), then `make -C fio-engine` against both into
/// `target/<profile>/libvfpoll_fio.so`, which it returns.
pub fn fio_engine(ws: &Workspace, profile: &str) -> Result<PathBuf> {
    let prefix = install_capi(ws, profile)?;
    let dir = ws.target.join(profile);
    let fio_src = setup::fio_source(ws)?;
    run(Command::new("make")
        .arg("-C")
        .arg(ws.root.join("fio-engine"))
        .arg(format!("FIO_SRC={}", fio_src.display()))
        .arg(format!("OUT={}", dir.display()))
        .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig")))?;
    Ok(dir.join("libvfpoll_fio.so"))
}
