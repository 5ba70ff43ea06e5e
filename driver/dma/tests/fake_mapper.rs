//! The DMA layer end to end over a `FakeMapper`, on 4 KiB pages (runs anywhere), plus
//! hugepage variants marked `#[ignore = "needs hugepages"]`.

use std::ptr;
use std::sync::Arc;

use vfpoll_dma::pagemap::{can_read_pfns, virt_to_phys};
use vfpoll_dma::{BusAddr, DmaContext, DmaError, FakeMapper, HugeMem, MapCall, MapKind, PageSize};

const P: usize = 4096;

fn ctx_with(fake: FakeMapper) -> (DmaContext, Arc<FakeMapper>) {
    let fake = Arc::new(fake);
    (DmaContext::new(fake.clone()), fake)
}

/// Reads `n` bytes the way a device model does: through the fake IOMMU's translation.
fn device_read(fake: &FakeMapper, bus: BusAddr, n: usize) -> Vec<u8> {
    let p = fake.translate(bus, n as u64).expect("bus address not mapped");
    let mut out = vec![0u8; n];
    // SAFETY: `translate` checked that a live mapping covers `n` bytes at `p`.
    unsafe { ptr::copy_nonoverlapping(p, out.as_mut_ptr(), n) };
    out
}

fn device_write(fake: &FakeMapper, bus: BusAddr, data: &[u8]) {
    let p = fake
        .translate(bus, data.len() as u64)
        .expect("bus address not mapped");
    // SAFETY: as in `device_read`.
    unsafe { ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
}

#[test]
fn region_is_mapped_once_and_unmapped_on_drop() {
    let (ctx, fake) = ctx_with(FakeMapper::new());
    let initial = ctx.iova_free_ranges();
    let free0 = ctx.iova_total_free();
    let r = ctx.alloc_region(10_000, PageSize::Base4K).unwrap();
    assert_eq!(r.len(), 3 * P);
    assert_eq!(r.map_kind(), MapKind::Iommu);
    let iova = r.iova().unwrap();
    assert!(iova.get() != 0 && iova.is_aligned(P as u64));
    assert_eq!(
        fake.calls(),
        vec![MapCall::Map {
            vaddr: r.as_ptr().addr(),
            len: 3 * P as u64,
            iova
        }]
    );
    assert_eq!(r.bus_addr(0), BusAddr::from(iova));
    assert_eq!(r.bus_addr(5000), BusAddr(iova.get() + 5000));
    assert_eq!(
        r.contiguous_len(100),
        3 * P - 100,
        "an IOVA range is contiguous throughout"
    );
    assert_eq!(r.contiguous_len(3 * P), 0);
    assert_eq!(
        ctx.iova_total_free(),
        free0 - 4 * P as u64,
        "three pages mapped and one unmapped guard page reserved after them"
    );

    let r2 = ctx.alloc_region(1, PageSize::Base4K).unwrap();
    let i2 = r2.iova().unwrap().get();
    assert!(
        i2 + P as u64 <= iova.get() || i2 >= iova.get() + 3 * P as u64,
        "IOVA ranges overlap"
    );

    drop(r);
    assert_eq!(
        fake.calls().last(),
        Some(&MapCall::Unmap {
            iova,
            len: 3 * P as u64
        })
    );
    drop(r2);
    assert!(fake.live_mappings().is_empty());
    assert_eq!(ctx.iova_free_ranges(), initial, "IOVA not given back");
}

#[test]
fn an_unmapped_guard_page_follows_every_mapping() {
    let (ctx, fake) = ctx_with(FakeMapper::new());
    let initial = ctx.iova_free_ranges();
    let a = ctx.alloc_region(2 * P, PageSize::Base4K).unwrap();
    let b = ctx.alloc_region(P, PageSize::Base4K).unwrap();
    let pool = ctx.pool(512, 8, PageSize::Base4K).unwrap();
    let end = a.bus_addr(2 * P - 1).get() + 1;
    assert!(fake.translate(BusAddr(end - 8), 8).is_some());
    assert!(
        fake.translate(BusAddr(end - 8), 9).is_none(),
        "a DMA running one byte past the region faults"
    );
    assert!(
        fake.translate(BusAddr(end), 1).is_none(),
        "the guard page is unmapped"
    );
    // First fit puts the next region right after the guard page, never right after `a`.
    assert_eq!(b.bus_addr(0).get(), end + P as u64);
    let mapped = fake.live_mappings();
    assert_eq!(mapped.len(), 3);
    for w in mapped.windows(2) {
        let ((i0, l0), (i1, _)) = (w[0], w[1]);
        assert!(
            i0.get() + l0 < i1.get(),
            "no gap between {i0}+{l0:#x} and {i1}: an overrun would land in the next mapping"
        );
    }
    // Dropping everything gives the guard pages back too.
    drop((a, b, pool));
    assert_eq!(ctx.iova_free_ranges(), initial);
}

#[test]
#[should_panic(expected = "outside the")]
fn bus_addr_past_the_end_panics() {
    let ctx = DmaContext::for_testing();
    let r = ctx.alloc_region(P, PageSize::Base4K).unwrap();
    let _ = r.bus_addr(P);
}

#[test]
fn copies_are_bounds_checked_and_seen_by_the_device() {
    let (ctx, fake) = ctx_with(FakeMapper::new());
    let mut r = ctx.alloc_region(2 * P, PageSize::Base4K).unwrap();
    r.fill(0, 2 * P, 0xcc).unwrap();
    r.write(P - 2, b"abcd").unwrap();
    assert_eq!(device_read(&fake, r.bus_addr(P - 3), 6), b"\xccabcd\xcc");

    device_write(&fake, r.bus_addr(100), b"from the device");
    let mut got = [0u8; 15];
    r.read(100, &mut got).unwrap();
    assert_eq!(&got, b"from the device");

    assert!(matches!(
        r.write(2 * P - 1, b"xy"),
        Err(DmaError::OutOfBounds { .. })
    ));
    assert!(r.read(2 * P, &mut [0u8; 1]).is_err());
    assert!(r.fill(1, 2 * P, 0).is_err());

    // A phase bit the device flips, polled with a volatile read.
    assert_eq!(r.read_volatile::<u16>(14).unwrap(), 0xcccc);
    device_write(&fake, r.bus_addr(14), &1u16.to_ne_bytes());
    assert_eq!(r.read_volatile::<u16>(14).unwrap(), 1);
    r.write_volatile::<u64>(8, 0x0102_0304_0506_0708).unwrap();
    assert_eq!(
        device_read(&fake, r.bus_addr(8), 8),
        0x0102_0304_0506_0708u64.to_ne_bytes()
    );
    assert!(r.read_volatile::<u32>(2).is_err());

    let bus = r.bus_addr(0);
    drop(r);
    assert!(
        fake.translate(bus, 1).is_none(),
        "device can still reach a dropped region"
    );
}

#[test]
fn failed_map_leaves_nothing_behind() {
    let (ctx, fake) = ctx_with(FakeMapper::new());
    let initial = ctx.iova_free_ranges();
    fake.fail_next_map();
    let e = ctx.alloc_region(4 * P, PageSize::Base4K).unwrap_err();
    assert!(matches!(e, DmaError::Map { .. }), "{e:?}");
    assert!(e.to_string().contains("RLIMIT_MEMLOCK"), "{e}");
    assert!(fake.live_mappings().is_empty());
    assert_eq!(
        ctx.iova_free_ranges(),
        initial,
        "IOVA of the failed map not returned"
    );
    let Some(MapCall::FailedMap { iova: tried, .. }) = fake.calls().last().copied() else {
        panic!("no failed map recorded")
    };
    // The next region gets the very same IOVA.
    let r = ctx.alloc_region(4 * P, PageSize::Base4K).unwrap();
    assert_eq!(r.iova(), Some(tried));
}

#[test]
fn failed_unmap_is_logged_and_the_iova_never_reused() {
    let (ctx, fake) = ctx_with(FakeMapper::new());
    let r = ctx.alloc_region(P, PageSize::Base4K).unwrap();
    let iova = r.iova().unwrap();
    let free_while_mapped = ctx.iova_total_free();
    fake.fail_next_unmap();
    drop(r); // must not panic
    assert_eq!(
        ctx.iova_total_free(),
        free_while_mapped,
        "an IOVA still mapped went back to the allocator"
    );
    assert_eq!(fake.live_mappings(), vec![(iova, P as u64)]);
    let r2 = ctx.alloc_region(P, PageSize::Base4K).unwrap();
    assert_ne!(r2.iova(), Some(iova));
}

#[test]
fn iova_exhaustion_maps_nothing() {
    // Pages 1..=3 usable (page 0 never is).
    let (ctx, fake) = ctx_with(FakeMapper::new().with_ranges(vec![0..=0x3fff]));
    let e = ctx.alloc_region(4 * P, PageSize::Base4K).unwrap_err();
    assert!(
        matches!(
            e,
            DmaError::IovaExhausted {
                requested: 0x4000,
                largest_free: 0x3000,
                total_free: 0x3000
            }
        ),
        "{e:?}"
    );
    assert!(fake.calls().is_empty());
    let a = ctx.alloc_region(3 * P, PageSize::Base4K).unwrap();
    assert_eq!(a.iova().unwrap().get(), 0x1000);
    assert!(matches!(
        ctx.alloc_region(P, PageSize::Base4K),
        Err(DmaError::IovaExhausted { .. })
    ));
}

#[test]
fn iommu_pages_larger_than_the_memory_pages_are_refused() {
    let (ctx, fake) = ctx_with(FakeMapper::new().with_page_size(1 << 16));
    let e = ctx.alloc_region(P, PageSize::Base4K).unwrap_err();
    assert!(
        matches!(
            e,
            DmaError::PageTooSmall {
                mapper_page: 0x10000,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(fake.calls().is_empty());
}

#[test]
fn pool_exhausts_refills_and_checks_bounds() {
    let (ctx, fake) = ctx_with(FakeMapper::new());
    let mut pool = ctx.pool(2048, 10, PageSize::Base4K).unwrap();
    assert_eq!(
        (pool.capacity(), pool.available(), pool.buf_size()),
        (10, 10, 2048)
    );
    assert_eq!(pool.region_len(), 5 * P);
    let base = pool.region_bus_addr(0);
    let mut bufs: Vec<_> = std::iter::from_fn(|| pool.alloc()).collect();
    assert_eq!(bufs.len(), 10);
    assert!(pool.alloc().is_none());
    assert_eq!(pool.available(), 0);
    for b in &bufs {
        assert_eq!(b.len(), 2048);
        assert_eq!(b.bus_addr(), base.add(b.index() as u64 * 2048));
        assert_eq!(b.as_ptr(), pool.region_ptr().wrapping_add(b.index() * 2048));
        assert!(pool.region_contiguous_len(b.index() * 2048) >= 2048);
    }
    let mut idx: Vec<_> = bufs.iter().map(|b| b.index()).collect();
    idx.sort_unstable();
    assert_eq!(idx, (0..10).collect::<Vec<_>>());

    let b = &bufs[3];
    pool.write(b, 2040, b"12345678").unwrap();
    assert!(matches!(
        pool.write(b, 2041, b"12345678"),
        Err(DmaError::OutOfBounds { size: 2048, .. })
    ));
    assert_eq!(device_read(&fake, b.bus_addr().add(2040), 8), b"12345678");
    device_write(&fake, bufs[4].bus_addr(), b"rx frame");
    let mut got = [0u8; 8];
    pool.read(&bufs[4], 0, &mut got).unwrap();
    assert_eq!(&got, b"rx frame");

    for b in bufs.drain(..) {
        pool.free(b);
    }
    assert_eq!(pool.available(), 10);
    let again: Vec<_> = std::iter::from_fn(|| pool.alloc()).collect();
    assert_eq!(again.len(), 10);
    for b in again {
        pool.free(b);
    }
    drop(pool);
    assert!(fake.live_mappings().is_empty(), "pool region not unmapped");
}

#[test]
fn pool_dropped_with_buffers_out_leaks_instead_of_freeing() {
    let (ctx, fake) = ctx_with(FakeMapper::new());
    let mut pool = ctx.pool(512, 8, PageSize::Base4K).unwrap();
    let out = pool.alloc().unwrap();
    drop(pool);
    assert_eq!(
        fake.live_mappings().len(),
        1,
        "memory a device may still write was unmapped"
    );
    // The buffer's memory is still there for the device model.
    device_write(&fake, out.bus_addr(), b"late");
}

#[test]
#[cfg(debug_assertions)]
#[should_panic(expected = "does not belong")]
fn freeing_into_the_wrong_pool_panics_in_debug() {
    let ctx = DmaContext::for_testing();
    let mut a = ctx.pool(512, 4, PageSize::Base4K).unwrap();
    let mut b = ctx.pool(512, 4, PageSize::Base4K).unwrap();
    let buf = a.alloc().unwrap();
    b.free(buf);
}

#[test]
fn for_testing_context_works() {
    let ctx = DmaContext::for_testing();
    assert_eq!(ctx.kind(), MapKind::Iommu);
    assert_eq!(ctx.mapper().min_page_size(), 4096);
    let mut pool = ctx.pool(4096, 3, PageSize::Base4K).unwrap();
    let b = pool.alloc().unwrap();
    assert!(b.bus_addr().get() != 0);
    pool.free(b);
}

/// Without an IOMMU: physical addresses per page, no map calls; or, without root, the error
/// that says so. Both outcomes are checked.
#[test]
fn no_iommu_region_uses_physical_addresses() {
    let (ctx, fake) = ctx_with(FakeMapper::no_iommu());
    let res = ctx.alloc_region(4 * P, PageSize::Base4K);
    if can_read_pfns().unwrap() {
        let r = res.unwrap();
        assert_eq!(r.map_kind(), MapKind::NoIommu);
        assert_eq!(r.iova(), None);
        let phys: Vec<u64> = (0..4)
            .map(|i| virt_to_phys(r.as_ptr().wrapping_add(i * P)).unwrap().get())
            .collect();
        for page in 0..4 {
            assert_eq!(r.bus_addr(page * P + 12), BusAddr(phys[page] + 12));
            // Expected run: this page plus every following page that is physically adjacent.
            let adjacent = (page + 1..4)
                .take_while(|&j| phys[j] == phys[j - 1] + P as u64)
                .count();
            assert_eq!(
                r.contiguous_len(page * P + 12),
                (1 + adjacent) * P - 12,
                "page {page}, phys {phys:x?}"
            );
        }
    } else {
        assert!(matches!(res, Err(DmaError::PhysAddrNeedsRoot)), "{res:?}");
    }
    assert!(fake.calls().is_empty(), "no-IOMMU mode must not call map");
    assert_eq!(ctx.iova_total_free(), 0, "no-IOMMU mode has no IOVA space");
}

#[test]
fn user_memory_registration() {
    let (ctx, fake) = ctx_with(FakeMapper::new());
    let user = HugeMem::alloc(16 * P as u64, PageSize::Base4K, "/sys".as_ref()).unwrap();
    let p = user.as_ptr();
    // SAFETY: `user` is locked, populated, shared memory that outlives every
    // registration made here (they are dropped first).
    let e = unsafe { ctx.register_user(p.wrapping_add(1), P as u64) }.unwrap_err();
    assert!(matches!(e, DmaError::Misaligned { what: "address", .. }), "{e:?}");
    // SAFETY: as above.
    let e = unsafe { ctx.register_user(p, 100) }.unwrap_err();
    assert!(matches!(e, DmaError::Misaligned { what: "length", .. }), "{e:?}");
    // SAFETY: a null pointer is refused before anything is mapped.
    let e = unsafe { ctx.register_user(ptr::null_mut(), P as u64) }.unwrap_err();
    assert!(matches!(e, DmaError::NullPointer), "{e:?}");
    assert!(fake.calls().is_empty());

    // SAFETY: as above.
    let reg = unsafe { ctx.register_user(p, 16 * P as u64) }.unwrap();
    let iova = reg.iova().unwrap();
    assert_eq!(
        fake.calls(),
        vec![MapCall::Map {
            vaddr: p.addr(),
            len: 16 * P as u64,
            iova
        }]
    );
    let align = (1u64 << p.addr().trailing_zeros()).min(16 * P as u64);
    assert!(
        iova.is_aligned(align),
        "IOVA {iova} not aligned like the memory ({align:#x})"
    );
    assert_eq!(reg.bus_addr(P + 3), BusAddr(iova.get() + P as u64 + 3));
    assert_eq!(reg.contiguous_len(P), 15 * P);
    // SAFETY: writing the caller's own memory through its own pointer, inside the mapping.
    unsafe { p.wrapping_add(P + 3).write(0x77) };
    assert_eq!(device_read(&fake, reg.bus_addr(P + 3), 1), [0x77]);
    drop(reg);
    assert!(fake.live_mappings().is_empty());
    assert_eq!(
        fake.calls().last(),
        Some(&MapCall::Unmap {
            iova,
            len: 16 * P as u64
        })
    );
}

#[test]
fn user_memory_registration_without_iommu() {
    let (ctx, fake) = ctx_with(FakeMapper::no_iommu());
    let user = HugeMem::alloc(2 * P as u64, PageSize::Base4K, "/sys".as_ref()).unwrap();
    // SAFETY: `user` is locked and outlives the registration.
    let res = unsafe { ctx.register_user(user.as_ptr(), 2 * P as u64) };
    if can_read_pfns().unwrap() {
        let reg = res.unwrap();
        let phys = virt_to_phys(user.as_ptr().wrapping_add(P)).unwrap();
        assert_eq!(reg.bus_addr(P + 9), BusAddr::from(phys).add(9));
        assert_eq!(reg.iova(), None);
    } else {
        assert!(matches!(res, Err(DmaError::PhysAddrNeedsRoot)), "{res:?}");
    }
    assert!(fake.calls().is_empty());
}

/// An ordinary anonymous mapping stands in for a peer device's BAR.
#[test]
fn peer_bar_behind_the_iommu_gets_its_own_iova() {
    let (ctx, fake) = ctx_with(FakeMapper::new());
    let bar = HugeMem::alloc(16 * P as u64, PageSize::Base4K, "/sys".as_ref()).unwrap();
    let bar_bus = BusAddr(0xe000_0000);
    // SAFETY: the stand-in BAR is ordinary memory that outlives the region and takes any access.
    let mut peer = unsafe { ctx.register_peer_bar(bar.as_ptr(), 16 * P as u64, bar_bus) }.unwrap();
    let iova = peer.iova().unwrap();
    assert_eq!(peer.map_kind(), MapKind::Iommu);
    assert_eq!(
        fake.calls(),
        vec![MapCall::Map {
            vaddr: bar.as_ptr().addr(),
            len: 16 * P as u64,
            iova
        }]
    );
    assert!(
        iova.is_aligned(16 * P as u64),
        "IOVA {iova} not aligned to the BAR size"
    );
    assert_eq!(peer.bus_addr(0x100), BusAddr(iova.get() + 0x100));
    assert_ne!(
        peer.bus_addr(0x100),
        bar_bus.add(0x100),
        "behind an IOMMU the BAR's own address is not the DMA address"
    );
    assert_eq!(peer.bar_bus_addr(), bar_bus);
    assert_eq!(
        fake.translate(peer.bus_addr(0x100), 4).map(|p| p.addr()),
        Some(bar.as_ptr().addr() + 0x100)
    );

    // The NVMe device model "DMAs" into the BAR; the CPU reads it back with volatile accesses.
    device_write(&fake, peer.bus_addr(0x203), b"peer-to-peer!");
    let mut got = [0u8; 13];
    peer.copy_from_device(0x203, &mut got).unwrap();
    assert_eq!(&got, b"peer-to-peer!");
    peer.write_volatile::<u32>(0x40, 0xdead_beef).unwrap();
    assert_eq!(
        device_read(&fake, peer.bus_addr(0x40), 4),
        0xdead_beefu32.to_ne_bytes()
    );
    peer.copy_to_device(0x81, b"xyz").unwrap();
    assert_eq!(device_read(&fake, peer.bus_addr(0x81), 3), b"xyz");
    assert!(peer.copy_from_device(16 * P - 1, &mut [0u8; 2]).is_err());

    // SAFETY: as above.
    let e = unsafe { ctx.register_peer_bar(bar.as_ptr().wrapping_add(8), P as u64, bar_bus) }.unwrap_err();
    assert!(matches!(e, DmaError::Misaligned { .. }), "{e:?}");
    drop(peer);
    assert!(fake.live_mappings().is_empty());
}

#[test]
fn peer_bar_without_iommu_uses_the_bar_bus_address() {
    let (ctx, fake) = ctx_with(FakeMapper::no_iommu());
    let bar = HugeMem::alloc(4 * P as u64, PageSize::Base4K, "/sys".as_ref()).unwrap();
    // SAFETY: the stand-in BAR is ordinary memory that outlives the region and takes any access.
    let mut peer =
        unsafe { ctx.register_peer_bar(bar.as_ptr(), 4 * P as u64, BusAddr(0xe000_0000)) }.unwrap();
    assert_eq!(peer.map_kind(), MapKind::NoIommu);
    assert_eq!(peer.iova(), None);
    assert_eq!(peer.bus_addr(0x10), BusAddr(0xe000_0010));
    assert_eq!(peer.len(), 4 * P);
    peer.copy_to_device(5, b"device memory").unwrap();
    let mut got = [0u8; 13];
    peer.copy_from_device(5, &mut got).unwrap();
    assert_eq!(&got, b"device memory");
    assert_eq!(peer.read_volatile::<u8>(5).unwrap(), b'd');
    drop(peer);
    assert!(fake.calls().is_empty(), "no-IOMMU mode must not call map");
}

#[test]
#[ignore = "needs hugepages"]
fn hugepage_region_iova_is_hugepage_aligned() {
    let (ctx, fake) = ctx_with(FakeMapper::new());
    let _small = ctx.alloc_region(P, PageSize::Base4K).unwrap();
    let r = ctx.alloc_region(3 << 20, PageSize::Huge2M).unwrap();
    assert_eq!(r.len(), 4 << 20);
    assert!(r.iova().unwrap().is_aligned(2 << 20));
    assert_eq!(r.contiguous_len(1), (4 << 20) - 1);
    let mut pool = ctx.pool(2048, 2048, PageSize::Huge2M).unwrap();
    assert_eq!(pool.region_len(), 4 << 20);
    let b = pool.alloc().unwrap();
    pool.free(b);
    assert_eq!(fake.live_mappings().len(), 3);
}

#[test]
#[ignore = "needs hugepages"]
fn no_iommu_hugepages_are_contiguous_within_a_page() {
    let (ctx, _fake) = ctx_with(FakeMapper::no_iommu());
    let r = ctx.alloc_region(4 << 20, PageSize::Huge2M).unwrap();
    if !can_read_pfns().unwrap() {
        panic!("this test needs root as well as hugepages");
    }
    let (b0, b1) = (r.bus_addr(0), r.bus_addr(2 << 20));
    for (page, b) in [(0usize, b0), (1, b1)] {
        assert!(b.is_aligned(2 << 20), "hugepage {page} at {b} not 2 MiB aligned");
        assert_eq!(
            r.bus_addr((page << 21) + 0x1f_ffff),
            b.add(0x1f_ffff),
            "hugepage {page} not contiguous"
        );
    }
    let adjacent = b1 == b0.add(2 << 20);
    assert_eq!(
        r.contiguous_len(0x10),
        if adjacent {
            (4 << 20) - 0x10
        } else {
            (2 << 20) - 0x10
        }
    );
    assert_eq!(r.contiguous_len((2 << 20) + 0x10), (2 << 20) - 0x10);
}

/// Behind an IOMMU a pool's buffers may span 4 KiB pages: each is one contiguous bus range the
/// device reaches end to end, and buffers do not overlap.
#[test]
fn buffers_span_pages_behind_an_iommu() {
    let (ctx, fake) = ctx_with(FakeMapper::new());
    let mut pool = ctx.pool(32 << 10, 3, PageSize::Base4K).unwrap();
    assert_eq!(pool.buf_size(), 32 << 10);
    let bufs: Vec<_> = (0..3).map(|_| pool.alloc().unwrap()).collect();
    assert!(pool.alloc().is_none());
    for (i, b) in bufs.iter().enumerate() {
        assert_eq!(b.len(), 32 << 10);
        assert_eq!(
            b.bus_addr().get() % (32 << 10),
            bufs[0].bus_addr().get() % (32 << 10)
        );
        let pattern: Vec<u8> = (0..b.len()).map(|k| (k / P + i * 16) as u8).collect();
        device_write(&fake, b.bus_addr(), &pattern);
        let mut back = vec![0u8; b.len()];
        pool.read(b, 0, &mut back).unwrap();
        assert_eq!(
            back, pattern,
            "buffer {i}: the CPU sees what the device wrote, page by page"
        );
    }
    for (i, b) in bufs.iter().enumerate() {
        let mut back = vec![0u8; b.len()];
        pool.read(b, 0, &mut back).unwrap();
        assert_eq!(
            back[b.len() - 1],
            ((b.len() - 1) / P + i * 16) as u8,
            "buffer {i} overwritten"
        );
    }
    for b in bufs {
        pool.free(b);
    }
}

/// Without an IOMMU, physical pages are contiguous only within themselves: a buffer larger than
/// a page is refused with the fix.
#[test]
fn buffers_larger_than_a_page_need_an_iommu() {
    let (ctx, _) = ctx_with(FakeMapper::no_iommu());
    let e = ctx.pool(8192, 2, PageSize::Base4K).unwrap_err();
    assert!(matches!(e, DmaError::BadPoolGeometry { .. }), "{e:?}");
    assert!(e.to_string().contains("only behind an IOMMU"), "{e}");
}
