//! Clean shutdown when the program is killed by a signal (NVMe Base 2.0 §3.6.1).
//!
//! A process that exits on SIGINT or SIGTERM runs no destructors, so a controller would be left
//! enabled, its queues pointing at memory the kernel is about to free. [`shutdown_on_signals`]
//! installs handlers that, for every live controller, set CC.SHN to "normal shutdown" and wait
//! (bounded by CAP.TO) for CSTS.SHST to say complete, then let the signal take its default course
//! (the controller processes no more commands; the next user resets it). The handler only does volatile MMIO accesses and async-signal-safe calls.
//!
//! This is one of the crate's two `unsafe` modules (with `qmem`): signal handlers and raw BAR
//! pointers that outlive Rust's view of them.

use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use crate::regs::{off, Cc, Csts, Shutdown, ShutdownStatus};

/// Most controllers tracked at once (further ones are shut down only on drop).
const SLOTS: usize = 64;

/// BAR0 base of each live controller (null = free slot) and its CAP.TO in ms.
static BARS: [AtomicPtr<u8>; SLOTS] = [const { AtomicPtr::new(std::ptr::null_mut()) }; SLOTS];
static TIMEOUTS: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];

/// A controller's place in the registry; freed on drop.
#[derive(Debug)]
pub(crate) struct Registration(Option<usize>);

impl Registration {
    /// Records BAR0 at `bar` (valid while the registration lives) for the signal handler.
    pub(crate) fn new(bar: *mut u8, timeout_ms: u64) -> Self {
        for (i, slot) in BARS.iter().enumerate() {
            TIMEOUTS[i].store(timeout_ms, Ordering::Relaxed);
            if slot
                .compare_exchange(std::ptr::null_mut(), bar, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                return Registration(Some(i));
            }
        }
        log::warn!("more than {SLOTS} controllers: this one is shut down on drop only, not on a signal");
        Registration(None)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(i) = self.0 {
            BARS[i].store(std::ptr::null_mut(), Ordering::Release);
        }
    }
}

fn read32(bar: *mut u8, o: usize) -> u32 {
    let p = bar.wrapping_add(o).cast::<u32>();
    // SAFETY: `bar` is a registered BAR0 mapping (at least 4 KiB), live while registered;
    // `o` is a register offset below 0x1000, 4-byte aligned.
    unsafe { p.read_volatile() }
}

fn write32(bar: *mut u8, o: usize, v: u32) {
    let p = bar.wrapping_add(o).cast::<u32>();
    // SAFETY: as in `read32`.
    unsafe { p.write_volatile(v) }
}

fn now_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime is async-signal-safe and writes only `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// Shuts every live controller down now, as the signal handlers do: CC.SHN for all first, then
/// waits (bounded by each one's CAP.TO) for CSTS.SHST to say complete. The controllers take no
/// more commands afterwards. For programs that handle signals themselves and want the same
/// effect from their own handler (it is async-signal-safe), and for tests.
pub fn shutdown_all() {
    for slot in &BARS {
        let bar = slot.load(Ordering::Acquire);
        if bar.is_null() {
            continue;
        }
        let cc = Cc(read32(bar, off::CC));
        write32(bar, off::CC, cc.with_shutdown(Shutdown::Normal).0);
    }
    for (i, slot) in BARS.iter().enumerate() {
        let bar = slot.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if bar.is_null() {
            continue;
        }
        let deadline = now_ms() + TIMEOUTS[i].load(Ordering::Relaxed).clamp(500, 10_000);
        while now_ms() < deadline {
            let s = Csts(read32(bar, off::CSTS));
            if s.device_gone() || s.shutdown_status() == ShutdownStatus::Complete {
                break;
            }
            std::hint::spin_loop();
        }
    }
}

/// What runs after the shutdown, before the signal's default action (0 = nothing).
static AFTER: AtomicPtr<()> = AtomicPtr::new(std::ptr::null_mut());

extern "C" fn on_signal(sig: libc::c_int) {
    shutdown_all();
    let after = AFTER.load(Ordering::Acquire);
    if !after.is_null() {
        // SAFETY: only `shutdown_on_signals_then` stores here, and only an
        // `extern "C" fn(c_int)`; the caller promised it is async-signal-safe.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(after) };
        f(sig);
    }
    // SAFETY: restoring the default action is async-signal-safe.
    unsafe { libc::signal(sig, libc::SIG_DFL) };
    // SAFETY: async-signal-safe; the process then ends as the signal intends (with the right
    // exit status for the parent).
    unsafe { libc::raise(sig) };
}

/// Installs the SIGINT, SIGTERM, SIGHUP and SIGQUIT handlers that shut down every live
/// controller before the process dies. Call it once, early, from the program (a library never
/// installs handlers by itself). Handlers the program already had for these signals are
/// replaced.
pub fn shutdown_on_signals() -> std::io::Result<()> {
    install()
}

/// Like [`shutdown_on_signals`], and runs `after(signal)` once the controllers are shut down,
/// before the signal's default action ends the process.
///
/// # Safety
/// `after` runs in a signal handler: it must only do async-signal-safe work (no allocation, no
/// locks, no `println!`; `write(2)` is fine).
pub unsafe fn shutdown_on_signals_then(after: extern "C" fn(libc::c_int)) -> std::io::Result<()> {
    AFTER.store(after as *mut (), Ordering::Release);
    install()
}

fn install() -> std::io::Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
        // SAFETY: `sigaction` is plain data for which all-zero bytes are a valid value.
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = on_signal as *const () as usize;
        // SAFETY: initialises the mask inside `sa`, which we own.
        unsafe { libc::sigemptyset(&mut sa.sa_mask) };
        // SAFETY: `sa` is fully initialised; the handler is an `extern "C" fn(c_int)` that only
        // does async-signal-safe work.
        let r = unsafe { libc::sigaction(sig, &sa, std::ptr::null_mut()) };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
