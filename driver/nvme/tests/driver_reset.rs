//! Controller reset and recovery through the real driver (issue 12): every way a reset starts
//! (the API, CSTS.CFS, a stuck admin command, an Abort that fails or times out), every way it
//! ends (the controller back with the same queue pairs working, or declared failed with a
//! clear reason), and the bound on a reset storm. In each: no hang, no panic, and every buffer
//! in flight comes back (counted in a pool) unless the controller could not be stopped.

mod drv;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use drv::*;
use vfpoll_dma::{DmaBuf, DmaPool, PageSize};
use vfpoll_nvme::{ControllerOptions, NvmeError, QpairOptions, QueuePair, ResetPolicy};
use vfpoll_nvme_model::{admin_opcode as adm, Fault, FaultKind, ModelConfig, Status};

const BLOCKS: u64 = 4096;
/// Queue pair timeout where aborts matter.
const T: Duration = Duration::from_millis(400);

fn cfg() -> ModelConfig {
    ModelConfig {
        // CAP.TO 500 ms: a controller that never gets ready costs half a second per wait.
        ready_timeout_500ms: 1,
        ..small_cfg(BLOCKS, 5)
    }
}

fn opts(policy: ResetPolicy) -> ControllerOptions {
    ControllerOptions {
        admin_timeout: Duration::from_millis(500),
        reset: policy,
        ..ctrl_opts()
    }
}

fn quick_policy() -> ResetPolicy {
    ResetPolicy {
        max_failures: 2,
        storm_resets: 3,
        window: Duration::from_secs(60),
        backoff: Duration::from_millis(5),
        max_backoff: Duration::from_millis(50),
    }
}

struct Fx {
    qp: QueuePair<DmaBuf>,
    pool: DmaPool,
    rig: Rig,
}

impl Fx {
    fn new(model: ModelConfig, policy: ResetPolicy, qopts: QpairOptions) -> Fx {
        let rig = rig_with(model, opts(policy));
        rig.model
            .write_ns(1, 0, &pattern(1, BLOCKS as usize * 512))
            .unwrap();
        let pool = rig.ctrl.dma().pool(4096, 32, PageSize::Base4K).unwrap();
        let qp = rig.ctrl.create_qpair::<DmaBuf>(&qopts).unwrap();
        Fx { qp, pool, rig }
    }

    /// Submits `n` reads of 8 blocks at LBA 8 * tag.
    fn reads(&mut self, n: u64) {
        for tag in 0..n {
            let b = self.pool.alloc().unwrap();
            self.qp.read(1, tag * 8, b, tag).map_err(|r| r.error).unwrap();
        }
    }

    /// A write then a read of it through the same queue pair.
    fn check_io(&mut self, lba: u64, seed: u64) {
        let d = pattern(seed, 4096);
        let b = self.pool.alloc().unwrap();
        self.pool.write(&b, 0, &d).unwrap();
        self.qp.write(1, lba, b, 100).map_err(|r| r.error).unwrap();
        let w = wait_for(&mut self.qp, 1, HANG).pop().unwrap();
        w.result.expect("a write after the reset");
        self.pool.free(w.buf.unwrap());
        let b = self.pool.alloc().unwrap();
        self.qp.read(1, lba, b, 101).map_err(|r| r.error).unwrap();
        let r = wait_for(&mut self.qp, 1, HANG).pop().unwrap();
        r.result.expect("a read after the reset");
        let b = r.buf.unwrap();
        let mut got = vec![0; 4096];
        self.pool.read(&b, 0, &mut got).unwrap();
        assert_eq!(got, d);
        self.pool.free(b);
    }

    /// Frees the buffers of `done`, checking their results with `ok`.
    fn give_back(
        &mut self,
        done: Vec<vfpoll_nvme::Done<DmaBuf>>,
        ok: impl Fn(&Result<u64, NvmeError>) -> bool,
    ) {
        for d in done {
            assert!(ok(&d.result), "tag {}: {:?}", d.tag, d.result);
            self.pool.free(d.buf.expect("the buffer comes back"));
        }
    }
}

fn is_reset(r: &Result<u64, NvmeError>) -> bool {
    matches!(r, Err(NvmeError::Reset { .. }))
}

