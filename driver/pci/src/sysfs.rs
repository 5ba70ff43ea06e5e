//! Device discovery through sysfs.
//!
//! Every path is taken relative to a [`Host`], so tests point the same code at a fake tree
//! (`tempfile` + a few files and symlinks) instead of the real `/sys`, `/proc` and `/dev`.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::bdf::Bdf;

/// Where the kernel's pseudo file systems are mounted. [`Host::default`] is the real machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// sysfs, normally `/sys`.
    pub sys: PathBuf,
    /// procfs, normally `/proc`.
    pub proc: PathBuf,
    /// devtmpfs, normally `/dev`.
    pub dev: PathBuf,
}

impl Default for Host {
    fn default() -> Self {
        Host {
            sys: "/sys".into(),
            proc: "/proc".into(),
            dev: "/dev".into(),
        }
    }
}

impl Host {
    /// A host whose `sys`, `proc` and `dev` are the folders of those names under `root`.
    pub fn under(root: impl AsRef<Path>) -> Self {
        let r = root.as_ref();
        Host {
            sys: r.join("sys"),
            proc: r.join("proc"),
            dev: r.join("dev"),
        }
    }

    /// `/sys/bus/pci/devices/<bdf>`.
    pub fn pci_device_dir(&self, bdf: Bdf) -> PathBuf {
        self.sys.join("bus/pci/devices").join(bdf.to_string())
    }

    /// `/sys/bus/pci/drivers/<name>`.
    pub fn pci_driver_dir(&self, name: &str) -> PathBuf {
        self.sys.join("bus/pci/drivers").join(name)
    }

    /// `/sys/kernel/iommu_groups/<group>`.
    pub fn iommu_group_dir(&self, group: u32) -> PathBuf {
        self.sys.join("kernel/iommu_groups").join(group.to_string())
    }
}

/// Errors of discovery.
#[derive(Debug, thiserror::Error)]
pub enum SysfsError {
    /// The device is not in sysfs.
    #[error(
        "no PCI device {bdf} on this machine ({path} is absent); `vfpoll status` lists the devices present"
    )]
    NoSuchDevice {
        /// The address asked for.
        bdf: Bdf,
        /// The sysfs folder that would describe it.
        path: PathBuf,
    },
    /// A sysfs file could not be read or parsed.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// sysfs is not mounted where expected.
    #[error("{path} is missing: is sysfs mounted? (mount -t sysfs sysfs /sys)")]
    NoSysfs {
        /// The folder looked for.
        path: PathBuf,
    },
}

/// What sysfs says about one PCI function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciDevice {
    /// Its address.
    pub bdf: Bdf,
    /// Vendor ID.
    pub vendor: u16,
    /// Device ID.
    pub device: u16,
    /// Class code, 24 bits (base class, subclass, programming interface).
    pub class: u32,
    /// The kernel driver bound to it, if any (`nvme`, `vfio-pci`, ...).
    pub driver: Option<String>,
    /// The driver named in `driver_override`, if set.
    pub driver_override: Option<String>,
    /// Its IOMMU group (also present in no-IOMMU mode once vfio made a fake group).
    pub iommu_group: Option<u32>,
    /// The NUMA node, `None` where the platform reports -1.
    pub numa_node: Option<u32>,
}

/// Class codes vfpoll cares about.
pub mod class {
    /// Mass storage / Non-Volatile memory controller / NVM Express (PCI Code and ID Assignment 1.x, §1.2).
    pub const NVME: u32 = 0x01_08_02;
    /// Network controller base class; any subclass.
    pub const NETWORK_BASE: u8 = 0x02;
}

impl PciDevice {
    /// Whether the function is an NVMe controller.
    pub fn is_nvme(&self) -> bool {
        self.class == class::NVME
    }

    /// Whether the function is a network controller.
    pub fn is_network(&self) -> bool {
        (self.class >> 16) as u8 == class::NETWORK_BASE
    }

    /// A short human name of the class.
    pub fn kind(&self) -> &'static str {
        if self.is_nvme() {
            "nvme"
        } else if self.is_network() {
            "nic"
        } else {
            match (self.class >> 16) as u8 {
                0x01 => "storage",
                0x03 => "display",
                0x05 => "memory",
                0x06 => "bridge",
                0x12 => "accelerator",
                _ => "other",
            }
        }
    }
}

