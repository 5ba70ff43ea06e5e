//! Asymmetric Namespace Access (NVMe Base 2.0 §8.1.3): Identify fields, the ANA log page,
//! ANA Change notices, I/O refused on paths that are not accessible, per-port views, and the
//! limits Linux's `nvme_mpath_init_identify` checks.

use vfpoll_nvme_spec::cmd::io_op;
use vfpoll_nvme_spec::status::Sct;

use super::*;

/// AEC as Linux sets it for an I/O controller reporting both notices.
const AEC_NS_ANA: u32 = ctrl_val::OAES_NS_ATTR | ctrl_val::OAES_ANA;

/// `SUB` with namespace 1 (group 1), 2 (group 2) and 3 (group 1); listener 1 all
/// Optimized, listener 2 with group 2 Non-Optimized. `OTHER` has namespaces 1 and 2 in group 1.
fn ana_target() -> Target {
    let mut s = subsystem(SUB);
    s.namespaces[1].ana_group = 2;
    s.namespaces.push(NamespaceInfo::new(SUB, 3, "malloc:c", 512, 10));
    let l = vec![
        Listener::tcp(1, "127.0.0.1:4420".parse().unwrap()),
        Listener::tcp(2, "0.0.0.0:4421".parse().unwrap()).with_ana(2, AnaState::NonOptimized),
    ];
    Target::new(TargetOptions::default(), l, vec![s, subsystem(OTHER)]).unwrap()
}

/// A controller of `subnqn` whose admin queue came through port `portid`, enabled, with AEC
/// `aec`.
fn ctrl_of(t: &mut Target, subnqn: &str, portid: u16, aec: u32) -> Cntlid {
    let o = t
        .connect(
            &connect_sqe(0, 31, 15_000),
            &connect_data(subnqn, HOST2, 0xffff, HOSTID),
            conn(portid),
        )
        .unwrap_or_else(|c| panic!("admin connect refused: {c:?}"));
    let c = Cntlid(o.cqe.dw0 as u16);
    enable(t, c);
    features(t, c, true, 0x0b, aec).unwrap();
    c
}

fn ctrl_on(t: &mut Target, portid: u16, aec: u32) -> Cntlid {
    ctrl_of(t, SUB, portid, aec)
}

/// I/O queue 1 of `c` (a controller of `SUB` made by [`ctrl_of`]), connected through port 1.
fn io_of(t: &mut Target, c: Cntlid) -> IoQueue {
    t.connect(
        &connect_sqe(1, 127, 0),
        &connect_data(SUB, HOST2, c.0, HOSTID),
        conn(1),
    )
    .unwrap_or_else(|e| panic!("I/O connect refused: {e:?}"))
    .io
    .expect("an I/O queue decoder")
}

/// Holds an Asynchronous Event Request with command ID `cid`.
fn hold_aer(t: &mut Target, c: Cntlid, cid: u16) {
    let mut aer = sqe(admin_op::ASYNC_EVENT_REQUEST, 0);
    aer.set_cid(cid);
    assert_eq!(t.admin(c, &aer, &[]), AdminOutcome::Held);
}

#[derive(Debug, PartialEq, Eq)]
struct Desc {
    group: u32,
    count: u64,
    state: u8,
    nsids: Vec<u32>,
}

/// The header's change count and the descriptors of an ANA log page, checking the layout.
fn parse(b: &[u8]) -> (u64, Vec<Desc>) {
    let n = le16(b, 8) as usize;
    assert!(b[10..16].iter().all(|&x| x == 0), "reserved");
    let mut at = ANA_HEADER_BYTES;
    let mut out = Vec::new();
    for _ in 0..n {
        let nnsid = le32(b, at + 4) as usize;
        assert!(b[at + 17..at + 32].iter().all(|&x| x == 0), "reserved");
        out.push(Desc {
            group: le32(b, at),
            count: le64(b, at + 8),
            state: b[at + 16],
            nsids: (0..nnsid).map(|i| le32(b, at + 32 + 4 * i)).collect(),
        });
        at += ANA_DESCRIPTOR_BYTES + 4 * nnsid;
    }
    assert!(b[at..].iter().all(|&x| x == 0), "zeroes past the page");
    (le64(b, 0), out)
}

