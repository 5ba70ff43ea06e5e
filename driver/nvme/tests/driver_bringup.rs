//! Bring-up and shutdown through the real driver: a controller that refuses to enable (CSTS.CFS),
//! one that never sets CSTS.RDY, one that is gone, admin failures during bring-up; a controller
//! left enabled by an earlier process; and a clean shutdown on drop.
//!
//! "Never becomes ready" and "gone" are a model whose thread was stopped: its BAR stays mapped,
//! nobody answers, and the test writes CAP (a short CAP.TO) or all ones into it. The driver's log
//! is captured per thread, to see what it reports on drop.

mod drv;

use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use drv::*;
use vfpoll_dma::{DmaContext, FakeMapper};
use vfpoll_nvme::regs::{off, Cc, Csts, Shutdown};
use vfpoll_nvme::{Controller, NvmeError, QueuePair, RegionBuf};
use vfpoll_nvme_model::{admin_opcode as adm, Fault, FaultKind, ModelConfig, NvmeModel, Status};
use vfpoll_pci::mmio::Mmio;

// ---- Log capture ----

static LOGS: Mutex<Vec<(ThreadId, log::Level, String)>> = Mutex::new(Vec::new());

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, r: &log::Record<'_>) {
        if r.target().starts_with("vfpoll_nvme") && !r.target().starts_with("vfpoll_nvme_model") {
            let line = (std::thread::current().id(), r.level(), r.args().to_string());
            LOGS.lock().unwrap_or_else(|e| e.into_inner()).push(line);
        }
    }
    fn flush(&self) {}
}

static CAPTURE: Capture = Capture;

fn capture_logs() {
    let _ = log::set_logger(&CAPTURE);
    log::set_max_level(log::LevelFilter::Debug);
}

/// The driver's log lines of this thread so far, at `level` or more severe.
fn my_logs(level: log::Level) -> Vec<String> {
    let me = std::thread::current().id();
    LOGS.lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|(t, l, _)| *t == me && *l <= level)
        .map(|(_, _, s)| s.clone())
        .collect()
}

// ---- Helpers ----

/// The BAR of a model whose thread has stopped: registers as it left them, no one answering.
fn dead_bar() -> Mmio {
    let model = NvmeModel::start(ModelConfig::default(), Arc::new(FakeMapper::new())).unwrap();
    let bar = model.bar0();
    model.stop().unwrap();
    bar
}

/// CAP of the default model with CAP.TO = `units` × 500 ms.
fn cap_with_timeout(units: u64) -> u64 {
    ModelConfig::default().cap() & !(0xff << 24) | units << 24
}

fn cc(bar: &Mmio) -> Cc {
    Cc(bar.read32(off::CC))
}

fn csts(bar: &Mmio) -> Csts {
    Csts(bar.read32(off::CSTS))
}

/// Brings up a controller on `bar` with a fresh mapper; returns the result, the mapper and the
/// time it took.
fn try_bring_up(bar: Mmio, mapper: Arc<FakeMapper>) -> (Result<Controller, NvmeError>, Duration) {
    let start = Instant::now();
    let r = Controller::new(bar, DmaContext::new(mapper), ctrl_opts());
    (r, start.elapsed())
}

/// A model with `fault` armed before bring-up, and the bring-up result.
fn bring_up_with(
    fault: Fault,
    admin_timeout: Duration,
) -> (NvmeModel, Arc<FakeMapper>, Result<Controller, NvmeError>) {
    let mapper = Arc::new(FakeMapper::new());
    let model = NvmeModel::start(small_cfg(1024, 5), mapper.clone()).unwrap();
    model.inject(fault);
    let opts = vfpoll_nvme::ControllerOptions {
        admin_timeout,
        ..ctrl_opts()
    };
    let r = Controller::new(model.bar0(), DmaContext::new(mapper.clone()), opts);
    (model, mapper, r)
}

// ---- Tests ----

