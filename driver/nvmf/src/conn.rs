//! One NVMe/TCP connection's state machine (NVMe/TCP Transport 1.0c §3.3, §3.6): the
//! ICReq/ICResp exchange, the Connect that binds it to a queue, then command capsules, R2T and
//! H2CData for host data, C2HData and CapsuleResp for the answers.
//!
//! A connection is driven by its worker ([`crate::server`]): [`Conn::receive`] reads what the
//! socket has without blocking and starts the commands it completes, [`Conn::complete`] takes a
//! backend's completion, [`Conn::flush`] sends what is queued, every queued PDU in one gathered
//! `sendmsg`. Headers and capsules are received in batches through a small staging buffer
//! (`stage`); write data lands straight in the command's DMA buffer (`sys::recv_into`), except
//! the part of it (a few KiB at most) that arrived in one receive with the PDUs before it,
//! which is copied on; read data leaves straight from its DMA buffer (`sys::send_many`).
//! In-capsule data, at most a few KiB, is copied.
//!
//! Memory is bounded per connection: at most the queue's entries commands in flight (more are
//! refused with a completion, not buffered), one capsule of in-capsule data being received,
//! and reading stops while the answers queued for sending pass a limit.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use vfpoll_dma::{DmaBuf, DmaPool};
use vfpoll_nvme::status::{Sct, Status};

use crate::backend::{Backend, Op};
use crate::fabrics::{
    self, cqe_to_bytes, sqe_from_bytes, AdminEffect, AdminOutcome, ConnInfo, Cqe, DataXfer, IoOp, IoQueue,
    IoRequest, QueueRef, SqHead, SubsystemId, Target, CONNECT_DATA_BYTES,
};
use crate::pdu::{
    self, c2h_data_header, c2h_term_req_for, capsule_resp, ic_resp, parse_header, r2t, C2hData, CapsuleCmd,
    ConnParams, H2cData, Header, HostPdu, Layout, Progress, R2t, R2tWindow, TargetLimits, COMMON_HEADER_LEN,
    DIGEST_LEN, MAX_HEADER_LEN, MAX_TX_HEADER_LEN,
};
use crate::server::{ConnCounters, IoCounters, IoKind, Stats, WorkerMetrics};
use crate::sys::{self, Piece, MAX_PIECES};

mod auth;
mod resv;
mod stage;

use stage::{ReadResult, RxStage};

/// Transient Transport Error (NVMe Base 2.0 Figure 94, 22h): the status of a command whose data
/// failed its data digest (NVMe/TCP 1.0c §3.3.1.1: data digest errors complete the command,
/// the connection stays up). Not DNR: the host may retry.
const TRANSIENT_TRANSPORT_ERROR: Status = Status::new(Sct::Generic, 0x22, false);
/// Command Interrupted (NVMe Base 2.0 Figure 94, 21h): a command past the queue's entries,
/// refused without being buffered; not DNR, the host may retry.
const COMMAND_INTERRUPTED: Status = Status::new(Sct::Generic, 0x21, false);
/// PDUs read per [`Conn::receive`] call at most, so one busy connection cannot starve others.
const RX_BUDGET: usize = 64;

/// What the worker shares with its connections while driving one of them.
pub(crate) struct Ctx<'a> {
    /// The controllers, shared by the workers (locked for Connect and admin commands only).
    pub target: &'a Mutex<Target>,
    /// Data buffers (one per command that moves data).
    pub pool: &'a mut DmaPool,
    /// The namespaces' backends.
    pub backends: &'a mut [Box<dyn Backend>],
    /// Backend index by subsystem and NSID.
    pub ns: &'a HashMap<(SubsystemId, u32), usize>,
    /// Submissions a busy backend refused, retried by the worker.
    pub retry: &'a mut VecDeque<Submission>,
    /// The counters of a subsystem, taken by a connection at its Connect.
    pub subsystem_stats: &'a dyn Fn(SubsystemId) -> Arc<Stats>,
    /// The worker's counters per subsystem, namespace and host.
    pub metrics: &'a WorkerMetrics,
    /// What the target offers in the ICResp.
    pub limits: &'a TargetLimits,
    /// Queues whose connections the worker closes (a controller reset ends its I/O queues).
    pub close: &'a mut Vec<QueueRef>,
}

/// The shared target; a worker that panicked holding it left it as consistent as one admin
/// command does, so the others go on.
fn lock(target: &Mutex<Target>) -> std::sync::MutexGuard<'_, Target> {
    target.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A backend submission, kept to retry while the backend is busy.
pub(crate) struct Submission {
    /// Backend index.
    pub backend: usize,
    /// The operation.
    pub op: Op,
    /// Starting LBA.
    pub slba: u64,
    /// Blocks.
    pub nlb: u32,
    /// The data buffer.
    pub buf: Option<DmaBuf>,
    /// [`tag`] of the connection and command.
    pub tag: u64,
}

