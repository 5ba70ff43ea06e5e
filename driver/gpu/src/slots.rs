//! [`Slots`]: the staging buffers of a transfer, `count` equal slices of one hugepage
//! [`DmaRegion`] that an NVMe controller writes into (and reads from) by DMA and the GPU copies
//! from (and into) by DMA, with no CPU copy in between.
//!
//! The region is shared with the devices: the NVMe queue pair holds [`SlotBuf`]s (device access
//! only: a `SlotBuf` offers bus addresses, never the memory), and the GPU engine keeps it
//! registered. The CPU reaches the bytes only through `&Slots` (reads) and `&mut Slots` (writes),
//! so two threads can never race on them; which slot a device may touch at a time is the
//! pipeline's state machine.
//!
//! This module holds the crate's raw accesses to slot memory.

use std::sync::Arc;

use vfpoll_dma::{DmaContext, DmaError, DmaRegion, MapKind, PageSize};
use vfpoll_nvme::IoBuffer;
use vfpoll_pci::BusAddr;

use crate::error::PipelineError;

/// Slot sizes are multiples of this (the NVMe memory page size, and the host page).
pub const SLOT_ALIGN: usize = 4096;

/// `count` slots of `slot_size` bytes in one DMA region. See the module docs.
pub struct Slots {
    region: Arc<DmaRegion>,
    count: usize,
    slot_size: usize,
    leak: bool,
}

impl std::fmt::Debug for Slots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slots")
            .field("count", &self.count)
            .field("slot_size", &self.slot_size)
            .field("region", &*self.region)
            .finish()
    }
}

impl Slots {
    /// `count` slots of `slot_size` bytes (a multiple of 4 KiB) in a fresh region of `page`
    /// pages from `dma` (the DMA context of the NVMe controller that will read into them, or
    /// any context for sources without a device).
    pub fn alloc(
        dma: &DmaContext,
        count: usize,
        slot_size: usize,
        page: PageSize,
    ) -> Result<Self, PipelineError> {
        let total = check_geometry(count, slot_size)?;
        let region = dma.alloc_region(total, page)?;
        Self::from_region(region, count, slot_size)
    }

    /// Slots over an existing region (for example a [`vfpoll_dma::DmaPool`]'s, taken apart by
    /// its owner), which must hold `count * slot_size` bytes.
    pub fn from_region(region: DmaRegion, count: usize, slot_size: usize) -> Result<Self, PipelineError> {
        let total = check_geometry(count, slot_size)?;
        if region.len() < total {
            return Err(PipelineError::Invalid(format!(
                "{count} slots of {slot_size} bytes need {total} bytes; the region has {}",
                region.len()
            )));
        }
        Ok(Slots {
            region: Arc::new(region),
            count,
            slot_size,
            leak: false,
        })
    }

    /// Number of slots.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Bytes per slot.
    pub fn slot_size(&self) -> usize {
        self.slot_size
    }

    /// Bytes of all slots together.
    pub fn total_len(&self) -> usize {
        self.count * self.slot_size
    }

    /// The page size backing the slots.
    pub fn page_size(&self) -> PageSize {
        self.region.page_size()
    }

    /// Whether the NVMe side reaches the slots through an IOMMU.
    pub fn map_kind(&self) -> MapKind {
        self.region.map_kind()
    }

    /// Start of the slots in the CPU's address space (identity and diagnostics; never make a
    /// reference from it).
    pub fn as_ptr(&self) -> *mut u8 {
        self.region.as_ptr()
    }

    /// The region, for registering it with a device (crate-internal: a clone must never be used
    /// for CPU access, see the module docs).
    #[cfg_attr(not(feature = "cuda"), expect(dead_code, reason = "used by the CUDA engine"))]
    pub(crate) fn region(&self) -> &Arc<DmaRegion> {
        &self.region
    }

    /// Checks `off..off+len` of `slot`; returns its offset in the region.
    fn at(&self, slot: usize, off: usize, len: usize) -> Result<usize, DmaError> {
        match off.checked_add(len) {
            Some(end) if slot < self.count && end <= self.slot_size => Ok(slot * self.slot_size + off),
            _ => Err(DmaError::OutOfBounds {
                offset: slot.saturating_mul(self.slot_size).saturating_add(off),
                len,
                size: self.total_len(),
            }),
        }
    }

    /// The CPU address of `off..off+len` in `slot`, bounds-checked: for device engines (the
    /// GPU's copy source or destination). Never make a reference from it.
    pub fn ptr(&self, slot: usize, off: usize, len: usize) -> Result<*mut u8, DmaError> {
        let at = self.at(slot, off, len)?;
        Ok(self.region.as_ptr().wrapping_add(at))
    }

    /// Like [`Slots::ptr`], for CPU writes by this crate (a file read into the slot): `&mut self`
    /// proves no other CPU access runs meanwhile.
    pub(crate) fn ptr_mut(&mut self, slot: usize, off: usize, len: usize) -> Result<*mut u8, DmaError> {
        self.ptr(slot, off, len)
    }

    /// The first `len` bytes of `slot` as an NVMe I/O buffer.
    pub fn io_buf(&self, slot: usize, len: usize) -> Result<SlotBuf, DmaError> {
        let offset = self.at(slot, 0, len)?;
        Ok(SlotBuf {
            region: self.region.clone(),
            offset,
            len,
        })
    }

