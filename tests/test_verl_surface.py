"""verl's single-controller surface beyond the basics, on the local backend (issue 14).

Mesh declarations copied between workers (``get_dispatch_collect`` /
``set_dispatch_collect``), fused worker classes
(``create_colocated_worker_raw_cls``), TensorDict arguments and results of
the DP dispatch modes, and ``DataProto.from_tensordict`` on nested
non-tensor data.  The Ray side is in ``test_verl_ray.py``; verl's own tests
run against us in ``scripts/verl_parity.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

tensordict = pytest.importorskip("tensordict")
from tensordict import NonTensorStack, TensorDict  # noqa: E402

from dispatchcore import (  # noqa: E402
    BatchSizeError,
    ClassWithInitArgs,
    DataProto,
    DataProtoFuture,
    Dispatch,
    RegistrationError,
    Worker,
    WorkerGroup,
    create_colocated_worker_raw_cls,
    make_nd_compute_dataproto_dispatch_fn,
    register,
)

WORLD = 4


# -- mesh declarations ----------------------------------------------------------------------------
def test_set_dispatch_collect_copies_another_workers_mesh_under_a_new_name() -> None:
    ref, actor, fused = Worker(), Worker(), Worker()
    ref._register_dispatch_collect_info(mesh_name="actor", dp_rank=0, is_collect=True)
    actor._register_dispatch_collect_info(mesh_name="actor", dp_rank=1, is_collect=False)
    fused.set_dispatch_collect(mesh_name="ref", **ref.get_dispatch_collect())
    fused.set_dispatch_collect(mesh_name="actor", **actor.get_dispatch_collect())
    assert (fused._query_dispatch_info("ref"), fused._query_collect_info("ref")) == (0, True)
    assert (fused._query_dispatch_info("actor"), fused.query_collect_info("actor")) == (1, False)
    assert fused.get_dispatch_collect() == {
        "dispatch_dp_rank": {"ref": 0, "actor": 1},
        "collect_dp_rank": {"ref": True, "actor": False},
    }


def test_a_mesh_name_is_declared_once_per_worker() -> None:
    """verl raises here too (AssertionError in set_dispatch_collect); ours is a typed ValueError."""
    source, again, target = Worker(), Worker(), Worker()
    source._register_dispatch_collect_info("actor", 1, False)
    again._register_dispatch_collect_info("actor", 1, False)  # the very same values
    target.set_dispatch_collect("actor", **source.get_dispatch_collect())
    with pytest.raises(RegistrationError, match="'actor' is already declared") as caught:
        target.set_dispatch_collect("actor", **again.get_dispatch_collect())
    assert isinstance(caught.value, ValueError)
    with pytest.raises(RegistrationError, match="already declared"):
        target._register_dispatch_collect_info("actor", 0, True)
    assert target._query_dispatch_info("actor") == 1, "a refused declaration changes nothing"


def test_get_dispatch_collect_hands_out_copies() -> None:
    worker = Worker()
    worker.register_mesh("train", 2, True)
    info = worker.get_dispatch_collect()
    info["dispatch_dp_rank"]["train"] = 7
    assert worker._query_dispatch_info("train") == 2


def test_set_dispatch_collect_refuses_to_guess_among_several_meshes() -> None:
    source, target = Worker(), Worker()
    source.register_mesh("train", 0, True)
    source.register_mesh("infer", 3, False)
    with pytest.raises(RegistrationError, match=r"declares meshes \['infer', 'train'\] and none is named 'ref'"):
        target.set_dispatch_collect("ref", **source.get_dispatch_collect())
    target.set_dispatch_collect("infer", **source.get_dispatch_collect())  # the same-named one is copied
    assert target._query_dispatch_info("infer") == 3
    with pytest.raises(RegistrationError, match="dispatch_dp_rank names meshes"):
        target.set_dispatch_collect("x", dispatch_dp_rank={"a": 0}, collect_dp_rank={"b": True})
    with pytest.raises(RegistrationError, match="dp_rank must be an int >= 0"):
        target.register_mesh("bad", -1, True)
    with pytest.raises(LookupError, match="registered no mesh 'missing'"):
        target._query_dispatch_info("missing")


# -- fused worker classes -----------------------------------------------------------------------
class Actor(Worker):
    def __init__(self) -> None:
        self._register_dispatch_collect_info("actor", dp_rank=self.rank // 2, is_collect=self.rank % 2 == 0)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def add(self, x: float) -> float:
        return x + self.rank

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("actor"))
    def tag(self, data: DataProto) -> DataProto:
        data.batch["rank"] = torch.full((len(data),), self.rank)
        return data

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def peer_value(self) -> int:
        return self.get_fused_worker_by_name("critic").val


class Critic(Worker):
    def __init__(self, val: int) -> None:
        self.val = val

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def sub(self, x: float) -> float:
        return x - self.val


FusedBase = create_colocated_worker_raw_cls({"actor": Actor, "critic": ClassWithInitArgs(Critic, val=10)})


class Hybrid(FusedBase):  # type: ignore[misc, valid-type]
    def __init__(self) -> None:
        super().__init__()
        # The fused worker's own nd mode reuses the actor role's mesh under another name.
        self.set_dispatch_collect("hybrid", **self.actor.get_dispatch_collect())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def foo(self, x: float) -> float:
        return self.critic.sub(self.actor.add(x))

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("hybrid"))
    def tag_all(self, data: DataProto) -> DataProto:
        return self.actor.tag(data)


def test_fused_worker_calls_roles_in_one_call_and_exposes_role_groups() -> None:
    with WorkerGroup(Hybrid, WORLD) as wg:
        roles = wg.spawn(["actor", "critic"])
        x = roles["actor"].add(0.5)
        assert x == [0.5, 1.5, 2.5, 3.5]
        assert roles["critic"].sub(x) == wg.foo(0.5) == [-9.5, -8.5, -7.5, -6.5]
        assert roles["actor"].peer_value() == [10] * WORLD, "roles see each other through fused_worker_dict"
        data = DataProto.from_dict({"x": torch.arange(6)}, auto_padding=True)
        for out in (roles["actor"].tag(data), wg.tag_all(data)):
            assert out.batch["x"].tolist() == list(range(6))
            assert out.batch["rank"].tolist() == [0, 0, 0, 2, 2, 2], "dp rank 1 collected from rank 2"
        assert wg._query_dispatch_info("hybrid") == roles["actor"]._query_dispatch_info("actor") == [0, 0, 1, 1]


def test_fused_class_shape_matches_verls() -> None:
    assert FusedBase.__name__ == "FusedWorker_actor_critic"
    assert FusedBase.raw_cls_dict == {"actor": Actor, "critic": Critic} and FusedBase.is_fused_worker
    worker = Hybrid()
    assert worker.fused_worker_dict["actor"] is worker.actor
    assert worker.critic.fused_worker_dict is worker.fused_worker_dict
    assert worker._fuw_execute("critic_fwmn_sub", 12) == 2
    with pytest.raises(ValueError, match="expected '<role>_fwmn_<method>'"):
        worker._fuw_execute("nobody_fwmn_sub", 1)
    assert Worker().get_fused_worker_by_name("actor") is None


@pytest.mark.parametrize(("roles", "message"), [({}, "non-empty"), ({"rank": Actor}, "would hide Worker.rank")])
def test_fused_class_refuses_bad_roles(roles: dict[str, type], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        create_colocated_worker_raw_cls(roles)


# -- TensorDict through the DP modes ------------------------------------------------------------
def jagged(lengths: list[int], width: int = 3) -> torch.Tensor:
    """Ragged rows of shape (width, n): ragged in their second dimension, like verl's mRoPE position_ids."""
    rows = [torch.arange(n).expand(width, n) + 100 * i for i, n in enumerate(lengths)]
    return torch.nested.as_nested_tensor([r.contiguous() for r in rows], layout=torch.jagged)


