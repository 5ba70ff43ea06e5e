//! An in-process model of the 82574's descriptor-ring protocol, for testing and benchmarking
//! `vfpoll-nic` without QEMU.
//!
//! A thread polls the registers of an anonymous "BAR0" ([`vfpoll_pci::mmio::anonymous`]) the
//! way the device's DMA engines do: CTRL.RST (self-clearing reset), RCTL/TCTL.EN, the ring
//! registers and the tails. Transmit: every descriptor from head to tail is read, its frame
//! copied out (or only counted), DD written back when RS asks for it, the head advanced.
//! Receive: queued frames (or an endless generator) are copied into the buffers of the
//! descriptors from head to tail, written back with DD | EOP, the head advanced; when the ring
//! has no free descriptor the frames wait (no drops, so tests are deterministic). DMA goes
//! through [`FakeMapper::translate`], the simulated IOMMU: an address the driver never mapped
//! (including the unmapped guard page `vfpoll-dma` leaves after every mapping, so running past
//! the end of a buffer counts too) is a protocol violation. The model behaves as a device
//! behind an IOMMU does (the access is dropped, the descriptor still completes), and records
//! the violation; dropping the model fails the test that caused it (it panics with every
//! violation's message) unless the test took them with [`NicModel::take_violations`]. The
//! check is in `Drop`, so no test can forget it.
//!
//! Also modelled: STATUS.LU under test control, MDIC PHY control with restart
//! auto-negotiation (the link drops for [`AUTONEG_TIME`]), RAL0/RAH0 from the reset, EEC.Auto_RD.
//! Interrupts (after [`NicModel::set_interrupts`]): IMS/IMC/ICR writes are taken as the
//! device takes them (set, clear, write-1-to-clear; the model swaps each word back to 0), a
//! received frame sets the receive cause (RXQ0 in MSI-X mode, routed through IVAR; RXT0 with
//! MSI), and a cause that becomes both set and unmasked signals the vector's eventfd, after
//! which MSI-X applies EIAC (auto-clear) and, with CTRL_EXT.EIAME, IAM (auto-mask).
//! Not modelled: statistics registers (read 0), filters (every frame is received).
//!
//! All `unsafe` here is DMA through translated pointers: raw, volatile or copy accesses, never
//! references. The driver keeps the memory mapped while the rings are live (the contract real
//! hardware imposes too), and the mapper refuses unmapped ranges.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::ptr;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vfpoll_dma::{DmaContext, FakeMapper};
use vfpoll_nic::e1000e::regs::{intr, off, Ctrl, Rctl, Status, Tctl, EEC_AUTO_RD};
use vfpoll_nic::e1000e::{tx_fields, RxErrors, RxStatus, RxWriteBack, TxCmd, TX_DD};
use vfpoll_nic::MacAddr;
use vfpoll_pci::mmio::{self, Mmio};
use vfpoll_pci::vfio::EventFd;
use vfpoll_pci::BusAddr;

/// How long the link stays down after a restart of auto-negotiation (unless held down by
/// [`NicModel::hold_autoneg`]).
pub const AUTONEG_TIME: Duration = Duration::from_millis(300);

/// Bound on waits for the model's thread: reaching it means a hang, not a slow machine.
pub const HANG: Duration = Duration::from_secs(30);

/// A frame to receive.
#[derive(Debug, Clone)]
pub struct RxFrame {
    pub data: Vec<u8>,
    /// Errors byte written back.
    pub errors: RxErrors,
    /// Deliver over two descriptors, the first `split` bytes without EOP.
    pub split: Option<usize>,
}

