//! I/O command decoding.

use vfpoll_nvme_spec::cmd::io_op;

use super::*;

fn queue(t: &mut Target) -> (Cntlid, IoQueue) {
    let c = ready(t);
    features(t, c, true, 0x07, 0).unwrap();
    let q = io_connect(t, c, 1);
    (c, q)
}

fn rw(op: u8, nsid: u32, slba: u64, blocks: u32) -> Sqe {
    let mut s = sqe(op, nsid);
    s.set_lba_range(slba, blocks);
    s
}

fn refused(q: &mut IoQueue, s: &Sqe) -> Status {
    let c = q.decode(s).expect_err("refused");
    assert_eq!(c.cid, s.cid());
    assert_eq!(c.status & 1, 0);
    c.status()
}

#[test]
fn reads_and_writes_by_data_descriptor() {
    let mut t = target();
    let (c, mut q) = queue(&mut t);
    let sid = t.subsystem_id(SUB).unwrap();
    // A read: transport SGL, C2HData of NLB × 512 bytes.
    let r = sgl(rw(io_op::READ, 1, 10, 8), SGL_TRANSPORT, 4096);
    let req = q.decode(&r).unwrap();
    assert_eq!(
        req,
        IoRequest {
            cid: 0x1234,
            subsystem: sid,
            nsid: 1,
            op: IoOp::Read {
                slba: 10,
                blocks: 8,
                len: 4096
            }
        }
    );
    assert_eq!(req.data(), DataXfer::ToHost { len: 4096 });
    assert_eq!(req.success().status, 0);
    assert_eq!(
        req.failure(Status::LBA_OUT_OF_RANGE).status(),
        Status::LBA_OUT_OF_RANGE
    );
    // A write in the capsule, as Linux sends writes up to IOCCSZ × 16 − 64 bytes.
    let w = sgl(rw(io_op::WRITE, 1, 0, 16), SGL_IN_CAPSULE, 8192);
    match q.decode(&w).unwrap().op {
        IoOp::Write { data, fua, .. } => {
            assert_eq!(data, DataXfer::InCapsule { offset: 0, len: 8192 });
            assert!(!fua, "write cache enabled, no FUA");
        }
        op => panic!("{op:?}"),
    }
    // Larger: R2T.
    let w = sgl(rw(io_op::WRITE, 2, 0, 32), SGL_TRANSPORT, 128 * 1024);
    assert_eq!(
        q.decode(&w).unwrap().data(),
        DataXfer::FromHost { len: 128 * 1024 }
    );
    // Past the in-capsule size, a length not NLB × block size, no SGL, a read in the capsule.
    assert_eq!(
        refused(&mut q, &sgl(rw(io_op::WRITE, 1, 0, 17), SGL_IN_CAPSULE, 8704)),
        status::DATA_SGL_LENGTH_INVALID
    );
    assert_eq!(
        refused(&mut q, &sgl(rw(io_op::READ, 1, 0, 8), SGL_TRANSPORT, 4095)),
        status::DATA_SGL_LENGTH_INVALID
    );
    assert_eq!(
        refused(&mut q, &sgl(rw(io_op::READ, 1, 0, 8), SGL_TRANSPORT, 8192)),
        status::DATA_SGL_LENGTH_INVALID
    );
    assert_eq!(
        refused(&mut q, &rw(io_op::READ, 1, 0, 1)),
        status::DATA_SGL_LENGTH_INVALID
    );
    assert_eq!(
        refused(&mut q, &sgl(rw(io_op::READ, 1, 0, 1), SGL_IN_CAPSULE, 512)),
        Status::INVALID_FIELD
    );
    assert_eq!(
        refused(&mut q, &sgl(rw(io_op::READ, 1, 0, 1), 0x40, 512)),
        status::SGL_DESCRIPTOR_TYPE_INVALID
    );
    // FUA, and FUA implied once the host disables the volatile write cache; namespace 2 has
    // none, so its writes need no FUA.
    let mut f = sgl(rw(io_op::WRITE, 1, 0, 1), SGL_TRANSPORT, 512);
    f.set_fua(true);
    assert!(matches!(q.decode(&f).unwrap().op, IoOp::Write { fua: true, .. }));
    features(&mut t, c, true, 0x06, 0).unwrap();
    let w1 = sgl(rw(io_op::WRITE, 1, 0, 1), SGL_TRANSPORT, 512);
    assert!(matches!(q.decode(&w1).unwrap().op, IoOp::Write { fua: true, .. }));
    let w2 = sgl(rw(io_op::WRITE, 2, 0, 1), SGL_TRANSPORT, 4096);
    assert!(matches!(
        q.decode(&w2).unwrap().op,
        IoOp::Write { fua: false, .. }
    ));
    // The convenience path agrees, and logs with SQID FFFFh.
    assert_eq!(t.io_command(c, &r).unwrap(), q.decode(&r).unwrap());
    assert!(t.io_command(c, &rw(io_op::READ, 7, 0, 1)).is_err());
    let e = get_log(&mut t, c, lid::ERROR, 0, 64, 0, true).unwrap();
    assert_eq!(le16(&e, 8), 0xffff);
}

