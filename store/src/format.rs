//! The on-disk structures of `store/FORMAT.md`, encoded and decoded as plain bytes.
//!
//! Every decoder takes untrusted bytes and returns a [`Corrupt`] naming what is wrong, never
//! panics (the fuzz targets in `store/fuzz` hold it to that), and never allocates more than the
//! input can describe. Section numbers (`§3`) are FORMAT.md's.

use std::fmt;

/// Bytes of a store page: the unit of every structure, extent and I/O (§1).
pub const PAGE: usize = 4096;
/// Where the striped data area starts on every member (§2).
pub const DATA_START: u64 = 1 << 20;
/// Member byte offset of superblock copy A and B (§2).
pub const SUPERBLOCK_OFFSETS: [u64; 2] = [0, 0x1000];
/// Member-0 byte offset of root slot 0 and 1 (§2).
pub const ROOT_OFFSETS: [u64; 2] = [0x2000, 0x3000];
/// The most members a store may have (§2).
pub const MAX_MEMBERS: u32 = 64;
/// Smallest and largest chunk size (§2).
pub const CHUNK_RANGE: (u32, u32) = (64 << 10, 64 << 20);
/// Bytes of a KV slot header (§6).
pub const SLOT_HEADER: usize = 64;
/// Longest checkpoint or pool name, entry name and meta (§5).
pub const MAX_NAME: usize = 1024;
/// Longest entry name (§5.2).
pub const MAX_ENTRY_NAME: usize = 4096;
/// Longest entry meta (§5.2).
pub const MAX_META: usize = 65536;
/// Largest KV block (§5.1).
pub const MAX_BLOCK: u32 = 64 << 20;

/// Format major and minor version this crate writes and reads.
pub const VERSION: (u16, u16) = (1, 0);

const SB_MAGIC: &[u8; 8] = b"VFPSTORE";
const ROOT_MAGIC: &[u8; 8] = b"VFPROOT\0";
/// Magic of the catalog blob (§5).
pub const CATALOG_MAGIC: &[u8; 8] = b"VFPCATLG";
/// Magic of a manifest blob (§5).
pub const MANIFEST_MAGIC: &[u8; 8] = b"VFPMANIF";
const SLOT_MAGIC: &[u8; 4] = b"VFKV";
const BLOB_HEADER: usize = 32;

/// A structure that failed its checks: which one, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corrupt {
    /// The object ("superblock A of member 1", "catalog", "manifest of model v3").
    pub object: String,
    /// What is wrong.
    pub detail: String,
}

impl fmt::Display for Corrupt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.object, self.detail)
    }
}

fn corrupt(object: &str, detail: impl Into<String>) -> Corrupt {
    Corrupt {
        object: object.to_string(),
        detail: detail.into(),
    }
}

/// CRC-32C (§1).
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// Copies `src` into `dst` (same length) and returns the crc32c of the bytes, in one pass of
/// 32 KiB steps: the crc reads what the copy just brought into the cache.
pub(crate) fn copy_crc(dst: &mut [u8], src: &[u8]) -> u32 {
    const STEP: usize = 32 << 10;
    let mut c = 0;
    for (d, s) in dst.chunks_mut(STEP).zip(src.chunks(STEP)) {
        d.copy_from_slice(s);
        c = crc32c_append(c, d);
    }
    c
}

/// CRC-32C continued over more bytes.
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, data)
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}
fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// A superblock (§3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    /// Store UUID.
    pub uuid: [u8; 16],
    /// This member's index.
    pub member: u32,
    /// Members of the store.
    pub members: u32,
    /// Chunk size in bytes.
    pub chunk_size: u32,
    /// Chunks of `chunk_size` per member.
    pub chunks_per_member: u64,
    /// The member's block size at format.
    pub block_size: u32,
    /// The member's capacity at format.
    pub capacity: u64,
    /// Format time, Unix seconds.
    pub created: u64,
    /// Label (at most 64 bytes of UTF-8).
    pub label: String,
}

