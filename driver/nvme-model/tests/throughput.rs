//! How many commands per second the model completes for the hand-rolled test host (which pays
//! for its own mutex-guarded memory accesses too, so this is a lower bound for the model).
//! Run with `cargo test --release -p vfpoll-nvme-model --test throughput -- --ignored --nocapture`.

mod common;

use std::time::{Duration, Instant};

use common::*;
use vfpoll_nvme_model::{io_opcode as io, ModelConfig};

#[test]
#[ignore = "a measurement, not a check"]
fn reads_per_second() {
    let mut h = Host::started(ModelConfig {
        idle_spin: Duration::from_secs(1),
        ..Default::default()
    });
    h.create_qp(1, 64);
    let bufs: Vec<_> = (0..32).map(|_| h.mem.alloc(PAGE)).collect();
    for (op, name) in [(io::FLUSH, "flush"), (io::READ, "4 KiB read")] {
        let sqe = |i: usize| match op {
            io::READ => Sqe::rw(io::READ, 1, 8 * i as u64, 8).prp(bufs[i].get(), 0),
            _ => Sqe::new(io::FLUSH).nsid(1),
        };
        for i in 0..32 {
            h.push(1, sqe(i));
        }
        h.ring(1);
        let (t, n) = (Instant::now(), 200_000);
        for k in 0..n {
            h.reap_quiet(1, TIMEOUT).expect("completion").ok();
            h.ring_cq(1);
            h.submit(1, sqe(k % 32));
        }
        let e = t.elapsed();
        for _ in 0..32 {
            h.reap(1, TIMEOUT).unwrap();
        }
        println!(
            "{name}, queue depth 32: {:.0} commands/s ({:.0} ns each)",
            n as f64 / e.as_secs_f64(),
            e.as_nanos() as f64 / n as f64
        );
    }
}
