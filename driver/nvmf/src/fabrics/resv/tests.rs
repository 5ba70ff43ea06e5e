//! Reservations against the specification's tables (NVMe Base 2.0 §8.19), then through the
//! target as hosts reach them (I/O queue decoding, admin commands, events, the state file).

use super::*;
use crate::fabrics::tests::{
    conn, connect_data, connect_sqe, enable, get_log, identify, io_connect, ready, sgl, sqe, HOST, HOSTID,
    SUB,
};
use crate::fabrics::{ns_off, Cntlid, IoOp, IoQueue, SubsystemId, Target, SGL_IN_CAPSULE, SGL_TRANSPORT};
use vfpoll_nvme_spec::cmd::{admin_op, io_op};

const A: HostId = [0xa; 16];
const B: HostId = [0xb; 16];
const C: HostId = [0xc; 16];

use ResvType::*;

const TYPES: [ResvType; 6] = [
    WriteExclusive,
    ExclusiveAccess,
    WriteExclusiveRegistrantsOnly,
    ExclusiveAccessRegistrantsOnly,
    WriteExclusiveAllRegistrants,
    ExclusiveAccessAllRegistrants,
];

fn registered(hosts: &[(HostId, u64)]) -> NsResv {
    let mut s = NsResv::default();
    for (h, k) in hosts {
        s.register(h, RegisterAction::Register, false, 0, *k, None)
            .unwrap();
    }
    s
}

/// NVMe Base 2.0 Figure 8.20, row by row: (type, holder R/W, registrant R/W,
/// non-registrant R/W); `true` is allowed. For the All Registrants types every registrant is
/// a holder.
#[test]
fn conflict_matrix_follows_the_specification() {
    /// Read and write allowed.
    type Rw = [bool; 2];
    let table: [(ResvType, Rw, Rw, Rw); 6] = [
        (WriteExclusive, [true, true], [true, false], [true, false]),
        (ExclusiveAccess, [true, true], [false, false], [false, false]),
        (
            WriteExclusiveRegistrantsOnly,
            [true, true],
            [true, true],
            [true, false],
        ),
        (
            ExclusiveAccessRegistrantsOnly,
            [true, true],
            [true, true],
            [false, false],
        ),
        (
            WriteExclusiveAllRegistrants,
            [true, true],
            [true, true],
            [true, false],
        ),
        (
            ExclusiveAccessAllRegistrants,
            [true, true],
            [true, true],
            [false, false],
        ),
    ];
    for t in TYPES {
        assert_eq!(ResvType::from_rtype(t as u8), Some(t));
    }
    assert_eq!((ResvType::from_rtype(0), ResvType::from_rtype(7)), (None, None));
    for (t, holder, registrant, other) in table {
        let mut s = registered(&[(A, 1), (B, 2)]);
        s.acquire(&A, AcquireAction::Acquire, t, 1, 0).unwrap();
        for (host, want, who) in [
            (A, holder, "holder"),
            (B, registrant, "registrant"),
            (C, other, "other"),
        ] {
            assert_eq!(
                [s.allows(&host, Access::Read), s.allows(&host, Access::Write)],
                want,
                "{t:?}: {who}"
            );
        }
        assert_eq!(s.is_holder(&B), t.all_registrants(), "{t:?}");
        // Without a reservation, everyone has access.
        s.release(&A, ReleaseAction::Release, t as u8, 1).unwrap();
        assert!(s.allows(&C, Access::Write) && s.allows(&C, Access::Read));
    }
}

