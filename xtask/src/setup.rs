//! `cargo xtask setup`: host packages and the guest assets (kernel, modules, initramfs images).
//!
//! The guest kernel is Debian's own `linux-image-<ver>-amd64`, the one `linux-image-amd64`
//! depends on. It is fetched with `apt-get download` and unpacked with `dpkg -x` under
//! `target/testbed/kernel-<ver>/`; nothing of it is installed on the host. Debian builds it with
//! `CONFIG_VFIO_NOIOMMU` unset, so `vfio.ko` alone is rebuilt out of tree from the matching
//! `linux-source` with the no-IOMMU mode compiled in; it goes only into the no-IOMMU initramfs.
//!
//! Each asset is built once per kernel version; the initramfs images are rebuilt when anything
//! that goes into them changes (the `guest/init` script, the module list, busybox, `vfio.ko`).
//!
//! Two guest kernels ([`KERNELS`]): Debian 12's 6.1 ([`DEFAULT_KERNEL`], what every command
//! boots unless told otherwise) and its 6.12 (`linux-image-6.12-amd64`, the 6.12 LTS Debian 12
//! carries in `bookworm-security`; where apt does not know it, `bookworm-backports`' kernel is
//! taken). 6.12 differs where the test bed cares: its bzImage is zstd-compressed, its modules are
//! `.ko.xz` (unpacked to plain `.ko` here, so busybox's depmod and modprobe and the module swaps
//! work as with 6.1), and it is built with `CONFIG_VFIO_NOIOMMU` and `CONFIG_IOMMUFD` unset (so
//! without `CONFIG_VFIO_DEVICE_CDEV` either). Its VFIO modules are therefore rebuilt as a set
//! with all three ([`vfio`], `setup/vfio.rs`: `iommufd.ko`, `vfio.ko`, `vfio_iommu_type1.ko`,
//! `vfio-pci-core.ko`, `vfio-pci.ko`), into a module tree of their own (`kroot-vfio`) and one
//! initramfs (`initramfs-all.cpio`) that every mode boots, test-bed mode `iommufd` included
//! ([`GuestKernel::iommufd`]).

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::apt::{self, Apt};
use crate::util::{err, mkdir, read_opt, run_quiet, stdout_of, step, write, Context, Lock, Note, Result};
use crate::Workspace;

mod initramfs;
mod vfio;

use initramfs::{initramfs, module_closure, stamp, stamp_path};

/// Debian packages the test bed needs on the host. `gcc`, `make`, `bc`, `xz-utils` and the
/// libraries of `linux-kbuild` build `vfio.ko`; `fio`, `nvme-cli` (the NVMe/TCP initiator's
/// `nvme discover/connect/disconnect`) and `e2fsprogs` (`mkfs.ext4`, `fsck.ext4`; priority
/// "required", yet absent from minimal images) are for jobs in the guest, which runs the host's
/// binaries. `binutils` (`strip`) comes with `gcc`. (fio's source, for the fio engine, is not
/// the test bed's: [`fio_source`] fetches it, with `dpkg-dev`, when the engine is built.)
const PACKAGES: &[&str] = &[
    "qemu-system-x86",
    "busybox-static",
    "fio",
    "nvme-cli",
    "e2fsprogs",
    "gcc",
    "g++", // libFuzzer, for `cargo xtask fuzz` (and the fuzz step of `cargo xtask test`)
    "make",
    "bc",
    "python3",
    "xz-utils",
    "libelf1",
    "libssl3",
    "zstd", // the 6.12 guest kernel's bzImage payload
];

/// Modules copied into the initramfs, with everything they depend on, so that `--modules` may
/// name them (only `vm::DEFAULT_MODULES` load at every boot). Every module of the kernel is also
/// in the guest's `/lib/modules` for `busybox modprobe` on demand (`ext4` is loaded that way).
///
/// The NVMe/TCP ones: the initiator `nvme-tcp` (+ `nvme-fabrics`, `nvme-core`), the kernel
/// target `nvmet-tcp` (+ `nvmet`, `configfs`) and `crc32c_generic` for the header and data
/// digests (and ext4's checksums). The tests load them on demand (`vfpoll_tests::load_modules`):
/// the guest kernel cannot autoload anything itself, as its usermode helper `/sbin/modprobe` does
/// not exist (the init's root has busybox in `/bin` only; the host has no kmod), and busybox's
/// modprobe ignores soft dependencies such as ext4's `pre: crypto-crc32c`.
const MODULES: &[&str] = &[
    "virtio_pci",
    "9pnet_virtio",
    "9p",
    "overlay",
    "nvme",
    "e1000e",
    "e1000",
    "igb",
    "vfio",
    "vfio_iommu_type1",
    "vfio_pci",
    "uio_pci_generic",
    "virtio_net",
    "virtio_blk",
    "nvme-tcp",
    "nvmet-tcp",
    "crc32c_generic",
];

