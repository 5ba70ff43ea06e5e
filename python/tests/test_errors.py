"""Bad input gets a clear error of the vfpoll.StoreError hierarchy (or a standard TypeError /
ValueError / BufferError for a bad argument) and loses no data."""

import os
import subprocess
import sys

import numpy as np
import pytest

import vfpoll


def test_exception_hierarchy():
    for cls in (
        vfpoll.SpecError,
        vfpoll.NotFoundError,
        vfpoll.CorruptError,
        vfpoll.StoreFullError,
        vfpoll.InUseError,
        vfpoll.ClosedError,
        vfpoll.DeviceError,
    ):
        assert issubclass(cls, vfpoll.StoreError)
    assert issubclass(vfpoll.StoreError, Exception)


@pytest.mark.parametrize("spec", ["nonsense", "file:", "vfio:0000:00:03.0", "model:12Q", "blk:dev/sda"])
def test_bad_spec(spec):
    with pytest.raises(vfpoll.SpecError) as e:
        vfpoll.Store.format(spec)
    assert str(e.value)  # the store's own text


def test_open_without_store(tmp_path):
    p = tmp_path / "empty.img"
    p.write_bytes(b"\0" * (4 << 20))
    with pytest.raises(vfpoll.StoreError) as e:
        vfpoll.Store.open(f"file:{p}")
    assert "holds no vfpoll store" in str(e.value)


def test_open_missing_file(tmp_path):
    with pytest.raises(vfpoll.StoreError) as e:
        vfpoll.Store.open(f"file:{tmp_path / 'nope.img'}")
    assert "nope.img" in str(e.value)


def test_missing_names(store):
    store.save("x", {"a": np.arange(3)})
    with pytest.raises(vfpoll.NotFoundError):
        store.load("y")
    with pytest.raises(vfpoll.NotFoundError):
        store.load("x", version=999_999)
    with pytest.raises(vfpoll.NotFoundError):
        store.load("x", keys=["b"])
    with pytest.raises(vfpoll.NotFoundError):
        store.delete("y")
    with pytest.raises(vfpoll.NotFoundError):
        store.read("x", "b", bytearray(8))
    with pytest.raises(vfpoll.NotFoundError):
        store.kv_pool("no-such-pool")


def test_wrong_buffers(store):
    store.save("x", {"a": np.arange(100, dtype=np.int64)})
    with pytest.raises(ValueError, match="800"):  # wrong size: says what it needs
        store.read("x", "a", np.empty(99, dtype=np.int64))
    with pytest.raises(ValueError):  # past the end
        store.read("x", "a", np.empty(10, dtype=np.int64), offset=790)
    ro = np.empty(100, dtype=np.int64)
    ro.flags.writeable = False
    with pytest.raises(BufferError):
        store.read("x", "a", ro)
    with pytest.raises((BufferError, TypeError)):
        store.read("x", "a", b"\0" * 800)  # bytes are read-only
    strided = np.empty(200, dtype=np.int64)[::2]
    with pytest.raises(BufferError, match="contiguous"):
        store.read("x", "a", strided)
    with pytest.raises(TypeError):
        store.read("x", "a", 12345)
    with pytest.raises(TypeError):
        store.save("y", {"o": np.array([object()])})
    w = store.begin("z")
    with pytest.raises(BufferError, match="contiguous"):
        w.put("s", strided)
    with pytest.raises(TypeError):
        w.put("n", None)
    w.abort()
    # Nothing of the failed calls reached the store.
    assert store.checkpoints() == ["x"]
    assert (store.load("x")["a"] == np.arange(100)).all()


def test_kv_wrong_sizes(store):
    pool = store.kv_pool("kv", block_size=4096, slots=8)
    with pytest.raises(ValueError):
        pool.put_many([1], [bytes(4097)])  # larger than a block
    with pytest.raises(ValueError):
        pool.put_many([1, 2], [bytes(10)])  # keys and buffers differ in number
    with pytest.raises((ValueError, OverflowError)):
        pool.put_many([1 << 128], [bytes(10)])  # keys are 128-bit


def test_closed_store(store_spec):
    s = vfpoll.Store.format(store_spec)
    s.save("x", {"a": np.arange(3)})
    pool = s.kv_pool("kv", block_size=4096, slots=4)
    s.close()
    s.close()  # idempotent
    assert s.closed
    with pytest.raises(vfpoll.ClosedError):
        s.load("x")
    with pytest.raises(vfpoll.ClosedError):
        s.save("x", {"a": np.arange(3)})
    with pytest.raises(vfpoll.ClosedError):
        s.checkpoints()
    with pytest.raises(vfpoll.ClosedError):
        pool.get_many([1], [bytearray(4096)])


def test_second_process_gets_in_use(store_spec, store):
    code = (
        "import sys, vfpoll\n"
        "try:\n"
        f"    vfpoll.Store.open({store_spec!r})\n"
        "except vfpoll.InUseError as e:\n"
        "    print(e); sys.exit(3)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 3, r.stdout + r.stderr
    assert str(os.getpid()) in r.stdout


def test_corruption_is_detected(store_spec):
    a = np.arange(1 << 20, dtype=np.uint8)
    with vfpoll.Store.format(store_spec) as s:
        s.save("x", {"a": a})
    path = store_spec[len("file:"):].split("?")[0]
    data = bytearray(open(path, "rb").read())
    pattern = bytes(range(256)) * 16
    at = data.find(pattern, 1 << 20)  # the entry's bytes, past the metadata area
    assert at > 0
    data[at + 100] ^= 0xFF
    open(path, "wb").write(data)
    with vfpoll.Store.open(store_spec) as s:
        with pytest.raises(vfpoll.CorruptError) as e:
            s.load("x")
        assert "'a'" in str(e.value) or "a" in str(e.value)
        out = s.load("x", verify=False)["a"]  # the damage, read on purpose
        assert (out != a).sum() == 1
