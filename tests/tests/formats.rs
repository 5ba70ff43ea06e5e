//! Namespace formats in the test bed (issue 10): QEMU's controller F (`vfpoll-f`, 00:0b.0) has
//! a namespace of each format vfpoll must handle or refuse: 512 + 8 bytes of metadata at the end
//! of each block (extended LBA), 512 + 8 in a separate buffer, PI type 1 in 8 bytes of
//! metadata, 4096 + 64 in a separate buffer with PI type 1 in the first bytes, a 64-bit guard
//! PI format (refused), a zoned namespace and a plain one for format changes. The guest writes
//! data and metadata and reads them back; the host then checks the image files, where QEMU keeps
//! each block's metadata after the data of all blocks: every written block holds what was
//! written, metadata and protection information too, and no other byte changed.

use std::time::Duration;

use vfpoll_dma::{DmaBuf, DmaContext, DmaPool, PageSize};
use vfpoll_nvme::format::{pi, PiCheck, PiFormat, PiMode, PiType};
use vfpoll_nvme::zns::{self, ZoneAction, ZoneFilter, ZoneState};
use vfpoll_nvme::{
    Controller, ControllerOptions, Done, FormatOptions, NsFormat, NvmeError, QpairOptions, QueuePair,
};
use vfpoll_pci::vfio::Container;
use vfpoll_tests::*;

/// NVMe controller F: the namespace formats.
const NVME_F: &str = "0000:00:0b.0";

/// Namespaces of F and their images: (nsid, image, bytes, data size, metadata size).
const F_NS: &[(u32, &str, u64, usize, usize)] = &[
    (1, "nvme-f-ns1.img", 16 << 20, 512, 8),
    (2, "nvme-f-ns2.img", 16 << 20, 512, 8),
    (3, "nvme-f-ns3.img", 16 << 20, 512, 8),
    (4, "nvme-f-ns4.img", 16 << 20, 4096, 64),
];
/// The zoned namespace: 4096-byte blocks, zones of 1 MiB with 768 KiB capacity.
const ZONED: u32 = 6;
const ZONE_BLOCKS: u64 = 256;
const ZONE_CAP: u64 = 192;

fn open_f() -> (Controller, DmaContext) {
    bind_all(&[NVME_F]);
    reserve_hugepages(64);
    let c = Container::open(mode()).expect("container");
    Controller::open_first(&c, bdf(NVME_F), ControllerOptions::default()).expect("controller F")
}

fn wait<B: vfpoll_nvme::IoBuffer>(qp: &mut QueuePair<B>) -> Done<B> {
    let mut out = None;
    let start = std::time::Instant::now();
    while out.is_none() {
        qp.poll(1, |d| out = Some(d));
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no completion within 60 s"
        );
    }
    out.unwrap()
}

fn fmt(ctrl: &Controller, nsid: u32) -> NsFormat {
    ctrl.namespace(nsid).unwrap().format.unwrap()
}

