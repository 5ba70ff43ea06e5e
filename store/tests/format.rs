//! The reader against bytes built by hand from FORMAT.md, and the writer's bytes decoded by
//! hand: neither side uses the crate's encoders or decoders.

mod common;

use common::{bytes, fopts, opts};
use vfpoll_store::device::{Device, MemDevice};
use vfpoll_store::Store;

const PAGE: usize = 4096;
const MIB: usize = 1 << 20;

fn crc(b: &[u8]) -> u32 {
    crc32c::crc32c(b)
}
fn p16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}
fn p32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn p64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
fn g32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn g64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Member byte offset of logical page `p` (FORMAT.md §2).
fn locate(p: u64, members: u64, chunk: u64) -> (usize, usize) {
    let cp = chunk / PAGE as u64;
    let c = p / cp;
    (
        (c % members) as usize,
        (MIB as u64 + (c / members) * chunk + (p % cp) * PAGE as u64) as usize,
    )
}

/// A blob (§5): header + body, padded to pages; returns (bytes, length, crc of the blob).
fn blob(magic: &[u8; 8], id: u64, body: &[u8]) -> (Vec<u8>, u32, u32) {
    let len = 32 + body.len();
    let mut b = vec![0u8; len.next_multiple_of(PAGE)];
    b[0..8].copy_from_slice(magic);
    p16(&mut b, 8, 1);
    p32(&mut b, 12, len as u32);
    p64(&mut b, 16, id);
    p32(&mut b, 24, crc(body));
    let h = crc(&b[..28]);
    p32(&mut b, 28, h);
    b[32..len].copy_from_slice(body);
    let c = crc(&b[..len]);
    (b, len as u32, c)
}

