//! # vfpoll-nvme: a polled userspace NVMe driver
//!
//! Layers, bottom up:
//! - [`regs`], [`cmd`], [`status`], [`identify`], [`zns`]: the NVMe definitions (registers in
//!   BAR0, queue entries, opcodes, completion status with names, Identify and log page
//!   structures, zoned namespaces' data) are `vfpoll-nvme-spec`'s, re-exported; [`cmd`] adds
//!   the builders that take bus addresses ([`cmd::CommandExt`]);
//! - [`prp`]: data pointers (PRP entries and lists);
//! - [`format`](mod@format): namespace formats (metadata placement, protection information) and what a
//!   command moves through each pointer;
//! - [`Controller`]: bring-up, admin commands, namespaces (re-read after a format or a
//!   namespace event), reset and recovery ([`Controller::reset`]: queue pairs survive it, their
//!   commands in flight come back with [`NvmeError::Reset`] and their buffers), shutdown;
//! - [`QueuePair`]: I/O submission and polled completion, one per thread, or interrupt mode
//!   ([`CompletionMode`], [`QueuePair::wait`], an eventfd for epoll/tokio); every data and
//!   metadata pointer is sized from the namespace's format in one place (`qpair/xfer.rs`), so
//!   the controller never moves more bytes than a buffer holds.
//!
//! Inside the crate, modules import only downward (`cargo xtask circles` checks it): what acts
//! on the whole controller (reset, removal, namespace re-reads, the controller memory buffer)
//! lives in children of the private `ctrlr` module. A read, write,
//! compare, write-zeroes or zone-append entry is built in one place
//! (`vfpoll_nvme_spec::cmd::Rw::words`), an SQ doorbell is rung by one function (the queue's
//! `ring_sq`: shadow-doorbell check, barrier, MMIO write), and completions are reaped by one
//! loop, for [`QueuePair::poll`] and its variants alike.
//!
//! Nothing safe can make a controller DMA to memory the driver did not describe: raw
//! passthrough ([`Controller::admin_raw`], [`QueuePair::submit_raw`]) is `unsafe`, a buffer
//! type vouches for its bus addresses by implementing the `unsafe` trait [`IoBuffer`], and
//! registers are read-only outside the crate ([`Registers`]; mapping a BAR writable is `unsafe`
//! in `vfpoll-pci`, and the VFIO device stays inside the crate).
//!
//! The integration tests (`tests/driver_*.rs`, `tests/prop_completions.rs`) run this driver
//! against the in-process controller of `vfpoll-nvme-model` (a dev-dependency).
//!
//! The `unsafe` code is in the private `qmem` (queue memory access) and `signal` (clean
//! shutdown on SIGINT/SIGTERM: [`shutdown_on_signals`]) modules, in `regs::map_bar` (the
//! crate's one BAR mapping, private), and in [`buffer`]'s `unsafe impl IoBuffer` for the
//! crate's buffer types (each says why its bus addresses are the buffer's own) and
//! [`BusRange::new`].
//!
//! ```no_run
//! use std::sync::Arc;
//! use vfpoll_nvme::{Controller, ControllerOptions, QpairOptions};
//! use vfpoll_pci::vfio::{Container, IommuMode};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let container = Container::open(IommuMode::Type1)?;
//! let (ctrl, dma) = Controller::open_first(&container, "0000:00:03.0".parse()?, ControllerOptions::default())?;
//! let mut pool = dma.pool(4096, 64, vfpoll_dma::PageSize::Huge2M)?;
//! let mut qp = ctrl.create_qpair::<vfpoll_dma::DmaBuf>(&QpairOptions::default())?;
//! let buf = pool.alloc().expect("a free buffer");
//! qp.read(1, 0, buf, 7).map_err(|r| r.error)?;
//! while qp.poll(16, |done| {
//!     assert_eq!(done.tag, 7);
//!     done.result.expect("read ok");
//!     pool.free(done.buf.expect("data buffer back"));
//! }) == 0 {}
//! # Ok(()) }
//! ```

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks, missing_docs)]

pub mod admin;
pub mod buffer;
mod clock;
pub mod cmb;
pub mod cmd;
mod ctrlr;
pub mod error;
pub mod format;
pub use vfpoll_nvme_spec::identify;
mod namespace;
pub mod prp;
mod qmem;
mod qpair;
mod queue;
pub mod regs;
mod signal;
mod vectors;
pub use vfpoll_nvme_spec::status;
pub use vfpoll_nvme_spec::zns;

pub use buffer::{AnyBuf, BusRange, CmbBuf, DeviceBuf, IoBuffer, RegionBuf};
pub use ctrlr::removal::RemovalReport;
pub use ctrlr::reset::{ResetPolicy, ResetReport};
pub use ctrlr::{Controller, ControllerOptions, FormatOptions, Namespace, Registers, PAGE_SIZE};
pub use error::{NvmeError, Result};
pub use format::{NsFormat, PiCheck, PiMode};
pub use qpair::{CompletionMode, Done, QpairOptions, QpairStats, QueuePair, Rejected, MAX_QUEUE_ENTRIES};
pub use signal::{
    shutdown_all, shutdown_on_signals, shutdown_on_signals_then, ShutdownLimits, ShutdownReport,
};
pub use status::{Sct, Status};
