//! Interrupt mode: queue pairs that sleep until completions arrive instead of spinning.
//!
//! A queue pair created with [`CompletionMode::Irq`] or [`CompletionMode::Hybrid`] gets an
//! interrupt vector of its own (MSI-X, or MSI where that is all the controller has; vector 0 is
//! the admin queue's and stays unused: the admin queue polls) and its completion queue is
//! created with IEN = 1, IV = that vector (NVMe Base 2.0 §5.4). vfio-pci signals the vector's
//! eventfd when the controller sends the interrupt. [`QueuePair::poll`] is unchanged: it never
//! looks at the eventfd, so polling users pay nothing.
//!
//! ## Sleeping without losing a wakeup
//! [`QueuePair::arm`] is the step before sleeping; [`QueuePair::wait`] is `arm` plus the sleep:
//! 1. ring the SQ doorbell for whatever was submitted (commands not announced never complete);
//! 2. take the eventfd's counter (clears it; read, not waited on: it is non-blocking);
//! 3. ring the CQ head doorbell for every entry consumed so far, even below the batch that
//!    [`QueuePair::poll`] waits for. A controller raises an interrupt when a queue goes from
//!    "no entries the host has not consumed" to "some" (§3.5.1; QEMU sends one per post, real
//!    controllers need the edge), so an un-announced head would keep it from interrupting again;
//! 4. look at the next CQ entry's phase tag: if it is there, do not sleep (`arm` returns true).
//!
//! An interrupt for an entry posted after step 2 lands in the counter, which stays non-zero
//! until the next `arm`, so the sleep that follows returns at once: a completion that races
//! with going to sleep is never lost. One posted before step 2 is seen in step 4. The counter
//! may hold interrupts for entries already polled (a spurious wakeup: `poll` finds nothing and
//! the caller waits again), never the reverse.
//!
//! Shadow doorbells (§5.8) keep working: step 3 goes through the same ring code, which writes
//! the shadow value and the MMIO doorbell only when the controller's EventIdx asks for it; a
//! controller using the shadow doorbell reads the head there before it posts.
//!
//! ## Hybrid
//! [`CompletionMode::Hybrid`] spins on the CQ's phase tag for `spin` when `wait` is called (the
//! caller polls until empty, so that is `spin` after the last completion), then arms and
//! sleeps: a steady stream of completions is caught spinning at polling latency, an idle queue
//! pair costs no CPU.
//!
//! While completions keep coming within `spin`, the queue pair's MSI-X vector signals nothing:
//! after [`UNBIND_STREAK`] waits in a row that the spin ended, `wait` unbinds the vector's
//! eventfd (`VFIO_DEVICE_SET_IRQS` with fd -1; vfio-pci frees the IRQ, which masks the vector
//! in the MSI-X table), and a spin that runs out binds it again before `arm`. A controller
//! that posts while the vector is masked sets its pending bit (PCI Local Bus 3.0 §6.8.2.9) and
//! sends the message once the vector is unmasked, so an entry posted between the spin and the
//! bind signals the eventfd as soon as it is bound (at worst one spurious wakeup later), and
//! one posted before `arm` took the counter is seen by `arm`'s look at the CQ. So a stream of
//! completions that come within `spin` costs no interrupt (one per completion otherwise: on
//! the test bed that made hybrid's QD1 latency 1.25x polling's, the guest taking each message
//! while the worker spins), and a sleep costs two ioctls, paid only after a streak: where
//! completions come about as late as `spin`, the vector stays bound and nothing is paid but
//! the interrupts. (Each ioctl is a free_irq or request_irq in the kernel: 0.25-11 ms on the
//! TCG test bed with emulated interrupt remapping.) MSI vectors and vectors given with
//! [`Controller::use_interrupts`] stay bound (MSI may lack per-vector masking).
//!
//! A spin that runs out while the vector is unbound and commands are in flight is a late
//! completion in a stream that came within `spin` until then, not an idle queue pair: the wait
//! spins on for up to [`LATE_SPINS`] times `spin` (1 ms at the default 50 µs) before it binds
//! the vector and sleeps, so that a hiccup of the device costs a longer spin, not the bind's
//! ioctl plus a sleep and an interrupt (on the test bed, whose QD1 p99 is several times its
//! median, those made hybrid's mean QD1 latency 1.6x polling's). A queue pair with nothing in
//! flight sleeps after `spin` as before.

use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vfpoll_pci::vfio::{EventFd, IrqIndex};

