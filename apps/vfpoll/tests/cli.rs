//! The `vfpoll` binary on fake machines (hidden `--root`): what it prints and its exit codes.

use std::process::{Command, Output};

use vfpoll_pci::testing::{guest, Fake};

fn vfpoll(f: &Fake, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vfpoll"))
        .arg("--root")
        .arg(f.root())
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn status_tables_and_json() {
    let f = guest(true);
    f.vfio(Some("N"))
        .pool(2048, None, 16, 8)
        .mount("nodev /dev/hugepages hugetlbfs rw,pagesize=2M 0 0");
    let o = vfpoll(&f, &["status"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = stdout(&o);
    assert!(s.contains("IOMMU: on (dmar0); no-IOMMU mode: off"), "{s}");
    assert!(
        s.contains("BDF           ID         KIND  DRIVER  NODE  GROUP"),
        "{s}"
    );
    assert!(
        s.contains("0000:00:03.0  1b36:0010  nvme  nvme    -     3"),
        "{s}"
    );
    assert!(
        s.contains("0000:00:06.0  8086:10d3  nic   e1000e  -     6"),
        "{s}"
    );
    assert!(!s.contains("0000:00:1f.2"), "SATA is neither NVMe nor NIC: {s}");
    assert!(
        s.contains("2M    all   16     8     0        32 MiB     16 MiB"),
        "{s}"
    );
    assert!(s.contains("hugetlbfs: /dev/hugepages (2M)"), "{s}");

    let o = vfpoll(&f, &["status", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(j["iommu"]["units"][0], "dmar0");
    assert_eq!(j["iommu"]["noiommu"], "off");
    let devs = j["devices"].as_array().unwrap();
    assert_eq!(devs.len(), 4);
    assert_eq!(devs[0]["bdf"], "0000:00:03.0");
    assert_eq!(devs[0]["vendor"], "1b36");
    assert_eq!(devs[0]["kind"], "nvme");
    assert_eq!(devs[0]["iommu_group"], 3);
    assert_eq!(devs[0]["bound_by_vfpoll"], false);
    assert_eq!(j["hugepages"][0]["size"], "2M");
    assert_eq!(j["hugepages"][0]["free"], 8);
    assert_eq!(j["hugepages"][0]["node"], serde_json::Value::Null);
    assert_eq!(j["hugetlbfs"][0]["page_size"], "2M");
}

#[test]
fn status_shows_the_original_driver_and_group_peers() {
    let f = guest(true);
    f.vfio(None);
    // 0000:00:1f.2 was bound by vfpoll (recorded) and shares group 7 with LPC and SMBus.
    let link = f.path("sys/devices/pci0000:00/0000:00:1f.2/driver");
    std::fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink(f.path("sys/bus/pci/drivers/vfio-pci"), link).unwrap();
    f.write("run/vfpoll/bound/0000:00:1f.2", "driver=ahci\n");
    let s = stdout(&vfpoll(&f, &["status"]));
    assert!(
        s.contains("0000:00:1f.2  8086:2922  storage  vfio-pci (was ahci)  -     7      0000:00:1f.0 lpc_ich, 0000:00:1f.3 i801_smbus"),
        "{s}"
    );
}

#[test]
fn doctor_exit_codes() {
    let f = guest(false);
    let o = vfpoll(&f, &["doctor"]);
    assert_eq!(o.status.code(), Some(1));
    let s = stdout(&o);
    assert!(s.contains("FAIL  iommu: no IOMMU is on"), "{s}");
    assert!(
        s.contains("FAIL  modules: vfio-pci is not loaded\n      fix: modprobe vfio-pci"),
        "{s}"
    );
    assert!(s.lines().last().unwrap().starts_with("doctor: "), "{s}");

    let o = vfpoll(&f, &["doctor", "--noiommu"]);
    assert!(
        stdout(&o).contains("FAIL  no-iommu: vfio is not loaded, so no-IOMMU mode is off"),
        "{}",
        stdout(&o)
    );

    // The guest after `vfpoll setup --bind 0000:00:03.0` in no-IOMMU mode: all OK.
    f.vfio(Some("Y"))
        .pool(2048, None, 32, 32)
        .mount("nodev /dev/hugepages hugetlbfs rw,pagesize=2M 0 0");
    let link = f.path("sys/devices/pci0000:00/0000:00:03.0/driver");
    std::fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink(f.path("sys/bus/pci/drivers/vfio-pci"), &link).unwrap();
    std::fs::create_dir_all(f.path("sys/kernel/iommu_groups/0/devices")).unwrap();
    std::os::unix::fs::symlink(
        f.path("sys/kernel/iommu_groups/0"),
        f.path("sys/devices/pci0000:00/0000:00:03.0/iommu_group"),
    )
    .unwrap();
    f.group_node("noiommu-0");
    let o = vfpoll(&f, &["doctor", "--noiommu"]);
    let s = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{s}");
    assert!(
        s.contains("OK    0000:00:03.0: (nvme 1b36:0010) on vfio-pci, group 0 viable"),
        "{s}"
    );
    assert!(s.contains("noiommu-0 read-write"), "{s}");
}

#[test]
fn setup_dry_run_prints_the_plan() {
    let f = guest(true);
    f.vfio(None);
    // The second controller holds a mounted file system.
    f.write(
        "sys/bus/pci/devices/0000:00:04.0/nvme/nvme1/nvme1n1/dev",
        "259:0\n",
    )
    .mount("/dev/nvme1n1 /data ext4 rw 0 0");
    let o = vfpoll(
        &f,
        &[
            "setup",
            "--dry-run",
            "--hugepages",
            "64",
            "--bind",
            "nvme",
            "--bind",
            "0000:00:07.0",
        ],
    );
    let s = stdout(&o);
    assert!(o.status.success(), "{s}{}", stderr(&o));
    let lines: Vec<&str> = s.lines().collect();
    assert_eq!(
        lines,
        [
            "hugepages: would grow the machine-wide 2M pool from 0 to 32 pages",
            "hugetlbfs: would mount (pagesize=2M) on /dev/hugepages",
            "bind 0000:00:03.0 (nvme 1b36:0010): would move from nvme to vfio-pci",
            "bind 0000:00:04.0: skipped: 0000:00:04.0 is in use by the kernel: /dev/nvme1n1 is mounted on /data; umount /data, or pass --force to take it anyway",
            "bind 0000:00:07.0 (memory 1af4:1110): would move from no driver to vfio-pci",
        ]
    );
    // Nothing changed.
    assert_eq!(
        std::fs::read_to_string(f.path("sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages")).unwrap(),
        "0\n"
    );
    assert!(!f.path("run/vfpoll").exists());
}

#[test]
fn setup_dry_run_plans_module_loading() {
    let f = guest(true);
    let o = vfpoll(&f, &["setup", "--dry-run", "--bind", "0000:00:05.0"]);
    let s = stdout(&o);
    assert!(o.status.success(), "{s}{}", stderr(&o));
    assert!(s.contains("\nmodules: would load vfio-pci, vfio_iommu_type1\nbind 0000:00:05.0 (nic 8086:10d3): would move from e1000e to vfio-pci\n"), "{s}");
    // For real, under --root no module is loaded: the step fails and says how to load it.
    let o = vfpoll(&f, &["setup", "--bind", "0000:00:05.0"]);
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(
        e.contains("not loading vfio-pci: --root names a fake tree; load it: modprobe vfio-pci"),
        "{e}"
    );
}

#[test]
fn setup_reserves_and_reports_failures() {
    let f = guest(true);
    f.vfio(None)
        .mount("nodev /dev/hugepages hugetlbfs rw,pagesize=2M 0 0");
    let o = vfpoll(&f, &["setup", "--hugepages", "8", "--bind", "none"]);
    let s = stdout(&o);
    assert!(o.status.success(), "{s}{}", stderr(&o));
    assert_eq!(
        s,
        "hugepages: grow the machine-wide 2M pool from 0 to 4 pages\nhugetlbfs: mounted on /dev/hugepages; unchanged\n"
    );
    let o = vfpoll(&f, &["setup", "--hugepages", "8", "--bind", "none"]);
    assert!(stdout(&o).starts_with("hugepages: the machine-wide 2M pool holds 4 pages (>= 4); unchanged\n"));

    // A node that does not exist and a device that does not exist: both reported, exit 1.
    let o = vfpoll(
        &f,
        &[
            "setup",
            "--node",
            "3",
            "--bind",
            "0000:00:1e.0",
            "--mount",
            "/dev/hugepages",
        ],
    );
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(e.contains("there is no NUMA node 3 with huge pages"), "{e}");
    assert!(e.contains("no PCI device 0000:00:1e.0"), "{e}");
    assert!(e.contains("2 setup step(s) failed"), "{e}");
}

#[test]
fn bind_and_reset_messages() {
    let f = guest(true);
    f.vfio(None);
    let o = vfpoll(&f, &["bind", "0000:00:1e.0"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("`vfpoll status` lists the devices present"),
        "{}",
        stderr(&o)
    );
    let o = vfpoll(&f, &["bind", "00:1e"]);
    assert_eq!(o.status.code(), Some(2), "clap rejects a malformed address");
    assert!(stderr(&o).contains("DDDD:BB:DD.F"), "{}", stderr(&o));

    let o = vfpoll(&f, &["reset"]);
    assert!(o.status.success());
    assert!(
        stdout(&o).starts_with("nothing to give back: vfpoll has bound no device"),
        "{}",
        stdout(&o)
    );
    let o = vfpoll(&f, &["unbind", "0000:00:03.0"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        "reset 0000:00:03.0: not on vfio-pci (nvme); left alone\n"
    );
}

#[test]
fn status_says_which_iommu_backend_a_run_uses_and_why() {
    let f = guest(true);
    f.vfio(None).group_node("3");
    let link = f.path("sys/devices/pci0000:00/0000:00:03.0/driver");
    std::fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink(f.path("sys/bus/pci/drivers/vfio-pci"), link).unwrap();
    // No /dev/iommu: auto takes type1, and says why.
    let s = stdout(&vfpoll(&f, &["status"]));
    assert!(
        s.contains("IOMMU backend of a run (--iommu-backend auto): type1 (auto: ")
            && s.contains("dev/iommu is missing (iommufd is not loaded: `modprobe iommufd`"),
        "{s}"
    );
    // /dev/iommu and A's cdev: iommufd.
    f.write("dev/iommu", "");
    std::fs::create_dir_all(f.path("sys/devices/pci0000:00/0000:00:03.0/vfio-dev/vfio0")).unwrap();
    f.write("dev/vfio/devices/vfio0", "");
    let s = stdout(&vfpoll(&f, &["status"]));
    assert!(
        s.contains("IOMMU backend of a run (--iommu-backend auto): iommufd (auto: ")
            && s.contains("0000:00:03.0 is vfio0"),
        "{s}"
    );
    let o = vfpoll(&f, &["status", "--json"]);
    let j: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(j["backend"]["backend"], "iommufd");
    assert_eq!(j["backend"]["requested"], "auto");
    assert_eq!(j["backend"]["dev_iommu"], true);
    assert!(
        j["devices"][0]["vfio_cdev"]
            .as_str()
            .unwrap()
            .ends_with("dev/vfio/devices/vfio0"),
        "{j}"
    );
    assert_eq!(j["devices"][1]["vfio_cdev"], serde_json::Value::Null);
    // Another backend asked for: taken as it is.
    let s = stdout(&vfpoll(&f, &["status", "--iommu-backend", "type1"]));
    assert!(s.contains("(--iommu-backend type1): type1 (asked for"), "{s}");
    // A name clap does not know, and a contradiction: refused with the choices / the reason.
    let o = vfpoll(&f, &["status", "--iommu-backend", "vfio"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("use one of auto, iommufd, type1, noiommu"),
        "{}",
        stderr(&o)
    );
    let o = vfpoll(
        &f,
        &[
            "identify",
            "--device",
            "0000:00:03.0",
            "--noiommu",
            "--iommu-backend",
            "iommufd",
        ],
    );
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("--noiommu means --iommu-backend noiommu"),
        "{}",
        stderr(&o)
    );
}
