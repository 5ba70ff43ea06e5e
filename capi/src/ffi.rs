//! The C entry points. All of the crate's `unsafe` code that touches C's pointers is here:
//! each entry point checks its pointers for NULL, turns handles into shared references (the
//! types behind them use interior mutability, so no `&mut` to a handle ever exists), and runs
//! its body in [`guard`], which catches panics and records error messages.
//!
//! The trust model: a non-NULL handle is one this library returned and that has not been
//! closed or destroyed (for a buffer: whose pool has not been destroyed, which is refused
//! while any buffer is allocated); a data pointer with a length points to that many readable
//! (or writable) bytes. Handles of one pool, and a queue pair, are used by one thread at a
//! time. Everything else (NULL, bad values, buffers in the wrong state) is checked and refused
//! with `-EINVAL` or another code and a message.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::ptr;

use libc::EINVAL;

use crate::env::{iommu_mode as parse_iommu_mode, page_size as parse_page_size, vfpoll_ctrl, vfpoll_env};
use crate::error::{guard, last_ptr, Error, Res};
use crate::pool::{vfpoll_buf, vfpoll_pool};
use crate::qpair::{default_opts, pi_mode as parse_pi_mode, vfpoll_qpair, Rw};
use crate::types::*;

/// A shared reference to `*p`, or `EINVAL` naming `what` for NULL.
///
/// # Safety
/// `p` is NULL or valid for reads as a `T` for `'a` (the trust model of the module docs).
unsafe fn get<'a, T>(p: *const T, what: &str) -> Res<&'a T> {
    // SAFETY: the caller vouches for non-NULL pointers.
    unsafe { p.as_ref() }.ok_or_else(|| Error::inval(format!("{what} is NULL")))
}

/// Checks an output pointer.
fn out_ptr<T>(p: *mut T, what: &str) -> Res<*mut T> {
    if p.is_null() {
        Err(Error::inval(format!("{what} (the output pointer) is NULL")))
    } else {
        Ok(p)
    }
}

/// A count as C's `int` result.
fn as_int(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// The message of the last call that failed on this thread: what went wrong and what to do
/// about it, prefixed with the function's name. An empty string if none failed yet.
///
/// The pointer stays valid until the next failing call on this thread. Successful calls do
/// not change it.
#[no_mangle]
pub extern "C" fn vfpoll_last_error() -> *const c_char {
    std::panic::catch_unwind(last_ptr).unwrap_or(c"".as_ptr())
}

/// Opens the environment: a VFIO container in `iommu_mode` (`VFPOLL_IOMMU_TYPE1`,
/// `VFPOLL_IOMMU_IOMMUFD`, `VFPOLL_IOMMU_AUTO` or `VFPOLL_IOMMU_NONE`), with DMA memory of `page_size` pages (`VFPOLL_PAGE_2M`, `_1G` or
/// `_4K`) for queues and buffer pools. One per process is usual; controllers opened in it share
/// its IOMMU domain, so a buffer pool of one of them can be used with the others.
///
/// On success `*out` is the environment: close it with `vfpoll_env_close`. It may be used from
/// any thread.
///
/// # Safety
/// `out` is NULL or points to writable memory for one pointer.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_env_open(
    iommu_mode: u32,
    page_size: u32,
    out: *mut *mut vfpoll_env,
) -> c_int {
    guard("vfpoll_env_open", || {
        let out = out_ptr(out, "out")?;
        let env = vfpoll_env::open(parse_iommu_mode(iommu_mode)?, parse_page_size(page_size)?)?;
        // SAFETY: `out` is non-NULL and writable (caller contract).
        unsafe { out.write(Box::into_raw(Box::new(env))) };
        Ok(0)
    })
}

/// Closes an environment handle. Controllers, pools and queue pairs made in it stay usable:
/// the container closes when the last of them is gone. NULL is accepted (nothing happens).
///
/// # Safety
/// `env` is NULL or a handle from `vfpoll_env_open` not closed yet; it is invalid afterwards.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_env_close(env: *mut vfpoll_env) -> c_int {
    guard("vfpoll_env_close", || {
        if !env.is_null() {
            // SAFETY: a live handle from `Box::into_raw` (caller contract), dropped once.
            drop(unsafe { Box::from_raw(env) });
        }
        Ok(0)
    })
}

