//! `vfpoll store`: checkpoints and KV-cache blocks on raw namespaces (`vfpoll-store`), from the
//! command line: format, info, ls, put, get, rm, fsck, bench.
//!
//! Every subcommand names the store by its namespaces' spec strings (any order; see
//! `docs/store.md`): `vfio:BDF/NSID` through vfpoll's driver (with `--iommu-backend` /
//! `--noiommu` as the other NVMe commands), `file:PATH`, `blk:/dev/...`, `model:SIZE`,
//! `mem:SIZE`. Progress of long work goes to stderr, and only on a terminal; `--json` prints
//! one JSON document on stdout and nothing else there.

mod bench;
mod open;

use std::fs;
use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context as _};
use clap::{Args as ClapArgs, Subcommand};
use serde_json::{json, Value};
use vfpoll_pci::vfio::Backend;
use vfpoll_store::{EvictionPolicy, FormatOptions, ReadOptions, Store, StoreOptions};

use crate::ctx::Ctx;
use crate::units::parse_bytes;
use open::{open_devices, parse_specs, OpenHow};

/// Arguments of `vfpoll store`.
#[derive(Debug, ClapArgs)]
pub struct Args {
    #[command(subcommand)]
    cmd: StoreCmd,
}

#[derive(Debug, Subcommand)]
enum StoreCmd {
    /// Create a store over the namespaces (everything on them is lost).
    ///
    /// Writes two superblocks on each namespace and an empty root; the store is striped over
    /// the namespaces in --chunk-size chunks. Refuses namespaces that hold a store unless
    /// --force. `file:` namespaces are created (or grown) to their `?size=` or --size.
    Format(FormatArgs),
    /// Show the store: UUID, label, namespaces, capacity, free space, generation, objects.
    Info(Common),
    /// List checkpoints (with their versions) and KV pools, or one version's entries.
    Ls(LsArgs),
    /// Write files into a new checkpoint version (committed all or nothing), or KV blocks.
    ///
    /// `--checkpoint NAME FILE...`: each file becomes an entry named after the file (or
    /// `ENTRY=FILE`), then the version is committed: it is durable and visible when this
    /// returns. `--pool NAME KEY=FILE...`: each file (at most the block size) is put under its
    /// 128-bit hex key, then synced; the pool is created first with --block-size and --slots
    /// when it does not exist.
    Put(PutArgs),
    /// Read checkpoint entries (whole or a byte range) or KV blocks back into files.
    ///
    /// `--checkpoint NAME [ENTRY...] -o PATH`: one entry into file PATH (`-`: stdout), several
    /// (or all, when none is named) into directory PATH. Every extent's crc32c is checked
    /// unless --no-verify. `--pool NAME KEY -o PATH`: the block of KEY; exits 1 on a miss.
    Get(GetArgs),
    /// Delete a checkpoint version, a whole checkpoint, all but the newest N versions, KV keys
    /// or a KV pool.
    Rm(RmArgs),
    /// Check every structure and checksum of the store (reads all data); changes nothing.
    /// Exits 1 when it finds a problem.
    Fsck(Common),
    /// Measure checkpoint save/load and KV gets against the raw rate of the same namespaces.
    ///
    /// FORMATS THE NAMESPACES (--yes confirms). In each of --repeat rounds, in alternating
    /// order: the raw phase drives the namespaces' devices without the store (sequential
    /// writes then reads of --size bytes spread over them in --io-size requests, --queue-depth
    /// per namespace; random --kv-block reads at QD1 and QD32); the store phase formats a store,
    /// saves a checkpoint of --entries entries totalling --size (timed to the durable commit),
    /// loads it with crc32c checks on and off, then fills a KV pool and times gets at QD1 (hit
    /// and miss) and in batches of 32. Prints GB/s, CPU seconds per GB (user + system of the
    /// process), latency p50/p99 and the store/raw ratios; medians over the rounds.
    Bench(bench::BenchArgs),
}

