//! The VFIO layer against the fake kernel and a fake sysfs tree.

use std::fs;
use std::sync::Arc;

use super::fake::{FakeDevice, FakeVfio};
use super::*;
use crate::sysfs::fake::add_device;

struct Bed {
    _dir: tempfile::TempDir,
    host: Host,
    k: Arc<FakeVfio>,
}

const NVME: &str = "0000:00:03.0";
const SHM: &str = "0000:00:07.0";

/// NVMe in group 3 and ivshmem in group 6, both bound to vfio-pci; ICH9 SATA+SMBus share group 9.
fn bed(noiommu: bool) -> Bed {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    add_device(root, NVME, 0x1b36, 0x0010, 0x010802, Some("vfio-pci"), Some(3));
    add_device(root, SHM, 0x1af4, 0x1110, 0x050000, Some("vfio-pci"), Some(6));
    add_device(
        root,
        "0000:00:1f.2",
        0x8086,
        0x2922,
        0x010601,
        Some("vfio-pci"),
        Some(9),
    );
    add_device(
        root,
        "0000:00:1f.3",
        0x8086,
        0x2930,
        0x0c0500,
        Some("i801_smbus"),
        Some(9),
    );
    fs::create_dir_all(root.join("dev/vfio")).unwrap();
    fs::write(root.join("dev/vfio/vfio"), "").unwrap();
    for g in [3, 6, 9] {
        let name = if noiommu {
            format!("noiommu-{g}")
        } else {
            g.to_string()
        };
        fs::write(root.join("dev/vfio").join(name), "").unwrap();
    }
    let k = Arc::new(FakeVfio::default());
    k.with(|st| {
        if noiommu {
            st.models = vec![uapi::NOIOMMU_IOMMU];
        }
        for d in [NVME, SHM, "0000:00:1f.2"] {
            st.devices.insert(d.into(), FakeDevice::simple());
        }
        st.not_viable = vec![9];
    });
    Bed {
        host: Host::under(root),
        _dir: dir,
        k,
    }
}

fn open(b: &Bed, mode: IommuMode) -> Result<Arc<Container>, VfioError> {
    Container::open_with(b.k.clone(), b.host.clone(), mode)
}

#[test]
fn type1_two_devices_share_one_container() {
    let b = bed(false);
    let c = open(&b, IommuMode::Type1).unwrap();
    assert!(
        c.iommu_info().is_none(),
        "IOMMU model is set only when a group attaches"
    );
    let nvme = c.device(NVME.parse().unwrap()).unwrap();
    let shm = c.device(SHM.parse().unwrap()).unwrap();
    assert_eq!(c.groups(), vec![3, 6]);
    assert_eq!(b.k.with(|st| st.iommu_set), Some(uapi::TYPE1V2_IOMMU));
    let info = c.iommu_info().unwrap();
    assert_eq!(
        info.iova_ranges,
        vec![0..=0xfedf_ffff, 0xfef0_0000..=(1 << 39) - 1]
    );
    assert_eq!(info.min_page_size(), 4096);
    assert_eq!(info.dma_avail, Some(65535));
    assert_eq!(nvme.bdf().to_string(), NVME);
    assert_eq!(shm.region(0).unwrap().size, 0x4000);
    // The same group twice is one attachment.
    let again = c.device(NVME.parse().unwrap()).unwrap();
    assert_eq!(again.bdf(), nvme.bdf());
    assert_eq!(b.k.with(|st| st.attached.clone()), vec![3, 6]);
}

#[test]
fn dma_map_and_unmap_reach_the_kernel_and_errors_explain() {
    let b = bed(false);
    let c = open(&b, IommuMode::Type1).unwrap();
    let _d = c.device(NVME.parse().unwrap()).unwrap();
    // SAFETY: the fake kernel never touches the memory; the address is only recorded.
    unsafe { c.map_dma(0x7000_0000_0000 as *mut u8, 0x20_0000, Iova(0x1_0000_0000)) }.unwrap();
    assert_eq!(
        b.k.with(|st| st.mappings.clone()),
        vec![(0x1_0000_0000, 0x20_0000, 0x7000_0000_0000)]
    );
    // SAFETY: as above.
    let e = unsafe { c.map_dma(0x7000_0000_0000 as *mut u8, 0x1000, Iova(0x1_0000_0000)) }.unwrap_err();
    assert!(e.to_string().contains("overlaps"), "{e}");
    b.k.with(|st| st.fail_next_map = Some(libc::ENOMEM));
    // SAFETY: as above.
    let e = unsafe { c.map_dma(0x7100_0000_0000 as *mut u8, 0x1000, Iova(0x2_0000_0000)) }.unwrap_err();
    assert!(e.to_string().contains("ulimit -l"), "{e}");
    c.unmap_dma(Iova(0x1_0000_0000), 0x20_0000).unwrap();
    assert!(b.k.with(|st| st.mappings.is_empty()));
    assert!(c.unmap_dma(Iova(0x1_0000_0000), 0x20_0000).is_err());
}

