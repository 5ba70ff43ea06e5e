//! Capsule-level encoding the fabrics modules share: submission and completion queue entries as
//! bytes, the Fabrics command opcode and types, the status codes a target returns, the NVMe/TCP
//! SGL descriptors that say where a command's data travels, and the SQ head pointer.

use vfpoll_nvme_spec::cmd::{Command, Completion};
use vfpoll_nvme_spec::status::{Sct, Status};

/// A submission queue entry (NVMe Base 2.0 Figure 88): vfpoll-nvme's [`Command`], 16 dwords.
pub type Sqe = Command;

/// A completion queue entry (NVMe Base 2.0 Figure 89): vfpoll-nvme's [`Completion`]. Fabrics
/// completions carry no phase tag (there is no completion queue memory to wrap), so
/// every one this crate builds has bit 0 clear; `sq_head` and `sq_id` are the runtime's to fill
/// (see [`SqHead`]).
pub type Cqe = Completion;

/// Bytes in a submission queue entry.
pub const SQE_BYTES: usize = 64;
/// Bytes in a completion queue entry.
pub const CQE_BYTES: usize = 16;

/// The 64 bytes of a command capsule's SQE as a [`Sqe`] (little endian dwords).
pub fn sqe_from_bytes(b: &[u8; SQE_BYTES]) -> Sqe {
    Command {
        dw: core::array::from_fn(|i| le32(b, 4 * i)),
    }
}

/// The 64 bytes of `sqe` as sent in a command capsule.
pub fn sqe_to_bytes(sqe: &Sqe) -> [u8; SQE_BYTES] {
    let mut b = [0u8; SQE_BYTES];
    for (i, d) in sqe.dw.iter().enumerate() {
        b[4 * i..4 * i + 4].copy_from_slice(&d.to_le_bytes());
    }
    b
}

/// The 16 bytes of `cqe` as sent in a response capsule.
pub fn cqe_to_bytes(cqe: &Cqe) -> [u8; CQE_BYTES] {
    let mut b = [0u8; CQE_BYTES];
    for (i, d) in cqe.to_dwords().iter().enumerate() {
        b[4 * i..4 * i + 4].copy_from_slice(&d.to_le_bytes());
    }
    b
}

/// A completion for command `cid` with `status` and command specific dword 0.
pub(crate) fn cqe(cid: u16, status: Status, dw0: u32) -> Cqe {
    Completion {
        dw0,
        dw1: 0,
        sq_head: 0,
        sq_id: 0,
        cid,
        status: status.field(),
    }
}

pub(crate) fn le16(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}

pub(crate) fn le32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

pub(crate) fn le64(b: &[u8], o: usize) -> u64 {
    le32(b, o) as u64 | (le32(b, o + 4) as u64) << 32
}

/// The Fabrics command opcode (NVMe-oF 1.1 §3, "Fabrics Command Set"): the command type is in
/// FCTYPE.
pub const FABRICS_OPCODE: u8 = 0x7f;

/// Fabrics command types (FCTYPE, SQE byte 4; NVMe-oF 1.1 §3).
pub mod fctype {
    /// Property Set.
    pub const PROPERTY_SET: u8 = 0x00;
    /// Connect.
    pub const CONNECT: u8 = 0x01;
    /// Property Get.
    pub const PROPERTY_GET: u8 = 0x04;
    /// Authentication Send.
    pub const AUTHENTICATION_SEND: u8 = 0x05;
    /// Authentication Receive.
    pub const AUTHENTICATION_RECEIVE: u8 = 0x06;
    /// Disconnect.
    pub const DISCONNECT: u8 = 0x08;
}

/// The Fabrics command type of a Fabrics command (SQE byte 4, where other commands keep NSID).
pub fn fctype_of(sqe: &Sqe) -> u8 {
    sqe.dw[1] as u8
}

/// Whether `sqe` is a Connect command: what the runtime expects first on every new queue.
pub fn is_connect(sqe: &Sqe) -> bool {
    sqe.opcode() == FABRICS_OPCODE && fctype_of(sqe) == fctype::CONNECT
}