#[test]
#[ignore = "test bed"]
fn guest_a_every_format_is_read_as_configured() {
    // The command line first (it opens the device itself, so before this process does).
    bind_all(&[NVME_F]);
    reserve_hugepages(64);
    let mut args = vec!["identify", "--device", NVME_F];
    if mode_name() == "noiommu" {
        args.push("--noiommu");
    }
    let text = String::from_utf8(run("vfpoll", &args).stdout).unwrap();
    assert!(
        text.contains("(LBA format 1 of 8: 512 B + 8 B metadata at the end of each block)"),
        "{text}"
    );
    assert!(
        text.contains("512 B + 8 B metadata in a separate buffer"),
        "{text}"
    );
    assert!(text.contains("PI Type1 (16-bit guard, first bytes)"), "{text}");
    assert!(text.contains("(zoned, LBA format"), "{text}");
    assert!(
        text.contains(
            "zones of 256 blocks (1.0 MiB), capacity 192 blocks (768.0 KiB; zone 0's, fixed), \
             max open 4, max active 6, zone append limit 128.0 KiB"
        ),
        "{text}"
    );
    args.push("--json");
    let json = String::from_utf8(run("vfpoll", &args).stdout).unwrap();
    for want in [
        "\"metadata\": \"extended\"",
        "\"metadata\": \"separate\"",
        "\"guard_bits\": 64",
        "\"zone_size\": 256",
        "\"zone_capacity\": 192",
        "\"variable_capacity\": false",
        "\"command_set_name\": \"Zoned Namespace\"",
    ] {
        assert!(json.contains(want), "{want} in {json}");
    }

    let (f, _dma) = open_f();
    let n1 = fmt(&f, 1);
    assert_eq!(
        (n1.data_size, n1.metadata_size, n1.extended, n1.protection),
        (512, 8, true, None)
    );
    let n2 = fmt(&f, 2);
    assert_eq!(
        (n2.data_size, n2.metadata_size, n2.extended, n2.protection),
        (512, 8, false, None)
    );
    let p3 = fmt(&f, 3).protection.expect("ns 3 has PI");
    assert_eq!(
        (p3.ty, p3.format, fmt(&f, 3).extended),
        (PiType::Type1, PiFormat::Guard16, true)
    );
    let n4 = fmt(&f, 4);
    let p4 = n4.protection.expect("ns 4 has PI");
    assert_eq!((n4.data_size, n4.metadata_size, n4.extended), (4096, 64, false));
    assert_eq!((p4.ty, p4.first), (PiType::Type1, true));
    assert_eq!(fmt(&f, 5).protection.map(|p| p.format), Some(PiFormat::Guard64));
    let z = f.namespace(ZONED).unwrap();
    assert_eq!(z.command_set, zns::CSI_ZONED);
    let zi = z.zoned.expect("zoned data");
    assert_eq!(zi.identify.zone_size, ZONE_BLOCKS);
    assert_eq!(
        (zi.identify.max_open(), zi.identify.max_active()),
        (Some(4), Some(6))
    );
    assert_eq!(zi.zasl_bytes, Some(128 << 10));
}

/// One write of the plan: `blocks` blocks at `lba` of `nsid`, data and metadata from pattern
/// stream `stream`.
#[derive(Debug, Clone, Copy)]
struct Write {
    nsid: u32,
    lba: u64,
    blocks: u64,
    stream: u64,
}

const PLAN: &[Write] = &[
    Write {
        nsid: 1,
        lba: 0,
        blocks: 8,
        stream: 11,
    },
    Write {
        nsid: 1,
        lba: 1000,
        blocks: 1,
        stream: 12,
    },
    // Split: 1 MiB of data (2048 x 520 bytes) over MDTS (512 KiB), parts of whole blocks.
    Write {
        nsid: 1,
        lba: 4000,
        blocks: 2048,
        stream: 13,
    },
    Write {
        nsid: 1,
        lba: 32262,
        blocks: 1,
        stream: 14,
    },
    Write {
        nsid: 2,
        lba: 0,
        blocks: 8,
        stream: 21,
    },
    Write {
        nsid: 2,
        lba: 777,
        blocks: 64,
        stream: 22,
    },
    Write {
        nsid: 3,
        lba: 5,
        blocks: 8,
        stream: 31,
    },
    Write {
        nsid: 3,
        lba: 9000,
        blocks: 3,
        stream: 32,
    },
    Write {
        nsid: 4,
        lba: 0,
        blocks: 2,
        stream: 41,
    },
    Write {
        nsid: 4,
        lba: 3000,
        blocks: 16,
        stream: 42,
    },
];

/// Data and metadata of a plan entry as the guest writes them (metadata: every byte, the PI
/// bytes included, which the controller replaces).
fn plan_bytes(w: &Write, ds: usize, ms: usize) -> (Vec<u8>, Vec<u8>) {
    let mut p = Pattern::new(seed(), w.stream);
    (p.bytes(w.blocks as usize * ds), p.bytes(w.blocks as usize * ms))
}

