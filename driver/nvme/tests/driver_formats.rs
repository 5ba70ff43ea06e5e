//! The driver against the model's namespace formats (issue 10): extended LBAs, separate
//! metadata, protection information with PRACT and from the host, refusals before submission,
//! zoned namespaces, and a queue pair that follows a namespace change announced by an
//! asynchronous event. The model's storage (data and metadata per block) is the oracle.

mod drv;

use std::time::{Duration, Instant};

use vfpoll_dma::{DmaBuf, DmaContext, DmaPool, PageSize};
use vfpoll_nvme::format::{pi, PiCheck, PiMode};
use vfpoll_nvme::zns::{self, ZoneAction, ZoneFilter, ZoneState};
use vfpoll_nvme::{Done, NvmeError, QpairOptions, QueuePair};
use vfpoll_nvme_model::{
    LbaFormat, ModelConfig, NamespaceConfig, NamespaceFormat, PiType, Protection, ZonedConfig,
};

/// Namespaces: 1 extended 512+8, 2 separate 512+8, 3 PI type 1 extended 512+8, 4 4096+64
/// separate with PI type 1 first, 5 zoned (4 KiB blocks, zones of 64, capacity 48), 6 plain
/// 512 with a 4096 format to change to. The model reaches memory through a fault log: a DMA
/// outside the driver's mappings fails the test when the rig drops.
fn bring_up() -> (drv::Rig, DmaContext) {
    let mut zoned = ZonedConfig::new(64);
    zoned.zone_capacity = 48;
    zoned.max_open = 4;
    zoned.max_active = 6;
    let cfg = ModelConfig {
        namespaces: vec![
            NamespaceConfig::new(1, 512, 2048).with_metadata(8, true),
            NamespaceConfig::new(2, 512, 2048).with_metadata(8, false),
            NamespaceConfig::new(3, 512, 2048)
                .with_metadata(8, true)
                .with_protection(Protection::last(PiType::Type1)),
            NamespaceConfig::new(4, 4096, 256)
                .with_metadata(64, false)
                .with_protection(Protection {
                    pi_type: PiType::Type1,
                    first: true,
                }),
            NamespaceConfig::new(5, 4096, 64 * 8).zoned(zoned),
            NamespaceConfig::new(6, 512, 2048)
                .with_formats(vec![LbaFormat::new(512, 0), LbaFormat::new(4096, 0)]),
        ],
        zasl: 3,
        idle_spin: Duration::from_millis(200),
        ..Default::default()
    };
    let rig = drv::rig(cfg);
    let dma = rig.ctrl.dma().clone();
    (rig, dma)
}

/// `bring_up`, a pool of `buffers` 4 KiB buffers and a queue pair with the default options.
fn bring_up_qp(buffers: usize) -> (drv::Rig, DmaPool, QueuePair<DmaBuf>) {
    let (rig, dma) = bring_up();
    let pool = dma.pool(4096, buffers, PageSize::Base4K).unwrap();
    let qp = rig.ctrl.create_qpair::<DmaBuf>(&QpairOptions::default()).unwrap();
    (rig, pool, qp)
}

fn wait(qp: &mut QueuePair<DmaBuf>) -> Done<DmaBuf> {
    let mut out = None;
    let start = Instant::now();
    while out.is_none() {
        qp.poll(1, |d| out = Some(d));
        assert!(start.elapsed() < Duration::from_secs(10), "no completion");
    }
    out.unwrap()
}

fn take(pool: &mut DmaPool, len: usize) -> DmaBuf {
    let mut b = pool.alloc().expect("a free buffer");
    b.truncate(len);
    b
}

/// A buffer to read into, poisoned first so a DMA that does not happen cannot pass for one.
fn take_for_read(pool: &mut DmaPool, len: usize) -> DmaBuf {
    let b = take(pool, len);
    pool.write(&b, 0, &vec![0xee; len]).unwrap();
    b
}

/// Writes `data` to `slba` of `nsid` through `qp` and waits for the write to succeed.
fn write_ok(qp: &mut QueuePair<DmaBuf>, pool: &mut DmaPool, nsid: u32, slba: u64, data: &[u8]) {
    let b = take(pool, data.len());
    pool.write(&b, 0, data).unwrap();
    qp.write(nsid, slba, b, 0).map_err(|r| r.error).unwrap();
    let d = wait(qp);
    d.result.unwrap();
    pool.free(d.buf.unwrap());
}

