//! Identify data structures (NVMe Base 2.0 §5.17.2), parsed from the 4 KiB pages the controller
//! returns. Only fields vfpoll uses or shows are decoded; the raw page is kept for the rest.

use core::fmt;

fn le16(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn le32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}
fn le64(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}
fn ascii(b: &[u8]) -> String {
    String::from_utf8_lossy(b)
        .trim_end_matches([' ', '\0'])
        .trim_start()
        .to_owned()
}

/// Identify Controller (CNS 01h, NVMe Base 2.0 Figure 275).
#[derive(Clone, PartialEq, Eq)]
pub struct IdentifyController {
    /// PCI Vendor ID.
    pub vid: u16,
    /// PCI Subsystem Vendor ID.
    pub ssvid: u16,
    /// Serial Number.
    pub serial: String,
    /// Model Number.
    pub model: String,
    /// Firmware Revision.
    pub firmware: String,
    /// Controller Multi-Path I/O and Namespace Sharing Capabilities.
    pub cmic: u8,
    /// Maximum Data Transfer Size, as a power of two of CAP.MPSMIN (0 = no limit).
    pub mdts: u8,
    /// Controller ID.
    pub cntlid: u16,
    /// Version (same encoding as VS).
    pub ver: u32,
    /// Optional Asynchronous Events Supported (bit 8: Namespace Attribute Notices).
    pub oaes: u32,
    /// Controller Attributes (bit 15: Extended LBA Formats Supported, ELBAS).
    pub ctratt: u32,
    /// Optional Admin Command Support.
    pub oacs: u16,
    /// Abort Command Limit (0's based).
    pub acl: u8,
    /// Asynchronous Event Request Limit (0's based).
    pub aerl: u8,
    /// Log Page Attributes.
    pub lpa: u8,
    /// Error Log Page Entries (0's based).
    pub elpe: u8,
    /// Submission Queue Entry Size (required/maximum, log2).
    pub sqes: u8,
    /// Completion Queue Entry Size (required/maximum, log2).
    pub cqes: u8,
    /// Maximum Outstanding Commands (0 = not reported).
    pub maxcmd: u16,
    /// Number of Namespaces (the largest valid NSID).
    pub nn: u32,
    /// Optional NVM Command Support.
    pub oncs: u16,
    /// Volatile Write Cache.
    pub vwc: u8,
    /// SGL Support.
    pub sgls: u32,
    /// NVM Subsystem NVMe Qualified Name.
    pub subnqn: String,
}

/// The PCI vendor ID of QEMU's emulated NVMe controller (Red Hat, Inc.).
pub const QEMU_VID: u16 = 0x1b36;

/// OACS bits (Figure 275, bytes 257:256).
pub mod oacs {
    /// Format NVM supported.
    pub const FORMAT: u16 = 1 << 1;
    /// Namespace Management supported.
    pub const NS_MGMT: u16 = 1 << 3;
    /// Doorbell Buffer Config supported.
    pub const DBBUF: u16 = 1 << 8;
}

/// ONCS bits (Figure 275, bytes 521:520).
pub mod oncs {
    /// Compare supported.
    pub const COMPARE: u16 = 1 << 0;
    /// Write Uncorrectable supported.
    pub const WRITE_UNCORRECTABLE: u16 = 1 << 1;
    /// Dataset Management supported.
    pub const DSM: u16 = 1 << 2;
    /// Write Zeroes supported.
    pub const WRITE_ZEROES: u16 = 1 << 3;
}

impl IdentifyController {
    /// Parses the 4096-byte page.
    pub fn parse(b: &[u8]) -> Self {
        assert!(b.len() >= 4096, "an Identify page is 4096 bytes");
        IdentifyController {
            vid: le16(b, 0),
            ssvid: le16(b, 2),
            serial: ascii(&b[4..24]),
            model: ascii(&b[24..64]),
            firmware: ascii(&b[64..72]),
            cmic: b[76],
            mdts: b[77],
            cntlid: le16(b, 78),
            ver: le32(b, 80),
            oaes: le32(b, 92),
            ctratt: le32(b, 96),
            oacs: le16(b, 256),
            acl: b[258],
            aerl: b[259],
            lpa: b[261],
            elpe: b[262],
            sqes: b[512],
            cqes: b[513],
            maxcmd: le16(b, 514),
            nn: le32(b, 516),
            oncs: le16(b, 520),
            vwc: b[525],
            sgls: le32(b, 536),
            subnqn: ascii(&b[768..1024]),
        }
    }

