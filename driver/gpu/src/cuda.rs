//! The GPU through the CUDA driver API (feature `cuda`): a device and its primary context
//! ([`Gpu`]), device memory ([`DeviceMemory`]) with dma-buf export, streams and events, the
//! registration of hugepage slots as the copy engine's host memory ([`HostRegistration`]), and
//! [`CudaEngine`], the pipeline's [`CopyEngine`] on a GPU.
//!
//! Every handle type releases its CUDA object on drop, in an order that keeps the device from
//! touching freed memory: streams are synchronised before the memory they copy is freed or
//! unregistered. The driver is loaded at run time ([`ffi`]); without it every constructor returns
//! [`CopyError::Unavailable`].
//!
//! Contexts: vfpoll uses each device's primary context (the one the CUDA runtime and the
//! frameworks use too, so a `DeviceMemory` pointer is valid for them). CUDA makes a context
//! current per thread; every call here makes the device's context current on the calling thread
//! first (one thread-local comparison when it already is), so the types may move between
//! threads.

pub mod ffi;

use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;

use vfpoll_dma::RegionHold;

use crate::engine::CopyEngine;
use crate::error::CopyError;
use crate::slots::Slots;
use ffi::{Api, CuContext, CuDevice, CuDevicePtr, CuEvent, CuStream};

/// A GPU virtual address (what `cuMemAlloc` returns). Not a host address and not a bus address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DevicePtr(pub u64);

impl std::fmt::Display for DevicePtr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

thread_local! {
    /// The context this module last made current on this thread.
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

/// Whether the CUDA driver can be loaded and initialised here; the error says why not.
pub fn available() -> Result<(), CopyError> {
    init().map(drop)
}

fn init() -> Result<&'static Api, CopyError> {
    let api = Api::load()?;
    // SAFETY: cuInit takes a flags word (must be 0) and may be called any number of times.
    api.check("cuInit", unsafe { (api.init)(0) })?;
    Ok(api)
}

/// The CUDA driver version, as `cuDriverGetVersion` gives it (13000 for 13.0).
pub fn driver_version() -> Result<i32, CopyError> {
    let api = init()?;
    let mut v: c_int = 0;
    // SAFETY: `v` is a valid out-pointer.
    api.check("cuDriverGetVersion", unsafe { (api.driver_get_version)(&mut v) })?;
    Ok(v)
}

/// How many CUDA devices there are.
pub fn device_count() -> Result<usize, CopyError> {
    let api = init()?;
    let mut n: c_int = 0;
    // SAFETY: `n` is a valid out-pointer.
    api.check("cuDeviceGetCount", unsafe { (api.device_get_count)(&mut n) })?;
    Ok(n.max(0) as usize)
}

/// One GPU, with its primary context retained.
pub struct Gpu {
    api: &'static Api,
    dev: CuDevice,
    ordinal: usize,
    ctx: CuContext,
    name: String,
}

// SAFETY: a CUDA context may be used from any thread (the driver API is thread-safe); every
// call here makes it current on the calling thread first. The handle is only passed to the
// driver, never dereferenced.
unsafe impl Send for Gpu {}
// SAFETY: as above; no method mutates Rust-side state.
unsafe impl Sync for Gpu {}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("ordinal", &self.ordinal)
            .field("name", &self.name)
            .finish()
    }
}