/// Opens the NVMe controller at PCI address `pci_addr` (e.g. `"0000:00:03.0"`; bound to
/// vfio-pci beforehand, e.g. with `vfpoll bind`) and brings it up: reset, admin queue, identify,
/// I/O queue count. Takes as long as the controller needs (up to its CAP.TO).
///
/// On success `*out` is the controller: close it with `vfpoll_ctrl_close`. It may be used from
/// any thread; admin work is serialised inside.
///
/// # Safety
/// `env` is NULL or a live environment; `pci_addr` is NULL or a NUL-terminated string; `out` is
/// NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_ctrl_open(
    env: *mut vfpoll_env,
    pci_addr: *const c_char,
    out: *mut *mut vfpoll_ctrl,
) -> c_int {
    guard("vfpoll_ctrl_open", || {
        // SAFETY: module trust model.
        let env = unsafe { get(env, "env")? };
        if pci_addr.is_null() {
            return Err(Error::inval("pci_addr is NULL"));
        }
        // SAFETY: non-NULL and NUL-terminated (caller contract).
        let addr = unsafe { CStr::from_ptr(pci_addr) };
        let addr = addr
            .to_str()
            .map_err(|_| Error::inval(format!("pci_addr {addr:?} is not UTF-8")))?;
        let out = out_ptr(out, "out")?;
        let ctrl = env
            .open_ctrl(addr)
            .map_err(|e| Error::new(e.errno, format!("{addr}: {}", e.msg)))?;
        // SAFETY: `out` is non-NULL and writable (caller contract).
        unsafe { out.write(Box::into_raw(Box::new(ctrl))) };
        Ok(0)
    })
}

/// Closes a controller handle. Its queue pairs and pools stay usable; the controller is shut
/// down (CC.SHN) when the last of them is gone. NULL is accepted.
///
/// # Safety
/// `ctrl` is NULL or a live handle from `vfpoll_ctrl_open`; it is invalid afterwards.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_ctrl_close(ctrl: *mut vfpoll_ctrl) -> c_int {
    guard("vfpoll_ctrl_close", || {
        if !ctrl.is_null() {
            // SAFETY: a live handle from `Box::into_raw` (caller contract), dropped once.
            drop(unsafe { Box::from_raw(ctrl) });
        }
        Ok(0)
    })
}

/// Fills `*out` with what the controller says about itself (serial, model, firmware, MDTS,
/// namespace count, queue limits).
///
/// # Safety
/// `ctrl` is NULL or live; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_ctrl_identify(ctrl: *const vfpoll_ctrl, out: *mut vfpoll_ctrl_info) -> c_int {
    guard("vfpoll_ctrl_identify", || {
        // SAFETY: module trust model.
        let ctrl = unsafe { get(ctrl, "ctrl")? };
        let out = out_ptr(out, "out")?;
        // SAFETY: non-NULL and writable (caller contract).
        unsafe { out.write(ctrl.info()) };
        Ok(0)
    })
}

/// Writes the IDs of up to `max` active namespaces into `nsids` (ascending) and returns how
/// many namespaces are active, which may be more than `max` (call again with a larger array).
/// `nsids` may be NULL when `max` is 0.
///
/// # Safety
/// `ctrl` is NULL or live; `nsids` is NULL or writable for `max` values.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_ctrl_namespaces(
    ctrl: *const vfpoll_ctrl,
    nsids: *mut u32,
    max: u32,
) -> c_int {
    guard("vfpoll_ctrl_namespaces", || {
        // SAFETY: module trust model.
        let ctrl = unsafe { get(ctrl, "ctrl")? };
        if nsids.is_null() && max != 0 {
            return Err(Error::inval(format!("nsids is NULL but max is {max}")));
        }
        let all = ctrl.namespaces();
        let n = all.len().min(max as usize);
        if n != 0 {
            // SAFETY: `nsids` is writable for `max >= n` values (caller contract) and does not
            // overlap the vector just made.
            unsafe { ptr::copy_nonoverlapping(all.as_ptr(), nsids, n) };
        }
        Ok(as_int(all.len()))
    })
}