/// Modules of [`MODULES`]' kind that only some kernels' module trees have: `iommufd`, rebuilt
/// for 6.12 ([`vfio`]).
const OPTIONAL_MODULES: &[&str] = &["iommufd"];

/// The guest's `/init`.
pub const INIT: &str = include_str!("../guest/init");

/// Bumped when the initramfs layout changes in a way the stamp cannot see.
const INITRAMFS_FORMAT: &str = "vfpoll-initramfs-1";

/// The name of the one initramfs of a kernel with the rebuilt VFIO set
/// ([`GuestKernel::iommufd`]), which boots in every mode: `initramfs-all.cpio`.
const ALL_MODES: &str = "all";

const BUSYBOX: &str = "/bin/busybox";
/// Debian's Python, which has `lzma` (a `python3` first on `PATH` may be a build without it).
const PYTHON: &str = "/usr/bin/python3";
const QEMU: &str = "qemu-system-x86_64";

/// Drive cache/AIO options, best first; `setup` keeps the first one QEMU accepts here.
const DRIVE_OPTIONS: &[&str] = &[
    "cache=none,aio=io_uring",
    "cache=none,aio=threads",
    "cache=writeback,aio=threads",
];

/// A guest kernel the test bed can boot (`cargo xtask vm --kernel NAME`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestKernel {
    /// The name `--kernel` takes, e.g. `6.12`.
    pub name: &'static str,
    /// The Debian meta-package whose `Depends: linux-image-<release>` names the kernel.
    meta: &'static str,
    /// File under `target/testbed` holding the release of the last setup.
    current: &'static str,
    /// File under `target/testbed` caching apt's answer for `meta`.
    version_cache: &'static str,
    /// Where apt knows no `meta`: add `bookworm-backports` and take its `linux-image-amd64`.
    backports: bool,
    /// Its VFIO modules are rebuilt with iommufd, the VFIO device cdev and no-IOMMU ([`vfio`]),
    /// one set that every mode boots with, test-bed mode `iommufd` included; otherwise only
    /// `vfio.ko` is rebuilt, with no-IOMMU, for the no-IOMMU mode alone.
    pub iommufd: bool,
}

/// Debian 12's own kernel, 6.1: the default for every command.
pub const DEFAULT_KERNEL: GuestKernel = GuestKernel {
    name: "6.1",
    meta: "linux-image-amd64",
    current: "current-kernel",
    version_cache: "kernel-version",
    backports: false,
    iommufd: false,
};

/// Debian 12's 6.12 LTS kernel.
pub const KERNEL_6_12: GuestKernel = GuestKernel {
    name: "6.12",
    meta: "linux-image-6.12-amd64",
    current: "current-kernel-6.12",
    version_cache: "kernel-version-6.12",
    backports: true,
    iommufd: true,
};

/// Every guest kernel `setup` prepares, the default first.
pub const KERNELS: &[GuestKernel] = &[DEFAULT_KERNEL, KERNEL_6_12];

/// The kernel `--kernel NAME` names.
pub fn kernel_by_name(name: &str) -> Result<GuestKernel> {
    KERNELS.iter().copied().find(|k| k.name == name).ok_or_else(|| {
        let names: Vec<&str> = KERNELS.iter().map(|k| k.name).collect();
        err!("unknown guest kernel {name:?}: use one of {}", names.join(", "))
    })
}

