//! The `fuzz_pdu` target: NVMe/TCP PDUs as [`vfpoll_nvmf::pdu`] reads them.
//!
//! # Input
//!
//! - byte 0, the connection: bit 0 header digests, bit 1 data digests, bit 2 read as a host
//!   (controller-to-host PDUs, [`parse_c2h_header`]) instead of as a controller
//!   ([`parse_header`]), bit 3 start after the ICReq/ICResp exchange (else the first PDU must
//!   be the ICReq or ICResp, which sets the connection up), bits 5:4 pick MAXH2CDATA, bits 7:6
//!   the in-capsule data limit;
//! - byte 1: bits 4:0 the PDU data alignment (CPDA for a controller, HPDA for a host) when
//!   starting after the exchange, bits 7:5 the size of the R2T each H2CData is checked against
//!   (its DATAL times 1 to 8);
//! - then PDUs back to back, each read like the runtime reads a socket: the header, then the
//!   PDU's padding, data and data digest as its layout says.
//!
//! # Properties
//!
//! - no panic, whatever the bytes;
//! - the result depends only on the bytes the parser asked for: feeding it exactly what each
//!   [`Progress::Need`] says gives the same answer as all the bytes at once, and a `Need` always
//!   asks for more than it was given and at most [`MAX_HEADER_LEN`];
//! - an accepted header is consistent: PLEN is the layout's sum, FLAGS are exactly the flags
//!   the typed PDU and the connection imply, PDO is 0 (no data) or an aligned offset between
//!   the end of the header digest and PLEN where the data starts, DATAL is the data length,
//!   in-capsule data and H2CData stay within their limits;
//! - an accepted CapsuleCmd's SGL reads the same to the transport (`CapsuleCmd::sgl`) and to the
//!   fabrics layer (`data_xfer`), and in-capsule data it names lies inside the capsule;
//! - rebuilding an accepted header with the crate's builders gives the received bytes (with
//!   reserved fields and padding zeroed, PDO canonical and the header digest recomputed), and
//!   parsing the rebuilt header gives the same PDU;
//! - a header digest catches a flipped bit in the header or the digest;
//! - a data digest fed piece by piece equals CRC32C of the whole data;
//! - every error is typed: FEI is a field offset exactly for the statuses that have one, the
//!   quote is 8 to 128 bytes, the termination request that reports it is a valid PDU that the
//!   other side parses back to the same FES and FEI, only a malformed termination request is
//!   closed without one, and a header digest error reports the CRC32C of the header;
//! - an ICReq the controller accepts gets an ICResp that a host with the Linux initiator's rules
//!   accepts, with the same connection parameters;
//! - each H2CData is checked against an R2T window the way §3.6.2.8 says (command, range,
//!   order, LAST_PDU), and a refused one leaves the window as it was.

use vfpoll_nvmf::fabrics::{data_xfer, sqe_from_bytes, sqe_to_bytes, DataXfer};
use vfpoll_nvmf::pdu::{
    self, field, host_accept_ic_resp, negotiate, parse_c2h_header, parse_header, BuildError, CapsuleCmd,
    ConnParams, CtrlPdu, DataDigest, DataSgl, Digests, Error, Fes, Flags, H2cData, HostPdu, IcReq, Layout,
    Pda, PduType, Phase, Progress, R2t, R2tWindow, Reason, TargetLimits, COMMON_HEADER_LEN, DIGEST_LEN,
    MAX_HEADER_LEN, MAX_TX_HEADER_LEN, TERM_REQ_MAX_QUOTE,
};

use crate::{planted, PLANTED_CDW14, PLANTED_MESSAGE};

/// Most PDUs one input is read as.
const MAX_PDUS: usize = 64;
/// MAXH2CDATA values an input picks from (byte 0 bits 5:4).
const MAXH2CDATA: [u32; 4] = [4096, 8192, TargetLimits::DEFAULT_MAXH2CDATA, u32::MAX - 3];
/// In-capsule data limits an input picks from (byte 0 bits 7:6).
const MAX_ICD: [u32; 4] = [0, 4096, TargetLimits::DEFAULT_MAX_ICD, 1 << 20];