/// Writes `data` and its separate metadata `meta` to `slba` of `nsid` and waits for success.
fn write_md_ok(
    qp: &mut QueuePair<DmaBuf>,
    pool: &mut DmaPool,
    nsid: u32,
    slba: u64,
    data: &[u8],
    meta: &[u8],
) {
    let (b, m) = (take(pool, data.len()), take(pool, meta.len()));
    pool.write(&b, 0, data).unwrap();
    pool.write(&m, 0, meta).unwrap();
    qp.write_with_metadata(nsid, slba, b, m, 0)
        .map_err(|r| r.error)
        .unwrap();
    let d = wait(qp);
    d.result.unwrap();
    pool.free(d.buf.unwrap());
    pool.free(d.meta.unwrap());
}

fn bytes(n: usize, salt: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31) ^ salt).collect()
}

#[test]
fn extended_and_separate_metadata_land_in_the_model_as_described() {
    let (rig, mut pool, mut qp) = bring_up_qp(8);
    let (model, ctrl) = (&rig.model, &rig.ctrl);
    // Extended: 7 blocks of 520 bytes in one buffer.
    let ext = bytes(7 * 520, 1);
    write_ok(&mut qp, &mut pool, 1, 100, &ext);
    let data = model.read_ns(1, 100, 7).unwrap();
    let meta = model.read_ns_meta(1, 100, 7).unwrap();
    for i in 0..7 {
        assert_eq!(
            data[i * 512..(i + 1) * 512],
            ext[i * 520..i * 520 + 512],
            "block {i} data"
        );
        assert_eq!(
            meta[i * 8..(i + 1) * 8],
            ext[i * 520 + 512..(i + 1) * 520],
            "block {i} metadata"
        );
    }
    // Separate: data and metadata buffers; read back through both.
    let (dd, mm) = (bytes(8 * 512, 2), bytes(64, 3));
    write_md_ok(&mut qp, &mut pool, 2, 8, &dd, &mm);
    assert_eq!(model.read_ns(2, 8, 8).unwrap(), dd);
    assert_eq!(model.read_ns_meta(2, 8, 8).unwrap(), mm);
    let (b, m) = (
        take_for_read(&mut pool, dd.len()),
        take_for_read(&mut pool, mm.len()),
    );
    qp.read_with_metadata(2, 8, b, m, 0).map_err(|r| r.error).unwrap();
    let d = wait(&mut qp);
    d.result.unwrap();
    let (b, m) = (d.buf.unwrap(), d.meta.unwrap());
    let mut got = vec![0u8; dd.len()];
    let mut gotm = vec![0u8; mm.len()];
    pool.read(&b, 0, &mut got).unwrap();
    pool.read(&m, 0, &mut gotm).unwrap();
    pool.free(b);
    pool.free(m);
    assert_eq!((got, gotm), (dd, mm));
    // With a 4 KiB maximum transfer, 7 blocks of 520 bytes are one command (splits into whole
    // blocks are unit-tested in vfpoll-nvme and run against QEMU in the test bed).
    let mut small = ctrl
        .create_qpair::<DmaBuf>(&QpairOptions {
            max_transfer: Some(4096),
            ..Default::default()
        })
        .unwrap();
    let ext = bytes(7 * 520, 4);
    write_ok(&mut small, &mut pool, 1, 500, &ext);
    assert_eq!(small.stats().commands, 1, "3640 bytes fit one 4 KiB command");
    assert_eq!(model.read_ns(1, 500, 1).unwrap(), ext[..512]);
    assert_eq!(pool.available(), pool.capacity());
}

