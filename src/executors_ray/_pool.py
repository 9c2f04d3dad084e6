"""Resource pools: placement groups (one per node) that one or more groups' ranks land on.

Rank ``r`` gets the ``r``-th bundle, nodes ordered by IP, then :data:`NODE_ORDER_LABEL`, so rank
order is stable across restarts; verl's names and defaults (docs/porting-from-verl.md).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dispatchcore import DispatchError, DispatchTimeoutError, DispatchValueError

from ._runtime import ip_sort_key

#: Node label that orders nodes sharing an IP (``ray start --labels='{"dispatchcore-node-order": "1"}'``).
NODE_ORDER_LABEL = "dispatchcore-node-order"


class PlacementError(DispatchError, RuntimeError):
    """Ray could not place a group's actors or a pool's bundles (none fit the cluster, or none in time)."""


class PlacementTimeoutError(PlacementError, DispatchTimeoutError):
    """Placement did not finish within ``start_timeout``: a start-up timeout like any other backend's."""


@dataclass(frozen=True)
class Slot:
    """Where one rank goes: a bundle of a placement group."""

    placement_group: Any
    bundle_index: int


class RayResourcePool:
    """Placement groups for ``sum(process_on_nodes)`` ranks (verl's name, arguments and defaults)."""

    #: verl's ``ResourcePool`` attribute (GPUs per node it assumes; informational here).
    n_gpus_per_node: int = 8

    def __init__(
        self,
        process_on_nodes: Sequence[int] | None = None,
        use_gpu: bool = True,
        name_prefix: str | None = None,
        max_colocate_count: int = 10,
        detached: bool = False,
        accelerator_type: str | None = None,
        *,
        cpus_per_process: float = 1.0,
    ) -> None:
        nodes = [int(n) for n in (process_on_nodes if process_on_nodes is not None else [1])]
        if not nodes or any(n < 1 for n in nodes):
            raise DispatchValueError(f"process_on_nodes must list >= 1 process per node, got {process_on_nodes!r}")
        if int(max_colocate_count) < 1:
            raise DispatchValueError(f"max_colocate_count must be >= 1, got {max_colocate_count!r}")
        if cpus_per_process <= 0 and not use_gpu:
            raise DispatchValueError("a CPU-only pool needs cpus_per_process > 0 (Ray refuses empty bundles)")
        self.store = nodes
        self.use_gpu = bool(use_gpu)
        self.max_colocate_count = int(max_colocate_count)
        self.name_prefix = name_prefix
        self.detached = bool(detached)
        self.cpus_per_process = float(cpus_per_process)
        self.accelerator_type = accelerator_type
        #: Placement strategy of each node's placement group (``RayWorkerGroup(bin_pack=False)``: ``"PACK"``).
        self.strategy = "STRICT_PACK"
        self._root: RayResourcePool = self
        self._offset = 0
        self._size = sum(nodes)
        self._slots: list[Slot] | None = None
        self._created: list[Any] = []
        #: Placement groups given from outside (``SubRayResourcePool``, ``pool.pgs = [...]``): used, never removed.
        self._adopted: list[Any] | None = None
        self._users = 0
        self._lock = threading.RLock()

    # -- shape -----------------------------------------------------------------
    @property
    def world_size(self) -> int:
        """Number of ranks (bundles) this pool offers."""
        return self._size

    def __call__(self) -> list[int]:
        """Processes per node (verl's ``pool()``)."""
        return list(self.store)

    process_on_nodes = property(__call__)

    def add_node(self, process_count: int) -> None:
        """One more node of ``process_count`` ranks (verl's method; before the pool is placed)."""
        if self._root is not self or self._slots is not None:
            raise DispatchValueError("add_node works on an unplaced, unsplit pool; make a new RayResourcePool instead")
        if int(process_count) < 1:
            raise DispatchValueError(f"process_count must be >= 1, got {process_count!r}")
        self.store.append(int(process_count))
        self._size += int(process_count)

    def local_world_size_list(self) -> list[int]:
        """Each rank's node size, in rank order (verl's method)."""
        return [n for n in self.store for _ in range(n)]

    def local_rank_list(self) -> list[int]:
        """Each rank's index on its node, in rank order (verl's method)."""
        return [i for n in self.store for i in range(n)]

    @property
    def pgs(self) -> list[Any] | None:
        """The placement groups, in rank order (node IP), or ``None`` before placement (verl's attribute)."""
        root = self._root
        if root._slots is None:
            return None if root._adopted is None else list(root._adopted)
        return list(dict.fromkeys(slot.placement_group for slot in root._slots))

    @pgs.setter
    def pgs(self, groups: Sequence[Any] | None) -> None:
        """Place on placement groups made elsewhere (verl's ``merge_resource_pool`` sets this); never removed here."""
        root = self._root
        with root._lock:
            if root._slots is not None or root._created:
                raise DispatchValueError("this pool is placed already; set pgs on a new RayResourcePool")
            root._adopted = None if groups is None else list(groups)

    def get_placement_groups(
        self, strategy: str = "STRICT_PACK", name: str | None = None, device_name: str = "cuda", timeout: float = 300.0
    ) -> list[Any]:
        """Reserve the bundles now (if not yet) and return the placement groups in rank order (verl's method).

        ``name`` and ``device_name`` are verl's and unused (groups are named after ``name_prefix``).
        """
        if self._root._slots is None:
            self.prefer_strategy(strategy)
        self.slots(timeout)
        return self.pgs or []

    def prefer_strategy(self, strategy: str) -> None:
        """Use ``strategy`` (``STRICT_PACK``, ``PACK``, ...) if the pool is not placed yet."""
        if strategy not in ("STRICT_PACK", "PACK", "SPREAD", "STRICT_SPREAD"):
            raise DispatchValueError(
                f"unknown placement strategy {strategy!r}; use STRICT_PACK, PACK, SPREAD or STRICT_SPREAD"
            )
        root = self._root
        with root._lock:
            if root._slots is None:
                root.strategy = strategy

    def bundle(self) -> dict[str, float]:
        """Resources of one bundle."""
        out: dict[str, float] = {}
        if self.cpus_per_process > 0:
            out["CPU"] = self.cpus_per_process
        if self.use_gpu:
            out["GPU"] = 1.0
        if self.accelerator_type:
            out[f"accelerator_type:{self.accelerator_type}"] = 0.001
        return out

    def actor_resources(self, num_gpus: float | None = None) -> tuple[float, float]:
        """``(num_cpus, num_gpus)`` one actor of one group asks of its bundle."""
        share = 1.0 / self.max_colocate_count
        gpus = (share if self.use_gpu else 0.0) if num_gpus is None else float(num_gpus)
        if gpus and not self.use_gpu:
            raise DispatchValueError(
                f"num_gpus={num_gpus} on a pool made with use_gpu=False; make it with use_gpu=True"
            )
        if self.use_gpu and gpus > 1.0:
            raise DispatchValueError(f"num_gpus={num_gpus} exceeds the one GPU of a bundle")
        return self.cpus_per_process * share, gpus

    def split(self, sizes: Sequence[int]) -> list[SubRayResourcePool]:
        """Consecutive sub-pools of ``sizes`` ranks each, sharing these placement groups."""
        sizes = [int(s) for s in sizes]
        if any(s < 1 for s in sizes) or sum(sizes) != self._size:
            raise DispatchValueError(f"split sizes {sizes} must be >= 1 and add up to the pool's {self._size} ranks")
        parts: list[SubRayResourcePool] = []
        offset = self._offset
        for size in sizes:
            part = object.__new__(SubRayResourcePool)
            part.__dict__.update(self.__dict__, store=[size], _offset=offset, _size=size, _root=self._root)
            parts.append(part)
            offset += size
        return parts

    # -- placement -------------------------------------------------------------
    def slots(self, timeout: float) -> list[Slot]:
        """This pool's bundles in rank order, reserving them first if needed."""
        root = self._root
        with root._lock:
            if root._slots is None:
                root._slots = root._place(timeout)
            return root._slots[self._offset : self._offset + self._size]

    def _place(self, timeout: float) -> list[Slot]:
        if self._adopted is not None:
            return _slots_of(self._adopted, sort=False)
        import ray
        from ray.util.placement_group import placement_group

        if self.use_gpu and float(ray.cluster_resources().get("GPU", 0)) < 1:
            raise PlacementError(
                f"resource pool {self.store} asks for one GPU per rank (use_gpu=True, verl's default) but the "
                f"Ray cluster has no GPU. For CPU workers pass RayResourcePool(..., use_gpu=False); to place "
                "GPU-asking pools on a machine without GPUs (tests), start Ray with ray.init(num_gpus=N) "
                "(logical GPUs) and keep the workers off CUDA"
            )
        deadline = time.monotonic() + timeout
        lifetime = "detached" if self.detached else None
        groups = []
        for i, count in enumerate(self.store):
            name = f"{self.name_prefix}_{i}" if self.name_prefix else ""
            bundles = [self.bundle() for _ in range(count)]
            groups.append(placement_group(bundles, strategy=self.strategy, name=name, lifetime=lifetime))
            self._created.append(groups[-1])
        ready, _ = ray.wait(
            [pg.ready() for pg in groups], num_returns=len(groups), timeout=max(0.0, deadline - time.monotonic())
        )
        if len(ready) < len(groups):
            self.remove()
            raise PlacementTimeoutError(
                f"resource pool {self.store} (bundle {self.bundle()}) could not be placed within "
                f"{timeout:g} s; the cluster has {ray.available_resources()} available of "
                f"{ray.cluster_resources()}. Ask for fewer resources or raise start_timeout"
            )
        return _slots_of(groups, sort=True)

    def acquire(self) -> None:
        """Note one more group using the pool."""
        with self._root._lock:
            self._root._users += 1

    def release(self) -> None:
        """Note a group gone; the last one out removes the placement groups."""
        root = self._root
        with root._lock:
            root._users = max(0, root._users - 1)
            if root._users == 0 and not root.detached:
                root.remove()

    def remove(self) -> None:
        """Remove the placement groups this pool made (actors on them die)."""
        root = self._root
        with root._lock:
            created, root._created, root._slots = root._created, [], None
        if not created:
            return
        import ray
        from ray.util.placement_group import remove_placement_group

        if not ray.is_initialized():
            return
        for pg in created:
            with contextlib.suppress(Exception):  # already gone
                remove_placement_group(pg)

    def __repr__(self) -> str:
        return (
            f"RayResourcePool(process_on_nodes={self.store}, use_gpu={self.use_gpu}, "
            f"max_colocate_count={self.max_colocate_count})"
        )


