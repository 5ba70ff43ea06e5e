//! Property tests (proptest): any bytes give a well-formed answer and never a panic; valid
//! PDUs with random fields round-trip through builder and parser; a header digest catches
//! every flipped bit; data digests do not depend on how the data is cut.
//!
//! Each property runs a fixed number of cases so `cargo test` stays quick;
//! `PROPTEST_CASES=100000 cargo test -p vfpoll-nvmf props` searches longer.

use proptest::prelude::*;

use super::tests::{ready, ref_crc32c};
use super::*;

fn config(cases: u32) -> ProptestConfig {
    let mut c = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        c.cases = cases;
    }
    c
}

fn digests() -> impl Strategy<Value = Digests> {
    (any::<bool>(), any::<bool>()).prop_map(|(header, data)| Digests { header, data })
}

fn pda() -> impl Strategy<Value = Pda> {
    prop_oneof![3 => Just(Pda::ZERO), 1 => (0u8..=Pda::MAX).prop_map(|v| Pda::new(v).unwrap())]
}

/// Any connection state a parser can be in.
fn conn() -> impl Strategy<Value = ConnParams> {
    (
        any::<bool>(),
        digests(),
        pda(),
        pda(),
        prop_oneof![
            Just(4096u32),
            Just(131072),
            (1024u32..=1 << 22).prop_map(|v| v * 4)
        ],
        prop_oneof![Just(0u32), Just(8192), 0u32..=1 << 16],
        any::<u32>(),
    )
        .prop_map(
            |(ready, digests, cpda, hpda, maxh2cdata, max_icd, max_r2ts)| ConnParams {
                phase: if ready { Phase::Ready } else { Phase::Initializing },
                digests,
                cpda,
                hpda,
                maxh2cdata,
                max_icd,
                max_r2ts,
            },
        )
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

/// What any parse result must satisfy, whatever the bytes.
fn check_outcome<P: core::fmt::Debug>(
    buf: &[u8],
    r: &Result<Progress<Header<P>>, Error>,
    pdu_type: impl Fn(&P) -> PduType,
) -> Result<(), TestCaseError> {
    match r {
        Ok(Progress::Need(n)) => {
            prop_assert!(*n > buf.len(), "Need({n}) with {} bytes", buf.len());
            prop_assert!(
                *n == COMMON_HEADER_LEN || (24..=MAX_HEADER_LEN).contains(n),
                "Need({n})"
            );
        }
        Ok(Progress::Done(h)) => {
            let l = h.layout;
            let t = pdu_type(&h.pdu);
            prop_assert!(l.header_len as usize <= buf.len());
            prop_assert_eq!(buf[0], t as u8);
            prop_assert_eq!(buf[2], t.hlen());
            prop_assert_eq!(l.plen(), le32(buf, 4));
            prop_assert!(l.header_len as usize >= t.hlen() as usize);
            if l.data_len > 0 && t.carries_data() {
                prop_assert_eq!(buf[3] as u32, l.data_offset());
            } else {
                prop_assert_eq!(l.pad, 0);
            }
            prop_assert!(!l.data_digest || l.data_len > 0);
        }
        Err(e) => {
            prop_assert!(e.fei() <= field::DATA_DATAL as u32, "{e}: FEI {}", e.fei());
            if !e.fes().has_field_offset() {
                prop_assert_eq!(e.fei(), 0);
            }
            prop_assert!(e.quote_len() <= TERM_REQ_MAX_QUOTE);
            prop_assert!(e.quoted(buf).len() <= buf.len());
            prop_assert!(!e.to_string().is_empty());
            // The error's C2HTermReq is one a host parses back, whatever the digests.
            let mut out = [0u8; MAX_TX_HEADER_LEN];
            let n = c2h_term_req_for(&mut out, e, buf).unwrap();
            prop_assert_eq!(n, 24 + e.quoted(buf).len());
            let host = ConnParams {
                digests: Digests {
                    header: true,
                    data: true,
                },
                ..ready(Digests::NONE)
            };
            match parse_c2h_header(&out[..n], &host) {
                Ok(Progress::Done(Header {
                    pdu: CtrlPdu::C2hTermReq(t),
                    layout,
                })) => {
                    prop_assert_eq!(t.status(), Some(e.fes()));
                    prop_assert_eq!(t.fei, e.fei());
                    prop_assert_eq!(layout.data_len as usize, n - 24);
                    prop_assert_eq!(&out[24..n], e.quoted(buf));
                }
                other => prop_assert!(false, "C2HTermReq for {e} parsed as {other:?}"),
            }
        }
    }
    Ok(())
}

/// A valid host PDU header for `conn` with random fields, and what it must parse to.
fn host_pdu(conn: ConnParams) -> impl Strategy<Value = (Vec<u8>, ConnParams, HostPdu)> {
    let icreq =
        (any::<u16>(), any::<u8>(), digests(), any::<u32>()).prop_map(|(pfv, hpda, digests, maxr2t)| {
            HostPdu::IcReq(IcReq {
                pfv,
                hpda,
                digests,
                maxr2t,
            })
        });
    let term = (
        1u16..=6,
        any::<u32>(),
        prop::collection::vec(any::<u8>(), 0..=160),
    )
        .prop_map(|(fes, fei, quote)| (HostPdu::H2cTermReq(TermReq { fes, fei }), quote));
    let cmd = (prop::collection::vec(any::<u8>(), 64), any::<u32>()).prop_map(move |(sqe, len)| {
        let sqe: [u8; 64] = sqe.try_into().unwrap();
        let limit = conn.icd_limit(sqe[0]);
        let data_len = if limit == 0 { 0 } else { len % (limit + 1) };
        HostPdu::CapsuleCmd(CapsuleCmd {
            sqe,
            data_len,
            data_offset: 0,
        })
    });
    let data = (
        any::<u16>(),
        any::<u16>(),
        any::<u32>(),
        1..=conn.maxh2cdata,
        any::<bool>(),
    )
        .prop_map(|(cccid, ttag, datao, datal, last)| {
            HostPdu::H2cData(H2cData {
                cccid,
                ttag,
                datao,
                datal,
                last,
            })
        });
    prop_oneof![
        icreq.prop_map(|p| (p, Vec::new())),
        term,
        cmd.prop_map(|p| (p, Vec::new())),
        data.prop_map(|p| (p, Vec::new())),
    ]
    .prop_map(move |(pdu, quote)| {
        let mut conn = conn;
        conn.phase = if matches!(pdu, HostPdu::IcReq(_)) {
            Phase::Initializing
        } else {
            Phase::Ready
        };
        let mut out = [0u8; MAX_TX_HEADER_LEN];
        let (len, pdu) = match pdu {
            HostPdu::IcReq(r) => (ic_req(&mut out, &r).unwrap(), pdu),
            HostPdu::H2cTermReq(t) => {
                let n = h2c_term_req(&mut out, Fes::from_u16(t.fes).unwrap(), t.fei, &quote).unwrap();
                (n, pdu)
            }
            HostPdu::CapsuleCmd(c) => {
                let tx = capsule_cmd_header(&mut out, &c.sqe, c.data_len, &conn).unwrap();
                let offset = if c.data_len == 0 { 0 } else { tx.len as u32 };
                (
                    tx.len,
                    HostPdu::CapsuleCmd(CapsuleCmd {
                        data_offset: offset,
                        ..c
                    }),
                )
            }
            HostPdu::H2cData(d) => (h2c_data_header(&mut out, &d, &conn).unwrap().len, pdu),
        };
        (out[..len].to_vec(), conn, pdu)
    })
}

/// A valid controller PDU header for `conn` with random fields, and what it must parse to.
fn ctrl_pdu(conn: ConnParams) -> impl Strategy<Value = (Vec<u8>, ConnParams, CtrlPdu)> {
    let icresp =
        (any::<u16>(), any::<u8>(), digests(), any::<u32>()).prop_map(|(pfv, cpda, digests, maxh2cdata)| {
            CtrlPdu::IcResp(IcResp {
                pfv,
                cpda,
                digests,
                maxh2cdata,
            })
        });
    let resp = prop::collection::vec(any::<u8>(), 16).prop_map(|c| {
        CtrlPdu::CapsuleResp(CapsuleResp {
            cqe: c.try_into().unwrap(),
        })
    });
    let data = (
        any::<u16>(),
        any::<u32>(),
        1..=u32::MAX - 256,
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(cccid, datao, datal, last, success)| {
            CtrlPdu::C2hData(C2hData {
                cccid,
                datao,
                datal,
                last: last || success,
                success,
            })
        });
    let r2ts =
        (any::<u16>(), any::<u16>(), any::<u32>(), 1..=u32::MAX).prop_map(|(cccid, ttag, r2to, r2tl)| {
            CtrlPdu::R2t(R2t {
                cccid,
                ttag,
                r2to,
                r2tl,
            })
        });
    let term = (1u16..=6, any::<u32>()).prop_map(|(fes, fei)| CtrlPdu::C2hTermReq(TermReq { fes, fei }));
    prop_oneof![icresp, resp, data, r2ts, term].prop_map(move |pdu| {
        let mut conn = conn;
        conn.phase = if matches!(pdu, CtrlPdu::IcResp(_)) {
            Phase::Initializing
        } else {
            Phase::Ready
        };
        let mut out = [0u8; MAX_TX_HEADER_LEN];
        let len = match &pdu {
            CtrlPdu::IcResp(r) => ic_resp(&mut out, r).unwrap(),
            CtrlPdu::CapsuleResp(c) => capsule_resp(&mut out, &c.cqe, conn.digests).unwrap(),
            CtrlPdu::C2hData(d) => c2h_data_header(&mut out, d, &conn).unwrap().len,
            CtrlPdu::R2t(r) => r2t(&mut out, r, conn.digests).unwrap(),
            CtrlPdu::C2hTermReq(t) => {
                c2h_term_req(&mut out, Fes::from_u16(t.fes).unwrap(), t.fei, &[7; 40]).unwrap()
            }
        };
        (out[..len].to_vec(), conn, pdu)
    })
}

/// The layout a header built for `conn` must have, computed from the fields.
fn expected_layout(t: PduType, conn: &ConnParams, data_len: u32) -> Layout {
    let header_len = t.hlen() as u32 + conn.digests.header_len(t) as u32;
    let pda = if t.from_host() { conn.cpda } else { conn.hpda };
    let carries = t.carries_data() && data_len > 0;
    let pad = if carries {
        pda.data_offset(header_len as usize) as u32 - header_len
    } else {
        0
    };
    Layout {
        header_len,
        pad,
        data_len,
        data_digest: carries && conn.digests.data,
    }
}

fn host_data_len(p: &HostPdu) -> u32 {
    match p {
        HostPdu::CapsuleCmd(c) => c.data_len,
        HostPdu::H2cData(d) => d.datal,
        _ => 0,
    }
}

proptest! {
    #![proptest_config(config(512))]

    /// Any bytes, any connection state: no panic, and an answer that holds together.
    #[test]
    fn any_bytes_give_a_well_formed_answer(buf in prop::collection::vec(any::<u8>(), 0..200), conn in conn()) {
        check_outcome(&buf, &parse_header(&buf, &conn), HostPdu::pdu_type)?;
        check_outcome(&buf, &parse_c2h_header(&buf, &conn), CtrlPdu::pdu_type)?;
    }

    /// Valid PDUs with a few bytes changed, cut anywhere: the same, deeper into the checks.
    #[test]
    fn damaged_pdus_give_a_well_formed_answer(
        (pdu, conn, _) in conn().prop_flat_map(host_pdu),
        pokes in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        cut in any::<prop::sample::Index>(),
        other in conn(),
    ) {
        let mut buf = pdu;
        for (at, v) in pokes {
            let i = at.index(buf.len());
            buf[i] = v;
        }
        let buf = &buf[..cut.index(buf.len() + 1)];
        check_outcome(buf, &parse_header(buf, &conn), HostPdu::pdu_type)?;
        check_outcome(buf, &parse_header(buf, &other), HostPdu::pdu_type)?;
    }

    /// Host PDUs built from random fields parse back to them, with the layout they were built
    /// for; every shorter prefix asks for more.
    #[test]
    fn host_pdus_round_trip((buf, conn, pdu) in conn().prop_flat_map(host_pdu)) {
        let h = match parse_header(&buf, &conn) {
            Ok(Progress::Done(h)) => h,
            other => return Err(TestCaseError::fail(format!("{pdu:?} built as {buf:02x?} parsed as {other:?}"))),
        };
        prop_assert_eq!(h.pdu, pdu);
        let t = pdu.pdu_type();
        let want = match pdu {
            HostPdu::H2cTermReq(_) => Layout { header_len: 24, pad: 0, data_len: buf.len() as u32 - 24, data_digest: false },
            _ => expected_layout(t, &conn, host_data_len(&pdu)),
        };
        prop_assert_eq!(h.layout, want);
        if !matches!(pdu, HostPdu::H2cTermReq(_)) {
            prop_assert_eq!(buf.len() as u32, want.data_offset().max(want.header_len));
        }
        for n in 0..want.header_len as usize {
            match parse_header(&buf[..n], &conn) {
                Ok(Progress::Need(need)) => {
                    prop_assert_eq!(need, if n < 8 { 8 } else { want.header_len as usize });
                }
                other => prop_assert!(false, "{} of {} bytes gave {:?}", n, buf.len(), other),
            }
        }
    }

    /// Controller PDUs built from random fields parse back to them on the host's side.
    #[test]
    fn controller_pdus_round_trip((buf, conn, pdu) in conn().prop_flat_map(ctrl_pdu)) {
        let h = match parse_c2h_header(&buf, &conn) {
            Ok(Progress::Done(h)) => h,
            other => return Err(TestCaseError::fail(format!("{pdu:?} built as {buf:02x?} parsed as {other:?}"))),
        };
        prop_assert_eq!(h.pdu, pdu);
        let data_len = match pdu {
            CtrlPdu::C2hData(d) => d.datal,
            CtrlPdu::C2hTermReq(_) => 40,
            _ => 0,
        };
        let want = match pdu {
            CtrlPdu::C2hTermReq(_) => Layout { header_len: 24, pad: 0, data_len, data_digest: false },
            _ => expected_layout(pdu.pdu_type(), &conn, data_len),
        };
        prop_assert_eq!(h.layout, want);
    }

    /// With header digests on, no single flipped bit of a header goes unnoticed.
    #[test]
    fn header_digest_catches_every_flipped_bit(
        (buf, conn, pdu) in conn().prop_flat_map(|c| host_pdu(ConnParams { digests: Digests { header: true, ..c.digests }, ..c })),
        bit in any::<prop::sample::Index>(),
    ) {
        // The ICReq and termination requests have no header digest.
        if !matches!(pdu, HostPdu::CapsuleCmd(_) | HostPdu::H2cData(_)) {
            return Ok(());
        }
        let header_len = pdu.pdu_type().hlen() as usize + DIGEST_LEN;
        let mut bad = buf.clone();
        let b = bit.index(header_len * 8);
        bad[b / 8] ^= 1 << (b % 8);
        let r = parse_header(&bad, &conn);
        prop_assert!(r.is_err(), "bit {} flipped: {:?}", b, r);
    }

    /// A data digest fed in any pieces is the CRC32C of the whole.
    #[test]
    fn data_digest_is_independent_of_the_cut(
        data in prop::collection::vec(any::<u8>(), 0..3000),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
    ) {
        let mut at: Vec<usize> = cuts.iter().map(|c| c.index(data.len() + 1)).collect();
        at.push(0);
        at.push(data.len());
        at.sort_unstable();
        let mut d = DataDigest::new();
        for w in at.windows(2) {
            d.update(&data[w[0]..w[1]]);
        }
        prop_assert_eq!(d.value(), ref_crc32c(&data));
        prop_assert_eq!(d.len(), data.len() as u64);
        prop_assert!(d.matches(ref_crc32c(&data).to_le_bytes()));
    }

    /// H2CData that splits an R2T in order passes; moving one PDU's offset, length or
    /// LAST_PDU fails it with the status of what was broken.
    #[test]
    fn h2c_data_splitting_an_r2t(
        r2to in 0u32..1 << 20,
        r2tl in 1u32..1 << 20,
        maxh2cdata in (1u32..=64).prop_map(|v| v * 4096),
        victim in any::<prop::sample::Index>(),
        how in 0u8..3,
    ) {
        let r = R2t { cccid: 1, ttag: 2, r2to, r2tl };
        let mut pdus = Vec::new();
        let mut off = 0;
        while off < r2tl {
            let len = (r2tl - off).min(maxh2cdata);
            pdus.push(H2cData { cccid: 1, ttag: 2, datao: r2to + off, datal: len, last: off + len == r2tl });
            off += len;
        }
        let mut w = R2tWindow::new(&r);
        for d in &pdus {
            prop_assert_eq!(check_h2c_data(d, &mut w), Ok(()));
        }
        prop_assert!(w.is_complete());

        let v = victim.index(pdus.len());
        let mut bad = pdus.clone();
        let want = match how {
            0 => { bad[v].datao = bad[v].datao.wrapping_add(1); if bad[v].datao + bad[v].datal > r2to + r2tl { Fes::DataOutOfRange } else { Fes::PduSequenceError } }
            1 => { bad[v].datal += 1; Fes::DataOutOfRange }
            _ => { bad[v].last = !bad[v].last; Fes::PduSequenceError }
        };
        let mut w = R2tWindow::new(&r);
        let mut result = Ok(());
        for d in &bad {
            result = check_h2c_data(d, &mut w);
            if result.is_err() {
                break;
            }
        }
        // Lengthening a PDU inside the R2T shows up as the next one arriving out of order.
        let got = result.map_err(|e| e.fes());
        if how == 1 && v + 1 < bad.len() {
            prop_assert!(got == Err(Fes::DataOutOfRange) || got == Err(Fes::PduSequenceError), "{got:?}");
        } else {
            prop_assert_eq!(got, Err(want));
        }
    }
}
