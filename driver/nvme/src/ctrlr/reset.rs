//! Controller reset and recovery (NVMe Base 2.0 §3.7.2 Controller Level Reset, §3.5.1
//! initialization), with queue pairs that survive it.
//!
//! A reset disables the controller (CC.EN 1 → 0, CSTS.RDY = 0 within CAP.TO), or, when it does
//! not stop, resets the PCI function through VFIO; either way the controller then does no more
//! DMA. The admin queue is re-created in its own memory, and the controller enabled again and
//! given back what it lost: the number of queues, the Doorbell Buffer Config, the asynchronous
//! event configuration with its outstanding request, every feature set through
//! [`Controller::set_feature`], the CMB's address.
//!
//! Queue pairs belong to their polling threads and are never touched by the thread that resets.
//! The handshake is an epoch in [`ResetState`]: even while the controller runs, odd while it is
//! down. It is bumped to odd only once the controller is disabled (DMA stopped), and to even
//! once it runs again. A queue pair remembers the epoch its queues were created in and compares
//! it (one load) before it rings a doorbell and at each health tick. On a change it completes
//! every command in flight with [`NvmeError::Reset`], handing the buffers back (safe: the
//! controller that could write them is disabled), or keeps them to submit once more
//! ([`crate::QpairOptions::resubmit_on_reset`]); then zeroes its queues and shadow doorbell
//! words, and once the epoch is even, re-creates its CQ and SQ under the same queue id, with
//! admin commands it submits without waiting ([`crate::admin`]) and collects on later polls.
//! Because only the queue pair's own thread re-creates its queues, a doorbell it rang just
//! before noticing the reset reaches a queue the controller does not have, never a new queue
//! with stale state.
//!
//! Triggers: [`Controller::reset`]; CSTS.CFS seen by a health check; an Abort that fails or
//! times out, or a command still stuck one timeout after its Abort; an admin command that does
//! not complete in time. Automatic resets run on a thread of their own (`nvme-recovery`), never
//! on a polling thread. They are bounded ([`ResetPolicy`]): a back-off between them, and after
//! too many in a window, or too many failed attempts in a row, the controller is declared
//! failed; every queue pair then fails its requests with [`NvmeError::Failed`] saying why.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::{check_csts, wait_csts, Controller, Shared, PAGE_SIZE};
use crate::admin::{AdminQueue, DataDir};
use crate::cmd::{feature, Command, CommandExt as _};
use crate::error::{NvmeError, Result};
use crate::regs::{self, off, Cc};

/// When resets are given up on (part of [`crate::ControllerOptions`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResetPolicy {
    /// Failed reset attempts in a row after which the controller is declared failed (each
    /// reset tries again after a back-off until then).
    pub max_failures: u32,
    /// Automatic resets (not [`Controller::reset`]) within `window` after which the next one
    /// declares the controller failed instead: a reset storm.
    pub storm_resets: u32,
    /// The window of `storm_resets`.
    pub window: Duration,
    /// The first back-off: before an automatic reset that follows another within `window`,
    /// and between failed attempts; doubled for each one more, up to `max_backoff`.
    pub backoff: Duration,
    /// The longest back-off.
    pub max_backoff: Duration,
}

impl Default for ResetPolicy {
    fn default() -> Self {
        ResetPolicy {
            max_failures: 3,
            storm_resets: 5,
            window: Duration::from_secs(60),
            backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
        }
    }
}

impl ResetPolicy {
    fn backoff(&self, n: u32) -> Duration {
        self.backoff.saturating_mul(1 << n.min(16)).min(self.max_backoff)
    }
}

/// What a successful reset did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResetReport {
    /// Why it was made.
    pub why: String,
    /// From the start of the first attempt until the controller ran again (back-off before
    /// the first attempt not included).
    pub took: Duration,
    /// Attempts (1 unless earlier ones failed).
    pub attempts: u32,
    /// Whether the PCI function was reset (the controller did not disable, or did not come
    /// back, by CC.EN alone).
    pub function_reset: bool,
}

/// Why the controller was declared failed.
#[derive(Debug)]
pub(crate) struct Failure {
    pub why: String,
    /// The controller was stopped (disabled, reset, or gone) before it was declared failed: it
    /// no longer writes to host memory, so buffers can be handed back.
    pub dma_stopped: bool,
}

