//! Off the hot path: commands past their timeout (asked to abort, without waiting: the Abort
//! is collected at a later check), a fatal or vanished controller (a reset asked for, or every
//! request failed), a reset that took the queues (`recover.rs`), and draining a queue pair.
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

use super::{Done, QueuePair};
use crate::admin::Taken;
use crate::buffer::IoBuffer;
use crate::clock::CoarseClock;
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
    /// When the last check read CSTS, and the queue pair's completion count then (see
    /// [`QueuePair::check_health`]).
    csts_at: Instant,
    csts_completions: u64,
    /// What "now" is read from: a clock that never reads the clocksource (`clock.rs`).
    clock: CoarseClock,
}

impl HealthClock {
    pub(super) fn new() -> Self {
        let clock = CoarseClock::new();
        let now = clock.now();
        HealthClock {
            clock,
            countdown: 1,
            every: 1,
            since_check: 0,
            last_tick: now,
            last_check: now,
            csts_at: now,
            csts_completions: 0,
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
    /// Why the queue pair failed for good (its controller was declared failed: it vanished, or
    /// resets gave up on it; or its queues could not be re-created after a reset), or `None`
    /// while it works. A failed queue pair refuses submissions with [`NvmeError::Failed`];
    /// `poll` notices a failure within a few milliseconds of polling, whether or not anything
    /// is in flight.
    pub fn failed(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// Sets the timeout of the queue pair's commands from now on (those in flight included):
    /// after it a command is asked to abort, after twice it the controller is reset.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Gives the request in flight with `tag` a timeout of its own (1 ms to 65 s) instead of
    /// the queue pair's. Returns whether such a request was found. A lookup among the requests
    /// in flight: for the few commands that need it (a flush that may take long, a read that
    /// must not).
    pub fn set_request_timeout(&mut self, tag: u64, timeout: Duration) -> bool {
        let ms = timeout.as_millis().clamp(1, u16::MAX as u128) as u16;
        match self
            .slots
            .iter_mut()
            .find(|s| s.req.parts != 0 && s.req.tag == tag)
        {
            Some(s) => {
                s.req.limit_ms = ms;
                true
            }
            None => false,
        }
    }

    /// A clock read from `poll`, and a health check when one is due.
    #[cold]
    #[inline(never)]
    pub(super) fn health_tick(&mut self, f: &mut impl FnMut(Done<B>)) -> usize {
        let now = self.health.clock.now();
        let due = self.health.tick(now, self.outstanding() != 0);
        if self.failed.is_some() {
            return 0;
        }
        if !self.current() || self.queues != super::recover::Queues::Live {
            // A reset took the queues: settle and re-create, at every clock read.
            return self.recover(f);
        }
        if !due {
            return 0;
        }
        self.check_health(now, f)
    }

    /// Timeouts and controller health, off the hot path.
    #[cold]
    pub(super) fn check_health(&mut self, now: Instant, f: &mut impl FnMut(Done<B>)) -> usize {
        let epoch = self.epoch;
        // CSTS costs an MMIO read (a round trip over PCIe, an exit to the hypervisor in a VM,
        // where it also contends with the emulated controller for the emulator's lock): a busy
        // queue pair polled fast checks every MAX_TICK_POLLS polls, tens of thousands of times
        // a second. A queue pair that reaped completions since the last read has seen the
        // controller working (after CFS, or once the device is gone, nothing completes), so
        // the read waits until completions stop or IDLE_INTERVAL passed; timeouts are still
        // scanned at every check.
        let completions = self.ring.consumed();
        let h = &mut self.health;
        if completions == h.csts_completions || now.saturating_duration_since(h.csts_at) >= IDLE_INTERVAL {
            h.csts_at = now;
            h.csts_completions = completions;
            let s = crate::regs::Csts(self.ctrl.bar.read32(crate::regs::off::CSTS));
            if s.device_gone() {
                // Nothing answers: a vanished device no longer writes to memory either.
                self.ctrl.fail(NvmeError::DeviceGone.to_string(), true);
                return self.recover(f);
            }
            if s.fatal() {
                // Only a reset clears CFS: asked for here, done on the recovery thread; this
                // queue pair settles once the controller is disabled.
                let why = NvmeError::ControllerFatal { csts: s.0 }.to_string();
                self.ctrl.request_reset(why, epoch);
                return 0;
            }
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
        if !self.aborts.is_empty() && self.collect_aborts() {
            return 0;
        }
        self.check_timeouts(now, epoch)
    }

    /// Commands past their timeout: asked to abort (without waiting), or, when an abort was
    /// asked for one timeout ago, a reset.
    fn check_timeouts(&mut self, now: Instant, epoch: u64) -> usize {
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
            let limit = if r.limit_ms != 0 {
                r.limit_ms as u32
            } else {
                timeout
            };
            if now.wrapping_sub(r.seen_ms) > limit {
                timed_out.push((rid as u16, r.aborted));
                r.aborted = true;
                r.seen_ms = now;
            }
        }
        if timed_out.is_empty() {
            return 0;
        }
        // Every part of those requests still in flight (a split request's other parts may have
        // completed, and their slots now belong to other requests).
        let mut expired = Vec::new();
        for &(rid, already) in &timed_out {
            for (slot, t) in self.slots.iter().enumerate() {
                if t.owner == rid {
                    expired.push((rid, t.cid(slot as u16), already));
                }
            }
        }
        let qid = self.ring.qid;
        if let Some(&(_, cid, _)) = expired.iter().find(|e| e.2) {
            // Asked to abort one timeout ago and still nothing: the controller is not
            // processing this queue. Only a reset gets the commands back.
            let why = format!("command id {cid} on queue {qid} did not complete even after an abort");
            self.ctrl.request_reset(why, epoch);
            return 0;
        }
        // Aborts go to the admin queue without waiting (a try-lock; at most ACL + 1 running
        // on the controller); what does not go now is tried again at the next check.
        let acl = self.ctrl.identify.acl as usize + 1;
        let sh = Arc::clone(&self.ctrl);
        let mut guard = sh.admin.try_lock().ok();
        for (rid, cid, _) in expired {
            let sent = match guard.as_mut().and_then(|g| g.as_mut()) {
                Some(q) if q.aborts_running() < acl => {
                    match q.submit("Abort", crate::cmd::Command::abort(qid, cid)) {
                        Ok(acid) => {
                            self.aborts.push((acid, cid));
                            true
                        }
                        Err(e) => {
                            log::warn!("queue {qid}: abort of command id {cid} not submitted: {e}");
                            false
                        }
                    }
                }
                _ => false,
            };
            if sent {
                self.stats.aborts += 1;
                log::warn!(
                    "queue {qid}: command id {cid} timed out after {:?}; aborting it",
                    self.timeout
                );
            } else {
                // Not asked yet: asked at a later check (the request is not marked aborted).
                self.slots[rid as usize].req.aborted = false;
            }
        }
        0
    }

    /// Collects the Aborts that completed (NVMe Base 2.0 §5.1). Returns whether a reset was
    /// asked for: an Abort that failed (other than for the abort limit) or did not complete
    /// within the admin timeout.
    #[cold]
    fn collect_aborts(&mut self) -> bool {
        let sh = Arc::clone(&self.ctrl);
        let Ok(mut guard) = sh.admin.try_lock() else {
            return false;
        };
        let Some(q) = guard.as_mut() else { return false };
        let qid = self.ring.qid;
        let limit = sh.opts.admin_timeout;
        let mut why = None;
        self.aborts.retain(|&(acid, cid)| match q.take(acid) {
            Taken::Running(waited) if waited > limit => {
                q.forget(acid);
                why = Some(format!(
                    "the Abort of command id {cid} on queue {qid} did not complete within {limit:?}"
                ));
                false
            }
            Taken::Running(_) => true,
            Taken::Lost => false,
            Taken::Done(c) => {
                let st = c.status();
                if st.is_success() {
                    if c.dw0 & 1 != 0 {
                        log::warn!("queue {qid}: the controller did not abort command id {cid}");
                    }
                } else if st.sct() == crate::status::Sct::CommandSpecific && st.sc() == 0x03 {
                    // Abort Command Limit Exceeded (§5.1).
                    log::warn!("queue {qid}: abort of command id {cid} refused (abort limit); retried at the next timeout");
                } else {
                    why = Some(format!(
                        "the Abort of command id {cid} on queue {qid} failed: {st}"
                    ));
                }
                false
            }
        });
        drop(guard);
        match why {
            Some(w) => {
                sh.request_reset(w, self.epoch);
                true
            }
            None => false,
        }
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
