//! Peer-to-peer DMA in the test bed (issue 5): the NVMe controller reads into and writes from
//! the ivshmem BAR (the GPU-BAR stand-in) with no CPU copy, and moves data through controller
//! B's CMB into a namespace of controller A. After the guest exits, the host compares the
//! ivshmem backing file and the namespace images.
//!
//! In iommufd mode (Linux 6.12) the kernel cannot map a peer device's BAR into the IOAS: the
//! registration must fail with the error that names `--iommu-backend type1`, and the same data
//! then moves through hugepage staging buffers (what works there), so the host checks are the
//! same. B's own CMB works in every mode (the controller reaches it without the IOMMU).

use std::time::Duration;

use vfpoll_dma::{DmaContext, PageSize};
use vfpoll_nvme::{
    AnyBuf, CmbBuf, Controller, ControllerOptions, DeviceBuf, QpairOptions, QueuePair, RegionBuf,
};
use vfpoll_pci::vfio::Container;
use vfpoll_tests::*;

const MIB: usize = 1 << 20;
/// NVMe → BAR reads: (BAR offset, LBA of A's namespace 1, length). Offsets and lengths cross
/// pages, PRP lists and A's 512 KiB MDTS; BAR offsets are dword aligned.
const READS: [(usize, u64, usize); 5] = [
    (0, 2048, 4096),
    (8192 + 512, 4096, 64 * 1024 + 512),
    (MIB, 8192, MIB),
    (5 * MIB + 4, 16384, 3 * MIB + 512),
    (12 * MIB, 32768, 512),
];
/// BAR → NVMe writes: (BAR offset, LBA of A's namespace 1, length).
const WRITES: [(usize, u64, usize); 2] = [(16 * MIB, 65536, 2 * MIB + 512), (20 * MIB + 2048, 73728, 4096)];
/// CMB copy: B's namespace 1 at this LBA → B's CMB → A's namespace 2 at this LBA, this long.
const CMB_COPY: (u64, u64, usize) = (4096, 1024, 3 * MIB);

/// Waits for everything in flight to succeed; returns each completion's tag and buffer (back
/// from the queue pair: only then may the CPU look at it), in tag order.
fn wait<B: vfpoll_nvme::IoBuffer>(qp: &mut QueuePair<B>, what: &str) -> Vec<(u64, B)> {
    let mut back = Vec::new();
    qp.drain(Duration::from_secs(60), |d| {
        d.result.unwrap_or_else(|e| panic!("{what}: {e}"));
        let buf = d
            .buf
            .unwrap_or_else(|| panic!("{what}: tag {} did not give its buffer back", d.tag));
        back.push((d.tag, buf));
    })
    .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(!back.is_empty(), "{what}: nothing completed");
    back.sort_by_key(|(tag, _)| *tag);
    back
}

fn host_buf(dma: &DmaContext, data: &[u8]) -> RegionBuf {
    let r = dma.alloc_region(data.len(), PageSize::Huge2M).unwrap();
    let mut b = RegionBuf::new(r, 0, data.len()).unwrap();
    b.write(0, data).unwrap();
    b
}

fn read_back(qp: &mut QueuePair<AnyBuf>, dma: &DmaContext, nsid: u32, lba: u64, len: usize) -> Vec<u8> {
    let r = dma.alloc_region(len, PageSize::Huge2M).unwrap();
    qp.read(nsid, lba, AnyBuf::Host(RegionBuf::new(r, 0, len).unwrap()), 0)
        .map_err(|r| r.error)
        .unwrap();
    let Some((_, AnyBuf::Host(b))) = wait(qp, "read back").pop() else {
        panic!("read back: a host buffer comes back")
    };
    let mut v = vec![0u8; len];
    b.read(0, &mut v).unwrap();
    v
}

/// Cuts the `(offset, len)` ranges (in order, disjoint, offsets in the BAR) out of `rest`,
/// which keeps what follows the last one; the gaps between them are dropped.
fn carve(rest: &mut DeviceBuf, ranges: impl Iterator<Item = (usize, usize)>) -> Vec<DeviceBuf> {
    ranges
        .map(|(off, len)| {
            let mut piece = rest.split_off(off - rest.offset());
            *rest = piece.split_off(len);
            piece
        })
        .collect()
}

