//! `vfpoll doctor` run without root: what this user lacks for a run, with the fix for each.
//!
//! The general checks ([`crate::doctor`]) find a device node or the memlock limit wanting; for a
//! user, their fix is `sudo vfpoll setup --user NAME` (which gives the nodes and raises limits,
//! see [`crate::setup::user`]), so [`check`] rewrites those fixes and adds what only a user
//! lacks: a hugetlbfs mount it may write to, and no-IOMMU mode, which needs root whatever the
//! files say. (The iommufd nodes, `/dev/iommu` and `/dev/vfio/devices/vfioN`, are checked by
//! [`super::backend`] when the run uses iommufd; their fixes are sharpened here too.) Access is judged from each file's owner, group and mode
//! against this process's IDs and groups (`/proc/self/status`), so the tests need no root.

use std::fs;

use vfpoll_hugepages as hp;
use vfpoll_pci::bind;
use vfpoll_pci::sysfs;
use vfpoll_pci::{Bdf, Host};

use super::types::{finding, Args, Finding, Level, Process};
use crate::setup::user::{self, Owner, NOIOMMU_NEEDS_ROOT};

/// `CAP_SYS_RAWIO` and `CAP_SYS_ADMIN` (`include/uapi/linux/capability.h`).
const CAP_SYS_RAWIO: u32 = 17;
const CAP_SYS_ADMIN: u32 = 21;

/// What `/proc/self/status` says of this process besides its user ID.
#[derive(Debug, Default)]
struct Creds {
    /// Effective group and supplementary groups.
    groups: Vec<u32>,
    /// Effective capabilities; `None` if unknown.
    caps: Option<u64>,
}

impl Creds {
    fn read(host: &Host) -> Self {
        let text = fs::read_to_string(host.proc.join("self/status")).unwrap_or_default();
        let field = |name: &str| text.lines().find_map(|l| l.strip_prefix(name)).map(str::trim);
        let mut groups: Vec<u32> = field("Groups:")
            .unwrap_or("")
            .split_whitespace()
            .filter_map(|g| g.parse().ok())
            .collect();
        // Gid: real, effective, saved, filesystem.
        if let Some(g) = field("Gid:").and_then(|g| g.split_whitespace().nth(1)?.parse().ok()) {
            groups.push(g);
        }
        Creds {
            groups,
            caps: field("CapEff:").and_then(|c| u64::from_str_radix(c, 16).ok()),
        }
    }

    fn has(&self, cap: u32) -> bool {
        self.caps.is_some_and(|c| c & (1 << cap) != 0)
    }
}

/// Whether a process of `uid` in `groups` may read and write (`want` = 0o6) or search and write
/// (0o3) a file of owner `o`, from the mode bits (ACLs aside). Root may always.
fn allows(o: &Owner, uid: u32, groups: &[u32], want: u32) -> bool {
    let bits = if uid == 0 {
        return true;
    } else if uid == o.uid {
        o.mode >> 6
    } else if groups.contains(&o.gid) {
        o.mode >> 3
    } else {
        o.mode
    };
    bits & want == want
}

