//! virtio-net over the modern VIRTIO PCI transport (PCI 1af4:1041, or the transitional 1af4:1000
//! when it has the modern capabilities; QEMU's `-device virtio-net-pci`), written from VIRTIO
//! 1.2 (1.1 section numbers where they differ). One receive and one transmit queue, split
//! virtqueues. Polled by default: no MSI-X vector is assigned and no interrupt is asked for. In
//! interrupt mode ([`PortOptions::completion`]) `receiveq1` gets MSI-X vector 0 and asks for
//! used-buffer notifications only while [`crate::RxQueue::wait`] sleeps (see [`crate::irq`]).
//!
//! Layers: [`pci`] (capabilities and the common configuration layout, §4.1), `queue` (split
//! virtqueues and the two network queues, §2.7 / §5.1.6), this module (bring-up and control).
//!
//! Bring-up ([`VirtioNet::open`]) follows §3.1.1: reset (write 0 to `device_status`, wait until
//! it reads 0, §4.1.4.3.2); ACKNOWLEDGE; DRIVER; read the device's features and accept
//! VIRTIO_F_VERSION_1 (bit 32, required), VIRTIO_F_ACCESS_PLATFORM (bit 33, whenever offered:
//! behind an IOMMU the device must translate its DMA, and VFIO hands it IOVAs),
//! VIRTIO_NET_F_MAC (5, required), VIRTIO_NET_F_STATUS (16) and VIRTIO_NET_F_SPEED_DUPLEX (63)
//! when offered; FEATURES_OK and read it back; set up `receiveq1` (0) and `transmitq1` (1) with
//! `queue_msix_vector` = NO_VECTOR and the receive buffers published; DRIVER_OK; notify the
//! receive queue; wait for the link (§5.1.4: `status` & VIRTIO_NET_S_LINK_UP).
//!
//! Without VIRTIO_NET_F_CTRL_VQ the receive filter is the device's own: QEMU's is promiscuous,
//! so [`NicControl::set_promiscuous`] only records the wish. virtio-net has no counters of its
//! own: [`NicControl::stats`] reports zeros; the queues count ([`RxQueue::stats`]).
//!
//! A virtio 1.x device stops using its queues only at a reset, so dropping either queue resets
//! the device (the transmit queue first waits up to 200 ms for its packets), after which the
//! other queue gives its buffers back without waiting.
//!
//! [`RxQueue::stats`]: crate::RxQueue::stats

pub mod pci;
mod queue;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vfpoll_dma::DmaContext;
use vfpoll_pci::mmio::Mmio;
use vfpoll_pci::vfio::{Device, EventFd};

use crate::error::{NicError, Result};
use crate::irq::{IrqKind, PortIrq};
use crate::mac::MacAddr;
use crate::pool::Mempool;
use crate::port::{Link, NicControl, Port, PortInfo, PortOptions};
use crate::stats::PortStats;
use pci::{common, status, Caps};
pub use queue::{Layout, VirtioRx, VirtioTx, NET_HDR_LEN};

/// The VIRTIO PCI vendor ID (Red Hat, Inc.).
pub const VENDOR_VIRTIO: u16 = 0x1af4;
/// Modern virtio-net (0x1040 + device type 1, §4.1.2).
pub const DEVICE_NET_MODERN: u16 = 0x1041;
/// Transitional virtio-net (driven here through its modern interface only).
pub const DEVICE_NET_TRANSITIONAL: u16 = 0x1000;
/// The driver's name.
pub const DRIVER: &str = "virtio-net (modern PCI)";
/// The smallest receive buffer for a 1514-byte frame (§5.1.6.3.1 asks for 1526 bytes with the
/// header, which has a descriptor of its own here).
pub const MIN_BUF_SIZE: usize = 1514;

/// Feature bits (§6, §5.1.3).
pub mod feature {
    /// The device has a MAC address in its configuration.
    pub const NET_MAC: u64 = 1 << 5;
    /// The configuration's `status` field is valid (link state).
    pub const NET_STATUS: u64 = 1 << 16;
    /// The configuration's `speed` and `duplex` fields are valid.
    pub const NET_SPEED_DUPLEX: u64 = 1 << 63;
    /// VIRTIO 1.x (not legacy).
    pub const VERSION_1: u64 = 1 << 32;
    /// The device's DMA goes through the platform's IOMMU.
    pub const ACCESS_PLATFORM: u64 = 1 << 33;
    /// What this driver accepts when offered.
    pub const WANTED: u64 = NET_MAC | NET_STATUS | NET_SPEED_DUPLEX | VERSION_1 | ACCESS_PLATFORM;
}

