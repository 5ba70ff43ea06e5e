//! vfpoll's fio engine (issue 13, part 2): fio itself drives the test bed's controllers through
//! `libvfpoll_fio.so` (`fio-engine/`, built by `cargo xtask test` into `target/debug`), with
//! fio's own verification as the oracle: random writes checked against their crc32c at queue
//! depth 1 and 32, with fio's buffers lent by the engine (zero-copy) and through bounce buffers
//! (a block size that is no power of two), several jobs each with its own queue pair, a job
//! over two controllers, trim and flush, a namespace with protection information; the refusals
//! (no `thread=1`, bad file names, formats the engine cannot drive, block sizes that are not
//! whole blocks) and their messages. The host then checks that a pattern fio wrote at a known
//! offset is where it belongs in controller B's image file (an offset bug that reads and
//! writes share would pass fio's verify).

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;
use vfpoll_tests::*;

/// Controller F: the namespace formats (see tests/formats.rs).
const NVME_F: &str = "0000.00.0b.0";
/// fio's names of controllers A and B (colons as dots).
const FIO_A: &str = "0000.00.03.0";
const FIO_B: &str = "0000.00.04.0";

/// Where the host check finds fio's pattern in B's namespace 1 (64 MiB of 512-byte blocks),
/// past the ranges the other tests write.
const PATTERN_OFFSET: u64 = 48 << 20;
const PATTERN_BYTES: usize = 1 << 20;
/// The pattern, as fio's `verify_pattern` takes it and as it lies in the blocks.
const PATTERN_HEX: &str = "0x76667066696f2121";
const PATTERN: &[u8] = b"vfpfio!!";

/// The engine, beside the test binary's folder (`target/debug/deps/..`).
fn engine() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let so = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target/debug/deps")
        .join("libvfpoll_fio.so");
    assert!(
        so.exists(),
        "{} is missing: `cargo xtask test` builds it (step \"fio engine\")",
        so.display()
    );
    so
}

/// fio with the engine, `thread=1`, this boot's IOMMU mode and JSON output, plus `args`.
fn fio_cmd(args: &[&str]) -> Command {
    let mut cmd = Command::new("fio");
    cmd.arg(format!("--ioengine=external:{}", engine().display()))
        .args(["--thread", "--output-format=json", "--eta=never"]);
    if mode_name() == "noiommu" {
        cmd.arg("--vfpoll_iommu=none");
    }
    cmd.args(args);
    cmd
}

