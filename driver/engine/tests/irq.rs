//! The engine in interrupt mode over the model: workers sleep on their queue pair's eventfd
//! when a poll finds nothing, and still complete every I/O (verify, counts, several workers).

use std::time::Duration;

use vfpoll_engine::{split_evenly, Engine, JobSpec, Limit, Workload};
use vfpoll_nvme::{CompletionMode, Controller, QpairOptions};
use vfpoll_nvme_model::{FaultCheck, ModelConfig, NamespaceConfig, NvmeModel};

mod common;
use common::ns;

fn bring_up(latency: Option<Duration>) -> (FaultCheck, NvmeModel, Controller) {
    let cfg = ModelConfig {
        completion_latency: latency,
        ..common::config(vec![
            NamespaceConfig::new(1, 512, 8192),
            NamespaceConfig::new(2, 4096, 2048),
        ])
    };
    let (check, model, ctrl) = common::bring_up(cfg);
    ctrl.use_interrupts(model.msix(9).unwrap()).unwrap();
    (check, model, ctrl)
}

fn job(workload: Workload, qd: u16, limit: Limit, completion: CompletionMode) -> JobSpec {
    JobSpec {
        queue_depth: qd,
        seed: 7,
        qpair: QpairOptions {
            completion,
            ..Default::default()
        },
        ..common::job(workload, limit)
    }
}

#[test]
fn irq_and_hybrid_workers_verify_and_count_exactly() {
    let (_no_stray_dma, model, ctrl) = bring_up(None);
    let modes = [
        CompletionMode::Irq,
        CompletionMode::Hybrid {
            spin: Duration::from_micros(50),
        },
    ];
    for mode in modes {
        let spaces = [ns(&ctrl, 1, Some(1 << 20)), ns(&ctrl, 2, Some(1 << 20))];
        let workers = split_evenly(&[None, None], &spaces, 4096).unwrap();
        let mut j = job(Workload::RandWrite, 8, Limit::Time(Duration::from_secs(1)), mode);
        j.verify = true;
        let r = Engine::start(j, workers)
            .unwrap()
            .run(Duration::from_secs(1), |_| {})
            .unwrap();
        let v = r.verify.clone().expect("verify report");
        assert!(r.passed(), "{mode:?}: {:?} {:?}", r.error_samples, v.samples);
        assert_eq!(v.mismatches, 0);

        let before = model.stats().io_commands(0x02);
        let workers = split_evenly(&[None], &[ns(&ctrl, 1, None)], 4096).unwrap();
        let r = Engine::start(job(Workload::RandRead, 1, Limit::Ios(300), mode), workers)
            .unwrap()
            .run(Duration::from_millis(50), |_| {})
            .unwrap();
        assert_eq!((r.read.ios, r.errors), (300, 0), "{mode:?}");
        assert_eq!(model.stats().io_commands(0x02) - before, 300);
    }
}

#[test]
fn an_irq_worker_sleeps_while_the_device_is_slow() {
    // 20 ms per command at queue depth 1: a polling worker would poll thousands of times per
    // completion; an interrupt-mode one once per completion plus once per 10 ms wait limit.
    let (_no_stray_dma, _model, ctrl) = bring_up(Some(Duration::from_millis(20)));
    let workers = split_evenly(&[None], &[ns(&ctrl, 1, None)], 4096).unwrap();
    let r = Engine::start(
        job(Workload::RandRead, 1, Limit::Ios(20), CompletionMode::Irq),
        workers,
    )
    .unwrap()
    .run(Duration::from_millis(50), |_| {})
    .unwrap();
    assert_eq!(r.read.ios, 20);
    let q = &r.workers[0].queues[0];
    assert!(
        q.polls <= 6 * 20,
        "{} polls for 20 I/Os: the worker did not sleep",
        q.polls
    );
}

#[test]
fn one_controller_per_worker_in_interrupt_mode() {
    let (_a, _ma, a) = bring_up(None);
    let (_b, _mb, b) = bring_up(None);
    let spaces = [ns(&a, 1, None), ns(&b, 1, None)];
    let workers = split_evenly(&[None], &spaces, 4096).unwrap();
    let e = Engine::start(
        job(Workload::RandRead, 1, Limit::Ios(10), CompletionMode::Irq),
        workers,
    )
    .and_then(|e| e.run(Duration::from_millis(50), |_| {}))
    .unwrap_err();
    let msg = format!("{e:#}")
        + &std::error::Error::source(&e)
            .map(|s| s.to_string())
            .unwrap_or_default();
    assert!(msg.contains("one controller"), "{msg}");
}