/// Fills `*out` with namespace `nsid`'s geometry and format: LBA size, capacity, metadata size
/// and placement, protection information, zoned or not. `-ENOENT` if the namespace is not
/// active.
///
/// # Safety
/// `ctrl` is NULL or live; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_ns_identify(
    ctrl: *const vfpoll_ctrl,
    nsid: u32,
    out: *mut vfpoll_ns_info,
) -> c_int {
    guard("vfpoll_ns_identify", || {
        // SAFETY: module trust model.
        let ctrl = unsafe { get(ctrl, "ctrl")? };
        let out = out_ptr(out, "out")?;
        let info = ctrl.ns_info(nsid)?;
        // SAFETY: non-NULL and writable (caller contract).
        unsafe { out.write(info) };
        Ok(0)
    })
}

/// The bytes a read or write of `blocks` blocks of namespace `nsid` moves, through a queue pair
/// in protection mode `pi_mode` (`VFPOLL_PI_*`): `*data_bytes` in the data buffer (the LBA
/// size per block, plus the metadata for an extended-LBA format unless the controller strips
/// it) and `*meta_bytes` in the separate metadata buffer (0: submit without one). These are the
/// lengths to pass to `vfpoll_qpair_read`/`_write` and their `_md` forms.
///
/// Fails with `-EOPNOTSUPP` and the driver's reason for a namespace it refuses for I/O (a PI
/// format with a 32- or 64-bit guard, an unknown command set, inconsistent Identify data).
///
/// # Safety
/// `ctrl` is NULL or live; `data_bytes` and `meta_bytes` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_ns_transfer(
    ctrl: *const vfpoll_ctrl,
    nsid: u32,
    pi_mode: u32,
    blocks: u64,
    data_bytes: *mut u64,
    meta_bytes: *mut u64,
) -> c_int {
    guard("vfpoll_ns_transfer", || {
        // SAFETY: module trust model.
        let ctrl = unsafe { get(ctrl, "ctrl")? };
        let data_bytes = out_ptr(data_bytes, "data_bytes")?;
        let meta_bytes = out_ptr(meta_bytes, "meta_bytes")?;
        let checks = if pi_mode == VFPOLL_PI_HOST {
            VFPOLL_PI_CHECK_GUARD | VFPOLL_PI_CHECK_REF_TAG
        } else {
            0
        };
        let (d, m) = ctrl.transfer(nsid, parse_pi_mode(pi_mode, checks)?, blocks)?;
        // SAFETY: non-NULL and writable (caller contract).
        unsafe { data_bytes.write(d) };
        // SAFETY: likewise.
        unsafe { meta_bytes.write(m) };
        Ok(0)
    })
}

/// Makes a pool of `count` DMA buffers of `buf_size` bytes each (a power of two from 512 to the
/// environment's page size), reachable by every controller of `ctrl`'s environment. All memory
/// is allocated, pinned and mapped here; allocating and freeing buffers later never allocates.
///
/// A pool and its buffers belong to one thread at a time (give each I/O thread its own pool
/// beside its queue pair). Destroy it with `vfpoll_pool_destroy`.
///
/// # Safety
/// `ctrl` is NULL or live; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_pool_create(
    ctrl: *mut vfpoll_ctrl,
    buf_size: usize,
    count: u32,
    out: *mut *mut vfpoll_pool,
) -> c_int {
    guard("vfpoll_pool_create", || {
        // SAFETY: module trust model.
        let ctrl = unsafe { get(ctrl, "ctrl")? };
        let out = out_ptr(out, "out")?;
        let pool = vfpoll_pool::new(ctrl, buf_size, count as usize)?;
        // SAFETY: non-NULL and writable (caller contract).
        unsafe { out.write(Box::into_raw(Box::new(pool))) };
        Ok(0)
    })
}

/// Destroys a pool. Refused with `-EBUSY` while any of its buffers is allocated (in flight or
/// not): free them first. NULL is accepted.
///
/// # Safety
/// `pool` is NULL or a live handle from `vfpoll_pool_create`; it is invalid after success.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_pool_destroy(pool: *mut vfpoll_pool) -> c_int {
    guard("vfpoll_pool_destroy", || {
        if pool.is_null() {
            return Ok(0);
        }
        // SAFETY: module trust model.
        unsafe { get(pool, "pool")? }.check_idle()?;
        // SAFETY: a live handle from `Box::into_raw`, dropped once; no buffer handle into it is
        // allocated (checked above), so none is used afterwards by a correct caller.
        drop(unsafe { Box::from_raw(pool) });
        Ok(0)
    })
}

