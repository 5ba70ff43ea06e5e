//! Binding against fake sysfs trees. [`FakeKernel`] records every write and plays the kernel's
//! part: `drivers_probe` links the device to the driver its override names (or to the driver it
//! would pick by ID), `vfio-pci` makes the group node, `unbind` drops the link.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;
use crate::sysfs::fake::{add_device, add_namespace, add_netdev};

const NVME: &str = "0000:00:03.0";
const NVME2: &str = "0000:00:04.0";
const NIC: &str = "0000:00:05.0";

struct FakeKernel {
    root: PathBuf,
    /// The driver the kernel picks for a device when no override is set.
    natural: HashMap<String, String>,
    /// Modules `load_module` can load.
    loadable: Vec<String>,
    /// vfio-pci's probe fails (as it does with no IOMMU and no no-IOMMU mode).
    vfio_refuses: bool,
    /// devtmpfs makes `/dev/vfio/<group>` nodes.
    make_nodes: bool,
    writes: Vec<(String, String)>,
    loads: Vec<String>,
}

impl FakeKernel {
    fn new(root: &Path) -> Self {
        FakeKernel {
            root: root.to_owned(),
            natural: [(NVME, "nvme"), (NVME2, "nvme"), (NIC, "e1000e")]
                .into_iter()
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
                .collect(),
            loadable: vec!["vfio-pci".into()],
            vfio_refuses: false,
            make_nodes: true,
            writes: Vec::new(),
            loads: Vec::new(),
        }
    }

    fn sys(&self) -> PathBuf {
        self.root.join("sys")
    }

    fn probe(&mut self, bdf: &str) -> io::Result<()> {
        let dev = self.sys().join("bus/pci/devices").join(bdf);
        if dev.join("driver").exists() {
            return Ok(());
        }
        let ovr = fs::read_to_string(dev.join("driver_override"))?.trim().to_owned();
        let target = if ovr == "(null)" {
            self.natural.get(bdf).cloned()
        } else {
            Some(ovr)
        };
        let Some(target) = target else { return Ok(()) };
        let drv = self.sys().join("bus/pci/drivers").join(&target);
        if !drv.is_dir() {
            return Ok(());
        }
        if target == VFIO_PCI {
            let host = Host::under(&self.root);
            let mut group = crate::sysfs::link_name(&dev.join("iommu_group"));
            let mut prefix = "";
            if group.is_none() && noiommu(&host) == NoIommu::On {
                // vfio makes a fake group for the device; the kernel numbers them from 0.
                let n = (0..).find(|n| !host.iommu_group_dir(*n).exists()).unwrap();
                let gd = host.iommu_group_dir(n);
                fs::create_dir_all(gd.join("devices"))?;
                symlink(&gd, dev.join("iommu_group"))?;
                symlink(&dev, gd.join("devices").join(bdf))?;
                group = Some(n.to_string());
                prefix = "noiommu-";
            }
            if self.vfio_refuses || group.is_none() {
                return Ok(());
            }
            if self.make_nodes {
                let vd = self.root.join("dev/vfio");
                fs::create_dir_all(&vd)?;
                fs::write(vd.join(format!("{prefix}{}", group.unwrap())), "")?;
            }
        }
        symlink(&drv, dev.join("driver"))
    }
}

impl KernelOps for FakeKernel {
    fn write_attr(&mut self, path: &Path, value: &str) -> io::Result<()> {
        let rel = path
            .strip_prefix(&self.root)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        self.writes.push((rel, value.to_owned()));
        match path.file_name().unwrap().to_str().unwrap() {
            "driver_override" => {
                let v = if value.trim().is_empty() {
                    "(null)".to_owned()
                } else {
                    value.to_owned()
                };
                fs::write(path, format!("{v}\n"))
            }
            "unbind" => fs::remove_file(self.sys().join("bus/pci/devices").join(value).join("driver")),
            "drivers_probe" => self.probe(value),
            _ => fs::write(path, value),
        }
    }

    fn load_module(&mut self, name: &str) -> Result<(), String> {
        self.loads.push(name.to_owned());
        if !self.loadable.iter().any(|m| m == name) {
            return Err(format!("modprobe: FATAL: Module {name} not found"));
        }
        fs::create_dir_all(self.sys().join("module").join(name.replace('-', "_"))).unwrap();
        if name == VFIO_PCI {
            fs::create_dir_all(self.sys().join("bus/pci/drivers").join(name)).unwrap();
            fs::create_dir_all(self.sys().join("module/vfio_pci")).unwrap();
            fs::create_dir_all(self.root.join("dev/vfio")).unwrap();
            fs::write(self.root.join("dev/vfio/vfio"), "").unwrap();
        }
        if name != VFIO_PCI && name != VFIO_IOMMU_TYPE1 {
            fs::create_dir_all(self.sys().join("bus/pci/drivers").join(name)).unwrap();
        }
        Ok(())
    }
}

