//! Framing against PDUs written byte by byte from the NVMe/TCP 1.0c layouts (§3.6.2): what a
//! host's bytes come out as, and the bytes of what the connection sends.

use vfpoll_dma::DmaPool;

use super::super::testing::{eventually, pool, socket_pair, Host};
use super::*;
use crate::pdu::{CtrlPdu, Fes};

/// HDGSTF and DDGSTF (§3.6.2.1 FLAGS).
const HD: u8 = 1;
const DD: u8 = 2;
const LAST_PDU: u8 = 4;

fn le32(v: u32) -> [u8; 4] {
    v.to_le_bytes()
}

/// An ICReq (§3.6.2.2): type 00h, HLEN 128, PLEN 128; PFV 0, HPDA 0, DGST, MAXR2T 0.
fn icreq(dgst: u8) -> Vec<u8> {
    let mut b = vec![0u8; 128];
    b[..8].copy_from_slice(&[0x00, 0, 128, 0, 128, 0, 0, 0]);
    b[11] = dgst;
    b
}

/// A Fabrics command capsule (§3.6.2.6) with `data` in the capsule: HLEN 72, the SQE
/// (opcode 7Fh, CID `cid`), with header and data digests when `digests`.
fn capsule(cid: u16, data: &[u8], digests: bool) -> Vec<u8> {
    let dg = if digests { 4 } else { 0 };
    let pdo = if data.is_empty() { 0 } else { 72 + dg };
    let plen = 72 + dg + data.len() + if data.is_empty() { 0 } else { dg };
    let flags = if digests {
        HD | if data.is_empty() { 0 } else { DD }
    } else {
        0
    };
    let mut b = vec![0x04, flags, 72, pdo as u8];
    b.extend_from_slice(&le32(plen as u32));
    let mut sqe = [0u8; 64];
    sqe[0] = 0x7F;
    sqe[2..4].copy_from_slice(&cid.to_le_bytes());
    b.extend_from_slice(&sqe);
    if digests {
        let h = crc32c::crc32c(&b);
        b.extend_from_slice(&le32(h));
    }
    b.extend_from_slice(data);
    if digests && !data.is_empty() {
        b.extend_from_slice(&le32(crc32c::crc32c(data)));
    }
    b
}

/// An H2CData without digests (§3.6.2.8): HLEN 24, PDO 24.
fn h2c(cccid: u16, ttag: u16, datao: u32, data: &[u8], last: bool) -> Vec<u8> {
    let mut b = vec![0x06, if last { LAST_PDU } else { 0 }, 24, 24];
    b.extend_from_slice(&le32(24 + data.len() as u32));
    b.extend_from_slice(&cccid.to_le_bytes());
    b.extend_from_slice(&ttag.to_le_bytes());
    b.extend_from_slice(&le32(datao));
    b.extend_from_slice(&le32(data.len() as u32));
    b.extend_from_slice(&[0; 4]);
    b.extend_from_slice(data);
    b
}

fn framing() -> (Framing, Host, DmaPool) {
    let (t, h) = socket_pair();
    (
        Framing::new(t, &TargetLimits::default()),
        Host::new(h),
        pool(8192, 2),
    )
}

/// Steps until a PDU or an H2CData header is complete (or an error).
fn next(f: &mut Framing, pool: &mut DmaPool, mut dest: Option<&mut DmaBuf>) -> Result<Step, pdu::Error> {
    eventually(|| match f.step(pool, dest.as_deref_mut()) {
        Ok(Step::Idle | Step::Partial) => None,
        other => Some(other),
    })
}

/// ICReq in, ICResp out (§3.6.2.3): the digests mirrored, MAXH2CDATA the target's.
fn initialize(f: &mut Framing, h: &mut Host, pool: &mut DmaPool, dgst: u8) {
    h.send(&icreq(dgst));
    assert!(matches!(next(f, pool, None), Ok(Step::Pdu(Received::IcReq))));
    assert!(f.flush(pool, "host").progress);
    let mut r = [0u8; 128];
    std::io::Read::read_exact(&mut h.s, &mut r).unwrap();
    assert_eq!(r[..8], [0x01, 0, 128, 0, 128, 0, 0, 0], "ICResp common header");
    assert_eq!(r[8..12], [0, 0, 0, dgst], "PFV 0, CPDA 0, DGST mirrored");
    assert_eq!(
        u32::from_le_bytes(r[12..16].try_into().unwrap()),
        TargetLimits::default().maxh2cdata()
    );
    assert!(r[16..].iter().all(|&b| b == 0), "reserved");
    assert_eq!(f.params.digests.dgst(), dgst);
    h.params = f.params;
}

