//! The command line: a small hand-written parser (`--flag`, `--opt VALUE`, `--opt=VALUE`, `--`).

use std::ffi::OsString;
use std::time::Duration;

use crate::mode::Mode;
use crate::setup::{iommufd_refused, kernel_by_name, GuestKernel, DEFAULT_KERNEL, KERNELS};
use crate::setup_qemu::{emulator_by_name, emulators_by_names, Emulator, DEFAULT_EMULATOR, EMULATORS};
use crate::util::{err, Result};
use crate::vm::VmArgs;

const HELP: &str = "\
vfpoll developer tasks

Usage: cargo xtask <COMMAND> [OPTIONS]

Commands:
  setup   Install the host packages and build the QEMU test-bed assets (cached)
  vm      Boot the test-bed guest and run one command in it
  test    Run every test: fmt, clippy, host tests, then the test-bed tests in the guest
  demo    vfpoll's main job on the emulated test bed: setup, status, identify, hello, perf
  bench   vfpoll perf against fio (io_uring, libaio, hipri) on the guest kernel, one table;
          --nvmf: vfpoll target against the kernel's nvmet-tcp
  fuzz    Fuzz the NVMe/TCP parsers (vfpoll-nvmf) and the store's on-disk parsers with libFuzzer
  fio-engine
          Build vfpoll's fio engine: fetches fio's source, needs no test bed
  circles List the import circles between the files of each crate (the tests allow none)
  help    Print this help, or the help of a command (`cargo xtask help vm`)

Each command has its own --help.";

const SETUP_HELP: &str = "\
Install the host packages and build the test-bed assets

Usage: cargo xtask setup

Installs the missing apt packages (qemu-system-x86 busybox-static fio nvme-cli e2fsprogs gcc
g++ make bc python3 xz-utils libelf1 libssl3 zstd), fetches the two Debian 12 guest kernels,
6.1 (what linux-image-amd64 depends on, the default) and 6.12 (linux-image-6.12-amd64, from
bookworm-security; bookworm-backports' is added to apt's sources where apt knows none)
(apt-get download + dpkg -x, nothing installed) and builds their initramfs images. Debian
builds neither with VFIO no-IOMMU, nor 6.12 with iommufd, so modules are rebuilt out of tree
from the matching linux-source package: 6.1's vfio.ko with no-IOMMU support (for the noiommu
initramfs); 6.12's iommufd.ko, vfio.ko, vfio_iommu_type1.ko, vfio-pci-core.ko and vfio-pci.ko
with CONFIG_IOMMUFD=m, CONFIG_VFIO_DEVICE_CDEV=y and CONFIG_VFIO_NOIOMMU=y, one set (and one
initramfs) for every mode, iommufd included. Everything lands under target/testbed/, keyed by
kernel version; a second run only checks. Prints one line per step with its duration.";

const VM_HELP: &str = "\
Boot the test-bed guest (QEMU, TCG) and run one command in it

Usage: cargo xtask vm [OPTIONS] -- <COMMAND> [ARGS]...

The command runs as root in the guest, chrooted into the host's / (read-only, with a tmpfs
overlay), in the current directory, with target/{debug,release} first on PATH. Exits with the
command's exit code: 124 on timeout, 125 when the guest reported none, 123 when the command
succeeded but QEMU's vIOMMU refused a device DMA (a bug: a DMA the driver never mapped; the
lines are in <run-dir>/iommu-faults.txt).

