//! Corruption: bytes flipped in every kind of object. A damaged object is a clear error that
//! names it, or a miss (KV), never a panic and never wrong data.

mod common;

use common::{bytes, mem_store, reopen};
use vfpoll_store::device::MemHandle;
use vfpoll_store::{ReadOptions, StoreError};

const PAGE: u64 = 4096;
const CHUNK: u64 = 64 << 10;

fn g32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn g64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// A one-member store with a checkpoint (2 versions) and a KV pool; its images' handles.
struct Fixture {
    dir: tempfile::TempDir,
    handles: Vec<MemHandle>,
    data: Vec<u8>,
    kv: Vec<(u128, Vec<u8>)>,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let (store, handles) = mem_store(dir.path(), 1, 8 << 20);
    let data = bytes(1, 150_000);
    for v in 0..2 {
        let mut tx = store.begin("ck").unwrap();
        tx.put("w", b"m", &bytes(v + 10, 5000)).unwrap();
        tx.put("big", b"", &data).unwrap();
        tx.commit().unwrap();
    }
    let pool = store.create_pool("kv", 8192, 16).unwrap();
    let kv: Vec<(u128, Vec<u8>)> = (0..4).map(|k| (k as u128 + 100, bytes(k + 50, 8000))).collect();
    let keys: Vec<u128> = kv.iter().map(|x| x.0).collect();
    let vals: Vec<&[u8]> = kv.iter().map(|x| x.1.as_slice()).collect();
    pool.put_many(&keys, &vals).unwrap();
    pool.sync().unwrap();
    drop(pool);
    drop(store);
    Fixture {
        dir,
        handles,
        data,
        kv,
    }
}

/// The newest valid root of the image: (slot, catalog page, catalog length).
fn root(img: &[u8]) -> (usize, u64, usize) {
    (0..2)
        .filter_map(|s| {
            let r = &img[0x2000 + s * 4096..0x3000 + s * 4096];
            (&r[0..8] == b"VFPROOT\0" && g32(r, 4092) == crc32c::crc32c(&r[..4092]))
                .then(|| (s, g64(r, 32), g64(r, 40), g32(r, 48)))
        })
        .max_by_key(|r| r.1)
        .map(|(s, _, p, l)| (s, p, l as usize))
        .unwrap()
}

/// Byte offset of logical page `p` on the single member.
fn at(p: u64) -> u64 {
    (1 << 20) + (p / (CHUNK / PAGE)) * CHUNK + (p % (CHUNK / PAGE)) * PAGE
}

/// The catalog body, and the latest version's manifest (page, length) and pool header page.
fn layout(img: &[u8]) -> (u64, u64, u64) {
    let (_, cpage, clen) = root(img);
    let cat = &img[at(cpage) as usize..at(cpage) as usize + clen];
    let b = &cat[32..];
    // checkpoint "ck": u32 count, u16 len, "ck", u32 versions, then 2 versions of 44 bytes.
    let v2 = 4 + 2 + 2 + 4 + 44;
    let mpage = g64(b, v2 + 28);
    // pools after the checkpoints: u32 count, u16 len, "kv", id, block, reserved, slots, header page
    let p = 4 + 2 + 2 + 4 + 88 + 4 + 2 + 2;
    let hpage = g64(b, p + 8 + 4 + 4 + 8);
    (cpage, mpage, hpage)
}

fn flip(f: &Fixture, offset: u64) -> Vec<MemHandle> {
    let devs: Vec<MemHandle> = f.handles.iter().map(|h| h.restart().handle()).collect();
    devs[0].flip(offset, 0x10);
    devs
}

#[test]
fn a_damaged_superblock_copy_is_survived_and_both_are_an_error() {
    let f = fixture();
    let hs = flip(&f, 100);
    let (s, _) = reopen(f.dir.path(), &hs);
    let s = s.unwrap();
    let rep = s.fsck().unwrap();
    assert_eq!(rep.findings.len(), 1, "{:?}", rep.findings);
    assert!(
        rep.findings[0].object.contains("superblock A"),
        "{:?}",
        rep.findings
    );
    drop(s);
    hs[0].flip(4096 + 100, 0x10);
    let e = reopen(f.dir.path(), &hs).0.unwrap_err();
    assert!(matches!(e, StoreError::Corrupt(_)), "{e}");
    assert!(
        e.to_string().contains("superblock") && e.to_string().contains("both copies"),
        "{e}"
    );
}

#[test]
fn a_damaged_root_falls_back_or_fails_by_name_and_both_are_an_error() {
    let f = fixture();
    let img = f.handles[0].durable_image();
    let (slot, _, _) = root(&img);
    let hs = flip(&f, 0x2000 + slot as u64 * 4096 + 40);
    // The older root wins; its catalog was given back after the newer root became durable, so
    // it may be gone: then open names the catalog. Either way nothing wrong is read.
    match reopen(f.dir.path(), &hs).0 {
        Ok(s) => {
            for c in s.checkpoints() {
                for v in c.versions {
                    let r = s.open_version(&c.name, Some(v.id)).unwrap();
                    for e in r.entries() {
                        match r.read_to_vec(&e.name) {
                            Ok(d) => assert!(d == f.data || d.len() == 5000, "{}", e.name),
                            Err(e) => assert!(matches!(e, StoreError::Checksum { .. }), "{e}"),
                        }
                    }
                }
            }
        }
        Err(e) => assert!(
            e.to_string().contains("catalog") || e.to_string().contains("manifest"),
            "{e}"
        ),
    }
    hs[0].flip(0x2000 + (1 - slot as u64) * 4096 + 40, 0x10);
    let e = reopen(f.dir.path(), &hs).0.unwrap_err();
    assert!(e.to_string().contains("no valid root"), "{e}");
}

