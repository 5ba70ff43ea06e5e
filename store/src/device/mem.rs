//! [`MemDevice`]: a namespace in memory with a volatile write cache and power cuts, for crash
//! tests.
//!
//! The device keeps two images: `media`, what reads see, and `durable`, what survives a power
//! cut. A completed write lands in `media`, and in `durable` too unless the device has a
//! volatile write cache (then it waits there until a flush); a FUA write lands in both. Requests
//! complete at the next poll of their channel, in order. A power cut ([`MemHandle::cut`], or one armed to strike
//! at the n-th request with [`MemHandle::arm_cut`]) decides, for every write not yet durable
//! (cached, or submitted and not completed), at random: lost, kept, or torn at a random sector
//! boundary (a prefix kept) or in scattered sectors. From then on every request fails, as on a
//! device that lost power; [`MemHandle::restart`] gives a fresh device over the durable image.
//!
//! Another I/O channel ([`Device::open_channel`]) is a device on the same images, write cache
//! and power, with a request queue of its own: a flush through any channel makes every
//! completed write durable, a cut strikes the requests in flight on all of them, and an armed
//! cut counts the requests of all of them.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use vfpoll_dma::DmaContext;

use super::{alloc_buffers, Device, DeviceError, IoBuf, IoDone, IoOp};

/// What a power cut did to the writes that were not durable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CutReport {
    /// Writes lost whole.
    pub lost: u64,
    /// Writes kept whole.
    pub kept: u64,
    /// Writes torn (part of their sectors kept).
    pub torn: u64,
}

#[derive(Debug)]
struct State {
    media: Vec<u8>,
    durable: Vec<u8>,
    /// Byte ranges written (or deallocated) since the last flush, while not durable.
    unflushed: Vec<(usize, usize)>,
    /// The requests in flight, per channel.
    queues: Vec<VecDeque<(u64, IoOp)>>,
    ops: u64,
    cut_at: Option<u64>,
    dead: bool,
    rng: u64,
    last_cut: CutReport,
}

impl State {
    fn next(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Lands `src` (the new bytes of `at..at + src.len()`) in the durable image: lost, kept,
    /// torn after a random sector, or in random sectors.
    fn settle(&mut self, at: usize, src: &[u8], sector: usize) {
        let sectors = src.len().div_ceil(sector);
        let mode = self.next() % 4;
        let keep: Vec<bool> = match mode {
            0 => vec![false; sectors],
            1 => vec![true; sectors],
            2 => {
                let cut = (self.next() % sectors as u64) as usize;
                (0..sectors).map(|s| s < cut).collect()
            }
            _ => (0..sectors).map(|_| self.next().is_multiple_of(2)).collect(),
        };
        match (keep.iter().all(|k| *k), keep.iter().any(|k| *k)) {
            (true, _) => self.last_cut.kept += 1,
            (false, false) => self.last_cut.lost += 1,
            _ => self.last_cut.torn += 1,
        }
        for (s, k) in keep.into_iter().enumerate() {
            if k {
                let from = s * sector;
                let to = (from + sector).min(src.len());
                self.durable[at + from..at + to].copy_from_slice(&src[from..to]);
            }
        }
    }

    fn cut(&mut self, sector: usize) -> CutReport {
        self.last_cut = CutReport::default();
        // Writes in flight on every channel: their bytes are in their buffers.
        let mut queues = std::mem::take(&mut self.queues);
        for queue in &queues {
            for (_, op) in queue {
                if let IoOp::Write { offset, buf, .. } = op {
                    let mut data = vec![0u8; buf.len()];
                    if buf.read(0, &mut data).is_ok() {
                        self.settle(*offset as usize, &data, sector);
                    }
                }
            }
        }
        std::mem::swap(&mut self.queues, &mut queues);
        // Writes in the volatile cache: their bytes are in `media`.
        let unflushed = std::mem::take(&mut self.unflushed);
        for (at, len) in unflushed {
            let data = self.media[at..at + len].to_vec();
            self.settle(at, &data, sector);
        }
        self.media.clone_from(&self.durable);
        self.dead = true;
        self.last_cut
    }
}

/// The test side of a [`MemDevice`]: power cuts, the images, corruption.
#[derive(Debug, Clone)]
pub struct MemHandle {
    state: Arc<Mutex<State>>,
    sector: usize,
    vwc: bool,
}

impl MemHandle {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Cuts the power now (see the module docs); `seed` drives the random outcomes.
    pub fn cut(&self, seed: u64) -> CutReport {
        let mut s = self.lock();
        s.rng = seed;
        s.cut(self.sector)
    }

