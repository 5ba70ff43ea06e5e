//! [`MemSource`]: a block source over ordinary memory, with delays, out-of-order completion and
//! injected faults, for testing the pipeline (and code built on it) without a device.

use std::collections::VecDeque;

use crate::error::SourceError;
use crate::slots::Slots;
use crate::source::{BlockSource, Completion};

/// A fault injected into request number `n` (from 0, reads and writes together).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceFault {
    /// The submission fails.
    Submit,
    /// The request completes with an error (after moving nothing).
    Complete,
    /// The request never completes.
    Hang,
}

#[derive(Debug, Clone, Copy)]
struct Req {
    slot: usize,
    offset: usize,
    len: usize,
    write: bool,
    polls_left: u32,
    fault: Option<SourceFault>,
}

/// A "disk" in a `Vec<u8>`. Data moves when a request completes (as a device's DMA would have
/// by then), after `delay` polls; with `reverse`, the requests ready in one poll complete
/// newest first.
#[derive(Debug)]
pub struct MemSource {
    data: Vec<u8>,
    block: usize,
    delay: u32,
    reverse: bool,
    queue: VecDeque<Req>,
    faults: Vec<(u64, SourceFault)>,
    submitted: u64,
    /// Largest number of requests in flight at once.
    pub max_outstanding: usize,
}

impl MemSource {
    /// A source holding `data`, with `block`-byte blocks.
    pub fn new(data: Vec<u8>, block: usize) -> Self {
        MemSource {
            data,
            block,
            delay: 0,
            reverse: false,
            queue: VecDeque::new(),
            faults: Vec::new(),
            submitted: 0,
            max_outstanding: 0,
        }
    }

    /// Requests complete after `polls` polls.
    pub fn with_delay(mut self, polls: u32) -> Self {
        self.delay = polls;
        self
    }

    /// Requests ready together complete newest first.
    pub fn reversed(mut self) -> Self {
        self.reverse = true;
        self
    }

    /// Injects `fault` into request `nth`.
    pub fn inject(&mut self, nth: u64, fault: SourceFault) {
        self.faults.push((nth, fault));
    }

    /// The data.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    fn submit(&mut self, offset: u64, len: usize, slot: usize, write: bool) -> Result<(), SourceError> {
        let offset = offset as usize;
        if !offset.is_multiple_of(self.block) || !len.is_multiple_of(self.block) {
            return Err(SourceError::Invalid(format!(
                "{len} bytes at {offset}: not whole {}-byte blocks",
                self.block
            )));
        }
        if offset + len > self.data.len() {
            return Err(SourceError::Invalid(format!(
                "{len} bytes at {offset}: past the end ({})",
                self.data.len()
            )));
        }
        if self.queue.iter().any(|r| r.slot == slot) {
            return Err(SourceError::Invalid(format!("slot {slot} is busy")));
        }
        let n = self.submitted;
        self.submitted += 1;
        let fault = self.faults.iter().find(|f| f.0 == n).map(|f| f.1);
        if fault == Some(SourceFault::Submit) {
            return Err(SourceError::Injected(format!("request {n} refused")));
        }
        self.queue.push_back(Req {
            slot,
            offset,
            len,
            write,
            polls_left: self.delay,
            fault,
        });
        self.max_outstanding = self.max_outstanding.max(self.queue.len());
        Ok(())
    }
}

impl BlockSource for MemSource {
    fn describe(&self) -> String {
        format!("memory ({} bytes)", self.data.len())
    }

    fn block_size(&self) -> usize {
        self.block
    }

    fn capacity(&self) -> u64 {
        self.data.len() as u64
    }

    fn submit_read(
        &mut self,
        _slots: &mut Slots,
        offset: u64,
        len: usize,
        slot: usize,
    ) -> Result<(), SourceError> {
        self.submit(offset, len, slot, false)
    }

    fn submit_write(
        &mut self,
        _slots: &mut Slots,
        offset: u64,
        len: usize,
        slot: usize,
    ) -> Result<(), SourceError> {
        self.submit(offset, len, slot, true)
    }

    fn poll(&mut self, slots: &mut Slots, done: &mut Vec<Completion>) {
        let mut ready = Vec::new();
        self.queue.retain_mut(|r| {
            if r.fault == Some(SourceFault::Hang) {
                return true;
            }
            if r.polls_left > 0 {
                r.polls_left -= 1;
                return true;
            }
            ready.push(*r);
            false
        });
        if self.reverse {
            ready.reverse();
        }
        for r in ready {
            let result = if r.fault == Some(SourceFault::Complete) {
                Err(SourceError::Injected(format!(
                    "request for slot {} failed",
                    r.slot
                )))
            } else if r.write {
                slots
                    .read(r.slot, 0, &mut self.data[r.offset..r.offset + r.len])
                    .map_err(SourceError::from)
            } else {
                slots
                    .write(r.slot, 0, &self.data[r.offset..r.offset + r.len])
                    .map_err(SourceError::from)
            };
            done.push((r.slot, result));
        }
    }

    fn outstanding(&self) -> usize {
        self.queue.len()
    }
}
