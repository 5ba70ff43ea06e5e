//! Errors across the C boundary: a negative errno-style code for the caller's `if`, and a
//! thread-local message ([`crate::ffi::vfpoll_last_error`]) that says what went wrong and what
//! to do, taken from the Rust driver's own error. Every entry point runs in [`guard`], which
//! also turns a panic (a bug) into an error code, so no unwinding crosses into C.

use std::cell::RefCell;
use std::ffi::CString;
use std::panic::{catch_unwind, AssertUnwindSafe};

use libc::{
    E2BIG, EACCES, EAGAIN, EBUSY, EINVAL, EIO, ENODEV, ENOENT, ENOMEM, ENOTRECOVERABLE, EOPNOTSUPP, EPERM,
    ERANGE, ETIMEDOUT,
};
use vfpoll_dma::DmaError;
use vfpoll_nvme::NvmeError;
use vfpoll_pci::vfio::VfioError;

/// A failed call: the positive errno value, and the message.
#[derive(Debug)]
pub(crate) struct Error {
    pub errno: i32,
    pub msg: String,
}

/// `Result` with [`Error`].
pub(crate) type Res<T> = Result<T, Error>;

impl Error {
    /// An error with `errno` (positive) and `msg`.
    pub fn new(errno: i32, msg: impl Into<String>) -> Self {
        Error {
            errno,
            msg: msg.into(),
        }
    }

    /// A bad argument (`EINVAL`).
    pub fn inval(msg: impl Into<String>) -> Self {
        Self::new(EINVAL, msg)
    }
}

/// The message of `e` with its sources, as one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        src = c.source();
    }
    s
}

impl From<NvmeError> for Error {
    fn from(e: NvmeError) -> Self {
        Error::new(nvme_errno(&e), chain(&e))
    }
}

impl From<DmaError> for Error {
    fn from(e: DmaError) -> Self {
        Error::new(dma_errno(&e), chain(&e))
    }
}

impl From<VfioError> for Error {
    fn from(e: VfioError) -> Self {
        Error::new(vfio_errno(&e), chain(&e))
    }
}

/// The errno for an NVMe driver error. Completions carry it too, so it is what an I/O engine
/// such as fio reports: `EIO` for a command the controller failed (the NVMe status is beside
/// it), `EAGAIN` for a full queue, `EINVAL` for a request the driver refuses as malformed.
pub(crate) fn nvme_errno(e: &NvmeError) -> i32 {
    match e {
        NvmeError::Status { .. } => EIO,
        NvmeError::InitTimeout { .. } | NvmeError::Timeout { .. } => ETIMEDOUT,
        NvmeError::DeviceGone => ENODEV,
        NvmeError::Unsupported(_) | NvmeError::Refused { .. } => EOPNOTSUPP,
        NvmeError::QueueFull { .. } => EAGAIN,
        NvmeError::NoSuchNamespace { .. } => ENOENT,
        NvmeError::LbaOutOfRange { .. } => ERANGE,
        NvmeError::BadLength { .. }
        | NvmeError::Metadata { .. }
        | NvmeError::InvalidOption(_)
        | NvmeError::Buffer(_) => EINVAL,
        NvmeError::TooLarge { .. } => E2BIG,
        NvmeError::Unconfirmed(_) => EPERM,
        NvmeError::Dma(d) => dma_errno(d),
        NvmeError::Vfio(v) => vfio_errno(v),
        _ => EIO,
    }
}

fn dma_errno(e: &DmaError) -> i32 {
    match e {
        DmaError::IovaExhausted { .. }
        | DmaError::HugepagesUnavailable { .. }
        | DmaError::Huge1GNotReserved { .. }
        | DmaError::MemlockLimit { .. }
        | DmaError::Mmap { .. } => ENOMEM,
        DmaError::BadPoolGeometry { .. }
        | DmaError::OutOfBounds { .. }
        | DmaError::Misaligned { .. }
        | DmaError::BadLength { .. }
        | DmaError::NullPointer
        | DmaError::ForeignBuffer { .. } => EINVAL,
        DmaError::InUse { .. } => EBUSY,
        DmaError::PeerMap { .. } => EOPNOTSUPP,
        DmaError::PhysAddrNeedsRoot => EPERM,
        DmaError::HugepageSizeUnsupported { .. } => EOPNOTSUPP,
        _ => EIO,
    }
}

fn vfio_errno(e: &VfioError) -> i32 {
    match e {
        VfioError::NoVfio { .. } | VfioError::NoIommufd { .. } => ENOENT,
        VfioError::NoCdev { .. } => ENODEV,
        VfioError::IommufdNoIommu { .. } => EINVAL,
        VfioError::DeviceBusy { .. } => EBUSY,
        VfioError::PeerBarUnderIommufd { .. } => EOPNOTSUPP,
        VfioError::Permission { .. } => EACCES,
        VfioError::NoIommuNotEnabled => EPERM,
        VfioError::ApiVersion(_) | VfioError::NoType1 => EOPNOTSUPP,
        VfioError::NoGroup { .. } | VfioError::NotBound { .. } => ENODEV,
        VfioError::NoIommuGroup { .. } | VfioError::HasIommu { .. } | VfioError::NotInNoIommu => EINVAL,
        VfioError::GroupBusy { .. } | VfioError::GroupNotViable { .. } => EBUSY,
        VfioError::Map { source, .. } | VfioError::Io { source, .. } => source.raw_os_error().unwrap_or(EIO),
        _ => EIO,
    }
}

thread_local! {
    /// The message of this thread's last failed call.
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `msg` as this thread's last error (interior NUL bytes become spaces).
pub(crate) fn set_last(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST.with(|l| *l.borrow_mut() = c);
}

/// This thread's last error message; the pointer stays valid until the next failing call on
/// this thread (the thread-local string is replaced then, not before).
pub(crate) fn last_ptr() -> *const std::ffi::c_char {
    LAST.with(|l| l.borrow().as_ptr())
}

/// Runs the body of entry point `func`: its value on success (at least 0), `-errno` on an error
/// (with the message recorded), `-ENOTRECOVERABLE` on a panic (a bug in vfpoll: the message
/// says so). Nothing unwinds past this.
pub(crate) fn guard(func: &str, f: impl FnOnce() -> Res<i32>) -> i32 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            set_last(&format!("{func}: {}", e.msg));
            -e.errno.abs().max(1)
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(no message)".into());
            set_last(&format!(
                "{func}: internal error in libvfpoll (a bug, please report it): {what}"
            ));
            -ENOTRECOVERABLE
        }
    }
}
