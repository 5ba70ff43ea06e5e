"""PyTorch: state dicts (model + optimizer, nested, non-tensor values) through vfpoll.torch, and
torch.distributed.checkpoint through StoreWriter / StoreReader. CPU tests need torch; the CUDA
ones a GPU (they run on the GPU machine)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
import torch.distributed.checkpoint as dcp  # noqa: E402

import vfpoll  # noqa: E402
import vfpoll.torch as vt  # noqa: E402

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")


def model_and_optimizer(device="cpu", dtype=torch.float32):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).to(device, dtype)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, betas=(0.9, 0.95))
    x = torch.randn(32, 64, device=device, dtype=dtype)
    m(x).float().pow(2).mean().backward()
    opt.step()
    return m, opt


def same(a, b):
    """Bit-exact equality of two nested structures of tensors and plain values."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        assert a.dtype == b.dtype and a.shape == b.shape and a.device == b.device, (a.dtype, b.dtype, a.shape, b.shape, a.device, b.device)
        assert torch.equal(a.detach().reshape(-1).view(torch.uint8).cpu(), b.detach().reshape(-1).view(torch.uint8).cpu()) if a.numel() else True
        return
    if isinstance(a, dict):
        assert type(a) is type(b) and list(a) == list(b)
        for k in a:
            same(a[k], b[k])
        return
    if isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            same(x, y)
        return
    assert a == b


def test_state_dict_round_trip_cpu(store):
    m, opt = model_and_optimizer()
    state = {"model": m.state_dict(), "optim": opt.state_dict(), "step": 7, "note": "hello", "lr": 1e-3}
    v = vt.save(state, store, "run")
    back = vt.load(store, "run", version=v)
    same(state, back)
    m2, opt2 = model_and_optimizer()
    m2.load_state_dict(back["model"])
    opt2.load_state_dict(back["optim"])


def test_dtypes_shapes_ties_cpu(store):
    w = torch.randn(10, 10)
    state = {
        "bf16": torch.randn(33, 7).to(torch.bfloat16),
        "f8": torch.randn(100).to(torch.float8_e4m3fn),
        "bool": torch.rand(9) > 0.5,
        "i8": torch.randint(-128, 127, (2, 3, 4), dtype=torch.int8),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.empty(0, 3),
        "strided": torch.arange(100.0).reshape(10, 10).t(),
        "tied_a": w,
        "tied_b": w,
        "grad": torch.ones(3, requires_grad=True),
        "nested": [{"x": torch.arange(5)}, (torch.zeros(2), 3)],
    }
    vt.save(state, store, "t")
    back = vt.load(store, "t")
    for k in ("bf16", "f8", "bool", "i8", "scalar", "empty"):
        same(state[k], back[k])
    assert torch.equal(back["strided"], state["strided"].contiguous())
    assert back["tied_a"] is back["tied_b"]
    assert back["grad"].requires_grad
    same(state["nested"], back["nested"])
    assert len(store.entries("t")) == 12  # 11 tensors (the tied pair stored once) + the skeleton


def test_async_save_torch(store):
    m, opt = model_and_optimizer()
    sd = {k: v.clone() for k, v in m.state_dict().items()}
    h = vt.save_async(m.state_dict(), store, "a")
    h.staged()
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
    h.wait()
    same(sd, dict(vt.load(store, "a")))


class Thing:
    """A class weights_only=True must not load."""


def test_weights_only_refuses_arbitrary_objects(store):
    vt.save({"t": torch.ones(2), "obj": Thing()}, store, "o")
    with pytest.raises(Exception, match="weights_only"):
        vt.load(store, "o")
    assert isinstance(vt.load(store, "o", weights_only=False)["obj"], Thing)


def test_map_location(store):
    vt.save({"t": torch.arange(4)}, store, "m")
    assert vt.load(store, "m", map_location="cpu")["t"].device.type == "cpu"
    assert vt.load(store, "m", map_location=lambda d: "cpu")["t"].device.type == "cpu"


def test_not_a_torch_checkpoint(store):
    store.save("np", {"a": np.arange(3)})
    with pytest.raises(vfpoll.NotFoundError, match="vfpoll.torch.save"):
        vt.load(store, "np")


