//! Bounds-checked access to memory a device can read or write, without ever forming a Rust
//! reference to it.
//!
//! Plain copies (`ptr::copy_nonoverlapping`, `write_bytes`) are used for host DMA memory: the
//! caller orders them against the device (write the buffer, then `fence(Release)`, then ring the
//! doorbell; poll a completion with a volatile read, then `fence(Acquire)`, then copy out).
//! Volatile single accesses serve fields the device updates while we poll (phase bits), and
//! volatile loops serve MMIO (a peer's BAR), where every access is a bus transaction.
//!
//! Exclusive access is expressed by `&mut self` on every writing method; the types that own a
//! `RawMem` keep that (writes take `&mut self` there too), so two threads can never race on the
//! same bytes through this API. [`Piece`] carries that rule over to memory shared by several
//! owners: a region cut into disjoint pieces, each the one accessor of its bytes.

use std::ptr::{self, NonNull};
use std::sync::Arc;

use crate::error::DmaError;

mod sealed {
    pub trait Sealed {}
}

/// The unsigned integers that can be read and written with single volatile accesses
/// (`u8`, `u16`, `u32`, `u64`). Accesses must be naturally aligned.
pub trait VolatileWord: Copy + sealed::Sealed {}

macro_rules! word {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl VolatileWord for $t {}
    )*};
}
word!(u8, u16, u32, u64);

/// A pointer and a length, with checked raw access.
#[derive(Debug)]
pub(crate) struct RawMem {
    ptr: NonNull<u8>,
    len: usize,
}

