//! Device memory through vfpoll-gpu's copy engine and staging slots, with the CPU stand-in for a
//! GPU (copies complete late, so a slot reused too early shows), and copy failures.

mod common;

use common::{bytes, mem_store};
use vfpoll_dma::{DmaContext, PageSize};
use vfpoll_gpu::{CopyFault, CpuEngine, Slots};
use vfpoll_store::{ReadOptions, StoreError};

#[test]
fn device_memory_round_trips_through_the_slots() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _h) = mem_store(dir.path(), 2, 32 << 20);
    let len = 3 * (1 << 20) + 12345;
    let mut gpu = CpuEngine::new(len + 4096).with_delay(3);
    gpu.memory_mut()[4096..].copy_from_slice(&bytes(1, len));
    let mut slots = Slots::alloc(&DmaContext::for_testing(), 3, 128 << 10, PageSize::Base4K).unwrap();
    let mut tx = store.begin("m").unwrap();
    tx.put_device("w", b"bf16", &mut gpu, &mut slots, 4096, len as u64)
        .unwrap();
    tx.put("host", b"", &bytes(2, 1000)).unwrap();
    tx.commit().unwrap();
    let r = store.open_version("m", None).unwrap();
    assert_eq!(r.read_to_vec("w").unwrap(), bytes(1, len), "what the device held");
    let mut back = CpuEngine::new(len).with_delay(2);
    r.load_device(
        "w",
        0,
        len as u64,
        &mut back,
        &mut slots,
        0,
        &ReadOptions::default(),
    )
    .unwrap();
    assert_eq!(back.memory(), &bytes(1, len)[..]);
    // A range, into the middle of the allocation.
    let mut part = CpuEngine::new(300_000);
    r.load_device(
        "w",
        1_000_000,
        200_000,
        &mut part,
        &mut slots,
        50_000,
        &ReadOptions::default(),
    )
    .unwrap();
    assert_eq!(
        &part.memory()[50_000..250_000],
        &bytes(1, len)[1_000_000..1_200_000]
    );
    // Outside the allocation: refused up front.
    assert!(r
        .load_device(
            "w",
            0,
            len as u64,
            &mut part,
            &mut slots,
            0,
            &ReadOptions::default()
        )
        .is_err());
}

#[test]
fn a_failed_copy_fails_the_put_and_the_version_stays_out() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _h) = mem_store(dir.path(), 1, 16 << 20);
    let free = store.info().free;
    for fault in [CopyFault::Submit, CopyFault::Complete] {
        let mut gpu = CpuEngine::new(1 << 20);
        gpu.inject(5, fault);
        let mut slots = Slots::alloc(&DmaContext::for_testing(), 2, 64 << 10, PageSize::Base4K).unwrap();
        let mut tx = store.begin("m").unwrap();
        let e = tx
            .put_device("w", b"", &mut gpu, &mut slots, 0, 1 << 20)
            .unwrap_err();
        assert!(matches!(e, StoreError::Copy(_)), "{fault:?}: {e}");
        assert_eq!(tx.entries(), 0);
        drop(tx);
        assert_eq!(store.info().free, free, "{fault:?}: the space came back");
        // The slots are usable again.
        let mut ok = CpuEngine::new(1 << 20);
        let mut tx = store.begin("m").unwrap();
        tx.put_device("w", b"", &mut ok, &mut slots, 0, 1 << 20).unwrap();
        tx.abort();
    }
    assert!(store.checkpoints().is_empty());
}

#[test]
fn background_puts_return_once_staged_and_commit_waits_for_the_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _h) = mem_store(dir.path(), 2, 32 << 20);
    let len = 2 << 20;
    let mut gpu = CpuEngine::new(len);
    gpu.memory_mut().copy_from_slice(&bytes(7, len));
    let mut slots = Slots::alloc(&DmaContext::for_testing(), 2, 64 << 10, PageSize::Base4K).unwrap();
    let mut tx = store.begin("m").unwrap();
    tx.background(512 << 10).unwrap();
    assert!(tx.background(1 << 20).is_err(), "one writer per transaction");
    tx.put_device("gpu", b"", &mut gpu, &mut slots, 0, len as u64)
        .unwrap();
    // Staged: the device memory may change now; the checkpoint keeps what was there.
    gpu.memory_mut().fill(0xee);
    let mut host = bytes(8, 3_000_000);
    tx.put("host", b"", &host).unwrap();
    host.fill(0);
    let h = tx.commit_async();
    h.wait_staged().unwrap();
    h.wait_durable().unwrap();
    let r = store.open_version("m", None).unwrap();
    assert_eq!(r.read_to_vec("gpu").unwrap(), bytes(7, len));
    assert_eq!(r.read_to_vec("host").unwrap(), bytes(8, 3_000_000));
    assert!(store.fsck().unwrap().is_clean());
    // An aborted background transaction gives its space back once its writes are done.
    let free = store.info().free;
    let mut tx = store.begin("m").unwrap();
    tx.background(1 << 20).unwrap();
    tx.put("x", b"", &bytes(9, 5_000_000)).unwrap();
    drop(tx);
    assert_eq!(store.info().free, free);
}

#[test]
fn a_failed_load_stops_both_sides() {
    let dir = tempfile::tempdir().unwrap();
    let (store, h) = mem_store(dir.path(), 1, 64 << 20);
    let len = 40 << 20; // several windows
    let mut tx = store.begin("m").unwrap();
    tx.put("w", b"", &bytes(3, len)).unwrap();
    tx.commit().unwrap();
    let r = store.open_version("m", None).unwrap();
    let mut slots = Slots::alloc(&DmaContext::for_testing(), 2, 64 << 10, PageSize::Base4K).unwrap();
    // A copy fails in the middle.
    let mut gpu = CpuEngine::new(len);
    gpu.inject(100, CopyFault::Complete);
    let e = r
        .load_device(
            "w",
            0,
            len as u64,
            &mut gpu,
            &mut slots,
            0,
            &ReadOptions::default(),
        )
        .unwrap_err();
    assert!(matches!(e, StoreError::Copy(_)), "{e}");
    // An extent fails its crc in a later window: the reader's error comes back.
    let bad_page_off = (1u64 << 20) + (30u64 << 20);
    h[0].flip(bad_page_off + 5, 1);
    let mut gpu = CpuEngine::new(len);
    let e = r
        .load_device(
            "w",
            0,
            len as u64,
            &mut gpu,
            &mut slots,
            0,
            &ReadOptions::default(),
        )
        .unwrap_err();
    assert!(matches!(e, StoreError::Checksum { .. }), "{e}");
}
