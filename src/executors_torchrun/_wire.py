"""Values on the wire: a small pickle stream plus tensors moved by torch.distributed.

A value is pickled once (protocol 5, cloudpickle so classes and lambdas from
the driver script travel by value).  CPU tensors become out-of-band buffers
that are *views* of the caller's memory (a ``chunk()`` view ships only its
rows); they go over a gloo process group with ``send``/``recv`` into
preallocated ``uint8`` tensors, never through the store or pickle.  CUDA
tensors are kept aside (``persistent_id``) and go over an NCCL process group,
arriving on the receiving rank's current device.

The small pickle stream (a :class:`Header`) travels inside the command or
status message through the c10d store.
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass, field
from typing import Any

import cloudpickle
import numpy as np
import torch

from dispatchcore import DataProto
from dispatchcore._serialization import reduce_tensor

PROTOCOL = 5


@dataclass
class Header:
    """What a receiver needs to post its receives and rebuild the value."""

    data: bytes
    #: Byte length of each CPU buffer, in send order.
    sizes: list[int] = field(default_factory=list)
    #: (shape, dtype) of each CUDA tensor, in send order.
    device_specs: list[tuple[tuple[int, ...], torch.dtype]] = field(default_factory=list)
    #: Small CPU payloads ride inside the header (no point-to-point at all).
    inline: list[bytes] | None = None

    @property
    def tags(self) -> int:
        """How many point-to-point messages carry this value's payload."""
        return sum(1 for s in self.sizes if s) + len(self.device_specs)


@dataclass
class Packed:
    """A value ready to send: its header and the tensors that carry its bytes."""

    header: Header
    buffers: list[torch.Tensor]
    device_tensors: list[torch.Tensor]

    @property
    def nbytes(self) -> int:
        return sum(self.header.sizes) + sum(t.numel() * t.element_size() for t in self.device_tensors)


def _rebuild_dataproto(
    tensors: dict[str, torch.Tensor] | None, non_tensors: dict[str, Any], meta: dict[str, Any]
) -> DataProto:
    return DataProto(batch=tensors, non_tensor_batch=non_tensors, meta_info=meta)


def _has_cuda(data: DataProto) -> bool:
    return data.batch is not None and any(t.is_cuda for _, t in data.batch.items())


class _Pickler(cloudpickle.CloudPickler):
    """cloudpickle with tensors reduced to their own bytes and CUDA tensors set aside."""

    def __init__(self, file: io.BytesIO, buffers: list[pickle.PickleBuffer], device: list[torch.Tensor]) -> None:
        super().__init__(file, protocol=PROTOCOL, buffer_callback=buffers.append)
        self._device = device

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) is torch.Tensor and obj.is_cuda:
            self._device.append(obj.detach())
            return len(self._device) - 1
        return None

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is torch.Tensor and obj.layout == torch.strided and not obj.is_quantized:
            return reduce_tensor(obj)
        if type(obj) is DataProto and _has_cuda(obj):
            # DataProto's own state turns tensors into host bytes; keep them
            # as tensors so the CUDA ones reach persistent_id.
            batch = None if obj.batch is None else dict(obj.batch.items())
            return _rebuild_dataproto, (batch, obj.non_tensor_batch, obj.meta_info)
        return super().reducer_override(obj)


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, buffers: list[Any], device: list[torch.Tensor]) -> None:
        super().__init__(file, buffers=buffers)
        self._device = device

    def persistent_load(self, pid: Any) -> Any:
        return self._device[pid]


def _as_bytes_tensor(buf: pickle.PickleBuffer) -> torch.Tensor:
    """A flat uint8 tensor over ``buf``'s memory (a copy only for read-only memory)."""
    raw = buf.raw()
    if raw.readonly:
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    if raw.nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(raw, dtype=torch.uint8)


#: Payloads up to this many bytes travel inside the store message: a gloo
#: send/recv pair costs several thread wake-ups per rank, which dominates
#: small calls on a busy machine (8 KB echo: ~5 ms through gloo).
INLINE_BYTES = 64 * 1024


