//! Health checks of a queue pair with nothing in flight: a controller that reports a fatal
//! status (CSTS.CFS: reset, and the queue pair re-created) or vanishes (all-ones reads: the
//! queue pair fails) is noticed within milliseconds of polling, whether the caller spins on
//! `poll` or polls now and then.

mod drv;

use std::time::{Duration, Instant};

use drv::*;
use vfpoll_nvme::{NvmeError, QueuePair, RegionBuf};

/// How soon an idle, polled queue pair must notice: the driver checks every 2 ms of polling;
/// the rest is room for a loaded machine (the model's thread must run to set CFS).
const BOUND: Duration = Duration::from_millis(250);

/// Polls `qp` every `gap` (spinning when zero) until it says it failed; returns how long that
/// took. Fails the test at `HANG`.
fn poll_until_failed(qp: &mut QueuePair<RegionBuf>, gap: Duration) -> Duration {
    poll_until(qp, gap, |qp| qp.failed().is_some())
}

/// Polls `qp` every `gap` until it went through a controller reset (CFS noticed, the reset
/// asked for and done, the queue pair settled).
fn poll_until_reset(qp: &mut QueuePair<RegionBuf>, gap: Duration) -> Duration {
    poll_until(qp, gap, |qp| qp.stats().resets != 0)
}

fn poll_until(
    qp: &mut QueuePair<RegionBuf>,
    gap: Duration,
    done: impl Fn(&QueuePair<RegionBuf>) -> bool,
) -> Duration {
    let start = Instant::now();
    while !done(qp) {
        assert_eq!(qp.poll(usize::MAX, |_| panic!("nothing was in flight")), 0);
        assert!(start.elapsed() < HANG, "the failure was never noticed");
        if !gap.is_zero() {
            std::thread::sleep(gap);
        }
    }
    start.elapsed()
}

fn idle_qpair(rig: &Rig) -> QueuePair<RegionBuf> {
    let mut qp = rig.ctrl.create_qpair(&qopts(64, Duration::from_secs(5))).unwrap();
    // Polls at the caller's usual rate before anything goes wrong.
    for _ in 0..10_000 {
        qp.poll(usize::MAX, |_| {});
    }
    assert_eq!(qp.failed(), None);
    qp
}

fn check_refused(qp: &mut QueuePair<RegionBuf>, rig: &Rig) {
    let buf = region_buf(&rig.ctrl, 0, &[0; 512]);
    match qp.read(1, 0, buf, 1) {
        Err(r) => assert!(matches!(r.error, NvmeError::Failed(_)), "{:?}", r.error),
        Ok(()) => panic!("a failed queue pair took a read"),
    }
}

#[test]
fn a_spinning_idle_queue_pair_notices_cfs() {
    let rig = rig(small_cfg(1024, 5));
    let mut qp = idle_qpair(&rig);
    rig.model.set_fatal();
    let took = poll_until_reset(&mut qp, Duration::ZERO);
    assert!(took < BOUND, "{took:?}");
    assert_eq!(qp.failed(), None);
    check_works(&mut qp, &rig);
}

#[test]
fn an_idle_queue_pair_polled_now_and_then_notices_cfs() {
    let rig = rig(small_cfg(1024, 5));
    let mut qp = idle_qpair(&rig);
    // The caller has slowed down to a poll every millisecond (a daemon that naps) for a while:
    // the queue pair reads the clock more often, so the next check is not hundreds of polls away.
    for _ in 0..300 {
        qp.poll(usize::MAX, |_| {});
        std::thread::sleep(Duration::from_millis(1));
    }
    rig.model.set_fatal();
    let took = poll_until_reset(&mut qp, Duration::from_millis(1));
    assert!(took < BOUND, "{took:?}");
    check_works(&mut qp, &rig);
}

#[test]
fn a_sudden_slowdown_costs_at_most_max_tick_polls() {
    let rig = rig(small_cfg(1024, 5));
    let mut qp = idle_qpair(&rig);
    // Fast polls, then the failure, then a poll every millisecond: the clock is read again
    // within 256 polls (the most between two reads), and from then on the check is due.
    rig.model.set_fatal();
    std::thread::sleep(Duration::from_millis(20));
    let mut polls = 0;
    while !rig.ctrl.resetting() && qp.stats().resets == 0 {
        qp.poll(usize::MAX, |_| {});
        polls += 1;
        assert!(polls <= 256 + 2, "{polls} polls and nothing noticed");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn an_idle_queue_pair_notices_a_vanished_controller() {
    let mut rig = rig(small_cfg(1024, 5));
    let mut qp = idle_qpair(&rig);
    rig.model.remove().unwrap();
    let took = poll_until_failed(&mut qp, Duration::ZERO);
    assert!(took < BOUND, "{took:?}");
    let why = qp.failed().unwrap().to_string();
    assert!(why.contains(&NvmeError::DeviceGone.to_string()), "{why}");
    check_refused(&mut qp, &rig);
}

#[test]
fn a_healthy_idle_queue_pair_keeps_working() {
    let rig = rig(small_cfg(1024, 5));
    let mut qp = idle_qpair(&rig);
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(50) {
        qp.poll(usize::MAX, |_| {});
    }
    assert_eq!(qp.failed(), None);
    let buf = region_buf(&rig.ctrl, 0, &[0; 512]);
    qp.read(1, 0, buf, 7).map_err(|r| r.error).unwrap();
    let done = qp_drain_one(&mut qp);
    assert_eq!(done, 7);
}

/// A read through `qp` succeeds (its queues were re-created after the reset).
fn check_works(qp: &mut QueuePair<RegionBuf>, rig: &Rig) {
    let buf = region_buf(&rig.ctrl, 0, &[0; 512]);
    qp.read(1, 0, buf, 9).map_err(|r| r.error).unwrap();
    assert_eq!(qp_drain_one(qp), 9);
    assert_eq!(rig.ctrl.resets(), (1, 0));
}

fn qp_drain_one(qp: &mut QueuePair<RegionBuf>) -> u64 {
    let mut tag = None;
    qp.drain(HANG, |d| {
        d.result.as_ref().unwrap();
        tag = Some(d.tag);
    })
    .unwrap();
    tag.expect("one completion")
}
