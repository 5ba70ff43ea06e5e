//! [`Store`]: format, open, the commit protocol (FORMAT.md §7), info and fsck.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use vfpoll_pci::vfio::Backend;

use crate::alloc::Allocator;
use crate::device::{open_all, Device, NamespaceSpec, OpenSpecOptions};
use crate::error::{Result, StoreError};
use crate::format::{
    encode_blob, BlobKind, BlobLoc, Catalog, Corrupt, Manifest, Root, Superblock, CHUNK_RANGE, DATA_START,
    MAX_MEMBERS, PAGE, ROOT_OFFSETS,
};
use crate::io::{extra_buffers, Channel, Channels, Geometry, Io, Job, MAX_CHANNELS};
use crate::kv_index::{EvictionPolicy, PoolShared};
use crate::lock::{StoreLock, DEFAULT_LOCK_DIR};

mod load;
use load::{load_catalog, read_root, read_superblock};
pub(crate) use load::{read_blob, read_roots};

/// Options for opening a store (and for the store a format leaves open).
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Directory of the lock file (default `/run/vfpoll`).
    pub lock_dir: Option<PathBuf>,
    /// Open files without `O_DIRECT` where the file system refuses it (tmpfs): slower, still
    /// durable. Off by default: the error says so instead.
    pub allow_buffered_io: bool,
    /// I/O buffers of one chunk per namespace on the first I/O channel (in flight at once per
    /// namespace on it); each further channel has half as many, at least 2 (see
    /// [`StoreOptions::io_channels`]).
    pub io_buffers: usize,
    /// io_uring entries and NVMe queue entries per namespace.
    pub queue_depth: u32,
    /// Give up on a batch when nothing completes for this long.
    pub io_timeout: Duration,
    /// The IOMMU backend for `vfio:` namespaces: [`Backend::Auto`] (iommufd where the kernel
    /// offers it, the type1 container otherwise) unless told; VFIO's unsafe no-IOMMU mode only
    /// when asked for ([`Backend::NoIommu`]).
    pub iommu: Backend,
    /// Threads that copy between the caller's memory and the I/O buffers, and compute or check
    /// crc32c, beside the calling thread during a large batch that computes crc32c (a
    /// checkpoint's window, a verified load, a KV get batch), so that copies and checksums of
    /// some chunks overlap the I/O of others. 0: the
    /// calling thread does it all (still overlapped with the devices' work). Default: the
    /// CPUs there are, less one, at most 3 (at least 1).
    pub copy_threads: usize,
    /// How long a small batch (under 1 MiB: a KV get, a header write) or a single request (a
    /// flush, a root write) polls its devices for a completion before it sleeps in the kernel
    /// (io_uring; a VFIO queue pair is always polled). Polling keeps a QD1 read's latency
    /// at the device's; sleeping adds the wake-up (several µs). Large batches sleep at once
    /// while every device is busy. Default 200 µs; `Duration::ZERO` never polls.
    pub poll_spin: Duration,
    /// I/O channels (1 to 64; SPDK's model): each is an I/O engine of its own, with its own
    /// device per namespace (an io_uring on the same file, an NVMe queue pair on the same
    /// controller) and its own buffers. A call takes an idle channel for each submission
    /// burst and gives it back at once, so the bursts of several threads (a KV server's
    /// workers, a checkpoint save beside KV gets) are on the devices at the same time;
    /// threads beyond the channel count wait for one. 1: one burst at a time. A backend that
    /// cannot open another channel ([`Device::open_channel`]) runs with one (logged);
    /// [`StoreInfo::io_channels`] says how many are open. Buffer memory per namespace:
    /// `chunk_size × (io_buffers + (io_channels − 1) × max(io_buffers / 2, 2))`: 80 MiB with 4
    /// channels, 32 buffers and 1 MiB chunks (32 MiB with one channel). Default: the CPUs there
    /// are, at most 4.
    pub io_channels: usize,
    /// How the KV pools opened by this store evict blocks when full (held in memory only: a
    /// pool reopened under another policy starts its order cold, as after any restart).
    /// Default [`EvictionPolicy::Lru`].
    pub kv_eviction: EvictionPolicy,
}

