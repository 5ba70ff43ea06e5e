//! One data buffer per queue slot, made at start-up and cycled through the queue pair.
//!
//! A slot's buffer goes into the queue pair with its command and comes back with the completion
//! (the slot index is the request tag), so the hot path neither allocates nor touches a free
//! list. Buffers that fit in one DMA page come from a [`DmaPool`]; larger ones are one
//! [`vfpoll_dma::DmaRegion`] per slot, moved into a [`RegionBuf`]. Either way the slot holds
//! the one handle to its buffer while it is in hand, and the queue pair holds it while a command
//! runs, so the CPU cannot touch bytes the device owns.

use vfpoll_dma::{DmaBuf, DmaContext, DmaError, DmaPool, PageSize};
use vfpoll_nvme::{IoBuffer, RegionBuf};

/// Per-slot buffers of one queue pair.
pub(crate) trait Slots: Send + Sized + 'static {
    /// The buffer type the queue pair carries.
    type Buf: IoBuffer + 'static;
    /// `count` buffers of `size` bytes.
    fn new(dma: &DmaContext, size: usize, count: usize, page: PageSize) -> Result<Self, DmaError>;
    /// Takes slot `i`'s buffer (it must be in hand).
    fn take(&mut self, i: usize) -> Self::Buf;
    /// Gives slot `i`'s buffer back.
    fn put(&mut self, i: usize, buf: Self::Buf);
    /// Copies `data` into slot `i`'s buffer (in hand).
    fn store(&mut self, i: usize, data: &[u8]) -> Result<(), DmaError>;
    /// Copies slot `i`'s buffer (in hand) into `out`.
    fn load(&self, i: usize, out: &mut [u8]) -> Result<(), DmaError>;
}

/// Buffers from one pool (any size up to the page size).
pub(crate) struct PoolSlots {
    bufs: Vec<Option<DmaBuf>>,
    pool: DmaPool,
}

impl Slots for PoolSlots {
    type Buf = DmaBuf;

    fn new(dma: &DmaContext, size: usize, count: usize, page: PageSize) -> Result<Self, DmaError> {
        // Pool buffers are powers of two; an I/O that is not one (blocks of data plus
        // metadata, a metadata buffer) uses the first `size` bytes of its buffer.
        let mut pool = dma.pool(size.next_power_of_two().max(512), count, page)?;
        let bufs = (0..count)
            .map(|_| {
                let mut b = pool.alloc().expect("a fresh pool has `count` buffers");
                b.truncate(size);
                Some(b)
            })
            .collect();
        Ok(PoolSlots { bufs, pool })
    }

    #[inline]
    fn take(&mut self, i: usize) -> DmaBuf {
        self.bufs[i].take().expect("slot buffer in hand")
    }

    #[inline]
    fn put(&mut self, i: usize, buf: DmaBuf) {
        debug_assert!(self.bufs[i].is_none());
        self.bufs[i] = Some(buf);
    }

    fn store(&mut self, i: usize, data: &[u8]) -> Result<(), DmaError> {
        let b = self.bufs[i].as_ref().expect("slot buffer in hand");
        self.pool.write(b, 0, data)
    }

    fn load(&self, i: usize, out: &mut [u8]) -> Result<(), DmaError> {
        let b = self.bufs[i].as_ref().expect("slot buffer in hand");
        self.pool.read(b, 0, out)
    }
}

impl Drop for PoolSlots {
    fn drop(&mut self) {
        // Back into the pool, so that it frees its region; a buffer a failed queue pair kept
        // (never returned) makes the pool leak its region instead, as it must.
        for b in self.bufs.iter_mut().filter_map(Option::take) {
            self.pool.free(b);
        }
    }
}

/// One region per slot (buffers larger than a page), each a [`RegionBuf`] of the I/O size.
pub(crate) struct RegionSlots {
    bufs: Vec<Option<RegionBuf>>,
}

impl Slots for RegionSlots {
    type Buf = RegionBuf;

    fn new(dma: &DmaContext, size: usize, count: usize, page: PageSize) -> Result<Self, DmaError> {
        // A region is rounded up to whole pages; the buffer is the `size` bytes an I/O moves.
        let bufs = (0..count)
            .map(|_| RegionBuf::new(dma.alloc_region(size, page)?, 0, size).map(Some))
            .collect::<Result<_, _>>()?;
        Ok(RegionSlots { bufs })
    }

    #[inline]
    fn take(&mut self, i: usize) -> RegionBuf {
        self.bufs[i].take().expect("slot buffer in hand")
    }

    #[inline]
    fn put(&mut self, i: usize, buf: RegionBuf) {
        debug_assert!(self.bufs[i].is_none());
        self.bufs[i] = Some(buf);
    }

    fn store(&mut self, i: usize, data: &[u8]) -> Result<(), DmaError> {
        self.bufs[i].as_mut().expect("slot buffer in hand").write(0, data)
    }

    fn load(&self, i: usize, out: &mut [u8]) -> Result<(), DmaError> {
        self.bufs[i].as_ref().expect("slot buffer in hand").read(0, out)
    }
}