Options:
      --mode <MODE>      iommu: emulated VT-d, type1 VFIO containers;
                         noiommu: no vIOMMU, vfio.ko with enable_unsafe_noiommu_mode=1;
                         iommufd: emulated VT-d, iommufd loaded (/dev/iommu) and VFIO device
                         cdevs (/dev/vfio/devices/vfioN), 6.12 kernel only [default: iommu]
      --noiommu          Same as --mode noiommu
      --kernel <NAME>    Guest kernel: 6.1 or 6.12 [default: 6.1]
      --timeout <SECS>   Kill the guest after SECS seconds [default: 600]
      --mem <SIZE>       Guest memory, as QEMU's -m takes it [default: 2G]
      --smp <N>          Guest CPUs [default: 2]
      --modules <A,B>    Modules to load before the command (empty: none; mode iommufd
                         loads iommufd first whatever this says)
                         [default: nvme,e1000e,virtio_net,vfio-pci,vfio_iommu_type1]
      --hugepages <N>    Reserve N 2 MiB hugepages before the command [default: 0]
      --hugepages-1g <N> Reserve N 1 GiB hugepages at boot (kernel command line
                         hugepagesz=1G hugepages=N; raise --mem to fit) [default: 0]
      --numa <N>         N guest NUMA nodes sharing --mem and --smp evenly, and NVMe
                         controller N (0000:81:00.0, behind an expander bridge) on the last
                         one [default: 1, no NUMA]
      --qemu <VERSION>   Emulator: 7.2 (the host's) or 10 (bookworm-backports', unpacked
                         under target/testbed by setup) [default: 7.2]
      --run-dir <DIR>    Where images, gpubar.shm and out/ go
                         [default: target/testbed/run/<mode>]
      --keep-run-dir     Reuse the run dir as it is (images keep their data) instead of
                         recreating it
      --no-build         Do not run `cargo build --workspace --bins` first
      --print-cmd        Print the QEMU command line and exit (builds and boots nothing)
      --hotplug          Add NVMe controller R (0000:01:00.0) behind a PCIe root port, for
                         device_del/device_add through QMP (<run-dir>/qmp.sock, or /out/qmp/
                         requests from the guest)
      --big-ns <SIZE>    Add NVMe controllers G (0000:00:0e.0, 512 B blocks) and H
                         (0000:00:0f.0, 4 KiB blocks), one SIZE namespace each on a sparse
                         image (nvme-g-ns1.img, nvme-h-ns1.img), e.g. 1G or 512M (MiB without
                         a suffix), 16M to 64G [default: none]
  -v, --verbose          Show the guest init's lines and kernel warnings
  -h, --help             Print this help";

const TEST_HELP: &str = "\
Run every test of the project

Usage: cargo xtask test [OPTIONS]

Steps: setup; cargo fmt --check; cargo clippy -D warnings; cargo doc (warnings are errors);
cargo test --workspace; libFuzzer on vfpoll-nvmf's and vfpoll-store's parsers (`cargo xtask
fuzz`, VFPOLL_FUZZ_SECS seconds per target, default 30, 0 skips); then, for each
integration-test binary of vfpoll-tests and each mode, one guest boot running its guest_* tests (ignored, --test-threads=1) followed by
its host_check_* tests on the host, with VFPOLL_RUN_DIR=<run dir> and the boot's VFPOLL_SEED. A
boot in which QEMU's vIOMMU refused a device DMA fails (a DMA the driver never mapped); a
guest_expect_iommu_fault_* test runs alone in its own IOMMU-mode boot, which must show the fault
it provokes. A boot in which QEMU itself crashed (died of a signal, no vIOMMU fault) runs once
more and its row says so. Ends with a summary table; exits non-zero when any step failed.

Options:
      --host-only          Only fmt, clippy, doc, the host tests and fuzzing (no setup, no guest)
      --filter <SUBSTR>    Only tests whose name (or binary name) contains SUBSTR; also passed
                           to `cargo test --workspace`
      --mode <MODE>        iommu, noiommu, iommufd, both (iommu and noiommu) or all (the
                           three; iommufd only on the 6.12 kernel, for the foundation, nvme,
                           p2p, store_p2p, unprivileged and nic binaries) [default: all]
      --kernel <NAME>      Guest kernels: 6.1 (every binary), 6.12 (the foundation, nvme,
                           formats and nvmf_auth binaries in every mode, p2p, store_p2p,
                           unprivileged and nic in iommufd mode, as rows of their own), or all
                           [default: all]
      --qemu <LIST>        Emulators, comma-separated: 7.2 (every binary), 10 (the nvme,
                           formats, p2p, recovery_reset and xtask_selftest binaries only, on
                           the default kernel, as rows of their own), or all [default: all]
      --timeout <SECS>     Per guest boot [default: 900]
  -v, --verbose            Show the guest init's lines and kernel warnings
  -h, --help               Print this help";

