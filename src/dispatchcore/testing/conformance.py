"""The conformance suite: the behaviour every executor must show (docs/design.md, "Invariants").

Subclass :class:`ExecutorConformance` in a test module and set ``backend`` (and ``backend_options``);
pytest then runs every case against that executor.  Groups are built once per class where a case
does not break them (process and actor backends take seconds to start).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .. import (
    PADDING_ROWS_KEY,
    BatchSizeError,
    CallCancelledError,
    DataProto,
    DataProtoFuture,
    DispatchError,
    DispatchTimeoutError,
    LazyDataProto,
    MemoryBudgetError,
    WeightSync,
    WorkerDiedError,
    WorkerError,
    WorkerGroup,
    available_backends,
    create_colocated_worker_cls,
    driver_traffic,
)
from ..executor import Executor, lane_secret
from .assertions import assert_dataproto_equal
from .weight_workers import WEIGHT_SET, WeightRollout, WeightTrainer, expected, make_weights
from .workers import ActorRole, CriticRole, EchoWorker, FailingInitWorker


def batch(n: int, *, padding: bool = False, start: int = 0) -> DataProto:
    """``n`` rows: int64 ``x`` = row number, float ``y``, a string column, meta."""
    x = torch.arange(start, start + n, dtype=torch.int64)
    return DataProto.from_dict(
        tensors={"x": x, "y": x.to(torch.float32).unsqueeze(1).repeat(1, 3) / 2},
        non_tensors={"s": np.array([f"row{i}" for i in range(start, start + n)], dtype=object)},
        meta_info={"temperature": 0.7},
        auto_padding=padding,
    )


class ExecutorConformance:
    """Cases every executor passes; set ``backend`` in a subclass."""

    backend: ClassVar[str] = "local"
    backend_options: ClassVar[dict[str, Any]] = {}
    world_size: ClassVar[int] = 4
    #: Whether a rank can die without taking the test process with it.
    ranks_are_processes: ClassVar[bool] = True
    #: Whether the ranks of a call run at the same time (``mock`` runs them one after another).
    ranks_run_together: ClassVar[bool] = True

    # -- fixtures ---------------------------------------------------------------
    # Class-scoped fixtures are classmethods: pytest 9.1+ deprecates them as
    # instance methods (each test gets a new instance), and 8.x accepts both.
    @classmethod
    def make_group(cls, worker_cls: type, world_size: int, **kwargs: Any) -> WorkerGroup[Any]:
        if cls.backend not in available_backends():
            pytest.skip(f"backend {cls.backend!r} is not available here")
        return WorkerGroup(worker_cls, world_size, backend=cls.backend, **{**cls.backend_options, **kwargs})

    def _group_to_kill(self, worker_cls: type, **kwargs: Any) -> WorkerGroup[Any]:
        """Two ranks a case may kill; skipped where ranks share the test process."""
        if not self.ranks_are_processes:
            pytest.skip("ranks share the test process")
        return self.make_group(worker_cls, 2, death_timeout=10, **kwargs)

    @pytest.fixture(scope="class")
    @classmethod
    def group(cls) -> Iterator[WorkerGroup[Any]]:
        with cls.make_group(EchoWorker, cls.world_size, init_kwargs={"tag": "conformance"}) as wg:
            wg.set_mesh(2)
            yield wg

    @pytest.fixture(scope="class")
    @classmethod
    def colocated(cls) -> Iterator[WorkerGroup[Any]]:
        roles = create_colocated_worker_cls({"actor": ActorRole, "critic": CriticRole})
        with cls.make_group(roles, 2, init_kwargs={"actor": {"lr": 0.5}}) as wg:
            yield wg

    # -- binding and rank context -------------------------------------------------
    def test_group_reports_backend_and_size(self, group: WorkerGroup[Any]) -> None:
        assert group.backend == self.backend
        assert group.world_size == self.world_size
        assert "echo" in group.method_names

    def test_the_lane_secret_is_in_no_rank_command_line_or_environment(self, group: WorkerGroup[Any]) -> None:
        """Another user reads argv and (same uid only, but logs and dumps copy it) the environment: never the key."""
        secret = lane_secret().hex()
        for text in group.exposed():
            assert secret not in text

    def test_rank_and_world_size_valid_in_init(self, group: WorkerGroup[Any]) -> None:
        infos = group.info()
        assert [i["rank"] for i in infos] == list(range(self.world_size))
        assert [i["rank_in_init"] for i in infos] == list(range(self.world_size))
        assert {i["world_in_init"] for i in infos} == {self.world_size}
        assert {i["tag"] for i in infos} == {"conformance"}

    def test_undecorated_method_says_to_decorate(self, group: WorkerGroup[Any]) -> None:
        with pytest.raises(AttributeError, match="@register"):
            group.not_registered()

    def test_direct_rollout_method_refused(self, group: WorkerGroup[Any]) -> None:
        with pytest.raises(DispatchError, match="directly"):
            group.generate_direct()

    # -- built-in modes -------------------------------------------------------------
    def test_one_to_all_sends_everything_whole(self, group: WorkerGroup[Any]) -> None:
        out = group.one_to_all([1, 2], k="v")
        assert out == [(r, ([1, 2],), {"k": "v"}) for r in range(self.world_size)]

    def test_all_to_all_splits_world_size_lists(self, group: WorkerGroup[Any]) -> None:
        n = self.world_size
        assert group.all_to_all(list(range(n)), k=[f"k{i}" for i in range(n)]) == [
            (r, (r,), {"k": f"k{r}"}) for r in range(n)
        ]
        assert group.all_to_all([1], 5) == [(r, ([1], 5), {}) for r in range(n)]

    def test_rank_zero_runs_once_and_unwraps(self, group: WorkerGroup[Any]) -> None:
        assert group.rank_zero("x") == (0, ("x",))
        assert group.only_rank_zero() == 0

    def test_dp_compute_scatters_lists_and_tuples(self, group: WorkerGroup[Any]) -> None:
        n = self.world_size
        out = group.dp_compute(list(range(n)), tuple(range(10, 10 + n)), k=[str(i) for i in range(n)])
        assert out == [(r, (r, 10 + r), {"k": str(r)}) for r in range(n)]
        with pytest.raises(BatchSizeError, match="one entry per rank"):
            group.dp_compute([1])

    def test_dp_compute_proto_order_and_content(self, group: WorkerGroup[Any]) -> None:
        n = self.world_size
        data = batch(4 * n)
        out = group.echo(data)
        assert torch.equal(out.batch["x"], data.batch["x"])
        assert torch.equal(out.batch["y"], data.batch["y"])
        assert list(out.non_tensor_batch["s"]) == list(data.non_tensor_batch["s"])
        assert out.batch["rank"].tolist() == [r for r in range(n) for _ in range(4)]
        assert out.meta_info["temperature"] == 0.7
        assert PADDING_ROWS_KEY not in out.meta_info

    def test_dp_compute_proto_several_dataprotos_and_kwargs(self, group: WorkerGroup[Any]) -> None:
        n = self.world_size
        out = group.echo_pair(batch(2 * n), other=batch(2 * n, start=100), scale=3)
        assert out.batch["other"].tolist() == [3 * (100 + i) for i in range(2 * n)]

    def test_padding_keeps_length_and_caller(self, group: WorkerGroup[Any]) -> None:
        n = self.world_size
        data = batch(2 * n + 1, padding=True)
        before = data.batch["x"].clone()
        out = group.echo(data)
        assert len(out) == len(data)
        assert torch.equal(out.batch["x"], before)
        assert torch.equal(data.batch["x"], before) and len(data) == 2 * n + 1

    def test_padding_rows_visible_to_workers(self, group: WorkerGroup[Any]) -> None:
        n = self.world_size
        data = batch(2 * n + 1, padding=True)
        metrics = group.metric(data)
        assert [m["rank"] for m in metrics] == list(range(n))
        assert {m["rows"] for m in metrics} == {3}
        assert sum(m["padding"] for m in metrics) == n - 1

    def test_no_padding_refuses_uneven_batch(self, group: WorkerGroup[Any]) -> None:
        with pytest.raises(BatchSizeError, match="auto_padding"):
            group.echo(batch(self.world_size + 1))

    def test_dp_compute_proto_with_func_ships_lambdas(self, group: WorkerGroup[Any]) -> None:
        offset = 5
        out = group.apply(lambda d: DataProto.from_dict({"x": d.batch["x"] + offset}), batch(2 * self.world_size))
        assert out.batch["x"].tolist() == [i + offset for i in range(2 * self.world_size)]

    def test_dp_compute_metric_returns_per_rank_values(self, group: WorkerGroup[Any]) -> None:
        metrics = group.metric(batch(self.world_size * 2))
        assert metrics == [{"rank": r, "rows": 2, "padding": 0} for r in range(self.world_size)]

    def test_execute_rank_zero_on_a_proto_mode(self, group: WorkerGroup[Any]) -> None:
        out = group.proto_on_rank_zero(batch(2 * self.world_size))
        assert isinstance(out, DataProto) and out.batch["rank"].tolist() == [0, 0]

    def test_execute_all_and_rank_zero_by_name(self, group: WorkerGroup[Any]) -> None:
        assert [r for r, _, _ in group.execute_all("one_to_all", 1)] == list(range(self.world_size))
        assert group.execute_rank_zero("not_registered") == 0

    def test_async_def_methods(self, group: WorkerGroup[Any]) -> None:
        assert group.coroutine("v") == [(r, "v") for r in range(self.world_size)]

    # -- futures ---------------------------------------------------------------------
    def test_non_blocking_returns_future(self, group: WorkerGroup[Any]) -> None:
        future = group.sleep_then_rank(0.05)
        assert hasattr(future, "get")
        assert future.get() == list(range(self.world_size))

    def test_dataproto_future_resolves_trimmed_and_chains(self, group: WorkerGroup[Any]) -> None:
        data = batch(2 * self.world_size + 1, padding=True)
        future = group.echo_later(data)
        assert isinstance(future, DataProtoFuture)
        chained = group.echo(future)
        assert len(chained) == len(data)
        assert torch.equal(chained.batch["x"], data.batch["x"])
        assert len(future.get()) == len(data)

    def test_many_calls_in_flight(self, group: WorkerGroup[Any]) -> None:
        futures = [group.echo_later(batch(self.world_size, start=10 * i)) for i in range(5)]
        for i, future in reversed(list(enumerate(futures))):
            assert future.get().batch["x"].tolist() == list(range(10 * i, 10 * i + self.world_size))

    # -- isolation -------------------------------------------------------------------
    def test_broadcast_inputs_isolated(self, group: WorkerGroup[Any]) -> None:
        tensor = torch.arange(6)
        data = batch(4)
        arr = np.arange(3)
        meta = {"k": 1}
        before = group.mutate_inputs(tensor, data, arr, meta)
        assert before == [15] * self.world_size, "a rank saw another rank's writes"
        assert tensor.tolist() == list(range(6))
        assert data.batch["x"].tolist() == [0, 1, 2, 3]
        assert data.non_tensor_batch["s"][0] == "row0" and "touched" not in data.meta_info
        assert arr.tolist() == [0, 1, 2] and meta == {"k": 1}

    def test_dp_chunks_isolated(self, group: WorkerGroup[Any]) -> None:
        data = batch(2 * self.world_size)
        out = group.mutate_chunk(data)
        assert out.batch["x"].tolist() == list(range(2 * self.world_size))
        assert data.batch["x"].tolist() == list(range(2 * self.world_size))
        assert data.non_tensor_batch["s"][0] == "row0"

    def test_worker_state_isolated_from_later_driver_writes(self, group: WorkerGroup[Any]) -> None:
        tensor = torch.zeros(3)
        group.keep(tensor)
        tensor.add_(7)
        assert [t.tolist() for t in group.kept()] == [[0.0, 0.0, 0.0]] * self.world_size

    # -- lazy results: rows stay on the ranks ----------------------------------------------
    def test_lazy_results_equal_eager_in_every_dataproto_mode(self, group: WorkerGroup[Any]) -> None:
        n = self.world_size
        padded, even, nd = batch(3 * n + 1, padding=True), batch(2 * n), batch(3 * (n // 2))
        double = lambda d: DataProto.from_dict({"x": d.batch["x"] * 2}, {"s": d.non_tensor_batch["s"]})  # noqa: E731
        cases: list[tuple[str, tuple[Any, ...]]] = [
            ("echo", (padded,)),
            ("echo", (even,)),
            ("apply", (double, padded)),
            ("nd_echo", (nd,)),
            ("proto_on_rank_zero", (even,)),
        ]
        for name, args in cases:
            proxy = getattr(group, name)
            eager = proxy(*args)
            before = driver_traffic()
            lazy = proxy.options(lazy=True)(*args)
            # The rows stayed on the ranks: an executor that dropped ``call.instructions`` brings them back.
            assert (driver_traffic() - before).received_bytes == 0, name
            assert isinstance(lazy, LazyDataProto) and isinstance(lazy, DataProto), name
            assert len(lazy) == len(eager) and lazy.meta_info == eager.meta_info, name
            assert sorted(lazy.batch.keys()) == sorted(eager.batch.keys()), name
            assert_dataproto_equal(lazy, eager)
            assert_dataproto_equal(lazy.materialize(), eager)

    def test_lazy_results_feed_groups_of_other_sizes(self, group: WorkerGroup[Any]) -> None:
        n = self.world_size
        data = batch(5 * n + 3, padding=True)
        produced = group.echo.options(lazy=True)(data)
        expected = group.echo(data)
        for consumer in (group, group[0:3], group[1:2]):
            again = consumer.echo(produced)  # row ranges re-chunked for the consumer's world size
            assert torch.equal(again.batch["x"], expected.batch["x"])
            assert again.batch["rank"].tolist() == consumer.echo(expected).batch["rank"].tolist()
            lazy_again = consumer.echo.options(lazy=True)(produced)
            assert_dataproto_equal(lazy_again, again)
        future = group.echo_later.options(lazy=True)(data)  # blocking=False: a future of a lazy result
        assert isinstance(future, DataProtoFuture)
        assert_dataproto_equal(group[0:3].echo(future), group[0:3].echo(expected))
        assert isinstance(future.get(), LazyDataProto)
        # re-chunked for an nd mesh (replicas of a dp rank share a chunk)
        assert_dataproto_equal(group.nd_checksum(data=produced), group.nd_checksum(data=expected))

    def test_lazy_results_under_union_select_concat_and_reorder(self, group: WorkerGroup[Any]) -> None:
        n = self.world_size
        data = batch(4 * n, padding=True)
        lazy, eager = group.echo.options(lazy=True)(data), group.echo(data)
        extra = DataProto.from_dict({"adv": torch.arange(4 * n, dtype=torch.float32)})
        lazy.union(extra)
        eager.union(extra)
        lazy.batch["twice"] = lazy.batch["x"] * 2  # a column read, then a driver-side column
        eager.batch["twice"] = eager.batch["x"] * 2
        order = torch.randperm(4 * n, generator=torch.Generator().manual_seed(0))
        lazy.reorder(order)
        eager.reorder(order)
        columns = (["x", "adv", "twice"], ["s"])
        joined = DataProto.concat([lazy.select(*columns), eager.select(*columns)])
        assert isinstance(joined, LazyDataProto)
        out = group.echo(joined[1:])
        expected = group.echo(DataProto.concat([eager.select(*columns)] * 2)[1:])
        assert_dataproto_equal(out, expected)

    def test_lazy_rows_are_isolated_from_consumers(self, group: WorkerGroup[Any]) -> None:
        data = batch(2 * self.world_size)
        lazy = group.echo.options(lazy=True)(data)
        for consumer in (group, group[1:3]):  # same ranks (rows read in place) and others (rows moved)
            out = consumer.mutate_chunk(lazy)
            assert out.batch["x"].tolist() == list(range(2 * self.world_size))
        assert lazy.materialize().batch["x"].tolist() == list(range(2 * self.world_size))
        assert list(lazy.non_tensor_batch["s"]) == list(data.non_tensor_batch["s"])

    def test_plain_union_lazy_stays_lazy_in_place(self, group: WorkerGroup[Any]) -> None:
        n = self.world_size
        prompts = DataProto.from_dict({"prompt": torch.arange(2 * n)})
        before = driver_traffic()
        gen = group.echo.options(lazy=True)(batch(2 * n))
        joined = prompts.union(gen)  # the verl pattern: batch = batch.union(gen_output)
        assert joined is prompts and isinstance(prompts, LazyDataProto)
        assert (driver_traffic() - before).received_bytes == 0, "nothing fetched by the union"
        assert sorted(prompts.batch.keys()) == ["prompt", "rank", "x", "y"]
        assert_dataproto_equal(group.echo(prompts).select(["prompt", "x"]), prompts.select(["prompt", "x"]))

    def test_lazy_column_read_fetches_that_column_only(self, group: WorkerGroup[Any]) -> None:
        data = batch(8 * self.world_size)
        data.batch["wide"] = torch.zeros(len(data), 256)
        lazy = group.echo.options(lazy=True)(data)
        before = driver_traffic()
        x = lazy.batch["x"]
        moved = driver_traffic() - before
        assert torch.equal(x, data.batch["x"])
        assert moved.received_bytes == x.numel() * x.element_size(), moved
        again = driver_traffic()
        lazy.batch["x"]  # kept on the driver after the first read
        assert (driver_traffic() - again).total == 0

    def test_lazy_results_are_freed_with_their_last_reference(self, group: WorkerGroup[Any]) -> None:
        baseline = group.kept_row_keys()
        lazy = group.echo.options(lazy=True)(batch(2 * self.world_size))
        first_rank_rows = lazy[: len(lazy) // self.world_size]
        held = group.kept_row_keys()
        assert all(h > b for h, b in zip(held, baseline, strict=True))
        del lazy
        kept = group.kept_row_keys()  # the slice refers to rank 0's rows only: the others' are freed
        assert sum(kept) < sum(held)
        assert first_rank_rows.batch["x"].tolist() == list(range(2))
        del first_rank_rows
        group.info()  # frees are sent with the group's next call
        assert group.kept_row_keys() == baseline

    def test_lazy_budget_refuses_instead_of_evicting(self) -> None:
        with self.make_group(EchoWorker, 2, lazy=True, lazy_budget_bytes=4096) as wg:
            small = wg.echo(batch(8))
            with pytest.raises(MemoryBudgetError, match="lazy_budget_bytes"):
                wg.echo(DataProto.from_dict({"x": torch.zeros(64, 16, dtype=torch.int64)}))
            assert_dataproto_equal(wg.echo(batch(8)), small)  # the group stays usable

    def test_lazy_rows_of_a_dead_rank_raise_worker_died(self) -> None:
        with self._group_to_kill(EchoWorker, lazy=True) as wg:
            lazy = wg.echo(batch(4))
            with pytest.raises(WorkerDiedError):
                wg.exit_on(1)
            with pytest.raises(WorkerDiedError) as info:
                lazy.batch["x"]
            assert info.value.rank == 1

    # -- nd mesh -----------------------------------------------------------------------
    def test_nd_replicas_share_chunks_and_collect_in_dp_order(self, group: WorkerGroup[Any]) -> None:
        dp = self.world_size // 2
        data = batch(3 * dp)
        out = group.nd_echo(data)
        assert torch.equal(out.batch["x"], data.batch["x"])
        assert out.batch["rank"].tolist() == [2 * d for d in range(dp) for _ in range(3)]

    def test_nd_with_padding_and_kwargs_only(self, group: WorkerGroup[Any]) -> None:
        dp = self.world_size // 2
        data = batch(3 * dp + 1, padding=True)
        out = group.nd_checksum(data=data)
        assert len(out) == len(data)
        assert torch.equal(out.batch["x"], data.batch["x"])

    # -- colocation ----------------------------------------------------------------------
    def test_colocated_roles_share_ranks(self, colocated: WorkerGroup[Any]) -> None:
        roles = colocated.spawn({"actor", "critic"})
        actor, critic = roles["actor"], roles["critic"]
        a, c = actor.whoami(), critic.whoami()
        assert [x[:2] for x in a] == [("actor", 0), ("actor", 1)]
        assert [x[:2] for x in c] == [("critic", 0), ("critic", 1)]
        assert [x[2:4] for x in a] == [x[2:4] for x in c], "roles of one rank must share its process/thread"
        assert {x[4] for x in a} == {0.5}
        out = actor.act(batch(4))
        assert out.batch["rank"].tolist() == [0, 0, 1, 1]
        assert critic.value(batch(4)) == [1.0, 5.0]

    def test_colocated_role_nd_mesh(self, colocated: WorkerGroup[Any]) -> None:
        actor = colocated.spawn(["actor"])["actor"]
        actor.set_mesh(2)
        out = actor.nd_act(batch(3, padding=True))
        assert out.batch["rank"].tolist() == [0, 0, 0]

    # -- properties ----------------------------------------------------------------------
    # Each executor's subclass runs this method: that is the point, not a flaw.
    @settings(
        deadline=None,
        max_examples=12,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.differing_executors],
    )
    @given(n=st.integers(min_value=1, max_value=37))
    def test_any_length_round_trips(self, group: WorkerGroup[Any], n: int) -> None:
        data = batch(n, padding=True)
        out = group.echo(data)
        assert torch.equal(out.batch["x"], data.batch["x"])
        assert list(out.non_tensor_batch["s"]) == list(data.non_tensor_batch["s"])

    # -- streams and cancel -----------------------------------------------------------------
    def test_stream_gives_each_ranks_rows(self, group: WorkerGroup[Any]) -> None:
        n = self.world_size
        data = batch(2 * n + 1, padding=True)  # the last rank gets one real row and a padding row
        parts = sorted(group.echo.stream(data), key=lambda part: part.ranks)
        assert [part.ranks for part in parts] == [(r,) for r in range(n)]
        assert [r for part in parts for r in part.rows] == list(range(2 * n + 1))
        for part in parts:
            assert part.value.batch["x"].tolist() == list(part.rows)
            assert PADDING_ROWS_KEY not in part.value.meta_info

    @pytest.mark.timeout(60)
    def test_cancel_reaches_every_rank_and_the_group_goes_on(self, group: WorkerGroup[Any]) -> None:
        executor = type(group.executor)
        if executor.cancel_call is Executor.cancel_call or executor.rank_stacks is Executor.rank_stacks:
            pytest.skip(f"backend {self.backend!r} does not implement Executor.cancel_call and rank_stacks")
        group.keep(None)
        future = group.nap_until_cancelled()
        while not all("nap_until_cancelled" in text for text in group.rank_stacks().values()):  # mock: rank 0's
            time.sleep(0.01)  # cancel once every rank runs it (one that had not begun would skip it)
        assert future.cancel()
        with pytest.raises(CallCancelledError):
            future.get()
        # The next call waits for the ranks to leave; ranks run one after another skip a call not yet begun.
        ran = self.world_size if self.ranks_run_together else 1
        assert group.kept() == ["left when cancelled"] * ran + [None] * (self.world_size - ran)
        assert future.cancel() is True  # cancelled already: says so again
        finished = group.sleep_then_rank(0)
        assert finished.get() == list(range(self.world_size))
        assert finished.cancel() is False and finished.get() == list(range(self.world_size))

    # -- failures ------------------------------------------------------------------------
    def test_worker_error_names_rank_method_and_traceback(self, group: WorkerGroup[Any]) -> None:
        with pytest.raises(WorkerError) as info:
            group.fail_on(1)
        err = info.value
        assert err.rank == 1 and err.method == "fail_on"
        assert "planted failure on rank 1" in err.remote_traceback
        assert "ValueError" in str(err) and "planted failure" in str(err)
        assert [i["rank"] for i in group.info()] == list(range(self.world_size)), "group unusable after an error"

    def test_init_failure_reported_with_rank(self) -> None:
        with pytest.raises(WorkerError) as info:
            self.make_group(FailingInitWorker, 2)
        assert info.value.rank == 1 and info.value.method == "__init__"
        assert "planted __init__ failure" in info.value.remote_traceback

    @pytest.mark.timeout(120)  # far below the 600 s call: neither the call nor shutdown waits it out
    def test_call_timeout(self) -> None:
        with self.make_group(EchoWorker, 2, call_timeout=60) as wg:
            with pytest.raises(DispatchTimeoutError, match="sleep"):
                wg.sleep.options(timeout=0.5)(600)
            try:
                assert wg.info()  # recovered
            except DispatchError as exc:  # or declared broken, saying so
                assert "no more calls" in str(exc) or "broken" in str(exc)

    def test_dead_worker_reported(self) -> None:
        with self._group_to_kill(EchoWorker) as wg, pytest.raises(WorkerDiedError) as info:
            wg.exit_on(1)
        assert info.value.rank == 1

    def test_shutdown_is_idempotent_and_final(self) -> None:
        with self.make_group(EchoWorker, 2) as wg:
            assert len(wg.info()) == 2
        wg.shutdown()
        with pytest.raises(DispatchError, match="shut down"):
            wg.info()

    # -- sub-group views (wg[0:2], wg.ranks([...])): only core code, so every backend ---------
    def test_view_calls_only_its_ranks(self, group: WorkerGroup[Any]) -> None:
        view = group[1:3]
        assert (view.world_size, view.rank_ids, view.backend) == (2, (1, 2), self.backend)
        assert [i["rank"] for i in view.info()] == [1, 2]
        assert [r for r, _, _ in group.ranks([3, 0]).one_to_all("x")] == [3, 0]
        assert group[-1].rank_zero("z") == (3, ("z",)), "RANK_ZERO runs on the view's first rank"
        assert group[2:].only_rank_zero() == 2
        assert [r for r, _, _ in group[2:].execute_all("one_to_all", 1)] == [2, 3]
        assert group[2:].execute_rank_zero("not_registered") == 2
        assert [r for r, _ in group[::2].call.coroutine("v")] == [0, 2]

    def test_view_dispatch_uses_the_view_size(self, group: WorkerGroup[Any]) -> None:
        view = group.ranks([1, 3])
        data = batch(6)
        out = view.echo(data)
        assert torch.equal(out.batch["x"], data.batch["x"])
        assert out.batch["rank"].tolist() == [1, 1, 1, 3, 3, 3]
        assert view.dp_compute([10, 30]) == [(1, (10,), {}), (3, (30,), {})]
        assert view.all_to_all(["a", "b"]) == [(1, ("a",), {}), (3, ("b",), {})]
        padded = view.metric(batch(3, padding=True))
        assert padded == [{"rank": 1, "rows": 2, "padding": 0}, {"rank": 3, "rows": 2, "padding": 1}]
        assert view.sleep_then_rank(0.01).get() == [1, 3]

    def test_views_share_the_ranks(self, group: WorkerGroup[Any]) -> None:
        group.ranks([0, 2]).keep("even")
        group.ranks([1, 3]).keep("odd")
        assert group.kept() == ["even", "odd", "even", "odd"]
        whole = {i["rank"]: (i["pid"], i["thread"]) for i in group.info()}
        assert {i["rank"]: (i["pid"], i["thread"]) for i in group[1:].info()} == {r: whole[r] for r in (1, 2, 3)}

    def test_dataproto_futures_cross_views(self, group: WorkerGroup[Any]) -> None:
        data = batch(7, padding=True)
        into_view = group[2:].echo(group.echo_later(data))  # 4 ranks' rows into 2
        assert torch.equal(into_view.batch["x"], data.batch["x"])
        assert into_view.batch["rank"].tolist() == [2, 2, 2, 2, 3, 3, 3]
        from_view = group[1:3].echo_later(data)  # 2 ranks' rows into 4
        back = group.echo(from_view)
        assert torch.equal(back.batch["x"], data.batch["x"])
        assert back.batch["rank"].tolist() == [0, 0, 1, 1, 2, 2, 3]
        assert from_view.get().batch["rank"].tolist() == [1, 1, 1, 1, 2, 2, 2]

    def test_view_errors_name_the_real_rank(self, group: WorkerGroup[Any]) -> None:
        with pytest.raises(WorkerError) as info:
            group.ranks([2, 3]).fail_on(3)
        assert info.value.rank == 3 and info.value.method == "fail_on"
        assert group[0:2].fail_on(3) == [0, 1], "a rank outside the view must not be called"

    def test_nd_mesh_on_a_view(self, group: WorkerGroup[Any]) -> None:
        # The class's mesh pairs ranks (0, 1) and (2, 3); rank 0 and 2 collect.
        out = group[2:].nd_echo(batch(3))
        assert out.batch["rank"].tolist() == [2, 2, 2]
        data = batch(5, padding=True)
        out = group[::2].nd_echo(data)
        assert torch.equal(out.batch["x"], data.batch["x"])
        assert out.batch["rank"].tolist() == [0, 0, 0, 2, 2]

    def test_colocated_role_on_a_view(self, colocated: WorkerGroup[Any]) -> None:
        actor = colocated[1:].spawn(["actor"])["actor"]
        assert [x[:2] for x in actor.whoami()] == [("actor", 1)]
        assert actor.act(batch(2)).batch["rank"].tolist() == [1, 1]

    # -- weight sync (WeightSync): rank to rank where the executor links, else through the driver ------
    @pytest.fixture(scope="class")
    @classmethod
    def weight_groups(cls) -> Iterator[tuple[WorkerGroup[Any], WorkerGroup[Any]]]:
        with cls.make_group(WeightTrainer, 2, death_timeout=10) as src:
            with cls.make_group(WeightRollout, 2, death_timeout=10) as dst:
                yield src, dst

    def test_weight_sync_sharded_to_whole_and_sliced(self, weight_groups: Any) -> None:
        src, dst = weight_groups
        for cut in (None, 0, 1):
            dst.configure(cut=cut)
            before = driver_traffic()
            report = WeightSync(src, dst, bucket_bytes=100)(version=cut)
            crossed = (driver_traffic() - before).total
            assert report.buckets > len(WEIGHT_SET)  # bucket boundaries fall inside tensors
            assert crossed == report.driver_bytes and (crossed > 0) == (report.transport == "driver")
            for rank, (got, version, _) in enumerate(dst.state()):
                assert version == cut
                for name, full in make_weights().items():
                    want = expected(full, cut, rank, 2)
                    assert got[name].dtype == want.dtype and torch.equal(got[name], want), (name, cut)

    def test_weight_sync_empty_set_still_sets_the_version(self, weight_groups: Any) -> None:
        src, dst = weight_groups
        dst.configure()
        report = WeightSync(src, dst, names=())(version="empty")
        assert report.tensors == 0 and report.buckets == 0
        assert [(got, version) for got, version, _ in dst.state()] == [({}, "empty")] * 2

    def test_weight_sync_dying_source_is_named(self, weight_groups: Any) -> None:
        _, dst = weight_groups
        with self._group_to_kill(WeightTrainer) as src:
            pids = src.set_step(0)
            dst.configure(kill=(pids[1], 1))
            with pytest.raises(WorkerDiedError) as info:
                WeightSync(src, dst, bucket_bytes=64)(version="dead")
            assert info.value.rank == 1 and "source group" in str(info.value)
        assert "dead" not in [version for _, version, _ in dst.state()]
        dst.configure()

    def test_weight_sync_dying_destination_is_named(self, weight_groups: Any) -> None:
        src, _ = weight_groups
        with self._group_to_kill(WeightRollout) as dst:
            dst.configure(die_on=2)
            with pytest.raises(WorkerDiedError) as info:
                WeightSync(src, dst, bucket_bytes=64)(version="dead")
            assert info.value.rank == 1 and "destination group" in str(info.value)
        assert len(src.set_step(0)) == 2  # the source group goes on