/// The statuses a target returns, beyond those `vfpoll_nvme_spec::status::Status` names.
pub mod status {
    use super::{Sct, Status};

    /// Command Sequence Error (NVMe Base 2.0 Figure 101, 0Ch): a command the controller's state
    /// does not allow now (an admin or I/O command before CC.EN and CSTS.RDY, a second Connect
    /// of a queue).
    pub const COMMAND_SEQUENCE_ERROR: Status = Status::new(Sct::Generic, 0x0c, true);
    /// Data SGL Length Invalid (0Fh): the SGL describes fewer or more bytes than the command
    /// moves.
    pub const DATA_SGL_LENGTH_INVALID: Status = Status::new(Sct::Generic, 0x0f, true);
    /// SGL Descriptor Type Invalid (11h): not an NVMe/TCP data descriptor.
    pub const SGL_DESCRIPTOR_TYPE_INVALID: Status = Status::new(Sct::Generic, 0x11, true);
    /// SGL Offset Invalid (16h): an in-capsule offset past the in-capsule data.
    pub const SGL_OFFSET_INVALID: Status = Status::new(Sct::Generic, 0x16, true);
    /// Internal Error (06h).
    pub const INTERNAL_ERROR: Status = Status::new(Sct::Generic, 0x06, false);
    /// Asynchronous Event Request Limit Exceeded (command specific 05h).
    pub const AER_LIMIT_EXCEEDED: Status = Status::new(Sct::CommandSpecific, 0x05, true);
    /// Invalid Log Page (command specific 09h).
    pub const INVALID_LOG_PAGE: Status = Status::new(Sct::CommandSpecific, 0x09, true);
    /// Feature Identifier Not Saveable (command specific 0Dh).
    pub const FEATURE_NOT_SAVEABLE: Status = Status::new(Sct::CommandSpecific, 0x0d, true);
    /// Connect Incompatible Format (NVMe-oF 1.1 Connect status values, command specific
    /// 80h): RECFMT other than 0.
    pub const CONNECT_INCOMPATIBLE_FORMAT: Status = Status::new(Sct::CommandSpecific, 0x80, true);
    /// Connect Controller Busy (81h): no controller ID left to allocate.
    pub const CONNECT_CONTROLLER_BUSY: Status = Status::new(Sct::CommandSpecific, 0x81, true);
    /// Connect Invalid Parameters (82h): completion dword 0 says which (IATTR, IPO).
    pub const CONNECT_INVALID_PARAMETERS: Status = Status::new(Sct::CommandSpecific, 0x82, true);
    /// Connect Invalid Host (84h): the host NQN may not use the subsystem.
    pub const CONNECT_INVALID_HOST: Status = Status::new(Sct::CommandSpecific, 0x84, true);
    /// Asymmetric Access Persistent Loss (NVMe Base 2.0 Figure 105, Path Related Status 01h):
    /// the namespace is in the ANA Persistent Loss state on this controller's path. DNR is
    /// clear so that a multipath host retries on another path (Linux fails over only then).
    pub const ANA_PERSISTENT_LOSS: Status = Status::new(Sct::Path, 0x01, false);
    /// Asymmetric Access Inaccessible (Path Related Status 02h): the ANA Inaccessible state.
    pub const ANA_INACCESSIBLE: Status = Status::new(Sct::Path, 0x02, false);
    /// Asymmetric Access Transition (Path Related Status 03h): the ANA Change state.
    pub const ANA_TRANSITION: Status = Status::new(Sct::Path, 0x03, false);
}

/// Which way a command's data moves (opcode bits 1:0, NVMe Base 2.0 Figure 138).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// No data.
    None,
    /// Host to controller (a write): in the capsule or after R2T.
    HostToController,
    /// Controller to host (a read): C2HData PDUs.
    ControllerToHost,
}

