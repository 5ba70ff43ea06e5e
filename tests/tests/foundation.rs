//! Foundation tests in the test bed (issue 2): claim devices through vfio-pci in every IOMMU
//! mode (type1, iommufd on the 6.12 kernel, no-IOMMU), read NVMe registers, get hugepage DMA
//! memory, map the ivshmem BAR as a DMA target (refused under iommufd, with the way out), refuse
//! devices the kernel still uses, and check that `vfpoll status`/`doctor` tell the truth.

use std::process::Command;

use vfpoll_dma::{DmaContext, MapKind, PageSize};
use vfpoll_nvme::regs::{off, Cap, Version};
use vfpoll_pci::bind::{self, BindOptions};
use vfpoll_pci::vfio::{Container, IommuMode, VfioError};
use vfpoll_pci::{sysfs, Host};
use vfpoll_tests::*;

/// Where in the ivshmem BAR the guest CPU writes its pattern (and how much).
const SHM_OFFSET: usize = 3 << 20;
const SHM_LEN: usize = 256 * 1024;

#[test]
#[ignore = "test bed"]
fn guest_claims_nvme_and_reads_cap_and_vs() {
    let mode = mode();
    let outcomes = bind_all(&[NVME_A]);
    assert_eq!(outcomes[0].after.as_deref(), Some("vfio-pci"));
    let node = outcomes[0].group_node.as_ref().expect("a group node");
    match mode {
        IommuMode::Type1 | IommuMode::Iommufd => {
            assert!(!node.to_string_lossy().contains("noiommu"), "{}", node.display())
        }
        IommuMode::NoIommu => assert!(node.to_string_lossy().contains("noiommu-"), "{}", node.display()),
    }
    let c = Container::open(mode).expect("container");
    let dev = c.device(bdf(NVME_A)).expect("NVMe device");
    assert_backend(&c);
    if mode == IommuMode::Iommufd {
        // Opened through its cdev, bound to the iommufd and attached to the IOAS; no group.
        let cdev = sysfs::vfio_cdev(&Host::default(), bdf(NVME_A)).expect("a VFIO cdev");
        assert!(std::path::Path::new("/dev/vfio/devices").join(&cdev).exists());
        assert_eq!(dev.group_id(), None);
        assert_eq!(c.bound_devices(), vec![bdf(NVME_A)]);
    }
    dev.enable_bus_master().expect("bus master");
    // SAFETY: the test writes only CC (enable, then a function reset) and rings no doorbell,
    // so the controller fetches no command and starts no DMA.
    let bar0 = unsafe { dev.map_bar(0) }.expect("BAR0");
    let cap = Cap(bar0.read64(off::CAP));
    let vs = Version(bar0.read32(off::VS));
    println!("{NVME_A}: CAP={cap:?} VS={vs}");
    // What QEMU 7.2's emulated controller reports (cmb_size_mb=16 makes CMBS=1).
    assert_eq!(vs.to_string(), "1.4.0");
    assert_eq!(cap.max_queue_entries(), 2048);
    assert!(cap.contiguous_queues_required());
    assert!(cap.cmb_supported());
    assert_eq!(cap.mps_min(), 4096);
    assert_eq!(cap.command_sets() & 1, 1);
    // Region info: BAR0 16 KiB, BAR2 the 16 MiB CMB, config space.
    assert_eq!(dev.region(0).unwrap().size, 0x4000);
    assert_eq!(dev.region(2).unwrap().size, 16 << 20);
    assert!(dev.region(7).unwrap().size >= 256);
    let vendor = dev.config_read_u16(0).unwrap();
    assert_eq!(vendor, 0x1b36);
    // Function reset (QEMU's NVMe offers FLR): an enabled controller comes back disabled.
    assert!(dev.can_reset(), "QEMU's NVMe controller offers a function reset");
    bar0.write32(off::CC, 0x0046_0001);
    let t = std::time::Instant::now();
    while bar0.read32(off::CSTS) & 1 == 0 && t.elapsed() < std::time::Duration::from_secs(5) {}
    assert_eq!(bar0.read32(off::CSTS) & 1, 1, "enabled");
    assert!(dev.reset().expect("reset"));
    dev.enable_bus_master().unwrap();
    assert_eq!(bar0.read32(off::CC) & 1, 0, "CC.EN is clear after the reset");
    match mode {
        IommuMode::Type1 | IommuMode::Iommufd => {
            let info = c.iommu_info().expect("type1 and iommufd report IOMMU info");
            assert!(!info.iova_ranges.is_empty());
            assert!(
                !info.iova_ranges.iter().any(|r| r.contains(&0xfee0_0000)),
                "the MSI window is reserved: {:?}",
                info.iova_ranges
            );
        }
        IommuMode::NoIommu => assert!(c.iommu_info().is_none()),
    }
}