#[test]
fn an_enable_refused_with_cfs_is_controller_fatal_at_once() {
    // The model reaches host memory through its own, empty IOMMU: the admin queues do not
    // translate, so it refuses CC.EN = 1 with CSTS.CFS, as QEMU's controller does.
    let model = NvmeModel::start(ModelConfig::default(), Arc::new(FakeMapper::new())).unwrap();
    // CAP.TO 30 s: far beyond the bound below, however loaded the machine.
    model.bar0().write64(off::CAP, cap_with_timeout(60));
    let (r, took) = try_bring_up(model.bar0(), Arc::new(FakeMapper::new()));
    match r {
        Err(e @ NvmeError::ControllerFatal { .. }) => {
            assert!(e.to_string().contains("fatal status (CSTS.CFS"), "{e}");
        }
        other => panic!("expected ControllerFatal, got {other:?}"),
    }
    assert!(took < PROMPT, "CFS is seen at once, not after CAP.TO: {took:?}");
}

#[test]
fn ready_never_set_is_init_timeout_within_cap_to() {
    let bar = dead_bar();
    bar.write64(off::CAP, cap_with_timeout(1));
    let (r, took) = try_bring_up(bar, Arc::new(FakeMapper::new()));
    match r {
        Err(
            ref e @ NvmeError::InitTimeout {
                step: "enable",
                limit,
                waited,
                ..
            },
        ) => {
            assert_eq!(limit, Duration::from_millis(500));
            assert!(waited > limit, "{waited:?}");
            let text = e.to_string();
            assert!(
                text.contains("`enable` timed out") && text.contains("CAP.TO allows 500ms"),
                "{text}"
            );
        }
        other => panic!("expected an enable timeout, got {other:?}"),
    }
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_millis(500) + PROMPT,
        "bring-up gave up after {took:?} (CAP.TO 500 ms)"
    );
}

/// After a failed enable the controller must not be left enabled over admin queue memory that
/// was freed: a controller that becomes ready late would fetch commands from freed (and, behind
/// an IOMMU, unmapped and reused) memory. Either disable it first, or leak the memory.
#[test]
fn a_failed_enable_leaves_no_enabled_controller_over_freed_memory() {
    // Never ready.
    let bar = dead_bar();
    bar.write64(off::CAP, cap_with_timeout(1));
    let mapper = Arc::new(FakeMapper::new());
    let (r, _) = try_bring_up(bar.clone(), mapper.clone());
    assert!(matches!(r, Err(NvmeError::InitTimeout { .. })), "{r:?}");
    assert!(
        !cc(&bar).enabled() || !mapper.live_mappings().is_empty(),
        "CC.EN is still 1, and the admin queues' memory was unmapped and freed"
    );
    // Fatal at enable.
    let model = NvmeModel::start(ModelConfig::default(), Arc::new(FakeMapper::new())).unwrap();
    let mapper = Arc::new(FakeMapper::new());
    let (r, _) = try_bring_up(model.bar0(), mapper.clone());
    assert!(matches!(r, Err(NvmeError::ControllerFatal { .. })), "{r:?}");
    assert!(
        !cc(&model.bar0()).enabled() || !mapper.live_mappings().is_empty(),
        "CC.EN is still 1 over freed admin queues"
    );
}

#[test]
fn a_device_that_is_gone_is_reported_at_once() {
    let bar = dead_bar();
    bar.write64(off::CAP, u64::MAX);
    let (r, took) = try_bring_up(bar, Arc::new(FakeMapper::new()));
    assert!(matches!(r, Err(NvmeError::DeviceGone)), "{r:?}");
    let bar = dead_bar();
    // CAP.TO 30 s (all-ones CAP above: 127.5 s): far beyond the bound below.
    bar.write64(off::CAP, cap_with_timeout(60));
    bar.write32(off::CSTS, u32::MAX);
    let (r, took2) = try_bring_up(bar, Arc::new(FakeMapper::new()));
    match r {
        Err(e @ NvmeError::DeviceGone) => assert!(e.to_string().contains("no longer answers"), "{e}"),
        other => panic!("expected DeviceGone, got {other:?}"),
    }
    assert!(took + took2 < PROMPT, "{took:?} {took2:?}");
}

