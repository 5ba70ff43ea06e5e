//! The VIRTIO PCI transport, modern interface (VIRTIO 1.2 §4.1): the vendor-specific
//! capabilities that locate the configuration structures in the BARs (§4.1.4), and the layout
//! of the common configuration structure (§4.1.4.3).

/// PCI capability ID of a vendor-specific capability (every VIRTIO structure, §4.1.4).
pub const CAP_ID_VENDOR: u8 = 0x09;
/// `cfg_type`: common configuration (§4.1.4.3).
pub const CAP_COMMON: u8 = 1;
/// `cfg_type`: notifications (§4.1.4.4).
pub const CAP_NOTIFY: u8 = 2;
/// `cfg_type`: ISR status (§4.1.4.5); unused when polling.
pub const CAP_ISR: u8 = 3;
/// `cfg_type`: device-specific configuration (§4.1.4.6).
pub const CAP_DEVICE: u8 = 4;

/// PCI status register (config offset 0x06) bit: the capability list exists.
const STATUS_CAP_LIST: u8 = 1 << 4;
/// Config offset of the first capability pointer.
const CAP_POINTER: usize = 0x34;

/// Where one structure lies: `length` bytes at `offset` in BAR `bar` (`struct virtio_pci_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapLoc {
    /// BAR index (0..=5).
    pub bar: u8,
    /// Offset in the BAR.
    pub offset: u32,
    /// Length in bytes.
    pub length: u32,
}

/// The structures a modern driver needs, the first capability of each type (§4.1.4: "the
/// driver SHOULD use the first instance of each capability it can support").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// Common configuration.
    pub common: CapLoc,
    /// Notification area.
    pub notify: CapLoc,
    /// `notify_off_multiplier` of the notification capability (§4.1.4.4).
    pub notify_off_multiplier: u32,
    /// Device-specific configuration (for a network device: MAC and link status).
    pub device: Option<CapLoc>,
}

/// Finds the VIRTIO capabilities in the first 256 bytes of configuration space; `None` when the
/// common or notification structure is missing (a legacy-only device).
pub fn parse_caps(cfg: &[u8]) -> Option<Caps> {
    let byte = |o: usize| cfg.get(o).copied();
    let le32 = |o: usize| Some(u32::from_le_bytes(cfg.get(o..o + 4)?.try_into().ok()?));
    if byte(0x06)? & STATUS_CAP_LIST == 0 {
        return None;
    }
    let (mut common, mut notify, mut device, mut mult) = (None, None, None, 0);
    let mut ptr = (byte(CAP_POINTER)? & 0xfc) as usize;
    // At most 48 capabilities fit in 192 bytes; the bound also stops a looping list.
    for _ in 0..48 {
        if ptr < 0x40 {
            break;
        }
        let (id, next) = (byte(ptr)?, byte(ptr + 1)?);
        if id == CAP_ID_VENDOR && byte(ptr + 2)? >= 16 {
            let bar = byte(ptr + 4)?;
            let loc = CapLoc {
                bar,
                offset: le32(ptr + 8)?,
                length: le32(ptr + 12)?,
            };
            // §4.1.4: BAR values 0x6..0xff are reserved; the driver ignores such capabilities.
            if bar <= 5 {
                match byte(ptr + 3)? {
                    CAP_COMMON if common.is_none() => common = Some(loc),
                    CAP_NOTIFY if notify.is_none() && byte(ptr + 2)? >= 20 => {
                        notify = Some(loc);
                        mult = le32(ptr + 16)?;
                    }
                    CAP_DEVICE if device.is_none() => device = Some(loc),
                    _ => {}
                }
            }
        }
        ptr = (next & 0xfc) as usize;
    }
    Some(Caps {
        common: common?,
        notify: notify?,
        notify_off_multiplier: mult,
        device,
    })
}

