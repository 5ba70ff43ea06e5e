//! The store's C handles (safe Rust over `vfpoll-store`): `vfpoll_store`, `vfpoll_ckpt_tx`,
//! `vfpoll_ckpt_reader`, `vfpoll_kv_pool`, the store's error codes, and opening a store's
//! namespaces with the caller's IOMMU mode. The C entry points are in [`crate::store_ffi`].

#![allow(non_camel_case_types)]

use std::str::FromStr;
use std::sync::{Arc, Mutex};

use ::vfpoll_store::device::{Device, MemDevice, NvmeDevice, UringDevice, UringOptions};
use ::vfpoll_store::{
    CheckpointTx, FormatOptions, KvPool, NamespaceSpec, Store, StoreError, StoreOptions, VersionReader,
};
use libc::{EBADMSG, EBUSY, EEXIST, EINVAL, EIO, ENODEV, ENOENT, ENOSPC, ENOTRECOVERABLE, EPERM, ETIMEDOUT};
use vfpoll_nvme::{Controller, ControllerOptions, QpairOptions};
use vfpoll_pci::vfio::{Backend, Container, IommuMode};
use vfpoll_pci::Bdf;

use crate::error::{Error, Res};

/// An open store.
pub struct vfpoll_store(pub(crate) Store);

/// A checkpoint version being written. `None` once committed or aborted.
pub struct vfpoll_ckpt_tx(pub(crate) Mutex<Option<CheckpointTx>>);

/// A committed version, pinned while the handle lives.
pub struct vfpoll_ckpt_reader(pub(crate) VersionReader);

/// An open KV pool.
pub struct vfpoll_kv_pool(pub(crate) KvPool);

/// The errno of a store error: `EINVAL` bad argument or spec, `EIO` device or I/O failure,
/// `EBADMSG` a corrupt structure or a checksum mismatch, `ENODEV` no store on the namespaces,
/// `EBUSY` the store is open elsewhere, `EPERM` the lock file cannot be made, `ENOSPC` full,
/// `ENOENT` no such object, `EEXIST` the name is taken, `ETIMEDOUT` a device stopped
/// answering, `ENOTRECOVERABLE` the store refuses changes until it is opened again.
pub(crate) fn store_errno(e: &StoreError) -> i32 {
    match e {
        StoreError::Invalid(_) => EINVAL,
        StoreError::Device { .. } => EIO,
        StoreError::Corrupt(_) | StoreError::Checksum { .. } => EBADMSG,
        StoreError::NotAStore(_) => ENODEV,
        StoreError::InUse { .. } => EBUSY,
        StoreError::Lock { .. } => EPERM,
        StoreError::Full { .. } => ENOSPC,
        StoreError::NotFound(_) => ENOENT,
        StoreError::Exists(_) => EEXIST,
        StoreError::Timeout { .. } => ETIMEDOUT,
        StoreError::Poisoned(_) => ENOTRECOVERABLE,
        _ => EIO,
    }
}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        let mut s = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(c) = src {
            let t = c.to_string();
            if !s.contains(&t) {
                s.push_str(": ");
                s.push_str(&t);
            }
            src = c.source();
        }
        Error::new(store_errno(&e), s)
    }
}

/// How the C caller opens or formats a store (from `vfpoll_store_opts`).
#[derive(Debug, Clone)]
pub(crate) struct OpenOpts {
    pub backend: Backend,
    pub format: FormatOptions,
}

/// Opens the namespaces of `specs`. With `Backend::Auto` the store opens them itself;
/// otherwise `vfio:` namespaces go through a container of that mode (model namespaces are
/// refused there: they need no IOMMU mode).
fn devices(specs: &[String], o: &OpenOpts, create: bool) -> Res<Vec<Box<dyn Device>>> {
    let parsed: Vec<NamespaceSpec> = specs
        .iter()
        .map(|s| NamespaceSpec::from_str(s).map_err(Error::inval))
        .collect::<Res<_>>()?;
    let bdfs: Vec<Bdf> = parsed
        .iter()
        .filter_map(|s| match s {
            NamespaceSpec::Vfio { bdf, .. } => Some(*bdf),
            _ => None,
        })
        .collect();
    let mode = match o.backend {
        Backend::Type1 => IommuMode::Type1,
        Backend::NoIommu => IommuMode::NoIommu,
        Backend::Iommufd => IommuMode::Iommufd,
        Backend::Auto => {
            let c = Backend::Auto.choose(&vfpoll_pci::Host::default(), &bdfs);
            c.mode
        }
    };
    let qd = o.format.store.queue_depth;
    let qopts = QpairOptions {
        entries: qd.clamp(8, 1024) as u16,
        ..Default::default()
    };
    let mut container: Option<(Arc<Container>, vfpoll_dma::DmaContext)> = None;
    let mut ctrls: Vec<(Bdf, Controller)> = Vec::new();
    let mut out: Vec<Box<dyn Device>> = Vec::new();
    for s in &parsed {
        let d: Box<dyn Device> = match s {
            NamespaceSpec::File { path, size } => Box::new(
                UringDevice::open(
                    path,
                    &UringOptions {
                        create_size: if create { size.or(o.format.file_size) } else { None },
                        allow_buffered: o.format.store.allow_buffered_io,
                        queue_depth: qd,
                    },
                )
                .map_err(|e| Error::new(EIO, format!("{s}: {e}")))?,
            ),
            NamespaceSpec::Block { path } => Box::new(
                UringDevice::open(
                    path,
                    &UringOptions {
                        create_size: None,
                        allow_buffered: o.format.store.allow_buffered_io,
                        queue_depth: qd,
                    },
                )
                .map_err(|e| Error::new(EIO, format!("{s}: {e}")))?,
            ),
            NamespaceSpec::Mem { size } => Box::new(MemDevice::new(size / 4096 * 4096, 512, true)),
            NamespaceSpec::Model { .. } => {
                return Err(Error::inval(format!(
                    "{s}: model namespaces are opened with VFPOLL_IOMMU_AUTO"
                )))
            }
            NamespaceSpec::Vfio { bdf, nsid } => {
                let ctrl = match ctrls.iter().find(|(b, _)| b == bdf) {
                    Some((_, c)) => c.clone(),
                    None => {
                        let opts = ControllerOptions::default();
                        let c = match &container {
                            None => {
                                let cont = Container::open(mode)?;
                                let (c, dma) = Controller::open_first(&cont, *bdf, opts)
                                    .map_err(|e| Error::from(e).context(&format!("{bdf}")))?;
                                container = Some((cont, dma));
                                c
                            }
                            Some((cont, dma)) => Controller::open(cont, *bdf, dma.clone(), opts)
                                .map_err(|e| Error::from(e).context(&format!("{bdf}")))?,
                        };
                        ctrls.push((*bdf, c.clone()));
                        c
                    }
                };
                let keep: Vec<Box<dyn std::any::Any + Send>> = match &container {
                    Some((c, _)) => vec![Box::new(c.clone())],
                    None => vec![],
                };
                Box::new(
                    NvmeDevice::new(&ctrl, *nsid, &qopts, &bdf.to_string(), keep)
                        .map_err(|e| Error::new(EIO, e.to_string()))?,
                )
            }
        };
        out.push(d);
    }
    Ok(out)
}