/// Buffers of the pool free now.
///
/// # Safety
/// `pool` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_pool_available(pool: *const vfpoll_pool) -> c_int {
    guard("vfpoll_pool_available", || {
        // SAFETY: module trust model.
        Ok(as_int(unsafe { get(pool, "pool")? }.available()))
    })
}

/// Bytes per buffer of the pool.
///
/// # Safety
/// `pool` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_pool_buf_size(pool: *const vfpoll_pool) -> c_int {
    guard("vfpoll_pool_buf_size", || {
        // SAFETY: module trust model.
        Ok(as_int(unsafe { get(pool, "pool")? }.buf_size()))
    })
}

/// Takes a buffer from the pool into `*out`; `-ENOBUFS` when all are allocated. The buffer is
/// the caller's until it is submitted; a queue pair owns it from a successful submission until
/// the completion is polled, and the caller again afterwards.
///
/// # Safety
/// `pool` is NULL or live; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_buf_alloc(pool: *mut vfpoll_pool, out: *mut *mut vfpoll_buf) -> c_int {
    guard("vfpoll_buf_alloc", || {
        // SAFETY: module trust model.
        let pool = unsafe { get(pool, "pool")? };
        let out = out_ptr(out, "out")?;
        let buf: *const vfpoll_buf = pool.alloc()?;
        // SAFETY: non-NULL and writable (caller contract).
        unsafe { out.write(buf.cast_mut()) };
        Ok(0)
    })
}

/// Gives a buffer back to its pool. Refused with `-EBUSY` while it is in flight (poll its
/// completion first) and with `-EINVAL` when it is not allocated (a double free). A buffer
/// whose completion said `buffer_lost` is retired instead: its handle is freed, its memory is
/// never reused.
///
/// # Safety
/// `buf` is NULL or a handle from `vfpoll_buf_alloc` whose pool is live.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_buf_free(buf: *mut vfpoll_buf) -> c_int {
    guard("vfpoll_buf_free", || {
        // SAFETY: module trust model.
        unsafe { get(buf, "buf")? }.free()?;
        Ok(0)
    })
}

/// Copies `len` bytes from `src` into the buffer at `offset`. `-EBUSY` while the buffer is in
/// flight; `-EINVAL` if the range does not fit the buffer.
///
/// # Safety
/// `buf` is NULL or allocated from a live pool; `src` is NULL or readable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_buf_write(
    buf: *mut vfpoll_buf,
    offset: usize,
    src: *const c_void,
    len: usize,
) -> c_int {
    guard("vfpoll_buf_write", || {
        // SAFETY: module trust model.
        let buf = unsafe { get(buf, "buf")? };
        if src.is_null() && len != 0 {
            return Err(Error::inval("src is NULL"));
        }
        let src = if len == 0 {
            &[][..]
        } else {
            // SAFETY: `src` is non-NULL and readable for `len` bytes (caller contract); any
            // bytes are valid `u8`s; C memory, not DMA memory.
            unsafe { std::slice::from_raw_parts(src.cast::<u8>(), len) }
        };
        buf.write(offset, src)?;
        Ok(0)
    })
}

/// Copies `len` bytes of the buffer at `offset` into `dst`. `-EBUSY` while the buffer is in
/// flight; `-EINVAL` if the range does not fit the buffer.
///
/// # Safety
/// `buf` is NULL or allocated from a live pool; `dst` is NULL or writable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_buf_read(
    buf: *const vfpoll_buf,
    offset: usize,
    dst: *mut c_void,
    len: usize,
) -> c_int {
    guard("vfpoll_buf_read", || {
        // SAFETY: module trust model.
        let buf = unsafe { get(buf, "buf")? };
        if dst.is_null() && len != 0 {
            return Err(Error::inval("dst is NULL"));
        }
        if len == 0 {
            return buf.read(offset, &mut []).map(|()| 0);
        }
        // SAFETY: `dst` is non-NULL and writable for `len` bytes (caller contract); it is
        // initialised here so that the slice below covers initialised bytes whatever C passed.
        unsafe { dst.cast::<u8>().write_bytes(0, len) };
        // SAFETY: as above; C memory, not DMA memory, and nothing else uses it during the call.
        let dst = unsafe { std::slice::from_raw_parts_mut(dst.cast::<u8>(), len) };
        buf.read(offset, dst)?;
        Ok(0)
    })
}

