//! A controller reset as a queue pair sees it (the controller's side and the handshake are in
//! the crate's `reset` module): the queue pair notices that the controller's epoch moved on,
//! settles what was in flight, and re-creates its queues in place, on its own thread and
//! without blocking it.
//!
//! Settling, once the controller stopped (the epoch moved, so it is disabled, reset or gone):
//! 1. completions it posted before it stopped are delivered as usual;
//! 2. commands written but never announced by a doorbell are kept as they are: the controller
//!    never saw them;
//! 3. the SQ and CQ memory is zeroed (every phase tag 0), the ring state reset, the shadow
//!    doorbell and EventIdx words zeroed;
//! 4. every other request in flight is submitted again into the fresh SQ when
//!    [`super::QpairOptions::resubmit_on_reset`] allows it (a repeatable command, not already
//!    resubmitted once), or completes with [`NvmeError::Reset`] and its buffers.
//!
//! Nothing is announced until the queues exist again: once the epoch is even (the controller
//! runs), Create I/O CQ and Create I/O SQ go to the admin queue without waiting (a try-lock;
//! their completions are collected on later polls), under the same queue id and memory. Then
//! the doorbell rings for everything kept, resubmitted and submitted meanwhile.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::slot::UNUSED;
use super::{Done, QueuePair};
use crate::admin::Taken;
use crate::buffer::IoBuffer;
use crate::cmd::{Command, CommandExt as _};
use crate::cmd::{CQE_SIZE, SQE_SIZE};
use crate::ctrlr::reset::is_up;
use crate::error::NvmeError;

/// Where a queue pair's queues are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Queues {
    /// In the controller, since epoch `QueuePair::epoch`.
    Live,
    /// Lost with a reset: memory zeroed, requests in flight settled; not yet re-created.
    Down,
    /// Create I/O Completion Queue submitted (admin command id) for this epoch.
    CreatingCq { cid: u16, epoch: u64 },
    /// Create I/O Submission Queue submitted (the CQ exists) for this epoch.
    CreatingSq { cid: u16, epoch: u64 },
}

/// How long a re-creation step may spin for its admin command before leaving it to a later
/// poll: short, a poll must stay short.
const CREATE_SPIN: Duration = Duration::from_micros(200);

impl<B: IoBuffer> QueuePair<B> {
    /// Whether the controller is still the one the queues were created in (one load): the
    /// check before any doorbell.
    #[inline(always)]
    pub(super) fn current(&self) -> bool {
        self.ctrl.reset.epoch.load(Ordering::Acquire) == self.epoch
    }

    /// Whether a reset took the queues away and they are not back yet.
    pub fn resetting(&self) -> bool {
        self.failed.is_none() && (self.queues != Queues::Live || !self.current())
    }

    /// The epoch moved: settle and re-create (see the module docs). Returns the requests
    /// completed.
    #[cold]
    #[inline(never)]
    pub(super) fn recover(&mut self, f: &mut impl FnMut(Done<B>)) -> usize {
        if self.failed.is_some() {
            return 0;
        }
        let mut n = 0;
        if self.queues == Queues::Live && !self.current() {
            if let Some(fl) = self.ctrl.reset.failure() {
                // The controller may still write into the buffers: they are never given back.
                let (why, stopped) = (fl.why.clone(), fl.dma_stopped);
                if !stopped {
                    return self.fail_all(why, false, f);
                }
                // Failed for good and stopped (removed, vanished): what it completed before it
                // stopped is delivered, the rest fails with the failure's error, not as a reset
                // that invites a resubmission (removal.rs).
                let (n, _) = self.reap(usize::MAX, f);
                return n + self.fail_all(why, true, f);
            }
            n += self.settle(f);
        }
        if let Some(fl) = self.ctrl.reset.failure() {
            let (why, stopped) = (fl.why.clone(), fl.dma_stopped);
            return n + self.fail_all(why, stopped, f);
        }
        if self.queues != Queues::Live {
            self.recreate();
        }
        n
    }

