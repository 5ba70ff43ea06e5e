//! Parsing and validating received PDU headers (NVMe/TCP 1.0c §3.6.2).
//!
//! Fields are checked in the order of their offsets, so the error names the first wrong one
//! (the rule FreeBSD's `nvmf_tcp_validate_pdu_header` follows): PDU-Type, FLAGS, HLEN, PDO,
//! PLEN, then the header digest, then the type's own fields. One exception: a PLEN too short
//! for the header itself is reported before PDO, since PDO is only judged against a PLEN that
//! covers the header.

use super::headers::{le16, le32};
use super::{
    digest::header_digest, field, C2hData, CapsuleCmd, CapsuleResp, ConnParams, CtrlPdu, Digests, Error, Fes,
    Flags, H2cData, Header, HostPdu, IcReq, IcResp, Layout, PduType, Phase, Progress, R2t, Reason, TermReq,
    COMMON_HEADER_LEN, DIGEST_LEN, FABRICS_MAX_ICD, TERM_REQ_MAX_QUOTE,
};

/// The common header (§3.6.2.1).
#[derive(Debug, Clone, Copy)]
struct Common {
    typ: u8,
    flags: Flags,
    hlen: u8,
    pdo: u8,
    plen: u32,
}

impl Common {
    fn read(b: &[u8]) -> Self {
        Common {
            typ: b[field::TYPE],
            flags: Flags(b[field::FLAGS]),
            hlen: b[field::HLEN],
            pdo: b[field::PDO],
            plen: le32(b, field::PLEN),
        }
    }
}

/// What the common header alone says.
struct Checked {
    pdu: PduType,
    flags: Flags,
    layout: Layout,
}

/// Validates the common header of a PDU received by a controller (`from_host`) or a host.
fn check_common(ch: &Common, conn: &ConnParams, from_host: bool) -> Result<Checked, Error> {
    let Some(pdu) = PduType::from_u8(ch.typ) else {
        return Err(Error::field(
            field::TYPE,
            Reason::UnknownType(ch.typ),
            COMMON_HEADER_LEN,
        ));
    };
    if pdu.from_host() != from_host {
        return Err(wrong_direction(pdu));
    }
    // Quote the whole header when HLEN is right for the type, else only the common header.
    let quote = if ch.hlen == pdu.hlen() {
        pdu.hlen() as usize
    } else {
        COMMON_HEADER_LEN
    };
    let initialization = matches!(pdu, PduType::IcReq | PduType::IcResp);
    let term = matches!(pdu, PduType::H2cTermReq | PduType::C2hTermReq);
    let sequence = match conn.phase {
        Phase::Initializing if !initialization && !term => Some(Reason::BeforeIc(pdu)),
        Phase::Ready if initialization => Some(Reason::RepeatedIc(pdu)),
        _ => None,
    };
    if let Some(reason) = sequence {
        return Err(Error::new(Fes::PduSequenceError, 0, reason, quote));
    }
    let checked = check_fields(ch, conn, pdu, quote);
    // A malformed termination request ends the connection without a reply (§3.6.2.4).
    if term {
        checked.map_err(Error::silent)
    } else {
        checked
    }
}

