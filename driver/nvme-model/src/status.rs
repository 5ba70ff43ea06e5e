//! Completion status (NVMe Base 2.0 §4.2.3, "Status Field Definition"): the codes, their types
//! and their names are `vfpoll-nvme-spec`'s; this type is the model's view of one (fields a
//! fault can set one by one, DNR on unless said otherwise).

use core::fmt;

use vfpoll_nvme_spec::status::{sc, Sct};

/// Status Code Type: generic command status (§4.2.3.1).
pub const SCT_GENERIC: u8 = Sct::Generic.bits();
/// Status Code Type: command specific status (§4.2.3.2).
pub const SCT_COMMAND_SPECIFIC: u8 = Sct::CommandSpecific.bits();
/// Status Code Type: media and data integrity errors (§4.2.3.3).
pub const SCT_MEDIA: u8 = Sct::Media.bits();

/// The status of a completion: Status Code Type, Status Code and Do Not Retry.
///
/// In a completion queue entry it is dword 3 bits 31:17; [`Status::field`] gives those 15 bits
/// (SC in bits 7:0, SCT in 10:8, CRD 12:11 and More 13 left zero, DNR in 14).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Status {
    /// Status Code Type.
    pub sct: u8,
    /// Status Code.
    pub sc: u8,
    /// Do Not Retry.
    pub dnr: bool,
}