/// The default of [`StoreOptions::copy_threads`].
fn default_copy_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .saturating_sub(1)
        .clamp(1, 3)
}

/// The default of [`StoreOptions::io_channels`].
fn default_io_channels() -> usize {
    std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(1, 4)
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            lock_dir: None,
            allow_buffered_io: false,
            io_buffers: 32,
            queue_depth: 128,
            io_timeout: Duration::from_secs(30),
            iommu: Backend::Auto,
            copy_threads: default_copy_threads(),
            poll_spin: Duration::from_micros(200),
            io_channels: default_io_channels(),
            kv_eviction: EvictionPolicy::default(),
        }
    }
}

/// Options for [`Store::format`].
#[derive(Debug, Clone)]
pub struct FormatOptions {
    /// Stripe chunk in bytes: a power of two in 64 KiB..=64 MiB (default 1 MiB). Each extent
    /// holds at most one chunk and has its own crc32c.
    pub chunk_size: u32,
    /// A label (at most 64 bytes).
    pub label: String,
    /// Size of `file:` namespaces that do not exist yet (or are smaller), unless their spec
    /// gives `?size=`.
    pub file_size: Option<u64>,
    /// Overwrite namespaces that already hold a vfpoll store (refused while it is open).
    pub force: bool,
    /// How the new store is opened.
    pub store: StoreOptions,
}

impl Default for FormatOptions {
    fn default() -> Self {
        FormatOptions {
            chunk_size: 1 << 20,
            label: String::new(),
            file_size: None,
            force: false,
            store: StoreOptions::default(),
        }
    }
}

/// One namespace of an open store.
#[derive(Debug, Clone)]
pub struct MemberInfo {
    /// Its index in the stripe.
    pub index: u32,
    /// The device.
    pub device: String,
    /// Bytes.
    pub capacity: u64,
    /// Block size.
    pub block_size: u32,
    /// Whether it has a volatile write cache (commits flush it).
    pub volatile_write_cache: bool,
}

/// What [`Store::info`] reports.
#[derive(Debug, Clone)]
pub struct StoreInfo {
    /// UUID, as 32 hex digits with dashes.
    pub uuid: String,
    /// Label.
    pub label: String,
    /// Format version (major, minor).
    pub format_version: (u16, u16),
    /// The namespaces, in stripe order.
    pub members: Vec<MemberInfo>,
    /// Stripe chunk.
    pub chunk_size: u32,
    /// Bytes of the logical space.
    pub capacity: u64,
    /// Bytes free.
    pub free: u64,
    /// Generation of the committed root.
    pub generation: u64,
    /// Checkpoints.
    pub checkpoints: usize,
    /// Versions over all checkpoints.
    pub versions: usize,
    /// Bytes of data in all versions.
    pub data_bytes: u64,
    /// KV pools.
    pub pools: usize,
    /// The lock file held.
    pub lock_file: String,
    /// I/O channels open ([`StoreOptions::io_channels`], fewer where a backend opens no more).
    pub io_channels: usize,
}

/// One problem [`Store::fsck`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The object ("superblock B of member 1", "checkpoint m v3 entry w").
    pub object: String,
    /// What is wrong.
    pub detail: String,
}

/// What [`Store::fsck`] checked and found.
#[derive(Debug, Clone, Default)]
pub struct FsckReport {
    /// Versions checked.
    pub versions: usize,
    /// Entries checked.
    pub entries: usize,
    /// Extents whose crc32c was checked.
    pub extents: u64,
    /// Bytes of data read and checked.
    pub bytes: u64,
    /// KV slots whose data crc was checked.
    pub kv_slots: u64,
    /// Problems; empty when the store is sound.
    pub findings: Vec<Finding>,
}

impl FsckReport {
    /// Whether nothing was found.
    pub fn is_clean(&self) -> bool {
        self.findings.is_empty()
    }
}

