//! The VFIO user API (`include/uapi/linux/vfio.h`) and the iommufd one
//! (`include/uapi/linux/iommufd.h`): ioctl numbers, flags and argument layouts.
//!
//! Arguments are encoded to and decoded from byte buffers by hand (native endian, the C layout),
//! so this module needs no `unsafe`; the layouts are pinned by the size checks below.

/// `VFIO_API_VERSION`.
pub const API_VERSION: i32 = 0;

/// IOMMU model: type1 (x86 VT-d/AMD-Vi).
pub const TYPE1_IOMMU: u64 = 1;
/// IOMMU model: type1 v2 (preferred: stricter unmap semantics).
pub const TYPE1V2_IOMMU: u64 = 3;
/// IOMMU model: none (`CONFIG_VFIO_NOIOMMU`, `enable_unsafe_noiommu_mode=1`).
pub const NOIOMMU_IOMMU: u64 = 8;

const VFIO_TYPE: u64 = b';' as u64;
const VFIO_BASE: u64 = 100;

/// `_IO(VFIO_TYPE, VFIO_BASE + n)`: VFIO ioctls carry no size or direction in their number.
const fn io(n: u64) -> u64 {
    (VFIO_TYPE << 8) | (VFIO_BASE + n)
}

/// ioctl request numbers.
pub mod req {
    use super::io;
    /// Container: returns `API_VERSION`.
    pub const GET_API_VERSION: u64 = io(0);
    /// Container: is an IOMMU model supported? (arg: model, by value)
    pub const CHECK_EXTENSION: u64 = io(1);
    /// Container: set the IOMMU model (arg: model, by value).
    pub const SET_IOMMU: u64 = io(2);
    /// Group: `struct vfio_group_status`.
    pub const GROUP_GET_STATUS: u64 = io(3);
    /// Group: attach to a container (arg: pointer to the container fd).
    pub const GROUP_SET_CONTAINER: u64 = io(4);
    /// Group: detach from its container.
    pub const GROUP_UNSET_CONTAINER: u64 = io(5);
    /// Group: open a device by name (arg: NUL-terminated BDF string); returns the fd.
    pub const GROUP_GET_DEVICE_FD: u64 = io(6);
    /// Device: `struct vfio_device_info`.
    pub const DEVICE_GET_INFO: u64 = io(7);
    /// Device: `struct vfio_region_info`.
    pub const DEVICE_GET_REGION_INFO: u64 = io(8);
    /// Device: `struct vfio_irq_info` of one IRQ index.
    pub const DEVICE_GET_IRQ_INFO: u64 = io(9);
    /// Device: `struct vfio_irq_set` (+ data): trigger eventfds, mask/unmask, disable.
    pub const DEVICE_SET_IRQS: u64 = io(10);
    /// Device: function-level reset.
    pub const DEVICE_RESET: u64 = io(11);
    /// Container: `struct vfio_iommu_type1_info`.
    pub const IOMMU_GET_INFO: u64 = io(12);
    /// Container: `struct vfio_iommu_type1_dma_map`.
    pub const IOMMU_MAP_DMA: u64 = io(13);
    /// Container: `struct vfio_iommu_type1_dma_unmap`.
    pub const IOMMU_UNMAP_DMA: u64 = io(14);
    /// Device cdev: `struct vfio_device_bind_iommufd` (Linux 6.6+).
    pub const DEVICE_BIND_IOMMUFD: u64 = io(18);
    /// Device cdev: `struct vfio_device_attach_iommufd_pt` (Linux 6.6+).
    pub const DEVICE_ATTACH_IOMMUFD_PT: u64 = io(19);
    /// Device cdev: `struct vfio_device_detach_iommufd_pt` (Linux 6.6+).
    pub const DEVICE_DETACH_IOMMUFD_PT: u64 = io(20);
}

