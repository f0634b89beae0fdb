"""Train and evaluate one (encoder, seed) run of a task: devices, DDP, checkpoints, resume.

The one training loop of the recipes: :func:`make_optimizer` (AdamW, parameter groups,
warm-up + cosine schedule) and :func:`train_steps` (one update per step); :func:`train_run`
drives them with logging, evaluation and checkpoints, :func:`fit` trains a task in memory
with the same two (a task that needs a pretrained model uses it).

Every process of a ``torchrun`` launch runs the same code; rank 0 alone writes files.
Checkpoints hold only tensors and plain containers and are read back with
``torch.load(weights_only=True)``. Because a task's batches are a pure function of
``(seed, step)`` and ``last.pt`` holds the model, optimizer, scheduler, RNG states and
step, a resumed run ends with exactly the metrics of an uninterrupted one.

Files are written atomically (a temporary file, ``fsync``, then a rename): a killed run
leaves the previous version, never half of a new one. ``last.pt`` keeps its predecessor as
``prev.pt``; resuming falls back to it when ``last.pt`` is damaged, and drops a torn last
line of ``metrics.jsonl`` (both with a warning naming the file). A run whose loss becomes
non-finite stops with :class:`TrainingDiverged`, writes ``failed.json`` and no ``final.json``.
See ``docs/reliability.md``. With ``logger: tensorboard`` every ``metrics.jsonl`` record is
also written as TensorBoard scalars in the pair's folder (:func:`require_tensorboard`).
"""

from __future__ import annotations

import json
import math
import os
import random
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
from tqdm.auto import tqdm

from .config import ConfigError
from .tasks import Task, get_task

__all__ = [
    "Dist",
    "RunError",
    "TrainingDiverged",
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


class RunError(ValueError):
    """A run folder that cannot be used (damaged beyond recovery, busy, not a folder); names the file."""


class TrainingDiverged(RuntimeError):
    """The training loss became NaN or infinite; the run is marked failed (``failed.json``)."""


def atomic_write(path: Path, data: bytes | str) -> None:
    """Write ``path`` as a whole or not at all: a temporary file, ``fsync``, rename, ``fsync`` of the folder."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


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
    """Rank-0 file output of one run folder (no-ops on other ranks); every file is written atomically."""

    def __init__(self, folder: Path, active: bool) -> None:
        self.folder, self.active = folder, active
        self.tensorboard = None
        if active:
            folder.mkdir(parents=True, exist_ok=True)

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

        TensorBoard tags: ``train/<key>`` for the training record's values, ``eval/<metric>``.
        """
        if self.active:
            with open(self.folder / "metrics.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
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

    def truncate_after(self, step: int) -> None:
        """Drop records written after ``step`` (by an interrupted run past its last checkpoint).

        A torn last line (a run killed mid-write) is dropped with a warning; a damaged line
        before the last one raises :class:`RunError` naming the file and line.
        """
        path = self.folder / "metrics.jsonl"
        if not (self.active and path.exists()):
            return
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        keep = []
        for i, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                record_step = record["step"]
            except (ValueError, KeyError, TypeError):
                if i == len(lines):
                    warnings.warn(
                        f"{path}: dropped a torn last line (line {i}) left by an interrupted run", stacklevel=2
                    )
                    continue
                raise RunError(f"{path}: line {i} is damaged ({line[:60]!r}); the log cannot be resumed") from None
            if record_step <= step:
                keep.append(line)
        atomic_write(path, "".join(line + "\n" for line in keep))

    def save(self, name: str, obj: dict[str, Any]) -> None:
        """Save a checkpoint atomically; ``last.pt`` moves to ``prev.pt`` first (a fallback for resume)."""
        if not self.active:
            return
        log = self.folder / "metrics.jsonl"
        if log.exists():  # the log up to this checkpoint is durable before the checkpoint is
            with open(log, "rb+") as f:
                os.fsync(f.fileno())
        tmp = self.folder / f".{name}.tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        target = self.folder / name
        if name == "last.pt" and target.exists():
            os.replace(target, self.folder / "prev.pt")
        os.replace(tmp, target)
        _fsync_dir(self.folder)

    def json(self, name: str, obj: dict[str, Any]) -> None:
        if self.active:
            atomic_write(self.folder / name, json.dumps(obj, indent=2) + "\n")


def _load_checkpoint(folder: Path) -> dict[str, Any] | None:
    """The newest readable of ``last.pt`` and ``prev.pt`` (a warning names a damaged one), or ``None``."""
    damaged = []
    for name in ("last.pt", "prev.pt"):
        path = folder / name
        if not path.exists():
            continue
        try:
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
            if not isinstance(ckpt, dict) or not {"model", "optimizer", "scheduler", "rng", "step"} <= set(ckpt):
                raise ValueError("not a runner checkpoint")
        except Exception as e:  # noqa: BLE001 -- any unreadable file: fall back, naming it
            damaged.append(path)
            warnings.warn(
                f"{path} is damaged ({type(e).__name__}: {str(e)[:80]}); trying an older checkpoint", stacklevel=2
            )
            continue
        return ckpt
    if damaged:
        warnings.warn(
            f"{folder}: no readable checkpoint ({', '.join(p.name for p in damaged)}); starting over", stacklevel=2
        )
    return None


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
    if resume and final_path.exists():
        try:
            return json.loads(final_path.read_text(encoding="utf-8"))
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
    ckpt = _load_checkpoint(folder) if resume else None
    if ckpt is not None:
        raw.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        sched.load_state_dict(ckpt["scheduler"])
        _set_rng_state(ckpt["rng"])
        step, best, best_step, elapsed = ckpt["step"], ckpt["best"], ckpt["best_step"], ckpt["elapsed"]
        out.truncate_after(step)
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
                    out.save("best.pt", {"model": raw.state_dict(), "step": step, "metrics": metrics})
                out.save(
                    "last.pt",
                    {
                        "model": raw.state_dict(),
                        "optimizer": opt.state_dict(),
                        "scheduler": sched.state_dict(),
                        "rng": _rng_state(),
                        "step": step,
                        "best": best,
                        "best_step": best_step,
                        "elapsed": time.perf_counter() - start,
                    },
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
        "best": {"step": best_step, task.metric: sign * best},
        "seconds": round(time.perf_counter() - start, 2),
        "params": sum(p.numel() for p in raw.parameters()),
    }
    out.json("final.json", final)
    if ddp.enabled:
        dist.barrier()
    return final
