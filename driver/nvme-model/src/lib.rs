//! # vfpoll-nvme-model: an in-process NVMe controller
//!
//! A model of an NVMe controller behind PCIe, run on a thread of the test process, for testing
//! and benchmarking the `vfpoll-nvme` driver fast and without QEMU. The driver sees what it sees
//! on hardware: a BAR0 ([`NvmeModel::bar0`], an anonymous shared mapping standing in for the
//! BAR) with the registers and doorbells, and DMA through bus addresses, which the model
//! translates through a [`DmaSpace`] (the simulated IOMMU). Namespaces are held in memory, so a
//! test can check what the driver wrote and seed what it reads ([`NvmeModel::read_ns`],
//! [`NvmeModel::write_ns`], and [`NvmeModel::read_ns_meta`], [`NvmeModel::write_ns_meta`] for
//! per-block metadata), reformat a namespace behind the driver's back
//! ([`NvmeModel::change_namespace`]) and fail zones ([`NvmeModel::set_zone_state`]). Faults can
//! be injected at run time ([`NvmeModel::inject`]).
//!
//! It never replaces the QEMU tests: it is one implementation of the specification, and the
//! driver must also meet QEMU's and real controllers'. It knows nothing of the driver: the
//! register offsets and fields, opcodes, feature and log page identifiers, status codes and the
//! queue entries' layouts are `vfpoll-nvme-spec`'s, the definitions the driver uses too; the
//! driver's tests against it live in `driver/nvme/tests`.
//!
//! Layers, bottom up:
//! - `dma`: host memory through a [`DmaSpace`] (all `unsafe` code is there), and [`HeapDma`],
//!   host memory for tests that do not use `vfpoll-dma`;
//! - `queue`, `dptr`: queue entries and ring state; PRP lists and SGLs walked into segments;
//! - `nsconfig`, `ns`: namespace configuration, and namespaces in memory (data, metadata,
//!   format, zones) behind one lock;
//! - `pi`, `zns`, `events`: protection information, the zone state machine, asynchronous events
//!   (pure logic, unit tested on their own);
//! - `ctrl`: the controller thread (registers, doorbells, arbitration, completions, faults);
//! - `admin`, `identify`, `io`, `rw`: the commands.
//!
//! What is modelled (NVMe Base 2.0, NVM Command Set 1.0, Zoned Namespace Command Set 1.1,
//! NVMe over PCIe Transport 1.0):
//! - registers CAP (MQES, CQR = 1, TO, DSTRD, CSS = NVM, I/O command sets and admin only,
//!   MPSMIN = 0, MPSMAX), VS 1.4.0, CC and CSTS (enable with validation, CC.CSS 000b, 110b or
//!   111b, CFS on invalid configuration, reset, shutdown), AQA, ASQ, ACQ; INTMS/INTMC are
//!   accepted and ignored (MSI-X, below, does not use them);
//! - admin: Identify (CNS 00h-03h, 05h-07h for the NVM and Zoned Namespace command sets, 1Ch),
//!   Get/Set Features (Asynchronous Event Configuration, I/O Command Set Profile among them),
//!   Create/Delete I/O SQ/CQ, Get Log Page (error information, SMART, firmware slot, Changed
//!   Namespace List), Abort, Asynchronous Event Request (completed by Namespace Attribute
//!   Changed notices), Format NVM (any listed LBA format, metadata placement and protection
//!   information), Doorbell Buffer Config (shadow doorbells and EventIdx);
//! - namespaces with up to 64 LBA formats, metadata as extended LBAs or in a separate buffer
//!   (MPTR with PSDT 00b, 01b, or an SGL with 10b), and end-to-end protection with the 16-bit
//!   guard (PI Types 1-3, first or last bytes; PRACT insert and strip, PRCHK guard,
//!   application and reference tag checks); see [`LbaFormat`], [`NamespaceFormat`], [`PiTuple`];
//! - I/O: Read, Write, Flush, Write Zeroes, Dataset Management (deallocate zeroes), Compare;
//!   on zoned namespaces also Zone Management Send (open, close, finish, reset, offline, one or
//!   all), Zone Management Receive (Report Zones, filters, partial) and Zone Append, with the
//!   zone state machine, write pointers and open/active limits ([`ZonedConfig`], [`ZoneState`]);
//! - data pointers: PRP1/PRP2, PRP lists chained across pages, SGLs (Data Block, Bit Bucket,
//!   Segment, Last Segment);
//! - MSI-X as eventfds ([`NvmeModel::msix`]): a CQ created with IEN = 1 signals its vector's
//!   eventfd on every entry posted;
//! - completion latency, and the faults of [`FaultKind`].
//!
//! Not modelled: pin-based and MSI interrupts, interrupt coalescing, a controller memory buffer (CMBSZ reads 0), the 32- and
//! 64-bit guard protection information formats (PIF) and storage tags, reservations, namespace
//! management and attachment, zone descriptor extensions and zone random write areas, Host
//! Behavior Support (the upper Format NVM index bits are always honoured), weighted round robin,
//! fused commands, events other than Namespace Attribute Changed, NVM subsystem reset.
//!
//! Efficiency: one thread polls the doorbells with volatile reads while there is work, and backs
//! off to short sleeps only after [`ModelConfig::idle_spin`] without any (see the idle policy in
//! the `ctrl` module). Per command it translates a few bus addresses and takes one namespace
//! lock; I/O commands allocate nothing after warm-up (Report Zones and Format NVM do).

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks, missing_docs)]

