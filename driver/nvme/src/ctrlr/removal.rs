//! Device removal (issue 12, item 3): the controller's side of `vfpoll-pci`'s removal watch.
//!
//! A controller opened through VFIO watches its device ([`vfpoll_pci::vfio::Device::watch`]).
//! When the kernel asks for the device back (hot unplug, unbind), the watch thread, within
//! microseconds and without waiting for any queue pair, does what [`Controller::remove`] does:
//! 1. records the removal, so that every error from now on names the device
//!    ([`NvmeError::Removed`], [`Controller::removed`]);
//! 2. disables the controller (CC.EN = 0, waiting at most 200 ms for CSTS.RDY = 0: commands in
//!    flight are dropped before any is cut off mid-transfer) and clears Bus Master: the device
//!    does no more DMA;
//! 3. declares the controller failed with its DMA stopped: each queue pair, at its next clock
//!    read (within about 5 ms of polling, idle or busy), completes every request in flight with
//!    the removal error and hands its buffers back, and refuses further submissions with it;
//! 4. releases the device ([`vfpoll_pci::vfio::Device::release`]): its BAR mappings are revoked
//!    in place (a thread still ringing a doorbell writes into memory nobody reads; CSTS reads
//!    all-ones) and its file is closed, so the kernel completes the removal while the process
//!    goes on.
//!
//! Why this order: buffers may be handed back only once the device can no longer write to them
//! (step 2 before 3), and the mappings are revoked, never unmapped, because other threads may be
//! using them at that very moment (step 4 after 3 only to keep the failure's reason: queue pairs
//! that read all-ones first would report a vanished device instead of a removal).
//!
//! The controller's handles stay valid; dropping the last one skips the shutdown (there is no
//! controller left to shut down) and frees its memory. A PCIe error the kernel reports (the
//! error interrupt) is logged and counted ([`Controller::pci_errors`]); the queue pairs' health
//! checks see what it did to the controller.

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use vfpoll_pci::vfio::{DeviceEvent, Watch};
use vfpoll_pci::Bdf;

use super::{Controller, Shared};
use crate::error::NvmeError;

/// The longest wait for the controller to disable on removal: the kernel is waiting for the
/// device, and Bus Master goes off after it anyway.
const STOP_LIMIT: Duration = Duration::from_millis(200);

/// What a removal did, once it happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemovalReport {
    /// The device (`None`: a controller not opened through VFIO, e.g. a device model).
    pub bdf: Option<Bdf>,
    /// When the request came (the watch thread woke, or [`Controller::remove`] was called).
    pub requested: Instant,
    /// From the request to the device's release (its file closed, its mappings revoked): from
    /// then on the kernel can complete the removal.
    pub released_in: Duration,
}

/// A controller's removal state (in its shared state).
#[derive(Debug, Default)]
pub(crate) struct Removal {
    /// Set once, at the request: the device and when.
    requested: OnceLock<(Option<Bdf>, Instant)>,
    /// Set once the device was released.
    report: OnceLock<RemovalReport>,
    /// The device watch; dropped first when the controller goes away.
    watch: Mutex<Option<Watch>>,
    /// Error interrupts seen.
    pci_errors: AtomicU64,
}

impl Removal {
    /// Stops the watch (before the controller's other parts go away).
    pub(crate) fn stop_watch(&self) {
        drop(self.watch.lock().unwrap_or_else(|e| e.into_inner()).take());
    }

    /// Whether the removal was requested.
    pub(crate) fn requested(&self) -> bool {
        self.requested.get().is_some()
    }
}

impl Shared {
    /// The error for a request or submission after the controller failed for `why`: the
    /// removal error once the device was removed.
    pub(crate) fn failed_error(&self, why: &str) -> NvmeError {
        match self.removal.requested.get() {
            Some(&(bdf, _)) => NvmeError::Removed { bdf },
            None => NvmeError::Failed(why.to_string()),
        }
    }

