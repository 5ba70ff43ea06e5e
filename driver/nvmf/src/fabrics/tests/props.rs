//! Properties: any command, whatever its bytes, gets a well-formed answer and never a panic
//! (256 cases per property by default; PROPTEST_CASES for longer runs).

use proptest::prelude::*;
use vfpoll_nvme_spec::cmd::io_op;

use super::*;

/// Opcodes worth hitting often, and anything else.
fn opcode(known: &'static [u8]) -> impl Strategy<Value = u8> {
    prop_oneof![3 => proptest::sample::select(known), 1 => any::<u8>()]
}

/// A value from a few interesting ones, or anything.
fn pick(interesting: &'static [u32]) -> impl Strategy<Value = u32> {
    prop_oneof![3 => proptest::sample::select(interesting), 1 => any::<u32>()]
}

/// The data length `s` asks for when well formed: what a host that means it would put in
/// its SGL (so that half the generated commands get past the length checks).
fn expected_len(s: &Sqe, admin: bool) -> u32 {
    let nlb = (s.dw[12] & 0xffff) + 1;
    let block = if s.nsid() == 2 { 4096 } else { 512 };
    if !admin {
        return match s.opcode() {
            io_op::READ | io_op::WRITE => nlb * block,
            io_op::DATASET_MANAGEMENT => ((s.dw[10] & 0xff) + 1) * 16,
            FABRICS_OPCODE => 1024,
            _ => 0,
        };
    }
    match s.opcode() {
        admin_op::IDENTIFY => 4096,
        admin_op::GET_LOG_PAGE => ((s.dw[11] & 0xffff) << 16 | s.dw[10] >> 16)
            .wrapping_add(1)
            .wrapping_mul(4),
        admin_op::GET_FEATURES => 16,
        FABRICS_OPCODE => 1024,
        _ => 0,
    }
}

prop_compose! {
    fn any_sqe(known: &'static [u8], admin: bool)(
        op in opcode(known),
        psdt in prop_oneof![4 => Just(1u32), 1 => 0u32..4],
        fuse in prop_oneof![4 => Just(0u32), 1 => 0u32..4],
        cid in any::<u16>(),
        nsid in pick(&[0, 1, 2, 3, 1024, 1025, u32::MAX, u32::MAX - 1]),
        fct in pick(&[0x00, 0x01, 0x04, 0x05, 0x06, 0x08]),
        sgl_id in pick(&[SGL_TRANSPORT as u32, SGL_TRANSPORT as u32, SGL_IN_CAPSULE as u32, 0x00, 0x40]),
        sgl_len in pick(&[0, 16, 32, 512, 1024, 4096, 8192, 16384, 1 << 20]),
        consistent in any::<bool>(),
        sgl_addr in pick(&[0, 0, 16, 8192]),
        // CDW10's low byte: CNS, LID, FID, NR; its high half: NUMDL, QID.
        low in pick(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 0x0b, 0x0f, 0x14, 0x1c, 0x70, 0x81, 0xff]),
        sel in prop_oneof![3 => Just(0u32), 1 => 0u32..0x100],
        high in pick(&[0, 0, 3, 15, 127, 255, 1023, 0xffff]),
        dws in proptest::collection::vec(
            prop_oneof![3 => Just(0u32), 1 => pick(&[1, 2, 7, 8, 100, 999, 0xffff, 1 << 23, 0x0046_0014])],
            8,
        ),
    ) -> Sqe {
        let mut s = Sqe::default();
        s.dw[0] = op as u32 | fuse << 8 | psdt << 14 | (cid as u32) << 16;
        s.dw[1] = if op == FABRICS_OPCODE { fct } else { nsid };
        s.dw[2] = dws[0];
        s.dw[4] = if dws[1] < 8 { 0 } else { dws[1] };
        s.dw[6] = sgl_addr;
        s.dw[9] = (sgl_id & 0xff) << 24;
        s.dw[10] = low | sel << 8 | high << 16;
        s.dw[11..16].copy_from_slice(&dws[2..7]);
        s.dw[8] = if consistent { expected_len(&s, admin) } else { sgl_len };
        s
    }
}

const ADMIN_OPS: &[u8] = &[
    admin_op::IDENTIFY,
    admin_op::GET_LOG_PAGE,
    admin_op::GET_FEATURES,
    admin_op::SET_FEATURES,
    admin_op::ASYNC_EVENT_REQUEST,
    admin_op::ABORT,
    0x18,
    FABRICS_OPCODE,
];

const IO_OPS: &[u8] = &[
    io_op::READ,
    io_op::WRITE,
    io_op::FLUSH,
    io_op::WRITE_ZEROES,
    io_op::DATASET_MANAGEMENT,
    FABRICS_OPCODE,
];

