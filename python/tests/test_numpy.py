"""numpy arrays and buffers through the store on the file backend: bit-exact round trips
(checked by sha256), versions, deletion, partial reads, async saves, reopening."""

import numpy as np
import pytest

import vfpoll
from conftest import digest, random_arrays


def test_round_trip_is_bit_exact(store):
    arrays = random_arrays()
    before = {k: digest(v) for k, v in arrays.items()}
    version = store.save("run", arrays)
    assert isinstance(version, int)
    loaded = store.load("run")
    assert set(loaded) == set(arrays)
    for k, v in loaded.items():
        assert v.dtype == arrays[k].dtype and v.shape == arrays[k].shape, k
        assert digest(v) == before[k], k


def test_reopen_keeps_committed_versions(store_spec):
    arrays = random_arrays(2)
    with vfpoll.Store.format(store_spec) as s:
        v1 = s.save("a", arrays)
        v2 = s.save("a", {"x": np.arange(10)})
        s.save("b", {"y": b"hello"})
    with vfpoll.Store.open(store_spec) as s:
        assert s.checkpoints() == ["a", "b"]
        assert [v.id for v in s.versions("a")] == [v1, v2]
        old = s.load("a", version=v1)
        assert {k: digest(v) for k, v in old.items()} == {k: digest(v) for k, v in arrays.items()}
        assert list(s.load("a")["x"]) == list(range(10))
        assert s.load("b")["y"] == b"hello"


def test_buffers_of_every_kind(store):
    ba = bytearray(b"\x01\x02" * 3000)
    mv = memoryview(np.arange(1000, dtype=np.int16))
    store.save("b", {"bytes": b"abc" * 1000, "bytearray": ba, "memoryview": mv})
    out = store.load("b")
    assert out["bytes"] == b"abc" * 1000
    assert out["bytearray"] == bytes(ba)
    assert out["memoryview"] == mv.tobytes()


def test_versions_delete_keep_last(store):
    ids = [store.save("c", {"v": np.full(1000, i, dtype=np.int32)}) for i in range(5)]
    assert ids == sorted(ids) and len(set(ids)) == 5
    info = store.versions("c")
    assert [v.id for v in info] == ids
    assert all(v.bytes == 4000 and v.entries == 1 for v in info)
    store.delete("c", ids[1])
    assert [v.id for v in store.versions("c")] == [ids[0], ids[2], ids[3], ids[4]]
    deleted = store.keep_last("c", 2)
    assert sorted(deleted) == [ids[0], ids[2]]
    assert [v.id for v in store.versions("c")] == ids[3:]
    assert int(store.load("c")["v"][0]) == 4
    assert int(store.load("c", version=ids[3])["v"][0]) == 3
    store.delete("c")
    assert "c" not in store.checkpoints()


