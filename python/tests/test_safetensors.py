"""safetensors files through the store: the tensors of a safetensors file saved and loaded
bit-exact, and the file's own bytes kept as one entry."""

import hashlib

import numpy as np
import pytest

safetensors_numpy = pytest.importorskip("safetensors.numpy", reason="safetensors is not installed")

from conftest import digest, random_arrays  # noqa: E402


def test_safetensors_round_trip(store, tmp_path):
    arrays = {k: v for k, v in random_arrays(5).items() if k not in ("fortran", "c64")}
    path = tmp_path / "model.safetensors"
    safetensors_numpy.save_file(arrays, str(path))
    file_bytes = path.read_bytes()
    tensors = safetensors_numpy.load_file(str(path))
    store.save("st", dict(tensors, __file__=file_bytes))
    back = store.load("st")
    assert hashlib.sha256(back.pop("__file__")).hexdigest() == hashlib.sha256(file_bytes).hexdigest()
    assert {k: digest(v) for k, v in back.items()} == {k: digest(v) for k, v in tensors.items()}
    # And back into a safetensors file with the same tensors.
    out = tmp_path / "again.safetensors"
    safetensors_numpy.save_file(back, str(out))
    again = safetensors_numpy.load_file(str(out))
    assert {k: digest(v) for k, v in again.items()} == {k: digest(v) for k, v in tensors.items()}
    assert all(isinstance(v, np.ndarray) for v in again.values())
