//! vfpoll developer tasks: the QEMU test bed and the project's test runner.
//!
//! ```text
//! cargo xtask setup                      # host packages + guest assets (cached; once per machine)
//! cargo xtask vm [OPTIONS] -- CMD ARGS   # boot the guest, run CMD in it, exit with its code
//! cargo xtask test [--host-only] [--filter S] [--mode iommu|noiommu|iommufd|both|all] [--kernel 6.1|6.12|all]
//! cargo xtask demo [--noiommu]           # vfpoll's main job on the test bed
//! cargo xtask bench [--time SECS]        # vfpoll perf vs fio on the guest kernel, one table
//! cargo xtask fuzz [--secs N]            # libFuzzer on vfpoll-nvmf's PDU parser and fabrics decoding
//! ```
//!
//! Each command has a `--help`. Everything the test bed makes lives under `target/testbed/`.
//!
//! # The guest
//!
//! QEMU 7.2 `q35` under TCG (`-accel tcg -cpu max`; this machine's KVM cannot run a stock
//! kernel), 2 vCPUs and 2 GiB unless `--smp`/`--mem`, Debian's own 6.1 kernel (the one
//! `linux-image-amd64` depends on; `--kernel 6.12` boots Debian 12's 6.12, `setup.rs` says how
//! it differs), a busybox initramfs. The guest's `/` is the host's `/`
//! (9p, read-only, with a tmpfs overlay: writes vanish at power-off), so host paths work
//! unchanged; the command runs there as root, in the directory `cargo xtask vm` was started in,
//! with `PATH=<target>/debug:<target>/release:/usr/local/sbin:...:/bin`. A boot takes 4-8 s.
//!
//! Fixed PCI layout (Linux BDF `0000:00:0N.0`):
//!
//! | BDF          | device                          | ids       | details |
//! |--------------|---------------------------------|-----------|---------|
//! | 0000:00:01.0 | virtio-9p `hostroot`            | 1af4:1009 | the host's `/`, read-only |
//! | 0000:00:02.0 | virtio-9p `out`                 | 1af4:1009 | `<run-dir>/out`, read-write, at `/out` |
//! | 0000:00:03.0 | NVMe controller A               | 1b36:0010 | serial `vfpoll-a`, 16 MiB CMB (BAR2); nsid 1: 64 MiB, 512 B blocks (`nvme-a-ns1.img`); nsid 2: 32 MiB, 4 KiB blocks (`nvme-a-ns2.img`); MDTS 512 KiB |
//! | 0000:00:04.0 | NVMe controller B               | 1b36:0010 | serial `vfpoll-b`, MDTS 4 MiB, 16 MiB CMB (BAR2); nsid 1: 64 MiB, 512 B blocks (`nvme-b-ns1.img`) |
//! | 0000:00:05.0 | e1000e, MAC 52:54:00:00:00:01   | 8086:10d3 | on QEMU hub 0 with the other NIC, nothing else |
//! | 0000:00:06.0 | e1000e, MAC 52:54:00:00:00:02   | 8086:10d3 | frames sent by one arrive at the other |
//! | 0000:00:07.0 | ivshmem-plain (GPU-BAR stand-in)| 1af4:1110 | BAR2: 64 MiB, backed by `<run-dir>/gpubar.shm` |
//! | 0000:00:08.0 | NVMe controller C               | 1b36:0010 | serial `vfpoll-s`, controller 0 of NVM subsystem `nqn.2026-11.io.vfpoll:subsys0` |
//! | 0000:00:09.0 | NVMe controller D               | 1b36:0010 | serial `vfpoll-s`, controller 1 of the same subsystem; nsid 1 (64 MiB, 512 B blocks, `nvme-s-ns1.img`) is shared by C and D |
//! | 0000:00:0a.0 | virtio-net, MAC 52:54:00:00:00:03 | 1af4:1041 | modern only (`disable-legacy=on`), on hub 0 with the e1000e; `iommu_platform=on` in IOMMU mode; on the kernel's `virtio_net`, its interface down |
//! | 0000:00:0b.0 | NVMe controller F               | 1b36:0010 | serial `vfpoll-f`, the namespace formats (`nvme-f-ns1.img` ... `ns7`): 1 512+8 extended, 2 512+8 separate metadata, 3 512+8 PI type 1, 4 4096+64 separate with PI type 1 (first bytes), 5 PI with a 64-bit guard, 6 zoned (4 KiB blocks, 1 MiB zones, 768 KiB capacity, 4 open / 6 active, ZASL 128 KiB), 7 plain 512 B for Format NVM |
//! | 0000:00:0c.0 / 0000:01:00.0 | PCIe root port `rp1` / NVMe controller R | 1b36:000c / 1b36:0010 | only with `vm --hotplug` (the `recovery_removal` tests): serial `vfpoll-r`, nsid 1: 64 MiB, 512 B blocks (`nvme-r-ns1.img`, a `-blockdev` that outlives an unplug); `device_del`/`device_add` through QMP (`<run-dir>/qmp.sock`, or `/out/qmp` requests from the guest: `qmp.rs`) |
//! | 0000:00:0e.0 | NVMe controller G               | 1b36:0010 | only with `vm --big-ns SIZE` (the `store` tests: 1 GiB): serial `vfpoll-g`, MDTS 2 MiB; nsid 1: SIZE, 512 B blocks (`nvme-g-ns1.img`, sparse) |
//! | 0000:00:0f.0 | NVMe controller H               | 1b36:0010 | only with `vm --big-ns SIZE`: serial `vfpoll-h`, MDTS 2 MiB; nsid 1: SIZE, 4 KiB blocks (`nvme-h-ns1.img`, sparse) |
//!
//! Modes (`vm --mode`): `iommu` (default): emulated VT-d (`intel-iommu,caching-mode=on`,
//! `intel_iommu=on`), one IOMMU group per device, type1 containers. `noiommu` (`--noiommu`): no
//! vIOMMU, a rebuilt `vfio.ko` with `vfio.enable_unsafe_noiommu_mode=1` (`/dev/vfio/noiommu-N`;
//! bus address = guest-physical address). `iommufd` (6.12 kernel only): emulated VT-d as in
//! `iommu`, `iommufd` loaded first, so `/dev/iommu` exists and a device bound to vfio-pci gets
//! `/dev/vfio/devices/vfioN` (the job does not start without `/dev/iommu`). 6.1 boots Debian's
//! VFIO modules in `iommu` mode; 6.12 boots one rebuilt set (iommufd, cdev, no-IOMMU: see
//! `setup/vfio.rs`) in every mode.
//!
//! Before the command: `nvme,e1000e,virtio_net,vfio-pci,vfio_iommu_type1` are loaded (`--modules`
//! overrides), so the devices start on their kernel drivers and NVMe controllers are live;
//! `/dev/hugepages` is hugetlbfs, no pages reserved unless `--hugepages N`. `/lib/modules` has
//! every module of the guest kernel (with the rebuilt VFIO modules where the mode uses them); the host
//! has no kmod: inside the guest use `busybox modprobe`.
//!
//! Environment of the command: `RUST_LOG`, `RUST_BACKTRACE` and every `VFPOLL_*` of the host,
//! plus `VFPOLL_TESTBED=iommu|noiommu|iommufd` and `VFPOLL_TESTBED_OUT=/out`.
//!
//! # The run dir
//!
//! `target/testbed/run/<mode>` (or `--run-dir`; while another boot holds the default
//! one, `<mode>-2`, `<mode>-3`, ...), recreated at each boot (unless `--keep-run-dir`) and kept
//! after it: zero-filled sparse `nvme-a-ns1.img`, `nvme-a-ns2.img`, `nvme-b-ns1.img`, `nvme-s-ns1.img`,
//! `nvme-f-ns1.img` to `nvme-f-ns7.img`, a zeroed
//! `gpubar.shm`, `out/` (the guest's `/out`; `job.sh`, `exit-code`, `lib-modules` live there),
//! `console.log` (the raw serial console), `qemu-cmd.txt`, `lock` (while in use) and, after a
//! boot in which QEMU's vIOMMU refused a device DMA, `iommu-faults.txt` (QEMU's lines).
//!
//! # Test-bed tests (`cargo xtask test`)
//!
//! Integration tests of the crate `vfpoll-tests` (`tests/tests/*.rs`). In each binary:
//! - `#[test] #[ignore = "test bed"] fn guest_*()`: run in the guest, one boot per binary and
//!   mode, as `<binary> --ignored --test-threads=1 --exact <the guest_ tests>`, in `tests/`.
//! - `#[test] #[ignore = "test bed"] fn host_check_*()`: run on the host after that boot, with
//!   `VFPOLL_RUN_DIR=<its run dir>` and `VFPOLL_RUN_MODE=<mode>`; they read the image
//!   files and `gpubar.shm`, the oracle no driver code can fake.
//!
//! Both runs get the same fresh `VFPOLL_SEED` (a decimal u64). The run dir of a binary `x` is
//! `target/testbed/run/x-<mode>`. `--filter S` selects tests whose name (or binary name)
//! contains `S`; name a host check `host_check_<x>` after its `guest_<x>` so one filter picks
//! both. `tests/tests/xtask_selftest.rs` is the harness's own test.
//!
//! A boot in which QEMU's vIOMMU refused a device DMA fails (see `test.rs`), except that of a
//! `guest_expect_iommu_fault_*` test, which runs alone in IOMMU mode and must show its fault.
//!
//! # Modules, bottom to top
//!
//! Each imports only from the rows above it: `util`, `json`, `cpio`, `qmp`, `python`, `mode`
//! (the guest's DMA mode); `apt`; `setup` (kernels, busybox, VFIO modules: `setup/vfio.rs`) and
//! `setup_qemu`; `build` (cargo builds, libvfpoll, the fio engine); `vm` (one boot, its
//! options [`vm::VmArgs`]); `fuzz`, `bench` (`bench/nvmf.rs`, `bench/plot.rs`), `demo`; `cli` (the
//! command line, [`cli::Task`]); `docs` (checks the commands the docs quote through `cli`);
//! `test` (runs them all); `main`.
#![forbid(unsafe_code)]

