"""The trainer: warm up, publish, then learn from the farm's stream of scored groups and publish again.

    with FarmClient("127.0.0.1:7431") as farm:
        summary = Trainer(farm, TrainerConfig(checkpoint_dir="runs/tiny", time_budget_s=300)).run()

One batch, in order:

1. The stream (``FarmClient.batches``) carries whole groups of the subscription only: trajectories of the
   agent spec ``torch:NAME`` on the training environments, no staler than ``max_staleness`` versions.
2. Stream batches are gathered until ``batch_size`` trajectories are in hand (the farm sends what has
   finished, often less). ``collate`` makes token rows with group-relative advantages; groups whose
   rewards are all equal are left out (no signal). If rows are left, the learner takes
   ``updates_per_batch`` steps on them.
3. The changed policy is published under ``NAME`` (``publish_policy(save(model), name=NAME)``): the farm's
   ``torch:NAME`` jobs sample it from then on.
4. Every ``checkpoint_every_s`` (and at the end) the checkpoint is written, atomically, with the stream
   position of the last batch learned from, and only then is the stream acked up to that position.

On start the checkpoint is read if there is one: the warm-up is not done again, its policy is published
again (the farm may run a newer one the checkpoint never saw), and a batch the farm resends that the
checkpoint already covers (``up_to`` at or below its position) is acked without being learned from; a
batch that straddles the position has the groups the checkpoint learned from left out. Without a
checkpoint the policy is warmed up first (``farm_trainer.warmup``, on the reference's answers to training
tasks), checkpointed and published: that first version is what the farm's first rollouts sample.

Held-out evaluations (``farm_trainer.evaluate``) run through the farm at the start, every
``eval_every_s`` while training (without stopping it: queued, waited for and read back in a thread of its own,
``farm_trainer.background``, and recorded between batches) and after the time budget. Everything is logged to
the metrics file (fields: ``farm_trainer.metrics``).

The farm talks to the trainer only through the ``FarmClient`` it is given: ``run``/``get_run``/
``trajectory_pages`` (warm-up, evaluation), ``batches``/``ack`` (the stream), ``publish_policy`` and
``status``. Production is the farm's: its demand (``[scheduler] demand_agent = "torch:NAME"``,
``demand_envs``, ``demand_consumers``) keeps the stream fed; the trainer queues no training runs.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from farm_client import Batch, FarmClient
from farm_client.record import Trajectory
from farm_client.tensors import collate
from farm_client.tinylm import PAD, LMConfig, TinyLM, load, save

from farm_trainer import checkpoint
from farm_trainer.background import Background
from farm_trainer.evaluate import EvalResult, eval_agent, start_evaluation
from farm_trainer.grpo import GRPOConfig, GRPOLearner, Logprobs, default_device
from farm_trainer.metrics import MetricsLog
from farm_trainer.runs import RunsStopped, RunsTimeout
from farm_trainer.warmup import WarmupResult, reference_pairs, warm_up

__all__ = ["Trainer", "TrainerConfig"]

log = logging.getLogger("farm_trainer")

_COUNTERS = ("trajectories", "batches", "skipped_batches", "groups_used", "groups_dropped", "rows")


@dataclass(frozen=True, kw_only=True)
class TrainerConfig:
    """One trainer run. Times in seconds; the defaults are the FACTS.md recipe on farm's ``arith``."""

    addr: str = "127.0.0.1:7431"
    """The farm (what the CLI connects to; ``Trainer`` uses the client it is given)."""
    name: str = "tiny"
    """The policy line published to, and the stream's agent spec ``torch:NAME`` unless ``agent`` is set."""
    agent: str = ""
    """The subscription's agent spec, exactly as the farm queues it; "" is ``torch:NAME``."""
    envs: tuple[str, ...] = ("arith",)
    """The subscription's environments: training environments only."""
    consumer: str = "grpo"
    batch_size: int = 256
    """Trajectories per learner batch (256 is 32 groups of 8): stream batches are gathered until there are
    this many (the farm sends at most this many at once, fewer when fewer have finished)."""
    max_staleness: int = 2
    """The farm leaves out groups sampled more than this many versions before the newest (0: keep all)."""
    publish_every: int = 1
    """Publish after every this many batches that changed the policy."""
    checkpoint_dir: str = "farm-trainer"
    checkpoint_every_s: float = 10.0
    """At most this long between checkpoints (and so between acks); 0 checkpoints after every batch."""
    metrics_path: str = ""
    """"" is ``metrics.jsonl`` in ``checkpoint_dir``."""
    report_to: tuple[str, ...] = ()
    """Where the metrics go besides their JSON lines (``farm_trainer.metrics.REPORTERS``: TensorBoard, W&B)."""
    time_budget_s: float = 300.0
    """How long this process trains, warm-up included; the final checkpoint and evaluation come after."""
    seed: int = 0
    """The fresh policy's initial weights and the warm-up's batches."""
    lm: LMConfig = field(default_factory=LMConfig)
    """The fresh policy's sizes (a checkpoint's policy keeps its own)."""
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    warmup_env: str = "arith"
    warmup_levels: tuple[int, ...] = (1, 2)
    warmup_seeds: int = 1000
    """Reference answers per level: seeds 0 .. warmup_seeds - 1 of ``warmup_env``."""
    warmup_target: float = 0.15
    warmup_max_steps: int = 2000
    warmup_batch: int = 64
    warmup_lr: float = 1e-3
    eval_agent: str = ""
    """The agent spec of the held-out evaluation; "" is ``torch:NAME?temperature=0``."""
    eval_env: str = "arith:heldout"
    eval_levels: tuple[int, ...] = (1, 2)
    eval_seeds: int = 200
    eval_every_s: float = 60.0
    """0: evaluate only at the start and at the end."""
    eval_at_start: bool = True
    final_eval: bool = True
    eval_timeout_s: float = 300.0
    reconnect_s: float = 60.0
    """How long the stream and acks wait out a farmd restart."""
    progress_every_s: float = 5.0
    freeze_heap: bool = True
    """Once started, move what lives to the cyclic collector's permanent generation (``gc.freeze``: process-wide,
    and cyclic garbage among those objects is never collected): its full collections then walk only what came
    later."""

    def __post_init__(self) -> None:
        if not self.envs:
            raise ValueError("at least one training environment")
        if self.eval_env in self.envs or self.warmup_env == self.eval_env:
            raise ValueError(f"the evaluation environment {self.eval_env!r} must not be trained on (envs "
                             f"{list(self.envs)}, warm-up {self.warmup_env!r})")
        if self.batch_size < 1 or self.publish_every < 1:
            raise ValueError("batch_size and publish_every must be at least 1")
        if self.max_staleness < 0:
            raise ValueError("max_staleness must be >= 0")

    @property
    def agent_spec(self) -> str:
        return self.agent or f"torch:{self.name}"

    @property
    def checkpoint_path(self) -> Path:
        return Path(self.checkpoint_dir) / "checkpoint.pt"

    @property
    def metrics_file(self) -> Path:
        return Path(self.metrics_path) if self.metrics_path else Path(self.checkpoint_dir) / "metrics.jsonl"


