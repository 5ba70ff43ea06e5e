//! Every fault kind of the model, through the real driver. Each must come out as an error: never
//! as success, never as memory corruption, never as a hang. After each one the tests check that a
//! buffer the driver never saw still holds its data, that the namespace holds what the writes the
//! model executed wrote (and nothing else), and, where the fault leaves it usable, that the
//! controller still writes and reads correctly.
//!
//! Queue pair timeouts are a second: short enough that the suite stays fast, long enough that a
//! command which should succeed cannot time out because a loaded machine stalled the model's
//! thread for a while. The driver checks them every 4096 idle polls, so the tests keep polling
//! under a wall-clock bound. Windows the tests rely on (a delay inside or outside a timeout)
//! are fractions of it, with hundreds of milliseconds to spare on each side; upper bounds on
//! how long something takes are generous ([`PROMPT`], multiples of the timeout).

mod drv;

use std::time::{Duration, Instant};

use drv::*;
use vfpoll_dma::{DmaBuf, PageSize};
use vfpoll_nvme::{Done, NvmeError, QueuePair, RegionBuf, Sct};
use vfpoll_nvme_model::{admin_opcode as adm, io_opcode as io, Fault, FaultKind, Status};

/// Queue pair timeout in these tests.
const T: Duration = Duration::from_secs(1);
const BLOCKS: u64 = 4096;

/// A queue pair over a seeded namespace, with a bystander buffer. Fields drop in order.
struct Fx {
    qp: QueuePair<RegionBuf>,
    bystander: RegionBuf,
    by_data: Vec<u8>,
    shadow: Shadow,
    rig: Rig,
}

impl Fx {
    fn new(entries: u16) -> Fx {
        let rig = rig(small_cfg(BLOCKS, 5));
        rig.model
            .write_ns(1, 0, &pattern(1, BLOCKS as usize * 512))
            .unwrap();
        let shadow = Shadow::of(&rig.model, 1);
        let qp = rig.ctrl.create_qpair(&qopts(entries, T)).unwrap();
        let by_data = pattern(2, 64 * 1024);
        let bystander = region_buf(&rig.ctrl, 0, &by_data);
        Fx {
            qp,
            bystander,
            by_data,
            shadow,
            rig,
        }
    }

    fn qid(&self) -> u16 {
        self.qp.qid()
    }

    /// Makes the model answer I/O commands of `opcode` on this queue pair with `kind`.
    fn inject(&self, kind: FaultKind, opcode: u8) {
        self.rig
            .model
            .inject(Fault::new(kind).on_sq(self.qid()).opcode(opcode));
    }

    /// Submits a read of `blocks` blocks at `slba` of namespace 1 into a fresh read target.
    fn read(&mut self, slba: u64, blocks: usize, tag: u64) {
        let buf = self.empty_buf(blocks);
        self.qp.read(1, slba, buf, tag).map_err(|r| r.error).unwrap();
    }

    /// A buffer of `blocks` blocks holding a fresh pattern.
    fn data_buf(&self, seed: u64, blocks: usize) -> (RegionBuf, Vec<u8>) {
        let d = pattern(seed, blocks * 512);
        (region_buf(&self.rig.ctrl, 0, &d), d)
    }

    /// A buffer of `blocks` blocks filled with 0xee (a read target).
    fn empty_buf(&self, blocks: usize) -> RegionBuf {
        region_buf(&self.rig.ctrl, 0, &vec![0xee; blocks * 512])
    }

    /// Nothing leaked into memory or the namespace.
    fn check_clean(&self) {
        assert_eq!(
            contents(&self.bystander),
            self.by_data,
            "bystander buffer changed"
        );
        self.shadow.check(&self.rig.model);
    }

    /// Nothing leaked (`check_clean`), and a write and a read on the fixture's queue pair still
    /// work and agree with the namespace.
    fn check_clean_and_usable(&mut self) {
        self.check_clean();
        usable(&mut self.qp, &mut self.shadow, &self.rig);
    }