/// Polls `qp` while `f` runs on another thread (a reset from any thread), collecting what
/// completes; returns `f`'s result and the completions.
fn poll_while<T: Send + 'static>(
    qp: &mut QueuePair<DmaBuf>,
    f: impl FnOnce() -> T + Send + 'static,
) -> (T, Vec<vfpoll_nvme::Done<DmaBuf>>) {
    let done = Arc::new(AtomicBool::new(false));
    let flag = done.clone();
    let h = std::thread::spawn(move || {
        let r = f();
        flag.store(true, Ordering::Release);
        r
    });
    let mut out = Vec::new();
    let start = Instant::now();
    while !done.load(Ordering::Acquire) {
        qp.poll(usize::MAX, |d| out.push(d));
        assert!(start.elapsed() < HANG, "hang");
        std::hint::spin_loop();
    }
    (h.join().unwrap(), out)
}

#[test]
fn api_reset_hands_back_every_buffer_and_the_queue_pair_goes_on() {
    let model = ModelConfig {
        // Commands stay in flight long enough for the reset to find them.
        completion_latency: Some(Duration::from_secs(2)),
        ..cfg()
    };
    let mut fx = Fx::new(model, ResetPolicy::default(), qopts(64, Duration::from_secs(30)));
    let qid = fx.qp.qid();
    fx.reads(16);
    fx.qp.flush_submissions();
    let ctrl = fx.rig.ctrl.clone();
    let start = Instant::now();
    let (report, mut done) = poll_while(&mut fx.qp, move || ctrl.reset());
    let report = report.expect("the reset");
    assert_eq!((report.attempts, report.function_reset), (1, false));
    assert!(report.took < PROMPT, "{report:?}");
    done.extend(wait_for(&mut fx.qp, 16 - done.len(), HANG));
    assert!(
        start.elapsed() < PROMPT,
        "every request back in {:?}",
        start.elapsed()
    );
    assert_eq!(done.len(), 16);
    for d in &done {
        match &d.result {
            Err(NvmeError::Reset { qid: q, op }) => assert_eq!((*q, *op), (qid, "Read")),
            other => panic!("tag {}: {other:?}", d.tag),
        }
    }
    fx.give_back(done, is_reset);
    assert_eq!(fx.pool.available(), fx.pool.capacity(), "nothing leaked");
    let st = fx.qp.stats();
    assert_eq!((st.resets, st.reset_errors, st.resubmitted), (1, 16, 0));
    // Same queue pair, same queue id, working; a new queue pair too.
    fx.rig.model.clear_faults();
    assert_eq!(fx.qp.qid(), qid);
    fx.check_io(100, 7);
    assert_eq!(fx.rig.ctrl.resets(), (1, 0));
    assert_eq!(fx.rig.model.resets(), (1, 0));
    let mut other = fx
        .rig
        .ctrl
        .create_qpair::<DmaBuf>(&qopts(8, Duration::from_secs(30)))
        .unwrap();
    assert_ne!(other.qid(), qid, "the reset queue pair keeps its queue id");
    let b = fx.pool.alloc().unwrap();
    other.read(1, 100, b, 1).map_err(|r| r.error).unwrap();
    let d = wait_for(&mut other, 1, HANG).pop().unwrap();
    d.result.unwrap();
    fx.pool.free(d.buf.unwrap());
    // Features set before the reset are set again after it.
    fx.rig.ctrl.set_volatile_write_cache(false).unwrap();
    fx.rig.ctrl.reset().unwrap();
    assert_eq!(
        fx.rig.ctrl.get_feature(0x06).unwrap() & 1,
        0,
        "volatile write cache off again"
    );
}

