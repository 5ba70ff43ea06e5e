//! Checkpoints on memory devices and on files through io_uring: round trips, versions, pins,
//! readers during a save, a full store, two opens.

mod common;

use common::{bytes, fopts, mem_store, opts, reopen};
use vfpoll_store::{ReadOptions, Store, StoreError};

#[test]
fn round_trip_over_three_members_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let (store, handles) = mem_store(dir.path(), 3, 16 << 20);
    let info = store.info();
    assert_eq!(info.members.len(), 3);
    assert_eq!(info.generation, 1);
    let tensors: Vec<(String, Vec<u8>)> = (0..20)
        .map(|i| {
            (
                format!("t{i}"),
                bytes(i, [0, 1, 4095, 4096, 65537, 300_000][i as usize % 6]),
            )
        })
        .collect();
    let mut tx = store.begin("m").unwrap();
    for (n, d) in &tensors {
        tx.put(n, n.as_bytes(), d).unwrap();
    }
    assert!(matches!(tx.put("t0", b"", b"x"), Err(StoreError::Exists(_))));
    let c = tx.commit().unwrap();
    assert_eq!(c.entries, 20);
    assert_eq!(store.info().generation, 2);
    // Every member got data (striping).
    let before: Vec<u64> = handles.iter().map(|h| h.ops()).collect();
    let r = store.open_version("m", None).unwrap();
    for (n, d) in &tensors {
        assert_eq!(&r.read_to_vec(n).unwrap(), d, "{n}");
        assert_eq!(r.entry(n).unwrap().meta, n.as_bytes());
    }
    let after: Vec<u64> = handles.iter().map(|h| h.ops()).collect();
    assert!(
        before.iter().zip(&after).all(|(b, a)| a > b),
        "reads went to every member: {before:?} {after:?}"
    );
    // Ranges, verified or not, at every awkward offset.
    let big = &tensors[5].1;
    for (off, len) in [
        (0, 1),
        (1, 4096),
        (4095, 2),
        (65535, 65538),
        (299_999, 1),
        (70_000, 100_000),
    ] {
        for verify in [true, false] {
            let mut dst = vec![0u8; len];
            r.read_range("t5", off as u64, &mut dst, &ReadOptions { verify })
                .unwrap();
            assert_eq!(&dst[..], &big[off..off + len], "{off}+{len} verify={verify}");
        }
    }
    assert!(r
        .read_range("t5", 299_999, &mut [0u8; 2], &ReadOptions::default())
        .is_err());
    drop(r);
    drop(store);
    let (store, _) = reopen(dir.path(), &handles);
    let store = store.unwrap();
    let r = store.open_version("m", Some(c.version)).unwrap();
    for (n, d) in &tensors {
        assert_eq!(&r.read_to_vec(n).unwrap(), d);
    }
    assert!(store.fsck().unwrap().is_clean());
}

#[test]
fn versions_keep_last_and_pins() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _h) = mem_store(dir.path(), 1, 16 << 20);
    let free0 = store.info().free;
    let mut ids = Vec::new();
    for v in 0..4u64 {
        let mut tx = store.begin("ck").unwrap();
        tx.put("w", b"", &bytes(v, 200_000)).unwrap();
        ids.push(tx.commit().unwrap().version);
    }
    let pinned = store.open_version("ck", Some(ids[0])).unwrap();
    let deleted = store.keep_last("ck", 2).unwrap();
    assert_eq!(deleted, vec![ids[0], ids[1]]);
    assert_eq!(store.checkpoint("ck").unwrap().versions.len(), 2);
    assert!(matches!(
        store.open_version("ck", Some(ids[1])),
        Err(StoreError::NotFound(_))
    ));
    // The pinned, deleted version still reads: its space is not reused while pinned.
    let mut tx = store.begin("other").unwrap();
    tx.put("x", b"", &bytes(99, 1_000_000)).unwrap();
    tx.commit().unwrap();
    assert_eq!(pinned.read_to_vec("w").unwrap(), bytes(0, 200_000));
    drop(pinned);
    let mut tx = store.begin("ck").unwrap();
    tx.put("w", b"", &bytes(9, 1000)).unwrap();
    tx.keep_last(1);
    let c = tx.commit().unwrap();
    assert_eq!(c.deleted, vec![ids[2], ids[3]]);
    store.delete_checkpoint("other").unwrap();
    store.delete_checkpoint("ck").unwrap();
    assert!(store.checkpoints().is_empty());
    assert_eq!(store.info().free, free0, "every page came back");
    assert!(store.fsck().unwrap().is_clean());
}