proptest! {
    #[test]
    fn admin_commands_always_get_a_well_formed_answer(
        cmds in proptest::collection::vec(
            (any_sqe(ADMIN_OPS, true), 0usize..3, proptest::collection::vec(any::<u8>(), 0..32)),
            1..8,
        ),
    ) {
        let mut t = target();
        let io = ready(&mut t);
        let disc = admin_connect_as(&mut t, DISCOVERY_NQN, HOST, 0);
        enable(&mut t, disc);
        let cntlids = [io, disc, Cntlid(0x7777)];
        for (sqe, who, in_data) in cmds {
            let c = cntlids[who];
            match t.admin(c, &sqe, &in_data) {
                AdminOutcome::Held => {
                    prop_assert_eq!(sqe.opcode(), admin_op::ASYNC_EVENT_REQUEST);
                }
                AdminOutcome::Complete { cqe, data, .. } => {
                    prop_assert_eq!(cqe.cid, sqe.cid());
                    prop_assert_eq!(cqe.status & 1, 0);
                    prop_assert!(data.len() <= TargetOptions::default().max_transfer as usize);
                    if !cqe.status().is_success() {
                        prop_assert!(data.is_empty());
                        prop_assert_eq!((cqe.dw0, cqe.dw1), (0, 0));
                    } else if !data.is_empty() {
                        // Data only ever goes out through a transport SGL of exactly its size.
                        prop_assert_eq!(sqe.dw[9] >> 24, SGL_TRANSPORT as u32);
                        prop_assert_eq!(sqe.dw[8] as usize, data.len());
                    }
                }
            }
        }
        // The controllers still answer.
        for c in [io, disc] {
            let ka = sqe(0x18, 0);
            let ok = t.admin(c, &ka, &[]).cqe().map(|c| c.status().is_success());
            prop_assert!(ok.is_some());
        }
    }

    #[test]
    fn io_commands_decode_within_the_namespace_or_are_refused(
        cmds in proptest::collection::vec(any_sqe(IO_OPS, false), 1..16),
    ) {
        let mut t = target();
        let c = ready(&mut t);
        features(&mut t, c, true, 0x07, 0).unwrap();
        let mut q = io_connect(&mut t, c, 1);
        let s = subsystem(SUB);
        let opts = TargetOptions::default();
        for sqe in cmds {
            let via_target = t.io_command(c, &sqe);
            match q.decode(&sqe) {
                Err(cqe) => {
                    prop_assert_eq!(cqe.cid, sqe.cid());
                    prop_assert_eq!(cqe.status & 1, 0);
                    prop_assert!(!cqe.status().is_success());
                    prop_assert_eq!(via_target.unwrap_err(), cqe);
                }
                Ok(req) => {
                    prop_assert_eq!(via_target, Ok(req));
                    prop_assert_eq!(req.cid, sqe.cid());
                    let ns = s.namespaces.iter().find(|n| n.nsid == req.nsid);
                    prop_assert!(ns.is_some());
                    let ns = ns.unwrap();
                    let in_range = |slba: u64, blocks: u32| slba + blocks as u64 <= ns.blocks && blocks >= 1;
                    match req.op {
                        IoOp::Read { slba, blocks, len } => {
                            prop_assert!(in_range(slba, blocks));
                            prop_assert_eq!(len as u64, blocks as u64 * ns.block_size as u64);
                            prop_assert!(len <= opts.max_transfer);
                        }
                        IoOp::Write { slba, blocks, data, .. } => {
                            prop_assert!(in_range(slba, blocks));
                            prop_assert_eq!(data.len() as u64, blocks as u64 * ns.block_size as u64);
                            prop_assert!(data.len() <= opts.max_transfer);
                            let in_capsule_ok = match data {
                                DataXfer::InCapsule { offset, len } => offset + len <= opts.in_capsule_data,
                                DataXfer::FromHost { .. } => true,
                                _ => false,
                            };
                            prop_assert!(in_capsule_ok);
                        }
                        IoOp::WriteZeroes { slba, blocks, .. } => {
                            prop_assert!(ns.write_zeroes && in_range(slba, blocks));
                        }
                        IoOp::DatasetManagement { ranges, data, capacity, .. } => {
                            prop_assert!((1..=256).contains(&ranges));
                            prop_assert_eq!(data.len(), ranges as u32 * 16);
                            prop_assert_eq!(capacity, ns.blocks);
                        }
                        IoOp::Flush => {}
                        IoOp::Reservation(r) => {
                            prop_assert!(r.data.len() <= opts.max_transfer);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn connect_of_any_bytes_never_panics(
        sqe in any_sqe(&[FABRICS_OPCODE], false),
        data in proptest::collection::vec(any::<u8>(), 1024),
        nqn in proptest::sample::select(&[SUB, OTHER, DISCOVERY_NQN, "nqn.x"][..]),
        patch in any::<bool>(),
    ) {
        let mut t = target();
        let existing = ready(&mut t);
        let mut d: [u8; 1024] = data.try_into().unwrap();
        if patch {
            // Keep the NQN fields valid so that the later checks run.
            d[256..512].fill(0);
            d[256..256 + nqn.len()].copy_from_slice(nqn.as_bytes());
            d[512..768].fill(0);
            d[512..512 + HOST.len()].copy_from_slice(HOST.as_bytes());
            if d[20] & 1 == 0 {
                d[16..18].copy_from_slice(&existing.0.to_le_bytes());
            }
        }
        let before = t.controllers().len();
        match t.connect(&sqe, &d, conn(1)) {
            Ok(o) => {
                prop_assert!(o.cqe.status().is_success());
                prop_assert_eq!(o.cqe.cid, sqe.cid());
                prop_assert_eq!(Cntlid(o.cqe.dw0 as u16), o.queue.cntlid);
                prop_assert!(o.entries >= 2);
                prop_assert_eq!(o.io.is_some(), o.queue.qid != 0);
                prop_assert_eq!(t.controllers().len(), before + (o.queue.qid == 0) as usize);
            }
            Err(cqe) => {
                prop_assert_eq!(cqe.cid, sqe.cid());
                prop_assert!(!cqe.status().is_success() && cqe.status().dnr());
                prop_assert_eq!(t.controllers().len(), before);
            }
        }
    }
}