/// What a boot needs, all present on disk.
#[derive(Debug, Clone)]
pub struct Assets {
    /// Which guest kernel.
    pub kernel: GuestKernel,
    /// Guest kernel release, e.g. `6.1.0-56-amd64`.
    pub kver: String,
    /// Uncompressed kernel (ELF with a PVH entry point).
    pub vmlinux: PathBuf,
    /// Initramfs with Debian's modules.
    pub initramfs_iommu: PathBuf,
    /// Initramfs with the rebuilt, no-IOMMU-capable `vfio.ko`.
    pub initramfs_noiommu: PathBuf,
    /// Every module of the kernel (`lib/modules`, with `modules.dep`), for the guest's
    /// `/lib/modules` in IOMMU mode: the initramfs holds only what the boot needs.
    pub lib_modules_iommu: PathBuf,
    /// The same with the rebuilt `vfio.ko` (hard links to the other tree).
    pub lib_modules_noiommu: PathBuf,
    /// Initramfs and `lib/modules` of test-bed mode `iommufd`, on a kernel with the rebuilt
    /// VFIO set ([`GuestKernel::iommufd`]; then every mode boots with that set).
    pub iommufd: Option<(PathBuf, PathBuf)>,
    /// Module names in the initramfs (with `_`, as the kernel spells them).
    pub modules: Vec<String>,
    /// Cache and AIO options for the NVMe image files.
    pub drive_options: String,
}

impl Assets {
    /// The initramfs and `lib/modules` tree a boot in `mode` uses; an error for mode `iommufd`
    /// on a kernel without iommufd.
    pub fn boot_files(&self, mode: crate::mode::Mode) -> Result<(&Path, &Path)> {
        use crate::mode::Mode;
        match mode {
            Mode::Iommu => Ok((&self.initramfs_iommu, &self.lib_modules_iommu)),
            Mode::NoIommu => Ok((&self.initramfs_noiommu, &self.lib_modules_noiommu)),
            Mode::Iommufd => self
                .iommufd
                .as_ref()
                .map(|(i, l)| (i.as_path(), l.as_path()))
                .ok_or_else(|| iommufd_refused(self.kernel)),
        }
    }
}

/// Why mode `iommufd` cannot boot guest kernel `k`, and what to do.
pub fn iommufd_refused(k: GuestKernel) -> crate::util::Error {
    let with: Vec<&str> = KERNELS.iter().filter(|k| k.iommufd).map(|k| k.name).collect();
    err!(
        "mode iommufd needs a guest kernel with iommufd and VFIO device cdevs; kernel {} has \
         neither (Debian builds it without CONFIG_IOMMUFD): pass --kernel {}",
        k.name,
        with.join(" or --kernel ")
    )
}

/// Where the assets of one kernel version live.
struct KernelDir {
    kver: String,
    dir: PathBuf,
    /// [`GuestKernel::iommufd`].
    iommufd: bool,
}

impl KernelDir {
    fn new(ws: &Workspace, k: GuestKernel, kver: &str) -> Self {
        KernelDir {
            kver: kver.to_string(),
            dir: ws.testbed().join(format!("kernel-{kver}")),
            iommufd: k.iommufd,
        }
    }
    /// The module dir boots take modules from: the rebuilt VFIO set's tree where the kernel
    /// has one, Debian's otherwise (the no-IOMMU initramfs swaps in its `vfio.ko` itself).
    fn boot_module_dir(&self) -> PathBuf {
        if self.iommufd {
            vfio::tree_root(self).join("lib/modules").join(&self.kver)
        } else {
            self.module_dir()
        }
    }
    fn kroot(&self) -> PathBuf {
        self.dir.join("kroot")
    }
    fn module_dir(&self) -> PathBuf {
        self.kroot().join("lib/modules").join(&self.kver)
    }
    fn kroot_done(&self) -> PathBuf {
        self.dir.join("kroot.done")
    }
    /// The Debian version of the kernel package, e.g. `6.1.192-2`.
    fn package_version(&self) -> PathBuf {
        self.dir.join("package-version")
    }
    fn vmlinux(&self) -> PathBuf {
        self.dir.join("vmlinux")
    }
    fn kdev(&self) -> PathBuf {
        self.dir.join("kdev")
    }
    fn vfio_ko(&self) -> PathBuf {
        self.dir.join("vfio-noiommu.ko")
    }
    fn initramfs(&self, mode: &str) -> PathBuf {
        self.dir.join(format!("initramfs-{mode}.cpio"))
    }
    /// `lib/modules` of the no-IOMMU mode: `kroot`'s, with the rebuilt `vfio.ko`.
    fn noiommu_root(&self) -> PathBuf {
        self.dir.join("kroot-noiommu")
    }
    fn noiommu_done(&self) -> PathBuf {
        self.dir.join("kroot-noiommu.done")
    }
    fn complete(&self) -> bool {
        self.kroot_done().exists()
            && self.vmlinux().exists()
            && if self.iommufd {
                vfio::complete(self)
            } else {
                self.vfio_ko().exists() && self.noiommu_done().exists()
            }
    }
}

