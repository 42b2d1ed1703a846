"""The trainer's metrics log: one JSON object per line, appended (``metrics.jsonl`` in the checkpoint dir), and
the same numbers where TRL users look for them (``report_to``): TensorBoard event files in ``runs/`` beside it,
and a Weights & Biases run when ``wandb`` is installed. Each number of a record is a scalar named
``KIND/FIELD`` (``step/loss``; an evaluation's ``eval/ENV/pass_rate``; a mapping's entries ``KIND/FIELD/KEY``,
as ``step/pass_rate_by_level/1``), at the record's ``learner_step``. The JSON lines are always written: the
``make run`` display and the report read them.

A reader (the ``make run`` display, a learning-curve plot) reads it line by line; a restarted trainer
appends to the same file, so ``elapsed_s`` restarts and ``time`` does not. Every record has:

- ``kind``: ``"warmup"``, ``"publish"``, ``"step"``, ``"eval"`` or ``"checkpoint"``.
- ``time``: seconds since the epoch (wall clock) when it was written.
- ``elapsed_s``: seconds since this trainer process started.
- ``policy_version``: the newest version this trainer has published (0 before the first).
- ``learner_step``: GRPO optimizer steps taken so far (``updates_per_batch`` per batch used).
- ``trajectories``: trajectories learned from so far (those of learner batches, zero-variance groups
  included; trajectories skipped or left out, and those gathered but not yet learned from, do not count).

``kind: "warmup"`` (once, before any RL): ``steps``, ``accuracy`` (greedy, on a slice of the reference
pairs), ``target_accuracy``, ``loss`` (last step's NLL per answer token), ``pairs``, ``levels``,
``seconds``, ``reached`` (the target was reached before the step limit).

``kind: "publish"``: ``version``, ``sha256``, ``size`` (bytes), ``reason`` (``"warmup"``: the warmed-up
policy, before any RL; ``"resume"``: the checkpoint's policy, published again on a restart; ``"step"``:
after a batch changed the model); on ``warmup`` and ``resume`` also ``farm_newest``, the version the farm's
line runs after it (another than ``version`` when the farm already held this content as an older
version: it then keeps sampling the newer one).

``kind: "step"`` (one per learner batch: stream batches gathered until ``batch_size`` trajectories):

- ``up_to``: the stream position of the batch's last stream batch (what its ack moves the cursor to).
- ``stream_batches``: stream batches gathered into it.
- ``batch_trajectories``: trajectories received in them; ``ignored``: those left out before anything else
  (outside the subscription's agent and environments, or of groups a restored checkpoint had already
  learned from); ``rows``: those trained on; ``untokenized``: scored ones without token ids or logprobs
  (no row).
- ``groups``, ``groups_used``, ``groups_dropped``: groups in the batch, trained on, left out (every
  reward equal, so no signal; or no trajectory of it with a row).
- ``pass_rate``: share of the batch's scored trajectories that passed (sampled at the training
  temperature: the *training* pass rate); ``pass_rate_by_level``: the same per difficulty level
  (keys are the levels as strings, ``"1"``, ``"2"``, ...); ``reward_mean``.
- ``staleness_mean``, ``staleness_max``: the newest published version minus each trajectory's
  ``policy_version``, over the batch (at the time the batch was received).
- ``updates``: learner steps taken on it; ``seconds``: time they took.
- The learner's metrics, the mean over the batch's updates: ``loss``, ``policy_loss``, ``clip_fraction``,
  ``approx_kl`` (to the sampling policy), ``ref_kl`` (only with a KL coefficient), ``grad_norm``,
  ``tokens``.

``kind: "eval"``: ``env``, ``agent``, ``pass_rate`` (mean over levels), ``pass_rate_by_level`` (keys as
strings; a level with no scored trajectory is null), ``eval_policy_version`` (the version most of its
trajectories carried), ``eval_policy_versions`` (version as string -> count), ``eval_trajectories``,
``errors``, ``failed``, ``seconds``, ``final`` (the evaluation after the time budget), ``bank_level``
(the task bank's level of the first training environment when it was read, null if unknown).

``kind: "checkpoint"``: ``up_to`` (the position saved, then acked), ``path``, ``seconds``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import math
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

__all__ = ["REPORTERS", "MetricsLog", "report_to"]

log = logging.getLogger("farm_trainer")

REPORTERS = ("tensorboard", "wandb")
"""Where the metrics may go besides the JSON lines, by TRL's ``report_to`` names."""


