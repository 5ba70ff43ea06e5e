//! Every fatal error with its FES and FEI: malformed headers field by field, sequence,
//! header digest and data limit errors, negotiation, H2CData against its R2T, termination
//! requests.

use super::tests::{
    assert_fes, connect_sqe, done, done_c2h, err, linux_cmd_pdu, linux_h2c_data, linux_icreq, ready,
    write_sqe, BOTH,
};
use super::*;

/// A valid 8-byte common header followed by zeros up to `len`.
fn ch(t: u8, flags: u8, hlen: u8, pdo: u8, plen: u32, len: usize) -> Vec<u8> {
    let mut p = vec![0u8; len.max(8)];
    p[..4].copy_from_slice(&[t, flags, hlen, pdo]);
    p[4..8].copy_from_slice(&plen.to_le_bytes());
    p
}

#[test]
fn invalid_header_field_errors_name_the_field() {
    let none = ready(Digests::NONE);
    let both = ready(BOTH);
    let init = ConnParams::new(&TargetLimits::default());

    // PDU-Type: reserved, or one a controller sends.
    let e = err(&ch(0x08, 0, 24, 0, 24, 8), &none);
    assert_fes(e, Fes::InvalidHeaderField, 0);
    assert_eq!(e.reason(), Reason::UnknownType(8));
    assert_eq!(e.quote_len(), 8);
    let e = err(&ch(0x05, 0, 24, 0, 24, 8), &none);
    assert_fes(e, Fes::InvalidHeaderField, 0);
    assert_eq!(e.reason(), Reason::WrongDirection(PduType::CapsuleResp));
    let e = err(&ch(0x0a, 0, 24, 0, 24, 8), &none);
    assert_fes(e, Fes::InvalidHeaderField, 0);
    // The host side refuses host PDUs.
    let e = parse_c2h_header(&ch(0x04, 0, 72, 0, 72, 72), &none).unwrap_err();
    assert_eq!(
        (e.fes(), e.fei(), e.reason()),
        (
            Fes::InvalidHeaderField,
            0,
            Reason::WrongDirection(PduType::CapsuleCmd)
        )
    );

    // FLAGS: undefined bits, HDGSTF or DDGSTF not as negotiated.
    let e = err(&ch(0x04, 0x04, 72, 0, 72, 72), &none);
    assert_fes(e, Fes::InvalidHeaderField, 1);
    assert_eq!(
        e.reason(),
        Reason::ReservedFlags {
            pdu: PduType::CapsuleCmd,
            flags: 4,
            allowed: 3
        }
    );
    assert_eq!(e.quote_len(), 72);
    assert_fes(
        err(&ch(0x00, 0x01, 128, 0, 128, 8), &init),
        Fes::InvalidHeaderField,
        1,
    );
    let e = err(&ch(0x04, 0x01, 72, 0, 76, 8), &none);
    assert_fes(e, Fes::InvalidHeaderField, 1);
    assert_eq!(
        e.reason(),
        Reason::HeaderDigestFlag {
            pdu: PduType::CapsuleCmd,
            set: true
        }
    );
    assert_fes(
        err(&ch(0x04, 0x00, 72, 0, 72, 8), &both),
        Fes::InvalidHeaderField,
        1,
    );
    // Data digests on, data present, DDGSTF clear; and set on a command without data.
    let e = err(&ch(0x04, 0x01, 72, 76, 76 + 512 + 4, 8), &both);
    assert_fes(e, Fes::InvalidHeaderField, 1);
    assert!(
        matches!(
            e.reason(),
            Reason::DataDigestFlag {
                set: false,
                negotiated: true,
                ..
            }
        ),
        "{e}"
    );
    assert_fes(
        err(&ch(0x04, 0x03, 72, 0, 76, 8), &both),
        Fes::InvalidHeaderField,
        1,
    );
    let e = err(&ch(0x06, 0x02, 24, 24, 24 + 16, 8), &none);
    assert_fes(e, Fes::InvalidHeaderField, 1);
    // SUCCESS without LAST_PDU, on the host side.
    let e = parse_c2h_header(&ch(0x07, 0x08, 24, 24, 25, 8), &none).unwrap_err();
    assert_eq!(
        (e.fes(), e.fei(), e.reason()),
        (Fes::InvalidHeaderField, 1, Reason::SuccessWithoutLast)
    );

    // HLEN.
    let e = err(&ch(0x04, 0, 24, 0, 72, 8), &none);
    assert_fes(e, Fes::InvalidHeaderField, 2);
    assert_eq!(
        e.reason(),
        Reason::Hlen {
            pdu: PduType::CapsuleCmd,
            hlen: 24,
            expected: 72
        }
    );
    assert_eq!(e.quote_len(), 8);
    assert_fes(
        err(&ch(0x00, 0, 127, 0, 128, 8), &init),
        Fes::InvalidHeaderField,
        2,
    );

    // PDO: inside the header (digest), misaligned, past PLEN, or set on an ICReq.
    assert_fes(
        err(&ch(0x04, 0x03, 72, 72, 76 + 8 + 4, 8), &both),
        Fes::InvalidHeaderField,
        3,
    );
    let aligned = ConnParams {
        cpda: Pda::new(3).unwrap(),
        ..none
    };
    let e = err(&ch(0x04, 0, 72, 72, 72 + 8, 8), &aligned);
    assert_fes(e, Fes::InvalidHeaderField, 3);
    assert!(e.to_string().contains("alignment"), "{e}");
    assert_fes(
        err(&ch(0x04, 0, 72, 96, 72 + 8, 8), &aligned),
        Fes::InvalidHeaderField,
        3,
    );
    // Data starting exactly at PLEN leaves none: PLEN is short.
    assert_fes(
        err(&ch(0x04, 0, 72, 80, 72 + 8, 8), &aligned),
        Fes::InvalidHeaderField,
        4,
    );
    assert_fes(
        err(&ch(0x00, 0, 128, 4, 128, 8), &init),
        Fes::InvalidHeaderField,
        3,
    );
    assert_fes(
        err(&ch(0x06, 0, 24, 0, 24 + 8, 8), &none),
        Fes::InvalidHeaderField,
        3,
    );

    // PLEN: not 128 for an ICReq, shorter than the header, no data in an H2CData, too
    // short for the data digest.
    let e = err(&ch(0x00, 0, 128, 0, 129, 8), &init);
    assert_fes(e, Fes::InvalidHeaderField, 4);
    assert_eq!(
        e.reason(),
        Reason::Plen {
            pdu: PduType::IcReq,
            plen: 129,
            min: 128,
            max: 128
        }
    );
    assert_fes(
        err(
            &ch(0x04, 0x01, 72, 0, 72, 8),
            &ready(Digests {
                header: true,
                data: false,
            }),
        ),
        Fes::InvalidHeaderField,
        4,
    );
    assert_fes(err(&ch(0x06, 0, 24, 0, 24, 8), &none), Fes::InvalidHeaderField, 4);
    assert_fes(
        err(&ch(0x06, 0x03, 24, 28, 28 + 4, 8), &both),
        Fes::InvalidHeaderField,
        4,
    );

    // DATAL disagreeing with PLEN and PDO: at DATAL (offset 16), once the header is read.
    let mut buf = linux_h2c_data(1, 1, 0, 4096, true, Digests::NONE);
    buf[16..20].copy_from_slice(&4095u32.to_le_bytes());
    let e = err(&buf, &none);
    assert_fes(e, Fes::InvalidHeaderField, 16);
    assert_eq!(
        e.reason(),
        Reason::Datal {
            pdu: PduType::H2cData,
            datal: 4095,
            carried: 4096
        }
    );
    assert_eq!(e.quote_len(), 24);
}