/// The backend tag of command `cid` of connection `conn`.
pub(crate) fn tag(conn: u64, cid: u16) -> u64 {
    (conn << 16) | cid as u64
}

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

/// The queue a Connect bound the connection to.
struct Queue {
    queue: QueueRef,
    sqhd: SqHead,
    /// The SQHD of the last completion, for completions of held requests.
    last_head: u16,
    entries: u32,
    io: Option<IoQueue>,
}

/// Where an I/O command is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Waiting for a free data buffer.
    NeedBuffer,
    /// Receiving host data after an R2T.
    Receiving,
    /// With the backend.
    Backend,
}

/// An I/O command in flight.
struct Cmd {
    req: IoRequest,
    sqhd: u16,
    stage: Stage,
    buf: Option<DmaBuf>,
    /// In-capsule data, until the buffer is there.
    icd: Vec<u8>,
    window: Option<R2tWindow>,
    digest_failed: bool,
    /// When its capsule arrived, for the latency histogram.
    start: Instant,
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

/// One connection.
pub(crate) struct Conn {
    id: u64,
    stream: TcpStream,
    info: ConnInfo,
    params: ConnParams,
    hdr: [u8; MAX_HEADER_LEN],
    hdr_have: usize,
    hdr_need: usize,
    /// Length of the last complete header in `hdr`, quoted by a termination request for an
    /// error found after it.
    last_hdr: usize,
    rx: Rx,
    /// Received bytes not yet parsed.
    stage: RxStage,
    queue: Option<Queue>,
    cmds: HashMap<u16, Cmd>,
    waiting: VecDeque<u16>,
    /// Commands waiting for a rate limit's credit, oldest first.
    throttled: VecDeque<u16>,
    tx: VecDeque<Tx>,
    /// A termination request is queued: read nothing more, close once it is sent.
    closing: bool,
    closed: bool,
    /// The target's counters.
    stats: Arc<Stats>,
    /// The counters of the subsystem the Connect named.
    sub: Option<Arc<Stats>>,
    /// The host's connection counters on that subsystem.
    conn_counters: Option<Arc<ConnCounters>>,
    /// The host's I/O counters per NSID, found in the worker's registry at first use.
    io_counters: Vec<(u32, Arc<IoCounters>)>,
    /// The host as metrics name it.
    host: String,
}

impl Conn {
    /// A new connection (already non-blocking) with ID `id`.
    pub(crate) fn new(
        id: u64,
        stream: TcpStream,
        info: ConnInfo,
        limits: &TargetLimits,
        stats: Arc<Stats>,
    ) -> Self {
        Conn {
            id,
            stream,
            info,
            params: ConnParams::new(limits),
            hdr: [0; MAX_HEADER_LEN],
            hdr_have: 0,
            hdr_need: COMMON_HEADER_LEN,
            last_hdr: 0,
            rx: Rx::Header,
            stage: RxStage::new(),
            queue: None,
            cmds: HashMap::new(),
            waiting: VecDeque::new(),
            throttled: VecDeque::new(),
            tx: VecDeque::new(),
            closing: false,
            closed: false,
            stats,
            sub: None,
            conn_counters: None,
            io_counters: Vec::new(),
            host: String::new(),
        }
    }

    /// The socket's descriptor.
    pub(crate) fn fd(&self) -> std::os::fd::RawFd {
        self.stream.as_raw_fd()
    }

    /// Whether answers wait for room in the socket, or received bytes wait to be parsed.
    pub(crate) fn busy(&self) -> bool {
        !self.tx.is_empty() || !self.stage.available().is_empty() || !self.waiting.is_empty()
    }

    /// Whether commands wait for a rate limit's credit (the worker must look again soon, but
    /// need not spin: credit comes with time, not with an event).
    pub(crate) fn throttled(&self) -> bool {
        !self.throttled.is_empty()
    }

    /// The port ID of the listener the connection came through.
    pub(crate) fn portid(&self) -> u16 {
        self.info.portid
    }

    /// Counts in the target's counters and the subsystem's.
    fn count(&self, f: impl Fn(&Stats)) {
        f(&self.stats);
        if let Some(s) = &self.sub {
            f(s);
        }
    }

    /// The connection is gone: it leaves its subsystem's count of connections.
    pub(crate) fn forget_subsystem(&mut self) {
        if let Some(s) = self.sub.take() {
            s.disconnected();
        }
        if let Some(c) = self.conn_counters.take() {
            c.closed();
        }
    }

