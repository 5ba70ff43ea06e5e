//! The doctor's findings on fake machines.

use super::*;
use crate::fake::{guest, Fake};
use vfpoll_hugepages::Memlock;

const ROOT: Process = Process {
    euid: 0,
    cap_ipc_lock: Some(true),
    memlock: Memlock {
        soft: Some(8 << 20),
        hard: Some(8 << 20),
    },
};
const USER: Process = Process {
    euid: 1000,
    cap_ipc_lock: Some(false),
    memlock: Memlock {
        soft: Some(8 << 20),
        hard: Some(8 << 20),
    },
};

fn args(noiommu: bool, devices: &[&str]) -> Args {
    Args {
        noiommu,
        iommu_backend: Default::default(),
        devices: devices.iter().map(|d| d.parse().unwrap()).collect(),
        hugepages: 64,
    }
}

/// The finding of `check` that mentions `needle`.
fn find<'a>(f: &'a [Finding], check: &str, needle: &str) -> &'a Finding {
    f.iter()
        .find(|x| x.check == check && x.detail.contains(needle))
        .unwrap_or_else(|| panic!("no `{check}` finding with `{needle}` in:\n{}", show(f)))
}

fn show(f: &[Finding]) -> String {
    f.iter().map(|x| format!("{x}\n")).collect()
}

/// The guest after `vfpoll setup --bind nvme` with the IOMMU on: a run can go.
fn ready() -> Fake {
    let f = guest(true);
    f.vfio(None)
        .pool(2048, None, 32, 32)
        .mount("nodev /dev/hugepages hugetlbfs rw,relatime,pagesize=2M 0 0");
    for (bdf, g) in [("0000:00:03.0", 3), ("0000:00:04.0", 4)] {
        let link = f.path("sys/devices/pci0000:00").join(bdf).join("driver");
        std::fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink(f.path("sys/bus/pci/drivers/vfio-pci"), link).unwrap();
        f.group_node(&g.to_string());
    }
    f
}

#[test]
fn all_ok_when_ready() {
    let f = ready();
    let out = check(&f.host(), &args(false, &[]), &ROOT);
    assert!(out.iter().all(|x| x.level == Level::Ok), "{}", show(&out));
    find(&out, "iommu", "IOMMU on (dmar0), 6 IOMMU groups");
    let d = find(&out, "0000:00:03.0", "on vfio-pci");
    assert!(
        d.detail.contains("group 3 viable") && d.detail.contains("dev/vfio/3 read-write"),
        "{d}"
    );
    find(&out, "0000:00:04.0", "group 4 viable");
    find(
        &out,
        "hugepages",
        "64 MiB free in hugepages (2M: 32 of 32 free); 64 MiB needed",
    );
    find(&out, "hugetlbfs", "/dev/hugepages (2M)");
    find(&out, "memlock", "running as root with CAP_IPC_LOCK");
}

#[test]
fn iommu_off_and_no_noiommu() {
    let f = guest(false);
    f.vfio(None);
    let out = check(&f.host(), &args(false, &[]), &ROOT);
    let i = find(&out, "iommu", "no IOMMU is on");
    assert_eq!(i.level, Level::Fail);
    assert!(i.fix.as_deref().unwrap().contains("intel_iommu=on"), "{i}");
    assert!(i.fix.as_deref().unwrap().contains("--noiommu"), "{i}");

    // --noiommu on a vfio.ko built without CONFIG_VFIO_NOIOMMU.
    let out = check(&f.host(), &args(true, &[]), &ROOT);
    let n = find(&out, "no-iommu", "built without CONFIG_VFIO_NOIOMMU");
    assert_eq!(n.level, Level::Fail);
    assert!(n.fix.as_deref().unwrap().contains("rebuild vfio.ko"), "{n}");

    // The parameter exists but is off.
    f.write("sys/module/vfio/parameters/enable_unsafe_noiommu_mode", "N\n");
    let out = check(&f.host(), &args(true, &[]), &ROOT);
    let n = find(&out, "no-iommu", "no-IOMMU mode is off");
    assert!(n
        .fix
        .as_deref()
        .unwrap()
        .starts_with("echo Y > /sys/module/vfio/parameters/enable_unsafe_noiommu_mode"));

    // On: OK, and vfio_iommu_type1 is not needed.
    f.write("sys/module/vfio/parameters/enable_unsafe_noiommu_mode", "Y\n");
    std::fs::remove_dir(f.path("sys/module/vfio_iommu_type1")).unwrap();
    let out = check(&f.host(), &args(true, &[]), &ROOT);
    assert_eq!(find(&out, "no-iommu", "no-IOMMU mode is on").level, Level::Ok);
    assert_eq!(find(&out, "modules", "vfio_iommu_type1").level, Level::Ok);
    let out = check(&f.host(), &args(false, &[]), &ROOT);
    assert_eq!(
        find(&out, "modules", "vfio_iommu_type1 is not loaded").level,
        Level::Fail
    );
}

