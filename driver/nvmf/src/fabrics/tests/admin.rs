//! Identify, features, log pages, the discovery controller and asynchronous events.

use vfpoll_nvme_spec::identify::{
    csi_of_descriptors, parse_ns_list, ErrorLogEntry, IdentifyController, IdentifyNamespace,
};

use super::*;

#[test]
fn identify_controller_fields_at_their_offsets() {
    let mut t = target();
    let c = ready(&mut t);
    let b = identify(&mut t, c, 0x01, 0).unwrap();
    let s = subsystem(SUB);
    assert_eq!(
        &b[4..24],
        format!("{:<20}", s.serial).as_bytes(),
        "SN, space padded"
    );
    assert_eq!(&b[24..30], b"vfpoll");
    assert_eq!(b[30], b' ');
    assert_eq!(
        b[ctrl_off::CMIC],
        0b1011,
        "multi-port, multi-controller, ANA reporting"
    );
    assert_eq!(b[ctrl_off::MDTS], 8, "1 MiB in 4 KiB pages");
    assert_eq!(le32(&b, ctrl_off::VER), 0x0002_0000);
    assert_eq!(
        le32(&b, ctrl_off::OAES),
        1 << 8 | 1 << 11,
        "namespace and ANA notices"
    );
    assert_eq!(le32(&b, ctrl_off::CTRATT), 1 | 1 << 6, "128-bit host ID, TBKAS");
    assert_eq!(b[ctrl_off::CNTRLTYPE], 1, "I/O controller");
    assert_eq!(le16(&b, ctrl_off::OACS), 0);
    assert_eq!((b[ctrl_off::ACL], b[ctrl_off::AERL]), (3, 3));
    assert_eq!(
        (b[ctrl_off::FRMW], b[ctrl_off::LPA], b[ctrl_off::ELPE]),
        (0b11, 0b101, 7)
    );
    assert_eq!(le16(&b, ctrl_off::KAS), 10);
    assert_eq!((b[ctrl_off::SQES], b[ctrl_off::CQES]), (0x66, 0x44));
    assert_eq!(le16(&b, ctrl_off::MAXCMD), 128);
    assert_eq!(le32(&b, ctrl_off::NN), 1024);
    // Namespace 2 has no Write Zeroes: only DSM (namespace 1 deallocates), and reservations.
    assert_eq!(le16(&b, ctrl_off::ONCS), 1 << 2 | 1 << 5);
    assert_eq!(b[ctrl_off::VWC], 0b101, "present, no broadcast Flush");
    assert_eq!(le32(&b, ctrl_off::SGLS), 1 | 1 << 20 | 1 << 21);
    assert_eq!(cstr(&b[768..1024]), SUB);
    assert_eq!(le32(&b, ctrl_off::IOCCSZ), 4 + 8192 / 16);
    assert_eq!(le32(&b, ctrl_off::IORCSZ), 1);
    assert_eq!(le16(&b, ctrl_off::ICDOFF), 0);
    assert_eq!((b[ctrl_off::FCATT], b[ctrl_off::MSDBD]), (0, 1));
    // vfpoll-nvme's parser reads the same page back.
    let p = IdentifyController::parse(&b);
    assert_eq!((p.cntlid, p.nn, p.mdts_bytes(4096)), (c.0, 1024, Some(1 << 20)));
    assert_eq!((p.model.as_str(), p.subnqn.as_str()), ("vfpoll", SUB));
    assert!(p.sgl_supported() && !p.sgl_dword_aligned() && p.namespace_attribute_notices());
    assert!(p.has_volatile_write_cache());
}

