//! The appliance example, docs/target-example.toml, served by `vfpoll target --config` to the
//! guest kernel's initiator (issue 25): the file loads as written (controller B's namespace 1,
//! a RAM namespace, two listeners, an allow list naming the test host, limits, metrics); I/O
//! through both namespaces reads back; the metrics endpoint counts the test host's I/O and
//! connections and a refused Connect; a reload that limits the test host's IOPS makes its
//! commands wait for credit (counted), and every read still completes.
//!
//! Run: `cargo xtask test --filter nvmf_appliance` (both IOMMU modes).

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use vfpoll_tests::*;

const EXAMPLE: &str = include_str!("../../docs/target-example.toml");
/// The example's subsystem.
const NQN: &str = "nqn.2024-01.io.vfpoll:appliance";
/// Where the example serves metrics.
const METRICS: &str = "127.0.0.1:9464";
const NS_TIMEOUT: Duration = Duration::from_secs(30);

/// The metrics page.
fn scrape() -> String {
    let mut s = std::net::TcpStream::connect(METRICS).expect("the metrics endpoint");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    out
}

/// The value of the sample `name{labels}` in `page` (0 when absent).
fn sample(page: &str, name: &str, labels: &str) -> f64 {
    let key = format!("{name}{{{labels}}} ");
    page.lines()
        .find_map(|l| l.strip_prefix(&key))
        .map_or(0.0, |v| v.trim().parse().expect("a number"))
}

#[test]
#[ignore = "test bed"]
fn guest_appliance_example_serves_counts_and_limits() {
    // The example names controller B and the test host: it runs here as written.
    assert!(
        EXAMPLE.contains(&format!("nvme = \"{NVME_B}/1\"")),
        "the example's BDF"
    );
    assert!(EXAMPLE.contains(HOST_NQN), "the example's allow list");
    load_modules(NVME_TCP_MODULES);
    loopback_up();
    reserve_hugepages(40);
    bind_all(&[NVME_B]);
    let dir = std::env::temp_dir().join("vfpoll-appliance");
    std::fs::create_dir_all(&dir).unwrap();
    let config: PathBuf = dir.join("target.toml");
    std::fs::write(&config, EXAMPLE).unwrap();
    // The example holds DH-HMAC-CHAP secrets: the target reads it only if no one else can.
    let private = <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o600);
    std::fs::set_permissions(&config, private).unwrap();
    let mut args = Vec::new();
    if mode() == vfpoll_pci::vfio::IommuMode::NoIommu {
        args.push("--noiommu");
    }
    let mut target = VfpollTarget::with_config(&config, NQN, &args);
    let line = target.next_line();
    assert!(
        line.contains(&format!("metrics at http://{METRICS}/metrics")),
        "{line}"
    );

    let ctrl = FabricController::connect(&NvmeConnect {
        nr_io_queues: Some(1),
        ..NvmeConnect::loopback(NQN)
    });
    let nvme = ctrl.wait_namespace(1, NS_TIMEOUT);
    let ram = ctrl.wait_namespace(2, NS_TIMEOUT);
    for (dev, stream) in [(&nvme, 1u64), (&ram, 2)] {
        let data = Pattern::new(seed(), 2500 + stream).bytes(64 << 10);
        dd_write_direct(dev, 1 << 20, &data);
        assert!(
            dd_read_direct(dev, 1 << 20, data.len()) == data,
            "{} read back differs",
            dev.display()
        );
    }
    // A host the allow list does not name is refused by the target and counted
    // (through /dev/nvme-fabrics: nvme-cli itself stops at "already connected", since a
    // controller to this address and subsystem exists, and the target never sees it).
    let refused_text = fabrics_connect_refused(&NvmeConnect {
        host_nqn: "nqn.2014-08.org.nvmexpress:uuid:0b1d7c9e-2f4a-4e55-8a3b-6f7468657268",
        host_id: "0b1d7c9e-2f4a-4e55-8a3b-6f7468657268",
        ..NvmeConnect::loopback(NQN)
    });
    assert!(
        refused_text.1.contains("not allowed"),
        "the kernel says why: {refused_text:?}"
    );

    let page = scrape();
    let l = |nsid: u32| format!("subsystem=\"{NQN}\",nsid=\"{nsid}\",host=\"{HOST_NQN}\"");
    for nsid in [1, 2] {
        let w = sample(
            &page,
            "vfpoll_nvmf_io_commands_total",
            &format!("{},op=\"write\"", l(nsid)),
        );
        let r = sample(
            &page,
            "vfpoll_nvmf_io_commands_total",
            &format!("{},op=\"read\"", l(nsid)),
        );
        assert!(
            w >= 1.0 && r >= 1.0,
            "namespace {nsid}: {w} writes, {r} reads\n{page}"
        );
        let bytes = sample(
            &page,
            "vfpoll_nvmf_io_bytes_total",
            &format!("{},direction=\"write\"", l(nsid)),
        );
        assert!(
            bytes >= (64 << 10) as f64,
            "namespace {nsid}: {bytes} bytes written"
        );
        assert!(sample(&page, "vfpoll_nvmf_io_latency_seconds_count", &l(nsid)) >= 2.0);
    }
    let conns = sample(
        &page,
        "vfpoll_nvmf_connections",
        &format!("subsystem=\"{NQN}\",host=\"{HOST_NQN}\""),
    );
    assert_eq!(conns, 2.0, "the admin queue and one I/O queue\n{page}");
    let refused = sample(
        &page,
        "vfpoll_nvmf_connect_refusals_total",
        &format!("subsystem=\"{NQN}\""),
    );
    assert!(
        refused >= 1.0,
        "the refused host is not counted; nvme-cli said {refused_text:?}\n{}",
        kernel_log_tail(10)
    );
    assert_eq!(
        sample(&page, "vfpoll_nvmf_io_throttled_total", &l(2)),
        0.0,
        "no limit on the test host yet"
    );

    // A reload limits the test host to 20 IOPS (a burst of one command): 16 reads of 4 KiB,
    // one request each, mostly wait for credit, and all complete.
    let limited = format!("{EXAMPLE}\n[[subsystem.host]]\nnqn = \"{HOST_NQN}\"\nmax_iops = 20\n");
    std::fs::write(&config, limited).unwrap();
    let said = target.reload(1);
    assert!(said[0].contains("rate limits for 2 host(s)"), "{said:?}");
    let out = run(
        "dd",
        &[
            &format!("if={}", ram.display()),
            "of=/dev/null",
            "bs=4096",
            "count=16",
            "iflag=direct",
            "status=none",
        ],
    );
    assert!(out.status.success());
    let page = scrape();
    let held = sample(&page, "vfpoll_nvmf_io_throttled_total", &l(2));
    assert!(held >= 10.0, "{held} of 16 reads waited\n{page}");
    ctrl.disconnect();
    drop(target);
}