impl Superblock {
    /// The 4096 bytes of a copy.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; PAGE];
        b[0..8].copy_from_slice(SB_MAGIC);
        put16(&mut b, 8, VERSION.0);
        put16(&mut b, 10, VERSION.1);
        b[16..32].copy_from_slice(&self.uuid);
        put32(&mut b, 32, self.member);
        put32(&mut b, 36, self.members);
        put32(&mut b, 40, PAGE as u32);
        put32(&mut b, 44, self.chunk_size);
        put64(&mut b, 48, self.chunks_per_member);
        put64(&mut b, 56, DATA_START);
        put32(&mut b, 64, self.block_size);
        put64(&mut b, 72, self.capacity);
        put64(&mut b, 80, self.created);
        let label = self.label.as_bytes();
        let n = label.len().min(64);
        b[88..88 + n].copy_from_slice(&label[..n]);
        let crc = crc32c(&b[..PAGE - 4]);
        put32(&mut b, PAGE - 4, crc);
        b
    }

    /// Whether `b` starts with the superblock magic (a store, damaged or not).
    pub fn has_magic(b: &[u8]) -> bool {
        b.len() >= 8 && &b[0..8] == SB_MAGIC
    }

    /// Decodes and checks one copy; `object` names it in errors.
    pub fn decode(b: &[u8], object: &str) -> Result<Self, Corrupt> {
        if b.len() < PAGE {
            return Err(corrupt(
                object,
                format!("{} bytes, a superblock is {PAGE}", b.len()),
            ));
        }
        if !Self::has_magic(b) {
            return Err(corrupt(object, "no superblock magic: not a vfpoll store"));
        }
        let crc = crc32c(&b[..PAGE - 4]);
        if crc != le32(b, PAGE - 4) {
            return Err(corrupt(
                object,
                format!(
                    "checksum mismatch (stored {:#010x}, computed {crc:#010x})",
                    le32(b, PAGE - 4)
                ),
            ));
        }
        let (major, minor) = (le16(b, 8), le16(b, 10));
        if major != VERSION.0 {
            return Err(corrupt(
                object,
                format!(
                    "format version {major}.{minor}; this build reads version {}.x",
                    VERSION.0
                ),
            ));
        }
        let sb = Superblock {
            uuid: b[16..32].try_into().expect("16 bytes"),
            member: le32(b, 32),
            members: le32(b, 36),
            chunk_size: le32(b, 44),
            chunks_per_member: le64(b, 48),
            block_size: le32(b, 64),
            capacity: le64(b, 72),
            created: le64(b, 80),
            label: String::from_utf8_lossy(&b[88..152])
                .trim_end_matches('\0')
                .to_string(),
        };
        let bad = |d: String| Err(corrupt(object, d));
        if le32(b, 40) != PAGE as u32 {
            return bad(format!("page size {}, must be {PAGE}", le32(b, 40)));
        }
        if le64(b, 56) != DATA_START {
            return bad(format!("data start {}, must be {DATA_START}", le64(b, 56)));
        }
        if !sb.chunk_size.is_power_of_two() || sb.chunk_size < CHUNK_RANGE.0 || sb.chunk_size > CHUNK_RANGE.1
        {
            return bad(format!(
                "chunk size {} is not a power of two in 64 KiB..=64 MiB",
                sb.chunk_size
            ));
        }
        if sb.members == 0 || sb.members > MAX_MEMBERS || sb.member >= sb.members {
            return bad(format!(
                "member {} of {} (at most {MAX_MEMBERS})",
                sb.member, sb.members
            ));
        }
        if sb.block_size == 0 || !(PAGE as u32).is_multiple_of(sb.block_size) {
            return bad(format!("block size {} does not divide {PAGE}", sb.block_size));
        }
        let need = (sb.chunks_per_member as u128) * (sb.chunk_size as u128) + DATA_START as u128;
        if sb.chunks_per_member == 0 || need > sb.capacity as u128 {
            return bad(format!(
                "{} chunks of {} bytes do not fit the member's {} bytes",
                sb.chunks_per_member, sb.chunk_size, sb.capacity
            ));
        }
        Ok(sb)
    }

    /// Pages of the logical space (§2).
    pub fn logical_pages(&self) -> u64 {
        self.members as u64 * self.chunks_per_member * self.chunk_pages()
    }

    /// Pages per chunk.
    pub fn chunk_pages(&self) -> u64 {
        self.chunk_size as u64 / PAGE as u64
    }
}

/// Where a blob is, and its checksum (§4, §5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BlobLoc {
    /// First logical page.
    pub page: u64,
    /// Length in bytes, header included.
    pub len: u32,
    /// crc32c of the whole blob.
    pub crc: u32,
}

