//! The device-independent API: a [`Port`] is a NIC's control path ([`NicControl`]) plus one
//! receive queue ([`RxQueue`]) and one transmit queue ([`TxQueue`]).
//!
//! Queues follow the NVMe queue pair's rules: `Send`, not `Sync`, every operation `&mut self`,
//! so one thread owns a queue and the hot path takes no lock and makes no system call. Split a
//! port ([`Port::split`]) to run its queues on different threads.
//!
//! Bursts work on a caller-owned `Vec<Packet>` that is reused from burst to burst (no
//! allocation once it has capacity):
//! - [`RxQueue::rx_burst`] appends up to `max` received packets;
//! - [`TxQueue::tx_burst`] takes packets from the front of the vector, as many as the ring has
//!   room for, and leaves the rest (DPDK's `rte_eth_tx_burst` returning fewer than asked).
//!   The tail register is written once per burst on both sides; completed transmissions are
//!   reclaimed in batches at the start of each `tx_burst` (or by [`TxQueue::reclaim`]).

use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::time::{Duration, Instant};

use vfpoll_dma::PageSize;

use crate::error::{NicError, Result};
use crate::irq::CompletionMode;
use crate::mac::MacAddr;
use crate::pool::Packet;
use crate::stats::{PortStats, RxQueueStats, TxQueueStats};

/// Options of a port.
#[derive(Debug, Clone)]
pub struct PortOptions {
    /// Receive descriptors (a multiple of 8, 8..=4096). One stays empty, so `rx_entries - 1`
    /// frames can wait in the ring; the ring holds that many pool buffers all the time.
    pub rx_entries: u16,
    /// Transmit descriptors (a multiple of 8, 8..=4096); `tx_entries - 1` packets in flight.
    pub tx_entries: u16,
    /// Page size of the descriptor rings' DMA memory (hugepages in production,
    /// [`PageSize::Base4K`] for device models).
    pub page_size: PageSize,
    /// Receive every unicast and multicast frame, not only those for the port's address
    /// (broadcast is always received).
    pub promiscuous: bool,
    /// How long bring-up waits for the link before failing with [`NicError::LinkDown`].
    pub link_timeout: Duration,
    /// How the receive queue learns of frames: [`CompletionMode::Poll`] (every interrupt
    /// masked), or an interrupt vector so that [`RxQueue::wait`] sleeps (see [`crate::irq`]).
    /// Transmit completions are always reclaimed by polling.
    pub completion: CompletionMode,
}

impl Default for PortOptions {
    fn default() -> Self {
        PortOptions {
            rx_entries: 512,
            tx_entries: 512,
            page_size: PageSize::Huge2M,
            promiscuous: false,
            link_timeout: Duration::from_secs(10),
            completion: CompletionMode::Poll,
        }
    }
}

/// Link state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    /// Whether the link is up.
    pub up: bool,
    /// Speed in Mb/s (10, 100 or 1000) as the MAC reports it; 0 where the device does not say
    /// (virtio-net without VIRTIO_NET_F_SPEED_DUPLEX).
    pub speed_mbps: u32,
    /// Full duplex.
    pub full_duplex: bool,
}

impl std::fmt::Display for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.up {
            let d = if self.full_duplex { "full" } else { "half" };
            write!(f, "up, {} Mb/s {d} duplex", self.speed_mbps)
        } else {
            f.write_str("down")
        }
    }
}

/// What a port is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInfo {
    /// The PCI address, or a name for a device model.
    pub name: String,
    /// The driver, e.g. `e1000e (82574L)`.
    pub driver: &'static str,
    /// The station address in use.
    pub mac: MacAddr,
}

/// The control path of a port: link, address filter, counters. Not on the hot path.
pub trait NicControl: Send {
    /// What the port is.
    fn info(&self) -> &PortInfo;
    /// The link state now.
    fn link(&self) -> Link;
    /// Whether the device has stopped answering (its registers read all ones: surprise
    /// removal, a reset behind the driver's back).
    fn device_gone(&self) -> bool;
    /// Polls the link until it is up or `timeout` passes ([`NicError::LinkDown`]); fails at
    /// once with [`NicError::DeviceGone`] if the device stops answering.
    fn wait_link(&self, timeout: Duration) -> Result<Link> {
        let start = Instant::now();
        loop {
            if self.device_gone() {
                return Err(NicError::DeviceGone {
                    port: self.info().name.clone(),
                });
            }
            let l = self.link();
            if l.up {
                return Ok(l);
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(NicError::LinkDown {
                    port: self.info().name.clone(),
                    waited,
                });
            }
            std::thread::sleep(Duration::from_millis(1).min(timeout - waited));
        }
    }
    /// Turns unicast and multicast promiscuous mode on or off.
    fn set_promiscuous(&mut self, on: bool);
    /// Whether promiscuous mode is on.
    fn promiscuous(&self) -> bool;
    /// The hardware counters accumulated since the port was opened.
    fn stats(&self) -> PortStats;
}

