//! # vfpoll-store-fuzz: fuzz targets for the store's on-disk parsers
//!
//! One target per parser of `vfpoll_store::format` (FORMAT.md), each a function that takes any
//! bytes and panics when a property breaks: the parser never panics, and what it accepts
//! encodes back to something it decodes the same way.
//!
//! - [`SUPERBLOCK`] (`fuzz_superblock`): a superblock copy;
//! - [`ROOT`] (`fuzz_root`): a root record (the first byte picks the slot);
//! - [`CATALOG`] (`fuzz_catalog`): a catalog blob (header, checksums, body), and the same bytes
//!   as a bare catalog body so the fuzzer reaches the body parser without forging crcs;
//! - [`MANIFEST`] (`fuzz_manifest`): a manifest body (the first byte picks the chunk size);
//! - [`SLOT`] (`fuzz_slot`): a KV slot header (the first 12 bytes give the pool id and block
//!   size).
//!
//! Built with the `libfuzzer` feature and coverage instrumentation (`cargo xtask fuzz`, which
//! `cargo xtask test` runs for a bounded time), the binaries are libFuzzer targets on stable
//! Rust; without the feature they replay inputs (`cargo run -p vfpoll-store-fuzz --bin
//! fuzz_catalog -- <file or directory>...`). Seeds are built by code from the crate's encoders
//! and written into the directory `VFPOLL_FUZZ_SEEDS` names.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

use std::path::{Path, PathBuf};

use vfpoll_store::format::{
    crc32c, decode_blob, encode_blob, BlobKind, BlobLoc, Catalog, CheckpointRec, Entry, Extent, Manifest,
    PoolRec, Root, SlotHeader, Superblock, VersionRec, PAGE,
};

/// The environment variable naming the directory a libFuzzer binary writes its seeds to.
pub const SEEDS_ENV: &str = "VFPOLL_FUZZ_SEEDS";

/// A fuzz target: its name (the binary is `fuzz_<name>`), its check and its seeds.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    /// The name.
    pub name: &'static str,
    /// The check: panics when a property breaks.
    pub check: fn(&[u8]),
    /// The seed inputs.
    pub seeds: fn() -> Vec<Vec<u8>>,
}

/// Superblocks.
pub const SUPERBLOCK: Target = Target {
    name: "superblock",
    check: check_superblock,
    seeds: seeds_superblock,
};
/// Root records.
pub const ROOT: Target = Target {
    name: "root",
    check: check_root,
    seeds: seeds_root,
};
/// Catalog blobs and bodies.
pub const CATALOG: Target = Target {
    name: "catalog",
    check: check_catalog,
    seeds: seeds_catalog,
};
/// Manifest bodies.
pub const MANIFEST: Target = Target {
    name: "manifest",
    check: check_manifest,
    seeds: seeds_manifest,
};
/// KV slot headers.
pub const SLOT: Target = Target {
    name: "slot",
    check: check_slot,
    seeds: seeds_slot,
};

/// Every target.
pub const TARGETS: [Target; 5] = [SUPERBLOCK, ROOT, CATALOG, MANIFEST, SLOT];

/// `data` with the crc32c of its first `at` bytes written at `at` (so the fuzzer reaches the
/// checks behind a checksum without forging it); `None` if too short.
fn fixed(data: &[u8], at: usize) -> Option<Vec<u8>> {
    let mut v = data.get(..at + 4)?.to_vec();
    let c = crc32c(&v[..at]);
    v[at..at + 4].copy_from_slice(&c.to_le_bytes());
    Some(v)
}

fn check_superblock(data: &[u8]) {
    superblock_once(data);
    if let Some(v) = fixed(data, PAGE - 4) {
        superblock_once(&v);
    }
}

fn superblock_once(data: &[u8]) {
    if let Ok(sb) = Superblock::decode(data, "sb") {
        let again = Superblock::decode(&sb.encode(), "sb").expect("an accepted superblock re-encodes");
        let strip = |s: &Superblock| Superblock {
            label: String::new(),
            ..s.clone()
        };
        assert_eq!(strip(&again), strip(&sb), "superblock round trip");
        assert!(sb.logical_pages() > 0);
    }
}

fn check_root(data: &[u8]) {
    let Some((&first, rec)) = data.split_first() else {
        return;
    };
    let slot = (first & 1) as usize;
    let uuid: [u8; 16] = rec.get(16..32).and_then(|u| u.try_into().ok()).unwrap_or([0; 16]);
    root_once(rec, slot, &uuid);
    if let Some(v) = fixed(rec, PAGE - 4) {
        root_once(&v, slot, &uuid);
    }
}

fn root_once(rec: &[u8], slot: usize, uuid: &[u8; 16]) {
    let uuid = *uuid;
    if let Ok(r) = Root::decode(rec, slot, &uuid) {
        assert_eq!(r.generation % 2, slot as u64);
        assert_eq!(
            Root::decode(&r.encode(), slot, &uuid).expect("re-encodes"),
            r,
            "root round trip"
        );
    }
}

