//! Connect, properties, keep-alive and teardown.

use std::time::{Duration, Instant};

use super::*;

fn refused(r: Result<ConnectOutcome, Cqe>) -> Cqe {
    match r {
        Ok(o) => panic!("connected: {o:?}"),
        Err(c) => {
            assert_eq!(c.cid, 0x1234, "the Connect's command ID");
            assert!(c.status().dnr(), "Connect refusals carry DNR");
            c
        }
    }
}

#[test]
fn admin_connect_allocates_controller_ids() {
    let mut t = target();
    let o = t
        .connect(
            &connect_sqe(0, 31, 5000),
            &connect_data(SUB, HOST, 0xffff, HOSTID),
            conn(1),
        )
        .unwrap();
    assert!(o.cqe.status().is_success());
    assert_eq!(o.cqe.dw0 >> 16, 0, "AUTHREQ clear: no authentication");
    assert_eq!((o.entries, o.in_capsule_max, o.discovery), (32, 8192, false));
    assert!(o.io.is_none());
    let a = Cntlid(o.cqe.dw0 as u16);
    assert_eq!(a, Cntlid(1));
    let b = admin_connect(&mut t);
    assert_ne!(a, b);
    // Identify's CNTLID must equal Connect's (Linux: "Mismatching cntlid").
    enable(&mut t, b);
    let id = identify(&mut t, b, 0x01, 0).unwrap();
    assert_eq!(le16(&id, ctrl_off::CNTLID), b.0);
    // A dropped controller's ID is not handed out again at once.
    t.drop_controller(a);
    let c = admin_connect(&mut t);
    assert!(c != a && c != b, "{c:?}");
    let info = t.controllers();
    assert_eq!(info.len(), 2);
    assert_eq!(info[0].hostnqn, HOST);
    assert_eq!(info[0].kato_ms, 15_000);
}

#[test]
fn connect_errors_point_at_the_field() {
    let mut t = target();
    let data = connect_data(SUB, HOST, 0xffff, HOSTID);
    // Unknown subsystem: Connect Invalid Parameters, IATTR 1 (data), IPO 256 (SUBNQN).
    let c = refused(t.connect(
        &connect_sqe(0, 31, 0),
        &connect_data("nqn.2024-01.io.vfpoll:nope", HOST, 0xffff, HOSTID),
        conn(1),
    ));
    assert_eq!(c.status(), status::CONNECT_INVALID_PARAMETERS);
    assert_eq!(c.dw0, 1 << 16 | 256);
    assert_eq!(
        c.status,
        0x4182 << 1,
        "SCT 1, SC 82h, DNR: Linux logs ret=16770 (0x4182)"
    );
    // A host the subsystem does not allow: Connect Invalid Host, pointing at HOSTNQN.
    let c = refused(t.connect(
        &connect_sqe(0, 31, 0),
        &connect_data(OTHER, HOST, 0xffff, HOSTID),
        conn(1),
    ));
    assert_eq!(c.status(), status::CONNECT_INVALID_HOST);
    assert_eq!(c.dw0, 1 << 16 | 512);
    assert!(t
        .connect(
            &connect_sqe(0, 31, 0),
            &connect_data(OTHER, HOST2, 0xffff, HOSTID),
            conn(1)
        )
        .is_ok());
    // RECFMT other than 0.
    let mut s = connect_sqe(0, 31, 0);
    s.dw[10] |= 1;
    assert_eq!(
        refused(t.connect(&s, &data, conn(1))).status(),
        status::CONNECT_INCOMPATIBLE_FORMAT
    );
    // The dynamic model: an admin queue's CNTLID must be FFFFh (IPO 16 in the data).
    let c = refused(t.connect(
        &connect_sqe(0, 31, 0),
        &connect_data(SUB, HOST, 1, HOSTID),
        conn(1),
    ));
    assert_eq!(
        (c.status(), c.dw0),
        (status::CONNECT_INVALID_PARAMETERS, 1 << 16 | 16)
    );
    // SQSIZE 0, and an admin queue past 32 entries: IATTR 0 (the SQE), IPO 44.
    for sqsize in [0, 32] {
        let c = refused(t.connect(&connect_sqe(0, sqsize, 0), &data, conn(1)));
        assert_eq!(
            (c.status(), c.dw0),
            (status::CONNECT_INVALID_PARAMETERS, 44),
            "{sqsize}"
        );
    }
    // An NQN without its NUL in 256 bytes.
    let mut long = data;
    long[256..512].fill(b'n');
    let c = refused(t.connect(&connect_sqe(0, 31, 0), &long, conn(1)));
    assert_eq!(c.dw0, 1 << 16 | 256);
    let mut bad_host = data;
    bad_host[512..520].copy_from_slice(b"notanqn\0");
    let c = refused(t.connect(&connect_sqe(0, 31, 0), &bad_host, conn(1)));
    assert_eq!(c.dw0, 1 << 16 | 512);
    // Anything but Connect first, and Connect data not 1024 bytes.
    let c = refused(t.connect(&sqe(admin_op::IDENTIFY, 0), &data, conn(1)));
    assert_eq!(c.status(), Status::INVALID_OPCODE);
    let short = sgl(connect_sqe(0, 31, 0), SGL_IN_CAPSULE, 512);
    assert_eq!(
        refused(t.connect(&short, &data, conn(1))).status(),
        status::DATA_SGL_LENGTH_INVALID
    );
    assert!(t.controllers().len() == 1, "only OTHER's controller was created");
}

