//! Admin commands (NVMe Base 2.0 §5): Identify, features, queue management, log pages, Abort,
//! Asynchronous Event Request and Namespace Attribute Changed, Format NVM, Doorbell Buffer
//! Config.

mod common;

use std::time::Duration;

use common::*;
use vfpoll_nvme_model::{
    admin_opcode as adm, feature, io_opcode as io, log_page, EventIdxPolicy, LbaFormat, MetadataCaps,
    ModelConfig, NamespaceConfig, NamespaceFormat, PiCaps, PiTuple, Status,
};
use vfpoll_nvme_spec::regs;
use vfpoll_pci::BusAddr;

fn two_namespaces() -> ModelConfig {
    ModelConfig {
        namespaces: vec![
            NamespaceConfig::new(1, 512, 2048),
            NamespaceConfig::new(3, 4096, 100),
        ],
        serial: "SN-42".into(),
        mdts: 6,
        ..Default::default()
    }
}

fn identify(h: &mut Host, cns: u32, nsid: u32) -> (Cqe, Vec<u8>) {
    let buf = h.mem.alloc(PAGE);
    let c = h.admin(Sqe::new(adm::IDENTIFY).nsid(nsid).prp(buf.get(), 0).cdw(10, cns));
    (c, h.mem.read_vec(buf, PAGE))
}

fn le(b: &[u8], off: usize, len: usize) -> u64 {
    let mut v = [0u8; 8];
    v[..len].copy_from_slice(&b[off..off + len]);
    u64::from_le_bytes(v)
}

#[test]
fn identify_controller() {
    let mut h = Host::started(two_namespaces());
    let (c, id) = identify(&mut h, 1, 0);
    c.ok();
    assert_eq!(le(&id, 0, 2), 0x1b36, "VID");
    assert_eq!(&id[4..24], b"SN-42               ", "SN, space padded");
    assert_eq!(
        std::str::from_utf8(&id[24..64]).unwrap().trim_end(),
        "vfpoll NVMe model"
    );
    assert_eq!(&id[64..72], b"1.0     ");
    assert_eq!(id[77], 6, "MDTS");
    assert_eq!(le(&id, 80, 4), 0x0001_0400, "VER");
    assert_eq!(le(&id, 256, 2), 0x102, "OACS: Format NVM, Doorbell Buffer Config");
    assert_eq!((id[258], id[259], id[262]), (3, 3, 63), "ACL, AERL, ELPE");
    assert_eq!((id[512], id[513]), (0x66, 0x44), "SQES, CQES");
    assert_eq!(le(&id, 516, 4), 3, "NN: the largest NSID");
    assert_eq!(le(&id, 520, 2), 0b1101, "ONCS: Compare, DSM, Write Zeroes");
    assert_eq!(id[525], 0x7, "VWC present, broadcast flush");
    assert_eq!(le(&id, 536, 4), 0x9_0001, "SGLS: supported, bit bucket, MPTR SGL");
    assert_eq!(le(&id, 92, 4), 1 << 8, "OAES: namespace attribute notices");
    assert!(
        std::str::from_utf8(&id[768..1024]).unwrap().starts_with("nqn."),
        "SUBNQN"
    );

    let mut h = Host::started(ModelConfig {
        sgl: false,
        volatile_write_cache: false,
        doorbell_buffer_config: false,
        ..Default::default()
    });
    let (_, id) = identify(&mut h, 1, 0);
    assert_eq!(le(&id, 536, 4), 0, "no SGLs");
    assert_eq!(id[525], 0, "no volatile write cache");
    assert_eq!(le(&id, 256, 2), 0x2, "no Doorbell Buffer Config");
    let c =
        h.admin(Sqe::new(adm::DOORBELL_BUFFER_CONFIG).prp(h.mem.alloc(PAGE).get(), h.mem.alloc(PAGE).get()));
    assert_eq!(c.status, Status::INVALID_OPCODE);
}

#[test]
fn identify_namespaces() {
    let mut h = Host::started(two_namespaces());
    let (c, ns) = identify(&mut h, 0, 3);
    c.ok();
    assert_eq!(
        (le(&ns, 0, 8), le(&ns, 8, 8), le(&ns, 16, 8)),
        (100, 100, 100),
        "NSZE, NCAP, NUSE"
    );
    assert_eq!((ns[25], ns[26]), (0, 0), "NLBAF, FLBAS");
    assert_eq!(le(&ns, 128, 4), 12 << 16, "LBAF0: 4096-byte blocks, no metadata");
    let (_, ns) = identify(&mut h, 0, 1);
    assert_eq!(le(&ns, 0, 8), 2048);
    assert_eq!(le(&ns, 128, 4), 9 << 16);
    // NSID 2 is in range but inactive: zeroes; 0 and 4 are invalid.
    let (c, ns) = identify(&mut h, 0, 2);
    c.ok();
    assert!(ns.iter().all(|&b| b == 0));
    for nsid in [0, 4, u32::MAX] {
        assert_eq!(
            identify(&mut h, 0, nsid).0.status,
            Status::INVALID_NAMESPACE,
            "NSID {nsid}"
        );
    }
    // Active namespace list: IDs above the given one.
    let (_, list) = identify(&mut h, 2, 0);
    assert_eq!((le(&list, 0, 4), le(&list, 4, 4), le(&list, 8, 4)), (1, 3, 0));
    let (_, list) = identify(&mut h, 2, 1);
    assert_eq!((le(&list, 0, 4), le(&list, 4, 4)), (3, 0));
    // Descriptors: NGUID then the command set identifier.
    let (c, d) = identify(&mut h, 3, 3);
    c.ok();
    assert_eq!((d[0], d[1], d[20], d[21], d[24]), (2, 16, 4, 1, 0));
    assert_eq!(identify(&mut h, 3, 2).0.status, Status::INVALID_NAMESPACE);
    assert_eq!(
        identify(&mut h, 0x10, 0).0.status,
        Status::INVALID_FIELD,
        "unsupported CNS"
    );
}

