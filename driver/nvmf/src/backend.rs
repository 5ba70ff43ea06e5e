//! Namespace backends: where a target namespace's blocks live. A vfpoll NVMe namespace (its own
//! queue pair per worker, data in DMA buffers the socket reads and writes directly), or RAM.
//!
//! A backend is driven by one worker thread: `submit` starts an operation on a buffer the
//! caller gives away, `poll` hands completed operations back with their buffers. Nothing
//! blocks.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, RawFd};

use vfpoll_dma::{DmaBuf, DmaPool};
use vfpoll_nvme::{NsFormat, NvmeError, QueuePair};
use vfpoll_nvme_spec::status::{Sct, Status};

use crate::fabrics::{ConfigError, NamespaceInfo};

/// What a backend does for one command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Read `nlb` blocks from `slba` into the buffer.
    Read,
    /// Write the buffer to `nlb` blocks at `slba` (FUA: on media before completing).
    Write {
        /// Force Unit Access.
        fua: bool,
    },
    /// Flush the volatile write cache.
    Flush,
    /// Zero `nlb` blocks from `slba`.
    WriteZeroes,
    /// Deallocate these `(slba, blocks)` ranges.
    Deallocate(Vec<(u64, u32)>),
}

/// A completed backend operation.
#[derive(Debug)]
pub struct Completion {
    /// The tag given at submit.
    pub tag: u64,
    /// Success, or the NVMe status to report to the host.
    pub status: Status,
    /// The buffer given at submit.
    pub buf: Option<DmaBuf>,
}

/// Why a submission was not started; the buffer comes back.
#[derive(Debug)]
pub struct Busy {
    /// The buffer, untouched.
    pub buf: Option<DmaBuf>,
}

/// A namespace's storage, driven by one worker.
pub trait Backend: Send {
    /// Data bytes per block.
    fn block_size(&self) -> usize;
    /// Size in blocks.
    fn blocks(&self) -> u64;
    /// Whether writes may sit in a volatile cache until a Flush.
    fn volatile_write_cache(&self) -> bool {
        false
    }
    /// Starts `op` on `nlb` blocks from `slba` with `buf` (reads and writes: exactly
    /// `nlb x block_size` bytes), a buffer of the worker's `pool`. `Err(Busy)` when the backend
    /// cannot take it now (queue full): poll and try again.
    fn submit(
        &mut self,
        pool: &mut DmaPool,
        op: Op,
        slba: u64,
        nlb: u32,
        buf: Option<DmaBuf>,
        tag: u64,
    ) -> Result<(), Busy>;
    /// Hands completed operations to `done`; returns how many.
    fn poll(&mut self, done: &mut dyn FnMut(Completion)) -> usize;
    /// Prepares for the worker to sleep while operations are in flight: `Ok(fd)`, a descriptor
    /// that becomes readable when a completion arrives (the worker waits on it, then polls);
    /// `Err(true)`: a completion is already there (poll now); `Err(false)`: none can be waited
    /// for (the worker naps and polls). The default: `Err(false)`.
    fn arm(&mut self) -> Result<RawFd, bool> {
        Err(false)
    }
}

/// Status for a backend I/O error that has no NVMe status of its own.
fn internal_error() -> Status {
    Status::new(Sct::Generic, 0x06, false)
}

/// A vfpoll NVMe namespace through this worker's queue pair.
pub struct NvmeBackend {
    qp: QueuePair<DmaBuf>,
    nsid: u32,
    block_size: usize,
    blocks: u64,
    vwc: bool,
    /// Operations the driver refused before submission, completed at the next poll.
    refused: VecDeque<Completion>,
}

impl NvmeBackend {
    /// Namespace `nsid` through `qp` (plain data formats only: the caller checked the format).
    pub fn new(qp: QueuePair<DmaBuf>, nsid: u32, block_size: usize, blocks: u64, vwc: bool) -> Self {
        NvmeBackend {
            qp,
            nsid,
            block_size,
            blocks,
            vwc,
            refused: VecDeque::new(),
        }
    }
}

/// The NVMe status a host sees for a driver error: the controller's own status, or for a
/// request the driver refused before submission the status a controller would have given.
fn status_of(e: &NvmeError) -> Status {
    match e {
        NvmeError::Status { status, .. } => *status,
        NvmeError::LbaOutOfRange { .. } => Status::LBA_OUT_OF_RANGE,
        NvmeError::NoSuchNamespace { .. } => Status::INVALID_NAMESPACE,
        NvmeError::BadLength { .. }
        | NvmeError::Metadata { .. }
        | NvmeError::Refused { .. }
        | NvmeError::TooLarge { .. }
        | NvmeError::InvalidOption(_) => Status::INVALID_FIELD,
        _ => internal_error(),
    }
}