def test_dcp_save_load_cpu(store):
    m, opt = model_and_optimizer()
    state = {"model": m.state_dict(), "step": torch.tensor(5)}
    dcp.save(state, storage_writer=vt.StoreWriter(store, "dcp"))
    m2, _ = model_and_optimizer()
    with torch.no_grad():
        for p in m2.parameters():
            p.zero_()
    target = {"model": m2.state_dict(), "step": torch.tensor(0)}
    dcp.load(target, storage_reader=vt.StoreReader(store, "dcp"))
    same(state["model"], target["model"])
    assert int(target["step"]) == 5


def test_dcp_async_save_cpu(store):
    m, _ = model_and_optimizer()
    sd = {k: v.clone() for k, v in m.state_dict().items()}
    fut = dcp.async_save({"model": m.state_dict()}, storage_writer=vt.StoreWriter(store, "dcpa"))
    fut = getattr(fut, "upload_completion", fut)
    fut.result()
    target = {"model": {k: torch.zeros_like(v) for k, v in sd.items()}}
    dcp.load(target, storage_reader=vt.StoreReader(store, "dcpa"))
    same(sd, target["model"])
    assert len(store.versions("dcpa")) == 1


def test_dcp_checkpoint_id_names_the_checkpoint(store):
    dcp.save({"x": torch.arange(10)}, checkpoint_id="by-id", storage_writer=vt.StoreWriter(store))
    t = {"x": torch.zeros(10, dtype=torch.int64)}
    dcp.load(t, checkpoint_id="by-id", storage_reader=vt.StoreReader(store))
    assert torch.equal(t["x"], torch.arange(10))


@cuda
def test_cuda_state_dict_round_trip(store):
    m, opt = model_and_optimizer("cuda", torch.bfloat16)
    state = {"model": m.state_dict(), "optim": opt.state_dict(), "step": 3}
    vt.save(state, store, "gpu")
    back = vt.load(store, "gpu")
    same(state, back)
    assert back["model"]["0.weight"].is_cuda
    cpu = vt.load(store, "gpu", map_location="cpu")
    assert torch.equal(cpu["model"]["0.weight"], state["model"]["0.weight"].cpu())


@cuda
def test_cuda_buffers_plain_api(store):
    t = torch.randn(1 << 20, device="cuda")  # 4 MiB
    store.save("g", {"t": t})
    out = torch.empty_like(t)
    store.read("g", "t", out)
    torch.cuda.synchronize()
    assert torch.equal(out, t)
    host = store.load("g")["t"]
    assert np.array_equal(host.view(np.float32), t.cpu().numpy())


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
def test_kv_blocks_of_tensors(store, device):
    pool = store.kv_pool("kvt", block_size=64 << 10, slots=64)
    keys = list(range(1, 33))
    src = torch.randint(0, 256, (32, 64 << 10), dtype=torch.uint8, device=device)
    pool.put_many(keys[:16], src[:16])  # one 2-D tensor: a row per key
    pool.put_many(keys[16:], list(src[16:].unbind(0)))  # or a tensor per key
    out = torch.zeros_like(src)
    assert pool.get_many(keys, out) == [64 << 10] * 32
    assert torch.equal(out, src)
    rows = torch.zeros(2, 64 << 10, dtype=torch.uint8, device=device)
    assert pool.get_many([5, 999], list(rows.unbind(0))) == [64 << 10, None]
    assert torch.equal(rows[0], src[4]) and not rows[1].any()


@cuda
def test_cuda_async_save_and_staged(store):
    t = torch.randn(16 << 20, device="cuda")  # 64 MiB
    want = t.clone()
    h = vt.save_async({"t": t}, store, "ga")
    h.staged()
    t.zero_()
    h.wait()
    assert torch.equal(vt.load(store, "ga")["t"], want)


@cuda
def test_cuda_dcp(store):
    m, _ = model_and_optimizer("cuda")
    sd = {k: v.clone() for k, v in m.state_dict().items()}
    dcp.save({"model": m.state_dict()}, storage_writer=vt.StoreWriter(store, "gd"))
    target = {"model": {k: torch.zeros_like(v) for k, v in sd.items()}}
    dcp.load(target, storage_reader=vt.StoreReader(store, "gd"))
    same(sd, target["model"])
    fut = dcp.async_save({"model": m.state_dict()}, storage_writer=vt.StoreWriter(store, "gd"))
    getattr(fut, "upload_completion", fut).result()
    assert len(store.versions("gd")) == 2


@cuda
def test_cupy_if_installed(store):
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
    a = cupy.arange(1 << 20, dtype=cupy.float32)
    store.save("cp", {"a": a})
    out = cupy.empty_like(a)
    store.read("cp", "a", out)
    assert bool((out == a).all())
