//! NVMe/TCP PDUs (NVMe/TCP Transport Specification 1.0c §3.6) as pure logic: no sockets, no
//! allocation, no `unsafe`.
//!
//! The runtime reads bytes from a non-blocking socket and asks this module what they are; it
//! sends data straight from DMA buffers and receives write data straight into them, so
//! everything here works on headers only and never needs the data bytes in a slice it owns.
//!
//! Receiving, per connection ([`ConnParams`] holds what was negotiated):
//! 1. read 8 bytes (the common header) and call [`parse_header`]: [`Progress::Need`] says how
//!    many header bytes the PDU has (HLEN plus the header digest); a malformed common header is
//!    an [`Error`] already, before any more of the PDU is read;
//! 2. read that many and call [`parse_header`] again: [`Progress::Done`] gives the typed
//!    [`HostPdu`] and its [`Layout`] (padding to skip, data length, data digest);
//! 3. read the data where it belongs (a DMA buffer for H2CData and in-capsule data), feeding
//!    it to a [`DataDigest`] when data digests are on, then the 4-byte digest;
//! 4. an [`Error`] carries the Fatal Error Status and Field Error Information of the
//!    C2HTermReq that answers it ([`c2h_term_req_for`]); after sending it the connection is
//!    closed (§3.6.2.5). [`Error::reply`] is false for a malformed H2CTermReq, which is closed
//!    without a reply (§3.6.2.4).
//!
//! Sending: [`c2h_data_header`], [`r2t`], [`capsule_resp`], [`ic_resp`] and [`c2h_term_req`]
//! write headers (with their digest and padding) into the caller's buffer; the caller sends the
//! data from its own memory and, with data digests on, the digest of the [`DataDigest`] it fed.
//!
//! The host side ([`parse_c2h_header`], [`capsule_cmd_header`], [`h2c_data_header`],
//! [`ic_req`], [`host_accept_ic_resp`]) exists for test clients and for round-trip tests.
//!
//! Choices the Linux initiator (`drivers/nvme/host/tcp.c`) forces: CPDA 0, MAXH2CDATA a multiple
//! of 4 and at least 4096, the digests mirrored exactly, C2HData SUCCESS only with LAST_PDU,
//! every PDU it receives with HLEN 24 (or 128 for the ICResp), no digests in a C2HTermReq whose
//! PLEN is 24 to 152 bytes.
//!
//! Section numbers follow the PDU chapter of the NVMe/TCP Transport Specification 1.0c (§3.6:
//! the common header in §3.6.2.1, then the PDU types in type order, ICReq §3.6.2.2 to R2T
//! §3.6.2.10); each citation also names the PDU and field, which is how to find them in other
//! revisions (NVMe over Fabrics 1.1 §7.4 has the same PDUs). Linux's
//! `include/linux/nvme-tcp.h` lays out the same bytes, and [`field`] names their offsets.

mod build;
mod digest;
mod error;
pub mod field;
mod headers;
mod negotiate;
mod parse;
mod transfer;

#[cfg(test)]
mod error_tests;
#[cfg(test)]
mod props;
#[cfg(test)]
mod tests;

pub use build::{
    c2h_data_header, c2h_term_req, c2h_term_req_for, capsule_cmd_header, capsule_resp, h2c_data_header,
    h2c_term_req, ic_req, ic_resp, r2t, BuildError, TxHeader, MAX_TX_HEADER_LEN,
};
pub use digest::{header_digest, DataDigest};
pub use error::{Error, Fes, Reason};
pub use headers::{
    C2hData, CapsuleCmd, CapsuleResp, CtrlPdu, DataSgl, H2cData, Header, HostPdu, IcReq, IcResp, Layout,
    Progress, R2t, TermReq,
};
pub use negotiate::{host_accept_ic_resp, negotiate, LimitsError, TargetLimits};
pub use parse::{parse_c2h_header, parse_header, read_c2h_header};
pub use transfer::{check_h2c_data, R2tWindow};

