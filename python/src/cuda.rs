//! CUDA copies between the callers' device memory (torch, CuPy: addresses in the device's
//! primary context) and this crate's host staging memory, through the CUDA driver API that
//! vfpoll-gpu loads at run time (`vfpoll_gpu::cuda::ffi`).
//!
//! Contexts: [`Device::open`] retains the device's *primary* context, the one the CUDA runtime
//! and so PyTorch and CuPy use, and makes it current on the calling thread before every call: a
//! tensor's `data_ptr()` is an address in that context, valid for our copies. (vfpoll-gpu's
//! [`vfpoll_gpu::cuda::Gpu`] does the same, but copies only into memory it allocated itself;
//! what this module adds is copies to and from memory someone else owns.)
//!
//! Host side: [`Staging`] is page-aligned anonymous memory, registered with CUDA
//! (`cuMemHostRegister`, portable) the first time a GPU copy uses it, so the copy engine moves it
//! by DMA at full speed; it is kept and reused (registration costs more than the copy of a
//! small tensor).
//!
//! Trust model: the driver is NVIDIA's, trusted to implement cuda.h. A device address comes from
//! the array's exporter (DLPack or `__cuda_array_interface__`), which is trusted to describe its
//! own allocation, as every consumer of those protocols does; a wrong one is a CUDA error from
//! the copy (the driver checks that the range is mapped in the context), never a host access.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, OnceLock};

use vfpoll_gpu::cuda::ffi::{Api, CuContext, CuDevice, CuStream, CU_MEMHOSTREGISTER_PORTABLE};
use vfpoll_gpu::CopyError;

/// `CU_STREAM_DEFAULT`: a blocking stream, ordered after the work of the legacy default
/// stream (PyTorch's default stream), on which producers of DLPack tensors order their work for
/// us (`__dlpack__(stream=1)`).
const CU_STREAM_DEFAULT: std::ffi::c_uint = 0;

/// `CU_STREAM_LEGACY`, the legacy default stream, as `__cuda_array_interface__` names it (1).
const CU_STREAM_LEGACY: usize = 1;

/// A CUDA device with its primary context retained.
pub struct Device {
    api: &'static Api,
    dev: CuDevice,
    ctx: CuContext,
    /// Idle streams of earlier copiers, reused: creating and destroying a stream per batch
    /// costs more than a KV block's copy.
    idle: Mutex<Vec<StreamHandle>>,
}

/// A stream handle kept in [`Device::idle`].
struct StreamHandle(CuStream);

// SAFETY: a stream handle is only passed to the (thread-safe) driver, never dereferenced.
unsafe impl Send for StreamHandle {}

// SAFETY: the context handle is only passed to the (thread-safe) driver, never dereferenced;
// every call makes it current on the calling thread first.
unsafe impl Send for Device {}
// SAFETY: as above; no method mutates Rust-side state.
unsafe impl Sync for Device {}

static DEVICES: OnceLock<Mutex<HashMap<i32, Arc<Device>>>> = OnceLock::new();

impl Device {
    /// Device `ordinal`, its primary context retained (once per process: kept until exit, as
    /// the runtime keeps it for the frameworks).
    pub fn open(ordinal: i32) -> Result<Arc<Device>, CopyError> {
        let map = DEVICES.get_or_init(|| Mutex::new(HashMap::new()));
        let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(d) = map.get(&ordinal) {
            return Ok(d.clone());
        }
        let api = Api::load()?;
        // SAFETY: cuInit takes a flags word (0) and may be called any number of times.
        api.check("cuInit", unsafe { (api.init)(0) })?;
        let mut dev: CuDevice = 0;
        // SAFETY: `dev` is a valid out-pointer; a bad ordinal is an error return.
        api.check("cuDeviceGet", unsafe {
            (api.device_get)(&mut dev, ordinal as c_int)
        })?;
        let mut ctx: CuContext = std::ptr::null_mut();
        // SAFETY: `ctx` is a valid out-pointer; `dev` a handle from cuDeviceGet.
        api.check("cuDevicePrimaryCtxRetain", unsafe {
            (api.primary_ctx_retain)(&mut ctx, dev)
        })?;
        let d = Arc::new(Device {
            api,
            dev,
            ctx,
            idle: Mutex::new(Vec::new()),
        });
        map.insert(ordinal, d.clone());
        Ok(d)
    }

