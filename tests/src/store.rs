//! The store's test-bed helpers: the big-namespace controllers G and H (`cargo xtask vm
//! --big-ns`, given to the `store` binary by `cargo xtask test`), and an independent decoder of
//! the store's on-disk format for host checks.
//!
//! The decoder is written from `store/FORMAT.md` alone and shares no code with `vfpoll-store`:
//! it reads the namespace image files on the host, checks every magic, version and crc32c the
//! specification names, maps logical pages to members as §2 says, and returns what the
//! committed root reaches. A bug in the store's writer and the same bug in its reader cannot
//! cancel out here.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// NVMe controller G (serial `vfpoll-g`, one big namespace of 512-byte blocks, `nvme-g-ns1.img`).
pub const NVME_G: &str = "0000:00:0e.0";
/// NVMe controller H (serial `vfpoll-h`, one big namespace of 4 KiB blocks, `nvme-h-ns1.img`).
pub const NVME_H: &str = "0000:00:0f.0";
/// The image files of G's and H's namespaces in the run dir.
pub const BIG_IMAGES: [&str; 2] = ["nvme-g-ns1.img", "nvme-h-ns1.img"];

const PAGE: u64 = 4096;

/// CRC-32C as FORMAT.md §1 defines it (checked against its test vector in [`Image::open`]).
pub fn crc32c(b: &[u8]) -> u32 {
    crc32c::crc32c(b)
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes(b[o..o + 2].try_into().unwrap())
}
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

/// A superblock (FORMAT.md §3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Super {
    /// Store UUID.
    pub uuid: [u8; 16],
    /// This member's index.
    pub member: u32,
    /// Members of the store.
    pub members: u32,
    /// Chunk size in bytes.
    pub chunk_size: u32,
    /// Chunks per member.
    pub chunks_per_member: u64,
    /// Block size at format.
    pub block_size: u32,
    /// Capacity at format.
    pub capacity: u64,
    /// Label.
    pub label: String,
}

/// The root record (§4).
#[derive(Debug, Clone)]
pub struct RootRec {
    /// Generation.
    pub generation: u64,
    /// Catalog first page, length, crc.
    pub catalog: (u64, u32, u32),
    /// Next object id.
    pub next_id: u64,
}

/// An entry of a manifest (§5.2): name, meta, length, extents (first page, length, crc32c).
pub type EntryRec = (String, Vec<u8>, u64, Vec<(u64, u32, u32)>);

/// A version in the catalog (§5.1), with its decoded manifest.
#[derive(Debug, Clone)]
pub struct Version {
    /// Version id.
    pub id: u64,
    /// Bytes of data.
    pub bytes: u64,
    /// Entries: name, meta, length, extents (page, len, crc).
    pub entries: Vec<EntryRec>,
}

/// A KV pool in the catalog (§5.1).
#[derive(Debug, Clone)]
pub struct Pool {
    /// Name.
    pub name: String,
    /// Pool id.
    pub id: u64,
    /// Block size.
    pub block_size: u32,
    /// Slots.
    pub slots: u64,
    /// Header table first page.
    pub header_page: u64,
    /// Data first page.
    pub data_page: u64,
}

/// A store read from its member images.
pub struct Image {
    files: Vec<File>,
    /// Superblocks, in member order.
    pub supers: Vec<Super>,
    /// The newest valid root.
    pub root: RootRec,
    /// Checkpoints: name, versions (ascending).
    pub checkpoints: Vec<(String, Vec<Version>)>,
    /// KV pools.
    pub pools: Vec<Pool>,
}

/// Bounded little-endian reader of a blob body.
struct Cur<'a> {
    b: &'a [u8],
    o: usize,
}

