//! Checkpoints saved from and loaded into a peer device's BAR (issue 23), over the in-process
//! NVMe model: an anonymous mapping registered in the controller's DMA context stands in for
//! the BAR (the model DMAs through the same fake IOMMU, so the controller reads and writes it
//! by IOVA, as a real one reads a BAR). The model's fault log fails the test on any DMA outside
//! a mapping, and a tap on its DMA space counts the bytes it moved to and from the BAR: the
//! proof that whole pages went device to BAR, not through the store's buffers.

mod common;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use common::{bytes, fopts, mem_store};
use vfpoll_dma::{DeviceBuf, DmaContext, FakeMapper, HugeMem, PageSize, PeerRegion};
use vfpoll_nvme::{Controller, ControllerOptions, QpairOptions};
use vfpoll_nvme_model::{DmaFault, DmaSpace, FaultCheck, FaultLog, ModelConfig, NamespaceConfig, NvmeModel};
use vfpoll_pci::BusAddr;
use vfpoll_store::device::{
    Device, DeviceError, IoBuf, IoOp, MemDevice, NvmeDevice, UringDevice, UringOptions,
};
use vfpoll_store::{ReadOptions, Store, StoreError};

const BAR: usize = 8 << 20;

/// The stand-in BAR and its registration (dropped first: the region before the memory).
struct Bar {
    region: Option<PeerRegion>,
    mem: HugeMem,
}

fn register(dma: &DmaContext) -> Bar {
    let mem = HugeMem::alloc(BAR as u64, PageSize::Base4K, "/sys".as_ref()).unwrap();
    // SAFETY: the stand-in BAR is ordinary memory that outlives the region (field order) and
    // takes any access; the test reaches it only through the region's pieces.
    let region = unsafe { dma.register_peer_bar(mem.as_ptr(), BAR as u64, BusAddr(0xe000_0000)) }.unwrap();
    Bar {
        region: Some(region),
        mem,
    }
}

/// The model's DMA space with a counter of the bytes that land in the BAR's CPU range.
struct Tap {
    inner: Arc<FaultLog>,
    bar: (AtomicUsize, AtomicUsize),
    bar_bytes: AtomicU64,
}

impl Tap {
    fn bar_bytes(&self) -> u64 {
        self.bar_bytes.swap(0, Ordering::Relaxed)
    }
}

// SAFETY: every translation is the inner space's, unchanged; the tap only counts.
unsafe impl DmaSpace for Tap {
    fn translate(&self, bus: BusAddr, len: u64) -> Option<*mut u8> {
        let p = self.inner.translate(bus, len)?;
        let (lo, hi) = (
            self.bar.0.load(Ordering::Relaxed),
            self.bar.1.load(Ordering::Relaxed),
        );
        if p.addr() >= lo && p.addr() < hi {
            self.bar_bytes.fetch_add(len, Ordering::Relaxed);
        }
        Some(p)
    }
    fn fault(&self, fault: DmaFault) {
        self.inner.fault(fault)
    }
}

fn bring_up() -> (FaultCheck, Arc<Tap>, NvmeModel, Controller) {
    let mapper = Arc::new(FakeMapper::new());
    let log = Arc::new(FaultLog::new(mapper.clone()));
    let tap = Arc::new(Tap {
        inner: log.clone(),
        bar: (AtomicUsize::new(0), AtomicUsize::new(0)),
        bar_bytes: AtomicU64::new(0),
    });
    let cfg = ModelConfig {
        namespaces: vec![
            NamespaceConfig::new(1, 512, 16384),
            NamespaceConfig::new(2, 4096, 2048),
        ],
        volatile_write_cache: true,
        mdts: 5, // 128 KiB: a 256 KiB chunk is split in two commands
        ..Default::default()
    };
    let model = NvmeModel::start(cfg, tap.clone()).unwrap();
    let o = ControllerOptions {
        page_size: PageSize::Base4K,
        io_queues: 4,
        ..Default::default()
    };
    let ctrl = Controller::new(model.bar0(), DmaContext::new(mapper), o).unwrap();
    (FaultCheck(log), tap, model, ctrl)
}

fn devices(c: &Controller) -> Vec<Box<dyn Device>> {
    let q = QpairOptions {
        entries: 16, // a small queue: the burst waits for room
        ..Default::default()
    };
    vec![
        Box::new(NvmeDevice::new(c, 1, &q, "model", vec![]).unwrap()),
        Box::new(NvmeDevice::new(c, 2, &q, "model", vec![]).unwrap()),
    ]
}

