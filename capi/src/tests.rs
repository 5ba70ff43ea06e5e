//! Host tests: the header is what cbindgen makes now, and the C entry points, called as C
//! calls them, against the in-process NVMe model (`vfpoll-nvme-model`): argument checks,
//! error codes and messages, buffer ownership, every command, completions by array and by
//! callback.

// A block of calls as C makes them shares one safety argument.
#![allow(clippy::multiple_unsafe_ops_per_block)]

use std::ffi::{c_void, CStr};
use std::ptr::{null, null_mut};
use std::sync::Arc;
use std::time::{Duration, Instant};

use libc::{EAGAIN, EBUSY, EINVAL, EIO, ENOBUFS, ENOENT, ENOTRECOVERABLE, ERANGE};
use vfpoll_dma::{DmaContext, FakeMapper, PageSize};
use vfpoll_nvme::{Controller, ControllerOptions};
use vfpoll_nvme_model::{
    Fault, FaultCheck, FaultKind, FaultLog, ModelConfig, NamespaceConfig, NvmeModel, PiType, Protection,
    Status,
};

use crate::env::{vfpoll_ctrl, vfpoll_env, Env};
use crate::ffi::*;
use crate::pool::{vfpoll_buf, vfpoll_pool};
use crate::qpair::vfpoll_qpair;
use crate::types::*;

#[test]
fn header_is_up_to_date() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let config = cbindgen::Config::from_file(format!("{dir}/cbindgen.toml")).expect("cbindgen.toml");
    let mut now = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut now);
    let path = std::path::Path::new(dir).join("include/vfpoll.h");
    if std::env::var_os("VFPOLL_BLESS_HEADER").is_some() {
        std::fs::write(&path, &now).expect("write include/vfpoll.h");
        return;
    }
    let checked_in = std::fs::read(&path).unwrap_or_default();
    assert!(
        checked_in == now,
        "{} is stale: it differs from what cbindgen generates from capi/src now. Run `VFPOLL_BLESS_HEADER=1 cargo test -p vfpoll-capi header` and commit the header",
        path.display()
    );
}