impl Gpu {
    /// Opens GPU number `ordinal` and retains its primary context.
    pub fn open(ordinal: usize) -> Result<Arc<Gpu>, CopyError> {
        let api = init()?;
        let count = device_count()?;
        if ordinal >= count {
            return Err(CopyError::Unavailable(format!(
                "there is no GPU {ordinal}: CUDA sees {count}"
            )));
        }
        let mut dev: CuDevice = 0;
        // SAFETY: `dev` is a valid out-pointer; the ordinal is in range.
        api.check("cuDeviceGet", unsafe {
            (api.device_get)(&mut dev, ordinal as c_int)
        })?;
        let mut name = [0u8; 256];
        // SAFETY: the buffer holds `len` bytes; the driver writes a NUL-terminated name into it.
        api.check("cuDeviceGetName", unsafe {
            (api.device_get_name)(name.as_mut_ptr().cast(), name.len() as c_int, dev)
        })?;
        let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        let name = String::from_utf8_lossy(&name[..end]).into_owned();
        let mut ctx: CuContext = std::ptr::null_mut();
        // SAFETY: `ctx` is a valid out-pointer; `dev` is a device handle from cuDeviceGet.
        api.check("cuDevicePrimaryCtxRetain", unsafe {
            (api.primary_ctx_retain)(&mut ctx, dev)
        })?;
        Ok(Arc::new(Gpu {
            api,
            dev,
            ordinal,
            ctx,
            name,
        }))
    }

    /// The device's name ("NVIDIA H200").
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The CUDA ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// A `CUdevice_attribute` ([`ffi::attr`]).
    pub fn attribute(&self, attr: i32) -> Result<i32, CopyError> {
        let mut v: c_int = 0;
        // SAFETY: `v` is a valid out-pointer, `dev` a valid device; an unknown attribute is an
        // error return.
        self.check("cuDeviceGetAttribute", unsafe {
            (self.api.device_get_attribute)(&mut v, attr, self.dev)
        })?;
        Ok(v)
    }

    /// Bytes of device memory.
    pub fn total_memory(&self) -> Result<u64, CopyError> {
        let mut v: usize = 0;
        // SAFETY: `v` is a valid out-pointer.
        self.check("cuDeviceTotalMem", unsafe {
            (self.api.device_total_mem)(&mut v, self.dev)
        })?;
        Ok(v as u64)
    }

    /// The device's PCI address, `dddd:bb:dd.0`.
    pub fn pci_address(&self) -> Result<String, CopyError> {
        Ok(format!(
            "{:04x}:{:02x}:{:02x}.0",
            self.attribute(ffi::attr::PCI_DOMAIN_ID)?,
            self.attribute(ffi::attr::PCI_BUS_ID)?,
            self.attribute(ffi::attr::PCI_DEVICE_ID)?
        ))
    }

    fn check(&self, call: &'static str, r: ffi::CuResult) -> Result<(), CopyError> {
        self.api.check(call, r)
    }

    /// Makes the primary context current on this thread.
    fn current(&self) -> Result<(), CopyError> {
        let me = self.ctx as usize;
        if CURRENT.get() != me {
            // SAFETY: `ctx` is the retained primary context, valid until `self` drops.
            self.check("cuCtxSetCurrent", unsafe { (self.api.ctx_set_current)(self.ctx) })?;
            CURRENT.set(me);
        }
        Ok(())
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        if CURRENT.get() == self.ctx as usize {
            CURRENT.set(0);
        }
        // SAFETY: releases the retain made in `open`; every object made in this context holds
        // an `Arc<Gpu>`, so none is left.
        let r = unsafe { (self.api.primary_ctx_release)(self.dev) };
        if let Err(e) = self.check("cuDevicePrimaryCtxRelease", r) {
            log::warn!("{e}");
        }
    }
}

/// Device memory from `cuMemAlloc`, freed on drop.
pub struct DeviceMemory {
    gpu: Arc<Gpu>,
    ptr: CuDevicePtr,
    len: usize,
}

impl std::fmt::Debug for DeviceMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceMemory")
            .field("gpu", &self.gpu.ordinal)
            .field("ptr", &DevicePtr(self.ptr))
            .field("len", &self.len)
            .finish()
    }
}