#[test]
fn protection_information_by_the_controller_and_by_the_host() {
    let (rig, mut pool, mut qp) = bring_up_qp(8);
    let (model, ctrl) = (&rig.model, &rig.ctrl);
    // PRACT, PI alone in the metadata: buffers hold data only; the model stores the PI.
    let dd = bytes(4 * 512, 6);
    write_ok(&mut qp, &mut pool, 3, 40, &dd);
    let fmt3 = ctrl.namespace(3).unwrap().format.unwrap();
    let mut stored = Vec::new();
    let (data, meta) = (
        model.read_ns(3, 40, 4).unwrap(),
        model.read_ns_meta(3, 40, 4).unwrap(),
    );
    for i in 0..4 {
        stored.extend_from_slice(&data[i * 512..(i + 1) * 512]);
        stored.extend_from_slice(&meta[i * 8..(i + 1) * 8]);
    }
    assert_eq!(
        pi::verify(&fmt3, 40, 4, &mut stored, &mut []),
        Ok(()),
        "the model's PI is vfpoll's"
    );
    // PRACT with 64 bytes of metadata: it moves, the first 8 bytes are the controller's.
    let fmt4 = ctrl.namespace(4).unwrap().format.unwrap();
    let (dd, mm) = (bytes(4096, 7), bytes(64, 8));
    write_md_ok(&mut qp, &mut pool, 4, 9, &dd, &mm);
    let mut sm = model.read_ns_meta(4, 9, 1).unwrap();
    assert_eq!(sm[8..], mm[8..], "the host's metadata after the PI");
    assert_eq!(pi::verify(&fmt4, 9, 1, &mut dd.clone(), &mut sm), Ok(()));
    // Host PI: generated by vfpoll, checked by the controller; a bad guard is named.
    let host = QpairOptions {
        protection: PiMode::Host(PiCheck {
            guard: true,
            app_tag: false,
            ref_tag: true,
        }),
        ..Default::default()
    };
    let mut hq = ctrl.create_qpair::<DmaBuf>(&host).unwrap();
    let mut blocks = bytes(3 * 520, 9);
    assert!(pi::generate(&fmt3, 77, 3, &mut blocks, &mut []));
    let b = take(&mut pool, blocks.len());
    pool.write(&b, 0, &blocks).unwrap();
    hq.write(3, 77, b, 0).map_err(|r| r.error).unwrap();
    let d = wait(&mut hq);
    pool.free(d.buf.unwrap());
    d.result.expect("valid host PI");
    blocks[5] ^= 1;
    let b = take(&mut pool, blocks.len());
    pool.write(&b, 0, &blocks).unwrap();
    hq.write(3, 77, b, 0).map_err(|r| r.error).unwrap();
    let d = wait(&mut hq);
    pool.free(d.buf.unwrap());
    let e = d.result.unwrap_err().to_string();
    assert!(e.contains("End-to-end Guard Check Error"), "{e}");
    assert_eq!(pool.available(), pool.capacity());
}

#[test]
fn unusable_combinations_are_refused_before_submission() {
    let (rig, mut pool, mut qp) = bring_up_qp(4);
    let model = &rig.model;
    let before = model.stats().io_commands(0x01) + model.stats().io_commands(0x02);
    // No metadata buffer for a separate-metadata namespace.
    let r = qp.write(2, 0, take(&mut pool, 512), 0).unwrap_err();
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
    let b = r.buf;
    // A metadata buffer of the wrong size.
    let r = qp
        .write_with_metadata(2, 0, b, take(&mut pool, 16), 0)
        .unwrap_err();
    assert!(
        r.error.to_string().contains("so 8 bytes of metadata"),
        "{}",
        r.error
    );
    let (b, m) = r.buf;
    pool.free(m);
    // A length that is not a whole number of 520-byte blocks.
    let r = qp.read(1, 0, b, 0).unwrap_err();
    assert!(
        matches!(r.error, NvmeError::BadLength { block_bytes: 520, .. }),
        "{}",
        r.error
    );
    // A metadata buffer where none moves.
    let r = qp
        .read_with_metadata(6, 0, r.buf, take(&mut pool, 8), 0)
        .unwrap_err();
    assert!(r.error.to_string().contains("moves no metadata"), "{}", r.error);
    pool.free(r.buf.0);
    pool.free(r.buf.1);
    let after = model.stats().io_commands(0x01) + model.stats().io_commands(0x02);
    assert_eq!(before, after, "nothing refused reached the controller");
    assert_eq!(pool.available(), pool.capacity());
}

