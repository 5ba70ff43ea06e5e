//! The C interfaces this crate reads other objects' memory through: CPython's buffer protocol
//! and DLPack capsules. All of the crate's `unsafe` lives here.
//!
//! Trust model: the exporting object (numpy, torch, CuPy, bytearray, ...) is trusted to describe
//! its own memory truthfully (pointer, length, strides, device), as every consumer of these
//! protocols does. What we check is everything we are able to: contiguity, writability, the
//! device, and that a length does not overflow. No Rust reference is ever made into the memory:
//! it leaves this module as an address and a length.
//!
//! Why our own declarations of `Py_buffer`, `PyObject_GetBuffer` and `PyBuffer_Release`: the
//! wheel targets the stable ABI from Python 3.9 (`abi3-py39`), and pyo3-ffi declares the buffer
//! protocol for the limited API only from 3.11, when CPython added it to the stable ABI. The
//! functions exist, exported, in every CPython 3 interpreter, and the struct's layout is the one
//! CPython has used since 3.3 (the layout 3.11 froze into the stable ABI), so the declarations
//! below are valid on every interpreter the wheel installs on.

use std::ffi::{c_char, c_int, c_void, CStr};

use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::ffi::{self as py, PyObject, Py_ssize_t};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

/// CPython's `Py_buffer` (Include/pybuffer.h; the same from 3.3 to today).
#[repr(C)]
struct PyBuffer {
    buf: *mut c_void,
    obj: *mut PyObject,
    len: Py_ssize_t,
    itemsize: Py_ssize_t,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut Py_ssize_t,
    strides: *mut Py_ssize_t,
    suboffsets: *mut Py_ssize_t,
    internal: *mut c_void,
}

const PYBUF_WRITABLE: c_int = 0x0001;
const PYBUF_ND: c_int = 0x0008;
const PYBUF_STRIDES: c_int = 0x0010 | PYBUF_ND;
const PYBUF_C_CONTIGUOUS: c_int = 0x0020 | PYBUF_STRIDES;

extern "C" {
    fn PyObject_GetBuffer(obj: *mut PyObject, view: *mut PyBuffer, flags: c_int) -> c_int;
    fn PyBuffer_Release(view: *mut PyBuffer);
}

/// An exported buffer of a Python object, released on drop (which takes the GIL).
pub struct HostView {
    // Boxed: CPython may keep a pointer to the struct (`internal`) until release.
    view: Box<PyBuffer>,
}

// SAFETY: the view is only an address, a length and an owned reference to the exporter; the
// reference is released under the GIL (`Drop` attaches), and the address is never dereferenced
// through a Rust reference.
unsafe impl Send for HostView {}
// SAFETY: as above; no method mutates it.
unsafe impl Sync for HostView {}

