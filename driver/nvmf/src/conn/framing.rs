//! Framing: one connection's PDUs in and out over its socket (NVMe/TCP 1.0c §3.6), and
//! nothing about what the commands in them mean.
//!
//! Receiving ([`Framing::step`], one read at a time): the common header, the rest of the
//! header (with its header digest, checked by [`parse_header`]), then what follows it. The
//! ICReq is answered here (the ICResp is queued and the negotiated [`ConnParams`] kept); a
//! command capsule comes back whole ([`Capsule`], its in-capsule data digest checked); an
//! H2CData's header comes back first ([`Step::H2cHeader`]) so that the caller can check it
//! against its R2T and name the buffer its data goes to, then its data lands in that buffer
//! and the data digest is checked over it ([`Received::H2cData`]).
//!
//! Sending: the PDUs the connection answers with (ICResp, CapsuleResp, R2T, C2HData from a
//! Vec or straight from a DMA buffer, C2HTermReq) are queued as [`Tx`] and
//! [`Framing::flush`] sends as many as the socket takes in one gathered `sendmsg`.

use std::collections::VecDeque;
use std::io;
use std::net::TcpStream;
use std::ops::Range;
use std::os::fd::{AsRawFd, RawFd};

use vfpoll_dma::{DmaBuf, DmaPool};

use crate::fabrics::{cqe_to_bytes, Cqe};
use crate::pdu::{
    self, c2h_data_header, c2h_term_req_for, capsule_resp, ic_resp, parse_header, r2t, C2hData, CapsuleCmd,
    ConnParams, H2cData, Header, HostPdu, Layout, PduType, Progress, R2t, TargetLimits, TermReq,
    COMMON_HEADER_LEN, DIGEST_LEN, MAX_HEADER_LEN, MAX_TX_HEADER_LEN,
};
use crate::sys::{self, Piece, MAX_PIECES};

mod stage;

use stage::{ReadResult, RxStage};

/// Bytes offered to one `sendmsg` at most.
const SEND_BATCH: usize = 256 << 10;

/// Where the receive side is.
enum Rx {
    /// Reading a PDU header into `hdr`.
    Header,
    /// Reading what follows a capsule or termination request's header into `body`.
    Body {
        header: Header<HostPdu>,
        body: Vec<u8>,
        pos: usize,
    },
    /// Reading an H2CData's padding, data (into the command's buffer) and digest.
    H2c {
        pdu: H2cData,
        layout: Layout,
        pos: u32,
        small: [u8; 128 + DIGEST_LEN],
    },
}

/// What one [`Framing::step`] gave.
pub(super) enum Step {
    /// Nothing to read now.
    Idle,
    /// The peer closed the connection (or it failed).
    Closed,
    /// Bytes were read; no PDU is complete yet.
    Partial,
    /// The header of an H2CData: the caller checks it against its R2T; the next steps read
    /// its data into the buffer the caller passes.
    H2cHeader(H2cData),
    /// A whole PDU.
    Pdu(Received),
}

/// A whole PDU the host sent.
pub(super) enum Received {
    /// An ICReq, answered already (the ICResp is queued).
    IcReq,
    /// A command capsule.
    Capsule(Capsule),
    /// The data of an H2CData is in the command's buffer.
    H2cData {
        /// Its header.
        pdu: H2cData,
        /// False when data digests are on and the data does not match its digest.
        digest_ok: bool,
    },
    /// The host ends the connection.
    TermReq(TermReq),
}

/// A command capsule and its in-capsule data.
pub(super) struct Capsule {
    /// The command.
    pub cmd: CapsuleCmd,
    /// What followed the header: padding, data, data digest.
    body: Vec<u8>,
    /// Where the data lies in `body`.
    data: Range<usize>,
    /// False when data digests are on and the data does not match its digest.
    pub digest_ok: bool,
}

impl Capsule {
    /// The in-capsule data.
    pub(super) fn data(&self) -> &[u8] {
        &self.body[self.data.clone()]
    }
}

/// Something to send: a header (and data from a Vec), data from a DMA buffer, a digest.
struct Tx {
    head: Vec<u8>,
    data: Option<DmaBuf>,
    tail: [u8; DIGEST_LEN],
    tail_len: usize,
    sent: usize,
    close_after: bool,
}