/// Byte 0 bits.
pub mod cfg {
    /// Header digests.
    pub const HDGST: u8 = 1 << 0;
    /// Data digests.
    pub const DDGST: u8 = 1 << 1;
    /// Read controller-to-host PDUs, as a host.
    pub const HOST: u8 = 1 << 2;
    /// Start after the ICReq/ICResp exchange.
    pub const READY: u8 = 1 << 3;
}

/// The fuzz target: reads `data` as described in the module documentation and panics when a
/// property breaks (or on the planted crash with `VFPOLL_FUZZ_PLANT=1`).
pub fn check(data: &[u8]) {
    check_with(data, planted());
}

/// [`check`] with the planted crash on or off.
pub fn check_with(data: &[u8], plant: bool) {
    let [c0, c1, stream @ ..] = data else {
        return;
    };
    let mut s = Session::new(*c0, *c1, plant);
    let mut pos = 0;
    for _ in 0..MAX_PDUS {
        let b = &stream[pos..];
        if b.is_empty() {
            return;
        }
        match s.step(b) {
            Some(plen) => pos += plen,
            None => return,
        }
    }
}

/// Which side reads the PDUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// A controller reading what a host sends.
    Controller,
    /// A host reading what a controller sends.
    Host,
}

impl Role {
    fn peer(self) -> Role {
        match self {
            Role::Controller => Role::Host,
            Role::Host => Role::Controller,
        }
    }

    /// The termination request this side receives.
    fn term_type(self) -> PduType {
        match self {
            Role::Controller => PduType::H2cTermReq,
            Role::Host => PduType::C2hTermReq,
        }
    }

    /// The alignment of data in the PDUs this side receives.
    fn pda(self, conn: &ConnParams) -> Pda {
        match self {
            Role::Controller => conn.cpda,
            Role::Host => conn.hpda,
        }
    }
}

/// A parsed PDU of either direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pdu {
    Host(HostPdu),
    Ctrl(CtrlPdu),
}

impl Pdu {
    fn pdu_type(&self) -> PduType {
        match self {
            Pdu::Host(p) => p.pdu_type(),
            Pdu::Ctrl(p) => p.pdu_type(),
        }
    }
}

type Parsed = Result<Progress<(Pdu, Layout)>, Error>;

