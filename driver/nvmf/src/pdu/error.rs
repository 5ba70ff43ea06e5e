//! Fatal transport errors: what was wrong with a received PDU, and the Fatal Error Status and
//! Field Error Information of the termination request that reports it (NVMe/TCP 1.0c
//! §3.6.2.4/§3.6.2.5).

use super::{field, Digests, PduType, TERM_REQ_MAX_QUOTE};

/// Fatal Error Status (FES) of a termination request (§3.6.2.4/§3.6.2.5; Linux
/// `enum nvme_tcp_fatal_error_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Fes {
    /// 01h: a header field is invalid; FEI is the field's byte offset.
    InvalidHeaderField = 0x01,
    /// 02h: a PDU arrived that the protocol does not allow at this point.
    PduSequenceError = 0x02,
    /// 03h: the header digest does not match the header.
    HeaderDigestError = 0x03,
    /// 04h: H2CData (or C2HData) outside the range the R2T (or command) allows.
    DataOutOfRange = 0x04,
    /// 05h: more data than allowed in one PDU (MAXH2CDATA, in-capsule data limit); named R2T
    /// Limit Exceeded in NVMe over Fabrics 1.1.
    DataLimitExceeded = 0x05,
    /// 06h: a parameter the receiver does not support; FEI is its byte offset.
    UnsupportedParameter = 0x06,
}

impl Fes {
    /// The status of a FES field value, or `None` for a reserved value.
    pub const fn from_u16(v: u16) -> Option<Self> {
        Some(match v {
            0x01 => Fes::InvalidHeaderField,
            0x02 => Fes::PduSequenceError,
            0x03 => Fes::HeaderDigestError,
            0x04 => Fes::DataOutOfRange,
            0x05 => Fes::DataLimitExceeded,
            0x06 => Fes::UnsupportedParameter,
            _ => return None,
        })
    }

    /// True if the FEI of this status carries a field offset (Invalid PDU Header Field,
    /// Unsupported Parameter); it is reserved (0) for the others.
    pub const fn has_field_offset(self) -> bool {
        matches!(self, Fes::InvalidHeaderField | Fes::UnsupportedParameter)
    }

    /// The specification's name.
    pub const fn name(self) -> &'static str {
        match self {
            Fes::InvalidHeaderField => "Invalid PDU Header Field",
            Fes::PduSequenceError => "PDU Sequence Error",
            Fes::HeaderDigestError => "Header Digest Error",
            Fes::DataOutOfRange => "Data Transfer Out of Range",
            Fes::DataLimitExceeded => "Data Transfer Limit Exceeded",
            Fes::UnsupportedParameter => "Unsupported Parameter",
        }
    }
}

impl core::fmt::Display for Fes {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{} ({:#04x})", self.name(), *self as u16)
    }
}

/// Names the digests of a DGST field for messages.
fn digests_name(d: Digests) -> &'static str {
    match (d.header, d.data) {
        (false, false) => "none",
        (true, false) => "header",
        (false, true) => "data",
        (true, true) => "header and data",
    }
}

fn on_off(v: bool) -> &'static str {
    if v {
        "set"
    } else {
        "clear"
    }
}