    /// A write and a read on a fresh queue pair still work and agree with the namespace.
    fn check_usable(&mut self) {
        let mut qp = self.rig.ctrl.create_qpair::<RegionBuf>(&qopts(8, T)).unwrap();
        usable(&mut qp, &mut self.shadow, &self.rig);
    }
}

/// Every request of `done` came back with the reset's error.
fn assert_all_reset(done: &[Done<RegionBuf>]) {
    for d in done {
        assert!(
            matches!(d.result, Err(NvmeError::Reset { .. })),
            "tag {}: {:?}",
            d.tag,
            d.result
        );
    }
}

fn usable(qp: &mut QueuePair<RegionBuf>, shadow: &mut Shadow, rig: &Rig) {
    let d = pattern(99, 8 * 512);
    let done = sync(qp, |q, b| q.write(1, 4000, b, 1), region_buf(&rig.ctrl, 0, &d));
    done.result.expect("write after the fault");
    shadow.write(4000, &d);
    let done = sync(
        qp,
        |q, b| q.read(1, 4000, b, 2),
        region_buf(&rig.ctrl, 4, &[0; 8 * 512]),
    );
    done.result.expect("read after the fault");
    assert_eq!(contents(&done.buf.unwrap()), d);
    shadow.check(&rig.model);
}

#[test]
fn error_status_is_an_error_with_the_spec_name_and_dnr() {
    let mut fx = Fx::new(16);
    let vendor = Status {
        sct: 7,
        sc: 0xc3,
        dnr: false,
    };
    let cases: [(Status, Sct, Option<&str>); 6] = [
        (Status::generic(0x06), Sct::Generic, Some("Internal Error")),
        (
            Status::generic(0x22).with_dnr(false),
            Sct::Generic,
            Some("Transient Transport Error"),
        ),
        (
            Status::command_specific(0x82),
            Sct::CommandSpecific,
            Some("Attempted Write to Read Only Range"),
        ),
        (Status::media(0x80), Sct::Media, Some("Write Fault")),
        (
            Status::media(0x81).with_dnr(false),
            Sct::Media,
            Some("Unrecovered Read Error"),
        ),
        (vendor, Sct::Vendor, None),
    ];
    let qid = fx.qid();
    for (i, &(injected, sct, name)) in cases.iter().enumerate() {
        let lba = 16 * i as u64;
        let check = |r: &Result<u64, NvmeError>, op: &str| {
            let s = status_of(r);
            assert_eq!(
                (s.sct(), s.sc(), s.dnr(), s.name()),
                (sct, injected.sc, injected.dnr, name),
                "{injected:?}"
            );
            assert!(!s.is_success());
            let text = r.as_ref().unwrap_err().to_string();
            assert!(text.starts_with(&format!("{op} failed: ")), "{text}");
            assert!(text.contains(name.unwrap_or("status code 0xc3")), "{text}");
            assert_eq!(text.contains("DNR"), injected.dnr, "{text}");
        };
        // A write that fails moves no data: the namespace keeps its blocks.
        fx.rig.model.inject(
            Fault::new(FaultKind::Status(injected))
                .on_sq(qid)
                .opcode(io::WRITE),
        );
        let (b, d) = fx.data_buf(100 + i as u64, 8);
        let done = sync(&mut fx.qp, |q, b| q.write(1, lba, b, 10 + i as u64), b);
        assert_eq!(done.tag, 10 + i as u64);
        check(&done.result, "Write");
        assert_eq!(
            contents(&done.buf.expect("buffer back")),
            d,
            "the write buffer is untouched"
        );
        // A read that fails leaves its buffer as it was.
        fx.rig.model.inject(
            Fault::new(FaultKind::Status(injected))
                .on_sq(qid)
                .opcode(io::READ),
        );
        let b = fx.empty_buf(8);
        let done = sync(&mut fx.qp, |q, b| q.read(1, lba, b, 0), b);
        check(&done.result, "Read");
        assert_eq!(contents(&done.buf.unwrap()), vec![0xee; 8 * 512], "no data moved");
        // Without the fault the same write goes through.
        let (b, d) = fx.data_buf(200 + i as u64, 8);
        sync(&mut fx.qp, |q, b| q.write(1, lba, b, 0), b)
            .result
            .expect("write");
        fx.shadow.write(lba, &d);
    }
    let st = fx.qp.stats();
    assert_eq!(
        (st.requests, st.errors, st.aborts, st.bogus_completions),
        (18, 12, 0, 0)
    );
    // The controller's Error Information log has them too, newest first.
    let log = fx.rig.ctrl.error_log().unwrap();
    assert_eq!(log.len(), 12);
    let newest = vfpoll_nvme::Status::from_field(log[0].status);
    assert_eq!((log[0].sqid, newest.sct(), newest.sc()), (qid, Sct::Vendor, 0xc3));
    assert_eq!(fx.rig.model.stats().errors, 12);
    fx.check_clean();
    fx.check_usable();
}