#[test]
fn resubmit_once_after_a_reset() {
    let model = ModelConfig {
        completion_latency: Some(Duration::from_millis(300)),
        ..cfg()
    };
    let q = QpairOptions {
        resubmit_on_reset: true,
        ..qopts(64, Duration::from_secs(30))
    };
    let mut fx = Fx::new(model, ResetPolicy::default(), q);
    fx.reads(8);
    fx.qp.flush_submissions();
    let ctrl = fx.rig.ctrl.clone();
    let (r, mut done) = poll_while(&mut fx.qp, move || ctrl.reset());
    r.unwrap();
    assert!(done.is_empty(), "resubmitted, not completed: {:?}", done.len());
    done.extend(wait_for(&mut fx.qp, 8, HANG));
    // Each read ran again after the reset, and reads what the namespace holds.
    let want = pattern(1, BLOCKS as usize * 512);
    for d in done {
        assert!(d.result.is_ok(), "tag {}: {:?}", d.tag, d.result);
        let b = d.buf.unwrap();
        let mut got = vec![0; 4096];
        fx.pool.read(&b, 0, &mut got).unwrap();
        let at = d.tag as usize * 8 * 512;
        assert_eq!(got, want[at..at + 4096], "tag {}", d.tag);
        fx.pool.free(b);
    }
    assert_eq!(fx.qp.stats().resubmitted, 8);
    // Once only: a request a second reset interrupts after its resubmission ends with the error.
    fx.reads(4);
    fx.qp.flush_submissions();
    let ctrl = fx.rig.ctrl.clone();
    let (r, _) = poll_while(&mut fx.qp, move || ctrl.reset());
    r.unwrap();
    let ctrl = fx.rig.ctrl.clone();
    let (r, mut done) = poll_while(&mut fx.qp, move || {
        // Let the queue pair re-create its queues and resubmit first.
        std::thread::sleep(Duration::from_millis(50));
        ctrl.reset()
    });
    r.unwrap();
    done.extend(wait_for(&mut fx.qp, 4 - done.len(), HANG));
    fx.give_back(done, is_reset);
    assert_eq!(fx.qp.stats().resubmitted, 12);
    assert_eq!(fx.pool.available(), fx.pool.capacity());
    fx.check_io(200, 8);
}

#[test]
fn a_stuck_admin_command_resets_the_controller() {
    let mut fx = Fx::new(cfg(), ResetPolicy::default(), qopts(16, T));
    fx.rig
        .model
        .inject(Fault::new(FaultKind::Drop).admin().opcode(adm::GET_FEATURES));
    let start = Instant::now();
    match fx.rig.ctrl.get_feature(0x06) {
        Err(NvmeError::Timeout { op, .. }) => assert_eq!(op, "Get Features"),
        other => panic!("{other:?}"),
    }
    // The recovery thread resets; the queue pair re-creates its queues at its next polls.
    while fx.rig.ctrl.resets().0 == 0 {
        fx.qp.poll(usize::MAX, |_| panic!("nothing in flight"));
        assert!(start.elapsed() < HANG, "no reset after the stuck admin command");
        std::thread::sleep(Duration::from_millis(1));
    }
    fx.rig
        .ctrl
        .get_feature(0x06)
        .expect("admin works after the reset");
    fx.check_io(300, 9);
    assert_eq!(fx.qp.stats().resets, 1);
}

#[test]
fn an_abort_that_fails_resets_at_once() {
    let mut fx = Fx::new(cfg(), ResetPolicy::default(), qopts(16, T));
    let qid = fx.qp.qid();
    fx.rig.model.inject(Fault::new(FaultKind::Drop).on_sq(qid));
    fx.rig.model.inject(
        Fault::new(FaultKind::Status(Status::INVALID_FIELD))
            .admin()
            .opcode(adm::ABORT),
    );
    let start = Instant::now();
    fx.reads(1);
    let done = wait_for(&mut fx.qp, 1, HANG);
    let took = start.elapsed();
    assert!(
        took >= T && took < 2 * T,
        "the failed abort's reset after {took:?}"
    );
    fx.give_back(done, is_reset);
    assert_eq!(fx.qp.stats().aborts, 1);
    fx.check_io(400, 10);
    assert_eq!(fx.pool.available(), fx.pool.capacity());
}

fn abort_requested(r: &Result<u64, NvmeError>) -> bool {
    matches!(r, Err(NvmeError::Status { status, .. }) if status.sc() == 0x07)
}