/// `cargo xtask setup`: everything, for every kernel of [`KERNELS`], one line per step; returns
/// the default kernel's assets.
pub fn setup(ws: &Workspace) -> Result<Assets> {
    let default = setup_kernel(ws, DEFAULT_KERNEL)?;
    for &k in &KERNELS[1..] {
        setup_kernel(ws, k)?;
    }
    Ok(default)
}

/// Host packages and the assets of guest kernel `k`.
pub fn setup_kernel(ws: &Workspace, k: GuestKernel) -> Result<Assets> {
    let _lock = Lock::acquire(&mkdir(ws.testbed())?.join("setup.lock"))?;
    setup_locked(ws, k)
}

fn setup_locked(ws: &Workspace, k: GuestKernel) -> Result<Assets> {
    let mut apt = Apt::default();
    let p = &format!("setup {}", k.name);
    step(p, "apt packages", || apt.ensure_packages(PACKAGES))?;
    let kd = step(p, "kernel version", || {
        let kver = kernel_version(&mut apt, &mkdir(ws.testbed())?.join(k.version_cache), k)?;
        Ok((KernelDir::new(ws, k, &kver), Note::Text(kver)))
    })?;
    mkdir(&kd.dir)?;
    step(p, "guest kernel", || fetch_kernel(&mut apt, ws, &kd))?;
    step(p, "vmlinux (PVH)", || extract_vmlinux(&kd))?;
    let modules = if kd.iommufd {
        step(p, "vfio, iommufd modules", || vfio::build(&mut apt, ws, &kd))?;
        step(p, "modules (rebuilt vfio)", || vfio::module_tree(&kd))?;
        step(p, "initramfs (all modes)", || initramfs(&kd, ALL_MODES, None))?
    } else {
        step(p, "vfio.ko (no-IOMMU)", || {
            vfio::build_vfio_noiommu(&mut apt, ws, &kd)
        })?;
        step(p, "modules (no-IOMMU)", || vfio::noiommu_modules(&kd))?;
        let modules = step(p, "initramfs (iommu)", || initramfs(&kd, "iommu", None))?;
        step(p, "initramfs (noiommu)", || {
            initramfs(&kd, "noiommu", Some(&kd.vfio_ko()))
        })?;
        modules
    };
    let drive_options = step(p, "qemu drive options", || {
        let o = probe_drive_options(ws)?;
        Ok((o.clone(), Note::Text(o)))
    })?;
    write(&ws.testbed().join(k.current), &kd.kver)?;
    Ok(assets(k, &kd, modules, drive_options))
}

/// The source of the installed fio, unpacked and configured under `target/fio-src`: the headers
/// (and `config-host.h`) that vfpoll's fio engine is built against. Fetched once per fio version
/// with `apt-get source`, installing fio and `dpkg-dev` and adding `deb-src` lines to apt's
/// sources where they are missing; nothing of fio is committed. Only the fio engine's build
/// asks for it (`cargo xtask fio-engine`, `cargo xtask test`, `cargo xtask bench`), never the
/// demo.
pub fn fio_source(ws: &Workspace) -> Result<PathBuf> {
    step("setup", "fio source", || fio_source_with(&mut Apt::default(), ws))
}

/// What fio's source needs of apt: fio and `dpkg-dev` installed, and apt knowing the source
/// package of the installed fio's version (which it returns).
pub fn fio_source_apt<S: apt::System>(apt: &mut Apt<S>) -> Result<String> {
    apt.ensure_packages(&["fio", "dpkg-dev"])?;
    let version = apt
        .installed_version("fio")?
        .ok_or_else(|| err!("dpkg reports fio as not installed right after installing it"))?;
    apt.ensure_deb_src("fio", &version)?;
    Ok(version)
}

