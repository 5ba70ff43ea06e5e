//! Command dispatch against the real fabrics layer and a fake backend that records what it
//! is asked to do: Connect, a property, I/O commands to the backend and their completions.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use vfpoll_dma::{DmaBuf, DmaPool};

use super::super::testing::{conn, pool, Host};
use super::*;
use crate::backend::{Backend, Busy, Completion};
use crate::fabrics::{
    fctype, prop, sqe_to_bytes, Listener, NamespaceInfo, Subsystem, SubsystemId, Target, TargetOptions,
    FABRICS_OPCODE, SGL_IN_CAPSULE, SGL_TRANSPORT,
};
use crate::pdu::CtrlPdu;
use crate::server::metrics::Stats;

const SUB: &str = "nqn.2024-01.io.vfpoll:dispatch-test";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555";
const WRITE: u8 = 0x01;
const READ: u8 = 0x02;
const FLUSH: u8 = 0x00;

/// What the fake backend was asked: the operation, SLBA, NLB, the buffer, the tag.
type Sub = (Op, u64, u32, Option<DmaBuf>, u64);

/// A backend that records submissions and completes nothing by itself; busy on demand.
struct Fake {
    subs: Arc<Mutex<Vec<Sub>>>,
    busy: Arc<AtomicBool>,
}

impl Backend for Fake {
    fn block_size(&self) -> usize {
        512
    }

    fn blocks(&self) -> u64 {
        1000
    }

    fn submit(
        &mut self,
        _: &mut DmaPool,
        op: Op,
        at: u64,
        n: u32,
        data: Option<DmaBuf>,
        t: u64,
    ) -> Result<(), Busy> {
        if self.busy.load(Ordering::Relaxed) {
            return Err(Busy { buf: data });
        }
        self.subs.lock().unwrap().push((op, at, n, data, t));
        Ok(())
    }

    fn poll(&mut self, _done: &mut dyn FnMut(Completion)) -> usize {
        0
    }
}

fn fresh_stats(_: SubsystemId) -> Arc<Stats> {
    Arc::new(Stats::default())
}

/// What a worker gives its connections, with one subsystem of one namespace on the fake.
struct Bed {
    target: Mutex<Target>,
    pool: DmaPool,
    backends: Vec<Box<dyn Backend>>,
    ns: HashMap<(SubsystemId, u32), usize>,
    retry: VecDeque<Submission>,
    metrics: WorkerMetrics,
    close: Vec<QueueRef>,
    subs: Arc<Mutex<Vec<Sub>>>,
    busy: Arc<AtomicBool>,
}

impl Bed {
    fn new() -> Bed {
        let mut sub = Subsystem::new(SUB);
        sub.namespaces.push(NamespaceInfo::new(SUB, 1, "fake", 512, 1000));
        let opts = TargetOptions {
            in_capsule_data: 4096,
            ..TargetOptions::default()
        };
        let listener = Listener::tcp(1, "127.0.0.1:4420".parse().unwrap());
        let target = Target::new(opts, vec![listener], vec![sub]).unwrap();
        let id = target.subsystem_id(SUB).unwrap();
        let (subs, busy) = (Arc::default(), Arc::new(AtomicBool::new(false)));
        let fake = Fake {
            subs: Arc::clone(&subs),
            busy: Arc::clone(&busy),
        };
        Bed {
            target: Mutex::new(target),
            pool: pool(8192, 4),
            backends: vec![Box::new(fake)],
            ns: HashMap::from([((id, 1), 0)]),
            retry: VecDeque::new(),
            metrics: WorkerMetrics::default(),
            close: Vec::new(),
            subs,
            busy,
        }
    }