/// Offsets in the common configuration structure (`struct virtio_pci_common_cfg`, §4.1.4.3).
pub mod common {
    /// u32: selects which 32 feature bits `DEVICE_FEATURE` shows.
    pub const DEVICE_FEATURE_SELECT: usize = 0x00;
    /// u32 (read-only): the selected 32 bits of the device's features.
    pub const DEVICE_FEATURE: usize = 0x04;
    /// u32: selects which 32 feature bits `DRIVER_FEATURE` takes.
    pub const DRIVER_FEATURE_SELECT: usize = 0x08;
    /// u32: the selected 32 bits of the driver's features.
    pub const DRIVER_FEATURE: usize = 0x0c;
    /// u16: MSI-X vector for configuration changes.
    pub const CONFIG_MSIX_VECTOR: usize = 0x10;
    /// u16 (read-only): number of virtqueues.
    pub const NUM_QUEUES: usize = 0x12;
    /// u8: device status (§2.1).
    pub const DEVICE_STATUS: usize = 0x14;
    /// u8: configuration atomicity value (§4.1.4.3.1).
    pub const CONFIG_GENERATION: usize = 0x15;
    /// u16: the queue the `QUEUE_*` fields refer to.
    pub const QUEUE_SELECT: usize = 0x16;
    /// u16: queue size (the device's maximum on reset; the driver may write less).
    pub const QUEUE_SIZE: usize = 0x18;
    /// u16: MSI-X vector of the queue.
    pub const QUEUE_MSIX_VECTOR: usize = 0x1a;
    /// u16: 1 enables the queue.
    pub const QUEUE_ENABLE: usize = 0x1c;
    /// u16 (read-only): the queue's offset in the notification area, in multiplier units.
    pub const QUEUE_NOTIFY_OFF: usize = 0x1e;
    /// u64: descriptor table bus address.
    pub const QUEUE_DESC: usize = 0x20;
    /// u64: available ring ("driver area") bus address.
    pub const QUEUE_DRIVER: usize = 0x28;
    /// u64: used ring ("device area") bus address.
    pub const QUEUE_DEVICE: usize = 0x30;
    /// Size of the structure up to here.
    pub const LEN: usize = 0x38;
}

/// Device status bits (§2.1).
pub mod status {
    /// The guest found the device.
    pub const ACKNOWLEDGE: u8 = 1;
    /// The guest knows how to drive it.
    pub const DRIVER: u8 = 2;
    /// The driver is set up and ready.
    pub const DRIVER_OK: u8 = 4;
    /// Feature negotiation is complete.
    pub const FEATURES_OK: u8 = 8;
    /// The device has experienced an error and needs a reset.
    pub const DEVICE_NEEDS_RESET: u8 = 64;
    /// The guest gave up on the device.
    pub const FAILED: u8 = 128;
}

/// "No MSI-X vector" for `CONFIG_MSIX_VECTOR` and `QUEUE_MSIX_VECTOR` (§4.1.5.1.2).
pub const NO_VECTOR: u16 = 0xffff;

#[cfg(test)]
mod tests {
    use super::*;

    fn cap(cfg: &mut [u8], at: usize, next: u8, ty: u8, (bar, off, len): (u8, u32, u32), extra: Option<u32>) {
        cfg[at] = CAP_ID_VENDOR;
        cfg[at + 1] = next;
        cfg[at + 2] = if extra.is_some() { 20 } else { 16 };
        cfg[at + 3] = ty;
        cfg[at + 4] = bar;
        cfg[at + 8..at + 12].copy_from_slice(&off.to_le_bytes());
        cfg[at + 12..at + 16].copy_from_slice(&len.to_le_bytes());
        if let Some(m) = extra {
            cfg[at + 16..at + 20].copy_from_slice(&m.to_le_bytes());
        }
    }

    /// QEMU's layout: MSI-X first, then the VIRTIO capabilities in BAR4.
    #[test]
    fn finds_the_first_capability_of_each_type() {
        let mut cfg = [0u8; 256];
        cfg[6] = STATUS_CAP_LIST;
        cfg[CAP_POINTER] = 0x98;
        cfg[0x98] = 0x11; // MSI-X
        cfg[0x99] = 0x84;
        cap(&mut cfg, 0x84, 0x70, CAP_DEVICE, (4, 0x2000, 0x1000), None);
        cap(&mut cfg, 0x70, 0x60, CAP_NOTIFY, (4, 0x3000, 0x1000), Some(4));
        cap(&mut cfg, 0x60, 0x50, CAP_ISR, (4, 0x1000, 0x1000), None);
        cap(&mut cfg, 0x50, 0x40, CAP_COMMON, (4, 0, 0x1000), None);
        cap(&mut cfg, 0x40, 0, CAP_COMMON, (9, 0x5000, 0x1000), None); // reserved BAR: ignored
        let c = parse_caps(&cfg).unwrap();
        assert_eq!(
            c.common,
            CapLoc {
                bar: 4,
                offset: 0,
                length: 0x1000
            }
        );
        assert_eq!(c.notify.offset, 0x3000);
        assert_eq!(c.notify_off_multiplier, 4);
        assert_eq!(c.device.unwrap().offset, 0x2000);
    }

    #[test]
    fn legacy_or_looping_lists_give_none() {
        let mut cfg = [0u8; 256];
        assert_eq!(parse_caps(&cfg), None, "no capability list");
        cfg[6] = STATUS_CAP_LIST;
        cfg[CAP_POINTER] = 0x40;
        cap(&mut cfg, 0x40, 0x40, CAP_COMMON, (4, 0, 0x1000), None);
        assert_eq!(parse_caps(&cfg), None, "no notify capability, and the list loops");
        assert_eq!(parse_caps(&cfg[..0x20]), None, "short config space");
    }
}
