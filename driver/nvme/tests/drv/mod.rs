//! What the `driver_*` tests share: the real driver over the model (one `FakeMapper` as both the
//! driver's IOMMU and the model's DMA space), a seeded random generator, data patterns, a buffer
//! whose pages are scattered on the bus, a shadow of each namespace, and completion collection
//! with a wall-clock bound (a hang fails the test instead of stalling the suite).
//!
//! Stray DMA fails the test: the model reaches memory through a [`FaultLog`] in front of the
//! mapper, and a [`Rig`] checks when it is dropped that the controller never touched an address
//! the driver had not mapped. `vfpoll-dma` leaves an unmapped IOVA page after every mapping, so
//! a transfer that runs past the end of a buffer is such a fault too, instead of landing in the
//! next buffer.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use vfpoll_dma::{DmaContext, DmaRegion, FakeMapper, PageSize};
use vfpoll_nvme::{
    Controller, ControllerOptions, Done, IoBuffer, NvmeError, QpairOptions, QueuePair, RegionBuf,
};
use vfpoll_nvme_model::{DmaFault, FaultCheck, FaultLog, ModelConfig, NamespaceConfig, NvmeModel};
use vfpoll_pci::BusAddr;

pub const PAGE: usize = 4096;
/// Bound on anything that should finish promptly; reaching it means a hang.
pub const HANG: Duration = Duration::from_secs(10);

/// Upper bound for steps that take milliseconds (a teardown, an error noticed at once): far
/// above what a loaded two-core machine adds, below the multi-second waits a bug would cause.
pub const PROMPT: Duration = Duration::from_secs(5);

/// The driver over the model. Fields drop in order: the controller shuts down before the model
/// stops (queue pairs, held by the test as locals declared later, go first), and the DMA fault
/// check runs last, when the model can no longer add to it.
pub struct Rig {
    pub ctrl: Controller,
    pub model: NvmeModel,
    pub mapper: Arc<FakeMapper>,
    pub faults: FaultCheck,
}

impl Rig {
    /// Takes the DMA faults so far and checks that they started at the bus addresses `at`, in
    /// this order: for tests that make the controller reach outside the mappings on purpose.
    #[track_caller]
    pub fn expect_dma_faults(&self, at: &[u64]) {
        let got: Vec<DmaFault> = self.faults.0.take();
        let addrs: Vec<u64> = got.iter().map(|f| f.bus.get()).collect();
        assert_eq!(addrs, at, "DMA faults: {got:?}");
    }
}

/// Controller options for tests: 4 KiB pages, a short admin deadline so a lost admin command
/// fails the test in seconds.
pub fn ctrl_opts() -> ControllerOptions {
    ControllerOptions {
        page_size: PageSize::Base4K,
        io_queues: 8,
        admin_timeout: Duration::from_secs(3),
        ..Default::default()
    }
}

pub fn rig(cfg: ModelConfig) -> Rig {
    rig_with(cfg, ctrl_opts())
}

pub fn rig_with(cfg: ModelConfig, opts: ControllerOptions) -> Rig {
    let mapper = Arc::new(FakeMapper::new());
    let log = Arc::new(FaultLog::new(mapper.clone()));
    let model = NvmeModel::start(cfg, log.clone()).expect("model starts");
    let ctrl = Controller::new(model.bar0(), DmaContext::new(mapper.clone()), opts).expect("bring-up");
    Rig {
        ctrl,
        model,
        mapper,
        faults: FaultCheck(log),
    }
}

/// One namespace of `blocks` 512-byte blocks, MDTS `mdts`.
pub fn small_cfg(blocks: u64, mdts: u8) -> ModelConfig {
    ModelConfig {
        namespaces: vec![NamespaceConfig::new(1, 512, blocks)],
        mdts,
        max_io_queue_pairs: 8,
        ..Default::default()
    }
}

pub fn qopts(entries: u16, timeout: Duration) -> QpairOptions {
    QpairOptions {
        entries,
        timeout,
        ..Default::default()
    }
}

/// xorshift64*: reproducible, seeded per test.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// `len` bytes of a pattern unique to `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    Rng::new(seed).fill(&mut v);
    v
}