impl Tx {
    fn bytes(head: Vec<u8>) -> Self {
        Tx {
            head,
            data: None,
            tail: [0; DIGEST_LEN],
            tail_len: 0,
            sent: 0,
            close_after: false,
        }
    }

    fn total(&self) -> usize {
        self.head.len() + self.data.as_ref().map_or(0, |b| b.len()) + self.tail_len
    }
}

/// What a [`Framing::flush`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Flushed {
    /// Bytes went out.
    pub progress: bool,
    /// The connection is over: a termination request went out, or the socket failed.
    pub close: bool,
}

/// One connection's socket, as PDUs.
pub(super) struct Framing {
    stream: TcpStream,
    /// What the ICReq negotiated (and a Connect's in-capsule data limit).
    pub params: ConnParams,
    /// What the target offers in the ICResp.
    limits: TargetLimits,
    hdr: [u8; MAX_HEADER_LEN],
    hdr_have: usize,
    hdr_need: usize,
    /// Length of the last complete header in `hdr`, quoted by a termination request for an
    /// error found after it.
    last_hdr: usize,
    rx: Rx,
    /// Received bytes not yet parsed.
    stage: RxStage,
    tx: VecDeque<Tx>,
    /// A termination request is queued: read nothing more, close once it is sent.
    closing: bool,
}

impl Framing {
    /// PDUs over `stream` (already non-blocking), before the ICReq.
    pub(super) fn new(stream: TcpStream, limits: &TargetLimits) -> Self {
        Framing {
            stream,
            params: ConnParams::new(limits),
            limits: *limits,
            hdr: [0; MAX_HEADER_LEN],
            hdr_have: 0,
            hdr_need: COMMON_HEADER_LEN,
            last_hdr: 0,
            rx: Rx::Header,
            stage: RxStage::new(),
            tx: VecDeque::new(),
            closing: false,
        }
    }

    /// The socket's descriptor.
    pub(super) fn fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    /// Whether answers wait for room in the socket, or received bytes wait to be parsed.
    pub(super) fn busy(&self) -> bool {
        !self.tx.is_empty() || self.staged()
    }

    /// Whether received bytes wait to be parsed.
    pub(super) fn staged(&self) -> bool {
        !self.stage.available().is_empty()
    }

    /// Whether a termination request is queued (nothing more is read).
    pub(super) fn closing(&self) -> bool {
        self.closing
    }

    /// Bytes queued for sending.
    pub(super) fn queued_bytes(&self) -> usize {
        self.tx.iter().map(|t| t.total() - t.sent).sum()
    }

    /// The CID of the H2CData whose data is being received, if one is.
    pub(super) fn h2c_cccid(&self) -> Option<u16> {
        match &self.rx {
            Rx::H2c { pdu, .. } => Some(pdu.cccid),
            _ => None,
        }
    }

    /// Shuts the socket down and gives back the buffers of what was not sent.
    pub(super) fn shutdown(&mut self, pool: &mut DmaPool) {
        drop(self.stream.shutdown(std::net::Shutdown::Both));
        for t in self.tx.drain(..) {
            if let Some(b) = t.data {
                pool.free(b);
            }
        }
    }

