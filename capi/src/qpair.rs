//! Queue pairs for C: the driver's [`QueuePair`] plus a request table that maps the driver's
//! tag (a table index) back to the caller's tag and buffer handles. The table and the queue of
//! completions waiting for a larger poll are sized at creation: submitting and polling never
//! allocate.

#![allow(non_camel_case_types)]

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use libc::{EAGAIN, EINVAL};
use vfpoll_nvme::format::{PiCheck, PiMode};
use vfpoll_nvme::{Done, NvmeError, QpairOptions, QueuePair};

use crate::env::{vfpoll_ctrl, Env};
use crate::error::{nvme_errno, Error, Res};
use crate::pool::{vfpoll_buf, BufRef, Sub};
use crate::types::*;

/// A queue pair: see `vfpoll_qpair_create`.
pub struct vfpoll_qpair {
    qp: RefCell<QueuePair<Sub>>,
    reqs: RefCell<Requests>,
    env: Arc<Env>,
    /// Completion callbacks running now (`vfpoll_qpair_poll_cb`, nested when a callback polls):
    /// the queue pair must not be destroyed under them.
    pub(crate) in_callback: Cell<u32>,
    /// Rounds of polling (`poll_with` calls), and those that found nothing.
    polls: Cell<u64>,
    empty_polls: Cell<u64>,
}

/// One request in flight.
#[derive(Default)]
struct Req {
    tag: u64,
    data: Option<BufRef>,
    meta: Option<BufRef>,
}

struct Requests {
    table: Box<[Req]>,
    /// Free indices of `table`.
    free: Vec<u32>,
    /// Completions delivered by the driver beyond what the last poll asked for (when an
    /// unrecoverable failure completes every request at once); handed out first next time.
    /// Capacity: the table's size.
    pending: VecDeque<vfpoll_completion>,
}

/// Reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rw {
    /// Read.
    Read,
    /// Write.
    Write,
}

/// The defaults of `vfpoll_qpair_opts`.
pub(crate) fn default_opts() -> vfpoll_qpair_opts {
    let d = QpairOptions::default();
    vfpoll_qpair_opts {
        entries: d.entries as u32,
        timeout_ms: d.timeout.as_millis() as u32,
        pi_mode: VFPOLL_PI_CONTROLLER,
        pi_checks: 0,
        max_transfer: 0,
        sgl: d.sgl as u32,
    }
}

/// The protection mode for `VFPOLL_PI_*` and `VFPOLL_PI_CHECK_*` values.
pub(crate) fn pi_mode(mode: u32, checks: u32) -> Res<PiMode> {
    let all = VFPOLL_PI_CHECK_GUARD | VFPOLL_PI_CHECK_APP_TAG | VFPOLL_PI_CHECK_REF_TAG;
    if checks & !all != 0 {
        return Err(Error::inval(format!(
            "pi_checks {checks:#x} has bits other than VFPOLL_PI_CHECK_GUARD, _APP_TAG and _REF_TAG"
        )));
    }
    if mode != VFPOLL_PI_HOST && checks != 0 {
        return Err(Error::inval(
            "pi_checks applies to VFPOLL_PI_HOST only (the controller checks what it generates): pass 0",
        ));
    }
    match mode {
        VFPOLL_PI_CONTROLLER => Ok(PiMode::Controller),
        VFPOLL_PI_CONTROLLER_UNCHECKED => Ok(PiMode::ControllerUnchecked),
        VFPOLL_PI_HOST => Ok(PiMode::Host(PiCheck {
            guard: checks & VFPOLL_PI_CHECK_GUARD != 0,
            app_tag: checks & VFPOLL_PI_CHECK_APP_TAG != 0,
            ref_tag: checks & VFPOLL_PI_CHECK_REF_TAG != 0,
        })),
        _ => Err(Error::inval(format!(
            "pi_mode {mode} is not VFPOLL_PI_CONTROLLER (0), VFPOLL_PI_CONTROLLER_UNCHECKED (1) or VFPOLL_PI_HOST (2)"
        ))),
    }
}

