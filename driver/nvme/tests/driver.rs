//! The model under the real driver, as the driver's own tests will use it: `vfpoll-nvme` over a
//! `vfpoll_dma::DmaContext` whose `FakeMapper` is also the model's IOMMU. A smoke test that the
//! two agree on registers, bring-up and the queue protocol; the driver's tests go further.

use std::sync::Arc;
use std::time::Duration;

use vfpoll_dma::{DmaContext, DmaMapper, FakeMapper, PageSize};
use vfpoll_nvme::{Controller, ControllerOptions, NvmeError, QpairOptions, RegionBuf};
use vfpoll_nvme_model::{FaultLog, ModelConfig, NamespaceConfig, NvmeModel, Status};

/// The model reaches memory through a fault log over the driver's mapper: each test checks at
/// its end that the controller made no DMA outside the driver's mappings, or only the one it
/// provoked.
fn bring_up(cfg: ModelConfig) -> (NvmeModel, Controller, Arc<FakeMapper>, Arc<FaultLog>) {
    let mapper = Arc::new(FakeMapper::new());
    let log = Arc::new(FaultLog::new(mapper.clone()));
    let model = NvmeModel::start(cfg, log.clone()).unwrap();
    let opts = ControllerOptions {
        page_size: PageSize::Base4K,
        io_queues: 4,
        ..Default::default()
    };
    let ctrl = Controller::new(model.bar0(), DmaContext::new(mapper.clone()), opts).unwrap();
    (model, ctrl, mapper, log)
}

#[test]
fn driver_reads_what_it_wrote() {
    let cfg = ModelConfig {
        namespaces: vec![NamespaceConfig::new(1, 512, 4096)],
        ..Default::default()
    };
    let (model, ctrl, _, log) = bring_up(cfg);
    assert_eq!((ctrl.namespaces().len(), ctrl.namespaces()[0].blocks), (1, 4096));
    // PRPs, then SGLs, each on a fresh queue pair (the second reuses queue ID 1).
    for sgl in [false, true] {
        let mut pool = ctrl.dma().pool(4096, 8, PageSize::Base4K).unwrap();
        let opts = QpairOptions {
            entries: 16,
            sgl,
            ..Default::default()
        };
        let mut qp = ctrl.create_qpair::<vfpoll_dma::DmaBuf>(&opts).unwrap();
        let buf = pool.alloc().unwrap();
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 + sgl as u32) as u8).collect();
        pool.write(&buf, 0, &data).unwrap();
        qp.write(1, 16, buf, 1).map_err(|r| r.error).unwrap();
        let mut back = None;
        qp.drain(Duration::from_secs(5), |d| {
            d.result.expect("write ok");
            back = d.buf;
        })
        .unwrap();
        assert_eq!(model.read_ns(1, 16, 8).unwrap(), data, "sgl {sgl}");
        let buf = back.expect("buffer back");
        pool.write(&buf, 0, &[0; 4096]).unwrap();
        qp.read(1, 16, buf, 2).map_err(|r| r.error).unwrap();
        let mut got = vec![0; 4096];
        qp.drain(Duration::from_secs(5), |d| {
            d.result.expect("read ok");
            pool.read(d.buf.as_ref().unwrap(), 0, &mut got).unwrap();
        })
        .unwrap();
        assert_eq!(got, data, "sgl {sgl}");
    }
    let st = model.stats();
    assert_eq!((st.io_commands(0x01), st.io_commands(0x02), st.errors), (2, 2, 0));
    log.assert_none();
}

#[test]
fn an_unmapped_buffer_is_a_data_transfer_error() {
    let (model, ctrl, mapper, log) = bring_up(ModelConfig::default());
    let region = ctrl.dma().alloc_region(4096, PageSize::Base4K).unwrap();
    let iova = region.iova().unwrap();
    let mut qp = ctrl
        .create_qpair::<RegionBuf>(&QpairOptions {
            entries: 4,
            ..Default::default()
        })
        .unwrap();
    // The IOMMU mapping goes away behind the driver's back (the region will fail to unmap).
    mapper.unmap(iova, 4096).unwrap();
    qp.read(1, 0, RegionBuf::whole(region), 9)
        .map_err(|r| r.error)
        .unwrap();
    let mut result = None;
    qp.drain(Duration::from_secs(5), |d| result = Some(d.result))
        .unwrap();
    match result.expect("one completion") {
        Err(NvmeError::Status { status, .. }) => {
            assert_eq!(
                (status.sc(), status.dnr()),
                (Status::DATA_TRANSFER_ERROR.sc, true),
                "{status:?}"
            )
        }
        other => panic!("expected Data Transfer Error, got {other:?}"),
    }
    assert_eq!(model.stats().errors, 1);
    // The one fault is the provoked one: the read into the unmapped page.
    let faults = log.take();
    assert!(
        !faults.is_empty() && faults.iter().all(|f| f.bus.get() >> 12 == iova.get() >> 12),
        "{faults:?}"
    );
}
