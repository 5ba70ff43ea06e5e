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

In a job of several ranks, a spec template with ``{rank}`` instead of a store (one store per
rank; see :class:`StoreWriter`)::

    stores = "file:/data/ckpt/rank{rank}.img?size=64G"
    dcp.save(state_dict, storage_writer=vfpoll.torch.StoreWriter(stores, "run1", keep_last=2))
    dcp.load(state_dict, storage_reader=vfpoll.torch.StoreReader(stores, "run1"))

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
import os  # noqa: E402
import re  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta  # noqa: E402
from torch.distributed.checkpoint.planner import (  # noqa: E402
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.staging import BlockingAsyncStager  # noqa: E402
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult  # noqa: E402
from torch.futures import Future  # noqa: E402

from . import InUseError  # noqa: E402

#: The entry of a DCP checkpoint that holds DCP's pickled ``Metadata``.
DCP_METADATA = ".metadata"

#: How long (seconds) to wait for a rank's store that another process of the job has open.
DEFAULT_WAIT_S = 300.0

StoreArg = Union[Store, str, List[str]]


def _dist_rank_world() -> Tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class _RankStores:
    """The stores of a job with one store per rank: ``template`` (a spec, or a list of specs for
    a store over several namespaces) with ``{rank}`` in it. Stores are opened when needed and
    closed when done, so that the ranks of a job (one process each, and a store is open in one
    process at a time) can each reach every rank's store in turn; an open held elsewhere is
    waited for (at most ``wait_s``). ``create`` formats a ``file:`` store whose file does not
    exist yet (``format_options`` for :meth:`Store.format`)."""

    def __init__(
        self,
        template: Union[str, List[str]],
        *,
        create: bool,
        open_options: Optional[Dict[str, Any]],
        format_options: Optional[Dict[str, Any]],
        wait_s: float,
    ) -> None:
        self.template = [template] if isinstance(template, str) else list(template)
        if not self.template or not all(isinstance(t, str) for t in self.template):
            raise TypeError("a store template is a spec string (or a list of them) with {rank} in it")
        self.create = create
        self.open_options = dict(open_options or {})
        self.format_options = dict(format_options or {})
        self.wait_s = wait_s

    def specs(self, rank: int) -> List[str]:
        return [t.replace("{rank}", str(rank)) for t in self.template]

    def per_rank(self) -> bool:
        return any("{rank}" in t for t in self.template)

    def _missing_files(self, specs: List[str]) -> bool:
        paths = []
        for sp in specs:
            if not sp.startswith("file:"):
                return False
            paths.append(sp[len("file:") :].split("?", 1)[0])
        return all(not os.path.exists(p) for p in paths)

    def try_open(self, rank: int) -> Optional[Store]:
        """The store of ``rank`` (shared by this process's users), or ``None`` while another
        process has it open."""
        specs = self.specs(rank)
        key = tuple(specs)
        with _OPEN_LOCK:
            ent = _OPEN.get(key)
            if ent is not None:
                ent[1] += 1
                return ent[0]
            try:
                if self.create and self._missing_files(specs):
                    store = Store.format(specs, **{**self.open_options, **self.format_options})
                else:
                    store = Store.open(specs, **self.open_options)
            except InUseError as e:
                m = re.search(r"in use by PID (\d+)", str(e))
                if m and int(m.group(1)) == os.getpid():
                    raise InUseError(
                        f"{e} -- it is open in this very process through another Store object: close "
                        "that one, or give the StoreWriter/StoreReader that Store instead of a template"
                    ) from None
                return None
            _OPEN[key] = [store, 1]
            return store

    def open(self, rank: int) -> Store:
        """The store of ``rank``, waiting while another process has it open."""
        deadline = time.monotonic() + self.wait_s
        while True:
            s = self.try_open(rank)
            if s is not None:
                return s
            if time.monotonic() > deadline:
                raise InUseError(
                    f"the store of rank {rank} ({', '.join(self.specs(rank))}) stayed in use by another "
                    f"process for {self.wait_s:.0f} s: a process of the job keeps it open (a Store object, "
                    "or a save still running)"
                )
            time.sleep(0.02)

    def release(self, store: Store) -> None:
        """Gives back a store from :meth:`open`; the last user of it in this process closes it."""
        with _OPEN_LOCK:
            for key, ent in list(_OPEN.items()):
                if ent[0] is store:
                    ent[1] -= 1
                    if ent[1] == 0:
                        del _OPEN[key]
                        store.close()
                    return


#: The stores open through templates in this process: specs -> [Store, users].
_OPEN: Dict[Tuple[str, ...], List[Any]] = {}
_OPEN_LOCK = threading.Lock()


def _stores_of(
    store: StoreArg,
    create: bool,
    open_options: Optional[Dict[str, Any]],
    format_options: Optional[Dict[str, Any]],
    wait_s: float,
) -> Tuple[Optional[Store], Optional[_RankStores]]:
    if isinstance(store, Store):
        return store, None
    if isinstance(store, (str, list, tuple)):
        return None, _RankStores(
            list(store) if isinstance(store, tuple) else store,
            create=create,
            open_options=open_options,
            format_options=format_options,
            wait_s=wait_s,
        )
    raise TypeError(f"store must be a vfpoll.Store or a spec template with {{rank}}, not {type(store).__name__}")


def _meta(kind: str) -> bytes:
    return json.dumps({"v": META_VERSION, "kind": kind}).encode()


class StoreWriter(StorageWriter, BlockingAsyncStager):
    """A ``torch.distributed.checkpoint`` storage writer that writes one version of checkpoint
    ``name``: ``write_data`` puts every tensor (from its device, CUDA included) and byte item as
    an entry; ``finish`` adds DCP's metadata and commits, so that the DCP checkpoint appears
    whole or not at all.

    ``store`` is either

    * a :class:`vfpoll.Store`: one process (world size 1) writes it; or
    * a spec template with ``{rank}``, e.g. ``"file:/data/ckpt/rank{rank}.img?size=64G"`` (or a
      list of such specs): one store per rank of a job, opened by the rank when it writes and
      closed after. Each rank commits its items as a version of ``name`` in its own store;
      the coordinator (rank 0) commits its own items together with DCP's metadata, which names
      the version of every other rank's items, so that the checkpoint exists once, and only
      once, that last commit is durable: versions of other ranks that no committed metadata
      names (a save that failed on its way) are never read, and ``keep_last`` deletes them.
      ``create`` (default on) formats a ``file:`` store whose file does not exist yet, with
      ``format_options`` (e.g. ``{"chunk_size": 4 << 20}``); ``open_options`` go to
      :meth:`Store.open`.

    ``keep_last=N`` (template mode) keeps the newest N checkpoints of ``name`` after each
    save and deletes the rest in every rank's store (the coordinator right after its commit,
    the others at the next save, when the coordinator tells them which versions are still
    named).

    For ``dcp.async_save`` it is also the stager (like ``FileSystemWriter``): the state dict is
    copied into host memory; with ``cache_staged_state_dict`` (default where CUDA is available)
    that is pinned memory, kept and reused by the next ``async_save`` through the same writer,
    so that training is blocked only for the copy (``False`` gives the memory back after each
    save). ``checkpoint_id`` (of ``dcp.save``) overrides ``name``.
    """

    def __init__(
        self,
        store: StoreArg,
        name: Optional[str] = None,
        *,
        cache_staged_state_dict: Optional[bool] = None,
        keep_last: Optional[int] = None,
        create: bool = True,
        open_options: Optional[Dict[str, Any]] = None,
        format_options: Optional[Dict[str, Any]] = None,
        wait_s: float = DEFAULT_WAIT_S,
    ) -> None:
        StorageWriter.__init__(self)
        if cache_staged_state_dict is None:
            cache_staged_state_dict = torch.cuda.is_available()  # pinned memory needs CUDA
        BlockingAsyncStager.__init__(self, cache_staged_state_dict=cache_staged_state_dict)
        if keep_last is not None and keep_last < 1:
            raise ValueError(f"keep_last={keep_last}: keep at least the checkpoint just written (1)")
        self.store, self._stores = _stores_of(store, create, open_options, format_options, wait_s)
        self.name = name
        self.keep_last = keep_last
        self.save_id = uuid.uuid4().hex
        self._writer: Any = None
        self._open: Optional[Store] = None
        self._version: Optional[int] = None
        self._rank = 0
        self._coordinator = True

    @property
    def version(self) -> Optional[int]:
        """The version id of the last committed save (of this rank's store)."""
        return self._version

    def _abort(self) -> None:
        if self._writer is not None:
            self._writer.abort()
            self._writer = None
        self._release()

    def _release(self) -> None:
        if self._open is not None and self._stores is not None:
            self._stores.release(self._open)
        self._open = None

    def _my_store(self) -> Store:
        if self._stores is None:
            return self.store
        if self._open is None:
            self._open = self._stores.open(self._rank)
        return self._open

    def reset(self, checkpoint_id: Any = None) -> None:
        if checkpoint_id:
            self.name = str(checkpoint_id)
        self.save_id = uuid.uuid4().hex
        self._abort()

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if not self.name:
            raise ValueError("StoreWriter needs a checkpoint name: StoreWriter(store, name) or checkpoint_id=")
        rank, world = _dist_rank_world()
        if kwargs.get("rank") is not None:
            rank = int(kwargs["rank"])
        self._rank, self._coordinator = rank, bool(is_coordinator)
        if self._stores is None and world > 1 and kwargs.get("use_collectives", True):
            raise ValueError(
                f"StoreWriter(store) in a job of {world} ranks: a store is open in one process at a time; "
                "give a spec template with {rank} instead (e.g. 'file:/data/ckpt/rank{rank}.img?size=64G'), "
                "one store per rank"
            )
        if self._stores is not None and world > 1 and not self._stores.per_rank():
            raise ValueError(f"the store template {self._stores.template} has no {{rank}}: {world} ranks would share one store")

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: List[SavePlan]) -> List[SavePlan]:
        import dataclasses

        keep: Dict[int, List[int]] = {}
        if self._stores is not None and self.keep_last is not None:
            keep = self._named_versions()
        return [
            dataclasses.replace(p, storage_data={"prefix": f"__{i}_", "keep": keep.get(i)})
            for i, p in enumerate(plans)
        ]

    def _named_versions(self) -> Dict[int, List[int]]:
        """Per rank, the versions of ``name`` that the coordinator's committed checkpoints name."""
        named: Dict[int, List[int]] = {}
        store = self._my_store()
        s = store._s
        try:
            versions = [v.id for v in store.versions(str(self.name))]
        except NotFoundError:
            return named
        for v in versions:
            entries = {e.name: e for e in s.entries(str(self.name), v)}
            if DCP_METADATA not in entries:
                continue
            raw = bytearray(entries[DCP_METADATA].size)
            s.read_many(str(self.name), v, [(DCP_METADATA, raw)], True)
            md = pickle.loads(bytes(raw))
            for loc in (md.storage_data or {}).values():
                if isinstance(loc, tuple) and loc[1] is not None:
                    named.setdefault(int(loc[0]), []).append(int(loc[1]))
        return named

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> "Future[List[WriteResult]]":
        sd = plan.storage_data
        prefix = sd.get("prefix", "__0_") if isinstance(sd, dict) else (sd or "__0_")
        store = self._my_store()
        if self._stores is not None and not self._coordinator and isinstance(sd, dict) and sd.get("keep") is not None:
            self._collect(store, set(sd["keep"]))
        if self._writer is None:
            self._writer = store.begin(str(self.name))
        entries: List[Tuple[Any, str, int]] = []
        tensors = []
        try:
            for i, item in enumerate(plan.items):
                entry = f"{prefix}{i}"
                data = planner.resolve_data(item)
                if item.type == WriteItemType.BYTE_IO:
                    buf = data.getvalue() if isinstance(data, io.BytesIO) else bytes(data)
                    self._writer.put(entry, buf, _meta("bytes"))
                    size = len(buf)
                else:
                    t = data.detach()
                    tensors.append((entry, t))
                    size = t.numel() * t.element_size()
                entries.append((item.index, entry, size))
            _sync({t.device for _, t in tensors})
            for entry, t in tensors:
                self._writer.put(entry, _bytes_view(t), _tensor_meta(t))
            version = None
            if self._stores is not None and not self._coordinator:
                # This rank's items are durable before the coordinator's commit names them.
                w, self._writer = self._writer, None
                version = w.commit()
                self._version = version
                self._release()
        except BaseException:
            self._abort()
            raise
        if self._stores is None:
            results = [WriteResult(index=ix, size_in_bytes=n, storage_data=e) for ix, e, n in entries]
        else:
            results = [WriteResult(index=ix, size_in_bytes=n, storage_data=(self._rank, version, e)) for ix, e, n in entries]
        fut: Future = Future()
        fut.set_result(results)
        return fut

    def _collect(self, store: Store, keep: set) -> None:
        """Deletes this rank's versions of ``name`` that no kept checkpoint names."""
        try:
            versions = [v.id for v in store.versions(str(self.name))]
        except NotFoundError:
            return
        for v in versions:
            if v not in keep:
                store.delete(str(self.name), v)

    def finish(self, metadata: Metadata, results: List[List[WriteResult]]) -> None:
        import dataclasses

        try:
            storage_md = {}
            for wr_list in results:
                storage_md.update({wr.index: wr.storage_data for wr in wr_list})
            metadata = dataclasses.replace(metadata) if dataclasses.is_dataclass(metadata) else metadata
            metadata.storage_data = storage_md
            metadata.storage_meta = self.storage_meta()
            store = self._my_store()
            if self._writer is None:
                self._writer = store.begin(str(self.name))
            self._writer.put(DCP_METADATA, pickle.dumps(metadata), _meta("pickle"))
            w, self._writer = self._writer, None
            self._version = w.commit()
            if self.keep_last is not None:
                store.keep_last(str(self.name), self.keep_last)
        finally:
            self._abort()

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
    checkpoint ``name``. ``store`` is what the writer was given: a :class:`vfpoll.Store`, or the
    same spec template with ``{rank}`` (then each rank opens the stores that hold what it loads,
    one at a time, its own first, waiting while another rank has one open; the number of ranks
    may differ from the save's, as far as DCP allows: resharding of DTensors, or a
    single process loading a whole checkpoint). A tensor whose whole saved chunk is wanted is
    read straight into its destination (a CUDA tensor too); a slice of one (resharding) goes
    through host memory."""

    def __init__(
        self,
        store: StoreArg,
        name: Optional[str] = None,
        *,
        version: Optional[int] = None,
        verify: bool = True,
        open_options: Optional[Dict[str, Any]] = None,
        wait_s: float = DEFAULT_WAIT_S,
    ) -> None:
        super().__init__()
        self.store, self._stores = _stores_of(store, False, open_options, None, wait_s)
        self.name = name
        self.version = version
        self.verify = verify
        self.storage_data: Dict[MetadataIndex, Any] = {}
        self._entries: Dict[str, Any] = {}
        self._pinned: Optional[int] = None
        self._rank = 0
        self.load_id = uuid.uuid4().hex

    def reset(self, checkpoint_id: Any = None) -> None:
        self.storage_data = {}
        self._entries = {}
        self._pinned = None
        if checkpoint_id:
            self.name = str(checkpoint_id)
        self.load_id = uuid.uuid4().hex

    def _with_store(self, rank: Optional[int], fn: Callable[[Store], Any]) -> Any:
        if self._stores is None:
            return fn(self.store)
        s = self._stores.open(rank or 0)
        try:
            return fn(s)
        finally:
            self._stores.release(s)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if not self.name:
            raise ValueError("StoreReader needs a checkpoint name: StoreReader(store, name) or checkpoint_id=")

        def read(store: Store) -> Any:
            s = store._s
            self._pinned = s.resolve_version(self.name, self.version)
            self._entries = {e.name: e for e in s.entries(self.name, self._pinned)}
            if DCP_METADATA not in self._entries:
                raise NotFoundError(
                    f"checkpoint {self.name!r} version {self._pinned} was not written by StoreWriter (no {DCP_METADATA!r} entry)"
                )
            raw = bytearray(self._entries[DCP_METADATA].size)
            s.read_many(self.name, self._pinned, [(DCP_METADATA, raw)], self.verify)
            return pickle.loads(bytes(raw))

        metadata = self._with_store(0, read)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if metadata.storage_data is None:
            raise CorruptError(f"checkpoint {self.name!r}: DCP metadata without storage data")
        self.storage_data = metadata.storage_data
        rank, _ = _dist_rank_world()
        if kwargs.get("rank") is not None:
            rank = int(kwargs["rank"])
        self._rank = rank

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: List[LoadPlan]) -> List[LoadPlan]:
        return plans

    def _where(self, req: ReadItem) -> Tuple[int, int, str]:
        loc = self.storage_data[req.storage_index]
        if isinstance(loc, tuple):
            rank, version, entry = loc
            return int(rank), (self._pinned if version is None else int(version)), entry
        # A checkpoint of one process (a Store, not a template): everything in one version.
        return 0, self._pinned, loc

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> "Future[None]":
        groups: Dict[Tuple[int, int], List[Tuple[ReadItem, str]]] = {}
        for req in plan.items:
            rank, version, entry = self._where(req)
            groups.setdefault((rank, version), []).append((req, entry))
        if self._stores is None:
            for (_, version), reqs in groups.items():
                self._read_group(self.store, version, reqs, planner)
        else:
            # Own store first, then the others in turn from the next rank on (so that ranks
            # mostly want different stores at once); a store another rank has open is skipped
            # for now and tried again after the rest.
            todo = sorted(groups, key=lambda k: ((k[0] - self._rank) % (1 << 30), k[1]))
            deadline = time.monotonic() + self._stores.wait_s
            while todo:
                progressed = False
                for key in list(todo):
                    s = self._stores.try_open(key[0])
                    if s is None:
                        continue
                    try:
                        self._read_group(s, key[1], groups[key], planner)
                    finally:
                        self._stores.release(s)
                    todo.remove(key)
                    progressed = True
                if todo and not progressed:
                    if time.monotonic() > deadline:
                        self._stores.open(todo[0][0])  # raises its InUseError
                    time.sleep(0.02)
        fut: Future = Future()
        fut.set_result(None)
        return fut

    def _read_group(self, store: Store, version: int, reqs: List[Tuple[ReadItem, str]], planner: LoadPlanner) -> None:
        s = store._s
        if self._stores is None or version == self._pinned and store is self.store:
            entries = self._entries
        else:
            entries = {e.name: e for e in s.entries(self.name, version)}
        # One read_many for everything (its entries are read on several threads at once):
        # tensors straight into their destination, byte items and slices (resharding) into
        # host memory first.
        reads: List[Tuple[str, Any]] = []
        raws = []
        commits = []
        staged = []
        devices = set()
        whole_src: Dict[str, torch.Tensor] = {}
        for req, entry in reqs:
            e = entries.get(entry)
            if e is None:
                raise CorruptError(f"checkpoint {self.name!r} version {version}: no entry {entry!r}")
            if req.type == LoadItemType.BYTE_IO:
                raw = bytearray(e.size)
                reads.append((entry, raw))
                raws.append((req, raw))
                continue
            d = describe(e.meta)
            shape = tuple(d["shape"])
            target = planner.resolve_tensor(req).detach()
            whole = all(o == 0 for o in req.storage_offsets) and tuple(req.lengths) == shape
            if whole and target.is_contiguous() and target.dtype == _dtype(d["dtype"]) and tuple(target.shape) == shape:
                if e.size:
                    reads.append((entry, _bytes_view(target)))
                devices.add(target.device)
                commits.append((req, target))
            else:
                src = whole_src.get(entry)
                if src is None:
                    src = torch.empty(shape, dtype=_dtype(d["dtype"]))
                    whole_src[entry] = src
                    if e.size:
                        reads.append((entry, _bytes_view(src)))
                for dim, (off, ln) in enumerate(zip(req.storage_offsets, req.lengths)):
                    src = src.narrow(dim, off, ln)
                staged.append((req, target, src))
        _sync(devices)
        if reads:
            s.read_many(self.name, version, reads, self.verify)
        for req, raw in raws:
            planner.load_bytes(req, io.BytesIO(bytes(raw)))
        for req, target in commits:
            planner.commit_tensor(req, target)
        for req, target, src in staged:
            if target.size() != src.size():
                raise CorruptError(f"checkpoint {self.name!r}: {req.storage_index} has size {tuple(src.size())}, wanted {tuple(target.size())}")
            target.copy_(src)
            planner.commit_tensor(req, target)

    @property
    def checkpoint_id(self) -> Any:
        return self.name

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return False
