//! NVMe driver tests in the test bed (issue 3): bring-up and Identify against QEMU's controller,
//! data integrity checked by the guest and then by the host on the namespace image files,
//! several namespaces and controllers at once, admin commands, and errors that leave the
//! controller usable.

use std::time::Duration;

use vfpoll_dma::{DmaContext, PageSize};
use vfpoll_nvme::cmd::{io_op, Command};
use vfpoll_nvme::{Controller, ControllerOptions, Done, NvmeError, QpairOptions, QueuePair, RegionBuf};
use vfpoll_pci::vfio::Container;
use vfpoll_tests::*;

const MIB: usize = 1 << 20;

/// Both controllers, opened in one container.
fn open_both() -> (Controller, Controller, DmaContext) {
    bind_all(&[NVME_A, NVME_B]);
    reserve_hugepages(192);
    let c = Container::open(mode()).expect("container");
    let (a, dma) =
        Controller::open_first(&c, bdf(NVME_A), ControllerOptions::default()).expect("controller A");
    let b =
        Controller::open(&c, bdf(NVME_B), dma.clone(), ControllerOptions::default()).expect("controller B");
    assert_backend(&c);
    (a, b, dma)
}

/// Runs one request to completion and returns its result and buffer.
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

#[test]
#[ignore = "test bed"]
fn guest_identify_matches_the_qemu_configuration() {
    let (a, b, _dma) = open_both();
    let id = a.identify();
    println!(
        "A: {id:?}\n   namespaces {:?}",
        a.namespaces()
            .iter()
            .map(|n| (n.nsid, n.lba_size, n.blocks))
            .collect::<Vec<_>>()
    );
    assert_eq!(id.serial, "vfpoll-a");
    assert_eq!(id.model, "QEMU NVMe Ctrl");
    assert!(!id.firmware.is_empty());
    assert_eq!(id.vid, 0x1b36);
    assert_eq!(a.mdts_bytes(), Some(512 * 1024));
    let ns: Vec<_> = a
        .namespaces()
        .iter()
        .map(|n| (n.nsid, n.lba_size, n.blocks))
        .collect();
    assert_eq!(
        ns,
        vec![
            (1, 512, (64 * MIB / 512) as u64),
            (2, 4096, (32 * MIB / 4096) as u64)
        ]
    );
    assert_eq!(b.identify().serial, "vfpoll-b");
    assert_eq!(b.mdts_bytes(), Some(4 * MIB));
    assert_eq!(b.namespaces().len(), 1);
    assert_eq!(a.version().to_string(), "1.4.0");
    assert!(a.io_queues_granted() >= 1);
    // Unknown namespace.
    let e = a.namespace(9).unwrap_err();
    assert!(
        e.to_string().contains("namespace 9 does not exist") && e.to_string().contains("[1, 2]"),
        "{e}"
    );
}

#[test]
#[ignore = "test bed"]
fn guest_admin_commands() {
    let (a, b, _dma) = open_both();
    let smart = a.smart_log().expect("SMART log");
    assert!(smart.temperature_k > 200, "{smart:?}");
    a.error_log().expect("error log");
    // Volatile write cache: QEMU has one; toggle it and read it back.
    assert!(a.identify().has_volatile_write_cache());
    a.set_volatile_write_cache(false).unwrap();
    assert_eq!(
        a.get_feature(vfpoll_nvme::cmd::feature::VOLATILE_WRITE_CACHE)
            .unwrap()
            & 1,
        0
    );
    a.set_volatile_write_cache(true).unwrap();
    assert_eq!(
        a.get_feature(vfpoll_nvme::cmd::feature::VOLATILE_WRITE_CACHE)
            .unwrap()
            & 1,
        1
    );
    // Raw passthrough: Identify controller again, compare the serial.
    // SAFETY: Identify Controller moves exactly the 4096 bytes asked for and names no memory.
    let (_, page) = unsafe {
        a.admin_raw(
            Command::identify(1, 0),
            vfpoll_nvme::admin::DataDir::FromDevice(4096),
            &[],
        )
    }
    .unwrap();
    assert_eq!(&page[4..12], b"vfpoll-a");
    // An unknown admin opcode is a typed, named error, and the queue stays usable.
    // SAFETY: an opcode the controller does not know moves nothing.
    let e =
        unsafe { a.admin_raw(Command::new(0xfe, 0), vfpoll_nvme::admin::DataDir::None, &[]) }.unwrap_err();
    assert!(e.to_string().contains("Invalid Command Opcode"), "{e}");
    a.smart_log().expect("admin queue usable after an error");
    // Format NVM only with the explicit guard; then it zeroes B's namespace (checked below by
    // the data test's host oracle, which expects a fresh image).
    assert!(matches!(b.format(1, 0, false), Err(NvmeError::Unconfirmed(_))));
    b.format(1, 0, true).expect("format B ns 1");
    // Abort of a command id that is not in flight: the controller answers, nothing breaks.
    let _ = a.abort(0, 0xfff0).expect("abort answered");
}