/// Get Log Page 0Ch with LSP `lsp`.
fn ana_log(t: &mut Target, c: Cntlid, len: u32, offset: u64, lsp: u32, rae: bool) -> Result<Vec<u8>, Status> {
    let mut s = log_sqe(lid::ANA, u32::MAX, len, offset, rae);
    s.dw[10] |= lsp << 8;
    log_data(t, c, &s, len)
}

fn read(q: &mut IoQueue, nsid: u32) -> Result<IoRequest, Status> {
    let block = if nsid == 2 { 4096 } else { 512 };
    let mut s = sqe(io_op::READ, nsid);
    s.set_lba_range(0, 1);
    q.decode(&sgl(s, SGL_TRANSPORT, block)).map_err(|c| {
        assert_eq!(c.status & 1, 0);
        c.status()
    })
}

#[test]
fn identify_reports_ana_capabilities_and_groups() {
    let mut t = ana_target();
    let c = ctrl_on(&mut t, 1, AEC_NS_ANA);
    let b = identify(&mut t, c, 0x01, 0).unwrap();
    assert_eq!(b[ctrl_off::CMIC] & 1 << 3, 1 << 3, "ANA reporting");
    assert_eq!(le32(&b, ctrl_off::OAES) & 1 << 11, 1 << 11, "ANA Change notices");
    assert_eq!(b[ctrl_off::ANATT], ANATT_SECONDS);
    assert_eq!(
        b[ctrl_off::ANACAP],
        0b1_1111,
        "all five states, ANAGRPID may change"
    );
    assert_eq!(le32(&b, ctrl_off::ANAGRPMAX), ANAGRPMAX);
    assert_eq!(le32(&b, ctrl_off::NANAGRPID), ANAGRPMAX);
    let (nn, mnan) = (le32(&b, ctrl_off::NN), le32(&b, ctrl_off::MNAN));
    assert_eq!((nn, mnan), (1024, 1024));
    // Linux's nvme_mpath_init_identify: MNAN 1 to NN, and its ANA log buffer within MDTS.
    let mdts = 4096usize << b[ctrl_off::MDTS];
    assert!(ANA_HEADER_BYTES + ANAGRPMAX as usize * ANA_DESCRIPTOR_BYTES + 4 * mnan as usize <= mdts);
    // Identify Namespace: ANAGRPID; NUSE as long as the path is accessible.
    let ns = identify(&mut t, c, 0x00, 2).unwrap();
    assert_eq!(le32(&ns, ns_off::ANAGRPID), 2);
    assert_eq!(le64(&ns, ns_off::NUSE), 100);
    assert_eq!(le32(&identify(&mut t, c, 0x00, 3).unwrap(), ns_off::ANAGRPID), 1);
    t.set_ana_state(1, 2, AnaState::Inaccessible).unwrap();
    let ns = identify(&mut t, c, 0x00, 2).unwrap();
    assert_eq!((le64(&ns, ns_off::NSZE), le64(&ns, ns_off::NUSE)), (100, 0));
    t.set_ana_state(1, 2, AnaState::PersistentLoss).unwrap();
    assert_eq!(le64(&identify(&mut t, c, 0x00, 2).unwrap(), ns_off::NUSE), 0);
    // The other port is unaffected.
    let c2 = ctrl_on(&mut t, 2, AEC_NS_ANA);
    assert_eq!(le64(&identify(&mut t, c2, 0x00, 2).unwrap(), ns_off::NUSE), 100);
    // A discovery controller reports no ANA: Linux would check its MNAN against NN 0.
    let d = admin_connect_as(&mut t, DISCOVERY_NQN, HOST, 0);
    enable(&mut t, d);
    let b = identify(&mut t, d, 0x01, 0).unwrap();
    assert_eq!(b[ctrl_off::CMIC], 0);
    assert_eq!(le32(&b, ctrl_off::OAES) & 1 << 11, 0);
    assert_eq!((b[ctrl_off::ANACAP], le32(&b, ctrl_off::MNAN)), (0, 0));
    assert_eq!(
        features(&mut t, d, true, 0x0b, ctrl_val::OAES_ANA),
        Err(Status::INVALID_FIELD)
    );
}