#[test]
#[ignore = "test bed"]
fn guest_hugepage_dma_and_ivshmem_bar_as_dma_target() {
    let mode = mode();
    bind_all(&[NVME_A, IVSHMEM]);
    reserve_hugepages(16);
    let c = Container::open(mode).expect("container");
    // Two devices, one container.
    let nvme = c.device(bdf(NVME_A)).expect("NVMe");
    let shm = c.device(bdf(IVSHMEM)).expect("ivshmem");
    assert_backend(&c);
    match mode {
        IommuMode::Iommufd => assert_eq!(c.bound_devices().len(), 2, "both attached to the one IOAS"),
        _ => assert_eq!(c.groups().len(), 2),
    }
    nvme.enable_bus_master().unwrap();
    let dma = DmaContext::new(c.clone());
    let dma_back = DmaReturnCheck::new(&dma);

    // Hugepage DMA memory: 4 MiB = two 2 MiB pages.
    let mut region = dma
        .alloc_region(4 << 20, PageSize::Huge2M)
        .expect("hugepage region");
    assert_eq!(region.len(), 4 << 20);
    let bus0 = region.bus_addr(0);
    match mode {
        IommuMode::Type1 | IommuMode::Iommufd => {
            assert_eq!(dma.kind(), MapKind::Iommu);
            let iova = region.iova().expect("an IOVA");
            assert_ne!(iova.get(), 0);
            assert_eq!(bus0.get(), iova.get());
            assert_eq!(region.contiguous_len(0), 4 << 20, "one contiguous IOVA range");
        }
        IommuMode::NoIommu => {
            assert_eq!(dma.kind(), MapKind::NoIommu);
            let phys = vfpoll_dma::pagemap::virt_to_phys(region.as_ptr()).expect("pagemap");
            assert_eq!(bus0.get(), phys.get(), "bus address = physical address");
            assert!(bus0.is_aligned(2 << 20), "hugepage-aligned physical address");
            let phys2 = vfpoll_dma::pagemap::virt_to_phys(region.as_ptr().wrapping_add(2 << 20)).unwrap();
            assert_eq!(region.bus_addr(2 << 20).get(), phys2.get());
        }
    }
    region.write(100, b"hello hugepage").unwrap();
    let mut back = [0u8; 14];
    region.read(100, &mut back).unwrap();
    assert_eq!(&back, b"hello hugepage");

    // The ivshmem BAR2 (64 MiB) as a DMA target.
    // SAFETY: ivshmem's BAR2 is shared memory, not registers: writes to it start no DMA.
    let bar2 = unsafe { shm.map_bar(2) }.expect("ivshmem BAR2");
    assert_eq!(bar2.len(), 64 << 20);
    let bar_bus = shm.bar_bus_addr(2).expect("BAR2 bus address");
    let free = dma.iova_total_free();
    // SAFETY: `bar2` is this process's mmap of the BAR and outlives the registration.
    let peer = unsafe { dma.register_peer_bar(bar2.as_ptr(), bar2.len() as u64, bar_bus) };
    let peer = match mode {
        IommuMode::Type1 => {
            let peer = peer.expect("register BAR2");
            let iova = peer.iova().expect("BAR mapped into the IOMMU");
            assert_eq!(peer.bus_addr(0).get(), iova.get());
            assert_ne!(iova.get(), bus0.get());
            Some(peer)
        }
        IommuMode::Iommufd => {
            // The kernel refuses (a BAR's mmap cannot be pinned), and the error says what works.
            let e = peer.expect_err("iommufd in 6.12 cannot map a peer BAR");
            let msg = format!(
                "{e}: {}",
                std::error::Error::source(&e)
                    .map(|s| s.to_string())
                    .unwrap_or_default()
            );
            println!("peer BAR under iommufd: {msg}");
            assert!(
                msg.contains("iommufd cannot map a peer device's BAR")
                    && msg.contains("--iommu-backend type1"),
                "{msg}"
            );
            assert_eq!(dma.iova_total_free(), free, "the refused map leaks no IOVA");
            None
        }
        IommuMode::NoIommu => {
            let peer = peer.expect("register BAR2");
            assert_eq!(peer.bus_addr(0), bar_bus, "no IOMMU: the BAR's own bus address");
            Some(peer)
        }
    };
    // The guest CPU writes a seeded pattern through the BAR mapping; the host check finds it in
    // gpubar.shm.
    let data = Pattern::new(seed(), 1).bytes(SHM_LEN);
    bar2.copy_to(SHM_OFFSET, &data).unwrap();
    let mut check = vec![0u8; SHM_LEN];
    bar2.copy_from(SHM_OFFSET, &mut check).unwrap();
    assert_eq!(check, data);
    write_manifest(
        "foundation.txt",
        &[
            ("mode".into(), mode_name().into()),
            ("shm_offset".into(), SHM_OFFSET.to_string()),
            ("shm_len".into(), SHM_LEN.to_string()),
            (
                "peer_bus".into(),
                peer.as_ref()
                    .map_or("refused".into(), |p| p.bus_addr(0).to_string()),
            ),
        ],
    );
    drop(peer);
    drop(region);
    dma_back.assert_returned();
}

