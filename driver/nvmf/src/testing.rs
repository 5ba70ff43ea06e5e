//! A loopback NVMe/TCP test host, for the crate's integration tests and its `qos_bench`
//! example (feature `testing`, which only the crate's own dev-dependency turns on): a RAM-backed
//! [`Server`] on 127.0.0.1 and a client ([`Host`]) built from the PDU module's host-side
//! builders (ICReq, capsules, H2CData, digests), with Connect and command helpers.
//!
//! It lives in the library rather than in `tests/` so that the tests and the example share
//! one copy without a `#[path]` module. Everything here panics on what a conforming target
//! would not do: it is a test harness, not an initiator.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::backend::{Backend, MallocBackend};
use crate::fabrics::{
    cqe_to_bytes, ctrl_off, fctype, ns_off, prop, sqe_to_bytes, Cqe, Listener, NamespaceInfo, Sqe, Subsystem,
    Target, TargetOptions, FABRICS_OPCODE, SGL_IN_CAPSULE, SGL_TRANSPORT,
};
use crate::pdu::{
    capsule_cmd_header, h2c_data_header, host_accept_ic_resp, ic_req, read_c2h_header, ConnParams, CtrlPdu,
    Digests, Fes, H2cData, IcReq, Layout, TargetLimits, MAX_TX_HEADER_LEN,
};
use crate::server::{NamespaceBackend, Server, ServerConfig, WorkerConfig};
use vfpoll_dma::{DmaContext, PageSize};
use vfpoll_nvme_spec::cmd::{admin_op, Command};

pub const SUB: &str = "nqn.2024-01.io.vfpoll:tcp-test";
pub const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555";
pub const HOSTID: [u8; 16] = *b"host-identifier!";
pub const BLOCKS: u64 = 4096;
pub const BS: usize = 512;
/// The test pool's buffers live in 4 KiB pages (no hugepages needed), one page each: so
/// MDTS and MAXH2CDATA are 4 KiB, and writes above the 1 KiB in-capsule limit use R2T.
pub const MAXH2CDATA: u32 = 4096;
pub const ICD: u32 = 1024;
/// CC as Linux writes it: EN, IOSQES 6, IOCQES 4.
pub const LINUX_CC: u32 = 1 | 6 << 16 | 4 << 20;

pub fn server() -> Server {
    server_with(1)
}

/// A server with `workers` workers, each with its own RAM backend over one shared storage.
pub fn server_with(workers: usize) -> Server {
    let storage = MallocBackend::storage(BLOCKS as usize * BS);
    server_over(
        (0..workers)
            .map(|_| Box::new(MallocBackend::new(storage.clone(), BS)) as Box<dyn Backend>)
            .collect(),
    )
}

/// A server with one worker per backend, each serving namespace 1 through its backend.
pub fn server_over(backends: Vec<Box<dyn Backend>>) -> Server {
    let mut sub = Subsystem::new(SUB);
    let mut ns = NamespaceInfo::new(SUB, 1, "malloc:tcp-test", BS as u32, BLOCKS);
    ns.write_zeroes = true;
    ns.deallocate = true;
    sub.namespaces.push(ns);
    serve(vec![sub], backends)
}

/// A server on 127.0.0.1 (port 1, an ephemeral TCP port) for `subsystems`, with 8 KiB
/// transfers and [`ICD`] bytes in capsule, and one worker per backend, each serving namespace
/// 1 of [`SUB`] through its backend.
pub fn serve(subsystems: Vec<Subsystem>, backends: Vec<Box<dyn Backend>>) -> Server {
    let opts = TargetOptions {
        max_transfer: 8192,
        in_capsule_data: ICD,
        ..TargetOptions::default()
    };
    let target = Target::new(
        opts,
        vec![Listener::tcp(1, "127.0.0.1:0".parse().unwrap())],
        subsystems,
    )
    .unwrap();
    Server::start(ServerConfig {
        target,
        workers: backends
            .into_iter()
            .map(|backend| {
                WorkerConfig::new(vec![NamespaceBackend {
                    subsystem_nqn: SUB.into(),
                    nsid: 1,
                    backend,
                }])
            })
            .collect(),
        dma: DmaContext::for_testing(),
        page_size: PageSize::Base4K,
        buffers: 8,
        maxh2cdata: MAXH2CDATA,
        spin: crate::server::DEFAULT_SPIN,
    })
    .unwrap()
}

