"""Bytes between processes: pickle 5 with out-of-band tensor buffers, the buffer pool, receive buffers,
the rank allocator.

The public face is :mod:`dispatchcore.wire`; this package imports only ``_base``.
"""