#[test]
fn register_unregister_and_replace_check_keys() {
    let mut s = NsResv::default();
    s.register(&A, RegisterAction::Register, false, 0, 7, None)
        .unwrap();
    assert_eq!(s.generation, 1);
    // Registering again with the same key succeeds (and counts, as every successful
    // Register does); another key is a conflict.
    s.register(&A, RegisterAction::Register, false, 0, 7, None)
        .unwrap();
    assert_eq!((s.generation, s.key_of(&A)), (2, Some(7)));
    assert_eq!(
        s.register(&A, RegisterAction::Register, false, 0, 8, None),
        Err(RESERVATION_CONFLICT)
    );
    // Replace and unregister need the current key unless IEKEY; a non-registrant neither.
    assert_eq!(
        s.register(&A, RegisterAction::Replace, false, 6, 9, None),
        Err(RESERVATION_CONFLICT)
    );
    s.register(&A, RegisterAction::Replace, false, 7, 9, None)
        .unwrap();
    assert_eq!(s.key_of(&A), Some(9));
    s.register(&A, RegisterAction::Replace, true, 0, 10, None)
        .unwrap();
    assert_eq!(s.key_of(&A), Some(10));
    assert_eq!(
        s.register(&B, RegisterAction::Replace, true, 0, 1, None),
        Err(RESERVATION_CONFLICT)
    );
    assert_eq!(
        s.register(&B, RegisterAction::Unregister, true, 0, 0, None),
        Err(RESERVATION_CONFLICT)
    );
    assert_eq!(
        s.register(&A, RegisterAction::Unregister, false, 9, 0, None),
        Err(RESERVATION_CONFLICT)
    );
    // CPTPL applies with a successful command only.
    assert_eq!(
        s.register(&A, RegisterAction::Unregister, false, 9, 0, Some(true)),
        Err(RESERVATION_CONFLICT)
    );
    assert!(!s.ptpl);
    s.register(&A, RegisterAction::Unregister, false, 10, 0, Some(true))
        .unwrap();
    assert!(s.ptpl && s.registrants.is_empty());
    assert_eq!(s.generation, 5);
}

#[test]
fn acquire_needs_a_registration_and_a_free_namespace() {
    let mut s = registered(&[(A, 1), (B, 2)]);
    assert_eq!(
        s.acquire(&C, AcquireAction::Acquire, WriteExclusive, 0, 0),
        Err(RESERVATION_CONFLICT),
        "not a registrant"
    );
    assert_eq!(
        s.acquire(&A, AcquireAction::Acquire, WriteExclusive, 2, 0),
        Err(RESERVATION_CONFLICT),
        "wrong key"
    );
    let gen = s.generation;
    s.acquire(&A, AcquireAction::Acquire, WriteExclusive, 1, 0)
        .unwrap();
    assert_eq!(s.generation, gen, "Acquire does not count");
    // The holder again with the same type: success; another type or host: conflict.
    s.acquire(&A, AcquireAction::Acquire, WriteExclusive, 1, 0)
        .unwrap();
    assert_eq!(
        s.acquire(&A, AcquireAction::Acquire, ExclusiveAccess, 1, 0),
        Err(RESERVATION_CONFLICT)
    );
    assert_eq!(
        s.acquire(&B, AcquireAction::Acquire, WriteExclusive, 2, 0),
        Err(RESERVATION_CONFLICT)
    );
    // All Registrants: any registrant "acquires" what it already holds.
    let mut s = registered(&[(A, 1), (B, 2)]);
    s.acquire(&A, AcquireAction::Acquire, ExclusiveAccessAllRegistrants, 1, 0)
        .unwrap();
    s.acquire(&B, AcquireAction::Acquire, ExclusiveAccessAllRegistrants, 2, 0)
        .unwrap();
}

