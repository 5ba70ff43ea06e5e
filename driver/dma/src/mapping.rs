//! How an offset in a piece of DMA-visible memory becomes a bus address, and the IOMMU mapping
//! guard that owns an IOVA range.

use std::sync::Arc;

use crate::error::DmaError;
use crate::mapper::MapKind;
use crate::pagemap::Pagemap;
use crate::Shared;
use vfpoll_pci::{BusAddr, Iova, PhysAddr};

/// An IOVA range allocated from the context's allocator and mapped through its mapper.
/// Dropping it unmaps and gives the range back.
///
/// Each mapping reserves one IOMMU page more IOVA than it maps: an unmapped guard page right
/// after its end. A device that runs past the end of a buffer (a data pointer describing more
/// bytes than the buffer has, a ring index one too far) then takes an IOMMU fault, which the
/// vIOMMU logs and the test bed fails on, instead of silently reading or writing whatever
/// mapping the first-fit allocator placed next. It costs IOVA space only (no memory, no page
/// table entry, no IOTLB entry), of which an IOMMU domain has far more than a driver maps, so
/// it is always on rather than a test-only setting: real runs get the same protection. Only
/// when the IOVA windows are too full for the extra page is a range mapped without a guard.
pub(crate) struct IommuMapping {
    shared: Arc<Shared>,
    iova: Iova,
    len: u64,
    /// IOVA bytes taken from the allocator: `len` rounded to pages, plus the guard page if any.
    reserved: u64,
}

impl IommuMapping {
    /// Allocates an IOVA range aligned to `align` and maps `vaddr..vaddr+len` there. On a map
    /// failure the range goes back to the allocator and nothing stays mapped.
    ///
    /// # Safety
    /// The contract of [`crate::DmaMapper::map`] for `vaddr..vaddr+len`, until the returned
    /// value is dropped.
    pub(crate) unsafe fn new(
        shared: &Arc<Shared>,
        vaddr: *mut u8,
        len: u64,
        align: u64,
    ) -> Result<Self, DmaError> {
        // SAFETY: forwarded.
        unsafe { Self::new_of(shared, vaddr, len, align, false) }
    }

    /// Like [`IommuMapping::new`], for the mmap of a peer device's BAR ([`crate::DmaMapper::map_peer`]).
    ///
    /// # Safety
    /// As for [`IommuMapping::new`].
    pub(crate) unsafe fn new_peer(
        shared: &Arc<Shared>,
        vaddr: *mut u8,
        len: u64,
        align: u64,
    ) -> Result<Self, DmaError> {
        // SAFETY: forwarded.
        unsafe { Self::new_of(shared, vaddr, len, align, true) }
    }

    /// # Safety
    /// As for [`IommuMapping::new`].
    unsafe fn new_of(
        shared: &Arc<Shared>,
        vaddr: *mut u8,
        len: u64,
        align: u64,
        peer: bool,
    ) -> Result<Self, DmaError> {
        let (iova, reserved) = {
            let mut alloc = shared.iova();
            let mapped = alloc.round_len(len)?;
            let guarded = mapped.checked_add(alloc.page_size());
            match guarded.map(|g| (alloc.alloc(g, align), g)) {
                Some((Ok(iova), g)) => (iova, g),
                // No room for the guard page: map without one rather than fail.
                _ => (alloc.alloc(mapped, align)?, mapped),
            }
        };
        // The IOVA range is fresh from the allocator of this mapper, aligned to at least its page
        // size, and so not mapped yet.
        let mapped = if peer {
            // SAFETY: forwarded from our caller; the IOVA range is fresh (above).
            unsafe { shared.mapper.map_peer(vaddr, len, iova) }
        } else {
            // SAFETY: forwarded from our caller; the IOVA range is fresh (above).
            unsafe { shared.mapper.map(vaddr, len, iova) }
        };
        match mapped {
            Ok(()) => Ok(IommuMapping {
                shared: shared.clone(),
                iova,
                len,
                reserved,
            }),
            Err(e) => {
                if let Err(free_err) = shared.iova().free(iova, reserved) {
                    log::error!("returning IOVA after a failed map: {free_err}");
                }
                Err(e)
            }
        }
    }

    pub(crate) fn iova(&self) -> Iova {
        self.iova
    }
}

