//! Interrupt mode for receive queues: a queue that sleeps until frames arrive instead of
//! spinning (issue 13, part 4; the NIC side of `vfpoll-nvme`'s `qpair/wait.rs`).
//!
//! A port opened with [`PortOptions::completion`] = [`CompletionMode::Irq`] or
//! [`CompletionMode::Hybrid`] gets one interrupt vector for its receive queue, bound through
//! VFIO (`VFIO_DEVICE_SET_IRQS`) to an eventfd: MSI-X where the device has it, MSI where that is
//! all it has (the 82574 without its MSI-X capability). What the device is told:
//! - 82574 (`e1000e`), MSI-X: IVAR routes RX queue 0 to vector 0 (datasheet §10.2.4, IVAR), EIAC
//!   auto-clears the RxQ0 cause and IAM/CTRL_EXT.EIAME auto-mask it when the message is sent
//!   (§7.4, interrupts, and §10.2.4), so one burst of frames sends one message; MSI: the RXT0 cause
//!   (§7.4). The transmit queue and the other causes stay masked.
//! - virtio-net: `queue_msix_vector` = 0 for `receiveq1` (read back: a device that cannot use
//!   it says NO_VECTOR, VIRTIO 1.2 §4.1.5.1.2), NO_VECTOR for the transmit queue and the
//!   configuration; the used-buffer notification is asked for by clearing
//!   VIRTQ_AVAIL_F_NO_INTERRUPT (§2.7.10) only while the queue sleeps.
//!
//! Poll mode is untouched: [`RxQueue::rx_burst`] never looks at any of this, and a queue
//! opened with [`CompletionMode::Poll`] keeps every interrupt masked as before.
//!
//! ## Sleeping without losing a wakeup
//! [`RxQueue::arm`] is the step before sleeping; [`RxQueue::wait`] is `arm` plus the sleep:
//! 1. take the eventfd's counter (clears it; non-blocking);
//! 2. arm the device: 82574: clear the cause in ICR (write 1), then unmask it in IMS (a cause
//!    left over from frames already polled would otherwise fire at once); virtio-net: clear
//!    NO_INTERRUPT in the available ring's flags, then a full barrier;
//! 3. look at the ring (the next descriptor's DD bit; the used index): a frame already there
//!    means no sleep (`arm` returns true).
//!
//! A frame written after step 2 interrupts (the device sets the cause, or reads the flag after
//! its used-index store, §2.7.10) and the interrupt lands in the counter, which stays non-zero
//! until the next `arm`: the sleep that follows returns at once. A frame written before step 2
//! is seen in step 3. `wait` disarms on return (IMC; NO_INTERRUPT set again), so a queue that
//! is being polled between waits costs the device no interrupts.
//!
//! ## Hybrid
//! [`CompletionMode::Hybrid`] spins on the ring for `spin` when `wait` is called (the caller
//! has just found the ring empty, so that is `spin` after the last frame), then arms and
//! sleeps: a steady stream is caught spinning, an idle queue costs no CPU.
//!
//! [`PortOptions::completion`]: crate::PortOptions::completion
//! [`RxQueue::rx_burst`]: crate::RxQueue::rx_burst
//! [`RxQueue::arm`]: crate::RxQueue::arm
//! [`RxQueue::wait`]: crate::RxQueue::wait

use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use vfpoll_pci::vfio::{Device, EventFd, IrqIndex, Irqs};

use crate::error::{NicError, Result};

/// How a receive queue learns that frames arrived (defined in `vfpoll-pci`, shared with the
/// NVMe driver): `Poll` keeps every interrupt masked, `Irq` and `Hybrid` make
/// [`RxQueue::wait`](crate::RxQueue::wait) sleep on the queue's eventfd (`Hybrid` after its
/// spin).
pub use vfpoll_pci::CompletionMode;

/// What delivers a port's interrupt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IrqKind {
    /// MSI-X, vector 0.
    Msix,
    /// MSI (one message).
    Msi,
}

impl IrqKind {
    /// The name, for messages.
    pub fn name(self) -> &'static str {
        match self {
            IrqKind::Msix => "MSI-X",
            IrqKind::Msi => "MSI",
        }
    }
}

/// A port's interrupt: the eventfd of vector 0 and what keeps it bound. Lives in the driver's
/// shared state, so the VFIO vectors are disabled only when the port's last part goes.
#[derive(Debug)]
pub(crate) struct PortIrq {
    pub(crate) kind: IrqKind,
    /// Vector 0's eventfd: a descriptor of its own, so that a supplied eventfd and one bound
    /// through VFIO look alike to the queue.
    pub(crate) fd: EventFd,
    /// The VFIO vectors; `None` when supplied (device models).
    _irqs: Option<Irqs>,
}