#[test]
fn icreq_is_answered_and_sets_the_digests() {
    let (mut f, mut h, mut pool) = framing();
    // In two pieces: the common header alone first.
    let b = icreq(HD | DD);
    h.send(&b[..8]);
    assert!(matches!(
        eventually(|| match f.step(&mut pool, None) {
            Ok(Step::Idle) => None,
            other => Some(other),
        }),
        Ok(Step::Partial)
    ));
    h.send(&b[8..]);
    assert!(matches!(
        next(&mut f, &mut pool, None),
        Ok(Step::Pdu(Received::IcReq))
    ));
    assert!(f.flush(&mut pool, "host").progress);
    assert!(f.params.digests.header && f.params.digests.data);
    assert!(!f.busy(), "the ICResp is sent, nothing staged");
}

#[test]
fn capsule_with_digests_comes_out_whole() {
    let (mut f, mut h, mut pool) = framing();
    initialize(&mut f, &mut h, &mut pool, HD | DD);
    let data: Vec<u8> = (0..1024u32).map(|i| (i * 7) as u8).collect();
    h.send(&capsule(0x1234, &data, true));
    let Ok(Step::Pdu(Received::Capsule(c))) = next(&mut f, &mut pool, None) else {
        panic!("no capsule")
    };
    assert_eq!(c.cmd.cid(), 0x1234);
    assert_eq!(c.cmd.opcode(), 0x7F);
    assert_eq!(c.data(), &data[..]);
    assert!(c.digest_ok);
    // A wrong data digest: the capsule still comes out (its command fails, the connection
    // stays, §3.3.1.1), marked.
    let mut bad = capsule(0x1235, &data, true);
    let n = bad.len();
    bad[n - 1] ^= 0xff;
    // With a capsule without data right behind it, in the same receive.
    bad.extend_from_slice(&capsule(0x1236, &[], true));
    h.send(&bad);
    let Ok(Step::Pdu(Received::Capsule(c))) = next(&mut f, &mut pool, None) else {
        panic!("no capsule")
    };
    assert_eq!((c.cmd.cid(), c.digest_ok), (0x1235, false));
    let Ok(Step::Pdu(Received::Capsule(c))) = next(&mut f, &mut pool, None) else {
        panic!("no capsule")
    };
    assert_eq!((c.cmd.cid(), c.data().len(), c.digest_ok), (0x1236, 0, true));
}

#[test]
fn a_header_digest_error_is_answered_with_a_term_req_that_quotes_the_header() {
    let (mut f, mut h, mut pool) = framing();
    initialize(&mut f, &mut h, &mut pool, HD);
    let mut b = capsule(9, &[], true);
    b[72] ^= 1;
    h.send(&b);
    let e = match next(&mut f, &mut pool, None) {
        Err(e) => e,
        Ok(_) => panic!("a bad header digest passed"),
    };
    assert!(f.term_req(&e));
    assert!(f.closing());
    let sent = f.flush(&mut pool, "host");
    assert!(
        sent.progress && sent.close,
        "the connection closes once it is sent"
    );
    // C2HTermReq (§3.6.2.5): type 03h, HLEN 24, no digests; FES Header Digest Error; the
    // offending header as data.
    let (pdu, _, r) = h.recv();
    let CtrlPdu::C2hTermReq(t) = pdu else {
        panic!("no termination request")
    };
    assert_eq!(t.status(), Some(Fes::HeaderDigestError));
    assert_eq!(r[..4], [0x03, 0, 24, 0]);
    assert!(
        r.len() >= 24 + 72 && b.starts_with(&r[24..]),
        "the header is quoted"
    );
}

#[test]
fn h2c_data_lands_in_the_buffer_the_caller_names() {
    let (mut f, mut h, mut pool) = framing();
    initialize(&mut f, &mut h, &mut pool, 0);
    let mut buf = pool.alloc().unwrap();
    let data: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
    // The header and the start of the data in one send, the rest later: the staged part is
    // copied on, the rest received straight into the buffer.
    let pdu = h2c(5, 5, 4096, &data, true);
    h.send(&pdu[..100]);
    let Ok(Step::H2cHeader(d)) = next(&mut f, &mut pool, None) else {
        panic!("no H2CData header")
    };
    assert_eq!(
        (d.cccid, d.ttag, d.datao, d.datal, d.last),
        (5, 5, 4096, 3000, true)
    );
    assert_eq!(f.h2c_cccid(), Some(5));
    h.send(&pdu[100..]);
    let Ok(Step::Pdu(Received::H2cData { pdu: got, digest_ok })) = next(&mut f, &mut pool, Some(&mut buf))
    else {
        panic!("no H2CData")
    };
    assert_eq!((got, digest_ok), (d, true));
    assert_eq!(f.h2c_cccid(), None);
    let mut back = vec![0u8; 3000];
    pool.read(&buf, 4096, &mut back).unwrap();
    assert_eq!(back, data);
    // Data for no buffer is a protocol error.
    h.send(&h2c(6, 6, 0, &data[..10], true));
    assert!(matches!(next(&mut f, &mut pool, None), Ok(Step::H2cHeader(_))));
    assert!(next(&mut f, &mut pool, None).is_err());
    pool.free(buf);
}

