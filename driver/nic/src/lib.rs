//! # vfpoll-nic: a polled userspace NIC driver
//!
//! Layers, bottom up:
//! - [`pool`]: packet buffers: a [`Mempool`] of fixed-size hugepage DMA buffers and the
//!   [`Packet`] handle that owns one (zero-copy: the buffer a frame is received into is the one
//!   that is sent, forwarded, or given back);
//! - [`port`]: the device-independent burst API: [`RxQueue::rx_burst`],
//!   [`TxQueue::tx_burst`], [`NicControl`] (link, promiscuous mode, counters), bundled in a
//!   [`Port`];
//! - [`e1000e`]: the Intel 82574L driver (QEMU's `e1000e`), from the 82574 datasheet;
//! - [`virtio`]: the virtio-net driver (modern PCI transport, split virtqueues), from VIRTIO 1.2;
//! - [`open`]: [`probe`] (which driver a device needs) and [`Port::open`], above both drivers;
//! - [`irq`]: interrupt mode ([`CompletionMode`]): a receive queue that sleeps in
//!   [`RxQueue::wait`] (or epoll on [`RxQueue::event_fd`]) until frames arrive;
//! - [`mac`], [`stats`], [`error`]: addresses, counters, errors.
//!
//! One thread per queue: queues are `Send` but not `Sync` and every operation takes
//! `&mut self`; the hot path allocates nothing (give it a `Vec` with capacity), takes no lock
//! per packet and writes each tail register once per burst. Works with VFIO in IOMMU (type1)
//! and no-IOMMU mode alike: devices get bus addresses from [`vfpoll_dma::DmaRegion::bus_addr`].
//!
//! The only `unsafe` code is in the private `mem` module (descriptor rings, virtqueues,
//! packet buffer access, and mapping the BARs, which stay inside the crate because register
//! writes can aim the device's DMA anywhere).
//!
//! ```no_run
//! use vfpoll_nic::{Port, PortOptions};
//! use vfpoll_pci::vfio::{Container, IommuMode};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let container = Container::open(IommuMode::Type1)?;
//! let bdf = "0000:00:05.0".parse()?;
//! let (mut ports, pool) = Port::open_all(&container, &[bdf], 4096, &PortOptions::default())?;
//! let port = &mut ports[0];
//! let mut pkts = Vec::with_capacity(32);
//! // Echo every frame back with source and destination swapped.
//! loop {
//!     if port.rx_burst(&mut pkts, 32) == 0 {
//!         continue;
//!     }
//!     for p in &mut pkts {
//!         let d = p.data_mut();
//!         let (dst, src) = d.split_at_mut(6);
//!         dst.swap_with_slice(&mut src[..6]);
//!     }
//!     port.tx_burst(&mut pkts);
//!     vfpoll_nic::free_bulk(&mut pkts); // what did not fit the ring
//! #   let _ = &pool;
//! #   break;
//! }
//! # Ok(()) }
//! ```

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks, missing_docs)]

pub mod e1000e;
pub mod error;
pub mod irq;
pub mod mac;
mod mem;
pub mod open;
pub mod pool;
pub mod port;
pub mod stats;
pub mod virtio;

pub use error::{NicError, Result};
pub use irq::{CompletionMode, IrqKind};
pub use mac::MacAddr;
pub use open::{probe, SUPPORTED};
pub use pool::{free_bulk, Mempool, Packet, DEFAULT_BUF_SIZE};
pub use port::{Link, NicControl, Port, PortInfo, PortOptions, RxQueue, TxQueue};
pub use stats::{PortStats, RxQueueStats, TxQueueStats};
