//! # vfpoll-dma: memory a device can reach
//!
//! The DMA memory layer of vfpoll, between the platform layer (`vfpoll-pci`: VFIO container,
//! BARs) and the device drivers (NVMe queues, NIC rings). Layers, bottom up:
//!
//! - the private `page` module: [`PageSize`] and [`hugepage::HugepageCounters`], imported by
//!   every module above it and importing none (also re-exported from [`hugepage`]);
//! - [`hugepage`]: pinned host memory ([`HugeMem`]): shared, populated, locked, never forked;
//!   2 MiB / 1 GiB hugepages, or 4 KiB pages for tests; errors that say how to reserve pages;
//! - [`pagemap`]: virtual → physical addresses (no-IOMMU mode only, needs root);
//! - [`mapper`]: the IOMMU side ([`DmaMapper`]), implemented for a VFIO container by the
//!   platform layer and by [`FakeMapper`] for tests and in-process device models;
//! - [`iova`]: which IOVAs are free ([`IovaAllocator`]);
//! - [`region`]: [`DmaRegion`], memory plus its bus addresses, unmapped on drop;
//! - [`pool`]: [`DmaPool`], fixed-size buffers for the hot path, no allocation after set-up;
//! - [`register`]: caller-owned memory ([`UserRegistration`]) and a peer device's BAR
//!   ([`PeerRegion`], for peer-to-peer DMA);
//! - [`piece`]: [`RegionBuf`] and [`DeviceBuf`], a region or a peer's BAR cut into owned,
//!   disjoint buffers that only their owner can read or write;
//! - [`DmaContext`] (here): the facade that ties a mapper to its IOVA allocator.
//!
//! ## The rule about references
//!
//! **No Rust reference (`&T`, `&mut T`, `&[u8]`) ever points into memory a device can read or
//! write.** A reference promises the compiler that nothing else changes the memory while it
//! lives (or that nothing reads it, for `&mut`); a device writing by DMA breaks that promise
//! behind the compiler's back, which is undefined behaviour, not just a stale value. So this
//! crate hands out raw pointers and offers copies in and out (`ptr::copy_nonoverlapping`,
//! `write_bytes`), volatile single accesses for fields the device updates, and volatile loops
//! for device memory (BARs). Ordering against the device is the driver's job: write, then
//! `fence(Release)`, then the doorbell; poll with a volatile read, then `fence(Acquire)`, then
//! copy out.
//!
//! `unsafe` lives in [`hugepage`] (mmap, mlock, madvise), the private `rawmem` module (all
//! accesses to DMA memory, and the pieces that split it among owners), `mapping` (calling
//! [`DmaMapper::map`]), [`region`] (handing its memory to its accessors) and [`register`]
//! (whose functions are `unsafe` because the caller vouches for memory it owns).
//!
//! ## Modes
//!
//! With an IOMMU ([`MapKind::Iommu`]) each region gets one contiguous IOVA range from the
//! context's allocator and is mapped with one call; the IOVA page after it stays unmapped (a
//! guard page), so a device that runs past the end of a buffer faults in the IOMMU instead of
//! reaching the next mapping. Without one ([`MapKind::NoIommu`]) the
//! device uses physical addresses, read per page from the pagemap; hugepages are contiguous
//! only within one page, so ask [`DmaRegion::contiguous_len`] before handing out lengths.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks, missing_docs)]

pub mod error;
pub mod hugepage;
pub mod iova;
pub mod mapper;
mod mapping;
pub mod numa;
mod page;
pub mod pagemap;
pub mod piece;
pub mod pool;
mod rawmem;
pub mod region;
pub mod register;
mod vfio_mapper;

use std::fmt;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

pub use error::DmaError;
pub use hugepage::{HugeMem, PageSize};
pub use iova::IovaAllocator;
pub use mapper::{DmaMapper, FakeMapper, MapCall, MapKind};
pub use numa::NumaPlacement;
pub use piece::{DeviceBuf, RegionBuf, RegionHold};
pub use pool::{DmaBuf, DmaPool, PoolLayout};
pub use rawmem::VolatileWord;
pub use region::DmaRegion;
pub use register::{register_peer_bar, register_user, PeerRegion, UserRegistration};
pub use vfpoll_pci::addr::{BusAddr, Iova, PhysAddr};

/// What regions, registrations and the context share: the mapper and its IOVA space.
pub(crate) struct Shared {
    pub(crate) mapper: Arc<dyn DmaMapper>,
    iova: Mutex<IovaAllocator>,
    sys: PathBuf,
}

impl Shared {
    /// The IOVA allocator. Control path only (allocation and teardown of regions), never per
    /// I/O. Poisoning is ignored: the allocator is consistent between calls, none of which
    /// panics half-way.
    pub(crate) fn iova(&self) -> MutexGuard<'_, IovaAllocator> {
        self.iova.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The DMA layer of one IOMMU domain (one VFIO container): allocates regions and pools,
/// registers foreign memory. Cheap to clone (an `Arc`); make exactly one per mapper and share
/// it, since two contexts over one container would hand out the same IOVAs.
#[derive(Clone)]
pub struct DmaContext {
    shared: Arc<Shared>,
}

impl fmt::Debug for DmaContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmaContext")
            .field("kind", &self.kind())
            .field("min_page_size", &self.shared.mapper.min_page_size())
            .field("iova_free", &self.iova_total_free())
            .finish()
    }
}

