//! Device mappings that may vanish: revoking a BAR mapping in place, and a SIGBUS handler scoped
//! to vfpoll's own BAR mappings.
//!
//! A BAR mapping of a VFIO device can stop being backed by the device: vfio-pci zaps it while the
//! device's memory decode is off or it is being reset (an access then raises SIGBUS), and a
//! device that is hot-removed must have every mapping of its file gone before the kernel can
//! complete the removal (the mappings hold the device file open). Threads of the process may be
//! touching such a mapping at any moment (doorbell writes, CSTS reads), so it is never simply
//! unmapped under them: it is *replaced*, atomically, by anonymous memory whose first
//! [`FILL_BYTES`] read all-ones, what a vanished PCIe device answers. A register read then says
//! "gone" (NVMe CSTS = `0xffffffff`), a doorbell write lands in memory nobody reads, and nothing
//! crashes. The replacement is built off to the side and moved over the mapping with one
//! `mremap(MREMAP_FIXED)`, so no access sees a half-filled page.
//!
//! [`Guard`] registers a mapping with the process-wide SIGBUS handler (installed on first use).
//! On a SIGBUS inside a registered mapping the handler replaces that mapping the same way and
//! counts the fault; the faulting access then completes (reading all-ones). A SIGBUS anywhere
//! else goes to the handler that was installed before (or, if that was the default action, the
//! default action is restored and the access faults again, ending the process as it would have
//! without vfpoll). This is what mature userspace drivers do (DPDK's `rte_bus_sigbus_handler`
//! remaps the faulting BAR the same way).
//!
//! The registry is a fixed array of slots with atomics only, so the handler takes no lock and
//! allocates nothing. A handler announces itself (`INSIDE`) before it reads any slot, and
//! [`Guard`]'s drop clears its slot and then waits until no handler is inside, so a slot is
//! never reused (nor its range unmapped) under a running handler.
//!
//! Unsafe code: `mmap`/`mremap`/`sigaction` and the handler itself; each block says why it is
//! sound.

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Bytes at the start of a replaced mapping that read all-ones (the rest reads zeros): every
/// register and doorbell of an NVMe BAR0 with 64 queue pairs, without committing memory for a
/// large BAR (a CMB, a GPU BAR).
pub const FILL_BYTES: usize = 64 << 10;

/// Mappings guarded at once; more are mapped unguarded (with a warning).
const SLOTS: usize = 256;

struct Slot {
    claimed: AtomicBool,
    /// Start address, 0 while the slot holds no mapping.
    start: AtomicUsize,
    /// Length in bytes (page-rounded), written before `start` is published.
    len: AtomicUsize,
    /// SIGBUS faults the handler repaired in this mapping.
    faults: AtomicU32,
}

#[allow(clippy::declare_interior_mutable_const)] // only used to initialise the array below
const FREE: Slot = Slot {
    claimed: AtomicBool::new(false),
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    faults: AtomicU32::new(0),
};

static REGISTRY: [Slot; SLOTS] = [FREE; SLOTS];
/// Handlers running now (they may nest: a handler interrupted by another signal).
static INSIDE: AtomicU32 = AtomicU32::new(0);
/// The SIGBUS action installed before ours.
static PREVIOUS: OnceLock<Previous> = OnceLock::new();

/// The action that was installed for SIGBUS before vfpoll's handler.
#[derive(Clone, Copy)]
struct Previous(libc::sigaction);

// SAFETY: a plain C struct of integers, a signal mask and function pointers; it is written
// once (before the handler that reads it is installed) and only read afterwards.
unsafe impl Sync for Previous {}
// SAFETY: as above; it holds no reference to thread-local state.
unsafe impl Send for Previous {}

fn page_size() -> usize {
    // SAFETY: sysconf reads a constant of the system; no pointers.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p <= 0 {
        4096
    } else {
        p as usize
    }
}

