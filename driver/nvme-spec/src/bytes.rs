//! Little-endian fields of the pages a controller returns (every NVMe data structure is little
//! endian, NVMe Base 2.0 §1.5): what the Identify and zone report parsers read them with.

/// The 16-bit field at byte `o`.
pub(crate) fn le16(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}

/// The 32-bit field at byte `o`.
pub(crate) fn le32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}

/// The 64-bit field at byte `o`.
pub(crate) fn le64(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}