/// One operation of the data-integrity plan.
#[derive(Debug, Clone, Copy)]
enum Op {
    Write {
        lba: u64,
        len: usize,
        stream: u64,
        buf_off: usize,
    },
    Zeroes {
        lba: u64,
        blocks: u32,
    },
    Dealloc {
        lba: u64,
        blocks: u32,
    },
}

/// A namespace of the plan: (controller index 0 = A / 1 = B, nsid, LBA size, blocks, image).
const TARGETS: [(usize, u32, usize, u64, &str); 3] = [
    (0, 1, 512, (64 * MIB / 512) as u64, "nvme-a-ns1.img"),
    (0, 2, 4096, (32 * MIB / 4096) as u64, "nvme-a-ns2.img"),
    (1, 1, 512, (64 * MIB / 512) as u64, "nvme-b-ns1.img"),
];

/// The first blocks of every namespace are left to `guest_errors_*`, which zeroes them when done.
const RESERVED_LBAS: u64 = 1024;

/// The deterministic plan for one target: writes of varied sizes (crossing pages, PRP-list and
/// MDTS boundaries), write zeroes and deallocations, in batches of non-overlapping operations.
fn plan(seed: u64, t: usize) -> Vec<Vec<Op>> {
    let (_, _, lba, blocks, _) = TARGETS[t];
    let mut r = Pattern::new(seed, 100 + t as u64);
    let sizes = [
        512,
        4096,
        4608,
        8192,
        12288,
        65536,
        131584,
        512 * 1024,
        528384,
        MIB,
        3 * MIB + 512,
        4 * MIB,
        6 * MIB,
    ];
    let offsets = [0usize, 512, 2052, 4096 - 512, 4096];
    let mut batches = Vec::new();
    for b in 0..6 {
        let mut batch: Vec<Op> = Vec::new();
        let mut used: Vec<(u64, u64)> = Vec::new();
        for i in 0..8 {
            let n = r.next_u64();
            let len = sizes[(n % sizes.len() as u64) as usize].next_multiple_of(lba);
            let nblk = (len / lba) as u64;
            // LBAs below RESERVED_LBAS belong to the error test.
            let at = (RESERVED_LBAS + r.next_u64() % (blocks - nblk - RESERVED_LBAS)) & !7;
            let op = match (b, i % 4) {
                (4.., 3) => Op::Zeroes {
                    lba: at,
                    blocks: (nblk.min(65536) as u32).max(8) & !7,
                },
                (4.., 2) => Op::Dealloc {
                    lba: at,
                    blocks: (nblk.min(65536) as u32).max(8) & !7,
                },
                _ => Op::Write {
                    lba: at,
                    len,
                    stream: n,
                    buf_off: offsets[(n >> 8) as usize % offsets.len()],
                },
            };
            let (s, e) = match op {
                Op::Write { lba, len, .. } => (lba, lba + (len / TARGETS[t].2) as u64),
                Op::Zeroes { lba, blocks } | Op::Dealloc { lba, blocks } => (lba, lba + blocks as u64),
            };
            if used.iter().all(|&(us, ue)| e <= us || s >= ue) {
                used.push((s, e));
                batch.push(op);
            }
        }
        batches.push(batch);
    }
    batches
}

/// The namespace content the plan leaves (the image starts zeroed).
fn expected_image(seed: u64, t: usize) -> Vec<u8> {
    let (_, _, lba, blocks, _) = TARGETS[t];
    let mut img = vec![0u8; lba * blocks as usize];
    for batch in plan(seed, t) {
        for op in batch {
            match op {
                Op::Write {
                    lba: at, len, stream, ..
                } => {
                    let o = at as usize * lba;
                    img[o..o + len].copy_from_slice(&Pattern::new(seed, stream).bytes(len));
                }
                Op::Zeroes { lba: at, blocks } | Op::Dealloc { lba: at, blocks } => {
                    let o = at as usize * lba;
                    img[o..o + blocks as usize * lba].fill(0);
                }
            }
        }
    }
    img
}

