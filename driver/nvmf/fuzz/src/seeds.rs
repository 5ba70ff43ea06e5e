//! Seed inputs, built by the crate's own PDU builders and fabrics encoders so that they stay
//! valid as the code changes (a unit test checks that every seed is read to its end).

use vfpoll_nvme_spec::cmd::{admin_op, io_op, Command};
use vfpoll_nvmf::fabrics::{
    cc, fctype, lid, prop, sqe_to_bytes, Sqe, FABRICS_OPCODE, SGL_IN_CAPSULE, SGL_TRANSPORT,
};
use vfpoll_nvmf::pdu::{
    self, C2hData, ConnParams, Digests, Fes, H2cData, IcReq, IcResp, Pda, Phase, R2t, TargetLimits, TxHeader,
    MAX_TX_HEADER_LEN,
};

use crate::fabrics::{op, HOSTID, HOSTS, SUBSYSTEMS};
use crate::pdu::cfg;

/// A command as Linux's NVMe/TCP host sends it: PSDT 01b (SGLs), command ID `cid`, an SGL
/// descriptor `sgl_id` for `len` bytes at offset 0.
fn sqe(opcode: u8, nsid: u32, cid: u16, sgl_id: u8, len: u32) -> Sqe {
    let mut c = Command::new(opcode, nsid);
    c.set_cid(cid);
    c.dw[0] |= 1 << 14;
    c.dw[8] = len;
    c.dw[9] = (sgl_id as u32) << 24;
    c
}

fn fabrics_sqe(fct: u8, cid: u16, sgl_id: u8, len: u32) -> Sqe {
    let mut s = sqe(FABRICS_OPCODE, 0, cid, sgl_id, len);
    s.dw[1] = fct as u32;
    s
}

/// Connect for queue `qid` with `sqsize` (0's based), data in the capsule.
fn connect_sqe(qid: u16, sqsize: u16, cid: u16) -> Sqe {
    let mut s = fabrics_sqe(fctype::CONNECT, cid, SGL_IN_CAPSULE, 1024);
    s.dw[10] = (qid as u32) << 16;
    s.dw[11] = sqsize as u32;
    s.dw[12] = 15_000;
    s
}

fn rw_sqe(opcode: u8, nsid: u32, cid: u16, slba: u64, blocks: u32, sgl_id: u8, len: u32) -> Sqe {
    let mut s = sqe(opcode, nsid, cid, sgl_id, len);
    s.dw[10] = slba as u32;
    s.dw[11] = (slba >> 32) as u32;
    s.dw[12] = blocks - 1;
    s
}

/// CDW14 of the PDU seeds' commands: this | CID, a value found once in a seed (see
/// [`PLANTED_CDW14`](crate::PLANTED_CDW14)).
pub const TAG: u32 = 0x5eed_0000;

/// The SQE bytes of `s`, tagged with [`TAG`] in CDW14.
fn tagged(mut s: Sqe) -> [u8; 64] {
    s.dw[14] = TAG | s.cid() as u32;
    sqe_to_bytes(&s)
}

/// Appends a data PDU: its header, `data`, and the data digest when the header asks for one.
fn with_data(out: &mut Vec<u8>, header: &[u8], tx: TxHeader, data: &[u8]) {
    out.extend_from_slice(&header[..tx.len]);
    out.extend_from_slice(data);
    if let Some(mut d) = tx.data_digest {
        d.update(data);
        out.extend_from_slice(&d.to_wire());
    }
}

/// A host's PDUs on connection `conn`: commands with and without in-capsule data, H2CData
/// answering an R2T in two pieces, and finally an H2CTermReq.
fn host_pdus(out: &mut Vec<u8>, conn: &ConnParams, first_cid: u16) {
    let mut h = [0u8; MAX_TX_HEADER_LEN];
    let connect = tagged(connect_sqe(0, 31, first_cid));
    let mut connect_data = [0u8; 1024];
    connect_data[256..256 + SUBSYSTEMS[0].len()].copy_from_slice(SUBSYSTEMS[0].as_bytes());
    let tx = pdu::capsule_cmd_header(&mut h, &connect, 1024, conn).expect("fits");
    with_data(out, &h, tx, &connect_data);

    let read = tagged(rw_sqe(io_op::READ, 1, first_cid + 1, 0, 8, SGL_TRANSPORT, 4096));
    let tx = pdu::capsule_cmd_header(&mut h, &read, 0, conn).expect("fits");
    with_data(out, &h, tx, &[]);

    let write = tagged(rw_sqe(io_op::WRITE, 1, first_cid + 2, 8, 1, SGL_IN_CAPSULE, 512));
    let tx = pdu::capsule_cmd_header(&mut h, &write, 512, conn).expect("fits");
    with_data(out, &h, tx, &[0xa5; 512]);

    // A write of 8 KiB whose data comes after an R2T, in two H2CData of 4 KiB.
    let cccid = first_cid + 3;
    let big = tagged(rw_sqe(io_op::WRITE, 1, cccid, 16, 16, SGL_TRANSPORT, 8192));
    let tx = pdu::capsule_cmd_header(&mut h, &big, 0, conn).expect("fits");
    with_data(out, &h, tx, &[]);
    for (i, last) in [(0u32, false), (1, true)] {
        let d = H2cData {
            cccid,
            ttag: 7,
            datao: i * 4096,
            datal: 4096,
            last,
        };
        let tx = pdu::h2c_data_header(&mut h, &d, conn).expect("fits");
        with_data(out, &h, tx, &[i as u8; 4096]);
    }
    let n = pdu::h2c_term_req(&mut h, Fes::PduSequenceError, 0, &out[..24]).expect("fits");
    out.extend_from_slice(&h[..n]);
}