#[test]
fn late_completion_within_the_timeout_is_success() {
    let mut fx = Fx::new(16);
    // Long enough that read 2, submitted after it, completes first even if this thread stalls
    // between the two submissions; short enough to stay well inside the timeout.
    let delay = T / 2;
    fx.inject(FaultKind::Delay(delay), io::READ);
    let start = Instant::now();
    fx.read(64, 16, 1);
    fx.read(512, 4, 2);
    let done = wait_for(&mut fx.qp, 2, HANG);
    assert_eq!(
        done.iter().map(|d| d.tag).collect::<Vec<_>>(),
        [2, 1],
        "the delayed read comes last"
    );
    assert!(start.elapsed() >= delay);
    for d in done {
        d.result
            .expect("a late completion within the timeout is a success");
        let (lba, len) = if d.tag == 1 {
            (64, 16 * 512)
        } else {
            (512, 4 * 512)
        };
        assert_eq!(contents(&d.buf.unwrap()), fx.shadow.get(lba, len));
    }
    assert_eq!(fx.qp.stats().aborts, 0);
    fx.check_clean();
    fx.check_usable();
}

#[test]
fn late_completion_beyond_the_timeout_is_aborted() {
    let mut fx = Fx::new(16);
    fx.inject(FaultKind::Delay(Duration::from_secs(30)), io::READ);
    let start = Instant::now();
    fx.read(100, 8, 1);
    let (b, d) = fx.data_buf(7, 8);
    fx.qp.write(1, 200, b, 2).map_err(|r| r.error).unwrap();
    fx.read(300, 8, 3);
    let mut done = wait_for(&mut fx.qp, 3, HANG);
    done.sort_by_key(|d| d.tag);
    fx.shadow.write(200, &d);
    done[1].result.as_ref().expect("write");
    done[2].result.as_ref().expect("read");
    assert_eq!(contents(done[2].buf.as_ref().unwrap()), fx.shadow.get(300, 4096));
    let s = status_of(&done[0].result);
    assert_eq!(
        (s.sct(), s.sc(), s.name()),
        (Sct::Generic, 0x07, Some("Command Abort Requested"))
    );
    assert!(
        done[0].buf.is_some(),
        "the controller returned the command: its buffer comes back"
    );
    let took = start.elapsed();
    assert!(took >= T && took < T + PROMPT, "aborted after {took:?}");
    assert_eq!(fx.qp.stats().aborts, 1);
    assert_eq!(fx.rig.model.stats().admin_commands(adm::ABORT), 1);
    fx.check_clean_and_usable();
}

