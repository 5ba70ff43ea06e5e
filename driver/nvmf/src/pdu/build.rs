//! Writing PDU headers into the caller's buffer (NVMe/TCP 1.0c §3.6.2): common header, the
//! type's fields, the header digest and the padding up to the data. The data itself (and its
//! digest) the caller sends from its own memory; nothing here allocates.

use super::{
    digest::DataDigest, field, C2hData, ConnParams, Digests, Error, Fes, Flags, H2cData, IcReq, IcResp, Pda,
    PduType, R2t, DIGEST_LEN, TERM_REQ_MAX_QUOTE,
};

/// The longest header a builder writes: a termination request quoting 128 bytes (152). A
/// buffer this long fits every header, with its digest and padding.
pub const MAX_TX_HEADER_LEN: usize = 24 + TERM_REQ_MAX_QUOTE;

/// Why a header could not be built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The caller's buffer is shorter than the header.
    #[error("a {pdu} header needs {need} bytes but the buffer holds {have}; header buffers of MAX_TX_HEADER_LEN ({MAX_TX_HEADER_LEN}) bytes fit any header")]
    BufferTooSmall {
        /// The PDU.
        pdu: PduType,
        /// Bytes the header needs.
        need: usize,
        /// Bytes the buffer has.
        have: usize,
    },
    /// A data PDU or R2T with length 0 (the Linux initiator resets the connection on an R2T
    /// for 0 bytes; a data PDU carries at least one byte).
    #[error("a {0} must move at least one byte; send none when there is nothing to move")]
    NoData(PduType),
    /// SUCCESS without LAST_PDU.
    #[error("C2HData with SUCCESS must also be the last data PDU (LAST_PDU); the Linux initiator resets the connection otherwise")]
    SuccessWithoutLast,
    /// PLEN would not fit its 32 bits.
    #[error("a {pdu} with {len} bytes of data is longer than PLEN can say (4 GiB); split it")]
    TooLong {
        /// The PDU.
        pdu: PduType,
        /// The data length asked for.
        len: u64,
    },
}

/// A data-carrying header written by a builder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxHeader {
    /// Bytes written: header, header digest and padding; the data goes right after them.
    pub len: usize,
    /// With data digests on, an empty digest to feed the data to as it is sent; its
    /// [`DataDigest::to_wire`] follows the data.
    pub data_digest: Option<DataDigest>,
}