#[test]
fn ranges_limits_and_metadata() {
    let mut t = target();
    let (c, mut q) = queue(&mut t);
    let read = |slba, blocks, len| sgl(rw(io_op::READ, 1, slba, blocks), SGL_TRANSPORT, len);
    assert!(q.decode(&read(999, 1, 512)).is_ok(), "the last block");
    assert_eq!(refused(&mut q, &read(1000, 1, 512)), Status::LBA_OUT_OF_RANGE);
    assert_eq!(refused(&mut q, &read(995, 8, 4096)), Status::LBA_OUT_OF_RANGE);
    assert_eq!(
        refused(&mut q, &read(u64::MAX, 2, 1024)),
        Status::LBA_OUT_OF_RANGE
    );
    // 400 KiB on namespace 2 is within MDTS (1 MiB); with a 64 KiB MDTS, one block past it is
    // Invalid Field in Command.
    let big = sgl(rw(io_op::READ, 2, 0, 100), SGL_TRANSPORT, 100 * 4096);
    assert!(q.decode(&big).is_ok());
    let mut t2 = Target::new(
        TargetOptions {
            max_transfer: 64 * 1024,
            ..TargetOptions::default()
        },
        listeners(),
        vec![subsystem(SUB)],
    )
    .unwrap();
    let (_, mut q2) = queue(&mut t2);
    assert!(q2
        .decode(&sgl(rw(io_op::READ, 1, 0, 128), SGL_TRANSPORT, 65536))
        .is_ok());
    assert_eq!(
        refused(&mut q2, &sgl(rw(io_op::READ, 1, 0, 129), SGL_TRANSPORT, 66048)),
        Status::INVALID_FIELD
    );
    // Metadata pointer or PRINFO: refused, the format has no metadata.
    let mut m = read(0, 1, 512);
    m.dw[4] = 0x1000;
    assert_eq!(refused(&mut q, &m), Status::INVALID_FIELD);
    let mut p = read(0, 1, 512);
    p.dw[12] |= 1 << 29;
    assert_eq!(refused(&mut q, &p), Status::INVALID_FIELD);
    // Namespaces that do not exist, NSID 0, broadcast Flush.
    assert_eq!(
        refused(&mut q, &sgl(rw(io_op::READ, 3, 0, 1), SGL_TRANSPORT, 512)),
        Status::INVALID_NAMESPACE
    );
    assert_eq!(refused(&mut q, &sqe(io_op::FLUSH, 0)), Status::INVALID_NAMESPACE);
    assert_eq!(
        refused(&mut q, &sqe(io_op::FLUSH, u32::MAX)),
        Status::INVALID_NAMESPACE
    );
    assert_eq!(q.decode(&sqe(io_op::FLUSH, 2)).unwrap().op, IoOp::Flush);
    // Unknown opcodes: Compare, Write Uncorrectable, Verify, vendor, an admin opcode; Connect
    // again. (0Dh, 0Eh, 11h and 15h are the reservation commands, `resv`.)
    for op in [io_op::COMPARE, 0x04, 0x0c, 0x80, 0x06] {
        assert_eq!(refused(&mut q, &sqe(op, 1)), Status::INVALID_OPCODE, "{op:#x}");
    }
    assert_eq!(
        refused(&mut q, &connect_sqe(1, 127, 0)),
        status::COMMAND_SEQUENCE_ERROR
    );
    assert_eq!(
        refused(&mut q, &fabrics_sqe(fctype::PROPERTY_GET)),
        Status::INVALID_OPCODE
    );
    // Errors are logged with the queue's ID.
    let e = get_log(&mut t, c, lid::ERROR, 0, 64, 0, true).unwrap();
    assert_eq!((le16(&e, 8), le16(&e, 10)), (1, 0x1234));
}

