//! Proves that `DmaPool::alloc` and `DmaPool::free` allocate nothing: a counting global
//! allocator counts the allocations made by this thread between two points.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use vfpoll_dma::{DmaContext, PageSize};

struct Counting;

thread_local! {
    // Const-initialised and without a destructor: touching it from the allocator cannot
    // allocate or recurse.
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards every call unchanged to the system allocator; the counter is a thread-local
// Cell, which needs no allocation.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.with(|c| c.set(c.get() + 1));
        // SAFETY: our caller upholds `GlobalAlloc::alloc`'s contract, which we forward.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.with(|c| c.set(c.get() + 1));
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocs() -> u64 {
    ALLOCS.with(|c| c.get())
}

#[test]
fn alloc_and_free_do_not_allocate() {
    let ctx = DmaContext::for_testing();
    let mut pool = ctx.pool(512, 64, PageSize::Base4K).unwrap();
    let mut held = Vec::with_capacity(64);

    // The counter works: an allocation in the window is seen.
    let before = allocs();
    drop(std::hint::black_box(Box::new(1u8)));
    assert_eq!(allocs() - before, 1, "counting allocator does not count");

    let before = allocs();
    for round in 0..100 {
        while let Some(b) = pool.alloc() {
            held.push(b);
        }
        assert_eq!(held.len(), 64, "round {round}");
        // Give back in a different order each round.
        if round % 2 == 0 {
            held.reverse();
        }
        while let Some(b) = held.pop() {
            pool.free(b);
        }
        let b = pool.alloc().unwrap();
        pool.free(b);
    }
    let after = allocs();
    assert_eq!(
        after - before,
        0,
        "DmaPool alloc/free allocated {} times",
        after - before
    );
    assert_eq!(pool.available(), 64);
}
