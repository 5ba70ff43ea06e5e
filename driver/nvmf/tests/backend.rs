//! Namespace backends against their storage: RAM, and a vfpoll NVMe namespace on the
//! in-process controller model (the model's storage is the oracle).

use std::sync::Arc;
use std::time::{Duration, Instant};

use vfpoll_dma::{DmaContext, DmaPool, FakeMapper, PageSize};
use vfpoll_nvme::{Controller, ControllerOptions, QpairOptions};
use vfpoll_nvme_model::{ModelConfig, NamespaceConfig, NvmeModel};
use vfpoll_nvmf::backend::{Backend, Completion, MallocBackend, NvmeBackend, Op};

fn drain(b: &mut dyn Backend, want: usize) -> Vec<Completion> {
    let mut out = Vec::new();
    let start = Instant::now();
    while out.len() < want {
        b.poll(&mut |c| out.push(c));
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "backend never completed"
        );
    }
    out
}

/// Writes a pattern to 8 blocks at LBA 10, reads it back, zeroes 2 of them, deallocates 2,
/// flushes; a range past the end is an LBA Out of Range status, not a panic.
fn exercise(b: &mut dyn Backend, pool: &mut DmaPool) {
    let bs = b.block_size();
    let pattern: Vec<u8> = (0..8 * bs).map(|i| (i * 13 % 251) as u8).collect();
    let mut w = pool.alloc().unwrap();
    w.truncate(8 * bs);
    pool.write(&w, 0, &pattern).unwrap();
    b.submit(pool, Op::Write { fua: false }, 10, 8, Some(w), 1)
        .unwrap();
    let c = drain(b, 1).pop().unwrap();
    assert!(c.status.is_success(), "{:?}", c.status);
    pool.free(c.buf.unwrap());
    let mut r = pool.alloc().unwrap();
    r.truncate(8 * bs);
    pool.write(&r, 0, &vec![0xee; 8 * bs]).unwrap();
    b.submit(pool, Op::Read, 10, 8, Some(r), 2).unwrap();
    let c = drain(b, 1).pop().unwrap();
    assert!(c.status.is_success() && c.tag == 2);
    let r = c.buf.unwrap();
    let mut got = vec![0u8; 8 * bs];
    pool.read(&r, 0, &mut got).unwrap();
    assert_eq!(got, pattern);
    b.submit(pool, Op::WriteZeroes, 11, 2, None, 3).unwrap();
    b.submit(pool, Op::Deallocate(vec![(14, 2)]), 0, 0, None, 4)
        .unwrap();
    b.submit(pool, Op::Flush, 0, 0, None, 5).unwrap();
    let done = drain(b, 3);
    assert!(done.iter().all(|c| c.status.is_success()), "{done:?}");
    pool.write(&r, 0, &vec![0xee; 8 * bs]).unwrap();
    b.submit(pool, Op::Read, 10, 8, Some(r), 6).unwrap();
    let c = drain(b, 1).pop().unwrap();
    let r = c.buf.unwrap();
    pool.read(&r, 0, &mut got).unwrap();
    let mut want = pattern.clone();
    want[bs..3 * bs].fill(0);
    want[4 * bs..6 * bs].fill(0);
    assert_eq!(got, want);
    // Past the end: the status names it.
    let end = b.blocks() - 1;
    b.submit(pool, Op::Read, end, 2, Some(r), 7).unwrap();
    let c = drain(b, 1).pop().unwrap();
    assert_eq!(c.status.name(), Some("LBA Out of Range"), "{:?}", c.status);
    pool.free(c.buf.unwrap());
}

#[test]
fn malloc_backend_reads_what_it_wrote() {
    let dma = DmaContext::new(Arc::new(FakeMapper::new()));
    let mut pool = dma.pool(4096, 4, PageSize::Base4K).unwrap();
    let mut b = MallocBackend::new(MallocBackend::storage(1 << 20), 512);
    assert_eq!(b.blocks(), 2048);
    exercise(&mut b, &mut pool);
    assert_eq!(pool.available(), pool.capacity());
}

#[test]
fn nvme_backend_reads_what_it_wrote_on_the_model() {
    let mapper = Arc::new(FakeMapper::new());
    let cfg = ModelConfig {
        namespaces: vec![NamespaceConfig::new(1, 512, 2048)],
        ..Default::default()
    };
    let model = NvmeModel::start(cfg, mapper.clone()).unwrap();
    let opts = ControllerOptions {
        page_size: PageSize::Base4K,
        io_queues: 2,
        ..Default::default()
    };
    let ctrl = Controller::new(model.bar0(), DmaContext::new(mapper), opts).unwrap();
    let mut pool = ctrl.dma().pool(4096, 4, PageSize::Base4K).unwrap();
    let qp = ctrl.create_qpair(&QpairOptions::default()).unwrap();
    let mut b = NvmeBackend::new(qp, 1, 512, 2048, false);
    exercise(&mut b, &mut pool);
    // The model holds what the backend wrote.
    let data = model.read_ns(1, 10, 1).unwrap();
    assert_eq!(data[..4], [0, 13, 26, 39]);
    assert_eq!(pool.available(), pool.capacity());
}