/// Bytes in the buffer (its pool's buffer size). `-EBUSY` while it is in flight.
///
/// # Safety
/// `buf` is NULL or allocated from a live pool.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_buf_size(buf: *const vfpoll_buf) -> c_int {
    guard("vfpoll_buf_size", || {
        // SAFETY: module trust model.
        Ok(as_int(unsafe { get(buf, "buf")? }.size()?))
    })
}

/// The buffer's bytes in the CPU's address space, for zero-copy I/O (filling a write buffer or
/// checking a read one in place, as an I/O engine such as fio does). NULL (with the reason in
/// `vfpoll_last_error`) while the buffer is in flight or not allocated.
///
/// The pointer may be used only while the buffer is the caller's: from its allocation (or its
/// completion) until it is submitted or freed. While it is in flight the device reads or writes
/// those bytes by DMA, at any moment, without the CPU's knowledge: a CPU access then is a data
/// race that yields torn data (or corrupts what is written). `vfpoll_buf_write` and
/// `vfpoll_buf_read` check this for each copy; this pointer cannot. After a read completes,
/// the data are visible without further barriers (polling the completion orders them).
///
/// # Safety
/// `buf` is NULL or allocated from a live pool.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_buf_data(buf: *mut vfpoll_buf) -> *mut c_void {
    let mut p = ptr::null_mut();
    guard("vfpoll_buf_data", || {
        // SAFETY: module trust model.
        p = unsafe { get(buf, "buf")? }.data_ptr()?.cast();
        Ok(0)
    });
    p
}

/// Fills `*opts` with the defaults of a queue pair (256 entries, 30 s timeout, controller PI,
/// MDTS, PRPs).
///
/// # Safety
/// `opts` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_qpair_opts_init(opts: *mut vfpoll_qpair_opts) -> c_int {
    guard("vfpoll_qpair_opts_init", || {
        let opts = out_ptr(opts, "opts")?;
        // SAFETY: non-NULL and writable (caller contract).
        unsafe { opts.write(default_opts()) };
        Ok(0)
    })
}

/// Creates an I/O queue pair on the controller (Create I/O CQ and SQ): `opts` NULL for the
/// defaults. A queue pair belongs to one thread at a time: give each I/O thread its own (the
/// controller grants `io_queues` of `vfpoll_ctrl_info`). It may move to another thread between
/// calls. No call on it allocates memory or takes a lock.
///
/// # Safety
/// `ctrl` is NULL or live; `opts` is NULL or readable; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_qpair_create(
    ctrl: *mut vfpoll_ctrl,
    opts: *const vfpoll_qpair_opts,
    out: *mut *mut vfpoll_qpair,
) -> c_int {
    guard("vfpoll_qpair_create", || {
        // SAFETY: module trust model.
        let ctrl = unsafe { get(ctrl, "ctrl")? };
        let out = out_ptr(out, "out")?;
        let opts = if opts.is_null() {
            default_opts()
        } else {
            // SAFETY: non-NULL and readable (caller contract); every field is an integer, so
            // any bytes are a valid value.
            unsafe { opts.read() }
        };
        let qp = vfpoll_qpair::new(ctrl, &opts)?;
        // SAFETY: non-NULL and writable (caller contract).
        unsafe { out.write(Box::into_raw(Box::new(qp))) };
        Ok(0)
    })
}