#[test]
fn identify_namespaces_list_and_descriptors() {
    let mut t = target();
    let c = ready(&mut t);
    let s = subsystem(SUB);
    let b = identify(&mut t, c, 0x00, 1).unwrap();
    assert_eq!(
        (le64(&b, 0), le64(&b, 8), le64(&b, 16)),
        (1000, 1000, 1000),
        "NSZE NCAP NUSE"
    );
    assert_eq!((b[ns_off::NLBAF], b[ns_off::FLBAS], b[ns_off::NMIC]), (0, 0, 1));
    assert_eq!(le32(&b, ns_off::LBAF0), 9 << 16, "LBADS 9, no metadata");
    assert_eq!(&b[104..120], &s.namespaces[0].nguid);
    assert_eq!(&b[120..128], &s.namespaces[0].eui64);
    assert_eq!(
        u128::from_le_bytes(b[48..64].try_into().unwrap()),
        512_000,
        "NVMCAP"
    );
    let p = IdentifyNamespace::parse(&identify(&mut t, c, 0x00, 2).unwrap()).unwrap();
    assert_eq!(
        (p.nsze, p.lba_format().data_size(), p.lba_format().ms),
        (100, 4096, 0)
    );
    // Inactive but valid: zeroes; 0, past NN and broadcast: Invalid Namespace or Format.
    assert!(identify(&mut t, c, 0x00, 3).unwrap().iter().all(|&x| x == 0));
    for nsid in [0, 1025, u32::MAX] {
        assert_eq!(
            identify(&mut t, c, 0x00, nsid),
            Err(Status::INVALID_NAMESPACE),
            "{nsid}"
        );
    }
    // Active namespace list: IDs above the given one.
    assert_eq!(parse_ns_list(&identify(&mut t, c, 0x02, 0).unwrap()), vec![1, 2]);
    assert_eq!(parse_ns_list(&identify(&mut t, c, 0x02, 1).unwrap()), vec![2]);
    assert_eq!(
        identify(&mut t, c, 0x02, 0xffff_fffe),
        Err(Status::INVALID_NAMESPACE)
    );
    // Descriptors: EUI-64, NGUID, UUID, CSI, each with its header.
    let d = identify(&mut t, c, 0x03, 1).unwrap();
    let ns = &s.namespaces[0];
    assert_eq!(&d[0..4], &[nidt::EUI64, 8, 0, 0]);
    assert_eq!(&d[4..12], &ns.eui64);
    assert_eq!(&d[12..16], &[nidt::NGUID, 16, 0, 0]);
    assert_eq!(&d[16..32], &ns.nguid);
    assert_eq!(&d[32..36], &[nidt::UUID, 16, 0, 0]);
    assert_eq!(&d[36..52], &ns.uuid);
    assert_eq!(&d[52..57], &[nidt::CSI, 1, 0, 0, 0]);
    assert!(d[57..].iter().all(|&x| x == 0));
    assert_eq!(csi_of_descriptors(&d), Some(0));
    assert_eq!(identify(&mut t, c, 0x03, 3), Err(Status::INVALID_NAMESPACE));
    // CNS 08h: shared, ready; VWC not present on namespace 2.
    let i = identify(&mut t, c, 0x08, 1).unwrap();
    assert_eq!((i[0], i[1], i[14]), (0, 1, 1));
    let i = identify(&mut t, c, 0x08, 2).unwrap();
    assert_eq!(i[cs_indep_off::NSFEAT], 1 << 5);
    // The command-set specific structures are refused cleanly.
    for cns in [0x05, 0x06, 0x07, 0x1c, 0xff] {
        assert_eq!(
            identify(&mut t, c, cns, 1),
            Err(Status::INVALID_FIELD),
            "{cns:#x}"
        );
    }
    // The transfer must be exactly 4096 bytes.
    let mut s = sgl(sqe(admin_op::IDENTIFY, 0), SGL_TRANSPORT, 2048);
    s.dw[10] = 1;
    assert_eq!(
        complete(t.admin(c, &s, &[])).0.status(),
        status::DATA_SGL_LENGTH_INVALID
    );
}