#[test]
#[ignore = "test bed"]
fn host_check_hugepage_dma_and_ivshmem_bar_as_dma_target() {
    let m = read_manifest("foundation.txt");
    assert_eq!(manifest_get(&m, "mode"), run_mode());
    let off: u64 = manifest_get(&m, "shm_offset").parse().unwrap();
    let len: usize = manifest_get(&m, "shm_len").parse().unwrap();
    let got = read_file_range(&run_dir().join("gpubar.shm"), off, len);
    let want = Pattern::new(seed(), 1).bytes(len);
    assert!(
        got == want,
        "gpubar.shm at {off:#x} does not hold what the guest wrote through the BAR"
    );
    // Nothing else was written: the bytes around it are still zero.
    assert!(read_file_range(&run_dir().join("gpubar.shm"), off - 4096, 4096)
        .iter()
        .all(|&b| b == 0));
}

#[test]
#[ignore = "test bed"]
fn guest_bind_refuses_devices_the_kernel_uses_and_gives_them_back() {
    let host = Host::default();
    let opts = BindOptions::default();

    // A NIC whose interface is up.
    let nic = bdf(NIC_0);
    assert_eq!(
        sysfs::device(&host, nic).unwrap().driver.as_deref(),
        Some("e1000e")
    );
    let ifname = netdev(NIC_0);
    run("ip", &["link", "set", &ifname, "up"]);
    let e = bind::bind_vfio(&host, nic, &opts).unwrap_err().to_string();
    assert!(
        e.contains(&ifname) && e.contains("ip link set") && e.contains("--force"),
        "{e}"
    );
    assert_eq!(
        sysfs::device(&host, nic).unwrap().driver.as_deref(),
        Some("e1000e"),
        "nothing changed"
    );
    run("ip", &["link", "set", &ifname, "down"]);
    let o = bind::bind_vfio(&host, nic, &opts).expect("bind once the interface is down");
    assert_eq!(o.before.as_deref(), Some("e1000e"));
    assert_eq!(o.after.as_deref(), Some("vfio-pci"));
    // Give it back to its original driver.
    let o = bind::unbind_to_kernel(&host, nic, &opts).expect("give back");
    assert_eq!(o.after.as_deref(), Some("e1000e"), "{o}");
    assert_eq!(
        sysfs::device(&host, nic).unwrap().driver.as_deref(),
        Some("e1000e")
    );

    // An NVMe controller with a mounted file system.
    let b = bdf(NVME_B);
    assert_eq!(sysfs::device(&host, b).unwrap().driver.as_deref(), Some("nvme"));
    let ctrl_dir = host.pci_device_dir(b).join("nvme");
    let ctrl = std::fs::read_dir(&ctrl_dir)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .file_name();
    let dev = format!("/dev/{}n1", ctrl.to_string_lossy());
    // minix: the one file system of the guest kernel with no module dependencies.
    run("busybox", &["modprobe", "minix"]);
    run("mkfs.minix", &[&dev]);
    std::fs::create_dir_all("/mnt/vfpoll-b").unwrap();
    run("mount", &["-t", "minix", &dev, "/mnt/vfpoll-b"]);
    let e = bind::bind_vfio(&host, b, &opts).unwrap_err().to_string();
    assert!(e.contains("/mnt/vfpoll-b") && e.contains("umount"), "{e}");
    assert_eq!(
        sysfs::device(&host, b).unwrap().driver.as_deref(),
        Some("nvme"),
        "nothing changed"
    );
    run("umount", &["/mnt/vfpoll-b"]);
    let o = bind::bind_vfio(&host, b, &opts).expect("bind once unmounted");
    assert_eq!(o.after.as_deref(), Some("vfio-pci"));
    let o = bind::unbind_to_kernel(&host, b, &opts).expect("give back");
    assert_eq!(o.after.as_deref(), Some("nvme"), "{o}");
}

