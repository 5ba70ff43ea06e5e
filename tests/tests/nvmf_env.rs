//! The NVMe/TCP test environment (issue 11), in one boot: the tools and kernel modules the
//! NVMe/TCP tests need run in the guest, and the Linux kernel's own target (`nvmet-tcp`, set up
//! over configfs) serves controller B's namespace to the kernel's initiator over loopback:
//! discover, connect with two I/O queues (plain, then with header and data digests), O_DIRECT
//! writes read back through the fabric and through the backing controller, fio verify, ext4
//! (mkfs, mount, fsck), disconnect, teardown. The host then finds every write in
//! `nvme-b-ns1.img`. The helpers (`vfpoll_tests::nvmf`) are what the tests of `vfpoll target`
//! and its benchmark against the kernel target use.
//!
//! Run: `cargo xtask test --filter nvmf_env` (both IOMMU modes; `--mode iommu` for one).
//!
//! # The commands, as a shell in the guest would run them
//!
//! ```text
//! busybox modprobe crc32c_generic configfs nvmet nvmet-tcp nvme-tcp ext4   # one per call
//! busybox mount -t configfs configfs /sys/kernel/config
//! busybox ip link set lo up
//! cd /sys/kernel/config/nvmet
//! mkdir subsystems/$NQN && echo 1 > subsystems/$NQN/attr_allow_any_host
//! mkdir subsystems/$NQN/namespaces/1
//! echo /dev/nvme1n1 > subsystems/$NQN/namespaces/1/device_path   # B's namespace, see below
//! echo 1 > subsystems/$NQN/namespaces/1/enable
//! mkdir ports/1 && echo tcp > ports/1/addr_trtype && echo ipv4 > ports/1/addr_adrfam
//! echo 127.0.0.1 > ports/1/addr_traddr && echo 4420 > ports/1/addr_trsvcid
//! ln -s /sys/kernel/config/nvmet/subsystems/$NQN ports/1/subsystems/$NQN
//! nvme discover -t tcp -a 127.0.0.1 -s 4420 --hostnqn $HOSTNQN --hostid $HOSTID
//! nvme connect -t tcp -a 127.0.0.1 -s 4420 -n $NQN --hostnqn $HOSTNQN --hostid $HOSTID \
//!     --nr-io-queues 2 [--hdr-digest --data-digest]
//! dd of=/dev/nvme5n1 bs=4096 count=1 seek=$OFF iflag=fullblock oflag=direct,seek_bytes conv=fsync
//! dd if=/dev/nvme5n1 bs=4096 count=1 skip=$OFF iflag=direct,skip_bytes
//! nvme disconnect -d nvme5
//! rm ports/1/subsystems/$NQN; rmdir ports/1
//! echo 0 > subsystems/$NQN/namespaces/1/enable; rmdir subsystems/$NQN/namespaces/1
//! rmdir subsystems/$NQN
//! ```
//!
//! # Pitfalls
//!
//! - **Nothing autoloads.** The kernel's usermode helper is `/sbin/modprobe`, which the init's
//!   root (a busybox initramfs) lacks, and the host has no kmod: every module is loaded up front
//!   with `busybox modprobe`, which follows `modules.dep` but ignores soft dependencies. Without
//!   `crc32c_generic`, `nvme connect --hdr-digest` fails with "Failed to write to
//!   /dev/nvme-fabrics: No such file or directory" (dmesg: "failed to allocate queue 0 crypto"),
//!   and ext4 (soft dependency `pre: crypto-crc32c`) cannot mount a metadata_csum file system.
//!   Without `nvmet-tcp`, linking a TCP port fails (nvmet requests `nvmet-transport-3`).
//!   The modules are in the guest's `/lib/modules` (every module of the kernel) and the
//!   NVMe/TCP ones also in the initramfs, so `cargo xtask vm --modules ...,nvme-tcp` may name
//!   them; none is loaded at boot by default.
//! - **configfs is not mounted** in the guest; mount it once at `/sys/kernel/config`. Its
//!   entries go with `rm` (links) and `rmdir` (directories, innermost first); `rm -r` fails.
//! - **`lo` starts down** (the init configures no network; the NICs' hub leads nowhere).
//! - **Device names are not fixed**: controller numbers follow probe order and the fabric
//!   controller takes the next free one, so B's namespace is found through sysfs by its PCI
//!   address (`/sys/bus/pci/devices/0000:00:04.0/nvme/nvme*/nvme*n1`), the fabric controller as
//!   the TCP controller of the NQN that `nvme connect` added. With native multipath
//!   (`CONFIG_NVME_MULTIPATH=y`) a fabric namespace shows under its controller as the hidden
//!   path `nvme5c5n1`; the block device is the head `/dev/nvme5n1`.
//! - **Namespaces appear after `nvme connect` returns** (the scan is asynchronous): poll.
//! - **`nvme connect` twice with the same parameters** answers "already connected" (exit 1).
//! - **Disconnect before tearing the target down**: a host whose controller the target drops
//!   keeps reconnecting (every 10 s for `ctrl_loss_tmo`, 600 s) and holds the device meanwhile.
//! - **The target releases its queues after `nvme disconnect` returns** (work items), so
//!   anything counted on its side (here crc32c references) settles a moment later.
//! - **Host identity**: the tests pass `--hostnqn`/`--hostid` (`vfpoll_tests::HOST_NQN`);
//!   `/etc/nvme/hostnqn` comes from the host's `/` and may be missing.
//! - **Timing under TCG** (2 vCPUs; measured on a 2-core host): loading every module above
//!   ~0.7 s (once per boot), the target's configfs set-up 5 ms and teardown 20-40 ms, `nvme
//!   discover` and `nvme connect` ~0.1 s each (the namespace is there a few ms later), `nvme
//!   disconnect` ~0.15 s, the two dd writes with their three reads ~0.15 s, mkfs.ext4 on 32 MiB
//!   0.2 s, the fio verify run 1.5 s; the boot ~3.7 s and the whole binary ~10 s per mode. Each
//!   test appends its steps' times to `/out/nvmf-env-times.txt` (the run dir's `out/`).

