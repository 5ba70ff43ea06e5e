"""torch.distributed.checkpoint with several ranks, one store per rank (a spec template with
{rank}): each rank is a process of its own (gloo over TCP on localhost) running
dcp_ranks_worker.py; saves with 2 ranks, loads with 2, with 1 (no process group) and, through
DTensors, with 3 (resharding); a coordinator that fails before its commit leaves the last
checkpoint in place, and keep_last collects the ranks' versions that no checkpoint names."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
dist = pytest.importorskip("torch.distributed", reason="torch.distributed is not available")
if not (dist.is_available() and dist.is_gloo_available()):
    pytest.skip("torch.distributed has no gloo backend here", allow_module_level=True)

import vfpoll  # noqa: E402

WORKER = Path(__file__).with_name("dcp_ranks_worker.py")
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ranks(scenario: str, world: int, d: Path, **env) -> None:
    """Runs `scenario` in `world` processes; fails the test with their output unless every
    one exits 0."""
    port = free_port()
    procs = []
    for r in range(world):
        e = dict(os.environ, WORLD_SIZE=str(world), **{k: str(v) for k, v in env.items()})
        if world > 1:
            e.update(RANK=str(r), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WORKER), scenario, str(d)],
                env=e,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"{scenario} with {world} ranks did not finish in 180 s")
        outs.append((p.returncode, out))
    bad = [(r, rc, out) for r, (rc, out) in enumerate(outs) if rc != 0]
    assert not bad, "\n".join(f"--- rank {r} exited {rc}:\n{out[-3000:]}" for r, rc, out in bad)


def versions(d: Path, rank: int, name: str = "ck"):
    s = vfpoll.Store.open(f"file:{d}/rank{rank}.img", lock_dir=str(d))
    try:
        return [v.id for v in s.versions(name)]
    finally:
        s.close()


@pytest.mark.parametrize("device", DEVICES)
def test_two_ranks_save_then_load_with_two_and_with_one(tmp_path, device):
    ranks("save", 2, tmp_path, VFPOLL_TEST_DEVICE=device)
    # Each rank holds its own store, and DCP spread the replicated tensors over both.
    assert versions(tmp_path, 0) and versions(tmp_path, 1)
    ranks("load", 2, tmp_path, VFPOLL_TEST_DEVICE=device)
    # One process, no process group: reads both ranks' stores.
    ranks("load", 1, tmp_path, VFPOLL_TEST_DEVICE=device, OWNS="0,1")
    # dcp.async_save, both ranks: the next checkpoint.
    ranks("save", 2, tmp_path, VFPOLL_TEST_DEVICE=device, STEP=2, ASYNC=1)
    ranks("load", 2, tmp_path, VFPOLL_TEST_DEVICE=device, STEP=2)


def test_reshard_dtensor_from_two_ranks_to_three_and_one(tmp_path):
    ranks("save_dt", 2, tmp_path)
    ranks("load_dt", 3, tmp_path)
    ranks("load_dt", 1, tmp_path)


def test_failed_coordinator_commit_leaves_last_checkpoint_and_keep_last_collects(tmp_path):
    ranks("save", 2, tmp_path, STEP=1)
    ranks("save_fail_commit", 2, tmp_path, STEP=2)
    # Rank 1 committed its part of step 2, but no checkpoint names it: step 1 loads.
    assert len(versions(tmp_path, 1)) == 2 and len(versions(tmp_path, 0)) == 1
    ranks("load", 2, tmp_path, STEP=1)
    ranks("save", 2, tmp_path, STEP=3, KEEP=1)
    ranks("save", 2, tmp_path, STEP=4, KEEP=1)
    # The coordinator keeps step 4 only; rank 1 dropped steps 1 and 2 (the orphan) at step 4's
    # save and keeps step 3's part until the next one.
    assert len(versions(tmp_path, 0)) == 1
    assert len(versions(tmp_path, 1)) == 2
    ranks("load", 2, tmp_path, STEP=4)


def test_one_store_object_with_two_ranks_is_refused(tmp_path):
    ranks("save_store_object", 2, tmp_path)