    /// Cuts the power when the device starts its `n`-th request from now (counting from 1);
    /// `seed` drives the random outcomes.
    pub fn arm_cut(&self, n: u64, seed: u64) {
        let mut s = self.lock();
        s.rng = seed;
        s.cut_at = Some(s.ops + n.max(1));
    }

    /// Whether the power was cut.
    pub fn is_cut(&self) -> bool {
        self.lock().dead
    }

    /// What the last cut did.
    pub fn last_cut(&self) -> CutReport {
        self.lock().last_cut
    }

    /// Requests the device has completed or started.
    pub fn ops(&self) -> u64 {
        self.lock().ops
    }

    /// The bytes that survive a power cut now.
    pub fn durable_image(&self) -> Vec<u8> {
        self.lock().durable.clone()
    }

    /// The bytes reads see now.
    pub fn media(&self) -> Vec<u8> {
        self.lock().media.clone()
    }

    /// Overwrites bytes at `offset` in both images, behind the store's back.
    pub fn corrupt(&self, offset: u64, bytes: &[u8]) {
        let mut s = self.lock();
        let at = offset as usize;
        s.media[at..at + bytes.len()].copy_from_slice(bytes);
        s.durable[at..at + bytes.len()].copy_from_slice(bytes);
    }

    /// Flips the bits of `mask` in the byte at `offset` in both images.
    pub fn flip(&self, offset: u64, mask: u8) {
        let mut s = self.lock();
        s.media[offset as usize] ^= mask;
        s.durable[offset as usize] ^= mask;
    }

    /// A fresh device over the durable image (power back on), with the same geometry.
    pub fn restart(&self) -> MemDevice {
        let image = self.durable_image();
        MemDevice::from_image(image, self.sector as u32, self.vwc)
    }
}

/// A namespace in memory; see the module docs.
pub struct MemDevice {
    handle: MemHandle,
    dma: DmaContext,
    capacity: u64,
    /// Its channel: the index of its request queue.
    chan: usize,
}

impl std::fmt::Debug for MemDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemDevice")
            .field("capacity", &self.capacity)
            .finish()
    }
}

impl MemDevice {
    /// `capacity` zero bytes (a multiple of `sector`, which is 512 or 4096), with a volatile
    /// write cache when `vwc`.
    pub fn new(capacity: u64, sector: u32, vwc: bool) -> Self {
        Self::from_image(vec![0; capacity as usize], sector, vwc)
    }

    /// A device over `image`.
    pub fn from_image(image: Vec<u8>, sector: u32, vwc: bool) -> Self {
        let capacity = image.len() as u64;
        let state = State {
            durable: image.clone(),
            media: image,
            unflushed: Vec::new(),
            queues: vec![VecDeque::new()],
            ops: 0,
            cut_at: None,
            dead: false,
            rng: 1,
            last_cut: CutReport::default(),
        };
        MemDevice {
            handle: MemHandle {
                state: Arc::new(Mutex::new(state)),
                sector: sector as usize,
                vwc,
            },
            dma: DmaContext::for_testing(),
            capacity,
            chan: 0,
        }
    }

    /// The handle for power cuts and corruption.
    pub fn handle(&self) -> MemHandle {
        self.handle.clone()
    }

    fn check(&self, op: &IoOp) -> Result<(), DeviceError> {
        let (off, len) = op.range();
        let sector = self.handle.sector as u64;
        if !off.is_multiple_of(sector)
            || !len.is_multiple_of(sector)
            || off.checked_add(len).is_none_or(|e| e > self.capacity)
        {
            return Err(DeviceError::Invalid(format!(
                "memory device: {} of {len} bytes at {off}: not whole {sector}-byte sectors inside its {} bytes",
                op.name(),
                self.capacity
            )));
        }
        Ok(())
    }
}

