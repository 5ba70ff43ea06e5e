//! The engine over the real driver and the in-process NVMe model: counts, mixes, several
//! workers and namespaces, I/O limits, verify passes and catches lost writes.

use std::time::Duration;

use vfpoll_engine::pattern::Found;
use vfpoll_engine::{split_evenly, Engine, JobSpec, Limit, Workload};
use vfpoll_nvme::Controller;
use vfpoll_nvme_model::{FaultCheck, NamespaceConfig, NvmeModel};

mod common;
use common::ns;

fn bring_up() -> (FaultCheck, NvmeModel, Controller) {
    common::bring_up(common::config(vec![
        NamespaceConfig::new(1, 512, 8192),
        NamespaceConfig::new(2, 4096, 2048),
    ]))
}

fn job(workload: Workload, io_size: usize, qd: u16, limit: Limit) -> JobSpec {
    JobSpec {
        io_size,
        queue_depth: qd,
        ..common::job(workload, limit)
    }
}

#[test]
fn an_io_count_is_exact_and_every_io_is_timed() {
    let (_no_stray_dma, model, ctrl) = bring_up();
    let workers = split_evenly(&[None], &[ns(&ctrl, 1, None)], 4096).unwrap();
    let r = Engine::start(job(Workload::RandRead, 4096, 8, Limit::Ios(5000)), workers)
        .unwrap()
        .run(Duration::from_millis(50), |_| {})
        .unwrap();
    assert_eq!((r.read.ios, r.write.ios, r.errors), (5000, 0, 0));
    assert_eq!(r.read.bytes, 5000 * 4096);
    assert_eq!(r.read.latency.len(), 5000);
    assert!(r.iops() > 0.0 && r.passed());
    let q = &r.workers[0].queues[0];
    assert_eq!((q.ios, q.stats.requests, q.stats.errors), (5000, 5000, 0));
    assert_eq!(model.stats().io_commands(0x02), 5000);
}

#[test]
fn the_qd1_breakdown_times_every_io_and_its_segments_make_the_cycle() {
    let (_no_stray_dma, model, ctrl) = bring_up();
    let workers = split_evenly(&[None, None], &[ns(&ctrl, 1, None)], 4096).unwrap();
    let mut j = job(Workload::RandRw, 4096, 1, Limit::Ios(4000));
    j.breakdown = true;
    let r = Engine::start(j, workers)
        .unwrap()
        .run(Duration::from_millis(50), |_| {})
        .unwrap();
    assert!(r.passed(), "{:?}", r.error_samples);
    assert_eq!(r.ios(), 4000);
    let b = r.breakdown.as_ref().expect("a breakdown run reports one");
    // Every I/O gets the three segments of its own life; the gap before the next submission
    // exists for all but each queue pair's last I/O (two workers: two queue pairs).
    for (name, h) in &b.segments()[..3] {
        assert_eq!(h.len(), 4000, "{name}");
    }
    assert_eq!(b.callback_to_submit.len(), 4000 - 2);
    for w in &r.workers {
        let wb = w.breakdown.as_ref().unwrap();
        assert_eq!(wb.submit_to_doorbell.len(), w.read.ios + w.write.ios);
    }
    // At queue depth 1 the segments tile the I/O's cycle: submit -> doorbell -> seen ->
    // callback -> next submit. Their means add up to no more than the mean latency the
    // engine measures (from the batch stamp before the submission to the one after the
    // poll) plus the gap between two I/Os, and the device's part dominates.
    let mean = |h: &vfpoll_engine::Histogram<u64>| h.mean();
    let device = mean(&b.doorbell_to_seen);
    let sum: f64 = b.segments().iter().map(|(_, h)| mean(h)).sum();
    let lat = r.latency().mean();
    assert!(sum > 0.0 && device > 0.0, "{sum} {device}");
    assert!(sum <= lat * 1.5 + 50_000.0, "segments {sum} ns, latency {lat} ns");
    assert!(device <= lat, "doorbell to seen {device} ns > latency {lat} ns");
    assert_eq!(
        model.stats().io_commands(0x02) + model.stats().io_commands(0x01),
        4000
    );
    // Off by default: no breakdown.
    let workers = split_evenly(&[None], &[ns(&ctrl, 1, None)], 4096).unwrap();
    let r = Engine::start(job(Workload::RandRead, 4096, 1, Limit::Ios(10)), workers)
        .unwrap()
        .run(Duration::from_millis(50), |_| {})
        .unwrap();
    assert!(r.breakdown.is_none() && r.workers[0].breakdown.is_none());
}

