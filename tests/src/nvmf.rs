//! NVMe over TCP in the guest: kernel modules, loopback, the Linux kernel's target (`nvmet-tcp`
//! over configfs) and initiator (`nvme-cli`), and O_DIRECT block I/O with `dd`.
//!
//! What the NVMe/TCP tests and the target benchmark build on; `tests/nvmf_env.rs` proves each
//! piece and lists the commands and pitfalls. The guest kernel loads no module by itself (its
//! usermode helper `/sbin/modprobe` does not exist in the init's root), so every helper loads
//! what it needs up front with `busybox modprobe` (the guest has no kmod).

use std::fs;
use std::path::{Path, PathBuf};

use vfpoll_pci::Host;

use crate::{bdf, run};

/// The modules of the Linux NVMe/TCP initiator: `nvme-tcp` (with `nvme-fabrics` and `nvme-core`)
/// and `crc32c_generic`, without which `nvme connect --hdr-digest/--data-digest` fails ("Failed
/// to write to /dev/nvme-fabrics: No such file or directory"; dmesg: "failed to allocate queue
/// 0 crypto").
pub const NVME_TCP_MODULES: &[&str] = &["crc32c_generic", "nvme-tcp"];

/// The modules of the Linux kernel's NVMe/TCP target: `nvmet-tcp` (with `nvmet` and `configfs`)
/// and `crc32c_generic` for digests. nvmet would ask for `nvmet-transport-3` when a TCP port is
/// linked to a subsystem; nothing answers that request in the guest.
pub const NVMET_TCP_MODULES: &[&str] = &["crc32c_generic", "configfs", "nvmet", "nvmet-tcp"];

/// ext4, and the crc32c its metadata checksums need: busybox's modprobe ignores ext4's soft
/// dependency (`pre: crypto-crc32c`), so crc32c is named here and loaded first.
pub const EXT4_MODULES: &[&str] = &["crc32c_generic", "ext4"];

/// The NVMe/TCP port (IANA's, the kernel target's and nvme-cli's default).
pub const NVMF_TCP_PORT: u16 = 4420;

/// The host NQN the tests' initiator connects with (`--hostnqn`): fixed, so that a target's
/// allowed-host list can name it, rather than the host's `/etc/nvme/hostnqn`, which may be absent.
pub const HOST_NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:5f1c1a52-7a8e-4c8b-9d0e-76667061726b";
/// The host ID that goes with [`HOST_NQN`] (`--hostid`; the same UUID, as nvme-cli prefers).
pub const HOST_ID: &str = "5f1c1a52-7a8e-4c8b-9d0e-76667061726b";

/// Where configfs is mounted (the kernel target's configuration lives in `nvmet/` below it).
pub const CONFIGFS: &str = "/sys/kernel/config";

