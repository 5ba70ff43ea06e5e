//! The admin queue (NVMe Base 2.0 §3.3.1.1): one command at a time, polled to completion with a
//! deadline. Admin commands are control path; the controller serialises them behind a mutex.
//!
//! Besides: commands submitted without waiting (`AdminQueue::submit`, collected later with
//! `AdminQueue::take`), for callers that must not block, such as a polling thread that asks
//! for an Abort or re-creates its queues after a controller reset; whoever next holds the queue
//! reaps their completions, and they stay until taken.

use std::time::{Duration, Instant};

use vfpoll_dma::{DmaContext, DmaRegion, PageSize};
use vfpoll_pci::mmio::Mmio;
use vfpoll_pci::BusAddr;

use crate::cmd::{Command, Completion, DataPtr};
use crate::cmd::{CQE_SIZE, SQE_SIZE};
use crate::error::{NvmeError, Result};
use crate::prp::{self, PrpListMem};
use crate::qmem::Layout;
use crate::qmem::QueueMem;
use crate::queue::Ring;

/// Bytes of the admin data buffer: the largest admin transfer vfpoll makes (log pages, identify).
pub const ADMIN_DATA_BYTES: usize = 64 * 1024;
const PAGE: usize = 4096;

/// Direction of an admin data transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataDir {
    /// No data.
    None,
    /// Controller to host (Identify, Get Log Page), this many bytes.
    FromDevice(usize),
    /// Host to controller, these bytes.
    ToDevice,
}

/// The spec's name of an admin opcode, for error messages.
pub fn name_of(opcode: u8) -> &'static str {
    use crate::cmd::admin_op::*;
    match opcode {
        DELETE_IO_SQ => "Delete I/O Submission Queue",
        CREATE_IO_SQ => "Create I/O Submission Queue",
        GET_LOG_PAGE => "Get Log Page",
        DELETE_IO_CQ => "Delete I/O Completion Queue",
        CREATE_IO_CQ => "Create I/O Completion Queue",
        IDENTIFY => "Identify",
        ABORT => "Abort",
        SET_FEATURES => "Set Features",
        GET_FEATURES => "Get Features",
        DOORBELL_BUFFER_CONFIG => "Doorbell Buffer Config",
        FORMAT_NVM => "Format NVM",
        ASYNC_EVENT_REQUEST => "Asynchronous Event Request",
        _ => "admin command",
    }
}

pub(crate) struct AdminQueue {
    ring: Ring,
    mem: QueueMem,
    next_cid: u16,
    timeout: Duration,
    /// The PRP list page and the data buffer of the next command.
    data: DmaRegion,
    /// Data buffers of commands that timed out, by command id: the controller may still write
    /// them, so they are never reused; each is freed when its command's late completion
    /// arrives (or never, if it does not).
    quarantine: Vec<(u16, DmaRegion)>,
    /// Command ids of the Asynchronous Event Requests outstanding.
    events: Vec<u16>,
    /// Completed Asynchronous Event Requests not handled yet.
    fired: Vec<Completion>,
    /// Commands submitted without waiting, until taken.
    pending: Vec<Pending>,
    dma: DmaContext,
    page_size: PageSize,
}

impl std::fmt::Debug for AdminQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "AdminQueue(entries={}, next_cid={}, quarantined={})",
            self.ring.entries,
            self.next_cid,
            self.quarantine.len()
        )
    }
}

/// A command submitted with [`AdminQueue::submit`].
#[derive(Debug)]
struct Pending {
    cid: u16,
    opcode: u8,
    since: Instant,
    done: Option<Completion>,
}

/// What became of a command submitted with [`AdminQueue::submit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Taken {
    /// It completed (with whatever status); it is forgotten now.
    Done(Completion),
    /// Still running, submitted this long ago.
    Running(Duration),
    /// Unknown: never submitted, or lost in a controller reset.
    Lost,
}

/// Command ids from here up belong to Asynchronous Event Requests, which stay outstanding
/// across other commands; ordinary commands never use them.
const EVENT_CIDS: u16 = 0xfff0;

/// Offset of the data buffer in the data region; the PRP list page comes first.
const DATA_OFF: usize = PAGE;

/// The PRP list page at the start of the data region.
struct AdminList<'a> {
    region: &'a mut DmaRegion,
}

