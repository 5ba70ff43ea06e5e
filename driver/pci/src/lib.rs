//! # vfpoll-pci: PCI devices through sysfs and VFIO
//!
//! The platform layer of vfpoll. Layers, bottom up:
//! - [`addr`]: address newtypes ([`Iova`], [`PhysAddr`], [`BusAddr`]) that cannot be mixed up;
//! - [`bdf`] and [`sysfs`]: find devices, their driver, IOMMU group and NUMA node;
//! - [`bind`]: hand a device to `vfio-pci` and back to its kernel driver, refusing when the
//!   kernel still uses it (a mounted file system, an interface that is up);
//! - [`vfio`]: container, group and device file descriptors, in IOMMU mode (the type1 container,
//!   or iommufd with VFIO device cdevs: [`vfio::Backend`] chooses) or, only when asked for
//!   explicitly, no-IOMMU mode; region info, config space, reset, DMA map/unmap;
//!   interrupts (MSI-X, MSI, INTx, error and request indexes) as eventfds ([`vfio::irq`]);
//! - [`mmio`]: a typed, volatile, bounds-checked accessor over a mapped BAR;
//! - [`fault`]: BAR mappings that may vanish (hot removal, a zapped mapping): revoked in place,
//!   and a SIGBUS handler scoped to them.
//!
//! Device removal: [`vfio::Device::watch`] listens on the device-request (and error) interrupt;
//! [`vfio::Device::release`] revokes the device's BAR mappings and closes its file so that the
//! kernel can complete the removal while the process goes on.
//!
//! All `unsafe` code of this crate lives in [`vfio`] (ioctls, mmap), [`mmio`] (volatile access)
//! and [`fault`] (mapping replacement, the SIGBUS handler).
//! Nothing here prints: errors are returned, diagnostics go through `log`.
//!
//! With the feature `testing` (hidden; only test builds turn it on), `testing` builds fake
//! machines, sysfs/procfs/dev trees in a temporary folder, for the tests of `vfpoll`.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks, missing_docs)]

pub mod addr;
pub mod bdf;
pub mod bind;
pub mod completion;
pub mod fault;
pub mod mmio;
pub mod sysfs;
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod testing;
pub mod vfio;

pub use addr::{BusAddr, Iova, PhysAddr};
pub use bdf::Bdf;
pub use completion::{CompletionMode, UnknownCompletionMode};
pub use sysfs::{Host, PciDevice};
