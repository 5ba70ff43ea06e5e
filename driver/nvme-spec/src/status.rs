//! NVMe completion status (NVMe Base 2.0 §4.6.1, Figures 101-106), decoded with names.

use core::fmt;

/// Status Code Type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sct {
    /// 0h: Generic Command Status.
    Generic,
    /// 1h: Command Specific Status.
    CommandSpecific,
    /// 2h: Media and Data Integrity Errors.
    Media,
    /// 3h: Path Related Status.
    Path,
    /// 7h: Vendor Specific.
    Vendor,
    /// 4h-6h: reserved.
    Reserved(u8),
}

impl Sct {
    /// From the 3-bit field.
    #[inline]
    pub const fn from_bits(v: u8) -> Self {
        match v & 7 {
            0 => Sct::Generic,
            1 => Sct::CommandSpecific,
            2 => Sct::Media,
            3 => Sct::Path,
            7 => Sct::Vendor,
            r => Sct::Reserved(r),
        }
    }

    /// The 3-bit field.
    #[inline]
    pub const fn bits(self) -> u8 {
        match self {
            Sct::Generic => 0,
            Sct::CommandSpecific => 1,
            Sct::Media => 2,
            Sct::Path => 3,
            Sct::Vendor => 7,
            Sct::Reserved(r) => r,
        }
    }
}

/// Status codes that programs name (a controller answers them, a driver acts on them), by
/// Status Code Type; [`Status::name`] names every code.
pub mod sc {
    /// Generic Command Status (NVMe Base 2.0 Figure 102; NVM Command Set 1.0 Figure 21).
    pub mod generic {
        /// Successful Completion.
        pub const SUCCESS: u8 = 0x00;
        /// Invalid Command Opcode.
        pub const INVALID_OPCODE: u8 = 0x01;
        /// Invalid Field in Command.
        pub const INVALID_FIELD: u8 = 0x02;
        /// Data Transfer Error.
        pub const DATA_TRANSFER_ERROR: u8 = 0x04;
        /// Internal Error.
        pub const INTERNAL_ERROR: u8 = 0x06;
        /// Command Abort Requested.
        pub const ABORT_REQUESTED: u8 = 0x07;
        /// Command Aborted due to SQ Deletion.
        pub const ABORTED_SQ_DELETION: u8 = 0x08;
        /// Invalid Namespace or Format.
        pub const INVALID_NAMESPACE: u8 = 0x0b;
        /// Command Sequence Error.
        pub const COMMAND_SEQUENCE_ERROR: u8 = 0x0c;
        /// Invalid SGL Segment Descriptor.
        pub const INVALID_SGL_SEGMENT: u8 = 0x0d;
        /// Invalid Number of SGL Descriptors.
        pub const INVALID_SGL_COUNT: u8 = 0x0e;
        /// Data SGL Length Invalid.
        pub const DATA_SGL_LENGTH_INVALID: u8 = 0x0f;
        /// Metadata SGL Length Invalid.
        pub const METADATA_SGL_LENGTH_INVALID: u8 = 0x10;
        /// SGL Descriptor Type Invalid.
        pub const SGL_TYPE_INVALID: u8 = 0x11;
        /// PRP Offset Invalid.
        pub const PRP_OFFSET_INVALID: u8 = 0x13;
        /// LBA Out of Range (NVM Command Set).
        pub const LBA_OUT_OF_RANGE: u8 = 0x80;
    }

