//! The `fuzz_fabrics` target: capsules as the NVMe-oF controller logic
//! ([`vfpoll_nvmf::fabrics`]) decodes them, after the transport has parsed their PDUs.
//!
//! # Input
//!
//! Records back to back, each `[op][SQE: 64 bytes][len: u16 LE][data: len bytes]` (a short
//! last record ends the input). `op % 6` says what the SQE is:
//!
//! - 0: a Connect with `data` as its 1024 bytes of Connect data (zero-filled past its end);
//! - 1: a Connect with Connect data built from `data`: bytes 0-1 the CNTLID (0: the current
//!   admin queue's controller), byte 2 picks the host NQN and byte 3 the subsystem NQN from
//!   [`HOSTS`] and [`SUBSYSTEMS`];
//! - 2: an admin command of the current admin queue's controller, with `data` as its data;
//! - 3: an I/O command on the current I/O queue ([`IoQueue::decode`]), with `data` as its
//!   in-capsule data;
//! - 4: an I/O command through [`Target::io_command`] for the current controller;
//! - 5: the current I/O queue disconnects (or, with no I/O queue, the admin queue).
//!
//! The target serves [`SUBSYSTEMS`]`[0]` with two namespaces (1000 blocks of 512 bytes, 100 of
//! 4 KiB) to any host, and [`SUBSYSTEMS`]`[2]` to [`HOSTS`]`[1]` only.
//!
//! # Properties
//!
//! - no panic, whatever the capsules;
//! - every completion carries the command's CID and no phase tag; a refusal has an error
//!   status; an accepted Connect says CNTLID in dword 0, opens the queue its QID names with
//!   SQSIZE + 1 entries, and comes with an I/O decoder exactly for I/O queues;
//! - admin data is exactly as long as the command's transport SGL asks, and only on success;
//! - an accepted I/O command names a namespace of the subsystem, stays inside it, moves
//!   exactly blocks × block size (at most MDTS), in the capsule only when the capsule holds
//!   it; Dataset Management ranges parse within the namespace;
//! - the two decoding paths ([`IoQueue::decode`] and [`Target::io_command`]) agree;
//! - a reservation command carries the data its opcode takes, and run through
//!   [`Target::reservation`] with its in-capsule data it answers a Report with exactly the
//!   bytes asked for and nothing else with data.

use vfpoll_nvme_spec::cmd::io_op;
use vfpoll_nvme_spec::status::Status;
use vfpoll_nvmf::fabrics::{
    data_xfer, sqe_from_bytes, sqe_to_bytes, AdminOutcome, Cntlid, ConnInfo, Cqe, DataXfer, IoOp, IoQueue,
    IoRequest, Listener, NamespaceInfo, QueueRef, Sqe, Subsystem, Target, TargetOptions, CONNECT_DATA_BYTES,
    DISCOVERY_NQN, SQE_BYTES,
};

/// Host NQNs a templated Connect picks from (byte 2 of its data, modulo the length).
pub const HOSTS: [&str; 3] = [
    "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555",
    "nqn.2014-08.org.nvmexpress:uuid:66666666-7777-8888-9999-000000000000",
    "nqn.2014-08.org.nvmexpress:uuid:not-a-uuid",
];

/// Subsystem NQNs a templated Connect picks from (byte 3, modulo the length): the served one,
/// the discovery subsystem, one for [`HOSTS`]`[1]` only, one that does not exist.
pub const SUBSYSTEMS: [&str; 4] = [
    "nqn.2024-01.io.vfpoll:fuzz",
    DISCOVERY_NQN,
    "nqn.2024-01.io.vfpoll:restricted",
    "nqn.2024-01.io.vfpoll:absent",
];

/// The host identifier of templated Connects.
pub const HOSTID: [u8; 16] = *b"fuzz-host-ident!";

/// Namespaces of the served subsystem: (NSID, block size, blocks).
const NAMESPACES: [(u32, u32, u64); 2] = [(1, 512, 1000), (2, 4096, 100)];

/// Bytes of a record before its data: op, SQE, length.
pub const RECORD_HEADER: usize = 1 + SQE_BYTES + 2;

/// Most records one input is read as.
const MAX_RECORDS: usize = 64;

/// The record operations.
pub mod op {
    /// Connect with raw Connect data.
    pub const CONNECT_RAW: u8 = 0;
    /// Connect with templated Connect data.
    pub const CONNECT: u8 = 1;
    /// Admin command.
    pub const ADMIN: u8 = 2;
    /// I/O command through the queue's decoder.
    pub const IO: u8 = 3;
    /// I/O command through the target.
    pub const IO_TARGET: u8 = 4;
    /// Disconnect.
    pub const DISCONNECT: u8 = 5;
    /// How many there are.
    pub const COUNT: u8 = 6;
}

