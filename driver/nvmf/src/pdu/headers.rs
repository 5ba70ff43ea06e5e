//! The typed headers a parse returns (NVMe/TCP 1.0c §3.6.2): one struct per PDU type with its
//! fields, and the layout of what follows the header.

use super::{field, Digests, Fes, PduType, DIGEST_LEN};

/// The Fabrics command opcode (NVMe Base 2.0 §6: Connect, Property Get/Set, ...).
pub(crate) const FABRICS_OPCODE: u8 = 0x7f;

/// Where a header parse stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress<T> {
    /// The PDU needs this many header bytes (from its first byte) before it can be parsed:
    /// 8 for the common header, then HLEN plus the header digest. More than given.
    Need(usize),
    /// The header, valid.
    Done(T),
}

/// How a PDU continues after its header: `pad` bytes to skip, `data_len` bytes of data, then
/// the data digest if `data_digest`. PLEN is the sum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Layout {
    /// HLEN plus the header digest: the bytes [`parse_header`](super::parse_header) needed.
    pub header_len: u32,
    /// PAD between the header digest and the data (PDO minus `header_len`; 0 without data).
    pub pad: u32,
    /// PDU-Data length: in-capsule data, H2CData/C2HData data, or the quoted header of a
    /// termination request; 0 for PDUs without data.
    pub data_len: u32,
    /// A 4-byte data digest follows the data.
    pub data_digest: bool,
}

impl Layout {
    /// Where the data starts from the start of the PDU (PDO when the PDU has data).
    pub const fn data_offset(&self) -> u32 {
        self.header_len + self.pad
    }

    /// Bytes of data digest: 4 or 0.
    pub const fn digest_len(&self) -> u32 {
        if self.data_digest {
            DIGEST_LEN as u32
        } else {
            0
        }
    }

    /// The bytes that follow the header: padding, data, data digest.
    pub const fn after_header(&self) -> u32 {
        self.pad + self.data_len + self.digest_len()
    }

    /// PLEN: the whole PDU.
    pub const fn plen(&self) -> u32 {
        self.header_len + self.after_header()
    }
}

/// A valid header: the PDU and how the rest of it is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header<P> {
    /// The typed PDU.
    pub pdu: P,
    /// What follows its header.
    pub layout: Layout,
}

/// A PDU a host sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostPdu {
    /// ICReq (§3.6.2.2).
    IcReq(IcReq),
    /// H2CTermReq (§3.6.2.4): the host ends the connection; close it.
    H2cTermReq(TermReq),
    /// CapsuleCmd (§3.6.2.6).
    CapsuleCmd(CapsuleCmd),
    /// H2CData (§3.6.2.8).
    H2cData(H2cData),
}

impl HostPdu {
    /// The PDU's type.
    pub const fn pdu_type(&self) -> PduType {
        match self {
            HostPdu::IcReq(_) => PduType::IcReq,
            HostPdu::H2cTermReq(_) => PduType::H2cTermReq,
            HostPdu::CapsuleCmd(_) => PduType::CapsuleCmd,
            HostPdu::H2cData(_) => PduType::H2cData,
        }
    }
}

/// A PDU a controller sends (parsed by hosts: test clients and round-trip tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CtrlPdu {
    /// ICResp (§3.6.2.3).
    IcResp(IcResp),
    /// C2HTermReq (§3.6.2.5).
    C2hTermReq(TermReq),
    /// CapsuleResp (§3.6.2.7).
    CapsuleResp(CapsuleResp),
    /// C2HData (§3.6.2.9).
    C2hData(C2hData),
    /// R2T (§3.6.2.10).
    R2t(R2t),
}

impl CtrlPdu {
    /// The PDU's type.
    pub const fn pdu_type(&self) -> PduType {
        match self {
            CtrlPdu::IcResp(_) => PduType::IcResp,
            CtrlPdu::C2hTermReq(_) => PduType::C2hTermReq,
            CtrlPdu::CapsuleResp(_) => PduType::CapsuleResp,
            CtrlPdu::C2hData(_) => PduType::C2hData,
            CtrlPdu::R2t(_) => PduType::R2t,
        }
    }
}

/// ICReq fields (§3.6.2.2), as received: [`negotiate`](super::negotiate()) judges them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IcReq {
    /// PDU Format Version (0).
    pub pfv: u16,
    /// Host PDU data alignment (0's based dwords; 32 and up are reserved).
    pub hpda: u8,
    /// The digests the host asks for.
    pub digests: Digests,
    /// Outstanding R2Ts per command the host accepts, 0's based.
    pub maxr2t: u32,
}

/// ICResp fields (§3.6.2.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IcResp {
    /// PDU Format Version (0).
    pub pfv: u16,
    /// Controller PDU data alignment (0's based dwords).
    pub cpda: u8,
    /// The digests enabled.
    pub digests: Digests,
    /// The most data in one H2CData PDU.
    pub maxh2cdata: u32,
}