fn options(o: &vfpoll_qpair_opts) -> Res<QpairOptions> {
    let entries = u16::try_from(o.entries).map_err(|_| {
        Error::inval(format!(
            "queue entries {} is more than any controller allows",
            o.entries
        ))
    })?;
    if o.timeout_ms == 0 {
        return Err(Error::inval(
            "timeout_ms is 0: give the milliseconds a command may take",
        ));
    }
    if o.sgl > 1 {
        return Err(Error::inval(format!(
            "sgl is {}: pass 0 (PRPs) or 1 (SGLs)",
            o.sgl
        )));
    }
    Ok(QpairOptions {
        entries,
        timeout: Duration::from_millis(o.timeout_ms as u64),
        protection: pi_mode(o.pi_mode, o.pi_checks)?,
        max_transfer: (o.max_transfer != 0).then_some(o.max_transfer as usize),
        sgl: o.sgl == 1,
        ..Default::default()
    })
}

/// The NVMe status field of an error, 0 for errors that are not a controller's status.
fn nvme_status(e: &NvmeError) -> u16 {
    match e {
        NvmeError::Status { status, .. } => status.field(),
        _ => 0,
    }
}

impl vfpoll_qpair {
    /// Creates a queue pair on `ctrl`.
    pub(crate) fn new(ctrl: &vfpoll_ctrl, opts: &vfpoll_qpair_opts) -> Res<Self> {
        let qp = ctrl.ctrl.create_qpair::<Sub>(&options(opts)?)?;
        let n = opts.entries as usize - 1;
        Ok(vfpoll_qpair {
            qp: RefCell::new(qp),
            reqs: RefCell::new(Requests {
                table: (0..n).map(|_| Req::default()).collect(),
                free: (0..n as u32).rev().collect(),
                pending: VecDeque::with_capacity(n),
            }),
            env: Arc::clone(&ctrl.env),
            in_callback: Cell::new(0),
            polls: Cell::new(0),
            empty_polls: Cell::new(0),
        })
    }

    /// The queue pair's counters.
    pub(crate) fn stats(&self) -> vfpoll_qpair_stats {
        let s = self.qp.borrow().stats();
        vfpoll_qpair_stats {
            requests: s.requests,
            commands: s.commands,
            completions: s.completions,
            errors: s.errors,
            sq_doorbells: s.sq_doorbells,
            cq_doorbells: s.cq_doorbells,
            shadow_only: s.shadow_only,
            aborts: s.aborts,
            resets: s.resets,
            polls: self.polls.get(),
            empty_polls: self.empty_polls.get(),
        }
    }

    /// Requests in flight (submitted, completion not yet polled).
    pub(crate) fn outstanding(&self) -> usize {
        let r = self.reqs.borrow();
        r.table.len() - r.free.len()
    }

    /// The largest transfer of one command (larger requests are split).
    pub(crate) fn max_transfer(&self) -> usize {
        self.qp.borrow().max_transfer()
    }

    /// A free request index, or `EAGAIN`.
    fn free_req(&self, r: &Requests) -> Res<u32> {
        r.free.last().copied().ok_or_else(|| {
            Error::new(
                EAGAIN,
                format!(
                    "the queue pair is full ({} requests in flight): poll for completions, then submit again",
                    r.table.len()
                ),
            )
        })
    }

