//! Self-test of the QEMU test bed that `cargo xtask test` runs: the guest sees the fixed device
//! layout, and what the guest writes to an NVMe namespace lands in the run dir's image file,
//! where the host check reads it back.

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// The fixed guest PCI layout that `cargo xtask vm` promises: (BDF, vendor, device).
const LAYOUT: &[(&str, &str, &str)] = &[
    ("0000:00:03.0", "0x1b36", "0x0010"), // NVMe A
    ("0000:00:04.0", "0x1b36", "0x0010"), // NVMe B
    ("0000:00:05.0", "0x8086", "0x10d3"), // e1000e
    ("0000:00:06.0", "0x8086", "0x10d3"), // e1000e
    ("0000:00:07.0", "0x1af4", "0x1110"), // ivshmem-plain
];

/// Where the marker goes: 1 MiB into NVMe A namespace 1 (4 KiB, one page).
const MARKER_OFFSET: u64 = 1 << 20;

/// The marker, derived from the boot's seed so that a stale image cannot pass.
fn marker() -> Vec<u8> {
    let seed = std::env::var("VFPOLL_SEED").expect("VFPOLL_SEED is set by cargo xtask test");
    let line = format!("vfpoll test-bed self-test, seed {seed}\n");
    line.bytes().cycle().take(4096).collect()
}

fn sysfs(path: impl AsRef<Path>) -> String {
    let p = path.as_ref();
    fs::read_to_string(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .trim()
        .to_string()
}

/// The block device of namespace `nsid` of the NVMe controller at `bdf` (kernel driver).
fn namespace_dev(bdf: &str, nsid: u32) -> PathBuf {
    let ctrls = Path::new("/sys/bus/pci/devices").join(bdf).join("nvme");
    let ctrl = fs::read_dir(&ctrls)
        .unwrap_or_else(|e| panic!("{}: {e}", ctrls.display()))
        .next()
        .expect("an nvme controller")
        .unwrap()
        .file_name();
    let ctrl = ctrl.to_string_lossy();
    let ns = format!("{ctrl}n{nsid}");
    assert_eq!(sysfs(ctrls.join(&*ctrl).join(&ns).join("nsid")), nsid.to_string());
    Path::new("/dev").join(ns)
}

#[test]
#[ignore = "test bed"]
fn guest_smoke() {
    let mode = std::env::var("VFPOLL_TESTBED").expect("VFPOLL_TESTBED is set in the guest");
    assert!(mode == "iommu" || mode == "noiommu", "VFPOLL_TESTBED={mode}");
    assert_eq!(std::env::var("VFPOLL_TESTBED_OUT").as_deref(), Ok("/out"));
    assert!(Path::new("/sys/bus/pci/devices/0000:00:03.0").exists());
    for (bdf, vendor, device) in LAYOUT {
        let dir = Path::new("/sys/bus/pci/devices").join(bdf);
        assert_eq!(sysfs(dir.join("vendor")), *vendor, "{bdf}");
        assert_eq!(sysfs(dir.join("device")), *device, "{bdf}");
    }
    let has_groups = fs::read_dir("/sys/kernel/iommu_groups")
        .map(|d| d.count() > 0)
        .unwrap_or(false);
    assert_eq!(has_groups, mode == "iommu", "IOMMU groups vs mode {mode}");

    // Namespace 2 of controller A has 4 KiB blocks.
    let ns2 = namespace_dev("0000:00:03.0", 2);
    let name = ns2.file_name().unwrap().to_string_lossy().into_owned();
    assert_eq!(
        sysfs(format!("/sys/block/{name}/queue/logical_block_size")),
        "4096"
    );

    // Write the marker through the kernel driver; the host check finds it in the image file.
    let ns1 = namespace_dev("0000:00:03.0", 1);
    let mut f = fs::OpenOptions::new().write(true).open(&ns1).unwrap();
    f.seek(SeekFrom::Start(MARKER_OFFSET)).unwrap();
    f.write_all(&marker()).unwrap();
    f.sync_all().unwrap();
}

#[test]
#[ignore = "test bed"]
fn host_check_smoke() {
    let dir = PathBuf::from(std::env::var_os("VFPOLL_RUN_DIR").expect("VFPOLL_RUN_DIR"));
    for (file, mib) in [
        ("nvme-a-ns1.img", 64),
        ("nvme-a-ns2.img", 32),
        ("nvme-b-ns1.img", 64),
        ("gpubar.shm", 64),
    ] {
        let len = fs::metadata(dir.join(file)).unwrap().len();
        assert_eq!(len, mib << 20, "{file}");
    }
    let mut f = fs::File::open(dir.join("nvme-a-ns1.img")).unwrap();
    f.seek(SeekFrom::Start(MARKER_OFFSET)).unwrap();
    let mut got = vec![0; 4096];
    f.read_exact(&mut got).unwrap();
    assert!(got == marker(), "the guest's marker is not in nvme-a-ns1.img");
    assert_eq!(fs::read_to_string(dir.join("out/exit-code")).unwrap().trim(), "0");
}
