//! The authentication messages as bytes (NVMe Base 2.0 §8.13.4, the AUTH_Negotiate and
//! DH-HMAC-CHAP message figures; field names as the specification gives them). Parsers take
//! what a host sends with Authentication Send; builders make what the controller returns with
//! Authentication Receive. Multi-byte fields are little-endian.

use super::dh::DhGroup;
use super::hash::HashId;

/// AUTH-TYPE of AUTH_Negotiate and the failure messages.
pub const TYPE_COMMON: u8 = 0x00;
/// AUTH-TYPE of the DH-HMAC-CHAP messages.
pub const TYPE_DHCHAP: u8 = 0x01;

/// AUTH-ID of each message.
pub mod id {
    /// AUTH_Negotiate (common).
    pub const NEGOTIATE: u8 = 0x00;
    /// DH-HMAC-CHAP_Challenge.
    pub const CHALLENGE: u8 = 0x01;
    /// DH-HMAC-CHAP_Reply.
    pub const REPLY: u8 = 0x02;
    /// DH-HMAC-CHAP_Success1.
    pub const SUCCESS1: u8 = 0x03;
    /// DH-HMAC-CHAP_Success2.
    pub const SUCCESS2: u8 = 0x04;
    /// AUTH_Failure2 (common, host to controller).
    pub const FAILURE2: u8 = 0xf0;
    /// AUTH_Failure1 (common, controller to host).
    pub const FAILURE1: u8 = 0xf1;
}

/// The authentication protocol identifier of DH-HMAC-CHAP in a protocol descriptor (AUTHID).
pub const AUTHID_DHCHAP: u8 = 0x01;

/// Bytes of the header of AUTH_Negotiate, and of one protocol descriptor.
pub const NEGOTIATE_HEADER: usize = 8;
/// Bytes of one AUTH_Negotiate protocol descriptor.
pub const DESCRIPTOR: usize = 64;
/// Bytes of the fixed part of the Challenge, Reply and Success1 messages, and of Success2.
pub const HEADER: usize = 16;
/// Bytes of a failure message.
pub const FAILURE: usize = 8;

/// Reason code explanations of the failure messages (reason code 01h, "authentication
/// failure").
pub mod explanation {
    /// Authentication failed.
    pub const FAILED: u8 = 0x01;
    /// No usable authentication protocol.
    pub const PROTOCOL_UNUSABLE: u8 = 0x02;
    /// Secure channel concatenation mismatch.
    pub const CONCAT_MISMATCH: u8 = 0x03;
    /// Hash function not usable.
    pub const HASH_UNUSABLE: u8 = 0x04;
    /// DH group not usable.
    pub const DHGROUP_UNUSABLE: u8 = 0x05;
    /// Incorrect payload.
    pub const INCORRECT_PAYLOAD: u8 = 0x06;
    /// Incorrect protocol message.
    pub const INCORRECT_MESSAGE: u8 = 0x07;
}

/// Reason code of the failure messages: authentication failure.
pub const REASON_FAILED: u8 = 0x01;

/// AUTH_Negotiate: what the host offers in its DH-HMAC-CHAP protocol descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiate {
    /// Transaction identifier.
    pub t_id: u16,
    /// Secure channel concatenation (0: none).
    pub sc_c: u8,
    /// HashIDs offered, in the host's order (unknown ones kept).
    pub hashes: Vec<u8>,
    /// DHGIDs offered, in the host's order (unknown ones kept).
    pub groups: Vec<u8>,
}

/// DH-HMAC-CHAP_Reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// Transaction identifier.
    pub t_id: u16,
    /// The response R1 (HL bytes).
    pub response: Vec<u8>,
    /// The host's challenge C2 for the controller, when CVALID is set.
    pub challenge: Option<Vec<u8>>,
    /// SEQNUM: S2 (0 with no controller authentication).
    pub seqnum: u32,
    /// The host's DH value (empty with the null group).
    pub dh_value: Vec<u8>,
}

/// A message a host sends with Authentication Send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostMessage {
    /// AUTH_Negotiate.
    Negotiate(Negotiate),
    /// DH-HMAC-CHAP_Reply.
    Reply(Reply),
    /// DH-HMAC-CHAP_Success2.
    Success2 {
        /// Transaction identifier.
        t_id: u16,
    },
    /// AUTH_Failure2: the host refuses the controller.
    Failure2 {
        /// Transaction identifier.
        t_id: u16,
        /// Reason code explanation.
        explanation: u8,
    },
}