/// Replaces the mapping at `start` (`len` bytes, page-aligned) with anonymous memory whose first
/// [`FILL_BYTES`] are `0xff`, atomically: the new pages are made and filled elsewhere, then moved
/// over the old mapping with one `mremap`, which unmaps whatever was there (the device mapping,
/// dropping its reference on the device file). Async-signal-safe: system calls and a memory
/// fill only.
///
/// # Safety
/// `[start, start + len)` must be one mapping that this process made and still owns (nothing
/// else may be mapped there), accessed only through raw pointers: after the call it holds
/// other memory.
pub(crate) unsafe fn replace_with_ones(start: NonNull<u8>, len: usize) -> io::Result<()> {
    let len = len.max(1).next_multiple_of(page_size());
    // SAFETY: a new private anonymous mapping at an address the kernel chooses; aliases nothing.
    let fresh = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if fresh == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fresh` is the `len`-byte mapping made just above, owned here; FILL_BYTES is
    // clamped to it.
    unsafe { std::ptr::write_bytes(fresh.cast::<u8>(), 0xff, len.min(FILL_BYTES)) };
    // SAFETY: moves the private pages made above over `start`, which the caller owns; the old
    // mapping there is unmapped by the kernel as part of the same call.
    let moved = unsafe {
        libc::mremap(
            fresh,
            len,
            len,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            start.as_ptr().cast::<libc::c_void>(),
        )
    };
    if moved == libc::MAP_FAILED {
        let e = io::Error::last_os_error();
        // SAFETY: `fresh` is still the mapping made above (the move failed), unused elsewhere.
        unsafe { libc::munmap(fresh, len) };
        return Err(e);
    }
    Ok(())
}

/// A mapping registered with the SIGBUS handler. Dropping it unregisters the mapping; do that
/// before the mapping is unmapped.
#[derive(Debug)]
pub struct Guard {
    slot: usize,
}

impl Guard {
    /// Registers `[start, start + len)` with the handler, installing the handler on first use.
    /// `None` when every slot is taken (the mapping then works unguarded: a SIGBUS in it goes to
    /// the previous handler) or the handler cannot be installed.
    ///
    /// # Safety
    /// The range must be one mapping of this process that stays mapped until the guard is
    /// dropped, accessed only through raw pointers: on a SIGBUS inside it the handler replaces
    /// it with other memory (see the module docs).
    pub unsafe fn new(start: NonNull<u8>, len: usize) -> Option<Guard> {
        if let Err(e) = install() {
            log::warn!("cannot install vfpoll's SIGBUS handler ({e}): device mappings are unguarded");
            return None;
        }
        let len = len.max(1).next_multiple_of(page_size());
        for (i, s) in REGISTRY.iter().enumerate() {
            if s.claimed
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                s.faults.store(0, Ordering::SeqCst);
                s.len.store(len, Ordering::SeqCst);
                s.start.store(start.as_ptr() as usize, Ordering::SeqCst);
                return Some(Guard { slot: i });
            }
        }
        log::warn!("all {SLOTS} SIGBUS guard slots are taken: a mapping of {len:#x} bytes is unguarded");
        None
    }

    /// SIGBUS faults the handler repaired in this mapping (it was replaced at the first).
    pub fn faults(&self) -> u32 {
        REGISTRY[self.slot].faults.load(Ordering::SeqCst)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let s = &REGISTRY[self.slot];
        s.start.store(0, Ordering::SeqCst);
        // A handler that loaded `start` before the store above raised INSIDE first: wait for it
        // (handlers are short), so the range is not unmapped or the slot reused under it.
        while INSIDE.load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
        s.claimed.store(false, Ordering::Release);
    }
}

/// Installs the handler once per process, remembering the action it replaces.
fn install() -> io::Result<()> {
    static INSTALLED: OnceLock<Result<(), i32>> = OnceLock::new();
    let r = INSTALLED.get_or_init(|| {
        // SAFETY: an all-zero sigaction is a valid value to be overwritten by the query below.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: queries the current action into `old`, a valid, exclusively borrowed struct.
        if unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) } != 0 {
            return Err(io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL));
        }
        // Published before the handler that reads it can run.
        let _ = PREVIOUS.set(Previous(old));
        // SAFETY: as above, a zeroed sigaction filled in below.
        let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
        act.sa_sigaction = on_sigbus as *const () as usize;
        act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER;
        // SAFETY: `act.sa_mask` is a valid sigset owned here.
        unsafe { libc::sigemptyset(&mut act.sa_mask) };
        // SAFETY: installs `on_sigbus`, an `extern "C"` function with the SA_SIGINFO signature
        // that only does async-signal-safe work.
        if unsafe { libc::sigaction(libc::SIGBUS, &act, std::ptr::null_mut()) } != 0 {
            return Err(io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL));
        }
        Ok(())
    });
    r.map_err(io::Error::from_raw_os_error)
}

/// The SIGBUS handler: repairs faults inside registered mappings, chains for the others.
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    INSIDE.fetch_add(1, Ordering::SeqCst);
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let info = unsafe { &*info };
    // SAFETY: for SIGBUS the kernel fills `si_addr`: the faulting address.
    let addr = unsafe { info.si_addr() } as usize;
    let mut handled = false;
    for s in REGISTRY.iter() {
        let start = s.start.load(Ordering::SeqCst);
        if start == 0 {
            continue;
        }
        let len = s.len.load(Ordering::SeqCst);
        if addr >= start && addr - start < len {
            let start = NonNull::new(start as *mut u8).expect("not 0");
            // SAFETY: `start`/`len` is a registered mapping, kept mapped until its guard is
            // dropped, which waits for this handler to leave (INSIDE raised above).
            let r = unsafe { replace_with_ones(start, len) };
            if r.is_ok() {
                s.faults.fetch_add(1, Ordering::SeqCst);
                handled = true;
            }
            break;
        }
    }
    INSIDE.fetch_sub(1, Ordering::SeqCst);
    if !handled {
        chain(sig, std::ptr::from_ref(info).cast_mut(), ctx);
    }
}

/// Passes a SIGBUS that is not vfpoll's to the handler installed before, or restores the default
/// action, so that the returning access faults again and ends the process as it would have.
fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let Some(Previous(prev)) = PREVIOUS.get().copied() else {
        return restore_default(sig);
    };
    let h = prev.sa_sigaction;
    if h == libc::SIG_DFL || h == libc::SIG_IGN {
        // An ignored synchronous SIGBUS cannot be survived either: the kernel would kill.
        return restore_default(sig);
    }
    if prev.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous action was installed with SA_SIGINFO, so `h` is a handler of this
        // signature; it gets the kernel's own arguments.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(h) };
        f(sig, info, ctx);
    } else {
        // SAFETY: without SA_SIGINFO the previous handler takes the signal number only.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(h) };
        f(sig);
    }
}

fn restore_default(sig: libc::c_int) {
    // SAFETY: a zeroed sigaction is SIG_DFL with an empty mask and no flags.
    let act: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: sets the default action; `act` is valid for the call. Async-signal-safe.
    unsafe { libc::sigaction(sig, &act, std::ptr::null_mut()) };
}

#[cfg(test)]
mod tests;