#[test]
fn two_workers_two_namespaces_mixed_for_a_time() {
    let (_no_stray_dma, model, ctrl) = bring_up();
    let spaces = [ns(&ctrl, 1, None), ns(&ctrl, 2, None)];
    let workers = split_evenly(&[None, None], &spaces, 8192).unwrap();
    // Disjoint halves of each namespace.
    assert_eq!(workers[0].targets[0].lbas, 0..4096);
    assert_eq!(workers[1].targets[0].lbas, 4096..8192);
    assert_eq!(workers[1].targets[1].lbas, 1024..2048);
    let mut ticks = 0;
    let r = Engine::start(
        job(Workload::RandRw, 8192, 4, Limit::Time(Duration::from_millis(400))),
        workers,
    )
    .unwrap()
    .run(Duration::from_millis(50), |p| {
        ticks += 1;
        assert!(p.ios >= p.iops as u64 / 100);
    })
    .unwrap();
    assert!(ticks >= 3, "{ticks} progress ticks");
    assert_eq!(r.errors, 0, "{:?}", r.error_samples);
    let (reads, writes) = (r.read.ios as f64, r.write.ios as f64);
    let share = reads / (reads + writes);
    assert!((0.6..0.8).contains(&share), "reads {reads}, writes {writes}");
    assert!(r.elapsed >= Duration::from_millis(400) && r.elapsed < Duration::from_secs(5));
    // One queue pair per worker (both namespaces share it), each driving both namespaces.
    assert_eq!(r.workers.len(), 2);
    for w in &r.workers {
        assert_eq!(w.queues.len(), 1);
        assert_eq!(w.queues[0].nsids, [1, 2]);
    }
    let st = model.stats();
    assert_eq!(st.io_commands(0x02) + st.io_commands(0x01), r.ios());
}

#[test]
fn a_warmup_runs_io_but_counts_none_of_it() {
    let (_no_stray_dma, model, ctrl) = bring_up();
    let workers = split_evenly(&[None], &[ns(&ctrl, 1, None)], 4096).unwrap();
    let mut j = job(
        Workload::RandRead,
        4096,
        8,
        Limit::Time(Duration::from_millis(300)),
    );
    j.warmup = Duration::from_millis(300);
    let (mut warm, mut measured, mut last_ios, mut warm_ios) = (0, 0, 0, 0);
    let t0 = std::time::Instant::now();
    let r = Engine::start(j, workers)
        .unwrap()
        .run(Duration::from_millis(20), |p| {
            if p.warming_up {
                warm += 1;
                // I/Os completed in the warm-up, as published at its last tick.
                warm_ios = p.ios;
            } else {
                measured += 1;
            }
            // The progress counts on through the warm-up's end.
            assert!(p.ios >= last_ios, "{} I/Os after {last_ios}", p.ios);
            last_ios = p.ios;
        })
        .unwrap();
    let wall = t0.elapsed();
    assert!(
        warm >= 5 && measured >= 5,
        "{warm} ticks warming up, {measured} after"
    );
    assert_eq!(r.errors, 0, "{:?}", r.error_samples);
    // The window is the time limit alone, the whole run both.
    assert!(
        r.elapsed >= Duration::from_millis(280) && r.elapsed < Duration::from_millis(600),
        "{:?}",
        r.elapsed
    );
    assert!(wall >= Duration::from_millis(600), "{wall:?}");
    // The device did the warm-up's reads too; the report counts the window's only (every
    // warm-up read published at a warm-up tick completed before the window, so the device's
    // count holds both), and the queue pair's traffic counters agree with it (up to the I/Os
    // in flight at the switch).
    let q = &r.workers[0].queues[0];
    let device = model.stats().io_commands(0x02);
    assert!(
        r.read.ios > 0 && warm_ios > 8 && device >= r.read.ios + warm_ios,
        "device {device}, report {}, warm-up {warm_ios}",
        r.read.ios
    );
    assert_eq!(q.ios, r.read.ios);
    assert_eq!(r.read.latency.len(), r.read.ios);
    for n in [q.stats.requests, q.stats.completions] {
        assert!(n.abs_diff(q.ios) <= 8, "{:?} for {} I/Os", q.stats, q.ios);
    }
}