    /// Command Specific Status (NVMe Base 2.0 Figure 103; NVM Command Set 1.0 Figure 22;
    /// Zoned Namespace Command Set 1.1 Figure 27).
    pub mod command_specific {
        /// Completion Queue Invalid.
        pub const CQ_INVALID: u8 = 0x00;
        /// Invalid Queue Identifier.
        pub const INVALID_QID: u8 = 0x01;
        /// Invalid Queue Size.
        pub const INVALID_QUEUE_SIZE: u8 = 0x02;
        /// Asynchronous Event Request Limit Exceeded.
        pub const AER_LIMIT_EXCEEDED: u8 = 0x05;
        /// Invalid Interrupt Vector.
        pub const INVALID_INTERRUPT_VECTOR: u8 = 0x08;
        /// Invalid Log Page.
        pub const INVALID_LOG_PAGE: u8 = 0x09;
        /// Invalid Format.
        pub const INVALID_FORMAT: u8 = 0x0a;
        /// Invalid Queue Deletion.
        pub const INVALID_QUEUE_DELETION: u8 = 0x0c;
        /// Feature Identifier Not Saveable.
        pub const FEATURE_NOT_SAVEABLE: u8 = 0x0d;
        /// I/O Command Set Combination Rejected.
        pub const IOCS_COMBINATION_REJECTED: u8 = 0x2b;
        /// Invalid Protection Information (NVM Command Set).
        pub const INVALID_PROTECTION_INFO: u8 = 0x81;
        /// Invalid Zone Operation Request.
        pub const INVALID_ZONE_OPERATION: u8 = 0xb6;
        /// Zone Boundary Error.
        pub const ZONE_BOUNDARY_ERROR: u8 = 0xb8;
        /// Zone Is Full.
        pub const ZONE_IS_FULL: u8 = 0xb9;
        /// Zone Is Read Only.
        pub const ZONE_IS_READ_ONLY: u8 = 0xba;
        /// Zone Is Offline.
        pub const ZONE_IS_OFFLINE: u8 = 0xbb;
        /// Zone Invalid Write.
        pub const ZONE_INVALID_WRITE: u8 = 0xbc;
        /// Too Many Active Zones.
        pub const TOO_MANY_ACTIVE_ZONES: u8 = 0xbd;
        /// Too Many Open Zones.
        pub const TOO_MANY_OPEN_ZONES: u8 = 0xbe;
        /// Invalid Zone State Transition.
        pub const INVALID_ZONE_STATE_TRANSITION: u8 = 0xbf;
    }

    /// Media and Data Integrity Errors (NVMe Base 2.0 Figure 104; NVM Command Set 1.0
    /// Figure 23).
    pub mod media {
        /// End-to-end Guard Check Error.
        pub const GUARD_CHECK_ERROR: u8 = 0x82;
        /// End-to-end Application Tag Check Error.
        pub const APP_TAG_CHECK_ERROR: u8 = 0x83;
        /// End-to-end Reference Tag Check Error.
        pub const REF_TAG_CHECK_ERROR: u8 = 0x84;
        /// Compare Failure.
        pub const COMPARE_FAILURE: u8 = 0x85;
    }
}

/// A completion's status field without the phase tag.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Status(u16);

impl Status {
    /// Successful completion.
    pub const SUCCESS: Status = Status(0);

    /// From DW3 bits 31:16 of a completion (phase tag in bit 0 is dropped).
    #[inline]
    pub const fn from_field(field: u16) -> Self {
        Status(field & !1)
    }

    /// Builds a status from its parts (for device models and tests).
    #[inline]
    pub const fn new(sct: Sct, sc: u8, dnr: bool) -> Self {
        Status(((sc as u16) << 1) | ((sct.bits() as u16) << 9) | ((dnr as u16) << 15))
    }

    /// The raw field (phase bit 0).
    #[inline]
    pub const fn field(self) -> u16 {
        self.0
    }

    /// Status Code.
    #[inline]
    pub const fn sc(self) -> u8 {
        (self.0 >> 1) as u8
    }

    /// Status Code Type.
    #[inline]
    pub const fn sct(self) -> Sct {
        Sct::from_bits((self.0 >> 9) as u8)
    }

    /// Command Retry Delay index.
    #[inline]
    pub const fn crd(self) -> u8 {
        ((self.0 >> 12) & 3) as u8
    }

    /// More: the Error Information log has more detail.
    #[inline]
    pub const fn more(self) -> bool {
        self.0 & (1 << 14) != 0
    }

    /// Do Not Retry.
    #[inline]
    pub const fn dnr(self) -> bool {
        self.0 & (1 << 15) != 0
    }

    /// Whether the command succeeded.
    #[inline]
    pub const fn is_success(self) -> bool {
        // SC (bits 8:1) and SCT (bits 11:9) both 0.
        self.0 & 0x0ffe == 0
    }

