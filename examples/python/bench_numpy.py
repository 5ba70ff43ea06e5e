#!/usr/bin/env python3
"""numpy arrays through a vfpoll store against np.save / np.load on a file system, same machine:

    python3 examples/python/bench_numpy.py --store vfio:0000:00:0e.0/1 --dir /mnt/ext4 [--mib 256]

For each: GB/s, the time the caller is blocked (until ``staged()`` for the async save), and the
process's CPU seconds. ``np.save`` writes one ``.npy`` file per array and ``os.fsync``s it, the
durability a committed vfpoll version has; loads drop the page cache first (as root). Every load is
compared with the saved arrays. Figures only, nothing asserted about speed.
"""

from __future__ import annotations

import argparse
import os
import resource
import time

import numpy as np

import vfpoll


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def drop_caches() -> None:
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", action="append", required=True, help="a namespace spec of the store (repeat for several)")
    ap.add_argument("--dir", required=True, help="a directory on the file system to compare with")
    ap.add_argument("--mib", type=int, default=256, help="MiB of arrays")
    ap.add_argument("--arrays", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()

    rng = np.random.default_rng(0)
    per = (args.mib << 20) // args.arrays // 4
    arrays = {f"a{i}": rng.integers(0, 2**31, size=per, dtype=np.uint32) for i in range(args.arrays)}
    total = sum(a.nbytes for a in arrays.values())
    gb = total / 1e9
    store = vfpoll.Store.format(args.store, force=True)
    print(f"{args.arrays} arrays, {total >> 20} MiB; store on {', '.join(args.store)}; files in {args.dir}")
    rows = []

    def row(method, secs, blocked, cpu):
        rows.append((method, gb / secs, secs, blocked, cpu))
        print(f"{method:28} {gb / secs:7.3f} GB/s {secs:7.2f} s  blocked {blocked:6.2f} s  CPU {cpu:5.2f} s", flush=True)

    def same(back):
        assert back.keys() == arrays.keys()
        for k in arrays:
            assert np.array_equal(back[k], arrays[k]), k

    for rnd in range(args.rounds):
        print(f"--- round {rnd + 1}")
        c0, t0 = cpu_s(), time.perf_counter()
        for k, a in arrays.items():
            with open(os.path.join(args.dir, f"{k}.npy"), "wb") as f:
                np.save(f, a)
                f.flush()
                os.fsync(f.fileno())
        s = time.perf_counter() - t0
        row("np.save + fsync", s, s, cpu_s() - c0)
        drop_caches()
        c0, t0 = cpu_s(), time.perf_counter()
        back = {k: np.load(os.path.join(args.dir, f"{k}.npy")) for k in arrays}
        s = time.perf_counter() - t0
        row("np.load", s, s, cpu_s() - c0)
        same(back)
        for k in arrays:
            os.remove(os.path.join(args.dir, f"{k}.npy"))

        c0, t0 = cpu_s(), time.perf_counter()
        store.save("bench", arrays)
        s = time.perf_counter() - t0
        row("vfpoll save", s, s, cpu_s() - c0)
        drop_caches()
        c0, t0 = cpu_s(), time.perf_counter()
        back = store.load("bench")
        s = time.perf_counter() - t0
        row("vfpoll load", s, s, cpu_s() - c0)
        same(back)
        c0, t0 = cpu_s(), time.perf_counter()
        h = store.save_async("bench", arrays)
        h.staged()
        blocked = time.perf_counter() - t0
        h.wait()
        s = time.perf_counter() - t0
        row("vfpoll save_async", s, blocked, cpu_s() - c0)
        store.keep_last("bench", 1)
    store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