#[test]
fn mnan_keeps_linuxs_ana_log_within_mdts() {
    let opts = TargetOptions {
        max_transfer: 8192,
        ..TargetOptions::default()
    };
    let mut s = Subsystem::new(SUB);
    for nsid in 1..=1020 {
        let mut ns = NamespaceInfo::new(SUB, nsid, &format!("malloc:{nsid}"), 512, 8);
        ns.ana_group = nsid % ANAGRPMAX + 1;
        s.namespaces.push(ns);
    }
    let mut t = Target::new(opts, listeners(), vec![s.clone()]).unwrap();
    let c = ctrl_on(&mut t, 1, AEC_NS_ANA);
    let b = identify(&mut t, c, 0x01, 0).unwrap();
    let (mdts, nn, mnan) = (
        b[ctrl_off::MDTS],
        le32(&b, ctrl_off::NN),
        le32(&b, ctrl_off::MNAN),
    );
    assert_eq!((mdts, nn, mnan), (1, 1024, 1020));
    let linux =
        ANA_HEADER_BYTES + le32(&b, ctrl_off::NANAGRPID) as usize * ANA_DESCRIPTOR_BYTES + 4 * mnan as usize;
    assert_eq!(linux, 8192, "exactly MDTS");
    // The log of the fullest subsystem, in every group, fits what Linux reads.
    let log = ana_log(&mut t, c, linux as u32, 0, 0, true).unwrap();
    let (_, descs) = parse(&log);
    assert_eq!(descs.len(), ANAGRPMAX as usize);
    assert_eq!(descs.iter().map(|d| d.nsids.len()).sum::<usize>(), 1020);
    // One namespace more is refused, saying what to do.
    let sid = t.subsystem_id(SUB).unwrap();
    let e = t
        .add_namespace(sid, NamespaceInfo::new(SUB, 1021, "malloc:x", 512, 8))
        .unwrap_err();
    assert!(matches!(e, ConfigError::BadNamespace { nsid: 1021, .. }), "{e}");
    assert!(e.to_string().contains("raise max_transfer"), "{e}");
    s.namespaces
        .push(NamespaceInfo::new(SUB, 1021, "malloc:x", 512, 8));
    assert!(Target::new(opts, listeners(), vec![s.clone()]).is_err());
    // With 16 KiB transfers, MNAN is NN.
    let big = TargetOptions {
        max_transfer: 16384,
        ..opts
    };
    let mut t = Target::new(big, listeners(), vec![s]).unwrap();
    let c = ctrl_on(&mut t, 1, AEC_NS_ANA);
    assert_eq!(le32(&identify(&mut t, c, 0x01, 0).unwrap(), ctrl_off::MNAN), 1024);
}