impl Status {
    /// Successful Completion.
    pub const SUCCESS: Status = Status {
        sct: 0,
        sc: 0,
        dnr: false,
    };
    /// Invalid Command Opcode.
    pub const INVALID_OPCODE: Status = Status::generic(sc::generic::INVALID_OPCODE);
    /// Invalid Field in Command.
    pub const INVALID_FIELD: Status = Status::generic(sc::generic::INVALID_FIELD);
    /// Data Transfer Error: what the model reports when a data pointer does not translate.
    pub const DATA_TRANSFER_ERROR: Status = Status::generic(sc::generic::DATA_TRANSFER_ERROR);
    /// Internal Error.
    pub const INTERNAL_ERROR: Status = Status::generic(sc::generic::INTERNAL_ERROR);
    /// Command Abort Requested (the command was aborted by an Abort command).
    pub const ABORT_REQUESTED: Status = Status::generic(sc::generic::ABORT_REQUESTED).with_dnr(false);
    /// Command Aborted due to SQ Deletion.
    pub const ABORTED_SQ_DELETION: Status = Status::generic(sc::generic::ABORTED_SQ_DELETION).with_dnr(false);
    /// Invalid Namespace or Format.
    pub const INVALID_NAMESPACE: Status = Status::generic(sc::generic::INVALID_NAMESPACE);
    /// Command Sequence Error.
    pub const COMMAND_SEQUENCE_ERROR: Status = Status::generic(sc::generic::COMMAND_SEQUENCE_ERROR);
    /// Invalid SGL Segment Descriptor.
    pub const INVALID_SGL_SEGMENT: Status = Status::generic(sc::generic::INVALID_SGL_SEGMENT);
    /// Invalid Number of SGL Descriptors.
    pub const INVALID_SGL_COUNT: Status = Status::generic(sc::generic::INVALID_SGL_COUNT);
    /// Data SGL Length Invalid.
    pub const DATA_SGL_LENGTH_INVALID: Status = Status::generic(sc::generic::DATA_SGL_LENGTH_INVALID);
    /// SGL Descriptor Type Invalid.
    pub const SGL_TYPE_INVALID: Status = Status::generic(sc::generic::SGL_TYPE_INVALID);
    /// Metadata SGL Length Invalid (a PSDT 10b metadata SGL describing other than the
    /// metadata length).
    pub const METADATA_SGL_LENGTH_INVALID: Status = Status::generic(sc::generic::METADATA_SGL_LENGTH_INVALID);
    /// PRP Offset Invalid.
    pub const PRP_OFFSET_INVALID: Status = Status::generic(sc::generic::PRP_OFFSET_INVALID);
    /// I/O Command Set Combination Rejected (Set Features, I/O Command Set Profile).
    pub const IOCS_COMBINATION_REJECTED: Status =
        Status::command_specific(sc::command_specific::IOCS_COMBINATION_REJECTED);
    /// LBA Out of Range (NVM Command Set specific generic status 80h).
    pub const LBA_OUT_OF_RANGE: Status = Status::generic(sc::generic::LBA_OUT_OF_RANGE);
    /// Completion Queue Invalid (Create I/O Submission Queue).
    pub const CQ_INVALID: Status = Status::command_specific(sc::command_specific::CQ_INVALID);
    /// Invalid Queue Identifier.
    pub const INVALID_QID: Status = Status::command_specific(sc::command_specific::INVALID_QID);
    /// Invalid Queue Size.
    pub const INVALID_QUEUE_SIZE: Status = Status::command_specific(sc::command_specific::INVALID_QUEUE_SIZE);
    /// Asynchronous Event Request Limit Exceeded.
    pub const AER_LIMIT_EXCEEDED: Status = Status::command_specific(sc::command_specific::AER_LIMIT_EXCEEDED);
    /// Invalid Interrupt Vector.
    pub const INVALID_INTERRUPT_VECTOR: Status =
        Status::command_specific(sc::command_specific::INVALID_INTERRUPT_VECTOR);
    /// Invalid Log Page.
    pub const INVALID_LOG_PAGE: Status = Status::command_specific(sc::command_specific::INVALID_LOG_PAGE);
    /// Invalid Format (Format NVM).
    pub const INVALID_FORMAT: Status = Status::command_specific(sc::command_specific::INVALID_FORMAT);
    /// Invalid Queue Deletion (Delete I/O Completion Queue with submission queues attached).
    pub const INVALID_QUEUE_DELETION: Status =
        Status::command_specific(sc::command_specific::INVALID_QUEUE_DELETION);
    /// Feature Identifier Not Saveable.
    pub const FEATURE_NOT_SAVEABLE: Status =
        Status::command_specific(sc::command_specific::FEATURE_NOT_SAVEABLE);
    /// Invalid Protection Information (NVM Command Set 1.0 §3.2.1.1: PRINFO not valid for the
    /// namespace's format, or a Type 1 ILBRT other than the SLBA's low 32 bits).
    pub const INVALID_PROTECTION_INFO: Status =
        Status::command_specific(sc::command_specific::INVALID_PROTECTION_INFO);
    /// Invalid Zone Operation Request (Zoned Namespace Command Set 1.1 §3.3.1: a zone random
    /// write area operation, which the model does not offer).
    pub const INVALID_ZONE_OPERATION: Status =
        Status::command_specific(sc::command_specific::INVALID_ZONE_OPERATION);
    /// Zone Boundary Error (ZNS 1.1 §3.3.1: a write past the zone's writable capacity, or a
    /// read across zones without RAZB).
    pub const ZONE_BOUNDARY_ERROR: Status =
        Status::command_specific(sc::command_specific::ZONE_BOUNDARY_ERROR);
    /// Zone Is Full.
    pub const ZONE_IS_FULL: Status = Status::command_specific(sc::command_specific::ZONE_IS_FULL);
    /// Zone Is Read Only.
    pub const ZONE_IS_READ_ONLY: Status = Status::command_specific(sc::command_specific::ZONE_IS_READ_ONLY);
    /// Zone Is Offline.
    pub const ZONE_IS_OFFLINE: Status = Status::command_specific(sc::command_specific::ZONE_IS_OFFLINE);
    /// Zone Invalid Write (a write that does not start at the write pointer).
    pub const ZONE_INVALID_WRITE: Status = Status::command_specific(sc::command_specific::ZONE_INVALID_WRITE);
    /// Too Many Active Zones.
    pub const TOO_MANY_ACTIVE_ZONES: Status =
        Status::command_specific(sc::command_specific::TOO_MANY_ACTIVE_ZONES);
    /// Too Many Open Zones.
    pub const TOO_MANY_OPEN_ZONES: Status =
        Status::command_specific(sc::command_specific::TOO_MANY_OPEN_ZONES);
    /// Invalid Zone State Transition.
    pub const INVALID_ZONE_STATE_TRANSITION: Status =
        Status::command_specific(sc::command_specific::INVALID_ZONE_STATE_TRANSITION);
    /// End-to-end Guard Check Error (NVM Command Set 1.0 §5.2.1.2).
    pub const GUARD_CHECK_ERROR: Status = Status::media(sc::media::GUARD_CHECK_ERROR);
    /// End-to-end Application Tag Check Error.
    pub const APP_TAG_CHECK_ERROR: Status = Status::media(sc::media::APP_TAG_CHECK_ERROR);
    /// End-to-end Reference Tag Check Error.
    pub const REF_TAG_CHECK_ERROR: Status = Status::media(sc::media::REF_TAG_CHECK_ERROR);
    /// Compare Failure (media error).
    pub const COMPARE_FAILURE: Status = Status::media(sc::media::COMPARE_FAILURE);

