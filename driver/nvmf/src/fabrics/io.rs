//! I/O commands of the NVM Command Set (NVM Command Set 1.0, "I/O Commands"): what a Read,
//! Write, Flush, Write Zeroes or Dataset Management asks of which namespace, checked against
//! the namespace and the controller before the runtime touches a backend.
//!
//! Workers decode through an [`IoQueue`], one per I/O queue, which reads the namespace table
//! and the controller's state without the [`Target`](super::Target): a worker thread needs no
//! lock per command. A namespace change publishes a new table; each queue picks it up at its
//! next command. The ANA states of the controller's port are atomics the queue reads in place
//! (`ana::AnaCell`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use vfpoll_nvme_spec::cmd::io_op;
use vfpoll_nvme_spec::status::Status;

use super::config::NamespaceInfo;
use super::controller::CtrlShared;
use super::qos::{Limiter, Limits};
use super::resv::{self, Access, ResvCommand, SubsysResv};
use super::types::{QueueRef, SubsystemId};
use super::wire::{self, check_flags, cqe, data_xfer, status, Cqe, DataXfer, Sqe};

/// A decoded I/O command, ready for a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoRequest {
    /// The command identifier, for the completion.
    pub cid: u16,
    /// The subsystem of the namespace.
    pub subsystem: SubsystemId,
    /// The namespace.
    pub nsid: u32,
    /// What to do.
    pub op: IoOp,
}

/// The operation of an [`IoRequest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoOp {
    /// Read `blocks` blocks from `slba`; `len` bytes go to the host (C2HData).
    Read {
        /// Starting LBA.
        slba: u64,
        /// Blocks, 1 to 65536.
        blocks: u32,
        /// Bytes: `blocks` × block size.
        len: u32,
    },
    /// Write `blocks` blocks at `slba` with the data in `data` (in the capsule or after R2T).
    Write {
        /// Starting LBA.
        slba: u64,
        /// Blocks, 1 to 65536.
        blocks: u32,
        /// Where the data comes from; its length is `blocks` × block size.
        data: DataXfer,
        /// The data must be on non-volatile media before the completion: the command's Force
        /// Unit Access, or a namespace with a volatile write cache the host disabled (Volatile
        /// Write Cache feature, WCE 0).
        fua: bool,
    },
    /// Flush the namespace's volatile write cache.
    Flush,
    /// Zero `blocks` blocks at `slba`; no data moves.
    WriteZeroes {
        /// Starting LBA.
        slba: u64,
        /// Blocks, 1 to 65536.
        blocks: u32,
        /// The host allows deallocating the blocks (DEAC).
        deallocate: bool,
        /// Force Unit Access, as for a write.
        fua: bool,
    },
    /// Dataset Management: `ranges` 16-byte range descriptors come from the host in `data`;
    /// parse them with [`IoRequest::dsm_ranges`]. Only the Deallocate attribute asks for an
    /// action; without it, or on a namespace that cannot deallocate (deallocation is
    /// advisory: NVM Command Set 1.0, Dataset Management), completing it successfully is all
    /// there is to do.
    DatasetManagement {
        /// Range descriptors, 1 to 256.
        ranges: u16,
        /// The Deallocate attribute (AD), and the namespace can deallocate.
        deallocate: bool,
        /// Where the range descriptors come from (`ranges` × 16 bytes).
        data: DataXfer,
        /// The namespace's size in blocks, which ranges must stay within.
        capacity: u64,
    },
    /// Reservation Register, Report, Acquire or Release: run by the target under its lock
    /// ([`Target::reservation`](super::Target::reservation)), not by a backend.
    Reservation(ResvCommand),
}

/// One range of a Dataset Management command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DsmRange {
    /// Starting LBA.
    pub slba: u64,
    /// Blocks.
    pub blocks: u32,
}

impl IoRequest {
    /// The data the command moves on the wire.
    pub fn data(&self) -> DataXfer {
        match self.op {
            IoOp::Read { len, .. } => DataXfer::ToHost { len },
            IoOp::Write { data, .. } | IoOp::DatasetManagement { data, .. } => data,
            IoOp::Reservation(c) => c.data,
            IoOp::Flush | IoOp::WriteZeroes { .. } => DataXfer::None,
        }
    }

    /// The successful completion.
    pub fn success(&self) -> Cqe {
        cqe(self.cid, Status::SUCCESS, 0)
    }

    /// A completion with `status` (a backend's error).
    pub fn failure(&self, status: Status) -> Cqe {
        cqe(self.cid, status, 0)
    }

