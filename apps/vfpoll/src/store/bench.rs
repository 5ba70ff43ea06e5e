//! `vfpoll store bench`: checkpoint save/load and KV gets through the store against the raw
//! rate of the same namespaces, measured by this binary through the same device layer
//! (`vfpoll_store::device`: the same queue pairs or io_uring rings, the same DMA buffers),
//! without the store's layout, copies, checksums and metadata.
//!
//! Rounds alternate the order of the raw and the store phase. The raw phase writes the
//! namespaces, so the store phase formats a fresh store each round. Figures are medians over
//! the rounds (with min and max); nothing is asserted about them.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Args as ClapArgs;
use nix::sys::resource::{getrusage, UsageWho};
use serde_json::{json, Value};
use vfpoll_store::device::{Device, IoBuf, IoDone, IoOp};
use vfpoll_store::{FormatOptions, ReadOptions, Store};

use super::open::{open_devices, parse_specs, OpenHow};
use super::{Common, Progress};
use crate::units::parse_bytes;

/// Where raw I/O starts on each namespace: past the store's headers (FORMAT.md §2), as the
/// store's data does.
const RAW_START: u64 = 1 << 20;

/// Options of `vfpoll store bench`.
#[derive(Debug, ClapArgs)]
pub struct BenchArgs {
    #[command(flatten)]
    c: Common,
    /// Confirm that the namespaces are formatted (everything on them is lost).
    #[arg(long)]
    yes: bool,
    /// Checkpoint size (and raw sequential bytes), spread over the namespaces.
    #[arg(long, default_value = "512M", value_parser = parse_bytes)]
    size: u64,
    /// Entries (tensors) of the checkpoint, of equal size.
    #[arg(long, default_value_t = 8)]
    entries: u64,
    /// Rounds (raw and store phases alternate their order from round to round).
    #[arg(long, default_value_t = 3)]
    repeat: u32,
    /// Stripe chunk of the store, and the request size of the raw sequential phase.
    #[arg(long, default_value = "1M", value_parser = parse_bytes)]
    chunk_size: u64,
    /// Requests in flight per namespace in the raw sequential phase (the store keeps 32 chunk
    /// buffers per namespace in flight).
    #[arg(long, default_value_t = 32)]
    raw_depth: usize,
    /// KV block size.
    #[arg(long, default_value = "64K", value_parser = parse_bytes)]
    kv_block: u64,
    /// KV blocks put before the gets (the pool has twice as many slots).
    #[arg(long, default_value_t = 2048)]
    kv_blocks: u64,
    /// Gets at QD1 (each of hit and miss), and raw reads at QD1.
    #[arg(long, default_value_t = 2000)]
    kv_ops: u64,
    /// Batches of 32 gets, and raw rounds of 32 reads at QD32.
    #[arg(long, default_value_t = 200)]
    kv_batches: u64,
    /// Seed of the data and the random keys and offsets.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Copy threads of the store (StoreOptions::copy_threads; default: CPUs less one, 1 to 3).
    #[arg(long)]
    copy_threads: Option<usize>,
    /// Microseconds a small batch polls before it sleeps (StoreOptions::poll_spin; default
    /// 200; 0 sleeps at once).
    #[arg(long)]
    poll_spin_us: Option<u64>,
    /// I/O channels of the store (StoreOptions::io_channels: bursts of that many threads run
    /// at once; default: CPUs, at most 4; 1: one burst at a time).
    #[arg(long)]
    io_channels: Option<usize>,
    /// Threads on one pool in the multi-threaded KV phases: all of them getting batches of 32,
    /// then half putting batches of 32 (replacing keys of their own) while half get; each does
    /// --kv-batches / 2 batches (0 skips these phases).
    #[arg(long, default_value_t = 4)]
    kv_threads: usize,
}

/// One round's figures.
#[derive(Debug, Default, Clone)]
struct Round {
    raw_write: Rate,
    raw_read: Rate,
    save: Rate,
    load_crc: Rate,
    load_nocrc: Rate,
    raw_qd1_ns: Vec<u64>,
    raw_qd32: Rate,
    kv_put: Rate,
    kv_hit_ns: Vec<u64>,
    kv_miss_ns: Vec<u64>,
    kv_batch: Rate,
    /// `kv_threads` threads getting batches of 32.
    kv_mt_get: Rate,
    /// Half the threads getting while half put: the gets, the puts, and each get batch's time.
    kv_mix_get: Rate,
    kv_mix_put: Rate,
    kv_mix_get_ns: Vec<u64>,
    /// I/O channels the store opened.
    io_channels: usize,
}

