"""farm_trainer: the reference GRPO trainer of a farm, built on ``farm_client`` alone (never farmd).

- ``farm_trainer.grpo``: ``GRPOConfig``, ``GRPOLearner`` (the loss and the optimizer; no farm).
- ``farm_trainer.warmup``: the reference's answers to training tasks, and the supervised warm-up.
- ``farm_trainer.evaluate``: greedy held-out evaluation through the farm.
- ``farm_trainer.loop``: ``Trainer`` / ``TrainerConfig``: stream, learn, publish, checkpoint, ack.
- ``farm_trainer.metrics``: the metrics log (one JSON object per line) and its fields.
- ``python -m farm_trainer``: the command line.
"""

from farm_trainer.grpo import GRPOConfig, GRPOLearner
from farm_trainer.loop import Trainer, TrainerConfig

__all__ = ["GRPOConfig", "GRPOLearner", "Trainer", "TrainerConfig"]
