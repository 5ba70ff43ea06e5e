//! `vfpoll doctor`: checks everything a run needs and prints OK/WARN/FAIL with the fix.
//!
//! The checks are pure functions of a [`Host`] (the trees) and a [`Process`] (who we are), so the
//! tests run them on fake trees with a made-up process.

use std::process::ExitCode;

use vfpoll_hugepages as hp;
use vfpoll_pci::bind::{self, NoIommu, VFIO_PCI};
use vfpoll_pci::sysfs;
use vfpoll_pci::{Bdf, Host};

use crate::ctx::Ctx;

mod backend;
mod types;
mod user;

use types::{finding, rw};
pub use types::{Args, Finding, Level, Process};

fn loaded(host: &Host, module: &str) -> bool {
    let m = host.sys.join("module").join(module.replace('-', "_"));
    m.is_dir()
        || match module {
            // Built in without parameters, a module has no /sys/module entry; its traces do.
            "vfio" => host.sys.join("class/misc/vfio").exists() || host.dev.join("vfio/vfio").exists(),
            "vfio-pci" => host.pci_driver_dir(VFIO_PCI).is_dir(),
            _ => false,
        }
}

/// Runs every check.
pub fn check(host: &Host, a: &Args, who: &Process) -> Vec<Finding> {
    let mut out = Vec::new();
    iommu(host, a, &mut out);
    modules(host, a, &mut out);
    devices(host, a, &mut out);
    hugepages(host, a, &mut out);
    memlock(a, who, &mut out);
    backend::check(host, a, &mut out);
    user::check(host, a, who, &mut out);
    out
}

fn iommu(host: &Host, a: &Args, out: &mut Vec<Finding>) {
    let units = bind::iommu_units(host);
    let groups = std::fs::read_dir(host.sys.join("kernel/iommu_groups")).map_or(0, |d| d.count());
    if !a.noiommu {
        out.push(if units.is_empty() {
            let fix = if bind::noiommu(host) == NoIommu::On {
                "this machine has VFIO's no-IOMMU mode on: run vfpoll with --noiommu (vfpoll doctor --noiommu); for IOMMU protection, turn on VT-d / AMD-Vi in the firmware and boot with intel_iommu=on iommu=pt (AMD: iommu=pt; the AMD IOMMU is on by default, unless amd_iommu=off)"
            } else {
                "turn on VT-d / AMD-Vi in the firmware and boot with intel_iommu=on iommu=pt (AMD: iommu=pt; the AMD IOMMU is on by default, unless amd_iommu=off); on a machine without an IOMMU, no-IOMMU mode is the unsafe way out: vfpoll doctor --noiommu"
            };
            finding(Level::Fail, "iommu", "no IOMMU is on (/sys/class/iommu is empty)", Some(fix.into()))
        } else {
            finding(Level::Ok, "iommu", format!("IOMMU on ({}), {groups} IOMMU groups", units.join(", ")), None)
        });
        return;
    }
    let param = "/sys/module/vfio/parameters/enable_unsafe_noiommu_mode";
    out.push(match bind::noiommu(host) {
        NoIommu::On => finding(
            Level::Ok,
            "no-iommu",
            "no-IOMMU mode is on: devices without an IOMMU group get /dev/vfio/noiommu-N (they can DMA anywhere; the kernel is tainted)",
            None,
        ),
        NoIommu::Off => finding(
            Level::Fail,
            "no-iommu",
            format!("no-IOMMU mode is off ({param} = N)"),
            Some(format!("echo Y > {param} (before binding; rebind devices bound earlier: vfpoll reset, vfpoll setup), or boot with vfio.enable_unsafe_noiommu_mode=1")),
        ),
        NoIommu::Unsupported => finding(
            Level::Fail,
            "no-iommu",
            format!("the running vfio module has no enable_unsafe_noiommu_mode parameter ({param} is absent): it was built without CONFIG_VFIO_NOIOMMU"),
            Some("rebuild vfio.ko with CONFIG_VFIO_NOIOMMU=y (the test bed's build-vfio-noiommu.sh does it) or use a machine with an IOMMU".into()),
        ),
        NoIommu::VfioNotLoaded => finding(
            Level::Fail,
            "no-iommu",
            "vfio is not loaded, so no-IOMMU mode is off",
            Some("modprobe vfio enable_unsafe_noiommu_mode=1 && modprobe vfio-pci".into()),
        ),
    });
    if !units.is_empty() {
        out.push(finding(
            Level::Warn,
            "no-iommu",
            format!("an IOMMU is on ({}): devices in IOMMU groups use it, and no-IOMMU mode only applies to devices without a group", units.join(", ")),
            None,
        ));
    }
}

