//! The pipelined loader: block source → N hugepage slots → device memory ([`load`]), and back
//! ([`save`]), with [`verify`] to compare the device's copy with the source.
//!
//! Each slot cycles through two stages. For a load: free → read from the source → copy to the
//! device → free; while slot k is being copied, slots k+1.. are being read. For a save: free →
//! copy from the device → write to the sink → free. One thread drives both sides by polling;
//! nothing is allocated per chunk. When only device copies are outstanding (the source is idle),
//! the thread can sleep on the oldest copy ([`Options::block_when_idle`]) instead of spinning.
//!
//! An error on either side stops new submissions; the pipeline then waits for what is in flight
//! and returns the first error. If nothing completes for [`Options::timeout`] it returns a
//! timeout and marks the slots to be leaked (a device may still write into them): it never
//! hangs on a stuck source or engine, and never frees memory a device may still reach.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use nix::sys::resource::{getrusage, UsageWho};

use crate::engine::CopyEngine;
use crate::error::{CopyError, PipelineError, SourceError, Stage};
use crate::slots::Slots;
use crate::source::{BlockSource, Completion};

/// A transfer between a block source and device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transfer {
    /// Byte offset in the source (a multiple of its block size).
    pub source_offset: u64,
    /// Byte offset in device memory.
    pub device_offset: u64,
    /// Bytes.
    pub len: u64,
}

/// How the pipeline waits.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Give up when nothing completes for this long.
    pub timeout: Duration,
    /// Sleep on the oldest device copy when the source has nothing in flight (lower CPU use);
    /// otherwise spin.
    pub block_when_idle: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            timeout: Duration::from_secs(30),
            block_when_idle: true,
        }
    }
}

/// Which way the data went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Source → device.
    Load,
    /// Device → sink.
    Save,
}

/// How the data reached the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataPath {
    /// Through host (hugepage) slots: the NVMe controller writes the slot, the GPU's copy
    /// engine reads it. Two DMAs, no CPU copy.
    Staged,
    /// Straight from the NVMe controller into GPU memory (peer-to-peer DMA): not implemented
    /// yet, see [`crate::p2p`].
    PeerToPeer,
}

impl std::fmt::Display for DataPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DataPath::Staged => "staged (hugepage slots, no CPU copy)",
            DataPath::PeerToPeer => "peer-to-peer",
        })
    }
}

/// What a load or save did.
#[derive(Debug, Clone)]
pub struct Report {
    /// Load or save.
    pub direction: Direction,
    /// How the data moved.
    pub path: DataPath,
    /// Bytes moved.
    pub bytes: u64,
    /// Wall-clock time, first submission to last completion (and the sink's flush, for a save).
    pub elapsed: Duration,
    /// Chunks (one slot's worth each).
    pub chunks: u64,
    /// CPU time (user + system) of the calling thread.
    pub thread_cpu: Duration,
    /// CPU time of the whole process over the same span (includes other threads, such as an
    /// in-process NVMe model's).
    pub process_cpu: Duration,
    /// Times the thread slept on a device copy instead of spinning.
    pub blocking_waits: u64,
}

