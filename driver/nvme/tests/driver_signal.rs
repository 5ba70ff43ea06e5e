//! The signal handlers' shutdown ([`vfpoll_nvme::shutdown_all`]) over several controllers:
//! each keeps its own RTD3E-based wait, and a controller dropped while a handler is shutting it
//! down waits for the handler before its BAR can go away.
//!
//! `shutdown_all` reaches every controller of the process, so this file holds one test: no
//! other test's controllers are around when it runs.

mod drv;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use drv::*;
use vfpoll_nvme::regs::{off, Cc};
use vfpoll_nvme::ShutdownReport;
use vfpoll_nvme_model::{ModelConfig, ShutdownBehavior};

fn cfg(rtd3e_us: u32) -> ModelConfig {
    ModelConfig {
        rtd3e_us,
        // The normal shutdown never completes: each controller falls back to an abrupt one
        // when its own wait runs out, which shows whose wait was used.
        shutdown: ShutdownBehavior::AbruptOnly,
        ..small_cfg(1024, 5)
    }
}

/// Milliseconds since `t0` at which CC.SHN of `bar` first read 10b (abrupt), 0 = not yet.
fn watch_abrupt(bar: vfpoll_pci::mmio::Mmio, t0: Instant, at: Arc<AtomicU64>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while t0.elapsed() < HANG {
            if Cc(bar.read32(off::CC)).0 >> 14 & 0b11 == 0b10 {
                at.store(t0.elapsed().as_millis() as u64, Ordering::SeqCst);
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    })
}

#[test]
fn shutdown_all_keeps_each_controllers_wait_and_a_drop_waits_for_it() {
    // Registered in this order: with the old registry, the last one's wait (0.5 s) overwrote
    // the others'.
    let a = rig(cfg(700_000));
    let b = rig(cfg(1_500_000));
    let c = rig(cfg(500_000));
    let t0 = Instant::now();
    let at: Vec<Arc<AtomicU64>> = (0..2).map(|_| Arc::new(AtomicU64::new(0))).collect();
    // `c` is shut down abruptly and dropped within a millisecond: too short a window to watch.
    let watchers: Vec<_> = [&a, &b]
        .iter()
        .zip(&at)
        .map(|(r, at)| watch_abrupt(r.model.bar0(), t0, at.clone()))
        .collect();
    let handler = std::thread::spawn(move || {
        let r = vfpoll_nvme::shutdown_all();
        (r, t0.elapsed())
    });
    // While the handler is shutting `c` down (its normal wait is 0.5 s), `c` is dropped: the drop
    // must not get its BAR back before the handler is done with it. The drop waits until the
    // handler has begun on `c` (CC.SHN = 01b): a fixed sleep let a handler thread that a loaded
    // host started late find `c` shut down by its drop already (two abrupt shutdowns).
    let c_bar = c.model.bar0();
    while Cc(c_bar.read32(off::CC)).0 >> 14 & 0b11 == 0 {
        assert!(
            t0.elapsed() < Duration::from_millis(400),
            "the handler never began on c"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let Rig {
        ctrl,
        model: c_model,
        mapper: c_mapper,
        faults: c_faults,
    } = c;
    drop(ctrl);
    let c_dropped = t0.elapsed();
    let (report, handler_took) = handler.join().unwrap();
    for w in watchers {
        w.join().unwrap();
    }
    let ms: Vec<u64> = at.iter().map(|a| a.load(Ordering::SeqCst)).collect();
    assert_eq!(
        report,
        ShutdownReport {
            abrupt: 3,
            ..Default::default()
        }
    );
    // Each went abrupt when its own RTD3E ran out (less the handler clock's millisecond steps).
    assert!((698..1400).contains(&ms[0]), "a: {ms:?}");
    assert!((1498..2200).contains(&ms[1]), "b: {ms:?}");
    assert!(handler_took >= Duration::from_millis(1498), "{handler_took:?}");
    // The drop of `c` (at 0.1 s) got on only once the handler was done with `c` (its abrupt
    // shutdown at 0.5 s); its own shutdown then found `c` shut down already: one abrupt
    // shutdown in all, and the drop did not wait for the handler's other controllers.
    assert!(c_dropped >= Duration::from_millis(498), "{c_dropped:?}");
    assert!(c_dropped < Duration::from_millis(1400), "{c_dropped:?}");
    assert_eq!(c_model.shutdowns(), (0, 1));
    drop((c_model, c_mapper, c_faults, a, b));
}