/// What every subcommand takes.
#[derive(Debug, Clone, ClapArgs)]
pub struct Common {
    /// The store's namespaces, in any order: vfio:BDF/NSID, file:PATH[?size=N], blk:/dev/X,
    /// /dev/X, model:SIZE, mem:SIZE.
    #[arg(value_name = "SPEC", required = true)]
    pub specs: Vec<String>,
    /// Use VFIO's no-IOMMU mode for vfio: namespaces (the same as --iommu-backend noiommu).
    #[arg(long)]
    pub noiommu: bool,
    #[arg(long, value_name = "BACKEND", default_value = "auto", help = crate::iommu_backend::HELP)]
    pub iommu_backend: Backend,
    /// Queue entries per namespace (io_uring entries, NVMe queue entries).
    #[arg(long, default_value_t = 128)]
    pub queue_depth: u32,
    /// Open files without O_DIRECT where the file system refuses it (tmpfs): slower, still
    /// durable.
    #[arg(long)]
    pub allow_buffered: bool,
    /// Directory of the store's lock file [default: /run/vfpoll].
    #[arg(long, value_name = "DIR")]
    pub lock_dir: Option<PathBuf>,
    /// How a full KV pool evicts blocks: lru or s3fifo (docs/store.md, Eviction). The order
    /// lives in memory and starts cold in each process.
    #[arg(long, value_name = "POLICY", default_value = "lru")]
    pub kv_eviction: EvictionPolicy,
    /// Print one JSON document on stdout.
    #[arg(long)]
    pub json: bool,
}

impl Common {
    fn how(&self) -> OpenHow {
        OpenHow {
            noiommu: self.noiommu,
            backend: self.iommu_backend,
            queue_depth: self.queue_depth,
            allow_buffered: self.allow_buffered,
            create_size: None,
            create: false,
        }
    }

    fn store_options(&self) -> StoreOptions {
        StoreOptions {
            lock_dir: self.lock_dir.clone(),
            allow_buffered_io: self.allow_buffered,
            queue_depth: self.queue_depth,
            kv_eviction: self.kv_eviction,
            ..StoreOptions::default()
        }
    }

    /// Opens the store.
    fn open(&self) -> anyhow::Result<Store> {
        let specs = parse_specs(&self.specs)?;
        let devs = open_devices(&specs, &self.how())?;
        Ok(Store::open_devices(devs, &self.store_options())?)
    }
}

#[derive(Debug, ClapArgs)]
struct FormatArgs {
    #[command(flatten)]
    c: Common,
    /// Stripe chunk: a power of two from 64K to 64M; each extent has its own crc32c.
    #[arg(long, default_value = "1M", value_parser = parse_bytes)]
    chunk_size: u64,
    /// A label (at most 64 bytes).
    #[arg(long, default_value = "")]
    label: String,
    /// Size of file: namespaces that do not exist yet (unless their spec says ?size=).
    #[arg(long, value_parser = parse_bytes)]
    size: Option<u64>,
    /// Overwrite namespaces that hold a vfpoll store.
    #[arg(long)]
    force: bool,
}

#[derive(Debug, ClapArgs)]
struct LsArgs {
    #[command(flatten)]
    c: Common,
    /// List the entries of this checkpoint's newest version (or --version-id).
    #[arg(long, value_name = "NAME")]
    checkpoint: Option<String>,
    /// The version to list.
    #[arg(long = "version-id", value_name = "ID", requires = "checkpoint")]
    version_id: Option<u64>,
}

