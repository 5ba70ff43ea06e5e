//! [`NvmeDevice`]: an NVMe namespace through a vfpoll queue pair, on a controller bound to
//! vfio-pci or on the in-process NVMe model. Buffers are vfpoll-dma regions of the controller's
//! DMA context, so the controller moves the data straight into and out of them. Flush is sent
//! only where the controller reports a volatile write cache (Identify Controller VWC), FUA
//! writes set the FUA bit, and deallocates are Dataset Management (AD) commands.
//!
//! Another I/O channel ([`Device::open_channel`]) is another queue pair on the same controller,
//! its buffers from the same DMA context. A Flush through any queue pair covers the writes the
//! controller completed before it, on every queue (NVMe Base 2.0 §7.1: the flush
//! applies to all commands for the namespace completed before its submission).

use std::any::Any;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use vfpoll_dma::DmaContext;
use vfpoll_nvme::{Controller, NvmeError, QpairOptions, QueuePair, Rejected};

use super::{alloc_buffers, Device, DeviceError, IoBuf, IoDone, IoOp};

/// One namespace of a vfpoll NVMe controller; see the module docs.
pub struct NvmeDevice {
    // Field order is drop order: the queue pair, then the controller, then what they need.
    qp: QueuePair<IoBuf>,
    ctrl: Controller,
    nsid: u32,
    lba: u64,
    blocks: u64,
    vwc: bool,
    name: String,
    /// Requests finished without the device (a flush without a write cache).
    local: VecDeque<IoDone>,
    /// How the queue pair was made (for another channel's).
    qopts: QpairOptions,
    /// Whatever must outlive every channel's queue pair (the model, the VFIO container), shared
    /// by the channels (the mutex only makes it `Sync`; it is never locked).
    _keep: Arc<Mutex<Vec<Box<dyn Any + Send>>>>,
}

impl std::fmt::Debug for NvmeDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmeDevice").field("name", &self.name).finish()
    }
}

impl NvmeDevice {
    /// Namespace `nsid` of `ctrl` through a new queue pair made with `opts`; `name` names the
    /// controller in messages ("0000:00:03.0"). `keep` holds what must live as long as the
    /// device (a model, a container).
    pub fn new(
        ctrl: &Controller,
        nsid: u32,
        opts: &QpairOptions,
        name: &str,
        keep: Vec<Box<dyn Any + Send>>,
    ) -> Result<Self, DeviceError> {
        let open = |e: NvmeError| DeviceError::Open(format!("NVMe {name} namespace {nsid}: {e}"));
        let ns = ctrl.namespace(nsid).map_err(open)?.clone();
        if ns.lba_size > 4096 || 4096 % ns.lba_size != 0 {
            return Err(DeviceError::Open(format!(
                "NVMe {name} namespace {nsid}: {}-byte blocks; the store needs blocks that divide 4096 (reformat it with \
                 `vfpoll format`)",
                ns.lba_size
            )));
        }
        if ns.metadata_size != 0 {
            return Err(DeviceError::Open(format!(
                "NVMe {name} namespace {nsid}: its format carries {} metadata bytes per block; the store needs a \
                 format without metadata (reformat it with `vfpoll format`)",
                ns.metadata_size
            )));
        }
        let qp = ctrl.create_qpair::<IoBuf>(opts).map_err(open)?;
        Ok(NvmeDevice {
            qp,
            ctrl: ctrl.clone(),
            nsid,
            lba: ns.lba_size as u64,
            blocks: ns.blocks,
            vwc: ctrl.identify().has_volatile_write_cache(),
            name: format!("NVMe {name} namespace {nsid}"),
            local: VecDeque::new(),
            qopts: opts.clone(),
            _keep: Arc::new(Mutex::new(keep)),
        })
    }

    /// Another channel: a new queue pair on the same controller and namespace.
    fn channel(&self) -> Result<Self, DeviceError> {
        let qp = self
            .ctrl
            .create_qpair::<IoBuf>(&self.qopts)
            .map_err(|e| DeviceError::Open(format!("{}: another queue pair: {e}", self.name)))?;
        Ok(NvmeDevice {
            qp,
            ctrl: self.ctrl.clone(),
            nsid: self.nsid,
            lba: self.lba,
            blocks: self.blocks,
            vwc: self.vwc,
            name: self.name.clone(),
            local: VecDeque::new(),
            qopts: self.qopts.clone(),
            _keep: self._keep.clone(),
        })
    }

    /// The queue pair's counters.
    pub fn stats(&self) -> vfpoll_nvme::QpairStats {
        self.qp.stats()
    }

