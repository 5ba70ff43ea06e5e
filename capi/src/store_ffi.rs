//! The store's C entry points (`vfpoll_store_*`, `vfpoll_ckpt_*`, `vfpoll_kv_*`), with the
//! structs they take. The trust model is [`crate::ffi`]'s: a non-NULL handle is one this library
//! returned and that is not closed yet; a pointer with a length points to that many readable (or
//! writable) bytes; arrays of `n` elements hold `n` elements. Handles may be used from any
//! thread (the store serialises its I/O bursts inside); a transaction is used by one thread at
//! a time.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_void, CStr};

use ::vfpoll_store::ReadOptions;
use libc::{EINVAL, ERANGE};

use crate::env::iommu_mode as parse_iommu_mode;
use crate::error::{guard, Error, Res};
use crate::store::{self as st, vfpoll_ckpt_reader, vfpoll_ckpt_tx, vfpoll_kv_pool, vfpoll_store};
use crate::types::VFPOLL_IOMMU_AUTO;

/// Options of `vfpoll_store_format` and `vfpoll_store_open`; fill with `vfpoll_store_opts_init`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct vfpoll_store_opts {
    /// IOMMU mode for `vfio:` namespaces (`VFPOLL_IOMMU_*`); default `VFPOLL_IOMMU_AUTO`.
    pub iommu_mode: u32,
    /// Non-zero: open files without O_DIRECT where the file system refuses it (tmpfs).
    pub allow_buffered: u32,
    /// Queue entries per namespace; 0: the default (128).
    pub queue_depth: u32,
    /// Format: the stripe chunk, a power of two from 64 KiB to 64 MiB; 0: 1 MiB.
    pub chunk_size: u32,
    /// Format: non-zero overwrites namespaces that hold a store.
    pub force: u32,
    /// Format: size of `file:` namespaces that do not exist yet; 0: their `?size=` only.
    pub file_size: u64,
    /// Directory of the lock file; NULL: `/run/vfpoll`.
    pub lock_dir: *const c_char,
    /// Format: a label (at most 64 bytes); NULL: none.
    pub label: *const c_char,
}

/// What `vfpoll_store_get_info` reports.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct vfpoll_store_info {
    /// Namespaces.
    pub members: u32,
    /// Stripe chunk in bytes.
    pub chunk_size: u32,
    /// Bytes of the logical space.
    pub capacity: u64,
    /// Bytes free.
    pub free: u64,
    /// Generation of the committed root.
    pub generation: u64,
    /// Checkpoints.
    pub checkpoints: u64,
    /// Versions over all checkpoints.
    pub versions: u64,
    /// Bytes of data in all versions.
    pub data_bytes: u64,
    /// KV pools.
    pub pools: u64,
    /// The UUID, NUL-terminated.
    pub uuid: [c_char; 40],
}

/// What `vfpoll_store_fsck` found.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct vfpoll_fsck_result {
    /// Problems found (0: clean).
    pub findings: u64,
    /// Versions checked.
    pub versions: u64,
    /// Entries checked.
    pub entries: u64,
    /// Extents whose crc32c was checked.
    pub extents: u64,
    /// Bytes of data read.
    pub bytes: u64,
    /// Occupied KV slots checked.
    pub kv_slots: u64,
    /// The first finding ("object: detail"), NUL-terminated and cut to fit; empty when clean.
    pub first: [c_char; 256],
}

/// A 128-bit KV key.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct vfpoll_kv_key {
    /// Low 64 bits.
    pub lo: u64,
    /// High 64 bits.
    pub hi: u64,
}

/// Counters of a KV pool since it was opened in this process.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct vfpoll_kv_stats {
    /// Blocks put.
    pub puts: u64,
    /// Gets that returned the block.
    pub hits: u64,
    /// Gets that found nothing (or a block that failed its crc).
    pub misses: u64,
    /// Blocks evicted to make room.
    pub evictions: u64,
    /// Blocks that failed their crc on a get (counted in misses).
    pub bad_blocks: u64,
    /// Blocks deallocated.
    pub deallocated: u64,
    /// Occupied slots.
    pub used: u64,
    /// Slots.
    pub slots: u64,
}

/// `*p`, or `EINVAL` naming `what` for NULL.
///
/// # Safety
/// `p` is NULL or valid for reads as a `T` for `'a`.
unsafe fn get<'a, T>(p: *const T, what: &str) -> Res<&'a T> {
    // SAFETY: the caller vouches for non-NULL pointers.
    unsafe { p.as_ref() }.ok_or_else(|| Error::inval(format!("{what} is NULL")))
}