/// A controller's reset state: the epoch queue pairs compare, its failure, its history.
#[derive(Debug, Default)]
pub(crate) struct ResetState {
    /// Even while the controller runs, odd while it is down (see the module docs).
    pub epoch: AtomicU64,
    failure: OnceLock<Failure>,
    history: Mutex<History>,
    /// A recovery thread is running.
    recovering: AtomicBool,
    /// Resets completed.
    resets: AtomicU64,
    /// Function resets made.
    function_resets: AtomicU64,
}

#[derive(Debug, Default)]
struct History {
    /// Start times of the automatic resets within the policy's window.
    auto: VecDeque<Instant>,
    /// Failed attempts since the last success.
    failures: u32,
}

/// A function reset for controllers VFIO does not open (a device model): resets the function
/// and returns whether it did.
pub(crate) type FunctionReset = Box<dyn Fn() -> Result<bool> + Send + Sync>;

/// Whether `epoch` says the controller runs.
pub(crate) const fn is_up(epoch: u64) -> bool {
    epoch & 1 == 0
}

impl ResetState {
    /// Why the controller was declared failed, once it was.
    pub(crate) fn failure(&self) -> Option<&Failure> {
        self.failure.get()
    }

    /// Marks the controller down: the epoch becomes odd (and changes, so every queue pair looks).
    fn mark_down(&self) {
        let _ = self.epoch.fetch_update(Ordering::AcqRel, Ordering::Acquire, |e| {
            Some(if is_up(e) { e + 1 } else { e + 2 })
        });
    }

    /// Marks the controller up again: the next even epoch.
    fn mark_up(&self) {
        let _ = self.epoch.fetch_update(Ordering::AcqRel, Ordering::Acquire, |e| {
            Some(if is_up(e) { e + 2 } else { e + 1 })
        });
    }
}

impl Shared {
    /// Declares the controller failed for good (the first reason stays), and tells every queue
    /// pair. `dma_stopped`: the controller can no longer write to host memory.
    pub(crate) fn fail(&self, why: String, dma_stopped: bool) {
        if self
            .reset
            .failure
            .set(Failure {
                why: why.clone(),
                dma_stopped,
            })
            .is_ok()
        {
            log::error!("controller {}: declared failed: {why}", self.identify.serial);
        }
        self.reset.mark_down();
    }

    /// Asks for a reset from a thread that must not block (a polling thread): runs it on a
    /// recovery thread unless one runs already, the controller failed, or it was reset since
    /// the caller saw `epoch` (the problem it saw is gone with that controller).
    pub(crate) fn request_reset(&self, why: String, epoch: u64) {
        let r = &self.reset;
        if r.failure().is_some() || r.epoch.load(Ordering::Acquire) != epoch {
            return;
        }
        // Being removed (removal.rs): what the queue pairs see now (CSTS.CFS once Bus Master is
        // off, all-ones) is the removal itself; a reset would only hold the device up.
        if self.removal.requested() {
            return;
        }
        let Some(me) = self.me.upgrade() else { return };
        if r.recovering.swap(true, Ordering::AcqRel) {
            return;
        }
        log::warn!("controller {}: reset requested: {why}", self.identify.serial);
        let what = why.clone();
        let spawned = std::thread::Builder::new()
            .name("nvme-recovery".into())
            .spawn(move || {
                if let Err(e) = me.recover(&why, Some(epoch)) {
                    log::error!("controller {}: recovery failed: {e}", me.identify.serial);
                }
                me.reset.recovering.store(false, Ordering::Release);
            });
        if let Err(e) = spawned {
            self.reset.recovering.store(false, Ordering::Release);
            self.fail(
                format!("{what}; and no recovery thread could be started: {e}"),
                false,
            );
        }
    }

