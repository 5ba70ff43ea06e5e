//! One NVMe/TCP connection's state machine (NVMe/TCP Transport 1.0c §3.3, §3.6): the
//! ICReq/ICResp exchange, the Connect that binds it to a queue, then command capsules, R2T and
//! H2CData for host data, C2HData and CapsuleResp for the answers.
//!
//! A connection is driven by its worker ([`crate::server`]): [`Conn::receive`] reads what the
//! socket has without blocking and starts the commands it completes, [`Conn::complete`] takes a
//! backend's completion, [`Conn::flush`] sends what is queued, every queued PDU in one gathered
//! `sendmsg`. Headers and capsules are received in batches through a small staging buffer;
//! write data lands straight in the command's DMA buffer (`sys::recv_into`), except the part
//! of it (a few KiB at most) that arrived in one receive with the PDUs before it, which is
//! copied on; read data leaves straight from its DMA buffer (`sys::send_many`). In-capsule
//! data, at most a few KiB, is copied.
//!
//! Three layers, each in its own module, each calling only the ones below it:
//! - `framing`: PDUs in and out of the socket, header and data digests, the ICReq;
//! - `dispatch`: what a capsule asks for: Connect, admin commands and authentication to the
//!   fabrics layer, I/O commands decoded, rate-limited and handed to a backend, completions;
//! - `transfer`: an I/O command's data buffer, R2T/H2CData for host data, C2HData for the
//!   host's.
//!
//! One command capsule's path, top to bottom: [`Conn::receive`] (here) reads it with
//! `Framing::step`, hands it to `Conn::capsule` (dispatch), which decodes it and calls
//! `Conn::start` (transfer) for its data, then submits it to its backend; host data asked for
//! with an R2T arrives as H2CData PDUs, checked and received through `Conn::h2c_header` and
//! `Conn::h2c_received` (transfer), after which [`Conn::receive`] submits the command
//! (dispatch). The backend's completion comes in through [`Conn::complete`] (here) to
//! `Conn::finish` (dispatch), which sends the data (`Conn::send_data`, transfer) and the
//! CapsuleResp (framing).
//!
//! Memory is bounded per connection: at most the queue's entries commands in flight (more are
//! refused with a completion, not buffered), one capsule of in-capsule data being received,
//! and reading stops while the answers queued for sending pass a limit.

use std::collections::{HashMap, VecDeque};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};

use vfpoll_dma::{DmaBuf, DmaPool};
use vfpoll_nvme_spec::status::Status;

use crate::backend::{Backend, Op};
use crate::fabrics::{ConnInfo, Cqe, QueueRef, SubsystemId, Target};
use crate::pdu::{self, TargetLimits};
use crate::server::metrics::{ConnCounters, IoCounters, Stats, WorkerMetrics};

mod dispatch;
mod framing;
mod transfer;

use dispatch::Queue;
use framing::{Framing, Received, Step};
use transfer::Cmd;

/// PDUs read per [`Conn::receive`] call at most, so one busy connection cannot starve others.
const RX_BUDGET: usize = 64;
/// Bytes queued for sending past which [`Conn::receive`] reads nothing more: memory stays
/// bounded while the host does not take what is queued for it.
const TX_QUEUE_LIMIT: usize = 4 << 20;

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

/// One connection.
pub(crate) struct Conn {
    id: u64,
    info: ConnInfo,
    /// The socket, as PDUs.
    wire: Framing,
    /// The queue a Connect bound the connection to.
    queue: Option<Queue>,
    /// I/O commands in flight, by CID.
    cmds: HashMap<u16, Cmd>,
    /// Commands waiting for a data buffer, oldest first.
    waiting: VecDeque<u16>,
    /// Commands waiting for a rate limit's credit, oldest first.
    throttled: VecDeque<u16>,
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
            info,
            wire: Framing::new(stream, limits),
            queue: None,
            cmds: HashMap::new(),
            waiting: VecDeque::new(),
            throttled: VecDeque::new(),
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
        self.wire.fd()
    }

    /// Whether answers wait for room in the socket, or received bytes wait to be parsed.
    pub(crate) fn busy(&self) -> bool {
        self.wire.busy() || !self.waiting.is_empty()
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
        if self.closed || self.wire.closing() {
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
        self.wire.shutdown(pool);
        // Buffers a backend holds come back through its completions, which find no command.
        for (_, c) in self.cmds.drain() {
            if let Some(b) = c.buf {
                pool.free(b);
            }
        }
        self.waiting.clear();
        self.throttled.clear();
    }

    /// Reads and handles what the socket has when it may have data (`readable`: epoll says so,
    /// or the caller does not know) or bytes are staged; otherwise it only starts commands that
    /// were waiting for a buffer, without a system call. Returns whether anything happened.
    pub(crate) fn receive(&mut self, cx: &mut Ctx<'_>, readable: bool) -> bool {
        let mut progress = self.start_waiting(cx) | self.start_throttled(cx);
        if !readable && !self.wire.staged() {
            return progress;
        }
        let mut pdus = 0;
        while !self.closed
            && !self.wire.closing()
            && pdus < RX_BUDGET
            && self.wire.queued_bytes() < TX_QUEUE_LIMIT
        {
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
        // The buffer of the command whose H2CData is being received.
        let dest = (self.wire.h2c_cccid())
            .and_then(|cid| self.cmds.get_mut(&cid))
            .and_then(|c| c.buf.as_mut());
        match self.wire.step(cx.pool, dest)? {
            Step::Idle => Ok(None),
            Step::Closed => {
                self.closed = true;
                Ok(None)
            }
            Step::Partial => Ok(Some(false)),
            Step::H2cHeader(d) => {
                self.h2c_header(&d)?;
                Ok(Some(false))
            }
            Step::Pdu(Received::IcReq) => Ok(Some(true)),
            Step::Pdu(Received::TermReq(t)) => {
                log::info!(
                    "{}: host terminated the connection (FES {:#x})",
                    self.info.peer,
                    t.fes
                );
                self.closed = true;
                Ok(Some(true))
            }
            Step::Pdu(Received::Capsule(c)) => {
                self.count(Stats::add_command);
                self.capsule(cx, &c.cmd, c.data(), c.digest_ok);
                Ok(Some(true))
            }
            Step::Pdu(Received::H2cData { pdu, digest_ok }) => {
                if let Some(cid) = self.h2c_received(&pdu, digest_ok) {
                    self.submit(cx, cid);
                }
                Ok(Some(true))
            }
        }
    }

    /// Answers a protocol error with a C2HTermReq (unless the error says not to) and closes
    /// the connection once it is sent (§3.6.2.5).
    fn protocol_error(&mut self, e: &pdu::Error) {
        self.count(Stats::add_protocol_error);
        log::warn!(
            "{}: protocol error: {e:?}; closing the connection",
            self.info.peer
        );
        if !self.wire.term_req(e) {
            self.closed = true;
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

    /// Sends what is queued, as far as the socket takes it, gathering many PDUs into one
    /// `sendmsg` (a deep queue's answers go out together). Returns whether anything went.
    pub(crate) fn flush(&mut self, pool: &mut DmaPool) -> bool {
        let f = self.wire.flush(pool, &self.info.peer);
        if f.close {
            self.close(pool);
        }
        f.progress
    }
}

#[cfg(test)]
mod testing;
