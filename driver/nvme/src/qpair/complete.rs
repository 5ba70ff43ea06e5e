//! Completions: the polled hot path that hands finished requests back with their buffers.

use super::slot::{SLOT_MASK, UNUSED};
use super::{Done, QueuePair};
use crate::buffer::IoBuffer;
use crate::cmd::Completion;
use crate::error::NvmeError;
use crate::queue::Rung;

impl<B: IoBuffer> QueuePair<B> {
    /// Rings the submission doorbell, then delivers up to `max` completed requests to `f` and
    /// rings the completion doorbell once. Returns how many requests completed.
    ///
    /// Also detects, within a few milliseconds of polling (busy or idle), commands past their
    /// timeout (asks the controller to abort them, without waiting), a controller that reports
    /// a fatal status (asks for a reset) and one that reads all-ones (fails every request and
    /// the queue pair: see [`QueuePair::failed`]).
    ///
    /// After a controller reset ([`crate::Controller::reset`]) it also settles the requests
    /// the reset interrupted (each completes with [`NvmeError::Reset`] and its buffers, or is
    /// submitted again) and re-creates the queues, without blocking.
    #[inline]
    pub fn poll(&mut self, max: usize, mut f: impl FnMut(Done<B>)) -> usize {
        // No doorbell for a controller that was reset since the queues were created: settle and
        // re-create first.
        if self.ring.unrung != 0 && self.ring_submissions() == Rung::Stale {
            return self.recover(&mut f);
        }
        // A poll that consumes nothing (an empty one, or `max` 0) ends apart: past this point at
        // least one entry was consumed.
        let first = if max != 0 {
            self.ring.pop(&mut self.mem)
        } else {
            None
        };
        let Some(c) = first else {
            return self.poll_end(0, false, &mut f);
        };
        let (delivered, _, last) = self.reap_from(c, max, true, &mut f);
        if last {
            // The last command in flight: no health count (`poll_end`), proof that the
            // controller works, with nothing left to time out.
            self.release_cq();
            return delivered;
        }
        self.poll_end(delivered, true, &mut f)
    }

