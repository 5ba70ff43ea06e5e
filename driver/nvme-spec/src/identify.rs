//! Identify data structures (NVMe Base 2.0 §5.17.2), parsed from the 4 KiB pages the controller
//! returns. Only fields vfpoll uses or shows are decoded; the raw page is kept for the rest.

use core::fmt;

use crate::bytes::{le16, le32, le64};

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
    /// RTD3 Entry Latency: the typical time, in microseconds, to enter runtime D3 after a
    /// normal shutdown notification (0 = not reported; bytes 91:88). Bounds the shutdown wait.
    pub rtd3e: u32,
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
            rtd3e: le32(b, 88),
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
    /// limit, also for an MDTS too large for a `usize`: a shift by it would overflow).
    pub fn mdts_bytes(&self, mps_min: usize) -> Option<usize> {
        let bytes = mps_min.checked_shl(self.mdts.into())?;
        (self.mdts != 0 && bytes >> self.mdts == mps_min).then_some(bytes)
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

    /// Property tests: parsers take any bytes the controller may send (of any length where they
    /// take a slice of any length; at least a page where they assert it) without panicking,
    /// and a page built from random field values parses back to them. 256 cases per property
    /// (see [`crate::proptest_support`]).
    mod props {
        use super::*;
        use crate::proptest_support::{config, page};
        use proptest::prelude::*;

        /// Printable ASCII with no leading or trailing space, at most `max` bytes.
        fn text(max: usize) -> impl Strategy<Value = String> {
            let re = format!("[!-~]([ -~]{{0,{}}}[!-~])?", max - 2);
            prop_oneof![
                Just(String::new()),
                prop::string::string_regex(&re).expect("a valid regex")
            ]
        }

        /// `s` padded to `field` bytes with spaces or NULs (both are padding, Figure 275).
        fn put_text(b: &mut [u8], s: &str, nul: bool) {
            b.fill(if nul { 0 } else { b' ' });
            b[..s.len()].copy_from_slice(s.as_bytes());
        }

        fn controller() -> impl Strategy<Value = IdentifyController> {
            (
                any::<(u16, u16, u8, u8, u16, u32)>(),
                any::<(u32, u32, u16, u8, u8, u8)>(),
                any::<(u8, u8, u8, u16, u32, u16)>(),
                any::<(u8, u32, u32)>(),
                (text(20), text(40), text(8), text(256)),
            )
                .prop_map(|(a, b, c, d, e)| IdentifyController {
                    vid: a.0,
                    ssvid: a.1,
                    cmic: a.2,
                    mdts: a.3,
                    cntlid: a.4,
                    ver: a.5,
                    oaes: b.0,
                    ctratt: b.1,
                    oacs: b.2,
                    acl: b.3,
                    aerl: b.4,
                    lpa: b.5,
                    elpe: c.0,
                    sqes: c.1,
                    cqes: c.2,
                    maxcmd: c.3,
                    nn: c.4,
                    oncs: c.5,
                    vwc: d.0,
                    sgls: d.1,
                    rtd3e: d.2,
                    serial: e.0,
                    model: e.1,
                    firmware: e.2,
                    subnqn: e.3,
                })
        }

        /// Writes `c` into `b` (Figure 275 offsets), leaving every other byte as it was.
        fn encode_controller(c: &IdentifyController, b: &mut [u8], nul: bool) {
            b[0..2].copy_from_slice(&c.vid.to_le_bytes());
            b[2..4].copy_from_slice(&c.ssvid.to_le_bytes());
            put_text(&mut b[4..24], &c.serial, nul);
            put_text(&mut b[24..64], &c.model, nul);
            put_text(&mut b[64..72], &c.firmware, nul);
            b[76] = c.cmic;
            b[77] = c.mdts;
            b[78..80].copy_from_slice(&c.cntlid.to_le_bytes());
            b[80..84].copy_from_slice(&c.ver.to_le_bytes());
            b[88..92].copy_from_slice(&c.rtd3e.to_le_bytes());
            b[92..96].copy_from_slice(&c.oaes.to_le_bytes());
            b[96..100].copy_from_slice(&c.ctratt.to_le_bytes());
            b[256..258].copy_from_slice(&c.oacs.to_le_bytes());
            b[258] = c.acl;
            b[259] = c.aerl;
            b[261] = c.lpa;
            b[262] = c.elpe;
            b[512] = c.sqes;
            b[513] = c.cqes;
            b[514..516].copy_from_slice(&c.maxcmd.to_le_bytes());
            b[516..520].copy_from_slice(&c.nn.to_le_bytes());
            b[520..522].copy_from_slice(&c.oncs.to_le_bytes());
            b[525] = c.vwc;
            b[536..540].copy_from_slice(&c.sgls.to_le_bytes());
            put_text(&mut b[768..1024], &c.subnqn, nul);
        }

        /// Identify Namespace field values: (nsze, ncap, nuse, nsfeat, [mc, dpc, dps, nmic]),
        /// the formats, the index in use, extended LBAs, FLBAS bit 7 (reserved), nguid, eui64.
        type NsFields = (
            (u64, u64, u64, u8, [u8; 4]),
            Vec<LbaFormat>,
            u8,
            bool,
            bool,
            [u8; 16],
            [u8; 8],
        );

        fn namespace_fields() -> impl Strategy<Value = NsFields> {
            let lbaf =
                (any::<u16>(), any::<u8>(), 0u8..4).prop_map(|(ms, lbads, rp)| LbaFormat { ms, lbads, rp });
            (
                (1u64.., any::<u64>(), any::<u64>(), any::<u8>(), any::<[u8; 4]>()),
                prop::collection::vec(lbaf, 1..=64),
                0u8..64,
                any::<bool>(),
                any::<bool>(),
                any::<[u8; 16]>(),
                any::<[u8; 8]>(),
            )
        }

        /// Writes the fields into `b` (NVM Command Set 1.0 Figure 97), leaving other bytes.
        fn encode_namespace(f: &NsFields, b: &mut [u8]) {
            let ((nsze, ncap, nuse, nsfeat, [mc, dpc, dps, nmic]), formats, index, ext, bit7, nguid, eui) = f;
            b[0..8].copy_from_slice(&nsze.to_le_bytes());
            b[8..16].copy_from_slice(&ncap.to_le_bytes());
            b[16..24].copy_from_slice(&nuse.to_le_bytes());
            b[24] = *nsfeat;
            b[25] = formats.len() as u8 - 1;
            // FLBAS: index bits 3:0, extended bit 4, index bits 5:4 in bits 6:5.
            b[26] = (index & 0xf) | (*ext as u8) << 4 | (index >> 4) << 5 | (*bit7 as u8) << 7;
            (b[27], b[28], b[29], b[30]) = (*mc, *dpc, *dps, *nmic);
            b[104..120].copy_from_slice(nguid);
            b[120..128].copy_from_slice(eui);
            for (i, l) in formats.iter().enumerate() {
                let v = l.ms as u32 | (l.lbads as u32) << 16 | (l.rp as u32) << 24;
                b[128 + 4 * i..132 + 4 * i].copy_from_slice(&v.to_le_bytes());
            }
        }

        /// Found by `any_controller_page_parses`: MDTS 64 or more made `mdts_bytes` shift
        /// out of range (a panic in debug builds), and 52..=63 shifted every bit out (a limit
        /// of 0 bytes). A limit beyond a `usize` is no limit.
        #[test]
        fn mdts_beyond_a_usize_is_no_limit() {
            let mut b = vec![0u8; 4096];
            for (mdts, want) in [(51u8, Some(1usize << 63)), (52, None), (64, None), (255, None)] {
                b[77] = mdts;
                assert_eq!(
                    IdentifyController::parse(&b).mdts_bytes(4096),
                    want,
                    "MDTS {mdts}"
                );
            }
        }

        proptest! {
            #![proptest_config(config(256))]

            /// Any page parses, its fixed fields are read from the first 4096 bytes only, and
            /// the helpers derived from it do not panic either.
            #[test]
            fn any_controller_page_parses(b in page(), mps_shift in 12u32..=27) {
                let c = IdentifyController::parse(&b);
                prop_assert_eq!(&c, &IdentifyController::parse(&b[..4096]));
                // MDTS is a power of two of the page size: no limit for 0, and none where the
                // power is beyond a usize.
                let fits = mps_shift + u32::from(c.mdts) < usize::BITS;
                let want = (c.mdts != 0 && fits).then(|| 1usize << (mps_shift + u32::from(c.mdts)));
                prop_assert_eq!(c.mdts_bytes(1 << mps_shift), want);
                let _ = (c.sgl_supported(), c.sgl_dword_aligned(), c.namespace_attribute_notices());
                let _ = (c.extended_lba_formats(), c.has_volatile_write_cache(), format!("{c:?}"));
            }

            /// A page built from random field values over random bytes parses back to them.
            #[test]
            fn controller_page_round_trips(c in controller(), mut b in page(), nul in any::<bool>()) {
                encode_controller(&c, &mut b, nul);
                let got = IdentifyController::parse(&b);
                prop_assert_eq!(&got, &c);
                prop_assert_eq!(got.sgl_supported(), c.sgls & 3 != 0);
                prop_assert_eq!(got.sgl_dword_aligned(), c.sgls & 3 == 2);
                prop_assert_eq!(got.namespace_attribute_notices(), c.oaes & 0x100 != 0);
                prop_assert_eq!(got.extended_lba_formats(), c.ctratt & 0x8000 != 0);
                if c.mdts != 0 && c.mdts <= 20 {
                    prop_assert_eq!(got.mdts_bytes(4096), Some(4096usize << c.mdts));
                }
                prop_assert_eq!(got.mdts_bytes(4096).is_none(), c.mdts == 0 || c.mdts > 51);
            }

            /// Any page is an inactive namespace (NSZE 0) or one whose formats are those listed
            /// (NLBAF + 1, at most 64) and whose format in use can always be asked for.
            #[test]
            fn any_namespace_page_parses(b in page()) {
                let n = IdentifyNamespace::parse(&b);
                prop_assert_eq!(&n, &IdentifyNamespace::parse(&b[..4096]));
                let nsze = u64::from_le_bytes(b[0..8].try_into().unwrap());
                prop_assert_eq!(n.is_none(), nsze == 0);
                if let Some(n) = n {
                    prop_assert_eq!(n.lba_formats.len(), (b[25] as usize + 1).min(64));
                    prop_assert!(n.format_index < 64);
                    let f = n.lba_format();
                    match n.lba_formats.get(n.format_index as usize) {
                        Some(&listed) => prop_assert_eq!(f, listed),
                        None => prop_assert_eq!(f, LbaFormat { ms: 0, lbads: 9, rp: 0 }),
                    }
                }
            }

            /// A namespace page built from random values (every FLBAS index, with the
            /// extended bit and the reserved bit 7) parses back to them.
            #[test]
            fn namespace_page_round_trips(f in namespace_fields(), mut b in page()) {
                encode_namespace(&f, &mut b);
                let ((nsze, ncap, nuse, nsfeat, [mc, dpc, dps, nmic]), formats, index, ext, _, nguid, eui64) =
                    f;
                let n = IdentifyNamespace::parse(&b).expect("NSZE is not 0");
                prop_assert_eq!(n, IdentifyNamespace {
                    nsze, ncap, nuse, nsfeat, lba_formats: formats.clone(), format_index: index,
                    extended_lba: ext, mc, dpc, dps, nmic, nguid, eui64,
                });
            }

            /// An NSID list is the leading non-zero little-endian words of whole 4-byte chunks,
            /// whatever the length.
            #[test]
            fn ns_list_round_trips(
                ids in prop::collection::vec(1u32.., 0..64),
                tail in prop::collection::vec(any::<u8>(), 0..64),
                cut in 0usize..4,
            ) {
                let mut b: Vec<u8> = ids.iter().flat_map(|i| i.to_le_bytes()).collect();
                // A 0 ends the list; whatever follows it is not read.
                b.extend_from_slice(&[0; 4]);
                b.extend_from_slice(&tail);
                prop_assert_eq!(parse_ns_list(&b), ids.clone());
                // A list cut short (not even a whole last entry) keeps its whole entries.
                let short = &b[..(ids.len() * 4).saturating_sub(cut)];
                prop_assert_eq!(parse_ns_list(short), ids[..short.len() / 4].to_vec());
            }

            #[test]
            fn any_ns_list_parses(b in prop::collection::vec(any::<u8>(), 0..600)) {
                let l = parse_ns_list(&b);
                prop_assert!(l.len() <= b.len() / 4 && !l.contains(&0));
            }

            /// A descriptor list built of random descriptors finds the first CSI descriptor;
            /// cut anywhere, it finds that CSI or nothing, never another value or a panic.
            #[test]
            fn csi_descriptors_round_trip(
                descs in prop::collection::vec(
                    (prop_oneof![Just(1u8), Just(2), Just(3), 5u8..=255], any::<u8>()),
                    0..8,
                ),
                csi in prop::option::of((0usize..8, any::<u8>())),
                cut in 0usize..4096,
            ) {
                let mut b = Vec::new();
                let mut expect = None;
                for (i, &(ty, v)) in descs.iter().enumerate() {
                    if let Some((at, c)) = csi {
                        if at == i && expect.is_none() {
                            b.extend_from_slice(&[4, 1, 0, 0, c]);
                            expect = Some((c, b.len()));
                        }
                    }
                    // EUI64 8, NGUID and UUID 16 bytes; unknown types any non-zero length.
                    let len = match ty { 1 => 8, 2 | 3 => 16, _ => v.max(1) as usize };
                    b.extend_from_slice(&[ty, len as u8, 0, 0]);
                    b.extend(std::iter::repeat_n(v, len));
                }
                if let (Some((_, c)), None) = (csi, expect) {
                    b.extend_from_slice(&[4, 1, 0, 0, c]);
                    expect = Some((c, b.len()));
                }
                b.resize(b.len().max(4096), 0);
                prop_assert_eq!(csi_of_descriptors(&b), expect.map(|e| e.0));
                let got = csi_of_descriptors(&b[..cut.min(b.len())]);
                match expect {
                    Some((c, end)) if cut >= end => prop_assert_eq!(got, Some(c)),
                    _ => prop_assert!(got.is_none() || got == expect.map(|e| e.0)),
                }
            }

            #[test]
            fn any_descriptor_list_parses(b in prop::collection::vec(any::<u8>(), 0..600)) {
                let _ = csi_of_descriptors(&b);
            }

            /// SMART log: a 512-byte page built from random values parses back to them (the
            /// parser's precondition is the 512-byte page).
            #[test]
            fn smart_log_round_trips(
                w in any::<(u8, u16, u8, u8)>(),
                c in prop::array::uniform9(any::<u64>()),
                mut b in prop::collection::vec(any::<u8>(), 512),
            ) {
                b[0] = w.0;
                b[1..3].copy_from_slice(&w.1.to_le_bytes());
                (b[3], b[5]) = (w.2, w.3);
                for (i, at) in [32, 48, 64, 80, 112, 128, 144, 160, 176].into_iter().enumerate() {
                    b[at..at + 8].copy_from_slice(&c[i].to_le_bytes());
                }
                prop_assert_eq!(SmartLog::parse(&b), SmartLog {
                    critical_warning: w.0, temperature_k: w.1, available_spare: w.2, percent_used: w.3,
                    data_units_read: c[0], data_units_written: c[1], host_reads: c[2], host_writes: c[3],
                    power_cycles: c[4], power_on_hours: c[5], unsafe_shutdowns: c[6], media_errors: c[7],
                    error_log_entries: c[8],
                });
            }

            /// Error log: 64-byte entries built from random values parse back to them, one by
            /// one from a log page of several.
            #[test]
            fn error_log_entries_round_trip(
                entries in prop::collection::vec(any::<(u64, u16, u16, u16, u64, u32)>(), 1..8),
                noise in any::<u8>(),
            ) {
                let mut b = vec![noise; entries.len() * ErrorLogEntry::SIZE];
                let each = b.chunks_exact_mut(ErrorLogEntry::SIZE).zip(&entries);
                for (e, (count, sqid, cid, status, lba, nsid)) in each {
                    e[0..8].copy_from_slice(&count.to_le_bytes());
                    e[8..10].copy_from_slice(&sqid.to_le_bytes());
                    e[10..12].copy_from_slice(&cid.to_le_bytes());
                    e[12..14].copy_from_slice(&status.to_le_bytes());
                    e[16..24].copy_from_slice(&lba.to_le_bytes());
                    e[24..28].copy_from_slice(&nsid.to_le_bytes());
                }
                let got: Vec<ErrorLogEntry> =
                    b.chunks_exact(ErrorLogEntry::SIZE).map(ErrorLogEntry::parse).collect();
                let want: Vec<ErrorLogEntry> = entries
                    .iter()
                    .map(|&(error_count, sqid, cid, status, lba, nsid)| {
                        ErrorLogEntry { error_count, sqid, cid, status, lba, nsid }
                    })
                    .collect();
                prop_assert_eq!(got, want);
            }
        }
    }
}