    fn err(&self, op: &'static str, offset: u64, len: u64, e: NvmeError) -> DeviceError {
        DeviceError::Io {
            device: self.name.clone(),
            op,
            offset,
            len,
            detail: e.to_string(),
        }
    }
}

impl Device for NvmeDevice {
    fn describe(&self) -> String {
        self.name.clone()
    }
    fn block_size(&self) -> u32 {
        self.lba as u32
    }
    fn capacity(&self) -> u64 {
        self.blocks * self.lba
    }
    fn volatile_write_cache(&self) -> bool {
        self.vwc
    }
    fn alloc_buffers(&self, count: usize, size: usize) -> Result<Vec<IoBuf>, DeviceError> {
        alloc_buffers(self.ctrl.dma(), count, size)
    }
    fn queue_depth(&self) -> usize {
        self.qp.free_slots() + self.qp.outstanding()
    }
    fn submit(&mut self, tag: u64, op: IoOp) -> Result<(), (DeviceError, IoOp)> {
        let (offset, len) = op.range();
        if !offset.is_multiple_of(self.lba) || !len.is_multiple_of(self.lba) {
            let e = DeviceError::Invalid(format!(
                "{}: {} of {len} bytes at {offset}: not whole {}-byte blocks",
                self.name,
                op.name(),
                self.lba
            ));
            return Err((e, op));
        }
        let slba = offset / self.lba;
        let name = op.name();
        let rejected = |r: Rejected<IoBuf>, this: &Self, rebuild: &dyn Fn(IoBuf) -> IoOp| match r.error {
            NvmeError::QueueFull { .. } => (DeviceError::QueueFull, rebuild(r.buf)),
            e => (this.err(name, offset, len, e), rebuild(r.buf)),
        };
        match op {
            IoOp::Read { offset, buf } => self
                .qp
                .read(self.nsid, slba, buf, tag)
                .map_err(|r| rejected(r, self, &|buf| IoOp::Read { offset, buf })),
            IoOp::Write { offset, buf, fua } => {
                let r = if fua {
                    self.qp.write_fua(self.nsid, slba, buf, tag)
                } else {
                    self.qp.write(self.nsid, slba, buf, tag)
                };
                r.map_err(|r| rejected(r, self, &|buf| IoOp::Write { offset, buf, fua }))
            }
            IoOp::Flush if !self.vwc => {
                // NVMe Base 2.0 §5.15.2.2: without a volatile write cache a completed write is
                // already durable; nothing to send.
                self.local.push_back(IoDone {
                    tag,
                    result: Ok(()),
                    buf: None,
                });
                Ok(())
            }
            IoOp::Flush => self.qp.flush(self.nsid, tag).map_err(|e| match e {
                NvmeError::QueueFull { .. } => (DeviceError::QueueFull, IoOp::Flush),
                e => (self.err(name, 0, 0, e), IoOp::Flush),
            }),
            IoOp::Deallocate { offset, len } => {
                let blocks = len / self.lba;
                let mut ranges = Vec::new();
                let mut at = slba;
                let mut left = blocks;
                while left > 0 && ranges.len() < 256 {
                    let n = left.min(u32::MAX as u64);
                    ranges.push((at, n as u32));
                    at += n;
                    left -= n;
                }
                if ranges.is_empty() {
                    self.local.push_back(IoDone {
                        tag,
                        result: Ok(()),
                        buf: None,
                    });
                    return Ok(());
                }
                self.qp.deallocate(self.nsid, &ranges, tag).map_err(|e| match e {
                    NvmeError::QueueFull { .. } => (DeviceError::QueueFull, IoOp::Deallocate { offset, len }),
                    e => (self.err(name, offset, len, e), IoOp::Deallocate { offset, len }),
                })
            }
        }
    }
    fn kick(&mut self) -> Result<(), DeviceError> {
        self.qp.flush_submissions();
        Ok(())
    }
    fn poll(&mut self, done: &mut Vec<IoDone>) -> usize {
        let mut n = self.local.len();
        done.extend(self.local.drain(..));
        let name = &self.name;
        n += self.qp.poll(usize::MAX, |d| {
            let result = d.result.map(drop).map_err(|e| DeviceError::Io {
                device: name.clone(),
                op: "I/O",
                offset: 0,
                len: 0,
                detail: e.to_string(),
            });
            done.push(IoDone {
                tag: d.tag,
                result,
                buf: d.buf,
            });
        });
        n
    }
    fn outstanding(&self) -> usize {
        self.qp.outstanding() + self.local.len()
    }
    fn open_channel(&self) -> Result<Box<dyn Device>, DeviceError> {
        Ok(Box::new(self.channel()?))
    }
    fn dma_context(&self) -> Option<DmaContext> {
        Some(self.ctrl.dma().clone())
    }
}