mod admin;
mod config;
mod ctrl;
mod dma;
mod dptr;
mod events;
mod fault;
mod identify;
mod io;
mod ns;
mod nsconfig;
mod pi;
mod queue;
mod rw;
mod stats;
mod status;
mod zns;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use vfpoll_pci::mmio::{self, Mmio};

pub use config::{EventIdxPolicy, ModelConfig, ShutdownBehavior};
pub use dma::{DmaFault, DmaSpace, FaultCheck, FaultLog, HeapDma};
pub use fault::{Fault, FaultKind, QueueMatch};
pub use nsconfig::{
    LbaFormat, MetadataCaps, NamespaceConfig, NamespaceFormat, PiCaps, PiType, Protection, ZonedConfig,
    MAX_LBA_FORMATS,
};
pub use pi::{crc16_t10dif, PiTuple};
pub use stats::StatsSnapshot;
pub use status::{Status, SCT_COMMAND_SPECIFIC, SCT_GENERIC, SCT_MEDIA};
pub use vfpoll_nvme_spec::cmd::{admin_op as admin_opcode, feature, io_op as io_opcode, log_page};
pub use zns::{ZoneInfo, ZoneState};

use ctrl::{Controller, FaultInbox, PanicGuard, Shared};
use ns::Namespace;