def sample_td(rows: int) -> TensorDict:
    td = TensorDict(
        {"x": torch.arange(float(rows)), "pos": jagged([2 + i for i in range(rows)])},
        batch_size=[rows],
    )
    td["words"] = NonTensorStack(*[f"w{i}" for i in range(rows)])
    return td


class TDWorker(Worker):
    def __init__(self) -> None:
        self._register_dispatch_collect_info("dp", dp_rank=self.rank // 2, is_collect=self.rank % 2 == 1)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def shift(self, data: TensorDict) -> TensorDict:
        data["y"] = data["x"] + 10 * self.rank
        return data

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC)
    def count(self, data: TensorDict) -> dict[str, object]:
        widths = [int(row.shape[1]) for row in data["pos"].unbind(0)]
        return {"rank": self.rank, "rows": len(data), "widths": widths, "words": data["words"].tolist()}

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("dp"), blocking=False)
    def nd_later(self, data: TensorDict) -> TensorDict:
        data["who"] = torch.full((len(data),), self.rank)
        return data

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def as_td(self, data: DataProto) -> TensorDict:
        return TensorDict({"x": data.batch["x"].clone()}, batch_size=[len(data)])


@pytest.fixture(scope="module")
def td_group() -> Iterator[WorkerGroup[TDWorker]]:
    with WorkerGroup(TDWorker, WORLD) as wg:
        yield wg


def test_tensordict_is_chunked_in_rank_order_and_joined_back(td_group: WorkerGroup[TDWorker]) -> None:
    data = sample_td(8)
    out = td_group.shift(data)
    assert isinstance(out, TensorDict) and out.batch_size == torch.Size([8])
    assert out["y"].tolist() == [0.0, 1.0, 12.0, 13.0, 24.0, 25.0, 36.0, 37.0]
    assert [r.tolist() for r in out["pos"].unbind(0)] == [r.tolist() for r in data["pos"].unbind(0)]
    assert out["pos"]._ragged_idx == data["pos"]._ragged_idx == 2
    assert out["words"].tolist() == [f"w{i}" for i in range(8)]
    assert "y" not in data.keys(), "the caller's TensorDict is not mutated"


