"""The ``dispatchcore`` console script: ``backends``, ``demo``, ``bench``.

The code is :mod:`dispatchcore._cli.__main__`, so the console script
(``dispatchcore._cli.__main__:main``) and ``python -m dispatchcore._cli`` run
the same module; this face imports nothing, so ``-m`` runs it exactly once.
"""