#[test]
fn an_abort_that_times_out_resets() {
    let mut fx = Fx::new(cfg(), ResetPolicy::default(), qopts(16, T));
    let qid = fx.qp.qid();
    fx.rig.model.inject(Fault::new(FaultKind::Drop).on_sq(qid));
    // The Abort runs (the read completes with Command Abort Requested) but its own completion
    // never comes: an admin command stuck, which only a reset clears.
    fx.rig
        .model
        .inject(Fault::new(FaultKind::Drop).admin().opcode(adm::ABORT));
    fx.reads(2);
    let mut done = wait_for(&mut fx.qp, 2, HANG);
    done.sort_by_key(|d| d.tag);
    assert!(abort_requested(&done[0].result), "{:?}", done[0].result);
    assert!(done[1].result.is_ok(), "{:?}", done[1].result);
    fx.give_back(done, |_| true);
    let start = Instant::now();
    while fx.rig.ctrl.resets().0 == 0 {
        fx.qp.poll(usize::MAX, |_| panic!("nothing in flight"));
        assert!(start.elapsed() < HANG, "no reset after the abort timed out");
        std::thread::sleep(Duration::from_millis(1));
    }
    fx.check_io(500, 11);
    assert_eq!(fx.qp.stats().resets, 1);
}

#[test]
fn the_acl_bounds_aborts_running_at_once() {
    // ACL is 3: at most 4 Aborts at once. 8 commands stuck, each Abort runs but never
    // completes: 4 are sent, their commands end aborted, the other 4 wait for a free abort
    // until the first Abort times out, which resets the controller and ends them.
    let mut fx = Fx::new(cfg(), ResetPolicy::default(), qopts(16, T));
    let qid = fx.qp.qid();
    fx.rig
        .model
        .inject(Fault::new(FaultKind::Drop).on_sq(qid).times(8));
    fx.rig
        .model
        .inject(Fault::new(FaultKind::Drop).admin().opcode(adm::ABORT).times(8));
    assert_eq!(fx.rig.ctrl.identify().acl, 3);
    fx.reads(8);
    let done = wait_for(&mut fx.qp, 8, HANG);
    let aborted = done.iter().filter(|d| abort_requested(&d.result)).count();
    let reset = done.iter().filter(|d| is_reset(&d.result)).count();
    assert_eq!((aborted, reset), (4, 4));
    fx.give_back(done, |_| true);
    assert_eq!(fx.rig.model.stats().admin_commands(adm::ABORT), 4);
    assert_eq!(fx.qp.stats().aborts, 4);
    assert_eq!(fx.pool.available(), fx.pool.capacity());
}

#[test]
fn a_request_timeout_of_its_own() {
    let mut fx = Fx::new(cfg(), ResetPolicy::default(), qopts(16, Duration::from_secs(30)));
    let qid = fx.qp.qid();
    fx.rig.model.inject(Fault::new(FaultKind::Drop).on_sq(qid));
    fx.reads(1);
    assert!(fx.qp.set_request_timeout(0, Duration::from_millis(100)));
    assert!(!fx.qp.set_request_timeout(77, Duration::from_millis(100)));
    let start = Instant::now();
    let done = wait_for(&mut fx.qp, 1, HANG);
    let took = start.elapsed();
    // Aborted (Command Abort Requested) after its own 100 ms, not the queue pair's 30 s.
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert!(abort_requested(&done[0].result), "{:?}", done[0].result);
    fx.give_back(done, |_| true);
}

#[test]
fn a_controller_that_does_not_disable_gets_a_function_reset() {
    let mut fx = Fx::new(cfg(), ResetPolicy::default(), qopts(16, T));
    fx.rig.model.hang_on_disable(1);
    let used = Arc::new(AtomicBool::new(false));
    let seen = used.clone();
    // The model's function reset stands in for VFIO's.
    let flr = fx.rig.model.function_reset_handle();
    fx.rig.ctrl.set_function_reset(move || {
        seen.store(true, Ordering::Release);
        Ok(flr.reset())
    });
    let r = fx.rig.ctrl.reset().expect("back after the function reset");
    assert!(r.function_reset && used.load(Ordering::Acquire), "{r:?}");
    assert_eq!(fx.rig.ctrl.resets(), (1, 1));
    assert_eq!(fx.rig.model.resets().1, 1);
    fx.check_io(600, 12);
}