#[test]
fn the_reader_opens_a_store_built_by_hand() {
    let (chunk, size) = (64 << 10, 4 * MIB);
    let mut img = vec![0u8; size];
    let uuid = [0x42u8; 16];
    // Superblock (§3), both copies.
    let mut sb = vec![0u8; PAGE];
    sb[0..8].copy_from_slice(b"VFPSTORE");
    p16(&mut sb, 8, 1);
    sb[16..32].copy_from_slice(&uuid);
    p32(&mut sb, 32, 0);
    p32(&mut sb, 36, 1);
    p32(&mut sb, 40, 4096);
    p32(&mut sb, 44, chunk as u32);
    p64(&mut sb, 48, ((size - MIB) / chunk) as u64);
    p64(&mut sb, 56, MIB as u64);
    p32(&mut sb, 64, 512);
    p64(&mut sb, 72, size as u64);
    sb[88..93].copy_from_slice(b"hand!");
    let c = crc(&sb[..4092]);
    p32(&mut sb, 4092, c);
    img[0..PAGE].copy_from_slice(&sb);
    img[PAGE..2 * PAGE].copy_from_slice(&sb);
    // One entry of 70000 bytes in two extents: pages 16..32 (a whole chunk) and 40..42.
    let data = bytes(7, 70_000);
    let (x1, x2) = (&data[..65536], &data[65536..]);
    let loc = |p: u64| locate(p, 1, chunk as u64).1;
    img[loc(16)..loc(16) + 65536].copy_from_slice(x1);
    img[loc(40)..loc(40) + x2.len()].copy_from_slice(x2);
    // Manifest (§5.2) at page 8, version id 5.
    let mut m = Vec::new();
    m.extend_from_slice(&5u64.to_le_bytes());
    m.extend_from_slice(&2u16.to_le_bytes());
    m.extend_from_slice(b"ck");
    m.extend_from_slice(&1u32.to_le_bytes());
    m.extend_from_slice(&1u16.to_le_bytes());
    m.extend_from_slice(b"w");
    m.extend_from_slice(&3u32.to_le_bytes());
    m.extend_from_slice(b"f32");
    m.extend_from_slice(&70_000u64.to_le_bytes());
    m.extend_from_slice(&2u32.to_le_bytes());
    for (page, x) in [(16u64, x1), (40, x2)] {
        m.extend_from_slice(&page.to_le_bytes());
        m.extend_from_slice(&(x.len() as u32).to_le_bytes());
        m.extend_from_slice(&crc(x).to_le_bytes());
    }
    let (mb, mlen, mcrc) = blob(b"VFPMANIF", 5, &m);
    img[loc(8)..loc(8) + mb.len()].copy_from_slice(&mb);
    // Catalog (§5.1) at page 2, for generation 7.
    let mut c = Vec::new();
    c.extend_from_slice(&1u32.to_le_bytes());
    c.extend_from_slice(&2u16.to_le_bytes());
    c.extend_from_slice(b"ck");
    c.extend_from_slice(&1u32.to_le_bytes());
    c.extend_from_slice(&5u64.to_le_bytes());
    c.extend_from_slice(&123u64.to_le_bytes());
    c.extend_from_slice(&70_000u64.to_le_bytes());
    c.extend_from_slice(&1u32.to_le_bytes());
    c.extend_from_slice(&8u64.to_le_bytes());
    c.extend_from_slice(&mlen.to_le_bytes());
    c.extend_from_slice(&mcrc.to_le_bytes());
    c.extend_from_slice(&0u32.to_le_bytes()); // no pools
    let (cb, clen, ccrc) = blob(b"VFPCATLG", 7, &c);
    img[loc(2)..loc(2) + cb.len()].copy_from_slice(&cb);
    // Root generation 7 in slot 1 (§4); slot 0 holds an older generation that must lose.
    let root = |generation: u64| {
        let mut r = vec![0u8; PAGE];
        r[0..8].copy_from_slice(b"VFPROOT\0");
        p16(&mut r, 8, 1);
        r[16..32].copy_from_slice(&uuid);
        p64(&mut r, 32, generation);
        p64(&mut r, 40, 2);
        p32(&mut r, 48, clen);
        p32(&mut r, 52, ccrc);
        p64(&mut r, 64, 9);
        let c = crc(&r[..4092]);
        p32(&mut r, 4092, c);
        r
    };
    img[0x3000..0x4000].copy_from_slice(&root(7));
    img[0x2000..0x3000].copy_from_slice(&root(6));
    let dir = tempfile::tempdir().unwrap();
    let dev = MemDevice::from_image(img.clone(), 512, true);
    let store = Store::open_devices(vec![Box::new(dev) as Box<dyn Device>], &opts(dir.path())).unwrap();
    let info = store.info();
    assert_eq!(
        (info.generation, info.label.as_str(), info.uuid.as_str()),
        (7, "hand!", "42424242-4242-4242-4242-424242424242")
    );
    let r = store.open_version("ck", None).unwrap();
    assert_eq!(r.version(), 5);
    assert_eq!(r.entry("w").unwrap().meta, b"f32");
    assert_eq!(r.read_to_vec("w").unwrap(), data);
    assert!(store.fsck().unwrap().is_clean());
    // Free space is what the root does not reach: catalog 1 page, manifest 1, extents 16 + 2.
    assert_eq!(info.free, info.capacity - 20 * PAGE as u64);
    drop(r);
    drop(store);
    // A generation in the wrong slot is refused; the older root then wins, and its catalog
    // (written for generation 7) is refused by name.
    let mut bad = img.clone();
    bad[0x3000..0x4000].copy_from_slice(&root(8));
    let dev = MemDevice::from_image(bad, 512, true);
    let e = Store::open_devices(vec![Box::new(dev) as Box<dyn Device>], &opts(dir.path())).unwrap_err();
    assert!(
        e.to_string().contains("catalog") && e.to_string().contains("generation 7"),
        "{e}"
    );
}

