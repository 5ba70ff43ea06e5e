//! `cargo xtask vm`: boot the test-bed guest, run one command in it, return its exit code.
//!
//! The command travels as a bash script, `<run-dir>/out/job.sh`, over the read-write 9p share
//! `out`; the guest's `/init` runs it chrooted into the host's `/` and writes its exit status to
//! `/out/exit-code`. The serial console carries the command's output (stdout and stderr merged)
//! and a few `vm: ` lines of the init, which are hidden unless `--verbose`.
//!
//! QEMU's QMP socket is `<run-dir>/qmp.sock` (or a short path when that one is too long:
//! [`crate::qmp::socket_path`]); a guest test asks for QMP commands (device_del,
//! device_add) through files in `/out/qmp/` that an agent of this process serves (see
//! [`crate::qmp`]). With [`Boot::hotplug`], NVMe controller R (serial `vfpoll-r`, one 64 MiB
//! namespace) sits behind a PCIe root port (slot 00:0c.0, so R is 0000:01:00.0 in the guest) and
//! can be unplugged and plugged back. With [`Machine::big_ns_mib`] (`--big-ns`), NVMe
//! controllers G and H ([`BIG_NS`]) each bring one namespace of that size.

use std::ffi::OsString;
use std::fs;
use std::io::{self, IsTerminal, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::mode::Mode;
use crate::setup::{self, module_name, Assets, GuestKernel};
use crate::setup_qemu::Emulator;
use crate::util::{err, mkdir, secs, shell_quote_bytes, write, Context, Lock, Result};
use crate::Workspace;

/// Modules loaded before the command unless `--modules` says otherwise: every test device
/// starts on its kernel driver, as on a real machine, and vfio-pci is ready to take it over.
pub const DEFAULT_MODULES: &[&str] = &["nvme", "e1000e", "virtio_net", "vfio-pci", "vfio_iommu_type1"];

/// Exit code when the guest ran past the time limit (as `timeout(1)`).
pub const EXIT_TIMEOUT: u8 = 124;
/// Exit code when the guest reported no exit code (boot failure, panic, QEMU error).
pub const EXIT_NO_CODE: u8 = 125;
/// Exit code of `cargo xtask vm` when the command succeeded but QEMU's vIOMMU refused a DMA
/// (see [`console::is_iommu_fault`]).
pub const EXIT_IOMMU_FAULT: u8 = 123;

/// Where [`run_boot`] writes the vIOMMU fault lines of a boot, in the run dir (absent when
/// there were none).
pub const IOMMU_FAULTS_FILE: &str = "iommu-faults.txt";

/// Host variables passed into the guest as they are (besides every `VFPOLL_*`).
const PASS_ENV: &[&str] = &["RUST_LOG", "RUST_BACKTRACE"];

/// Options of `cargo xtask vm`.
#[derive(Debug, Clone)]
pub struct VmArgs {
    /// Boot without vIOMMU, in vfio no-IOMMU mode.
    pub mode: Mode,
    /// Limit for the whole boot.
    pub timeout: Duration,
    /// `-m`.
    pub mem: String,
    /// `-smp`.
    pub smp: u32,
    /// Modules to load before the command; `None`: the default list.
    pub modules: Option<Vec<String>>,
    /// 2 MiB pages to reserve.
    pub hugepages: u32,
    /// Run dir; `None`: the default for the mode.
    pub run_dir: Option<PathBuf>,
    /// Reuse the run dir's images.
    pub keep_run_dir: bool,
    /// Skip `cargo build`.
    pub no_build: bool,
    /// Print the QEMU command line only.
    pub print_cmd: bool,
    /// Show init lines and kernel warnings.
    pub verbose: bool,
    /// The command and its arguments.
    pub command: Vec<OsString>,
    /// `--hotplug`.
    pub hotplug: bool,
    /// `--kernel`.
    pub kernel: GuestKernel,
    /// `--qemu`.
    pub qemu: Emulator,
    /// `--hugepages-1g`.
    pub hugepages_1g: u32,
    /// `--numa`.
    pub numa_nodes: u32,
    /// `--big-ns`, in MiB; 0: none.
    pub big_ns_mib: u64,
}

/// One boot, fully described.
#[derive(Debug, Clone)]
pub struct Boot {
    /// IOMMU mode.
    pub mode: Mode,
    /// Limit for the whole boot.
    pub timeout: Duration,
    /// `-m`.
    pub mem: String,
    /// `-smp`.
    pub smp: u32,
    /// Modules to load before the command.
    pub modules: Vec<String>,
    /// 2 MiB pages to reserve before the command.
    pub hugepages: u32,
    /// Images, `gpubar.shm`, `out/`.
    pub run_dir: PathBuf,
    /// Keep the images of an earlier boot.
    pub keep_run_dir: bool,
    /// Show `vm: ` lines and kernel warnings.
    pub verbose: bool,
    /// Working directory of the command (a host path; the guest sees the host's `/`).
    pub cwd: PathBuf,
    /// Variables set for the command, after those passed through from the host.
    pub env: Vec<(OsString, OsString)>,
    /// The command and its arguments.
    pub command: Vec<OsString>,
    /// Add hot-pluggable NVMe controller R behind a PCIe root port (see the module docs).
    pub hotplug: bool,
    /// The emulator, 1 GiB pages and NUMA nodes.
    pub machine: Machine,
}

/// What a boot's machine is beyond the fixed devices: which QEMU runs it (`--qemu`), 1 GiB
/// hugepages reserved on the kernel command line (`--hugepages-1g`) and guest NUMA nodes
/// (`--numa`). The default is the host's QEMU 7.2, no 1 GiB pages, no NUMA.
#[derive(Debug, Clone, Default)]
pub struct Machine {
    /// The emulator to run.
    pub qemu: crate::setup_qemu::Qemu,
    /// 1 GiB pages the guest kernel reserves at boot (`hugepagesz=1G hugepages=N`): gigantic
    /// pages can only be had reliably before memory fragments. With NUMA nodes the kernel
    /// spreads them over the nodes, round robin.
    pub hugepages_1g: u32,
    /// Guest NUMA nodes; 0 or 1: none declared. With 2 or more, memory (`-m`) and CPUs
    /// (`-smp`) are split evenly over them, and NVMe controller N sits on the last node (see
    /// [`NUMA_NVME_SERIAL`]).
    pub numa_nodes: u32,
    /// MiB of each of the two big namespaces ([`BIG_NS`]: NVMe controllers G and H, one
    /// namespace each, sparse images); 0: no such controllers (the default).
    pub big_ns_mib: u64,
}

/// With [`Machine::big_ns_mib`] > 0, two more NVMe controllers, each with one namespace of that
/// size on a sparse image (for the store's tests and benchmarks, which need namespaces bigger
/// than the fixed 64 MiB ones, on two controllers): (QEMU id, serial, PCI slot, image,
/// `nvme-ns` options). G has 512-byte blocks, H 4 KiB blocks; both allow 2 MiB transfers
/// (MDTS 9).
pub const BIG_NS: [(&str, &str, u8, &str, &str); 2] = [
    ("nvmeg", "vfpoll-g", 0xe, "nvme-g-ns1.img", ""),
    (
        "nvmeh",
        "vfpoll-h",
        0xf,
        "nvme-h-ns1.img",
        ",logical_block_size=4096,physical_block_size=4096",
    ),
];

/// With NUMA nodes ([`Machine::numa_nodes`] >= 2): NVMe controller N (serial `vfpoll-n`, one
/// 64 MiB namespace) sits behind a PCI Express expander bridge (`pxb-pcie`, bus 0x80,
/// `numa_node` = the last node) and a root port, so it is 0000:81:00.0 in the guest and its
/// `numa_node` in sysfs is that node (QEMU gives the expander's bus an ACPI `_PXM`).
pub const NUMA_NVME_SERIAL: &str = "vfpoll-n";

/// QEMU's id of hot-pluggable controller R (for `device_del`/`device_add`).
pub const HOTPLUG_ID: &str = "nvmer";
/// The PCIe root port R sits behind.
pub const HOTPLUG_PORT: &str = "rp1";
/// The block node of R's namespace (a `-blockdev`, which outlives an unplug of R): R is plugged
/// back with `device_add` of `{"driver":"nvme","id":"nvmer","bus":"rp1","serial":"vfpoll-r",
/// "drive":"nvmer1"}`.
pub const HOTPLUG_NODE: &str = "nvmer1";

/// How a boot ended.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The command's exit code, or [`EXIT_TIMEOUT`] / [`EXIT_NO_CODE`].
    pub code: u8,
    /// From QEMU's start to the job's start, when the job started.
    pub boot: Option<Duration>,
    /// QEMU's stderr lines that say a device DMA was refused ([`console::is_iommu_fault`]), in order.
    /// Each is a bug: a DMA to an address the driver never mapped. Empty without a vIOMMU.
    pub iommu_faults: Vec<String>,
    /// The signal that ended QEMU itself (not the harness's timeout kill): QEMU crashed.
    pub qemu_signal: Option<i32>,
    /// QEMU exited with an error before the job started: its last stderr line.
    pub qemu_error: Option<String>,
}

