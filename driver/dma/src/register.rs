//! Making memory the DMA layer did not allocate reachable by a device: caller-owned host memory
//! ([`register_user`]) and a peer device's BAR ([`register_peer_bar`], peer-to-peer DMA such as
//! NVMe → GPU memory).

use std::ptr::NonNull;

use crate::error::DmaError;
use crate::hugepage::base_page_size;
use crate::mapper::MapKind;
use crate::mapping::{BusMap, IommuMapping};
use crate::rawmem::{Piece, RawMem, VolatileWord};
use crate::DmaContext;
use vfpoll_pci::{BusAddr, Iova};

/// Largest IOVA alignment asked for (1 GiB: the largest IOMMU page).
const MAX_ALIGN: u64 = 1 << 30;

/// Checks `ptr` and `len` (non-zero) against `page` (a power of two).
fn check_range(ptr: *mut u8, len: u64, page: u64) -> Result<NonNull<u8>, DmaError> {
    let p = NonNull::new(ptr).ok_or(DmaError::NullPointer)?;
    if len == 0 || usize::try_from(len).is_err() {
        return Err(DmaError::BadLength { len });
    }
    if ptr.addr() as u64 & (page - 1) != 0 {
        return Err(DmaError::Misaligned {
            what: "address",
            value: ptr.addr() as u64,
            align: page,
        });
    }
    if len & (page - 1) != 0 {
        return Err(DmaError::Misaligned {
            what: "length",
            value: len,
            align: page,
        });
    }
    Ok(p)
}

/// Caller-owned host memory registered for DMA. Dropping it unmaps it from the IOMMU.
pub struct UserRegistration {
    ptr: NonNull<u8>,
    len: usize,
    bus: BusMap,
}

// SAFETY: the registration holds the caller's pointer only to report it; it never reads or
// writes the memory, so it may move between and be shared by threads. Its IOMMU guard holds
// an `Arc` to the Send + Sync context.
unsafe impl Send for UserRegistration {}
// SAFETY: see above: `&UserRegistration` yields only addresses.
unsafe impl Sync for UserRegistration {}

impl std::fmt::Debug for UserRegistration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserRegistration")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("iova", &self.iova())
            .finish()
    }
}

/// Registers `len` bytes of caller-owned memory at `ptr` for DMA.
///
/// `ptr` and `len` must be multiples of the mapper's page size. Behind an IOMMU the memory is
/// mapped at a fresh IOVA (aligned like `ptr`, so hugepage-backed memory can use IOMMU large
/// pages); without one, the physical address of each base page is read from the pagemap.
///
/// # Safety
/// Until the returned registration is dropped, the memory stays mapped, populated and locked
/// (mlocked or hugepage-backed), is not moved or remapped (no `mremap`, no private mapping
/// shared with a `fork`ed child), and is not freed. Without an IOMMU, its pages must not be
/// migratable (use hugepages).
pub unsafe fn register_user(ctx: &DmaContext, ptr: *mut u8, len: u64) -> Result<UserRegistration, DmaError> {
    let shared = ctx.shared();
    let page = shared.mapper.min_page_size();
    let p = check_range(ptr, len, page)?;
    let bus = match shared.mapper.kind() {
        MapKind::Iommu => {
            let align = (1u64 << (ptr.addr() as u64).trailing_zeros())
                .min(len.next_power_of_two())
                .clamp(page, MAX_ALIGN);
            // SAFETY: our caller promised the memory stays mapped and in place until the
            // registration, which owns the mapping guard, is dropped; alignment checked above.
            BusMap::Iommu(unsafe { IommuMapping::new(shared, ptr, len, align)? })
        }
        MapKind::NoIommu => BusMap::physical_pages(ptr, len, base_page_size())?,
    };
    Ok(UserRegistration {
        ptr: p,
        len: len as usize,
        bus,
    })
}