/// The fuzz target: runs the records of `data` against a new target; panics when a property
/// breaks.
pub fn check(data: &[u8]) {
    let mut s = Session::new();
    let mut rest = data;
    for _ in 0..MAX_RECORDS {
        let Some((head, tail)) = rest.split_at_checked(RECORD_HEADER) else {
            return;
        };
        let len = u16::from_le_bytes([head[RECORD_HEADER - 2], head[RECORD_HEADER - 1]]) as usize;
        let (payload, tail) = tail.split_at(len.min(tail.len()));
        let sqe_bytes: &[u8; SQE_BYTES] = head[1..1 + SQE_BYTES].try_into().expect("64 bytes");
        let sqe = sqe_from_bytes(sqe_bytes);
        assert_eq!(&sqe_to_bytes(&sqe), sqe_bytes);
        s.record(head[0] % op::COUNT, &sqe, payload);
        rest = tail;
    }
}

/// The target and the queues the records opened.
struct Session {
    target: Target,
    admin: Option<Cntlid>,
    io: Option<IoQueue>,
}

fn target() -> Target {
    let mut served = Subsystem::new(SUBSYSTEMS[0]);
    for (nsid, bs, blocks) in NAMESPACES {
        let mut ns = NamespaceInfo::new(SUBSYSTEMS[0], nsid, "malloc:fuzz", bs, blocks);
        (ns.volatile_write_cache, ns.write_zeroes, ns.deallocate) = (nsid == 1, nsid == 1, nsid == 1);
        served.namespaces.push(ns);
    }
    let mut restricted = Subsystem::new(SUBSYSTEMS[2]);
    restricted.allowed_hosts = Some(vec![HOSTS[1].to_owned()]);
    let listeners = vec![Listener::tcp(1, ([127, 0, 0, 1], 4420).into())];
    Target::new(TargetOptions::default(), listeners, vec![served, restricted]).expect("a valid target")
}

/// A completion refusing command `sqe`.
fn assert_refusal(what: &str, sqe: &Sqe, cqe: &Cqe) {
    assert_eq!(
        cqe.cid,
        sqe.cid(),
        "{what}: the completion of CID {} says {}",
        sqe.cid(),
        cqe.cid
    );
    assert_eq!(cqe.status & 1, 0, "{what}: a phase tag on a fabrics completion");
    assert!(
        !cqe.status().is_success(),
        "{what}: a refusal with a success status: {cqe:?}"
    );
}

impl Session {
    fn new() -> Self {
        Session {
            target: target(),
            admin: None,
            io: None,
        }
    }

    fn record(&mut self, op: u8, sqe: &Sqe, data: &[u8]) {
        match op {
            op::CONNECT_RAW => {
                let mut d = [0u8; CONNECT_DATA_BYTES];
                let n = data.len().min(CONNECT_DATA_BYTES);
                d[..n].copy_from_slice(&data[..n]);
                self.connect(sqe, &d);
            }
            op::CONNECT => {
                let d = self.connect_data(data);
                self.connect(sqe, &d);
            }
            op::ADMIN => self.admin(sqe, data),
            op::IO => {
                if let Some(q) = self.io.as_mut() {
                    let r = q.decode(sqe);
                    let max = q.in_capsule_max();
                    let cntlid = q.queue().cntlid;
                    self.io_result("IoQueue::decode", sqe, data, max, r);
                    if let Ok(
                        req @ IoRequest {
                            op: IoOp::Reservation(c),
                            ..
                        },
                    ) = r
                    {
                        let host = c.data.in_capsule_slice(data).unwrap_or(&[]);
                        let (st, out) = self.target.reservation(cntlid, &req, host);
                        match c.data {
                            DataXfer::ToHost { len } if st.is_success() => {
                                assert_eq!(out.len(), len as usize)
                            }
                            _ => assert!(out.is_empty(), "{req:?} answered {} bytes", out.len()),
                        }
                    }
                }
            }
            op::IO_TARGET => {
                if let Some(c) = self.admin {
                    let r = self.target.io_command(c, sqe);
                    let max = self.target.options().in_capsule_data;
                    self.io_result("Target::io_command", sqe, data, max, r);
                }
            }
            _ => match (self.io.take(), self.admin) {
                (Some(q), _) => {
                    self.target.disconnect(q.queue());
                }
                (None, Some(c)) => {
                    let gone = self.target.disconnect(QueueRef { cntlid: c, qid: 0 });
                    assert!(gone.iter().all(|q| q.cntlid == c), "{gone:?}");
                    self.admin = None;
                }
                (None, None) => {}
            },
        }
    }