mod apt;
mod bench;
mod build;
mod cli;
mod cpio;
mod demo;
mod docs;
mod fuzz;
mod json;
mod mode;
mod python;
mod qmp;
mod setup;
mod setup_qemu;
mod structure;
mod test;
mod util;
mod vm;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::util::err;

/// Paths of the cargo workspace this xtask belongs to.
pub struct Workspace {
    /// The workspace root (where `Cargo.lock` is).
    pub root: PathBuf,
    /// Cargo's target directory (`$CARGO_TARGET_DIR` or `<root>/target`).
    pub target: PathBuf,
}

impl Workspace {
    /// The workspace xtask was built in.
    pub fn locate() -> Self {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("xtask lives in a workspace folder")
            .to_path_buf();
        let target = match std::env::var_os("CARGO_TARGET_DIR") {
            Some(t) => root.join(t),
            None => root.join("target"),
        };
        Workspace { root, target }
    }

    /// `<root>/target/testbed`: every test-bed asset and run dir. Always under the workspace,
    /// whatever `CARGO_TARGET_DIR` says, so that builds into other target dirs share one copy.
    pub fn testbed(&self) -> PathBuf {
        self.root.join("target/testbed")
    }
}

fn main() -> ExitCode {
    let ws = Workspace::locate();
    let result = cli::parse(std::env::args_os().skip(1).collect()).and_then(|task| match task {
        cli::Task::Help(text) => {
            let _ = writeln!(std::io::stdout(), "{text}");
            Ok(0)
        }
        cli::Task::Setup => setup::setup(&ws).and_then(|_| setup_qemu::setup(&ws)).map(|_| 0),
        cli::Task::Vm(args) => vm::main(&ws, &args),
        cli::Task::Test(args) => test::main(&ws, &args),
        cli::Task::Demo(mode, verbose) => demo::main(&ws, mode, verbose),
        cli::Task::Bench(args) => bench::main(&ws, &args),
        cli::Task::Fuzz(args) => fuzz::main(&ws, &args),
        cli::Task::Circles => {
            let found = structure::circles(&ws.root).map_err(|e| err!("circles: {e}"))?;
            let mut out = std::io::stdout().lock();
            for c in &found {
                let _ = writeln!(out, "{c}");
            }
            let _ = writeln!(out, "{} import circle(s)", found.len());
            Ok(u8::from(!found.is_empty()))
        }
        cli::Task::FioEngine { release } => {
            let so = build::fio_engine(&ws, if release { "release" } else { "debug" })?;
            let _ = writeln!(std::io::stdout(), "{}", so.display());
            Ok(0)
        }
    });
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("xtask: error: {e}");
            ExitCode::from(1)
        }
    }
}