#[test]
fn noiommu_only_when_asked_and_enabled() {
    // Enabled: model 8 is set, DMA mapping is refused with an explanation.
    let b = bed(true);
    let c = open(&b, IommuMode::NoIommu).unwrap();
    let _d = c.device(NVME.parse().unwrap()).unwrap();
    assert_eq!(b.k.with(|st| st.iommu_set), Some(uapi::NOIOMMU_IOMMU));
    assert!(c.iommu_info().is_none());
    // SAFETY: refused before the kernel is called.
    let e = unsafe { c.map_dma(0x1000 as *mut u8, 0x1000, Iova(0x1000)) }.unwrap_err();
    assert!(matches!(e, VfioError::NotInNoIommu));
    // Type1 requested on a no-IOMMU machine: refused, never downgraded.
    let b = bed(true);
    b.k.with(|st| st.models = vec![uapi::TYPE1V2_IOMMU, uapi::NOIOMMU_IOMMU]);
    let c = open(&b, IommuMode::Type1).unwrap();
    let e = c.device(NVME.parse().unwrap()).unwrap_err();
    assert!(e.to_string().contains("pass --noiommu"), "{e}");
    // No-IOMMU requested but not enabled in the kernel.
    let b = bed(false);
    let e = open(&b, IommuMode::NoIommu).unwrap_err();
    assert!(e.to_string().contains("enable_unsafe_noiommu_mode"), "{e}");
    // No-IOMMU requested on a machine with an IOMMU.
    let b = bed(false);
    b.k.with(|st| st.models.push(uapi::NOIOMMU_IOMMU));
    let c = open(&b, IommuMode::NoIommu).unwrap();
    let e = c.device(NVME.parse().unwrap()).unwrap_err();
    assert!(e.to_string().contains("drop --noiommu"), "{e}");
}

#[test]
fn setup_errors_say_what_to_do() {
    let b = bed(false);
    fs::remove_file(b.host.dev.join("vfio/vfio")).unwrap();
    let e = open(&b, IommuMode::Type1).unwrap_err();
    assert!(e.to_string().contains("modprobe vfio-pci"), "{e}");

    let b = bed(false);
    b.k.with(|st| st.models.clear());
    let e = open(&b, IommuMode::Type1).unwrap_err();
    assert!(e.to_string().contains("intel_iommu=on"), "{e}");

    let b = bed(false);
    let c = open(&b, IommuMode::Type1).unwrap();
    let e = c.device("0000:00:1f.2".parse().unwrap()).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("not viable") && msg.contains("0000:00:1f.3 (i801_smbus)"),
        "{msg}"
    );
    assert!(
        !msg.contains("0000:00:1f.2 ("),
        "the device itself is not listed: {msg}"
    );

    fs::remove_file(b.host.dev.join("vfio/6")).unwrap();
    let e = c.device(SHM.parse().unwrap()).unwrap_err();
    assert!(e.to_string().contains("vfpoll bind 0000:00:07.0"), "{e}");

    b.k.with(|st| st.busy.push(3));
    let e = c.device(NVME.parse().unwrap()).unwrap_err();
    assert!(matches!(e, VfioError::GroupBusy { group: 3, .. }), "{e}");
    assert!(e.to_string().contains("in use by another process"), "{e}");
    // The holder is named when /proc shows it: a QEMU with the group open, and an unrelated
    // process with other files open.
    let qemu = b.host.proc.join("4242");
    fs::create_dir_all(qemu.join("fd")).unwrap();
    std::os::unix::fs::symlink(b.host.dev.join("vfio/3"), qemu.join("fd/17")).unwrap();
    fs::write(qemu.join("comm"), "qemu-system-x86\n").unwrap();
    let other = b.host.proc.join("77");
    fs::create_dir_all(other.join("fd")).unwrap();
    std::os::unix::fs::symlink(b.host.dev.join("vfio/30"), other.join("fd/3")).unwrap();
    let e = c.device(NVME.parse().unwrap()).unwrap_err();
    assert!(
        e.to_string()
            .contains("IOMMU group 3 (0000:00:03.0) is in use by PID 4242 (qemu-system-x86): stop it first"),
        "{e}"
    );

    let e = c.device("0000:00:09.0".parse().unwrap()).unwrap_err();
    assert!(e.to_string().contains("no PCI device 0000:00:09.0"), "{e}");
}