/// Interleaves data and metadata into extended blocks.
fn interleave(data: &[u8], meta: &[u8], ds: usize, ms: usize) -> Vec<u8> {
    data.chunks(ds)
        .zip(meta.chunks(ms))
        .flat_map(|(d, m)| d.iter().chain(m).copied())
        .collect()
}

/// A pool buffer holding exactly `bytes` (pools have power-of-two buffers).
fn take(pool: &mut DmaPool, bytes: usize) -> DmaBuf {
    let mut b = pool.alloc().expect("a free buffer");
    b.truncate(bytes);
    b
}

/// A buffer to read into, filled with a poison byte first: a DMA that does not happen leaves
/// the poison, never the stale bytes of an earlier write through the same buffer.
fn take_for_read(pool: &mut DmaPool, bytes: usize) -> DmaBuf {
    let b = take(pool, bytes);
    pool.write(&b, 0, &vec![0xee; bytes]).unwrap();
    b
}

#[test]
#[ignore = "test bed"]
fn guest_b_data_and_metadata_land_where_described() {
    let (f, dma) = open_f();
    let _dma_back = DmaReturnCheck::new(&dma);
    let mut pool = dma.pool(2 << 20, 6, PageSize::Huge2M).unwrap();
    let mut qp = f.create_qpair::<DmaBuf>(&QpairOptions::default()).unwrap();
    for w in PLAN {
        let nf = fmt(&f, w.nsid);
        let (ds, ms) = (nf.data_size, nf.metadata_size);
        let (data, meta) = plan_bytes(w, ds, ms);
        let n = w.blocks as usize;
        match w.nsid {
            1 => {
                // Extended LBA: one buffer of data + metadata per block.
                let bytes = interleave(&data, &meta, ds, ms);
                let b = take(&mut pool, bytes.len());
                pool.write(&b, 0, &bytes).unwrap();
                qp.write(1, w.lba, b, 0).map_err(|r| r.error).unwrap();
                let d = wait(&mut qp);
                d.result.expect("extended write");
                pool.free(d.buf.unwrap());
                let b = take_for_read(&mut pool, bytes.len());
                qp.read(1, w.lba, b, 0).map_err(|r| r.error).unwrap();
                let d = wait(&mut qp);
                d.result.expect("extended read");
                let b = d.buf.unwrap();
                let mut got = vec![0u8; bytes.len()];
                pool.read(&b, 0, &mut got).unwrap();
                pool.free(b);
                assert!(got == bytes, "ns 1 LBA {}: data or metadata differ", w.lba);
            }
            2 | 4 => {
                // Separate metadata buffer; ns 4 with PI (PRACT): the first 8 bytes of each
                // block's metadata come back as the controller's protection information.
                let (b, m) = (take(&mut pool, data.len()), take(&mut pool, meta.len()));
                pool.write(&b, 0, &data).unwrap();
                pool.write(&m, 0, &meta).unwrap();
                qp.write_with_metadata(w.nsid, w.lba, b, m, 0)
                    .map_err(|r| r.error)
                    .unwrap();
                let d = wait(&mut qp);
                d.result.expect("write with metadata");
                pool.free(d.buf.unwrap());
                pool.free(d.meta.unwrap());
                let (b, m) = (
                    take_for_read(&mut pool, data.len()),
                    take_for_read(&mut pool, meta.len()),
                );
                qp.read_with_metadata(w.nsid, w.lba, b, m, 0)
                    .map_err(|r| r.error)
                    .unwrap();
                let d = wait(&mut qp);
                d.result.expect("read with metadata");
                let (b, m) = (d.buf.unwrap(), d.meta.unwrap());
                let mut got = vec![0u8; data.len()];
                let mut gotm = vec![0u8; meta.len()];
                pool.read(&b, 0, &mut got).unwrap();
                pool.read(&m, 0, &mut gotm).unwrap();
                pool.free(b);
                pool.free(m);
                assert!(got == data, "ns {} LBA {}: data differ", w.nsid, w.lba);
                for i in 0..n {
                    let pi_bytes = if nf.protection.is_some() { 8 } else { 0 };
                    assert_eq!(
                        gotm[i * ms + pi_bytes..(i + 1) * ms],
                        meta[i * ms + pi_bytes..(i + 1) * ms],
                        "ns {} LBA {}: metadata",
                        w.nsid,
                        w.lba + i as u64
                    );
                }
                if nf.protection.is_some() {
                    // The controller's PI is exactly what vfpoll computes: CRC-16 T10-DIF guard,
                    // application tag 0, the LBA as reference tag.
                    assert_eq!(pi::verify(&nf, w.lba, w.blocks, &mut got, &mut gotm), Ok(()));
                }
            }
            3 => {
                // PI only in the metadata, PRACT: buffers hold data only.
                let b = take(&mut pool, data.len());
                pool.write(&b, 0, &data).unwrap();
                qp.write(3, w.lba, b, 0).map_err(|r| r.error).unwrap();
                let d = wait(&mut qp);
                d.result.expect("PI write");
                pool.free(d.buf.unwrap());
                let b = take_for_read(&mut pool, data.len());
                qp.read(3, w.lba, b, 0).map_err(|r| r.error).unwrap();
                let d = wait(&mut qp);
                d.result.expect("PI read (guard and reference tag checked)");
                let b = d.buf.unwrap();
                let mut got = vec![0u8; data.len()];
                pool.read(&b, 0, &mut got).unwrap();
                pool.free(b);
                assert!(got == data, "ns 3 LBA {}: data differ", w.lba);
            }
            _ => unreachable!(),
        }
    }
    assert_idle(&qp, "formats");
    drop(qp);
    // Host PI on ns 3: the controller's PI read back raw verifies; a write with a bad guard
    // or reference tag is refused by the controller, with the error named.
    let host = QpairOptions {
        protection: PiMode::Host(PiCheck {
            guard: true,
            app_tag: false,
            ref_tag: true,
        }),
        ..Default::default()
    };
    let mut hq = f.create_qpair::<DmaBuf>(&host).unwrap();
    let nf = fmt(&f, 3);
    let b = take_for_read(&mut pool, 8 * 520);
    hq.read(3, 5, b, 0).map_err(|r| r.error).unwrap();
    let d = wait(&mut hq);
    d.result.expect("raw PI read");
    let b = d.buf.unwrap();
    let mut raw = vec![0u8; 8 * 520];
    pool.read(&b, 0, &mut raw).unwrap();
    pool.free(b);
    assert_eq!(
        pi::verify(&nf, 5, 8, &mut raw, &mut []),
        Ok(()),
        "QEMU's PI matches vfpoll's"
    );
    let mut blocks = Pattern::new(seed(), 99).bytes(2 * 520);
    assert!(pi::generate(&nf, 20000, 2, &mut blocks, &mut []));
    for (what, lba, corrupt, name) in [
        ("guard", 20000u64, 600usize, "End-to-end Guard Check Error"),
        (
            "reference tag",
            20001,
            usize::MAX,
            "End-to-end Reference Tag Check Error",
        ),
    ] {
        let mut bytes = blocks.clone();
        if corrupt != usize::MAX {
            bytes[corrupt] ^= 0xff;
        }
        let b = take(&mut pool, bytes.len());
        pool.write(&b, 0, &bytes).unwrap();
        hq.write(3, lba, b, 0).map_err(|r| r.error).unwrap();
        let d = wait(&mut hq);
        pool.free(d.buf.unwrap());
        let e = d.result.expect_err(what);
        assert!(e.to_string().contains(name), "{what}: {e}");
    }
    // The good PI is accepted.
    let b = take(&mut pool, blocks.len());
    pool.write(&b, 0, &blocks).unwrap();
    hq.write(3, 20000, b, 0).map_err(|r| r.error).unwrap();
    let d = wait(&mut hq);
    pool.free(d.buf.unwrap());
    d.result.expect("host PI write");
    drop(hq);

    // Refusals before submission, each naming the namespace, its format and the fix.
    let mut qp = f.create_qpair::<DmaBuf>(&QpairOptions::default()).unwrap();
    let b = take(&mut pool, 4096);
    let r = qp.write(2, 0, b, 0).unwrap_err();
    assert!(
        matches!(
            r.error,
            NvmeError::Metadata {
                nsid: 2,
                per_block: 8,
                ..
            }
        ),
        "{}",
        r.error
    );
    assert!(r.error.to_string().contains("write_with_metadata"), "{}", r.error);
    let mut b = r.buf;
    b.truncate(512);
    let r = qp.read(1, 0, b, 0).unwrap_err();
    assert!(
        matches!(r.error, NvmeError::BadLength { block_bytes: 520, .. }),
        "{}",
        r.error
    );
    let r = qp.read(5, 0, r.buf, 0).unwrap_err();
    assert!(
        matches!(r.error, NvmeError::Refused { nsid: 5, .. }),
        "{}",
        r.error
    );
    assert!(r.error.to_string().contains("64-bit guard"), "{}", r.error);
    pool.free(r.buf);
    assert_eq!(qp.stats().commands, 0, "nothing refused reached the controller");
    assert_idle(&qp, "refusals");
    drop(qp);
    assert_eq!(pool.available(), pool.capacity(), "every buffer came back");
    write_manifest("formats.txt", &[("mode".into(), mode_name().into())]);
}

