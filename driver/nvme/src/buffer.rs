//! Data buffers for I/O: only DMA memory can be handed to a queue pair, and only by its owner.
//!
//! Every buffer kind is a unique handle to its bytes: [`DmaBuf`] (a pool's), [`RegionBuf`] (a
//! piece of a host [`vfpoll_dma::DmaRegion`]), [`DeviceBuf`] (a piece of a peer device's BAR),
//! [`CmbBuf`] (a piece of this controller's CMB), [`BusRange`] (caller-named bus addresses). None
//! is `Clone`; regions, registrations and CMB slices are moved into their buffers, so no other
//! handle to the bytes is left; a buffer splits into disjoint pieces, and the CPU reaches the
//! bytes only through the piece's owner (copies in and out). A queue pair takes a buffer by
//! value and hands it back with the completion, so while the device owns the bytes nothing
//! else can read them, write them or put them into a second command. A buffer cannot be
//! cloned:
//!
//! ```compile_fail,E0599
//! fn f(buf: vfpoll_nvme::RegionBuf) -> (vfpoll_nvme::RegionBuf, vfpoll_nvme::RegionBuf) {
//!     (buf.clone(), buf)
//! }
//! ```
//!
//! and once a queue pair owns it, it cannot be read (it comes back in the completion's
//! [`crate::Done::buf`], or in [`crate::Rejected::buf`] if the submission is refused):
//!
//! ```compile_fail,E0382
//! fn f(qp: &mut vfpoll_nvme::QueuePair<vfpoll_nvme::RegionBuf>, buf: vfpoll_nvme::RegionBuf) {
//!     let _ = qp.read(1, 0, buf, 7);
//!     let mut out = [0u8; 512];
//!     let _ = buf.read(0, &mut out); // `buf` moved into the queue pair
//! }
//! ```
//!
//! Reading it after it came back compiles:
//!
//! ```
//! fn f(qp: &mut vfpoll_nvme::QueuePair<vfpoll_nvme::RegionBuf>, buf: vfpoll_nvme::RegionBuf) {
//!     let mut out = [0u8; 512];
//!     match qp.read(1, 0, buf, 7) {
//!         Ok(()) => {
//!             qp.poll(1, |done| {
//!                 if let Some(buf) = done.buf {
//!                     buf.read(0, &mut out).expect("in range");
//!                 }
//!             });
//!         }
//!         Err(rejected) => rejected.buf.read(0, &mut out).expect("in range"),
//!     }
//! }
//! ```

use std::sync::Arc;

use vfpoll_dma::DmaBuf;
pub use vfpoll_dma::{DeviceBuf, RegionBuf};
use vfpoll_pci::mmio::{Mmio, WindowError};

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

// SAFETY: the region behind a `RegionBuf` stays allocated and mapped while any piece of it
// lives (each holds the region's `Arc`); `bus_addr` and `contiguous_len` are the region's own,
// clipped to the piece.
unsafe impl IoBuffer for RegionBuf {
    fn len(&self) -> usize {
        RegionBuf::len(self)
    }
    fn bus_addr(&self, off: usize) -> BusAddr {
        RegionBuf::bus_addr(self, off)
    }
    fn contiguous_len(&self, off: usize) -> usize {
        RegionBuf::contiguous_len(self, off)
    }
}

// SAFETY: every piece holds the registration's `Arc`, which keeps the BAR mapped in the IOMMU
// (or its bus address range, without one); a BAR is contiguous in bus address space, and
// behind an IOMMU it is mapped at one contiguous IOVA range.
unsafe impl IoBuffer for DeviceBuf {
    fn len(&self) -> usize {
        DeviceBuf::len(self)
    }
    fn bus_addr(&self, off: usize) -> BusAddr {
        DeviceBuf::bus_addr(self, off)
    }
    fn contiguous_len(&self, off: usize) -> usize {
        DeviceBuf::contiguous_len(self, off)
    }
}

/// A range of bus addresses named by the caller, for no-IOMMU mode: memory vfpoll knows nothing
/// about (a BAR of a device that another driver owns, memory reserved at boot). Neither `Copy`
/// nor `Clone`: a value is one claim on its bytes.
#[derive(Debug)]
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
    /// `DmaContext` hands out), and contiguous. The value owns them: while it lives, no other
    /// `BusRange` or buffer may name any of these bytes, and nothing else may read or write them
    /// while a command holds the value (from submission until its completion hands it back).
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