/// A machine with an NVMe controller (group 3, `nvme`), a second one (group 4) and an e1000e NIC
/// (group 5), vfio-pci loaded, nothing mounted from them.
fn machine() -> (tempfile::TempDir, Host, BindOptions) {
    let t = tempfile::tempdir().unwrap();
    let r = t.path();
    add_device(r, NVME, 0x1b36, 0x0010, 0x010802, Some("nvme"), Some(3));
    add_device(r, NVME2, 0x1b36, 0x0010, 0x010802, Some("nvme"), Some(4));
    add_device(r, NIC, 0x8086, 0x10d3, 0x020000, Some("e1000e"), Some(5));
    add_namespace(r, NVME, 0, 1, 2);
    add_netdev(r, NIC, "eth0", 0x1002);
    fs::create_dir_all(r.join("sys/bus/pci/drivers/vfio-pci")).unwrap();
    fs::create_dir_all(r.join("sys/module/vfio/parameters")).unwrap();
    fs::write(r.join("sys/bus/pci/drivers_probe"), "").unwrap();
    fs::create_dir_all(r.join("dev/vfio")).unwrap();
    fs::create_dir_all(r.join("proc")).unwrap();
    fs::write(
        r.join("proc/mounts"),
        "/dev/vda1 / ext4 rw,relatime 0 0\nproc /proc proc rw 0 0\n",
    )
    .unwrap();
    fs::write(r.join("proc/swaps"), "Filename\tType\tSize\tUsed\tPriority\n").unwrap();
    let host = Host::under(r);
    let opts = BindOptions {
        state_dir: r.join("run/vfpoll"),
        settle: Duration::from_millis(50),
        ..Default::default()
    };
    (t, host, opts)
}

fn b(s: &str) -> Bdf {
    s.parse().unwrap()
}

fn driver_of(host: &Host, s: &str) -> Option<String> {
    sysfs::device(host, b(s)).unwrap().driver
}

#[test]
fn binds_and_gives_back() {
    let (t, host, opts) = machine();
    let mut k = FakeKernel::new(t.path());
    let out = bind_vfio_with(&host, &mut k, b(NVME), &opts).unwrap();
    assert_eq!(out.action, BindAction::Bound);
    assert_eq!(out.before.as_deref(), Some("nvme"));
    assert_eq!(out.after.as_deref(), Some(VFIO_PCI));
    assert_eq!(out.group_node, Some(t.path().join("dev/vfio/3")));
    assert_eq!(
        out.to_string(),
        format!(
            "{NVME}: nvme -> vfio-pci ({})",
            t.path().join("dev/vfio/3").display()
        )
    );
    let w: Vec<(&str, &str)> = k.writes.iter().map(|(p, v)| (p.as_str(), v.as_str())).collect();
    assert_eq!(
        w,
        [
            ("sys/bus/pci/devices/0000:00:03.0/driver_override", "vfio-pci"),
            ("sys/bus/pci/devices/0000:00:03.0/driver/unbind", NVME),
            ("sys/bus/pci/drivers_probe", NVME),
        ]
    );
    assert_eq!(
        recorded_driver(&opts.state_dir, b(NVME)).unwrap(),
        Some(Some("nvme".into()))
    );
    assert_eq!(
        recorded(&opts.state_dir),
        [Record {
            bdf: b(NVME),
            original: Some("nvme".into())
        }]
    );

    // Idempotent: a second bind writes nothing.
    k.writes.clear();
    let again = bind_vfio_with(&host, &mut k, b(NVME), &opts).unwrap();
    assert_eq!(again.action, BindAction::AlreadyBound);
    assert!(k.writes.is_empty());

    k.writes.clear();
    let back = unbind_to_kernel_with(&host, &mut k, b(NVME), &opts).unwrap();
    assert_eq!(back.action, BindAction::Returned);
    assert_eq!(back.after.as_deref(), Some("nvme"));
    assert_eq!(
        k.writes[0],
        (
            "sys/bus/pci/devices/0000:00:03.0/driver_override".into(),
            "\n".into()
        )
    );
    assert_eq!(k.writes[1].0, "sys/bus/pci/devices/0000:00:03.0/driver/unbind");
    assert_eq!(k.writes[2].0, "sys/bus/pci/drivers_probe");
    assert_eq!(driver_of(&host, NVME).as_deref(), Some("nvme"));
    assert_eq!(recorded_driver(&opts.state_dir, b(NVME)).unwrap(), None);

    // A device that is not on vfio-pci is left alone.
    k.writes.clear();
    let none = unbind_to_kernel_with(&host, &mut k, b(NVME2), &opts).unwrap();
    assert_eq!(none.action, BindAction::NotOnVfio);
    assert!(k.writes.is_empty());
}

