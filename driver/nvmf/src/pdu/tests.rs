//! Unit tests: byte layouts as Linux builds and checks them, each PDU type's parse and build,
//! digests against published values. The errors are in `error_tests`.

use super::*;

/// Bitwise CRC32C (reflected polynomial 0x82F63B78, initial and final XOR all ones): an
/// independent reference for the hardware-accelerated crate.
pub(super) fn ref_crc32c(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c ^= b as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0x82F6_3B78
            } else {
                c >> 1
            };
        }
    }
    !c
}

pub(super) fn ready(digests: Digests) -> ConnParams {
    ConnParams {
        phase: Phase::Ready,
        digests,
        ..ConnParams::new(&TargetLimits::default())
    }
}

pub(super) const BOTH: Digests = Digests {
    header: true,
    data: true,
};

pub(super) fn done(buf: &[u8], conn: &ConnParams) -> Header<HostPdu> {
    match parse_header(buf, conn) {
        Ok(Progress::Done(h)) => h,
        other => panic!("expected a parsed header, got {other:?}"),
    }
}

pub(super) fn done_c2h(buf: &[u8], conn: &ConnParams) -> Header<CtrlPdu> {
    match parse_c2h_header(buf, conn) {
        Ok(Progress::Done(h)) => h,
        other => panic!("expected a parsed header, got {other:?}"),
    }
}

pub(super) fn err(buf: &[u8], conn: &ConnParams) -> Error {
    match parse_header(buf, conn) {
        Err(e) => e,
        other => panic!("expected an error, got {other:?}"),
    }
}

/// Asserts the error's FES and FEI (and that it is answered).
#[track_caller]
pub(super) fn assert_fes(e: Error, fes: Fes, fei: u32) {
    assert_eq!((e.fes(), e.fei()), (fes, fei), "{e}");
    assert_eq!(e.fes() as u16, fes as u16);
}

pub(super) fn put_digest(pdu: &mut Vec<u8>, hlen: usize) {
    let d = ref_crc32c(&pdu[..hlen]);
    pdu.extend_from_slice(&d.to_le_bytes());
}

/// The ICReq as Linux's `nvme_tcp_init_connection` fills `struct nvme_tcp_icreq_pdu`.
pub(super) fn linux_icreq(hdr_digest: bool, data_digest: bool) -> Vec<u8> {
    let mut p = vec![0u8; 128];
    p[0] = 0x00; // hdr.type = nvme_tcp_icreq
    p[2] = 128; // hdr.hlen = sizeof(*icreq)
    p[3] = 0; // hdr.pdo
    p[4..8].copy_from_slice(&128u32.to_le_bytes()); // hdr.plen
    p[8..10].copy_from_slice(&0u16.to_le_bytes()); // pfv = NVME_TCP_PFV_1_0
    p[12..16].copy_from_slice(&0u32.to_le_bytes()); // maxr2t = 0
    p[10] = 0; // hpda
    p[11] = (hdr_digest as u8) | ((data_digest as u8) << 1); // digest
    p
}

/// The CapsuleCmd header as Linux's `nvme_tcp_setup_cmd_pdu` builds it, with `inline` bytes
/// of in-capsule data, and the header digest of `nvme_tcp_set_hdgst`.
pub(super) fn linux_cmd_pdu(sqe: &[u8; 64], inline: u32, hdr_digest: bool, data_digest: bool) -> Vec<u8> {
    let hdgst = if hdr_digest { 4 } else { 0 };
    let ddgst = if data_digest && inline != 0 { 4 } else { 0 };
    let mut p = vec![0u8; 72];
    p[0] = 0x04;
    p[1] = (hdr_digest as u8) | if ddgst != 0 { 2 } else { 0 };
    p[2] = 72;
    p[3] = if inline != 0 { 72 + hdgst } else { 0 };
    p[4..8].copy_from_slice(&(72 + hdgst as u32 + inline + ddgst).to_le_bytes());
    p[8..72].copy_from_slice(sqe);
    if hdr_digest {
        put_digest(&mut p, 72);
    }
    p
}

