//! The engine across controller resets: I/Os a reset interrupts are issued again (not errors),
//! so a verify pass that a thread keeps resetting under still reads back every block as
//! written, every I/O counted once; and the longest gap between completions shows the resets.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use vfpoll_engine::{split_evenly, Engine, JobSpec, Limit, Workload};
use vfpoll_nvme_model::{ModelConfig, NamespaceConfig};

mod common;

#[test]
fn verify_holds_while_the_controller_is_reset_again_and_again() {
    let cfg = ModelConfig {
        // I/Os stay in flight long enough for the resets to catch them.
        completion_latency: Some(Duration::from_micros(300)),
        ..common::config(vec![NamespaceConfig::new(1, 512, 16384)])
    };
    let (no_stray_dma, _model, ctrl) = common::bring_up(cfg);
    let space = common::ns(&ctrl, 1, None);
    let workers = split_evenly(&[None, None], &[space], 4096).unwrap();
    let job = JobSpec {
        rwmix_read: 0,
        queue_depth: 32,
        verify: true,
        seed: 7,
        ..common::job(Workload::RandWrite, Limit::Ios(u64::MAX))
    };
    let stop = Arc::new(AtomicBool::new(false));
    let (s, c) = (stop.clone(), ctrl.clone());
    let resetter = std::thread::spawn(move || {
        let mut n = 0;
        while !s.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(20));
            c.reset().expect("a reset under load");
            n += 1;
        }
        n
    });
    let r = Engine::start(job, workers)
        .unwrap()
        .run(Duration::from_millis(50), |_| {})
        .unwrap();
    stop.store(true, Ordering::Release);
    let resets = resetter.join().unwrap();
    let v = r.verify.as_ref().unwrap();
    assert_eq!((v.mismatches, r.errors), (0, 0), "{:?}", r.error_samples);
    // 8 MiB in 4 KiB I/Os, written then read: each counted once, however often issued.
    assert_eq!((v.blocks_written, v.blocks_checked), (16384, 16384));
    assert_eq!((r.write.ios, r.read.ios), (2048, 2048));
    let queues: Vec<_> = r.workers.iter().flat_map(|w| &w.queues).collect();
    let reissued: u64 = queues.iter().map(|q| q.reissued).sum();
    let seen: u64 = queues.iter().map(|q| q.stats.resets).max().unwrap();
    assert!(
        resets >= 1 && seen >= 1,
        "{resets} resets, queue pairs saw {seen}"
    );
    assert!(reissued >= 1, "no I/O was interrupted by {resets} resets");
    let reset_errors: u64 = queues.iter().map(|q| q.stats.reset_errors).sum();
    assert_eq!(reissued, reset_errors, "every interrupted I/O issued again");
    assert!(queues.iter().all(|q| q.max_gap > Duration::ZERO));
    drop(r);
    drop(ctrl);
    no_stray_dma.0.assert_none();
}