#[test]
fn ana_log_page_per_port_with_rgo_and_offsets() {
    let mut t = ana_target();
    let c1 = ctrl_on(&mut t, 1, AEC_NS_ANA);
    let c2 = ctrl_on(&mut t, 2, AEC_NS_ANA);
    let len = 4096;
    // Port 1: both groups Optimized; group 1 holds 1 and 3, ascending.
    let (count1, d) = parse(&ana_log(&mut t, c1, len, 0, 0, true).unwrap());
    assert_eq!(count1, 0);
    assert_eq!(
        d,
        vec![
            Desc {
                group: 1,
                count: 0,
                state: 0x01,
                nsids: vec![1, 3]
            },
            Desc {
                group: 2,
                count: 0,
                state: 0x01,
                nsids: vec![2]
            },
        ]
    );
    // Port 2: group 2 Non-Optimized, as its listener said.
    let page2 = ana_log(&mut t, c2, len, 0, 0, true).unwrap();
    let (count2, d) = parse(&page2);
    assert!(count2 >= 1, "the listener's state counts as a change");
    assert_eq!((d[0].state, d[1].state), (0x01, 0x02));
    assert!(d[1].count >= 1);
    // The page's size: header, two descriptors, three NSIDs.
    let size = ANA_HEADER_BYTES + 2 * ANA_DESCRIPTOR_BYTES + 3 * 4;
    assert!(page2[size..].iter().all(|&x| x == 0));
    // Return Groups Only (LSP bit 0): descriptors without NSIDs.
    let rgo = ana_log(&mut t, c2, len, 0, 1, true).unwrap();
    let (_, d) = parse(&rgo);
    assert_eq!(d.len(), 2);
    assert!(d.iter().all(|d| d.nsids.is_empty()));
    assert_eq!((d[0].group, d[1].group, d[1].state), (1, 2, 0x02));
    assert!(rgo[ANA_HEADER_BYTES + 2 * ANA_DESCRIPTOR_BYTES..]
        .iter()
        .all(|&x| x == 0));
    // Partial reads: the header alone, then the rest from an offset, as hosts read big logs.
    let hdr = ana_log(&mut t, c2, 16, 0, 0, true).unwrap();
    assert_eq!(&hdr[..], &page2[..16]);
    let rest = ana_log(&mut t, c2, 64, 16, 0, true).unwrap();
    assert_eq!(&rest[..], &page2[16..80]);
    // Up to the page's end is fine (zeroes past it); past it, or unaligned, is not.
    let tail = ana_log(&mut t, c2, 8, size as u64, 0, true).unwrap();
    assert_eq!(tail, vec![0; 8]);
    assert_eq!(
        ana_log(&mut t, c2, 8, size as u64 + 4, 0, true),
        Err(Status::INVALID_FIELD)
    );
    assert_eq!(ana_log(&mut t, c2, 8, 2, 0, true), Err(Status::INVALID_FIELD));
    // OTHER's controllers list only OTHER's namespaces (group 1).
    let o = ctrl_of(&mut t, OTHER, 2, AEC_NS_ANA);
    let (_, d) = parse(&ana_log(&mut t, o, len, 0, 0, true).unwrap());
    assert_eq!(
        d.iter().map(|d| (d.group, d.nsids.clone())).collect::<Vec<_>>(),
        vec![(1, vec![1, 2])]
    );
    // Change counts follow changes of this port only.
    t.set_ana_state(1, 1, AnaState::NonOptimized).unwrap();
    let (after1, d) = parse(&ana_log(&mut t, c1, len, 0, 0, true).unwrap());
    assert_eq!(after1, count1 + 1);
    assert_eq!((d[0].count, d[0].state, d[1].count), (1, 0x02, 0));
    assert_eq!(parse(&ana_log(&mut t, c2, len, 0, 0, true).unwrap()).0, count2);
}