    /// The one loop that reaps completions, for `poll` and (after a reset, `recover.rs`)
    /// `reap`: consumes entries from `c` on and delivers each finished request to `f`, until
    /// `max` are delivered or the next entry is not posted; with `stop_when_idle`, also as
    /// soon as the last request in flight is delivered. Returns the requests delivered, the
    /// entries consumed, and whether it stopped for the last request in flight. Rings no
    /// doorbell.
    ///
    /// No more requests can complete than are in flight: `poll` stops once the last one is
    /// delivered without looking at the next entry (at QD1 that look was a fifth of the poll;
    /// the test is on the count just decremented). An entry for no request (`bogus`: a
    /// duplicate, a stray id) is consumed when it comes before a real one, or by a poll with
    /// nothing in flight, which looks as far as `max`.
    #[inline(always)]
    fn reap_from<F: FnMut(Done<B>)>(
        &mut self,
        mut c: Completion,
        max: usize,
        stop_when_idle: bool,
        f: &mut F,
    ) -> (usize, u32, bool) {
        let mut delivered = 0;
        let mut consumed = 0u32;
        loop {
            consumed += 1;
            'entry: {
                let slot = (c.cid & SLOT_MASK) as usize;
                let gen = c.cid & !SLOT_MASK;
                let Some(t) = self
                    .slots
                    .get_mut(slot)
                    .filter(|t| t.owner != UNUSED && t.gen == gen)
                else {
                    let [dw0, dw1, dw2, dw3] = c.to_dwords();
                    self.bogus(dw0, dw1, dw2, dw3);
                    break 'entry;
                };
                let rid = t.owner as usize;
                t.owner = UNUSED;
                let s = if slot == rid {
                    t
                } else {
                    // Another part of a split request: its slot is free now; the request's own
                    // slot (its first part's) stays taken until the whole request completes.
                    self.free_cids.push(slot as u16);
                    &mut self.slots[rid]
                };
                let st = c.status();
                let req = &mut s.req;
                debug_assert!(req.parts != 0, "slot points at a live request");
                if !st.is_success() && req.error.is_success() {
                    req.error = st;
                }
                req.parts -= 1;
                if req.parts == 0 {
                    delivered += 1;
                    if req.error.is_success() {
                        let tag = req.tag;
                        let buf = s.buf.take();
                        // Most requests have no metadata buffer: a look, no move.
                        let meta = if s.meta.is_some() { s.meta.take() } else { None };
                        self.free_cids.push(rid as u16);
                        self.live -= 1;
                        // DW0 of the part that completed last (a split request's parts all
                        // carry the same command, so any part's DW0 would do).
                        f(Done {
                            tag,
                            result: Ok(c.dw0 as u64 | (c.dw1 as u64) << 32),
                            buf,
                            meta,
                        });
                    } else {
                        // Out of line, taking the buffers out of the slot itself: with one call
                        // of `f` here the caller's closure is inlined, a `Done` that can only be
                        // `Ok` never goes through memory (the error variant is large), and
                        // neither does the buffer handed to it.
                        self.deliver_error(rid, f);
                    }
                    if stop_when_idle && self.live == 0 {
                        return (delivered, consumed, true);
                    }
                }
            }
            if delivered >= max {
                break;
            }
            match self.ring.pop(&mut self.mem) {
                Some(next) => c = next,
                None => break,
            }
        }
        (delivered, consumed, false)
    }

    /// The end of a poll that did not deliver the last request in flight (`consumed`: whether
    /// it consumed an entry): the completion doorbell, the health count.
    #[inline(always)]
    fn poll_end(&mut self, mut delivered: usize, consumed: bool, f: &mut impl FnMut(Done<B>)) -> usize {
        self.release_cq();
        // Every few polls, a look at the clock; every few milliseconds, one for commands past
        // their deadline and a failed, reset or vanished controller (`health.rs`). Counted:
        // polls with commands still in flight, and empty polls (so an idle queue pair notices
        // too). Not counted: a poll that reaped the last command in flight (`poll` returns
        // before this).
        if (!consumed || self.outstanding() != 0) && self.health.count_poll() {
            delivered += self.health_tick(f);
        }
        delivered
    }

    /// The completion-queue head doorbell is deferred: consumed entries are released in
    /// batches (one MMIO write per many completions, which matters most at low queue depth).
    /// It is rung as soon as released-but-unannounced entries plus commands in flight could
    /// fill half the queue, so the controller always has room to post (this check runs at
    /// every poll, busy or not, so a controller waiting for room is never left waiting).
    #[inline(always)]
    fn release_cq(&mut self) {
        let unacked = self.ring.unacked as usize;
        // unacked + taken >= R, as one compare (`cq_release_bias`), then the rare rest.
        if unacked + self.cq_release_bias >= self.free_cids.len() && unacked != 0 && self.current() {
            if self.ring.ring_cq(&self.mem) {
                self.stats.cq_doorbells += 1;
            } else {
                self.stats.shadow_only += 1;
            }
        }
    }

    /// Delivers up to `max` completed requests to `f`; returns them and the completion entries
    /// consumed. Rings no doorbell. `poll`'s loop, out of line: for settling after a reset.
    #[cold]
    #[inline(never)]
    pub(super) fn reap(&mut self, max: usize, f: &mut impl FnMut(Done<B>)) -> (usize, u32) {
        let first = if max != 0 {
            self.ring.pop(&mut self.mem)
        } else {
            None
        };
        match first {
            Some(c) => {
                let (delivered, consumed, _) = self.reap_from(c, max, false, f);
                (delivered, consumed)
            }
            None => (0, 0),
        }
    }

    /// Delivers the request in slot `rid`, whose last command just completed and which failed
    /// (counted): takes its buffers out of the slot and frees the slot, as the success path of
    /// `reap_from` does.
    #[cold]
    #[inline(never)]
    fn deliver_error(&mut self, rid: usize, f: &mut impl FnMut(Done<B>)) {
        let s = &mut self.slots[rid];
        let (tag, status, op) = (s.req.tag, s.req.error, s.req.op);
        let buf = s.buf.take();
        let meta = s.meta.take();
        self.free_cids.push(rid as u16);
        self.live -= 1;
        self.stats.errors += 1;
        f(Done {
            tag,
            result: Err(NvmeError::Status {
                op: op.name(),
                status,
            }),
            buf,
            meta,
        });
    }

    /// A completion for no command in flight: counted and logged. It takes the entry's dwords
    /// as four scalars: a `Completion` passed by value goes through memory, and the compiler
    /// then stored every entry on the stack in the hot loop, in case it turned out bogus.
    #[cold]
    #[inline(never)]
    fn bogus(&mut self, dw0: u32, dw1: u32, dw2: u32, dw3: u32) {
        let c = Completion::from_dwords([dw0, dw1, dw2, dw3]);
        self.stats.bogus_completions += 1;
        log::error!(
            "queue {}: completion for command id {} which is not in flight: {c:?}",
            self.ring.qid,
            c.cid
        );
    }
}