    /// Sends the completion of a held Asynchronous Event Request (an admin connection).
    pub(crate) fn complete_held(&mut self, cqe: Cqe) {
        if self.closed || self.closing {
            return;
        }
        let Some(q) = self.queue.as_ref().filter(|q| q.queue.qid == 0) else {
            return;
        };
        let head = q.last_head;
        self.respond(cqe, head, 0);
    }

    /// The queue this connection serves, once connected.
    pub(crate) fn queue(&self) -> Option<QueueRef> {
        self.queue.as_ref().map(|q| q.queue)
    }

    /// True once the connection is over: the worker drops it.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed
    }

    /// Ends the connection now (its controller is gone, or the worker stops).
    pub(crate) fn close(&mut self, pool: &mut DmaPool) {
        self.closed = true;
        drop(self.stream.shutdown(std::net::Shutdown::Both));
        // Buffers a backend holds come back through its completions, which find no command.
        for (_, c) in self.cmds.drain() {
            if let Some(b) = c.buf {
                pool.free(b);
            }
        }
        for t in self.tx.drain(..) {
            if let Some(b) = t.data {
                pool.free(b);
            }
        }
        self.waiting.clear();
        self.throttled.clear();
    }

    fn queued_bytes(&self) -> usize {
        self.tx.iter().map(|t| t.total() - t.sent).sum()
    }

