//! Trace-driven comparison of the KV pool's eviction policies (LRU and S3-FIFO, issue 23).
//!
//! ```text
//! cargo run --release -p vfpoll-store --example kv_policy [-- --seed 1 --scale 1 --trace chat --check]
//! ```
//!
//! Each trace below is generated from `--seed` and replayed against a pool at 5, 10, 25 and 50 %
//! of its working set (the distinct blocks it touches). The replay drives the very
//! [`Evictor`] a `KvPool` runs, with the pool's reservation rules (a full pool evicts
//! [`Evictor::batch`] blocks at once; the blocks of one put are queued after its evictions) but
//! no I/O. `--check` also replays a smaller copy of every trace through a real pool on memory
//! devices under each policy (4 KiB blocks, every hit's bytes compared with what was put) and
//! fails unless its hits, puts and evictions equal the replay's.
//!
//! A request is a chain of block keys (a prefix hash per block, as vLLM and LMCache key KV
//! blocks). Its lookup walks the chain and stops at the first miss: a block is useless without
//! the ones before it, so only the hit prefix is read (a get) and counts as a hit to the policy.
//! The chain's blocks that are not held (the rest of the looked-up part, and the new blocks the
//! request computes) are then put, in puts of at most 32 blocks. Two figures per run:
//! - **block hits**: of the looked-up blocks, the share the pool held when the request came
//!   (whether or not the prefix walk reached them);
//! - **prefix served**: the share of looked-up tokens served from the pool (the hit prefix;
//!   every block holds the same number of tokens).
//!
//! The traces (sizes at `--scale 1`):
//! - `chat`, multi-turn chat: 1,000 open sessions, picked by Zipf(0.8) popularity of their
//!   place; a session starts with one of 8 system prompts (4 blocks, Zipf 1.0) and a 1-4 block
//!   first message, and every turn re-reads the session's whole context and appends 1-3 blocks
//!   (the user's message and the reply). A session ends after a turn with probability 1/8, or at
//!   128 blocks; a new one takes its place. 150,000 turns.
//! - `templates`, shared prompts and scans: 4 system prompts (8 blocks, Zipf 1.0) and 2,000
//!   few-shot templates (4-16 blocks, Zipf 1.0). 70 % of requests are a system prompt, a
//!   template and a new 1-block question; 30 % are a system prompt and a one-off document of
//!   16-96 blocks, read once (scan pollution), and a question. 100,000 requests.
//! - `rag`, document QA: a 2-block system prompt, then one of 10,000 documents (4-64 blocks each,
//!   Zipf 0.9 popularity) read in order from its start, then a new 1-block question. 100,000
//!   requests.
//! - `zipf0.8`, `zipf1.0`: independent single blocks, Zipf(0.8) and Zipf(1.0) over 200,000
//!   keys. 2,000,000 requests.

use std::collections::{HashMap, HashSet};
use std::process::ExitCode;

use vfpoll_store::device::{Device, MemDevice};
use vfpoll_store::{EvictionPolicy, Evictor, FormatOptions, KvPool, Store, StoreOptions};

/// Cache sizes, in percent of a trace's working set.
const SIZES: [u64; 4] = [5, 10, 25, 50];
/// Most blocks in one put.
const PUT_BATCH: usize = 32;
const POLICIES: [EvictionPolicy; 2] = [EvictionPolicy::Lru, EvictionPolicy::S3Fifo];

/// splitmix64: small, seedable, good enough for workload generation.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn key(&mut self) -> u128 {
        (u128::from(self.next()) << 64) | u128::from(self.next())
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }

    fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

/// Zipf(alpha) over `0..n` (rank 0 the most popular), by inverse transform of the CDF.
struct Zipf(Vec<f64>);

impl Zipf {
    fn new(n: usize, alpha: f64) -> Self {
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = (1..=n)
            .map(|i| {
                acc += 1.0 / (i as f64).powf(alpha);
                acc
            })
            .collect();
        for c in &mut cdf {
            *c /= acc;
        }
        Zipf(cdf)
    }

    fn sample(&self, rng: &mut Rng) -> usize {
        let u = (rng.next() >> 11) as f64 / (1u64 << 53) as f64;
        self.0.partition_point(|&c| c < u).min(self.0.len() - 1)
    }
}