fn fio_source_with(apt: &mut Apt, ws: &Workspace) -> Result<(PathBuf, Note)> {
    let installed = apt.installed_version("fio")?;
    let root = mkdir(ws.target.join("fio-src"))?;
    let paths = |version: &str| {
        // 3.33-3 -> fio-3.33, the directory `dpkg-source -x` makes.
        let upstream = version.split('-').next().unwrap_or(version);
        let upstream = upstream.split_once(':').map_or(upstream, |(_, v)| v).to_string();
        let dir = root.join(format!("fio-{upstream}"));
        let stamp = root.join(format!("fio-{upstream}.configured"));
        (upstream, dir, stamp)
    };
    let done = |version: &str| {
        let (_, dir, stamp) = paths(version);
        read_opt(&stamp).as_deref() == Some(version) && dir.join("config-host.h").exists()
    };
    if let Some(v) = &installed {
        if done(v) {
            return Ok((paths(v).1, Note::Cached));
        }
    }
    let _lock = Lock::acquire(&root.join("lock"))?;
    let version = fio_source_apt(apt)?;
    let (upstream, dir, stamp) = paths(&version);
    if done(&version) {
        return Ok((dir, Note::Cached));
    }
    let _ = fs::remove_dir_all(&dir);
    let dl = root.join("download");
    let _ = fs::remove_dir_all(&dl);
    mkdir(&dl)?;
    apt.source(&dl, "fio", &version)?;
    fs::rename(dl.join(format!("fio-{upstream}")), &dir).context(format_args!(
        "apt-get source fio={version} left no fio-{upstream}"
    ))?;
    fs::remove_dir_all(&dl)?;
    // As Debian configures it (debian/rules); the structures an engine sees do not depend on
    // the optional libraries configure finds.
    run_quiet(
        Command::new("./configure")
            .arg("--disable-native")
            .current_dir(&dir),
    )?;
    if !dir.join("config-host.h").exists() {
        return Err(err!(
            "fio's ./configure made no config-host.h in {}",
            dir.display()
        ));
    }
    write(&stamp, &version)?;
    Ok((dir, Note::Text(format!("fio {version}"))))
}

/// The default kernel's assets of the last `setup`, brought up to date when that is cheap
/// (initramfs images); runs the whole setup of that kernel when anything else is missing.
pub fn ensure(ws: &Workspace) -> Result<Assets> {
    ensure_kernel(ws, DEFAULT_KERNEL)
}

/// [`ensure`] for guest kernel `k`.
pub fn ensure_kernel(ws: &Workspace, k: GuestKernel) -> Result<Assets> {
    let tb = mkdir(ws.testbed())?;
    let _lock = Lock::acquire(&tb.join("setup.lock"))?;
    let kver = read_opt(&tb.join(k.current)).map(|s| s.trim().to_string());
    let drive = read_opt(&tb.join("drive-options")).map(|s| s.trim().to_string());
    let host_ok = Path::new(BUSYBOX).exists() && which(QEMU);
    match (kver, drive) {
        (Some(kver), Some(drive)) if host_ok && KernelDir::new(ws, k, &kver).complete() => {
            let kd = KernelDir::new(ws, k, &kver);
            let modules = if kd.iommufd {
                ensure_initramfs(&kd, ALL_MODES, None)?
            } else {
                let modules = ensure_initramfs(&kd, "iommu", None)?;
                ensure_initramfs(&kd, "noiommu", Some(&kd.vfio_ko()))?;
                modules
            };
            Ok(assets(k, &kd, modules, drive))
        }
        _ => {
            eprintln!(
                "vm: test-bed assets of kernel {} missing, running `cargo xtask setup` for it",
                k.name
            );
            setup_locked(ws, k)
        }
    }
}