#[test]
fn preempt_takes_the_reservation_and_removes_registrations() {
    for action in [AcquireAction::Preempt, AcquireAction::PreemptAndAbort] {
        let mut s = registered(&[(A, 1), (B, 2), (C, 3)]);
        s.acquire(&A, AcquireAction::Acquire, WriteExclusiveRegistrantsOnly, 1, 0)
            .unwrap();
        let gen = s.generation;
        // B preempts A (PRKEY = A's key): A's registration goes, B holds, C hears of it.
        let n = s.acquire(&B, action, ExclusiveAccess, 2, 1).unwrap();
        assert_eq!(
            n,
            vec![
                (A, Notice::RegistrationPreempted),
                (C, Notice::ReservationPreempted)
            ]
        );
        assert_eq!(
            s.held,
            Some(Held {
                rtype: ExclusiveAccess,
                holder: B
            })
        );
        assert_eq!(s.key_of(&A), None);
        assert_eq!(s.generation, gen + 1);
        assert!(!s.allows(&A, Access::Read));
        // PRKEY 0 with a single holder is Invalid Field; a key nobody has is a conflict.
        assert_eq!(
            s.acquire(&C, action, ExclusiveAccess, 3, 0),
            Err(Status::INVALID_FIELD)
        );
        assert_eq!(
            s.acquire(&C, action, ExclusiveAccess, 3, 99),
            Err(RESERVATION_CONFLICT)
        );
        // A key that is not the holder's removes those registrants, reservation untouched.
        let n = s.acquire(&B, action, ExclusiveAccess, 2, 3).unwrap();
        assert_eq!(n, vec![(C, Notice::RegistrationPreempted)]);
        assert_eq!(s.held.map(|h| h.holder), Some(B));
        // The holder preempting itself changes the type.
        let n = s.acquire(&B, action, WriteExclusive, 2, 2).unwrap();
        assert!(n.is_empty());
        assert_eq!(s.held.map(|h| h.rtype), Some(WriteExclusive));
    }
    // Without a reservation, Preempt only removes registrations.
    let mut s = registered(&[(A, 1), (B, 2)]);
    let n = s
        .acquire(&A, AcquireAction::Preempt, WriteExclusive, 1, 2)
        .unwrap();
    assert_eq!(n, vec![(B, Notice::RegistrationPreempted)]);
    assert_eq!(s.held, None);
    // All Registrants with PRKEY 0: every other registration goes, the host holds the new type.
    let mut s = registered(&[(A, 1), (B, 2), (C, 3)]);
    s.acquire(&B, AcquireAction::Acquire, WriteExclusiveAllRegistrants, 2, 0)
        .unwrap();
    let n = s
        .acquire(&A, AcquireAction::Preempt, ExclusiveAccess, 1, 0)
        .unwrap();
    assert_eq!(
        n,
        vec![
            (B, Notice::RegistrationPreempted),
            (C, Notice::RegistrationPreempted)
        ]
    );
    assert_eq!(s.registrants.len(), 1);
    assert_eq!(
        s.held,
        Some(Held {
            rtype: ExclusiveAccess,
            holder: A
        })
    );
}

#[test]
fn release_and_clear() {
    let mut s = registered(&[(A, 1), (B, 2), (C, 3)]);
    s.acquire(&A, AcquireAction::Acquire, WriteExclusiveRegistrantsOnly, 1, 0)
        .unwrap();
    // Not the holder: success, no effect. The wrong type: Invalid Field. Wrong key: conflict.
    assert_eq!(
        s.release(&B, ReleaseAction::Release, WriteExclusiveRegistrantsOnly as u8, 2),
        Ok(vec![])
    );
    assert!(s.held.is_some());
    assert_eq!(
        s.release(&A, ReleaseAction::Release, WriteExclusive as u8, 1),
        Err(Status::INVALID_FIELD)
    );
    assert_eq!(
        s.release(&A, ReleaseAction::Release, 3, 9),
        Err(RESERVATION_CONFLICT)
    );
    // Registrants had access: they hear it was released.
    let n = s.release(&A, ReleaseAction::Release, 3, 1).unwrap();
    assert_eq!(
        n,
        vec![(B, Notice::ReservationReleased), (C, Notice::ReservationReleased)]
    );
    assert_eq!(s.held, None);
    // Write Exclusive: nobody else had access; nobody is told.
    s.acquire(&A, AcquireAction::Acquire, WriteExclusive, 1, 0)
        .unwrap();
    assert_eq!(s.release(&A, ReleaseAction::Release, 1, 1), Ok(vec![]));
    // Clear: everything goes; the others hear of a preemption.
    s.acquire(&A, AcquireAction::Acquire, ExclusiveAccess, 1, 0)
        .unwrap();
    let gen = s.generation;
    let n = s.release(&B, ReleaseAction::Clear, 0, 2).unwrap();
    assert_eq!(
        n,
        vec![
            (A, Notice::ReservationPreempted),
            (C, Notice::ReservationPreempted)
        ]
    );
    assert_eq!((s.held, s.registrants.len(), s.generation), (None, 0, gen + 1));
}

