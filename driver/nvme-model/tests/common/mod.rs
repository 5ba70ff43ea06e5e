//! A minimal NVMe host for driving the model directly: it builds submission entries, writes
//! them into [`HeapDma`] memory, rings doorbells through the model's BAR0 and polls completion
//! entries by their phase tag, as a driver does. It checks nothing on its own; the tests do.

#![allow(dead_code)]

use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vfpoll_nvme_model::{
    admin_opcode as adm, DmaFault, FaultCheck, FaultLog, HeapDma, ModelConfig, NvmeModel, Status,
};
use vfpoll_nvme_spec::regs::{self, off, Cc, Csts};
use vfpoll_pci::mmio::Mmio;
use vfpoll_pci::BusAddr;

pub const PAGE: usize = 4096;
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// A submission queue entry being built.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sqe {
    pub dw: [u32; 16],
}

impl Sqe {
    pub fn new(opcode: u8) -> Self {
        let mut s = Sqe::default();
        s.dw[0] = opcode as u32;
        s
    }
    pub fn nsid(mut self, nsid: u32) -> Self {
        self.dw[1] = nsid;
        self
    }
    pub fn prp(mut self, prp1: u64, prp2: u64) -> Self {
        (self.dw[6], self.dw[7]) = (prp1 as u32, (prp1 >> 32) as u32);
        (self.dw[8], self.dw[9]) = (prp2 as u32, (prp2 >> 32) as u32);
        self
    }
    /// PSDT 01b with SGL1 = `desc`.
    pub fn sgl(mut self, desc: [u8; 16]) -> Self {
        self.dw[0] |= 1 << 14;
        for i in 0..4 {
            self.dw[6 + i] = u32::from_le_bytes(desc[4 * i..4 * i + 4].try_into().unwrap());
        }
        self
    }
    pub fn cdw(mut self, n: usize, v: u32) -> Self {
        self.dw[n] = v;
        self
    }
    /// Read/Write/Compare/Write Zeroes of `blocks` blocks from `slba`.
    pub fn rw(opcode: u8, nsid: u32, slba: u64, blocks: u32) -> Self {
        Sqe::new(opcode)
            .nsid(nsid)
            .cdw(10, slba as u32)
            .cdw(11, (slba >> 32) as u32)
            .cdw(12, blocks - 1)
    }
    fn bytes(&self, cid: u16) -> [u8; 64] {
        let mut b = [0u8; 64];
        let mut dw = self.dw;
        dw[0] = (dw[0] & 0xffff) | (cid as u32) << 16;
        for (i, d) in dw.iter().enumerate() {
            b[4 * i..4 * i + 4].copy_from_slice(&d.to_le_bytes());
        }
        b
    }
}

/// An SGL descriptor.
pub fn sgl_desc(addr: u64, len: u32, kind: u8) -> [u8; 16] {
    let mut d = [0; 16];
    d[0..8].copy_from_slice(&addr.to_le_bytes());
    d[8..12].copy_from_slice(&len.to_le_bytes());
    d[15] = kind << 4;
    d
}
pub const SGL_DATA: u8 = 0;
pub const SGL_BUCKET: u8 = 1;
pub const SGL_SEGMENT: u8 = 2;
pub const SGL_LAST_SEGMENT: u8 = 3;

/// A completion queue entry, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cqe {
    pub dw0: u32,
    pub sqhd: u16,
    pub sqid: u16,
    pub cid: u16,
    pub phase: bool,
    pub status: Status,
}

impl Cqe {
    pub fn decode(b: &[u8]) -> Cqe {
        let dw = |i: usize| u32::from_le_bytes(b[4 * i..4 * i + 4].try_into().unwrap());
        Cqe {
            dw0: dw(0),
            sqhd: dw(2) as u16,
            sqid: (dw(2) >> 16) as u16,
            cid: dw(3) as u16,
            phase: dw(3) & (1 << 16) != 0,
            status: Status::from_field((dw(3) >> 17) as u16),
        }
    }
    #[track_caller]
    pub fn ok(self) -> Cqe {
        assert_eq!(
            self.status,
            Status::SUCCESS,
            "command {:#x} failed: {:?}",
            self.cid,
            self.status
        );
        self
    }
}

/// A queue pair as the host tracks it.
#[derive(Debug, Clone, Copy)]
pub struct Qp {
    pub qid: u16,
    pub sq: BusAddr,
    pub cq: BusAddr,
    pub size: u32,
    pub cq_size: u32,
    pub tail: u32,
    pub head: u32,
    pub phase: bool,
}

impl Qp {
    fn new(qid: u16, sq: BusAddr, cq: BusAddr, size: u32, cq_size: u32) -> Self {
        Qp {
            qid,
            sq,
            cq,
            size,
            cq_size,
            tail: 0,
            head: 0,
            phase: true,
        }
    }
}

