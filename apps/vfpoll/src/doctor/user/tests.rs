//! The doctor run as a user on fake machines (the process's IDs from the tree's
//! `proc/self/status`; ownership from `setup --user`'s fake table).

use super::*;
use crate::ctx::Ctx;
use crate::doctor::check as doctor;
use crate::setup::user::tests::ready;
use crate::setup::{self, Args as SetupArgs};
use vfpoll_hugepages::{Memlock, PageSize};

const ALICE: Process = Process {
    euid: 1000,
    cap_ipc_lock: Some(false),
    memlock: Memlock {
        soft: Some(8 << 20),
        hard: Some(8 << 20),
    },
};

fn args(noiommu: bool) -> Args {
    Args {
        noiommu,
        iommu_backend: Default::default(),
        devices: Vec::new(),
        hugepages: 64,
    }
}

/// This process as alice: uid and gid 1000, no capabilities.
fn as_alice(f: &crate::fake::Fake) {
    f.write(
        "proc/self/status",
        "Name:\tvfpoll\nUid:\t1000\t1000\t1000\t1000\nGid:\t1000\t1000\t1000\t1000\nGroups:\t1000 \nCapEff:\t0000000000000000\n",
    );
}

fn setup_alice(f: &crate::fake::Fake) {
    let ctx = Ctx::new(Some(f.root().to_owned()));
    let a = SetupArgs {
        hugepages: 64,
        page_size: PageSize::SIZE_2M,
        node: None,
        mount: "/dev/hugepages".into(),
        bind: vec!["nvme".parse().unwrap()],
        force: false,
        dry_run: false,
        user: Some("alice".into()),
        pid: Vec::new(),
        noiommu: false,
    };
    setup::run(&ctx, a).unwrap();
}

fn find<'a>(f: &'a [Finding], check: &str) -> &'a Finding {
    f.iter()
        .find(|x| x.check == check)
        .unwrap_or_else(|| panic!("no `{check}` finding in:\n{}", show(f)))
}

fn show(f: &[Finding]) -> String {
    f.iter().map(|x| format!("{x}\n")).collect()
}

#[test]
fn access_from_the_mode_bits() {
    let o = Owner {
        uid: 1000,
        gid: 50,
        mode: 0o640,
    };
    assert!(allows(&o, 1000, &[], 0o6));
    assert!(!allows(&o, 1001, &[50], 0o6));
    assert!(allows(&o, 1001, &[50], 0o4));
    assert!(!allows(&o, 1001, &[], 0o4));
    assert!(allows(&o, 0, &[], 0o6));
}

#[test]
fn root_gets_no_user_findings() {
    let f = ready();
    let root = Process {
        euid: 0,
        cap_ipc_lock: Some(true),
        ..ALICE
    };
    let out = doctor(&f.host(), &args(false), &root);
    assert!(out.iter().all(|x| x.check != "user"), "{}", show(&out));
}

#[test]
fn before_setup_the_user_is_told_what_is_missing() {
    let f = ready();
    as_alice(&f);
    let out = doctor(&f.host(), &args(false), &ALICE);
    assert_eq!(
        find(&out, "user").detail,
        "running as alice (uid 1000) without root: the checks below are this user's"
    );
    let h = find(&out, "hugetlbfs");
    let h = out.iter().rev().find(|x| x.check == "hugetlbfs").unwrap_or(h);
    assert_eq!(h.level, Level::Warn, "{h}");
    assert!(
        h.detail
            .starts_with("no hugetlbfs mount is writable for this user (/dev/hugepages)"),
        "{h}"
    );
    assert_eq!(
        h.fix.as_deref(),
        Some("sudo vfpoll setup --user alice --mount /dev/hugepages (chowns the mount to alice)")
    );
    let m = find(&out, "memlock");
    assert_eq!(m.level, Level::Fail, "{m}");
    assert!(
        m.fix.as_deref().unwrap().starts_with(
            "ulimit -l unlimited works only up to the hard limit (8192 KiB); above it root raises it: \
             sudo vfpoll setup --user alice --hugepages 64 --pid $$ raises this shell's limit"
        ),
        "{m}"
    );
    assert!(
        m.fix
            .as_deref()
            .unwrap()
            .contains("`alice - memlock 65536` to /etc/security/limits.conf"),
        "{m}"
    );
}

