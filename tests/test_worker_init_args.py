"""verl's ``Worker.__init__(self, cuda_visible_devices=None)``: subclasses that pass it port unchanged."""

from __future__ import annotations

import os

import pytest

from dispatchcore import Dispatch, DispatchTypeError, Worker, WorkerError, WorkerGroup, register


class VerlStyle(Worker):
    """Calls the base class the way verl's own workers do."""

    def __init__(self, cuda_visible_devices: str | None = None) -> None:
        super().__init__(cuda_visible_devices)
        self.seen = getattr(self, "_cuda_visible_devices", None)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def report(self) -> tuple[int, str | None]:
        return self.rank, self.seen


class BadDevices(Worker):
    def __init__(self) -> None:
        super().__init__(cuda_visible_devices=0)  # type: ignore[arg-type]


def test_none_is_accepted_and_ignored() -> None:
    with WorkerGroup(VerlStyle, 2, backend="local") as wg:
        assert wg.report() == [(0, None), (1, None)]


def test_a_string_is_kept_and_never_written_into_the_environment() -> None:
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    with WorkerGroup(VerlStyle, 2, backend="local", init_kwargs={"cuda_visible_devices": "0,1"}) as wg:
        assert wg.report() == [(0, "0,1"), (1, "0,1")]
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == before


def test_keyword_call_of_the_base_class() -> None:
    worker = VerlStyle.__new__(VerlStyle)
    Worker.__init__(worker, cuda_visible_devices=None)


def test_a_non_string_names_the_argument_and_the_form() -> None:
    with pytest.raises((DispatchTypeError, WorkerError)) as info:
        WorkerGroup(BadDevices, 1, backend="local")
    assert "cuda_visible_devices" in str(info.value)
    assert "'0,1'" in str(info.value)
