//! `DmaBuf::truncate`: a pool buffer used for a transfer that is not a power of two.

use std::sync::Arc;

use vfpoll_dma::{DmaContext, DmaError, FakeMapper, PageSize};

#[test]
fn a_truncated_buffer_bounds_its_copies_and_returns_whole() {
    let ctx = DmaContext::new(Arc::new(FakeMapper::new()));
    let mut pool = ctx.pool(4096, 2, PageSize::Base4K).unwrap();
    let mut b = pool.alloc().unwrap();
    assert_eq!(b.len(), 4096);
    b.truncate(7 * 520);
    assert_eq!(b.len(), 3640);
    pool.write(&b, 0, &[7u8; 3640]).unwrap();
    let mut back = [0u8; 3640];
    pool.read(&b, 0, &mut back).unwrap();
    assert_eq!(back, [7u8; 3640]);
    // Past the new end: refused like any out-of-bounds copy.
    assert!(matches!(
        pool.write(&b, 3600, &[0u8; 41]),
        Err(DmaError::OutOfBounds { size: 3640, .. })
    ));
    pool.free(b);
    // Both buffers come back at their full size.
    let (x, y) = (pool.alloc().unwrap(), pool.alloc().unwrap());
    assert_eq!((x.len(), y.len()), (4096, 4096));
    pool.free(x);
    pool.free(y);
    assert_eq!(pool.available(), 2);
}

#[test]
#[should_panic(expected = "cannot be truncated")]
fn a_buffer_never_grows() {
    let ctx = DmaContext::new(Arc::new(FakeMapper::new()));
    let mut pool = ctx.pool(512, 1, PageSize::Base4K).unwrap();
    let mut b = pool.alloc().unwrap();
    b.truncate(1024);
}
