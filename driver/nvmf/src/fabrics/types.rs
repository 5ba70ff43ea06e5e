//! The names every part of the target uses: controller, subsystem and queue IDs, what a
//! connection tells about itself, the completion of a held Asynchronous Event Request, a
//! controller's summary, and the admin queue's limits. The bottom of `fabrics`: it imports
//! nothing from its siblings but the wire format.

use super::wire::Cqe;

/// Entries of an admin queue at most (ASQSZ of the discovery log; Linux asks for 32).
pub const ADMIN_QUEUE_ENTRIES: u32 = 32;

/// In-capsule data an admin queue accepts (NVMe/TCP: 8 KiB on the admin queue, the size
/// Linux's host sends in-capsule there; Connect's 1024 bytes fit on any queue).
pub const ADMIN_IN_CAPSULE: u32 = 8192;

/// KATO of a discovery controller whose host asked for none: 2 minutes, after which an
/// idle discovery association is ended (NVMe-oF 1.1 discovery controller keep-alive; Linux's
/// target does the same).
pub const DISCOVERY_KATO_MS: u32 = 120_000;

/// A controller ID (CNTLID), unique on the target (Linux requires it unique per subsystem;
/// this target allocates from one space for all subsystems, 1 to FFEFh).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cntlid(pub u16);

/// A subsystem of the target, by the order it was added (0, 1, ...); IDs are not reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SubsystemId(pub u32);

/// One queue of one controller: QID 0 is the admin queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QueueRef {
    /// The controller.
    pub cntlid: Cntlid,
    /// Queue ID.
    pub qid: u16,
}

/// What the runtime knows of a connection when its Connect arrives.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConnInfo {
    /// PORTID of the listener the connection arrived on.
    pub portid: u16,
    /// The local address the host connected to: the discovery log names it for a listener on
    /// all addresses.
    pub local_addr: Option<String>,
    /// The host's address, for logs.
    pub peer: String,
}

/// A completion of a held Asynchronous Event Request, to send on the controller's admin queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AerCompletion {
    /// The controller.
    pub cntlid: Cntlid,
    /// The completion.
    pub cqe: Cqe,
}

/// A controller as the runtime may show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerInfo {
    /// Controller ID.
    pub cntlid: Cntlid,
    /// `None`: a discovery controller.
    pub subsystem: Option<SubsystemId>,
    /// The host's NQN.
    pub hostnqn: String,
    /// The host's identifier.
    pub hostid: [u8; 16],
    /// The keep-alive timeout in milliseconds (0: none).
    pub kato_ms: u32,
    /// Connected I/O queues.
    pub io_queues: Vec<u16>,
    /// CC.EN and CSTS.RDY.
    pub ready: bool,
}
