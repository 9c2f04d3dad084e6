"""Collectives for worker code, on every backend: ``all_reduce``, ``broadcast``, ``broadcast_object``, ``barrier``.

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
``multiprocess``); it never calls ``init_process_group`` itself.  After a
rank replacement the executor's group is rebuilt for you (your own default
group is yours to rebuild in ``on_membership_change``).  :func:`rank_info`
tells a worker its backend and rank without an attribute on the worker.
"""

from .._worker import RankInfo, all_reduce, barrier, broadcast, broadcast_object, init_process_group, rank_info

__all__ = ["RankInfo", "all_reduce", "barrier", "broadcast", "broadcast_object", "init_process_group", "rank_info"]