/// Bytes moved in a time with the process's CPU time.
#[derive(Debug, Default, Clone, Copy)]
struct Rate {
    bytes: u64,
    secs: f64,
    cpu: f64,
}

impl Rate {
    fn gbs(&self) -> f64 {
        self.bytes as f64 / self.secs.max(1e-12) / 1e9
    }
    fn cpu_per_gb(&self) -> f64 {
        self.cpu / (self.bytes as f64 / 1e9).max(1e-12)
    }
}

/// Process CPU time (user + system), seconds.
fn cpu_now() -> f64 {
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(u) => {
            let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
            t(u.user_time()) + t(u.system_time())
        }
        Err(_) => 0.0,
    }
}

/// Times `f`, wall and CPU.
fn timed<T>(bytes: u64, f: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<(Rate, T)> {
    let (c0, t0) = (cpu_now(), Instant::now());
    let v = f()?;
    let secs = t0.elapsed().as_secs_f64();
    Ok((
        Rate {
            bytes,
            secs,
            cpu: cpu_now() - c0,
        },
        v,
    ))
}

/// xorshift64*: the bench's data, keys and offsets.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
}

/// `vfpoll store bench`.
pub fn run(a: BenchArgs) -> anyhow::Result<ExitCode> {
    if !a.yes {
        bail!(
            "store bench formats the namespaces {} (everything on them is lost): add --yes",
            a.c.specs.join(" ")
        );
    }
    if a.entries == 0 || a.size < a.entries * 4096 || a.repeat == 0 {
        bail!("--size must hold --entries entries of at least 4 KiB, and --repeat be at least 1");
    }
    if !a.kv_block.is_multiple_of(4096) || a.kv_block == 0 || !a.chunk_size.is_multiple_of(4096) {
        bail!("--kv-block and --chunk-size are multiples of 4K");
    }
    let specs = parse_specs(&a.c.specs)?;
    // Like format, the bench may create a `file:` namespace of the size its spec gives.
    let how = OpenHow {
        create: true,
        ..a.c.how()
    };
    let progress = Progress::new();
    let mut rng = Rng::new(a.seed);
    // The checkpoint's data (not timed) and the buffer it is loaded into.
    let entry_len = (a.size / a.entries) as usize;
    let mut src = vec![0u8; entry_len * a.entries as usize];
    rng.fill(&mut src);
    let mut dst = vec![0u8; src.len()];
    let mut rounds = Vec::new();
    let mut members = Vec::new();
    for r in 0..a.repeat {
        let mut round = Round::default();
        let raw_first = r % 2 == 0;
        for phase in 0..2 {
            let devs = open_devices(&specs, &how)?;
            if members.is_empty() {
                members = devs.iter().map(|d| d.describe()).collect();
            }
            if (phase == 0) == raw_first {
                progress.note(&format!("round {}/{}: raw", r + 1, a.repeat));
                raw_phase(&a, devs, &mut round, &mut rng)?;
            } else {
                progress.note(&format!("round {}/{}: store", r + 1, a.repeat));
                store_phase(&a, devs, &mut round, &src, &mut dst, entry_len, &mut rng)?;
            }
        }
        rounds.push(round);
    }
    progress.done();
    report(&a, &members, &rounds)
}