/// Deletes a queue pair. Refused with `-EBUSY` while requests are in flight: poll until
/// `vfpoll_qpair_outstanding` is 0 (commands that never complete time out and complete with an
/// error, so this always ends). NULL is accepted.
///
/// # Safety
/// `qp` is NULL or a live handle from `vfpoll_qpair_create`; invalid after success.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_qpair_destroy(qp: *mut vfpoll_qpair) -> c_int {
    guard("vfpoll_qpair_destroy", || {
        if qp.is_null() {
            return Ok(0);
        }
        // SAFETY: module trust model.
        let q = unsafe { get(qp, "qp")? };
        if q.in_callback.get() != 0 {
            return Err(Error::new(
                libc::EBUSY,
                "called from a completion callback of this queue pair, which is still polling it: destroy it after vfpoll_qpair_poll_cb returns",
            ));
        }
        let n = q.outstanding();
        if n != 0 {
            return Err(Error::new(
                libc::EBUSY,
                format!(
                    "{n} requests are in flight: poll until vfpoll_qpair_outstanding() is 0, then destroy"
                ),
            ));
        }
        // SAFETY: a live handle from `Box::into_raw`, dropped once.
        drop(unsafe { Box::from_raw(qp) });
        Ok(0)
    })
}

/// Requests in flight: submitted, completion not yet polled.
///
/// # Safety
/// `qp` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_qpair_outstanding(qp: *const vfpoll_qpair) -> c_int {
    guard("vfpoll_qpair_outstanding", || {
        // SAFETY: module trust model.
        Ok(as_int(unsafe { get(qp, "qp")? }.outstanding()))
    })
}

/// Writes the queue pair's counters since its creation into `out`: requests, commands,
/// completions, errors, the MMIO doorbell writes (SQ and CQ) and the shadow-only updates,
/// aborts, resets, and rounds of polling with how many found nothing. Cheap enough to call
/// at any time; the counts are this queue pair's own (its thread's).
///
/// # Safety
/// `qp` is NULL or live; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_qpair_get_stats(
    qp: *const vfpoll_qpair,
    out: *mut vfpoll_qpair_stats,
) -> c_int {
    guard("vfpoll_qpair_get_stats", || {
        // SAFETY: module trust model.
        let qp = unsafe { get(qp, "qp")? };
        if out.is_null() {
            return Err(Error::inval("out is NULL"));
        }
        // SAFETY: `out` is writable for one vfpoll_qpair_stats (caller contract), checked non-NULL.
        unsafe { out.write(qp.stats()) };
        Ok(0)
    })
}

/// The largest transfer of one command in bytes; larger reads and writes are split into several
/// commands, with one completion.
///
/// # Safety
/// `qp` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_qpair_max_transfer(qp: *const vfpoll_qpair) -> c_int {
    guard("vfpoll_qpair_max_transfer", || {
        // SAFETY: module trust model.
        Ok(as_int(unsafe { get(qp, "qp")? }.max_transfer()))
    })
}

/// The body of the four read/write entry points.
///
/// # Safety
/// As for `vfpoll_qpair_read_md`.
#[allow(clippy::too_many_arguments)]
unsafe fn rw(
    func: &str,
    op: Rw,
    qp: *mut vfpoll_qpair,
    nsid: u32,
    slba: u64,
    buf: *mut vfpoll_buf,
    len: usize,
    meta: Option<(*mut vfpoll_buf, usize)>,
    tag: u64,
) -> c_int {
    guard(func, || {
        // SAFETY: module trust model.
        let qp = unsafe { get(qp, "qp")? };
        // SAFETY: module trust model.
        let buf = unsafe { get(buf, "buf")? };
        let meta = match meta {
            // SAFETY: module trust model.
            Some((m, l)) => Some((unsafe { get(m, "meta")? }, l)),
            None => None,
        };
        qp.rw(op, nsid, slba, buf, len, meta, tag)?;
        Ok(0)
    })
}

/// Submits a read of `len` bytes from block `slba` of namespace `nsid` into `buf` (from its
/// start), completed with `tag`. `len` is a whole number of blocks of the bytes per block the
/// format moves through the data buffer (`vfpoll_ns_transfer`); a namespace with separate
/// metadata needs `vfpoll_qpair_read_md`.
///
/// On success the buffer is in flight until its completion is polled; the command reaches the
/// controller at the next `vfpoll_qpair_commit` or poll. On failure (`-EAGAIN`: the queue is
/// full, poll and retry; `-EINVAL`, `-ERANGE`, `-ENOENT`, `-EOPNOTSUPP`: the request is wrong)
/// nothing was submitted and the buffer is still the caller's.
///
/// # Safety
/// `qp` is NULL or live; `buf` is NULL or allocated from a live pool.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_qpair_read(
    qp: *mut vfpoll_qpair,
    nsid: u32,
    slba: u64,
    buf: *mut vfpoll_buf,
    len: usize,
    tag: u64,
) -> c_int {
    // SAFETY: the caller's contract is `rw`'s.
    unsafe { rw("vfpoll_qpair_read", Rw::Read, qp, nsid, slba, buf, len, None, tag) }
}

