"""PyTorch on a vfpoll store: state dicts with :func:`save` / :func:`load`, and a
``torch.distributed.checkpoint`` writer and reader (:class:`StoreWriter`, :class:`StoreReader`).

``save`` takes any nesting of dicts, lists and tuples (a model's ``state_dict()``, an optimizer's
with its ``state`` and ``param_groups``); tensors go to the store straight from their memory, CUDA
tensors included (no ``.cpu()`` copy), and every other value (step counts, hyper-parameters,
strings) is kept in a small pickled skeleton. ``load`` rebuilds the same structure with each
tensor on its device, with its dtype and shape::

    import torch, vfpoll, vfpoll.torch

    store = vfpoll.Store.open("file:/data/ckpt.img")
    vfpoll.torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": 100},
                      store, "run1")
    ck = vfpoll.torch.load(store, "run1")            # tensors back on cuda:0 (their device)
    model.load_state_dict(ck["model"]); opt.load_state_dict(ck["optim"])

With ``torch.distributed.checkpoint``::

    import torch.distributed.checkpoint as dcp
    dcp.save(state_dict, storage_writer=vfpoll.torch.StoreWriter(store, "run1"))
    dcp.load(state_dict, storage_reader=vfpoll.torch.StoreReader(store, "run1"))
    fut = dcp.async_save(state_dict, storage_writer=vfpoll.torch.StoreWriter(store, "run1"))

Streams: before saving, the current CUDA stream of every device that holds a tensor is
synchronised (the store copies on streams of its own); loaded tensors are complete when
``load`` returns.
"""

from __future__ import annotations

import io
import json
import pickle
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch

from . import META_VERSION, CorruptError, NotFoundError, SaveHandle, Store, StoreError, describe

__all__ = ["save", "save_async", "load", "StoreWriter", "StoreReader"]

#: The entry holding the pickled structure of a state dict (tensors replaced by references).
SKELETON = "__skeleton__"


@dataclass(frozen=True)
class _TensorRef:
    """A tensor's place in the skeleton: the entry that holds its bytes."""

    entry: str


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).rsplit(".", 1)[-1]


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise CorruptError(f"unknown torch dtype {name!r} in a checkpoint entry")
    return dt