def test_space_is_reused_after_delete(store):
    info = store.info()
    big = np.ones(info["capacity"] // 3, dtype=np.uint8)
    for _ in range(6):  # 2 versions kept at a time: would not fit without reuse
        store.save("d", {"x": big})
        store.keep_last("d", 1)
    assert len(store.versions("d")) == 1


def test_read_into_and_offsets(store):
    a = np.arange(100_000, dtype=np.uint32)
    store.save("r", {"a": a})
    out = np.empty(1000, dtype=np.uint32)
    store.read("r", "a", out, offset=4 * 5000)
    assert (out == a[5000:6000]).all()
    whole = np.empty_like(a)
    store.read("r", "a", whole, verify=False)
    assert digest(whole) == digest(a)


def test_writer_commits_or_aborts(store):
    with store.begin("w") as w:
        w.put("one", np.arange(10, dtype=np.int8), b"meta-1")
        w.put("two", b"xyz")
    (e1, e2) = sorted(store.entries("w"), key=lambda e: e.name)
    assert (e1.name, e1.size, e1.meta) == ("one", 10, b"meta-1")
    assert (e2.name, e2.size) == ("two", 3)
    with pytest.raises(RuntimeError):
        with store.begin("w") as w:
            w.put("three", b"lost")
            raise RuntimeError("boom")
    assert len(store.versions("w")) == 1
    w = store.begin("w")
    w.put("x", b"1")
    w.abort()
    assert len(store.versions("w")) == 1


def test_async_save_reports_staged_then_durable(store):
    arrays = random_arrays(3)
    expect = {k: digest(v) for k, v in arrays.items()}
    h = store.save_async("as", arrays)
    h.staged()  # blocks until staged
    assert h.staged(timeout=0)
    for v in arrays.values():  # the caller may now reuse its memory
        if v.size:
            v.reshape(-1).view(np.uint8)[:] = 0
    version = h.wait()
    assert h.done()
    assert h.version == version
    got = store.load("as")
    assert {k: digest(v) for k, v in got.items()} == expect


def test_many_async_saves_in_flight(store):
    handles = [store.save_async("m", {"i": np.full(10_000, i, dtype=np.int64)}) for i in range(8)]
    ids = [h.wait() for h in handles]
    assert ids == sorted(ids)
    assert int(store.load("m")["i"][0]) == 7


def test_kv_pool_put_get(store):
    pool = store.kv_pool("kv", block_size=64 << 10, slots=64)
    keys = [int.from_bytes(bytes([i]) * 16, "little") for i in range(1, 33)]
    blocks = [np.full(64 << 10, i, dtype=np.uint8) for i in range(1, 33)]
    pool.put_many(keys, blocks)
    outs = [np.empty(64 << 10, dtype=np.uint8) for _ in keys]
    hits = pool.get_many(keys, outs)
    assert hits == [64 << 10] * 32  # the length of each hit
    assert all((o == i + 1).all() for i, o in enumerate(outs))
    miss = np.zeros(64 << 10, dtype=np.uint8)
    assert pool.get_many([12345], [miss]) == [None]
    # Fill past capacity: older blocks are evicted, never returned wrong.
    more = list(range(1000, 1100))
    for i in range(0, len(more), 25):
        pool.put_many(more[i : i + 25], [np.full(64 << 10, k % 251, dtype=np.uint8) for k in more[i : i + 25]])
    outs = [np.empty(64 << 10, dtype=np.uint8) for _ in more]
    hits = pool.get_many(more[:50], outs[:50]) + pool.get_many(more[50:], outs[50:])
    assert hits.count(None) >= 100 - 64  # at most 64 slots
    assert hits[-25:] == [64 << 10] * 25  # the newest are there
    for k, hit, o in zip(more, hits, outs):
        if hit:
            assert (o == k % 251).all()
    st = pool.stats()
    assert st["hits"] >= 32 and st["misses"] >= 1 and st["evictions"] >= 1
    assert "kv" in store.kv_pools()


def test_kv_pool_one_array_of_rows(store):
    pool = store.kv_pool("rows", block_size=4096, slots=16)
    keys = list(range(100, 108))
    src = np.arange(8 * 4096, dtype=np.uint32).astype(np.uint8).reshape(8, 4096)
    src[:, 0] = np.arange(8)  # every row differs
    pool.put_many(keys, src)  # one array: a row per key
    out = np.zeros((8, 4096), dtype=np.uint8)
    assert pool.get_many(keys, out) == [4096] * 8
    assert (out == src).all()
    # Rows shorter than the pool's block: each row is a whole (short) block.
    pool.put_many([1, 2], np.full((2, 1000), 9, dtype=np.uint8))
    out2 = np.zeros((2, 4096), dtype=np.uint8)
    assert pool.get_many([2, 1], out2) == [1000, 1000]
    assert (out2[:, :1000] == 9).all() and (out2[:, 1000:] == 0).all()
    # A generator of buffers is still one buffer per key.
    rows = [np.zeros(4096, dtype=np.uint8) for _ in range(2)]
    assert pool.get_many(keys[:2], (r for r in rows)) == [4096, 4096]
    assert (rows[1] == src[1]).all()
    with pytest.raises(ValueError, match="does not split into 3 equal rows"):
        pool.get_many([1, 2, 3], np.zeros(4096 * 2 + 2, dtype=np.uint8))
    with pytest.raises(ValueError, match="1 to 4096 bytes"):
        pool.put_many([1], np.zeros((1, 8192), dtype=np.uint8))


def test_kv_pool_survives_reopen(store_spec):
    with vfpoll.Store.format(store_spec) as s:
        p = s.kv_pool("kv", block_size=4096, slots=16)
        p.put_many([7, 8], [b"a" * 4096, b"b" * 100])
        p.sync()
    with vfpoll.Store.open(store_spec) as s:
        p = s.kv_pool("kv")
        a, b = bytearray(4096), bytearray(100)
        assert p.get_many([7, 8], [a, b]) == [4096, 100]
        assert a == b"a" * 4096 and b == b"b" * 100


def test_stats_and_info(store):
    store.save("s", {"x": np.zeros(1 << 20, dtype=np.uint8)})
    st = store.stats()
    assert st["bytes_written"] >= 1 << 20
    info = store.info()
    assert info["members"] == 1 and info["capacity"] > 0


@pytest.mark.parametrize("policy", ["lru", "s3fifo"])
def test_tuning_keywords(store_spec, policy):
    with vfpoll.Store.format(
        store_spec, io_channels=2, copy_threads=0, poll_spin_us=0, kv_eviction=policy
    ) as s:
        assert s.info()["io_channels"] == 2
        pool = s.kv_pool("kv", block_size=4096, slots=64)
        pool.put_many([1], [b"x" * 4096])
        assert pool.get_many([1], [bytearray(4096)]) == [4096]  # read again once
        for i in range(0, 120, 8):  # a scan of blocks put once, never read
            pool.put_many(range(1000 + i, 1008 + i), np.zeros((8, 4096), dtype=np.uint8))
        # S3-FIFO keeps the block that was read again out of the scan's way; LRU evicts it.
        assert (1 in pool) == (policy == "s3fifo")


def test_tuning_keywords_refused(store_spec):
    with pytest.raises(vfpoll.StoreError, match='kv_eviction="fifo": use one of lru, s3fifo'):
        vfpoll.Store.format(store_spec, kv_eviction="fifo")
    with pytest.raises(vfpoll.StoreError, match="0 I/O channels: use 1 to 64"):
        vfpoll.Store.format(store_spec, io_channels=0)