use std::fs;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use vfpoll_tests::*;

/// The subsystem NQN the kernel target serves here.
const NQN: &str = "nqn.2014-08.org.vfpoll:nvmf-env";

/// Controller B's namespace 1: 64 MiB of 512-byte blocks (`nvme-b-ns1.img`).
const B_NS1_BYTES: u64 = 64 << 20;

/// The ext4 test's file system covers B's first 32 MiB; the dd tests write beyond it.
const FS_BYTES: u64 = 32 << 20;

/// How long the kernel may take to show a fabric namespace under TCG.
const NS_TIMEOUT: Duration = Duration::from_secs(30);

/// Step times of one test, appended to `/out/nvmf-env-times.txt`.
struct Times {
    test: &'static str,
    t: Instant,
    lines: Vec<String>,
}

impl Times {
    fn new(test: &'static str) -> Self {
        Times {
            test,
            t: Instant::now(),
            lines: Vec::new(),
        }
    }

    /// Records the time since the last step under `step`.
    fn step(&mut self, step: &str) {
        let now = Instant::now();
        self.lines.push(format!(
            "{} ({}): {step}: {:.3} s",
            self.test,
            mode_name(),
            (now - self.t).as_secs_f64()
        ));
        self.t = now;
    }
}

impl Drop for Times {
    fn drop(&mut self) {
        let path = out_dir().join("nvmf-env-times.txt");
        if let Ok(mut f) = fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = f.write_all((self.lines.join("\n") + "\n").as_bytes());
        }
    }
}

