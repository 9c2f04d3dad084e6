"""Resource pools: placement groups that one or more groups' ranks land on.

A pool reserves ``process_on_nodes[i]`` bundles on node ``i`` (one
``STRICT_PACK`` placement group per node, as verl does), each bundle
``{"CPU": cpus_per_process}`` plus one GPU when ``use_gpu``.  Up to
``max_colocate_count`` groups may share a pool: each of their actors asks for
``1/max_colocate_count`` of its bundle, so GPUs are shared fractionally.
Rank ``r`` of every group on the pool gets the ``r``-th bundle after sorting
the placement groups by node IP as a number (what orders a real cluster),
then by the node's ``dispatchcore-node-order`` label (where several nodes
share an IP, as simulated nodes on one machine do), then by the pool's own
order, so rank order is stable across restarts.  Placement groups are made on first use, and removed when the last
group using the pool shuts down (or by :meth:`RayResourcePool.remove`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dispatchcore import DispatchError

from ._runtime import ip_sort_key

#: Node label that orders nodes sharing an IP (``ray start --labels='{"dispatchcore-node-order": "1"}'``).
NODE_ORDER_LABEL = "dispatchcore-node-order"


class PlacementError(DispatchError, RuntimeError):
    """Ray could not place a group's actors or a pool's bundles in time."""


@dataclass(frozen=True)
class Slot:
    """Where one rank goes: a bundle of a placement group on a node."""

    placement_group: Any
    bundle_index: int
    node_ip: str


class RayResourcePool:
    """Placement groups for ``sum(process_on_nodes)`` ranks (verl's name and arguments)."""

    def __init__(
        self,
        process_on_nodes: Sequence[int] | None = None,
        use_gpu: bool = False,
        max_colocate_count: int = 1,
        name_prefix: str | None = None,
        detached: bool = False,
        cpus_per_process: float = 1.0,
        accelerator_type: str | None = None,
    ) -> None:
        nodes = [int(n) for n in (process_on_nodes if process_on_nodes is not None else [1])]
        if not nodes or any(n < 1 for n in nodes):
            raise ValueError(f"process_on_nodes must list >= 1 process per node, got {process_on_nodes!r}")
        if int(max_colocate_count) < 1:
            raise ValueError(f"max_colocate_count must be >= 1, got {max_colocate_count!r}")
        if cpus_per_process <= 0 and not use_gpu:
            raise ValueError("a CPU-only pool needs cpus_per_process > 0 (Ray refuses empty bundles)")
        self.store = nodes
        self.use_gpu = bool(use_gpu)
        self.max_colocate_count = int(max_colocate_count)
        self.name_prefix = name_prefix
        self.detached = bool(detached)
        self.cpus_per_process = float(cpus_per_process)
        self.accelerator_type = accelerator_type
        self._root: RayResourcePool = self
        self._offset = 0
        self._size = sum(nodes)
        self._slots: list[Slot] | None = None
        self._created: list[Any] = []
        self._users = 0
        self._lock = threading.RLock()

    # -- shape -----------------------------------------------------------------
    @property
    def world_size(self) -> int:
        """Number of ranks (bundles) this pool offers."""
        return self._size

    @property
    def process_on_nodes(self) -> list[int]:
        return list(self.store)

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
            raise ValueError(f"num_gpus={num_gpus} on a pool made with use_gpu=False; make it with use_gpu=True")
        if self.use_gpu and gpus > 1.0:
            raise ValueError(f"num_gpus={num_gpus} exceeds the one GPU of a bundle")
        return self.cpus_per_process * share, gpus

    def split(self, sizes: Sequence[int]) -> list[RayResourcePool]:
        """Consecutive sub-pools of ``sizes`` ranks each, sharing these placement groups."""
        sizes = [int(s) for s in sizes]
        if any(s < 1 for s in sizes) or sum(sizes) != self._size:
            raise ValueError(f"split sizes {sizes} must be >= 1 and add up to the pool's {self._size} ranks")
        parts: list[RayResourcePool] = []
        offset = self._offset
        for size in sizes:
            part = object.__new__(RayResourcePool)
            part.__dict__.update(self.__dict__)
            part.__dict__.update(store=[size], _offset=offset, _size=size, _root=self._root)
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
        import ray
        from ray.util.placement_group import placement_group, placement_group_table

        deadline = time.monotonic() + timeout
        lifetime = "detached" if self.detached else None
        groups = []
        for i, count in enumerate(self.store):
            name = f"{self.name_prefix}_{i}" if self.name_prefix else ""
            pg = placement_group(
                [self.bundle() for _ in range(count)], strategy="STRICT_PACK", name=name, lifetime=lifetime
            )
            self._created.append(pg)
            groups.append(pg)
        ready, _ = ray.wait(
            [pg.ready() for pg in groups], num_returns=len(groups), timeout=max(0.0, deadline - time.monotonic())
        )
        if len(ready) < len(groups):
            self.remove()
            raise PlacementError(
                f"resource pool {self.store} (bundle {self.bundle()}) could not be placed within "
                f"{timeout:g} s; the cluster has {ray.available_resources()} available of "
                f"{ray.cluster_resources()}. Ask for fewer resources or raise start_timeout"
            )
        known = ray.nodes()
        ips = {n["NodeID"]: n["NodeManagerAddress"] for n in known}
        labels = {n["NodeID"]: str((n.get("Labels") or {}).get(NODE_ORDER_LABEL, "")) for n in known}
        placed: list[tuple[tuple[int, int, str], str, int, list[Slot]]] = []
        for position, pg in enumerate(groups):
            table = placement_group_table(pg)
            nodes = table.get("bundles_to_node_id", {})
            slots = [Slot(pg, b, ips.get(nodes.get(b, ""), "")) for b in range(len(table["bundles"]))]
            node = nodes.get(0, "")
            placed.append((ip_sort_key(slots[0].node_ip), labels.get(node, ""), position, slots))
        placed.sort(key=lambda item: item[:3])
        return [slot for *_, slots in placed for slot in slots]

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
            try:
                remove_placement_group(pg)
            except Exception:  # noqa: BLE001, S110 - already gone
                pass

    def __repr__(self) -> str:
        return (
            f"RayResourcePool(process_on_nodes={self.store}, use_gpu={self.use_gpu}, "
            f"max_colocate_count={self.max_colocate_count})"
        )


def split_resource_pool(pool: RayResourcePool, split_size: int | Sequence[int]) -> list[RayResourcePool]:
    """verl's helper: equal parts of ``split_size`` ranks, or parts of the listed sizes."""
    if isinstance(split_size, int):
        if split_size < 1 or pool.world_size % split_size:
            raise ValueError(f"cannot split a pool of {pool.world_size} ranks into parts of {split_size}")
        return pool.split([split_size] * (pool.world_size // split_size))
    return pool.split(list(split_size))