#[test]
fn features_get_set_and_capabilities() {
    let mut t = target();
    let c = ready(&mut t);
    // Saving is not supported.
    assert_eq!(
        features(&mut t, c, true, 0x01, 1 | 1 << 31),
        Ok(0),
        "SV is bit 31 of CDW10, not 11"
    );
    let mut s = sqe(admin_op::SET_FEATURES, 0);
    s.dw[10] = 0x01 | 1 << 31;
    assert_eq!(
        complete(t.admin(c, &s, &[])).0.status(),
        status::FEATURE_NOT_SAVEABLE
    );
    assert_eq!(features(&mut t, c, false, 0x01, 0), Ok(1 | 1 << 31));
    // SEL: default (001b) and capabilities (011b: changeable).
    assert_eq!(features(&mut t, c, false, 0x01 | 1 << 8, 0), Ok(0));
    assert_eq!(features(&mut t, c, false, 0x01 | 3 << 8, 0), Ok(1 << 2));
    assert_eq!(
        features(&mut t, c, false, 0x01 | 4 << 8, 0),
        Err(Status::INVALID_FIELD)
    );
    // Volatile write cache: on by default, and what I/O decoding sees.
    assert_eq!(features(&mut t, c, false, 0x06, 0), Ok(1));
    assert_eq!(features(&mut t, c, true, 0x06, 0), Ok(0));
    assert_eq!(features(&mut t, c, false, 0x06, 0), Ok(0));
    // Power state 0 only; temperature thresholds of the composite sensor.
    assert_eq!(features(&mut t, c, true, 0x02, 1), Err(Status::INVALID_FIELD));
    assert_eq!(features(&mut t, c, false, 0x04, 0), Ok(358));
    assert_eq!(features(&mut t, c, true, 0x04, 350), Ok(0));
    assert_eq!(features(&mut t, c, true, 0x04, 1 << 20 | 270), Ok(0));
    assert_eq!(features(&mut t, c, false, 0x04, 0), Ok(350));
    assert_eq!(features(&mut t, c, false, 0x04, 1 << 20), Ok(1 << 20 | 270));
    assert_eq!(
        features(&mut t, c, false, 0x04, 1 << 16),
        Err(Status::INVALID_FIELD)
    );
    // Number of queues before Set: all of them.
    assert_eq!(features(&mut t, c, false, 0x07, 0), Ok(63 | 63 << 16));
    // Keep alive timeout from Connect.
    assert_eq!(features(&mut t, c, false, 0x0f, 0), Ok(15_000));
    // Interrupt coalescing has no meaning on fabrics; LBA range type is not kept.
    assert_eq!(features(&mut t, c, false, 0x08, 0), Err(Status::INVALID_FIELD));
    assert_eq!(features(&mut t, c, true, 0x03, 0), Err(Status::INVALID_FIELD));
    // The host identifier: read (EXHID, 16 bytes), not set.
    let mut g = sgl(sqe(admin_op::GET_FEATURES, 0), SGL_TRANSPORT, 16);
    g.dw[10] = 0x81;
    g.dw[11] = 1;
    let (cqe, data) = complete(t.admin(c, &g, &[]));
    assert!(cqe.status().is_success());
    assert_eq!(data, HOSTID);
    g.dw[11] = 0;
    assert_eq!(complete(t.admin(c, &g, &[])).0.status(), Status::INVALID_FIELD);
    assert_eq!(
        features(&mut t, c, true, 0x81, 1),
        Err(status::COMMAND_SEQUENCE_ERROR)
    );
}

#[test]
fn log_pages_error_smart_firmware() {
    let mut t = target();
    let c = ready(&mut t);
    let sid = t.subsystem_id(SUB).unwrap();
    // A failed command lands in the error log.
    assert_eq!(identify(&mut t, c, 0x06, 0), Err(Status::INVALID_FIELD));
    let e = get_log(&mut t, c, lid::ERROR, 0, 512, 0, false).unwrap();
    let first = ErrorLogEntry::parse(&e[..64]);
    assert_eq!((first.error_count, first.cid, first.sqid), (1, 0x1234, 0));
    assert_eq!(first.status, Status::INVALID_FIELD.field());
    // SMART: per namespace and combined, the error count from the controller.
    let h1 = Health {
        temperature_k: 300,
        host_reads: 10,
        data_units_read: 4,
        available_spare: 90,
        spare_threshold: 10,
        ..Health::default()
    };
    let h2 = Health {
        temperature_k: 320,
        host_reads: 5,
        available_spare: 100,
        ..Health::default()
    };
    assert!(t.set_health(sid, 1, h1).unwrap().is_empty());
    assert!(t.set_health(sid, 2, h2).unwrap().is_empty());
    assert!(t.set_health(sid, 3, h2).is_err());
    let all = vfpoll_nvme_spec::identify::SmartLog::parse(
        &get_log(&mut t, c, lid::SMART, u32::MAX, 512, 0, true).unwrap(),
    );
    assert_eq!(
        (all.temperature_k, all.host_reads, all.available_spare),
        (320, 15, 90)
    );
    assert_eq!((all.data_units_read, all.error_log_entries), (4, 1));
    let one = vfpoll_nvme_spec::identify::SmartLog::parse(
        &get_log(&mut t, c, lid::SMART, 2, 512, 0, true).unwrap(),
    );
    assert_eq!((one.temperature_k, one.host_reads), (320, 5));
    assert_eq!(
        get_log(&mut t, c, lid::SMART, 3, 512, 0, true),
        Err(Status::INVALID_NAMESPACE)
    );
    // Firmware slot 1 holds the firmware revision.
    let f = get_log(&mut t, c, lid::FIRMWARE_SLOT, 0, 512, 0, true).unwrap();
    assert_eq!(f[0], 1);
    assert_eq!(&f[8..16], format!("{:<8}", subsystem(SUB).firmware).as_bytes());
    // Offsets: dword aligned, within the page; past the page's end, zeroes.
    let tail = get_log(&mut t, c, lid::SMART, 0, 16, 1, true);
    assert_eq!(tail, Err(Status::INVALID_FIELD));
    let tail = get_log(&mut t, c, lid::SMART, 0, 64, 480, true).unwrap();
    assert!(tail[32..].iter().all(|&x| x == 0));
    assert_eq!(
        get_log(&mut t, c, lid::SMART, 0, 4, 516, true),
        Err(Status::INVALID_FIELD)
    );
    // Unknown pages, the discovery page on an I/O controller, a transfer past MDTS.
    assert_eq!(
        get_log(&mut t, c, 0x05, 0, 4096, 0, true),
        Err(status::INVALID_LOG_PAGE)
    );
    assert_eq!(
        get_log(&mut t, c, lid::DISCOVERY, 0, 1024, 0, true),
        Err(status::INVALID_LOG_PAGE)
    );
    assert_eq!(
        get_log(&mut t, c, lid::ERROR, 0, 2 << 20, 0, true),
        Err(Status::INVALID_FIELD)
    );
    // NUMD from NUMDU and NUMDL, checked against the SGL.
    let mut s = sgl(sqe(admin_op::GET_LOG_PAGE, 0), SGL_TRANSPORT, 512);
    s.dw[10] = lid::SMART as u32 | 0xffff << 16;
    s.dw[11] = 0;
    assert_eq!(
        complete(t.admin(c, &s, &[])).0.status(),
        status::DATA_SGL_LENGTH_INVALID
    );
}

