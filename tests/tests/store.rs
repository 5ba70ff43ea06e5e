//! vfpoll-store in the test bed (issue 23): a store over two controllers' big namespaces
//! (G and H, 1 GiB each: `cargo xtask test` boots this binary with `--big-ns`), through
//! vfio-pci in both IOMMU modes. The guest formats it, commits checkpoint versions of many
//! entries (one deleted again by keep-last), fills a KV pool past its size (evictions), closes,
//! reopens (the index survives), reads everything back, runs fsck, and drives `vfpoll store`'s
//! commands on the same store. The host check then decodes the image files with the test's own
//! decoder, written from store/FORMAT.md (`vfpoll_tests::store`), independently of the store's
//! reader, and compares every byte with the seeded patterns.

use std::path::Path;

use vfpoll_nvme::{Controller, ControllerOptions, QpairOptions};
use vfpoll_pci::vfio::Container;
use vfpoll_store::device::{Device, NvmeDevice};
use vfpoll_store::{FormatOptions, ReadOptions, Store, StoreError, StoreOptions};
use vfpoll_tests::store::*;
use vfpoll_tests::*;

const MIB: usize = 1 << 20;

/// The entries of each version: name, length. Lengths cross pages and chunks (1 MiB), one is
/// empty, one is a single byte.
const ENTRIES: &[(&str, usize)] = &[
    ("embed.weight", 3 * MIB + 5),
    ("layers.0.attn.wq", 8 * MIB),
    ("layers.0.attn.bias", 1),
    ("empty", 0),
    ("layers.1.mlp.w1", 13 * MIB + 4095),
    ("step", 8),
];
/// KV pool: block size, slots, keys put (more than slots: the oldest are evicted).
const KV: (u32, u64, u64) = (64 << 10, 64, 80);

/// The data of entry `i` of version number `v` (1-based) of checkpoint `cp`.
fn entry_bytes(cp: u64, v: u64, i: usize) -> Vec<u8> {
    Pattern::new(seed(), 1000 + cp * 100 + v * 10 + i as u64).bytes(ENTRIES[i].1)
}

/// The key and data of KV block `k`.
fn kv_block(k: u64) -> (u128, Vec<u8>) {
    let mut p = Pattern::new(seed(), 50_000 + k);
    let key = (p.next_u64() as u128) << 64 | p.next_u64() as u128;
    let len = (KV.0 as usize) - (k as usize % 3) * 1000; // some blocks shorter than the block size
    (key, p.bytes(len))
}

/// G's and H's namespaces as store devices, in one container of this boot's IOMMU mode.
fn devices() -> Vec<Box<dyn Device>> {
    let c = Container::open(mode()).expect("container");
    let (g, dma) =
        Controller::open_first(&c, bdf(NVME_G), ControllerOptions::default()).expect("controller G");
    let h = Controller::open(&c, bdf(NVME_H), dma, ControllerOptions::default()).expect("controller H");
    assert_backend(&c);
    let q = QpairOptions {
        entries: 128,
        ..Default::default()
    };
    let keep = || -> Vec<Box<dyn std::any::Any + Send>> { vec![Box::new(c.clone())] };
    vec![
        Box::new(NvmeDevice::new(&g, 1, &q, NVME_G, keep()).expect("G namespace 1")),
        Box::new(NvmeDevice::new(&h, 1, &q, NVME_H, keep()).expect("H namespace 1")),
    ]
}

fn vfpoll_store(args: &[&str]) -> std::process::Output {
    let specs = [format!("vfio:{NVME_G}/1"), format!("vfio:{NVME_H}/1")];
    let mut a: Vec<&str> = vec!["store", args[0]];
    a.extend(specs.iter().map(|s| s.as_str()));
    a.extend_from_slice(backend_args());
    a.extend_from_slice(&args[1..]);
    std::process::Command::new("vfpoll")
        .args(&a)
        .output()
        .expect("run vfpoll")
}