#[test]
fn absent_device_says_how_to_list_devices() {
    let (t, host, opts) = machine();
    let e = bind_vfio_with(&host, &mut FakeKernel::new(t.path()), b("0000:00:1e.0"), &opts).unwrap_err();
    assert!(
        matches!(e, BindError::Sysfs(SysfsError::NoSuchDevice { .. })),
        "{e}"
    );
    assert!(e.to_string().contains("vfpoll status"), "{e}");
}

#[test]
fn loads_vfio_pci_or_says_how() {
    let (t, host, opts) = machine();
    fs::remove_dir(t.path().join("sys/bus/pci/drivers/vfio-pci")).unwrap();
    let mut k = FakeKernel::new(t.path());
    k.loadable.clear();
    let e = bind_vfio_with(&host, &mut k, b(NVME), &opts).unwrap_err();
    assert!(matches!(e, BindError::VfioPciMissing { .. }));
    assert!(e.to_string().contains("load it: modprobe vfio-pci"), "{e}");
    assert!(e.to_string().contains("Module vfio-pci not found"), "{e}");
    assert_eq!(k.loads, ["vfio-pci"]);
    assert!(
        k.writes.is_empty(),
        "nothing may be written before the driver is there"
    );
    assert_eq!(driver_of(&host, NVME).as_deref(), Some("nvme"));

    k.loadable.push("vfio-pci".into());
    assert!(preflight(&host, b(NVME), false).unwrap().needs_module);
    let out = bind_vfio_with(&host, &mut k, b(NVME), &opts).unwrap();
    assert_eq!(out.action, BindAction::Bound);
}

#[test]
fn loads_the_type1_backend_when_an_iommu_is_on() {
    let (t, host, opts) = machine();
    let mut k = FakeKernel::new(t.path());
    assert!(missing_modules(&host).is_empty(), "no IOMMU: type1 is not needed");
    fs::create_dir_all(t.path().join("sys/class/iommu/dmar0")).unwrap();
    assert_eq!(missing_modules(&host), [VFIO_IOMMU_TYPE1]);
    assert!(preflight(&host, b(NVME), false).unwrap().needs_module);
    // It cannot be loaded: binding still works (only using the container would not).
    bind_vfio_with(&host, &mut k, b(NVME), &opts).unwrap();
    assert_eq!(k.loads, [VFIO_IOMMU_TYPE1]);
    k.loadable.push(VFIO_IOMMU_TYPE1.into());
    assert_eq!(ensure_vfio_pci(&host, &mut k).unwrap(), [VFIO_IOMMU_TYPE1]);
    assert!(missing_modules(&host).is_empty());
    assert!(ensure_vfio_pci(&host, &mut k).unwrap().is_empty());
}

#[test]
fn refuses_mounted_nvme_unless_forced() {
    let (t, host, mut opts) = machine();
    fs::write(
        t.path().join("proc/mounts"),
        "/dev/vda1 / ext4 rw 0 0\n/dev/nvme0n1p1 /mnt/data\\040disk xfs rw 0 0\n/dev/nvme0n1p2 /srv ext4 rw 0 0\n",
    )
    .unwrap();
    let mut k = FakeKernel::new(t.path());
    let e = bind_vfio_with(&host, &mut k, b(NVME), &opts).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("/dev/nvme0n1p1 is mounted on /mnt/data disk"),
        "{msg}"
    );
    assert!(msg.contains("umount /mnt/data disk, umount /srv"), "{msg}");
    assert!(msg.contains("--force"), "{msg}");
    assert!(k.writes.is_empty());
    // The other controller is not affected.
    assert!(preflight(&host, b(NVME2), false).is_ok());

    opts.force = true;
    let out = bind_vfio_with(&host, &mut k, b(NVME), &opts).unwrap();
    assert_eq!(out.action, BindAction::Bound);
}