def _bytes_view(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as a flat uint8 tensor on its device (a view when it is contiguous)."""
    t = t.detach()
    if t.layout != torch.strided:
        raise TypeError(f"cannot save a {t.layout} tensor: only dense (strided) tensors are supported")
    if t.is_quantized:
        raise TypeError("cannot save a quantized tensor; dequantize it first")
    if not t.is_contiguous():
        t = t.contiguous()
    if t.numel() == 0:
        return torch.empty(0, dtype=torch.uint8, device=t.device)
    return t.reshape(-1).view(torch.uint8)


def _tensor_meta(t: torch.Tensor) -> bytes:
    return json.dumps(
        {
            "v": META_VERSION,
            "kind": "torch",
            "dtype": _dtype_name(t.dtype),
            "shape": list(t.shape),
            "device": str(t.device),
            "requires_grad": bool(t.requires_grad),
        },
        separators=(",", ":"),
    ).encode()


def _sync(devices: set) -> None:
    for d in devices:
        if d.type == "cuda":
            torch.cuda.current_stream(d).synchronize()


def _flatten(state: Any) -> Tuple[bytes, List[Tuple[str, Any, bytes]]]:
    """Splits ``state`` into its pickled skeleton and its tensors as (entry, bytes view, meta)."""
    items: List[Tuple[str, Any, bytes]] = []
    devices = set()
    seen: Dict[int, _TensorRef] = {}

    def walk(o: Any) -> Any:
        if isinstance(o, torch.Tensor):
            # The same tensor twice (tied weights) is stored once.
            ref = seen.get(id(o))
            if ref is None:
                ref = _TensorRef(f"t/{len(items)}")
                seen[id(o)] = ref
                items.append((ref.entry, _bytes_view(o), _tensor_meta(o)))
                devices.add(o.device)
            return ref
        if isinstance(o, dict):
            out = type(o)() if type(o) is not dict else {}
            for k, v in o.items():
                out[k] = walk(v)
            if hasattr(o, "_metadata"):  # a module's state dict: its versions, for load_state_dict
                out._metadata = o._metadata
            return out
        if isinstance(o, list):
            return [walk(v) for v in o]
        if isinstance(o, tuple) and not hasattr(o, "_fields"):
            return tuple(walk(v) for v in o)
        return o

    skeleton = walk(state)
    _sync(devices)
    return pickle.dumps(skeleton, protocol=4), items


def save_async(state: Any, store: Store, name: str) -> SaveHandle:
    """Starts saving ``state`` (a state dict, or any nesting of dicts/lists/tuples with tensors)
    as a new version of checkpoint ``name``; returns a handle whose ``staged()`` says when the
    tensors may change again and whose ``wait()`` returns the version id once it is durable.
    Leave the tensors alone until ``staged()`` (the optimizer step may run after it)."""
    skeleton, items = _flatten(state)
    meta = json.dumps({"v": META_VERSION, "kind": "pickle"}).encode()
    items.append((SKELETON, skeleton, meta))
    return store._s.save(name, items)


def save(state: Any, store: Store, name: str) -> int:
    """Saves ``state`` as a new version of checkpoint ``name`` and returns the version id once
    the commit is durable. See :func:`save_async`."""
    return save_async(state, store, name).wait()


_SAFE = {
    ("builtins", "dict"),
    ("builtins", "list"),
    ("builtins", "tuple"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "int"),
    ("builtins", "float"),
    ("builtins", "complex"),
    ("builtins", "str"),
    ("builtins", "bytes"),
    ("builtins", "bool"),
    ("builtins", "slice"),
    ("collections", "OrderedDict"),
    ("vfpoll.torch", "_TensorRef"),
    ("torch", "Size"),
    ("torch", "device"),
}


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _SAFE:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(
            f"the checkpoint's structure refers to {module}.{name}, which weights_only=True does not "
            "load: pass weights_only=False if you trust this store"
        )


def _device_for(saved: str, map_location: Any) -> torch.device:
    if map_location is None:
        dev = torch.device(saved)
    elif callable(map_location):
        dev = torch.device(map_location(saved))
    elif isinstance(map_location, dict):
        dev = torch.device(map_location.get(saved, saved))
    else:
        dev = torch.device(map_location)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            f"the checkpoint has tensors on {saved}, but CUDA is not available here: "
            "pass map_location='cpu'"
        )
    return dev


def load(
    store: Store,
    name: str,
    *,
    version: Optional[int] = None,
    map_location: Union[None, str, torch.device, Dict[str, str], Callable[[str], Any]] = None,
    weights_only: bool = True,
    verify: bool = True,
) -> Any:
    """Loads a version (default: the newest) of checkpoint ``name`` saved by :func:`save`.

    Tensors come back with their dtype and shape on the device they were saved from, or where
    ``map_location`` says (a device, a ``{saved: new}`` dict, or a function of the saved device's
    name). ``weights_only`` (default) unpickles only plain containers and numbers in the
    structure, like ``torch.load``. ``verify`` checks every extent's crc32c.
    """
    s = store._s
    version = s.resolve_version(name, version)
    entries = {e.name: e for e in s.entries(name, version)}
    if SKELETON not in entries:
        raise NotFoundError(
            f"checkpoint {name!r} version {version} was not written by vfpoll.torch.save (it has no {SKELETON!r} entry)"
        )
    raw = bytearray(entries[SKELETON].size)
    reads: List[Tuple[str, Any]] = [(SKELETON, raw)]
    tensors: Dict[str, torch.Tensor] = {}
    devices = set()
    for key, e in entries.items():
        if key == SKELETON:
            continue
        d = describe(e.meta)
        if d.get("kind") != "torch":
            continue
        dev = _device_for(d["device"], map_location)
        t = torch.empty(tuple(d["shape"]), dtype=_dtype(d["dtype"]), device=dev)
        nbytes = t.numel() * t.element_size()
        if nbytes != e.size:
            raise CorruptError(
                f"checkpoint {name!r} version {version} entry {key!r}: {e.size} bytes stored, "
                f"but dtype {d['dtype']} and shape {d['shape']} need {nbytes}"
            )
        if d.get("requires_grad"):
            t.requires_grad_(True)
        tensors[key] = t
        devices.add(dev)
        if nbytes:
            reads.append((key, _bytes_view(t)))
    # The allocator may hand out memory that kernels queued on the current stream still use.
    _sync(devices)
    s.read_many(name, version, reads, verify)
    if weights_only:
        skeleton = _SafeUnpickler(io.BytesIO(bytes(raw))).load()
    else:
        skeleton = pickle.loads(bytes(raw))

    def build(o: Any) -> Any:
        if isinstance(o, _TensorRef):
            if o.entry not in tensors:
                raise CorruptError(f"checkpoint {name!r} version {version}: missing tensor entry {o.entry!r}")
            return tensors[o.entry]
        if isinstance(o, dict):
            out = type(o)() if type(o) is not dict else {}
            for k, v in o.items():
                out[k] = build(v)
            return out
        if isinstance(o, list):
            return [build(v) for v in o]
        if isinstance(o, tuple):
            return tuple(build(v) for v in o)
        return o

    return build(skeleton)


# --- torch.distributed.checkpoint --------------------------------------------------------------
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta  # noqa: E402
from torch.distributed.checkpoint.planner import (  # noqa: E402
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.staging import BlockingAsyncStager  # noqa: E402
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult  # noqa: E402
from torch.futures import Future  # noqa: E402

#: The entry of a DCP checkpoint that holds DCP's pickled ``Metadata``.
DCP_METADATA = ".metadata"


class StoreWriter(StorageWriter, BlockingAsyncStager):
    """A ``torch.distributed.checkpoint`` storage writer that writes one version of checkpoint
    ``name`` of a vfpoll store: ``write_data`` puts every tensor (from its device, CUDA
    included) and byte item as an entry; ``finish`` adds DCP's metadata and commits, so the
    DCP checkpoint appears whole or not at all.

    For ``dcp.async_save`` it is also the stager (like ``FileSystemWriter``): the state dict is
    copied into host memory; with ``cache_staged_state_dict`` (default where CUDA is available)
    that is pinned memory, kept and reused by the next ``async_save`` through the same writer,
    so that training is blocked only for the copy (``False`` gives the memory back after each
    save).

    ``checkpoint_id`` (of ``dcp.save``) overrides ``name``. One process writes a store; in a job
    of several ranks, each rank needs a store of its own.
    """

    def __init__(
        self, store: Store, name: Optional[str] = None, *, cache_staged_state_dict: Optional[bool] = None
    ) -> None:
        StorageWriter.__init__(self)
        if cache_staged_state_dict is None:
            cache_staged_state_dict = torch.cuda.is_available()  # pinned memory needs CUDA
        BlockingAsyncStager.__init__(self, cache_staged_state_dict=cache_staged_state_dict)
        self.store = store
        self.name = name
        self.save_id = uuid.uuid4().hex
        self._writer: Any = None
        self._version: Optional[int] = None

    @property
    def version(self) -> Optional[int]:
        """The version id of the last committed save."""
        return self._version

    def reset(self, checkpoint_id: Any = None) -> None:
        if checkpoint_id:
            self.name = str(checkpoint_id)
        self.save_id = uuid.uuid4().hex
        if self._writer is not None:
            self._writer.abort()
            self._writer = None

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if not self.name:
            raise ValueError("StoreWriter needs a checkpoint name: StoreWriter(store, name) or checkpoint_id=")

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: List[SavePlan]) -> List[SavePlan]:
        import dataclasses

        return [dataclasses.replace(p, storage_data=f"__{i}_") for i, p in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> "Future[List[WriteResult]]":
        prefix = plan.storage_data or "__0_"
        if self._writer is None:
            self._writer = self.store.begin(str(self.name))
        results = []
        tensors = []
        for i, item in enumerate(plan.items):
            entry = f"{prefix}{i}"
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                buf = data.getvalue() if isinstance(data, io.BytesIO) else bytes(data)
                self._writer.put(entry, buf, json.dumps({"v": META_VERSION, "kind": "bytes"}).encode())
                size = len(buf)
            else:
                t = data.detach()
                tensors.append((entry, t))
                size = t.numel() * t.element_size()
            results.append(WriteResult(index=item.index, size_in_bytes=size, storage_data=entry))
        _sync({t.device for _, t in tensors})
        for entry, t in tensors:
            self._writer.put(entry, _bytes_view(t), _tensor_meta(t))
        fut: Future = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: List[List[WriteResult]]) -> None:
        import dataclasses

        storage_md = {}
        for wr_list in results:
            storage_md.update({wr.index: wr.storage_data for wr in wr_list})
        metadata = dataclasses.replace(metadata) if dataclasses.is_dataclass(metadata) else metadata
        metadata.storage_data = storage_md
        metadata.storage_meta = self.storage_meta()
        if self._writer is None:
            self._writer = self.store.begin(str(self.name))
        self._writer.put(DCP_METADATA, pickle.dumps(metadata), json.dumps({"v": META_VERSION, "kind": "pickle"}).encode())
        w, self._writer = self._writer, None
        self._version = w.commit()

    def storage_meta(self) -> Optional[StorageMeta]:
        return StorageMeta(checkpoint_id=self.name, save_id=self.save_id)

    @property
    def checkpoint_id(self) -> Any:
        return self.name

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return False


class StoreReader(StorageReader):
    """A ``torch.distributed.checkpoint`` storage reader for checkpoints written by
    :class:`StoreWriter`: reads a version (default: the newest at ``read_metadata``) of
    checkpoint ``name``. A tensor whose whole saved chunk is wanted is read straight into its
    destination (a CUDA tensor too); a slice of one (resharding) goes through host memory."""

    def __init__(self, store: Store, name: Optional[str] = None, *, version: Optional[int] = None, verify: bool = True) -> None:
        super().__init__()
        self.store = store
        self.name = name
        self.version = version
        self.verify = verify
        self.storage_data: Dict[MetadataIndex, str] = {}
        self._entries: Dict[str, Any] = {}
        self._pinned: Optional[int] = None
        self.load_id = uuid.uuid4().hex

    def reset(self, checkpoint_id: Any = None) -> None:
        self.storage_data = {}
        self._entries = {}
        self._pinned = None
        if checkpoint_id:
            self.name = str(checkpoint_id)
        self.load_id = uuid.uuid4().hex

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if not self.name:
            raise ValueError("StoreReader needs a checkpoint name: StoreReader(store, name) or checkpoint_id=")
        s = self.store._s
        self._pinned = s.resolve_version(self.name, self.version)
        self._entries = {e.name: e for e in s.entries(self.name, self._pinned)}
        if DCP_METADATA not in self._entries:
            raise NotFoundError(
                f"checkpoint {self.name!r} version {self._pinned} was not written by StoreWriter (no {DCP_METADATA!r} entry)"
            )
        raw = bytearray(self._entries[DCP_METADATA].size)
        s.read_many(self.name, self._pinned, [(DCP_METADATA, raw)], self.verify)
        metadata = pickle.loads(bytes(raw))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if metadata.storage_data is None:
            raise CorruptError(f"checkpoint {self.name!r}: DCP metadata without storage data")
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: List[LoadPlan]) -> List[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> "Future[None]":
        s = self.store._s
        direct: List[Tuple[str, Any]] = []
        commits = []
        staged = []
        devices = set()
        for req in plan.items:
            entry = self.storage_data[req.storage_index]
            e = self._entries.get(entry)
            if e is None:
                raise CorruptError(f"checkpoint {self.name!r} version {self._pinned}: no entry {entry!r}")
            if req.type == LoadItemType.BYTE_IO:
                raw = bytearray(e.size)
                s.read_many(self.name, self._pinned, [(entry, raw)], self.verify)
                planner.load_bytes(req, io.BytesIO(bytes(raw)))
                continue
            d = describe(e.meta)
            shape = tuple(d["shape"])
            target = planner.resolve_tensor(req).detach()
            whole = all(o == 0 for o in req.storage_offsets) and tuple(req.lengths) == shape
            if whole and target.is_contiguous() and target.dtype == _dtype(d["dtype"]) and tuple(target.shape) == shape:
                if e.size:
                    direct.append((entry, _bytes_view(target)))
                devices.add(target.device)
                commits.append((req, target))
            else:
                src = torch.empty(shape, dtype=_dtype(d["dtype"]))
                if e.size:
                    s.read_many(self.name, self._pinned, [(entry, _bytes_view(src))], self.verify)
                for dim, (off, ln) in enumerate(zip(req.storage_offsets, req.lengths)):
                    src = src.narrow(dim, off, ln)
                staged.append((req, target, src))
        _sync(devices)
        if direct:
            s.read_many(self.name, self._pinned, direct, self.verify)
        for req, target in commits:
            planner.commit_tensor(req, target)
        for req, target, src in staged:
            if target.size() != src.size():
                raise CorruptError(f"checkpoint {self.name!r}: {req.storage_index} has size {tuple(src.size())}, wanted {tuple(target.size())}")
            target.copy_(src)
            planner.commit_tensor(req, target)
        fut: Future = Future()
        fut.set_result(None)
        return fut

    @property
    def checkpoint_id(self) -> Any:
        return self.name

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return False
