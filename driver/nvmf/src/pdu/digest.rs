//! Header and data digests: CRC32C (Castagnoli, the iSCSI polynomial), sent little-endian
//! (NVMe/TCP 1.0c §3.6.2.1 HDGSTF/DDGSTF; Linux `nvme_tcp_hdgst`: `~crc32c(~0, ...)`, stored
//! `cpu_to_le32`). Computed by the `crc32c` crate, which uses SSE4.2 or the ARMv8 CRC
//! instructions when the CPU has them.

/// The header digest of `header` (the HLEN bytes of a PDU header).
pub fn header_digest(header: &[u8]) -> u32 {
    crc32c::crc32c(header)
}

/// A data digest computed piece by piece: feed it the data slices in the order they are sent
/// or received (a PDU's data may come from, or land in, several DMA buffers), then compare or
/// send [`DataDigest::to_wire`].
///
/// The digest covers exactly the PDU-Data field: not the padding before it, and each PDU's
/// data separately (a new `DataDigest` per PDU).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DataDigest {
    /// CRC32C of the bytes so far (finalized; `crc32c_append` continues from it).
    crc: u32,
    /// Bytes so far.
    len: u64,
}

impl DataDigest {
    /// No data yet.
    pub const fn new() -> Self {
        DataDigest { crc: 0, len: 0 }
    }

    /// Adds the next `chunk` of the PDU's data.
    pub fn update(&mut self, chunk: &[u8]) {
        self.crc = crc32c::crc32c_append(self.crc, chunk);
        self.len += chunk.len() as u64;
    }

    /// The CRC32C of everything fed so far.
    pub const fn value(&self) -> u32 {
        self.crc
    }

    /// How many bytes were fed.
    pub const fn len(&self) -> u64 {
        self.len
    }

    /// True before any byte was fed.
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The 4 bytes that follow the data on the wire (DDGST).
    pub const fn to_wire(&self) -> [u8; 4] {
        self.crc.to_le_bytes()
    }

    /// True if the DDGST bytes received after the data match what was fed. A data digest
    /// error is a non-fatal transport error in NVMe/TCP 1.0c (no C2HTermReq): the controller
    /// completes the command with Command Transient Transport Error, as SPDK does (the Linux
    /// target drops the connection instead).
    pub fn matches(&self, ddgst: [u8; 4]) -> bool {
        u32::from_le_bytes(ddgst) == self.crc
    }
}