/// A receive queue.
pub trait RxQueue: Send {
    /// Appends up to `max` received packets to `out` and gives the device fresh buffers for
    /// them (one tail write for the burst); returns how many. Allocates nothing if `out` has
    /// room for `max` more.
    fn rx_burst(&mut self, out: &mut Vec<Packet>, max: usize) -> usize;
    /// Counters.
    fn stats(&self) -> RxQueueStats;
    /// How the queue learns of frames ([`PortOptions::completion`]).
    fn completion_mode(&self) -> CompletionMode {
        CompletionMode::Poll
    }
    /// The eventfd that becomes readable when the queue interrupts (`None` in poll mode).
    /// Register it with epoll/mio/tokio and call [`RxQueue::arm`] before each sleep.
    fn event_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }
    /// Prepares to sleep on [`RxQueue::event_fd`]: clears the eventfd, asks the device for an
    /// interrupt at the next frame, then looks at the ring. Returns `true` when a frame is
    /// already there (poll instead of sleeping). The device stays armed until the next
    /// [`RxQueue::wait`] or [`RxQueue::disarm`]. See [`crate::irq`] for why no wakeup is lost.
    /// Fails in poll mode.
    fn arm(&mut self) -> Result<bool> {
        Err(NicError::InvalidOption(
            "this receive queue has no interrupt mode".into(),
        ))
    }
    /// Tells the device not to interrupt (after [`RxQueue::arm`], once the caller polls
    /// again). A no-op in poll mode.
    fn disarm(&mut self) {}
    /// Waits until a frame is in the ring or `timeout` passes (`None`: no limit): hybrid mode
    /// spins first, then the queue is armed, sleeps on its eventfd and is disarmed. Returns
    /// whether to poll (`true`: a frame is there, or an interrupt came for one polled already;
    /// `false`: the timeout passed, or a signal ended the sleep). Fails in poll mode.
    fn wait(&mut self, timeout: Option<Duration>) -> Result<bool> {
        let _ = timeout;
        Err(NicError::InvalidOption(
            "this receive queue has no interrupt mode".into(),
        ))
    }
}

/// A transmit queue.
pub trait TxQueue: Send {
    /// Reclaims completed transmissions, then places as many packets from the front of `pkts`
    /// on the ring as it has room for (one tail write for the burst). Returns how many were
    /// taken; the rest stay in `pkts`, in order. Empty packets are dropped, not sent.
    fn tx_burst(&mut self, pkts: &mut Vec<Packet>) -> usize;
    /// Gives the buffers of completed transmissions back to their pools, in batches; returns
    /// how many.
    fn reclaim(&mut self) -> usize;
    /// Packets on the ring not yet reclaimed.
    fn in_flight(&self) -> usize;
    /// The most packets the ring holds at once.
    fn capacity(&self) -> usize;
    /// Waits until every packet placed on the ring has been sent and reclaimed.
    fn flush(&mut self, timeout: Duration) -> Result<()>;
    /// Counters.
    fn stats(&self) -> TxQueueStats;
}

/// A NIC port: control path plus one receive and one transmit queue.
pub struct Port {
    ctrl: Box<dyn NicControl>,
    rx: Box<dyn RxQueue>,
    tx: Box<dyn TxQueue>,
}

impl std::fmt::Debug for Port {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Port")
            .field("info", self.ctrl.info())
            .finish_non_exhaustive()
    }
}

impl Port {
    /// Assembles a port from a driver's parts.
    pub fn from_parts(ctrl: Box<dyn NicControl>, rx: Box<dyn RxQueue>, tx: Box<dyn TxQueue>) -> Self {
        Port { ctrl, rx, tx }
    }

    /// Control path.
    pub fn control(&self) -> &dyn NicControl {
        &*self.ctrl
    }

    /// Control path, mutable.
    pub fn control_mut(&mut self) -> &mut dyn NicControl {
        &mut *self.ctrl
    }

    /// The port's name and address.
    pub fn info(&self) -> &PortInfo {
        self.ctrl.info()
    }

    /// The station address.
    pub fn mac(&self) -> MacAddr {
        self.ctrl.info().mac
    }

    /// See [`RxQueue::rx_burst`].
    #[inline]
    pub fn rx_burst(&mut self, out: &mut Vec<Packet>, max: usize) -> usize {
        self.rx.rx_burst(out, max)
    }

    /// See [`TxQueue::tx_burst`].
    #[inline]
    pub fn tx_burst(&mut self, pkts: &mut Vec<Packet>) -> usize {
        self.tx.tx_burst(pkts)
    }

    /// The receive queue.
    pub fn rx(&mut self) -> &mut dyn RxQueue {
        &mut *self.rx
    }

    /// The transmit queue.
    pub fn tx(&mut self) -> &mut dyn TxQueue {
        &mut *self.tx
    }

    /// See [`RxQueue::wait`].
    pub fn wait(&mut self, timeout: Option<Duration>) -> Result<bool> {
        self.rx.wait(timeout)
    }

    /// See [`RxQueue::completion_mode`].
    pub fn completion_mode(&self) -> CompletionMode {
        self.rx.completion_mode()
    }

    /// The receive queue's eventfd (see [`RxQueue::event_fd`]).
    pub fn event_fd(&self) -> Option<BorrowedFd<'_>> {
        self.rx.event_fd()
    }

    /// The parts, to put the queues on threads of their own.
    pub fn split(self) -> (Box<dyn NicControl>, Box<dyn RxQueue>, Box<dyn TxQueue>) {
        (self.ctrl, self.rx, self.tx)
    }
}

/// The receive queue's interrupt eventfd (see [`RxQueue::event_fd`]).
///
/// # Panics
/// On a port in [`CompletionMode::Poll`], which has none.
impl AsRawFd for Port {
    fn as_raw_fd(&self) -> RawFd {
        match self.rx.event_fd() {
            Some(fd) => fd.as_raw_fd(),
            None => panic!(
                "port {}: the receive queue polls (CompletionMode::Poll) and has no eventfd",
                self.info().name
            ),
        }
    }
}
