//! The store on NVMe namespaces through the real vfpoll driver, over the in-process NVMe model:
//! striped over two namespaces of one controller and one of another, with Flush where the
//! model reports a volatile write cache, FUA on the root, Dataset Management on evictions;
//! closed and opened again on the same controllers.

mod common;

use std::sync::Arc;

use common::{bytes, fopts, opts};
use vfpoll_dma::{DmaContext, FakeMapper, PageSize};
use vfpoll_nvme::{Controller, ControllerOptions, QpairOptions};
use vfpoll_nvme_model::{io_opcode, FaultCheck, FaultLog, ModelConfig, NamespaceConfig, NvmeModel};
use vfpoll_store::device::{Device, NvmeDevice};
use vfpoll_store::Store;

fn bring_up(namespaces: Vec<NamespaceConfig>, vwc: bool) -> (FaultCheck, NvmeModel, Controller) {
    let mapper = Arc::new(FakeMapper::new());
    let log = Arc::new(FaultLog::new(mapper.clone()));
    let cfg = ModelConfig {
        namespaces,
        volatile_write_cache: vwc,
        mdts: 5, // 128 KiB: a 256 KiB chunk is split in two commands
        ..Default::default()
    };
    let model = NvmeModel::start(cfg, log.clone()).unwrap();
    let o = ControllerOptions {
        page_size: PageSize::Base4K,
        io_queues: 4,
        ..Default::default()
    };
    let ctrl = Controller::new(model.bar0(), DmaContext::new(mapper), o).unwrap();
    (FaultCheck(log), model, ctrl)
}

fn devices(a: &Controller, b: &Controller) -> Vec<Box<dyn Device>> {
    let q = QpairOptions {
        entries: 64,
        ..Default::default()
    };
    vec![
        Box::new(NvmeDevice::new(a, 1, &q, "model-a", vec![]).unwrap()),
        Box::new(NvmeDevice::new(a, 2, &q, "model-a", vec![]).unwrap()),
        Box::new(NvmeDevice::new(b, 1, &q, "model-b", vec![]).unwrap()),
    ]
}

#[test]
fn checkpoints_and_kv_over_two_model_controllers() {
    let dir = tempfile::tempdir().unwrap();
    let (_ca, model_a, a) = bring_up(
        vec![
            NamespaceConfig::new(1, 512, 16384),
            NamespaceConfig::new(2, 4096, 2048),
        ],
        true,
    );
    let (_cb, model_b, b) = bring_up(vec![NamespaceConfig::new(1, 4096, 2048)], false);
    let mut f = fopts(dir.path());
    f.chunk_size = 256 << 10;
    let store = Store::format_devices(devices(&a, &b), &f).unwrap();
    let info = store.info();
    // Controller a grants 4 I/O queue pairs to its two namespaces: two channels of the three
    // asked for (the third's queue pair is refused; the store runs with two).
    assert_eq!(info.io_channels, 2);
    assert_eq!(info.members.len(), 3);
    assert!(
        info.members[0].device.contains("NVMe model-a namespace 1"),
        "{:?}",
        info.members
    );
    assert!(info.members[0].volatile_write_cache && !info.members[2].volatile_write_cache);
    let data: Vec<Vec<u8>> = (0..6).map(|i| bytes(i, 300_000 + i as usize * 77_777)).collect();
    let flushes = model_a.stats().io_commands(io_opcode::FLUSH);
    let mut tx = store.begin("m").unwrap();
    for (i, d) in data.iter().enumerate() {
        tx.put(&format!("t{i}"), b"", d).unwrap();
    }
    tx.commit().unwrap();
    assert!(
        model_a.stats().io_commands(io_opcode::FLUSH) > flushes,
        "commit flushes the cached namespaces"
    );
    assert_eq!(
        model_b.stats().io_commands(io_opcode::FLUSH),
        0,
        "no Flush without a write cache"
    );
    for m in [&model_a, &model_b] {
        assert!(
            m.stats().io_commands(io_opcode::WRITE) > 0,
            "striped over every controller"
        );
    }
    let pool = store.create_pool("kv", 64 << 10, 32).unwrap();
    let keys: Vec<u128> = (0..48).collect();
    let vals: Vec<Vec<u8>> = keys.iter().map(|&k| bytes(k as u64 + 1000, 65536)).collect();
    for (k, v) in keys.chunks(8).zip(vals.chunks(8)) {
        let refs: Vec<&[u8]> = v.iter().map(|x| x.as_slice()).collect();
        pool.put_many(k, &refs).unwrap();
    }
    assert!(pool.stats().evictions >= 16);
    let dsm = model_a.stats().io_commands(io_opcode::DATASET_MANAGEMENT)
        + model_b.stats().io_commands(io_opcode::DATASET_MANAGEMENT);
    assert!(dsm > 0, "evicted blocks are deallocated");
    pool.sync().unwrap();
    drop(pool);
    drop(store);

    // Open again on the same controllers, members named in another order.
    let mut devs = devices(&a, &b);
    devs.reverse();
    let store = Store::open_devices(devs, &opts(dir.path())).unwrap();
    let r = store.open_version("m", None).unwrap();
    for (i, d) in data.iter().enumerate() {
        assert_eq!(&r.read_to_vec(&format!("t{i}")).unwrap(), d);
    }
    let pool = store.pool("kv").unwrap();
    assert_eq!(pool.len(), 32, "the index is rebuilt from the headers");
    let mut out = vec![vec![0u8; 65536]; keys.len()];
    let mut bufs: Vec<&mut [u8]> = out.iter_mut().map(|v| v.as_mut_slice()).collect();
    let hits = pool.get_many(&keys, &mut bufs).unwrap();
    let n = hits.iter().filter(|h| h.is_some()).count();
    assert_eq!(n, 32);
    for ((h, o), v) in hits.iter().zip(&out).zip(&vals) {
        if h.is_some() {
            assert_eq!(o, v);
        }
    }
    assert!(
        hits[40..].iter().all(Option::is_some),
        "the newest blocks survived eviction"
    );
    let rep = store.fsck().unwrap();
    assert!(rep.is_clean(), "{:?}", rep.findings);
    assert_eq!(rep.kv_slots, 32);
    assert_eq!(model_a.stats().errors + model_b.stats().errors, 0);
}

#[test]
fn model_spec_strings_open_through_the_driver() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::format(&["model:8M", "model:8M"], &fopts(dir.path())).unwrap();
    assert_eq!(store.info().io_channels, 3, "a queue pair per channel");
    assert!(
        store.info().members[1].device.starts_with("NVMe model"),
        "{:?}",
        store.info().members
    );
    let mut tx = store.begin("m").unwrap();
    tx.put("x", b"", &bytes(1, 500_000)).unwrap();
    tx.commit().unwrap();
    assert_eq!(
        store.open_version("m", None).unwrap().read_to_vec("x").unwrap(),
        bytes(1, 500_000)
    );
}