#[test]
fn bars_map_and_access_the_device_memory() {
    let b = bed(false);
    b.k.with(|st| {
        let d = st.devices.get_mut(SHM).unwrap();
        // BAR2: 1 MiB, mmappable only in its upper half (sparse), like a BAR holding an MSI-X table.
        d.regions[2] = (
            0x10_0000,
            uapi::REGION_FLAG_READ | uapi::REGION_FLAG_WRITE | uapi::REGION_FLAG_MMAP,
            Some(vec![(0x8_0000, 0x8_0000)]),
        );
    });
    let c = open(&b, IommuMode::Type1).unwrap();
    let d = c.device(SHM.parse().unwrap()).unwrap();
    // SAFETY: a fake device: its BAR is plain memory and starts no DMA.
    let bar0 = unsafe { d.map_bar(0) }.unwrap();
    assert_eq!(bar0.len(), 0x4000);
    bar0.write32(0x1c, 0x1234_5678);
    let backing = b.k.with(|st| st.devices[SHM].bars[&0].clone());
    assert_eq!(
        backing.read32(0x1c),
        0x1234_5678,
        "the write reached the device's memory"
    );
    let r2 = d.region(2).unwrap();
    assert_eq!(r2.sparse, Some(vec![(0x8_0000, 0x8_0000)]));
    assert!(!r2.mappable());
    // SAFETY: a fake device, and each call fails before mapping anything.
    let err = |bar| unsafe { d.map_bar(bar) }.unwrap_err().to_string();
    assert!(err(2).contains("cannot be mmapped"));
    assert!(err(1).contains("does not exist"));
    assert!(err(7).contains("not a BAR"));
}

#[test]
fn bus_master_and_reset() {
    let b = bed(false);
    b.k.with(|st| st.devices.get_mut(NVME).unwrap().can_reset = true);
    let c = open(&b, IommuMode::Type1).unwrap();
    let d = c.device(NVME.parse().unwrap()).unwrap();
    let cmd = d.enable_bus_master().unwrap();
    assert_eq!(
        cmd,
        pci_cfg::COMMAND_MEMORY | pci_cfg::COMMAND_MASTER | pci_cfg::COMMAND_INTX_DISABLE
    );
    assert_eq!(d.config_read_u16(pci_cfg::COMMAND).unwrap(), cmd);
    d.disable_bus_master().unwrap();
    assert_eq!(
        d.config_read_u16(pci_cfg::COMMAND).unwrap() & pci_cfg::COMMAND_MASTER,
        0
    );
    assert!(d.can_reset());
    assert!(d.reset().unwrap());
    assert_eq!(b.k.with(|st| st.devices[NVME].resets), 1);

    let shm = c.device(SHM.parse().unwrap()).unwrap();
    assert!(!shm.reset().unwrap(), "no reset offered: reported, nothing done");
    b.k.with(|st| st.devices.get_mut(SHM).unwrap().command_stuck_zero = pci_cfg::COMMAND_MASTER);
    let e = shm.enable_bus_master().unwrap_err();
    assert!(e.to_string().contains("bus mastering"), "{e}");
}

#[test]
fn iommu_info_parses_and_falls_back() {
    let f = IommuInfo::fallback();
    assert!(
        !f.iova_ranges.iter().any(|r| r.contains(&0xfee0_0000)),
        "MSI window excluded"
    );
    let mut buf = vec![0u8; uapi::IOMMU_INFO_SIZE];
    uapi::put_u32(&mut buf, 4, uapi::IOMMU_INFO_PGSIZES);
    uapi::put_u64(&mut buf, 8, 0x20_0000 | 0x4000_0000);
    let i = IommuInfo::parse(&buf);
    assert_eq!(i.min_page_size(), 0x20_0000);
    assert_eq!(i.iova_ranges, f.iova_ranges, "no capability: the fallback ranges");
}

