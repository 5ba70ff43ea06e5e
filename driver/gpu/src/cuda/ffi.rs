//! The CUDA driver API functions vfpoll uses, loaded from `libcuda.so.1` with `dlopen` at run
//! time, so that building needs no CUDA and a machine without a GPU gets an error, not a link
//! failure. Types and values are those of `cuda.h` (CUDA 12/13; all are stable ABI). The
//! versioned names (`_v2`) are the ones `cuda.h` maps the plain names to on 64-bit hosts.
//!
//! Trust model: the library is the NVIDIA driver's; we trust it to implement these signatures.
//! A missing function is an error at load time ([`Api::load`]), never a panic at call time
//! (except `cuMemGetHandleForAddressRange`, optional: older drivers lack it).

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr, CString};
use std::sync::OnceLock;

use crate::error::CopyError;

/// `CUresult`.
pub type CuResult = c_int;
/// `CUdevice`.
pub type CuDevice = c_int;
/// `CUdeviceptr` (64-bit).
pub type CuDevicePtr = c_ulonglong;
/// `CUcontext`.
pub type CuContext = *mut c_void;
/// `CUstream`.
pub type CuStream = *mut c_void;
/// `CUevent`.
pub type CuEvent = *mut c_void;

/// `CUDA_SUCCESS`.
pub const CUDA_SUCCESS: CuResult = 0;
/// `CUDA_ERROR_NOT_READY`: an event or stream has work pending.
pub const CUDA_ERROR_NOT_READY: CuResult = 600;

/// `CU_STREAM_NON_BLOCKING`: no implicit synchronisation with the legacy default stream.
pub const CU_STREAM_NON_BLOCKING: c_uint = 0x1;
/// `CU_EVENT_BLOCKING_SYNC`: `cuEventSynchronize` sleeps instead of spinning.
pub const CU_EVENT_BLOCKING_SYNC: c_uint = 0x1;
/// `CU_EVENT_DISABLE_TIMING`: the cheapest kind of event.
pub const CU_EVENT_DISABLE_TIMING: c_uint = 0x2;
/// `CU_MEMHOSTREGISTER_PORTABLE`: every context sees the registration.
pub const CU_MEMHOSTREGISTER_PORTABLE: c_uint = 0x1;
/// `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`.
pub const CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD: c_int = 0x1;

/// `CUdevice_attribute` values vfpoll reads.
pub mod attr {
    /// PCI bus of the device.
    pub const PCI_BUS_ID: i32 = 33;
    /// PCI device of the device.
    pub const PCI_DEVICE_ID: i32 = 34;
    /// Copy engines that run concurrently with kernels.
    pub const ASYNC_ENGINE_COUNT: i32 = 40;
    /// PCI domain of the device.
    pub const PCI_DOMAIN_ID: i32 = 50;
    /// Compute capability, major.
    pub const COMPUTE_CAPABILITY_MAJOR: i32 = 75;
    /// Compute capability, minor.
    pub const COMPUTE_CAPABILITY_MINOR: i32 = 76;
    /// `cuMemHostRegister` is supported.
    pub const HOST_REGISTER_SUPPORTED: i32 = 99;
    /// GPUDirect RDMA (`nvidia_p2p_get_pages`) is supported.
    pub const GPU_DIRECT_RDMA_SUPPORTED: i32 = 116;
    /// dma-buf export of device memory is supported.
    pub const DMA_BUF_SUPPORTED: i32 = 124;
}

macro_rules! api {
    ($( $field:ident = $sym:literal : fn($($arg:ty),*) ;)*) => {
        /// The driver API functions, resolved.
        pub struct Api {
            $( #[doc = $sym] pub $field: unsafe extern "C" fn($($arg),*) -> CuResult, )*
            /// `cuMemGetHandleForAddressRange` (CUDA 11.7+), if the driver has it.
            pub mem_get_handle_for_address_range:
                Option<unsafe extern "C" fn(*mut c_void, CuDevicePtr, usize, c_int, c_ulonglong) -> CuResult>,
        }

        impl Api {
            fn resolve(lib: *mut c_void) -> Result<Api, String> {
                Ok(Api {
                    $( $field: {
                        let p = sym(lib, $sym).ok_or_else(|| format!("the CUDA driver has no {}", $sym))?;
                        // SAFETY: `p` is the address of the driver's function of this name,
                        // whose C signature is the one declared here (cuda.h); a function
                        // pointer and a data pointer have the same size on the targets
                        // vfpoll supports (checked below).
                        unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> CuResult>(p) }
                    }, )*
                    mem_get_handle_for_address_range: sym(lib, "cuMemGetHandleForAddressRange").map(|p| {
                        // SAFETY: as above, for `cuMemGetHandleForAddressRange`.
                        unsafe {
                            std::mem::transmute::<
                                *mut c_void,
                                unsafe extern "C" fn(*mut c_void, CuDevicePtr, usize, c_int, c_ulonglong) -> CuResult,
                            >(p)
                        }
                    }),
                })
            }
        }
    };
}

