//! `vfpoll target` with several listeners, and reconfigured while hosts use it (issue 11),
//! against the guest kernel's NVMe/TCP initiator over loopback:
//!
//! - **Multipath**: one subsystem on two listeners (ports 4420 and 4421) serving controller
//!   B's namespace 1 through vfpoll's NVMe driver. The host connects to both: two controllers
//!   of one subsystem, one namespace head (native NVMe multipath), both paths carrying I/O
//!   (round-robin). fio writes and verifies through the head while listener 1 is removed
//!   (`--config` edited, SIGHUP): its controller loses its connection, I/O goes on over the
//!   other path, nothing is lost; listener 1 comes back and the host reconnects. Before that,
//!   ANA: listener 1 made inaccessible by a reload, the host reads the ANA change and sends I/O
//!   over listener 2 only, until it is optimized again.
//! - **Reload**: a namespace added and removed at run time appears and disappears on the host
//!   (Namespace Attribute Changed events); a subsystem added appears in the discovery log and
//!   one restricted to another host refuses this one; a broken file is refused and the target
//!   keeps serving; `--stats-json` counts per subsystem.
//!
//! Run: `cargo xtask test --filter nvmf_multipath` (both IOMMU modes).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use vfpoll_tests::*;

/// The subsystem every test serves.
const NQN: &str = "nqn.2024-01.io.vfpoll:multipath-test";
/// A subsystem added at run time.
const NQN2: &str = "nqn.2024-01.io.vfpoll:added-at-run-time";
/// How long the kernel may take to show (or drop) a fabric namespace under TCG.
const NS_TIMEOUT: Duration = Duration::from_secs(30);
/// fio's buffers in SysV shared memory (small pages): see nvmf_target_fs.rs.
const FIO_MEM: &str = "--mem=shm";
/// The second listener's TCP port.
const PORT2: u16 = 4421;

/// The target's configuration file.
fn config_path() -> PathBuf {
    PathBuf::from("/tmp/vfpoll-target-multipath.toml")
}

/// A configuration: listeners `(port ID, TCP port)`, subsystem [`NQN`] with `namespaces` (TOML
/// of its `[[subsystem.namespace]]` tables), then `more` (other subsystems).
fn write_config(listeners: &[(u16, u16)], namespaces: &str, more: &str) {
    write_config_ana(listeners, None, namespaces, more);
}

/// [`write_config`] with listener 1's ANA state `ana1` (`None`: optimized, the default).
fn write_config_ana(listeners: &[(u16, u16)], ana1: Option<&str>, namespaces: &str, more: &str) {
    let mut t = String::new();
    if mode() == vfpoll_pci::vfio::IommuMode::NoIommu {
        t += "noiommu = true\n";
    }
    for (id, port) in listeners {
        t += &format!("[[listener]]\naddress = \"127.0.0.1:{port}\"\nport_id = {id}\n");
        if let (1, Some(state)) = (id, ana1) {
            t += &format!("ana_state = \"{state}\"\n");
        }
        t += "\n";
    }
    t += &format!("[[subsystem]]\nnqn = \"{NQN}\"\n\n{namespaces}\n{more}");
    fs::write(config_path(), t).unwrap();
}

fn malloc_ns(nsid: u32, size: &str) -> String {
    format!("[[subsystem.namespace]]\nnsid = {nsid}\nmalloc = \"{size}\"\n\n")
}

fn setup() {
    load_modules(NVME_TCP_MODULES);
    loopback_up();
    // The target's data buffers: 256 of 128 KiB in 2 MiB pages per worker (and NVMe queues).
    reserve_hugepages(40);
}