use super::QueuePair;
use crate::buffer::IoBuffer;
use crate::clock::{tsc_per_ms, SpinDeadline};
use crate::ctrlr::{Controller, Shared};
use crate::error::{NvmeError, Result};
use crate::regs::off;
use crate::vectors::Vectors;

/// Looks at the CQ per clock read while hybrid mode spins ([`QueuePair::spin_for`]).
const SPIN_CHECK: u32 = 64;
/// Hybrid waits in a row ended by the spin after which the vector is unbound (module docs).
pub(crate) const UNBIND_STREAK: u32 = 8;
/// How many spins long a hybrid wait goes on spinning, when its spin runs out with commands
/// in flight while the vector is unbound (module docs, "Hybrid").
const LATE_SPINS: u32 = 20;

/// How a queue pair learns that commands completed (defined in `vfpoll-pci`, shared with the
/// NIC driver): [`CompletionMode::Poll`] creates the CQ with interrupts off, `Irq` and `Hybrid`
/// make [`QueuePair::wait`] sleep on the CQ's eventfd (`Hybrid` after its spin).
pub use vfpoll_pci::CompletionMode;

/// A queue pair's vector, given back when it goes.
#[derive(Debug)]
pub(crate) struct QpIrq {
    vectors: Arc<Vectors>,
    vector: u16,
    mode: CompletionMode,
    /// Whether the vector signals its eventfd now (hybrid mode unbinds it while spinning).
    bound: bool,
    /// Hybrid waits in a row that the spin ended while bound.
    streak: u32,
}

impl QpIrq {
    /// Takes a vector of `ctrl` for a queue pair in `mode` (enabling the controller's
    /// interrupts on first use).
    pub(crate) fn new(ctrl: &Controller, mode: CompletionMode) -> Result<Self> {
        let vectors = ctrl.vectors()?;
        let vector = vectors.take()?;
        if matches!(mode, CompletionMode::Hybrid { .. }) {
            // Calibrates the spin's clock now (once per process), not in the first wait.
            let _ = tsc_per_ms();
        }
        Ok(QpIrq {
            vectors,
            vector,
            mode,
            bound: true,
            streak: 0,
        })
    }

    /// Binds (`true`) or unbinds the vector's eventfd, where the vector can be masked (MSI-X
    /// through VFIO); a no-op elsewhere. See the module docs, "Hybrid".
    fn bind(&mut self, on: bool) -> Result<()> {
        if self.bound == on {
            return Ok(());
        }
        let Some(irqs) = self.vectors.irqs.as_ref().filter(|i| i.index() == IrqIndex::MSIX) else {
            return Ok(());
        };
        let v = self.vector;
        irqs.set_trigger(u32::from(v), on.then(|| &self.vectors.fds[v as usize]))
            .map_err(|e| {
                NvmeError::Failed(format!(
                    "{} MSI-X vector {v} of a hybrid-mode queue pair: {e}",
                    if on { "binding" } else { "unbinding" }
                ))
            })?;
        self.bound = on;
        Ok(())
    }

    pub(crate) fn vector(&self) -> u16 {
        self.vector
    }

    fn fd(&self) -> &EventFd {
        &self.vectors.fds[self.vector as usize]
    }
}

impl Drop for QpIrq {
    fn drop(&mut self) {
        // The next queue pair to take the vector finds it bound, as `new` says.
        if let Err(e) = self.bind(true) {
            log::debug!("{e}");
        }
        self.vectors.give_back(self.vector);
    }
}

impl Shared {
    /// For MSI (not MSI-X), vectors are masked in INTMS/INTMC (§3.1.3.3-4; vfpoll masks all at
    /// bring-up): unmask one.
    fn unmask_msi(&self, v: u16) {
        self.bar.write32(off::INTMC, 1 << v);
    }
}