impl Drop for IommuMapping {
    fn drop(&mut self) {
        match self.shared.mapper.unmap(self.iova, self.len) {
            Ok(()) => {
                if let Err(e) = self.shared.iova().free(self.iova, self.reserved) {
                    log::error!("{e}");
                }
            }
            // The device may still reach the range: never hand it out again.
            Err(e) => log::error!("{e}; leaking IOVA {}+{:#x}", self.iova, self.len),
        }
    }
}

/// Offset → bus address for one piece of memory.
pub(crate) enum BusMap {
    /// One IOVA range covers everything.
    Iommu(IommuMapping),
    /// No IOMMU: the physical address of each page (contiguous only within a page).
    Pages { page: u64, phys: Box<[PhysAddr]> },
    /// No IOMMU, physically contiguous memory (a BAR) at this bus address.
    Direct(BusAddr),
}

impl BusMap {
    /// Reads the physical address of each `page`-sized page of `vaddr..vaddr+len` from the
    /// pagemap. The pages must be present and locked.
    pub(crate) fn physical_pages(vaddr: *mut u8, len: u64, page: u64) -> Result<Self, DmaError> {
        let pm = Pagemap::open()?;
        let phys = (0..len.div_ceil(page))
            .map(|i| pm.phys_addr(vaddr.addr() + (i * page) as usize))
            .collect::<Result<Box<[_]>, _>>()?;
        Ok(BusMap::Pages { page, phys })
    }

    pub(crate) fn kind(&self) -> MapKind {
        match self {
            BusMap::Iommu(_) => MapKind::Iommu,
            BusMap::Pages { .. } | BusMap::Direct(_) => MapKind::NoIommu,
        }
    }

    pub(crate) fn iova(&self) -> Option<Iova> {
        match self {
            BusMap::Iommu(m) => Some(m.iova()),
            _ => None,
        }
    }

    /// Bus address of `offset`; the caller has checked `offset < len`.
    pub(crate) fn bus_addr(&self, offset: u64) -> BusAddr {
        match self {
            BusMap::Iommu(m) => BusAddr::from(m.iova()).add(offset),
            BusMap::Pages { page, phys } => BusAddr::from(phys[(offset / page) as usize]).add(offset % page),
            BusMap::Direct(base) => base.add(offset),
        }
    }

    /// Bytes from `offset` (< `total`) that are contiguous on the bus, at most `total - offset`.
    pub(crate) fn contiguous_len(&self, offset: u64, total: u64) -> u64 {
        let rest = total - offset;
        let BusMap::Pages { page, phys } = self else {
            return rest;
        };
        let mut i = (offset / page) as usize;
        let mut run = page - offset % page;
        while i + 1 < phys.len() && phys[i + 1].get() == phys[i].get() + page {
            run += page;
            i += 1;
        }
        run.min(rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn physical_pages_translate_and_merge_runs() {
        const P: u64 = 0x20_0000;
        // Pages 0,1 adjacent; 2 elsewhere; 3 right after 2.
        let phys = [0x4000_0000, 0x4020_0000, 0x1_0000_0000, 0x1_0020_0000]
            .map(PhysAddr)
            .into();
        let m = BusMap::Pages { page: P, phys };
        let total = 4 * P;
        assert_eq!(m.kind(), MapKind::NoIommu);
        assert_eq!(m.bus_addr(0), BusAddr(0x4000_0000));
        assert_eq!(m.bus_addr(P + 0x123), BusAddr(0x4020_0123));
        assert_eq!(m.bus_addr(2 * P + 5), BusAddr(0x1_0000_0005));
        assert_eq!(m.contiguous_len(0, total), 2 * P);
        assert_eq!(m.contiguous_len(0x10, total), 2 * P - 0x10);
        assert_eq!(m.contiguous_len(P + 1, total), P - 1);
        assert_eq!(m.contiguous_len(2 * P, total), 2 * P);
        assert_eq!(m.contiguous_len(3 * P + 7, total), P - 7);
        // A length that ends inside the last page caps the run.
        assert_eq!(m.contiguous_len(2 * P, 3 * P + 100), P + 100);
    }

    #[test]
    fn direct_is_one_run() {
        let m = BusMap::Direct(BusAddr(0xe000_0000));
        assert_eq!(m.bus_addr(0x10), BusAddr(0xe000_0010));
        assert_eq!(m.contiguous_len(0x10, 0x1000), 0xff0);
        assert_eq!(m.iova(), None);
    }
}