/// `VFIO_GROUP_FLAGS_VIABLE`: every device of the group is bound to a VFIO driver or to none.
pub const GROUP_FLAGS_VIABLE: u32 = 1 << 0;
/// `VFIO_GROUP_FLAGS_CONTAINER_SET`.
pub const GROUP_FLAGS_CONTAINER_SET: u32 = 1 << 1;

/// `VFIO_DEVICE_FLAGS_RESET`: the device offers a reset.
pub const DEVICE_FLAGS_RESET: u32 = 1 << 0;
/// `VFIO_DEVICE_FLAGS_PCI`.
pub const DEVICE_FLAGS_PCI: u32 = 1 << 1;

/// `VFIO_REGION_INFO_FLAG_READ`.
pub const REGION_FLAG_READ: u32 = 1 << 0;
/// `VFIO_REGION_INFO_FLAG_WRITE`.
pub const REGION_FLAG_WRITE: u32 = 1 << 1;
/// `VFIO_REGION_INFO_FLAG_MMAP`.
pub const REGION_FLAG_MMAP: u32 = 1 << 2;
/// `VFIO_REGION_INFO_FLAG_CAPS`.
pub const REGION_FLAG_CAPS: u32 = 1 << 3;
/// `VFIO_REGION_INFO_CAP_SPARSE_MMAP`.
pub const REGION_CAP_SPARSE_MMAP: u16 = 1;
/// `VFIO_REGION_INFO_CAP_MSIX_MAPPABLE`.
pub const REGION_CAP_MSIX_MAPPABLE: u16 = 3;

/// `VFIO_PCI_CONFIG_REGION_INDEX`.
pub const PCI_CONFIG_REGION: u32 = 7;
/// `VFIO_PCI_ROM_REGION_INDEX`.
pub const PCI_ROM_REGION: u32 = 6;

/// `VFIO_IOMMU_INFO_PGSIZES`.
pub const IOMMU_INFO_PGSIZES: u32 = 1 << 0;
/// `VFIO_IOMMU_INFO_CAPS`.
pub const IOMMU_INFO_CAPS: u32 = 1 << 1;
/// `VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE`.
pub const IOMMU_CAP_IOVA_RANGE: u16 = 1;
/// `VFIO_IOMMU_TYPE1_INFO_DMA_AVAIL`.
pub const IOMMU_CAP_DMA_AVAIL: u16 = 3;

/// `VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE`.
pub const DMA_MAP_READ_WRITE: u32 = 0b11;

/// `VFIO_IRQ_INFO_EVENTFD`: the index can signal an eventfd.
pub const IRQ_INFO_EVENTFD: u32 = 1 << 0;
/// `VFIO_IRQ_INFO_MASKABLE`.
pub const IRQ_INFO_MASKABLE: u32 = 1 << 1;
/// `VFIO_IRQ_INFO_AUTOMASKED`: the interrupt is masked after it fires (INTx) until unmasked.
pub const IRQ_INFO_AUTOMASKED: u32 = 1 << 2;
/// `VFIO_IRQ_INFO_NORESIZE`: the number of enabled vectors cannot change while enabled.
pub const IRQ_INFO_NORESIZE: u32 = 1 << 3;

/// `VFIO_IRQ_SET_DATA_NONE`.
pub const IRQ_SET_DATA_NONE: u32 = 1 << 0;
/// `VFIO_IRQ_SET_DATA_BOOL`.
pub const IRQ_SET_DATA_BOOL: u32 = 1 << 1;
/// `VFIO_IRQ_SET_DATA_EVENTFD`: the data is one `s32` file descriptor per vector (-1: none).
pub const IRQ_SET_DATA_EVENTFD: u32 = 1 << 2;
/// `VFIO_IRQ_SET_ACTION_MASK`.
pub const IRQ_SET_ACTION_MASK: u32 = 1 << 3;
/// `VFIO_IRQ_SET_ACTION_UNMASK`.
pub const IRQ_SET_ACTION_UNMASK: u32 = 1 << 4;
/// `VFIO_IRQ_SET_ACTION_TRIGGER`.
pub const IRQ_SET_ACTION_TRIGGER: u32 = 1 << 5;