/// What a catalog change asks of [`Store::commit_catalog`].
pub(crate) struct Change<T> {
    /// What the commit returns.
    pub out: T,
    /// Pages to write before the catalog (logical page, whole pages of bytes).
    pub writes: Vec<(u64, Vec<u8>)>,
    /// Pages the change allocated: given back if the commit fails before its root.
    pub taken: Vec<(u64, u64)>,
    /// Pages freed once the new root is durable, with the version that may pin them.
    pub frees: Vec<(u64, u64, Option<u64>)>,
}

/// In-memory state of the committed root, and what hangs off it.
pub(crate) struct Meta {
    pub root: Root,
    pub catalog: Catalog,
    pub manifests: HashMap<u64, Arc<Manifest>>,
    pub alloc: Allocator,
    /// Readers per version id.
    pub pins: HashMap<u64, usize>,
    /// Pages of deleted versions that readers still pin.
    pub zombies: HashMap<u64, Vec<(u64, u64)>>,
    pub poisoned: Option<String>,
    /// KV pools opened in this process, by pool id.
    pub pools: HashMap<u64, Arc<PoolShared>>,
}

pub(crate) struct Inner {
    pub io: Channels,
    pub meta: Mutex<Meta>,
    pub sb: Superblock,
    pub members: Vec<MemberInfo>,
    pub opts: StoreOptions,
    lock: StoreLock,
}

/// An open store: checkpoints and KV pools on one or more namespaces.
///
/// Cheap to clone (a shared handle); `Send + Sync`. See the crate docs for the threading model.
#[derive(Clone)]
pub struct Store {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("uuid", &uuid_str(&self.inner.sb.uuid))
            .finish()
    }
}

pub(crate) fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

pub(crate) fn uuid_str(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn random_uuid() -> [u8; 16] {
    use std::io::Read;
    let mut u = [0u8; 16];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut u))
        .is_err()
    {
        let t = now_ns() ^ ((std::process::id() as u64) << 32);
        u[..8].copy_from_slice(&t.to_le_bytes());
        u[8..].copy_from_slice(
            &t.rotate_left(17)
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                .to_le_bytes(),
        );
    }
    u[6] = (u[6] & 0x0f) | 0x40;
    u[8] = (u[8] & 0x3f) | 0x80;
    u
}

fn parse_specs<S: AsRef<str>>(specs: &[S]) -> Result<Vec<NamespaceSpec>> {
    if specs.is_empty() {
        return Err(StoreError::Invalid("name at least one namespace".into()));
    }
    specs
        .iter()
        .map(|s| s.as_ref().parse::<NamespaceSpec>().map_err(StoreError::Invalid))
        .collect()
}

/// Refuses store options out of range before any I/O.
fn check_options(opts: &StoreOptions) -> Result<()> {
    if opts.io_channels == 0 || opts.io_channels > MAX_CHANNELS {
        return Err(StoreError::Invalid(format!(
            "{} I/O channels: use 1 to {MAX_CHANNELS} (1: one burst at a time)",
            opts.io_channels
        )));
    }
    Ok(())
}

impl Store {
    /// Formats the namespaces named by `specs` (see [`NamespaceSpec`]) as one new store, striped
    /// over them in their order, and opens it.
    ///
    /// ```
    /// # fn main() -> Result<(), vfpoll_store::StoreError> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let spec = format!("file:{}/store.img?size=64M", dir.path().display());
    /// let mut opts = vfpoll_store::FormatOptions::default();
    /// opts.store.lock_dir = Some(dir.path().into());
    /// opts.store.allow_buffered_io = true; // the tempdir may be on tmpfs
    /// let store = vfpoll_store::Store::format(&[spec], &opts)?;
    /// assert_eq!(store.info().members.len(), 1);
    /// # Ok(()) }
    /// ```
    pub fn format<S: AsRef<str>>(specs: &[S], opts: &FormatOptions) -> Result<Store> {
        let specs = parse_specs(specs)?;
        let o = OpenSpecOptions {
            create_size: opts.file_size,
            create: true,
            allow_buffered: opts.store.allow_buffered_io,
            queue_depth: opts.store.queue_depth,
            iommu: opts.store.iommu,
        };
        let devs = open_all(&specs, &o).map_err(|e| StoreError::Device {
            device: "namespace".into(),
            source: e,
        })?;
        Self::format_devices(devs, opts)
    }

