//! NVM I/O commands and data pointers (NVM Command Set 1.0 §3; NVMe Base 2.0 §4.1.1, §4.1.2),
//! checked against the namespace contents (the oracle).

mod common;

use std::time::Duration;

use common::*;
use vfpoll_nvme_model::{io_opcode as io, ModelConfig, NamespaceConfig, Status};
use vfpoll_pci::BusAddr;

fn host(cfg: ModelConfig) -> Host {
    let mut h = Host::started(cfg);
    h.create_qp(1, 64);
    h
}

/// Writes `data` at `lba` with `write`, checks the namespace, reads it back with `read` into a
/// fresh buffer, and compares.
fn round_trip(
    h: &mut Host,
    nsid: u32,
    lba: u64,
    data: &[u8],
    write: Sqe,
    read: Sqe,
    readback: impl Fn(&Host) -> Vec<u8>,
) {
    h.cmd(1, write).ok();
    let bs = if nsid == 1 { 512 } else { 4096 };
    assert!(
        h.model.read_ns(nsid, lba, (data.len() / bs) as u64).unwrap() == data,
        "namespace holds what was written"
    );
    h.cmd(1, read).ok();
    assert!(readback(h) == data, "read back what was written");
}

#[test]
fn prp1_only() {
    let mut h = host(ModelConfig::default());
    let data = pattern(1024, 1);
    let src = h.buffer_with(&data);
    let dst = h.mem.alloc(PAGE);
    // 1 KiB at an offset inside one page.
    round_trip(
        &mut h,
        1,
        10,
        &data,
        Sqe::rw(io::WRITE, 1, 10, 2).prp(src.get(), 0),
        Sqe::rw(io::READ, 1, 10, 2).prp(dst.get() + 512, 0),
        |h| h.mem.read_vec(dst.add(512), 1024),
    );
    let st = h.model.stats();
    assert_eq!((st.io_commands(io::WRITE), st.io_commands(io::READ)), (1, 1));
    assert_eq!((st.bytes_written, st.bytes_read), (1024, 1024));
}

#[test]
fn prp1_and_prp2_across_a_page_boundary() {
    let mut h = host(ModelConfig::default());
    let data = pattern(4096, 2);
    let buf = h.mem.alloc(2 * PAGE);
    let other = h.mem.alloc(PAGE);
    h.mem.write(buf.add(3072), &data[..1024]);
    h.mem.write(other, &data[1024..]);
    let dst = h.mem.alloc(2 * PAGE);
    round_trip(
        &mut h,
        1,
        100,
        &data,
        Sqe::rw(io::WRITE, 1, 100, 8).prp(buf.get() + 3072, other.get()),
        Sqe::rw(io::READ, 1, 100, 8).prp(dst.get() + 2048, dst.get() + PAGE as u64),
        |h| h.mem.read_vec(dst.add(2048), 4096),
    );
    // PRP2 with an offset is invalid when it is a data pointer.
    let c = h.cmd(
        1,
        Sqe::rw(io::READ, 1, 100, 8).prp(dst.get() + 2048, dst.get() + PAGE as u64 + 512),
    );
    assert_eq!(c.status, Status::PRP_OFFSET_INVALID);
    let c = h.cmd(1, Sqe::rw(io::READ, 1, 100, 8).prp(dst.get() + 2, 0));
    assert_eq!(c.status, Status::PRP_OFFSET_INVALID, "PRP1 not dword aligned");
}

/// A PRP list for `pages` scattered data pages: returns (PRP1, PRP2).
fn prp_list(h: &Host, data: BusAddr, pages: usize) -> (u64, u64) {
    // Entries for pages 1.. ; every 512th slot of a list page chains to the next list page.
    let list_pages = (pages - 1).div_ceil(511);
    let list = h.mem.alloc(list_pages * PAGE);
    let mut entries = Vec::new();
    for p in 1..pages {
        if entries.len() % 512 == 511 && p < pages - 1 {
            entries.push(list.get() + (entries.len() as u64 + 1) / 512 * PAGE as u64);
        }
        entries.push(data.get() + (p * PAGE) as u64);
    }
    let bytes: Vec<u8> = entries.iter().flat_map(|e| e.to_le_bytes()).collect();
    h.mem.write(list, &bytes);
    (data.get(), list.get())
}

