//! `setup --user` on fake machines: ownership goes to the tree's `run/vfpoll/fake-owners`, the
//! memlock limit to its `proc/<pid>/limits`, so the tests need no root.

use super::*;
use crate::ctx::Ctx;
use crate::fake::{guest, Fake};
use crate::setup::{self, Args};
use vfpoll_hugepages::PageSize;

const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/sh\nbob:x:1001:1001::/home/bob:/bin/sh\n";

/// The guest after `vfpoll setup` with the IOMMU on: both NVMe controllers on vfio-pci (groups
/// 3 and 4), 00:03.0 with the VFIO cdev vfio0, /dev/iommu, a hugetlbfs on /dev/hugepages, and
/// processes 4242 (alice) and 4343 (bob) with the kernel's default memlock limit.
pub(crate) fn ready() -> Fake {
    let f = guest(true);
    f.vfio(None)
        .pool(2048, None, 32, 32)
        .mount("nodev /dev/hugepages hugetlbfs rw,relatime,pagesize=2M 0 0")
        .write("etc/passwd", PASSWD)
        .write("dev/iommu", "")
        .write("sys/bus/pci/devices/0000:00:03.0/vfio-dev/vfio0/dev", "511:0\n")
        .write("dev/vfio/devices/vfio0", "");
    std::fs::create_dir_all(f.path("dev/hugepages")).unwrap();
    for (bdf, g) in [("0000:00:03.0", 3), ("0000:00:04.0", 4)] {
        let link = f.path("sys/devices/pci0000:00").join(bdf).join("driver");
        std::fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink(f.path("sys/bus/pci/drivers/vfio-pci"), link).unwrap();
        f.group_node(&g.to_string());
    }
    for (pid, uid) in [(4242, 1000), (4343, 1001)] {
        f.write(
            &format!("proc/{pid}/status"),
            &format!("Name:\tsh\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"),
        );
        f.write(
            &format!("proc/{pid}/limits"),
            "Limit                     Soft Limit           Hard Limit           Units     \n\
             Max open files            1024                 1048576              files     \n\
             Max locked memory         8388608              8388608              bytes     \n",
        );
    }
    // The real files are the test runner's: make their recorded owner root's, mode as devtmpfs.
    for p in ["dev/vfio/3", "dev/vfio/4", "dev/vfio/devices/vfio0"] {
        set_owner(
            &f.host(),
            &f.path(p),
            Owner {
                uid: 0,
                gid: 0,
                mode: 0o600,
            },
        )
        .unwrap();
    }
    set_owner(
        &f.host(),
        &f.path("dev/iommu"),
        Owner {
            uid: 0,
            gid: 0,
            mode: 0o660,
        },
    )
    .unwrap();
    set_owner(
        &f.host(),
        &f.path("dev/vfio/vfio"),
        Owner {
            uid: 0,
            gid: 0,
            mode: 0o666,
        },
    )
    .unwrap();
    set_owner(
        &f.host(),
        &f.path("dev/hugepages"),
        Owner {
            uid: 0,
            gid: 0,
            mode: 0o755,
        },
    )
    .unwrap();
    f
}

fn args(user: Option<&str>, bind: &[&str], pid: &[u32]) -> Args {
    Args {
        hugepages: 64,
        page_size: PageSize::SIZE_2M,
        node: None,
        mount: "/dev/hugepages".into(),
        bind: bind.iter().map(|b| b.parse().unwrap()).collect(),
        force: false,
        dry_run: false,
        user: user.map(str::to_owned),
        pid: pid.to_vec(),
        noiommu: false,
    }
}

fn own(f: &Fake, p: &str) -> Owner {
    owner(&f.host(), &f.path(p)).unwrap()
}