impl Error {
    /// The same error with `what: ` in front of its message.
    fn context(mut self, what: &str) -> Self {
        self.msg = format!("{what}: {}", self.msg);
        self
    }
}

/// Formats a store over `specs`.
pub(crate) fn format(specs: &[String], o: &OpenOpts) -> Res<vfpoll_store> {
    if o.backend == Backend::Auto {
        return Ok(vfpoll_store(Store::format(specs, &o.format)?));
    }
    let devs = devices(specs, o, true)?;
    Ok(vfpoll_store(Store::format_devices(devs, &o.format)?))
}

/// Opens the store on `specs`.
pub(crate) fn open(specs: &[String], o: &OpenOpts) -> Res<vfpoll_store> {
    if o.backend == Backend::Auto {
        return Ok(vfpoll_store(Store::open(specs, &o.format.store)?));
    }
    let devs = devices(specs, o, false)?;
    Ok(vfpoll_store(Store::open_devices(devs, &o.format.store)?))
}

/// The options behind a `vfpoll_store_opts`.
#[allow(clippy::too_many_arguments, reason = "one argument per field of the C struct")]
pub(crate) fn open_opts(
    backend: Backend,
    lock_dir: Option<String>,
    allow_buffered: bool,
    queue_depth: u32,
    chunk_size: u32,
    label: String,
    file_size: u64,
    force: bool,
) -> OpenOpts {
    let d = StoreOptions::default();
    OpenOpts {
        backend,
        format: FormatOptions {
            chunk_size: if chunk_size == 0 {
                FormatOptions::default().chunk_size
            } else {
                chunk_size
            },
            label,
            file_size: (file_size > 0).then_some(file_size),
            force,
            store: StoreOptions {
                lock_dir: lock_dir.map(Into::into),
                allow_buffered_io: allow_buffered,
                queue_depth: if queue_depth == 0 {
                    d.queue_depth
                } else {
                    queue_depth
                },
                ..d
            },
        },
    }
}

/// The text `vfpoll_store_list` writes: one line per checkpoint version
/// (`checkpoint NAME VERSION BYTES ENTRIES`) and per pool (`pool NAME BLOCK_SIZE SLOTS`).
pub(crate) fn list(s: &Store) -> String {
    let mut t = String::new();
    for c in s.checkpoints() {
        for v in &c.versions {
            t.push_str(&format!(
                "checkpoint {} {} {} {}\n",
                c.name, v.id, v.bytes, v.entries
            ));
        }
    }
    for p in s.pools() {
        t.push_str(&format!("pool {} {} {}\n", p.name, p.block_size, p.slots));
    }
    t
}

/// A committed transaction's handle: taken.
pub(crate) fn take_tx(tx: &vfpoll_ckpt_tx) -> Res<CheckpointTx> {
    tx.0.lock()
        .map_err(|_| Error::new(EIO, "the transaction's lock is poisoned"))?
        .take()
        .ok_or_else(|| Error::new(EBUSY, "the transaction was committed or aborted already"))
}

/// Runs `f` on the open transaction.
pub(crate) fn with_tx<T>(tx: &vfpoll_ckpt_tx, f: impl FnOnce(&mut CheckpointTx) -> Res<T>) -> Res<T> {
    let mut g =
        tx.0.lock()
            .map_err(|_| Error::new(EIO, "the transaction's lock is poisoned"))?;
    let t = g
        .as_mut()
        .ok_or_else(|| Error::new(EBUSY, "the transaction was committed or aborted already"))?;
    f(t)
}

/// A KV key from its two 64-bit halves.
pub(crate) fn key(lo: u64, hi: u64) -> u128 {
    (hi as u128) << 64 | lo as u128
}