#[test]
fn sequence_digest_and_limit_errors() {
    let init = ConnParams::new(&TargetLimits::default());
    let none = ready(Digests::NONE);

    // PDU Sequence Error: a command before the ICReq, a second ICReq.
    let e = err(&linux_cmd_pdu(&connect_sqe(), 1024, false, false), &init);
    assert_fes(e, Fes::PduSequenceError, 0);
    assert_eq!(e.reason(), Reason::BeforeIc(PduType::CapsuleCmd));
    let e = err(&linux_icreq(false, false), &none);
    assert_fes(e, Fes::PduSequenceError, 0);
    assert_eq!(e.reason(), Reason::RepeatedIc(PduType::IcReq));
    assert_fes(Error::unexpected(PduType::H2cData), Fes::PduSequenceError, 0);

    // Header Digest Error: any flipped bit of a protected header.
    let both = ready(BOTH);
    let mut buf = linux_cmd_pdu(&connect_sqe(), 1024, true, true);
    buf[20] ^= 0x10;
    let e = err(&buf, &both);
    assert_fes(e, Fes::HeaderDigestError, 0);
    assert!(matches!(e.reason(), Reason::HeaderDigest { .. }));
    assert_eq!(e.quote_len(), 72);
    let mut buf = linux_h2c_data(1, 1, 0, 512, true, BOTH);
    buf[27] ^= 0x80;
    assert_fes(err(&buf, &both), Fes::HeaderDigestError, 0);

    // Data Transfer Limit Exceeded: H2CData over MAXH2CDATA, in-capsule data over the limit.
    let buf = linux_h2c_data(1, 1, 0, 128 * 1024 + 4, true, Digests::NONE);
    let e = err(&buf[..8], &none);
    assert_fes(e, Fes::DataLimitExceeded, 0);
    assert_eq!(
        e.reason(),
        Reason::DataLimit {
            pdu: PduType::H2cData,
            len: 128 * 1024 + 4,
            max: 128 * 1024
        }
    );
    assert!(matches!(
        parse_header(&linux_h2c_data(1, 1, 0, 128 * 1024, true, Digests::NONE), &none),
        Ok(Progress::Done(_))
    ));
    // 8 KiB + 4 of in-capsule data is over any command's limit: known from the common header.
    let buf = linux_cmd_pdu(&connect_sqe(), 8196, false, false);
    assert_fes(err(&buf[..8], &none), Fes::DataLimitExceeded, 0);
    // With max_icd 0, a 4 KiB write in the capsule is refused once the SQE says it is not a
    // Fabrics command; Connect's 1024 bytes are still fine.
    let tight = ConnParams { max_icd: 0, ..none };
    let buf = linux_cmd_pdu(&write_sqe(1, 4096, true), 4096, false, false);
    assert_eq!(parse_header(&buf[..8], &tight), Ok(Progress::Need(72)));
    let e = err(&buf, &tight);
    assert_fes(e, Fes::DataLimitExceeded, 0);
    assert_eq!(
        e.reason(),
        Reason::DataLimit {
            pdu: PduType::CapsuleCmd,
            len: 4096,
            max: 0
        }
    );
    assert!(matches!(
        parse_header(&linux_cmd_pdu(&connect_sqe(), 1024, false, false), &tight),
        Ok(Progress::Done(_))
    ));
    assert_eq!(tight.icd_limit(0x7f), FABRICS_MAX_ICD);
}