    /// One read and what it completes. `dest`: the buffer of the command whose H2CData is
    /// being received ([`Framing::h2c_cccid`]); its data lands there at `DATAO`.
    pub(super) fn step(&mut self, pool: &mut DmaPool, dest: Option<&mut DmaBuf>) -> Result<Step, pdu::Error> {
        match &mut self.rx {
            Rx::Header => {
                let dst = &mut self.hdr[self.hdr_have..self.hdr_need];
                match self.stage.read(&mut self.stream, dst) {
                    ReadResult::Data(n) => self.hdr_have += n,
                    ReadResult::Again => return Ok(Step::Idle),
                    ReadResult::Closed => return Ok(Step::Closed),
                }
                if self.hdr_have < self.hdr_need {
                    return Ok(Step::Partial);
                }
                match parse_header(&self.hdr[..self.hdr_have], &self.params)? {
                    Progress::Need(n) => {
                        self.hdr_need = n.min(MAX_HEADER_LEN);
                        Ok(Step::Partial)
                    }
                    Progress::Done(h) => self.header_done(h),
                }
            }
            Rx::Body { body, pos, .. } => {
                match self.stage.read(&mut self.stream, &mut body[*pos..]) {
                    ReadResult::Data(n) => *pos += n,
                    ReadResult::Again => return Ok(Step::Idle),
                    ReadResult::Closed => return Ok(Step::Closed),
                }
                if *pos < body.len() {
                    return Ok(Step::Partial);
                }
                let Rx::Body { header, body, .. } = std::mem::replace(&mut self.rx, Rx::Header) else {
                    unreachable!("matched above")
                };
                self.body_done(header, body).map(Step::Pdu)
            }
            Rx::H2c { .. } => self.receive_h2c(pool, dest),
        }
    }

    fn reset_header(&mut self) {
        if self.hdr_have != 0 {
            self.last_hdr = self.hdr_have;
        }
        self.hdr_have = 0;
        self.hdr_need = COMMON_HEADER_LEN;
        self.rx = Rx::Header;
    }

    /// A complete, valid header.
    fn header_done(&mut self, h: Header<HostPdu>) -> Result<Step, pdu::Error> {
        match h.pdu {
            HostPdu::IcReq(req) => {
                let (resp, params) = pdu::negotiate(&req, &self.limits)?;
                self.params = params;
                let mut out = vec![0u8; MAX_TX_HEADER_LEN];
                let n = ic_resp(&mut out, &resp).map_err(|_| pdu::Error::unexpected(PduType::IcReq))?;
                out.truncate(n);
                self.tx.push_back(Tx::bytes(out));
                // An ICReq carries nothing after its header; anything else is refused by the
                // parser.
                if h.layout.after_header() != 0 {
                    return Err(pdu::Error::unexpected(PduType::IcReq));
                }
                self.reset_header();
                Ok(Step::Pdu(Received::IcReq))
            }
            HostPdu::H2cData(d) => {
                self.rx = Rx::H2c {
                    pdu: d,
                    layout: h.layout,
                    pos: 0,
                    small: [0; 128 + DIGEST_LEN],
                };
                Ok(Step::H2cHeader(d))
            }
            HostPdu::CapsuleCmd(_) | HostPdu::H2cTermReq(_) => {
                let rest = h.layout.after_header() as usize;
                if rest == 0 {
                    return self.body_done(h, Vec::new()).map(Step::Pdu);
                }
                self.rx = Rx::Body {
                    header: h,
                    body: vec![0; rest],
                    pos: 0,
                };
                Ok(Step::Partial)
            }
        }
    }

    /// What follows a capsule or termination request's header has arrived.
    fn body_done(&mut self, h: Header<HostPdu>, body: Vec<u8>) -> Result<Received, pdu::Error> {
        self.reset_header();
        match h.pdu {
            HostPdu::H2cTermReq(t) => Ok(Received::TermReq(t)),
            HostPdu::CapsuleCmd(cmd) => {
                let (pad, len) = (h.layout.pad as usize, h.layout.data_len as usize);
                let data = pad.min(body.len())..(pad + len).min(body.len());
                let digest_ok = !h.layout.data_digest || {
                    let d = &body[pad + len..pad + len + DIGEST_LEN];
                    crc32c::crc32c(&body[data.clone()]) == u32::from_le_bytes([d[0], d[1], d[2], d[3]])
                };
                Ok(Received::Capsule(Capsule {
                    cmd,
                    body,
                    data,
                    digest_ok,
                }))
            }
            HostPdu::IcReq(_) | HostPdu::H2cData(_) => Err(pdu::Error::unexpected(h.pdu.pdu_type())),
        }
    }