/// A received controller PDU and its data.
pub struct Rx {
    pub pdu: CtrlPdu,
    pub data: Vec<u8>,
}

/// A test host on one connection.
#[derive(Debug)]
pub struct Host {
    pub s: TcpStream,
    pub params: ConnParams,
    pub cid: u16,
}

impl Host {
    pub fn tcp(addr: SocketAddr) -> Host {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Host {
            s,
            params: ConnParams::new(&TargetLimits::default()),
            cid: 0,
        }
    }

    /// Connects and exchanges ICReq/ICResp.
    pub fn new(addr: SocketAddr, digests: Digests) -> Host {
        let mut h = Host::tcp(addr);
        let req = IcReq {
            pfv: 0,
            hpda: 0,
            digests,
            maxr2t: 0,
        };
        let mut out = [0u8; 128];
        let n = ic_req(&mut out, &req).unwrap();
        h.s.write_all(&out[..n]).unwrap();
        let Rx {
            pdu: CtrlPdu::IcResp(resp),
            ..
        } = h.recv().unwrap()
        else {
            panic!("no ICResp")
        };
        h.params = host_accept_ic_resp(&req, &resp).unwrap();
        assert_eq!(resp.maxh2cdata, MAXH2CDATA);
        h
    }

    /// Reads one PDU; `None` at end of stream.
    pub fn recv(&mut self) -> Option<Rx> {
        let h = match read_c2h_header(&mut self.s, &self.params) {
            Ok((h, _)) => h,
            Err(e) => {
                assert!(
                    matches!(e.kind(), ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset),
                    "{e}"
                );
                return None;
            }
        };
        let l: Layout = h.layout;
        let mut rest = vec![0u8; l.after_header() as usize];
        self.s.read_exact(&mut rest).unwrap();
        let (pad, len) = (l.pad as usize, l.data_len as usize);
        let data = rest[pad..pad + len].to_vec();
        if l.data_digest {
            let d = &rest[pad + len..];
            assert_eq!(
                crc32c::crc32c(&data).to_le_bytes(),
                d,
                "data digest of a {:?}",
                h.pdu
            );
        }
        Some(Rx { pdu: h.pdu, data })
    }

    pub fn send_capsule(&mut self, sqe: &Sqe, icd: &[u8]) {
        let mut out = [0u8; MAX_TX_HEADER_LEN];
        let h = capsule_cmd_header(&mut out, &sqe_to_bytes(sqe), icd.len() as u32, &self.params).unwrap();
        let mut msg = out[..h.len].to_vec();
        msg.extend_from_slice(icd);
        if let Some(mut d) = h.data_digest {
            d.update(icd);
            msg.extend_from_slice(&d.to_wire());
        }
        self.s.write_all(&msg).unwrap();
    }