    /// Reads and handles what the socket has when it may have data (`readable`: epoll says so,
    /// or the caller does not know) or bytes are staged; otherwise it only starts commands that
    /// were waiting for a buffer, without a system call. Returns whether anything happened.
    pub(crate) fn receive(&mut self, cx: &mut Ctx<'_>, readable: bool) -> bool {
        if !readable && self.stage.available().is_empty() {
            return self.start_waiting(cx) | self.start_throttled(cx);
        }
        let mut progress = self.start_waiting(cx) | self.start_throttled(cx);
        let mut pdus = 0;
        // Bounded memory: stop reading while the host does not take what is queued for it.
        let limit = 4 << 20;
        while !self.closed && !self.closing && pdus < RX_BUDGET && self.queued_bytes() < limit {
            match self.receive_step(cx) {
                Ok(Some(done)) => {
                    progress = true;
                    if done {
                        pdus += 1;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    progress = true;
                    self.protocol_error(&e);
                }
            }
        }
        progress
    }

    /// One read. `Ok(None)`: nothing to read now; `Ok(Some(true))`: a PDU was completed.
    fn receive_step(&mut self, cx: &mut Ctx<'_>) -> Result<Option<bool>, pdu::Error> {
        match &mut self.rx {
            Rx::Header => {
                let (have, need) = (self.hdr_have, self.hdr_need);
                let Some(n) = self.read_plain(have, need) else {
                    return Ok(None);
                };
                self.hdr_have += n;
                if self.hdr_have < self.hdr_need {
                    return Ok(Some(false));
                }
                match parse_header(&self.hdr[..self.hdr_have], &self.params)? {
                    Progress::Need(n) => {
                        self.hdr_need = n.min(MAX_HEADER_LEN);
                        Ok(Some(false))
                    }
                    Progress::Done(h) => self.header_done(cx, h).map(Some),
                }
            }
            Rx::Body { body, pos, .. } => {
                match self.stage.read(&mut self.stream, &mut body[*pos..]) {
                    ReadResult::Data(n) => *pos += n,
                    ReadResult::Again => return Ok(None),
                    ReadResult::Closed => {
                        self.closed = true;
                        return Ok(None);
                    }
                }
                if *pos < body.len() {
                    return Ok(Some(false));
                }
                let Rx::Body { header, body, .. } = std::mem::replace(&mut self.rx, Rx::Header) else {
                    unreachable!("matched above")
                };
                self.body_done(cx, header, body)?;
                Ok(Some(true))
            }
            Rx::H2c { .. } => self.receive_h2c(cx),
        }
    }

    /// Reads into `hdr[have..need]`; `None` when nothing could be read (or the peer closed).
    fn read_plain(&mut self, have: usize, need: usize) -> Option<usize> {
        match self.stage.read(&mut self.stream, &mut self.hdr[have..need]) {
            ReadResult::Data(n) => Some(n),
            ReadResult::Again => None,
            ReadResult::Closed => {
                self.closed = true;
                None
            }
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
    fn header_done(&mut self, cx: &mut Ctx<'_>, h: Header<HostPdu>) -> Result<bool, pdu::Error> {
        match h.pdu {
            HostPdu::IcReq(req) => {
                let (resp, params) = pdu::negotiate(&req, cx.limits)?;
                self.params = params;
                let mut out = vec![0u8; MAX_TX_HEADER_LEN];
                let n = ic_resp(&mut out, &resp).map_err(|_| pdu::Error::unexpected(pdu::PduType::IcReq))?;
                out.truncate(n);
                self.tx.push_back(Tx::bytes(out));
                self.skip_rest(h.layout)
            }
            HostPdu::H2cData(d) => {
                let Some(cmd) = self.cmds.get_mut(&d.cccid) else {
                    return Err(pdu::Error::unknown_cccid(pdu::PduType::H2cData, d.cccid));
                };
                let Some(window) = cmd.window.as_mut() else {
                    return Err(pdu::Error::unexpected(pdu::PduType::H2cData));
                };
                if d.ttag != d.cccid {
                    return Err(pdu::Error::unknown_ttag(d.ttag));
                }
                pdu::check_h2c_data(&d, window)?;
                self.rx = Rx::H2c {
                    pdu: d,
                    layout: h.layout,
                    pos: 0,
                    small: [0; 128 + DIGEST_LEN],
                };
                Ok(false)
            }
            HostPdu::CapsuleCmd(_) | HostPdu::H2cTermReq(_) => {
                let rest = h.layout.after_header() as usize;
                if rest == 0 {
                    self.reset_header();
                    self.body_done(cx, h, Vec::new())?;
                    return Ok(true);
                }
                self.rx = Rx::Body {
                    header: h,
                    body: vec![0; rest],
                    pos: 0,
                };
                Ok(false)
            }
        }
    }

    /// An ICReq carries nothing after its header; anything else is refused by the parser.
    fn skip_rest(&mut self, layout: Layout) -> Result<bool, pdu::Error> {
        if layout.after_header() != 0 {
            return Err(pdu::Error::unexpected(pdu::PduType::IcReq));
        }
        self.reset_header();
        Ok(true)
    }

    /// Padding, data and digest of an H2CData.
    fn receive_h2c(&mut self, cx: &mut Ctx<'_>) -> Result<Option<bool>, pdu::Error> {
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
        let fd = self.stream.as_raw_fd();
        let r = if *pos < pad {
            self.stage
                .read(&mut self.stream, &mut small[*pos as usize..pad as usize])
        } else if *pos < pad + len {
            let Some(buf) = self.cmds.get_mut(&d.cccid).and_then(|c| c.buf.as_mut()) else {
                return Err(pdu::Error::unknown_cccid(pdu::PduType::H2cData, d.cccid));
            };
            let at = (d.datao + (*pos - pad)) as usize;
            let want = (pad + len - *pos) as usize;
            let staged = self.stage.available();
            if !staged.is_empty() {
                // Data that came with earlier PDUs in one receive: copied on.
                let n = staged.len().min(want);
                if cx.pool.write(buf, at, &staged[..n]).is_err() {
                    return Err(pdu::Error::unexpected(pdu::PduType::H2cData));
                }
                self.stage.consume(n);
                ReadResult::Data(n)
            } else {
                match sys::recv_into(fd, buf, at, want) {
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
            ReadResult::Again => return Ok(None),
            ReadResult::Closed => {
                self.closed = true;
                return Ok(None);
            }
        }
        if *pos < pad + len + dg {
            return Ok(Some(false));
        }
        let (d, dg, digest) = (*d, layout.data_digest, [small[0], small[1], small[2], small[3]]);
        self.reset_header();
        self.count(|s| s.add_written(d.datal as u64));
        let Some(cmd) = self.cmds.get_mut(&d.cccid) else {
            return Ok(Some(true));
        };
        if dg {
            let buf = cmd.buf.as_ref().expect("a receiving command has its buffer");
            let crc = sys::crc32c_of(0, buf, d.datao as usize, d.datal as usize).unwrap_or(!0);
            if crc != u32::from_le_bytes(digest) {
                log::warn!(
                    "{}: H2CData of command {}: data digest mismatch",
                    self.info.peer,
                    d.cccid
                );
                cmd.digest_failed = true;
            }
        }
        let window = cmd.window.expect("checked at the header");
        if !window.is_complete() {
            return Ok(Some(true));
        }
        let next = window.r2to + window.r2tl;
        let total = cmd.req.data().len();
        if next < total {
            self.send_r2t(d.cccid, next, total - next);
        } else {
            cmd.window = None;
            self.submit(cx, d.cccid);
        }
        Ok(Some(true))
    }

    /// What follows a capsule or termination request's header has arrived.
    fn body_done(&mut self, cx: &mut Ctx<'_>, h: Header<HostPdu>, body: Vec<u8>) -> Result<(), pdu::Error> {
        self.reset_header();
        match h.pdu {
            HostPdu::H2cTermReq(t) => {
                log::info!(
                    "{}: host terminated the connection (FES {:#x})",
                    self.info.peer,
                    t.fes
                );
                self.closed = true;
                Ok(())
            }
            HostPdu::CapsuleCmd(c) => {
                self.count(Stats::add_command);
                let (pad, len) = (h.layout.pad as usize, h.layout.data_len as usize);
                let data = &body[pad.min(body.len())..(pad + len).min(body.len())];
                let digest_ok = !h.layout.data_digest || {
                    let d = &body[pad + len..pad + len + DIGEST_LEN];
                    crc32c::crc32c(data) == u32::from_le_bytes([d[0], d[1], d[2], d[3]])
                };
                self.capsule(cx, &c, data, digest_ok);
                Ok(())
            }
            HostPdu::IcReq(_) | HostPdu::H2cData(_) => Err(pdu::Error::unexpected(h.pdu.pdu_type())),
        }
    }

    /// A command capsule with its in-capsule data.
    fn capsule(&mut self, cx: &mut Ctx<'_>, c: &CapsuleCmd, data: &[u8], digest_ok: bool) {
        let sqe = sqe_from_bytes(&c.sqe);
        let cid = sqe.cid();
        let Some(q) = self.queue.as_mut() else {
            // The first capsule of a queue: a Connect (NVMe-oF 1.1 §3.3).
            if !digest_ok {
                return self.respond(fail(cid, TRANSIENT_TRANSPORT_ERROR), 0, 0);
            }
            let connect_data: [u8; CONNECT_DATA_BYTES] = match data.try_into() {
                Ok(d) => d,
                Err(_) if !fabrics::is_connect(&sqe) => [0; CONNECT_DATA_BYTES],
                Err(_) => return self.respond(fail(cid, fabrics::status::DATA_SGL_LENGTH_INVALID), 0, 0),
            };
            let mut target = lock(cx.target);
            let connected = target.connect(&sqe, &connect_data, self.info.clone());
            let subsystem = connected
                .as_ref()
                .ok()
                .and_then(|o| target.controller_subsystem(o.queue.cntlid));
            // The lock is not held while responding.
            drop(target);
            match connected {
                Ok(out) => {
                    if let Some(id) = subsystem {
                        let st = (cx.subsystem_stats)(id);
                        st.connected();
                        st.add_command();
                        self.sub = Some(st);
                        let c = cx.metrics.conns(id, &out.host);
                        c.opened();
                        self.conn_counters = Some(c);
                    }
                    self.host = out.host.clone();
                    log::info!(
                        "{}: queue {} of controller {} connected ({} entries)",
                        self.info.peer,
                        out.queue.qid,
                        out.queue.cntlid.0,
                        out.entries
                    );
                    let mut sqhd = SqHead::new(out.entries, out.sq_flow_control_disabled);
                    let head = sqhd.advance();
                    let qid = out.queue.qid;
                    if out.queue.qid != 0 {
                        self.params.max_icd = out.in_capsule_max;
                    }
                    self.queue = Some(Queue {
                        queue: out.queue,
                        sqhd,
                        last_head: head,
                        entries: out.entries,
                        io: out.io,
                    });
                    self.respond(out.cqe, head, qid);
                }
                Err(cqe) => self.respond(cqe, 0, 0),
            }
            return;
        };
        let head = q.sqhd.advance();
        q.last_head = head;
        let (qid, cntlid, entries) = (q.queue.qid, q.queue.cntlid, q.entries);
        if !digest_ok {
            return self.respond(fail(cid, TRANSIENT_TRANSPORT_ERROR), head, qid);
        }
        if qid == 0 {
            let in_data = match fabrics::data_xfer(&sqe, pdu::FABRICS_MAX_ICD) {
                Ok(x) => x.in_capsule_slice(data).unwrap_or(&[]),
                Err(_) => &[],
            };
            let outcome = lock(cx.target).admin(cntlid, &sqe, in_data);
            match outcome {
                AdminOutcome::Held => {}
                AdminOutcome::Complete { cqe, data, effect } => {
                    if !data.is_empty() {
                        self.c2h_vec(cid, &data);
                    }
                    self.respond(cqe, head, qid);
                    if let Some(AdminEffect::Reset { io_queues }) = effect {
                        cx.close.extend(io_queues);
                    }
                }
            }
            return;
        }
        // Authentication, and whatever comes before the queue has authenticated (`auth`).
        if fabrics::is_auth_command(&sqe) || self.queue.as_ref().is_some_and(|q| q.io.is_none()) {
            return self.auth_command(cx, &sqe, data, head, QueueRef { cntlid, qid });
        }
        self.count(Stats::add_io_command);
        if self.cmds.len() as u32 >= entries || self.cmds.contains_key(&cid) {
            log::warn!(
                "{}: command {cid} past the queue's {entries} entries or a CID in use",
                self.info.peer
            );
            return self.respond(fail(cid, COMMAND_INTERRUPTED), head, qid);
        }
        let decoded = self
            .queue
            .as_mut()
            .and_then(|q| q.io.as_mut())
            .map(|io| io.decode(&sqe));
        let req = match decoded {
            Some(Ok(r)) => r,
            Some(Err(cqe)) => {
                self.count_conflict(cx, &sqe, &cqe);
                return self.respond(cqe, head, qid);
            }
            None => return self.respond(fail(cid, fabrics::status::COMMAND_SEQUENCE_ERROR), head, qid),
        };
        let icd = match req.data() {
            x @ DataXfer::InCapsule { .. } => match x.in_capsule_slice(data) {
                Ok(s) => s.to_vec(),
                Err(st) => return self.respond(req.failure(st), head, qid),
            },
            _ => Vec::new(),
        };
        self.cmds.insert(
            cid,
            Cmd {
                req,
                sqhd: head,
                stage: Stage::NeedBuffer,
                buf: None,
                icd,
                window: None,
                digest_failed: false,
                start: Instant::now(),
            },
        );
        // Behind commands already waiting for a rate limit, or short of credit: it waits.
        if !self.throttled.is_empty() || !self.admit(cid) {
            self.throttled.push_back(cid);
            if let Some(c) = self.cmds.get(&cid) {
                let (sub, nsid) = (c.req.subsystem, c.req.nsid);
                self.io_counters(cx.metrics, sub, nsid).throttled();
            }
            return;
        }
        self.start(cx, cid);
    }

    /// Gets the command a buffer if it needs one, then its data or the backend.
    fn start(&mut self, cx: &mut Ctx<'_>, cid: u16) {
        let Some(cmd) = self.cmds.get_mut(&cid) else {
            return;
        };
        let len = cmd.req.data().len() as usize;
        if len != 0 {
            let Some(mut b) = cx.pool.alloc() else {
                cmd.stage = Stage::NeedBuffer;
                self.waiting.push_back(cid);
                return;
            };
            if len > b.len() {
                cx.pool.free(b);
                let cqe = cmd.req.failure(fabrics::status::DATA_SGL_LENGTH_INVALID);
                let head = cmd.sqhd;
                self.cmds.remove(&cid);
                return self.respond(cqe, head, self.qid());
            }
            b.truncate(len);
            cmd.buf = Some(b);
        }
        match cmd.req.data() {
            DataXfer::InCapsule { .. } => {
                let b = cmd.buf.as_ref().expect("allocated above");
                if cx.pool.write(b, 0, &cmd.icd).is_err() {
                    log::error!(
                        "in-capsule data of {} bytes does not fit its buffer",
                        cmd.icd.len()
                    );
                }
                cmd.icd = Vec::new();
                self.submit(cx, cid);
            }
            DataXfer::FromHost { len } => {
                cmd.stage = Stage::Receiving;
                self.send_r2t(cid, 0, len);
            }
            DataXfer::ToHost { .. } | DataXfer::None => self.submit(cx, cid),
        }
    }

    /// Asks command `cid`'s rate limits (its host's and its namespace's) to admit it now.
    fn admit(&self, cid: u16) -> bool {
        let (Some(cmd), Some(io)) = (
            self.cmds.get(&cid),
            self.queue.as_ref().and_then(|q| q.io.as_ref()),
        ) else {
            return true;
        };
        !io.is_limited(&cmd.req) || io.admit(&cmd.req, clock_ns(Instant::now()))
    }

    /// Starts the commands that waited for a rate limit, in order, as far as it admits them.
    fn start_throttled(&mut self, cx: &mut Ctx<'_>) -> bool {
        let mut any = false;
        while let Some(&cid) = self.throttled.front() {
            if !self.admit(cid) {
                break;
            }
            self.throttled.pop_front();
            self.start(cx, cid);
            any = true;
        }
        any
    }

    /// Retries commands that waited for a buffer.
    fn start_waiting(&mut self, cx: &mut Ctx<'_>) -> bool {
        let mut any = false;
        while let Some(&cid) = self.waiting.front() {
            if cx.pool.available() == 0 {
                break;
            }
            self.waiting.pop_front();
            self.start(cx, cid);
            any = true;
        }
        any
    }

    /// Asks for the next `rest` bytes from `offset` (one R2T at most MAXH2CDATA long).
    fn send_r2t(&mut self, cid: u16, offset: u32, rest: u32) {
        let r = R2t {
            cccid: cid,
            ttag: cid,
            r2to: offset,
            r2tl: rest.min(self.params.maxh2cdata),
        };
        if let Some(c) = self.cmds.get_mut(&cid) {
            c.window = Some(R2tWindow::new(&r));
        }
        let mut out = vec![0u8; MAX_TX_HEADER_LEN];
        match r2t(&mut out, &r, self.params.digests) {
            Ok(n) => {
                out.truncate(n);
                self.tx.push_back(Tx::bytes(out));
            }
            Err(e) => log::error!("R2T not built: {e}"),
        }
    }

    /// The command's data is in its buffer: hand it to the backend (or finish it here).
    fn submit(&mut self, cx: &mut Ctx<'_>, cid: u16) {
        let Some(cmd) = self.cmds.get_mut(&cid) else {
            return;
        };
        cmd.stage = Stage::Backend;
        if cmd.digest_failed {
            return self.finish(cx, cid, TRANSIENT_TRANSPORT_ERROR);
        }
        let req = cmd.req;
        let Some(&backend) = cx.ns.get(&(req.subsystem, req.nsid)) else {
            log::error!(
                "no backend for namespace {} of subsystem {}",
                req.nsid,
                req.subsystem.0
            );
            return self.finish(cx, cid, Status::INVALID_NAMESPACE);
        };
        let (op, slba, nlb) = match req.op {
            IoOp::Read { slba, blocks, .. } => (Op::Read, slba, blocks),
            IoOp::Write {
                slba, blocks, fua, ..
            } => (Op::Write { fua }, slba, blocks),
            IoOp::Flush => (Op::Flush, 0, 0),
            IoOp::WriteZeroes { slba, blocks, .. } => (Op::WriteZeroes, slba, blocks),
            IoOp::Reservation(_) => return self.reservation(cx, cid),
            IoOp::DatasetManagement { deallocate, .. } => {
                let buf = cmd.buf.as_ref().expect("DSM ranges come in a buffer");
                let mut raw = vec![0u8; buf.len()];
                let ranges = cx.pool.read(buf, 0, &mut raw).map_err(|_| Status::INVALID_FIELD);
                let ranges = ranges.and_then(|_| req.dsm_ranges(&raw));
                match ranges {
                    Err(st) => return self.finish(cx, cid, st),
                    Ok(_) if !deallocate => return self.finish(cx, cid, Status::SUCCESS),
                    Ok(r) => (
                        Op::Deallocate(r.iter().map(|r| (r.slba, r.blocks)).collect()),
                        0,
                        0,
                    ),
                }
            }
        };
        let buf = match op {
            Op::Read | Op::Write { .. } => cmd.buf.take(),
            _ => None,
        };
        let tag = tag(self.id, cid);
        if let Err(busy) = cx.backends[backend].submit(cx.pool, op.clone(), slba, nlb, buf, tag) {
            // The worker resubmits it once the backend has room.
            cx.retry.push_back(Submission {
                backend,
                op,
                slba,
                nlb,
                buf: busy.buf,
                tag,
            });
        }
    }

    /// A backend completed command `cid` (its buffer comes back).
    pub(crate) fn complete(&mut self, cx: &mut Ctx<'_>, cid: u16, status: Status, buf: Option<DmaBuf>) {
        let Some(cmd) = self.cmds.get_mut(&cid) else {
            if let Some(b) = buf {
                cx.pool.free(b);
            }
            return;
        };
        if let Some(b) = buf {
            if let Some(old) = cmd.buf.replace(b) {
                cx.pool.free(old);
            }
        }
        self.finish(cx, cid, status);
    }

    /// The host's I/O counters of namespace `nsid` of subsystem `sub` (registered with the
    /// worker at the connection's first command to it).
    fn io_counters(&mut self, metrics: &WorkerMetrics, sub: SubsystemId, nsid: u32) -> &IoCounters {
        let i = match self.io_counters.iter().position(|(n, _)| *n == nsid) {
            Some(i) => i,
            None => {
                self.io_counters.push((nsid, metrics.io(sub, nsid, &self.host)));
                self.io_counters.len() - 1
            }
        };
        &self.io_counters[i].1
    }

    /// Sends the command's data (a successful read) and completion, and forgets it.
    fn finish(&mut self, cx: &mut Ctx<'_>, cid: u16, status: Status) {
        let Some(cmd) = self.cmds.remove(&cid) else { return };
        let kind = match cmd.req.op {
            IoOp::Read { .. } => IoKind::Read,
            IoOp::Write { .. } => IoKind::Write,
            _ => IoKind::Other,
        };
        let bytes = cmd.req.data().len() as u64;
        let latency = cmd.start.elapsed();
        let counters = self.io_counters(cx.metrics, cmd.req.subsystem, cmd.req.nsid);
        counters.complete(kind, bytes, !status.is_success(), latency);
        if status == fabrics::resv::RESERVATION_CONFLICT {
            counters.reservation_conflict();
        }
        let qid = self.qid();
        if !status.is_success() {
            if let Some(io) = self.queue.as_ref().and_then(|q| q.io.as_ref()) {
                io.record_error(&cmd.req, status);
            }
        }
        let cqe = if status.is_success() {
            cmd.req.success()
        } else {
            cmd.req.failure(status)
        };
        match (cmd.req.op, cmd.buf) {
            (IoOp::Read { len, .. }, Some(buf)) if status.is_success() => {
                self.count(|s| s.add_read(len as u64));
                self.c2h_dma(cid, buf);
            }
            // A Reservation Report's data.
            (IoOp::Reservation(r), Some(buf))
                if status.is_success() && matches!(r.data, DataXfer::ToHost { .. }) =>
            {
                self.c2h_dma(cid, buf)
            }
            (_, Some(buf)) => cx.pool.free(buf),
            _ => {}
        }
        self.respond(cqe, cmd.sqhd, qid);
    }

    fn qid(&self) -> u16 {
        self.queue.as_ref().map_or(0, |q| q.queue.qid)
    }

    /// Queues a CapsuleResp with `cqe`, SQHD `head` and SQID `qid`.
    fn respond(&mut self, mut cqe: Cqe, head: u16, qid: u16) {
        if qid != 0 && cqe.status != 0 {
            self.stats.add_io_error();
            if let Some(s) = &self.sub {
                s.add_io_error();
            }
        }
        cqe.sq_head = head;
        cqe.sq_id = qid;
        let mut out = vec![0u8; MAX_TX_HEADER_LEN];
        match capsule_resp(&mut out, &cqe_to_bytes(&cqe), self.params.digests) {
            Ok(n) => {
                out.truncate(n);
                self.tx.push_back(Tx::bytes(out));
            }
            Err(e) => log::error!("CapsuleResp not built: {e}"),
        }
    }

    fn c2h(&self, cid: u16, len: usize) -> Option<(Vec<u8>, Option<pdu::DataDigest>)> {
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
    fn c2h_vec(&mut self, cid: u16, data: &[u8]) {
        let Some((mut head, digest)) = self.c2h(cid, data.len()) else {
            return;
        };
        head.extend_from_slice(data);
        if let Some(mut d) = digest {
            d.update(data);
            head.extend_from_slice(&d.to_wire());
        }
        self.tx.push_back(Tx::bytes(head));
    }

    /// Queues a C2HData whose data leaves straight from `buf`.
    fn c2h_dma(&mut self, cid: u16, buf: DmaBuf) {
        let Some((head, digest)) = self.c2h(cid, buf.len()) else {
            return;
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

    /// Answers a protocol error with a C2HTermReq (unless the error says not to) and closes
    /// the connection once it is sent (§3.6.2.5).
    fn protocol_error(&mut self, e: &pdu::Error) {
        self.count(Stats::add_protocol_error);
        log::warn!(
            "{}: protocol error: {e:?}; closing the connection",
            self.info.peer
        );
        if !e.reply() {
            self.closed = true;
            return;
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
            }
            Err(_) => self.closed = true,
        }
    }

    /// Sends what is queued, as far as the socket takes it, gathering many PDUs into one
    /// `sendmsg` (a deep queue's answers go out together). Returns whether anything went.
    pub(crate) fn flush(&mut self, pool: &mut DmaPool) -> bool {
        /// Bytes offered to one `sendmsg` at most.
        const BATCH: usize = 256 << 10;
        let fd = self.stream.as_raw_fd();
        let mut progress = false;
        while !self.tx.is_empty() {
            let (offered, sent) = {
                let mut pieces = [Piece::Bytes(&[]); MAX_PIECES];
                let (mut n, mut offered) = (0, 0);
                for t in &self.tx {
                    if n + 3 > MAX_PIECES || offered >= BATCH {
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
                match sys::send_many(fd, &pieces[..n]) {
                    Ok(sent) => (offered, sent),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return progress,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        log::debug!("{}: send: {e}", self.info.peer);
                        self.close(pool);
                        return true;
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
                    self.close(pool);
                    return true;
                }
            }
            if sent < offered {
                // The socket is full: the rest goes in a later round.
                return progress;
            }
        }
        progress
    }
}

/// `t` in nanoseconds from a fixed origin (the first call), the clock of rate limits.
fn clock_ns(t: Instant) -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    t.saturating_duration_since(*EPOCH.get_or_init(Instant::now))
        .as_nanos()
        .min(u64::MAX as u128) as u64
}

/// A completion refusing command `cid` with `status`.
fn fail(cid: u16, status: Status) -> Cqe {
    Cqe {
        dw0: 0,
        dw1: 0,
        sq_head: 0,
        sq_id: 0,
        cid,
        status: status.field(),
    }
}
