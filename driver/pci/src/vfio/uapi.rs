//! The VFIO user API (`include/uapi/linux/vfio.h`): ioctl numbers, flags and argument layouts.
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
