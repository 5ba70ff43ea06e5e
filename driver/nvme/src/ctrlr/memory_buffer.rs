//! Enabling the controller memory buffer (NVMe Base 2.0 §3.1.3.15, §8.7) and mapping it
//! ([`Controller::cmb`]); the buffer's allocator and slices are [`crate::cmb`]'s.

use std::sync::Arc;

use super::Controller;
use crate::cmb::Cmb;
use crate::error::{NvmeError, Result};
use crate::regs::{off, CmbLoc, CmbSz, CMBMSC_CMSE, CMBMSC_CRE};

impl Controller {
    /// Enables the controller memory buffer (once; later calls return the same) and maps it.
    ///
    /// Needs a controller opened through VFIO (the CMB is in one of its BARs). Steps: CMBMSC.CRE
    /// to make CMBLOC/CMBSZ readable, map the BAR named by CMBLOC.BIR, then CMBMSC = CBA | CMSE
    /// | CRE with CBA the BAR's bus address plus the CMB offset, and check CMBSTS.CBAI.
    pub fn cmb(&self) -> Result<Arc<Cmb>> {
        let mut slot = self.shared.cmb.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = slot.as_ref() {
            return Ok(Arc::clone(c));
        }
        if !self.cap().cmb_supported() {
            return Err(NvmeError::Unsupported(
                "the controller has no controller memory buffer (CAP.CMBS = 0)".into(),
            ));
        }
        let dev = self
            .device()
            .ok_or_else(|| NvmeError::Unsupported("the CMB needs a controller opened through VFIO".into()))?;
        let bar = &self.shared.bar;
        bar.write64(off::CMBMSC, CMBMSC_CRE);
        let loc = CmbLoc(bar.read32(off::CMBLOC));
        let sz = CmbSz(bar.read32(off::CMBSZ));
        let size = sz.size_bytes();
        if size == 0 {
            return Err(NvmeError::Unsupported(format!(
                "CMBSZ reads {:#x}: no usable CMB",
                sz.0
            )));
        }
        let unit = 1u64 << (12 + 4 * ((sz.0 >> 8) & 0xf));
        let offset = loc.offset_units() * unit;
        let whole = crate::regs::map_bar(dev, loc.bir())?;
        let mmio = whole.window(offset as usize, size as usize).map_err(|e| {
            NvmeError::Unsupported(format!(
                "CMB of {size:#x} bytes at {offset:#x} does not fit BAR{}: {e}",
                loc.bir()
            ))
        })?;
        let bus = dev.bar_bus_addr(loc.bir())?.add(offset);
        if !bus.is_aligned(4096) {
            return Err(NvmeError::Unsupported(format!(
                "CMB bus address {bus} is not 4 KiB aligned"
            )));
        }
        bar.write64(off::CMBMSC, bus.get() | CMBMSC_CMSE | CMBMSC_CRE);
        let sts = bar.read32(off::CMBSTS);
        if sts & 1 != 0 {
            bar.write64(off::CMBMSC, 0);
            return Err(NvmeError::Unsupported(format!(
                "the controller refused CMB address {bus} (CMBSTS.CBAI)"
            )));
        }
        log::debug!(
            "CMB: {size:#x} bytes in BAR{} at {offset:#x}, bus {bus}, {sz:?}",
            loc.bir()
        );
        let cmb = Arc::new(Cmb::new(mmio, bus, sz));
        *slot = Some(Arc::clone(&cmb));
        Ok(cmb)
    }
}