#[test]
fn identify_data_pointer_rules() {
    let mut h = Host::started(ModelConfig::default());
    // Spanning two pages with PRP2.
    let buf = h.mem.alloc(2 * PAGE);
    h.admin(
        Sqe::new(adm::IDENTIFY)
            .prp(buf.get() + 2048, buf.get() + PAGE as u64)
            .cdw(10, 1),
    )
    .ok();
    assert_eq!(h.mem.read_vec(buf.add(2048 + 512), 1), [0x66]);
    let c = h.admin(
        Sqe::new(adm::IDENTIFY)
            .prp(buf.get() + 2048, buf.get() + 8)
            .cdw(10, 1),
    );
    assert_eq!(c.status, Status::PRP_OFFSET_INVALID);
    let c = h.admin(Sqe::new(adm::IDENTIFY).prp(0xdead_0000, 0).cdw(10, 1));
    assert_eq!(
        c.status,
        Status::DATA_TRANSFER_ERROR,
        "unmapped buffer: the IOMMU-fault analogue"
    );
    h.expect_dma_faults(&[0xdead_0000]);
    // Admin commands take PRPs only.
    let c = h.admin(
        Sqe::new(adm::IDENTIFY)
            .sgl(sgl_desc(buf.get(), 4096, SGL_DATA))
            .cdw(10, 1),
    );
    assert_eq!(c.status, Status::INVALID_FIELD);
}

#[test]
fn unknown_opcode() {
    let mut h = Host::started(ModelConfig::default());
    for op in [0x03, 0x18, 0x7f, 0xc0] {
        assert_eq!(
            h.admin(Sqe::new(op)).status,
            Status::INVALID_OPCODE,
            "opcode {op:#x}"
        );
    }
    assert_eq!(h.model.stats().admin_commands(0x18), 1);
}

#[test]
fn number_of_queues() {
    let mut h = Host::started(ModelConfig {
        max_io_queue_pairs: 8,
        ..Default::default()
    });
    let get = |h: &mut Host, sel: u32| {
        h.admin(Sqe::new(adm::GET_FEATURES).cdw(10, sel << 8 | 7))
            .ok()
            .dw0
    };
    assert_eq!(get(&mut h, 0), 7 | 7 << 16, "all 8 pairs before any Set Features");
    let c = h
        .admin(Sqe::new(adm::SET_FEATURES).cdw(10, 7).cdw(11, 1 << 16 | 99))
        .ok();
    assert_eq!(c.dw0, 7 | 1 << 16, "8 SQs (capped), 2 CQs");
    assert_eq!(get(&mut h, 0), 7 | 1 << 16);
    assert_eq!(get(&mut h, 1), 7 | 7 << 16, "default");
    assert_eq!(
        h.admin(Sqe::new(adm::SET_FEATURES).cdw(10, 7).cdw(11, 0xffff))
            .status,
        Status::INVALID_FIELD
    );
    // Only 2 CQs were granted.
    let cq = h.mem.alloc(PAGE);
    let c = h.admin(
        Sqe::new(adm::CREATE_IO_CQ)
            .prp(cq.get(), 0)
            .cdw(10, 3 << 16 | 3)
            .cdw(11, 1),
    );
    assert_eq!(c.status, Status::INVALID_QID);
    h.create_qp(1, 4);
    let c = h.admin(Sqe::new(adm::SET_FEATURES).cdw(10, 7).cdw(11, 0));
    assert_eq!(c.status, Status::COMMAND_SEQUENCE_ERROR, "after I/O queues exist");
}

