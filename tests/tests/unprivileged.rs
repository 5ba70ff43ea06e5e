//! Runs without root (issue 14): an unprivileged user of the guest, `vfpoll setup --user` by
//! root, then `doctor`, `identify`, `hello` and a short `perf` as that user on controller A.
//! Before setup, and after `reset` and a new bind, the same user gets errors that name the
//! cause and the fix; with the memlock limit too low, the error names RLIMIT_MEMLOCK. The
//! user's memlock limit is raised the way an operator would: `setup --user --pid PID` on the
//! user's waiting shell, which then execs vfpoll. In no-IOMMU mode, which needs root, setup and
//! the doctor refuse the user with the reason, and a user who owns the node still cannot open it.
//!
//! The guest runs chrooted into the host's `/` with a tmpfs overlay, so `/etc/passwd` and
//! `/etc/group` take the test user for this boot only.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::{Command, Output, Stdio};

use vfpoll_tests::*;

/// The test user (not on the host: the entries live in the guest's overlay).
const USER: &str = "vfpolltest";
const UID: u32 = 4711;

/// The boot's mode as the harness names it (`iommu`, `noiommu`, `iommufd`).
fn testbed() -> String {
    std::env::var("VFPOLL_TESTBED").expect("VFPOLL_TESTBED is set: guest_* tests run inside the test bed")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Adds the test user and its group to the guest's /etc/passwd and /etc/group (once).
fn add_user() {
    for (file, line) in [
        (
            "/etc/passwd",
            format!("{USER}:x:{UID}:{UID}:vfpoll test:/tmp:/bin/sh\n"),
        ),
        ("/etc/group", format!("{USER}:x:{UID}:\n")),
    ] {
        let now = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{file}: {e}"));
        if !now.lines().any(|l| l.starts_with(&format!("{USER}:"))) {
            std::fs::write(file, format!("{now}{line}")).unwrap_or_else(|e| panic!("{file}: {e}"));
        }
    }
}

/// Runs `vfpoll args` as root, printing what it said.
fn root(args: &[&str]) -> Output {
    let out = Command::new("vfpoll").args(args).output().expect("run vfpoll");
    println!("# vfpoll {}\n{}", args.join(" "), text(&out));
    out
}

/// The test user's shell running `vfpoll args` after `prefix` (shell commands, e.g.
/// `ulimit -l 0;`): uid and gid UID, no supplementary groups (std drops them when root sets a
/// uid), no capabilities.
fn user_cmd(prefix: &str, args: &[&str]) -> Command {
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(format!("{prefix} exec vfpoll \"$@\""))
        .arg("sh")
        .args(args)
        .uid(UID)
        .gid(UID)
        .env("HOME", "/tmp")
        .env("USER", USER);
    c
}

/// Runs `vfpoll args` as the user with the memlock limit it inherits (the kernel's 8 MiB) or
/// lowered by `prefix`.
fn user(prefix: &str, args: &[&str]) -> Output {
    let out = user_cmd(prefix, args)
        .output()
        .expect("run vfpoll as the test user");
    let after = if prefix.is_empty() {
        String::new()
    } else {
        format!(", after `{prefix}`")
    };
    println!("$ vfpoll {}   (as {USER}{after})\n{}", args.join(" "), text(&out));
    out
}

/// Runs `vfpoll args` as the user after root raised its shell's memlock limit with
/// `vfpoll setup --user USER --hugepages 64 --bind A --pid <the shell>`.
fn user_raised(args: &[&str]) -> Output {
    let mut child = user_cmd("read go;", args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the test user's shell");
    let pid = child.id().to_string();
    let s = root(&[
        "setup",
        "--user",
        USER,
        "--hugepages",
        "64",
        "--bind",
        NVME_A,
        "--pid",
        &pid,
    ]);
    assert!(s.status.success(), "{}", text(&s));
    let t = text(&s);
    assert!(
        t.contains(&format!("memlock: raised process {pid}'s limit from "))
            || t.contains(&format!("memlock: process {pid} may lock 65536 KiB")),
        "{t}"
    );
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let out = child.wait_with_output().unwrap();
    println!(
        "$ vfpoll {}   (as {USER}, memlock raised by setup --pid)\n{}",
        args.join(" "),
        text(&out)
    );
    out
}

#[track_caller]
fn fails_with(o: &Output, needles: &[&str]) {
    let t = text(o);
    assert!(!o.status.success(), "should fail: {t}");
    for n in needles {
        assert!(t.contains(n), "`{n}` missing in: {t}");
    }
}

#[track_caller]
fn succeeds(o: &Output) -> String {
    let t = text(o);
    assert!(o.status.success(), "{t}");
    t
}

#[test]
#[ignore = "test bed"]
fn guest_unprivileged_user_runs_the_tools_after_setup_user() {
    if testbed() == "noiommu" {
        return noiommu_refused();
    }
    add_user();
    // Root binds A and reserves hugepages, but gives nobody anything yet.
    succeeds(&root(&["setup", "--hugepages", "64", "--bind", NVME_A]));
    let group = std::fs::read_link(format!("/sys/bus/pci/devices/{NVME_A}/iommu_group"))
        .unwrap()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let node = format!("/dev/vfio/{group}");
    // In iommufd mode the run opens /dev/iommu and the device's cdev instead of the group node.
    let iommufd = testbed() == "iommufd";
    let denied: Vec<String> = if iommufd {
        vec![
            "FAIL  /dev/iommu: /dev/iommu is not read-write for this user".into(),
            format!("FAIL  {NVME_A} cdev: /dev/vfio/devices/vfio"),
        ]
    } else {
        vec![format!(
            "FAIL  {NVME_A}: (nvme 1b36:0010) {node} is not read-write for this user"
        )]
    };

    // Before setup --user: the doctor says what is missing and the fix; the tools fail clearly.
    let d = user("", &["doctor", "--device", NVME_A]);
    let mut want: Vec<String> = denied.clone();
    want.extend([
        format!("fix: sudo vfpoll setup --user {USER} --bind {NVME_A}"),
        "FAIL  memlock: limit ".into(),
        format!("root raises it: sudo vfpoll setup --user {USER} --hugepages 64 --pid $$"),
        format!("OK    user: running as {USER} (uid {UID}) without root"),
    ]);
    fails_with(&d, &want.iter().map(String::as_str).collect::<Vec<_>>());
    let first = if iommufd { "/dev/iommu" } else { node.as_str() };
    let id = user("", &["identify", "--device", NVME_A]);
    fails_with(
        &id,
        &[
            &format!("cannot open {first}: permission denied"),
            "vfpoll setup --user",
        ],
    );

    // Root gives the user the device (and /dev/iommu and the cdev where the kernel has them).
    let s = root(&["setup", "--user", USER, "--hugepages", "64", "--bind", NVME_A]);
    let t = succeeds(&s);
    assert!(
        t.contains(&format!(
            "user {USER} (uid {UID}): {node} ({NVME_A}): gave it (was owner root (uid 0), mode 600)"
        )),
        "{t}"
    );
    assert!(
        t.contains(&format!("user {USER} (uid {UID}): /dev/hugepages: gave it")),
        "{t}"
    );
    assert!(
        t.contains(&format!("`{USER} - memlock 65536` to /etc/security/limits.conf")),
        "{t}"
    );
    if iommufd {
        assert!(
            t.contains(&format!("user {USER} (uid {UID}): /dev/iommu: gave it")),
            "{t}"
        );
        assert!(t.contains("/dev/vfio/devices/vfio"), "{t}");
    }

    // The limit still low: the memlock error names the limit and the fix.
    let low = user("ulimit -l 0;", &["identify", "--device", NVME_A]);
    fails_with(&low, &["RLIMIT_MEMLOCK", "vfpoll setup --user"]);

    // With the limit raised by setup --pid: everything runs, the doctor finds nothing wrong.
    let d = succeeds(&user_raised(&["doctor", "--device", NVME_A]));
    assert!(d.contains("doctor: 0 FAIL"), "{d}");
    assert!(
        d.contains("OK    hugetlbfs: /dev/hugepages is writable for this user"),
        "{d}"
    );
    let id = succeeds(&user_raised(&["identify", "--device", NVME_A]));
    assert!(id.contains("vfpoll-a"), "{id}");
    let h = succeeds(&user_raised(&["hello", "--device", NVME_A, "--nsid", "1"]));
    assert!(h.contains("data matches"), "{h}");
    let p = succeeds(&user_raised(&[
        "perf",
        "--device",
        NVME_A,
        "--time",
        "1",
        "--queue-depth",
        "8",
    ]));
    assert!(p.contains("read: IOPS="), "{p}");

    // Reset gives everything back; bound anew, the node is root's and the user is told so.
    let r = succeeds(&root(&["reset"]));
    assert!(
        r.contains("user: /dev/hugepages back to owner root (uid 0)"),
        "{r}"
    );
    succeeds(&root(&["bind", NVME_A]));
    let id = user("", &["identify", "--device", NVME_A]);
    fails_with(
        &id,
        &[
            &format!("cannot open {first}: permission denied"),
            "vfpoll setup --user",
        ],
    );
    succeeds(&root(&["reset"]));
}

/// No-IOMMU mode: setup refuses the user with the reason, the doctor says it needs root, and
/// owning the node is not enough (the kernel wants CAP_SYS_RAWIO).
fn noiommu_refused() {
    add_user();
    let s = root(&[
        "setup",
        "--user",
        USER,
        "--noiommu",
        "--hugepages",
        "64",
        "--bind",
        NVME_A,
    ]);
    fails_with(
        &s,
        &[
            "--user cannot be given with --noiommu: no-IOMMU mode needs root",
            "CAP_SYS_RAWIO",
            "/proc/self/pagemap",
        ],
    );
    // Without --noiommu, on this machine without IOMMU the device lands in a no-IOMMU group.
    let s = root(&["setup", "--user", USER, "--hugepages", "64", "--bind", NVME_A]);
    fails_with(
        &s,
        &[
            "is in a no-IOMMU group (/dev/vfio/noiommu-",
            "no-IOMMU mode needs root",
        ],
    );
    let d = user("", &["doctor", "--noiommu", "--device", NVME_A]);
    fails_with(
        &d,
        &[
            "FAIL  no-iommu: no-IOMMU mode needs root",
            "fix: run no-IOMMU runs as root",
            "fix: run as root: a no-IOMMU group's node opens only with CAP_SYS_RAWIO",
        ],
    );
    // Even owning the node (chowned by hand), the user cannot open it.
    let node = std::fs::read_dir("/dev/vfio")
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("noiommu-"))
        .expect("a /dev/vfio/noiommu-N node");
    std::os::unix::fs::chown(&node, Some(UID), Some(UID)).unwrap();
    let id = user("", &["identify", "--noiommu", "--device", NVME_A]);
    fails_with(&id, &["CAP_SYS_RAWIO"]);
    succeeds(&root(&["reset"]));
}
