//! Intel 82574L (PCI 8086:10d3; QEMU's `e1000e`), written from the Intel 82574 GbE Controller
//! Family Datasheet (317694). One receive and one transmit queue (queue 0), legacy descriptors,
//! polling only: every interrupt stays masked.
//!
//! Bring-up ([`E1000e::open`]) follows the datasheet's software initialization sequence (§4.6):
//! mask interrupts (§4.6.1); stop the receiver and transmitter; global reset (§4.6.2:
//! CTRL.GIO_MASTER_DISABLE, wait for STATUS.GIO_MASTER_EN to clear, CTRL.RST, wait for it to
//! clear and for the NVM auto-read); mask interrupts again; link set-up for the internal copper
//! PHY with auto-negotiation (§4.6.3: CTRL.SLU, no forced speed or duplex); clear the statistics
//! by reading them (§4.6.4); program the receive address from RAL0/RAH0 (or the NVM); receive
//! initialization (§4.6.5: ring registers, buffers, RCTL, tail); transmit initialization
//! (§4.6.6: ring registers, TXDCTL, TIPG, TCTL); wait for STATUS.LU.
//!
//! Registers that a previous driver may have left set and that change the descriptor format or
//! the data path are written explicitly, since QEMU's CTRL.RST does not restore them: RFCTL
//! (extended descriptors), RXCSUM, MRQC (RSS), CTRL.VME (VLAN stripping), the interrupt delay
//! timers.

mod desc;
pub mod regs;
mod rx;
mod tx;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use vfpoll_dma::DmaContext;
use vfpoll_pci::mmio::Mmio;
use vfpoll_pci::vfio::{Device, EventFd};

use crate::error::{NicError, Result};
use crate::irq::{IrqKind, PortIrq};
use crate::mac::MacAddr;
use crate::pool::{Mempool, DEFAULT_BUF_SIZE};
use crate::port::{Link, NicControl, Port, PortInfo, PortOptions};
use crate::stats::PortStats;
pub use desc::{tx_fields, tx_hi, RxErrors, RxStatus, RxWriteBack, TxCmd, TX_DD, TX_MAX_LEN};
use regs::{off, stat, Ctrl, Rctl, Status, Tctl};
pub use rx::E1000eRx;
pub use tx::E1000eTx;

/// Intel's PCI vendor ID.
pub const VENDOR_INTEL: u16 = 0x8086;
/// The 82574L's PCI device ID.
pub const DEVICE_82574L: u16 = 0x10d3;
/// The driver's name.
pub const DRIVER: &str = "e1000e (Intel 82574L)";
/// The receive buffer size the driver programs (RCTL.BSIZE = 00, BSEX = 0).
pub const RX_BUF_SIZE: usize = DEFAULT_BUF_SIZE;

/// What the control path and the queues of one device share.
pub(crate) struct Shared {
    pub(crate) bar: Mmio,
    pub(crate) name: String,
    /// Serializes read-modify-write of CTRL, RCTL and TCTL between the control path and the
    /// queues' teardown (they may live on different threads).
    ctl: Mutex<()>,
    /// Counters accumulated from the clear-on-read statistics registers.
    hw: Mutex<PortStats>,
    /// The receive queue's interrupt (interrupt mode only); disabled before the device goes.
    pub(crate) irq: Option<PortIrq>,
    /// The VFIO device, `None` for a device model; dropped last, after bus mastering is off.
    device: Option<Device>,
}

impl Shared {
    pub(crate) fn ctl(&self) -> MutexGuard<'_, ()> {
        self.ctl.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the registers read all ones (device gone).
    pub(crate) fn gone(&self) -> bool {
        self.bar.read32(off::STATUS) == u32::MAX
    }

