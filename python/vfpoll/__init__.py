"""vfpoll: crash-safe checkpoints and KV-cache block pools on NVMe, from Python.

A thin layer over the Rust store (``vfpoll._vfpoll``): every operation runs in Rust with the GIL
released, and every error of the store is a :class:`StoreError` carrying the store's own message.

A store lives on one or more *namespaces*, named by spec strings:

* ``file:/path/to/file`` - a file (O_DIRECT, io_uring); ``file:/path?size=4G`` creates it with that size at format;
* ``blk:/dev/nvme0n1`` - a Linux block device (O_DIRECT, io_uring);
* ``vfio:0000:01:00.0/1`` - namespace 1 of an NVMe controller bound to vfio-pci (vfpoll's polled driver);
* ``model:SIZE`` - an in-process NVMe model, ``mem:SIZE`` memory (tests; gone when the store closes).

Several specs make one store striped over all of them.

Example::

    import numpy as np, vfpoll

    with vfpoll.Store.format(["file:/tmp/ckpt.img?size=1G"]) as store:
        store.save("run1", {"w": np.arange(10, dtype=np.float32)})
        print(store.load("run1")["w"])

Buffers: numpy arrays, anything with the buffer protocol (bytes, bytearray, memoryview), and GPU
arrays with ``__dlpack__`` or ``__cuda_array_interface__`` (torch, CuPy). CUDA memory is used in the
device's primary context, the one PyTorch and CuPy use. See :mod:`vfpoll.torch` for PyTorch state
dicts and ``torch.distributed.checkpoint``.
"""

from __future__ import annotations

import atexit
import json
import weakref
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _vfpoll
from ._vfpoll import (
    ClosedError,
    CorruptError,
    DeviceError,
    ExistsError,
    InUseError,
    NotFoundError,
    SpecError,
    StoreError,
    StoreFullError,
)

__version__: str = _vfpoll.__version__

__all__ = [
    "Store",
    "KvPool",
    "SaveHandle",
    "VersionInfo",
    "EntryInfo",
    "StoreError",
    "SpecError",
    "NotFoundError",
    "CorruptError",
    "StoreFullError",
    "InUseError",
    "ClosedError",
    "DeviceError",
    "ExistsError",
    "Writer",
    "describe",
]

SaveHandle = _vfpoll.SaveHandle
Writer = _vfpoll.Writer
KvPool = _vfpoll.KvPool
VersionInfo = _vfpoll.VersionInfo
EntryInfo = _vfpoll.EntryInfo

Specs = Union[str, Sequence[str]]

#: The version of the per-entry description this package writes into an entry's metadata.
META_VERSION = 1


def _specs(specs: Specs) -> List[str]:
    if isinstance(specs, str):
        return [specs]
    out = [str(s) for s in specs]
    if not out:
        raise SpecError("no namespace spec given: name at least one, e.g. 'file:/tmp/store.img?size=1G'")
    return out


def _array_meta(a: np.ndarray) -> bytes:
    return json.dumps(
        {"v": META_VERSION, "kind": "numpy", "dtype": a.dtype.str, "shape": list(a.shape)},
        separators=(",", ":"),
    ).encode()


def describe(meta: bytes) -> Dict[str, Any]:
    """Decodes an entry's metadata as this package writes it (``{}`` for any other)."""
    if not meta:
        return {}
    try:
        d = json.loads(meta)
    except (ValueError, UnicodeDecodeError):
        return {}
    return d if isinstance(d, dict) else {}