impl BlobLoc {
    /// Pages it occupies.
    pub fn pages(&self) -> u64 {
        (self.len as u64).div_ceil(PAGE as u64)
    }
}

/// A root record (§4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Root {
    /// Store UUID.
    pub uuid: [u8; 16],
    /// Generation (≥ 1); it lives in slot `generation % 2`.
    pub generation: u64,
    /// The catalog.
    pub catalog: BlobLoc,
    /// Commit time, Unix nanoseconds.
    pub committed: u64,
    /// Next object id.
    pub next_id: u64,
}

impl Root {
    /// The 4096 bytes of the record.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; PAGE];
        b[0..8].copy_from_slice(ROOT_MAGIC);
        put16(&mut b, 8, VERSION.0);
        put16(&mut b, 10, VERSION.1);
        b[16..32].copy_from_slice(&self.uuid);
        put64(&mut b, 32, self.generation);
        put64(&mut b, 40, self.catalog.page);
        put32(&mut b, 48, self.catalog.len);
        put32(&mut b, 52, self.catalog.crc);
        put64(&mut b, 56, self.committed);
        put64(&mut b, 64, self.next_id);
        let crc = crc32c(&b[..PAGE - 4]);
        put32(&mut b, PAGE - 4, crc);
        b
    }

    /// Decodes the record read from root slot `slot` of the store `uuid`.
    pub fn decode(b: &[u8], slot: usize, uuid: &[u8; 16]) -> Result<Self, Corrupt> {
        let object = format!("root slot {slot}");
        let bad = |d: String| Err(corrupt(&object, d));
        if b.len() < PAGE {
            return bad(format!("{} bytes, a root is {PAGE}", b.len()));
        }
        if &b[0..8] != ROOT_MAGIC {
            return bad("no root magic (never written, or overwritten)".into());
        }
        let crc = crc32c(&b[..PAGE - 4]);
        if crc != le32(b, PAGE - 4) {
            return bad(format!(
                "checksum mismatch (stored {:#010x}, computed {crc:#010x}): torn or damaged",
                le32(b, PAGE - 4)
            ));
        }
        if le16(b, 8) != VERSION.0 {
            return bad(format!("format version {}.{}", le16(b, 8), le16(b, 10)));
        }
        if &b[16..32] != uuid {
            return bad("belongs to another store (UUID differs from the superblock's)".into());
        }
        let r = Root {
            uuid: *uuid,
            generation: le64(b, 32),
            catalog: BlobLoc {
                page: le64(b, 40),
                len: le32(b, 48),
                crc: le32(b, 52),
            },
            committed: le64(b, 56),
            next_id: le64(b, 64),
        };
        if r.generation == 0 || (r.generation % 2) as usize != slot {
            return bad(format!(
                "generation {} does not belong in slot {slot}",
                r.generation
            ));
        }
        if (r.catalog.len as usize) < BLOB_HEADER {
            return bad(format!(
                "catalog length {} is shorter than a blob header",
                r.catalog.len
            ));
        }
        Ok(r)
    }
}

/// Which blob (§5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlobKind {
    /// The catalog.
    Catalog,
    /// A version's manifest.
    Manifest,
}

impl BlobKind {
    fn magic(self) -> &'static [u8; 8] {
        match self {
            BlobKind::Catalog => CATALOG_MAGIC,
            BlobKind::Manifest => MANIFEST_MAGIC,
        }
    }
}

/// Wraps `body` in a blob header (§5); returns the blob padded to whole pages and its
/// location fields (length and crc; the page is the caller's).
pub fn encode_blob(kind: BlobKind, id: u64, body: &[u8]) -> Result<(Vec<u8>, u32, u32), String> {
    let len = BLOB_HEADER + body.len();
    let len32 = u32::try_from(len).map_err(|_| format!("a {len}-byte blob is over the 4 GiB limit"))?;
    let mut b = vec![0u8; len.next_multiple_of(PAGE)];
    b[0..8].copy_from_slice(kind.magic());
    put16(&mut b, 8, VERSION.0);
    put16(&mut b, 10, VERSION.1);
    put32(&mut b, 12, len32);
    put64(&mut b, 16, id);
    put32(&mut b, 24, crc32c(body));
    let hcrc = crc32c(&b[..28]);
    put32(&mut b, 28, hcrc);
    b[BLOB_HEADER..len].copy_from_slice(body);
    let crc = crc32c(&b[..len]);
    Ok((b, len32, crc))
}

