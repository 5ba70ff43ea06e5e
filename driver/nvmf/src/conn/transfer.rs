//! Data transfer: an I/O command's data buffer and how its data gets there and back
//! (NVMe/TCP 1.0c §3.3.2 to §3.3.4).
//!
//! A command that moves data gets one buffer of the worker's pool ([`Conn::start`]; without a
//! free one it waits in `waiting`). Host data comes in the capsule (copied in) or after R2Ts:
//! one R2T at a time of at most MAXH2CDATA bytes, each answered by H2CData PDUs that the
//! framing receives straight into the buffer ([`Conn::h2c_header`] checks each against the
//! R2T, [`Conn::h2c_received`] asks for the next range or says the data is all there). Data
//! for the host leaves straight from the buffer in one C2HData ([`Conn::send_data`]).

use std::time::Instant;

use vfpoll_dma::{DmaBuf, DmaPool};

use super::Conn;
use crate::fabrics::{self, Cqe, DataXfer, IoOp, IoRequest};
use crate::pdu::{self, H2cData, PduType, R2t, R2tWindow};

/// An I/O command in flight.
pub(super) struct Cmd {
    /// The decoded command.
    pub req: IoRequest,
    /// The SQHD its completion reports.
    pub sqhd: u16,
    /// Its data buffer, once it has one (with the backend: the backend holds it).
    pub buf: Option<DmaBuf>,
    /// In-capsule data, until the buffer is there.
    pub icd: Vec<u8>,
    /// The R2T whose data is being received.
    pub window: Option<R2tWindow>,
    /// Some of its host data failed its data digest: it completes with a transport error.
    pub digest_failed: bool,
    /// When its capsule arrived, for the latency histogram.
    pub start: Instant,
}

impl Cmd {
    /// A command just decoded from its capsule, `icd` its in-capsule data.
    pub(super) fn new(req: IoRequest, sqhd: u16, icd: Vec<u8>) -> Self {
        Cmd {
            req,
            sqhd,
            buf: None,
            icd,
            window: None,
            digest_failed: false,
            start: Instant::now(),
        }
    }
}

/// Where [`Conn::start`] left a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Started {
    /// Its data is in its buffer (or it moves none, or the host's comes later): the backend's.
    Ready,
    /// Waiting: for a free buffer, or for host data after an R2T.
    Waiting,
    /// Refused and forgotten: answer with this completion and SQHD.
    Refused(Cqe, u16),
}

impl Conn {
    /// Gets command `cid` a buffer if it moves data, then its data: in-capsule data is copied
    /// in, host data is asked for with the first R2T.
    pub(super) fn start(&mut self, pool: &mut DmaPool, cid: u16) -> Started {
        let Some(cmd) = self.cmds.get_mut(&cid) else {
            return Started::Waiting;
        };
        let len = cmd.req.data().len() as usize;
        if len != 0 {
            let Some(mut b) = pool.alloc() else {
                self.waiting.push_back(cid);
                return Started::Waiting;
            };
            if len > b.len() {
                pool.free(b);
                let cqe = cmd.req.failure(fabrics::status::DATA_SGL_LENGTH_INVALID);
                let head = cmd.sqhd;
                self.cmds.remove(&cid);
                return Started::Refused(cqe, head);
            }
            b.truncate(len);
            cmd.buf = Some(b);
        }
        match cmd.req.data() {
            DataXfer::InCapsule { .. } => {
                let b = cmd.buf.as_ref().expect("allocated above");
                if pool.write(b, 0, &cmd.icd).is_err() {
                    log::error!(
                        "in-capsule data of {} bytes does not fit its buffer",
                        cmd.icd.len()
                    );
                }
                cmd.icd = Vec::new();
                Started::Ready
            }
            DataXfer::FromHost { len } => {
                self.send_r2t(cid, 0, len);
                Started::Waiting
            }
            DataXfer::ToHost { .. } | DataXfer::None => Started::Ready,
        }
    }

    /// Asks for the next `rest` bytes from `offset` (one R2T at most MAXH2CDATA long).
    fn send_r2t(&mut self, cid: u16, offset: u32, rest: u32) {
        let r = R2t {
            cccid: cid,
            ttag: cid,
            r2to: offset,
            r2tl: rest.min(self.wire.params.maxh2cdata),
        };
        if let Some(c) = self.cmds.get_mut(&cid) {
            c.window = Some(R2tWindow::new(&r));
        }
        self.wire.r2t(&r);
    }

    /// Checks an H2CData's header against the R2T it answers (the tag is the command's CID):
    /// an H2CData for no command, or for one that was sent no R2T, or outside its range, is a
    /// protocol error.
    pub(super) fn h2c_header(&mut self, d: &H2cData) -> Result<(), pdu::Error> {
        let Some(cmd) = self.cmds.get_mut(&d.cccid) else {
            return Err(pdu::Error::unknown_cccid(PduType::H2cData, d.cccid));
        };
        let Some(window) = cmd.window.as_mut() else {
            return Err(pdu::Error::unexpected(PduType::H2cData));
        };
        if d.ttag != d.cccid {
            return Err(pdu::Error::unknown_ttag(d.ttag));
        }
        pdu::check_h2c_data(d, window)
    }

    /// An H2CData's data is in its command's buffer. When that completes the R2T, asks for
    /// the next range, or returns the command's CID once all its data is there.
    pub(super) fn h2c_received(&mut self, d: &H2cData, digest_ok: bool) -> Option<u16> {
        self.count(|s| s.add_written(d.datal as u64));
        let cmd = self.cmds.get_mut(&d.cccid)?;
        if !digest_ok {
            log::warn!(
                "{}: H2CData of command {}: data digest mismatch",
                self.info.peer,
                d.cccid
            );
            cmd.digest_failed = true;
        }
        let window = cmd.window.expect("checked at the header");
        if !window.is_complete() {
            return None;
        }
        let next = window.r2to + window.r2tl;
        let total = cmd.req.data().len();
        if next < total {
            self.send_r2t(d.cccid, next, total - next);
            return None;
        }
        cmd.window = None;
        Some(d.cccid)
    }

    /// Sends a finished command's data to the host (a successful read, a Reservation
    /// Report) straight from its buffer, or gives the buffer back.
    pub(super) fn send_data(&mut self, pool: &mut DmaPool, cid: u16, cmd: Cmd, success: bool) {
        match (cmd.req.op, cmd.buf) {
            (IoOp::Read { len, .. }, Some(buf)) if success => {
                self.count(|s| s.add_read(len as u64));
                self.wire.c2h_dma(pool, cid, buf);
            }
            (IoOp::Reservation(r), Some(buf)) if success && matches!(r.data, DataXfer::ToHost { .. }) => {
                self.wire.c2h_dma(pool, cid, buf)
            }
            (_, Some(buf)) => pool.free(buf),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests;