fn modules(host: &Host, a: &Args, out: &mut Vec<Finding>) {
    let iommufd = backend::uses_iommufd(host, a);
    for m in ["vfio", "vfio-pci", "vfio_iommu_type1"] {
        let ok = loaded(host, m);
        out.push(match (ok, m) {
            (true, _) => finding(Level::Ok, "modules", format!("{m} is loaded"), None),
            (false, "vfio_iommu_type1") if iommufd => finding(
                Level::Ok,
                "modules",
                "vfio_iommu_type1 is not loaded (not needed with iommufd)",
                None,
            ),
            (false, "vfio_iommu_type1") if a.noiommu => finding(
                Level::Ok,
                "modules",
                "vfio_iommu_type1 is not loaded (not needed in no-IOMMU mode)",
                None,
            ),
            (false, _) => finding(
                Level::Fail,
                "modules",
                format!("{m} is not loaded"),
                Some(format!(
                    "modprobe {m}{}",
                    if m == "vfio" && a.noiommu {
                        " enable_unsafe_noiommu_mode=1"
                    } else {
                        ""
                    }
                )),
            ),
        });
    }
    let container = host.dev.join("vfio/vfio");
    out.push(if iommufd {
        finding(
            Level::Ok,
            "/dev/vfio/vfio",
            "not needed: the run uses iommufd",
            None,
        )
    } else if !container.exists() {
        finding(
            Level::Fail,
            "/dev/vfio/vfio",
            format!("{} is missing", container.display()),
            Some("modprobe vfio-pci (and check that devtmpfs is mounted on /dev)".into()),
        )
    } else if !rw(&container) {
        finding(
            Level::Fail,
            "/dev/vfio/vfio",
            format!("{} is not read-write for this user", container.display()),
            Some(format!(
                "run as root, or chmod 0666 {} (a udev rule makes it last)",
                container.display()
            )),
        )
    } else {
        finding(Level::Ok, "/dev/vfio/vfio", "present and read-write", None)
    });
}

fn devices(host: &Host, a: &Args, out: &mut Vec<Finding>) {
    let mut list = a.devices.clone();
    if list.is_empty() {
        list = sysfs::devices(host)
            .unwrap_or_default()
            .into_iter()
            .filter(|d| d.driver.as_deref() == Some(VFIO_PCI))
            .map(|d| d.bdf)
            .collect();
        if list.is_empty() {
            out.push(finding(
                Level::Warn,
                "devices",
                "no device is bound to vfio-pci",
                Some(
                    "vfpoll setup --bind nvme (or: vfpoll bind BDF); name the devices of a run with --device"
                        .into(),
                ),
            ));
        }
    }
    for bdf in list {
        out.push(device(host, a, bdf));
    }
}

