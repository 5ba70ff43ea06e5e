//! Python objects as memory the store can read or write: host memory through the buffer
//! protocol (numpy, bytes, bytearray, memoryview, mmap, ...) or DLPack on the CPU (torch CPU
//! tensors), and CUDA device memory through `__cuda_array_interface__` or DLPack (torch, CuPy,
//! JAX, numba).
//!
//! A [`Buffer`] keeps its exporter alive (and, for the buffer protocol, exported: numpy cannot
//! resize or free it meanwhile) until it is dropped, and hands out only an address range: the
//! bytes are moved by the store with raw copies, never through a Rust reference, so another
//! Python thread writing the same array while the GIL is released races on the bytes (as with
//! any I/O library), not on Rust's aliasing rules. Callers must leave an array alone while an
//! operation on it runs (for an async save: until `staged()`).

use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyTuple};

use crate::ffi::{dl, DlView, HostView};

/// Where a buffer's bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Host memory, addressable by the CPU.
    Host,
    /// CUDA device memory on the device of this ordinal (an address in the device's primary
    /// context, the one PyTorch and CuPy use).
    Cuda(i32),
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Place::Host => f.write_str("host"),
            Place::Cuda(d) => write!(f, "cuda:{d}"),
        }
    }
}

/// What keeps a buffer's memory alive and exported.
enum Hold {
    Host(#[allow(dead_code)] HostView),
    Dl(#[allow(dead_code)] DlView),
    Object(#[allow(dead_code)] Py<PyAny>),
}

/// A Python object's memory: one contiguous range, held until drop.
pub struct Buffer {
    addr: usize,
    len: usize,
    place: Place,
    writable: bool,
    stream: Option<usize>,
    _hold: Hold,
}

/// The address range of a [`Buffer`], `Send` so that it can go where the GIL is released.
#[derive(Debug, Clone, Copy)]
pub struct Range {
    /// First byte (host address, or device address for [`Place::Cuda`]).
    pub addr: usize,
    /// Length in bytes.
    pub len: usize,
    /// Where it is.
    pub place: Place,
    /// A CUDA stream (`__cuda_array_interface__`'s `stream`) on which the producer may still be
    /// writing the bytes: copies wait for it first.
    pub stream: Option<usize>,
}

impl Buffer {
    /// The memory of `obj`, which must be one contiguous range; `writable` for loads (the
    /// object must accept writes). `what` names the object in errors ("array 'w'").
    pub fn new(obj: &Bound<'_, PyAny>, writable: bool, what: &str) -> PyResult<Buffer> {
        if let Ok(cai) = obj.getattr("__cuda_array_interface__") {
            return Self::from_cuda_array_interface(obj, &cai, writable, what);
        }
        let dl_device = dlpack_device(obj)?;
        match dl_device {
            Some((t, id)) if t == dl::CUDA || t == dl::CUDA_MANAGED => {
                return Self::from_dlpack(obj, writable, what, Place::Cuda(id));
            }
            Some((t, _)) if t != dl::CPU && t != dl::CUDA_HOST => {
                return Err(PyTypeError::new_err(format!(
                    "{what} lives on DLPack device type {t}: vfpoll moves host memory and CUDA memory only"
                )));
            }
            _ => {}
        }
        match HostView::get(obj, writable) {
            Ok(v) => Ok(Buffer {
                addr: v.addr(),
                len: v.len(),
                place: Place::Host,
                writable: v.writable(),
                stream: None,
                _hold: Hold::Host(v),
            }),
            // torch CPU tensors have no buffer protocol but do have DLPack.
            Err(e) if dl_device.is_some() && e.is_instance_of::<PyTypeError>(obj.py()) => {
                Self::from_dlpack(obj, writable, what, Place::Host)
            }
            Err(e) => Err(PyErr::from_type(
                e.get_type(obj.py()),
                format!("{what}: {}", e.value(obj.py())),
            )),
        }
    }

    fn from_dlpack(obj: &Bound<'_, PyAny>, writable: bool, what: &str, place: Place) -> PyResult<Buffer> {
        // For CUDA, stream=1 (the legacy default stream): the producer makes that stream wait
        // for its pending work on the tensor, and our copies run on a blocking stream, which
        // waits for the legacy one. Producers older than the stream argument get none.
        let cap = match place {
            Place::Cuda(_) => {
                let kw = pyo3::types::PyDict::new(obj.py());
                kw.set_item("stream", 1)?;
                match obj.call_method("__dlpack__", (), Some(&kw)) {
                    Ok(c) => c,
                    Err(e) if e.is_instance_of::<PyTypeError>(obj.py()) => obj.call_method0("__dlpack__")?,
                    Err(e) => return Err(e),
                }
            }
            Place::Host => obj.call_method0("__dlpack__")?,
        };
        let cap = cap
            .cast_into::<PyCapsule>()
            .map_err(|_| PyTypeError::new_err(format!("{what}.__dlpack__() did not return a capsule")))?;
        let v = DlView::from_capsule(&cap, what)?;
        let (t, id) = v.device();
        let agrees = match place {
            Place::Host => t == dl::CPU || t == dl::CUDA_HOST,
            Place::Cuda(d) => (t == dl::CUDA || t == dl::CUDA_MANAGED) && id == d,
        };
        if !agrees {
            return Err(PyValueError::new_err(format!(
                "{what}: __dlpack__ gave a tensor on device type {t} ordinal {id}, but __dlpack_device__ said {place}"
            )));
        }
        if writable && v.readonly() {
            return Err(PyBufferError::new_err(format!("{what} is read-only")));
        }
        Ok(Buffer {
            addr: v.addr(),
            len: v.len(),
            place,
            writable: !v.readonly(),
            stream: None,
            _hold: Hold::Dl(v),
        })
    }

    fn from_cuda_array_interface(
        obj: &Bound<'_, PyAny>,
        cai: &Bound<'_, PyAny>,
        writable: bool,
        what: &str,
    ) -> PyResult<Buffer> {
        let cai = cai
            .cast::<PyDict>()
            .map_err(|_| PyTypeError::new_err(format!("{what}.__cuda_array_interface__ is not a dict")))?;
        let get = |k: &str| -> PyResult<Bound<'_, PyAny>> {
            cai.get_item(k)?
                .ok_or_else(|| PyValueError::new_err(format!("{what}.__cuda_array_interface__ has no '{k}'")))
        };
        let data = get("data")?;
        let data = data.cast::<PyTuple>().map_err(|_| {
            PyTypeError::new_err(format!("{what}.__cuda_array_interface__['data'] is not a tuple"))
        })?;
        let addr: usize = data.get_item(0)?.extract()?;
        let readonly: bool = data.get_item(1)?.extract()?;
        let shape: Vec<i64> = get("shape")?.extract()?;
        let typestr: String = get("typestr")?.extract()?;
        let item: i64 = typestr
            .get(2..)
            .and_then(|s| s.parse().ok())
            .filter(|&n: &i64| n > 0)
            .ok_or_else(|| PyValueError::new_err(format!("{what}: bad typestr {typestr:?}")))?;
        if let Some(strides) = cai.get_item("strides")? {
            if !strides.is_none() {
                let st: Vec<i64> = strides.extract()?;
                let mut expect = item;
                for i in (0..shape.len()).rev() {
                    if shape[i] != 1 && st.get(i) != Some(&expect) {
                        return Err(PyBufferError::new_err(format!(
                            "{what} is not contiguous (shape {shape:?}, strides {st:?}): pass a contiguous copy"
                        )));
                    }
                    expect = expect.saturating_mul(shape[i].max(1));
                }
            }
        }
        if cai.get_item("mask")?.is_some_and(|m| !m.is_none()) {
            return Err(PyValueError::new_err(format!("{what} is a masked array")));
        }
        let len = shape
            .iter()
            .try_fold(item, |a, &d| if d < 0 { None } else { a.checked_mul(d) })
            .and_then(|b| usize::try_from(b).ok())
            .ok_or_else(|| PyValueError::new_err(format!("{what}: size overflows")))?;
        if writable && readonly {
            return Err(PyBufferError::new_err(format!("{what} is read-only")));
        }
        // Version 3's `stream`: the producer's stream, which the consumer must wait for
        // (None: the producer needs no synchronisation; 0 is not allowed).
        let stream = match cai.get_item("stream")? {
            Some(s) if !s.is_none() => Some(s.extract::<usize>()?).filter(|&s| s != 0),
            _ => None,
        };
        let device = cuda_device_of(obj)?;
        Ok(Buffer {
            addr,
            len,
            place: Place::Cuda(device),
            writable: !readonly,
            stream,
            _hold: Hold::Object(obj.clone().unbind()),
        })
    }

    /// The address range.
    pub fn range(&self) -> Range {
        Range {
            addr: self.addr,
            len: self.len,
            place: self.place,
            stream: self.stream,
        }
    }

    /// Where the bytes are.
    pub fn place(&self) -> Place {
        self.place
    }

    /// Whether the exporter allows writing.
    pub fn writable(&self) -> bool {
        self.writable
    }
}

/// `obj.__dlpack_device__()` as (device type, id), or `None` without DLPack.
fn dlpack_device(obj: &Bound<'_, PyAny>) -> PyResult<Option<(i32, i32)>> {
    match obj.getattr("__dlpack_device__") {
        Ok(f) => {
            let (t, id): (i32, i32) = f.call0()?.extract()?;
            Ok(Some((t, id)))
        }
        Err(_) => Ok(None),
    }
}

/// The CUDA ordinal of a `__cuda_array_interface__` exporter: its DLPack device when it has
/// one (torch, CuPy), else `obj.device.id` (CuPy, numba), else 0.
fn cuda_device_of(obj: &Bound<'_, PyAny>) -> PyResult<i32> {
    if let Some((_, id)) = dlpack_device(obj)? {
        return Ok(id);
    }
    if let Ok(dev) = obj.getattr("device") {
        if let Ok(id) = dev.getattr("id").and_then(|i| i.extract::<i32>()) {
            return Ok(id);
        }
    }
    Ok(0)
}
