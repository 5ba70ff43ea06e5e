//! One submission/completion queue pair at the ring level (NVMe Base 2.0 §3.3.1, §4.1): slots,
//! tail and head pointers, the phase tag, doorbells. Request tracking lives above it.

use vfpoll_pci::mmio::Mmio;

#[cfg(doc)]
use crate::cmd::Command;
use crate::cmd::Completion;
use crate::qmem::{wmb, QueueMem, ShadowSlot};
use crate::regs;

/// What [`Ring::ring_sq`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rung {
    /// Nothing to announce.
    Nothing,
    /// The shadow doorbell only (the controller's EventIdx asked for no MMIO write).
    Shadow,
    /// The MMIO doorbell.
    Mmio,
    /// Not announced: the controller no longer knows the queue (a reset); nothing changed.
    Stale,
}

/// What [`Ring::ring_sq`] did, counted.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SqDoorbells {
    /// MMIO writes.
    pub mmio: u64,
    /// Updates of the shadow doorbell alone (the controller's EventIdx asked for no MMIO
    /// write).
    pub shadow_only: u64,
}

/// Ring state of a queue pair. Hot fields first.
#[derive(Debug)]
pub(crate) struct Ring {
    // The SQ tail, the CQ head and its phase tag are the queue memory's (`QueueMem::sq_tail`,
    // `QueueMem::cq_head`): it stores and loads at them unchecked.
    /// The controller's SQ head, from the last completion.
    pub sq_head: u16,
    pub entries: u16,
    /// Commands written since the last SQ doorbell.
    pub unrung: u16,
    /// Completions consumed since the last CQ doorbell.
    pub unacked: u16,
    /// Completions consumed before those (`unacked` is added here whenever it goes back to 0):
    /// the count of completions consumed is `released + unacked`, so consuming one costs only
    /// the `unacked` increment.
    released: u64,
    sq_db: Mmio,
    cq_db: Mmio,
    /// Shadow doorbells, when Doorbell Buffer Config is on: the MMIO doorbell is written only
    /// when the controller's EventIdx asks for it.
    shadow: Option<ShadowSlot>,
    pub qid: u16,
    /// What the SQ doorbell did.
    pub sq_rung: SqDoorbells,
}

impl Ring {
    pub(crate) fn new(bar: &Mmio, stride: usize, qid: u16, entries: u16) -> Self {
        let window = |off| bar.window(off, 4).expect("doorbell inside BAR0");
        Ring {
            sq_head: 0,
            entries,
            unrung: 0,
            unacked: 0,
            released: 0,
            sq_db: window(regs::sq_tail_doorbell(qid, stride)),
            cq_db: window(regs::cq_head_doorbell(qid, stride)),
            shadow: None,
            qid,
            sq_rung: SqDoorbells::default(),
        }
    }

    /// Back to the state of a newly created queue (tail, head and the controller's SQ head 0,
    /// phase tag 1), for a queue re-created in place after a controller reset; the shadow
    /// doorbell words are zeroed too (a stale EventIdx would suppress the first MMIO doorbells,
    /// a stale shadow tail would be read as new commands).
    pub(crate) fn reset(&mut self, mem: &mut QueueMem) {
        mem.set_sq_tail(0);
        mem.reset_cq();
        self.sq_head = 0;
        self.unrung = 0;
        self.released += self.unacked as u64;
        self.unacked = 0;
        if let Some(s) = &self.shadow {
            s.reset();
        }
    }

    /// The SQ slot of the command written `back` commands before the tail (1: the last one).
    pub(crate) fn slot_back(&self, mem: &QueueMem, back: u16) -> u16 {
        (mem.sq_tail() + self.entries - back) % self.entries
    }

    /// Uses shadow doorbells for this queue.
    pub(crate) fn set_shadow(&mut self, slot: ShadowSlot) {
        self.shadow = Some(slot);
    }

    /// Writes a command (its eight 64-bit words, see [`Command::to_words`]) at the tail and
    /// advances it. The caller guarantees a free slot (it keeps at most `entries - 1` commands
    /// outstanding). The doorbell is not rung.
    #[inline]
    pub(crate) fn push(&mut self, mem: &mut QueueMem, words: &[u64; 8]) {
        mem.push_sqe(words);
        self.unrung += 1;
    }