#[test]
fn ana_change_notices_go_to_the_controllers_whose_view_changed() {
    let mut t = ana_target();
    let a = ctrl_on(&mut t, 1, AEC_NS_ANA);
    let b = ctrl_on(&mut t, 2, AEC_NS_ANA);
    let quiet = ctrl_on(&mut t, 1, ctrl_val::OAES_NS_ATTR);
    let other = ctrl_of(&mut t, OTHER, 1, AEC_NS_ANA);
    for (c, cid) in [(a, 10), (b, 20), (quiet, 30), (other, 40)] {
        hold_aer(&mut t, c, cid);
    }
    // Port 1, group 2: a hears of it; b is on another port, quiet did not enable the notice,
    // other's subsystem has no namespace in group 2.
    let ev = t.set_ana_state(1, 2, AnaState::Inaccessible).unwrap();
    assert_eq!(ev.len(), 1);
    assert_eq!((ev[0].cntlid, ev[0].cqe.cid), (a, 10));
    assert!(ev[0].cqe.status().is_success());
    let dw0 = ev[0].cqe.dw0;
    assert_eq!(
        (dw0 & 7, (dw0 >> 8) & 0xff, (dw0 >> 16) & 0xff),
        (2, 0x03, 0x0c),
        "Notice, ANA change, log 0Ch"
    );
    assert_eq!(t.ana_state(1, 2), AnaState::Inaccessible);
    assert_eq!(t.ana_state(2, 2), AnaState::NonOptimized);
    // The same state again changes nothing.
    assert!(t.set_ana_state(1, 2, AnaState::Inaccessible).unwrap().is_empty());
    // A further change before the log is read is not reported (masked)...
    hold_aer(&mut t, a, 11);
    assert!(t.set_ana_state(1, 2, AnaState::Change).unwrap().is_empty());
    // ...nor after a read with Retain Asynchronous Event...
    ana_log(&mut t, a, 4096, 0, 0, true).unwrap();
    assert!(t.set_ana_state(1, 2, AnaState::Inaccessible).unwrap().is_empty());
    // ...but after a read without it.
    ana_log(&mut t, a, 4096, 0, 0, false).unwrap();
    let ev = t.set_ana_state(1, 2, AnaState::Optimized).unwrap();
    assert_eq!(
        ev.iter().map(|e| (e.cntlid, e.cqe.cid)).collect::<Vec<_>>(),
        vec![(a, 11)]
    );
    // Group 1 on port 1: every controller of port 1 with it enabled, OTHER's included.
    ana_log(&mut t, a, 4096, 0, 0, false).unwrap();
    let ev = t.set_ana_state(1, 1, AnaState::NonOptimized).unwrap();
    assert_eq!(
        ev.iter().map(|e| (e.cntlid, e.cqe.cid)).collect::<Vec<_>>(),
        vec![(other, 40)],
        "a's notice waits for a request"
    );
    let (cqe, _) = complete({
        let mut aer = sqe(admin_op::ASYNC_EVENT_REQUEST, 0);
        aer.set_cid(12);
        t.admin(a, &aer, &[])
    });
    assert_eq!(
        (cqe.cid, cqe.dw0),
        (12, 0x000c_0302),
        "queued while none was held"
    );
    // Port 2, group 2: b.
    let ev = t.set_ana_state(2, 2, AnaState::Optimized).unwrap();
    assert_eq!(
        ev.iter().map(|e| (e.cntlid, e.cqe.cid)).collect::<Vec<_>>(),
        vec![(b, 20)]
    );
    // The quiet controller still holds its request.
    assert!(t
        .set_ana_state(1, 2, AnaState::PersistentLoss)
        .unwrap()
        .iter()
        .all(|e| e.cntlid != quiet));
    // Bad ports and groups.
    assert!(matches!(
        t.set_ana_state(9, 1, AnaState::Optimized),
        Err(ConfigError::BadListener { .. })
    ));
    for g in [0, ANAGRPMAX + 1] {
        let e = t.set_ana_state(1, g, AnaState::Optimized).unwrap_err();
        assert!(e.to_string().contains("1 to 128"), "{e}");
    }
}