fn device(host: &Host, a: &Args, bdf: Bdf) -> Finding {
    let check = bdf.to_string();
    let fail = |detail: String, fix: String| finding(Level::Fail, &check, detail, Some(fix));
    let d = match sysfs::device(host, bdf) {
        Ok(d) => d,
        Err(e) => return finding(Level::Fail, &check, e.to_string(), None),
    };
    let what = format!("{} {:04x}:{:04x}", d.kind(), d.vendor, d.device);
    if d.driver.as_deref() != Some(VFIO_PCI) {
        let uses = bind::kernel_uses(host, &d).unwrap_or_default();
        let mut fix = format!("vfpoll bind {bdf}");
        if !uses.is_empty() {
            let r: Vec<String> = uses.iter().map(|u| u.remedy()).collect();
            fix = format!("{} first, then {fix} (or {fix} --force)", r.join(", "));
        }
        let now = d.driver.as_deref().unwrap_or("no driver");
        return fail(format!("({what}) is on {now}, not vfio-pci"), fix);
    }
    let Some(g) = d.iommu_group else {
        return fail(
            format!("({what}) is on vfio-pci but has no IOMMU group"),
            "see dmesg; vfpoll reset then vfpoll bind".into(),
        );
    };
    match bind::blocking_peers(host, bdf, g) {
        Ok(p) if !p.is_empty() => {
            let who: Vec<String> = p.iter().map(|(b, d)| format!("{b} (driver {d})")).collect();
            let list: Vec<String> = p.iter().map(|(b, _)| b.to_string()).collect();
            return fail(
                format!(
                    "({what}) IOMMU group {g} is not viable: it also holds {}",
                    who.join(", ")
                ),
                format!(
                    "vfpoll bind {}, or move {bdf} to a slot with its own group",
                    list.join(" ")
                ),
            );
        }
        Ok(_) => {}
        Err(e) => return finding(Level::Fail, &check, e.to_string(), None),
    }
    if backend::uses_iommufd(host, a) {
        return finding(
            Level::Ok,
            &check,
            format!(
                "({what}) on vfio-pci, group {g} viable (opened through its VFIO cdev: see its cdev check)"
            ),
            None,
        );
    }
    let Some(node) = bind::group_node(host, g) else {
        return fail(
            format!("({what}) group {g} has no node /dev/vfio/{g} (nor /dev/vfio/noiommu-{g})"),
            "check that devtmpfs is mounted on /dev; vfpoll reset then vfpoll bind".into(),
        );
    };
    if !rw(&node) {
        return fail(
            format!("({what}) {} is not read-write for this user", node.display()),
            format!(
                "run as root, or chown $USER {} (a udev rule makes it last)",
                node.display()
            ),
        );
    }
    let noiommu_group = node
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with("noiommu-"));
    if noiommu_group && !a.noiommu {
        return finding(
            Level::Warn,
            &check,
            format!(
                "({what}) is in no-IOMMU group {g} ({}): the run must use no-IOMMU mode",
                node.display()
            ),
            Some("check it with: vfpoll doctor --noiommu".into()),
        );
    }
    if !noiommu_group && a.noiommu {
        return finding(
            Level::Warn,
            &check,
            format!(
                "({what}) is in IOMMU group {g} ({}), not a no-IOMMU group: the run will use the IOMMU",
                node.display()
            ),
            None,
        );
    }
    finding(
        Level::Ok,
        &check,
        format!(
            "({what}) on vfio-pci, group {g} viable, {} read-write",
            node.display()
        ),
        None,
    )
}

