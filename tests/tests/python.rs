//! The Python package (issue 24) in the test bed: `python/tests/test_vfio.py` runs in the guest
//! with pytest, on NVMe controllers A and B bound to vfio-pci, through the wheel that `cargo
//! xtask test`'s step `python` installed into `target/python/venv` (the guest's `/` is the
//! host's): numpy and safetensors round trips checked by sha256 over a store striped on both
//! controllers, a KV pool, reopen and fsck. In the no-IOMMU boot it checks the clear error that
//! `vfio:` specs give there (the store opens them with type1 or iommufd containers only).

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
    // Exactly the mode's test ran (the other is skipped): a run that skips everything fails.
    let want = if mode_name() == "noiommu" {
        "PASSED python/tests/test_vfio.py::test_no_iommu_boot_gets_a_clear_error"
    } else {
        "PASSED python/tests/test_vfio.py::test_numpy_and_safetensors_round_trips_over_two_controllers"
    };
    assert!(
        stdout.contains(want),
        "pytest did not run its {} test:\n{stdout}",
        mode_name()
    );
}
