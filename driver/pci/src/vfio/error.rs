//! The errors of the VFIO layer. Each message says what is wrong and what to do about it.

use std::io;
use std::path::PathBuf;

use crate::addr::Iova;
use crate::bdf::Bdf;
use crate::sysfs;

/// Errors of the VFIO layer. Each message says what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum VfioError {
    /// `/dev/vfio/vfio` is absent.
    #[error(
        "{path} is missing: the vfio modules are not loaded; run `modprobe vfio-pci` (or `vfpoll setup`)"
    )]
    NoVfio {
        /// The path looked for.
        path: PathBuf,
    },
    /// A VFIO node exists but cannot be opened for lack of permission.
    #[error(
        "cannot open {path}: permission denied; give your user the device (`sudo vfpoll setup --user $USER`), or run as root; a no-IOMMU node (/dev/vfio/noiommu-N) opens only for root (CAP_SYS_RAWIO), whoever owns it"
    )]
    Permission {
        /// The node.
        path: PathBuf,
    },
    /// The kernel speaks another VFIO API version.
    #[error("unsupported VFIO API version {0} (expected 0)")]
    ApiVersion(i32),
    /// The kernel has no type1 IOMMU driver.
    #[error("the kernel offers no VFIO type1 IOMMU: load it (`modprobe vfio_iommu_type1`) and check that the IOMMU is on (VT-d / AMD-Vi on in the firmware; Intel: intel_iommu=on on the kernel command line; AMD: on by default, unless amd_iommu=off)")]
    NoType1,
    /// No-IOMMU mode was requested but is not enabled.
    #[error("no-IOMMU mode was requested but is not enabled: `echo 1 > /sys/module/vfio/parameters/enable_unsafe_noiommu_mode` (the parameter exists only if vfio.ko was built with CONFIG_VFIO_NOIOMMU); `vfpoll doctor --noiommu` checks it")]
    NoIommuNotEnabled,
    /// The device has no IOMMU group.
    #[error("{bdf} has no IOMMU group: bind it to vfio-pci first (`vfpoll bind {bdf}`); without an IOMMU this needs no-IOMMU mode (--noiommu)")]
    NoGroup {
        /// The device.
        bdf: Bdf,
    },
    /// The device is in a no-IOMMU group but type1 mode was requested.
    #[error("{bdf} is in no-IOMMU group {group}: this machine has no IOMMU for it; pass --noiommu to use it without one (unsafe: the device can reach all memory)")]
    NoIommuGroup {
        /// The device.
        bdf: Bdf,
        /// The group.
        group: u32,
    },
    /// No-IOMMU mode was requested for a device that sits behind a real IOMMU.
    #[error("{bdf} is in IOMMU group {group} behind a real IOMMU: no-IOMMU mode is only for machines without one; drop --noiommu")]
    HasIommu {
        /// The device.
        bdf: Bdf,
        /// The group.
        group: u32,
    },
    /// The group's node is missing: the device is not bound to vfio-pci.
    #[error("{path} is missing: {bdf} is not bound to vfio-pci; run `vfpoll bind {bdf}`")]
    NotBound {
        /// The device.
        bdf: Bdf,
        /// The node looked for.
        path: PathBuf,
    },
    /// The group is open elsewhere.
    #[error("IOMMU group {group} ({bdf}) is in use by {holders}: stop it first")]
    GroupBusy {
        /// The device.
        bdf: Bdf,
        /// The group.
        group: u32,
        /// Who holds it ([`sysfs::describe_holders`](crate::sysfs::describe_holders)).
        holders: String,
    },
    /// Not every device of the group is bound to vfio-pci (or to no driver).
    #[error("IOMMU group {group} of {bdf} is not viable: {members} must also be bound to vfio-pci (or to no driver); run `vfpoll bind` on them, or move the device to another slot")]
    GroupNotViable {
        /// The device.
        bdf: Bdf,
        /// The group.
        group: u32,
        /// The other members and their drivers, e.g. `0000:00:1f.2 (ahci)`.
        members: String,
    },
    /// A region index that the device does not have or that cannot be mapped.
    #[error("{bdf}: region {index} {why}")]
    Region {
        /// The device.
        bdf: Bdf,
        /// The region index (BARs are 0..=5, config space is 7).
        index: u32,
        /// What is wrong.
        why: &'static str,
    },
    /// A DMA mapping was refused.
    #[error("{call} of {len:#x} bytes at {iova} failed: {source}{hint}")]
    Map {
        /// The ioctl (`VFIO_IOMMU_MAP_DMA` or `IOMMU_IOAS_MAP`).
        call: &'static str,
        /// The I/O virtual address.
        iova: Iova,
        /// The length.
        len: u64,
        /// The cause.
        #[source]
        source: io::Error,
        /// A hint for the common causes.
        hint: &'static str,
    },
    /// `/dev/iommu` is absent (iommufd mode).
    #[error("{path} is missing: iommufd is not loaded (`modprobe iommufd`; the kernel needs CONFIG_IOMMUFD, Linux 6.2+); or use the type1 container (--iommu-backend type1)")]
    NoIommufd {
        /// The path looked for.
        path: PathBuf,
    },
    /// The device has no VFIO cdev (iommufd mode).
    #[error("{bdf} has no VFIO device cdev (no {path}): vfio was built without CONFIG_VFIO_DEVICE_CDEV (Linux 6.6+), so iommufd cannot open it; use the type1 container (--iommu-backend type1)")]
    NoCdev {
        /// The device.
        bdf: Bdf,
        /// What was looked for.
        path: PathBuf,
    },
    /// iommufd mode was asked for a device in a no-IOMMU group.
    #[error("{bdf} is in no-IOMMU group {group}: iommufd needs an IOMMU; pass --iommu-backend noiommu (--noiommu) to use it without one (unsafe: the device can reach all memory)")]
    IommufdNoIommu {
        /// The device.
        bdf: Bdf,
        /// The group.
        group: u32,
    },
    /// The device cdev is bound elsewhere (iommufd mode).
    #[error("{bdf} is in use by {holders}, or its IOMMU group is open: stop it first")]
    DeviceBusy {
        /// The device.
        bdf: Bdf,
        /// Who holds its cdev or its group ([`sysfs::describe_holders`](crate::sysfs::describe_holders)).
        holders: String,
    },
    /// iommufd refused to map a peer device's BAR (P2P DMA).
    #[error("iommufd cannot map a peer device's BAR for DMA on this kernel (IOMMU_IOAS_MAP of {len:#x} bytes at {iova}: {source}): iommufd pins the pages it maps and a BAR's mmap has none (PFNMAP memory), and Linux 6.12 has no dma-buf import into iommufd; use the type1 container (--iommu-backend type1), whose VFIO_IOMMU_MAP_DMA maps a BAR's mmap, or stage the data through hugepage memory")]
    PeerBarUnderIommufd {
        /// The IOVA asked for.
        iova: Iova,
        /// The length.
        len: u64,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },
    /// DMA map/unmap in no-IOMMU mode (the device uses physical addresses there).
    #[error("DMA mapping is not available in no-IOMMU mode: devices use physical addresses there")]
    NotInNoIommu,
    /// A sysfs lookup failed.
    #[error(transparent)]
    Sysfs(#[from] sysfs::SysfsError),
    /// The device was released ([`Device::release`](super::Device::release)): it was removed, or its removal was
    /// requested. Open it again once it is back.
    #[error("{bdf} was released (the kernel asked for it back: the device is being removed or unbound); open it again once it is back (`vfpoll bind {bdf}`)")]
    Released {
        /// The device.
        bdf: Bdf,
    },
    /// Any other failed system call.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

pub(super) fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> VfioError {
    let what = what.into();
    move |source| VfioError::Io { what, source }
}

pub(super) fn open_error(
    e: io::Error,
    path: &std::path::Path,
    absent: impl FnOnce() -> VfioError,
) -> VfioError {
    match e.raw_os_error() {
        Some(libc::ENOENT) => absent(),
        Some(libc::EACCES) | Some(libc::EPERM) => VfioError::Permission {
            path: path.to_owned(),
        },
        _ => VfioError::Io {
            what: format!("open {}", path.display()),
            source: e,
        },
    }
}
