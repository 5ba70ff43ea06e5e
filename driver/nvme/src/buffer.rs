//! Data buffers for I/O: only DMA memory can be handed to a queue pair.

use std::sync::Arc;

use vfpoll_dma::{DmaBuf, DmaRegion, PeerRegion};

use crate::cmb::CmbSlice;
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

/// A byte range of another device's memory (a GPU BAR, a peer's CMB, any PCI BAR registered as a
/// DMA target with `DmaContext::register_peer_bar`): the controller reads or writes it directly,
/// peer to peer, with no CPU copy. Device memory is never host memory: there is no CPU view of
/// it here; the CPU reaches it through the BAR's `Mmio` mapping.
#[derive(Debug, Clone)]
pub struct DeviceBuf {
    region: Arc<PeerRegion>,
    offset: usize,
    len: usize,
}

impl DeviceBuf {
    /// `len` bytes of `region` from `offset`; `None` if the range does not fit.
    pub fn new(region: Arc<PeerRegion>, offset: usize, len: usize) -> Option<Self> {
        (offset.checked_add(len)? <= region.len()).then_some(DeviceBuf { region, offset, len })
    }

    /// The registered device memory.
    pub fn region(&self) -> &Arc<PeerRegion> {
        &self.region
    }

    /// Offset in the region.
    pub fn offset(&self) -> usize {
        self.offset
    }
}

// SAFETY: the `Arc` keeps the registration (and so the IOMMU mapping of the BAR, or the BAR's
// bus address range in no-IOMMU mode) alive as long as this value; a BAR is contiguous in bus
// address space, and behind an IOMMU it is mapped at one contiguous IOVA range.
unsafe impl IoBuffer for DeviceBuf {
    fn len(&self) -> usize {
        self.len
    }
    fn bus_addr(&self, off: usize) -> BusAddr {
        self.region.bus_addr(self.offset + off)
    }
    fn contiguous_len(&self, off: usize) -> usize {
        self.len - off
    }
}

/// A range of bus addresses named by the caller, for no-IOMMU mode: memory vfpoll knows nothing
/// about (a BAR of a device that another driver owns, memory reserved at boot).
#[derive(Debug, Clone, Copy)]
pub struct BusRange {
    bus: BusAddr,
    len: usize,
}

impl BusRange {
    /// `len` bytes at bus address `bus`.
    ///
    /// # Safety
    /// The controller will read or write these bus addresses. They must be memory (or a BAR)
    /// that may be used this way for as long as the value lives, reachable by the controller
    /// without translation (no-IOMMU mode; behind an IOMMU bus addresses are IOVAs, which only
    /// `DmaContext` hands out), and contiguous.
    pub unsafe fn new(bus: BusAddr, len: usize) -> Self {
        BusRange { bus, len }
    }
}

// SAFETY: the caller of `BusRange::new` promised what the trait requires.
unsafe impl IoBuffer for BusRange {
    fn len(&self) -> usize {
        self.len
    }
    fn bus_addr(&self, off: usize) -> BusAddr {
        self.bus.add(off as u64)
    }
    fn contiguous_len(&self, off: usize) -> usize {
        self.len - off
    }
}

/// A piece of this controller's own CMB used as a data buffer (CMBSZ.RDS/WDS): the controller
/// moves data between its media and its own memory. The CPU reaches it through
/// [`crate::cmb::CmbSlice::mmio`]. Only valid for commands to the controller that owns the CMB;
/// for another controller, register the CMB's BAR range as a peer region and use [`DeviceBuf`].
#[derive(Debug, Clone)]
pub struct CmbBuf {
    slice: Arc<CmbSlice>,
    offset: usize,
    len: usize,
}

impl CmbBuf {
    /// `len` bytes of `slice` from `offset`; `None` if the range does not fit.
    pub fn new(slice: Arc<CmbSlice>, offset: usize, len: usize) -> Option<Self> {
        (offset.checked_add(len)? <= slice.len()).then_some(CmbBuf { slice, offset, len })
    }
}

// SAFETY: the `Arc` keeps the CMB slice allocated (and the CMB enabled: the controller holds
// the CMB for its lifetime) as long as this value; the CMB is contiguous at CMBMSC.CBA.
unsafe impl IoBuffer for CmbBuf {
    fn len(&self) -> usize {
        self.len
    }
    fn bus_addr(&self, off: usize) -> BusAddr {
        self.slice.bus_addr().add((self.offset + off) as u64)
    }
    fn contiguous_len(&self, off: usize) -> usize {
        self.len - off
    }
}

/// Any of the buffer kinds, for a queue pair that mixes them (host memory and device memory on
/// one queue).
#[derive(Debug)]
pub enum AnyBuf {
    /// A pool buffer.
    Pool(DmaBuf),
    /// A range of a host DMA region.
    Host(RegionBuf),
    /// A range of a peer device's memory.
    Device(DeviceBuf),
    /// A range of this controller's CMB.
    Cmb(CmbBuf),
    /// A caller-named bus range (no-IOMMU mode).
    Bus(BusRange),
}

macro_rules! any_buf {
    ($self:ident, $b:ident => $e:expr) => {
        match $self {
            AnyBuf::Pool($b) => $e,
            AnyBuf::Host($b) => $e,
            AnyBuf::Device($b) => $e,
            AnyBuf::Cmb($b) => $e,
            AnyBuf::Bus($b) => $e,
        }
    };
}

// SAFETY: each variant is an `IoBuffer` and upholds the contract itself.
unsafe impl IoBuffer for AnyBuf {
    fn len(&self) -> usize {
        any_buf!(self, b => IoBuffer::len(b))
    }
    fn bus_addr(&self, off: usize) -> BusAddr {
        any_buf!(self, b => IoBuffer::bus_addr(b, off))
    }
    fn contiguous_len(&self, off: usize) -> usize {
        any_buf!(self, b => IoBuffer::contiguous_len(b, off))
    }
}