    fn cx(&mut self) -> Ctx<'_> {
        Ctx {
            target: &self.target,
            pool: &mut self.pool,
            backends: &mut self.backends,
            ns: &self.ns,
            retry: &mut self.retry,
            subsystem_stats: &fresh_stats,
            metrics: &self.metrics,
            close: &mut self.close,
        }
    }

    /// Hands `sqe` with in-capsule `icd` to the connection's dispatch.
    fn send(&mut self, c: &mut Conn, sqe: &Sqe, icd: &[u8], digest_ok: bool) {
        let cmd = CapsuleCmd {
            sqe: sqe_to_bytes(sqe),
            data_len: icd.len() as u32,
            data_offset: 0,
        };
        c.capsule(&mut self.cx(), &cmd, icd, digest_ok);
    }

    /// The next PDU the connection sends.
    fn recv(&mut self, c: &mut Conn, h: &mut Host) -> (CtrlPdu, Vec<u8>) {
        c.flush(&mut self.pool);
        let (pdu, data, _) = h.recv();
        (pdu, data)
    }

    /// The next completion the connection sends.
    fn cqe(&mut self, c: &mut Conn, h: &mut Host) -> Cqe {
        match self.recv(c, h) {
            (CtrlPdu::CapsuleResp(r), _) => Cqe::from_dwords(core::array::from_fn(|i| {
                u32::from_le_bytes(r.cqe[4 * i..4 * i + 4].try_into().unwrap())
            })),
            (other, _) => panic!("expected a CapsuleResp, got {other:?}"),
        }
    }

    /// The submission the backend got last.
    fn submitted(&self) -> Sub {
        self.subs.lock().unwrap().pop().expect("nothing submitted")
    }
}

/// A command as Linux's host sends it: a transport SGL of `len` bytes, CID `cid`.
fn sqe(opcode: u8, nsid: u32, len: u32, cid: u16) -> Sqe {
    let mut c = Sqe::new(opcode, nsid);
    c.set_cid(cid);
    c.dw[0] |= 1 << 14;
    c.dw[8] = len;
    c.dw[9] = (SGL_TRANSPORT as u32) << 24;
    c
}

fn in_capsule(mut c: Sqe, len: u32) -> Sqe {
    c.dw[8] = len;
    c.dw[9] = (SGL_IN_CAPSULE as u32) << 24;
    c
}

fn rw(op: u8, cid: u16, slba: u64, blocks: u32) -> Sqe {
    let mut c = sqe(op, 1, blocks * 512, cid);
    c.set_lba_range(slba, blocks);
    c
}

fn connect_sqe(qid: u16, sqsize: u16) -> Sqe {
    let mut s = in_capsule(sqe(FABRICS_OPCODE, 0, 0, 1), 1024);
    s.dw[1] = fctype::CONNECT as u32;
    s.dw[10] = (qid as u32) << 16;
    s.dw[11] = sqsize as u32;
    s.dw[12] = if qid == 0 { 10_000 } else { 0 };
    s
}

fn connect_data(cntlid: u16) -> Vec<u8> {
    let mut d = vec![0u8; 1024];
    d[..16].copy_from_slice(b"host-identifier!");
    d[16..18].copy_from_slice(&cntlid.to_le_bytes());
    d[256..256 + SUB.len()].copy_from_slice(SUB.as_bytes());
    d[512..512 + HOST.len()].copy_from_slice(HOST.as_bytes());
    d
}

/// An admin queue, connected and enabled; its CNTLID.
fn admin(bed: &mut Bed) -> (Conn, Host, u16) {
    let (mut a, mut h) = conn();
    bed.send(&mut a, &connect_sqe(0, 31), &connect_data(0xffff), true);
    let cqe = bed.cqe(&mut a, &mut h);
    assert!(cqe.status().is_success(), "{:?}", cqe.status());
    assert_eq!((cqe.sq_id, cqe.sq_head, cqe.cid), (0, 1, 1));
    let cntlid = cqe.dw0 as u16;
    assert_eq!(a.queue().map(|q| (q.cntlid.0, q.qid)), Some((cntlid, 0)));
    // Property Set CC.EN as Linux does (EN, IOSQES 6, IOCQES 4).
    let mut set = sqe(FABRICS_OPCODE, 0, 0, 2);
    set.dw[1] = fctype::PROPERTY_SET as u32;
    set.dw[11] = prop::CC;
    set.dw[12] = 1 | 6 << 16 | 4 << 20;
    bed.send(&mut a, &set, &[], true);
    let cqe = bed.cqe(&mut a, &mut h);
    assert!(cqe.status().is_success(), "{:?}", cqe.status());
    assert_eq!((cqe.sq_head, cqe.cid), (2, 2));
    (a, h, cntlid)
}