#[test]
fn io_is_refused_on_paths_that_are_not_accessible() {
    let mut t = ana_target();
    let c1 = ctrl_on(&mut t, 1, AEC_NS_ANA);
    let mut q1 = io_of(&mut t, c1);
    let c2 = ctrl_on(&mut t, 2, AEC_NS_ANA);
    let mut q2 = io_of(&mut t, c2);
    assert!(read(&mut q1, 2).is_ok());
    assert!(read(&mut q2, 2).is_ok(), "Non-Optimized paths serve I/O");
    for (state, sc) in [
        (AnaState::Inaccessible, 0x02),
        (AnaState::PersistentLoss, 0x01),
        (AnaState::Change, 0x03),
    ] {
        t.set_ana_state(1, 2, state).unwrap();
        let st = read(&mut q1, 2).unwrap_err();
        assert_eq!((st.sct(), st.sc(), st.dnr()), (Sct::Path, sc, false), "{state}");
        // Every I/O command, and the target-side decoder too.
        let flush = q1.decode(&sqe(io_op::FLUSH, 2)).unwrap_err();
        assert_eq!(flush.status(), st);
        let mut r = sqe(io_op::READ, 2);
        r.set_lba_range(0, 1);
        let r = sgl(r, SGL_TRANSPORT, 4096);
        assert_eq!(t.io_command(c1, &r).unwrap_err().status(), st);
        // Group 1 and the other port are unaffected.
        assert!(read(&mut q1, 1).is_ok());
        assert!(read(&mut q2, 2).is_ok(), "{state} on port 1 only");
    }
    // The refusal is in the error log, with the queue and the command.
    let e = get_log(&mut t, c1, lid::ERROR, 0, 512, 0, true).unwrap();
    let first = vfpoll_nvme_spec::identify::ErrorLogEntry::parse(&e[..64]);
    assert_eq!(first.status, status::ANA_TRANSITION.field());
    t.set_ana_state(1, 2, AnaState::NonOptimized).unwrap();
    assert!(read(&mut q1, 2).is_ok());
    // Inaccessible on port 2 reaches q2 (its controller's admin queue came through port 2,
    // whichever port the I/O queue used).
    t.set_ana_state(2, 2, AnaState::Inaccessible).unwrap();
    assert_eq!(read(&mut q2, 2).unwrap_err(), status::ANA_INACCESSIBLE);
    // A namespace moved to another group follows that group's state.
    let sid = t.subsystem_id(SUB).unwrap();
    let mut ns2 = t.subsystem(sid).unwrap().namespaces[1].clone();
    ns2.ana_group = 1;
    t.update_namespace(sid, ns2).unwrap();
    assert!(read(&mut q2, 2).is_ok());
}

#[test]
fn listeners_carry_initial_states_and_namespaces_their_groups() {
    let mut t = ana_target();
    assert_eq!(t.ana_state(2, 2), AnaState::NonOptimized);
    assert_eq!(
        (t.ana_state(2, 1), t.ana_state(1, 2)),
        (AnaState::Optimized, AnaState::Optimized)
    );
    // Run-time changes show in the listener's map.
    t.set_ana_state(1, 5, AnaState::Inaccessible).unwrap();
    let l1 = t.listeners().iter().find(|l| l.portid == 1).unwrap();
    assert_eq!(l1.ana.get(&5), Some(&AnaState::Inaccessible));
    // A listener removed and added again starts from its own states; controllers that came
    // through the old one and see a namespace of a changed group hear of it.
    let c = ctrl_on(&mut t, 2, AEC_NS_ANA);
    hold_aer(&mut t, c, 5);
    t.remove_listener(2).unwrap();
    let events = t
        .add_listener(Listener::tcp(2, "0.0.0.0:4421".parse().unwrap()).with_ana(1, AnaState::Change))
        .unwrap();
    assert_eq!(
        (t.ana_state(2, 1), t.ana_state(2, 2)),
        (AnaState::Change, AnaState::Optimized)
    );
    assert_eq!(
        events.iter().map(|e| (e.cntlid, e.cqe.dw0)).collect::<Vec<_>>(),
        vec![(c, 0x000c_0302)]
    );
    // Group IDs are 1 to ANAGRPMAX, in listeners and in namespaces.
    let bad = Listener::tcp(3, "127.0.0.1:4422".parse().unwrap()).with_ana(0, AnaState::Optimized);
    assert!(matches!(
        t.add_listener(bad),
        Err(ConfigError::BadListener { .. })
    ));
    let sid = t.subsystem_id(SUB).unwrap();
    for g in [0, ANAGRPMAX + 1] {
        let mut ns = NamespaceInfo::new(SUB, 7, "malloc:g", 512, 8);
        ns.ana_group = g;
        let e = t.add_namespace(sid, ns).unwrap_err();
        assert!(e.to_string().contains("ANA group IDs run from 1 to 128"), "{e}");
    }
    let mut s = subsystem("nqn.2024-01.io.vfpoll:bad-group");
    s.namespaces[0].ana_group = 200;
    assert!(matches!(
        t.add_subsystem(s),
        Err(ConfigError::BadNamespace { nsid: 1, .. })
    ));
}