/// The H2CData header as Linux's `nvme_tcp_setup_h2c_data_pdu` builds it.
pub(super) fn linux_h2c_data(cid: u16, ttag: u16, offset: u32, len: u32, last: bool, d: Digests) -> Vec<u8> {
    let hdgst = if d.header { 4 } else { 0 };
    let ddgst = if d.data { 4 } else { 0 };
    let mut p = vec![0u8; 24];
    p[0] = 0x06;
    p[1] = (last as u8) << 2 | (d.header as u8) | (d.data as u8) << 1;
    p[2] = 24;
    p[3] = 24 + hdgst;
    p[4..8].copy_from_slice(&(24 + hdgst as u32 + len + ddgst).to_le_bytes());
    p[8..10].copy_from_slice(&cid.to_le_bytes());
    p[10..12].copy_from_slice(&ttag.to_le_bytes());
    p[12..16].copy_from_slice(&offset.to_le_bytes());
    p[16..20].copy_from_slice(&len.to_le_bytes());
    if d.header {
        put_digest(&mut p, 24);
    }
    p
}

/// A write SQE (opcode 01h, CID `cid`) with the SGL descriptor Linux's `nvme_tcp_set_sg_*`
/// writes: in-capsule (01h, address ICDOFF 0) or transport (5Ah, address 0), PSDT 01b.
pub(super) fn write_sqe(cid: u16, len: u32, in_capsule: bool) -> [u8; 64] {
    let mut s = [0u8; 64];
    s[0] = 0x01;
    s[1] = 0x40; // NVME_CMD_SGL_METABUF
    s[2..4].copy_from_slice(&cid.to_le_bytes());
    s[4..8].copy_from_slice(&1u32.to_le_bytes());
    s[32..36].copy_from_slice(&len.to_le_bytes());
    s[39] = if in_capsule { 0x01 } else { 0x5a };
    s
}

pub(super) fn connect_sqe() -> [u8; 64] {
    let mut s = write_sqe(0, 1024, true);
    s[0] = 0x7f;
    s[4] = 0x01; // FCTYPE Connect
    s
}

#[test]
fn field_offsets_are_those_of_linux_nvme_tcp_h() {
    // struct nvme_tcp_hdr {u8 type; u8 flags; u8 hlen; u8 pdo; __le32 plen;}
    assert_eq!(
        [field::TYPE, field::FLAGS, field::HLEN, field::PDO, field::PLEN],
        [0, 1, 2, 3, 4]
    );
    // icreq {hdr; __le16 pfv; u8 hpda; u8 digest; __le32 maxr2t; u8 rsvd2[112];} = 128
    assert_eq!(
        [
            field::ICREQ_PFV,
            field::ICREQ_HPDA,
            field::ICREQ_DGST,
            field::ICREQ_MAXR2T
        ],
        [8, 10, 11, 12]
    );
    assert_eq!(field::ICREQ_MAXR2T + 4 + 112, PduType::IcReq.hlen() as usize);
    // icresp {hdr; __le16 pfv; u8 cpda; u8 digest; __le32 maxdata; u8 rsvd[112];} = 128
    assert_eq!(
        [
            field::ICRESP_PFV,
            field::ICRESP_CPDA,
            field::ICRESP_DGST,
            field::ICRESP_MAXH2CDATA
        ],
        [8, 10, 11, 12]
    );
    assert_eq!(
        field::ICRESP_MAXH2CDATA + 4 + 112,
        PduType::IcResp.hlen() as usize
    );
    // term {hdr; __le16 fes; __le16 feil; __le16 feiu; u8 rsvd[10];} = 24
    assert_eq!([field::TERM_FES, field::TERM_FEI], [8, 10]);
    assert_eq!(field::TERM_FEI + 4 + 10, PduType::H2cTermReq.hlen() as usize);
    // cmd {hdr; struct nvme_command cmd (64);} = 72, rsp {hdr; struct nvme_completion (16);} = 24
    assert_eq!((field::CMD_SQE + 64, field::RSP_CQE + 16), (72, 24));
    assert_eq!(PduType::CapsuleCmd.hlen(), 72);
    assert_eq!(PduType::CapsuleResp.hlen(), 24);
    // data {hdr; u16 command_id; u16 ttag; __le32 data_offset; __le32 data_length; u8 rsvd[4];}
    assert_eq!(
        [
            field::DATA_CCCID,
            field::DATA_TTAG,
            field::DATA_DATAO,
            field::DATA_DATAL
        ],
        [8, 10, 12, 16]
    );
    // r2t {hdr; u16 command_id; u16 ttag; __le32 r2t_offset; __le32 r2t_length; u8 rsvd[4];}
    assert_eq!(
        [
            field::R2T_CCCID,
            field::R2T_TTAG,
            field::R2T_R2TO,
            field::R2T_R2TL
        ],
        [8, 10, 12, 16]
    );
    for t in [PduType::H2cData, PduType::C2hData, PduType::R2t] {
        assert_eq!(t.hlen() as usize, field::DATA_DATAL + 4 + 4);
    }
    // enum nvme_tcp_pdu_type and enum nvme_tcp_pdu_flags.
    let types = [0x0, 0x1, 0x2, 0x3, 0x4, 0x5, 0x6, 0x7, 0x9];
    for (v, t) in types.into_iter().zip([
        PduType::IcReq,
        PduType::IcResp,
        PduType::H2cTermReq,
        PduType::C2hTermReq,
        PduType::CapsuleCmd,
        PduType::CapsuleResp,
        PduType::H2cData,
        PduType::C2hData,
        PduType::R2t,
    ]) {
        assert_eq!(PduType::from_u8(v), Some(t));
        assert_eq!(t as u8, v);
    }
    assert_eq!(PduType::from_u8(0x8), None);
    assert_eq!(
        [
            Flags::HDGSTF.0,
            Flags::DDGSTF.0,
            Flags::LAST_PDU.0,
            Flags::SUCCESS.0
        ],
        [1, 2, 4, 8]
    );
    // enum nvme_tcp_fatal_error_status.
    let fes = [1u16, 2, 3, 4, 5, 6].map(|v| Fes::from_u16(v).map(|f| f as u16));
    assert_eq!(fes, [Some(1), Some(2), Some(3), Some(4), Some(5), Some(6)]);
    assert_eq!(Fes::from_u16(0), None);
    assert_eq!(Fes::from_u16(7), None);
}

