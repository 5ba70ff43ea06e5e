//! vfpoll-store and a peer BAR in the test bed (issue 23): a store over NVMe A's and B's
//! namespace 1 (one VFIO container, so one DMA context) saves checkpoint entries straight from
//! the ivshmem BAR (the GPU-BAR stand-in, 64 MiB backed by `gpubar.shm` on the host) and loads
//! them back into other parts of the BAR, crc checked from the BAR and not, whole and as
//! ranges. After the guest exits, the host checks that `gpubar.shm` holds the expected bytes
//! everywhere, and decodes the namespace images with the test's own decoder (written from
//! store/FORMAT.md, `vfpoll_tests::store`), independently of the store's reader.
//!
//! In iommufd mode (Linux 6.12) the kernel refuses to map a BAR: the registration must fail
//! with the error that names `--iommu-backend type1`, and the same data then moves through
//! the store's host paths (`put`, `read_range`) and CPU copies into the BAR, so the host
//! checks are the same.

use vfpoll_dma::DeviceBuf;
use vfpoll_nvme::{Controller, ControllerOptions, QpairOptions};
use vfpoll_pci::vfio::Container;
use vfpoll_store::device::{Device, NvmeDevice};
use vfpoll_store::{FormatOptions, ReadOptions, Store, StoreOptions};
use vfpoll_tests::store::Image;
use vfpoll_tests::*;

const MIB: usize = 1 << 20;
/// Entries saved from the BAR: name, BAR offset, length (one of an odd length, striped over
/// both members with 256 KiB chunks; one of whole pages).
const SAVES: [(&str, usize, usize); 2] = [("weights", 0, 5 * MIB + 4097), ("bias", 8 * MIB, 3 * MIB)];
/// Loads into the BAR: entry index, byte offset in the entry, length, BAR offset, verify.
/// The last two go to BAR addresses that are not page aligned but whose extents land dword
/// aligned (device to BAR all the same).
const LOADS: [(usize, usize, usize, usize, bool); 5] = [
    (0, 0, 5 * MIB + 4097, 16 * MIB, true),
    (0, 0, 5 * MIB + 4097, 24 * MIB, false),
    (1, 0, 3 * MIB, 32 * MIB, true),
    (0, MIB - 9, 2 * MIB + 17, 40 * MIB + 3, true),
    (1, 256 * 1024 + 4, MIB + 100, 48 * MIB + 4, true),
];
/// Bytes zeroed before and after each load's range (checked untouched by the host).
const MARGIN: usize = 4096;
/// The store's chunk size.
const CHUNK: u32 = 256 << 10;

fn pattern(i: usize, len: usize) -> Vec<u8> {
    Pattern::new(seed(), 300 + i as u64).bytes(len)
}

fn devices(c: &std::sync::Arc<Container>) -> Vec<Box<dyn Device>> {
    let (a, dma) =
        Controller::open_first(c, bdf(NVME_A), ControllerOptions::default()).expect("controller A");
    let b = Controller::open(c, bdf(NVME_B), dma, ControllerOptions::default()).expect("controller B");
    let q = QpairOptions {
        entries: 64,
        ..Default::default()
    };
    let keep = || -> Vec<Box<dyn std::any::Any + Send>> { vec![Box::new(c.clone())] };
    vec![
        Box::new(NvmeDevice::new(&a, 1, &q, NVME_A, keep()).expect("A namespace 1")),
        Box::new(NvmeDevice::new(&b, 1, &q, NVME_B, keep()).expect("B namespace 1")),
    ]
}

/// Cuts `[off, off + len)` (BAR offsets, after `rest`'s start) out of `rest`, which keeps what
/// follows; the gap before it is dropped.
fn carve(rest: &mut DeviceBuf, off: usize, len: usize) -> DeviceBuf {
    let mut piece = rest.split_off(off - rest.offset());
    *rest = piece.split_off(len);
    piece
}

