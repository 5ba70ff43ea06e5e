//! Off the hot path: commands past their timeout (asked to abort), a failed or vanished
//! controller (every request failed), and draining a queue pair.
//!
//! When to look is driven by elapsed time as well as by polls, whether or not anything is in
//! flight: a queue pair with nothing outstanding must still notice that its controller failed
//! (CSTS.CFS) or is gone (all-ones reads). Reading the clock at every poll would cost more than
//! the rest of an empty poll, so [`HealthClock`] counts polls (those that leave commands in
//! flight and those that find nothing: not one that reaped the last command, which shows the
//! controller working) and reads the clock every `every` of them, adapting `every` (1 to [`MAX_TICK_POLLS`]) so that clock reads come about every
//! [`TICK_GAP`] whatever the polling rate. At a clock read, a check is due
//! - with commands in flight: after [`MAX_TICK_POLLS`] polls (a fast poller: the same rhythm
//!   as counting polls alone, and no extra clock read, the check needs the time anyway) or
//!   [`BUSY_INTERVAL`];
//! - with nothing in flight: after [`IDLE_INTERVAL`].
//!
//! A queue pair polled at a steady rate thus notices a failed controller within
//! `IDLE_INTERVAL + TICK_GAP` when idle and `BUSY_INTERVAL + TICK_GAP` when busy (or one poll,
//! if polls are further apart than that); right after its polling slows down suddenly, within
//! [`MAX_TICK_POLLS`] polls at worst.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::slot::UNUSED;
use super::{Done, QueuePair};
use crate::buffer::IoBuffer;
use crate::ctrlr::Controller;
use crate::error::{NvmeError, Result};

/// Time between two health checks of a polled queue pair with nothing in flight: each reads
/// CSTS (one MMIO read, an exit to the hypervisor in a VM) and looks at asynchronous events.
pub(super) const IDLE_INTERVAL: Duration = Duration::from_millis(5);
/// Longest time between two health checks of a queue pair with commands in flight (a fast
/// poller checks every [`MAX_TICK_POLLS`] polls, far sooner).
pub(super) const BUSY_INTERVAL: Duration = Duration::from_millis(50);
/// The time between clock reads that [`HealthClock`] aims for.
pub(super) const TICK_GAP: Duration = Duration::from_millis(5);
/// Most polls between two clock reads, and polls between two checks of a busy queue pair.
pub(super) const MAX_TICK_POLLS: u32 = 256;

/// When a queue pair looks at the clock, and when it last checked its health. See the module
/// docs.
#[derive(Debug)]
pub(super) struct HealthClock {
    /// Polls left until the next clock read.
    countdown: u32,
    /// Polls between clock reads.
    every: u32,
    /// Polls counted at clock reads since the last check.
    since_check: u32,
    last_tick: Instant,
    last_check: Instant,
}

impl HealthClock {
    pub(super) fn new() -> Self {
        let now = Instant::now();
        HealthClock {
            countdown: 1,
            every: 1,
            since_check: 0,
            last_tick: now,
            last_check: now,
        }
    }

    /// Counts one poll; true when it is time for [`HealthClock::tick`]. The whole cost on the
    /// hot path: a decrement and a branch.
    #[inline(always)]
    pub(super) fn count_poll(&mut self) -> bool {
        self.countdown -= 1;
        self.countdown == 0
    }

    /// The clock read at `now`: adapts the polls between clock reads to the polling rate, and
    /// says whether a health check is due (`busy`: commands are in flight).
    pub(super) fn tick(&mut self, now: Instant, busy: bool) -> bool {
        let gap = now.saturating_duration_since(self.last_tick);
        self.last_tick = now;
        self.since_check = self.since_check.saturating_add(self.every);
        if gap > TICK_GAP {
            // Polls slowed down: shrink in proportion, so the next read comes about TICK_GAP on.
            let every = self.every as u128 * TICK_GAP.as_nanos() / gap.as_nanos().max(1);
            self.every = (every as u32).max(1);
        } else if gap < TICK_GAP / 4 {
            self.every = (self.every * 2).min(MAX_TICK_POLLS);
        }
        self.countdown = self.every;
        let waited = now.saturating_duration_since(self.last_check);
        let due = if busy {
            self.since_check >= MAX_TICK_POLLS || waited >= BUSY_INTERVAL
        } else {
            waited >= IDLE_INTERVAL
        };
        if due {
            self.last_check = now;
            self.since_check = 0;
        }
        due
    }

    #[cfg(test)]
    fn every(&self) -> u32 {
        self.every
    }
}

