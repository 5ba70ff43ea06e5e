//! Controller shutdown (NVMe Base 2.0 §3.6): how long to wait for it, and doing it from a signal
//! handler when the program is killed.
//!
//! A normal shutdown (CC.SHN = 01b) waits up to RTD3E (Identify Controller, the time the
//! controller says it needs to enter runtime D3; CAP.TO when it reports none), then falls back
//! to an abrupt shutdown (CC.SHN = 10b) with a short wait ([`ShutdownLimits`]). Which of the
//! two completed is reported: in the log when a controller is dropped, in a [`ShutdownReport`]
//! from [`shutdown_all`].
//!
//! A process that exits on SIGINT or SIGTERM runs no destructors, so a controller would be left
//! enabled, its queues pointing at memory the kernel is about to free. [`shutdown_on_signals`]
//! installs handlers that shut down every live controller that way, then let the signal take its
//! default course (the controller processes no more commands; the next user resets it). The
//! handler only does volatile MMIO accesses, atomics and async-signal-safe calls.
//!
//! The registry is one [`Slot`] per controller. A handler may run on any thread at any time,
//! also while another thread drops the controller and unmaps its BAR, so a handler announces
//! itself in the slot (`busy`) *before* it loads the BAR pointer, and [`Registration`]'s drop
//! clears the pointer and then waits until no handler is inside the slot before the BAR can be
//! unmapped (see [`Slot::enter`] for why that suffices). Each slot carries its own controller's
//! waits, written before its pointer is published.
//!
//! This is one of the crate's `unsafe` modules (see the crate docs): signal handlers and raw
//! BAR pointers that outlive Rust's view of them. A [`Registration`] holds a clone of the BAR0
//! mapping it points into, so it is made safely.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use vfpoll_pci::mmio::Mmio;

use crate::regs::{off, Cap, Cc, Csts, Shutdown, ShutdownStatus};

/// Most controllers tracked at once (further ones are shut down only on drop).
const SLOTS: usize = 64;

/// The shortest normal-shutdown wait, whatever RTD3E says (RTD3E is a typical latency, and a
/// controller that flushes a write cache may need longer than it advertises).
const MIN_NORMAL: Duration = Duration::from_millis(500);
/// The longest normal-shutdown wait (RTD3E is 32 bits of microseconds: over an hour).
const MAX_NORMAL: Duration = Duration::from_secs(60);
/// The normal-shutdown wait when RTD3E is 0 and CAP.TO says nothing useful.
const DEFAULT_NORMAL: Duration = Duration::from_secs(10);
/// The abrupt-shutdown wait: an abrupt shutdown saves nothing, so it is quick.
const MIN_ABRUPT: Duration = Duration::from_millis(500);
const MAX_ABRUPT: Duration = Duration::from_secs(2);

/// How long each shutdown step of one controller may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShutdownLimits {
    /// The wait for a normal shutdown (CC.SHN = 01b) to complete: RTD3E where the controller
    /// reports it (at least 500 ms, at most 60 s), otherwise CAP.TO (500 ms to 10 s).
    pub normal: Duration,
    /// The wait for the abrupt shutdown (CC.SHN = 10b) that follows a normal one that did not
    /// complete: CAP.TO, 500 ms to 2 s.
    pub abrupt: Duration,
}

impl ShutdownLimits {
    /// The limits for a controller with capabilities `cap` and Identify Controller RTD3E
    /// `rtd3e_us` (microseconds, 0 = not reported; NVMe Base 2.0 Figure 275, bytes 91:88).
    pub fn new(cap: Cap, rtd3e_us: u32) -> Self {
        let to = match cap.timeout_ms() {
            0 => DEFAULT_NORMAL,
            ms => Duration::from_millis(ms),
        };
        let normal = if rtd3e_us == 0 {
            to.clamp(MIN_NORMAL, DEFAULT_NORMAL)
        } else {
            Duration::from_micros(rtd3e_us.into()).clamp(MIN_NORMAL, MAX_NORMAL)
        };
        ShutdownLimits {
            normal,
            abrupt: to.clamp(MIN_ABRUPT, MAX_ABRUPT),
        }
    }
}

/// Which shutdown completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ShutdownKind {
    /// The normal shutdown (CC.SHN = 01b) completed within its limit.
    Normal,
    /// The normal shutdown did not complete within its limit; the abrupt one (CC.SHN = 10b)
    /// did.
    Abrupt,
}

/// What [`shutdown_all`] did: how many controllers ended in each way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Normal shutdown completed.
    pub normal: u32,
    /// Normal shutdown timed out, abrupt shutdown completed.
    pub abrupt: u32,
    /// Neither completed within its limit.
    pub timed_out: u32,
    /// The controller reads all-ones (removed, or its link is down).
    pub gone: u32,
}

