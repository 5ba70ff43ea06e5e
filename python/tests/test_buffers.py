"""The buffer rules, checked through the test hook vfpoll._vfpoll._buffer_info: what memory
vfpoll would use for an object, or why it refuses it."""

import numpy as np
import pytest

from vfpoll import _vfpoll


def test_numpy_and_builtin_buffers():
    a = np.arange(10, dtype=np.int32)
    assert _vfpoll._buffer_info(a) == (a.__array_interface__["data"][0], 40, "host", True)
    assert _vfpoll._buffer_info(b"abc")[1:] == (3, "host", False)
    ba = bytearray(100)
    assert _vfpoll._buffer_info(ba, True)[1:] == (100, "host", True)
    mv = memoryview(ba)[10:20]
    assert _vfpoll._buffer_info(mv, True)[1] == 10


def test_refusals():
    a = np.arange(10, dtype=np.int32)
    with pytest.raises(BufferError, match="C-contiguous"):
        _vfpoll._buffer_info(a[::2])
    with pytest.raises(BufferError, match="writable"):
        _vfpoll._buffer_info(b"x", True)
    ro = a.copy()
    ro.flags.writeable = False
    with pytest.raises(BufferError, match="read-only"):
        _vfpoll._buffer_info(ro, True)
    with pytest.raises(TypeError, match="not a buffer"):
        _vfpoll._buffer_info(5)


def test_torch_cpu_tensors_through_dlpack():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    t = torch.arange(12, dtype=torch.bfloat16)
    assert _vfpoll._buffer_info(t) == (t.data_ptr(), 24, "host", True)
    assert _vfpoll._buffer_info(t.reshape(3, 4)[1:])[:2] == (t.data_ptr() + 8, 16)
    with pytest.raises(BufferError, match="not contiguous"):
        _vfpoll._buffer_info(t.reshape(3, 4).t())
    assert _vfpoll._buffer_info(torch.empty(0))[1] == 0


def test_cuda_tensors():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("CUDA is not available")
    t = torch.arange(1000, dtype=torch.float32, device="cuda")
    assert _vfpoll._buffer_info(t) == (t.data_ptr(), 4000, "cuda:0", True)
    b = t.to(torch.bfloat16)  # no __cuda_array_interface__ for bf16: DLPack
    assert _vfpoll._buffer_info(b) == (b.data_ptr(), 2000, "cuda:0", True)
    with pytest.raises(BufferError, match="not contiguous"):
        _vfpoll._buffer_info(t.reshape(10, 100).t())
