//! Results: per worker (made on the worker, off the hot path, at the end) and merged.

use std::time::Duration;

use hdrhistogram::Histogram;
use vfpoll_nvme::QpairStats;

use crate::breakdown::Breakdown;
pub use crate::histogram::{new_histogram, MAX_LATENCY_NS};
use crate::pattern::Found;

/// Counts and latencies of one direction (reads or writes).
#[derive(Debug, Clone)]
pub struct OpStats {
    /// Completed I/Os (errors included).
    pub ios: u64,
    /// Bytes moved by successful I/Os.
    pub bytes: u64,
    /// Submit-to-completion latency of every completed I/O, in nanoseconds.
    pub latency: Histogram<u64>,
}

impl Default for OpStats {
    fn default() -> Self {
        OpStats {
            ios: 0,
            bytes: 0,
            latency: new_histogram(),
        }
    }
}

impl OpStats {
    /// Adds `other` into `self`.
    pub fn merge(&mut self, other: &OpStats) {
        self.ios += other.ios;
        self.bytes += other.bytes;
        self.latency
            .add(&other.latency)
            .expect("histograms of the same bounds add");
    }
}

/// The usual numbers of a latency histogram, in nanoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LatencySummary {
    /// Samples.
    pub count: u64,
    /// Smallest.
    pub min: u64,
    /// Largest.
    pub max: u64,
    /// Mean.
    pub mean: f64,
    /// Standard deviation.
    pub stddev: f64,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// 99.99th percentile.
    pub p9999: u64,
}

impl LatencySummary {
    /// Summarises `h` (all zero when it is empty).
    pub fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return LatencySummary::default();
        }
        let q = |x| h.value_at_quantile(x);
        LatencySummary {
            count: h.len(),
            min: h.min(),
            max: h.max(),
            mean: h.mean(),
            stddev: h.stdev(),
            p50: q(0.50),
            p90: q(0.90),
            p99: q(0.99),
            p999: q(0.999),
            p9999: q(0.9999),
        }
    }
}

/// One range of a latency histogram as SPDK perf's `-LL` prints it: `[lo_ns, hi_ns)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bucket {
    /// Lowest latency in the range, in nanoseconds.
    pub lo_ns: u64,
    /// One past the highest, in nanoseconds.
    pub hi_ns: u64,
    /// I/Os whose latency fell in the range.
    pub count: u64,
    /// Their share of all I/Os, in percent.
    pub percent: f64,
    /// The share of all I/Os at or below this range, in percent.
    pub cumulative_percent: f64,
}

/// The range `[lo, hi)` that holds `ns` when every power of two is cut into `per_octave` equal
/// ranges (a power of two from 1 to 1024): the log-linear buckets of SPDK's histograms
/// (`lib/util/histogram_data`, 128 per power of two there). Below `per_octave` nanoseconds the
/// ranges are 1 ns wide.
pub fn bucket_range(ns: u64, per_octave: u32) -> (u64, u64) {
    debug_assert!(per_octave.is_power_of_two() && per_octave <= 1024);
    let sub = per_octave as u64;
    if ns < sub {
        return (ns, ns + 1);
    }
    // ns lies in [2^k, 2^(k+1)); its ranges are 2^k / sub wide.
    let k = 63 - ns.leading_zeros();
    let width = 1u64 << (k - sub.trailing_zeros());
    let lo = ns & !(width - 1);
    (lo, lo.saturating_add(width))
}

/// The non-empty ranges of `h` (nanoseconds), lowest first, with `per_octave` ranges per power
/// of two (see [`bucket_range`]). The histogram's own buckets (3 significant digits: at least
/// 1024 per power of two, aligned on powers of two) nest in these, so every count is exact.
pub fn histogram_buckets(h: &Histogram<u64>, per_octave: u32) -> Vec<Bucket> {
    let total = h.len();
    let mut out: Vec<Bucket> = Vec::new();
    let mut below = 0u64;
    for v in h.iter_recorded() {
        let value = h.lowest_equivalent(v.value_iterated_to());
        let (lo, hi) = bucket_range(value, per_octave);
        let n = v.count_at_value();
        below += n;
        match out.last_mut() {
            Some(b) if b.lo_ns == lo => b.count += n,
            _ => out.push(Bucket {
                lo_ns: lo,
                hi_ns: hi,
                count: n,
                percent: 0.0,
                cumulative_percent: 0.0,
            }),
        }
        let b = out.last_mut().expect("pushed");
        b.percent = 100.0 * b.count as f64 / total as f64;
        b.cumulative_percent = 100.0 * below as f64 / total as f64;
    }
    out
}