/// Why a message is refused, with the explanation code an AUTH_Failure1 carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed {
    /// The failure explanation ([`explanation`]).
    pub explanation: u8,
    /// What was wrong, for logs.
    pub why: &'static str,
}

fn malformed(explanation: u8, why: &'static str) -> Malformed {
    Malformed { explanation, why }
}

fn le16(d: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([d[at], d[at + 1]])
}

/// Parses what a host sent with Authentication Send (`data`: the TL bytes).
pub fn parse(data: &[u8]) -> Result<HostMessage, Malformed> {
    use explanation::{INCORRECT_MESSAGE, INCORRECT_PAYLOAD};
    if data.len() < FAILURE {
        return Err(malformed(INCORRECT_PAYLOAD, "shorter than any message"));
    }
    let t_id = le16(data, 4);
    match (data[0], data[1]) {
        (TYPE_COMMON, id::NEGOTIATE) => {
            let napd = data[7] as usize;
            if napd == 0 {
                return Err(malformed(
                    INCORRECT_PAYLOAD,
                    "AUTH_Negotiate offers no protocol (NAPD 0)",
                ));
            }
            if data.len() < NEGOTIATE_HEADER + napd * DESCRIPTOR {
                return Err(malformed(
                    INCORRECT_PAYLOAD,
                    "AUTH_Negotiate is shorter than its NAPD descriptors",
                ));
            }
            let d = data[NEGOTIATE_HEADER..NEGOTIATE_HEADER + napd * DESCRIPTOR]
                .chunks_exact(DESCRIPTOR)
                .find(|d| d[0] == AUTHID_DHCHAP)
                .ok_or(malformed(
                    explanation::PROTOCOL_UNUSABLE,
                    "AUTH_Negotiate offers no DH-HMAC-CHAP descriptor",
                ))?;
            let (halen, dhlen) = (d[2] as usize, d[3] as usize);
            if halen > 30 || dhlen > 30 {
                return Err(malformed(
                    INCORRECT_PAYLOAD,
                    "HALEN or DHLEN past the 30 identifiers each list holds",
                ));
            }
            Ok(HostMessage::Negotiate(Negotiate {
                t_id,
                sc_c: data[6],
                hashes: d[4..4 + halen].to_vec(),
                groups: d[34..34 + dhlen].to_vec(),
            }))
        }
        (TYPE_DHCHAP, id::REPLY) => {
            if data.len() < HEADER {
                return Err(malformed(
                    INCORRECT_PAYLOAD,
                    "DH-HMAC-CHAP_Reply shorter than its header",
                ));
            }
            let hl = data[6] as usize;
            let dhvlen = le16(data, 10) as usize;
            if hl == 0 || data.len() < HEADER + 2 * hl + dhvlen {
                return Err(malformed(
                    INCORRECT_PAYLOAD,
                    "DH-HMAC-CHAP_Reply shorter than HL and DHVLEN say",
                ));
            }
            let r = &data[HEADER..];
            Ok(HostMessage::Reply(Reply {
                t_id,
                response: r[..hl].to_vec(),
                challenge: (data[8] != 0).then(|| r[hl..2 * hl].to_vec()),
                seqnum: u32::from_le_bytes([data[12], data[13], data[14], data[15]]),
                dh_value: r[2 * hl..2 * hl + dhvlen].to_vec(),
            }))
        }
        (TYPE_DHCHAP, id::SUCCESS2) => Ok(HostMessage::Success2 { t_id }),
        (TYPE_COMMON, id::FAILURE2) => Ok(HostMessage::Failure2 {
            t_id,
            explanation: data[7],
        }),
        _ => Err(malformed(INCORRECT_MESSAGE, "not a message a host sends")),
    }
}

/// DH-HMAC-CHAP_Challenge: C1 (HL bytes), the hash, S1 and the controller's DH value.
pub fn challenge(
    t_id: u16,
    hash: HashId,
    seqnum: u32,
    c1: &[u8],
    group: DhGroup,
    dh_value: &[u8],
) -> Vec<u8> {
    let mut m = vec![0u8; HEADER];
    m[0] = TYPE_DHCHAP;
    m[1] = id::CHALLENGE;
    m[4..6].copy_from_slice(&t_id.to_le_bytes());
    m[6] = hash.len() as u8;
    m[8] = hash.id();
    m[9] = group.id();
    m[10..12].copy_from_slice(&(dh_value.len() as u16).to_le_bytes());
    m[12..16].copy_from_slice(&seqnum.to_le_bytes());
    m.extend_from_slice(c1);
    m.extend_from_slice(dh_value);
    m
}

