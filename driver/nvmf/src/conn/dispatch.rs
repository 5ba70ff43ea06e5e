//! Command dispatch: what a command capsule asks for, handed to the fabrics layer or a
//! backend, and its completion.
//!
//! [`Conn::capsule`] takes each capsule the framing received, in this order:
//! - the first capsule of a connection must be a Connect (NVMe-oF 1.1 §3.3): it binds the
//!   connection to a queue of a controller ([`Target::connect`](crate::fabrics::Target::connect));
//! - on the admin queue, every command runs under the target's lock
//!   ([`Target::admin`](crate::fabrics::Target::admin)), its data (at most a few KiB) in a Vec;
//! - on an I/O queue, authentication and whatever comes before it (`auth`); then I/O
//!   commands are decoded by the queue's [`IoQueue`], wait for their rate limits, get their
//!   data ([`Conn::start`], the data transfer) and go to their namespace's backend
//!   ([`Conn::submit`]; a reservation command to the target, `resv`);
//! - [`Conn::finish`] answers a command: its data, then its CapsuleResp.

use std::time::Instant;

use vfpoll_nvme_spec::status::{Sct, Status};

use super::transfer::{Cmd, Started};
use super::{lock, tag, Conn, Ctx, Submission};
use crate::backend::Op;
use crate::fabrics::{
    self, sqe_from_bytes, AdminEffect, AdminOutcome, Cqe, DataXfer, IoOp, IoQueue, QueueRef, SqHead, Sqe,
    CONNECT_DATA_BYTES,
};
use crate::pdu::{self, CapsuleCmd};
use crate::server::metrics::{IoCounters, IoKind, Stats, WorkerMetrics};

mod auth;
mod resv;

/// Transient Transport Error (NVMe Base 2.0 Figure 94, 22h): the status of a command whose data
/// failed its data digest (NVMe/TCP 1.0c §3.3.1.1: data digest errors complete the command,
/// the connection stays up). Not DNR: the host may retry.
pub(super) const TRANSIENT_TRANSPORT_ERROR: Status = Status::new(Sct::Generic, 0x22, false);
/// Command Interrupted (NVMe Base 2.0 Figure 94, 21h): a command past the queue's entries,
/// refused without being buffered; not DNR, the host may retry.
pub(super) const COMMAND_INTERRUPTED: Status = Status::new(Sct::Generic, 0x21, false);

/// The queue a Connect bound the connection to.
pub(super) struct Queue {
    pub queue: QueueRef,
    sqhd: SqHead,
    /// The SQHD of the last completion, for completions of held requests.
    pub last_head: u16,
    entries: u32,
    /// The I/O queue's decoder, once the queue may run I/O (after authentication where the
    /// subsystem asks for it); `None` on the admin queue.
    io: Option<IoQueue>,
}

impl Conn {
    /// A command capsule with its in-capsule data.
    pub(super) fn capsule(&mut self, cx: &mut Ctx<'_>, c: &CapsuleCmd, data: &[u8], digest_ok: bool) {
        let sqe = sqe_from_bytes(&c.sqe);
        let cid = sqe.cid();
        let Some(q) = self.queue.as_mut() else {
            return self.connect(cx, &sqe, data, digest_ok);
        };
        let head = q.sqhd.advance();
        q.last_head = head;
        let (queue, entries, authenticated) = (q.queue, q.entries, q.io.is_some());
        if !digest_ok {
            return self.respond(fail(cid, TRANSIENT_TRANSPORT_ERROR), head, queue.qid);
        }
        if queue.qid == 0 {
            return self.admin(cx, &sqe, data, head, queue);
        }
        // Authentication, and whatever comes before the queue has authenticated (`auth`).
        if fabrics::is_auth_command(&sqe) || !authenticated {
            return self.auth_command(cx, &sqe, data, head, queue);
        }
        self.io_command(cx, &sqe, data, head, entries);
    }