#[derive(Debug, ClapArgs)]
struct PutArgs {
    #[command(flatten)]
    c: Common,
    /// Write a new version of this checkpoint.
    #[arg(
        long,
        value_name = "NAME",
        required_unless_present = "pool",
        conflicts_with = "pool"
    )]
    checkpoint: Option<String>,
    /// Put KV blocks into this pool.
    #[arg(long, value_name = "NAME")]
    pool: Option<String>,
    /// What to put: FILE or ENTRY=FILE (checkpoint), KEY=FILE (pool; KEY is up to 32 hex
    /// digits). Give them after `--`, so they are not taken for namespaces.
    #[arg(last = true, value_name = "ITEM", required = true)]
    items: Vec<String>,
    /// Delete all but the newest N versions in the same commit.
    #[arg(long, value_name = "N", requires = "checkpoint")]
    keep_last: Option<usize>,
    /// Opaque meta bytes stored with every entry (e.g. a dtype and shape).
    #[arg(long, default_value = "", requires = "checkpoint")]
    meta: String,
    /// Block size of a pool created by this put.
    #[arg(long, value_parser = parse_bytes, requires = "pool")]
    block_size: Option<u64>,
    /// Slots of a pool created by this put.
    #[arg(long, requires = "pool")]
    slots: Option<u64>,
}

#[derive(Debug, ClapArgs)]
struct GetArgs {
    #[command(flatten)]
    c: Common,
    /// Read from this checkpoint.
    #[arg(
        long,
        value_name = "NAME",
        required_unless_present = "pool",
        conflicts_with = "pool"
    )]
    checkpoint: Option<String>,
    /// The version [default: the newest].
    #[arg(long = "version-id", value_name = "ID", requires = "checkpoint")]
    version_id: Option<u64>,
    /// Read from this KV pool.
    #[arg(long, value_name = "NAME")]
    pool: Option<String>,
    /// Entries (checkpoint; none: all) or the one key (pool). Give them after `--`.
    #[arg(last = true, value_name = "NAME")]
    names: Vec<String>,
    /// Where to write: a file (`-`: stdout) for one entry or key, a directory for several.
    #[arg(long, short = 'o', value_name = "PATH")]
    output: PathBuf,
    /// Read from this byte offset of the entry (one entry only).
    #[arg(long, value_parser = parse_bytes, default_value = "0", requires = "checkpoint")]
    offset: u64,
    /// Read this many bytes (one entry only) [default: to the end].
    #[arg(long, value_parser = parse_bytes, requires = "checkpoint")]
    len: Option<u64>,
    /// Skip the crc32c checks (faster; corrupt data is then returned as it is).
    #[arg(long)]
    no_verify: bool,
}

#[derive(Debug, ClapArgs)]
struct RmArgs {
    #[command(flatten)]
    c: Common,
    /// The checkpoint (with --version-id: that version; with --keep-last: its older versions;
    /// else the whole checkpoint).
    #[arg(
        long,
        value_name = "NAME",
        required_unless_present = "pool",
        conflicts_with = "pool"
    )]
    checkpoint: Option<String>,
    /// Delete this version only.
    #[arg(
        long = "version-id",
        value_name = "ID",
        requires = "checkpoint",
        conflicts_with = "keep_last"
    )]
    version_id: Option<u64>,
    /// Delete all but the newest N versions.
    #[arg(long, value_name = "N", requires = "checkpoint")]
    keep_last: Option<usize>,
    /// The KV pool (with keys after `--`: those keys; else the whole pool).
    #[arg(long, value_name = "NAME")]
    pool: Option<String>,
    /// Keys to remove from --pool (hex).
    #[arg(last = true, value_name = "KEY")]
    keys: Vec<String>,
}

/// `vfpoll store`.
pub fn run(_ctx: &Ctx, a: Args) -> anyhow::Result<ExitCode> {
    match a.cmd {
        StoreCmd::Format(a) => format(a),
        StoreCmd::Info(c) => info(c),
        StoreCmd::Ls(a) => ls(a),
        StoreCmd::Put(a) => put(a),
        StoreCmd::Get(a) => get(a),
        StoreCmd::Rm(a) => rm(a),
        StoreCmd::Fsck(c) => fsck(c),
        StoreCmd::Bench(a) => bench::run(a),
    }
}