fn show(args: &[&str], out: &Output) -> String {
    format!(
        "$ fio {}: {}\n{}{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs fio; panics unless it succeeded with no job error. Returns the JSON's jobs.
fn fio(args: &[&str]) -> Vec<Value> {
    let out = fio_cmd(args)
        .output()
        .expect("run fio (installed by cargo xtask setup)");
    let text = show(args, &out);
    println!("{text}");
    assert!(out.status.success(), "{text}");
    // fio may print notes before the document (and after it).
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json = &stdout[stdout.find('{').unwrap_or_else(|| panic!("no JSON: {text}"))..];
    let v: Value = serde_json::Deserializer::from_str(json)
        .into_iter()
        .next()
        .expect("a JSON document")
        .unwrap_or_else(|e| panic!("{e}: {text}"));
    let jobs = v["jobs"].as_array().expect("jobs").clone();
    for j in &jobs {
        assert_eq!(j["error"], 0, "job {} failed: {text}", j["jobname"]);
    }
    jobs
}

/// Runs fio, which must fail; returns everything it printed.
fn fio_refused(args: &[&str]) -> String {
    let out = fio_cmd(args).output().expect("run fio");
    let text = show(args, &out);
    println!("{text}");
    assert!(!out.status.success(), "fio succeeded: {text}");
    text
}

/// `jobs[i][ddir][key]` as a number.
fn num(job: &Value, ddir: &str, key: &str) -> u64 {
    job[ddir][key]
        .as_u64()
        .unwrap_or_else(|| panic!("no {ddir}.{key} in {job}"))
}

fn setup() {
    bind_all(&[NVME_A, NVME_B, "0000:00:0b.0"]);
    reserve_hugepages(128);
}

/// Random writes of 4 KiB (then 512 B to 64 KiB), each block once, read back and checked
/// against their crc32c by fio, at queue depth 1 and 32.
#[test]
#[ignore = "test bed"]
fn guest_fio_crc32c_verify_of_random_writes_at_qd1_and_qd32() {
    setup();
    let file = format!("--filename={FIO_B}/1");
    for (depth, bs, size) in [
        ("1", "--bs=4k", "1M"),
        ("32", "--bs=4k", "8M"),
        ("32", "--bsrange=512-64k", "8M"),
    ] {
        let args = [
            "--name=verify",
            &file,
            "--rw=randwrite",
            bs,
            &format!("--size={size}"),
            &format!("--iodepth={depth}"),
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
        ];
        let jobs = fio(&args);
        let bytes = if size == "1M" { 1 << 20 } else { 8 << 20 };
        assert_eq!(num(&jobs[0], "write", "io_bytes"), bytes, "{args:?}");
        // The verify phase read every block written.
        assert_eq!(num(&jobs[0], "read", "io_bytes"), bytes, "{args:?}");
    }
}

/// `vfpoll_stats=1`: the job's queue pair counters when it ends (libvfpoll's
/// `vfpoll_qpair_get_stats`): 512 reads of 4 KiB at depth 32, no errors, at most one doorbell
/// update per request (commit leaves most to the next poll), and polls that found work.
#[test]
#[ignore = "test bed"]
fn guest_fio_prints_the_queue_pair_counters() {
    setup();
    let file = format!("--filename={FIO_A}/1");
    let args = [
        "--name=counted",
        &file,
        "--rw=randread",
        "--bs=4k",
        "--size=2M",
        "--iodepth=32",
        "--vfpoll_stats=1",
    ];
    let out = fio_cmd(&args).output().expect("run fio");
    let text = show(&args, &out);
    println!("{text}");
    assert!(out.status.success(), "{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("vfpoll: job counted, 0000:00:03.0:"))
        .unwrap_or_else(|| panic!("no counters line: {text}"));
    // "...: 512 requests, 0 errors; SQ doorbells N (...), CQ doorbells N (...), shadow-only
    // updates N; polls N (...% empty, ... completions per non-empty poll)"
    // The number right before `what` ("512 requests") or right after it ("polls 40").
    let before = |what: &str| -> u64 {
        let at = line.find(what).unwrap_or_else(|| panic!("no {what:?} in {line}"));
        let word = line[..at].rsplit([' ', ',', ';', ':']).next().unwrap();
        word.parse()
            .unwrap_or_else(|_| panic!("no count before {what:?} in {line}"))
    };
    let after = |what: &str| -> u64 {
        let at = line.find(what).unwrap_or_else(|| panic!("no {what:?} in {line}"));
        let word = line[at + what.len()..].split([' ', ',', ';']).next().unwrap();
        word.parse()
            .unwrap_or_else(|_| panic!("no count after {what:?} in {line}"))
    };
    assert_eq!(before(" requests"), 512, "{line}");
    assert_eq!(before(" errors"), 0, "{line}");
    let (sq, shadow, polls) = (
        after("SQ doorbells "),
        after("shadow-only updates "),
        after("polls "),
    );
    assert!(sq >= 1 && sq + shadow <= 512, "{line}");
    assert!(polls >= 16, "{line}");
}

/// A block size that is no power of two: fio's buffers are ordinary memory and every I/O goes
/// through a DMA bounce buffer (the engine says so); fio's verify still passes. The same on
/// 4 KiB blocks (A's namespace 2) with SGLs.
#[test]
#[ignore = "test bed"]
fn guest_fio_verify_through_bounce_buffers_and_on_4k_blocks() {
    setup();
    let args = [
        "--name=bounce",
        "--filename=0000.00.04.0/1",
        "--offset=16M",
        "--size=6M",
        "--rw=randwrite",
        "--bs=12k",
        "--iodepth=8",
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_fatal=1",
    ];
    let out = fio_cmd(&args).output().unwrap();
    let text = show(&args, &out);
    println!("{text}");
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("each I/O is copied through a DMA buffer") && text.contains("bs max 12288"),
        "{text}"
    );
    let jobs = fio(&[
        "--name=4k",
        &format!("--filename={FIO_A}/2"),
        "--size=4M",
        "--rw=randwrite",
        "--bsrange=4k-128k",
        "--iodepth=16",
        "--vfpoll_sgl=1",
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_fatal=1",
    ]);
    assert_eq!(num(&jobs[0], "read", "io_bytes"), 4 << 20);
}

/// Four jobs, each with its own queue pair and range, verifying at queue depth 16; then one job
/// over two controllers (one queue pair on each), fio's ':' separating the files.
#[test]
#[ignore = "test bed"]
fn guest_fio_several_jobs_and_two_controllers() {
    setup();
    let jobs = fio(&[
        "--name=jobs",
        &format!("--filename={FIO_B}/1"),
        "--size=2M",
        "--offset_increment=2M",
        "--numjobs=4",
        "--rw=randwrite",
        "--bsrange=4k-32k",
        "--iodepth=16",
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_fatal=1",
    ]);
    assert_eq!(jobs.len(), 4);
    for j in &jobs {
        assert_eq!(num(j, "read", "io_bytes"), 2 << 20, "{j}");
    }
    let jobs = fio(&[
        "--name=two-ctrls",
        &format!("--filename={FIO_A}/1:{FIO_B}/1"),
        "--size=4M",
        "--rw=randwrite",
        "--bs=4k",
        "--iodepth=32",
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_fatal=1",
    ]);
    assert_eq!(num(&jobs[0], "read", "io_bytes"), 4 << 20);
}

/// Flushes (fio's fsync and fdatasync) between random writes, trims (deallocate) alone and
/// between writes (`trimwrite`, then verify), and reads of the trimmed range.
#[test]
#[ignore = "test bed"]
fn guest_fio_trim_and_sync() {
    setup();
    let file = format!("--filename={FIO_B}/1");
    let jobs = fio(&[
        "--name=sync",
        &file,
        "--offset=24M",
        "--size=2M",
        "--rw=randwrite",
        "--bs=4k",
        "--iodepth=8",
        "--fsync=8",
        "--verify=crc32c",
        "--do_verify=1",
    ]);
    // 512 writes, a flush after every 8.
    assert!(num(&jobs[0], "sync", "total_ios") >= 60, "{}", jobs[0]);
    let jobs = fio(&[
        "--name=fdatasync",
        &file,
        "--offset=24M",
        "--size=1M",
        "--rw=write",
        "--bs=64k",
        "--fdatasync=2",
    ]);
    // fio counts fdatasyncs in the sync latencies only (total_ios is fsync's).
    let n = jobs[0]["sync"]["lat_ns"]["N"].as_u64().expect("sync.lat_ns.N");
    assert!(n >= 7, "{}", jobs[0]);
    let jobs = fio(&[
        "--name=trim",
        &file,
        "--offset=26M",
        "--size=2M",
        "--rw=randtrim",
        "--bs=16k",
        "--iodepth=16",
    ]);
    assert_eq!(num(&jobs[0], "trim", "total_ios"), 128);
    assert_eq!(num(&jobs[0], "trim", "io_bytes"), 2 << 20);
    let jobs = fio(&[
        "--name=read-trimmed",
        &file,
        "--offset=26M",
        "--size=2M",
        "--rw=read",
        "--bs=128k",
        "--iodepth=4",
    ]);
    assert_eq!(num(&jobs[0], "read", "io_bytes"), 2 << 20);
    let jobs = fio(&[
        "--name=trimwrite",
        &file,
        "--offset=28M",
        "--size=2M",
        "--rw=trimwrite",
        "--bs=8k",
        // A block's trim and then its write: both in flight at once could reach the device in
        // either order (NVMe does not order commands), so one at a time.
        "--iodepth=1",
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_fatal=1",
    ]);
    assert_eq!(num(&jobs[0], "trim", "io_bytes"), 2 << 20);
    assert_eq!(num(&jobs[0], "read", "io_bytes"), 2 << 20);
}

/// F's namespace 3 (512-byte blocks with PI type 1 in 8 bytes of metadata) looks like a plain
/// namespace to fio: the controller inserts and strips the PI.
#[test]
#[ignore = "test bed"]
fn guest_fio_verify_on_a_pi_namespace() {
    setup();
    let jobs = fio(&[
        "--name=pi",
        &format!("--filename={NVME_F}/3"),
        "--size=2M",
        "--rw=randwrite",
        "--bsrange=512-16k",
        "--iodepth=16",
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_fatal=1",
    ]);
    assert_eq!(num(&jobs[0], "read", "io_bytes"), 2 << 20);
}

/// What the engine refuses, and that it says why.
#[test]
#[ignore = "test bed"]
fn guest_fio_refusals_say_why() {
    setup();
    let base = |name: &str| -> Vec<String> {
        vec![
            "--name=refused".into(),
            format!("--filename={name}"),
            "--size=1M".into(),
            "--rw=randread".into(),
        ]
    };
    let refused = |name: &str, extra: &[&str]| {
        let mut a = base(name);
        a.extend(extra.iter().map(|s| s.to_string()));
        fio_refused(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    // No thread=1: fio forks by default (`--thread` is in fio_cmd, so run fio directly).
    let args = [
        format!("--ioengine=external:{}", engine().display()),
        format!("--filename={FIO_B}/1"),
        "--name=fork".into(),
        "--size=1M".into(),
    ];
    let out = Command::new("fio").args(&args).output().unwrap();
    let text = show(&args.iter().map(String::as_str).collect::<Vec<_>>(), &out);
    assert!(!out.status.success() && text.contains("needs thread=1"), "{text}");

    for bad in [
        "0000:00:04.0",
        "00.04.0/1",
        "0000.00.04.0/0",
        "0000.00.04.0/x",
        "nvme0n1",
    ] {
        let t = refused(bad, &[]);
        assert!(
            t.contains("bad filename") && t.contains("DDDD.BB.DD.F/NSID"),
            "{bad}: {t}"
        );
    }
    let t = refused("0000.00.1f.7/1", &[]);
    assert!(
        t.contains("vfpoll_ctrl_open") && t.contains("0000:00:1f.7"),
        "{t}"
    );
    let t = refused(&format!("{FIO_B}/9"), &[]);
    assert!(t.contains("vfpoll_ns_identify"), "{t}");
    // F's formats: metadata in the data buffer, in a separate one, a 64-bit guard, zoned.
    let t = refused(&format!("{NVME_F}/1"), &[]);
    assert!(
        t.contains("8 bytes of metadata") && t.contains("in the data buffer"),
        "{t}"
    );
    let t = refused(&format!("{NVME_F}/2"), &[]);
    assert!(t.contains("in a separate buffer"), "{t}");
    let t = refused(&format!("{NVME_F}/5"), &[]);
    assert!(t.contains("cannot be used") && t.contains("64-bit guard"), "{t}");
    let t = refused(&format!("{NVME_F}/6"), &[]);
    assert!(t.contains("is zoned"), "{t}");
    // 512-byte I/O on 4 KiB blocks.
    let t = refused(&format!("{FIO_A}/2"), &["--bs=512"]);
    assert!(t.contains("block size is 4096 bytes"), "{t}");
    let t = refused(&format!("{FIO_B}/1"), &["--vfpoll_page=3m"]);
    assert!(t.contains("vfpoll_page=3m"), "{t}");
    // Two jobs asking for different environments in one process.
    let t = refused(
        &format!("{FIO_B}/1"),
        &[
            "--name=other",
            &format!("--filename={FIO_A}/1"),
            "--vfpoll_page=4k",
        ],
    );
    assert!(t.contains("all jobs share one"), "{t}");
}

/// A pattern at a known offset, for the host check; fio verifies it too.
#[test]
#[ignore = "test bed"]
fn guest_fio_writes_a_pattern_for_the_host() {
    setup();
    let jobs = fio(&[
        "--name=pattern",
        &format!("--filename={FIO_B}/1"),
        &format!("--offset={PATTERN_OFFSET}"),
        &format!("--size={PATTERN_BYTES}"),
        "--rw=randwrite",
        "--bs=64k",
        "--iodepth=4",
        "--verify=pattern",
        &format!("--verify_pattern={PATTERN_HEX}"),
        "--do_verify=1",
        "--verify_fatal=1",
    ]);
    assert_eq!(num(&jobs[0], "write", "io_bytes"), PATTERN_BYTES as u64);
}

/// The pattern is where fio wrote it in B's image, and the blocks on either side are not.
#[test]
#[ignore]
fn host_check_fio_pattern_in_image() {
    let img = run_dir().join("nvme-b-ns1.img");
    let data = read_file_range(&img, PATTERN_OFFSET, PATTERN_BYTES);
    for (i, chunk) in data.chunks(PATTERN.len()).enumerate() {
        assert_eq!(chunk, PATTERN, "byte {} of the pattern range", i * PATTERN.len());
    }
    for off in [PATTERN_OFFSET - 512, PATTERN_OFFSET + PATTERN_BYTES as u64] {
        let block = read_file_range(&img, off, 512);
        assert_ne!(&block[..8], PATTERN, "the block at {off} holds the pattern");
    }
}