/// An I/O queue of `sqsize + 1` entries of controller `cntlid`.
fn io(bed: &mut Bed, cntlid: u16, sqsize: u16) -> (Conn, Host) {
    let (mut q, mut h) = conn();
    bed.send(&mut q, &connect_sqe(1, sqsize), &connect_data(cntlid), true);
    let cqe = bed.cqe(&mut q, &mut h);
    assert!(cqe.status().is_success(), "{:?}", cqe.status());
    assert_eq!(cqe.sq_id, 1);
    (q, h)
}

#[test]
fn connect_binds_the_queue_and_a_bad_one_does_not() {
    let mut bed = Bed::new();
    let (_a, _ha, cntlid) = admin(&mut bed);
    let (q, _hq) = io(&mut bed, cntlid, 31);
    assert_eq!(q.queue().map(|q| q.qid), Some(1));
    // Connect data of the wrong length: refused, the connection stays unbound.
    let (mut c, mut h) = conn();
    bed.send(&mut c, &connect_sqe(0, 31), &[0; 512], true);
    let cqe = bed.cqe(&mut c, &mut h);
    assert_eq!(cqe.status(), fabrics::status::DATA_SGL_LENGTH_INVALID);
    assert_eq!(c.queue(), None);
    // A capsule that failed its data digest is not run, Connect or not.
    bed.send(&mut c, &connect_sqe(0, 31), &connect_data(0xffff), false);
    assert_eq!(bed.cqe(&mut c, &mut h).status(), TRANSIENT_TRANSPORT_ERROR);
    assert_eq!(c.queue(), None);
}

#[test]
fn io_commands_go_to_the_backend_and_complete_from_it() {
    let mut bed = Bed::new();
    let (_a, _ha, cntlid) = admin(&mut bed);
    let (mut q, mut h) = io(&mut bed, cntlid, 31);
    // A write with its data in the capsule.
    let data: Vec<u8> = (0..1024u32).map(|i| (i * 13) as u8).collect();
    bed.send(&mut q, &in_capsule(rw(WRITE, 10, 8, 2), 1024), &data, true);
    let (op, slba, nlb, buf, t) = bed.submitted();
    assert_eq!((op, slba, nlb, t), (Op::Write { fua: false }, 8, 2, tag(7, 10)));
    let buf = buf.expect("a write has its buffer");
    let mut got = vec![0u8; 1024];
    bed.pool.read(&buf, 0, &mut got).unwrap();
    assert_eq!(got, data);
    assert!(h.quiet(), "no completion before the backend's");
    q.complete(&mut bed.cx(), 10, Status::SUCCESS, Some(buf));
    let cqe = bed.cqe(&mut q, &mut h);
    assert!(cqe.status().is_success());
    assert_eq!((cqe.cid, cqe.sq_id, cqe.sq_head), (10, 1, 2));
    // A read: the backend fills the buffer, the data goes out before the completion.
    bed.send(&mut q, &rw(READ, 11, 8, 2), &[], true);
    let (op, slba, nlb, buf, _) = bed.submitted();
    assert_eq!((op, slba, nlb), (Op::Read, 8, 2));
    let buf = buf.unwrap();
    bed.pool.write(&buf, 0, &data).unwrap();
    q.complete(&mut bed.cx(), 11, Status::SUCCESS, Some(buf));
    let (pdu, got) = bed.recv(&mut q, &mut h);
    assert!(matches!(pdu, CtrlPdu::C2hData(d) if d.cccid == 11 && d.datal == 1024));
    assert_eq!(got, data);
    assert_eq!(bed.cqe(&mut q, &mut h).cid, 11);
    // A Flush the backend fails: the status reaches the host.
    bed.send(&mut q, &sqe(FLUSH, 1, 0, 12), &[], true);
    assert_eq!(bed.submitted().0, Op::Flush);
    q.complete(&mut bed.cx(), 12, Status::DATA_TRANSFER_ERROR, None);
    assert_eq!(bed.cqe(&mut q, &mut h).status(), Status::DATA_TRANSFER_ERROR);
    assert_eq!(bed.pool.available(), 4, "every buffer came back");
}