/// `cargo xtask vm`.
pub fn main(ws: &Workspace, a: &VmArgs) -> Result<u8> {
    let boot = Boot {
        mode: a.mode,
        timeout: a.timeout,
        mem: a.mem.clone(),
        smp: a.smp,
        modules: a
            .modules
            .clone()
            .unwrap_or_else(|| DEFAULT_MODULES.iter().map(|s| s.to_string()).collect()),
        hugepages: a.hugepages,
        run_dir: match &a.run_dir {
            Some(d) => std::env::current_dir()?.join(d),
            None => default_run_dir(ws, a.mode.name()),
        },
        keep_run_dir: a.keep_run_dir,
        verbose: a.verbose,
        cwd: std::env::current_dir().context("current directory")?,
        env: Vec::new(),
        command: a.command.clone(),
        hotplug: a.hotplug,
        machine: Machine {
            qemu: crate::setup_qemu::current(ws, a.qemu)?,
            hugepages_1g: a.hugepages_1g,
            numa_nodes: a.numa_nodes,
            big_ns_mib: a.big_ns_mib,
        },
    };
    if a.print_cmd {
        let assets = setup::current(ws, a.kernel)?;
        let q = qemu_command(&assets, &boot)?;
        let _ = writeln!(io::stdout(), "{}", crate::util::show(&q));
        return Ok(0);
    }
    let assets = setup::ensure_kernel(ws, a.kernel)?;
    let mut boot = boot;
    boot.machine.qemu = crate::setup_qemu::ensure(ws, a.qemu)?;
    if !a.no_build {
        crate::build::build_bins(ws)?;
    }
    // Boots may run side by side (each is one TCG process): an explicit run dir is waited
    // for, the default one is replaced by `<mode>-2`, `<mode>-3`, ... while it is busy.
    let lock = if a.run_dir.is_some() {
        lock_run_dir(&boot.run_dir)?
    } else {
        let mut n = 1;
        loop {
            if let Some(l) = Lock::try_acquire(&mkdir(&boot.run_dir)?.join("lock"))? {
                break l;
            }
            n += 1;
            boot.run_dir = default_run_dir(ws, &format!("{}-{n}", a.mode.name()));
        }
    };
    let out = run_boot(ws, &assets, &boot, &lock)?;
    if out.iommu_faults.is_empty() {
        return Ok(out.code);
    }
    let file = boot.run_dir.join(IOMMU_FAULTS_FILE);
    eprintln!("vm: error: {}", fault_report(&out.iommu_faults, &file));
    // A command that failed keeps its own exit code; one that passed fails here.
    Ok(if out.code == 0 { EXIT_IOMMU_FAULT } else { out.code })
}

