//! The device side of a transfer: [`CopyEngine`] copies between slots and device memory
//! asynchronously, one copy per slot at a time. `cuda::CudaEngine` is the GPU (feature
//! `cuda`); [`CpuEngine`] is a stand-in that copies into ordinary memory, so the pipeline can
//! be tested, and run, without a GPU.

use crate::error::CopyError;
use crate::slots::Slots;

/// Copies between slots and device memory. Driven by one thread: submit, then poll.
///
/// A slot given to `submit_h2d` or `submit_d2h` belongs to the engine until `poll` says the
/// copy finished (or failed); the pipeline does not touch it meanwhile.
pub trait CopyEngine {
    /// What it is, for reports ("NVIDIA H200 (GPU 0)").
    fn describe(&self) -> String;
    /// Bytes of device memory it copies to and from.
    fn capacity(&self) -> u64;
    /// Starts copying the first `len` bytes of `slot` to device byte `dev_offset`.
    fn submit_h2d(
        &mut self,
        slots: &Slots,
        slot: usize,
        dev_offset: u64,
        len: usize,
    ) -> Result<(), CopyError>;
    /// Starts copying `len` bytes at device byte `dev_offset` into the start of `slot`.
    fn submit_d2h(
        &mut self,
        slots: &mut Slots,
        slot: usize,
        dev_offset: u64,
        len: usize,
    ) -> Result<(), CopyError>;
    /// Whether the copy of `slot` has finished; never blocks.
    fn poll(&mut self, slots: &mut Slots, slot: usize) -> Result<bool, CopyError>;
    /// Sleeps until the copy of `slot` may have finished (then `poll` tells), instead of
    /// spinning; engines that cannot sleep return at once.
    fn wait(&mut self, slots: &mut Slots, slot: usize) -> Result<(), CopyError>;
}

/// A fault the [`CpuEngine`] injects into its `n`th copy (counting from 0, both directions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyFault {
    /// The submission fails.
    Submit,
    /// The copy is accepted, then completes with an error.
    Complete,
    /// The copy is accepted and never completes.
    Hang,
}

#[derive(Debug, Clone, Copy)]
struct CpuCopy {
    to_device: bool,
    dev_offset: usize,
    len: usize,
    polls_left: u32,
    fault: Option<CopyFault>,
}

/// A [`CopyEngine`] whose device memory is an ordinary buffer. A copy moves its bytes when it
/// completes (not when submitted), after `delay` polls, so a pipeline that reused a slot too
/// early copies the wrong data and is caught.
#[derive(Debug)]
pub struct CpuEngine {
    mem: Vec<u8>,
    copies: Vec<Option<CpuCopy>>,
    delay: u32,
    faults: Vec<(u64, CopyFault)>,
    submitted: u64,
}

impl CpuEngine {
    /// `size` bytes of zeroed "device" memory; copies complete on their first poll.
    pub fn new(size: usize) -> Self {
        CpuEngine {
            mem: vec![0; size],
            copies: Vec::new(),
            delay: 0,
            faults: Vec::new(),
            submitted: 0,
        }
    }

    /// Copies complete only after `polls` polls that found them unfinished.
    pub fn with_delay(mut self, polls: u32) -> Self {
        self.delay = polls;
        self
    }

    /// Injects `fault` into copy number `nth` (from 0).
    pub fn inject(&mut self, nth: u64, fault: CopyFault) {
        self.faults.push((nth, fault));
    }

    /// The device memory.
    pub fn memory(&self) -> &[u8] {
        &self.mem
    }

    /// The device memory, to seed it.
    pub fn memory_mut(&mut self) -> &mut [u8] {
        &mut self.mem
    }

    fn submit(
        &mut self,
        slots: &Slots,
        slot: usize,
        dev_offset: u64,
        len: usize,
        to_device: bool,
    ) -> Result<(), CopyError> {
        let oob = CopyError::OutOfBounds {
            offset: dev_offset,
            len,
            size: self.mem.len() as u64,
        };
        let off = usize::try_from(dev_offset).map_err(|_| oob)?;
        if off.checked_add(len).is_none_or(|end| end > self.mem.len()) {
            return Err(CopyError::OutOfBounds {
                offset: dev_offset,
                len,
                size: self.mem.len() as u64,
            });
        }
        slots.ptr(slot, 0, len)?;
        if self.copies.len() < slots.count() {
            self.copies.resize(slots.count(), None);
        }
        if self.copies[slot].is_some() {
            return Err(CopyError::Injected(format!(
                "slot {slot} already has a copy in flight"
            )));
        }
        let n = self.submitted;
        self.submitted += 1;
        let fault = self.faults.iter().find(|f| f.0 == n).map(|f| f.1);
        if fault == Some(CopyFault::Submit) {
            return Err(CopyError::Injected(format!("copy {n} refused")));
        }
        self.copies[slot] = Some(CpuCopy {
            to_device,
            dev_offset: off,
            len,
            polls_left: self.delay,
            fault,
        });
        Ok(())
    }
}

impl CopyEngine for CpuEngine {
    fn describe(&self) -> String {
        format!("CPU stand-in ({} bytes of ordinary memory)", self.mem.len())
    }

    fn capacity(&self) -> u64 {
        self.mem.len() as u64
    }

    fn submit_h2d(
        &mut self,
        slots: &Slots,
        slot: usize,
        dev_offset: u64,
        len: usize,
    ) -> Result<(), CopyError> {
        self.submit(slots, slot, dev_offset, len, true)
    }

    fn submit_d2h(
        &mut self,
        slots: &mut Slots,
        slot: usize,
        dev_offset: u64,
        len: usize,
    ) -> Result<(), CopyError> {
        self.submit(slots, slot, dev_offset, len, false)
    }

    fn poll(&mut self, slots: &mut Slots, slot: usize) -> Result<bool, CopyError> {
        let Some(c) = self.copies.get_mut(slot).and_then(|c| c.as_mut()) else {
            return Err(CopyError::Injected(format!("slot {slot} has no copy in flight")));
        };
        if c.fault == Some(CopyFault::Hang) {
            return Ok(false);
        }
        if c.polls_left > 0 {
            c.polls_left -= 1;
            return Ok(false);
        }
        let c = self.copies[slot].take().expect("checked above");
        if c.fault == Some(CopyFault::Complete) {
            return Err(CopyError::Injected(format!("copy of slot {slot} failed")));
        }
        let dev = &mut self.mem[c.dev_offset..c.dev_offset + c.len];
        if c.to_device {
            slots.read(slot, 0, dev)?;
        } else {
            slots.write(slot, 0, dev)?;
        }
        Ok(true)
    }

    fn wait(&mut self, _slots: &mut Slots, _slot: usize) -> Result<(), CopyError> {
        Ok(())
    }
}