/// A 4 KiB-page DMA region of `len` bytes filled with `fill`.
pub fn region(ctrl: &Controller, len: usize, fill: u8) -> DmaRegion {
    let mut r = ctrl
        .dma()
        .alloc_region(len, PageSize::Base4K)
        .expect("DMA region");
    let n = r.len();
    r.fill(0, n, fill).unwrap();
    r
}

/// A buffer holding `data` at byte `offset` of a fresh region (dword-aligned offsets allowed).
pub fn region_buf(ctrl: &Controller, offset: usize, data: &[u8]) -> RegionBuf {
    let mut r = region(ctrl, offset + data.len(), 0xee);
    r.write(offset, data).unwrap();
    RegionBuf::new(r, offset, data.len()).expect("in range")
}

/// What a `RegionBuf` holds now (read through its owner: the buffer is back from the queue
/// pair).
pub fn contents(b: &RegionBuf) -> Vec<u8> {
    let mut v = vec![0; b.len()];
    b.read(0, &mut v).unwrap();
    v
}

/// A buffer whose 4 KiB pages are scattered over a region in a random order, as physical pages
/// are without an IOMMU: only page-sized pieces are bus-contiguous, so SGLs fall back to PRPs
/// and every PRP entry after the first is a different, unrelated page. `skew` makes one logical
/// page start 512 bytes into its region page (a buffer that cannot be described with PRPs).
pub struct ScatterBuf(Box<Scatter>);

struct Scatter {
    region: RegionBuf,
    pages: Vec<usize>,
    start: usize,
    len: usize,
    skew: Option<usize>,
}

impl std::fmt::Debug for ScatterBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = &self.0;
        write!(
            f,
            "ScatterBuf(start={}, len={}, pages={:?})",
            s.start, s.len, s.pages
        )
    }
}

// SAFETY: the `RegionBuf` keeps the region and its mapping alive as long as the buffer. Every
// logical byte maps to a byte inside the region (a skewed page has a spare region page after
// it, so its 4096 bytes stay inside), and `contiguous_len` never goes past the end of a page's
// region bytes, which are bus-contiguous in the region (it is one IOVA range under the fake
// IOMMU).
unsafe impl IoBuffer for ScatterBuf {
    fn len(&self) -> usize {
        self.0.len
    }
    fn bus_addr(&self, off: usize) -> BusAddr {
        self.0.region.bus_addr(self.cpu_off(off))
    }
    fn contiguous_len(&self, off: usize) -> usize {
        let l = self.0.start + off;
        (PAGE - l % PAGE).min(self.0.len - off)
    }
}

