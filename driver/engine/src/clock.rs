//! A cheap per-I/O clock: the CPU's time-stamp counter, calibrated against `Instant`.
//!
//! `Instant::now()` costs ~30 ns on a host with a TSC clocksource, but ~1.5 µs in a guest whose
//! clocksource is the HPET (the QEMU TCG test bed: every read is a system call and an emulated
//! MMIO read). A latency sample per I/O must not cost more than the driver does, so the engine
//! reads the TSC (`rdtsc`, ~10-20 ns even under TCG, where it is the host's TSC) and converts
//! tick differences to nanoseconds with a factor measured once at start-up.
//!
//! Ticks are only compared on the thread that took them (submit and completion happen on one
//! worker), so TSCs that differ between cores do no harm.

use std::time::{Duration, Instant};

/// Ticks → nanoseconds: `ns = ticks * mult >> SHIFT`.
const SHIFT: u32 = 32;

/// A calibrated tick source; `Copy`, one per worker.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    mult: u64,
    source: Source,
}

#[derive(Debug, Clone, Copy)]
enum Source {
    /// The time-stamp counter.
    Tsc,
    /// Nanoseconds since this instant (where there is no usable TSC).
    Instant(Instant),
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn rdtsc() -> u64 {
    // SAFETY: `rdtsc` reads a counter; it has no memory effects and exists on every x86-64 CPU.
    unsafe { core::arch::x86_64::_rdtsc() }
}

impl Clock {
    /// The TSC, calibrated against `Instant` over `window` (10-50 ms is plenty: the error is the
    /// cost of two clock reads over the window). Falls back to `Instant` where there is no TSC
    /// or it does not advance sensibly.
    pub fn calibrate(window: Duration) -> Clock {
        #[cfg(target_arch = "x86_64")]
        {
            let (t0, c0) = (Instant::now(), rdtsc());
            std::thread::sleep(window);
            let (c1, t1) = (rdtsc(), Instant::now());
            let ns = (t1 - t0).as_nanos() as f64;
            let ticks = c1.wrapping_sub(c0) as f64;
            // A TSC between 10 MHz and 100 GHz is believable.
            if ticks > ns / 100.0 && ticks < ns * 100.0 {
                let mult = (ns / ticks * (1u64 << SHIFT) as f64).round() as u64;
                return Clock {
                    mult,
                    source: Source::Tsc,
                };
            }
            log::warn!("the TSC advanced {ticks} ticks in {ns} ns; timing with Instant instead");
        }
        let _ = window;
        Self::instant()
    }

    /// `Instant`-based ticks (nanoseconds): slower, but needs no calibration.
    pub fn instant() -> Clock {
        Clock {
            mult: 1 << SHIFT,
            source: Source::Instant(Instant::now()),
        }
    }

    /// Whether this is the TSC.
    pub fn is_tsc(&self) -> bool {
        matches!(self.source, Source::Tsc)
    }

    /// `"tsc"` or `"monotonic"` (`Instant`: `CLOCK_MONOTONIC` on Linux), for reports.
    pub fn name(&self) -> &'static str {
        match self.source {
            Source::Tsc => "tsc",
            Source::Instant(_) => "monotonic",
        }
    }

    /// Ticks now.
    #[inline(always)]
    pub fn ticks(&self) -> u64 {
        match self.source {
            #[cfg(target_arch = "x86_64")]
            Source::Tsc => rdtsc(),
            #[cfg(not(target_arch = "x86_64"))]
            Source::Tsc => unreachable!("no TSC clock is made off x86-64"),
            Source::Instant(origin) => origin.elapsed().as_nanos() as u64,
        }
    }

    /// Nanoseconds in `ticks` (a difference of two [`Clock::ticks`]).
    #[inline(always)]
    pub fn ns(&self, ticks: u64) -> u64 {
        ((ticks as u128 * self.mult as u128) >> SHIFT) as u64
    }

    /// Ticks in `d` (for deadlines).
    pub fn ticks_in(&self, d: Duration) -> u64 {
        ((d.as_nanos() << SHIFT) / self.mult.max(1) as u128).min(u64::MAX as u128) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibrated_ticks_measure_time() {
        let c = Clock::calibrate(Duration::from_millis(20));
        let (t0, i0) = (c.ticks(), Instant::now());
        std::thread::sleep(Duration::from_millis(30));
        let (t1, i1) = (c.ticks(), Instant::now());
        let got = c.ns(t1 - t0) as f64;
        let want = (i1 - i0).as_nanos() as f64;
        assert!(
            (got / want - 1.0).abs() < 0.05,
            "clock says {got} ns, Instant {want} ns"
        );
        let d = Duration::from_millis(7);
        assert!((c.ns(c.ticks_in(d)) as i64 - 7_000_000).abs() < 1000);
        let i = Clock::instant();
        assert_eq!(i.ns(12345), 12345);
    }
}
