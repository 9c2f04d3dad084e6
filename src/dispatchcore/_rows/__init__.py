"""Lazy results' data plane: rows kept on the ranks, their descriptions and requests, the driver's
ledger, ``LazyDataProto``.

Imports the layers below (``_base`` ... ``_spi``, ``_trace``), never dispatch, workers or groups.
"""
