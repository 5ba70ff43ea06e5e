//! Owned, disjoint pieces of DMA memory, the buffers a driver hands to a device:
//! [`RegionBuf`] (host memory, of a [`DmaRegion`]) and [`DeviceBuf`] (device memory, of a peer's
//! BAR registered as a [`PeerRegion`]).
//!
//! The ownership rule, the same as for a pool's [`crate::DmaBuf`]: **whoever holds a buffer
//! owns its bytes, and nothing else can reach them.**
//!
//! - A buffer is made from a region taken by value, so no `&DmaRegion` is left through which
//!   the bytes could be read or written.
//! - A buffer is not `Clone`. It is split into disjoint pieces ([`RegionBuf::split_off`],
//!   [`RegionBuf::split_at`]) that share the region through a private `Arc`, used for addresses
//!   only and never handed out. Pieces join back ([`RegionBuf::join`]), the region comes back
//!   when no piece is left ([`RegionBuf::into_region`]), and dropping the last piece frees it.
//! - The CPU reaches the bytes only through the owner, by copies in and out
//!   ([`RegionBuf::read`], [`RegionBuf::write`]; volatile for device memory): never a Rust
//!   reference.
//!
//! So a buffer moved into a command (a queue pair takes it by value and hands it back with the
//! completion) can neither be read or written by the CPU nor put into a second command until it
//! comes back. Raw pointers ([`RegionBuf::as_ptr`]) are for registering memory with another
//! device; dereferencing them is `unsafe`, and the caller answers for it.

use std::fmt;
use std::sync::Arc;

use crate::error::DmaError;
use crate::hugepage::PageSize;
use crate::mapper::MapKind;
use crate::rawmem::Piece;
use crate::region::DmaRegion;
use crate::register::PeerRegion;
use vfpoll_pci::BusAddr;

/// The range `offset..offset+len` of a piece of `size` bytes, as a piece; the bytes around it
/// are dropped (their memory stays allocated while the range lives).
fn narrow<T>(mut whole: Piece<T>, offset: usize, len: usize) -> Result<Piece<T>, DmaError> {
    let size = whole.mem().len();
    match offset.checked_add(len) {
        Some(end) if end <= size => {
            drop(whole.split_off(end));
            Ok(whole.split_off(offset))
        }
        _ => Err(DmaError::OutOfBounds { offset, len, size }),
    }
}

/// The methods that [`RegionBuf`] and [`DeviceBuf`] share, over their `piece` field.
macro_rules! piece_methods {
    ($region:ident) => {
        /// Splits off bytes `at..` as a buffer of their own; `self` keeps `..at`. The two share
        /// the region and own disjoint bytes.
        ///
        /// # Panics
        /// If `at > len()`.
        pub fn split_off(&mut self, at: usize) -> Self {
            Self {
                piece: self.piece.split_off(at),
            }
        }

        /// `(..at, at..)`: [`Self::split_off`] that keeps both halves together.
        ///
        /// # Panics
        /// If `at > len()`.
        pub fn split_at(mut self, at: usize) -> (Self, Self) {
            let tail = self.split_off(at);
            (self, tail)
        }

        /// `self` and `next` as one buffer, if `next` is a piece of the same region that starts
        /// where `self` ends; both back unchanged otherwise.
        pub fn join(self, next: Self) -> Result<Self, (Self, Self)> {
            match self.piece.join(next.piece) {
                Ok(piece) => Ok(Self { piece }),
                Err((a, b)) => Err((Self { piece: a }, Self { piece: b })),
            }
        }

        /// The region back, once this is its last piece (every other piece dropped or joined
        /// into this one, and nothing else holding the region); the buffer back otherwise. A
        /// piece a driver kept because the device may still write it (leaked on a timeout)
        /// never comes back, so neither does its region.
        pub fn into_region(self) -> Result<$region, Self> {
            self.piece.into_owner().map_err(|piece| Self { piece })
        }

        /// Length in bytes.
        pub fn len(&self) -> usize {
            self.piece.mem().len()
        }

        /// Whether the buffer holds no bytes.
        pub fn is_empty(&self) -> bool {
            self.len() == 0
        }

        /// Where the buffer starts in its region.
        pub fn offset(&self) -> usize {
            self.piece.offset()
        }

        /// The CPU address of the buffer's start, for registering the memory with another
        /// device. Never make a reference from it; reading or writing through it is the
        /// caller's `unsafe` business, outside the ownership rule.
        pub fn as_ptr(&self) -> *mut u8 {
            self.piece.mem().ptr()
        }
    };
}

