//! [`DmaPool`]: fixed-size DMA buffers for the hot path.
//!
//! One [`DmaRegion`] is carved into `count` buffers of `buf_size` bytes. The size is a power of
//! two of at least 512 bytes. Up to the page size ([`PoolLayout::new`]) a buffer never straddles
//! a page, so each one is contiguous on the bus even without an IOMMU. Behind an IOMMU a buffer
//! may span several pages ([`PoolLayout::spanning`]): the region sits at one contiguous IOVA
//! range, so its buffers are bus-contiguous whatever the page size (128 KiB buffers on 4 KiB
//! pages, for machines without hugepages). The free list is a stack of indices allocated once,
//! at construction: `alloc` and `free` never allocate, lock or make a system call.

use std::cell::Cell;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;

use crate::error::DmaError;
use crate::hugepage::PageSize;
use crate::region::DmaRegion;
use vfpoll_pci::BusAddr;

/// Smallest buffer: one NVMe sector / a comfortable Ethernet frame fragment.
pub const MIN_BUF_SIZE: usize = 512;

/// How a pool is laid out in its region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolLayout {
    /// Bytes per buffer.
    pub buf_size: usize,
    /// Number of buffers.
    pub count: usize,
    /// Buffers per page (0: each buffer spans `buf_size / page` pages; see
    /// [`PoolLayout::spanning`]).
    pub bufs_per_page: usize,
    /// Bytes of region needed (whole pages).
    pub region_len: usize,
}

impl PoolLayout {
    /// Checks `buf_size` and `count` against `page_size` and works out the region size.
    pub fn new(buf_size: usize, count: usize, page_size: PageSize) -> Result<Self, DmaError> {
        let page = page_size.bytes() as usize;
        let bad = |reason| DmaError::BadPoolGeometry {
            buf_size,
            count,
            page_size,
            reason,
        };
        if !buf_size.is_power_of_two() || buf_size < MIN_BUF_SIZE {
            return Err(bad(
                "the buffer size must be a power of two of at least 512 bytes",
            ));
        }
        if buf_size > page {
            return Err(bad(
                "a buffer larger than a page is contiguous on the bus only behind an IOMMU: use a larger \
                 page size (2 MiB hugepages), or chain smaller buffers",
            ));
        }
        if count == 0 || u32::try_from(count).is_err() {
            return Err(bad("the count must be between 1 and 2^32 - 1"));
        }
        let region_len = count
            .checked_mul(buf_size)
            .and_then(|b| b.checked_next_multiple_of(page))
            .ok_or_else(|| bad("the pool does not fit the address space: ask for fewer buffers"))?;
        Ok(PoolLayout {
            buf_size,
            count,
            bufs_per_page: page / buf_size,
            region_len,
        })
    }

    /// Like [`PoolLayout::new`], but buffers larger than a page are allowed too: each then spans
    /// `buf_size / page` whole pages. Only a region mapped behind an IOMMU (one contiguous IOVA
    /// range) keeps such a buffer contiguous on the bus; [`crate::DmaContext::pool`] uses this
    /// layout only there.
    pub fn spanning(buf_size: usize, count: usize, page_size: PageSize) -> Result<Self, DmaError> {
        let page = page_size.bytes() as usize;
        if buf_size <= page || !buf_size.is_power_of_two() {
            return Self::new(buf_size, count, page_size);
        }
        // A one-page buffer passes every check but the size; its geometry is then scaled up.
        let one = Self::new(page, count, page_size).map_err(|e| match e {
            DmaError::BadPoolGeometry { reason, .. } => DmaError::BadPoolGeometry {
                buf_size,
                count,
                page_size,
                reason,
            },
            other => other,
        })?;
        let region_len = one
            .region_len
            .checked_mul(buf_size / page)
            .ok_or(DmaError::BadPoolGeometry {
                buf_size,
                count,
                page_size,
                reason: "the pool does not fit the address space: ask for fewer buffers",
            })?;
        Ok(PoolLayout {
            buf_size,
            count,
            bufs_per_page: 0,
            region_len,
        })
    }

    /// Byte offset of buffer `index` in the region.
    pub fn offset(&self, index: usize) -> usize {
        index * self.buf_size
    }
}

/// A buffer taken from a [`DmaPool`]. It cannot be made or copied outside this crate, so
/// whoever holds it owns the buffer until giving it back with [`DmaPool::free`].
///
/// It carries only addresses: read and write the buffer through the pool
/// ([`DmaPool::write`], [`DmaPool::read`]), which proves the memory is still alive, or through
/// the raw pointer with `ptr` copies (never a reference).
#[derive(Debug)]
pub struct DmaBuf {
    index: u32,
    len: u32,
    ptr: NonNull<u8>,
    bus: BusAddr,
}

