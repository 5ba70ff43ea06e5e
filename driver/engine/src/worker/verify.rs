//! Verify runs: the phases (write the pattern, read it back), and one I/O's data and
//! metadata, copied into a slot before a write (the pattern) or a read (poison), and out of it
//! after a read to be checked.

use vfpoll_dma::DmaError;

use super::ranges::NsState;
use crate::pattern;
use crate::report::{Mismatch, VerifyReport};
use crate::slots::Slots;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// A perf run.
    Run,
    /// Verify: writing the pattern.
    VerifyWrite,
    /// Verify: reading back.
    VerifyRead,
}

/// A queue's verify state.
pub(super) struct Verify {
    pub(super) phase: Phase,
    /// One I/O's data and metadata, copied out or to be copied in (empty unless verifying).
    scratch: Vec<u8>,
    mscratch: Vec<u8>,
}

impl Verify {
    /// `verify`: whether the job verifies; `data_len`, `meta_len`: one I/O's bytes.
    pub(super) fn new(verify: bool, data_len: usize, meta_len: usize) -> Self {
        match verify {
            true => Verify {
                phase: Phase::VerifyWrite,
                scratch: vec![0; data_len],
                mscratch: vec![0; meta_len],
            },
            false => Verify {
                phase: Phase::Run,
                scratch: Vec::new(),
                mscratch: Vec::new(),
            },
        }
    }

    /// Readies `slot` (and its metadata slot) for an I/O to `lba` of `ns` with pattern `seed`:
    /// a write gets the pattern, a read poison (a read that moves nothing cannot pass for one
    /// through what the slot held before). On error, what it was doing.
    pub(super) fn prepare<S: Slots>(
        &mut self,
        slots: &mut S,
        mslots: Option<&mut S>,
        slot: usize,
        (write, lba): (bool, u64),
        ns: &NsState,
        seed: u64,
    ) -> Result<(), (&'static str, DmaError)> {
        let what = if write {
            "filling a buffer"
        } else {
            "poisoning a buffer"
        };
        if write {
            pattern::fill(&mut self.scratch, ns.block_bytes, lba, ns.nsid, seed);
        } else {
            self.scratch.fill(0xee);
        }
        slots.store(slot, &self.scratch).map_err(|e| (what, e))?;
        if let Some(m) = mslots {
            if write {
                pattern::fill_meta(&mut self.mscratch, ns.meta_bytes, lba, ns.nsid, seed);
            } else {
                self.mscratch.fill(0xee);
            }
            m.store(slot, &self.mscratch).map_err(|e| (what, e))?;
        }
        Ok(())
    }

    /// Checks the read in `slot` (and its metadata slot) of `lba` in `ns` against pattern
    /// `seed`, into `v` (`device` names the device in its mismatch samples).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn check<S: Slots>(
        &mut self,
        slots: &S,
        mslots: Option<&S>,
        slot: usize,
        lba: u64,
        ns: &NsState,
        seed: u64,
        (device, v): (&str, &mut VerifyReport),
    ) -> Result<(), DmaError> {
        slots.load(slot, &mut self.scratch)?;
        if let Some(m) = mslots {
            m.load(slot, &mut self.mscratch)?;
        }
        v.blocks_checked += ns.io_blocks;
        let nsid = ns.nsid;
        let mut bad = |lba, found| {
            if v.samples.len() < VerifyReport::MAX_SAMPLES {
                v.samples.push(Mismatch {
                    device: device.to_string(),
                    nsid,
                    lba,
                    found,
                });
            }
        };
        let mut wrong = pattern::check(
            &self.scratch,
            ns.block_bytes,
            lba,
            nsid,
            seed,
            ns.data_skip.clone(),
            &mut bad,
        );
        if ns.meta_bytes != 0 {
            wrong += pattern::check_meta(
                &self.mscratch,
                ns.meta_bytes,
                lba,
                nsid,
                seed,
                ns.meta_skip.clone(),
                &mut bad,
            );
        }
        v.mismatches += wrong;
        Ok(())
    }
}