/// A C string argument as `&str`.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string valid for `'a`.
unsafe fn cstr<'a>(p: *const c_char, what: &str) -> Res<&'a str> {
    if p.is_null() {
        return Err(Error::inval(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL and NUL-terminated (caller contract).
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map_err(|_| Error::inval(format!("{what} {s:?} is not UTF-8")))
}

/// Writes `v` to a non-NULL output pointer.
///
/// # Safety
/// `out` is NULL or writable for one `T`.
unsafe fn put_out<T>(out: *mut T, v: T, what: &str) -> Res<()> {
    if out.is_null() {
        return Err(Error::inval(format!("{what} (the output pointer) is NULL")));
    }
    // SAFETY: non-NULL and writable (caller contract).
    unsafe { out.write(v) };
    Ok(())
}

/// Copies `s` into a fixed C char array, NUL-terminated, cut to fit.
fn fill(dst: &mut [c_char], s: &str) {
    let n = s.len().min(dst.len() - 1);
    for (d, b) in dst.iter_mut().zip(s.as_bytes()[..n].iter()) {
        *d = *b as c_char;
    }
    dst[n] = 0;
}

/// The namespace specs of a C array.
///
/// # Safety
/// `specs` is NULL or points to `n` NULL-or-valid C strings.
unsafe fn specs_of(specs: *const *const c_char, n: usize) -> Res<Vec<String>> {
    if specs.is_null() || n == 0 {
        return Err(Error::inval(
            "name at least one namespace (specs is NULL or n is 0)",
        ));
    }
    // SAFETY: `specs` holds `n` pointers (caller contract).
    let ptrs = unsafe { std::slice::from_raw_parts(specs, n) };
    ptrs.iter()
        .enumerate()
        .map(|(i, &p)| {
            // SAFETY: each is NULL or a C string (caller contract).
            unsafe { cstr(p, &format!("specs[{i}]")) }.map(str::to_string)
        })
        .collect()
}

/// The Rust options of a C `vfpoll_store_opts` (NULL: defaults).
///
/// # Safety
/// `o` is NULL or a valid `vfpoll_store_opts` whose strings are NULL or valid.
unsafe fn opts_of(o: *const vfpoll_store_opts) -> Res<st::OpenOpts> {
    let mut d = vfpoll_store_opts_default();
    if !o.is_null() {
        // SAFETY: non-NULL and valid (caller contract).
        d = unsafe { *o };
    }
    let lock_dir = if d.lock_dir.is_null() {
        None
    } else {
        // SAFETY: a C string (caller contract).
        Some(unsafe { cstr(d.lock_dir, "opts.lock_dir") }?.to_string())
    };
    let label = if d.label.is_null() {
        String::new()
    } else {
        // SAFETY: a C string (caller contract).
        unsafe { cstr(d.label, "opts.label") }?.to_string()
    };
    Ok(st::open_opts(
        parse_iommu_mode(d.iommu_mode)?,
        lock_dir,
        d.allow_buffered != 0,
        d.queue_depth,
        d.chunk_size,
        label,
        d.file_size,
        d.force != 0,
    ))
}

fn vfpoll_store_opts_default() -> vfpoll_store_opts {
    vfpoll_store_opts {
        iommu_mode: VFPOLL_IOMMU_AUTO,
        allow_buffered: 0,
        queue_depth: 0,
        chunk_size: 0,
        force: 0,
        file_size: 0,
        lock_dir: std::ptr::null(),
        label: std::ptr::null(),
    }
}

/// Fills `*opts` with the defaults: `VFPOLL_IOMMU_AUTO`, O_DIRECT required, 128 queue entries,
/// 1 MiB chunks, no force, lock files in `/run/vfpoll`, no label.
///
/// # Safety
/// `opts` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_store_opts_init(opts: *mut vfpoll_store_opts) -> c_int {
    guard("vfpoll_store_opts_init", || {
        // SAFETY: NULL or writable (caller contract).
        unsafe { put_out(opts, vfpoll_store_opts_default(), "opts") }?;
        Ok(0)
    })
}

/// Formats a store over the `n` namespaces of `specs` (`"vfio:0000:00:03.0/1"`,
/// `"file:/data/a.img?size=64G"`, `"/dev/nvme0n1"`, `"model:1G"`, `"mem:1G"`; see
/// docs/store.md): everything on them is lost. `opts` may be NULL (defaults). On success
/// `*out` is the open store: close it with `vfpoll_store_close`. `-EEXIST` when a namespace
/// holds a store and `opts->force` is 0.
///
/// # Safety
/// `specs` points to `n` C strings; `opts` is NULL or valid; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_store_format(
    specs: *const *const c_char,
    n: usize,
    opts: *const vfpoll_store_opts,
    out: *mut *mut vfpoll_store,
) -> c_int {
    // SAFETY: the caller's contract is this function's (see the docs).
    unsafe { store_call("vfpoll_store_format", specs, n, opts, out, st::format) }
}

/// Opens the store on the `n` namespaces of `specs`, in any order (every namespace of the
/// store must be named). `-EBUSY` while another process (or handle) has it open, `-ENODEV`
/// when the namespaces hold no store, `-EBADMSG` when a structure is damaged.
///
/// # Safety
/// As `vfpoll_store_format`.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_store_open(
    specs: *const *const c_char,
    n: usize,
    opts: *const vfpoll_store_opts,
    out: *mut *mut vfpoll_store,
) -> c_int {
    // SAFETY: the caller's contract is this function's (see the docs).
    unsafe { store_call("vfpoll_store_open", specs, n, opts, out, st::open) }
}

