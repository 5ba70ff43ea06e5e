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
use std::io::{self, BufRead, BufReader, IsTerminal, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
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
/// (see [`is_iommu_fault`]).
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
    /// QEMU's stderr lines that say a device DMA was refused ([`is_iommu_fault`]), in order.
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

/// A path inside a QEMU `key=value,...` option (commas doubled).
fn opt_path(p: &Path) -> String {
    p.display().to_string().replace(',', ",,")
}

/// The QEMU command line of a boot. PCI slots are fixed (see the crate docs). An error for
/// mode `iommufd` on a kernel without it.
pub fn qemu_command(assets: &Assets, b: &Boot) -> Result<Command> {
    let run = &b.run_dir;
    let mut q = b.machine.qemu.command();
    q.args(["-machine", "q35", "-accel", "tcg", "-cpu", "max"])
        .args(["-m", &b.mem, "-smp", &b.smp.to_string()])
        // `-nographic` would also make SeaBIOS print (and reset the terminal) on the serial
        // port; this is the same minus that, and without a monitor reading our stdin.
        .args(["-display", "none", "-serial", "stdio", "-monitor", "none"])
        .args(["-no-reboot", "-vga", "none"])
        // Thread names ("CPU 1/TCG", ...) so that a bench can see where the host runs each.
        .args(["-name", "vfpoll,debug-threads=on"])
        .args([
            "-qmp",
            &format!(
                "unix:{},server=on,wait=off",
                opt_path(&crate::qmp::socket_path(run))
            ),
        ]);
    // norandmaps: under TCG an exec at fresh random addresses is retranslated, 2.5-3x slower.
    // mitigations=off: the guest is a test bed, and the barriers cost ~0.3 s of every boot.
    // no_timer_check: on a loaded host the emulated CPU can miss the kernel's early check that
    // the timer interrupt arrives through the (interrupt-remapped) IO-APIC, and the kernel
    // panics ("timer doesn't work through Interrupt-remapped IO-APIC") before the job starts.
    let mut append = format!(
        "console=ttyS0 panic=-1 norandmaps mitigations=off no_timer_check {} vfpoll.mods={}",
        if b.verbose {
            "loglevel=5"
        } else {
            "quiet loglevel=1"
        },
        boot_modules(b).join(",")
    );
    numa_and_huge_1g(&mut q, &mut append, b);
    let initrd = assets.boot_files(b.mode)?.0;
    if b.mode.viommu() {
        // Must come before the PCI devices it translates for.
        q.args(["-device", "intel-iommu,intremap=on,caching-mode=on"]);
        append.push_str(" intel_iommu=on");
    } else {
        append.push_str(" vfio.enable_unsafe_noiommu_mode=1");
    }
    q.arg("-kernel")
        .arg(&assets.vmlinux)
        .arg("-initrd")
        .arg(initrd)
        .args(["-append", &append]);
    let fsdev = |id: &str, path: &str, extra: &str, addr: u8| {
        [
            "-fsdev".to_string(),
            format!("local,id={id},path={path},security_model=none,multidevs=remap{extra}"),
            "-device".to_string(),
            format!("virtio-9p-pci,fsdev={id},mount_tag={id},addr={addr}"),
        ]
    };
    q.args(fsdev("hostroot", "/", ",readonly=on", 1));
    q.args(fsdev("out", &opt_path(&run.join("out")), "", 2));
    let drive = |id: &str, file: &str| {
        [
            "-drive".to_string(),
            format!(
                "file={},if=none,id={id},format=raw,discard=unmap,{}",
                opt_path(&run.join(file)),
                assets.drive_options
            ),
        ]
    };
    q.args(["-device", "nvme,id=nvmea,serial=vfpoll-a,cmb_size_mb=16,addr=3"]);
    q.args(drive("nvmea1", IMAGES[0].0));
    q.args(["-device", "nvme-ns,drive=nvmea1,bus=nvmea,nsid=1"]);
    q.args(drive("nvmea2", IMAGES[1].0));
    q.args([
        "-device",
        "nvme-ns,drive=nvmea2,bus=nvmea,nsid=2,logical_block_size=4096,physical_block_size=4096",
    ]);
    // B allows 4 MiB transfers (MDTS 10): one command needs chained PRP list pages.
    q.args([
        "-device",
        "nvme,id=nvmeb,serial=vfpoll-b,mdts=10,cmb_size_mb=16,addr=4",
    ]);
    q.args(drive("nvmeb1", IMAGES[2].0));
    q.args(["-device", "nvme-ns,drive=nvmeb1,bus=nvmeb,nsid=1"]);
    // An NVM subsystem with two controllers (same serial, as QEMU requires) sharing namespace 1:
    // several controllers of one subsystem, as multi-path devices have.
    q.args([
        "-device",
        "nvme-subsys,id=subsys0,nqn=nqn.2026-11.io.vfpoll:subsys0",
    ]);
    q.args(["-device", "nvme,id=nvmec,serial=vfpoll-s,subsys=subsys0,addr=8"]);
    q.args(["-device", "nvme,id=nvmed,serial=vfpoll-s,subsys=subsys0,addr=9"]);
    q.args(drive("nvmes1", IMAGES[3].0));
    q.args(["-device", "nvme-ns,drive=nvmes1,nsid=1,shared=on"]);
    // Controller F: the namespace formats the driver must handle or refuse: 1 extended LBA
    // (512+8), 2 separate metadata (512+8), 3 PI type 1 (512+8), 4 4096+64 separate metadata
    // with PI type 1 in the first bytes, 5 PI with a 64-bit guard, 6 zoned (4 KiB blocks,
    // 1 MiB zones of 768 KiB capacity, 4 open / 6 active, ZASL 5), 7 plain 512 B (Format NVM).
    q.args(["-device", "nvme,id=nvmef,serial=vfpoll-f,zoned.zasl=5,addr=0xb"]);
    for (i, format) in [
        "ms=8,mset=1",
        "ms=8,mset=0",
        "ms=8,mset=1,pi=1",
        "logical_block_size=4096,physical_block_size=4096,ms=64,mset=0,pi=1,pil=1",
        "ms=16,pi=1,pif=2",
        "logical_block_size=4096,physical_block_size=4096,zoned=on,zoned.zone_size=1M,\
         zoned.zone_capacity=768K,zoned.max_open=4,zoned.max_active=6",
        "",
    ]
    .iter()
    .enumerate()
    {
        let nsid = i + 1;
        q.args(drive(&format!("nvmef{nsid}"), IMAGES[4 + i].0));
        let sep = if format.is_empty() { "" } else { "," };
        q.args([
            "-device",
            &format!("nvme-ns,drive=nvmef{nsid},bus=nvmef,nsid={nsid}{sep}{format}"),
        ]);
    }
    // Two NICs on one QEMU hub: frames go from one to the other and nowhere else.
    // romfile= skips their iPXE option ROMs, which SeaBIOS would otherwise run at every boot.
    for (i, addr) in [(0, 5), (1, 6)] {
        q.args(["-netdev", &format!("hubport,id=hp{i},hubid=0")]);
        q.args([
            "-device",
            &format!(
                "e1000e,netdev=hp{i},mac=52:54:00:00:00:0{},addr={addr},romfile=",
                i + 1
            ),
        ]);
    }
    // A third port on the same hub: virtio-net, modern only (1af4:1041). In IOMMU mode it must
    // translate its DMA through the vIOMMU (VIRTIO_F_ACCESS_PLATFORM), as VFIO maps IOVAs.
    q.args(["-netdev", "hubport,id=hp2,hubid=0"]);
    q.args([
        "-device",
        &format!(
            "virtio-net-pci,netdev=hp2,mac=52:54:00:00:00:03,disable-legacy=on,addr=0xa,romfile={}",
            if b.mode.viommu() { ",iommu_platform=on" } else { "" }
        ),
    ]);
    q.args([
        "-object",
        &format!(
            "memory-backend-file,id=gpubar,mem-path={},size={}M,share=on",
            opt_path(&run.join(GPUBAR.0)),
            GPUBAR.1
        ),
    ]);
    q.args(["-device", "ivshmem-plain,memdev=gpubar,addr=7"]);
    if b.hotplug {
        // R behind a root port: hot-pluggable (q35 handles it with ACPI PCI hotplug). Its
        // namespace is a -blockdev, so an unplug does not delete it and R can be plugged back
        // with device_add (see HOTPLUG_NODE).
        q.args([
            "-device",
            &format!("pcie-root-port,id={HOTPLUG_PORT},chassis=1,slot=1,addr=0xc"),
        ]);
        let img = IMAGES
            .iter()
            .find(|(f, _)| f.starts_with("nvme-r-"))
            .expect("R's image")
            .0;
        let cache = if assets.drive_options.contains("cache=none") {
            ",cache.direct=on"
        } else {
            ""
        };
        q.args([
            "-blockdev",
            &format!(
                "driver=raw,node-name={HOTPLUG_NODE},discard=unmap,file.driver=file,file.filename={}{cache}",
                opt_path(&run.join(img))
            ),
        ]);
        q.args([
            "-device",
            &format!("nvme,id={HOTPLUG_ID},bus={HOTPLUG_PORT},serial=vfpoll-r,drive={HOTPLUG_NODE}"),
        ]);
    }
    if b.machine.numa_nodes >= 2 {
        numa_nvme(&mut q, b, &drive("nvmen1", "nvme-n-ns1.img"));
    }
    if b.machine.big_ns_mib > 0 {
        for (id, serial, addr, img, ns) in BIG_NS {
            q.args([
                "-device",
                &format!("nvme,id={id},serial={serial},mdts=9,addr={addr:#x}"),
            ]);
            q.args(drive(&format!("{id}1"), img));
            q.args(["-device", &format!("nvme-ns,drive={id}1,bus={id},nsid=1{ns}")]);
        }
    }
    Ok(q)
}

/// The modules the guest init loads: [`Boot::modules`], and `iommufd` first in mode
/// `iommufd` (`/dev/iommu`), whatever `--modules` said.
fn boot_modules(b: &Boot) -> Vec<String> {
    let mut m = b.modules.clone();
    if b.mode == Mode::Iommufd && !m.iter().any(|x| module_name(x) == "iommufd") {
        m.insert(0, "iommufd".into());
    }
    m
}

/// Guest NUMA nodes (memory backends, CPUs) and 1 GiB pages on the kernel command line
/// ([`Machine`]).
fn numa_and_huge_1g(q: &mut Command, append: &mut String, b: &Boot) {
    let m = &b.machine;
    if m.hugepages_1g > 0 {
        append.push_str(&format!(" hugepagesz=1G hugepages={}", m.hugepages_1g));
    }
    if m.numa_nodes < 2 {
        return;
    }
    let nodes = u64::from(m.numa_nodes);
    // `-m` as MiB; each node gets an equal share, the last one the rest.
    let total = mem_mib(&b.mem);
    let smp = u64::from(b.smp);
    for n in 0..nodes {
        let mib = if n + 1 == nodes {
            total - total / nodes * (nodes - 1)
        } else {
            total / nodes
        };
        q.args([
            "-object",
            &format!("memory-backend-ram,id=ram-node{n},size={mib}M"),
        ]);
        // CPUs split as evenly as they go; a node may have none when -smp < nodes.
        let (first, last) = (n * smp / nodes, (n + 1) * smp / nodes);
        let cpus = match last - first {
            0 => String::new(),
            1 => format!(",cpus={first}"),
            _ => format!(",cpus={first}-{}", last - 1),
        };
        q.args(["-numa", &format!("node,nodeid={n}{cpus},memdev=ram-node{n}")]);
    }
}

/// NVMe controller N on the last NUMA node (see [`NUMA_NVME_SERIAL`]); `drive` is its
/// namespace's `-drive` option pair.
fn numa_nvme(q: &mut Command, b: &Boot, drive: &[String; 2]) {
    let node = b.machine.numa_nodes - 1;
    q.args([
        "-device",
        &format!("pxb-pcie,id=pxbn,bus_nr=128,numa_node={node},bus=pcie.0,addr=0xd"),
    ]);
    q.args(["-device", "pcie-root-port,id=rpn,bus=pxbn,chassis=2,slot=0"]);
    q.args([
        "-device",
        &format!("nvme,id=nvmen,bus=rpn,serial={NUMA_NVME_SERIAL}"),
    ]);
    q.args(drive);
    q.args(["-device", "nvme-ns,drive=nvmen1,bus=nvmen,nsid=1"]);
}

/// QEMU's `-m` size as MiB (`2G`, `4096M`, `4096`: MiB without a suffix); 2 GiB when it cannot
/// be read (QEMU then refuses the value itself).
fn mem_mib(mem: &str) -> u64 {
    let m = mem.trim();
    let (num, unit) = m.split_at(m.find(|c: char| !c.is_ascii_digit()).unwrap_or(m.len()));
    let n: u64 = num.parse().unwrap_or(2048);
    match unit.to_ascii_uppercase().as_str() {
        "G" | "GB" | "GIB" => n << 10,
        "T" | "TB" | "TIB" => n << 20,
        "K" | "KB" | "KIB" => n >> 10,
        _ => n,
    }
}

/// Copies QEMU's stderr to `out` (ours), without the one warning every boot gives (the NIC hub
/// has no host-side port, on purpose); returns the lines that are vIOMMU faults
/// ([`is_iommu_fault`]), which are copied too.
fn filter_stderr(stderr: impl Read, mut out: impl Write) -> QemuStderr {
    let mut seen = QemuStderr::default();
    for mut line in BufReader::new(stderr).split(b'\n').map_while(|l| l.ok()) {
        if contains(&line, b"is not connected to host network") {
            continue;
        }
        let text = String::from_utf8_lossy(&line);
        if is_iommu_fault(&text) {
            seen.faults.push(text.trim_end().to_string());
        } else if !text.trim().is_empty() {
            seen.last = Some(text.trim_end().to_string());
        }
        line.push(b'\n');
        let _ = out.write_all(&line);
    }
    seen
}

/// What [`filter_stderr`] kept of QEMU's stderr.
#[derive(Debug, Default, PartialEq)]
struct QemuStderr {
    /// The vIOMMU fault lines ([`is_iommu_fault`]), in order.
    faults: Vec<String>,
    /// The last other non-empty line (why QEMU refused to start, when it did).
    last: Option<String>,
}

/// What QEMU 7.2 prints on stderr when a device's DMA is refused: the `error_report_once`
/// messages of its emulated VT-d (`hw/i386/intel_iommu.c`, as `<function>: <message>`) and the
/// DMA-mapping errors of its virtio core (`hw/virtio/virtio.c`). Each message is printed at
/// most once per call site and boot (`error_report_once`), so a boot shows the first fault of
/// each kind, which is all a verdict needs.
///
/// The NVMe (`hw/nvme`) and e1000e models print nothing of their own on a failed DMA (they
/// complete the command or descriptor, or only trace), so for them the VT-d lines are the
/// evidence. Not listed: the VT-d messages about the guest kernel's own invalidation-queue and
/// register programming (`vtd_iotlb_flush`, `vtd_fetch_inv_desc`, ...), which are no DMA.
pub const IOMMU_FAULT_MESSAGES: &[&str] = &[
    // Any DMA whose translation failed, whatever the reason below (vtd_iommu_translate).
    "vtd_iommu_translate: detected translation failure",
    // Why, from the page walk (vtd_iova_to_slpte): beyond the address width, a page-table
    // entry that cannot be read, not present or lacking the permission (an unmapped IOVA),
    // reserved bits set, or a translation into the interrupt range.
    "vtd_iova_to_slpte: detected IOVA overflow",
    "vtd_iova_to_slpte: detected read error on DMAR slpte",
    "vtd_iova_to_slpte: detected slpte permission error",
    "vtd_iova_to_slpte: detected splte reserve non-zero",
    "vtd_iova_to_slpte: xlat address is in interrupt range",
    // The device has no valid root or context entry (vtd_dev_to_context_entry and its checks).
    "vtd_root_entry_rsvd_bits_check: invalid root entry",
    "vtd_context_entry_rsvd_bits_check: invalid context entry",
    "vtd_dev_to_context_entry: invalid context entry",
    "vtd_ce_type_check: DT specified but not supported",
    "vtd_ce_type_check: PT specified but not supported",
    "vtd_ce_type_check: unknown ce type",
    // Fault recording after a refused DMA (vtd_report_dmar_fault, vtd_generate_fault_event).
    "New fault is not recorded due to ",
    "Next Fault Recording Reg is used, new fault is not recorded",
    "There are pending faults already, fault event is not generated",
    "There are previous interrupt conditions to be serviced by software, fault event is not generated",
    "Interrupt Mask set, irq is not generated",
    // A DMA write into the interrupt window (0xfee00000..) that interrupt remapping refused
    // (vtd_irte_get, vtd_interrupt_remap_msi).
    "vtd_irte_get: ",
    "vtd_interrupt_remap_msi: ",
    // virtio devices (iommu_platform=on) whose rings or buffers did not translate.
    "virtio: bogus descriptor or out of resources",
    "virtio: error trying to map MMIO memory",
    "Cannot map desc",
    "Cannot map used",
    "Cannot map avail",
    "Cannot map indirect buffer",
];

/// Whether a line of QEMU's stderr says that the vIOMMU refused a device DMA
/// ([`IOMMU_FAULT_MESSAGES`]).
pub fn is_iommu_fault(line: &str) -> bool {
    IOMMU_FAULT_MESSAGES.iter().any(|m| line.contains(m))
}

/// One paragraph for a boot with vIOMMU faults: what they mean and where they are kept.
pub fn fault_report(faults: &[String], file: &Path) -> String {
    const SHOWN: usize = 6;
    let mut s = format!(
        "QEMU's vIOMMU refused device DMA: a bug, a DMA to an address the driver never mapped \
         (or had unmapped). QEMU said ({} line(s)):",
        faults.len()
    );
    for f in faults.iter().take(SHOWN) {
        s.push_str("\n  ");
        s.push_str(f);
    }
    if faults.len() > SHOWN {
        s.push_str(&format!("\n  ... and {} more", faults.len() - SHOWN));
    }
    s.push_str(&format!(
        "\n(all in {}; QEMU prints each kind once per boot: look for the first DMA that \
         went wrong)",
        file.display()
    ));
    s
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Streams the serial console to stdout (through [`ConsoleFilter`]) and, raw, to `log`;
/// returns when the job started.
fn stream_console(mut stdout: impl Read, mut log: fs::File, verbose: bool, t0: Instant) -> Option<Instant> {
    let mut filter = ConsoleFilter::new(verbose);
    let mut started = None;
    let mut buf = [0u8; 8192];
    loop {
        let n = match stdout.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let _ = log.write_all(&buf[..n]);
        let mut shown = Vec::new();
        filter.feed(&buf[..n], &mut shown, |line| {
            if started.is_none() && line.starts_with(b"vm: job start") {
                let now = Instant::now();
                started = Some(now);
                if verbose {
                    eprintln!("vm: job started after {}", secs(now - t0));
                }
            }
        });
        let mut o = io::stdout().lock();
        let _ = o.write_all(&shown);
        let _ = o.flush();
    }
    let mut shown = Vec::new();
    filter.finish(&mut shown);
    let _ = io::stdout().lock().write_all(&shown);
    started
}

/// Turns the serial console into what the user should see: `\r\n` becomes `\n`, and lines of
/// the guest init (`vm: ...`) are dropped unless verbose, except `vm: error...`; so is the
/// kernel's chatter after the job. Partial lines pass as soon as they cannot be init lines, so
/// output without a newline shows up live; the init's RS byte ends such a line.
struct ConsoleFilter {
    verbose: bool,
    line: Vec<u8>,
    /// Bytes of `line` already written out.
    shown: usize,
    /// Whether the current line is shown, once that is known.
    show: Option<bool>,
    /// A `\r` that may be the first half of `\r\n`.
    cr: bool,
    /// The job has ended: what follows is the kernel powering off.
    after_job: bool,
}

const INIT_PREFIX: &[u8] = b"vm: ";
/// Sent by the init before each of its lines: ends the current line if there is one.
const RECORD_SEPARATOR: u8 = 0x1e;
const INIT_ERROR: &[u8] = b"vm: error";

impl ConsoleFilter {
    fn new(verbose: bool) -> Self {
        ConsoleFilter {
            verbose,
            line: Vec::new(),
            shown: 0,
            show: None,
            cr: false,
            after_job: false,
        }
    }

    /// Whether a line starting with `start` is shown; `None` while that cannot be told yet.
    fn decide(&self, start: &[u8], complete: bool) -> Option<bool> {
        if start.starts_with(INIT_ERROR) {
            Some(true)
        } else if start.starts_with(INIT_PREFIX) && (complete || !INIT_ERROR.starts_with(start)) {
            Some(self.verbose)
        } else if self.after_job {
            (complete || !INIT_PREFIX.starts_with(start)).then_some(self.verbose)
        } else if complete || !INIT_PREFIX.starts_with(start) && !start.starts_with(INIT_PREFIX) {
            Some(true)
        } else {
            None
        }
    }

    /// Filters `bytes` into `out`; calls `on_line` with each complete line.
    fn feed(&mut self, bytes: &[u8], out: &mut Vec<u8>, mut on_line: impl FnMut(&[u8])) {
        for &b in bytes {
            if self.cr && b != b'\n' {
                self.push(b'\r');
            }
            self.cr = false;
            match b {
                b'\r' => self.cr = true,
                RECORD_SEPARATOR if self.line.is_empty() => {}
                RECORD_SEPARATOR | b'\n' => {
                    let show = self.show.or(self.decide(&self.line, true)) == Some(true);
                    if show {
                        out.extend_from_slice(&self.line[self.shown..]);
                        out.push(b'\n');
                    }
                    on_line(&self.line);
                    if self.line.starts_with(b"vm: job exit") {
                        self.after_job = true;
                    }
                    self.line.clear();
                    self.shown = 0;
                    self.show = None;
                }
                _ => self.push(b),
            }
        }
        if self.show == Some(true) {
            out.extend_from_slice(&self.line[self.shown..]);
            self.shown = self.line.len();
        }
    }

    fn push(&mut self, b: u8) {
        self.line.push(b);
        if self.show.is_none() {
            self.show = self.decide(&self.line, false);
        }
    }

    /// Flushes an unterminated last line.
    fn finish(&mut self, out: &mut Vec<u8>) {
        if !self.line.is_empty() && self.show.or(self.decide(&self.line, true)) == Some(true) {
            out.extend_from_slice(&self.line[self.shown..]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(verbose: bool, chunks: &[&[u8]]) -> (String, Vec<String>) {
        let mut f = ConsoleFilter::new(verbose);
        let mut out = Vec::new();
        let mut lines = Vec::new();
        for c in chunks {
            f.feed(c, &mut out, |l| {
                lines.push(String::from_utf8_lossy(l).into_owned())
            });
        }
        f.finish(&mut out);
        (String::from_utf8(out).unwrap(), lines)
    }

    #[test]
    fn init_lines_are_hidden_unless_verbose() {
        let input: &[&[u8]] = &[
            b"vm: init\r\nhello\r\nv",
            b"m: job start\r\nvm: error: x\r\nbye\r\n",
            b"\x1evm: job exit 0\r\n[ 5.6] reboot: Power down\r\n",
        ];
        let (out, lines) = filter(false, input);
        assert_eq!(out, "hello\nvm: error: x\nbye\n");
        assert_eq!(lines[..4], ["vm: init", "hello", "vm: job start", "vm: error: x"]);
        let (out, _) = filter(true, input);
        assert_eq!(
            out,
            "vm: init\nhello\nvm: job start\nvm: error: x\nbye\nvm: job exit 0\n[ 5.6] reboot: Power down\n"
        );
    }

    #[test]
    fn partial_lines_stream_and_lone_cr_stays() {
        let mut f = ConsoleFilter::new(false);
        let mut out = Vec::new();
        f.feed(b"test a ... ", &mut out, |_| {});
        assert_eq!(out, b"test a ... ");
        f.feed(b"ok\r", &mut out, |_| {});
        f.feed(b"\n50%\r60%\r\n", &mut out, |_| {});
        assert_eq!(out, b"test a ... ok\n50%\r60%\n");
        // "vm" alone could still become an init line: held back.
        let mut out = Vec::new();
        f.feed(b"vm", &mut out, |_| {});
        assert!(out.is_empty());
        f.feed(b"x\n", &mut out, |_| {});
        assert_eq!(out, b"vmx\n");
        // An init line after an unterminated line ends it.
        let mut out = Vec::new();
        let mut lines = Vec::new();
        f.feed(b"no newline\x1evm: job exit 0\r\n", &mut out, |l| {
            lines.push(l.to_vec())
        });
        assert_eq!(out, b"no newline\n");
        assert_eq!(lines, [b"no newline".to_vec(), b"vm: job exit 0".to_vec()]);
    }

    /// The lines as QEMU 7.2.22 prints them: `error_report` puts the program name first, then
    /// the format strings of hw/i386/intel_iommu.c and hw/virtio/virtio.c with their
    /// arguments filled in (`%s` is `__func__`; PCI_NO_PASID prints as 0xffffffff).
    const QEMU_FAULT_LINES: &[&str] = &[
        "qemu-system-x86_64: vtd_iommu_translate: detected translation failure (dev=00:04:00, iova=0x4000000000)",
        "qemu-system-x86_64: vtd_iova_to_slpte: detected IOVA overflow (iova=0x8000000000,pasid=0xffffffff)",
        "qemu-system-x86_64: vtd_iova_to_slpte: detected read error on DMAR slpte (iova=0x1000, pasid=0xffffffff)",
        "qemu-system-x86_64: vtd_iova_to_slpte: detected slpte permission error (iova=0x4000000000, level=0x3, slpte=0x0, write=1, pasid=0xffffffff)",
        "qemu-system-x86_64: vtd_iova_to_slpte: detected splte reserve non-zero iova=0x1000, level=0x1slpte=0x800000000000f003, pasid=0xFFFFFFFF)",
        "qemu-system-x86_64: vtd_iova_to_slpte: xlat address is in interrupt range (iova=0x200000, level=0x2, slpte=0xfee00083, write=1, xlat=0xfee00000, size=0x200000, pasid=0xffffffff)",
        "qemu-system-x86_64: vtd_root_entry_rsvd_bits_check: invalid root entry: hi=0x0, lo=0x1",
        "qemu-system-x86_64: vtd_context_entry_rsvd_bits_check: invalid context entry: hi=f0, lo=1 (reserved nonzero)",
        "qemu-system-x86_64: vtd_dev_to_context_entry: invalid context entry: hi=4, lo=1 (level 4 not supported)",
        "qemu-system-x86_64: vtd_ce_type_check: DT specified but not supported",
        "qemu-system-x86_64: vtd_ce_type_check: PT specified but not supported",
        "qemu-system-x86_64: vtd_ce_type_check: unknown ce type: 3",
        "qemu-system-x86_64: New fault is not recorded due to Primary Fault Overflow",
        "qemu-system-x86_64: New fault is not recorded due to compression of faults",
        "qemu-system-x86_64: Next Fault Recording Reg is used, new fault is not recorded, set PFO field",
        "qemu-system-x86_64: There are pending faults already, fault event is not generated",
        "qemu-system-x86_64: There are previous interrupt conditions to be serviced by software, fault event is not generated",
        "qemu-system-x86_64: Interrupt Mask set, irq is not generated",
        "qemu-system-x86_64: vtd_irte_get: detected non-present IRTE (index=3, high=0x0, low=0x0)",
        "qemu-system-x86_64: vtd_interrupt_remap_msi: invalid IR MSI (sid=32, address=0xfee00010, data=0x0)",
        "qemu-system-x86_64: virtio: bogus descriptor or out of resources",
        "qemu-system-x86_64: virtio: error trying to map MMIO memory",
        "qemu-system-x86_64: Cannot map desc",
        "qemu-system-x86_64: Cannot map used",
        "qemu-system-x86_64: Cannot map avail",
        "qemu-system-x86_64: Cannot map descriptor ring",
        "qemu-system-x86_64: Cannot map indirect buffer",
    ];

    #[test]
    fn every_qemu_fault_message_is_recognised() {
        for line in QEMU_FAULT_LINES {
            assert!(is_iommu_fault(line), "not recognised: {line}");
        }
        // Every entry of the table is needed by at least one line above (no dead entries).
        for m in IOMMU_FAULT_MESSAGES {
            assert!(
                QEMU_FAULT_LINES.iter().any(|l| l.contains(m)),
                "no test line for {m:?}"
            );
        }
    }

    /// QEMU 10.0.2 (`--qemu 10`) prints the same messages (read from its binary's format
    /// strings); one changed its wording after the part the table matches (`pte=`, was `slpte=`).
    #[test]
    fn qemu_10_fault_lines_are_recognised() {
        for line in [
            "qemu-system-x86_64: vtd_iommu_translate: detected translation failure (dev=00:03:00, iova=0x4000000000)",
            "qemu-system-x86_64: vtd_iova_to_slpte: detected slpte permission error (iova=0x4000000000, level=0x3, slpte=0x0, write=1, pasid=0xffffffff)",
            "qemu-system-x86_64: vtd_iova_to_slpte: xlat address is in interrupt range (iova=0x200000, level=0x2, pte=0xfee00083, write=1, xlat=0xfee00000, size=0x200000, pasid=0xffffffff)",
        ] {
            assert!(is_iommu_fault(line), "not recognised: {line}");
        }
    }

    #[test]
    fn other_qemu_lines_are_no_faults() {
        for line in [
            "qemu-system-x86_64: warning: hub 0 is not connected to host network",
            "qemu-system-x86_64: terminating on signal 15 from pid 4242 (cargo)",
            // The guest kernel's invalidation programming, no DMA.
            "qemu-system-x86_64: vtd_iotlb_flush: invalid granularity: 0x0",
            "qemu-system-x86_64: vtd_fetch_inv_desc: detected invalid QI tail (tail=0x10, size=0x8)",
            "qemu-system-x86_64: -device nvme,id=nvmea: warning: ...",
            "",
        ] {
            assert!(!is_iommu_fault(line), "taken for a fault: {line}");
        }
    }

    #[test]
    fn stderr_filter_collects_faults_and_drops_the_hub_warning() {
        let stderr = format!(
            "qemu-system-x86_64: warning: hub 0 is not connected to host network\n{}\nsomething else\n{}",
            QEMU_FAULT_LINES[0], QEMU_FAULT_LINES[3]
        );
        let mut copied = Vec::new();
        let seen = filter_stderr(io::Cursor::new(stderr), &mut copied);
        let faults = seen.faults;
        assert_eq!(faults, [QEMU_FAULT_LINES[0], QEMU_FAULT_LINES[3]]);
        assert_eq!(seen.last.as_deref(), Some("something else"));
        assert_eq!(
            String::from_utf8(copied).unwrap(),
            format!(
                "{}\nsomething else\n{}\n",
                QEMU_FAULT_LINES[0], QEMU_FAULT_LINES[3]
            )
        );
        let only = filter_stderr(io::Cursor::new("just a warning\n\n"), io::sink());
        assert!(only.faults.is_empty());
        assert_eq!(only.last.as_deref(), Some("just a warning"));
        let r = fault_report(&faults, Path::new("/r/iommu-faults.txt"));
        assert!(r.contains("(2 line(s))") && r.contains("never mapped"), "{r}");
        assert!(
            r.contains(QEMU_FAULT_LINES[0]) && r.contains("/r/iommu-faults.txt"),
            "{r}"
        );
    }

    #[test]
    fn job_script_quotes_and_sets_env() {
        let ws = Workspace {
            root: "/w".into(),
            target: "/w/target".into(),
        };
        let b = Boot {
            mode: Mode::NoIommu,
            timeout: Duration::from_secs(1),
            mem: "2G".into(),
            smp: 2,
            modules: vec![],
            hugepages: 4,
            run_dir: "/r".into(),
            keep_run_dir: false,
            verbose: false,
            cwd: "/w/my dir".into(),
            env: vec![("VFPOLL_SEED".into(), "42".into())],
            command: vec!["sh".into(), "-c".into(), "echo 'hi'; exit 3".into()],
            hotplug: false,
            machine: Machine::default(),
        };
        let s = String::from_utf8(job_script(&ws, &b)).unwrap();
        assert!(s.contains("export PATH=/w/target/debug:/w/target/release:/usr/local/sbin:"));
        assert!(s.contains("export VFPOLL_SEED=42\n"));
        assert!(s.contains("export VFPOLL_TESTBED=noiommu\n"));
        assert!(s.contains("echo 4 > /proc/sys/vm/nr_hugepages\n"));
        assert!(s.contains("cd '/w/my dir' || exit 125\n"));
        assert!(s.ends_with("exec sh -c 'echo '\\''hi'\\''; exit 3'\n"));
    }

    #[test]
    fn numa_nodes_and_1g_pages() {
        assert_eq!(mem_mib("8G"), 8192);
        assert_eq!(mem_mib("3000M"), 3000);
        assert_eq!(mem_mib("4096"), 4096);
        let mut b = Boot {
            mode: Mode::Iommu,
            timeout: Duration::from_secs(1),
            mem: "3000M".into(),
            smp: 3,
            modules: vec![],
            hugepages: 0,
            run_dir: "/r".into(),
            keep_run_dir: false,
            verbose: false,
            cwd: "/".into(),
            env: vec![],
            command: vec![],
            hotplug: false,
            machine: Machine {
                hugepages_1g: 4,
                numa_nodes: 2,
                ..Machine::default()
            },
        };
        let args = |b: &Boot| {
            let (mut q, mut append) = (Command::new("q"), String::new());
            numa_and_huge_1g(&mut q, &mut append, b);
            let args: Vec<String> = q.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
            (args.join(" "), append)
        };
        let (q, append) = args(&b);
        assert_eq!(append, " hugepagesz=1G hugepages=4");
        assert_eq!(
            q,
            "-object memory-backend-ram,id=ram-node0,size=1500M -numa node,nodeid=0,cpus=0,memdev=ram-node0 \
             -object memory-backend-ram,id=ram-node1,size=1500M -numa node,nodeid=1,cpus=1-2,memdev=ram-node1"
        );
        // One node: nothing declared.
        b.machine = Machine::default();
        assert_eq!(args(&b), (String::new(), String::new()));
    }

    #[test]
    fn iommufd_mode_loads_iommufd_and_needs_dev_iommu() {
        let ws = Workspace {
            root: "/w".into(),
            target: "/w/target".into(),
        };
        let mut b = Boot {
            mode: Mode::Iommufd,
            timeout: Duration::from_secs(1),
            mem: "2G".into(),
            smp: 2,
            modules: vec!["nvme".into(), "vfio-pci".into()],
            hugepages: 0,
            run_dir: "/r".into(),
            keep_run_dir: false,
            verbose: false,
            cwd: "/".into(),
            env: vec![],
            command: vec!["true".into()],
            hotplug: false,
            machine: Machine::default(),
        };
        assert_eq!(boot_modules(&b), ["iommufd", "nvme", "vfio-pci"]);
        let s = String::from_utf8(job_script(&ws, &b)).unwrap();
        assert!(s.contains("export VFPOLL_TESTBED=iommufd\n"));
        let check = s.find("[ -c /dev/iommu ] || ").expect("no /dev/iommu check");
        assert!(check < s.find("exec true").unwrap(), "{s}");
        assert!(Mode::Iommufd.viommu() && Mode::Iommu.viommu() && !Mode::NoIommu.viommu());
        // Named already: not loaded twice; other modes load what they are told.
        b.modules = vec!["iommufd".into()];
        assert_eq!(boot_modules(&b), ["iommufd"]);
        b.mode = Mode::Iommu;
        b.modules = vec![];
        assert!(boot_modules(&b).is_empty());
        let s = String::from_utf8(job_script(&ws, &b)).unwrap();
        assert!(!s.contains("/dev/iommu"), "{s}");
        for m in [Mode::Iommu, Mode::NoIommu, Mode::Iommufd] {
            assert_eq!(Mode::from_name(m.name()), Some(m));
        }
    }
}