#[test]
fn identify_failing_at_bring_up_disables_the_controller_and_frees_its_memory() {
    let (model, mapper, r) = bring_up_with(
        Fault::new(FaultKind::Status(Status::INVALID_FIELD))
            .admin()
            .opcode(adm::IDENTIFY),
        Duration::from_secs(3),
    );
    match r {
        Err(
            e @ NvmeError::Status {
                op: "Identify Controller",
                ..
            },
        ) => {
            assert!(
                e.to_string()
                    .contains("Identify Controller failed: Invalid Field in Command"),
                "{e}"
            );
        }
        other => panic!("expected Identify Controller to fail, got {other:?}"),
    }
    assert!(!cc(&model.bar0()).enabled() && !csts(&model.bar0()).ready());
    assert!(
        mapper.live_mappings().is_empty(),
        "the admin queue memory was released after disabling"
    );
}

#[test]
fn a_lost_admin_command_at_bring_up_times_out_and_disables() {
    let start = Instant::now();
    let (model, mapper, r) = bring_up_with(
        Fault::new(FaultKind::Drop).admin().opcode(adm::IDENTIFY),
        Duration::from_millis(300),
    );
    let took = start.elapsed();
    match r {
        Err(NvmeError::Timeout {
            op: "Identify Controller",
            qid: 0,
            timeout,
            ..
        }) => assert_eq!(timeout, Duration::from_millis(300)),
        other => panic!("expected an admin timeout, got {other:?}"),
    }
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_millis(300) + PROMPT,
        "{took:?}"
    );
    assert!(!cc(&model.bar0()).enabled());
    assert!(mapper.live_mappings().is_empty());
}

#[test]
fn controller_fatal_during_bring_up_is_reported_and_reset() {
    let (model, mapper, r) = bring_up_with(
        Fault::new(FaultKind::ControllerFatal)
            .admin()
            .opcode(adm::SET_FEATURES),
        Duration::from_secs(3),
    );
    assert!(matches!(r, Err(NvmeError::ControllerFatal { .. })), "{r:?}");
    // CC.EN = 0 reset the controller: CFS is clear again.
    assert!(!cc(&model.bar0()).enabled());
    assert_eq!(csts(&model.bar0()).0, 0);
    assert!(mapper.live_mappings().is_empty());
}

#[test]
fn a_controller_left_enabled_is_reset_and_brought_up_again() {
    let r = rig(small_cfg(1024, 5));
    let mut qp = r
        .ctrl
        .create_qpair::<RegionBuf>(&qopts(8, Duration::from_secs(5)))
        .unwrap();
    let d = pattern(1, 4096);
    sync(&mut qp, |q, b| q.write(1, 8, b, 1), region_buf(&r.ctrl, 0, &d))
        .result
        .unwrap();
    // A process that died: nothing shut down, nothing freed.
    let Rig { ctrl, model, .. } = r;
    let dma = ctrl.dma().clone();
    std::mem::forget(qp);
    std::mem::forget(ctrl);
    assert!(cc(&model.bar0()).enabled() && csts(&model.bar0()).ready());
    let ctrl = Controller::new(model.bar0(), dma, ctrl_opts()).expect("bring-up over an enabled controller");
    let mut qp = ctrl
        .create_qpair::<RegionBuf>(&qopts(8, Duration::from_secs(5)))
        .unwrap();
    assert_eq!(qp.qid(), 1, "the reset deleted the old queues");
    let got = sync(
        &mut qp,
        |q, b| q.read(1, 8, b, 2),
        region_buf(&ctrl, 0, &[0; 4096]),
    );
    got.result.unwrap();
    assert_eq!(contents(&got.buf.unwrap()), d);
    drop(qp);
    drop(ctrl);
}