def _plain(value: Any) -> Any:
    """JSON-safe: non-finite floats become null (JSON has no NaN), mapping keys strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def report_to(value: str) -> tuple[str, ...]:
    """``report_to`` as TRL takes it: ``"all"`` (TensorBoard, and W&B when ``wandb`` is installed), ``"none"``,
    or names from ``REPORTERS`` joined by commas. ValueError for an unknown name, or one not installed."""
    names = [n.strip() for n in value.split(",") if n.strip()]
    if names == ["all"]:
        return tuple(n for n in REPORTERS if _installed(n))
    if names in ([], ["none"]):
        return ()
    unknown = [n for n in names if n not in REPORTERS]
    if unknown:
        raise ValueError(f"report_to takes all, none or some of {', '.join(REPORTERS)}; not {', '.join(unknown)}")
    missing = [n for n in names if not _installed(n)]
    if missing:
        raise ValueError(f"report_to names {', '.join(missing)}, which is not installed (pip install "
                         f"{' '.join(missing)})")
    return tuple(dict.fromkeys(names))


def _scalars(prefix: str, fields: dict[str, Any]) -> Iterator[tuple[str, float]]:
    for key, value in fields.items():
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, int | float):
            yield f"{prefix}/{key}", float(value)
        elif isinstance(value, dict):
            yield from _scalars(f"{prefix}/{key}", value)


class _Reporter(Protocol):
    def write(self, tag_prefix: str, step: int, fields: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


class _TensorBoard:
    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # imports tensorboard: only when asked for

        self._writer = SummaryWriter(log_dir=str(log_dir), flush_secs=10)

    def write(self, tag_prefix: str, step: int, fields: dict[str, Any]) -> None:
        for tag, value in _scalars(tag_prefix, fields):
            self._writer.add_scalar(tag, value, step)

    def close(self) -> None:
        self._writer.close()


class _WandB:
    def __init__(self, directory: Path, config: dict[str, Any]) -> None:
        import wandb

        # The project from WANDB_PROJECT as W&B's own tools take it. The run's id is its directory's: a trainer
        # restarted on the same --dir goes on with its run, as it goes on from its checkpoint there.
        run_id = hashlib.sha256(str(directory.resolve()).encode()).hexdigest()[:16]
        self._run = wandb.init(project=os.environ.get("WANDB_PROJECT", "farm"), dir=str(directory),
                               config=config, id=run_id, resume="allow")

    def write(self, tag_prefix: str, step: int, fields: dict[str, Any]) -> None:
        self._run.log({**dict(_scalars(tag_prefix, fields)), "learner_step": step})

    def close(self) -> None:
        self._run.finish()


class MetricsLog:
    """Appends records to ``path`` (its directory is made); each line is flushed as it is written. ``reporters``:
    of ``REPORTERS``, where the numbers go too (TensorBoard in ``runs/`` beside ``path``); one that cannot start
    is said on the log and left out, never the training's end. ``config``: the run's settings, for W&B."""

    def __init__(self, path: str | Path, reporters: Sequence[str] = (), config: dict[str, Any] | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic()
        self._file = self.path.open("a", encoding="utf-8")
        self._reporters: list[_Reporter] = []
        for name in reporters:
            try:
                self._reporters.append(_TensorBoard(self.path.parent / "runs") if name == "tensorboard"
                                       else _WandB(self.path.parent, _plain(config or {})))
            except Exception as exc:  # a reporter's own failure (no login, no disk) is not the trainer's
                log.warning("metrics: %s does not start (%s); they go to %s only", name, exc, self.path)

    def write(self, kind: str, **fields: Any) -> dict[str, Any]:
        """Append one record of ``kind`` with ``fields`` (after ``time`` and ``elapsed_s``); returns it."""
        record = {"kind": kind, "time": round(time.time(), 3),
                  "elapsed_s": round(time.monotonic() - self.started, 3), **_plain(fields)}
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._file.flush()
        if self._reporters:
            # An evaluation's numbers under its environment too: a trainer may evaluate on several.
            prefix = f"{kind}/{record['env']}" if kind == "eval" and isinstance(record.get("env"), str) else kind
            step = int(record.get("learner_step") or 0)
            numbers = {k: v for k, v in record.items() if k not in ("kind", "time", "learner_step")}
            for reporter in self._reporters:
                reporter.write(prefix, step, numbers)
        return record

    def close(self) -> None:
        self._file.close()
        for reporter in self._reporters:
            reporter.close()

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
