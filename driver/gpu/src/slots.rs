//! [`Slots`]: the staging buffers of a transfer, `count` equal slices of one hugepage
//! [`DmaRegion`] that an NVMe controller writes into (and reads from) by DMA and the GPU copies
//! from (and into) by DMA, with no CPU copy in between.
//!
//! The region is moved into one [`RegionBuf`] per slot, so each slot's bytes have exactly one
//! owner. While a slot is in hand, `Slots` owns it: the CPU reaches it through `&Slots` (reads)
//! and `&mut Slots` (writes), and device engines get its address ([`Slots::ptr`]). An NVMe queue
//! pair takes the slot itself ([`Slots::io_buf`] hands out the slot's buffer as a [`SlotBuf`]),
//! and until the completion gives it back ([`Slots::give_back`]) every CPU access and every
//! address request for that slot fails with [`DmaError::InUse`]. The GPU engine keeps the whole
//! region registered through a [`RegionHold`], which gives no access to the bytes; which slot
//! the GPU copies at a time is the pipeline's state machine.

use vfpoll_dma::{DmaContext, DmaError, DmaRegion, MapKind, PageSize, RegionBuf, RegionHold};
use vfpoll_nvme::IoBuffer;
use vfpoll_pci::BusAddr;

use crate::error::PipelineError;

/// Slot sizes are multiples of this (the NVMe memory page size, and the host page).
pub const SLOT_ALIGN: usize = 4096;

/// `count` slots of `slot_size` bytes in one DMA region. See the module docs.
pub struct Slots {
    /// Each slot's buffer while in hand; `None` while a device command holds it.
    bufs: Vec<Option<RegionBuf>>,
    /// Keeps the region for the GPU's registration, and leaks it on request.
    hold: RegionHold,
    slot_size: usize,
    page_size: PageSize,
    map_kind: MapKind,
    leak: bool,
}