#[test]
fn unregistering_the_holder_releases() {
    // A single holder: its reservation goes with it; Registrants Only tells the others.
    let mut s = registered(&[(A, 1), (B, 2)]);
    s.acquire(&A, AcquireAction::Acquire, ExclusiveAccessRegistrantsOnly, 1, 0)
        .unwrap();
    let n = s
        .register(&A, RegisterAction::Unregister, false, 1, 0, None)
        .unwrap();
    assert_eq!(n, vec![(B, Notice::ReservationReleased)]);
    assert_eq!(s.held, None);
    // All Registrants: it stays until the last registrant leaves.
    let mut s = registered(&[(A, 1), (B, 2)]);
    s.acquire(&A, AcquireAction::Acquire, WriteExclusiveAllRegistrants, 1, 0)
        .unwrap();
    s.register(&A, RegisterAction::Unregister, false, 1, 0, None)
        .unwrap();
    assert!(s.is_holder(&B) && !s.allows(&A, Access::Write));
    s.register(&B, RegisterAction::Unregister, false, 2, 0, None)
        .unwrap();
    assert_eq!(s.held, None);
    assert!(s.allows(&A, Access::Write));
}

#[test]
fn report_lists_each_registered_controller() {
    let mut s = registered(&[(A, 0x1111), (B, 0x2222)]);
    s.acquire(&B, AcquireAction::Acquire, ExclusiveAccess, 0x2222, 0)
        .unwrap();
    s.ptpl = true;
    // A has two controllers, B none (it registered before a restart).
    let r = s.report(|h| if *h == A { vec![3, 5] } else { vec![] });
    assert_eq!(r.len(), 64 * 4);
    assert_eq!(u32::from_le_bytes(r[0..4].try_into().unwrap()), 2, "GEN");
    assert_eq!((r[4], u16::from_le_bytes([r[5], r[6]]), r[9]), (2, 3, 1));
    let entry = |i: usize| &r[64 * (i + 1)..64 * (i + 2)];
    for (i, (cntlid, holder, key, host)) in [
        (3u16, 0u8, 0x1111u64, A),
        (5, 0, 0x1111, A),
        (0xffff, 1, 0x2222, B),
    ]
    .into_iter()
    .enumerate()
    {
        let e = entry(i);
        assert_eq!(u16::from_le_bytes([e[0], e[1]]), cntlid);
        assert_eq!(e[2], holder);
        assert_eq!(u64::from_le_bytes(e[8..16].try_into().unwrap()), key);
        assert_eq!(&e[16..32], &host);
    }
}

#[test]
fn notice_log_queues_masks_and_counts() {
    let mut l = NoticeLog::default();
    assert_eq!(l.page(true), vec![0; 64], "empty: type 0");
    l.set_mask([1], Notice::ReservationReleased.mask_bit());
    assert!(!l.push(1, Notice::ReservationReleased), "masked");
    assert!(l.push(2, Notice::ReservationReleased));
    assert!(l.push(1, Notice::RegistrationPreempted));
    let p = l.page(false);
    assert_eq!(
        (u64::from_le_bytes(p[0..8].try_into().unwrap()), p[8], p[9]),
        (1, 2, 1)
    );
    assert_eq!(u32::from_le_bytes(p[12..16].try_into().unwrap()), 2);
    assert_eq!(l.page(true), p, "RAE kept it");
    let p = l.page(true);
    assert_eq!((p[0], p[8], p[9], p[12]), (2, 1, 0, 1));
    assert!(l.is_empty());
    // Past 255 unread, the oldest go and the count shows the gap.
    for _ in 0..300 {
        l.push(1, Notice::ReservationPreempted);
    }
    let p = l.page(true);
    assert_eq!(u64::from_le_bytes(p[0..8].try_into().unwrap()), 2 + 46);
    assert_eq!(p[9], 254);
}