/// Loads kernel modules with `busybox modprobe`, which also loads what `modules.dep` says each
/// needs (but not soft dependencies); skips those already present in `/sys/module`. Names may
/// use `-` or `_`. Panics with modprobe's output when one cannot be loaded.
pub fn load_modules(modules: &[&str]) {
    for m in modules {
        let sys = Path::new("/sys/module").join(m.replace('-', "_"));
        if sys.exists() {
            continue;
        }
        let out = std::process::Command::new("busybox")
            .args(["modprobe", m])
            .output()
            .unwrap_or_else(|e| panic!("busybox modprobe {m}: {e}"));
        assert!(
            out.status.success() && sys.exists(),
            "busybox modprobe {m} failed ({}): {}{}; the guest's /lib/modules holds every module \
             of its kernel (cargo xtask setup unpacks Debian's): is {m} one of them?",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Whether the guest's loopback interface is up (`IFF_UP` in its flags).
fn loopback_is_up() -> bool {
    let flags = fs::read_to_string("/sys/class/net/lo/flags").unwrap_or_default();
    u32::from_str_radix(flags.trim().trim_start_matches("0x"), 16).is_ok_and(|f| f & 1 != 0)
}

/// Brings the guest's loopback interface up (idempotent). It starts down: the guest's init
/// configures no network, and its NICs sit on a QEMU hub joined to nothing, so NVMe/TCP tests
/// listen and connect on 127.0.0.1 (which the kernel puts on `lo` when it comes up).
pub fn loopback_up() {
    if loopback_is_up() {
        return;
    }
    run("busybox", &["ip", "link", "set", "lo", "up"]);
    assert!(loopback_is_up(), "lo is still down after `ip link set lo up`");
}

/// Whether `addr` is an IPv4 or IPv6 loopback address.
fn is_loopback(addr: &str) -> bool {
    addr.parse::<std::net::IpAddr>().is_ok_and(|a| a.is_loopback())
}

/// Mounts configfs at [`CONFIGFS`] unless it is there already (loading the module first).
pub fn mount_configfs() {
    load_modules(&["configfs"]);
    let mounts = fs::read_to_string("/proc/mounts").expect("/proc/mounts");
    let mounted = mounts.lines().any(|l| {
        let mut f = l.split_whitespace().skip(1);
        (f.next(), f.next()) == (Some(CONFIGFS), Some("configfs"))
    });
    if !mounted {
        run("busybox", &["mount", "-t", "configfs", "configfs", CONFIGFS]);
    }
}

/// The last `lines` lines of the kernel log, for panic messages (nvmet and nvme-tcp say there
/// why a configfs write or a connect failed).
pub fn kernel_log_tail(lines: usize) -> String {
    let out = std::process::Command::new("busybox")
        .arg("dmesg")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_else(|e| format!("(busybox dmesg: {e})"));
    let all: Vec<&str> = out.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A loaded module's reference count (`/sys/module/<name>/refcnt`). Every crc32c transform the
/// kernel allocates holds one on `crc32c_generic` (the only crc32c the tests load): NVMe/TCP
/// queues with digests on allocate them, queues without do not.
pub fn module_refcnt(name: &str) -> u64 {
    let p = Path::new("/sys/module")
        .join(name.replace('-', "_"))
        .join("refcnt");
    let s = fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e} (module not loaded?)", p.display()));
    s.trim()
        .parse()
        .unwrap_or_else(|e| panic!("{}: {s:?}: {e}", p.display()))
}

/// The disk name to open for a namespace entry of an NVMe controller's sysfs directory:
/// `nvme1n1` stays `nvme1n1`, the hidden multipath path `nvme5c5n1` gives its head `nvme5n1`;
/// any other name (`ng1n1`, `nvme1`, `hwmon0`, a partition `nvme1n1p1`) gives `None`.
///
/// With native NVMe multipath (Debian's `CONFIG_NVME_MULTIPATH=y`), a namespace that may be
/// shared (every fabric namespace of the kernel target, which reports CMIC multi-controller)
/// appears under its controller as the path `nvme<S>c<C>n<H>`, hidden and without a device node;
/// the block device is the head `nvme<S>n<H>`. A private namespace (the test bed's PCIe ones) is
/// `nvme<S>n<H>` itself. `S` is the subsystem's instance, not always the controller's.
pub fn nvme_disk_head(name: &str) -> Option<String> {
    fn digits(s: &str) -> Option<(&str, &str)> {
        let n = s.bytes().take_while(u8::is_ascii_digit).count();
        (n > 0).then(|| s.split_at(n))
    }
    let (subsys, rest) = digits(name.strip_prefix("nvme")?)?;
    let rest = match rest.strip_prefix('c') {
        Some(r) => digits(r)?.1,
        None => rest,
    };
    let (head, tail) = digits(rest.strip_prefix('n')?)?;
    tail.is_empty().then(|| format!("nvme{subsys}n{head}"))
}

/// The block device (`/dev/nvme<S>n<H>`) of namespace `nsid` of the NVMe controller whose sysfs
/// directory is `ctrl` (`/sys/class/nvme/nvmeN`), or `None` while the kernel has not made it
/// (namespaces are scanned after a controller goes live, asynchronously). See [`nvme_disk_head`].
pub fn nvme_namespace_device(ctrl: &Path, nsid: u32) -> Option<PathBuf> {
    for e in fs::read_dir(ctrl).ok()?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(head) = nvme_disk_head(&name) else {
            continue;
        };
        let ns = fs::read_to_string(Path::new("/sys/block").join(&name).join("nsid")).unwrap_or_default();
        // The head's sysfs entry too: right after another controller of the same subsystem
        // went away, a node of the same name may still be in /dev before the new head exists.
        let ready = Path::new("/sys/block").join(&head).join("size").exists();
        let dev = Path::new("/dev").join(head);
        if ns.trim().parse::<u32>() == Ok(nsid) && ready && dev.exists() {
            return Some(dev);
        }
    }
    None
}

/// The block device of namespace `nsid` of the NVMe controller at PCI address `bdf`, which must be
/// on the kernel's nvme driver (every test-bed controller is at boot), e.g. `/dev/nvme1n1` for
/// [`crate::NVME_B`]. Controller numbers follow probe order, so tests never name them.
pub fn pci_nvme_namespace(bdf_s: &str, nsid: u32) -> PathBuf {
    let dir = Host::default().pci_device_dir(bdf(bdf_s)).join("nvme");
    let ctrl = fs::read_dir(&dir)
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e}: is {bdf_s} on the kernel's nvme driver (not vfio-pci)?",
                dir.display()
            )
        })
        .flatten()
        .next()
        .unwrap_or_else(|| panic!("{} is empty: {bdf_s} has no nvme controller", dir.display()))
        .path();
    nvme_namespace_device(&ctrl, nsid).unwrap_or_else(|| {
        panic!(
            "{bdf_s} ({}) has no block device for namespace {nsid}",
            ctrl.display()
        )
    })
}