    /// Sends `sqe` (with a fresh CID) and runs it to its completion: answers R2Ts from
    /// `write`, gathers C2HData. `corrupt`: the first H2CData's data digest is wrong.
    pub fn run(&mut self, mut sqe: Sqe, icd: &[u8], write: &[u8], corrupt: bool) -> (Cqe, Vec<u8>) {
        self.cid = self.cid.wrapping_add(1);
        sqe.set_cid(self.cid);
        self.send_capsule(&sqe, icd);
        let mut read = Vec::new();
        let mut corrupt = corrupt;
        loop {
            let rx = self.recv().expect("connection ended before the completion");
            match rx.pdu {
                CtrlPdu::CapsuleResp(r) => {
                    let cqe = Cqe::from_dwords(core::array::from_fn(|i| {
                        u32::from_le_bytes(r.cqe[4 * i..4 * i + 4].try_into().unwrap())
                    }));
                    assert_eq!(cqe.cid, self.cid);
                    assert_eq!(cqe_to_bytes(&cqe), r.cqe);
                    return (cqe, read);
                }
                CtrlPdu::C2hData(d) => {
                    assert_eq!(d.cccid, self.cid);
                    assert_eq!(d.datao as usize, read.len(), "C2HData in order");
                    read.extend_from_slice(&rx.data);
                }
                CtrlPdu::R2t(r) => {
                    assert_eq!(r.cccid, self.cid);
                    assert!(r.r2tl <= MAXH2CDATA, "one R2T at most MAXH2CDATA");
                    let mut off = r.r2to;
                    while off < r.r2to + r.r2tl {
                        let n = (r.r2to + r.r2tl - off).min(1024);
                        let d = H2cData {
                            cccid: r.cccid,
                            ttag: r.ttag,
                            datao: off,
                            datal: n,
                            last: off + n == r.r2to + r.r2tl,
                        };
                        let mut out = [0u8; MAX_TX_HEADER_LEN];
                        let h = h2c_data_header(&mut out, &d, &self.params).unwrap();
                        let chunk = &write[off as usize..(off + n) as usize];
                        let mut msg = out[..h.len].to_vec();
                        msg.extend_from_slice(chunk);
                        if let Some(mut dg) = h.data_digest {
                            dg.update(chunk);
                            let mut w = dg.to_wire();
                            if corrupt {
                                w[0] ^= 1;
                                corrupt = false;
                            }
                            msg.extend_from_slice(&w);
                        }
                        self.s.write_all(&msg).unwrap();
                        off += n;
                    }
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    /// The connection ends (after a C2HTermReq with `fes`, when given).
    pub fn expect_term(&mut self, fes: Option<Fes>) {
        match (self.recv(), fes) {
            (
                Some(Rx {
                    pdu: CtrlPdu::C2hTermReq(t),
                    ..
                }),
                Some(f),
            ) => assert_eq!(t.status(), Some(f)),
            (None, None) => return,
            (other, _) => panic!(
                "expected a termination with {fes:?}, got {:?}",
                other.map(|r| r.pdu)
            ),
        }
        assert!(self.recv().is_none(), "the connection closes after a C2HTermReq");
    }
}

/// A command as Linux's host sends it: PSDT 01b, a transport SGL of `len` bytes.
pub fn sqe(opcode: u8, nsid: u32, len: u32) -> Sqe {
    let mut c = Command::new(opcode, nsid);
    c.dw[0] |= 1 << 14;
    c.dw[8] = len;
    c.dw[9] = (SGL_TRANSPORT as u32) << 24;
    c
}

pub fn in_capsule(mut c: Sqe, len: u32) -> Sqe {
    c.dw[8] = len;
    c.dw[9] = (SGL_IN_CAPSULE as u32) << 24;
    c
}

pub fn connect_sqe(qid: u16, sqsize: u16) -> Sqe {
    let mut s = in_capsule(sqe(FABRICS_OPCODE, 0, 0), 1024);
    s.dw[1] = fctype::CONNECT as u32;
    s.dw[10] = (qid as u32) << 16;
    s.dw[11] = sqsize as u32;
    s.dw[12] = if qid == 0 { 10_000 } else { 0 };
    s
}

/// Connect of an admin queue with keep-alive timeout `kato_ms`.
pub fn connect_kato(kato_ms: u32) -> Sqe {
    let mut s = connect_sqe(0, 31);
    s.dw[12] = kato_ms;
    s
}

pub fn connect_data(cntlid: u16) -> Vec<u8> {
    connect_data_for(cntlid, SUB, HOST)
}

/// Connect data for subsystem `subnqn` as host `hostnqn` (host ID [`HOSTID`]).
pub fn connect_data_for(cntlid: u16, subnqn: &str, hostnqn: &str) -> Vec<u8> {
    let mut d = vec![0u8; 1024];
    d[..16].copy_from_slice(&HOSTID);
    d[16..18].copy_from_slice(&cntlid.to_le_bytes());
    d[256..256 + subnqn.len()].copy_from_slice(subnqn.as_bytes());
    d[512..512 + hostnqn.len()].copy_from_slice(hostnqn.as_bytes());
    d
}

/// An admin queue to subsystem `subnqn` as host `hostnqn`, enabled: the host and its
/// CNTLID, or the Connect's failed completion.
pub fn admin_to(addr: SocketAddr, subnqn: &str, hostnqn: &str) -> Result<(Host, u16), Cqe> {
    let mut a = Host::new(addr, Digests::default());
    let (cqe, _) = a.run(
        connect_sqe(0, 31),
        &connect_data_for(0xffff, subnqn, hostnqn),
        &[],
        false,
    );
    if !cqe.status().is_success() {
        return Err(cqe);
    }
    enable(&mut a);
    Ok((a, cqe.dw0 as u16))
}

/// An I/O queue of controller `cntlid` of subsystem `subnqn` (host [`HOST`]).
pub fn io_to(addr: SocketAddr, subnqn: &str, cntlid: u16) -> Host {
    let mut q = Host::new(addr, Digests::default());
    let (cqe, _) = q.run(
        connect_sqe(1, 31),
        &connect_data_for(cntlid, subnqn, HOST),
        &[],
        false,
    );
    ok(&cqe);
    q
}

pub fn ok(cqe: &Cqe) {
    assert!(cqe.status().is_success(), "{:?}", cqe.status());
}

/// Property Set CC.EN as Linux does.
pub fn enable(a: &mut Host) {
    let mut set = sqe(FABRICS_OPCODE, 0, 0);
    set.dw[1] = fctype::PROPERTY_SET as u32;
    set.dw[11] = prop::CC;
    set.dw[12] = LINUX_CC;
    ok(&a.run(set, &[], &[], false).0);
}

/// Admin queue: Connect, enable, Identify. Returns the host and its CNTLID.
pub fn admin(addr: SocketAddr, digests: Digests) -> (Host, u16) {
    let mut a = Host::new(addr, digests);
    let (cqe, _) = a.run(connect_sqe(0, 31), &connect_data(0xffff), &[], false);
    ok(&cqe);
    assert_eq!((cqe.sq_id, cqe.sq_head), (0, 1), "SQID and SQHD filled in");
    let cntlid = cqe.dw0 as u16;
    enable(&mut a);
    let mut id = sqe(admin_op::IDENTIFY, 0, 4096);
    id.dw[10] = 1;
    let (cqe, data) = a.run(id, &[], &[], false);
    ok(&cqe);
    assert_eq!(data.len(), 4096);
    assert_eq!(
        u16::from_le_bytes([data[ctrl_off::CNTLID], data[ctrl_off::CNTLID + 1]]),
        cntlid
    );
    let mut id = sqe(admin_op::IDENTIFY, 1, 4096);
    id.dw[10] = 0;
    let (cqe, data) = a.run(id, &[], &[], false);
    ok(&cqe);
    let nsze = u64::from_le_bytes(data[ns_off::NSZE..ns_off::NSZE + 8].try_into().unwrap());
    assert_eq!(nsze, BLOCKS);
    (a, cntlid)
}

pub fn io(addr: SocketAddr, cntlid: u16, digests: Digests) -> Host {
    let mut q = Host::new(addr, digests);
    let (cqe, _) = q.run(connect_sqe(1, 31), &connect_data(cntlid), &[], false);
    ok(&cqe);
    assert_eq!(cqe.sq_id, 1);
    q
}

pub fn rw(op: u8, slba: u64, blocks: u32) -> Sqe {
    let mut c = sqe(op, 1, blocks * BS as u32);
    c.set_lba_range(slba, blocks);
    c
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

pub const READ: u8 = 0x02;
pub const WRITE: u8 = 0x01;
pub const KEEP_ALIVE: u8 = 0x18;