/// Here rather than in [`crate::fabrics`], which knows NVMe only as definitions: a format is
/// what the driver reads from a controller's Identify Namespace.
impl NamespaceInfo {
    /// A namespace on a backend formatted with `format`: refused when the format has metadata
    /// (or protection information), which this target does not serve.
    pub fn from_format(
        subsystem_nqn: &str,
        nsid: u32,
        backend: &str,
        format: &NsFormat,
        blocks: u64,
    ) -> Result<Self, ConfigError> {
        if format.metadata_size != 0 || format.protection.is_some() {
            return Err(ConfigError::BadNamespace {
                subsystem: subsystem_nqn.to_owned(),
                nsid,
                why: format!(
                    "{backend} is formatted with {format}; the target serves plain data formats \
                     only (no metadata, no protection information): format the namespace with a \
                     512 or 4096-byte format without metadata"
                ),
            });
        }
        let ns = NamespaceInfo::new(subsystem_nqn, nsid, backend, format.data_size as u32, blocks);
        ns.validate(subsystem_nqn, u32::MAX - 1)?;
        Ok(ns)
    }
}

impl Backend for NvmeBackend {
    fn block_size(&self) -> usize {
        self.block_size
    }

    fn blocks(&self) -> u64 {
        self.blocks
    }

    fn volatile_write_cache(&self) -> bool {
        self.vwc
    }

    fn submit(
        &mut self,
        _pool: &mut DmaPool,
        op: Op,
        slba: u64,
        nlb: u32,
        buf: Option<DmaBuf>,
        tag: u64,
    ) -> Result<(), Busy> {
        if self.qp.free_slots() == 0 {
            return Err(Busy { buf });
        }
        let r = match (op, buf) {
            (Op::Read, Some(b)) => self
                .qp
                .read(self.nsid, slba, b, tag)
                .map_err(|r| (r.error, Some(r.buf))),
            (Op::Write { fua: false }, Some(b)) => self
                .qp
                .write(self.nsid, slba, b, tag)
                .map_err(|r| (r.error, Some(r.buf))),
            (Op::Write { fua: true }, Some(b)) => self
                .qp
                .write_fua(self.nsid, slba, b, tag)
                .map_err(|r| (r.error, Some(r.buf))),
            (Op::Flush, b) => self.qp.flush(self.nsid, tag).map_err(|e| (e, b)),
            (Op::WriteZeroes, b) => self
                .qp
                .write_zeroes(self.nsid, slba, nlb, tag)
                .map_err(|e| (e, b)),
            (Op::Deallocate(ranges), b) => self.qp.deallocate(self.nsid, &ranges, tag).map_err(|e| (e, b)),
            (op, b) => {
                log::error!("backend: {op:?} without a buffer");
                return Err(Busy { buf: b });
            }
        };
        match r {
            Ok(()) => Ok(()),
            Err((NvmeError::QueueFull { .. }, buf)) => Err(Busy { buf }),
            Err((e, buf)) => {
                // Refused before submission: complete it with the error at the next poll.
                log::warn!("backend: namespace {}: {e}", self.nsid);
                self.refused.push_back(Completion {
                    tag,
                    status: status_of(&e),
                    buf,
                });
                Ok(())
            }
        }
    }

    fn poll(&mut self, done: &mut dyn FnMut(Completion)) -> usize {
        let mut n = 0;
        while let Some(c) = self.refused.pop_front() {
            done(c);
            n += 1;
        }
        n + self.qp.poll(usize::MAX, |d| {
            done(Completion {
                tag: d.tag,
                status: match &d.result {
                    Ok(_) => Status::SUCCESS,
                    Err(e) => status_of(e),
                },
                buf: d.buf,
            })
        })
    }

    fn arm(&mut self) -> Result<RawFd, bool> {
        if !self.refused.is_empty() {
            return Err(true);
        }
        let Some(fd) = self.qp.event_fd().map(|f| f.as_raw_fd()) else {
            return Err(false);
        };
        match self.qp.arm() {
            Ok(false) => Ok(fd),
            // A completion is there, or the queue pair failed: poll reports it.
            Ok(true) | Err(_) => Err(true),
        }
    }
}