    /// Padding, data (into `dest`) and digest of an H2CData.
    fn receive_h2c(&mut self, pool: &mut DmaPool, mut dest: Option<&mut DmaBuf>) -> Result<Step, pdu::Error> {
        let Rx::H2c {
            pdu: d,
            layout,
            pos,
            small,
        } = &mut self.rx
        else {
            unreachable!("called for H2CData only")
        };
        let (pad, len, dg) = (layout.pad, layout.data_len, layout.digest_len());
        let r = if *pos < pad {
            self.stage
                .read(&mut self.stream, &mut small[*pos as usize..pad as usize])
        } else if *pos < pad + len {
            let Some(buf) = dest.as_deref_mut() else {
                return Err(pdu::Error::unknown_cccid(PduType::H2cData, d.cccid));
            };
            let at = (d.datao + (*pos - pad)) as usize;
            let want = (pad + len - *pos) as usize;
            let staged = self.stage.available();
            if !staged.is_empty() {
                // Data that came with earlier PDUs in one receive: copied on.
                let n = staged.len().min(want);
                if pool.write(buf, at, &staged[..n]).is_err() {
                    return Err(pdu::Error::unexpected(PduType::H2cData));
                }
                self.stage.consume(n);
                ReadResult::Data(n)
            } else {
                match sys::recv_into(self.stream.as_raw_fd(), buf, at, want) {
                    Ok(0) => ReadResult::Closed,
                    Ok(n) => ReadResult::Data(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => ReadResult::Again,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => ReadResult::Data(0),
                    Err(_) => ReadResult::Closed,
                }
            }
        } else {
            let o = (*pos - pad - len) as usize;
            self.stage.read(&mut self.stream, &mut small[o..dg as usize])
        };
        match r {
            ReadResult::Data(n) => *pos += n as u32,
            ReadResult::Again => return Ok(Step::Idle),
            ReadResult::Closed => return Ok(Step::Closed),
        }
        if *pos < pad + len + dg {
            return Ok(Step::Partial);
        }
        let (d, dg, digest) = (*d, layout.data_digest, [small[0], small[1], small[2], small[3]]);
        self.reset_header();
        let digest_ok = match dest {
            Some(buf) if dg => {
                let crc = sys::crc32c_of(0, buf, d.datao as usize, d.datal as usize).unwrap_or(!0);
                crc == u32::from_le_bytes(digest)
            }
            _ => true,
        };
        Ok(Step::Pdu(Received::H2cData { pdu: d, digest_ok }))
    }

    /// Queues a CapsuleResp with `cqe`.
    pub(super) fn capsule_resp(&mut self, cqe: &Cqe) {
        let mut out = vec![0u8; MAX_TX_HEADER_LEN];
        match capsule_resp(&mut out, &cqe_to_bytes(cqe), self.params.digests) {
            Ok(n) => {
                out.truncate(n);
                self.tx.push_back(Tx::bytes(out));
            }
            Err(e) => log::error!("CapsuleResp not built: {e}"),
        }
    }

    /// Queues an R2T.
    pub(super) fn r2t(&mut self, r: &R2t) {
        let mut out = vec![0u8; MAX_TX_HEADER_LEN];
        match r2t(&mut out, r, self.params.digests) {
            Ok(n) => {
                out.truncate(n);
                self.tx.push_back(Tx::bytes(out));
            }
            Err(e) => log::error!("R2T not built: {e}"),
        }
    }

    /// A C2HData header for all `len` bytes of command `cid`'s data, and the digest to feed
    /// them to when data digests are on.
    fn c2h_header(&self, cid: u16, len: usize) -> Option<(Vec<u8>, Option<pdu::DataDigest>)> {
        let d = C2hData {
            cccid: cid,
            datao: 0,
            datal: len as u32,
            last: true,
            success: false,
        };
        let mut out = vec![0u8; MAX_TX_HEADER_LEN];
        match c2h_data_header(&mut out, &d, &self.params) {
            Ok(h) => {
                out.truncate(h.len);
                Some((out, h.data_digest))
            }
            Err(e) => {
                log::error!("C2HData not built: {e}");
                None
            }
        }
    }

    /// Queues a C2HData with data from a Vec (admin commands).
    pub(super) fn c2h_bytes(&mut self, cid: u16, data: &[u8]) {
        let Some((mut head, digest)) = self.c2h_header(cid, data.len()) else {
            return;
        };
        head.extend_from_slice(data);
        if let Some(mut d) = digest {
            d.update(data);
            head.extend_from_slice(&d.to_wire());
        }
        self.tx.push_back(Tx::bytes(head));
    }

    /// Queues a C2HData whose data leaves straight from `buf` (given back to `pool` once
    /// sent).
    pub(super) fn c2h_dma(&mut self, pool: &mut DmaPool, cid: u16, buf: DmaBuf) {
        let Some((head, digest)) = self.c2h_header(cid, buf.len()) else {
            return pool.free(buf);
        };
        let mut t = Tx::bytes(head);
        if digest.is_some() {
            let crc = sys::crc32c_of(0, &buf, 0, buf.len()).unwrap_or(0);
            t.tail = crc.to_le_bytes();
            t.tail_len = DIGEST_LEN;
        }
        t.data = Some(buf);
        self.tx.push_back(t);
    }

    /// Queues the C2HTermReq that answers protocol error `e`, quoting the header it was
    /// found in, after which the connection closes (§3.6.2.5). False when the connection
    /// must close without one (the error says not to reply, §3.6.2.4).
    pub(super) fn term_req(&mut self, e: &pdu::Error) -> bool {
        if !e.reply() {
            return false;
        }
        let mut out = vec![0u8; 256];
        let quoted = if self.hdr_have != 0 {
            self.hdr_have
        } else {
            self.last_hdr
        };
        match c2h_term_req_for(&mut out, e, &self.hdr[..quoted]) {
            Ok(n) => {
                out.truncate(n);
                let mut t = Tx::bytes(out);
                t.close_after = true;
                self.tx.push_back(t);
                self.closing = true;
                true
            }
            Err(_) => false,
        }
    }

    /// Sends what is queued, as far as the socket takes it, gathering many PDUs into one
    /// `sendmsg` (a deep queue's answers go out together); sent DMA buffers go back to
    /// `pool`. `peer` names the host in logs.
    pub(super) fn flush(&mut self, pool: &mut DmaPool, peer: &str) -> Flushed {
        let mut progress = false;
        let closed = Flushed {
            progress: true,
            close: true,
        };
        while !self.tx.is_empty() {
            let (offered, sent) = {
                let mut pieces = [Piece::Bytes(&[]); MAX_PIECES];
                let (mut n, mut offered) = (0, 0);
                for t in &self.tx {
                    if n + 3 > MAX_PIECES || offered >= SEND_BATCH {
                        break;
                    }
                    let (hl, dl) = (t.head.len(), t.data.as_ref().map_or(0, |b| b.len()));
                    let s = t.sent;
                    pieces[n] = Piece::Bytes(&t.head[s.min(hl)..]);
                    if let Some(b) = &t.data {
                        let off = s.saturating_sub(hl).min(dl);
                        pieces[n + 1] = Piece::Dma(b, off, dl - off);
                    } else {
                        pieces[n + 1] = Piece::Bytes(&[]);
                    }
                    pieces[n + 2] =
                        Piece::Bytes(&t.tail[s.saturating_sub(hl + dl).min(t.tail_len)..t.tail_len]);
                    n += 3;
                    offered += t.total() - s;
                    if t.close_after {
                        break;
                    }
                }
                match sys::send_many(self.stream.as_raw_fd(), &pieces[..n]) {
                    Ok(sent) => (offered, sent),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        return Flushed {
                            progress,
                            close: false,
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        log::debug!("{peer}: send: {e}");
                        return closed;
                    }
                }
            };
            progress |= sent > 0;
            let mut left = sent;
            while left > 0 {
                let t = self.tx.front_mut().expect("sent bytes belong to queued PDUs");
                let rest = t.total() - t.sent;
                if left < rest {
                    t.sent += left;
                    break;
                }
                left -= rest;
                let t = self.tx.pop_front().expect("front exists");
                if let Some(b) = t.data {
                    pool.free(b);
                }
                if t.close_after {
                    return closed;
                }
            }
            if sent < offered {
                // The socket is full: the rest goes in a later round.
                break;
            }
        }
        Flushed {
            progress,
            close: false,
        }
    }
}

#[cfg(test)]
mod tests;
