//! In-band authentication of hosts with DH-HMAC-CHAP (NVMe Base 2.0 §8.13, "NVMe in-band
//! authentication"; the Authentication Send and Authentication Receive Fabrics commands,
//! NVMe-oF 1.1 §6.2 and §6.3), as pure logic:
//!
//! - [`Secret`]: the `DHHC-1:hh:base64:` text form `nvme gen-dhchap-key` writes, its CRC and
//!   the key transformation with an NQN;
//! - [`HashId`], [`DhGroup`]: SHA-256/384/512 (RustCrypto's HMAC and SHA-2) and the null and
//!   RFC 7919 FFDHE groups (`num-bigint`'s modular exponentiation), and the responses R1, R2
//!   and the augmented challenge built from them;
//! - [`msg`]: the messages as bytes;
//! - [`Exchange`]: one queue's transaction as a state machine (Negotiate, Challenge, Reply,
//!   Success1, Success2, Failure1/2), for host and bidirectional (controller) authentication;
//! - [`Throttle`]: per-host back-off and warning rate limit after failures.
//!
//! Secure channel concatenation (a TLS PSK derived from the exchange, SC_C ≠ 0) is refused: it
//! needs NVMe/TCP TLS, which the target does not build.

mod dh;
mod exchange;
mod hash;
pub mod msg;
mod secret;
mod throttle;

#[cfg(test)]
mod tests;

pub use dh::{DhGroup, KeyPair};
pub use exchange::{Event, Exchange, HostAuth, OutOfSequence};
pub use hash::{augmented, HashId, Transcript};
pub use secret::{Secret, SecretError};
pub use throttle::{Throttle, MAX_BACKOFF, WARN_EVERY};

use vfpoll_nvme_spec::status::Status;

use crate::fabrics::Sqe;

/// SECP of DH-HMAC-CHAP in Authentication Send and Receive (NVMe-oF: the security protocol
/// E9h, "NVMe over Fabrics in-band authentication").
pub const SECP_DHCHAP: u8 = 0xe9;

/// Byte offsets of Authentication Send/Receive's fields in the SQE (for error locations).
pub mod cmd_off {
    /// SPSP0.
    pub const SPSP0: u16 = 41;
    /// SPSP1.
    pub const SPSP1: u16 = 42;
    /// SECP.
    pub const SECP: u16 = 43;
    /// TL (Send) or AL (Receive).
    pub const LEN: u16 = 44;
}

/// The length an Authentication Send (TL) or Receive (AL) command gives, once SECP E9h and
/// SPSP0/SPSP1 01h are checked (Invalid Field in Command otherwise, as Linux's target answers).
pub fn command_len(sqe: &Sqe) -> Result<u32, Status> {
    let [_, spsp0, spsp1, secp] = sqe.dw[10].to_le_bytes();
    if secp != SECP_DHCHAP || spsp0 != 1 || spsp1 != 1 || sqe.dw[11] == 0 {
        return Err(Status::INVALID_FIELD);
    }
    Ok(sqe.dw[11])
}

/// The random bytes of C1, S1 and DH private exponents: the operating system's generator.
pub fn os_random(buf: &mut [u8]) {
    getrandom::fill(buf).expect("the operating system's random number generator works");
}