/// The assets of guest kernel `k` as they are, without building anything (for `--print-cmd`).
pub fn current(ws: &Workspace, k: GuestKernel) -> Result<Assets> {
    let tb = ws.testbed();
    let kver = read_opt(&tb.join(k.current)).ok_or_else(|| {
        err!(
            "no test-bed assets of kernel {} yet: run `cargo xtask setup`",
            k.name
        )
    })?;
    let kd = KernelDir::new(ws, k, kver.trim());
    let drive = read_opt(&tb.join("drive-options")).unwrap_or_default();
    let modules = module_closure(&kd)?.0;
    Ok(assets(k, &kd, modules, drive.trim().to_string()))
}

fn assets(k: GuestKernel, kd: &KernelDir, modules: Vec<String>, drive_options: String) -> Assets {
    if kd.iommufd {
        // One initramfs and module tree, with the rebuilt VFIO set, for every mode.
        let initramfs = kd.initramfs(ALL_MODES);
        let lib_modules = vfio::tree_root(kd).join("lib/modules");
        return Assets {
            kernel: k,
            kver: kd.kver.clone(),
            vmlinux: kd.vmlinux(),
            initramfs_iommu: initramfs.clone(),
            initramfs_noiommu: initramfs.clone(),
            lib_modules_iommu: lib_modules.clone(),
            lib_modules_noiommu: lib_modules.clone(),
            iommufd: Some((initramfs, lib_modules)),
            modules,
            drive_options,
        };
    }
    Assets {
        kernel: k,
        kver: kd.kver.clone(),
        vmlinux: kd.vmlinux(),
        initramfs_iommu: kd.initramfs("iommu"),
        initramfs_noiommu: kd.initramfs("noiommu"),
        lib_modules_iommu: kd.kroot().join("lib/modules"),
        lib_modules_noiommu: kd.noiommu_root().join("lib/modules"),
        iommufd: None,
        modules,
        drive_options,
    }
}

fn ensure_initramfs(kd: &KernelDir, mode: &str, vfio: Option<&Path>) -> Result<Vec<String>> {
    let (modules, files) = module_closure(kd)?;
    if read_opt(&stamp_path(kd, mode)).as_deref() == Some(&stamp(kd, &files, vfio)?) {
        return Ok(modules);
    }
    step("setup", &format!("initramfs ({mode})"), || {
        initramfs(kd, mode, vfio)
    })
}

/// Is `prog` on `PATH`?
fn which(prog: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(prog).is_file()))
}

/// The kernel release `k.meta` depends on, e.g. `6.1.0-56-amd64`; remembered in `cache`
/// for as long as apt's package lists stay the same (asking apt takes ~1 s).
fn kernel_version(apt: &mut Apt, cache: &Path, k: GuestKernel) -> Result<String> {
    let lists = || {
        fs::metadata("/var/lib/apt/lists")
            .map(|m| format!("{}.{}", m.mtime(), m.mtime_nsec()))
            .unwrap_or_default()
    };
    let key = lists();
    if let Some((k, v)) = read_opt(cache).as_deref().and_then(|s| s.trim().split_once(' ')) {
        if k == key && !key.is_empty() {
            return Ok(v.to_string());
        }
    }
    let kver = ask_kernel_version(apt, k)?;
    write(cache, format!("{} {kver}\n", lists()))?;
    Ok(kver)
}

fn ask_kernel_version(apt: &mut Apt, k: GuestKernel) -> Result<String> {
    // The candidate version's dependency.
    if let Some(text) = apt.depends(k.meta)? {
        return text
            .lines()
            .find_map(|l| {
                l.trim()
                    .strip_prefix("Depends: linux-image-")
                    .map(|v| v.trim().to_string())
            })
            .ok_or_else(|| err!("{} depends on no linux-image-*\n{text}", k.meta));
    }
    if !k.backports {
        return Err(err!("apt knows no {}, even after `apt-get update`", k.meta));
    }
    // No such meta-package in this release's suites: bookworm-backports' kernel.
    apt.ensure_backports()?;
    let text = apt.show("linux-image-amd64")?;
    image_dependency(&text, |v| v.contains("bpo")).ok_or_else(|| {
        err!(
            "apt knows neither {} nor a backports linux-image-amd64 (~bpo), even with \
             bookworm-backports in its sources",
            k.meta
        )
    })
}

