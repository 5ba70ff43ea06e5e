//! Pools, reservation and mounts against fake trees.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::*;

/// Plays the kernel for `nr_hugepages` writes: it finds at most `max_per_pool` pages, and the new
/// pages are free. Counts writes.
struct FakePools {
    max_per_pool: u64,
    writes: Vec<(PathBuf, String)>,
}

impl KernelOps for FakePools {
    fn write_attr(&mut self, path: &Path, value: &str) -> io::Result<()> {
        self.writes.push((path.to_owned(), value.to_owned()));
        let want: u64 = value
            .parse()
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let dir = path.parent().unwrap();
        let old: u64 = fs::read_to_string(path)?.trim().parse().unwrap();
        let got = want.min(self.max_per_pool);
        let free: u64 = fs::read_to_string(dir.join("free_hugepages"))?
            .trim()
            .parse()
            .unwrap();
        fs::write(
            dir.join("free_hugepages"),
            format!("{}\n", free + got.saturating_sub(old)),
        )?;
        fs::write(path, format!("{got}\n"))
    }

    fn load_module(&mut self, _: &str) -> Result<(), String> {
        unreachable!("no modules here")
    }
}

fn fake_pool(dir: &Path, total: u64, free: u64) {
    fs::create_dir_all(dir).unwrap();
    fs::write(dir.join("nr_hugepages"), format!("{total}\n")).unwrap();
    fs::write(dir.join("free_hugepages"), format!("{free}\n")).unwrap();
    fs::write(dir.join("surplus_hugepages"), "0\n").unwrap();
}

/// A machine with 2M and 1G pools and `nodes` NUMA nodes (0 = no node folders).
fn machine(nodes: u32) -> (tempfile::TempDir, Host) {
    let t = tempfile::tempdir().unwrap();
    let host = Host::under(t.path());
    for size in [PageSize::SIZE_2M, PageSize::SIZE_1G] {
        fake_pool(&pool_dir(&host, size, None), 0, 0);
        for n in 0..nodes {
            fake_pool(&pool_dir(&host, size, Some(n)), 0, 0);
        }
    }
    // A node without memory (no hugepages folder) is not a node for pools.
    fs::create_dir_all(host.sys.join("devices/system/node/node9")).unwrap();
    fs::create_dir_all(&host.proc).unwrap();
    fs::write(host.proc.join("mounts"), "sysfs /sys sysfs rw 0 0\n").unwrap();
    (t, host)
}

#[test]
fn page_sizes_parse_and_print() {
    for (s, kib) in [
        ("2M", 2048),
        ("2m", 2048),
        ("2048kB", 2048),
        ("1G", 1 << 20),
        ("1GiB", 1 << 20),
        ("64K", 64),
    ] {
        assert_eq!(s.parse::<PageSize>().unwrap().kib(), kib, "{s}");
    }
    assert_eq!(PageSize::SIZE_2M.to_string(), "2M");
    assert_eq!(PageSize::SIZE_1G.to_string(), "1G");
    assert_eq!(PageSize::from_kib(64).to_string(), "64K");
    assert_eq!(PageSize::SIZE_2M.dir_name(), "hugepages-2048kB");
    for bad in ["", "2", "3M", "2T", "M", "0M"] {
        let e = bad.parse::<PageSize>().unwrap_err();
        assert!(e.to_string().contains("2M or 1G"), "{bad}: {e}");
    }
    assert_eq!(PageSize::SIZE_2M.pages_for(64 << 20), 32);
    assert_eq!(PageSize::SIZE_2M.pages_for(1), 1);
    assert_eq!(PageSize::SIZE_1G.pages_for(64 << 20), 1);
}