/// One queue pair of one worker.
#[derive(Debug, Clone)]
pub struct QueueReport {
    /// The controller's label (its BDF, or "model").
    pub device: String,
    /// The I/O queue id.
    pub qid: u16,
    /// The namespaces it drove.
    pub nsids: Vec<u32>,
    /// I/Os completed on it.
    pub ios: u64,
    /// Times the worker polled it.
    pub polls: u64,
    /// Polls that found no completion: a worker that mostly finds nothing waits on the device;
    /// one that rarely does is limited by its own CPU time.
    pub empty_polls: u64,
    /// The queue pair's own counters (doorbells, completions, errors, resets).
    pub stats: QpairStats,
    /// The longest time between two polls that found completions, from the first submission
    /// to the last completion: how long I/O stood still (a controller reset, a stall).
    pub max_gap: Duration,
    /// I/Os issued again after a controller reset interrupted them
    /// ([`vfpoll_nvme::NvmeError::Reset`]): each counts once, when it finally completes.
    pub reissued: u64,
    /// Its zoned namespaces: how their zones were written.
    pub zoned: Vec<ZoneReport>,
}

/// How one worker used the zones of one zoned namespace (see [`crate::zoned`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneReport {
    /// The namespace.
    pub nsid: u32,
    /// Zones of the worker's range.
    pub zones: u64,
    /// I/Os per zone: the smallest zone capacity over the I/O size, rounded down (the rest of
    /// each zone is not used).
    pub ios_per_zone: u64,
    /// Zones written at once, one write in flight each (0: the run did not write).
    pub at_once: u32,
    /// Zones reset (Reset Zone): before the first write, and before each zone is written again.
    pub resets: u64,
    /// Zones finished (Finish Zone) after their last I/O, their remainder skipped, or after a
    /// failed write.
    pub finishes: u64,
}

/// One block that did not read back as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// The controller's label.
    pub device: String,
    /// Namespace.
    pub nsid: u32,
    /// The LBA read.
    pub lba: u64,
    /// What was there instead.
    pub found: Found,
}

/// The outcome of a verify run.
#[derive(Debug, Clone, Default)]
pub struct VerifyReport {
    /// Logical blocks written with the pattern.
    pub blocks_written: u64,
    /// Logical blocks read back and compared.
    pub blocks_checked: u64,
    /// Blocks that differed.
    pub mismatches: u64,
    /// The first few mismatches ([`VerifyReport::MAX_SAMPLES`] per worker).
    pub samples: Vec<Mismatch>,
}

impl VerifyReport {
    /// Mismatches kept per worker.
    pub const MAX_SAMPLES: usize = 16;

    /// Adds `other` into `self`.
    pub fn merge(&mut self, other: &VerifyReport) {
        self.blocks_written += other.blocks_written;
        self.blocks_checked += other.blocks_checked;
        self.mismatches += other.mismatches;
        self.samples.extend(other.samples.iter().cloned());
    }
}

/// What one worker did.
#[derive(Debug, Clone)]
pub struct WorkerReport {
    /// Worker index.
    pub worker: usize,
    /// The core it was pinned to.
    pub core: Option<usize>,
    /// From its start to its last completion.
    pub elapsed: Duration,
    /// Reads.
    pub read: OpStats,
    /// Writes.
    pub write: OpStats,
    /// I/Os that completed with an error or were refused at submit.
    pub errors: u64,
    /// The first few error messages.
    pub error_samples: Vec<String>,
    /// Its queue pairs.
    pub queues: Vec<QueueReport>,
    /// Verify results (verify runs only).
    pub verify: Option<VerifyReport>,
    /// Where each I/O's time went ([`crate::JobSpec::breakdown`] runs only).
    pub breakdown: Option<Breakdown>,
}

/// Error messages kept per worker.
pub const MAX_ERROR_SAMPLES: usize = 8;

/// The merged result of a run.
#[derive(Debug, Clone)]
pub struct Report {
    /// The longest worker's run time.
    pub elapsed: Duration,
    /// Reads of all workers.
    pub read: OpStats,
    /// Writes of all workers.
    pub write: OpStats,
    /// Failed I/Os of all workers.
    pub errors: u64,
    /// The first few error messages.
    pub error_samples: Vec<String>,
    /// Verify results (verify runs only).
    pub verify: Option<VerifyReport>,
    /// Where each I/O's time went, all workers ([`crate::JobSpec::breakdown`] runs only).
    pub breakdown: Option<Breakdown>,
    /// Each worker's own numbers.
    pub workers: Vec<WorkerReport>,
}

