//! Injected faults: each kind does what its documentation says, to the commands it matches.

mod common;

use std::time::{Duration, Instant};

use common::*;
use vfpoll_nvme_model::{admin_opcode as adm, io_opcode as io, Fault, FaultKind, ModelConfig, Status};

/// How long to watch for something that must never happen (a longer window only makes a bug
/// likelier to show; nothing here waits for an event with it).
const QUIET: Duration = Duration::from_millis(30);

fn host() -> Host {
    let mut h = Host::started(ModelConfig::default());
    h.create_qp(1, 16);
    h.create_qp(2, 16);
    h
}

#[test]
fn error_status_skips_the_command() {
    let mut h = host();
    let buf = h.buffer_with(&[0x11; 512]);
    let sc = Status {
        sct: 2,
        sc: 0x81,
        dnr: false,
    }; // Unrecovered Read Error
    h.model
        .inject(Fault::new(FaultKind::Status(sc)).on_sq(1).opcode(io::WRITE));
    assert_eq!(h.model.armed_faults(), 1);
    // Other queues and opcodes are not matched.
    h.cmd(2, Sqe::rw(io::WRITE, 1, 0, 1).prp(buf.get(), 0)).ok();
    h.cmd(1, Sqe::new(io::FLUSH).nsid(1)).ok();
    h.model.write_ns(1, 0, &[0; 512]).unwrap();
    let c = h.cmd(1, Sqe::rw(io::WRITE, 1, 0, 1).prp(buf.get(), 0));
    assert_eq!(c.status, sc);
    assert_eq!(
        h.model.read_ns(1, 0, 1).unwrap(),
        vec![0; 512],
        "the write was not executed"
    );
    assert_eq!(h.model.armed_faults(), 0, "one-shot");
    h.cmd(1, Sqe::rw(io::WRITE, 1, 0, 1).prp(buf.get(), 0)).ok();
    let st = h.model.stats();
    assert_eq!((st.faults_applied, st.errors), (1, 1));
}

#[test]
fn error_status_for_n_commands_and_on_admin() {
    let mut h = host();
    h.model.inject(
        Fault::new(FaultKind::Status(Status::INTERNAL_ERROR))
            .io()
            .times(3),
    );
    h.model.inject(
        Fault::new(FaultKind::Status(Status::INVALID_FIELD))
            .admin()
            .opcode(adm::IDENTIFY),
    );
    let results: Vec<Status> = (0..4)
        .map(|i| h.cmd(1 + i % 2, Sqe::new(io::FLUSH).nsid(1)).status)
        .collect();
    assert_eq!(
        results,
        [
            Status::INTERNAL_ERROR,
            Status::INTERNAL_ERROR,
            Status::INTERNAL_ERROR,
            Status::SUCCESS
        ]
    );
    let c = h.admin(Sqe::new(adm::IDENTIFY).prp(h.mem.alloc(PAGE).get(), 0).cdw(10, 1));
    assert_eq!(c.status, Status::INVALID_FIELD);
    h.admin(Sqe::new(adm::IDENTIFY).prp(h.mem.alloc(PAGE).get(), 0).cdw(10, 1))
        .ok();
}

#[test]
fn clear_faults_disarms() {
    let mut h = host();
    h.model.inject(Fault::new(FaultKind::Drop).io().times(5));
    h.model.clear_faults();
    assert_eq!(h.model.armed_faults(), 0);
    h.cmd(1, Sqe::new(io::FLUSH).nsid(1)).ok();
    h.model.inject(
        Fault::new(FaultKind::Status(Status::INTERNAL_ERROR))
            .io()
            .times(5),
    );
    h.cmd(1, Sqe::new(io::FLUSH).nsid(1));
    assert_eq!(
        h.model.armed_faults(),
        1,
        "a fault for 5 commands, used once, stays armed"
    );
    h.model.clear_faults();
    h.cmd(1, Sqe::new(io::FLUSH).nsid(1)).ok();
}

#[test]
fn delay_posts_late() {
    let mut h = host();
    let delay = Duration::from_millis(40);
    h.model.inject(Fault::new(FaultKind::Delay(delay)).on_sq(1));
    let t = Instant::now();
    h.model.write_ns(1, 3, &[0x77; 512]).unwrap();
    let buf = h.mem.alloc(PAGE);
    let cid = h.submit(1, Sqe::rw(io::READ, 1, 3, 1).prp(buf.get(), 0));
    // Meanwhile other queues are served.
    h.cmd(2, Sqe::new(io::FLUSH).nsid(1)).ok();
    // Not before the delay: judged by when the completion is seen, so that a stall of this
    // thread cannot fail the test.
    let c = h.reap(1, TIMEOUT).expect("late completion").ok();
    assert!(t.elapsed() >= delay, "completed after {:?}", t.elapsed());
    assert_eq!(c.cid, cid);
    assert_eq!(h.mem.read_vec(buf, 512), vec![0x77; 512], "executed");
}

