"""The trainer's checkpoint: everything a restart needs to go on as if it had not stopped, written atomically.

A checkpoint holds the policy, the optimizer, the learner's step, the stream position ``up_to`` of the last
batch the policy learned from, the version last published, whether the warm-up is done, the frozen
reference (when a KL term uses one), the loop's counters and the groups learned from since the last
ack. The loop acks the stream only up to a
position a checkpoint on disk already holds: after a crash the farm resends what came after it, and the
restored policy never learned from that, so nothing is lost and nothing is learned from twice.

The file is ``torch.save`` of plain values, tensors and policy blobs (``farm_client.tinylm.save``), read
back with ``weights_only=True``: loading a checkpoint never runs code from it.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

__all__ = ["FORMAT", "Checkpoint", "CheckpointError", "read", "write"]

FORMAT = "farm-trainer-checkpoint/1"


class CheckpointError(ValueError):
    """A file that is not a checkpoint this trainer wrote."""


@dataclass
class Checkpoint:
    model: bytes
    """The policy (``farm_client.tinylm.save``)."""
    learner: dict[str, Any]
    """``GRPOLearner.state_dict()``: the optimizer's state and the step count."""
    up_to: int = 0
    """The stream position of the last batch the policy learned from (or skipped as already learned)."""
    policy_version: int = 0
    warmed_up: bool = False
    reference: bytes | None = None
    """The frozen reference policy of the KL term, when there is one."""
    counters: dict[str, int] = field(default_factory=dict)
    recent_groups: list[int] = field(default_factory=list)
    """Groups learned from after the last position the farm had acked when this was written: after a
    restart the farm resends from that ack, and may cut its batches differently (a batch that straddles
    ``up_to``), so these groups are left out of any batch that comes again."""


def write(path: str | Path, checkpoint: Checkpoint) -> None:
    """Write ``checkpoint`` to ``path`` atomically: a temporary file beside it, fsynced, renamed over it,
    and the directory fsynced, so ``path`` is always the old checkpoint or the whole new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    torch.save({"format": FORMAT, "model": checkpoint.model, "learner": checkpoint.learner,
                "up_to": int(checkpoint.up_to), "policy_version": int(checkpoint.policy_version),
                "warmed_up": bool(checkpoint.warmed_up), "reference": checkpoint.reference,
                "counters": {k: int(v) for k, v in checkpoint.counters.items()},
                "recent_groups": [int(g) for g in checkpoint.recent_groups]}, buf)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as f:
            f.write(buf.getbuffer())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read(path: str | Path) -> Checkpoint | None:
    """The checkpoint at ``path``, or None when there is none; ``CheckpointError`` for a file that is not one."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        data: Any = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated, not a torch file, not plain values
        raise CheckpointError(f"{path}: not a checkpoint torch can read safely: {type(exc).__name__}: {exc}"
                              ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a {FORMAT} file")
    try:
        return Checkpoint(model=bytes(data["model"]), learner=dict(data["learner"]), up_to=int(data["up_to"]),
                          policy_version=int(data["policy_version"]), warmed_up=bool(data["warmed_up"]),
                          reference=None if data["reference"] is None else bytes(data["reference"]),
                          counters={str(k): int(v) for k, v in data["counters"].items()},
                          recent_groups=[int(g) for g in data["recent_groups"]])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: a field is missing or malformed: {exc}") from None