#[test]
fn other_features() {
    let mut h = Host::started(ModelConfig::default());
    let get = |h: &mut Host, fid: u8| h.admin(Sqe::new(adm::GET_FEATURES).cdw(10, fid as u32)).ok().dw0;
    assert_eq!(get(&mut h, feature::VOLATILE_WRITE_CACHE), 1);
    h.admin(Sqe::new(adm::SET_FEATURES).cdw(10, 6).cdw(11, 0)).ok();
    assert_eq!(get(&mut h, feature::VOLATILE_WRITE_CACHE), 0);
    h.admin(Sqe::new(adm::SET_FEATURES).cdw(10, 1).cdw(11, 0x0302_0103))
        .ok();
    assert_eq!(get(&mut h, feature::ARBITRATION), 0x0302_0103);
    assert_eq!(get(&mut h, feature::TEMPERATURE_THRESHOLD), 0x157);
    assert_eq!(
        h.admin(Sqe::new(adm::GET_FEATURES).cdw(10, 3 << 8 | 6)).ok().dw0,
        0b100,
        "changeable only"
    );
    let bad = [
        Sqe::new(adm::SET_FEATURES).cdw(10, 1 << 31 | 6).cdw(11, 1),
        Sqe::new(adm::SET_FEATURES).cdw(10, 2).cdw(11, 1),
        Sqe::new(adm::SET_FEATURES).cdw(10, 0x0c),
        Sqe::new(adm::GET_FEATURES).cdw(10, 0x80),
        Sqe::new(adm::GET_FEATURES).cdw(10, 4 << 8 | 6),
    ];
    let want = [
        Status::FEATURE_NOT_SAVEABLE,
        Status::INVALID_FIELD,
        Status::INVALID_FIELD,
        Status::INVALID_FIELD,
        Status::INVALID_FIELD,
    ];
    for (sqe, want) in bad.into_iter().zip(want) {
        assert_eq!(h.admin(sqe).status, want, "{sqe:x?}");
    }
    // The reset restores defaults.
    h.disable();
    h.enable(good_cc(), 4);
    assert_eq!(get(&mut h, feature::VOLATILE_WRITE_CACHE), 1);
}

fn create_cq(h: &mut Host, qid: u32, entries: u32, base: u64, flags: u32) -> Status {
    h.admin(
        Sqe::new(adm::CREATE_IO_CQ)
            .prp(base, 0)
            .cdw(10, (entries - 1) << 16 | qid)
            .cdw(11, flags),
    )
    .status
}

fn create_sq(h: &mut Host, qid: u32, entries: u32, base: u64, cqid: u32) -> Status {
    h.admin(
        Sqe::new(adm::CREATE_IO_SQ)
            .prp(base, 0)
            .cdw(10, (entries - 1) << 16 | qid)
            .cdw(11, cqid << 16 | 1),
    )
    .status
}

#[test]
fn create_and_delete_queues_with_their_errors() {
    let mut h = Host::started(ModelConfig {
        max_io_queue_pairs: 4,
        max_queue_entries: 512,
        ..Default::default()
    });
    let mem = h.mem.alloc(8 * PAGE).get();
    for (qid, entries, base, flags, want, why) in [
        (0, 4, mem, 1, Status::INVALID_QID, "QID 0 is the admin queue"),
        (5, 4, mem, 1, Status::INVALID_QID, "over the queue count"),
        (1, 513, mem, 1, Status::INVALID_QUEUE_SIZE, "over MQES"),
        (1, 1, mem, 1, Status::INVALID_QUEUE_SIZE, "a 1-entry queue"),
        (1, 4, mem, 0, Status::INVALID_FIELD, "PC = 0 while CAP.CQR = 1"),
        (1, 4, mem + 16, 1, Status::INVALID_FIELD, "not page aligned"),
        (
            1,
            512,
            mem + 7 * PAGE as u64,
            1,
            Status::DATA_TRANSFER_ERROR,
            "runs off the mapping",
        ),
    ] {
        assert_eq!(create_cq(&mut h, qid, entries, base, flags), want, "{why}");
    }
    h.expect_dma_faults(&[mem + 8 * PAGE as u64]);
    assert_eq!(create_cq(&mut h, 1, 4, mem, 1), Status::SUCCESS);
    assert_eq!(
        create_cq(&mut h, 1, 4, mem, 1),
        Status::INVALID_QID,
        "exists already"
    );
    let sq = mem + PAGE as u64;
    assert_eq!(create_sq(&mut h, 1, 4, sq, 2), Status::CQ_INVALID, "no CQ 2");
    assert_eq!(create_sq(&mut h, 1, 4, sq, 0), Status::CQ_INVALID, "the admin CQ");
    assert_eq!(create_sq(&mut h, 0, 4, sq, 1), Status::INVALID_QID);
    assert_eq!(create_sq(&mut h, 1, 600, sq, 1), Status::INVALID_QUEUE_SIZE);
    assert_eq!(create_sq(&mut h, 1, 4, sq, 1), Status::SUCCESS);
    assert_eq!(
        create_sq(&mut h, 2, 4, sq + PAGE as u64, 1),
        Status::SUCCESS,
        "two SQs on one CQ"
    );
    assert_eq!(create_sq(&mut h, 2, 4, sq + PAGE as u64, 1), Status::INVALID_QID);

    let del = |h: &mut Host, op, qid: u32| h.admin(Sqe::new(op).cdw(10, qid)).status;
    assert_eq!(
        del(&mut h, adm::DELETE_IO_CQ, 1),
        Status::INVALID_QUEUE_DELETION,
        "SQs attached"
    );
    assert_eq!(del(&mut h, adm::DELETE_IO_SQ, 1), Status::SUCCESS);
    assert_eq!(del(&mut h, adm::DELETE_IO_SQ, 1), Status::INVALID_QID, "gone");
    assert_eq!(
        del(&mut h, adm::DELETE_IO_CQ, 1),
        Status::INVALID_QUEUE_DELETION,
        "SQ 2 still attached"
    );
    assert_eq!(del(&mut h, adm::DELETE_IO_SQ, 2), Status::SUCCESS);
    assert_eq!(del(&mut h, adm::DELETE_IO_CQ, 1), Status::SUCCESS);
    assert_eq!(del(&mut h, adm::DELETE_IO_CQ, 1), Status::INVALID_QID);
    assert_eq!(
        del(&mut h, adm::DELETE_IO_CQ, 0),
        Status::INVALID_QID,
        "the admin CQ"
    );
    assert_eq!(
        del(&mut h, adm::DELETE_IO_SQ, 0),
        Status::INVALID_QID,
        "the admin SQ"
    );
    // The IDs are free again and the new queues work.
    h.create_qp(1, 4);
    h.cmd(1, Sqe::new(io::FLUSH).nsid(1)).ok();
}