class StreamEnded(Exception):
    """The stream ended (a farm's never does; a scripted client's may)."""


class _Stream:
    """The farm's batches, received in a thread, so that the loop keeps time while the stream waits.

    At most one batch waits here beyond the one being learned from. ``close`` lets the thread go: it ends
    when its stream next yields (or fails); the client's ``close`` ends it at once.
    """

    _END = object()

    def __init__(self, batches: Iterator[Batch]) -> None:
        self._batches = batches
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=1)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._pump, name="farm-trainer-stream", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        item: Any = self._END
        try:
            for batch in self._batches:
                if not self._put(batch):
                    return
        except BaseException as exc:  # handed to the loop, which raises it
            item = exc
        finally:
            # In this thread (a generator is closed where it runs): FarmClient.batches cancels its call, so the
            # farm stops counting this trainer as consuming.
            close = getattr(self._batches, "close", None)
            if close is not None:
                close()
        self._put(item)

    def _put(self, item: Any) -> bool:
        while not self._closed.is_set():
            try:
                self._queue.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def get(self, timeout_s: float) -> Batch | None:
        """The next batch; None when none came within ``timeout_s``. ``StreamEnded`` when the stream
        ended; the stream's error when it failed."""
        try:
            item = self._queue.get(timeout=max(0.0, timeout_s))
        except queue.Empty:
            return None
        if item is self._END:
            raise StreamEnded
        if isinstance(item, BaseException):
            raise item
        assert isinstance(item, Batch)
        return item

    def close(self) -> None:
        self._closed.set()