impl Report {
    /// Merges the workers' reports.
    pub fn merge(mut workers: Vec<WorkerReport>) -> Report {
        workers.sort_by_key(|w| w.worker);
        let mut r = Report {
            elapsed: Duration::ZERO,
            read: OpStats::default(),
            write: OpStats::default(),
            errors: 0,
            error_samples: Vec::new(),
            verify: None,
            breakdown: None,
            workers: Vec::new(),
        };
        for w in &workers {
            r.elapsed = r.elapsed.max(w.elapsed);
            r.read.merge(&w.read);
            r.write.merge(&w.write);
            r.errors += w.errors;
            r.error_samples.extend(w.error_samples.iter().cloned());
            if let Some(v) = &w.verify {
                r.verify.get_or_insert_with(VerifyReport::default).merge(v);
            }
            if let Some(b) = &w.breakdown {
                match r.breakdown.as_mut() {
                    Some(m) => m.merge(b),
                    None => r.breakdown = Some(b.clone()),
                }
            }
        }
        r.error_samples.truncate(MAX_ERROR_SAMPLES);
        r.workers = workers;
        r
    }

    /// Reads plus writes.
    pub fn ios(&self) -> u64 {
        self.read.ios + self.write.ios
    }

    /// Bytes read and written.
    pub fn bytes(&self) -> u64 {
        self.read.bytes + self.write.bytes
    }

    /// I/Os per second over [`Report::elapsed`].
    pub fn iops(&self) -> f64 {
        per_second(self.ios(), self.elapsed)
    }

    /// Bytes per second over [`Report::elapsed`].
    pub fn bw_bytes(&self) -> f64 {
        per_second(self.bytes(), self.elapsed)
    }

    /// Latency of reads and writes together.
    pub fn latency(&self) -> Histogram<u64> {
        let mut h = self.read.latency.clone();
        h.add(&self.write.latency).expect("same bounds");
        h
    }

    /// Whether nothing failed: no I/O error and, for verify runs, no mismatch.
    pub fn passed(&self) -> bool {
        self.errors == 0 && self.verify.as_ref().is_none_or(|v| v.mismatches == 0)
    }
}

/// `n` per second over `d` (0 for an empty interval).
pub fn per_second(n: u64, d: Duration) -> f64 {
    if d.is_zero() {
        0.0
    } else {
        n as f64 / d.as_secs_f64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cut_each_power_of_two_into_equal_ranges() {
        // Below `per_octave` ns: 1 ns wide.
        assert_eq!(bucket_range(0, 16), (0, 1));
        assert_eq!(bucket_range(15, 16), (15, 16));
        // [16, 32) in 16 ranges of 1 ns, [1024, 2048) in 16 of 64 ns.
        assert_eq!(bucket_range(16, 16), (16, 17));
        assert_eq!(bucket_range(1024, 16), (1024, 1088));
        assert_eq!(bucket_range(1087, 16), (1024, 1088));
        assert_eq!(bucket_range(1088, 16), (1088, 1152));
        assert_eq!(bucket_range(2047, 16), (1984, 2048));
        // 86 µs with 128 per power of two (SPDK's): [65536, 131072) in ranges of 512 ns.
        assert_eq!(bucket_range(86_000, 128), (85_504, 86_016));
        assert_eq!(bucket_range(5, 1), (4, 8));
        assert_eq!(bucket_range(u64::MAX, 1024).1, u64::MAX);
        // Every value lies in its range, and ranges tile the line.
        for per in [1, 2, 16, 128, 1024] {
            let mut v = 0u64;
            while v < 1 << 24 {
                let (lo, hi) = bucket_range(v, per);
                assert!(lo <= v && v < hi, "{v} in [{lo}, {hi}) at {per}");
                assert_eq!(bucket_range(hi, per).0, hi, "the next range starts at {hi}");
                v = hi + (hi - lo) * 3;
            }
        }
    }

    #[test]
    fn histogram_buckets_count_percent_and_accumulate() {
        let mut h = new_histogram();
        h.record_n(1_000, 3).unwrap(); // [992, 1024) at 16 per power of two (512..1024: 32 ns wide)
        h.record_n(1_010, 1).unwrap(); // same range
        h.record_n(1_030, 4).unwrap(); // [1024, 1088)
        h.record_n(80_000, 2).unwrap(); // [77824, 81920)
        let b = histogram_buckets(&h, 16);
        let got: Vec<_> = b.iter().map(|b| (b.lo_ns, b.hi_ns, b.count)).collect();
        assert_eq!(got, [(992, 1024, 4), (1024, 1088, 4), (77_824, 81_920, 2)]);
        let pct: Vec<_> = b.iter().map(|b| (b.percent, b.cumulative_percent)).collect();
        assert_eq!(pct, [(40.0, 40.0), (40.0, 80.0), (20.0, 100.0)]);
        assert!(histogram_buckets(&new_histogram(), 16).is_empty());
        // A latency the histogram rounds (3 digits) stays in the range of its value.
        let mut h = new_histogram();
        h.record(123_456_789).unwrap();
        let b = histogram_buckets(&h, 128);
        assert_eq!(b.len(), 1);
        assert!(b[0].lo_ns <= 123_456_789 && 123_456_789 < b[0].hi_ns, "{b:?}");
    }
}