/// The raw phase: sequential write (with a flush) and read of `size` bytes spread over the
/// namespaces, then random `kv_block` reads at QD1 and QD32 over what was written.
fn raw_phase(
    a: &BenchArgs,
    mut devs: Vec<Box<dyn Device>>,
    r: &mut Round,
    rng: &mut Rng,
) -> anyhow::Result<()> {
    let n = devs.len() as u64;
    let io = a.chunk_size as usize;
    let per_dev = a.size.div_ceil(n).div_ceil(io as u64) * io as u64;
    for d in &devs {
        if d.capacity() < RAW_START + per_dev {
            bail!(
                "{}: {} bytes, too small for {} of --size",
                d.describe(),
                d.capacity(),
                per_dev
            );
        }
    }
    let mut bufs: Vec<Vec<IoBuf>> = devs
        .iter()
        .map(|d| d.alloc_buffers(a.raw_depth, io))
        .collect::<Result<_, _>>()?;
    for (i, b) in bufs.iter_mut().flatten().enumerate() {
        let mut chunk = vec![0u8; io];
        Rng::new(i as u64 + 7).fill(&mut chunk);
        b.write(0, &chunk)?;
    }
    let total = per_dev * n;
    (r.raw_write, _) = timed(total, || {
        seq(&mut devs, &mut bufs, per_dev, io, true)?;
        flush_all(&mut devs)
    })?;
    (r.raw_read, _) = timed(total, || seq(&mut devs, &mut bufs, per_dev, io, false))?;
    drop(bufs);
    // Random block reads.
    let blk = a.kv_block as usize;
    let blocks_per_dev = per_dev / blk as u64;
    let mut kbufs: Vec<Vec<IoBuf>> = devs
        .iter()
        .map(|d| d.alloc_buffers(32, blk))
        .collect::<Result<_, _>>()?;
    let pick = |rng: &mut Rng| {
        let d = (rng.next() % n) as usize;
        (d, RAW_START + (rng.next() % blocks_per_dev) * blk as u64)
    };
    let mut lat = Vec::with_capacity(a.kv_ops as usize);
    for _ in 0..a.kv_ops {
        let (d, off) = pick(rng);
        let t0 = Instant::now();
        random_reads(&mut devs, &mut kbufs, &[(d, off)], blk)?;
        lat.push(t0.elapsed().as_nanos() as u64);
    }
    r.raw_qd1_ns = lat;
    let reqs: Vec<(usize, u64)> = (0..a.kv_batches * 32).map(|_| pick(rng)).collect();
    (r.raw_qd32, _) = timed(reqs.len() as u64 * blk as u64, || {
        random_reads_qd(&mut devs, &mut kbufs, &reqs, blk, 32)
    })?;
    Ok(())
}

/// Polls every device until each has nothing outstanding; checks every completion.
fn reap(
    devs: &mut [Box<dyn Device>],
    bufs: &mut [Vec<IoBuf>],
    done: &mut Vec<IoDone>,
) -> anyhow::Result<usize> {
    let mut n = 0;
    for d in devs.iter_mut() {
        d.poll(done);
    }
    for c in done.drain(..) {
        let dev = (c.tag >> 32) as usize;
        c.result
            .with_context(|| format!("raw I/O on {}", devs[dev].describe()))?;
        if let Some(b) = c.buf {
            bufs[dev].push(b);
        }
        n += 1;
    }
    Ok(n)
}

/// Submits `op` on device `dev`, polling while its queue is full.
fn submit(
    devs: &mut [Box<dyn Device>],
    bufs: &mut [Vec<IoBuf>],
    done: &mut Vec<IoDone>,
    dev: usize,
    tag: u64,
    mut op: IoOp,
) -> anyhow::Result<usize> {
    let mut reaped = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match devs[dev].submit((dev as u64) << 32 | (tag & 0xffff_ffff), op) {
            Ok(()) => return Ok(reaped),
            Err((vfpoll_store::device::DeviceError::QueueFull, back)) => {
                op = back;
                devs[dev].kick()?;
                reaped += reap(devs, bufs, done)?;
                if Instant::now() > deadline {
                    bail!("{}: the queue stayed full for 30 s", devs[dev].describe());
                }
            }
            Err((e, _)) => return Err(e).with_context(|| format!("raw I/O on {}", devs[dev].describe())),
        }
    }
}