#[test]
fn dropped_completion_is_aborted_and_reported() {
    let mut fx = Fx::new(16);
    fx.inject(FaultKind::Drop, io::WRITE);
    let (b, d) = fx.data_buf(8, 16);
    fx.qp.write(1, 1000, b, 1).map_err(|r| r.error).unwrap();
    fx.qp.read(1, 0, fx.empty_buf(8), 2).map_err(|r| r.error).unwrap();
    let first = wait_for(&mut fx.qp, 1, HANG).pop().unwrap();
    assert_eq!(first.tag, 2);
    assert_eq!(contents(&first.buf.unwrap()), fx.shadow.get(0, 4096));
    let lost = wait_for(&mut fx.qp, 1, HANG).pop().unwrap();
    assert_eq!(lost.tag, 1);
    assert_eq!(status_of(&lost.result).name(), Some("Command Abort Requested"));
    assert_eq!(contents(&lost.buf.unwrap()), d);
    assert_eq!(fx.qp.stats().aborts, 1);
    // The model executes a command whose completion it drops: the blocks were written, though
    // the host was told the write failed (as a real controller may).
    fx.shadow.write(1000, &d);
    fx.check_clean_and_usable();
}

#[test]
fn dropped_completion_with_a_refused_abort_resets_the_controller_and_returns_the_buffers() {
    let mut fx = Fx::new(16);
    let mut pool = fx.rig.ctrl.dma().pool(4096, 8, PageSize::Base4K).unwrap();
    let mut qp = fx.rig.ctrl.create_qpair::<DmaBuf>(&qopts(16, T)).unwrap();
    let qid = qp.qid();
    let start = Instant::now();
    fx.rig
        .model
        .inject(Fault::new(FaultKind::Drop).on_sq(qid).times(2));
    // Abort Command Limit Exceeded: the controller refuses every abort.
    let refuse = Status::command_specific(0x03);
    fx.rig.model.inject(
        Fault::new(FaultKind::Status(refuse))
            .admin()
            .opcode(adm::ABORT)
            .times(10),
    );
    let w = pool.alloc().unwrap();
    let d = pattern(9, 4096);
    pool.write(&w, 0, &d).unwrap();
    qp.write(1, 2000, w, 1).map_err(|r| r.error).unwrap();
    qp.read(1, 8, pool.alloc().unwrap(), 2)
        .map_err(|r| r.error)
        .unwrap();
    let done = wait_for(&mut qp, 2, HANG);
    assert!(start.elapsed() >= 2 * T, "reset after {:?}", start.elapsed());
    for d in done {
        match &d.result {
            Err(NvmeError::Reset { qid: q, .. }) => assert_eq!(*q, qid),
            other => panic!("tag {}: expected the reset's error, got {other:?}", d.tag),
        }
        // The controller was disabled before the reset's error: the buffer is safe to reuse.
        pool.free(d.buf.expect("the buffer comes back with the reset's error"));
    }
    assert_eq!(pool.available(), 8, "nothing leaked");
    let st = qp.stats();
    assert_eq!(
        (st.aborts, st.errors, st.completions, st.resets, st.reset_errors),
        (2, 2, 0, 1, 2)
    );
    assert_eq!(fx.rig.model.stats().admin_commands(adm::ABORT), 2);
    // The same queue pair works on.
    let b = pool.alloc().unwrap();
    qp.read(1, 2000, b, 3).map_err(|r| r.error).unwrap();
    let r = wait_for(&mut qp, 1, HANG).pop().unwrap();
    r.result.expect("a read after the reset");
    let b = r.buf.unwrap();
    let mut got = vec![0; 4096];
    pool.read(&b, 0, &mut got).unwrap();
    assert_eq!(got, d, "the write the model executed before the reset");
    pool.free(b);
    assert_eq!(fx.rig.ctrl.resets(), (1, 0));
    fx.rig.model.clear_faults();
    drop(qp);
    fx.shadow.write(2000, &d); // executed by the model, completion dropped
    fx.rig.ctrl.smart_log().expect("admin still works");
    fx.check_clean();
    fx.check_usable();
}

