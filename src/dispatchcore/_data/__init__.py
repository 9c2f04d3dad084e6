"""The batch containers: ``DataProto``, ``TensorBatch``, padding, ``meta_info`` rules, reshaping, mini-
batches, TensorDict interop.

Imports ``_base`` and ``_wire``.  The row helpers program against
:class:`~dispatchcore._data._rows_like.RowsLike`, so ``DataProto`` imports them and never the reverse.
"""