/// Submits a write of `len` bytes of `buf` to block `slba` of namespace `nsid`; as
/// `vfpoll_qpair_read` otherwise.
///
/// # Safety
/// As for `vfpoll_qpair_read`.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_qpair_write(
    qp: *mut vfpoll_qpair,
    nsid: u32,
    slba: u64,
    buf: *mut vfpoll_buf,
    len: usize,
    tag: u64,
) -> c_int {
    // SAFETY: the caller's contract is `rw`'s.
    unsafe {
        rw(
            "vfpoll_qpair_write",
            Rw::Write,
            qp,
            nsid,
            slba,
            buf,
            len,
            None,
            tag,
        )
    }
}

/// Submits a read for a namespace formatted with metadata in a separate buffer: data into
/// `len` bytes of `buf`, the blocks' metadata into `meta_len` bytes of `meta` (blocks x
/// metadata bytes, see `vfpoll_ns_transfer`). Both buffers are in flight until the completion.
///
/// # Safety
/// As for `vfpoll_qpair_read`; `meta` likewise.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn vfpoll_qpair_read_md(
    qp: *mut vfpoll_qpair,
    nsid: u32,
    slba: u64,
    buf: *mut vfpoll_buf,
    len: usize,
    meta: *mut vfpoll_buf,
    meta_len: usize,
    tag: u64,
) -> c_int {
    // SAFETY: the caller's contract is `rw`'s.
    unsafe {
        rw(
            "vfpoll_qpair_read_md",
            Rw::Read,
            qp,
            nsid,
            slba,
            buf,
            len,
            Some((meta, meta_len)),
            tag,
        )
    }
}

/// Submits a write with a separate metadata buffer; see `vfpoll_qpair_read_md`.
///
/// # Safety
/// As for `vfpoll_qpair_read_md`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn vfpoll_qpair_write_md(
    qp: *mut vfpoll_qpair,
    nsid: u32,
    slba: u64,
    buf: *mut vfpoll_buf,
    len: usize,
    meta: *mut vfpoll_buf,
    meta_len: usize,
    tag: u64,
) -> c_int {
    // SAFETY: the caller's contract is `rw`'s.
    unsafe {
        rw(
            "vfpoll_qpair_write_md",
            Rw::Write,
            qp,
            nsid,
            slba,
            buf,
            len,
            Some((meta, meta_len)),
            tag,
        )
    }
}

/// Submits a Write Zeroes of `blocks` blocks (1 to 65536) from `slba`: they read back as zeroes.
///
/// # Safety
/// `qp` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_qpair_write_zeroes(
    qp: *mut vfpoll_qpair,
    nsid: u32,
    slba: u64,
    blocks: u32,
    tag: u64,
) -> c_int {
    guard("vfpoll_qpair_write_zeroes", || {
        // SAFETY: module trust model.
        unsafe { get(qp, "qp")? }.write_zeroes(nsid, slba, blocks, tag)?;
        Ok(0)
    })
}

/// Submits a Flush: the namespace's volatile write cache reaches media before it completes.
///
/// # Safety
/// `qp` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_qpair_flush(qp: *mut vfpoll_qpair, nsid: u32, tag: u64) -> c_int {
    guard("vfpoll_qpair_flush", || {
        // SAFETY: module trust model.
        unsafe { get(qp, "qp")? }.flush(nsid, tag)?;
        Ok(0)
    })
}

