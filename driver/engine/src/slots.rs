//! One data buffer per queue slot, made at start-up and cycled through the queue pair.
//!
//! A slot's buffer goes into the queue pair with its command and comes back with the completion
//! (the slot index is the request tag), so the hot path neither allocates nor touches a free
//! list. Buffers that fit in one DMA page come from a [`DmaPool`]; larger ones are one
//! [`DmaRegion`] per slot, handed out as [`RegionBuf`]s.

use std::sync::Arc;

use vfpoll_dma::{DmaBuf, DmaContext, DmaError, DmaPool, DmaRegion, PageSize};
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

/// Buffers from one pool (size up to the page size).
pub(crate) struct PoolSlots {
    bufs: Vec<Option<DmaBuf>>,
    pool: DmaPool,
}

impl Slots for PoolSlots {
    type Buf = DmaBuf;

    fn new(dma: &DmaContext, size: usize, count: usize, page: PageSize) -> Result<Self, DmaError> {
        let mut pool = dma.pool(size, count, page)?;
        let bufs = (0..count)
            .map(|_| Some(pool.alloc().expect("a fresh pool has `count` buffers")))
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

/// One region per slot (buffers larger than a page).
pub(crate) struct RegionSlots {
    regions: Vec<Arc<DmaRegion>>,
    /// Bytes per I/O (a region may be longer: it is rounded up to whole pages).
    size: usize,
}

impl Slots for RegionSlots {
    type Buf = RegionBuf;

    fn new(dma: &DmaContext, size: usize, count: usize, page: PageSize) -> Result<Self, DmaError> {
        let regions = (0..count)
            .map(|_| dma.alloc_region(size, page).map(Arc::new))
            .collect::<Result<_, _>>()?;
        Ok(RegionSlots { regions, size })
    }

    #[inline]
    fn take(&mut self, i: usize) -> RegionBuf {
        RegionBuf::new(Arc::clone(&self.regions[i]), 0, self.size).expect("the region holds `size` bytes")
    }

    #[inline]
    fn put(&mut self, _i: usize, buf: RegionBuf) {
        drop(buf);
    }

    fn store(&mut self, i: usize, data: &[u8]) -> Result<(), DmaError> {
        Arc::get_mut(&mut self.regions[i])
            .expect("slot buffer in hand (no command holds it)")
            .write(0, data)
    }

    fn load(&self, i: usize, out: &mut [u8]) -> Result<(), DmaError> {
        self.regions[i].read(0, out)
    }
}