/// Takes `<dir>/lock`, waiting while another xtask boots in `dir`. Hold it for as long as
/// the run dir is in use (the boot, and host checks of what it left).
pub fn lock_run_dir(dir: &Path) -> Result<Lock> {
    Lock::acquire(&mkdir(dir)?.join("lock"))
}

/// `target/testbed/run/<name>`.
pub fn default_run_dir(ws: &Workspace, name: &str) -> PathBuf {
    ws.testbed().join("run").join(name)
}

/// Prepares the run dir, boots, streams the console and returns the outcome. `_lock` is the
/// run dir's lock ([`lock_run_dir`]). vIOMMU faults in QEMU's stderr are collected into the
/// outcome and written to [`IOMMU_FAULTS_FILE`]; the verdict is the caller's (a boot that
/// expects none fails with [`fault_report`]).
pub fn run_boot(ws: &Workspace, assets: &Assets, b: &Boot, _lock: &Lock) -> Result<Outcome> {
    for m in &boot_modules(b) {
        if !assets.modules.contains(&module_name(m)) {
            return Err(err!(
                "module {m} is not in the initramfs; it has: {}",
                assets.modules.join(" ")
            ));
        }
    }
    prepare_run_dir(b)?;
    write(&b.run_dir.join("out/job.sh"), job_script(ws, b))?;
    let lib_modules = assets.boot_files(b.mode)?.1;
    write(
        &b.run_dir.join("out/lib-modules"),
        format!("{}\n", lib_modules.display()),
    )?;
    let mut qemu = qemu_command(assets, b)?;
    write(&b.run_dir.join("qemu-cmd.txt"), crate::util::show(&qemu) + "\n")?;
    eprintln!("vm: run dir {}", b.run_dir.display());

    let t0 = Instant::now();
    let mut child = qemu
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context(format_args!("cannot start {}", b.machine.qemu.binary.display()))?;
    let stdout = child.stdout.take().expect("piped");
    let stderr = child.stderr.take().expect("piped");
    let log = fs::File::create(b.run_dir.join("console.log"))?;
    let verbose = b.verbose;
    let (tx, rx) = mpsc::channel();
    let console = thread::spawn(move || {
        let started = stream_console(stdout, log, verbose, t0);
        let _ = tx.send(());
        started
    });
    let errors = thread::spawn(move || filter_stderr(stderr, io::stderr()));
    let agent = crate::qmp::Agent::start(&b.run_dir);

    let timed_out = match rx.recv_timeout(b.timeout) {
        Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => false,
        Err(mpsc::RecvTimeoutError::Timeout) => {
            let _ = child.kill();
            true
        }
    };
    let status = child.wait()?;
    let total = t0.elapsed();
    match agent {
        Ok(a) => drop(a),
        Err(e) => eprintln!("vm: warning: the QMP agent did not start: {e}"),
    }
    let started = console.join().unwrap_or(None);
    let QemuStderr {
        faults: iommu_faults,
        last,
    } = errors.join().unwrap_or_default();
    // QEMU that exits with an error before the guest ran its job refused the command line or
    // a resource (a socket path, an image lock): that line is the reason, not the guest.
    let qemu_error = (started.is_none() && !timed_out && status.code().is_some_and(|c| c != 0))
        .then(|| last.unwrap_or_else(|| format!("QEMU exited with {status}")));

    let code = if timed_out {
        eprintln!("vm: timeout after {}: guest killed", secs(b.timeout));
        EXIT_TIMEOUT
    } else {
        match fs::read_to_string(b.run_dir.join("out/exit-code")) {
            Ok(s) => s.trim().parse::<u8>().unwrap_or(EXIT_NO_CODE),
            Err(_) => {
                eprintln!(
                    "vm: the guest reported no exit code (qemu: {status}); see {}",
                    b.run_dir.join("console.log").display()
                );
                EXIT_NO_CODE
            }
        }
    };
    let boot = started.map(|s| s - t0);
    eprintln!(
        "vm: exit code {code}; job started after {}, {} in all",
        boot.map_or("-".into(), secs),
        secs(total)
    );
    if !iommu_faults.is_empty() {
        let path = b.run_dir.join(IOMMU_FAULTS_FILE);
        write(&path, iommu_faults.join("\n") + "\n")?;
        eprintln!(
            "vm: {} vIOMMU fault line(s) in QEMU's stderr, kept in {}",
            iommu_faults.len(),
            path.display()
        );
    }
    let qemu_signal = if timed_out {
        None
    } else {
        std::os::unix::process::ExitStatusExt::signal(&status)
    };
    Ok(Outcome {
        code,
        boot,
        iommu_faults,
        qemu_signal,
        qemu_error,
    })
}

