#!/usr/bin/env python3
"""Checkpoint save and load of a transformers model with AdamW state, from CUDA memory, four ways:

* ``torch.save`` / ``torch.load`` of the state dict to one file (then ``os.sync()``),
* ``torch.distributed.checkpoint`` with ``FileSystemWriter`` / ``FileSystemReader`` (sync_files),
  and its ``async_save``,
* vfpoll: ``vfpoll.torch.save`` / ``load`` and ``save_async``,
* vfpoll through DCP: ``StoreWriter`` / ``StoreReader`` with ``dcp.save`` and ``dcp.async_save``.

    python3 examples/python/bench_checkpoint.py --dir /data/bench [--layers 8] [--rounds 2]

For each: GB/s of the state dict's bytes, the time training is blocked (the whole save for the
synchronous paths; until ``staged()``, or until ``async_save`` returns, for the asynchronous
ones), the time to durable, and the process's CPU seconds (all threads) over the operation. The
page cache is dropped before every load (as root) so that loads read the disk. Every load is
compared with the saved tensors (``torch.equal``). Figures only: nothing is asserted about speed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import time

import torch
import torch.distributed.checkpoint as dcp

import vfpoll
import vfpoll.torch as vt


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


def build(layers: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=2048,
        intermediate_size=5504,
        num_hidden_layers=layers,
        num_attention_heads=16,
        num_key_value_heads=16,
        vocab_size=32000,
    )
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return model, opt


def nbytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(v) for v in obj)
    return 0


def tensors(obj, prefix=""):
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from tensors(v, f"{prefix}/{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from tensors(v, f"{prefix}/{i}")


def check(saved, loaded) -> None:
    a = dict(tensors(saved))
    b = dict(tensors(loaded))
    assert a.keys() == b.keys(), (len(a), len(b))
    for k in a:
        assert b[k].dtype == a[k].dtype and b[k].shape == a[k].shape, k
        assert torch.equal(a[k], b[k].to(a[k].device)), k


def zeros_like(state):
    if isinstance(state, torch.Tensor):
        return torch.zeros_like(state)
    if isinstance(state, dict):
        return {k: zeros_like(v) for k, v in state.items()}
    if isinstance(state, list):
        return [zeros_like(v) for v in state]
    if isinstance(state, tuple):
        return tuple(zeros_like(v) for v in state)
    return state


def timed(fn):
    torch.cuda.synchronize()
    c0, t0 = cpu_s(), time.perf_counter()
    r = fn()
    torch.cuda.synchronize()
    return r, time.perf_counter() - t0, cpu_s() - c0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True, help="a directory on the disk to measure (files are made and removed there)")
    ap.add_argument("--layers", type=int, default=8, help="decoder layers of the model (8: 0.54 G parameters)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of all methods, alternating")
    ap.add_argument("--json", help="write the results here too")
    ap.add_argument(
        "--methods",
        default="torch,dcp,vfpoll,vfpoll-dcp",
        help="comma-separated subset of: torch (torch.save/load), dcp (FileSystemWriter/Reader), vfpoll, vfpoll-dcp",
    )
    ap.add_argument("--chunk-mib", type=int, help="the store's chunk size (default: the store's, 1 MiB)")
    ap.add_argument("--io-buffers", type=int, help="the store's I/O buffers in flight (default: the store's, 32)")
    ap.add_argument("--profile-load", action="store_true", help="after the rounds, profile one vfpoll.torch.load and one DCP StoreReader load (cProfile, top functions)")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)

    model, opt = build(args.layers)
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    total = nbytes(state)
    gb = total / 1e9
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, vfpoll {vfpoll.__version__}")
    print(f"state dict: {len(dict(tensors(state)))} tensors, {gb:.2f} GB (bf16 parameters + AdamW state)")
    store_path = os.path.join(args.dir, "vfpoll-store.img")
    # Room for the two checkpoints kept (plain and DCP) and the one being written, and spare.
    store = vfpoll.Store.format(
        f"file:{store_path}?size={int(total * 4.2) // (1 << 20) + 256}M",
        force=True,
        chunk_size=args.chunk_mib << 20 if args.chunk_mib else None,
        io_buffers=args.io_buffers,
    )
    print(f"store: chunk {store.info()['chunk_size'] >> 10} KiB, io_buffers {args.io_buffers or 'default'}")
    results = []
    # The async writers are kept across rounds, as a training loop keeps them: both cache their
    # pinned staging copy of the state dict (cache_staged_state_dict).
    fs_async = dcp.FileSystemWriter(os.path.join(args.dir, "dcp"), sync_files=True, cache_staged_state_dict=True)
    vf_async = vt.StoreWriter(store, "dcp", cache_staged_state_dict=True)

    def record(method, op, secs, blocked, cpu, durable=None):
        r = {
            "method": method,
            "op": op,
            "seconds": round(secs, 3),
            "GB/s": round(gb / secs, 3),
            "blocked_s": round(blocked, 3),
            "cpu_s": round(cpu, 2),
        }
        if durable is not None:
            r["durable_s"] = round(durable, 3)
        results.append(r)
        print(json.dumps(r), flush=True)

    def torch_save():
        path = os.path.join(args.dir, "ckpt.pt")

        def save():
            torch.save(state, path)
            os.sync()

        _, s, c = timed(save)
        record("torch.save", "save", s, s, c)
        drop_caches()
        back, s, c = timed(lambda: torch.load(path, map_location="cuda", weights_only=True))
        record("torch.load", "load", s, s, c)
        check(state, back)
        del back
        os.remove(path)

    def dcp_fs():
        path = os.path.join(args.dir, "dcp")
        shutil.rmtree(path, ignore_errors=True)
        _, s, c = timed(lambda: dcp.save(state, storage_writer=dcp.FileSystemWriter(path, sync_files=True)))
        record("DCP FileSystemWriter", "save", s, s, c)
        target = zeros_like(state)
        drop_caches()
        _, s, c = timed(lambda: dcp.load(target, storage_reader=dcp.FileSystemReader(path)))
        record("DCP FileSystemReader", "load", s, s, c)
        check(state, target)
        del target
        shutil.rmtree(path, ignore_errors=True)
        torch.cuda.synchronize()
        c0, t0 = cpu_s(), time.perf_counter()
        fut = dcp.async_save(state, storage_writer=fs_async)
        blocked = time.perf_counter() - t0
        getattr(fut, "upload_completion", fut).result()
        s = time.perf_counter() - t0
        record("DCP async_save FileSystemWriter", "save", s, blocked, cpu_s() - c0, s)
        shutil.rmtree(path, ignore_errors=True)

    def vfpoll_plain():
        _, s, c = timed(lambda: vt.save(state, store, "bench"))
        record("vfpoll.torch.save", "save", s, s, c)
        drop_caches()
        back, s, c = timed(lambda: vt.load(store, "bench"))
        record("vfpoll.torch.load", "load", s, s, c)
        check(state, back)
        del back
        torch.cuda.synchronize()
        c0, t0 = cpu_s(), time.perf_counter()
        h = vt.save_async(state, store, "bench")
        h.staged()
        blocked = time.perf_counter() - t0
        h.wait()
        s = time.perf_counter() - t0
        record("vfpoll.torch.save_async", "save", s, blocked, cpu_s() - c0, s)
        staged_s, durable_s = h.timings
        print(
            f"  save_async timeline: staged (D2H of every CUDA tensor) {staged_s:.3f} s, then writes + commit "
            f"{durable_s - staged_s:.3f} s ({gb / (durable_s - staged_s):.2f} GB/s)",
            flush=True,
        )
        store.keep_last("bench", 1)

    def vfpoll_dcp():
        _, s, c = timed(lambda: dcp.save(state, storage_writer=vt.StoreWriter(store, "dcp")))
        record("DCP StoreWriter (vfpoll)", "save", s, s, c)
        target = zeros_like(state)
        drop_caches()
        _, s, c = timed(lambda: dcp.load(target, storage_reader=vt.StoreReader(store, "dcp")))
        record("DCP StoreReader (vfpoll)", "load", s, s, c)
        check(state, target)
        del target
        store.keep_last("dcp", 1)
        torch.cuda.synchronize()
        c0, t0 = cpu_s(), time.perf_counter()
        fut = dcp.async_save(state, storage_writer=vf_async)
        blocked = time.perf_counter() - t0
        getattr(fut, "upload_completion", fut).result()
        s = time.perf_counter() - t0
        record("DCP async_save StoreWriter (vfpoll)", "save", s, blocked, cpu_s() - c0, s)
        store.keep_last("dcp", 1)

    methods = {"torch": torch_save, "dcp": dcp_fs, "vfpoll": vfpoll_plain, "vfpoll-dcp": vfpoll_dcp}
    chosen = [m.strip() for m in args.methods.split(",") if m.strip()]
    for m in chosen:
        if m not in methods:
            ap.error(f"--methods: unknown {m!r}; use {', '.join(methods)}")
    for rnd in range(args.rounds):
        print(f"--- round {rnd + 1}")
        for m in chosen:
            methods[m]()
    if args.profile_load:
        import cProfile
        import pstats

        vt.save(state, store, "bench")
        dcp.save(state, storage_writer=vt.StoreWriter(store, "dcp"))
        for what, fn in (
            ("vfpoll.torch.load", lambda: vt.load(store, "bench")),
            ("DCP StoreReader", lambda: dcp.load(zeros_like(state), storage_reader=vt.StoreReader(store, "dcp"))),
        ):
            drop_caches()
            prof = cProfile.Profile()
            t0 = time.perf_counter()
            prof.enable()
            fn()
            torch.cuda.synchronize()
            prof.disable()
            print(f"--- profile of {what}: {time.perf_counter() - t0:.3f} s")
            pstats.Stats(prof).sort_stats("cumulative").print_stats(14)
    store.close()
    os.remove(store_path)

    print()
    print(f"{'method':38} {'op':5} {'GB/s':>7} {'seconds':>8} {'blocked s':>9} {'CPU s':>7}")
    for r in results:
        print(f"{r['method']:38} {r['op']:5} {r['GB/s']:7.2f} {r['seconds']:8.2f} {r['blocked_s']:9.2f} {r['cpu_s']:7.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"GB": gb, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
