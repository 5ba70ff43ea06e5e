//! Clocks that do not read the clocksource: a coarse one for the health checks
//! (`CLOCK_MONOTONIC_COARSE`, which the vDSO answers from the kernel's last timer tick, as
//! `Instant`s), and the TSC for hybrid mode's spin ([`SpinDeadline`]).
//!
//! A queue pair reads the clock every few milliseconds of polling to decide when to check its
//! controller and its timeouts (`qpair/health.rs`), whose intervals are milliseconds to
//! seconds: a tick's resolution (1-4 ms) is enough. `Instant::now()` reads the clocksource,
//! and in a guest whose clocksource is not the TSC (the HPET, the ACPI PM timer: the test bed
//! under TCG) that is a system call and an exit to the emulator, contending with the emulated
//! controller for the emulator's lock: an in-guest profile of fio through vfpoll's engine put
//! 6.7 % of its samples in `read_hpet` under the health clock's reads.

use std::sync::OnceLock;
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

/// The end of hybrid mode's spin (`qpair/wait.rs`), tens of microseconds away: read from the
/// TSC where it is usable, so that looking at the deadline costs no more than looking at the
/// completion queue. `Instant::now()` in a guest whose clocksource is the HPET is an emulator
/// exit that can take longer than the whole spin (on the TCG test bed a spin reading it every 64
/// looks made hybrid mode's QD1 latency 2.9x polling's once polling itself no longer read it).
#[derive(Debug, Clone, Copy)]
pub(crate) enum SpinDeadline {
    /// The TSC value at which the spin ends.
    Tsc(u64),
    /// Where there is no usable TSC.
    Instant(Instant),
}

impl SpinDeadline {
    /// `spin` from now.
    #[inline]
    pub(crate) fn after(spin: Duration) -> Self {
        match tsc_per_ms() {
            Some(f) => {
                let ticks = (spin.as_nanos() as u64).saturating_mul(f) / 1_000_000;
                SpinDeadline::Tsc(rdtsc().saturating_add(ticks))
            }
            None => SpinDeadline::Instant(Instant::now() + spin),
        }
    }

    /// Whether the deadline has passed.
    #[inline]
    pub(crate) fn passed(&self) -> bool {
        match *self {
            SpinDeadline::Tsc(end) => rdtsc() >= end,
            SpinDeadline::Instant(end) => Instant::now() >= end,
        }
    }
}

/// TSC ticks per millisecond, measured once per process (a 5 ms sleep, on the first hybrid
/// queue pair's creation); `None` without a TSC that advances believably.
pub(crate) fn tsc_per_ms() -> Option<u64> {
    static TSC: OnceLock<Option<u64>> = OnceLock::new();
    *TSC.get_or_init(|| {
        if !cfg!(target_arch = "x86_64") {
            return None;
        }
        let (t0, c0) = (Instant::now(), rdtsc());
        std::thread::sleep(Duration::from_millis(5));
        let (c1, t1) = (rdtsc(), Instant::now());
        let ns = (t1 - t0).as_nanos() as u64;
        let per_ms = c1.wrapping_sub(c0).saturating_mul(1_000_000) / ns.max(1);
        // Between 10 MHz and 100 GHz is believable (a TSC that stands still is not).
        (10_000..100_000_000).contains(&per_ms).then_some(per_ms)
    })
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn rdtsc() -> u64 {
    // SAFETY: `rdtsc` reads a counter; it has no memory effects and exists on every x86-64 CPU.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
fn rdtsc() -> u64 {
    0
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

    #[test]
    fn a_spin_deadline_passes_after_its_time_and_not_before() {
        for spin in [Duration::from_micros(200), Duration::from_millis(20)] {
            let start = Instant::now();
            let d = SpinDeadline::after(spin);
            assert!(!d.passed() || start.elapsed() >= spin, "{spin:?} passed at once");
            while !d.passed() {
                std::hint::spin_loop();
            }
            let took = start.elapsed();
            // Calibrated over 5 ms: within a few per cent (the bound is loose for a busy host).
            assert!(took >= spin * 9 / 10, "{spin:?} ended after {took:?}");
            assert!(
                took < spin * 3 + Duration::from_millis(20),
                "{spin:?} took {took:?}"
            );
        }
        if cfg!(target_arch = "x86_64") {
            assert!(tsc_per_ms().is_some(), "x86-64 has a TSC");
        }
    }
}
