//! Host-to-controller data transfer: checking each H2CData against the R2T it answers
//! (NVMe/TCP 1.0c §3.6.2.8, §3.6.2.10).

use super::{Error, Fes, H2cData, PduType, R2t, Reason};

/// An outstanding R2T as the runtime tracks it, to check each H2CData against
/// ([`check_h2c_data`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct R2tWindow {
    /// The command's CID.
    pub cccid: u16,
    /// R2TO.
    pub r2to: u32,
    /// R2TL.
    pub r2tl: u32,
    /// Bytes received so far for this R2T.
    pub received: u32,
}

impl R2tWindow {
    /// A window for an R2T just sent.
    pub const fn new(r2t: &R2t) -> Self {
        R2tWindow {
            cccid: r2t.cccid,
            r2to: r2t.r2to,
            r2tl: r2t.r2tl,
            received: 0,
        }
    }

    /// True once all of R2TL has arrived.
    pub const fn is_complete(&self) -> bool {
        self.received >= self.r2tl
    }
}

/// Checks an H2CData against the R2T its TTAG names (the runtime looks the tag up and reports
/// an unknown one with [`Error::unknown_ttag`]); on success adds its data to
/// `window.received`. The data must belong to the R2T's command (else Invalid PDU Header Field
/// at CCCID), lie within R2TO..R2TO+R2TL (else Data Transfer Out of Range), continue where the
/// previous PDU ended and carry LAST_PDU exactly when it ends the R2T (else PDU Sequence
/// Error; §3.6.2.8).
pub fn check_h2c_data(data: &H2cData, window: &mut R2tWindow) -> Result<(), Error> {
    let quote = PduType::H2cData.hlen() as usize;
    if data.cccid != window.cccid {
        return Err(Error::unknown_cccid(PduType::H2cData, data.cccid));
    }
    let end = data.datao as u64 + data.datal as u64;
    let window_end = window.r2to as u64 + window.r2tl as u64;
    if data.datao < window.r2to || end > window_end {
        let reason = Reason::OutOfRange {
            datao: data.datao,
            datal: data.datal,
            r2to: window.r2to,
            r2tl: window.r2tl,
        };
        return Err(Error::new(Fes::DataOutOfRange, 0, reason, quote));
    }
    let expected = window.r2to as u64 + window.received as u64;
    if data.datao as u64 != expected {
        let reason = Reason::OutOfOrder {
            datao: data.datao,
            expected,
        };
        return Err(Error::new(Fes::PduSequenceError, 0, reason, quote));
    }
    let ends = end == window_end;
    if data.last != ends {
        return Err(Error::new(
            Fes::PduSequenceError,
            0,
            Reason::LastPdu {
                last: data.last,
                ends,
            },
            quote,
        ));
    }
    // Within the window, so the sum fits R2TL.
    window.received += data.datal;
    Ok(())
}