impl Device for MemDevice {
    fn describe(&self) -> String {
        format!("memory device ({} bytes)", self.capacity)
    }
    fn block_size(&self) -> u32 {
        self.handle.sector as u32
    }
    fn capacity(&self) -> u64 {
        self.capacity
    }
    fn volatile_write_cache(&self) -> bool {
        self.handle.vwc
    }
    fn alloc_buffers(&self, count: usize, size: usize) -> Result<Vec<IoBuf>, DeviceError> {
        alloc_buffers(&self.dma, count, size)
    }
    fn queue_depth(&self) -> usize {
        256
    }
    fn submit(&mut self, tag: u64, op: IoOp) -> Result<(), (DeviceError, IoOp)> {
        if let Err(e) = super::refuse_peer(&|| self.describe(), &op).and_then(|()| self.check(&op)) {
            return Err((e, op));
        }
        let mut s = self.handle.lock();
        let queue = &mut s.queues[self.chan];
        if queue.len() >= 256 {
            return Err((DeviceError::QueueFull, op));
        }
        queue.push_back((tag, op));
        Ok(())
    }
    fn poll(&mut self, done: &mut Vec<IoDone>) -> usize {
        let sector = self.handle.sector;
        let vwc = self.handle.vwc;
        let mut s = self.handle.lock();
        let mut n = 0;
        while let Some((tag, op)) = s.queues[self.chan].pop_front() {
            n += 1;
            if !s.dead {
                s.ops += 1;
                if s.cut_at.is_some_and(|at| s.ops >= at) {
                    s.cut_at = None;
                    s.queues[self.chan].push_front((tag, op));
                    s.cut(sector);
                    continue;
                }
            }
            let (offset, len) = op.range();
            if s.dead {
                let result = Err(DeviceError::Io {
                    device: "memory device".into(),
                    op: op.name(),
                    offset,
                    len,
                    detail: "power lost".into(),
                });
                done.push(IoDone {
                    tag,
                    result,
                    buf: op.into_buf(),
                });
                continue;
            }
            let (at, len) = (offset as usize, len as usize);
            let mut result = Ok(());
            let buf = match op {
                IoOp::Read { buf, .. } => {
                    let mut b = buf;
                    result = b.write(0, &s.media[at..at + len]);
                    Some(b)
                }
                IoOp::Write { buf, fua, .. } => {
                    let mut data = vec![0u8; len];
                    result = buf.read(0, &mut data);
                    if result.is_ok() {
                        s.media[at..at + len].copy_from_slice(&data);
                        if fua || !vwc {
                            s.durable[at..at + len].copy_from_slice(&data);
                        } else {
                            s.unflushed.push((at, len));
                        }
                    }
                    Some(buf)
                }
                IoOp::Flush => {
                    for (a, l) in std::mem::take(&mut s.unflushed) {
                        let State { media, durable, .. } = &mut *s;
                        durable[a..a + l].copy_from_slice(&media[a..a + l]);
                    }
                    None
                }
                IoOp::Deallocate { .. } => {
                    s.media[at..at + len].fill(0);
                    if vwc {
                        s.unflushed.push((at, len));
                    } else {
                        s.durable[at..at + len].fill(0);
                    }
                    None
                }
            };
            done.push(IoDone { tag, result, buf });
        }
        n
    }
    fn outstanding(&self) -> usize {
        self.handle.lock().queues[self.chan].len()
    }
    fn open_channel(&self) -> Result<Box<dyn Device>, DeviceError> {
        let mut s = self.handle.lock();
        s.queues.push(VecDeque::new());
        Ok(Box::new(MemDevice {
            handle: self.handle.clone(),
            dma: self.dma.clone(),
            capacity: self.capacity,
            chan: s.queues.len() - 1,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(d: &mut MemDevice, op: IoOp) -> IoDone {
        d.submit(1, op).map_err(|(e, _)| e).unwrap();
        let mut done = Vec::new();
        d.poll(&mut done);
        done.pop().unwrap()
    }

    #[test]
    fn unflushed_writes_are_lost_or_torn_at_a_cut_and_flushed_ones_survive() {
        let mut d = MemDevice::new(1 << 20, 512, true);
        let h = d.handle();
        let mut bufs = d.alloc_buffers(2, 64 << 10).unwrap();
        let (mut a, mut b) = (bufs.remove(0), bufs.remove(0));
        a.fill(0, 65536, 0xaa).unwrap();
        b.fill(0, 65536, 0xbb).unwrap();
        run(
            &mut d,
            IoOp::Write {
                offset: 0,
                buf: a,
                fua: false,
            },
        )
        .result
        .unwrap();
        run(&mut d, IoOp::Flush).result.unwrap();
        run(
            &mut d,
            IoOp::Write {
                offset: 65536,
                buf: b,
                fua: false,
            },
        )
        .result
        .unwrap();
        assert_eq!(h.media()[65536], 0xbb, "reads see the cached write");
        let mut torn = 0;
        for seed in 0..64 {
            let mut d2 = MemDevice::new(1 << 20, 512, true);
            let h2 = d2.handle();
            let mut bufs = d2.alloc_buffers(1, 65536).unwrap();
            let mut c = bufs.remove(0);
            c.fill(0, 65536, 0xcc).unwrap();
            run(
                &mut d2,
                IoOp::Write {
                    offset: 0,
                    buf: c,
                    fua: false,
                },
            )
            .result
            .unwrap();
            let r = h2.cut(seed);
            torn += r.torn;
            let img = h2.durable_image();
            assert!(img[..65536].iter().all(|&x| x == 0 || x == 0xcc));
            assert!(run(&mut d2, IoOp::Flush).result.is_err(), "dead after the cut");
        }
        assert!(torn > 0, "some cuts tear");
        h.cut(3);
        let img = h.durable_image();
        assert!(img[..65536].iter().all(|&x| x == 0xaa), "flushed data survives");
        let mut d3 = h.restart();
        let mut bufs = d3.alloc_buffers(1, 4096).unwrap();
        let r = run(
            &mut d3,
            IoOp::Read {
                offset: 0,
                buf: bufs.remove(0),
            },
        );
        let mut got = [0u8; 4];
        r.buf.unwrap().read(0, &mut got).unwrap();
        assert_eq!(got, [0xaa; 4]);
    }

    /// A second channel: its own queue (a request completes at its own channel's poll), the
    /// same images (each sees the other's completed writes), one write cache (a flush through
    /// either makes both's writes durable) and one power (a cut settles the writes in flight
    /// on every channel).
    #[test]
    fn channels_share_images_cache_and_power_with_queues_of_their_own() {
        let mut a = MemDevice::new(1 << 20, 512, true);
        let h = a.handle();
        let mut b = a.open_channel().unwrap();
        let mut bufs = a.alloc_buffers(3, 4096).unwrap();
        let (mut w1, mut w2, r) = (bufs.remove(0), bufs.remove(0), bufs.remove(0));
        w1.fill(0, 4096, 0x11).unwrap();
        w2.fill(0, 4096, 0x22).unwrap();
        b.submit(
            1,
            IoOp::Write {
                offset: 0,
                buf: w1,
                fua: false,
            },
        )
        .map_err(|(e, _)| e)
        .unwrap();
        assert_eq!((a.outstanding(), b.outstanding()), (0, 1));
        let mut done = Vec::new();
        assert_eq!(a.poll(&mut done), 0, "a's poll does not complete b's request");
        assert_eq!(b.poll(&mut done), 1);
        done.clear();
        let got = run(&mut a, IoOp::Read { offset: 0, buf: r });
        let mut x = [0u8; 8];
        got.buf.unwrap().read(0, &mut x).unwrap();
        assert_eq!(x, [0x11; 8], "a reads b's completed write");
        run(&mut a, IoOp::Flush).result.unwrap();
        assert_eq!(h.durable_image()[0], 0x11, "a's flush made b's write durable");
        b.submit(
            2,
            IoOp::Write {
                offset: 4096,
                buf: w2,
                fua: false,
            },
        )
        .map_err(|(e, _)| e)
        .unwrap();
        let cut = h.cut(5);
        assert_eq!(
            cut.lost + cut.kept + cut.torn,
            1,
            "the cut settled b's write in flight"
        );
        assert!(
            b.poll(&mut done) == 1 && done[0].result.is_err(),
            "b lost power too"
        );
    }

    #[test]
    fn fua_writes_are_durable_and_misaligned_requests_refused() {
        let mut d = MemDevice::new(1 << 20, 4096, true);
        let h = d.handle();
        let mut bufs = d.alloc_buffers(2, 4096).unwrap();
        let mut a = bufs.remove(0);
        a.fill(0, 4096, 7).unwrap();
        run(
            &mut d,
            IoOp::Write {
                offset: 8192,
                buf: a,
                fua: true,
            },
        )
        .result
        .unwrap();
        h.cut(1);
        assert_eq!(h.durable_image()[8192], 7);
        let b = bufs.remove(0);
        assert!(d.submit(0, IoOp::Read { offset: 100, buf: b }).is_err());
    }
}