def test_tensordict_chunks_reach_each_rank(td_group: WorkerGroup[TDWorker]) -> None:
    got = td_group.count(data=sample_td(8))
    assert [g["rows"] for g in got] == [2] * WORLD
    assert [g["widths"] for g in got] == [[2, 3], [4, 5], [6, 7], [8, 9]]
    assert [g["words"] for g in got] == [[f"w{2 * r}", f"w{2 * r + 1}"] for r in range(WORLD)]


def test_tensordict_through_the_nd_mode_as_a_future(td_group: WorkerGroup[TDWorker]) -> None:
    future = td_group.nd_later(sample_td(4))
    assert isinstance(future, DataProtoFuture)
    out = future.get()
    assert isinstance(out, TensorDict)
    assert out["who"].tolist() == [1, 1, 3, 3], "each dp rank's rows come back from its collect rank"


def test_tensordict_results_of_a_padded_dataproto_are_trimmed(td_group: WorkerGroup[TDWorker]) -> None:
    data = DataProto.from_dict({"x": torch.arange(6.0)}, auto_padding=True)
    out = td_group.as_td(data)
    assert isinstance(out, TensorDict) and out["x"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_tensordict_lengths_must_divide_and_match(td_group: WorkerGroup[TDWorker]) -> None:
    with pytest.raises(BatchSizeError, match="TensorDict of 6 rows cannot be split into 4 equal chunks"):
        td_group.shift(sample_td(6))
    with pytest.raises(BatchSizeError, match="different lengths"):
        td_group.count(sample_td(8), DataProto.from_dict({"x": torch.arange(4)}))
    with pytest.raises(BatchSizeError, match="needs a batch dimension"):
        td_group.shift(TensorDict({"x": torch.zeros(3)}, batch_size=[]))


# -- DataProto.from_tensordict on nested non-tensor data ------------------------------------------
def test_from_tensordict_reads_nested_non_tensor_rows_built_by_hand() -> None:
    rows = [[{"role": "user", "content": "hi"}], [], [{"role": "tool", "content": [1, 2]}, {"a": None}]]
    td = TensorDict({"ids": torch.arange(3)}, batch_size=[3])
    td["messages"] = NonTensorStack.from_list(rows)
    td["tags"] = NonTensorStack.from_list([["x", "y"], ["z"], []])
    data = DataProto.from_tensordict(td)
    assert data.non_tensor_batch["messages"].dtype == object
    assert list(data.non_tensor_batch["messages"]) == rows
    assert list(data.non_tensor_batch["tags"]) == [["x", "y"], ["z"], []]
    back = DataProto.from_tensordict(data.to_tensordict())
    assert list(back.non_tensor_batch["messages"]) == rows
    assert np.array_equal(back.batch["ids"].numpy(), np.arange(3))


# -- RayClassWithInitArgs options (no Ray needed) ---------------------------------------------------
def test_actor_options_become_backend_options() -> None:
    from executors_ray import RayClassWithInitArgs

    spec = RayClassWithInitArgs(Critic, val=1)
    spec.update_options({"runtime_env": {"env_vars": {"A": "1"}}, "name": "verl-names-it", "max_concurrency": 2})
    spec.set_additional_resource({"resources": {"tag": 1}})
    assert spec.backend_options() == {
        "env": {"A": "1"},  # set in the worker: no per-actor runtime_env
        "ray_actor_options": {"max_concurrency": 2, "resources": {"tag": 1}},
    }
    spec.update_options({"runtime_env": {"env_vars": {"A": "1"}, "pip": ["x"]}})
    assert spec.backend_options()["runtime_env"] == {"env_vars": {"A": "1"}, "pip": ["x"]}
    assert spec.fused_worker_used is False
    with pytest.raises(TypeError, match="update_options takes a dict"):
        spec.update_options(["not", "a", "dict"])  # type: ignore[arg-type]


# -- union helpers (verl's test_union_numpy_dict cases) -----------------------------------------------
def test_union_numpy_dict_ends_on_cycles_and_keeps_verls_wording() -> None:
    from dispatchcore import union_numpy_dict

    def cycle() -> np.ndarray:
        arr = np.array([None], dtype=object)
        arr[0] = arr
        return arr

    union_numpy_dict({"data": cycle()}, {"data": cycle()})  # same structure: equal, no RecursionError
    with pytest.raises(ValueError, match="`data` in tensor_dict1 and tensor_dict2 are not the same object"):
        union_numpy_dict({"data": cycle()}, {"data": np.array([None], dtype=object)})