    /// Steps 1-4 of the module docs. Idempotent: a second request finds it done.
    fn remove(&self) -> RemovalReport {
        let bdf = self.device.as_ref().map(|d| d.bdf());
        let first = self.removal.requested.set((bdf, Instant::now())).is_ok();
        let (_, requested) = *self.removal.requested.get().expect("set above");
        if !first {
            // Another thread is removing it: report once it is done.
            loop {
                if let Some(r) = self.removal.report.get() {
                    return *r;
                }
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        // The controller first (CC.EN = 0: it drops every command, NVMe Base 2.0 §3.7.2), so that
        // no command is half-way through a DMA when Bus Master goes off: QEMU's controller, cut
        // off mid-DMA, could keep its device object alive after the unplug (no DEVICE_DELETED,
        // seen about one removal in ten in the test bed).
        let disabled = self.stop_controller(STOP_LIMIT);
        let stopped = match &self.device {
            Some(d) => match d.disable_bus_master() {
                Ok(()) => true,
                Err(e) => {
                    log::warn!("{}: clearing Bus Master on removal: {e}", d.bdf());
                    disabled
                }
            },
            // Not a VFIO device (a device model): a disabled controller does no DMA, and a
            // vanished one (all-ones) none either.
            None => disabled,
        };
        let why = NvmeError::Removed { bdf }.to_string();
        self.fail(why, stopped);
        if let Some(d) = &self.device {
            if let Err(e) = d.release() {
                log::error!("{}: releasing the removed device: {e}", d.bdf());
            }
        }
        let report = RemovalReport {
            bdf,
            requested,
            released_in: requested.elapsed(),
        };
        let _ = self.removal.report.set(report);
        log::warn!(
            "controller {} ({}): removed; released {:?} after the request",
            self.identify.serial,
            bdf.map_or("no PCI device".to_string(), |b| b.to_string()),
            report.released_in
        );
        report
    }
}

impl Shared {
    /// CC.EN = 0 and a wait of up to `limit` (or CAP.TO, if shorter) for CSTS.RDY = 0;
    /// whether the controller stopped (or is gone: all-ones).
    fn stop_controller(&self, limit: Duration) -> bool {
        use crate::regs::{off, Cc, Csts};
        let cc = Cc(self.bar.read32(off::CC));
        if cc.0 == u32::MAX {
            return true;
        }
        self.bar.write32(off::CC, cc.with_enable(false).0);
        let limit = limit.min(Duration::from_millis(self.cap.timeout_ms().max(1)));
        let start = Instant::now();
        loop {
            let s = Csts(self.bar.read32(off::CSTS));
            if s.device_gone() || !s.ready() {
                return true;
            }
            if start.elapsed() > limit {
                log::warn!(
                    "controller {}: not disabled {limit:?} into its removal (CSTS={:#x})",
                    self.identify.serial,
                    s.0
                );
                return false;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }
}

/// Starts the watch of a controller opened through VFIO. A kernel without the device-request
/// interrupt gets a warning: a removal then waits until the process lets the device go.
pub(crate) fn start_watch(shared: &Arc<Shared>) {
    let Some(dev) = shared.device.as_ref() else { return };
    let me: Weak<Shared> = Arc::downgrade(shared);
    let bdf = dev.bdf();
    let watch = dev.watch(move |ev| {
        let Some(sh) = me.upgrade() else {
            return ControlFlow::Break(());
        };
        match ev {
            DeviceEvent::Request { .. } => {
                sh.remove();
                ControlFlow::Break(())
            }
            DeviceEvent::Error { count } => {
                let n = sh.removal.pci_errors.fetch_add(count, Ordering::Relaxed) + count;
                log::warn!("{bdf}: the kernel reports a PCIe error on the device ({n} so far)");
                ControlFlow::Continue(())
            }
        }
    });
    match watch {
        Ok(w) => *shared.removal.watch.lock().unwrap_or_else(|e| e.into_inner()) = Some(w),
        Err(e) => log::warn!("{bdf}: removal requests are not watched: {e}"),
    }
}

impl Controller {
    /// Lets the controller go as the kernel's removal request does (see the module docs): every
    /// queue pair fails its requests in flight with [`NvmeError::Removed`] (buffers handed back)
    /// and refuses new ones, and the VFIO device is released. For a program that hands a device
    /// back by itself; the removal watch calls the same. Idempotent.
    pub fn remove(&self) -> RemovalReport {
        self.shared.remove()
    }

    /// The device, once it was removed (or its removal requested): from then on every request
    /// fails with [`NvmeError::Removed`].
    pub fn removed(&self) -> Option<RemovalReport> {
        self.shared.removal.report.get().copied()
    }

    /// Whether the device's removal was requested (it may still be under way).
    pub fn removal_requested(&self) -> bool {
        self.shared.removal.requested()
    }

    /// PCIe errors the kernel reported on the device (its error interrupt, where offered).
    pub fn pci_errors(&self) -> u64 {
        self.shared.removal.pci_errors.load(Ordering::Relaxed)
    }
}