/// Checks a blob read from `loc` (at least `loc.len` bytes) and returns its id and body.
pub fn decode_blob<'a>(
    b: &'a [u8],
    kind: BlobKind,
    loc: &BlobLoc,
    object: &str,
) -> Result<(u64, &'a [u8]), Corrupt> {
    let len = loc.len as usize;
    let bad = |d: String| Err(corrupt(object, d));
    if len < BLOB_HEADER || b.len() < len {
        return bad(format!("{} bytes read, {len} expected", b.len()));
    }
    let crc = crc32c(&b[..len]);
    if crc != loc.crc {
        return bad(format!(
            "checksum mismatch (expected {:#010x}, computed {crc:#010x})",
            loc.crc
        ));
    }
    if &b[0..8] != kind.magic() {
        return bad("wrong magic".into());
    }
    if crc32c(&b[..28]) != le32(b, 28) {
        return bad("header checksum mismatch".into());
    }
    if le16(b, 8) != VERSION.0 {
        return bad(format!("format version {}.{}", le16(b, 8), le16(b, 10)));
    }
    if le32(b, 12) as usize != len {
        return bad(format!("header says {} bytes, its location {len}", le32(b, 12)));
    }
    let body = &b[BLOB_HEADER..len];
    if crc32c(body) != le32(b, 24) {
        return bad("body checksum mismatch".into());
    }
    Ok((le64(b, 16), body))
}

/// Appends little-endian fields and strings to a body.
#[derive(Debug, Default)]
pub struct Writer(pub Vec<u8>);

impl Writer {
    /// A u16.
    pub fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    /// A u32.
    pub fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    /// A u64.
    pub fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    /// A `str` (callers check the length first).
    pub fn str(&mut self, s: &str) {
        self.u16(s.len() as u16);
        self.0.extend_from_slice(s.as_bytes());
    }
    /// A `bytes` field.
    pub fn bytes(&mut self, s: &[u8]) {
        self.u32(s.len() as u32);
        self.0.extend_from_slice(s);
    }
}

/// Reads fields from a body, with errors naming the object.
#[derive(Debug)]
pub struct Reader<'a> {
    b: &'a [u8],
    at: usize,
    object: &'a str,
}

impl<'a> Reader<'a> {
    /// Reads `b`; errors name `object`.
    pub fn new(b: &'a [u8], object: &'a str) -> Self {
        Reader { b, at: 0, object }
    }
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], Corrupt> {
        match self.at.checked_add(n) {
            Some(end) if end <= self.b.len() => {
                let s = &self.b[self.at..end];
                self.at = end;
                Ok(s)
            }
            _ => Err(corrupt(
                self.object,
                format!("truncated: {what} at byte {} needs {n} bytes", self.at),
            )),
        }
    }
    /// A u16.
    pub fn u16(&mut self, what: &str) -> Result<u16, Corrupt> {
        Ok(le16(self.take(2, what)?, 0))
    }
    /// A u32.
    pub fn u32(&mut self, what: &str) -> Result<u32, Corrupt> {
        Ok(le32(self.take(4, what)?, 0))
    }
    /// A u64.
    pub fn u64(&mut self, what: &str) -> Result<u64, Corrupt> {
        Ok(le64(self.take(8, what)?, 0))
    }
    /// A `str` of at most `max` bytes.
    pub fn str(&mut self, what: &str, max: usize) -> Result<String, Corrupt> {
        let n = self.u16(what)? as usize;
        if n == 0 || n > max {
            return Err(corrupt(
                self.object,
                format!("{what}: length {n}, must be 1..={max}"),
            ));
        }
        let s = self.take(n, what)?;
        String::from_utf8(s.to_vec()).map_err(|_| corrupt(self.object, format!("{what} is not UTF-8")))
    }
    /// A `bytes` field of at most `max` bytes.
    pub fn bytes(&mut self, what: &str, max: usize) -> Result<Vec<u8>, Corrupt> {
        let n = self.u32(what)? as usize;
        if n > max {
            return Err(corrupt(self.object, format!("{what}: {n} bytes, at most {max}")));
        }
        Ok(self.take(n, what)?.to_vec())
    }
    /// A count of items of at least `min_item` bytes each: refused when the rest of the body
    /// cannot hold them (so a forged count cannot make the reader allocate).
    pub fn count(&mut self, what: &str, min_item: usize) -> Result<usize, Corrupt> {
        let n = self.u32(what)? as usize;
        let rest = self.b.len() - self.at;
        if n.saturating_mul(min_item) > rest {
            return Err(corrupt(
                self.object,
                format!("{what}: {n} items cannot fit the {rest} bytes left"),
            ));
        }
        Ok(n)
    }
    /// Refuses trailing bytes.
    pub fn finish(&self) -> Result<(), Corrupt> {
        if self.at != self.b.len() {
            return Err(corrupt(
                self.object,
                format!("{} unexpected bytes after the last field", self.b.len() - self.at),
            ));
        }
        Ok(())
    }
}