#[test]
fn logs_count_io_and_record_errors() {
    let mut h = Host::started(ModelConfig::default());
    h.create_qp(1, 16);
    let buf = h.buffer_with(&pattern(8 * 512, 1));
    h.cmd(1, Sqe::rw(io::WRITE, 1, 0, 8).prp(buf.get(), 0)).ok();
    h.cmd(1, Sqe::rw(io::READ, 1, 0, 8).prp(buf.get(), 0)).ok();
    h.cmd(1, Sqe::rw(io::READ, 1, 0, 1).prp(buf.get(), 0)).ok();
    let bad = h.cmd(1, Sqe::rw(io::READ, 1, 1 << 40, 1).prp(buf.get(), 0));
    assert_eq!(bad.status, Status::LBA_OUT_OF_RANGE);

    let log = h.mem.alloc(PAGE);
    let get_log = |h: &mut Host, lid: u8, dwords: u32, offset: u64| {
        h.admin(
            Sqe::new(adm::GET_LOG_PAGE)
                .nsid(u32::MAX)
                .prp(log.get(), 0)
                .cdw(10, (dwords - 1) << 16 | lid as u32)
                .cdw(12, offset as u32),
        )
    };
    get_log(&mut h, log_page::SMART, 128, 0).ok();
    let smart = h.mem.read_vec(log, 512);
    assert_eq!(smart[3], 100, "available spare");
    assert_eq!(
        (le(&smart, 32, 8), le(&smart, 48, 8)),
        (1, 1),
        "data units read/written, rounded up"
    );
    assert_eq!(
        (le(&smart, 64, 8), le(&smart, 80, 8)),
        (2, 1),
        "host read/write commands"
    );
    assert_eq!(le(&smart, 176, 8), 1, "error log entries");

    get_log(&mut h, log_page::ERROR, 16, 0).ok();
    let e = h.mem.read_vec(log, 64);
    assert_eq!(le(&e, 0, 8), 1, "error count");
    assert_eq!((le(&e, 8, 2), le(&e, 10, 2)), (1, bad.cid as u64), "SQID, CID");
    assert_eq!(
        Status::from_field((le(&e, 12, 2) >> 1) as u16),
        Status::LBA_OUT_OF_RANGE
    );
    assert_eq!((le(&e, 16, 8), le(&e, 24, 4)), (1 << 40, 1), "LBA, NSID");

    // A second error goes first; reading at an offset skips the newest entry.
    assert_eq!(h.admin(Sqe::new(0x7f)).status, Status::INVALID_OPCODE);
    get_log(&mut h, log_page::ERROR, 16, 64).ok();
    assert_eq!(
        le(&h.mem.read_vec(log, 8), 0, 8),
        1,
        "the older entry, at offset 64"
    );
    get_log(&mut h, log_page::ERROR, 16, 0).ok();
    assert_eq!(
        le(&h.mem.read_vec(log, 16), 8, 2),
        0,
        "the newest, from the admin queue"
    );

    get_log(&mut h, log_page::FIRMWARE_SLOT, 128, 0).ok();
    assert_eq!(&h.mem.read_vec(log, 16)[..], b"\x01\0\0\0\0\0\0\x001.0     ");
    assert_eq!(get_log(&mut h, 0x70, 16, 0).status, Status::INVALID_LOG_PAGE);
    assert_eq!(
        get_log(&mut h, log_page::SMART, 16, 512).status,
        Status::INVALID_FIELD,
        "offset past the end"
    );
    assert_eq!(
        get_log(&mut h, log_page::SMART, 16, 2).status,
        Status::INVALID_FIELD,
        "unaligned offset"
    );
    let c = h.admin(
        Sqe::new(adm::GET_LOG_PAGE)
            .nsid(1)
            .prp(log.get(), 0)
            .cdw(10, 127 << 16 | 2),
    );
    assert_eq!(c.status, Status::INVALID_FIELD, "no per-namespace SMART data");
}

#[test]
fn abort_of_a_completed_command_is_not_done() {
    let mut h = Host::started(ModelConfig::default());
    h.create_qp(1, 4);
    let c = h.cmd(1, Sqe::new(io::FLUSH).nsid(1)).ok();
    let a = h
        .admin(Sqe::new(adm::ABORT).cdw(10, (c.cid as u32) << 16 | 1))
        .ok();
    assert_eq!(a.dw0 & 1, 1, "command not aborted");
}

