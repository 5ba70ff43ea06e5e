//! Rate limits per host and per namespace (I/O commands per second and bytes per second), as
//! SPDK's bdev QoS gives them: token buckets that a command must find credit in before it
//! reaches a backend; a command that finds none waits in its connection, in order, until the
//! buckets refill.
//!
//! A bucket refills continuously at its rate and holds at most [`BURST`] worth of it, so an
//! idle host cannot save up more than that. A command is admitted while every bucket it
//! draws from has credit left, and then takes its full cost, which may leave a bucket in
//! debt: a transfer larger than the burst still passes, and the debt delays the next ones
//! (over a second, the bytes admitted exceed the rate by at most one command and the burst).
//!
//! Only limited traffic pays for this: a limit is a mutex over two small buckets, shared by
//! the queues it governs (they may be on different workers), taken once per command; queues
//! without a limit never touch one. The clock is passed in (nanoseconds from any fixed
//! origin), so tests count admissions against a fake clock.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// How much of its rate a bucket holds at most: 50 ms worth (at least one command or one
/// byte's worth of credit, so that a low rate still admits). Credit past it is lost, so a
/// worker kept off its core for longer (a loaded host) lets a limited host fall below its
/// rate; with 10 ms, the benchmark on a loaded 2-core machine fell 12-16 % short.
pub const BURST: Duration = Duration::from_millis(50);

const NS_PER_S: u128 = 1_000_000_000;

/// A rate limit: either or both of I/O commands per second and bytes per second (`None`:
/// that one is not limited).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateLimit {
    /// I/O commands per second (reads, writes, flushes, ...).
    pub iops: Option<u64>,
    /// Bytes per second moved by reads and writes.
    pub bytes_per_s: Option<u64>,
}

impl RateLimit {
    /// Whether it limits anything.
    pub fn is_limited(&self) -> bool {
        self.iops.is_some() || self.bytes_per_s.is_some()
    }
}

/// The limits of a subsystem's traffic: per host (by host NQN, or `hostid:<uuid>` for a host
/// that sent none, as [`host_label`](super::host_label) names it), over all of that host's
/// controllers and namespaces in the subsystem; and per namespace (by NSID), over all hosts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Limits {
    /// Per host.
    pub hosts: BTreeMap<String, RateLimit>,
    /// Per namespace.
    pub namespaces: BTreeMap<u32, RateLimit>,
}

/// One token bucket; credit is kept in token-nanoseconds (a token is worth `NS_PER_S`), so
/// that refilling at any rate loses nothing to rounding.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Tokens per second.
    rate: u64,
    /// Credit, in tokens × 10⁻⁹; negative: debt.
    credit: i128,
}

impl Bucket {
    fn new(rate: u64) -> Self {
        Bucket {
            rate,
            credit: Self::cap(rate),
        }
    }

    /// The most credit the bucket holds: the rate over [`BURST`], at least one token.
    fn cap(rate: u64) -> i128 {
        ((rate as u128 * BURST.as_nanos()).max(NS_PER_S)) as i128
    }

    fn refill(&mut self, elapsed_ns: u64) {
        let add = (elapsed_ns as u128 * self.rate as u128).min(i128::MAX as u128 / 2) as i128;
        self.credit = (self.credit + add).min(Self::cap(self.rate));
    }

    fn take(&mut self, tokens: u64) {
        self.credit -= tokens as i128 * NS_PER_S as i128;
    }
}

#[derive(Debug)]
struct State {
    iops: Option<Bucket>,
    bytes: Option<Bucket>,
    /// The clock at the last refill.
    last_ns: Option<u64>,
}

/// A rate limit's buckets, shared by the queues it governs.
#[derive(Debug)]
pub struct Limiter {
    state: Mutex<State>,
}