#[test]
fn aer_held_then_completed_on_a_namespace_change() {
    let mut t = target();
    let c = ready(&mut t);
    let sid = t.subsystem_id(SUB).unwrap();
    let mut aer = sqe(admin_op::ASYNC_EVENT_REQUEST, 0);
    aer.set_cid(77);
    assert_eq!(t.admin(c, &aer, &[]), AdminOutcome::Held);
    // Namespace 3 appears: the held request completes with a Notice for log 04h.
    let events = t
        .add_namespace(sid, NamespaceInfo::new(SUB, 3, "malloc:c", 512, 64))
        .unwrap();
    assert_eq!(events.len(), 1);
    let ev = events[0];
    assert_eq!((ev.cntlid, ev.cqe.cid), (c, 77));
    assert!(ev.cqe.status().is_success());
    assert_eq!(ev.cqe.dw0 & 7, 2, "Notice");
    assert_eq!((ev.cqe.dw0 >> 8) & 0xff, 0, "Namespace Attribute Changed");
    assert_eq!((ev.cqe.dw0 >> 16) & 0xff, 4, "Changed Namespace List");
    assert_eq!(
        parse_ns_list(&identify(&mut t, c, 0x02, 0).unwrap()),
        vec![1, 2, 3]
    );
    // A second change before the log is read is not reported again...
    aer.set_cid(78);
    assert_eq!(t.admin(c, &aer, &[]), AdminOutcome::Held);
    assert!(t.remove_namespace(sid, 2).unwrap().is_empty());
    let log = get_log(&mut t, c, lid::CHANGED_NS, u32::MAX, 4096, 0, true).unwrap();
    assert_eq!(parse_ns_list(&log), vec![2, 3]);
    // ...and the list stays while RAE is set; reading without RAE empties it and re-arms.
    let log = get_log(&mut t, c, lid::CHANGED_NS, u32::MAX, 4096, 0, false).unwrap();
    assert_eq!(parse_ns_list(&log), vec![2, 3]);
    let log = get_log(&mut t, c, lid::CHANGED_NS, u32::MAX, 4096, 0, false).unwrap();
    assert!(log.iter().all(|&x| x == 0));
    let mut ns1 = subsystem(SUB).namespaces[0].clone();
    ns1.blocks = 2000;
    let events = t.update_namespace(sid, ns1).unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].cqe.cid, 78);
    assert_eq!(le64(&identify(&mut t, c, 0x00, 1).unwrap(), 0), 2000);
    // A change with no request held waits for the next one.
    let log = get_log(&mut t, c, lid::CHANGED_NS, 0, 4096, 0, false).unwrap();
    assert_eq!(parse_ns_list(&log), vec![1]);
    assert!(t.remove_namespace(sid, 3).unwrap().is_empty());
    aer.set_cid(79);
    let (cqe, _) = complete(t.admin(c, &aer, &[]));
    assert_eq!((cqe.cid, cqe.dw0), (79, 0x0004_0002));
    // Four requests outstanding at most (AERL 3).
    for cid in 0..4 {
        aer.set_cid(cid);
        assert_eq!(t.admin(c, &aer, &[]), AdminOutcome::Held);
    }
    assert_eq!(
        complete(t.admin(c, &aer, &[])).0.status(),
        status::AER_LIMIT_EXCEEDED
    );
    // A controller that did not enable the notice hears nothing.
    let quiet = admin_connect(&mut t);
    enable(&mut t, quiet);
    aer.set_cid(5);
    assert_eq!(t.admin(quiet, &aer, &[]), AdminOutcome::Held);
    let events = t
        .add_namespace(sid, NamespaceInfo::new(SUB, 9, "malloc:z", 512, 8))
        .unwrap();
    assert!(events.iter().all(|e| e.cntlid != quiet));
    // SMART critical warnings raise events where enabled.
    features(&mut t, quiet, true, 0x0b, 0x1f).unwrap();
    let events = t
        .set_health(
            sid,
            1,
            Health {
                critical_warning: 2,
                ..Health::default()
            },
        )
        .unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!((events[0].cntlid, events[0].cqe.dw0), (quiet, 0x0002_0101));
}