#[test]
fn namespace_changes_update_the_ana_log_and_notify() {
    let mut t = ana_target();
    let sid = t.subsystem_id(SUB).unwrap();
    let c = ctrl_on(&mut t, 2, AEC_NS_ANA);
    let (count0, _) = parse(&ana_log(&mut t, c, 4096, 0, 0, false).unwrap());
    hold_aer(&mut t, c, 1);
    hold_aer(&mut t, c, 2);
    // A namespace in a new group: a Namespace Attribute notice, then an ANA one.
    let mut ns = NamespaceInfo::new(SUB, 4, "malloc:d", 512, 8);
    ns.ana_group = 7;
    let ev = t.add_namespace(sid, ns).unwrap();
    assert_eq!(
        ev.iter().map(|e| (e.cqe.cid, e.cqe.dw0)).collect::<Vec<_>>(),
        vec![(1, 0x0004_0002), (2, 0x000c_0302)]
    );
    let (count1, d) = parse(&ana_log(&mut t, c, 4096, 0, 0, false).unwrap());
    assert!(count1 > count0);
    assert_eq!(
        d.iter()
            .map(|d| (d.group, d.state, d.nsids.clone()))
            .collect::<Vec<_>>(),
        vec![(1, 1, vec![1, 3]), (2, 2, vec![2]), (7, 1, vec![4])]
    );
    // A resize keeps the ANA log as it was: no ANA notice.
    get_log(&mut t, c, lid::CHANGED_NS, 0, 4096, 0, false).unwrap();
    hold_aer(&mut t, c, 3);
    hold_aer(&mut t, c, 4);
    let mut ns4 = t.subsystem(sid).unwrap().namespaces[3].clone();
    ns4.blocks = 16;
    let ev = t.update_namespace(sid, ns4.clone()).unwrap();
    assert_eq!(
        ev.iter().map(|e| e.cqe.dw0).collect::<Vec<_>>(),
        vec![0x0004_0002]
    );
    // Moving it to group 2 and removing namespace 3 change the descriptors.
    get_log(&mut t, c, lid::CHANGED_NS, 0, 4096, 0, false).unwrap();
    hold_aer(&mut t, c, 5);
    ns4.ana_group = 2;
    let ev = t.update_namespace(sid, ns4).unwrap();
    assert_eq!(
        ev.iter().map(|e| e.cqe.dw0).collect::<Vec<_>>(),
        vec![0x0004_0002, 0x000c_0302]
    );
    t.remove_namespace(sid, 3).unwrap();
    let (_, d) = parse(&ana_log(&mut t, c, 4096, 0, 0, false).unwrap());
    assert_eq!(
        d.iter().map(|d| (d.group, d.nsids.clone())).collect::<Vec<_>>(),
        vec![(1, vec![1]), (2, vec![2, 4])]
    );
}