/// The body of `vfpoll_store_format` and `vfpoll_store_open`: the specs and options from C,
/// `make` on them, the new handle into `*out`.
///
/// # Safety
/// `specs` points to `n` C strings; `opts` is NULL or valid; `out` is NULL or writable.
unsafe fn store_call(
    name: &'static str,
    specs: *const *const c_char,
    n: usize,
    opts: *const vfpoll_store_opts,
    out: *mut *mut vfpoll_store,
    make: fn(&[String], &st::OpenOpts) -> Res<vfpoll_store>,
) -> c_int {
    guard(name, || {
        // SAFETY: caller contract (see the docs).
        let specs = unsafe { specs_of(specs, n) }?;
        // SAFETY: caller contract (see the docs).
        let o = unsafe { opts_of(opts) }?;
        if out.is_null() {
            return Err(Error::inval("out (the output pointer) is NULL"));
        }
        let s = make(&specs, &o)?;
        // SAFETY: non-NULL and writable.
        unsafe { put_out(out, Box::into_raw(Box::new(s)), "out") }?;
        Ok(0)
    })
}

/// Closes a store. Readers, transactions and pools made from it keep it open until they are
/// closed too. NULL is accepted.
///
/// # Safety
/// `s` is NULL or a live store handle; it is invalid afterwards.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_store_close(s: *mut vfpoll_store) -> c_int {
    guard("vfpoll_store_close", || {
        if !s.is_null() {
            // SAFETY: a live handle from `Box::into_raw`, dropped once (caller contract).
            drop(unsafe { Box::from_raw(s) });
        }
        Ok(0)
    })
}

/// Fills `*out` with the store's geometry, fill and object counts.
///
/// # Safety
/// `s` is a live store; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_store_get_info(s: *const vfpoll_store, out: *mut vfpoll_store_info) -> c_int {
    guard("vfpoll_store_get_info", || {
        // SAFETY: trust model.
        let s = unsafe { get(s, "store")? };
        let i = s.0.info();
        let mut v = vfpoll_store_info {
            members: i.members.len() as u32,
            chunk_size: i.chunk_size,
            capacity: i.capacity,
            free: i.free,
            generation: i.generation,
            checkpoints: i.checkpoints as u64,
            versions: i.versions as u64,
            data_bytes: i.data_bytes,
            pools: i.pools as u64,
            uuid: [0; 40],
        };
        fill(&mut v.uuid, &i.uuid);
        // SAFETY: caller contract.
        unsafe { put_out(out, v, "out") }?;
        Ok(0)
    })
}

/// Writes the store's objects into `buf` (`cap` bytes), one line each:
/// `checkpoint NAME VERSION BYTES ENTRIES` per committed version and
/// `pool NAME BLOCK_SIZE SLOTS` per KV pool, NUL-terminated. Returns the length the text needs
/// (without the NUL); when that is `cap` or more, the text was cut (call again with more room).
/// `buf` may be NULL with `cap` 0 to ask for the length.
///
/// # Safety
/// `s` is a live store; `buf` is NULL or writable for `cap` bytes.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_store_list(s: *const vfpoll_store, buf: *mut c_char, cap: usize) -> c_int {
    guard("vfpoll_store_list", || {
        // SAFETY: trust model.
        let s = unsafe { get(s, "store")? };
        let t = st::list(&s.0);
        if !buf.is_null() && cap > 0 {
            let n = t.len().min(cap - 1);
            // SAFETY: `buf` is writable for `cap` bytes (caller contract) and nothing else
            // refers to it during this call.
            let dst = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), cap) };
            dst[..n].copy_from_slice(&t.as_bytes()[..n]);
            dst[n] = 0;
        }
        i32::try_from(t.len()).map_err(|_| Error::new(ERANGE, "the list is longer than 2 GiB"))
    })
}

/// Checks every structure and checksum of the store (reads all data) and fills `*out`.
/// Returns 0 when clean, else the number of findings (the first is in `out->first`).
///
/// # Safety
/// `s` is a live store; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_store_fsck(s: *const vfpoll_store, out: *mut vfpoll_fsck_result) -> c_int {
    guard("vfpoll_store_fsck", || {
        // SAFETY: trust model.
        let s = unsafe { get(s, "store")? };
        if out.is_null() {
            return Err(Error::inval("out (the output pointer) is NULL"));
        }
        let r = s.0.fsck()?;
        let mut v = vfpoll_fsck_result {
            findings: r.findings.len() as u64,
            versions: r.versions as u64,
            entries: r.entries as u64,
            extents: r.extents,
            bytes: r.bytes,
            kv_slots: r.kv_slots,
            first: [0; 256],
        };
        if let Some(f) = r.findings.first() {
            fill(&mut v.first, &format!("{}: {}", f.object, f.detail));
        }
        // SAFETY: non-NULL and writable (caller contract).
        unsafe { put_out(out, v, "out") }?;
        Ok(i32::try_from(r.findings.len()).unwrap_or(i32::MAX))
    })
}