// Through the target, as two hosts (HOSTID and a second one) reach it.

const HOST_B: &str = "nqn.2014-08.org.nvmexpress:uuid:bbbbbbbb-2222-3333-4444-555555555555";
const HOSTID_B: HostId = *b"second-host-id!!";

/// A second host's enabled controller of SUB and its I/O queue 1.
fn host_b(t: &mut Target) -> (Cntlid, IoQueue) {
    let o = t
        .connect(
            &connect_sqe(0, 31, 15_000),
            &connect_data(SUB, HOST_B, 0xffff, HOSTID_B),
            conn(1),
        )
        .unwrap();
    let c = Cntlid(o.cqe.dw0 as u16);
    enable(t, c);
    let q = t
        .connect(
            &connect_sqe(1, 127, 0),
            &connect_data(SUB, HOST_B, c.0, HOSTID_B),
            conn(1),
        )
        .unwrap()
        .io
        .unwrap();
    (c, q)
}

/// Runs a reservation command with CDW10 `dw10` and `data` (host to controller) on `q`.
fn resv_cmd(t: &mut Target, c: Cntlid, q: &mut IoQueue, op: u8, dw10: u32, data: &[u8]) -> Status {
    let mut s = sgl(sqe(op, 1), SGL_IN_CAPSULE, data.len() as u32);
    s.dw[10] = dw10;
    let req = q
        .decode(&s)
        .unwrap_or_else(|c| panic!("decode: {:?}", c.status()));
    assert!(matches!(req.op, IoOp::Reservation(_)));
    let (st, out) = t.reservation(c, &req, data);
    assert!(out.is_empty());
    st
}

fn keys(a: u64, b: u64) -> Vec<u8> {
    [a.to_le_bytes(), b.to_le_bytes()].concat()
}

fn report(t: &mut Target, c: Cntlid, q: &mut IoQueue, eds: bool) -> Result<Vec<u8>, Status> {
    let mut s = sgl(sqe(opcode::REPORT, 1), SGL_TRANSPORT, 4096);
    s.dw[10] = 4096 / 4 - 1;
    s.dw[11] = eds as u32;
    let req = q.decode(&s).unwrap();
    match t.reservation(c, &req, &[]) {
        (st, d) if st.is_success() => {
            assert_eq!(d.len(), 4096);
            Ok(d)
        }
        (st, _) => Err(st),
    }
}

fn rw(q: &mut IoQueue, op: u8) -> Result<(), Status> {
    let mut s = sgl(sqe(op, 1), SGL_TRANSPORT, 512);
    s.set_lba_range(0, 1);
    q.decode(&s).map(|_| ()).map_err(|c| c.status())
}

fn get_features_ns(
    t: &mut Target,
    c: Cntlid,
    set: bool,
    nsid: u32,
    dw10: u32,
    dw11: u32,
) -> Result<u32, Status> {
    let op = if set {
        admin_op::SET_FEATURES
    } else {
        admin_op::GET_FEATURES
    };
    let mut s = sgl(sqe(op, nsid), SGL_TRANSPORT, 0);
    s.dw[10] = dw10;
    s.dw[11] = dw11;
    match t.admin(c, &s, &[]) {
        crate::fabrics::AdminOutcome::Complete { cqe, .. } if cqe.status().is_success() => Ok(cqe.dw0),
        crate::fabrics::AdminOutcome::Complete { cqe, .. } => Err(cqe.status()),
        crate::fabrics::AdminOutcome::Held => panic!("held"),
    }
}