#[test]
fn crc32c_known_answers() {
    // The CRC-32C check value, and RFC 3720 (iSCSI) B.4, whose digest NVMe/TCP reuses.
    let ascending: Vec<u8> = (0u8..32).collect();
    let descending: Vec<u8> = (0u8..32).rev().collect();
    let cases: [(&[u8], u32); 5] = [
        (b"123456789", 0xE306_9283),
        (&[0u8; 32], 0x8A91_36AA),
        (&[0xffu8; 32], 0x62A8_AB43),
        (&ascending, 0x46DD_794E),
        (&descending, 0x113F_DB5C),
    ];
    for (data, crc) in cases {
        assert_eq!(header_digest(data), crc);
        assert_eq!(ref_crc32c(data), crc);
        let mut d = DataDigest::new();
        for chunk in data.chunks(5) {
            d.update(chunk);
        }
        assert_eq!((d.value(), d.len()), (crc, data.len() as u64));
        assert!(d.matches(crc.to_le_bytes()));
        assert!(!d.matches((crc ^ 1).to_le_bytes()));
    }
    // RFC 3720 B.4 gives the zeros' digest as bytes on the wire: aa 36 91 8a (little-endian).
    let mut d = DataDigest::new();
    d.update(&[0u8; 32]);
    assert_eq!(d.to_wire(), [0xaa, 0x36, 0x91, 0x8a]);
    assert!(DataDigest::new().is_empty());
    assert_eq!(DataDigest::new().value(), 0);
}

