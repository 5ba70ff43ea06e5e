//! The queue-depth-1 latency breakdown: where the time of one I/O goes, from clock stamps
//! taken on the worker at five points of its life (only with [`crate::JobSpec::breakdown`]).
//!
//! 1. **submit**: just before the worker hands the command to the queue pair
//!    (`QueuePair::read`/`write`; the LBA and slot are chosen by then);
//! 2. **doorbell rung**: when `QueuePair::flush_submissions` has returned (the SQ tail doorbell
//!    written: an MMIO write, or a shadow doorbell update plus an MMIO write when the
//!    controller's EventIdx asks for one);
//! 3. **completion seen**: the start of the `QueuePair::poll` call that returned it. The driver
//!    reads the completion queue entry first thing in that call, so this is when the entry was
//!    first looked at and found; the time before it includes up to one empty poll;
//! 4. **callback**: when the driver calls the worker's completion callback for it (after
//!    the phase check, the copy of the entry and the request's slot lookup);
//! 5. the **next submit** (stamp 1 of the next I/O): the rest of the poll (CQ head doorbell
//!    when due, health checks), the worker's latency record and its choice of the next I/O.
//!
//! So the four segments add up to one I/O's full cycle at queue depth 1 (1 / IOPS). Stamps
//! come from the engine's [`Clock`]: the TSC where it is usable (the worker is pinned, and an
//! I/O is stamped on one thread only), otherwise `std::time::Instant` (`CLOCK_MONOTONIC`).
//!
//! The stamps are a type parameter of the worker's hot loop (`Stamps`): a run without the
//! breakdown uses `Off`, whose methods are empty and inlined, so its loop is the same code as
//! without this module. With more than one I/O in flight per queue pair the segments would
//! interleave, so [`crate::Engine::start`] refuses the breakdown at any other queue depth.

use hdrhistogram::Histogram;

use crate::clock::Clock;
use crate::histogram::new_histogram;

/// The four segments of each I/O (nanoseconds), over all I/Os of a run.
#[derive(Debug, Clone)]
pub struct Breakdown {
    /// The stamps' clock: `"tsc"` or `"monotonic"` (see [`Clock::name`]).
    pub clock: &'static str,
    /// Submit to doorbell rung: the driver's submission path and the doorbell write.
    pub submit_to_doorbell: Histogram<u64>,
    /// Doorbell rung to completion seen: the device, plus the poll loop's granularity.
    pub doorbell_to_seen: Histogram<u64>,
    /// Completion seen to callback: the driver's completion path up to the callback.
    pub seen_to_callback: Histogram<u64>,
    /// Callback to the next submit: the rest of the poll (CQ doorbell, health checks) and the
    /// worker's own bookkeeping between two I/Os.
    pub callback_to_submit: Histogram<u64>,
}

impl Breakdown {
    /// Empty, for stamps from `clock`.
    pub fn new(clock: &Clock) -> Self {
        Breakdown {
            clock: clock.name(),
            submit_to_doorbell: new_histogram(),
            doorbell_to_seen: new_histogram(),
            seen_to_callback: new_histogram(),
            callback_to_submit: new_histogram(),
        }
    }

    /// The segments with their names, in the order of an I/O's life.
    pub fn segments(&self) -> [(&'static str, &Histogram<u64>); 4] {
        [
            ("submit_to_doorbell", &self.submit_to_doorbell),
            ("doorbell_to_completion_seen", &self.doorbell_to_seen),
            ("completion_seen_to_callback", &self.seen_to_callback),
            ("callback_to_next_submit", &self.callback_to_submit),
        ]
    }

    /// Adds `other` into `self`.
    pub fn merge(&mut self, other: &Breakdown) {
        for (a, b) in [
            (&mut self.submit_to_doorbell, &other.submit_to_doorbell),
            (&mut self.doorbell_to_seen, &other.doorbell_to_seen),
            (&mut self.seen_to_callback, &other.seen_to_callback),
            (&mut self.callback_to_submit, &other.callback_to_submit),
        ] {
            a.add(b).expect("histograms of the same bounds add");
        }
    }
}

/// Hooks of the worker's hot loop at the points of the module docs; each reads the clock
/// itself (or does nothing).
pub(crate) trait Stamps: Send + 'static {
    /// Stamps of a new queue pair's I/O, timed by `clock`.
    fn new(clock: &Clock) -> Self;
    /// An I/O is about to be handed to the queue pair.
    fn submitting(&mut self);
    /// `flush_submissions` returned.
    fn rang(&mut self);
    /// A poll is about to start.
    fn polling(&mut self);
    /// The completion callback of an I/O runs.
    fn called_back(&mut self);
    /// What was measured so far.
    fn report(&self) -> Option<Breakdown>;
}

/// No breakdown: every hook is empty and inlined away.
pub(crate) struct Off;

impl Stamps for Off {
    #[inline(always)]
    fn new(_: &Clock) -> Self {
        Off
    }
    #[inline(always)]
    fn submitting(&mut self) {}
    #[inline(always)]
    fn rang(&mut self) {}
    #[inline(always)]
    fn polling(&mut self) {}
    #[inline(always)]
    fn called_back(&mut self) {}
    fn report(&self) -> Option<Breakdown> {
        None
    }
}

/// Where the I/O being stamped is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    /// None in flight (or its stamps are done).
    Idle,
    /// Handed to the queue pair at this tick.
    Submitted(u64),
    /// Submitted at the first tick, its doorbell rung at the second.
    Rang(u64, u64),
}

