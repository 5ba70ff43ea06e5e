#!/usr/bin/env python3
"""KV-cache blocks between CUDA memory and a disk: a vfpoll KV pool against the path an inference
server without one takes (``O_DIRECT`` ``preadv``/``pwritev`` of a file into pinned host memory,
then a copy to the GPU).

    python3 examples/python/bench_kv.py --dir /data/bench [--blocks 16384] [--block 65536]

Both paths work on the same disk, on files of the same size, with blocks of ``--block`` bytes
(64 KiB: 16 tokens of a 7B model's K and V in bf16) held in one CUDA tensor:

* **put**: batches of 32 blocks from CUDA memory to the disk (vfpoll: ``KvPool.put_many`` of CUDA
  tensors, then ``sync()`` per batch; file: a copy to pinned memory, ``pwritev``, ``fdatasync``);
* **get, batches of 32**: 32 random held blocks into CUDA memory (vfpoll: ``get_many`` of CUDA
  tensors, each block's crc32c checked; file: ``preadv`` into pinned memory and a copy to the GPU,
  unchecked);
* **get at QD1**: one random block into CUDA memory, p50 and p99;
* **threads**: ``--threads`` threads doing the batches of 32 at once (the GIL is released in the
  store's calls and in ``preadv``);
* **miss**: a ``get_many`` of 32 absent keys (the index answers; no I/O).

Rounds alternate the order of the two paths. Every get is compared with what was put
(``torch.equal`` on the GPU). Figures only: nothing is asserted about speed.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import random
import statistics
import threading
import time

import torch

import vfpoll

BATCH = 32


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


class FilePath:
    """The path without a store: O_DIRECT I/O on a file, pinned staging, copies to the GPU."""

    def __init__(self, path: str, blocks: int, block: int) -> None:
        self.block = block
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
        os.ftruncate(self.fd, blocks * block)
        self.local = threading.local()

    def _pinned(self) -> tuple:
        if not hasattr(self.local, "pin"):
            pin = torch.empty(BATCH * self.block, dtype=torch.uint8, pin_memory=True)
            # O_DIRECT wants aligned memory: cudaHostAlloc returns page-aligned memory.
            assert pin.data_ptr() % 4096 == 0
            mv = memoryview(pin.numpy())
            self.local.pin = (pin, [mv[i * self.block : (i + 1) * self.block] for i in range(BATCH)])
        return self.local.pin

    def put(self, slots, src: torch.Tensor) -> None:
        pin, views = self._pinned()
        n = len(slots)
        pin[: n * self.block].view(n, self.block).copy_(src)
        for i, s in enumerate(slots):
            os.pwritev(self.fd, [views[i]], s * self.block)
        os.fdatasync(self.fd)

    def get(self, slots, dst: torch.Tensor) -> None:
        pin, views = self._pinned()
        n = len(slots)
        for i, s in enumerate(slots):
            if os.preadv(self.fd, [views[i]], s * self.block) != self.block:
                raise OSError("short read")
        dst.copy_(pin[: n * self.block].view(n, self.block), non_blocking=True)
        torch.cuda.current_stream().synchronize()

    def close(self) -> None:
        os.close(self.fd)


class StorePath:
    """A vfpoll KV pool on a file of the same size."""

    def __init__(self, path: str, blocks: int, block: int, **opts) -> None:
        # Room for the store's own headers and the pool's slot header table.
        size = blocks * block + (64 << 20)
        self.store = vfpoll.Store.format([f"file:{path}?size={size}"], force=True, lock_dir="/tmp", **opts)
        self.pool = self.store.kv_pool("kv", block_size=block, slots=blocks)

    def put(self, slots, src: torch.Tensor) -> None:
        self.pool.put_many(list(slots), src)  # one 2-D tensor: a block per row
        self.pool.sync()

    def get(self, slots, dst: torch.Tensor) -> None:
        hits = self.pool.get_many(list(slots), dst)
        if any(h is None for h in hits):
            raise RuntimeError(f"a held block missed: {hits}")

    def close(self) -> None:
        self.store.close()


def run(path, blocks, data: torch.Tensor, gets: int, threads: int, rng: random.Random) -> dict:
    """Puts every block, then times gets; every get is checked against ``data``."""
    block = data.shape[1]
    out = {}
    order = list(range(blocks))
    t0 = time.perf_counter()
    for i in range(0, blocks, BATCH):
        s = order[i : i + BATCH]
        path.put(s, data[s[0] : s[-1] + 1])
    out["put_GBps"] = blocks * block / (time.perf_counter() - t0) / 1e9

    dst = torch.empty(BATCH, block, dtype=torch.uint8, device=data.device)
    one = dst[:1]
    lat = []
    for _ in range(gets):
        s = rng.randrange(blocks)
        t = time.perf_counter()
        path.get([s], one)
        lat.append((time.perf_counter() - t) * 1e6)
        if not torch.equal(one[0], data[s]):
            raise RuntimeError(f"block {s}: wrong bytes")
    out["get_qd1_p50_us"] = pct(lat, 0.5)
    out["get_qd1_p99_us"] = pct(lat, 0.99)

    batches = max(1, gets // BATCH)
    t0 = time.perf_counter()
    for _ in range(batches):
        s = rng.sample(range(blocks), BATCH)
        path.get(s, dst)
        if not torch.equal(dst, data[s]):
            raise RuntimeError("a batch got wrong bytes")
    out["get_batch32_GBps"] = batches * BATCH * block / (time.perf_counter() - t0) / 1e9

    errors = []

    def worker(seed: int) -> None:
        r = random.Random(seed)
        d = torch.empty(BATCH, block, dtype=torch.uint8, device=data.device)
        try:
            for _ in range(batches):
                s = r.sample(range(blocks), BATCH)
                path.get(s, d)
                if not torch.equal(d, data[s]):
                    raise RuntimeError("a threaded batch got wrong bytes")
        except Exception as e:  # reported after the join
            errors.append(e)

    ts = [threading.Thread(target=worker, args=(rng.random(),)) for _ in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    secs = time.perf_counter() - t0
    if errors:
        raise errors[0]
    out[f"get_batch32_x{threads}_GBps"] = threads * batches * BATCH * block / secs / 1e9
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True, help="directory on the disk to measure")
    ap.add_argument("--blocks", type=int, default=16384, help="blocks put (and slots of the pool)")
    ap.add_argument("--block", type=int, default=65536, help="block size in bytes")
    ap.add_argument("--gets", type=int, default=2000, help="QD1 gets per round (and 1/32 as many batches)")
    ap.add_argument("--threads", type=int, default=4, help="threads of the threaded row")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--io-channels", type=int, help="the store's io_channels (default: its own)")
    ap.add_argument("--poll-spin-us", type=int, help="the store's poll_spin_us (default: its own)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_kv.py needs a CUDA device")
    os.makedirs(a.dir, exist_ok=True)
    torch.manual_seed(0)
    data = torch.randint(0, 256, (a.blocks, a.block), dtype=torch.uint8, device="cuda")
    rng = random.Random(1)
    opts = {k: v for k, v in (("io_channels", a.io_channels), ("poll_spin_us", a.poll_spin_us)) if v is not None}
    rows: dict = {"file": [], "vfpoll": []}
    for r in range(a.rounds):
        order = ["file", "vfpoll"] if r % 2 == 0 else ["vfpoll", "file"]
        for which in order:
            f = os.path.join(a.dir, f"kv-{which}.img")
            p = FilePath(f, a.blocks, a.block) if which == "file" else StorePath(f, a.blocks, a.block, **opts)
            try:
                rows[which].append(run(p, a.blocks, data, a.gets, a.threads, rng))
            finally:
                p.close()
            os.unlink(f)
    med = {w: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for w, rs in rows.items()}
    # The miss path: the index answers without I/O.
    st = StorePath(os.path.join(a.dir, "kv-miss.img"), 1024, a.block)
    dst = torch.empty(BATCH, a.block, dtype=torch.uint8, device="cuda")
    lat = []
    for i in range(200):
        t = time.perf_counter()
        hits = st.pool.get_many([(1 << 100) + i * BATCH + j for j in range(BATCH)], dst)
        lat.append((time.perf_counter() - t) * 1e6)
        assert all(h is None for h in hits)
    st.close()
    os.unlink(os.path.join(a.dir, "kv-miss.img"))
    med["vfpoll"]["miss_batch32_p50_us"] = pct(lat, 0.5)
    if a.json:
        print(json.dumps({"rounds": a.rounds, "block": a.block, "blocks": a.blocks, "median": med, "all": rows}))
        return 0
    print(
        f"KV blocks of {a.block >> 10} KiB, {a.blocks} blocks ({a.blocks * a.block / 2**30:.1f} GiB) in CUDA "
        f"memory, medians of {a.rounds} rounds; file = O_DIRECT preadv/pwritev + pinned copy"
    )
    print(f"{'':34}{'file':>10}{'vfpoll':>10}{'vfpoll/file':>13}")
    for k in med["file"]:
        f, v = med["file"][k], med["vfpoll"][k]
        print(f"{k:34}{f:10.2f}{v:10.2f}{v / f:12.2f}x")
    print(f"{'miss_batch32_p50_us':34}{'':10}{med['vfpoll']['miss_batch32_p50_us']:10.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