#[test]
#[ignore = "test bed"]
fn guest_store_saves_from_and_loads_into_the_ivshmem_bar() {
    bind_all(&[NVME_A, NVME_B, IVSHMEM]);
    reserve_hugepages(64);
    let c = Container::open(mode()).expect("container");
    let opts = FormatOptions {
        label: "p2p".into(),
        chunk_size: CHUNK,
        store: StoreOptions {
            io_channels: 2,
            io_buffers: 8,
            ..Default::default()
        },
        ..Default::default()
    };
    let store = Store::format_devices(devices(&c), &opts).expect("format");
    assert_backend(&c);
    let dma = store
        .dma_context()
        .expect("two VFIO controllers in one container: one DMA context");
    let shm = c.device(bdf(IVSHMEM)).expect("ivshmem");
    // SAFETY: ivshmem's BAR2 is shared memory, not registers: writes to it start no DMA.
    let bar = unsafe { shm.map_bar(2) }.expect("BAR2");
    // Known bytes in the save ranges; zeroes where the loads go (a load that writes nothing
    // fails the checks).
    for (i, &(_, off, len)) in SAVES.iter().enumerate() {
        bar.copy_to(off, &pattern(i, len)).expect("fill the BAR");
    }
    for &(_, _, len, off, _) in &LOADS {
        bar.copy_to(off - MARGIN, &vec![0u8; len + 2 * MARGIN])
            .expect("zero the BAR");
    }
    // SAFETY: `bar` is this process's mapping of the BAR and outlives the registration (and
    // every piece of it below, dropped before it); the test reaches the BAR only through
    // those pieces while they live.
    let peer = unsafe { dma.register_peer_bar(bar.as_ptr(), bar.len() as u64, shm.bar_bus_addr(2).unwrap()) };
    let mut tx = store.begin("p2p").expect("begin");
    let peer = peer_or_refusal(peer, "the ivshmem BAR");
    let direct = peer.is_some();
    match peer {
        Some(peer) => {
            let mut rest = DeviceBuf::whole(peer);
            for (i, &(name, off, len)) in SAVES.iter().enumerate() {
                let mut src = carve(&mut rest, off, len);
                tx.put_from_peer(name, format!("u8[{len}]").as_bytes(), &mut src)
                    .expect("put_from_peer");
                assert_eq!(src.len(), len, "the BAR buffer comes back whole");
                let mut back = vec![0u8; len];
                src.read(0, &mut back).unwrap();
                assert!(back == pattern(i, len), "{name}: a save changed the BAR");
            }
            tx.put("host", b"", &pattern(9, 100_000)).expect("put");
            tx.commit().expect("commit");
            let r = store.open_version("p2p", None).expect("version");
            for (i, &(name, _, len)) in SAVES.iter().enumerate() {
                assert!(
                    r.read_to_vec(name).expect("read") == pattern(i, len),
                    "{name} through the host path"
                );
            }
            let mut rest = DeviceBuf::whole(rest.into_region().unwrap_or_else(|_| panic!("pieces left")));
            for &(e, from, len, off, verify) in &LOADS {
                let mut dst = carve(&mut rest, off, len);
                r.read_into_peer(SAVES[e].0, from as u64, &mut dst, &ReadOptions { verify })
                    .unwrap_or_else(|err| panic!("read_into_peer {} at {from}: {err}", SAVES[e].0));
                assert_eq!(dst.len(), len);
                let mut got = vec![0u8; len];
                dst.read(0, &mut got).unwrap();
                assert!(
                    got == pattern(e, SAVES[e].2)[from..from + len],
                    "{} bytes {from}..+{len} at BAR {off:#x}, verify {verify}",
                    SAVES[e].0
                );
            }
            drop(r);
        }
        None => {
            // iommufd: the store's host paths, the CPU copying to and from the BAR.
            for (i, &(name, off, len)) in SAVES.iter().enumerate() {
                let mut staged = vec![0u8; len];
                bar.copy_from(off, &mut staged).unwrap();
                assert!(staged == pattern(i, len));
                tx.put(name, format!("u8[{len}]").as_bytes(), &staged)
                    .expect("put");
            }
            tx.put("host", b"", &pattern(9, 100_000)).expect("put");
            tx.commit().expect("commit");
            let r = store.open_version("p2p", None).expect("version");
            for &(e, from, len, off, verify) in &LOADS {
                let mut staged = vec![0u8; len];
                r.read_range(SAVES[e].0, from as u64, &mut staged, &ReadOptions { verify })
                    .expect("read_range");
                bar.copy_to(off, &staged).unwrap();
            }
        }
    }
    let fsck = store.fsck().expect("fsck");
    assert!(fsck.is_clean(), "{:?}", fsck.findings);
    let uuid = store.info().uuid;
    drop(store);
    drop(bar);
    write_manifest(
        "store_p2p.txt",
        &[
            ("mode".into(), mode_name().into()),
            ("uuid".into(), uuid),
            ("direct".into(), direct.to_string()),
        ],
    );
}