#[test]
fn msix_enable_rebind_and_disable_reach_the_kernel() {
    use std::os::fd::AsRawFd;
    let b = bed(false);
    let c = open(&b, IommuMode::Type1).unwrap();
    let d = c.device(NVME.parse().unwrap()).unwrap();
    let info = d.irq_info(IrqIndex::MSIX).unwrap();
    assert_eq!((info.count, info.eventfd(), info.automasked()), (16, true, false));
    assert!(d.irq_info(IrqIndex::INTX).unwrap().automasked());

    let e = d.enable_msix(17).unwrap_err().to_string();
    assert!(e.contains("has 16 MSI-X vector(s)"), "{e}");
    assert!(
        b.k.with(|st| st.devices[NVME].irq_sets.is_empty()),
        "refused before any ioctl"
    );

    let mut irqs = d.enable_msix(4).unwrap();
    assert_eq!((irqs.len(), irqs.index()), (4, IrqIndex::MSIX));
    let fds: Vec<i32> = (0..4).map(|v| irqs.eventfd(v).unwrap().as_raw_fd()).collect();
    let sets = b.k.with(|st| st.devices[NVME].irq_sets.clone());
    assert_eq!(
        sets,
        vec![irq::IrqSet {
            flags: uapi::IRQ_SET_DATA_EVENTFD | uapi::IRQ_SET_ACTION_TRIGGER,
            index: IrqIndex::MSIX,
            start: 0,
            count: 4,
            fds: fds.clone(),
        }]
    );
    // Only one of INTx/MSI/MSI-X at a time.
    assert!(d.enable_irqs(IrqIndex::MSI, 1).is_err());
    // The device-request index is independent (hot removal, issue 12).
    let req = d.enable_irqs(IrqIndex::REQ, 1).unwrap();

    irqs.set_trigger(2, None).unwrap();
    let other = EventFd::new().unwrap();
    irqs.set_trigger(3, Some(&other)).unwrap();
    let bound = b.k.with(|st| st.devices[NVME].irq_enabled.clone()).unwrap();
    assert_eq!(bound.1, vec![fds[0], fds[1], -1, other.as_raw_fd()]);
    let e = irqs.set_trigger(4, None).unwrap_err().to_string();
    assert!(e.contains("only vectors 0..4 are enabled"), "{e}");
    assert!(irqs.unmask(0).is_err(), "unmask is for INTx only");

    irqs.disable().unwrap();
    assert!(b.k.with(|st| st.devices[NVME].irq_enabled.is_none()));
    assert!(irqs.set_trigger(0, None).is_err(), "nothing enabled any more");
    drop(irqs);
    drop(req);
    let last = b.k.with(|st| st.devices[NVME].irq_sets.clone());
    let disables: Vec<_> = last
        .iter()
        .filter(|s| s.flags == uapi::IRQ_SET_DATA_NONE | uapi::IRQ_SET_ACTION_TRIGGER && s.count == 0)
        .map(|s| s.index)
        .collect();
    assert_eq!(
        disables,
        vec![IrqIndex::MSIX, IrqIndex::REQ],
        "disabled once each, dropped or not"
    );

    // Dropping enabled vectors disables them; then INTx (auto-masked) can be enabled and unmasked.
    drop(d.enable_msix(1).unwrap());
    let intx = d.enable_irqs(IrqIndex::INTX, 1).unwrap();
    intx.unmask(0).unwrap();
    let s = b.k.with(|st| st.devices[NVME].irq_sets.last().cloned()).unwrap();
    assert_eq!(
        (s.flags, s.index, s.start, s.count),
        (
            uapi::IRQ_SET_DATA_NONE | uapi::IRQ_SET_ACTION_UNMASK,
            IrqIndex::INTX,
            0,
            1
        )
    );
}

#[test]
fn a_device_without_msix_says_so() {
    let b = bed(false);
    b.k.with(|st| st.devices.get_mut(SHM).unwrap().irq_counts[2] = 0);
    let c = open(&b, IommuMode::Type1).unwrap();
    let d = c.device(SHM.parse().unwrap()).unwrap();
    assert_eq!(d.irq_info(IrqIndex::MSIX).unwrap().count, 0);
    let e = d.enable_msix(1).unwrap_err().to_string();
    assert!(e.contains("has 0 MSI-X vector(s)"), "{e}");
    assert_eq!(
        d.irq_info(IrqIndex(7)).unwrap().count,
        0,
        "beyond num_irqs: absent"
    );
}