impl Limiter {
    /// A limiter with full buckets.
    pub fn new(limit: RateLimit) -> Self {
        Limiter {
            state: Mutex::new(State {
                iops: limit.iops.map(Bucket::new),
                bytes: limit.bytes_per_s.map(Bucket::new),
                last_ns: None,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Changes the rates (a reload): credit carries over, capped at the new burst.
    pub fn set(&self, limit: RateLimit) {
        let mut s = self.lock();
        let keep = |old: Option<Bucket>, rate: Option<u64>| {
            rate.map(|r| {
                let mut b = Bucket::new(r);
                if let Some(o) = old {
                    b.credit = o.credit.min(Bucket::cap(r));
                }
                b
            })
        };
        s.iops = keep(s.iops, limit.iops);
        s.bytes = keep(s.bytes, limit.bytes_per_s);
    }

    /// The rates now.
    pub fn limit(&self) -> RateLimit {
        let s = self.lock();
        RateLimit {
            iops: s.iops.map(|b| b.rate),
            bytes_per_s: s.bytes.map(|b| b.rate),
        }
    }

    /// Refills to `now_ns` and says whether every bucket has credit.
    pub fn ready(&self, now_ns: u64) -> bool {
        let mut s = self.lock();
        let elapsed = s.last_ns.map_or(0, |l| now_ns.saturating_sub(l));
        s.last_ns = Some(now_ns.max(s.last_ns.unwrap_or(0)));
        let State { iops, bytes, .. } = &mut *s;
        for b in [iops, bytes].into_iter().flatten() {
            b.refill(elapsed);
        }
        // A command needs a whole token of the IOPS bucket, and any credit of the bytes
        // bucket (a transfer larger than the burst passes and leaves a debt).
        s.iops.is_none_or(|b| b.credit >= NS_PER_S as i128) && s.bytes.is_none_or(|b| b.credit > 0)
    }

    /// Takes one command and `bytes` from the buckets (after [`Limiter::ready`] said yes).
    pub fn take(&self, bytes: u64) {
        let mut s = self.lock();
        if let Some(b) = &mut s.iops {
            b.take(1);
        }
        if let Some(b) = &mut s.bytes {
            b.take(bytes);
        }
    }

    /// Admits one command of `bytes` at `now_ns` if every bucket has credit.
    pub fn try_admit(&self, now_ns: u64, bytes: u64) -> bool {
        let ok = self.ready(now_ns);
        if ok {
            self.take(bytes);
        }
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Offers a command every `step_ns` for `secs` seconds of fake time, as fast as the
    /// limiter admits: how many it admitted.
    fn admitted(l: &Limiter, bytes: u64, step_ns: u64, secs: u64) -> u64 {
        let mut n = 0;
        let mut t = 0;
        while t < secs * 1_000_000_000 {
            // As many as it takes at this instant (a host with a deep queue).
            while l.try_admit(t, bytes) {
                n += 1;
            }
            t += step_ns;
        }
        n
    }

    #[test]
    fn iops_limits_hold_over_time_with_one_burst() {
        let l = Limiter::new(RateLimit {
            iops: Some(1000),
            bytes_per_s: None,
        });
        // 10 s at a 100 us clock: 10,000 plus the initial burst of 50 ms (50 commands).
        let n = admitted(&l, 4096, 100_000, 10);
        assert!((10_000..=10_051).contains(&n), "{n}");
    }

    #[test]
    fn byte_limits_hold_and_large_commands_pass_on_debt() {
        // 1 MB/s with 128 KiB commands (larger than the 50 KB burst): each passes, then the
        // debt holds the next back.
        let l = Limiter::new(RateLimit {
            iops: None,
            bytes_per_s: Some(1_000_000),
        });
        let n = admitted(&l, 128 << 10, 1_000_000, 20);
        let bytes = n * (128 << 10);
        assert!(
            (20_000_000..=20_000_000 + 2 * (128 << 10)).contains(&bytes),
            "{bytes}"
        );
        // Both limits: the tighter one rules.
        let l = Limiter::new(RateLimit {
            iops: Some(100),
            bytes_per_s: Some(1 << 30),
        });
        let n = admitted(&l, 4096, 1_000_000, 5);
        assert!((500..=505).contains(&n), "{n}");
    }

    #[test]
    fn idle_time_saves_only_the_burst_and_reload_keeps_the_credit() {
        let l = Limiter::new(RateLimit {
            iops: Some(10_000),
            bytes_per_s: None,
        });
        assert!(l.ready(0));
        // An hour idle: still only 50 ms worth (500 commands) at once.
        let mut n = 0;
        while l.try_admit(3_600_000_000_000, 0) {
            n += 1;
        }
        assert_eq!(n, 500);
        // A reload to 1000 IOPS: the empty bucket stays empty, then refills at the new rate.
        l.set(RateLimit {
            iops: Some(1000),
            bytes_per_s: None,
        });
        assert_eq!(l.limit().iops, Some(1000));
        assert!(!l.try_admit(3_600_000_000_000, 0));
        assert!(l.try_admit(3_600_001_000_000, 0), "1 ms at 1000/s: one command");
        assert!(!l.try_admit(3_600_001_000_000, 0));
        // A clock that goes back does not mint credit.
        assert!(!l.try_admit(1, 0));
        // A very low rate still admits one command at a time.
        let slow = Limiter::new(RateLimit {
            iops: Some(1),
            bytes_per_s: None,
        });
        assert_eq!(admitted(&slow, 0, 1_000_000, 3), 3);
    }
}