/// Runs the plan for target `t` on `qp`, each batch with all its commands in flight at once,
/// then reads the whole namespace back and compares it with the expected image.
fn run_plan(t: usize, qp: &mut QueuePair<RegionBuf>, dma: &DmaContext, seed: u64) {
    let (_, nsid, lba, blocks, name) = TARGETS[t];
    let mut tag = 0;
    for batch in plan(seed, t) {
        let mut inflight = 0;
        for op in &batch {
            tag += 1;
            match *op {
                Op::Write {
                    lba: at,
                    len,
                    stream,
                    buf_off,
                } => {
                    let mut region = dma.alloc_region(buf_off + len, PageSize::Huge2M).expect("region");
                    region
                        .write(buf_off, &Pattern::new(seed, stream).bytes(len))
                        .unwrap();
                    let buf = RegionBuf::new(region, buf_off, len).unwrap();
                    qp.write(nsid, at, buf, tag)
                        .map_err(|r| r.error)
                        .expect("submit write");
                }
                Op::Zeroes { lba: at, blocks } => qp
                    .write_zeroes(nsid, at, blocks, tag)
                    .expect("submit write zeroes"),
                Op::Dealloc { lba: at, blocks } => qp
                    .deallocate(nsid, &[(at, blocks)], tag)
                    .expect("submit deallocate"),
            }
            inflight += 1;
        }
        while inflight > 0 {
            qp.poll(64, |d| {
                d.result
                    .unwrap_or_else(|e| panic!("{name}: request {} failed: {e}", d.tag));
                inflight -= 1;
            });
        }
    }
    tag += 1;
    qp.flush(nsid, tag).unwrap();
    assert!(wait(qp).result.is_ok(), "flush");
    // Read everything back in 8 MiB chunks and compare.
    let want = expected_image(seed, t);
    let total = lba * blocks as usize;
    let chunk = 8 * MIB;
    let mut back = RegionBuf::new(dma.alloc_region(chunk, PageSize::Huge2M).unwrap(), 0, chunk).unwrap();
    let mut got = vec![0u8; chunk];
    for off in (0..total).step_by(chunk) {
        let n = chunk.min(total - off);
        // The first `n` bytes go to the device; the rest (none but for the last chunk) stays.
        let (head, rest) = back.split_at(n);
        qp.read(nsid, (off / lba) as u64, head, 0)
            .map_err(|r| r.error)
            .unwrap();
        let d = wait(qp);
        d.result.expect("read back");
        let head = d.buf.expect("the read's buffer comes back");
        head.read(0, &mut got[..n]).unwrap();
        back = head.join(rest).expect("the two pieces of one region");
        if got[..n] != want[off..off + n] {
            let first = (0..n).find(|&i| got[i] != want[off + i]).unwrap();
            panic!(
                "{name}: byte {:#x} reads {:#04x}, expected {:#04x}",
                off + first,
                got[first],
                want[off + first]
            );
        }
    }
    assert_idle(qp, name);
}

#[test]
#[ignore = "test bed"]
fn guest_data_integrity_two_controllers_three_namespaces() {
    let (a, b, dma) = open_both();
    let _dma_back = DmaReturnCheck::new(&dma);
    let seed = seed();
    // One thread per controller, both at once; A's thread drives its two namespaces, the first
    // with PRPs and the second with SGLs.
    std::thread::scope(|s| {
        let (a, b, dma_a, dma_b) = (&a, &b, dma.clone(), dma.clone());
        let ta = s.spawn(move || {
            let mut prp = a
                .create_qpair::<RegionBuf>(&QpairOptions::default())
                .expect("qpair");
            run_plan(0, &mut prp, &dma_a, seed);
            let mut sgl = a
                .create_qpair::<RegionBuf>(&QpairOptions {
                    sgl: true,
                    ..Default::default()
                })
                .expect("qpair");
            run_plan(1, &mut sgl, &dma_a, seed);
            (prp.stats(), sgl.stats())
        });
        let tb = s.spawn(move || {
            let mut qp = b
                .create_qpair::<RegionBuf>(&QpairOptions::default())
                .expect("qpair");
            assert_eq!(qp.max_transfer(), 4 * MIB, "B's MDTS: PRP lists chain");
            run_plan(2, &mut qp, &dma_b, seed);
            qp.stats()
        });
        let (sa, sb) = (ta.join().expect("thread A"), tb.join().expect("thread B"));
        println!("A ns1 {:?}\nA ns2 {:?}\nB ns1 {sb:?}", sa.0, sa.1);
        assert!(a.shadow_doorbells(), "QEMU offers Doorbell Buffer Config");
        assert!(sa.0.commands > sa.0.requests, "large requests were split at MDTS");
        assert!(sa.0.sq_doorbells < sa.0.commands, "doorbells are rung per batch");
    });
    write_manifest("nvme.txt", &[("mode".into(), mode_name().into())]);
}