#[test]
fn verify_writes_then_reads_every_block_once() {
    let (_no_stray_dma, model, ctrl) = bring_up();
    for (workload, io) in [(Workload::RandWrite, 4096), (Workload::Write, 16384)] {
        let spaces = [ns(&ctrl, 1, Some(1 << 20)), ns(&ctrl, 2, Some(2 << 20))];
        let workers = split_evenly(&[None, None], &spaces, io).unwrap();
        let mut j = job(workload, io, 16, Limit::Time(Duration::from_secs(1)));
        j.verify = true;
        let before = model.stats();
        let r = Engine::start(j, workers)
            .unwrap()
            .run(Duration::from_secs(1), |_| {})
            .unwrap();
        let v = r.verify.clone().expect("verify report");
        assert!(r.passed(), "{:?} {:?}", r.error_samples, v.samples);
        let blocks = (1 << 20) / 512 + (2 << 20) / 4096;
        assert_eq!(
            (v.blocks_written, v.blocks_checked, v.mismatches),
            (blocks, blocks, 0)
        );
        let st = model.stats();
        let units = (3 << 20) / io as u64;
        assert_eq!(st.io_commands(0x01) - before.io_commands(0x01), units);
        assert_eq!(st.io_commands(0x02) - before.io_commands(0x02), units);
    }
    // What is on the medium is the pattern, block by block.
    let data = model.read_ns(1, 100, 1).unwrap();
    assert_eq!(u64::from_le_bytes(data[..8].try_into().unwrap()), 100);
    assert_eq!(u64::from_le_bytes(data[8..16].try_into().unwrap()), 42);
}

#[test]
fn verify_reports_a_lost_write_with_its_lba() {
    let (_no_stray_dma, model, ctrl) = bring_up();
    // The first write fails without touching the medium: its blocks read back as zeroes.
    common::fail_next(&model, 0x01);
    let workers = split_evenly(&[None], &[ns(&ctrl, 2, Some(256 << 10))], 4096).unwrap();
    let mut j = job(Workload::Write, 4096, 1, Limit::Ios(1));
    j.verify = true;
    let r = Engine::start(j, workers)
        .unwrap()
        .run(Duration::from_secs(1), |_| {})
        .unwrap();
    assert!(!r.passed());
    assert_eq!(r.errors, 1, "{:?}", r.error_samples);
    assert!(
        r.error_samples[0].contains("Data Transfer Error"),
        "{:?}",
        r.error_samples
    );
    let v = r.verify.unwrap();
    assert_eq!(v.mismatches, 1);
    assert_eq!(v.samples[0].lba, 0, "sequential: the first write is LBA 0");
    assert_eq!((v.samples[0].nsid, &v.samples[0].found), (2, &Found::Zeroes));
}

#[test]
fn bad_jobs_are_refused_with_reasons() {
    let (_no_stray_dma, _model, ctrl) = bring_up();
    let e = split_evenly(&[None], &[ns(&ctrl, 2, None)], 512)
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a multiple of its 4096-byte blocks"), "{e}");
    let e = split_evenly(&[None], &[ns(&ctrl, 9, None)], 4096).unwrap_err();
    assert!(
        format!("{e:#}").contains("model") && std::error::Error::source(&e).is_some(),
        "{e}"
    );
    let e = split_evenly(&[None, None, None], &[ns(&ctrl, 2, Some(8192))], 4096)
        .unwrap_err()
        .to_string();
    assert!(e.contains("fewer than the 3 workers"), "{e}");
    let workers = split_evenly(&[None], &[ns(&ctrl, 1, None)], 4096).unwrap();
    let e = Engine::start(job(Workload::Read, 4096, 2000, Limit::Ios(1)), workers.clone())
        .unwrap_err()
        .to_string();
    assert!(e.contains("CAP.MQES"), "{e}");
    let e = Engine::start(job(Workload::Read, 4096, 0, Limit::Ios(1)), workers.clone())
        .unwrap_err()
        .to_string();
    assert!(e.contains("queue depth"), "{e}");
    let mut j = job(Workload::Read, 4096, 2, Limit::Ios(1));
    j.breakdown = true;
    let e = Engine::start(j.clone(), workers.clone()).unwrap_err().to_string();
    assert!(e.contains("needs queue depth 1, not 2"), "{e}");
    j.queue_depth = 1;
    j.verify = true;
    let e = Engine::start(j, workers.clone()).unwrap_err().to_string();
    assert!(e.contains("not a verify pass"), "{e}");
    let mut j = job(Workload::Read, 4096, 2, Limit::Ios(10));
    j.warmup = Duration::from_millis(100);
    let e = Engine::start(j, workers.clone()).unwrap_err().to_string();
    assert!(e.contains("precedes a timed run only"), "{e}");
    // A core that does not exist: the worker reports the affinity error.
    let mut w = workers;
    w[0].core = Some(1000);
    let e = Engine::start(job(Workload::Read, 4096, 1, Limit::Ios(1)), w).unwrap_err();
    let chain = format!("{e}: {}", std::error::Error::source(&e).unwrap());
    assert!(
        chain.contains("cannot pin a worker thread to core 1000"),
        "{chain}"
    );
}
