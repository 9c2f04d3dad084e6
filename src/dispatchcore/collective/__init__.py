"""Collectives for worker code, on every backend: ``all_reduce``, ``broadcast``, ``broadcast_object``, ``barrier``;
and torch's default process group over a worker group's ranks: ``init_process_group``.

Call them inside a worker method; every rank of the group calls them in the
same order::

    from dispatchcore import collective

    class Trainer(Worker):
        @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
        def update(self, data):
            ...
            collective.all_reduce(flat_grads, op="sum")

The path comes from what the executor declares, never from the backend's
name: ranks that are threads of one process (``local``) reduce in memory, in
rank order; ranks in processes of their own use your default
``torch.distributed`` group when it spans exactly the group's ranks, else a
gloo group the executor builds on its own store (``torchrun``, ``ray``,
``multiprocess``), which the library aborts on every rank when a call ends
early, so ranks waiting in it leave at once.  After a rank replacement the
executor's group is rebuilt for you (your own default group is yours to
rebuild in ``on_membership_change``).  :func:`init_process_group` makes
torch's default group over exactly the group's ranks, with a ``DeviceMesh``
for FSDP2 (1-D, or any ``mesh_shape=`` for HSDP), which the library can abort
too, with every mesh and ``new_group`` you build on it (``docs/process-groups.md``).  :func:`rank_info`
tells a worker its backend and rank without an attribute on the worker.
"""

from .._worker import RankInfo, all_reduce, barrier, broadcast, broadcast_object, init_process_group, rank_info

__all__ = ["RankInfo", "all_reduce", "barrier", "broadcast", "broadcast_object", "init_process_group", "rank_info"]
