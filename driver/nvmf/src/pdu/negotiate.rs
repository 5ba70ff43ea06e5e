//! Connection initialization: the ICReq/ICResp exchange (NVMe/TCP 1.0c §3.6.2.2/§3.6.2.3) and
//! the parameters it fixes for the connection's life.

use super::{field, ConnParams, Error, Fes, IcReq, IcResp, Pda, PduType, Phase, Reason, MIN_MAXH2CDATA};

/// What the target offers every connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TargetLimits {
    maxh2cdata: u32,
    max_icd: u32,
}

/// A limit the Linux initiator (or the specification) would refuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LimitsError {
    /// MAXH2CDATA is too small or not a multiple of 4.
    #[error("MAXH2CDATA {0} must be a multiple of 4 and at least 4096 bytes (the Linux initiator drops the connection otherwise); the default is 131072")]
    MaxH2cData(u32),
}

impl TargetLimits {
    /// Default MAXH2CDATA: 128 KiB per H2CData PDU.
    pub const DEFAULT_MAXH2CDATA: u32 = 128 * 1024;
    /// Default in-capsule data limit for commands other than Fabrics commands: 8 KiB (a
    /// 4 KiB write fits; advertise IOCCSZ = (64 + this) / 16 on I/O queues).
    pub const DEFAULT_MAX_ICD: u32 = 8192;

    /// Limits with MAXH2CDATA `maxh2cdata` and at most `max_icd` bytes of in-capsule data per
    /// command (Fabrics commands may always carry [`FABRICS_MAX_ICD`](super::FABRICS_MAX_ICD)).
    pub const fn new(maxh2cdata: u32, max_icd: u32) -> Result<Self, LimitsError> {
        if !maxh2cdata.is_multiple_of(4) || maxh2cdata < MIN_MAXH2CDATA {
            return Err(LimitsError::MaxH2cData(maxh2cdata));
        }
        Ok(TargetLimits { maxh2cdata, max_icd })
    }

    /// MAXH2CDATA.
    pub const fn maxh2cdata(&self) -> u32 {
        self.maxh2cdata
    }

    /// The in-capsule data limit.
    pub const fn max_icd(&self) -> u32 {
        self.max_icd
    }
}

impl Default for TargetLimits {
    fn default() -> Self {
        TargetLimits {
            maxh2cdata: Self::DEFAULT_MAXH2CDATA,
            max_icd: Self::DEFAULT_MAX_ICD,
        }
    }
}

/// The controller's answer to an ICReq, and the connection it sets up.
///
/// - PFV: only 0 (NVMe/TCP 1.0) exists; another is an Unsupported Parameter at PFV.
/// - HPDA: 0 to 31; above is reserved (Invalid PDU Header Field at HPDA). The controller
///   honours it: [`c2h_data_header`](super::c2h_data_header) pads C2HData to it. Linux sends 0.
/// - CPDA: always 0 (no alignment of host data beyond dwords), the only value the Linux
///   initiator accepts.
/// - DGST: exactly what the host asked (the Linux initiator drops a connection whose ICResp
///   differs in either digest).
/// - MAXH2CDATA: the target's limit.
/// - MAXR2T: kept in [`ConnParams::max_r2ts`] (outstanding R2Ts per command the host accepts).
pub fn negotiate(req: &IcReq, limits: &TargetLimits) -> Result<(IcResp, ConnParams), Error> {
    let quote = PduType::IcReq.hlen() as usize;
    if req.pfv != 0 {
        return Err(Error::new(
            Fes::UnsupportedParameter,
            field::ICREQ_PFV,
            Reason::Pfv(req.pfv),
            quote,
        ));
    }
    let Some(hpda) = Pda::new(req.hpda) else {
        return Err(Error::field(field::ICREQ_HPDA, Reason::Hpda(req.hpda), quote));
    };
    let resp = IcResp {
        pfv: 0,
        cpda: 0,
        digests: req.digests,
        maxh2cdata: limits.maxh2cdata,
    };
    let params = ConnParams {
        phase: Phase::Ready,
        digests: req.digests,
        cpda: Pda::ZERO,
        hpda,
        maxh2cdata: limits.maxh2cdata,
        max_icd: limits.max_icd,
        max_r2ts: req.maxr2t.saturating_add(1),
    };
    Ok((resp, params))
}

/// The host's side: checks an ICResp against the ICReq it answers the way the Linux initiator
/// does (`nvme_tcp_init_connection`: PFV 0, digests mirrored, CPDA 0, MAXH2CDATA a multiple of
/// 4 and at least 4096; HLEN/PLEN 128 are checked by [`parse_c2h_header`](super::parse_c2h_header))
/// and gives the connection's parameters. For test clients, and to test [`negotiate`] against
/// the initiator's rules.
pub fn host_accept_ic_resp(req: &IcReq, resp: &IcResp) -> Result<ConnParams, Error> {
    let quote = PduType::IcResp.hlen() as usize;
    if resp.pfv != 0 {
        return Err(Error::new(
            Fes::UnsupportedParameter,
            field::ICRESP_PFV,
            Reason::Pfv(resp.pfv),
            quote,
        ));
    }
    if resp.cpda != 0 {
        return Err(Error::new(
            Fes::UnsupportedParameter,
            field::ICRESP_CPDA,
            Reason::Cpda(resp.cpda),
            quote,
        ));
    }
    if resp.digests != req.digests {
        return Err(Error::field(
            field::ICRESP_DGST,
            Reason::DigestsNotMirrored {
                asked: req.digests,
                got: resp.digests,
            },
            quote,
        ));
    }
    if !resp.maxh2cdata.is_multiple_of(4) || resp.maxh2cdata < MIN_MAXH2CDATA {
        return Err(Error::field(
            field::ICRESP_MAXH2CDATA,
            Reason::MaxH2cData(resp.maxh2cdata),
            quote,
        ));
    }
    Ok(ConnParams {
        phase: Phase::Ready,
        digests: resp.digests,
        cpda: Pda::ZERO,
        // A controller refuses a reserved HPDA before answering, so no ICResp follows one.
        hpda: Pda::new(req.hpda).unwrap_or(Pda::ZERO),
        maxh2cdata: resp.maxh2cdata,
        max_icd: u32::MAX,
        max_r2ts: req.maxr2t.saturating_add(1),
    })
}