api! {
    init = "cuInit": fn(c_uint);
    driver_get_version = "cuDriverGetVersion": fn(*mut c_int);
    device_get_count = "cuDeviceGetCount": fn(*mut c_int);
    device_get = "cuDeviceGet": fn(*mut CuDevice, c_int);
    device_get_name = "cuDeviceGetName": fn(*mut c_char, c_int, CuDevice);
    device_get_attribute = "cuDeviceGetAttribute": fn(*mut c_int, c_int, CuDevice);
    device_total_mem = "cuDeviceTotalMem_v2": fn(*mut usize, CuDevice);
    primary_ctx_retain = "cuDevicePrimaryCtxRetain": fn(*mut CuContext, CuDevice);
    primary_ctx_release = "cuDevicePrimaryCtxRelease_v2": fn(CuDevice);
    ctx_set_current = "cuCtxSetCurrent": fn(CuContext);
    stream_create = "cuStreamCreate": fn(*mut CuStream, c_uint);
    stream_destroy = "cuStreamDestroy_v2": fn(CuStream);
    stream_synchronize = "cuStreamSynchronize": fn(CuStream);
    event_create = "cuEventCreate": fn(*mut CuEvent, c_uint);
    event_destroy = "cuEventDestroy_v2": fn(CuEvent);
    event_record = "cuEventRecord": fn(CuEvent, CuStream);
    event_query = "cuEventQuery": fn(CuEvent);
    event_synchronize = "cuEventSynchronize": fn(CuEvent);
    mem_alloc = "cuMemAlloc_v2": fn(*mut CuDevicePtr, usize);
    mem_free = "cuMemFree_v2": fn(CuDevicePtr);
    memset_d8 = "cuMemsetD8_v2": fn(CuDevicePtr, u8, usize);
    memcpy_htod_async = "cuMemcpyHtoDAsync_v2": fn(CuDevicePtr, *const c_void, usize, CuStream);
    memcpy_dtoh_async = "cuMemcpyDtoHAsync_v2": fn(*mut c_void, CuDevicePtr, usize, CuStream);
    memcpy_htod = "cuMemcpyHtoD_v2": fn(CuDevicePtr, *const c_void, usize);
    memcpy_dtoh = "cuMemcpyDtoH_v2": fn(*mut c_void, CuDevicePtr, usize);
    mem_host_register = "cuMemHostRegister_v2": fn(*mut c_void, usize, c_uint);
    mem_host_unregister = "cuMemHostUnregister": fn(*mut c_void);
    get_error_name = "cuGetErrorName": fn(CuResult, *mut *const c_char);
    get_error_string = "cuGetErrorString": fn(CuResult, *mut *const c_char);
}

const _: () = assert!(size_of::<*mut c_void>() == size_of::<unsafe extern "C" fn() -> CuResult>());

fn sym(lib: *mut c_void, name: &str) -> Option<*mut c_void> {
    let c = CString::new(name).ok()?;
    // SAFETY: `lib` is a handle from dlopen that is never closed; `c` is a NUL-terminated
    // string that outlives the call.
    let p = unsafe { libc::dlsym(lib, c.as_ptr()) };
    (!p.is_null()).then_some(p)
}

/// The text of the last `dlerror`, if any.
fn dlerror() -> String {
    // SAFETY: dlerror takes no arguments; the string it returns is valid until the next dl*
    // call on this thread, and is copied out at once.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        return "unknown error".into();
    }
    // SAFETY: non-null dlerror results are NUL-terminated strings (see above).
    unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
}

/// The library names tried, in order (`VFPOLL_LIBCUDA` first, when set).
fn candidates() -> Vec<String> {
    let mut v: Vec<String> = std::env::var("VFPOLL_LIBCUDA").into_iter().collect();
    v.extend(["libcuda.so.1".to_string(), "libcuda.so".to_string()]);
    v
}

// `Api` holds only function pointers, which are Send + Sync already.
static API: OnceLock<Result<Api, String>> = OnceLock::new();

impl Api {
    /// Loads the driver once per process (the library is never unloaded).
    pub fn load() -> Result<&'static Api, CopyError> {
        API.get_or_init(|| {
            let mut tried = Vec::new();
            for name in candidates() {
                let Ok(c) = CString::new(name.as_str()) else { continue };
                // SAFETY: `c` is NUL-terminated; loading the NVIDIA driver library runs its
                // initialisers, which is what using CUDA means.
                let lib = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
                if lib.is_null() {
                    tried.push(format!("{name}: {}", dlerror()));
                    continue;
                }
                return Api::resolve(lib);
            }
            Err(format!(
                "cannot load the CUDA driver library ({}); install the NVIDIA driver, or name the library in VFPOLL_LIBCUDA",
                tried.join("; ")
            ))
        })
        .as_ref()
        .map_err(|e| CopyError::Unavailable(e.clone()))
    }

    /// Turns a `CUresult` into a `Result`, with the driver's name and text for errors.
    pub fn check(&self, call: &'static str, r: CuResult) -> Result<(), CopyError> {
        if r == CUDA_SUCCESS {
            return Ok(());
        }
        let text = |f: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult| {
            let mut p: *const c_char = std::ptr::null();
            // SAFETY: `p` is a valid out-pointer; the driver stores a pointer to a static string
            // or leaves it null for an unknown code.
            let ok = unsafe { f(r, &mut p) } == CUDA_SUCCESS && !p.is_null();
            if ok {
                // SAFETY: a static NUL-terminated string of the driver (checked non-null).
                unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
            } else {
                "unknown".to_string()
            }
        };
        Err(CopyError::Cuda {
            call,
            code: r,
            name: text(self.get_error_name),
            description: text(self.get_error_string),
        })
    }
}
