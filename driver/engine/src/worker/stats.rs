//! A queue's own statistics: I/Os, polls, the longest wait for a completion, reissued I/Os,
//! and the queue pair's counters at the warm-up's end.

use std::time::Duration;

use vfpoll_nvme::QpairStats;

use crate::clock::Clock;

/// Counters of one queue, from the measured window's start.
#[derive(Default)]
pub(super) struct QueueStats {
    pub(super) ios: u64,
    /// Polls, and those that found no completion (how long the worker waited on the device).
    pub(super) polls: u64,
    pub(super) empty_polls: u64,
    /// Clock ticks of the last poll that found completions (or of the first submission), and
    /// the longest gap between two such polls.
    pub(super) last_done: u64,
    max_gap: u64,
    /// I/Os issued again after a controller reset.
    pub(super) reissued: u64,
    /// The queue pair's counters when the warm-up ended (zero without one).
    base: QpairStats,
}

impl QueueStats {
    /// A poll found completions at tick `now`.
    #[inline]
    pub(super) fn completions_at(&mut self, now: u64) {
        let gap = now.wrapping_sub(self.last_done);
        self.last_done = now;
        if gap > self.max_gap {
            self.max_gap = gap;
        }
    }

    /// The end of the warm-up at tick `now`, with the queue pair's counters `qp`: counting
    /// starts from zero (reissued I/Os are kept).
    #[cold]
    pub(super) fn restart(&mut self, now: u64, qp: QpairStats) {
        self.ios = 0;
        self.polls = 0;
        self.empty_polls = 0;
        self.max_gap = 0;
        self.last_done = now;
        self.base = qp;
    }

    /// The longest gap between two polls that found completions.
    pub(super) fn max_gap(&self, clock: &Clock) -> Duration {
        Duration::from_nanos(clock.ns(self.max_gap))
    }

    /// The queue pair's counters `now` in the measured window: its traffic counters
    /// (requests, commands, completions, doorbells) counted from the warm-up's end; its fault
    /// and recovery counters (errors, bogus completions, aborts, resets and what they did) as
    /// they are, so that faults of a warm-up still show.
    pub(super) fn traffic(&self, now: QpairStats) -> QpairStats {
        let base = &self.base;
        QpairStats {
            requests: now.requests - base.requests,
            commands: now.commands - base.commands,
            completions: now.completions - base.completions,
            sq_doorbells: now.sq_doorbells - base.sq_doorbells,
            cq_doorbells: now.cq_doorbells - base.cq_doorbells,
            shadow_only: now.shadow_only - base.shadow_only,
            ..now
        }
    }
}