#[test]
fn write_zeroes_and_dataset_management() {
    let mut t = target();
    let (_, mut q) = queue(&mut t);
    let mut wz = rw(io_op::WRITE_ZEROES, 1, 100, 65536);
    assert_eq!(refused(&mut q, &wz), Status::LBA_OUT_OF_RANGE);
    wz.set_lba_range(100, 900);
    wz.dw[12] |= 1 << 25;
    assert_eq!(
        q.decode(&wz).unwrap().op,
        IoOp::WriteZeroes {
            slba: 100,
            blocks: 900,
            deallocate: true,
            fua: false
        }
    );
    // Namespace 2 has no Write Zeroes.
    assert_eq!(
        refused(&mut q, &rw(io_op::WRITE_ZEROES, 2, 0, 1)),
        Status::INVALID_OPCODE
    );
    // Dataset Management, deallocate, two ranges in the capsule.
    let mut dsm = sgl(sqe(io_op::DATASET_MANAGEMENT, 1), SGL_IN_CAPSULE, 32);
    dsm.dw[10] = 1;
    dsm.dw[11] = 1 << 2;
    let req = q.decode(&dsm).unwrap();
    assert_eq!(
        req.op,
        IoOp::DatasetManagement {
            ranges: 2,
            deallocate: true,
            data: DataXfer::InCapsule { offset: 0, len: 32 },
            capacity: 1000
        }
    );
    let mut data = [0u8; 32];
    data[4..8].copy_from_slice(&8u32.to_le_bytes());
    data[8..16].copy_from_slice(&16u64.to_le_bytes());
    data[20..24].copy_from_slice(&0u32.to_le_bytes());
    assert_eq!(req.dsm_ranges(&data), Ok(vec![DsmRange { slba: 16, blocks: 8 }]));
    data[20..24].copy_from_slice(&10u32.to_le_bytes());
    data[24..32].copy_from_slice(&995u64.to_le_bytes());
    assert_eq!(req.dsm_ranges(&data), Err(Status::LBA_OUT_OF_RANGE));
    assert_eq!(req.dsm_ranges(&data[..16]), Err(status::DATA_SGL_LENGTH_INVALID));
    // The range list must be exactly NR + 1 descriptors long.
    let bad = sgl(dsm, SGL_IN_CAPSULE, 48);
    assert_eq!(refused(&mut q, &bad), status::DATA_SGL_LENGTH_INVALID);
    // On a namespace that cannot deallocate, nothing to do.
    let mut dsm2 = sgl(sqe(io_op::DATASET_MANAGEMENT, 2), SGL_TRANSPORT, 16);
    dsm2.dw[11] = 1 << 2;
    assert!(matches!(
        q.decode(&dsm2).unwrap().op,
        IoOp::DatasetManagement {
            deallocate: false,
            data: DataXfer::FromHost { len: 16 },
            ..
        }
    ));
}

#[test]
fn namespace_changes_reach_the_queue() {
    let mut t = target();
    let (_, mut q) = queue(&mut t);
    let sid = t.subsystem_id(SUB).unwrap();
    let read3 = sgl(rw(io_op::READ, 3, 0, 1), SGL_TRANSPORT, 512);
    assert_eq!(refused(&mut q, &read3), Status::INVALID_NAMESPACE);
    t.add_namespace(sid, NamespaceInfo::new(SUB, 3, "malloc:c", 512, 10))
        .unwrap();
    assert!(q.decode(&read3).is_ok());
    t.remove_namespace(sid, 1).unwrap();
    let read1 = sgl(rw(io_op::READ, 1, 0, 1), SGL_TRANSPORT, 512);
    assert_eq!(refused(&mut q, &read1), Status::INVALID_NAMESPACE);
    // A queue decoder from the target for the same queue sees the same.
    let mut again = t.io_queue(q.queue()).unwrap();
    assert!(again.decode(&read3).is_ok());
    // Removing the subsystem closes everything.
    let (queues, _) = t.remove_subsystem(sid).unwrap();
    assert_eq!(queues.len(), 2);
    assert_eq!(refused(&mut q, &read3), status::COMMAND_SEQUENCE_ERROR);
}

#[test]
fn sq_head_follows_the_connect_outcome() {
    let mut t = target();
    let o = t
        .connect(
            &connect_sqe(0, 31, 0),
            &connect_data(SUB, HOST, 0xffff, HOSTID),
            conn(1),
        )
        .unwrap();
    let mut head = SqHead::new(o.entries, o.sq_flow_control_disabled);
    // The Connect was entry 0: its completion reports head 1.
    assert_eq!(head.advance(), 1);
    for _ in 0..30 {
        head.advance();
    }
    assert_eq!(head.advance(), 0, "wrapped at 32 entries");
}