/// A version of a checkpoint, as the catalog lists it (§5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionRec {
    /// Version id (store-wide unique).
    pub id: u64,
    /// Commit time, Unix nanoseconds.
    pub committed: u64,
    /// Bytes of data.
    pub bytes: u64,
    /// Entries.
    pub entries: u32,
    /// Its manifest.
    pub manifest: BlobLoc,
}

/// A checkpoint and its versions (§5.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointRec {
    /// Name.
    pub name: String,
    /// Versions, ascending.
    pub versions: Vec<VersionRec>,
}

/// A KV pool definition (§5.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolRec {
    /// Name.
    pub name: String,
    /// Pool id.
    pub id: u64,
    /// Block size in bytes.
    pub block_size: u32,
    /// Slots.
    pub slots: u64,
    /// First page of the header table.
    pub header_page: u64,
    /// First page of the data region.
    pub data_page: u64,
    /// Creation time, Unix nanoseconds.
    pub created: u64,
}

impl PoolRec {
    /// Pages of the header table.
    pub fn header_pages(&self) -> u64 {
        (self.slots * SLOT_HEADER as u64).div_ceil(PAGE as u64)
    }
    /// Pages per block.
    pub fn block_pages(&self) -> u64 {
        self.block_size as u64 / PAGE as u64
    }
    /// Pages of the data region.
    pub fn data_pages(&self) -> u64 {
        self.slots * self.block_pages()
    }
}

/// The catalog (§5.1).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Catalog {
    /// Checkpoints.
    pub checkpoints: Vec<CheckpointRec>,
    /// KV pools.
    pub pools: Vec<PoolRec>,
}

impl Catalog {
    /// The body.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u32(self.checkpoints.len() as u32);
        for c in &self.checkpoints {
            w.str(&c.name);
            w.u32(c.versions.len() as u32);
            for v in &c.versions {
                w.u64(v.id);
                w.u64(v.committed);
                w.u64(v.bytes);
                w.u32(v.entries);
                w.u64(v.manifest.page);
                w.u32(v.manifest.len);
                w.u32(v.manifest.crc);
            }
        }
        w.u32(self.pools.len() as u32);
        for p in &self.pools {
            w.str(&p.name);
            w.u64(p.id);
            w.u32(p.block_size);
            w.u32(0);
            w.u64(p.slots);
            w.u64(p.header_page);
            w.u64(p.data_page);
            w.u64(p.created);
        }
        w.0
    }

    /// Decodes and checks a body (names, order, sizes; bounds and overlaps are the store's).
    pub fn decode(body: &[u8]) -> Result<Self, Corrupt> {
        let object = "catalog";
        let mut r = Reader::new(body, object);
        let mut cat = Catalog::default();
        let n = r.count("checkpoint count", 6)?;
        for _ in 0..n {
            let name = r.str("checkpoint name", MAX_NAME)?;
            let nv = r.count("version count", 44)?;
            let mut versions = Vec::with_capacity(nv);
            for _ in 0..nv {
                let v = VersionRec {
                    id: r.u64("version id")?,
                    committed: r.u64("commit time")?,
                    bytes: r.u64("bytes")?,
                    entries: r.u32("entries")?,
                    manifest: BlobLoc {
                        page: r.u64("manifest page")?,
                        len: r.u32("manifest length")?,
                        crc: r.u32("manifest crc")?,
                    },
                };
                if versions.last().is_some_and(|p: &VersionRec| p.id >= v.id) {
                    return Err(corrupt(
                        object,
                        format!("checkpoint {name:?}: versions out of order"),
                    ));
                }
                if (v.manifest.len as usize) < BLOB_HEADER {
                    return Err(corrupt(
                        object,
                        format!("checkpoint {name:?}: manifest length {}", v.manifest.len),
                    ));
                }
                versions.push(v);
            }
            if cat.checkpoints.iter().any(|c: &CheckpointRec| c.name == name) {
                return Err(corrupt(object, format!("checkpoint {name:?} listed twice")));
            }
            cat.checkpoints.push(CheckpointRec { name, versions });
        }
        let np = r.count("pool count", 51)?;
        for _ in 0..np {
            let p = PoolRec {
                name: r.str("pool name", MAX_NAME)?,
                id: r.u64("pool id")?,
                block_size: r.u32("block size")?,
                slots: {
                    r.u32("reserved")?;
                    r.u64("slots")?
                },
                header_page: r.u64("header page")?,
                data_page: r.u64("data page")?,
                created: r.u64("creation time")?,
            };
            if p.block_size == 0 || !(p.block_size as usize).is_multiple_of(PAGE) || p.block_size > MAX_BLOCK
            {
                return Err(corrupt(
                    object,
                    format!("pool {:?}: block size {}", p.name, p.block_size),
                ));
            }
            if p.slots == 0 || p.slots > 1 << 40 {
                return Err(corrupt(object, format!("pool {:?}: {} slots", p.name, p.slots)));
            }
            if cat.pools.iter().any(|q: &PoolRec| q.name == p.name) {
                return Err(corrupt(object, format!("pool {:?} listed twice", p.name)));
            }
            cat.pools.push(p);
        }
        r.finish()?;
        Ok(cat)
    }
}

