//! The Diffie-Hellman groups of DH-HMAC-CHAP (NVMe Base 2.0 §8.13.4.2, Figure 455 "DH group
//! identifiers"): the null group (no exchange) and the RFC 7919 finite-field groups ffdhe2048 to
//! ffdhe8192, generator 2. Modular exponentiation is `num-bigint`'s.
//!
//! Values travel as big-endian numbers exactly as long as the prime (leading zeros kept), as
//! Linux's `dh` KPP writes them (`mpi_write_to_sgl` pads to the buffer) on both the host and
//! its target, so the session key a host and this target derive is the same byte string.

use std::sync::OnceLock;

use num_bigint::BigUint;

/// Bits of a private exponent: RFC 7919 §5.2 asks at least twice the group's security level
/// (225 bits for ffdhe2048 up to 400 for ffdhe8192); 512 covers every group.
const PRIVATE_BITS: usize = 512;

/// A DH group identifier (DHGID) of DH-HMAC-CHAP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DhGroup {
    /// No Diffie-Hellman exchange (00h): the challenge is not augmented.
    Null,
    /// ffdhe2048 (01h).
    Ffdhe2048,
    /// ffdhe3072 (02h).
    Ffdhe3072,
    /// ffdhe4096 (03h).
    Ffdhe4096,
    /// ffdhe6144 (04h).
    Ffdhe6144,
    /// ffdhe8192 (05h).
    Ffdhe8192,
}

impl DhGroup {
    /// Every group, by identifier.
    pub const ALL: [DhGroup; 6] = [
        DhGroup::Null,
        DhGroup::Ffdhe2048,
        DhGroup::Ffdhe3072,
        DhGroup::Ffdhe4096,
        DhGroup::Ffdhe6144,
        DhGroup::Ffdhe8192,
    ];

    /// The group of a DHGID, if defined.
    pub fn from_id(id: u8) -> Option<Self> {
        Self::ALL.get(id as usize).copied()
    }

    /// Its DHGID.
    pub fn id(self) -> u8 {
        self as u8
    }

    /// The name `nvme-cli` and Linux use (`null`, `ffdhe2048`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DhGroup::Null => "null",
            DhGroup::Ffdhe2048 => "ffdhe2048",
            DhGroup::Ffdhe3072 => "ffdhe3072",
            DhGroup::Ffdhe4096 => "ffdhe4096",
            DhGroup::Ffdhe6144 => "ffdhe6144",
            DhGroup::Ffdhe8192 => "ffdhe8192",
        }
    }

    /// The group a name gives.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|g| g.name() == name)
    }

    /// Bytes of a DH value (the prime's length; 0 for the null group).
    pub fn value_len(self) -> usize {
        self.prime().map_or(0, |p| p.bits().div_ceil(8) as usize)
    }

    /// The prime p, none for the null group.
    pub fn prime(self) -> Option<&'static BigUint> {
        static PRIMES: [OnceLock<BigUint>; 5] = [const { OnceLock::new() }; 5];
        let (i, hex) = match self {
            DhGroup::Null => return None,
            DhGroup::Ffdhe2048 => (0, FFDHE2048),
            DhGroup::Ffdhe3072 => (1, FFDHE3072),
            DhGroup::Ffdhe4096 => (2, FFDHE4096),
            DhGroup::Ffdhe6144 => (3, FFDHE6144),
            DhGroup::Ffdhe8192 => (4, FFDHE8192),
        };
        Some(PRIMES[i].get_or_init(|| {
            BigUint::parse_bytes(hex.concat().as_bytes(), 16).expect("the RFC 7919 primes are hexadecimal")
        }))
    }
}

/// One side's ephemeral key pair in a group other than null.
pub struct KeyPair {
    group: DhGroup,
    private: BigUint,
    /// g^x mod p, `value_len` bytes, big-endian.
    public: Vec<u8>,
}

impl std::fmt::Debug for KeyPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyPair")
            .field("group", &self.group)
            .field("private", &"(hidden)")
            .finish()
    }
}