/// Size of `struct vfio_irq_info`.
pub const IRQ_INFO_SIZE: usize = 16;
/// Size of `struct vfio_irq_set` without its data.
pub const IRQ_SET_SIZE: usize = 20;

/// Size of `struct vfio_group_status`.
pub const GROUP_STATUS_SIZE: usize = 8;
/// Size of `struct vfio_device_info` (with `cap_offset` and padding).
pub const DEVICE_INFO_SIZE: usize = 24;
/// Size of `struct vfio_region_info`.
pub const REGION_INFO_SIZE: usize = 32;
/// Size of `struct vfio_iommu_type1_info`.
pub const IOMMU_INFO_SIZE: usize = 24;
/// Size of `struct vfio_iommu_type1_dma_map`.
pub const DMA_MAP_SIZE: usize = 32;
/// Size of `struct vfio_iommu_type1_dma_unmap` (without the dirty-bitmap tail).
pub const DMA_UNMAP_SIZE: usize = 24;

/// `struct vfio_device_bind_iommufd { u32 argsz, flags; s32 iommufd; u32 out_devid; }`.
pub mod bind_iommufd {
    /// `argsz`.
    pub const ARGSZ: usize = 0;
    /// `flags` (must be 0).
    pub const FLAGS: usize = 4;
    /// `iommufd`: the descriptor of `/dev/iommu` to bind to.
    pub const IOMMUFD: usize = 8;
    /// `out_devid`: the device's id in that iommufd.
    pub const OUT_DEVID: usize = 12;
    /// `sizeof`.
    pub const SIZE: usize = 16;
}

/// `struct vfio_device_attach_iommufd_pt { u32 argsz, flags, pt_id; }`.
pub mod attach_iommufd_pt {
    /// `argsz`.
    pub const ARGSZ: usize = 0;
    /// `flags` (must be 0).
    pub const FLAGS: usize = 4;
    /// `pt_id`: in, the IOAS (or HWPT) to attach to; out, the HWPT the kernel attached.
    pub const PT_ID: usize = 8;
    /// `sizeof`.
    pub const SIZE: usize = 12;
}

/// The iommufd user API (`include/uapi/linux/iommufd.h`, Linux 6.12): `/dev/iommu` ioctls.
/// Every argument starts with its `u32 size`; the kernel refuses non-zero bytes it does not
/// know (E2BIG), so buffers are exactly `SIZE` bytes and zeroed.
pub mod iommufd {
    const IOMMUFD_TYPE: u64 = b';' as u64;

    /// `_IO(IOMMUFD_TYPE, cmd)`.
    const fn io(cmd: u64) -> u64 {
        (IOMMUFD_TYPE << 8) | cmd
    }

    /// `IOMMU_DESTROY` (`struct iommu_destroy`).
    pub const DESTROY: u64 = io(0x80);
    /// `IOMMU_IOAS_ALLOC` (`struct iommu_ioas_alloc`).
    pub const IOAS_ALLOC: u64 = io(0x81);
    /// `IOMMU_IOAS_IOVA_RANGES` (`struct iommu_ioas_iova_ranges`).
    pub const IOAS_IOVA_RANGES: u64 = io(0x84);
    /// `IOMMU_IOAS_MAP` (`struct iommu_ioas_map`).
    pub const IOAS_MAP: u64 = io(0x85);
    /// `IOMMU_IOAS_UNMAP` (`struct iommu_ioas_unmap`).
    pub const IOAS_UNMAP: u64 = io(0x86);

    /// `struct iommu_ioas_alloc { u32 size, flags, out_ioas_id; }`.
    pub mod ioas_alloc {
        /// `size`.
        pub const SIZE_FIELD: usize = 0;
        /// `flags` (must be 0).
        pub const FLAGS: usize = 4;
        /// `out_ioas_id`.
        pub const OUT_IOAS_ID: usize = 8;
        /// `sizeof`.
        pub const SIZE: usize = 12;
    }