#[test]
#[ignore = "test bed"]
fn host_check_data_integrity_two_controllers_three_namespaces() {
    let m = read_manifest("nvme.txt");
    assert_eq!(manifest_get(&m, "mode"), run_mode());
    for (t, target) in TARGETS.iter().enumerate() {
        let want = expected_image(seed(), t);
        let path = run_dir().join(target.4);
        let got = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(got.len(), want.len(), "{}", path.display());
        if got != want {
            let first = (0..got.len()).find(|&i| got[i] != want[i]).unwrap();
            panic!(
                "{}: byte {first:#x} is {:#04x}, expected {:#04x}",
                path.display(),
                got[first],
                want[first]
            );
        }
    }
}

#[test]
#[ignore = "test bed"]
fn guest_errors_are_clear_and_leave_the_controller_usable() {
    let (a, _b, dma) = open_both();
    let _dma_back = DmaReturnCheck::new(&dma);
    // A fresh buffer each time: one region's bytes cannot be in two buffers.
    let buf = |off: usize, len: usize| {
        RegionBuf::new(dma.alloc_region(off + len, PageSize::Huge2M).unwrap(), off, len).unwrap()
    };
    let mut qp = a
        .create_qpair::<RegionBuf>(&QpairOptions {
            entries: 4,
            split: false,
            ..Default::default()
        })
        .unwrap();
    let blocks = a.namespace(1).unwrap().blocks;
    let works = |qp: &mut QueuePair<RegionBuf>| {
        qp.write(1, 8, buf(0, 4096), 1).map_err(|r| r.error).unwrap();
        wait(qp).result.expect("the controller is still usable");
    };

    // Checked by the driver before anything reaches the device.
    let e = qp.read(1, blocks - 4, buf(0, 4096), 0).unwrap_err().error;
    assert!(
        matches!(e, NvmeError::LbaOutOfRange { .. }) && e.to_string().contains("outside namespace 1"),
        "{e}"
    );
    let e = qp.read(7, 0, buf(0, 4096), 0).unwrap_err().error;
    assert!(e.to_string().contains("namespace 7 does not exist"), "{e}");
    let e = qp.read(1, 0, buf(0, MIB), 0).unwrap_err().error;
    assert!(
        matches!(e, NvmeError::TooLarge { .. }) && e.to_string().contains("maximum data transfer size"),
        "{e}"
    );
    let e = qp.read(1, 0, buf(2, 4096), 0).unwrap_err().error;
    assert!(e.to_string().contains("not 4-byte aligned"), "{e}");
    let e = qp.read(1, 0, buf(0, 1000), 0).unwrap_err().error;
    assert!(
        e.to_string()
            .contains("not a non-zero multiple of the 512 bytes per block"),
        "{e}"
    );
    works(&mut qp);

    // Queue full: 4 entries hold 3 commands.
    for i in 0..3 {
        qp.read(1, i * 8, buf(i as usize * 4096, 4096), i)
            .map_err(|r| r.error)
            .unwrap();
    }
    let e = qp.read(1, 64, buf(65536, 4096), 9).unwrap_err().error;
    assert!(
        matches!(e, NvmeError::QueueFull { .. }) && e.to_string().contains("poll"),
        "{e}"
    );
    let done = qp
        .drain(Duration::from_secs(30), |d| assert!(d.result.is_ok()))
        .unwrap();
    assert_eq!(done, 3);
    works(&mut qp);

    // What the device itself says, through raw passthrough: typed, named statuses.
    let mut cmd = Command::rw(io_op::READ, 1, blocks, 8);
    // SAFETY: the command reads 8 blocks of 512 bytes, exactly the 4 KiB buffer.
    unsafe { qp.submit_raw(cmd, Some(buf(0, 4096)), 1) }
        .map_err(|r| r.error)
        .unwrap();
    let e = wait(&mut qp).result.unwrap_err();
    assert!(e.to_string().contains("LBA Out of Range"), "{e}");
    // An inactive NSID (at most NN) is "Invalid Field in Command", one above NN "Invalid
    // Namespace or Format" (NVMe Base 2.0 §3.2.1.2, Figure 95).
    for (nsid, name) in [
        (7, "Invalid Field in Command"),
        (0x1000, "Invalid Namespace or Format"),
    ] {
        cmd = Command::rw(io_op::READ, nsid, 0, 8);
        // SAFETY: as above.
        unsafe { qp.submit_raw(cmd, Some(buf(0, 4096)), 2) }
            .map_err(|r| r.error)
            .unwrap();
        let e = wait(&mut qp).result.unwrap_err();
        assert!(e.to_string().contains(name), "nsid {nsid}: {e}");
    }
    // Compare: equal data succeeds, different data is a Compare Failure.
    let mut r2 = buf(0, 4096);
    r2.write(0, &[0x5a; 4096]).unwrap();
    qp.write(1, 100, r2, 3).map_err(|r| r.error).unwrap();
    let d = wait(&mut qp);
    d.result.unwrap();
    let r2 = d.buf.expect("the write's buffer comes back");
    qp.compare(1, 100, r2, 4).map_err(|r| r.error).unwrap();
    let d = wait(&mut qp);
    d.result.expect("compare equal");
    let r2 = d.buf.expect("the compare's buffer comes back");
    qp.compare(1, 108, r2, 5).map_err(|r| r.error).unwrap();
    let e = wait(&mut qp).result.unwrap_err();
    assert!(e.to_string().contains("Compare Failure"), "{e}");
    works(&mut qp);
    assert_eq!(qp.stats().bogus_completions, 0);
    // Leave the reserved blocks zeroed, as the data test's host oracle expects.
    qp.write_zeroes(1, 0, RESERVED_LBAS as u32, 6).unwrap();
    wait(&mut qp).result.expect("write zeroes");
    assert_idle(&qp, "errors");
}

