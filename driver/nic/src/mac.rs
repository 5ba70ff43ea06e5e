//! Ethernet MAC addresses.

use std::fmt;
use std::str::FromStr;

/// A 48-bit IEEE 802 MAC address, in transmission order.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// `ff:ff:ff:ff:ff:ff`.
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);
    /// `00:00:00:00:00:00`.
    pub const ZERO: MacAddr = MacAddr([0; 6]);

    /// The six bytes.
    pub const fn octets(self) -> [u8; 6] {
        self.0
    }

    /// Whether this is the broadcast address.
    pub fn is_broadcast(self) -> bool {
        self == Self::BROADCAST
    }

    /// Whether the group bit (I/G, bit 0 of the first octet) is set: multicast or broadcast.
    pub fn is_multicast(self) -> bool {
        self.0[0] & 1 != 0
    }

    /// Whether the address is a valid unicast station address (not zero, not a group address).
    pub fn is_unicast(self) -> bool {
        self != Self::ZERO && !self.is_multicast()
    }

    /// The address as the 82574's receive address registers hold it: RAL gets octets 0-3 (octet 0
    /// in the low byte), RAH bits 15:0 octets 4-5 (82574 datasheet §10.2, RAL0/RAH0 at 0x5400).
    pub fn to_ral_rah(self) -> (u32, u32) {
        let o = self.0;
        (
            u32::from_le_bytes([o[0], o[1], o[2], o[3]]),
            u32::from_le_bytes([o[4], o[5], 0, 0]),
        )
    }

    /// The inverse of [`MacAddr::to_ral_rah`] (RAH bits 31:16 are ignored).
    pub fn from_ral_rah(ral: u32, rah: u32) -> Self {
        let l = ral.to_le_bytes();
        let h = rah.to_le_bytes();
        MacAddr([l[0], l[1], l[2], l[3], h[0], h[1]])
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            o[0], o[1], o[2], o[3], o[4], o[5]
        )
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MacAddr({self})")
    }
}

/// A string that is not a MAC address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a MAC address: write six hex octets separated by colons, e.g. 52:54:00:12:34:56")]
pub struct ParseMacError(pub String);

impl FromStr for MacAddr {
    type Err = ParseMacError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ParseMacError(s.to_owned());
        let mut out = [0u8; 6];
        let mut parts = s.split([':', '-']);
        for o in &mut out {
            let p = parts.next().ok_or_else(bad)?;
            if p.is_empty() || p.len() > 2 {
                return Err(bad());
            }
            *o = u8::from_str_radix(p, 16).map_err(|_| bad())?;
        }
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(MacAddr(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_display_and_registers_round_trip() {
        let m: MacAddr = "52:54:00:00:00:01".parse().unwrap();
        assert_eq!(m.0, [0x52, 0x54, 0, 0, 0, 1]);
        assert_eq!(m.to_string(), "52:54:00:00:00:01");
        assert!(m.is_unicast() && !m.is_multicast());
        let (ral, rah) = m.to_ral_rah();
        assert_eq!((ral, rah), (0x0000_5452, 0x0100));
        assert_eq!(MacAddr::from_ral_rah(ral, rah | 0x8000_0000), m);
        assert!(MacAddr::BROADCAST.is_broadcast() && MacAddr::BROADCAST.is_multicast());
        assert_eq!("01-00-5e-00-00-fb".parse::<MacAddr>().unwrap().0[5], 0xfb);
        for bad in [
            "",
            "52:54:00:00:00",
            "52:54:00:00:00:01:02",
            "5254:00:00:00:01",
            "zz:54:00:00:00:01",
        ] {
            let e = bad.parse::<MacAddr>().unwrap_err();
            assert!(e.to_string().contains("six hex octets"), "{e}");
        }
    }
}