    /// The ranges of a Dataset Management command from its `data` (NVM Command Set 1.0,
    /// Dataset Management range: context attributes, block count, starting LBA; 16 bytes each).
    /// Ranges of 0 blocks are dropped; one past the namespace is LBA Out of Range; data of
    /// the wrong length is Data SGL Length Invalid.
    pub fn dsm_ranges(&self, data: &[u8]) -> Result<Vec<DsmRange>, Status> {
        let IoOp::DatasetManagement { ranges, capacity, .. } = self.op else {
            return Err(Status::INVALID_FIELD);
        };
        if data.len() != ranges as usize * 16 {
            return Err(status::DATA_SGL_LENGTH_INVALID);
        }
        let mut out = Vec::with_capacity(ranges as usize);
        for r in data.chunks_exact(16) {
            let blocks = wire::le32(r, 4);
            let slba = wire::le64(r, 8);
            if blocks == 0 {
                continue;
            }
            if slba.checked_add(blocks as u64).is_none_or(|end| end > capacity) {
                return Err(Status::LBA_OUT_OF_RANGE);
            }
            out.push(DsmRange { slba, blocks });
        }
        Ok(out)
    }
}

/// A namespace as the I/O path needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NsIo {
    pub nsid: u32,
    pub shift: u8,
    pub blocks: u64,
    pub vwc: bool,
    pub write_zeroes: bool,
    pub deallocate: bool,
    /// ANA group ID.
    pub group: u32,
}

/// The limiters of a subsystem's limits, by host label and by NSID.
#[derive(Debug, Clone, Default)]
pub(crate) struct Limiters {
    hosts: HashMap<String, Arc<Limiter>>,
    namespaces: HashMap<u32, Arc<Limiter>>,
}

impl Limiters {
    /// Makes them match `limits`: a limit that stays keeps its limiter (and credit), with
    /// its rates updated; new limits get full buckets; removed ones go.
    pub fn update(&mut self, limits: &Limits) {
        fn sync<K: std::hash::Hash + Ord + Clone>(
            have: &mut HashMap<K, Arc<Limiter>>,
            want: &std::collections::BTreeMap<K, super::qos::RateLimit>,
        ) {
            have.retain(|k, _| want.get(k).is_some_and(|l| l.is_limited()));
            for (k, l) in want.iter().filter(|(_, l)| l.is_limited()) {
                match have.get(k) {
                    Some(x) if x.limit() == *l => {}
                    Some(x) => x.set(*l),
                    None => {
                        have.insert(k.clone(), Arc::new(Limiter::new(*l)));
                    }
                }
            }
        }
        sync(&mut self.hosts, &limits.hosts);
        sync(&mut self.namespaces, &limits.namespaces);
    }
}

/// A subsystem's namespaces, sorted by ID, and its limiters.
#[derive(Debug, Clone, Default)]
pub(crate) struct NsTable {
    list: Vec<NsIo>,
    limiters: Limiters,
}

impl NsTable {
    pub fn new<'a>(namespaces: impl IntoIterator<Item = &'a NamespaceInfo>) -> Self {
        let mut list: Vec<NsIo> = namespaces
            .into_iter()
            .map(|n| NsIo {
                nsid: n.nsid,
                shift: n.block_shift(),
                blocks: n.blocks,
                vwc: n.volatile_write_cache,
                write_zeroes: n.write_zeroes,
                deallocate: n.deallocate,
                group: n.ana_group,
            })
            .collect();
        list.sort_by_key(|n| n.nsid);
        NsTable {
            list,
            limiters: Limiters::default(),
        }
    }

    /// The table with these limiters.
    pub fn with_limits(mut self, limiters: &Limiters) -> Self {
        self.limiters = limiters.clone();
        self
    }

    pub fn get(&self, nsid: u32) -> Option<&NsIo> {
        self.list
            .binary_search_by_key(&nsid, |n| n.nsid)
            .ok()
            .map(|i| &self.list[i])
    }
}

/// The current namespace table of a subsystem and its version, shared with the I/O queues.
#[derive(Debug)]
pub(crate) struct NsCell {
    version: AtomicU64,
    table: RwLock<Arc<NsTable>>,
    /// The namespaces' reservation states.
    pub resv: SubsysResv,
}

impl NsCell {
    pub fn new(table: NsTable) -> Self {
        NsCell {
            version: AtomicU64::new(0),
            table: RwLock::new(Arc::new(table)),
            resv: SubsysResv::default(),
        }
    }