#[test]
fn negotiation_errors() {
    let limits = TargetLimits::default();
    let ok = IcReq {
        pfv: 0,
        hpda: 0,
        digests: Digests::NONE,
        maxr2t: 0,
    };
    let e = negotiate(&IcReq { pfv: 1, ..ok }, &limits).unwrap_err();
    assert_fes(e, Fes::UnsupportedParameter, 8);
    assert_eq!((e.reason(), e.quote_len()), (Reason::Pfv(1), 128));
    let e = negotiate(&IcReq { hpda: 32, ..ok }, &limits).unwrap_err();
    assert_fes(e, Fes::InvalidHeaderField, 10);
    // HPDA 31 is honoured; MAXR2T is 0's based and saturates.
    let (_, p) = negotiate(
        &IcReq {
            hpda: 31,
            maxr2t: u32::MAX,
            ..ok
        },
        &limits,
    )
    .unwrap();
    assert_eq!((p.hpda.bytes(), p.max_r2ts), (128, u32::MAX));

    // The Linux initiator's checks of the ICResp.
    let good = IcResp {
        pfv: 0,
        cpda: 0,
        digests: Digests::NONE,
        maxh2cdata: 4096,
    };
    assert!(host_accept_ic_resp(&ok, &good).is_ok());
    assert_fes(
        host_accept_ic_resp(&ok, &IcResp { pfv: 1, ..good }).unwrap_err(),
        Fes::UnsupportedParameter,
        8,
    );
    assert_fes(
        host_accept_ic_resp(&ok, &IcResp { cpda: 1, ..good }).unwrap_err(),
        Fes::UnsupportedParameter,
        10,
    );
    let e = host_accept_ic_resp(
        &ok,
        &IcResp {
            digests: BOTH,
            ..good
        },
    )
    .unwrap_err();
    assert_fes(e, Fes::InvalidHeaderField, 11);
    assert!(e.to_string().contains("header and data"), "{e}");
    for bad in [4094, 4097, 0, 8190] {
        let e = host_accept_ic_resp(
            &ok,
            &IcResp {
                maxh2cdata: bad,
                ..good
            },
        )
        .unwrap_err();
        assert_fes(e, Fes::InvalidHeaderField, 12);
    }

    // Limits the initiator would refuse are refused up front.
    assert_eq!(TargetLimits::new(4094, 0), Err(LimitsError::MaxH2cData(4094)));
    assert_eq!(TargetLimits::new(4097, 0), Err(LimitsError::MaxH2cData(4097)));
    assert!(TargetLimits::new(4096, 0).is_ok());
    assert_eq!(TargetLimits::default().maxh2cdata(), 131072);
}

