//! The driver's hot path allocates nothing: after a warm-up, submitting reads and writes with
//! pool buffers at queue depths 1 to 32 and polling them to completion makes no heap allocation
//! on the submitting thread. A counting global allocator (this test binary's own) counts every
//! allocation, per thread and in all.

mod drv;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use drv::*;
use vfpoll_dma::{DmaBuf, DmaPool, PageSize};
use vfpoll_nvme::QueuePair;

struct Counting;

static ALL: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static MINE: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    ALL.fetch_add(1, Relaxed);
    // `try_with`: a thread being torn down may still allocate.
    let _ = MINE.try_with(|c| c.set(c.get() + 1));
}

// SAFETY: every call is passed on unchanged to the system allocator; counting touches only an
// atomic and a const-initialised thread-local `Cell` (which needs no allocation).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract for `alloc` is the system allocator's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: `ptr` came from this allocator, i.e. from `System`, with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, i.e. from `System`, with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn mine() -> u64 {
    MINE.with(Cell::get)
}

/// `qd` requests (reads, writes, with FUA every fourth write, and a flush), polled to
/// completion; the buffers come back into `bufs`.
fn round(qp: &mut QueuePair<DmaBuf>, bufs: &mut Vec<DmaBuf>, qd: usize, write: bool) {
    for i in 0..qd {
        let b = bufs.pop().expect("a buffer");
        let lba = (i * 8) as u64;
        let r = match (write, i % 4) {
            (false, _) => qp.read(1, lba, b, i as u64),
            (true, 0) => qp.write_fua(1, lba, b, i as u64),
            (true, _) => qp.write(1, lba, b, i as u64),
        };
        if r.is_err() {
            panic!("submit refused");
        }
    }
    if qp.flush(1, 999).is_err() {
        panic!("flush refused");
    }
    let (mut got, mut failed) = (0, false);
    let start = Instant::now();
    while got < qd + 1 {
        got += qp.poll(usize::MAX, |d| {
            failed |= d.result.is_err();
            if let Some(b) = d.buf {
                bufs.push(b);
            }
        });
        if start.elapsed() > HANG {
            panic!("hang");
        }
    }
    assert!(!failed, "a request failed");
}

fn all_depths(qp: &mut QueuePair<DmaBuf>, bufs: &mut Vec<DmaBuf>) {
    for qd in [1, 2, 3, 4, 8, 16, 31, 32] {
        round(qp, bufs, qd, true);
        round(qp, bufs, qd, false);
    }
}

#[test]
fn submit_and_poll_allocate_nothing_after_warm_up() {
    let m = mine();
    drop(std::hint::black_box(vec![0u8; 16]));
    assert_eq!(mine(), m + 1, "the allocator counts");
    let rig = rig(small_cfg(4096, 5));
    let mut pool: DmaPool = rig.ctrl.dma().pool(4096, 32, PageSize::Base4K).unwrap();
    for sgl in [false, true] {
        let opts = vfpoll_nvme::QpairOptions {
            sgl,
            ..qopts(64, Duration::from_secs(30))
        };
        let mut qp = rig.ctrl.create_qpair::<DmaBuf>(&opts).unwrap();
        let mut bufs = Vec::with_capacity(32);
        while let Some(b) = pool.alloc() {
            bufs.push(b);
        }
        // Warm-up: first use of every tracker, list page and code path.
        all_depths(&mut qp, &mut bufs);
        let (mine_before, all_before) = (mine(), ALL.load(Relaxed));
        for _ in 0..5 {
            all_depths(&mut qp, &mut bufs);
        }
        let (mine_after, all_after) = (mine(), ALL.load(Relaxed));
        assert_eq!(
            mine_after - mine_before,
            0,
            "allocations on the submitting thread (sgl {sgl})"
        );
        // The model's controller thread is meant not to allocate after warm-up either.
        assert_eq!(
            all_after - all_before,
            0,
            "allocations in the whole process (sgl {sgl})"
        );
        let st = qp.stats();
        assert_eq!(
            (st.errors, st.requests),
            (0, 6 * 2 * (1 + 2 + 3 + 4 + 8 + 16 + 31 + 32 + 8))
        );
        for b in bufs.drain(..) {
            pool.free(b);
        }
    }
}