/// The direction of `sqe`'s data: opcode bits 1:0 for admin and I/O commands; for Fabrics
/// commands (opcode 7Fh) by command type: Connect carries its 1024-byte data to the controller,
/// Property Get/Set none (their values travel in the SQE and CQE).
pub fn direction(sqe: &Sqe) -> Direction {
    if sqe.opcode() == FABRICS_OPCODE {
        return match fctype_of(sqe) {
            fctype::CONNECT | fctype::AUTHENTICATION_SEND => Direction::HostToController,
            fctype::AUTHENTICATION_RECEIVE => Direction::ControllerToHost,
            _ => Direction::None,
        };
    }
    match sqe.opcode() & 0b11 {
        0b01 => Direction::HostToController,
        0b10 => Direction::ControllerToHost,
        // 11b (bidirectional) is used by no command this target implements: treated as
        // carrying no data, so the command is refused by its opcode.
        _ => Direction::None,
    }
}

/// Where a command's data travels on an NVMe/TCP queue, from its SGL descriptor (NVMe Base 2.0
/// §4.3.2; the NVMe/TCP Transport 1.0 binding uses two: an SGL Data Block with
/// the offset subtype for data in the capsule, and a Transport SGL Data Block, type 5h with
/// subtype Ah, for data moved by R2T/H2CData or C2HData).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataXfer {
    /// No data.
    None,
    /// Host-to-controller data in the command capsule: `len` bytes from `offset` in the
    /// capsule's in-capsule data (see [`DataXfer::in_capsule_slice`]).
    InCapsule {
        /// Offset from the start of the in-capsule data (ICDOFF is 0).
        offset: u32,
        /// Bytes.
        len: u32,
    },
    /// Host-to-controller data the target asks for with R2T (H2CData PDUs).
    FromHost {
        /// Bytes.
        len: u32,
    },
    /// Controller-to-host data (C2HData PDUs).
    ToHost {
        /// Bytes.
        len: u32,
    },
}

impl DataXfer {
    /// Bytes moved.
    pub fn len(&self) -> u32 {
        match *self {
            DataXfer::None => 0,
            DataXfer::InCapsule { len, .. } | DataXfer::FromHost { len } | DataXfer::ToHost { len } => len,
        }
    }

    /// Whether no bytes move.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The command's data within `capsule`, the in-capsule data that came with the command
    /// (everything after the SQE, without padding or digest). A capsule shorter than the SGL
    /// says is refused with Data SGL Length Invalid; other kinds give an empty slice.
    pub fn in_capsule_slice<'a>(&self, capsule: &'a [u8]) -> Result<&'a [u8], Status> {
        match *self {
            DataXfer::InCapsule { offset, len } => {
                let (o, l) = (offset as usize, len as usize);
                capsule.get(o..o + l).ok_or(status::DATA_SGL_LENGTH_INVALID)
            }
            _ => Ok(&[]),
        }
    }
}

/// SGL identifier (descriptor byte 15) of an SGL Data Block with the offset subtype: data in
/// the capsule (NVMe Base 2.0 §4.3.2; type 0h, subtype 1h).
pub const SGL_IN_CAPSULE: u8 = 0x01;
/// SGL identifier of a Transport SGL Data Block with NVMe/TCP's subtype Ah (type 5h): data
/// moved by the transport (R2T/H2CData or C2HData).
pub const SGL_TRANSPORT: u8 = 0x5a;

/// Checks the CDW0 flags every fabrics command must carry: no fused operation (FUSE, bits
/// 9:8; this target does not implement fused commands) and PSDT 01b: "SGLs, metadata pointer
/// a contiguous buffer" (NVMe Base 2.0 Figure 88). Fabrics have no PRPs, and Linux's host sets
/// 01b on every command; Linux's target answers anything else with Invalid Field in Command, as
/// this one does.
pub fn check_flags(sqe: &Sqe) -> Result<(), Status> {
    let fuse = (sqe.dw[0] >> 8) & 0b11;
    if fuse != 0 || sqe.psdt() != 0b01 {
        return Err(Status::INVALID_FIELD);
    }
    Ok(())
}