#[test]
fn controller_fatal_resets_and_hands_every_request_back() {
    let mut fx = Fx::new(16);
    let (b, d) = fx.data_buf(11, 8);
    sync(&mut fx.qp, |q, b| q.write(1, 50, b, 0), b)
        .result
        .expect("write before the fault");
    fx.shadow.write(50, &d);
    fx.inject(FaultKind::ControllerFatal, io::WRITE);
    let (b, wd) = fx.data_buf(12, 8);
    let r1 = region_buf(&fx.rig.ctrl, 0, &[0xee; 4096]);
    let start = Instant::now();
    fx.qp.write(1, 60, b, 1).map_err(|r| r.error).unwrap();
    fx.qp.read(1, 0, r1, 2).map_err(|r| r.error).unwrap();
    fx.qp.read(1, 8, fx.empty_buf(8), 3).map_err(|r| r.error).unwrap();
    let mut done = wait_for(&mut fx.qp, 3, HANG);
    let took = start.elapsed();
    assert!(took < PROMPT, "CFS to the reset's errors: {took:?}");
    done.sort_by_key(|d| d.tag);
    assert_all_reset(&done);
    // Nothing after the fatal command ran: the read buffers come back untouched.
    assert_eq!(
        contents(done[0].buf.as_ref().unwrap()),
        wd,
        "the write's own data"
    );
    assert_eq!(contents(done[1].buf.as_ref().unwrap()), vec![0xee; 4096]);
    assert_eq!(contents(done[2].buf.as_ref().unwrap()), vec![0xee; 4096]);
    fx.rig.ctrl.smart_log().expect("admin after the reset");
    assert!(!fx.rig.ctrl.status().fatal(), "the reset cleared CFS");
    assert_eq!(fx.rig.ctrl.resets(), (1, 0));
    assert_eq!(fx.rig.ctrl.failed(), None);
    assert_eq!(
        fx.qp.stats().aborts,
        0,
        "CFS is noticed without waiting for a timeout"
    );
    // The same queue pair, with its queues re-created under the same id, and a new one work.
    usable(&mut fx.qp, &mut fx.shadow, &fx.rig);
    assert_eq!(fx.qp.stats().resets, 1);
    fx.check_clean();
    fx.check_usable();
}

#[test]
fn controller_fatal_while_idle_is_reset_and_the_queue_pair_goes_on() {
    let mut fx = Fx::new(16);
    fx.rig.model.set_fatal();
    let start = Instant::now();
    while !fx.rig.ctrl.status().fatal() {
        assert!(start.elapsed() < HANG);
        std::thread::sleep(Duration::from_millis(1));
    }
    // Submitted to the fatal controller (the doorbell rings before anyone noticed CFS): it
    // comes back with the reset's error.
    fx.qp.read(1, 0, fx.empty_buf(1), 1).map_err(|r| r.error).unwrap();
    let d = wait_for(&mut fx.qp, 1, HANG).pop().unwrap();
    assert!(matches!(d.result, Err(NvmeError::Reset { .. })), "{:?}", d.result);
    assert!(d.buf.is_some());
    assert_eq!(fx.qp.stats().aborts, 0);
    usable(&mut fx.qp, &mut fx.shadow, &fx.rig);
    fx.check_clean();
}

#[test]
fn bogus_command_id_is_counted_and_its_command_times_out() {
    let mut fx = Fx::new(16);
    // A command id outside the tracker table, and one inside it but not in flight.
    for bogus in [0x7ff0u16, 9] {
        let mut qp = fx.rig.ctrl.create_qpair::<RegionBuf>(&qopts(16, T)).unwrap();
        fx.rig.model.inject(
            Fault::new(FaultKind::BogusCid(bogus))
                .on_sq(qp.qid())
                .opcode(io::WRITE),
        );
        let (b, d) = fx.data_buf(bogus as u64, 8);
        qp.read(1, 16, fx.empty_buf(8), 1).map_err(|r| r.error).unwrap();
        qp.write(1, 3000, b, 2).map_err(|r| r.error).unwrap();
        qp.read(1, 24, fx.empty_buf(8), 3).map_err(|r| r.error).unwrap();
        let mut done = wait_for(&mut qp, 3, HANG);
        done.sort_by_key(|d| d.tag);
        for (d, lba) in [(&done[0], 16), (&done[2], 24)] {
            d.result.as_ref().expect("bystander reads succeed");
            assert_eq!(contents(d.buf.as_ref().unwrap()), fx.shadow.get(lba, 4096));
        }
        assert!(
            done[1].result.is_err(),
            "bogus {bogus:#x}: the command must fail, got {:?}",
            done[1].result
        );
        let st = qp.stats();
        assert_eq!((st.bogus_completions, st.completions), (1, 3), "bogus {bogus:#x}");
        expect_quiet(&mut qp, Duration::from_millis(30));
        fx.shadow.write(3000, &d); // executed; only its completion was wrong
    }
    fx.check_clean();
    fx.check_usable();
}