    /// Copies from `slot` at `off` into `dst`. Order it after the device's completion.
    pub fn read(&self, slot: usize, off: usize, dst: &mut [u8]) -> Result<(), DmaError> {
        let at = self.at(slot, off, dst.len())?;
        self.region.read(at, dst)
    }

    /// Copies `src` into `slot` at `off`. The slot must not be in a device's hands.
    pub fn write(&mut self, slot: usize, off: usize, src: &[u8]) -> Result<(), DmaError> {
        let dst = self.ptr_mut(slot, off, src.len())?;
        // SAFETY: `dst..dst+len` lies inside the region (checked by `at`), which is alive (we
        // hold an `Arc`) and writable. No Rust reference points into it: the crate hands out
        // only raw pointers and `SlotBuf`s (bus addresses), and every CPU access goes through
        // `&self`/`&mut self` of this unique owner, so `&mut self` excludes a concurrent CPU
        // access. `src` is a Rust slice, so it cannot overlap DMA memory.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        Ok(())
    }

    /// Writes the [`pattern`] bytes of transfer offsets `stream_off..stream_off+len` into `slot`
    /// from its start.
    pub fn fill_pattern(
        &mut self,
        slot: usize,
        len: usize,
        stream_off: u64,
        seed: u64,
    ) -> Result<(), DmaError> {
        self.at(slot, 0, len)?;
        let mut buf = [0u8; 64 << 10];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(buf.len());
            pattern(seed, stream_off + done as u64, &mut buf[..n]);
            self.write(slot, done, &buf[..n])?;
            done += n;
        }
        Ok(())
    }

    /// From now on, dropping the slots leaks their memory instead of freeing it: for a device
    /// that may still write into them (a transfer abandoned after a timeout).
    pub fn leak_on_drop(&mut self) {
        self.leak = true;
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        if self.leak {
            log::warn!(
                "leaking {} bytes of slot memory a device may still write into",
                self.total_len()
            );
            std::mem::forget(self.region.clone());
        }
    }
}

fn check_geometry(count: usize, slot_size: usize) -> Result<usize, PipelineError> {
    if count == 0 || slot_size == 0 || !slot_size.is_multiple_of(SLOT_ALIGN) {
        return Err(PipelineError::Invalid(format!(
            "{count} slots of {slot_size} bytes: need at least one slot, and a slot size that is a non-zero multiple of 4 KiB"
        )));
    }
    count
        .checked_mul(slot_size)
        .ok_or_else(|| PipelineError::Invalid(format!("{count} slots of {slot_size} bytes overflow")))
}

/// A byte range of one slot, handed to an NVMe queue pair. It carries bus addresses only (no
/// CPU access), and its `Arc` keeps the region mapped while the command runs.
#[derive(Debug)]
pub struct SlotBuf {
    region: Arc<DmaRegion>,
    offset: usize,
    len: usize,
}

// SAFETY: the `Arc` keeps the region, and so its DMA mapping, alive as long as this value; the
// range lies inside the region (checked by `Slots::at`), and `contiguous_len` is the region's
// own, clipped to the range.
unsafe impl IoBuffer for SlotBuf {
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

/// The reference data of tests and benchmarks: byte `i` of a transfer is byte `i % 8` of
/// splitmix64(`seed` + `i / 8`), little-endian. Fills `dst` with bytes `offset..`.
pub fn pattern(seed: u64, offset: u64, dst: &mut [u8]) {
    let mut i = 0;
    while i < dst.len() {
        let pos = offset + i as u64;
        let word = splitmix64(seed.wrapping_add(pos / 8)).to_le_bytes();
        let from = (pos % 8) as usize;
        let n = (8 - from).min(dst.len() - i);
        dst[i..i + n].copy_from_slice(&word[from..from + n]);
        i += n;
    }
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_is_position_independent() {
        let mut whole = vec![0u8; 100];
        pattern(7, 13, &mut whole);
        for split in [1, 3, 8, 50, 99] {
            let mut a = vec![0u8; split];
            let mut b = vec![0u8; 100 - split];
            pattern(7, 13, &mut a);
            pattern(7, 13 + split as u64, &mut b);
            a.extend_from_slice(&b);
            assert_eq!(a, whole, "split at {split}");
        }
        let mut other = vec![0u8; 100];
        pattern(8, 13, &mut other);
        assert_ne!(other, whole);
    }

    #[test]
    fn slots_check_bounds_and_geometry() {
        let dma = DmaContext::for_testing();
        assert!(Slots::alloc(&dma, 0, 4096, PageSize::Base4K).is_err());
        assert!(Slots::alloc(&dma, 2, 1000, PageSize::Base4K).is_err());
        let mut s = Slots::alloc(&dma, 3, 8192, PageSize::Base4K).unwrap();
        assert_eq!((s.count(), s.slot_size(), s.total_len()), (3, 8192, 24576));
        s.write(2, 8190, &[1, 2]).unwrap();
        assert!(s.write(2, 8191, &[1, 2]).is_err());
        assert!(s.write(3, 0, &[1]).is_err());
        assert!(s.io_buf(0, 8193).is_err());
        let b = s.io_buf(1, 8192).unwrap();
        assert_eq!(b.len(), 8192);
        assert_eq!(b.bus_addr(0), s.region.bus_addr(8192));
        s.fill_pattern(1, 8192, 4096, 3).unwrap();
        let (mut got, mut want) = (vec![0u8; 8192], vec![0u8; 8192]);
        s.read(1, 0, &mut got).unwrap();
        pattern(3, 4096, &mut want);
        assert_eq!(got, want);
    }
}