pub(crate) fn read_trimmed(path: &Path) -> Result<String, SysfsError> {
    fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .map_err(|source| SysfsError::Read {
            path: path.to_owned(),
            source,
        })
}

fn read_hex(path: &Path) -> Result<u32, SysfsError> {
    let s = read_trimmed(path)?;
    u32::from_str_radix(s.trim_start_matches("0x"), 16).map_err(|e| SysfsError::Read {
        path: path.to_owned(),
        source: io::Error::new(io::ErrorKind::InvalidData, format!("`{s}` is not hex: {e}")),
    })
}

/// The last component of the target of a symlink (`driver` -> `../../bus/pci/drivers/nvme` gives
/// `nvme`); `None` when the link is absent.
pub(crate) fn link_name(path: &Path) -> Option<String> {
    fs::read_link(path)
        .ok()?
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
}

/// Reads one device's description.
pub fn device(host: &Host, bdf: Bdf) -> Result<PciDevice, SysfsError> {
    let dir = host.pci_device_dir(bdf);
    if !dir.exists() {
        return Err(SysfsError::NoSuchDevice { bdf, path: dir });
    }
    let vendor = read_hex(&dir.join("vendor"))? as u16;
    let device = read_hex(&dir.join("device"))? as u16;
    let class = read_hex(&dir.join("class"))? & 0xff_ffff;
    let driver = link_name(&dir.join("driver"));
    let driver_override = fs::read_to_string(dir.join("driver_override"))
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty() && s != "(null)");
    let iommu_group = link_name(&dir.join("iommu_group")).and_then(|g| g.parse().ok());
    let numa_node = fs::read_to_string(dir.join("numa_node"))
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .and_then(|n| u32::try_from(n).ok());
    Ok(PciDevice {
        bdf,
        vendor,
        device,
        class,
        driver,
        driver_override,
        iommu_group,
        numa_node,
    })
}

/// Every PCI function on the host, sorted by address.
pub fn devices(host: &Host) -> Result<Vec<PciDevice>, SysfsError> {
    let dir = host.sys.join("bus/pci/devices");
    let rd = fs::read_dir(&dir).map_err(|_| SysfsError::NoSysfs { path: dir.clone() })?;
    let mut out = Vec::new();
    for ent in rd.flatten() {
        let name = ent.file_name();
        let Ok(bdf) = name.to_string_lossy().parse::<Bdf>() else {
            continue;
        };
        out.push(device(host, bdf)?);
    }
    out.sort_by_key(|d| d.bdf);
    Ok(out)
}

/// The name of the device's VFIO character device (`vfioN`, to open as
/// `/dev/vfio/devices/vfioN`): the single entry of `/sys/bus/pci/devices/<bdf>/vfio-dev/`.
/// `None` when there is none: the device is not bound to vfio-pci, or vfio was built without
/// `CONFIG_VFIO_DEVICE_CDEV` (Linux 6.6+).
pub fn vfio_cdev(host: &Host, bdf: Bdf) -> Option<String> {
    let dir = host.pci_device_dir(bdf).join("vfio-dev");
    fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("vfio"))
}

/// The functions in an IOMMU group, sorted.
pub fn group_members(host: &Host, group: u32) -> Result<Vec<Bdf>, SysfsError> {
    let dir = host.iommu_group_dir(group).join("devices");
    let rd = fs::read_dir(&dir).map_err(|source| SysfsError::Read {
        path: dir.clone(),
        source,
    })?;
    let mut v: Vec<Bdf> = rd
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
        .collect();
    v.sort();
    Ok(v)
}

/// The physical (bus) address and length of each BAR, from `/sys/bus/pci/devices/<bdf>/resource`.
/// Entry `i` is BAR `i` (0..=5), then the expansion ROM; unused BARs are `None`.
pub fn bar_resources(host: &Host, bdf: Bdf) -> Result<Vec<Option<(u64, u64)>>, SysfsError> {
    let path = host.pci_device_dir(bdf).join("resource");
    let text = read_trimmed(&path)?;
    let bad = |line: &str| SysfsError::Read {
        path: path.clone(),
        source: io::Error::new(io::ErrorKind::InvalidData, format!("malformed line `{line}`")),
    };
    let mut out = Vec::new();
    for line in text.lines() {
        let f: Vec<u64> = line
            .split_whitespace()
            .map(|x| u64::from_str_radix(x.trim_start_matches("0x"), 16))
            .collect::<Result<_, _>>()
            .map_err(|_| bad(line))?;
        let [start, end, _flags] = f[..] else {
            return Err(bad(line));
        };
        out.push(if end > start {
            Some((start, end - start + 1))
        } else {
            None
        });
    }
    Ok(out)
}

