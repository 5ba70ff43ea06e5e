"""One rank of a multi-rank ``torch.distributed.checkpoint`` test (run by test_dcp_ranks.py,
one process per rank, gloo over TCP on localhost): ``python dcp_ranks_worker.py SCENARIO DIR``
with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (WORLD_SIZE=1 without them: no
process group). Exits 0 when its checks pass; prints what differs otherwise."""

import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

import vfpoll
import vfpoll.torch as vt

DEVICE = os.environ.get("VFPOLL_TEST_DEVICE", "cpu")


def replicated(step: int):
    """The same on every rank (DCP saves each once, spread over the ranks)."""
    g = torch.Generator().manual_seed(step)
    return {
        "a": torch.randn(300, 257, generator=g).to(DEVICE),
        "b": torch.randint(0, 1000, (1 << 18,), generator=g).to(DEVICE),
        "c": torch.randn(64, 64, generator=g).to(torch.bfloat16).to(DEVICE),
        "d": torch.randn(1 << 17, generator=g).to(DEVICE),
    }


def own(rank: int, step: int):
    return torch.full((1000 + rank,), float(rank * 100 + step)).to(DEVICE)


def state(rank: int, step: int):
    """The replicated tensors, and those of the ranks in OWNS (default: this rank's own)."""
    s = {"rep": replicated(step), "step": step}
    for r in os.environ.get("OWNS", str(rank)).split(","):
        s[f"own{r}"] = own(int(r), step)
    return s


def fail_before_commit(self, *args, **kwargs):
    """StoreWriter.finish of a coordinator that dies before its commit."""
    self._abort()
    raise RuntimeError("injected: the coordinator failed before its commit")


def zeros_like(x):
    if isinstance(x, torch.Tensor):
        return torch.zeros_like(x)
    if isinstance(x, dict):
        return {k: zeros_like(v) for k, v in x.items()}
    return x


def same(a, b, path=""):
    if isinstance(a, torch.Tensor):
        if not (a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.cpu(), b.cpu())):
            print(f"{path}: differs", flush=True)
            return False
        return True
    if isinstance(a, dict):
        return all(same(a[k], b[k], f"{path}/{k}") for k in a)
    if a != b:
        print(f"{path}: {a!r} != {b!r}", flush=True)
    return a == b


def main() -> int:
    scenario, d = sys.argv[1], sys.argv[2]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0
    template = f"file:{d}/rank{{rank}}.img?size=96M"
    opts = {"lock_dir": d}
    step = int(os.environ.get("STEP", "1"))
    keep = int(os.environ["KEEP"]) if "KEEP" in os.environ else None
    ok = True
    if scenario == "save":
        w = vt.StoreWriter(template, "ck", open_options=opts, keep_last=keep)
        if os.environ.get("ASYNC"):
            # dcp.async_save: staged into host memory here, written on DCP's thread.
            fut = dcp.async_save(state(rank, step), storage_writer=w)
            getattr(fut, "upload_completion", fut).result()
        else:
            dcp.save(state(rank, step), storage_writer=w)
    elif scenario == "save_fail_commit":
        # The coordinator fails before its commit: the ranks' versions are there, the
        # checkpoint is not.
        if rank == 0:
            vt.StoreWriter.finish = fail_before_commit
        try:
            dcp.save(state(rank, step), storage_writer=vt.StoreWriter(template, "ck", open_options=opts))
        except BaseException as e:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            print(f"save failed as injected: {type(e).__name__}", flush=True)
        else:
            print("the save did not fail", flush=True)
            ok = False
    elif scenario == "save_store_object":
        store = vfpoll.Store.format(f"file:{d}/own{rank}.img?size=32M", lock_dir=d)
        try:
            dcp.save(state(rank, step), storage_writer=vt.StoreWriter(store, "ck"))
        except BaseException as e:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            ok = "spec template with {rank}" in str(e)
            print(f"refused: {ok}", flush=True)
        else:
            ok = False
        store.close()
    elif scenario == "load":
        want = state(rank, step)
        got = zeros_like(want)
        got["step"] = -1
        dcp.load(got, storage_reader=vt.StoreReader(template, "ck", open_options=opts))
        ok = same(want, got)
    elif scenario in ("save_dt", "load_dt"):
        full = torch.arange(7 * 6 * 5, dtype=torch.float32).reshape(42, 5) * (step + 1)
        if world > 1:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor import Shard, distribute_tensor

            mesh = init_device_mesh("cpu", (world,))
            t = distribute_tensor(full if scenario == "save_dt" else torch.zeros_like(full), mesh, [Shard(0)])
        else:
            t = full.clone() if scenario == "save_dt" else torch.zeros_like(full)
        if scenario == "save_dt":
            dcp.save({"dt": t}, storage_writer=vt.StoreWriter(template, "dt", open_options=opts))
        else:
            sd = {"dt": t}
            dcp.load(sd, storage_reader=vt.StoreReader(template, "dt", open_options=opts))
            back = sd["dt"].full_tensor() if world > 1 else sd["dt"]
            ok = torch.equal(back, full)
            if not ok:
                print(f"rank {rank}: resharded tensor differs", flush=True)
    else:
        print(f"unknown scenario {scenario}", flush=True)
        ok = False
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