/// Length of a header or data digest (CRC32C, little-endian on the wire; §3.6.2.1 HDGSTF/DDGSTF).
pub const DIGEST_LEN: usize = 4;
/// Length of the common header that starts every PDU (§3.6.2.1).
pub const COMMON_HEADER_LEN: usize = 8;
/// The most header bytes a received PDU can have: an ICReq (128) with a header digest slot.
/// Buffers of this size hold any PDU header plus its digest.
pub const MAX_HEADER_LEN: usize = 128 + DIGEST_LEN;
/// Most bytes of an offending PDU header a termination request quotes (§3.6.2.4/§3.6.2.5: the
/// whole termination request is at most 152 bytes; Linux `NVME_TCP_MAX_C2HTERM_PLEN`).
pub const TERM_REQ_MAX_QUOTE: usize = 128;
/// Smallest MAXH2CDATA a controller may offer (§3.6.2.3; Linux `NVME_TCP_MIN_MAXH2CDATA`).
pub const MIN_MAXH2CDATA: u32 = 4096;
/// In-capsule data a Fabrics command (Connect's 1024 bytes, ...) may carry on any queue,
/// whatever the I/O queues' IOCCSZ: the Linux initiator sends fabrics commands with up to this
/// much in-capsule data (`NVME_TCP_ADMIN_CCSZ`).
pub const FABRICS_MAX_ICD: u32 = 8192;

/// PDU-Type (§3.6.2.1 common header, byte 0): bit 0 is clear for host-to-controller PDUs and
/// set for controller-to-host ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PduType {
    /// Initialize Connection Request (§3.6.2.2).
    IcReq = 0x00,
    /// Initialize Connection Response (§3.6.2.3).
    IcResp = 0x01,
    /// Host to Controller Terminate Connection Request (§3.6.2.4).
    H2cTermReq = 0x02,
    /// Controller to Host Terminate Connection Request (§3.6.2.5).
    C2hTermReq = 0x03,
    /// Command Capsule (§3.6.2.6).
    CapsuleCmd = 0x04,
    /// Response Capsule (§3.6.2.7).
    CapsuleResp = 0x05,
    /// Host to Controller Data (§3.6.2.8).
    H2cData = 0x06,
    /// Controller to Host Data (§3.6.2.9).
    C2hData = 0x07,
    /// Ready to Transfer (§3.6.2.10).
    R2t = 0x09,
}

impl PduType {
    /// The type of a PDU-Type byte, or `None` for a reserved value.
    pub const fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0x00 => PduType::IcReq,
            0x01 => PduType::IcResp,
            0x02 => PduType::H2cTermReq,
            0x03 => PduType::C2hTermReq,
            0x04 => PduType::CapsuleCmd,
            0x05 => PduType::CapsuleResp,
            0x06 => PduType::H2cData,
            0x07 => PduType::C2hData,
            0x09 => PduType::R2t,
            _ => return None,
        })
    }

    /// True for PDUs a host sends (the even types).
    pub const fn from_host(self) -> bool {
        (self as u8) & 1 == 0
    }

    /// HLEN, fixed per type (§3.6.2: ICReq/ICResp 128, CapsuleCmd 72 = 8 + a 64-byte SQE,
    /// CapsuleResp 24 = 8 + a 16-byte CQE, H2CData/C2HData/R2T/TermReq 24).
    pub const fn hlen(self) -> u8 {
        match self {
            PduType::IcReq | PduType::IcResp => 128,
            PduType::CapsuleCmd => 72,
            PduType::H2cTermReq
            | PduType::C2hTermReq
            | PduType::CapsuleResp
            | PduType::H2cData
            | PduType::C2hData
            | PduType::R2t => 24,
        }
    }

    /// The flags this type may carry (§3.6.2.1 and each PDU's FLAGS description).
    pub const fn valid_flags(self) -> Flags {
        match self {
            PduType::IcReq | PduType::IcResp | PduType::H2cTermReq | PduType::C2hTermReq => Flags::NONE,
            PduType::CapsuleResp | PduType::R2t => Flags::HDGSTF,
            PduType::CapsuleCmd => Flags(Flags::HDGSTF.0 | Flags::DDGSTF.0),
            PduType::H2cData => Flags(Flags::HDGSTF.0 | Flags::DDGSTF.0 | Flags::LAST_PDU.0),
            PduType::C2hData => {
                Flags(Flags::HDGSTF.0 | Flags::DDGSTF.0 | Flags::LAST_PDU.0 | Flags::SUCCESS.0)
            }
        }
    }

    /// True for the types whose header is protected by the header digest once negotiated
    /// (§3.6.2.2: not the ICReq/ICResp, which come before; §3.6.2.4: never a termination
    /// request).
    pub const fn has_header_digest(self) -> bool {
        !matches!(
            self,
            PduType::IcReq | PduType::IcResp | PduType::H2cTermReq | PduType::C2hTermReq
        )
    }

    /// True for the types that may carry PDU data with PDO, padding and a data digest.
    pub const fn carries_data(self) -> bool {
        matches!(self, PduType::CapsuleCmd | PduType::H2cData | PduType::C2hData)
    }

    /// The specification's name.
    pub const fn name(self) -> &'static str {
        match self {
            PduType::IcReq => "ICReq",
            PduType::IcResp => "ICResp",
            PduType::H2cTermReq => "H2CTermReq",
            PduType::C2hTermReq => "C2HTermReq",
            PduType::CapsuleCmd => "CapsuleCmd",
            PduType::CapsuleResp => "CapsuleResp",
            PduType::H2cData => "H2CData",
            PduType::C2hData => "C2HData",
            PduType::R2t => "R2T",
        }
    }
}