#[test]
fn io_queue_connect_checks_controller_queue_and_size() {
    let mut t = target();
    let c = admin_connect(&mut t);
    // Before CC.EN: Command Sequence Error.
    let r = t.connect(
        &connect_sqe(1, 127, 0),
        &connect_data(SUB, HOST, c.0, HOSTID),
        conn(1),
    );
    assert_eq!(refused(r).status(), status::COMMAND_SEQUENCE_ERROR);
    enable(&mut t, c);
    // Linux asks for its queues first.
    assert_eq!(features(&mut t, c, true, 0x07, 1 | 1 << 16), Ok(1 | 1 << 16));
    let q1 = io_connect(&mut t, c, 1);
    assert_eq!(q1.queue(), QueueRef { cntlid: c, qid: 1 });
    let _q2 = io_connect(&mut t, c, 2);
    // QID beyond the two granted: IPO 42 in the SQE.
    let r = t.connect(
        &connect_sqe(3, 127, 0),
        &connect_data(SUB, HOST, c.0, HOSTID),
        conn(1),
    );
    assert_eq!(refused(r).dw0, 42);
    // The same QID twice.
    let r = t.connect(
        &connect_sqe(2, 127, 0),
        &connect_data(SUB, HOST, c.0, HOSTID),
        conn(1),
    );
    assert_eq!(refused(r).status(), status::COMMAND_SEQUENCE_ERROR);
    // Another host's CNTLID, another host ID, no such controller, FFFFh: IPO 16 in the data.
    for (host, hostid, cntlid) in [
        (HOST2, HOSTID, c.0),
        (HOST, [9; 16], c.0),
        (HOST, HOSTID, 999),
        (HOST, HOSTID, 0xffff),
    ] {
        let r = t.connect(
            &connect_sqe(1, 127, 0),
            &connect_data(SUB, host, cntlid, hostid),
            conn(1),
        );
        assert_eq!(refused(r).dw0, 1 << 16 | 16, "{host} {cntlid}");
    }
    // SQSIZE past MQES (127) and 0.
    t.disconnect(QueueRef { cntlid: c, qid: 2 });
    for sqsize in [128, 0] {
        let r = t.connect(
            &connect_sqe(2, sqsize, 0),
            &connect_data(SUB, HOST, c.0, HOSTID),
            conn(1),
        );
        assert_eq!(refused(r).dw0, 44, "{sqsize}");
    }
    // The freed QID connects again, with SQ flow control disabled (CATTR bit 2).
    let mut s = connect_sqe(2, 15, 0);
    s.dw[11] |= 1 << 18;
    let o = t
        .connect(&s, &connect_data(SUB, HOST, c.0, HOSTID), conn(1))
        .unwrap();
    assert!(o.sq_flow_control_disabled);
    assert_eq!(o.entries, 16);
    // Number of Queues cannot change once I/O queues exist.
    assert_eq!(
        features(&mut t, c, true, 0x07, 7 | 7 << 16),
        Err(status::COMMAND_SEQUENCE_ERROR)
    );
    // A discovery controller has no I/O queues.
    let d = admin_connect_as(&mut t, DISCOVERY_NQN, HOST, 0);
    let r = t.connect(
        &connect_sqe(1, 31, 0),
        &connect_data(DISCOVERY_NQN, HOST, d.0, HOSTID),
        conn(1),
    );
    assert_eq!(refused(r).dw0, 42);
}