/// A request: `keys[..lookup]` is looked up (prefix semantics), the whole chain is put where
/// missing.
struct Request {
    keys: Vec<u128>,
    lookup: usize,
}

fn chains(n: usize, lo: usize, hi: usize, rng: &mut Rng) -> Vec<Vec<u128>> {
    (0..n)
        .map(|_| (0..rng.range(lo, hi)).map(|_| rng.key()).collect())
        .collect()
}

fn scaled(n: usize, scale: f64) -> usize {
    ((n as f64 * scale) as usize).max(1)
}

fn chat(seed: u64, scale: f64) -> Vec<Request> {
    let mut rng = Rng(seed);
    let prompts = chains(8, 4, 4, &mut rng);
    let prompt_pop = Zipf::new(prompts.len(), 1.0);
    let open = 1000;
    let pop = Zipf::new(open, 0.8);
    let new_session = |rng: &mut Rng| -> Vec<u128> {
        let mut s = prompts[prompt_pop.sample(rng)].clone();
        s.extend((0..rng.range(1, 4)).map(|_| rng.key()));
        s
    };
    // A session's first request looks up its system prompt and puts its first message.
    let mut sessions: Vec<(Vec<u128>, bool)> = (0..open).map(|_| (new_session(&mut rng), true)).collect();
    let mut out = Vec::new();
    for _ in 0..scaled(150_000, scale) {
        let i = pop.sample(&mut rng);
        let (s, first) = &mut sessions[i];
        let lookup = if *first { 4 } else { s.len() };
        if !*first {
            s.extend((0..rng.range(1, 3)).map(|_| rng.key()));
        }
        *first = false;
        out.push(Request {
            keys: s.clone(),
            lookup,
        });
        if rng.chance(1.0 / 8.0) || s.len() >= 128 {
            sessions[i] = (new_session(&mut rng), true);
        }
    }
    out
}

fn templates(seed: u64, scale: f64) -> Vec<Request> {
    let mut rng = Rng(seed);
    let prompts = chains(4, 8, 8, &mut rng);
    let prompt_pop = Zipf::new(prompts.len(), 1.0);
    let shots = chains(2000, 4, 16, &mut rng);
    let shot_pop = Zipf::new(shots.len(), 1.0);
    (0..scaled(100_000, scale))
        .map(|_| {
            let mut keys = prompts[prompt_pop.sample(&mut rng)].clone();
            if rng.chance(0.7) {
                keys.extend(&shots[shot_pop.sample(&mut rng)]);
            } else {
                let n = rng.range(16, 96);
                keys.extend((0..n).map(|_| rng.key()));
            }
            let lookup = keys.len();
            keys.push(rng.key());
            Request { keys, lookup }
        })
        .collect()
}

fn rag(seed: u64, scale: f64) -> Vec<Request> {
    let mut rng = Rng(seed);
    let prompt = chains(1, 2, 2, &mut rng).remove(0);
    let docs = chains(10_000, 4, 64, &mut rng);
    let pop = Zipf::new(docs.len(), 0.9);
    (0..scaled(100_000, scale))
        .map(|_| {
            let mut keys = prompt.clone();
            keys.extend(&docs[pop.sample(&mut rng)]);
            let lookup = keys.len();
            keys.push(rng.key());
            Request { keys, lookup }
        })
        .collect()
}

fn zipf(seed: u64, scale: f64, alpha: f64) -> Vec<Request> {
    let mut rng = Rng(seed);
    let keys: Vec<u128> = (0..200_000).map(|_| rng.key()).collect();
    let pop = Zipf::new(keys.len(), alpha);
    (0..scaled(2_000_000, scale))
        .map(|_| Request {
            keys: vec![keys[pop.sample(&mut rng)]],
            lookup: 1,
        })
        .collect()
}

/// Hits and puts of one replay.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Counts {
    /// Blocks looked up.
    looked: u64,
    /// Looked-up blocks the pool held.
    present: u64,
    /// Hit-prefix blocks (gets that hit).
    prefix: u64,
    puts: u64,
    evictions: u64,
}

/// The blocks of a pool and its eviction order, run as `KvPool` runs them, without I/O.
struct Sim {
    evictor: Evictor,
    index: HashMap<u128, u64>,
    key_of: Vec<u128>,
    free: Vec<u64>,
    c: Counts,
}