impl HostView {
    /// Exports `obj`'s memory as one C-contiguous run of bytes (`PyBUF_C_CONTIGUOUS`, plus
    /// `PyBUF_WRITABLE` when `writable`). An object that cannot give that is a `BufferError`
    /// or `TypeError` saying why.
    pub fn get(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<HostView> {
        let mut view = Box::new(PyBuffer {
            buf: std::ptr::null_mut(),
            obj: std::ptr::null_mut(),
            len: 0,
            itemsize: 0,
            readonly: 0,
            ndim: 0,
            format: std::ptr::null_mut(),
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            suboffsets: std::ptr::null_mut(),
            internal: std::ptr::null_mut(),
        });
        let flags = PYBUF_C_CONTIGUOUS | if writable { PYBUF_WRITABLE } else { 0 };
        // SAFETY: `obj` is a live object (we hold the GIL through `Bound`); `view` points at a
        // `Py_buffer`-layout struct that lives until we release it.
        let r = unsafe { PyObject_GetBuffer(obj.as_ptr(), &mut *view, flags) };
        if r != 0 {
            // A TypeError stays one (not a buffer at all); any other refusal (numpy says
            // ValueError for a strided or read-only array) is a BufferError. Both keep the
            // exporter's words and say what would do.
            let py = obj.py();
            let cause = PyErr::take(py).unwrap_or_else(|| PyBufferError::new_err("no buffer"));
            let kind = obj.get_type().name().map(|n| n.to_string()).unwrap_or_default();
            let why = cause.value(py).to_string();
            return Err(if cause.is_instance_of::<PyTypeError>(py) {
                PyTypeError::new_err(format!(
                    "{kind} is not a buffer ({why}): pass a numpy array, bytes, bytearray, memoryview, \
                     or a GPU array with __dlpack__ or __cuda_array_interface__"
                ))
            } else {
                let want = if writable {
                    "a writable C-contiguous buffer"
                } else {
                    "a C-contiguous buffer"
                };
                PyBufferError::new_err(format!(
                    "{kind} does not give {want} ({why}): pass a contiguous{} copy, e.g. numpy.array(a, order='C')",
                    if writable { ", writable" } else { "" }
                ))
            });
        }
        if view.len < 0 {
            let h = HostView { view };
            return Err(PyValueError::new_err(format!(
                "buffer with a negative length {}",
                h.view.len
            )));
        }
        Ok(HostView { view })
    }

    /// The first byte's address.
    pub fn addr(&self) -> usize {
        self.view.buf as usize
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.view.len as usize
    }

    /// Whether the exporter allows writing.
    pub fn writable(&self) -> bool {
        self.view.readonly == 0
    }
}

impl Drop for HostView {
    fn drop(&mut self) {
        Python::attach(|_| {
            // SAFETY: the view was filled by a successful PyObject_GetBuffer and is released
            // once, with the GIL held.
            unsafe { PyBuffer_Release(&mut *self.view) }
        });
    }
}

/// DLPack's `DLDevice`.
#[repr(C)]
#[derive(Clone, Copy)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

/// DLPack's `DLDataType`.
#[repr(C)]
#[derive(Clone, Copy)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

/// DLPack's `DLTensor` (dlpack.h, unchanged since v0.2).
#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

/// DLPack's `DLManagedTensor` (the unversioned one, capsule name "dltensor").
#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

/// DLPack device types.
pub mod dl {
    /// `kDLCPU`.
    pub const CPU: i32 = 1;
    /// `kDLCUDA`.
    pub const CUDA: i32 = 2;
    /// `kDLCUDAHost` (pinned host memory).
    pub const CUDA_HOST: i32 = 3;
    /// `kDLCUDAManaged`.
    pub const CUDA_MANAGED: i32 = 13;
}

/// A tensor taken out of a DLPack capsule: we own it and call its deleter on drop.
pub struct DlView {
    managed: *mut DlManagedTensor,
    addr: usize,
    len: usize,
    device_type: i32,
    device_id: i32,
    readonly: bool,
}

// SAFETY: the managed tensor is owned by us alone once the capsule is renamed "used_dltensor";
// DLPack lets the consumer call the deleter from any thread (we attach to Python first anyway,
// since deleters of Python producers touch Python objects).
unsafe impl Send for DlView {}
// SAFETY: as above; no method mutates it.
unsafe impl Sync for DlView {}

const DLTENSOR: &CStr = c"dltensor";
const USED_DLTENSOR: &CStr = c"used_dltensor";

impl DlView {
    /// Consumes a DLPack capsule (`obj.__dlpack__()`'s result): checks that the tensor is one
    /// compact (row-major) run of bytes and takes ownership of it.
    pub fn from_capsule(capsule: &Bound<'_, PyCapsule>, what: &str) -> PyResult<DlView> {
        let raw = capsule.as_ptr();
        // SAFETY: `raw` is a live capsule (held by `capsule`); PyCapsule_IsValid only reads it.
        if unsafe { py::PyCapsule_IsValid(raw, DLTENSOR.as_ptr()) } != 1 {
            return Err(PyTypeError::new_err(format!(
                "{what}.__dlpack__() did not return an unused \"dltensor\" capsule"
            )));
        }
        // SAFETY: valid capsule of that name (checked just above).
        let p = unsafe { py::PyCapsule_GetPointer(raw, DLTENSOR.as_ptr()) } as *mut DlManagedTensor;
        if p.is_null() {
            return Err(PyErr::take(capsule.py())
                .unwrap_or_else(|| PyTypeError::new_err(format!("{what}: empty DLPack capsule"))));
        }
        // From here on we own the tensor: rename the capsule so that its destructor leaves it
        // alone (the DLPack protocol's hand-over).
        // SAFETY: live capsule; the name is a static string, as the API requires.
        if unsafe { py::PyCapsule_SetName(raw, USED_DLTENSOR.as_ptr()) } != 0 {
            return Err(PyErr::fetch(capsule.py()));
        }
        let mut v = DlView {
            managed: p,
            addr: 0,
            len: 0,
            device_type: 0,
            device_id: 0,
            readonly: false,
        };
        // SAFETY: `p` is the producer's DLManagedTensor, valid until its deleter runs (on
        // our drop); shape and strides hold `ndim` entries (strides may be null: compact).
        let (t_data, dev, ndim, dtype, shape, strides, offset) = unsafe {
            let t = &(*p).dl_tensor;
            (
                t.data,
                t.device,
                t.ndim,
                t.dtype,
                t.shape,
                t.strides,
                t.byte_offset,
            )
        };
        v.device_type = dev.device_type;
        v.device_id = dev.device_id;
        if dtype.lanes != 1 || dtype.bits % 8 != 0 || dtype.bits == 0 {
            return Err(PyTypeError::new_err(format!(
                "{what}: DLPack elements of {} bits x {} lanes are not whole bytes",
                dtype.bits, dtype.lanes
            )));
        }
        if ndim < 0 || (ndim > 0 && shape.is_null()) {
            return Err(PyValueError::new_err(format!(
                "{what}: DLPack tensor with a bad shape"
            )));
        }
        let dims: Vec<i64> = if ndim == 0 {
            Vec::new()
        } else {
            // SAFETY: `shape` holds `ndim` entries (checked non-null when ndim > 0), valid until
            // the deleter runs.
            unsafe { std::slice::from_raw_parts(shape, ndim as usize) }.to_vec()
        };
        let item = i64::from(dtype.bits / 8);
        if !strides.is_null() {
            let st: Vec<i64> = if ndim == 0 {
                Vec::new()
            } else {
                // SAFETY: non-null strides hold `ndim` entries.
                unsafe { std::slice::from_raw_parts(strides, ndim as usize) }.to_vec()
            };
            let mut expect = 1i64;
            for i in (0..dims.len()).rev() {
                if dims[i] != 1 && st[i] != expect {
                    return Err(PyBufferError::new_err(format!(
                        "{what} is not contiguous (shape {dims:?}, strides {st:?}): pass a contiguous copy (tensor.contiguous())"
                    )));
                }
                expect = expect.saturating_mul(dims[i].max(1));
            }
        }
        let elems = dims
            .iter()
            .try_fold(1i64, |a, &d| if d < 0 { None } else { a.checked_mul(d) });
        let len = elems
            .and_then(|e| e.checked_mul(item))
            .and_then(|b| usize::try_from(b).ok())
            .ok_or_else(|| PyValueError::new_err(format!("{what}: DLPack tensor size overflows")))?;
        v.addr = (t_data as usize)
            .checked_add(offset as usize)
            .ok_or_else(|| PyValueError::new_err(format!("{what}: DLPack address overflows")))?;
        v.len = len;
        Ok(v)
    }