/// What the Linux kernel target serves: one subsystem on one TCP port (see [`KernelTarget`]).
#[derive(Debug, Clone)]
pub struct KernelTargetConfig<'a> {
    /// The subsystem NQN.
    pub nqn: &'a str,
    /// The namespaces: (NSID, block device backing it, e.g. from [`pci_nvme_namespace`]).
    pub namespaces: &'a [(u32, &'a Path)],
    /// The address to listen on (IPv4 or IPv6).
    pub traddr: &'a str,
    /// The TCP port.
    pub trsvcid: u16,
    /// The nvmet port number (`ports/<id>` in configfs), unique among the ports set up at once.
    pub port_id: u32,
    /// Host NQNs allowed to connect; empty: any host (`attr_allow_any_host`).
    pub allowed_hosts: &'a [&'a str],
}

impl<'a> KernelTargetConfig<'a> {
    /// `namespaces` of subsystem `nqn` on 127.0.0.1:4420 (nvmet port 1), for any host.
    pub fn loopback(nqn: &'a str, namespaces: &'a [(u32, &'a Path)]) -> Self {
        KernelTargetConfig {
            nqn,
            namespaces,
            traddr: "127.0.0.1",
            trsvcid: NVMF_TCP_PORT,
            port_id: 1,
            allowed_hosts: &[],
        }
    }
}

/// One thing [`KernelTarget::start`] made in configfs, undone by its teardown.
#[derive(Debug)]
enum Made {
    Dir(PathBuf),
    Link(PathBuf),
    /// A namespace directory whose `enable` is 1.
    Enabled(PathBuf),
}

/// The Linux kernel's NVMe/TCP target (`nvmet-tcp`) serving one subsystem on one port, set up
/// over configfs by [`KernelTarget::start`]; [`KernelTarget::stop`] (or a drop) removes all of
/// it again, newest first. What it writes, as a shell would:
///
/// ```text
/// cd /sys/kernel/config/nvmet
/// mkdir subsystems/$NQN; echo 1 > subsystems/$NQN/attr_allow_any_host
///   (or: mkdir hosts/$HOST; ln -s hosts/$HOST subsystems/$NQN/allowed_hosts/$HOST)
/// mkdir subsystems/$NQN/namespaces/1
/// echo /dev/nvme1n1 > subsystems/$NQN/namespaces/1/device_path
/// echo 1 > subsystems/$NQN/namespaces/1/enable
/// mkdir ports/1; echo tcp > ports/1/addr_trtype; echo ipv4 > ports/1/addr_adrfam
/// echo 127.0.0.1 > ports/1/addr_traddr; echo 4420 > ports/1/addr_trsvcid
/// ln -s subsystems/$NQN ports/1/subsystems/$NQN      # listening from here on
/// ```
///
/// Teardown is the reverse: `rm` the links, `echo 0 > enable`, `rmdir` the directories
/// (configfs refuses `rm -r`). Disconnect the initiator first: a host whose controller the
/// target drops keeps reconnecting (every 10 s, for 10 minutes) and holds its device meanwhile.
#[derive(Debug)]
pub struct KernelTarget {
    nqn: String,
    made: Vec<Made>,
}

impl KernelTarget {
    /// Loads [`NVMET_TCP_MODULES`], mounts configfs, brings `lo` up for a loopback address and
    /// sets the target up. Panics (after undoing what it made) with the kernel's last messages
    /// when a step fails.
    pub fn start(c: &KernelTargetConfig) -> Self {
        load_modules(NVMET_TCP_MODULES);
        mount_configfs();
        if is_loopback(c.traddr) {
            loopback_up();
        }
        let root = Path::new(CONFIGFS).join("nvmet");
        let mut t = KernelTarget {
            nqn: c.nqn.to_string(),
            made: Vec::new(),
        };
        let subsys = root.join("subsystems").join(c.nqn);
        t.mkdir(&subsys);
        if c.allowed_hosts.is_empty() {
            configfs_write(&subsys.join("attr_allow_any_host"), "1");
        }
        for h in c.allowed_hosts {
            let host = root.join("hosts").join(h);
            // A host entry another target made stays theirs.
            if !host.exists() {
                t.mkdir(&host);
            }
            t.symlink(&host, &subsys.join("allowed_hosts").join(h));
        }
        for (nsid, dev) in c.namespaces {
            let ns = subsys.join("namespaces").join(nsid.to_string());
            t.mkdir(&ns);
            configfs_write(&ns.join("device_path"), &dev.display().to_string());
            configfs_write(&ns.join("enable"), "1");
            t.made.push(Made::Enabled(ns));
        }
        let port = root.join("ports").join(c.port_id.to_string());
        t.mkdir(&port);
        let adrfam = if c.traddr.parse::<std::net::Ipv6Addr>().is_ok() {
            "ipv6"
        } else {
            "ipv4"
        };
        configfs_write(&port.join("addr_trtype"), "tcp");
        configfs_write(&port.join("addr_adrfam"), adrfam);
        configfs_write(&port.join("addr_traddr"), c.traddr);
        configfs_write(&port.join("addr_trsvcid"), &c.trsvcid.to_string());
        t.symlink(&subsys, &port.join("subsystems").join(c.nqn));
        t
    }

    /// The subsystem NQN.
    pub fn nqn(&self) -> &str {
        &self.nqn
    }

    fn mkdir(&mut self, p: &Path) {
        fs::create_dir(p).unwrap_or_else(|e| {
            panic!(
                "mkdir {}: {e} (left over from an earlier run? its teardown failed)\n{}",
                p.display(),
                kernel_log_tail(5)
            )
        });
        self.made.push(Made::Dir(p.to_path_buf()));
    }

    fn symlink(&mut self, target: &Path, link: &Path) {
        std::os::unix::fs::symlink(target, link).unwrap_or_else(|e| {
            panic!(
                "ln -s {} {}: {e}\n{}",
                target.display(),
                link.display(),
                kernel_log_tail(5)
            )
        });
        self.made.push(Made::Link(link.to_path_buf()));
    }

    /// Undoes everything made, newest first; the failures, as text.
    fn teardown(&mut self) -> Vec<String> {
        let mut errors = Vec::new();
        while let Some(m) = self.made.pop() {
            let (what, res) = match &m {
                Made::Link(p) => (format!("rm {}", p.display()), fs::remove_file(p)),
                Made::Dir(p) => (format!("rmdir {}", p.display()), fs::remove_dir(p)),
                Made::Enabled(p) => (
                    format!("echo 0 > {}/enable", p.display()),
                    fs::write(p.join("enable"), "0"),
                ),
            };
            if let Err(e) = res {
                errors.push(format!("{what}: {e}"));
            }
        }
        errors
    }

    /// Removes the port, namespaces and subsystem from configfs; panics if any of it stays.
    pub fn stop(mut self) {
        let errors = self.teardown();
        assert!(
            errors.is_empty(),
            "kernel target {} teardown: {}\n{}",
            self.nqn,
            errors.join("; "),
            kernel_log_tail(5)
        );
        let subsys = Path::new(CONFIGFS).join("nvmet/subsystems").join(&self.nqn);
        assert!(
            !subsys.exists(),
            "{} still exists after teardown",
            subsys.display()
        );
    }
}

impl Drop for KernelTarget {
    fn drop(&mut self) {
        let errors = self.teardown();
        if !errors.is_empty() && !std::thread::panicking() {
            panic!("kernel target {} teardown: {}", self.nqn, errors.join("; "));
        }
    }
}

/// Writes a configfs attribute; panics with the kernel's last messages (nvmet says there why it
/// refused, e.g. a `device_path` that is no block device).
fn configfs_write(p: &Path, value: &str) {
    fs::write(p, value)
        .unwrap_or_else(|e| panic!("echo {value} > {}: {e}\n{}", p.display(), kernel_log_tail(5)));
}

/// `nvme connect` over TCP (nvme-cli 2.x), field by field.
#[derive(Debug, Clone)]
pub struct NvmeConnect<'a> {
    /// Target address.
    pub traddr: &'a str,
    /// Target TCP port.
    pub trsvcid: u16,
    /// Subsystem NQN.
    pub nqn: &'a str,
    /// `--nr-io-queues` (the kernel's default: one per CPU).
    pub nr_io_queues: Option<u32>,
    /// `--hdr-digest`: a CRC32C after each PDU header.
    pub hdr_digest: bool,
    /// `--data-digest`: a CRC32C after each PDU's data.
    pub data_digest: bool,
    /// `--hostnqn`.
    pub host_nqn: &'a str,
    /// `--hostid`.
    pub host_id: &'a str,
    /// More arguments, as nvme-cli takes them (e.g. `--keep-alive-tmo=5`).
    pub extra: &'a [&'a str],
}