    /// Steps 1-4 of the module docs.
    fn settle(&mut self, f: &mut impl FnMut(Done<B>)) -> usize {
        let (mut n, _) = self.reap(usize::MAX, f);
        let qid = self.ring.qid;
        // Written, never announced: kept, in order.
        let unsent: Vec<[u64; 8]> = (1..=self.ring.unrung)
            .rev()
            .map(|k| self.mem.read_sqe(self.ring.slot_back(&self.mem, k)))
            .collect();
        let unsent_cids: Vec<u16> = unsent.iter().map(|w| (w[0] >> 16) as u16).collect();
        let entries = self.ring.entries as usize;
        let sq_bytes = (entries * SQE_SIZE).next_multiple_of(crate::ctrlr::PAGE_SIZE);
        let cq_bytes = (entries * CQE_SIZE).next_multiple_of(crate::ctrlr::PAGE_SIZE);
        if self.sq_cmb.is_none() {
            self.mem.zero(0, sq_bytes);
        }
        self.mem.zero(sq_bytes, cq_bytes);
        self.ring.reset(&mut self.mem);
        self.aborts.clear();
        let mut requeued = 0u64;
        for rid in 0..self.slots.len() {
            let req = self.slots[rid].req;
            if req.parts == 0 {
                continue;
            }
            let mine = |s: &super::slot::Slot<B>| s.owner == rid as u16;
            let sent = self
                .slots
                .iter()
                .enumerate()
                .any(|(i, s)| mine(s) && !unsent_cids.contains(&s.cid(i as u16)));
            if !sent {
                continue;
            }
            if !self.saved.is_empty() && req.op.repeatable() && !req.resubmitted {
                for i in 0..self.slots.len() {
                    if mine(&self.slots[i]) {
                        let words = self.saved[i];
                        self.ring.push(&mut self.mem, &words);
                    }
                }
                let r = &mut self.slots[rid].req;
                r.resubmitted = true;
                r.aborted = false;
                r.seen_ms = 0;
                requeued += 1;
                continue;
            }
            for i in 0..self.slots.len() {
                if i != rid && mine(&self.slots[i]) {
                    self.free_cids.push(i as u16);
                }
                if mine(&self.slots[i]) {
                    self.slots[i].owner = UNUSED;
                }
            }
            let s = &mut self.slots[rid];
            s.req.parts = 0;
            let (buf, meta) = (s.buf.take(), s.meta.take());
            self.free_cids.push(rid as u16);
            self.live -= 1;
            self.stats.errors += 1;
            self.stats.reset_errors += 1;
            n += 1;
            f(Done {
                tag: req.tag,
                result: Err(NvmeError::Reset {
                    op: req.op.name(),
                    qid,
                }),
                buf,
                meta,
            });
        }
        for w in &unsent {
            self.ring.push(&mut self.mem, w);
        }
        // Until the queues are back, every doorbell goes through the MMIO path's epoch check
        // (which keeps the commands unrung) and so brings the next poll here.
        self.parked_shadow = self.ring.detach_shadow();
        self.stats.resubmitted += requeued;
        self.stats.resets += 1;
        self.queues = Queues::Down;
        log::info!(
            "queue {qid}: controller reset; {n} request(s) completed, {requeued} to submit again, {} kept unsent",
            unsent.len()
        );
        n
    }