#[test]
fn zoned_namespace_report_actions_and_append() {
    let (rig, dma) = bring_up();
    let (model, ctrl) = (&rig.model, &rig.ctrl);
    let z = ctrl.namespace(5).unwrap().zoned.expect("zoned");
    assert_eq!(
        (z.identify.zone_size, z.identify.max_open(), z.zasl_bytes),
        (64, Some(4), Some(32768))
    );
    let mut pool = dma.pool(4096, 4, PageSize::Base4K).unwrap();
    let mut qp = ctrl.create_qpair::<DmaBuf>(&QpairOptions::default()).unwrap();
    let b = take(&mut pool, 4096);
    pool.write(&b, 0, &bytes(4096, 10)).unwrap();
    qp.zone_append(5, 64, b, 0).map_err(|r| r.error).unwrap();
    let d = wait(&mut qp);
    pool.free(d.buf.unwrap());
    assert_eq!(d.result.unwrap(), 64);
    let b = take(&mut pool, 4096);
    qp.zone_append(5, 64, b, 0).map_err(|r| r.error).unwrap();
    let d = wait(&mut qp);
    pool.free(d.buf.unwrap());
    assert_eq!(d.result.unwrap(), 65, "appends land at the write pointer");
    assert_eq!(model.read_ns(5, 64, 1).unwrap(), bytes(4096, 10));
    qp.zone_action(5, 128, ZoneAction::Finish, false, 0).unwrap();
    wait(&mut qp).result.unwrap();
    let b = take_for_read(&mut pool, 64 * 9);
    qp.report_zones(5, 0, ZoneFilter::All, false, b, 0)
        .map_err(|r| r.error)
        .unwrap();
    let d = wait(&mut qp);
    d.result.unwrap();
    let b = d.buf.unwrap();
    let mut rep = vec![0u8; 64 * 9];
    pool.read(&b, 0, &mut rep).unwrap();
    pool.free(b);
    let (n, zones) = zns::parse_report(&rep, 0);
    assert_eq!((n, zones.len()), (8, 8));
    assert_eq!(
        (zones[1].state, zones[1].write_pointer, zones[1].capacity),
        (ZoneState::ImplicitlyOpened, 66, 48)
    );
    assert_eq!(zones[2].state, ZoneState::Full);
    // Write not at the write pointer: the controller's named error.
    let b = take(&mut pool, 4096);
    qp.write(5, 70, b, 0).map_err(|r| r.error).unwrap();
    let d = wait(&mut qp);
    pool.free(d.buf.unwrap());
    assert!(d.result.unwrap_err().to_string().contains("Zone Invalid Write"));
    // Driver refusals.
    assert!(qp
        .zone_action(5, 3, ZoneAction::Reset, false, 0)
        .unwrap_err()
        .to_string()
        .contains("not the start of a zone"));
    assert!(qp
        .zone_action(1, 0, ZoneAction::Reset, false, 0)
        .unwrap_err()
        .to_string()
        .contains("not zoned"));
    qp.zone_action(5, 0, ZoneAction::Reset, true, 0).unwrap();
    wait(&mut qp).result.unwrap();
    assert!(model
        .zones(5)
        .unwrap()
        .iter()
        .all(|z| z.state == vfpoll_nvme_model::ZoneState::Empty));
    assert_eq!(pool.available(), pool.capacity());
}

#[test]
fn a_live_queue_pair_follows_a_namespace_change_announced_by_an_event() {
    let (rig, mut pool, mut qp) = bring_up_qp(4);
    let (model, ctrl) = (&rig.model, &rig.ctrl);
    let b = take(&mut pool, 512);
    qp.write(6, 0, b, 0).map_err(|r| r.error).unwrap();
    let d = wait(&mut qp);
    d.result.unwrap();
    pool.free(d.buf.unwrap());
    // Another host reformats namespace 6 to 4 KiB blocks: the controller announces it.
    model.change_namespace(6, NamespaceFormat::new(1)).unwrap();
    let start = Instant::now();
    while ctrl.process_events().unwrap() == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no Namespace Attribute Changed event"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(ctrl.namespace(6).unwrap().lba_size, 4096);
    // The queue pair made before the change now sizes commands by the new format.
    let r = qp.write(6, 0, take(&mut pool, 512), 0).unwrap_err();
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
    qp.write(6, 3, b, 0).map_err(|r| r.error).unwrap();
    let d = wait(&mut qp);
    d.result.expect("a write in the new format");
    pool.free(d.buf.unwrap());
    // The event is re-armed: a second change is seen too.
    model.change_namespace(6, NamespaceFormat::new(0)).unwrap();
    let start = Instant::now();
    while ctrl.process_events().unwrap() == 0 {
        assert!(start.elapsed() < Duration::from_secs(10), "no second event");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(ctrl.namespace(6).unwrap().lba_size, 512);
    assert_eq!(pool.available(), pool.capacity());
}