#[test]
fn vfio_not_loaded() {
    let f = guest(false);
    let out = check(&f.host(), &args(true, &["0000:00:03.0"]), &ROOT);
    let n = find(&out, "no-iommu", "vfio is not loaded");
    assert_eq!(
        n.fix.as_deref(),
        Some("modprobe vfio enable_unsafe_noiommu_mode=1 && modprobe vfio-pci")
    );
    let m = find(&out, "modules", "vfio-pci is not loaded");
    assert_eq!(
        (m.level, m.fix.as_deref()),
        (Level::Fail, Some("modprobe vfio-pci"))
    );
    assert_eq!(find(&out, "/dev/vfio/vfio", "missing").level, Level::Fail);
    let d = find(&out, "0000:00:03.0", "is on nvme, not vfio-pci");
    assert_eq!(d.fix.as_deref(), Some("vfpoll bind 0000:00:03.0"));
    assert!(out.iter().any(|x| x.level == Level::Fail));
}

#[test]
fn device_in_use_names_the_remedy() {
    let f = guest(true);
    f.vfio(None)
        .write("sys/bus/pci/devices/0000:00:05.0/net/eth0/flags", "0x1003\n");
    let out = check(&f.host(), &args(false, &["0000:00:05.0", "0000:00:1e.0"]), &ROOT);
    let d = find(&out, "0000:00:05.0", "is on e1000e");
    assert_eq!(
        d.fix.as_deref(),
        Some("ip link set eth0 down first, then vfpoll bind 0000:00:05.0 (or vfpoll bind 0000:00:05.0 --force)")
    );
    find(&out, "0000:00:1e.0", "no PCI device 0000:00:1e.0");
}

#[test]
fn group_not_viable() {
    let f = ready();
    // The SATA controller went to vfio-pci, its LPC and SMBus peers did not.
    let link = f.path("sys/devices/pci0000:00/0000:00:1f.2/driver");
    std::fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink(f.path("sys/bus/pci/drivers/vfio-pci"), link).unwrap();
    f.group_node("7");
    let out = check(&f.host(), &args(false, &[]), &ROOT);
    let g = find(&out, "0000:00:1f.2", "IOMMU group 7 is not viable");
    assert_eq!(g.level, Level::Fail);
    assert!(
        g.detail
            .contains("0000:00:1f.0 (driver lpc_ich), 0000:00:1f.3 (driver i801_smbus)"),
        "{g}"
    );
    assert_eq!(
        g.fix.as_deref(),
        Some("vfpoll bind 0000:00:1f.0 0000:00:1f.3, or move 0000:00:1f.2 to a slot with its own group")
    );
    // The others stay fine.
    assert_eq!(find(&out, "0000:00:03.0", "viable").level, Level::Ok);
}

#[test]
fn missing_group_node_and_noiommu_groups() {
    let f = ready();
    std::fs::remove_file(f.path("dev/vfio/4")).unwrap();
    let out = check(&f.host(), &args(false, &["0000:00:04.0"]), &ROOT);
    assert_eq!(
        find(&out, "0000:00:04.0", "has no node /dev/vfio/4").level,
        Level::Fail
    );
    f.group_node("noiommu-4");
    let out = check(&f.host(), &args(false, &["0000:00:04.0"]), &ROOT);
    let w = find(&out, "0000:00:04.0", "no-IOMMU group 4");
    assert_eq!(
        (w.level, w.fix.as_deref()),
        (Level::Warn, Some("check it with: vfpoll doctor --noiommu"))
    );
}

#[test]
fn no_hugepages() {
    let f = guest(true);
    f.vfio(None);
    let out = check(&f.host(), &args(false, &[]), &ROOT);
    let h = find(
        &out,
        "hugepages",
        "0 MiB free in hugepages (no pages reserved); 64 MiB needed",
    );
    assert_eq!(
        (h.level, h.fix.as_deref()),
        (Level::Fail, Some("vfpoll setup --hugepages 64"))
    );
    let m = find(&out, "hugetlbfs", "no hugetlbfs is mounted");
    assert_eq!(m.level, Level::Warn);
    find(&out, "devices", "no device is bound to vfio-pci");

    // Too few: 16 free 2M pages are 32 MiB.
    f.pool(2048, None, 32, 16);
    let out = check(&f.host(), &args(false, &[]), &ROOT);
    assert_eq!(
        find(&out, "hugepages", "32 MiB free in hugepages (2M: 16 of 32 free)").level,
        Level::Fail
    );

    // No pools at all.
    std::fs::remove_dir_all(f.path("sys/kernel/mm/hugepages")).unwrap();
    let out = check(&f.host(), &args(false, &[]), &ROOT);
    assert_eq!(find(&out, "hugepages", "no hugepage pools").level, Level::Fail);
}