#[test]
#[ignore]
fn host_check_formats_images() {
    assert_eq!(manifest_get(&read_manifest("formats.txt"), "mode"), run_mode());
    for &(nsid, file, size, ds, ms) in F_NS {
        let path = run_dir().join(file);
        let got = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(got.len() as u64, size, "{}", path.display());
        // QEMU's layout: the data of all blocks, then the metadata of all blocks.
        let nlbas = size as usize / (ds + ms);
        let moff = nlbas * ds;
        let mut want = vec![0u8; size as usize];
        for w in PLAN.iter().filter(|w| w.nsid == nsid) {
            let (data, meta) = plan_bytes(w, ds, ms);
            let lba = w.lba as usize;
            want[lba * ds..lba * ds + data.len()].copy_from_slice(&data);
            let m = &mut want[moff + lba * ms..moff + lba * ms + meta.len()];
            match nsid {
                1 | 2 => m.copy_from_slice(&meta),
                3 | 4 => {
                    // The PI the controller generated (first 8 bytes of ns 4's 64, all of ns 3's
                    // 8); the rest of ns 4's metadata as written.
                    m.copy_from_slice(&meta);
                    for i in 0..w.blocks as usize {
                        let guard = pi::crc16_t10dif(0, &data[i * ds..(i + 1) * ds]);
                        let t = &mut m[i * ms..i * ms + 8];
                        t[0..2].copy_from_slice(&guard.to_be_bytes());
                        t[2..4].copy_from_slice(&0u16.to_be_bytes());
                        t[4..8].copy_from_slice(&((w.lba + i as u64) as u32).to_be_bytes());
                    }
                }
                _ => unreachable!(),
            }
        }
        if nsid == 3 {
            // The host-PI writes: blocks 20000 and 20001 as generated by vfpoll.
            let nf = NsFormat {
                index: 1,
                count: 8,
                data_size: 512,
                metadata_size: 8,
                extended: true,
                protection: Some(vfpoll_nvme::format::Protection {
                    ty: PiType::Type1,
                    first: false,
                    format: PiFormat::Guard16,
                    storage_tag_bits: 0,
                }),
            };
            let mut blocks = Pattern::new(seed(), 99).bytes(2 * 520);
            assert!(pi::generate(&nf, 20000, 2, &mut blocks, &mut []));
            for i in 0..2 {
                let lba = 20000 + i;
                want[lba * 512..(lba + 1) * 512].copy_from_slice(&blocks[i * 520..i * 520 + 512]);
                want[moff + lba * 8..moff + lba * 8 + 8]
                    .copy_from_slice(&blocks[i * 520 + 512..(i + 1) * 520]);
            }
        }
        if got != want {
            let first = (0..got.len()).find(|&i| got[i] != want[i]).unwrap();
            let place = if first >= moff {
                format!("metadata of LBA {}", (first - moff) / ms)
            } else {
                format!("data of LBA {}", first / ds)
            };
            panic!(
                "{}: byte {first:#x} ({place}) is {:#04x}, expected {:#04x}",
                path.display(),
                got[first],
                want[first]
            );
        }
    }
}

