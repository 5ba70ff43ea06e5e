//! The store's error type.

use std::time::Duration;

use crate::device::DeviceError;
use crate::format::Corrupt;

/// Errors of the store. Each message says what happened and, where there is something to do,
/// what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A namespace spec or an option is wrong.
    #[error("{0}")]
    Invalid(String),
    /// A device failed (opening it, or an I/O).
    #[error("{device}: {source}")]
    Device {
        /// The device.
        device: String,
        /// What failed.
        #[source]
        source: DeviceError,
    },
    /// An on-disk object failed its checks; nothing was returned from it.
    #[error("corrupt {0} (run fsck for a full report)")]
    Corrupt(Corrupt),
    /// The namespaces hold no vfpoll store.
    #[error("{0}")]
    NotAStore(String),
    /// Another process (or another open in this one) has the store.
    #[error("store {uuid} is in use by PID {pid} (lock file {lock}); close it there first")]
    InUse {
        /// The store's UUID.
        uuid: String,
        /// The holder's PID, as written in the lock file (0 if unknown).
        pid: u32,
        /// The lock file.
        lock: String,
    },
    /// The lock file could not be made.
    #[error("lock file {path}: {source} (set StoreOptions::lock_dir to a writable directory)")]
    Lock {
        /// The lock file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Not enough free space; nothing committed was touched.
    #[error("the store is full: {needed} bytes needed, {free} bytes free; delete versions or pools (keep_last), or add namespaces")]
    Full {
        /// Bytes asked for.
        needed: u64,
        /// Bytes free.
        free: u64,
    },
    /// No such checkpoint, version, entry or pool.
    #[error("{0} not found")]
    NotFound(String),
    /// The name is taken.
    #[error("{0} already exists")]
    Exists(String),
    /// Data failed its checksum; the bytes were not returned.
    #[error("checksum mismatch in {object} (extent at logical page {page}): stored {stored:#010x}, read {computed:#010x}")]
    Checksum {
        /// The entry ("checkpoint model v3 entry layer0.weight").
        object: String,
        /// The extent's first logical page.
        page: u64,
        /// The crc in the manifest.
        stored: u32,
        /// The crc of the bytes read.
        computed: u32,
    },
    /// A device did not complete requests in time.
    #[error("I/O timed out: nothing completed for {waited:?}, {outstanding} requests outstanding")]
    Timeout {
        /// How long nothing completed.
        waited: Duration,
        /// Requests not finished.
        outstanding: usize,
    },
    /// A commit failed after it may have reached the disk; the store refuses further changes
    /// until it is opened again (which finds whichever root is durable).
    #[error("the store stopped accepting changes after a failed commit ({0}); open it again")]
    Poisoned(String),
    /// GPU copies.
    #[error("GPU copy: {0}")]
    Copy(#[from] vfpoll_gpu::CopyError),
    /// A bug: please report it.
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<Corrupt> for StoreError {
    fn from(c: Corrupt) -> Self {
        StoreError::Corrupt(c)
    }
}

/// The store's result type.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;