#[test]
#[ignore = "test bed"]
fn guest_errors_say_what_to_do() {
    let mode = mode();
    let host = Host::default();
    bind_all(&[NVME_A]);
    // The other mode than the one the machine is in.
    match mode {
        IommuMode::Type1 | IommuMode::Iommufd => {
            let e = Container::open(IommuMode::NoIommu).unwrap_err();
            assert!(matches!(e, VfioError::NoIommuNotEnabled), "{e}");
            assert!(e.to_string().contains("enable_unsafe_noiommu_mode"));
        }
        IommuMode::NoIommu => {
            let e = match Container::open(IommuMode::Type1) {
                Err(e) => e,
                Ok(c) => c.device(bdf(NVME_A)).unwrap_err(),
            };
            assert!(
                e.to_string().contains("--noiommu") || e.to_string().contains("intel_iommu=on"),
                "{e}"
            );
        }
    }
    // A device that is not bound to vfio-pci (NIC 1 is on e1000e).
    let c = Container::open(mode).unwrap();
    let e = c.device(bdf(NIC_1)).unwrap_err();
    assert!(e.to_string().contains("vfpoll bind 0000:00:06.0"), "{e}");
    // An absent device and a malformed address.
    let e = c.device(bdf("0000:00:1e.0")).unwrap_err();
    assert!(e.to_string().contains("vfpoll status"), "{e}");
    let e = "00:3".parse::<vfpoll_pci::Bdf>().unwrap_err();
    assert!(e.to_string().contains("DDDD:BB:DD.F"), "{e}");
    // A group that is not viable: the ICH9 SMBus (1f.3) shares IOMMU group with the SATA
    // controller (1f.2) and the LPC bridge. Give the SATA controller a kernel driver
    // (uio_pci_generic, the one in the guest's initramfs that takes it), then try the SMBus.
    // Only the IOMMU mode has real groups.
    if mode.has_iommu() {
        let sata = host.pci_device_dir(bdf("0000:00:1f.2"));
        run("busybox", &["modprobe", "uio_pci_generic"]);
        std::fs::write(sata.join("driver_override"), "uio_pci_generic").unwrap();
        std::fs::write(host.sys.join("bus/pci/drivers_probe"), "0000:00:1f.2").unwrap();
        assert_eq!(
            sysfs::device(&host, bdf("0000:00:1f.2"))
                .unwrap()
                .driver
                .as_deref(),
            Some("uio_pci_generic")
        );
        let smbus = bdf("0000:00:1f.3");
        let e = bind::bind_vfio(&host, smbus, &BindOptions::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("0000:00:1f.2") && e.contains("uio_pci_generic") && e.contains("vfpoll bind"),
            "{e}"
        );
        assert_ne!(
            sysfs::device(&host, smbus).unwrap().driver.as_deref(),
            Some("vfio-pci"),
            "nothing changed"
        );
        std::fs::write(sata.join("driver/unbind"), "0000:00:1f.2").unwrap();
        std::fs::write(sata.join("driver_override"), "\n").unwrap();
    }
    // No hugepages reserved: the error names the command that fixes it.
    let nr = "/proc/sys/vm/nr_hugepages";
    let before = std::fs::read_to_string(nr).unwrap();
    std::fs::write(nr, "0\n").unwrap();
    let dma = DmaContext::new(c.clone());
    let e = dma
        .alloc_region(8 << 20, PageSize::Huge2M)
        .unwrap_err()
        .to_string();
    std::fs::write(nr, before).unwrap();
    assert!(e.contains("vfpoll setup --hugepages"), "{e}");
    assert!(e.contains('4'), "says how many 2 MiB pages are needed: {e}");
}

