//! Is the kernel using a device? Mounted file systems, swap and holders on the namespaces of an
//! NVMe controller; interfaces that are up on a NIC.

use std::collections::HashSet;
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use super::read_opt;
use crate::sysfs::{self, Host, PciDevice, SysfsError};

/// `IFF_UP` in `/sys/class/net/<if>/flags` (`include/uapi/linux/if.h`).
const IFF_UP: u32 = 0x1;

/// One way the kernel uses a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InUse {
    /// A block device of the controller is mounted.
    Mounted {
        /// The block device (`nvme0n1p1`).
        dev: String,
        /// The mount point.
        target: PathBuf,
    },
    /// A block device of the controller is active swap.
    Swap {
        /// The block device.
        dev: String,
    },
    /// Another block device is stacked on one of the controller's (device-mapper, md, LVM).
    Holder {
        /// The block device.
        dev: String,
        /// The holder (`dm-0`, `md127`).
        holder: String,
    },
    /// A network interface of the NIC is up.
    InterfaceUp {
        /// The interface.
        ifname: String,
    },
}

impl fmt::Display for InUse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InUse::Mounted { dev, target } => write!(f, "/dev/{dev} is mounted on {}", target.display()),
            InUse::Swap { dev } => write!(f, "/dev/{dev} is swap"),
            InUse::Holder { dev, holder } => {
                write!(f, "/dev/{dev} is held by {holder} (device-mapper/md/LVM)")
            }
            InUse::InterfaceUp { ifname } => write!(f, "interface {ifname} is up"),
        }
    }
}

impl InUse {
    /// The command that ends this use.
    pub fn remedy(&self) -> String {
        match self {
            InUse::Mounted { target, .. } => format!("umount {}", target.display()),
            InUse::Swap { dev } => format!("swapoff /dev/{dev}"),
            InUse::Holder { holder, .. } => {
                format!("stop {holder} (dmsetup remove / mdadm --stop / vgchange -an)")
            }
            InUse::InterfaceUp { ifname } => format!("ip link set {ifname} down"),
        }
    }
}

/// A block device of an NVMe controller: its name and sysfs folder.
struct BlockDev {
    name: String,
    dir: PathBuf,
}

/// The entries of `dir`, sorted; none where it cannot be read.
pub(super) fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// `nvme0n1` (or the multipath path `nvme0c1n1`) → the name of the disk the host sees (`nvme0n1`).
fn head_name(ns: &str) -> Option<String> {
    let rest = ns.strip_prefix("nvme")?;
    let (subsys, tail) = rest.split_once(|c: char| !c.is_ascii_digit())?;
    let nsid = if let Some(t) = rest[subsys.len()..].strip_prefix('c') {
        let (_, n) = t.split_once('n')?;
        n
    } else {
        tail
    };
    let ok = !subsys.is_empty() && !nsid.is_empty() && nsid.bytes().all(|b| b.is_ascii_digit());
    ok.then(|| format!("nvme{subsys}n{nsid}"))
}

/// The namespaces and partitions of the NVMe controller at `dev_dir` (`.../nvme/nvme*/nvme*n*`).
fn nvme_block_devs(host: &Host, dev_dir: &Path) -> Vec<BlockDev> {
    let mut out = Vec::new();
    let ctrls = dev_dir.join("nvme");
    for ctrl in names(&ctrls) {
        for ns in names(&ctrls.join(&ctrl)) {
            let Some(head) = head_name(&ns) else { continue };
            // With native multipath the controller holds the hidden path `nvme0c0n1`; the disk,
            // its partitions and holders live under the subsystem's `nvme0n1`.
            let class = host.sys.join("class/block").join(&head);
            let disk = if class.is_dir() {
                class
            } else {
                ctrls.join(&ctrl).join(&ns)
            };
            for p in names(&disk) {
                if p.starts_with(&format!("{head}p")) {
                    out.push(BlockDev {
                        dir: disk.join(&p),
                        name: p,
                    });
                }
            }
            out.push(BlockDev {
                name: head,
                dir: disk,
            });
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out.dedup_by(|a, b| a.name == b.name);
    out
}

fn devno(dir: &Path) -> Option<(u32, u32)> {
    let s = read_opt(&dir.join("dev"))?;
    let (a, b) = s.split_once(':')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// How the kernel uses `dev` now. Empty when it can be taken safely.
pub fn kernel_uses(host: &Host, dev: &PciDevice) -> Result<Vec<InUse>, SysfsError> {
    let dir = host.pci_device_dir(dev.bdf);
    let mut out = Vec::new();
    for ifname in names(&dir.join("net")) {
        let flags = read_opt(&dir.join("net").join(&ifname).join("flags"))
            .and_then(|s| u32::from_str_radix(s.trim_start_matches("0x"), 16).ok())
            .unwrap_or(0);
        if flags & IFF_UP != 0 {
            out.push(InUse::InterfaceUp { ifname });
        }
    }
    let blocks = nvme_block_devs(host, &dir);
    if blocks.is_empty() {
        return Ok(out);
    }
    let mounts = sysfs::mounts(host)?;
    let swaps = fs::read_to_string(host.proc.join("swaps")).unwrap_or_default();
    let swap_sources: HashSet<&str> = swaps
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    for b in &blocks {
        let path = format!("/dev/{}", b.name);
        let no = devno(&b.dir);
        for m in &mounts {
            // A root file system may show as `/dev/root`; the device number still matches.
            let by_number = no.is_some() && m.devno == no;
            if m.source == path || by_number {
                out.push(InUse::Mounted {
                    dev: b.name.clone(),
                    target: m.target.clone(),
                });
            }
        }
        if swap_sources.contains(path.as_str()) {
            out.push(InUse::Swap { dev: b.name.clone() });
        }
        for holder in names(&b.dir.join("holders")) {
            out.push(InUse::Holder {
                dev: b.name.clone(),
                holder,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::head_name;

    #[test]
    fn multipath_paths_map_to_their_disk() {
        assert_eq!(head_name("nvme0n1").as_deref(), Some("nvme0n1"));
        assert_eq!(head_name("nvme0c1n2").as_deref(), Some("nvme0n2"));
        assert_eq!(head_name("nvme12n3").as_deref(), Some("nvme12n3"));
        assert_eq!(head_name("nvme0n1p1"), None);
        assert_eq!(head_name("power"), None);
        assert_eq!(head_name("nvme0"), None);
    }
}