#[test]
fn reads_pools_per_node_or_machine_wide() {
    let (_t, host) = machine(2);
    fake_pool(&pool_dir(&host, PageSize::SIZE_2M, Some(1)), 16, 10);
    assert_eq!(numa_nodes(&host), [0, 1]);
    assert_eq!(sizes(&host), [PageSize::SIZE_2M, PageSize::SIZE_1G]);
    let p = pools(&host).unwrap();
    assert_eq!(p.len(), 4);
    assert_eq!(
        p[1],
        Pool {
            size: PageSize::SIZE_2M,
            node: Some(1),
            total: 16,
            free: 10,
            surplus: 0
        }
    );

    let (_t, flat) = machine(0);
    fake_pool(&pool_dir(&flat, PageSize::SIZE_2M, None), 64, 64);
    let p = pools(&flat).unwrap();
    assert_eq!(p.len(), 2);
    assert_eq!((p[0].node, p[0].total), (None, 64));
}

#[test]
fn reserves_at_least_and_never_shrinks() {
    let (_t, host) = machine(0);
    let mut k = FakePools {
        max_per_pool: 1000,
        writes: Vec::new(),
    };
    let r = reserve_with(&host, &mut k, PageSize::SIZE_2M, None, 32).unwrap();
    assert_eq!((r.before, r.after, r.changed()), (0, 32, true));
    assert_eq!(k.writes.len(), 1);
    assert!(k.writes[0]
        .0
        .ends_with("kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"));
    let r = reserve_with(&host, &mut k, PageSize::SIZE_2M, None, 16).unwrap();
    assert_eq!((r.before, r.after, r.changed()), (32, 32, false));
    assert_eq!(k.writes.len(), 1, "a big enough pool is not written");
    assert_eq!(pool(&host, PageSize::SIZE_2M, None).unwrap().free, 32);
}

#[test]
fn shortfall_says_memory_is_fragmented() {
    let (_t, host) = machine(0);
    let mut k = FakePools {
        max_per_pool: 10,
        writes: Vec::new(),
    };
    let e = reserve_with(&host, &mut k, PageSize::SIZE_2M, None, 32).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(
            e,
            HugepageError::Shortfall {
                got: 10,
                wanted: 32,
                ..
            }
        ),
        "{msg}"
    );
    assert!(msg.contains("only 10 of 32 huge pages of 2M"), "{msg}");
    assert!(
        msg.contains("fragmented") && msg.contains("drop_caches") && msg.contains("compact_memory"),
        "{msg}"
    );
    assert!(msg.contains("hugepages=32"), "{msg}");
    let e = reserve_with(&host, &mut k, PageSize::SIZE_1G, None, 16).unwrap_err();
    assert!(e.to_string().contains("hugepagesz=1G hugepages=16"), "{e}");
}

#[test]
fn spreads_over_nodes() {
    assert_eq!(spread(5, 2), [3, 2]);
    assert_eq!(spread(1, 3), [1, 0, 0]);
    assert_eq!(spread(8, 0), [8]);
    let (_t, host) = machine(2);
    let mut k = FakePools {
        max_per_pool: 1000,
        writes: Vec::new(),
    };
    let r = reserve_spread_with(&host, &mut k, PageSize::SIZE_2M, 33).unwrap();
    assert_eq!(
        r.iter().map(|r| (r.node, r.after)).collect::<Vec<_>>(),
        [(Some(0), 17), (Some(1), 16)]
    );
    assert!(k.writes[0]
        .0
        .ends_with("node0/hugepages/hugepages-2048kB/nr_hugepages"));

    // One node short: the other is still reserved, and the error names the node.
    let (_t, host) = machine(2);
    fake_pool(&pool_dir(&host, PageSize::SIZE_2M, Some(0)), 0, 0);
    let mut k = FakePools {
        max_per_pool: 5,
        writes: Vec::new(),
    };
    let e = reserve_spread_with(&host, &mut k, PageSize::SIZE_2M, 12).unwrap_err();
    assert!(
        e.to_string()
            .contains("only 5 of 6 huge pages of 2M could be reserved on NUMA node 0"),
        "{e}"
    );
    assert_eq!(k.writes.len(), 2);
}

