"""Fixtures: a fresh store on a file in pytest's tmp_path (the io_uring backend, O_DIRECT where
the file system allows it), and helpers to hash arrays."""

import hashlib
import os

import numpy as np
import pytest

import vfpoll

#: Size of the test stores' file.
STORE_SIZE = os.environ.get("VFPOLL_TEST_STORE_SIZE", "256M")


def digest(*arrays) -> str:
    """sha256 over the bytes, dtypes and shapes of arrays (or bytes)."""
    h = hashlib.sha256()
    for a in arrays:
        if isinstance(a, (bytes, bytearray)):
            h.update(bytes(a))
            continue
        a = np.ascontiguousarray(a)
        h.update(a.dtype.str.encode())
        h.update(repr(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()


@pytest.fixture
def store_spec(tmp_path):
    """A spec for a new store file of STORE_SIZE in tmp_path."""
    return f"file:{tmp_path / 'store.img'}?size={STORE_SIZE}"


@pytest.fixture
def store(store_spec):
    """A freshly formatted store, closed after the test."""
    s = vfpoll.Store.format(store_spec)
    yield s
    s.close()


def random_arrays(seed: int = 1):
    """A mix of dtypes, shapes and sizes, including empty and odd-sized arrays."""
    rng = np.random.default_rng(seed)
    return {
        "f32": rng.standard_normal((257, 33)).astype(np.float32),
        "f16": rng.standard_normal(5000).astype(np.float16),
        "i64": rng.integers(-(2**62), 2**62, size=(3, 4, 5), dtype=np.int64),
        "u8_odd": rng.integers(0, 256, size=4097, dtype=np.uint8),
        "bool": rng.integers(0, 2, size=(17,), dtype=np.uint8).astype(bool),
        "c64": (rng.standard_normal(100) + 1j * rng.standard_normal(100)).astype(np.complex64),
        "scalar": np.array(3.5, dtype=np.float64),
        "empty": np.zeros((0, 7), dtype=np.float32),
        "big": rng.integers(0, 2**31, size=3 << 20, dtype=np.uint32),  # 12 MiB: several chunks
        "fortran": np.asfortranarray(rng.standard_normal((64, 48))),
    }