#[test]
fn users_by_name_or_number() {
    let f = ready();
    let h = f.host();
    let a = resolve(&h, "alice").unwrap();
    assert_eq!(
        (a.uid, a.gid, a.to_string()),
        (1000, Some(1000), "alice (uid 1000)".into())
    );
    assert_eq!(resolve(&h, "1001").unwrap().name, "bob");
    // A number the database does not know: taken as it is, group left alone.
    let n = resolve(&h, "5000").unwrap();
    assert_eq!((n.uid, n.gid, n.to_string()), (5000, None, "uid 5000".into()));
    let e = resolve(&h, "carol").unwrap_err().to_string();
    assert!(
        e.contains("there is no user `carol`") && e.contains("adduser carol"),
        "{e}"
    );
    let e = resolve(&h, "root").unwrap_err().to_string();
    assert!(e.contains("is root, who needs no setup --user"), "{e}");
    assert_eq!(name_of(&h, 1000), "alice");
    assert_eq!(name_of(&h, 77), "77");
}

#[test]
fn setup_user_gives_nodes_mount_and_raises_memlock() {
    let f = ready();
    let ctx = Ctx::new(Some(f.root().to_owned()));
    let code = setup::run(&ctx, args(Some("alice"), &["nvme"], &[4242])).unwrap();
    assert_eq!(code, std::process::ExitCode::SUCCESS);
    let alice = |mode| Owner {
        uid: 1000,
        gid: 1000,
        mode,
    };
    assert_eq!(own(&f, "dev/vfio/3"), alice(0o600));
    assert_eq!(own(&f, "dev/vfio/4"), alice(0o600));
    assert_eq!(own(&f, "dev/vfio/devices/vfio0"), alice(0o600));
    assert_eq!(own(&f, "dev/iommu"), alice(0o660));
    assert_eq!(own(&f, "dev/hugepages"), alice(0o755));
    // /dev/vfio/vfio stays as the kernel made it: everyone's.
    assert_eq!(
        own(&f, "dev/vfio/vfio"),
        Owner {
            uid: 0,
            gid: 0,
            mode: 0o666
        }
    );
    // 64 MiB of hugepages: alice's shell may now lock that much.
    assert_eq!(
        memlock_of(&f.host(), 4242).unwrap(),
        (Some(64 << 20), Some(64 << 20))
    );
    assert_eq!(
        memlock_of(&f.host(), 4343).unwrap(),
        (Some(8 << 20), Some(8 << 20))
    );
    let g = grants(&ctx.state_dir);
    assert_eq!(g.len(), 5, "{g:?}");
    let iommu = g.iter().find(|x| x.path.ends_with("dev/iommu")).unwrap();
    assert_eq!((iommu.bdf, iommu.to, iommu.was.mode), (None, 1000, 0o660));
    let cdev = g.iter().find(|x| x.path.ends_with("vfio0")).unwrap();
    assert_eq!(cdev.bdf, Some("0000:00:03.0".parse().unwrap()));

    // Again: nothing changes, the records keep the original owners.
    setup::run(&ctx, args(Some("alice"), &["nvme"], &[4242])).unwrap();
    assert_eq!(grants(&ctx.state_dir), g);

    // Reset of one device: only its nodes go back.
    let lines = undo(
        &f.host(),
        &ctx.state_dir,
        Scope::Devices(&["0000:00:03.0".parse().unwrap()]),
    )
    .unwrap();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines[0].contains("dev/vfio/3 back to owner root (uid 0), mode 600"),
        "{lines:?}"
    );
    assert_eq!(own(&f, "dev/vfio/3").uid, 0);
    assert_eq!(own(&f, "dev/vfio/devices/vfio0").uid, 0);
    assert_eq!(own(&f, "dev/vfio/4").uid, 1000);
    // A node that changed hands since (re-created for another binding) is left alone.
    set_owner(
        &f.host(),
        &f.path("dev/vfio/4"),
        Owner {
            uid: 0,
            gid: 0,
            mode: 0o600,
        },
    )
    .unwrap();
    let lines = undo(&f.host(), &ctx.state_dir, Scope::All).unwrap();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(
        own(&f, "dev/iommu"),
        Owner {
            uid: 0,
            gid: 0,
            mode: 0o660
        }
    );
    assert_eq!(
        own(&f, "dev/hugepages"),
        Owner {
            uid: 0,
            gid: 0,
            mode: 0o755
        }
    );
    assert!(grants(&ctx.state_dir).is_empty());
    assert!(!ctx.state_dir.join(GRANTS_FILE).exists());
}