impl Controller {
    /// The controller's interrupt vectors, enabled through VFIO on first use: MSI-X, or MSI
    /// where the controller has no MSI-X; one vector per I/O queue the controller granted plus
    /// the admin queue's, or as many as the controller has.
    pub(crate) fn vectors(&self) -> Result<Arc<Vectors>> {
        let sh = &self.shared;
        let mut slot = sh.vectors.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = slot.as_ref() {
            return Ok(Arc::clone(v));
        }
        let Some(dev) = self.device() else {
            return Err(NvmeError::Unsupported(
                "interrupts need a controller opened through VFIO (or vectors given with Controller::use_interrupts)"
                    .into(),
            ));
        };
        let want = sh.io_queues_granted as u32 + 1;
        let (index, kind) = if dev.irq_info(IrqIndex::MSIX)?.count > 0 {
            (IrqIndex::MSIX, "MSI-X")
        } else if dev.irq_info(IrqIndex::MSI)?.count > 0 {
            (IrqIndex::MSI, "MSI")
        } else {
            return Err(NvmeError::Unsupported(format!(
                "{} has neither MSI-X nor MSI, only INTx, one line for every queue, which interrupt-mode \
                 queue pairs do not use: create queue pairs with CompletionMode::Poll",
                dev.bdf()
            )));
        };
        let n = want.min(dev.irq_info(index)?.count);
        if n < 2 {
            return Err(NvmeError::Unsupported(format!(
                "{} has one {kind} vector, the admin queue's: no vector is left for an I/O queue; use \
                 CompletionMode::Poll",
                dev.bdf()
            )));
        }
        let irqs = dev.enable_irqs(index, n)?;
        let fds = (0..n)
            .map(|v| irqs.eventfd(v).expect("enabled").try_clone())
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(|e| NvmeError::Unsupported(format!("cannot duplicate an eventfd: {e}")))?;
        log::debug!(
            "{}: {n} {kind} vectors enabled for interrupt-mode queue pairs",
            dev.bdf()
        );
        let v = Arc::new(Vectors::new(fds, kind, Some(irqs)));
        *slot = Some(Arc::clone(&v));
        Ok(v)
    }

    /// Delivers interrupt vector `v` through `fds[v]` (a device model signals them; vector 0 is
    /// the admin queue's and stays unused). For controllers that VFIO does not open; through
    /// VFIO the vectors are enabled on the first interrupt-mode queue pair. Refused once set.
    pub fn use_interrupts(&self, fds: Vec<EventFd>) -> Result<()> {
        if fds.len() < 2 {
            return Err(NvmeError::InvalidOption(format!(
                "{} interrupt vector(s) given: vector 0 is the admin queue's, give at least 2",
                fds.len()
            )));
        }
        let mut slot = self.shared.vectors.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_some() {
            return Err(NvmeError::InvalidOption(
                "the controller's interrupt vectors are already set".into(),
            ));
        }
        *slot = Some(Arc::new(Vectors::new(fds, "supplied", None)));
        Ok(())
    }

    /// Unmasks vector `v` where the controller's interrupts are MSI (a no-op for MSI-X, which
    /// INTMS/INTMC do not mask and which must not be written then, §3.1.3.3).
    pub(crate) fn unmask_vector(&self, v: u16) {
        let slot = self.shared.vectors.lock().unwrap_or_else(|e| e.into_inner());
        if slot.as_ref().is_some_and(|s| s.kind == "MSI") {
            self.shared.unmask_msi(v);
        }
    }
}

impl<B: IoBuffer> QueuePair<B> {
    /// How this queue pair learns of completions.
    pub fn completion_mode(&self) -> CompletionMode {
        self.irq.as_ref().map_or(CompletionMode::Poll, |i| i.mode)
    }

    /// The interrupt vector of its completion queue (`None` in poll mode).
    pub fn vector(&self) -> Option<u16> {
        self.irq.as_ref().map(QpIrq::vector)
    }