    /// Reads every statistics register (which clears them) and returns the counts.
    ///
    /// QEMU 7.2 copies TPR into GPRC, TOR into GORC, TPT into GPTC and TOT into GOTC at each
    /// frame instead of counting them separately, so the total counters are read (and cleared)
    /// too; on hardware that only costs a few register reads.
    fn read_counters(&self) -> PortStats {
        let b = &self.bar;
        let r = |o| b.read32(o) as u64;
        let r64 = |lo, hi| {
            let l = b.read32(lo) as u64;
            l | (b.read32(hi) as u64) << 32
        };
        let s = PortStats {
            rx_packets: r(stat::GPRC),
            rx_bytes: r64(stat::GORCL, stat::GORCH),
            rx_broadcast: r(stat::BPRC),
            rx_multicast: r(stat::MPRC),
            rx_missed: r(stat::MPC),
            rx_no_buffer: r(stat::RNBC),
            rx_crc_errors: r(stat::CRCERRS),
            rx_errors: r(stat::RXERRC),
            rx_length_errors: r(stat::RUC) + r(stat::ROC) + r(stat::RFC) + r(stat::RJC),
            tx_packets: r(stat::GPTC),
            tx_bytes: r64(stat::GOTCL, stat::GOTCH),
            tx_broadcast: r(stat::BPTC),
            tx_multicast: r(stat::MPTC),
        };
        let _ = (r(stat::TPR), r(stat::TPT), r64(stat::TORL, stat::TORH));
        let _ = r64(stat::TOTL, stat::TOTH);
        s
    }

    fn link(&self) -> Link {
        let s = Status::from_bits_retain(self.bar.read32(off::STATUS));
        Link {
            up: s.bits() != u32::MAX && s.contains(Status::LU),
            speed_mbps: s.speed_mbps(),
            full_duplex: s.contains(Status::FD),
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if self.irq.is_some() && !self.gone() {
            self.bar.write32(off::IMC, u32::MAX);
        }
        if let Some(d) = &self.device {
            // The queues are gone (they hold this `Arc`), so nothing should be in flight; turn
            // bus mastering off so the device cannot reach memory that is about to be freed.
            if let Err(e) = d.disable_bus_master() {
                log::warn!("{}: disabling bus mastering failed: {e}", self.name);
            }
        }
    }
}

/// How long a register handshake (MDIC, EERD, CTRL.RST, EEC.Auto_RD) may take. The device
/// answers in microseconds to a few milliseconds (Linux's e1000e allows ~32 ms for MDIC and
/// ~500 ms for EERD); the generous limit only matters when the device does not answer at all,
/// and keeps an emulated device on a loaded host (a starved emulation thread) from failing.
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(1);

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

/// Interrupt set-up for interrupt mode (every cause stays masked in IMS until the receive
/// queue arms, see [`crate::irq`]). MSI-X (§7.4, as Linux's `e1000_configure_msix`): IVAR
/// routes RX queue 0 to vector 0 and leaves TX queue 0 and the other causes invalid; EIAC
/// clears the RxQ0 cause from ICR when its message is sent, and IAM with CTRL_EXT.EIAME masks
/// it (QEMU masks EIAC's causes whenever CTRL_EXT.IAME is clear), so one message per arm;
/// PBA_support clears the vector's pending bit when IMS unmasks it. MSI uses the RXT0 cause
/// and needs none of this.
fn program_interrupts(bar: &Mmio, kind: IrqKind) {
    use regs::intr;
    bar.write32(off::IMC, u32::MAX);
    if kind == IrqKind::Msix {
        bar.write32(off::IVAR, intr::ivar_rx_only(0));
        let ext = bar.read32(off::CTRL_EXT) & !intr::CTRL_EXT_IAME;
        bar.write32(off::CTRL_EXT, ext | intr::CTRL_EXT_EIAME | intr::CTRL_EXT_PBA_CLR);
        bar.write32(off::EIAC, intr::RXQ0);
        bar.write32(off::IAM, intr::RXQ0);
    }
    // Causes from bring-up (link, transmit) must not fire at the first arm.
    bar.write32(off::ICR, u32::MAX);
}

/// The control path of an 82574: link, receive filter, counters. The queues are
/// [`E1000eRx`] and [`E1000eTx`].
pub struct E1000e {
    shared: Arc<Shared>,
    info: PortInfo,
    promiscuous: bool,
}

impl std::fmt::Debug for E1000e {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("E1000e")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

impl E1000e {
    /// Brings up the 82574 `device` (opened through VFIO): enables bus mastering, maps BAR0,
    /// initializes the device and its two rings with buffers from `pool`, waits for the link.
    pub fn open(
        device: Device,
        dma: &DmaContext,
        pool: &Mempool,
        opts: &PortOptions,
    ) -> Result<(E1000e, E1000eRx, E1000eTx)> {
        // The vector first: an 82574 without MSI-X uses MSI, and one without either cannot
        // sleep, which is better said before the device is touched.
        let irq = if opts.completion.interrupts() {
            Some(PortIrq::enable(&device, true)?)
        } else {
            None
        };
        device.enable_bus_master()?;
        let bar = crate::mem::map_bar(&device, 0)?;
        let name = device.bdf().to_string();
        Self::bring_up(bar, name, Some(device), irq, dma, pool, opts)
    }