/// Decodes where `sqe`'s data travels; `in_capsule_max` is the in-capsule data the queue
/// accepts. Commands without data ignore their descriptor. In-capsule data is refused for a
/// read (Invalid Field), past the queue's capsule with SGL Offset Invalid or Data SGL Length
/// Invalid; any descriptor but the two NVMe/TCP uses with SGL Descriptor Type Invalid.
pub fn data_xfer(sqe: &Sqe, in_capsule_max: u32) -> Result<DataXfer, Status> {
    let dir = direction(sqe);
    if dir == Direction::None {
        return Ok(DataXfer::None);
    }
    let addr = sqe.dw[6] as u64 | (sqe.dw[7] as u64) << 32;
    let len = sqe.dw[8];
    let id = (sqe.dw[9] >> 24) as u8;
    match id {
        SGL_IN_CAPSULE => {
            if dir != Direction::HostToController {
                return Err(Status::INVALID_FIELD);
            }
            if addr > in_capsule_max as u64 {
                return Err(status::SGL_OFFSET_INVALID);
            }
            if addr + len as u64 > in_capsule_max as u64 {
                return Err(status::DATA_SGL_LENGTH_INVALID);
            }
            Ok(DataXfer::InCapsule {
                offset: addr as u32,
                len,
            })
        }
        SGL_TRANSPORT if len == 0 => Ok(DataXfer::None),
        SGL_TRANSPORT => Ok(match dir {
            Direction::HostToController => DataXfer::FromHost { len },
            _ => DataXfer::ToHost { len },
        }),
        _ => Err(status::SGL_DESCRIPTOR_TYPE_INVALID),
    }
}

/// Checks that `sqe` moves exactly `len` bytes to the host through C2HData: what Identify, Get
/// Log Page and Get Features with data need. A different length is Data SGL Length Invalid
/// (this target does not advertise SGLS bit 18, "SGL longer than the data"); in-capsule data
/// on a read is Invalid Field.
pub(crate) fn expect_to_host(sqe: &Sqe, len: u32) -> Result<(), Status> {
    match data_xfer(sqe, 0)? {
        DataXfer::ToHost { len: l } if l == len => Ok(()),
        _ => Err(status::DATA_SGL_LENGTH_INVALID),
    }
}

/// The SQ head pointer a queue reports in its completions (NVMe Base 2.0 Figure 89, SQHD; SQ
/// flow control as NVMe-oF 1.1 describes it): the runtime owns one per queue and calls
/// [`SqHead::advance`] once per command it takes off the wire, Connect included, putting the
/// value in that command's completion.
#[derive(Debug, Clone)]
pub struct SqHead {
    entries: u32,
    head: u32,
    disabled: bool,
}

impl SqHead {
    /// For a queue of `entries` entries (SQSIZE + 1 of its Connect); `flow_control_disabled`
    /// when the host asked for it (CATTR bit 2), where SQHD is reserved and reported as 0.
    pub fn new(entries: u32, flow_control_disabled: bool) -> Self {
        SqHead {
            entries: entries.max(1),
            head: 0,
            disabled: flow_control_disabled,
        }
    }