#[test]
fn linux_bring_up_sequence() {
    // nvme_tcp_configure_admin_queue → nvmf_connect_admin_queue, nvme_enable_ctrl,
    // nvme_init_ctrl_finish; then nvme_set_queue_count and nvme_enable_aen.
    let mut t = target();
    let c = admin_connect(&mut t);
    let cap = prop_get(&mut t, c, prop::CAP, true).unwrap();
    assert_eq!(cap & 0xffff, 127, "MQES: 128 entries");
    assert_eq!((cap >> 37) & 1, 1, "CSS: NVM");
    // Before CC.EN, admin commands other than Fabrics ones are refused.
    assert_eq!(identify(&mut t, c, 0x01, 0), Err(status::COMMAND_SEQUENCE_ERROR));
    let (cqe, effect) = prop_set(&mut t, c, prop::CC, LINUX_CC);
    assert!(cqe.status().is_success() && effect.is_none());
    assert_eq!(prop_get(&mut t, c, prop::CSTS, false), Ok(1));
    assert_eq!(prop_get(&mut t, c, prop::VS, false), Ok(0x0002_0000));
    assert_eq!(prop_get(&mut t, c, prop::CC, false), Ok(LINUX_CC as u64));
    // Only CAP reads as 8 bytes; only CC is written.
    assert_eq!(prop_get(&mut t, c, prop::CAP, false), Err(Status::INVALID_FIELD));
    assert_eq!(prop_get(&mut t, c, 0x28, true), Err(Status::INVALID_FIELD));
    let (cqe, _) = prop_set(&mut t, c, prop::CSTS, 0);
    assert_eq!(cqe.status(), Status::INVALID_FIELD);
    let mut size4 = fabrics_sqe(fctype::PROPERTY_GET);
    size4.dw[10] = 2;
    assert_eq!(
        complete(t.admin(c, &size4, &[])).0.status(),
        Status::INVALID_FIELD
    );
    // Identify: the fabrics checks of nvme_check_ctrl_fabric_info.
    let id = identify(&mut t, c, 0x01, 0).unwrap();
    assert_eq!(le16(&id, ctrl_off::CNTLID), c.0);
    assert!(le16(&id, ctrl_off::KAS) > 0);
    assert!(le32(&id, ctrl_off::IOCCSZ) >= 4);
    assert!(le32(&id, ctrl_off::IORCSZ) >= 1);
    assert_eq!(le16(&id, ctrl_off::ICDOFF), 0);
    assert!(le16(&id, ctrl_off::MAXCMD) > 0);
    assert_ne!(le32(&id, ctrl_off::SGLS) & 0b11, 0, "nvme_ctrl_sgl_supported");
    // Number of queues: 8 asked, granted (0's based in both halves).
    assert_eq!(features(&mut t, c, true, 0x07, 7 | 7 << 16), Ok(7 | 7 << 16));
    assert_eq!(
        features(&mut t, c, true, 0x07, 999 | 999 << 16),
        Ok(63 | 63 << 16),
        "capped at 64"
    );
    assert_eq!(
        features(&mut t, c, true, 0x07, 0xffff),
        Err(Status::INVALID_FIELD)
    );
    // Asynchronous event configuration: OAES & NVME_AEN_SUPPORTED.
    assert_eq!(features(&mut t, c, true, 0x0b, ctrl_val::OAES_NS_ATTR), Ok(0));
    assert_eq!(
        features(&mut t, c, true, 0x0b, 1 << 31),
        Err(Status::INVALID_FIELD)
    );
    let aer = sqe(admin_op::ASYNC_EVENT_REQUEST, 0);
    assert_eq!(t.admin(c, &aer, &[]), AdminOutcome::Held);
    // Keep Alive.
    let (cqe, _) = complete(t.admin(c, &sqe(0x18, 0), &[]));
    assert!(cqe.status().is_success());
}

#[test]
fn shutdown_and_reset_tell_the_runtime() {
    let mut t = target();
    let c = admin_connect(&mut t);
    enable(&mut t, c);
    features(&mut t, c, true, 0x07, 3 | 3 << 16).unwrap();
    io_connect(&mut t, c, 1);
    let (_, effect) = prop_set(&mut t, c, prop::CC, LINUX_CC | 1 << 14);
    assert_eq!(effect, Some(AdminEffect::Shutdown));
    assert_eq!(
        prop_get(&mut t, c, prop::CSTS, false),
        Ok((csts::RDY | csts::SHST_COMPLETE) as u64)
    );
    let (_, effect) = prop_set(&mut t, c, prop::CC, 0);
    assert_eq!(
        effect,
        Some(AdminEffect::Reset {
            io_queues: vec![QueueRef { cntlid: c, qid: 1 }]
        })
    );
    assert_eq!(prop_get(&mut t, c, prop::CSTS, false), Ok(0));
    // A configuration the target does not support fails the controller (CSTS.CFS).
    let (cqe, _) = prop_set(&mut t, c, prop::CC, 1 | 6 << 16 | 4 << 20 | 1 << 7);
    assert!(cqe.status().is_success());
    assert_eq!(prop_get(&mut t, c, prop::CSTS, false), Ok(csts::CFS as u64));
    assert_eq!(identify(&mut t, c, 0x01, 0), Err(status::COMMAND_SEQUENCE_ERROR));
}