/// An owned range of a host [`DmaRegion`] (see the [module docs](self)): the region is moved in,
/// the buffer splits into disjoint pieces, and the CPU reaches the bytes only through the
/// buffer's owner.
///
/// ```
/// use vfpoll_dma::{DmaContext, PageSize, RegionBuf};
/// let region = DmaContext::for_testing().alloc_region(8192, PageSize::Base4K)?;
/// let mut a = RegionBuf::whole(region);        // the region is gone: only `a` reaches it
/// let mut b = a.split_off(4096);               // two owners of disjoint halves
/// a.write(0, b"first")?;
/// b.write(0, b"second")?;
/// let mut out = [0u8; 6];
/// b.read(0, &mut out)?;
/// assert_eq!(&out, b"second");
/// assert_eq!(b.bus_addr(0), a.bus_addr(0).add(4096));
/// let whole = a.join(b).expect("adjacent pieces of one region");
/// let region = whole.into_region().expect("the last piece");
/// assert_eq!(region.len(), 8192);
/// # Ok::<(), vfpoll_dma::DmaError>(())
/// ```
pub struct RegionBuf {
    piece: Piece<DmaRegion>,
}

impl fmt::Debug for RegionBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegionBuf")
            .field("offset", &self.offset())
            .field("len", &self.len())
            .field("ptr", &self.as_ptr())
            .finish()
    }
}

impl From<DmaRegion> for RegionBuf {
    fn from(region: DmaRegion) -> Self {
        RegionBuf::whole(region)
    }
}

impl RegionBuf {
    /// The whole region.
    pub fn whole(region: DmaRegion) -> Self {
        RegionBuf {
            piece: region.into_piece(),
        }
    }

    /// `len` bytes of `region` from `offset`. The bytes around them are unreachable until the
    /// region comes back ([`RegionBuf::into_region`]); split [`RegionBuf::whole`] to use them.
    pub fn new(region: DmaRegion, offset: usize, len: usize) -> Result<Self, DmaError> {
        Ok(RegionBuf {
            piece: narrow(region.into_piece(), offset, len)?,
        })
    }

    piece_methods!(DmaRegion);

    /// The address a device uses for the byte at `off`.
    ///
    /// # Panics
    /// If `off >= len()`.
    pub fn bus_addr(&self, off: usize) -> BusAddr {
        assert!(
            off < self.len(),
            "offset {off:#x} outside the {:#x}-byte buffer",
            self.len()
        );
        self.piece.owner().bus_addr(self.offset() + off)
    }

    /// Bytes from `off` on that are contiguous on the bus, within the buffer (0 if
    /// `off >= len()`). Behind an IOMMU the whole rest of the buffer; without one, up to a
    /// page boundary at least.
    pub fn contiguous_len(&self, off: usize) -> usize {
        if off >= self.len() {
            return 0;
        }
        let region = self.piece.owner();
        region.contiguous_len(self.offset() + off).min(self.len() - off)
    }

    /// The page size backing the buffer.
    pub fn page_size(&self) -> PageSize {
        self.piece.owner().page_size()
    }

    /// Whether the device reaches the buffer through an IOMMU.
    pub fn map_kind(&self) -> MapKind {
        self.piece.owner().map_kind()
    }

    /// Copies from the buffer at `off` into `dst`. After a device wrote it, call this once the
    /// buffer is back from the command (its completion seen).
    pub fn read(&self, off: usize, dst: &mut [u8]) -> Result<(), DmaError> {
        self.piece.mem().read(off, dst)
    }

    /// Copies `src` into the buffer at `off`.
    pub fn write(&mut self, off: usize, src: &[u8]) -> Result<(), DmaError> {
        self.piece.mem_mut().write(off, src)
    }

    /// Sets `len` bytes at `off` to `byte`.
    pub fn fill(&mut self, off: usize, len: usize, byte: u8) -> Result<(), DmaError> {
        self.piece.mem_mut().fill(off, len, byte)
    }

    /// A handle that keeps the whole region allocated and mapped, with no access to its bytes:
    /// for another device that uses the region by its CPU address (a GPU driver that
    /// registered it) while its pieces come and go. [`RegionBuf::into_region`] fails while a
    /// hold is alive.
    pub fn hold(&self) -> RegionHold {
        RegionHold(Arc::clone(self.piece.owner()))
    }
}

/// Keeps a [`DmaRegion`] allocated and mapped without any access to its bytes (from
/// [`RegionBuf::hold`]). Cloning it only keeps the region longer; forgetting one leaks the
/// region on purpose (memory a device may still write into).
#[derive(Clone)]
pub struct RegionHold(Arc<DmaRegion>);

impl fmt::Debug for RegionHold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RegionHold").field(&*self.0).finish()
    }
}

impl RegionHold {
    /// Start of the region in the CPU's address space (never make a reference from it).
    pub fn as_ptr(&self) -> *mut u8 {
        self.0.as_ptr()
    }