impl UserRegistration {
    /// The registered memory's start.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Its length in bytes.
    #[expect(
        clippy::len_without_is_empty,
        reason = "never empty: zero lengths are refused"
    )]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the device reaches it through an IOMMU.
    pub fn map_kind(&self) -> MapKind {
        self.bus.kind()
    }

    /// The IOVA of its start (IOMMU mode only).
    pub fn iova(&self) -> Option<Iova> {
        self.bus.iova()
    }

    /// The bus address of the byte at `offset`.
    ///
    /// # Panics
    /// If `offset >= len()`.
    pub fn bus_addr(&self, offset: usize) -> BusAddr {
        assert!(
            offset < self.len,
            "offset {offset:#x} outside the {:#x}-byte registration",
            self.len
        );
        self.bus.bus_addr(offset as u64)
    }

    /// Bytes from `offset` on that are contiguous on the bus (0 if `offset >= len()`).
    pub fn contiguous_len(&self, offset: usize) -> usize {
        if offset >= self.len {
            return 0;
        }
        self.bus.contiguous_len(offset as u64, self.len as u64) as usize
    }
}

/// A peer device's BAR (device memory, e.g. a GPU's) registered as a DMA target.
///
/// It is MMIO, not host memory: it offers only volatile accessors, and a pointer to it must
/// never be mixed up with one to a [`crate::DmaRegion`]. Dropping it unmaps it from the IOMMU;
/// the BAR's CPU mapping stays with its owner.
pub struct PeerRegion {
    mmio: RawMem,
    // Dropped after `mmio` (which has no drop glue); unmaps the IOVA range.
    bus: BusMap,
    bar_bus: BusAddr,
}

// SAFETY: owns only addresses and its IOMMU guard (an `Arc` to the Send + Sync context); the
// BAR mapping is not tied to a thread.
unsafe impl Send for PeerRegion {}
// SAFETY: `&PeerRegion` allows only volatile reads; every write takes `&mut self`, so the API
// cannot produce racing writes. No reference into the BAR is ever formed.
unsafe impl Sync for PeerRegion {}

impl std::fmt::Debug for PeerRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerRegion")
            .field("cpu", &self.mmio.ptr())
            .field("len", &self.mmio.len())
            .field("bar_bus", &self.bar_bus)
            .field("iova", &self.iova())
            .finish()
    }
}

/// Registers `len` bytes of a peer device's BAR, mapped into this process at `bar_vaddr` and
/// at bus address `bar_bus` (the BAR's physical address, from sysfs `resource`), as a DMA
/// target.
///
/// Behind an IOMMU the CPU mapping is mapped through the mapper at a fresh IOVA (VFIO type1
/// accepts a VA that is an mmap of another VFIO device's BAR; iommufd in Linux 6.12 does not,
/// and the error, `VfioError::PeerBarUnderIommufd` as its source, says to use the type1
/// backend); `bar_vaddr` and `len` must be multiples of the mapper's page size. Without an
/// IOMMU the device uses `bar_bus` directly and no map call is made.
///
/// # Safety
/// `bar_vaddr..bar_vaddr+len` is a mapping of the BAR that stays mapped until the returned
/// region is dropped, tolerates naturally aligned 8-, 16-, 32- and 64-bit reads and writes,
/// and is never accessed through a Rust reference. `bar_bus` is the bus address of the byte at
/// `bar_vaddr`.
pub unsafe fn register_peer_bar(
    ctx: &DmaContext,
    bar_vaddr: *mut u8,
    len: u64,
    bar_bus: BusAddr,
) -> Result<PeerRegion, DmaError> {
    let shared = ctx.shared();
    let bus = match shared.mapper.kind() {
        MapKind::Iommu => {
            let page = shared.mapper.min_page_size();
            check_range(bar_vaddr, len, page)?;
            // BARs are naturally aligned on the bus; an IOVA aligned the same way lets the IOMMU
            // use large pages.
            let align = len.next_power_of_two().clamp(page, MAX_ALIGN);
            // SAFETY: our caller promised the BAR stays mapped until the region, which owns the
            // mapping guard, is dropped; alignment checked above.
            BusMap::Iommu(unsafe { IommuMapping::new_peer(shared, bar_vaddr, len, align)? })
        }
        MapKind::NoIommu => {
            check_range(bar_vaddr, len, 1)?;
            BusMap::Direct(bar_bus)
        }
    };
    let ptr = NonNull::new(bar_vaddr).ok_or(DmaError::NullPointer)?;
    // SAFETY: our caller promised the range is mapped, accepts these accesses and is never
    // referenced, for as long as the region (which owns `mmio`) lives.
    let mmio = unsafe { RawMem::new(ptr, len as usize) };
    Ok(PeerRegion { mmio, bus, bar_bus })
}