    /// Brings up the 82574 whose BAR0 is `bar` (a device model's), named `name` in messages.
    pub fn new(
        bar: Mmio,
        name: &str,
        dma: &DmaContext,
        pool: &Mempool,
        opts: &PortOptions,
    ) -> Result<(E1000e, E1000eRx, E1000eTx)> {
        Self::bring_up(bar, name.to_owned(), None, None, dma, pool, opts)
    }

    /// [`E1000e::new`] for a device model that delivers the receive queue's interrupt
    /// (`kind`: MSI-X vector 0, or MSI) by signalling `fd`; `opts.completion` must be
    /// [`CompletionMode::Irq`](crate::CompletionMode::Irq) or `Hybrid`.
    pub fn new_with_interrupt(
        bar: Mmio,
        name: &str,
        dma: &DmaContext,
        pool: &Mempool,
        opts: &PortOptions,
        fd: EventFd,
        kind: IrqKind,
    ) -> Result<(E1000e, E1000eRx, E1000eTx)> {
        if !opts.completion.interrupts() {
            return Err(NicError::InvalidOption(format!(
                "{name}: an interrupt was given but PortOptions::completion is {}: use Irq or Hybrid",
                opts.completion
            )));
        }
        let irq = PortIrq::supplied(fd, kind);
        Self::bring_up(bar, name.to_owned(), None, Some(irq), dma, pool, opts)
    }

    /// [`E1000e::open`] as a device-independent [`Port`].
    pub fn open_port(device: Device, dma: &DmaContext, pool: &Mempool, opts: &PortOptions) -> Result<Port> {
        let (c, r, t) = Self::open(device, dma, pool, opts)?;
        Ok(Port::from_parts(Box::new(c), Box::new(r), Box::new(t)))
    }