impl<'a> Cur<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        assert!(
            self.o + n <= self.b.len(),
            "blob body ends at {} reading {n} bytes at {}",
            self.b.len(),
            self.o
        );
        let s = &self.b[self.o..self.o + n];
        self.o += n;
        s
    }
    fn u16(&mut self) -> u16 {
        u16_at(self.take(2), 0)
    }
    fn u32(&mut self) -> u32 {
        u32_at(self.take(4), 0)
    }
    fn u64(&mut self) -> u64 {
        u64_at(self.take(8), 0)
    }
    fn str(&mut self) -> String {
        let n = self.u16() as usize;
        String::from_utf8(self.take(n).to_vec()).expect("names are UTF-8")
    }
    fn bytes(&mut self) -> Vec<u8> {
        let n = self.u32() as usize;
        self.take(n).to_vec()
    }
}

fn read_at(f: &File, off: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    f.read_exact_at(&mut v, off)
        .unwrap_or_else(|e| panic!("read {len} bytes at {off:#x}: {e}"));
    v
}

/// Decodes one superblock copy: `Err(why)` when invalid.
fn decode_super(b: &[u8]) -> Result<Super, String> {
    if &b[0..8] != b"VFPSTORE" {
        return Err("no magic".into());
    }
    if crc32c(&b[0..4092]) != u32_at(b, 4092) {
        return Err("crc".into());
    }
    if u16_at(b, 8) != 1 {
        return Err(format!("major {}", u16_at(b, 8)));
    }
    assert_eq!(u32_at(b, 40), 4096, "page size");
    assert_eq!(u64_at(b, 56), 1 << 20, "data_start");
    let chunk = u32_at(b, 44);
    assert!(
        chunk.is_power_of_two() && (64 << 10..=64 << 20).contains(&chunk),
        "chunk size {chunk}"
    );
    let label_raw = &b[88..152];
    let end = label_raw.iter().position(|&c| c == 0).unwrap_or(64);
    Ok(Super {
        uuid: b[16..32].try_into().unwrap(),
        member: u32_at(b, 32),
        members: u32_at(b, 36),
        chunk_size: chunk,
        chunks_per_member: u64_at(b, 48),
        block_size: u32_at(b, 64),
        capacity: u64_at(b, 72),
        label: String::from_utf8(label_raw[..end].to_vec()).expect("label UTF-8"),
    })
}

