//! Command slots and the requests that live in them: command ids with a generation, what a
//! request does, its buffers while the controller owns them.

use crate::cmd::io_op;
use crate::status::Status;

/// A command slot: the command in flight in it, and the request that lives in it. The command
/// id on the wire is `slot | gen << 12`: the 4-bit generation, bumped each time the slot is
/// reused, lets a stale or duplicated completion be told apart from one for the slot's current
/// command (Linux's nvme driver does the same).
///
/// A request lives in its first command's slot; that slot goes back to the free list when the
/// whole request completes, the slots of a split request's other parts as each part completes.
/// Everything the hot path touches for one I/O is in one slot.
#[derive(Debug)]
pub(super) struct Slot<B> {
    /// The request the command in flight in this slot belongs to (`UNUSED`: none).
    pub owner: u16,
    /// The generation, where it sits in the command id (bits 15:12): one add makes the next
    /// (the `u16` wraps the 4 bits), one mask of a completion's id compares with it.
    pub gen: u16,
    /// The request living here (`parts == 0`: none).
    pub req: Request,
    /// Its data buffer, owned by the queue pair until the request completes.
    pub buf: Option<B>,
    /// Its separate metadata buffer, likewise.
    pub meta: Option<B>,
}

pub(super) const SLOT_BITS: u32 = 12;
pub(super) const SLOT_MASK: u16 = (1 << SLOT_BITS) - 1;
/// `Slot::owner` of a slot with no command in flight.
pub(super) const UNUSED: u16 = u16::MAX;

/// The most entries a queue pair may have: slot numbers fit in 12 bits of the command id.
pub const MAX_QUEUE_ENTRIES: u16 = 1 << SLOT_BITS;

impl<B> Slot<B> {
    pub(super) const fn new() -> Self {
        Slot {
            owner: UNUSED,
            gen: 0,
            req: Request::FREE,
            buf: None,
            meta: None,
        }
    }

    /// Gives this slot (number `slot`) to request `rid`: a new generation; returns the command
    /// id for it.
    #[inline]
    pub(super) fn claim(&mut self, slot: u16, rid: u16) -> u16 {
        self.owner = rid;
        self.gen = self.gen.wrapping_add(1 << SLOT_BITS);
        self.cid(slot)
    }

    /// The command id of the command now in this slot (number `slot`).
    pub(super) const fn cid(&self, slot: u16) -> u16 {
        slot | self.gen
    }
}

/// What a request does, for its error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    Read,
    Write,
    WriteFua,
    Compare,
    Flush,
    WriteZeroes,
    DatasetManagement,
    ZoneReport,
    Zone(crate::zns::ZoneAction),
    ZoneAppend,
    Raw,
}

impl Op {
    /// Whether running the command twice does what running it once does, so that one a reset
    /// interrupted may be submitted again (reads, writes of the same data, flushes, zeroes,
    /// deallocation, compares); not Zone Append (a second append writes elsewhere), zone state
    /// changes or raw commands.
    pub(super) const fn repeatable(self) -> bool {
        matches!(
            self,
            Op::Read
                | Op::Write
                | Op::WriteFua
                | Op::Compare
                | Op::Flush
                | Op::WriteZeroes
                | Op::DatasetManagement
                | Op::ZoneReport
        )
    }

    /// The opcode of a data transfer, and whether it sets FUA.
    #[inline]
    pub(super) const fn io_opcode(self) -> (u8, bool) {
        match self {
            Op::Read => (io_op::READ, false),
            Op::Write => (io_op::WRITE, false),
            Op::WriteFua => (io_op::WRITE, true),
            Op::Compare => (io_op::COMPARE, false),
            Op::Flush => (io_op::FLUSH, false),
            Op::WriteZeroes => (io_op::WRITE_ZEROES, false),
            Op::DatasetManagement => (io_op::DATASET_MANAGEMENT, false),
            Op::ZoneReport => (crate::zns::op::ZONE_MGMT_RECV, false),
            Op::Zone(_) => (crate::zns::op::ZONE_MGMT_SEND, false),
            Op::ZoneAppend => (crate::zns::op::ZONE_APPEND, false),
            // Never used for one: raw commands carry their own opcode.
            Op::Raw => (0xff, false),
        }
    }

    pub(super) const fn name(self) -> &'static str {
        match self {
            Op::Read => "Read",
            Op::Write => "Write",
            Op::WriteFua => "Write (FUA)",
            Op::Compare => "Compare",
            Op::Flush => "Flush",
            Op::WriteZeroes => "Write Zeroes",
            Op::DatasetManagement => "Dataset Management",
            Op::ZoneReport => "Zone Management Receive (Report Zones)",
            Op::Zone(a) => a.name(),
            Op::ZoneAppend => "Zone Append",
            Op::Raw => "raw I/O command",
        }
    }
}

/// A request in flight, in its first command's slot. At most 24 bytes and `Copy`: the hot
/// path writes it whole at submit and touches a few fields at completion.
#[derive(Debug, Clone, Copy)]
pub(super) struct Request {
    pub tag: u64,
    /// When a health check first saw the request in flight, in milliseconds since the queue
    /// pair was created, plus one (0: not seen yet). Submitting reads no clock (a clock read
    /// costs a system call in some guests); timeouts are therefore measured from the first
    /// check after submission, at most one check interval late.
    pub seen_ms: u32,
    /// Commands of the request still in flight; 0 for a free entry.
    pub parts: u16,
    /// The status of the first part that failed; success until one does.
    pub error: Status,
    pub op: Op,
    pub aborted: bool,
    /// Already submitted again once after a controller reset.
    pub resubmitted: bool,
    /// This request's own timeout in milliseconds (0: the queue pair's).
    pub limit_ms: u16,
}

const _: () = assert!(std::mem::size_of::<Request>() <= 24);

impl Request {
    pub(super) const FREE: Request = Request::new(0, 0, Op::Raw);

    #[inline]
    pub(super) const fn new(tag: u64, parts: u16, op: Op) -> Self {
        Request {
            tag,
            seen_ms: 0,
            parts,
            error: Status::SUCCESS,
            op,
            aborted: false,
            resubmitted: false,
            limit_ms: 0,
        }
    }
}