impl<B: IoBuffer> QueuePair<B> {
    /// Why the queue pair failed for good (its controller reported a fatal status or vanished,
    /// or a command stayed stuck after an abort), or `None` while it works. A failed queue pair
    /// refuses submissions with [`NvmeError::Failed`]; `poll` notices a failure within a few
    /// milliseconds of polling, whether or not anything is in flight.
    pub fn failed(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// A clock read from `poll`, and a health check when one is due.
    #[cold]
    #[inline(never)]
    pub(super) fn health_tick(&mut self, f: &mut impl FnMut(Done<B>)) -> usize {
        let now = Instant::now();
        if !self.health.tick(now, self.outstanding() != 0) || self.failed.is_some() {
            return 0;
        }
        self.check_health(now, f)
    }

    /// Timeouts and controller health, off the hot path.
    #[cold]
    pub(super) fn check_health(&mut self, now: Instant, f: &mut impl FnMut(Done<B>)) -> usize {
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
        let now = (now.saturating_duration_since(self.created).as_millis() as u32)
            .wrapping_add(1)
            .max(1);
        let timeout = self.timeout.as_millis().min(u32::MAX as u128 / 2) as u32;
        let mut timed_out = Vec::new();
        // With nothing in flight (an idle queue pair's check) there is nothing to time out.
        let live = if self.live == 0 {
            &mut [][..]
        } else {
            &mut self.slots[..]
        };
        for (rid, s) in live.iter_mut().enumerate() {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Ticks `n` times, `gap` apart from `t`; returns the time after and how many said a check
    /// was due.
    fn run(c: &mut HealthClock, mut t: Instant, gap: Duration, n: usize, busy: bool) -> (Instant, usize) {
        let mut due = 0;
        for _ in 0..n {
            t += gap;
            due += c.tick(t, busy) as usize;
        }
        (t, due)
    }

    #[test]
    fn fast_idle_polling_reads_the_clock_rarely() {
        let mut c = HealthClock::new();
        let t0 = c.last_tick;
        let (_, due) = run(&mut c, t0, Duration::from_micros(1), 20, false);
        assert_eq!(c.every(), MAX_TICK_POLLS);
        assert_eq!(due, 0, "20 µs is not a health interval");
    }

    #[test]
    fn fast_busy_polling_checks_every_max_tick_polls() {
        let mut c = HealthClock::new();
        let t0 = c.last_tick;
        let (t, _) = run(&mut c, t0, Duration::from_micros(1), 20, true);
        assert_eq!(c.every(), MAX_TICK_POLLS);
        // Now each tick is MAX_TICK_POLLS polls: a check at each, however little time passed.
        let (_, due) = run(&mut c, t, Duration::from_micros(1), 10, true);
        assert_eq!(due, 10);
    }

    #[test]
    fn slow_polling_reads_the_clock_at_every_poll() {
        let mut c = HealthClock::new();
        let t0 = c.last_tick;
        let (t, _) = run(&mut c, t0, Duration::from_micros(1), 20, false);
        assert_eq!(c.every(), MAX_TICK_POLLS);
        // Polls now come 10 ms apart: one tick after 256 of them, and from then on every poll.
        let (t, due) = run(&mut c, t, Duration::from_millis(2560), 1, false);
        assert_eq!((c.every(), due), (1, 1));
        let (_, due) = run(&mut c, t, Duration::from_millis(10), 5, false);
        assert_eq!(
            (c.every(), due),
            (1, 5),
            "every poll 10 ms apart is a health check"
        );
    }

    #[test]
    fn a_check_every_interval_at_a_steady_rate() {
        let mut c = HealthClock::new();
        let t0 = c.last_tick;
        // Ticks TICK_GAP apart keep `every` where it is (1); idle, a check every IDLE_INTERVAL.
        let (t, due) = run(&mut c, t0, TICK_GAP, 100, false);
        let want = (100 * TICK_GAP.as_micros() / IDLE_INTERVAL.as_micros()) as usize;
        assert!(due.abs_diff(want) <= 1, "{due} checks, want about {want}");
        assert_eq!(c.every(), 1);
        // Busy and slow: every BUSY_INTERVAL (single polls never add up to MAX_TICK_POLLS).
        let (_, due) = run(&mut c, t, TICK_GAP, 100, true);
        let want = (100 * TICK_GAP.as_micros() / BUSY_INTERVAL.as_micros()) as usize;
        assert!(due.abs_diff(want) <= 1, "{due} checks, want about {want}");
    }

    #[test]
    fn count_poll_fires_every_every_polls() {
        let mut c = HealthClock::new();
        let t0 = c.last_tick;
        run(&mut c, t0, Duration::from_nanos(10), 20, false);
        let mut fired = 0;
        for _ in 0..3 * MAX_TICK_POLLS {
            if c.count_poll() {
                fired += 1;
                c.countdown = c.every;
            }
        }
        assert_eq!(fired, 3);
    }
}
