//! Interrupts through VFIO: eventfds bound to a device's IRQ index with
//! `VFIO_DEVICE_SET_IRQS` (Linux `include/uapi/linux/vfio.h`, "VFIO_DEVICE_SET_IRQS").
//!
//! The kernel's interrupt handler for the device (vfio-pci) signals an eventfd per vector; a
//! process sleeps on it with `poll`/`epoll` (or an async runtime) instead of spinning. The IRQ
//! index is a parameter ([`IrqIndex`]): MSI-X for queue interrupts, MSI or INTx where that is
//! all a device has, and the error and device-request indexes (AER, hot removal) use the same
//! calls.
//!
//! ```text
//! Device::irq_info(IrqIndex::MSIX)         how many vectors, eventfd-capable?
//! Device::enable_irqs(IrqIndex::MSIX, n)   n eventfds, ACTION_TRIGGER | DATA_EVENTFD, start 0
//!   Irqs::set_trigger(v, Some(fd) | None)  rebind or unbind one vector
//!   Irqs::unmask(v)                        INTx: re-arm after it fired (it is auto-masked)
//!   drop(Irqs)                             DATA_NONE | ACTION_TRIGGER, count 0: all disabled
//! ```
//!
//! This module is safe code: the ioctl goes through [`SysOps`], eventfds are created in `sys`.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use super::sys::{self, IoctlArg, SysOps};
use super::{io_err, uapi, DevFd, Device, VfioError};
use crate::bdf::Bdf;

/// An IRQ index of a vfio-pci device (`VFIO_PCI_*_IRQ_INDEX`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IrqIndex(pub u32);

impl IrqIndex {
    /// Legacy INTx (one level-triggered line; auto-masked after each interrupt).
    pub const INTX: IrqIndex = IrqIndex(0);
    /// MSI (up to 32 vectors).
    pub const MSI: IrqIndex = IrqIndex(1);
    /// MSI-X (up to 2048 vectors, one per queue).
    pub const MSIX: IrqIndex = IrqIndex(2);
    /// PCIe AER errors the kernel saw on the device.
    pub const ERR: IrqIndex = IrqIndex(3);
    /// The kernel asks the user to release the device (hot removal, unbind).
    pub const REQ: IrqIndex = IrqIndex(4);

    /// The index's name as vfio.h spells it.
    pub fn name(self) -> &'static str {
        match self.0 {
            0 => "INTx",
            1 => "MSI",
            2 => "MSI-X",
            3 => "ERR",
            4 => "REQ",
            _ => "unknown",
        }
    }
}

impl std::fmt::Display for IrqIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (index {})", self.name(), self.0)
    }
}

/// What `VFIO_DEVICE_GET_IRQ_INFO` says about one index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IrqInfo {
    /// The index.
    pub index: IrqIndex,
    /// Vectors it has (0: the device lacks it, e.g. no MSI-X capability).
    pub count: u32,
    /// `VFIO_IRQ_INFO_*`.
    pub flags: u32,
}

impl IrqInfo {
    /// Whether eventfds can be bound to it.
    pub fn eventfd(&self) -> bool {
        self.flags & uapi::IRQ_INFO_EVENTFD != 0
    }

    /// Whether the kernel masks it after each interrupt (INTx): see [`Irqs::unmask`].
    pub fn automasked(&self) -> bool {
        self.flags & uapi::IRQ_INFO_AUTOMASKED != 0
    }
}

/// An eventfd: a 64-bit counter in the kernel that a write adds to and a read takes and clears.
/// Non-blocking: [`EventFd::take`] returns 0 instead of sleeping. Readable (for `poll`, `epoll`,
/// tokio's `AsyncFd`) while the counter is not zero.
#[derive(Debug)]
pub struct EventFd(File);

impl EventFd {
    /// A new eventfd with counter 0.
    pub fn new() -> io::Result<Self> {
        Ok(EventFd(File::from(sys::eventfd()?)))
    }

    /// Another descriptor of the same counter (`dup`).
    pub fn try_clone(&self) -> io::Result<Self> {
        Ok(EventFd(self.0.try_clone()?))
    }

    /// Adds 1 to the counter (what the kernel does when the interrupt fires), waking sleepers.
    pub fn signal(&self) -> io::Result<()> {
        (&self.0).write_all(&1u64.to_ne_bytes())
    }

