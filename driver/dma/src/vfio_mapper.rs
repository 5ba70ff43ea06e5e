//! [`DmaMapper`] for a VFIO container: type1 `VFIO_IOMMU_MAP_DMA` / `UNMAP_DMA`, iommufd
//! `IOMMU_IOAS_MAP` / `UNMAP` (the container's IOAS), or no-IOMMU mode, where nothing is mapped
//! and devices use physical addresses.

use std::ops::RangeInclusive;

use vfpoll_pci::vfio::{Container, IommuInfo, IommuMode, VfioError};
use vfpoll_pci::Iova;

use crate::error::DmaError;
use crate::mapper::{DmaMapper, MapKind};

impl DmaMapper for Container {
    fn kind(&self) -> MapKind {
        match self.mode() {
            IommuMode::Type1 | IommuMode::Iommufd => MapKind::Iommu,
            IommuMode::NoIommu => MapKind::NoIommu,
        }
    }

    /// The container's IOVA ranges once a device has been opened through it (the IOMMU model is
    /// chosen then); before that, the conservative fallback of [`IommuInfo::fallback`].
    fn iova_ranges(&self) -> Vec<RangeInclusive<u64>> {
        self.iommu_info().unwrap_or_else(IommuInfo::fallback).iova_ranges
    }

    fn min_page_size(&self) -> u64 {
        self.iommu_info().map_or(4096, |i| i.min_page_size())
    }

    unsafe fn map(&self, vaddr: *mut u8, len: u64, iova: Iova) -> Result<(), DmaError> {
        // SAFETY: the caller upholds `DmaMapper::map`'s contract, which is `map_dma`'s.
        unsafe { self.map_dma(vaddr, len, iova) }.map_err(|e| DmaError::Map {
            iova,
            len,
            source: Box::new(e),
        })
    }

    /// Through [`Container::map_peer_bar`]: under iommufd the kernel's refusal comes back as
    /// `VfioError::PeerBarUnderIommufd`, which names the backend that can map a BAR.
    unsafe fn map_peer(&self, vaddr: *mut u8, len: u64, iova: Iova) -> Result<(), DmaError> {
        // SAFETY: the caller upholds `DmaMapper::map_peer`'s contract, which is `map_peer_bar`'s.
        unsafe { self.map_peer_bar(vaddr, len, iova) }.map_err(|e| match e {
            e @ VfioError::PeerBarUnderIommufd { .. } => DmaError::PeerMap {
                iova,
                len,
                source: Box::new(e),
            },
            e => DmaError::Map {
                iova,
                len,
                source: Box::new(e),
            },
        })
    }