    fn bring_up(
        bar: Mmio,
        name: String,
        device: Option<Device>,
        irq: Option<PortIrq>,
        dma: &DmaContext,
        pool: &Mempool,
        opts: &PortOptions,
    ) -> Result<(E1000e, E1000eRx, E1000eTx)> {
        for (what, n) in [("rx_entries", opts.rx_entries), ("tx_entries", opts.tx_entries)] {
            if !(8..=4096).contains(&n) || n % 8 != 0 {
                return Err(NicError::InvalidOption(format!(
                    "{what} = {n}: the 82574's ring length is a multiple of 128 bytes, so use a multiple of 8 descriptors from 8 to 4096"
                )));
            }
        }
        if pool.buf_size() < RX_BUF_SIZE {
            return Err(NicError::BufferTooSmall {
                buf_size: pool.buf_size(),
                min: RX_BUF_SIZE,
                device: "82574",
            });
        }
        if pool.available() < opts.rx_entries as usize {
            return Err(NicError::PoolExhausted {
                what: "the receive ring",
                need: opts.rx_entries as usize,
                available: pool.available(),
                capacity: pool.capacity(),
            });
        }
        if bar.read32(off::STATUS) == u32::MAX {
            return Err(NicError::DeviceGone { port: name });
        }
        let timeout = |step, limit| NicError::InitTimeout {
            port: name.clone(),
            step,
            limit,
        };

        // §4.6.1: no interrupts (interrupt mode unmasks RX queue 0's only while it sleeps).
        bar.write32(off::IMC, u32::MAX);
        // Stop reception and transmission and let DMA in progress finish (as Linux's e1000e
        // does before a reset).
        bar.write32(off::RCTL, 0);
        bar.write32(off::TCTL, Tctl::PSP.bits());
        let _ = bar.read32(off::STATUS);
        std::thread::sleep(Duration::from_millis(10));

        // §4.6.2: global reset. Stop master requests first so the reset cannot cut a DMA.
        let ctrl = Ctrl::from_bits_retain(bar.read32(off::CTRL));
        bar.write32(off::CTRL, (ctrl | Ctrl::GIO_MASTER_DISABLE).bits());
        let status = || Status::from_bits_retain(bar.read32(off::STATUS));
        if !wait_for(Duration::from_millis(800), || {
            !status().contains(Status::GIO_MASTER_EN)
        }) {
            log::warn!("{name}: master requests still pending after 800 ms; resetting anyway");
        }
        bar.write32(off::CTRL, (ctrl | Ctrl::GIO_MASTER_DISABLE | Ctrl::RST).bits());
        // The datasheet asks for a pause before the next register access after CTRL.RST.
        std::thread::sleep(Duration::from_millis(1));
        let reset_done = || !Ctrl::from_bits_retain(bar.read32(off::CTRL)).contains(Ctrl::RST);
        if !wait_for(HANDSHAKE_LIMIT, reset_done) {
            return Err(timeout("device reset (CTRL.RST)", HANDSHAKE_LIMIT));
        }
        let nvm_done = || bar.read32(off::EEC) & regs::EEC_AUTO_RD != 0;
        if !wait_for(HANDSHAKE_LIMIT, nvm_done) {
            return Err(timeout(
                "NVM auto-read after reset (EEC.Auto_RD)",
                HANDSHAKE_LIMIT,
            ));
        }
        bar.write32(off::IMC, u32::MAX);
        let _ = bar.read32(off::ICR);

        // §4.6.3: internal copper PHY with auto-negotiation: set link up, let the PHY decide
        // speed and duplex. No VLAN stripping, no master disable left over.
        let ctrl = Ctrl::from_bits_retain(bar.read32(off::CTRL));
        let ctrl = (ctrl | Ctrl::SLU)
            - (Ctrl::FRCSPD
                | Ctrl::FRCDPLX
                | Ctrl::VME
                | Ctrl::PHY_RST
                | Ctrl::RST
                | Ctrl::GIO_MASTER_DISABLE);
        bar.write32(off::CTRL, ctrl.bits());

        let shared = Arc::new(Shared {
            bar,
            name,
            ctl: Mutex::new(()),
            hw: Mutex::new(PortStats::default()),
            irq,
            device,
        });
        // §4.6.4: the statistics registers clear on read; start from zero.
        let _ = shared.read_counters();
        let mac = Self::program_address(&shared)?;

        let bar = &shared.bar;
        // Polling: no interrupt moderation or delays. Legacy descriptors, no receive offloads,
        // no RSS (all of which a previous driver may have turned on).
        for r in [
            off::ITR,
            off::RDTR,
            off::RADV,
            off::TADV,
            off::RXCSUM,
            off::RFCTL,
            off::MRQC,
        ] {
            bar.write32(r, 0);
        }

        if let Some(irq) = &shared.irq {
            program_interrupts(bar, irq.kind);
        }

        // §4.6.5 and §4.6.6: the rings.
        let mut rx = E1000eRx::new(&shared, dma, pool, opts.rx_entries as usize, opts.page_size)?;
        rx.set_completion(opts.completion);
        let tx = E1000eTx::new(&shared, dma, opts.tx_entries as usize, opts.page_size)?;
        let mut dev = E1000e {
            info: PortInfo {
                name: shared.name.clone(),
                driver: DRIVER,
                mac,
            },
            shared,
            promiscuous: opts.promiscuous,
        };
        dev.write_rctl(true);
        rx.start();
        let bar = &dev.shared.bar;
        bar.write32(off::TXDCTL, regs::TXDCTL_VALUE);
        bar.write32(off::TARC0, bar.read32(off::TARC0) | regs::TARC_ENABLE);
        bar.write32(off::TIPG, regs::TIPG_COPPER);
        bar.write32(off::TCTL, Tctl::enabled().bits());

        let link = dev.wait_link(opts.link_timeout)?;
        log::info!("{}: {DRIVER}, MAC {mac}, link {link}", dev.info.name);
        Ok((dev, rx, tx))
    }

