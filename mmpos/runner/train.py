"""Train and evaluate one (encoder, seed) run of a task: devices, DDP, checkpoints, resume.

The one training loop of the recipes: :func:`make_optimizer` (AdamW, parameter groups,
warm-up + cosine schedule) and :func:`train_steps` (one update per step); :func:`train_run`
drives them with logging, evaluation and checkpoints, :func:`fit` trains a task in memory
with the same two (a task that needs a pretrained model uses it).

Every process of a ``torchrun`` launch runs the same code; rank 0 alone writes files.
Checkpoints hold only tensors and plain containers and are read back with
``torch.load(weights_only=True)``. Because a task's batches are a pure function of
``(seed, step)`` and ``last.pt`` holds the model, optimizer, scheduler, the RNG states of
every process (rank order) and step, a resumed run -- under ``torchrun`` too, with the same
number of processes -- ends with exactly the metrics of an uninterrupted one.

Files are written atomically (a temporary file, ``fsync``, then a rename): a killed run
leaves the previous version, never half of a new one; temporary files left by a crash are
removed when a run starts. Each checkpoint carries the SHA-256 of its payload, the digest
of the resolved config it was trained with (:func:`mmpos.runner.config.config_digest`) and
the number and SHA-256 of the ``metrics.jsonl`` records written up to it. ``last.pt`` keeps its
predecessor as ``prev.pt``; resuming verifies all of them and falls back to ``prev.pt`` when ``last.pt``
fails (a warning names the file and the reason), drops a torn last line of ``metrics.jsonl``,
and raises :class:`RunError` naming the damaged files when no checkpoint passes. A write that
fails (full disk, read-only folder) raises :class:`WriteFailed` naming the file, with no
temporary file left. A run whose loss becomes non-finite stops with :class:`TrainingDiverged`,
writes ``failed.json`` and no ``final.json``.
See ``docs/reliability.md``. With ``logger: tensorboard`` every ``metrics.jsonl`` record is
also written as TensorBoard scalars in the pair's folder (:func:`require_tensorboard`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import random
import re
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from .._extras import requires
from .config import ConfigError, RunError, config_digest
from .tasks import Task, get_task

with requires("recipes"):  # one line naming the package and the extra when it is missing
    from tqdm.auto import tqdm

__all__ = [
    "Dist",
    "RunError",
    "TrainingDiverged",
    "WriteFailed",
    "fit",
    "init_distributed",
    "make_optimizer",
    "require_tensorboard",
    "resolve_device",
    "seed_everything",
    "shard",
    "to_device",
    "train_run",
    "train_steps",
]


class TrainingDiverged(RuntimeError):
    """The training loss became NaN or infinite; the run is marked failed (``failed.json``)."""


class WriteFailed(RuntimeError):
    """A file of the run folder could not be written (full disk, read-only folder, ...).

    The message is one line, ``"no space left on device while writing .../last.pt"``; the file
    keeps its previous version and no temporary file is left, so the run resumes once the
    cause is gone. ``mmpos run`` prints it and exits with status 1.
    """

    def __init__(self, message: str, path: Path) -> None:
        super().__init__(message)
        self.path = path


def _write_failed(error: OSError, path: Path) -> WriteFailed:
    reason = os.strerror(error.errno) if error.errno else (error.strerror or str(error))
    return WriteFailed(f"{reason[:1].lower()}{reason[1:]} while writing {path}", path)


_TEMPORARY = re.compile(r"\..+\.tmp\d+")  # atomic_write's temporary names: .<name>.tmp<pid>


def _temporary(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def remove_temporaries(folder: Path) -> list[Path]:
    """Delete the temporary files (``.<name>.tmp<pid>``) a killed run left in ``folder`` and below; returns them.

    Called under the run folder's lock, when no other process writes there.
    """
    found = [p for p in Path(folder).rglob(".*.tmp*") if _TEMPORARY.fullmatch(p.name) and p.is_file()]
    for p in found:
        p.unlink(missing_ok=True)
    return found


def _write_file(path: Path, write) -> None:
    """``write(f)`` into a temporary file, ``fsync``, rename over ``path``, ``fsync`` of the folder.

    Any ``OSError`` (``ENOSPC``, ``EROFS``, ``EACCES``...) removes the temporary file and becomes a
    :class:`WriteFailed` naming ``path``; ``path`` keeps its previous version.
    """
    tmp = _temporary(path)
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise _write_failed(e, path) from None


def atomic_write(path: Path, data: bytes | str) -> None:
    """Write ``path`` as a whole or not at all (see :func:`_write_file`); :class:`WriteFailed` when it cannot."""
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    _write_file(path, lambda f: f.write(payload))


def payload_digest(obj: Any) -> str:
    """SHA-256 of a checkpoint payload: tensors (dtype, shape, bytes) and plain containers, in order.

    Independent of the file format, so a checkpoint is verified by recomputing it after
    ``torch.load``; a flipped bit in any tensor or number changes it.
    """
    h = hashlib.sha256()
    _feed(h, obj)
    return h.hexdigest()


def _feed(h: Any, obj: Any) -> None:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().to("cpu").contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)};".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy())
    elif isinstance(obj, dict):
        h.update(f"D{len(obj)};".encode())
        for key, value in obj.items():
            _feed(h, key)
            _feed(h, value)
    elif isinstance(obj, (list, tuple)):
        h.update(f"{'L' if isinstance(obj, list) else 'U'}{len(obj)};".encode())
        for value in obj:
            _feed(h, value)
    elif obj is None or isinstance(obj, (bool, int, float, str, bytes)):
        h.update(f"{type(obj).__name__}:{obj!r};".encode())
    else:
        raise TypeError(f"a checkpoint holds tensors and plain containers only, got {type(obj).__name__}")


def _fsync_dir(folder: Path) -> None:
    if os.name == "posix":  # a rename is durable once its folder is synced
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@dataclass(frozen=True)
class Dist:
    """The process's place in a launch: ``rank`` of ``world_size`` (1 without torchrun)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """``auto`` -> CUDA when present (``cuda:LOCAL_RANK`` under torchrun), else CPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ValueError(f"device={name!r} is not a device; use auto, cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"device={name!r}: the runner trains on cpu, cuda or mps; use auto, cpu, cuda or cuda:N")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={name!r} but CUDA is not available; use device=cpu or device=auto")
        if device.index is None:
            device = torch.device("cuda", local_rank)
    return device