impl PeerRegion {
    /// The registration as one [`Piece`], the first of the pieces that share it from now on.
    pub(crate) fn into_piece(self) -> Piece<PeerRegion> {
        let (ptr, len) = (self.mmio.ptr(), self.len());
        let base = NonNull::new(ptr).expect("registered BARs are non-null");
        // SAFETY: `base..base+len` is the BAR mapping that the caller of `register_peer_bar`
        // keeps mapped, tolerant of these accesses and free of references while the region
        // lives, which the `Arc` in every piece keeps. The region's own accessors stay unused:
        // the `Arc` is private to the pieces (addresses only), and the region comes back out
        // only when no piece is left.
        unsafe { Piece::new(std::sync::Arc::new(self), base, len) }
    }

    /// The CPU mapping of the BAR (MMIO: volatile access only).
    pub fn as_ptr(&self) -> *mut u8 {
        self.mmio.ptr()
    }

    /// Length in bytes.
    #[expect(
        clippy::len_without_is_empty,
        reason = "never empty: zero lengths are refused"
    )]
    pub fn len(&self) -> usize {
        self.mmio.len()
    }

    /// Whether the device reaches it through an IOMMU.
    pub fn map_kind(&self) -> MapKind {
        self.bus.kind()
    }

    /// The IOVA of its start (IOMMU mode only).
    pub fn iova(&self) -> Option<Iova> {
        self.bus.iova()
    }

    /// The BAR's own bus (physical) address, as given at registration.
    pub fn bar_bus_addr(&self) -> BusAddr {
        self.bar_bus
    }

    /// The address a DMA-issuing device uses for the byte at `offset` (the IOVA behind an
    /// IOMMU, the BAR's bus address without one). A BAR is contiguous, so the whole rest of
    /// the region follows it.
    ///
    /// # Panics
    /// If `offset >= len()`.
    pub fn bus_addr(&self, offset: usize) -> BusAddr {
        assert!(
            offset < self.len(),
            "offset {offset:#x} outside the {:#x}-byte peer region",
            self.len()
        );
        self.bus.bus_addr(offset as u64)
    }

    /// One volatile read of a naturally aligned integer.
    pub fn read_volatile<T: VolatileWord>(&self, offset: usize) -> Result<T, DmaError> {
        self.mmio.read_volatile(offset)
    }

    /// One volatile write of a naturally aligned integer.
    pub fn write_volatile<T: VolatileWord>(&mut self, offset: usize, value: T) -> Result<(), DmaError> {
        self.mmio.write_volatile(offset, value)
    }

    /// Copies out of device memory with volatile byte and 32-bit accesses.
    pub fn copy_from_device(&self, offset: usize, dst: &mut [u8]) -> Result<(), DmaError> {
        self.mmio.copy_from_volatile(offset, dst)
    }

    /// Copies into device memory with volatile byte and 32-bit accesses.
    pub fn copy_to_device(&mut self, offset: usize, src: &[u8]) -> Result<(), DmaError> {
        self.mmio.copy_to_volatile(offset, src)
    }
}