/// Device configuration offsets of a network device (`struct virtio_net_config`, §5.1.4).
mod netcfg {
    pub const MAC: usize = 0;
    pub const STATUS: usize = 6;
    pub const SPEED: usize = 12;
    pub const DUPLEX: usize = 16;
    /// `status` bit: link up.
    pub const S_LINK_UP: u16 = 1;
}

/// The queue indices (§5.1.2).
const RX_QUEUE: u16 = 0;
const TX_QUEUE: u16 = 1;
/// The receive queue's MSI-X vector in interrupt mode.
const RX_VECTOR: u16 = 0;

/// What the control path and the queues of one device share.
pub(crate) struct Shared {
    pub(crate) name: String,
    common: Mmio,
    devcfg: Option<Mmio>,
    features: u64,
    /// Set once a reset has stopped the device (see the module docs).
    stopped: AtomicBool,
    stop_lock: Mutex<()>,
    /// The receive queue's interrupt (interrupt mode only); disabled after the reset at close.
    pub(crate) irq: Option<PortIrq>,
    /// The VFIO device, `None` for a device model; dropped last, after bus mastering is off.
    device: Option<Device>,
}

impl Shared {
    fn status(&self) -> u8 {
        self.common.read8(common::DEVICE_STATUS)
    }

    fn gone(&self) -> bool {
        self.status() == u8::MAX
    }

    pub(crate) fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// Resets the device (§4.1.4.3.2: write 0, wait until `device_status` reads 0), after which
    /// it touches neither queue. False when it does not answer.
    pub(crate) fn stop(&self) -> bool {
        let _g = self.stop_lock.lock().unwrap_or_else(|e| e.into_inner());
        if self.stopped() {
            return true;
        }
        self.common.write8(common::DEVICE_STATUS, 0);
        let ok = wait_for(Duration::from_millis(100), || self.status() == 0);
        self.stopped.store(ok, Ordering::Release);
        ok
    }

    fn link(&self) -> Link {
        let Some(cfg) = &self.devcfg else {
            return Link {
                up: true,
                speed_mbps: 0,
                full_duplex: true,
            };
        };
        let up =
            self.features & feature::NET_STATUS == 0 || cfg.read16(netcfg::STATUS) & netcfg::S_LINK_UP != 0;
        let (mut speed, mut full) = (0, true);
        if self.features & feature::NET_SPEED_DUPLEX != 0 {
            let s = cfg.read32(netcfg::SPEED);
            speed = if s == u32::MAX { 0 } else { s };
            full = cfg.read8(netcfg::DUPLEX) != 0;
        }
        Link {
            up: up && !self.gone(),
            speed_mbps: speed,
            full_duplex: full,
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if !self.stop() {
            log::warn!("{}: device did not reset at close", self.name);
        }
        if let Some(d) = &self.device {
            if let Err(e) = d.disable_bus_master() {
                log::warn!("{}: disabling bus mastering failed: {e}", self.name);
            }
        }
    }
}

/// Polls `done` every 100 µs until it holds or `limit` passes.
fn wait_for(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if done() {
            return true;
        }
        if start.elapsed() > limit {
            return done();
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// The structures of a modern virtio PCI device, mapped.
#[derive(Debug, Clone)]
pub struct Transport {
    /// The common configuration structure.
    pub common: Mmio,
    /// The notification area.
    pub notify: Mmio,
    /// `notify_off_multiplier`.
    pub notify_off_multiplier: u32,
    /// The device-specific configuration.
    pub device: Option<Mmio>,
}

impl Transport {
    /// Finds the capabilities of `device` in its configuration space and maps the BARs they
    /// name (§4.1.4).
    pub fn map(device: &Device) -> Result<Self> {
        let name = device.bdf().to_string();
        let mut cfg = [0u8; 256];
        device.config_read(0, &mut cfg)?;
        let caps: Caps = pci::parse_caps(&cfg).ok_or_else(|| NicError::Virtio {
            port: name.clone(),
            why: "no modern VIRTIO capabilities (common and notify configuration) in its configuration space: a legacy-only device".into(),
        })?;
        let mut bars: Vec<(u8, Mmio)> = Vec::new();
        let mut window = |loc: pci::CapLoc, min: usize| -> Result<Mmio> {
            let bar = match bars.iter().find(|(b, _)| *b == loc.bar) {
                Some((_, m)) => m.clone(),
                None => {
                    let m = crate::mem::map_bar(device, loc.bar as u32)?;
                    bars.push((loc.bar, m.clone()));
                    m
                }
            };
            let len = (loc.length as usize).max(min);
            bar.window(loc.offset as usize, len)
                .map_err(|e| NicError::Virtio {
                    port: name.clone(),
                    why: format!("a capability points outside BAR{}: {e}", loc.bar),
                })
        };
        Ok(Transport {
            common: window(caps.common, common::LEN)?,
            notify: window(caps.notify, 2)?,
            notify_off_multiplier: caps.notify_off_multiplier,
            device: caps.device.map(|d| window(d, 0)).transpose()?,
        })
    }
}

/// Whether the configuration space `cfg` (its first 256 bytes) has the modern capabilities.
pub fn has_modern_caps(cfg: &[u8]) -> bool {
    pci::parse_caps(cfg).is_some()
}

/// The control path of a virtio-net device: link and address. The queues are [`VirtioRx`] and
/// [`VirtioTx`].
pub struct VirtioNet {
    shared: Arc<Shared>,
    info: PortInfo,
    promiscuous: bool,
}

impl std::fmt::Debug for VirtioNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VirtioNet")
            .field("info", &self.info)
            .field("features", &format_args!("{:#x}", self.shared.features))
            .finish_non_exhaustive()
    }
}

impl VirtioNet {
    /// Brings up the virtio-net `device` (opened through VFIO): enables bus mastering, maps the
    /// structures its capabilities name, initializes it (§3.1.1) with receive buffers from
    /// `pool`, waits for the link.
    pub fn open(
        device: Device,
        dma: &DmaContext,
        pool: &Mempool,
        opts: &PortOptions,
    ) -> Result<(VirtioNet, VirtioRx, VirtioTx)> {
        // Per-queue vectors are MSI-X only (a virtio device without it interrupts through
        // the ISR and INTx, which this driver does not use).
        let irq = if opts.completion.interrupts() {
            Some(PortIrq::enable(&device, false)?)
        } else {
            None
        };
        device.enable_bus_master()?;
        let t = Transport::map(&device)?;
        let name = device.bdf().to_string();
        Self::bring_up(t, name, Some(device), irq, dma, pool, opts)
    }