#[test]
#[ignore = "test bed"]
fn guest_submission_queue_in_the_cmb() {
    let (a, b, dma) = open_both();
    let _dma_back = DmaReturnCheck::new(&dma);
    let cmb = a.cmb().expect("controller A's 16 MiB CMB");
    assert_eq!(cmb.len(), 16 * MIB);
    assert!(cmb.capabilities().sqs());
    assert_eq!(b.cmb().expect("controller B's CMB").len(), 16 * MIB);
    let mut qp = a
        .create_qpair::<RegionBuf>(&QpairOptions {
            sq_in_cmb: true,
            ..Default::default()
        })
        .expect("CMB qpair");
    let mut r = RegionBuf::new(
        dma.alloc_region(64 * 1024, PageSize::Huge2M).unwrap(),
        0,
        64 * 1024,
    )
    .unwrap();
    let data = Pattern::new(seed(), 7).bytes(64 * 1024);
    r.write(0, &data).unwrap();
    // Several commands in flight at once, through the CMB queue, each with its own 8 KiB piece.
    for i in 0..8u64 {
        let rest = r.split_off(8192);
        qp.write(2, i * 2, std::mem::replace(&mut r, rest), i)
            .map_err(|r| r.error)
            .unwrap();
    }
    qp.drain(Duration::from_secs(30), |d| {
        d.result.expect("write via CMB SQ");
    })
    .unwrap();
    let back = RegionBuf::new(
        dma.alloc_region(64 * 1024, PageSize::Huge2M).unwrap(),
        0,
        64 * 1024,
    )
    .unwrap();
    qp.read(2, 0, back, 9).map_err(|r| r.error).unwrap();
    let d = wait(&mut qp);
    d.result.expect("read via CMB SQ");
    let back = d.buf.expect("the read's buffer comes back");
    let mut got = vec![0u8; 64 * 1024];
    back.read(0, &mut got).unwrap();
    assert!(
        got == data,
        "data written and read through a CMB submission queue differ"
    );
    // Leave namespace 2's reserved blocks zeroed for the host oracle.
    qp.write_zeroes(2, 0, 16, 10).unwrap();
    wait(&mut qp).result.unwrap();
    assert_idle(&qp, "CMB SQ");
}

