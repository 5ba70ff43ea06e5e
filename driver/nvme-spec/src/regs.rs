//! NVMe controller registers (NVMe Base 2.0 §3.1.3, "Controller Properties"), memory-mapped in
//! BAR0 for PCIe controllers (NVMe over PCIe Transport 1.0 §3.1).
//!
//! Offsets come from a `#[repr(C)]` block checked at compile time against the spec's offset map;
//! multi-bit fields have named getters and builders, never inline shifts at the call site.
//! Values only: the driver (`vfpoll-nvme`) reads and writes them through its BAR mapping, the
//! model (`vfpoll-nvme-model`) serves them.

use core::fmt;
use core::mem::offset_of;

/// The register block at the start of BAR0 (NVMe Base 2.0 Figure 33). Used only to name and
/// check offsets: a driver reads registers with volatile accesses, never through this struct.
#[repr(C)]
pub struct Registers {
    /// Controller Capabilities.
    pub cap: u64,
    /// Version.
    pub vs: u32,
    /// Interrupt Mask Set.
    pub intms: u32,
    /// Interrupt Mask Clear.
    pub intmc: u32,
    /// Controller Configuration.
    pub cc: u32,
    _rsvd0: u32,
    /// Controller Status.
    pub csts: u32,
    /// NVM Subsystem Reset.
    pub nssr: u32,
    /// Admin Queue Attributes.
    pub aqa: u32,
    /// Admin Submission Queue Base Address.
    pub asq: u64,
    /// Admin Completion Queue Base Address.
    pub acq: u64,
    /// Controller Memory Buffer Location.
    pub cmbloc: u32,
    /// Controller Memory Buffer Size.
    pub cmbsz: u32,
    /// Boot Partition Information.
    pub bpinfo: u32,
    /// Boot Partition Read Select.
    pub bprsel: u32,
    /// Boot Partition Memory Buffer Location.
    pub bpmbl: u64,
    /// Controller Memory Buffer Memory Space Control.
    pub cmbmsc: u64,
    /// Controller Memory Buffer Status.
    pub cmbsts: u32,
}

/// Register offsets in BAR0.
pub mod off {
    use super::*;
    /// CAP (§3.1.3.1).
    pub const CAP: usize = offset_of!(Registers, cap);
    /// VS (§3.1.3.2).
    pub const VS: usize = offset_of!(Registers, vs);
    /// INTMS (§3.1.3.3).
    pub const INTMS: usize = offset_of!(Registers, intms);
    /// INTMC (§3.1.3.4).
    pub const INTMC: usize = offset_of!(Registers, intmc);
    /// CC (§3.1.3.5).
    pub const CC: usize = offset_of!(Registers, cc);
    /// CSTS (§3.1.3.6).
    pub const CSTS: usize = offset_of!(Registers, csts);
    /// NSSR (§3.1.3.7).
    pub const NSSR: usize = offset_of!(Registers, nssr);
    /// AQA (§3.1.3.8).
    pub const AQA: usize = offset_of!(Registers, aqa);
    /// ASQ (§3.1.3.9).
    pub const ASQ: usize = offset_of!(Registers, asq);
    /// ACQ (§3.1.3.10).
    pub const ACQ: usize = offset_of!(Registers, acq);
    /// CMBLOC (§3.1.3.11).
    pub const CMBLOC: usize = offset_of!(Registers, cmbloc);
    /// CMBSZ (§3.1.3.12).
    pub const CMBSZ: usize = offset_of!(Registers, cmbsz);
    /// CMBMSC (§3.1.3.16).
    pub const CMBMSC: usize = offset_of!(Registers, cmbmsc);
    /// CMBSTS (§3.1.3.17).
    pub const CMBSTS: usize = offset_of!(Registers, cmbsts);
    /// First doorbell (NVMe over PCIe Transport 1.0 §3.1.2).
    pub const DOORBELLS: usize = 0x1000;
}

