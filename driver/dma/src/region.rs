//! [`DmaRegion`]: host memory a device can reach, with its bus addresses.

use std::ptr::NonNull;
use std::sync::Arc;

use crate::error::DmaError;
use crate::hugepage::{HugeMem, PageSize};
use crate::mapper::MapKind;
use crate::mapping::{BusMap, IommuMapping};
use crate::rawmem::{Piece, RawMem, VolatileWord};
use crate::Shared;
use vfpoll_pci::{BusAddr, Iova};

/// Pinned host memory mapped for DMA.
///
/// Behind an IOMMU the whole region sits at one contiguous IOVA range (mapped with one call,
/// aligned to the page size so the IOMMU can use large pages of its own). Without an IOMMU
/// each page has its own physical address, so a region is bus-contiguous only within a page
/// (or where the kernel happened to hand out neighbouring pages): use
/// [`DmaRegion::contiguous_len`] before giving a device a length.
///
/// Dropping the region unmaps it from the IOMMU first, then frees the memory. Drop it only
/// when no device can still write into it.
pub struct DmaRegion {
    mem: RawMem,
    // Field order is drop order: unmap from the IOMMU (bus) before the memory goes (backing).
    bus: BusMap,
    backing: HugeMem,
}

// SAFETY: the region owns its memory and mapping outright; nothing in it is tied to the
// creating thread (the IOMMU guard holds an `Arc` to the Send + Sync context).
unsafe impl Send for DmaRegion {}
// SAFETY: through `&DmaRegion` one can only read (plain or volatile copies out) and learn
// addresses; every write takes `&mut self`. Concurrent reads of the same bytes are not a data
// race, and no method forms a reference into the memory. Raw pointers from `as_ptr` are the
// holder's responsibility (dereferencing them is `unsafe`).
unsafe impl Sync for DmaRegion {}

impl std::fmt::Debug for DmaRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DmaRegion")
            .field("ptr", &self.mem.ptr())
            .field("len", &self.mem.len())
            .field("page_size", &self.backing.page_size())
            .field("kind", &self.bus.kind())
            .field("bus", &self.bus_addr(0))
            .finish()
    }
}

impl DmaRegion {
    /// Makes `backing` reachable by the device of `shared`.
    pub(crate) fn new(shared: &Arc<Shared>, backing: HugeMem) -> Result<Self, DmaError> {
        let page = backing.page_size();
        let len = backing.len() as u64;
        let bus = match shared.mapper.kind() {
            MapKind::Iommu => {
                let mapper_page = shared.mapper.min_page_size();
                if mapper_page > page.bytes() {
                    return Err(DmaError::PageTooSmall {
                        mapper_page,
                        page_size: page,
                    });
                }
                // SAFETY: `backing` is a populated, locked, never-forked mapping that lives in
                // this region; field order unmaps it before `backing` is freed. Its start and
                // length are multiples of its page size, which the mapper's page size divides.
                let m = unsafe { IommuMapping::new(shared, backing.as_ptr(), len, page.bytes())? };
                BusMap::Iommu(m)
            }
            MapKind::NoIommu => {
                if !page.is_huge() {
                    log::warn!(
                        "no-IOMMU DMA region on 4 KiB pages: the kernel may migrate them; use hugepages"
                    );
                }
                BusMap::physical_pages(backing.as_ptr(), len, page.bytes())?
            }
        };
        let ptr = NonNull::new(backing.as_ptr()).expect("HugeMem pointers are non-null");
        // SAFETY: the memory is valid for reads and writes while `backing` lives, i.e. as long as
        // `mem` (same struct); this crate forms no reference into it, and `mem` is its only
        // accessor inside this crate.
        let mem = unsafe { RawMem::new(ptr, backing.len()) };
        Ok(DmaRegion { mem, bus, backing })
    }

    /// The region as one [`Piece`], the first of the pieces that share it from now on.
    pub(crate) fn into_piece(self) -> Piece<DmaRegion> {
        let (ptr, len) = (self.mem.ptr(), self.len());
        let base = NonNull::new(ptr).expect("region memory is non-null");
        // SAFETY: `base..base+len` is this region's memory, valid while the region lives, which
        // the `Arc` in every piece keeps. The region's own accessors (`read`, `write`, ...) stay
        // unused: the `Arc` is private to the pieces, which ask it for addresses only, and the
        // region comes back out (`Piece::into_owner`) only when no piece is left. This crate
        // forms no reference into the memory.
        unsafe { Piece::new(Arc::new(self), base, len) }
    }

    /// Start of the memory, aligned to the page size. Never make a reference from it: the
    /// device may write the memory at any time.
    pub fn as_ptr(&self) -> *mut u8 {
        self.mem.ptr()
    }

    /// Length in bytes (whole pages: the length asked for, rounded up).
    #[expect(
        clippy::len_without_is_empty,
        reason = "never empty: zero-length regions are refused"
    )]
    pub fn len(&self) -> usize {
        self.mem.len()
    }

    /// The page size backing the region.
    pub fn page_size(&self) -> PageSize {
        self.backing.page_size()
    }

    /// The NUMA node every page was checked to be on, for a region asked for on one
    /// ([`crate::DmaContext::alloc_region_placed`]).
    pub fn numa_node(&self) -> Option<u32> {
        self.backing.numa_node()
    }

    /// Whether the device reaches the region through an IOMMU.
    pub fn map_kind(&self) -> MapKind {
        self.bus.kind()
    }

    /// The IOVA of the start of the region (IOMMU mode only).
    pub fn iova(&self) -> Option<Iova> {
        self.bus.iova()
    }

    /// The address a device uses for the byte at `offset`.
    ///
    /// # Panics
    /// If `offset >= len()`.
    pub fn bus_addr(&self, offset: usize) -> BusAddr {
        assert!(
            offset < self.len(),
            "offset {offset:#x} outside the {:#x}-byte DMA region",
            self.len()
        );
        self.bus.bus_addr(offset as u64)
    }

    /// Bytes from `offset` on that are contiguous on the bus (0 if `offset >= len()`).
    pub fn contiguous_len(&self, offset: usize) -> usize {
        if offset >= self.len() {
            return 0;
        }
        self.bus.contiguous_len(offset as u64, self.len() as u64) as usize
    }

    /// Copies `src` into the region at `offset`.
    pub fn write(&mut self, offset: usize, src: &[u8]) -> Result<(), DmaError> {
        self.mem.write(offset, src)
    }

    /// Copies from the region at `offset` into `dst`. Order it after the device's completion
    /// (volatile read of the completion, then `fence(Acquire)`).
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), DmaError> {
        self.mem.read(offset, dst)
    }

    /// Sets `len` bytes at `offset` to `byte`.
    pub fn fill(&mut self, offset: usize, len: usize, byte: u8) -> Result<(), DmaError> {
        self.mem.fill(offset, len, byte)
    }

    /// One volatile read of a naturally aligned integer (a field the device updates, such as a
    /// completion queue entry's phase bit).
    pub fn read_volatile<T: VolatileWord>(&self, offset: usize) -> Result<T, DmaError> {
        self.mem.read_volatile(offset)
    }

    /// One volatile write of a naturally aligned integer.
    pub fn write_volatile<T: VolatileWord>(&mut self, offset: usize, value: T) -> Result<(), DmaError> {
        self.mem.write_volatile(offset, value)
    }
}