    /// The eventfd that becomes readable when the completion queue interrupts (`None` in poll
    /// mode). Register it with epoll/mio/tokio, and call [`QueuePair::arm`] before each sleep.
    pub fn event_fd(&self) -> Option<BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.irq.as_ref().map(|i| i.fd().as_fd())
    }

    fn irq(&self) -> Result<&QpIrq> {
        self.irq.as_ref().ok_or_else(|| {
            NvmeError::InvalidOption(format!(
                "queue pair {} polls (CompletionMode::Poll): create it with CompletionMode::Irq or Hybrid to wait",
                self.ring.qid
            ))
        })
    }

    /// Prepares to sleep on [`QueuePair::event_fd`]: rings the SQ doorbell, clears the eventfd,
    /// announces every consumed completion entry, then looks at the CQ. Returns `true` when a
    /// completion is already there (poll instead of sleeping). See the module docs for why no
    /// wakeup is lost between this and the sleep.
    pub fn arm(&mut self) -> Result<bool> {
        self.flush_submissions();
        self.irq()?
            .fd()
            .take()
            .map_err(|e| NvmeError::Failed(format!("reading the interrupt eventfd: {e}")))?;
        if self.ring.unacked != 0 && self.current() {
            if self.ring.ring_cq(&self.mem) {
                self.stats.cq_doorbells += 1;
            } else {
                self.stats.shadow_only += 1;
            }
        }
        // After a reset, poll: it settles and re-creates the queues (no interrupt comes first).
        Ok(self.ring.has_completion(&self.mem) || self.failed.is_some() || !self.current())
    }

    /// Waits until a completion is there or `timeout` passes (`None`: no limit). Returns whether
    /// to poll (`true`: a completion arrived, or an interrupt that may be for one already
    /// polled; `false`: the timeout passed). Hybrid mode spins first. Submissions are
    /// announced (the SQ doorbell) before sleeping.
    pub fn wait(&mut self, timeout: Option<Duration>) -> Result<bool> {
        let mut timeout = timeout;
        if let CompletionMode::Hybrid { spin } = self.irq()?.mode {
            self.flush_submissions();
            let mut spin = timeout.map_or(spin, |t| t.min(spin));
            let mut caught = self.spin_for(spin);
            let unbound = self.irq.as_ref().is_some_and(|i| !i.bound);
            if !caught && unbound && self.outstanding() != 0 {
                let late = spin.saturating_mul(LATE_SPINS - 1);
                let late = timeout.map_or(late, |t| t.saturating_sub(spin).min(late));
                caught = self.spin_for(late);
                spin += late;
            }
            let qid = self.ring.qid;
            let irq = self.irq.as_mut().expect("hybrid mode has a vector");
            if caught {
                // A streak of completions caught spinning: no interrupt for the next ones
                // (module docs, "Hybrid"). An unbind that fails (the device going away)
                // leaves the vector bound: spinning works either way.
                if irq.bound {
                    irq.streak += 1;
                    if irq.streak >= UNBIND_STREAK {
                        irq.streak = 0;
                        if let Err(e) = irq.bind(false) {
                            log::debug!("queue pair {qid}: {e}; spinning with the vector bound");
                        }
                    }
                }
                return Ok(true);
            }
            irq.streak = 0;
            irq.bind(true)?;
            timeout = timeout.map(|t| t.saturating_sub(spin));
        }
        // The clocksource (`Instant`) is read only on the way to sleeping, never while spinning.
        let deadline = timeout.map(|t| Instant::now() + t);
        if self.arm()? {
            return Ok(true);
        }
        loop {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            let fd = self.irq()?.fd();
            if fd
                .wait(left)
                .map_err(|e| NvmeError::Failed(format!("waiting on the interrupt eventfd: {e}")))?
            {
                return Ok(true);
            }
            // Woken by a signal, or out of time.
            if self.ring.has_completion(&self.mem) {
                return Ok(true);
            }
            if left.is_some_and(|l| l.is_zero()) || deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(false);
            }
        }
    }

    /// Hybrid mode's spin: looks at the next CQ entry's phase tag for about `spin`; true when
    /// a completion is there. The deadline is read once per [`SPIN_CHECK`] looks, from the TSC
    /// ([`SpinDeadline`]): in a guest whose clocksource traps (the HPET, the ACPI PM timer)
    /// `Instant::now()` costs microseconds to more than a whole spin. No `PAUSE`
    /// (`spin_loop`) between looks: under QEMU's TCG every `PAUSE` leaves the translated code
    /// ("let another CPU run"), which made each hybrid-mode I/O on the test bed 2.5-3x slower
    /// than a polled one (10 ms spin, never sleeping: 36-59 µs mean against 14-18), and under
    /// KVM a run of `PAUSE`s is what pause-loop exiting takes for a preempted lock holder; the
    /// polling loop (`poll`) has none either. The spin is bounded by `spin` anyway.
    fn spin_for(&self, spin: Duration) -> bool {
        let end = SpinDeadline::after(spin);
        loop {
            for _ in 0..SPIN_CHECK {
                if self.ring.has_completion(&self.mem) {
                    return true;
                }
            }
            if end.passed() {
                return false;
            }
        }
    }
}

/// The interrupt eventfd (see [`QueuePair::event_fd`]).
///
/// # Panics
/// On a queue pair in [`CompletionMode::Poll`], which has none.
impl<B: IoBuffer> AsRawFd for QueuePair<B> {
    fn as_raw_fd(&self) -> RawFd {
        match &self.irq {
            Some(i) => i.fd().as_raw_fd(),
            None => panic!(
                "queue pair {} polls (CompletionMode::Poll) and has no eventfd",
                self.ring.qid
            ),
        }
    }
}