fn catalog_round_trip(c: &Catalog) {
    assert_eq!(
        &Catalog::decode(&c.encode()).expect("re-encodes"),
        c,
        "catalog round trip"
    );
}

fn check_catalog(data: &[u8]) {
    catalog_once(data);
    // The same bytes with the blob's header and body crcs made right.
    if data.len() >= 32 {
        let mut v = data.to_vec();
        let body = crc32c(&v[32..]);
        v[24..28].copy_from_slice(&body.to_le_bytes());
        let head = crc32c(&v[..28]);
        v[28..32].copy_from_slice(&head.to_le_bytes());
        catalog_once(&v);
    }
}

fn catalog_once(data: &[u8]) {
    if data.len() >= 32 && data.len() <= u32::MAX as usize {
        let loc = BlobLoc {
            page: 0,
            len: data.len() as u32,
            crc: crc32c(data),
        };
        if let Ok((_, body)) = decode_blob(data, BlobKind::Catalog, &loc, "catalog") {
            if let Ok(c) = Catalog::decode(body) {
                catalog_round_trip(&c);
            }
        }
    }
    if let Ok(c) = Catalog::decode(data) {
        catalog_round_trip(&c);
    }
}

fn check_manifest(data: &[u8]) {
    let Some((&first, body)) = data.split_first() else {
        return;
    };
    let chunk_pages = 16u64 << (first % 11);
    if let Ok(m) = Manifest::decode(body, "m", chunk_pages) {
        for e in &m.entries {
            assert_eq!(e.extents.iter().map(|x| x.len as u64).sum::<u64>(), e.len);
            assert!(e
                .extents
                .iter()
                .all(|x| x.page % chunk_pages + x.pages() <= chunk_pages));
        }
        let again = Manifest::decode(&m.encode(), "m", chunk_pages).expect("re-encodes");
        assert_eq!(again, m, "manifest round trip");
    }
}

fn check_slot(data: &[u8]) {
    if data.len() < 12 {
        return;
    }
    let pool = u64::from_le_bytes(data[0..8].try_into().expect("8 bytes"));
    let bs = u32::from_le_bytes(data[8..12].try_into().expect("4 bytes"));
    slot_once(&data[12..], pool, bs);
    if let Some(v) = fixed(&data[12..], 60) {
        slot_once(&v, pool, bs);
    }
}

fn slot_once(data: &[u8], pool: u64, bs: u32) {
    if let Some(h) = SlotHeader::decode(data, pool, bs) {
        assert!(h.len >= 1 && h.len <= bs && h.generation >= 1 && h.pool == pool);
        assert_eq!(
            SlotHeader::decode(&h.encode(), pool, bs),
            Some(h),
            "slot header round trip"
        );
    }
}

fn sb() -> Superblock {
    Superblock {
        uuid: [9; 16],
        member: 1,
        members: 3,
        chunk_size: 1 << 20,
        chunks_per_member: 100,
        block_size: 4096,
        capacity: 200 << 20,
        created: 1_700_000_000,
        label: "seed".into(),
    }
}

fn seeds_superblock() -> Vec<Vec<u8>> {
    let mut v = vec![sb().encode()];
    let mut other = sb();
    other.members = 1;
    other.member = 0;
    other.chunk_size = 64 << 10;
    v.push(other.encode());
    v
}

fn seeds_root() -> Vec<Vec<u8>> {
    (1..3u64)
        .map(|g| {
            let r = Root {
                uuid: [3; 16],
                generation: g,
                catalog: BlobLoc {
                    page: 7,
                    len: 4000,
                    crc: 0x1234_5678,
                },
                committed: 99,
                next_id: 5,
            };
            let mut v = vec![g as u8];
            v.extend_from_slice(&r.encode());
            v
        })
        .collect()
}

fn catalog() -> Catalog {
    Catalog {
        checkpoints: vec![CheckpointRec {
            name: "model".into(),
            versions: (1..3)
                .map(|i| VersionRec {
                    id: i,
                    committed: 10 * i,
                    bytes: 1 << 20,
                    entries: 2,
                    manifest: BlobLoc {
                        page: 30 + i,
                        len: 200,
                        crc: 7,
                    },
                })
                .collect(),
        }],
        pools: vec![PoolRec {
            name: "kv".into(),
            id: 4,
            block_size: 65536,
            slots: 1000,
            header_page: 100,
            data_page: 256,
            created: 1,
        }],
    }
}

fn seeds_catalog() -> Vec<Vec<u8>> {
    let body = catalog().encode();
    let (blob, len, _) = encode_blob(BlobKind::Catalog, 3, &body).expect("small");
    vec![blob[..len as usize].to_vec(), body, Catalog::default().encode()]
}

fn seeds_manifest() -> Vec<Vec<u8>> {
    let m = Manifest {
        id: 2,
        checkpoint: "model".into(),
        entries: vec![
            Entry {
                name: "w".into(),
                meta: b"f32[2,3]".to_vec(),
                len: 300_000,
                extents: vec![
                    Extent {
                        page: 256,
                        len: 262_144,
                        crc: 1,
                    },
                    Extent {
                        page: 600,
                        len: 37_856,
                        crc: 2,
                    },
                ],
            },
            Entry {
                name: "empty".into(),
                meta: vec![],
                len: 0,
                extents: vec![],
            },
        ],
    };
    let mut v = vec![4u8]; // 256 pages per chunk
    v.extend_from_slice(&m.encode());
    vec![v]
}