const _: () = {
    assert!(off::CAP == 0x00);
    assert!(off::VS == 0x08);
    assert!(off::INTMS == 0x0c);
    assert!(off::INTMC == 0x10);
    assert!(off::CC == 0x14);
    assert!(off::CSTS == 0x1c);
    assert!(off::NSSR == 0x20);
    assert!(off::AQA == 0x24);
    assert!(off::ASQ == 0x28);
    assert!(off::ACQ == 0x30);
    assert!(off::CMBLOC == 0x38);
    assert!(off::CMBSZ == 0x3c);
    assert!(off::CMBMSC == 0x50);
    assert!(off::CMBSTS == 0x58);
};

const fn bits(v: u64, lo: u32, width: u32) -> u64 {
    (v >> lo) & ((1 << width) - 1)
}

/// Controller Capabilities (CAP, NVMe Base 2.0 §3.1.3.1).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Cap(pub u64);

impl Cap {
    /// Maximum Queue Entries Supported, as entries (the register holds it 0's based).
    pub const fn max_queue_entries(self) -> u32 {
        bits(self.0, 0, 16) as u32 + 1
    }
    /// Contiguous Queues Required.
    pub const fn contiguous_queues_required(self) -> bool {
        bits(self.0, 16, 1) == 1
    }
    /// Timeout: worst-case time for CSTS.RDY to change after CC.EN changes, in milliseconds
    /// (the register counts 500 ms units).
    pub const fn timeout_ms(self) -> u64 {
        bits(self.0, 24, 8) * 500
    }
    /// Doorbell Stride: bytes between consecutive doorbells (`4 << DSTRD`).
    pub const fn doorbell_stride(self) -> usize {
        4 << bits(self.0, 32, 4)
    }
    /// NVM Subsystem Reset Supported.
    pub const fn nssr_supported(self) -> bool {
        bits(self.0, 36, 1) == 1
    }
    /// Command Sets Supported (bit 0: NVM command set, bit 6: I/O command sets, bit 7: admin only).
    pub const fn command_sets(self) -> u8 {
        bits(self.0, 37, 8) as u8
    }
    /// Memory Page Size Minimum in bytes (`2 ^ (12 + MPSMIN)`).
    pub const fn mps_min(self) -> usize {
        1 << (12 + bits(self.0, 48, 4))
    }
    /// Memory Page Size Maximum in bytes.
    pub const fn mps_max(self) -> usize {
        1 << (12 + bits(self.0, 52, 4))
    }
    /// Persistent Memory Region Supported.
    pub const fn pmr_supported(self) -> bool {
        bits(self.0, 56, 1) == 1
    }
    /// Controller Memory Buffer Supported.
    pub const fn cmb_supported(self) -> bool {
        bits(self.0, 57, 1) == 1
    }
}

impl fmt::Debug for Cap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cap")
            .field("raw", &format_args!("{:#018x}", self.0))
            .field("mqes", &self.max_queue_entries())
            .field("cqr", &self.contiguous_queues_required())
            .field("to_ms", &self.timeout_ms())
            .field("dstrd", &self.doorbell_stride())
            .field("css", &format_args!("{:#x}", self.command_sets()))
            .field("mps_min", &self.mps_min())
            .field("mps_max", &self.mps_max())
            .field("cmbs", &self.cmb_supported())
            .field("pmrs", &self.pmr_supported())
            .finish()
    }
}

/// Version (VS, NVMe Base 2.0 §3.1.3.2).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(pub u32);

impl Version {
    /// Major version.
    pub const fn major(self) -> u16 {
        (self.0 >> 16) as u16
    }
    /// Minor version.
    pub const fn minor(self) -> u8 {
        (self.0 >> 8) as u8
    }
    /// Tertiary version.
    pub const fn tertiary(self) -> u8 {
        self.0 as u8
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major(), self.minor(), self.tertiary())
    }
}

impl fmt::Debug for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Version({self})")
    }
}

/// Shutdown Notification (CC.SHN).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Shutdown {
    /// No notification.
    None = 0,
    /// Normal shutdown.
    Normal = 1,
    /// Abrupt shutdown.
    Abrupt = 2,
}