/// A namespace in RAM (`--malloc`): for tests and machines without NVMe. Operations complete
/// at the next poll; data is copied between the RAM and the DMA buffers through their pool.
pub struct MallocBackend {
    data: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    block_size: usize,
    done: VecDeque<Completion>,
}

impl MallocBackend {
    /// `blocks` zeroed blocks of `block_size` bytes, shared by every worker (`data`).
    pub fn new(data: std::sync::Arc<std::sync::Mutex<Vec<u8>>>, block_size: usize) -> Self {
        MallocBackend {
            data,
            block_size,
            done: VecDeque::new(),
        }
    }

    /// RAM for a namespace of `bytes` bytes.
    pub fn storage(bytes: usize) -> std::sync::Arc<std::sync::Mutex<Vec<u8>>> {
        std::sync::Arc::new(std::sync::Mutex::new(vec![0u8; bytes]))
    }
}

impl Backend for MallocBackend {
    fn block_size(&self) -> usize {
        self.block_size
    }

    fn blocks(&self) -> u64 {
        (self.data.lock().unwrap_or_else(|e| e.into_inner()).len() / self.block_size) as u64
    }

    fn submit(
        &mut self,
        pool: &mut DmaPool,
        op: Op,
        slba: u64,
        nlb: u32,
        buf: Option<DmaBuf>,
        tag: u64,
    ) -> Result<(), Busy> {
        let bs = self.block_size;
        let mut data = self.data.lock().unwrap_or_else(|e| e.into_inner());
        let len = data.len();
        let range = |slba: u64, nlb: u64| {
            let a = (slba as usize).checked_mul(bs)?;
            let b = a.checked_add((nlb as usize).checked_mul(bs)?)?;
            (b <= len).then_some(a..b)
        };
        let lba_out_of_range = Status::new(Sct::Generic, 0x80, true);
        let status = match (&op, &buf) {
            (Op::Read, Some(b)) => match range(slba, nlb as u64) {
                Some(r) => pool
                    .write(b, 0, &data[r])
                    .map_or_else(|_| internal_error(), |_| Status::SUCCESS),
                None => lba_out_of_range,
            },
            (Op::Write { .. }, Some(b)) => match range(slba, nlb as u64) {
                Some(r) => pool
                    .read(b, 0, &mut data[r])
                    .map_or_else(|_| internal_error(), |_| Status::SUCCESS),
                None => lba_out_of_range,
            },
            (Op::Flush, _) => Status::SUCCESS,
            (Op::WriteZeroes, _) => match range(slba, nlb as u64) {
                Some(r) => {
                    data[r].fill(0);
                    Status::SUCCESS
                }
                None => lba_out_of_range,
            },
            (Op::Deallocate(ranges), _) => {
                let mut st = Status::SUCCESS;
                for &(s, n) in ranges {
                    match range(s, n as u64) {
                        Some(r) => data[r].fill(0),
                        None => st = lba_out_of_range,
                    }
                }
                st
            }
            _ => internal_error(),
        };
        drop(data);
        self.done.push_back(Completion { tag, status, buf });
        Ok(())
    }

    fn poll(&mut self, done: &mut dyn FnMut(Completion)) -> usize {
        let n = self.done.len();
        while let Some(c) = self.done.pop_front() {
            done(c);
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_with_metadata_are_refused() {
        let nqn = "nqn.2024-01.io.vfpoll:a";
        let plain = NamespaceInfo::from_format(nqn, 1, "nvme:x:1", &NsFormat::plain(4096), 100).unwrap();
        assert_eq!((plain.block_size, plain.block_shift()), (4096, 12));
        let mut meta = NsFormat::plain(512);
        meta.metadata_size = 8;
        meta.extended = true;
        let e = NamespaceInfo::from_format(nqn, 1, "nvme:x:1", &meta, 100).unwrap_err();
        assert!(e.to_string().contains("plain data formats only"), "{e}");
        let odd = NamespaceInfo::from_format(nqn, 1, "nvme:x:1", &NsFormat::plain(8192), 100).unwrap_err();
        assert!(odd.to_string().contains("8192-byte blocks"), "{odd}");
        // A namespace from a format is in ANA group 1, as one from `NamespaceInfo::new`.
        assert_eq!(plain.ana_group, 1);
    }
}