    /// The spec's name for this status, or `None` for a code it does not name here.
    ///
    /// Every code NVMe Base 2.0 names (Figures 102-105) and those of the command sets vfpoll
    /// does I/O with: NVM Command Set 1.0 (SC 80h-84h generic, 80h-83h command specific,
    /// 80h-88h media) and Zoned Namespace 1.1 (Figure 27: B6h-BFh). One table serves
    /// them all because their I/O-command-set-specific codes do not overlap; Key Value
    /// namespaces (whose 85h-89h would be named only for KV commands) are refused for I/O, so
    /// their codes cannot reach a caller.
    pub const fn name(self) -> Option<&'static str> {
        Some(match (self.sct(), self.sc()) {
            (Sct::Generic, 0x00) => "Successful Completion",
            (Sct::Generic, 0x01) => "Invalid Command Opcode",
            (Sct::Generic, 0x02) => "Invalid Field in Command",
            (Sct::Generic, 0x03) => "Command ID Conflict",
            (Sct::Generic, 0x04) => "Data Transfer Error",
            (Sct::Generic, 0x05) => "Commands Aborted due to Power Loss Notification",
            (Sct::Generic, 0x06) => "Internal Error",
            (Sct::Generic, 0x07) => "Command Abort Requested",
            (Sct::Generic, 0x08) => "Command Aborted due to SQ Deletion",
            (Sct::Generic, 0x09) => "Command Aborted due to Failed Fused Command",
            (Sct::Generic, 0x0a) => "Command Aborted due to Missing Fused Command",
            (Sct::Generic, 0x0b) => "Invalid Namespace or Format",
            (Sct::Generic, 0x0c) => "Command Sequence Error",
            (Sct::Generic, 0x0d) => "Invalid SGL Segment Descriptor",
            (Sct::Generic, 0x0e) => "Invalid Number of SGL Descriptors",
            (Sct::Generic, 0x0f) => "Data SGL Length Invalid",
            (Sct::Generic, 0x10) => "Metadata SGL Length Invalid",
            (Sct::Generic, 0x11) => "SGL Descriptor Type Invalid",
            (Sct::Generic, 0x12) => "Invalid Use of Controller Memory Buffer",
            (Sct::Generic, 0x13) => "PRP Offset Invalid",
            (Sct::Generic, 0x14) => "Atomic Write Unit Exceeded",
            (Sct::Generic, 0x15) => "Operation Denied",
            (Sct::Generic, 0x16) => "SGL Offset Invalid",
            (Sct::Generic, 0x18) => "Host Identifier Inconsistent Format",
            (Sct::Generic, 0x19) => "Keep Alive Timer Expired",
            (Sct::Generic, 0x1a) => "Keep Alive Timeout Invalid",
            (Sct::Generic, 0x1b) => "Command Aborted due to Preempt and Abort",
            (Sct::Generic, 0x1c) => "Sanitize Failed",
            (Sct::Generic, 0x1d) => "Sanitize In Progress",
            (Sct::Generic, 0x1e) => "SGL Data Block Granularity Invalid",
            (Sct::Generic, 0x1f) => "Command Not Supported for Queue in CMB",
            (Sct::Generic, 0x20) => "Namespace is Write Protected",
            (Sct::Generic, 0x21) => "Command Interrupted",
            (Sct::Generic, 0x22) => "Transient Transport Error",
            (Sct::Generic, 0x23) => "Command Prohibited by Command and Feature Lockdown",
            (Sct::Generic, 0x24) => "Admin Command Media Not Ready",
            (Sct::Generic, 0x80) => "LBA Out of Range",
            (Sct::Generic, 0x81) => "Capacity Exceeded",
            (Sct::Generic, 0x82) => "Namespace Not Ready",
            (Sct::Generic, 0x83) => "Reservation Conflict",
            (Sct::Generic, 0x84) => "Format In Progress",
            (Sct::CommandSpecific, 0x00) => "Completion Queue Invalid",
            (Sct::CommandSpecific, 0x01) => "Invalid Queue Identifier",
            (Sct::CommandSpecific, 0x02) => "Invalid Queue Size",
            (Sct::CommandSpecific, 0x03) => "Abort Command Limit Exceeded",
            (Sct::CommandSpecific, 0x05) => "Asynchronous Event Request Limit Exceeded",
            (Sct::CommandSpecific, 0x06) => "Invalid Firmware Slot",
            (Sct::CommandSpecific, 0x07) => "Invalid Firmware Image",
            (Sct::CommandSpecific, 0x08) => "Invalid Interrupt Vector",
            (Sct::CommandSpecific, 0x09) => "Invalid Log Page",
            (Sct::CommandSpecific, 0x0a) => "Invalid Format",
            (Sct::CommandSpecific, 0x0b) => "Firmware Activation Requires Conventional Reset",
            (Sct::CommandSpecific, 0x0c) => "Invalid Queue Deletion",
            (Sct::CommandSpecific, 0x0d) => "Feature Identifier Not Saveable",
            (Sct::CommandSpecific, 0x0e) => "Feature Not Changeable",
            (Sct::CommandSpecific, 0x0f) => "Feature Not Namespace Specific",
            (Sct::CommandSpecific, 0x10) => "Firmware Activation Requires NVM Subsystem Reset",
            (Sct::CommandSpecific, 0x11) => "Firmware Activation Requires Controller Level Reset",
            (Sct::CommandSpecific, 0x12) => "Firmware Activation Requires Maximum Time Violation",
            (Sct::CommandSpecific, 0x13) => "Firmware Activation Prohibited",
            (Sct::CommandSpecific, 0x14) => "Overlapping Range",
            (Sct::CommandSpecific, 0x15) => "Namespace Insufficient Capacity",
            (Sct::CommandSpecific, 0x16) => "Namespace Identifier Unavailable",
            (Sct::CommandSpecific, 0x18) => "Namespace Already Attached",
            (Sct::CommandSpecific, 0x19) => "Namespace Is Private",
            (Sct::CommandSpecific, 0x1a) => "Namespace Not Attached",
            (Sct::CommandSpecific, 0x1b) => "Thin Provisioning Not Supported",
            (Sct::CommandSpecific, 0x1c) => "Controller List Invalid",
            (Sct::CommandSpecific, 0x1d) => "Device Self-test In Progress",
            (Sct::CommandSpecific, 0x1e) => "Boot Partition Write Prohibited",
            (Sct::CommandSpecific, 0x1f) => "Invalid Controller Identifier",
            (Sct::CommandSpecific, 0x20) => "Invalid Secondary Controller State",
            (Sct::CommandSpecific, 0x21) => "Invalid Number of Controller Resources",
            (Sct::CommandSpecific, 0x22) => "Invalid Resource Identifier",
            (Sct::CommandSpecific, 0x23) => "Sanitize Prohibited While Persistent Memory Region is Enabled",
            (Sct::CommandSpecific, 0x24) => "ANA Group Identifier Invalid",
            (Sct::CommandSpecific, 0x25) => "ANA Attach Failed",
            (Sct::CommandSpecific, 0x26) => "Insufficient Capacity",
            (Sct::CommandSpecific, 0x27) => "Namespace Attachment Limit Exceeded",
            (Sct::CommandSpecific, 0x28) => "Prohibition of Command Execution Not Supported",
            (Sct::CommandSpecific, 0x29) => "I/O Command Set Not Supported",
            (Sct::CommandSpecific, 0x2a) => "I/O Command Set Not Enabled",
            (Sct::CommandSpecific, 0x2b) => "I/O Command Set Combination Rejected",
            (Sct::CommandSpecific, 0x2c) => "Invalid I/O Command Set",
            (Sct::CommandSpecific, 0x2d) => "Identifier Unavailable",
            (Sct::CommandSpecific, 0x80) => "Conflicting Attributes",
            (Sct::CommandSpecific, 0x81) => "Invalid Protection Information",
            (Sct::CommandSpecific, 0x82) => "Attempted Write to Read Only Range",
            (Sct::CommandSpecific, 0x83) => "Command Size Limit Exceeded",
            // Zoned Namespace Command Set 1.1 Figure 27.
            (Sct::CommandSpecific, 0xb6) => "Invalid Zone Operation Request",
            (Sct::CommandSpecific, 0xb7) => "ZRWA Resources Unavailable",
            (Sct::CommandSpecific, 0xb8) => "Zone Boundary Error",
            (Sct::CommandSpecific, 0xb9) => "Zone Is Full",
            (Sct::CommandSpecific, 0xba) => "Zone Is Read Only",
            (Sct::CommandSpecific, 0xbb) => "Zone Is Offline",
            (Sct::CommandSpecific, 0xbc) => "Zone Invalid Write",
            (Sct::CommandSpecific, 0xbd) => "Too Many Active Zones",
            (Sct::CommandSpecific, 0xbe) => "Too Many Open Zones",
            (Sct::CommandSpecific, 0xbf) => "Invalid Zone State Transition",
            (Sct::Media, 0x80) => "Write Fault",
            (Sct::Media, 0x81) => "Unrecovered Read Error",
            (Sct::Media, 0x82) => "End-to-end Guard Check Error",
            (Sct::Media, 0x83) => "End-to-end Application Tag Check Error",
            (Sct::Media, 0x84) => "End-to-end Reference Tag Check Error",
            (Sct::Media, 0x85) => "Compare Failure",
            (Sct::Media, 0x86) => "Access Denied",
            (Sct::Media, 0x87) => "Deallocated or Unwritten Logical Block",
            (Sct::Media, 0x88) => "End-to-End Storage Tag Check Error",
            (Sct::Path, 0x00) => "Internal Path Error",
            (Sct::Path, 0x01) => "Asymmetric Access Persistent Loss",
            (Sct::Path, 0x02) => "Asymmetric Access Inaccessible",
            (Sct::Path, 0x03) => "Asymmetric Access Transition",
            (Sct::Path, 0x60) => "Controller Pathing Error",
            (Sct::Path, 0x70) => "Host Pathing Error",
            (Sct::Path, 0x71) => "Command Aborted By Host",
            _ => return None,
        })
    }

    /// Generic status: Invalid Field in Command.
    pub const INVALID_FIELD: Status = Status::new(Sct::Generic, sc::generic::INVALID_FIELD, true);
    /// Generic status: Invalid Command Opcode.
    pub const INVALID_OPCODE: Status = Status::new(Sct::Generic, sc::generic::INVALID_OPCODE, true);
    /// Generic status: Data Transfer Error.
    pub const DATA_TRANSFER_ERROR: Status =
        Status::new(Sct::Generic, sc::generic::DATA_TRANSFER_ERROR, false);
    /// Generic status: Invalid Namespace or Format.
    pub const INVALID_NAMESPACE: Status = Status::new(Sct::Generic, sc::generic::INVALID_NAMESPACE, true);
    /// Generic status: PRP Offset Invalid.
    pub const PRP_OFFSET_INVALID: Status = Status::new(Sct::Generic, sc::generic::PRP_OFFSET_INVALID, true);
    /// Generic status: Command Aborted due to SQ Deletion.
    pub const ABORTED_SQ_DELETION: Status =
        Status::new(Sct::Generic, sc::generic::ABORTED_SQ_DELETION, false);
    /// Generic status: Command Abort Requested.
    pub const ABORT_REQUESTED: Status = Status::new(Sct::Generic, sc::generic::ABORT_REQUESTED, false);
    /// Generic status: LBA Out of Range.
    pub const LBA_OUT_OF_RANGE: Status = Status::new(Sct::Generic, sc::generic::LBA_OUT_OF_RANGE, true);
    /// Media status: Compare Failure.
    pub const COMPARE_FAILURE: Status = Status::new(Sct::Media, sc::media::COMPARE_FAILURE, true);
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "{n}")?,
            None => write!(f, "status code {:#04x}", self.sc())?,
        }
        write!(
            f,
            " (SCT {:#x}, SC {:#04x}{})",
            self.sct().bits(),
            self.sc(),
            if self.dnr() { ", DNR" } else { "" }
        )
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Status({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_fields_and_names() {
        // DW3[31:16] with DNR, SCT=0, SC=0x80, phase=1.
        let s = Status::from_field(0x8000 | (0x80 << 1) | 1);
        assert_eq!((s.sct(), s.sc(), s.dnr()), (Sct::Generic, 0x80, true));
        assert_eq!(s, Status::LBA_OUT_OF_RANGE);
        assert_eq!(s.to_string(), "LBA Out of Range (SCT 0x0, SC 0x80, DNR)");
        let m = Status::new(Sct::Media, 0x81, false);
        assert_eq!(m.to_string(), "Unrecovered Read Error (SCT 0x2, SC 0x81)");
        assert!(!m.is_success());
        assert!(Status::from_field(1).is_success());
        for field in 0..=u16::MAX {
            let st = Status::from_field(field);
            assert_eq!(
                st.is_success(),
                st.sc() == 0 && st.sct() == Sct::Generic,
                "{field:#x}"
            );
        }
        let v = Status::new(Sct::Vendor, 0xc3, false);
        assert_eq!(v.name(), None);
        assert!(v.to_string().starts_with("status code 0xc3 (SCT 0x7"));
        assert_eq!(
            Status::new(Sct::CommandSpecific, 0x0c, true).name(),
            Some("Invalid Queue Deletion")
        );
        // The zoned command set's codes (what `perf` on a zoned namespace used to show raw).
        assert_eq!(
            Status::new(Sct::CommandSpecific, 0xbc, true).to_string(),
            "Zone Invalid Write (SCT 0x1, SC 0xbc, DNR)"
        );
        assert_eq!(
            Status::new(Sct::CommandSpecific, 0xb9, true).name(),
            Some("Zone Is Full")
        );
    }

    /// Each named code is the one the specification's figures give that name (checked against
    /// the name table, itself transcribed from Figures 102-105 and the command sets').
    #[test]
    fn named_codes_carry_their_names() {
        use sc::{command_specific as cs, generic as g, media as m};
        for (sct, code, want) in [
            (Sct::Generic, g::SUCCESS, "Successful Completion"),
            (Sct::Generic, g::INVALID_OPCODE, "Invalid Command Opcode"),
            (Sct::Generic, g::INVALID_FIELD, "Invalid Field in Command"),
            (Sct::Generic, g::DATA_TRANSFER_ERROR, "Data Transfer Error"),
            (Sct::Generic, g::INTERNAL_ERROR, "Internal Error"),
            (Sct::Generic, g::ABORT_REQUESTED, "Command Abort Requested"),
            (
                Sct::Generic,
                g::ABORTED_SQ_DELETION,
                "Command Aborted due to SQ Deletion",
            ),
            (Sct::Generic, g::INVALID_NAMESPACE, "Invalid Namespace or Format"),
            (Sct::Generic, g::COMMAND_SEQUENCE_ERROR, "Command Sequence Error"),
            (
                Sct::Generic,
                g::INVALID_SGL_SEGMENT,
                "Invalid SGL Segment Descriptor",
            ),
            (
                Sct::Generic,
                g::INVALID_SGL_COUNT,
                "Invalid Number of SGL Descriptors",
            ),
            (
                Sct::Generic,
                g::DATA_SGL_LENGTH_INVALID,
                "Data SGL Length Invalid",
            ),
            (
                Sct::Generic,
                g::METADATA_SGL_LENGTH_INVALID,
                "Metadata SGL Length Invalid",
            ),
            (Sct::Generic, g::SGL_TYPE_INVALID, "SGL Descriptor Type Invalid"),
            (Sct::Generic, g::PRP_OFFSET_INVALID, "PRP Offset Invalid"),
            (Sct::Generic, g::LBA_OUT_OF_RANGE, "LBA Out of Range"),
            (Sct::CommandSpecific, cs::CQ_INVALID, "Completion Queue Invalid"),
            (Sct::CommandSpecific, cs::INVALID_QID, "Invalid Queue Identifier"),
            (Sct::CommandSpecific, cs::INVALID_QUEUE_SIZE, "Invalid Queue Size"),
            (
                Sct::CommandSpecific,
                cs::AER_LIMIT_EXCEEDED,
                "Asynchronous Event Request Limit Exceeded",
            ),
            (
                Sct::CommandSpecific,
                cs::INVALID_INTERRUPT_VECTOR,
                "Invalid Interrupt Vector",
            ),
            (Sct::CommandSpecific, cs::INVALID_LOG_PAGE, "Invalid Log Page"),
            (Sct::CommandSpecific, cs::INVALID_FORMAT, "Invalid Format"),
            (
                Sct::CommandSpecific,
                cs::INVALID_QUEUE_DELETION,
                "Invalid Queue Deletion",
            ),
            (
                Sct::CommandSpecific,
                cs::FEATURE_NOT_SAVEABLE,
                "Feature Identifier Not Saveable",
            ),
            (
                Sct::CommandSpecific,
                cs::IOCS_COMBINATION_REJECTED,
                "I/O Command Set Combination Rejected",
            ),
            (
                Sct::CommandSpecific,
                cs::INVALID_PROTECTION_INFO,
                "Invalid Protection Information",
            ),
            (
                Sct::CommandSpecific,
                cs::INVALID_ZONE_OPERATION,
                "Invalid Zone Operation Request",
            ),
            (
                Sct::CommandSpecific,
                cs::ZONE_BOUNDARY_ERROR,
                "Zone Boundary Error",
            ),
            (Sct::CommandSpecific, cs::ZONE_IS_FULL, "Zone Is Full"),
            (Sct::CommandSpecific, cs::ZONE_IS_READ_ONLY, "Zone Is Read Only"),
            (Sct::CommandSpecific, cs::ZONE_IS_OFFLINE, "Zone Is Offline"),
            (Sct::CommandSpecific, cs::ZONE_INVALID_WRITE, "Zone Invalid Write"),
            (
                Sct::CommandSpecific,
                cs::TOO_MANY_ACTIVE_ZONES,
                "Too Many Active Zones",
            ),
            (
                Sct::CommandSpecific,
                cs::TOO_MANY_OPEN_ZONES,
                "Too Many Open Zones",
            ),
            (
                Sct::CommandSpecific,
                cs::INVALID_ZONE_STATE_TRANSITION,
                "Invalid Zone State Transition",
            ),
            (Sct::Media, m::GUARD_CHECK_ERROR, "End-to-end Guard Check Error"),
            (
                Sct::Media,
                m::APP_TAG_CHECK_ERROR,
                "End-to-end Application Tag Check Error",
            ),
            (
                Sct::Media,
                m::REF_TAG_CHECK_ERROR,
                "End-to-end Reference Tag Check Error",
            ),
            (Sct::Media, m::COMPARE_FAILURE, "Compare Failure"),
        ] {
            assert_eq!(
                Status::new(sct, code, false).name(),
                Some(want),
                "{sct:?} {code:#04x}"
            );
        }
    }

    #[test]
    fn names_every_code_of_base_2_0_and_no_reserved_one() {
        let name = |sct, sc| Status::new(sct, sc, false).name();
        for (sct, sc, want) in [
            (Sct::Generic, 0x18, "Host Identifier Inconsistent Format"),
            (Sct::Generic, 0x1c, "Sanitize Failed"),
            (Sct::Generic, 0x1f, "Command Not Supported for Queue in CMB"),
            (
                Sct::Generic,
                0x23,
                "Command Prohibited by Command and Feature Lockdown",
            ),
            (Sct::Generic, 0x24, "Admin Command Media Not Ready"),
            (
                Sct::CommandSpecific,
                0x0b,
                "Firmware Activation Requires Conventional Reset",
            ),
            (Sct::CommandSpecific, 0x16, "Namespace Identifier Unavailable"),
            (
                Sct::CommandSpecific,
                0x28,
                "Prohibition of Command Execution Not Supported",
            ),
            (Sct::CommandSpecific, 0x29, "I/O Command Set Not Supported"),
            (Sct::CommandSpecific, 0x2a, "I/O Command Set Not Enabled"),
            (Sct::CommandSpecific, 0x2b, "I/O Command Set Combination Rejected"),
            (Sct::CommandSpecific, 0x2c, "Invalid I/O Command Set"),
            (Sct::CommandSpecific, 0x2d, "Identifier Unavailable"),
            (Sct::Media, 0x88, "End-to-End Storage Tag Check Error"),
        ] {
            assert_eq!(name(sct, sc), Some(want), "{sct:?} {sc:#04x}");
        }
        // Every code of the ranges Base 2.0 fills is named; the reserved ones are not.
        let generic: Vec<u8> = (0x00..=0x24).filter(|&c| c != 0x17).chain(0x80..=0x84).collect();
        let specific: Vec<u8> = (0x00..=0x2d)
            .filter(|&c| c != 0x04 && c != 0x17)
            .chain(0x80..=0x83)
            .chain(0xb6..=0xbf)
            .collect();
        let media: Vec<u8> = (0x80..=0x88).collect();
        let path: Vec<u8> = vec![0x00, 0x01, 0x02, 0x03, 0x60, 0x70, 0x71];
        for (sct, named) in [
            (Sct::Generic, generic),
            (Sct::CommandSpecific, specific),
            (Sct::Media, media),
            (Sct::Path, path),
        ] {
            let mut seen = std::collections::HashSet::new();
            for sc in 0..=u8::MAX {
                let n = name(sct, sc);
                assert_eq!(n.is_some(), named.contains(&sc), "{sct:?} {sc:#04x}: {n:?}");
                if let Some(n) = n {
                    assert!(seen.insert(n), "{sct:?}: {n} names two codes");
                }
            }
        }
    }
}