impl Image {
    /// Opens the member images (any order) and decodes everything the committed root reaches,
    /// checking every header, blob and manifest crc. Panics with the reason on anything the
    /// specification says a reader must refuse.
    pub fn open(paths: &[&Path]) -> Image {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283, "FORMAT.md §1 test vector");
        let mut members: Vec<(Super, File)> = Vec::new();
        for p in paths {
            let f = File::open(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            let two = read_at(&f, 0, 8192);
            let (a, b) = (decode_super(&two[..4096]), decode_super(&two[4096..]));
            assert!(a.is_ok(), "{}: superblock A invalid: {:?}", p.display(), a.err());
            assert_eq!(a, b, "{}: the two superblock copies differ", p.display());
            let sb = a.unwrap();
            let len = f.metadata().unwrap().len();
            assert!(
                len >= (1 << 20) + sb.chunks_per_member * sb.chunk_size as u64,
                "{}: smaller than the superblock says",
                p.display()
            );
            members.push((sb, f));
        }
        members.sort_by_key(|(s, _)| s.member);
        let first = members[0].0.clone();
        assert_eq!(first.members as usize, members.len(), "members named");
        for (i, (s, _)) in members.iter().enumerate() {
            assert_eq!(s.member as usize, i, "member indices 0..n, each once");
            assert_eq!(
                (s.uuid, s.members, s.chunk_size, s.chunks_per_member),
                (
                    first.uuid,
                    first.members,
                    first.chunk_size,
                    first.chunks_per_member
                ),
                "members agree"
            );
        }
        let (supers, files): (Vec<Super>, Vec<File>) = members.into_iter().unzip();
        // §4: both slots on member 0; the newer valid one wins.
        let mut best: Option<RootRec> = None;
        for slot in 0..2u64 {
            let b = read_at(&files[0], 0x2000 + 0x1000 * slot, 4096);
            if &b[0..8] != b"VFPROOT\0" || u16_at(&b, 8) != 1 || crc32c(&b[..4092]) != u32_at(&b, 4092) {
                continue;
            }
            if b[16..32] != first.uuid[..] {
                continue;
            }
            let generation = u64_at(&b, 32);
            if generation % 2 != slot || generation == 0 {
                continue;
            }
            let r = RootRec {
                generation,
                catalog: (u64_at(&b, 40), u32_at(&b, 48), u32_at(&b, 52)),
                next_id: u64_at(&b, 64),
            };
            if best.as_ref().is_none_or(|x| x.generation < generation) {
                best = Some(r);
            }
        }
        let root = best.expect("no valid root in either slot");
        let mut img = Image {
            files,
            supers,
            root,
            checkpoints: Vec::new(),
            pools: Vec::new(),
        };
        let (page, len, crc) = img.root.catalog;
        let body = img.blob(page, len, crc, b"VFPCATLG", Some(img.root.generation));
        let mut c = Cur { b: &body, o: 0 };
        for _ in 0..c.u32() {
            let name = c.str();
            let mut versions = Vec::new();
            let mut last = 0;
            for _ in 0..c.u32() {
                let id = c.u64();
                assert!(
                    id > last && id < img.root.next_id,
                    "version ids ascend, below next_id"
                );
                last = id;
                let _committed = c.u64();
                let bytes = c.u64();
                let n_entries = c.u32();
                let (mp, ml, mc) = (c.u64(), c.u32(), c.u32());
                let mbody = img.blob(mp, ml, mc, b"VFPMANIF", Some(id));
                let mut m = Cur { b: &mbody, o: 0 };
                assert_eq!(m.u64(), id, "manifest version id");
                assert_eq!(m.str(), name, "manifest checkpoint name");
                let ne = m.u32();
                assert_eq!(ne, n_entries, "catalog and manifest agree on the entries");
                let mut entries = Vec::new();
                let mut sum = 0;
                for _ in 0..ne {
                    let en = m.str();
                    let meta = m.bytes();
                    let elen = m.u64();
                    let mut ext = Vec::new();
                    let mut covered = 0u64;
                    for _ in 0..m.u32() {
                        let (p, l, x) = (m.u64(), m.u32(), m.u32());
                        assert!(l >= 1 && l <= first.chunk_size, "extent length {l}");
                        let cp = first.chunk_size as u64 / PAGE;
                        assert_eq!(
                            p / cp,
                            (p + (l as u64).div_ceil(PAGE) - 1) / cp,
                            "an extent stays in one chunk"
                        );
                        covered += l as u64;
                        ext.push((p, l, x));
                    }
                    assert_eq!(covered, elen, "entry {en}: extents add up to its length");
                    sum += elen;
                    entries.push((en, meta, elen, ext));
                }
                assert_eq!(sum, bytes, "version {id}: bytes");
                versions.push(Version { id, bytes, entries });
            }
            img.checkpoints.push((name, versions));
        }
        for _ in 0..c.u32() {
            let name = c.str();
            let id = c.u64();
            let block_size = c.u32();
            let _reserved = c.u32();
            let slots = c.u64();
            let header_page = c.u64();
            let data_page = c.u64();
            let _created = c.u64();
            assert!(block_size.is_multiple_of(4096) && slots >= 1, "pool {name}");
            img.pools.push(Pool {
                name,
                id,
                block_size,
                slots,
                header_page,
                data_page,
            });
        }
        assert_eq!(c.o, body.len(), "catalog body fully used");
        img
    }