impl RawMem {
    /// # Safety
    /// `ptr..ptr+len` is valid for reads and writes (host memory, or MMIO that tolerates the
    /// access widths used) for as long as this value lives, and no Rust reference points into
    /// it during that time. The owner of this value is the only user of these accessors on
    /// that range.
    pub(crate) unsafe fn new(ptr: NonNull<u8>, len: usize) -> Self {
        RawMem { ptr, len }
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The address of `offset`, if `offset..offset+n` lies inside.
    fn at(&self, offset: usize, n: usize) -> Result<*mut u8, DmaError> {
        match offset.checked_add(n) {
            Some(end) if end <= self.len => Ok(self.ptr.as_ptr().wrapping_add(offset)),
            _ => Err(DmaError::OutOfBounds {
                offset,
                len: n,
                size: self.len,
            }),
        }
    }

    fn at_word<T: VolatileWord>(&self, offset: usize) -> Result<*mut T, DmaError> {
        let p = self.at(offset, size_of::<T>())?;
        let align = align_of::<T>();
        if p.addr() % align != 0 {
            return Err(DmaError::Misaligned {
                what: "offset",
                value: offset as u64,
                align: align as u64,
            });
        }
        Ok(p.cast())
    }

    pub(crate) fn write(&mut self, offset: usize, src: &[u8]) -> Result<(), DmaError> {
        let dst = self.at(offset, src.len())?;
        // SAFETY: `dst..dst+len` is inside our range (checked by `at`), valid for writes by the
        // contract of `new`; `src` is a Rust slice, so it cannot overlap memory that no
        // reference may point into.
        unsafe { ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        Ok(())
    }

    pub(crate) fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), DmaError> {
        let src = self.at(offset, dst.len())?;
        // SAFETY: as in `write`, with the roles swapped: `src` range checked and readable,
        // `dst` an exclusive Rust slice disjoint from DMA memory.
        unsafe { ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    pub(crate) fn fill(&mut self, offset: usize, n: usize, byte: u8) -> Result<(), DmaError> {
        let dst = self.at(offset, n)?;
        // SAFETY: `dst..dst+n` checked to be inside our writable range.
        unsafe { ptr::write_bytes(dst, byte, n) };
        Ok(())
    }

    pub(crate) fn read_volatile<T: VolatileWord>(&self, offset: usize) -> Result<T, DmaError> {
        let p = self.at_word::<T>(offset)?;
        // SAFETY: in range, naturally aligned, readable; T is a plain integer, valid for any bits.
        Ok(unsafe { p.read_volatile() })
    }

    pub(crate) fn write_volatile<T: VolatileWord>(&mut self, offset: usize, v: T) -> Result<(), DmaError> {
        let p = self.at_word::<T>(offset)?;
        // SAFETY: in range, naturally aligned, writable.
        unsafe { p.write_volatile(v) };
        Ok(())
    }

    /// Copies out with volatile accesses: bytes up to a 4-byte boundary, then 32-bit words, then
    /// the remaining bytes (MMIO: every access reaches the device, none is merged or elided).
    pub(crate) fn copy_from_volatile(&self, offset: usize, dst: &mut [u8]) -> Result<(), DmaError> {
        let src = self.at(offset, dst.len())?;
        let (head, words, _) = split_words(src.addr(), dst.len());
        let mut i = 0;
        while i < dst.len() {
            if i >= head && i < head + words * 4 {
                // SAFETY: `src+i .. src+i+4` is inside the checked range and 4-byte aligned
                // (split_words starts the words at an aligned address).
                let w = unsafe { src.wrapping_add(i).cast::<u32>().read_volatile() };
                // Native byte order keeps the bytes in memory order.
                dst[i..i + 4].copy_from_slice(&w.to_ne_bytes());
                i += 4;
            } else {
                // SAFETY: `src+i` is inside the checked range; a byte needs no alignment.
                dst[i] = unsafe { src.wrapping_add(i).read_volatile() };
                i += 1;
            }
        }
        Ok(())
    }

    /// Copies in with volatile accesses, split like [`RawMem::copy_from_volatile`].
    pub(crate) fn copy_to_volatile(&mut self, offset: usize, src: &[u8]) -> Result<(), DmaError> {
        let dst = self.at(offset, src.len())?;
        let (head, words, _) = split_words(dst.addr(), src.len());
        let mut i = 0;
        while i < src.len() {
            if i >= head && i < head + words * 4 {
                let w = u32::from_ne_bytes([src[i], src[i + 1], src[i + 2], src[i + 3]]);
                // SAFETY: `dst+i .. dst+i+4` is inside the checked range and 4-byte aligned.
                unsafe { dst.wrapping_add(i).cast::<u32>().write_volatile(w) };
                i += 4;
            } else {
                // SAFETY: `dst+i` is inside the checked range.
                unsafe { dst.wrapping_add(i).write_volatile(src[i]) };
                i += 1;
            }
        }
        Ok(())
    }
}

/// An exclusive piece of memory that `T` owns: the one accessor of a range of `T`'s memory,
/// split from and joined with the other pieces of the same `T`. The `Arc` keeps the memory
/// alive; the pieces use it only to ask `T` for addresses, never to reach the memory, so while
/// any piece lives the pieces are the only accessors of `T`'s memory and no two share a byte.
pub(crate) struct Piece<T> {
    owner: Arc<T>,
    /// Where `mem` starts in `T`'s memory.
    offset: usize,
    mem: RawMem,
}

// SAFETY: a piece is the only accessor of its range (the contract of `Piece::new`, kept by
// `split_off` and `join`) and holds no reference into it, so moving it to another thread moves
// that sole access; `Arc<T>` is Send for `T: Send + Sync`.
unsafe impl<T: Send + Sync> Send for Piece<T> {}

impl<T> std::fmt::Debug for Piece<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Piece")
            .field("offset", &self.offset)
            .field("ptr", &self.mem.ptr)
            .field("len", &self.mem.len)
            .finish()
    }
}

impl<T> Piece<T> {
    /// All of `T`'s memory, `base..base+len`, as one piece.
    ///
    /// # Safety
    /// `base..base+len` is valid for reads and writes (host memory, or MMIO that tolerates the
    /// access widths used) for as long as `owner` lives. From now on nothing reaches it except
    /// through this piece and the pieces split from it (whoever holds `T`'s own accessors keeps
    /// them unused while `owner` is shared), and no Rust reference points into it.
    pub(crate) unsafe fn new(owner: Arc<T>, base: NonNull<u8>, len: usize) -> Self {
        Piece {
            owner,
            offset: 0,
            mem: RawMem { ptr: base, len },
        }
    }

    /// The owner, for addresses (never for access to the memory).
    pub(crate) fn owner(&self) -> &Arc<T> {
        &self.owner
    }

    /// Where the piece starts in its owner's memory.
    pub(crate) fn offset(&self) -> usize {
        self.offset
    }

    /// The piece's memory (reads).
    pub(crate) fn mem(&self) -> &RawMem {
        &self.mem
    }

    /// The piece's memory (writes).
    pub(crate) fn mem_mut(&mut self) -> &mut RawMem {
        &mut self.mem
    }

    /// Splits off bytes `at..` as a new piece; `self` keeps `..at`.
    ///
    /// # Panics
    /// If `at > len`.
    pub(crate) fn split_off(&mut self, at: usize) -> Self {
        let len = self.mem.len;
        assert!(at <= len, "cannot split a {len}-byte buffer at {at}");
        // SAFETY: `at <= len`, so the result is inside our range or one past its end.
        let ptr = unsafe { self.mem.ptr.add(at) };
        self.mem.len = at;
        // Built directly, not with `RawMem::new`: the range `at..len` was ours and `self` gave it
        // up just above, so it keeps exactly one accessor and the same validity (the owner).
        Piece {
            owner: Arc::clone(&self.owner),
            offset: self.offset + at,
            mem: RawMem { ptr, len: len - at },
        }
    }