#[test]
fn prp_list_in_one_page() {
    let mut h = host(ModelConfig::default());
    let data = pattern(32 * PAGE, 3);
    let src = h.mem.alloc_scattered(32 * PAGE);
    h.mem.write(src, &data);
    let dst = h.mem.alloc_scattered(32 * PAGE);
    let (w1, w2) = prp_list(&h, src, 32);
    let (r1, r2) = prp_list(&h, dst, 32);
    round_trip(
        &mut h,
        1,
        0,
        &data,
        Sqe::rw(io::WRITE, 1, 0, 256).prp(w1, w2),
        Sqe::rw(io::READ, 1, 0, 256).prp(r1, r2),
        |h| h.mem.read_vec(dst, 32 * PAGE),
    );
}

#[test]
fn chained_prp_list_over_512_entries() {
    // 1200 pages of 4 KiB (4.7 MiB): a list of 1199 entries over three list pages.
    let cfg = ModelConfig {
        mdts: 0,
        namespaces: vec![NamespaceConfig::new(2, 4096, 4096)],
        ..Default::default()
    };
    let mut h = host(cfg);
    let pages = 1200;
    let data = pattern(pages * PAGE, 4);
    let src = h.mem.alloc_scattered(pages * PAGE);
    h.mem.write(src, &data);
    let dst = h.mem.alloc_scattered(pages * PAGE);
    let (w1, w2) = prp_list(&h, src, pages);
    let (r1, r2) = prp_list(&h, dst, pages);
    round_trip(
        &mut h,
        2,
        7,
        &data,
        Sqe::rw(io::WRITE, 2, 7, pages as u32).prp(w1, w2),
        Sqe::rw(io::READ, 2, 7, pages as u32).prp(r1, r2),
        |h| h.mem.read_vec(dst, pages * PAGE),
    );
    // A chain pointer with an offset is refused.
    let list = BusAddr(r2);
    let chain = h.mem.read_vec(list.add(511 * 8), 8);
    h.mem.write(
        list.add(511 * 8),
        &(u64::from_le_bytes(chain.try_into().unwrap()) + 8).to_le_bytes(),
    );
    let c = h.cmd(1, Sqe::rw(io::READ, 2, 7, pages as u32).prp(r1, r2));
    assert_eq!(c.status, Status::PRP_OFFSET_INVALID);
}