#[test]
#[ignore = "test bed"]
fn guest_c_zoned_namespace() {
    let (f, dma) = open_f();
    let _dma_back = DmaReturnCheck::new(&dma);
    let mut pool = dma.pool(128 << 10, 4, PageSize::Huge2M).unwrap();
    let mut qp = f.create_qpair::<DmaBuf>(&QpairOptions::default()).unwrap();
    let report = |qp: &mut QueuePair<DmaBuf>, pool: &mut DmaPool, filter: ZoneFilter| {
        let b = take_for_read(pool, 64 * 17);
        qp.report_zones(ZONED, 0, filter, false, b, 0)
            .map_err(|r| r.error)
            .unwrap();
        let d = wait(qp);
        d.result.expect("report zones");
        let b = d.buf.unwrap();
        let mut v = vec![0u8; 64 * 17];
        pool.read(&b, 0, &mut v).unwrap();
        pool.free(b);
        zns::parse_report(&v, 0)
    };
    let act = |qp: &mut QueuePair<DmaBuf>, zslba: u64, a: ZoneAction, all: bool| {
        qp.zone_action(ZONED, zslba, a, all, 0).unwrap();
        wait(qp).result
    };
    act(&mut qp, 0, ZoneAction::Reset, true).expect("reset all");
    let (n, zones) = report(&mut qp, &mut pool, ZoneFilter::All);
    assert_eq!((n, zones.len()), (16, 16));
    for (i, z) in zones.iter().enumerate() {
        assert_eq!(
            (z.start, z.capacity, z.state),
            (i as u64 * ZONE_BLOCKS, ZONE_CAP, ZoneState::Empty)
        );
    }
    // Write 8 blocks at zone 0's start, then append 4: they land at LBA 8.
    let data = Pattern::new(seed(), 61).bytes(12 * 4096);
    let b = take(&mut pool, 8 * 4096);
    pool.write(&b, 0, &data[..8 * 4096]).unwrap();
    qp.write(ZONED, 0, b, 0).map_err(|r| r.error).unwrap();
    let d = wait(&mut qp);
    pool.free(d.buf.unwrap());
    d.result.expect("write at the write pointer");
    let b = take(&mut pool, 4 * 4096);
    pool.write(&b, 0, &data[8 * 4096..]).unwrap();
    qp.zone_append(ZONED, 0, b, 0).map_err(|r| r.error).unwrap();
    let d = wait(&mut qp);
    pool.free(d.buf.unwrap());
    assert_eq!(d.result.expect("append"), 8, "the append's LBA");
    // Read all 12 back.
    let b = take_for_read(&mut pool, 12 * 4096);
    qp.read(ZONED, 0, b, 0).map_err(|r| r.error).unwrap();
    let d = wait(&mut qp);
    d.result.expect("zone read");
    let b = d.buf.unwrap();
    let mut got = vec![0u8; 12 * 4096];
    pool.read(&b, 0, &mut got).unwrap();
    pool.free(b);
    assert!(got == data, "zone 0 data");
    // Writing anywhere but the write pointer is refused by the controller, by name.
    let b = take(&mut pool, 4096);
    qp.write(ZONED, 100, b, 0).map_err(|r| r.error).unwrap();
    let d = wait(&mut qp);
    pool.free(d.buf.unwrap());
    let e = d.result.unwrap_err().to_string();
    assert!(e.contains("Zone Invalid Write"), "{e}");
    // Finish zone 1, open zone 2, open then close zone 3.
    act(&mut qp, ZONE_BLOCKS, ZoneAction::Finish, false).expect("finish");
    act(&mut qp, 2 * ZONE_BLOCKS, ZoneAction::Open, false).expect("open");
    act(&mut qp, 3 * ZONE_BLOCKS, ZoneAction::Open, false).expect("open");
    act(&mut qp, 3 * ZONE_BLOCKS, ZoneAction::Close, false).expect("close");
    let (_, zones) = report(&mut qp, &mut pool, ZoneFilter::All);
    assert_eq!(zones[0].state, ZoneState::ImplicitlyOpened);
    assert_eq!(zones[0].write_pointer, 12);
    assert_eq!(zones[1].state, ZoneState::Full);
    assert_eq!(zones[2].state, ZoneState::ExplicitlyOpened);
    assert_eq!(zones[3].state, ZoneState::Closed);
    let (n, full) = report(&mut qp, &mut pool, ZoneFilter::Full);
    assert_eq!((n, full.len(), full[0].start), (1, 1, ZONE_BLOCKS));
    // A full zone takes no more data.
    let b = take(&mut pool, 4096);
    qp.zone_append(ZONED, ZONE_BLOCKS, b, 0)
        .map_err(|r| r.error)
        .unwrap();
    let d = wait(&mut qp);
    pool.free(d.buf.unwrap());
    assert!(d.result.unwrap_err().to_string().contains("Zone Is Full"));
    // Driver-side refusals: not a zone start; a zone command to an ordinary namespace; an
    // append above ZASL.
    assert!(qp.zone_action(ZONED, 5, ZoneAction::Open, false, 0).is_err());
    let e = qp.zone_action(1, 0, ZoneAction::Open, false, 0).unwrap_err();
    assert!(e.to_string().contains("not zoned"), "{e}");
    let mut big = pool.alloc().unwrap();
    big.truncate(128 << 10);
    pool.write(&big, 0, &Pattern::new(seed(), 62).bytes(128 << 10))
        .unwrap();
    let r = qp.zone_append(ZONED, 4 * ZONE_BLOCKS, big, 0);
    // 128 KiB is exactly ZASL: accepted.
    r.map_err(|r| r.error).unwrap();
    let d = wait(&mut qp);
    pool.free(d.buf.unwrap());
    assert_eq!(d.result.expect("append of ZASL bytes"), 4 * ZONE_BLOCKS);
    assert_idle(&qp, "zoned");
    drop(qp);
    assert_eq!(pool.available(), pool.capacity());
    write_manifest("zoned.txt", &[("mode".into(), mode_name().into())]);
}