    /// Brings up the device whose structures are `t` (a device model's), named `name`.
    pub fn new(
        t: Transport,
        name: &str,
        dma: &DmaContext,
        pool: &Mempool,
        opts: &PortOptions,
    ) -> Result<(VirtioNet, VirtioRx, VirtioTx)> {
        Self::bring_up(t, name.to_owned(), None, None, dma, pool, opts)
    }

    /// [`VirtioNet::new`] for a device model that signals `fd` for MSI-X vector 0 (the
    /// receive queue's); `opts.completion` must be
    /// [`CompletionMode::Irq`](crate::CompletionMode::Irq) or `Hybrid`.
    pub fn new_with_interrupt(
        t: Transport,
        name: &str,
        dma: &DmaContext,
        pool: &Mempool,
        opts: &PortOptions,
        fd: EventFd,
    ) -> Result<(VirtioNet, VirtioRx, VirtioTx)> {
        if !opts.completion.interrupts() {
            return Err(NicError::InvalidOption(format!(
                "{name}: an interrupt was given but PortOptions::completion is {}: use Irq or Hybrid",
                opts.completion
            )));
        }
        let irq = PortIrq::supplied(fd, IrqKind::Msix);
        Self::bring_up(t, name.to_owned(), None, Some(irq), dma, pool, opts)
    }

    /// [`VirtioNet::open`] as a device-independent [`Port`].
    pub fn open_port(device: Device, dma: &DmaContext, pool: &Mempool, opts: &PortOptions) -> Result<Port> {
        let (c, r, t) = Self::open(device, dma, pool, opts)?;
        Ok(Port::from_parts(Box::new(c), Box::new(r), Box::new(t)))
    }