impl core::fmt::Display for PduType {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// The FLAGS byte of the common header (§3.6.2.1 and the data PDUs' descriptions). Bits whose
/// meaning depends on the type are named after the PDUs that define them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Flags(pub u8);

impl Flags {
    /// No flag.
    pub const NONE: Flags = Flags(0);
    /// Bit 0, HDGSTF: a header digest follows the header.
    pub const HDGSTF: Flags = Flags(1 << 0);
    /// Bit 1, DDGSTF: a data digest follows the data.
    pub const DDGSTF: Flags = Flags(1 << 1);
    /// Bit 2, LAST_PDU (H2CData, C2HData): the last data PDU of a transfer (of an R2T's
    /// transfer for H2CData, of the command's data for C2HData).
    pub const LAST_PDU: Flags = Flags(1 << 2);
    /// Bit 3, SUCCESS (C2HData): the command completed successfully and no CapsuleResp
    /// follows; only with LAST_PDU (§3.6.2.9; the Linux initiator resets the connection
    /// otherwise) and only when SQ flow control is disabled (the host does not learn SQHD).
    pub const SUCCESS: Flags = Flags(1 << 3);

    /// True if every bit of `other` is set.
    pub const fn contains(self, other: Flags) -> bool {
        self.0 & other.0 == other.0
    }

    /// The union.
    pub const fn with(self, other: Flags) -> Flags {
        Flags(self.0 | other.0)
    }

    /// `other` added when `on`.
    pub const fn with_if(self, other: Flags, on: bool) -> Flags {
        if on {
            self.with(other)
        } else {
            self
        }
    }
}

/// The digests negotiated for a connection (ICReq/ICResp DGST field, §3.6.2.2/§3.6.2.3: bit 0
/// HDGST_ENABLE, bit 1 DDGST_ENABLE; bits 7:2 reserved).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Digests {
    /// Header digests on every PDU after the ICReq/ICResp except termination requests.
    pub header: bool,
    /// Data digests after the data of every PDU that carries data.
    pub data: bool,
}

impl Digests {
    /// Neither digest.
    pub const NONE: Digests = Digests {
        header: false,
        data: false,
    };

    /// From a DGST byte; reserved bits are ignored.
    pub const fn from_dgst(v: u8) -> Self {
        Digests {
            header: v & 1 != 0,
            data: v & 2 != 0,
        }
    }

