"""Load a checkpoint trained with one set of position encoders into a model with another.

Weights the two models share (same key, same shape) are loaded; weights only the
model has (a new encoder's tables) keep their initialisation; weights only the
checkpoint has (the old encoder's) are dropped. :func:`load_state_dict_report` says
which is which. ``aliases`` map a backbone's own absolute embedding to mmpos's
``learned`` encoder, e.g. timm's ``pos_embed`` ``(1, N, D)`` and
``pos_encoders.learned.pos_embed`` ``(1, N, D)``, so a checkpoint of the plain
backbone transfers its embedding to a converted one and back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from torch import Tensor, nn

__all__ = ["TransferReport", "load_state_dict_report"]


@dataclass(frozen=True)
class TransferReport:
    """What :func:`load_state_dict_report` did, key by key (model key names).

    Attributes:
        kept: model keys loaded from the state dict.
        new: model keys the state dict lacks; they keep their initialisation.
        dropped: state-dict keys the model has no place for.
        mismatched: keys present in both with different shapes; the model keeps its own.
        renamed: ``(state-dict key, model key)`` pairs loaded through an alias.
    """

    kept: tuple[str, ...]
    new: tuple[str, ...]
    dropped: tuple[str, ...]
    mismatched: tuple[str, ...]
    renamed: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        parts = [f"{len(self.kept)} kept", f"{len(self.new)} new", f"{len(self.dropped)} dropped"]
        if self.mismatched:
            parts.append(f"{len(self.mismatched)} mismatched")
        lines = [", ".join(parts)]
        lines += [f"  new: {k}" for k in self.new]
        lines += [f"  dropped: {k}" for k in self.dropped]
        lines += [f"  mismatched: {k}" for k in self.mismatched]
        lines += [f"  renamed: {a} -> {b}" for a, b in self.renamed]
        return "\n".join(lines)


def _alias_target(key: str, aliases: Sequence[tuple[str, str]], targets: Mapping[str, Tensor]) -> str | None:
    """The model key that ``key`` maps to through an alias (either direction), if any."""
    for a, b in aliases:
        for src, dst in ((a, b), (b, a)):
            if key == src or key.endswith("." + src):
                candidate = key[: len(key) - len(src)] + dst
                if candidate in targets:
                    return candidate
    return None


def load_state_dict_report(
    model: nn.Module, state_dict: Mapping[str, Tensor], aliases: Sequence[tuple[str, str]] = ()
) -> TransferReport:
    """Load the weights of ``state_dict`` that fit ``model`` and report what happened.

    Args:
        model: the model to load into (its current values stay where nothing fits).
        state_dict: a checkpoint, e.g. of the same backbone with other encoders.
        aliases: ``(key, key)`` suffix pairs naming the same weight in two layouts;
            used in both directions when the exact key is missing on the model side.
            A value whose shape differs from its alias target only by singleton
            dimensions (e.g. ``(N, D)`` and ``(1, N, D)``) is reshaped.
    """
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"state_dict must be a mapping of names to tensors, got {type(state_dict).__name__}")
    targets = model.state_dict()
    load: dict[str, Tensor] = {}
    dropped, mismatched, renamed = [], [], []
    for key, value in state_dict.items():
        target = key if key in targets else _alias_target(key, aliases, targets)
        if target != key and target in state_dict:
            target = None  # the checkpoint holds the model key itself as well
        if target is None:
            dropped.append(key)
            continue
        want = targets[target].shape
        if value.shape != want:
            squeezed = [s for s in value.shape if s != 1] == [s for s in want if s != 1]
            if target == key or not squeezed:
                mismatched.append(target)
                continue
            value = value.reshape(want)
        if target != key:
            renamed.append((key, target))
        load[target] = value
    model.load_state_dict(load, strict=False)
    new = [k for k in targets if k not in load and k not in mismatched]
    return TransferReport(tuple(load), tuple(new), tuple(dropped), tuple(mismatched), tuple(renamed))