def init_distributed(device_name: str) -> tuple[Dist, torch.device]:
    """Join the ``torchrun`` process group (gloo on CPU, NCCL on CUDA) when ``WORLD_SIZE > 1``."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(device_name, local)
    if world == 1:
        return Dist(), device
    if not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Dist(dist.get_rank(), dist.get_world_size(), local), device


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, NumPy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _rng_state() -> dict[str, Any]:
    np_state = np.random.get_state()
    return {
        "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def _rng_states(ddp: Dist) -> list[dict[str, Any]]:
    """Every process's random state, in rank order (a collective under DDP: all ranks call it).

    Ranks draw different numbers wherever the draws depend on their rows (masking a share of the
    real tokens, say), so each rank resumes from its own state, not rank 0's.
    """
    state = _rng_state()
    if not ddp.enabled:
        return [state]
    states: list[Any] = [None] * ddp.world_size
    dist.all_gather_object(states, state)
    return states


def _resume_rng(states: Any, ddp: Dist, where: Path) -> dict[str, Any]:
    """This rank's state of a checkpoint's ``rng`` list (rank 0's, with a warning, under another process count)."""
    if not isinstance(states, list) or not states:
        raise ValueError("its rng record is not a list of per-process states")
    if len(states) != ddp.world_size:
        if ddp.is_main:
            warnings.warn(
                f"the checkpoint in {where} was written by {len(states)} process(es), resumed by {ddp.world_size}: "
                "every process "
                "continues rank 0's random state, so the run will not equal an uninterrupted one",
                stacklevel=3,
            )
        return states[0]
    return states[ddp.rank]


def _set_rng_state(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    npy = state["numpy"]
    np.random.set_state((npy[0], npy[1].numpy().astype(np.uint32), *npy[2:]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _map_tensors(batch: Any, fn) -> Any:
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, dict):
        return {k: _map_tensors(v, fn) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        out = [_map_tensors(v, fn) for v in batch]
        return type(batch)(*out) if hasattr(batch, "_fields") else type(batch)(out)
    return batch


def to_device(batch: Any, device: torch.device) -> Any:
    """Move every tensor of a (nested) batch to ``device``."""
    return _map_tensors(batch, lambda t: t.to(device, non_blocking=True))


def shard(batch: Any, rank: int, world_size: int) -> Any:
    """Rows ``rank::world_size`` of every tensor of a global batch (DistributedSampler style)."""
    if world_size == 1:
        return batch

    def take(t: torch.Tensor) -> torch.Tensor:
        if t.dim() == 0 or t.shape[0] % world_size:
            raise ValueError(
                f"a batch tensor of shape {tuple(t.shape)} cannot be split evenly over {world_size} processes; "
                "make batch_size divisible by the number of processes"
            )
        return t[rank::world_size]

    return _map_tensors(batch, take)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on matrices only (not on biases, norms, class tokens and other 1-D parameters)."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _lr_lambda(steps: int, warmup: int, min_ratio: float):
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

    return f


def make_optimizer(
    model: nn.Module, task: Task, cfg: dict[str, Any], steps: int | None = None
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over ``task.param_groups(model)`` (default :func:`param_groups`) and its schedule.

    ``cfg["optim"]``: ``lr``, ``betas``, ``weight_decay``; the learning rate warms up linearly
    for ``warmup_steps`` and then follows a cosine to ``min_lr_ratio * lr`` at ``steps``
    (default ``cfg["steps"]``).
    """
    o = cfg["optim"]
    groups = task.param_groups(model) if task.param_groups else param_groups(model, o["weight_decay"])
    opt = torch.optim.AdamW(groups, lr=o["lr"], betas=tuple(o["betas"]), weight_decay=o["weight_decay"])
    schedule = _lr_lambda(cfg["steps"] if steps is None else steps, o["warmup_steps"], o["min_lr_ratio"])
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, schedule)


def train_steps(
    task: Task,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
    cfg: dict[str, Any],
    device: torch.device,
    start: int = 0,
    stop: int | None = None,
    ddp: Dist | None = None,
) -> Iterator[tuple[int, Tensor, dict[str, float], float]]:
    """The training loop: one update per step from ``start`` to ``stop`` (default ``cfg["steps"]``).

    Step ``k`` trains on ``task.train_batch(k)`` (this rank's rows under DDP, moved to
    ``device``): loss, backward, gradient clipping at ``cfg["optim"]["grad_clip"]`` (0: none),
    AdamW step, schedule step. Yields ``(k + 1, loss, extra, lr)`` after each update (``lr``:
    the rate the update used), so the caller logs, evaluates and checkpoints between steps.
    ``model`` may be a DDP wrapper of ``task.model``.
    """
    ddp = ddp or Dist()
    clip = cfg["optim"]["grad_clip"]
    for step in range(start, cfg["steps"] if stop is None else stop):
        batch = to_device(shard(task.train_batch(step), ddp.rank, ddp.world_size), device)
        result = task.loss(model, batch)
        loss, extra = result if isinstance(result, tuple) else (result, {})
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if clip:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        lr = opt.param_groups[0]["lr"]
        opt.step()
        sched.step()
        yield step + 1, loss, extra, lr


def fit(task: Task, cfg: dict[str, Any], device: torch.device, steps: int | None = None) -> nn.Module:
    """Train ``task.model`` for ``steps`` (default ``cfg["steps"]``) exactly as a run does, in memory.

    The same :func:`make_optimizer` and :func:`train_steps` as :func:`train_run`, without
    files, evaluation or DDP, from the global RNG as it is (seed it first). Returns the model,
    on ``device``, in train mode; raises :class:`TrainingDiverged` if a loss was not finite.
    """
    steps = cfg["steps"] if steps is None else steps
    model = task.model.to(device).train()
    opt, sched = make_optimizer(model, task, cfg, steps)
    finite = torch.ones((), dtype=torch.bool, device=device)  # checked once, at the end (no sync per step)
    for _, loss, _, _ in train_steps(task, model, opt, sched, cfg, device, 0, steps):
        finite &= torch.isfinite(loss.detach()).all()
    if not bool(finite):
        raise TrainingDiverged(f"the training loss became NaN or infinite within {steps} steps; lower optim.lr")
    return model


def _floats(metrics: Any, what: str) -> dict[str, float]:
    if not isinstance(metrics, dict) or not metrics:
        raise TypeError(f"{what} must return a non-empty dict of metric name -> float, got {metrics!r}")
    return {str(k): float(v) for k, v in metrics.items()}


def require_tensorboard() -> type:
    """``torch.utils.tensorboard.SummaryWriter``; a :class:`ConfigError` naming the package when it is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError(
            "logger: tensorboard needs the 'tensorboard' package: pip install tensorboard "
            "(or pip install 'mmpos-torch[tensorboard]'), or set logger=jsonl"
        ) from None
    return SummaryWriter


class _Writer:
    """Rank-0 file output of one run folder (no-ops on other ranks); every file is written atomically.

    ``records`` counts the lines of ``metrics.jsonl`` (each checkpoint records it).
    """

    def __init__(self, folder: Path, active: bool) -> None:
        self.folder, self.active = folder, active
        self.tensorboard = None
        self.records = 0
        self.log_hash = hashlib.sha256()  # of every line of metrics.jsonl so far (each checkpoint records it)
        if active:
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise _write_failed(e, folder) from None

    def open_tensorboard(self, step: int) -> None:
        """Also write every record as TensorBoard scalars (event files in the folder).

        Events after ``step`` (the checkpoint a run resumes from) left by an interrupted run are
        dropped when TensorBoard reads the folder (``purge_step``), as :meth:`truncate_after`
        drops them from ``metrics.jsonl``.
        """
        SummaryWriter = require_tensorboard()
        if self.active:
            self.tensorboard = SummaryWriter(log_dir=str(self.folder), purge_step=step + 1 if step else None)

    def log(self, record: dict[str, Any]) -> None:
        """Append one line to ``metrics.jsonl`` (made durable with the next checkpoint); TensorBoard too if open.

        A failed append is cut back to the file's previous length (no torn line) and raises
        :class:`WriteFailed`. TensorBoard tags: ``train/<key>`` for the training record's values,
        ``eval/<metric>``.
        """
        if self.active:
            path = self.folder / "metrics.jsonl"
            line = (json.dumps(record) + "\n").encode("utf-8")
            try:
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
                try:
                    size = os.fstat(fd).st_size
                    try:
                        if os.write(fd, line) != len(line):  # a short write: the disk filled up
                            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                    except OSError:
                        with contextlib.suppress(OSError):
                            os.ftruncate(fd, size)
                        raise
                finally:
                    os.close(fd)
            except OSError as e:
                raise _write_failed(e, path) from None
            self.records += 1
            self.log_hash.update(line)
        if self.tensorboard is not None:
            step = record["step"]
            scalars = (
                {f"eval/{k}": v for k, v in record["eval"].items()}
                if "eval" in record
                else {f"train/{k}": v for k, v in record.items() if k != "step"}
            )
            for tag, value in scalars.items():
                self.tensorboard.add_scalar(tag, value, step)

    def close(self) -> None:
        """Flush and close the TensorBoard writer, if any."""
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None

    def read_records(self) -> list[tuple[int, str]]:
        """``(step, line)`` of every record of ``metrics.jsonl`` (``[]`` when there is none).

        A torn last line (a run killed mid-write) is dropped with a warning; a damaged line
        before the last one raises :class:`RunError` naming the file and line.
        """
        path = self.folder / "metrics.jsonl"
        if not path.exists():
            return []
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        records = []
        for i, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                record_step = record["step"]
                if not isinstance(record_step, int) or isinstance(record_step, bool):
                    raise TypeError("step")
            except (ValueError, KeyError, TypeError):
                if i == len(lines):
                    warnings.warn(
                        f"{path}: dropped a torn last line (line {i}) left by an interrupted run", stacklevel=2
                    )
                    continue
                raise RunError(f"{path}: line {i} is damaged ({line[:60]!r}); the log cannot be resumed") from None
            records.append((record_step, line))
        return records

    def truncate_after(self, step: int, records: list[tuple[int, str]]) -> None:
        """Keep the ``records`` up to ``step``, dropping those an interrupted run wrote past its checkpoint."""
        keep = [line for s, line in records if s <= step]
        self.records = len(keep)
        self.log_hash = _lines_hash(keep)
        if self.active and (self.folder / "metrics.jsonl").exists():
            atomic_write(self.folder / "metrics.jsonl", "".join(line + "\n" for line in keep))

    def save(self, name: str, obj: dict[str, Any], config: str) -> None:
        """Save a checkpoint atomically with its integrity record; ``last.pt`` moves to ``prev.pt`` first.

        ``obj["integrity"]``: ``payload_sha256`` (:func:`payload_digest` of the rest), ``config_sha256``
        (``config``), ``records`` and ``metrics_sha256`` (the count and SHA-256 of the lines of
        ``metrics.jsonl`` so far).
        """
        if not self.active:
            return
        integrity = {
            "payload_sha256": payload_digest(obj),
            "config_sha256": config,
            "records": self.records,
            "metrics_sha256": self.log_hash.hexdigest(),
        }
        obj = {**obj, "integrity": integrity}
        log = self.folder / "metrics.jsonl"
        target = self.folder / name
        tmp = _temporary(target)
        try:
            if log.exists():  # the log up to this checkpoint is durable before the checkpoint is
                with open(log, "rb+") as f:
                    os.fsync(f.fileno())
            with open(tmp, "wb") as f:
                torch.save(obj, f)
                f.flush()
                os.fsync(f.fileno())
            if name == "last.pt" and target.exists():
                os.replace(target, self.folder / "prev.pt")
            os.replace(tmp, target)
            _fsync_dir(self.folder)
        except OSError as e:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise _write_failed(e, target) from None

    def json(self, name: str, obj: dict[str, Any]) -> None:
        if self.active:
            atomic_write(self.folder / name, json.dumps(obj, indent=2) + "\n")


def _lines_hash(lines: list[str]) -> Any:
    h = hashlib.sha256()
    for line in lines:
        h.update((line + "\n").encode("utf-8"))
    return h


_CHECKPOINT_KEYS = {"model", "optimizer", "scheduler", "rng", "step", "best", "best_step", "elapsed", "integrity"}


def _read_checkpoint(path: Path) -> dict[str, Any]:
    """``torch.load`` a ``last.pt`` / ``prev.pt`` and verify its payload digest; ``ValueError`` says what is wrong."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 -- any unreadable file is damaged; the reason is named
        raise ValueError(f"unreadable ({type(e).__name__}: {' '.join(str(e).split())[:80]})") from None
    if not isinstance(ckpt, dict) or not _CHECKPOINT_KEYS <= set(ckpt):
        missing = sorted(_CHECKPOINT_KEYS - set(ckpt)) if isinstance(ckpt, dict) else "all"
        raise ValueError(f"not a runner checkpoint (missing {missing})")
    integrity = ckpt.pop("integrity")
    if not (
        isinstance(integrity, dict)
        and {"payload_sha256", "config_sha256", "records", "metrics_sha256"} <= set(integrity)
    ):
        raise ValueError("its integrity record is damaged")
    try:
        digest = payload_digest(ckpt)
    except TypeError as e:
        raise ValueError(str(e)) from None
    if digest != integrity["payload_sha256"]:
        raise ValueError("its content does not match its sha256 (a damaged or altered file)")
    ckpt["integrity"] = integrity
    return ckpt


def _resume_point(folder: Path, config: str, writer: _Writer) -> tuple[dict[str, Any] | None, list[tuple[int, str]]]:
    """The newest of ``last.pt`` / ``prev.pt`` that passes every check, and the log's records.

    A checkpoint passes when its payload digest holds, it was trained with the config of digest
    ``config``, and ``metrics.jsonl`` holds exactly the records it counted up to its step. A
    fallback to ``prev.pt`` is a warning naming what failed; when checkpoints exist and none
    passes, :class:`RunError` names each file and reason. ``(None, records)`` when there is none.
    """
    records = writer.read_records()
    problems: list[str] = []
    for name in ("last.pt", "prev.pt"):
        path = folder / name
        if not path.exists():
            continue
        try:
            ckpt = _read_checkpoint(path)
        except ValueError as e:
            problems.append(f"{path} is damaged: {e}")
            continue
        integrity = ckpt["integrity"]
        if integrity["config_sha256"] != config:
            problems.append(f"{path} was trained with another config than the run folder's config.yaml")
            continue
        kept = [line for s, line in records if s <= ckpt["step"]]
        if len(kept) != integrity["records"]:
            problems.append(
                f"{folder / 'metrics.jsonl'} holds {len(kept)} records up to step {ckpt['step']}, "
                f"{name} counted {integrity['records']} (the log was shortened or altered)"
            )
            continue
        if _lines_hash(kept).hexdigest() != integrity["metrics_sha256"]:
            problems.append(
                f"{folder / 'metrics.jsonl'}: the records up to step {ckpt['step']} differ from those {name} "
                "recorded (the log was altered)"
            )
            continue
        if problems:
            warnings.warn(f"{'; '.join(problems)}; resuming from {path} (step {ckpt['step']})", stacklevel=3)
        return ckpt, records
    if problems:
        raise RunError(f"{'; '.join(problems)}; no checkpoint can be trusted: delete {folder} to train this pair again")
    return None, records


def _final_digest(final: dict[str, Any]) -> str:
    """SHA-256 of ``final.json``'s content (canonical JSON, without its ``sha256`` key)."""
    return hashlib.sha256(json.dumps(final, sort_keys=True).encode("utf-8")).hexdigest()


def _diverged(folder: Path, writer: _Writer, encoder: str, seed: int, step: int, loss: float) -> TrainingDiverged:
    msg = (
        f"{encoder} seed {seed}: the training loss became {loss} at step {step}; the run is marked failed "
        f"({folder / 'failed.json'}) and its last good checkpoint is kept. Lower optim.lr or raise optim.warmup_steps."
    )
    writer.json("failed.json", {"encoder": encoder, "seed": seed, "step": step, "loss": str(loss), "error": msg})
    return TrainingDiverged(msg)


def train_run(
    cfg: dict[str, Any],
    encoder: str,
    seed: int,
    folder: str | Path,
    device: torch.device,
    ddp: Dist | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """Train one (encoder, seed) run of the task ``cfg["task"]`` into ``folder``; returns ``final.json``'s content.

    With ``resume=True`` a run with ``final.json`` is returned as is, and a run with
    ``last.pt`` continues from it; otherwise the run starts from step 0.
    """
    folder, ddp = Path(folder), ddp or Dist()
    final_path = folder / "final.json"
    if ddp.is_main and folder.is_dir():
        remove_temporaries(folder)
    if resume and final_path.exists():
        try:
            final = json.loads(final_path.read_text(encoding="utf-8"))
            if not (
                isinstance(final, dict)
                and final.get("encoder") == encoder
                and final.get("seed") == seed
                and isinstance(final.get("metrics"), dict)
                and final.pop("sha256", None) == _final_digest(final)
            ):
                raise ValueError("not this pair's final.json, or altered")
            return final
        except ValueError:
            warnings.warn(f"{final_path} is damaged; finishing the run from its checkpoint again", stacklevel=2)
    if ddp.enabled and cfg["batch_size"] % ddp.world_size:
        raise ValueError(f"batch_size={cfg['batch_size']} must be divisible by the {ddp.world_size} processes")
    if cfg["threads"] and device.type == "cpu":
        torch.set_num_threads(cfg["threads"])
    if cfg["deterministic"]:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS needs it for deterministic matmuls
    torch.use_deterministic_algorithms(bool(cfg["deterministic"]))
    seed_everything(seed)
    info = get_task(cfg["task"], cfg.get("task_module"))
    task = info.build(cfg, encoder, seed, device)
    if not isinstance(task, Task):
        raise TypeError(
            f"task {info.name!r}: the builder must return a mmpos.runner.tasks.Task, got {type(task).__name__}"
        )
    raw = task.model.to(device)
    model: nn.Module = raw
    if ddp.enabled:
        model = nn.parallel.DistributedDataParallel(raw, device_ids=[device.index] if device.type == "cuda" else None)
    opt, sched = make_optimizer(raw, task, cfg)
    out = _Writer(folder, ddp.is_main)
    sign = 1.0 if task.higher_is_better else -1.0
    step, best, best_step, elapsed = 0, -math.inf, -1, 0.0
    config = config_digest(cfg)
    ckpt, records = _resume_point(folder, config, out) if resume else (None, [])
    if ckpt is not None:
        try:
            raw.load_state_dict(ckpt["model"])
            opt.load_state_dict(ckpt["optimizer"])
            sched.load_state_dict(ckpt["scheduler"])
            _set_rng_state(_resume_rng(ckpt["rng"], ddp, folder))
        except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as e:  # verified, yet not this model's
            raise RunError(
                f"the checkpoint in {folder} does not fit the model this config builds ({type(e).__name__}: "
                f"{' '.join(str(e).split())[:120]})"
            ) from None
        step, best, best_step, elapsed = ckpt["step"], ckpt["best"], ckpt["best_step"], ckpt["elapsed"]
        out.truncate_after(step, records)
    elif ddp.is_main and folder.exists():
        for name in ("metrics.jsonl", "last.pt", "prev.pt", "best.pt", "final.json"):
            (folder / name).unlink(missing_ok=True)
        for events in folder.glob("events.out.tfevents.*"):
            events.unlink()
    if ddp.is_main:
        (folder / "failed.json").unlink(missing_ok=True)
    if cfg.get("logger") == "tensorboard":
        out.open_tensorboard(step)

    def evaluate() -> dict[str, float]:
        raw.eval()
        with torch.no_grad():
            metrics = _floats(task.evaluate(raw), f"task {info.name!r} evaluate()")
        raw.train()
        if task.metric not in metrics:
            raise KeyError(
                f"task {info.name!r}: metric {task.metric!r} is not among evaluate()'s keys {sorted(metrics)}"
            )
        return metrics

    steps, eval_every, log_every = cfg["steps"], cfg["eval_every"], cfg["log_every"]
    bar = tqdm(
        total=steps,
        initial=step,
        desc=f"{encoder} seed {seed}",
        disable=not (cfg["progress"] and ddp.is_main),
        dynamic_ncols=True,
        leave=True,
    )
    raw.train()
    start = time.perf_counter() - elapsed
    metrics: dict[str, float] = {}
    finite = torch.ones((), dtype=torch.bool, device=device)  # all losses finite so far (checked without a sync)
    try:
        for done, loss, extra, lr in train_steps(task, model, opt, sched, cfg, device, step, steps, ddp):
            step = done
            finite &= torch.isfinite(loss.detach()).all()
            logging = bool(log_every and step % log_every == 0 or step == steps)
            evaluating = bool(eval_every and step % eval_every == 0 or step == steps)
            if logging or evaluating:  # before anything is logged or saved: a NaN never reaches a file
                ok = finite.to(torch.int32)
                if ddp.enabled:
                    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
                if not bool(ok):
                    raise _diverged(folder, out, encoder, seed, step, float(loss.detach()))
            if logging:
                value = loss.detach().float()
                if ddp.enabled:
                    dist.all_reduce(value)
                    value /= ddp.world_size
                out.log({"step": step, "loss": value.item(), "lr": lr, **{k: float(v) for k, v in extra.items()}})
                bar.set_postfix(loss=f"{value.item():.4f}", refresh=False)
            if evaluating:
                metrics = evaluate()
                out.log({"step": step, "eval": metrics})
                if sign * metrics[task.metric] > best:
                    best, best_step = sign * metrics[task.metric], step
                    out.save("best.pt", {"model": raw.state_dict(), "step": step, "metrics": metrics}, config)
                out.save(
                    "last.pt",
                    {
                        "model": raw.state_dict(),
                        "optimizer": opt.state_dict(),
                        "scheduler": sched.state_dict(),
                        "rng": _rng_states(ddp),  # one per process, rank order (a collective under DDP)
                        "step": step,
                        "best": best,
                        "best_step": best_step,
                        "elapsed": time.perf_counter() - start,
                    },
                    config,
                )
                bar.set_postfix(
                    loss=f"{loss.item():.4f}", **{task.metric: f"{metrics[task.metric]:.4f}"}, refresh=False
                )
            bar.update(1)
    finally:
        bar.close()
        out.close()
    if not metrics:  # resumed at the very end: evaluate the checkpoint
        metrics = evaluate()
    final = {
        "encoder": encoder,
        "seed": seed,
        "step": step,
        "metrics": metrics,
        "metric": task.metric,
        "higher_is_better": task.higher_is_better,
        "chance": task.chance,
        "best": {"step": best_step, task.metric: sign * best},
        "seconds": round(time.perf_counter() - start, 2),
        "params": sum(p.numel() for p in raw.parameters()),
    }
    out.json("final.json", {**final, "sha256": _final_digest(final)})
    if ddp.enabled:
        dist.barrier()
    return final