#[test]
fn eventfd_counts_wakes_and_clears() {
    use std::time::{Duration, Instant};
    let e = EventFd::new().unwrap();
    assert_eq!(e.take().unwrap(), 0, "non-blocking: nothing yet");
    let t = Instant::now();
    assert!(!e.wait(Some(Duration::from_millis(20))).unwrap());
    assert!(t.elapsed() >= Duration::from_millis(19), "slept for the timeout");
    let other = e.try_clone().unwrap();
    let h = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        other.signal().unwrap();
        other.signal().unwrap();
    });
    assert!(e.wait(Some(Duration::from_secs(10))).unwrap());
    h.join().unwrap();
    assert!(
        e.wait(Some(Duration::ZERO)).unwrap(),
        "waiting does not take the counter"
    );
    assert_eq!(e.take().unwrap(), 2);
    assert!(!e.wait(Some(Duration::ZERO)).unwrap(), "taken: cleared");
}

#[test]
fn a_removal_request_reaches_the_watch_and_release_lets_the_device_go() {
    use std::ops::ControlFlow;
    use std::sync::mpsc;
    use std::time::Duration;
    let b = bed(false);
    let c = open(&b, IommuMode::Type1).unwrap();
    let nvme = Arc::new(c.device(NVME.parse().unwrap()).unwrap());
    let _shm = c.device(SHM.parse().unwrap()).unwrap();
    // SAFETY: a fake device: its BAR is plain memory and starts no DMA.
    let bar = unsafe { nvme.map_bar(0) }.unwrap();
    let doorbells = bar.window(0x1000, 0x100).unwrap();
    bar.write32(0x1c, 1);

    let (tx, rx) = mpsc::channel();
    let dev = Arc::clone(&nvme);
    let watch = nvme
        .watch(move |ev| {
            let _ = tx.send(ev);
            match ev {
                DeviceEvent::Request { .. } => {
                    let _ = tx.send(DeviceEvent::Request {
                        count: dev.release().unwrap() as u64,
                    });
                    ControlFlow::Break(())
                }
                DeviceEvent::Error { .. } => ControlFlow::Continue(()),
            }
        })
        .unwrap();
    assert!(watch.watches_errors(), "the fake device offers the error index");
    let bound = b.k.with(|st| st.devices[NVME].irq_triggers.clone());
    assert_eq!(
        bound.keys().copied().collect::<std::collections::BTreeSet<_>>(),
        [3, 4].into()
    );

    // An AER error is reported, and the watch goes on.
    b.k.raise(NVME, IrqIndex::ERR).unwrap();
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(10)).unwrap(),
        DeviceEvent::Error { count: 1 }
    );
    assert!(!nvme.released());

    // The removal request: the handler releases the device.
    b.k.raise(NVME, IrqIndex::REQ).unwrap();
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(10)).unwrap(),
        DeviceEvent::Request { count: 1 }
    );
    // The handler's release revoked one mapping (the BAR; the window shares it).
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(10)).unwrap(),
        DeviceEvent::Request { count: 1 }
    );
    let t = std::time::Instant::now();
    while !watch.finished() {
        assert!(t.elapsed() < Duration::from_secs(10), "the watch did not stop");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(nvme.released());
    // Users of the mapping go on without crashing: registers read as a vanished device's.
    assert_eq!(bar.read32(0x1c), u32::MAX);
    doorbells.write32(0, 9);
    assert!(bar.gone());
    // Every call now says what happened.
    let e = nvme.config_read_u16(pci_cfg::COMMAND).unwrap_err();
    assert!(matches!(e, VfioError::Released { .. }), "{e}");
    assert!(e.to_string().contains("was released"), "{e}");
    // SAFETY: the call fails (the device was released) and maps nothing.
    let remap = unsafe { nvme.map_bar(0) };
    assert!(matches!(remap, Err(VfioError::Released { .. })));
    assert!(nvme.enable_irqs(IrqIndex::REQ, 1).is_err());
    // Bus Master was cleared before the file was closed (no more DMA), and the group was
    // retired (still attached, no longer found by number).
    let cmd =
        b.k.with(|st| u16::from_le_bytes([st.devices[NVME].config[4], st.devices[NVME].config[5]]));
    assert_eq!(cmd & pci_cfg::COMMAND_MASTER, 0);
    assert_eq!(c.groups(), vec![6]);
    assert_eq!(nvme.release().unwrap(), 0, "idempotent");
    drop(watch);

    // The device is back (the same BDF): it opens again.
    let again = c.device(NVME.parse().unwrap()).unwrap();
    assert!(!again.released());
    assert_eq!(c.groups(), vec![3, 6]);
    again.enable_bus_master().unwrap();
}