#[test]
fn a_controller_that_does_not_come_back_gets_a_function_reset_then_is_declared_failed() {
    let model = ModelConfig {
        completion_latency: Some(Duration::from_secs(5)),
        ..cfg()
    };
    let mut fx = Fx::new(model, quick_policy(), qopts(16, Duration::from_secs(30)));
    // Comes back once after a function reset...
    fx.rig.model.hang_on_enable(1);
    let flr = fx.rig.model.function_reset_handle();
    fx.rig.ctrl.set_function_reset(move || Ok(flr.reset()));
    let r = fx.rig.ctrl.reset().expect("back after the function reset");
    assert!(r.function_reset, "{r:?}");
    fx.rig.model.clear_faults();
    // ... then never again: every attempt fails, the controller is declared failed.
    fx.reads(4);
    fx.qp.flush_submissions();
    fx.rig.model.hang_on_enable(100);
    let ctrl = fx.rig.ctrl.clone();
    let start = Instant::now();
    let (r, mut done) = poll_while(&mut fx.qp, move || ctrl.reset());
    let took = start.elapsed();
    match r {
        Err(NvmeError::Failed(why)) => assert!(why.contains("reset attempts failed in a row"), "{why}"),
        other => panic!("{other:?}"),
    }
    // Two attempts, each waiting CAP.TO (0.5 s) twice (before and after the function reset).
    assert!(took < Duration::from_secs(5), "{took:?}");
    let why = fx.rig.ctrl.failed().expect("declared failed");
    done.extend(wait_for(&mut fx.qp, 4 - done.len(), HANG));
    // The controller was disabled each time it failed to come back: the buffers come back.
    for d in done {
        assert!(
            matches!(
                &d.result,
                Err(NvmeError::Reset { .. }) | Err(NvmeError::Failed(_))
            ),
            "{:?}",
            d.result
        );
        fx.pool.free(d.buf.expect("handed back"));
    }
    assert_eq!(fx.pool.available(), fx.pool.capacity());
    let start = Instant::now();
    while fx.qp.failed().is_none() {
        fx.qp.poll(usize::MAX, |_| {});
        assert!(start.elapsed() < PROMPT, "the queue pair never saw the failure");
    }
    assert_eq!(fx.qp.failed(), Some(why.as_str()));
    let b = fx.pool.alloc().unwrap();
    let r = fx.qp.read(1, 0, b, 9).unwrap_err();
    assert!(matches!(r.error, NvmeError::Failed(_)), "{:?}", r.error);
    fx.pool.free(r.buf);
    assert!(matches!(fx.rig.ctrl.smart_log(), Err(NvmeError::Failed(_))));
    assert!(fx.rig.ctrl.create_qpair::<DmaBuf>(&qopts(4, T)).is_err());
    let start = Instant::now();
    drop(fx.qp);
    assert!(start.elapsed() < PROMPT, "dropping took {:?}", start.elapsed());
}

#[test]
fn a_controller_that_cannot_be_stopped_is_failed_and_keeps_the_buffers() {
    let model = ModelConfig {
        completion_latency: Some(Duration::from_secs(5)),
        ..cfg()
    };
    let mut fx = Fx::new(model, quick_policy(), qopts(16, Duration::from_secs(30)));
    fx.reads(4);
    fx.qp.flush_submissions();
    // Hangs at CC.EN 1 -> 0 and has no function reset: it may still write anywhere.
    fx.rig.model.hang_on_disable(1);
    let ctrl = fx.rig.ctrl.clone();
    let (r, mut done) = poll_while(&mut fx.qp, move || ctrl.reset());
    match r {
        Err(NvmeError::Failed(why)) => assert!(why.contains("did not disable"), "{why}"),
        other => panic!("{other:?}"),
    }
    done.extend(wait_for(&mut fx.qp, 4 - done.len(), HANG));
    for d in &done {
        assert!(matches!(d.result, Err(NvmeError::Failed(_))), "{:?}", d.result);
        assert!(
            d.buf.is_none(),
            "a buffer the device may still write must not come back"
        );
    }
    assert_eq!(fx.pool.available(), fx.pool.capacity() - 4);
    assert!(fx.qp.failed().is_some());
    // Tear-down does not hang (the shutdown waits CAP.TO, 0.5 s, and gives up).
    let Fx { qp, pool, rig } = fx;
    let start = Instant::now();
    drop(qp);
    std::mem::forget(pool); // four of its buffers are leaked on purpose
    drop(rig);
    assert!(start.elapsed() < PROMPT, "tear-down took {:?}", start.elapsed());
}

