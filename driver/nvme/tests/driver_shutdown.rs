//! Controller shutdown on drop (NVMe Base 2.0 §3.6): the normal shutdown waits up to RTD3E, then
//! the driver falls back to an abrupt one. The model is told how to answer
//! ([`ShutdownBehavior`]) and counts the shutdowns it completed.

mod drv;

use std::time::{Duration, Instant};

use drv::*;
use vfpoll_nvme_model::{ModelConfig, ShutdownBehavior};

fn cfg(rtd3e_us: u32, shutdown: ShutdownBehavior) -> ModelConfig {
    ModelConfig {
        rtd3e_us,
        shutdown,
        ..small_cfg(1024, 5)
    }
}

/// Drops the controller of a fresh rig; returns how long the drop took and the model's
/// (normal, abrupt) shutdown counts.
fn drop_ctrl(cfg: ModelConfig) -> (Duration, (u64, u64)) {
    let Rig {
        ctrl,
        model,
        mapper,
        faults,
    } = rig(cfg);
    let start = Instant::now();
    drop(ctrl);
    let took = start.elapsed();
    let counts = model.shutdowns();
    drop((model, mapper, faults));
    (took, counts)
}

#[test]
fn rtd3e_is_read_from_identify() {
    let r = rig(cfg(1_234_567, ShutdownBehavior::Complete));
    assert_eq!(r.ctrl.identify().rtd3e, 1_234_567);
    let l = r.ctrl.shutdown_limits();
    assert_eq!(l.normal, Duration::from_micros(1_234_567));
    // The model's CAP.TO is 5 s: the abrupt wait is capped at 2 s.
    assert_eq!(l.abrupt, Duration::from_secs(2));
}

#[test]
fn a_normal_shutdown_that_completes_is_not_followed_by_an_abrupt_one() {
    let (took, counts) = drop_ctrl(cfg(2_000_000, ShutdownBehavior::Complete));
    assert_eq!(counts, (1, 0));
    assert!(took < PROMPT, "{took:?}");
}

#[test]
fn shutdown_falls_back_to_abrupt_after_rtd3e() {
    // RTD3E 0.8 s; CAP.TO of the model is 5 s, so a wait bounded by CAP.TO (or by today's 10 s
    // fallback) would take far longer than the bound below.
    let (took, counts) = drop_ctrl(cfg(800_000, ShutdownBehavior::AbruptOnly));
    assert_eq!(
        counts,
        (0, 1),
        "the abrupt shutdown completed, the normal one never did"
    );
    assert!(
        took >= Duration::from_millis(800),
        "gave up before RTD3E: {took:?}"
    );
    assert!(
        took < Duration::from_millis(800) + Duration::from_secs(2),
        "{took:?}"
    );
}

#[test]
fn without_rtd3e_the_wait_is_cap_to() {
    // RTD3E 0: the normal shutdown may take CAP.TO (5 s for the model) before the fallback.
    let (took, counts) = drop_ctrl(cfg(0, ShutdownBehavior::AbruptOnly));
    assert_eq!(counts, (0, 1));
    assert!(took >= Duration::from_secs(5), "{took:?}");
    assert!(took < Duration::from_secs(5) + PROMPT, "{took:?}");
}

#[test]
fn a_controller_that_never_shuts_down_is_given_up_on_in_bounded_time() {
    // Normal (0.6 s) and abrupt (2 s: CAP.TO capped) both time out; the drop then disables the
    // controller and returns (leaking its admin queue memory, as it must).
    let (took, counts) = drop_ctrl(cfg(600_000, ShutdownBehavior::Never));
    assert_eq!(counts, (0, 0));
    assert!(took >= Duration::from_millis(2600), "{took:?}");
    assert!(took < Duration::from_millis(2600) + PROMPT, "{took:?}");
}