/// Begins a new version of checkpoint `name` (made by its first commit). Nothing is visible
/// until `vfpoll_ckpt_commit`. On success `*out` is the transaction; end it with
/// `vfpoll_ckpt_commit` or `vfpoll_ckpt_abort` (which also free it).
///
/// # Safety
/// `s` is a live store; `name` a C string; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_ckpt_begin(
    s: *const vfpoll_store,
    name: *const c_char,
    out: *mut *mut vfpoll_ckpt_tx,
) -> c_int {
    guard("vfpoll_ckpt_begin", || {
        // SAFETY: trust model.
        let s = unsafe { get(s, "store") }?;
        // SAFETY: trust model.
        let name = unsafe { cstr(name, "name") }?;
        if out.is_null() {
            return Err(Error::inval("out (the output pointer) is NULL"));
        }
        let tx = s.0.begin(name)?;
        let h = Box::into_raw(Box::new(vfpoll_ckpt_tx(std::sync::Mutex::new(Some(tx)))));
        // SAFETY: non-NULL and writable (caller contract).
        unsafe { put_out(out, h, "out") }?;
        Ok(0)
    })
}

/// Writes entry `entry` of `len` bytes at `data`, with `meta_len` opaque bytes at `meta` (a
/// dtype and shape; NULL with 0). When it returns the data is on the devices and the caller's
/// memory may be reused (the *staged* point of this entry).
///
/// # Safety
/// `tx` is a live transaction; `entry` a C string; `meta` and `data` readable for their lengths
/// (or NULL with length 0).
#[no_mangle]
pub unsafe extern "C" fn vfpoll_ckpt_put(
    tx: *const vfpoll_ckpt_tx,
    entry: *const c_char,
    meta: *const c_void,
    meta_len: usize,
    data: *const c_void,
    len: usize,
) -> c_int {
    guard("vfpoll_ckpt_put", || {
        // SAFETY: trust model.
        let tx = unsafe { get(tx, "tx") }?;
        // SAFETY: trust model.
        let entry = unsafe { cstr(entry, "entry") }?;
        // SAFETY: readable for their lengths (caller contract); empty slices for NULL with 0.
        let meta = unsafe { bytes(meta, meta_len, "meta") }?;
        // SAFETY: readable for their lengths (caller contract); empty slices for NULL with 0.
        let data = unsafe { bytes(data, len, "data") }?;
        st::with_tx(tx, |t| Ok(t.put(entry, meta, data)?))?;
        Ok(0)
    })
}

/// A byte slice from C (NULL only with length 0).
///
/// # Safety
/// `p` is readable for `len` bytes for `'a`, or NULL with `len` 0.
unsafe fn bytes<'a>(p: *const c_void, len: usize, what: &str) -> Res<&'a [u8]> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Error::inval(format!("{what} is NULL with a length of {len}")));
    }
    // SAFETY: readable for `len` bytes (caller contract).
    Ok(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) })
}

/// Makes the commit of `tx` delete all but the newest `n` versions (this one counted).
///
/// # Safety
/// `tx` is a live transaction.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_ckpt_keep_last(tx: *const vfpoll_ckpt_tx, n: u32) -> c_int {
    guard("vfpoll_ckpt_keep_last", || {
        // SAFETY: trust model.
        let tx = unsafe { get(tx, "tx")? };
        if n == 0 {
            return Err(Error::inval(
                "keep_last: n is at least 1 (the version being committed)",
            ));
        }
        st::with_tx(tx, |t| {
            t.keep_last(n as usize);
            Ok(())
        })?;
        Ok(0)
    })
}

/// Commits: data, then a flush of every namespace with a write cache, then the root with FUA.
/// On success the version is durable and visible and `*version` (may be NULL) is its id. The
/// transaction is freed either way; on an error nothing of it is visible.
///
/// # Safety
/// `tx` is a live transaction (invalid afterwards); `version` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_ckpt_commit(tx: *mut vfpoll_ckpt_tx, version: *mut u64) -> c_int {
    guard("vfpoll_ckpt_commit", || {
        if tx.is_null() {
            return Err(Error::inval("tx is NULL"));
        }
        // SAFETY: a live handle from `Box::into_raw`, freed once here (caller contract).
        let h = unsafe { Box::from_raw(tx) };
        let c = st::take_tx(&h)?.commit()?;
        if !version.is_null() {
            // SAFETY: non-NULL and writable (caller contract).
            unsafe { version.write(c.version) };
        }
        Ok(0)
    })
}

/// Drops the transaction: its space is given back, nothing was ever visible. NULL is accepted.
///
/// # Safety
/// `tx` is NULL or a live transaction (invalid afterwards).
#[no_mangle]
pub unsafe extern "C" fn vfpoll_ckpt_abort(tx: *mut vfpoll_ckpt_tx) -> c_int {
    guard("vfpoll_ckpt_abort", || {
        if !tx.is_null() {
            // SAFETY: a live handle from `Box::into_raw`, freed once here (caller contract).
            drop(unsafe { Box::from_raw(tx) });
        }
        Ok(0)
    })
}

/// Opens version `version` of checkpoint `name` for reading (0: the newest). The version is
/// pinned (never reclaimed) until `vfpoll_ckpt_close`. `-ENOENT` when there is none.
///
/// # Safety
/// `s` is a live store; `name` a C string; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_ckpt_open(
    s: *const vfpoll_store,
    name: *const c_char,
    version: u64,
    out: *mut *mut vfpoll_ckpt_reader,
) -> c_int {
    guard("vfpoll_ckpt_open", || {
        // SAFETY: trust model.
        let s = unsafe { get(s, "store") }?;
        // SAFETY: trust model.
        let name = unsafe { cstr(name, "name") }?;
        if out.is_null() {
            return Err(Error::inval("out (the output pointer) is NULL"));
        }
        let r = s.0.open_version(name, (version != 0).then_some(version))?;
        // SAFETY: non-NULL and writable (caller contract).
        unsafe { put_out(out, Box::into_raw(Box::new(vfpoll_ckpt_reader(r))), "out") }?;
        Ok(0)
    })
}

