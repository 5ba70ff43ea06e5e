//! The `vfpoll.StoreError` hierarchy: every error of the store reaches Python as one of these
//! classes, with the store's own message (which says what failed and what to do).
//!
//! | class | bases | store error |
//! | --- | --- | --- |
//! | `StoreError` | `Exception` | any (base), `NotAStore`, `Poisoned`, `Internal` |
//! | `SpecError` | `StoreError`, `ValueError` | `Invalid`: a spec, an option or a name refused |
//! | `NotFoundError` | `StoreError`, `LookupError` | `NotFound` |
//! | `ExistsError` | `StoreError`, `ValueError` | `Exists` |
//! | `CorruptError` | `StoreError` | `Corrupt`, `Checksum` |
//! | `StoreFullError` | `StoreError` | `Full` |
//! | `InUseError` | `StoreError` | `InUse`, `Lock` |
//! | `ClosedError` | `StoreError`, `ValueError` | (the binding: the store was closed) |
//! | `DeviceError` | `StoreError`, `OSError` | `Device`, `Timeout`, `Copy` (CUDA) |
//!
//! Second bases let Python code catch them the usual way (`except ValueError`, `LookupError`).

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};
use vfpoll_store::StoreError as SErr;

create_exception!(
    vfpoll,
    StoreError,
    PyException,
    "Any error of the vfpoll store; the message is the store's own."
);

/// Which class an error becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `StoreError`.
    Store,
    /// `SpecError`.
    Spec,
    /// `NotFoundError`.
    NotFound,
    /// `ExistsError`.
    Exists,
    /// `CorruptError`.
    Corrupt,
    /// `StoreFullError`.
    Full,
    /// `InUseError`.
    InUse,
    /// `ClosedError`.
    Closed,
    /// `DeviceError`.
    Device,
}

/// (name, second base, doc) of each subclass, in [`Kind`] order after `Store`.
const CLASSES: [(Kind, &str, &str, &str); 8] = [
    (
        Kind::Spec,
        "SpecError",
        "ValueError",
        "A namespace spec, an option or a name the store refuses.",
    ),
    (
        Kind::NotFound,
        "NotFoundError",
        "LookupError",
        "No such checkpoint, version, entry or pool.",
    ),
    (
        Kind::Exists,
        "ExistsError",
        "ValueError",
        "The name is taken (an entry twice in one version, a pool).",
    ),
    (
        Kind::Corrupt,
        "CorruptError",
        "",
        "Bytes on the store failed a check (magic, version, crc32c, bounds); nothing was returned from them.",
    ),
    (
        Kind::Full,
        "StoreFullError",
        "",
        "Not enough free space; the committed versions are intact.",
    ),
    (
        Kind::InUse,
        "InUseError",
        "",
        "The store is open in another process (the message names its PID) or its lock file cannot be made.",
    ),
    (Kind::Closed, "ClosedError", "ValueError", "The store was closed."),
    (
        Kind::Device,
        "DeviceError",
        "OSError",
        "A namespace's I/O, or a CUDA copy, failed.",
    ),
];

static TYPES: PyOnceLock<Vec<(Kind, Py<PyType>)>> = PyOnceLock::new();

fn types(py: Python<'_>) -> PyResult<&Vec<(Kind, Py<PyType>)>> {
    TYPES.get_or_try_init(py, || {
        let builtins = py.import("builtins")?;
        let type_ = builtins.getattr("type")?;
        let base = py.get_type::<StoreError>();
        let mut v = vec![(Kind::Store, base.clone().unbind())];
        for (kind, name, second, doc) in CLASSES {
            let bases = if second.is_empty() {
                PyTuple::new(py, [base.as_any().clone()])?
            } else {
                PyTuple::new(py, [base.as_any().clone(), builtins.getattr(second)?])?
            };
            let ns = PyDict::new(py);
            ns.set_item("__doc__", doc)?;
            ns.set_item("__module__", "vfpoll")?;
            let t = type_.call1((name, bases, ns))?.cast_into::<PyType>()?;
            v.push((kind, t.unbind()));
        }
        Ok::<_, PyErr>(v)
    })
}

/// An error with its class, kept across threads (an async save's) until Python asks for it.
#[derive(Debug, Clone)]
pub struct Failure {
    /// The class.
    pub kind: Kind,
    /// The message.
    pub msg: String,
}

impl Failure {
    /// A failure of class `kind`.
    pub fn new(kind: Kind, msg: impl Into<String>) -> Self {
        Failure {
            kind,
            msg: msg.into(),
        }
    }

    /// The Python exception.
    pub fn to_py(&self, py: Python<'_>) -> PyErr {
        match types(py) {
            Ok(t) => {
                let cls = t
                    .iter()
                    .find(|(k, _)| *k == self.kind)
                    .map(|(_, c)| c)
                    .unwrap_or(&t[0].1);
                PyErr::from_type(cls.bind(py).clone(), self.msg.clone())
            }
            Err(e) => e,
        }
    }
}

impl From<SErr> for Failure {
    fn from(e: SErr) -> Self {
        let kind = match &e {
            SErr::Invalid(_) => Kind::Spec,
            SErr::NotFound(_) => Kind::NotFound,
            SErr::Exists(_) => Kind::Exists,
            SErr::Corrupt(_) | SErr::Checksum { .. } => Kind::Corrupt,
            SErr::Full { .. } => Kind::Full,
            SErr::InUse { .. } | SErr::Lock { .. } => Kind::InUse,
            SErr::Device { .. } | SErr::Timeout { .. } | SErr::Copy(_) => Kind::Device,
            _ => Kind::Store,
        };
        // The whole chain: the store's message and its sources (an io_uring errno, a CUDA code).
        let mut msg = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            let t = s.to_string();
            if !msg.contains(&t) {
                msg.push_str(": ");
                msg.push_str(&t);
            }
            src = s.source();
        }
        Failure { kind, msg }
    }
}

impl From<vfpoll_gpu::CopyError> for Failure {
    fn from(e: vfpoll_gpu::CopyError) -> Self {
        Failure::new(Kind::Device, format!("GPU copy: {e}"))
    }
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Self {
        Failure::new(Kind::Store, format!("host staging memory: {e}"))
    }
}

/// A store error as a Python exception.
pub fn py_err(py: Python<'_>, e: impl Into<Failure>) -> PyErr {
    e.into().to_py(py)
}

/// Adds the classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    for (kind, cls) in types(py)? {
        let name = if *kind == Kind::Store {
            "StoreError".to_string()
        } else {
            cls.bind(py).name()?.to_string()
        };
        m.add(name.as_str(), cls.bind(py))?;
    }
    Ok(())
}