impl KeyPair {
    /// A key pair from `PRIVATE_BITS / 8` random bytes (`None` for the null group).
    pub fn generate(group: DhGroup, random: &mut dyn FnMut(&mut [u8])) -> Option<KeyPair> {
        let p = group.prime()?;
        let mut x = [0u8; PRIVATE_BITS / 8];
        random(&mut x);
        // 1 < x: the top bit set keeps the exponent at full length.
        x[0] |= 0x80;
        let private = BigUint::from_bytes_be(&x);
        let public = pad(&BigUint::from(2u32).modpow(&private, p), group.value_len());
        Some(KeyPair {
            group,
            private,
            public,
        })
    }

    /// The public value to send.
    pub fn public(&self) -> &[u8] {
        &self.public
    }

    /// The shared secret (the session key) from the peer's public value, or why that value is
    /// refused: not exactly the prime's length, or outside 1 < y < p - 1 (RFC 7919 §5.1: with
    /// a safe prime this check is enough to keep off small subgroups).
    pub fn shared(&self, peer: &[u8]) -> Result<Vec<u8>, &'static str> {
        let len = self.group.value_len();
        if peer.len() != len {
            return Err("the DH value is not as long as the group's prime");
        }
        let p = self.group.prime().expect("not the null group");
        let y = BigUint::from_bytes_be(peer);
        let one = BigUint::from(1u32);
        if y <= one || y >= p - &one {
            return Err("the DH value is outside 1 < y < p - 1");
        }
        Ok(pad(&y.modpow(&self.private, p), len))
    }
}

/// `v` as `len` big-endian bytes (v < 2^(8 len)).
fn pad(v: &BigUint, len: usize) -> Vec<u8> {
    let b = v.to_bytes_be();
    let mut out = vec![0u8; len - b.len()];
    out.extend_from_slice(&b);
    out
}

/// ffdhe2048's prime p (RFC 7919 Appendix A.1), in hexadecimal, 96 digits a line.
const FFDHE2048: &[&str] = &[
    "FFFFFFFFFFFFFFFFADF85458A2BB4A9AAFDC5620273D3CF1D8B9C583CE2D3695A9E13641146433FBCC939DCE249B3EF9",
    "7D2FE363630C75D8F681B202AEC4617AD3DF1ED5D5FD65612433F51F5F066ED0856365553DED1AF3B557135E7F57C935",
    "984F0C70E0E68B77E2A689DAF3EFE8721DF158A136ADE73530ACCA4F483A797ABC0AB182B324FB61D108A94BB2C8E3FB",
    "B96ADAB760D7F4681D4F42A3DE394DF4AE56EDE76372BB190B07A7C8EE0A6D709E02FCE1CDF7E2ECC03404CD28342F61",
    "9172FE9CE98583FF8E4F1232EEF28183C3FE3B1B4C6FAD733BB5FCBC2EC22005C58EF1837D1683B2C6F34A26C1B2EFFA",
    "886B423861285C97FFFFFFFFFFFFFFFF",
];

/// ffdhe3072's prime p (RFC 7919 Appendix A.2), in hexadecimal, 96 digits a line.
const FFDHE3072: &[&str] = &[
    "FFFFFFFFFFFFFFFFADF85458A2BB4A9AAFDC5620273D3CF1D8B9C583CE2D3695A9E13641146433FBCC939DCE249B3EF9",
    "7D2FE363630C75D8F681B202AEC4617AD3DF1ED5D5FD65612433F51F5F066ED0856365553DED1AF3B557135E7F57C935",
    "984F0C70E0E68B77E2A689DAF3EFE8721DF158A136ADE73530ACCA4F483A797ABC0AB182B324FB61D108A94BB2C8E3FB",
    "B96ADAB760D7F4681D4F42A3DE394DF4AE56EDE76372BB190B07A7C8EE0A6D709E02FCE1CDF7E2ECC03404CD28342F61",
    "9172FE9CE98583FF8E4F1232EEF28183C3FE3B1B4C6FAD733BB5FCBC2EC22005C58EF1837D1683B2C6F34A26C1B2EFFA",
    "886B4238611FCFDCDE355B3B6519035BBC34F4DEF99C023861B46FC9D6E6C9077AD91D2691F7F7EE598CB0FAC186D91C",
    "AEFE130985139270B4130C93BC437944F4FD4452E2D74DD364F2E21E71F54BFF5CAE82AB9C9DF69EE86D2BC522363A0D",
    "ABC521979B0DEADA1DBF9A42D5C4484E0ABCD06BFA53DDEF3C1B20EE3FD59D7C25E41D2B66C62E37FFFFFFFFFFFFFFFF",
];