    /// Takes the counter and leaves 0: how many signals came since the last take (0: none).
    pub fn take(&self) -> io::Result<u64> {
        let mut b = [0u8; 8];
        match (&self.0).read(&mut b) {
            Ok(8) => Ok(u64::from_ne_bytes(b)),
            Ok(n) => Err(io::Error::other(format!(
                "eventfd read returned {n} bytes, not 8"
            ))),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// Sleeps until the counter is not zero or `timeout` passes (`None`: no limit); does not
    /// take it. Returns whether it is not zero. A signal delivered to the thread may end the
    /// sleep early (`Ok(false)`).
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<bool> {
        sys::poll_readable(self.0.as_raw_fd(), timeout)
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// Builds a `struct vfio_irq_set` with `data` after its header.
fn irq_set(flags: u32, index: IrqIndex, start: u32, count: u32, data: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; uapi::IRQ_SET_SIZE + data.len()];
    let argsz = b.len() as u32;
    uapi::put_u32(&mut b, uapi::arg::ARGSZ, argsz);
    uapi::put_u32(&mut b, uapi::arg::FLAGS, flags);
    uapi::put_u32(&mut b, uapi::irq::INDEX, index.0);
    uapi::put_u32(&mut b, uapi::irq::SET_START, start);
    uapi::put_u32(&mut b, uapi::irq::SET_COUNT, count);
    b[uapi::irq::SET_DATA..].copy_from_slice(data);
    b
}

/// One `VFIO_DEVICE_SET_IRQS` call as the kernel reads it (for the fake kernel and tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IrqSet {
    /// `VFIO_IRQ_SET_*`.
    pub flags: u32,
    /// The index.
    pub index: IrqIndex,
    /// First vector.
    pub start: u32,
    /// Vectors.
    pub count: u32,
    /// With `DATA_EVENTFD`: one descriptor per vector (-1: unbind it).
    pub fds: Vec<i32>,
}

impl IrqSet {
    /// Parses the argument of `VFIO_DEVICE_SET_IRQS`; `None` when it is too short for its
    /// header or for the eventfds it says it carries.
    pub fn parse(b: &[u8]) -> Option<Self> {
        if b.len() < uapi::IRQ_SET_SIZE || (uapi::get_u32(b, uapi::arg::ARGSZ) as usize) > b.len() {
            return None;
        }
        let (flags, count) = (
            uapi::get_u32(b, uapi::arg::FLAGS),
            uapi::get_u32(b, uapi::irq::SET_COUNT),
        );
        let fds = if flags & uapi::IRQ_SET_DATA_EVENTFD != 0 {
            let end = uapi::irq::SET_DATA.checked_add(4 * count as usize)?;
            if end > b.len() {
                return None;
            }
            (0..count as usize)
                .map(|i| uapi::get_u32(b, uapi::irq::SET_DATA + 4 * i) as i32)
                .collect()
        } else {
            Vec::new()
        };
        Some(IrqSet {
            flags,
            index: IrqIndex(uapi::get_u32(b, uapi::irq::INDEX)),
            start: uapi::get_u32(b, uapi::irq::SET_START),
            count,
            fds,
        })
    }
}

/// The enabled vectors of one IRQ index, each bound to its own [`EventFd`]. Dropping it disables
/// the index (the device stops interrupting; the eventfds are closed after).
///
/// `Send + Sync`: the eventfds may be waited on from any thread.
#[derive(Debug)]
pub struct Irqs {
    sys: Arc<dyn SysOps>,
    dev: Arc<DevFd>,
    bdf: Bdf,
    index: IrqIndex,
    fds: Vec<EventFd>,
    enabled: bool,
}

impl Irqs {
    /// The index.
    pub fn index(&self) -> IrqIndex {
        self.index
    }

    /// Vectors enabled.
    pub fn len(&self) -> usize {
        self.fds.len()
    }

    /// Whether no vector is enabled (never true while the index is enabled).
    pub fn is_empty(&self) -> bool {
        self.fds.is_empty()
    }

    /// The eventfd of vector `v`.
    pub fn eventfd(&self, v: u32) -> Option<&EventFd> {
        self.fds.get(v as usize)
    }

    fn set(&self, what: &str, flags: u32, start: u32, count: u32, data: &[u8]) -> Result<(), VfioError> {
        let mut b = irq_set(flags, self.index, start, count, data);
        self.dev.call(
            || {
                format!(
                    "VFIO_DEVICE_SET_IRQS({}, {}, {what} vector {start})",
                    self.bdf, self.index
                )
            },
            |fd| {
                self.sys
                    .ioctl(fd, uapi::req::DEVICE_SET_IRQS, IoctlArg::Buf(&mut b))
            },
        )?;
        Ok(())
    }

    /// Binds vector `v` to `fd` instead of its own eventfd, or unbinds it (`None`: the vector
    /// stays enabled in the device but signals nothing). `Some(self.eventfd(v))` binds it back.
    pub fn set_trigger(&self, v: u32, fd: Option<&EventFd>) -> Result<(), VfioError> {
        self.check(v)?;
        let raw = fd.map_or(-1, |f| f.as_raw_fd());
        self.set(
            "bind",
            uapi::IRQ_SET_DATA_EVENTFD | uapi::IRQ_SET_ACTION_TRIGGER,
            v,
            1,
            &raw.to_ne_bytes(),
        )
    }

    /// Unmasks vector `v` (INTx is masked by the kernel each time it fires, until the device's
    /// condition is cleared and this is called).
    pub fn unmask(&self, v: u32) -> Result<(), VfioError> {
        self.check(v)?;
        self.set(
            "unmask",
            uapi::IRQ_SET_DATA_NONE | uapi::IRQ_SET_ACTION_UNMASK,
            v,
            1,
            &[],
        )
    }

    /// Disables every vector of the index (also done on drop). Nothing to do once the device
    /// was released: closing its file disabled them all.
    pub fn disable(&mut self) -> Result<(), VfioError> {
        if !self.enabled || self.dev.closed() {
            self.enabled = false;
            return Ok(());
        }
        self.set(
            "disable all from",
            uapi::IRQ_SET_DATA_NONE | uapi::IRQ_SET_ACTION_TRIGGER,
            0,
            0,
            &[],
        )?;
        self.enabled = false;
        Ok(())
    }

    fn check(&self, v: u32) -> Result<(), VfioError> {
        if !self.enabled || v as usize >= self.fds.len() {
            return Err(VfioError::Io {
                what: format!("{} vector {v} of {}", self.index, self.bdf),
                source: io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "only vectors 0..{} are enabled",
                        if self.enabled { self.fds.len() } else { 0 }
                    ),
                ),
            });
        }
        Ok(())
    }
}