// SAFETY: a DmaBuf is a unique handle (not Clone) holding addresses only; no method touches the
// memory, so handing it to another thread (for example to free it there) is sound.
unsafe impl Send for DmaBuf {}

impl DmaBuf {
    /// Start of the buffer in the CPU's address space.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The address a device uses for the start of the buffer (contiguous for `len()` bytes).
    pub fn bus_addr(&self) -> BusAddr {
        self.bus
    }

    /// Size in bytes: the pool's buffer size, or less after [`DmaBuf::truncate`]. This is what
    /// a device may move to or from the buffer.
    #[expect(clippy::len_without_is_empty, reason = "buffers are never empty")]
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Uses only the first `len` bytes (1..=`len()`) from now on: for transfers that are not a
    /// power of two, such as blocks of data plus metadata (8 x 520 bytes). The pool takes the
    /// buffer back whole. Panics if `len` is 0 or more than the buffer holds.
    pub fn truncate(&mut self, len: usize) {
        assert!(
            len != 0 && len <= self.len as usize,
            "a DmaBuf of {} bytes cannot be truncated to {len}",
            self.len
        );
        self.len = len as u32;
    }

    /// The buffer's index in its pool (stable; useful as a tag in a descriptor).
    pub fn index(&self) -> usize {
        self.index as usize
    }
}

/// Fixed-size DMA buffers with a preallocated free stack. `Send`, not `Sync`: one pool per
/// queue / thread, `&mut self` to take and give back.
///
/// Dropping a pool while buffers are still out leaks its region (logged) instead of freeing
/// memory that a device may still write into.
pub struct DmaPool {
    region: ManuallyDrop<DmaRegion>,
    layout: PoolLayout,
    /// The free buffers, each with its CPU and bus address worked out once (`alloc` is a pop,
    /// `free` a push of what the `DmaBuf` carries); capacity `count`, never reallocated.
    free: Vec<FreeBuf>,
    /// The region's start, as an address: a buffer is this pool's when its pointer lies in
    /// `base..base + span` (see [`DmaPool::owns`]).
    base: usize,
    /// `count * buf_size`: the bytes the buffers cover.
    span: usize,
    _not_sync: PhantomData<Cell<()>>,
}

/// A free buffer on the stack: what `alloc` puts in a [`DmaBuf`] (all but the length).
#[derive(Debug, Clone, Copy)]
struct FreeBuf {
    ptr: NonNull<u8>,
    bus: BusAddr,
    index: u32,
}

// SAFETY: the pool owns its region (Send); the pointers in `free` point into that region and
// are only copied into `DmaBuf` handles (themselves Send), never dereferenced by the pool outside
// its `&mut self`/`&self` methods, which go through the region.
unsafe impl Send for DmaPool {}

impl std::fmt::Debug for DmaPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DmaPool")
            .field("layout", &self.layout)
            .field("available", &self.free.len())
            .field("region", &*self.region)
            .finish()
    }
}

impl DmaPool {
    /// A pool over `region`, which must be at least `layout.region_len` bytes.
    pub(crate) fn new(region: DmaRegion, layout: PoolLayout) -> Self {
        assert!(
            region.len() >= layout.region_len,
            "pool region too small for its layout"
        );
        // Buffers start at multiples of their size: inside one page, or on page boundaries.
        let page = region.page_size().bytes() as usize;
        debug_assert!(page
            .max(layout.buf_size)
            .is_multiple_of(page.min(layout.buf_size)));
        debug_assert!(layout.bufs_per_page != 0 || region.iova().is_some());
        // Reversed, so the first alloc hands out buffer 0.
        let mut free = Vec::with_capacity(layout.count);
        free.extend((0..layout.count).rev().map(|i| {
            let off = layout.offset(i);
            let ptr = NonNull::new(region.as_ptr().wrapping_add(off)).expect("region pointer is non-null");
            FreeBuf {
                ptr,
                bus: region.bus_addr(off),
                index: i as u32,
            }
        }));
        DmaPool {
            base: region.as_ptr() as usize,
            span: layout.offset(layout.count),
            region: ManuallyDrop::new(region),
            layout,
            free,
            _not_sync: PhantomData,
        }
    }