#[test]
fn linux_icreq_is_accepted_and_the_icresp_passes_the_linux_checks() {
    let limits = TargetLimits::default();
    for (h, d) in [(false, false), (true, false), (false, true), (true, true)] {
        let conn = ConnParams::new(&limits);
        let buf = linux_icreq(h, d);
        assert_eq!(parse_header(&buf[..8], &conn), Ok(Progress::Need(128)));
        let hdr = done(&buf, &conn);
        let HostPdu::IcReq(req) = hdr.pdu else {
            panic!("{hdr:?}")
        };
        assert_eq!(
            req,
            IcReq {
                pfv: 0,
                hpda: 0,
                digests: Digests { header: h, data: d },
                maxr2t: 0
            }
        );
        assert_eq!(
            hdr.layout,
            Layout {
                header_len: 128,
                pad: 0,
                data_len: 0,
                data_digest: false
            }
        );

        let (resp, params) = negotiate(&req, &limits).unwrap();
        assert_eq!(params.phase, Phase::Ready);
        assert_eq!(params.digests, Digests { header: h, data: d });
        assert_eq!(
            (params.cpda, params.hpda, params.max_r2ts),
            (Pda::ZERO, Pda::ZERO, 1)
        );
        let mut out = [0u8; 128];
        assert_eq!(ic_resp(&mut out, &resp), Ok(128));
        // struct nvme_tcp_icresp_pdu as nvmet_tcp_handle_icreq fills it, with our MAXH2CDATA.
        let mut expect = [0u8; 128];
        expect[0] = 0x01;
        expect[2] = 128;
        expect[4] = 128;
        expect[11] = (h as u8) | ((d as u8) << 1);
        expect[12..16].copy_from_slice(&(128u32 * 1024).to_le_bytes());
        assert_eq!(out, expect);

        // nvme_tcp_init_connection's checks: type, PLEN 128, PFV 0, digests mirrored, CPDA 0,
        // MAXH2CDATA % 4 == 0 and >= 4096.
        let back = done_c2h(&out, &ConnParams::new(&limits));
        let CtrlPdu::IcResp(r) = back.pdu else {
            panic!("{back:?}")
        };
        assert_eq!(r, resp);
        assert_eq!(out[0], 0x01);
        assert_eq!(u32::from_le_bytes(out[4..8].try_into().unwrap()), 128);
        let host = host_accept_ic_resp(&req, &r).unwrap();
        assert_eq!(
            (host.digests, host.maxh2cdata),
            (params.digests, params.maxh2cdata)
        );
    }
}

#[test]
fn linux_capsule_commands_parse() {
    for digests in [
        Digests::NONE,
        BOTH,
        Digests {
            header: true,
            data: false,
        },
    ] {
        let conn = ready(digests);
        let hd = if digests.header { 4 } else { 0 };
        // Asynchronous Event Request (nvme_tcp_submit_async_event): no data, PDO 0, only
        // HDGSTF even with data digests on.
        let mut aer = [0u8; 64];
        aer[0] = 0x0c;
        aer[1] = 0x40;
        aer[2..4].copy_from_slice(&31u16.to_le_bytes());
        aer[39] = 0x5a;
        let buf = linux_cmd_pdu(&aer, 0, digests.header, digests.data);
        assert_eq!(parse_header(&buf[..8], &conn), Ok(Progress::Need(72 + hd)));
        let h = done(&buf, &conn);
        let HostPdu::CapsuleCmd(c) = h.pdu else {
            panic!("{h:?}")
        };
        assert_eq!((c.opcode(), c.cid(), c.data_len, c.psdt()), (0x0c, 31, 0, 1));
        assert_eq!(c.sgl(), DataSgl::Transport { len: 0 });
        assert_eq!(
            h.layout,
            Layout {
                header_len: 72 + hd as u32,
                pad: 0,
                data_len: 0,
                data_digest: false
            }
        );

        // Connect with its 1024 bytes in the capsule.
        let buf = linux_cmd_pdu(&connect_sqe(), 1024, digests.header, digests.data);
        let h = done(&buf, &conn);
        let HostPdu::CapsuleCmd(c) = h.pdu else {
            panic!("{h:?}")
        };
        assert!(c.is_fabrics());
        assert_eq!((c.data_len, c.data_offset), (1024, 72 + hd as u32));
        assert_eq!(c.sgl(), DataSgl::InCapsule { offset: 0, len: 1024 });
        assert_eq!(h.layout.data_digest, digests.data);
        assert_eq!(h.layout.plen(), u32::from_le_bytes(buf[4..8].try_into().unwrap()));

        // A write whose data comes by R2T.
        let buf = linux_cmd_pdu(&write_sqe(9, 1 << 20, false), 0, digests.header, digests.data);
        let HostPdu::CapsuleCmd(c) = done(&buf, &conn).pdu else {
            panic!()
        };
        assert_eq!((c.cid(), c.sgl()), (9, DataSgl::Transport { len: 1 << 20 }));

        // A 4 KiB write in the capsule (within the default 8 KiB limit).
        let buf = linux_cmd_pdu(&write_sqe(10, 4096, true), 4096, digests.header, digests.data);
        let h = done(&buf, &conn);
        assert_eq!(h.layout.data_len, 4096);
        assert_eq!(h.layout.data_offset(), 72 + hd as u32);
    }
    // PRPs are not a fabrics data pointer.
    let mut s = write_sqe(1, 512, true);
    s[1] = 0;
    let c = CapsuleCmd {
        sqe: s,
        data_len: 0,
        data_offset: 0,
    };
    assert_eq!(c.sgl(), DataSgl::Other { id: 0x01 });
}

