//! Errors of the NIC layer. Each message says what happened and what to do about it.

use std::time::Duration;

use vfpoll_pci::Bdf;

/// A NIC driver error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NicError {
    /// No PCI function at this address.
    #[error("{bdf}: no such PCI device; `vfpoll status` lists the NICs of this machine")]
    NoSuchDevice {
        /// The address asked for.
        bdf: Bdf,
    },
    /// The device is not a NIC this crate drives.
    #[error("{bdf} is {vendor:04x}:{device:04x} ({kind}), not a NIC vfpoll drives; supported: {supported}")]
    Unsupported {
        /// The device.
        bdf: Bdf,
        /// PCI vendor ID.
        vendor: u16,
        /// PCI device ID.
        device: u16,
        /// What it is (from the PCI class), e.g. `NVMe`.
        kind: &'static str,
        /// The devices that are supported, as text.
        supported: &'static str,
    },
    /// The link did not come up in time.
    #[error("{port}: link is down after waiting {} ms: check the cable and the link partner (in QEMU: the netdev, `set_link ... on`), or wait longer (link timeout)", waited.as_millis())]
    LinkDown {
        /// The port (PCI address or model name).
        port: String,
        /// How long it waited.
        waited: Duration,
    },
    /// A bring-up step did not finish in time.
    #[error("{port}: {step} did not finish within {limit:?}; the device does not respond as it should: reset it (`vfpoll reset {port}`, then `vfpoll bind`) and retry")]
    InitTimeout {
        /// The port.
        port: String,
        /// The step, e.g. `device reset (CTRL.RST)`.
        step: &'static str,
        /// The limit.
        limit: Duration,
    },
    /// A virtio device that does not behave as the VIRTIO 1.x specification says.
    #[error("{port}: virtio-net bring-up failed: {why}; reset the device (`vfpoll reset {port}`, then `vfpoll bind`) and retry")]
    Virtio {
        /// The port.
        port: String,
        /// What went wrong.
        why: String,
    },
    /// Registers read all ones.
    #[error("{port}: registers read 0xffffffff: the device was removed, is powered down, or its BAR is not enabled; `vfpoll reset` it and bind it again")]
    DeviceGone {
        /// The port.
        port: String,
    },
    /// Not enough free packet buffers.
    #[error("packet pool exhausted: {need} buffers needed for {what}, {available} of {capacity} free; make the pool larger, or give buffers back (drop packets, transmit them, or close queues that hold them)")]
    PoolExhausted {
        /// What needed them.
        what: &'static str,
        /// How many were needed.
        need: usize,
        /// How many were free.
        available: usize,
        /// The pool's size.
        capacity: usize,
    },
    /// The pool's buffers are too small for the device.
    #[error("packet buffers of {buf_size} bytes are too small: the {device} receives frames into buffers of at least {min} bytes; make the pool with larger buffers")]
    BufferTooSmall {
        /// The pool's buffer size.
        buf_size: usize,
        /// The smallest size the device can use.
        min: usize,
        /// The device.
        device: &'static str,
    },
    /// A packet length that does not fit its buffer.
    #[error("{len} bytes do not fit a packet buffer of {capacity} bytes")]
    TooLong {
        /// The length asked for.
        len: usize,
        /// The buffer size.
        capacity: usize,
    },
    /// A read outside the packet's data.
    #[error("bytes {off}..{end} are outside the packet's {len} bytes of data")]
    OutOfBounds {
        /// Start of the access.
        off: usize,
        /// End of the access.
        end: usize,
        /// The packet length.
        len: usize,
    },
    /// Transmitted packets did not complete in time.
    #[error("{port}: {pending} transmitted packets did not complete within {timeout:?}: is the transmitter enabled and the link up?")]
    TxTimeout {
        /// The port.
        port: String,
        /// Packets still in flight.
        pending: usize,
        /// The limit.
        timeout: Duration,
    },
    /// A bad option value.
    #[error("invalid option: {0}")]
    InvalidOption(String),
    /// DMA memory could not be had.
    #[error(transparent)]
    Dma(#[from] vfpoll_dma::DmaError),
    /// VFIO failed.
    #[error(transparent)]
    Vfio(#[from] vfpoll_pci::vfio::VfioError),
}

/// `Result` with [`NicError`].
pub type Result<T, E = NicError> = std::result::Result<T, E>;