/// A controller's PDUs on connection `conn`: a CapsuleResp, an R2T, C2HData in two pieces (the
/// last with SUCCESS), and finally a C2HTermReq.
fn controller_pdus(out: &mut Vec<u8>, conn: &ConnParams) {
    let mut h = [0u8; MAX_TX_HEADER_LEN];
    let mut cqe = [0u8; 16];
    cqe[12..14].copy_from_slice(&1u16.to_le_bytes());
    let n = pdu::capsule_resp(&mut h, &cqe, conn.digests).expect("fits");
    out.extend_from_slice(&h[..n]);
    let r = R2t {
        cccid: 2,
        ttag: 1,
        r2to: 0,
        r2tl: 8192,
    };
    let n = pdu::r2t(&mut h, &r, conn.digests).expect("fits");
    out.extend_from_slice(&h[..n]);
    for (i, last) in [(0u32, false), (1, true)] {
        let d = C2hData {
            cccid: 3,
            datao: i * 1000,
            datal: 1000,
            last,
            success: last,
        };
        let tx = pdu::c2h_data_header(&mut h, &d, conn).expect("fits");
        with_data(out, &h, tx, &[0x3c; 1000]);
    }
    let n = pdu::c2h_term_req(&mut h, Fes::InvalidHeaderField, 4, &out[..24]).expect("fits");
    out.extend_from_slice(&h[..n]);
}

/// The connection a seed's first two bytes describe, after the ICReq/ICResp exchange.
fn ready(c0: u8, c1: u8) -> ConnParams {
    let mut conn = ConnParams::new(&TargetLimits::default());
    conn.phase = Phase::Ready;
    conn.digests = Digests::from_dgst(c0 & 3);
    conn.cpda = Pda::new(c1 & 31).expect("0 to 31");
    conn.hpda = conn.cpda;
    conn
}

/// Config byte 0 with the default limits (MAXH2CDATA 128 KiB, 8 KiB of in-capsule data).
const DEFAULT_LIMITS: u8 = 2 << 4 | 2 << 6;

/// Seeds of the PDU target: as a controller and as a host, with and without digests, before
/// the ICReq/ICResp exchange (which the seed then makes) and after it with padding.
pub fn pdu() -> Vec<Vec<u8>> {
    let mut seeds = Vec::new();
    let mut h = [0u8; MAX_TX_HEADER_LEN];
    for digests in [
        Digests::NONE,
        Digests {
            header: true,
            data: true,
        },
        Digests {
            header: true,
            data: false,
        },
    ] {
        // Controller: the ICReq, then the host's PDUs on what it negotiated.
        let c0 = DEFAULT_LIMITS | digests.dgst();
        let mut s = vec![c0, 1 << 5];
        let req = IcReq {
            pfv: 0,
            hpda: 0,
            digests,
            maxr2t: 0,
        };
        let n = pdu::ic_req(&mut h, &req).expect("fits");
        s.extend_from_slice(&h[..n]);
        let (_, conn) = pdu::negotiate(&req, &TargetLimits::default()).expect("a valid ICReq");
        host_pdus(&mut s, &conn, 1);
        seeds.push(s);

        // Host: the ICResp, then the controller's PDUs.
        let mut s = vec![c0 | cfg::HOST, 0];
        let resp = IcResp {
            pfv: 0,
            cpda: 0,
            digests,
            maxh2cdata: TargetLimits::DEFAULT_MAXH2CDATA,
        };
        let n = pdu::ic_resp(&mut h, &resp).expect("fits");
        s.extend_from_slice(&h[..n]);
        let conn = pdu::host_accept_ic_resp(&req, &resp).expect("a valid ICResp");
        controller_pdus(&mut s, &conn);
        seeds.push(s);
    }
    // After the exchange, with data aligned to 16 and 128 bytes (padding after the header).
    for (c0, c1) in [(cfg::READY | 3, 3), (cfg::READY | 1, 31), (cfg::READY, 0)] {
        let c0 = c0 | DEFAULT_LIMITS;
        let mut s = vec![c0, c1];
        host_pdus(&mut s, &ready(c0, c1), 0x40);
        seeds.push(s);
        let mut s = vec![c0 | cfg::HOST, c1];
        controller_pdus(&mut s, &ready(c0, c1));
        seeds.push(s);
    }
    seeds
}