impl DeviceMemory {
    /// `len` bytes of device memory.
    pub fn alloc(gpu: &Arc<Gpu>, len: usize) -> Result<Self, CopyError> {
        gpu.current()?;
        let mut ptr: CuDevicePtr = 0;
        // SAFETY: `ptr` is a valid out-pointer; the context is current.
        gpu.check("cuMemAlloc", unsafe { (gpu.api.mem_alloc)(&mut ptr, len) })?;
        Ok(DeviceMemory {
            gpu: gpu.clone(),
            ptr,
            len,
        })
    }

    /// The GPU address of the first byte.
    pub fn device_ptr(&self) -> DevicePtr {
        DevicePtr(self.ptr)
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The GPU it lives on.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// Sets every byte to `byte` (synchronously).
    pub fn fill(&self, byte: u8) -> Result<(), CopyError> {
        self.gpu.current()?;
        // SAFETY: the range is this allocation's own.
        self.gpu.check("cuMemsetD8", unsafe {
            (self.gpu.api.memset_d8)(self.ptr, byte, self.len)
        })
    }

    /// Copies `dst.len()` bytes from byte `offset` of this allocation into `dst`, any host
    /// memory (pageable too), and returns once they are there: `cuMemcpyDtoH` (what
    /// `cudaMemcpy(..., cudaMemcpyDeviceToHost)` does). For pageable memory the driver bounces
    /// through buffers of its own; this is the plain path, not the pipeline's.
    pub fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<(), CopyError> {
        self.check_range(offset, dst.len())?;
        self.gpu.current()?;
        // SAFETY: `dst` is a live exclusive host slice of `dst.len()` bytes and the call
        // returns only once the copy into it is complete; the device range lies in this
        // allocation (checked above).
        let r = unsafe {
            (self.gpu.api.memcpy_dtoh)(dst.as_mut_ptr().cast(), self.ptr + offset as u64, dst.len())
        };
        self.gpu.check("cuMemcpyDtoH", r)
    }

    /// Copies `src` to byte `offset` of this allocation and returns once the source may
    /// change: `cuMemcpyHtoD` (`cudaMemcpy(..., cudaMemcpyHostToDevice)`), any host memory.
    pub fn copy_from_host(&self, offset: usize, src: &[u8]) -> Result<(), CopyError> {
        self.check_range(offset, src.len())?;
        self.gpu.current()?;
        // SAFETY: `src` is a live host slice of `src.len()` bytes, read before the call
        // returns; the device range lies in this allocation (checked above).
        let r =
            unsafe { (self.gpu.api.memcpy_htod)(self.ptr + offset as u64, src.as_ptr().cast(), src.len()) };
        self.gpu.check("cuMemcpyHtoD", r)
    }

    fn check_range(&self, offset: usize, len: usize) -> Result<(), CopyError> {
        if offset.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(CopyError::OutOfBounds {
                offset: offset as u64,
                len,
                size: self.len as u64,
            });
        }
        Ok(())
    }

    /// Exports the whole allocation as a dma-buf (`cuMemGetHandleForAddressRange`,
    /// `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`): a file descriptor another driver can import
    /// (an RDMA NIC, or iommufd where the kernel accepts it; see [`crate::p2p`]). The length
    /// must be a multiple of the host page size.
    pub fn export_dmabuf(&self) -> Result<OwnedFd, CopyError> {
        let f = self.gpu.api.mem_get_handle_for_address_range.ok_or_else(|| {
            CopyError::Unavailable(
                "the CUDA driver has no cuMemGetHandleForAddressRange (it needs CUDA 11.7 or later)".into(),
            )
        })?;
        self.gpu.current()?;
        let mut fd: c_int = -1;
        // SAFETY: for the DMA_BUF_FD handle type the driver writes an `int` file descriptor
        // through the handle pointer, which points at `fd`; the range is this allocation's own.
        let r = unsafe {
            f(
                (&mut fd as *mut c_int).cast(),
                self.ptr,
                self.len,
                ffi::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                0,
            )
        };
        self.gpu.check("cuMemGetHandleForAddressRange", r)?;
        if fd < 0 {
            return Err(CopyError::Unavailable(
                "cuMemGetHandleForAddressRange returned no file descriptor".into(),
            ));
        }
        // SAFETY: the driver created `fd` for us and nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        if self.gpu.current().is_ok() {
            // SAFETY: the allocation is ours; the streams that copied into it were synchronised
            // before (CudaEngine drops its streams first), and cuMemFree synchronises anyway.
            let r = unsafe { (self.gpu.api.mem_free)(self.ptr) };
            if let Err(e) = self.gpu.check("cuMemFree", r) {
                log::warn!("{e}");
            }
        }
    }
}

