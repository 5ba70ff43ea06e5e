//! The `resv` target: any bytes as the reservation state file (`reservations.state`, the
//! format in `vfpoll_nvmf::fabrics::resv`'s `store` module) that `vfpoll target --state-dir`
//! reads at start. Properties: the reader never panics; what it accepts carries a matching
//! CRC32C (a file whose last line is changed is refused); and what it accepts, written back
//! in the canonical form, reads back to the same text.

use vfpoll_nvmf::fabrics::resv::canonical_state;

/// Checks one input.
pub fn check(data: &[u8]) {
    let Ok(text) = canonical_state(data) else { return };
    assert_eq!(
        canonical_state(text.as_bytes()).as_deref(),
        Ok(text.as_str()),
        "the canonical form does not read back to itself"
    );
    // The checksum guards the records: an accepted file with its end line's checksum
    // changed is refused.
    if let Some(at) = data.windows(4).rposition(|w| w == b"end ") {
        let mut bad = data.to_vec();
        if let Some(d) = bad.get_mut(at + 4) {
            *d = if *d == b'0' { b'1' } else { b'0' };
            assert!(
                canonical_state(&bad).is_err(),
                "a file with another checksum was accepted"
            );
        }
    }
}

/// A file of `body` lines (after the header) with its end line.
fn file(body: &str) -> Vec<u8> {
    let text = format!("vfpoll-reservations 1\n{body}");
    format!("{text}end {:08x}\n", crc32c::crc32c(text.as_bytes())).into_bytes()
}

/// Seeds: an empty file, one namespace with a reservation and two registrants, two
/// namespaces without a reservation.
pub fn seeds() -> Vec<Vec<u8>> {
    let nqn: String = "nqn.2024-01.io.vfpoll:fuzz"
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect();
    let a = "aa".repeat(16);
    let b = "bb".repeat(16);
    vec![
        file(""),
        file(&format!(
            "ns {nqn} 1 {} 3 1 {a}\nreg {a} 000000000000aaaa\nreg {b} 000000000000bbbb\n",
            "01".repeat(16)
        )),
        file(&format!(
            "ns {nqn} 1 {g} 0 0 -\nreg {b} ffffffffffffffff\nns {nqn} 7 {g} 4294967295 0 -\n",
            g = "02".repeat(16)
        )),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_are_accepted_and_pass() {
        for s in seeds() {
            assert!(canonical_state(&s).is_ok(), "{}", String::from_utf8_lossy(&s));
            check(&s);
        }
    }
}