/// One extent of an entry (§5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// First logical page.
    pub page: u64,
    /// Bytes (1..=chunk size).
    pub len: u32,
    /// crc32c of the bytes.
    pub crc: u32,
}

impl Extent {
    /// Pages it occupies.
    pub fn pages(&self) -> u64 {
        (self.len as u64).div_ceil(PAGE as u64)
    }
}

/// A named tensor or buffer of a version (§5.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Name.
    pub name: String,
    /// Opaque user bytes (dtype, shape).
    pub meta: Vec<u8>,
    /// Length in bytes.
    pub len: u64,
    /// Where the bytes are.
    pub extents: Vec<Extent>,
}

impl Entry {
    /// The extents holding any of bytes `start..end`, each with the entry byte it starts at.
    pub(crate) fn extents_in(&self, start: u64, end: u64) -> impl Iterator<Item = (&Extent, u64)> {
        self.extents
            .iter()
            .scan(0u64, |pos, x| {
                let xs = *pos;
                *pos += x.len as u64;
                Some((x, xs))
            })
            .filter(move |&(x, xs)| xs < end && xs + x.len as u64 > start)
    }
}

/// A version's manifest (§5.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// Version id.
    pub id: u64,
    /// Checkpoint name.
    pub checkpoint: String,
    /// Entries.
    pub entries: Vec<Entry>,
}

impl Manifest {
    /// The body.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u64(self.id);
        w.str(&self.checkpoint);
        w.u32(self.entries.len() as u32);
        for e in &self.entries {
            w.str(&e.name);
            w.bytes(&e.meta);
            w.u64(e.len);
            w.u32(e.extents.len() as u32);
            for x in &e.extents {
                w.u64(x.page);
                w.u32(x.len);
                w.u32(x.crc);
            }
        }
        w.0
    }

    /// Decodes and checks a body; `chunk_pages` bounds the extents (§5.2).
    pub fn decode(body: &[u8], object: &str, chunk_pages: u64) -> Result<Self, Corrupt> {
        let mut r = Reader::new(body, object);
        let id = r.u64("version id")?;
        let checkpoint = r.str("checkpoint name", MAX_NAME)?;
        let n = r.count("entry count", 19)?;
        let mut entries: Vec<Entry> = Vec::with_capacity(n);
        let mut names = std::collections::HashSet::with_capacity(n);
        for _ in 0..n {
            let name = r.str("entry name", MAX_ENTRY_NAME)?;
            let meta = r.bytes("entry meta", MAX_META)?;
            let len = r.u64("entry length")?;
            let nx = r.count("extent count", 16)?;
            let mut extents = Vec::with_capacity(nx);
            let mut sum = 0u64;
            for _ in 0..nx {
                let x = Extent {
                    page: r.u64("extent page")?,
                    len: r.u32("extent length")?,
                    crc: r.u32("extent crc")?,
                };
                let pages = x.pages();
                if x.len == 0 || pages > chunk_pages || x.page % chunk_pages + pages > chunk_pages {
                    return Err(corrupt(
                        object,
                        format!(
                            "entry {name:?}: extent at page {} of {} bytes crosses a chunk",
                            x.page, x.len
                        ),
                    ));
                }
                sum += x.len as u64;
                extents.push(x);
            }
            if sum != len {
                return Err(corrupt(
                    object,
                    format!("entry {name:?}: extents hold {sum} bytes, the entry {len}"),
                ));
            }
            if !names.insert(name.clone()) {
                return Err(corrupt(object, format!("entry {name:?} listed twice")));
            }
            entries.push(Entry {
                name,
                meta,
                len,
                extents,
            });
        }
        r.finish()?;
        Ok(Manifest {
            id,
            checkpoint,
            entries,
        })
    }
}