def _rate(rows: list[Trajectory]) -> float | None:
    scored = [t for t in rows if t.status == "ok"]
    return sum(t.passed for t in scored) / len(scored) if scored else None


def _mean(values: list[dict[str, float]]) -> dict[str, float]:
    keys = {k for v in values for k in v}
    return {k: sum(v[k] for v in values if k in v) / sum(k in v for v in values) for k in sorted(keys)}


class Trainer:
    """The loop of ``TrainerConfig`` over ``client``: ``run()`` until the time budget or ``stop()``."""

    def __init__(self, client: FarmClient, config: TrainerConfig | None = None) -> None:
        self.client = client
        self.config = config or TrainerConfig()
        self.device = default_device()
        self.model: Any = None
        """The policy: a ``TinyLM`` here; a subclass may hold another model (``farm_trainer.hf_loop``)."""
        self.learner: GRPOLearner | None = None
        self.position = 0
        """The stream position of the last batch learned from (or skipped as already learned)."""
        self.acked = 0
        """The position last acked (this process)."""
        self.version = 0
        """The version this trainer last published."""
        self.warmed_up = False
        self.counters: dict[str, int] = dict.fromkeys(_COUNTERS, 0)
        self.warmup: WarmupResult | None = None
        self.evals: list[EvalResult] = []
        self.metrics: MetricsLog | None = None
        self._stop = threading.Event()
        self._recent_groups: list[int] = []
        """Groups learned from since the last ack (what a checkpoint stores as ``recent_groups``)."""
        self._resent_groups: set[int] = set()
        """The restored checkpoint's ``recent_groups``: left out of resent batches until an ack passes them."""
        self._dirty = False
        """Learned past the last checkpoint."""
        self._unpublished = 0
        """Batches that changed the policy since it was last published."""
        self._gathered: list[Trajectory] = []
        """Trajectories received and kept, not yet learned from (``handle`` gathers up to ``batch_size``)."""
        self._gathered_received = 0
        self._gathered_batches = 0

    # -- control ----------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask ``run`` to finish after the batch in hand (from any thread or a signal handler)."""
        self._stop.set()

    def run(self) -> dict[str, Any]:
        """Start (resume or warm up), train until the time budget or ``stop()``, checkpoint, evaluate;
        returns the summary (``summary()``)."""
        started = time.monotonic()
        deadline = started + self.config.time_budget_s
        self.metrics = MetricsLog(self.config.metrics_file, self.config.report_to, dataclasses.asdict(self.config))
        try:
            self.start()
            if self.config.freeze_heap:
                # Everything that lives by now (torch's modules, the client, the policy) lives as long as the run:
                # out of the cyclic collector's way. Without this, each full collection walked it all (~170 ms,
                # collecting nothing) every ~2.8 s of the learning loop, and the farm waited out each one.
                gc.collect()
                gc.freeze()
            if self.config.eval_at_start:
                self._evaluate_now(final=False)
            self._train(deadline)
            self.save_checkpoint()
            if self.config.final_eval:
                self._evaluate_now(final=True)
            return self.summary(time.monotonic() - started)
        finally:
            self.metrics.close()

    # -- start ------------------------------------------------------------------------------------

    def start(self) -> None:
        """Restore the checkpoint if there is one, else make a fresh policy; warm it up unless it was;
        publish it."""
        cfg = self.config
        saved = checkpoint.read(cfg.checkpoint_path)
        if saved is not None:
            model = self.load_policy(saved.model)
            reference = self.load_policy(saved.reference) if saved.reference is not None else None
            self.position = self.acked = saved.up_to
            self.version = saved.policy_version
            self.warmed_up = saved.warmed_up
            self.counters.update(saved.counters)
            self._resent_groups = set(saved.recent_groups)
            self._recent_groups = list(saved.recent_groups)  # until an ack passes them, a crash resends them
            self.learner = GRPOLearner(model, cfg.grpo, reference, device=self.device, logprobs=self.logprobs())
            self.learner.load_state_dict(saved.learner)
            self.model = model
            log.info("resumed from %s: position %d, learner step %d, version %d", cfg.checkpoint_path,
                     self.position, self.learner.steps, self.version)
        else:
            self.model = self.fresh_policy()
        if not self.warmed_up:
            self._warm_up()
            # The reference of a KL term is the warmed-up policy: the learner is made after the warm-up.
            self.learner = GRPOLearner(self.model, cfg.grpo, device=self.device, logprobs=self.logprobs())
            self.warmed_up = True
            self.save_checkpoint()
            self.publish("warmup")
        else:
            self.publish("resume")

    # -- the policy's own kind: what a trainer of another model overrides ------------------------------

    def fresh_policy(self) -> Any:
        """A new policy (its initial weights from ``seed``), on the trainer's device."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.config.seed)
            return TinyLM(self.config.lm).to(self.device)

    def policy_bytes(self, model: Any) -> bytes:
        """``model`` as the bytes published to the farm and kept in the checkpoint."""
        return save(model)

    def load_policy(self, data: bytes) -> Any:
        return load(data, self.device)

    def logprobs(self) -> Logprobs | None:
        """How the learner computes the policy's logprobs (None: the tiny LM's own)."""
        return None

    def supervised(self, pairs: list[tuple[str, str]], progress: Callable[[int, float, float], None]
                   ) -> WarmupResult:
        """The warm-up's supervised steps on (prompt, answer) pairs, to the configured greedy accuracy."""
        cfg = self.config
        return warm_up(self.model, pairs, target_accuracy=cfg.warmup_target, max_steps=cfg.warmup_max_steps,
                       batch=cfg.warmup_batch, lr=cfg.warmup_lr, seed=cfg.seed, progress=progress)

    def pad_id(self) -> int:
        return PAD

    def max_length(self) -> int:
        return int(self.model.config.max_len)

    def eval_agent(self) -> str:
        return self.config.eval_agent or eval_agent(self.config.name)

    def _warm_up(self) -> None:
        cfg = self.config
        assert self.model is not None
        log.info("warm-up: reference answers on %s, levels %s, %d seeds each", cfg.warmup_env,
                 list(cfg.warmup_levels), cfg.warmup_seeds)
        pairs = reference_pairs(self.client, cfg.warmup_env, cfg.warmup_levels, cfg.warmup_seeds,
                                timeout_s=cfg.eval_timeout_s)

        def progress(step: int, loss: float, accuracy: float) -> None:
            log.info("warm-up step %d: loss %.3f, greedy accuracy %.3f", step, loss, accuracy)

        result = self.supervised(pairs, progress)
        self.warmup = result
        self._record("warmup", steps=result.steps, accuracy=result.accuracy, target_accuracy=cfg.warmup_target,
                     loss=result.loss, pairs=result.pairs, levels=list(cfg.warmup_levels),
                     seconds=round(result.seconds, 3), reached=result.reached)
        log.info("warm-up done: %d steps, greedy accuracy %.3f (target %.2f), %.1f s", result.steps,
                 result.accuracy, cfg.warmup_target, result.seconds)

    # -- the loop ---------------------------------------------------------------------------------

    def _train(self, deadline: float) -> None:
        cfg = self.config
        stream = _Stream(self.client.batches(cfg.consumer, cfg.batch_size, whole_groups=True,
                                             max_staleness=cfg.max_staleness, agent=cfg.agent_spec,
                                             envs=cfg.envs, reconnect_s=cfg.reconnect_s, tokens_only=True))
        pending: Background[tuple[EvalResult, int | None]] | None = None
        last_eval = last_checkpoint = last_progress = time.monotonic()
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if now >= deadline:
                    break
                if pending is not None and pending.ready():
                    self._take_eval(pending)
                    pending = None
                if pending is None and cfg.eval_every_s > 0 and now - last_eval >= cfg.eval_every_s:
                    pending = Background(self._evaluate_in_background, name="farm-trainer-eval")
                    last_eval = now
                try:
                    batch = stream.get(min(1.0, deadline - now))
                except StreamEnded:
                    break
                if batch is not None:
                    record = self.handle(batch)
                    if record and now - last_progress >= cfg.progress_every_s:
                        self._say(record)
                        last_progress = now
                if self._dirty and time.monotonic() - last_checkpoint >= cfg.checkpoint_every_s:
                    self.save_checkpoint()
                    last_checkpoint = time.monotonic()
        finally:
            stream.close()
        if self._unpublished:
            self.publish("step")
        if pending is not None and pending.ready():
            self._take_eval(pending)
        elif pending is not None:  # the final evaluation supersedes it
            pending.cancel()

    def handle(self, batch: Batch) -> dict[str, Any] | None:
        """Take one stream batch: skip it when the checkpoint already covers it, else gather its rows; once
        ``batch_size`` trajectories are gathered, learn from them. Returns the step's metrics record when it
        learned, else None.

        The farm sends what has finished, at least one group and at most ``batch_size`` trajectories, so a
        trainer faster than its farm receives small batches: gathering them keeps every learner step on
        ``batch_size`` trajectories (32 groups of 8 by default), as the recipe measured, instead of many
        noisy steps on a group or two.
        """
        cfg = self.config
        if batch.up_to <= self.position:
            # Learned from before a restart; the checkpoint holds it, so acking it loses nothing.
            self.counters["skipped_batches"] += 1
            self.acked = self.client.ack(batch, retry_s=cfg.reconnect_s)
            log.info("skipped batch up to %d: the checkpoint (position %d) learned from it", batch.up_to,
                     self.position)
            return None
        ours = [t for t in batch.trajectories if t.agent == cfg.agent_spec and t.env in cfg.envs]
        if len(ours) < len(batch.trajectories):  # the farm filters; this keeps evaluation data out regardless
            log.warning("batch up to %d: %d trajectories outside the subscription (%s on %s) left out",
                        batch.up_to, len(batch.trajectories) - len(ours), cfg.agent_spec, list(cfg.envs))
        self._gathered.extend(t for t in ours if t.group_id not in self._resent_groups)
        self._gathered_received += len(batch.trajectories)
        self._gathered_batches += 1
        if len(self._gathered) < cfg.batch_size:
            return None
        # Only now does the position move: what was gathered but not learned from is never acked.
        rows, self._gathered = self._gathered, []
        record = self.learn(rows, batch.up_to, received=self._gathered_received, stream_batches=self._gathered_batches)
        self._gathered_received = self._gathered_batches = 0
        self.position = batch.up_to
        self._dirty = True
        if record["updates"]:
            self._unpublished += 1
            if self._unpublished >= cfg.publish_every:
                self.publish("step")
        return record

    def learn(self, rows: list[Trajectory], up_to: int, *, received: int | None = None,
              stream_batches: int = 1) -> dict[str, Any]:
        """Collate ``rows`` (whole groups), drop the groups without signal, take the learner's steps on the
        rest; records and returns the ``step`` metrics."""
        cfg, learner = self.config, self.learner
        assert learner is not None and self.model is not None
        started = time.monotonic()
        staleness = [self.version - t.policy_version for t in rows]
        tensors = collate(rows, pad_id=self.pad_id(), max_length=self.max_length(),
                          skip_equal_rewards=cfg.grpo.drop_zero_variance, skip_untokenized=True,
                          eps=cfg.grpo.adv_eps)
        groups = {t.group_id for t in rows}
        used = set(tensors.group_ids.tolist())
        steps: list[dict[str, float]] = []
        if len(tensors):
            for _ in range(cfg.grpo.updates_per_batch):
                steps.append(learner.step(tensors.input_ids, tensors.loss_mask, tensors.logprobs,
                                          tensors.advantages))
        self._recent_groups.extend(sorted(used))
        by_level: dict[int, list[Trajectory]] = {}
        for t in rows:
            by_level.setdefault(t.difficulty, []).append(t)
        for key, n in (("trajectories", len(rows)), ("batches", 1), ("groups_used", len(used)),
                       ("groups_dropped", len(groups) - len(used)), ("rows", len(tensors))):
            self.counters[key] += n
        return self._record(
            "step", up_to=up_to, stream_batches=stream_batches,
            batch_trajectories=len(rows) if received is None else received,
            ignored=0 if received is None else received - len(rows), rows=len(tensors), groups=len(groups), groups_used=len(used), groups_dropped=len(groups) - len(used),
            untokenized=sum(t.status == "ok" and not t.has_tokens for t in rows),
            pass_rate=_rate(rows), pass_rate_by_level={k: _rate(v) for k, v in sorted(by_level.items())},
            reward_mean=sum(t.reward for t in rows) / len(rows) if rows else None,
            staleness_mean=sum(staleness) / len(staleness) if staleness else None,
            staleness_max=max(staleness, default=None), updates=len(steps),
            seconds=round(time.monotonic() - started, 4), **_mean(steps))

    # -- publishing, checkpoints, evaluation ------------------------------------------------------

    def publish(self, reason: str) -> dict[str, Any]:
        """Publish the policy as ``name``; records and returns the farm's answer.

        On start (``warmup``, ``resume``) it also asks which version the line now runs: content the farm
        already holds keeps its old version number and becomes the line's current version again (what was
        published after it becomes a dropped branch). Should the farm answer otherwise (another trainer
        publishing to the same line), that is said loudly and recorded (``farm_newest``), not silently wrong.
        """
        assert self.model is not None
        info = self.client.publish_policy(self.policy_bytes(self.model), name=self.config.name)
        self.version = int(info["version"])
        self._unpublished = 0
        extra: dict[str, Any] = {}
        if reason in ("warmup", "resume"):
            newest = self.client.get_policy(name=self.config.name)[0]
            extra["farm_newest"] = newest
            if newest != self.version:
                log.warning("published %s as version %d of %r, but the farm runs version %d (is another "
                            "trainer publishing to this line?); rollouts sample version %d until the next publish",
                            reason, self.version, self.config.name, newest, newest)
        self._record("publish", version=self.version, sha256=info.get("sha256", ""), size=info.get("size", 0),
                     reason=reason, **extra)
        return info

    def save_checkpoint(self) -> None:
        """Write the checkpoint, then ack the stream up to its position (in that order)."""
        assert self.model is not None and self.learner is not None
        started = time.monotonic()
        checkpoint.write(self.config.checkpoint_path, checkpoint.Checkpoint(
            model=self.policy_bytes(self.model), learner=self.learner.state_dict(), up_to=self.position,
            policy_version=self.version, warmed_up=self.warmed_up,
            reference=self.policy_bytes(self.learner.reference) if self.learner.reference is not None else None,
            counters=dict(self.counters), recent_groups=list(self._recent_groups)))
        self._dirty = False
        if self.position > self.acked:
            self.acked = self.client.ack(self.config.consumer, self.position, whole_groups=True,
                                         retry_s=self.config.reconnect_s)
            self._recent_groups.clear()
            self._resent_groups.clear()  # the farm's cursor is past every batch they could come in again
        self._record("checkpoint", up_to=self.position, path=str(self.config.checkpoint_path),
                     seconds=round(time.monotonic() - started, 4))

    def _evaluate_in_background(self, stop: threading.Event) -> tuple[EvalResult, int | None]:
        """An evaluation while training, queued, waited for and read back in a thread of its own (``Background``):
        in lockstep the farm samples nothing while this loop is away from the stream, and polling the runs (every
        second) and reading 300 results back on it held steps up."""
        cfg = self.config
        result = start_evaluation(self.client, cfg.name, cfg.eval_env, cfg.eval_levels, cfg.eval_seeds,
                                  agent=self.eval_agent()).wait(cfg.eval_timeout_s, stop=stop)
        return result, self._bank_level()

    def _take_eval(self, done: Background[tuple[EvalResult, int | None]]) -> None:
        try:
            result, level = done.result()
        except (RunsTimeout, RunsStopped) as exc:
            log.warning("evaluation did not finish: %s", exc)
            return
        self._record_eval(result, final=False, bank_level=level)

    def _evaluate_now(self, *, final: bool) -> EvalResult | None:
        cfg = self.config
        try:
            result = start_evaluation(self.client, cfg.name, cfg.eval_env, cfg.eval_levels,
                                      cfg.eval_seeds, agent=self.eval_agent()).wait(cfg.eval_timeout_s)
        except RunsTimeout as exc:
            log.warning("evaluation did not finish: %s", exc)
            return None
        self._record_eval(result, final=final, bank_level=self._bank_level())
        return result

    def _record_eval(self, result: EvalResult, *, final: bool, bank_level: int | None) -> None:
        """``bank_level``: the task bank's level when the result came (None: the farm did not say)."""
        self.evals.append(result)
        self._record("eval", env=result.env, agent=result.agent, pass_rate=result.overall,
                     pass_rate_by_level=result.pass_rate, eval_policy_version=result.policy_version,
                     eval_policy_versions=result.policy_versions, eval_trajectories=result.trajectories,
                     errors=result.errors, failed=result.failed, seconds=round(result.seconds, 3), final=final,
                     bank_level=bank_level)
        levels = ", ".join(f"L{k} {'-' if v is None else f'{v:.3f}'}" for k, v in result.pass_rate.items())
        log.info("eval%s on %s, version %d: %s", " (final)" if final else "", result.env, result.policy_version,
                 levels)

    def _bank_level(self) -> int | None:
        try:
            return int(self.client.status()["bank"]["envs"][self.config.envs[0]]["level"])
        except (KeyError, TypeError, ValueError):
            return None

    # -- records ----------------------------------------------------------------------------------

    def _record(self, kind: str, **fields: Any) -> dict[str, Any]:
        base = {"policy_version": self.version, "learner_step": self.learner.steps if self.learner else 0,
                "trajectories": self.counters["trajectories"]}
        record = {"kind": kind, **base, **fields}
        if self.metrics is not None:
            return self.metrics.write(kind, **base, **fields)
        return record

    @staticmethod
    def _say(record: dict[str, Any]) -> None:
        levels = " ".join(f"L{k} {v:.2f}" for k, v in record["pass_rate_by_level"].items() if v is not None)
        log.info("step %d v%d: %d trajectories, pass %s (%s), groups %d/%d, staleness %s, loss %s, "
                 "approx_kl %s, clip %s", record["learner_step"], record["policy_version"],
                 record["trajectories"], _fmt(record["pass_rate"]), levels, record["groups_used"],
                 record["groups"], _fmt(record["staleness_mean"]), _fmt(record.get("loss")),
                 _fmt(record.get("approx_kl")), _fmt(record.get("clip_fraction")))

    def summary(self, seconds: float) -> dict[str, Any]:
        """What the run did: counters, the warm-up, the first and last evaluations."""

        def plain(result: EvalResult | None) -> dict[str, Any] | None:
            if result is None:
                return None
            return {"pass_rate": result.overall, "pass_rate_by_level": {str(k): v for k, v in result.pass_rate.items()},
                    "policy_version": result.policy_version}

        warm = self.warmup
        return {"policy_version": self.version, "learner_step": self.learner.steps if self.learner else 0,
                **self.counters, "position": self.position, "seconds": round(seconds, 3),
                "warmup": None if warm is None else {"steps": warm.steps, "accuracy": warm.accuracy,
                                                     "seconds": round(warm.seconds, 3)},
                "first_eval": plain(self.evals[0] if self.evals else None),
                "last_eval": plain(self.evals[-1] if self.evals else None),
                "checkpoint": str(self.config.checkpoint_path), "metrics": str(self.config.metrics_file)}


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)