    /// Takes a buffer; `None` when all are out. Never allocates.
    #[inline]
    pub fn alloc(&mut self) -> Option<DmaBuf> {
        let FreeBuf { ptr, bus, index } = self.free.pop()?;
        Some(DmaBuf {
            index,
            len: self.layout.buf_size as u32,
            ptr,
            bus,
        })
    }

    /// Gives a buffer back. Never allocates.
    ///
    /// A buffer of another pool is a bug: it panics in debug builds and is logged and dropped
    /// (not reused) in release builds.
    #[inline]
    pub fn free(&mut self, buf: DmaBuf) {
        if !self.owns(&buf) {
            debug_assert!(
                false,
                "DmaBuf {} at {:p} freed into a pool it does not belong to",
                buf.index, buf.ptr
            );
            log::error!(
                "DmaBuf {} at {:p} freed into a foreign pool: dropped",
                buf.index,
                buf.ptr
            );
            return;
        }
        debug_assert!(self.free.len() < self.free.capacity());
        self.free.push(FreeBuf {
            ptr: buf.ptr,
            bus: buf.bus,
            index: buf.index,
        });
    }

    /// Whether `buf` is one of this pool's buffers: its pointer lies in the buffers' span of
    /// this pool's region. As strong as comparing with the pool's own record of the buffer: a
    /// `DmaBuf` is made only by `alloc` (its fields are private, and only `len` ever changes),
    /// so a pointer into this region is this pool's buffer `index`; the regions of live pools
    /// are distinct memory, and a pool dropped with buffers out leaks its region (never
    /// reused), so no other pool's buffer points here.
    #[inline(always)]
    fn owns(&self, buf: &DmaBuf) -> bool {
        (buf.ptr.as_ptr() as usize).wrapping_sub(self.base) < self.span
    }

    fn checked(&self, buf: &DmaBuf, offset: usize, len: usize) -> Result<usize, DmaError> {
        if !self.owns(buf) {
            debug_assert!(
                false,
                "DmaBuf {} used with a pool it does not belong to",
                buf.index
            );
            return Err(DmaError::ForeignBuffer {
                index: buf.index as usize,
            });
        }
        match offset.checked_add(len) {
            Some(end) if end <= buf.len() => Ok(self.layout.offset(buf.index as usize) + offset),
            _ => Err(DmaError::OutOfBounds {
                offset,
                len,
                size: buf.len(),
            }),
        }
    }

    /// Copies `src` into `buf` at `offset`.
    pub fn write(&mut self, buf: &DmaBuf, offset: usize, src: &[u8]) -> Result<(), DmaError> {
        let at = self.checked(buf, offset, src.len())?;
        self.region.write(at, src)
    }

    /// Copies from `buf` at `offset` into `dst`.
    pub fn read(&self, buf: &DmaBuf, offset: usize, dst: &mut [u8]) -> Result<(), DmaError> {
        let at = self.checked(buf, offset, dst.len())?;
        self.region.read(at, dst)
    }

    /// Buffers free now.
    pub fn available(&self) -> usize {
        self.free.len()
    }

    /// Buffers in all.
    pub fn capacity(&self) -> usize {
        self.layout.count
    }

    /// Bytes per buffer.
    pub fn buf_size(&self) -> usize {
        self.layout.buf_size
    }

    /// Bytes of the region the buffers live in. The region itself is not handed out: a
    /// `&DmaRegion` could read the bytes of a buffer a device owns; buffers are read and
    /// written through the pool ([`DmaPool::read`], [`DmaPool::write`]) by their holder.
    pub fn region_len(&self) -> usize {
        self.region.len()
    }

    /// The bus address of byte `off` of the region.
    pub fn region_bus_addr(&self, off: usize) -> BusAddr {
        self.region.bus_addr(off)
    }

    /// Bus-contiguous bytes of the region from `off`.
    pub fn region_contiguous_len(&self, off: usize) -> usize {
        self.region.contiguous_len(off)
    }

    /// The region's start in the CPU's address space (a raw pointer: reaching the bytes
    /// through it is the caller's own `unsafe`).
    pub fn region_ptr(&self) -> *mut u8 {
        self.region.as_ptr()
    }
}