#[test]
fn wrong_phase_completion_is_not_consumed() {
    let mut fx = Fx::new(4);
    // Before and after the completion queue wrapped (its phase tag flipped).
    for (n, warm) in [0, 5].into_iter().enumerate() {
        let mut qp = fx.rig.ctrl.create_qpair::<RegionBuf>(&qopts(4, T)).unwrap();
        for i in 0..warm {
            sync(&mut qp, |q, b| q.read(1, i, b, 0), fx.empty_buf(1))
                .result
                .unwrap();
        }
        fx.rig
            .model
            .inject(Fault::new(FaultKind::WrongPhase).on_sq(qp.qid()));
        qp.read(1, 32, fx.empty_buf(1), 1).map_err(|r| r.error).unwrap();
        qp.read(1, 40, fx.empty_buf(1), 2).map_err(|r| r.error).unwrap();
        expect_quiet(&mut qp, T / 4);
        assert_eq!(qp.stats().completions, warm);
        // Both time out, their aborts change nothing (the CQ is stalled), and the reset one
        // timeout later hands them back.
        let done = wait_for(&mut qp, 2, HANG);
        assert_all_reset(&done);
        assert_eq!(
            qp.stats().completions,
            warm,
            "the wrong-phase entry was never consumed"
        );
        // The CQ stalled behind it, so the second read never ran.
        let second = done
            .iter()
            .find(|d| d.tag == 2)
            .expect("the second read is reported");
        assert_eq!(
            contents(second.buf.as_ref().expect("handed back")),
            vec![0xee; 512]
        );
        // The queue pair works again.
        let d = sync(&mut qp, |q, b| q.read(1, 40, b, 3), fx.empty_buf(1));
        d.result.expect("a read after the reset");
        assert_eq!(fx.rig.ctrl.resets().0, n as u64 + 1);
        assert_eq!(contents(d.buf.as_ref().unwrap()), fx.shadow.get(40, 512));
    }
    fx.check_clean();
    fx.check_usable();
}

#[test]
fn duplicate_completion_is_delivered_once() {
    let mut fx = Fx::new(16);
    fx.inject(FaultKind::Duplicate, io::READ);
    fx.read(128, 8, 1);
    let (b, d) = fx.data_buf(13, 8);
    fx.qp.write(1, 136, b, 2).map_err(|r| r.error).unwrap();
    let mut done = wait_for(&mut fx.qp, 2, HANG);
    done.sort_by_key(|d| d.tag);
    fx.shadow.write(136, &d);
    assert_eq!(contents(done[0].buf.as_ref().unwrap()), fx.shadow.get(128, 4096));
    done[1].result.as_ref().unwrap();
    expect_quiet(&mut fx.qp, Duration::from_millis(50));
    let st = fx.qp.stats();
    assert_eq!((st.bogus_completions, st.completions, st.requests), (1, 3, 2));
    fx.check_clean_and_usable();
}

