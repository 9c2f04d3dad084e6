"""Testing kit: Hypothesis strategies, a conformance suite for executors, a pytest plugin.

A third-party executor runs the whole conformance suite against itself with::

    from dispatchcore.testing.conformance import ExecutorConformance

    class TestMyExecutor(ExecutorConformance):
        backend = "mybackend"
"""