    /// A generic status with DNR set (the model's errors are not transient).
    pub const fn generic(sc: u8) -> Status {
        Status {
            sct: SCT_GENERIC,
            sc,
            dnr: true,
        }
    }

    /// A command specific status with DNR set.
    pub const fn command_specific(sc: u8) -> Status {
        Status {
            sct: SCT_COMMAND_SPECIFIC,
            sc,
            dnr: true,
        }
    }

    /// A media and data integrity status with DNR set.
    pub const fn media(sc: u8) -> Status {
        Status {
            sct: SCT_MEDIA,
            sc,
            dnr: true,
        }
    }

    /// With Do Not Retry set or cleared.
    #[must_use]
    pub const fn with_dnr(self, dnr: bool) -> Status {
        Status { dnr, ..self }
    }

    /// Whether this is Successful Completion (DNR aside).
    pub const fn is_success(self) -> bool {
        self.sct == 0 && self.sc == 0
    }

    /// The 15-bit Status Field (CQE dword 3 bits 31:17, shifted down).
    pub const fn field(self) -> u16 {
        self.sc as u16 | ((self.sct as u16 & 0x7) << 8) | ((self.dnr as u16) << 14)
    }

    /// Decodes a 15-bit Status Field (CRD and More are dropped).
    pub const fn from_field(f: u16) -> Status {
        Status {
            sc: f as u8,
            sct: ((f >> 8) & 0x7) as u8,
            dnr: f & (1 << 14) != 0,
        }
    }

    /// The status's name in the specification ([`vfpoll_nvme_spec::status::Status::name`]), or
    /// `None` for a code it does not name.
    pub fn name(self) -> Option<&'static str> {
        self.to_spec().name()
    }

    /// The same status as the spec crate's [`vfpoll_nvme_spec::status::Status`] (what a driver
    /// decodes from the completion entry).
    pub const fn to_spec(self) -> vfpoll_nvme_spec::status::Status {
        vfpoll_nvme_spec::status::Status::new(Sct::from_bits(self.sct), self.sc, self.dnr)
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Status(sct={:#x} sc={:#04x}", self.sct, self.sc)?;
        if self.dnr {
            f.write_str(" dnr")?;
        }
        match self.name() {
            Some(n) => write!(f, ": {n})"),
            None => f.write_str(")"),
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "{n} (sct {:#x}, sc {:#04x})", self.sct, self.sc),
            None => write!(f, "status sct {:#x}, sc {:#04x}", self.sct, self.sc),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_round_trips_and_matches_the_cqe_layout() {
        for s in [
            Status::SUCCESS,
            Status::INVALID_QUEUE_DELETION,
            Status::COMPARE_FAILURE,
            Status::ABORT_REQUESTED,
        ] {
            assert_eq!(Status::from_field(s.field()), s);
        }
        // Dword 3 of a CQE reporting LBA Out of Range with DNR, phase 1, CID 7.
        let dw3 = 7 | 1 << 16 | (Status::LBA_OUT_OF_RANGE.field() as u32) << 17;
        assert_eq!(dw3, 0x8101_0007);
        assert_eq!(
            Status::INVALID_QID.to_string(),
            "Invalid Queue Identifier (sct 0x1, sc 0x01)"
        );
    }
}