impl DmaContext {
    /// A context over `mapper`, reading hugepage counters from `/sys`.
    pub fn new(mapper: Arc<dyn DmaMapper>) -> Self {
        Self::with_sysfs(mapper, "/sys")
    }

    /// A context whose hugepage diagnostics read `sys` instead of `/sys` (tests).
    pub fn with_sysfs(mapper: Arc<dyn DmaMapper>, sys: impl Into<PathBuf>) -> Self {
        let iova = match mapper.kind() {
            MapKind::Iommu => IovaAllocator::new(&mapper.iova_ranges(), mapper.min_page_size()),
            MapKind::NoIommu => IovaAllocator::new(&[], mapper.min_page_size()),
        };
        DmaContext {
            shared: Arc::new(Shared {
                mapper,
                iova: Mutex::new(iova),
                sys: sys.into(),
            }),
        }
    }

    /// A context over a fresh [`FakeMapper`] (IOMMU, 4 KiB pages): for tests and device
    /// models. To look at the mapper, make it yourself and pass a clone to [`DmaContext::new`].
    pub fn for_testing() -> Self {
        Self::new(Arc::new(FakeMapper::new()))
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The mapper.
    pub fn mapper(&self) -> &Arc<dyn DmaMapper> {
        &self.shared.mapper
    }

    /// Whether there is an IOMMU.
    pub fn kind(&self) -> MapKind {
        self.shared.mapper.kind()
    }

    /// Free IOVA bytes (0 without an IOMMU).
    pub fn iova_total_free(&self) -> u64 {
        self.shared.iova().total_free()
    }

    /// The free IOVA ranges (diagnostics and tests).
    pub fn iova_free_ranges(&self) -> Vec<RangeInclusive<u64>> {
        self.shared.iova().free_ranges()
    }

    /// A region of at least `len` bytes of anonymous `page_size` memory, mapped for DMA.
    pub fn alloc_region(&self, len: usize, page_size: PageSize) -> Result<DmaRegion, DmaError> {
        self.alloc_region_placed(len, page_size, NumaPlacement::Any)
    }

    /// [`DmaContext::alloc_region`] on a NUMA node: bound there before its first touch, every
    /// page checked to be there (see [`numa`]). For the device's node, pass
    /// [`NumaPlacement::device_node`] of its sysfs `numa_node`.
    pub fn alloc_region_placed(
        &self,
        len: usize,
        page_size: PageSize,
        placement: NumaPlacement,
    ) -> Result<DmaRegion, DmaError> {
        let mem = HugeMem::alloc_placed(len as u64, page_size, placement, &self.shared.sys)?;
        DmaRegion::new(&self.shared, mem)
    }

    /// Like [`DmaContext::alloc_region`], from the hugetlbfs mount `mount` (whose page size must
    /// be `page_size`): for setups that reserve pages per mount or per cgroup.
    pub fn alloc_region_on(
        &self,
        len: usize,
        page_size: PageSize,
        mount: &Path,
    ) -> Result<DmaRegion, DmaError> {
        let mem = HugeMem::alloc_in(len as u64, page_size, mount, &self.shared.sys)?;
        DmaRegion::new(&self.shared, mem)
    }

    /// A pool of `count` buffers of `buf_size` bytes (a power of two of at least 512). Without
    /// an IOMMU a buffer must fit in one page (physical pages are contiguous only within
    /// themselves); behind one it may span pages ([`PoolLayout::spanning`]).
    pub fn pool(&self, buf_size: usize, count: usize, page_size: PageSize) -> Result<DmaPool, DmaError> {
        self.pool_placed(buf_size, count, page_size, NumaPlacement::Any)
    }

    /// [`DmaContext::pool`] on a NUMA node (see [`DmaContext::alloc_region_placed`]).
    pub fn pool_placed(
        &self,
        buf_size: usize,
        count: usize,
        page_size: PageSize,
        placement: NumaPlacement,
    ) -> Result<DmaPool, DmaError> {
        let layout = match self.kind() {
            MapKind::Iommu => PoolLayout::spanning(buf_size, count, page_size)?,
            MapKind::NoIommu => PoolLayout::new(buf_size, count, page_size)?,
        };
        let region = self.alloc_region_placed(layout.region_len, page_size, placement)?;
        Ok(DmaPool::new(region, layout))
    }

    /// Registers caller-owned memory; see [`register_user`].
    ///
    /// # Safety
    /// As for [`register_user`].
    pub unsafe fn register_user(&self, ptr: *mut u8, len: u64) -> Result<UserRegistration, DmaError> {
        // SAFETY: forwarded.
        unsafe { register_user(self, ptr, len) }
    }

    /// Registers a peer device's BAR; see [`register_peer_bar`].
    ///
    /// # Safety
    /// As for [`register_peer_bar`].
    pub unsafe fn register_peer_bar(
        &self,
        bar_vaddr: *mut u8,
        len: u64,
        bar_bus: BusAddr,
    ) -> Result<PeerRegion, DmaError> {
        // SAFETY: forwarded.
        unsafe { register_peer_bar(self, bar_vaddr, len, bar_bus) }
    }
}
