"""The trainer's metrics log: one JSON object per line, appended (``metrics.jsonl`` in the checkpoint dir).

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

import json
import math
import time
from pathlib import Path
from typing import Any

__all__ = ["MetricsLog"]


def _plain(value: Any) -> Any:
    """JSON-safe: non-finite floats become null (JSON has no NaN), mapping keys strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


class MetricsLog:
    """Appends records to ``path`` (its directory is made); each line is flushed as it is written."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic()
        self._file = self.path.open("a", encoding="utf-8")

    def write(self, kind: str, **fields: Any) -> dict[str, Any]:
        """Append one record of ``kind`` with ``fields`` (after ``time`` and ``elapsed_s``); returns it."""
        record = {"kind": kind, "time": round(time.time(), 3),
                  "elapsed_s": round(time.monotonic() - self.started, 3), **_plain(fields)}
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._file.flush()
        return record

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