    /// Publishes a new table: the table first, then the version queues compare against.
    pub fn replace(&self, table: NsTable) {
        *self.table.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(table);
        self.version.fetch_add(1, Ordering::Release);
    }

    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    pub fn current(&self) -> Arc<NsTable> {
        self.table.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Limits of the I/O path.
#[derive(Debug, Clone, Copy)]
pub(crate) struct IoLimits {
    /// MDTS in bytes.
    pub max_transfer: u32,
    /// In-capsule data an I/O queue accepts.
    pub in_capsule: u32,
}

/// The decoder of one I/O queue, owned by the worker that serves the queue's connection
/// (`Send`; not shared). It stays usable after its controller is gone, refusing commands with
/// Command Sequence Error.
#[derive(Debug)]
pub struct IoQueue {
    queue: QueueRef,
    subsystem: SubsystemId,
    shared: Arc<CtrlShared>,
    cell: Arc<NsCell>,
    table: Arc<NsTable>,
    version: u64,
    limits: IoLimits,
    /// The host, as rate limits name it.
    host: String,
    /// The host's rate limit in this subsystem, from the table.
    host_limit: Option<Arc<Limiter>>,
}

impl IoQueue {
    pub(crate) fn new(
        queue: QueueRef,
        subsystem: SubsystemId,
        shared: Arc<CtrlShared>,
        cell: Arc<NsCell>,
        limits: IoLimits,
        host: String,
    ) -> Self {
        let version = cell.version();
        let table = cell.current();
        let host_limit = table.limiters.hosts.get(&host).cloned();
        IoQueue {
            queue,
            subsystem,
            shared,
            cell,
            table,
            version,
            limits,
            host,
            host_limit,
        }
    }

    /// Whether a command of `req` must pass rate limits (its host's or its namespace's).
    pub fn is_limited(&self, req: &IoRequest) -> bool {
        self.host_limit.is_some() || self.table.limiters.namespaces.contains_key(&req.nsid)
    }

    /// Admits `req` under its host's and its namespace's rate limits at `now_ns` (nanoseconds
    /// from any fixed origin; [`RateLimit`](super::RateLimit)): true takes its cost from
    /// every bucket it draws on; false leaves them untouched, and the command should wait
    /// and ask again. Commands without limits are always admitted.
    pub fn admit(&self, req: &IoRequest, now_ns: u64) -> bool {
        let ns = self.table.limiters.namespaces.get(&req.nsid);
        let limits = [self.host_limit.as_ref(), ns];
        if !limits.iter().flatten().all(|l| l.ready(now_ns)) {
            return false;
        }
        let bytes = match req.op {
            IoOp::Read { len, .. } => len as u64,
            IoOp::Write { data, .. } => data.len() as u64,
            _ => 0,
        };
        for l in limits.iter().flatten() {
            l.take(bytes);
        }
        true
    }

    /// The queue this decoder serves.
    pub fn queue(&self) -> QueueRef {
        self.queue
    }

    /// The subsystem of the queue's controller.
    pub fn subsystem(&self) -> SubsystemId {
        self.subsystem
    }

    /// In-capsule data this queue accepts, in bytes.
    pub fn in_capsule_max(&self) -> u32 {
        self.limits.in_capsule
    }

    /// Decodes an I/O command, or the completion that refuses it (also recorded in the
    /// controller's Error Information log). Any command counts as traffic for the keep-alive
    /// timer.
    pub fn decode(&mut self, sqe: &Sqe) -> Result<IoRequest, Cqe> {
        let v = self.cell.version();
        if v != self.version {
            self.table = self.cell.current();
            self.version = v;
            self.host_limit = self.table.limiters.hosts.get(&self.host).cloned();
        }
        decode(
            &self.table,
            &self.cell.resv,
            &self.shared,
            self.limits,
            self.subsystem,
            sqe,
        )
        .map_err(|st| {
            self.shared
                .errors()
                .record(self.queue.qid, sqe.cid(), st, sqe.nsid(), error_lba(sqe));
            cqe(sqe.cid(), st, 0)
        })
    }

    /// Records a backend failure of `req` in the controller's Error Information log.
    pub fn record_error(&self, req: &IoRequest, status: Status) {
        let lba = match req.op {
            IoOp::Read { slba, .. } | IoOp::Write { slba, .. } | IoOp::WriteZeroes { slba, .. } => slba,
            _ => 0,
        };
        self.shared
            .errors()
            .record(self.queue.qid, req.cid, status, req.nsid, lba);
    }
}

/// The LBA an error log entry names for a failed command.
pub(crate) fn error_lba(sqe: &Sqe) -> u64 {
    match sqe.opcode() {
        io_op::READ | io_op::WRITE | io_op::WRITE_ZEROES => sqe.slba(),
        _ => 0,
    }
}

/// Decodes an I/O command against `table` and the controller's state.
pub(crate) fn decode(
    table: &NsTable,
    resv: &SubsysResv,
    ctrl: &CtrlShared,
    limits: IoLimits,
    subsystem: SubsystemId,
    sqe: &Sqe,
) -> Result<IoRequest, Status> {
    ctrl.touch();
    if !ctrl.is_ready() {
        return Err(status::COMMAND_SEQUENCE_ERROR);
    }
    check_flags(sqe)?;
    let opcode = sqe.opcode();
    match opcode {
        io_op::READ | io_op::WRITE | io_op::FLUSH | io_op::WRITE_ZEROES | io_op::DATASET_MANAGEMENT => {}
        resv::opcode::REGISTER | resv::opcode::REPORT | resv::opcode::ACQUIRE | resv::opcode::RELEASE => {}
        // A second Connect on a connected queue.
        wire::FABRICS_OPCODE if wire::is_connect(sqe) => return Err(status::COMMAND_SEQUENCE_ERROR),
        _ => return Err(Status::INVALID_OPCODE),
    }
    let nsid = sqe.nsid();
    let Some(ns) = table.get(nsid) else {
        // Includes NSID FFFFFFFFh: VWC reports no broadcast Flush.
        return Err(Status::INVALID_NAMESPACE);
    };
    // NVMe Base 2.0 §8.1.3.3 to §8.1.3.5: no I/O through a path whose ANA state is
    // Inaccessible, Persistent Loss or Change (every I/O command, as Linux's target does).
    if let Some(st) = ctrl.ana.io_refusal(ns.group) {
        return Err(st);
    }
    // NVMe Base 2.0 §8.19, Figure 8.20: a reservation fences the read or write command group.
    let access = match opcode {
        io_op::READ => Some(Access::Read),
        io_op::WRITE | io_op::FLUSH | io_op::WRITE_ZEROES | io_op::DATASET_MANAGEMENT => Some(Access::Write),
        _ => None,
    };
    if access.is_some_and(|a| !resv.allows(nsid, &ctrl.hostid, a)) {
        return Err(resv::RESERVATION_CONFLICT);
    }
    let op = match opcode {
        io_op::READ | io_op::WRITE => {
            let (slba, blocks) = range(sqe, ns)?;
            let bytes = (blocks as u64) << ns.shift;
            if bytes > limits.max_transfer as u64 {
                return Err(Status::INVALID_FIELD);
            }
            let len = bytes as u32;
            let data = data_xfer(sqe, limits.in_capsule)?;
            if data.len() != len {
                return Err(status::DATA_SGL_LENGTH_INVALID);
            }
            if opcode == io_op::READ {
                IoOp::Read { slba, blocks, len }
            } else {
                let fua = sqe.dw[12] & 1 << 30 != 0 || (ns.vwc && !ctrl.write_cache.load(Ordering::Relaxed));
                IoOp::Write {
                    slba,
                    blocks,
                    data,
                    fua,
                }
            }
        }
        io_op::FLUSH => IoOp::Flush,
        resv::opcode::REGISTER | resv::opcode::REPORT | resv::opcode::ACQUIRE | resv::opcode::RELEASE => {
            IoOp::Reservation(resv::decode(sqe, limits.in_capsule, limits.max_transfer)?)
        }
        io_op::WRITE_ZEROES => {
            if !ns.write_zeroes {
                return Err(Status::INVALID_OPCODE);
            }
            let (slba, blocks) = range(sqe, ns)?;
            let fua = sqe.dw[12] & 1 << 30 != 0 || (ns.vwc && !ctrl.write_cache.load(Ordering::Relaxed));
            IoOp::WriteZeroes {
                slba,
                blocks,
                deallocate: sqe.dw[12] & 1 << 25 != 0,
                fua,
            }
        }
        _ => {
            let ranges = (sqe.dw[10] & 0xff) as u16 + 1;
            let data = data_xfer(sqe, limits.in_capsule)?;
            if data.len() != ranges as u32 * 16 {
                return Err(status::DATA_SGL_LENGTH_INVALID);
            }
            IoOp::DatasetManagement {
                ranges,
                deallocate: sqe.dw[11] & 1 << 2 != 0 && ns.deallocate,
                data,
                capacity: ns.blocks,
            }
        }
    };
    Ok(IoRequest {
        cid: sqe.cid(),
        subsystem,
        nsid,
        op,
    })
}

/// The LBA range of a Read, Write or Write Zeroes (CDW10-11 SLBA, CDW12 NLB 0's based),
/// inside the namespace (else LBA Out of Range), without metadata: a metadata pointer (CDW4-5)
/// or protection information (PRINFO, CDW12 bits 29:26) is Invalid Field in Command, since
/// the target serves formats without metadata.
fn range(sqe: &Sqe, ns: &NsIo) -> Result<(u64, u32), Status> {
    if sqe.dw[4] != 0 || sqe.dw[5] != 0 || (sqe.dw[12] >> 26) & 0xf != 0 {
        return Err(Status::INVALID_FIELD);
    }
    let slba = sqe.slba();
    let blocks = sqe.blocks();
    match slba.checked_add(blocks as u64) {
        Some(end) if end <= ns.blocks => Ok((slba, blocks)),
        _ => Err(Status::LBA_OUT_OF_RANGE),
    }
}
