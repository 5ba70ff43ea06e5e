//! Data buffers for I/O: only DMA memory can be handed to a queue pair.

use std::sync::Arc;

use vfpoll_dma::{DmaBuf, DmaRegion};
use vfpoll_pci::BusAddr;

/// Memory a controller may read or write, owned by the queue pair while a command uses it.
///
/// The queue pair takes the buffer by value at submit time and gives it back with the
/// completion, so the memory cannot be freed or reused while the device may still access it.
/// Ordinary memory is not an `IoBuffer`, so it cannot reach the device:
///
/// ```compile_fail,E0277
/// fn f(qp: &mut vfpoll_nvme::QueuePair<Vec<u8>>) { let _ = qp.read(1, 0, vec![0; 512], 0); }
/// ```
///
/// # Safety
/// For as long as a value of the implementing type is alive, `bus_addr(off)` for every
/// `off < len()` must be an address the controller can reach (mapped in its IOMMU domain, or
/// physical memory in no-IOMMU mode) that stays valid, and `contiguous_len(off)` bytes from
/// `off` must be contiguous in bus address space.
pub unsafe trait IoBuffer: Send {
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Whether the buffer is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The bus address of byte `off`.
    fn bus_addr(&self, off: usize) -> BusAddr;
    /// How many bytes from `off` are bus-contiguous.
    fn contiguous_len(&self, off: usize) -> usize;
}

// SAFETY: a `DmaBuf` comes from a pool whose region stays mapped while any buffer is out (the
// pool leaks its region rather than free it with buffers outstanding), and a buffer never
// straddles a page, so it is contiguous.
unsafe impl IoBuffer for DmaBuf {
    fn len(&self) -> usize {
        DmaBuf::len(self)
    }
    fn bus_addr(&self, off: usize) -> BusAddr {
        debug_assert!(off < DmaBuf::len(self));
        self.bus_addr().add(off as u64)
    }
    fn contiguous_len(&self, off: usize) -> usize {
        DmaBuf::len(self) - off
    }
}

/// A byte range of a shared [`DmaRegion`], usable as an I/O buffer. Holding the `Arc` keeps the
/// region (and its mapping) alive while the command runs.
#[derive(Debug, Clone)]
pub struct RegionBuf {
    region: Arc<DmaRegion>,
    offset: usize,
    len: usize,
}

impl RegionBuf {
    /// `len` bytes of `region` from `offset`; `None` if the range does not fit.
    pub fn new(region: Arc<DmaRegion>, offset: usize, len: usize) -> Option<Self> {
        (offset.checked_add(len)? <= region.len()).then_some(RegionBuf { region, offset, len })
    }

    /// The whole region.
    pub fn whole(region: Arc<DmaRegion>) -> Self {
        let len = region.len();
        RegionBuf {
            region,
            offset: 0,
            len,
        }
    }

    /// The region.
    pub fn region(&self) -> &Arc<DmaRegion> {
        &self.region
    }

    /// Offset in the region.
    pub fn offset(&self) -> usize {
        self.offset
    }
}

// SAFETY: the `Arc` keeps the region, and so its DMA mapping, alive as long as this value; the
// range is inside the region (checked in `new`), and `contiguous_len` is the region's own.
unsafe impl IoBuffer for RegionBuf {
    fn len(&self) -> usize {
        self.len
    }
    fn bus_addr(&self, off: usize) -> BusAddr {
        self.region.bus_addr(self.offset + off)
    }
    fn contiguous_len(&self, off: usize) -> usize {
        self.region.contiguous_len(self.offset + off).min(self.len - off)
    }
}
