"""The package on VFIO NVMe namespaces, in the test bed: tests/tests/python.rs runs this file in
the guest with VFPOLL_TEST_SPECS naming two controllers' namespaces bound to vfio-pci (and
VFPOLL_TESTBED the boot's IOMMU mode). Skipped elsewhere."""

import hashlib
import os

import numpy as np
import pytest

import vfpoll
from conftest import digest, random_arrays

SPECS = [s for s in os.environ.get("VFPOLL_TEST_SPECS", "").split(",") if s]
MODE = os.environ.get("VFPOLL_TESTBED", "")

pytestmark = pytest.mark.skipif(not SPECS, reason="needs VFPOLL_TEST_SPECS: VFIO namespaces (the test bed sets it)")
# The boot's IOMMU backend: VFIO's no-IOMMU mode only when asked for.
IOMMU = "noiommu" if MODE == "noiommu" else "auto"


def test_numpy_and_safetensors_round_trips_over_two_controllers():
    arrays = {k: v for k, v in random_arrays(11).items() if k != "big"}
    arrays["big"] = np.arange(6 << 20, dtype=np.uint8)  # 6 MiB: chunks on both controllers
    with vfpoll.Store.format(SPECS, force=True, iommu=IOMMU) as s:
        info = s.info()
        assert info["members"] == 2 and all("vfio" in m["device"] or ":" in m["device"] for m in info["namespaces"])
        v1 = s.save("np", arrays)
        st = pytest.importorskip("safetensors.numpy")
        blob = st.save({k: v for k, v in arrays.items() if k not in ("fortran", "c64")})
        v2 = s.save("st", {"file": blob})
        pool = s.kv_pool("kv", block_size=64 << 10, slots=32)
        pool.put_many(range(1, 9), [np.full(64 << 10, i, dtype=np.uint8) for i in range(1, 9)])
        pool.sync()
    with vfpoll.Store.open(SPECS, iommu=IOMMU) as s:
        back = s.load("np", version=v1)
        assert {k: digest(v) for k, v in back.items()} == {k: digest(v) for k, v in arrays.items()}
        got = s.load("st", version=v2)["file"]
        assert hashlib.sha256(got).hexdigest() == hashlib.sha256(blob).hexdigest()
        outs = [np.empty(64 << 10, dtype=np.uint8) for _ in range(8)]
        assert s.kv_pool("kv").get_many(range(1, 9), outs) == [64 << 10] * 8
        assert all((o == i + 1).all() for i, o in enumerate(outs))
        assert s.fsck()["clean"]


@pytest.mark.skipif(MODE != "noiommu", reason="the no-IOMMU boot's check")
def test_no_iommu_boot_without_asking_gets_a_clear_error():
    # The default backend never falls back to no-IOMMU mode by itself.
    with pytest.raises(vfpoll.StoreError) as e:
        vfpoll.Store.format(SPECS, force=True)
    assert "vfio:" in str(e.value)


def test_unknown_iommu_backend_is_a_spec_error():
    with pytest.raises(vfpoll.SpecError, match="iommu=.*use one of auto, iommufd, type1, noiommu"):
        vfpoll.Store.open(SPECS, iommu="vt-d")