#[test]
#[ignore = "test bed"]
fn guest_nvme_reads_into_and_writes_from_the_ivshmem_bar() {
    bind_all(&[NVME_A, IVSHMEM]);
    reserve_hugepages(64);
    let c = Container::open(mode()).unwrap();
    let (a, dma) = Controller::open_first(&c, bdf(NVME_A), ControllerOptions::default()).unwrap();
    let _dma_back = DmaReturnCheck::new(&dma);
    let shm = c.device(bdf(IVSHMEM)).unwrap();
    // SAFETY: ivshmem's BAR2 is shared memory, not registers: writes to it start no DMA.
    let bar = unsafe { shm.map_bar(2) }.unwrap();
    // SAFETY: `bar` is this process's mapping of the BAR and outlives the registration (and
    // every piece of it below); the test reaches the BAR only through those pieces.
    let peer = unsafe { dma.register_peer_bar(bar.as_ptr(), bar.len() as u64, shm.bar_bus_addr(2).unwrap()) };
    let mut qp = a.create_qpair::<AnyBuf>(&QpairOptions::default()).unwrap();
    let seed = seed();
    let Some(peer) = peer_or_refusal(peer, "the ivshmem BAR") else {
        // iommufd: NVMe -> hugepages -> BAR and BAR -> hugepages -> NVMe, the CPU copying.
        for (i, &(off, lba, len)) in READS.iter().enumerate() {
            let data = Pattern::new(seed, 10 + i as u64).bytes(len);
            qp.write(1, lba, AnyBuf::Host(host_buf(&dma, &data)), 0)
                .map_err(|r| r.error)
                .unwrap();
            wait(&mut qp, "write source data");
            let staged = read_back(&mut qp, &dma, 1, lba, len);
            assert!(staged == data, "staging buffer at LBA {lba}");
            bar.copy_to(off, &staged).unwrap();
        }
        for (i, &(off, lba, len)) in WRITES.iter().enumerate() {
            let data = Pattern::new(seed, 20 + i as u64).bytes(len);
            bar.copy_to(off, &data).unwrap();
            let mut staged = vec![0u8; len];
            bar.copy_from(off, &mut staged).unwrap();
            qp.write(1, lba, AnyBuf::Host(host_buf(&dma, &staged)), 2)
                .map_err(|r| r.error)
                .unwrap();
            wait(&mut qp, "staged BAR -> NVMe write");
            assert!(
                read_back(&mut qp, &dma, 1, lba, len) == data,
                "namespace at LBA {lba}: not what the BAR held"
            );
        }
        assert_backend(&c);
        assert_idle(&qp, "NVMe A");
        write_manifest("p2p.txt", &[("mode".into(), mode_name().into())]);
        return;
    };
    let mut bar_rest = DeviceBuf::whole(peer);

    // NVMe → BAR: put known data on the namespace, then read it straight into the BAR.
    for (i, &(_, lba, len)) in READS.iter().enumerate() {
        let data = Pattern::new(seed, 10 + i as u64).bytes(len);
        qp.write(1, lba, AnyBuf::Host(host_buf(&dma, &data)), 0)
            .map_err(|r| r.error)
            .unwrap();
        wait(&mut qp, "write source data");
    }
    let dsts = carve(&mut bar_rest, READS.iter().map(|&(off, _, len)| (off, len)));
    for (i, (dst, &(_, lba, _))) in dsts.into_iter().zip(&READS).enumerate() {
        qp.read(1, lba, AnyBuf::Device(dst), i as u64)
            .map_err(|r| r.error)
            .unwrap();
    }
    let back = wait(&mut qp, "NVMe -> BAR reads");
    assert_eq!(back.len(), READS.len());
    for ((i, b), &(off, _, len)) in back.into_iter().zip(&READS) {
        let AnyBuf::Device(b) = b else {
            panic!("a device buffer comes back")
        };
        let mut got = vec![0u8; len];
        b.read(0, &mut got).unwrap();
        assert!(
            got == Pattern::new(seed, 10 + i).bytes(len),
            "BAR at {off:#x}: not what the namespace holds"
        );
    }

    // BAR → NVMe: the CPU puts data in the BAR, the controller writes it to the namespace.
    let srcs = carve(&mut bar_rest, WRITES.iter().map(|&(off, _, len)| (off, len)));
    for (i, (mut src, &(_, lba, len))) in srcs.into_iter().zip(&WRITES).enumerate() {
        let data = Pattern::new(seed, 20 + i as u64).bytes(len);
        src.write(0, &data).unwrap();
        qp.write(1, lba, AnyBuf::Device(src), 2)
            .map_err(|r| r.error)
            .unwrap();
        wait(&mut qp, "BAR -> NVMe write");
        assert!(
            read_back(&mut qp, &dma, 1, lba, len) == data,
            "namespace at LBA {lba}: not what the BAR held"
        );
    }
    assert_idle(&qp, "NVMe A");
    write_manifest("p2p.txt", &[("mode".into(), mode_name().into())]);
}

