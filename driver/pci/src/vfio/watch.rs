//! Watching a device for the kernel's removal requests and error reports.
//!
//! When a device bound to vfio-pci is to be removed (hot unplug, `echo 1 > .../remove`, an
//! unbind), the kernel does not take it away from the process: it signals the device-request
//! interrupt (`VFIO_PCI_REQ_IRQ_INDEX`) and waits, repeating the request every 10 s, until the
//! process has closed the device file and unmapped its BARs (Linux `vfio_unregister_group_dev`).
//! A process that does not listen holds the removal up for as long as it runs. PCIe AER errors
//! the kernel sees on the device arrive on the error interrupt (`VFIO_PCI_ERR_IRQ_INDEX`), where
//! the device offers one (PCIe devices).
//!
//! [`Device::watch`] binds both to eventfds and runs a small thread per device that sleeps in
//! `poll` on them and calls the owner's handler for each event: nothing on the I/O path is
//! involved, and the handler runs within microseconds of the kernel's signal. The usual handler
//! marks the device's users failed and calls [`Device::release`] (see `vfpoll-nvme`'s
//! controller), then stops the watch.

use std::ops::ControlFlow;
use std::os::fd::AsRawFd;
use std::thread::JoinHandle;

use super::irq::{EventFd, IrqIndex, Irqs};
use super::sys;
use super::{io_err, Device, VfioError};
use crate::bdf::Bdf;

/// What the kernel signalled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceEvent {
    /// The kernel asks for the device back (removal, unbind): release it
    /// ([`Device::release`]). `count`: requests since the last look (the kernel repeats them).
    Request {
        /// Signals counted.
        count: u64,
    },
    /// The kernel saw PCIe AER errors on the device (its error handler ran).
    Error {
        /// Signals counted.
        count: u64,
    },
}

/// A running watch of one device (see the module docs). Dropping it stops the thread (the
/// interrupts are disabled; unless the handler released the device, which disabled them).
#[derive(Debug)]
pub struct Watch {
    bdf: Bdf,
    stop: EventFd,
    error_irq: bool,
    thread: Option<JoinHandle<()>>,
}

impl Watch {
    /// Whether the error interrupt is watched too (the device offers one).
    pub fn watches_errors(&self) -> bool {
        self.error_irq
    }

    /// Whether the watch thread has ended (its handler said stop, or the device went away).
    pub fn finished(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.stop.signal();
        if let Some(t) = self.thread.take() {
            // Dropped by its own handler (the handler held the device's last user): the thread
            // ends by itself right after.
            if t.thread().id() != std::thread::current().id() && t.join().is_err() {
                log::error!("{}: the watch thread panicked", self.bdf);
            }
        }
    }
}

impl Device {
    /// Listens for the device-request interrupt, and the error interrupt where the device offers
    /// one (`VFIO_DEVICE_GET_IRQ_INFO` count > 0), each on an eventfd, on a thread of its own
    /// (`vfpoll-watch`) that calls `on_event` for each signal until it returns
    /// [`ControlFlow::Break`] or the watch is dropped.
    pub fn watch<F>(&self, mut on_event: F) -> Result<Watch, VfioError>
    where
        F: FnMut(DeviceEvent) -> ControlFlow<()> + Send + 'static,
    {
        let bdf = self.bdf;
        let req = self.irq_info(IrqIndex::REQ)?;
        if req.count == 0 || !req.eventfd() {
            return Err(VfioError::Io {
                what: format!("watching {bdf} for removal requests"),
                source: std::io::Error::new(
                    std::io::ErrorKind::Unsupported,
                    "the kernel offers no device-request interrupt (VFIO_PCI_REQ_IRQ_INDEX) for it: a removal would wait until the process exits",
                ),
            });
        }
        let req = self.enable_irqs(IrqIndex::REQ, 1)?;
        let err = match self.irq_info(IrqIndex::ERR) {
            Ok(i) if i.count > 0 && i.eventfd() => match self.enable_irqs(IrqIndex::ERR, 1) {
                Ok(irqs) => Some(irqs),
                Err(e) => {
                    log::warn!("{bdf}: error interrupt not watched: {e}");
                    None
                }
            },
            _ => None,
        };
        let stop = EventFd::new().map_err(io_err("eventfd"))?;
        let stop_rx = stop.try_clone().map_err(io_err("eventfd"))?;
        let error_irq = err.is_some();
        let thread = std::thread::Builder::new()
            .name("vfpoll-watch".into())
            .spawn(move || run(bdf, req, err, stop_rx, &mut on_event))
            .map_err(io_err("spawning the device watch thread"))?;
        log::debug!(
            "{bdf}: watching the request{} interrupt",
            if error_irq { " and error" } else { "" }
        );
        Ok(Watch {
            bdf,
            stop,
            error_irq,
            thread: Some(thread),
        })
    }
}

/// The watch thread: sleeps on the eventfds, hands each event to `on_event`.
fn run(
    bdf: Bdf,
    req: Irqs,
    err: Option<Irqs>,
    stop: EventFd,
    on_event: &mut dyn FnMut(DeviceEvent) -> ControlFlow<()>,
) {
    let req_fd = req.eventfd(0).expect("one vector enabled");
    let err_fd = err.as_ref().and_then(|e| e.eventfd(0));
    let mut fds = vec![stop.as_raw_fd(), req_fd.as_raw_fd()];
    fds.extend(err_fd.map(|f| f.as_raw_fd()));
    loop {
        let ready = match sys::poll_any(&fds, None) {
            Ok(r) => r,
            Err(e) => {
                log::error!("{bdf}: the device watch stops: poll failed: {e}");
                return;
            }
        };
        if ready[0] {
            return;
        }
        let mut events = Vec::new();
        if ready[1] {
            match req_fd.take() {
                Ok(0) => {}
                Ok(count) => events.push(DeviceEvent::Request { count }),
                Err(e) => log::warn!("{bdf}: reading the request eventfd: {e}"),
            }
        }
        if let (Some(true), Some(f)) = (ready.get(2), err_fd) {
            match f.take() {
                Ok(0) => {}
                Ok(count) => events.push(DeviceEvent::Error { count }),
                Err(e) => log::warn!("{bdf}: reading the error eventfd: {e}"),
            }
        }
        for ev in events {
            log::debug!("{bdf}: {ev:?}");
            if on_event(ev).is_break() {
                // `req` and `err` are dropped here: disabled, or already gone with the device.
                return;
            }
        }
    }
}
