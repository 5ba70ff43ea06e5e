//! NVMe controller registers (NVMe Base 2.0 §3.1.3), memory-mapped in BAR0: the offsets and
//! fields are `vfpoll-nvme-spec`'s ([`vfpoll_nvme_spec::regs`], re-exported here).
//!
//! `map_bar` (crate-private) is the crate's one mapping of a device BAR (BAR0, and the BAR
//! that holds the controller memory buffer), and this module's only `unsafe`: a register write
//! can start DMA to any bus address (ASQ, ACQ, CMBMSC), so the mapping never leaves the crate
//! writable.

pub use vfpoll_nvme_spec::regs::*;

/// Maps BAR `bar` of `device`: BAR0 (the registers and doorbells) or the BAR named by
/// CMBLOC.BIR (the controller memory buffer).
pub(crate) fn map_bar(
    device: &vfpoll_pci::vfio::Device,
    bar: u32,
) -> Result<vfpoll_pci::mmio::Mmio, vfpoll_pci::vfio::VfioError> {
    // SAFETY: the mapping stays inside the crate: the controller's BAR0 is readable from outside
    // only through `Registers`, doorbell windows stay in queue pairs, and the CMB is reached only
    // through `CmbBuf` copies. The driver writes only registers that take bus addresses of
    // memory it owns and keeps mapped while the controller may use it: ASQ/ACQ (its admin
    // queue), CMBMSC (the CMB's own bus address), doorbells (indexes, not addresses).
    unsafe { device.map_bar(bar) }
}