#[test]
fn a_retired_group_keeps_the_iommu_and_a_dropped_watch_stops() {
    let b = bed(false);
    b.k.with(|st| st.devices.get_mut(NVME).unwrap().irq_counts[3] = 0);
    let c = open(&b, IommuMode::Type1).unwrap();
    let d = c.device(NVME.parse().unwrap()).unwrap();
    let w = d.watch(|_| std::ops::ControlFlow::Continue(())).unwrap();
    assert!(!w.watches_errors(), "no error index on this device");
    assert_eq!(
        b.k.with(|st| st.devices[NVME].irq_triggers.keys().copied().collect::<Vec<_>>()),
        vec![4]
    );
    drop(w);
    assert!(
        b.k.with(|st| st.devices[NVME].irq_triggers.is_empty()),
        "dropping the watch disables the request interrupt"
    );
    d.release().unwrap();
    assert!(c.groups().is_empty(), "retired");
    assert_eq!(
        b.k.with(|st| st.iommu_set),
        Some(uapi::TYPE1V2_IOMMU),
        "the retired group keeps the container's IOMMU"
    );
    // No request index at all: watching is refused with the reason.
    b.k.with(|st| st.devices.get_mut(SHM).unwrap().irq_counts[4] = 0);
    let shm = c.device(SHM.parse().unwrap()).unwrap();
    let e = shm.watch(|_| std::ops::ControlFlow::Continue(())).unwrap_err();
    assert!(e.to_string().contains("no device-request interrupt"), "{e}");
}

/// The bed of [`bed`] with iommufd: `/dev/iommu`, and cdevs vfio0 (NVMe) and vfio1 (ivshmem).
fn bed_iommufd() -> Bed {
    let b = bed(false);
    let root = b.host.dev.parent().unwrap().to_path_buf();
    fs::write(b.host.dev.join("iommu"), "").unwrap();
    crate::sysfs::fake::add_vfio_cdev(&root, NVME, 0);
    crate::sysfs::fake::add_vfio_cdev(&root, SHM, 1);
    b.k.with(|st| {
        st.cdevs.insert("vfio0".into(), NVME.into());
        st.cdevs.insert("vfio1".into(), SHM.into());
    });
    b
}

#[test]
fn iommufd_two_devices_share_one_ioas_and_map_through_it() {
    let b = bed_iommufd();
    let c = open(&b, IommuMode::Iommufd).unwrap();
    assert_eq!(c.mode(), IommuMode::Iommufd);
    let ioas = c.ioas_id().expect("an IOAS");
    assert_eq!(b.k.with(|st| st.ioases.clone()), vec![ioas]);
    assert!(
        c.iommu_info().is_none(),
        "ranges are read once a device is attached"
    );
    let nvme = c.device(NVME.parse().unwrap()).unwrap();
    let shm = c.device(SHM.parse().unwrap()).unwrap();
    assert_eq!(nvme.group_id(), None, "opened through the cdev, not the group");
    // Both bound and attached to the one IOAS; no group, no container, no type1 model.
    let bound = b.k.with(|st| {
        let mut v: Vec<_> = st.bound.iter().map(|(d, x)| (d.clone(), x.ioas)).collect();
        v.sort();
        v
    });
    assert_eq!(
        bound,
        vec![(NVME.to_string(), Some(ioas)), (SHM.to_string(), Some(ioas))]
    );
    assert!(b.k.with(|st| st.attached.is_empty() && st.iommu_set.is_none()));
    assert!(c.groups().is_empty());
    assert_eq!(c.bound_devices().len(), 2);
    let info = c.iommu_info().unwrap();
    assert_eq!(
        info.iova_ranges,
        vec![0..=0xfedf_ffff, 0xfef0_0000..=(1 << 39) - 1]
    );
    assert_eq!(info.min_page_size(), 4096);
    assert_eq!(info.dma_avail, None);
    // One mapping serves both devices: it is the IOAS's.
    // SAFETY: the fake kernel never touches the memory; the address is only recorded.
    unsafe { c.map_dma(0x7000_0000_0000 as *mut u8, 0x20_0000, Iova(0x1_0000_0000)) }.unwrap();
    assert_eq!(
        b.k.with(|st| st.mappings.clone()),
        vec![(0x1_0000_0000, 0x20_0000, 0x7000_0000_0000)]
    );
    // SAFETY: as above.
    let e = unsafe { c.map_dma(0x7000_0000_0000 as *mut u8, 0x1000, Iova(0x1_0000_0000)) }.unwrap_err();
    assert!(
        e.to_string().contains("IOMMU_IOAS_MAP") && e.to_string().contains("overlaps"),
        "{e}"
    );
    b.k.with(|st| st.fail_next_map = Some(libc::ENOMEM));
    // SAFETY: as above.
    let e = unsafe { c.map_dma(0x7100_0000_0000 as *mut u8, 0x1000, Iova(0x2_0000_0000)) }.unwrap_err();
    assert!(e.to_string().contains("ulimit -l"), "{e}");
    // SAFETY: as above; the MSI window is outside the IOAS's ranges.
    assert!(unsafe { c.map_dma(0x7100_0000_0000 as *mut u8, 0x1000, Iova(0xfee0_0000)) }.is_err());
    c.unmap_dma(Iova(0x1_0000_0000), 0x20_0000).unwrap();
    assert!(b.k.with(|st| st.mappings.is_empty()));
    assert!(c.unmap_dma(Iova(0x1_0000_0000), 0x20_0000).is_err());
    // The VFIO device API is the same as through a group.
    shm.enable_bus_master().unwrap();
    assert_eq!(nvme.region(0).unwrap().size, 0x4000);
    // SAFETY: a fake device: its BAR is plain memory and starts no DMA.
    let bar = unsafe { shm.map_bar(0) }.unwrap();
    bar.write32(8, 7);
    assert_eq!(bar.read32(8), 7);
    let irqs = nvme.enable_msix(2).unwrap();
    assert_eq!(irqs.len(), 2);
}