/// An input that reaches the planted crash: an accepted CapsuleCmd with the planted CDW14.
pub fn pdu_planted_example() -> Vec<u8> {
    let c0 = cfg::READY | DEFAULT_LIMITS;
    let mut s = vec![c0, 0];
    let mut h = [0u8; MAX_TX_HEADER_LEN];
    let mut flush = sqe(io_op::FLUSH, 1, 1, SGL_TRANSPORT, 0);
    flush.dw[14] = crate::PLANTED_CDW14;
    let cmd = sqe_to_bytes(&flush);
    let tx = pdu::capsule_cmd_header(&mut h, &cmd, 0, &ready(c0, 0)).expect("fits");
    with_data(&mut s, &h, tx, &[]);
    s
}

/// A fabrics record.
fn record(out: &mut Vec<u8>, op: u8, sqe: &Sqe, data: &[u8]) {
    out.push(op);
    out.extend_from_slice(&sqe_to_bytes(sqe));
    out.extend_from_slice(&u16::try_from(data.len()).expect("short data").to_le_bytes());
    out.extend_from_slice(data);
}

/// Templated Connect data: CNTLID (0: the current controller), host and subsystem indexes.
fn template(cntlid: u16, host: u8, sub: u8) -> [u8; 4] {
    let c = cntlid.to_le_bytes();
    [c[0], c[1], host, sub]
}

/// Admin queue up and the controller enabled as Linux does it (Property Set CC, Property Get
/// CSTS, Identify Controller, Set Features Async Event Configuration).
fn bring_up(s: &mut Vec<u8>, connect: impl FnOnce(&mut Vec<u8>)) {
    connect(s);
    let mut set = fabrics_sqe(fctype::PROPERTY_SET, 2, SGL_TRANSPORT, 0);
    set.dw[11] = prop::CC;
    set.dw[12] = cc::EN | 6 << cc::IOSQES_SHIFT | 4 << cc::IOCQES_SHIFT;
    record(s, op::ADMIN, &set, &[]);
    let mut get = fabrics_sqe(fctype::PROPERTY_GET, 3, SGL_TRANSPORT, 0);
    get.dw[11] = prop::CSTS;
    record(s, op::ADMIN, &get, &[]);
    let mut id = sqe(admin_op::IDENTIFY, 0, 4, SGL_TRANSPORT, 4096);
    id.dw[10] = 1;
    record(s, op::ADMIN, &id, &[]);
    let mut aec = sqe(admin_op::SET_FEATURES, 0, 5, SGL_TRANSPORT, 0);
    aec.dw[10] = 0x0b;
    aec.dw[11] = 1 << 8;
    record(s, op::ADMIN, &aec, &[]);
}

/// I/O on an open queue: an in-capsule write, a read, a write by R2T, Write Zeroes, Dataset
/// Management with one range in the capsule, Flush.
fn io(s: &mut Vec<u8>, op: u8) {
    record(
        s,
        op,
        &rw_sqe(io_op::WRITE, 1, 10, 0, 2, SGL_IN_CAPSULE, 1024),
        &[0x5a; 1024],
    );
    record(
        s,
        op,
        &rw_sqe(io_op::READ, 2, 11, 99, 1, SGL_TRANSPORT, 4096),
        &[],
    );
    record(
        s,
        op,
        &rw_sqe(io_op::WRITE, 1, 12, 100, 64, SGL_TRANSPORT, 32768),
        &[],
    );
    record(
        s,
        op,
        &rw_sqe(io_op::WRITE_ZEROES, 1, 13, 500, 10, SGL_TRANSPORT, 0),
        &[],
    );
    let mut dsm = sqe(io_op::DATASET_MANAGEMENT, 1, 14, SGL_IN_CAPSULE, 16);
    dsm.dw[11] = 1 << 2;
    let mut range = [0u8; 16];
    range[4..8].copy_from_slice(&8u32.to_le_bytes());
    range[8..16].copy_from_slice(&40u64.to_le_bytes());
    record(s, op, &dsm, &range);
    record(s, op, &sqe(io_op::FLUSH, 1, 15, SGL_TRANSPORT, 0), &[]);
}