/// A duplicate still in the completion queue when its command id is handed out again must not
/// complete the new command (before the device has even run it).
#[test]
fn duplicate_completion_left_in_the_queue_does_not_complete_the_next_command() {
    let mut fx = Fx::new(16);
    fx.inject(FaultKind::Duplicate, io::READ);
    let posted = fx.rig.model.stats().completions_posted;
    fx.read(128, 8, 1);
    // Take exactly one completion: the duplicate stays behind in the CQ.
    let mut first = Vec::new();
    let start = Instant::now();
    while fx.qp.poll(1, |d| first.push(d)) == 0 {
        assert!(start.elapsed() < HANG);
        std::thread::yield_now();
    }
    first.pop().unwrap().result.unwrap();
    while fx.rig.model.stats().completions_posted < posted + 2 {
        assert!(start.elapsed() < HANG, "the duplicate was never posted");
        std::thread::yield_now();
    }
    let delay = T / 2; // late, but within the timeout
    fx.inject(FaultKind::Delay(delay), io::READ);
    let submitted = Instant::now();
    fx.read(256, 8, 2);
    let d = wait_for(&mut fx.qp, 1, HANG).pop().unwrap();
    let took = submitted.elapsed();
    assert_eq!(d.tag, 2);
    d.result.as_ref().unwrap();
    assert!(
        took >= delay,
        "read 2 was delivered after {took:?}, before the device completed it"
    );
    assert_eq!(contents(d.buf.as_ref().unwrap()), fx.shadow.get(256, 4096));
    assert_eq!(fx.qp.stats().bogus_completions, 1);
}

/// A command whose completion never comes must time out even while other commands keep
/// completing (an application that polls now and then, finding work each time).
#[test]
fn a_lost_command_times_out_while_others_complete() {
    let mut fx = Fx::new(32);
    fx.inject(FaultKind::Drop, io::WRITE);
    let (b, _) = fx.data_buf(14, 8);
    fx.qp.write(1, 500, b, 1000).map_err(|r| r.error).unwrap();
    for i in 0..4 {
        fx.read(i * 8, 8, i);
    }
    let start = Instant::now();
    let mut lost = None;
    while lost.is_none() && start.elapsed() < T + HANG {
        std::thread::sleep(Duration::from_micros(200));
        let mut again = Vec::new();
        fx.qp.poll(usize::MAX, |d| {
            if d.tag == 1000 {
                lost = Some(d.result);
            } else {
                again.push((d.tag, d.buf.unwrap()));
            }
        });
        for (tag, b) in again {
            fx.qp.read(1, tag * 8, b, tag).map_err(|r| r.error).unwrap();
        }
    }
    let lost = lost.unwrap_or_else(|| panic!("the lost write was never reported ({:?})", fx.qp.stats()));
    assert_eq!(status_of(&lost).name(), Some("Command Abort Requested"));
}

/// When a split request times out, the abort must name its part that is still outstanding, not
/// the command id of a part that completed long ago and may now belong to another command.
#[test]
fn a_timed_out_split_request_aborts_its_own_outstanding_part() {
    // The read below must be in flight when the write times out and complete before its own
    // timeout: t/4 to spare on each side, long enough that a loaded machine cannot close it.
    let t = Duration::from_secs(2);
    let mut fx = Fx::new(16);
    let mut qp = fx.rig.ctrl.create_qpair::<RegionBuf>(&qopts(16, t)).unwrap();
    let q = qp.qid();
    // 256 KiB at MDTS 128 KiB: two commands. The first completes, the second is lost.
    fx.rig.model.inject(
        Fault::new(FaultKind::Delay(Duration::ZERO))
            .on_sq(q)
            .opcode(io::WRITE),
    );
    fx.rig
        .model
        .inject(Fault::new(FaultKind::Drop).on_sq(q).opcode(io::WRITE));
    let (b, d) = fx.data_buf(15, 512);
    let t0 = Instant::now();
    qp.write(1, 1024, b, 1).map_err(|r| r.error).unwrap();
    expect_quiet(&mut qp, t / 2);
    assert_eq!(qp.stats().completions, 1, "the first part completed");
    // A read that completes after the write's deadline but well before its own.
    fx.rig
        .model
        .inject(Fault::new(FaultKind::Delay(t * 3 / 4)).on_sq(q).opcode(io::READ));
    qp.read(1, 0, fx.empty_buf(8), 2).map_err(|r| r.error).unwrap();
    let mut done = wait_for(&mut qp, 2, HANG);
    done.sort_by_key(|d| d.tag);
    let (w, r) = (&done[0], &done[1]);
    assert!(
        r.result.is_ok(),
        "the read was aborted in the write's place: {:?}",
        r.result
    );
    assert_eq!(contents(r.buf.as_ref().unwrap()), fx.shadow.get(0, 4096));
    assert_eq!(status_of(&w.result).name(), Some("Command Abort Requested"));
    assert!(t0.elapsed() < t + PROMPT, "{:?}", t0.elapsed());
    fx.shadow.write(1024, &d); // both parts were executed
    usable(&mut qp, &mut fx.shadow, &fx.rig);
    fx.check_clean();
}