fn hugepages(host: &Host, a: &Args, out: &mut Vec<Finding>) {
    let need = a.hugepages << 20;
    let fix = Some(format!("vfpoll setup --hugepages {}", a.hugepages));
    match hp::pools(host) {
        Err(e) => out.push(finding(Level::Fail, "hugepages", e.to_string(), None)),
        Ok(p) if p.is_empty() => out.push(finding(
            Level::Fail,
            "hugepages",
            "the kernel has no hugepage pools (/sys/kernel/mm/hugepages is empty or absent)",
            Some("use a kernel with CONFIG_HUGETLBFS=y".into()),
        )),
        Ok(pools) => {
            let free: u64 = pools.iter().map(|p| p.free * p.size.bytes()).sum();
            let per: Vec<String> = pools
                .iter()
                .filter(|p| p.total > 0)
                .map(|p| {
                    let node = p.node.map_or(String::new(), |n| format!(" node{n}"));
                    format!("{}{node}: {} of {} free", p.size, p.free, p.total)
                })
                .collect();
            let per = if per.is_empty() {
                "no pages reserved".to_owned()
            } else {
                per.join(", ")
            };
            let detail = format!(
                "{} MiB free in hugepages ({per}); {} MiB needed",
                free >> 20,
                a.hugepages
            );
            let level = if free >= need { Level::Ok } else { Level::Fail };
            out.push(finding(
                level,
                "hugepages",
                detail,
                if level == Level::Ok { None } else { fix },
            ));
        }
    }
    match hp::hugetlbfs_mounts(host) {
        Ok(m) if m.is_empty() => out.push(finding(
            Level::Warn,
            "hugetlbfs",
            "no hugetlbfs is mounted (anonymous hugepages still work; file-backed DMA memory needs one)",
            Some(format!("vfpoll setup (mounts one on {})", hp::DEFAULT_MOUNT)),
        )),
        Ok(m) => {
            let l: Vec<String> = m
                .iter()
                .map(|m| {
                    format!(
                        "{} ({})",
                        m.path.display(),
                        m.page_size.map_or("default size".into(), |s| s.to_string())
                    )
                })
                .collect();
            out.push(finding(
                Level::Ok,
                "hugetlbfs",
                format!("mounted on {}", l.join(", ")),
                None,
            ));
        }
        Err(e) => out.push(finding(Level::Fail, "hugetlbfs", e.to_string(), None)),
    }
}

fn memlock(a: &Args, who: &Process, out: &mut Vec<Finding>) {
    let need = a.hugepages << 20;
    let show = |v: Option<u64>| v.map_or("unlimited".to_owned(), |b| format!("{} KiB", b >> 10));
    if who.cap_ipc_lock == Some(true) {
        let who_s = if who.euid == 0 {
            "running as root with CAP_IPC_LOCK"
        } else {
            "the process has CAP_IPC_LOCK"
        };
        out.push(finding(
            Level::Ok,
            "memlock",
            format!("{who_s}: VFIO does not charge pinned pages to the memlock limit"),
            None,
        ));
        return;
    }
    if who.memlock.allows(need) {
        out.push(finding(
            Level::Ok,
            "memlock",
            format!("limit {} >= {} MiB to pin", show(who.memlock.soft), a.hugepages),
            None,
        ));
        return;
    }
    let level = if a.noiommu { Level::Warn } else { Level::Fail };
    let why = if a.noiommu {
        " (in no-IOMMU mode VFIO pins nothing, but a driver that mlocks its buffers is still held to it)"
    } else {
        ": VFIO charges every page it maps for DMA to it"
    };
    out.push(finding(
        level,
        "memlock",
        format!("limit {} (hard {}) < {} MiB to pin{why}", show(who.memlock.soft), show(who.memlock.hard), a.hugepages),
        Some("ulimit -l unlimited (as root, or up to the hard limit), or add `<user> - memlock unlimited` to /etc/security/limits.conf and log in again, or run as root".into()),
    ));
}

/// Prints the findings and a summary; exit 1 when any is FAIL.
pub fn run(ctx: &Ctx, a: Args) -> anyhow::Result<ExitCode> {
    let who = Process::current(&ctx.host)?;
    let found = check(&ctx.host, &a, &who);
    for f in &found {
        println!("{f}");
    }
    let n = |l| found.iter().filter(|f| f.level == l).count();
    let (fails, warns) = (n(Level::Fail), n(Level::Warn));
    println!("doctor: {fails} FAIL, {warns} WARN, {} OK", n(Level::Ok));
    Ok(if fails == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

#[cfg(test)]
mod tests;