/// The ivshmem backing file holds the saved bytes where they were and every load where it
/// went; the namespace images decode to the saved entries.
#[test]
#[ignore = "test bed"]
fn host_check_store_saves_from_and_loads_into_the_ivshmem_bar() {
    let m = read_manifest("store_p2p.txt");
    assert_eq!(manifest_get(&m, "mode"), run_mode());
    assert_eq!(
        manifest_get(&m, "direct"),
        (run_mode() != "iommufd").to_string(),
        "peer-BAR I/O wherever the kernel maps a BAR"
    );
    let shm = run_dir().join("gpubar.shm");
    for (i, &(name, off, len)) in SAVES.iter().enumerate() {
        assert!(
            read_file_range(&shm, off as u64, len) == pattern(i, len),
            "gpubar.shm at {off:#x}: {name} as saved"
        );
    }
    for &(e, from, len, off, verify) in &LOADS {
        assert!(
            read_file_range(&shm, off as u64, len) == pattern(e, SAVES[e].2)[from..from + len],
            "gpubar.shm at {off:#x}: {} bytes {from}..+{len} (verify {verify})",
            SAVES[e].0
        );
        // The bytes around each load are untouched.
        for at in [off - MARGIN, off + len] {
            assert!(
                read_file_range(&shm, at as u64, MARGIN) == vec![0u8; MARGIN],
                "gpubar.shm at {at:#x}, next to the load at {off:#x}: touched"
            );
        }
    }
    let paths = [run_dir().join("nvme-a-ns1.img"), run_dir().join("nvme-b-ns1.img")];
    let img = Image::open(&[paths[0].as_path(), paths[1].as_path()]);
    let hex: String = img.supers[0].uuid.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, manifest_get(&m, "uuid").replace('-', ""), "store UUID");
    assert_eq!(img.supers[0].label, "p2p");
    let (_, versions) = img
        .checkpoints
        .iter()
        .find(|c| c.0 == "p2p")
        .expect("checkpoint p2p");
    assert_eq!(versions.len(), 1);
    let v = &versions[0];
    assert_eq!(v.entries.len(), 3);
    for (i, &(name, _, len)) in SAVES.iter().enumerate() {
        let e = &v.entries[i];
        assert_eq!((e.0.as_str(), e.2 as usize), (name, len));
        assert_eq!(e.1, format!("u8[{len}]").into_bytes(), "meta");
        assert!(
            img.entry_data(&e.3) == pattern(i, len),
            "{name} on the namespaces"
        );
    }
    assert!(
        img.entry_data(&v.entries[2].3) == pattern(9, 100_000),
        "host entry"
    );
    // The odd-length entry is striped over both members.
    let chunk_pages = CHUNK as u64 / 4096;
    let members: std::collections::HashSet<u64> =
        v.entries[0].3.iter().map(|e| (e.0 / chunk_pages) % 2).collect();
    assert_eq!(members.len(), 2, "weights spans both namespaces");
}
