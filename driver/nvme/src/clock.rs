//! A coarse clock for the health checks: `CLOCK_MONOTONIC_COARSE`, which the vDSO answers from
//! the kernel's last timer tick without reading the clocksource, as `Instant`s.
//!
//! A queue pair reads the clock every few milliseconds of polling to decide when to check its
//! controller and its timeouts (`qpair/health.rs`), whose intervals are milliseconds to
//! seconds: a tick's resolution (1-4 ms) is enough. `Instant::now()` reads the clocksource,
//! and in a guest whose clocksource is not the TSC (the HPET, the ACPI PM timer: the test bed
//! under TCG) that is a system call and an exit to the emulator, contending with the emulated
//! controller for the emulator's lock: an in-guest profile of fio through vfpoll's engine put
//! 6.7 % of its samples in `read_hpet` under the health clock's reads.

use std::time::{Duration, Instant};

/// `CLOCK_MONOTONIC_COARSE` as `Instant`s: an `Instant` taken at creation plus the coarse
/// clock's advance since. It runs at `Instant`'s rate and lags it by at most a timer tick.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CoarseClock {
    base: Instant,
    base_coarse: Duration,
}

impl CoarseClock {
    pub(crate) fn new() -> Self {
        let base_coarse = coarse();
        CoarseClock {
            base: Instant::now(),
            base_coarse,
        }
    }

    /// Now, to within a timer tick.
    #[inline]
    pub(crate) fn now(&self) -> Instant {
        self.base + coarse().saturating_sub(self.base_coarse)
    }
}

/// `CLOCK_MONOTONIC_COARSE`.
fn coarse() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into `ts`, a valid, exclusively borrowed local.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    debug_assert_eq!(r, 0, "CLOCK_MONOTONIC_COARSE exists since Linux 2.6.32");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_coarse_clock_follows_instant_within_a_tick() {
        let c = CoarseClock::new();
        let mut last = c.now();
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(60) {
            let now = c.now();
            assert!(now >= last, "coarse time went back");
            last = now;
            let real = Instant::now();
            // A tick is at most 10 ms (HZ=100); the base pair was read one tick apart at worst.
            let lag = real.saturating_duration_since(now);
            let lead = now.saturating_duration_since(real);
            assert!(
                lag <= Duration::from_millis(25) && lead <= Duration::from_millis(25),
                "{lag:?} {lead:?}"
            );
        }
        assert!(c.now() > c.base, "60 ms passed: the coarse clock moved");
    }
}