fn ok(out: std::process::Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

#[test]
#[ignore = "test bed"]
fn guest_store_over_two_controllers() {
    bind_all(&[NVME_G, NVME_H]);
    reserve_hugepages(160);
    let opts = FormatOptions {
        label: "testbed".into(),
        ..FormatOptions::default()
    };
    let store = Store::format_devices(devices(), &opts).expect("format");
    let info = store.info();
    assert_eq!(info.members.len(), 2);
    assert_eq!(
        (info.members[0].block_size, info.members[1].block_size),
        (512, 4096)
    );
    // Three versions of "model" (keep the last two), one of "optimizer".
    let mut ids = Vec::new();
    for v in 1..=3u64 {
        let mut tx = store.begin("model").expect("begin");
        for (i, (name, len)) in ENTRIES.iter().enumerate() {
            tx.put(name, format!("u8[{len}]").as_bytes(), &entry_bytes(0, v, i))
                .expect("put");
        }
        tx.keep_last(2);
        let c = tx.commit().expect("commit");
        assert_eq!(c.entries as usize, ENTRIES.len());
        ids.push(c.version);
        if v == 3 {
            assert_eq!(c.deleted, vec![ids[0]], "keep_last(2) deletes version 1");
        }
    }
    let mut tx = store.begin("optimizer").expect("begin");
    tx.put("adam.m", b"", &entry_bytes(1, 1, 1)).expect("put");
    let opt_id = tx.commit_async().wait_durable().expect("async commit").version;
    // An aborted version leaves nothing.
    let mut tx = store.begin("model").expect("begin");
    tx.put("junk", b"", &[1u8; 100_000]).expect("put");
    tx.abort();
    // KV: more keys than slots.
    let pool = store.create_pool("kv", KV.0, KV.1).expect("pool");
    for chunk in (0..KV.2).collect::<Vec<_>>().chunks(16) {
        let blocks: Vec<(u128, Vec<u8>)> = chunk.iter().map(|&k| kv_block(k)).collect();
        let keys: Vec<u128> = blocks.iter().map(|b| b.0).collect();
        let bufs: Vec<&[u8]> = blocks.iter().map(|b| b.1.as_slice()).collect();
        pool.put_many(&keys, &bufs).expect("put_many");
    }
    pool.sync().expect("sync");
    let stats = pool.stats();
    assert!(stats.evictions >= KV.2 - KV.1, "{stats:?}");
    let held: Vec<u64> = (0..KV.2).filter(|&k| pool.contains(kv_block(k).0)).collect();
    assert!(
        held.len() as u64 <= KV.1 && held.contains(&(KV.2 - 1)),
        "{held:?}"
    );
    drop(pool);
    // A second process cannot open the store while this one has it: VFIO refuses a second
    // open of the controllers before the store's lock file is reached, and the error names
    // this process as the holder.
    let out = vfpoll_store(&["info"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a second open succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        err.contains(&format!("in use by PID {}", std::process::id())),
        "the refusal does not name this process: {err}"
    );
    println!("second open refused: {}", err.trim());
    let uuid = info.uuid.clone();
    drop(store);

    // Reopen: everything committed is there, the KV index is rebuilt from the slot headers.
    let store = Store::open_devices(devices(), &StoreOptions::default()).expect("reopen");
    assert_eq!(store.info().uuid, uuid);
    let model = store.checkpoint("model").expect("model");
    assert_eq!(model.versions.iter().map(|v| v.id).collect::<Vec<_>>(), ids[1..]);
    for (n, &id) in ids[1..].iter().enumerate() {
        let r = store.open_version("model", Some(id)).expect("version");
        for (i, (name, len)) in ENTRIES.iter().enumerate() {
            let e = r.entry(name).expect("entry");
            assert_eq!(
                (e.len as usize, e.meta.clone()),
                (*len, format!("u8[{len}]").into_bytes())
            );
            assert!(
                r.read_to_vec(name).expect("read") == entry_bytes(0, n as u64 + 2, i),
                "{name} v{id}"
            );
        }
        // A range across a chunk boundary, crc on and off.
        let want = entry_bytes(0, n as u64 + 2, 4);
        for verify in [true, false] {
            let mut part = vec![0u8; 2 * MIB + 17];
            r.read_range(
                "layers.1.mlp.w1",
                MIB as u64 - 9,
                &mut part,
                &ReadOptions { verify },
            )
            .expect("range");
            assert!(part == want[MIB - 9..3 * MIB + 8], "range, verify {verify}");
        }
    }
    assert!(matches!(
        store.open_version("model", Some(ids[0])),
        Err(StoreError::NotFound(_))
    ));
    assert!(
        store
            .open_version("model", None)
            .expect("latest")
            .entry("junk")
            .is_err(),
        "aborted entry"
    );
    let pool = store.pool("kv").expect("pool");
    assert_eq!(pool.len(), held.len() as u64);
    let mut buf = vec![0u8; KV.0 as usize];
    for k in 0..KV.2 {
        let (key, data) = kv_block(k);
        let got = pool.get_many(&[key], &mut [&mut buf]).expect("get")[0];
        if held.contains(&k) {
            assert_eq!(got, Some(data.len()), "key {k} was held before the restart");
            assert!(buf[..data.len()] == data[..], "key {k}: data");
        } else {
            assert_eq!(got, None, "evicted key {k} is a miss");
        }
    }
    drop(pool);
    let r = store.fsck().expect("fsck");
    assert!(r.is_clean(), "{:?}", r.findings);
    assert_eq!(r.versions, 3);
    drop(store);

    // The CLI on the same store.
    let info: serde_json::Value =
        serde_json::from_str(&ok(vfpoll_store(&["info", "--json"]), "info")).unwrap();
    assert_eq!(info["uuid"], uuid.as_str());
    assert_eq!(info["checkpoints"], 2);
    let ls: serde_json::Value = serde_json::from_str(&ok(
        vfpoll_store(&["ls", "--json", "--checkpoint", "model"]),
        "ls",
    ))
    .unwrap();
    assert_eq!(ls["version"], ids[2]);
    assert_eq!(ls["entries"].as_array().unwrap().len(), ENTRIES.len());
    let dir = std::env::temp_dir().join("store-cli");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("wq");
    ok(
        vfpoll_store(&[
            "get",
            "--checkpoint",
            "model",
            "-o",
            out.to_str().unwrap(),
            "--",
            "layers.0.attn.wq",
        ]),
        "get",
    );
    assert!(std::fs::read(&out).unwrap() == entry_bytes(0, 3, 1), "CLI get");
    let file = dir.join("cli.bin");
    std::fs::write(&file, Pattern::new(seed(), 77).bytes(5 * MIB + 3)).unwrap();
    ok(
        vfpoll_store(&[
            "put",
            "--checkpoint",
            "cli",
            "--",
            &format!("data={}", file.display()),
        ]),
        "put",
    );
    let fsck: serde_json::Value =
        serde_json::from_str(&ok(vfpoll_store(&["fsck", "--json"]), "fsck")).unwrap();
    assert_eq!(fsck["clean"], true, "{fsck}");
    let mut lines = vec![
        ("mode".to_string(), mode_name().to_string()),
        ("uuid".into(), uuid),
        ("model".into(), format!("{},{}", ids[1], ids[2])),
        ("optimizer".into(), opt_id.to_string()),
    ];
    lines.push((
        "kv_held".into(),
        held.iter().map(|k| k.to_string()).collect::<Vec<_>>().join(","),
    ));
    write_manifest("store.txt", &lines);
}

/// Decodes G's and H's images on the host, independently of the store's reader, and checks
/// every committed byte against the patterns.
#[test]
#[ignore = "test bed"]
fn host_check_store_over_two_controllers() {
    let m = read_manifest("store.txt");
    assert_eq!(manifest_get(&m, "mode"), run_mode());
    let paths: Vec<_> = BIG_IMAGES.iter().map(|f| run_dir().join(f)).collect();
    // Members are found by their superblocks: name them in the other order.
    let img = Image::open(&[paths[1].as_path(), paths[0].as_path()]);
    let uuid = manifest_get(&m, "uuid").replace('-', "");
    let hex: String = img.supers[0].uuid.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, uuid, "store UUID");
    assert_eq!(img.supers[0].label, "testbed");
    assert_eq!(
        (img.supers[0].block_size, img.supers[1].block_size),
        (512, 4096),
        "G is member 0"
    );
    let names: Vec<&str> = img.checkpoints.iter().map(|c| c.0.as_str()).collect();
    assert_eq!(names.len(), 3, "{names:?}");
    let find = |n: &str| {
        &img.checkpoints
            .iter()
            .find(|c| c.0 == n)
            .unwrap_or_else(|| panic!("no {n}"))
            .1
    };
    let model = find("model");
    let ids: Vec<String> = model.iter().map(|v| v.id.to_string()).collect();
    assert_eq!(
        ids.join(","),
        manifest_get(&m, "model"),
        "model's versions (the first deleted)"
    );
    for (n, v) in model.iter().enumerate() {
        assert_eq!(v.entries.len(), ENTRIES.len());
        for (i, (name, len)) in ENTRIES.iter().enumerate() {
            let e = &v.entries[i];
            assert_eq!((e.0.as_str(), e.2 as usize), (*name, *len));
            assert_eq!(e.1, format!("u8[{len}]").into_bytes(), "meta");
            assert!(
                img.entry_data(&e.3) == entry_bytes(0, n as u64 + 2, i),
                "model v{} {name}",
                v.id
            );
        }
    }
    let opt = find("optimizer");
    assert_eq!(opt[0].id.to_string(), manifest_get(&m, "optimizer"));
    assert!(img.entry_data(&opt[0].entries[0].3) == entry_bytes(1, 1, 1));
    let cli = find("cli");
    assert!(
        img.entry_data(&cli[0].entries[0].3) == Pattern::new(seed(), 77).bytes(5 * MIB + 3),
        "CLI put"
    );
    // Extents of one large entry are striped over both members.
    let chunk_pages = img.supers[0].chunk_size as u64 / 4096;
    let members: std::collections::HashSet<u64> = model[1].entries[4]
        .3
        .iter()
        .map(|e| (e.0 / chunk_pages) % 2)
        .collect();
    assert_eq!(members.len(), 2, "a 13 MiB entry spans both namespaces");
    // No two objects share a page.
    let mut pages = std::collections::HashSet::new();
    for (_, versions) in &img.checkpoints {
        for v in versions {
            for e in &v.entries {
                for &(p, l, _) in &e.3 {
                    for q in p..p + (l as u64).div_ceil(4096) {
                        assert!(pages.insert(q), "logical page {q} used twice");
                    }
                }
            }
        }
    }
    // KV: exactly the blocks the guest held, with their data.
    let pool = img.pools.iter().find(|p| p.name == "kv").expect("pool kv");
    assert_eq!((pool.block_size, pool.slots), (KV.0, KV.1));
    let blocks = img.pool_blocks(pool);
    let held: Vec<u64> = manifest_get(&m, "kv_held")
        .split(',')
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(blocks.len(), held.len(), "occupied slots");
    for k in held {
        let (key, data) = kv_block(k);
        assert!(blocks.get(&key) == Some(&data), "KV block {k}");
    }
}

/// The decoder itself refuses what FORMAT.md says a reader must refuse: a torn superblock copy
/// falls back to the other, a damaged extent fails its crc.
#[test]
fn decoder_checks_crcs() {
    let dir = std::env::temp_dir().join(format!("vfpoll-store-decoder-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (a, b) = (dir.join("a.img"), dir.join("b.img"));
    let specs = [
        format!("file:{}?size=8M", a.display()),
        format!("file:{}?size=8M", b.display()),
    ];
    let mut opts = FormatOptions::default();
    opts.store.lock_dir = Some(dir.clone());
    opts.store.allow_buffered_io = true;
    let store = Store::format(&specs, &opts).expect("format");
    let mut tx = store.begin("c").unwrap();
    let data = Pattern::new(5, 5).bytes(3 * MIB + 1);
    tx.put("x", b"m", &data).unwrap();
    tx.commit().unwrap();
    drop(store);
    let img = Image::open(&[Path::new(&b), Path::new(&a)]);
    let e = &img.checkpoints[0].1[0].entries[0];
    assert!(img.entry_data(&e.3) == data);
    // Damage the first extent's first byte on the member that holds it.
    let p = e.3[0].0;
    let cp = img.supers[0].chunk_size as u64 / 4096;
    let file = if (p / cp).is_multiple_of(2) { &a } else { &b };
    let off = (1 << 20) + (p / cp / 2) * img.supers[0].chunk_size as u64 + (p % cp) * 4096;
    let mut bytes = std::fs::read(file).unwrap();
    bytes[off as usize] ^= 1;
    std::fs::write(file, &bytes).unwrap();
    let img = Image::open(&[Path::new(&a), Path::new(&b)]);
    let ext = img.checkpoints[0].1[0].entries[0].3.clone();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| img.entry_data(&ext)));
    assert!(r.is_err(), "a damaged extent must fail its crc");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// libvfpoll's store API: the C example `examples/c/store.c` (built by `cargo xtask test` into
/// `target/debug/vfpoll-c-store`, plain and with ASan/UBSan) over controllers A and B: format,
/// commit, read back, KV batches, fsck, reopen, a second open refused. In no-IOMMU mode it
/// passes `-n` (VFPOLL_IOMMU_NONE: the library's own opener); otherwise VFPOLL_IOMMU_AUTO (the
/// store's).
#[test]
#[ignore = "test bed"]
fn guest_store_c_example() {
    bind_all(&[NVME_A, NVME_B]);
    reserve_hugepages(160);
    for exe in ["vfpoll-c-store", "vfpoll-c-store-asan"] {
        let mut cmd = std::process::Command::new(exe);
        if mode_name() == "noiommu" {
            cmd.arg("-n");
        }
        let out = cmd
            .args([format!("vfio:{NVME_A}/1"), format!("vfio:{NVME_B}/1")])
            .output()
            .unwrap_or_else(|e| {
                panic!("{exe}: {e} (`cargo xtask test` builds the C examples into target/debug)")
            });
        let stdout = String::from_utf8_lossy(&out.stdout);
        println!(
            "{exe}: {}\n{stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{exe} failed");
        assert!(
            stdout.contains("checkpoint model 1 5242888 3") && stdout.ends_with("ok\n"),
            "{stdout}"
        );
        assert!(stdout.contains("32 hits, 1 misses"), "{stdout}");
    }
}