#[test]
#[ignore = "test bed"]
fn guest_vfpoll_status_and_doctor_tell_the_truth() {
    let mode = mode();
    bind_all(&[NVME_A]);
    reserve_hugepages(32);
    let out = Command::new("vfpoll")
        .args(["status", "--json"])
        .output()
        .expect("vfpoll on PATH");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json = String::from_utf8(out.stdout).unwrap();
    let host = Host::default();
    for d in [NVME_A, NVME_B, NIC_0, NIC_1] {
        let info = sysfs::device(&host, bdf(d)).unwrap();
        let drv = info.driver.unwrap_or_default();
        assert!(json.contains(d), "{d} missing from {json}");
        assert!(
            json.contains(&format!("\"{drv}\"")),
            "driver {drv} of {d} missing from {json}"
        );
    }
    let human = Command::new("vfpoll").arg("status").output().unwrap();
    let text = String::from_utf8_lossy(&human.stdout);
    println!("{text}");
    assert!(text.contains(NVME_A) && text.contains("vfio-pci"), "{text}");
    if mode == IommuMode::Iommufd {
        // The backend a run would use, and why: auto takes iommufd here.
        assert!(
            text.contains("IOMMU backend of a run (--iommu-backend auto): iommufd (auto: /dev/iommu exists"),
            "{text}"
        );
        assert!(
            json.contains("\"backend\": \"iommufd\"") && json.contains("/dev/vfio/devices/vfio"),
            "{json}"
        );
    }
    let mut flag = vec!["doctor"];
    flag.extend_from_slice(backend_args());
    flag.extend_from_slice(&["--device", NVME_A]);
    let doc = Command::new("vfpoll").args(&flag).output().unwrap();
    let text = String::from_utf8_lossy(&doc.stdout);
    println!("{text}");
    assert!(
        doc.status.success(),
        "doctor found a failure on a ready machine:\n{text}\n{}",
        String::from_utf8_lossy(&doc.stderr)
    );
    let uses = format!("backend: a run uses {}", mode.name());
    assert!(text.contains(&uses), "{uses} missing from:\n{text}");
    if mode == IommuMode::Iommufd {
        assert!(
            text.contains(&format!("OK    {NVME_A} cdev: /dev/vfio/devices/vfio")),
            "{text}"
        );
    }
    // And it fails, with the fix, for a device that is not ready (NIC 1 stays on e1000e).
    let doc = Command::new("vfpoll")
        .args(&flag[..flag.len() - 1])
        .arg(NIC_1)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&doc.stdout);
    println!("{text}");
    assert!(!doc.status.success(), "{text}");
    assert!(
        text.contains("vfpoll bind") || text.contains("vfpoll setup"),
        "{text}"
    );
}