    /// Length of the whole region in bytes.
    #[expect(
        clippy::len_without_is_empty,
        reason = "never empty: zero-length regions are refused"
    )]
    pub fn len(&self) -> usize {
        self.0.len()
    }
}

/// An owned range of another device's memory (a GPU BAR, a peer's CMB, any BAR registered as a
/// DMA target with [`crate::DmaContext::register_peer_bar`]), for peer-to-peer DMA: a device
/// reads or writes it directly, with no CPU copy. The same rule as for [`RegionBuf`] (see the
/// [module docs](self)); the CPU copies go through the registered BAR mapping with volatile
/// accesses.
///
/// The BAR's own mapping (whoever mapped it before registering it) lies outside this rule:
/// registration is `unsafe`, and its caller answers for not touching bytes that a buffer in a
/// command covers.
pub struct DeviceBuf {
    piece: Piece<PeerRegion>,
}

impl fmt::Debug for DeviceBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuf")
            .field("offset", &self.offset())
            .field("len", &self.len())
            .field("cpu", &self.as_ptr())
            .finish()
    }
}

impl From<PeerRegion> for DeviceBuf {
    fn from(region: PeerRegion) -> Self {
        DeviceBuf::whole(region)
    }
}

impl DeviceBuf {
    /// The whole registered BAR range.
    pub fn whole(region: PeerRegion) -> Self {
        DeviceBuf {
            piece: region.into_piece(),
        }
    }

    /// `len` bytes of `region` from `offset`; the bytes around them are unreachable until the
    /// region comes back ([`DeviceBuf::into_region`]).
    pub fn new(region: PeerRegion, offset: usize, len: usize) -> Result<Self, DmaError> {
        Ok(DeviceBuf {
            piece: narrow(region.into_piece(), offset, len)?,
        })
    }

    piece_methods!(PeerRegion);

    /// The address a DMA-issuing device uses for the byte at `off` (the IOVA behind an IOMMU,
    /// the BAR's bus address without one).
    ///
    /// # Panics
    /// If `off >= len()`.
    pub fn bus_addr(&self, off: usize) -> BusAddr {
        assert!(
            off < self.len(),
            "offset {off:#x} outside the {:#x}-byte buffer",
            self.len()
        );
        self.piece.owner().bus_addr(self.offset() + off)
    }

    /// Bytes from `off` on that are contiguous on the bus: the rest of the buffer (a BAR is
    /// contiguous, and behind an IOMMU it is mapped at one IOVA range); 0 if `off >= len()`.
    pub fn contiguous_len(&self, off: usize) -> usize {
        self.len().saturating_sub(off)
    }

    /// Copies from the buffer at `off` into `dst` with volatile byte and 32-bit accesses.
    pub fn read(&self, off: usize, dst: &mut [u8]) -> Result<(), DmaError> {
        self.piece.mem().copy_from_volatile(off, dst)
    }

    /// Copies `src` into the buffer at `off` with volatile byte and 32-bit accesses.
    pub fn write(&mut self, off: usize, src: &[u8]) -> Result<(), DmaError> {
        self.piece.mem_mut().copy_to_volatile(off, src)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DmaContext, FakeMapper};

    const P: usize = 4096;

    fn region(ctx: &DmaContext, pages: usize) -> DmaRegion {
        ctx.alloc_region(pages * P, PageSize::Base4K).unwrap()
    }

    #[test]
    fn pieces_own_disjoint_bytes_and_join_back() {
        let ctx = DmaContext::for_testing();
        let r = region(&ctx, 4);
        let (ptr, bus) = (r.as_ptr(), r.bus_addr(0));
        let mut a = RegionBuf::whole(r);
        let mut c = a.split_off(2 * P);
        let mut b = a.split_off(P);
        assert_eq!(
            (a.offset(), a.len(), b.offset(), b.len(), c.offset(), c.len()),
            (0, P, P, P, 2 * P, 2 * P)
        );
        assert_eq!(b.as_ptr(), ptr.wrapping_add(P));
        assert_eq!(c.bus_addr(1), bus.add(2 * P as u64 + 1));
        assert_eq!(b.contiguous_len(10), P - 10, "clipped to the piece");
        assert_eq!(b.contiguous_len(P), 0);
        a.fill(0, P, 0xaa).unwrap();
        b.fill(0, P, 0xbb).unwrap();
        c.write(0, b"c").unwrap();
        assert!(
            a.write(P - 1, &[1, 2]).is_err(),
            "a piece cannot write into its neighbour"
        );
        assert!(b.read(1, &mut [0; P]).is_err());
        let mut out = [0u8; 2];
        b.read(P - 2, &mut out).unwrap();
        assert_eq!(out, [0xbb; 2], "a's write stayed in a");

        // Only adjacent pieces of one region join; both come back otherwise.
        let (c, a) = c.join(a).unwrap_err();
        let other = RegionBuf::whole(region(&ctx, 1));
        let (a, other) = a.join(other).unwrap_err();
        let a = a.into_region().unwrap_err();
        let ab = a.join(b).unwrap();
        let abc = ab.join(c).unwrap();
        assert_eq!((abc.offset(), abc.len()), (0, 4 * P));
        let mut all = vec![0u8; 4 * P];
        abc.read(0, &mut all).unwrap();
        assert!(all[..P].iter().all(|&x| x == 0xaa) && all[P..2 * P].iter().all(|&x| x == 0xbb));
        assert_eq!(&all[2 * P..2 * P + 1], b"c");
        let r = abc.into_region().unwrap();
        assert_eq!((r.as_ptr(), r.len()), (ptr, 4 * P));
        drop(other);
    }