/// A CUDA stream (non-blocking), synchronised and destroyed on drop.
struct Stream {
    gpu: Arc<Gpu>,
    raw: CuStream,
}

impl Stream {
    fn new(gpu: &Arc<Gpu>) -> Result<Self, CopyError> {
        gpu.current()?;
        let mut raw: CuStream = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the context is current.
        gpu.check("cuStreamCreate", unsafe {
            (gpu.api.stream_create)(&mut raw, ffi::CU_STREAM_NON_BLOCKING)
        })?;
        Ok(Stream {
            gpu: gpu.clone(),
            raw,
        })
    }

    fn synchronize(&self) -> Result<(), CopyError> {
        self.gpu.current()?;
        // SAFETY: `raw` is our live stream.
        self.gpu.check("cuStreamSynchronize", unsafe {
            (self.gpu.api.stream_synchronize)(self.raw)
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Err(e) = self.synchronize() {
            log::warn!("{e}");
        }
        // SAFETY: our live stream, idle after the synchronisation.
        let r = unsafe { (self.gpu.api.stream_destroy)(self.raw) };
        if let Err(e) = self.gpu.check("cuStreamDestroy", r) {
            log::warn!("{e}");
        }
    }
}

/// A CUDA event (no timing, blocking synchronisation), destroyed on drop.
struct Event {
    gpu: Arc<Gpu>,
    raw: CuEvent,
}

impl Event {
    fn new(gpu: &Arc<Gpu>) -> Result<Self, CopyError> {
        gpu.current()?;
        let mut raw: CuEvent = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the context is current.
        gpu.check("cuEventCreate", unsafe {
            (gpu.api.event_create)(
                &mut raw,
                ffi::CU_EVENT_DISABLE_TIMING | ffi::CU_EVENT_BLOCKING_SYNC,
            )
        })?;
        Ok(Event {
            gpu: gpu.clone(),
            raw,
        })
    }

    fn record(&self, stream: &Stream) -> Result<(), CopyError> {
        // SAFETY: both handles are live objects of this context.
        self.gpu.check("cuEventRecord", unsafe {
            (self.gpu.api.event_record)(self.raw, stream.raw)
        })
    }

    fn query(&self) -> Result<bool, CopyError> {
        // SAFETY: our live event.
        match unsafe { (self.gpu.api.event_query)(self.raw) } {
            ffi::CUDA_SUCCESS => Ok(true),
            ffi::CUDA_ERROR_NOT_READY => Ok(false),
            r => self.gpu.check("cuEventQuery", r).map(|_| false),
        }
    }

    fn synchronize(&self) -> Result<(), CopyError> {
        // SAFETY: our live event.
        self.gpu.check("cuEventSynchronize", unsafe {
            (self.gpu.api.event_synchronize)(self.raw)
        })
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if self.gpu.current().is_ok() {
            // SAFETY: our live event; destroying one with work pending is allowed (the driver
            // releases it when the work completes).
            let r = unsafe { (self.gpu.api.event_destroy)(self.raw) };
            if let Err(e) = self.gpu.check("cuEventDestroy", r) {
                log::warn!("{e}");
            }
        }
    }
}

/// Host memory registered with CUDA (`cuMemHostRegister`): page-locked for the GPU's copy
/// engine, which then reads and writes it by DMA at full speed. Holds the region alive (a
/// [`RegionHold`]: no access to its bytes, which stay with the slots' owners); unregisters on
/// drop.
pub struct HostRegistration {
    gpu: Arc<Gpu>,
    ptr: *mut u8,
    len: usize,
    _region: RegionHold,
}

// SAFETY: `ptr` is only an identity for the driver (never dereferenced here); the region it
// points into is kept alive by the hold, which is Send + Sync.
unsafe impl Send for HostRegistration {}

impl std::fmt::Debug for HostRegistration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostRegistration")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

impl HostRegistration {
    /// Registers the memory of `slots`.
    pub fn register(gpu: &Arc<Gpu>, slots: &Slots) -> Result<Self, CopyError> {
        let region = slots.hold().clone();
        let (ptr, len) = (region.as_ptr(), region.len());
        gpu.current()?;
        // SAFETY: `ptr..ptr+len` is a live, page-aligned, populated mapping of this process
        // that stays mapped while the hold below keeps the region; the driver pins it and
        // only its copy engine accesses it, when we ask for copies.
        gpu.check("cuMemHostRegister", unsafe {
            (gpu.api.mem_host_register)(ptr.cast(), len, ffi::CU_MEMHOSTREGISTER_PORTABLE)
        })?;
        Ok(HostRegistration {
            gpu: gpu.clone(),
            ptr,
            len,
            _region: region,
        })
    }

    /// Whether `slots` lie inside this registration.
    fn covers(&self, slots: &Slots) -> bool {
        slots.as_ptr() == self.ptr && slots.total_len() <= self.len
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        if self.gpu.current().is_ok() {
            // SAFETY: unregisters what `register` registered; no copy uses it any more
            // (CudaEngine synchronises its streams first).
            let r = unsafe { (self.gpu.api.mem_host_unregister)(self.ptr.cast::<c_void>()) };
            if let Err(e) = self.gpu.check("cuMemHostUnregister", r) {
                log::warn!("{e}");
            }
        }
    }
}

/// The pipeline's [`CopyEngine`] on a GPU: asynchronous copies between registered hugepage
/// slots and one device allocation, `streams` streams (slot `i` on stream `i % streams`), one
/// event per slot recorded after its copy.
pub struct CudaEngine {
    // Field order is drop order: events, then streams (synchronised), then the registration and
    // the memory, which no copy touches any more.
    events: Vec<Event>,
    streams: Vec<Stream>,
    inflight: Vec<bool>,
    reg: HostRegistration,
    mem: DeviceMemory,
}

impl std::fmt::Debug for CudaEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaEngine")
            .field("mem", &self.mem)
            .field("reg", &self.reg)
            .field("streams", &self.streams.len())
            .finish()
    }
}

