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


def pytest_terminal_summary(terminalreporter):
    """The versions this run tested, printed after the results (README: "Tested versions" points here)."""
    import importlib.metadata
    import platform

    names = ("torch", "numpy", "timm", "open_clip_torch", "torch-geometric", "transformers", "scipy", "onnxruntime")
    found = []
    for name in names:
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{name} (not installed)")
    terminalreporter.write_line(f"mmpos test environment: Python {platform.python_version()}, " + ", ".join(found))