/// Sequential I/O of `per_dev` bytes on each device from [`RAW_START`], in `io`-byte requests,
/// as many in flight per device as it has buffers.
fn seq(
    devs: &mut [Box<dyn Device>],
    bufs: &mut [Vec<IoBuf>],
    per_dev: u64,
    io: usize,
    write: bool,
) -> anyhow::Result<()> {
    let n = devs.len();
    let mut next = vec![0u64; n];
    let mut inflight = 0usize;
    let mut done = Vec::new();
    let mut tag = 0u64;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let mut submitted = false;
        for d in 0..n {
            while next[d] < per_dev {
                let Some(mut buf) = bufs[d].pop() else { break };
                buf.set_len(io)?;
                let offset = RAW_START + next[d];
                let op = if write {
                    IoOp::Write {
                        offset,
                        buf,
                        fua: false,
                    }
                } else {
                    IoOp::Read { offset, buf }
                };
                tag += 1;
                inflight -= submit(devs, bufs, &mut done, d, tag, op)?;
                inflight += 1;
                next[d] += io as u64;
                submitted = true;
            }
            if submitted {
                devs[d].kick()?;
            }
        }
        if inflight == 0 && next.iter().all(|&x| x >= per_dev) {
            return Ok(());
        }
        inflight -= reap(devs, bufs, &mut done)?;
        if Instant::now() > deadline {
            bail!("raw sequential I/O did not finish in 600 s");
        }
    }
}