impl std::fmt::Debug for Slots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slots")
            .field("count", &self.count())
            .field("slot_size", &self.slot_size)
            .field("lent", &self.bufs.iter().filter(|b| b.is_none()).count())
            .field("region", &self.hold)
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
        let (page_size, map_kind) = (region.page_size(), region.map_kind());
        let mut rest = RegionBuf::whole(region);
        let hold = rest.hold();
        let bufs = (0..count)
            .map(|_| {
                let next = rest.split_off(slot_size);
                Some(std::mem::replace(&mut rest, next))
            })
            .collect();
        // `rest` is the region's tail past the last slot (whole pages rounded up), unused.
        Ok(Slots {
            bufs,
            hold,
            slot_size,
            page_size,
            map_kind,
            leak: false,
        })
    }

    /// Number of slots.
    pub fn count(&self) -> usize {
        self.bufs.len()
    }

    /// Bytes per slot.
    pub fn slot_size(&self) -> usize {
        self.slot_size
    }

    /// Bytes of all slots together.
    pub fn total_len(&self) -> usize {
        self.count() * self.slot_size
    }

    /// The page size backing the slots.
    pub fn page_size(&self) -> PageSize {
        self.page_size
    }

    /// Whether the NVMe side reaches the slots through an IOMMU.
    pub fn map_kind(&self) -> MapKind {
        self.map_kind
    }

    /// Start of the slots in the CPU's address space (identity and diagnostics; never make a
    /// reference from it).
    pub fn as_ptr(&self) -> *mut u8 {
        self.hold.as_ptr()
    }

    /// What keeps the region for registering it with a device (crate-internal).
    #[cfg_attr(not(feature = "cuda"), expect(dead_code, reason = "used by the CUDA engine"))]
    pub(crate) fn hold(&self) -> &RegionHold {
        &self.hold
    }

    /// Checks `off..off+len` of `slot`; its error when out of range.
    fn check(&self, slot: usize, off: usize, len: usize) -> Result<(), DmaError> {
        match off.checked_add(len) {
            Some(end) if slot < self.count() && end <= self.slot_size => Ok(()),
            _ => Err(DmaError::OutOfBounds {
                offset: slot.saturating_mul(self.slot_size).saturating_add(off),
                len,
                size: self.total_len(),
            }),
        }
    }

    /// Slot `slot`'s buffer, in hand, with `off..off+len` checked.
    fn buf(&self, slot: usize, off: usize, len: usize) -> Result<&RegionBuf, DmaError> {
        self.check(slot, off, len)?;
        self.bufs[slot].as_ref().ok_or(DmaError::InUse { index: slot })
    }

    /// Like [`Slots::buf`], for writes.
    fn buf_mut(&mut self, slot: usize, off: usize, len: usize) -> Result<&mut RegionBuf, DmaError> {
        self.check(slot, off, len)?;
        self.bufs[slot].as_mut().ok_or(DmaError::InUse { index: slot })
    }

    /// The CPU address of `off..off+len` in `slot`, bounds-checked, while the slot is in hand:
    /// for device engines (the GPU's copy source or destination). Never make a reference from
    /// it.
    pub fn ptr(&self, slot: usize, off: usize, len: usize) -> Result<*mut u8, DmaError> {
        Ok(self.buf(slot, off, len)?.as_ptr().wrapping_add(off))
    }

    /// Like [`Slots::ptr`], for CPU writes by this crate (a file read into the slot): `&mut self`
    /// proves no other CPU access runs meanwhile.
    pub(crate) fn ptr_mut(&mut self, slot: usize, off: usize, len: usize) -> Result<*mut u8, DmaError> {
        Ok(self.buf_mut(slot, off, len)?.as_ptr().wrapping_add(off))
    }

    /// The first `len` bytes of `slot` as an NVMe I/O buffer. The slot is the buffer's until
    /// [`Slots::give_back`]: meanwhile the CPU cannot reach it, nor can it be lent twice.
    pub fn io_buf(&mut self, slot: usize, len: usize) -> Result<SlotBuf, DmaError> {
        self.buf(slot, 0, len)?;
        let buf = self.bufs[slot].take().expect("in hand: checked just above");
        Ok(SlotBuf { slot, len, buf })
    }

    /// Takes back a buffer that [`Slots::io_buf`] lent (its command completed). A buffer of
    /// other slots is refused, and dropped: its own slots never see it again.
    pub fn give_back(&mut self, buf: SlotBuf) -> Result<(), DmaError> {
        let slot = buf.slot;
        let home = self.as_ptr().wrapping_add(slot * self.slot_size);
        match self.bufs.get_mut(slot) {
            Some(b @ None) if buf.buf.as_ptr() == home => {
                *b = Some(buf.buf);
                Ok(())
            }
            _ => Err(DmaError::ForeignBuffer { index: slot }),
        }
    }

    /// Whether `slot` is in hand (not lent to a device command).
    pub fn in_hand(&self, slot: usize) -> bool {
        self.bufs.get(slot).is_some_and(Option::is_some)
    }

    /// Copies from `slot` at `off` into `dst`. Order it after the device's completion.
    pub fn read(&self, slot: usize, off: usize, dst: &mut [u8]) -> Result<(), DmaError> {
        self.buf(slot, off, dst.len())?.read(off, dst)
    }

    /// Copies `src` into `slot` at `off`. The slot must not be in a device's hands.
    pub fn write(&mut self, slot: usize, off: usize, src: &[u8]) -> Result<(), DmaError> {
        self.buf_mut(slot, off, src.len())?.write(off, src)
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
        self.buf(slot, 0, len)?;
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
            std::mem::forget(self.hold.clone());
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

/// The first `len` bytes of one slot, lent to an NVMe queue pair by [`Slots::io_buf`]: it owns
/// the whole slot (bus addresses for the device, no CPU access) until
/// [`Slots::give_back`] takes it home.
#[derive(Debug)]
pub struct SlotBuf {
    slot: usize,
    len: usize,
    buf: RegionBuf,
}

impl SlotBuf {
    /// The slot it belongs to.
    pub fn slot(&self) -> usize {
        self.slot
    }
}

// SAFETY: the `RegionBuf` keeps the region, and so its DMA mapping, alive as long as this value
// and upholds the contract for the whole slot; `len` is at most the slot (checked by
// `Slots::io_buf`), and `contiguous_len` is clipped to it.
unsafe impl IoBuffer for SlotBuf {
    fn len(&self) -> usize {
        self.len
    }
    fn bus_addr(&self, off: usize) -> BusAddr {
        debug_assert!(off < self.len);
        self.buf.bus_addr(off)
    }
    fn contiguous_len(&self, off: usize) -> usize {
        self.buf.contiguous_len(off).min(self.len.saturating_sub(off))
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
    fn a_lent_slot_is_out_of_the_cpus_reach_until_it_comes_back() {
        let dma = DmaContext::for_testing();
        let mut s = Slots::alloc(&dma, 2, 4096, PageSize::Base4K).unwrap();
        s.write(0, 0, b"before").unwrap();
        let b = s.io_buf(0, 4096).unwrap();
        assert!(!s.in_hand(0) && s.in_hand(1));
        let in_use = |r: Result<(), DmaError>| matches!(r, Err(DmaError::InUse { index: 0 }));
        assert!(in_use(s.read(0, 0, &mut [0; 6])), "no CPU read while lent");
        assert!(in_use(s.write(0, 0, b"x")), "no CPU write while lent");
        assert!(in_use(s.ptr(0, 0, 1).map(drop)), "no device address while lent");
        assert!(in_use(s.io_buf(0, 512).map(drop)), "not lent twice");
        s.write(1, 0, b"slot 1 is still ours").unwrap();

        let mut other = Slots::alloc(&dma, 2, 4096, PageSize::Base4K).unwrap();
        let theirs = other.io_buf(0, 4096).unwrap();
        assert!(
            matches!(s.give_back(theirs), Err(DmaError::ForeignBuffer { index: 0 })),
            "a buffer of other slots is refused"
        );
        assert!(!other.in_hand(0), "and never goes home");
        s.give_back(b).unwrap();
        let mut got = [0u8; 6];
        s.read(0, 0, &mut got).unwrap();
        assert_eq!(&got, b"before");
        let again = s.io_buf(0, 512).unwrap();
        s.give_back(again).unwrap();
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
        assert_eq!((b.len(), b.slot()), (8192, 1));
        let b0 = s.io_buf(0, 4096).unwrap();
        assert_eq!(b.bus_addr(0), b0.bus_addr(0).add(8192));
        assert_eq!(b0.contiguous_len(100), 4096 - 100, "clipped to the length lent");
        s.give_back(b0).unwrap();
        s.fill_pattern(1, 8192, 4096, 3).unwrap_err();
        s.give_back(b).unwrap();
        s.fill_pattern(1, 8192, 4096, 3).unwrap();
        let (mut got, mut want) = (vec![0u8; 8192], vec![0u8; 8192]);
        s.read(1, 0, &mut got).unwrap();
        pattern(3, 4096, &mut want);
        assert_eq!(got, want);
    }
}
