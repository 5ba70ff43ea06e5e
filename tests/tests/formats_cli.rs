//! The command-line tools on every namespace format of the test bed's controller F (issue 10):
//! `vfpoll hello` and `vfpoll perf --verify` (4 KiB I/Os, and 1 MiB ones split into parts of
//! whole blocks) on extended-LBA, separate-metadata and PI namespaces and the zoned one, and the
//! refusal of the 64-bit guard namespace. In a boot of its own: these tools write the images
//! that tests/formats.rs checks byte for byte on the host.

use vfpoll_tests::*;

/// NVMe controller F: the namespace formats (see tests/formats.rs).
const NVME_F: &str = "0000:00:0b.0";

#[test]
#[ignore = "test bed"]
fn guest_hello_and_perf_verify_on_every_format() {
    bind_all(&[NVME_F]);
    reserve_hugepages(64);
    let noiommu: &[&str] = if mode_name() == "noiommu" {
        &["--noiommu"]
    } else {
        &[]
    };
    for ns in ["1", "2", "3", "4", "6"] {
        let mut args = vec!["hello", "--device", NVME_F, "--nsid", ns];
        args.extend(noiommu);
        let text = String::from_utf8(run("vfpoll", &args).stdout).unwrap();
        assert!(text.contains("data matches"), "namespace {ns}: {text}");
    }
    // 4 KiB I/Os at QD 16 and 1 MiB ones (split into parts of whole blocks, metadata cut for
    // QEMU's quirk), written with the LBA-tagged pattern and read back into poisoned buffers.
    for ns in ["1", "2", "3", "4"] {
        for (io, size) in [("4k", "2m"), ("1m", "8m")] {
            let mut args = vec![
                "perf",
                "--device",
                NVME_F,
                "--nsid",
                ns,
                "--workload",
                "randwrite",
                "--verify",
                "--io-size",
                io,
                "--queue-depth",
                "16",
                "--size",
                size,
            ];
            args.extend(noiommu);
            let text = String::from_utf8(run("vfpoll", &args).stdout).unwrap();
            assert!(text.contains("verify: OK"), "namespace {ns}, {io} I/Os: {text}");
        }
    }
    // The refused 64-bit guard namespace: a clear error, no I/O.
    let mut args = vec!["perf", "--device", NVME_F, "--nsid", "5", "--time", "1"];
    args.extend(noiommu);
    let out = std::process::Command::new("vfpoll").args(&args).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("64-bit guard is not supported"), "{err}");
}
