//! `cargo xtask demo`: vfpoll's main job on a machine without NVMe hardware. One boot of the
//! test bed runs what a user does on a real machine: set up (hugepages, vfio-pci), look
//! (`vfpoll status`), identify the controllers and write/read/compare a block on each, then a
//! short `vfpoll perf` run when the perf tool is built.

use std::ffi::OsString;
use std::time::Duration;

use crate::cli::VmArgs;
use crate::util::Result;
use crate::vm::{self, Mode};
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
    let m = if mode == Mode::NoIommu { " --noiommu" } else { "" };
    let mut script = String::from("set -e\n");
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
    let args = VmArgs {
        mode,
        timeout: Duration::from_secs(600),
        mem: "2G".into(),
        smp: 2,
        modules: None,
        hugepages: 0,
        run_dir: None,
        keep_run_dir: false,
        no_build: false,
        print_cmd: false,
        verbose,
        command: ["sh", "-c", &script].iter().map(OsString::from).collect(),
    };
    vm::main(ws, &args)
}