    /// One piece from `self` and `next`, which must be pieces of the same owner with `next`
    /// starting where `self` ends; both back unchanged otherwise.
    pub(crate) fn join(self, next: Self) -> Result<Self, (Self, Self)> {
        if !Arc::ptr_eq(&self.owner, &next.owner) || self.offset + self.mem.len != next.offset {
            return Err((self, next));
        }
        // Same owner and adjacent in its memory: the union is one range of it, whose two
        // accessors become one.
        Ok(Piece {
            mem: RawMem {
                ptr: self.mem.ptr,
                len: self.mem.len + next.mem.len,
            },
            ..self
        })
    }

    /// The owner back, if no other piece (and no other holder of the `Arc`) is left; the
    /// piece back otherwise.
    pub(crate) fn into_owner(self) -> Result<T, Self> {
        let Piece { owner, offset, mem } = self;
        Arc::try_unwrap(owner).map_err(|owner| Piece { owner, offset, mem })
    }
}

/// Splits `len` bytes at address `addr` into (head bytes, whole aligned u32 words, tail bytes).
fn split_words(addr: usize, len: usize) -> (usize, usize, usize) {
    let head = (addr.wrapping_neg() % 4).min(len);
    let words = (len - head) / 4;
    (head, words, len - head - words * 4)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem(buf: &mut [u64]) -> RawMem {
        let len = buf.len() * 8;
        // SAFETY: the test keeps `buf` alive and untouched while the RawMem is used.
        unsafe { RawMem::new(NonNull::new(buf.as_mut_ptr().cast()).unwrap(), len) }
    }

    #[test]
    fn bounds_are_checked() {
        let mut backing = [0u64; 8];
        let mut m = mem(&mut backing);
        assert!(m.write(60, &[1, 2, 3, 4]).is_ok());
        assert!(matches!(
            m.write(61, &[1, 2, 3, 4]),
            Err(DmaError::OutOfBounds {
                offset: 61,
                len: 4,
                size: 64
            })
        ));
        assert!(m.read(usize::MAX, &mut [0u8; 2]).is_err(), "offset overflow");
        assert!(m.fill(0, 65, 0).is_err());
        assert!(m.fill(64, 0, 0).is_ok());
        assert!(m.read_volatile::<u64>(57).is_err());
        assert!(matches!(
            m.read_volatile::<u32>(2),
            Err(DmaError::Misaligned { .. })
        ));
        assert!(m.write_volatile::<u16>(62, 7).is_ok());
        assert!(m.write_volatile::<u16>(64, 7).is_err());
    }

    #[test]
    fn copies_round_trip() {
        let mut backing = [0u64; 8];
        let mut m = mem(&mut backing);
        m.fill(0, 64, 0xee).unwrap();
        m.write(3, b"hello dma").unwrap();
        let mut out = [0u8; 11];
        m.read(2, &mut out).unwrap();
        assert_eq!(&out, b"\xeehello dma\xee");
        m.write_volatile::<u32>(16, 0x1122_3344).unwrap();
        assert_eq!(m.read_volatile::<u32>(16).unwrap(), 0x1122_3344);
        assert_eq!(
            m.read_volatile::<u8>(16).unwrap(),
            0x1122_3344u32.to_ne_bytes()[0]
        );
    }

    #[test]
    fn volatile_copies_match_plain_copies_at_every_alignment() {
        for off in 0..8 {
            for len in 0..24 {
                let mut backing = [0u64; 8];
                let mut m = mem(&mut backing);
                let pattern: Vec<u8> = (0..len as u8)
                    .map(|i| i.wrapping_mul(37).wrapping_add(off as u8))
                    .collect();
                m.fill(0, 64, 0xaa).unwrap();
                m.copy_to_volatile(off, &pattern).unwrap();
                let mut plain = vec![0u8; 64];
                m.read(0, &mut plain).unwrap();
                let mut want = vec![0xaau8; 64];
                want[off..off + len].copy_from_slice(&pattern);
                assert_eq!(plain, want, "copy_to_volatile off {off} len {len}");
                let mut back = vec![0u8; len];
                m.copy_from_volatile(off, &mut back).unwrap();
                assert_eq!(back, pattern, "copy_from_volatile off {off} len {len}");
            }
        }
        assert_eq!(split_words(0x1001, 10), (3, 1, 3));
        assert_eq!(split_words(0x1000, 3), (0, 0, 3));
        assert_eq!(split_words(0x1003, 1), (1, 0, 0));
    }
}
