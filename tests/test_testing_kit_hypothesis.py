"""The testing kit with Hypothesis: a module-scoped group fixture for ``@given`` tests, and reducing modes.

``make_module_group`` is module-scoped, so a ``@given`` test using it passes
Hypothesis's ``function_scoped_fixture`` health check (this module's own
``@given`` tests would fail it otherwise); ``check_dispatch_mode(...,
collects=sum)`` holds broadcast-and-reduce modes, docs/dispatch-modes.md's ``SUM``
example included, to their reduction.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import dispatchcore
from dispatchcore import DataProto, Dispatch, DispatchSpec, Worker, WorkerGroup, register, unregister_dispatch_mode
from dispatchcore.testing import Fault, ModePropertyError, assert_mode_properties, check_dispatch_mode, dataprotos

MODES_PAGE = Path(__file__).resolve().parents[1] / "docs" / "dispatch-modes.md"


class Counter(Worker):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    @register(Dispatch.DP_COMPUTE_PROTO)
    def double(self, data: DataProto) -> DataProto:
        self.calls += 1
        return DataProto.from_dict({"x": data.batch["x"] * 2})

    @register(Dispatch.ONE_TO_ALL)
    def count(self) -> int:
        return self.calls


SEEN: list[int] = []
COUNTS: list[int] = []


@settings(max_examples=15)
@given(batch=dataprotos(min_len=1, max_len=12, with_tensors=True, auto_padding=True))
def test_given_tests_share_the_modules_group(make_module_group: Any, batch: DataProto) -> None:
    wg = make_module_group(Counter, 2)
    SEEN.append(id(wg))
    COUNTS.append(wg.count()[0])
    assert len(set(SEEN)) == 1, "each example should reuse the module's group"
    assert COUNTS[-1] == COUNTS[0] + len(COUNTS) - 1  # worker state carries over from example to example
    data = DataProto.from_dict({"x": torch.arange(len(batch))}, auto_padding=True)
    assert torch.equal(wg.double(data).batch["x"], torch.arange(len(batch)) * 2)


@pytest.fixture(scope="module")
def counters(make_module_group: Any) -> Any:
    return make_module_group(Counter, 2)


@given(n=st.integers(0, 9))
def test_given_tests_take_a_group_started_by_a_module_fixture(counters: Any, n: int) -> None:
    data = DataProto.from_dict({"x": torch.arange(n)}, auto_padding=True)
    assert torch.equal(counters.double(data).batch["x"], torch.arange(n) * 2)


def test_the_same_arguments_give_the_same_group(make_module_group: Any, dispatchcore_backend: str) -> None:
    wg = make_module_group(Counter, 2)
    assert make_module_group(Counter, 2) is wg and wg.backend == dispatchcore_backend
    assert id(wg) == SEEN[0] if SEEN else True  # the @given test's group, when it ran first
    assert make_module_group(Counter, 1) is not wg  # other arguments, another group


def test_a_group_shut_down_or_with_faults_is_made_anew(make_module_group: Any) -> None:
    wg = make_module_group(Counter, 1, call_timeout=30)
    wg.shutdown()
    again = make_module_group(Counter, 1, call_timeout=30)
    assert again is not wg and again.count() == [0]
    faults = [Fault.raise_on(rank=0, method="count")]
    assert make_module_group(Counter, 1, faults=faults) is not make_module_group(Counter, 1, faults=faults)


# -- reducing modes ----------------------------------------------------------------------------------


def _broadcast(wg: Any, *args: Any, **kwargs: Any) -> Any:
    n = wg.world_size
    return tuple([a] * n for a in args), {k: [v] * n for k, v in kwargs.items()}


def test_a_broadcast_and_reduce_mode_passes_with_its_reduction() -> None:
    check_dispatch_mode(DispatchSpec(_broadcast, lambda wg, outs: sum(outs), name="TOTAL"), collects=sum)
    check_dispatch_mode(
        DispatchSpec(_broadcast, lambda wg, outs: max(outs), name="LARGEST"),
        collects=max,
        outputs=st.floats(allow_nan=False),
    )


def test_a_reduction_that_drops_a_rank_is_named() -> None:
    mode = DispatchSpec(_broadcast, lambda wg, outs: sum(outs[1:]), name="NOT_RANK_0")
    with pytest.raises(ModePropertyError, match=r"breaks 'round_trip' .* whose sum\(\) is") as info:
        check_dispatch_mode(mode, collects=sum, max_examples=50)
    assert info.value.property == "round_trip"
    with pytest.raises(ModePropertyError, match=r"collect gave 2 for the per-rank outputs \[1, 2\]"):
        assert_mode_properties(mode, DataProto.from_dict({"x": torch.arange(2)}), 2, collects=sum)


def test_tensor_outputs_are_compared_by_value() -> None:
    mode = DispatchSpec(_broadcast, lambda wg, outs: torch.stack(outs).sum(0), name="TENSOR_SUM")
    outputs = [torch.ones(3), torch.full((3,), 2.0)]
    assert_mode_properties(mode, DataProto.from_dict({"x": torch.arange(4)}), 2, collects=sum, outputs=outputs)


def test_collects_is_checked() -> None:
    wrong: Any = "sum"
    batch = DataProto.from_dict({"x": torch.arange(2)})
    with pytest.raises(ValueError, match="'rows', 'per_rank' or a reducing function"):
        assert_mode_properties(Dispatch.DP_COMPUTE_PROTO, batch, 1, collects=wrong)
    with pytest.raises(ValueError, match="one value per rank"):
        assert_mode_properties(
            DispatchSpec(_broadcast, lambda wg, outs: sum(outs)), DataProto.from_dict({}), 2, collects=sum, outputs=[1]
        )


def _docs_block(after: str) -> str:
    """The first python block of docs/dispatch-modes.md after the line starting with ``after``."""
    text = MODES_PAGE.read_text()
    start = text.index(after)
    found = re.search(r"```python\n(.*?)```", text[start:], re.S)
    assert found, f"no python block after {after!r} in docs/dispatch-modes.md"
    return found.group(1)


def test_the_docs_sum_mode_passes_the_check_shown_next_to_it() -> None:
    block = _docs_block("## Your own mode")
    assert "check_dispatch_mode(SUM" in block, "the page shows the SUM mode's check next to it"
    namespace: dict[str, Any] = {name: getattr(dispatchcore, name) for name in dispatchcore.__all__}
    try:
        exec(compile(block, "docs/dispatch-modes.md", "exec"), namespace)  # noqa: S102 - the docs' own snippet
    finally:
        unregister_dispatch_mode("SUM")
    assert issubclass(namespace["W"], Worker)
    assert WorkerGroup is namespace["WorkerGroup"]
