//! The real block sources under the pipeline, with the CPU stand-in for the GPU: the vfpoll NVMe
//! driver over the in-process NVMe model, and a file.

use std::sync::Arc;
use std::time::Duration;

use vfpoll_dma::{DmaContext, FakeMapper, PageSize};
use vfpoll_gpu::{load, pattern, save, verify, CpuEngine, FileSource, NvmeSource, Options, Slots, Transfer};
use vfpoll_nvme::{Controller, ControllerOptions, QpairOptions};
use vfpoll_nvme_model::{FaultCheck, FaultLog, ModelConfig, NamespaceConfig, NvmeModel};

fn bring_up(lba: u32, blocks: u64, mdts: u8) -> (FaultCheck, NvmeModel, Controller) {
    let mapper = Arc::new(FakeMapper::new());
    let log = Arc::new(FaultLog::new(mapper.clone()));
    let cfg = ModelConfig {
        namespaces: vec![NamespaceConfig::new(1, lba, blocks)],
        mdts,
        ..Default::default()
    };
    let model = NvmeModel::start(cfg, log.clone()).unwrap();
    let opts = ControllerOptions {
        page_size: PageSize::Base4K,
        io_queues: 2,
        ..Default::default()
    };
    let ctrl = Controller::new(model.bar0(), DmaContext::new(mapper), opts).unwrap();
    (FaultCheck(log), model, ctrl)
}

fn t(source_offset: u64, device_offset: u64, len: u64) -> Transfer {
    Transfer {
        source_offset,
        device_offset,
        len,
    }
}

#[test]
fn nvme_model_load_save_verify() {
    // 4 MiB namespace of 512-byte blocks; MDTS 64 KiB, so each 256 KiB slot is split in 4
    // commands, and a queue of 8 entries fills up (requests wait, then go).
    let (_no_stray_dma, model, ctrl) = bring_up(512, 8192, 4);
    let mut seed = vec![0u8; 4 << 20];
    pattern(21, 0, &mut seed);
    model.write_ns(1, 0, &seed).unwrap();
    for (slots_n, entries, sgl) in [(2, 8, false), (4, 8, true), (6, 64, false)] {
        let mut slots = Slots::alloc(ctrl.dma(), slots_n, 256 << 10, PageSize::Base4K).unwrap();
        let opts = QpairOptions {
            entries,
            sgl,
            ..Default::default()
        };
        let mut src = NvmeSource::new(&ctrl, 1, &slots, &opts, "model").unwrap();
        let len = (3 << 20) + 1000; // ends mid-block
        let mut gpu = CpuEngine::new(len);
        let tr = t(512 * 7, 0, len as u64);
        let r = load(&mut src, &mut gpu, &mut slots, &tr, &Options::default()).unwrap();
        assert_eq!(r.bytes, len as u64);
        assert_eq!(gpu.memory(), &seed[512 * 7..512 * 7 + len], "{slots_n} slots");
        verify(&mut src, &mut gpu, &mut slots, &tr, &Options::default()).unwrap();

        // Save a different image to another place, then check the namespace.
        let save_len = 1 << 20;
        let mut img = vec![0u8; save_len];
        pattern(22 + slots_n as u64, 0, &mut img);
        let mut gpu = CpuEngine::new(save_len);
        gpu.memory_mut().copy_from_slice(&img);
        let at = 2 << 20;
        save(
            &mut src,
            &mut gpu,
            &mut slots,
            &t(at, 0, save_len as u64),
            &Options::default(),
        )
        .unwrap();
        assert_eq!(model.read_ns(1, at / 512, save_len as u64 / 512).unwrap(), img);
        verify(
            &mut src,
            &mut gpu,
            &mut slots,
            &t(at, 0, save_len as u64),
            &Options::default(),
        )
        .unwrap();
        model.write_ns(1, 0, &seed).unwrap();
    }
    let s = model.stats();
    assert_eq!(s.errors, 0);
}

#[test]
fn nvme_errors_come_back_as_source_errors() {
    let (_no_stray_dma, _model, ctrl) = bring_up(4096, 256, 0);
    let mut slots = Slots::alloc(ctrl.dma(), 2, 64 << 10, PageSize::Base4K).unwrap();
    let mut src = NvmeSource::new(&ctrl, 1, &slots, &QpairOptions::default(), "model").unwrap();
    let mut gpu = CpuEngine::new(2 << 20);
    // Slot sizes must be whole blocks; the range must lie in the namespace (1 MiB).
    let e = load(
        &mut src,
        &mut gpu,
        &mut slots,
        &t(0, 0, 2 << 20),
        &Options::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("outside"), "{e}");
    assert!(NvmeSource::new(&ctrl, 9, &slots, &QpairOptions::default(), "model").is_err());
    let odd = Slots::alloc(ctrl.dma(), 1, 4096 * 3, PageSize::Base4K).unwrap();
    assert!(NvmeSource::new(&ctrl, 1, &odd, &QpairOptions::default(), "model").is_ok());
    // A slot needing more commands than the queue holds.
    let big = Slots::alloc(ctrl.dma(), 1, 64 << 20, PageSize::Base4K).unwrap();
    let opts = QpairOptions {
        entries: 4,
        max_transfer: Some(128 << 10),
        ..Default::default()
    };
    let e = NvmeSource::new(&ctrl, 1, &big, &opts, "model").unwrap_err();
    assert!(e.to_string().contains("smaller slots"), "{e}");
}

#[test]
fn file_load_save_verify() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ckpt");
    let len = 300_000usize;
    let mut img = vec![0u8; len];
    pattern(31, 0, &mut img);
    std::fs::write(&path, &img).unwrap();
    let dma = DmaContext::for_testing();
    let mut slots = Slots::alloc(&dma, 3, 64 << 10, PageSize::Base4K).unwrap();
    let mut src = FileSource::open(&path, false, false).unwrap();
    let mut gpu = CpuEngine::new(len);
    let o = Options {
        timeout: Duration::from_secs(5),
        block_when_idle: true,
    };
    load(&mut src, &mut gpu, &mut slots, &t(0, 0, len as u64), &o).unwrap();
    assert_eq!(gpu.memory(), &img[..]);
    verify(&mut src, &mut gpu, &mut slots, &t(0, 0, len as u64), &o).unwrap();
    // Past the end: refused up front.
    assert!(load(&mut src, &mut gpu, &mut slots, &t(1, 0, len as u64), &o).is_err());
    // Read-only: a save is refused cleanly.
    let e = save(&mut src, &mut gpu, &mut slots, &t(0, 0, 1000), &o).unwrap_err();
    assert!(e.to_string().contains("write"), "{e}");

    let out = dir.path().join("saved");
    let mut sink = FileSource::open(&out, true, false).unwrap();
    save(&mut sink, &mut gpu, &mut slots, &t(4096, 0, len as u64), &o).unwrap();
    let back = std::fs::read(&out).unwrap();
    assert_eq!(back.len(), 4096 + len);
    assert_eq!(&back[4096..], &img[..]);
    verify(&mut sink, &mut gpu, &mut slots, &t(4096, 0, len as u64), &o).unwrap();
}