fn bar_bytes(b: &DeviceBuf, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    b.read(off, &mut v).unwrap();
    v
}

#[test]
fn save_from_and_load_into_a_peer_bar() {
    let dir = tempfile::tempdir().unwrap();
    let (_check, tap, model, ctrl) = bring_up();
    let mut f = fopts(dir.path());
    f.chunk_size = 256 << 10;
    let store = Store::format_devices(devices(&ctrl), &f).unwrap();
    let dma = store
        .dma_context()
        .expect("two namespaces of one controller: one DMA context");
    let mut bar = register(&dma);
    let lo = bar.mem.as_ptr().addr();
    tap.bar.0.store(lo, Ordering::Relaxed);
    tap.bar.1.store(lo + BAR, Ordering::Relaxed);
    let mut src = DeviceBuf::whole(bar.region.take().unwrap());
    // An entry of an odd length over several chunks and both members, from the BAR's start;
    // loads go into the BAR's upper half.
    let len = 3 * (256 << 10) + 100_000 + 1234;
    let pattern = bytes(7, len);
    let mut hi = src.split_off(BAR / 2);
    let mut gap = src.split_off(len);
    src.write(0, &pattern).unwrap();

    let mut tx = store.begin("m").unwrap();
    tap.bar_bytes();
    tx.put_from_peer("w", b"u8[len]", &mut src).unwrap();
    assert_eq!(
        tap.bar_bytes(),
        (len / 4096 * 4096) as u64,
        "the controller read every whole page from the BAR, the odd bytes went through a store buffer"
    );
    assert_eq!(src.len(), len, "the buffer is whole again");
    assert_eq!(bar_bytes(&src, 0, len), pattern, "a save does not change the BAR");
    assert!(matches!(
        tx.put_from_peer("w", b"", &mut src),
        Err(StoreError::Exists(_))
    ));
    tx.put("host", b"", &pattern[..5000]).unwrap();
    // A BAR buffer that does not start at a multiple of 4: NVMe cannot DMA there, so the whole
    // entry goes through the store's buffers (and still arrives).
    let mut odd = gap.split_off(1);
    let _after_odd = odd.split_off(10_000);
    odd.write(0, &pattern[..10_000]).unwrap();
    tx.put_from_peer("unaligned", b"", &mut odd).unwrap();
    assert_eq!(
        tap.bar_bytes(),
        0,
        "nothing device to BAR at an unaligned address"
    );
    tx.commit().unwrap();

    // What the namespaces hold decodes to the pattern through the host path.
    let r = store.open_version("m", None).unwrap();
    assert_eq!(r.entry("w").unwrap().meta, b"u8[len]");
    assert_eq!(r.read_to_vec("w").unwrap(), pattern);
    assert_eq!(r.read_to_vec("unaligned").unwrap(), &pattern[..10_000]);
    assert!(store.fsck().unwrap().is_clean());

    // Loads into the BAR, with the crc checked from the BAR and without.
    let mut dst = hi.split_off(0);
    let mut after = dst.split_off(len);
    for verify in [true, false] {
        dst.write(0, &vec![0u8; len]).unwrap();
        r.read_into_peer("w", 0, &mut dst, &ReadOptions { verify })
            .unwrap();
        assert_eq!(dst.len(), len);
        assert_eq!(bar_bytes(&dst, 0, len), pattern, "verify {verify}");
    }
    // A range with both ends inside extents (through the store's buffers) and whole extents
    // between them (device to BAR), into a page-aligned spot past the first load.
    let mut range = after.split_off(1 << 20);
    let _tail = range.split_off(500_000);
    for verify in [true, false] {
        range.write(0, &vec![0u8; 500_000]).unwrap();
        r.read_into_peer("w", 300_001, &mut range, &ReadOptions { verify })
            .unwrap();
        assert_eq!(
            bar_bytes(&range, 0, 500_000),
            &pattern[300_001..800_001],
            "verify {verify}"
        );
    }
    // A range whose extents land dword-aligned in the BAR: device to BAR.
    let mut aligned = range.split_off(0);
    let _rest = aligned.split_off(300_000);
    r.read_into_peer("w", 256 << 10, &mut aligned, &ReadOptions::default())
        .unwrap();
    assert_eq!(
        bar_bytes(&aligned, 0, 300_000),
        &pattern[256 << 10..(256 << 10) + 300_000]
    );
    range = aligned;
    // Nothing outside the lent range was touched.
    assert_eq!(bar_bytes(&after, 0, 4096), vec![0u8; 4096]);
    assert!(matches!(
        r.read_into_peer("w", len as u64 - 10, &mut range, &ReadOptions::default()),
        Err(StoreError::Invalid(_))
    ));
    assert!(matches!(
        r.read_into_peer("nope", 0, &mut range, &ReadOptions::default()),
        Err(StoreError::NotFound(_))
    ));

    // One flipped byte in a whole extent (read device to BAR): the crc read back from the BAR
    // catches it; without verify the bytes arrive as stored.
    let at = 2 * (256 << 10) + 4096 + 17;
    let needle = &pattern[at..at + 64];
    let (nsid, lba_size, pos) = [(1u32, 512usize), (2, 4096)]
        .into_iter()
        .find_map(|(ns, lbs)| {
            let data = model.namespace_data(ns).unwrap();
            data.windows(64).position(|w| w == needle).map(|p| (ns, lbs, p))
        })
        .expect("the extent's bytes are on a namespace");
    let lba = (pos / lba_size) as u64;
    let mut block = model.read_ns(nsid, lba, 1).unwrap();
    block[pos % lba_size] ^= 0x40;
    model.write_ns(nsid, lba, &block).unwrap();
    let e = r
        .read_into_peer("w", 0, &mut dst, &ReadOptions::default())
        .unwrap_err();
    assert!(matches!(e, StoreError::Checksum { .. }), "{e}");
    assert!(e.to_string().contains("peer BAR"), "{e}");
    assert_eq!(dst.len(), len, "the buffer is whole again after a failed check");
    r.read_into_peer("w", 0, &mut dst, &ReadOptions { verify: false })
        .unwrap();
    let got = bar_bytes(&dst, 0, len);
    let diff: Vec<usize> = (0..len).filter(|&i| got[i] != pattern[i]).collect();
    assert_eq!(diff, vec![at], "exactly the flipped byte differs");
    assert!(matches!(r.read_to_vec("w"), Err(StoreError::Checksum { .. })));
    drop(r);
    drop((src, hi, dst, after, range));
    drop(store);
}

