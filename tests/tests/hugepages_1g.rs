//! DMA on 1 GiB hugepages and NUMA placement in the test bed (issue 14, part 5).
//!
//! The boot (xtask's `HUGE_1G_BINS`) has two NUMA nodes (4 GiB each, one vCPU each), four 1 GiB
//! pages reserved on the kernel command line (`hugepagesz=1G hugepages=4`: the kernel places
//! them round robin where aligned gigabytes are free, one on node 0 and three on node 1 in
//! practice) and NVMe controller N (0000:81:00.0) behind an expander bridge on node 1. Regions
//! and pools on 1 GiB pages, placed on node 1 explicitly, on the device's node (N's, from
//! sysfs) and on node 0, take NVMe writes and reads at both ends and the middle of the page;
//! each one's pages are checked with `move_pages` and the nodes' free counters; a node short of
//! pages is refused with an error that names it. Both IOMMU modes.

use std::path::Path;
use std::time::Duration;

use vfpoll_dma::numa::{self, NumaPlacement};
use vfpoll_dma::{DmaBuf, DmaContext, DmaError, MapKind, PageSize};
use vfpoll_nvme::{Controller, ControllerOptions, QpairOptions, QueuePair, RegionBuf};
use vfpoll_pci::vfio::Container;
use vfpoll_pci::{sysfs, Host};
use vfpoll_tests::*;

/// NVMe controller N, on the last NUMA node (xtask's `vm::NUMA_NVME_SERIAL`).
const NVME_N: &str = "0000:81:00.0";
const GIB: usize = 1 << 30;
/// Bytes per NVMe command here, and per piece of a region that the device writes and reads.
const CHUNK: usize = 64 << 10;

fn sys() -> &'static Path {
    Path::new("/sys")
}

/// Free 1 GiB pages on `node`.
fn free_1g(node: u32) -> u64 {
    numa::node_counters(sys(), node, PageSize::Huge1G)
        .expect("per-node hugepage counters")
        .unwrap_or_else(|| panic!("node {node} has no 1 GiB hugepage counters: boot without hugepagesz=1G?"))
        .free
}

/// Both controllers (A, on no node; N, on node 1) in one container.
fn open() -> (Controller, Controller, DmaContext) {
    bind_all(&[NVME_A, NVME_N]);
    // The controllers' own queues stay on 2 MiB pages.
    reserve_hugepages(64);
    let c = Container::open(mode()).expect("container");
    let (a, dma) =
        Controller::open_first(&c, bdf(NVME_A), ControllerOptions::default()).expect("controller A");
    let n =
        Controller::open(&c, bdf(NVME_N), dma.clone(), ControllerOptions::default()).expect("controller N");
    (a, n, dma)
}

/// Runs every request in flight to completion; the buffers that come back, by tag.
fn drain<B: vfpoll_nvme::IoBuffer>(qp: &mut QueuePair<B>, what: &str) -> Vec<(u64, B)> {
    let mut back = Vec::new();
    qp.drain(Duration::from_secs(60), |d| {
        d.result.unwrap_or_else(|e| panic!("{what}: {e}"));
        back.push((d.tag, d.buf.expect("the buffer comes back")));
    })
    .unwrap_or_else(|e| panic!("{what}: {e}"));
    back.sort_by_key(|(t, _)| *t);
    back
}

/// Where the pieces of a 1 GiB region sit: both ends and the middle of the page.
fn piece_offsets(len: usize) -> [usize; 3] {
    [0, len / 2, len - CHUNK]
}

/// Checks where `move_pages` finds each 1 GiB page of `ptr..ptr+len`: all on `node`.
fn check_placed(ptr: *const u8, len: usize, node: u32, what: &str) {
    let nodes = numa::page_nodes(ptr, len, GIB).expect("move_pages");
    assert_eq!(
        nodes,
        vec![node as i32; len / GIB],
        "{what}: pages not on node {node}"
    );
}