/// From `apt-cache show` of a kernel meta-package: the release its newest version whose
/// `Version` passes `version_ok` depends on (`Depends: linux-image-6.12.117+deb12-amd64` ->
/// `6.12.117+deb12-amd64`).
fn image_dependency(show: &str, version_ok: impl Fn(&str) -> bool) -> Option<String> {
    let mut best: Option<(String, String)> = None;
    for block in show.split("\n\n") {
        let field = |name: &str| {
            block
                .lines()
                .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()))
        };
        let (Some(version), Some(depends)) = (field("Version:"), field("Depends:")) else {
            continue;
        };
        if !version_ok(&version) {
            continue;
        }
        let Some(kver) = depends.split(',').find_map(|d| {
            let d = d.split('|').next().unwrap_or(d).trim();
            let name = d.split_whitespace().next().unwrap_or(d);
            name.strip_prefix("linux-image-").map(str::to_string)
        }) else {
            continue;
        };
        let newer = best.as_ref().is_none_or(|(v, _)| {
            Command::new("dpkg")
                .args(["--compare-versions", &version, "gt", v])
                .status()
                .is_ok_and(|s| s.success())
        });
        if newer {
            best = Some((version, kver));
        }
    }
    best.map(|(_, k)| k)
}

fn dpkg_x(deb: &Path, into: &Path) -> Result<()> {
    run_quiet(Command::new("dpkg").arg("-x").arg(deb).arg(into))?;
    Ok(())
}

/// `linux-image-<kver>` unpacked into `kroot/`, compressed modules (6.12's `.ko.xz`) unpacked to
/// plain `.ko`, with `modules.dep` from busybox's depmod (Debian generates it at install time;
/// the host may not even have kmod).
fn fetch_kernel(apt: &mut Apt, ws: &Workspace, kd: &KernelDir) -> Result<((), Note)> {
    if kd.kroot_done().exists() {
        return Ok(((), Note::Cached));
    }
    let debs = ws.testbed().join("debs");
    let _ = fs::remove_dir_all(&debs);
    let deb = &apt.download(&debs, &[format!("linux-image-{}", kd.kver)])?[0];
    let version = stdout_of(Command::new("dpkg-deb").args(["-f"]).arg(deb).arg("Version"))?;
    let _ = fs::remove_dir_all(kd.kroot());
    dpkg_x(deb, &kd.kroot())?;
    let unpacked = decompress_modules(&kd.module_dir())?;
    busybox_depmod(&kd.kroot(), &kd.kver)?;
    write(&kd.package_version(), version.trim())?;
    write(&kd.kroot_done(), "")?;
    fs::remove_dir_all(&debs)?;
    let note = match unpacked {
        0 => format!("linux-image-{} {}", kd.kver, version.trim()),
        n => format!("linux-image-{} {}, {n} modules unpacked", kd.kver, version.trim()),
    };
    Ok(((), Note::Text(note)))
}

/// `modules.dep` (and busybox's other indexes) of `root/lib/modules/<kver>`, by busybox's
/// depmod.
fn busybox_depmod(root: &Path, kver: &str) -> Result<()> {
    run_quiet(Command::new(BUSYBOX).args(["depmod", "-b"]).arg(root).arg(kver))?;
    Ok(())
}

/// Replaces every `*.ko.xz` under `dir` by the plain `*.ko` (`xz -d`, many files per call);
/// returns how many. The kernel loads either, but busybox's depmod, the initramfs builder and
/// the no-IOMMU tree expect `.ko` files, as 6.1 ships them.
fn decompress_modules(dir: &Path) -> Result<usize> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).context(d.display())? {
            let e = e?;
            let p = e.path();
            if e.file_type()?.is_dir() {
                stack.push(p);
            } else if p.to_string_lossy().ends_with(".ko.xz") {
                found.push(p);
            } else if p.to_string_lossy().ends_with(".ko.zst") || p.to_string_lossy().ends_with(".ko.gz") {
                return Err(err!(
                    "{}: only .ko and .ko.xz modules are handled (extend decompress_modules)",
                    p.display()
                ));
            }
        }
    }
    for chunk in found.chunks(256) {
        run_quiet(Command::new("xz").args(["-d", "-q", "-T1"]).args(chunk))?;
    }
    Ok(found.len())
}