    fn unmap(&self, iova: Iova, len: u64) -> Result<(), DmaError> {
        self.unmap_dma(iova, len).map_err(|e| DmaError::Unmap {
            iova,
            len,
            source: Box::new(e),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::sync::Arc;

    use vfpoll_pci::vfio::fake::{FakeDevice, FakeVfio};
    use vfpoll_pci::vfio::{Container, IommuMode};
    use vfpoll_pci::Host;

    use crate::{DmaContext, DmaError, MapKind, PageSize};

    /// A fake sysfs + /dev/vfio with one NVMe in group 3, bound to vfio-pci.
    fn bed() -> (tempfile::TempDir, Host, Arc<FakeVfio>) {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        let d = r.join("sys/devices/pci0000:00/0000:00:03.0");
        fs::create_dir_all(&d).unwrap();
        for (f, v) in [("vendor", "0x1b36"), ("device", "0x0010"), ("class", "0x010802")] {
            fs::write(d.join(f), v).unwrap();
        }
        fs::create_dir_all(r.join("sys/bus/pci/devices")).unwrap();
        std::os::unix::fs::symlink(&d, r.join("sys/bus/pci/devices/0000:00:03.0")).unwrap();
        let g = r.join("sys/kernel/iommu_groups/3");
        fs::create_dir_all(g.join("devices")).unwrap();
        std::os::unix::fs::symlink(&g, d.join("iommu_group")).unwrap();
        fs::create_dir_all(r.join("dev/vfio")).unwrap();
        fs::write(r.join("dev/vfio/vfio"), "").unwrap();
        fs::write(r.join("dev/vfio/3"), "").unwrap();
        let k = Arc::new(FakeVfio::default());
        k.with(|st| {
            st.devices.insert("0000:00:03.0".into(), FakeDevice::simple());
            // A narrow IOVA window makes the allocator's use of it visible.
            st.iova_ranges = vec![(0x10_0000, 0x1000_0000 - 1)];
        });
        let host = Host::under(r);
        (dir, host, k)
    }

    /// A region of `ctx` is mapped at an IOVA of the fake's window (the container's window
    /// under type1, the IOAS's ranges under iommufd), and unmapped when dropped.
    fn maps_in_the_window_and_unmaps_on_drop(k: &FakeVfio, ctx: &DmaContext) {
        assert_eq!(ctx.kind(), MapKind::Iommu);
        let r = ctx.alloc_region(3 * 4096, PageSize::Base4K).unwrap();
        let iova = r.iova().unwrap().get();
        assert!(
            (0x10_0000..0x1000_0000).contains(&iova),
            "{iova:#x} from the window"
        );
        assert_eq!(
            k.with(|st| st.mappings.clone()),
            vec![(iova, 3 * 4096, r.as_ptr() as u64)]
        );
        drop(r);
        assert!(k.with(|st| st.mappings.is_empty()), "unmapped on drop");
    }

    #[test]
    fn regions_map_through_the_container_and_unmap_on_drop() {
        let (_dir, host, k) = bed();
        let c = Container::open_with(k.clone(), host, IommuMode::Type1).unwrap();
        let _dev = c.device("0000:00:03.0".parse().unwrap()).unwrap();
        let ctx = DmaContext::new(c.clone());
        maps_in_the_window_and_unmaps_on_drop(&k, &ctx);
        // A refused map surfaces as a DMA error naming the cause, and leaks no IOVA.
        let free = ctx.iova_total_free();
        k.with(|st| st.fail_next_map = Some(libc::ENOMEM));
        let e = ctx.alloc_region(4096, PageSize::Base4K).unwrap_err();
        assert!(e.to_string().contains("ulimit -l"), "{e}");
        assert_eq!(ctx.iova_total_free(), free);
    }

    /// [`bed`] with iommufd: the NVMe bound to vfio-pci with cdev vfio0, and `/dev/iommu`.
    fn bed_iommufd() -> (tempfile::TempDir, Host, Arc<FakeVfio>) {
        let (dir, host, k) = bed();
        let r = dir.path();
        let d = r.join("sys/devices/pci0000:00/0000:00:03.0");
        fs::create_dir_all(r.join("sys/bus/pci/drivers/vfio-pci")).unwrap();
        std::os::unix::fs::symlink(r.join("sys/bus/pci/drivers/vfio-pci"), d.join("driver")).unwrap();
        fs::create_dir_all(d.join("vfio-dev/vfio0")).unwrap();
        fs::create_dir_all(r.join("dev/vfio/devices")).unwrap();
        fs::write(r.join("dev/vfio/devices/vfio0"), "").unwrap();
        fs::write(r.join("dev/iommu"), "").unwrap();
        k.with(|st| {
            st.cdevs.insert("vfio0".into(), "0000:00:03.0".into());
        });
        (dir, host, k)
    }

    #[test]
    fn iommufd_regions_map_through_the_ioas_and_a_peer_bar_is_refused_with_the_way_out() {
        let (_dir, host, k) = bed_iommufd();
        let c = Container::open_with(k.clone(), host, IommuMode::Iommufd).unwrap();
        let dev = c.device("0000:00:03.0".parse().unwrap()).unwrap();
        let ctx = DmaContext::new(c.clone());
        maps_in_the_window_and_unmaps_on_drop(&k, &ctx);
        // A BAR's mmap: iommufd cannot pin it; the error says so and names type1.
        // SAFETY: a fake device: its BAR is plain memory and starts no DMA.
        let bar = unsafe { dev.map_bar(0) }.unwrap();
        let free = ctx.iova_total_free();
        // SAFETY: `bar` outlives the (failed) registration; the fake kernel touches nothing.
        let e = unsafe {
            ctx.register_peer_bar(bar.as_ptr(), bar.len() as u64, vfpoll_pci::BusAddr(0xfe00_0000))
        }
        .unwrap_err();
        assert!(matches!(e, DmaError::PeerMap { .. }), "{e}");
        let msg = anyhow_like(&e);
        assert!(
            msg.contains("iommufd cannot map a peer device's BAR") && msg.contains("--iommu-backend type1"),
            "{msg}"
        );
        assert_eq!(ctx.iova_total_free(), free, "no IOVA leaked");
    }

    /// The error and its sources, as `anyhow`'s `{:#}` prints them.
    fn anyhow_like(e: &dyn std::error::Error) -> String {
        let mut s = e.to_string();
        let mut cur = e.source();
        while let Some(c) = cur {
            s.push_str(": ");
            s.push_str(&c.to_string());
            cur = c.source();
        }
        s
    }
}