impl Sim {
    fn new(policy: EvictionPolicy, slots: u64) -> Self {
        Sim {
            evictor: Evictor::new(policy, slots),
            index: HashMap::new(),
            key_of: vec![0; slots as usize],
            free: (0..slots).rev().collect(),
            c: Counts::default(),
        }
    }

    /// `KvPool::put_many` of keys it does not hold: reserve (evicting a batch when no slot is
    /// free), then publish in order.
    fn put(&mut self, keys: &[u128]) {
        let mut spare = Vec::new();
        let mut slots = Vec::with_capacity(keys.len());
        for i in 0..keys.len() {
            if spare.is_empty() && self.free.is_empty() {
                let want = self.evictor.batch().max((keys.len() - i) as u64);
                for _ in 0..want {
                    let Some(v) = self.evictor.evict() else { break };
                    self.index.remove(&self.key_of[v as usize]);
                    self.c.evictions += 1;
                    spare.push(v);
                }
            }
            slots.push(spare.pop().or_else(|| self.free.pop()).expect("a slot"));
        }
        self.free.extend(spare);
        for (k, &s) in keys.iter().zip(&slots) {
            self.index.insert(*k, s);
            self.key_of[s as usize] = *k;
            self.evictor.insert(s, *k);
        }
        self.c.puts += keys.len() as u64;
    }

    fn request(&mut self, r: &Request) {
        let mut walking = true;
        for k in &r.keys[..r.lookup] {
            self.c.looked += 1;
            match self.index.get(k) {
                Some(&s) => {
                    self.c.present += 1;
                    if walking {
                        self.c.prefix += 1;
                        self.evictor.hit(s);
                    }
                }
                None => walking = false,
            }
        }
        let missing: Vec<u128> = r
            .keys
            .iter()
            .copied()
            .filter(|k| !self.index.contains_key(k))
            .collect();
        for chunk in missing.chunks(PUT_BATCH) {
            self.put(chunk);
        }
    }
}

fn working_set(reqs: &[Request]) -> u64 {
    let mut seen = HashSet::new();
    for r in reqs {
        seen.extend(r.keys.iter().copied());
    }
    seen.len() as u64
}

fn simulate(reqs: &[Request], policy: EvictionPolicy, slots: u64) -> Counts {
    let mut sim = Sim::new(policy, slots);
    for r in reqs {
        sim.request(r);
    }
    sim.c
}

const BS: usize = 4096;

fn block(k: u128) -> Vec<u8> {
    k.to_le_bytes().iter().cycle().take(BS).copied().collect()
}

/// The same replay through a real pool on memory devices.
fn replay_pool(reqs: &[Request], policy: EvictionPolicy, slots: u64) -> Result<Counts, String> {
    let err = |e: vfpoll_store::StoreError| e.to_string();
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let size = (slots * BS as u64 + (32 << 20)).next_multiple_of(1 << 20);
    let dev: Box<dyn Device> = Box::new(MemDevice::new(size, 512, false));
    let opts = FormatOptions {
        chunk_size: 64 << 10,
        store: StoreOptions {
            lock_dir: Some(dir.path().into()),
            kv_eviction: policy,
            ..Default::default()
        },
        ..Default::default()
    };
    let store = Store::format_devices(vec![dev], &opts).map_err(err)?;
    let pool: KvPool = store.create_pool("kv", BS as u32, slots).map_err(err)?;
    let mut c = Counts::default();
    for r in reqs {
        let look = &r.keys[..r.lookup];
        c.looked += look.len() as u64;
        c.present += look.iter().filter(|&&k| pool.contains(k)).count() as u64;
        let n = look.iter().take_while(|&&k| pool.contains(k)).count();
        let mut out = vec![vec![0u8; BS]; n];
        let mut bufs: Vec<&mut [u8]> = out.iter_mut().map(|v| v.as_mut_slice()).collect();
        let hits = pool.get_many(&look[..n], &mut bufs).map_err(err)?;
        for ((k, h), o) in look.iter().zip(hits).zip(&out) {
            if h != Some(BS) || *o != block(*k) {
                return Err(format!("key {k:#x}: a hit returned other bytes ({h:?})"));
            }
        }
        c.prefix += n as u64;
        let missing: Vec<u128> = r.keys.iter().copied().filter(|&k| !pool.contains(k)).collect();
        for chunk in missing.chunks(PUT_BATCH) {
            let vals: Vec<Vec<u8>> = chunk.iter().map(|&k| block(k)).collect();
            let refs: Vec<&[u8]> = vals.iter().map(|v| v.as_slice()).collect();
            pool.put_many(chunk, &refs).map_err(err)?;
        }
    }
    let s = pool.stats();
    c.puts = s.puts;
    c.evictions = s.evictions;
    if s.hits != c.prefix || s.misses != 0 || s.bad_blocks != 0 {
        return Err(format!("pool stats {s:?} disagree with {c:?}"));
    }
    Ok(c)
}