/// The uncompressed kernel: QEMU boots it through its PVH entry point, which skips the
/// real-mode setup and the in-guest decompression (about 5 s of every boot under TCG).
///
/// The payload is found through the boot protocol's setup header (`setup_sects` at 0x1f1,
/// `payload_offset`/`payload_length` at 0x248/0x24c, counted from the protected-mode code at
/// `(setup_sects + 1) * 512`): XZ for 6.1, zstd for 6.12, whose payload ends in the 4-byte
/// uncompressed size the zstd tool would take for a broken frame.
fn extract_vmlinux(kd: &KernelDir) -> Result<((), Note)> {
    if kd.vmlinux().exists() {
        return Ok(((), Note::Cached));
    }
    let script = "import sys, lzma, struct, subprocess\n\
                  d = open(sys.argv[1], 'rb').read()\n\
                  sects = d[0x1f1] or 4\n\
                  off, n = struct.unpack_from('<II', d, 0x248)\n\
                  p = d[(sects + 1) * 512 + off:][:n]\n\
                  if p.startswith(b'\\xfd7zXZ\\x00'):\n\
                  \x20   out = lzma.LZMADecompressor().decompress(p)\n\
                  elif p.startswith(b'\\x28\\xb5\\x2f\\xfd'):\n\
                  \x20   out = subprocess.run(['zstd', '-d', '-q', '-c'], input=p[:-4], \
                  stdout=subprocess.PIPE, check=True).stdout\n\
                  else:\n\
                  \x20   sys.exit('bzImage payload is neither XZ nor zstd: %r' % p[:6])\n\
                  open(sys.argv[2], 'wb').write(out)\n";
    let tmp = kd.dir.join("vmlinux.tmp");
    run_quiet(
        Command::new(PYTHON)
            .arg("-c")
            .arg(script)
            .arg(kd.kroot().join(format!("boot/vmlinuz-{}", kd.kver)))
            .arg(&tmp),
    )?;
    if fs::read(&tmp)?.get(..4) != Some(b"\x7fELF") {
        return Err(err!("{}: not an ELF file", tmp.display()));
    }
    fs::rename(&tmp, kd.vmlinux())?;
    Ok(((), Note::None))
}

/// Recreates the directories of `src` under `dst` and calls `file(rel, from, to)` for each file.
fn link_tree(
    src: &Path,
    dst: &Path,
    rel: &Path,
    file: &mut dyn FnMut(&Path, &Path, &Path) -> std::io::Result<()>,
) -> Result<()> {
    mkdir(dst.join(rel))?;
    for e in fs::read_dir(src.join(rel)).context(src.join(rel).display())? {
        let e = e?;
        let r = rel.join(e.file_name());
        if e.file_type()?.is_dir() {
            link_tree(src, dst, &r, file)?;
        } else {
            file(&r, &src.join(&r), &dst.join(&r)).context(dst.join(&r).display())?;
        }
    }
    Ok(())
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Kernel module name as the kernel spells it (`vfio-pci` and `vfio_pci` are one module).
pub fn module_name(s: &str) -> String {
    s.replace('-', "_")
}

/// Finds the best drive options QEMU accepts for image files under `target/testbed/run`
/// (`cache=none` needs O_DIRECT from the file system, `aio=io_uring` a kernel that allows it).
fn probe_drive_options(ws: &Workspace) -> Result<String> {
    let dir = mkdir(ws.testbed().join("run"))?;
    let img = dir.join("probe.img");
    fs::File::create(&img)?.set_len(1 << 20)?;
    let mut found = None;
    for opts in DRIVE_OPTIONS {
        let mut child = Command::new(QEMU)
            .args(["-machine", "none", "-nodefaults", "-display", "none"])
            .args(["-monitor", "stdio", "-drive"])
            .arg(format!("file={},if=none,id=d0,format=raw,{opts}", img.display()))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context(QEMU)?;
        if let Some(mut stdin) = child.stdin.take() {
            use std::io::Write;
            let _ = stdin.write_all(b"quit\n");
        }
        if child.wait()?.success() {
            found = Some(opts.to_string());
            break;
        }
    }
    fs::remove_file(&img)?;
    let found = found.ok_or_else(|| err!("QEMU accepts none of {DRIVE_OPTIONS:?}"))?;
    write(&ws.testbed().join("drive-options"), &found)?;
    Ok(found)
}