#[test]
fn sgl_data_blocks_segments_and_bit_bucket() {
    let mut h = host(ModelConfig::default());
    let data = pattern(8 * 512, 5);
    // Write with one Data Block descriptor over a scattered buffer.
    let src = h.mem.alloc_scattered(data.len());
    h.mem.write(src, &data);
    h.cmd(
        1,
        Sqe::rw(io::WRITE, 1, 40, 8).sgl(sgl_desc(src.get(), data.len() as u32, SGL_DATA)),
    )
    .ok();
    assert_eq!(h.model.read_ns(1, 40, 8).unwrap(), data);
    // Read through a Segment (two data blocks, then a Last Segment holding a bit bucket and a
    // data block).
    let (a, b, c) = (h.mem.alloc(PAGE), h.mem.alloc(PAGE), h.mem.alloc(PAGE));
    let (seg1, seg2) = (h.mem.alloc(PAGE), h.mem.alloc(PAGE));
    let s1 = [
        sgl_desc(a.get() + 100, 1000, SGL_DATA),
        sgl_desc(b.get(), 1048, SGL_DATA),
        sgl_desc(seg2.get(), 32, SGL_LAST_SEGMENT),
    ];
    let s2 = [sgl_desc(0, 48, SGL_BUCKET), sgl_desc(c.get(), 2000, SGL_DATA)];
    h.mem.write(seg1, &s1.concat());
    h.mem.write(seg2, &s2.concat());
    h.cmd(
        1,
        Sqe::rw(io::READ, 1, 40, 8).sgl(sgl_desc(seg1.get(), 48, SGL_SEGMENT)),
    )
    .ok();
    assert_eq!(h.mem.read_vec(a.add(100), 1000), &data[..1000]);
    assert_eq!(h.mem.read_vec(b, 1048), &data[1000..2048]);
    assert_eq!(h.mem.read_vec(c, 2000), &data[2096..]);
    // Wrong total length, and SGLs when the controller does not support them.
    let c = h.cmd(
        1,
        Sqe::rw(io::READ, 1, 40, 8).sgl(sgl_desc(a.get(), 4000, SGL_DATA)),
    );
    assert_eq!(c.status, Status::DATA_SGL_LENGTH_INVALID);
    let mut h = host(ModelConfig {
        sgl: false,
        ..Default::default()
    });
    let c = h.cmd(
        1,
        Sqe::rw(io::READ, 1, 0, 1).sgl(sgl_desc(h.mem.alloc(PAGE).get(), 512, SGL_DATA)),
    );
    assert_eq!(c.status, Status::INVALID_FIELD);
}

#[test]
fn four_kib_blocks() {
    let mut h = host(ModelConfig {
        namespaces: vec![NamespaceConfig::new(7, 4096, 64)],
        ..Default::default()
    });
    let data = pattern(2 * PAGE, 6);
    let src = h.buffer_with(&data);
    let dst = h.mem.alloc(2 * PAGE);
    round_trip(
        &mut h,
        7,
        62,
        &data,
        Sqe::rw(io::WRITE, 7, 62, 2).prp(src.get(), src.get() + PAGE as u64),
        Sqe::rw(io::READ, 7, 62, 2).prp(dst.get(), dst.get() + PAGE as u64),
        |h| h.mem.read_vec(dst, 2 * PAGE),
    );
    let c = h.cmd(
        1,
        Sqe::rw(io::READ, 7, 63, 2).prp(dst.get(), dst.get() + PAGE as u64),
    );
    assert_eq!(c.status, Status::LBA_OUT_OF_RANGE, "the last block plus one");
}

#[test]
fn rejected_commands_leave_the_namespace_alone() {
    let mut h = host(ModelConfig::default()); // 32768 blocks of 512, MDTS 5 = 128 KiB
    let buf = h.buffer_with(&pattern(PAGE, 7));
    let write = |slba, n| Sqe::rw(io::WRITE, 1, slba, n).prp(buf.get(), 0);
    assert_eq!(h.cmd(1, write(32767, 2)).status, Status::LBA_OUT_OF_RANGE);
    assert_eq!(
        h.cmd(1, write(u64::MAX, 1)).status,
        Status::LBA_OUT_OF_RANGE,
        "no wrap-around"
    );
    assert_eq!(h.cmd(1, write(0, 1).nsid(2)).status, Status::INVALID_NAMESPACE);
    assert_eq!(h.cmd(1, write(0, 1).nsid(0)).status, Status::INVALID_NAMESPACE);
    assert_eq!(
        h.cmd(1, write(0, 1).nsid(u32::MAX)).status,
        Status::INVALID_NAMESPACE
    );
    // 257 blocks = 128.5 KiB > MDTS.
    assert_eq!(h.cmd(1, write(0, 257)).status, Status::INVALID_FIELD);
    // The data pointer does not translate: the IOMMU-fault analogue.
    let c = h.cmd(1, Sqe::rw(io::WRITE, 1, 0, 1).prp(0x7777_0000, 0));
    assert_eq!(c.status, Status::DATA_TRANSFER_ERROR);
    let c = h.cmd(
        1,
        Sqe::rw(io::WRITE, 1, 0, 16).prp(buf.get(), buf.get() + 2 * PAGE as u64),
    );
    assert_eq!(
        c.status,
        Status::DATA_TRANSFER_ERROR,
        "PRP2 in the guard page after the buffer"
    );
    h.expect_dma_faults(&[0x7777_0000, buf.get() + 2 * PAGE as u64]);
    assert_eq!(h.cmd(1, Sqe::new(0x7e).nsid(1)).status, Status::INVALID_OPCODE);
    assert_eq!(
        h.cmd(1, write(0, 1).cdw(0, io::WRITE as u32 | 1 << 8)).status,
        Status::INVALID_FIELD,
        "fused"
    );
    assert!(h.model.namespace_data(1).unwrap().iter().all(|&b| b == 0));
    assert_eq!(h.model.stats().errors, 10);
}