#[test]
fn refusals_busy_backends_and_completions_for_nothing() {
    let mut bed = Bed::new();
    let (_a, _ha, cntlid) = admin(&mut bed);
    let (mut q, mut h) = io(&mut bed, cntlid, 31);
    // A data digest error: Transient Transport Error, the backend never sees it.
    bed.send(&mut q, &in_capsule(rw(WRITE, 1, 0, 1), 512), &[0; 512], false);
    assert_eq!(bed.cqe(&mut q, &mut h).status(), TRANSIENT_TRANSPORT_ERROR);
    // A namespace that does not exist: the decoder's refusal.
    bed.send(&mut q, &sqe(READ, 9, 512, 2), &[], true);
    let cqe = bed.cqe(&mut q, &mut h);
    assert!(!cqe.status().is_success());
    assert_eq!(cqe.cid, 2);
    assert!(bed.subs.lock().unwrap().is_empty());
    // A CID still in flight: Command Interrupted for the second.
    bed.send(&mut q, &rw(READ, 3, 0, 1), &[], true);
    bed.send(&mut q, &rw(READ, 3, 0, 1), &[], true);
    let cqe = bed.cqe(&mut q, &mut h);
    assert_eq!((cqe.cid, cqe.status()), (3, COMMAND_INTERRUPTED));
    let (_, _, _, buf, _) = bed.submitted();
    q.complete(&mut bed.cx(), 3, Status::SUCCESS, buf);
    assert!(matches!(bed.recv(&mut q, &mut h).0, CtrlPdu::C2hData(_)));
    assert_eq!(bed.cqe(&mut q, &mut h).cid, 3);
    // A busy backend: the submission waits in the worker's retry queue with its buffer.
    bed.busy.store(true, Ordering::Relaxed);
    bed.send(&mut q, &rw(READ, 4, 0, 1), &[], true);
    let s = bed.retry.pop_front().expect("kept for a retry");
    assert_eq!((s.op, s.slba, s.nlb, s.tag), (Op::Read, 0, 1, tag(7, 4)));
    assert!(s.buf.is_some());
    // A completion for a command the connection no longer has: its buffer goes back.
    let before = bed.pool.available();
    q.complete(&mut bed.cx(), 99, Status::SUCCESS, s.buf);
    assert_eq!(bed.pool.available(), before + 1);
    assert!(h.quiet());
}

#[test]
fn more_commands_than_entries_are_refused() {
    let mut bed = Bed::new();
    let (_a, _ha, cntlid) = admin(&mut bed);
    // SQSIZE 1: two entries.
    let (mut q, mut h) = io(&mut bed, cntlid, 1);
    bed.send(&mut q, &sqe(FLUSH, 1, 0, 1), &[], true);
    bed.send(&mut q, &sqe(FLUSH, 1, 0, 2), &[], true);
    assert!(h.quiet());
    bed.send(&mut q, &sqe(FLUSH, 1, 0, 3), &[], true);
    let cqe = bed.cqe(&mut q, &mut h);
    assert_eq!((cqe.cid, cqe.status()), (3, COMMAND_INTERRUPTED));
    assert_eq!(bed.subs.lock().unwrap().len(), 2);
}