/// The host side: the model, its memory, BAR0, and the queue pairs created so far.
pub struct Host {
    pub model: NvmeModel,
    pub mem: Arc<HeapDma>,
    pub bar: Mmio,
    pub stride: usize,
    pub qps: Vec<Option<Qp>>,
    next_cid: u16,
    /// Last, so the model has stopped (and reported every fault) when it runs.
    faults: FaultCheck,
}

impl Host {
    /// A model with `cfg`, not enabled yet. Every test that uses it checks at its end that the
    /// controller never reached outside [`Host::mem`]'s mappings (each buffer there is followed
    /// by an unmapped guard page, so an overrun is a fault too).
    pub fn new(cfg: ModelConfig) -> Host {
        let mem = Arc::new(HeapDma::new());
        let log = Arc::new(FaultLog::new(mem.clone()));
        let qs = cfg.max_io_queue_pairs as usize + 1;
        let model = NvmeModel::start(cfg, log.clone()).expect("model starts");
        let bar = model.bar0();
        let stride = regs::Cap(bar.read64(off::CAP)).doorbell_stride();
        Host {
            model,
            mem,
            bar,
            stride,
            qps: vec![None; qs],
            next_cid: 1,
            faults: FaultCheck(log),
        }
    }

    /// The DMA faults so far (taken: the end-of-test check will not see them). For tests that
    /// hand the controller an unmapped address on purpose.
    pub fn take_dma_faults(&self) -> Vec<DmaFault> {
        self.faults.0.take()
    }

    /// Takes the DMA faults so far and checks that they started at the bus addresses `at`, in
    /// this order (the first byte of each faulting access that did not translate).
    #[track_caller]
    pub fn expect_dma_faults(&self, at: &[u64]) {
        let got = self.take_dma_faults();
        let addrs: Vec<u64> = got.iter().map(|f| f.bus.get()).collect();
        assert_eq!(addrs, at, "DMA faults: {got:?}");
    }

    /// A model with `cfg`, enabled with a 32-entry admin queue pair.
    pub fn started(cfg: ModelConfig) -> Host {
        let mut h = Host::new(cfg);
        let csts = h.enable(good_cc(), 32);
        assert!(csts.ready() && !csts.fatal(), "{csts:?}");
        h
    }

    /// Sets up admin queues of `entries` entries, writes `cc` (with EN set) and waits for RDY or
    /// CFS.
    pub fn enable(&mut self, cc: Cc, entries: u32) -> Csts {
        let sq = self.mem.alloc(entries as usize * 64);
        let cq = self.mem.alloc(entries as usize * 16);
        self.enable_at(cc, entries, sq, cq)
    }

    pub fn enable_at(&mut self, cc: Cc, entries: u32, sq: BusAddr, cq: BusAddr) -> Csts {
        self.bar.write32(off::AQA, regs::aqa(entries, entries));
        self.bar.write64(off::ASQ, sq.get());
        self.bar.write64(off::ACQ, cq.get());
        self.qps[0] = Some(Qp::new(0, sq, cq, entries, entries));
        self.bar.write32(off::CC, cc.with_enable(true).0);
        self.wait_csts(|c| c.ready() || c.fatal())
    }

    /// Clears CC.EN and waits for RDY to clear; forgets all queues.
    pub fn disable(&mut self) -> Csts {
        let cc = Cc(self.bar.read32(off::CC));
        self.bar.write32(off::CC, cc.with_enable(false).0);
        self.qps.iter_mut().for_each(|q| *q = None);
        self.wait_csts(|c| !c.ready() && !c.fatal())
    }

    pub fn csts(&self) -> Csts {
        Csts(self.bar.read32(off::CSTS))
    }

