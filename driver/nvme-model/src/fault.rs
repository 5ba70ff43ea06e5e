//! Injectable faults: what the model does wrong on purpose, and to which commands.
//!
//! A [`Fault`] is matched against each command when the controller fetches it from its
//! submission queue, in injection order; the first fault that matches is applied and its count
//! decremented (at zero it is removed). A command matches at most one fault.

use std::time::Duration;

use crate::Status;

/// What happens to a command that a [`Fault`] matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// The command is not executed (no data moves, the namespace is unchanged) and completes at
    /// once with this status. The error is recorded in the Error Information log like any other.
    Status(Status),
    /// The command is executed when fetched, and its completion is posted after this delay
    /// instead of at once (or instead of the configured completion latency). Abort can still
    /// catch it in the meantime.
    Delay(Duration),
    /// The command is executed, but no completion is ever posted: the host's timeout must catch
    /// it. An Abort naming it completes it with Command Abort Requested; deleting its SQ completes
    /// it with Command Aborted due to SQ Deletion; a controller reset forgets it.
    Drop,
    /// When the command is fetched, the controller sets CSTS.CFS and stops processing every
    /// queue; the command is neither executed nor completed. Only a controller reset (CC.EN
    /// 1 → 0) clears CFS.
    ControllerFatal,
    /// The command is executed, and its completion carries this command identifier instead of
    /// the command's own.
    BogusCid(u16),
    /// The command is executed, and its completion is written into the next CQ slot with the
    /// phase tag inverted (so it must not be consumed) and the CQ tail not advanced. The CQ then
    /// stalls: nothing more is posted to it, and the SQs that use it are no longer fetched from,
    /// until the CQ is deleted or the controller is reset.
    WrongPhase,
    /// The command is executed, and its completion is posted twice, in two consecutive CQ slots
    /// (the second as soon as the CQ has room).
    Duplicate,
}

/// Which queues a [`Fault`] applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueueMatch {
    /// Any submission queue, admin included.
    #[default]
    Any,
    /// The admin submission queue only.
    Admin,
    /// Any I/O submission queue.
    Io,
    /// The submission queue with this ID.
    Sq(u16),
}

impl QueueMatch {
    fn matches(self, sqid: u16) -> bool {
        match self {
            QueueMatch::Any => true,
            QueueMatch::Admin => sqid == 0,
            QueueMatch::Io => sqid != 0,
            QueueMatch::Sq(q) => q == sqid,
        }
    }
}

/// A fault to inject: a [`FaultKind`], the commands it applies to, and how many times.
///
/// ```
/// use vfpoll_nvme_model::{Fault, FaultKind, Status};
/// // The next two reads (opcode 02h) on any I/O queue fail with Data Transfer Error.
/// let f = Fault::new(FaultKind::Status(Status::DATA_TRANSFER_ERROR)).io().opcode(0x02).times(2);
/// assert_eq!(f.count, 2);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// What happens.
    pub kind: FaultKind,
    /// Which submission queues.
    pub queue: QueueMatch,
    /// Which opcode (`None`: any). Admin and I/O opcodes share numbers: combine with `queue`.
    pub opcode: Option<u8>,
    /// How many matching commands it applies to (at least 1).
    pub count: u32,
}

impl Fault {
    /// A one-shot fault matching any command on any queue.
    pub fn new(kind: FaultKind) -> Self {
        Fault {
            kind,
            queue: QueueMatch::Any,
            opcode: None,
            count: 1,
        }
    }

    /// Only on the admin queue.
    #[must_use]
    pub fn admin(self) -> Self {
        Fault {
            queue: QueueMatch::Admin,
            ..self
        }
    }

    /// Only on I/O queues.
    #[must_use]
    pub fn io(self) -> Self {
        Fault {
            queue: QueueMatch::Io,
            ..self
        }
    }

    /// Only on submission queue `sqid`.
    #[must_use]
    pub fn on_sq(self, sqid: u16) -> Self {
        Fault {
            queue: QueueMatch::Sq(sqid),
            ..self
        }
    }

    /// Only for this opcode.
    #[must_use]
    pub fn opcode(self, opcode: u8) -> Self {
        Fault {
            opcode: Some(opcode),
            ..self
        }
    }

    /// For the next `n` matching commands (`n` ≥ 1).
    #[must_use]
    pub fn times(self, n: u32) -> Self {
        Fault {
            count: n.max(1),
            ..self
        }
    }

    fn matches(&self, sqid: u16, opcode: u8) -> bool {
        self.queue.matches(sqid) && self.opcode.is_none_or(|o| o == opcode)
    }
}

/// The controller thread's list of armed faults.
#[derive(Debug, Default)]
pub(crate) struct FaultTable {
    armed: Vec<Fault>,
}

impl FaultTable {
    pub(crate) fn arm(&mut self, faults: impl IntoIterator<Item = Fault>) {
        self.armed.extend(faults);
    }

    /// The fault to apply to a command just fetched, if any (consuming one use of it).
    pub(crate) fn take(&mut self, sqid: u16, opcode: u8) -> Option<FaultKind> {
        if self.armed.is_empty() {
            return None;
        }
        let i = self.armed.iter().position(|f| f.matches(sqid, opcode))?;
        let f = &mut self.armed[i];
        let kind = f.kind;
        f.count -= 1;
        if f.count == 0 {
            self.armed.remove(i);
        }
        Some(kind)
    }

    pub(crate) fn len(&self) -> usize {
        self.armed.len()
    }

    pub(crate) fn clear(&mut self) {
        self.armed.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_match_wins_and_counts_down() {
        let mut t = FaultTable::default();
        t.arm([
            Fault::new(FaultKind::Drop).on_sq(2).opcode(0x02).times(2),
            Fault::new(FaultKind::Duplicate).io(),
            Fault::new(FaultKind::WrongPhase).admin(),
        ]);
        assert_eq!(
            t.take(2, 0x01),
            Some(FaultKind::Duplicate),
            "opcode differs: second fault"
        );
        assert_eq!(t.take(2, 0x02), Some(FaultKind::Drop));
        assert_eq!(
            t.take(1, 0x02),
            None,
            "queue 1 matches neither remaining I/O fault"
        );
        assert_eq!(t.take(2, 0x02), Some(FaultKind::Drop));
        assert_eq!(t.take(2, 0x02), None, "used up");
        assert_eq!(t.take(0, 0x06), Some(FaultKind::WrongPhase));
        assert_eq!(t.len(), 0);
    }
}