    /// Advances the re-creation of the queues as far as it goes without waiting (a try-lock
    /// of the admin queue, a short spin for each step).
    fn recreate(&mut self) {
        let sh = std::sync::Arc::clone(&self.ctrl);
        let Ok(mut guard) = sh.admin.try_lock() else {
            return;
        };
        let Some(q) = guard.as_mut() else { return };
        // Under the admin lock the epoch holds still: a reset keeps the lock throughout.
        let now = sh.reset.epoch.load(Ordering::Acquire);
        if !is_up(now) || sh.reset.failure().is_some() {
            return;
        }
        let qid = self.ring.qid;
        let entries = self.ring.entries as u32;
        let timeout = sh.opts.admin_timeout;
        for _ in 0..3 {
            match self.queues {
                Queues::Live => return,
                Queues::Down => {
                    let sq_bytes = (entries as usize * SQE_SIZE).next_multiple_of(crate::ctrlr::PAGE_SIZE);
                    let cq_bus = self.mem.bus(sq_bytes);
                    let cmd = match &self.irq {
                        Some(i) => {
                            crate::ctrlr::Controller {
                                shared: std::sync::Arc::clone(&sh),
                            }
                            .unmask_vector(i.vector());
                            Command::create_io_cq_irq(qid, entries, cq_bus, i.vector())
                        }
                        None => Command::create_io_cq(qid, entries, cq_bus),
                    };
                    match q.submit("Create I/O Completion Queue", cmd) {
                        Ok(cid) => self.queues = Queues::CreatingCq { cid, epoch: now },
                        Err(e) => {
                            log::warn!("queue {qid}: re-creating the CQ after a reset: {e}");
                            return;
                        }
                    }
                }
                Queues::CreatingCq { cid, epoch } | Queues::CreatingSq { cid, epoch } => {
                    let sq_step = matches!(self.queues, Queues::CreatingSq { .. });
                    if epoch != now {
                        // Another reset since: the controller forgot the queue.
                        self.queues = Queues::Down;
                        continue;
                    }
                    let spin_until = Instant::now() + CREATE_SPIN;
                    let taken = loop {
                        match q.take(cid) {
                            Taken::Running(_) if Instant::now() < spin_until => std::hint::spin_loop(),
                            t => break t,
                        }
                    };
                    match taken {
                        Taken::Running(waited) => {
                            if waited > timeout {
                                q.forget(cid);
                                self.queues = Queues::Down;
                                let why = format!(
                                    "re-creating queue {qid} after a reset: Create I/O {} Queue did not complete within {timeout:?}",
                                    if sq_step { "Submission" } else { "Completion" }
                                );
                                drop(guard);
                                sh.request_reset(why, now);
                            }
                            return;
                        }
                        Taken::Lost => self.queues = Queues::Down,
                        Taken::Done(c) if !c.status().is_success() => {
                            let op = if sq_step {
                                "Create I/O Submission Queue"
                            } else {
                                "Create I/O Completion Queue"
                            };
                            let e = NvmeError::Status {
                                op,
                                status: c.status(),
                            };
                            if sq_step {
                                if let Ok(d) =
                                    q.submit("Delete I/O Completion Queue", Command::delete_io_cq(qid))
                                {
                                    q.forget(d);
                                }
                            }
                            self.queues = Queues::Down;
                            self.hot = super::submit::HotNs::NONE;
                            self.failed = Some(format!(
                                "queue {qid} could not be re-created after a controller reset: {e}"
                            ));
                            return;
                        }
                        Taken::Done(_) if !sq_step => {
                            let sq_bus = self.sq_cmb.as_ref().map_or(self.mem.bus(0), |s| s.bus_addr());
                            let cmd = Command::create_io_sq(qid, entries, sq_bus, qid);
                            match q.submit("Create I/O Submission Queue", cmd) {
                                Ok(cid) => self.queues = Queues::CreatingSq { cid, epoch: now },
                                Err(e) => {
                                    log::warn!("queue {qid}: re-creating the SQ after a reset: {e}");
                                    return;
                                }
                            }
                        }
                        Taken::Done(_) => {
                            self.queues = Queues::Live;
                            self.epoch = now;
                            let shadow = self.parked_shadow.take();
                            self.ring.attach_shadow(shadow);
                            drop(guard);
                            log::info!("queue {qid}: re-created after the controller reset");
                            // Everything kept, resubmitted and submitted meanwhile.
                            self.flush_submissions();
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Completes every request with [`NvmeError::Failed`] after the controller was declared
    /// failed. Buffers go back when the controller can no longer write to them
    /// (`dma_stopped`); otherwise they are leaked, never freed under a device that may write.
    #[cold]
    pub(super) fn fail_all(&mut self, why: String, dma_stopped: bool, f: &mut impl FnMut(Done<B>)) -> usize {
        log::error!(
            "queue {}: {why}; failing {} requests",
            self.ring.qid,
            self.outstanding()
        );
        self.failed = Some(why.clone());
        self.hot = super::submit::HotNs::NONE;
        let mut n = 0;
        for t in self.slots.iter_mut() {
            t.owner = UNUSED;
        }
        for s in self.slots.iter_mut() {
            let req = &mut s.req;
            if req.parts != 0 {
                req.parts = 0;
                let (buf, meta) = if dma_stopped {
                    (s.buf.take(), s.meta.take())
                } else {
                    std::mem::forget(s.buf.take());
                    std::mem::forget(s.meta.take());
                    (None, None)
                };
                self.stats.errors += 1;
                n += 1;
                self.live -= 1;
                f(Done {
                    tag: req.tag,
                    // NvmeError::Removed once the device was removed (removal.rs).
                    result: Err(self.ctrl.failed_error(&why)),
                    buf,
                    meta,
                });
            }
        }
        self.free_cids = (0..self.slots.len() as u16).rev().collect();
        self.ring.unrung = 0;
        n
    }
}