#[test]
fn write_zeroes_deallocate_and_flush() {
    let mut h = host(ModelConfig::default());
    h.model.write_ns(1, 0, &pattern(64 * 512, 8)).unwrap();
    h.cmd(1, Sqe::rw(io::WRITE_ZEROES, 1, 10, 5)).ok();
    let ns = h.model.read_ns(1, 0, 64).unwrap();
    assert!(ns[10 * 512..15 * 512].iter().all(|&b| b == 0));
    assert_eq!(ns[9 * 512..10 * 512], pattern(64 * 512, 8)[9 * 512..10 * 512]);
    assert_ne!(ns[15 * 512], 0);
    assert_eq!(
        h.cmd(1, Sqe::rw(io::WRITE_ZEROES, 1, 32760, 9)).status,
        Status::LBA_OUT_OF_RANGE
    );
    // No MDTS limit for Write Zeroes: 65536 blocks is the most one command names.
    assert_eq!(
        h.cmd(1, Sqe::rw(io::WRITE_ZEROES, 1, 0, 32768)).status,
        Status::SUCCESS
    );
    h.model.write_ns(1, 0, &pattern(64 * 512, 9)).unwrap();

    // Dataset Management, Deallocate: two ranges (context, length, SLBA).
    let range = |nlb: u32, slba: u64| {
        [
            0u32.to_le_bytes().as_slice(),
            &nlb.to_le_bytes(),
            &slba.to_le_bytes(),
        ]
        .concat()
    };
    let ranges = h.buffer_with(&[range(2, 3), range(1, 40)].concat());
    h.cmd(
        1,
        Sqe::new(io::DATASET_MANAGEMENT)
            .nsid(1)
            .prp(ranges.get(), 0)
            .cdw(10, 1)
            .cdw(11, 1 << 2),
    )
    .ok();
    let ns = h.model.read_ns(1, 0, 64).unwrap();
    let zero = |b: u64| {
        ns[b as usize * 512..(b as usize + 1) * 512]
            .iter()
            .all(|&x| x == 0)
    };
    assert!(zero(3) && zero(4) && zero(40));
    assert!(!zero(2) && !zero(5) && !zero(41));
    // Without the deallocate attribute nothing changes; an out-of-range range changes nothing.
    h.model.write_ns(1, 0, &pattern(64 * 512, 9)).unwrap();
    h.cmd(
        1,
        Sqe::new(io::DATASET_MANAGEMENT)
            .nsid(1)
            .prp(ranges.get(), 0)
            .cdw(10, 1)
            .cdw(11, 1),
    )
    .ok();
    let ranges2 = h.buffer_with(&[range(2, 3), range(1, 1 << 20)].concat());
    let c = h.cmd(
        1,
        Sqe::new(io::DATASET_MANAGEMENT)
            .nsid(1)
            .prp(ranges2.get(), 0)
            .cdw(10, 1)
            .cdw(11, 1 << 2),
    );
    assert_eq!(c.status, Status::LBA_OUT_OF_RANGE);
    assert_eq!(h.model.read_ns(1, 0, 64).unwrap(), pattern(64 * 512, 9));

    h.cmd(1, Sqe::new(io::FLUSH).nsid(1)).ok();
    h.cmd(1, Sqe::new(io::FLUSH).nsid(u32::MAX)).ok();
    assert_eq!(
        h.cmd(1, Sqe::new(io::FLUSH).nsid(5)).status,
        Status::INVALID_NAMESPACE
    );
}

