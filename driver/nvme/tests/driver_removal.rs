//! Device removal as the driver handles it (issue 12, item 3): `Controller::remove`, what the
//! VFIO removal watch does when the kernel asks for the device back, fails every request in
//! flight with `NvmeError::Removed` and hands the buffers back, refuses new requests with it,
//! and leaves the rest of the process (another controller) working; a removed controller is
//! dropped without a shutdown attempt.

mod drv;

use std::time::{Duration, Instant};

use drv::*;
use vfpoll_nvme::{NvmeError, QueuePair, RegionBuf};

/// How soon a polled queue pair must see the removal (the driver looks at every clock read,
/// about every 5 ms of polling); the rest is room for a loaded machine.
const BOUND: Duration = Duration::from_millis(250);

fn is_removed(e: &NvmeError) -> bool {
    matches!(e, NvmeError::Removed { bdf: None })
}

#[test]
fn requests_in_flight_fail_with_their_buffers_and_new_ones_are_refused() {
    let mut rig = rig(small_cfg(1024, 5));
    let other = rig_with(small_cfg(1024, 5), ctrl_opts());
    let mut qp: QueuePair<RegionBuf> = rig
        .ctrl
        .create_qpair(&qopts(64, Duration::from_secs(30)))
        .unwrap();
    let d = sync(
        &mut qp,
        |q, b| q.read(1, 0, b, 100),
        region_buf(&rig.ctrl, 0, &[0; 512]),
    );
    assert!(d.result.is_ok());

    // The device stops answering with eight reads in flight: they can only end by the removal.
    rig.model.remove().unwrap();
    for tag in 0..8u64 {
        let buf = region_buf(&rig.ctrl, 0, &[0x5a; 512]);
        qp.read(1, tag, buf, tag).map_err(|r| r.error).unwrap();
    }
    qp.flush_submissions();
    assert_eq!(qp.outstanding(), 8);

    let t = Instant::now();
    let report = rig.ctrl.remove();
    assert_eq!(report.bdf, None);
    assert!(rig.ctrl.removal_requested());
    assert_eq!(rig.ctrl.removed(), Some(report));
    assert_eq!(rig.ctrl.remove(), report, "idempotent");
    let done = wait_for(&mut qp, 8, HANG);
    let took = t.elapsed();
    assert!(took < BOUND, "the queue pair saw the removal after {took:?}");
    let mut tags: Vec<u64> = done.iter().map(|d| d.tag).collect();
    tags.sort_unstable();
    assert_eq!(tags, (0..8).collect::<Vec<_>>());
    for d in done {
        let e = d.result.unwrap_err();
        assert!(is_removed(&e), "{e}");
        assert!(e.to_string().contains("was removed"), "{e}");
        assert!(
            d.buf.is_some(),
            "the buffer comes back: the device can no longer write to it"
        );
    }
    assert_eq!(qp.outstanding(), 0);
    let why = qp.failed().expect("the queue pair failed").to_string();
    assert!(why.contains("was removed"), "{why}");

    // New requests are refused with the same error, buffer back.
    let buf = region_buf(&rig.ctrl, 0, &[0; 512]);
    let r = qp.read(1, 0, buf, 9).unwrap_err();
    assert!(is_removed(&r.error), "{}", r.error);

    // The other controller goes on.
    let mut oq: QueuePair<RegionBuf> = other
        .ctrl
        .create_qpair(&qopts(64, Duration::from_secs(30)))
        .unwrap();
    let d = sync(
        &mut oq,
        |q, b| q.read(1, 0, b, 1),
        region_buf(&other.ctrl, 0, &[0; 512]),
    );
    assert!(d.result.is_ok());
    assert!(other.ctrl.removed().is_none());

    // Dropping the removed controller's parts does not wait for a shutdown that cannot come.
    let t = Instant::now();
    drop(qp);
    drop(r);
    drop(rig);
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "teardown took {:?}",
        t.elapsed()
    );
}

#[test]
fn an_idle_queue_pair_on_another_thread_notices_at_once() {
    let rig = rig(small_cfg(1024, 5));
    let mut qp: QueuePair<RegionBuf> = rig
        .ctrl
        .create_qpair(&qopts(64, Duration::from_secs(30)))
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let poller = std::thread::spawn(move || {
        let _ = tx.send(());
        let start = Instant::now();
        while qp.failed().is_none() {
            assert_eq!(qp.poll(usize::MAX, |_| panic!("nothing was in flight")), 0);
            assert!(start.elapsed() < HANG, "the removal was never noticed");
        }
        qp
    });
    rx.recv().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let t = Instant::now();
    rig.ctrl.remove();
    let mut qp = poller.join().unwrap();
    assert!(t.elapsed() < BOUND, "noticed after {:?}", t.elapsed());
    let buf = region_buf(&rig.ctrl, 0, &[0; 512]);
    let r = qp.write(1, 0, buf, 1).unwrap_err();
    assert!(is_removed(&r.error), "{}", r.error);
    // Admin commands say so too.
    assert!(rig.ctrl.identify_raw(1, 0).is_err());
}