/// Controller Configuration (CC, NVMe Base 2.0 §3.1.3.5).
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct Cc(pub u32);

impl Cc {
    /// Enable.
    pub const fn enabled(self) -> bool {
        self.0 & 1 == 1
    }
    /// With Enable set or cleared.
    #[must_use]
    pub const fn with_enable(self, on: bool) -> Self {
        Cc((self.0 & !1) | on as u32)
    }
    /// With I/O Command Set Selected (0 = NVM command set, 6 = all supported I/O sets).
    #[must_use]
    pub const fn with_command_set(self, css: u32) -> Self {
        Cc((self.0 & !(0b111 << 4)) | ((css & 0b111) << 4))
    }
    /// With Memory Page Size (`bytes` a power of two ≥ 4096).
    #[must_use]
    pub const fn with_page_size(self, bytes: usize) -> Self {
        let mps = bytes.trailing_zeros() - 12;
        Cc((self.0 & !(0xf << 7)) | ((mps & 0xf) << 7))
    }
    /// Memory page size in bytes.
    pub const fn page_size(self) -> usize {
        1 << (12 + ((self.0 >> 7) & 0xf))
    }
    /// With Shutdown Notification.
    #[must_use]
    pub const fn with_shutdown(self, shn: Shutdown) -> Self {
        Cc((self.0 & !(0b11 << 14)) | ((shn as u32) << 14))
    }
    /// With I/O Submission and Completion Queue Entry Sizes, as log2 of bytes (6 = 64 B SQE,
    /// 4 = 16 B CQE).
    #[must_use]
    pub const fn with_entry_sizes(self, iosqes: u32, iocqes: u32) -> Self {
        Cc((self.0 & !(0xff << 16)) | ((iosqes & 0xf) << 16) | ((iocqes & 0xf) << 20))
    }
}

impl fmt::Debug for Cc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Cc({:#010x}: en={} mps={})",
            self.0,
            self.enabled() as u8,
            self.page_size()
        )
    }
}

/// Shutdown Status (CSTS.SHST).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownStatus {
    /// Normal operation.
    Normal,
    /// Shutdown processing occurring.
    Occurring,
    /// Shutdown processing complete.
    Complete,
    /// Reserved value 3.
    Reserved,
}

/// Controller Status (CSTS, NVMe Base 2.0 §3.1.3.6).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Csts(pub u32);

impl Csts {
    /// Ready.
    pub const fn ready(self) -> bool {
        self.0 & 1 == 1
    }
    /// Controller Fatal Status.
    pub const fn fatal(self) -> bool {
        self.0 & 2 == 2
    }
    /// Shutdown Status.
    pub const fn shutdown_status(self) -> ShutdownStatus {
        match (self.0 >> 2) & 0b11 {
            0 => ShutdownStatus::Normal,
            1 => ShutdownStatus::Occurring,
            2 => ShutdownStatus::Complete,
            _ => ShutdownStatus::Reserved,
        }
    }
    /// Whether the register reads all ones: the device is gone (surprise removal, or a BAR that
    /// no longer decodes).
    pub const fn device_gone(self) -> bool {
        self.0 == u32::MAX
    }
}

impl fmt::Debug for Csts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Csts({:#x}: rdy={} cfs={} shst={:?})",
            self.0,
            self.ready() as u8,
            self.fatal() as u8,
            self.shutdown_status()
        )
    }
}

/// Admin Queue Attributes (AQA, NVMe Base 2.0 §3.1.3.8): both sizes in entries (1-based here,
/// 0's based in the register).
pub const fn aqa(sq_entries: u32, cq_entries: u32) -> u32 {
    ((cq_entries - 1) & 0xfff) << 16 | ((sq_entries - 1) & 0xfff)
}

/// Controller Memory Buffer Size (CMBSZ, NVMe Base 2.0 §3.1.3.12).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct CmbSz(pub u32);