    /// `struct iommu_ioas_iova_ranges { u32 size, ioas_id, num_iovas, __reserved;
    /// u64 allowed_iovas, out_iova_alignment; }`; `allowed_iovas` points at an array of
    /// `struct iommu_iova_range { u64 start, last; }` (inclusive).
    pub mod iova_ranges {
        /// `size`.
        pub const SIZE_FIELD: usize = 0;
        /// `ioas_id`.
        pub const IOAS_ID: usize = 4;
        /// `num_iovas`: in, the array's capacity; out, how many ranges there are (the ioctl
        /// fails with EMSGSIZE when that is more than the capacity).
        pub const NUM_IOVAS: usize = 8;
        /// `allowed_iovas`: the array's address.
        pub const ALLOWED_IOVAS: usize = 16;
        /// `out_iova_alignment`: the IOVA (and length) alignment IOAS_MAP needs.
        pub const OUT_IOVA_ALIGNMENT: usize = 24;
        /// `sizeof`.
        pub const SIZE: usize = 32;
        /// `sizeof(struct iommu_iova_range)`.
        pub const RANGE_SIZE: usize = 16;
    }

    /// `IOMMU_IOAS_MAP_FIXED_IOVA`: map at the IOVA given (vfpoll's allocator picks it).
    pub const MAP_FIXED_IOVA: u32 = 1 << 0;
    /// `IOMMU_IOAS_MAP_WRITEABLE`: the device may write.
    pub const MAP_WRITEABLE: u32 = 1 << 1;
    /// `IOMMU_IOAS_MAP_READABLE`: the device may read.
    pub const MAP_READABLE: u32 = 1 << 2;

    /// `struct iommu_ioas_map { u32 size, flags, ioas_id, __reserved; u64 user_va, length,
    /// iova; }`.
    pub mod ioas_map {
        /// `size`.
        pub const SIZE_FIELD: usize = 0;
        /// `flags`.
        pub const FLAGS: usize = 4;
        /// `ioas_id`.
        pub const IOAS_ID: usize = 8;
        /// `user_va`.
        pub const USER_VA: usize = 16;
        /// `length`.
        pub const LENGTH: usize = 24;
        /// `iova`.
        pub const IOVA: usize = 32;
        /// `sizeof`.
        pub const SIZE: usize = 40;
    }

    /// `struct iommu_ioas_unmap { u32 size, ioas_id; u64 iova, length; }`.
    pub mod ioas_unmap {
        /// `size`.
        pub const SIZE_FIELD: usize = 0;
        /// `ioas_id`.
        pub const IOAS_ID: usize = 4;
        /// `iova`.
        pub const IOVA: usize = 8;
        /// `length`: in, bytes to unmap; out, bytes unmapped.
        pub const LENGTH: usize = 16;
        /// `sizeof`.
        pub const SIZE: usize = 24;
    }

    /// `struct iommu_destroy { u32 size, id; }`.
    pub mod destroy {
        /// `size`.
        pub const SIZE_FIELD: usize = 0;
        /// `id`.
        pub const ID: usize = 4;
        /// `sizeof`.
        pub const SIZE: usize = 8;
    }
}

/// The C layouts, for the compile-time checks of the offsets above (never used at run time).
#[allow(dead_code)]
mod layout {
    use std::mem::{offset_of, size_of};