/// Submits four Asynchronous Event Requests (the model's limit) and returns the status of a
/// fifth.
fn fifth_aer(h: &mut Host) -> Status {
    for _ in 0..4 {
        h.submit(0, Sqe::new(adm::ASYNC_EVENT_REQUEST));
    }
    h.admin(Sqe::new(adm::ASYNC_EVENT_REQUEST)).status
}

#[test]
fn async_event_requests_are_held_up_to_the_limit() {
    let mut h = Host::started(ModelConfig::default());
    assert_eq!(
        fifth_aer(&mut h),
        Status::AER_LIMIT_EXCEEDED,
        "the fifth; the four before are outstanding"
    );
    assert!(h.reap(0, Duration::from_millis(20)).is_none());
}

#[test]
fn format_zeroes_the_namespace() {
    let mut h = Host::started(two_namespaces());
    h.model.write_ns(1, 5, &[0xaa; 512]).unwrap();
    h.model.write_ns(3, 5, &[0xbb; 4096]).unwrap();
    h.admin(Sqe::new(adm::FORMAT_NVM).nsid(1)).ok();
    assert!(h.model.namespace_data(1).unwrap().iter().all(|&b| b == 0));
    assert_eq!(
        h.model.read_ns(3, 5, 1).unwrap(),
        vec![0xbb; 4096],
        "other namespaces untouched"
    );
    h.admin(Sqe::new(adm::FORMAT_NVM).nsid(u32::MAX)).ok();
    assert_eq!(
        h.model.read_ns(3, 5, 1).unwrap(),
        vec![0; 4096],
        "NSID FFFFFFFFh: all"
    );
    assert_eq!(
        h.admin(Sqe::new(adm::FORMAT_NVM).nsid(1).cdw(10, 1)).status,
        Status::INVALID_FORMAT,
        "LBA format 1"
    );
    assert_eq!(
        h.admin(Sqe::new(adm::FORMAT_NVM).nsid(1).cdw(10, 1 << 5)).status,
        Status::INVALID_FORMAT,
        "PI"
    );
    assert_eq!(
        h.admin(Sqe::new(adm::FORMAT_NVM).nsid(2)).status,
        Status::INVALID_NAMESPACE
    );
}

/// Shadow doorbells: the host writes tails and heads to memory; the model polls them and keeps
/// EventIdx, which the host checks with the Linux/SPDK `need_event` rule to decide whether to
/// ring the MMIO doorbell too.
fn shadow_doorbells(policy: EventIdxPolicy) {
    let mut h = Host::started(ModelConfig {
        event_idx: policy,
        ..Default::default()
    });
    h.create_qp(1, 8);
    let (shadow, eventidx) = (h.mem.alloc(PAGE), h.mem.alloc(PAGE));
    h.admin(Sqe::new(adm::DOORBELL_BUFFER_CONFIG).prp(shadow.get(), eventidx.get()))
        .ok();
    // The buffers are laid out like the doorbell registers.
    let stride = h.stride;
    let sq_db = |qid| BusAddr(shadow.get() + (regs::sq_tail_doorbell(qid, stride) - 0x1000) as u64);
    let cq_db = |qid| BusAddr(shadow.get() + (regs::cq_head_doorbell(qid, stride) - 0x1000) as u64);
    let ei = |qid| BusAddr(eventidx.get() + (regs::sq_tail_doorbell(qid, stride) - 0x1000) as u64);
    let before = h.model.stats();
    let mut rung = 0;
    for i in 0..20u32 {
        let old = h.qp(1).tail;
        // The model has seen `old` (it completed the command before): EventIdx follows from it.
        let want = match policy {
            EventIdxPolicy::Suppress => (old + 4) % 8,
            EventIdxPolicy::Notify => old,
        };
        assert_eq!(h.mem.read_u32(ei(1)), want, "round {i}");
        let cid = h.push(1, Sqe::new(io::FLUSH).nsid(1));
        let new = h.qp(1).tail;
        h.mem.write_u32(sq_db(1), new);
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        let event = h.mem.read_u32(ei(1));
        if (new.wrapping_sub(event).wrapping_sub(1) as u16) < (new.wrapping_sub(old) as u16) {
            h.ring(1);
            rung += 1;
        }
        let c = h
            .reap_quiet(1, TIMEOUT)
            .expect("completion through the shadow doorbell");
        assert_eq!(c.cid, cid, "round {i}");
        let head = h.qp(1).head;
        h.mem.write_u32(cq_db(1), head);
    }
    let after = h.model.stats();
    assert!(after.shadow_doorbell_updates - before.shadow_doorbell_updates >= 20);
    if policy == EventIdxPolicy::Suppress {
        assert_eq!(rung, 0, "EventIdx never asks for the MMIO doorbell");
    }
    // At most the rings counted above (a ring repeating the last value rung is invisible), and
    // perhaps the admin CQ head doorbell of the Doorbell Buffer Config command, which the model
    // may have seen after `before` was taken.
    let mmio = after.mmio_doorbell_writes - before.mmio_doorbell_writes;
    assert!(mmio <= rung + 1, "{mmio} MMIO doorbell writes seen, {rung} made");
    // A controller reset forgets the buffers: MMIO doorbells work again.
    h.disable();
    h.enable(good_cc(), 8);
    h.create_qp(1, 8);
    h.cmd(1, Sqe::new(io::FLUSH).nsid(1)).ok();
}

