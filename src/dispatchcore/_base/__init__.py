"""The floor every layer stands on: the exception tree, the one-shot latch, backend option checks, old module paths.

Imports nothing of dispatchcore.
"""