#[test]
fn drop_shuts_the_controller_down_cleanly_and_frees_all_dma_memory() {
    capture_logs();
    let cfg = ModelConfig {
        serial: "VFPOLL-SHUTDOWN-1".into(),
        ..small_cfg(1024, 5)
    };
    let r = rig(cfg);
    let bar = r.model.bar0();
    let mut qp: QueuePair<RegionBuf> = r.ctrl.create_qpair(&qopts(8, Duration::from_secs(5))).unwrap();
    sync(
        &mut qp,
        |q, b| q.write(1, 0, b, 1),
        region_buf(&r.ctrl, 0, &[1; 512]),
    )
    .result
    .unwrap();
    drop(qp);
    let st = r.model.stats();
    assert_eq!(
        (
            st.admin_commands(adm::DELETE_IO_SQ),
            st.admin_commands(adm::DELETE_IO_CQ)
        ),
        (1, 1)
    );
    let Rig {
        ctrl, model, mapper, ..
    } = r;
    let start = Instant::now();
    drop(ctrl);
    assert!(start.elapsed() < PROMPT, "shutdown took {:?}", start.elapsed());
    // CC.SHN = normal was written, then CC.EN cleared once CSTS.SHST said complete.
    let c = cc(&bar);
    assert_eq!((c.0 >> 14) & 3, Shutdown::Normal as u32, "CC {c:?}");
    assert!(!c.enabled() && !csts(&bar).ready());
    let debug = my_logs(log::Level::Debug);
    assert!(
        debug
            .iter()
            .any(|l| l == "controller VFPOLL-SHUTDOWN-1 shut down"),
        "the driver saw CSTS.SHST = complete: {debug:?}"
    );
    assert_eq!(
        my_logs(log::Level::Warn),
        Vec::<String>::new(),
        "no warning or error"
    );
    assert!(mapper.live_mappings().is_empty(), "every DMA mapping released");
    drop(model);
}

#[test]
fn dropping_a_queue_pair_with_lost_commands_deletes_its_queues_and_frees_memory() {
    capture_logs();
    let r = rig(small_cfg(1024, 5));
    let mut qp: QueuePair<RegionBuf> = r
        .ctrl
        .create_qpair(&qopts(8, Duration::from_millis(200)))
        .unwrap();
    let qid = qp.qid();
    r.model.inject(Fault::new(FaultKind::Drop).on_sq(qid));
    r.model
        .inject(Fault::new(FaultKind::Delay(Duration::from_secs(30))).on_sq(qid));
    // Abort refused, so the commands stay lost until the queue is deleted.
    let refuse = Status::command_specific(0x03);
    r.model.inject(
        Fault::new(FaultKind::Status(refuse))
            .admin()
            .opcode(adm::ABORT)
            .times(4),
    );
    qp.write(1, 0, region_buf(&r.ctrl, 0, &[2; 512]), 1)
        .map_err(|r| r.error)
        .unwrap();
    qp.read(1, 0, region_buf(&r.ctrl, 0, &[0; 512]), 2)
        .map_err(|r| r.error)
        .unwrap();
    qp.flush_submissions();
    let start = Instant::now();
    drop(qp);
    assert!(start.elapsed() < PROMPT, "drop took {:?}", start.elapsed());
    let st = r.model.stats();
    assert_eq!(
        (
            st.admin_commands(adm::DELETE_IO_SQ),
            st.admin_commands(adm::DELETE_IO_CQ)
        ),
        (1, 1)
    );
    let errors = my_logs(log::Level::Error);
    assert!(errors.is_empty(), "{errors:?}");
    let Rig {
        ctrl, model, mapper, ..
    } = r;
    drop(ctrl);
    assert!(
        mapper.live_mappings().is_empty(),
        "the queue pair's memory was freed after deletion"
    );
    drop(model);
}
