//! # vfpoll-nvme-model: an in-process NVMe controller
//!
//! A model of an NVMe controller behind PCIe, run on a thread of the test process, for testing
//! and benchmarking the `vfpoll-nvme` driver fast and without QEMU. The driver sees what it sees
//! on hardware: a BAR0 ([`NvmeModel::bar0`], an anonymous shared mapping standing in for the
//! BAR) with the registers and doorbells, and DMA through bus addresses, which the model
//! translates through a [`DmaSpace`] (the simulated IOMMU). Namespaces are held in memory, so a
//! test can check what the driver wrote and seed what it reads ([`NvmeModel::read_ns`],
//! [`NvmeModel::write_ns`]). Faults can be injected at run time ([`NvmeModel::inject`]).
//!
//! It never replaces the QEMU tests: it is one implementation of the specification, and the
//! driver must also meet QEMU's and real controllers'.
//!
//! Layers, bottom up:
//! - `dma`: host memory through a [`DmaSpace`] (all `unsafe` code is there), and [`HeapDma`],
//!   host memory for tests that do not use `vfpoll-dma`;
//! - `queue`, `dptr`: queue entries and ring state; PRP lists and SGLs walked into segments;
//! - `ctrl`: the controller thread (registers, doorbells, arbitration, completions, faults);
//! - `admin`, `identify`, `io`: the commands.
//!
//! What is modelled (NVMe Base 2.0, NVM Command Set 1.0, NVMe over PCIe Transport 1.0):
//! - registers CAP (MQES, CQR = 1, TO, DSTRD, CSS = NVM, MPSMIN = 0, MPSMAX), VS 1.4.0, CC and
//!   CSTS (enable with validation, CFS on invalid configuration, reset, shutdown), AQA, ASQ, ACQ;
//!   INTMS/INTMC are accepted and ignored (interrupts are not modelled: the driver polls);
//! - admin: Identify (CNS 00h-03h), Get/Set Features, Create/Delete I/O SQ/CQ, Get Log Page
//!   (error information, SMART, firmware slot), Abort, Asynchronous Event Request (held, never
//!   completed), Format NVM, Doorbell Buffer Config (shadow doorbells and EventIdx);
//! - I/O: Read, Write, Flush, Write Zeroes, Dataset Management (deallocate zeroes), Compare;
//! - data pointers: PRP1/PRP2, PRP lists chained across pages, SGLs (Data Block, Bit Bucket,
//!   Segment, Last Segment);
//! - completion latency, and the faults of [`FaultKind`].
//!
//! Not modelled: interrupts and MSI-X, a controller memory buffer (CMBSZ reads 0), metadata and
//! protection information, reservations, namespace management, multiple LBA formats, weighted
//! round robin, fused commands, asynchronous events, NVM subsystem reset.
//!
//! Efficiency: one thread polls the doorbells with volatile reads while there is work, and backs
//! off to short sleeps only after [`ModelConfig::idle_spin`] without any (see the idle policy in
//! the `ctrl` module). Per command it translates a few bus addresses and takes one namespace
//! lock; it allocates nothing after warm-up.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks, missing_docs)]

mod admin;
mod config;
mod ctrl;
mod dma;
mod dptr;
mod fault;
mod identify;
mod io;
mod ns;
mod queue;
mod stats;
mod status;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use vfpoll_pci::mmio::{self, Mmio};

pub use admin::{feature, log_page, opcode as admin_opcode};
pub use config::{EventIdxPolicy, ModelConfig, NamespaceConfig};
pub use dma::{DmaFault, DmaSpace, FaultLog, HeapDma};
pub use fault::{Fault, FaultKind, QueueMatch};
pub use io::opcode as io_opcode;
pub use stats::StatsSnapshot;
pub use status::{Status, SCT_COMMAND_SPECIFIC, SCT_GENERIC, SCT_MEDIA};

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
    /// Data that is not a whole number of blocks.
    #[error("{len} bytes are not a whole number of {lba_size}-byte blocks")]
    Unaligned {
        /// Data length.
        len: usize,
        /// Block size.
        lba_size: usize,
    },
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

    /// A copy of a whole namespace.
    pub fn namespace_data(&self, nsid: u32) -> Result<Vec<u8>, ModelError> {
        Ok(self.namespace(nsid)?.data().clone())
    }

    /// A copy of `count` blocks from `lba`.
    pub fn read_ns(&self, nsid: u32, lba: u64, count: u64) -> Result<Vec<u8>, ModelError> {
        let ns = self.namespace(nsid)?;
        let range = ns.checked_range(lba, count)?;
        Ok(ns.data()[range].to_vec())
    }

    /// Writes whole blocks from `lba` (seeding content for the driver to read).
    pub fn write_ns(&self, nsid: u32, lba: u64, data: &[u8]) -> Result<(), ModelError> {
        let ns = self.namespace(nsid)?;
        if !data.len().is_multiple_of(ns.lba_size()) {
            return Err(ModelError::Unaligned {
                len: data.len(),
                lba_size: ns.lba_size(),
            });
        }
        let range = ns.checked_range(lba, (data.len() / ns.lba_size()) as u64)?;
        ns.data()[range].copy_from_slice(data);
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

impl Drop for NvmeModel {
    fn drop(&mut self) {
        if self.join().is_err() {
            log::error!("the NVMe model's controller thread panicked");
        }
    }
}