impl ScatterBuf {
    /// `data` at byte `start` (< 4096) of the first of a random permutation of pages.
    pub fn new(ctrl: &Controller, rng: &mut Rng, start: usize, data: &[u8], skew: Option<usize>) -> Self {
        assert!(start < PAGE && start.is_multiple_of(4));
        let n = (start + data.len()).div_ceil(PAGE);
        // Region pages come in pairs, the second spare, so a skewed page stays inside.
        let mut pages: Vec<usize> = (0..n).map(|i| 2 * i).collect();
        for i in (1..n).rev() {
            pages.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let r = region(ctrl, 2 * n * PAGE, 0xdd);
        let mut b = ScatterBuf(Box::new(Scatter {
            region: RegionBuf::whole(r),
            pages,
            start,
            len: data.len(),
            skew,
        }));
        let mut done = 0;
        while done < data.len() {
            let (at, piece) = (b.cpu_off(done), b.contiguous_len(done));
            b.0.region.write(at, &data[done..done + piece]).unwrap();
            done += piece;
        }
        b
    }

    /// Where logical byte `off` is in the region.
    fn cpu_off(&self, off: usize) -> usize {
        let s = &self.0;
        let l = s.start + off;
        let skew = if s.skew == Some(l / PAGE) { 512 } else { 0 };
        s.pages[l / PAGE] * PAGE + l % PAGE + skew
    }

    /// The logical contents.
    pub fn contents(&self) -> Vec<u8> {
        let mut v = vec![0; self.0.len];
        let mut done = 0;
        while done < self.0.len {
            let piece = self.contiguous_len(done);
            let at = self.cpu_off(done);
            self.0.region.read(at, &mut v[done..done + piece]).unwrap();
            done += piece;
        }
        v
    }
}

/// Polls until `n` requests completed, yielding the CPU between empty polls (the model thread
/// shares two cores with everything else). Panics after `limit`: a hang is a failure.
pub fn wait_for<B: IoBuffer>(qp: &mut QueuePair<B>, n: usize, limit: Duration) -> Vec<Done<B>> {
    let start = Instant::now();
    let mut out = Vec::new();
    let mut empty = 0u32;
    while out.len() < n {
        if qp.poll(usize::MAX, |d| out.push(d)) == 0 {
            empty += 1;
            assert!(
                start.elapsed() < limit,
                "hang: {} of {n} completions after {limit:?} (tags {:?}), qpair {:?}",
                out.len(),
                out.iter().map(|d| d.tag).collect::<Vec<_>>(),
                qp.stats()
            );
            relax(empty);
        }
    }
    out
}

/// Between empty polls: spin, and every 64th time let other threads (the model's) run. Not
/// every time: the driver checks timeouts every 4096 empty polls, and a yield on a loaded
/// machine can take milliseconds.
pub fn relax(empty: u32) {
    if empty.is_multiple_of(64) {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}

/// Submits `buf` with `f` (one of `QueuePair::{read, write, ...}`) and waits for its completion.
pub fn sync<B: IoBuffer + std::fmt::Debug>(
    qp: &mut QueuePair<B>,
    f: impl FnOnce(&mut QueuePair<B>, B) -> Result<(), vfpoll_nvme::Rejected<B>>,
    buf: B,
) -> Done<B> {
    f(qp, buf).map_err(|r| r.error).expect("submitted");
    wait_for(qp, 1, HANG).pop().expect("one")
}

/// Polls for `d` and checks that nothing completes meanwhile.
pub fn expect_quiet<B: IoBuffer>(qp: &mut QueuePair<B>, d: Duration) {
    let start = Instant::now();
    let mut empty = 0;
    while start.elapsed() < d {
        let n = qp.poll(usize::MAX, |done| {
            panic!("unexpected completion of tag {}: {:?}", done.tag, done.result)
        });
        assert_eq!(n, 0);
        empty += 1;
        relax(empty);
    }
}

/// The status name of an `NvmeError::Status`, or a panic with the error.
pub fn status_of<T: std::fmt::Debug>(r: &Result<T, NvmeError>) -> vfpoll_nvme::Status {
    match r {
        Err(NvmeError::Status { status, .. }) => *status,
        other => panic!("expected an NVMe status error, got {other:?}"),
    }
}

/// The expected contents of a namespace, kept beside the model's.
pub struct Shadow {
    pub nsid: u32,
    pub lba: usize,
    pub data: Vec<u8>,
}

impl Shadow {
    pub fn of(model: &NvmeModel, nsid: u32) -> Self {
        let lba = model
            .config()
            .namespaces
            .iter()
            .find(|n| n.nsid == nsid)
            .expect("namespace")
            .lba_size as usize;
        Shadow {
            nsid,
            lba,
            data: model.namespace_data(nsid).unwrap(),
        }
    }
    pub fn write(&mut self, slba: u64, bytes: &[u8]) {
        let at = slba as usize * self.lba;
        self.data[at..at + bytes.len()].copy_from_slice(bytes);
    }
    pub fn zero(&mut self, slba: u64, blocks: u64) {
        let at = slba as usize * self.lba;
        self.data[at..at + blocks as usize * self.lba].fill(0);
    }
    pub fn get(&self, slba: u64, len: usize) -> &[u8] {
        let at = slba as usize * self.lba;
        &self.data[at..at + len]
    }
    /// The model's namespace equals the shadow; on a mismatch, names the first differing block.
    pub fn check(&self, model: &NvmeModel) {
        let got = model.namespace_data(self.nsid).unwrap();
        if got != self.data {
            let i = got.iter().zip(&self.data).position(|(a, b)| a != b).unwrap_or(0);
            panic!(
                "namespace {} differs from what the successful writes wrote, first at LBA {} (byte {i})",
                self.nsid,
                i / self.lba
            );
        }
    }
}