impl PrpListMem for AdminList<'_> {
    fn pages(&self) -> usize {
        1
    }
    fn page_bus(&self, _page: usize) -> BusAddr {
        self.region.bus_addr(0)
    }
    fn write(&mut self, _page: usize, idx: usize, entry: BusAddr) {
        self.region
            .write(idx * 8, &entry.get().to_le_bytes())
            .expect("a PRP list entry inside the list page");
    }
}

impl AdminQueue {
    /// Allocates the admin queue memory (SQ and CQ) and the data region (one PRP list page and
    /// the data buffer).
    pub(crate) fn new(
        bar: &Mmio,
        stride: usize,
        dma: &DmaContext,
        page_size: PageSize,
        entries: u16,
        timeout: Duration,
    ) -> Result<(Self, BusAddr, BusAddr)> {
        let sq = (entries as usize * SQE_SIZE).next_multiple_of(PAGE);
        let cq = (entries as usize * CQE_SIZE).next_multiple_of(PAGE);
        let region = dma.alloc_region(sq + cq, page_size)?;
        let mem = QueueMem::new(
            region,
            Layout {
                sq_off: 0,
                cq_off: sq,
                entries,
            },
        );
        let (asq, acq) = (mem.bus(0), mem.bus(sq));
        let q = AdminQueue {
            ring: Ring::new(bar, stride, 0, entries),
            mem,
            next_cid: 0,
            timeout,
            data: Self::data_region(dma, page_size)?,
            quarantine: Vec::new(),
            events: Vec::new(),
            fired: Vec::new(),
            pending: Vec::new(),
            dma: dma.clone(),
            page_size,
        };
        Ok((q, asq, acq))
    }

    fn data_region(dma: &DmaContext, page_size: PageSize) -> Result<DmaRegion> {
        let r = dma.alloc_region(DATA_OFF + ADMIN_DATA_BYTES, page_size)?;
        // One contiguous range, so any transfer's pages are the region's pages in order.
        if r.contiguous_len(0) < DATA_OFF + ADMIN_DATA_BYTES {
            return Err(NvmeError::InvalidOption(format!(
                "the admin data buffer needs {} bus-contiguous bytes; use {} pages or larger",
                DATA_OFF + ADMIN_DATA_BYTES,
                PageSize::Huge2M
            )));
        }
        Ok(r)
    }

    /// Never free the queue's memory: the controller may still use it.
    pub(crate) fn leak(&mut self) {
        self.mem.leak();
        let data = std::mem::replace(&mut self.data, Self::placeholder(&self.dma, self.page_size));
        std::mem::forget(data);
        for (_, r) in self.quarantine.drain(..) {
            std::mem::forget(r);
        }
    }

    /// A region to leave in `data` after a leak (never used afterwards: the queue is gone).
    fn placeholder(dma: &DmaContext, page_size: PageSize) -> DmaRegion {
        // Only reached on the failure path of a shutdown; a failed allocation there leaves
        // nothing better to do than abort the leak with the region still owned.
        dma.alloc_region(PAGE, page_size)
            .expect("a page for the leaked admin queue's placeholder")
    }

    /// Entries of each of the two queues.
    pub(crate) fn entries(&self) -> u16 {
        self.ring.entries
    }

    /// Copies the first `dst.len()` bytes of the data buffer out.
    pub(crate) fn read_data(&self, dst: &mut [u8]) {
        self.data
            .read(DATA_OFF, dst)
            .expect("admin data reads stay inside the data buffer (checked in exec)");
    }

