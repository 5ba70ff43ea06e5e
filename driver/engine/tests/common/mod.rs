//! What the engine's tests over the in-process model share: a controller brought up on a model,
//! a namespace of it, and a job with the fields the tests do not care about filled in.

// Each test binary uses a part of this module.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use vfpoll_dma::{DmaContext, FakeMapper, PageSize};
use vfpoll_engine::{JobSpec, Limit, Namespace, Workload};
use vfpoll_nvme::{Controller, ControllerOptions};
use vfpoll_nvme_model::{
    Fault, FaultCheck, FaultKind, FaultLog, ModelConfig, NamespaceConfig, NvmeModel, Status,
};

/// A model with `namespaces`, whose threads spin 200 ms before they sleep (so that a test's
/// short pauses do not add wake-up latency).
pub fn config(namespaces: Vec<NamespaceConfig>) -> ModelConfig {
    ModelConfig {
        namespaces,
        idle_spin: Duration::from_millis(200),
        ..Default::default()
    }
}

/// Starts a model with `cfg` and brings up a controller (4 KiB pages, 8 I/O queues) on it.
/// Dropping the [`FaultCheck`] fails the test if the model saw a DMA the driver did not map.
pub fn bring_up(cfg: ModelConfig) -> (FaultCheck, NvmeModel, Controller) {
    let mapper = Arc::new(FakeMapper::new());
    let log = Arc::new(FaultLog::new(mapper.clone()));
    let model = NvmeModel::start(cfg, log.clone()).unwrap();
    let opts = ControllerOptions {
        page_size: PageSize::Base4K,
        io_queues: 8,
        ..Default::default()
    };
    let ctrl = Controller::new(model.bar0(), DmaContext::new(mapper), opts).unwrap();
    (FaultCheck(log), model, ctrl)
}

/// Namespace `nsid` of `ctrl`, all of it or its first `size` bytes.
pub fn ns(ctrl: &Controller, nsid: u32, size: Option<u64>) -> Namespace {
    Namespace {
        ctrl: ctrl.clone(),
        device: "model".into(),
        nsid,
        size,
    }
}

/// A job of 4 KiB I/Os at queue depth 1, 70 % reads in a mix, no warm-up, no verify, until
/// `limit`; tests change the fields they are about.
pub fn job(workload: Workload, limit: Limit) -> JobSpec {
    JobSpec {
        workload,
        rwmix_read: 70,
        io_size: 4096,
        queue_depth: 1,
        limit,
        warmup: Duration::ZERO,
        verify: false,
        breakdown: false,
        seed: 42,
        qpair: Default::default(),
        buffer_page: PageSize::Base4K,
    }
}

/// Makes the model fail its next I/O command with `opcode` (Data Transfer Error), without
/// touching the medium.
pub fn fail_next(model: &NvmeModel, opcode: u8) {
    model.inject(
        Fault::new(FaultKind::Status(Status::DATA_TRANSFER_ERROR))
            .io()
            .opcode(opcode),
    );
}