#[test]
fn compare() {
    let mut h = host(ModelConfig::default());
    let data = pattern(3 * 512, 10);
    h.model.write_ns(1, 20, &data).unwrap();
    let same = h.buffer_with(&data);
    h.cmd(1, Sqe::rw(io::COMPARE, 1, 20, 3).prp(same.get(), 0)).ok();
    let mut other = data.clone();
    other[3 * 512 - 1] ^= 1;
    let diff = h.buffer_with(&other);
    let c = h.cmd(1, Sqe::rw(io::COMPARE, 1, 20, 3).prp(diff.get(), 0));
    assert_eq!(c.status, Status::COMPARE_FAILURE);
    assert_eq!(h.model.read_ns(1, 20, 3).unwrap(), data, "compare writes nothing");
}

#[test]
fn fua_is_accepted() {
    let mut h = host(ModelConfig::default());
    let buf = h.buffer_with(&[0x5a; 512]);
    h.cmd(1, Sqe::rw(io::WRITE, 1, 1, 1).prp(buf.get(), 0).cdw(12, 1 << 30))
        .ok();
    assert_eq!(h.model.read_ns(1, 1, 1).unwrap(), vec![0x5a; 512]);
}

#[test]
fn a_full_cq_is_never_overwritten() {
    let mut h = Host::started(ModelConfig::default());
    // 8 SQ entries but only 4 CQ entries: at most 3 completions fit.
    let sq = h.mem.alloc(PAGE);
    let cq = h.mem.alloc(PAGE);
    h.admin(Sqe::new(0x05).prp(cq.get(), 0).cdw(10, 3 << 16 | 1).cdw(11, 1))
        .ok();
    h.admin(
        Sqe::new(0x01)
            .prp(sq.get(), 0)
            .cdw(10, 7 << 16 | 1)
            .cdw(11, 1 << 16 | 1),
    )
    .ok();
    h.qps[1] = Some(Qp {
        qid: 1,
        sq,
        cq,
        size: 8,
        cq_size: 4,
        tail: 0,
        head: 0,
        phase: true,
    });
    let cids: Vec<u16> = (0..7).map(|_| h.push(1, Sqe::new(io::FLUSH).nsid(1))).collect();
    h.ring(1);
    // Three entries posted (wait for the third's phase tag), then a moment in which a wrong
    // fourth would show; the fourth slot still holds nothing (phase 0).
    let t = std::time::Instant::now();
    while h.mem.read_u32(cq.add(16 * 2 + 12)) & (1 << 16) == 0 {
        assert!(t.elapsed() < TIMEOUT, "three completions never posted");
        std::thread::sleep(Duration::from_micros(100));
    }
    std::thread::sleep(Duration::from_millis(20));
    let entries: Vec<Cqe> = (0..4)
        .map(|i| Cqe::decode(&h.mem.read_vec(cq.add(16 * i), 16)))
        .collect();
    assert!(entries[..3].iter().all(|e| e.phase));
    assert_eq!(
        entries[3].dw0 | entries[3].cid as u32 | entries[3].phase as u32,
        0,
        "slot 4 untouched"
    );
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(h.reap_quiet(1, TIMEOUT).unwrap().cid);
    }
    assert!(h.reap_quiet(1, Duration::from_millis(10)).is_none());
    // Release the slots: the rest arrive, in order, with the phase flipping on wrap-around.
    h.ring_cq(1);
    for _ in 0..4 {
        let c = h.reap(1, TIMEOUT).expect("the remaining completions");
        got.push(c.cid);
    }
    assert_eq!(got, cids);
    assert!(!h.qp(1).phase, "wrapped once");
}