    fn connect_data(&self, data: &[u8]) -> [u8; CONNECT_DATA_BYTES] {
        let byte = |i: usize| data.get(i).copied().unwrap_or(0);
        let mut cntlid = u16::from_le_bytes([byte(0), byte(1)]);
        if cntlid == 0 {
            cntlid = self.admin.map_or(0xffff, |c| c.0);
        }
        let host = HOSTS[byte(2) as usize % HOSTS.len()];
        let sub = SUBSYSTEMS[byte(3) as usize % SUBSYSTEMS.len()];
        let mut d = [0u8; CONNECT_DATA_BYTES];
        d[..16].copy_from_slice(&HOSTID);
        d[16..18].copy_from_slice(&cntlid.to_le_bytes());
        d[256..256 + sub.len()].copy_from_slice(sub.as_bytes());
        d[512..512 + host.len()].copy_from_slice(host.as_bytes());
        d
    }

    fn connect(&mut self, sqe: &Sqe, data: &[u8; CONNECT_DATA_BYTES]) {
        let peer = ConnInfo {
            portid: 1,
            local_addr: Some("127.0.0.1".into()),
            peer: "127.0.0.1:50000".into(),
        };
        match self.target.connect(sqe, data, peer) {
            Ok(o) => {
                let qid = (sqe.dw[10] >> 16) as u16;
                let sqsize = sqe.dw[11] as u16;
                assert_eq!(o.cqe.cid, sqe.cid());
                assert!(
                    o.cqe.status().is_success() && o.cqe.status & 1 == 0,
                    "{:?}",
                    o.cqe
                );
                assert_eq!((o.queue.qid, o.cqe.dw0), (qid, o.queue.cntlid.0 as u32));
                assert_eq!(o.entries, sqsize as u32 + 1);
                assert!(sqsize > 0, "SQSIZE is 0's based and at least 1");
                assert_eq!(o.io.is_some(), qid != 0, "an I/O decoder exactly for I/O queues");
                assert!(self
                    .target
                    .controllers()
                    .iter()
                    .any(|c| c.cntlid == o.queue.cntlid));
                if let Some(q) = o.io {
                    assert_eq!(q.queue(), o.queue);
                    self.io = Some(q);
                } else {
                    self.admin = Some(o.queue.cntlid);
                }
            }
            Err(cqe) => assert_refusal("Connect", sqe, &cqe),
        }
    }

    fn admin(&mut self, sqe: &Sqe, data: &[u8]) {
        let Some(c) = self.admin else {
            return;
        };
        match self.target.admin(c, sqe, data) {
            AdminOutcome::Complete { cqe, data: out, .. } => {
                assert_eq!(cqe.cid, sqe.cid());
                assert_eq!(cqe.status & 1, 0, "a phase tag on a fabrics completion");
                if !out.is_empty() {
                    assert!(cqe.status().is_success(), "data with a refusal: {cqe:?}");
                    let want = data_xfer(sqe, 0);
                    assert_eq!(
                        want,
                        Ok(DataXfer::ToHost {
                            len: out.len() as u32
                        }),
                        "admin opcode {:#04x} returned {} bytes",
                        sqe.opcode(),
                        out.len()
                    );
                }
            }
            AdminOutcome::Held => {
                assert_eq!(sqe.opcode(), vfpoll_nvme_spec::cmd::admin_op::ASYNC_EVENT_REQUEST);
            }
        }
    }