    /// Resets the controller (see the module docs), retrying after failed attempts with
    /// back-off until [`ResetPolicy::max_failures`]. `auto`: asked for by the driver itself
    /// when the epoch was this; such a reset counts towards the storm bound, waits out the
    /// back-off first, and is skipped (0 attempts) when the controller was reset since.
    pub(crate) fn recover(&self, why: &str, auto: Option<u64>) -> Result<ResetReport> {
        let policy = self.opts.reset;
        let mut h = self.reset.history.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = self.reset.failure() {
            return Err(NvmeError::Failed(f.why.clone()));
        }
        if auto.is_some_and(|e| e != self.reset.epoch.load(Ordering::Acquire)) {
            return Ok(ResetReport {
                why: why.to_string(),
                took: Duration::ZERO,
                attempts: 0,
                function_reset: false,
            });
        }
        if auto.is_some() {
            let now = Instant::now();
            while h
                .auto
                .front()
                .is_some_and(|t| now.duration_since(*t) > policy.window)
            {
                h.auto.pop_front();
            }
            if h.auto.len() >= policy.storm_resets as usize {
                let msg = format!(
                    "{why}; but that would be the controller's {}th automatic reset within {:?} (a reset storm): giving up on it",
                    h.auto.len() + 1,
                    policy.window
                );
                // The controller may still run: stop it before the buffers go back.
                let stopped = self.stop_for_good();
                self.fail(msg.clone(), stopped);
                return Err(NvmeError::Failed(msg));
            }
            if let Some(&last) = h.auto.back() {
                let wait = policy.backoff(h.auto.len() as u32 - 1);
                let until = last + wait;
                if let Some(left) = until.checked_duration_since(Instant::now()) {
                    log::info!("controller {}: reset back-off {left:?}", self.identify.serial);
                    std::thread::sleep(left);
                }
            }
            h.auto.push_back(Instant::now());
        }
        let start = Instant::now();
        let mut attempts = 0;
        loop {
            attempts += 1;
            // Asked for through the API: the caller knows; asked for by the driver: a warning.
            let level = if auto.is_some() {
                log::Level::Warn
            } else {
                log::Level::Info
            };
            log::log!(
                level,
                "controller {}: resetting (attempt {attempts}): {why}",
                self.identify.serial
            );
            match self.reset_once() {
                Ok(function_reset) => {
                    h.failures = 0;
                    let took = start.elapsed();
                    log::log!(
                        level,
                        "controller {}: reset done in {took:?}{}",
                        self.identify.serial,
                        if function_reset { " (function reset)" } else { "" }
                    );
                    return Ok(ResetReport {
                        why: why.to_string(),
                        took,
                        attempts,
                        function_reset,
                    });
                }
                Err(e) => {
                    h.failures += 1;
                    if let Some(f) = self.reset.failure() {
                        return Err(NvmeError::Failed(f.why.clone()));
                    }
                    if h.failures >= policy.max_failures {
                        let msg = format!(
                            "{why}; {} reset attempts failed in a row, the last: {e}",
                            h.failures
                        );
                        // `reset_once` left the controller disabled (or declared it failed).
                        self.fail(msg.clone(), true);
                        return Err(NvmeError::Failed(msg));
                    }
                    let wait = policy.backoff(h.failures - 1);
                    log::warn!(
                        "controller {}: reset attempt {attempts} failed ({e}); next in {wait:?}",
                        self.identify.serial
                    );
                    std::thread::sleep(wait);
                }
            }
        }
    }

    /// Stops a controller that is given up on: disabled, or failing that, its function reset.
    /// Returns whether it no longer does DMA.
    fn stop_for_good(&self) -> bool {
        let _admin = self.admin_lock();
        self.disable().is_ok() || matches!(self.function_reset(), Ok(true))
    }