#[derive(Default)]
pub struct Counters {
    pub tx_frames: AtomicU64,
    pub tx_bytes: AtomicU64,
    /// Transmit descriptors with RS (status write-backs asked for).
    pub tx_rs: AtomicU64,
    pub rx_frames: AtomicU64,
    /// Times the model saw TDT move.
    pub tdt_moves: AtomicU64,
    /// Times the model saw RDT move.
    pub rdt_moves: AtomicU64,
    /// Times a frame waited because the receive ring had no free descriptor.
    pub rx_ring_full: AtomicU64,
    /// Descriptors that broke the protocol (untranslatable address, missing EOP/RS, bad length).
    pub violations: AtomicU64,
    /// Passes of the model's loop (registers, then both rings) completed.
    pub passes: AtomicU64,
    pub resets: AtomicU64,
    /// Interrupt messages sent (eventfd signals).
    pub interrupts: AtomicU64,
}

struct Shared {
    stop: AtomicBool,
    paused: AtomicBool,
    link: AtomicBool,
    /// The link comes back at this many ns after `epoch` (restart auto-negotiation); 0: not down.
    link_back: AtomicU64,
    /// Auto-negotiation does not finish while this is set.
    autoneg_hold: AtomicBool,
    /// The message of each protocol violation not yet taken by the test.
    violations: Mutex<Vec<String>>,
    epoch: Instant,
    /// Pin the model's thread to this CPU.
    cpu: Option<usize>,
    record_tx: AtomicBool,
    sent: Mutex<Vec<Vec<u8>>>,
    rx: Mutex<VecDeque<RxFrame>>,
    rx_len: AtomicUsize,
    template_version: AtomicU64,
    /// Frames of `template` still to generate (u64::MAX: endless).
    generate: AtomicU64,
    template: Mutex<Vec<u8>>,
    c: Counters,
    mac: MacAddr,
    /// Interrupt eventfds (one per vector) and whether they are MSI-X vectors, for the thread
    /// to take; see [`NicModel::set_interrupts`].
    irq: Mutex<Option<(Vec<EventFd>, bool)>>,
    irq_given: AtomicBool,
    /// The interrupt mask the device holds (IMS), for tests.
    ims: AtomicU64,
}

