"""An async save killed mid-way (SIGKILL of the saving process) leaves the store with exactly
its last committed version."""

import os
import signal
import subprocess
import sys
import time

import numpy as np

import vfpoll
from conftest import digest

CHILD = r"""
import sys, numpy as np, vfpoll
spec = sys.argv[1]
s = vfpoll.Store.open(spec)
big = {f"t{i}": np.full(8 << 20, i + 1, dtype=np.uint8) for i in range(8)}
print("saving", flush=True)
while True:
    h = s.save_async("ck", big)
    h.wait()
"""


def test_kill_during_async_save_keeps_last_commit(store_spec):
    base = {"w": np.arange(1 << 16, dtype=np.float32), "b": np.ones(100, dtype=np.int8)}
    with vfpoll.Store.format(store_spec) as s:
        v0 = s.save("ck", base)
        s.keep_last("ck", 1)
    want = {k: digest(v) for k, v in base.items()}
    child = subprocess.Popen([sys.executable, "-c", CHILD, store_spec], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "saving"
    time.sleep(0.3)
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=30)
    with vfpoll.Store.open(store_spec) as s:
        versions = [v.id for v in s.versions("ck")]
        assert versions and versions[0] == v0
        got = s.load("ck", version=v0)
        assert {k: digest(v) for k, v in got.items()} == want
        # Any newer version is complete: a commit is all or nothing.
        for v in versions[1:]:
            later = s.load("ck", version=v)
            assert sorted(later) == [f"t{i}" for i in range(8)]
            for i in range(8):
                assert (later[f"t{i}"] == i + 1).all()