#[test]
fn dry_run_changes_nothing() {
    let f = ready();
    let ctx = Ctx::new(Some(f.root().to_owned()));
    let mut a = args(Some("alice"), &["nvme"], &[4242]);
    a.dry_run = true;
    setup::run(&ctx, a).unwrap();
    assert_eq!(own(&f, "dev/vfio/3").uid, 0);
    assert_eq!(own(&f, "dev/iommu").uid, 0);
    assert!(grants(&ctx.state_dir).is_empty());
    assert_eq!(memlock_of(&f.host(), 4242).unwrap().0, Some(8 << 20));
}

#[test]
fn noiommu_stays_root_only() {
    let f = ready();
    let ctx = Ctx::new(Some(f.root().to_owned()));
    let mut a = args(Some("alice"), &["nvme"], &[]);
    a.noiommu = true;
    let e = setup::run(&ctx, a).unwrap_err().to_string();
    assert!(
        e.contains("--user cannot be given with --noiommu: no-IOMMU mode needs root"),
        "{e}"
    );
    assert!(
        e.contains("CAP_SYS_RAWIO") && e.contains("/proc/self/pagemap"),
        "{e}"
    );
    assert_eq!(own(&f, "dev/vfio/3").uid, 0, "nothing changed");

    // A device in a no-IOMMU group (a machine without IOMMU): refused with the same reason.
    std::fs::rename(f.path("dev/vfio/4"), f.path("dev/vfio/noiommu-4")).unwrap();
    let e = setup::run(&ctx, args(Some("alice"), &["0000:00:04.0"], &[]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("1 setup step(s) failed"), "{e}");
    assert!(grants(&ctx.state_dir)
        .iter()
        .all(|g| !g.path.ends_with("noiommu-4")));
}

#[test]
fn memlock_only_for_the_users_processes_and_never_lower() {
    let f = ready();
    let h = f.host();
    let alice = resolve(&h, "alice").unwrap();
    let e = raise_memlock(&h, &alice, 4343, 64 << 20, false)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("process 4343 runs as bob, not alice (uid 1000)"),
        "{e}"
    );
    let e = raise_memlock(&h, &alice, 999, 64 << 20, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no process 999"), "{e}");
    let l = raise_memlock(&h, &alice, 4242, 128 << 20, false).unwrap();
    assert_eq!(
        l,
        "memlock: raised process 4242's limit from 8192 KiB (hard 8192 KiB) to 131072 KiB (hard 131072 KiB)"
    );
    let l = raise_memlock(&h, &alice, 4242, 64 << 20, false).unwrap();
    assert!(
        l.ends_with("may lock 131072 KiB (>= 65536 KiB); unchanged"),
        "{l}"
    );
    assert_eq!(memlock_of(&h, 4242).unwrap(), (Some(128 << 20), Some(128 << 20)));
}

#[test]
fn memlock_advice_names_every_way() {
    let u = User {
        name: "alice".into(),
        uid: 1000,
        gid: Some(1000),
    };
    let l = memlock_advice(&u, 64 << 20).join("\n");
    assert!(l.contains("must be at least 65536 KiB"), "{l}");
    assert!(
        l.contains("`alice - memlock 65536` to /etc/security/limits.conf"),
        "{l}"
    );
    assert!(l.contains("LimitMEMLOCK=64M"), "{l}");
    assert!(l.contains("prlimit --memlock=67108864 --pid PID"), "{l}");
    assert!(
        l.contains("vfpoll setup --user alice --hugepages 64 --pid PID"),
        "{l}"
    );
}