    /// Reads logical page `p` (§2's mapping).
    pub fn page(&self, p: u64) -> Vec<u8> {
        let s = &self.supers[0];
        let cp = s.chunk_size as u64 / PAGE;
        let members = s.members as u64;
        let c = p / cp;
        assert!(
            c < members * s.chunks_per_member,
            "logical page {p} past the logical space"
        );
        let (m, mc) = (c % members, c / members);
        read_at(
            &self.files[m as usize],
            (1 << 20) + mc * s.chunk_size as u64 + (p % cp) * PAGE,
            PAGE as usize,
        )
    }

    /// `len` bytes from logical page `p` on.
    pub fn bytes(&self, p: u64, len: u64) -> Vec<u8> {
        let mut v = Vec::with_capacity(len as usize);
        for i in 0..len.div_ceil(PAGE) {
            v.extend_from_slice(&self.page(p + i));
        }
        v.truncate(len as usize);
        v
    }

    /// A blob's body (§5), after its checks: the whole blob's crc (from its location), the
    /// magic, version, length, header crc and body crc, the id.
    fn blob(&self, p: u64, len: u32, whole_crc: u32, magic: &[u8; 8], id: Option<u64>) -> Vec<u8> {
        let b = self.bytes(p, len as u64);
        assert_eq!(crc32c(&b), whole_crc, "blob at page {p}: whole-blob crc");
        assert_eq!(&b[0..8], magic, "blob at page {p}: magic");
        assert_eq!(u16_at(&b, 8), 1, "blob major version");
        assert_eq!(u32_at(&b, 12), len, "blob length");
        assert_eq!(crc32c(&b[0..28]), u32_at(&b, 28), "blob header crc");
        assert_eq!(crc32c(&b[32..]), u32_at(&b, 24), "blob body crc");
        if let Some(id) = id {
            assert_eq!(u64_at(&b, 16), id, "blob id");
        }
        b[32..].to_vec()
    }

    /// An entry's data, every extent's crc32c checked.
    pub fn entry_data(&self, ext: &[(u64, u32, u32)]) -> Vec<u8> {
        let mut v = Vec::new();
        for &(p, l, crc) in ext {
            let d = self.bytes(p, l as u64);
            assert_eq!(crc32c(&d), crc, "extent at logical page {p}: crc32c");
            v.extend_from_slice(&d);
        }
        v
    }

    /// The occupied slots of a pool (§6): key → data, each header and data crc checked; when
    /// two valid headers hold one key, the higher generation wins.
    pub fn pool_blocks(&self, pool: &Pool) -> std::collections::HashMap<u128, Vec<u8>> {
        let table = self.bytes(pool.header_page, (pool.slots * 64).div_ceil(PAGE) * PAGE);
        let mut best: std::collections::HashMap<u128, (u64, u64, u32, u32)> = Default::default();
        for i in 0..pool.slots {
            let h = &table[(i * 64) as usize..(i * 64 + 64) as usize];
            if &h[0..4] != b"VFKV" || crc32c(&h[0..60]) != u32_at(h, 60) || u64_at(h, 8) != pool.id {
                continue;
            }
            let key = u128::from_le_bytes(h[16..32].try_into().unwrap());
            let (generation, len, dcrc) = (u64_at(h, 32), u32_at(h, 40), u32_at(h, 44));
            if generation == 0 || len == 0 || len > pool.block_size {
                continue;
            }
            if best.get(&key).is_none_or(|b| b.0 < generation) {
                best.insert(key, (generation, i, len, dcrc));
            }
        }
        let pages = pool.block_size as u64 / PAGE;
        best.into_iter()
            .filter_map(|(key, (generation, slot, len, dcrc))| {
                let data = self.bytes(pool.data_page + slot * pages, len as u64);
                let mut bound = key.to_le_bytes().to_vec();
                bound.extend_from_slice(&generation.to_le_bytes());
                bound.extend_from_slice(&data);
                // A torn or stale block fails its data crc: a miss, never a hit.
                (crc32c(&bound) == dcrc).then_some((key, data))
            })
            .collect()
    }
}