#[test]
#[ignore]
fn host_check_zoned_image() {
    assert_eq!(manifest_get(&read_manifest("zoned.txt"), "mode"), run_mode());
    let path = run_dir().join("nvme-f-ns6.img");
    let got = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    // Zone 0: 8 blocks written and 4 appended; zone 4: the 128 KiB append at its start; every
    // other byte (the refused write at LBA 100, the refused append to full zone 1) untouched.
    let mut want = vec![0u8; 16 << 20];
    want[..12 * 4096].copy_from_slice(&Pattern::new(seed(), 61).bytes(12 * 4096));
    let z4 = (4 * ZONE_BLOCKS * 4096) as usize;
    want[z4..z4 + (128 << 10)].copy_from_slice(&Pattern::new(seed(), 62).bytes(128 << 10));
    assert_eq!(got.len(), want.len(), "{}", path.display());
    if let Some(first) = (0..got.len()).find(|&i| got[i] != want[i]) {
        panic!(
            "{}: byte {first:#x} (LBA {}, zone {}) is {:#04x}, expected {:#04x}",
            path.display(),
            first / 4096,
            first / 4096 / ZONE_BLOCKS as usize,
            got[first],
            want[first]
        );
    }
}

#[test]
#[ignore = "test bed"]
fn guest_d_format_changes_the_geometry_queue_pairs_use() {
    let (f, dma) = open_f();
    let _dma_back = DmaReturnCheck::new(&dma);
    let mut pool = dma.pool(4096, 4, PageSize::Huge2M).unwrap();
    let ns = f.namespace(7).unwrap();
    assert_eq!((ns.lba_size, ns.blocks), (512, 8192));
    // Not while a queue pair exists: I/O could race the format.
    let qp = f.create_qpair::<DmaBuf>(&QpairOptions::default()).unwrap();
    let e = f.format(7, 4, true).unwrap_err();
    assert!(e.to_string().contains("drop them before formatting"), "{e}");
    drop(qp);
    // 4096-byte blocks: the namespace table and new queue pairs follow.
    f.format(7, 4, true).expect("format to 4 KiB blocks");
    let ns = f.namespace(7).unwrap();
    assert_eq!((ns.lba_size, ns.blocks), (4096, 1024));
    let mut qp = f.create_qpair::<DmaBuf>(&QpairOptions::default()).unwrap();
    let r = qp.write(7, 0, take(&mut pool, 512), 0).unwrap_err();
    assert!(
        matches!(
            r.error,
            NvmeError::BadLength {
                block_bytes: 4096,
                ..
            }
        ),
        "{}",
        r.error
    );
    pool.free(r.buf);
    let b = take(&mut pool, 4096);
    pool.write(&b, 0, &[0x5a; 4096]).unwrap();
    qp.write(7, 1023, b, 0).map_err(|r| r.error).unwrap();
    let d = wait(&mut qp);
    pool.free(d.buf.unwrap());
    d.result.expect("write in the new format");
    drop(qp);
    // Extended 512 + 8 with PI type 1 in the first bytes.
    f.format_with(
        7,
        FormatOptions {
            lbaf: 1,
            extended: true,
            pi: Some(PiType::Type1),
            pi_first: true,
        },
        true,
    )
    .expect("format to 512 + 8 with PI");
    let nf = fmt(&f, 7);
    assert_eq!((nf.data_size, nf.metadata_size, nf.extended), (512, 8, true));
    assert_eq!(
        nf.protection.map(|p| (p.ty, p.first)),
        Some((PiType::Type1, true))
    );
    let mut qp = f.create_qpair::<DmaBuf>(&QpairOptions::default()).unwrap();
    // 4 MiB hold 8065 blocks of 520 bytes (QEMU keeps the metadata after the data).
    assert_eq!(f.namespace(7).unwrap().blocks, 8065);
    let b = take(&mut pool, 512);
    qp.write(7, 8064, b, 0).map_err(|r| r.error).unwrap();
    let d = wait(&mut qp);
    pool.free(d.buf.unwrap());
    d.result.expect("PRACT write after the format");
    drop(qp);
    // And back, so that a later boot of the same run dir finds what the test bed configures.
    f.format(7, 0, true).expect("format back");
    let nf = fmt(&f, 7);
    assert_eq!(
        (nf.index, nf.data_size, nf.metadata_size, nf.protection),
        (0, 512, 0, None)
    );
    assert_eq!(pool.available(), pool.capacity());
}

#[test]
#[ignore = "test bed"]
fn guest_e_format_from_the_command_line() {
    bind_all(&[NVME_F]);
    reserve_hugepages(64);
    let mut args = vec![
        "format",
        "--device",
        NVME_F,
        "--nsid",
        "7",
        "--lbaf",
        "1",
        "--metadata",
        "extended",
    ];
    if mode_name() == "noiommu" {
        args.push("--noiommu");
    }
    // Without --yes: refused, nothing erased.
    let out = std::process::Command::new("vfpoll").args(&args).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("erases every block: pass --yes"), "{err}");
    args.push("--yes");
    let text = String::from_utf8(run("vfpoll", &args).stdout).unwrap();
    assert!(
        text.contains("after:  8065 blocks, LBA format 1: 512 B + 8 B metadata at the end of each block"),
        "{text}"
    );
    // And back to plain 512-byte blocks.
    args[6] = "0";
    let text = String::from_utf8(run("vfpoll", &args).stdout).unwrap();
    assert!(
        text.contains("after:  8192 blocks, LBA format 0: 512 B"),
        "{text}"
    );
}