#[test]
fn iommufd_refuses_a_peer_bar_and_says_what_works() {
    for mode in [IommuMode::Iommufd, IommuMode::Type1] {
        let b = bed_iommufd();
        let c = open(&b, mode).unwrap();
        let _nvme = c.device(NVME.parse().unwrap()).unwrap();
        let shm = c.device(SHM.parse().unwrap()).unwrap();
        // SAFETY: a fake device: its BAR is plain memory and starts no DMA.
        let bar = unsafe { shm.map_bar(0) }.unwrap();
        // SAFETY: the fake kernel only records the address; `bar` outlives the mapping.
        let r = unsafe { c.map_peer_bar(bar.as_ptr(), bar.len() as u64, Iova(0x4000_0000)) };
        match mode {
            IommuMode::Iommufd => {
                let e = r.unwrap_err();
                assert!(matches!(e, VfioError::PeerBarUnderIommufd { .. }), "{e}");
                let msg = e.to_string();
                assert!(
                    msg.contains("--iommu-backend type1") && msg.contains("PFNMAP"),
                    "{msg}"
                );
                assert!(b.k.with(|st| st.mappings.is_empty()));
            }
            _ => {
                r.unwrap();
                c.unmap_dma(Iova(0x4000_0000), bar.len() as u64).unwrap();
            }
        }
    }
}

#[test]
fn iommufd_opens_a_device_once_and_again_after_release() {
    let b = bed_iommufd();
    let c = open(&b, IommuMode::Iommufd).unwrap();
    let first = c.device(NVME.parse().unwrap()).unwrap();
    // A second open in this process shares the bound file (a cdev binds only once).
    let second = c.device(NVME.parse().unwrap()).unwrap();
    assert_eq!(
        second.config_read_u16(0).unwrap(),
        first.config_read_u16(0).unwrap()
    );
    assert_eq!(
        b.k.with(|st| st.bound[NVME].devid),
        b.k.with(|st| st.bound[NVME].devid)
    );
    // Another process (another iommufd) is refused while the file is open.
    let other = open(&b, IommuMode::Iommufd).unwrap();
    let e = other.device(NVME.parse().unwrap()).unwrap_err();
    assert!(matches!(e, VfioError::DeviceBusy { .. }), "{e}");
    assert!(e.to_string().contains("in use by another process"), "{e}");
    // Released and dropped everywhere: the kernel unbinds it, and it opens again.
    first.release().unwrap();
    assert!(first.config_read_u16(0).is_err());
    assert!(
        b.k.with(|st| st.bound[NVME].open()),
        "the second descriptor still holds it"
    );
    drop(second);
    assert!(!b.k.with(|st| st.bound[NVME].open()));
    assert!(c.bound_devices().is_empty());
    let again = other.device(NVME.parse().unwrap()).unwrap();
    again.enable_bus_master().unwrap();
}