/// A KV slot header (§6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotHeader {
    /// Pool id.
    pub pool: u64,
    /// Key.
    pub key: u128,
    /// Generation (≥ 1).
    pub generation: u64,
    /// Data length.
    pub len: u32,
    /// Data crc (see [`slot_data_crc`]).
    pub crc: u32,
}

impl SlotHeader {
    /// The 64 bytes.
    pub fn encode(&self) -> [u8; SLOT_HEADER] {
        let mut b = [0u8; SLOT_HEADER];
        b[0..4].copy_from_slice(SLOT_MAGIC);
        put64(&mut b, 8, self.pool);
        b[16..32].copy_from_slice(&self.key.to_le_bytes());
        put64(&mut b, 32, self.generation);
        put32(&mut b, 40, self.len);
        put32(&mut b, 44, self.crc);
        let c = crc32c(&b[..60]);
        put32(&mut b, 60, c);
        b
    }

    /// The header in `b` if it is a valid occupied slot of pool `pool` with blocks of
    /// `block_size`; `None` for a free slot (zeros, torn, stale, another pool's).
    pub fn decode(b: &[u8], pool: u64, block_size: u32) -> Option<Self> {
        if b.len() < SLOT_HEADER || &b[0..4] != SLOT_MAGIC || crc32c(&b[..60]) != le32(b, 60) {
            return None;
        }
        let h = SlotHeader {
            pool: le64(b, 8),
            key: u128::from_le_bytes(b[16..32].try_into().expect("16 bytes")),
            generation: le64(b, 32),
            len: le32(b, 40),
            crc: le32(b, 44),
        };
        (h.pool == pool && h.generation >= 1 && h.len >= 1 && h.len <= block_size).then_some(h)
    }
}

/// The data crc of a slot: over key, generation and data (§6).
pub fn slot_data_crc(key: u128, generation: u64, data: &[u8]) -> u32 {
    crc32c_append(slot_crc_seed(key, generation), data)
}