/// The image files of the guest's NVMe namespaces: (file, size in MiB).
pub const IMAGES: &[(&str, u64)] = &[
    ("nvme-a-ns1.img", 64),
    ("nvme-a-ns2.img", 32),
    ("nvme-b-ns1.img", 64),
    ("nvme-s-ns1.img", 64),
    // Controller F, one namespace per format (see qemu_command).
    ("nvme-f-ns1.img", 16),
    ("nvme-f-ns2.img", 16),
    ("nvme-f-ns3.img", 16),
    ("nvme-f-ns4.img", 16),
    ("nvme-f-ns5.img", 8),
    ("nvme-f-ns6.img", 16),
    ("nvme-f-ns7.img", 4),
    // Controller R, only with `Boot::hotplug`.
    ("nvme-r-ns1.img", 64),
    // Controller N, only with NUMA nodes (`Machine::numa_nodes`).
    ("nvme-n-ns1.img", 64),
];
/// The ivshmem backing file (the GPU-BAR stand-in) and its size in MiB.
pub const GPUBAR: (&str, u64) = ("gpubar.shm", 64);

/// Fresh zeroed (sparse) images and `gpubar.shm`, an empty `out/`; with `keep_run_dir` only
/// what is missing is created and the old images keep their data.
fn prepare_run_dir(b: &Boot) -> Result<()> {
    let dir = mkdir(&b.run_dir)?;
    let out = dir.join("out");
    if !b.keep_run_dir {
        for (f, _) in IMAGES.iter().chain([&GPUBAR]) {
            remove_file(&dir.join(f))?;
        }
        for (.., f, _) in BIG_NS {
            remove_file(&dir.join(f))?;
        }
        if out.exists() {
            fs::remove_dir_all(&out).context(out.display())?;
        }
    }
    mkdir(&out)?;
    // The faults of an earlier boot must not be taken for this one's, images kept or not.
    remove_file(&dir.join(IOMMU_FAULTS_FILE))?;
    for f in ["job.sh", "exit-code", "lib-modules"] {
        remove_file(&out.join(f))?;
    }
    // Requests of an earlier boot must not be served again.
    let qmp_dir = out.join(crate::qmp::REQUEST_DIR);
    if qmp_dir.exists() {
        fs::remove_dir_all(&qmp_dir).context(qmp_dir.display())?;
    }
    remove_file(&crate::qmp::socket_path(&dir))?;
    let big = BIG_NS.iter().map(|&(.., f, _)| (f, b.machine.big_ns_mib));
    let big = big.filter(|&(_, mib)| mib > 0);
    for (f, mib) in IMAGES.iter().chain([&GPUBAR]).copied().chain(big) {
        let p = dir.join(f);
        if !p.exists() {
            fs::File::create(&p)
                .and_then(|f| f.set_len(mib << 20))
                .context(p.display())?;
        }
    }
    Ok(())
}