#[test]
fn linux_h2c_data_parses() {
    for digests in [
        Digests::NONE,
        BOTH,
        Digests {
            header: false,
            data: true,
        },
    ] {
        let conn = ready(digests);
        let buf = linux_h2c_data(7, 3, 65536, 65536, true, digests);
        let h = done(&buf, &conn);
        let HostPdu::H2cData(d) = h.pdu else {
            panic!("{h:?}")
        };
        assert_eq!(
            d,
            H2cData {
                cccid: 7,
                ttag: 3,
                datao: 65536,
                datal: 65536,
                last: true
            }
        );
        let hd = if digests.header { 4 } else { 0 };
        assert_eq!(
            h.layout,
            Layout {
                header_len: 24 + hd,
                pad: 0,
                data_len: 65536,
                data_digest: digests.data
            }
        );
    }
}

#[test]
fn need_says_how_many_header_bytes() {
    let conn = ready(BOTH);
    let buf = linux_cmd_pdu(&connect_sqe(), 1024, true, true);
    for n in 0..buf.len() {
        let want = if n < 8 { 8 } else { 76 };
        assert_eq!(
            parse_header(&buf[..n], &conn),
            Ok(Progress::Need(want)),
            "{n} bytes"
        );
    }
    // Bytes past the header are not looked at.
    let mut longer = buf.clone();
    longer.extend_from_slice(&[0xee; 40]);
    assert_eq!(done(&longer, &conn), done(&buf, &conn));
}

#[test]
fn c2h_data_header_layout() {
    let mut conn = ready(BOTH);
    let mut out = [0xffu8; MAX_TX_HEADER_LEN];
    let d = C2hData {
        cccid: 0x1234,
        datao: 8192,
        datal: 4096,
        last: true,
        success: true,
    };
    let tx = c2h_data_header(&mut out, &d, &conn).unwrap();
    assert_eq!(tx.len, 28);
    assert_eq!(tx.data_digest, Some(DataDigest::new()));
    let mut expect = vec![0x07, 0x0f, 24, 28];
    expect.extend_from_slice(&(28u32 + 4096 + 4).to_le_bytes());
    expect.extend_from_slice(&[0x34, 0x12, 0, 0]);
    expect.extend_from_slice(&8192u32.to_le_bytes());
    expect.extend_from_slice(&4096u32.to_le_bytes());
    expect.extend_from_slice(&[0; 4]);
    put_digest(&mut expect, 24);
    assert_eq!(&out[..28], &expect[..]);
    let back = done_c2h(&out[..28], &conn);
    assert_eq!(back.pdu, CtrlPdu::C2hData(d));

    // The host asked for 32-byte alignment (HPDA 7): 4 bytes of zero padding.
    conn.hpda = Pda::new(7).unwrap();
    conn.digests = Digests {
        header: true,
        data: false,
    };
    let d = C2hData {
        last: false,
        success: false,
        ..d
    };
    let tx = c2h_data_header(&mut out, &d, &conn).unwrap();
    assert_eq!((tx.len, tx.data_digest), (32, None));
    assert_eq!((out[1], out[3]), (0x01, 32));
    assert_eq!(&out[28..32], &[0; 4]);
    assert_eq!(u32::from_le_bytes(out[4..8].try_into().unwrap()), 32 + 4096);
    let back = done_c2h(&out[..32], &conn);
    assert_eq!(
        back.layout,
        Layout {
            header_len: 28,
            pad: 4,
            data_len: 4096,
            data_digest: false
        }
    );

    // What the Linux initiator receives is 24 bytes plus its digest, whatever the type.
    let conn = ready(Digests::NONE);
    let tx = c2h_data_header(&mut out, &C2hData { datal: 1, ..d }, &conn).unwrap();
    assert_eq!((tx.len, out[2], out[3]), (24, 24, 24));
}