const FIO_ENGINE_HELP: &str = "\
Build vfpoll's fio engine (fio-engine/, GPL-2.0)

Usage: cargo xtask fio-engine [--release]

Builds libvfpoll (installed into target/<profile>/capi), installs fio and dpkg-dev where they are
missing, fetches and configures the installed fio's source package under target/fio-src (adding
the release's deb-src lines to /etc/apt/sources.list.d/vfpoll-deb-src.sources where apt knows
none), then builds target/<profile>/libvfpoll_fio.so against both. Needs no test bed. Use it
with `fio --ioengine=external:target/<profile>/libvfpoll_fio.so` (see the README's fio section).

Options:
      --release   Build the release engine (target/release) [default: debug]
  -h, --help      Print this help";

const DEMO_HELP: &str = "\
Run vfpoll's main job on the emulated test bed (no NVMe hardware needed)

Usage: cargo xtask demo [--noiommu] [-v]

One boot of the QEMU guest: `vfpoll setup --hugepages 256 --bind nvme`, `vfpoll status`,
`vfpoll identify` and `vfpoll hello` on both emulated NVMe controllers (0000:00:03.0 with
namespaces 1 and 2, 0000:00:04.0), then a 5-second `vfpoll perf` 4 KiB random-read run at queue
depth 32. Stops at the first failing step and exits with its code (123 if all passed but QEMU's
vIOMMU refused a device DMA).

Options:
      --noiommu   Run without vIOMMU, in VFIO no-IOMMU mode
  -v, --verbose   Show the guest init's lines and kernel warnings
  -h, --help      Print this help";

const CIRCLES_HELP: &str = "\
List the import circles between the files of each crate

Usage: cargo xtask circles

A module imports another when it names it, or an item in it, through `crate::`, `super::` or
`self::` (test code and a child's use of its ancestors' own items do not count). A circle is a
set of files none of which can be read without the others; `cargo test -p xtask` fails on any.
Exits 1 when there is one.";

/// What the command line asks for.
#[derive(Debug)]
pub enum Task {
    /// Print this text and exit 0.
    Help(&'static str),
    /// `setup`.
    Setup,
    /// `vm`.
    Vm(VmArgs),
    /// `test`.
    Test(TestArgs),
    /// `demo`: the mode and verbosity.
    Demo(Mode, bool),
    /// `bench`.
    Bench(crate::bench::BenchArgs),
    /// `fuzz`.
    Fuzz(crate::fuzz::FuzzArgs),
    /// `circles`.
    Circles,
    /// `fio-engine`: the release build or the debug one.
    FioEngine {
        /// `--release`.
        release: bool,
    },
}

/// Options of `cargo xtask test`.
#[derive(Debug, Clone)]
pub struct TestArgs {
    /// Skip setup and the guest.
    pub host_only: bool,
    /// Test-name substring.
    pub filter: Option<String>,
    /// Modes to boot, in order.
    pub modes: Vec<Mode>,
    /// Limit per boot.
    pub timeout: Duration,
    /// Show init lines and kernel warnings.
    pub verbose: bool,
    /// Guest kernels to boot, the default first.
    pub kernels: Vec<GuestKernel>,
    /// Emulators to boot, the default first.
    pub qemus: Vec<Emulator>,
}

/// Parses the arguments after `cargo xtask`.
pub fn parse(args: Vec<OsString>) -> Result<Task> {
    let mut p = Parser {
        args: args.into_iter(),
    };
    let Some(cmd) = p.next_str()? else {
        return Ok(Task::Help(HELP));
    };
    match cmd.as_str() {
        "-h" | "--help" | "help" => Ok(Task::Help(match p.next_str()?.as_deref() {
            Some("setup") => SETUP_HELP,
            Some("vm") => VM_HELP,
            Some("test") => TEST_HELP,
            Some("demo") => DEMO_HELP,
            Some("bench") => crate::bench::HELP,
            Some("fuzz") => crate::fuzz::HELP,
            Some("fio-engine") => FIO_ENGINE_HELP,
            Some("circles") => CIRCLES_HELP,
            _ => HELP,
        })),
        "setup" => {
            if let Some(a) = p.next_str()? {
                return match a.as_str() {
                    "-h" | "--help" => Ok(Task::Help(SETUP_HELP)),
                    _ => Err(err!("setup: unexpected argument {a:?}")),
                };
            }
            Ok(Task::Setup)
        }
        "circles" => match p.next_str()? {
            None => Ok(Task::Circles),
            Some(a) if a == "-h" || a == "--help" => Ok(Task::Help(CIRCLES_HELP)),
            Some(a) => Err(err!("circles: unexpected argument {a:?}")),
        },
        "fio-engine" => {
            let mut release = false;
            while let Some(a) = p.next_str()? {
                match a.as_str() {
                    "--release" => release = true,
                    "-h" | "--help" => return Ok(Task::Help(FIO_ENGINE_HELP)),
                    _ => return Err(err!("fio-engine: unexpected argument {a:?}")),
                }
            }
            Ok(Task::FioEngine { release })
        }
        "vm" => parse_vm(p),
        "test" => parse_test(p),
        "demo" => {
            let (mut mode, mut verbose) = (Mode::Iommu, false);
            while let Some(a) = p.next_str()? {
                match a.as_str() {
                    "--noiommu" => mode = Mode::NoIommu,
                    "-v" | "--verbose" => verbose = true,
                    "-h" | "--help" => return Ok(Task::Help(DEMO_HELP)),
                    _ => return Err(err!("demo: unexpected argument {a:?}")),
                }
            }
            Ok(Task::Demo(mode, verbose))
        }
        "bench" => {
            let mut rest = Vec::new();
            while let Some(a) = p.next_str()? {
                rest.push(a);
            }
            Ok(crate::bench::parse(&rest)?.map_or(Task::Help(crate::bench::HELP), Task::Bench))
        }
        "fuzz" => {
            let mut rest = Vec::new();
            while let Some(a) = p.next_str()? {
                rest.push(a);
            }
            Ok(crate::fuzz::parse(&rest)?.map_or(Task::Help(crate::fuzz::HELP), Task::Fuzz))
        }
        _ => Err(err!("unknown command {cmd:?}; try `cargo xtask --help`")),
    }
}

fn parse_vm(mut p: Parser) -> Result<Task> {
    let mut a = VmArgs {
        mode: Mode::Iommu,
        timeout: Duration::from_secs(600),
        mem: "2G".into(),
        smp: 2,
        modules: None,
        hugepages: 0,
        run_dir: None,
        keep_run_dir: false,
        no_build: false,
        print_cmd: false,
        verbose: false,
        command: Vec::new(),
        hotplug: false,
        kernel: DEFAULT_KERNEL,
        qemu: DEFAULT_EMULATOR,
        hugepages_1g: 0,
        numa_nodes: 1,
        big_ns_mib: 0,
    };
    while let Some(arg) = p.args.next() {
        let s = arg.to_string_lossy().into_owned();
        let (name, inline) = split_eq(&s);
        match name {
            "--" => {
                a.command = p.args.by_ref().collect();
                break;
            }
            "-h" | "--help" => return Ok(Task::Help(VM_HELP)),
            "--noiommu" => a.mode = Mode::NoIommu,
            "--mode" => {
                let v = p.value(name, inline)?;
                a.mode = Mode::from_name(&v)
                    .ok_or_else(|| err!("vm: --mode takes iommu, noiommu or iommufd, not {v:?}"))?
            }
            "--keep-run-dir" => a.keep_run_dir = true,
            "--no-build" => a.no_build = true,
            "--print-cmd" => a.print_cmd = true,
            "--hotplug" => a.hotplug = true,
            "-v" | "--verbose" => a.verbose = true,
            "--timeout" => a.timeout = secs(&p.value(name, inline)?)?,
            "--mem" => a.mem = p.value(name, inline)?,
            "--smp" => a.smp = number(name, &p.value(name, inline)?)?,
            "--hugepages" => a.hugepages = number(name, &p.value(name, inline)?)?,
            "--run-dir" => a.run_dir = Some(p.value(name, inline)?.into()),
            "--kernel" => a.kernel = kernel_by_name(&p.value(name, inline)?)?,
            "--qemu" => a.qemu = emulator_by_name(&p.value(name, inline)?)?,
            "--hugepages-1g" => a.hugepages_1g = number(name, &p.value(name, inline)?)?,
            "--numa" => a.numa_nodes = number(name, &p.value(name, inline)?)?,
            "--big-ns" => a.big_ns_mib = size_mib(name, &p.value(name, inline)?)?,
            "--modules" => {
                let v = p.value(name, inline)?;
                a.modules = Some(v.split(',').filter(|m| !m.is_empty()).map(String::from).collect());
            }
            _ if s.starts_with('-') => return Err(err!("vm: unknown option {s:?}")),
            _ => {
                // The command may also follow the options without `--`.
                a.command.push(arg);
                a.command.extend(p.args.by_ref());
                break;
            }
        }
    }
    if a.command.is_empty() && !a.print_cmd {
        return Err(err!(
            "vm: no command given; usage: cargo xtask vm [OPTIONS] -- <COMMAND> [ARGS]..."
        ));
    }
    if a.smp == 0 {
        return Err(err!("vm: --smp must be at least 1"));
    }
    if a.mode == Mode::Iommufd && !a.kernel.iommufd {
        return Err(err!("vm: {}", iommufd_refused(a.kernel)));
    }
    Ok(Task::Vm(a))
}

fn parse_test(mut p: Parser) -> Result<Task> {
    let mut a = TestArgs {
        host_only: false,
        filter: None,
        modes: vec![Mode::Iommu, Mode::NoIommu, Mode::Iommufd],
        timeout: Duration::from_secs(900),
        verbose: false,
        kernels: KERNELS.to_vec(),
        qemus: EMULATORS.to_vec(),
    };
    while let Some(s) = p.next_str()? {
        let (name, inline) = split_eq(&s);
        match name {
            "-h" | "--help" => return Ok(Task::Help(TEST_HELP)),
            "--host-only" => a.host_only = true,
            "-v" | "--verbose" => a.verbose = true,
            "--filter" => a.filter = Some(p.value(name, inline)?),
            "--timeout" => a.timeout = secs(&p.value(name, inline)?)?,
            "--kernel" => {
                a.kernels = match p.value(name, inline)?.as_str() {
                    "all" => KERNELS.to_vec(),
                    v => vec![kernel_by_name(v)?],
                }
            }
            "--qemu" => a.qemus = emulators_by_names(&p.value(name, inline)?)?,
            "--mode" => {
                a.modes = match p.value(name, inline)?.as_str() {
                    "both" => vec![Mode::Iommu, Mode::NoIommu],
                    "all" => vec![Mode::Iommu, Mode::NoIommu, Mode::Iommufd],
                    v => vec![Mode::from_name(v).ok_or_else(|| {
                        err!("test: --mode takes iommu, noiommu, iommufd, both or all, not {v:?}")
                    })?],
                }
            }
            _ => return Err(err!("test: unexpected argument {s:?}")),
        }
    }
    if a.modes == [Mode::Iommufd] && !a.kernels.iter().any(|k| k.iommufd) {
        return Err(err!("test: {}", iommufd_refused(a.kernels[0])));
    }
    Ok(Task::Test(a))
}

struct Parser {
    args: std::vec::IntoIter<OsString>,
}

impl Parser {
    fn next_str(&mut self) -> Result<Option<String>> {
        self.args
            .next()
            .map(|a| a.into_string().map_err(|a| err!("argument {a:?} is not UTF-8")))
            .transpose()
    }

    /// The value of option `name`: after `=`, or the next argument.
    fn value(&mut self, name: &str, inline: Option<&str>) -> Result<String> {
        match inline {
            Some(v) => Ok(v.to_string()),
            None => self.next_str()?.ok_or_else(|| err!("{name} needs a value")),
        }
    }
}

/// `--opt=value` → (`--opt`, `Some("value")`); anything else → (arg, `None`).
fn split_eq(s: &str) -> (&str, Option<&str>) {
    match s.split_once('=') {
        Some((n, v)) if n.starts_with("--") => (n, Some(v)),
        _ => (s, None),
    }
}

fn number(name: &str, v: &str) -> Result<u32> {
    v.parse()
        .map_err(|_| err!("{name} takes a whole number, not {v:?}"))
}

/// A namespace size for `--big-ns`: `1G`, `512M` or `512` (MiB), 16 MiB to 64 GiB (the images
/// are sparse: only what the guest writes takes host disk space).
fn size_mib(name: &str, v: &str) -> Result<u64> {
    let t = v.trim();
    let (num, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let shift = match unit.to_ascii_uppercase().as_str() {
        "" | "M" | "MIB" => 0,
        "G" | "GIB" => 10,
        _ => return Err(err!("{name} takes a size such as 1G or 512M, not {v:?}")),
    };
    let mib = num
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_shl(shift))
        .ok_or_else(|| err!("{name} takes a size such as 1G or 512M, not {v:?}"))?;
    if !(16..=64 << 10).contains(&mib) {
        return Err(err!("{name} takes 16M to 64G, not {v:?}"));
    }
    Ok(mib)
}

fn secs(v: &str) -> Result<Duration> {
    let n: u64 = v
        .parse()
        .map_err(|_| err!("--timeout takes seconds, not {v:?}"))?;
    Ok(Duration::from_secs(n))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &[&str]) -> Vec<OsString> {
        s.iter().map(OsString::from).collect()
    }

    #[test]
    fn vm_options_and_command() {
        let Task::Vm(a) = parse(args(&[
            "vm",
            "--noiommu",
            "--timeout=30",
            "--modules",
            "",
            "--hugepages",
            "8",
            "--",
            "sh",
            "-c",
            "exit 3",
        ]))
        .unwrap() else {
            panic!("not vm")
        };
        assert_eq!(a.mode, Mode::NoIommu);
        assert_eq!(a.timeout, Duration::from_secs(30));
        assert_eq!(a.modules, Some(vec![]));
        assert_eq!(a.hugepages, 8);
        assert_eq!(a.command, args(&["sh", "-c", "exit 3"]));
        assert_eq!(a.qemu, DEFAULT_EMULATOR);
        let Task::Vm(a) = parse(args(&[
            "vm",
            "--qemu=10",
            "--hugepages-1g",
            "4",
            "--numa",
            "2",
            "true",
        ]))
        .unwrap() else {
            panic!("not vm")
        };
        assert_eq!(a.qemu, crate::setup_qemu::QEMU_10);
        assert_eq!((a.hugepages_1g, a.numa_nodes), (4, 2));
        assert_eq!(a.big_ns_mib, 0);
        assert!(parse(args(&["vm", "--qemu", "8", "true"])).is_err());
        for (v, mib) in [("1G", 1024), ("512M", 512), ("300", 300), ("2gib", 2048)] {
            let Task::Vm(a) = parse(args(&["vm", "--big-ns", v, "true"])).unwrap() else {
                panic!("not vm")
            };
            assert_eq!(a.big_ns_mib, mib, "{v}");
        }
        for v in ["", "1T", "8M", "65G", "x", "1.5G", "99999999999999999999G"] {
            assert!(
                parse(args(&["vm", "--big-ns", v, "true"])).is_err(),
                "{v:?} accepted"
            );
        }
    }

    #[test]
    fn vm_command_options_are_not_ours() {
        let Task::Vm(a) = parse(args(&["vm", "ls", "--help"])).unwrap() else {
            panic!("not vm")
        };
        assert_eq!(a.command, args(&["ls", "--help"]));
        assert!(parse(args(&["vm"])).is_err());
        assert!(parse(args(&["vm", "--bogus", "--", "x"])).is_err());
    }

    #[test]
    fn test_options() {
        let Task::Test(a) = parse(args(&[
            "test",
            "--mode",
            "noiommu",
            "--filter=nvme",
            "--host-only",
        ]))
        .unwrap() else {
            panic!("not test")
        };
        assert_eq!(a.modes, vec![Mode::NoIommu]);
        assert_eq!(a.filter.as_deref(), Some("nvme"));
        assert!(a.host_only);
        assert_eq!(a.qemus, EMULATORS);
        assert!(parse(args(&["test", "--mode", "kvm"])).is_err());
        let Task::Test(a) = parse(args(&["test", "--qemu", "10"])).unwrap() else {
            panic!("not test")
        };
        assert_eq!(a.qemus, [crate::setup_qemu::QEMU_10]);
    }

    #[test]
    fn iommufd_mode_needs_the_612_kernel() {
        let Task::Vm(a) = parse(args(&["vm", "--kernel", "6.12", "--mode", "iommufd", "true"])).unwrap()
        else {
            panic!("not vm")
        };
        assert_eq!((a.mode, a.kernel.name), (Mode::Iommufd, "6.12"));
        let e = parse(args(&["vm", "--mode", "iommufd", "true"])).unwrap_err().0;
        assert!(e.contains("kernel 6.1 ") && e.contains("--kernel 6.12"), "{e}");
        assert!(parse(args(&["vm", "--mode", "both", "true"])).is_err());
        let e = parse(args(&["test", "--mode", "iommufd", "--kernel", "6.1"]))
            .unwrap_err()
            .0;
        assert!(e.contains("--kernel 6.12"), "{e}");
        let Task::Test(a) = parse(args(&["test", "--mode=iommufd", "--kernel", "6.12"])).unwrap() else {
            panic!("not test")
        };
        assert_eq!(a.modes, [Mode::Iommufd]);
        let Task::Test(a) = parse(args(&["test"])).unwrap() else {
            panic!("not test")
        };
        assert_eq!(a.modes, [Mode::Iommu, Mode::NoIommu, Mode::Iommufd]);
    }

    #[test]
    fn help() {
        assert!(matches!(parse(args(&[])).unwrap(), Task::Help(HELP)));
        assert!(matches!(
            parse(args(&["vm", "--help"])).unwrap(),
            Task::Help(VM_HELP)
        ));
        assert!(matches!(
            parse(args(&["help", "test"])).unwrap(),
            Task::Help(TEST_HELP)
        ));
        // The exit codes the help promises are the ones `cargo xtask vm` uses.
        use crate::vm::{EXIT_IOMMU_FAULT, EXIT_NO_CODE, EXIT_TIMEOUT};
        for code in [EXIT_TIMEOUT, EXIT_NO_CODE, EXIT_IOMMU_FAULT] {
            assert!(VM_HELP.contains(&format!(" {code} ")), "{code}");
        }
    }
}