#[test]
fn damaged_catalog_and_manifest_are_errors_naming_them() {
    let f = fixture();
    let (cpage, mpage, _) = layout(&f.handles[0].durable_image());
    for (page, off, name) in [
        (cpage, 40, "catalog"),
        (cpage, 3, "catalog"),
        (mpage, 60, "manifest"),
        (mpage, 9, "manifest"),
    ] {
        let hs = flip(&f, at(page) + off);
        let e = reopen(f.dir.path(), &hs).0.unwrap_err();
        assert!(matches!(e, StoreError::Corrupt(_)), "{e}");
        assert!(e.to_string().contains(name), "{name}: {e}");
    }
}

#[test]
fn a_damaged_extent_fails_its_read_by_name_and_fsck_reports_it() {
    let f = fixture();
    let (s, _) = reopen(f.dir.path(), &f.handles);
    let s = s.unwrap();
    // Find the latest version's "big" entry's second extent through a range read's error.
    let pages: Vec<u64> = {
        let img = f.handles[0].durable_image();
        let (_, mpage, _) = layout(&img);
        let (_, _, _) = root(&img);
        let m = &img[at(mpage) as usize..];
        let len = g32(m, 12) as usize;
        let b = &m[32..len];
        // version id, "ck", 2 entries: "w" (meta "m", 5000 bytes, 1 extent) then "big".
        let mut o = 8 + 2 + 2 + 4;
        o += 2 + 1 + 4 + 1 + 8;
        let nx = g32(b, o) as usize;
        o += 4 + nx * 16;
        o += 2 + 3 + 4 + 8;
        let nx = g32(b, o) as usize;
        (0..nx).map(|i| g64(b, o + 4 + i * 16)).collect()
    };
    drop(s);
    let hs = flip(&f, at(pages[1]) + 77);
    let (s, _) = reopen(f.dir.path(), &hs);
    let s = s.unwrap();
    let r = s.open_version("ck", None).unwrap();
    let e = r.read_to_vec("big").unwrap_err();
    assert!(matches!(e, StoreError::Checksum { .. }), "{e}");
    assert!(e.to_string().contains("\"big\""), "{e}");
    // A range inside the first extent is fine; one touching the second is refused.
    let mut part = vec![0u8; 1000];
    r.read_range("big", 10, &mut part, &ReadOptions::default())
        .unwrap();
    assert_eq!(part, f.data[10..1010]);
    assert!(r
        .read_range("big", 65536 + 10, &mut part, &ReadOptions::default())
        .is_err());
    // Unverified, the caller asked for the bytes as they are.
    r.read_range("big", 65536 + 10, &mut part, &ReadOptions { verify: false })
        .unwrap();
    let rep = s.fsck().unwrap();
    assert_eq!(rep.findings.len(), 1, "{:?}", rep.findings);
    assert!(rep.findings[0].object.contains("big"), "{:?}", rep.findings);
}

#[test]
fn damaged_kv_headers_and_blocks_are_misses() {
    let f = fixture();
    let (_, _, hpage) = layout(&f.handles[0].durable_image());
    for target in ["header", "data"] {
        let (s, _) = reopen(f.dir.path(), &f.handles);
        let s = s.unwrap();
        // Which slot holds key 100? Its header is the one whose key field says so.
        let img = f.handles[0].durable_image();
        let table = &img[at(hpage) as usize..at(hpage) as usize + 4096];
        let slot = (0..16)
            .find(|i| {
                u128::from_le_bytes(table[i * 64 + 16..i * 64 + 32].try_into().unwrap()) == 100
                    && &table[i * 64..i * 64 + 4] == b"VFKV"
            })
            .unwrap();
        let pool_rec = s.pools().into_iter().next().unwrap();
        drop(s);
        let data_page = {
            // Data region follows from the catalog: slot i at data page + 2 i.
            let (_, cpage, clen) = root(&img);
            let cat = &img[at(cpage) as usize..at(cpage) as usize + clen];
            let b = &cat[32..];
            let p = 4 + 2 + 2 + 4 + 88 + 4 + 2 + 2;
            assert_eq!(g64(b, p), pool_rec.id);
            g64(b, p + 8 + 4 + 4 + 8 + 8)
        };
        let off = match target {
            "header" => at(hpage) + slot as u64 * 64 + 20,
            _ => at(data_page + slot as u64 * 2) + 300,
        };
        let hs = flip(&f, off);
        let (s, _) = reopen(f.dir.path(), &hs);
        let s = s.unwrap();
        let pool = s.pool("kv").unwrap();
        let keys: Vec<u128> = f.kv.iter().map(|x| x.0).collect();
        let mut out = vec![vec![0u8; 8192]; keys.len()];
        let mut bufs: Vec<&mut [u8]> = out.iter_mut().map(|v| v.as_mut_slice()).collect();
        let hits = pool.get_many(&keys, &mut bufs).unwrap();
        assert_eq!(hits[0], None, "{target}: the damaged block is a miss");
        for i in 1..keys.len() {
            assert_eq!(hits[i], Some(8000), "{target}");
            assert_eq!(&out[i][..8000], &f.kv[i].1[..]);
        }
        if target == "data" {
            assert_eq!(pool.stats().bad_blocks, 1);
        }
    }
}