#[test]
fn iommufd_errors_say_what_to_do() {
    // No /dev/iommu.
    let b = bed(false);
    let e = open(&b, IommuMode::Iommufd).unwrap_err();
    assert!(
        e.to_string().contains("modprobe iommufd") && e.to_string().contains("--iommu-backend type1"),
        "{e}"
    );
    // A device bound to vfio-pci but without a cdev (vfio without CONFIG_VFIO_DEVICE_CDEV).
    let b = bed_iommufd();
    let c = open(&b, IommuMode::Iommufd).unwrap();
    let e = c.device("0000:00:1f.2".parse().unwrap()).unwrap_err();
    assert!(matches!(e, VfioError::NoCdev { .. }), "{e}");
    assert!(e.to_string().contains("CONFIG_VFIO_DEVICE_CDEV"), "{e}");
    // A device on another driver.
    let e = c.device("0000:00:1f.3".parse().unwrap()).unwrap_err();
    assert!(e.to_string().contains("vfpoll bind 0000:00:1f.3"), "{e}");
    // A bind the kernel refuses for another reason names the call.
    b.k.with(|st| st.fail_next_bind = Some(libc::EPERM));
    let e = c.device(NVME.parse().unwrap()).unwrap_err();
    assert!(e.to_string().contains("VFIO_DEVICE_BIND_IOMMUFD"), "{e}");
    // A device in a no-IOMMU group: iommufd needs an IOMMU.
    let b = bed(true);
    fs::write(b.host.dev.join("iommu"), "").unwrap();
    let c = open(&b, IommuMode::Iommufd).unwrap();
    let e = c.device(NVME.parse().unwrap()).unwrap_err();
    assert!(e.to_string().contains("--iommu-backend noiommu"), "{e}");
}

#[test]
fn iommufd_reads_many_iova_ranges() {
    let b = bed_iommufd();
    let ranges: Vec<(u64, u64)> = (0..11u64)
        .map(|i| (i << 32, (i << 32) + 0xffff_ffff - 0x10_0000))
        .collect();
    b.k.with(|st| {
        st.iova_ranges = ranges.clone();
        st.iova_alignment = 1;
    });
    let c = open(&b, IommuMode::Iommufd).unwrap();
    let _d = c.device(NVME.parse().unwrap()).unwrap();
    let info = c.iommu_info().unwrap();
    assert_eq!(
        info.iova_ranges,
        ranges.iter().map(|&(s, e)| s..=e).collect::<Vec<_>>(),
        "more ranges than the first try had room for"
    );
    assert_eq!(
        info.min_page_size(),
        4096,
        "an alignment of 1 still means whole pages"
    );
}

#[test]
fn auto_picks_iommufd_only_where_the_kernel_offers_it() {
    let nvme: Bdf = NVME.parse().unwrap();
    let sata: Bdf = "0000:00:1f.2".parse().unwrap();
    // No /dev/iommu: type1, and why.
    let b = bed(false);
    let c = Backend::Auto.choose(&b.host, &[nvme]);
    assert_eq!(c.mode, IommuMode::Type1);
    assert!(c.why.contains("modprobe iommufd"), "{}", c.why);
    // /dev/iommu and a cdev: iommufd.
    let b = bed_iommufd();
    let c = Backend::Auto.choose(&b.host, &[nvme]);
    assert_eq!(c.mode, IommuMode::Iommufd, "{}", c.why);
    assert!(c.why.contains("0000:00:03.0 is vfio0"), "{}", c.why);
    assert_eq!(Backend::Auto.choose(&b.host, &[]).mode, IommuMode::Iommufd);
    // One device without a cdev: type1 for all, and which device.
    let c = Backend::Auto.choose(&b.host, &[nvme, sata]);
    assert_eq!(c.mode, IommuMode::Type1);
    assert!(
        c.why.contains("0000:00:1f.2 has no VFIO device cdev"),
        "{}",
        c.why
    );
    // A no-IOMMU machine: never no-IOMMU by itself.
    let b = bed(true);
    fs::write(b.host.dev.join("iommu"), "").unwrap();
    let c = Backend::Auto.choose(&b.host, &[nvme]);
    assert_eq!(c.mode, IommuMode::Type1);
    assert!(c.why.contains("no-IOMMU group 3"), "{}", c.why);
    // Explicit requests are taken as they are.
    for (s, m) in [
        ("iommufd", IommuMode::Iommufd),
        ("type1", IommuMode::Type1),
        ("noiommu", IommuMode::NoIommu),
    ] {
        let be: Backend = s.parse().unwrap();
        assert_eq!(be.to_string(), s);
        assert_eq!(be.choose(&b.host, &[nvme]).mode, m);
        assert_eq!(Backend::of(m), be);
        assert_eq!(m.name(), s);
    }
    let e = "vfio".parse::<Backend>().unwrap_err();
    assert!(e.contains("auto, iommufd, type1, noiommu"), "{e}");
}