/// The crc32c of a slot's key and generation: [`slot_data_crc`] continues it over the data
/// (the I/O engine does so while it copies the block).
pub fn slot_crc_seed(key: u128, generation: u64) -> u32 {
    crc32c_append(crc32c(&key.to_le_bytes()), &generation.to_le_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_crc_copies_and_checksums() {
        let src: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        assert_eq!(copy_crc(&mut dst, &src), crc32c(&src));
        assert_eq!(dst, src);
    }

    #[test]
    fn slot_crc_seed_then_data() {
        let data: Vec<u8> = (0..70_000u32).map(|i| (i * 31) as u8).collect();
        let (k, g) = (0x1234_5678_9abc_def0_0fed_cba9_8765_4321u128, 77u64);
        let mut whole = k.to_le_bytes().to_vec();
        whole.extend_from_slice(&g.to_le_bytes());
        whole.extend_from_slice(&data);
        assert_eq!(slot_data_crc(k, g, &data), crc32c(&whole));
        assert_eq!(crc32c_append(slot_crc_seed(k, g), &data), crc32c(&whole));
    }

    #[test]
    fn crc32c_is_castagnoli() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    fn sb() -> Superblock {
        Superblock {
            uuid: [7; 16],
            member: 1,
            members: 2,
            chunk_size: 1 << 20,
            chunks_per_member: 10,
            block_size: 512,
            capacity: 12 << 20,
            created: 5,
            label: "lab".into(),
        }
    }

    #[test]
    fn superblock_round_trip_and_refusals() {
        let s = sb();
        let b = s.encode();
        assert_eq!(Superblock::decode(&b, "sb").unwrap(), s);
        let mut bad = b.clone();
        bad[100] ^= 1;
        assert!(Superblock::decode(&bad, "sb")
            .unwrap_err()
            .detail
            .contains("checksum"));
        let mut small = s.clone();
        small.capacity = 5 << 20;
        assert!(Superblock::decode(&small.encode(), "sb")
            .unwrap_err()
            .detail
            .contains("fit"));
        let mut v2 = b.clone();
        put16(&mut v2, 8, 2);
        let c = crc32c(&v2[..PAGE - 4]);
        put32(&mut v2, PAGE - 4, c);
        assert!(Superblock::decode(&v2, "sb")
            .unwrap_err()
            .detail
            .contains("version 2"));
        assert!(Superblock::decode(&[0u8; PAGE], "sb")
            .unwrap_err()
            .detail
            .contains("not a vfpoll"));
    }

    #[test]
    fn root_slot_must_match_generation() {
        let r = Root {
            uuid: [1; 16],
            generation: 3,
            catalog: BlobLoc {
                page: 9,
                len: 100,
                crc: 4,
            },
            committed: 1,
            next_id: 8,
        };
        let b = r.encode();
        assert_eq!(Root::decode(&b, 1, &[1; 16]).unwrap(), r);
        assert!(Root::decode(&b, 0, &[1; 16]).is_err());
        assert!(Root::decode(&b, 1, &[2; 16])
            .unwrap_err()
            .detail
            .contains("another store"));
    }

    #[test]
    fn blobs_and_catalogs_round_trip() {
        let cat = Catalog {
            checkpoints: vec![CheckpointRec {
                name: "m".into(),
                versions: vec![VersionRec {
                    id: 2,
                    committed: 3,
                    bytes: 4,
                    entries: 1,
                    manifest: BlobLoc {
                        page: 5,
                        len: 64,
                        crc: 6,
                    },
                }],
            }],
            pools: vec![PoolRec {
                name: "kv".into(),
                id: 9,
                block_size: 65536,
                slots: 10,
                header_page: 1,
                data_page: 16,
                created: 0,
            }],
        };
        let (blob, len, crc) = encode_blob(BlobKind::Catalog, 4, &cat.encode()).unwrap();
        assert_eq!(blob.len() % PAGE, 0);
        let loc = BlobLoc { page: 0, len, crc };
        let (id, body) = decode_blob(&blob, BlobKind::Catalog, &loc, "catalog").unwrap();
        assert_eq!(id, 4);
        assert_eq!(Catalog::decode(body).unwrap(), cat);
        assert!(decode_blob(&blob, BlobKind::Manifest, &loc, "m").is_err());
        for cut in 0..body.len() {
            assert!(Catalog::decode(&body[..cut]).is_err(), "truncated at {cut}");
        }
    }

    #[test]
    fn manifest_extents_stay_in_their_chunk() {
        let m = Manifest {
            id: 1,
            checkpoint: "c".into(),
            entries: vec![Entry {
                name: "w".into(),
                meta: vec![1, 2],
                len: 5000,
                extents: vec![Extent {
                    page: 254,
                    len: 5000,
                    crc: 0,
                }],
            }],
        };
        assert!(Manifest::decode(&m.encode(), "m", 256).is_ok());
        let mut m2 = m.clone();
        m2.entries[0].extents[0].page = 255;
        assert!(Manifest::decode(&m2.encode(), "m", 256)
            .unwrap_err()
            .detail
            .contains("crosses"));
        let mut m3 = m;
        m3.entries[0].len = 4999;
        assert!(Manifest::decode(&m3.encode(), "m", 256).is_err());
    }

    #[test]
    fn slot_headers() {
        let h = SlotHeader {
            pool: 3,
            key: u128::MAX - 5,
            generation: 9,
            len: 100,
            crc: 1,
        };
        let b = h.encode();
        assert_eq!(SlotHeader::decode(&b, 3, 4096), Some(h));
        assert_eq!(SlotHeader::decode(&b, 4, 4096), None, "another pool's");
        assert_eq!(SlotHeader::decode(&b, 3, 99), None, "longer than a block");
        assert_eq!(SlotHeader::decode(&[0; 64], 3, 4096), None);
        let mut t = b;
        t[20] ^= 0x80;
        assert_eq!(SlotHeader::decode(&t, 3, 4096), None, "torn");
    }
}
