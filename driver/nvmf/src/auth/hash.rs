//! The hash functions of DH-HMAC-CHAP (NVMe Base 2.0 §8.13.4.2, Figure 454 "Hash function
//! identifiers") and the values built with them: the response R1 a host sends, the response R2
//! a controller sends in bidirectional authentication, and the challenge augmented with the
//! session key of a Diffie-Hellman exchange (§8.13.4.4). HMAC and SHA-2 are RustCrypto's.

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256, Sha384, Sha512};

/// A hash function identifier (HashID) of DH-HMAC-CHAP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HashId {
    /// SHA-256 (01h).
    Sha256,
    /// SHA-384 (02h).
    Sha384,
    /// SHA-512 (03h).
    Sha512,
}

impl HashId {
    /// Every hash, by identifier.
    pub const ALL: [HashId; 3] = [HashId::Sha256, HashId::Sha384, HashId::Sha512];

    /// The hash of a HashID, if defined.
    pub fn from_id(id: u8) -> Option<Self> {
        match id {
            1 => Some(HashId::Sha256),
            2 => Some(HashId::Sha384),
            3 => Some(HashId::Sha512),
            _ => None,
        }
    }

    /// Its HashID.
    pub fn id(self) -> u8 {
        self as u8 + 1
    }

    /// The name `nvme-cli` and Linux use (`sha256`, ...).
    pub fn name(self) -> &'static str {
        match self {
            HashId::Sha256 => "sha256",
            HashId::Sha384 => "sha384",
            HashId::Sha512 => "sha512",
        }
    }

    /// The hash a name gives (`sha256`, `sha384`, `sha512`; `hmac(sha256)` too, as Linux's
    /// configfs writes it).
    pub fn from_name(name: &str) -> Option<Self> {
        let name = name
            .strip_prefix("hmac(")
            .and_then(|n| n.strip_suffix(')'))
            .unwrap_or(name);
        Self::ALL.into_iter().find(|h| h.name() == name)
    }

    /// Bytes of its output (HL).
    #[allow(clippy::len_without_is_empty)] // a length, never empty
    pub fn len(self) -> usize {
        match self {
            HashId::Sha256 => 32,
            HashId::Sha384 => 48,
            HashId::Sha512 => 64,
        }
    }

    /// H(data).
    pub fn digest(self, data: &[u8]) -> Vec<u8> {
        match self {
            HashId::Sha256 => Sha256::digest(data).to_vec(),
            HashId::Sha384 => Sha384::digest(data).to_vec(),
            HashId::Sha512 => Sha512::digest(data).to_vec(),
        }
    }

    /// HMAC-H(key, the parts one after the other).
    pub fn hmac(self, key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
        fn run<M: Mac + KeyInit>(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
            let mut m = <M as KeyInit>::new_from_slice(key).expect("HMAC takes keys of any length");
            for p in parts {
                m.update(p);
            }
            m.finalize().into_bytes().to_vec()
        }
        match self {
            HashId::Sha256 => run::<Hmac<Sha256>>(key, parts),
            HashId::Sha384 => run::<Hmac<Sha384>>(key, parts),
            HashId::Sha512 => run::<Hmac<Sha512>>(key, parts),
        }
    }
}

/// The challenge a response is computed over: C itself with the null group, else
/// HMAC-H(H(session key), C) (NVMe Base 2.0 §8.13.4.4, "augmented challenge").
pub fn augmented(hash: HashId, session_key: Option<&[u8]>, challenge: &[u8]) -> Vec<u8> {
    match session_key {
        None => challenge.to_vec(),
        Some(k) => hash.hmac(&hash.digest(k), &[challenge]),
    }
}

/// What both responses cover besides the challenge, in the order of NVMe Base 2.0 §8.13.4.4:
/// SEQNUM (4 bytes, little-endian), T_ID (2), the SC_C byte (0: no secure channel), a
/// role string, then two NQNs with a zero byte between them.
#[derive(Debug, Clone, Copy)]
pub struct Transcript<'a> {
    /// The hash negotiated.
    pub hash: HashId,
    /// The challenge, augmented already ([`augmented`]).
    pub challenge: &'a [u8],
    /// The sequence number sent with the challenge.
    pub seqnum: u32,
    /// The transaction identifier.
    pub t_id: u16,
    /// The host NQN.
    pub hostnqn: &'a str,
    /// The subsystem NQN.
    pub subnqn: &'a str,
}