#[test]
fn refuses_swap_and_holders() {
    let (t, host, opts) = machine();
    fs::write(
        t.path().join("proc/swaps"),
        "Filename Type Size Used Priority\n/dev/nvme0n1p2 partition 1 0 -2\n",
    )
    .unwrap();
    let ns = host.pci_device_dir(b(NVME)).join("nvme/nvme0/nvme0n1");
    fs::create_dir_all(ns.join("nvme0n1p1/holders/dm-0")).unwrap();
    let e = preflight(&host, b(NVME), false).unwrap_err().to_string();
    assert!(
        e.contains("/dev/nvme0n1p2 is swap") && e.contains("swapoff /dev/nvme0n1p2"),
        "{e}"
    );
    assert!(e.contains("/dev/nvme0n1p1 is held by dm-0"), "{e}");
    let _ = opts;
}

#[test]
fn recognises_root_shown_as_dev_root_by_device_number() {
    let (t, host, _) = machine();
    fs::create_dir_all(t.path().join("proc/self")).unwrap();
    // nvme0n1p1 is 259:11 in the fake tree.
    fs::write(
        t.path().join("proc/self/mountinfo"),
        "22 1 259:11 / / rw,relatime shared:1 - ext4 /dev/root rw\n\
         23 22 0:21 / /proc rw shared:2 - proc proc rw\n",
    )
    .unwrap();
    let e = preflight(&host, b(NVME), false).unwrap_err().to_string();
    assert!(
        e.contains("/dev/nvme0n1p1 is mounted on /") && e.contains("umount /"),
        "{e}"
    );
}

#[test]
fn refuses_nic_that_is_up() {
    let (t, host, mut opts) = machine();
    let mut k = FakeKernel::new(t.path());
    add_netdev(t.path(), NIC, "eth0", 0x1003);
    let e = bind_vfio_with(&host, &mut k, b(NIC), &opts)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("interface eth0 is up") && e.contains("ip link set eth0 down"),
        "{e}"
    );
    assert!(e.contains("--force"), "{e}");
    opts.force = true;
    assert_eq!(
        bind_vfio_with(&host, &mut k, b(NIC), &opts).unwrap().action,
        BindAction::Bound
    );
    add_netdev(t.path(), NVME2, "unused", 0x1002);
    assert!(
        preflight(&host, b(NVME2), false).is_ok(),
        "an interface that is down is no use"
    );
}

#[test]
fn refuses_group_that_is_not_viable() {
    let (t, host, opts) = machine();
    let r = t.path();
    add_device(
        r,
        "0000:00:1f.0",
        0x8086,
        0x2918,
        0x060100,
        Some("lpc_ich"),
        Some(7),
    );
    add_device(r, "0000:00:1f.2", 0x8086, 0x2922, 0x010601, Some("ahci"), Some(7));
    add_device(r, "0000:00:1f.3", 0x8086, 0x2930, 0x0c0500, None, Some(7));
    add_device(
        r,
        "0000:00:1f.4",
        0x8086,
        0x2930,
        0x060400,
        Some("pcieport"),
        Some(7),
    );
    let mut k = FakeKernel::new(r);
    k.natural.insert("0000:00:1f.2".into(), "ahci".into());
    let e = bind_vfio_with(&host, &mut k, b("0000:00:1f.2"), &opts).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(&e, BindError::GroupNotViable { group: 7, others, .. } if others.len() == 1),
        "{msg}"
    );
    assert!(msg.contains("0000:00:1f.0 (driver lpc_ich)"), "{msg}");
    assert!(
        !msg.contains("1f.3") && !msg.contains("1f.4"),
        "no driver and pcieport are fine: {msg}"
    );
    assert!(msg.contains("vfpoll bind 0000:00:1f.2 0000:00:1f.0"), "{msg}");
    assert!(k.writes.is_empty());
    // --force does not override the group check.
    assert!(preflight(&host, b("0000:00:1f.2"), true).is_err());
}

#[test]
fn rolls_back_when_vfio_refuses() {
    let (t, host, opts) = machine();
    let mut k = FakeKernel::new(t.path());
    k.vfio_refuses = true;
    let e = bind_vfio_with(&host, &mut k, b(NVME), &opts).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, BindError::NotTaken { .. }), "{msg}");
    assert!(
        msg.contains("no driver") && msg.contains("given back (nvme)") && msg.contains("dmesg"),
        "{msg}"
    );
    assert_eq!(driver_of(&host, NVME).as_deref(), Some("nvme"));
    assert_eq!(sysfs::device(&host, b(NVME)).unwrap().driver_override, None);
}

