//! Memory-backed namespaces (NVM Command Set 1.0 §2.1): one byte vector each, locked per command.

use std::sync::{Mutex, MutexGuard};

use crate::{ModelError, NamespaceConfig};

/// One namespace's configuration and contents, shared by the controller thread and the handle.
#[derive(Debug)]
pub(crate) struct Namespace {
    pub(crate) nsid: u32,
    /// log2 of the LBA size.
    pub(crate) lba_shift: u32,
    pub(crate) blocks: u64,
    data: Mutex<Vec<u8>>,
}

impl Namespace {
    pub(crate) fn new(cfg: &NamespaceConfig) -> Self {
        Namespace {
            nsid: cfg.nsid,
            lba_shift: cfg.lba_size.trailing_zeros(),
            blocks: cfg.blocks,
            // Zeroed allocation: large namespaces cost address space, not memory, until written.
            data: Mutex::new(vec![0; cfg.bytes() as usize]),
        }
    }

    pub(crate) fn lba_size(&self) -> usize {
        1 << self.lba_shift
    }

    /// The contents, locked (a panic on another thread while holding it leaves valid bytes).
    pub(crate) fn data(&self) -> MutexGuard<'_, Vec<u8>> {
        self.data.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The byte range of `count` blocks from `lba`, if inside the namespace.
    pub(crate) fn range(&self, lba: u64, count: u64) -> Option<std::ops::Range<usize>> {
        let end = lba.checked_add(count)?;
        if end > self.blocks {
            return None;
        }
        Some((lba << self.lba_shift) as usize..(end << self.lba_shift) as usize)
    }

    /// `range`, or the handle's error.
    pub(crate) fn checked_range(&self, lba: u64, count: u64) -> Result<std::ops::Range<usize>, ModelError> {
        self.range(lba, count).ok_or(ModelError::OutOfRange {
            nsid: self.nsid,
            lba,
            count,
        })
    }

    /// Zeroes the whole namespace, giving its memory back (Format NVM).
    pub(crate) fn format(&self) {
        let mut d = self.data();
        let len = d.len();
        *d = vec![0; len];
    }
}