impl Report {
    /// Gigabytes (10^9 bytes) per second.
    pub fn gbps(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9) / 1e9
    }

    /// CPU seconds of the calling thread per gigabyte (10^9 bytes).
    pub fn thread_cpu_per_gb(&self) -> f64 {
        self.thread_cpu.as_secs_f64() / (self.bytes as f64 / 1e9).max(1e-12)
    }

    /// CPU seconds of the process per gigabyte.
    pub fn process_cpu_per_gb(&self) -> f64 {
        self.process_cpu.as_secs_f64() / (self.bytes as f64 / 1e9).max(1e-12)
    }

    /// Share of one core the calling thread used (1.0 = one core busy all the time).
    pub fn cores_used(&self) -> f64 {
        self.thread_cpu.as_secs_f64() / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// User + system CPU time of this thread and of the process.
fn cpu_times() -> (Duration, Duration) {
    let t = |who| {
        getrusage(who)
            .map(|u| {
                let d = |tv: nix::sys::time::TimeVal| {
                    Duration::from_secs(tv.tv_sec().max(0) as u64)
                        + Duration::from_micros(tv.tv_usec().max(0) as u64)
                };
                d(u.user_time()) + d(u.system_time())
            })
            .unwrap_or_default()
    };
    (t(UsageWho::RUSAGE_THREAD), t(UsageWho::RUSAGE_SELF))
}

struct Meter {
    start: Instant,
    cpu: (Duration, Duration),
}

impl Meter {
    fn start() -> Self {
        Meter {
            cpu: cpu_times(),
            start: Instant::now(),
        }
    }

    fn report(&self, direction: Direction, bytes: u64, chunks: u64, blocking_waits: u64) -> Report {
        let elapsed = self.start.elapsed();
        let (t, p) = cpu_times();
        Report {
            direction,
            path: DataPath::Staged,
            bytes,
            elapsed,
            chunks,
            thread_cpu: t.saturating_sub(self.cpu.0),
            process_cpu: p.saturating_sub(self.cpu.1),
            blocking_waits,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Free,
    /// In the first stage (read for a load, device copy for a save).
    First {
        pos: u64,
        len: usize,
    },
    /// In the second stage (device copy for a load, write for a save).
    Second {
        pos: u64,
        len: usize,
    },
}

/// The per-slot bookkeeping shared by load and save.
struct Book {
    state: Vec<State>,
    free: Vec<usize>,
    /// Slots in the device-copy stage, oldest first.
    copying: VecDeque<usize>,
    done: Vec<Completion>,
    failure: Option<PipelineError>,
    last_progress: Instant,
    waits: u64,
}

impl Book {
    fn new(n: usize) -> Self {
        Book {
            state: vec![State::Free; n],
            free: (0..n).rev().collect(),
            copying: VecDeque::with_capacity(n),
            done: Vec::with_capacity(n),
            failure: None,
            last_progress: Instant::now(),
            waits: 0,
        }
    }

    fn release(&mut self, slot: usize) {
        self.state[slot] = State::Free;
        self.free.push(slot);
    }

    fn fail(&mut self, e: PipelineError) {
        if self.failure.is_none() {
            log::debug!("transfer stops: {e}");
            self.failure = Some(e);
        }
    }

    fn busy(&self) -> usize {
        self.state.len() - self.free.len()
    }

    /// The end of one pass of `load` or `save`: once nothing is in flight, the first failure
    /// is returned, or `Ok(true)` when every byte is `complete`; otherwise the progress clock
    /// is reset when something moved, or `idle` waits (and times out) when nothing did.
    /// `stages` are the copy stage and the source's stage, for `idle`'s timeout error.
    #[allow(clippy::too_many_arguments)]
    fn end_round(
        &mut self,
        progress: bool,
        complete: bool,
        source: &dyn BlockSource,
        slots: &mut Slots,
        engine: &mut dyn CopyEngine,
        stages: (Stage, Stage),
        o: &Options,
    ) -> Result<bool, PipelineError> {
        if self.busy() == 0 {
            if let Some(e) = self.failure.take() {
                return Err(e);
            }
            if complete {
                return Ok(true);
            }
        }
        if progress {
            self.last_progress = Instant::now();
        } else {
            let source_busy = source.outstanding() != 0;
            self.idle(slots, engine, source_busy, stages.0, stages.1, o)?;
        }
        Ok(false)
    }

    /// After an iteration without progress: times out, or waits a little.
    fn idle(
        &mut self,
        slots: &mut Slots,
        engine: &mut dyn CopyEngine,
        source_busy: bool,
        copy_stage: Stage,
        other_stage: Stage,
        o: &Options,
    ) -> Result<(), PipelineError> {
        let waited = self.last_progress.elapsed();
        if waited > o.timeout {
            slots.leak_on_drop();
            let stage = if self.copying.is_empty() {
                other_stage
            } else {
                copy_stage
            };
            let timeout = PipelineError::Timeout {
                stage,
                waited,
                outstanding: self.busy(),
            };
            return Err(match self.failure.take() {
                Some(first) => {
                    log::error!("{timeout}");
                    first
                }
                None => timeout,
            });
        }
        match self.copying.front() {
            Some(&slot) if o.block_when_idle && !source_busy => {
                self.waits += 1;
                if let Err(e) = engine.wait(slots, slot) {
                    // The next poll of that slot reports the failure with its position.
                    log::debug!("waiting on the copy of slot {slot}: {e}");
                }
            }
            _ => std::hint::spin_loop(),
        }
        Ok(())
    }
}

fn source_err(stage: Stage, offset: u64, len: usize, source: SourceError) -> PipelineError {
    PipelineError::Source {
        stage,
        offset,
        len,
        source,
    }
}

fn copy_err(stage: Stage, offset: u64, len: usize, source: CopyError) -> PipelineError {
    PipelineError::Copy {
        stage,
        offset,
        len,
        source,
    }
}

fn check(
    source: &dyn BlockSource,
    engine: &dyn CopyEngine,
    slots: &Slots,
    t: &Transfer,
    save: bool,
) -> Result<(), PipelineError> {
    let bs = source.block_size() as u64;
    let bad = |why: String| Err(PipelineError::Invalid(why));
    if t.len == 0 {
        return bad("the length is zero".into());
    }
    if !t.source_offset.is_multiple_of(bs) || !(slots.slot_size() as u64).is_multiple_of(bs) {
        return bad(format!(
            "the source offset {} and the slot size {} must be multiples of the source's {bs}-byte blocks",
            t.source_offset,
            slots.slot_size()
        ));
    }
    if save && !t.len.is_multiple_of(bs) {
        return bad(format!(
            "a save writes whole blocks: the length {} is not a multiple of {bs}",
            t.len
        ));
    }
    let end = t.source_offset.checked_add(t.len.next_multiple_of(bs));
    if !save && end.is_none_or(|e| e > source.capacity()) {
        return bad(format!(
            "bytes {}..+{} are outside {} ({} bytes)",
            t.source_offset,
            t.len,
            source.describe(),
            source.capacity()
        ));
    }
    if t.device_offset
        .checked_add(t.len)
        .is_none_or(|e| e > engine.capacity())
    {
        return bad(format!(
            "device bytes {}..+{} are outside the {}-byte device allocation",
            t.device_offset,
            t.len,
            engine.capacity()
        ));
    }
    Ok(())
}

/// Loads `t.len` bytes from `source` at `t.source_offset` into device memory at
/// `t.device_offset`, through `slots`. See the module docs.
pub fn load(
    source: &mut dyn BlockSource,
    engine: &mut dyn CopyEngine,
    slots: &mut Slots,
    t: &Transfer,
    o: &Options,
) -> Result<Report, PipelineError> {
    check(source, engine, slots, t, false)?;
    let (ss, bs) = (slots.slot_size() as u64, source.block_size());
    let meter = Meter::start();
    let mut b = Book::new(slots.count());
    let (mut next, mut finished, mut chunks) = (0u64, 0u64, 0u64);
    loop {
        let mut progress = false;
        // Reads into free slots.
        while b.failure.is_none() && next < t.len {
            let Some(slot) = b.free.pop() else { break };
            let len = (t.len - next).min(ss) as usize;
            match source.submit_read(slots, t.source_offset + next, len.next_multiple_of(bs), slot) {
                Ok(()) => {
                    b.state[slot] = State::First { pos: next, len };
                    next += len as u64;
                    progress = true;
                }
                Err(e) => {
                    b.free.push(slot);
                    b.fail(source_err(Stage::Read, next, len, e));
                }
            }
        }
        // Finished reads go to the device.
        let mut done = std::mem::take(&mut b.done);
        source.poll(slots, &mut done);
        for (slot, r) in done.drain(..) {
            progress = true;
            let Some(&State::First { pos, len }) = b.state.get(slot) else {
                b.fail(PipelineError::Invalid(format!(
                    "the source reported slot {slot}, which it was not reading into"
                )));
                continue;
            };
            match r {
                Err(e) => {
                    b.fail(source_err(Stage::Read, pos, len, e));
                    b.release(slot);
                }
                Ok(()) if b.failure.is_some() => b.release(slot),
                Ok(()) => match engine.submit_h2d(slots, slot, t.device_offset + pos, len) {
                    Ok(()) => {
                        b.state[slot] = State::Second { pos, len };
                        b.copying.push_back(slot);
                    }
                    Err(e) => {
                        b.fail(copy_err(Stage::HostToDevice, pos, len, e));
                        b.release(slot);
                    }
                },
            }
        }
        b.done = done;
        // Finished copies free their slots.
        while let Some(&slot) = b.copying.front() {
            let State::Second { pos, len } = b.state[slot] else {
                unreachable!("copying slots are in the second stage")
            };
            match engine.poll(slots, slot) {
                Ok(false) => break,
                Ok(true) => {
                    finished += len as u64;
                    chunks += 1;
                }
                Err(e) => b.fail(copy_err(Stage::HostToDevice, pos, len, e)),
            }
            b.copying.pop_front();
            b.release(slot);
            progress = true;
        }
        let stages = (Stage::HostToDevice, Stage::Read);
        if b.end_round(progress, finished == t.len, &*source, slots, engine, stages, o)? {
            return Ok(meter.report(Direction::Load, finished, chunks, b.waits));
        }
    }
}

/// Saves `t.len` bytes of device memory at `t.device_offset` to `source` at
/// `t.source_offset`, through `slots`, then flushes the sink. See the module docs.
pub fn save(
    source: &mut dyn BlockSource,
    engine: &mut dyn CopyEngine,
    slots: &mut Slots,
    t: &Transfer,
    o: &Options,
) -> Result<Report, PipelineError> {
    check(source, engine, slots, t, true)?;
    let ss = slots.slot_size() as u64;
    let meter = Meter::start();
    let mut b = Book::new(slots.count());
    let (mut next, mut finished, mut chunks) = (0u64, 0u64, 0u64);
    loop {
        let mut progress = false;
        // Device copies into free slots.
        while b.failure.is_none() && next < t.len {
            let Some(slot) = b.free.pop() else { break };
            let len = (t.len - next).min(ss) as usize;
            match engine.submit_d2h(slots, slot, t.device_offset + next, len) {
                Ok(()) => {
                    b.state[slot] = State::First { pos: next, len };
                    b.copying.push_back(slot);
                    next += len as u64;
                    progress = true;
                }
                Err(e) => {
                    b.free.push(slot);
                    b.fail(copy_err(Stage::DeviceToHost, next, len, e));
                }
            }
        }
        // Finished copies go to the sink.
        while let Some(&slot) = b.copying.front() {
            let State::First { pos, len } = b.state[slot] else {
                unreachable!("copying slots are in the first stage")
            };
            match engine.poll(slots, slot) {
                Ok(false) => break,
                Ok(true) => {
                    source.slot_overwritten(slot);
                    b.copying.pop_front();
                    if b.failure.is_some() {
                        b.release(slot);
                    } else {
                        match source.submit_write(slots, t.source_offset + pos, len, slot) {
                            Ok(()) => b.state[slot] = State::Second { pos, len },
                            Err(e) => {
                                b.fail(source_err(Stage::Write, pos, len, e));
                                b.release(slot);
                            }
                        }
                    }
                }
                Err(e) => {
                    b.fail(copy_err(Stage::DeviceToHost, pos, len, e));
                    b.copying.pop_front();
                    b.release(slot);
                }
            }
            progress = true;
        }
        // Finished writes free their slots.
        let mut done = std::mem::take(&mut b.done);
        source.poll(slots, &mut done);
        for (slot, r) in done.drain(..) {
            progress = true;
            let Some(&State::Second { pos, len }) = b.state.get(slot) else {
                b.fail(PipelineError::Invalid(format!(
                    "the sink reported slot {slot}, which it was not writing from"
                )));
                continue;
            };
            match r {
                Ok(()) => {
                    finished += len as u64;
                    chunks += 1;
                }
                Err(e) => b.fail(source_err(Stage::Write, pos, len, e)),
            }
            b.release(slot);
        }
        b.done = done;
        let stages = (Stage::DeviceToHost, Stage::Write);
        if b.end_round(progress, finished == t.len, &*source, slots, engine, stages, o)? {
            source.flush().map_err(|e| source_err(Stage::Write, 0, 0, e))?;
            return Ok(meter.report(Direction::Save, finished, chunks, b.waits));
        }
    }
}

/// Compares device memory at `t.device_offset` with the source at `t.source_offset`, one slot
/// at a time: the source is read into slot 0, the device copied into slot 1, and the two
/// compared by the CPU. Slow by design (a check, not a transfer); needs two slots.
pub fn verify(
    source: &mut dyn BlockSource,
    engine: &mut dyn CopyEngine,
    slots: &mut Slots,
    t: &Transfer,
    o: &Options,
) -> Result<u64, PipelineError> {
    check(source, engine, slots, t, false)?;
    if slots.count() < 2 {
        return Err(PipelineError::Invalid("verify needs two slots".into()));
    }
    let (ss, bs) = (slots.slot_size() as u64, source.block_size());
    const PIECE: usize = 1 << 20;
    let (mut want, mut got) = (vec![0u8; PIECE], vec![0u8; PIECE]);
    let mut first: Option<(u64, u8, u8)> = None;
    let mut mismatched = 0u64;
    let mut pos = 0u64;
    let mut done = Vec::with_capacity(2);
    while pos < t.len {
        let len = (t.len - pos).min(ss) as usize;
        source
            .submit_read(slots, t.source_offset + pos, len.next_multiple_of(bs), 0)
            .map_err(|e| source_err(Stage::Read, pos, len, e))?;
        let start = Instant::now();
        loop {
            source.poll(slots, &mut done);
            if let Some((_, r)) = done.pop() {
                r.map_err(|e| source_err(Stage::Read, pos, len, e))?;
                break;
            }
            if start.elapsed() > o.timeout {
                slots.leak_on_drop();
                return Err(PipelineError::Timeout {
                    stage: Stage::Read,
                    waited: start.elapsed(),
                    outstanding: 1,
                });
            }
            std::hint::spin_loop();
        }
        engine
            .submit_d2h(slots, 1, t.device_offset + pos, len)
            .map_err(|e| copy_err(Stage::DeviceToHost, pos, len, e))?;
        let start = Instant::now();
        while !engine
            .poll(slots, 1)
            .map_err(|e| copy_err(Stage::DeviceToHost, pos, len, e))?
        {
            if start.elapsed() > o.timeout {
                slots.leak_on_drop();
                return Err(PipelineError::Timeout {
                    stage: Stage::DeviceToHost,
                    waited: start.elapsed(),
                    outstanding: 1,
                });
            }
            engine
                .wait(slots, 1)
                .map_err(|e| copy_err(Stage::DeviceToHost, pos, len, e))?;
        }
        source.slot_overwritten(1);
        let mut off = 0;
        while off < len {
            let n = (len - off).min(PIECE);
            slots.read(0, off, &mut want[..n])?;
            slots.read(1, off, &mut got[..n])?;
            if want[..n] != got[..n] {
                for i in 0..n {
                    if want[i] != got[i] {
                        mismatched += 1;
                        first.get_or_insert((pos + (off + i) as u64, want[i], got[i]));
                    }
                }
            }
            off += n;
        }
        pos += len as u64;
    }
    match first {
        None => Ok(t.len),
        Some((first, expected, found)) => Err(PipelineError::Mismatch {
            first,
            expected,
            found,
            mismatched_bytes: mismatched,
        }),
    }
}