/// The changes vfpoll makes to the running kernel: attribute writes in sysfs and procfs, and
/// module loading.
///
/// Binding and hugepage reservation go through this trait so that tests can watch the writes and
/// play the kernel's part on a fake tree (a written `drivers_probe` moves a `driver` link there).
/// [`LiveKernel`] is the real one.
pub trait KernelOps {
    /// Writes `value` to an existing attribute file, as `echo -n value > path` would.
    fn write_attr(&mut self, path: &Path, value: &str) -> io::Result<()>;
    /// Loads a kernel module; the error is what the loader said.
    fn load_module(&mut self, name: &str) -> Result<(), String>;
}

/// The running kernel: writes go to the files themselves (never creating one), and modules load
/// through `modprobe`, or `busybox modprobe` where kmod is not installed (the QEMU test guest).
#[derive(Debug, Default, Clone, Copy)]
pub struct LiveKernel;

impl KernelOps for LiveKernel {
    fn write_attr(&mut self, path: &Path, value: &str) -> io::Result<()> {
        use std::io::Write;
        log::debug!("write {value:?} > {}", path.display());
        // sysfs takes one write(2) per attribute; `value` is short, so `write_all` is one call.
        fs::OpenOptions::new()
            .write(true)
            .open(path)?
            .write_all(value.as_bytes())
    }

    fn load_module(&mut self, name: &str) -> Result<(), String> {
        let mut said = Vec::new();
        for argv in [&["modprobe", name][..], &["busybox", "modprobe", name][..]] {
            log::debug!("running {}", argv.join(" "));
            match std::process::Command::new(argv[0]).args(&argv[1..]).output() {
                Ok(o) if o.status.success() => return Ok(()),
                Ok(o) => said.push(format!(
                    "`{}` exited with {}: {}",
                    argv.join(" "),
                    o.status,
                    String::from_utf8_lossy(&o.stderr).trim()
                )),
                Err(e) => said.push(format!("`{}`: {e}", argv[0])),
            }
        }
        Err(said.join("; "))
    }
}

/// One line of the mount table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// What is mounted (`/dev/nvme0n1p1`, `nodev`, `/dev/root`).
    pub source: String,
    /// Where, as the kernel prints it (octal escapes decoded).
    pub target: PathBuf,
    /// File system type (`ext4`, `hugetlbfs`).
    pub fstype: String,
    /// Mount and super-block options, comma-separated.
    pub options: String,
    /// The device number (`major`, `minor`) of the mounted block device, when the table says it
    /// (`/proc/self/mountinfo` does, `/proc/mounts` does not).
    pub devno: Option<(u32, u32)>,
}

fn unescape_mount_field(s: &str) -> String {
    // The kernel writes space, tab, newline and backslash in mount fields as `\ooo` octal.
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            let v = b[i + 1..i + 4]
                .iter()
                .fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount table of this process: `/proc/self/mountinfo` when present (it has device numbers,
/// so a root file system shown as `/dev/root` is still recognised), else `/proc/mounts`.
pub fn mounts(host: &Host) -> Result<Vec<Mount>, SysfsError> {
    let info = host.proc.join("self/mountinfo");
    if let Ok(text) = fs::read_to_string(&info) {
        let mut out = Vec::new();
        for line in text.lines() {
            // id parent major:minor root target options [optional...] - fstype source superoptions
            let f: Vec<&str> = line.split_whitespace().collect();
            let Some(dash) = f.iter().position(|x| *x == "-") else {
                continue;
            };
            if f.len() < dash + 3 || dash < 6 {
                continue;
            }
            let devno = f[2]
                .split_once(':')
                .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)));
            let mut options = f[5].to_owned();
            if let Some(sup) = f.get(dash + 3) {
                options.push(',');
                options.push_str(sup);
            }
            out.push(Mount {
                source: unescape_mount_field(f[dash + 2]),
                target: unescape_mount_field(f[4]).into(),
                fstype: f[dash + 1].to_owned(),
                options,
                devno,
            });
        }
        return Ok(out);
    }
    let path = host.proc.join("mounts");
    let text = read_trimmed(&path)?;
    Ok(text
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let [source, target, fstype, options, ..] = f[..] else {
                return None;
            };
            Some(Mount {
                source: unescape_mount_field(source),
                target: unescape_mount_field(target).into(),
                fstype: fstype.to_owned(),
                options: options.to_owned(),
                devno: None,
            })
        })
        .collect())
}