/// A progress line on stderr, rewritten in place; only when stderr is a terminal.
pub(crate) struct Progress {
    on: bool,
    t0: Instant,
}

impl Progress {
    pub(crate) fn new() -> Self {
        Progress {
            on: std::io::stderr().is_terminal(),
            t0: Instant::now(),
        }
    }

    pub(crate) fn show(&self, what: &str, done: u64, total: u64) {
        if !self.on {
            return;
        }
        let secs = self.t0.elapsed().as_secs_f64().max(1e-9);
        let pct = if total == 0 {
            100.0
        } else {
            done as f64 * 100.0 / total as f64
        };
        let _ = write!(
            std::io::stderr(),
            "\r{what}: {} / {} ({pct:.0} %, {:.1} MB/s)   ",
            human(done),
            human(total),
            done as f64 / secs / 1e6
        );
    }

    pub(crate) fn note(&self, what: &str) {
        if self.on {
            let _ = write!(std::io::stderr(), "\r{what}   ");
        }
    }

    pub(crate) fn done(&self) {
        if self.on {
            let _ = writeln!(std::io::stderr());
        }
    }
}

/// Bytes with a binary unit, for people.
pub(crate) fn human(n: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < U.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}

fn print_json(v: &Value) -> anyhow::Result<ExitCode> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(ExitCode::SUCCESS)
}

/// A 128-bit KV key: up to 32 hex digits, with or without `0x`.
fn parse_key(s: &str) -> anyhow::Result<u128> {
    let h = s.strip_prefix("0x").unwrap_or(s);
    if h.is_empty() || h.len() > 32 {
        bail!("key {s:?}: a key is 1 to 32 hex digits (128 bits)");
    }
    u128::from_str_radix(h, 16)
        .map_err(|_| anyhow::anyhow!("key {s:?}: a key is 1 to 32 hex digits (128 bits)"))
}

fn format(a: FormatArgs) -> anyhow::Result<ExitCode> {
    let specs = parse_specs(&a.c.specs)?;
    let chunk_size = u32::try_from(a.chunk_size)
        .ok()
        .with_context(|| format!("--chunk-size {}: at most 64M", a.chunk_size))?;
    let mut how = a.c.how();
    how.create = true;
    how.create_size = a.size;
    let devs = open_devices(&specs, &how)?;
    let opts = FormatOptions {
        chunk_size,
        label: a.label.clone(),
        file_size: a.size,
        force: a.force,
        store: a.c.store_options(),
    };
    let store = Store::format_devices(devs, &opts)?;
    let i = store.info();
    if a.c.json {
        return print_json(&info_json(&store));
    }
    println!(
        "formatted store {} ({}) over {} namespace(s): {} in {} chunks",
        i.uuid,
        if i.label.is_empty() { "no label" } else { &i.label },
        i.members.len(),
        human(i.capacity),
        human(i.chunk_size as u64)
    );
    Ok(ExitCode::SUCCESS)
}

fn info_json(store: &Store) -> Value {
    let i = store.info();
    json!({
        "uuid": i.uuid,
        "label": i.label,
        "format_version": format!("{}.{}", i.format_version.0, i.format_version.1),
        "members": i.members.iter().map(|m| json!({
            "index": m.index,
            "device": m.device,
            "capacity": m.capacity,
            "block_size": m.block_size,
            "volatile_write_cache": m.volatile_write_cache,
        })).collect::<Vec<_>>(),
        "chunk_size": i.chunk_size,
        "capacity": i.capacity,
        "free": i.free,
        "generation": i.generation,
        "checkpoints": i.checkpoints,
        "versions": i.versions,
        "data_bytes": i.data_bytes,
        "pools": i.pools,
        "lock_file": i.lock_file,
    })
}

