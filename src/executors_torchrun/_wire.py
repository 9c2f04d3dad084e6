"""Lazy rows on the wire: a small pickle stream in the reply header, tensor bytes point to point.

A value is pickled once (:func:`dispatchcore.wire.dumps_portable`, protocol 5); its
CPU tensors become out-of-band buffers that are views of the caller's
memory.  Payloads up to :data:`dispatchcore.wire.INLINE_LIMIT` ride inside
the reply header, larger ones go over gloo into fresh receive buffers.  In
a process where CUDA is initialised, :class:`_DevicePickler` sets CUDA
tensors aside for NCCL (``wire.dumps`` would move them through host memory)
and the receiver hands them back as the stream's persistent objects.
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass, field
from typing import Any

import cloudpickle
import torch

from dispatchcore import DataProto
from dispatchcore.wire import INLINE_LIMIT, PROTOCOL, Serialized, dumps_portable, loads, receive_buffer, reduce_tensor
from dispatchcore.wire import refresh_by_value as _refresh_by_value


@dataclass
class Header:
    """What a receiver needs to post its receives and rebuild the value."""

    data: bytes
    #: Byte length of each CPU buffer, in send order.
    sizes: list[int] = field(default_factory=list)
    #: (shape, dtype) of each CUDA tensor, in send order.
    device_specs: list[tuple[tuple[int, ...], torch.dtype]] = field(default_factory=list)
    #: Small CPU payloads ride inside the header (no point-to-point at all).
    inline: list[bytearray] | None = None

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


def _rebuild_dataproto(
    tensors: dict[str, torch.Tensor] | None, non_tensors: dict[str, Any], meta: dict[str, Any]
) -> DataProto:
    return DataProto(batch=tensors, non_tensor_batch=non_tensors, meta_info=meta)


class _DevicePickler(cloudpickle.CloudPickler):  # type: ignore[misc]
    """``wire.dumps``'s layout, with CUDA tensors set aside as persistent ids (see module doc)."""

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
        if type(obj) is DataProto and obj.batch is not None and any(t.is_cuda for _, t in obj.batch.items()):
            # DataProto's own reduction turns tensors into host bytes; keep
            # them as tensors so the CUDA ones reach persistent_id.
            return _rebuild_dataproto, (dict(obj.batch.items()), obj.non_tensor_batch, obj.meta_info)
        return super().reducer_override(obj)


def _as_bytes_tensor(buf: pickle.PickleBuffer) -> torch.Tensor:
    """A flat uint8 tensor over ``buf``'s memory (a copy only for read-only memory)."""
    raw = buf.raw()
    if raw.readonly:
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    if raw.nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(raw, dtype=torch.uint8)


def pack(value: Any) -> Packed:
    """Pickle ``value`` once; tensors stay views of the caller's memory (or ride inline when small)."""
    device: list[torch.Tensor] = []
    if torch.cuda.is_initialized():
        _refresh_by_value()  # cloudpickle must know which modules go by value before it pickles
        file = io.BytesIO()
        raw: list[pickle.PickleBuffer] = []
        _DevicePickler(file, raw, device).dump(value)
        serialized = Serialized(file.getvalue(), raw)
    else:
        serialized = dumps_portable(value)
    specs = [(tuple(t.shape), t.dtype) for t in device]
    if sum(b.raw().nbytes for b in serialized.buffers) <= INLINE_LIMIT:
        # bytearray: unpickled from the message it is already private, writable memory (no copy on receipt)
        return Packed(
            Header(serialized.data, [], specs, inline=[bytearray(b.raw()) for b in serialized.buffers]), [], device
        )
    buffers = [_as_bytes_tensor(b) for b in serialized.buffers]
    return Packed(Header(serialized.data, [b.numel() for b in buffers], specs), buffers, device)


def unpack(header: Header, buffers: list[torch.Tensor], device: list[torch.Tensor]) -> Any:
    """Rebuild a value over received buffers (they become the value's memory)."""
    if header.inline is not None:  # unpickled from this receiver's own message: private, writable memory
        return loads(Serialized(header.data, list(header.inline), list(device)), copy=False)
    received: list[Any] = [b.numpy() for b in buffers]
    return loads(Serialized(header.data, received, list(device)), copy=False)


def empty_buffers(header: Header) -> list[torch.Tensor]:
    """Fresh receive buffers for ``header``'s CPU payload."""
    return [torch.from_numpy(receive_buffer(size)) for size in header.sizes]


def empty_device_tensors(header: Header) -> list[torch.Tensor]:
    """Receive tensors on this rank's current CUDA device."""
    if not header.device_specs:
        return []
    device = torch.device("cuda", torch.cuda.current_device())
    return [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in header.device_specs]