/// A process that holds a file open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Its process ID.
    pub pid: u32,
    /// Its command name (`/proc/PID/comm`), empty when unreadable.
    pub comm: String,
}

/// The processes that hold any of `nodes` open, found through `/proc/PID/fd`, by PID. Processes
/// whose descriptors this one may not read (another user's, without `CAP_SYS_PTRACE`) are not
/// seen, so an empty answer means "none that we can see".
pub fn holders(host: &Host, nodes: &[PathBuf]) -> Vec<Holder> {
    let Ok(procs) = fs::read_dir(&host.proc) else {
        return Vec::new();
    };
    let mut out: Vec<Holder> = procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            fs::read_dir(host.proc.join(pid.to_string()).join("fd")).is_ok_and(|fds| {
                fds.flatten()
                    .any(|fd| fs::read_link(fd.path()).is_ok_and(|t| nodes.contains(&t)))
            })
        })
        .map(|pid| Holder {
            pid,
            comm: fs::read_to_string(host.proc.join(pid.to_string()).join("comm"))
                .map(|c| c.trim().to_owned())
                .unwrap_or_default(),
        })
        .collect();
    out.sort_by_key(|h| h.pid);
    out
}

/// "PID 12 (vfpoll), PID 40 (qemu)" for an error message; "another process (another vfpoll, a
/// VM?)" when none could be seen.
pub fn describe_holders(holders: &[Holder]) -> String {
    if holders.is_empty() {
        return "another process (another vfpoll, a VM?)".to_owned();
    }
    holders
        .iter()
        .map(|h| match h.comm.as_str() {
            "" => format!("PID {}", h.pid),
            c => format!("PID {} ({c})", h.pid),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
pub(crate) mod fake {
    //! A fake sysfs tree for tests.
    use super::*;
    use std::os::unix::fs::symlink;

    /// Builds `sys/bus/pci/devices/<bdf>` with the given attributes.
    pub fn add_device(
        root: &Path,
        bdf: &str,
        vendor: u16,
        device: u16,
        class: u32,
        driver: Option<&str>,
        group: Option<u32>,
    ) {
        let d = root.join("sys/devices/pci0000:00").join(bdf);
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("vendor"), format!("0x{vendor:04x}\n")).unwrap();
        fs::write(d.join("device"), format!("0x{device:04x}\n")).unwrap();
        fs::write(d.join("class"), format!("0x{class:06x}\n")).unwrap();
        fs::write(d.join("numa_node"), "-1\n").unwrap();
        fs::write(d.join("driver_override"), "(null)\n").unwrap();
        let devs = root.join("sys/bus/pci/devices");
        fs::create_dir_all(&devs).unwrap();
        symlink(&d, devs.join(bdf)).unwrap();
        if let Some(drv) = driver {
            let dd = root.join("sys/bus/pci/drivers").join(drv);
            fs::create_dir_all(&dd).unwrap();
            symlink(&dd, d.join("driver")).unwrap();
            let _ = symlink(&d, dd.join(bdf));
        }
        if let Some(g) = group {
            let gd = root.join("sys/kernel/iommu_groups").join(g.to_string());
            fs::create_dir_all(gd.join("devices")).unwrap();
            symlink(&gd, d.join("iommu_group")).unwrap();
            symlink(&d, gd.join("devices").join(bdf)).unwrap();
        }
    }

    /// Gives the device at `bdf` the VFIO cdev `vfio<n>`: `vfio-dev/vfio<n>` in sysfs and
    /// `dev/vfio/devices/vfio<n>` (a plain file).
    pub fn add_vfio_cdev(root: &Path, bdf: &str, n: u32) {
        let d = root
            .join("sys/bus/pci/devices")
            .join(bdf)
            .join("vfio-dev")
            .join(format!("vfio{n}"));
        fs::create_dir_all(d).unwrap();
        fs::create_dir_all(root.join("dev/vfio/devices")).unwrap();
        fs::write(root.join("dev/vfio/devices").join(format!("vfio{n}")), "").unwrap();
    }

    /// Gives the NVMe controller at `bdf` the namespace block device `nvme<ctrl>n<ns>` (device
    /// number 259:`ns`) with the partitions `p1..=p<partitions>` (259:`10*ns + p`), as
    /// `BDF/nvme/nvme<ctrl>/nvme<ctrl>n<ns>/...`, each with an empty `holders/`.
    pub fn add_namespace(root: &Path, bdf: &str, ctrl: u32, ns: u32, partitions: u32) -> PathBuf {
        let disk = format!("nvme{ctrl}n{ns}");
        let d = root
            .join("sys/bus/pci/devices")
            .join(bdf)
            .join("nvme")
            .join(format!("nvme{ctrl}"))
            .join(&disk);
        fs::create_dir_all(d.join("holders")).unwrap();
        fs::write(d.join("dev"), format!("259:{ns}\n")).unwrap();
        for p in 1..=partitions {
            let pd = d.join(format!("{disk}p{p}"));
            fs::create_dir_all(pd.join("holders")).unwrap();
            fs::write(pd.join("dev"), format!("259:{}\n", 10 * ns + p)).unwrap();
        }
        d
    }

    /// Gives the NIC at `bdf` the interface `ifname` with the given `flags` (0x1003 = up).
    pub fn add_netdev(root: &Path, bdf: &str, ifname: &str, flags: u32) {
        let d = root
            .join("sys/bus/pci/devices")
            .join(bdf)
            .join("net")
            .join(ifname);
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("flags"), format!("0x{flags:x}\n")).unwrap();
    }
}

#[cfg(test)]
mod tests {
    use super::fake::add_device;
    use super::*;

    #[test]
    fn reads_fake_tree() {
        let t = tempfile::tempdir().unwrap();
        add_device(
            t.path(),
            "0000:00:03.0",
            0x1b36,
            0x0010,
            0x010802,
            Some("nvme"),
            Some(3),
        );
        add_device(t.path(), "0000:00:04.0", 0x8086, 0x10d3, 0x020000, None, Some(4));
        add_device(
            t.path(),
            "0000:00:1f.2",
            0x8086,
            0x2922,
            0x010601,
            Some("ahci"),
            Some(7),
        );
        add_device(t.path(), "0000:00:1f.3", 0x8086, 0x2930, 0x0c0500, None, Some(7));
        let host = Host::under(t.path());
        let all = devices(&host).unwrap();
        assert_eq!(all.len(), 4);
        let nvme = &all[0];
        assert!(nvme.is_nvme());
        assert_eq!(nvme.driver.as_deref(), Some("nvme"));
        assert_eq!(nvme.iommu_group, Some(3));
        assert_eq!(nvme.numa_node, None);
        assert!(all[1].is_network());
        assert_eq!(all[1].driver, None);
        let m = group_members(&host, 7).unwrap();
        assert_eq!(m.len(), 2);
        let e = device(&host, "0000:00:09.0".parse().unwrap()).unwrap_err();
        assert!(e.to_string().contains("vfpoll status"), "{e}");
    }

    #[test]
    fn parses_resource_file() {
        let t = tempfile::tempdir().unwrap();
        add_device(t.path(), "0000:00:06.0", 0x1af4, 0x1110, 0x050000, None, None);
        let host = Host::under(t.path());
        let bdf = "0000:00:06.0".parse().unwrap();
        fs::write(
            host.pci_device_dir(bdf).join("resource"),
            "0x00000000fe800000 0x00000000fe8000ff 0x0000000000040200\n\
             0x0000000000000000 0x0000000000000000 0x0000000000000000\n\
             0x00000000f8000000 0x00000000fbffffff 0x000000000014220c\n",
        )
        .unwrap();
        let r = bar_resources(&host, bdf).unwrap();
        assert_eq!(r[0], Some((0xfe80_0000, 0x100)));
        assert_eq!(r[1], None);
        assert_eq!(r[2], Some((0xf800_0000, 64 << 20)));
    }
}