impl Transcript<'_> {
    /// R1 = HMAC(Kh', C1' || S1 || T_ID || SC_C || "HostHost" || NQNh || 00h || NQNc), with the
    /// host's transformed key.
    pub fn host_response(&self, key: &[u8]) -> Vec<u8> {
        self.response(key, b"HostHost", self.hostnqn, self.subnqn)
    }

    /// R2 = HMAC(Kc', C2' || S2 || T_ID || SC_C || "Controller" || NQNc || 00h || NQNh), with the
    /// controller's transformed key.
    pub fn controller_response(&self, key: &[u8]) -> Vec<u8> {
        self.response(key, b"Controller", self.subnqn, self.hostnqn)
    }

    fn response(&self, key: &[u8], role: &[u8], first: &str, second: &str) -> Vec<u8> {
        self.hash.hmac(
            key,
            &[
                self.challenge,
                &self.seqnum.to_le_bytes(),
                &self.t_id.to_le_bytes(),
                &[0],
                role,
                first.as_bytes(),
                &[0],
                second.as_bytes(),
            ],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::tests::hex;

    /// RFC 4231 test case 2 (key "Jefe"), for each hash.
    #[test]
    fn hmac_matches_rfc_4231() {
        let (key, data) = (b"Jefe", b"what do ya want for nothing?");
        assert_eq!(
            HashId::Sha256.hmac(key, &[&data[..10], &data[10..]]),
            hex("5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
        );
        assert_eq!(
            HashId::Sha384.hmac(key, &[data]),
            hex("af45d2e376484031617f78d2b58a6b1b9c7ef464f5a01b47e42ec3736322445e8e2240ca5e69e2c78b3239ecfab21649")
        );
        assert_eq!(
            HashId::Sha512.hmac(key, &[data]),
            hex("164b7a7bfcf819e2e395fbe73b56e0a387bd64222e831fd610270cd7ea2505549758bf75c05a994a6d034f65f8f0e6fdcaeab1a34d4a6b4b636e070a38bce737")
        );
        for h in HashId::ALL {
            assert_eq!(h.hmac(b"k", &[b"x"]).len(), h.len());
            assert_eq!(h.digest(b"x").len(), h.len());
            assert_eq!(HashId::from_id(h.id()), Some(h));
            assert_eq!(HashId::from_name(h.name()), Some(h));
        }
        assert_eq!(HashId::from_name("hmac(sha384)"), Some(HashId::Sha384));
        assert_eq!(HashId::from_id(0), None);
        assert_eq!(HashId::from_id(4), None);
    }

    /// The responses, byte by byte as the specification lists the fields (written out here as
    /// one buffer, not through `response`).
    #[test]
    fn responses_cover_the_fields_in_order() {
        let t = Transcript {
            hash: HashId::Sha256,
            challenge: &[0xaa; 32],
            seqnum: 0x0102_0304,
            t_id: 0x0506,
            hostnqn: "nqn.h",
            subnqn: "nqn.s",
        };
        let mut msg = vec![0xaa; 32];
        msg.extend_from_slice(&[4, 3, 2, 1, 6, 5, 0]);
        msg.extend_from_slice(b"HostHostnqn.h\0nqn.s");
        assert_eq!(t.host_response(b"key"), HashId::Sha256.hmac(b"key", &[&msg]));
        let mut msg = vec![0xaa; 32];
        msg.extend_from_slice(&[4, 3, 2, 1, 6, 5, 0]);
        msg.extend_from_slice(b"Controllernqn.s\0nqn.h");
        assert_eq!(
            t.controller_response(b"key"),
            HashId::Sha256.hmac(b"key", &[&msg])
        );
        let sk = [7u8; 256];
        assert_eq!(
            augmented(HashId::Sha256, Some(&sk), &[1; 32]),
            HashId::Sha256.hmac(&HashId::Sha256.digest(&sk), &[&[1; 32]])
        );
        assert_eq!(augmented(HashId::Sha256, None, &[1; 32]), vec![1; 32]);
    }
}