    fn bring_up(
        t: Transport,
        name: String,
        device: Option<Device>,
        irq: Option<PortIrq>,
        dma: &DmaContext,
        pool: &Mempool,
        opts: &PortOptions,
    ) -> Result<(VirtioNet, VirtioRx, VirtioTx)> {
        for (what, n) in [("rx_entries", opts.rx_entries), ("tx_entries", opts.tx_entries)] {
            if !(8..=4096).contains(&n) {
                return Err(NicError::InvalidOption(format!(
                    "{what} = {n}: use 8 to 4096 (a virtqueue takes the largest power of two not above it and the device's maximum)"
                )));
            }
        }
        if pool.buf_size() < MIN_BUF_SIZE {
            return Err(NicError::BufferTooSmall {
                buf_size: pool.buf_size(),
                min: MIN_BUF_SIZE,
                device: "virtio-net",
            });
        }
        let c = &t.common;
        let fail = |why: String| NicError::Virtio {
            port: name.clone(),
            why,
        };
        if c.read8(common::DEVICE_STATUS) == u8::MAX {
            return Err(NicError::DeviceGone { port: name });
        }
        // §3.1.1 step 1: reset.
        c.write8(common::DEVICE_STATUS, 0);
        if !wait_for(Duration::from_millis(100), || c.read8(common::DEVICE_STATUS) == 0) {
            return Err(NicError::InitTimeout {
                port: name,
                step: "virtio device reset (device_status reads 0)",
                limit: Duration::from_millis(100),
            });
        }
        // Steps 2-3.
        let mut st = status::ACKNOWLEDGE;
        c.write8(common::DEVICE_STATUS, st);
        st |= status::DRIVER;
        c.write8(common::DEVICE_STATUS, st);
        // Step 4: features.
        let mut offered = 0u64;
        for sel in 0..2u32 {
            c.write32(common::DEVICE_FEATURE_SELECT, sel);
            offered |= (c.read32(common::DEVICE_FEATURE) as u64) << (32 * sel);
        }
        for (bit, what) in [
            (feature::VERSION_1, "VIRTIO_F_VERSION_1"),
            (feature::NET_MAC, "VIRTIO_NET_F_MAC"),
        ] {
            if offered & bit == 0 {
                c.write8(common::DEVICE_STATUS, st | status::FAILED);
                return Err(fail(format!(
                    "the device does not offer {what} (features {offered:#x})"
                )));
            }
        }
        let features = offered & feature::WANTED;
        for sel in 0..2u32 {
            c.write32(common::DRIVER_FEATURE_SELECT, sel);
            c.write32(common::DRIVER_FEATURE, (features >> (32 * sel)) as u32);
        }
        // Steps 5-6.
        st |= status::FEATURES_OK;
        c.write8(common::DEVICE_STATUS, st);
        if c.read8(common::DEVICE_STATUS) & status::FEATURES_OK == 0 {
            c.write8(common::DEVICE_STATUS, st | status::FAILED);
            return Err(fail(format!(
                "the device did not accept features {features:#x} (FEATURES_OK clear)"
            )));
        }
        // Step 7: device-specific set-up.
        if c.read16(common::NUM_QUEUES) < 2 {
            return Err(fail("the device has fewer than two virtqueues".into()));
        }
        c.write16(common::CONFIG_MSIX_VECTOR, pci::NO_VECTOR);
        let mac = match &t.device {
            Some(cfg) => read_mac(c, cfg),
            None => return Err(fail("no device configuration capability (no MAC address)".into())),
        };
        let shared = Arc::new(Shared {
            name: name.clone(),
            common: t.common.clone(),
            devcfg: t.device.clone(),
            features,
            stopped: AtomicBool::new(false),
            stop_lock: Mutex::new(()),
            irq,
            device,
        });
        let (rx_size, rx_notify) = select_queue(&t, RX_QUEUE, opts.rx_entries).map_err(fail)?;
        if shared.irq.is_some() {
            // §4.1.5.1.2: the device answers NO_VECTOR when it cannot use the vector.
            c.write16(common::QUEUE_MSIX_VECTOR, RX_VECTOR);
            let v = c.read16(common::QUEUE_MSIX_VECTOR);
            if v != RX_VECTOR {
                c.write8(common::DEVICE_STATUS, st | status::FAILED);
                return Err(fail(format!(
                    "the device refused MSI-X vector {RX_VECTOR} for the receive queue (queue_msix_vector reads {v:#06x}): open it with CompletionMode::Poll"
                )));
            }
        }
        let mut rx = VirtioRx::new(&shared, dma, pool, rx_size, opts.page_size, rx_notify)?;
        rx.set_completion(opts.completion);
        enable_queue(c, rx.ring().areas());
        let (tx_size, tx_notify) = select_queue(&t, TX_QUEUE, opts.tx_entries).map_err(fail)?;
        let tx = VirtioTx::new(&shared, dma, tx_size, opts.page_size, tx_notify)?;
        enable_queue(c, tx.ring().areas());
        // Step 8.
        st |= status::DRIVER_OK;
        c.write8(common::DEVICE_STATUS, st);
        let s = c.read8(common::DEVICE_STATUS);
        if s & status::DEVICE_NEEDS_RESET != 0 || s & status::DRIVER_OK == 0 {
            return Err(fail(format!("device status {s:#04x} after DRIVER_OK")));
        }
        rx.start();
        let dev = VirtioNet {
            info: PortInfo {
                name,
                driver: DRIVER,
                mac,
            },
            shared,
            promiscuous: opts.promiscuous,
        };
        let link = dev.wait_link(opts.link_timeout)?;
        log::info!(
            "{}: {DRIVER}, MAC {mac}, features {features:#x}, queues {rx_size}/{tx_size}, link {link}",
            dev.info.name
        );
        Ok((dev, rx, tx))
    }
}

/// Reads the MAC address, again while `config_generation` changes under it (§4.1.4.3.1).
fn read_mac(common: &Mmio, cfg: &Mmio) -> MacAddr {
    loop {
        let g = common.read8(common::CONFIG_GENERATION);
        let mut m = [0u8; 6];
        for (i, b) in m.iter_mut().enumerate() {
            *b = cfg.read8(netcfg::MAC + i);
        }
        if common.read8(common::CONFIG_GENERATION) == g {
            return MacAddr(m);
        }
    }
}

/// Selects queue `q`, writes its size (the largest power of two not above `want` and the
/// device's maximum) and NO_VECTOR; returns the size and its notification register.
fn select_queue(t: &Transport, q: u16, want: u16) -> std::result::Result<(usize, Mmio), String> {
    let c = &t.common;
    c.write16(common::QUEUE_SELECT, q);
    let max = c.read16(common::QUEUE_SIZE);
    if max == 0 {
        return Err(format!("virtqueue {q} is not available"));
    }
    let size = queue_size(want, max);
    if size < 2 {
        return Err(format!("virtqueue {q} holds {max} entries, fewer than two"));
    }
    c.write16(common::QUEUE_SIZE, size);
    c.write16(common::QUEUE_MSIX_VECTOR, pci::NO_VECTOR);
    let off = c.read16(common::QUEUE_NOTIFY_OFF) as usize * t.notify_off_multiplier as usize;
    let notify = t
        .notify
        .window(off, 2)
        .map_err(|e| format!("virtqueue {q}'s notification register: {e}"))?;
    Ok((size as usize, notify))
}

/// The largest power of two (split virtqueues, §2.7) not above `want` nor `max` (both >= 1).
fn queue_size(want: u16, max: u16) -> u16 {
    1 << (15 - want.min(max).max(1).leading_zeros())
}

/// Writes the selected queue's ring addresses and enables it.
fn enable_queue(
    c: &Mmio,
    (desc, avail, used): (vfpoll_pci::BusAddr, vfpoll_pci::BusAddr, vfpoll_pci::BusAddr),
) {
    for (off, a) in [
        (common::QUEUE_DESC, desc),
        (common::QUEUE_DRIVER, avail),
        (common::QUEUE_DEVICE, used),
    ] {
        // Two 32-bit stores: §4.1.3.1 lets the driver access 64-bit fields as two halves.
        c.write32(off, a.get() as u32);
        c.write32(off + 4, (a.get() >> 32) as u32);
    }
    c.write16(common::QUEUE_ENABLE, 1);
}

impl NicControl for VirtioNet {
    fn info(&self) -> &PortInfo {
        &self.info
    }

    fn link(&self) -> Link {
        self.shared.link()
    }

    fn device_gone(&self) -> bool {
        self.shared.gone()
    }

    fn set_promiscuous(&mut self, on: bool) {
        self.promiscuous = on;
    }

    fn promiscuous(&self) -> bool {
        self.promiscuous
    }

    fn stats(&self) -> PortStats {
        PortStats::default()
    }
}

#[cfg(test)]
mod tests {
    use super::queue_size;

    #[test]
    fn queue_sizes_are_powers_of_two() {
        assert_eq!(queue_size(512, 256), 256);
        assert_eq!(queue_size(200, 1024), 128);
        assert_eq!(queue_size(8, 256), 8);
        assert_eq!(queue_size(4096, 32768), 4096);
        assert_eq!(queue_size(1, 256), 1);
    }
}
