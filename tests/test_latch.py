"""Unit test of an internal part (the one-shot latch each call handle waits on): imports dispatchcore._base._latch."""

from __future__ import annotations

import threading

from dispatchcore._base._latch import Latch


def test_wait_times_out_until_set_then_passes_at_once() -> None:
    latch = Latch()
    assert not latch.is_set()
    assert latch.wait(0.01) is False
    latch.set()
    assert latch.is_set()
    assert latch.wait(0.0) is True
    assert latch.wait() is True


def test_setting_twice_is_harmless() -> None:
    latch = Latch()
    latch.set()
    latch.set()
    assert latch.wait(0.0) and latch.wait(0.0)


def test_every_waiter_passes_once_set_even_with_setters_racing() -> None:
    for _ in range(50):
        latch = Latch()
        passed: list[bool] = []

        def wait(latch: Latch = latch, passed: list[bool] = passed) -> None:
            passed.append(latch.wait(30.0))

        waiters = [threading.Thread(target=wait) for _ in range(4)]
        setters = [threading.Thread(target=latch.set) for _ in range(3)]
        for t in waiters + setters:
            t.start()
        for t in waiters + setters:
            t.join()
        assert passed == [True] * 4
        assert latch.wait(0.0)