/// The reader's version id into `*version`, and `entry`'s length into `*len` when `entry` is
/// not NULL (`-ENOENT` when the version has no such entry).
///
/// # Safety
/// `r` is a live reader; `entry` NULL or a C string; `version` and `len` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_ckpt_stat(
    r: *const vfpoll_ckpt_reader,
    entry: *const c_char,
    version: *mut u64,
    len: *mut u64,
) -> c_int {
    guard("vfpoll_ckpt_stat", || {
        // SAFETY: trust model.
        let r = unsafe { get(r, "reader")? };
        if !version.is_null() {
            // SAFETY: non-NULL and writable (caller contract).
            unsafe { version.write(r.0.version()) };
        }
        if !entry.is_null() {
            // SAFETY: a C string (caller contract).
            let e = r.0.entry(unsafe { cstr(entry, "entry")? })?;
            if !len.is_null() {
                // SAFETY: non-NULL and writable (caller contract).
                unsafe { len.write(e.len) };
            }
        }
        Ok(0)
    })
}

/// Reads `len` bytes of `entry` from byte `offset` into `dst`. With `verify` non-zero every
/// extent's crc32c is checked (`-EBADMSG` on a mismatch, and `dst` then holds nothing to trust);
/// 0 skips the checks.
///
/// # Safety
/// `r` is a live reader; `entry` a C string; `dst` writable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_ckpt_read(
    r: *const vfpoll_ckpt_reader,
    entry: *const c_char,
    offset: u64,
    dst: *mut c_void,
    len: usize,
    verify: c_int,
) -> c_int {
    guard("vfpoll_ckpt_read", || {
        // SAFETY: trust model.
        let r = unsafe { get(r, "reader") }?;
        // SAFETY: trust model.
        let entry = unsafe { cstr(entry, "entry") }?;
        if len == 0 {
            return Ok(0);
        }
        if dst.is_null() {
            return Err(Error::inval(format!("dst is NULL with a length of {len}")));
        }
        // SAFETY: writable for `len` bytes (caller contract); no other reference to it exists.
        let d = unsafe { std::slice::from_raw_parts_mut(dst.cast::<u8>(), len) };
        r.0.read_range(entry, offset, d, &ReadOptions { verify: verify != 0 })?;
        Ok(0)
    })
}

/// Closes a reader (unpins its version). NULL is accepted.
///
/// # Safety
/// `r` is NULL or a live reader (invalid afterwards).
#[no_mangle]
pub unsafe extern "C" fn vfpoll_ckpt_close(r: *mut vfpoll_ckpt_reader) -> c_int {
    guard("vfpoll_ckpt_close", || {
        if !r.is_null() {
            // SAFETY: a live handle from `Box::into_raw`, dropped once (caller contract).
            drop(unsafe { Box::from_raw(r) });
        }
        Ok(0)
    })
}

/// Deletes version `version` of checkpoint `name`, or the whole checkpoint when `version` is 0.
/// A version being read is reclaimed only when its last reader closes.
///
/// # Safety
/// `s` is a live store; `name` a C string.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_ckpt_delete(
    s: *const vfpoll_store,
    name: *const c_char,
    version: u64,
) -> c_int {
    guard("vfpoll_ckpt_delete", || {
        // SAFETY: trust model.
        let s = unsafe { get(s, "store") }?;
        // SAFETY: trust model.
        let name = unsafe { cstr(name, "name") }?;
        if version == 0 {
            s.0.delete_checkpoint(name)?;
        } else {
            s.0.delete_version(name, version)?;
        }
        Ok(0)
    })
}

/// Creates KV pool `name` of `slots` blocks of `block_size` bytes (a multiple of 4096) and
/// opens it into `*out`; close it with `vfpoll_kv_close`.
///
/// # Safety
/// `s` is a live store; `name` a C string; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_kv_create(
    s: *const vfpoll_store,
    name: *const c_char,
    block_size: u32,
    slots: u64,
    out: *mut *mut vfpoll_kv_pool,
) -> c_int {
    guard("vfpoll_kv_create", || {
        // SAFETY: trust model.
        let s = unsafe { get(s, "store") }?;
        // SAFETY: trust model.
        let name = unsafe { cstr(name, "name") }?;
        if out.is_null() {
            return Err(Error::inval("out (the output pointer) is NULL"));
        }
        let p = s.0.create_pool(name, block_size, slots)?;
        // SAFETY: non-NULL and writable (caller contract).
        unsafe { put_out(out, Box::into_raw(Box::new(vfpoll_kv_pool(p))), "out") }?;
        Ok(0)
    })
}

