//! libvfpoll, the C API (issue 13): the C examples of `examples/c`, which `cargo xtask test`
//! builds with the system C compiler against the installed header and pkg-config file into
//! `target/debug/vfpoll-c-<name>` (on the guest's PATH), once plain and once with
//! AddressSanitizer and UBSan (`-asan`), run against the test bed's controllers: identify
//! (controller B, and controller F's namespace formats), hello (write, read back, compare,
//! restore) on B and on each of F's formats, the refusals (64-bit guard PI, zoned), and a polled
//! read loop that prints its IOPS.

use std::process::{Command, Output};

use vfpoll_tests::*;

/// NVMe controller F: the namespace formats (see tests/formats.rs).
const NVME_F: &str = "0000:00:0b.0";

/// Runs C example `name` (`vfpoll-c-<name><suffix>`) in this boot's IOMMU mode.
fn example(name: &str, suffix: &str, args: &[&str]) -> Output {
    let exe = format!("vfpoll-c-{name}{suffix}");
    let mut cmd = Command::new(&exe);
    if mode_name() == "noiommu" {
        cmd.arg("-n");
    }
    let out = cmd.args(args).output().unwrap_or_else(|e| {
        panic!("{exe}: {e} (`cargo xtask test` builds the C examples into target/debug)")
    });
    println!(
        "{exe} {args:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs `name` and returns its standard output; panics unless it succeeded.
fn ok(name: &str, suffix: &str, args: &[&str]) -> String {
    let out = example(name, suffix, args);
    assert!(out.status.success(), "{name}{suffix} {args:?} failed");
    String::from_utf8(out.stdout).unwrap()
}

/// Runs `name`, which must fail; returns its standard error.
fn refused(name: &str, args: &[&str]) -> String {
    let out = example(name, "", args);
    assert!(!out.status.success(), "{name} {args:?} succeeded");
    String::from_utf8(out.stderr).unwrap()
}

#[test]
#[ignore = "test bed"]
fn guest_c_examples_identify_write_read_back_and_poll() {
    bind_all(&[NVME_B, NVME_F]);
    reserve_hugepages(64);
    for suffix in ["", "-asan"] {
        let id = ok("identify", suffix, &[NVME_B]);
        assert!(id.contains("serial     vfpoll-b"), "{id}");
        assert!(id.contains("model      QEMU NVMe Ctrl"), "{id}");
        // MDTS 10 of 4 KiB pages.
        assert!(id.contains("(4194304 bytes)"), "{id}");
        assert!(id.contains("nsid 1: blocks="), "{id}");
        let hello = ok("hello", suffix, &[NVME_B, "1"]);
        assert!(hello.contains("data matches"), "{hello}");
        let rl = ok("read_loop", suffix, &[NVME_B, "1", "2", "16"]);
        assert!(
            rl.contains("at queue depth 16") && rl.contains(" 0 errors"),
            "{rl}"
        );
        let reads: u64 = rl
            .split(": ")
            .nth(2)
            .and_then(|s| s.split(' ').next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no read count in {rl:?}"));
        assert!(reads >= 16, "{rl}");
        assert!(rl.contains(" IOPS"), "{rl}");
    }

    // Controller F: every format as identify sees it, and hello on each that vfpoll drives.
    let id = ok("identify", "", &[NVME_F]);
    let line = |nsid: u32| {
        id.lines()
            .find(|l| l.starts_with(&format!("nsid {nsid}: ")))
            .unwrap_or_else(|| panic!("no namespace {nsid} in {id}"))
            .to_string()
    };
    assert!(line(1).contains("lba_size=512") && line(1).contains("metadata=extended/8 pi=0"));
    assert!(line(1).contains("io=4160+0"), "8 blocks of 512 + 8: {}", line(1));
    assert!(line(2).contains("metadata=separate/8 pi=0") && line(2).contains("io=4096+64"));
    assert!(line(3).contains("metadata=extended/8 pi=1 guard=16 last"));
    assert!(
        line(3).contains("io=4096+0"),
        "PI-only metadata under PRACT: {}",
        line(3)
    );
    assert!(
        line(4).contains("lba_size=4096") && line(4).contains("metadata=separate/64 pi=1 guard=16 first")
    );
    assert!(line(4).contains("io=4096+64"), "{}", line(4));
    assert!(line(5).contains("guard=64") && line(5).contains("64-bit guard is not supported"));
    assert!(line(6).contains("zoned=1 zone_size=256"), "{}", line(6));
    for nsid in ["1", "2", "3", "4", "7"] {
        let hello = ok("hello", "", &[NVME_F, nsid]);
        assert!(hello.contains("data matches"), "namespace {nsid}: {hello}");
    }
    let hello = ok("hello", "-asan", &[NVME_F, "4"]);
    assert!(
        hello.contains("+ 64 B of metadata") && hello.contains("data matches"),
        "{hello}"
    );
    let err = refused("hello", &[NVME_F, "5"]);
    assert!(
        err.contains("vfpoll_ns_transfer") && err.contains("64-bit guard is not supported"),
        "{err}"
    );
    let err = refused("hello", &[NVME_F, "6"]);
    assert!(err.contains("zoned"), "{err}");
    // An address that is no controller: the message names it.
    let err = refused("identify", &["0000:00:1f.7"]);
    assert!(
        err.contains("vfpoll_ctrl_open") && err.contains("0000:00:1f.7"),
        "{err}"
    );
}