/// What exactly was wrong, with the values involved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Reason {
    /// A reserved PDU-Type.
    #[error("PDU-Type {0:#04x} is not an NVMe/TCP PDU type")]
    UnknownType(u8),
    /// A PDU type the other side sends.
    #[error("{0} PDUs go from {from} to {to}, not the other way", from = if .0.from_host() { "host" } else { "controller" }, to = if .0.from_host() { "controller" } else { "host" })]
    WrongDirection(PduType),
    /// A PDU before the ICReq/ICResp exchange.
    #[error("{0} arrived before the ICReq/ICResp exchange; a connection starts with the ICReq")]
    BeforeIc(PduType),
    /// An ICReq/ICResp after the exchange.
    #[error("a second {0} arrived on an initialized connection")]
    RepeatedIc(PduType),
    /// FLAGS bits the type does not define.
    #[error("FLAGS {flags:#04x} of a {pdu} sets bits it does not define (it may set {allowed:#04x})")]
    ReservedFlags {
        /// The PDU.
        pdu: PduType,
        /// FLAGS.
        flags: u8,
        /// The bits the type defines.
        allowed: u8,
    },
    /// HDGSTF disagrees with the negotiated header digests.
    #[error("HDGSTF is {} on a {pdu}, but header digests were {} at connection set-up", on_off(*set), if *set { "not negotiated" } else { "negotiated" })]
    HeaderDigestFlag {
        /// The PDU.
        pdu: PduType,
        /// HDGSTF.
        set: bool,
    },
    /// DDGSTF disagrees with the negotiated data digests and whether the PDU has data.
    #[error("DDGSTF is {} on a {pdu} with {data_len} bytes after its header while data digests are {}; it is set exactly when data digests are on and the PDU carries data", on_off(*set), if *negotiated { "on" } else { "off" })]
    DataDigestFlag {
        /// The PDU.
        pdu: PduType,
        /// DDGSTF.
        set: bool,
        /// Data digests negotiated.
        negotiated: bool,
        /// Bytes after the header (with its digest) by PLEN.
        data_len: u64,
    },
    /// C2HData with SUCCESS but not LAST_PDU.
    #[error(
        "C2HData sets SUCCESS without LAST_PDU; SUCCESS ends the command, so it belongs on the last data PDU"
    )]
    SuccessWithoutLast,
    /// HLEN is not the type's.
    #[error("HLEN {hlen} of a {pdu} must be {expected}")]
    Hlen {
        /// The PDU.
        pdu: PduType,
        /// HLEN.
        hlen: u8,
        /// The type's header length.
        expected: u8,
    },
    /// PDO is not a valid data offset.
    #[error("PDO {pdo} of a {pdu} is not a valid data offset: {rule}")]
    Pdo {
        /// The PDU.
        pdu: PduType,
        /// PDO.
        pdo: u8,
        /// The rule it breaks.
        rule: &'static str,
    },
    /// PLEN does not fit the header, the offsets or the type.
    #[error("PLEN {plen} of a {pdu} must be between {min} and {max}")]
    Plen {
        /// The PDU.
        pdu: PduType,
        /// PLEN.
        plen: u32,
        /// The smallest valid PLEN here.
        min: u64,
        /// The largest valid PLEN here.
        max: u64,
    },
    /// More data in one PDU than the connection allows.
    #[error(
        "a {pdu} carries {len} bytes of data, more than the {max} bytes this connection allows in one PDU"
    )]
    DataLimit {
        /// The PDU.
        pdu: PduType,
        /// Its data length.
        len: u64,
        /// The limit (MAXH2CDATA, or the in-capsule data limit).
        max: u32,
    },
    /// DATAL disagrees with the data PLEN and PDO leave.
    #[error("DATAL {datal} of a {pdu} disagrees with the {carried} data bytes its PLEN and PDO leave")]
    Datal {
        /// The PDU.
        pdu: PduType,
        /// DATAL.
        datal: u32,
        /// The data length from PLEN and PDO.
        carried: u64,
    },
    /// The header digest does not match.
    #[error("header digest {received:#010x} does not match the header (CRC32C {computed:#010x})")]
    HeaderDigest {
        /// HDGST as received.
        received: u32,
        /// CRC32C of the header.
        computed: u32,
    },
    /// An ICReq/ICResp PFV other than 0.
    #[error("PDU format version {0} is not supported; only version 0 (NVMe/TCP 1.0) is")]
    Pfv(u16),
    /// A reserved HPDA.
    #[error("HPDA {0} is reserved; host PDU data alignment is 0 to 31 dwords (0's based)")]
    Hpda(u8),
    /// An ICResp CPDA other than 0 (host side: the Linux initiator's rule).
    #[error("CPDA {0} in the ICResp; the Linux initiator accepts only 0")]
    Cpda(u8),
    /// An ICResp MAXH2CDATA that is not a multiple of 4 of at least 4096.
    #[error("MAXH2CDATA {0} in the ICResp; it must be a multiple of 4 and at least 4096")]
    MaxH2cData(u32),
    /// An ICResp whose digests are not the ones the host asked for.
    #[error("the ICResp enables {} digests, the ICReq asked for {}", digests_name(*got), digests_name(*asked))]
    DigestsNotMirrored {
        /// ICReq DGST.
        asked: Digests,
        /// ICResp DGST.
        got: Digests,
    },
    /// H2CData outside its R2T's range.
    #[error("H2CData for bytes {datao}..{} of the command lies outside the R2T's bytes {r2to}..{}", *datao as u64 + *datal as u64, *r2to as u64 + *r2tl as u64)]
    OutOfRange {
        /// DATAO.
        datao: u32,
        /// DATAL.
        datal: u32,
        /// The R2T's R2TO.
        r2to: u32,
        /// The R2T's R2TL.
        r2tl: u32,
    },
    /// H2CData not continuing where the previous one ended.
    #[error("H2CData starts at byte {datao} of the command, but the R2T's data so far ends at {expected}; data PDUs arrive in order")]
    OutOfOrder {
        /// DATAO.
        datao: u32,
        /// Where the data received so far ends.
        expected: u64,
    },
    /// LAST_PDU disagrees with where the PDU ends.
    #[error("LAST_PDU is {} on an H2CData that {} the R2T's transfer", on_off(*last), if *ends { "ends" } else { "does not end" })]
    LastPdu {
        /// LAST_PDU.
        last: bool,
        /// Whether the PDU ends the transfer.
        ends: bool,
    },
    /// A transfer tag no R2T of this connection has outstanding.
    #[error("H2CData TTAG {0} names no outstanding R2T on this connection")]
    UnknownTtag(u16),
    /// A command identifier no outstanding command of this connection has.
    #[error("{pdu} CCCID {cccid} names no outstanding command on this connection")]
    UnknownCccid {
        /// The PDU.
        pdu: PduType,
        /// CCCID.
        cccid: u16,
    },
    /// A valid PDU that the connection does not expect now.
    #[error("a {0} arrived that this connection does not expect now")]
    Unexpected(PduType),
}

