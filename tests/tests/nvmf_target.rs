//! `vfpoll target` against the Linux kernel's NVMe/TCP initiator over loopback (issue 11):
//! `vfpoll target --malloc 64M` serves a RAM namespace; `nvme discover` finds it, `nvme
//! connect -t tcp` (plain, then with header and data digests) brings up a controller with two
//! I/O queues, O_DIRECT writes are read back through the fabric namespace, `nvme disconnect`;
//! then the same with digests over controller B's namespace through vfpoll's NVMe driver (`--ns`),
//! and once more on 4 KiB pages (128 KiB buffers spanning pages behind the IOMMU; refused
//! without one).
//!
//! Run: `cargo xtask test --filter nvmf_target` (both IOMMU modes: the RAM namespace needs no
//! device, the `--ns` test opens B in the mode of the run).

use std::fs;
use std::path::Path;
use std::time::Duration;

use vfpoll_tests::*;

/// The subsystem NQN `vfpoll target` serves here.
const NQN: &str = "nqn.2024-01.io.vfpoll:nvmf-target-test";
/// The RAM namespace's size.
const NS_BYTES: u64 = 64 << 20;
/// How long the kernel may take to show a fabric namespace under TCG.
const NS_TIMEOUT: Duration = Duration::from_secs(30);

fn round_trip(what: &[&str], digests: bool) {
    load_modules(NVME_TCP_MODULES);
    loopback_up();
    // The target's data buffers: 256 of 128 KiB in 2 MiB pages (and the NVMe queues).
    reserve_hugepages(40);
    let target = VfpollTarget::start(NQN, what);

    let log = nvme_discover("127.0.0.1", NVMF_TCP_PORT);
    let rec = log
        .iter()
        .find(|r| r.get("subnqn") == Some(NQN))
        .unwrap_or_else(|| panic!("{NQN} is not in the discovery log: {log:#?}"));
    assert_eq!(rec.get("trtype"), Some("tcp"), "{rec:?}");
    assert_eq!(rec.get("traddr"), Some("127.0.0.1"), "{rec:?}");
    assert_eq!(rec.get("trsvcid"), Some("4420"), "{rec:?}");

    let ctrl = FabricController::connect(&NvmeConnect {
        nr_io_queues: Some(2),
        hdr_digest: digests,
        data_digest: digests,
        ..NvmeConnect::loopback(NQN)
    });
    assert_eq!(ctrl.attr("state"), "live");
    assert_eq!(ctrl.attr("queue_count"), "3", "the admin queue and 2 I/O queues");
    let dev = ctrl.wait_namespace(1, NS_TIMEOUT);
    let disk = dev.file_name().unwrap().to_string_lossy().into_owned();
    let sectors: u64 = fs::read_to_string(Path::new("/sys/block").join(&disk).join("size"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(
        sectors * 512,
        NS_BYTES,
        "{} is not the RAM namespace",
        dev.display()
    );

    let mut offsets = Pattern::new(seed(), 300 + u64::from(digests));
    // 4 KiB (in-capsule data), 64 KiB and 128 KiB (R2T and H2CData).
    for (len, stream) in [(4096usize, 1u64), (64 << 10, 2), (128 << 10, 3)] {
        let offset = (offsets.next_u64() % 1024) * 4096 + (8 << 20);
        let data = Pattern::new(seed(), stream * 10 + u64::from(digests)).bytes(len);
        dd_write_direct(&dev, offset, &data);
        let back = dd_read_direct(&dev, offset, len);
        assert!(
            back == data,
            "{len} bytes at {offset} read back through {} differ",
            dev.display()
        );
    }
    ctrl.disconnect();
    drop(target);
}

#[test]
#[ignore = "test bed"]
fn guest_kernel_initiator_reads_back_through_vfpoll_target() {
    round_trip(&["--malloc", "64M"], false);
}

#[test]
#[ignore = "test bed"]
fn guest_kernel_initiator_with_digests_through_vfpoll_target() {
    round_trip(&["--malloc", "64M"], true);
}

/// Controller B's namespace 1 (64 MiB of 512-byte blocks) through vfpoll's NVMe driver.
#[test]
#[ignore = "test bed"]
fn guest_kernel_initiator_through_vfpoll_target_on_nvme() {
    bind_all(&[NVME_B]);
    let ns = format!("{NVME_B}/1");
    let mut what = vec!["--ns", ns.as_str()];
    if mode() == vfpoll_pci::vfio::IommuMode::NoIommu {
        what.push("--noiommu");
    }
    round_trip(&what, true);
}

/// 4 KiB pages: behind the IOMMU a 128 KiB data buffer spans 32 pages at one IOVA range and the
/// R2T and C2H paths move it whole; without an IOMMU the target refuses to start and says why.
#[test]
#[ignore = "test bed"]
fn guest_kernel_initiator_through_vfpoll_target_on_4k_pages() {
    bind_all(&[NVME_B]);
    let ns = format!("{NVME_B}/1");
    if mode() == vfpoll_pci::vfio::IommuMode::NoIommu {
        let out = std::process::Command::new("vfpoll")
            .args([
                "target",
                "--ns",
                &ns,
                "--noiommu",
                "--page-size",
                "4k",
                "--nqn",
                NQN,
            ])
            .output()
            .expect("running vfpoll");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "4 KiB pages without an IOMMU were accepted: {err}"
        );
        assert!(
            err.contains("without an IOMMU") && err.contains("use 2M"),
            "{err}"
        );
        return;
    }
    round_trip(&["--ns", &ns, "--page-size", "4k"], false);
}