    #[repr(C)]
    struct VfioDeviceBindIommufd {
        argsz: u32,
        flags: u32,
        iommufd: i32,
        out_devid: u32,
    }
    #[repr(C)]
    struct VfioDeviceAttachIommufdPt {
        argsz: u32,
        flags: u32,
        pt_id: u32,
    }
    #[repr(C)]
    struct IommuIoasAlloc {
        size: u32,
        flags: u32,
        out_ioas_id: u32,
    }
    #[repr(C)]
    struct IommuIoasIovaRanges {
        size: u32,
        ioas_id: u32,
        num_iovas: u32,
        reserved: u32,
        allowed_iovas: u64,
        out_iova_alignment: u64,
    }
    #[repr(C)]
    struct IommuIovaRange {
        start: u64,
        last: u64,
    }
    #[repr(C)]
    struct IommuIoasMap {
        size: u32,
        flags: u32,
        ioas_id: u32,
        reserved: u32,
        user_va: u64,
        length: u64,
        iova: u64,
    }
    #[repr(C)]
    struct IommuIoasUnmap {
        size: u32,
        ioas_id: u32,
        iova: u64,
        length: u64,
    }
    #[repr(C)]
    struct IommuDestroy {
        size: u32,
        id: u32,
    }

    use super::iommufd::{destroy, ioas_alloc, ioas_map, ioas_unmap, iova_ranges};
    use super::{attach_iommufd_pt, bind_iommufd};
    const _: () = {
        assert!(size_of::<VfioDeviceBindIommufd>() == bind_iommufd::SIZE);
        assert!(offset_of!(VfioDeviceBindIommufd, flags) == bind_iommufd::FLAGS);
        assert!(offset_of!(VfioDeviceBindIommufd, iommufd) == bind_iommufd::IOMMUFD);
        assert!(offset_of!(VfioDeviceBindIommufd, out_devid) == bind_iommufd::OUT_DEVID);
        assert!(size_of::<VfioDeviceAttachIommufdPt>() == attach_iommufd_pt::SIZE);
        assert!(offset_of!(VfioDeviceAttachIommufdPt, pt_id) == attach_iommufd_pt::PT_ID);
        assert!(size_of::<IommuIoasAlloc>() == ioas_alloc::SIZE);
        assert!(offset_of!(IommuIoasAlloc, out_ioas_id) == ioas_alloc::OUT_IOAS_ID);
        assert!(size_of::<IommuIoasIovaRanges>() == iova_ranges::SIZE);
        assert!(offset_of!(IommuIoasIovaRanges, ioas_id) == iova_ranges::IOAS_ID);
        assert!(offset_of!(IommuIoasIovaRanges, num_iovas) == iova_ranges::NUM_IOVAS);
        assert!(offset_of!(IommuIoasIovaRanges, allowed_iovas) == iova_ranges::ALLOWED_IOVAS);
        assert!(offset_of!(IommuIoasIovaRanges, out_iova_alignment) == iova_ranges::OUT_IOVA_ALIGNMENT);
        assert!(size_of::<IommuIovaRange>() == iova_ranges::RANGE_SIZE);
        assert!(size_of::<IommuIoasMap>() == ioas_map::SIZE);
        assert!(offset_of!(IommuIoasMap, flags) == ioas_map::FLAGS);
        assert!(offset_of!(IommuIoasMap, ioas_id) == ioas_map::IOAS_ID);
        assert!(offset_of!(IommuIoasMap, user_va) == ioas_map::USER_VA);
        assert!(offset_of!(IommuIoasMap, length) == ioas_map::LENGTH);
        assert!(offset_of!(IommuIoasMap, iova) == ioas_map::IOVA);
        assert!(size_of::<IommuIoasUnmap>() == ioas_unmap::SIZE);
        assert!(offset_of!(IommuIoasUnmap, ioas_id) == ioas_unmap::IOAS_ID);
        assert!(offset_of!(IommuIoasUnmap, iova) == ioas_unmap::IOVA);
        assert!(offset_of!(IommuIoasUnmap, length) == ioas_unmap::LENGTH);
        assert!(size_of::<IommuDestroy>() == destroy::SIZE);
        assert!(offset_of!(IommuDestroy, id) == destroy::ID);
    };
}

/// Reads a native-endian `u32` at `off`.
pub fn get_u32(b: &[u8], off: usize) -> u32 {
    u32::from_ne_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}

