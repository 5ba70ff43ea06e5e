//! DH-HMAC-CHAP secrets in the text form `nvme gen-dhchap-key` writes and Linux's host and
//! target read (NVMe Base 2.0 §8.13.4.3, "DH-HMAC-CHAP secret representation"):
//!
//! ```text
//! DHHC-1:<hh>:<base64 of the key followed by its CRC-32, little-endian>:
//! ```
//!
//! `hh` is the hash of the key transformation: `00` none (the key is used as it is), `01`
//! SHA-256, `02` SHA-384, `03` SHA-512, each turning the key into
//! HMAC-H(key, NQN || "NVMe-over-Fabrics") with the NQN of the side that owns the key (the
//! host's NQN for a host secret, the subsystem's for a controller secret). The key has 32, 48
//! or 64 bytes; the CRC-32 is the IEEE one (zlib's).

use std::fmt;

use base64::Engine;

use super::hash::HashId;

/// Why a secret's text is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// Not `DHHC-1:hh:...:`.
    #[error("not a DH-HMAC-CHAP secret: expected DHHC-1:<00|01|02|03>:<base64>: as `nvme gen-dhchap-key` writes it")]
    Format,
    /// The transformation hash is not 00 to 03.
    #[error("DHHC-1 secret: transformation hash {0:?} is not 00 (none), 01 (SHA-256), 02 (SHA-384) or 03 (SHA-512)")]
    Transform(String),
    /// The base64 part does not decode.
    #[error("DHHC-1 secret: the key is not valid base64 ({0})")]
    Base64(String),
    /// The key is not 32, 48 or 64 bytes.
    #[error("DHHC-1 secret: the key has {0} bytes; it must have 32, 48 or 64 (`nvme gen-dhchap-key --key-length`)")]
    Length(usize),
    /// The CRC-32 does not match the key.
    #[error("DHHC-1 secret: the CRC-32 at its end does not match the key (the secret was mistyped or cut); copy it again")]
    Crc,
}

/// A DH-HMAC-CHAP secret. Its `Debug` shows no key bytes, and there is no `Display`: the key
/// never reaches a log.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    transform: Option<HashId>,
    key: Vec<u8>,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secret")
            .field("transform", &self.transform)
            .field("key_len", &self.key.len())
            .finish()
    }
}