    fn current(&self) -> Result<(), CopyError> {
        // SAFETY: `ctx` is the retained primary context, valid while `self` lives.
        self.api
            .check("cuCtxSetCurrent", unsafe { (self.api.ctx_set_current)(self.ctx) })
    }

    /// A stream of this device for one batch of copies between device memory and `staging`,
    /// which it borrows until the copies are done (dropping it waits for them).
    pub fn copier<'a>(self: &Arc<Self>, staging: &'a mut Staging) -> Result<Copier<'a>, CopyError> {
        staging.register(self)?;
        self.current()?;
        let reused = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let raw = match reused {
            Some(StreamHandle(raw)) => raw,
            None => {
                let mut raw: CuStream = std::ptr::null_mut();
                // SAFETY: `raw` is a valid out-pointer; the context is current.
                self.api.check("cuStreamCreate", unsafe {
                    (self.api.stream_create)(&mut raw, CU_STREAM_DEFAULT)
                })?;
                raw
            }
        };
        Ok(Copier {
            dev: self.clone(),
            raw,
            staging,
            waited: Vec::new(),
            queued: false,
        })
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        for StreamHandle(raw) in self.idle.get_mut().unwrap_or_else(|p| p.into_inner()).drain(..) {
            // SAFETY: an idle stream of this context, used by no copier.
            let _ = unsafe { (self.api.stream_destroy)(raw) };
        }
        // SAFETY: releases the retain of `open`.
        let _ = unsafe { (self.api.primary_ctx_release)(self.dev) };
    }
}

/// Copies queued on a stream of one device, to and from one [`Staging`], which stays borrowed
/// (out of the CPU's reach) until they are done: [`Copier::finish`], or drop, waits for them.
pub struct Copier<'a> {
    dev: Arc<Device>,
    raw: CuStream,
    staging: &'a mut Staging,
    /// Producers' streams already waited for.
    waited: Vec<usize>,
    /// Whether copies were queued since the last wait for the stream.
    queued: bool,
}

impl Copier<'_> {
    /// Waits for the work queued on the producer's stream `stream` (a `CUstream` handle from
    /// `__cuda_array_interface__`; 1 and 2 are the legacy and per-thread default streams).
    pub fn after(&mut self, stream: usize) -> Result<(), CopyError> {
        if stream == CU_STREAM_LEGACY {
            // Our copy stream is a blocking stream: CUDA orders it after the work queued on
            // the legacy default stream (the driver API's stream semantics), so there is nothing
            // to wait for here.
            return Ok(());
        }
        if self.waited.contains(&stream) {
            // Waited for since the copier began: what its producer queued before the caller
            // handed the arrays over is done.
            return Ok(());
        }
        self.waited.push(stream);
        self.dev.current()?;
        // SAFETY: the handle is the exporter's stream of this context (trusted, like its
        // addresses); synchronising a stream only waits.
        let r = unsafe { (self.dev.api.stream_synchronize)(stream as CuStream) };
        self.dev.api.check("cuStreamSynchronize (producer's stream)", r)
    }

    /// Queues a copy of `len` bytes from device address `src` to the staging's `at..at + len`.
    pub fn d2h(&mut self, src: u64, at: usize, len: usize) -> Result<(), CopyError> {
        let host = self.staging.span(at, len)?;
        let api = self.dev.api;
        self.dev.current()?;
        // SAFETY: `host..host+len` lies in the staging (checked by `span`), registered, and
        // borrowed by this copier until the stream is synchronised (finish/drop): no CPU access
        // meanwhile. `src..src+len` is the exporter's device memory (trusted, see the module
        // docs; the driver refuses an unmapped range).
        let r = unsafe { (api.memcpy_dtoh_async)(host.as_ptr().cast::<c_void>(), src, len, self.raw) };
        self.queued = true;
        api.check("cuMemcpyDtoHAsync", r)
    }

    /// Queues a copy of the staging's `at..at + len` to device address `dst`.
    pub fn h2d(&mut self, at: usize, dst: u64, len: usize) -> Result<(), CopyError> {
        let host = self.staging.span(at, len)?;
        let api = self.dev.api;
        self.dev.current()?;
        // SAFETY: as in `d2h`, the other way round.
        let r = unsafe {
            (api.memcpy_htod_async)(dst, host.as_ptr().cast_const().cast::<c_void>(), len, self.raw)
        };
        self.queued = true;
        api.check("cuMemcpyHtoDAsync", r)
    }

    fn sync(&mut self) -> Result<(), CopyError> {
        if !self.queued {
            return Ok(());
        }
        self.dev.current()?;
        // SAFETY: our live stream.
        self.dev.api.check("cuStreamSynchronize", unsafe {
            (self.dev.api.stream_synchronize)(self.raw)
        })?;
        self.queued = false;
        Ok(())
    }

    /// Waits until every queued copy is done.
    pub fn finish(mut self) -> Result<(), CopyError> {
        self.sync()
    }
}

