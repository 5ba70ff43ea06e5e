//! The admin queue (NVMe Base 2.0 §3.3.1.1): one command at a time, polled to completion with a
//! deadline. Admin commands are control path; the controller serialises them behind a mutex.

use std::time::{Duration, Instant};

use vfpoll_dma::{DmaContext, PageSize};
use vfpoll_pci::mmio::Mmio;

use crate::cmd::{Command, Completion};
use crate::error::{NvmeError, Result};
use crate::prp::{self, PrpListMem};
use crate::qmem::QueueMem;
use crate::queue::{Layout, Ring, CQE_SIZE, SQE_SIZE};

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
        _ => "admin command",
    }
}

pub(crate) struct AdminQueue {
    ring: Ring,
    mem: QueueMem,
    next_cid: u16,
    timeout: Duration,
    data_off: usize,
    list_off: usize,
}

impl std::fmt::Debug for AdminQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "AdminQueue(entries={}, next_cid={})",
            self.ring.entries, self.next_cid
        )
    }
}

/// One PRP list page inside the admin memory.
struct AdminList<'a> {
    mem: &'a mut QueueMem,
    off: usize,
}

impl PrpListMem for AdminList<'_> {
    fn pages(&self) -> usize {
        1
    }
    fn page_bus(&self, _page: usize) -> u64 {
        self.mem.bus(self.off)
    }
    fn write(&mut self, _page: usize, idx: usize, entry: u64) {
        self.mem.write_u64(self.off + idx * 8, entry);
    }
}

impl AdminQueue {
    /// Allocates the admin queue memory: SQ, CQ, one PRP list page, the data buffer.
    pub(crate) fn new(
        bar: &Mmio,
        stride: usize,
        dma: &DmaContext,
        page_size: PageSize,
        entries: u16,
        timeout: Duration,
    ) -> Result<(Self, u64, u64)> {
        let sq = (entries as usize * SQE_SIZE).next_multiple_of(PAGE);
        let cq = (entries as usize * CQE_SIZE).next_multiple_of(PAGE);
        let list_off = sq + cq;
        let data_off = list_off + PAGE;
        let region = dma.alloc_region(data_off + ADMIN_DATA_BYTES, page_size)?;
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
            data_off,
            list_off,
        };
        Ok((q, asq, acq))
    }

    /// Never free the queue's memory: the controller may still use it.
    pub(crate) fn leak(&mut self) {
        self.mem.leak();
    }

    /// Copies the first `dst.len()` bytes of the data buffer out.
    pub(crate) fn read_data(&self, dst: &mut [u8]) {
        self.mem.read(self.data_off, dst);
    }

    /// Submits `cmd` with `dir`'s data and polls until it completes or the timeout passes.
    /// `check` is called while waiting and may abort the wait (controller fatal status).
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
            DataDir::ToDevice => {
                self.mem.write(self.data_off, data);
                data.len()
            }
        };
        if len > ADMIN_DATA_BYTES {
            return Err(NvmeError::TooLarge {
                len,
                mdts: ADMIN_DATA_BYTES,
            });
        }
        if len > 0 {
            let start = self.mem.bus(self.data_off);
            let data_off = self.data_off;
            let pages: Vec<u64> = (0..prp::pages_spanned(start, len, PAGE))
                .map(|i| self.mem.bus(data_off + i * PAGE))
                .collect();
            let mut list = AdminList {
                mem: &mut self.mem,
                off: self.list_off,
            };
            let (p1, p2) = prp::build(start, len, PAGE, |i| pages[i], &mut list)?;
            cmd.set_prp1(p1);
            cmd.set_prp2(p2);
        }
        let cid = self.next_cid;
        self.next_cid = self.next_cid.wrapping_add(1);
        cmd.set_cid(cid);
        self.ring.push(&mut self.mem, &cmd.to_words());
        self.ring.ring_sq();
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            while let Some(c) = self.ring.pop(&self.mem) {
                self.ring.ring_cq();
                if c.cid == cid {
                    let st = c.status();
                    return if st.is_success() {
                        Ok(c)
                    } else {
                        Err(NvmeError::Status { op, status: st })
                    };
                }
                // A late completion of an earlier, timed-out admin command.
                log::warn!("admin queue: dropping stale completion {c:?}");
            }
            spins += 1;
            if spins.is_multiple_of(64) {
                check()?;
                if start.elapsed() > self.timeout {
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
}