/// stdout and stderr of a command that must succeed (`-V` output goes to stderr).
fn output_text(cmd: &str, args: &[&str]) -> String {
    let out = run(cmd, args);
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

#[test]
#[ignore = "test bed"]
fn guest_tools_modules_and_loopback() {
    let mut t = Times::new("tools");
    for (cmd, args, expect) in [
        ("nvme", &["version"][..], "nvme version"),
        ("fio", &["--version"][..], "fio-"),
        ("mkfs.ext4", &["-V"][..], "mke2fs"),
        ("fsck.ext4", &["-V"][..], "e2fsck"),
    ] {
        let text = output_text(cmd, args);
        assert!(text.contains(expect), "{cmd} {args:?}: {text}");
    }
    t.step("nvme, fio, mkfs.ext4, fsck.ext4 run");

    load_modules(NVME_TCP_MODULES);
    load_modules(NVMET_TCP_MODULES);
    load_modules(EXT4_MODULES);
    t.step("modules loaded");
    for m in [
        "nvme_tcp",
        "nvme_fabrics",
        "nvme_core",
        "nvmet",
        "nvmet_tcp",
        "configfs",
        "ext4",
    ] {
        assert!(
            Path::new("/sys/module").join(m).join("initstate").exists(),
            "{m} is not a loaded module"
        );
    }
    // The crc32c the digests and ext4 will get is the generic one (nothing else provides it).
    let crypto = fs::read_to_string("/proc/crypto").expect("/proc/crypto");
    assert!(
        crypto
            .split("\n\n")
            .any(|alg| alg.contains("name         : crc32c\n")
                && alg.contains("driver       : crc32c-generic")),
        "no crc32c-generic in /proc/crypto:\n{crypto}"
    );

    mount_configfs();
    mount_configfs(); // idempotent
    assert!(
        Path::new(CONFIGFS).join("nvmet/subsystems").is_dir(),
        "no nvmet in {CONFIGFS}"
    );

    // TCP over loopback: a byte each way.
    loopback_up();
    loopback_up(); // idempotent
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
    let addr = listener.local_addr().unwrap();
    let mut client = std::net::TcpStream::connect(addr).expect("connect over lo");
    let (mut server, _) = listener.accept().expect("accept");
    client.write_all(b"q").unwrap();
    let mut b = [0u8; 1];
    std::io::Read::read_exact(&mut server, &mut b).unwrap();
    server.write_all(b"a").unwrap();
    std::io::Read::read_exact(&mut client, &mut b).unwrap();
    assert_eq!(&b, b"a");
    t.step("configfs, loopback TCP");
}

/// One I/O of a round trip: `len` bytes of pattern stream `stream` at byte `offset` of B's ns 1.
struct Io {
    offset: u64,
    len: usize,
    stream: u64,
}

/// The kernel target over loopback, start to teardown; `area` is where this run's writes go.
fn kernel_target_round_trip(name: &'static str, digests: bool, area: u64) {
    let mut t = Times::new(name);
    let backing = pci_nvme_namespace(NVME_B, 1);
    let namespaces = [(1, backing.as_path())];
    let target = KernelTarget::start(&KernelTargetConfig::loopback(NQN, &namespaces));
    t.step("kernel target up");

    let log = nvme_discover("127.0.0.1", NVMF_TCP_PORT);
    t.step("nvme discover");
    let rec = log
        .iter()
        .find(|r| r.get("subnqn") == Some(NQN))
        .unwrap_or_else(|| panic!("{NQN} is not in the discovery log: {log:#?}"));
    assert_eq!(rec.get("trtype"), Some("tcp"), "{rec:?}");
    assert_eq!(rec.get("adrfam"), Some("ipv4"), "{rec:?}");
    assert_eq!(rec.get("subtype"), Some("nvme subsystem"), "{rec:?}");
    assert_eq!(rec.get("traddr"), Some("127.0.0.1"), "{rec:?}");
    assert_eq!(rec.get("trsvcid"), Some("4420"), "{rec:?}");

    // Every crc32c transform holds a reference on crc32c_generic: queues with digests allocate
    // them on both sides, queues without do not. That shows the digests were really negotiated.
    load_modules(NVME_TCP_MODULES);
    let crc_before = module_refcnt("crc32c_generic");
    let ctrl = FabricController::connect(&NvmeConnect {
        nr_io_queues: Some(2),
        hdr_digest: digests,
        data_digest: digests,
        ..NvmeConnect::loopback(NQN)
    });
    t.step("nvme connect");
    assert_eq!(ctrl.attr("state"), "live");
    assert_eq!(ctrl.attr("queue_count"), "3", "the admin queue and 2 I/O queues");
    assert_eq!(ctrl.attr("hostnqn"), HOST_NQN);
    let address = ctrl.attr("address");
    assert!(
        address.contains("traddr=127.0.0.1") && address.contains("trsvcid=4420"),
        "{address}"
    );
    let dev = ctrl.wait_namespace(1, NS_TIMEOUT);
    t.step("fabric namespace up");
    let disk = dev.file_name().unwrap().to_string_lossy().into_owned();
    let sectors: u64 = fs::read_to_string(Path::new("/sys/block").join(&disk).join("size"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(
        sectors * 512,
        B_NS1_BYTES,
        "{} is not B's namespace",
        dev.display()
    );
    let crc_connected = module_refcnt("crc32c_generic");
    if digests {
        assert!(
            crc_connected > crc_before,
            "digests asked for, but no crc32c transform was allocated (crc32c_generic refcnt \
             {crc_before} -> {crc_connected})"
        );
    } else {
        assert_eq!(crc_connected, crc_before, "crc32c transforms without digests");
    }

    // A 4 KiB write (in-capsule data) and a 256 KiB one (beyond nvmet-tcp's 16 KiB in-capsule
    // size: R2T and H2CData), each read back through the fabric and through B itself.
    let mut offsets = Pattern::new(seed(), 100 + u64::from(digests));
    let ios = [
        Io {
            offset: area + (offsets.next_u64() % 256) * 4096,
            len: 4096,
            stream: 10 + u64::from(digests),
        },
        Io {
            offset: area + (1 << 20) + (offsets.next_u64() % 256) * 4096,
            len: 256 << 10,
            stream: 20 + u64::from(digests),
        },
    ];
    let mut manifest = Vec::new();
    for io in &ios {
        let data = Pattern::new(seed(), io.stream).bytes(io.len);
        dd_write_direct(&dev, io.offset, &data);
        let back = dd_read_direct(&dev, io.offset, io.len);
        assert!(
            back == data,
            "{} bytes at {} read back through {} differ",
            io.len,
            io.offset,
            dev.display()
        );
        let direct = dd_read_direct(&backing, io.offset, io.len);
        assert!(
            direct == data,
            "{} bytes at {} differ on {}",
            io.len,
            io.offset,
            backing.display()
        );
        manifest.push((
            "io".to_string(),
            format!("{},{},{}", io.offset, io.len, io.stream),
        ));
    }
    t.step("dd 4 KiB + 256 KiB write/read");

    if !digests {
        // fio's verify, as the later tests use it: two jobs (one per vCPU, so both I/O queues
        // carry I/O), each on its own MiB beyond the dd writes.
        let offset = format!("--offset={}", area + (4 << 20));
        let filename = format!("--filename={}", dev.display());
        run(
            "fio",
            &[
                "--name=nvmf-env",
                &filename,
                &offset,
                "--size=1M",
                "--offset_increment=1M",
                "--ioengine=io_uring",
                "--direct=1",
                "--rw=randwrite",
                "--bsrange=4k-64k",
                "--iodepth=8",
                "--numjobs=2",
                "--verify=crc32c",
                "--do_verify=1",
                "--verify_fatal=1",
                "--group_reporting",
            ],
        );
        t.step("fio randwrite + verify (1 MiB x 2 jobs)");
    }

    ctrl.disconnect();
    t.step("nvme disconnect");
    // The target frees its queues (and their transforms) in work items after the disconnect.
    let t0 = Instant::now();
    while module_refcnt("crc32c_generic") != crc_before {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "crc32c_generic refcnt {} 10 s after the disconnect, {crc_before} before the connect",
            module_refcnt("crc32c_generic")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    target.stop();
    t.step("kernel target down");
    let nvmet = Path::new(CONFIGFS).join("nvmet");
    assert!(!nvmet.join("ports/1").exists() && !nvmet.join("subsystems").join(NQN).exists());
    assert!(fs::read_dir(nvmet.join("subsystems")).unwrap().next().is_none());
    write_manifest(&format!("nvmf-env-{name}.txt"), &manifest);
}

#[test]
#[ignore = "test bed"]
fn guest_kernel_target_plain() {
    kernel_target_round_trip("plain", false, 40 << 20);
}

#[test]
#[ignore = "test bed"]
fn guest_kernel_target_with_digests() {
    kernel_target_round_trip("digests", true, 48 << 20);
}

#[test]
#[ignore = "test bed"]
fn guest_ext4_on_the_kernel_target() {
    let mut t = Times::new("ext4");
    load_modules(EXT4_MODULES);
    let backing = pci_nvme_namespace(NVME_B, 1);
    let namespaces = [(1, backing.as_path())];
    let target = KernelTarget::start(&KernelTargetConfig::loopback(NQN, &namespaces));
    let ctrl = FabricController::connect(&NvmeConnect {
        nr_io_queues: Some(2),
        ..NvmeConnect::loopback(NQN)
    });
    let dev = ctrl.wait_namespace(1, NS_TIMEOUT);
    let dev_s = dev.display().to_string();
    t.step("target up, connected");

    // The first 32 MiB only (the dd tests write beyond), no discard, inode tables and journal
    // written now rather than by ext4lazyinit after the mount.
    let size = format!("{}k", FS_BYTES >> 10);
    run(
        "mkfs.ext4",
        &[
            "-q",
            "-F",
            "-E",
            "nodiscard,lazy_itable_init=0,lazy_journal_init=0",
            &dev_s,
            &size,
        ],
    );
    t.step("mkfs.ext4 (32 MiB)");
    let mnt = Path::new("/run/vfpoll-nvmf-env-ext4");
    fs::create_dir_all(mnt).unwrap();
    let mnt_s = mnt.display().to_string();
    let files: Vec<(String, Vec<u8>)> = (0..4u64)
        .map(|i| {
            (
                format!("f{i}"),
                Pattern::new(seed(), 30 + i).bytes(1000 + (i as usize) * 300_000),
            )
        })
        .collect();
    run("busybox", &["mount", "-t", "ext4", &dev_s, &mnt_s]);
    for (name, data) in &files {
        let mut f = fs::File::create(mnt.join(name)).unwrap();
        f.write_all(data).unwrap();
        f.sync_all().unwrap();
    }
    run("busybox", &["umount", &mnt_s]);
    t.step("mount, write 4 files, sync, umount");
    let fsck = output_text("fsck.ext4", &["-n", "-f", &dev_s]);
    t.step("fsck.ext4 -n -f");
    run("busybox", &["mount", "-t", "ext4", "-o", "ro", &dev_s, &mnt_s]);
    for (name, data) in &files {
        assert!(
            &fs::read(mnt.join(name)).unwrap() == data,
            "{name} differs after remount"
        );
    }
    run("busybox", &["umount", &mnt_s]);
    t.step("remount, read back");
    // Exit status 0 (run() checks it): no errors; -f: every pass ran.
    assert!(fsck.contains("Pass 5"), "{fsck}");

    ctrl.disconnect();
    target.stop();
    t.step("disconnected, target down");
    write_manifest("nvmf-env-ext4.txt", &[("fs_bytes".into(), FS_BYTES.to_string())]);
}

/// The image under controller B's namespace 1.
fn b_image() -> std::path::PathBuf {
    run_dir().join("nvme-b-ns1.img")
}

#[test]
#[ignore = "host check"]
fn host_check_writes_through_the_kernel_target_are_in_the_image() {
    let seed = seed();
    for name in ["plain", "digests"] {
        let m = read_manifest(&format!("nvmf-env-{name}.txt"));
        let ios: Vec<&str> = m
            .iter()
            .filter(|(k, _)| k == "io")
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(ios.len(), 2, "{name}: {m:?}");
        for io in ios {
            let f: Vec<u64> = io.split(',').map(|x| x.parse().unwrap()).collect();
            let (offset, len, stream) = (f[0], f[1] as usize, f[2]);
            let want = Pattern::new(seed, stream).bytes(len);
            assert!(
                read_file_range(&b_image(), offset, len) == want,
                "{name}: {len} bytes at {offset} of nvme-b-ns1.img are not what the guest wrote"
            );
        }
    }
    // The ext4 superblock (at 1024): magic 0xef53 at 0x38, and a size of 32 MiB
    // (s_blocks_count_lo at 0x4, block size 1024 << s_log_block_size at 0x18).
    let m = read_manifest("nvmf-env-ext4.txt");
    let fs_bytes: u64 = manifest_get(&m, "fs_bytes").parse().unwrap();
    let sb = read_file_range(&b_image(), 1024, 1024);
    let le32 = |o: usize| u32::from_le_bytes(sb[o..o + 4].try_into().unwrap());
    assert_eq!(
        &sb[0x38..0x3a],
        &[0x53, 0xef],
        "no ext4 superblock in nvme-b-ns1.img"
    );
    assert_eq!(u64::from(le32(0x4)) * (1024u64 << le32(0x18)), fs_bytes);
}

#[test]
fn discovery_log_is_parsed_record_by_record() {
    let text = "\nDiscovery Log Number of Records 2, Generation counter 2\n\
                =====Discovery Log Entry 0======\n\
                trtype:  tcp\n\
                subtype: current discovery subsystem\n\
                treq:    not specified, sq flow control disable supported\n\
                trsvcid: 4420\n\
                subnqn:  nqn.2014-08.org.nvmexpress.discovery\n\
                =====Discovery Log Entry 1======\n\
                trtype:  tcp\n\
                subtype: nvme subsystem\n\
                subnqn:  nqn.2014-08.org.vfpoll:nvmf-env\n\
                traddr:  127.0.0.1\n";
    let log = parse_discovery_log(text);
    assert_eq!(log.len(), 2);
    assert_eq!(log[0].get("subtype"), Some("current discovery subsystem"));
    assert_eq!(
        log[0].get("treq"),
        Some("not specified, sq flow control disable supported")
    );
    assert_eq!(log[0].get("traddr"), None);
    // An NQN's own colon stays in the value.
    assert_eq!(log[1].get("subnqn"), Some("nqn.2014-08.org.vfpoll:nvmf-env"));
    assert_eq!(log[1].get("traddr"), Some("127.0.0.1"));
    assert!(parse_discovery_log("Failed to connect\n").is_empty());
}

#[test]
fn nvme_disk_names_map_to_the_device_to_open() {
    assert_eq!(nvme_disk_head("nvme1n1").as_deref(), Some("nvme1n1"));
    assert_eq!(nvme_disk_head("nvme5c5n1").as_deref(), Some("nvme5n1"));
    assert_eq!(nvme_disk_head("nvme12c3n10").as_deref(), Some("nvme12n10"));
    for other in [
        "ng1n1",
        "nvme1",
        "hwmon0",
        "nvme1n1p1",
        "nvme",
        "nvmec1n1",
        "nvme1cn1",
        "nvme1n",
    ] {
        assert_eq!(nvme_disk_head(other), None, "{other}");
    }
    let c = NvmeConnect {
        nr_io_queues: Some(2),
        hdr_digest: true,
        data_digest: true,
        ..NvmeConnect::loopback("nqn.x")
    };
    let args = c.args().join(" ");
    assert_eq!(
        args,
        format!(
            "connect -t tcp -a 127.0.0.1 -s 4420 -n nqn.x --hostnqn {HOST_NQN} --hostid {HOST_ID} \
             --nr-io-queues 2 --hdr-digest --data-digest"
        )
    );
}