#[test]
fn r2t_capsule_resp_and_term_req_layouts() {
    let mut out = [0u8; MAX_TX_HEADER_LEN];
    let r = R2t {
        cccid: 5,
        ttag: 0x0102,
        r2to: 4096,
        r2tl: 1 << 20,
    };
    assert_eq!(r2t(&mut out, &r, Digests::NONE), Ok(24));
    let mut expect = vec![0x09, 0, 24, 0, 24, 0, 0, 0, 5, 0, 0x02, 0x01];
    expect.extend_from_slice(&4096u32.to_le_bytes());
    expect.extend_from_slice(&(1u32 << 20).to_le_bytes());
    expect.extend_from_slice(&[0; 4]);
    assert_eq!(&out[..24], &expect[..]);
    assert_eq!(r2t(&mut out, &r, BOTH), Ok(28));
    assert_eq!((out[1], out[4]), (0x01, 28));
    assert_eq!(done_c2h(&out[..28], &ready(BOTH)).pdu, CtrlPdu::R2t(r));

    let cqe: [u8; 16] = core::array::from_fn(|i| i as u8 + 1);
    assert_eq!(capsule_resp(&mut out, &cqe, BOTH), Ok(28));
    assert_eq!(&out[..8], &[0x05, 0x01, 24, 0, 28, 0, 0, 0]);
    assert_eq!(&out[8..24], &cqe);
    assert_eq!(&out[24..28], &ref_crc32c(&out[..24]).to_le_bytes());
    let back = done_c2h(&out[..28], &ready(BOTH));
    let CtrlPdu::CapsuleResp(c) = back.pdu else {
        panic!()
    };
    assert_eq!((c.cqe, c.cid()), (cqe, u16::from_le_bytes([13, 14])));

    // A C2HTermReq quotes at most 128 bytes: PLEN 152, the most Linux accepts.
    let offending = linux_icreq(true, true);
    let mut big = offending.clone();
    big.extend_from_slice(&[9; 10]);
    let n = c2h_term_req(&mut out, Fes::UnsupportedParameter, 8, &big).unwrap();
    assert_eq!(n, 152);
    assert_eq!(&out[..8], &[0x03, 0, 24, 0, 152, 0, 0, 0]);
    assert_eq!(&out[8..14], &[6, 0, 8, 0, 0, 0]);
    assert_eq!(&out[14..24], &[0; 10]);
    assert_eq!(&out[24..152], &offending[..]);
    let back = done_c2h(&out[..n], &ready(BOTH));
    assert_eq!(back.pdu, CtrlPdu::C2hTermReq(TermReq { fes: 6, fei: 8 }));
    assert_eq!(back.layout.data_len, 128);
    // The host's H2CTermReq parses the same way on the controller.
    let n = h2c_term_req(&mut out, Fes::HeaderDigestError, 0, &offending[..24]).unwrap();
    assert_eq!(n, 48);
    let h = done(&out[..n], &ready(BOTH));
    assert_eq!(h.pdu, HostPdu::H2cTermReq(TermReq { fes: 3, fei: 0 }));
    assert_eq!(TermReq { fes: 3, fei: 0 }.status(), Some(Fes::HeaderDigestError));
}