#[test]
fn discovery_log_layout() {
    let mut t = target();
    let d = admin_connect_as(&mut t, DISCOVERY_NQN, HOST, 0);
    enable(&mut t, d);
    // Identify Controller of a discovery controller.
    let id = identify(&mut t, d, 0x01, 0).unwrap();
    assert_eq!(id[ctrl_off::CNTRLTYPE], 2);
    assert_eq!(cstr(&id[768..1024]), DISCOVERY_NQN);
    assert_eq!(le32(&id, ctrl_off::OAES), 1 << 31);
    assert_eq!(le32(&id, ctrl_off::NN), 0);
    assert_eq!(le16(&id, ctrl_off::CNTLID), d.0);
    assert_eq!(identify(&mut t, d, 0x00, 1), Err(Status::INVALID_FIELD));
    // nvme discover: the header first, then the whole page.
    let hdr = get_log(&mut t, d, lid::DISCOVERY, 0, 1024, 0, true).unwrap();
    let genctr = le64(&hdr, 0);
    let numrec = le64(&hdr, 8);
    assert_eq!(le16(&hdr, 16), 0, "RECFMT");
    // Two listeners: the current discovery subsystem on each, and SUB on each (OTHER does
    // not allow this host).
    assert_eq!(numrec, 4);
    let len = 1024 * (1 + numrec as u32);
    let page = get_log(&mut t, d, lid::DISCOVERY, 0, len, 0, true).unwrap();
    let entry = |i: usize| &page[1024 * (i + 1)..1024 * (i + 2)];
    let e = entry(0);
    assert_eq!(
        (e[disc_off::TRTYPE], e[disc_off::ADRFAM], e[disc_off::SUBTYPE]),
        (3, 1, 3)
    );
    assert_eq!(cstr(&e[disc_off::SUBNQN..]), DISCOVERY_NQN);
    let e = entry(2);
    assert_eq!(e[disc_off::SUBTYPE], 2);
    assert_eq!(e[disc_off::TREQ], 0b110);
    assert_eq!(le16(e, disc_off::PORTID), 1);
    assert_eq!(le16(e, disc_off::CNTLID), 0xffff);
    assert_eq!(le16(e, disc_off::ASQSZ), 32);
    assert_eq!(cstr(&e[disc_off::TRSVCID..disc_off::TRSVCID + 32]), "4420");
    assert_eq!(cstr(&e[disc_off::SUBNQN..disc_off::SUBNQN + 256]), SUB);
    assert_eq!(cstr(&e[disc_off::TRADDR..disc_off::TRADDR + 256]), "127.0.0.1");
    assert_eq!(e[disc_off::TSAS], 0);
    // The wildcard listener names the address the host connected to.
    let e = entry(3);
    assert_eq!(
        (le16(e, disc_off::PORTID), cstr(&e[disc_off::TRADDR..])),
        (2, "10.0.0.5")
    );
    // Entries read from an offset, as libnvme reads them after the header.
    let rest = get_log(&mut t, d, lid::DISCOVERY, 0, 2048, 2048, true).unwrap();
    assert_eq!(&rest[..], &page[2048..4096]);
    // Port Local Entries Only (LSP bit 0): the host's own listener.
    let mut s = sgl(sqe(admin_op::GET_LOG_PAGE, 0), SGL_TRANSPORT, 1024);
    s.dw[10] = lid::DISCOVERY as u32 | 1 << 8 | 255 << 16;
    let (_, local) = complete(t.admin(d, &s, &[]));
    assert_eq!(le64(&local, 8), 2);
    // Another host sees OTHER too.
    let d2 = admin_connect_as(&mut t, DISCOVERY_NQN, HOST2, 0);
    enable(&mut t, d2);
    assert_eq!(
        le64(&get_log(&mut t, d2, lid::DISCOVERY, 0, 1024, 0, true).unwrap(), 8),
        6
    );
    // A change bumps GENCTR and completes the held request of a discovery controller that
    // enabled the notice.
    assert_eq!(features(&mut t, d, true, 0x0b, 1 << 31), Ok(0));
    assert_eq!(
        features(&mut t, d, true, 0x0b, 1 << 8),
        Err(Status::INVALID_FIELD)
    );
    let mut aer = sqe(admin_op::ASYNC_EVENT_REQUEST, 0);
    aer.set_cid(3);
    assert_eq!(t.admin(d, &aer, &[]), AdminOutcome::Held);
    let (_, events) = t.add_subsystem(subsystem("nqn.2024-01.io.vfpoll:third")).unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(
        (events[0].cntlid, events[0].cqe.cid, events[0].cqe.dw0),
        (d, 3, 0x0070_f002)
    );
    let hdr = get_log(&mut t, d, lid::DISCOVERY, 0, 1024, 0, false).unwrap();
    assert_eq!((le64(&hdr, 0), le64(&hdr, 8)), (genctr + 1, 6));
    // The discovery controller answers nothing else.
    assert_eq!(
        get_log(&mut t, d, lid::SMART, 0, 512, 0, true),
        Err(status::INVALID_LOG_PAGE)
    );
    assert_eq!(features(&mut t, d, true, 0x07, 0), Err(Status::INVALID_FIELD));
    assert_eq!(
        complete(t.admin(d, &sqe(admin_op::ABORT, 0), &[])).0.status(),
        Status::INVALID_OPCODE
    );
    let (cqe, _) = complete(t.admin(d, &sqe(0x18, 0), &[]));
    assert!(cqe.status().is_success());
}

