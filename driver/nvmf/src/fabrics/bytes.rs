//! Writers of the fields of the pages the target builds (Identify, log pages, reservation
//! reports): integers little-endian (NVMe Base 2.0 §1.5), strings padded.

/// `v` little-endian at byte `o`.
pub(crate) fn put16(b: &mut [u8], o: usize, v: u16) {
    b[o..o + 2].copy_from_slice(&v.to_le_bytes());
}

/// `v` little-endian at byte `o`.
pub(crate) fn put32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_le_bytes());
}

/// `v` little-endian at byte `o`.
pub(crate) fn put64(b: &mut [u8], o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_le_bytes());
}

/// `v` little-endian at byte `o`.
pub(crate) fn put128(b: &mut [u8], o: usize, v: u128) {
    b[o..o + 16].copy_from_slice(&v.to_le_bytes());
}

/// ASCII, space padded (SN, MN, FR).
pub(crate) fn put_ascii(b: &mut [u8], o: usize, len: usize, s: &str) {
    let f = &mut b[o..o + len];
    f.fill(b' ');
    let n = s.len().min(len);
    f[..n].copy_from_slice(&s.as_bytes()[..n]);
}

/// A string NUL padded (NQNs, TRADDR, TRSVCID): at most `len - 1` bytes so that it ends in NUL.
pub(crate) fn put_str(b: &mut [u8], o: usize, len: usize, s: &str) {
    let f = &mut b[o..o + len];
    f.fill(0);
    let n = s.len().min(len - 1);
    f[..n].copy_from_slice(&s.as_bytes()[..n]);
}
