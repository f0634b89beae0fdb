"""Optional dependencies: which extra of ``mmpos-torch`` brings each, and the error when one is missing.

The core needs torch and numpy only. A module that plugs into another library imports it inside
:func:`requires`, so a reader without it gets one line naming the package and the extra::

    with requires("timm"):
        import timm
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["PACKAGES", "requires"]

#: import name of an optional package -> the distribution that provides it
PACKAGES: dict[str, str] = {
    "timm": "timm",
    "open_clip": "open_clip_torch",
    "torch_geometric": "torch-geometric",
    "scipy": "scipy",
    "PIL": "pillow",
    "cv2": "opencv-python-headless",
    "matplotlib": "matplotlib",
    "transformers": "transformers",
    "onnx": "onnx",
    "onnxscript": "onnxscript",
    "onnxruntime": "onnxruntime",
    "yaml": "pyyaml",
    "tqdm": "tqdm",
    "sklearn": "scikit-learn",
}


@contextlib.contextmanager
def requires(extra: str) -> Iterator[None]:
    """Imports inside this block that fail for a missing optional package raise one clear ``ImportError``.

    ``extra`` is the extra of ``mmpos-torch`` the importing module belongs to; the message names the
    missing package and that extra (``pip install 'mmpos-torch[timm]'``). Other import errors pass
    unchanged.
    """
    try:
        yield
    except ModuleNotFoundError as e:
        top = (e.name or "").split(".")[0]
        if top not in PACKAGES:
            raise
        raise ModuleNotFoundError(
            f"{PACKAGES[top]} is not installed; this part of mmpos needs the '{extra}' extra: "
            f"pip install 'mmpos-torch[{extra}]'",
            name=e.name,
        ) from None
