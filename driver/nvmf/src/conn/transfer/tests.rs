//! Data transfer: buffers, the R2T/H2CData sequence of a write, C2HData of a read.

use vfpoll_dma::DmaPool;

use super::super::testing::{conn, pool, Host};
use super::*;
use crate::fabrics::SubsystemId;
use crate::pdu::CtrlPdu;

fn req(cid: u16, op: IoOp) -> IoRequest {
    IoRequest {
        cid,
        subsystem: SubsystemId(0),
        nsid: 1,
        op,
    }
}

fn write(cid: u16, data: DataXfer) -> IoRequest {
    let blocks = data.len() / 512;
    req(
        cid,
        IoOp::Write {
            slba: 0,
            blocks,
            data,
            fua: false,
        },
    )
}

fn read(cid: u16, len: u32) -> IoRequest {
    req(
        cid,
        IoOp::Read {
            slba: 0,
            blocks: len / 512,
            len,
        },
    )
}

fn h2c(cccid: u16, datao: u32, datal: u32, last: bool) -> H2cData {
    H2cData {
        cccid,
        ttag: cccid,
        datao,
        datal,
        last,
    }
}

/// The next PDU the connection sends.
fn sent(c: &mut Conn, h: &mut Host, pool: &mut DmaPool) -> (CtrlPdu, Vec<u8>) {
    c.flush(pool);
    let (pdu, data, _) = h.recv();
    (pdu, data)
}

fn sent_r2t(c: &mut Conn, h: &mut Host, pool: &mut DmaPool) -> (u16, u32, u32) {
    match sent(c, h, pool).0 {
        CtrlPdu::R2t(r) => {
            assert_eq!(r.ttag, r.cccid, "the tag is the CID");
            (r.cccid, r.r2to, r.r2tl)
        }
        other => panic!("expected an R2T, got {other:?}"),
    }
}

#[test]
fn a_write_is_asked_for_one_r2t_of_at_most_maxh2cdata_at_a_time() {
    let (mut c, mut h) = conn();
    let mut pool = pool(16384, 2);
    c.wire.params.maxh2cdata = 4096;
    let cmd = Cmd::new(write(1, DataXfer::FromHost { len: 10240 }), 3, Vec::new());
    c.cmds.insert(1, cmd);
    assert_eq!(c.start(&mut pool, 1), Started::Waiting);
    assert_eq!(c.cmds[&1].buf.as_ref().map(|b| b.len()), Some(10240));
    assert_eq!(sent_r2t(&mut c, &mut h, &mut pool), (1, 0, 4096));
    // The first R2T's data in two PDUs: the first does not end it.
    c.h2c_header(&h2c(1, 0, 2048, false)).unwrap();
    assert_eq!(c.h2c_received(&h2c(1, 0, 2048, false), true), None);
    assert!(!c.wire.busy(), "no R2T before the window is full");
    // Out of order, past the window, a wrong tag, an unknown command: protocol errors.
    assert!(c.h2c_header(&h2c(1, 0, 2048, true)).is_err());
    assert!(c.h2c_header(&h2c(1, 2048, 4096, true)).is_err());
    let mut tagged = h2c(1, 2048, 2048, true);
    tagged.ttag = 2;
    assert!(c.h2c_header(&tagged).is_err());
    assert!(c.h2c_header(&h2c(9, 2048, 2048, true)).is_err());
    // The window's end: the next R2T.
    c.h2c_header(&h2c(1, 2048, 2048, true)).unwrap();
    assert_eq!(c.h2c_received(&h2c(1, 2048, 2048, true), true), None);
    assert_eq!(sent_r2t(&mut c, &mut h, &mut pool), (1, 4096, 4096));
    c.h2c_header(&h2c(1, 4096, 4096, true)).unwrap();
    assert_eq!(c.h2c_received(&h2c(1, 4096, 4096, true), true), None);
    assert_eq!(sent_r2t(&mut c, &mut h, &mut pool), (1, 8192, 2048));
    // The last one, with a failed data digest: the data is all there, marked.
    c.h2c_header(&h2c(1, 8192, 2048, true)).unwrap();
    assert_eq!(c.h2c_received(&h2c(1, 8192, 2048, true), false), Some(1));
    let cmd = &c.cmds[&1];
    assert!(cmd.digest_failed && cmd.window.is_none());
    assert!(h.quiet(), "no R2T after the last");
    // No R2T outstanding any more: more data is a protocol error.
    assert!(c.h2c_header(&h2c(1, 8192, 2048, true)).is_err());
    c.close(&mut pool);
    assert_eq!(pool.available(), 2, "the buffer went back at close");
}

