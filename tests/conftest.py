"""Session-wide settings of the test suite."""

import gc


def pytest_sessionfinish(session, exitstatus):
    """Drop Hypothesis's garbage-collection timer (``gc.callbacks``) before the interpreter shuts down.

    Under pytest-xdist a worker is stopped while it finishes; a collection that runs then calls the
    timer, which can be interrupted and print a ``KeyboardInterrupt`` traceback ("Exception ignored
    in: gc_callback") after the tests passed, which reads like a failure. The timer only feeds
    Hypothesis's own statistics, which are final here.
    """
    gc.callbacks[:] = [cb for cb in gc.callbacks if not getattr(cb, "__module__", "").startswith("hypothesis")]