/// One controller's place in the registry.
#[derive(Debug)]
struct Slot {
    /// Owned by a live [`Registration`].
    claimed: AtomicBool,
    /// BAR0, or null while the slot is free or its controller is going away.
    bar: AtomicPtr<u8>,
    /// Handlers inside the slot now (a count: a handler may interrupt another).
    busy: AtomicU32,
    /// Normal-shutdown wait in ms (high half) and abrupt-shutdown wait in ms (low half): one
    /// word, so a handler never sees one controller's normal wait with another's abrupt one.
    limits_ms: AtomicU64,
}

impl Slot {
    const fn free() -> Slot {
        Slot {
            claimed: AtomicBool::new(false),
            bar: AtomicPtr::new(std::ptr::null_mut()),
            busy: AtomicU32::new(0),
            limits_ms: AtomicU64::new(0),
        }
    }

    /// Enters the slot: returns its BAR and limits (normal, abrupt, in ms), or `None` when it
    /// holds no controller. Every `Some` must be followed by [`Slot::leave`].
    ///
    /// Why the BAR stays mapped until `leave`: `busy` is raised before `bar` is loaded, and
    /// [`Slot::retire`] clears `bar` before it loads `busy`, all four `SeqCst`. In their single
    /// total order either this load of `bar` comes after the clear (it reads null and nothing is
    /// touched), or the raise comes before retire's load of `busy`, which then waits until
    /// `leave`. The BAR is unmapped only after `retire` returns.
    fn enter(&self) -> Option<(*mut u8, u64, u64)> {
        self.busy.fetch_add(1, Ordering::SeqCst);
        let bar = self.bar.load(Ordering::SeqCst);
        if bar.is_null() {
            self.leave();
            return None;
        }
        // Written before `bar` was published (`Registration::new`), so it is this controller's.
        let l = self.limits_ms.load(Ordering::Relaxed);
        Some((bar, l >> 32, l & 0xffff_ffff))
    }

    fn leave(&self) {
        self.busy.fetch_sub(1, Ordering::SeqCst);
    }

    /// Takes the controller out of the slot and waits until no handler is using its BAR.
    fn retire(&self) {
        self.bar.store(std::ptr::null_mut(), Ordering::SeqCst);
        // A handler inside holds it for at most its shutdown limits (seconds), and the process
        // ends right after it.
        while self.busy.load(Ordering::SeqCst) != 0 {
            std::thread::sleep(Duration::from_micros(100));
        }
        self.claimed.store(false, Ordering::Release);
    }
}

/// The registry the signal handlers shut down.
static REGISTRY: [Slot; SLOTS] = [const { Slot::free() }; SLOTS];

/// A controller's place in the registry; freed on drop.
#[derive(Debug)]
pub(crate) struct Registration {
    slot: Option<&'static Slot>,
    /// The BAR0 mapping the slot points into, kept mapped until the slot is retired (fields
    /// drop after `Drop::drop` has run).
    _bar: Option<Mmio>,
}

impl Registration {
    /// Records BAR0 `bar` and the controller's shutdown limits for the signal handler. The
    /// registration holds the mapping until it is dropped; a window too small to hold CC and
    /// CSTS is not registered.
    pub(crate) fn new(bar: &Mmio, limits: ShutdownLimits) -> Self {
        if bar.len() < off::CSTS + 4 {
            log::warn!(
                "BAR0 window of {:#x} bytes has no CC/CSTS: not shut down on a signal",
                bar.len()
            );
            return Registration {
                slot: None,
                _bar: None,
            };
        }
        let mut r = Self::in_table(&REGISTRY, bar.as_ptr(), limits);
        r._bar = Some(bar.clone());
        r
    }

    /// Claims a slot of `table` for the BAR0 mapping at `bar` (which the caller keeps mapped,
    /// at least up to CSTS, until the result is dropped).
    fn in_table(table: &'static [Slot], bar: *mut u8, limits: ShutdownLimits) -> Self {
        let ms = |d: Duration| d.as_millis().min(u32::MAX.into()) as u64;
        for slot in table {
            if slot
                .claimed
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                // Only this slot's owner writes its limits, before publishing its BAR (no other
                // live controller's slot is touched).
                slot.limits_ms
                    .store(ms(limits.normal) << 32 | ms(limits.abrupt), Ordering::Relaxed);
                slot.bar.store(bar, Ordering::SeqCst);
                return Registration {
                    slot: Some(slot),
                    _bar: None,
                };
            }
        }
        log::warn!("more than {SLOTS} controllers: this one is shut down on drop only, not on a signal");
        Registration {
            slot: None,
            _bar: None,
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            slot.retire();
        }
    }
}