impl CmbSz {
    /// Submission Queue Support.
    pub const fn sqs(self) -> bool {
        self.0 & 1 != 0
    }
    /// Completion Queue Support.
    pub const fn cqs(self) -> bool {
        self.0 & 2 != 0
    }
    /// PRP/SGL list support.
    pub const fn lists(self) -> bool {
        self.0 & 4 != 0
    }
    /// Read data support.
    pub const fn rds(self) -> bool {
        self.0 & 8 != 0
    }
    /// Write data support.
    pub const fn wds(self) -> bool {
        self.0 & 16 != 0
    }
    /// Size in bytes (`SZ * 4 KiB * 16^SZU`).
    pub const fn size_bytes(self) -> u64 {
        let szu = (self.0 >> 8) & 0xf;
        let sz = (self.0 >> 12) as u64;
        sz << (12 + 4 * szu)
    }
}

/// Controller Memory Buffer Location (CMBLOC, NVMe Base 2.0 §3.1.3.11).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct CmbLoc(pub u32);

impl CmbLoc {
    /// The BAR holding the CMB (Base Indicator Register).
    pub const fn bir(self) -> u32 {
        self.0 & 0b111
    }
    /// Offset of the CMB in that BAR, in units of the CMBSZ size unit (`OFST`).
    pub const fn offset_units(self) -> u64 {
        (self.0 >> 12) as u64
    }
}

/// CMBMSC (§3.1.3.16): Capabilities Registers Enabled (CMBLOC/CMBSZ read non-zero only then).
pub const CMBMSC_CRE: u64 = 1 << 0;
/// CMBMSC: Controller Memory Space Enable.
pub const CMBMSC_CMSE: u64 = 1 << 1;

/// Offset of the submission queue `qid` tail doorbell.
pub const fn sq_tail_doorbell(qid: u16, stride: usize) -> usize {
    off::DOORBELLS + (2 * qid as usize) * stride
}

/// Offset of the completion queue `qid` head doorbell.
pub const fn cq_head_doorbell(qid: u16, stride: usize) -> usize {
    off::DOORBELLS + (2 * qid as usize + 1) * stride
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_qemu_cap_and_vs() {
        // What QEMU 7.2's emulated controller reports (RECIPE.md, step 5).
        let cap = Cap(0x0240_1820_0f01_07ff);
        assert_eq!(cap.max_queue_entries(), 2048);
        assert!(cap.contiguous_queues_required());
        assert_eq!(cap.timeout_ms(), 15 * 500);
        assert_eq!(cap.doorbell_stride(), 4);
        assert_eq!(cap.command_sets(), 0xc1);
        assert_eq!(cap.mps_min(), 4096);
        assert_eq!(cap.mps_max(), 65536);
        assert!(cap.cmb_supported());
        assert!(!cap.pmr_supported());
        assert_eq!(Version(0x0001_0400).to_string(), "1.4.0");
    }

    #[test]
    fn builds_cc_and_decodes_csts() {
        let cc = Cc::default()
            .with_command_set(0)
            .with_page_size(4096)
            .with_entry_sizes(6, 4)
            .with_enable(true);
        assert_eq!(cc.0, 0x0046_0001);
        assert_eq!(cc.with_shutdown(Shutdown::Normal).0, 0x0046_4001);
        assert_eq!(Cc(0).with_page_size(65536).page_size(), 65536);
        assert!(Csts(1).ready());
        assert!(Csts(3).fatal());
        assert_eq!(Csts(0b1001).shutdown_status(), ShutdownStatus::Complete);
        assert!(Csts(u32::MAX).device_gone());
        assert_eq!(aqa(32, 32), 0x001f_001f);
    }

    #[test]
    fn cmb_and_doorbells() {
        let sz = CmbSz(0x0001_021d);
        assert!(sz.sqs() && !sz.cqs() && sz.lists() && sz.rds() && sz.wds());
        assert_eq!(sz.size_bytes(), 16 << 20);
        assert_eq!(CmbLoc(0x62).bir(), 2);
        assert_eq!(sq_tail_doorbell(0, 4), 0x1000);
        assert_eq!(cq_head_doorbell(0, 4), 0x1004);
        assert_eq!(sq_tail_doorbell(3, 16), 0x1060);
    }
}