    /// [`Store::format`] on devices made by the caller (tests, custom backends).
    pub fn format_devices(mut devs: Vec<Box<dyn Device>>, opts: &FormatOptions) -> Result<Store> {
        let cs = opts.chunk_size;
        if !cs.is_power_of_two() || cs < CHUNK_RANGE.0 || cs > CHUNK_RANGE.1 {
            return Err(StoreError::Invalid(format!(
                "chunk size {cs}: must be a power of two from 64 KiB to 64 MiB"
            )));
        }
        if devs.is_empty() || devs.len() > MAX_MEMBERS as usize {
            return Err(StoreError::Invalid(format!(
                "{} namespaces: a store has 1 to {MAX_MEMBERS}",
                devs.len()
            )));
        }
        if opts.label.len() > 64 {
            return Err(StoreError::Invalid("the label is longer than 64 bytes".into()));
        }
        check_options(&opts.store)?;
        let timeout = opts.store.io_timeout;
        let mut chunks = u64::MAX;
        for d in devs.iter_mut() {
            let bs = d.block_size();
            if bs == 0 || !(PAGE as u32).is_multiple_of(bs) {
                return Err(StoreError::Invalid(format!(
                    "{}: {bs}-byte blocks; the store needs blocks that divide 4096",
                    d.describe()
                )));
            }
            let usable = d.capacity().saturating_sub(DATA_START) / cs as u64;
            if usable == 0 {
                return Err(StoreError::Invalid(format!(
                    "{}: {} bytes is too small: a namespace needs at least {} bytes (1 MiB of headers and one chunk)",
                    d.describe(),
                    d.capacity(),
                    DATA_START + cs as u64
                )));
            }
            chunks = chunks.min(usable);
            match read_superblock(d.as_mut(), timeout) {
                Ok((old, _)) if !opts.force => {
                    return Err(StoreError::Exists(format!(
                        "{} already holds a vfpoll store ({}); pass force to overwrite it",
                        d.describe(),
                        uuid_str(&old.uuid)
                    )));
                }
                Err(StoreError::Corrupt(_)) if !opts.force => {
                    return Err(StoreError::Exists(format!(
                        "{} holds a damaged vfpoll store superblock; pass force to overwrite it",
                        d.describe()
                    )));
                }
                Ok((old, _)) => {
                    // Refused while another process has it open.
                    let dir = opts
                        .store
                        .lock_dir
                        .clone()
                        .unwrap_or_else(|| DEFAULT_LOCK_DIR.into());
                    drop(StoreLock::take(&dir, &uuid_str(&old.uuid))?);
                }
                Err(StoreError::NotAStore(_)) | Err(StoreError::Corrupt(_)) => {}
                Err(e) => return Err(e),
            }
        }
        let members = devs.len() as u32;
        let uuid = random_uuid();
        let created = now_ns() / 1_000_000_000;
        let geo = Geometry {
            members,
            chunk_pages: cs as u64 / PAGE as u64,
            chunks_per_member: chunks,
        };
        let sbs: Vec<Superblock> = devs
            .iter()
            .enumerate()
            .map(|(i, d)| Superblock {
                uuid,
                member: i as u32,
                members,
                chunk_size: cs,
                chunks_per_member: chunks,
                block_size: d.block_size(),
                capacity: d.capacity(),
                created,
                label: opts.label.clone(),
            })
            .collect();
        let mut io = Io::new(devs, geo, 4, timeout)?;
        // An empty catalog at page 0, the other root slot zeroed; flush; superblocks; flush;
        // root generation 1 with FUA.
        let (cat, len, crc) =
            encode_blob(BlobKind::Catalog, 1, &Catalog::default().encode()).map_err(StoreError::Internal)?;
        io.run(&mut [Job::Write { page: 0, data: &cat }])?;
        io.write_member(0, ROOT_OFFSETS[0], &[0u8; PAGE], false)?;
        io.flush_all()?;
        for (m, sb) in sbs.iter().enumerate() {
            let b = sb.encode();
            let mut two = b.clone();
            two.extend_from_slice(&b);
            io.write_member(m, 0, &two, false)?;
        }
        io.flush_all()?;
        let root = Root {
            uuid,
            generation: 1,
            catalog: BlobLoc { page: 0, len, crc },
            committed: now_ns(),
            next_id: 1,
        };
        io.write_member(0, ROOT_OFFSETS[1], &root.encode(), true)?;
        log::info!("formatted store {} over {members} namespaces", uuid_str(&uuid));
        let devs = io.members.into_iter().map(|m| m.dev).collect();
        Self::open_devices(devs, &opts.store)
    }

