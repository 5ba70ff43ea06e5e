//! Per-host damping of failed authentications: each failure in a row doubles the time before
//! the host may try again (1 s, 2 s, 4 s, ... up to [`MAX_BACKOFF`]), so that secrets cannot
//! be guessed at line rate, and warnings about one host are logged at most once per
//! [`WARN_EVERY`] with the count of those left out.

use std::time::{Duration, Instant};

/// The longest wait after failures in a row.
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// One warning per host in this time at most.
pub const WARN_EVERY: Duration = Duration::from_secs(10);

/// One host's failures.
#[derive(Debug, Clone, Default)]
pub struct Throttle {
    in_a_row: u32,
    until: Option<Instant>,
    last_warn: Option<Instant>,
    unlogged: u64,
}

impl Throttle {
    /// `Err(wait)` while the host must wait before it tries again.
    pub fn check(&self, now: Instant) -> Result<(), Duration> {
        match self.until {
            Some(t) if now < t => Err(t - now),
            _ => Ok(()),
        }
    }

    /// Records a failure at `now`. Returns `Some(n)` when it should be logged at warn, `n`
    /// being the failures not logged since the last warning; `None` when it is left out.
    pub fn failed(&mut self, now: Instant) -> Option<u64> {
        self.in_a_row = self.in_a_row.saturating_add(1);
        let backoff = Duration::from_secs(1u64 << (self.in_a_row - 1).min(6)).min(MAX_BACKOFF);
        self.until = Some(now + backoff);
        match self.last_warn {
            Some(t) if now.duration_since(t) < WARN_EVERY => {
                self.unlogged += 1;
                None
            }
            _ => {
                self.last_warn = Some(now);
                Some(std::mem::take(&mut self.unlogged))
            }
        }
    }

    /// The host authenticated: no more waiting.
    pub fn succeeded(&mut self) {
        self.in_a_row = 0;
        self.until = None;
    }

    /// Failures in a row.
    pub fn failures_in_a_row(&self) -> u32 {
        self.in_a_row
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_the_cap_and_success_clears_it() {
        let t0 = Instant::now();
        let mut t = Throttle::default();
        assert_eq!(t.check(t0), Ok(()));
        assert_eq!(t.failed(t0), Some(0));
        assert_eq!(t.check(t0), Err(Duration::from_secs(1)));
        assert_eq!(t.check(t0 + Duration::from_secs(1)), Ok(()));
        assert_eq!(t.failed(t0 + Duration::from_secs(1)), None);
        assert_eq!(t.check(t0 + Duration::from_secs(1)), Err(Duration::from_secs(2)));
        for i in 2..10 {
            assert_eq!(t.failed(t0 + Duration::from_secs(i)), None);
        }
        // The warning after WARN_EVERY counts the 9 left out.
        assert_eq!(t.failed(t0 + Duration::from_secs(10)), Some(9));
        t.failed(t0 + Duration::from_secs(11));
        assert_eq!(t.check(t0 + Duration::from_secs(11)), Err(MAX_BACKOFF));
        t.succeeded();
        assert_eq!(t.check(t0 + Duration::from_secs(12)), Ok(()));
        assert_eq!(t.failures_in_a_row(), 0);
    }
}
