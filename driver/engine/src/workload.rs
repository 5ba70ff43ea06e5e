//! What to submit next: access patterns, the read/write mix, and the generators behind them.
//!
//! Everything here is pure logic, allocation-free after construction, and cheap enough for the
//! hot path (a few multiplications per I/O).

use std::fmt;
use std::str::FromStr;

use crate::EngineError;

/// An access pattern, as fio names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// Random reads.
    RandRead,
    /// Random writes.
    RandWrite,
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
    /// Random reads and writes, mixed by `rwmix` (percent reads).
    RandRw,
    /// Sequential reads and writes, mixed by `rwmix`.
    Rw,
}

impl Workload {
    /// Every workload, in the order of [`Workload::name`]'s documentation.
    pub const ALL: [Workload; 6] = [
        Workload::RandRead,
        Workload::RandWrite,
        Workload::Read,
        Workload::Write,
        Workload::RandRw,
        Workload::Rw,
    ];

    /// The fio-style name.
    pub fn name(self) -> &'static str {
        match self {
            Workload::RandRead => "randread",
            Workload::RandWrite => "randwrite",
            Workload::Read => "read",
            Workload::Write => "write",
            Workload::RandRw => "randrw",
            Workload::Rw => "rw",
        }
    }

    /// Whether offsets are random (else sequential).
    pub fn random(self) -> bool {
        matches!(self, Workload::RandRead | Workload::RandWrite | Workload::RandRw)
    }

    /// Percent of I/Os that read, given the `--rwmix` of mixed workloads.
    pub fn read_percent(self, rwmix: u8) -> u8 {
        match self {
            Workload::RandRead | Workload::Read => 100,
            Workload::RandWrite | Workload::Write => 0,
            Workload::RandRw | Workload::Rw => rwmix.min(100),
        }
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Workload {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Self, EngineError> {
        Workload::ALL
            .into_iter()
            .find(|w| w.name() == s || (s == "readwrite" && *w == Workload::Rw))
            .ok_or_else(|| {
                EngineError::Invalid(format!(
                    "unknown workload {s:?}; one of: {}",
                    Workload::ALL.map(Workload::name).join(", ")
                ))
            })
    }
}

/// A small, fast pseudo-random generator (SplitMix64): 64-bit state, full period, good enough
/// for offsets and mixes, and the same stream for the same seed on every machine.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix64(self.0)
    }

    /// Uniform in `0..n` (`n > 0`), by multiply-and-shift (Lemire): no division.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// True with probability `percent`/100.
    #[inline]
    pub fn percent(&mut self, percent: u8) -> bool {
        self.below(100) < percent as u64
    }
}

/// The SplitMix64 finaliser: a bijection of `u64` that scrambles every bit.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A pseudo-random permutation of `0..n` without a table: a full-period linear congruential
/// generator modulo the next power of two (Hull-Dobell: `c` odd, `a ≡ 1 mod 4`), skipping values
/// `>= n` ("cycle walking"; fewer than half are skipped). Visits every value exactly once per
/// period, so a verify pass covers each block once in a scattered order.
#[derive(Debug, Clone)]
pub struct Permutation {
    n: u64,
    mask: u64,
    a: u64,
    c: u64,
    x: u64,
}

impl Permutation {
    /// A permutation of `0..n` (`n > 0`) chosen by `seed`.
    pub fn new(n: u64, seed: u64) -> Self {
        assert!(n > 0, "permutation of nothing");
        let mask = n.next_power_of_two().wrapping_sub(1);
        let mut r = Rng::new(seed);
        Permutation {
            n,
            mask,
            a: (r.next_u64() << 2) | 1,
            c: r.next_u64() | 1,
            x: r.next_u64() & mask,
        }
    }

    /// The next value; after `n` calls every value of `0..n` has come once, then it repeats.
    #[inline]
    pub fn next_value(&mut self) -> u64 {
        loop {
            self.x = self.a.wrapping_mul(self.x).wrapping_add(self.c) & self.mask;
            if self.x < self.n {
                return self.x;
            }
        }
    }
}

/// Where the next I/O of one namespace range goes, in units of the I/O size.
#[derive(Debug, Clone)]
pub(crate) struct Cursor {
    units: u64,
    order: Order,
}

#[derive(Debug, Clone)]
enum Order {
    Sequential(u64),
    Random,
    Permuted(Permutation),
}

impl Cursor {
    /// `units` units (`> 0`); `random`: uniformly random (with repeats), or, with `once`,
    /// a permutation (every unit once per pass); else sequential from 0, wrapping.
    pub(crate) fn new(units: u64, random: bool, once: bool, seed: u64) -> Self {
        let order = match (random, once) {
            (false, _) => Order::Sequential(0),
            (true, false) => Order::Random,
            (true, true) => Order::Permuted(Permutation::new(units, seed)),
        };
        Cursor { units, order }
    }

    /// Whether offsets are random.
    pub(crate) fn is_random(&self) -> bool {
        !matches!(self.order, Order::Sequential(_))
    }

    #[inline]
    pub(crate) fn next_unit(&mut self, rng: &mut Rng) -> u64 {
        match &mut self.order {
            Order::Sequential(next) => {
                let u = *next;
                *next = if u + 1 == self.units { 0 } else { u + 1 };
                u
            }
            Order::Random => rng.below(self.units),
            Order::Permuted(p) => p.next_value(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for w in Workload::ALL {
            assert_eq!(w.name().parse::<Workload>().unwrap(), w);
        }
        let e = "randomread".parse::<Workload>().unwrap_err().to_string();
        assert!(e.contains("randread, randwrite"), "{e}");
        assert_eq!(Workload::RandRw.read_percent(70), 70);
        assert_eq!(Workload::Write.read_percent(70), 0);
    }

    #[test]
    fn permutations_visit_every_value_once() {
        for n in [1u64, 2, 3, 7, 8, 9, 1000, 4097] {
            for seed in 0..4 {
                let mut p = Permutation::new(n, seed);
                let mut seen = vec![false; n as usize];
                for _ in 0..n {
                    let v = p.next_value() as usize;
                    assert!(!seen[v], "n {n} seed {seed}: {v} twice");
                    seen[v] = true;
                }
            }
        }
        // Not the identity: scattered.
        let mut p = Permutation::new(1000, 1);
        let first: Vec<u64> = (0..10).map(|_| p.next_value()).collect();
        assert_ne!(first, (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn random_offsets_are_uniform_enough_and_mixes_hold() {
        let mut r = Rng::new(42);
        let mut buckets = [0u32; 10];
        for _ in 0..100_000 {
            buckets[r.below(10) as usize] += 1;
        }
        assert!(
            buckets.iter().all(|&b| (9_000..11_000).contains(&b)),
            "{buckets:?}"
        );
        let reads = (0..100_000).filter(|_| r.percent(70)).count();
        assert!((69_000..71_000).contains(&reads), "{reads}");
        assert!(!(0..1000).any(|_| r.percent(0)));
        assert!((0..1000).all(|_| r.percent(100)));
    }

    #[test]
    fn sequential_cursor_wraps() {
        let mut c = Cursor::new(3, false, false, 0);
        let mut r = Rng::new(0);
        let v: Vec<u64> = (0..7).map(|_| c.next_unit(&mut r)).collect();
        assert_eq!(v, [0, 1, 2, 0, 1, 2, 0]);
    }
}