def _as_array(name: str, value: Any) -> Tuple[Any, bytes]:
    """What to put for one value of a dict being saved: the object whose memory is written, and
    the entry's metadata (dtype and shape, so that :meth:`Store.load` can rebuild it)."""
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise TypeError(f"array {name!r} holds Python objects (dtype {value.dtype}): only plain dtypes can be saved")
        if not value.flags.c_contiguous:
            value = np.ascontiguousarray(value)
        return value, _array_meta(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return value, json.dumps({"v": META_VERSION, "kind": "bytes"}).encode()
    if hasattr(value, "__cuda_array_interface__") or hasattr(value, "__dlpack__"):
        shape = list(getattr(value, "shape", ()))
        dtype = str(getattr(value, "dtype", ""))
        meta = {"v": META_VERSION, "kind": "device", "dtype": dtype, "shape": shape}
        return value, json.dumps(meta, separators=(",", ":")).encode()
    arr = np.asarray(value)
    if arr.dtype.hasobject:
        raise TypeError(f"value {name!r} ({type(value).__name__}) is not an array or buffer")
    arr = np.ascontiguousarray(arr)
    return arr, _array_meta(arr)


class Store:
    """A vfpoll store: named checkpoints (versions of dicts of arrays) and KV block pools.

    Make one with :meth:`format` (new, erases the namespaces) or :meth:`open` (existing). A store
    is used by one process at a time (a second gets :class:`InUseError` naming the first); within
    a process its methods may be called from several threads. Close it with :meth:`close` or a
    ``with`` block.
    """

    __slots__ = ("_s", "__weakref__")

    def __init__(self, inner: "_vfpoll.Store") -> None:
        self._s = inner
        _open_stores.add(self)

    # --- opening -------------------------------------------------------------------------
    @classmethod
    def format(
        cls,
        specs: Specs,
        *,
        chunk_size: Optional[int] = None,
        label: Optional[str] = None,
        force: bool = False,
        size: Optional[int] = None,
        lock_dir: Optional[str] = None,
        allow_buffered_io: bool = False,
        queue_depth: Optional[int] = None,
        io_buffers: Optional[int] = None,
        iommu: str = "auto",
        io_channels: Optional[int] = None,
        copy_threads: Optional[int] = None,
        poll_spin_us: Optional[int] = None,
        kv_eviction: Optional[str] = None,
    ) -> "Store":
        """Creates a new, empty store on ``specs`` and opens it.

        Erases what the namespaces held. ``chunk_size`` is the stripe unit over several
        namespaces and the largest extent (a power of two from 64 KiB to 64 MiB; default 1 MiB).
        Without ``force``, namespaces that already hold a vfpoll store are refused. ``size``
        creates ``file:`` namespaces of that many bytes where the spec gives no ``?size=``.
        ``lock_dir`` is where the lock file that keeps out a second process goes (default
        ``/run/vfpoll``); ``allow_buffered_io`` lets files on file systems without O_DIRECT
        (tmpfs) be used through the page cache; ``queue_depth`` is the io_uring / NVMe queue
        depth per namespace, ``io_buffers`` the chunk-sized I/O buffers in flight per namespace
        (default 32: 32 MiB with 1 MiB chunks) on the first I/O channel, half as many on each
        other one. ``iommu`` is the IOMMU backend of ``vfio:`` namespaces: ``"auto"``
        (iommufd where the kernel offers it, else the type1 container), ``"iommufd"``,
        ``"type1"``, or ``"noiommu"`` (VFIO's unsafe no-IOMMU mode, only when asked for).

        Tuning (``None``: the default): ``io_channels`` is how many threads' submission bursts
        run at once, each on an I/O channel of its own (an io_uring or NVMe queue pair per
        namespace; default the CPUs, at most 4; 1 runs one burst at a time).
        ``copy_threads`` copy and checksum a large batch beside the calling thread (default the
        CPUs less one, 1 to 3; 0 for a KV server with many threads of its own).
        ``poll_spin_us`` is how long a small batch (a KV get) polls for its completion before
        it sleeps in the kernel (default 200; 0 sleeps at once). ``kv_eviction`` is how full
        KV pools evict: ``"lru"`` (the default) or ``"s3fifo"`` (better where blocks are read
        once: RAG, shared templates beside one-off documents; worse for multi-turn chat; see
        docs/store.md).
        """
        return cls(
            _vfpoll.Store.format(
                _specs(specs),
                chunk_size=chunk_size,
                label=label,
                force=force,
                size=size,
                lock_dir=lock_dir,
                allow_buffered_io=allow_buffered_io,
                queue_depth=queue_depth,
                io_buffers=io_buffers,
                iommu=iommu,
                io_channels=io_channels,
                copy_threads=copy_threads,
                poll_spin_us=poll_spin_us,
                kv_eviction=kv_eviction,
            )
        )

    @classmethod
    def open(
        cls,
        specs: Specs,
        *,
        lock_dir: Optional[str] = None,
        allow_buffered_io: bool = False,
        queue_depth: Optional[int] = None,
        io_buffers: Optional[int] = None,
        iommu: str = "auto",
        io_channels: Optional[int] = None,
        copy_threads: Optional[int] = None,
        poll_spin_us: Optional[int] = None,
        kv_eviction: Optional[str] = None,
    ) -> "Store":
        """Opens an existing store (all of its namespaces, in any order); options as in
        :meth:`format`."""
        return cls(
            _vfpoll.Store.open(
                _specs(specs),
                lock_dir=lock_dir,
                allow_buffered_io=allow_buffered_io,
                queue_depth=queue_depth,
                io_buffers=io_buffers,
                iommu=iommu,
                io_channels=io_channels,
                copy_threads=copy_threads,
                poll_spin_us=poll_spin_us,
                kv_eviction=kv_eviction,
            )
        )

    def close(self) -> None:
        """Waits for async saves in flight, then closes. Idempotent."""
        self._s.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._s.closed

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"vfpoll.Store({self._s!r})"

    # --- information ---------------------------------------------------------------------
    def info(self) -> Dict[str, Any]:
        """The store's geometry and usage (members, chunk size, capacity, used and free bytes)."""
        return self._s.info()

    def stats(self) -> Dict[str, Any]:
        """Counters since open: bytes and operations read and written, and per KV pool hits,
        misses and evictions."""
        return self._s.stats()

    def checkpoints(self) -> List[str]:
        """Names of the checkpoints, sorted."""
        return self._s.checkpoints()

    def versions(self, name: str) -> List["VersionInfo"]:
        """The committed versions of checkpoint ``name``, oldest first."""
        return self._s.versions(name)

    def entries(self, name: str, version: Optional[int] = None) -> List["EntryInfo"]:
        """The entries of a version (default: the newest) of checkpoint ``name``."""
        return self._s.entries(name, version)

    # --- checkpoints ---------------------------------------------------------------------
    def save(
        self,
        name: str,
        arrays: Mapping[str, Any],
        *,
        metadata: Optional[Mapping[str, bytes]] = None,
    ) -> int:
        """Saves ``arrays`` as a new version of checkpoint ``name`` and commits it; returns the
        version id once it is durable.

        Values are numpy arrays, buffers, or GPU arrays; each array's dtype and shape are kept so
        that :meth:`load` gives it back as it was. A commit is all or nothing: after a crash the
        store holds this version entirely or not at all. ``metadata`` overrides the metadata
        bytes of the entries it names.
        """
        return self._s.save(name, self._items(arrays, metadata), stage=False).wait()

    def save_async(
        self,
        name: str,
        arrays: Mapping[str, Any],
        *,
        metadata: Optional[Mapping[str, bytes]] = None,
        stage: bool = True,
    ) -> "SaveHandle":
        """Starts saving ``arrays`` as a new version of ``name`` on a background thread and
        returns at once.

        ``handle.staged()`` becomes true when the arrays' memory may be changed again (training
        can go on); ``handle.wait()`` returns the version id once the commit is durable, or
        raises the save's error. Do not modify the arrays before ``staged()``.

        With ``stage`` (default) the arrays are first copied into host memory that vfpoll keeps
        (registered with CUDA for GPU arrays, which its copy engine moves at full speed), so
        ``staged()`` comes after that copy, before any byte is written. Without it, host arrays
        are written straight from their memory and ``staged()`` comes after the last write.
        """
        return self._s.save(name, self._items(arrays, metadata), stage=stage)

    @staticmethod
    def _items(arrays: Mapping[str, Any], metadata: Optional[Mapping[str, bytes]]) -> List[Tuple[str, Any, bytes]]:
        items = []
        for key, value in arrays.items():
            obj, meta = _as_array(str(key), value)
            if metadata is not None and key in metadata:
                meta = bytes(metadata[key])
            items.append((str(key), obj, meta))
        return items

    def begin(self, name: str) -> "_vfpoll.Writer":
        """A new version of ``name`` to fill entry by entry (``put``), then ``commit()`` (or
        ``abort()``). As a context manager it commits on success and aborts on an exception."""
        return self._s.begin(name)

    def load(
        self,
        name: str,
        *,
        version: Optional[int] = None,
        keys: Optional[Iterable[str]] = None,
        verify: bool = True,
    ) -> Dict[str, Any]:
        """Loads a version (default: the newest) of checkpoint ``name`` as a dict of numpy
        arrays (bytes entries as ``bytes``). ``keys`` loads only those entries. ``verify``
        checks every extent's crc32c (on by default)."""
        entries = {e.name: e for e in self._s.entries(name, version)}
        version = self._s.resolve_version(name, version)
        wanted = list(entries) if keys is None else list(keys)
        out: Dict[str, Any] = {}
        reads = []
        for key in wanted:
            if key not in entries:
                raise NotFoundError(f"checkpoint {name!r} version {version} has no entry {key!r}")
            e = entries[key]
            d = describe(e.meta)
            if d.get("kind") == "numpy":
                arr = np.empty(tuple(d["shape"]), dtype=np.dtype(d["dtype"]))
                if arr.nbytes != e.size:
                    raise CorruptError(
                        f"checkpoint {name!r} version {version} entry {key!r}: {e.size} bytes stored, "
                        f"but its dtype {d['dtype']} and shape {d['shape']} need {arr.nbytes}"
                    )
            else:
                arr = np.empty(e.size, dtype=np.uint8)
            reads.append((key, arr))
            out[key] = arr if d.get("kind") != "bytes" else None
        self._s.read_many(name, version, reads, verify)
        for key, arr in reads:
            if out[key] is None:
                out[key] = arr.tobytes()
        return out

    def read(
        self,
        name: str,
        key: str,
        out: Any,
        *,
        version: Optional[int] = None,
        offset: Optional[int] = None,
        verify: bool = True,
    ) -> None:
        """Reads entry ``key`` into ``out``, a writable buffer or GPU array: all of it (``out``
        must be exactly its size), or with ``offset`` ``len(out)`` bytes from that byte."""
        self._s.read(name, key, out, version=version, offset=offset, verify=verify)

    def fsck(self) -> Dict[str, Any]:
        """Checks every structure and every extent's crc32c (reads all data):
        ``{"clean": bool, "findings": [(object, detail), ...]}``."""
        return self._s.fsck()

    def delete(self, name: str, version: Optional[int] = None) -> None:
        """Deletes one version of ``name``, or (without ``version``) the whole checkpoint. A
        version being read is reclaimed only after the read."""
        self._s.delete(name, version)

    def keep_last(self, name: str, n: int) -> List[int]:
        """Deletes all but the newest ``n`` versions of ``name``; returns the deleted ids."""
        return self._s.keep_last(name, n)

    # --- KV pools ------------------------------------------------------------------------
    def kv_pool(self, name: str, *, block_size: Optional[int] = None, slots: Optional[int] = None) -> "KvPool":
        """Opens KV pool ``name``, creating it when ``block_size`` and ``slots`` are given and it
        does not exist. Keys are 128-bit integers (or 16-byte ``bytes``)."""
        return self._s.kv_pool(name, block_size=block_size, slots=slots)

    def kv_pools(self) -> List[str]:
        """Names of the KV pools."""
        return self._s.kv_pools()

    def delete_kv_pool(self, name: str) -> None:
        """Deletes a KV pool and frees its space."""
        self._s.delete_kv_pool(name)


#: Stores not yet closed: at interpreter exit each is closed, which waits for its async saves
#: (a save still running when the process ends would not be committed).
_open_stores: "weakref.WeakSet[Store]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for s in list(_open_stores):
        try:
            s.close()
        except Exception:  # noqa: BLE001 - exiting anyway
            pass