    /// A read or write of `len` bytes of `buf` (and `meta_len` of `meta`) at `slba`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rw(
        &self,
        op: Rw,
        nsid: u32,
        slba: u64,
        buf: &vfpoll_buf,
        len: usize,
        meta: Option<(&vfpoll_buf, usize)>,
        tag: u64,
    ) -> Res<()> {
        buf.in_env(&self.env)?;
        if let Some((m, _)) = meta {
            m.in_env(&self.env)?;
        }
        let mut reqs = self.reqs.borrow_mut();
        let rid = self.free_req(&reqs)?;
        let data = buf.take(len)?;
        let md = match meta {
            Some((m, mlen)) => match m.take(mlen) {
                Ok(s) => Some(s),
                Err(e) => {
                    buf.untake(data);
                    return Err(e);
                }
            },
            None => None,
        };
        let mut qp = self.qp.borrow_mut();
        let t = rid as u64;
        let r = match (op, md) {
            (Rw::Read, None) => qp.read(nsid, slba, data, t).map_err(|r| (r.error, r.buf, None)),
            (Rw::Write, None) => qp.write(nsid, slba, data, t).map_err(|r| (r.error, r.buf, None)),
            (Rw::Read, Some(m)) => qp
                .read_with_metadata(nsid, slba, data, m, t)
                .map_err(|r| (r.error, r.buf.0, Some(r.buf.1))),
            (Rw::Write, Some(m)) => qp
                .write_with_metadata(nsid, slba, data, m, t)
                .map_err(|r| (r.error, r.buf.0, Some(r.buf.1))),
        };
        match r {
            Ok(()) => {
                reqs.free.pop();
                reqs.table[rid as usize] = Req {
                    tag,
                    data: Some(buf.by_ref()),
                    meta: meta.map(|(m, _)| m.by_ref()),
                };
                Ok(())
            }
            Err((e, d, m)) => {
                buf.untake(d);
                if let (Some((mb, _)), Some(m)) = (meta, m) {
                    mb.untake(m);
                }
                Err(e.into())
            }
        }
    }

    /// A command without data: `submit` gets the driver's tag.
    pub(crate) fn nodata(
        &self,
        tag: u64,
        submit: impl FnOnce(&mut QueuePair<Sub>, u64) -> vfpoll_nvme::Result<()>,
    ) -> Res<()> {
        let mut reqs = self.reqs.borrow_mut();
        let rid = self.free_req(&reqs)?;
        submit(&mut self.qp.borrow_mut(), rid as u64)?;
        reqs.free.pop();
        reqs.table[rid as usize] = Req {
            tag,
            data: None,
            meta: None,
        };
        Ok(())
    }

    /// Flush.
    pub(crate) fn flush(&self, nsid: u32, tag: u64) -> Res<()> {
        self.nodata(tag, |qp, t| qp.flush(nsid, t))
    }

    /// Write Zeroes.
    pub(crate) fn write_zeroes(&self, nsid: u32, slba: u64, blocks: u32, tag: u64) -> Res<()> {
        self.nodata(tag, |qp, t| qp.write_zeroes(nsid, slba, blocks, t))
    }

    /// Deallocate: `ranges` is at most 256 long (checked by the caller, so this does not
    /// allocate).
    pub(crate) fn deallocate(&self, nsid: u32, ranges: &[vfpoll_range], tag: u64) -> Res<()> {
        let mut r = [(0u64, 0u32); 256];
        if ranges.is_empty() || ranges.len() > r.len() {
            return Err(Error::new(
                EINVAL,
                format!("{} deallocate ranges: give 1 to 256", ranges.len()),
            ));
        }
        for (d, s) in r.iter_mut().zip(ranges) {
            *d = (s.slba, s.blocks);
        }
        let r = &r[..ranges.len()];
        self.nodata(tag, |qp, t| qp.deallocate(nsid, r, t))
    }

    /// Rings the submission doorbell for everything submitted since the last ring.
    pub(crate) fn commit(&self) {
        self.qp.borrow_mut().flush_submissions();
    }

    /// Rings the doorbell, then writes up to `out.len()` completions into `out`; returns how
    /// many.
    pub(crate) fn poll_into(&self, out: &mut [vfpoll_completion]) -> usize {
        let mut slots = out.iter_mut();
        self.poll_with(slots.len(), |c| {
            if let Some(o) = slots.next() {
                *o = c;
            }
        })
    }

    /// Hands up to `max` completions to `put`, in order, and returns how many (the same as
    /// `poll_into`, without an array: `vfpoll_qpair_poll` writes into the caller's).
    pub(crate) fn poll_with(&self, max: usize, mut put: impl FnMut(vfpoll_completion)) -> usize {
        let mut reqs = self.reqs.borrow_mut();
        let mut n = 0;
        while n < max {
            let Some(c) = reqs.pending.pop_front() else { break };
            put(c);
            n += 1;
        }
        let mut qp = self.qp.borrow_mut();
        let r = &mut *reqs;
        qp.poll(max - n, |d: Done<Sub>| {
            let req = std::mem::take(&mut r.table[d.tag as usize]);
            r.free.push(d.tag as u32);
            let (result, status, nvme) = match &d.result {
                Ok(v) => (*v, 0, 0),
                Err(e) => (0, -nvme_errno(e), nvme_status(e)),
            };
            let lost = req.data.map(|b| b.give_back(d.buf)).unwrap_or(false);
            if let Some(m) = req.meta {
                m.give_back(d.meta);
            }
            let c = vfpoll_completion {
                tag: req.tag,
                result,
                status,
                nvme_status: nvme,
                buffer_lost: lost,
            };
            if n < max {
                put(c);
                n += 1;
            } else {
                r.pending.push_back(c);
            }
        });
        self.polls.set(self.polls.get() + 1);
        if n == 0 {
            self.empty_polls.set(self.empty_polls.get() + 1);
        }
        n
    }
}
