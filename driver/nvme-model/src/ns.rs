//! Memory-backed namespaces (NVM Command Set 1.0 §2.1): data and metadata in two byte vectors,
//! the current format, and the zones of a zoned namespace, all behind one lock that a command
//! holds from its checks to its last byte.

use std::ops::Range;
use std::sync::{Mutex, MutexGuard};

use crate::nsconfig::{check_format, LbaFormat, NamespaceConfig, NamespaceFormat, Protection};
use crate::pi;
use crate::zns::Zones;
use crate::ModelError;

/// One namespace: what never changes, and its state behind a lock. Shared by the controller
/// thread and the handle.
#[derive(Debug)]
pub(crate) struct Namespace {
    pub(crate) nsid: u32,
    /// The configuration it started with (capabilities, zoned geometry).
    pub(crate) cfg: NamespaceConfig,
    /// The LBA formats it lists.
    pub(crate) formats: Vec<LbaFormat>,
    /// Bytes of storage, data and metadata together: fixed, as a QEMU namespace's image is.
    capacity: u64,
    state: Mutex<NsState>,
}

/// The format in force, resolved for the I/O path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub(crate) format: NamespaceFormat,
    /// log2 of the logical block data size.
    pub(crate) lba_shift: u32,
    /// Metadata bytes per block.
    pub(crate) ms: usize,
}

impl Geometry {
    fn new(lbaf: LbaFormat, format: NamespaceFormat) -> Self {
        Geometry {
            format,
            lba_shift: lbaf.data_size.trailing_zeros(),
            ms: lbaf.metadata_size as usize,
        }
    }

    pub(crate) fn lba_size(&self) -> usize {
        1 << self.lba_shift
    }

    /// Metadata interleaved with data in the data buffer (FLBAS MSET, with metadata).
    pub(crate) fn extended(&self) -> bool {
        self.ms > 0 && self.format.extended
    }

    pub(crate) fn protection(&self) -> Option<Protection> {
        self.format.protection
    }
}

/// What a namespace holds and how it is formatted.
#[derive(Debug)]
pub(crate) struct NsState {
    pub(crate) geo: Geometry,
    pub(crate) blocks: u64,
    data: Vec<u8>,
    meta: Vec<u8>,
    pub(crate) zones: Option<Zones>,
}

impl NsState {
    fn new(cfg: &NamespaceConfig, lbaf: LbaFormat, capacity: u64, format: NamespaceFormat) -> NsState {
        let geo = Geometry::new(lbaf, format);
        let mut blocks = capacity / lbaf.block_bytes();
        if let Some(z) = cfg.zoned {
            blocks -= blocks % z.zone_size;
        }
        let mut st = NsState {
            geo,
            blocks,
            // Zeroed allocations: large namespaces cost address space, not memory, until
            // written.
            data: vec![0; (blocks << geo.lba_shift) as usize],
            meta: vec![0; blocks as usize * geo.ms],
            zones: cfg.zoned.map(|z| Zones::new(z, blocks)),
        };
        if let Some(p) = geo.protection() {
            pi::mark_unwritten(p, geo.ms, &mut st.meta);
        }
        st
    }

    /// Whether `count` blocks from `lba` are inside the namespace.
    pub(crate) fn contains(&self, lba: u64, count: u64) -> bool {
        lba.checked_add(count).is_some_and(|end| end <= self.blocks)
    }

    /// The data bytes of `count` blocks from `lba` (which the caller checked).
    pub(crate) fn data_range(&self, lba: u64, count: u64) -> Range<usize> {
        let s = self.geo.lba_shift;
        (lba << s) as usize..((lba + count) << s) as usize
    }

    /// The metadata bytes of `count` blocks from `lba`.
    pub(crate) fn meta_range(&self, lba: u64, count: u64) -> Range<usize> {
        let ms = self.geo.ms;
        lba as usize * ms..(lba + count) as usize * ms
    }

    pub(crate) fn data(&self) -> &[u8] {
        &self.data
    }

    pub(crate) fn meta(&self) -> &[u8] {
        &self.meta
    }

    /// Data and metadata, both mutable.
    pub(crate) fn storage_mut(&mut self) -> (&mut [u8], &mut [u8]) {
        (&mut self.data, &mut self.meta)
    }

    /// Deallocates `count` blocks from `lba` (Dataset Management, Write Zeroes without PRACT,
    /// zone reset): data and metadata read as zeroes, a protection information tuple as all
    /// ones (NVM Command Set 1.0 §3.2.3.2.1; what QEMU reads back from unallocated blocks).
    pub(crate) fn deallocate(&mut self, lba: u64, count: u64) {
        let (d, m) = (self.data_range(lba, count), self.meta_range(lba, count));
        self.data[d].fill(0);
        let meta = &mut self.meta[m];
        meta.fill(0);
        if let Some(p) = self.geo.protection() {
            pi::mark_unwritten(p, self.geo.ms, meta);
        }
    }
}

impl Namespace {
    /// The namespace of a validated configuration.
    pub(crate) fn new(cfg: &NamespaceConfig) -> Self {
        let capacity = cfg.blocks * cfg.lba_format().block_bytes();
        let format = cfg.format().expect("validated: the format is listed");
        Namespace {
            nsid: cfg.nsid,
            state: Mutex::new(NsState::new(cfg, cfg.lba_format(), capacity, format)),
            capacity,
            formats: cfg.lba_formats(),
            cfg: cfg.clone(),
        }
    }

    /// The state, locked (a panic on another thread while holding it leaves valid bytes).
    pub(crate) fn lock(&self) -> MutexGuard<'_, NsState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `f` is a format this namespace offers, and why not.
    pub(crate) fn check_format(&self, f: NamespaceFormat) -> Result<(), String> {
        let Some(&lbaf) = self.formats.get(f.index as usize) else {
            return Err(format!(
                "LBA format {} is not one of the {} the namespace lists",
                f.index,
                self.formats.len()
            ));
        };
        check_format(&self.cfg, lbaf, f)
    }

    /// Formats to `f` (checked with [`Namespace::check_format`]), erasing everything; the
    /// storage's bytes are divided into blocks of the new size. Returns whether the Identify
    /// Namespace data changed (anything but the contents).
    pub(crate) fn format(&self, f: NamespaceFormat) -> bool {
        let mut st = self.lock();
        let old = (st.geo, st.blocks);
        *st = NsState::new(&self.cfg, self.formats[f.index as usize], self.capacity, f);
        old != (st.geo, st.blocks)
    }

    /// The handle's view: `range` or the handle's error.
    pub(crate) fn check_range(&self, st: &NsState, lba: u64, count: u64) -> Result<(), ModelError> {
        match st.contains(lba, count) {
            true => Ok(()),
            false => Err(ModelError::OutOfRange {
                nsid: self.nsid,
                lba,
                count,
            }),
        }
    }
}
