//! The Python package (issue 24) in the test bed: `python/tests/test_vfio.py` runs in the guest
//! with pytest, on NVMe controllers A and B bound to vfio-pci, through the wheel that `cargo
//! xtask test`'s step `python` installed into `target/python/venv` (the guest's `/` is the
//! host's): numpy and safetensors round trips checked by sha256 over a store striped on both
//! controllers, a KV pool, reopen and fsck. In the no-IOMMU boot the same round trips run with
//! `iommu="noiommu"`, and a store opened without asking for it gets a clear error (the store
//! never falls back to no-IOMMU mode by itself).

use std::path::Path;
use std::process::Command;

use vfpoll_tests::*;

#[test]
#[ignore = "test bed"]
fn guest_python_vfio_round_trips() {
    bind_all(&[NVME_A, NVME_B]);
    reserve_hugepages(64);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace");
    let py = root.join("target/python/venv/bin/python");
    assert!(
        py.exists(),
        "{} is missing: `cargo xtask test` makes it in its step `python` (alone: cargo test -p xtask -- --ignored python_step)",
        py.display()
    );
    let out = Command::new(&py)
        .args([
            "-m",
            "pytest",
            "-q",
            "-rA",
            "-p",
            "no:cacheprovider",
            "python/tests/test_vfio.py",
        ])
        .current_dir(root)
        .env("VFPOLL_TEST_SPECS", format!("vfio:{NVME_A}/1,vfio:{NVME_B}/1"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("TMPDIR", "/tmp")
        .output()
        .expect("run pytest");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "pytest failed:\n{stdout}\n{stderr}");
    // The mode's tests ran (a run that skips everything fails).
    let mut want =
        vec!["PASSED python/tests/test_vfio.py::test_numpy_and_safetensors_round_trips_over_two_controllers"];
    if mode_name() == "noiommu" {
        want.push("PASSED python/tests/test_vfio.py::test_no_iommu_boot_without_asking_gets_a_clear_error");
    }
    for w in want {
        assert!(
            stdout.contains(w),
            "pytest did not run {w:?} in the {} boot:\n{stdout}",
            mode_name()
        );
    }
}