/// The user's checks; adds to `out` and sharpens the fixes already there. Nothing for root.
pub fn check(host: &Host, a: &Args, who: &Process, out: &mut Vec<Finding>) {
    if who.euid == 0 {
        return;
    }
    let creds = Creds::read(host);
    let name = user::name_of(host, who.euid);
    let setup = format!("sudo vfpoll setup --user {name}");
    let may = |p: &std::path::Path, want: u32| {
        user::owner(host, p).is_ok_and(|o| allows(&o, who.euid, &creds.groups, want))
    };
    let devices = a.run_devices(host);

    rewrite_fixes(a, who, &name, &setup, out);
    out.push(finding(
        Level::Ok,
        "user",
        format!(
            "running as {name} (uid {}) without root: the checks below are this user's",
            who.euid
        ),
        None,
    ));

    // No-IOMMU mode: asked for, or devices that can only be used in it.
    let noiommu_nodes: Vec<String> = devices
        .iter()
        .filter_map(|&b| sysfs::device(host, b).ok()?.iommu_group)
        .filter_map(|g| bind::group_node(host, g))
        .filter(|n| user::is_noiommu_node(n))
        .map(|n| n.display().to_string())
        .collect();
    if a.noiommu || !noiommu_nodes.is_empty() {
        if creds.has(CAP_SYS_RAWIO) && creds.has(CAP_SYS_ADMIN) {
            out.push(finding(
                Level::Ok,
                "no-iommu",
                "this process has CAP_SYS_RAWIO and CAP_SYS_ADMIN, which no-IOMMU mode needs",
                None,
            ));
        } else {
            let on = if noiommu_nodes.is_empty() {
                String::new()
            } else {
                format!(" ({})", noiommu_nodes.join(", "))
            };
            out.push(finding(
                Level::Fail,
                "no-iommu",
                format!("{NOIOMMU_NEEDS_ROOT}{on}"),
                Some(
                    "run no-IOMMU runs as root (sudo vfpoll ... --noiommu); runs without root need an IOMMU \
                     (turn on VT-d / AMD-Vi), where `vfpoll setup --user` gives a user the devices"
                        .into(),
                ),
            ));
        }
        return;
    }

    // hugetlbfs: anonymous hugepages need no mount; file-backed DMA memory needs a writable one.
    if let Ok(mounts) = hp::hugetlbfs_mounts(host) {
        let paths: Vec<String> = mounts.iter().map(|m| m.path.display().to_string()).collect();
        let usable = mounts.iter().find(|m| may(&user::on_host(host, &m.path), 0o3));
        out.push(match (usable, mounts.first()) {
            (Some(m), _) => finding(
                Level::Ok,
                "hugetlbfs",
                format!("{} is writable for this user", m.path.display()),
                None,
            ),
            (None, Some(m)) => finding(
                Level::Warn,
                "hugetlbfs",
                format!(
                    "no hugetlbfs mount is writable for this user ({}): the vfpoll tools use anonymous hugepages, which need none, but file-backed DMA memory (DmaContext::alloc_region_on) does",
                    paths.join(", ")
                ),
                Some(format!("{setup} --mount {} (chowns the mount to {name})", m.path.display())),
            ),
            // The general check warns that none is mounted.
            (None, None) => return,
        });
    }
}

/// Points the fixes of the general checks at `setup --user` where a user runs the doctor.
fn rewrite_fixes(a: &Args, who: &Process, name: &str, setup: &str, out: &mut [Finding]) {
    let mib = a.hugepages;
    let denied = "is not read-write for this user";
    for f in out.iter_mut().filter(|f| f.level == Level::Fail) {
        // A device's group node (check `BDF`) or VFIO cdev (check `BDF cdev`).
        let device = f.check.split(' ').next().and_then(|b| b.parse::<Bdf>().ok());
        if f.check == "/dev/vfio/vfio" && f.detail.ends_with(denied) {
            f.fix = Some(format!(
                "sudo chmod 0666 /dev/vfio/vfio (the kernel's own mode; {setup} does it)"
            ));
        } else if f.check == "/dev/iommu" && f.detail.ends_with(denied) {
            f.fix = Some(format!(
                "{setup} (chowns /dev/iommu and the devices' nodes to {name}), or run with --iommu-backend type1 \
                 if the group nodes are {name}'s, or run as root"
            ));
        } else if device.is_some() && f.detail.ends_with(denied) && f.detail.contains("/noiommu-") {
            f.fix = Some(
                "run as root: a no-IOMMU group's node opens only with CAP_SYS_RAWIO, whoever owns it".into(),
            );
        } else if let Some(bdf) = device.filter(|_| f.detail.ends_with(denied)) {
            f.fix = Some(format!(
                "{setup} --bind {bdf} (chowns the device's VFIO nodes to {name}; vfpoll reset gives them back), or run as root"
            ));
        } else if f.check == "memlock" {
            let kib = mib << 10;
            let logins = format!("for new logins add `{name} - memlock {kib}` to /etc/security/limits.conf");
            f.fix = Some(match who.memlock.hard {
                Some(h) if h < mib << 20 => format!(
                    "ulimit -l unlimited works only up to the hard limit ({} KiB); above it root raises it: \
                     {setup} --hugepages {mib} --pid $$ raises this shell's limit (then start vfpoll from it); \
                     {logins}; a systemd unit: LimitMEMLOCK={mib}M; or run as root",
                    h >> 10
                ),
                _ => format!("ulimit -l {kib} (the hard limit allows it) in the shell that starts vfpoll; {logins}"),
            });
        }
    }
}

#[cfg(test)]
mod tests;