#[test]
fn buffers_in_capsule_data_and_commands_without_data() {
    let (mut c, _h) = conn();
    let mut pool = pool(4096, 1);
    let icd: Vec<u8> = (0..512u32).map(|i| (i * 3) as u8).collect();
    let w = write(1, DataXfer::InCapsule { offset: 0, len: 512 });
    c.cmds.insert(1, Cmd::new(w, 1, icd.clone()));
    assert_eq!(c.start(&mut pool, 1), Started::Ready);
    let cmd = c.cmds.get_mut(&1).unwrap();
    assert!(cmd.icd.is_empty());
    let buf = cmd.buf.take().unwrap();
    let mut back = vec![0u8; 512];
    pool.read(&buf, 0, &mut back).unwrap();
    assert_eq!((buf.len(), back), (512, icd));
    // No buffer left: the read waits, in order.
    c.cmds.insert(2, Cmd::new(read(2, 4096), 2, Vec::new()));
    assert_eq!(c.start(&mut pool, 2), Started::Waiting);
    assert_eq!(c.waiting, [2]);
    assert!(c.cmds[&2].buf.is_none());
    // More data than a buffer holds: refused and forgotten, the buffer back.
    pool.free(buf);
    let big = write(3, DataXfer::FromHost { len: 8192 });
    c.cmds.insert(3, Cmd::new(big, 7, Vec::new()));
    let Started::Refused(cqe, head) = c.start(&mut pool, 3) else {
        panic!("not refused")
    };
    assert_eq!((cqe.cid, head), (3, 7));
    assert_eq!(cqe.status(), fabrics::status::DATA_SGL_LENGTH_INVALID);
    assert!(!c.cmds.contains_key(&3));
    assert_eq!(pool.available(), 1);
    // No data: no buffer.
    c.cmds.insert(4, Cmd::new(req(4, IoOp::Flush), 8, Vec::new()));
    assert_eq!(c.start(&mut pool, 4), Started::Ready);
    assert!(c.cmds[&4].buf.is_none());
    assert_eq!(pool.available(), 1);
}

#[test]
fn a_successful_read_sends_its_buffer_a_failed_one_gives_it_back() {
    let (mut c, mut h) = conn();
    let mut pool = pool(4096, 2);
    c.cmds.insert(5, Cmd::new(read(5, 1024), 1, Vec::new()));
    assert_eq!(c.start(&mut pool, 5), Started::Ready);
    let mut cmd = c.cmds.remove(&5).unwrap();
    let data: Vec<u8> = (0..1024u32).map(|i| (i ^ 0x55) as u8).collect();
    pool.write(cmd.buf.as_ref().unwrap(), 0, &data).unwrap();
    c.send_data(&mut pool, 5, cmd, true);
    let (pdu, got) = sent(&mut c, &mut h, &mut pool);
    let CtrlPdu::C2hData(d) = pdu else {
        panic!("expected C2HData, got {pdu:?}")
    };
    assert_eq!((d.cccid, d.datao, d.datal, d.last), (5, 0, 1024, true));
    assert_eq!(got, data);
    assert_eq!(pool.available(), 2, "sent, the buffer is back");
    c.cmds.insert(6, Cmd::new(read(6, 1024), 1, Vec::new()));
    c.start(&mut pool, 6);
    cmd = c.cmds.remove(&6).unwrap();
    c.send_data(&mut pool, 6, cmd, false);
    assert_eq!(pool.available(), 2, "not sent: the buffer is back at once");
    c.flush(&mut pool);
    assert!(h.quiet(), "nothing sent for a failed read");
}