#[test]
#[ignore = "test bed"]
fn guest_cli_identify_and_hello() {
    bind_all(&[NVME_A]);
    reserve_hugepages(64);
    // The boot's backend, named explicitly (`--noiommu` in no-IOMMU mode).
    let noiommu = backend_args();
    let run = |args: &[&str]| {
        let out = std::process::Command::new("vfpoll")
            .args(args)
            .args(noiommu)
            .output()
            .expect("vfpoll on PATH");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "vfpoll {args:?}: {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    };
    let json = run(&["identify", "--device", NVME_A, "--json"]);
    let backend = format!("\"backend\": \"{}\"", mode().name());
    assert!(json.contains(&backend), "{backend} missing from {json}");
    if mode() == vfpoll_pci::vfio::IommuMode::Iommufd {
        // Without the flag, auto picks iommufd here (/dev/iommu, and A has a VFIO cdev).
        let out = std::process::Command::new("vfpoll")
            .args(["identify", "--device", NVME_A, "--json"])
            .output()
            .unwrap();
        let auto = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && auto.contains(&backend), "auto: {auto}");
    }
    for want in [
        "\"serial\": \"vfpoll-a\"",
        "\"model\": \"QEMU NVMe Ctrl\"",
        "\"firmware\": \"",
        "\"mdts_bytes\": 524288",
        "\"nsid\": 2",
        "\"lba_size\": 4096",
        "\"blocks\": 131072",
    ] {
        assert!(json.contains(want), "{want} missing from {json}");
    }
    let text = run(&["identify", "--device", NVME_A]);
    assert!(
        text.contains("QEMU NVMe Ctrl") && text.contains("nsid 2"),
        "{text}"
    );
    let hello = run(&["hello", "--device", NVME_A, "--nsid", "2", "--lba", "8"]);
    assert!(hello.contains("data matches"), "{hello}");
    // A device that is not bound, and one that is not NVMe: clear errors, non-zero exit.
    let out = std::process::Command::new("vfpoll")
        .args(["identify", "--device", NIC_1])
        .args(noiommu)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("vfpoll bind"),
        "{:?}: {err}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    bind_all(&[IVSHMEM]);
    let out = std::process::Command::new("vfpoll")
        .args(["identify", "--device", IVSHMEM])
        .args(noiommu)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("not an NVMe controller"),
        "{err}"
    );
}