impl Drop for DmaPool {
    fn drop(&mut self) {
        let out = self.layout.count - self.free.len();
        if out == 0 {
            // SAFETY: `region` is dropped exactly once, here, and not used afterwards.
            unsafe { ManuallyDrop::drop(&mut self.region) };
        } else {
            log::warn!(
                "DMA pool dropped with {out} of {} buffers still out: leaking its {:#x}-byte region so a device cannot write into freed memory",
                self.layout.count,
                self.region.len()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_math() {
        let l = PoolLayout::new(2048, 1000, PageSize::Huge2M).unwrap();
        assert_eq!((l.bufs_per_page, l.region_len), (1024, 2 << 20));
        assert_eq!(l.offset(1023), 1023 * 2048);
        let l = PoolLayout::new(4096, 3, PageSize::Base4K).unwrap();
        assert_eq!((l.bufs_per_page, l.region_len), (1, 3 * 4096));
        let l = PoolLayout::new(512, 9, PageSize::Base4K).unwrap();
        assert_eq!((l.bufs_per_page, l.region_len), (8, 8192));
        let l = PoolLayout::new(1 << 30, 2, PageSize::Huge1G).unwrap();
        assert_eq!(l.region_len, 2 << 30);
    }

    #[test]
    fn bad_geometry_is_refused() {
        for (size, count, page) in [
            (256, 1, PageSize::Base4K),
            (3000, 1, PageSize::Base4K),
            (8192, 1, PageSize::Base4K),
            (4 << 20, 1, PageSize::Huge2M),
            (512, 0, PageSize::Base4K),
            (4096, usize::MAX / 2, PageSize::Base4K),
        ] {
            let e = PoolLayout::new(size, count, page).unwrap_err();
            assert!(
                matches!(e, DmaError::BadPoolGeometry { .. }),
                "{size} x {count}: {e:?}"
            );
        }
        let msg = PoolLayout::new(8192, 1, PageSize::Base4K)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("use a larger page size"), "{msg}");
    }

    #[test]
    fn spanning_layouts() {
        let l = PoolLayout::spanning(128 << 10, 5, PageSize::Base4K).unwrap();
        assert_eq!((l.bufs_per_page, l.region_len), (0, 5 * (128 << 10)));
        assert_eq!(l.offset(4), 4 << 17);
        // Up to a page it is the ordinary layout.
        assert_eq!(
            PoolLayout::spanning(2048, 7, PageSize::Base4K).unwrap(),
            PoolLayout::new(2048, 7, PageSize::Base4K).unwrap()
        );
        for (size, count) in [(3 << 12, 1), (8192, 0), (1 << 20, usize::MAX / 8)] {
            let e = PoolLayout::spanning(size, count, PageSize::Base4K).unwrap_err();
            assert!(
                matches!(e, DmaError::BadPoolGeometry { buf_size, .. } if buf_size == size),
                "{e:?}"
            );
        }
    }

    /// `owns` (what refuses a foreign buffer in `free`, `read` and `write`, in release builds
    /// too): every buffer of a pool, first and last included, and no buffer of another pool,
    /// however the two regions lie.
    #[test]
    fn a_pool_owns_its_buffers_and_no_others() {
        let dma = crate::DmaContext::for_testing();
        let mut a = dma.pool(512, 9, PageSize::Base4K).unwrap();
        let mut b = dma.pool(512, 9, PageSize::Base4K).unwrap();
        let bufs_a: Vec<DmaBuf> = std::iter::from_fn(|| a.alloc()).collect();
        let bufs_b: Vec<DmaBuf> = std::iter::from_fn(|| b.alloc()).collect();
        assert_eq!((bufs_a.len(), bufs_b.len()), (9, 9));
        for x in &bufs_a {
            assert!(a.owns(x) && !b.owns(x), "a's buffer {}", x.index());
        }
        for x in &bufs_b {
            assert!(b.owns(x) && !a.owns(x), "b's buffer {}", x.index());
        }
        // Given back, each comes out again with the addresses it had.
        let (ptr, bus) = (bufs_a[8].as_ptr(), bufs_a[8].bus_addr());
        for x in bufs_a {
            a.free(x);
        }
        for x in bufs_b {
            b.free(x);
        }
        assert_eq!((a.available(), b.available()), (9, 9));
        let x = a.alloc().unwrap();
        assert_eq!((x.index(), x.as_ptr(), x.bus_addr(), x.len()), (8, ptr, bus, 512));
        a.free(x);
    }

    #[test]
    fn every_buffer_stays_inside_one_page() {
        for page in [PageSize::Base4K, PageSize::Huge2M] {
            for shift in 9..=page.bytes().trailing_zeros() {
                let l = PoolLayout::new(1 << shift, 5000, page).unwrap();
                for i in 0..l.count {
                    let (first, last) = (l.offset(i), l.offset(i) + l.buf_size - 1);
                    assert_eq!(
                        first as u64 / page.bytes(),
                        last as u64 / page.bytes(),
                        "buffer {i} straddles"
                    );
                    assert!(last < l.region_len);
                }
            }
        }
    }
}
