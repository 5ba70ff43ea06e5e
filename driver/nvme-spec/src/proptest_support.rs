//! What the property tests of this crate and of the driver (`vfpoll-nvme`, through the
//! `proptest` feature) share: their configuration and a strategy for controller pages. Test
//! builds only.
//!
//! Each property runs a fixed number of cases, so `cargo test` (and `cargo xtask test`) stays
//! bounded; `PROPTEST_CASES=100000 cargo test -p vfpoll-nvme-spec props` (or `-p vfpoll-nvme`)
//! runs a longer search by hand. A failing case is kept in `proptest-regressions/` beside the
//! crate and replayed first on later runs.

use proptest::prelude::*;

/// `cases` cases per property, unless `PROPTEST_CASES` says otherwise.
pub fn config(cases: u32) -> ProptestConfig {
    let mut c = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        c.cases = cases;
    }
    c
}

/// A page of 4096 bytes or more (a controller's page, or a caller's longer buffer): one byte
/// value throughout or noise from a seed, then up to 48 bytes set anywhere. Cheaper than 4096
/// separate random bytes, and it still shrinks to a few telling bytes.
pub fn page() -> impl Strategy<Value = Vec<u8>> {
    (
        4096usize..4200,
        any::<u8>(),
        prop::option::of(any::<u64>()),
        prop::collection::vec((0usize..4200, any::<u8>()), 0..48),
    )
        .prop_map(|(len, fill, seed, pokes)| {
            let mut b = vec![fill; len];
            if let Some(mut x) = seed {
                for v in &mut b {
                    // xorshift64: any noise will do.
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    *v = x as u8;
                }
            }
            for (at, v) in pokes {
                if at < len {
                    b[at] = v;
                }
            }
            b
        })
}