    /// The first capsule of a queue: a Connect (NVMe-oF 1.1 §3.3).
    fn connect(&mut self, cx: &mut Ctx<'_>, sqe: &Sqe, data: &[u8], digest_ok: bool) {
        let cid = sqe.cid();
        if !digest_ok {
            return self.respond(fail(cid, TRANSIENT_TRANSPORT_ERROR), 0, 0);
        }
        let connect_data: [u8; CONNECT_DATA_BYTES] = match data.try_into() {
            Ok(d) => d,
            Err(_) if !fabrics::is_connect(sqe) => [0; CONNECT_DATA_BYTES],
            Err(_) => return self.respond(fail(cid, fabrics::status::DATA_SGL_LENGTH_INVALID), 0, 0),
        };
        let mut target = lock(cx.target);
        let connected = target.connect(sqe, &connect_data, self.info.clone());
        let subsystem = connected
            .as_ref()
            .ok()
            .and_then(|o| target.controller_subsystem(o.queue.cntlid));
        // The lock is not held while responding.
        drop(target);
        let out = match connected {
            Ok(out) => out,
            Err(cqe) => return self.respond(cqe, 0, 0),
        };
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
        if qid != 0 {
            self.wire.params.max_icd = out.in_capsule_max;
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

    /// An admin command: run under the target's lock, its data to the host from a Vec.
    fn admin(&mut self, cx: &mut Ctx<'_>, sqe: &Sqe, data: &[u8], head: u16, queue: QueueRef) {
        let outcome = lock(cx.target).admin(queue.cntlid, sqe, in_capsule(sqe, data));
        match outcome {
            AdminOutcome::Held => {}
            AdminOutcome::Complete { cqe, data, effect } => {
                if !data.is_empty() {
                    self.wire.c2h_bytes(sqe.cid(), &data);
                }
                self.respond(cqe, head, queue.qid);
                if let Some(AdminEffect::Reset { io_queues }) = effect {
                    cx.close.extend(io_queues);
                }
            }
        }
    }

    /// An I/O command: decoded, within the queue's entries, then started once its rate
    /// limits admit it.
    fn io_command(&mut self, cx: &mut Ctx<'_>, sqe: &Sqe, data: &[u8], head: u16, entries: u32) {
        let (cid, qid) = (sqe.cid(), self.qid());
        self.count(Stats::add_io_command);
        if self.cmds.len() as u32 >= entries || self.cmds.contains_key(&cid) {
            log::warn!(
                "{}: command {cid} past the queue's {entries} entries or a CID in use",
                self.info.peer
            );
            return self.respond(fail(cid, COMMAND_INTERRUPTED), head, qid);
        }
        let req = match self.io_queue_mut().map(|io| io.decode(sqe)) {
            Some(Ok(r)) => r,
            Some(Err(cqe)) => {
                self.count_conflict(cx, sqe, &cqe);
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
        self.cmds.insert(cid, Cmd::new(req, head, icd));
        // Behind commands already waiting for a rate limit, or short of credit: it waits.
        if !self.throttled.is_empty() || !self.admit(cid) {
            self.throttled.push_back(cid);
            self.io_counters(cx.metrics, req.subsystem, req.nsid).throttled();
            return;
        }
        self.start_command(cx, cid);
    }

    /// Gets command `cid` its data (the data transfer), then hands it to the backend.
    fn start_command(&mut self, cx: &mut Ctx<'_>, cid: u16) {
        match self.start(cx.pool, cid) {
            Started::Ready => self.submit(cx, cid),
            Started::Waiting => {}
            Started::Refused(cqe, head) => self.respond(cqe, head, self.qid()),
        }
    }

    /// Asks command `cid`'s rate limits (its host's and its namespace's) to admit it now.
    fn admit(&self, cid: u16) -> bool {
        let (Some(cmd), Some(io)) = (self.cmds.get(&cid), self.io_queue()) else {
            return true;
        };
        !io.is_limited(&cmd.req) || io.admit(&cmd.req, clock_ns(Instant::now()))
    }

    /// Starts the commands that waited for a rate limit, in order, as far as it admits them.
    pub(super) fn start_throttled(&mut self, cx: &mut Ctx<'_>) -> bool {
        let mut any = false;
        while let Some(&cid) = self.throttled.front() {
            if !self.admit(cid) {
                break;
            }
            self.throttled.pop_front();
            self.start_command(cx, cid);
            any = true;
        }
        any
    }

    /// Retries commands that waited for a buffer.
    pub(super) fn start_waiting(&mut self, cx: &mut Ctx<'_>) -> bool {
        let mut any = false;
        while let Some(&cid) = self.waiting.front() {
            if cx.pool.available() == 0 {
                break;
            }
            self.waiting.pop_front();
            self.start_command(cx, cid);
            any = true;
        }
        any
    }

    /// The command's data is in its buffer: hand it to the backend (or finish it here).
    pub(super) fn submit(&mut self, cx: &mut Ctx<'_>, cid: u16) {
        let Some(cmd) = self.cmds.get_mut(&cid) else {
            return;
        };
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
            IoOp::Reservation(_) => {
                if let Some(status) = self.reservation(cx, cid) {
                    self.finish(cx, cid, status);
                }
                return;
            }
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

    /// Sends the command's data (a successful read) and completion, and forgets it.
    pub(super) fn finish(&mut self, cx: &mut Ctx<'_>, cid: u16, status: Status) {
        let Some(cmd) = self.cmds.remove(&cid) else { return };
        let req = cmd.req;
        let kind = match req.op {
            IoOp::Read { .. } => IoKind::Read,
            IoOp::Write { .. } => IoKind::Write,
            _ => IoKind::Other,
        };
        let latency = cmd.start.elapsed();
        let counters = self.io_counters(cx.metrics, req.subsystem, req.nsid);
        counters.complete(kind, req.data().len() as u64, !status.is_success(), latency);
        if status == fabrics::resv::RESERVATION_CONFLICT {
            counters.reservation_conflict();
        }
        if !status.is_success() {
            if let Some(io) = self.io_queue() {
                io.record_error(&req, status);
            }
        }
        let cqe = if status.is_success() {
            req.success()
        } else {
            req.failure(status)
        };
        let head = cmd.sqhd;
        self.send_data(cx.pool, cid, cmd, status.is_success());
        self.respond(cqe, head, self.qid());
    }

    /// Queues a CapsuleResp with `cqe`, SQHD `head` and SQID `qid`.
    pub(super) fn respond(&mut self, mut cqe: Cqe, head: u16, qid: u16) {
        if qid != 0 && cqe.status != 0 {
            self.count(Stats::add_io_error);
        }
        cqe.sq_head = head;
        cqe.sq_id = qid;
        self.wire.capsule_resp(&cqe);
    }

    /// The QID of the queue, 0 before the Connect.
    fn qid(&self) -> u16 {
        self.queue.as_ref().map_or(0, |q| q.queue.qid)
    }

    /// The I/O queue's decoder, once the queue may run I/O.
    fn io_queue(&self) -> Option<&IoQueue> {
        self.queue.as_ref().and_then(|q| q.io.as_ref())
    }

    fn io_queue_mut(&mut self) -> Option<&mut IoQueue> {
        self.queue.as_mut().and_then(|q| q.io.as_mut())
    }

    /// The host's I/O counters of namespace `nsid` of subsystem `sub` (registered with the
    /// worker at the connection's first command to it).
    fn io_counters(&mut self, metrics: &WorkerMetrics, sub: fabrics::SubsystemId, nsid: u32) -> &IoCounters {
        let i = match self.io_counters.iter().position(|(n, _)| *n == nsid) {
            Some(i) => i,
            None => {
                self.io_counters.push((nsid, metrics.io(sub, nsid, &self.host)));
                self.io_counters.len() - 1
            }
        };
        &self.io_counters[i].1
    }
}

/// The in-capsule data of a Fabrics or admin command `sqe` (none where its SGL names none or
/// more than the capsule has).
fn in_capsule<'a>(sqe: &Sqe, data: &'a [u8]) -> &'a [u8] {
    match fabrics::data_xfer(sqe, pdu::FABRICS_MAX_ICD) {
        Ok(x) => x.in_capsule_slice(data).unwrap_or(&[]),
        Err(_) => &[],
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

#[cfg(test)]
mod tests;
