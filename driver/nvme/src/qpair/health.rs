//! Off the hot path: commands past their timeout (asked to abort), a failed or vanished
//! controller (every request failed), and draining a queue pair.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::slot::UNUSED;
use super::{Done, QueuePair};
use crate::buffer::IoBuffer;
use crate::ctrlr::Controller;
use crate::error::{NvmeError, Result};

impl<B: IoBuffer> QueuePair<B> {
    /// Timeouts and controller health, off the hot path.
    #[cold]
    pub(super) fn check_health(&mut self, f: &mut impl FnMut(Done<B>)) -> usize {
        let s = crate::regs::Csts(self.ctrl.bar.read32(crate::regs::off::CSTS));
        if s.device_gone() || s.fatal() {
            let why = if s.device_gone() {
                NvmeError::DeviceGone
            } else {
                NvmeError::ControllerFatal { csts: s.0 }
            };
            return self.fail_all(why.to_string(), f);
        }
        // Asynchronous events (a namespace changed): handled here, without waiting, so a
        // busy queue pair's next submission sees the new namespace table.
        if let Err(e) = (Controller {
            shared: Arc::clone(&self.ctrl),
        })
        .process_events()
        {
            log::warn!(
                "queue {}: handling asynchronous events failed: {e}",
                self.ring.qid
            );
        }
        // Milliseconds since creation, plus one (0 means "not seen" in `Request::seen_ms`);
        // wrapping arithmetic keeps working past 49 days.
        let now = (self.created.elapsed().as_millis() as u32).wrapping_add(1).max(1);
        let timeout = self.timeout.as_millis().min(u32::MAX as u128 / 2) as u32;
        let mut timed_out = Vec::new();
        for (rid, s) in self.slots.iter_mut().enumerate() {
            let r = &mut s.req;
            if r.parts == 0 {
                continue;
            }
            if r.seen_ms == 0 {
                r.seen_ms = now;
            }
            if now.wrapping_sub(r.seen_ms) > timeout {
                timed_out.push((rid as u16, r.aborted));
                r.aborted = true;
                r.seen_ms = now;
            }
        }
        // Every part of those requests still in flight (a split request's other parts may have
        // completed, and their slots now belong to other requests).
        let mut expired = Vec::new();
        for (rid, already) in timed_out {
            for (slot, t) in self.slots.iter().enumerate() {
                if t.owner == rid {
                    expired.push((t.cid(slot as u16), already));
                }
            }
        }
        for (cid, already) in expired {
            if already {
                // Asked to abort one timeout ago and still nothing: the controller is not
                // processing this queue. Give up on it.
                let why = format!(
                    "command id {cid} on queue {} did not complete even after an abort",
                    self.ring.qid
                );
                return self.fail_all(why, f);
            }
            self.stats.aborts += 1;
            log::warn!(
                "queue {}: command id {cid} timed out after {:?}; aborting it",
                self.ring.qid,
                self.timeout
            );
            if let Err(e) = (Controller {
                shared: Arc::clone(&self.ctrl),
            })
            .abort(self.ring.qid, cid)
            {
                log::warn!("abort of command id {cid} failed: {e}");
            }
        }
        0
    }

    /// Completes every request with an error after an unrecoverable failure. The buffers are
    /// leaked, never returned: the device may still write into them.
    #[cold]
    fn fail_all(&mut self, why: String, f: &mut impl FnMut(Done<B>)) -> usize {
        log::error!(
            "queue {}: {why}; failing {} requests",
            self.ring.qid,
            self.outstanding()
        );
        self.failed = Some(why.clone());
        let mut n = 0;
        for t in self.slots.iter_mut() {
            t.owner = UNUSED;
        }
        for s in self.slots.iter_mut() {
            let req = &mut s.req;
            if req.parts != 0 {
                req.parts = 0;
                std::mem::forget(s.buf.take());
                std::mem::forget(s.meta.take());
                self.stats.errors += 1;
                n += 1;
                self.live -= 1;
                f(Done {
                    tag: req.tag,
                    result: Err(NvmeError::Failed(why.clone())),
                    buf: None,
                    meta: None,
                });
            }
        }
        n
    }

    /// Polls until every request in flight has completed or `timeout` passes; returns how many
    /// completed. For tests, teardown and simple synchronous use.
    pub fn drain(&mut self, timeout: Duration, mut f: impl FnMut(Done<B>)) -> Result<usize> {
        let start = Instant::now();
        let mut n = 0;
        while self.outstanding() != 0 {
            n += self.poll(usize::MAX, &mut f);
            if start.elapsed() > timeout {
                let cid = self
                    .slots
                    .iter()
                    .position(|s| s.req.parts != 0)
                    .map_or(0, |rid| self.slots[rid].cid(rid as u16));
                return Err(NvmeError::Timeout {
                    op: "drain",
                    qid: self.ring.qid,
                    cid,
                    timeout,
                });
            }
            std::hint::spin_loop();
        }
        Ok(n)
    }
}