pub struct NicModel {
    bar: Mmio,
    pub mapper: Arc<FakeMapper>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl NicModel {
    /// Starts a model with station address `mac`; returns it and the DMA context (over the
    /// model's IOMMU) the driver must use.
    pub fn start(mac: MacAddr) -> (NicModel, DmaContext) {
        let mapper = Arc::new(FakeMapper::new());
        let dma = DmaContext::new(mapper.clone());
        (Self::start_with(mac, mapper, None), dma)
    }

    /// A model in an existing IOMMU domain (several devices in one VFIO container).
    pub fn start_on(mac: MacAddr, mapper: Arc<FakeMapper>) -> NicModel {
        Self::start_with(mac, mapper, None)
    }

    /// A model whose thread runs on `cpu` (benchmarks).
    pub fn start_with(mac: MacAddr, mapper: Arc<FakeMapper>, cpu: Option<usize>) -> NicModel {
        let bar = mmio::anonymous(128 * 1024).expect("anonymous BAR");
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            paused: AtomicBool::new(false),
            link: AtomicBool::new(true),
            link_back: AtomicU64::new(0),
            autoneg_hold: AtomicBool::new(false),
            violations: Mutex::new(Vec::new()),
            epoch: Instant::now(),
            cpu,
            record_tx: AtomicBool::new(true),
            sent: Mutex::new(Vec::new()),
            rx: Mutex::new(VecDeque::new()),
            rx_len: AtomicUsize::new(0),
            template_version: AtomicU64::new(0),
            generate: AtomicU64::new(0),
            template: Mutex::new(Vec::new()),
            c: Counters::default(),
            mac,
            irq: Mutex::new(None),
            irq_given: AtomicBool::new(false),
            ims: AtomicU64::new(0),
        });
        // Power-on state: what a reset loads, link up.
        let (ral, rah) = mac.to_ral_rah();
        bar.write32(off::RAL0, ral);
        bar.write32(off::RAH0, rah | 1 << 31);
        bar.write32(off::EEC, EEC_AUTO_RD);
        bar.write32(off::STATUS, (Status::LU | Status::FD).bits() | 2 << 6);
        let mut dev = Device {
            bar: bar.clone(),
            mapper: mapper.clone(),
            sh: shared.clone(),
            last_tdt: 0,
            last_rdt: 0,
            phy_ctrl: 0x1140,
            xlat: Vec::new(),
            template: Vec::new(),
            template_version: 0,
            irq: None,
            ims: 0,
            icr: 0,
        };
        let thread = std::thread::Builder::new()
            .name("nic-model".into())
            .spawn(move || dev.run())
            .expect("model thread");
        NicModel {
            bar,
            mapper,
            shared,
            thread: Some(thread),
        }
    }

    pub fn bar(&self) -> Mmio {
        self.bar.clone()
    }

    /// Delivers interrupts through `fds` (vector `v` signals `fds[v]`): MSI-X vectors when
    /// `msix`, else MSI (`fds[0]`). Returns once the thread has them.
    pub fn set_interrupts(&self, fds: Vec<EventFd>, msix: bool) {
        *self.shared.irq.lock().unwrap() = Some((fds, msix));
        self.shared.irq_given.store(true, Ordering::Release);
        self.settle();
    }

    /// The interrupt mask the device holds now (IMS as the device sees it), after a settled
    /// pass.
    pub fn ims(&self) -> u32 {
        self.settle();
        self.shared.ims.load(Ordering::Acquire) as u32
    }

    pub fn counters(&self) -> &Counters {
        &self.shared.c
    }

    pub fn get(&self, c: &AtomicU64) -> u64 {
        c.load(Ordering::Acquire)
    }

    pub fn inject(&self, data: Vec<u8>) {
        self.inject_frame(RxFrame {
            data,
            errors: RxErrors::empty(),
            split: None,
        });
    }

    pub fn inject_frame(&self, f: RxFrame) {
        let mut q = self.shared.rx.lock().unwrap();
        q.push_back(f);
        self.shared.rx_len.fetch_add(1, Ordering::AcqRel);
    }

    pub fn pending_rx(&self) -> usize {
        self.shared.rx.lock().unwrap().len()
    }

    /// Generates `count` copies of `template` (u64::MAX: without end) after the queued frames.
    pub fn generate(&self, template: &[u8], count: u64) {
        *self.shared.template.lock().unwrap() = template.to_vec();
        self.shared.template_version.fetch_add(1, Ordering::AcqRel);
        self.shared.generate.store(count, Ordering::Release);
    }

    pub fn stop_generating(&self) {
        self.shared.generate.store(0, Ordering::Release);
    }

    /// Whether transmitted frames are kept (for [`NicModel::take_sent`]) or only counted.
    pub fn record_tx(&self, on: bool) {
        self.shared.record_tx.store(on, Ordering::Release);
    }

    pub fn take_sent(&self) -> Vec<Vec<u8>> {
        std::mem::take(&mut *self.shared.sent.lock().unwrap())
    }

    /// Stops processing both rings (the registers still answer resets); returns once the
    /// thread has finished the pass it was in, so nothing moves on the rings after it.
    pub fn pause(&self) {
        self.shared.paused.store(true, Ordering::Release);
        self.settle();
    }

    pub fn resume(&self) {
        self.shared.paused.store(false, Ordering::Release);
    }

    /// Sets the link state; returns once STATUS shows it.
    pub fn set_link(&self, up: bool) {
        self.shared.link.store(up, Ordering::Release);
        self.settle();
    }

    /// While `on`, a restart of auto-negotiation keeps the link down (instead of for
    /// [`AUTONEG_TIME`]), so a test can look at the down state however slow its machine is;
    /// once released, the link comes back as usual.
    pub fn hold_autoneg(&self, on: bool) {
        self.shared.autoneg_hold.store(on, Ordering::Release);
        self.settle();
    }

    /// Waits until the thread has made a whole pass that began after this call: whatever was
    /// changed before the call has been acted on.
    fn settle(&self) {
        let c = &self.shared.c.passes;
        let start = self.get(c);
        // The pass in progress may have begun before the change; the one after it has not.
        self.wait("a pass of the model's loop", |m| m.get(c) >= start + 2);
    }

    /// Waits until `cond` holds (panics after [`HANG`]).
    pub fn wait(&self, what: &str, mut cond: impl FnMut(&NicModel) -> bool) {
        let start = Instant::now();
        while !cond(self) {
            assert!(start.elapsed() < HANG, "model: timed out waiting for {what}");
            assert!(
                self.thread.as_ref().is_some_and(|t| !t.is_finished()),
                "model: the thread died while waiting for {what}"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// The protocol violations so far (messages, oldest first), taken: the check at drop will
    /// not see them. For tests that break the protocol on purpose.
    pub fn take_violations(&self) -> Vec<String> {
        std::mem::take(&mut *self.shared.violations.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Drop for NicModel {
    /// Stops the thread; then fails the test (panics) if the thread panicked or if the driver
    /// broke the protocol, e.g. made the device DMA outside its mappings, and the test did not
    /// take the violations. Not while the test is already failing (a panic during a panic
    /// aborts).
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        let died = self.thread.take().is_some_and(|t| t.join().is_err());
        if std::thread::panicking() {
            return;
        }
        assert!(!died, "nic-model: the model's thread panicked");
        let v = self.take_violations();
        assert!(
            v.is_empty(),
            "nic-model: the driver broke the descriptor protocol {} time(s): {}",
            v.len(),
            v.join("; ")
        );
    }
}

/// The model's thread state.
struct Device {
    bar: Mmio,
    mapper: Arc<FakeMapper>,
    sh: Arc<Shared>,
    last_tdt: u32,
    last_rdt: u32,
    phy_ctrl: u16,
    /// Translated mappings (IOVA start, length, CPU pointer), dropped whenever the receiver and
    /// transmitter are both off (the driver frees memory only then).
    xlat: Vec<(u64, u64, *mut u8)>,
    template: Vec<u8>,
    template_version: u64,
    /// Eventfds per vector and whether they are MSI-X's.
    irq: Option<(Vec<EventFd>, bool)>,
    /// Interrupt mask and causes as the device holds them.
    ims: u32,
    icr: u32,
}

// SAFETY: the raw pointers in `xlat` point into mappings of the driver's process (this
// process) that the driver keeps alive while the rings are enabled; the cache is cleared when
// they are not. Moving them to the model's thread is the whole point: it plays the device.
unsafe impl Send for Device {}

impl Device {
    fn run(&mut self) {
        if let Some(cpu) = self.sh.cpu {
            pin_to(cpu);
        }
        let mut idle = 0u64;
        while !self.sh.stop.load(Ordering::Acquire) {
            let mut work = self.registers();
            let mut received = false;
            if !self.sh.paused.load(Ordering::Acquire) {
                work |= self.transmit();
                received = self.receive();
                work |= received;
            }
            work |= self.interrupts(received);
            let en =
                self.bar.read32(off::RCTL) & Rctl::EN.bits() | self.bar.read32(off::TCTL) & Tctl::EN.bits();
            if en == 0 {
                self.xlat.clear();
            }
            self.sh.c.passes.fetch_add(1, Ordering::AcqRel);
            if work {
                idle = 0;
            } else {
                idle += 1;
                if idle < 200_000 {
                    std::hint::spin_loop();
                } else if idle < 400_000 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
        }
    }

    /// CTRL.RST, STATUS.LU, MDIC.
    fn registers(&mut self) -> bool {
        let b = &self.bar;
        let mut work = false;
        let ctrl = b.read32(off::CTRL);
        if ctrl & Ctrl::RST.bits() != 0 {
            // Everything but PCI configuration space: rings off, heads and tails zero, the
            // receive address reloaded from the NVM.
            for r in [
                off::RCTL,
                off::TCTL,
                off::RDH,
                off::RDT,
                off::TDH,
                off::TDT,
                off::RDLEN,
                off::TDLEN,
            ] {
                b.write32(r, 0);
            }
            let (ral, rah) = self.sh.mac.to_ral_rah();
            b.write32(off::RAL0, ral);
            b.write32(off::RAH0, rah | 1 << 31);
            b.write32(off::EEC, EEC_AUTO_RD);
            self.last_tdt = 0;
            self.last_rdt = 0;
            self.sh.c.resets.fetch_add(1, Ordering::AcqRel);
            b.write32(
                off::CTRL,
                ctrl & !(Ctrl::RST.bits() | Ctrl::GIO_MASTER_DISABLE.bits()),
            );
            work = true;
        }
        let mut up = self.sh.link.load(Ordering::Acquire);
        let back = self.sh.link_back.load(Ordering::Acquire);
        if back != 0 {
            if self.sh.autoneg_hold.load(Ordering::Acquire)
                || (self.sh.epoch.elapsed().as_nanos() as u64) < back
            {
                up = false;
            } else {
                self.sh.link_back.store(0, Ordering::Release);
            }
        }
        let status = (Status::FD.bits() | 2 << 6) | if up { Status::LU.bits() } else { 0 };
        if b.read32(off::STATUS) != status {
            b.write32(off::STATUS, status);
        }
        let mdic = b.read32(off::MDIC);
        if mdic & (3 << 26) != 0 && mdic & (1 << 28) == 0 {
            let reg = (mdic >> 16) & 0x1f;
            let phy = (mdic >> 21) & 0x1f;
            let mut v = mdic;
            if phy != 1 {
                v |= 1 << 30;
            } else if mdic & (1 << 27) != 0 {
                let data = if reg == 0 { self.phy_ctrl } else { 0 };
                v = (v & !0xffff) | data as u32;
            } else if reg == 0 {
                let data = mdic as u16;
                self.phy_ctrl = data & !(1 << 9);
                if data & (1 << 9) != 0 && data & (1 << 12) != 0 {
                    let at = self.sh.epoch.elapsed() + AUTONEG_TIME;
                    self.sh.link_back.store(at.as_nanos() as u64, Ordering::Release);
                }
            }
            b.write32(off::MDIC, v | 1 << 28);
            work = true;
        }
        work
    }

    /// Takes the word at `off` and leaves 0 there: a register write the device acts on once.
    fn take_reg(&self, off: usize) -> u32 {
        let p = self.bar.as_ptr().wrapping_add(off).cast::<u32>();
        // SAFETY: `off` is a 4-aligned register offset inside the model's BAR (an anonymous
        // mapping that lives as long as `self.bar`), so `p` is valid and aligned for a u32;
        // the driver stores to it with volatile 32-bit writes, the model swaps it atomically
        // so that no write is lost between a read and the clearing store.
        let a = unsafe { AtomicU32::from_ptr(p) };
        a.swap(0, Ordering::AcqRel)
    }

    /// Interrupt registers and causes (see the module docs); true when anything was done.
    fn interrupts(&mut self, received: bool) -> bool {
        if self.irq.is_none() {
            if !self.sh.irq_given.load(Ordering::Acquire) {
                return false;
            }
            self.irq = self.sh.irq.lock().unwrap().take();
        }
        let msix = self.irq.as_ref().is_some_and(|i| i.1);
        let cause = if msix { intr::RXQ0 } else { intr::RXT0 };
        let (mut imc, mut icr_w, ims_w) = (
            self.take_reg(off::IMC),
            self.take_reg(off::ICR),
            self.take_reg(off::IMS),
        );
        if ims_w != 0 {
            // The driver may have written IMC or ICR after they were taken above and before
            // IMS (a disarm, then the next arm): the words cannot tell the order, so apply
            // them before IMS. Should the order have been the reverse, the cost is a spurious
            // interrupt, never a lost one.
            imc |= self.take_reg(off::IMC);
            icr_w |= self.take_reg(off::ICR);
        }
        self.ims &= !imc;
        self.icr &= !icr_w;
        let mut work = imc | icr_w | ims_w != 0;
        if ims_w != 0 {
            let old = self.ims & self.icr;
            self.ims |= ims_w;
            self.raise(self.ims & self.icr & !old, msix);
        }
        if received {
            let old = self.ims & self.icr;
            self.icr |= cause;
            self.raise(self.ims & self.icr & !old, msix);
            work = true;
        }
        self.sh.ims.store(self.ims as u64, Ordering::Release);
        work
    }

    /// Sends the message for newly raised causes `c`, then MSI-X's auto-clear and auto-mask.
    fn raise(&mut self, c: u32, msix: bool) {
        let b = &self.bar;
        let Some((fds, _)) = &self.irq else { return };
        if msix {
            if c & intr::RXQ0 == 0 {
                return;
            }
            let ivar = b.read32(off::IVAR) >> intr::IVAR_RXQ0_SHIFT;
            if ivar & intr::IVAR_VALID == 0 {
                return;
            }
            if let Some(fd) = fds.get((ivar & 7) as usize) {
                // Counted first: the woken test may look at once.
                self.sh.c.interrupts.fetch_add(1, Ordering::AcqRel);
                fd.signal().expect("signal the eventfd");
            }
            self.icr &= !(b.read32(off::EIAC) & intr::RXQ0);
            if b.read32(off::CTRL_EXT) & intr::CTRL_EXT_EIAME != 0 {
                self.ims &= !(b.read32(off::IAM) & intr::RXQ0);
            }
        } else if c != 0 {
            self.sh.c.interrupts.fetch_add(1, Ordering::AcqRel);
            fds[0].signal().expect("signal the eventfd");
        }
    }

    fn ring(&self, bal: usize) -> (u64, u32) {
        let b = &self.bar;
        let base = b.read32(bal) as u64 | (b.read32(bal + 4) as u64) << 32;
        (base, b.read32(bal + 8) / 16)
    }

    /// The CPU address of `len` bytes at bus address `bus`, through the cache of whole
    /// mappings (one FakeMapper lookup per mapping, not per access).
    fn xlat(&mut self, bus: u64, len: u64) -> Option<*mut u8> {
        for &(start, mlen, p) in &self.xlat {
            if bus >= start && bus + len <= start + mlen {
                return Some(p.wrapping_add((bus - start) as usize));
            }
        }
        let (iova, mlen) = self
            .mapper
            .live_mappings()
            .into_iter()
            .find(|&(i, l)| bus >= i.get() && bus + len <= i.get() + l)?;
        let p = self.mapper.translate(BusAddr(iova.get()), mlen)?;
        self.xlat.push((iova.get(), mlen, p));
        Some(p.wrapping_add((bus - iova.get()) as usize))
    }

    fn desc(&mut self, base: u64, i: u32) -> Option<*mut u64> {
        self.xlat(base + i as u64 * 16, 16).map(|p| p.cast::<u64>())
    }

    /// Records a protocol violation (the test fails at the model's drop unless it takes it).
    fn violation(&self, what: String) {
        self.sh.c.violations.fetch_add(1, Ordering::AcqRel);
        eprintln!("nic-model: protocol violation: {what}");
        let mut v = self.sh.violations.lock().unwrap_or_else(|e| e.into_inner());
        v.push(what);
    }

    fn transmit(&mut self) -> bool {
        let b = self.bar.clone();
        if b.read32(off::TCTL) & Tctl::EN.bits() == 0 {
            return false;
        }
        let (base, n) = self.ring(off::TDBAL);
        let tdt = b.read32(off::TDT);
        if tdt != self.last_tdt {
            self.last_tdt = tdt;
            self.sh.c.tdt_moves.fetch_add(1, Ordering::AcqRel);
        }
        let mut tdh = b.read32(off::TDH);
        if n == 0 || tdh == tdt || tdt >= n {
            return false;
        }
        let record = self.sh.record_tx.load(Ordering::Acquire);
        let (mut frames, mut bytes) = (0, 0);
        while tdh != tdt {
            let Some(d) = self.desc(base, tdh) else {
                let at = base + tdh as u64 * 16;
                self.violation(format!(
                    "transmit descriptor {tdh} at {at:#x} is outside the mapped memory"
                ));
                break;
            };
            // SAFETY: `d` translates 16 mapped bytes (8-aligned: ring bases are page aligned);
            // the driver keeps the ring mapped while TCTL.EN is set.
            let lo = u64::from_le(unsafe { d.read_volatile() });
            let dh = d.wrapping_add(1);
            // SAFETY: as above, second quadword.
            let hi = u64::from_le(unsafe { dh.read_volatile() });
            let (len, cmd, _) = tx_fields(hi);
            if !cmd.contains(TxCmd::EOP) || cmd.contains(TxCmd::DEXT) || len == 0 {
                self.violation(format!(
                    "transmit descriptor {tdh} without EOP, extended, or empty ({cmd:?}, {len} bytes)"
                ));
            }
            if record {
                match self.xlat(lo, len as u64) {
                    Some(p) => {
                        let mut v = vec![0u8; len as usize];
                        // SAFETY: `p` translates `len` mapped bytes the driver handed over
                        // with this descriptor; `v` is the model's own memory.
                        unsafe { ptr::copy_nonoverlapping(p, v.as_mut_ptr(), len as usize) };
                        self.sh.sent.lock().unwrap().push(v);
                    }
                    None => self.violation(format!(
                        "transmit buffer of descriptor {tdh} ({len} bytes at {lo:#x}) is outside \
                         the mapped memory"
                    )),
                }
            }
            frames += 1;
            bytes += len as u64;
            if cmd.contains(TxCmd::RS) {
                self.sh.c.tx_rs.fetch_add(1, Ordering::AcqRel);
                fence(Ordering::Release);
                // SAFETY: as above; the write-back sets DD in the status field (only with RS, as
                // the 82574 does).
                unsafe { dh.write_volatile((hi | TX_DD).to_le()) };
            }
            tdh = if tdh + 1 == n { 0 } else { tdh + 1 };
        }
        b.write32(off::TDH, tdh);
        self.sh.c.tx_bytes.fetch_add(bytes, Ordering::AcqRel);
        self.sh.c.tx_frames.fetch_add(frames, Ordering::AcqRel);
        true
    }

    /// Writes `data` into the buffer of descriptor `rdh` and writes it back; false on a
    /// protocol violation.
    fn put(&mut self, base: u64, rdh: u32, data: &[u8], eop: bool, errors: RxErrors) -> bool {
        let Some(d) = self.desc(base, rdh) else {
            let at = base + rdh as u64 * 16;
            self.violation(format!(
                "receive descriptor {rdh} at {at:#x} is outside the mapped memory"
            ));
            return false;
        };
        // SAFETY: `d` translates 16 mapped bytes of the receive ring (8-aligned), which the
        // driver keeps mapped while RCTL.EN is set.
        let addr = u64::from_le(unsafe { d.read_volatile() });
        match self.xlat(addr, data.len() as u64) {
            Some(p) if data.len() <= 2048 => {
                // SAFETY: `p` translates `data.len()` mapped bytes of the buffer the driver
                // posted in this descriptor; `data` is the model's own memory.
                unsafe { ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
            }
            _ => self.violation(format!(
                "receive buffer of descriptor {rdh} ({} bytes at {addr:#x}) is outside the \
                 mapped memory or over the 2048-byte buffer size",
                data.len()
            )),
        }
        let mut st = RxStatus::DD;
        if eop {
            st |= RxStatus::EOP;
        }
        let wb = RxWriteBack::new(data.len() as u16, st, errors);
        // The data before the status that says it is there.
        fence(Ordering::Release);
        let dh = d.wrapping_add(1);
        // SAFETY: as above, second quadword: the write-back.
        unsafe { dh.write_volatile(wb.0.to_le()) };
        true
    }

    fn receive(&mut self) -> bool {
        let b = self.bar.clone();
        if b.read32(off::RCTL) & Rctl::EN.bits() == 0 {
            return false;
        }
        let (base, n) = self.ring(off::RDBAL);
        let rdt = b.read32(off::RDT);
        if rdt != self.last_rdt {
            self.last_rdt = rdt;
            self.sh.c.rdt_moves.fetch_add(1, Ordering::AcqRel);
        }
        let queued = self.sh.rx_len.load(Ordering::Acquire);
        let gen = self.sh.generate.load(Ordering::Acquire);
        if n == 0 || rdt >= n || (queued == 0 && gen == 0) {
            return false;
        }
        let v = self.sh.template_version.load(Ordering::Acquire);
        if v != self.template_version {
            self.template = self.sh.template.lock().unwrap().clone();
            self.template_version = v;
        }
        let mut rdh = b.read32(off::RDH);
        let next = |h: u32| if h + 1 == n { 0 } else { h + 1 };
        let free = |h: u32| if h <= rdt { rdt - h } else { n - h + rdt };
        let mut frames = 0u64;
        let mut generated = 0u64;
        if queued != 0 {
            let sh = Arc::clone(&self.sh);
            let mut q = sh.rx.lock().unwrap();
            while let Some(f) = q.front() {
                let need = if f.split.is_some() { 2 } else { 1 };
                if free(rdh) < need {
                    self.sh.c.rx_ring_full.fetch_add(1, Ordering::AcqRel);
                    break;
                }
                let f = q.pop_front().expect("front exists");
                self.sh.rx_len.fetch_sub(1, Ordering::AcqRel);
                let ok = match f.split {
                    Some(k) => {
                        let ok = self.put(base, rdh, &f.data[..k], false, RxErrors::empty());
                        rdh = next(rdh);
                        ok && self.put(base, rdh, &f.data[k..], true, f.errors)
                    }
                    None => self.put(base, rdh, &f.data, true, f.errors),
                };
                rdh = next(rdh);
                frames += 1;
                if !ok {
                    break;
                }
            }
        } else {
            let room = free(rdh) as u64;
            let k = if gen == u64::MAX { room } else { room.min(gen) };
            if k == 0 {
                self.sh.c.rx_ring_full.fetch_add(1, Ordering::AcqRel);
            }
            let template = std::mem::take(&mut self.template);
            for _ in 0..k {
                if !self.put(base, rdh, &template, true, RxErrors::empty()) {
                    break;
                }
                rdh = next(rdh);
                generated += 1;
            }
            self.template = template;
            if gen != u64::MAX {
                self.sh.generate.fetch_sub(generated, Ordering::AcqRel);
            }
            frames += generated;
        }
        if frames != 0 {
            b.write32(off::RDH, rdh);
            self.sh.c.rx_frames.fetch_add(frames, Ordering::AcqRel);
        }
        frames != 0
    }
}

/// Pins the calling thread to `cpu`.
pub fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes inside it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is checked against the set's capacity by CPU_SET's own bound (it ignores
    // out-of-range CPUs); `set` is a local.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: pid 0 is the calling thread; `set` is a valid, initialized cpu_set_t of the size given.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r != 0 {
        eprintln!(
            "nic-model: cannot pin to CPU {cpu}: {}",
            std::io::Error::last_os_error()
        );
    }
}