/// Writes a pattern from three pieces of `region` (ends and middle) to namespace 1 at `lba`
/// through `ctrl`, zeroes them, reads the blocks back into them and compares.
fn dma_through(ctrl: &Controller, region: vfpoll_dma::DmaRegion, lba: u64, stream: u64, what: &str) {
    let len = region.len();
    assert_eq!(region.page_size(), PageSize::Huge1G);
    if region.map_kind() == MapKind::NoIommu {
        assert_eq!(
            region.contiguous_len(0),
            GIB,
            "{what}: a 1 GiB page is one bus range"
        );
    } else {
        let iova = region.iova().expect("an IOVA").0;
        assert_eq!(
            iova % GIB as u64,
            0,
            "{what}: IOVA {iova:#x} is not 1 GiB aligned"
        );
    }
    let block = ctrl.namespace(1).expect("namespace 1").lba_size as u64;
    let mut qp = ctrl
        .create_qpair::<RegionBuf>(&QpairOptions::default())
        .expect("queue pair");
    // Cut the region into pieces at the offsets (the parts between are dropped).
    let mut rest = RegionBuf::whole(region);
    let mut pieces = Vec::new();
    let mut at = 0;
    for off in piece_offsets(len) {
        let tail = rest.split_off(off - at);
        rest = tail;
        let after = rest.split_off(CHUNK);
        pieces.push(std::mem::replace(&mut rest, after));
        at = off + CHUNK;
    }
    let data: Vec<Vec<u8>> = (0..3)
        .map(|i| Pattern::new(seed(), stream * 8 + i).bytes(CHUNK))
        .collect();
    for (i, p) in pieces.iter_mut().enumerate() {
        p.write(0, &data[i]).unwrap();
    }
    let lba_of = |i: usize| lba + (i * CHUNK) as u64 / block;
    for (i, p) in pieces.into_iter().enumerate() {
        qp.write(1, lba_of(i), p, i as u64)
            .map_err(|r| r.error)
            .expect("write submitted");
    }
    let mut pieces: Vec<RegionBuf> = drain(&mut qp, what).into_iter().map(|(_, b)| b).collect();
    for p in &mut pieces {
        p.fill(0, CHUNK, 0).unwrap();
    }
    for (i, p) in pieces.into_iter().enumerate() {
        qp.read(1, lba_of(i), p, i as u64)
            .map_err(|r| r.error)
            .expect("read submitted");
    }
    for (i, p) in drain(&mut qp, what) {
        let mut got = vec![0u8; CHUNK];
        p.read(0, &mut got).unwrap();
        assert!(
            got == data[i as usize],
            "{what}: piece {i} at offset {:#x} read back differs from what it wrote",
            piece_offsets(len)[i as usize]
        );
    }
}

#[test]
#[ignore = "test bed"]
fn guest_the_machine_has_two_nodes_1g_pages_and_n_on_node_1() {
    assert_eq!(numa::memory_nodes(sys()), [0, 1]);
    let (f0, f1) = (free_1g(0), free_1g(1));
    println!("free 1 GiB pages: node 0 {f0}, node 1 {f1}");
    assert!(
        f0 >= 1 && f1 >= 2,
        "the boot reserves 1 GiB pages on both nodes: {f0}, {f1}"
    );
    let host = Host::default();
    let n = sysfs::device(&host, bdf(NVME_N)).expect("controller N");
    assert!(n.is_nvme());
    assert_eq!(
        n.numa_node,
        Some(1),
        "N sits behind the expander bridge on node 1"
    );
    assert_eq!(sysfs::device(&host, bdf(NVME_A)).unwrap().numa_node, None);
}

#[test]
#[ignore = "test bed"]
fn guest_a_region_on_node_1_takes_dma_at_both_ends_of_its_1g_page() {
    let (a, _n, dma) = open();
    let before = free_1g(1);
    let region = dma
        .alloc_region_placed(GIB, PageSize::Huge1G, NumaPlacement::Node(1))
        .expect("a 1 GiB region on node 1");
    assert_eq!(region.numa_node(), Some(1));
    check_placed(region.as_ptr(), region.len(), 1, "region on node 1");
    assert_eq!(free_1g(1), before - 1, "the region took one of node 1's pages");
    // Controller A has no node: placement is the caller's, DMA works across.
    dma_through(&a, region, 0, 1, "region on node 1 through A");
    assert_eq!(free_1g(1), before, "the page is back after the region is dropped");
}

#[test]
#[ignore = "test bed"]
fn guest_a_region_on_the_devices_node_and_one_on_node_0() {
    let (_a, n, dma) = open();
    let node = sysfs::device(&Host::default(), bdf(NVME_N)).unwrap().numa_node;
    let placement = NumaPlacement::device_node(node);
    assert_eq!(placement, NumaPlacement::Node(1));
    let region = dma
        .alloc_region_placed(GIB, PageSize::Huge1G, placement)
        .expect("a 1 GiB region on N's node");
    check_placed(region.as_ptr(), region.len(), 1, "region on N's node");
    dma_through(&n, region, 0, 2, "region on N's node through N");
    // Node 0's page, written by the device on node 1: placement is honoured across nodes.
    let region = dma
        .alloc_region_placed(GIB, PageSize::Huge1G, NumaPlacement::Node(0))
        .expect("a 1 GiB region on node 0");
    assert_eq!(region.numa_node(), Some(0));
    check_placed(region.as_ptr(), region.len(), 0, "region on node 0");
    dma_through(&n, region, 4096, 3, "region on node 0 through N");
}