impl PortIrq {
    /// Enables one vector of `device` through VFIO: MSI-X, or MSI where it has no MSI-X
    /// (`allow_msi`: the 82574 can use MSI, virtio-net needs MSI-X for per-queue vectors).
    pub(crate) fn enable(device: &Device, allow_msi: bool) -> Result<Self> {
        let bdf = device.bdf();
        let (index, kind) = if device.irq_info(IrqIndex::MSIX)?.count > 0 {
            (IrqIndex::MSIX, IrqKind::Msix)
        } else if allow_msi && device.irq_info(IrqIndex::MSI)?.count > 0 {
            (IrqIndex::MSI, IrqKind::Msi)
        } else {
            return Err(NicError::InvalidOption(format!(
                "{bdf} has no {} that VFIO can bind to an eventfd, so its receive queue cannot \
                 sleep: open it with CompletionMode::Poll (--completion poll)",
                if allow_msi { "MSI-X or MSI" } else { "MSI-X" }
            )));
        };
        let irqs = device.enable_irqs(index, 1)?;
        let fd = irqs
            .eventfd(0)
            .expect("vector 0 enabled")
            .try_clone()
            .map_err(|e| NicError::InvalidOption(format!("{bdf}: cannot duplicate an eventfd: {e}")))?;
        log::debug!("{bdf}: {} vector 0 enabled for the receive queue", kind.name());
        Ok(PortIrq {
            kind,
            fd,
            _irqs: Some(irqs),
        })
    }

    /// An interrupt delivered through `fd` by a device model.
    pub(crate) fn supplied(fd: EventFd, kind: IrqKind) -> Self {
        PortIrq {
            kind,
            fd,
            _irqs: None,
        }
    }
}

/// What a receive queue in interrupt mode does to the device; [`wait_on`] and [`arm_on`] do
/// the rest.
pub(crate) trait Sleeper {
    /// The eventfd and the mode (`None`: the queue polls).
    fn irq(&self) -> Option<(&EventFd, CompletionMode)>;
    /// The queue's name, for messages.
    fn name(&self) -> &str;
    /// Whether a frame (or any used entry) is waiting in the ring.
    fn ready(&self) -> bool;
    /// Asks the device for an interrupt at the next frame (step 2 of the module docs).
    fn arm_device(&mut self);
    /// Tells the device not to interrupt.
    fn disarm_device(&mut self);
}

fn not_irq(name: &str) -> NicError {
    NicError::InvalidOption(format!(
        "{name}: the receive queue polls (CompletionMode::Poll): open the port with \
         PortOptions::completion = CompletionMode::Irq or Hybrid to wait on it"
    ))
}

/// Steps 1-3 of the module docs; true when a frame is already there (the device is then
/// left armed: the caller polls, and the next `arm` or `wait` takes the counter).
pub(crate) fn arm_on<Q: Sleeper>(q: &mut Q) -> Result<bool> {
    let Some((fd, _)) = q.irq() else {
        return Err(not_irq(q.name()));
    };
    fd.take()
        .map_err(|e| NicError::InvalidOption(format!("{}: reading the interrupt eventfd: {e}", q.name())))?;
    q.arm_device();
    Ok(q.ready())
}

/// [`RxQueue::wait`](crate::RxQueue::wait): hybrid spin, arm, sleep, disarm.
pub(crate) fn wait_on<Q: Sleeper>(q: &mut Q, timeout: Option<Duration>) -> Result<bool> {
    let start = Instant::now();
    let Some((_, mode)) = q.irq() else {
        return Err(not_irq(q.name()));
    };
    if let CompletionMode::Hybrid { spin } = mode {
        let until = start + timeout.map_or(spin, |t| t.min(spin));
        loop {
            if q.ready() {
                return Ok(true);
            }
            if Instant::now() >= until {
                break;
            }
            std::hint::spin_loop();
        }
    }
    let r = sleep(q, start, timeout);
    q.disarm_device();
    r
}

fn sleep<Q: Sleeper>(q: &mut Q, start: Instant, timeout: Option<Duration>) -> Result<bool> {
    if arm_on(q)? {
        return Ok(true);
    }
    let left = timeout.map(|t| t.saturating_sub(start.elapsed()));
    let (fd, _) = q.irq().expect("checked by arm_on");
    let woke = fd.wait(left).map_err(|e| {
        NicError::InvalidOption(format!("{}: waiting on the interrupt eventfd: {e}", q.name()))
    })?;
    // Woken by the interrupt, by a signal (the caller looks at its flags), or out of time: the
    // ring decides.
    Ok(woke || q.ready())
}

/// The eventfd of a queue, for [`RxQueue::event_fd`](crate::RxQueue::event_fd).
pub(crate) fn borrowed<Q: Sleeper>(q: &Q) -> Option<BorrowedFd<'_>> {
    q.irq().map(|(fd, _)| fd.as_fd())
}
