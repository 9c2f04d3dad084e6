"""The ``dispatchcore`` console script, in ``__main__``: this file imports nothing, so ``-m`` runs that once."""