#[test]
fn keep_alive_expiry_and_traffic() {
    let mut t = target();
    let t0 = Instant::now();
    let s = |ms| t0 + Duration::from_millis(ms);
    let c = admin_connect(&mut t); // KATO 15 s
    enable(&mut t, c);
    let mut q = {
        features(&mut t, c, true, 0x07, 0).unwrap();
        io_connect(&mut t, c, 1)
    };
    assert!(t.tick(s(0)).is_empty(), "the timer starts at the first tick");
    assert!(t.tick(s(14_000)).is_empty());
    // I/O counts (Traffic Based Keep Alive): the timer restarts at the next tick.
    let mut read = sgl(sqe(vfpoll_nvme_spec::cmd::io_op::READ, 1), SGL_TRANSPORT, 512);
    read.dw[12] = 0;
    q.decode(&read).unwrap();
    assert!(t.tick(s(14_500)).is_empty());
    assert!(t.tick(s(29_000)).is_empty(), "14.5 s after the I/O");
    // Keep Alive counts.
    complete(t.admin(c, &sqe(0x18, 0), &[]));
    assert!(t.tick(s(29_400)).is_empty());
    assert_eq!(t.tick(s(44_400)), vec![c], "15 s without a command");
    assert!(t.tick(s(60_000)).is_empty(), "reported once");
    // The expired controller processes nothing more.
    assert_eq!(
        q.decode(&read).unwrap_err().status(),
        status::COMMAND_SEQUENCE_ERROR
    );
    assert_eq!(identify(&mut t, c, 0x01, 0), Err(status::COMMAND_SEQUENCE_ERROR));
    let queues = t.drop_controller(c);
    assert_eq!(
        queues,
        vec![QueueRef { cntlid: c, qid: 0 }, QueueRef { cntlid: c, qid: 1 }]
    );
    assert!(t.controllers().is_empty());
    // A discovery controller without KATO gets two minutes; KATO 0 on an I/O controller
    // never expires.
    let d = admin_connect_as(&mut t, DISCOVERY_NQN, HOST, 0);
    let n = admin_connect_as(&mut t, SUB, HOST, 0);
    assert!(t.tick(s(100_000)).is_empty());
    assert!(t.tick(s(219_000)).is_empty());
    assert_eq!(t.tick(s(220_000)), vec![d]);
    assert!(t.tick(s(10_000_000)).is_empty());
    assert!(t.controllers().iter().any(|i| i.cntlid == n));
    // Set Features KATO restarts with the new value.
    features(&mut t, n, true, 0x0f, 1000).unwrap_err(); // not enabled yet
    enable(&mut t, n);
    assert_eq!(features(&mut t, n, true, 0x0f, 1000), Ok(0));
    assert_eq!(features(&mut t, n, false, 0x0f, 0), Ok(1000));
    assert!(t.tick(s(10_000_100)).is_empty());
    assert_eq!(t.tick(s(10_001_100)), vec![n]);
}

#[test]
fn disconnect_of_the_admin_queue_ends_the_association() {
    let mut t = target();
    let c = admin_connect(&mut t);
    enable(&mut t, c);
    features(&mut t, c, true, 0x07, 3 | 3 << 16).unwrap();
    let mut q1 = io_connect(&mut t, c, 1);
    io_connect(&mut t, c, 2);
    assert!(t.io_queue(QueueRef { cntlid: c, qid: 2 }).is_some());
    assert!(t.disconnect(QueueRef { cntlid: c, qid: 2 }).is_empty());
    assert!(t.io_queue(QueueRef { cntlid: c, qid: 2 }).is_none());
    assert_eq!(
        t.disconnect(QueueRef { cntlid: c, qid: 0 }),
        vec![QueueRef { cntlid: c, qid: 1 }]
    );
    assert!(t.controllers().is_empty());
    let read = sgl(sqe(vfpoll_nvme_spec::cmd::io_op::READ, 1), SGL_TRANSPORT, 512);
    assert_eq!(
        q1.decode(&read).unwrap_err().status(),
        status::COMMAND_SEQUENCE_ERROR
    );
    assert_eq!(
        t.admin(c, &sqe(0x18, 0), &[]).cqe().unwrap().status(),
        status::COMMAND_SEQUENCE_ERROR
    );
    assert!(t.disconnect(QueueRef { cntlid: c, qid: 0 }).is_empty());
}