/// Reads a native-endian `u64` at `off`.
pub fn get_u64(b: &[u8], off: usize) -> u64 {
    u64::from_ne_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

/// Reads a native-endian `u16` at `off`.
pub fn get_u16(b: &[u8], off: usize) -> u16 {
    u16::from_ne_bytes(b[off..off + 2].try_into().expect("2 bytes"))
}

/// Writes a native-endian `u32` at `off`.
pub fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_ne_bytes());
}

/// Writes a native-endian `u64` at `off`.
pub fn put_u64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_ne_bytes());
}

/// Writes a native-endian `u16` at `off`.
pub fn put_u16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_ne_bytes());
}

/// One capability in a VFIO info capability chain (`struct vfio_info_cap_header` + body).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cap<'a> {
    /// Capability id.
    pub id: u16,
    /// Capability version.
    pub version: u16,
    /// The bytes from the header to the end of the buffer (the body starts at offset 8).
    pub bytes: &'a [u8],
}

/// Walks a capability chain starting at `first` (0 = none). Offsets are from the start of `buf`.
/// A malformed chain (an offset out of bounds, a loop) ends the walk instead of panicking.
pub fn caps(buf: &[u8], first: u32) -> Vec<Cap<'_>> {
    let mut out = Vec::new();
    let mut off = first as usize;
    while off != 0 && off + 8 <= buf.len() && out.len() < 64 {
        let id = get_u16(buf, off);
        let version = get_u16(buf, off + 2);
        let next = get_u32(buf, off + 4) as usize;
        out.push(Cap {
            id,
            version,
            bytes: &buf[off..],
        });
        if next <= off {
            break;
        }
        off = next;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_the_kernel() {
        // Values from <linux/vfio.h> as compiled by gcc on x86_64.
        assert_eq!(req::GET_API_VERSION, 0x3b64);
        assert_eq!(req::SET_IOMMU, 0x3b66);
        assert_eq!(req::GROUP_GET_DEVICE_FD, 0x3b6a);
        assert_eq!(req::DEVICE_GET_REGION_INFO, 0x3b6c);
        assert_eq!(req::DEVICE_GET_IRQ_INFO, 0x3b6d);
        assert_eq!(req::DEVICE_SET_IRQS, 0x3b6e);
        assert_eq!(req::DEVICE_RESET, 0x3b6f);
        assert_eq!(req::IOMMU_MAP_DMA, 0x3b71);
        assert_eq!(req::IOMMU_UNMAP_DMA, 0x3b72);
        // <linux/vfio.h> and <linux/iommufd.h> of Linux 6.12.
        assert_eq!(req::DEVICE_BIND_IOMMUFD, 0x3b76);
        assert_eq!(req::DEVICE_ATTACH_IOMMUFD_PT, 0x3b77);
        assert_eq!(req::DEVICE_DETACH_IOMMUFD_PT, 0x3b78);
        assert_eq!(iommufd::DESTROY, 0x3b80);
        assert_eq!(iommufd::IOAS_ALLOC, 0x3b81);
        assert_eq!(iommufd::IOAS_IOVA_RANGES, 0x3b84);
        assert_eq!(iommufd::IOAS_MAP, 0x3b85);
        assert_eq!(iommufd::IOAS_UNMAP, 0x3b86);
    }

    #[test]
    fn cap_chain_walk_stops_on_loops_and_bounds() {
        let mut b = vec![0u8; 64];
        put_u16(&mut b, 16, 1);
        put_u32(&mut b, 20, 32);
        put_u16(&mut b, 32, 3);
        put_u32(&mut b, 36, 16); // loops back
        let c = caps(&b, 16);
        assert_eq!(c.iter().map(|c| c.id).collect::<Vec<_>>(), vec![1, 3]);
        assert!(caps(&b, 0).is_empty());
        assert!(caps(&b, 60).is_empty());
    }
}