#[test]
fn a_reset_storm_is_bounded() {
    let mut fx = Fx::new(cfg(), quick_policy(), qopts(16, T));
    // CFS again and again: the first three are reset, with back-off; the fourth gives up.
    for n in 1..=4u64 {
        fx.rig.model.set_fatal();
        let start = Instant::now();
        loop {
            fx.qp.poll(usize::MAX, |_| panic!("nothing in flight"));
            if n <= 3 && fx.rig.ctrl.resets().0 == n && !fx.rig.ctrl.resetting() {
                break;
            }
            if n == 4 && fx.qp.failed().is_some() {
                break;
            }
            assert!(start.elapsed() < HANG, "reset {n}: {:?}", fx.qp.stats());
            std::thread::sleep(Duration::from_micros(200));
        }
        if n <= 3 {
            fx.check_io(700 + n * 8, n);
        }
    }
    let why = fx.rig.ctrl.failed().expect("declared failed");
    assert!(why.contains("reset storm"), "{why}");
    assert_eq!(fx.qp.failed(), Some(why.as_str()));
    assert_eq!(fx.rig.ctrl.resets().0, 3);
    assert_eq!(fx.pool.available(), fx.pool.capacity());
}

#[test]
fn a_vanished_controller_is_failed_and_hands_the_buffers_back() {
    let model = ModelConfig {
        completion_latency: Some(Duration::from_secs(5)),
        ..cfg()
    };
    let mut fx = Fx::new(model, ResetPolicy::default(), qopts(16, T));
    fx.reads(4);
    fx.qp.flush_submissions();
    fx.rig.model.remove().unwrap();
    let done = wait_for(&mut fx.qp, 4, HANG);
    for d in done {
        assert!(matches!(d.result, Err(NvmeError::Failed(_))), "{:?}", d.result);
        fx.pool.free(
            d.buf
                .expect("a vanished device writes nothing: the buffer comes back"),
        );
    }
    assert_eq!(fx.pool.available(), fx.pool.capacity());
    assert!(fx.rig.ctrl.failed().unwrap().contains("no longer answers"));
}

#[test]
fn an_interrupt_mode_queue_pair_wakes_again_after_a_reset() {
    let model = ModelConfig {
        completion_latency: Some(Duration::from_secs(2)),
        ..cfg()
    };
    let rig = rig_with(model, opts(ResetPolicy::default()));
    rig.ctrl.use_interrupts(rig.model.msix(4).unwrap()).unwrap();
    let mut pool = rig.ctrl.dma().pool(4096, 8, PageSize::Base4K).unwrap();
    let q = QpairOptions {
        completion: vfpoll_nvme::CompletionMode::Irq,
        ..qopts(16, Duration::from_secs(30))
    };
    let mut qp = rig.ctrl.create_qpair::<DmaBuf>(&q).unwrap();
    qp.read(1, 0, pool.alloc().unwrap(), 1)
        .map_err(|r| r.error)
        .unwrap();
    qp.flush_submissions();
    rig.ctrl.reset().unwrap();
    // A sleeper is told to poll (arm says so once the controller was reset), and the poll
    // settles the read.
    let start = Instant::now();
    let mut done = Vec::new();
    while done.is_empty() {
        if !qp.arm().unwrap() {
            qp.wait(Some(Duration::from_millis(10))).unwrap();
        }
        qp.poll(usize::MAX, |d| done.push(d));
        assert!(start.elapsed() < HANG, "never woke after the reset");
    }
    assert!(is_reset(&done[0].result), "{:?}", done[0].result);
    pool.free(done.pop().unwrap().buf.unwrap());
    // The re-created CQ interrupts on the same vector: a read wakes a sleeping wait.
    let vector = qp.vector();
    qp.read(1, 8, pool.alloc().unwrap(), 2)
        .map_err(|r| r.error)
        .unwrap();
    let start = Instant::now();
    while done.is_empty() {
        if !qp.arm().unwrap() {
            qp.wait(Some(Duration::from_secs(5))).unwrap();
        }
        qp.poll(usize::MAX, |d| done.push(d));
        assert!(start.elapsed() < HANG, "no completion after the reset");
    }
    done[0].result.as_ref().expect("a read after the reset");
    // Woken by the interrupt when the 2 s completion came, not by the 5 s limit.
    assert!(start.elapsed() < Duration::from_secs(4), "{:?}", start.elapsed());
    assert_eq!(qp.vector(), vector);
    assert_eq!(qp.stats().resets, 1);
}
