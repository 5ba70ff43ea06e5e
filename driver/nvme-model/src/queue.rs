//! Queue entries and ring state (NVMe Base 2.0 §3.3, §4.1 and §4.2; NVMe over PCIe 1.0 §3.5).

use std::collections::VecDeque;

use crate::Status;

/// Size of a submission queue entry (SQES = 6).
pub(crate) const SQE_SIZE: u64 = vfpoll_nvme_spec::cmd::SQE_SIZE as u64;
/// Size of a completion queue entry (CQES = 4).
pub(crate) const CQE_SIZE: u64 = vfpoll_nvme_spec::cmd::CQE_SIZE as u64;

/// A submission queue entry, copied out of host memory ([`Command::from_le_bytes`]).
pub(crate) use vfpoll_nvme_spec::cmd::Command;

/// How a completion is to be written (the faults that change the writing itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PostMode {
    Normal,
    /// Written twice.
    Duplicate,
    /// Written with the phase inverted, then the CQ stalls.
    WrongPhase,
}

/// A completion on its way to a completion queue.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Completion {
    /// Dwords 0 and 1: command specific (DW1 is the upper half of a Zone Append's LBA).
    pub(crate) dw0: u32,
    pub(crate) dw1: u32,
    pub(crate) sqid: u16,
    /// The CID written into the entry (a `BogusCid` fault changes it).
    pub(crate) cid: u16,
    /// The command's own CID (what Abort names).
    pub(crate) orig_cid: u16,
    pub(crate) status: Status,
    pub(crate) mode: PostMode,
    /// SQ head when the command was fetched: reported if the SQ is gone by the time of posting.
    pub(crate) sq_head: u16,
}

/// An I/O or admin submission queue.
#[derive(Debug)]
pub(crate) struct Sq {
    pub(crate) base: u64,
    pub(crate) size: u32,
    pub(crate) head: u32,
    /// The tail last taken from a doorbell.
    pub(crate) tail: u32,
    pub(crate) cqid: u16,
    /// Last values read from the MMIO doorbell and the shadow doorbell (to see changes).
    pub(crate) mmio_db: u32,
    pub(crate) shadow_db: u32,
}

impl Sq {
    pub(crate) fn new(base: u64, size: u32, cqid: u16) -> Self {
        Sq {
            base,
            size,
            head: 0,
            tail: 0,
            cqid,
            mmio_db: 0,
            shadow_db: 0,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.head == self.tail
    }

    /// Address of the entry at the head.
    pub(crate) fn head_addr(&self) -> u64 {
        self.base + self.head as u64 * SQE_SIZE
    }

    pub(crate) fn advance(&mut self) {
        self.head = (self.head + 1) % self.size;
    }
}

/// An I/O or admin completion queue.
#[derive(Debug)]
pub(crate) struct Cq {
    pub(crate) base: u64,
    pub(crate) size: u32,
    pub(crate) tail: u32,
    /// The head last taken from a doorbell.
    pub(crate) head: u32,
    pub(crate) phase: bool,
    /// A wrong-phase entry was written: nothing more is posted (see `FaultKind::WrongPhase`).
    pub(crate) stalled: bool,
    /// Completions promised to this queue and held back (delayed), not yet posted.
    pub(crate) owed: u32,
    /// Completions waiting for room, in order.
    pub(crate) backlog: VecDeque<Completion>,
    /// Submission queues using this completion queue.
    pub(crate) sqs: u32,
    pub(crate) mmio_db: u32,
    pub(crate) shadow_db: u32,
    /// The vector's eventfd when created with IEN = 1 (NVMe Base 2.0 §5.4).
    pub(crate) irq: Option<std::sync::Arc<vfpoll_pci::vfio::EventFd>>,
}

impl Cq {
    pub(crate) fn new(base: u64, size: u32) -> Self {
        Cq {
            base,
            size,
            tail: 0,
            head: 0,
            phase: true,
            stalled: false,
            owed: 0,
            backlog: VecDeque::with_capacity(size as usize),
            sqs: 0,
            mmio_db: 0,
            shadow_db: 0,
            irq: None,
        }
    }

    /// Free slots: a queue of `size` entries holds at most `size - 1` (§4.1.3, full when
    /// `tail + 1 == head` modulo size).
    pub(crate) fn free(&self) -> u32 {
        let used = (self.tail + self.size - self.head) % self.size;
        self.size - 1 - used
    }

    /// Whether a command whose completion goes here may be fetched now: its completion will
    /// find a slot after everything already owed and waiting.
    pub(crate) fn has_room(&self) -> bool {
        !self.stalled && self.free() as usize > self.owed as usize + self.backlog.len()
    }

    pub(crate) fn tail_addr(&self) -> u64 {
        self.base + self.tail as u64 * CQE_SIZE
    }

    /// Sends the queue's interrupt after an entry was posted: one MSI-X message per entry, as
    /// QEMU's controller does without interrupt coalescing.
    pub(crate) fn interrupt(&self) {
        if let Some(e) = &self.irq {
            if let Err(err) = e.signal() {
                log::warn!("interrupt eventfd: {err}");
            }
        }
    }

    pub(crate) fn advance(&mut self) {
        self.tail += 1;
        if self.tail == self.size {
            self.tail = 0;
            self.phase = !self.phase;
        }
    }
}

/// Dwords of a completion queue entry (NVMe Base 2.0 §4.2, Figure 96): DW0 and DW1 command
/// specific, DW2 SQ head and SQ ID, DW3 CID, phase tag (bit 16) and status (31:17).
pub(crate) fn cqe_dwords(c: &Completion, sq_head: u16, phase: bool) -> [u32; 4] {
    vfpoll_nvme_spec::cmd::Completion {
        dw0: c.dw0,
        dw1: c.dw1,
        sq_head,
        sq_id: c.sqid,
        cid: c.cid,
        status: c.status.to_spec().field() | phase as u16,
    }
    .to_dwords()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_math_wraps() {
        let mut cq = Cq::new(0, 4);
        assert_eq!(cq.free(), 3);
        for _ in 0..3 {
            cq.advance();
        }
        assert_eq!(cq.free(), 0);
        assert!(!cq.has_room());
        cq.head = 3;
        assert_eq!(cq.free(), 3);
        cq.advance();
        assert_eq!((cq.tail, cq.phase), (0, false), "the phase flips on wrap-around");
        assert_eq!(cq.free(), 2);
        cq.owed = 1;
        assert!(cq.has_room());
        cq.owed = 2;
        assert!(!cq.has_room());
    }

    #[test]
    fn command_fields() {
        let mut b = [0u8; 64];
        b[0..4].copy_from_slice(&0x1234_4002u32.to_le_bytes());
        b[24..32].copy_from_slice(&0x1_0000_2000u64.to_le_bytes());
        b[39] = 0x30;
        let c = Command::from_le_bytes(&b);
        assert_eq!((c.opcode(), c.psdt(), c.cid(), c.fuse()), (0x02, 1, 0x1234, 0));
        assert_eq!(c.prp1(), 0x1_0000_2000);
        assert_eq!(c.sgl1()[15], 0x30);
    }
}