/// An owned piece of this controller's own CMB used as a data buffer (CMBSZ.RDS/WDS): the
/// controller moves data between its media and its own memory. Only valid for commands to the
/// controller that owns the CMB; for another controller, register the CMB's BAR range as a peer
/// region and use a [`DeviceBuf`].
///
/// The same ownership rule as [`RegionBuf`]: made from a [`CmbSlice`] taken by value, split
/// into disjoint pieces that share the slice privately, not `Clone`, and the CPU reaches the
/// bytes only through the owner of a piece ([`CmbBuf::read`], [`CmbBuf::write`]: volatile
/// copies through the CMB's `Mmio` mapping).
pub struct CmbBuf {
    slice: Arc<CmbSlice>,
    /// Where the piece starts in the slice.
    offset: usize,
    /// The CPU mapping of exactly this piece (private: handing it out would let a clone
    /// outlive the piece's ownership).
    mmio: Mmio,
}

impl std::fmt::Debug for CmbBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmbBuf")
            .field("slice_offset", &self.slice.offset())
            .field("offset", &self.offset)
            .field("len", &self.len())
            .finish()
    }
}

impl From<CmbSlice> for CmbBuf {
    fn from(slice: CmbSlice) -> Self {
        CmbBuf::whole(slice)
    }
}

impl CmbBuf {
    /// The whole slice.
    pub fn whole(slice: CmbSlice) -> Self {
        let mmio = slice.mmio();
        CmbBuf {
            slice: Arc::new(slice),
            offset: 0,
            mmio,
        }
    }

    /// Splits off bytes `at..` as a buffer of their own; `self` keeps `..at`.
    ///
    /// # Panics
    /// If `at > len()`.
    pub fn split_off(&mut self, at: usize) -> Self {
        let len = self.len();
        assert!(at <= len, "cannot split a {len}-byte buffer at {at}");
        let tail = self.mmio.window(at, len - at).expect("checked: inside the piece");
        self.mmio = self.mmio.window(0, at).expect("checked: inside the piece");
        CmbBuf {
            slice: Arc::clone(&self.slice),
            offset: self.offset + at,
            mmio: tail,
        }
    }

    /// `(..at, at..)`: [`CmbBuf::split_off`] that keeps both halves together.
    ///
    /// # Panics
    /// If `at > len()`.
    pub fn split_at(mut self, at: usize) -> (Self, Self) {
        let tail = self.split_off(at);
        (self, tail)
    }

    /// `self` and `next` as one buffer, if `next` is a piece of the same slice that starts where
    /// `self` ends; both back unchanged otherwise.
    pub fn join(self, next: Self) -> Result<Self, (Self, Self)> {
        if !Arc::ptr_eq(&self.slice, &next.slice) || self.offset + self.len() != next.offset {
            return Err((self, next));
        }
        let len = self.len() + next.len();
        let mmio = self
            .slice
            .mmio()
            .window(self.offset, len)
            .expect("adjacent pieces lie inside the slice");
        Ok(CmbBuf { mmio, ..self })
    }

    /// The slice back, once this is its last piece; the buffer back otherwise.
    pub fn into_slice(self) -> Result<CmbSlice, Self> {
        let CmbBuf { slice, offset, mmio } = self;
        Arc::try_unwrap(slice).map_err(|slice| CmbBuf { slice, offset, mmio })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.mmio.len()
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where the buffer starts in its slice.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The address of byte `off` as the owning controller sees it (CMBMSC.CBA based).
    ///
    /// # Panics
    /// If `off >= len()`.
    pub fn bus_addr(&self, off: usize) -> BusAddr {
        assert!(
            off < self.len(),
            "offset {off:#x} outside the {:#x}-byte buffer",
            self.len()
        );
        self.slice.bus_addr().add((self.offset + off) as u64)
    }

    /// The CPU address of the buffer's start, for registering it as a peer region of another
    /// controller. Never make a reference from it.
    pub fn as_ptr(&self) -> *mut u8 {
        self.mmio.as_ptr()
    }

    /// Copies from the buffer at `off` into `dst` (volatile loads).
    pub fn read(&self, off: usize, dst: &mut [u8]) -> Result<(), WindowError> {
        self.mmio.copy_from(off, dst)
    }

    /// Copies `src` into the buffer at `off` (volatile stores).
    pub fn write(&mut self, off: usize, src: &[u8]) -> Result<(), WindowError> {
        self.mmio.copy_to(off, src)
    }
}

// SAFETY: every piece holds the slice's `Arc`, which keeps the CMB range allocated (and the CMB
// enabled: the controller holds the CMB for its lifetime); the CMB is contiguous at CMBMSC.CBA.
unsafe impl IoBuffer for CmbBuf {
    fn len(&self) -> usize {
        CmbBuf::len(self)
    }
    fn bus_addr(&self, off: usize) -> BusAddr {
        CmbBuf::bus_addr(self, off)
    }
    fn contiguous_len(&self, off: usize) -> usize {
        self.len() - off
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