    /// Consumes one entry and returns the SQHD for its completion.
    pub fn advance(&mut self) -> u16 {
        if self.disabled {
            return 0;
        }
        self.head = (self.head + 1) % self.entries;
        self.head as u16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_through_bytes() {
        let mut b = [0u8; SQE_BYTES];
        for (i, x) in b.iter_mut().enumerate() {
            *x = i as u8;
        }
        let sqe = sqe_from_bytes(&b);
        assert_eq!(sqe.dw[0], 0x0302_0100);
        assert_eq!(sqe.opcode(), 0x00);
        assert_eq!(sqe.cid(), 0x0302);
        assert_eq!(sqe_to_bytes(&sqe), b);
        let c = cqe(0xbeef, status::CONNECT_INVALID_PARAMETERS, 0x0001_0100);
        let cb = cqe_to_bytes(&c);
        assert_eq!(&cb[0..4], &[0x00, 0x01, 0x01, 0x00]);
        assert_eq!(&cb[12..14], &[0xef, 0xbe]);
        // Status 82h, SCT 1, DNR: (0x82 << 1) | (1 << 9) | (1 << 15), phase bit clear.
        assert_eq!(u16::from_le_bytes([cb[14], cb[15]]), 0x8304);
    }

    fn with_sgl(opcode: u8, id: u8, addr: u64, len: u32) -> Sqe {
        let mut s = Command::new(opcode, 1);
        s.dw[0] |= 1 << 14;
        s.dw[6] = addr as u32;
        s.dw[7] = (addr >> 32) as u32;
        s.dw[8] = len;
        s.dw[9] = (id as u32) << 24;
        s
    }

    #[test]
    fn sgl_descriptors_decode_as_nvme_tcp_defines_them() {
        // Linux's nvme_tcp_set_sg_inline: offset subtype, address = ICDOFF = 0.
        let w = with_sgl(0x01, SGL_IN_CAPSULE, 0, 4096);
        assert_eq!(
            data_xfer(&w, 8192),
            Ok(DataXfer::InCapsule { offset: 0, len: 4096 })
        );
        assert_eq!(data_xfer(&w, 4095), Err(status::DATA_SGL_LENGTH_INVALID));
        let far = with_sgl(0x01, SGL_IN_CAPSULE, 9000, 16);
        assert_eq!(data_xfer(&far, 8192), Err(status::SGL_OFFSET_INVALID));
        // nvme_tcp_set_sg_host_data: transport SGL, the direction from the opcode.
        let w = with_sgl(0x01, SGL_TRANSPORT, 0, 65536);
        assert_eq!(data_xfer(&w, 8192), Ok(DataXfer::FromHost { len: 65536 }));
        let r = with_sgl(0x02, SGL_TRANSPORT, 0, 512);
        assert_eq!(data_xfer(&r, 8192), Ok(DataXfer::ToHost { len: 512 }));
        assert_eq!(expect_to_host(&r, 512), Ok(()));
        assert_eq!(expect_to_host(&r, 4096), Err(status::DATA_SGL_LENGTH_INVALID));
        // A read cannot take its data from the capsule.
        let r = with_sgl(0x02, SGL_IN_CAPSULE, 0, 512);
        assert_eq!(data_xfer(&r, 8192), Err(Status::INVALID_FIELD));
        // nvme_tcp_set_sg_null on a command without data, and a keyed (RDMA) descriptor.
        assert_eq!(
            data_xfer(&with_sgl(0x00, SGL_TRANSPORT, 0, 0), 0),
            Ok(DataXfer::None)
        );
        assert_eq!(
            data_xfer(&with_sgl(0x02, 0x40, 0x1000, 512), 8192),
            Err(status::SGL_DESCRIPTOR_TYPE_INVALID)
        );
        let data = [7u8; 32];
        let x = DataXfer::InCapsule { offset: 8, len: 16 };
        assert_eq!(x.in_capsule_slice(&data), Ok(&data[8..24]));
        assert_eq!(
            x.in_capsule_slice(&data[..20]),
            Err(status::DATA_SGL_LENGTH_INVALID)
        );
    }

    #[test]
    fn flags_other_than_sgl_metabuf_are_refused() {
        let ok = with_sgl(0x02, SGL_TRANSPORT, 0, 512);
        assert_eq!(check_flags(&ok), Ok(()));
        let mut prp = ok;
        prp.dw[0] &= !(3 << 14);
        assert_eq!(check_flags(&prp), Err(Status::INVALID_FIELD));
        let mut fused = ok;
        fused.dw[0] |= 1 << 8;
        assert_eq!(check_flags(&fused), Err(Status::INVALID_FIELD));
    }

    #[test]
    fn sq_head_wraps_and_is_zero_without_flow_control() {
        let mut h = SqHead::new(4, false);
        assert_eq!(
            [h.advance(), h.advance(), h.advance(), h.advance(), h.advance()],
            [1, 2, 3, 0, 1]
        );
        let mut off = SqHead::new(4, true);
        assert_eq!(off.advance(), 0);
    }
}