    /// The DGST byte.
    pub const fn dgst(self) -> u8 {
        (self.header as u8) | ((self.data as u8) << 1)
    }

    /// Bytes of header digest on a PDU of type `t`.
    pub const fn header_len(self, t: PduType) -> usize {
        if self.header && t.has_header_digest() {
            DIGEST_LEN
        } else {
            0
        }
    }

    /// Bytes of data digest after `data_len` bytes of data of a PDU of type `t`.
    pub const fn data_len(self, t: PduType, data_len: u64) -> usize {
        if self.data && t.carries_data() && data_len != 0 {
            DIGEST_LEN
        } else {
            0
        }
    }
}

/// A PDU data alignment, CPDA or HPDA (§3.6.2.2/§3.6.2.3): 0's based, in dwords, 0 to 31, so
/// data starts at a multiple of 4 to 128 bytes from the start of the PDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Pda(u8);

impl Pda {
    /// No alignment beyond dwords (the value the Linux initiator sends and requires).
    pub const ZERO: Pda = Pda(0);
    /// The largest value (128-byte alignment).
    pub const MAX: u8 = 31;

    /// The alignment of a field value, or `None` for a reserved one (above 31).
    pub const fn new(v: u8) -> Option<Self> {
        if v <= Self::MAX {
            Some(Pda(v))
        } else {
            None
        }
    }

    /// The field value.
    pub const fn get(self) -> u8 {
        self.0
    }

    /// The alignment in bytes: (value + 1) dwords.
    pub const fn bytes(self) -> usize {
        (self.0 as usize + 1) * 4
    }

    /// Where data starts in a PDU whose header (with its digest) is `header_len` bytes: the
    /// next multiple of the alignment (the PAD field fills the gap; §3.6.2.1 PDO).
    pub const fn data_offset(self, header_len: usize) -> usize {
        header_len.div_ceil(self.bytes()) * self.bytes()
    }
}

/// Where the connection is in its life (§3.3: the ICReq/ICResp exchange comes first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Phase {
    /// Before the ICReq/ICResp exchange: only the ICReq (on the controller; the ICResp on
    /// the host) or a termination request may arrive.
    #[default]
    Initializing,
    /// After it: everything but the ICReq/ICResp.
    Ready,
}

/// What one connection negotiated, as the parser and builders need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnParams {
    /// Before or after the ICReq/ICResp exchange.
    pub phase: Phase,
    /// The digests in use.
    pub digests: Digests,
    /// Controller PDU data alignment: where data starts in PDUs the host sends.
    pub cpda: Pda,
    /// Host PDU data alignment: where data starts in PDUs the controller sends.
    pub hpda: Pda,
    /// MAXH2CDATA: the most data in one H2CData PDU.
    pub maxh2cdata: u32,
    /// The most in-capsule data a command other than a Fabrics command may carry (IOCCSZ
    /// minus the 64-byte SQE on I/O queues). Fabrics commands may carry
    /// `max(max_icd, FABRICS_MAX_ICD)`.
    pub max_icd: u32,
    /// How many R2Ts the host accepts outstanding per command (the ICReq's 0's based MAXR2T
    /// plus one, saturating).
    pub max_r2ts: u32,
}

impl ConnParams {
    /// A new connection of a controller with these limits, before the ICReq.
    pub const fn new(limits: &TargetLimits) -> Self {
        ConnParams {
            phase: Phase::Initializing,
            digests: Digests::NONE,
            cpda: Pda::ZERO,
            hpda: Pda::ZERO,
            maxh2cdata: limits.maxh2cdata(),
            max_icd: limits.max_icd(),
            max_r2ts: 1,
        }
    }

    /// The in-capsule data limit of a command with opcode `opcode` (0x7F: Fabrics).
    pub const fn icd_limit(&self, opcode: u8) -> u32 {
        if opcode == headers::FABRICS_OPCODE && self.max_icd < FABRICS_MAX_ICD {
            FABRICS_MAX_ICD
        } else {
            self.max_icd
        }
    }
}