impl CudaEngine {
    /// An engine copying between `slots` (registered here) and `mem`, on `streams` streams.
    pub fn new(mem: DeviceMemory, slots: &Slots, streams: usize) -> Result<Self, CopyError> {
        let gpu = mem.gpu().clone();
        let reg = HostRegistration::register(&gpu, slots)?;
        let streams = (0..streams.max(1))
            .map(|_| Stream::new(&gpu))
            .collect::<Result<Vec<_>, _>>()?;
        let events = (0..slots.count())
            .map(|_| Event::new(&gpu))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(CudaEngine {
            events,
            inflight: vec![false; slots.count()],
            streams,
            reg,
            mem,
        })
    }

    /// The device memory.
    pub fn memory(&self) -> &DeviceMemory {
        &self.mem
    }

    /// Waits for every copy, unregisters the slots, and gives the device memory back.
    pub fn into_memory(self) -> Result<DeviceMemory, CopyError> {
        for s in &self.streams {
            s.synchronize()?;
        }
        let CudaEngine {
            events,
            streams,
            reg,
            mem,
            ..
        } = self;
        drop(events);
        drop(streams);
        drop(reg);
        Ok(mem)
    }

    /// Checks a copy request; returns (stream, device address, host address).
    fn prepare(
        &self,
        slots: &Slots,
        slot: usize,
        dev_offset: u64,
        len: usize,
    ) -> Result<(usize, u64, *mut u8), CopyError> {
        if !self.reg.covers(slots) {
            return Err(CopyError::NotRegistered);
        }
        if dev_offset
            .checked_add(len as u64)
            .is_none_or(|end| end > self.mem.len as u64)
        {
            return Err(CopyError::OutOfBounds {
                offset: dev_offset,
                len,
                size: self.mem.len as u64,
            });
        }
        let host = slots.ptr(slot, 0, len)?;
        if self.inflight[slot] {
            return Err(CopyError::Unavailable(format!(
                "slot {slot} already has a copy in flight"
            )));
        }
        self.mem.gpu.current()?;
        Ok((slot % self.streams.len(), self.mem.ptr + dev_offset, host))
    }

