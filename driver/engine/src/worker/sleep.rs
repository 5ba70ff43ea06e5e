//! Interrupt mode's sleep: an empty poll with commands in flight waits in `QueuePair::wait`
//! (`CompletionMode::Irq`/`Hybrid`) instead of polling again.

use std::time::Duration;

use vfpoll_nvme::{IoBuffer, NvmeError, QueuePair};

/// Longest sleep of an interrupt-mode worker before it polls again on its own.
const IRQ_WAIT_LIMIT: Duration = Duration::from_millis(10);

/// Whether a queue sleeps after an empty poll.
pub(super) struct Sleep {
    on: bool,
}

impl Sleep {
    /// `on`: the queue pair interrupts (`CompletionMode::interrupts`).
    pub(super) fn new(on: bool) -> Self {
        Sleep { on }
    }

    /// Whether an empty poll with `inflight` commands in flight sleeps.
    #[inline]
    pub(super) fn due(&self, inflight: u32) -> bool {
        self.on && inflight != 0
    }

    /// Sleeps until `qp` interrupts, bounded so that a stop request is seen within a few
    /// milliseconds even if a completion were lost.
    #[cold]
    #[inline(never)]
    pub(super) fn sleep<B: IoBuffer>(qp: &mut QueuePair<B>) -> Result<(), NvmeError> {
        qp.wait(Some(IRQ_WAIT_LIMIT)).map(drop)
    }
}