/// FLAGS, HLEN, PDO and PLEN of a PDU of a known type allowed now.
fn check_fields(ch: &Common, conn: &ConnParams, pdu: PduType, quote: usize) -> Result<Checked, Error> {
    let hlen = pdu.hlen() as u64;
    let hdgst = conn.digests.header_len(pdu) as u64;
    let full_hlen = hlen + hdgst;
    let plen = ch.plen as u64;
    let pdo = ch.pdo as u64;
    let has_data = pdu.carries_data() && plen > full_hlen;

    // FLAGS.
    let allowed = pdu.valid_flags();
    if ch.flags.0 & !allowed.0 != 0 {
        let reason = Reason::ReservedFlags {
            pdu,
            flags: ch.flags.0,
            allowed: allowed.0,
        };
        return Err(Error::field(field::FLAGS, reason, quote));
    }
    let hdgstf = ch.flags.contains(Flags::HDGSTF);
    if hdgstf != (hdgst != 0) {
        return Err(Error::field(
            field::FLAGS,
            Reason::HeaderDigestFlag { pdu, set: hdgstf },
            quote,
        ));
    }
    let ddgstf = ch.flags.contains(Flags::DDGSTF);
    let ddgst_on = conn.digests.data && has_data;
    if pdu.carries_data() && ddgstf != ddgst_on {
        let reason = Reason::DataDigestFlag {
            pdu,
            set: ddgstf,
            negotiated: conn.digests.data,
            data_len: plen.saturating_sub(full_hlen),
        };
        return Err(Error::field(field::FLAGS, reason, quote));
    }
    if pdu == PduType::C2hData && ch.flags.contains(Flags::SUCCESS) && !ch.flags.contains(Flags::LAST_PDU) {
        return Err(Error::field(field::FLAGS, Reason::SuccessWithoutLast, quote));
    }

    // HLEN.
    if ch.hlen as u64 != hlen {
        return Err(Error::field(
            field::HLEN,
            Reason::Hlen {
                pdu,
                hlen: ch.hlen,
                expected: pdu.hlen(),
            },
            quote,
        ));
    }

    // PDO and PLEN.
    let plen_err = |min: u64, max: u64| {
        Error::field(
            field::PLEN,
            Reason::Plen {
                pdu,
                plen: ch.plen,
                min,
                max,
            },
            quote,
        )
    };
    let pdo_err = |rule| {
        Error::field(
            field::PDO,
            Reason::Pdo {
                pdu,
                pdo: ch.pdo,
                rule,
            },
            quote,
        )
    };
    let header_only = Layout {
        header_len: full_hlen as u32,
        pad: 0,
        data_len: 0,
        data_digest: false,
    };
    let layout = match pdu {
        PduType::IcReq | PduType::IcResp | PduType::CapsuleResp | PduType::R2t => {
            if pdo != 0 {
                return Err(pdo_err("this PDU carries no data, so PDO is 0"));
            }
            if plen != full_hlen {
                return Err(plen_err(full_hlen, full_hlen));
            }
            header_only
        }
        PduType::H2cTermReq | PduType::C2hTermReq => {
            if pdo != 0 {
                return Err(pdo_err(
                    "a termination request's quoted header follows its header, PDO is 0",
                ));
            }
            let max = hlen + TERM_REQ_MAX_QUOTE as u64;
            if plen < hlen || plen > max {
                return Err(plen_err(hlen, max));
            }
            Layout {
                data_len: (plen - hlen) as u32,
                ..header_only
            }
        }
        PduType::CapsuleCmd | PduType::H2cData | PduType::C2hData => {
            if plen < full_hlen {
                return Err(plen_err(full_hlen, u32::MAX as u64));
            }
            // Data in PDUs the host sends is aligned to CPDA, in PDUs it receives to HPDA.
            let pda = if pdu.from_host() { conn.cpda } else { conn.hpda };
            let align = pda.bytes() as u64;
            let ddgst = if ddgst_on { DIGEST_LEN as u64 } else { 0 };
            // Without data PDO may be 0 (what Linux sends); otherwise it is where data starts.
            if has_data || pdo != 0 {
                if pdo < full_hlen {
                    return Err(pdo_err("data cannot start inside the header or its digest"));
                }
                if !pdo.is_multiple_of(align) {
                    return Err(pdo_err(
                        "data must start at a multiple of the negotiated PDU data alignment",
                    ));
                }
                if pdo > plen {
                    return Err(pdo_err("data cannot start after the end of the PDU (PLEN)"));
                }
            }
            if !has_data {
                if pdu != PduType::CapsuleCmd {
                    // A data PDU without data: PLEN must at least reach one data byte.
                    let min = pda.data_offset(full_hlen as usize) as u64 + 1 + conn.digests.data as u64 * 4;
                    return Err(plen_err(min, u32::MAX as u64));
                }
                header_only
            } else {
                if plen < pdo + ddgst + 1 {
                    return Err(plen_err(pdo + ddgst + 1, u32::MAX as u64));
                }
                let data_len = plen - pdo - ddgst;
                let limit = match pdu {
                    PduType::CapsuleCmd => Some(conn.max_icd.max(FABRICS_MAX_ICD)),
                    PduType::H2cData => Some(conn.maxh2cdata),
                    _ => None,
                };
                if let Some(max) = limit.filter(|&max| data_len > max as u64) {
                    let reason = Reason::DataLimit {
                        pdu,
                        len: data_len,
                        max,
                    };
                    return Err(Error::new(Fes::DataLimitExceeded, 0, reason, quote));
                }
                Layout {
                    header_len: full_hlen as u32,
                    pad: (pdo - full_hlen) as u32,
                    data_len: data_len as u32,
                    data_digest: ddgst_on,
                }
            }
        }
    };
    Ok(Checked {
        pdu,
        flags: ch.flags,
        layout,
    })
}