    /// MDTS in bytes for a controller whose minimum memory page size is `mps_min` (`None` = no
    /// limit).
    pub fn mdts_bytes(&self, mps_min: usize) -> Option<usize> {
        (self.mdts != 0).then(|| mps_min << self.mdts)
    }

    /// Whether the controller supports SGLs for the NVM command set (SGLS bits 1:0 != 0).
    pub fn sgl_supported(&self) -> bool {
        self.sgls & 0b11 != 0
    }

    /// Whether SGL data blocks must be dword aligned (SGLS bits 1:0 == 10b).
    pub fn sgl_dword_aligned(&self) -> bool {
        self.sgls & 0b11 == 0b10
    }

    /// Whether the controller sends Namespace Attribute Notices (OAES bit 8).
    pub fn namespace_attribute_notices(&self) -> bool {
        self.oaes & (1 << 8) != 0
    }

    /// Whether the controller supports extended LBA formats, and so protection information
    /// formats other than the 16-bit guard (CTRATT bit 15, ELBAS; NVMe Base 2.0 Figure 275).
    pub fn extended_lba_formats(&self) -> bool {
        self.ctratt & (1 << 15) != 0
    }

    /// Whether a volatile write cache is present.
    pub fn has_volatile_write_cache(&self) -> bool {
        self.vwc & 1 == 1
    }
}

impl fmt::Debug for IdentifyController {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdentifyController")
            .field("vid", &format_args!("{:#06x}", self.vid))
            .field("serial", &self.serial)
            .field("model", &self.model)
            .field("firmware", &self.firmware)
            .field("mdts", &self.mdts)
            .field("cntlid", &self.cntlid)
            .field("oacs", &format_args!("{:#x}", self.oacs))
            .field("nn", &self.nn)
            .field("oncs", &format_args!("{:#x}", self.oncs))
            .field("sgls", &format_args!("{:#x}", self.sgls))
            .finish_non_exhaustive()
    }
}

/// One LBA format (LBAF, Figure 280).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LbaFormat {
    /// Metadata bytes per LBA.
    pub ms: u16,
    /// LBA data size, log2 bytes.
    pub lbads: u8,
    /// Relative performance (0 best).
    pub rp: u8,
}

impl LbaFormat {
    /// Data bytes per LBA.
    pub fn data_size(&self) -> usize {
        1usize << self.lbads
    }
}

/// Identify Namespace for the NVM command set (CNS 00h, NVM Command Set 1.0 Figure 97).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentifyNamespace {
    /// Namespace Size in logical blocks.
    pub nsze: u64,
    /// Namespace Capacity in logical blocks.
    pub ncap: u64,
    /// Namespace Utilization in logical blocks.
    pub nuse: u64,
    /// Namespace Features.
    pub nsfeat: u8,
    /// The LBA formats the namespace supports.
    pub lba_formats: Vec<LbaFormat>,
    /// Index of the format in use (FLBAS bits 3:0, and bits 6:5 as bits 5:4 of the index).
    pub format_index: u8,
    /// Metadata transferred at the end of each LBA (FLBAS bit 4), else in a separate buffer.
    pub extended_lba: bool,
    /// Metadata Capabilities (MC): bit 0 extended LBAs, bit 1 a separate buffer.
    pub mc: u8,
    /// End-to-end Data Protection Capabilities (DPC).
    pub dpc: u8,
    /// End-to-end Data Protection Type Settings (DPS): bits 2:0 the PI type (0: none), bit 3
    /// PI in the first bytes of the metadata (else the last).
    pub dps: u8,
    /// Namespace Multi-path I/O and Namespace Sharing Capabilities.
    pub nmic: u8,
    /// Namespace Globally Unique Identifier.
    pub nguid: [u8; 16],
    /// IEEE Extended Unique Identifier.
    pub eui64: [u8; 8],
}