impl<'a> NvmeConnect<'a> {
    /// Subsystem `nqn` at 127.0.0.1:4420 as [`HOST_NQN`], no digests, default queues.
    pub fn loopback(nqn: &'a str) -> Self {
        NvmeConnect {
            traddr: "127.0.0.1",
            trsvcid: NVMF_TCP_PORT,
            nqn,
            nr_io_queues: None,
            hdr_digest: false,
            data_digest: false,
            host_nqn: HOST_NQN,
            host_id: HOST_ID,
            extra: &[],
        }
    }

    /// The arguments of `nvme`.
    pub fn args(&self) -> Vec<String> {
        let mut a: Vec<String> = ["connect", "-t", "tcp", "-a", self.traddr, "-s"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        a.push(self.trsvcid.to_string());
        a.extend(
            [
                "-n",
                self.nqn,
                "--hostnqn",
                self.host_nqn,
                "--hostid",
                self.host_id,
            ]
            .map(String::from),
        );
        if let Some(n) = self.nr_io_queues {
            a.extend(["--nr-io-queues".to_string(), n.to_string()]);
        }
        if self.hdr_digest {
            a.push("--hdr-digest".into());
        }
        if self.data_digest {
            a.push("--data-digest".into());
        }
        a.extend(self.extra.iter().map(|s| s.to_string()));
        a
    }
}

/// The kernel initiator's TCP controllers (`nvmeN`) of subsystem `nqn`.
fn tcp_controllers(nqn: &str) -> Vec<String> {
    let attr = |c: &Path, a: &str| {
        fs::read_to_string(c.join(a))
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    let mut v: Vec<String> = fs::read_dir("/sys/class/nvme")
        .map(|d| {
            d.flatten()
                .filter(|e| attr(&e.path(), "transport") == "tcp" && attr(&e.path(), "subsysnqn") == nqn)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// A controller of the kernel's NVMe/TCP initiator, made by `nvme connect`; `nvme disconnect`
/// on [`FabricController::disconnect`] or drop.
#[derive(Debug)]
pub struct FabricController {
    name: String,
    connected: bool,
}

impl FabricController {
    /// Loads [`NVME_TCP_MODULES`], brings `lo` up for a loopback address, runs `nvme connect` and
    /// finds the controller it made in sysfs (the one of `c.nqn` that was not there before).
    /// Panics with nvme-cli's output and the kernel's last messages when it fails.
    pub fn connect(c: &NvmeConnect) -> Self {
        load_modules(NVME_TCP_MODULES);
        if is_loopback(c.traddr) {
            loopback_up();
        }
        let before = tcp_controllers(c.nqn);
        let args = c.args();
        let out = std::process::Command::new("nvme")
            .args(&args)
            .output()
            .unwrap_or_else(|e| panic!("nvme: {e} (is nvme-cli installed? cargo xtask setup installs it)"));
        assert!(
            out.status.success(),
            "nvme {} failed ({}): {}{}\n{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            kernel_log_tail(5)
        );
        let new: Vec<String> = tcp_controllers(c.nqn)
            .into_iter()
            .filter(|n| !before.contains(n))
            .collect();
        match new.as_slice() {
            [one] => FabricController {
                name: one.clone(),
                connected: true,
            },
            _ => panic!(
                "nvme {} succeeded, but sysfs shows {new:?} as its new TCP controllers of {}",
                args.join(" "),
                c.nqn
            ),
        }
    }

    /// The controller's name, e.g. `nvme5`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `/sys/class/nvme/<name>`.
    pub fn sysfs_dir(&self) -> PathBuf {
        Path::new("/sys/class/nvme").join(&self.name)
    }

    /// A sysfs attribute of the controller, trimmed: `state` (`live`), `queue_count` (admin + I/O
    /// queues), `address` (`traddr=...,trsvcid=...,src_addr=...`), `cntlid`, `hostnqn`, `kato`, ...
    pub fn attr(&self, name: &str) -> String {
        let p = self.sysfs_dir().join(name);
        fs::read_to_string(&p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .trim()
            .to_string()
    }

    /// Waits up to `timeout` for the block device of namespace `nsid` (the kernel scans
    /// namespaces after `nvme connect` has returned) and returns it, e.g. `/dev/nvme5n1`.
    pub fn wait_namespace(&self, nsid: u32, timeout: std::time::Duration) -> PathBuf {
        let t0 = std::time::Instant::now();
        loop {
            if let Some(dev) = nvme_namespace_device(&self.sysfs_dir(), nsid) {
                return dev;
            }
            assert!(
                t0.elapsed() < timeout,
                "{}: no block device for namespace {nsid} after {timeout:?}\n{}",
                self.name,
                kernel_log_tail(5)
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Runs `nvme disconnect -d <name>` and waits (10 s at most) until the controller is gone.
    pub fn disconnect(mut self) {
        self.connected = false;
        run("nvme", &["disconnect", "-d", &self.name]);
        let t0 = std::time::Instant::now();
        while self.sysfs_dir().exists() {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(10),
                "{} still exists 10 s after nvme disconnect",
                self.sysfs_dir().display()
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Drop for FabricController {
    fn drop(&mut self) {
        if self.connected {
            let _ = std::process::Command::new("nvme")
                .args(["disconnect", "-d", &self.name])
                .output();
        }
    }
}

/// One record of a discovery log page, as `nvme discover` prints it (`trtype`, `adrfam`,
/// `subtype`, `treq`, `portid`, `trsvcid`, `subnqn`, `traddr`, ...).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiscoveryRecord {
    /// (field, value) in the order printed.
    pub fields: Vec<(String, String)>,
}

impl DiscoveryRecord {
    /// The value of `field`.
    pub fn get(&self, field: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == field)
            .map(|(_, v)| v.as_str())
    }
}

/// The records of `nvme discover`'s normal output: each starts at a line
/// `=====Discovery Log Entry N======`, then `field: value` lines.
pub fn parse_discovery_log(text: &str) -> Vec<DiscoveryRecord> {
    let mut records: Vec<DiscoveryRecord> = Vec::new();
    for line in text.lines() {
        if line.starts_with("=====Discovery Log Entry") {
            records.push(DiscoveryRecord::default());
        } else if let (Some(r), Some((k, v))) = (records.last_mut(), line.split_once(':')) {
            r.fields.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    records
}

/// `nvme discover -t tcp -a <traddr> -s <trsvcid>` as [`HOST_NQN`] (after loading
/// [`NVME_TCP_MODULES`] and bringing `lo` up for a loopback address): the discovery log's records.
pub fn nvme_discover(traddr: &str, trsvcid: u16) -> Vec<DiscoveryRecord> {
    load_modules(NVME_TCP_MODULES);
    if is_loopback(traddr) {
        loopback_up();
    }
    let port = trsvcid.to_string();
    let out = run(
        "nvme",
        &[
            "discover",
            "-t",
            "tcp",
            "-a",
            traddr,
            "-s",
            &port,
            "--hostnqn",
            HOST_NQN,
            "--hostid",
            HOST_ID,
        ],
    );
    parse_discovery_log(&String::from_utf8_lossy(&out.stdout))
}

/// Writes `data` at byte `offset` of block device `dev` in one O_DIRECT write of `data.len()`
/// bytes, then fsync (a Flush): GNU dd `bs=<len> count=1 oflag=direct,seek_bytes conv=fsync`,
/// fed on stdin. One request, so a write larger than the target's in-capsule size takes its R2T
/// path. `offset` and the length must be multiples of the logical block size.
pub fn dd_write_direct(dev: &Path, offset: u64, data: &[u8]) {
    use std::io::Write;
    let args = [
        format!("of={}", dev.display()),
        format!("bs={}", data.len()),
        "count=1".into(),
        format!("seek={offset}"),
        "iflag=fullblock".into(),
        "oflag=direct,seek_bytes".into(),
        "conv=fsync".into(),
        "status=none".into(),
    ];
    let mut child = std::process::Command::new("dd")
        .args(&args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("dd: {e}"));
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(data)
        .unwrap_or_else(|e| panic!("dd {args:?}: writing its stdin: {e}"));
    let out = child.wait_with_output().expect("dd");
    assert!(
        out.status.success(),
        "dd {args:?}: {}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        kernel_log_tail(5)
    );
}

/// Reads `len` bytes at byte `offset` of block device `dev` in one O_DIRECT read (GNU dd
/// `bs=<len> count=1 iflag=direct,skip_bytes`).
pub fn dd_read_direct(dev: &Path, offset: u64, len: usize) -> Vec<u8> {
    let out = run(
        "dd",
        &[
            &format!("if={}", dev.display()),
            &format!("bs={len}"),
            "count=1",
            &format!("skip={offset}"),
            "iflag=direct,skip_bytes",
            "status=none",
        ],
    );
    assert_eq!(
        out.stdout.len(),
        len,
        "dd read {len} bytes at {offset} of {}: got {}",
        dev.display(),
        out.stdout.len()
    );
    out.stdout
}

/// `vfpoll target` as a child process serving subsystem `nqn` on 127.0.0.1:[`NVMF_TCP_PORT`],
/// killed on drop. Its data buffers are 2 MiB hugepages: reserve some first
/// ([`crate::reserve_hugepages`]).
#[derive(Debug)]
pub struct VfpollTarget {
    child: std::process::Child,
    /// The rest of its standard output (kept open: the target prints on reloads).
    stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl VfpollTarget {
    /// Starts `vfpoll target --listen 127.0.0.1:4420 --nqn <nqn> <args>` (`--malloc 64M`, `--ns
    /// BDF/NSID`, `--allow-host NQN`, ...) and waits for its first line, which says it listens.
    /// Panics with that line and its exit status when it does not start.
    pub fn start(nqn: &str, args: &[&str]) -> Self {
        use std::io::BufRead;
        let listen = format!("127.0.0.1:{NVMF_TCP_PORT}");
        let mut child = std::process::Command::new("vfpoll")
            .args(["target", "--listen", &listen, "--nqn", nqn])
            .args(args)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("vfpoll target: cannot start: {e} (is vfpoll on PATH?)"));
        let mut line = String::new();
        let out = child.stdout.take().expect("piped stdout");
        let mut stdout = std::io::BufReader::new(out);
        stdout.read_line(&mut line).expect("vfpoll target's first line");
        assert!(
            line.starts_with("vfpoll target:") && line.contains(&listen),
            "vfpoll target {args:?} did not start: {line:?} (status {:?})",
            child.try_wait()
        );
        VfpollTarget { child, stdout }
    }

    /// Starts `vfpoll target --config <config> <args>` and waits for its first line (one per
    /// subsystem), which must name `first_nqn`.
    pub fn with_config(config: &Path, first_nqn: &str, args: &[&str]) -> Self {
        use std::io::BufRead;
        let mut child = std::process::Command::new("vfpoll")
            .arg("target")
            .arg("--config")
            .arg(config)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("vfpoll target: cannot start: {e} (is vfpoll on PATH?)"));
        let mut stdout = std::io::BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("vfpoll target's first line");
        assert!(
            line.starts_with("vfpoll target:") && line.contains(first_nqn),
            "vfpoll target --config {} did not start: {line:?} (status {:?})",
            config.display(),
            child.try_wait()
        );
        VfpollTarget { child, stdout }
    }

    /// Sends SIGHUP (reload `--config`) and returns the lines the target prints about it, up
    /// to `lines` of them or the first that says the reload was refused.
    pub fn reload(&mut self, lines: usize) -> Vec<String> {
        use std::io::BufRead;
        run("kill", &["-HUP", &self.child.id().to_string()]);
        let mut out = Vec::new();
        while out.len() < lines {
            let mut line = String::new();
            let n = self.stdout.read_line(&mut line).expect("vfpoll target's output");
            assert!(n > 0, "vfpoll target ended during a reload; it said {out:?}");
            if !line.contains("reload") {
                continue;
            }
            let refused = line.contains("reload refused");
            out.push(line.trim().to_string());
            if refused {
                break;
            }
        }
        out
    }

    /// The next line the target prints (e.g. a `--stats-json` line).
    pub fn next_line(&mut self) -> String {
        use std::io::BufRead;
        let mut line = String::new();
        let n = self.stdout.read_line(&mut line).expect("vfpoll target's output");
        assert!(n > 0, "vfpoll target ended");
        line
    }

    /// Whether the process is still running (it has not exited or been killed).
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for VfpollTarget {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `nvme connect` that must fail (a refused host, a wrong NQN) and returns nvme-cli's output;
/// panics when it succeeds, after disconnecting what it made.
pub fn nvme_connect_refused(c: &NvmeConnect) -> String {
    load_modules(NVME_TCP_MODULES);
    if is_loopback(c.traddr) {
        loopback_up();
    }
    let before = tcp_controllers(c.nqn);
    let args = c.args();
    let out = std::process::Command::new("nvme")
        .args(&args)
        .output()
        .unwrap_or_else(|e| panic!("nvme: {e} (is nvme-cli installed? cargo xtask setup installs it)"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let new: Vec<String> = tcp_controllers(c.nqn)
        .into_iter()
        .filter(|n| !before.contains(n))
        .collect();
    for n in &new {
        let _ = std::process::Command::new("nvme")
            .args(["disconnect", "-d", n])
            .output();
    }
    assert!(
        !out.status.success() && new.is_empty(),
        "nvme {} was to be refused, but it exited {} and made {new:?}: {text}",
        args.join(" "),
        out.status
    );
    text
}

/// Asks the kernel's initiator for a controller by writing `c`'s options to
/// `/dev/nvme-fabrics` directly, with `duplicate_connect` (nvme-cli stops at "already
/// connected" when a controller to the same address and subsystem exists, whatever the host
/// NQN, so its refusals need not come from the target). The write must fail: returns its
/// error and the kernel log's last lines; panics when a controller was made (after removing it).
pub fn fabrics_connect_refused(c: &NvmeConnect) -> (std::io::Error, String) {
    use std::io::Write;
    load_modules(NVME_TCP_MODULES);
    let opts = format!(
        "transport=tcp,traddr={},trsvcid={},nqn={},hostnqn={},hostid={},duplicate_connect",
        c.traddr, c.trsvcid, c.nqn, c.host_nqn, c.host_id
    );
    let before = tcp_controllers(c.nqn);
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/nvme-fabrics")
        .expect("/dev/nvme-fabrics (is nvme-fabrics loaded?)");
    let r = f.write_all(opts.as_bytes());
    let new: Vec<String> = tcp_controllers(c.nqn)
        .into_iter()
        .filter(|n| !before.contains(n))
        .collect();
    for n in &new {
        let _ = std::process::Command::new("nvme")
            .args(["disconnect", "-d", n])
            .output();
    }
    match r {
        Err(e) if new.is_empty() => (e, kernel_log_tail(5)),
        _ => panic!("{opts} was to be refused, but it made {new:?} ({r:?})"),
    }
}