fn put16(out: &mut [u8], at: usize, v: u16) {
    out[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

fn put32(out: &mut [u8], at: usize, v: u32) {
    out[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// Checks `out` holds `need` bytes and zeroes them (reserved fields and padding are 0).
fn take(out: &mut [u8], pdu: PduType, need: usize) -> Result<&mut [u8], BuildError> {
    let have = out.len();
    let out = out
        .get_mut(..need)
        .ok_or(BuildError::BufferTooSmall { pdu, need, have })?;
    out.fill(0);
    Ok(out)
}

/// The common header (§3.6.2.1).
fn put_common(out: &mut [u8], pdu: PduType, flags: Flags, pdo: usize, plen: u64) {
    out[field::TYPE] = pdu as u8;
    out[field::FLAGS] = flags.0;
    out[field::HLEN] = pdu.hlen();
    // PDO is at most 128 (a 31-dword alignment), PLEN checked by the callers.
    out[field::PDO] = pdo as u8;
    put32(out, field::PLEN, plen as u32);
}

/// Writes the header digest after HLEN when `on`.
fn seal(out: &mut [u8], pdu: PduType, on: bool) {
    if on {
        let hlen = pdu.hlen() as usize;
        let d = super::header_digest(&out[..hlen]);
        put32(out, hlen, d);
    }
}

/// Layout of a data PDU: (header with digest, PDO, PLEN, data digest on).
fn data_layout(
    pdu: PduType,
    digests: Digests,
    pda: Pda,
    data_len: u32,
) -> Result<(usize, usize, u64, bool), BuildError> {
    let full = pdu.hlen() as usize + digests.header_len(pdu);
    if data_len == 0 {
        return Ok((full, 0, full as u64, false));
    }
    let pdo = pda.data_offset(full);
    let ddgst = digests.data_len(pdu, data_len as u64);
    let plen = pdo as u64 + data_len as u64 + ddgst as u64;
    if plen > u32::MAX as u64 {
        return Err(BuildError::TooLong {
            pdu,
            len: data_len as u64,
        });
    }
    Ok((full, pdo, plen, ddgst != 0))
}

/// Writes a data-carrying header; `fields` fills in the type's fields.
fn data_header(
    out: &mut [u8],
    pdu: PduType,
    digests: Digests,
    pda: Pda,
    data_len: u32,
    flags: Flags,
    fields: impl FnOnce(&mut [u8]),
) -> Result<TxHeader, BuildError> {
    let (full, pdo, plen, ddgst) = data_layout(pdu, digests, pda, data_len)?;
    let len = full.max(pdo);
    let out = take(out, pdu, len)?;
    let flags = flags
        .with_if(Flags::HDGSTF, digests.header)
        .with_if(Flags::DDGSTF, ddgst);
    put_common(out, pdu, flags, pdo, plen);
    fields(out);
    seal(out, pdu, digests.header);
    Ok(TxHeader {
        len,
        data_digest: ddgst.then(DataDigest::new),
    })
}

/// C2HData header (§3.6.2.9) for `d.datal` bytes of read data, padded to the host's HPDA.
/// Send the returned `len` bytes, then the data, then (data digests on) the digest.
/// SUCCESS needs LAST_PDU, and belongs only on connections with SQ flow control disabled.
pub fn c2h_data_header(out: &mut [u8], d: &C2hData, conn: &ConnParams) -> Result<TxHeader, BuildError> {
    let pdu = PduType::C2hData;
    if d.datal == 0 {
        return Err(BuildError::NoData(pdu));
    }
    if d.success && !d.last {
        return Err(BuildError::SuccessWithoutLast);
    }
    let flags = Flags::NONE
        .with_if(Flags::LAST_PDU, d.last)
        .with_if(Flags::SUCCESS, d.success);
    data_header(out, pdu, conn.digests, conn.hpda, d.datal, flags, |o| {
        put16(o, field::DATA_CCCID, d.cccid);
        put32(o, field::DATA_DATAO, d.datao);
        put32(o, field::DATA_DATAL, d.datal);
    })
}

/// R2T (§3.6.2.10): asks the host for `r.r2tl` bytes at `r.r2to` of command `r.cccid`, to come
/// in H2CData PDUs tagged `r.ttag`. Returns the bytes written (24, or 28 with header digests).
pub fn r2t(out: &mut [u8], r: &R2t, digests: Digests) -> Result<usize, BuildError> {
    let pdu = PduType::R2t;
    if r.r2tl == 0 {
        return Err(BuildError::NoData(pdu));
    }
    header_only(out, pdu, digests, |o| {
        put16(o, field::R2T_CCCID, r.cccid);
        put16(o, field::R2T_TTAG, r.ttag);
        put32(o, field::R2T_R2TO, r.r2to);
        put32(o, field::R2T_R2TL, r.r2tl);
    })
}

/// CapsuleResp (§3.6.2.7) carrying `cqe`. Returns the bytes written (24 or 28).
pub fn capsule_resp(out: &mut [u8], cqe: &[u8; 16], digests: Digests) -> Result<usize, BuildError> {
    header_only(out, PduType::CapsuleResp, digests, |o| {
        o[field::RSP_CQE..field::RSP_CQE + 16].copy_from_slice(cqe);
    })
}

/// A header without data: CapsuleResp or R2T.
fn header_only(
    out: &mut [u8],
    pdu: PduType,
    digests: Digests,
    fields: impl FnOnce(&mut [u8]),
) -> Result<usize, BuildError> {
    let len = pdu.hlen() as usize + digests.header_len(pdu);
    let out = take(out, pdu, len)?;
    put_common(
        out,
        pdu,
        Flags::NONE.with_if(Flags::HDGSTF, digests.header),
        0,
        len as u64,
    );
    fields(out);
    seal(out, pdu, digests.header);
    Ok(len)
}

/// ICResp (§3.6.2.3), 128 bytes, no digests (they start after it).
pub fn ic_resp(out: &mut [u8], r: &IcResp) -> Result<usize, BuildError> {
    let pdu = PduType::IcResp;
    let len = pdu.hlen() as usize;
    let out = take(out, pdu, len)?;
    put_common(out, pdu, Flags::NONE, 0, len as u64);
    put16(out, field::ICRESP_PFV, r.pfv);
    out[field::ICRESP_CPDA] = r.cpda;
    out[field::ICRESP_DGST] = r.digests.dgst();
    put32(out, field::ICRESP_MAXH2CDATA, r.maxh2cdata);
    Ok(len)
}

/// A termination request of type `pdu` quoting the first bytes of the offending PDU's
/// header, at most 128 (§3.6.2.4/§3.6.2.5: PLEN 24 to 152; never digests, PDO 0).
fn term_req(out: &mut [u8], pdu: PduType, fes: Fes, fei: u32, offending: &[u8]) -> Result<usize, BuildError> {
    let quote = &offending[..offending.len().min(TERM_REQ_MAX_QUOTE)];
    let hlen = pdu.hlen() as usize;
    let len = hlen + quote.len();
    let out = take(out, pdu, len)?;
    put_common(out, pdu, Flags::NONE, 0, len as u64);
    put16(out, field::TERM_FES, fes as u16);
    put32(out, field::TERM_FEI, fei);
    out[hlen..].copy_from_slice(quote);
    Ok(len)
}

/// C2HTermReq (§3.6.2.5) with `fes`/`fei`, quoting `offending` (the offending PDU from its
/// first byte; only its first 128 bytes are sent). Returns the bytes written, the whole PDU.
pub fn c2h_term_req(out: &mut [u8], fes: Fes, fei: u32, offending: &[u8]) -> Result<usize, BuildError> {
    term_req(out, PduType::C2hTermReq, fes, fei, offending)
}

/// The C2HTermReq that reports `err` about the PDU whose received bytes start `received`.
/// Check [`Error::reply`] first: a malformed H2CTermReq gets no reply.
pub fn c2h_term_req_for(out: &mut [u8], err: &Error, received: &[u8]) -> Result<usize, BuildError> {
    c2h_term_req(out, err.fes(), err.fei(), err.quoted(received))
}

/// H2CTermReq (§3.6.2.4), the host's side of [`c2h_term_req`].
pub fn h2c_term_req(out: &mut [u8], fes: Fes, fei: u32, offending: &[u8]) -> Result<usize, BuildError> {
    term_req(out, PduType::H2cTermReq, fes, fei, offending)
}

/// ICReq (§3.6.2.2), 128 bytes: the host's first PDU.
pub fn ic_req(out: &mut [u8], r: &IcReq) -> Result<usize, BuildError> {
    let pdu = PduType::IcReq;
    let len = pdu.hlen() as usize;
    let out = take(out, pdu, len)?;
    put_common(out, pdu, Flags::NONE, 0, len as u64);
    put16(out, field::ICREQ_PFV, r.pfv);
    out[field::ICREQ_HPDA] = r.hpda;
    out[field::ICREQ_DGST] = r.digests.dgst();
    put32(out, field::ICREQ_MAXR2T, r.maxr2t);
    Ok(len)
}

/// CapsuleCmd header (§3.6.2.6) for `sqe` with `icd_len` bytes of in-capsule data (0: none;
/// PDO is then 0, as Linux sends it), padded to CPDA. The host's side.
pub fn capsule_cmd_header(
    out: &mut [u8],
    sqe: &[u8; 64],
    icd_len: u32,
    conn: &ConnParams,
) -> Result<TxHeader, BuildError> {
    data_header(
        out,
        PduType::CapsuleCmd,
        conn.digests,
        conn.cpda,
        icd_len,
        Flags::NONE,
        |o| {
            o[field::CMD_SQE..field::CMD_SQE + 64].copy_from_slice(sqe);
        },
    )
}

/// H2CData header (§3.6.2.8) for `d.datal` bytes, padded to CPDA. The host's side.
pub fn h2c_data_header(out: &mut [u8], d: &H2cData, conn: &ConnParams) -> Result<TxHeader, BuildError> {
    let pdu = PduType::H2cData;
    if d.datal == 0 {
        return Err(BuildError::NoData(pdu));
    }
    data_header(
        out,
        pdu,
        conn.digests,
        conn.cpda,
        d.datal,
        Flags::NONE.with_if(Flags::LAST_PDU, d.last),
        |o| {
            put16(o, field::DATA_CCCID, d.cccid);
            put16(o, field::DATA_TTAG, d.ttag);
            put32(o, field::DATA_DATAO, d.datao);
            put32(o, field::DATA_DATAL, d.datal);
        },
    )
}

// A termination request with a full quote is the longest header; the others fit.
const _: () = assert!(MAX_TX_HEADER_LEN >= 128 + DIGEST_LEN && MAX_TX_HEADER_LEN == 152);