/// The breakdown of one queue pair's I/Os (queue depth 1).
pub(crate) struct On {
    clock: Clock,
    at: At,
    /// The start of the latest poll.
    poll: u64,
    /// The previous I/O's callback, until the next submit.
    callback: Option<u64>,
    b: Breakdown,
}

impl On {
    fn submitting_at(&mut self, t: u64) {
        if let Some(c) = self.callback.take() {
            let ns = self.clock.ns(t.wrapping_sub(c));
            self.b.callback_to_submit.saturating_record(ns);
        }
        self.at = At::Submitted(t);
    }

    fn rang_at(&mut self, t: u64) {
        // A flush with nothing new submitted (or a second one) rings nothing for this I/O.
        if let At::Submitted(s) = self.at {
            self.at = At::Rang(s, t);
        }
    }

    fn called_back_at(&mut self, t: u64) {
        let At::Rang(s, r) = self.at else {
            // A completion of an I/O that was not stamped whole (a refused submission, a zone
            // command): no segments.
            return;
        };
        let ns = |a: u64, b: u64| self.clock.ns(b.wrapping_sub(a));
        // The poll that found it started after the doorbell (the loop polls only after its
        // flush); the floor keeps a segment from wrapping should that ever change.
        let seen = self.poll.max(r);
        let (sr, rs, sc) = (ns(s, r), ns(r, seen), ns(seen, t.max(seen)));
        self.b.submit_to_doorbell.saturating_record(sr);
        self.b.doorbell_to_seen.saturating_record(rs);
        self.b.seen_to_callback.saturating_record(sc);
        self.callback = Some(t);
        self.at = At::Idle;
    }
}

impl Stamps for On {
    fn new(clock: &Clock) -> Self {
        On {
            clock: *clock,
            at: At::Idle,
            poll: 0,
            callback: None,
            b: Breakdown::new(clock),
        }
    }
    #[inline]
    fn submitting(&mut self) {
        self.submitting_at(self.clock.ticks());
    }
    #[inline]
    fn rang(&mut self) {
        self.rang_at(self.clock.ticks());
    }
    #[inline]
    fn polling(&mut self) {
        self.poll = self.clock.ticks();
    }
    #[inline]
    fn called_back(&mut self) {
        self.called_back_at(self.clock.ticks());
    }
    fn report(&self) -> Option<Breakdown> {
        Some(self.b.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LatencySummary;

    /// Stamps in nanoseconds (an `Instant` clock's ticks are nanoseconds).
    fn on() -> On {
        On::new(&Clock::instant())
    }

    /// One I/O: submit at `s`, doorbell at `r`, polls starting at `polls`, callback at `c`.
    fn io(o: &mut On, s: u64, r: u64, polls: &[u64], c: u64) {
        o.submitting_at(s);
        o.rang_at(r);
        for &p in polls {
            o.poll = p;
        }
        o.called_back_at(c);
    }

    #[test]
    fn segments_are_measured_between_the_stamps() {
        let mut o = on();
        // I/O 1: 100 ns to the doorbell, found by the poll that started at 5,000 ns (the
        // two before it found nothing), called back 40 ns later.
        io(&mut o, 1_000, 1_100, &[1_200, 3_000, 5_000], 5_040);
        // I/O 2 submitted 500 ns after that callback.
        io(&mut o, 5_540, 5_700, &[9_000], 9_060);
        // I/O 3: a flush before its submission and one after its doorbell change nothing.
        o.rang_at(9_100);
        o.submitting_at(9_200);
        o.rang_at(9_300);
        o.rang_at(9_400);
        o.poll = 20_004;
        o.called_back_at(20_024);
        let b = o.report().unwrap();
        // Distinct values, lowest first (all exact at the histogram's 3 digits).
        let vals = |h: &Histogram<u64>| {
            h.iter_recorded()
                .map(|v| h.lowest_equivalent(v.value_iterated_to()))
                .collect::<Vec<_>>()
        };
        assert_eq!(vals(&b.submit_to_doorbell), [100, 160]);
        assert_eq!(vals(&b.doorbell_to_seen), [3_300, 3_900, 10_704]);
        assert_eq!(vals(&b.seen_to_callback), [20, 40, 60]);
        assert_eq!(vals(&b.callback_to_submit), [140, 500]);
        let s = LatencySummary::of(&b.submit_to_doorbell);
        assert_eq!((s.count, s.p50, s.p99), (3, 100, 160));
        assert!((s.mean - 120.0).abs() < 1e-9, "{}", s.mean);
        assert_eq!(b.clock, "monotonic");
    }

    #[test]
    fn unstamped_completions_and_early_polls_record_nothing_wrong() {
        let mut o = on();
        // A completion with no I/O stamped (a zone command's, or the first poll's).
        o.called_back_at(50);
        // A submission that was refused (no doorbell), then one that went through.
        o.submitting_at(100);
        o.submitting_at(200);
        // A poll stamp older than the doorbell (the loop takes none in between, but the
        // floor keeps segments from going negative): seen at the doorbell.
        o.poll = 150;
        o.rang_at(300);
        o.called_back_at(400);
        let b = o.report().unwrap();
        assert_eq!(b.submit_to_doorbell.len(), 1);
        assert_eq!(b.submit_to_doorbell.max(), 100);
        assert_eq!(b.doorbell_to_seen.max(), 0);
        assert_eq!(b.seen_to_callback.max(), 100);
        assert!(b.callback_to_submit.is_empty());
        let mut m = b.clone();
        m.merge(&b);
        assert_eq!(m.seen_to_callback.len(), 2);
        assert_eq!(m.segments()[2].0, "completion_seen_to_callback");
        assert!(Off.report().is_none());
    }
}