/// ffdhe4096's prime p (RFC 7919 Appendix A.3), in hexadecimal, 96 digits a line.
const FFDHE4096: &[&str] = &[
    "FFFFFFFFFFFFFFFFADF85458A2BB4A9AAFDC5620273D3CF1D8B9C583CE2D3695A9E13641146433FBCC939DCE249B3EF9",
    "7D2FE363630C75D8F681B202AEC4617AD3DF1ED5D5FD65612433F51F5F066ED0856365553DED1AF3B557135E7F57C935",
    "984F0C70E0E68B77E2A689DAF3EFE8721DF158A136ADE73530ACCA4F483A797ABC0AB182B324FB61D108A94BB2C8E3FB",
    "B96ADAB760D7F4681D4F42A3DE394DF4AE56EDE76372BB190B07A7C8EE0A6D709E02FCE1CDF7E2ECC03404CD28342F61",
    "9172FE9CE98583FF8E4F1232EEF28183C3FE3B1B4C6FAD733BB5FCBC2EC22005C58EF1837D1683B2C6F34A26C1B2EFFA",
    "886B4238611FCFDCDE355B3B6519035BBC34F4DEF99C023861B46FC9D6E6C9077AD91D2691F7F7EE598CB0FAC186D91C",
    "AEFE130985139270B4130C93BC437944F4FD4452E2D74DD364F2E21E71F54BFF5CAE82AB9C9DF69EE86D2BC522363A0D",
    "ABC521979B0DEADA1DBF9A42D5C4484E0ABCD06BFA53DDEF3C1B20EE3FD59D7C25E41D2B669E1EF16E6F52C3164DF4FB",
    "7930E9E4E58857B6AC7D5F42D69F6D187763CF1D5503400487F55BA57E31CC7A7135C886EFB4318AED6A1E012D9E6832",
    "A907600A918130C46DC778F971AD0038092999A333CB8B7A1A1DB93D7140003C2A4ECEA9F98D0ACC0A8291CDCEC97DCF",
    "8EC9B55A7F88A46B4DB5A851F44182E1C68A007E5E655F6AFFFFFFFFFFFFFFFF",
];

/// ffdhe6144's prime p (RFC 7919 Appendix A.4), in hexadecimal, 96 digits a line.
const FFDHE6144: &[&str] = &[
    "FFFFFFFFFFFFFFFFADF85458A2BB4A9AAFDC5620273D3CF1D8B9C583CE2D3695A9E13641146433FBCC939DCE249B3EF9",
    "7D2FE363630C75D8F681B202AEC4617AD3DF1ED5D5FD65612433F51F5F066ED0856365553DED1AF3B557135E7F57C935",
    "984F0C70E0E68B77E2A689DAF3EFE8721DF158A136ADE73530ACCA4F483A797ABC0AB182B324FB61D108A94BB2C8E3FB",
    "B96ADAB760D7F4681D4F42A3DE394DF4AE56EDE76372BB190B07A7C8EE0A6D709E02FCE1CDF7E2ECC03404CD28342F61",
    "9172FE9CE98583FF8E4F1232EEF28183C3FE3B1B4C6FAD733BB5FCBC2EC22005C58EF1837D1683B2C6F34A26C1B2EFFA",
    "886B4238611FCFDCDE355B3B6519035BBC34F4DEF99C023861B46FC9D6E6C9077AD91D2691F7F7EE598CB0FAC186D91C",
    "AEFE130985139270B4130C93BC437944F4FD4452E2D74DD364F2E21E71F54BFF5CAE82AB9C9DF69EE86D2BC522363A0D",
    "ABC521979B0DEADA1DBF9A42D5C4484E0ABCD06BFA53DDEF3C1B20EE3FD59D7C25E41D2B669E1EF16E6F52C3164DF4FB",
    "7930E9E4E58857B6AC7D5F42D69F6D187763CF1D5503400487F55BA57E31CC7A7135C886EFB4318AED6A1E012D9E6832",
    "A907600A918130C46DC778F971AD0038092999A333CB8B7A1A1DB93D7140003C2A4ECEA9F98D0ACC0A8291CDCEC97DCF",
    "8EC9B55A7F88A46B4DB5A851F44182E1C68A007E5E0DD9020BFD64B645036C7A4E677D2C38532A3A23BA4442CAF53EA6",
    "3BB454329B7624C8917BDD64B1C0FD4CB38E8C334C701C3ACDAD0657FCCFEC719B1F5C3E4E46041F388147FB4CFDB477",
    "A52471F7A9A96910B855322EDB6340D8A00EF092350511E30ABEC1FFF9E3A26E7FB29F8C183023C3587E38DA0077D9B4",
    "763E4E4B94B2BBC194C6651E77CAF992EEAAC0232A281BF6B3A739C1226116820AE8DB5847A67CBEF9C9091B462D538C",
    "D72B03746AE77F5E62292C311562A846505DC82DB854338AE49F5235C95B91178CCF2DD5CACEF403EC9D1810C6272B04",
    "5B3B71F9DC6B80D63FDD4A8E9ADB1E6962A69526D43161C1A41D570D7938DAD4A40E329CD0E40E65FFFFFFFFFFFFFFFF",
];