fn pct(a: u64, b: u64) -> f64 {
    100.0 * a as f64 / b.max(1) as f64
}

struct Args {
    seed: u64,
    scale: f64,
    trace: Option<String>,
    check: bool,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        seed: 1,
        scale: 1.0,
        trace: None,
        check: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--seed" => a.seed = val("--seed")?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--scale" => {
                a.scale = val("--scale")?.parse().map_err(|e| format!("--scale: {e}"))?;
                if !(a.scale > 0.0 && a.scale <= 10.0) {
                    return Err("--scale: a factor in (0, 10]".into());
                }
            }
            "--trace" => a.trace = Some(val("--trace")?),
            "--check" => a.check = true,
            "-h" | "--help" => {
                return Err(
                    "usage: kv_policy [--seed N] [--scale F] [--trace NAME] [--check]\n\
                     traces: chat, templates, rag, zipf0.8, zipf1.0 (all by default); --check \
                     also replays a 1/20 copy through a real pool per policy"
                        .into(),
                )
            }
            _ => return Err(format!("unknown argument {arg:?}; try --help")),
        }
    }
    Ok(a)
}

type Gen = fn(u64, f64) -> Vec<Request>;

fn main() -> ExitCode {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let traces: [(&str, Gen); 5] = [
        ("chat", chat),
        ("templates", templates),
        ("rag", rag),
        ("zipf0.8", |s, f| zipf(s, f, 0.8)),
        ("zipf1.0", |s, f| zipf(s, f, 1.0)),
    ];
    if let Some(t) = &a.trace {
        if !traces.iter().any(|(n, _)| n == t) {
            eprintln!("--trace {t:?}: use one of chat, templates, rag, zipf0.8, zipf1.0");
            return ExitCode::from(2);
        }
    }
    println!(
        "seed {}, scale {}; block hits / prefix served, in % of looked-up blocks",
        a.seed, a.scale
    );
    println!("| trace | pool | LRU blocks | S3-FIFO blocks | LRU prefix | S3-FIFO prefix |");
    println!("| --- | --- | --- | --- | --- | --- |");
    for (name, gen) in traces
        .iter()
        .filter(|(n, _)| a.trace.as_deref().is_none_or(|t| t == *n))
    {
        let reqs = gen(a.seed, a.scale);
        let ws = working_set(&reqs);
        for pc in SIZES {
            let slots = (ws * pc / 100).max(16);
            let r: Vec<Counts> = POLICIES.iter().map(|&p| simulate(&reqs, p, slots)).collect();
            println!(
                "| {name} | {pc}% ({slots}) | {:.1} | {:.1} | {:.1} | {:.1} |",
                pct(r[0].present, r[0].looked),
                pct(r[1].present, r[1].looked),
                pct(r[0].prefix, r[0].looked),
                pct(r[1].prefix, r[1].looked),
            );
        }
        if a.check {
            let small = gen(a.seed, a.scale / 20.0);
            let slots = (working_set(&small) / 10).max(16);
            for p in POLICIES {
                let sim = simulate(&small, p, slots);
                match replay_pool(&small, p, slots) {
                    Ok(c) if c == sim => println!(
                        "  check {name} {p} at {slots} slots: the pool agrees ({} prefix hits, {} evictions)",
                        c.prefix, c.evictions
                    ),
                    Ok(c) => {
                        eprintln!("check {name} {p}: the pool gave {c:?}, the replay {sim:?}");
                        return ExitCode::FAILURE;
                    }
                    Err(e) => {
                        eprintln!("check {name} {p}: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            }
        }
        println!("  ({name}: {} requests, working set {ws} blocks)", reqs.len());
    }
    ExitCode::SUCCESS
}