    /// Opens the store on the namespaces named by `specs`, in any order (each namespace knows
    /// its place in the stripe). Exclusive: a second open, in this process or another, gets
    /// [`StoreError::InUse`] with the holder's PID.
    pub fn open<S: AsRef<str>>(specs: &[S], opts: &StoreOptions) -> Result<Store> {
        let specs = parse_specs(specs)?;
        let o = OpenSpecOptions {
            create_size: None,
            create: false,
            allow_buffered: opts.allow_buffered_io,
            queue_depth: opts.queue_depth,
            iommu: opts.iommu,
        };
        let devs = open_all(&specs, &o).map_err(|e| StoreError::Device {
            device: "namespace".into(),
            source: e,
        })?;
        Self::open_devices(devs, opts)
    }

    /// [`Store::open`] on devices made by the caller (tests, custom backends).
    pub fn open_devices(mut devs: Vec<Box<dyn Device>>, opts: &StoreOptions) -> Result<Store> {
        if devs.is_empty() {
            return Err(StoreError::Invalid("name at least one namespace".into()));
        }
        check_options(opts)?;
        let mut sbs = Vec::with_capacity(devs.len());
        for d in devs.iter_mut() {
            let (sb, _) = read_superblock(d.as_mut(), opts.io_timeout)?;
            let need = DATA_START + sb.chunks_per_member * sb.chunk_size as u64;
            if d.capacity() < need || !(PAGE as u32).is_multiple_of(d.block_size()) {
                return Err(StoreError::Corrupt(Corrupt {
                    object: format!("superblock of {}", d.describe()),
                    detail: format!(
                        "the namespace has {} bytes of {}-byte blocks; the store needs {need} bytes of blocks that divide 4096",
                        d.capacity(),
                        d.block_size()
                    ),
                }));
            }
            sbs.push(sb);
        }
        let first = sbs[0].clone();
        if first.members as usize != devs.len() {
            return Err(StoreError::Invalid(format!(
                "store {} has {} namespaces; {} were named: name all of them",
                uuid_str(&first.uuid),
                first.members,
                devs.len()
            )));
        }
        let mut order: Vec<Option<Box<dyn Device>>> = (0..devs.len()).map(|_| None).collect();
        for (d, sb) in devs.into_iter().zip(&sbs) {
            if sb.uuid != first.uuid
                || sb.chunk_size != first.chunk_size
                || sb.chunks_per_member != first.chunks_per_member
            {
                return Err(StoreError::Invalid(format!(
                    "{} belongs to store {}, not {}: the namespaces named are not one store",
                    d.describe(),
                    uuid_str(&sb.uuid),
                    uuid_str(&first.uuid)
                )));
            }
            let slot = &mut order[sb.member as usize];
            if slot.is_some() {
                return Err(StoreError::Invalid(format!(
                    "two namespaces claim member {} of store {}",
                    sb.member,
                    uuid_str(&first.uuid)
                )));
            }
            *slot = Some(d);
        }
        let devs: Vec<Box<dyn Device>> = order.into_iter().map(|d| d.expect("every member once")).collect();
        let uuid = uuid_str(&first.uuid);
        let dir = opts.lock_dir.clone().unwrap_or_else(|| DEFAULT_LOCK_DIR.into());
        let lock = StoreLock::take(&dir, &uuid)?;
        let members: Vec<MemberInfo> = devs
            .iter()
            .enumerate()
            .map(|(i, d)| MemberInfo {
                index: i as u32,
                device: d.describe(),
                capacity: d.capacity(),
                block_size: d.block_size(),
                volatile_write_cache: d.volatile_write_cache(),
            })
            .collect();
        let geo = Geometry {
            members: first.members,
            chunk_pages: first.chunk_pages(),
            chunks_per_member: first.chunks_per_member,
        };
        let mut io = Io::new(devs, geo, opts.io_buffers, opts.io_timeout)?;
        io.copy_threads = opts.copy_threads;
        io.poll_spin = opts.poll_spin;
        let root = read_root(&mut io, &first.uuid)?;
        let (catalog, manifests, alloc) = load_catalog(&mut io, &root, &geo)?;
        let io = Channels::open(io, opts.io_channels, extra_buffers(opts.io_buffers));
        let meta = Meta {
            root,
            catalog,
            manifests,
            alloc,
            pins: HashMap::new(),
            zombies: HashMap::new(),
            poisoned: None,
            pools: HashMap::new(),
        };
        Ok(Store {
            inner: Arc::new(Inner {
                io,
                meta: Mutex::new(meta),
                sb: first,
                members,
                opts: opts.clone(),
                lock,
            }),
        })
    }

