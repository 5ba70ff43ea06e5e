//! The latency histogram every report and the breakdown use: nanoseconds at 3 significant
//! digits. At the bottom of the crate's reporting: `report` and `breakdown`
//! import it, it imports neither.

use hdrhistogram::Histogram;

/// Latency histograms hold nanoseconds from 1 ns to this, at 3 significant digits.
pub const MAX_LATENCY_NS: u64 = 3_600_000_000_000;

/// An empty latency histogram (nanoseconds).
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3).expect("valid histogram bounds")
}