/// This thread's last error message.
fn last() -> String {
    // SAFETY: `vfpoll_last_error` returns a NUL-terminated string valid until the next failing
    // call on this thread; it is copied at once.
    unsafe { CStr::from_ptr(vfpoll_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// Asserts that `rc` is `-errno` and that the message holds every one of `words`.
#[track_caller]
fn fails(rc: i32, errno: i32, words: &[&str]) {
    let msg = last();
    assert_eq!(rc, -errno, "expected -{errno}, got {rc}: {msg}");
    for w in words {
        assert!(msg.contains(w), "message lacks {w:?}: {msg}");
    }
}

/// The model with three namespaces (plain 512 B; 512 B with 8 B of separate metadata; 4 KiB
/// with 8 B of PI type 1) and a controller handle over it, as `vfpoll_ctrl_open` would make.
struct Bed {
    model: NvmeModel,
    ctrl: *mut vfpoll_ctrl,
    _no_stray_dma: FaultCheck,
}

impl Drop for Bed {
    fn drop(&mut self) {
        // SAFETY: the handle came from `Box::into_raw` in `bed` and is closed once.
        assert_eq!(unsafe { vfpoll_ctrl_close(self.ctrl) }, 0);
    }
}

fn bed() -> Bed {
    let mapper = Arc::new(FakeMapper::new());
    let log = Arc::new(FaultLog::new(mapper.clone()));
    let cfg = ModelConfig {
        namespaces: vec![
            NamespaceConfig::new(1, 512, 8192),
            NamespaceConfig::new(2, 512, 1024).with_metadata(8, false),
            NamespaceConfig::new(3, 4096, 256)
                .with_metadata(8, false)
                .with_protection(Protection::last(PiType::Type1)),
        ],
        idle_spin: Duration::from_millis(200),
        ..Default::default()
    };
    let model = NvmeModel::start(cfg, log.clone()).unwrap();
    let dma = DmaContext::new(mapper);
    let opts = ControllerOptions {
        page_size: PageSize::Base4K,
        io_queues: 8,
        ..Default::default()
    };
    let ctrl = Controller::new(model.bar0(), dma.clone(), opts).unwrap();
    let env = Env::for_model(dma, PageSize::Base4K);
    Bed {
        model,
        ctrl: Box::into_raw(Box::new(vfpoll_ctrl { ctrl, env })),
        _no_stray_dma: FaultCheck(log),
    }
}

impl Bed {
    fn pool(&self, size: usize, count: u32) -> *mut vfpoll_pool {
        let mut p = null_mut();
        // SAFETY: a live controller handle and a writable out pointer.
        let rc = unsafe { vfpoll_pool_create(self.ctrl, size, count, &mut p) };
        assert_eq!(rc, 0, "{}", last());
        p
    }

    fn qpair(&self, entries: u32) -> *mut vfpoll_qpair {
        let mut o = opts();
        o.entries = entries;
        let mut q = null_mut();
        // SAFETY: live handle, readable options, writable out pointer.
        let rc = unsafe { vfpoll_qpair_create(self.ctrl, &o, &mut q) };
        assert_eq!(rc, 0, "{}", last());
        q
    }
}

fn opts() -> vfpoll_qpair_opts {
    let mut o = std::mem::MaybeUninit::uninit();
    // SAFETY: a writable options struct, initialised by the call (checked).
    assert_eq!(unsafe { vfpoll_qpair_opts_init(o.as_mut_ptr()) }, 0);
    // SAFETY: initialised just above.
    unsafe { o.assume_init() }
}

fn alloc(pool: *mut vfpoll_pool) -> *mut vfpoll_buf {
    let mut b = null_mut();
    // SAFETY: a live pool and a writable out pointer.
    let rc = unsafe { vfpoll_buf_alloc(pool, &mut b) };
    assert_eq!(rc, 0, "{}", last());
    b
}

fn put(buf: *mut vfpoll_buf, data: &[u8]) -> i32 {
    // SAFETY: an allocated buffer of a live pool; `data` is readable for its length.
    unsafe { vfpoll_buf_write(buf, 0, data.as_ptr().cast(), data.len()) }
}

fn get(buf: *mut vfpoll_buf, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    // SAFETY: an allocated buffer of a live pool; `v` is writable for `len` bytes.
    let rc = unsafe { vfpoll_buf_read(buf, 0, v.as_mut_ptr().cast(), len) };
    assert_eq!(rc, 0, "{}", last());
    v
}

fn free(buf: *mut vfpoll_buf) -> i32 {
    // SAFETY: a handle of a live pool (allocated or not: the state is checked).
    unsafe { vfpoll_buf_free(buf) }
}

fn read(qp: *mut vfpoll_qpair, nsid: u32, slba: u64, buf: *mut vfpoll_buf, len: usize, tag: u64) -> i32 {
    // SAFETY: live queue pair and a buffer handle of a live pool.
    unsafe { vfpoll_qpair_read(qp, nsid, slba, buf, len, tag) }
}

fn write(qp: *mut vfpoll_qpair, nsid: u32, slba: u64, buf: *mut vfpoll_buf, len: usize, tag: u64) -> i32 {
    // SAFETY: live queue pair and a buffer handle of a live pool.
    unsafe { vfpoll_qpair_write(qp, nsid, slba, buf, len, tag) }
}

fn poll(qp: *mut vfpoll_qpair, out: &mut [vfpoll_completion]) -> i32 {
    // SAFETY: live queue pair; `out` is writable for its length.
    unsafe { vfpoll_qpair_poll(qp, out.as_mut_ptr(), out.len() as u32) }
}

/// Polls until `n` completions have come (at most 10 s).
fn wait(qp: *mut vfpoll_qpair, n: usize) -> Vec<vfpoll_completion> {
    let mut all = Vec::new();
    let start = Instant::now();
    while all.len() < n {
        let mut c = [vfpoll_completion::default(); 8];
        let got = poll(qp, &mut c);
        assert!(got >= 0, "{}", last());
        all.extend_from_slice(&c[..got as usize]);
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{} of {n} completions",
            all.len()
        );
    }
    all
}

fn outstanding(qp: *mut vfpoll_qpair) -> i32 {
    // SAFETY: live queue pair.
    unsafe { vfpoll_qpair_outstanding(qp) }
}

fn destroy_qpair(qp: *mut vfpoll_qpair) -> i32 {
    // SAFETY: a live queue pair handle; invalid after success, and not used then.
    unsafe { vfpoll_qpair_destroy(qp) }
}

fn destroy_pool(pool: *mut vfpoll_pool) -> i32 {
    // SAFETY: a live pool handle; invalid after success, and not used then.
    unsafe { vfpoll_pool_destroy(pool) }
}

#[test]
fn null_pointers_and_bad_values_are_refused_with_a_message() {
    let b = bed();
    // SAFETY: (all calls below) every pointer is NULL, or a live handle, or writable memory of
    // the right type; NULLs are what is tested.
    unsafe {
        let mut env: *mut vfpoll_env = null_mut();
        fails(
            vfpoll_env_open(7, VFPOLL_PAGE_2M, &mut env),
            EINVAL,
            &["IOMMU mode 7"],
        );
        fails(
            vfpoll_env_open(VFPOLL_IOMMU_TYPE1, 9, &mut env),
            EINVAL,
            &["page size 9"],
        );
        fails(
            vfpoll_env_open(VFPOLL_IOMMU_TYPE1, VFPOLL_PAGE_2M, null_mut()),
            EINVAL,
            &["out"],
        );
        assert!(env.is_null());
        let mut ctrl = null_mut();
        fails(
            vfpoll_ctrl_open(null_mut(), c"0000:00:03.0".as_ptr(), &mut ctrl),
            EINVAL,
            &["env is NULL"],
        );
        fails(
            vfpoll_ctrl_identify(null(), null_mut()),
            EINVAL,
            &["vfpoll_ctrl_identify", "ctrl is NULL"],
        );
        fails(vfpoll_ctrl_identify(b.ctrl, null_mut()), EINVAL, &["out"]);
        fails(
            vfpoll_ctrl_namespaces(b.ctrl, null_mut(), 4),
            EINVAL,
            &["nsids is NULL"],
        );
        let mut info = std::mem::zeroed();
        fails(
            vfpoll_ns_identify(b.ctrl, 9, &mut info),
            ENOENT,
            &["namespace 9 does not exist"],
        );
        let (mut d, mut m) = (0, 0);
        fails(
            vfpoll_ns_transfer(b.ctrl, 1, 5, 1, &mut d, &mut m),
            EINVAL,
            &["pi_mode 5"],
        );
        fails(
            vfpoll_ns_transfer(b.ctrl, 1, 0, 1, null_mut(), &mut m),
            EINVAL,
            &["data_bytes"],
        );
        let mut pool = null_mut();
        fails(
            vfpoll_pool_create(b.ctrl, 3000, 4, &mut pool),
            EINVAL,
            &["power of two"],
        );
        fails(vfpoll_pool_create(b.ctrl, 4096, 0, &mut pool), EINVAL, &["count"]);
        fails(
            vfpoll_pool_create(null_mut(), 4096, 1, &mut pool),
            EINVAL,
            &["ctrl is NULL"],
        );
        let mut buf = null_mut();
        fails(vfpoll_buf_alloc(null_mut(), &mut buf), EINVAL, &["pool is NULL"]);
        fails(vfpoll_buf_free(null_mut()), EINVAL, &["buf is NULL"]);
        fails(
            vfpoll_buf_write(null_mut(), 0, null(), 0),
            EINVAL,
            &["buf is NULL"],
        );
        assert!(vfpoll_buf_data(null_mut()).is_null());
        assert!(last().contains("vfpoll_buf_data: buf is NULL"), "{}", last());
        let mut o = opts();
        o.pi_checks = VFPOLL_PI_CHECK_GUARD;
        let mut qp = null_mut();
        fails(
            vfpoll_qpair_create(b.ctrl, &o, &mut qp),
            EINVAL,
            &["pi_checks applies to VFPOLL_PI_HOST"],
        );
        o = opts();
        o.entries = 70000;
        fails(vfpoll_qpair_create(b.ctrl, &o, &mut qp), EINVAL, &["70000"]);
        o.entries = 1;
        fails(
            vfpoll_qpair_create(b.ctrl, &o, &mut qp),
            EINVAL,
            &["queue entries 1 not in 2..="],
        );
        o = opts();
        o.timeout_ms = 0;
        fails(vfpoll_qpair_create(b.ctrl, &o, &mut qp), EINVAL, &["timeout_ms"]);
        fails(
            vfpoll_qpair_read(null_mut(), 1, 0, null_mut(), 512, 0),
            EINVAL,
            &["qp is NULL"],
        );
        fails(
            vfpoll_qpair_poll(null_mut(), null_mut(), 0),
            EINVAL,
            &["qp is NULL"],
        );
        fails(
            vfpoll_qpair_poll_cb(null_mut(), 1, None, null_mut()),
            EINVAL,
            &["qp is NULL"],
        );
        fails(vfpoll_qpair_commit(null_mut()), EINVAL, &["qp is NULL"]);
        fails(vfpoll_qpair_opts_init(null_mut()), EINVAL, &["opts"]);
        assert!(qp.is_null() && pool.is_null() && buf.is_null());
        // NULL handles close as nothing.
        assert_eq!(vfpoll_env_close(null_mut()), 0);
        assert_eq!(vfpoll_ctrl_close(null_mut()), 0);
        assert_eq!(vfpoll_pool_destroy(null_mut()), 0);
        assert_eq!(vfpoll_qpair_destroy(null_mut()), 0);
        // The model's environment has no container to open a controller by address in; the
        // address is checked before that.
        let env = Box::into_raw(Box::new(vfpoll_env {
            env: Arc::clone(&(*b.ctrl).env),
        }));
        fails(
            vfpoll_ctrl_open(env, c"00:zz.9".as_ptr(), &mut ctrl),
            EINVAL,
            &["00:zz.9", "0000:00:03.0"],
        );
        fails(
            vfpoll_ctrl_open(env, null(), &mut ctrl),
            EINVAL,
            &["pci_addr is NULL"],
        );
        fails(
            vfpoll_ctrl_open(env, c"0000:00:03.0".as_ptr(), &mut ctrl),
            EINVAL,
            &["no VFIO container"],
        );
        assert_eq!(vfpoll_env_close(env), 0);
    }
}

#[test]
fn a_panic_becomes_an_error_code_and_a_message() {
    let rc = crate::error::guard("vfpoll_test", || panic!("boom {}", 42));
    fails(rc, ENOTRECOVERABLE, &["vfpoll_test", "internal error", "boom 42"]);
    // Other threads keep their own message.
    std::thread::spawn(|| assert_eq!(last(), "")).join().unwrap();
}

#[test]
fn identify_data_and_namespace_formats() {
    let b = bed();
    // SAFETY: (all calls) a live controller handle and writable outputs.
    unsafe {
        let mut c = std::mem::zeroed::<vfpoll_ctrl_info>();
        assert_eq!(vfpoll_ctrl_identify(b.ctrl, &mut c), 0);
        let id = (*b.ctrl).ctrl.identify();
        assert_eq!(
            CStr::from_ptr(c.serial.as_ptr()).to_str().unwrap(),
            id.serial.trim_end()
        );
        assert_eq!(
            CStr::from_ptr(c.model.as_ptr()).to_str().unwrap(),
            id.model.trim_end()
        );
        assert!(!id.model.trim().is_empty());
        assert_eq!(
            CStr::from_ptr(c.firmware.as_ptr()).to_str().unwrap(),
            id.firmware.trim_end()
        );
        assert_eq!((c.vid, c.mdts, c.namespace_count), (id.vid, id.mdts, id.nn));
        assert_eq!(c.active_namespaces, 3);
        assert_eq!(c.mdts_bytes, (*b.ctrl).ctrl.mdts_bytes().unwrap_or(0) as u64);
        assert!(c.max_queue_entries >= 2 && c.io_queues >= 1, "{c:?}");

        assert_eq!(vfpoll_ctrl_namespaces(b.ctrl, null_mut(), 0), 3);
        let mut ids = [0u32; 2];
        assert_eq!(vfpoll_ctrl_namespaces(b.ctrl, ids.as_mut_ptr(), 2), 3);
        assert_eq!(ids, [1, 2]);

        let ns = |nsid| {
            let mut n = std::mem::zeroed::<vfpoll_ns_info>();
            assert_eq!(vfpoll_ns_identify(b.ctrl, nsid, &mut n), 0, "{}", last());
            n
        };
        let n1 = ns(1);
        assert_eq!((n1.lba_size, n1.blocks, n1.bytes), (512, 8192, 8192 * 512));
        assert_eq!(
            (n1.metadata, n1.metadata_size, n1.pi_type),
            (VFPOLL_MD_NONE, 0, 0)
        );
        assert!(n1.format_valid && !n1.zoned && n1.command_set as u32 == VFPOLL_CSI_NVM);
        let n2 = ns(2);
        assert_eq!((n2.metadata, n2.metadata_size), (VFPOLL_MD_SEPARATE, 8));
        let n3 = ns(3);
        assert_eq!(
            (n3.lba_size, n3.metadata_size, n3.metadata),
            (4096, 8, VFPOLL_MD_SEPARATE)
        );
        assert_eq!((n3.pi_type, n3.pi_guard_bits, n3.pi_first), (1, 16, false));

        let xfer = |nsid, pi, blocks| {
            let (mut d, mut m) = (0u64, 0u64);
            let rc = vfpoll_ns_transfer(b.ctrl, nsid, pi, blocks, &mut d, &mut m);
            assert_eq!(rc, 0, "{}", last());
            (d, m)
        };
        assert_eq!(xfer(1, VFPOLL_PI_CONTROLLER, 8), (4096, 0));
        assert_eq!(xfer(2, VFPOLL_PI_CONTROLLER, 8), (4096, 64));
        // PI-only metadata under PRACT: none moves.
        assert_eq!(xfer(3, VFPOLL_PI_CONTROLLER, 2), (8192, 0));
        assert_eq!(xfer(3, VFPOLL_PI_HOST, 2), (8192, 16));
    }
}

#[test]
fn write_then_read_back_through_the_c_api() {
    let b = bed();
    let pool = b.pool(4096, 4);
    let qp = b.qpair(16);
    let (wb, rb) = (alloc(pool), alloc(pool));
    // SAFETY: an allocated buffer.
    assert_eq!(unsafe { vfpoll_buf_size(wb) }, 4096);
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    assert_eq!(put(wb, &pattern), 0);
    assert_eq!(write(qp, 1, 100, wb, 4096, 0xabc), 0, "{}", last());
    // In flight: the queue pair's until the completion.
    fails(put(wb, &pattern), EBUSY, &["in flight"]);
    fails(free(wb), EBUSY, &["in flight"]);
    fails(write(qp, 1, 0, wb, 4096, 1), EBUSY, &["in flight"]);
    // SAFETY: a buffer handle of a live pool.
    assert!(unsafe { vfpoll_buf_data(wb) }.is_null());
    fails(destroy_pool(pool), EBUSY, &["in flight"]);
    fails(destroy_qpair(qp), EBUSY, &["1 requests are in flight"]);
    assert_eq!(outstanding(qp), 1);
    let c = wait(qp, 1);
    assert_eq!(
        (c[0].tag, c[0].status, c[0].nvme_status, c[0].buffer_lost),
        (0xabc, 0, 0, false)
    );
    assert_eq!(outstanding(qp), 0);
    assert_eq!(b.model.read_ns(1, 100, 8).unwrap(), pattern);

    // Read back, 1 KiB of it, into a poisoned buffer, and in place through the data pointer.
    assert_eq!(put(rb, &[0xee; 4096]), 0);
    assert_eq!(read(qp, 1, 102, rb, 1024, 7), 0, "{}", last());
    // SAFETY: live queue pair.
    assert_eq!(unsafe { vfpoll_qpair_commit(qp) }, 0);
    let c = wait(qp, 1);
    assert_eq!((c[0].tag, c[0].status), (7, 0));
    let got = get(rb, 4096);
    assert_eq!(got[..1024], pattern[1024..2048]);
    assert!(
        got[1024..].iter().all(|&x| x == 0xee),
        "bytes past the transfer untouched"
    );
    // SAFETY: the buffer is the caller's (its completion came), 4096 bytes long; the bytes are
    // copied out at once.
    let direct = unsafe { std::slice::from_raw_parts(vfpoll_buf_data(rb).cast::<u8>(), 1024) }.to_vec();
    assert_eq!(direct, pattern[1024..2048]);

    fails(
        destroy_pool(pool),
        EBUSY,
        &["2 buffers of the pool are still allocated"],
    );
    assert_eq!(free(wb), 0);
    fails(free(wb), EINVAL, &["not allocated"]);
    fails(put(wb, &pattern), EINVAL, &["not allocated"]);
    assert_eq!(free(rb), 0);

    // The counters: two requests, one command each, both completed without error; every
    // doorbell update was either an MMIO write or a shadow-only one; each non-empty poll
    // delivered at least one completion.
    let mut st = vfpoll_qpair_stats::default();
    // SAFETY: live queue pair, `st` writable.
    assert_eq!(unsafe { vfpoll_qpair_get_stats(qp, &mut st) }, 0, "{}", last());
    assert_eq!(
        (st.requests, st.commands, st.completions, st.errors),
        (2, 2, 2, 0),
        "{st:?}"
    );
    assert!(st.sq_doorbells + st.shadow_only >= 2, "{st:?}");
    assert!(st.polls >= 2 && st.polls - st.empty_polls <= 2, "{st:?}");
    assert_eq!((st.aborts, st.resets), (0, 0));
    // SAFETY: NULL output refused (no write).
    fails(
        unsafe { vfpoll_qpair_get_stats(qp, null_mut()) },
        EINVAL,
        &["out is NULL"],
    );
    // SAFETY: NULL queue pair refused.
    fails(
        unsafe { vfpoll_qpair_get_stats(null_mut(), &mut st) },
        EINVAL,
        &["qp"],
    );
    assert_eq!(destroy_qpair(qp), 0);
    assert_eq!(destroy_pool(pool), 0);
}

#[test]
fn refused_submissions_leave_the_buffer_with_the_caller() {
    let b = bed();
    let pool = b.pool(4096, 2);
    let qp = b.qpair(16);
    let buf = alloc(pool);
    fails(
        read(qp, 1, 8190, buf, 4096, 0),
        ERANGE,
        &["LBA range 8190..8198 is outside namespace 1"],
    );
    fails(read(qp, 1, 0, buf, 1000, 0), EINVAL, &["transfer length 1000"]);
    fails(read(qp, 1, 0, buf, 8192, 0), EINVAL, &["does not fit buffer"]);
    fails(read(qp, 1, 0, buf, 0, 0), EINVAL, &["transfer length 0"]);
    fails(
        read(qp, 4, 0, buf, 512, 0),
        ENOENT,
        &["namespace 4 does not exist"],
    );
    // Separate metadata needs a metadata buffer: the driver's own message.
    fails(
        read(qp, 2, 0, buf, 512, 0),
        EINVAL,
        &["separate buffer", "read_with_metadata"],
    );
    // The same buffer for data and metadata is in flight once only.
    // SAFETY: live queue pair and buffer.
    let rc = unsafe { vfpoll_qpair_read_md(qp, 2, 0, buf, 512, buf, 8, 0) };
    fails(rc, EBUSY, &["in flight"]);
    assert_eq!(outstanding(qp), 0);
    assert_eq!(put(buf, &[1; 16]), 0, "still the caller's: {}", last());
    assert_eq!(free(buf), 0);
    assert_eq!(destroy_qpair(qp), 0);
    assert_eq!(destroy_pool(pool), 0);
}

#[test]
fn metadata_write_zeroes_deallocate_flush_and_a_failed_command() {
    let b = bed();
    let pool = b.pool(4096, 4);
    let qp = b.qpair(16);
    let (data, meta) = (alloc(pool), alloc(pool));
    let pattern: Vec<u8> = (0..1024u32).map(|i| (i ^ 0x5a) as u8).collect();
    let md: Vec<u8> = (0..16u8).collect();
    assert_eq!(put(data, &pattern), 0);
    assert_eq!(put(meta, &md), 0);
    // SAFETY: live queue pair and buffers.
    let rc = unsafe { vfpoll_qpair_write_md(qp, 2, 10, data, 1024, meta, 16, 1) };
    assert_eq!(rc, 0, "{}", last());
    fails(put(meta, &md), EBUSY, &["in flight"]);
    assert_eq!(wait(qp, 1)[0].status, 0);
    assert_eq!(b.model.read_ns(2, 10, 2).unwrap(), pattern);
    assert_eq!(b.model.read_ns_meta(2, 10, 2).unwrap(), md);
    // SAFETY: as above.
    let rc = unsafe { vfpoll_qpair_read_md(qp, 2, 10, data, 1024, meta, 16, 2) };
    assert_eq!(rc, 0, "{}", last());
    assert_eq!(put(meta, &[0; 16]), -EBUSY);
    assert_eq!(wait(qp, 1)[0].tag, 2);
    assert_eq!(get(meta, 16), md);

    b.model.write_ns(1, 0, &[0x11; 4096]).unwrap();
    let ranges = [vfpoll_range { slba: 4, blocks: 2 }];
    // SAFETY: (all calls) live queue pair; `ranges` readable for 1 range.
    unsafe {
        assert_eq!(vfpoll_qpair_write_zeroes(qp, 1, 0, 2, 10), 0, "{}", last());
        assert_eq!(
            vfpoll_qpair_deallocate(qp, 1, ranges.as_ptr(), 1, 11),
            0,
            "{}",
            last()
        );
        assert_eq!(vfpoll_qpair_flush(qp, 1, 12), 0, "{}", last());
        fails(
            vfpoll_qpair_deallocate(qp, 1, ranges.as_ptr(), 0, 13),
            EINVAL,
            &["0 deallocate ranges"],
        );
        fails(
            vfpoll_qpair_write_zeroes(qp, 1, 0, 0, 14),
            EINVAL,
            &["write zeroes of 0 blocks"],
        );
    }
    let mut tags: Vec<u64> = wait(qp, 3).iter().map(|c| c.tag).collect();
    tags.sort();
    assert_eq!(tags, [10, 11, 12]);
    let blocks = b.model.read_ns(1, 0, 8).unwrap();
    assert!(blocks[..1024].iter().all(|&x| x == 0), "zeroed");
    assert!(blocks[1024..2048].iter().all(|&x| x == 0x11), "untouched");
    assert!(
        blocks[2048..3072].iter().all(|&x| x == 0),
        "deallocated (the model zeroes)"
    );

    // A command the controller fails: -EIO with its NVMe status; the buffer comes back.
    b.model
        .inject(Fault::new(FaultKind::Status(Status::DATA_TRANSFER_ERROR)).io());
    assert_eq!(read(qp, 1, 0, data, 512, 99), 0);
    let c = wait(qp, 1)[0];
    assert_eq!((c.tag, c.status, c.buffer_lost), (99, -EIO, false));
    assert_eq!(
        c.nvme_status >> 1 & 0xff,
        0x04,
        "SC Data Transfer Error: {:#x}",
        c.nvme_status
    );
    assert_eq!(free(data), 0);
    assert_eq!(free(meta), 0);
    assert_eq!(destroy_qpair(qp), 0);
    assert_eq!(destroy_pool(pool), 0);
}

#[test]
fn a_full_queue_says_eagain_and_small_polls_lose_nothing() {
    let b = bed();
    let pool = b.pool(512, 8);
    let qp = b.qpair(4);
    let bufs: Vec<_> = (0..4).map(|_| alloc(pool)).collect();
    for (i, &buf) in bufs[..3].iter().enumerate() {
        assert_eq!(read(qp, 1, i as u64, buf, 512, i as u64), 0, "{}", last());
    }
    fails(read(qp, 1, 3, bufs[3], 512, 3), EAGAIN, &["full", "poll"]);
    let mut all = Vec::new();
    let start = Instant::now();
    while all.len() < 3 {
        let mut one = [vfpoll_completion::default(); 1];
        let n = poll(qp, &mut one);
        assert!((0..=1).contains(&n));
        all.extend_from_slice(&one[..n as usize]);
        assert!(start.elapsed() < Duration::from_secs(10));
    }
    let mut tags: Vec<u64> = all.iter().map(|c| c.tag).collect();
    tags.sort();
    assert_eq!(tags, [0, 1, 2]);
    // SAFETY: a live queue pair; max 0 with a NULL array is allowed.
    assert_eq!(unsafe { vfpoll_qpair_poll(qp, null_mut(), 0) }, 0);
    let mut b2 = null_mut();
    // SAFETY: live pool, writable out.
    assert_eq!(unsafe { vfpoll_buf_alloc(pool, &mut b2) }, 0);
    for _ in 0..3 {
        alloc(pool);
    }
    // SAFETY: as above.
    fails(
        unsafe { vfpoll_buf_alloc(pool, &mut b2) },
        ENOBUFS,
        &["all 8 buffers"],
    );
    assert_eq!(destroy_qpair(qp), 0);
}

/// A read loop driven from the completion callback: each completion resubmits its buffer
/// until `left` reads have been issued.
struct Loop {
    qp: *mut vfpoll_qpair,
    left: u32,
    done: u32,
    errors: u32,
    destroy_rc: i32,
}

unsafe extern "C" fn resubmit(ctx: *mut c_void, c: *const vfpoll_completion) {
    // SAFETY: `ctx` is the `Loop` given to `vfpoll_qpair_poll_cb`, alive and not otherwise
    // borrowed during the poll; `c` is valid for this call.
    let (l, c) = unsafe { (&mut *ctx.cast::<Loop>(), &*c) };
    l.done += 1;
    if c.status != 0 {
        l.errors += 1;
    }
    if l.left == 0 && outstanding(l.qp) == 0 {
        // Nothing in flight: only the running poll stands in the way.
        // SAFETY: a live queue pair, which refuses to be destroyed under its own poll.
        l.destroy_rc = unsafe { vfpoll_qpair_destroy(l.qp) };
        assert!(last().contains("completion callback"), "{}", last());
    }
    if l.left > 0 {
        l.left -= 1;
        let buf = c.tag as *mut vfpoll_buf;
        if read(l.qp, 1, l.left as u64 % 64, buf, 512, c.tag) != 0 {
            l.errors += 1;
        }
    }
}

#[test]
fn the_callback_may_resubmit_to_its_queue_pair() {
    let b = bed();
    let pool = b.pool(512, 4);
    let qp = b.qpair(8);
    let bufs: Vec<_> = (0..4).map(|_| alloc(pool)).collect();
    for &buf in &bufs {
        assert_eq!(read(qp, 1, 0, buf, 512, buf as u64), 0, "{}", last());
    }
    let mut l = Loop {
        qp,
        left: 100,
        done: 0,
        errors: 0,
        destroy_rc: 0,
    };
    let start = Instant::now();
    while l.done < 104 {
        // SAFETY: live queue pair; `resubmit` is sound with a `Loop` as its context.
        let n = unsafe { vfpoll_qpair_poll_cb(qp, 16, Some(resubmit), (&raw mut l).cast()) };
        assert!(n >= 0, "{}", last());
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{} completions",
            l.done
        );
    }
    assert_eq!((l.done, l.left, l.errors), (104, 0, 0));
    assert_eq!(l.destroy_rc, -EBUSY, "destroyed from its own callback");
    assert_eq!(outstanding(qp), 0);
    for &buf in &bufs {
        assert_eq!(free(buf), 0);
    }
    assert_eq!(destroy_qpair(qp), 0);
    assert_eq!(destroy_pool(pool), 0);
}

#[test]
fn iommu_modes_map_to_backends() {
    use crate::env::iommu_mode;
    use vfpoll_pci::vfio::Backend;
    assert_eq!(iommu_mode(VFPOLL_IOMMU_TYPE1).unwrap(), Backend::Type1);
    assert_eq!(iommu_mode(VFPOLL_IOMMU_NONE).unwrap(), Backend::NoIommu);
    assert_eq!(iommu_mode(VFPOLL_IOMMU_IOMMUFD).unwrap(), Backend::Iommufd);
    assert_eq!(iommu_mode(VFPOLL_IOMMU_AUTO).unwrap(), Backend::Auto);
    assert!(iommu_mode(4).is_err());
}