fn parse(role: Role, buf: &[u8], conn: &ConnParams) -> Parsed {
    match role {
        Role::Controller => parse_header(buf, conn).map(|p| match p {
            Progress::Need(n) => Progress::Need(n),
            Progress::Done(h) => Progress::Done((Pdu::Host(h.pdu), h.layout)),
        }),
        Role::Host => parse_c2h_header(buf, conn).map(|p| match p {
            Progress::Need(n) => Progress::Need(n),
            Progress::Done(h) => Progress::Done((Pdu::Ctrl(h.pdu), h.layout)),
        }),
    }
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// One connection's state while an input is read.
struct Session {
    role: Role,
    conn: ConnParams,
    limits: TargetLimits,
    /// The ICReq a host role sent (what an ICResp is checked against).
    host_req: IcReq,
    /// R2T windows by TTAG (a controller role).
    windows: Vec<(u16, R2tWindow)>,
    r2t_factor: u32,
    plant: bool,
}

impl Session {
    fn new(c0: u8, c1: u8, plant: bool) -> Self {
        let limits = TargetLimits::new(
            MAXH2CDATA[(c0 as usize >> 4) & 3],
            MAX_ICD[(c0 as usize >> 6) & 3],
        )
        .expect("the fuzz limits are valid");
        let role = if c0 & cfg::HOST != 0 {
            Role::Host
        } else {
            Role::Controller
        };
        let digests = Digests::from_dgst(c0 & (cfg::HDGST | cfg::DDGST));
        let pda = Pda::new(c1 & 31).expect("0 to 31");
        let mut conn = ConnParams::new(&limits);
        if c0 & cfg::READY != 0 {
            conn.phase = Phase::Ready;
            conn.digests = digests;
            conn.cpda = pda;
            conn.hpda = pda;
        }
        Session {
            role,
            conn,
            limits,
            host_req: IcReq {
                pfv: 0,
                hpda: pda.get(),
                digests,
                maxr2t: 0,
            },
            windows: Vec::new(),
            r2t_factor: 1 + (c1 >> 5) as u32,
            plant,
        }
    }

    /// Reads the PDU at the start of `b`; `Some(PLEN)` when the next one follows.
    fn step(&mut self, b: &[u8]) -> Option<usize> {
        let conn = self.conn;
        let r = parse(self.role, b, &conn);
        check_incremental(self.role, b, &conn, &r);
        let (pdu, layout) = match r {
            Err(e) => {
                check_error(self.role, b, &conn, &e);
                return None;
            }
            Ok(Progress::Need(n)) => {
                assert!(n > b.len(), "Need({n}) with {} bytes given", b.len());
                return None;
            }
            Ok(Progress::Done(d)) => d,
        };
        check_layout(self.role, b, &conn, pdu, layout);
        check_rebuild(self.role, b, &conn, pdu, layout);
        check_header_digest(self.role, b, &conn, layout);
        let plen = layout.plen() as usize;
        let whole = b.get(..plen);
        if let Some(whole) = whole {
            check_data(whole, layout);
        }
        let go_on = match pdu {
            Pdu::Host(HostPdu::IcReq(req)) => self.ic_req(&req),
            Pdu::Ctrl(CtrlPdu::IcResp(resp)) => self.ic_resp(&resp),
            Pdu::Host(HostPdu::H2cTermReq(_)) | Pdu::Ctrl(CtrlPdu::C2hTermReq(_)) => false,
            Pdu::Host(HostPdu::CapsuleCmd(c)) => {
                if self.plant && le32(&c.sqe, 56) == PLANTED_CDW14 {
                    panic!("{PLANTED_MESSAGE}: an accepted CapsuleCmd with CDW14 {PLANTED_CDW14:#010x}");
                }
                check_sqe(&c, whole.map(|w| data_of(w, layout)));
                true
            }
            Pdu::Host(HostPdu::H2cData(d)) => {
                self.h2c_data(&d);
                true
            }
            Pdu::Ctrl(_) => true,
        };
        (go_on && whole.is_some()).then_some(plen)
    }

    /// The controller's answer to an ICReq; the connection continues with what it negotiated.
    fn ic_req(&mut self, req: &IcReq) -> bool {
        match negotiate(req, &self.limits) {
            Ok((resp, params)) => {
                assert_eq!((resp.pfv, resp.cpda), (0, 0), "{resp:?}");
                assert_eq!(resp.digests, req.digests, "the ICResp mirrors the digests");
                assert_eq!(resp.maxh2cdata, self.limits.maxh2cdata());
                assert_eq!(params.phase, Phase::Ready);
                assert_eq!(params.digests, req.digests);
                assert_eq!((params.cpda, Some(params.hpda)), (Pda::ZERO, Pda::new(req.hpda)));
                assert_eq!(params.max_r2ts, req.maxr2t.saturating_add(1));
                // The ICResp is a valid PDU that a host with the Linux initiator's rules takes.
                let mut out = [0u8; MAX_TX_HEADER_LEN];
                let n = pdu::ic_resp(&mut out, &resp).expect("an ICResp fits");
                let host = ConnParams::new(&self.limits);
                match parse(Role::Host, &out[..n], &host) {
                    Ok(Progress::Done((Pdu::Ctrl(CtrlPdu::IcResp(r)), _))) => assert_eq!(r, resp),
                    other => panic!("the ICResp for {req:?} reads back as {other:?}"),
                }
                let hp = host_accept_ic_resp(req, &resp)
                    .unwrap_or_else(|e| panic!("a host refuses the ICResp {resp:?} to {req:?}: {e}"));
                assert_eq!(
                    (hp.digests, hp.cpda, hp.hpda, hp.maxh2cdata, hp.max_r2ts),
                    (
                        params.digests,
                        params.cpda,
                        params.hpda,
                        params.maxh2cdata,
                        params.max_r2ts
                    )
                );
                self.conn = params;
                true
            }
            Err(e) => {
                let expected = if req.pfv != 0 {
                    (Fes::UnsupportedParameter, field::ICREQ_PFV)
                } else {
                    assert!(req.hpda > Pda::MAX, "negotiate refused {req:?}: {e}");
                    (Fes::InvalidHeaderField, field::ICREQ_HPDA)
                };
                assert_eq!((e.fes(), e.fei() as usize), expected, "{e}");
                assert!(e.reply() && !e.to_string().is_empty());
                false
            }
        }
    }

    /// A host's check of an ICResp against its ICReq.
    fn ic_resp(&mut self, resp: &pdu::IcResp) -> bool {
        let req = self.host_req;
        let linux_ok = resp.pfv == 0
            && resp.cpda == 0
            && resp.digests == req.digests
            && resp.maxh2cdata.is_multiple_of(4)
            && resp.maxh2cdata >= pdu::MIN_MAXH2CDATA;
        match host_accept_ic_resp(&req, resp) {
            Ok(p) => {
                assert!(linux_ok, "a host accepted {resp:?} for {req:?}");
                assert_eq!(
                    (p.phase, p.digests, p.maxh2cdata),
                    (Phase::Ready, req.digests, resp.maxh2cdata)
                );
                self.conn = p;
                true
            }
            Err(e) => {
                assert!(!linux_ok, "a host refused {resp:?} for {req:?}: {e}");
                assert!(e.fes().has_field_offset() && (e.fei() as usize) < 128, "{e}");
                false
            }
        }
    }

    /// Checks an H2CData against the R2T window of its TTAG (a new window, DATAL × 1 to 8
    /// long, when the TTAG has none), with the rules of §3.6.2.8 written out here.
    fn h2c_data(&mut self, d: &H2cData) {
        let i = match self.windows.iter().position(|(t, _)| *t == d.ttag) {
            Some(i) => i,
            None => {
                let r2t = R2t {
                    cccid: d.cccid,
                    ttag: d.ttag,
                    r2to: d.datao,
                    r2tl: d.datal.saturating_mul(self.r2t_factor),
                };
                self.windows.push((d.ttag, R2tWindow::new(&r2t)));
                self.windows.len() - 1
            }
        };
        let before = self.windows[i].1;
        let end = d.datao as u64 + d.datal as u64;
        let window_end = before.r2to as u64 + before.r2tl as u64;
        let wrong_cmd = d.cccid != before.cccid;
        let out_of_range = d.datao < before.r2to || end > window_end;
        let out_of_order = d.datao as u64 != before.r2to as u64 + before.received as u64;
        let wrong_last = d.last != (end == window_end);
        let w = &mut self.windows[i].1;
        match pdu::check_h2c_data(d, w) {
            Ok(()) => {
                assert!(
                    !(wrong_cmd || out_of_range || out_of_order || wrong_last),
                    "accepted {d:?} for {before:?}"
                );
                assert_eq!(w.received as u64, before.received as u64 + d.datal as u64);
                assert!(w.received <= w.r2tl);
                assert_eq!(w.is_complete(), d.last);
                if d.last {
                    self.windows.swap_remove(i);
                }
            }
            Err(e) => {
                assert_eq!(*w, before, "a refused H2CData changed its window");
                let fes_ok = match e.fes() {
                    Fes::InvalidHeaderField => wrong_cmd && e.fei() as usize == field::DATA_CCCID,
                    Fes::DataOutOfRange => out_of_range,
                    Fes::PduSequenceError => out_of_order || wrong_last,
                    _ => false,
                };
                assert!(fes_ok, "{d:?} against {before:?}: {e}");
                assert!(e.reply() && !e.to_string().is_empty());
                self.windows.swap_remove(i);
            }
        }
    }
}

/// Feeds the parser exactly the bytes it asks for, as the runtime does; the answer must be
/// the one all of `b` gave.
fn check_incremental(role: Role, b: &[u8], conn: &ConnParams, all: &Parsed) {
    for k in [0, 1, COMMON_HEADER_LEN - 1] {
        if k < b.len() {
            assert_eq!(parse(role, &b[..k], conn), Ok(Progress::Need(COMMON_HEADER_LEN)));
        }
    }
    let mut k = 0;
    loop {
        let r = parse(role, &b[..k.min(b.len())], conn);
        match r {
            Ok(Progress::Need(n)) => {
                assert!(n > k && n <= MAX_HEADER_LEN, "Need({n}) after {k} bytes");
                if n > b.len() {
                    assert_eq!(r, *all, "{} bytes: Need({n}), all bytes: {all:?}", b.len());
                    return;
                }
                k = n;
            }
            _ => {
                assert_eq!(r, *all, "the first {k} bytes of {} read differently", b.len());
                return;
            }
        }
    }
}

/// Header bytes the received PDU's fields fix: the type's reserved fields, the DGST field's
/// reserved bits (§3.6.2.2/§3.6.2.3) and TTAG in a C2HData are not among them.
fn canonical(b: &[u8], conn: &ConnParams, t: PduType, layout: Layout, len: usize) -> Vec<u8> {
    let mut c = b[..len].to_vec();
    let hlen = t.hlen() as usize;
    let zero = |c: &mut Vec<u8>, r: std::ops::Range<usize>| c[r.start.min(len)..r.end.min(len)].fill(0);
    match t {
        PduType::IcReq | PduType::IcResp => {
            c[field::ICREQ_DGST] &= 3;
            zero(&mut c, 16..hlen);
        }
        PduType::H2cTermReq | PduType::C2hTermReq => zero(&mut c, 14..hlen),
        PduType::H2cData | PduType::R2t => zero(&mut c, 20..hlen),
        PduType::C2hData => {
            zero(&mut c, field::DATA_TTAG..field::DATA_TTAG + 2);
            zero(&mut c, 20..hlen);
        }
        PduType::CapsuleCmd | PduType::CapsuleResp => {}
    }
    let header_len = layout.header_len as usize;
    zero(&mut c, header_len..header_len + layout.pad as usize);
    if t.carries_data() && layout.data_len == 0 {
        // PDO 0 or the header length: both mean "no data"; the builders write 0.
        c[field::PDO] = 0;
    }
    if conn.digests.header_len(t) != 0 {
        let d = crc32c::crc32c(&c[..hlen]);
        c[hlen..hlen + DIGEST_LEN].copy_from_slice(&d.to_le_bytes());
    }
    c
}

/// Lengths, offsets and flags of an accepted header agree with each other and the connection.
fn check_layout(role: Role, b: &[u8], conn: &ConnParams, pdu: Pdu, layout: Layout) {
    let t = pdu.pdu_type();
    let hd = conn.digests.header_len(t);
    assert_eq!((b[field::TYPE], b[field::HLEN]), (t as u8, t.hlen()));
    assert_eq!(layout.header_len as usize, t.hlen() as usize + hd, "{pdu:?}");
    assert_eq!(le32(b, field::PLEN), layout.plen(), "{pdu:?} {layout:?}");
    let data_digest = conn.digests.data && t.carries_data() && layout.data_len > 0;
    assert_eq!(layout.data_digest, data_digest, "{pdu:?} {layout:?}");
    // PDO: where the data starts, after the header and its digest, aligned, within PLEN; 0
    // only when no data follows (and always for the types without data).
    let pdo = b[field::PDO] as u32;
    if t.carries_data() && pdo != 0 {
        assert!(
            pdo >= layout.header_len && pdo <= layout.plen(),
            "PDO {pdo} of {pdu:?} {layout:?}"
        );
        assert_eq!(pdo as usize % role.pda(conn).bytes(), 0, "PDO {pdo} of {pdu:?}");
    } else if t.carries_data() {
        assert_eq!(layout.data_len, 0, "{pdu:?} with data but PDO 0");
    }
    if t.carries_data() && layout.data_len > 0 {
        assert_eq!(pdo, layout.data_offset());
    } else {
        assert_eq!(layout.pad, 0, "{pdu:?} {layout:?}");
        assert!(t.carries_data() || pdo == 0, "PDO {pdo} of {pdu:?}");
    }
    let (mut last, mut success) = (false, false);
    match pdu {
        Pdu::Host(HostPdu::IcReq(_))
        | Pdu::Ctrl(CtrlPdu::IcResp(_) | CtrlPdu::CapsuleResp(_) | CtrlPdu::R2t(_)) => {
            assert_eq!(layout.data_len, 0);
        }
        Pdu::Host(HostPdu::H2cTermReq(_)) | Pdu::Ctrl(CtrlPdu::C2hTermReq(_)) => {
            assert!(layout.data_len as usize <= TERM_REQ_MAX_QUOTE);
        }
        Pdu::Host(HostPdu::CapsuleCmd(c)) => {
            assert_eq!(c.data_len, layout.data_len);
            assert!(c.data_len <= conn.icd_limit(c.opcode()), "{c:?} {conn:?}");
            let offset = if c.data_len == 0 { 0 } else { layout.data_offset() };
            assert_eq!(c.data_offset, offset);
        }
        Pdu::Host(HostPdu::H2cData(d)) => {
            assert!(
                d.datal == layout.data_len && d.datal > 0 && d.datal <= conn.maxh2cdata,
                "{d:?}"
            );
            last = d.last;
        }
        Pdu::Ctrl(CtrlPdu::C2hData(d)) => {
            assert!(d.datal == layout.data_len && d.datal > 0, "{d:?}");
            assert!(d.last || !d.success, "{d:?}");
            (last, success) = (d.last, d.success);
        }
    }
    let flags = Flags::NONE
        .with_if(Flags::HDGSTF, hd != 0)
        .with_if(Flags::DDGSTF, data_digest)
        .with_if(Flags::LAST_PDU, last)
        .with_if(Flags::SUCCESS, success);
    assert_eq!(b[field::FLAGS], flags.0, "FLAGS of {pdu:?}");
}

/// The builders write back what was parsed.
fn check_rebuild(role: Role, b: &[u8], conn: &ConnParams, pdu: Pdu, layout: Layout) {
    let mut out = [0u8; MAX_TX_HEADER_LEN];
    let quote = || b.get(24..24 + layout.data_len as usize);
    let tx = |r: Result<pdu::TxHeader, BuildError>| {
        let h = r.unwrap_or_else(|e| panic!("cannot rebuild {pdu:?}: {e}"));
        assert_eq!(h.data_digest.is_some(), layout.data_digest, "{pdu:?}");
        h.len
    };
    let n = match pdu {
        Pdu::Host(HostPdu::IcReq(r)) => pdu::ic_req(&mut out, &r).expect("an ICReq fits"),
        Pdu::Ctrl(CtrlPdu::IcResp(r)) => pdu::ic_resp(&mut out, &r).expect("an ICResp fits"),
        Pdu::Host(HostPdu::H2cTermReq(t)) | Pdu::Ctrl(CtrlPdu::C2hTermReq(t)) => {
            // A FES the specification reserves has no Fes to build it from.
            let (Some(fes), Some(q)) = (Fes::from_u16(t.fes), quote()) else {
                return;
            };
            let build = match role {
                Role::Controller => pdu::h2c_term_req,
                Role::Host => pdu::c2h_term_req,
            };
            build(&mut out, fes, t.fei, q).expect("a termination request fits")
        }
        Pdu::Host(HostPdu::CapsuleCmd(c)) => tx(pdu::capsule_cmd_header(&mut out, &c.sqe, c.data_len, conn)),
        Pdu::Host(HostPdu::H2cData(d)) => tx(pdu::h2c_data_header(&mut out, &d, conn)),
        Pdu::Ctrl(CtrlPdu::C2hData(d)) => tx(pdu::c2h_data_header(&mut out, &d, conn)),
        Pdu::Ctrl(CtrlPdu::CapsuleResp(r)) => {
            pdu::capsule_resp(&mut out, &r.cqe, conn.digests).expect("a CapsuleResp fits")
        }
        Pdu::Ctrl(CtrlPdu::R2t(r)) => match pdu::r2t(&mut out, &r, conn.digests) {
            // The host parser takes an R2T for 0 bytes, which the builder refuses to send.
            Err(BuildError::NoData(_)) if r.r2tl == 0 => return,
            other => other.unwrap_or_else(|e| panic!("cannot rebuild {r:?}: {e}")),
        },
    };
    let rebuilt = &out[..n];
    // Parsed again, the rebuilt header is the same PDU, with the smallest padding.
    let t = pdu.pdu_type();
    let min_pad = if t.carries_data() && layout.data_len > 0 {
        role.pda(conn).data_offset(layout.header_len as usize) as u32 - layout.header_len
    } else {
        0
    };
    let expect = Layout {
        pad: min_pad,
        ..layout
    };
    let expect_pdu = match pdu {
        Pdu::Host(HostPdu::CapsuleCmd(c)) if c.data_len > 0 => Pdu::Host(HostPdu::CapsuleCmd(CapsuleCmd {
            data_offset: expect.data_offset(),
            ..c
        })),
        other => other,
    };
    match parse(role, rebuilt, conn) {
        Ok(Progress::Done((p, l))) => {
            assert_eq!((p, l), (expect_pdu, expect), "rebuilt {rebuilt:02x?}")
        }
        other => panic!("{pdu:?} rebuilt as {rebuilt:02x?} reads back as {other:?}"),
    }
    // Byte for byte, when the received padding was the smallest.
    if layout.pad == min_pad && b.len() >= n {
        let c = canonical(b, conn, t, layout, n);
        assert_eq!(
            rebuilt,
            &c[..],
            "{pdu:?}: rebuilt bytes differ from the received ones"
        );
    }
}

/// With header digests on, a flipped bit in the header or its digest is never accepted.
fn check_header_digest(role: Role, b: &[u8], conn: &ConnParams, layout: Layout) {
    if b[field::FLAGS] & Flags::HDGSTF.0 == 0 {
        return;
    }
    let len = layout.header_len as usize;
    let hlen = len - DIGEST_LEN;
    assert_eq!(
        le32(b, hlen),
        crc32c::crc32c(&b[..hlen]),
        "accepted with a wrong header digest"
    );
    let bit = crc32c::crc32c(&b[..len]) as usize % (len * 8);
    let mut flipped = b[..len].to_vec();
    flipped[bit / 8] ^= 1 << (bit % 8);
    let r = parse(role, &flipped, conn);
    assert!(
        !matches!(r, Ok(Progress::Done(_))),
        "bit {bit} flipped, still accepted: {r:?}"
    );
}

/// The data of a whole PDU.
fn data_of(whole: &[u8], layout: Layout) -> &[u8] {
    let at = layout.data_offset() as usize;
    &whole[at..at + layout.data_len as usize]
}

/// A data digest fed in pieces is CRC32C of the whole data.
fn check_data(whole: &[u8], layout: Layout) {
    assert_eq!(whole.len(), layout.plen() as usize);
    if !layout.data_digest {
        return;
    }
    let data = data_of(whole, layout);
    let mut d = DataDigest::new();
    let mut rest = data;
    let mut piece = 1;
    while !rest.is_empty() {
        let (a, r) = rest.split_at(piece.min(rest.len()));
        d.update(a);
        rest = r;
        piece = piece * 3 + 1;
    }
    let crc = crc32c::crc32c(data);
    assert_eq!((d.value(), d.len()), (crc, data.len() as u64));
    let end = whole.len();
    let ddgst: [u8; 4] = whole[end - DIGEST_LEN..].try_into().expect("4 bytes");
    assert_eq!(d.matches(ddgst), ddgst == crc.to_le_bytes());
    assert_eq!(d.to_wire(), crc.to_le_bytes());
}

/// The SQE of an accepted CapsuleCmd: it round-trips through the fabrics encoding, and its
/// in-capsule data (when the capsule arrived whole) holds what its SGL says, or the command is
/// refused.
fn check_sqe(c: &CapsuleCmd, icd: Option<&[u8]>) {
    let s = sqe_from_bytes(&c.sqe);
    assert_eq!(sqe_to_bytes(&s), c.sqe);
    let sgl = c.sgl();
    // The in-capsule data the capsule carries is the most an in-capsule SGL may describe.
    let (Ok(x), Some(icd)) = (data_xfer(&s, c.data_len), icd) else {
        return;
    };
    let slice = x.in_capsule_slice(icd);
    match x {
        DataXfer::InCapsule { offset, len } => {
            assert!(offset as u64 + len as u64 <= c.data_len as u64, "{x:?} {c:?}");
            assert_eq!(slice.map(<[u8]>::len), Ok(len as usize), "{x:?}");
        }
        _ => assert_eq!(slice, Ok(&[][..])),
    }
    // The transport's view of the SGL (PSDT 0, PRPs, is the runtime's to refuse) and the
    // fabrics layer's agree.
    let agree = match (x, sgl) {
        (_, _) if c.psdt() == 0 => true,
        (DataXfer::None, _) => true,
        (DataXfer::InCapsule { offset, len }, DataSgl::InCapsule { offset: o, len: l }) => {
            (o, l) == (offset as u64, len)
        }
        (DataXfer::FromHost { len } | DataXfer::ToHost { len }, DataSgl::Transport { len: l }) => l == len,
        _ => false,
    };
    assert!(agree, "data_xfer says {x:?}, CapsuleCmd::sgl says {sgl:?}");
}

/// Every error is typed, and the termination request that reports it is a valid PDU that
/// says the same.
fn check_error(role: Role, b: &[u8], conn: &ConnParams, e: &Error) {
    assert!(!e.to_string().is_empty() && !e.reason().to_string().is_empty());
    if e.fes().has_field_offset() {
        assert!((e.fei() as usize) < MAX_HEADER_LEN, "{e}");
    } else {
        assert_eq!(e.fei(), 0, "{e}");
    }
    assert!(
        (COMMON_HEADER_LEN..=TERM_REQ_MAX_QUOTE).contains(&e.quote_len()),
        "{e:?}"
    );
    let quoted = e.quoted(b);
    assert_eq!(quoted.len(), e.quote_len().min(b.len()));
    if !e.reply() {
        assert_eq!(
            b[field::TYPE],
            role.term_type() as u8,
            "only a termination request goes unanswered: {e}"
        );
    }
    if let Reason::HeaderDigest { received, computed } = e.reason() {
        assert_eq!(e.fes(), Fes::HeaderDigestError);
        let hlen = PduType::from_u8(b[field::TYPE]).expect("a known type").hlen() as usize;
        assert_eq!((received, computed), (le32(b, hlen), crc32c::crc32c(&b[..hlen])));
        assert_ne!(received, computed);
    }
    let mut out = [0u8; MAX_TX_HEADER_LEN];
    let n = match role {
        Role::Controller => pdu::c2h_term_req_for(&mut out, e, b),
        Role::Host => pdu::h2c_term_req(&mut out, e.fes(), e.fei(), quoted),
    }
    .unwrap_or_else(|x| panic!("no termination request for {e}: {x}"));
    assert_eq!(n, 24 + quoted.len());
    assert_eq!(&out[24..n], quoted);
    match parse(role.peer(), &out[..n], conn) {
        Ok(Progress::Done((Pdu::Host(HostPdu::H2cTermReq(t)) | Pdu::Ctrl(CtrlPdu::C2hTermReq(t)), l))) => {
            assert_eq!((t.fes, t.fei), (e.fes() as u16, e.fei()));
            assert_eq!(l.data_len as usize, quoted.len());
        }
        other => panic!("the termination request for {e} reads back as {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Rng;

    #[test]
    fn every_seed_is_read_whole() {
        for s in crate::seeds::pdu() {
            check_with(&s, false);
        }
    }

    #[test]
    fn mutated_seeds_keep_the_properties() {
        let seeds = crate::seeds::pdu();
        let mut rng = Rng::new(0x5eed);
        for _ in 0..20_000 {
            let s = &seeds[rng.below(seeds.len())];
            check_with(&rng.mutate(s), false);
        }
    }

    #[test]
    fn the_planted_crash_needs_its_cdw10() {
        let seed = crate::seeds::pdu_planted_example();
        check_with(&seed, false);
        let r = std::panic::catch_unwind(|| check_with(&seed, true));
        let msg = r.expect_err("the planted crash fires");
        let msg = msg.downcast_ref::<String>().expect("a formatted panic");
        assert!(msg.contains(PLANTED_MESSAGE), "{msg}");
        for s in crate::seeds::pdu() {
            check_with(&s, true);
        }
    }
}