impl Secret {
    /// Parses the `DHHC-1:...` text (surrounding whitespace ignored).
    pub fn parse(text: &str) -> Result<Secret, SecretError> {
        let body = text.trim().strip_prefix("DHHC-1:").ok_or(SecretError::Format)?;
        let (hh, rest) = body.split_once(':').ok_or(SecretError::Format)?;
        let b64 = rest.strip_suffix(':').ok_or(SecretError::Format)?;
        let transform = match hh {
            "00" => None,
            "01" | "02" | "03" => HashId::from_id(hh.as_bytes()[1] - b'0'),
            _ => return Err(SecretError::Transform(hh.to_owned())),
        };
        let raw = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| SecretError::Base64(e.to_string()))?;
        let key_len = raw.len().saturating_sub(4);
        if ![32, 48, 64].contains(&key_len) {
            return Err(SecretError::Length(key_len));
        }
        let (key, crc) = raw.split_at(key_len);
        if crc32fast::hash(key).to_le_bytes() != crc {
            return Err(SecretError::Crc);
        }
        Ok(Secret {
            transform,
            key: key.to_vec(),
        })
    }

    /// The secret as `DHHC-1` text (what `nvme gen-dhchap-key` prints).
    pub fn to_text(&self) -> String {
        let mut raw = self.key.clone();
        raw.extend_from_slice(&crc32fast::hash(&self.key).to_le_bytes());
        format!(
            "DHHC-1:{:02x}:{}:",
            self.transform.map_or(0, HashId::id),
            base64::engine::general_purpose::STANDARD.encode(raw)
        )
    }

    /// A secret from its parts (`key` of 32, 48 or 64 bytes).
    pub fn new(transform: Option<HashId>, key: &[u8]) -> Result<Secret, SecretError> {
        if ![32, 48, 64].contains(&key.len()) {
            return Err(SecretError::Length(key.len()));
        }
        Ok(Secret {
            transform,
            key: key.to_vec(),
        })
    }

    /// The transformation hash (`None`: 00).
    pub fn transform(&self) -> Option<HashId> {
        self.transform
    }

    /// The key an HMAC response is keyed with: the key itself, or
    /// HMAC-H(key, `nqn` || "NVMe-over-Fabrics") with the transformation hash H.
    pub fn transformed(&self, nqn: &str) -> Vec<u8> {
        match self.transform {
            None => self.key.clone(),
            Some(h) => h.hmac(&self.key, &[nqn.as_bytes(), b"NVMe-over-Fabrics"]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::tests::hex;

    const NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf6";

    /// Secrets built as `nvme gen-dhchap-key` builds them (base64 of key || CRC-32 LE), by
    /// Python's base64 and zlib.crc32, and their transformed keys by Python's hmac.
    #[test]
    fn parses_gen_dhchap_key_text_and_transforms_as_the_spec_says() {
        let k32: Vec<u8> = (0..32).collect();
        let s = Secret::parse("DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:").unwrap();
        assert_eq!(s.transform(), None);
        assert_eq!(s.transformed(NQN), k32);
        let s = Secret::parse(" DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:\n").unwrap();
        assert_eq!(s.transform(), Some(HashId::Sha256));
        assert_eq!(
            s.transformed(NQN),
            hex("8d688ad0d792c1e423185108f5ce1b8c757bf763711bf2901b59807c24008919")
        );
        let s = Secret::parse(
            "DHHC-1:02:ZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXp7fH1+f4CBgoOEhYaHiImKi4yNjo+QkZKTvGwQfg==:",
        )
        .unwrap();
        assert_eq!(
            s.transformed(NQN),
            hex("fe784a627fcf210d99a35796289deeec72dff0f0c4fd16c98222f97c125d1f1631d6408094dda2f784d5925f53f4fc42")
        );
        let text = "DHHC-1:03:AAcOFRwjKjE4P0ZNVFtiaXB3foWMk5qhqK+2vcTL0tng5+71/AMKERgfJi00O0JJUFdeZWxzeoGIj5adpKuyudSnJNM=:";
        let s = Secret::parse(text).unwrap();
        assert_eq!(
            s.transformed(NQN),
            hex("f6801f2a87588b7114157f95f0baececedc3909bb95eb221d1bffbe7b531ffa558036030560e8a05c665a0a064749cf69aa37592d1e0129872101e06f5e7b971")
        );
        assert_eq!(s.to_text(), text);
        assert!(!format!("{s:?}").contains("AAcO"));
    }

    /// What nvme-cli 2.3 (libnvme 1.3) printed for `nvme gen-dhchap-key --secret=000102...1f
    /// --hmac=N --nqn NQN`: with hmac 0 the key as given, with hmac 1 the key already through
    /// HMAC-SHA-256 with the NQN (libnvme's `nvme_gen_dhchap_key`), which is exactly what this
    /// crate's transformation of the hmac-0 key gives.
    #[test]
    fn parses_nvme_cli_output() {
        let k32: Vec<u8> = (0..32).collect();
        let raw = Secret::parse("DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:").unwrap();
        assert_eq!(raw.key, k32);
        let cli = Secret::parse("DHHC-1:01:jWiK0NeSweQjGFEI9c4bjHV792NxG/KQG1mAfCQAiRlmCljm:").unwrap();
        assert_eq!(cli.transform(), Some(HashId::Sha256));
        assert_eq!(
            cli.key,
            Secret::new(Some(HashId::Sha256), &k32).unwrap().transformed(NQN)
        );
        let s48 = Secret::parse(
            "DHHC-1:02:M0rYNyCyvVmVHDHPqyN1ArhAN83V3IGRVt4sIqz7Y1Mtn38Lich0i9dVYTnM1E7s9DtwRQ==:",
        )
        .unwrap();
        let k48: Vec<u8> = (0..48).collect();
        assert_eq!(
            s48.key,
            HashId::Sha384.hmac(&k48, &[b"nqn.2024-01.io.vfpoll:auth", b"NVMe-over-Fabrics"])
        );
    }

    #[test]
    fn refuses_malformed_secrets_with_the_reason() {
        let good = "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
        assert_eq!(Secret::parse("DHHC-2:00:AA==:"), Err(SecretError::Format));
        assert_eq!(Secret::parse(&good[..good.len() - 1]), Err(SecretError::Format));
        assert_eq!(
            Secret::parse(&good.replace(":00:", ":04:")),
            Err(SecretError::Transform("04".into()))
        );
        assert!(matches!(
            Secret::parse(&good.replace("AAEC", "A*EC")),
            Err(SecretError::Base64(_))
        ));
        // One bit of the key changed: the CRC catches it.
        assert_eq!(
            Secret::parse(&good.replace("AAEC", "AAED")),
            Err(SecretError::Crc)
        );
        assert_eq!(
            Secret::parse("DHHC-1:00:AAECAwQFBgcICQoLDA0ODw==:"),
            Err(SecretError::Length(12))
        );
        assert_eq!(Secret::new(None, &[0; 31]), Err(SecretError::Length(31)));
    }
}