#[test]
fn memlock_low_for_a_user() {
    let f = ready();
    let out = check(&f.host(), &args(false, &[]), &USER);
    let m = find(&out, "memlock", "limit 8192 KiB (hard 8192 KiB) < 64 MiB to pin");
    assert_eq!(m.level, Level::Fail);
    assert!(
        m.fix.as_deref().unwrap().starts_with("ulimit -l unlimited"),
        "{m}"
    );
    // Only a warning in no-IOMMU mode, where VFIO pins nothing.
    let out = check(&f.host(), &args(true, &[]), &USER);
    assert_eq!(find(&out, "memlock", "8192 KiB").level, Level::Warn);
    // Enough, or unlimited.
    let big = Process {
        memlock: Memlock {
            soft: None,
            hard: None,
        },
        ..USER
    };
    assert_eq!(
        find(&check(&f.host(), &args(false, &[]), &big), "memlock", "unlimited").level,
        Level::Ok
    );
    let capped = Process {
        cap_ipc_lock: Some(true),
        ..USER
    };
    find(
        &check(&f.host(), &args(false, &[]), &capped),
        "memlock",
        "the process has CAP_IPC_LOCK",
    );
}

#[test]
fn findings_print_with_their_fix() {
    let f = Finding {
        level: Level::Fail,
        check: "modules".into(),
        detail: "vfio-pci is not loaded".into(),
        fix: Some("modprobe vfio-pci".into()),
    };
    assert_eq!(
        f.to_string(),
        "FAIL  modules: vfio-pci is not loaded\n      fix: modprobe vfio-pci"
    );
}

/// [`ready`] on a kernel with iommufd: `/dev/iommu`, and the NVMe controllers' VFIO cdevs.
fn ready_iommufd() -> Fake {
    let f = ready();
    f.write("dev/iommu", "");
    for (bdf, n) in [("0000:00:03.0", 0), ("0000:00:04.0", 1)] {
        std::fs::create_dir_all(
            f.path("sys/devices/pci0000:00")
                .join(bdf)
                .join(format!("vfio-dev/vfio{n}")),
        )
        .unwrap();
        f.write(&format!("dev/vfio/devices/vfio{n}"), "");
    }
    f
}

#[test]
fn the_backend_a_run_uses_and_what_iommufd_needs() {
    // No /dev/iommu: type1, and why.
    let f = ready();
    let out = check(&f.host(), &args(false, &[]), &ROOT);
    let b = find(&out, "backend", "a run uses type1");
    assert!(b.detail.contains("dev/iommu is missing"), "{b}");
    // iommufd: the cdevs are checked, the type1 module and container are not needed.
    let f = ready_iommufd();
    std::fs::remove_dir_all(f.path("sys/module/vfio_iommu_type1")).ok();
    let out = check(&f.host(), &args(false, &[]), &ROOT);
    assert!(out.iter().all(|x| x.level == Level::Ok), "{}", show(&out));
    let b = find(&out, "backend", "a run uses iommufd");
    assert!(
        b.detail.contains("0000:00:03.0 is vfio0") && b.detail.contains("0000:00:04.0 is vfio1"),
        "{b}"
    );
    find(&out, "/dev/iommu", "cannot map a peer device's BAR");
    find(&out, "0000:00:03.0 cdev", "dev/vfio/devices/vfio0 read-write");
    find(&out, "0000:00:04.0", "opened through its VFIO cdev");
    // Asked for type1 on the same machine: the container is checked again.
    let mut a = args(false, &[]);
    a.iommu_backend = vfpoll_pci::vfio::Backend::Type1;
    let out = check(&f.host(), &a, &ROOT);
    find(&out, "backend", "a run uses type1: asked for");
    find(&out, "0000:00:03.0", "dev/vfio/3 read-write");
    // Asked for iommufd where a device has no cdev: FAIL with the way out.
    std::fs::remove_dir_all(f.path("sys/devices/pci0000:00/0000:00:04.0/vfio-dev")).unwrap();
    a.iommu_backend = vfpoll_pci::vfio::Backend::Iommufd;
    let out = check(&f.host(), &a, &ROOT);
    let c = find(&out, "0000:00:04.0 cdev", "no VFIO device cdev");
    assert_eq!(c.level, Level::Fail);
    assert!(c.fix.as_deref().unwrap().contains("--iommu-backend type1"), "{c}");
    // --noiommu with another backend contradicts itself.
    a.noiommu = true;
    let out = check(&f.host(), &a, &ROOT);
    assert_eq!(find(&out, "backend", "contradict").level, Level::Fail);
}
