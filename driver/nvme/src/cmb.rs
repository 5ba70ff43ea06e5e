//! The Controller Memory Buffer (NVMe Base 2.0 §8.7; registers §3.1.3.11-17): memory inside the
//! controller, in one of its BARs, that can hold submission queues (saving the controller the
//! DMA reads of commands) and data (a peer-to-peer buffer: another device can DMA into it).

use std::sync::{Arc, Mutex};

use vfpoll_pci::mmio::Mmio;
use vfpoll_pci::BusAddr;

use crate::error::{NvmeError, Result};
use crate::regs::{off, CmbSz, CMBMSC_CMSE, CMBMSC_CRE};

/// An enabled CMB.
#[derive(Debug)]
pub struct Cmb {
    mmio: Mmio,
    bus: BusAddr,
    size: CmbSz,
    /// Allocated `(offset, len)` ranges, sorted by offset.
    used: Mutex<Vec<(usize, usize)>>,
}

/// A piece of the CMB, freed on drop. To use it as a data buffer, move it into a
/// [`crate::CmbBuf`].
#[derive(Debug)]
pub struct CmbSlice {
    cmb: Arc<Cmb>,
    off: usize,
    len: usize,
}

impl Cmb {
    /// The enabled CMB mapped at `mmio`, at `bus` for its controller, of capabilities `size`;
    /// nothing allocated yet.
    pub(crate) fn new(mmio: Mmio, bus: BusAddr, size: CmbSz) -> Self {
        Cmb {
            mmio,
            bus,
            size,
            used: Mutex::new(Vec::new()),
        }
    }

    /// The CMB's bus address as its own controller sees it (CMBMSC.CBA): what commands to this
    /// controller use to name CMB memory.
    pub fn bus_addr(&self) -> BusAddr {
        self.bus
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.mmio.len()
    }

    /// Whether the CMB is empty (never: a zero-sized CMB is not enabled).
    pub fn is_empty(&self) -> bool {
        self.mmio.is_empty()
    }

    /// CMBSZ: what the CMB may hold (SQs, CQs, PRP/SGL lists, read data, write data).
    pub fn capabilities(&self) -> CmbSz {
        self.size
    }

    /// Takes `len` bytes aligned to `align` (a power of two), first fit.
    pub fn alloc(self: &Arc<Self>, len: usize, align: usize) -> Result<CmbSlice> {
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        let (idx, start) = first_fit(&used, self.len(), len, align).ok_or_else(|| {
            NvmeError::InvalidOption(format!(
                "the {}-byte controller memory buffer has no free {len}-byte range",
                self.len()
            ))
        })?;
        used.insert(idx, (start, len));
        Ok(CmbSlice {
            cmb: Arc::clone(self),
            off: start,
            len,
        })
    }
}

impl CmbSlice {
    /// Offset in the CMB.
    pub fn offset(&self) -> usize {
        self.off
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the slice is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The slice's bus address as the owning controller sees it.
    pub fn bus_addr(&self) -> BusAddr {
        self.cmb.bus.add(self.off as u64)
    }

    /// A CPU accessor for the slice, for the driver's own uses (a submission queue in the CMB).
    /// Others reach CMB bytes only through the owner of a [`crate::CmbBuf`], so that bytes a
    /// command holds cannot be read or written meanwhile.
    pub(crate) fn mmio(&self) -> Mmio {
        self.cmb
            .mmio
            .window(self.off, self.len)
            .expect("slice inside the CMB")
    }

    /// The CMB this slice belongs to.
    pub fn cmb(&self) -> &Arc<Cmb> {
        &self.cmb
    }
}

impl Drop for CmbSlice {
    fn drop(&mut self) {
        let mut used = self.cmb.used.lock().unwrap_or_else(|e| e.into_inner());
        used.retain(|&(o, _)| o != self.off);
    }
}

impl Cmb {
    /// Programs CMBMSC again after a controller reset, which clears it (NVMe Base 2.0
    /// §3.1.3.15): the same address, so mappings and queues in the CMB stay valid.
    pub(crate) fn reprogram(&self, bar: &vfpoll_pci::mmio::Mmio) {
        bar.write64(off::CMBMSC, CMBMSC_CRE);
        bar.write64(off::CMBMSC, self.bus.get() | CMBMSC_CMSE | CMBMSC_CRE);
    }
}

/// First-fit allocation of aligned ranges in `0..size`, given the sorted used ranges.
fn first_fit(used: &[(usize, usize)], size: usize, len: usize, align: usize) -> Option<(usize, usize)> {
    let mut at = 0usize;
    for (i, &(o, l)) in used.iter().enumerate() {
        if at.next_multiple_of(align) + len <= o {
            return Some((i, at.next_multiple_of(align)));
        }
        at = o + l;
    }
    let start = at.next_multiple_of(align);
    (start + len <= size).then_some((used.len(), start))
}

#[cfg(test)]
mod tests {
    use super::first_fit;

    #[test]
    fn first_fit_reuses_holes_and_respects_alignment() {
        let mut used = vec![];
        let take = |used: &mut Vec<(usize, usize)>, len, align| {
            let (i, at) = first_fit(used, 1 << 20, len, align)?;
            used.insert(i, (at, len));
            Some(at)
        };
        assert_eq!(take(&mut used, 100, 4096), Some(0));
        assert_eq!(take(&mut used, 4096, 4096), Some(4096));
        assert_eq!(
            take(&mut used, 10, 64),
            Some(128),
            "in the gap after the first range, aligned"
        );
        used.remove(0); // free the first
        assert_eq!(take(&mut used, 64, 64), Some(0), "the hole at 0 is reused");
        assert_eq!(
            take(&mut used, 200, 64),
            Some(192),
            "after the 10-byte range at 128, aligned"
        );
        assert_eq!(take(&mut used, 8192, 4096), Some(8192), "after the 4 KiB range");
        assert_eq!(take(&mut used, 1 << 20, 4096), None, "no room");
        assert!(
            used.windows(2).all(|w| w[0].0 + w[0].1 <= w[1].0),
            "sorted, disjoint: {used:?}"
        );
    }
}