/// Errors of the model handle.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The configuration is invalid.
    #[error("invalid NVMe model configuration: {0}")]
    Config(String),
    /// The memory standing in for BAR0 could not be mapped.
    #[error("cannot map the model's BAR0")]
    Bar(#[source] std::io::Error),
    /// The controller thread could not be started.
    #[error("cannot start the controller thread")]
    Thread(#[source] std::io::Error),
    /// The controller thread panicked (a bug in the model).
    #[error("the controller thread panicked")]
    Panicked,
    /// No namespace with this ID.
    #[error("no namespace {0}")]
    UnknownNamespace(u32),
    /// Blocks outside the namespace.
    #[error("blocks {lba}..+{count} are outside namespace {nsid}")]
    OutOfRange {
        /// Namespace.
        nsid: u32,
        /// First block.
        lba: u64,
        /// Number of blocks.
        count: u64,
    },
    /// Data or metadata that is not a whole number of blocks' worth.
    #[error("{len} bytes are not a whole number of {unit}-byte units (one block's data or metadata)")]
    Unaligned {
        /// Length given.
        len: usize,
        /// Bytes per block (of data, or of metadata).
        unit: usize,
    },
    /// Metadata asked of a namespace formatted without any.
    #[error("namespace {0} is formatted without metadata")]
    NoMetadata(u32),
    /// A format the namespace does not offer.
    #[error("namespace {nsid} cannot take that format: {why}")]
    InvalidFormat {
        /// Namespace.
        nsid: u32,
        /// What is wrong.
        why: String,
    },
    /// Zones asked of a namespace that is not zoned.
    #[error("namespace {0} is not zoned")]
    NotZoned(u32),
    /// An LBA that is not the start of a zone.
    #[error("LBA {lba} is not the start of a zone of namespace {nsid}")]
    NotZoneStart {
        /// Namespace.
        nsid: u32,
        /// The LBA given.
        lba: u64,
    },
    /// A zone state the handle cannot set (only read-only and offline, as media failures).
    #[error("a zone cannot be put into state {0:?} from outside; use Zone Management Send")]
    ZoneStateNotSettable(ZoneState),
}

/// A namespace's format as it is now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamespaceInfo {
    /// How it is formatted.
    pub format: NamespaceFormat,
    /// The LBA format in force.
    pub lba_format: LbaFormat,
    /// Size in blocks.
    pub blocks: u64,
}

/// Resets a model's PCI function from any thread ([`NvmeModel::function_reset_handle`]).
#[derive(Clone)]
pub struct FunctionResetHandle(Arc<Shared>);

impl std::fmt::Debug for FunctionResetHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FunctionResetHandle")
    }
}