    fn recorded(&mut self, slot: usize, stream: usize) -> Result<(), CopyError> {
        self.events[slot].record(&self.streams[stream])?;
        self.inflight[slot] = true;
        Ok(())
    }
}

impl CopyEngine for CudaEngine {
    fn describe(&self) -> String {
        let gpu = &self.mem.gpu;
        format!("{} (GPU {})", gpu.name, gpu.ordinal)
    }

    fn capacity(&self) -> u64 {
        self.mem.len as u64
    }

    fn submit_h2d(
        &mut self,
        slots: &Slots,
        slot: usize,
        dev_offset: u64,
        len: usize,
    ) -> Result<(), CopyError> {
        let (s, dst, src) = self.prepare(slots, slot, dev_offset, len)?;
        let api = self.mem.gpu.api;
        // SAFETY: `src..src+len` lies in registered, live slot memory (checked: the registration
        // covers these slots and holds the region); `dst..dst+len` lies in our allocation
        // (checked), and the slot is in hand (`Slots::ptr` succeeded: no NVMe command holds
        // it). The slot stays with the engine until its event says the copy is done.
        let r = unsafe { (api.memcpy_htod_async)(dst, src.cast_const().cast(), len, self.streams[s].raw) };
        api.check("cuMemcpyHtoDAsync", r)?;
        self.recorded(slot, s)
    }

    fn submit_d2h(
        &mut self,
        slots: &mut Slots,
        slot: usize,
        dev_offset: u64,
        len: usize,
    ) -> Result<(), CopyError> {
        let (s, src, dst) = self.prepare(slots, slot, dev_offset, len)?;
        let api = self.mem.gpu.api;
        // SAFETY: as in `submit_h2d`, the other way round; `&mut Slots` shows no CPU access to
        // the slot runs meanwhile, and the pipeline leaves it alone until the event completes.
        let r = unsafe { (api.memcpy_dtoh_async)(dst.cast(), src, len, self.streams[s].raw) };
        api.check("cuMemcpyDtoHAsync", r)?;
        self.recorded(slot, s)
    }

    fn poll(&mut self, _slots: &mut Slots, slot: usize) -> Result<bool, CopyError> {
        if !self.inflight.get(slot).copied().unwrap_or(false) {
            return Err(CopyError::Unavailable(format!(
                "slot {slot} has no copy in flight"
            )));
        }
        self.mem.gpu.current()?;
        let done = self.events[slot].query()?;
        if done {
            self.inflight[slot] = false;
        }
        Ok(done)
    }

    fn wait(&mut self, _slots: &mut Slots, slot: usize) -> Result<(), CopyError> {
        if !self.inflight.get(slot).copied().unwrap_or(false) {
            return Ok(());
        }
        self.mem.gpu.current()?;
        self.events[slot].synchronize()
    }
}