#[test]
fn shadow_doorbells_suppressed() {
    shadow_doorbells(EventIdxPolicy::Suppress);
}

#[test]
fn shadow_doorbells_notify() {
    shadow_doorbells(EventIdxPolicy::Notify);
}

#[test]
fn doorbell_buffer_config_checks_its_pages() {
    let mut h = Host::started(ModelConfig::default());
    let page = h.mem.alloc(PAGE).get();
    let c = h.admin(Sqe::new(adm::DOORBELL_BUFFER_CONFIG).prp(page + 64, page));
    assert_eq!(c.status, Status::INVALID_FIELD, "not page aligned");
    let c = h.admin(Sqe::new(adm::DOORBELL_BUFFER_CONFIG).prp(page, 0x5000));
    assert_eq!(c.status, Status::INVALID_FIELD, "EventIdx page unmapped");
    h.expect_dma_faults(&[0x5000]);
}

/// A namespace listing four formats, in 512 + 0 now.
fn formats_ns(nsid: u32) -> NamespaceConfig {
    NamespaceConfig::new(nsid, 512, 1040).with_formats(vec![
        LbaFormat::new(512, 0),
        LbaFormat::new(512, 8),
        LbaFormat::new(4096, 0),
        LbaFormat::new(4096, 64),
    ])
}

/// Format NVM CDW10: LBAF (bits 3:0, 13:12), MSET, PI, PIL.
fn format_dw10(lbaf: u32, mset: bool, pi: u32, pil: bool) -> u32 {
    (lbaf & 0xf) | (mset as u32) << 4 | pi << 5 | (pil as u32) << 8 | (lbaf >> 4) << 12
}

#[test]
fn format_changes_the_format_and_erases() {
    let mut h = Host::started(ModelConfig {
        namespaces: vec![formats_ns(1), NamespaceConfig::new(2, 4096, 16)],
        ..Default::default()
    });
    h.model.write_ns(1, 7, &[0xaa; 512]).unwrap();
    h.admin(
        Sqe::new(adm::FORMAT_NVM)
            .nsid(1)
            .cdw(10, format_dw10(3, true, 1, true)),
    )
    .ok();
    let (_, id) = identify(&mut h, 0, 1);
    // The storage (1040 × 512 bytes) in 4096 + 64-byte blocks.
    assert_eq!(le(&id, 0, 8), 1040 * 512 / 4160, "NSZE");
    assert_eq!(
        (id[25], id[26], id[29]),
        (3, 0x13, 0x9),
        "NLBAF, FLBAS (3, MSET), DPS (Type 1, first)"
    );
    let info = h.model.namespace_info(1).unwrap();
    assert_eq!((info.lba_format, info.blocks), (LbaFormat::new(4096, 64), 128));
    assert!(
        h.model.namespace_data(1).unwrap().iter().all(|&b| b == 0),
        "erased"
    );
    let tuple = PiTuple::read(&h.model.read_ns_meta(1, 0, 1).unwrap());
    assert_eq!(tuple, PiTuple::UNWRITTEN, "unwritten tuples turn checks off");

    let format = |h: &mut Host, nsid: u32, dw10: u32| {
        h.admin(Sqe::new(adm::FORMAT_NVM).nsid(nsid).cdw(10, dw10)).status
    };
    assert_eq!(
        format(&mut h, 1, format_dw10(4, false, 0, false)),
        Status::INVALID_FORMAT,
        "no LBAF4"
    );
    assert_eq!(
        format(&mut h, 1, format_dw10(2, false, 1, false)),
        Status::INVALID_FORMAT,
        "PI without metadata"
    );
    assert_eq!(
        format(&mut h, 1, format_dw10(1, false, 5, false)),
        Status::INVALID_FIELD,
        "PI type 5"
    );
    assert_eq!(
        format(&mut h, u32::MAX, format_dw10(1, false, 0, false)),
        Status::INVALID_FORMAT,
        "namespace 2 lists no LBAF1: none is formatted"
    );
    assert_eq!(
        h.model.namespace_info(1).unwrap().lba_format,
        LbaFormat::new(4096, 64)
    );
    assert_eq!(format(&mut h, 1, 3 << 9), Status::INVALID_FIELD, "SES 3");
    format(&mut h, 1, format_dw10(1, false, 0, false));
    let (_, id) = identify(&mut h, 0, 1);
    assert_eq!((le(&id, 0, 8), id[26], id[29]), (1040 * 512 / 520, 0x1, 0));

    // Placement and protection outside MC and DPC are refused.
    let restricted = NamespaceConfig {
        metadata_caps: MetadataCaps {
            extended: false,
            separate: true,
        },
        pi_caps: PiCaps {
            type2: false,
            first: false,
            ..PiCaps::ALL
        },
        ..formats_ns(1)
    };
    let mut h = Host::started(ModelConfig {
        namespaces: vec![restricted],
        ..Default::default()
    });
    let format = |h: &mut Host, dw10: u32| h.admin(Sqe::new(adm::FORMAT_NVM).nsid(1).cdw(10, dw10)).status;
    assert_eq!(
        format(&mut h, format_dw10(1, true, 0, false)),
        Status::INVALID_FORMAT,
        "MSET"
    );
    assert_eq!(
        format(&mut h, format_dw10(1, false, 2, false)),
        Status::INVALID_FORMAT,
        "Type 2"
    );
    assert_eq!(
        format(&mut h, format_dw10(1, false, 1, true)),
        Status::INVALID_FORMAT,
        "PI first"
    );
    assert_eq!(format(&mut h, format_dw10(1, false, 1, false)), Status::SUCCESS);
    let (_, id) = identify(&mut h, 0, 1);
    assert_eq!(
        (id[27], id[28], id[29]),
        (0x2, 0x15, 0x1),
        "MC, DPC (Types 1 and 3, last), DPS"
    );
}