/// ffdhe8192's prime p (RFC 7919 Appendix A.5), in hexadecimal, 96 digits a line.
const FFDHE8192: &[&str] = &[
    "FFFFFFFFFFFFFFFFADF85458A2BB4A9AAFDC5620273D3CF1D8B9C583CE2D3695A9E13641146433FBCC939DCE249B3EF9",
    "7D2FE363630C75D8F681B202AEC4617AD3DF1ED5D5FD65612433F51F5F066ED0856365553DED1AF3B557135E7F57C935",
    "984F0C70E0E68B77E2A689DAF3EFE8721DF158A136ADE73530ACCA4F483A797ABC0AB182B324FB61D108A94BB2C8E3FB",
    "B96ADAB760D7F4681D4F42A3DE394DF4AE56EDE76372BB190B07A7C8EE0A6D709E02FCE1CDF7E2ECC03404CD28342F61",
    "9172FE9CE98583FF8E4F1232EEF28183C3FE3B1B4C6FAD733BB5FCBC2EC22005C58EF1837D1683B2C6F34A26C1B2EFFA",
    "886B4238611FCFDCDE355B3B6519035BBC34F4DEF99C023861B46FC9D6E6C9077AD91D2691F7F7EE598CB0FAC186D91C",
    "AEFE130985139270B4130C93BC437944F4FD4452E2D74DD364F2E21E71F54BFF5CAE82AB9C9DF69EE86D2BC522363A0D",
    "ABC521979B0DEADA1DBF9A42D5C4484E0ABCD06BFA53DDEF3C1B20EE3FD59D7C25E41D2B669E1EF16E6F52C3164DF4FB",
    "7930E9E4E58857B6AC7D5F42D69F6D187763CF1D5503400487F55BA57E31CC7A7135C886EFB4318AED6A1E012D9E6832",
    "A907600A918130C46DC778F971AD0038092999A333CB8B7A1A1DB93D7140003C2A4ECEA9F98D0ACC0A8291CDCEC97DCF",
    "8EC9B55A7F88A46B4DB5A851F44182E1C68A007E5E0DD9020BFD64B645036C7A4E677D2C38532A3A23BA4442CAF53EA6",
    "3BB454329B7624C8917BDD64B1C0FD4CB38E8C334C701C3ACDAD0657FCCFEC719B1F5C3E4E46041F388147FB4CFDB477",
    "A52471F7A9A96910B855322EDB6340D8A00EF092350511E30ABEC1FFF9E3A26E7FB29F8C183023C3587E38DA0077D9B4",
    "763E4E4B94B2BBC194C6651E77CAF992EEAAC0232A281BF6B3A739C1226116820AE8DB5847A67CBEF9C9091B462D538C",
    "D72B03746AE77F5E62292C311562A846505DC82DB854338AE49F5235C95B91178CCF2DD5CACEF403EC9D1810C6272B04",
    "5B3B71F9DC6B80D63FDD4A8E9ADB1E6962A69526D43161C1A41D570D7938DAD4A40E329CCFF46AAA36AD004CF600C838",
    "1E425A31D951AE64FDB23FCEC9509D43687FEB69EDD1CC5E0B8CC3BDF64B10EF86B63142A3AB8829555B2F747C932665",
    "CB2C0F1CC01BD70229388839D2AF05E454504AC78B7582822846C0BA35C35F5C59160CC046FD8251541FC68C9C86B022",
    "BB7099876A460E7451A8A93109703FEE1C217E6C3826E52C51AA691E0E423CFC99E9E31650C1217B624816CDAD9A95F9",
    "D5B8019488D9C0A0A1FE3075A577E23183F81D4A3F2FA4571EFC8CE0BA8A4FE8B6855DFE72B0A66EDED2FBABFBE58A30",
    "FAFABE1C5D71A87E2F741EF8C1FE86FEA6BBFDE530677F0D97D11D49F7A8443D0822E506A9F4614E011E2A94838FF88C",
    "D68C8BB7C5C6424CFFFFFFFFFFFFFFFF",
];