fn info(c: Common) -> anyhow::Result<ExitCode> {
    let store = c.open()?;
    if c.json {
        return print_json(&info_json(&store));
    }
    let i = store.info();
    println!("store       {}", i.uuid);
    println!("label       {}", i.label);
    println!("format      {}.{}", i.format_version.0, i.format_version.1);
    println!("generation  {}", i.generation);
    println!(
        "capacity    {} ({} free), chunks of {}",
        human(i.capacity),
        human(i.free),
        human(i.chunk_size as u64)
    );
    println!(
        "objects     {} checkpoint(s), {} version(s), {} of data; {} KV pool(s)",
        i.checkpoints,
        i.versions,
        human(i.data_bytes),
        i.pools
    );
    for m in &i.members {
        println!(
            "member {:<3} {} ({}, {}-byte blocks{})",
            m.index,
            m.device,
            human(m.capacity),
            m.block_size,
            if m.volatile_write_cache {
                ", volatile write cache"
            } else {
                ""
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn ls(a: LsArgs) -> anyhow::Result<ExitCode> {
    let store = a.c.open()?;
    if let Some(name) = &a.checkpoint {
        let r = store.open_version(name, a.version_id)?;
        let entries = r.entries();
        if a.c.json {
            return print_json(&json!({
                "checkpoint": name,
                "version": r.version(),
                "committed_ns": r.info().committed,
                "entries": entries.iter().map(|e| json!({
                    "name": e.name,
                    "len": e.len,
                    "meta": String::from_utf8_lossy(&e.meta),
                })).collect::<Vec<_>>(),
            }));
        }
        println!(
            "checkpoint {name} version {} ({} entries)",
            r.version(),
            entries.len()
        );
        for e in &entries {
            println!("{:>14}  {}  {}", e.len, e.name, String::from_utf8_lossy(&e.meta));
        }
        return Ok(ExitCode::SUCCESS);
    }
    let cps = store.checkpoints();
    let pools = store.pools();
    if a.c.json {
        return print_json(&json!({
            "checkpoints": cps.iter().map(|c| json!({
                "name": c.name,
                "versions": c.versions.iter().map(|v| json!({
                    "id": v.id, "committed_ns": v.committed, "bytes": v.bytes, "entries": v.entries,
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "pools": pools.iter().map(|p| json!({
                "name": p.name, "id": p.id, "block_size": p.block_size, "slots": p.slots, "used": p.used,
            })).collect::<Vec<_>>(),
        }));
    }
    for c in &cps {
        for v in &c.versions {
            println!(
                "checkpoint {}  version {}  {} entries  {}",
                c.name,
                v.id,
                v.entries,
                human(v.bytes)
            );
        }
    }
    for p in &pools {
        println!(
            "pool {}  {} slots of {}",
            p.name,
            p.slots,
            human(p.block_size as u64)
        );
    }
    if cps.is_empty() && pools.is_empty() {
        println!("(empty store)");
    }
    Ok(ExitCode::SUCCESS)
}

/// `NAME=PATH` or `PATH` (named after the file).
fn split_item(item: &str) -> anyhow::Result<(String, PathBuf)> {
    if let Some((n, p)) = item.split_once('=') {
        if n.is_empty() || p.is_empty() {
            bail!("{item:?}: give NAME=FILE or FILE");
        }
        return Ok((n.to_string(), p.into()));
    }
    let p = PathBuf::from(item);
    let n = p
        .file_name()
        .with_context(|| format!("{item:?} names no file"))?
        .to_string_lossy()
        .into_owned();
    Ok((n, p))
}

fn read_input(p: &Path) -> anyhow::Result<Vec<u8>> {
    let mut v = Vec::new();
    if p == Path::new("-") {
        std::io::stdin().read_to_end(&mut v).context("reading stdin")?;
    } else {
        v = fs::read(p).with_context(|| format!("reading {}", p.display()))?;
    }
    Ok(v)
}

fn put(a: PutArgs) -> anyhow::Result<ExitCode> {
    let items: Vec<(String, PathBuf)> = a
        .items
        .iter()
        .map(|i| split_item(i))
        .collect::<anyhow::Result<_>>()?;
    let store = a.c.open()?;
    let progress = Progress::new();
    if let Some(pool_name) = &a.pool {
        let pool = match store.pool(pool_name) {
            Ok(p) => p,
            Err(vfpoll_store::StoreError::NotFound(_)) => match (a.block_size, a.slots) {
                (Some(bs), Some(slots)) => {
                    let bs = u32::try_from(bs).context("--block-size: at most 64M")?;
                    store.create_pool(pool_name, bs, slots)?
                }
                _ => bail!("pool {pool_name:?} does not exist: give --block-size and --slots to create it"),
            },
            Err(e) => return Err(e.into()),
        };
        let mut keys = Vec::with_capacity(items.len());
        let mut bufs = Vec::with_capacity(items.len());
        for (k, p) in &items {
            keys.push(parse_key(k)?);
            let b = read_input(p)?;
            if b.is_empty() || b.len() > pool.block_size() as usize {
                bail!(
                    "{}: {} bytes; a block of pool {pool_name:?} holds 1 to {} bytes",
                    p.display(),
                    b.len(),
                    pool.block_size()
                );
            }
            bufs.push(b);
        }
        let refs: Vec<&[u8]> = bufs.iter().map(|b| b.as_slice()).collect();
        pool.put_many(&keys, &refs)?;
        pool.sync()?;
        let s = pool.stats();
        if a.c.json {
            return print_json(&json!({
                "pool": pool_name, "put": keys.len(), "used": pool.len(), "evictions": s.evictions,
            }));
        }
        println!(
            "put {} block(s) into pool {pool_name} ({} of {} slots used, {} evicted)",
            keys.len(),
            pool.len(),
            pool.info().slots,
            s.evictions
        );
        return Ok(ExitCode::SUCCESS);
    }
    let name = a.checkpoint.as_deref().expect("clap: --checkpoint or --pool");
    let total: u64 = items
        .iter()
        .map(|(_, p)| fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .sum();
    let mut tx = store.begin(name)?;
    if let Some(n) = a.keep_last {
        tx.keep_last(n);
    }
    let t0 = Instant::now();
    let mut done = 0u64;
    for (entry, p) in &items {
        progress.show(&format!("put {entry}"), done, total);
        let data = read_input(p)?;
        tx.put(entry, a.meta.as_bytes(), &data)
            .with_context(|| format!("putting {} as entry {entry:?}", p.display()))?;
        done += data.len() as u64;
    }
    progress.show("commit", done, total);
    let c = tx.commit()?;
    progress.done();
    let secs = t0.elapsed().as_secs_f64();
    if a.c.json {
        return print_json(&json!({
            "checkpoint": c.checkpoint,
            "version": c.version,
            "entries": c.entries,
            "bytes": c.bytes,
            "generation": c.generation,
            "deleted": c.deleted,
            "seconds": secs,
        }));
    }
    println!(
        "committed checkpoint {} version {}: {} entries, {} in {secs:.2} s ({:.1} MB/s){}",
        c.checkpoint,
        c.version,
        c.entries,
        human(c.bytes),
        c.bytes as f64 / secs.max(1e-9) / 1e6,
        if c.deleted.is_empty() {
            String::new()
        } else {
            format!("; deleted versions {:?}", c.deleted)
        }
    );
    Ok(ExitCode::SUCCESS)
}

/// Reads pieces of this many bytes at most (a whole entry is never held in memory at once).
const GET_PIECE: u64 = 64 << 20;

fn get(a: GetArgs) -> anyhow::Result<ExitCode> {
    let store = a.c.open()?;
    let progress = Progress::new();
    if let Some(pool_name) = &a.pool {
        let [key] = a.names.as_slice() else {
            bail!("name one key after `--` to get from pool {pool_name:?}");
        };
        let key = parse_key(key)?;
        let pool = store.pool(pool_name)?;
        let mut buf = vec![0u8; pool.block_size() as usize];
        let got = pool.get_many(&[key], &mut [&mut buf])?;
        let Some(len) = got[0] else {
            if a.c.json {
                print_json(&json!({"pool": pool_name, "key": format!("{key:032x}"), "hit": false}))?;
            } else {
                eprintln!("vfpoll: key {key:032x} is not in pool {pool_name}");
            }
            return Ok(ExitCode::FAILURE);
        };
        write_output(&a.output, &buf[..len])?;
        if a.c.json {
            return print_json(
                &json!({"pool": pool_name, "key": format!("{key:032x}"), "hit": true, "len": len}),
            );
        }
        if a.output != Path::new("-") {
            println!("key {key:032x}: {len} bytes into {}", a.output.display());
        }
        return Ok(ExitCode::SUCCESS);
    }
    let name = a.checkpoint.as_deref().expect("clap: --checkpoint or --pool");
    let r = store.open_version(name, a.version_id)?;
    let entries = if a.names.is_empty() {
        r.entries()
    } else {
        a.names
            .iter()
            .map(|n| r.entry(n))
            .collect::<Result<Vec<_>, _>>()?
    };
    let ro = ReadOptions { verify: !a.no_verify };
    let single = a.names.len() == 1;
    if !single && (a.offset != 0 || a.len.is_some()) {
        bail!("--offset and --len read a range of one entry: name exactly one");
    }
    if !single {
        fs::create_dir_all(&a.output)
            .with_context(|| format!("creating directory {}", a.output.display()))?;
    }
    let t0 = Instant::now();
    let mut out = Vec::new();
    let mut total = 0u64;
    for e in &entries {
        if !single && (e.name.contains('/') || e.name == ".." || e.name == ".") {
            bail!(
                "entry {:?} cannot be a file name: get it alone with -o FILE",
                e.name
            );
        }
        let (start, len) = if single {
            let len = a.len.unwrap_or(e.len.saturating_sub(a.offset));
            if a.offset.checked_add(len).is_none_or(|end| end > e.len) {
                bail!(
                    "entry {:?} has {} bytes; --offset {} --len {len} reaches past it",
                    e.name,
                    e.len,
                    a.offset
                );
            }
            (a.offset, len)
        } else {
            (0, e.len)
        };
        let path = if single {
            a.output.clone()
        } else {
            a.output.join(&e.name)
        };
        let mut sink: Box<dyn Write> = if path == Path::new("-") {
            Box::new(std::io::stdout().lock())
        } else {
            Box::new(std::io::BufWriter::new(
                fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?,
            ))
        };
        let mut buf = vec![0u8; len.min(GET_PIECE) as usize];
        let mut off = 0u64;
        while off < len {
            let n = (len - off).min(GET_PIECE) as usize;
            r.read_range(&e.name, start + off, &mut buf[..n], &ro)?;
            sink.write_all(&buf[..n])
                .with_context(|| format!("writing {}", path.display()))?;
            off += n as u64;
            progress.show(&format!("get {}", e.name), off, len);
        }
        sink.flush()
            .with_context(|| format!("writing {}", path.display()))?;
        total += len;
        out.push(json!({"name": e.name, "bytes": len, "path": path.display().to_string()}));
    }
    progress.done();
    let secs = t0.elapsed().as_secs_f64();
    if a.c.json {
        return print_json(&json!({
            "checkpoint": name, "version": r.version(), "verified": ro.verify,
            "entries": out, "bytes": total, "seconds": secs,
        }));
    }
    if a.output != Path::new("-") {
        println!(
            "read {} entr{} of checkpoint {name} version {} ({}) in {secs:.2} s{}",
            entries.len(),
            if entries.len() == 1 { "y" } else { "ies" },
            r.version(),
            human(total),
            if ro.verify {
                ", crc32c checked"
            } else {
                ", NOT checked (--no-verify)"
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn write_output(p: &Path, data: &[u8]) -> anyhow::Result<()> {
    if p == Path::new("-") {
        std::io::stdout().lock().write_all(data).context("writing stdout")
    } else {
        fs::write(p, data).with_context(|| format!("writing {}", p.display()))
    }
}

fn rm(a: RmArgs) -> anyhow::Result<ExitCode> {
    let store = a.c.open()?;
    let (what, deleted): (String, Vec<u64>) = if let Some(pool) = &a.pool {
        if a.keys.is_empty() {
            store.delete_pool(pool)?;
            (format!("pool {pool}"), vec![])
        } else {
            let keys: Vec<u128> = a
                .keys
                .iter()
                .map(|k| parse_key(k))
                .collect::<anyhow::Result<_>>()?;
            let p = store.pool(pool)?;
            let n = p.remove_many(&keys)?;
            p.sync()?;
            (format!("{n} of {} key(s) from pool {pool}", keys.len()), vec![])
        }
    } else {
        let name = a.checkpoint.as_deref().expect("clap: --checkpoint or --pool");
        if let Some(v) = a.version_id {
            store.delete_version(name, v)?;
            (format!("checkpoint {name} version {v}"), vec![v])
        } else if let Some(n) = a.keep_last {
            let d = store.keep_last(name, n)?;
            (format!("{} old version(s) of checkpoint {name}", d.len()), d)
        } else {
            let d = store.delete_checkpoint(name)?;
            (format!("checkpoint {name} ({} version(s))", d.len()), d)
        }
    };
    if a.c.json {
        return print_json(&json!({"removed": what, "versions": deleted}));
    }
    println!("removed {what}");
    Ok(ExitCode::SUCCESS)
}

fn fsck(c: Common) -> anyhow::Result<ExitCode> {
    let store = c.open()?;
    let progress = Progress::new();
    progress.note("fsck: reading every structure and extent ...");
    let t0 = Instant::now();
    let r = store.fsck()?;
    progress.done();
    let secs = t0.elapsed().as_secs_f64();
    let code = if r.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    };
    if c.json {
        print_json(&json!({
            "clean": r.is_clean(),
            "versions": r.versions,
            "entries": r.entries,
            "extents": r.extents,
            "bytes": r.bytes,
            "kv_slots": r.kv_slots,
            "findings": r.findings.iter().map(|f| json!({"object": f.object, "detail": f.detail})).collect::<Vec<_>>(),
            "seconds": secs,
        }))?;
        return Ok(code);
    }
    println!(
        "fsck: {} version(s), {} entries, {} extents, {} checked, {} KV slots; {} finding(s) in {secs:.2} s",
        r.versions,
        r.entries,
        r.extents,
        human(r.bytes),
        r.kv_slots,
        r.findings.len()
    );
    for f in &r.findings {
        println!("  {}: {}", f.object, f.detail);
    }
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_items() {
        assert_eq!(parse_key("0x10").unwrap(), 16);
        assert_eq!(parse_key(&"f".repeat(32)).unwrap(), u128::MAX);
        assert!(parse_key("").is_err() && parse_key(&"f".repeat(33)).is_err() && parse_key("xyz").is_err());
        assert_eq!(split_item("w=/a/b").unwrap(), ("w".into(), "/a/b".into()));
        assert_eq!(
            split_item("/a/b.bin").unwrap(),
            ("b.bin".into(), "/a/b.bin".into())
        );
        assert!(split_item("=x").is_err() && split_item("/").is_err());
        assert_eq!(human(512), "512 B");
        assert_eq!(human(3 << 20), "3.0 MiB");
    }
}