/// Seeds of the fabrics target: a controller brought up and I/O on an I/O queue (templated
/// and raw Connect data), a discovery controller reading its log page, a refused host, and
/// admin commands (Get Log Page, Asynchronous Event Request, Keep Alive) before a disconnect.
pub fn fabrics() -> Vec<Vec<u8>> {
    let mut seeds = Vec::new();

    let mut s = Vec::new();
    bring_up(&mut s, |s| {
        record(s, op::CONNECT, &connect_sqe(0, 31, 1), &template(0xffff, 0, 0))
    });
    record(&mut s, op::CONNECT, &connect_sqe(1, 127, 9), &template(0, 0, 0));
    io(&mut s, op::IO);
    io(&mut s, op::IO_TARGET);
    record(&mut s, op::DISCONNECT, &Command::new(0, 0), &[]);
    record(&mut s, op::DISCONNECT, &Command::new(0, 0), &[]);
    seeds.push(s);

    // The same with raw Connect data, as the host puts it on the wire.
    let raw = |cntlid: u16| {
        let mut d = vec![0u8; 1024];
        d[..16].copy_from_slice(&HOSTID);
        d[16..18].copy_from_slice(&cntlid.to_le_bytes());
        d[256..256 + SUBSYSTEMS[0].len()].copy_from_slice(SUBSYSTEMS[0].as_bytes());
        d[512..512 + HOSTS[0].len()].copy_from_slice(HOSTS[0].as_bytes());
        d
    };
    let mut s = Vec::new();
    bring_up(&mut s, |s| {
        record(s, op::CONNECT_RAW, &connect_sqe(0, 31, 1), &raw(0xffff))
    });
    record(&mut s, op::CONNECT_RAW, &connect_sqe(2, 63, 9), &raw(1));
    io(&mut s, op::IO);
    seeds.push(s);

    // Discovery: connect, enable, the discovery log page.
    let mut s = Vec::new();
    bring_up(&mut s, |s| {
        record(s, op::CONNECT, &connect_sqe(0, 31, 1), &template(0xffff, 0, 1))
    });
    let mut log = sqe(admin_op::GET_LOG_PAGE, 0, 6, SGL_TRANSPORT, 1024);
    log.dw[10] = lid::DISCOVERY as u32 | (1024 / 4 - 1) << 16;
    record(&mut s, op::ADMIN, &log, &[]);
    seeds.push(s);

    // A host the restricted subsystem refuses, then the one it allows; admin commands.
    let mut s = Vec::new();
    record(
        &mut s,
        op::CONNECT,
        &connect_sqe(0, 31, 1),
        &template(0xffff, 0, 2),
    );
    bring_up(&mut s, |s| {
        record(s, op::CONNECT, &connect_sqe(0, 31, 1), &template(0xffff, 1, 2))
    });
    let mut log = sqe(admin_op::GET_LOG_PAGE, 0, 6, SGL_TRANSPORT, 512);
    log.dw[10] = lid::SMART as u32 | (512 / 4 - 1) << 16;
    record(&mut s, op::ADMIN, &log, &[]);
    record(
        &mut s,
        op::ADMIN,
        &sqe(admin_op::ASYNC_EVENT_REQUEST, 0, 7, SGL_TRANSPORT, 0),
        &[],
    );
    record(&mut s, op::ADMIN, &sqe(0x18, 0, 8, SGL_TRANSPORT, 0), &[]);
    record(&mut s, op::DISCONNECT, &Command::new(0, 0), &[]);
    seeds.push(s);
    seeds
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every PDU seed is read to its end without an error: what a seed means to exercise, it
    /// does.
    #[test]
    fn pdu_seeds_are_valid_streams() {
        for s in pdu() {
            let after_ic = s[0] & cfg::READY != 0;
            let host = s[0] & cfg::HOST != 0;
            let mut conn = if after_ic {
                ready(s[0], s[1])
            } else {
                ConnParams::new(&TargetLimits::default())
            };
            let mut pos = 2;
            let mut count = 0;
            while pos < s.len() {
                let b = &s[pos..];
                let plen = if host {
                    let pdu::Progress::Done(h) = pdu::parse_c2h_header(b, &conn).expect("valid") else {
                        panic!("short")
                    };
                    if let pdu::CtrlPdu::IcResp(r) = h.pdu {
                        let req = IcReq {
                            pfv: 0,
                            hpda: 0,
                            digests: r.digests,
                            maxr2t: 0,
                        };
                        conn = pdu::host_accept_ic_resp(&req, &r).unwrap();
                    }
                    h.layout.plen()
                } else {
                    let pdu::Progress::Done(h) = pdu::parse_header(b, &conn).expect("valid") else {
                        panic!("short")
                    };
                    if let pdu::HostPdu::IcReq(r) = h.pdu {
                        conn = pdu::negotiate(&r, &TargetLimits::default()).unwrap().1;
                    }
                    h.layout.plen()
                };
                pos += plen as usize;
                count += 1;
            }
            assert_eq!(pos, s.len());
            assert!(count >= 5, "{count}");
        }
    }
}