/// Waits up to `timeout` for `f` to hold; panics with `what` otherwise.
fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(
            t0.elapsed() < timeout,
            "{what}: not after {timeout:?}\n{}",
            kernel_log_tail(8)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The kernel's NVMe subsystem directory of subsystem `nqn` (`/sys/class/nvme-subsystem/...`).
fn nvme_subsystem_dir(nqn: &str) -> PathBuf {
    fs::read_dir("/sys/class/nvme-subsystem")
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| fs::read_to_string(p.join("subsysnqn")).is_ok_and(|s| s.trim() == nqn))
        .unwrap_or_else(|| panic!("no /sys/class/nvme-subsystem entry for {nqn}"))
}

/// Controller `ctrl`'s path to namespace 1: the hidden `nvme<S>c<C>n<H>` disk of native
/// multipath, in sysfs.
fn path_dir(ctrl: &FabricController) -> PathBuf {
    let dir = ctrl.sysfs_dir();
    let path = fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("nvme") && n.contains('c') && n.ends_with("n1"))
        .unwrap_or_else(|| panic!("{}: no multipath path disk for namespace 1", dir.display()));
    dir.join(path)
}

/// The ANA state the host sees on `ctrl`'s path (`optimized`, `inaccessible`, ...).
fn path_ana_state(ctrl: &FabricController) -> String {
    fs::read_to_string(path_dir(ctrl).join("ana_state"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Reads and writes completed on controller `ctrl`'s path to namespace 1.
fn path_ios(ctrl: &FabricController) -> (u64, u64) {
    let stat = fs::read_to_string(path_dir(ctrl).join("stat")).unwrap();
    let f: Vec<u64> = stat.split_whitespace().map(|x| x.parse().unwrap()).collect();
    (f[0], f[4])
}

fn connect(port: u16) -> FabricController {
    FabricController::connect(&NvmeConnect {
        trsvcid: port,
        nr_io_queues: Some(1),
        // Reconnect attempts every second (the default is 10 s) for a minute.
        extra: &["--reconnect-delay=1", "--ctrl-loss-tmo=60"],
        ..NvmeConnect::loopback(NQN)
    })
}

fn write_read(dev: &Path, stream: u64) {
    let mut offsets = Pattern::new(seed(), 700 + stream);
    for (len, s) in [(4096usize, 1u64), (64 << 10, 2), (128 << 10, 3)] {
        let offset = (offsets.next_u64() % 512) * 4096;
        let data = Pattern::new(seed(), stream * 10 + s).bytes(len);
        dd_write_direct(dev, offset, &data);
        let back = dd_read_direct(dev, offset, len);
        assert!(
            back == data,
            "{len} bytes at {offset} read back through {} differ",
            dev.display()
        );
    }
}

/// fio writing 8 MiB from 16 MiB in 4 KiB blocks at 250 IOPS (so it lasts ~8 s whatever
/// TCG's speed), then verifying it at the same rate, through `dev`.
fn fio_write_verify(dev: &Path) -> std::process::Child {
    Command::new("fio")
        .args([
            "--name=multipath",
            &format!("--filename={}", dev.display()),
            "--offset=16M",
            "--size=8M",
            "--ioengine=io_uring",
            FIO_MEM,
            "--direct=1",
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=4",
            "--rate_iops=250,250",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("fio")
}

#[test]
#[ignore = "test bed"]
fn guest_two_listeners_are_two_paths_and_io_survives_losing_one() {
    setup();
    bind_all(&[NVME_B]);
    let ns = format!("[[subsystem.namespace]]\nnsid = 1\nnvme = \"{NVME_B}/1\"\n\n");
    write_config(&[(1, NVMF_TCP_PORT), (2, PORT2)], &ns, "");
    let mut target = VfpollTarget::with_config(&config_path(), NQN, &[]);

    let log = nvme_discover("127.0.0.1", NVMF_TCP_PORT);
    for (portid, port) in [("1", "4420"), ("2", "4421")] {
        assert!(
            log.iter().any(|r| r.get("subnqn") == Some(NQN)
                && r.get("portid") == Some(portid)
                && r.get("trsvcid") == Some(port)),
            "the discovery log lacks {NQN} on port {portid} ({port}): {log:#?}"
        );
    }
    let a = connect(NVMF_TCP_PORT);
    let b = connect(PORT2);
    let subsys = nvme_subsystem_dir(NQN);
    for c in [&a, &b] {
        assert!(
            subsys.join(c.name()).exists(),
            "{} is not a controller of {}: the host did not see one subsystem",
            c.name(),
            subsys.display()
        );
    }
    let head = a.wait_namespace(1, NS_TIMEOUT);
    assert_eq!(
        head,
        b.wait_namespace(1, NS_TIMEOUT),
        "one namespace head over both paths"
    );
    fs::write(subsys.join("iopolicy"), "round-robin").unwrap();
    write_read(&head, 1);
    let (ra, wa) = path_ios(&a);
    let (rb, wb) = path_ios(&b);
    assert!(
        ra + wa > 0 && rb + wb > 0,
        "round-robin I/O did not use both paths: {a:?} {ra}/{wa}, {b:?} {rb}/{wb}"
    );
    assert_eq!(path_ana_state(&a), "optimized");

    // ANA: listener 1 made inaccessible (ANA Change notice, the host re-reads the ANA log):
    // I/O goes over path 2 only; then optimized again.
    let ports = [(1, NVMF_TCP_PORT), (2, PORT2)];
    write_config_ana(&ports, Some("inaccessible"), &ns, "");
    let said = target.reload(1);
    assert!(
        said[0].contains("ANA group 1") && said[0].contains("inaccessible"),
        "{said:?}"
    );
    wait_for(
        "the host seeing path 1 inaccessible",
        Duration::from_secs(20),
        || path_ana_state(&a) == "inaccessible",
    );
    let (a0, b0) = (path_ios(&a), path_ios(&b));
    write_read(&head, 7);
    assert_eq!(path_ios(&a), a0, "I/O on the inaccessible path");
    assert_ne!(path_ios(&b), b0, "no I/O on the optimized path");
    assert_eq!(a.attr("state"), "live", "an inaccessible path stays connected");
    write_config(&ports, &ns, "");
    let said = target.reload(1);
    assert!(
        said[0].contains("ANA group 1") && said[0].contains("optimized"),
        "{said:?}"
    );
    wait_for(
        "the host seeing path 1 optimized again",
        Duration::from_secs(20),
        || path_ana_state(&a) == "optimized",
    );

    // Listener 1 goes while fio writes: its controller loses its connection, I/O fails over.
    let mut fio = fio_write_verify(&head);
    let before = path_ios(&b);
    wait_for("fio's I/O", Duration::from_secs(30), || path_ios(&b) != before);
    write_config(&[(2, PORT2)], &ns, "");
    let said = target.reload(1);
    assert!(
        said[0].contains("listener 1") && said[0].contains("removed"),
        "{said:?}"
    );
    assert!(
        fio.try_wait().unwrap().is_none(),
        "fio ended before the listener was removed"
    );
    wait_for(
        "controller on the removed listener leaving `live`",
        Duration::from_secs(20),
        || a.attr("state") != "live",
    );
    assert_eq!(b.attr("state"), "live");
    let out = fio.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && text.contains("err= 0"),
        "fio across the path loss: {text}"
    );

    // Listener 1 comes back: the host reconnects on its own.
    write_config(&[(1, NVMF_TCP_PORT), (2, PORT2)], &ns, "");
    let said = target.reload(1);
    assert!(
        said[0].contains("listener 1") && said[0].contains("added"),
        "{said:?}"
    );
    wait_for(
        "reconnect through the listener added back",
        Duration::from_secs(30),
        || a.attr("state") == "live",
    );
    write_read(&head, 2);
    a.disconnect();
    b.disconnect();
    assert!(target.is_running());
}

#[test]
#[ignore = "test bed"]
fn guest_reloading_the_config_adds_and_removes_namespaces_subsystems_and_hosts() {
    setup();
    write_config(&[(1, NVMF_TCP_PORT)], &malloc_ns(1, "16M"), "");
    let mut target = VfpollTarget::with_config(&config_path(), NQN, &["--stats-json"]);
    let a = connect(NVMF_TCP_PORT);
    let dev1 = a.wait_namespace(1, NS_TIMEOUT);
    write_read(&dev1, 3);

    // A namespace added: the host hears of it (Namespace Attribute Changed) and scans it.
    let two = malloc_ns(1, "16M") + &malloc_ns(2, "8M");
    write_config(&[(1, NVMF_TCP_PORT)], &two, "");
    let said = target.reload(1);
    assert!(
        said[0].contains("namespace 2") && said[0].contains("added"),
        "{said:?}"
    );
    let dev2 = a.wait_namespace(2, NS_TIMEOUT);
    write_read(&dev2, 4);
    // ... and removed again.
    write_config(&[(1, NVMF_TCP_PORT)], &malloc_ns(1, "16M"), "");
    let said = target.reload(1);
    assert!(
        said[0].contains("namespace 2") && said[0].contains("removed"),
        "{said:?}"
    );
    wait_for("namespace 2 gone from the host", NS_TIMEOUT, || {
        nvme_namespace_device(&a.sysfs_dir(), 2).is_none()
    });

    // A subsystem added for another host only: in the discovery log of... that host alone.
    let other = "nqn.2014-08.org.nvmexpress:uuid:00000000-1111-2222-3333-444444444444";
    let sub2 = format!(
        "[[subsystem]]\nnqn = \"{NQN2}\"\nallow_hosts = [\"{other}\"]\n[[subsystem.namespace]]\nmalloc = \"4M\"\n"
    );
    write_config(&[(1, NVMF_TCP_PORT)], &malloc_ns(1, "16M"), &sub2);
    let said = target.reload(1);
    assert!(said[0].contains(NQN2) && said[0].contains("added"), "{said:?}");
    let refused = nvme_connect_refused(&NvmeConnect::loopback(NQN2));
    assert!(!refused.is_empty());
    // Opened to any host: this one may connect now.
    let sub2_any = format!("[[subsystem]]\nnqn = \"{NQN2}\"\n[[subsystem.namespace]]\nmalloc = \"4M\"\n");
    write_config(&[(1, NVMF_TCP_PORT)], &malloc_ns(1, "16M"), &sub2_any);
    let said = target.reload(1);
    assert!(said[0].contains("any host"), "{said:?}");
    let log = nvme_discover("127.0.0.1", NVMF_TCP_PORT);
    assert!(
        log.iter().any(|r| r.get("subnqn") == Some(NQN2)),
        "{NQN2} not discovered: {log:#?}"
    );
    let c2 = FabricController::connect(&NvmeConnect::loopback(NQN2));
    let dev3 = c2.wait_namespace(1, NS_TIMEOUT);
    write_read(&dev3, 5);

    // A broken file changes nothing.
    fs::write(config_path(), "colour = \"blue\"\n").unwrap();
    let said = target.reload(1);
    assert!(
        said[0].contains("reload refused") && said[0].contains("unknown field"),
        "{said:?}"
    );
    write_read(&dev1, 6);

    // Per-subsystem counters: both subsystems saw writes and reads.
    let t0 = Instant::now();
    loop {
        let line = target.next_line();
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
            let counts = |nqn: &str| {
                v["subsystems"].as_array()?.iter().find(|s| s["nqn"] == nqn)?["io_commands"].as_u64()
            };
            if counts(NQN).unwrap_or(0) > 0 && counts(NQN2).unwrap_or(0) > 0 {
                break;
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no stats line counts I/O on both subsystems: {line}"
        );
    }
    c2.disconnect();
    a.disconnect();
    assert!(target.is_running());
}