def _slots_of(groups: Sequence[Any], sort: bool) -> list[Slot]:
    """Every bundle of ``groups`` as a slot; sorted by node (IP, order label, position) when ``sort``."""
    import ray
    from ray.util.placement_group import placement_group_table

    known = ray.nodes()
    ips = {n["NodeID"]: n["NodeManagerAddress"] for n in known}
    labels = {n["NodeID"]: str((n.get("Labels") or {}).get(NODE_ORDER_LABEL, "")) for n in known}
    placed: list[tuple[tuple[tuple[int, int, str], str], list[Slot]]] = []
    for pg in groups:
        table = placement_group_table(pg)
        node = table.get("bundles_to_node_id", {}).get(0, "")
        slots = [Slot(pg, b) for b in range(len(table["bundles"]))]
        placed.append(((ip_sort_key(ips.get(node, "")), labels.get(node, "")), slots))
    if sort:
        placed.sort(key=lambda item: item[0])  # stable: groups on one node keep their order
    return [slot for _, slots in placed for slot in slots]


class SubRayResourcePool(RayResourcePool):
    """Ranks ``start_bundle_index .. +subgroup_world_size`` of placement groups made elsewhere, never removed here."""

    def __init__(
        self, placement_groups: Sequence[Any], start_bundle_index: int, subgroup_world_size: int, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        start, size = int(start_bundle_index), int(subgroup_world_size)
        if start < 0 or size < 1:
            raise DispatchValueError(f"need start_bundle_index >= 0 and subgroup_world_size >= 1, got {start}, {size}")
        self.pgs = placement_groups
        self._offset, self._size = start, size

    @property
    def start_bundle_index(self) -> int:
        """This part's first bundle, counted over the parent's bundles in rank order."""
        return self._offset

    subgroup_world_size = RayResourcePool.world_size

    def slots(self, timeout: float) -> list[Slot]:
        found = super().slots(timeout)
        if len(found) < self._size:
            raise DispatchValueError(
                f"SubRayResourcePool(start_bundle_index={self._offset}, subgroup_world_size={self._size}) "
                f"runs past the {len(self._root._slots or [])} bundles of its placement groups"
            )
        return found


def split_resource_pool(pool: RayResourcePool, split_size: int | Sequence[int]) -> list[SubRayResourcePool]:
    """verl's helper: equal parts of ``split_size`` ranks, or parts of the listed sizes."""
    if isinstance(split_size, int):
        if split_size < 1 or pool.world_size % split_size:
            raise DispatchValueError(f"cannot split a pool of {pool.world_size} ranks into parts of {split_size}")
        return pool.split([split_size] * (pool.world_size // split_size))
    return pool.split(list(split_size))