#[test]
fn format_index_upper_bits() {
    let many: Vec<LbaFormat> = (0..20).map(|i| LbaFormat::new(512, i * 8)).collect();
    let ns = NamespaceConfig::new(1, 512, 64).with_formats(many);
    let mut h = Host::started(ModelConfig {
        namespaces: vec![ns],
        ..Default::default()
    });
    h.admin(
        Sqe::new(adm::FORMAT_NVM)
            .nsid(1)
            .cdw(10, format_dw10(18, true, 0, false)),
    )
    .ok();
    let (_, id) = identify(&mut h, 0, 1);
    assert_eq!(id[26], 0x2 | 0x10 | 0x1 << 5, "FLBAS: index 18 = 0x12");
    assert_eq!(
        h.model.namespace_info(1).unwrap().lba_format,
        LbaFormat::new(512, 144)
    );
    assert_eq!(
        h.admin(
            Sqe::new(adm::FORMAT_NVM)
                .nsid(1)
                .cdw(10, format_dw10(20, false, 0, false))
        )
        .status,
        Status::INVALID_FORMAT
    );
}

/// Submits an admin command whose completion may come after asynchronous event completions:
/// returns its own completion and the others in order.
fn admin_with_events(h: &mut Host, sqe: Sqe) -> (Cqe, Vec<Cqe>) {
    let cid = h.submit(0, sqe);
    let mut events = Vec::new();
    loop {
        let c = h.reap(0, TIMEOUT).expect("a completion");
        if c.cid == cid {
            return (c, events);
        }
        events.push(c);
    }
}

fn changed_list(h: &mut Host, rae: bool) -> Vec<u32> {
    let log = h.mem.alloc(PAGE);
    h.admin(Sqe::new(adm::GET_LOG_PAGE).prp(log.get(), 0).cdw(
        10,
        1023 << 16 | (rae as u32) << 15 | log_page::CHANGED_NS_LIST as u32,
    ))
    .ok();
    let b = h.mem.read_vec(log, PAGE);
    b.chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .take_while(|&n| n != 0)
        .collect()
}

/// Namespace Attribute Changed: Async Event Type Notice (2h), information 00h, log page 04h.
const NS_ATTR_CHANGED: u32 = 0x04_00_02;

#[test]
fn format_raises_namespace_attribute_changed() {
    let mut h = Host::started(ModelConfig {
        namespaces: vec![formats_ns(1), formats_ns(2)],
        ..Default::default()
    });
    let aec = |h: &mut Host, v: u32| {
        h.admin(
            Sqe::new(adm::SET_FEATURES)
                .cdw(10, feature::ASYNC_EVENT_CONFIG as u32)
                .cdw(11, v),
        )
        .ok()
    };
    let get_aec = |h: &mut Host| h.admin(Sqe::new(adm::GET_FEATURES).cdw(10, 0x0b)).ok().dw0;
    assert_eq!(get_aec(&mut h), 0, "notices off until the host enables them");
    let aer1 = h.submit(0, Sqe::new(adm::ASYNC_EVENT_REQUEST));
    let aer2 = h.submit(0, Sqe::new(adm::ASYNC_EVENT_REQUEST));
    // Disabled: the list records the change, no event.
    let fmt = |lbaf| {
        Sqe::new(adm::FORMAT_NVM)
            .nsid(1)
            .cdw(10, format_dw10(lbaf, false, 0, false))
    };
    let (c, ev) = admin_with_events(&mut h, fmt(1));
    c.ok();
    assert!(ev.is_empty(), "AEC bit 8 clear: {ev:?}");
    assert_eq!(changed_list(&mut h, false), [1]);
    assert_eq!(
        changed_list(&mut h, false),
        Vec::<u32>::new(),
        "read clears the list"
    );

    aec(&mut h, 1 << 8);
    assert_eq!(get_aec(&mut h), 1 << 8);
    let (c, ev) = admin_with_events(&mut h, fmt(2));
    c.ok();
    assert_eq!(ev.len(), 1);
    assert_eq!(
        (ev[0].cid, ev[0].dw0, ev[0].status),
        (aer1, NS_ATTR_CHANGED, Status::SUCCESS)
    );
    // Masked until the log page is read with RAE clear; the list keeps collecting.
    let (_, ev) = admin_with_events(
        &mut h,
        Sqe::new(adm::FORMAT_NVM)
            .nsid(2)
            .cdw(10, format_dw10(3, false, 0, false)),
    );
    assert!(ev.is_empty(), "masked: {ev:?}");
    let (_, ev) = admin_with_events(&mut h, fmt(2));
    assert!(ev.is_empty(), "the same format again changes nothing: {ev:?}");
    assert_eq!(changed_list(&mut h, true), [1, 2]);
    let (_, ev) = admin_with_events(&mut h, fmt(3));
    assert!(ev.is_empty(), "RAE set: still masked");
    assert_eq!(changed_list(&mut h, false), [1]);
    // The handle's hook: as if another host had formatted namespace 2.
    h.model.change_namespace(2, NamespaceFormat::new(1)).unwrap();
    let c = h.reap(0, TIMEOUT).expect("the second request completes");
    assert_eq!((c.cid, c.dw0), (aer2, NS_ATTR_CHANGED));
    assert_eq!(
        h.model.namespace_info(2).unwrap().lba_format,
        LbaFormat::new(512, 8)
    );
    assert_eq!(changed_list(&mut h, false), [2]);
    // No request left: the next event waits for one.
    h.model.change_namespace(1, NamespaceFormat::new(0)).unwrap();
    assert!(h.reap(0, Duration::from_millis(20)).is_none());
    let (c, ev) = admin_with_events(&mut h, Sqe::new(adm::ASYNC_EVENT_REQUEST));
    assert!(ev.is_empty());
    assert_eq!(c.dw0, NS_ATTR_CHANGED, "completed at once by the waiting event");
    assert!(
        h.model.change_namespace(1, NamespaceFormat::new(9)).is_err(),
        "not a listed format"
    );
}