/// Opens KV pool `name` into `*out` (`-ENOENT` when there is none).
///
/// # Safety
/// `s` is a live store; `name` a C string; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_kv_open(
    s: *const vfpoll_store,
    name: *const c_char,
    out: *mut *mut vfpoll_kv_pool,
) -> c_int {
    guard("vfpoll_kv_open", || {
        // SAFETY: trust model.
        let s = unsafe { get(s, "store") }?;
        // SAFETY: trust model.
        let name = unsafe { cstr(name, "name") }?;
        if out.is_null() {
            return Err(Error::inval("out (the output pointer) is NULL"));
        }
        let p = s.0.pool(name)?;
        // SAFETY: non-NULL and writable (caller contract).
        unsafe { put_out(out, Box::into_raw(Box::new(vfpoll_kv_pool(p))), "out") }?;
        Ok(0)
    })
}

/// Closes a pool handle. NULL is accepted.
///
/// # Safety
/// `p` is NULL or a live pool (invalid afterwards).
#[no_mangle]
pub unsafe extern "C" fn vfpoll_kv_close(p: *mut vfpoll_kv_pool) -> c_int {
    guard("vfpoll_kv_close", || {
        if !p.is_null() {
            // SAFETY: a live handle from `Box::into_raw`, dropped once (caller contract).
            drop(unsafe { Box::from_raw(p) });
        }
        Ok(0)
    })
}

/// Puts `n` blocks in one submission burst: `bufs[i]` (`lens[i]` bytes, 1 to the block size)
/// under `keys[i]`, replacing older blocks of those keys and evicting the least recently used
/// when the pool is full. Not durable until `vfpoll_kv_sync`.
///
/// # Safety
/// `p` is a live pool; `keys`, `bufs` and `lens` hold `n` elements; `bufs[i]` is readable for
/// `lens[i]` bytes.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_kv_put(
    p: *const vfpoll_kv_pool,
    keys: *const vfpoll_kv_key,
    bufs: *const *const c_void,
    lens: *const usize,
    n: usize,
) -> c_int {
    guard("vfpoll_kv_put", || {
        // SAFETY: trust model.
        let p = unsafe { get(p, "pool")? };
        if n == 0 {
            return Ok(0);
        }
        if keys.is_null() || bufs.is_null() || lens.is_null() {
            return Err(Error::inval("keys, bufs and lens must not be NULL"));
        }
        // SAFETY: `n` elements (caller contract).
        let k = unsafe { std::slice::from_raw_parts(keys, n) };
        // SAFETY: `n` elements (caller contract).
        let b = unsafe { std::slice::from_raw_parts(bufs, n) };
        // SAFETY: `n` elements (caller contract).
        let l = unsafe { std::slice::from_raw_parts(lens, n) };
        let keys: Vec<u128> = k.iter().map(|k| st::key(k.lo, k.hi)).collect();
        let data: Vec<&[u8]> = b
            .iter()
            .zip(l)
            .enumerate()
            // SAFETY: `bufs[i]` is readable for `lens[i]` bytes (caller contract).
            .map(|(i, (&ptr, &len))| unsafe { bytes(ptr, len, &format!("bufs[{i}]")) })
            .collect::<Res<_>>()?;
        p.0.put_many(&keys, &data)?;
        Ok(0)
    })
}

/// Gets `n` blocks in one submission burst into `bufs[i]` (each `buf_len` bytes, at least the
/// block's length). `lens[i]` becomes the block's length for a hit and -1 for a miss (a block
/// that fails its crc32c is a miss). Returns the number of hits.
///
/// # Safety
/// `p` is a live pool; `keys`, `bufs` and `lens` hold `n` elements; `bufs[i]` is writable for
/// `buf_len` bytes and no two overlap.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_kv_get(
    p: *const vfpoll_kv_pool,
    keys: *const vfpoll_kv_key,
    bufs: *const *mut c_void,
    buf_len: usize,
    lens: *mut i64,
    n: usize,
) -> c_int {
    guard("vfpoll_kv_get", || {
        // SAFETY: trust model.
        let p = unsafe { get(p, "pool")? };
        if n == 0 {
            return Ok(0);
        }
        if keys.is_null() || bufs.is_null() || lens.is_null() {
            return Err(Error::inval("keys, bufs and lens must not be NULL"));
        }
        // SAFETY: `n` elements (caller contract).
        let k = unsafe { std::slice::from_raw_parts(keys, n) };
        // SAFETY: `n` elements (caller contract).
        let b = unsafe { std::slice::from_raw_parts(bufs, n) };
        let keys: Vec<u128> = k.iter().map(|k| st::key(k.lo, k.hi)).collect();
        let mut outs: Vec<&mut [u8]> = Vec::with_capacity(n);
        for (i, &ptr) in b.iter().enumerate() {
            if ptr.is_null() {
                return Err(Error::new(EINVAL, format!("bufs[{i}] is NULL")));
            }
            // SAFETY: writable for `buf_len` bytes, not overlapping the others (caller contract).
            outs.push(unsafe { std::slice::from_raw_parts_mut(ptr.cast::<u8>(), buf_len) });
        }
        let got = p.0.get_many(&keys, &mut outs)?;
        // SAFETY: `lens` holds `n` writable elements, not overlapping the buffers (caller
        // contract).
        let lens = unsafe { std::slice::from_raw_parts_mut(lens, n) };
        let mut hits = 0;
        for (l, g) in lens.iter_mut().zip(&got) {
            *l = g.map_or(-1, |l| l as i64);
            hits += i32::from(g.is_some());
        }
        Ok(hits)
    })
}