#[test]
fn h2c_data_digest_is_checked_over_the_buffer() {
    let (mut f, mut h, mut pool) = framing();
    initialize(&mut f, &mut h, &mut pool, HD | DD);
    let mut buf = pool.alloc().unwrap();
    let data = [0x5au8; 512];
    for corrupt in [false, true] {
        // H2CData with both digests: PDO 28 (header and its digest), the data digest last.
        let mut b = vec![0x06, HD | DD | LAST_PDU, 24, 28];
        b.extend_from_slice(&le32(28 + 512 + 4));
        b.extend_from_slice(&[3, 0, 3, 0]);
        b.extend_from_slice(&le32(0));
        b.extend_from_slice(&le32(512));
        b.extend_from_slice(&[0; 4]);
        b.extend_from_slice(&le32(crc32c::crc32c(&b)));
        b.extend_from_slice(&data);
        b.extend_from_slice(&le32(crc32c::crc32c(&data) ^ corrupt as u32));
        h.send(&b);
        assert!(matches!(next(&mut f, &mut pool, None), Ok(Step::H2cHeader(_))));
        let Ok(Step::Pdu(Received::H2cData { digest_ok, .. })) = next(&mut f, &mut pool, Some(&mut buf))
        else {
            panic!("no H2CData")
        };
        assert_eq!(digest_ok, !corrupt);
    }
    pool.free(buf);
}

#[test]
fn term_req_and_peer_close_are_reported() {
    let (mut f, mut h, mut pool) = framing();
    initialize(&mut f, &mut h, &mut pool, 0);
    // H2CTermReq (§3.6.2.4): type 02h, HLEN 24, FES 1, FEI 8.
    let mut b = vec![0x02, 0, 24, 0, 24, 0, 0, 0, 1, 0, 8, 0, 0, 0];
    b.resize(24, 0);
    h.send(&b);
    let Ok(Step::Pdu(Received::TermReq(t))) = next(&mut f, &mut pool, None) else {
        panic!("no termination request")
    };
    assert_eq!((t.fes, t.fei), (1, 8));
    drop(h);
    assert!(matches!(next(&mut f, &mut pool, None), Ok(Step::Closed)));
}

#[test]
fn answers_are_laid_out_as_the_spec_says() {
    let (mut f, mut h, mut pool) = framing();
    initialize(&mut f, &mut h, &mut pool, HD | DD);
    let cqe = Cqe {
        dw0: 0x1122_3344,
        dw1: 0,
        sq_head: 5,
        sq_id: 1,
        cid: 0x1234,
        status: 0,
    };
    f.capsule_resp(&cqe);
    f.r2t(&R2t {
        cccid: 0x1234,
        ttag: 0x1234,
        r2to: 8192,
        r2tl: 4096,
    });
    let mut buf = pool.alloc().unwrap();
    buf.truncate(100);
    let data: Vec<u8> = (0..100u8).collect();
    pool.write(&buf, 0, &data).unwrap();
    f.c2h_dma(&mut pool, 0x1234, buf);
    f.c2h_bytes(0x4321, b"abc");
    let free = pool.available();
    assert!(f.flush(&mut pool, "host").progress);
    assert_eq!(pool.available(), free + 1, "the sent buffer went back");
    // CapsuleResp (§3.6.2.7): HLEN 24, the CQE, the header digest.
    let (_, _, r) = h.recv();
    assert_eq!(r[..8], [0x05, HD, 24, 0, 28, 0, 0, 0]);
    assert_eq!(
        r[8..24],
        [0x44, 0x33, 0x22, 0x11, 0, 0, 0, 0, 5, 0, 1, 0, 0x34, 0x12, 0, 0]
    );
    assert_eq!(r[24..28], le32(crc32c::crc32c(&r[..24])));
    // R2T (§3.6.2.10): CCCID, TTAG, R2TO, R2TL.
    let (_, _, r) = h.recv();
    assert_eq!(r[..8], [0x09, HD, 24, 0, 28, 0, 0, 0]);
    assert_eq!(r[8..20], [0x34, 0x12, 0x34, 0x12, 0, 0x20, 0, 0, 0, 0x10, 0, 0]);
    // C2HData (§3.6.2.9): LAST_PDU, PDO after the header digest, the data, its digest.
    let (_, got, r) = h.recv();
    assert_eq!(r[..8], [0x07, HD | DD | LAST_PDU, 24, 28, 132, 0, 0, 0]);
    assert_eq!(r[8..20], [0x34, 0x12, 0, 0, 0, 0, 0, 0, 100, 0, 0, 0]);
    assert_eq!(got, data);
    assert_eq!(r[128..132], le32(crc32c::crc32c(&data)));
    let (_, got, r) = h.recv();
    assert_eq!(got, b"abc");
    assert_eq!(r[r.len() - 4..], le32(crc32c::crc32c(b"abc")));
    assert!(h.quiet());
}
