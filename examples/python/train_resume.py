#!/usr/bin/env python3
"""Train a small model, checkpoint it to a vfpoll store with async saves, get killed, resume.

    python3 examples/python/train_resume.py --store file:/tmp/train.img?size=2G demo

``demo`` runs the whole story and checks it:

1. a reference run trains ``--steps`` steps without interruption (its losses are the truth);
2. a run with checkpoints every ``--every`` steps (``vfpoll.torch.save_async``: training waits
   only until the save is *staged*, the commit finishes in the background) kills itself with
   SIGKILL at step ``--kill-at``, in the middle of an async save;
3. a third run resumes from the store's last committed checkpoint and trains to the end.

The resumed run's losses must equal the reference run's from the checkpoint on (the batches are
a function of the step number, and model and optimizer state come back bit-exact), which the
demo checks and prints side by side. ``train`` and ``resume`` run one phase each.

Runs on the GPU when there is one (the tensors go to the store from CUDA memory), else on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

import torch

import vfpoll
import vfpoll.torch as vt

NAME = "train"


def make_model(device: torch.device) -> torch.nn.Module:
    torch.manual_seed(1234)
    return torch.nn.Sequential(
        torch.nn.Linear(256, 1024),
        torch.nn.GELU(),
        torch.nn.Linear(1024, 1024),
        torch.nn.GELU(),
        torch.nn.Linear(1024, 16),
    ).to(device)


def batch(step: int, device: torch.device):
    """The batch of a step: a pure function of the step, so that a resumed run sees the same
    data as an uninterrupted one."""
    g = torch.Generator().manual_seed(step)
    x = torch.randn(512, 256, generator=g)
    w = torch.randn(256, 16, generator=torch.Generator().manual_seed(7))
    y = torch.tanh(x @ w) + 0.1 * torch.randn(512, 16, generator=g)
    return x.to(device), y.to(device)


def train(args, device, start_state=None, kill_at=None, checkpoint=True):
    model = make_model(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = 0
    if start_state is not None:
        model.load_state_dict(start_state["model"])
        opt.load_state_dict(start_state["optim"])
        step = start_state["step"]
        print(f"resumed from step {step}", flush=True)
    store = vfpoll.Store.open(args.store) if checkpoint else None
    pending = None
    blocked = 0.0
    losses = {}
    while step < args.steps:
        x, y = batch(step, device)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        # The checkpoint's tensors must stay put until staged: the step below changes them.
        if pending is not None and not pending.staged(timeout=0):
            t0 = time.perf_counter()
            pending.staged()
            blocked += time.perf_counter() - t0
        opt.step()
        step += 1
        losses[step] = loss.item()
        print(json.dumps({"step": step, "loss": losses[step]}), flush=True)
        if store is not None and step % args.every == 0:
            if pending is not None:
                pending.wait()  # one save in flight at a time
                store.keep_last(NAME, 2)
            t0 = time.perf_counter()
            state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": step}
            pending = vt.save_async(state, store, NAME)
            blocked += time.perf_counter() - t0
        if kill_at is not None and step == kill_at:
            print(f"killing myself at step {step} (a save may be in flight)", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    if pending is not None:
        pending.wait()
    if store is not None:
        print(f"time blocked by checkpoints: {blocked:.3f} s", flush=True)
        store.close()
    return losses


def run_phase(args, phase: str, extra=()):
    cmd = [sys.executable, os.path.abspath(__file__), "--store", args.store, "--steps", str(args.steps),
           "--every", str(args.every), "--kill-at", str(args.kill_at), *extra, phase]
    p = subprocess.run(cmd, capture_output=True, text=True)
    losses = {}
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            d = json.loads(line)
            losses[d["step"]] = d["loss"]
        else:
            print(f"  [{phase}] {line}")
    return p.returncode, losses


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", required=True, help="namespace spec of the store, e.g. file:/tmp/train.img?size=2G")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--every", type=int, default=10, help="checkpoint every N steps")
    ap.add_argument("--kill-at", type=int, default=40, help="the step at which the train phase kills itself")
    ap.add_argument("phase", choices=["demo", "train", "resume", "reference"])
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    if args.phase == "reference":
        train(args, device, checkpoint=False)
        return 0
    if args.phase == "train":
        with vfpoll.Store.format(args.store, force=True):
            pass
        train(args, device, kill_at=args.kill_at)
        return 0
    if args.phase == "resume":
        with vfpoll.Store.open(args.store) as store:
            versions = store.versions(NAME)
            print(f"committed versions: {[v.id for v in versions]}", flush=True)
            state = vt.load(store, NAME, map_location=device)
        train(args, device, start_state=state)
        return 0

    # demo
    print(f"device: {device}; {args.steps} steps, checkpoint every {args.every}, killed at {args.kill_at}")
    rc, ref = run_phase(args, "reference")
    assert rc == 0, "reference run failed"
    rc, first = run_phase(args, "train")
    print(f"train phase ended with {rc} (-9: SIGKILL) after step {max(first)}")
    assert rc == -signal.SIGKILL, rc
    rc, resumed = run_phase(args, "resume")
    assert rc == 0, "resume failed"
    start = min(resumed)
    print(f"resumed at step {start} (last checkpoint: step {start - 1})")
    print(f"{'step':>5} {'reference':>12} {'killed run':>12} {'resumed':>12}")
    for s in range(1, args.steps + 1):
        print(f"{s:5d} {ref[s]:12.6f} {first.get(s, float('nan')):12.6f} {resumed.get(s, float('nan')):12.6f}")
    worst = max(abs(resumed[s] - ref[s]) for s in resumed)
    print(f"largest difference between the resumed run and the reference: {worst:.3g}")
    assert start - 1 <= args.kill_at and start - 1 >= args.kill_at - 2 * args.every
    assert worst <= 1e-5 * max(1.0, max(abs(v) for v in ref.values())), "the loss curve did not continue"
    print("ok: the loss curve continues from the last committed checkpoint")
    return 0


if __name__ == "__main__":
    sys.exit(main())