#[test]
#[ignore = "test bed"]
fn host_check_nvme_reads_into_and_writes_from_the_ivshmem_bar() {
    assert_eq!(manifest_get(&read_manifest("p2p.txt"), "mode"), run_mode());
    let shm = run_dir().join("gpubar.shm");
    let img = run_dir().join("nvme-a-ns1.img");
    for (i, &(off, lba, len)) in READS.iter().enumerate() {
        let want = Pattern::new(seed(), 10 + i as u64).bytes(len);
        assert!(
            read_file_range(&shm, off as u64, len) == want,
            "gpubar.shm at {off:#x}"
        );
        assert!(
            read_file_range(&img, lba * 512, len) == want,
            "nvme-a-ns1.img at LBA {lba}"
        );
    }
    for (i, &(off, lba, len)) in WRITES.iter().enumerate() {
        let want = Pattern::new(seed(), 20 + i as u64).bytes(len);
        assert!(
            read_file_range(&shm, off as u64, len) == want,
            "gpubar.shm at {off:#x}"
        );
        assert!(
            read_file_range(&img, lba * 512, len) == want,
            "nvme-a-ns1.img at LBA {lba}"
        );
    }
}

#[test]
#[ignore = "test bed"]
fn guest_copy_through_the_cmb_of_b_into_a() {
    bind_all(&[NVME_A, NVME_B]);
    reserve_hugepages(64);
    let c = Container::open(mode()).unwrap();
    let (a, dma) = Controller::open_first(&c, bdf(NVME_A), ControllerOptions::default()).unwrap();
    let b = Controller::open(&c, bdf(NVME_B), dma.clone(), ControllerOptions::default()).unwrap();
    let _dma_back = DmaReturnCheck::new(&dma);
    let (src_lba, dst_lba, len) = CMB_COPY;
    let data = Pattern::new(seed(), 30).bytes(len);
    let mut qb = b.create_qpair::<AnyBuf>(&QpairOptions::default()).unwrap();
    let mut qa = a.create_qpair::<AnyBuf>(&QpairOptions::default()).unwrap();
    qb.write(1, src_lba, AnyBuf::Host(host_buf(&dma, &data)), 0)
        .map_err(|r| r.error)
        .unwrap();
    wait(&mut qb, "write source data on B");

    // B reads its namespace into its own CMB (no host memory involved).
    let cmb = b.cmb().expect("B's CMB");
    assert!(cmb.capabilities().rds() && cmb.capabilities().wds());
    let slice = cmb.alloc(len, 4096).unwrap();
    qb.read(1, src_lba, AnyBuf::Cmb(CmbBuf::whole(slice)), 1)
        .map_err(|r| r.error)
        .unwrap();
    let Some((_, AnyBuf::Cmb(in_cmb))) = wait(&mut qb, "B: namespace -> own CMB").pop() else {
        panic!("a CMB buffer comes back")
    };
    let mut seen = vec![0u8; len];
    in_cmb.read(0, &mut seen).unwrap();
    assert!(seen == data, "B's CMB does not hold what B read");

    // A writes B's CMB to A's namespace 2: A reaches B's memory peer to peer, through the IOMMU
    // when there is one.
    // SAFETY: the CMB mapping lives in B's controller, which outlives the registration, and
    // `in_cmb` (which owns these bytes) outlives it too and is not touched while A's command
    // holds them.
    let peer = unsafe { dma.register_peer_bar(in_cmb.as_ptr(), len as u64, in_cmb.bus_addr(0)) };
    match peer_or_refusal(peer, "B's CMB") {
        Some(peer) => {
            qa.write(2, dst_lba, AnyBuf::Device(DeviceBuf::whole(peer)), 2)
                .map_err(|r| r.error)
                .unwrap();
            wait(&mut qa, "A: B's CMB -> A's namespace 2");
        }
        None => {
            // iommufd: A writes a hugepage copy of what B's CMB holds.
            qa.write(2, dst_lba, AnyBuf::Host(host_buf(&dma, &seen)), 2)
                .map_err(|r| r.error)
                .unwrap();
            wait(&mut qa, "A: staged copy of B's CMB -> A's namespace 2");
            assert_backend(&c);
        }
    }
    assert!(
        read_back(&mut qa, &dma, 2, dst_lba, len) == data,
        "A's namespace 2 does not hold the copy"
    );
    assert_idle(&qa, "NVMe A");
    assert_idle(&qb, "NVMe B");
    write_manifest("cmb.txt", &[("mode".into(), mode_name().into())]);
}

#[test]
#[ignore = "test bed"]
fn host_check_copy_through_the_cmb_of_b_into_a() {
    assert_eq!(manifest_get(&read_manifest("cmb.txt"), "mode"), run_mode());
    let (src_lba, dst_lba, len) = CMB_COPY;
    let want = Pattern::new(seed(), 30).bytes(len);
    assert!(
        read_file_range(&run_dir().join("nvme-b-ns1.img"), src_lba * 512, len) == want,
        "B's namespace 1"
    );
    assert!(
        read_file_range(&run_dir().join("nvme-a-ns2.img"), dst_lba * 4096, len) == want,
        "A's namespace 2"
    );
}