#[test]
fn drop_never_completes_until_aborted() {
    let mut h = host();
    let buf = h.buffer_with(&[0x42; 512]);
    h.model
        .inject(Fault::new(FaultKind::Drop).on_sq(1).opcode(io::WRITE));
    let cid = h.submit(1, Sqe::rw(io::WRITE, 1, 9, 1).prp(buf.get(), 0));
    assert!(
        h.reap(1, QUIET).is_none(),
        "no completion: the host's timeout must catch it"
    );
    assert_eq!(
        h.model.read_ns(1, 9, 1).unwrap(),
        vec![0x42; 512],
        "but the command was executed"
    );
    // Later commands on the queue complete.
    h.cmd(1, Sqe::new(io::FLUSH).nsid(1)).ok();
    // Abort finds the dropped command: it completes with Command Abort Requested, first.
    let acid = h.submit(0, Sqe::new(adm::ABORT).cdw(10, (cid as u32) << 16 | 1));
    let a = h.reap(0, TIMEOUT).unwrap();
    assert_eq!(
        (a.cid, a.status, a.dw0 & 1),
        (acid, Status::SUCCESS, 0),
        "aborted"
    );
    let c = h.reap(1, TIMEOUT).expect("the aborted command's completion");
    assert_eq!((c.cid, c.status), (cid, Status::ABORT_REQUESTED));
}

#[test]
fn abort_catches_a_delayed_command() {
    let mut h = host();
    h.model
        .inject(Fault::new(FaultKind::Delay(Duration::from_secs(30))).on_sq(2));
    let cid = h.submit(2, Sqe::new(io::FLUSH).nsid(1));
    // Abort only once the model holds the command (a host aborts after a timeout).
    while h.model.stats().io_commands(io::FLUSH) == 0 {
        std::thread::yield_now();
    }
    let a = h.admin(Sqe::new(adm::ABORT).cdw(10, (cid as u32) << 16 | 2)).ok();
    assert_eq!(a.dw0 & 1, 0);
    let c = h.reap(2, TIMEOUT).expect("aborted long before its delay ran out");
    assert_eq!((c.cid, c.status), (cid, Status::ABORT_REQUESTED));
    let a = h.admin(Sqe::new(adm::ABORT).cdw(10, (cid as u32) << 16 | 2)).ok();
    assert_eq!(a.dw0 & 1, 1, "nothing left to abort");
}

#[test]
fn deleting_an_sq_completes_its_dropped_commands() {
    let mut h = host();
    h.model.inject(Fault::new(FaultKind::Drop).on_sq(2).times(2));
    let cids = [
        h.submit(2, Sqe::new(io::FLUSH).nsid(1)),
        h.submit(2, Sqe::new(io::FLUSH).nsid(1)),
    ];
    assert!(h.reap(2, QUIET).is_none());
    h.admin(Sqe::new(adm::DELETE_IO_SQ).cdw(10, 2)).ok();
    for cid in cids {
        let c = h.reap(2, TIMEOUT).expect("completed by the deletion");
        assert_eq!((c.cid, c.status), (cid, Status::ABORTED_SQ_DELETION));
    }
}

#[test]
fn controller_fatal_stops_everything_until_reset() {
    let mut h = host();
    let buf = h.buffer_with(&[0x99; 512]);
    h.model
        .inject(Fault::new(FaultKind::ControllerFatal).on_sq(1).opcode(io::WRITE));
    h.submit(1, Sqe::rw(io::WRITE, 1, 0, 1).prp(buf.get(), 0));
    let csts = h.wait_csts(|c| c.fatal());
    assert!(csts.ready(), "RDY stays as it was; CFS tells");
    assert!(h.reap(1, QUIET).is_none());
    h.submit(2, Sqe::new(io::FLUSH).nsid(1));
    assert!(h.reap(2, QUIET).is_none(), "no queue is processed");
    assert_eq!(
        h.model.read_ns(1, 0, 1).unwrap(),
        vec![0; 512],
        "the command was not executed"
    );
    assert_eq!(h.disable().0, 0, "reset clears CFS");
    assert!(h.enable(good_cc(), 8).ready());
    h.create_qp(1, 4);
    h.cmd(1, Sqe::rw(io::WRITE, 1, 0, 1).prp(buf.get(), 0)).ok();
}