fn flush_all(devs: &mut [Box<dyn Device>]) -> anyhow::Result<()> {
    let mut bufs: Vec<Vec<IoBuf>> = devs.iter().map(|_| Vec::new()).collect();
    let mut done = Vec::new();
    let mut inflight = 0;
    for d in 0..devs.len() {
        if devs[d].volatile_write_cache() {
            inflight -= submit(devs, &mut bufs, &mut done, d, 0, IoOp::Flush)?;
            inflight += 1;
            devs[d].kick()?;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while inflight > 0 {
        inflight -= reap(devs, &mut bufs, &mut done)?;
        if Instant::now() > deadline {
            bail!("flush did not finish in 60 s");
        }
    }
    Ok(())
}

/// Reads `reqs` (device, offset) of `blk` bytes each, all in flight at once.
fn random_reads(
    devs: &mut [Box<dyn Device>],
    bufs: &mut [Vec<IoBuf>],
    reqs: &[(usize, u64)],
    blk: usize,
) -> anyhow::Result<()> {
    random_reads_qd(devs, bufs, reqs, blk, reqs.len())
}

/// Reads `reqs` of `blk` bytes each, keeping `depth` in flight over all devices.
fn random_reads_qd(
    devs: &mut [Box<dyn Device>],
    bufs: &mut [Vec<IoBuf>],
    reqs: &[(usize, u64)],
    blk: usize,
    depth: usize,
) -> anyhow::Result<()> {
    let mut done = Vec::new();
    let mut inflight = 0usize;
    let mut i = 0;
    let deadline = Instant::now() + Duration::from_secs(600);
    while i < reqs.len() || inflight > 0 {
        let mut kicked = vec![false; devs.len()];
        while i < reqs.len() && inflight < depth {
            let (d, offset) = reqs[i];
            let Some(mut buf) = bufs[d].pop() else { break };
            buf.set_len(blk)?;
            inflight -= submit(devs, bufs, &mut done, d, i as u64, IoOp::Read { offset, buf })?;
            inflight += 1;
            kicked[d] = true;
            i += 1;
        }
        for (d, k) in kicked.iter().enumerate() {
            if *k {
                devs[d].kick()?;
            }
        }
        inflight -= reap(devs, bufs, &mut done)?;
        if Instant::now() > deadline {
            bail!("raw random reads did not finish in 600 s");
        }
    }
    Ok(())
}

/// The store phase: format, save, load (crc on, off), KV put and gets.
fn store_phase(
    a: &BenchArgs,
    devs: Vec<Box<dyn Device>>,
    r: &mut Round,
    src: &[u8],
    dst: &mut [u8],
    entry_len: usize,
    rng: &mut Rng,
) -> anyhow::Result<()> {
    let mut opts = FormatOptions {
        chunk_size: u32::try_from(a.chunk_size).context("--chunk-size: at most 64M")?,
        label: "vfpoll store bench".into(),
        file_size: None,
        force: true,
        store: a.c.store_options(),
    };
    if let Some(n) = a.copy_threads {
        opts.store.copy_threads = n;
    }
    if let Some(us) = a.poll_spin_us {
        opts.store.poll_spin = Duration::from_micros(us);
    }
    if let Some(n) = a.io_channels {
        opts.store.io_channels = n;
    }
    let store = Store::format_devices(devs, &opts)?;
    r.io_channels = store.info().io_channels;
    let names: Vec<String> = (0..a.entries).map(|i| format!("layers.{i}.weight")).collect();
    let total = src.len() as u64;
    (r.save, _) = timed(total, || {
        let mut tx = store.begin("bench")?;
        for (i, n) in names.iter().enumerate() {
            tx.put(n, b"u8", &src[i * entry_len..(i + 1) * entry_len])?;
        }
        tx.keep_last(1);
        Ok(tx.commit()?)
    })?;
    let reader = store.open_version("bench", None)?;
    for (verify, rate) in [(true, &mut r.load_crc), (false, &mut r.load_nocrc)] {
        dst.fill(0);
        (*rate, _) = timed(total, || {
            let o = ReadOptions { verify };
            for (i, n) in names.iter().enumerate() {
                reader.read_range(n, 0, &mut dst[i * entry_len..(i + 1) * entry_len], &o)?;
            }
            Ok(())
        })?;
        if dst != src {
            bail!(
                "the checkpoint read back (crc checks {}) differs from what was saved",
                if verify { "on" } else { "off" }
            );
        }
    }
    drop(reader);
    // KV.
    let blk = a.kv_block as usize;
    let pool = store.create_pool("bench-kv", u32::try_from(a.kv_block)?, a.kv_blocks * 2)?;
    let keys: Vec<u128> = (0..a.kv_blocks)
        .map(|_| (rng.next() as u128) << 64 | rng.next() as u128)
        .collect();
    let mut block = vec![0u8; blk * 32];
    rng.fill(&mut block);
    (r.kv_put, _) = timed(a.kv_blocks * blk as u64, || {
        for batch in keys.chunks(32) {
            let bufs: Vec<&[u8]> = (0..batch.len()).map(|i| &block[i * blk..(i + 1) * blk]).collect();
            pool.put_many(batch, &bufs)?;
        }
        Ok(())
    })?;
    let mut out = vec![0u8; blk * 32];
    let mut hit = Vec::with_capacity(a.kv_ops as usize);
    let mut miss = Vec::with_capacity(a.kv_ops as usize);
    for _ in 0..a.kv_ops {
        let k = keys[(rng.next() % a.kv_blocks) as usize];
        let t0 = Instant::now();
        let got = pool.get_many(&[k], &mut [&mut out[..blk]])?;
        hit.push(t0.elapsed().as_nanos() as u64);
        if got[0] != Some(blk) {
            bail!("KV get of a key just put missed");
        }
        let absent = (rng.next() as u128) << 64 | rng.next() as u128 | 1 << 127;
        let t0 = Instant::now();
        let got = pool.get_many(&[absent], &mut [&mut out[..blk]])?;
        miss.push(t0.elapsed().as_nanos() as u64);
        if got[0].is_some() && !keys.contains(&absent) {
            bail!("KV get of an absent key hit");
        }
    }
    r.kv_hit_ns = hit;
    r.kv_miss_ns = miss;
    let batches: Vec<Vec<u128>> = (0..a.kv_batches)
        .map(|_| {
            (0..32)
                .map(|_| keys[(rng.next() % a.kv_blocks) as usize])
                .collect()
        })
        .collect();
    (r.kv_batch, _) = timed(a.kv_batches * 32 * blk as u64, || {
        for b in &batches {
            let mut outs: Vec<&mut [u8]> = out.chunks_mut(blk).collect();
            let got = pool.get_many(b, &mut outs)?;
            if got.iter().any(|g| *g != Some(blk)) {
                bail!("a KV batch get missed a key that was put");
            }
        }
        Ok(())
    })?;
    if a.kv_threads > 0 {
        kv_threads_phase(a, &pool, &keys, &block, r, rng)?;
    }
    Ok(())
}

/// Several threads on one pool (LMCache or vLLM workers sharing a tier): first all of them
/// getting batches of 32 keys put before, then half putting batches of 32 (keys of their
/// own, so the gets keep hitting) while the other half get. Rates are bytes over the phase's
/// wall time.
fn kv_threads_phase(
    a: &BenchArgs,
    pool: &vfpoll_store::KvPool,
    keys: &[u128],
    block: &[u8],
    r: &mut Round,
    rng: &mut Rng,
) -> anyhow::Result<()> {
    let blk = a.kv_block as usize;
    let n = a.kv_threads;
    let per = (a.kv_batches / 2).max(1);
    let batch_of = |seed: u64| -> Vec<Vec<u128>> {
        let mut g = Rng::new(seed);
        (0..per)
            .map(|_| {
                (0..32)
                    .map(|_| keys[(g.next() % keys.len() as u64) as usize])
                    .collect()
            })
            .collect()
    };
    // One get thread: its batches, timed one by one; a miss is an error (nothing is evicted).
    let getter = |seed: u64| -> anyhow::Result<Vec<u64>> {
        let mut out = vec![0u8; blk * 32];
        let mut ns = Vec::with_capacity(per as usize);
        for b in batch_of(seed) {
            let mut outs: Vec<&mut [u8]> = out.chunks_mut(blk).collect();
            let t0 = Instant::now();
            let got = pool.get_many(&b, &mut outs)?;
            ns.push(t0.elapsed().as_nanos() as u64);
            if got.iter().any(|g| *g != Some(blk)) {
                bail!("a KV batch get (several threads) missed a key that was put");
            }
        }
        Ok(ns)
    };
    let seeds: Vec<u64> = (0..n).map(|_| rng.next()).collect();
    (r.kv_mt_get, _) = timed(n as u64 * per * 32 * blk as u64, || {
        std::thread::scope(|s| {
            let hs: Vec<_> = seeds.iter().map(|&sd| s.spawn(move || getter(sd))).collect();
            hs.into_iter().try_for_each(|h| {
                h.join()
                    .map_err(|_| anyhow::anyhow!("a get thread panicked"))?
                    .map(drop)
            })
        })
    })?;
    // Half put (each its own 32 keys, replaced batch after batch: the pool never fills), half get.
    let putters = (n / 2).max(1);
    let getters = n.saturating_sub(putters).max(1);
    let own: Vec<Vec<u128>> = (0..putters)
        .map(|_| {
            (0..32)
                .map(|_| (rng.next() as u128) << 64 | rng.next() as u128 | 1 << 126)
                .collect()
        })
        .collect();
    let t0 = Instant::now();
    let c0 = cpu_now();
    let get_ns = std::thread::scope(|s| -> anyhow::Result<Vec<u64>> {
        let ps: Vec<_> = own
            .iter()
            .map(|ks| {
                s.spawn(move || -> anyhow::Result<()> {
                    let bufs: Vec<&[u8]> = block.chunks(blk).collect();
                    for _ in 0..per {
                        pool.put_many(ks, &bufs)?;
                    }
                    Ok(())
                })
            })
            .collect();
        let gs: Vec<_> = seeds[..getters]
            .iter()
            .map(|&sd| s.spawn(move || getter(sd)))
            .collect();
        let mut all = Vec::new();
        for h in gs {
            all.extend(h.join().map_err(|_| anyhow::anyhow!("a get thread panicked"))??);
        }
        for h in ps {
            h.join().map_err(|_| anyhow::anyhow!("a put thread panicked"))??;
        }
        Ok(all)
    })?;
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu_now() - c0;
    let gb = getters as u64 * per * 32 * blk as u64;
    let pb = putters as u64 * per * 32 * blk as u64;
    // CPU time is the phase's, split by bytes.
    let share = |b: u64| cpu * b as f64 / (gb + pb) as f64;
    r.kv_mix_get = Rate {
        bytes: gb,
        secs,
        cpu: share(gb),
    };
    r.kv_mix_put = Rate {
        bytes: pb,
        secs,
        cpu: share(pb),
    };
    r.kv_mix_get_ns = get_ns;
    Ok(())
}

fn percentile(v: &[u64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_unstable();
    let i = ((p / 100.0) * (s.len() - 1) as f64).round() as usize;
    s[i.min(s.len() - 1)] as f64
}

/// Median, min, max.
fn mmm(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    let med = if v.len() % 2 == 1 {
        v[v.len() / 2]
    } else {
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    };
    (med, v[0], v[v.len() - 1])
}

fn report(a: &BenchArgs, members: &[String], rounds: &[Round]) -> anyhow::Result<ExitCode> {
    let rate = |f: &dyn Fn(&Round) -> Rate| -> Value {
        let (g, gmin, gmax) = mmm(rounds.iter().map(|r| f(r).gbs()).collect());
        let (c, _, _) = mmm(rounds.iter().map(|r| f(r).cpu_per_gb()).collect());
        json!({"gb_s": g, "gb_s_min": gmin, "gb_s_max": gmax, "cpu_s_per_gb": c,
               "runs_gb_s": rounds.iter().map(|r| f(r).gbs()).collect::<Vec<_>>()})
    };
    let lat = |f: &dyn Fn(&Round) -> &Vec<u64>| -> Value {
        let p50 = mmm(rounds.iter().map(|r| percentile(f(r), 50.0) / 1e3).collect());
        let p99 = mmm(rounds.iter().map(|r| percentile(f(r), 99.0) / 1e3).collect());
        json!({"p50_us": p50.0, "p99_us": p99.0, "p50_us_min": p50.1, "p50_us_max": p50.2,
               "runs_p50_us": rounds.iter().map(|r| percentile(f(r), 50.0) / 1e3).collect::<Vec<_>>()})
    };
    let v = json!({
        "members": members,
        "size": a.size,
        "entries": a.entries,
        "chunk_size": a.chunk_size,
        "rounds": rounds.len(),
        "raw_depth": a.raw_depth,
        "kv_block": a.kv_block,
        "copy_threads": a.copy_threads.unwrap_or_else(|| vfpoll_store::StoreOptions::default().copy_threads),
        "poll_spin_us": a.poll_spin_us.unwrap_or_else(|| vfpoll_store::StoreOptions::default().poll_spin.as_micros() as u64),
        "io_channels": rounds.iter().map(|r| r.io_channels).max().unwrap_or(0),
        "raw_seq_write": rate(&|r| r.raw_write),
        "raw_seq_read": rate(&|r| r.raw_read),
        "checkpoint_save": rate(&|r| r.save),
        "checkpoint_load_crc": rate(&|r| r.load_crc),
        "checkpoint_load_nocrc": rate(&|r| r.load_nocrc),
        "raw_read_qd1": lat(&|r| &r.raw_qd1_ns),
        "kv_get_qd1_hit": lat(&|r| &r.kv_hit_ns),
        "kv_get_qd1_miss": lat(&|r| &r.kv_miss_ns),
        "raw_read_qd32": rate(&|r| r.raw_qd32),
        "kv_get_batch32": rate(&|r| r.kv_batch),
        "kv_put_batch32": rate(&|r| r.kv_put),
        "kv_threads": a.kv_threads,
        "kv_threads_get_batch32": rate(&|r| r.kv_mt_get),
        "kv_mixed_get_batch32": rate(&|r| r.kv_mix_get),
        "kv_mixed_put_batch32": rate(&|r| r.kv_mix_put),
        "kv_mixed_get_batch32_latency": lat(&|r| &r.kv_mix_get_ns),
    });
    let g = |k: &str| v[k]["gb_s"].as_f64().unwrap_or(0.0);
    let ratios = json!({
        "save_vs_raw_write": g("checkpoint_save") / g("raw_seq_write"),
        "load_crc_vs_raw_read": g("checkpoint_load_crc") / g("raw_seq_read"),
        "load_nocrc_vs_raw_read": g("checkpoint_load_nocrc") / g("raw_seq_read"),
        "kv_hit_p50_vs_raw_qd1_p50": v["kv_get_qd1_hit"]["p50_us"].as_f64().unwrap_or(0.0)
            / v["raw_read_qd1"]["p50_us"].as_f64().unwrap_or(1.0),
        "kv_batch32_vs_raw_qd32": g("kv_get_batch32") / g("raw_read_qd32"),
    });
    let mut v = v;
    if a.kv_threads == 0 {
        // Not run: null in the JSON, no row in the table.
        for k in [
            "kv_threads_get_batch32",
            "kv_mixed_get_batch32",
            "kv_mixed_put_batch32",
            "kv_mixed_get_batch32_latency",
        ] {
            v[k] = Value::Null;
        }
    }
    v["ratios"] = ratios.clone();
    if a.c.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "vfpoll store bench: {} over {} namespace(s) ({}), {} entries, {} chunks, {} copy thread(s), {} µs poll, {} I/O \
         channel(s), {} round(s), medians (min-max)",
        super::human(a.size),
        members.len(),
        members.join(", "),
        a.entries,
        super::human(a.chunk_size),
        v["copy_threads"],
        v["poll_spin_us"],
        v["io_channels"],
        rounds.len()
    );
    if a.kv_threads > 0 {
        println!(
            "(the \"x32\" rows: {} threads on one pool, {} batches each)",
            a.kv_threads,
            (a.kv_batches / 2).max(1)
        );
    }
    println!("{:<34} {:>20} {:>10}", "", "GB/s", "CPU s/GB");
    for (name, k) in [
        ("raw sequential write (+flush)", "raw_seq_write"),
        ("checkpoint save (to durable)", "checkpoint_save"),
        ("raw sequential read", "raw_seq_read"),
        ("checkpoint load, crc32c on", "checkpoint_load_crc"),
        ("checkpoint load, crc32c off", "checkpoint_load_nocrc"),
        ("raw 64K-block read QD32", "raw_read_qd32"),
        ("KV get, batches of 32 (hits)", "kv_get_batch32"),
        ("KV put, batches of 32", "kv_put_batch32"),
        ("KV get x32, all threads", "kv_threads_get_batch32"),
        ("KV get x32, half the threads", "kv_mixed_get_batch32"),
        ("KV put x32, other half (same time)", "kv_mixed_put_batch32"),
    ] {
        let x = &v[k];
        if x.is_null() {
            continue; // a phase not run (the thread rows with --kv-threads 0)
        }
        println!(
            "{name:<34} {:>7.3} ({:.3}-{:.3}) {:>10.3}",
            x["gb_s"].as_f64().unwrap_or(0.0),
            x["gb_s_min"].as_f64().unwrap_or(0.0),
            x["gb_s_max"].as_f64().unwrap_or(0.0),
            x["cpu_s_per_gb"].as_f64().unwrap_or(0.0)
        );
    }
    println!("{:<34} {:>10} {:>10}", "", "p50 us", "p99 us");
    for (name, k) in [
        ("raw block read QD1", "raw_read_qd1"),
        ("KV get QD1, hit", "kv_get_qd1_hit"),
        ("KV get QD1, miss", "kv_get_qd1_miss"),
        ("KV get x32 batch, beside puts", "kv_mixed_get_batch32_latency"),
    ] {
        if v[k].is_null() {
            continue;
        }
        println!(
            "{name:<34} {:>10.1} {:>10.1}",
            v[k]["p50_us"].as_f64().unwrap_or(0.0),
            v[k]["p99_us"].as_f64().unwrap_or(0.0)
        );
    }
    println!(
        "ratios: save/raw write {:.2}x, load/raw read {:.2}x (crc off {:.2}x), KV hit p50/raw QD1 p50 {:.2}x, KV batch32/raw QD32 {:.2}x",
        ratios["save_vs_raw_write"].as_f64().unwrap_or(0.0),
        ratios["load_crc_vs_raw_read"].as_f64().unwrap_or(0.0),
        ratios["load_nocrc_vs_raw_read"].as_f64().unwrap_or(0.0),
        ratios["kv_hit_p50_vs_raw_qd1_p50"].as_f64().unwrap_or(0.0),
        ratios["kv_batch32_vs_raw_qd32"].as_f64().unwrap_or(0.0)
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats() {
        assert_eq!(percentile(&[5, 1, 3], 50.0), 3.0);
        assert_eq!(percentile(&[], 99.0), 0.0);
        assert_eq!(mmm(vec![3.0, 1.0, 2.0]), (2.0, 1.0, 3.0));
        assert_eq!(mmm(vec![4.0, 1.0]), (2.5, 1.0, 4.0));
        let r = Rate {
            bytes: 2_000_000_000,
            secs: 2.0,
            cpu: 1.0,
        };
        assert_eq!((r.gbs(), r.cpu_per_gb()), (1.0, 0.5));
    }
}