#[test]
fn waits_for_the_group_node_then_blames_dev_vfio() {
    let (t, host, opts) = machine();
    let mut k = FakeKernel::new(t.path());
    k.make_nodes = false;
    let e = bind_vfio_with(&host, &mut k, b(NVME), &opts).unwrap_err();
    assert!(matches!(e, BindError::GroupNodeMissing { .. }), "{e}");
    assert!(e.to_string().contains("group: 3"), "{e}");

    fs::remove_dir_all(t.path().join("dev/vfio")).unwrap();
    let e = bind_vfio_with(&host, &mut k, b(NVME2), &opts).unwrap_err();
    assert!(matches!(e, BindError::NoVfioDev { .. }), "{e}");
    assert!(e.to_string().contains("vfio is not loaded"), "{e}");
}

#[test]
fn no_iommu_group_needs_noiommu_mode() {
    let (t, host, opts) = machine();
    let r = t.path();
    add_device(r, "0000:00:07.0", 0x1af4, 0x1110, 0x050000, None, None);
    let mut k = FakeKernel::new(r);
    let e = bind_vfio_with(&host, &mut k, b("0000:00:07.0"), &opts).unwrap_err();
    assert!(matches!(e, BindError::NoIommu { .. }), "{e}");
    assert!(e.to_string().contains("intel_iommu=on") && e.to_string().contains("enable_unsafe_noiommu_mode"));
    assert!(k.writes.is_empty());
    assert_eq!(noiommu(&host), NoIommu::Unsupported);

    fs::write(
        r.join("sys/module/vfio/parameters/enable_unsafe_noiommu_mode"),
        "Y\n",
    )
    .unwrap();
    assert_eq!(noiommu(&host), NoIommu::On);
    let out = bind_vfio_with(&host, &mut k, b("0000:00:07.0"), &opts).unwrap();
    assert_eq!(out.before, None);
    assert_eq!(out.group, Some(0));
    assert_eq!(out.group_node, Some(r.join("dev/vfio/noiommu-0")));
    assert_eq!(
        recorded_driver(&opts.state_dir, b("0000:00:07.0")).unwrap(),
        Some(None)
    );
    let back = unbind_to_kernel_with(&host, &mut k, b("0000:00:07.0"), &opts).unwrap();
    assert_eq!((back.action, back.after), (BindAction::Returned, None));
}

#[test]
fn says_when_the_original_driver_does_not_come_back() {
    let (t, host, opts) = machine();
    let mut k = FakeKernel::new(t.path());
    bind_vfio_with(&host, &mut k, b(NIC), &opts).unwrap();
    // e1000e was unloaded meanwhile and cannot be loaded again.
    fs::remove_dir_all(t.path().join("sys/bus/pci/drivers/e1000e")).unwrap();
    let e = unbind_to_kernel_with(&host, &mut k, b(NIC), &opts).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, BindError::NotReturned { .. }), "{msg}");
    assert!(
        msg.contains("modprobe e1000e") && msg.contains("drivers_probe"),
        "{msg}"
    );
    assert_eq!(k.loads, ["e1000e"]);
    assert!(
        recorded_driver(&opts.state_dir, b(NIC)).unwrap().is_some(),
        "the record stays for a retry"
    );

    k.loadable.push("e1000e".into());
    let back = unbind_to_kernel_with(&host, &mut k, b(NIC), &opts).unwrap();
    assert_eq!(
        (back.action, back.after.as_deref()),
        (BindAction::Returned, Some("e1000e"))
    );
    assert_eq!(recorded_driver(&opts.state_dir, b(NIC)).unwrap(), None);
}

#[test]
fn write_errors_say_root_is_needed() {
    let e = BindError::Write {
        path: "/sys/bus/pci/drivers_probe".into(),
        value: NVME.into(),
        source: io::Error::from(io::ErrorKind::PermissionDenied),
    };
    assert!(e.to_string().contains("binding needs root"), "{e}");
    let e = BindError::State {
        bdf: b(NVME),
        path: "/run/vfpoll/bound/0000:00:03.0".into(),
        source: io::Error::from(io::ErrorKind::PermissionDenied),
    };
    assert!(
        e.to_string().ends_with("; binding needs root (sudo vfpoll ...)"),
        "{e}"
    );
}