impl Drop for Copier<'_> {
    fn drop(&mut self) {
        match self.sync() {
            // Idle: the next copier of this device takes it.
            Ok(()) => self
                .dev
                .idle
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(StreamHandle(self.raw)),
            Err(e) => {
                log::warn!("waiting for GPU copies: {e}");
                // SAFETY: our live stream (its context broken: destroying it is still allowed).
                let _ = unsafe { (self.dev.api.stream_destroy)(self.raw) };
            }
        }
    }
}

/// Page-aligned host memory for staging, registered with CUDA on first GPU use.
pub struct Staging {
    ptr: NonNull<u8>,
    cap: usize,
    registered: Option<Arc<Device>>,
}

// SAFETY: we own the mapping; access goes through `&self`/`&mut self` methods.
unsafe impl Send for Staging {}
// SAFETY: shared access only reads (`bytes`).
unsafe impl Sync for Staging {}

impl Staging {
    /// At least `len` bytes (whole pages), zeroed.
    pub fn new(len: usize) -> std::io::Result<Staging> {
        let cap = len.max(1).div_ceil(4096) * 4096;
        // SAFETY: a fresh private anonymous mapping: no file, no address hint, nothing aliased.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                cap,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| std::io::Error::other("mmap returned null"))?;
        Ok(Staging {
            ptr,
            cap,
            registered: None,
        })
    }

    /// Capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    fn span(&self, at: usize, len: usize) -> Result<NonNull<u8>, CopyError> {
        if at.checked_add(len).is_none_or(|end| end > self.cap) {
            return Err(CopyError::Unavailable(format!(
                "staging copy of {len} bytes at {at} outside its {} bytes",
                self.cap
            )));
        }
        // SAFETY: `at <= cap` (checked), so the offset stays in (or one past) the mapping.
        Ok(unsafe { self.ptr.add(at) })
    }

    fn register(&mut self, dev: &Arc<Device>) -> Result<(), CopyError> {
        if self.registered.is_some() {
            return Ok(());
        }
        dev.current()?;
        // SAFETY: the whole mapping is ours and lives until `drop`, which unregisters first.
        let r = unsafe {
            (dev.api.mem_host_register)(self.ptr.as_ptr().cast(), self.cap, CU_MEMHOSTREGISTER_PORTABLE)
        };
        dev.api.check("cuMemHostRegister", r)?;
        self.registered = Some(dev.clone());
        Ok(())
    }

    /// `len` bytes from `at`, for the store to write.
    pub fn bytes(&self, at: usize, len: usize) -> &[u8] {
        let end = at.saturating_add(len).min(self.cap);
        let at = at.min(end);
        // SAFETY: in bounds (clamped); the mapping lives as long as `self`, and no GPU copy
        // writes it meanwhile (copies take `&mut self` and are synchronised before a `&self`
        // is handed out).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().wrapping_add(at), end - at) }
    }

    /// `len` bytes from `at`, for the store to read into or the CPU to copy into.
    pub fn bytes_mut(&mut self, at: usize, len: usize) -> &mut [u8] {
        let end = at.saturating_add(len).min(self.cap);
        let at = at.min(end);
        // SAFETY: as in `bytes`, exclusively borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().wrapping_add(at), end - at) }
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if let Some(dev) = self.registered.take() {
            if dev.current().is_ok() {
                // SAFETY: registered in `register`; no copy is in flight (streams synchronise
                // before they drop, and every stream borrowed this staging mutably).
                let _ = unsafe { (dev.api.mem_host_unregister)(self.ptr.as_ptr().cast()) };
            }
        }
        // SAFETY: our mapping of `cap` bytes, unmapped once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.cap) };
    }
}
