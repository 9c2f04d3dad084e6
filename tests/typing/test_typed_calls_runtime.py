"""What the typed calls are at run time: ``wg.call`` proxies, ``@register`` unchanged, awaitable futures."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from dispatchcore import (
    CallFuture,
    DataProto,
    DataProtoFuture,
    Dispatch,
    MethodProxy,
    Worker,
    WorkerError,
    WorkerGroup,
    register,
)
from dispatchcore.testing.conformance import batch
from dispatchcore.testing.workers import EchoWorker

_gate = threading.Event()


class AsyncDriverWorker(Worker):
    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def wait_for_gate(self) -> int:
        _gate.wait(timeout=120)  # far past the test's timeout: only a free event loop releases it
        return self.rank

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def fail_later(self) -> int:
        raise ValueError(f"planted failure on rank {self.rank}")

    @register(Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def double(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"x": data.batch["x"] * 2})


@pytest.fixture(scope="module")
def wg() -> Iterator[WorkerGroup[EchoWorker]]:
    with WorkerGroup(EchoWorker, 2, backend="local") as group:
        yield group


@pytest.fixture(scope="module")
def async_wg() -> Iterator[WorkerGroup[AsyncDriverWorker]]:
    with WorkerGroup(AsyncDriverWorker, 2, backend="local") as group:
        yield group


def test_call_namespace_holds_the_same_proxies(wg: WorkerGroup[EchoWorker]) -> None:
    assert wg.call.echo is wg.echo
    assert isinstance(wg.call.echo, MethodProxy)
    assert wg.call.echo(batch(4)).batch["rank"].tolist() == [0, 0, 1, 1]
    assert wg.call.one_to_all.options(timeout=30)(1) == [(0, (1,), {}), (1, (1,), {})]
    assert "echo" in dir(wg.call) and "not_registered" not in dir(wg.call)
    assert wg[1:].call.info()[0]["rank"] == 1


def test_call_namespace_misuse_errors(wg: WorkerGroup[EchoWorker]) -> None:
    with pytest.raises(AttributeError, match=r"EchoWorker has no @register method 'ecoh'; its registered methods"):
        _ = wg.call.ecoh
    with pytest.raises(AttributeError, match=r"not decorated with @register"):
        _ = wg.call.not_registered


def test_register_still_returns_the_function(wg: WorkerGroup[EchoWorker]) -> None:
    # Typed as a descriptor for checkers only: at run time the class keeps the plain function.
    assert type(EchoWorker.__dict__["echo"]).__name__ == "function"
    assert wg.echo.registration is not None  # the group found the function's Registration
    assert MethodProxy[[int], list[int]] is not None  # subscriptable at run time, as annotations may need


@pytest.mark.timeout(30)
def test_asyncio_driver_awaits_and_gathers(async_wg: WorkerGroup[AsyncDriverWorker]) -> None:
    async def release_soon() -> str:
        await asyncio.sleep(0)
        _gate.set()
        return "released"

    async def driver() -> tuple[Any, ...]:
        data = batch(4)
        # The gated call resolves only after release_soon runs on this very loop: awaiting must not block it.
        return await asyncio.gather(
            async_wg.call.wait_for_gate(), release_soon(), async_wg.call.double(data), async_wg.call.double(data)
        )

    _gate.clear()
    try:
        ranks, released, doubled, again = asyncio.run(driver())
    finally:
        _gate.set()
    assert ranks == [0, 1] and released == "released"
    assert doubled.batch["x"].tolist() == again.batch["x"].tolist() == [0, 2, 4, 6]


@pytest.mark.timeout(30)
def test_await_resolved_future_and_errors(async_wg: WorkerGroup[AsyncDriverWorker]) -> None:
    future = async_wg.call.double(batch(2))
    assert isinstance(future, DataProtoFuture) and isinstance(future, CallFuture)
    first = future.get()

    async def driver() -> None:
        assert await future is first  # already resolved: answered without a thread
        with pytest.raises(WorkerError, match="planted failure") as info:
            await async_wg.call.fail_later()
        assert info.value.method == "fail_later"

    asyncio.run(driver())