impl IdentifyNamespace {
    /// Parses the 4096-byte page; `None` for an all-zero page (an inactive NSID).
    pub fn parse(b: &[u8]) -> Option<Self> {
        assert!(b.len() >= 4096, "an Identify page is 4096 bytes");
        let nsze = le64(b, 0);
        if nsze == 0 {
            return None;
        }
        let nlbaf = b[25] as usize + 1;
        let flbas = b[26];
        let lba_formats = (0..nlbaf.min(64))
            .map(|i| {
                let v = le32(b, 128 + 4 * i);
                LbaFormat {
                    ms: v as u16,
                    lbads: (v >> 16) as u8,
                    rp: ((v >> 24) & 3) as u8,
                }
            })
            .collect();
        Some(IdentifyNamespace {
            nsze,
            ncap: le64(b, 8),
            nuse: le64(b, 16),
            nsfeat: b[24],
            lba_formats,
            format_index: (flbas & 0xf) | ((flbas >> 5) & 0x3) << 4,
            extended_lba: flbas & 0x10 != 0,
            mc: b[27],
            dpc: b[28],
            dps: b[29],
            nmic: b[30],
            nguid: b[104..120].try_into().expect("16 bytes"),
            eui64: b[120..128].try_into().expect("8 bytes"),
        })
    }

    /// The LBA format in use.
    pub fn lba_format(&self) -> LbaFormat {
        self.lba_formats
            .get(self.format_index as usize)
            .copied()
            .unwrap_or(LbaFormat {
                ms: 0,
                lbads: 9,
                rp: 0,
            })
    }
}

/// The command set identifier in a Namespace Identification Descriptor list (CNS 03h, NVMe
/// Base 2.0 Figure 278): the CSI descriptor (type 04h, length 1), if there is one.
pub fn csi_of_descriptors(b: &[u8]) -> Option<u8> {
    let mut at = 0;
    while at + 4 <= b.len() {
        let (nidt, nidl) = (b[at], b[at + 1] as usize);
        if nidt == 0 || nidl == 0 {
            return None;
        }
        if nidt == 4 && nidl == 1 && at + 5 <= b.len() {
            return Some(b[at + 4]);
        }
        at += 4 + nidl;
    }
    None
}

/// Parses an Active Namespace ID list (CNS 02h): NSIDs in increasing order, ending at the first 0.
pub fn parse_ns_list(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
        .take_while(|&n| n != 0)
        .collect()
}

/// SMART / Health Information log page (NVMe Base 2.0 Figure 207), the commonly used fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmartLog {
    /// Critical Warning bits.
    pub critical_warning: u8,
    /// Composite Temperature in kelvins.
    pub temperature_k: u16,
    /// Available Spare, percent.
    pub available_spare: u8,
    /// Percentage Used.
    pub percent_used: u8,
    /// Data Units Read (thousands of 512-byte units; low 64 bits).
    pub data_units_read: u64,
    /// Data Units Written (low 64 bits).
    pub data_units_written: u64,
    /// Host Read Commands (low 64 bits).
    pub host_reads: u64,
    /// Host Write Commands (low 64 bits).
    pub host_writes: u64,
    /// Power Cycles (low 64 bits).
    pub power_cycles: u64,
    /// Power On Hours (low 64 bits).
    pub power_on_hours: u64,
    /// Unsafe Shutdowns (low 64 bits).
    pub unsafe_shutdowns: u64,
    /// Media and Data Integrity Errors (low 64 bits).
    pub media_errors: u64,
    /// Number of Error Information Log Entries (low 64 bits).
    pub error_log_entries: u64,
}

impl SmartLog {
    /// Parses the 512-byte page.
    pub fn parse(b: &[u8]) -> Self {
        SmartLog {
            critical_warning: b[0],
            temperature_k: le16(b, 1),
            available_spare: b[3],
            percent_used: b[5],
            data_units_read: le64(b, 32),
            data_units_written: le64(b, 48),
            host_reads: le64(b, 64),
            host_writes: le64(b, 80),
            power_cycles: le64(b, 112),
            power_on_hours: le64(b, 128),
            unsafe_shutdowns: le64(b, 144),
            media_errors: le64(b, 160),
            error_log_entries: le64(b, 176),
        }
    }
}

