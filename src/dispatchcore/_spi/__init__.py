"""The executor contract's core side: ``Call`` and its ``Instructions``, the ``Executor`` base, forward
plans, rank environment, plugins.

The public face is :mod:`dispatchcore.executor`.  Imports ``_base``, ``_wire``, ``_data``.
"""