    /// One attempt. Returns whether the PCI function was reset. On failure the controller is
    /// left disabled, or declared failed if it could not be stopped.
    fn reset_once(&self) -> Result<bool> {
        let mut guard = self.admin_lock();
        let Some(admin) = guard.as_mut() else {
            let msg = "the admin queue was lost in a failed shutdown".to_string();
            return Err(NvmeError::Failed(msg));
        };
        // 1. Stop the controller: CC.EN 1 → 0, or the PCI function reset.
        let mut function_reset = false;
        if let Err(e) = self.disable() {
            log::warn!(
                "controller {}: did not disable ({e}); resetting the PCI function",
                self.identify.serial
            );
            match self.function_reset() {
                Ok(true) => function_reset = true,
                Ok(false) => {
                    let msg = format!("the controller did not disable ({e}) and cannot be reset through its PCI function (no VFIO device reset)");
                    self.fail(msg.clone(), false);
                    return Err(NvmeError::Failed(msg));
                }
                Err(fe) => {
                    let msg = format!(
                        "the controller did not disable ({e}) and its PCI function reset failed: {fe}"
                    );
                    self.fail(msg.clone(), false);
                    return Err(NvmeError::Failed(msg));
                }
            }
            if let Err(e) = self.disable() {
                let msg = format!("the controller is not disabled even after a function reset: {e}");
                self.fail(msg.clone(), false);
                return Err(NvmeError::Failed(msg));
            }
        }
        // Queue pairs that have not noticed yet must not take commands for announced through
        // a shadow doorbell alone.
        if let Some(pages) = &self.shadow {
            pages.force_events(self.cap.doorbell_stride(), PAGE_SIZE, self.io_queues_granted);
        }
        // No more DMA: queue pairs may hand their buffers back.
        self.reset.mark_down();
        // 2. Up again; a controller that does not come back gets one function reset.
        let mut r = self.bring_back(admin);
        if r.is_err() && !function_reset {
            let e = r.as_ref().err().map(ToString::to_string).unwrap_or_default();
            log::warn!(
                "controller {}: did not come back after CC.EN 1 -> 0 -> 1 ({e}); resetting the PCI function",
                self.identify.serial
            );
            if let Ok(true) = self.function_reset() {
                function_reset = true;
                r = self.disable().and_then(|()| self.bring_back(admin));
            }
        }
        if let Err(e) = r {
            if let Err(d) = self.disable() {
                if self.function_reset().ok() != Some(true) {
                    let msg = format!("the controller did not come back ({e}) nor disable again ({d})");
                    self.fail(msg.clone(), false);
                    return Err(NvmeError::Failed(msg));
                }
            }
            return Err(e);
        }
        // Counted before the queue pairs can see the controller up again.
        self.reset.resets.fetch_add(1, Ordering::Relaxed);
        if function_reset {
            self.reset.function_resets.fetch_add(1, Ordering::Relaxed);
        }
        self.reset.mark_up();
        Ok(function_reset)
    }

    /// CC.EN = 0 and a wait of up to CAP.TO for CSTS.RDY = 0 (§3.7.2).
    fn disable(&self) -> Result<()> {
        let cc = Cc(self.bar.read32(off::CC));
        if cc.0 == u32::MAX {
            return Err(NvmeError::DeviceGone);
        }
        self.bar.write32(off::CC, cc.with_enable(false).0);
        wait_csts(&self.bar, self.cap, "disable", |s| !s.ready())
    }

    /// The PCI function reset: VFIO's device reset (then bus mastering again), or the one
    /// given with [`Controller::set_function_reset`]. `Ok(false)`: none is available.
    fn function_reset(&self) -> Result<bool> {
        if let Some(dev) = &self.device {
            let done = dev.reset()?;
            if done {
                dev.enable_bus_master()?;
            }
            return Ok(done);
        }
        match &*self.function_reset.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(f) => f(),
            None => Ok(false),
        }
    }

    /// §3.5.1 again on a disabled controller: the admin queue in its own memory, CC, enable,
    /// then what a reset clears (§3.7.2: features revert to their defaults).
    fn bring_back(&self, admin: &mut AdminQueue) -> Result<()> {
        let bar = &self.bar;
        bar.write32(off::INTMS, u32::MAX);
        let (asq, acq) = admin.reinit();
        let n = admin.entries() as u32;
        bar.write32(off::AQA, regs::aqa(n, n));
        bar.write64(off::ASQ, asq.get());
        bar.write64(off::ACQ, acq.get());
        let cc = Cc(0)
            .with_command_set(if self.io_command_sets { 0b110 } else { 0 })
            .with_page_size(PAGE_SIZE)
            .with_entry_sizes(6, 4);
        bar.write32(off::CC, cc.0);
        bar.write32(off::CC, cc.with_enable(true).0);
        wait_csts(bar, self.cap, "enable", |s| s.ready())?;
        let check = &mut || check_csts(bar);
        let want = self.opts.io_queues.max(1) as u32 - 1;
        let c = admin.exec(
            "Set Features (Number of Queues)",
            Command::set_features(feature::NUMBER_OF_QUEUES, want | (want << 16)),
            DataDir::None,
            &[],
            check,
        )?;
        let granted = (c.dw0 & 0xffff).min(c.dw0 >> 16) + 1;
        if granted < self.io_queues_granted as u32 {
            log::warn!(
                "controller {}: grants {granted} I/O queues after the reset, {} before: queue pairs above {granted} cannot be re-created",
                self.identify.serial,
                self.io_queues_granted
            );
        }
        if let Some(pages) = &self.shadow {
            let (db, ei) = pages.bus(PAGE_SIZE);
            admin.exec(
                "Doorbell Buffer Config",
                Command::doorbell_buffer_config(db, ei),
                DataDir::None,
                &[],
                check,
            )?;
        }
        if let Some(dw11) = self.aen_config {
            admin.exec(
                "Set Features (Asynchronous Event Configuration)",
                Command::set_features(feature::ASYNC_EVENT_CONFIG, dw11),
                DataDir::None,
                &[],
                check,
            )?;
            admin.arm_event()?;
        }
        let features = self.features.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for (fid, dw11) in features {
            if let Err(e) = admin.exec(
                "Set Features",
                Command::set_features(fid, dw11),
                DataDir::None,
                &[],
                check,
            ) {
                match e {
                    NvmeError::Status { .. } => {
                        log::warn!("feature {fid:#04x} = {dw11:#x} not re-applied after the reset: {e}")
                    }
                    e => return Err(e),
                }
            }
        }
        if let Some(cmb) = self.cmb.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            cmb.reprogram(bar);
        }
        Ok(())
    }
}

