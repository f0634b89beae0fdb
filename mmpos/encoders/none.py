"""``none``: no position encoding (NoPE), the baseline every encoder is compared with.

``mmpos.create("none")`` returns ``None``; models treat ``None`` as "no encoder".
"""

from .registry import register_encoder

__all__ = ["no_position"]


@register_encoder("none", paper="baseline: no position encoding")
def no_position() -> None:
    """Factory of the ``none`` encoder: returns ``None``."""
    return