#[test]
fn queues_are_served_round_robin() {
    let mut h = Host::started(ModelConfig::default());
    // SQs 1 and 2 share CQ 1; the CQ is filled first so that the model sees both SQs loaded
    // before it may fetch from either.
    let (cq, sq1, sq2) = (h.mem.alloc(PAGE), h.mem.alloc(PAGE), h.mem.alloc(PAGE));
    h.admin(Sqe::new(0x05).prp(cq.get(), 0).cdw(10, 63 << 16 | 1).cdw(11, 1))
        .ok();
    for (qid, sq) in [(1u32, sq1), (2, sq2)] {
        h.admin(
            Sqe::new(0x01)
                .prp(sq.get(), 0)
                .cdw(10, 63 << 16 | qid)
                .cdw(11, 1 << 16 | 1),
        )
        .ok();
    }
    for (qid, sq) in [(1, sq1), (2, sq2)] {
        h.qps[qid as usize] = Some(Qp {
            qid,
            sq,
            cq,
            size: 64,
            cq_size: 64,
            tail: 0,
            head: 0,
            phase: true,
        });
    }
    for _ in 0..63 {
        h.push(1, Sqe::new(io::FLUSH).nsid(1));
    }
    h.ring(1);
    for _ in 0..63 {
        h.reap_quiet(1, TIMEOUT).expect("filling the CQ");
    }
    for _ in 0..8 {
        h.push(1, Sqe::new(io::FLUSH).nsid(1));
        h.push(2, Sqe::new(io::FLUSH).nsid(1));
    }
    h.ring(1);
    h.ring(2);
    std::thread::sleep(Duration::from_millis(10));
    assert!(
        h.reap_quiet(1, Duration::ZERO).is_none(),
        "the CQ is full: nothing fetched"
    );
    h.ring_cq(1);
    let order: Vec<u16> = (0..16)
        .map(|_| h.reap(1, TIMEOUT).expect("completion").ok().sqid)
        .collect();
    // One command per SQ per round (burst 1), the first SQ served alternating between rounds:
    // never more than two in a row from one queue (one round's last, the next round's first).
    // Without round robin, eight of one queue would come first.
    let longest = order.chunk_by(|a, b| a == b).map(<[u16]>::len).max().unwrap();
    assert!(longest <= 2, "{order:?}");
    assert_eq!(order.iter().filter(|&&q| q == 1).count(), 8);
    // Each completion reports how far its own SQ's head has moved (SQHD).
    let cid = h.submit(2, Sqe::new(io::FLUSH).nsid(1));
    let c = h.reap(1, TIMEOUT).expect("completion on the shared CQ");
    assert_eq!((c.cid, c.sqid, c.sqhd), (cid, 2, 9));
}

#[test]
fn a_recreated_queue_starts_afresh() {
    let mut h = host(ModelConfig::default());
    for _ in 0..3 {
        h.cmd(1, Sqe::new(io::FLUSH).nsid(1)).ok();
    }
    h.admin(Sqe::new(0x00).cdw(10, 1)).ok();
    h.admin(Sqe::new(0x04).cdw(10, 1)).ok();
    // New memory for the same queue IDs; the old doorbell values (3) must not count.
    h.create_qp(1, 8);
    h.cmd(1, Sqe::new(io::FLUSH).nsid(1)).ok();
    assert!(
        h.reap(1, Duration::from_millis(20)).is_none(),
        "no phantom commands"
    );
    assert_eq!(h.model.stats().io_commands(io::FLUSH), 4);
    assert_eq!(h.model.stats().errors, 0);
}
