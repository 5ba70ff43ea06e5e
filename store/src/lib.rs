//! # vfpoll-store: crash-safe checkpoints and KV-cache blocks on raw namespaces
//!
//! A store lives on one or more namespaces (NVMe namespaces through vfpoll's VFIO driver, Linux
//! files or block devices through io_uring, or test devices), striped over them in fixed chunks.
//! It holds two kinds of objects:
//!
//! - **checkpoints**: named versions of many named tensors or buffers. A version is written
//!   with [`Store::begin`] / [`CheckpointTx::put`] and made visible, all or nothing, by
//!   [`CheckpointTx::commit`] (or [`CheckpointTx::commit_async`], whose [`SaveHandle`] tells
//!   when the caller's memory may be reused and when the version is durable; with
//!   [`CheckpointTx::background`] a put returns once its data is in host staging memory). Readers
//!   ([`Store::open_version`]) see committed versions only and pin them; every extent carries a
//!   crc32c checked on read ([`ReadOptions::verify`]). [`Store::keep_last`] and
//!   [`Store::delete_version`] reclaim space. Tensors in GPU memory go through vfpoll-gpu's
//!   copy engines and staging slots ([`CheckpointTx::put_device`],
//!   [`VersionReader::load_device`]; CUDA behind the `cuda` feature).
//!   A peer device's BAR (a GPU BAR exposed through VFIO, ivshmem) registered in
//!   [`Store::dma_context`] is saved from and loaded into directly by the NVMe controllers,
//!   with no CPU copy ([`CheckpointTx::put_from_peer`], [`VersionReader::read_into_peer`];
//!   `docs/store.md`, Peer BAR).
//! - **KV pools** ([`Store::create_pool`], [`KvPool`]): fixed-size blocks under 128-bit keys,
//!   with batched [`KvPool::put_many`] / [`KvPool::get_many`], LRU or S3-FIFO eviction
//!   ([`StoreOptions::kv_eviction`]) with deallocate, and
//!   an index rebuilt at open from the slot headers alone.
//!
//! The on-disk format is specified in `store/FORMAT.md` (in the repository): two checksummed
//! superblocks per namespace, a root record alternating between two slots, copy-on-write
//! metadata reachable only from the committed root, free space rebuilt at open. A commit
//! writes data, flushes the namespaces that have a volatile write cache, then writes the root
//! with FUA; the newer valid root wins at open. [`Store::fsck`] checks all of it.
//!
//! ## Namespaces
//!
//! A store is named by its namespaces' spec strings ([`device::NamespaceSpec`]): `file:PATH`
//! (`?size=4G` to create it), `blk:/dev/nvme0n1` or `/dev/...`, `vfio:0000:00:03.0/1`,
//! `model:SIZE` (the in-process NVMe model) and `mem:SIZE` (memory). Custom backends implement
//! [`device::Device`] and go through [`Store::format_devices`] / [`Store::open_devices`].
//!
//! ```
//! use vfpoll_store::{FormatOptions, Store, StoreOptions};
//! # fn main() -> Result<(), vfpoll_store::StoreError> {
//! let dir = tempfile::tempdir().unwrap();
//! let specs = [
//!     format!("file:{}/a.img?size=32M", dir.path().display()),
//!     format!("file:{}/b.img?size=32M", dir.path().display()),
//! ];
//! let mut opts = FormatOptions::default();
//! opts.store.lock_dir = Some(dir.path().into());
//! opts.store.allow_buffered_io = true; // the test's tempdir may be on tmpfs
//! let store = Store::format(&specs, &opts)?;
//! let mut tx = store.begin("model")?;
//! tx.put("w", b"", &[7u8; 3_000_000])?; // striped over both files
//! tx.commit()?;
//! drop(store);
//!
//! let store = Store::open(&specs, &opts.store)?;
//! assert_eq!(store.open_version("model", None)?.read_to_vec("w")?, vec![7u8; 3_000_000]);
//! assert!(store.fsck()?.is_clean());
//! # Ok(()) }
//! ```
//!
//! ## Threading model
//!
//! [`Store`] is a cheap handle (`Clone + Send + Sync`) on shared state: the metadata (catalog,
//! free space, pins) behind a lock, and the I/O channels ([`StoreOptions::io_channels`], SPDK's
//! model), each an I/O engine with a device of its own per namespace (an io_uring, an NVMe
//! queue pair) and DMA buffers of its own. A call takes an idle channel for one submission
//! burst, submits everything it has over all namespaces at once, polls to completion on the
//! calling thread, and gives the channel back; so the bursts of several threads (as many as
//! there are channels; more wait for one) are on the devices at the same time, each at full
//! queue depth over every namespace. Each queue pair stays on one thread at a time as the
//! driver requires, and the store needs no I/O thread of its own. Within a large burst, copies
//! between the caller's memory and the DMA buffers and the crc32c of each extent or block run on scoped copy threads
//! ([`StoreOptions::copy_threads`]) that live for that burst, overlapped with the devices'
//! I/O; they never touch a queue pair. The other threads are a transaction's optional background writer
//! ([`CheckpointTx::background`], which stages puts in host memory and writes them in bursts
//! like any caller), the reader that runs one window ahead of [`VersionReader::load_device`],
//! and [`CheckpointTx::commit_async`]'s commit. Commits hold the metadata lock while they write the catalog and the root, so
//! commits are serialised; readers do not wait for a checkpoint's data writes (only for its
//! commit), KV gets for neither. A KV pool's index lock is held only for bookkeeping, never across
//! I/O: a put reserves its slots, writes without the lock and publishes under it (the `kv`
//! module docs say how this keeps a torn or stale block from ever being a hit), so gets of
//! other threads look up, account and read on other channels while it is on the device.
//! What needs an order of its own takes a lock for it, never the engine: a pool's header
//! pages its write-order lock, a commit and fsck the metadata lock; a flush through one
//! channel covers the writes completed on all of them.
//!
//! ## Safety
//!
//! `unsafe` lives in `device::uring` (pushing io_uring entries that point at buffers the
//! device keeps until their completion) and in `device`'s `IoBuffer` impl for [`device::IoBuf`];
//! each block says why it is sound. No Rust reference is made into DMA memory: data moves
//! through copies (volatile ones for a peer BAR), or device to device. Registering a peer BAR
//! is the caller's `unsafe` ([`vfpoll_dma::DmaContext::register_peer_bar`]).

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks, missing_docs)]

mod alloc;
mod background;
mod checkpoint;
pub mod device;
mod error;
pub mod format;
mod fsck;
mod gpu;
mod io;
mod kv;
mod kv_index;
mod lock;
mod store;

pub use checkpoint::{
    CheckpointInfo, CheckpointTx, CommitInfo, EntryInfo, ReadOptions, SaveHandle, VersionInfo, VersionReader,
};
pub use device::{parse_size, NamespaceSpec};
pub use error::{Result, StoreError};
pub use kv::{EvictionPolicy, Evictor, KvPool, KvStats, PoolInfo};
pub use lock::DEFAULT_LOCK_DIR;
pub use store::{Finding, FormatOptions, FsckReport, MemberInfo, Store, StoreInfo, StoreOptions};
/// The IOMMU backends of [`StoreOptions::iommu`] (vfpoll-pci's).
pub use vfpoll_pci::vfio::Backend;

/// The examples of `docs/store.md`, compiled as doctests so that the page cannot go stale.
#[cfg(doctest)]
#[doc = include_str!("../../docs/store.md")]
pub struct StorePageExamples;