#[cfg(test)]
mod tests {
    use super::*;

    /// floor(e · 2^bits), from the series Σ 1/k! in fixed point with 64 guard bits.
    fn e_fixed(bits: usize) -> BigUint {
        let one = BigUint::from(1u32) << (bits + 64);
        let (mut sum, mut term, mut k) = (BigUint::from(0u32), one, 0u32);
        while term != BigUint::from(0u32) {
            sum += &term;
            k += 1;
            term /= k;
        }
        sum >> 64
    }

    /// RFC 7919 §A: p = 2^b - 2^{b-64} + {[2^{b-130} e] + X} · 2^64 - 1, with the constant X of
    /// each group. The stored primes (as OpenSSL's ffdhe groups carry them) are that.
    #[test]
    fn primes_follow_the_rfc_7919_construction() {
        let x = [560316u64, 2625351, 5736041, 15705020, 10965728];
        for (i, g) in DhGroup::ALL[1..].iter().enumerate() {
            let b = [2048usize, 3072, 4096, 6144, 8192][i];
            let two = BigUint::from(2u32);
            let p = two.pow(b as u32) - two.pow(b as u32 - 64)
                + (e_fixed(b - 130) + BigUint::from(x[i])) * two.pow(64)
                - BigUint::from(1u32);
            assert_eq!(g.prime(), Some(&p), "{}", g.name());
            assert_eq!(g.value_len() * 8, b);
        }
        assert_eq!(DhGroup::Null.value_len(), 0);
    }

    #[test]
    fn ids_and_names_round_trip() {
        for g in DhGroup::ALL {
            assert_eq!(DhGroup::from_id(g.id()), Some(g));
            assert_eq!(DhGroup::from_name(g.name()), Some(g));
        }
        assert_eq!(DhGroup::from_id(6), None);
        assert_eq!(DhGroup::from_name("ffdhe1024"), None);
    }

    #[test]
    fn both_sides_derive_one_padded_secret_and_bad_values_are_refused() {
        let mut n = 0u8;
        let mut rng = |b: &mut [u8]| {
            for x in b {
                n = n.wrapping_mul(31).wrapping_add(7);
                *x = n;
            }
        };
        let a = KeyPair::generate(DhGroup::Ffdhe2048, &mut rng).unwrap();
        let b = KeyPair::generate(DhGroup::Ffdhe2048, &mut rng).unwrap();
        assert_eq!(a.public().len(), 256);
        let s = a.shared(b.public()).unwrap();
        assert_eq!(s, b.shared(a.public()).unwrap());
        assert_eq!(s.len(), 256);
        let p = DhGroup::Ffdhe2048.prime().unwrap();
        let one = pad(&BigUint::from(1u32), 256);
        let pm1 = pad(&(p - BigUint::from(1u32)), 256);
        assert!(a.shared(&one).is_err());
        assert!(a.shared(&pm1).is_err());
        assert!(a.shared(&pad(p, 256)).is_err());
        assert!(a.shared(&b.public()[1..]).is_err());
        assert!(KeyPair::generate(DhGroup::Null, &mut rng).is_none());
    }
}