impl Controller {
    /// Resets the controller and brings it back (see the module docs of `reset`): disables it
    /// (CC.EN 1 → 0 within CAP.TO; the PCI function reset through VFIO where it does not
    /// disable or come back), re-creates the admin queue, re-applies the number of queues,
    /// shadow doorbells, asynchronous event configuration and every feature set through
    /// [`Controller::set_feature`]. Queue pairs stay valid: each notices within a poll or a
    /// health tick, completes its commands in flight with [`NvmeError::Reset`] (buffers back)
    /// or resubmits them ([`crate::QpairOptions::resubmit_on_reset`]), and re-creates its
    /// queues under the same id.
    ///
    /// Blocks for the reset (waits for an admin command in progress first); retries failed
    /// attempts with back-off ([`ResetPolicy`]), then declares the controller failed. Resets
    /// asked for here do not count towards the storm bound.
    pub fn reset(&self) -> Result<ResetReport> {
        self.shared
            .recover("reset requested through Controller::reset", None)
    }

    /// Why the controller was declared failed (resets gave up, or it vanished), or `None`
    /// while it is usable.
    pub fn failed(&self) -> Option<String> {
        self.shared.reset.failure().map(|f| f.why.clone())
    }

    /// Resets completed so far, and of those how many needed the PCI function reset.
    pub fn resets(&self) -> (u64, u64) {
        let r = &self.shared.reset;
        (
            r.resets.load(Ordering::Relaxed),
            r.function_resets.load(Ordering::Relaxed),
        )
    }

    /// Whether a reset is under way (the controller is down, or a recovery thread runs).
    pub fn resetting(&self) -> bool {
        let r = &self.shared.reset;
        r.failure().is_none()
            && (!is_up(r.epoch.load(Ordering::Acquire)) || r.recovering.load(Ordering::Acquire))
    }

    /// How to reset the PCI function of a controller VFIO did not open (a device model's, for
    /// instance): called when the controller does not disable or does not come back. `f`
    /// returns whether it reset the function. Through VFIO, the device's reset is used.
    pub fn set_function_reset(&self, f: impl Fn() -> Result<bool> + Send + Sync + 'static) {
        *self
            .shared
            .function_reset
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(Box::new(f));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_is_odd_while_down_and_always_moves() {
        let r = ResetState::default();
        r.mark_down();
        assert_eq!(r.epoch.load(Ordering::Relaxed), 1);
        r.mark_down();
        assert_eq!(
            r.epoch.load(Ordering::Relaxed),
            3,
            "down again: still odd, but changed"
        );
        r.mark_up();
        assert_eq!(r.epoch.load(Ordering::Relaxed), 4);
        r.mark_up();
        assert_eq!(r.epoch.load(Ordering::Relaxed), 6);
    }

    #[test]
    fn backoff_doubles_up_to_the_limit() {
        let p = ResetPolicy::default();
        assert_eq!(p.backoff(0), Duration::from_millis(100));
        assert_eq!(p.backoff(2), Duration::from_millis(400));
        assert_eq!(p.backoff(40), p.max_backoff);
    }
}