/// H2CTermReq/C2HTermReq fields (§3.6.2.4/§3.6.2.5). The quoted header of the offending PDU
/// follows as the PDU's data ([`Layout::data_len`] bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TermReq {
    /// FES as received ([`TermReq::status`] decodes it).
    pub fes: u16,
    /// FEI.
    pub fei: u32,
}

impl TermReq {
    /// The Fatal Error Status, or `None` for a reserved value.
    pub const fn status(&self) -> Option<Fes> {
        Fes::from_u16(self.fes)
    }
}

/// CapsuleCmd (§3.6.2.6): the SQE and where its in-capsule data is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CapsuleCmd {
    /// The 64-byte submission queue entry.
    pub sqe: [u8; 64],
    /// In-capsule data bytes (0 without).
    pub data_len: u32,
    /// PDO: where the in-capsule data starts from the start of the PDU; 0 without data.
    pub data_offset: u32,
}

/// The command's data pointer as the NVMe/TCP transport uses it (§3.3 data transfer: the
/// first SGL descriptor; the Linux initiator's `nvme_tcp_set_sg_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataSgl {
    /// SGL Data Block descriptor, sub type Offset (identifier 01h): `len` bytes of in-capsule
    /// data at `offset` into it (ICDOFF; 0 for NVMe/TCP).
    InCapsule {
        /// Offset into the in-capsule data.
        offset: u64,
        /// Length.
        len: u32,
    },
    /// Transport SGL Data Block descriptor, sub type Transport Specific (identifier 5Ah):
    /// `len` bytes moved by R2T/H2CData (host to controller) or C2HData. Length 0: no data.
    Transport {
        /// Length.
        len: u32,
    },
    /// Any other descriptor (or PSDT selecting PRPs): not valid on NVMe/TCP; the command
    /// completes with an error status, the connection stays up.
    Other {
        /// The descriptor identifier byte (type in bits 7:4, sub type in 3:0).
        id: u8,
    },
}

impl CapsuleCmd {
    /// The opcode (CDW0 bits 7:0).
    pub const fn opcode(&self) -> u8 {
        self.sqe[field::SQE_OPCODE]
    }

    /// The command identifier (CDW0 bits 31:16).
    pub const fn cid(&self) -> u16 {
        u16::from_le_bytes([self.sqe[field::SQE_CID], self.sqe[field::SQE_CID + 1]])
    }

    /// True for a Fabrics command (opcode 7Fh).
    pub const fn is_fabrics(&self) -> bool {
        self.opcode() == FABRICS_OPCODE
    }

    /// PSDT (CDW0 bits 15:14): 0 selects PRPs, which fabrics do not use.
    pub const fn psdt(&self) -> u8 {
        self.sqe[field::SQE_FLAGS] >> 6
    }

    /// The first SGL descriptor, decoded for the transport.
    pub fn sgl(&self) -> DataSgl {
        let s = &self.sqe;
        let id = s[field::SQE_SGL_TYPE];
        let len = le32(s, field::SQE_SGL_LEN);
        match (self.psdt(), id) {
            (0, _) => DataSgl::Other { id },
            (_, 0x01) => DataSgl::InCapsule {
                offset: le64(s, field::SQE_SGL_ADDR),
                len,
            },
            (_, 0x5a) => DataSgl::Transport { len },
            _ => DataSgl::Other { id },
        }
    }
}

/// CapsuleResp (§3.6.2.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CapsuleResp {
    /// The 16-byte completion queue entry.
    pub cqe: [u8; 16],
}

impl CapsuleResp {
    /// The command identifier of the completed command.
    pub const fn cid(&self) -> u16 {
        u16::from_le_bytes([self.cqe[field::CQE_CID], self.cqe[field::CQE_CID + 1]])
    }
}

/// H2CData fields (§3.6.2.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct H2cData {
    /// The command's CID.
    pub cccid: u16,
    /// The R2T's transfer tag.
    pub ttag: u16,
    /// Offset of this data in the command's data.
    pub datao: u32,
    /// Data length (equal to [`Layout::data_len`], checked).
    pub datal: u32,
    /// LAST_PDU: the last H2CData of the R2T.
    pub last: bool,
}

/// C2HData fields (§3.6.2.9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct C2hData {
    /// The command's CID.
    pub cccid: u16,
    /// Offset of this data in the command's data.
    pub datao: u32,
    /// Data length, more than 0.
    pub datal: u32,
    /// LAST_PDU: the command's last data PDU.
    pub last: bool,
    /// SUCCESS: the command completed successfully, no CapsuleResp follows (needs `last`).
    pub success: bool,
}

/// R2T fields (§3.6.2.10).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct R2t {
    /// The command's CID.
    pub cccid: u16,
    /// Transfer tag, chosen by the controller, echoed in the H2CData.
    pub ttag: u16,
    /// Offset of the requested data in the command's data.
    pub r2to: u32,
    /// Length of the requested data, more than 0; the host sends it in H2CData PDUs of at most
    /// MAXH2CDATA each.
    pub r2tl: u32,
}

pub(super) fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

pub(super) fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

pub(super) fn le64(b: &[u8], at: usize) -> u64 {
    (le32(b, at) as u64) | ((le32(b, at + 4) as u64) << 32)
}