#[test]
fn the_writers_bytes_decode_by_hand() {
    let dir = tempfile::tempdir().unwrap();
    let devs: Vec<MemDevice> = (0..2).map(|_| MemDevice::new(8 << 20, 512, true)).collect();
    let handles: Vec<_> = devs.iter().map(MemDevice::handle).collect();
    let boxed = devs.into_iter().map(|d| Box::new(d) as Box<dyn Device>).collect();
    let store = Store::format_devices(boxed, &fopts(dir.path())).unwrap();
    let data = bytes(3, 200_000);
    let mut tx = store.begin("model").unwrap();
    tx.put("weights", b"meta", &data).unwrap();
    tx.commit().unwrap();
    drop(store);
    let imgs: Vec<Vec<u8>> = handles.iter().map(|h| h.durable_image()).collect();
    for (i, img) in imgs.iter().enumerate() {
        for copy in 0..2 {
            let sb = &img[copy * PAGE..(copy + 1) * PAGE];
            assert_eq!(&sb[0..8], b"VFPSTORE");
            assert_eq!(g32(sb, 4092), crc(&sb[..4092]));
            assert_eq!((g32(sb, 32), g32(sb, 36), g32(sb, 44)), (i as u32, 2, 64 << 10));
        }
    }
    let chunk = g32(&imgs[0], 44) as u64;
    // The newer valid root.
    let roots: Vec<&[u8]> = (0..2)
        .map(|s| &imgs[0][0x2000 + s * PAGE..0x3000 + s * PAGE])
        .collect();
    let root = roots
        .iter()
        .filter(|r| &r[0..8] == b"VFPROOT\0" && g32(r, 4092) == crc(&r[..4092]))
        .max_by_key(|r| g64(r, 32))
        .unwrap();
    assert_eq!(g64(root, 32), 2, "format wrote generation 1, the commit 2");
    let read = |page: u64, len: usize| -> Vec<u8> {
        let mut out = Vec::with_capacity(len);
        let mut p = page;
        while out.len() < len {
            let (m, off) = locate(p, 2, chunk);
            let n = (len - out.len()).min(PAGE);
            out.extend_from_slice(&imgs[m][off..off + n]);
            p += 1;
        }
        out
    };
    let (cpage, clen, ccrc) = (g64(root, 40), g32(root, 48) as usize, g32(root, 52));
    let cat = read(cpage, clen);
    assert_eq!(crc(&cat), ccrc);
    assert_eq!(&cat[0..8], b"VFPCATLG");
    let body = &cat[32..];
    // One checkpoint "model" with one version.
    assert_eq!(g32(body, 0), 1);
    assert_eq!(&body[6..11], b"model");
    let v = &body[11 + 4..];
    let (mpage, mlen, mcrc) = (g64(v, 28), g32(v, 36) as usize, g32(v, 40));
    let man = read(mpage, mlen);
    assert_eq!(crc(&man), mcrc);
    assert_eq!(&man[0..8], b"VFPMANIF");
    let b = &man[32..];
    let name_at = 8 + 2 + 5 + 4;
    assert_eq!(&b[name_at + 2..name_at + 9], b"weights");
    let mut at = name_at + 9;
    assert_eq!(g32(b, at), 4);
    at += 4 + 4;
    assert_eq!(g64(b, at), 200_000);
    let nx = g32(b, at + 8) as usize;
    at += 12;
    let mut got = Vec::new();
    let mut members = std::collections::HashSet::new();
    for _ in 0..nx {
        let (page, len, c) = (g64(b, at), g32(b, at + 8) as usize, g32(b, at + 12));
        members.insert(locate(page, 2, chunk).0);
        let x = read(page, len);
        assert_eq!(crc(&x), c);
        got.extend_from_slice(&x);
        at += 16;
    }
    assert_eq!(got, data);
    assert_eq!(
        members.len(),
        2,
        "a 200 kB entry with 64 KiB chunks is striped over both members"
    );
}