    /// Submission queue slots the controller has not told us it consumed yet, by the SQ head
    /// of the last completion (NVMe Base 2.0 §4.1: the queue is full when the tail is one
    /// behind the head).
    pub(crate) fn sq_used(&self, mem: &QueueMem) -> u16 {
        (mem.sq_tail() + self.entries - self.sq_head) % self.entries
    }

    /// Takes back the last `n` commands written and not yet announced by a doorbell.
    pub(crate) fn unpush(&mut self, mem: &mut QueueMem, n: u16) {
        assert!(
            n <= self.unrung,
            "only commands behind the last doorbell can be taken back"
        );
        mem.set_sq_tail((mem.sq_tail() + self.entries - n) % self.entries);
        self.unrung -= n;
    }

    /// Announces the commands written since the last call: the one place an SQ tail doorbell
    /// is rung (NVMe Base 2.0 §3.1.3.x SQyTDBL). With shadow doorbells (Doorbell Buffer Config,
    /// §5.8) the tail goes to the shadow doorbell, whose update orders it after the entries,
    /// and that is all unless the controller's EventIdx asks for the MMIO write too; without
    /// them a write barrier orders the entries before the MMIO write. The MMIO write is made
    /// only if `live()` still says the controller knows this queue (checked only there: a
    /// shadow update is host memory, which a controller that does not know the queue never
    /// reads); otherwise the commands stay unrung.
    #[inline(always)]
    pub(crate) fn ring_sq(&mut self, tail: u16, live: impl FnOnce() -> bool) -> Rung {
        if self.unrung == 0 {
            return Rung::Nothing;
        }
        if let Some(s) = &self.shadow {
            if !s.update(false, tail) {
                self.unrung = 0;
                self.sq_rung.shadow_only += 1;
                return Rung::Shadow;
            }
        }
        self.ring_sq_mmio(tail, live)
    }

    /// The MMIO write of [`Ring::ring_sq`] (no shadow doorbells, or the controller's EventIdx
    /// asked for it), with its barrier and `live` check: out of line, so that the shadow-only
    /// path, the common one with shadow doorbells, loads nothing for it.
    #[inline(never)]
    fn ring_sq_mmio(&mut self, tail: u16, live: impl FnOnce() -> bool) -> Rung {
        if self.shadow.is_none() {
            wmb();
        }
        if !live() {
            return Rung::Stale;
        }
        self.unrung = 0;
        self.sq_db.write32(0, tail as u32);
        self.sq_rung.mmio += 1;
        Rung::Mmio
    }

    /// Takes the shadow doorbells away (MMIO doorbells only) until [`Ring::attach_shadow`]:
    /// for a queue a reset took, so that every doorbell goes through `ring_sq`'s `live` check.
    pub(crate) fn detach_shadow(&mut self) -> Option<ShadowSlot> {
        self.shadow.take()
    }

    /// Gives the shadow doorbells back.
    pub(crate) fn attach_shadow(&mut self, slot: Option<ShadowSlot>) {
        if slot.is_some() {
            self.shadow = slot;
        }
    }

    /// The next completion if its phase tag says the controller posted it; advances the head.
    #[inline]
    pub(crate) fn pop(&mut self, mem: &mut QueueMem) -> Option<Completion> {
        let c = mem.pop_cqe()?;
        self.sq_head = c.sq_head;
        self.unacked += 1;
        Some(c)
    }

    /// Completions consumed since the queue was created.
    pub(crate) fn consumed(&self) -> u64 {
        self.released + self.unacked as u64
    }

    /// Whether the controller has posted the next completion (no side effect).
    #[inline]
    pub(crate) fn has_completion(&self, mem: &QueueMem) -> bool {
        mem.cqe_posted()
    }

    /// Releases the completion entries consumed since the last call (shadow doorbell and, when
    /// needed, MMIO). Returns whether an MMIO write was made.
    #[inline]
    pub(crate) fn ring_cq(&mut self, mem: &QueueMem) -> bool {
        if self.unacked == 0 {
            return false;
        }
        self.released += self.unacked as u64;
        self.unacked = 0;
        if let Some(s) = &self.shadow {
            if !s.update(true, mem.cq_head()) {
                return false;
            }
        }
        self.cq_db.write32(0, mem.cq_head() as u32);
        true
    }
}