    #[test]
    fn split_at_the_ends_and_narrow_ranges() {
        let ctx = DmaContext::for_testing();
        let (empty, all) = RegionBuf::whole(region(&ctx, 1)).split_at(0);
        assert!(empty.is_empty() && all.len() == P);
        assert_eq!(empty.contiguous_len(0), 0);
        let (all, end) = all.split_at(P);
        assert!(end.is_empty() && end.offset() == P);
        drop((empty, end, all));

        let b = RegionBuf::new(region(&ctx, 2), 100, 5000).unwrap();
        assert_eq!((b.offset(), b.len()), (100, 5000));
        let b = b
            .into_region()
            .expect("the bytes around the range are dropped, not pieces");
        assert!(matches!(
            RegionBuf::new(b, 8000, 193),
            Err(DmaError::OutOfBounds {
                offset: 8000,
                len: 193,
                size: 8192
            })
        ));
        assert!(RegionBuf::new(region(&ctx, 1), usize::MAX, 2).is_err());
    }

    #[test]
    #[should_panic(expected = "cannot split a 4096-byte buffer at 4097")]
    fn splitting_past_the_end_panics() {
        let mut b = RegionBuf::whole(region(&DmaContext::for_testing(), 1));
        let _ = b.split_off(P + 1);
    }

    #[test]
    fn the_region_is_unmapped_with_its_last_piece_and_kept_by_a_hold() {
        let mapper = Arc::new(FakeMapper::new());
        let ctx = DmaContext::new(mapper.clone());
        let (a, b) = RegionBuf::whole(region(&ctx, 2)).split_at(P);
        let hold = a.hold();
        assert_eq!(hold.len(), 2 * P);
        let a = a.into_region().unwrap_err();
        drop(a);
        let b = b.into_region().unwrap_err();
        assert!(!mapper.live_mappings().is_empty());
        drop(b);
        assert!(!mapper.live_mappings().is_empty(), "the hold keeps the region");
        drop(hold);
        assert!(
            mapper.live_mappings().is_empty(),
            "the last owner gone, the region is freed"
        );
    }

    #[test]
    fn device_bufs_split_and_copy_with_volatile_accesses() {
        let ctx = DmaContext::for_testing();
        // Ordinary memory stands in for the BAR (as in the other peer-BAR tests).
        let bar = crate::HugeMem::alloc(2 * P as u64, PageSize::Base4K, "/sys".as_ref()).unwrap();
        // SAFETY: the stand-in BAR is ordinary memory that outlives the region and takes any
        // access; nothing else touches it.
        let peer =
            unsafe { ctx.register_peer_bar(bar.as_ptr(), 2 * P as u64, BusAddr(0xe000_0000)) }.unwrap();
        let iova = peer.bus_addr(0);
        let mut whole = DeviceBuf::whole(peer);
        let mut tail = whole.split_off(P + 3);
        assert_eq!((tail.offset(), tail.len()), (P + 3, P - 3));
        assert_eq!(tail.bus_addr(0), iova.add(P as u64 + 3));
        assert_eq!(tail.contiguous_len(1), P - 4);
        tail.write(1, b"peer bytes").unwrap();
        assert!(whole.write(P, &[1, 2, 3, 4]).is_err(), "the head ends at P + 3");
        let mut got = [0u8; 10];
        tail.read(1, &mut got).unwrap();
        assert_eq!(&got, b"peer bytes");
        let peer = whole.join(tail).unwrap().into_region().unwrap();
        let mut raw = [0u8; 10];
        peer.copy_from_device(P + 4, &mut raw).unwrap();
        assert_eq!(&raw, b"peer bytes");
        drop(peer);
        drop(bar);
    }
}