#[test]
fn queue_creation_errors_are_reported_and_undone() {
    let fx = Fx::new(16);
    let m = &fx.rig.model;
    m.inject(
        Fault::new(FaultKind::Status(Status::INVALID_QUEUE_SIZE))
            .admin()
            .opcode(adm::CREATE_IO_CQ),
    );
    let e = fx.rig.ctrl.create_qpair::<RegionBuf>(&qopts(16, T)).unwrap_err();
    assert!(
        e.to_string()
            .contains("Create I/O Completion Queue failed: Invalid Queue Size"),
        "{e}"
    );
    m.inject(
        Fault::new(FaultKind::Status(Status::CQ_INVALID))
            .admin()
            .opcode(adm::CREATE_IO_SQ),
    );
    let deletes = m.stats().admin_commands(adm::DELETE_IO_CQ);
    let e = fx.rig.ctrl.create_qpair::<RegionBuf>(&qopts(16, T)).unwrap_err();
    assert!(
        e.to_string()
            .contains("Create I/O Submission Queue failed: Completion Queue Invalid"),
        "{e}"
    );
    assert_eq!(
        m.stats().admin_commands(adm::DELETE_IO_CQ),
        deletes + 1,
        "the CQ is deleted again"
    );
    // The queue IDs were given back: all seven others can still be had.
    let qps: Vec<_> = (0..7)
        .map(|_| fx.rig.ctrl.create_qpair::<RegionBuf>(&qopts(4, T)).unwrap())
        .collect();
    assert!(qps.iter().all(|q| q.qid() != fx.qid()));
    drop(qps);
    fx.check_clean();
}

#[test]
fn admin_timeouts_and_late_admin_completions_do_not_confuse_later_commands() {
    // Long enough that the commands meant to succeed cannot time out on a loaded machine.
    let admin_timeout = Duration::from_secs(1);
    let opts = vfpoll_nvme::ControllerOptions {
        admin_timeout,
        ..ctrl_opts()
    };
    let rig = rig_with(small_cfg(BLOCKS, 5), opts);
    let (c, m) = (&rig.ctrl, &rig.model);
    m.inject(Fault::new(FaultKind::Drop).admin().opcode(adm::GET_LOG_PAGE));
    let start = Instant::now();
    match c.smart_log() {
        Err(NvmeError::Timeout { op, qid: 0, .. }) => assert_eq!(op, "Get Log Page"),
        other => panic!("expected an admin timeout, got {other:?}"),
    }
    assert!(start.elapsed() < admin_timeout + PROMPT, "{:?}", start.elapsed());
    c.smart_log().expect("the next admin command works");
    let nq = c.get_feature(0x07).unwrap();
    assert_ne!(nq, 1);
    // A Get Features (Number of Queues) answered after its deadline...
    m.inject(
        Fault::new(FaultKind::Delay(admin_timeout * 3 / 2))
            .admin()
            .opcode(adm::GET_FEATURES),
    );
    let posted = m.stats().completions_posted;
    assert!(matches!(c.get_feature(0x07), Err(NvmeError::Timeout { .. })));
    // ... is not taken for the answer to a later Get Features (Volatile Write Cache) sent once
    // it is in the completion queue.
    let start = Instant::now();
    while m.stats().completions_posted == posted {
        assert!(start.elapsed() < HANG, "the late completion was never posted");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        c.get_feature(0x06).unwrap(),
        1,
        "VWC enabled, not the Number of Queues value"
    );
    assert_eq!(c.get_feature(0x07).unwrap(), nq);
}