fn remove_file(p: &Path) -> Result<()> {
    match fs::remove_file(p) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(err!("{}: {e}", p.display())),
        _ => Ok(()),
    }
}

/// The bash script the guest runs: environment, hugepages, `cd`, then the command.
fn job_script(ws: &Workspace, b: &Boot) -> Vec<u8> {
    let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(k, _)| {
            let k = k.to_string_lossy();
            PASS_ENV.contains(&k.as_ref()) || k.starts_with("VFPOLL_")
        })
        .collect();
    env.sort();
    let path = format!(
        "{}:{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        ws.target.join("debug").display(),
        ws.target.join("release").display()
    );
    env.push(("PATH".into(), path.into()));
    env.push(("HOME".into(), "/root".into()));
    // The command's stdout is the guest's console, a terminal; when ours is not, tell tools
    // not to colour their output.
    if io::stdout().is_terminal() {
        env.extend(std::env::var_os("TERM").map(|t| ("TERM".into(), t)));
    } else {
        env.push(("TERM".into(), "dumb".into()));
        env.push(("NO_COLOR".into(), "1".into()));
    }
    env.extend(b.env.iter().cloned());
    env.push(("VFPOLL_TESTBED".into(), b.mode.name().into()));
    env.push(("VFPOLL_TESTBED_OUT".into(), "/out".into()));

    let mut s = b"# written by `cargo xtask vm`; run by the guest's /init\n".to_vec();
    for (k, v) in env {
        let k = k.to_string_lossy();
        if k.is_empty() || !k.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_') {
            continue;
        }
        s.extend_from_slice(format!("export {k}=").as_bytes());
        s.extend(shell_quote_bytes(v.as_bytes()));
        s.push(b'\n');
    }
    if b.hugepages > 0 {
        let n = b.hugepages;
        s.extend_from_slice(
            format!(
                "echo {n} > /proc/sys/vm/nr_hugepages\n\
                 read -r got < /proc/sys/vm/nr_hugepages\n\
                 [ \"$got\" = {n} ] || {{ echo \"vm: error: only $got of {n} hugepages\"; exit {EXIT_NO_CODE}; }}\n"
            )
            .as_bytes(),
        );
    }
    if b.mode == Mode::Iommufd {
        s.extend_from_slice(
            format!(
                "[ -c /dev/iommu ] || {{ echo \"vm: error: mode iommufd, but no /dev/iommu (iommufd.ko not loaded?)\"; exit {EXIT_NO_CODE}; }}\n"
            )
            .as_bytes(),
        );
    }
    s.extend_from_slice(b"cd ");
    s.extend(shell_quote_bytes(b.cwd.as_os_str().as_bytes()));
    s.extend_from_slice(format!(" || exit {EXIT_NO_CODE}\nexec").as_bytes());
    for a in &b.command {
        s.push(b' ');
        s.extend(shell_quote_bytes(a.as_bytes()));
    }
    s.push(b'\n');
    s
}

pub mod console;
mod qemu;
#[cfg(test)]
mod tests;

pub use console::fault_report;
use console::{filter_stderr, stream_console, QemuStderr};
use qemu::boot_modules;
pub use qemu::qemu_command;
