//! `cargo xtask demo`: vfpoll's main job on a machine without NVMe hardware. One boot of the
//! test bed runs what a user does on a real machine: set up (hugepages, vfio-pci), look
//! (`vfpoll status`), identify the controllers and write/read/compare a block on each, then a
//! short `vfpoll perf` run when the perf tool is built.
//!
//! The demo shows figures, so it runs the release build: `cargo build --release -p vfpoll`
//! first, and `target/release` ahead of the guest's PATH (whose default puts the debug build
//! first, for the tests) for this boot; its first line names the binary.

use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use crate::build;
use crate::mode::Mode;
use crate::util::{run, shell_quote, Result};
use crate::vm;
use crate::Workspace;

/// The steps, as shell lines; `{M}` becomes ` --noiommu` in no-IOMMU mode.
const STEPS: &[&str] = &[
    "vfpoll setup --hugepages 256 --bind nvme",
    "vfpoll status",
    "vfpoll identify --device 0000:00:03.0{M}",
    "vfpoll hello --device 0000:00:03.0{M}",
    "vfpoll hello --device 0000:00:03.0 --nsid 2{M}",
    "vfpoll identify --device 0000:00:04.0{M}",
    "vfpoll hello --device 0000:00:04.0{M}",
];

/// Runs the demo in `mode`; returns the guest's exit code.
pub fn main(ws: &Workspace, mode: Mode, verbose: bool) -> Result<u8> {
    run(build::cargo(ws).args(["build", "--release", "-p", "vfpoll"]))?;
    let script = script(mode, &ws.target.join("release"));
    let args = vm::VmArgs {
        mode,
        timeout: Duration::from_secs(600),
        mem: "2G".into(),
        smp: 2,
        modules: None,
        hugepages: 0,
        run_dir: None,
        keep_run_dir: false,
        // Built above: the guest needs only the release vfpoll, not the workspace's debug bins.
        no_build: true,
        print_cmd: false,
        verbose,
        command: ["sh", "-c", &script].iter().map(OsString::from).collect(),
        hotplug: false,
        kernel: crate::setup::DEFAULT_KERNEL,
        qemu: crate::setup_qemu::DEFAULT_EMULATOR,
        hugepages_1g: 0,
        numa_nodes: 1,
        big_ns_mib: 0,
    };
    vm::main(ws, &args)
}

/// The guest's shell script: the release build of vfpoll from `release` first on the PATH,
/// then the steps.
fn script(mode: Mode, release: &Path) -> String {
    let m = if mode == Mode::NoIommu { " --noiommu" } else { "" };
    let dir = shell_quote(release.as_os_str());
    let mut script = format!(
        "set -e\nexport PATH={dir}:\"$PATH\"\n\
         printf 'vfpoll: %s (release build: cargo build --release -p vfpoll)\\n' \"$(command -v vfpoll)\"\n"
    );
    for step in STEPS {
        let line = step.replace("{M}", m);
        script.push_str(&format!("printf '\\n$ %s\\n' '{line}'\n{line}\n"));
    }
    // The perf tool, when this build has it (a short run: the guest CPU is emulated).
    let perf = format!(
        "vfpoll perf --device 0000:00:03.0{m} --workload randread --io-size 4k --queue-depth 32 --time 5"
    );
    script.push_str(&format!(
        "if vfpoll help perf >/dev/null 2>&1; then printf '\\n$ %s\\n' '{perf}'; {perf}; fi\n"
    ));
    script
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_runs_the_release_build_and_says_so() {
        let s = script(Mode::NoIommu, Path::new("/w/my target/release"));
        let mut lines = s.lines();
        assert_eq!(lines.next(), Some("set -e"));
        assert_eq!(lines.next(), Some("export PATH='/w/my target/release':\"$PATH\""));
        assert!(lines
            .next()
            .unwrap()
            .contains("(release build: cargo build --release -p vfpoll)"));
        // Every step comes after the PATH line, and none names another binary.
        assert!(
            s.contains("\nvfpoll identify --device 0000:00:03.0 --noiommu\n"),
            "{s}"
        );
        assert!(!s.contains("target/debug"), "{s}");
        assert!(s.contains("vfpoll perf --device 0000:00:03.0 --noiommu --workload randread"));
    }
}