    /// Reads the station address from RAL0/RAH0, where the reset loads it from the NVM; falls
    /// back to NVM words 0-2 through EERD when the entry is not valid. Clears the other receive
    /// address entries and the multicast table.
    fn program_address(shared: &Shared) -> Result<MacAddr> {
        let bar = &shared.bar;
        let rah = bar.read32(off::RAH0);
        let mut mac = MacAddr::from_ral_rah(bar.read32(off::RAL0), rah);
        if rah & (1 << 31) == 0 || !mac.is_unicast() {
            let mut o = [0u8; 6];
            for w in 0..3u32 {
                bar.write32(off::EERD, regs::eerd::START | w << regs::eerd::ADDR_SHIFT);
                let done = || bar.read32(off::EERD) & regs::eerd::DONE != 0;
                if !wait_for(HANDSHAKE_LIMIT, done) {
                    return Err(NicError::InitTimeout {
                        port: shared.name.clone(),
                        step: "reading the MAC address from the NVM (EERD)",
                        limit: HANDSHAKE_LIMIT,
                    });
                }
                let word = (bar.read32(off::EERD) >> regs::eerd::DATA_SHIFT) as u16;
                o[2 * w as usize..2 * w as usize + 2].copy_from_slice(&word.to_le_bytes());
            }
            mac = MacAddr(o);
            log::debug!("{}: RAL0/RAH0 not valid; MAC {mac} from the NVM", shared.name);
        }
        let (ral, rah) = mac.to_ral_rah();
        bar.write32(off::RAL0, ral);
        bar.write32(off::RAH0, rah | 1 << 31);
        for i in 1..16 {
            bar.write32(off::RAL0 + 8 * i, 0);
            bar.write32(off::RAH0 + 8 * i, 0);
        }
        for i in 0..128 {
            bar.write32(off::MTA + 4 * i, 0);
        }
        Ok(mac)
    }

    /// RCTL: 2048-byte buffers, broadcasts accepted, CRC stripped, no loopback, no long packets
    /// (so every frame fits one buffer), promiscuous bits as set.
    fn rctl(&self, enable: bool) -> u32 {
        let mut r = Rctl::BAM | Rctl::SECRC;
        if enable {
            r |= Rctl::EN;
        }
        if self.promiscuous {
            r |= Rctl::UPE | Rctl::MPE;
        }
        r.bits()
    }

    fn write_rctl(&mut self, enable: bool) {
        let _g = self.shared.ctl();
        self.shared.bar.write32(off::RCTL, self.rctl(enable));
    }

    /// Restarts PHY auto-negotiation (IEEE 802.3 clause 22 control register, through MDIC): the
    /// link goes down until the negotiation completes. For tests of link handling.
    pub fn restart_autoneg(&self) -> Result<()> {
        let bar = &self.shared.bar;
        let phy = regs::mdic::PHY_ADDR << regs::mdic::PHY_SHIFT;
        let reg = regs::phy::CTRL << regs::mdic::REG_SHIFT;
        let mdic_wait = || {
            let mut v = 0;
            let ok = wait_for(HANDSHAKE_LIMIT, || {
                v = bar.read32(off::MDIC);
                v & regs::mdic::READY != 0
            });
            (ok && v & regs::mdic::ERROR == 0).then_some(v)
        };
        let fail = || NicError::InitTimeout {
            port: self.shared.name.clone(),
            step: "PHY register access (MDIC)",
            limit: HANDSHAKE_LIMIT,
        };
        bar.write32(off::MDIC, phy | reg | regs::mdic::OP_READ);
        let ctrl = (mdic_wait().ok_or_else(fail)? & regs::mdic::DATA) as u16;
        let new = ctrl | regs::phy::CTRL_AN_ENABLE | regs::phy::CTRL_RESTART_AN;
        bar.write32(off::MDIC, phy | reg | regs::mdic::OP_WRITE | new as u32);
        mdic_wait().ok_or_else(fail)?;
        Ok(())
    }
}

impl NicControl for E1000e {
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
        let _g = self.shared.ctl();
        // Keep EN as it is: the receive queue clears it when it is dropped.
        let enabled = Rctl::from_bits_retain(self.shared.bar.read32(off::RCTL)).contains(Rctl::EN);
        self.shared.bar.write32(off::RCTL, self.rctl(enabled));
    }

    fn promiscuous(&self) -> bool {
        self.promiscuous
    }

    fn stats(&self) -> PortStats {
        let mut acc = self.shared.hw.lock().unwrap_or_else(|e| e.into_inner());
        let d = self.shared.read_counters();
        let a = &mut *acc;
        a.rx_packets += d.rx_packets;
        a.rx_bytes += d.rx_bytes;
        a.rx_broadcast += d.rx_broadcast;
        a.rx_multicast += d.rx_multicast;
        a.rx_missed += d.rx_missed;
        a.rx_no_buffer += d.rx_no_buffer;
        a.rx_crc_errors += d.rx_crc_errors;
        a.rx_errors += d.rx_errors;
        a.rx_length_errors += d.rx_length_errors;
        a.tx_packets += d.tx_packets;
        a.tx_bytes += d.tx_bytes;
        a.tx_broadcast += d.tx_broadcast;
        a.tx_multicast += d.tx_multicast;
        *a
    }
}