/// Removes `n` keys (absent ones are ignored); returns how many were held.
///
/// # Safety
/// `p` is a live pool; `keys` holds `n` elements.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_kv_remove(
    p: *const vfpoll_kv_pool,
    keys: *const vfpoll_kv_key,
    n: usize,
) -> c_int {
    guard("vfpoll_kv_remove", || {
        // SAFETY: trust model.
        let p = unsafe { get(p, "pool")? };
        if n == 0 {
            return Ok(0);
        }
        if keys.is_null() {
            return Err(Error::inval("keys is NULL"));
        }
        // SAFETY: `n` elements (caller contract).
        let k = unsafe { std::slice::from_raw_parts(keys, n) };
        let keys: Vec<u128> = k.iter().map(|k| st::key(k.lo, k.hi)).collect();
        Ok(i32::try_from(p.0.remove_many(&keys)?).unwrap_or(i32::MAX))
    })
}

/// Makes every put so far durable (flushes the namespaces' write caches).
///
/// # Safety
/// `p` is a live pool.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_kv_sync(p: *const vfpoll_kv_pool) -> c_int {
    guard("vfpoll_kv_sync", || {
        // SAFETY: trust model.
        let p = unsafe { get(p, "pool")? };
        p.0.sync()?;
        Ok(0)
    })
}

/// The pool's counters since it was opened in this process, and its fill.
///
/// # Safety
/// `p` is a live pool; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_kv_get_stats(p: *const vfpoll_kv_pool, out: *mut vfpoll_kv_stats) -> c_int {
    guard("vfpoll_kv_get_stats", || {
        // SAFETY: trust model.
        let p = unsafe { get(p, "pool")? };
        let s = p.0.stats();
        let v = vfpoll_kv_stats {
            puts: s.puts,
            hits: s.hits,
            misses: s.misses,
            evictions: s.evictions,
            bad_blocks: s.bad_blocks,
            deallocated: s.deallocated,
            used: p.0.len(),
            slots: p.0.info().slots,
        };
        // SAFETY: caller contract.
        unsafe { put_out(out, v, "out") }?;
        Ok(0)
    })
}

/// Deletes KV pool `name` and deallocates its space (refused while a handle on it is open).
///
/// # Safety
/// `s` is a live store; `name` a C string.
#[no_mangle]
pub unsafe extern "C" fn vfpoll_kv_delete(s: *const vfpoll_store, name: *const c_char) -> c_int {
    guard("vfpoll_kv_delete", || {
        // SAFETY: trust model.
        let s = unsafe { get(s, "store") }?;
        // SAFETY: trust model.
        let name = unsafe { cstr(name, "name") }?;
        s.0.delete_pool(name)?;
        Ok(0)
    })
}

#[cfg(test)]
mod tests {
    // A block of calls as C makes them shares one safety argument.
    #![allow(clippy::multiple_unsafe_ops_per_block, clippy::undocumented_unsafe_blocks)]

    use std::ffi::CString;
    use std::ptr::{null, null_mut};

    use libc::{EBADMSG, EBUSY, EINVAL, ENOENT};

    use super::*;

    fn opts(dir: &std::path::Path) -> (vfpoll_store_opts, CString) {
        let d = CString::new(dir.to_str().unwrap()).unwrap();
        let mut o = vfpoll_store_opts_default();
        o.lock_dir = d.as_ptr();
        o.allow_buffered = 1;
        (o, d)
    }