#[test]
fn two_hosts_fence_each_other_through_the_target() {
    let mut t = crate::fabrics::tests::target();
    let a = ready(&mut t);
    crate::fabrics::tests::features(&mut t, a, true, 0x07, 0).unwrap();
    let mut qa = io_connect(&mut t, a, 1);
    let (b, mut qb) = host_b(&mut t);
    // Identify: ONCS bit 5; RESCAP every type and IEKEY, no PTPL without a state file; shared.
    let ctrl = identify(&mut t, a, 1, 0).unwrap();
    assert_ne!(u16::from_le_bytes([ctrl[520], ctrl[521]]) & 1 << 5, 0);
    let ns = identify(&mut t, a, 0, 1).unwrap();
    assert_eq!((ns[ns_off::RESCAP], ns[ns_off::NMIC]), (0xfe, 1));
    assert_eq!(identify(&mut t, a, 8, 1).unwrap()[2], 0xfe);

    // Both register; A takes Write Exclusive.
    assert_eq!(
        resv_cmd(&mut t, a, &mut qa, opcode::REGISTER, 0, &keys(0, 0xaa)),
        Status::SUCCESS
    );
    assert_eq!(
        resv_cmd(&mut t, b, &mut qb, opcode::REGISTER, 0, &keys(0, 0xbb)),
        Status::SUCCESS
    );
    assert_eq!(
        resv_cmd(&mut t, b, &mut qb, opcode::ACQUIRE, 1 << 8, &keys(0xaa, 0)),
        RESERVATION_CONFLICT,
        "B with A's key"
    );
    assert_eq!(
        resv_cmd(&mut t, a, &mut qa, opcode::ACQUIRE, 1 << 8, &keys(0xaa, 0)),
        Status::SUCCESS
    );
    assert_eq!(
        resv_cmd(
            &mut t,
            a,
            &mut qa,
            opcode::ACQUIRE,
            1 << 8 | 1 << 3,
            &keys(0xaa, 0)
        ),
        Status::INVALID_FIELD,
        "IEKEY on Acquire"
    );
    // B reads, its writes, Flush, Write Zeroes and DSM conflict; A does everything.
    assert_eq!(rw(&mut qb, io_op::READ), Ok(()));
    assert_eq!(rw(&mut qb, io_op::WRITE), Err(RESERVATION_CONFLICT));
    let flush = sqe(io_op::FLUSH, 1);
    assert_eq!(qb.decode(&flush).unwrap_err().status(), RESERVATION_CONFLICT);
    assert!(qa.decode(&flush).is_ok());
    let mut wz = sqe(io_op::WRITE_ZEROES, 1);
    wz.set_lba_range(0, 1);
    assert_eq!(qb.decode(&wz).unwrap_err().status(), RESERVATION_CONFLICT);
    let mut dsm = sgl(sqe(io_op::DATASET_MANAGEMENT, 1), SGL_TRANSPORT, 16);
    dsm.dw[11] = 1 << 2;
    assert_eq!(qb.decode(&dsm).unwrap_err().status(), RESERVATION_CONFLICT);
    assert_eq!(rw(&mut qa, io_op::WRITE), Ok(()));
    // Namespace 2 has no reservation.
    let mut w2 = sgl(sqe(io_op::WRITE, 2), SGL_TRANSPORT, 4096);
    w2.set_lba_range(0, 1);
    assert!(qb.decode(&w2).is_ok());
    // The report (extended data structure only) shows both, A holding.
    assert_eq!(report(&mut t, b, &mut qb, false), Err(HOST_ID_INCONSISTENT));
    let r = report(&mut t, b, &mut qb, true).unwrap();
    assert_eq!((r[4], r[5]), (1, 2));
    assert_eq!(u16::from_le_bytes([r[64], r[65]]), a.0);
    assert_eq!((r[66], &r[80..96]), (1, &HOSTID[..]));
    assert_eq!((u16::from_le_bytes([r[128], r[129]]), r[130]), (b.0, 0));
    assert_eq!(&r[144..160], &HOSTID_B[..]);

    // An AER held on A; B preempts A: A's registration goes, A's writes now conflict, and
    // A's controller gets the notice (log 80h) with its event.
    let aer = sqe(admin_op::ASYNC_EVENT_REQUEST, 0);
    assert_eq!(t.admin(a, &aer, &[]), crate::fabrics::AdminOutcome::Held);
    assert_eq!(
        resv_cmd(&mut t, b, &mut qb, opcode::ACQUIRE, 1 << 8 | 1, &keys(0xbb, 0xaa)),
        Status::SUCCESS
    );
    assert_eq!(rw(&mut qa, io_op::WRITE), Err(RESERVATION_CONFLICT));
    assert_eq!(rw(&mut qb, io_op::WRITE), Ok(()));
    let ev = t.take_reservation_events();
    assert_eq!(ev.len(), 1);
    assert_eq!((ev[0].cntlid, ev[0].cqe.dw0), (a, 6 | 0x80 << 16));
    assert!(t.take_reservation_events().is_empty());
    let p = get_log(&mut t, a, LOG_PAGE, 0, 64, 0, false).unwrap();
    assert_eq!(
        (p[8], p[9], u32::from_le_bytes(p[12..16].try_into().unwrap())),
        (1, 0, 1)
    );
    assert_eq!(
        get_log(&mut t, a, LOG_PAGE, 0, 64, 0, false).unwrap()[8],
        0,
        "read once"
    );
    // The mask silences a notice type: B releases (Write Exclusive: nobody else had access),
    // A registers again, B takes Write Exclusive - Registrants Only and releases it.
    assert_eq!(
        get_features_ns(&mut t, a, true, 1, feature::NOTIFICATION_MASK as u32, 1 << 2),
        Ok(0)
    );
    assert_eq!(
        get_features_ns(&mut t, a, false, 1, feature::NOTIFICATION_MASK as u32, 0),
        Ok(1 << 2)
    );
    assert_eq!(
        resv_cmd(
            &mut t,
            b,
            &mut qb,
            opcode::RELEASE,
            1 << 8,
            &0xbbu64.to_le_bytes()
        ),
        Status::SUCCESS
    );
    assert_eq!(
        resv_cmd(&mut t, a, &mut qa, opcode::REGISTER, 0, &keys(0, 0xa2)),
        Status::SUCCESS
    );
    assert_eq!(
        resv_cmd(&mut t, b, &mut qb, opcode::ACQUIRE, 3 << 8, &keys(0xbb, 0)),
        Status::SUCCESS
    );
    assert_eq!(rw(&mut qa, io_op::WRITE), Ok(()), "a registrant writes");
    assert_eq!(
        resv_cmd(
            &mut t,
            b,
            &mut qb,
            opcode::RELEASE,
            3 << 8,
            &0xbbu64.to_le_bytes()
        ),
        Status::SUCCESS
    );
    assert_eq!(
        get_log(&mut t, a, LOG_PAGE, 0, 64, 0, false).unwrap()[8],
        0,
        "masked"
    );
    // PTPL needs a state file.
    assert_eq!(
        get_features_ns(&mut t, a, true, 1, feature::PERSISTENCE as u32, 1),
        Err(Status::INVALID_FIELD)
    );
    assert_eq!(
        resv_cmd(
            &mut t,
            a,
            &mut qa,
            opcode::REGISTER,
            3 << 30 | 2,
            &keys(0xa2, 0xa3)
        ),
        Status::INVALID_FIELD
    );
    assert_eq!(
        get_features_ns(&mut t, a, false, 1, feature::PERSISTENCE as u32, 0),
        Ok(0)
    );
    let sid: SubsystemId = t.subsystem_id(SUB).unwrap();
    assert_eq!(t.reservation_state(sid, 1).registrants.len(), 2);
    // Clear by A ends every registration; the generation stays.
    assert_eq!(
        resv_cmd(&mut t, a, &mut qa, opcode::RELEASE, 1, &0xa2u64.to_le_bytes()),
        Status::SUCCESS
    );
    assert_eq!(
        t.reservation_state(sid, 1),
        NsResv {
            generation: 5,
            ..NsResv::default()
        }
    );
    let _ = HOST;
}