    #[track_caller]
    pub fn wait_csts(&self, pred: impl Fn(Csts) -> bool) -> Csts {
        let t = Instant::now();
        loop {
            let c = self.csts();
            if pred(c) {
                return c;
            }
            assert!(t.elapsed() < TIMEOUT, "CSTS stuck at {c:?}");
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    pub fn qp(&self, qid: u16) -> Qp {
        self.qps[qid as usize].expect("queue pair exists")
    }

    /// Writes the entry at the SQ tail without ringing; returns its CID.
    pub fn push(&mut self, qid: u16, sqe: Sqe) -> u16 {
        let cid = self.next_cid;
        self.next_cid = self.next_cid.wrapping_add(1).max(1);
        self.push_cid(qid, sqe, cid);
        cid
    }

    pub fn push_cid(&mut self, qid: u16, sqe: Sqe, cid: u16) {
        let qp = self.qps[qid as usize].as_mut().expect("queue pair exists");
        self.mem.write(qp.sq.add(qp.tail as u64 * 64), &sqe.bytes(cid));
        qp.tail = (qp.tail + 1) % qp.size;
    }

    /// Rings the SQ tail doorbell with the current tail.
    pub fn ring(&mut self, qid: u16) {
        fence(Ordering::SeqCst);
        let tail = self.qp(qid).tail;
        self.bar.write32(regs::sq_tail_doorbell(qid, self.stride), tail);
    }

    /// Submits one command; returns its CID.
    pub fn submit(&mut self, qid: u16, sqe: Sqe) -> u16 {
        let cid = self.push(qid, sqe);
        self.ring(qid);
        cid
    }

    /// The CQ entry at the host's head, as it is in memory (whatever its phase).
    pub fn peek_raw(&self, qid: u16) -> Cqe {
        let qp = self.qp(qid);
        Cqe::decode(&self.mem.read_vec(qp.cq.add(qp.head as u64 * 16), 16))
    }

    /// Waits up to `timeout` for a new CQ entry; consumes it without ringing the CQ doorbell.
    pub fn reap_quiet(&mut self, qid: u16, timeout: Duration) -> Option<Cqe> {
        let t = Instant::now();
        let qp = self.qp(qid);
        let dw3 = qp.cq.add(qp.head as u64 * 16 + 12);
        loop {
            if (self.mem.read_u32(dw3) & (1 << 16) != 0) == qp.phase {
                break;
            }
            if t.elapsed() > timeout {
                return None;
            }
            std::hint::spin_loop();
        }
        fence(Ordering::Acquire);
        let cqe = self.peek_raw(qid);
        let qp = self.qps[qid as usize].as_mut().unwrap();
        qp.head += 1;
        if qp.head == qp.cq_size {
            qp.head = 0;
            qp.phase = !qp.phase;
        }
        Some(cqe)
    }

    /// Rings the CQ head doorbell with the current head.
    pub fn ring_cq(&mut self, qid: u16) {
        let head = self.qp(qid).head;
        self.bar.write32(regs::cq_head_doorbell(qid, self.stride), head);
    }

    /// Waits up to `timeout` for a completion; consumes it and rings the CQ head doorbell.
    pub fn reap(&mut self, qid: u16, timeout: Duration) -> Option<Cqe> {
        let c = self.reap_quiet(qid, timeout)?;
        self.ring_cq(qid);
        Some(c)
    }

    /// Submits and waits for the completion (panics after [`TIMEOUT`]).
    #[track_caller]
    pub fn cmd(&mut self, qid: u16, sqe: Sqe) -> Cqe {
        let cid = self.submit(qid, sqe);
        let c = self
            .reap(qid, TIMEOUT)
            .unwrap_or_else(|| panic!("no completion for CID {cid:#x} on queue {qid}"));
        assert_eq!(
            (c.cid, c.sqid),
            (cid, qid),
            "completion for another command: {c:?}"
        );
        c
    }

    #[track_caller]
    pub fn admin(&mut self, sqe: Sqe) -> Cqe {
        self.cmd(0, sqe)
    }

    /// Creates I/O CQ and SQ `qid` of `size` entries each.
    #[track_caller]
    pub fn create_qp(&mut self, qid: u16, size: u32) -> Qp {
        let sq = self.mem.alloc(size as usize * 64);
        let cq = self.mem.alloc(size as usize * 16);
        self.admin(
            Sqe::new(adm::CREATE_IO_CQ)
                .prp(cq.get(), 0)
                .cdw(10, (size - 1) << 16 | qid as u32)
                .cdw(11, 1),
        )
        .ok();
        self.admin(
            Sqe::new(adm::CREATE_IO_SQ)
                .prp(sq.get(), 0)
                .cdw(10, (size - 1) << 16 | qid as u32)
                .cdw(11, (qid as u32) << 16 | 1),
        )
        .ok();
        let qp = Qp::new(qid, sq, cq, size, size);
        self.qps[qid as usize] = Some(qp);
        qp
    }

    /// A buffer with `data` in it.
    pub fn buffer_with(&self, data: &[u8]) -> BusAddr {
        let b = self.mem.alloc(data.len());
        self.mem.write(b, data);
        b
    }
}

/// A valid CC: NVM command set, 4 KiB pages, 64/16-byte entries, round robin (EN clear).
pub fn good_cc() -> Cc {
    Cc::default()
        .with_command_set(0)
        .with_page_size(PAGE)
        .with_entry_sizes(6, 4)
}

/// Deterministic test data.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(2_654_435_761)
                .rotate_left(seed as u32 % 32) as u8
                ^ seed
        })
        .collect()
}