#[test]
#[ignore = "test bed"]
fn guest_a_pool_on_1g_pages_on_node_1() {
    let (a, n, dma) = open();
    let mut pool = dma
        .pool_placed(CHUNK, 64, PageSize::Huge1G, NumaPlacement::Node(1))
        .expect("a pool on one 1 GiB page of node 1");
    assert_eq!(pool.region_len(), GIB);
    check_placed(pool.region_ptr(), pool.region_len(), 1, "pool on node 1");
    for (ctrl, lba, stream) in [(&a, 8192, 4), (&n, 8192, 5)] {
        let block = ctrl.namespace(1).unwrap().lba_size as u64;
        let mut qp = ctrl
            .create_qpair::<DmaBuf>(&QpairOptions::default())
            .expect("queue pair");
        let data: Vec<Vec<u8>> = (0..8)
            .map(|i| Pattern::new(seed(), stream * 16 + i).bytes(CHUNK))
            .collect();
        for (i, d) in data.iter().enumerate() {
            let buf = pool.alloc().expect("a pool buffer");
            pool.write(&buf, 0, d).unwrap();
            qp.write(1, lba + (i * CHUNK) as u64 / block, buf, i as u64)
                .map_err(|r| r.error)
                .expect("write submitted");
        }
        for (_, buf) in drain(&mut qp, "pool writes") {
            pool.free(buf);
        }
        for i in 0..data.len() {
            let buf = pool.alloc().expect("a pool buffer");
            qp.read(1, lba + (i * CHUNK) as u64 / block, buf, i as u64)
                .map_err(|r| r.error)
                .expect("read submitted");
        }
        for (i, buf) in drain(&mut qp, "pool reads") {
            let mut got = vec![0u8; CHUNK];
            pool.read(&buf, 0, &mut got).unwrap();
            assert!(got == data[i as usize], "pool buffer {i} read back differs");
            pool.free(buf);
        }
        assert_eq!(pool.available(), pool.capacity());
    }
}

#[test]
#[ignore = "test bed"]
fn guest_a_node_short_of_1g_pages_is_refused_by_name() {
    let (_a, _n, dma) = open();
    let free0 = free_1g(0);
    let want = (free0 as usize + 1) * GIB;
    let e = dma
        .alloc_region_placed(want, PageSize::Huge1G, NumaPlacement::Node(0))
        .expect_err("more 1 GiB pages than node 0 has");
    assert!(matches!(e, DmaError::NumaHugepagesShort { node: 0, .. }), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains("NUMA node 0") && msg.contains("hugepagesz=1G") && msg.contains("node0/hugepages"),
        "{msg}"
    );
    assert_eq!(free_1g(0), free0, "nothing was taken");
    let e = dma
        .alloc_region_placed(GIB, PageSize::Huge1G, NumaPlacement::Node(2))
        .expect_err("there is no node 2");
    assert!(matches!(e, DmaError::NumaNodeAbsent { node: 2, .. }), "{e:?}");
    // Without a node, the kernel's choice: any node's page will do.
    let r = dma
        .alloc_region(GIB, PageSize::Huge1G)
        .expect("a 1 GiB region anywhere");
    assert_eq!(r.numa_node(), None);
    let nodes = numa::page_nodes(r.as_ptr(), r.len(), GIB).unwrap();
    assert!(nodes[0] == 0 || nodes[0] == 1, "{nodes:?}");
}

#[test]
#[ignore = "test bed"]
fn guest_perf_verifies_on_1g_buffer_pages() {
    bind_all(&[NVME_N]);
    reserve_hugepages(64);
    let before = free_1g(0) + free_1g(1);
    let mut args = vec![
        "perf",
        "--device",
        NVME_N,
        "--page-size",
        "1g",
        "--verify",
        "-w",
        "randwrite",
        "-q",
        "8",
        "--size",
        "4m",
        "--seed",
        "11",
    ];
    args.extend(backend_args());
    let out = run("vfpoll", &args);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("verify: OK"), "{text}");
    assert_eq!(free_1g(0) + free_1g(1), before, "perf gave its 1 GiB page back");
    // 4 KiB buffers without an IOMMU are refused, by name.
    if mode() == vfpoll_pci::vfio::IommuMode::NoIommu {
        let e = std::process::Command::new("vfpoll")
            .args([
                "perf",
                "--device",
                NVME_N,
                "--page-size",
                "4k",
                "--ios",
                "10",
                "--noiommu",
            ])
            .output()
            .unwrap();
        assert!(!e.status.success());
        assert!(String::from_utf8_lossy(&e.stderr).contains("needs an IOMMU"));
    }
}