/// A received PDU the connection cannot go on from: the runtime answers it with a
/// termination request ([`c2h_term_req_for`](super::c2h_term_req_for)) unless
/// [`Error::reply`] says not to, then closes the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{reason} (NVMe/TCP fatal error: {fes}, FEI {fei})")]
pub struct Error {
    fes: Fes,
    fei: u32,
    reason: Reason,
    /// Header bytes of the offending PDU to quote, at most 128.
    quote_len: u8,
    /// False for a malformed termination request: close without replying.
    reply: bool,
}

impl Error {
    /// An error with this status; `fei` only counts for statuses with a field offset.
    pub(crate) const fn new(fes: Fes, fei: usize, reason: Reason, quote_len: usize) -> Self {
        let quote = if quote_len > TERM_REQ_MAX_QUOTE {
            TERM_REQ_MAX_QUOTE
        } else {
            quote_len
        };
        Error {
            fes,
            fei: if fes.has_field_offset() { fei as u32 } else { 0 },
            reason,
            quote_len: quote as u8,
            reply: true,
        }
    }

    /// An Invalid PDU Header Field error at `offset`.
    pub(crate) const fn field(offset: usize, reason: Reason, quote_len: usize) -> Self {
        Error::new(Fes::InvalidHeaderField, offset, reason, quote_len)
    }

    /// The same error, to be answered by closing the connection without a termination
    /// request (a malformed termination request, §3.6.2.4/§3.6.2.5).
    pub(crate) const fn silent(mut self) -> Self {
        self.reply = false;
        self
    }

    /// H2CData whose TTAG names no outstanding R2T: Invalid PDU Header Field at TTAG.
    pub const fn unknown_ttag(ttag: u16) -> Self {
        Error::field(
            field::DATA_TTAG,
            Reason::UnknownTtag(ttag),
            PduType::H2cData.hlen() as usize,
        )
    }

    /// A data PDU or response whose CCCID names no outstanding command: Invalid PDU Header
    /// Field at CCCID (offset 8 in the data PDUs, R2T and CapsuleResp's CQE at 8 + 12).
    pub const fn unknown_cccid(pdu: PduType, cccid: u16) -> Self {
        let offset = match pdu {
            PduType::CapsuleResp => field::RSP_CQE + field::CQE_CID,
            _ => field::DATA_CCCID,
        };
        Error::field(offset, Reason::UnknownCccid { pdu, cccid }, pdu.hlen() as usize)
    }

    /// A valid PDU that the connection does not expect now (H2CData while no R2T is
    /// outstanding for its command, ...): PDU Sequence Error.
    pub const fn unexpected(pdu: PduType) -> Self {
        Error::new(
            Fes::PduSequenceError,
            0,
            Reason::Unexpected(pdu),
            pdu.hlen() as usize,
        )
    }

    /// The Fatal Error Status.
    pub const fn fes(&self) -> Fes {
        self.fes
    }

    /// The Field Error Information: the byte offset of the offending field for
    /// [`Fes::InvalidHeaderField`] and [`Fes::UnsupportedParameter`], 0 (reserved) for the
    /// others.
    pub const fn fei(&self) -> u32 {
        self.fei
    }

    /// What was wrong.
    pub const fn reason(&self) -> Reason {
        self.reason
    }

    /// False when the connection is closed without a termination request: the offending PDU
    /// was itself a malformed termination request.
    pub const fn reply(&self) -> bool {
        self.reply
    }

    /// How many bytes of the offending PDU's header a termination request quotes: its HLEN
    /// when that was valid for its type, else the 8-byte common header; at most 128.
    pub const fn quote_len(&self) -> usize {
        self.quote_len as usize
    }

    /// The part of `received` (the offending PDU from its first byte) that a termination
    /// request quotes.
    pub fn quoted<'a>(&self, received: &'a [u8]) -> &'a [u8] {
        &received[..self.quote_len().min(received.len())]
    }
}