/// Submits a Dataset Management deallocate (trim) of `count` ranges (1 to 256); the ranges are
/// copied before this returns.
///
/// # Safety
/// `qp` is NULL or live; `ranges` is NULL or readable for `count` ranges.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_qpair_deallocate(
    qp: *mut vfpoll_qpair,
    nsid: u32,
    ranges: *const vfpoll_range,
    count: u32,
    tag: u64,
) -> c_int {
    guard("vfpoll_qpair_deallocate", || {
        // SAFETY: module trust model.
        let qp = unsafe { get(qp, "qp")? };
        if ranges.is_null() {
            return Err(Error::inval("ranges is NULL"));
        }
        if count == 0 || count > 256 {
            return Err(Error::inval(format!("{count} deallocate ranges: give 1 to 256")));
        }
        // SAFETY: non-NULL and readable for `count` ranges (caller contract); their fields
        // are integers, valid whatever their bytes.
        let ranges = unsafe { std::slice::from_raw_parts(ranges, count as usize) };
        qp.deallocate(nsid, ranges, tag)?;
        Ok(0)
    })
}

/// Rings the submission doorbell: the commands submitted since the last ring go to the
/// controller, one MMIO write for the batch. Polling rings it too.
///
/// # Safety
/// `qp` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_qpair_commit(qp: *mut vfpoll_qpair) -> c_int {
    guard("vfpoll_qpair_commit", || {
        // SAFETY: module trust model.
        unsafe { get(qp, "qp")? }.commit();
        Ok(0)
    })
}

/// Completions copied out per round of a poll: a stack array, so polling never allocates.
const CHUNK: usize = 32;

/// Rings the submission doorbell, then writes up to `max` completions into `out` and returns
/// how many (0 when none is ready: it never waits). Each completed request gives its buffers
/// back to the caller. `out` may be NULL when `max` is 0.
///
/// # Safety
/// `qp` is NULL or live; `out` is NULL or writable for `max` completions.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_qpair_poll(
    qp: *mut vfpoll_qpair,
    out: *mut vfpoll_completion,
    max: u32,
) -> c_int {
    guard("vfpoll_qpair_poll", || {
        // SAFETY: module trust model.
        let qp = unsafe { get(qp, "qp")? };
        if out.is_null() && max != 0 {
            return Err(Error::new(EINVAL, format!("out is NULL but max is {max}")));
        }
        let max = (max as usize).min(i32::MAX as usize);
        // Straight into the caller's array: no local copy to clear and copy out at each poll
        // (most polls find nothing, and each cleared a 32-entry array).
        let mut i = 0;
        let n = qp.poll_with(max, |c| {
            let dst = out.wrapping_add(i);
            // SAFETY: `poll_with` calls this at most `max` times, so `i < max`, and `out` is
            // writable for `max` completions (caller contract; not NULL when `max != 0`,
            // checked above).
            unsafe { dst.write(c) };
            i += 1;
        });
        Ok(as_int(n))
    })
}

/// Rings the submission doorbell, then calls `cb(ctx, completion)` for up to `max` completions
/// and returns how many. The callback may submit to this queue pair and poll it again (no
/// internal state is borrowed while it runs); destroying it there is refused (`-EBUSY`).
///
/// # Safety
/// `qp` is NULL or live; `cb` is NULL or a function that is sound to call with `ctx`.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_qpair_poll_cb(
    qp: *mut vfpoll_qpair,
    max: u32,
    cb: vfpoll_completion_cb,
    ctx: *mut c_void,
) -> c_int {
    guard("vfpoll_qpair_poll_cb", || {
        // SAFETY: module trust model.
        let qp = unsafe { get(qp, "qp")? };
        let Some(cb) = cb else {
            return Err(Error::inval("cb is NULL"));
        };
        let max = (max as usize).min(i32::MAX as usize);
        let mut n = 0;
        let mut chunk = [vfpoll_completion::default(); CHUNK];
        loop {
            let want = (max - n).min(CHUNK);
            let got = qp.poll_into(&mut chunk[..want]);
            qp.in_callback.set(qp.in_callback.get() + 1);
            for c in &chunk[..got] {
                // SAFETY: the caller vouches for `cb` with `ctx`; `c` is valid for the call.
                unsafe { cb(ctx, c) };
            }
            qp.in_callback.set(qp.in_callback.get() - 1);
            n += got;
            if got < want || n == max {
                return Ok(as_int(n));
            }
        }
    })
}