impl Drop for Irqs {
    fn drop(&mut self) {
        if let Err(e) = self.disable() {
            log::warn!("{e}");
        }
    }
}

impl Device {
    /// `VFIO_DEVICE_GET_IRQ_INFO` of `index`.
    pub fn irq_info(&self, index: IrqIndex) -> Result<IrqInfo, VfioError> {
        if index.0 >= self.num_irqs {
            return Ok(IrqInfo {
                index,
                count: 0,
                flags: 0,
            });
        }
        let mut b = [0u8; uapi::IRQ_INFO_SIZE];
        uapi::put_u32(&mut b, uapi::arg::ARGSZ, uapi::IRQ_INFO_SIZE as u32);
        uapi::put_u32(&mut b, uapi::irq::INDEX, index.0);
        self.fd.call(
            || format!("VFIO_DEVICE_GET_IRQ_INFO({}, {index})", self.bdf),
            |fd| {
                self.container
                    .sys
                    .ioctl(fd, uapi::req::DEVICE_GET_IRQ_INFO, IoctlArg::Buf(&mut b))
            },
        )?;
        Ok(IrqInfo {
            index,
            count: uapi::get_u32(&b, uapi::irq::INFO_COUNT),
            flags: uapi::get_u32(&b, uapi::arg::FLAGS),
        })
    }

    /// Enables vectors `0..count` of `index`, each signalling a new eventfd of its own
    /// (`VFIO_IRQ_SET_ACTION_TRIGGER | VFIO_IRQ_SET_DATA_EVENTFD`, start 0). Only one of INTx,
    /// MSI and MSI-X can be enabled at a time (vfio-pci refuses the second with EINVAL).
    pub fn enable_irqs(&self, index: IrqIndex, count: u32) -> Result<Irqs, VfioError> {
        let info = self.irq_info(index)?;
        let refuse = |why: String| VfioError::Io {
            what: format!("enabling {count} {index} vector(s) of {}", self.bdf),
            source: io::Error::new(io::ErrorKind::InvalidInput, why),
        };
        if count == 0 {
            return Err(refuse("ask for at least one vector".into()));
        }
        if info.count < count {
            return Err(refuse(format!(
                "the device has {} {} vector(s); ask for fewer, or use another index",
                info.count,
                index.name()
            )));
        }
        if !info.eventfd() {
            return Err(refuse("vfio-pci cannot signal an eventfd for this index".into()));
        }
        let fds = (0..count)
            .map(|_| EventFd::new())
            .collect::<io::Result<Vec<_>>>()
            .map_err(io_err("eventfd"))?;
        let data: Vec<u8> = fds.iter().flat_map(|f| f.as_raw_fd().to_ne_bytes()).collect();
        let mut irqs = Irqs {
            sys: Arc::clone(&self.container.sys),
            dev: Arc::clone(&self.fd),
            bdf: self.bdf,
            index,
            fds,
            enabled: false,
        };
        irqs.set(
            "enable",
            uapi::IRQ_SET_DATA_EVENTFD | uapi::IRQ_SET_ACTION_TRIGGER,
            0,
            count,
            &data,
        )?;
        irqs.enabled = true;
        log::debug!("{}: {count} {} vector(s) enabled", self.bdf, index.name());
        Ok(irqs)
    }

    /// [`Device::enable_irqs`] of MSI-X.
    pub fn enable_msix(&self, count: u32) -> Result<Irqs, VfioError> {
        self.enable_irqs(IrqIndex::MSIX, count)
    }
}