#[test]
fn after_setup_only_the_memlock_limit_is_left() {
    let f = ready();
    setup_alice(&f);
    as_alice(&f);
    let out = doctor(&f.host(), &args(false), &ALICE);
    let h = out.iter().rev().find(|x| x.check == "hugetlbfs").unwrap();
    assert_eq!(
        (h.level, h.detail.as_str()),
        (Level::Ok, "/dev/hugepages is writable for this user")
    );
    let fails: Vec<&Finding> = out.iter().filter(|x| x.level == Level::Fail).collect();
    assert_eq!(fails.len(), 1, "{}", show(&out));
    assert_eq!(fails[0].check, "memlock");
    // With the limit raised (setup --pid, limits.conf), nothing fails.
    let raised = Process {
        memlock: Memlock {
            soft: Some(64 << 20),
            hard: Some(64 << 20),
        },
        ..ALICE
    };
    let out = doctor(&f.host(), &args(false), &raised);
    assert!(out.iter().all(|x| x.level != Level::Fail), "{}", show(&out));
    // A hard limit that allows enough: the user raises the soft one itself.
    let soft_only = Process {
        memlock: Memlock {
            soft: Some(8 << 20),
            hard: None,
        },
        ..ALICE
    };
    let out = doctor(&f.host(), &args(false), &soft_only);
    assert!(
        find(&out, "memlock")
            .fix
            .as_deref()
            .unwrap()
            .starts_with("ulimit -l 65536 (the hard limit allows it)"),
        "{}",
        show(&out)
    );
}

#[test]
fn noiommu_needs_root() {
    let f = ready();
    as_alice(&f);
    let out = doctor(&f.host(), &args(true), &ALICE);
    let n = out.iter().rev().find(|x| x.check == "no-iommu").unwrap();
    assert_eq!(n.level, Level::Fail, "{}", show(&out));
    assert!(
        n.detail
            .starts_with("no-IOMMU mode needs root: opening /dev/vfio/noiommu-N needs CAP_SYS_RAWIO"),
        "{n}"
    );
    assert!(
        n.fix.as_deref().unwrap().starts_with("run no-IOMMU runs as root"),
        "{n}"
    );
    // A device in a no-IOMMU group, without --noiommu: the same, naming the node.
    std::fs::rename(f.path("dev/vfio/4"), f.path("dev/vfio/noiommu-4")).unwrap();
    let out = doctor(&f.host(), &args(false), &ALICE);
    let n = out.iter().rev().find(|x| x.check == "no-iommu").unwrap();
    assert!(n.detail.ends_with("dev/vfio/noiommu-4)"), "{n}");
    // A process with the capabilities (not root, but given them) may.
    f.write("proc/self/status", "Name:\tvfpoll\nCapEff:\t0000000000220000\n");
    let out = doctor(&f.host(), &args(true), &ALICE);
    let n = out.iter().rev().find(|x| x.check == "no-iommu").unwrap();
    assert_eq!(n.level, Level::Ok, "{n}");
}

#[test]
fn device_node_fixes_point_at_setup_user() {
    let mut out = vec![
        finding(
            Level::Fail,
            "0000:00:03.0",
            "(nvme 1b36:0010) /dev/vfio/3 is not read-write for this user",
            Some("run as root".into()),
        ),
        finding(
            Level::Fail,
            "/dev/vfio/vfio",
            "/dev/vfio/vfio is not read-write for this user",
            None,
        ),
        finding(Level::Ok, "0000:00:04.0", "is not read-write for this user", None),
        finding(
            Level::Fail,
            "0000:00:05.0",
            "(nvme 1b36:0010) /dev/vfio/noiommu-0 is not read-write for this user",
            None,
        ),
        finding(
            Level::Fail,
            "/dev/iommu",
            "/dev/iommu is not read-write for this user",
            Some("run as root".into()),
        ),
        finding(
            Level::Fail,
            "0000:00:03.0 cdev",
            "/dev/vfio/devices/vfio0 is not read-write for this user",
            Some("run as root".into()),
        ),
    ];
    rewrite_fixes(
        &args(false),
        &ALICE,
        "alice",
        "sudo vfpoll setup --user alice",
        &mut out,
    );
    assert_eq!(
        out[0].fix.as_deref(),
        Some("sudo vfpoll setup --user alice --bind 0000:00:03.0 (chowns the device's VFIO nodes to alice; vfpoll reset gives them back), or run as root")
    );
    assert!(out[1]
        .fix
        .as_deref()
        .unwrap()
        .starts_with("sudo chmod 0666 /dev/vfio/vfio"));
    assert_eq!(out[2].fix, None);
    assert_eq!(
        out[3].fix.as_deref(),
        Some("run as root: a no-IOMMU group's node opens only with CAP_SYS_RAWIO, whoever owns it")
    );
    assert_eq!(
        out[4].fix.as_deref(),
        Some(
            "sudo vfpoll setup --user alice (chowns /dev/iommu and the devices' nodes to alice), or run with \
             --iommu-backend type1 if the group nodes are alice's, or run as root"
        )
    );
    assert!(
        out[5]
            .fix
            .as_deref()
            .unwrap()
            .starts_with("sudo vfpoll setup --user alice --bind 0000:00:03.0 (chowns"),
        "{}",
        out[5]
    );
}