/// One Error Information log entry (NVMe Base 2.0 Figure 205).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorLogEntry {
    /// Error Count (0 = an empty entry).
    pub error_count: u64,
    /// Submission Queue ID.
    pub sqid: u16,
    /// Command ID.
    pub cid: u16,
    /// Status field (phase in bit 0).
    pub status: u16,
    /// LBA of the error.
    pub lba: u64,
    /// Namespace.
    pub nsid: u32,
}

impl ErrorLogEntry {
    /// Size of one entry.
    pub const SIZE: usize = 64;

    /// Parses one 64-byte entry.
    pub fn parse(b: &[u8]) -> Self {
        ErrorLogEntry {
            error_count: le64(b, 0),
            sqid: le16(b, 8),
            cid: le16(b, 10),
            status: le16(b, 12),
            lba: le64(b, 16),
            nsid: le32(b, 24),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_controller_page() {
        let mut b = vec![0u8; 4096];
        b[0..2].copy_from_slice(&0x1b36u16.to_le_bytes());
        b[4..24].copy_from_slice(b"vfpoll-a            ");
        b[24..64].copy_from_slice(format!("{:<40}", "QEMU NVMe Ctrl").as_bytes());
        b[64..72].copy_from_slice(b"7.2.22  ");
        b[77] = 7;
        b[256..258].copy_from_slice(&0x10au16.to_le_bytes());
        b[516..520].copy_from_slice(&256u32.to_le_bytes());
        b[536..540].copy_from_slice(&1u32.to_le_bytes());
        b[768..768 + 19].copy_from_slice(b"nqn.2019-08.org.q:x");
        let c = IdentifyController::parse(&b);
        assert_eq!(
            (c.vid, c.serial.as_str(), c.model.as_str(), c.firmware.as_str()),
            (0x1b36, "vfpoll-a", "QEMU NVMe Ctrl", "7.2.22")
        );
        assert_eq!(c.mdts_bytes(4096), Some(512 * 1024));
        assert_eq!(c.nn, 256);
        assert!(c.oacs & oacs::DBBUF != 0);
        assert!(c.sgl_supported() && !c.sgl_dword_aligned());
        assert_eq!(c.subnqn, "nqn.2019-08.org.q:x");
    }

    #[test]
    fn parses_namespace_page_and_list() {
        let mut b = vec![0u8; 4096];
        assert!(IdentifyNamespace::parse(&b).is_none());
        b[0..8].copy_from_slice(&8192u64.to_le_bytes());
        b[25] = 1; // two formats
        b[26] = 1; // using the second
        b[128..132].copy_from_slice(&(9u32 << 16).to_le_bytes());
        b[132..136].copy_from_slice(&((12u32 << 16) | 8).to_le_bytes());
        let n = IdentifyNamespace::parse(&b).unwrap();
        assert_eq!(n.nsze, 8192);
        assert_eq!(
            n.lba_format(),
            LbaFormat {
                ms: 8,
                lbads: 12,
                rp: 0
            }
        );
        assert_eq!(n.lba_format().data_size(), 4096);
        // Namespace Identification Descriptors: an NGUID, then the CSI.
        let mut d = vec![0u8; 4096];
        d[0] = 2;
        d[1] = 16;
        d[20] = 4;
        d[21] = 1;
        d[24] = 2;
        assert_eq!(csi_of_descriptors(&d), Some(2));
        assert_eq!(csi_of_descriptors(&d[..24]), None);
        assert_eq!(csi_of_descriptors(&[0u8; 64]), None);
        let mut l = vec![0u8; 4096];
        l[0..4].copy_from_slice(&1u32.to_le_bytes());
        l[4..8].copy_from_slice(&2u32.to_le_bytes());
        assert_eq!(parse_ns_list(&l), vec![1, 2]);
    }
}