#[test]
fn a_store_that_cannot_dma_into_a_bar_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _h) = mem_store(dir.path(), 2, 16 << 20);
    assert!(store.dma_context().is_none());
    let dma = DmaContext::for_testing();
    let mut bar = register(&dma);
    let mut buf = DeviceBuf::whole(bar.region.take().unwrap());
    let mut tx = store.begin("m").unwrap();
    let e = tx.put_from_peer("w", b"", &mut buf).unwrap_err();
    assert!(matches!(e, StoreError::Invalid(_)), "{e}");
    assert!(e.to_string().contains("vfio:"), "{e}");
    tx.put("w", b"", &[1u8; 5000]).unwrap();
    tx.commit().unwrap();
    let r = store.open_version("m", None).unwrap();
    let e = r
        .read_into_peer("w", 0, &mut buf.split_off(BAR - 5000), &ReadOptions::default())
        .unwrap_err();
    assert!(e.to_string().contains("one DMA context"), "{e}");
    assert_eq!(buf.len(), BAR - 5000);
    drop(r);
    drop(store);

    // The backends themselves refuse a peer buffer and hand it back: a file and memory cannot
    // DMA into a BAR (io_uring would give the kernel the BAR's MMIO mapping).
    let file = UringOptions {
        create_size: Some(1 << 20),
        allow_buffered: true,
        ..Default::default()
    };
    let devs: [Box<dyn Device>; 2] = [
        Box::new(MemDevice::new(1 << 20, 512, true)),
        Box::new(UringDevice::open(&dir.path().join("f.img"), &file).unwrap()),
    ];
    for mut dev in devs {
        let (e, op) = dev
            .submit(
                1,
                IoOp::Read {
                    offset: 0,
                    buf: IoBuf::peer(buf),
                },
            )
            .unwrap_err();
        assert!(matches!(e, DeviceError::Invalid(_)), "{}: {e}", dev.describe());
        assert!(e.to_string().contains("vfio:"), "{e}");
        assert!(dev.dma_context().is_none());
        assert_eq!(dev.outstanding(), 0);
        buf = op
            .into_buf()
            .unwrap()
            .into_peer()
            .expect("the peer buffer comes back");
    }
    assert_eq!(buf.len(), BAR - 5000);
}