fn read32(bar: *mut u8, o: usize) -> u32 {
    let p = bar.wrapping_add(o).cast::<u32>();
    // SAFETY: `bar` came from `Slot::enter` and the slot has not been left, so it is a BAR0
    // mapping of at least 4 KiB that stays mapped (`Slot::enter` says why); `o` is a register
    // offset below 0x1000, 4-byte aligned.
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

/// A controller the handler is shutting down.
#[derive(Clone, Copy)]
struct Held {
    bar: *mut u8,
    /// When the current step (normal, then abrupt) gives up, in `now_ms` time.
    deadline: u64,
    abrupt_ms: u64,
    abrupt: bool,
}

/// Shuts every live controller down now, as the signal handlers do: a normal shutdown (CC.SHN =
/// 01b) of all of them at once, then, for each that has not completed within its limit (RTD3E,
/// see [`ShutdownLimits`]), an abrupt one (CC.SHN = 10b) with a short wait. The controllers
/// take no more commands afterwards. For programs that handle signals themselves and want the
/// same effect from their own handler (it is async-signal-safe: no allocation, no locks), and
/// for tests. Returns how each controller ended.
///
/// A controller dropped meanwhile on another thread waits for this to finish with it before
/// its BAR is unmapped.
pub fn shutdown_all() -> ShutdownReport {
    shutdown_table(&REGISTRY)
}

fn shutdown_table(table: &[Slot]) -> ShutdownReport {
    let mut report = ShutdownReport::default();
    let mut held: [Option<Held>; SLOTS] = [None; SLOTS];
    let start = now_ms();
    for (slot, h) in table.iter().zip(held.iter_mut()) {
        let Some((bar, normal_ms, abrupt_ms)) = slot.enter() else {
            continue;
        };
        let cc = Cc(read32(bar, off::CC));
        write32(bar, off::CC, cc.with_shutdown(Shutdown::Normal).0);
        *h = Some(Held {
            bar,
            deadline: start + normal_ms,
            abrupt_ms,
            abrupt: false,
        });
    }
    loop {
        let mut pending = false;
        let now = now_ms();
        for (slot, h) in table.iter().zip(held.iter_mut()) {
            let Some(c) = h else { continue };
            let s = Csts(read32(c.bar, off::CSTS));
            let done = if s.device_gone() {
                report.gone += 1;
                true
            } else if s.shutdown_status() == ShutdownStatus::Complete {
                if c.abrupt {
                    report.abrupt += 1;
                } else {
                    report.normal += 1;
                }
                true
            } else if now >= c.deadline && c.abrupt {
                report.timed_out += 1;
                true
            } else if now >= c.deadline {
                // §3.6.2: an abrupt shutdown may follow a normal one that is still in progress.
                let cc = Cc(read32(c.bar, off::CC));
                write32(c.bar, off::CC, cc.with_shutdown(Shutdown::Abrupt).0);
                c.abrupt = true;
                c.deadline = now + c.abrupt_ms;
                false
            } else {
                false
            };
            if done {
                // Done with its BAR: a drop waiting for it may go on.
                *h = None;
                slot.leave();
            } else {
                pending = true;
            }
        }
        if !pending {
            break;
        }
        std::hint::spin_loop();
    }
    report
}

/// What runs after the shutdown, before the signal's default action (0 = nothing).
static AFTER: AtomicPtr<()> = AtomicPtr::new(std::ptr::null_mut());

extern "C" fn on_signal(sig: libc::c_int) {
    let _ = shutdown_all();
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    use std::time::Instant;

    use super::*;

    /// Register space standing in for a BAR (4 KiB, CC and CSTS at their offsets).
    struct FakeBar(Box<[u32; 1024]>);

    impl FakeBar {
        fn new(csts: u32) -> Self {
            let mut b = FakeBar(Box::new([0; 1024]));
            b.0[off::CSTS / 4] = csts;
            b.0[off::CC / 4] = 1; // CC.EN
            b
        }
        fn ptr(&mut self) -> *mut u8 {
            self.0.as_mut_ptr().cast()
        }
        fn cc(&self) -> Cc {
            Cc(self.0[off::CC / 4])
        }
    }

    fn limits(normal_ms: u64, abrupt_ms: u64) -> ShutdownLimits {
        ShutdownLimits {
            normal: Duration::from_millis(normal_ms),
            abrupt: Duration::from_millis(abrupt_ms),
        }
    }

    const SHST_OCCURRING: u32 = 0b01 << 2;
    const SHST_COMPLETE: u32 = 0b10 << 2;

    #[test]
    fn a_drop_waits_for_a_handler_inside_the_slot() {
        static TABLE: [Slot; 2] = [const { Slot::free() }; 2];
        let mut bar = FakeBar::new(0);
        let reg = Registration::in_table(&TABLE, bar.ptr(), limits(500, 500));
        // A handler has entered and holds the BAR pointer.
        let (p, _, _) = TABLE[0].enter().expect("registered");
        assert_eq!(p, bar.ptr());
        let dropped = Arc::new(AtomicBool::new(false));
        let d = dropped.clone();
        let t = std::thread::spawn(move || {
            drop(reg);
            d.store(true, Ordering::SeqCst);
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !dropped.load(Ordering::SeqCst),
            "the drop returned while a handler used the BAR"
        );
        // A handler arriving now finds nothing to touch.
        assert!(TABLE[0].enter().is_none());
        assert!(
            TABLE[0].claimed.load(Ordering::SeqCst),
            "the slot is not reusable while a handler is inside"
        );
        TABLE[0].leave();
        t.join().unwrap();
        assert!(dropped.load(Ordering::SeqCst));
        assert!(!TABLE[0].claimed.load(Ordering::SeqCst));
        assert_eq!(TABLE[0].busy.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn each_slot_keeps_its_own_limits() {
        static TABLE: [Slot; 3] = [const { Slot::free() }; 3];
        let (mut a, mut b, mut c) = (FakeBar::new(0), FakeBar::new(0), FakeBar::new(0));
        let ra = Registration::in_table(&TABLE, a.ptr(), limits(700, 600));
        let rb = Registration::in_table(&TABLE, b.ptr(), limits(9000, 1500));
        let look = |i: usize| {
            let (p, n, ab) = TABLE[i].enter().expect("registered");
            TABLE[i].leave();
            (p, n, ab)
        };
        assert_eq!(look(0), (a.ptr(), 700, 600));
        assert_eq!(look(1), (b.ptr(), 9000, 1500));
        // A controller going away and another taking its slot leave the live one's alone.
        drop(ra);
        let rc = Registration::in_table(&TABLE, c.ptr(), limits(800, 500));
        assert_eq!(look(0), (c.ptr(), 800, 500));
        assert_eq!(look(1), (b.ptr(), 9000, 1500));
        assert!(TABLE[2].enter().is_none());
        drop((rb, rc));
    }

    #[test]
    fn shutdown_reports_how_each_controller_ended() {
        static TABLE: [Slot; 4] = [const { Slot::free() }; 4];
        let mut normal = FakeBar::new(SHST_COMPLETE);
        let mut stuck = FakeBar::new(SHST_OCCURRING);
        let mut gone = FakeBar::new(u32::MAX);
        let regs = [
            Registration::in_table(&TABLE, normal.ptr(), limits(500, 500)),
            Registration::in_table(&TABLE, stuck.ptr(), limits(600, 500)),
            Registration::in_table(&TABLE, gone.ptr(), limits(500, 500)),
        ];
        let start = Instant::now();
        let r = shutdown_table(&TABLE);
        let took = start.elapsed();
        assert_eq!(
            r,
            ShutdownReport {
                normal: 1,
                abrupt: 0,
                timed_out: 1,
                gone: 1
            }
        );
        // The stuck one got its own normal wait, then the abrupt one (less the handler clock's
        // millisecond truncation at each of the two steps).
        assert!(took >= Duration::from_millis(1098), "{took:?}");
        assert!(took < Duration::from_secs(5), "{took:?}");
        assert_eq!(normal.cc().0 >> 14 & 3, Shutdown::Normal as u32);
        assert_eq!(stuck.cc().0 >> 14 & 3, Shutdown::Abrupt as u32);
        assert!(normal.cc().enabled() && stuck.cc().enabled());
        for s in &TABLE {
            assert_eq!(s.busy.load(Ordering::SeqCst), 0, "every slot left");
        }
        drop(regs);
    }

    #[test]
    fn limits_follow_rtd3e_then_cap_to() {
        // CAP.TO is bits 31:24, in 500 ms units.
        let cap = |to: u64| Cap(to << 24);
        let l = ShutdownLimits::new(cap(10), 0);
        assert_eq!(l, limits(5000, 2000), "no RTD3E: CAP.TO");
        assert_eq!(
            ShutdownLimits::new(cap(0), 0),
            limits(10_000, 2000),
            "nothing reported"
        );
        assert_eq!(
            ShutdownLimits::new(cap(1), 8_000_000).normal,
            Duration::from_secs(8)
        );
        assert_eq!(
            ShutdownLimits::new(cap(1), 8_000_000).abrupt,
            Duration::from_millis(500)
        );
        assert_eq!(ShutdownLimits::new(cap(1), 1).normal, MIN_NORMAL);
        assert_eq!(ShutdownLimits::new(cap(1), u32::MAX).normal, MAX_NORMAL);
    }
}