/// The common checks, then the header digest once the whole header is in `buf`.
fn check_header(buf: &[u8], conn: &ConnParams, from_host: bool) -> Result<Progress<Checked>, Error> {
    if buf.len() < COMMON_HEADER_LEN {
        return Ok(Progress::Need(COMMON_HEADER_LEN));
    }
    let checked = check_common(&Common::read(buf), conn, from_host)?;
    let need = checked.layout.header_len as usize;
    if buf.len() < need {
        return Ok(Progress::Need(need));
    }
    if checked.flags.contains(Flags::HDGSTF) {
        let hlen = checked.pdu.hlen() as usize;
        let received = le32(buf, hlen);
        let computed = header_digest(&buf[..hlen]);
        if received != computed {
            let reason = Reason::HeaderDigest { received, computed };
            return Err(Error::new(Fes::HeaderDigestError, 0, reason, hlen));
        }
    }
    Ok(Progress::Done(checked))
}

/// Parses the header of a PDU a host sent (NVMe/TCP 1.0c §3.6.2), on a connection in state
/// `conn`. `buf` holds the PDU from its first byte; bytes after the header are ignored.
///
/// - Fewer than 8 bytes: `Need(8)`.
/// - The common header is validated as soon as it is there (type known and sent by hosts,
///   allowed in this phase; FLAGS defined for the type with HDGSTF/DDGSTF exactly as
///   negotiated; HLEN the type's; PDO 0 or a data offset aligned to CPDA; PLEN consistent with
///   both and within MAXH2CDATA or the in-capsule data limit), then `Need(HLEN + digest)`.
/// - The whole header: the header digest and the type's fields are checked, and the typed
///   header is returned with the layout of the rest of the PDU.
///
/// Every error carries the FES/FEI of the C2HTermReq that reports it.
pub fn parse_header(buf: &[u8], conn: &ConnParams) -> Result<Progress<Header<HostPdu>>, Error> {
    let c = match check_header(buf, conn, true)? {
        Progress::Need(n) => return Ok(Progress::Need(n)),
        Progress::Done(c) => c,
    };
    let quote = c.pdu.hlen() as usize;
    let pdu = match c.pdu {
        PduType::IcReq => HostPdu::IcReq(IcReq {
            pfv: le16(buf, field::ICREQ_PFV),
            hpda: buf[field::ICREQ_HPDA],
            digests: Digests::from_dgst(buf[field::ICREQ_DGST]),
            maxr2t: le32(buf, field::ICREQ_MAXR2T),
        }),
        PduType::H2cTermReq => HostPdu::H2cTermReq(term_req(buf)),
        PduType::CapsuleCmd => {
            let mut sqe = [0u8; 64];
            sqe.copy_from_slice(&buf[field::CMD_SQE..field::CMD_SQE + 64]);
            let data_len = c.layout.data_len;
            let data_offset = if data_len == 0 { 0 } else { c.layout.data_offset() };
            let cmd = CapsuleCmd {
                sqe,
                data_len,
                data_offset,
            };
            let max = conn.icd_limit(cmd.opcode());
            if cmd.data_len > max {
                let reason = Reason::DataLimit {
                    pdu: c.pdu,
                    len: cmd.data_len as u64,
                    max,
                };
                return Err(Error::new(Fes::DataLimitExceeded, 0, reason, quote));
            }
            HostPdu::CapsuleCmd(cmd)
        }
        PduType::H2cData => {
            let datal = le32(buf, field::DATA_DATAL);
            check_datal(c.pdu, datal, &c.layout)?;
            HostPdu::H2cData(H2cData {
                cccid: le16(buf, field::DATA_CCCID),
                ttag: le16(buf, field::DATA_TTAG),
                datao: le32(buf, field::DATA_DATAO),
                datal,
                last: c.flags.contains(Flags::LAST_PDU),
            })
        }
        // check_common admits only the types hosts send.
        other => return Err(wrong_direction(other)),
    };
    Ok(Progress::Done(Header {
        pdu,
        layout: c.layout,
    }))
}