#[test]
fn other_admin_commands() {
    let mut t = target();
    let c = ready(&mut t);
    // Abort: acknowledged, "not aborted" (dword 0 bit 0).
    let (cqe, _) = complete(t.admin(c, &sqe(admin_op::ABORT, 0), &[]));
    assert_eq!((cqe.status().is_success(), cqe.dw0), (true, 1));
    // Queue management, Format NVM, Doorbell Buffer Config, vendor opcodes: Invalid Opcode.
    for op in [0x00, 0x01, 0x04, 0x05, 0x80, 0x7c, 0xc0, 0x10] {
        let (cqe, _) = complete(t.admin(c, &sqe(op, 0), &[]));
        assert_eq!(cqe.status(), Status::INVALID_OPCODE, "{op:#x}");
    }
    // Fabrics: Connect again, Disconnect, Authentication: refused.
    let (cqe, _) = complete(t.admin(c, &fabrics_sqe(fctype::CONNECT), &[]));
    assert_eq!(cqe.status(), status::COMMAND_SEQUENCE_ERROR);
    for f in [fctype::DISCONNECT, fctype::AUTHENTICATION_SEND, 0x7f] {
        let (cqe, _) = complete(t.admin(c, &fabrics_sqe(f), &[]));
        assert_eq!(cqe.status(), Status::INVALID_OPCODE, "{f:#x}");
    }
    // PRPs (PSDT 00b) and fused commands are not fabrics commands.
    let mut prp = sqe(0x18, 0);
    prp.dw[0] &= !(3 << 14);
    assert_eq!(complete(t.admin(c, &prp, &[])).0.status(), Status::INVALID_FIELD);
    // A controller that does not exist.
    assert_eq!(
        complete(t.admin(Cntlid(999), &sqe(0x18, 0), &[])).0.status(),
        status::COMMAND_SEQUENCE_ERROR
    );
}