#[test]
fn set_fatal_from_the_handle() {
    let mut h = host();
    h.model.set_fatal();
    assert!(h.wait_csts(|c| c.fatal()).fatal());
    h.submit(1, Sqe::new(io::FLUSH).nsid(1));
    assert!(h.reap(1, QUIET).is_none());
}

#[test]
fn bogus_cid() {
    let mut h = host();
    h.model.inject(Fault::new(FaultKind::BogusCid(0xbeef)).on_sq(1));
    let cid = h.submit(1, Sqe::new(io::FLUSH).nsid(1));
    let c = h.reap(1, TIMEOUT).unwrap();
    assert_eq!((c.cid, c.sqid, c.status), (0xbeef, 1, Status::SUCCESS));
    assert_ne!(cid, 0xbeef);
    h.cmd(1, Sqe::new(io::FLUSH).nsid(1)).ok();
}

#[test]
fn wrong_phase_stalls_the_cq() {
    let mut h = host();
    h.model.inject(Fault::new(FaultKind::WrongPhase).on_sq(1));
    let cid = h.submit(1, Sqe::new(io::FLUSH).nsid(1));
    // The entry is there, complete but for its phase, which says "old".
    let t = Instant::now();
    while h.peek_raw(1).cid != cid {
        assert!(t.elapsed() < TIMEOUT, "the entry was never written");
        std::thread::sleep(Duration::from_micros(100));
    }
    let raw = h.peek_raw(1);
    assert_eq!((raw.cid, raw.sqid, raw.phase), (cid, 1, false));
    assert!(
        h.reap(1, Duration::ZERO).is_none(),
        "a host checking the phase does not consume it"
    );
    // Nothing more is posted to CQ 1, and SQ 1 is not fetched from; other queues work.
    h.submit(1, Sqe::new(io::FLUSH).nsid(1));
    h.cmd(2, Sqe::new(io::FLUSH).nsid(1)).ok();
    assert!(h.reap(1, QUIET).is_none());
    assert_eq!(h.peek_raw(1), raw, "the stalled slot is not rewritten");
    assert_eq!(
        h.model.stats().io_commands(io::FLUSH),
        2,
        "the second command on SQ 1 was never fetched"
    );
}

#[test]
fn duplicate_completion() {
    let mut h = host();
    h.model.inject(Fault::new(FaultKind::Duplicate).on_sq(1));
    let cid = h.submit(1, Sqe::new(io::FLUSH).nsid(1));
    let a = h.reap(1, TIMEOUT).unwrap();
    let b = h.reap(1, TIMEOUT).expect("the copy");
    assert_eq!((a.cid, b.cid), (cid, cid));
    assert_eq!(a, b);
    assert!(h.reap(1, QUIET).is_none(), "exactly two");
    let next = h.cmd(1, Sqe::new(io::FLUSH).nsid(1)).ok();
    assert_ne!(next.cid, cid);
    assert_eq!(
        h.model.stats().completions_posted,
        4 + 2 + 1,
        "4 queue creations, the pair, one more"
    );
}

#[test]
fn completion_latency_shapes_io_only() {
    // Long enough that a loaded test machine cannot blur the difference: the upper bounds
    // below leave it more than a second.
    let latency = Duration::from_millis(500);
    let mut h = Host::started(ModelConfig {
        completion_latency: Some(latency),
        ..Default::default()
    });
    h.create_qp(1, 16);
    let t = Instant::now();
    h.admin(Sqe::new(adm::GET_FEATURES).cdw(10, 7)).ok();
    assert!(t.elapsed() < latency, "admin commands are not delayed");
    for _ in 0..2 {
        let t = Instant::now();
        h.cmd(1, Sqe::new(io::FLUSH).nsid(1)).ok();
        let e = t.elapsed();
        assert!(e >= latency && e < latency * 4, "{e:?}");
    }
    // Several in flight complete together, about one latency after submission.
    let t = Instant::now();
    for _ in 0..8 {
        h.push(1, Sqe::new(io::FLUSH).nsid(1));
    }
    h.ring(1);
    for _ in 0..8 {
        h.reap(1, TIMEOUT).unwrap().ok();
    }
    assert!(
        t.elapsed() < latency * 4,
        "overlapped (one after the other would take {:?}): {:?}",
        latency * 8,
        t.elapsed()
    );
}
