//! PCI addresses (`domain:bus:device.function`).

use core::fmt;
use core::str::FromStr;

/// A PCI function address, `DDDD:BB:DD.F` (segment/domain, bus, device, function).
///
/// Parsing accepts the full sysfs form (`0000:00:03.0`) and the short form without the domain
/// (`00:03.0`, domain 0), the way `lspci` prints it.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bdf {
    /// PCI segment (domain).
    pub domain: u16,
    /// Bus number.
    pub bus: u8,
    /// Device number, 0..=31.
    pub device: u8,
    /// Function number, 0..=7.
    pub function: u8,
}

/// Why a string is not a PCI address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{input}` is not a PCI address: {why}; write it as DDDD:BB:DD.F, e.g. 0000:00:03.0 (see `vfpoll status` for the devices present)")]
pub struct BdfParseError {
    /// The string given.
    pub input: String,
    /// What is wrong with it.
    pub why: &'static str,
}

impl Bdf {
    /// A BDF from its parts; `None` if device > 31 or function > 7.
    pub const fn new(domain: u16, bus: u8, device: u8, function: u8) -> Option<Self> {
        if device > 31 || function > 7 {
            return None;
        }
        Some(Bdf {
            domain,
            bus,
            device,
            function,
        })
    }
}

fn hex<T: TryFrom<u32>>(s: &str, digits: usize, input: &str, what: &'static str) -> Result<T, BdfParseError> {
    let err = |why| BdfParseError {
        input: input.to_owned(),
        why,
    };
    if s.is_empty() || s.len() > digits || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(err(what));
    }
    let v = u32::from_str_radix(s, 16).map_err(|_| err(what))?;
    T::try_from(v).map_err(|_| err(what))
}

impl FromStr for Bdf {
    type Err = BdfParseError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let s = input.trim();
        let err = |why| BdfParseError {
            input: input.to_owned(),
            why,
        };
        if s.is_empty() {
            return Err(err("it is empty"));
        }
        let (rest, func) = s
            .rsplit_once('.')
            .ok_or_else(|| err("the `.function` part is missing"))?;
        let parts: Vec<&str> = rest.split(':').collect();
        let (domain, bus, dev) = match parts.as_slice() {
            [d, b, v] => (
                hex::<u16>(d, 4, input, "the domain must be 1-4 hex digits")?,
                *b,
                *v,
            ),
            [b, v] => (0, *b, *v),
            _ => return Err(err("expected domain:bus:device.function")),
        };
        let bus = hex::<u8>(bus, 2, input, "the bus must be 1-2 hex digits")?;
        let device = hex::<u8>(dev, 2, input, "the device must be 1-2 hex digits")?;
        let function = hex::<u8>(func, 1, input, "the function must be one hex digit")?;
        if device > 31 {
            return Err(err("the device number must be 0..=1f"));
        }
        if function > 7 {
            return Err(err("the function number must be 0..=7"));
        }
        Ok(Bdf {
            domain,
            bus,
            device,
            function,
        })
    }
}

impl fmt::Display for Bdf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

impl fmt::Debug for Bdf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Bdf({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_full_and_short_forms() {
        let b: Bdf = "0000:00:03.0".parse().unwrap();
        assert_eq!(b, Bdf::new(0, 0, 3, 0).unwrap());
        assert_eq!(b.to_string(), "0000:00:03.0");
        let b: Bdf = "3a:1f.7".parse().unwrap();
        assert_eq!(b.to_string(), "0000:3a:1f.7");
        let b: Bdf = "abcd:ff:00.1".parse().unwrap();
        assert_eq!(b.domain, 0xabcd);
    }

    #[test]
    fn rejects_malformed_with_reason() {
        for (s, why) in [
            ("", "empty"),
            ("0000:00:03", "function"),
            ("0000:00:20.0", "device number"),
            ("0000:00:03.8", "function number"),
            ("0000:0g:03.0", "bus"),
            ("00000:00:03.0", "domain"),
            ("1:2:3:4.0", "expected"),
        ] {
            let e = s.parse::<Bdf>().unwrap_err();
            assert!(e.to_string().contains(why), "{s}: {e}");
            assert!(e.to_string().contains("DDDD:BB:DD.F"), "{s}: {e}");
        }
    }
}
