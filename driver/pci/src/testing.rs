//! Fake machines (sysfs, procfs and devtmpfs trees in a temporary folder) for the tests of
//! `vfpoll` (its unit tests and its CLI tests, through the hidden `--root`). Built only with the
//! feature `testing`, which only test builds turn on; the helpers panic on any error.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use crate::sysfs::Host;

/// A fake machine.
pub struct Fake {
    dir: tempfile::TempDir,
}

impl Default for Fake {
    fn default() -> Self {
        Self::new()
    }
}

impl Fake {
    /// A machine with sysfs, procfs and /dev but no device, no module, no IOMMU, no hugepages.
    pub fn new() -> Self {
        let f = Fake {
            dir: tempfile::tempdir().unwrap(),
        };
        for d in [
            "sys/bus/pci/devices",
            "sys/bus/pci/drivers",
            "sys/kernel/iommu_groups",
            "sys/module",
            "dev",
            "proc/self",
        ] {
            fs::create_dir_all(f.path(d)).unwrap();
        }
        f.write("sys/bus/pci/drivers_probe", "");
        f.write(
            "proc/mounts",
            "sysfs /sys sysfs rw,nosuid 0 0\nproc /proc proc rw 0 0\n",
        );
        f.write("proc/swaps", "Filename\tType\tSize\tUsed\tPriority\n");
        f.write("proc/self/status", "Name:\tvfpoll\nCapEff:\t000001ffffffffff\n");
        f
    }

    /// The root folder.
    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// `root/rel`.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.root().join(rel)
    }

    /// The host over this tree.
    pub fn host(&self) -> Host {
        Host::under(self.root())
    }

    /// Writes a file, making its folder.
    pub fn write(&self, rel: &str, text: &str) -> &Self {
        let p = self.path(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
        self
    }

    /// Adds a PCI function with its driver and IOMMU group.
    pub fn device(
        &self,
        bdf: &str,
        id: (u16, u16),
        class: u32,
        driver: Option<&str>,
        group: Option<u32>,
    ) -> &Self {
        let d = self.path("sys/devices/pci0000:00").join(bdf);
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("vendor"), format!("0x{:04x}\n", id.0)).unwrap();
        fs::write(d.join("device"), format!("0x{:04x}\n", id.1)).unwrap();
        fs::write(d.join("class"), format!("0x{class:06x}\n")).unwrap();
        fs::write(d.join("numa_node"), "-1\n").unwrap();
        fs::write(d.join("driver_override"), "(null)\n").unwrap();
        symlink(&d, self.path("sys/bus/pci/devices").join(bdf)).unwrap();
        if let Some(drv) = driver {
            let dd = self.path("sys/bus/pci/drivers").join(drv);
            fs::create_dir_all(&dd).unwrap();
            symlink(&dd, d.join("driver")).unwrap();
        }
        if let Some(g) = group {
            let gd = self.path("sys/kernel/iommu_groups").join(g.to_string());
            fs::create_dir_all(gd.join("devices")).unwrap();
            symlink(&gd, d.join("iommu_group")).unwrap();
            symlink(&d, gd.join("devices").join(bdf)).unwrap();
        }
        self
    }

    /// Turns the IOMMU on (`/sys/class/iommu/dmar0`).
    pub fn iommu_on(&self) -> &Self {
        fs::create_dir_all(self.path("sys/class/iommu/dmar0")).unwrap();
        self
    }

    /// Loads vfio, vfio-pci and vfio_iommu_type1. `noiommu`: `None` = vfio built without
    /// CONFIG_VFIO_NOIOMMU, `Some("Y")`/`Some("N")` = the parameter's value.
    pub fn vfio(&self, noiommu: Option<&str>) -> &Self {
        for m in ["vfio", "vfio_pci", "vfio_iommu_type1"] {
            fs::create_dir_all(self.path("sys/module").join(m)).unwrap();
        }
        fs::create_dir_all(self.path("sys/bus/pci/drivers/vfio-pci")).unwrap();
        if let Some(v) = noiommu {
            self.write(
                "sys/module/vfio/parameters/enable_unsafe_noiommu_mode",
                &format!("{v}\n"),
            );
        }
        self.write("dev/vfio/vfio", "")
    }

    /// Makes `/dev/vfio/<name>` (`3`, `noiommu-0`).
    pub fn group_node(&self, name: &str) -> &Self {
        self.write(&format!("dev/vfio/{name}"), "")
    }

    /// A hugepage pool of `kib` KiB pages, machine-wide (`node: None`) or on a node.
    pub fn pool(&self, kib: u64, node: Option<u32>, total: u64, free: u64) -> &Self {
        let dir = match node {
            Some(n) => format!("sys/devices/system/node/node{n}/hugepages/hugepages-{kib}kB"),
            None => format!("sys/kernel/mm/hugepages/hugepages-{kib}kB"),
        };
        self.write(&format!("{dir}/nr_hugepages"), &format!("{total}\n"));
        self.write(&format!("{dir}/free_hugepages"), &format!("{free}\n"));
        self.write(&format!("{dir}/surplus_hugepages"), "0\n")
    }

    /// Appends a line to `/proc/mounts`.
    pub fn mount(&self, line: &str) -> &Self {
        let mut m = fs::read_to_string(self.path("proc/mounts")).unwrap();
        m.push_str(line);
        m.push('\n');
        self.write("proc/mounts", &m)
    }
}

/// The PCI devices of the QEMU test guest, all on their kernel drivers (ivshmem has none), each
/// in its own IOMMU group when `iommu`, and the ICH9 LPC/SATA/SMBus sharing group 7.
pub fn guest(iommu: bool) -> Fake {
    let f = Fake::new();
    let g = |n| iommu.then_some(n);
    f.device("0000:00:03.0", (0x1b36, 0x0010), 0x010802, Some("nvme"), g(3))
        .device("0000:00:04.0", (0x1b36, 0x0010), 0x010802, Some("nvme"), g(4))
        .device("0000:00:05.0", (0x8086, 0x10d3), 0x020000, Some("e1000e"), g(5))
        .device("0000:00:06.0", (0x8086, 0x10d3), 0x020000, Some("e1000e"), g(6))
        .device("0000:00:07.0", (0x1af4, 0x1110), 0x050000, None, g(8))
        .device("0000:00:1f.0", (0x8086, 0x2918), 0x060100, Some("lpc_ich"), g(7))
        .device("0000:00:1f.2", (0x8086, 0x2922), 0x010601, Some("ahci"), g(7))
        .device(
            "0000:00:1f.3",
            (0x8086, 0x2930),
            0x0c0500,
            Some("i801_smbus"),
            g(7),
        );
    f.pool(2048, None, 0, 0).pool(1 << 20, None, 0, 0);
    if iommu {
        f.iommu_on();
    }
    f
}