fn seeds_slot() -> Vec<Vec<u8>> {
    let h = SlotHeader {
        pool: 4,
        key: 0xdead_beef_u128 << 64 | 7,
        generation: 3,
        len: 65536,
        crc: 9,
    };
    let mut v = 4u64.to_le_bytes().to_vec();
    v.extend_from_slice(&(PAGE as u32 * 16).to_le_bytes());
    v.extend_from_slice(&h.encode());
    vec![v]
}

/// Writes `target`'s seeds into the directory `VFPOLL_FUZZ_SEEDS` names, if it names one.
pub fn write_seeds_from_env(target: &Target) {
    if let Some(dir) = std::env::var_os(SEEDS_ENV) {
        if let Err(e) = write_seeds(target, Path::new(&dir)) {
            panic!("cannot write the {} seeds to {SEEDS_ENV}: {e}", target.name);
        }
    }
}

/// Writes `target`'s seeds into `dir` (created if missing) as `seed-<n>`; returns how many.
pub fn write_seeds(target: &Target, dir: &Path) -> std::io::Result<usize> {
    std::fs::create_dir_all(dir)?;
    let seeds = (target.seeds)();
    for (i, s) in seeds.iter().enumerate() {
        std::fs::write(dir.join(format!("seed-{i:03}")), s)?;
    }
    Ok(seeds.len())
}

/// Replays inputs: `--seeds DIR` writes the seeds; paths replay the files (directories: the
/// files in them), calling `each` first; no argument replays the seeds. A failing input panics.
pub fn replay(target: &Target, args: &[PathBuf], mut each: impl FnMut(&Path)) -> Result<String, String> {
    match args {
        [flag, dir] if flag.as_os_str() == "--seeds" => {
            let n =
                write_seeds(target, dir).map_err(|e| format!("cannot write to {}: {e}", dir.display()))?;
            Ok(format!("{n} seeds written to {}", dir.display()))
        }
        [flag, ..] if flag.as_os_str() == "--seeds" => Err("usage: --seeds DIR".into()),
        [] => {
            let seeds = (target.seeds)();
            for s in &seeds {
                (target.check)(s);
            }
            Ok(format!("{} seeds passed", seeds.len()))
        }
        paths => {
            let mut files = Vec::new();
            for p in paths {
                if p.is_dir() {
                    let rd = std::fs::read_dir(p).map_err(|e| format!("cannot list {}: {e}", p.display()))?;
                    let mut in_dir: Vec<PathBuf> = rd
                        .filter_map(|e| e.ok().map(|e| e.path()))
                        .filter(|p| p.is_file())
                        .collect();
                    in_dir.sort();
                    files.extend(in_dir);
                } else {
                    files.push(p.clone());
                }
            }
            for f in &files {
                each(f);
                let data = std::fs::read(f).map_err(|e| format!("cannot read {}: {e}", f.display()))?;
                (target.check)(&data);
            }
            Ok(format!("{} inputs passed", files.len()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
    }

    #[test]
    fn seeds_are_accepted_by_their_parsers() {
        assert!(Superblock::decode(&seeds_superblock()[0], "sb").is_ok());
        let r = &seeds_root()[0];
        assert!(Root::decode(&r[1..], 1, &[3; 16]).is_ok());
        assert_eq!(Catalog::decode(&seeds_catalog()[1]).unwrap(), catalog());
        assert!(Manifest::decode(&seeds_manifest()[0][1..], "m", 256).is_ok());
        let s = &seeds_slot()[0];
        assert!(SlotHeader::decode(&s[12..], 4, 65536).is_some());
    }

    /// A coverage-less mutation loop over every target: bit flips, interesting values,
    /// truncation, extension. The real fuzzing is `cargo xtask fuzz`.
    #[test]
    fn mutated_seeds_never_panic() {
        let mut rng = Rng(0x1234_5678_9abc_def1);
        const SPECIAL: [u32; 8] = [0, 1, 4, 0x7f, 0x80, 0xff, 0xffff, u32::MAX];
        for t in TARGETS {
            for seed in (t.seeds)() {
                (t.check)(&seed);
                for _ in 0..2000 {
                    let mut v = seed.clone();
                    for _ in 0..1 + rng.below(4) {
                        let len = v.len();
                        match rng.below(5) {
                            0 if len > 0 => {
                                let i = rng.below(len);
                                v[i] ^= 1 << rng.below(8);
                            }
                            1 if len >= 4 => {
                                let i = rng.below(len - 3);
                                v[i..i + 4].copy_from_slice(&SPECIAL[rng.below(8)].to_le_bytes());
                            }
                            2 => v.truncate(rng.below(len + 1)),
                            3 => v.extend((0..rng.below(64)).map(|_| rng.next() as u8)),
                            _ => {}
                        }
                    }
                    (t.check)(&v);
                }
            }
        }
    }
}
