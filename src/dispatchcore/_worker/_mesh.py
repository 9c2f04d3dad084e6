"""Which data-parallel rank a worker is on each n-d mesh (verl's dispatch/collect info).

A worker declares ``(dp_rank, is_collect)`` per mesh name; the nd dispatch
mode of that mesh (``make_nd_compute_dataproto_dispatch_fn``) asks every rank
once and splits by it.  A fused worker hosting several roles copies one
role's declaration under its own mesh name with
``set_dispatch_collect(mesh_name, **role.get_dispatch_collect())``.

A mesh name is declared once per worker: declaring it again raises
:class:`~dispatchcore.RegistrationError` (a ``ValueError``; verl raises
``ValueError`` here and a bare ``AssertionError`` in ``set_dispatch_collect``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._base import RegistrationError
from .._dispatch import Dispatch, register
from ._mesh_query import declared_mesh


class DispatchCollectInfo:
    """The mesh declarations of one worker; :class:`~dispatchcore.Worker` inherits them."""

    #: ``{mesh_name: (dp_rank, is_collect)}``, filled by the worker (``Worker.__new__`` makes it).
    _dispatch_collect_info: dict[str, tuple[int, bool]]

    def _register_dispatch_collect_info(self, mesh_name: str, dp_rank: int, is_collect: bool) -> None:
        """Declare this rank's data-parallel rank on ``mesh_name`` (verl's name).

        The nd dispatch mode of that mesh gives every rank with the same
        ``dp_rank`` the same chunk and collects only from ``is_collect`` ranks.
        """
        _check_mesh_name(mesh_name)
        if isinstance(dp_rank, bool) or not isinstance(dp_rank, int) or dp_rank < 0:
            raise RegistrationError(f"mesh {mesh_name!r}: dp_rank must be an int >= 0, got {dp_rank!r}")
        self._refuse_redeclaring(mesh_name, "_register_dispatch_collect_info")
        self._dispatch_collect_info[mesh_name] = (dp_rank, bool(is_collect))

    #: Public alias of :meth:`_register_dispatch_collect_info`.
    register_mesh = _register_dispatch_collect_info

    def get_dispatch_collect(self) -> dict[str, dict[str, Any]]:
        """Every declared mesh, as verl returns it: ``{"dispatch_dp_rank": {...}, "collect_dp_rank": {...}}``.

        Copies: changing them changes nothing here.  Pass them to another
        worker's :meth:`set_dispatch_collect` as keyword arguments.
        """
        info = self._dispatch_collect_info
        return {
            "dispatch_dp_rank": {mesh: dp for mesh, (dp, _) in info.items()},
            "collect_dp_rank": {mesh: collect for mesh, (_, collect) in info.items()},
        }

    def set_dispatch_collect(
        self,
        mesh_name: str,
        dispatch_dp_rank: Mapping[str, int],
        collect_dp_rank: Mapping[str, bool],
    ) -> None:
        """Declare ``mesh_name`` with another worker's declaration (its :meth:`get_dispatch_collect`).

        The source normally declares one mesh, whatever its name.  If it
        declares several, the one named ``mesh_name`` is copied; verl would
        silently take the last one, we refuse to guess otherwise.
        """
        _check_mesh_name(mesh_name)
        if not isinstance(dispatch_dp_rank, Mapping) or not isinstance(collect_dp_rank, Mapping):
            raise RegistrationError(
                "set_dispatch_collect takes the mappings get_dispatch_collect() returns: "
                f"set_dispatch_collect({mesh_name!r}, **other_worker.get_dispatch_collect())"
            )
        if set(dispatch_dp_rank) != set(collect_dp_rank):
            raise RegistrationError(
                f"set_dispatch_collect({mesh_name!r}): dispatch_dp_rank names meshes {sorted(dispatch_dp_rank)} "
                f"but collect_dp_rank names {sorted(collect_dp_rank)}; pass one worker's get_dispatch_collect()"
            )
        source = _source_mesh(mesh_name, list(dispatch_dp_rank))
        self._refuse_redeclaring(mesh_name, "set_dispatch_collect")
        self._register_dispatch_collect_info(mesh_name, dispatch_dp_rank[source], collect_dp_rank[source])

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def _query_dispatch_info(self, mesh_name: str) -> int:
        """This rank's dp_rank on ``mesh_name`` (verl's name; ``wg._query_dispatch_info(mesh)`` lists them)."""
        return declared_mesh(self, mesh_name)[0]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def _query_collect_info(self, mesh_name: str) -> bool:
        """Whether this rank returns results on ``mesh_name`` (verl's name)."""
        return self.query_collect_info(mesh_name)

    def query_collect_info(self, mesh_name: str) -> bool:
        """Whether this rank returns results on ``mesh_name``."""
        return declared_mesh(self, mesh_name)[1]

    def _refuse_redeclaring(self, mesh_name: str, how: str) -> None:
        found = self._dispatch_collect_info.get(mesh_name)
        if found is not None:
            raise RegistrationError(
                f"{how}: mesh {mesh_name!r} is already declared on this worker (dp_rank={found[0]}, "
                f"is_collect={found[1]}; declared: {sorted(self._dispatch_collect_info)}). A mesh name is "
                "declared once per worker; use another name for the other role's mesh"
            )


def _check_mesh_name(mesh_name: Any) -> None:
    if not isinstance(mesh_name, str) or not mesh_name:
        raise RegistrationError(f"mesh_name must be a non-empty string, got {mesh_name!r}")


def _source_mesh(mesh_name: str, declared: list[str]) -> str:
    """The mesh of another worker's declaration that ``set_dispatch_collect`` copies."""
    if len(declared) == 1:
        return declared[0]
    if mesh_name in declared:
        return mesh_name
    if not declared:
        raise RegistrationError(
            f"set_dispatch_collect({mesh_name!r}): the source declares no mesh; it must call "
            "_register_dispatch_collect_info first"
        )
    raise RegistrationError(
        f"set_dispatch_collect({mesh_name!r}): the source declares meshes {sorted(declared)} and none is named "
        f"{mesh_name!r}; pass the one to copy, e.g. dispatch_dp_rank={{m: info['dispatch_dp_rank'][m]}} and "
        "collect_dp_rank likewise"
    )