/// Reads the header of one PDU a controller sent from `r`, as a host does: 8 bytes, then as
/// many more as [`parse_c2h_header`] asks for. Returns the header and its bytes; what follows
/// (padding, data, digest: [`Layout::after_header`] bytes) is left in `r`. A header
/// [`parse_c2h_header`] refuses is an [`std::io::ErrorKind::InvalidData`] error. For test
/// clients.
pub fn read_c2h_header(
    r: &mut impl std::io::Read,
    conn: &ConnParams,
) -> std::io::Result<(Header<CtrlPdu>, Vec<u8>)> {
    let mut raw = vec![0u8; COMMON_HEADER_LEN];
    r.read_exact(&mut raw)?;
    loop {
        match parse_c2h_header(&raw, conn) {
            Ok(Progress::Need(n)) => {
                let have = raw.len();
                raw.resize(n, 0);
                r.read_exact(&mut raw[have..])?;
            }
            Ok(Progress::Done(h)) => return Ok((h, raw)),
            Err(e) => return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
        }
    }
}

/// Parses the header of a PDU a controller sent, as a host does: the mirror of
/// [`parse_header`] (PDO aligned to HPDA; SUCCESS only with LAST_PDU; no data limits: a host
/// checks data against its command). For test clients and round-trip tests.
pub fn parse_c2h_header(buf: &[u8], conn: &ConnParams) -> Result<Progress<Header<CtrlPdu>>, Error> {
    let c = match check_header(buf, conn, false)? {
        Progress::Need(n) => return Ok(Progress::Need(n)),
        Progress::Done(c) => c,
    };
    let pdu = match c.pdu {
        PduType::IcResp => CtrlPdu::IcResp(IcResp {
            pfv: le16(buf, field::ICRESP_PFV),
            cpda: buf[field::ICRESP_CPDA],
            digests: Digests::from_dgst(buf[field::ICRESP_DGST]),
            maxh2cdata: le32(buf, field::ICRESP_MAXH2CDATA),
        }),
        PduType::C2hTermReq => CtrlPdu::C2hTermReq(term_req(buf)),
        PduType::CapsuleResp => {
            let mut cqe = [0u8; 16];
            cqe.copy_from_slice(&buf[field::RSP_CQE..field::RSP_CQE + 16]);
            CtrlPdu::CapsuleResp(CapsuleResp { cqe })
        }
        PduType::C2hData => {
            let datal = le32(buf, field::DATA_DATAL);
            check_datal(c.pdu, datal, &c.layout)?;
            CtrlPdu::C2hData(C2hData {
                cccid: le16(buf, field::DATA_CCCID),
                datao: le32(buf, field::DATA_DATAO),
                datal,
                last: c.flags.contains(Flags::LAST_PDU),
                success: c.flags.contains(Flags::SUCCESS),
            })
        }
        PduType::R2t => CtrlPdu::R2t(R2t {
            cccid: le16(buf, field::R2T_CCCID),
            ttag: le16(buf, field::R2T_TTAG),
            r2to: le32(buf, field::R2T_R2TO),
            r2tl: le32(buf, field::R2T_R2TL),
        }),
        // check_common admits only the types controllers send.
        other => return Err(wrong_direction(other)),
    };
    Ok(Progress::Done(Header {
        pdu,
        layout: c.layout,
    }))
}

/// The fields of a termination request, either way (§3.6.2.4/§3.6.2.5: FES, FEI).
fn term_req(buf: &[u8]) -> TermReq {
    TermReq {
        fes: le16(buf, field::TERM_FES),
        fei: le32(buf, field::TERM_FEI),
    }
}

/// A PDU type the other side sends.
fn wrong_direction(t: PduType) -> Error {
    Error::field(field::TYPE, Reason::WrongDirection(t), COMMON_HEADER_LEN)
}

/// DATAL must be the data PLEN and PDO leave (§3.6.2.8/§3.6.2.9).
fn check_datal(pdu: PduType, datal: u32, layout: &Layout) -> Result<(), Error> {
    if datal != layout.data_len {
        let reason = Reason::Datal {
            pdu,
            datal,
            carried: layout.data_len as u64,
        };
        return Err(Error::field(field::DATA_DATAL, reason, pdu.hlen() as usize));
    }
    Ok(())
}