#[test]
fn host_builders_round_trip() {
    let mut out = [0u8; MAX_TX_HEADER_LEN];
    let conn = ConnParams {
        cpda: Pda::new(3).unwrap(),
        ..ready(BOTH)
    };
    let sqe = write_sqe(77, 512, true);
    let tx = capsule_cmd_header(&mut out, &sqe, 512, &conn).unwrap();
    // 72 + 4 = 76 rounded up to 16 bytes.
    assert_eq!((tx.len, out[3]), (80, 80));
    let h = done(&out[..tx.len], &conn);
    assert_eq!(
        h.pdu,
        HostPdu::CapsuleCmd(CapsuleCmd {
            sqe,
            data_len: 512,
            data_offset: 80
        })
    );
    assert_eq!(
        h.layout,
        Layout {
            header_len: 76,
            pad: 4,
            data_len: 512,
            data_digest: true
        }
    );
    let tx = capsule_cmd_header(&mut out, &sqe, 0, &conn).unwrap();
    assert_eq!((tx.len, out[1], out[3], tx.data_digest), (76, 0x01, 0, None));

    let d = H2cData {
        cccid: 77,
        ttag: 4,
        datao: 0,
        datal: 512,
        last: true,
    };
    let tx = h2c_data_header(&mut out, &d, &conn).unwrap();
    assert_eq!(done(&out[..tx.len], &conn).pdu, HostPdu::H2cData(d));

    let init = ConnParams::new(&TargetLimits::default());
    let req = IcReq {
        pfv: 0,
        hpda: 2,
        digests: BOTH,
        maxr2t: 3,
    };
    assert_eq!(ic_req(&mut out, &req), Ok(128));
    let mut expect = linux_icreq(true, true);
    expect[10] = 2;
    expect[12] = 3;
    assert_eq!(&out[..128], &expect[..]);
    assert_eq!(done(&out[..128], &init).pdu, HostPdu::IcReq(req));
}

#[test]
fn builder_refusals() {
    let conn = ready(BOTH);
    let mut small = [0u8; 27];
    let d = C2hData {
        cccid: 1,
        datao: 0,
        datal: 1,
        last: true,
        success: false,
    };
    assert_eq!(
        c2h_data_header(&mut small, &d, &conn),
        Err(BuildError::BufferTooSmall {
            pdu: PduType::C2hData,
            need: 28,
            have: 27
        })
    );
    let mut out = [0u8; MAX_TX_HEADER_LEN];
    assert_eq!(
        c2h_data_header(&mut out, &C2hData { datal: 0, ..d }, &conn),
        Err(BuildError::NoData(PduType::C2hData))
    );
    assert_eq!(
        c2h_data_header(
            &mut out,
            &C2hData {
                last: false,
                success: true,
                ..d
            },
            &conn
        ),
        Err(BuildError::SuccessWithoutLast)
    );
    assert_eq!(
        c2h_data_header(
            &mut out,
            &C2hData {
                datal: u32::MAX - 31,
                ..d
            },
            &conn
        ),
        Err(BuildError::TooLong {
            pdu: PduType::C2hData,
            len: u32::MAX as u64 - 31
        })
    );
    // 28 + (2^32 - 33) + 4 = 2^32 - 1: the longest PLEN.
    assert!(c2h_data_header(
        &mut out,
        &C2hData {
            datal: u32::MAX - 32,
            ..d
        },
        &conn
    )
    .is_ok());
    let r = R2t {
        cccid: 1,
        ttag: 0,
        r2to: 0,
        r2tl: 0,
    };
    assert_eq!(r2t(&mut out, &r, BOTH), Err(BuildError::NoData(PduType::R2t)));
    let h = H2cData {
        cccid: 1,
        ttag: 0,
        datao: 0,
        datal: 0,
        last: true,
    };
    assert_eq!(
        h2c_data_header(&mut out, &h, &conn),
        Err(BuildError::NoData(PduType::H2cData))
    );
    assert!(ic_resp(
        &mut out[..127],
        &IcResp {
            pfv: 0,
            cpda: 0,
            digests: BOTH,
            maxh2cdata: 4096
        }
    )
    .is_err());
    // Every message says what to do.
    let e = BuildError::BufferTooSmall {
        pdu: PduType::R2t,
        need: 28,
        have: 2,
    }
    .to_string();
    assert!(e.contains("MAX_TX_HEADER_LEN"), "{e}");
}

#[test]
fn pda_alignment() {
    assert_eq!(Pda::new(32), None);
    let p = Pda::new(31).unwrap();
    assert_eq!((p.get(), p.bytes(), p.data_offset(28)), (31, 128, 128));
    assert_eq!(Pda::ZERO.data_offset(76), 76);
    assert_eq!(Pda::new(1).unwrap().data_offset(76), 80);
    assert_eq!(Pda::new(1).unwrap().data_offset(72), 72);
}