#[test]
fn persisted_state_survives_a_new_target() {
    let dir = std::env::temp_dir().join(format!("vfpoll-resv-target-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut t = crate::fabrics::tests::target();
    t.set_reservation_store(ResvStore::open(&dir).unwrap()).unwrap();
    let a = ready(&mut t);
    crate::fabrics::tests::features(&mut t, a, true, 0x07, 0).unwrap();
    let mut qa = io_connect(&mut t, a, 1);
    let (b, mut qb) = host_b(&mut t);
    assert_eq!(identify(&mut t, a, 0, 1).unwrap()[ns_off::RESCAP], 0xff);
    // A registers with CPTPL set, B without a change; A holds Exclusive Access.
    assert_eq!(
        resv_cmd(&mut t, a, &mut qa, opcode::REGISTER, 3 << 30, &keys(0, 0xaa)),
        Status::SUCCESS
    );
    assert_eq!(
        resv_cmd(&mut t, b, &mut qb, opcode::REGISTER, 0, &keys(0, 0xbb)),
        Status::SUCCESS
    );
    assert_eq!(
        resv_cmd(&mut t, a, &mut qa, opcode::ACQUIRE, 2 << 8, &keys(0xaa, 0)),
        Status::SUCCESS
    );
    assert_eq!(
        get_features_ns(&mut t, b, false, 1, feature::PERSISTENCE as u32, 0),
        Ok(1)
    );
    // PTPL of namespace 2 set by Set Features, then nothing else: still written.
    assert_eq!(
        get_features_ns(&mut t, b, true, 2, feature::PERSISTENCE as u32, 1),
        Ok(0)
    );
    let before = t.reservation_state(t.subsystem_id(SUB).unwrap(), 1);
    drop(t);

    // A new target (a restart) with the same directory: the state is back, B is fenced.
    let mut t = crate::fabrics::tests::target();
    t.set_reservation_store(ResvStore::open(&dir).unwrap()).unwrap();
    let sid = t.subsystem_id(SUB).unwrap();
    assert_eq!(t.reservation_state(sid, 1), before);
    assert!(t.reservation_state(sid, 2).ptpl);
    let (b, mut qb) = host_b(&mut t);
    assert_eq!(rw(&mut qb, io_op::READ), Err(RESERVATION_CONFLICT));
    let r = report(&mut t, b, &mut qb, true).unwrap();
    assert_eq!((r[4], r[5], r[9]), (2, 2, 1));
    assert_eq!(
        u16::from_le_bytes([r[64], r[65]]),
        0xffff,
        "A has no controller yet"
    );
    // Clearing PTPL (CPTPL 10b) drops the namespace from the file; a restart forgets it.
    assert_eq!(
        resv_cmd(&mut t, b, &mut qb, opcode::REGISTER, 2 << 30, &keys(0, 0xbb)),
        Status::SUCCESS
    );
    drop(t);
    let mut t = crate::fabrics::tests::target();
    t.set_reservation_store(ResvStore::open(&dir).unwrap()).unwrap();
    assert_eq!(t.reservation_state(sid, 1), NsResv::default());
    assert!(t.reservation_state(sid, 2).ptpl);
    // A reload that removes namespace 2 keeps its PTPL state in the file; adding it back
    // restores it. Namespace 1 (no PTPL now) loses its state with its removal.
    let (b, mut qb) = host_b(&mut t);
    assert_eq!(
        resv_cmd(&mut t, b, &mut qb, opcode::REGISTER, 0, &keys(0, 0xbb)),
        Status::SUCCESS
    );
    let ns2 = t.subsystem(sid).unwrap().namespaces[1].clone();
    let ns1 = t.subsystem(sid).unwrap().namespaces[0].clone();
    t.remove_namespace(sid, 2).unwrap();
    t.remove_namespace(sid, 1).unwrap();
    assert_eq!(t.reservations_not_served(), vec![format!("namespace 2 of {SUB}")]);
    t.add_namespace(sid, ns2).unwrap();
    t.add_namespace(sid, ns1).unwrap();
    assert!(t.reservation_state(sid, 2).ptpl);
    assert_eq!(t.reservation_state(sid, 1), NsResv::default());
    assert!(t.reservations_not_served().is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}