    /// Submits `cmd` with `dir`'s data and polls until it completes or the timeout passes.
    /// `check` is called while waiting and may abort the wait (controller fatal status).
    ///
    /// Crate-internal, so safe: for [`DataDir::None`] the command's own pointers (CDW4-9) go
    /// to the controller as they are, so every caller in this crate builds them from memory
    /// it owns (queues, shadow doorbell pages) or sends none; with a transfer the command
    /// moves no more than the `len` bytes the data pointer describes (Identify pages, log
    /// pages of `len` bytes). The public passthrough, [`crate::Controller::admin_raw`], is
    /// `unsafe` for that reason.
    pub(crate) fn exec(
        &mut self,
        op: &'static str,
        mut cmd: Command,
        dir: DataDir,
        data: &[u8],
        check: &mut dyn FnMut() -> Result<()>,
    ) -> Result<Completion> {
        let len = match dir {
            DataDir::None => 0,
            DataDir::FromDevice(n) => n,
            DataDir::ToDevice => data.len(),
        };
        // Sizes first, before anything is copied.
        if len > ADMIN_DATA_BYTES {
            return Err(NvmeError::TooLarge {
                len,
                mdts: ADMIN_DATA_BYTES,
            });
        }
        if self.ring.sq_used(&self.mem) + 1 >= self.ring.entries {
            return Err(NvmeError::Failed(format!(
                "{op}: the admin submission queue is full of commands the controller never fetched ({} timed out); the controller must be reset",
                self.quarantine.len()
            )));
        }
        if dir == DataDir::ToDevice {
            self.data
                .write(DATA_OFF, data)
                .expect("inside the data buffer (checked above)");
        }
        if len > 0 {
            let start = self.data.bus_addr(DATA_OFF);
            let data = &self.data;
            let pages: Vec<BusAddr> = (0..prp::pages_spanned(start.get(), len, PAGE))
                .map(|i| data.bus_addr(DATA_OFF + i * PAGE))
                .collect();
            let mut list = AdminList {
                region: &mut self.data,
            };
            let (p1, p2) = prp::build(start, len, PAGE, |i| pages[i], &mut list)?;
            crate::cmd::set_data_ptr(&mut cmd, DataPtr::prp(p1, p2));
        }
        let cid = self.take_cid();
        cmd.set_cid(cid);
        self.ring.push(&mut self.mem, &cmd.to_words());
        self.ring.ring_sq(self.mem.sq_tail(), || true);
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            while let Some(c) = self.ring.pop(&mut self.mem) {
                self.ring.ring_cq(&self.mem);
                if c.cid == cid {
                    let st = c.status();
                    return if st.is_success() {
                        Ok(c)
                    } else {
                        Err(NvmeError::Status { op, status: st })
                    };
                }
                self.late(c);
            }
            spins += 1;
            if spins.is_multiple_of(64) {
                check()?;
                if start.elapsed() > self.timeout {
                    if len > 0 {
                        self.quarantine_data(cid)?;
                    }
                    return Err(NvmeError::Timeout {
                        op,
                        qid: 0,
                        cid,
                        timeout: self.timeout,
                    });
                }
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// The next command id, skipping those of commands still running without a waiter.
    fn take_cid(&mut self) -> u16 {
        loop {
            let cid = self.next_cid;
            self.next_cid = (self.next_cid + 1) % EVENT_CIDS;
            if !self.pending.iter().any(|p| p.cid == cid) {
                return cid;
            }
        }
    }

    /// Submits `cmd` (which moves no data through the admin data buffer) without waiting for
    /// it; returns its command id for [`AdminQueue::take`]. Same contract as
    /// [`AdminQueue::exec`] with [`DataDir::None`].
    pub(crate) fn submit(&mut self, op: &'static str, mut cmd: Command) -> Result<u16> {
        if self.ring.sq_used(&self.mem) + 1 >= self.ring.entries {
            return Err(NvmeError::Failed(format!(
                "{op}: the admin submission queue is full; the controller must be reset"
            )));
        }
        let cid = self.take_cid();
        cmd.set_cid(cid);
        self.ring.push(&mut self.mem, &cmd.to_words());
        self.ring.ring_sq(self.mem.sq_tail(), || true);
        self.pending.push(Pending {
            cid,
            opcode: cmd.opcode(),
            since: Instant::now(),
            done: None,
        });
        Ok(cid)
    }

    /// Reaps what completed, then says what became of command `cid` (submitted with
    /// [`AdminQueue::submit`]); a completed one is forgotten.
    pub(crate) fn take(&mut self, cid: u16) -> Taken {
        self.reap();
        let Some(i) = self.pending.iter().position(|p| p.cid == cid) else {
            return Taken::Lost;
        };
        match self.pending[i].done {
            Some(c) => {
                self.pending.swap_remove(i);
                Taken::Done(c)
            }
            None => Taken::Running(self.pending[i].since.elapsed()),
        }
    }

    /// Stops tracking command `cid` (it timed out: a late completion is logged and dropped).
    pub(crate) fn forget(&mut self, cid: u16) {
        self.pending.retain(|p| p.cid != cid);
    }

    /// Aborts submitted and not completed: at most ACL + 1 may run at once (NVMe Base 2.0
    /// §5.1, Identify Controller ACL).
    pub(crate) fn aborts_running(&self) -> usize {
        self.pending
            .iter()
            .filter(|p| p.opcode == crate::cmd::admin_op::ABORT && p.done.is_none())
            .count()
    }

    /// Consumes every completion posted, without waiting.
    fn reap(&mut self) {
        while let Some(c) = self.ring.pop(&mut self.mem) {
            self.ring.ring_cq(&self.mem);
            self.late(c);
        }
    }

    /// The queue as new, for a controller that was reset (disabled: it no longer touches this
    /// memory): entries zeroed, ring state reset, every command forgotten (their waiters see
    /// [`Taken::Lost`]), quarantined buffers freed. Returns the bus addresses for ASQ and ACQ.
    pub(crate) fn reinit(&mut self) -> (BusAddr, BusAddr) {
        let len = self.mem.region().len();
        self.mem.zero(0, len);
        self.ring.reset(&mut self.mem);
        self.events.clear();
        self.fired.clear();
        self.pending.clear();
        self.quarantine.clear();
        let sq = (self.ring.entries as usize * SQE_SIZE).next_multiple_of(PAGE);
        (self.mem.bus(0), self.mem.bus(sq))
    }

    /// Submits an Asynchronous Event Request (NVMe Base 2.0 §5.2) without waiting: it
    /// completes when the controller has an event to report.
    pub(crate) fn arm_event(&mut self) -> Result<()> {
        if self.ring.sq_used(&self.mem) + 1 >= self.ring.entries {
            return Err(NvmeError::Failed(
                "the admin submission queue is full; no Asynchronous Event Request can be armed".into(),
            ));
        }
        let Some(cid) = (EVENT_CIDS..=u16::MAX).find(|c| !self.events.contains(c)) else {
            return Ok(());
        };
        let mut cmd = Command::new(crate::cmd::admin_op::ASYNC_EVENT_REQUEST, 0);
        cmd.set_cid(cid);
        self.ring.push(&mut self.mem, &cmd.to_words());
        self.ring.ring_sq(self.mem.sq_tail(), || true);
        self.events.push(cid);
        Ok(())
    }

    /// Reaps what completed without waiting, and returns the Asynchronous Event Requests that
    /// fired since the last call (each must be re-armed by the caller).
    pub(crate) fn poll_events(&mut self) -> Vec<Completion> {
        self.reap();
        std::mem::take(&mut self.fired)
    }

    /// A completion that is not the current command's: a fired Asynchronous Event Request, or
    /// the late completion of an earlier command that timed out, whose data buffer, if it had
    /// one, is no longer written by the controller and is freed.
    #[cold]
    fn late(&mut self, c: Completion) {
        if let Some(i) = self.events.iter().position(|&cid| cid == c.cid) {
            self.events.swap_remove(i);
            if c.status().is_success() {
                self.fired.push(c);
            } else {
                // Aborted (e.g. at shutdown) or refused: not an event.
                log::debug!("asynchronous event request ended: {}", c.status());
            }
            return;
        }
        if let Some(p) = self
            .pending
            .iter_mut()
            .find(|p| p.cid == c.cid && p.done.is_none())
        {
            p.done = Some(c);
            return;
        }
        log::warn!("admin queue: late completion of a timed-out command {c:?}");
        if let Some(i) = self.quarantine.iter().position(|(cid, _)| *cid == c.cid) {
            self.quarantine.swap_remove(i);
        }
    }

    /// Command `cid` timed out with a transfer: the controller may still DMA into its buffer,
    /// so the next commands get a fresh one.
    #[cold]
    fn quarantine_data(&mut self, cid: u16) -> Result<()> {
        let fresh = Self::data_region(&self.dma, self.page_size)?;
        let old = std::mem::replace(&mut self.data, fresh);
        log::warn!("admin queue: command {cid} timed out with its data buffer; that buffer is quarantined until the command completes");
        self.quarantine.push((cid, old));
        Ok(())
    }
}