    fn io_result(&self, what: &str, sqe: &Sqe, capsule: &[u8], icd_max: u32, r: Result<IoRequest, Cqe>) {
        // The other decoding path gives the same answer (errors are logged either way).
        if let Some(c) = self.admin.filter(|_| what == "IoQueue::decode") {
            let other = self.target.io_command(c, sqe);
            if self.io.as_ref().is_some_and(|q| q.queue().cntlid == c) {
                assert_eq!(other, r, "IoQueue::decode and Target::io_command disagree");
            }
        }
        let req = match r {
            Ok(req) => req,
            Err(cqe) => return assert_refusal(what, sqe, &cqe),
        };
        assert_eq!(req.cid, sqe.cid());
        assert_eq!(req.success().cid, sqe.cid());
        let (_, bs, blocks) = *NAMESPACES
            .iter()
            .find(|n| n.0 == req.nsid)
            .unwrap_or_else(|| panic!("{what} accepted NSID {} of no namespace", req.nsid));
        let max_transfer = self.target.options().max_transfer as u64;
        let inside = |slba: u64, n: u32| {
            assert!(
                n >= 1 && slba + n as u64 <= blocks,
                "{what}: {req:?} leaves the namespace"
            );
            n as u64 * bs as u64
        };
        match req.op {
            IoOp::Read { slba, blocks: n, len } => {
                assert_eq!(sqe.opcode(), io_op::READ);
                assert_eq!(len as u64, inside(slba, n));
                assert!(len as u64 <= max_transfer);
            }
            IoOp::Write {
                slba,
                blocks: n,
                data,
                ..
            } => {
                assert_eq!(sqe.opcode(), io_op::WRITE);
                assert_eq!(data.len() as u64, inside(slba, n));
                assert!(data.len() as u64 <= max_transfer);
                check_data(what, &req, data, capsule, icd_max);
            }
            IoOp::WriteZeroes { slba, blocks: n, .. } => {
                inside(slba, n);
            }
            IoOp::Flush => assert_eq!(sqe.opcode(), io_op::FLUSH),
            IoOp::Reservation(c) => {
                let want = match sqe.opcode() {
                    0x0d | 0x11 => 16,
                    0x15 => 8,
                    0x0e => (sqe.dw[10] as u64 + 1) * 4,
                    op => panic!("{what}: opcode {op:#04x} decoded as a reservation command"),
                };
                assert_eq!(c.data.len() as u64, want, "{req:?}");
                assert!(c.data.len() as u64 <= max_transfer);
            }
            IoOp::DatasetManagement {
                ranges,
                data,
                capacity,
                ..
            } => {
                assert!((1..=256).contains(&ranges) && capacity == blocks, "{req:?}");
                assert_eq!(data.len(), ranges as u32 * 16);
                check_data(what, &req, data, capsule, icd_max);
                if let Ok(slice) = data.in_capsule_slice(capsule) {
                    if let Ok(list) = req.dsm_ranges(slice) {
                        for r in list {
                            assert!(r.blocks > 0 && r.slba + r.blocks as u64 <= capacity, "{r:?}");
                        }
                    }
                }
            }
        }
    }
}

/// In-capsule data stays inside what the queue accepts, and the capsule holds it or the
/// command is refused.
fn check_data(what: &str, req: &IoRequest, data: DataXfer, capsule: &[u8], icd_max: u32) {
    match data {
        DataXfer::InCapsule { offset, len } => {
            assert!(offset as u64 + len as u64 <= icd_max as u64, "{what}: {req:?}");
            let fits = offset as usize + len as usize <= capsule.len();
            let slice = data.in_capsule_slice(capsule);
            assert_eq!(
                slice.is_ok(),
                fits,
                "{req:?} with {} bytes in the capsule",
                capsule.len()
            );
            if let Ok(s) = slice {
                assert_eq!(s.len(), len as usize);
            } else {
                assert!(slice.is_err_and(|st| st != Status::SUCCESS));
            }
        }
        DataXfer::FromHost { .. } => {}
        other => panic!("{what}: host-to-controller data as {other:?}: {req:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Rng;

    #[test]
    fn the_seeds_reach_io_commands() {
        for s in crate::seeds::fabrics() {
            check(&s);
        }
        // The first seed connects, enables the controller, opens an I/O queue and writes.
        let seed = &crate::seeds::fabrics()[0];
        let mut s = Session::new();
        let mut rest = &seed[..];
        let mut decoded = 0;
        while let Some((head, tail)) = rest.split_at_checked(RECORD_HEADER) {
            let len = u16::from_le_bytes([head[RECORD_HEADER - 2], head[RECORD_HEADER - 1]]) as usize;
            let (payload, tail) = tail.split_at(len);
            let sqe = sqe_from_bytes(head[1..1 + SQE_BYTES].try_into().unwrap());
            if head[0] == op::IO {
                let r = s.io.as_mut().expect("an I/O queue").decode(&sqe);
                assert!(r.is_ok(), "{r:?}");
                decoded += 1;
            }
            s.record(head[0], &sqe, payload);
            rest = tail;
        }
        assert!(decoded >= 3, "{decoded}");
    }

    #[test]
    fn mutated_seeds_keep_the_properties() {
        let seeds = crate::seeds::fabrics();
        let mut rng = Rng::new(0xfab);
        for _ in 0..3_000 {
            let s = &seeds[rng.below(seeds.len())];
            check(&rng.mutate(s));
        }
    }
}