/// Starts `hold-controller` on controller A and waits for its `ready`.
fn hold() -> (std::process::Child, std::io::BufReader<std::process::ChildStdout>) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_hold-controller"))
        .args([NVME_A, mode_name()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("hold-controller");
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    (child, out)
}

#[test]
#[ignore = "test bed"]
fn guest_a_process_killed_by_a_signal_shuts_its_controller_down() {
    use std::os::unix::process::ExitStatusExt;
    bind_all(&[NVME_A]);
    reserve_hugepages(64);
    // While another process holds the controller, this one is told so, and by whom.
    let (mut child, mut out) = hold();
    let e = Container::open(mode()).unwrap().device(bdf(NVME_A)).unwrap_err();
    let holder = format!("in use by PID {} (hold-controller)", child.id());
    if !e.to_string().contains(&holder) {
        // Not left holding the controller for the tests that follow.
        let _ = child.kill();
        let _ = child.wait();
        panic!("{e}: does not say {holder:?}");
    }
    // SIGTERM: the handler shuts the controller down, then the process dies of the signal.
    std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert_eq!(
        rest.trim(),
        "shst=2",
        "the handler saw CSTS.SHST = shutdown complete before dying"
    );
    // The same, called directly: CC.SHN = normal, then CSTS.SHST = complete.
    let c = Container::open(mode()).unwrap();
    let (ctrl, _dma) = Controller::open_first(&c, bdf(NVME_A), ControllerOptions::default()).unwrap();
    assert_eq!(ctrl.identify().serial, "vfpoll-a");
    assert_eq!(
        ctrl.registers().read32(0x14) >> 14 & 3,
        0,
        "running, no shutdown notified"
    );
    vfpoll_nvme::shutdown_all();
    let cc = ctrl.registers().read32(0x14);
    assert_eq!(cc >> 14 & 3, 1, "CC.SHN = normal shutdown: {cc:#x}");
    assert_eq!(
        ctrl.status().shutdown_status(),
        vfpoll_nvme::regs::ShutdownStatus::Complete
    );
}

/// Where the subsystem test writes: (LBA, length, pattern stream, writer is C).
const SUBSYS_WRITES: [(u64, usize, u64, bool); 2] =
    [(2048, 256 * 1024, 40, true), (8192, 64 * 1024 + 512, 41, false)];

#[test]
#[ignore = "test bed"]
fn guest_two_controllers_of_one_subsystem_share_a_namespace() {
    bind_all(&[NVME_C, NVME_D]);
    reserve_hugepages(64);
    let c = Container::open(mode()).unwrap();
    let (ctl_c, dma) = Controller::open_first(&c, bdf(NVME_C), ControllerOptions::default()).unwrap();
    let ctl_d = Controller::open(&c, bdf(NVME_D), dma.clone(), ControllerOptions::default()).unwrap();
    let _dma_back = DmaReturnCheck::new(&dma);
    let (ic, id) = (ctl_c.identify(), ctl_d.identify());
    assert_eq!((ic.serial.as_str(), id.serial.as_str()), ("vfpoll-s", "vfpoll-s"));
    // QEMU 7.2 reports the configured NQN behind its own prefix.
    assert!(
        ic.subnqn.ends_with("nqn.2026-11.io.vfpoll:subsys0"),
        "{}",
        ic.subnqn
    );
    assert_eq!(ic.subnqn, id.subnqn);
    assert_ne!(ic.cntlid, id.cntlid, "two controllers, two controller ids");
    assert!(
        ic.cmic & 0b10 != 0 && id.cmic & 0b10 != 0,
        "CMIC: more than one controller"
    );
    let ns = ctl_c.namespace(1).unwrap();
    assert!(
        ns.identify.nmic & 1 != 0,
        "namespace 1 may be attached to several controllers"
    );
    assert_eq!(
        ctl_d.namespace(1).unwrap().identify.nguid,
        ns.identify.nguid,
        "the same namespace"
    );
    let mut qc = ctl_c.create_qpair::<RegionBuf>(&QpairOptions::default()).unwrap();
    let mut qd = ctl_d.create_qpair::<RegionBuf>(&QpairOptions::default()).unwrap();
    for &(lba, len, stream, by_c) in &SUBSYS_WRITES {
        let data = Pattern::new(seed(), stream).bytes(len);
        let mut r = RegionBuf::new(dma.alloc_region(len, PageSize::Huge2M).unwrap(), 0, len).unwrap();
        r.write(0, &data).unwrap();
        let back = RegionBuf::new(dma.alloc_region(len, PageSize::Huge2M).unwrap(), 0, len).unwrap();
        let (w, rd) = if by_c {
            (&mut qc, &mut qd)
        } else {
            (&mut qd, &mut qc)
        };
        w.write(1, lba, r, 0).map_err(|r| r.error).unwrap();
        wait(w).result.expect("write on one controller");
        rd.read(1, lba, back, 1).map_err(|r| r.error).unwrap();
        let d = wait(rd);
        d.result.expect("read on the other");
        let back = d.buf.expect("the read's buffer comes back");
        let mut got = vec![0u8; len];
        back.read(0, &mut got).unwrap();
        assert!(
            got == data,
            "LBA {lba}: written through one controller, read differently through the other"
        );
    }
    assert_idle(&qc, "controller C");
    assert_idle(&qd, "controller D");
    write_manifest("subsys.txt", &[("mode".into(), mode_name().into())]);
}

#[test]
#[ignore = "test bed"]
fn host_check_two_controllers_of_one_subsystem_share_a_namespace() {
    assert_eq!(manifest_get(&read_manifest("subsys.txt"), "mode"), run_mode());
    for &(lba, len, stream, _) in &SUBSYS_WRITES {
        let got = read_file_range(&run_dir().join("nvme-s-ns1.img"), lba * 512, len);
        assert!(
            got == Pattern::new(seed(), stream).bytes(len),
            "nvme-s-ns1.img at LBA {lba}"
        );
    }
}