#[test]
fn readers_during_a_save_see_the_old_version() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _h) = mem_store(dir.path(), 2, 32 << 20);
    let mut tx = store.begin("m").unwrap();
    tx.put("w", b"", &bytes(1, 500_000)).unwrap();
    let v1 = tx.commit().unwrap().version;
    let mut tx = store.begin("m").unwrap();
    tx.put("w", b"", &bytes(2, 500_000)).unwrap();
    // Not committed: readers see version 1, from another thread too.
    let s2 = store.clone();
    let t = std::thread::spawn(move || {
        let r = s2.open_version("m", None).unwrap();
        (r.version(), r.read_to_vec("w").unwrap())
    });
    let (v, d) = t.join().unwrap();
    assert_eq!((v, d), (v1, bytes(1, 500_000)));
    let old = store.open_version("m", None).unwrap();
    let h = tx.commit_async();
    h.wait_staged().unwrap();
    let c = h.wait_durable().unwrap();
    assert_eq!(
        old.read_to_vec("w").unwrap(),
        bytes(1, 500_000),
        "a pinned reader keeps its version"
    );
    assert_eq!(store.open_version("m", None).unwrap().version(), c.version);
    // An aborted transaction leaves nothing.
    let free = store.info().free;
    let mut tx = store.begin("m").unwrap();
    tx.put("w", b"", &bytes(3, 100_000)).unwrap();
    tx.abort();
    assert_eq!(store.info().free, free);
    assert_eq!(store.checkpoint("m").unwrap().versions.len(), 2);
}

#[test]
fn a_full_store_is_a_clear_error_and_keeps_what_was_committed() {
    let dir = tempfile::tempdir().unwrap();
    let (store, h) = mem_store(dir.path(), 1, 4 << 20);
    let mut tx = store.begin("m").unwrap();
    tx.put("a", b"", &bytes(1, 1 << 20)).unwrap();
    tx.commit().unwrap();
    let mut tx = store.begin("m").unwrap();
    tx.put("b", b"", &bytes(2, 1 << 20)).unwrap();
    let e = tx.put("c", b"", &bytes(3, 2 << 20)).unwrap_err();
    assert!(matches!(e, StoreError::Full { .. }), "{e}");
    assert!(e.to_string().contains("full"), "{e}");
    drop(tx);
    assert_eq!(
        store.open_version("m", None).unwrap().read_to_vec("a").unwrap(),
        bytes(1, 1 << 20)
    );
    drop(store);
    let (store, _) = reopen(dir.path(), &h);
    let store = store.unwrap();
    assert_eq!(store.checkpoint("m").unwrap().versions.len(), 1);
    assert!(store.fsck().unwrap().is_clean());
}

#[test]
fn a_second_open_is_refused_with_the_holders_pid() {
    let dir = tempfile::tempdir().unwrap();
    let (store, h) = mem_store(dir.path(), 1, 4 << 20);
    let (again, _) = reopen(dir.path(), &h);
    match again {
        Err(StoreError::InUse { pid, .. }) => assert_eq!(pid, std::process::id()),
        other => panic!("expected InUse, got {other:?}"),
    }
    let e = reopen(dir.path(), &h).0.unwrap_err().to_string();
    assert!(e.contains("in use by PID"), "{e}");
    drop(store);
    assert!(reopen(dir.path(), &h).0.is_ok(), "free again once closed");
}