    /// The first byte's address (a device address for CUDA memory).
    pub fn addr(&self) -> usize {
        self.addr
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// The DLPack device (type, ordinal) the tensor says it lives on.
    pub fn device(&self) -> (i32, i32) {
        (self.device_type, self.device_id)
    }
    /// Whether the producer marked it read-only (unversioned DLPack has no flag: false).
    pub fn readonly(&self) -> bool {
        self.readonly
    }
}

impl Drop for DlView {
    fn drop(&mut self) {
        Python::attach(|_| {
            // SAFETY: we own the managed tensor (the capsule was renamed "used_dltensor") and
            // it is alive until its deleter runs, below.
            let deleter = unsafe { (*self.managed).deleter };
            if let Some(d) = deleter {
                // SAFETY: the producer's deleter frees the tensor exactly once, here.
                unsafe { d(self.managed) }
            }
        });
    }
}

/// The bytes of host memory at `addr..addr + len`, read-only.
///
/// # Safety
/// The range must be the host range of a live [`crate::buffer::Buffer`] (its exporter keeps the
/// memory mapped), and that buffer must outlive every use of the slice. The bytes may be
/// written meanwhile by another thread of the caller's program only in breach of the package's
/// documented rule (leave an array alone while vfpoll uses it).
pub unsafe fn host_bytes<'a>(addr: usize, len: usize) -> &'a [u8] {
    if len == 0 {
        return &[];
    }
    // SAFETY: the caller's contract above; `len > 0` so `addr` is the exporter's non-null pointer.
    unsafe { std::slice::from_raw_parts(addr as *const u8, len) }
}

/// The bytes of writable host memory at `addr..addr + len`.
///
/// # Safety
/// As [`host_bytes`], for a buffer acquired writable, and no other slice of the range in use.
pub unsafe fn host_bytes_mut<'a>(addr: usize, len: usize) -> &'a mut [u8] {
    if len == 0 {
        return &mut [];
    }
    // SAFETY: the caller's contract above.
    unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) }
}