    #[test]
    fn checkpoint_and_kv_through_the_c_entry_points() {
        let dir = std::env::temp_dir().join(format!("vfpoll-capi-store-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (o, _d) = opts(&dir);
        let a = CString::new(format!("file:{}/a.img?size=16M", dir.display())).unwrap();
        let b = CString::new(format!("file:{}/b.img?size=16M", dir.display())).unwrap();
        let specs = [a.as_ptr(), b.as_ptr()];
        let name = c"model";
        let entry = c"w";
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let data: Vec<u8> = (0..3_000_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        unsafe {
            let mut s = null_mut();
            assert_eq!(vfpoll_store_format(null(), 0, &o, &mut s), -EINVAL);
            assert_eq!(vfpoll_store_format(specs.as_ptr(), 2, &o, &mut s), 0);
            // A second handle on the same store: refused, the store says by whom.
            let mut s2 = null_mut();
            assert_eq!(vfpoll_store_open(specs.as_ptr(), 2, &o, &mut s2), -EBUSY);
            let mut tx = null_mut();
            assert_eq!(vfpoll_ckpt_begin(s, name.as_ptr(), &mut tx), 0);
            assert_eq!(
                vfpoll_ckpt_put(tx, entry.as_ptr(), null(), 0, data.as_ptr().cast(), data.len()),
                0
            );
            assert_eq!(
                vfpoll_ckpt_put(tx, entry.as_ptr(), null(), 0, data.as_ptr().cast(), 1),
                -libc::EEXIST
            );
            assert_eq!(vfpoll_ckpt_put(tx, c"x".as_ptr(), null(), 0, null(), 5), -EINVAL);
            let mut v = 0;
            assert_eq!(vfpoll_ckpt_commit(tx, &mut v), 0);
            let mut r = null_mut();
            assert_eq!(vfpoll_ckpt_open(s, c"nope".as_ptr(), 0, &mut r), -ENOENT);
            assert_eq!(vfpoll_ckpt_open(s, name.as_ptr(), 0, &mut r), 0);
            let (mut ver, mut len) = (0, 0);
            assert_eq!(vfpoll_ckpt_stat(r, entry.as_ptr(), &mut ver, &mut len), 0);
            assert_eq!((ver, len), (v, data.len() as u64));
            let mut back = vec![0u8; data.len()];
            assert_eq!(
                vfpoll_ckpt_read(r, entry.as_ptr(), 0, back.as_mut_ptr().cast(), back.len(), 1),
                0
            );
            assert!(back == data);
            assert_eq!(
                vfpoll_ckpt_read(r, entry.as_ptr(), 1, back.as_mut_ptr().cast(), back.len(), 1),
                -EINVAL
            );
            assert_eq!(vfpoll_ckpt_close(r), 0);
            // KV.
            let mut p = null_mut();
            assert_eq!(vfpoll_kv_create(s, c"kv".as_ptr(), 4096, 8, &mut p), 0);
            let keys = [vfpoll_kv_key { lo: 1, hi: 2 }, vfpoll_kv_key { lo: 3, hi: 4 }];
            let blocks = [[7u8; 4096], [9u8; 4096]];
            let bufs = [blocks[0].as_ptr().cast::<c_void>(), blocks[1].as_ptr().cast()];
            let lens = [4096usize, 100];
            assert_eq!(
                vfpoll_kv_put(p, keys.as_ptr(), bufs.as_ptr(), lens.as_ptr(), 2),
                0
            );
            let mut out = [[0u8; 4096]; 3];
            let outs = [
                out[0].as_mut_ptr().cast::<c_void>(),
                out[1].as_mut_ptr().cast(),
                out[2].as_mut_ptr().cast(),
            ];
            let ask = [keys[0], keys[1], vfpoll_kv_key { lo: 5, hi: 6 }];
            let mut got = [0i64; 3];
            assert_eq!(
                vfpoll_kv_get(p, ask.as_ptr(), outs.as_ptr(), 4096, got.as_mut_ptr(), 3),
                2
            );
            assert_eq!(got, [4096, 100, -1]);
            assert!(out[0] == blocks[0] && out[1][..100] == blocks[1][..100]);
            let mut st = vfpoll_kv_stats::default();
            assert_eq!(vfpoll_kv_get_stats(p, &mut st), 0);
            assert_eq!((st.used, st.hits, st.misses), (2, 2, 1));
            assert_eq!(vfpoll_kv_remove(p, keys.as_ptr(), 1), 1);
            assert_eq!(vfpoll_kv_sync(p), 0);
            assert_eq!(vfpoll_kv_close(p), 0);
            let mut fr = std::mem::zeroed::<vfpoll_fsck_result>();
            assert_eq!(vfpoll_store_fsck(s, &mut fr), 0);
            assert_eq!(fr.versions, 1);
            let need = vfpoll_store_list(s, null_mut(), 0);
            let mut text = vec![0 as c_char; need as usize + 1];
            assert_eq!(vfpoll_store_list(s, text.as_mut_ptr(), text.len()), need);
            let t = CStr::from_ptr(text.as_ptr()).to_str().unwrap().to_string();
            assert_eq!(t, format!("checkpoint model {v} 3000000 1\npool kv 4096 8\n"));
            let mut info = std::mem::zeroed::<vfpoll_store_info>();
            assert_eq!(vfpoll_store_get_info(s, &mut info), 0);
            assert_eq!((info.members, info.checkpoints, info.pools), (2, 1, 1));
            assert_eq!(vfpoll_store_close(s), 0);
        }
        // A damaged extent: the read fails with EBADMSG (crc on), returns the bytes with it off.
        let img = std::fs::read(dir.join("a.img")).unwrap();
        // The entry's first bytes (the data is random: they occur once).
        let at = img
            .windows(64)
            .position(|w| w == &data[..64])
            .expect("the entry starts on member 0")
            + 10;
        let mut img = img;
        img[at] ^= 0xff;
        std::fs::write(dir.join("a.img"), &img).unwrap();
        unsafe {
            let mut s = null_mut();
            assert_eq!(vfpoll_store_open(specs.as_ptr(), 2, &o, &mut s), 0);
            let mut r = null_mut();
            assert_eq!(vfpoll_ckpt_open(s, name.as_ptr(), 0, &mut r), 0);
            let mut back = vec![0u8; data.len()];
            assert_eq!(
                vfpoll_ckpt_read(r, entry.as_ptr(), 0, back.as_mut_ptr().cast(), back.len(), 1),
                -EBADMSG
            );
            assert_eq!(
                vfpoll_ckpt_read(r, entry.as_ptr(), 0, back.as_mut_ptr().cast(), back.len(), 0),
                0
            );
            vfpoll_ckpt_close(r);
            vfpoll_store_close(s);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