impl FunctionResetHandle {
    /// See [`NvmeModel::function_reset`].
    pub fn reset(&self) -> bool {
        let sh = &self.0;
        let asked = sh.flr_asked.fetch_add(1, Ordering::AcqRel) + 1;
        let start = std::time::Instant::now();
        while sh.flr_done.load(Ordering::Acquire) < asked {
            if start.elapsed() > std::time::Duration::from_secs(1) || sh.stop.load(Ordering::Relaxed) {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
        true
    }
}

/// A running controller model: its thread, its BAR0 and its namespaces.
///
/// Dropping it stops the thread (as [`NvmeModel::stop`] does, ignoring a panic).
pub struct NvmeModel {
    shared: Arc<Shared>,
    bar0: Mmio,
    config: ModelConfig,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for NvmeModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmeModel")
            .field("bar0", &self.bar0)
            .field("running", &self.thread.is_some())
            .finish()
    }
}

impl NvmeModel {
    /// Validates `config`, maps a fresh BAR0 and starts the controller thread. The controller
    /// starts disabled (CC.EN = 0, CSTS = 0), with CAP and VS set.
    ///
    /// `dma` is how the controller reaches host memory: a `vfpoll_dma::FakeMapper` once the
    /// driver allocates through `vfpoll-dma`, or a [`HeapDma`].
    pub fn start(config: ModelConfig, dma: Arc<dyn DmaSpace>) -> Result<NvmeModel, ModelError> {
        config.validate()?;
        let bar0 = mmio::anonymous(config.bar0_len()).map_err(ModelError::Bar)?;
        let mut namespaces: Vec<Arc<Namespace>> = config
            .namespaces
            .iter()
            .map(|n| Arc::new(Namespace::new(n)))
            .collect();
        namespaces.sort_by_key(|n| n.nsid);
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            stats: Default::default(),
            faults: Mutex::new(FaultInbox::default()),
            fault_gen: AtomicU64::new(0),
            armed: AtomicUsize::new(0),
            fatal_now: AtomicBool::new(false),
            namespaces,
            ns_changes: Mutex::new(Vec::new()),
            ns_changed: AtomicBool::new(false),
            msix: Mutex::new(Vec::new()),
            shutdowns: Default::default(),
            hang_disable: Default::default(),
            hang_enable: Default::default(),
            flr_asked: Default::default(),
            flr_done: Default::default(),
            resets: Default::default(),
        });
        // Registers are in place before `start` returns: the host may read CAP at once.
        ctrl::init_registers(&bar0, &config);
        let (cfg, bar, sh) = (config.clone(), bar0.clone(), shared.clone());
        let thread = std::thread::Builder::new()
            .name("nvme-model".into())
            .spawn(move || {
                let _guard = PanicGuard(bar.clone());
                Controller::new(cfg, bar, dma::Guest::new(dma), sh).run();
            })
            .map_err(ModelError::Thread)?;
        Ok(NvmeModel {
            shared,
            bar0,
            config,
            thread: Some(thread),
        })
    }

    /// An MSI-X table of `vectors` entries, each signalling a new eventfd, returned (the model
    /// keeps its own descriptor of each): completion queues created with IEN = 1 and IV `v`
    /// signal the `v`th on every entry posted. Give them to the driver with
    /// `Controller::use_interrupts`. Replaces an earlier table for queues created after.
    pub fn msix(&self, vectors: u16) -> std::io::Result<Vec<vfpoll_pci::vfio::EventFd>> {
        let fds = (0..vectors)
            .map(|_| vfpoll_pci::vfio::EventFd::new())
            .collect::<std::io::Result<Vec<_>>>()?;
        let mine = fds
            .iter()
            .map(|f| f.try_clone().map(Arc::new))
            .collect::<std::io::Result<Vec<_>>>()?;
        *self.shared.msix.lock().unwrap_or_else(|e| e.into_inner()) = mine;
        Ok(fds)
    }

    /// BAR0, as the driver maps it: registers at 0, doorbells from 0x1000.
    pub fn bar0(&self) -> Mmio {
        self.bar0.clone()
    }

    /// The configuration the model runs with.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Arms a fault (see [`Fault`] and [`FaultKind`] for what it does). It applies to commands
    /// fetched after this call returns, so inject before ringing the doorbell.
    pub fn inject(&self, fault: Fault) {
        let mut inbox = self.shared.faults.lock().unwrap_or_else(|e| e.into_inner());
        inbox.new.push(fault);
        self.shared.fault_gen.fetch_add(1, Ordering::Release);
    }

    /// Disarms all faults not yet used up.
    pub fn clear_faults(&self) {
        let mut inbox = self.shared.faults.lock().unwrap_or_else(|e| e.into_inner());
        inbox.new.clear();
        inbox.clear = true;
        self.shared.fault_gen.fetch_add(1, Ordering::Release);
    }

    /// Faults armed and not used up (a fault for `n` commands counts once until its last use).
    pub fn armed_faults(&self) -> usize {
        let inbox = self.shared.faults.lock().unwrap_or_else(|e| e.into_inner());
        let armed = if inbox.clear {
            0
        } else {
            self.shared.armed.load(Ordering::Acquire)
        };
        armed + inbox.new.len()
    }

    /// Makes the controller fail now, as if it hit an internal error: sets CSTS.CFS and stops
    /// processing (within one poll of the controller thread). Ignored if the controller is not
    /// running (disabled, or failed already).
    pub fn set_fatal(&self) {
        self.shared.fatal_now.store(true, Ordering::Relaxed);
    }

    /// Shutdowns completed so far: (normal, abrupt) (NVMe Base 2.0 §3.6; see
    /// [`ModelConfig::shutdown`]).
    pub fn shutdowns(&self) -> (u64, u64) {
        let [n, a] = &self.shared.shutdowns;
        (n.load(Ordering::Relaxed), a.load(Ordering::Relaxed))
    }

    /// Makes the next `n` controller resets hang: at CC.EN 1 → 0 the controller stops
    /// processing and CSTS.RDY stays 1, whatever the host writes to CC, until a function reset
    /// ([`NvmeModel::function_reset`]).
    pub fn hang_on_disable(&self, n: u32) {
        self.shared.hang_disable.store(n, Ordering::Release);
    }

    /// Makes the next `n` enables (CC.EN 0 → 1) never set CSTS.RDY: a controller that does not
    /// come back after a reset. Counted across function resets.
    pub fn hang_on_enable(&self, n: u32) {
        self.shared.hang_enable.store(n, Ordering::Release);
    }

    /// Resets the PCI function, as VFIO's device reset (FLR) does: the controller is back to
    /// its power-on state (CC, AQA, ASQ, ACQ zeroed, no queues, CSTS = 0), a hang ended.
    /// Returns once the controller thread has done it (within a second), or `false` if it did
    /// not.
    pub fn function_reset(&self) -> bool {
        self.function_reset_handle().reset()
    }

    /// A handle that resets the function from any thread (for the driver's
    /// `Controller::set_function_reset`, which stands in for VFIO's device reset).
    pub fn function_reset_handle(&self) -> FunctionResetHandle {
        FunctionResetHandle(Arc::clone(&self.shared))
    }

    /// Controller resets (CC.EN 1 → 0 that completed) and function resets so far.
    pub fn resets(&self) -> (u64, u64) {
        let [c, f] = &self.shared.resets;
        (c.load(Ordering::Relaxed), f.load(Ordering::Relaxed))
    }

    /// Surprise removal: stops the controller thread and makes every register and doorbell of
    /// BAR0 read all-ones, as a read of a vanished PCIe function does.
    pub fn remove(&mut self) -> Result<(), ModelError> {
        let r = self.join();
        for at in (0..self.bar0.len()).step_by(4) {
            self.bar0.write32(at, u32::MAX);
        }
        r
    }

    /// Counters so far.
    pub fn stats(&self) -> StatsSnapshot {
        self.shared.stats.snapshot()
    }

    fn namespace(&self, nsid: u32) -> Result<&Namespace, ModelError> {
        self.shared
            .namespaces
            .iter()
            .find(|n| n.nsid == nsid)
            .map(|n| &**n)
            .ok_or(ModelError::UnknownNamespace(nsid))
    }

    /// A copy of a whole namespace's data.
    pub fn namespace_data(&self, nsid: u32) -> Result<Vec<u8>, ModelError> {
        Ok(self.namespace(nsid)?.lock().data().to_vec())
    }

    /// How a namespace is formatted now.
    pub fn namespace_info(&self, nsid: u32) -> Result<NamespaceInfo, ModelError> {
        let ns = self.namespace(nsid)?;
        let st = ns.lock();
        Ok(NamespaceInfo {
            format: st.geo.format,
            lba_format: ns.formats[st.geo.format.index as usize],
            blocks: st.blocks,
        })
    }

    /// A copy of the data of `count` blocks from `lba`.
    pub fn read_ns(&self, nsid: u32, lba: u64, count: u64) -> Result<Vec<u8>, ModelError> {
        let ns = self.namespace(nsid)?;
        let st = ns.lock();
        ns.check_range(&st, lba, count)?;
        Ok(st.data()[st.data_range(lba, count)].to_vec())
    }

    /// Writes whole blocks of data from `lba` (seeding content for the driver to read); their
    /// metadata is left as it is.
    pub fn write_ns(&self, nsid: u32, lba: u64, data: &[u8]) -> Result<(), ModelError> {
        let ns = self.namespace(nsid)?;
        let mut st = ns.lock();
        let unit = st.geo.lba_size();
        let count = whole(data.len(), unit)?;
        ns.check_range(&st, lba, count)?;
        let range = st.data_range(lba, count);
        st.storage_mut().0[range].copy_from_slice(data);
        Ok(())
    }

    /// A copy of the metadata of `count` blocks from `lba` (MS bytes per block, the protection
    /// information tuple included where the format has one).
    pub fn read_ns_meta(&self, nsid: u32, lba: u64, count: u64) -> Result<Vec<u8>, ModelError> {
        let ns = self.namespace(nsid)?;
        let st = ns.lock();
        if st.geo.ms == 0 {
            return Err(ModelError::NoMetadata(nsid));
        }
        ns.check_range(&st, lba, count)?;
        Ok(st.meta()[st.meta_range(lba, count)].to_vec())
    }

    /// Writes the metadata of whole blocks from `lba`, tuples included as given (seeding, or
    /// corrupting protection information on purpose).
    pub fn write_ns_meta(&self, nsid: u32, lba: u64, meta: &[u8]) -> Result<(), ModelError> {
        let ns = self.namespace(nsid)?;
        let mut st = ns.lock();
        if st.geo.ms == 0 {
            return Err(ModelError::NoMetadata(nsid));
        }
        let count = whole(meta.len(), st.geo.ms)?;
        ns.check_range(&st, lba, count)?;
        let range = st.meta_range(lba, count);
        st.storage_mut().1[range].copy_from_slice(meta);
        Ok(())
    }

    /// Changes a namespace's format from outside the controller, as another host's Format NVM
    /// would: erases it (a zoned namespace's zones start empty; Format NVM itself refuses zoned
    /// namespaces, as QEMU's does), divides its storage into blocks of the new size, and lets the
    /// controller report Namespace Attribute Changed (the Changed Namespace List, and an
    /// Asynchronous Event Request if Asynchronous Event Configuration bit 8 is set), even if
    /// the format is the one it had. I/O the controller is executing finishes first; commands
    /// fetched after this returns see the new format.
    pub fn change_namespace(&self, nsid: u32, format: NamespaceFormat) -> Result<(), ModelError> {
        let ns = self.namespace(nsid)?;
        ns.check_format(format)
            .map_err(|why| ModelError::InvalidFormat { nsid, why })?;
        ns.format(format);
        self.shared
            .ns_changes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(nsid);
        self.shared.ns_changed.store(true, Ordering::Release);
        Ok(())
    }

    /// The zones of a zoned namespace, in LBA order.
    pub fn zones(&self, nsid: u32) -> Result<Vec<ZoneInfo>, ModelError> {
        let ns = self.namespace(nsid)?;
        let st = ns.lock();
        let z = st.zones.as_ref().ok_or(ModelError::NotZoned(nsid))?;
        Ok((0..z.count()).map(|i| z.info(i)).collect())
    }

    /// Puts the zone starting at `zslba` into [`ZoneState::ReadOnly`] or [`ZoneState::Offline`],
    /// as a media failure would (ZNS 1.1 §2.1.1.6, §2.1.1.7); the open and active resources it
    /// held are freed. Commands fetched after this returns see the new state.
    pub fn set_zone_state(&self, nsid: u32, zslba: u64, state: ZoneState) -> Result<(), ModelError> {
        if !matches!(state, ZoneState::ReadOnly | ZoneState::Offline) {
            return Err(ModelError::ZoneStateNotSettable(state));
        }
        let ns = self.namespace(nsid)?;
        let mut st = ns.lock();
        let blocks = st.blocks;
        let z = st.zones.as_mut().ok_or(ModelError::NotZoned(nsid))?;
        let i = z.index(zslba);
        if zslba >= blocks || z.start(i) != zslba {
            return Err(ModelError::NotZoneStart { nsid, lba: zslba });
        }
        z.degrade(i, state);
        Ok(())
    }

    /// Stops the controller thread and waits for it. The BAR stays mapped while clones of it
    /// live, but nothing answers it any more.
    pub fn stop(mut self) -> Result<(), ModelError> {
        self.join()
    }

    fn join(&mut self) -> Result<(), ModelError> {
        self.shared.stop.store(true, Ordering::Relaxed);
        match self.thread.take() {
            Some(t) => t.join().map_err(|_| ModelError::Panicked),
            None => Ok(()),
        }
    }
}

/// `len` bytes as a number of `unit`-byte blocks.
fn whole(len: usize, unit: usize) -> Result<u64, ModelError> {
    match len.is_multiple_of(unit) {
        true => Ok((len / unit) as u64),
        false => Err(ModelError::Unaligned { len, unit }),
    }
}

impl Drop for NvmeModel {
    fn drop(&mut self) {
        if self.join().is_err() {
            log::error!("the NVMe model's controller thread panicked");
        }
    }
}