def pack(value: Any) -> Packed:
    """Pickle ``value`` once; tensors stay views of the caller's memory (or ride inline when small)."""
    file = io.BytesIO()
    raw: list[pickle.PickleBuffer] = []
    device: list[torch.Tensor] = []
    _Pickler(file, raw, device).dump(value)
    if sum(b.raw().nbytes for b in raw) <= INLINE_BYTES:
        specs = [(tuple(t.shape), t.dtype) for t in device]
        return Packed(Header(file.getvalue(), [], specs, inline=[bytes(b.raw()) for b in raw]), [], device)
    buffers = [_as_bytes_tensor(b) for b in raw]
    specs = [(tuple(t.shape), t.dtype) for t in device]
    return Packed(Header(file.getvalue(), [b.numel() for b in buffers], specs), buffers, device)


#: The header of ``None`` (the answer of most calls without data), built once.
NONE = Header(pickle.dumps(None, protocol=PROTOCOL))


def unpack(header: Header, buffers: list[torch.Tensor], device: list[torch.Tensor]) -> Any:
    """Rebuild a value over received buffers (they become the value's memory)."""
    if header.data == NONE.data:
        return None
    if header.inline is not None:
        arrays = [np.frombuffer(bytearray(b), dtype=np.uint8) for b in header.inline]
    else:
        arrays = [b.numpy() for b in buffers]
    return _Unpickler(io.BytesIO(header.data), arrays, device).load()


#: One DataProto tensor of a result: (buffer index, key, dtype, shape).
Slot = tuple[int, str, torch.dtype, tuple[int, ...]]


def batch_layout(value: Any, packed: Packed) -> tuple[Slot, ...] | None:
    """Which of ``packed``'s buffers hold which tensors of a DataProto result.

    The hub uses it to receive those tensors straight into the rows of the
    call's output (one buffer per key) instead of into fresh memory that the
    collect step would copy again.  Only tensors that went out as their own
    memory (contiguous CPU tensors) are listed; anything else is ``None``.
    """
    if not isinstance(value, DataProto) or value.batch is None:
        return None
    where = {(int(b.data_ptr()), b.numel()): i for i, b in enumerate(packed.buffers) if b.numel()}
    slots = []
    for key, t in value.batch.items():
        if t.device.type != "cpu" or t.numel() == 0 or t.dim() == 0 or not t.is_contiguous():
            continue
        index = where.get((int(t.data_ptr()), t.numel() * t.element_size()))
        if index is not None:
            slots.append((index, key, t.dtype, tuple(t.shape)))
    return tuple(slots) or None


def adopt_views(value: Any, views: dict[str, torch.Tensor]) -> None:
    """Swap the tensors unpickled over placed rows for the output buffer's own views.

    They hold the same bytes, but only views of the buffer itself (one
    storage) let the collect step join them without copying.
    """
    if not isinstance(value, DataProto) or value.batch is None:
        return
    for key, view in views.items():
        if key in value.batch.keys():
            t = value.batch[key]
            if t.data_ptr() == view.data_ptr() and t.dtype == view.dtype and t.shape == view.shape:
                value.batch[key] = view


def fresh_bytes(size: int) -> torch.Tensor:
    """A receive buffer allocated by numpy (huge pages: fewer faults than torch's allocator)."""
    return torch.from_numpy(np.empty(size, dtype=np.uint8))


def empty_buffers(header: Header, targets: dict[int, torch.Tensor] | None = None) -> list[torch.Tensor]:
    """Receive buffers for ``header``'s CPU payload: ``targets[i]`` where given, else fresh."""
    if targets:
        return [targets[i] if i in targets else fresh_bytes(size) for i, size in enumerate(header.sizes)]
    return [fresh_bytes(size) for size in header.sizes]


def empty_device_tensors(header: Header) -> list[torch.Tensor]:
    """Receive tensors on this rank's current CUDA device."""
    if not header.device_specs:
        return []
    device = torch.device("cuda", torch.cuda.current_device())
    return [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in header.device_specs]