    pub(crate) fn meta(&self) -> MutexGuard<'_, Meta> {
        self.inner.meta.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An idle I/O channel for one burst (waits while all are busy); given back when dropped.
    /// Never hold one across a wait for another thread that may need one.
    pub(crate) fn io(&self) -> Channel<'_> {
        self.inner.io.take()
    }

    pub(crate) fn chunk_pages(&self) -> u64 {
        self.inner.sb.chunk_pages()
    }

    /// The options it was opened with.
    pub fn options(&self) -> &StoreOptions {
        &self.inner.opts
    }

    /// What the store is and holds.
    pub fn info(&self) -> StoreInfo {
        let m = self.meta();
        StoreInfo {
            uuid: uuid_str(&self.inner.sb.uuid),
            label: self.inner.sb.label.clone(),
            format_version: crate::format::VERSION,
            members: self.inner.members.clone(),
            chunk_size: self.inner.sb.chunk_size,
            capacity: m.alloc.total() * PAGE as u64,
            free: m.alloc.free_pages() * PAGE as u64,
            generation: m.root.generation,
            checkpoints: m.catalog.checkpoints.len(),
            versions: m.catalog.checkpoints.iter().map(|c| c.versions.len()).sum(),
            data_bytes: m
                .catalog
                .checkpoints
                .iter()
                .flat_map(|c| c.versions.iter())
                .map(|v| v.bytes)
                .sum(),
            pools: m.catalog.pools.len(),
            lock_file: self.inner.lock.path().display().to_string(),
            io_channels: self.inner.io.count(),
        }
    }

    /// Commits a catalog change (FORMAT.md §7). `change` edits a copy of the catalog and
    /// returns what it needs written first (blobs: page and bytes) and the pages it frees once
    /// the new root is durable; on any error before the root is written nothing changes.
    pub(crate) fn commit_catalog<T>(
        &self,
        change: impl FnOnce(&mut Meta, &mut Catalog) -> Result<Change<T>>,
    ) -> Result<T> {
        let mut meta = self.meta();
        if let Some(p) = &meta.poisoned {
            return Err(StoreError::Poisoned(p.clone()));
        }
        let mut cat = meta.catalog.clone();
        let Change {
            out,
            writes: blobs,
            taken,
            frees,
        } = change(&mut meta, &mut cat)?;
        let generation = meta.root.generation + 1;
        let (cblob, len, crc) =
            encode_blob(BlobKind::Catalog, generation, &cat.encode()).map_err(StoreError::Invalid)?;
        let pages = cblob.len() as u64 / PAGE as u64;
        let Some(cpage) = meta.alloc.alloc_contiguous(pages) else {
            let free = meta.alloc.free_pages() * PAGE as u64;
            for (p, n) in taken {
                meta.alloc.free(p, n);
            }
            return Err(StoreError::Full {
                needed: cblob.len() as u64,
                free,
            });
        };
        let root = Root {
            uuid: self.inner.sb.uuid,
            generation,
            catalog: BlobLoc {
                page: cpage,
                len,
                crc,
            },
            committed: now_ns(),
            next_id: meta.root.next_id.max(next_id_of(&cat)),
        };
        let mut io = self.io();
        let mut jobs: Vec<Job<'_>> = blobs
            .iter()
            .map(|(p, b)| Job::Write { page: *p, data: b })
            .collect();
        jobs.push(Job::Write {
            page: cpage,
            data: &cblob,
        });
        let written = io.run(&mut jobs).and_then(|()| io.flush_all());
        if let Err(e) = written {
            drop(io);
            meta.alloc.free(cpage, pages);
            for (p, n) in taken {
                meta.alloc.free(p, n);
            }
            return Err(e);
        }
        let slot = (generation % 2) as usize;
        if let Err(e) = io.write_member(0, ROOT_OFFSETS[slot], &root.encode(), true) {
            meta.poisoned = Some(e.to_string());
            return Err(e);
        }
        drop(io);
        // The new root is durable: what only the old one reached may be reused.
        let old = meta.root.catalog;
        meta.alloc.free(old.page, old.pages());
        for (p, n, pinned_by) in frees {
            match pinned_by {
                Some(v) if meta.pins.get(&v).is_some_and(|&c| c > 0) => {
                    meta.zombies.entry(v).or_default().push((p, n));
                }
                Some(v) => {
                    meta.manifests.remove(&v);
                    meta.alloc.free(p, n);
                }
                None => meta.alloc.free(p, n),
            }
        }
        meta.root = root;
        meta.catalog = cat;
        Ok(out)
    }

    /// Measures the namespaces through the store's own I/O engine, as the ceiling a
    /// checkpoint's rate is compared with: writes (or reads) `bytes` of free pages, striped like
    /// a checkpoint, in the same batches, without metadata or checksums; returns the time it
    /// took. The pages are taken for the run and given back (they stay free: nothing committed
    /// is touched). For benchmarks.
    pub fn bench_raw(&self, bytes: u64, write: bool) -> Result<Duration> {
        let pages = bytes.div_ceil(PAGE as u64);
        let runs = {
            let mut m = self.meta();
            let cp = self.chunk_pages();
            m.alloc.alloc_runs(pages, cp).ok_or_else(|| StoreError::Full {
                needed: bytes,
                free: m.alloc.free_pages() * PAGE as u64,
            })?
        };
        let per_batch = self.inner.opts.io_buffers.max(2) * self.inner.members.len();
        let chunk = self.chunk_pages() as usize * PAGE;
        let mut bufs: Vec<Vec<u8>> = (0..per_batch).map(|i| vec![i as u8; chunk]).collect();
        let start = std::time::Instant::now();
        let r = (|| {
            for batch in runs.chunks(per_batch) {
                let mut jobs: Vec<Job<'_>> = batch
                    .iter()
                    .zip(bufs.iter_mut())
                    .map(|(&(page, n), b)| {
                        let len = n as usize * PAGE;
                        if write {
                            Job::Write {
                                page,
                                data: &b[..len],
                            }
                        } else {
                            Job::Read {
                                page,
                                dst: &mut b[..len],
                            }
                        }
                    })
                    .collect();
                self.io().run(&mut jobs)?;
            }
            Ok(())
        })();
        let took = start.elapsed();
        let mut m = self.meta();
        for (p, n) in runs {
            m.alloc.free(p, n);
        }
        r.map(|()| took)
    }
}

fn next_id_of(cat: &Catalog) -> u64 {
    let v = cat
        .checkpoints
        .iter()
        .flat_map(|c| c.versions.iter().map(|v| v.id))
        .max()
        .unwrap_or(0);
    let p = cat.pools.iter().map(|p| p.id).max().unwrap_or(0);
    v.max(p) + 1
}