/// DH-HMAC-CHAP_Success1: RVALID and the response R2 when the host asked for controller
/// authentication (the field is there, zero, when it did not).
pub fn success1(t_id: u16, hash: HashId, response: Option<&[u8]>) -> Vec<u8> {
    let mut m = vec![0u8; HEADER + hash.len()];
    m[0] = TYPE_DHCHAP;
    m[1] = id::SUCCESS1;
    m[4..6].copy_from_slice(&t_id.to_le_bytes());
    m[6] = hash.len() as u8;
    if let Some(r) = response {
        m[8] = 1;
        m[HEADER..].copy_from_slice(r);
    }
    m
}

/// AUTH_Failure1 with reason code 01h and `explanation`.
pub fn failure1(t_id: u16, explanation: u8) -> Vec<u8> {
    let mut m = vec![0u8; FAILURE];
    m[0] = TYPE_COMMON;
    m[1] = id::FAILURE1;
    m[4..6].copy_from_slice(&t_id.to_le_bytes());
    m[6] = REASON_FAILED;
    m[7] = explanation;
    m
}

/// The host's side of the messages, for tests and fuzzing: AUTH_Negotiate offering `hashes`
/// and `groups` as Linux's host builds it (one DH-HMAC-CHAP descriptor).
pub fn negotiate(t_id: u16, hashes: &[u8], groups: &[u8]) -> Vec<u8> {
    let mut m = vec![0u8; NEGOTIATE_HEADER + DESCRIPTOR];
    m[0] = TYPE_COMMON;
    m[1] = id::NEGOTIATE;
    m[4..6].copy_from_slice(&t_id.to_le_bytes());
    m[7] = 1;
    let d = &mut m[NEGOTIATE_HEADER..];
    d[0] = AUTHID_DHCHAP;
    d[2] = hashes.len().min(30) as u8;
    d[3] = groups.len().min(30) as u8;
    for (i, h) in hashes.iter().take(30).enumerate() {
        d[4 + i] = *h;
    }
    for (i, g) in groups.iter().take(30).enumerate() {
        d[34 + i] = *g;
    }
    m
}

/// DH-HMAC-CHAP_Reply as a host builds it: C2 present (zero when `challenge` is `None`).
pub fn reply(r: &Reply) -> Vec<u8> {
    let hl = r.response.len();
    let mut m = vec![0u8; HEADER];
    m[0] = TYPE_DHCHAP;
    m[1] = id::REPLY;
    m[4..6].copy_from_slice(&r.t_id.to_le_bytes());
    m[6] = hl as u8;
    m[8] = r.challenge.is_some() as u8;
    m[10..12].copy_from_slice(&(r.dh_value.len() as u16).to_le_bytes());
    m[12..16].copy_from_slice(&r.seqnum.to_le_bytes());
    m.extend_from_slice(&r.response);
    match &r.challenge {
        Some(c) => m.extend_from_slice(c),
        None => m.extend(std::iter::repeat_n(0, hl)),
    }
    m.extend_from_slice(&r.dh_value);
    m
}

/// DH-HMAC-CHAP_Success2 as a host builds it.
pub fn success2(t_id: u16) -> Vec<u8> {
    let mut m = vec![0u8; HEADER];
    m[0] = TYPE_DHCHAP;
    m[1] = id::SUCCESS2;
    m[4..6].copy_from_slice(&t_id.to_le_bytes());
    m
}

/// AUTH_Failure2 as a host builds it.
pub fn failure2(t_id: u16, explanation: u8) -> Vec<u8> {
    let mut m = failure1(t_id, explanation);
    m[1] = id::FAILURE2;
    m
}

impl HostMessage {
    /// Its transaction identifier.
    pub fn t_id(&self) -> u16 {
        match self {
            HostMessage::Negotiate(n) => n.t_id,
            HostMessage::Reply(r) => r.t_id,
            HostMessage::Success2 { t_id } | HostMessage::Failure2 { t_id, .. } => *t_id,
        }
    }
}