#[test]
fn bad_specs_and_options_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let e = Store::open(&["nvme0"], &opts(dir.path()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a namespace"), "{e}");
    let e = Store::open::<&str>(&[], &opts(dir.path()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("at least one"), "{e}");
    let mut f = fopts(dir.path());
    f.chunk_size = 1000;
    assert!(Store::format(&["mem:8M"], &f)
        .unwrap_err()
        .to_string()
        .contains("chunk size"));
    let e = Store::format(&["mem:1M"], &fopts(dir.path()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("too small"), "{e}");
    let missing = format!("file:{}/nope.img", dir.path().display());
    let e = Store::open(&[missing], &opts(dir.path()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("nope.img"), "{e}");
}

#[test]
fn files_through_io_uring() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let specs: Vec<String> = (0..2)
        .map(|i| format!("file:{}/ns{i}.img?size=24M", dir.path().display()))
        .collect();
    let f = fopts(dir.path());
    let store = match Store::format(&specs, &f) {
        Ok(s) => s,
        Err(e) if e.to_string().contains("refuses O_DIRECT") => {
            // Reported clearly; the option lets it run through the page cache.
            let mut f = f.clone();
            f.store.allow_buffered_io = true;
            f.force = true;
            Store::format(&specs, &f).unwrap()
        }
        Err(e) => panic!("{e}"),
    };
    assert!(
        store.info().members[0].device.starts_with("file "),
        "{:?}",
        store.info().members
    );
    let data = bytes(5, 3_000_001);
    let mut tx = store.begin("m").unwrap();
    tx.put("w", b"meta", &data).unwrap();
    tx.commit().unwrap();
    // A second format without force is refused.
    let e = Store::format(&specs, &f).unwrap_err().to_string();
    assert!(e.contains("already holds") || e.contains("in use"), "{e}");
    drop(store);
    let mut o = f.store.clone();
    o.allow_buffered_io = true;
    let rev: Vec<String> = specs.iter().rev().cloned().collect();
    let store = Store::open(&rev, &o).unwrap();
    assert_eq!(
        store.open_version("m", None).unwrap().read_to_vec("w").unwrap(),
        data
    );
    let rep = store.fsck().unwrap();
    assert!(rep.is_clean(), "{:?}", rep.findings);
    assert_eq!(rep.bytes, data.len() as u64);
    // Naming only one of the two is refused.
    drop(store);
    let e = Store::open(&specs[..1], &o).unwrap_err().to_string();
    assert!(e.contains("name all of them"), "{e}");
}

#[test]
fn o_direct_refusal_is_reported_on_tmpfs() {
    let shm = std::path::Path::new("/dev/shm");
    if !shm.is_dir() {
        return;
    }
    let dir = tempfile::tempdir_in(shm).unwrap();
    let spec = format!("file:{}/s.img?size=8M", dir.path().display());
    match Store::format(&[&spec], &fopts(dir.path())) {
        Err(e) => assert!(e.to_string().contains("refuses O_DIRECT"), "{e}"),
        Ok(_) => return, // this kernel's tmpfs takes O_DIRECT
    }
    let mut f = fopts(dir.path());
    f.store.allow_buffered_io = true;
    let store = Store::format(&[&spec], &f).unwrap();
    assert!(store.info().members[0].device.contains("buffered"));
}

/// Run by `a_second_process_is_refused_with_its_pid` in a child process: opens the store named
/// by `VFPOLL_STORE_CHILD` (spec) and `VFPOLL_STORE_CHILD_LOCKS` (lock dir), says so, and holds
/// it until its stdin closes.
#[test]
fn child_holds_the_store() {
    let (Ok(spec), Ok(locks)) = (
        std::env::var("VFPOLL_STORE_CHILD"),
        std::env::var("VFPOLL_STORE_CHILD_LOCKS"),
    ) else {
        return;
    };
    let mut o = opts(std::path::Path::new(&locks));
    o.allow_buffered_io = true;
    let _store = Store::open(&[spec], &o).unwrap();
    println!("VFPOLL-CHILD-READY");
    use std::io::Write;
    std::io::stdout().flush().unwrap();
    let mut s = String::new();
    let _ = std::io::stdin().read_line(&mut s);
}

#[test]
fn a_second_process_is_refused_with_its_pid() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let spec = format!("file:{}/s.img?size=8M", dir.path().display());
    let mut f = fopts(dir.path());
    f.store.allow_buffered_io = true;
    drop(Store::format(&[&spec], &f).unwrap());
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_holds_the_store",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("VFPOLL_STORE_CHILD", &spec)
        .env("VFPOLL_STORE_CHILD_LOCKS", dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("VFPOLL-CHILD-READY") {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the child exited before opening the store"
        );
    }
    let e = Store::open(&[&spec], &f.store).unwrap_err();
    match &e {
        StoreError::InUse { pid, .. } => assert_eq!(*pid, child.id()),
        other => panic!("expected InUse, got {other}"),
    }
    assert!(
        e.to_string().contains(&format!("in use by PID {}", child.id())),
        "{e}"
    );
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    assert!(
        Store::open(&[&spec], &f.store).is_ok(),
        "free once the other process is gone"
    );
}