#[test]
fn missing_size_or_node_says_what_exists() {
    let (_t, host) = machine(2);
    fs::remove_dir_all(pool_dir(&host, PageSize::SIZE_1G, None)).unwrap();
    fs::remove_dir_all(pool_dir(&host, PageSize::SIZE_1G, Some(0))).unwrap();
    let mut k = FakePools {
        max_per_pool: 1000,
        writes: Vec::new(),
    };
    let e = reserve_with(&host, &mut k, PageSize::SIZE_1G, Some(0), 1).unwrap_err();
    assert!(
        e.to_string().contains("no 1G huge pages") && e.to_string().contains("pdpe1gb"),
        "{e}"
    );
    let e = reserve_with(&host, &mut k, PageSize::SIZE_2M, Some(4), 1).unwrap_err();
    assert!(
        e.to_string().contains("no NUMA node 4") && e.to_string().contains("the nodes are: 0, 1"),
        "{e}"
    );
    assert!(k.writes.is_empty());
}

struct FakeMount(Vec<(PathBuf, String)>);

impl MountOps for FakeMount {
    fn mount_hugetlbfs(&mut self, target: &Path, options: &str) -> io::Result<()> {
        self.0.push((target.to_owned(), options.to_owned()));
        Ok(())
    }
}

#[test]
fn mounts_unless_mounted() {
    let (_t, host) = machine(0);
    let mut m = FakeMount(Vec::new());
    let p = Path::new(DEFAULT_MOUNT);
    let out = ensure_mounted_with(&host, &mut m, p, PageSize::SIZE_2M).unwrap();
    assert_eq!(
        out,
        MountOutcome::Mounted {
            path: p.into(),
            options: "pagesize=2M".into()
        }
    );
    assert_eq!(m.0, [(p.to_owned(), "pagesize=2M".to_owned())]);

    fs::write(
        host.proc.join("mounts"),
        "hugetlbfs /dev/hugepages hugetlbfs rw,relatime,pagesize=2M 0 0\n\
         none /mnt/huge\\0401G hugetlbfs rw,pagesize=1024M 0 0\n",
    )
    .unwrap();
    let all = hugetlbfs_mounts(&host).unwrap();
    assert_eq!(all[1].path, Path::new("/mnt/huge 1G"));
    assert_eq!(all[1].page_size, Some(PageSize::SIZE_1G));
    m.0.clear();
    let out = ensure_mounted_with(&host, &mut m, Path::new("/dev/hugepages/"), PageSize::SIZE_2M).unwrap();
    assert!(matches!(out, MountOutcome::AlreadyMounted(_)));
    assert!(m.0.is_empty());
    let e = ensure_mounted_with(&host, &mut m, p, PageSize::SIZE_1G).unwrap_err();
    assert!(
        e.to_string().contains("holds a hugetlbfs of 2M pages, not 1G"),
        "{e}"
    );
}

#[test]
fn memlock_and_capabilities() {
    let lim = Memlock {
        soft: Some(8 << 20),
        hard: None,
    };
    assert!(lim.allows(8 << 20) && !lim.allows((8 << 20) + 1));
    assert!(Memlock {
        soft: None,
        hard: None
    }
    .allows(u64::MAX));
    assert!(Memlock::current().is_ok());

    let (_t, host) = machine(0);
    assert_eq!(cap_ipc_lock(&host), None);
    fs::create_dir_all(host.proc.join("self")).unwrap();
    fs::write(
        host.proc.join("self/status"),
        "Name:\tx\nCapEff:\t000001ffffffffff\n",
    )
    .unwrap();
    assert_eq!(cap_ipc_lock(&host), Some(true));
    fs::write(
        host.proc.join("self/status"),
        "Name:\tx\nCapEff:\t0000000000000000\n",
    )
    .unwrap();
    assert_eq!(cap_ipc_lock(&host), Some(false));
}