#[test]
fn h2c_data_against_its_r2t() {
    let r = R2t {
        cccid: 3,
        ttag: 1,
        r2to: 4096,
        r2tl: 3 * 4096,
    };
    let mut w = R2tWindow::new(&r);
    let d = |datao, datal, last| H2cData {
        cccid: 3,
        ttag: 1,
        datao,
        datal,
        last,
    };
    assert_eq!(check_h2c_data(&d(4096, 4096, false), &mut w), Ok(()));
    assert_eq!(w.received, 4096);

    let e = check_h2c_data(
        &H2cData {
            cccid: 4,
            ..d(8192, 4096, false)
        },
        &mut w,
    )
    .unwrap_err();
    assert_fes(e, Fes::InvalidHeaderField, 8);
    let e = check_h2c_data(&d(0, 4096, false), &mut w).unwrap_err();
    assert_fes(e, Fes::DataOutOfRange, 0);
    let e = check_h2c_data(&d(8192, 3 * 4096, true), &mut w).unwrap_err();
    assert_fes(e, Fes::DataOutOfRange, 0);
    assert!(matches!(e.reason(), Reason::OutOfRange { .. }));
    let e = check_h2c_data(&d(12288, 4096, true), &mut w).unwrap_err();
    assert_fes(e, Fes::PduSequenceError, 0);
    assert_eq!(
        e.reason(),
        Reason::OutOfOrder {
            datao: 12288,
            expected: 8192
        }
    );
    let e = check_h2c_data(&d(8192, 4096, true), &mut w).unwrap_err();
    assert_fes(e, Fes::PduSequenceError, 0);
    assert_eq!(
        e.reason(),
        Reason::LastPdu {
            last: true,
            ends: false
        }
    );
    // Errors leave the window as it was.
    assert_eq!(w.received, 4096);
    assert_eq!(check_h2c_data(&d(8192, 4096, false), &mut w), Ok(()));
    let e = check_h2c_data(&d(12288, 4096, false), &mut w).unwrap_err();
    assert_eq!(
        e.reason(),
        Reason::LastPdu {
            last: false,
            ends: true
        }
    );
    assert_eq!(check_h2c_data(&d(12288, 4096, true), &mut w), Ok(()));
    assert!(w.is_complete());

    let e = Error::unknown_ttag(9);
    assert_fes(e, Fes::InvalidHeaderField, 10);
    assert_eq!(e.quote_len(), 24);
    assert_fes(
        Error::unknown_cccid(PduType::CapsuleResp, 1),
        Fes::InvalidHeaderField,
        20,
    );
}

#[test]
fn term_requests_and_error_replies() {
    let none = ready(Digests::NONE);
    // A malformed H2CTermReq is closed without a reply; a valid one ends the connection too.
    let e = err(&ch(0x02, 0, 24, 0, 153, 8), &none);
    assert!(!e.reply());
    assert_fes(e, Fes::InvalidHeaderField, 4);
    assert!(!err(&ch(0x02, 0x01, 24, 0, 24, 8), &ready(BOTH)).reply());
    assert!(err(&ch(0x04, 0x01, 72, 0, 76, 8), &none).reply());
    // Allowed before the ICReq, with any digests.
    let init = ConnParams::new(&TargetLimits::default());
    let h = done(&ch(0x02, 0, 24, 0, 24 + 8, 32), &init);
    assert_eq!(h.layout.data_len, 8);

    // c2h_term_req_for quotes what the error says: the common header after a bad HLEN, the
    // whole header otherwise; what was received, no more.
    let mut buf = linux_cmd_pdu(&connect_sqe(), 1024, false, false);
    buf[2] = 71;
    let e = err(&buf, &none);
    let mut out = [0u8; MAX_TX_HEADER_LEN];
    let n = c2h_term_req_for(&mut out, &e, &buf).unwrap();
    assert_eq!(n, 32);
    assert_eq!(&out[24..32], &buf[..8]);
    assert_eq!(&out[8..14], &[1, 0, 2, 0, 0, 0]);
    let mut buf = linux_cmd_pdu(&connect_sqe(), 1024, true, true);
    buf[40] ^= 1;
    let e = err(&buf, &ready(BOTH));
    let n = c2h_term_req_for(&mut out, &e, &buf[..8]).unwrap();
    assert_eq!(n, 32);
    let n = c2h_term_req_for(&mut out, &e, &buf).unwrap();
    assert_eq!(n, 24 + 72);
    assert_eq!(&out[24..96], &buf[..72]);
    assert_eq!(
        done_c2h(&out[..n], &ready(BOTH)).pdu,
        CtrlPdu::C2hTermReq(TermReq { fes: 3, fei: 0 })
    );
    // Messages name the problem.
    assert!(e.to_string().contains("Header Digest Error"), "{e}");
}