#[test]
fn reset_forgets_requests_and_events() {
    let mut h = Host::started(ModelConfig {
        namespaces: vec![formats_ns(1)],
        ..Default::default()
    });
    h.admin(Sqe::new(adm::SET_FEATURES).cdw(10, 0x0b).cdw(11, 1 << 8))
        .ok();
    for _ in 0..4 {
        h.submit(0, Sqe::new(adm::ASYNC_EVENT_REQUEST));
    }
    h.disable();
    h.enable(good_cc(), 8);
    h.model.change_namespace(1, NamespaceFormat::new(1)).unwrap();
    assert!(
        h.reap(0, Duration::from_millis(20)).is_none(),
        "no request survives a reset"
    );
    h.admin(Sqe::new(adm::SET_FEATURES).cdw(10, 0x0b).cdw(11, 1 << 8))
        .ok();
    assert_eq!(
        fifth_aer(&mut h),
        Status::AER_LIMIT_EXCEEDED,
        "four outstanding again, after the reset"
    );
    assert_eq!(changed_list(&mut h, false), [1], "the log page survives");
}

#[test]
fn identify_command_set_structures() {
    let mut h = Host::started(two_namespaces());
    let id_csi = |h: &mut Host, cns: u32, nsid: u32, csi: u32| {
        let buf = h.mem.alloc(PAGE);
        let c = h.admin(
            Sqe::new(adm::IDENTIFY)
                .nsid(nsid)
                .prp(buf.get(), 0)
                .cdw(10, cns)
                .cdw(11, csi << 24),
        );
        (c.status, h.mem.read_vec(buf, PAGE))
    };
    let (s, nvm) = id_csi(&mut h, 0x05, 1, 0);
    assert_eq!(s, Status::SUCCESS);
    assert!(
        nvm.iter().all(|&b| b == 0),
        "NVM: no storage tags, 16-bit guard only"
    );
    assert_eq!(
        id_csi(&mut h, 0x05, 1, 2).0,
        Status::INVALID_FIELD,
        "not a zoned namespace"
    );
    assert_eq!(id_csi(&mut h, 0x05, 4, 0).0, Status::INVALID_NAMESPACE);
    assert_eq!(id_csi(&mut h, 0x06, 0, 0).0, Status::SUCCESS);
    assert_eq!(
        id_csi(&mut h, 0x06, 0, 1).0,
        Status::INVALID_FIELD,
        "CSI 1 is not offered"
    );
    let (_, sets) = id_csi(&mut h, 0x1c, 0, 0);
    assert_eq!(le(&sets, 0, 8), 0b101, "one combination: NVM and Zoned Namespace");
    let (_, list) = id_csi(&mut h, 0x07, 0, 0);
    assert_eq!((le(&list, 0, 4), le(&list, 4, 4)), (1, 3));
    let (_, list) = id_csi(&mut h, 0x07, 0, 2);
    assert_eq!(le(&list, 0, 4), 0, "no zoned namespaces");
    // I/O Command Set Profile: index 0 only.
    h.admin(Sqe::new(adm::SET_FEATURES).cdw(10, feature::IO_COMMAND_SET_PROFILE as u32))
        .ok();
    let c = h.admin(Sqe::new(adm::SET_FEATURES).cdw(10, 0x19).cdw(11, 1));
    assert_eq!(c.status, Status::IOCS_COMBINATION_REJECTED);
    assert_eq!(h.admin(Sqe::new(adm::GET_FEATURES).cdw(10, 0x19)).ok().dw0, 0);
}
