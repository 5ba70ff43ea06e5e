//! Interrupt mode over the model: CQs created with IEN/IV, `QueuePair::wait` sleeping on the
//! vector's eventfd until a completion, timing out without one, hybrid spinning, vectors
//! running out, and the lost-wakeup protocol of `arm` (with and without shadow doorbells).

mod drv;

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use drv::*;
use vfpoll_nvme::{CompletionMode, NvmeError, QpairOptions, QueuePair, RegionBuf};
use vfpoll_nvme_model::ModelConfig;

fn irq_opts(mode: CompletionMode) -> QpairOptions {
    QpairOptions {
        entries: 32,
        completion: mode,
        ..Default::default()
    }
}

/// This thread's CPU time (user + system) from /proc, in clock ticks of 10 ms.
fn thread_cpu_ticks() -> u64 {
    let s = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
    // Fields after the command (in parentheses): state is field 3, utime 14, stime 15.
    let rest = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

fn cfg(latency: Option<Duration>, shadow: bool) -> ModelConfig {
    ModelConfig {
        completion_latency: latency,
        doorbell_buffer_config: shadow,
        ..small_cfg(1024, 5)
    }
}

fn one_read(r: &Rig, qp: &mut QueuePair<RegionBuf>, tag: u64) {
    let buf = region_buf(&r.ctrl, 0, &[0u8; 4096]);
    qp.read(1, tag * 8, buf, tag).map_err(|r| r.error).unwrap();
}

#[test]
fn wait_sleeps_until_the_completion_interrupts() {
    for shadow in [false, true] {
        let r = rig(cfg(Some(Duration::from_millis(300)), shadow));
        r.ctrl.use_interrupts(r.model.msix(4).unwrap()).unwrap();
        assert_eq!(r.ctrl.shadow_doorbells(), shadow);
        let mut qp = r
            .ctrl
            .create_qpair::<RegionBuf>(&irq_opts(CompletionMode::Irq))
            .unwrap();
        assert_eq!(qp.vector(), Some(1), "vector 0 is the admin queue's");
        assert_eq!(qp.completion_mode(), CompletionMode::Irq);
        assert!(qp.as_raw_fd() >= 0 && qp.event_fd().is_some());
        for round in 0..3u64 {
            one_read(&r, &mut qp, round);
            let (t, cpu) = (Instant::now(), thread_cpu_ticks());
            // `wait` rings the SQ doorbell itself: the read is only written, not announced.
            let mut woke = false;
            while !woke {
                woke = qp.wait(Some(HANG)).unwrap();
            }
            let (slept, used) = (t.elapsed(), thread_cpu_ticks() - cpu);
            assert!(
                slept >= Duration::from_millis(250),
                "woke after {slept:?}, before the completion"
            );
            assert!(slept < HANG, "shadow {shadow}: no wakeup");
            assert!(
                used <= 5,
                "shadow {shadow}: {used} ticks of CPU in {slept:?}: it spun instead of sleeping"
            );
            let done = wait_for(&mut qp, 1, PROMPT);
            assert_eq!(done[0].tag, round);
            done[0].result.as_ref().unwrap();
        }
    }
}

#[test]
fn wait_times_out_without_completions_and_arm_clears_stale_interrupts() {
    let r = rig(cfg(None, true));
    let fds = r.model.msix(2).unwrap();
    let spare = fds[1].try_clone().unwrap();
    r.ctrl.use_interrupts(fds).unwrap();
    let mut qp = r
        .ctrl
        .create_qpair::<RegionBuf>(&irq_opts(CompletionMode::Irq))
        .unwrap();
    let t = Instant::now();
    assert!(!qp.wait(Some(Duration::from_millis(100))).unwrap());
    assert!(t.elapsed() >= Duration::from_millis(95), "{:?}", t.elapsed());

    // Completions consumed by `poll` leave interrupts in the counter: `arm` takes them, and
    // announces the consumed entries even below poll's doorbell batch.
    one_read(&r, &mut qp, 1);
    wait_for(&mut qp, 1, PROMPT);
    let before = qp.stats();
    assert!(
        spare.wait(Some(Duration::ZERO)).unwrap(),
        "the completion interrupted"
    );
    assert!(!qp.arm().unwrap(), "nothing to poll");
    assert!(
        !spare.wait(Some(Duration::ZERO)).unwrap(),
        "arm cleared the eventfd"
    );
    let after = qp.stats();
    assert_eq!(
        after.cq_doorbells + after.shadow_only,
        before.cq_doorbells + before.shadow_only + 1,
        "arm released the consumed entry"
    );
    // A completion that lands between arm and the sleep is in the counter: no lost wakeup.
    one_read(&r, &mut qp, 2);
    qp.flush_submissions();
    let t = Instant::now();
    while t.elapsed() < PROMPT && !spare.wait(Some(Duration::ZERO)).unwrap() {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(qp.event_fd().is_some());
    assert!(
        spare.wait(Some(Duration::ZERO)).unwrap(),
        "interrupt pending before the sleep"
    );
    assert!(qp.wait(Some(Duration::from_secs(5))).unwrap());
    assert!(t.elapsed() < Duration::from_secs(4));
    assert_eq!(wait_for(&mut qp, 1, PROMPT)[0].tag, 2);
}

#[test]
fn hybrid_spins_first_then_sleeps() {
    let r = rig(cfg(None, true));
    r.ctrl.use_interrupts(r.model.msix(2).unwrap()).unwrap();
    let spin = Duration::from_millis(200);
    let mut qp = r
        .ctrl
        .create_qpair::<RegionBuf>(&irq_opts(CompletionMode::Hybrid { spin }))
        .unwrap();
    // A prompt completion is caught while spinning.
    one_read(&r, &mut qp, 1);
    let t = Instant::now();
    assert!(qp.wait(Some(HANG)).unwrap());
    assert!(t.elapsed() < spin, "{:?}", t.elapsed());
    assert_eq!(wait_for(&mut qp, 1, PROMPT)[0].tag, 1);
    // Idle: spins for `spin` (CPU), then sleeps until the timeout (no CPU).
    let (t, cpu) = (Instant::now(), thread_cpu_ticks());
    assert!(!qp.wait(Some(Duration::from_millis(700))).unwrap());
    let (took, used) = (t.elapsed(), thread_cpu_ticks() - cpu);
    assert!(took >= Duration::from_millis(690), "{took:?}");
    assert!(
        used <= 45,
        "{used} ticks: slept after spinning {spin:?} of {took:?}"
    );
}

#[test]
fn vectors_run_out_with_a_clear_error_and_come_back() {
    let r = rig(cfg(None, false));
    let e = r
        .ctrl
        .create_qpair::<RegionBuf>(&irq_opts(CompletionMode::Irq))
        .unwrap_err();
    assert!(
        matches!(e, NvmeError::Unsupported(_)) && e.to_string().contains("use_interrupts"),
        "{e}"
    );
    assert!(
        r.ctrl.use_interrupts(r.model.msix(1).unwrap()).is_err(),
        "vector 0 only"
    );
    r.ctrl.use_interrupts(r.model.msix(3).unwrap()).unwrap();
    assert!(
        r.ctrl.use_interrupts(r.model.msix(3).unwrap()).is_err(),
        "set once"
    );
    let a = r
        .ctrl
        .create_qpair::<RegionBuf>(&irq_opts(CompletionMode::Irq))
        .unwrap();
    let mut polled = r
        .ctrl
        .create_qpair::<RegionBuf>(&QpairOptions::default())
        .unwrap();
    let b = r
        .ctrl
        .create_qpair::<RegionBuf>(&irq_opts(CompletionMode::Irq))
        .unwrap();
    assert_eq!(
        (a.vector(), b.vector(), polled.vector()),
        (Some(1), Some(2), None)
    );
    let e = r
        .ctrl
        .create_qpair::<RegionBuf>(&irq_opts(CompletionMode::Irq))
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("all 3 supplied interrupt vectors are in use"),
        "{e}"
    );
    let e = polled.wait(Some(Duration::ZERO)).unwrap_err();
    assert!(e.to_string().contains("CompletionMode::Poll"), "{e}");
    drop(a);
    let c = r
        .ctrl
        .create_qpair::<RegionBuf>(&irq_opts(CompletionMode::Irq))
        .unwrap();
    assert_eq!(c.vector(), Some(1), "given back when the queue pair went");
}

#[test]
fn the_controller_checks_the_vector() {
    // The driver has 4 vectors, the model's table only 2: Create I/O CQ with IV 2 fails with
    // Invalid Interrupt Vector, and the queue id and vector are given back.
    let r = rig(cfg(None, false));
    let mut fds = r.model.msix(2).unwrap();
    fds.extend(r.model.msix(2).unwrap());
    r.ctrl.use_interrupts(fds).unwrap();
    let _keep = r.model.msix(2).unwrap();
    let a = r
        .ctrl
        .create_qpair::<RegionBuf>(&irq_opts(CompletionMode::Irq))
        .unwrap();
    let e = r
        .ctrl
        .create_qpair::<RegionBuf>(&irq_opts(CompletionMode::Irq))
        .unwrap_err();
    assert_eq!(status_of::<()>(&Err(e)).sc(), 0x08, "Invalid Interrupt Vector");
    drop(a);
    r.ctrl
        .create_qpair::<RegionBuf>(&irq_opts(CompletionMode::Irq))
        .unwrap();
}
