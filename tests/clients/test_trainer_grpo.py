"""farm_trainer without a farm: the GRPO loss, a short run that learns, checkpoints, and the loop's skip, ack
and publish order against a scripted client."""

from __future__ import annotations

import copy
import json
import math
import random
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from farm_client import Batch
from farm_client.record import PosedTask, Trajectory, Turn
from farm_client.tinylm import EOS, LMConfig, TinyLM, load, sample, save, sequence_logprobs
from farm_trainer import checkpoint
from farm_trainer.__main__ import config_from_args, parser
from farm_trainer.evaluate import evaluate
from farm_trainer.grpo import GRPOConfig, GRPOLearner, clipped_objective
from farm_trainer.loop import Trainer, TrainerConfig
from farm_trainer.warmup import reference_pairs, warm_up

CPU = torch.device("cpu")
SMALL = LMConfig(d_model=32, n_layers=1, n_heads=2, max_len=12)


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def model(config: LMConfig = SMALL, seed: int = 0) -> TinyLM:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return TinyLM(config)


def rows(m: TinyLM, completions: Sequence[str], prompt: str = "1+2=") -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded (input_ids, loss_mask) of ``prompt`` and each completion then eos."""
    tok = m.tokenizer
    seqs = [(tok.prompt(prompt), [*tok.encode(c), EOS]) for c in completions]
    width = max(len(p) + len(c) for p, c in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width)
    for b, (p, c) in enumerate(seqs):
        ids[b, :len(p) + len(c)] = torch.tensor(p + c)
        mask[b, len(p):len(p) + len(c)] = 1.0
    return ids, mask


def grads(m: TinyLM) -> list[torch.Tensor]:
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in m.parameters()]


# -- the loss ---------------------------------------------------------------------------------------


def test_the_loss_is_the_clipped_objective_by_hand() -> None:
    new = torch.tensor([[0.0, -1.0, -2.0, -3.0], [0.0, -1.0, -2.0, 5.0]])
    old = torch.tensor([[0.0, -1.1, -2.5, 0.0], [0.0, -0.5, -2.3, 0.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 1.0, 0.0]])
    adv = torch.tensor([1.0, -2.0])
    loss, clip_fraction = clipped_objective(new, old, adv, mask, 0.2)
    # Row 0 (A = 1): r = e^0.1 inside the range: r * A; r = e^0.5 above it: min(r, 1.2) * A = 1.2.
    # Row 1 (A = -2): r = e^-0.5 below it: min(-2r, -1.6) = -1.6; r = e^0.3 above it: min(-2r, -2.4) = -2r.
    terms = [math.exp(0.1), 1.2, -1.6, -2 * math.exp(0.3)]
    assert float(loss) == pytest.approx(-sum(terms) / 4, abs=1e-6)
    assert float(clip_fraction) == pytest.approx(3 / 4)  # e^0.5, e^-0.5, e^0.3 are outside [0.8, 1.2]


def test_at_ratio_one_the_gradient_is_the_policy_gradient() -> None:
    m = model()
    learner = GRPOLearner(m, GRPOConfig(), device=CPU)
    ids, mask = rows(m, ["3", "12", "-7", "4"])
    adv = torch.tensor([1.0, -0.5, 2.0, -1.5])
    old = sequence_logprobs(m, ids).detach()
    loss, metrics = learner.loss(ids, mask, old, adv)
    m.zero_grad()
    loss.backward()
    got = grads(m)
    m.zero_grad()
    new = sequence_logprobs(m, ids)
    (-(adv[:, None] * new * mask).sum() / mask.sum()).backward()
    for a, b in zip(got, grads(m), strict=True):
        torch.testing.assert_close(a, b)
    assert metrics["clip_fraction"] == 0.0 and metrics["approx_kl"] == pytest.approx(0.0, abs=1e-7)
    assert metrics["tokens"] == float(mask.sum())


def test_rows_with_zero_advantage_contribute_nothing() -> None:
    m = model()
    learner = GRPOLearner(m, GRPOConfig(), device=CPU)
    adv = torch.tensor([1.0, 0.0])

    def gradient(second: str, shift: float) -> tuple[float, list[torch.Tensor]]:
        ids, mask = rows(m, ["5", second])
        old = sequence_logprobs(m, ids).detach()
        old[1] += shift  # the zero-advantage row's sampling logprobs: anything at all
        loss, _ = learner.loss(ids, mask, old, adv)
        m.zero_grad()
        loss.backward()
        return float(loss.detach()), grads(m)

    loss_a, a = gradient("1", 0.0)
    loss_b, b = gradient("8", -0.7)  # another completion of the same length, other logprobs
    assert loss_a == pytest.approx(loss_b, abs=1e-7)
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y)


def test_the_kl_term_is_zero_against_itself_and_positive_against_another_policy() -> None:
    m = model()
    ids, mask = rows(m, ["3", "12"])
    adv = torch.tensor([1.0, -1.0])
    old = sequence_logprobs(m, ids).detach()
    same = GRPOLearner(m, GRPOConfig(kl_coef=0.1), copy.deepcopy(m), device=CPU)
    _, metrics = same.loss(ids, mask, old, adv)
    assert metrics["ref_kl"] == 0.0
    other = GRPOLearner(m, GRPOConfig(kl_coef=0.1), model(seed=1), device=CPU)
    _, metrics = other.loss(ids, mask, old, adv)
    assert metrics["ref_kl"] > 0
    assert metrics["loss"] == pytest.approx(metrics["policy_loss"] + 0.1 * metrics["ref_kl"], rel=1e-5)
    _, plain = GRPOLearner(m, GRPOConfig(), device=CPU).loss(ids, mask, old, adv)
    assert "ref_kl" not in plain  # no KL asked: no reference forward pass at all


# -- a short run that learns -------------------------------------------------------------------------


class ScriptedFarm:
    """What ``Trainer`` calls on a ``FarmClient``, scripted: stream batches given up front, runs answered from
    ``answers`` (env, agent, seed, difficulty) -> (prompt, final, passed), and a record of every call."""

    def __init__(self, batches: Sequence[Batch] = (), answers: Any = None) -> None:
        self._batches = list(batches)
        self.answers = answers
        self.acks: list[int] = []
        self.published: list[tuple[str, bytes]] = []
        self.queued: list[dict[str, Any]] = []
        self.stream_kwargs: dict[str, Any] = {}
        self.calls: list[str] = []
        self.pages: list[tuple[str, bool]] = []
        """(agent, full) of each run whose trajectories were read."""

    def batches(self, consumer: str, batch_size: int = 64, **kwargs: Any) -> Iterator[Batch]:
        self.stream_kwargs = {"consumer": consumer, "batch_size": batch_size, **kwargs}
        yield from self._batches

    def ack(self, batch_or_consumer: Batch | str, up_to: int | None = None, whole_groups: bool = False,
            retry_s: float = 0.0) -> int:
        if isinstance(batch_or_consumer, Batch):
            up_to, whole_groups = batch_or_consumer.up_to, batch_or_consumer.whole_groups
        assert whole_groups and up_to is not None
        self.acks.append(up_to)
        self.calls.append(f"ack {up_to}")
        return up_to

    def publish_policy(self, policy: bytes, *, name: str = "") -> dict[str, Any]:
        self.published.append((name, policy))
        self.calls.append("publish")
        return {"version": 100 + len(self.published), "sha256": "0" * 64, "size": len(policy), "name": name}

    def get_policy(self, sha256: str = "", *, name: str = "") -> tuple[int, bytes, str]:
        self.calls.append("get_policy")
        return 100 + len(self.published), self.published[-1][1], ""

    def run(self, env: str, agent: str, rollouts: int = 0, group_size: int = 0, *, difficulty: int = 0,
            seeds: Sequence[int] = ()) -> dict[str, Any]:
        self.queued.append({"env": env, "agent": agent, "rollouts": rollouts, "group_size": group_size,
                            "difficulty": difficulty, "seeds": list(seeds)})
        return {"id": len(self.queued)}

    def get_run(self, run_id: int) -> dict[str, Any]:
        q = self.queued[run_id - 1]
        return {"id": run_id, "state": "succeeded", "jobs": q["rollouts"], "done": q["rollouts"], "failed": 0,
                "cancelled": 0, "passed": 0}

    def trajectory_pages(self, env: str = "", *, run_id: int = 0, full: bool = False,
                         **_: Any) -> Iterator[list[Trajectory]]:
        q = self.queued[run_id - 1]
        self.pages.append((q["agent"], full))
        page = []
        for seed in q["seeds"]:
            prompt, final, passed = self.answers(q["env"], q["agent"], seed, q["difficulty"])
            if not full:  # a summary: no task, no answer
                prompt = final = ""
            page.append(record(len(page) + 1000 * run_id, seed, 1.0 if passed else 0.0, env=q["env"],
                               agent=q["agent"], difficulty=q["difficulty"], prompt=prompt, final=final))
        yield page

    def status(self) -> dict[str, Any]:
        return {"bank": {"envs": {"arith": {"level": 2}}}}


def record(id: int, group: int, reward: float, *, prompt_ids: Sequence[int] = (), token_ids: Sequence[int] = (),
           logprobs: Sequence[float] = (), difficulty: int = 1, version: int = 101, env: str = "arith",
           agent: str = "torch:tiny", prompt: str = "", final: str = "") -> Trajectory:
    turns = [Turn(prompt_token_ids=list(prompt_ids), token_ids=list(token_ids), logprobs=list(logprobs),
                  has_logprobs=True, finish_reason="stop")] if token_ids else []
    return Trajectory(id=id, group_id=group, env=env, env_version="1", seed=group, difficulty=difficulty,
                      agent=agent, policy_version=version, reward=reward, passed=reward > 0, status="ok",
                      reasons=[], flags=[], verifier_version="1", task=PosedTask(prompt=prompt), final=final,
                      turns=turns)


def sampled_groups(m: TinyLM, groups: int, size: int, first_id: int, rng: random.Random,
                   right: str = "7") -> list[Trajectory]:
    """``groups`` groups of ``size`` completions of the model, each to a prompt of its own; reward 1 when the
    completion starts with ``right``: the toy task."""
    out: list[Trajectory] = []
    for g in range(groups):
        prompt = f"{rng.randrange(10)}+{rng.randrange(10)}="
        ids = m.tokenizer.prompt(prompt)
        done = sample(m, [ids] * size, max_new_tokens=2, temperature=1.0,
                      seeds=[rng.randrange(1 << 30) for _ in range(size)])
        for s in done:
            text = m.tokenizer.decode(s.token_ids)
            out.append(record(first_id + len(out), first_id + g, 1.0 if text.startswith(right) else 0.0,
                              prompt_ids=ids, token_ids=s.token_ids, logprobs=s.logprobs))
    return out


def test_a_short_grpo_run_raises_the_reward() -> None:
    torch.manual_seed(0)
    m = model(LMConfig(d_model=32, n_layers=2, n_heads=2, max_len=12))
    trainer = Trainer(ScriptedFarm(), TrainerConfig(grpo=GRPOConfig(lr=3e-3)))  # type: ignore[arg-type]
    trainer.model, trainer.learner = m, GRPOLearner(m, trainer.config.grpo, device=CPU)
    rng = random.Random(0)

    def reward() -> float:
        probe = sampled_groups(m, 16, 16, 10**6, random.Random(1))
        return sum(t.reward for t in probe) / len(probe)

    before = reward()
    learned = 0
    for step in range(25):
        metrics = trainer.learn(sampled_groups(m, 8, 8, 1000 * (step + 1), rng), up_to=step + 1)
        assert metrics["groups"] == 8 and metrics["rows"] == 8 * metrics["groups_used"]
        learned += metrics["updates"] > 0
    after = reward()
    assert before < 0.2 and after > before + 0.3, (before, after)
    assert trainer.learner.steps == 2 * learned and learned > 20


# -- checkpoints and the loop ------------------------------------------------------------------------


def test_a_checkpoint_restores_policy_optimizer_and_position_exactly(tmp_path: Path) -> None:
    m = model()
    learner = GRPOLearner(m, GRPOConfig(kl_coef=0.05), device=CPU)
    ids, mask = rows(m, ["3", "12", "-7"])
    adv = torch.tensor([1.0, -1.0, 0.5])
    old = sequence_logprobs(m, ids).detach()
    for _ in range(3):
        learner.step(ids, mask, old, adv)
    assert learner.reference is not None
    path = tmp_path / "ckpt" / "checkpoint.pt"
    checkpoint.write(path, checkpoint.Checkpoint(model=save(m), learner=learner.state_dict(), up_to=20,
                                                 policy_version=7, warmed_up=True, reference=save(learner.reference),
                                                 counters={"trajectories": 64}, recent_groups=[3, 4]))
    assert [p.name for p in path.parent.iterdir()] == ["checkpoint.pt"]  # no temporary file left
    saved = checkpoint.read(path)
    assert saved is not None
    assert (saved.up_to, saved.policy_version, saved.warmed_up, saved.counters, saved.recent_groups) == (
        20, 7, True, {"trajectories": 64}, [3, 4])
    m2 = load(saved.model, CPU)
    learner2 = GRPOLearner(m2, GRPOConfig(kl_coef=0.05), load(saved.reference or b"", CPU), device=CPU)
    learner2.load_state_dict(saved.learner)
    assert learner2.steps == 3
    for (name, a), b in zip(m.state_dict().items(), m2.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    # The optimizer's moments came back too: one more step from each lands on the same weights.
    learner.step(ids, mask, old, adv)
    learner2.step(ids, mask, old, adv)
    for a, b in zip(m.parameters(), m2.parameters(), strict=True):
        assert torch.equal(a, b)
    assert checkpoint.read(tmp_path / "none.pt") is None
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(checkpoint.CheckpointError):
        checkpoint.read(tmp_path / "bad.pt")


def informative_batch(m: TinyLM, up_to: int, groups: Sequence[int], id_base: int) -> Batch:
    """Whole groups of 4 with rewards 1, 0, 0, 1: every group informative."""
    tok = m.tokenizer
    trajectories = []
    for g in groups:
        for k in range(4):
            ids = [*tok.encode(str(k)), EOS]
            trajectories.append(record(id_base + 4 * g + k, g, float(k in (0, 3)), prompt_ids=tok.prompt("1+2="),
                                       token_ids=ids, logprobs=[-1.0] * len(ids), difficulty=1 + g % 2))
    return Batch(consumer="grpo", whole_groups=True, up_to=up_to, trajectories=trajectories,
                 group_ids=[t.group_id for t in trajectories])


def resumed_trainer(tmp_path: Path, batches: Sequence[Batch], recent_groups: Sequence[int] = (),
                    batch_size: int = 4) -> tuple[Trainer, ScriptedFarm, TinyLM]:
    m = model()
    learner = GRPOLearner(m, GRPOConfig(), device=CPU)
    config = TrainerConfig(checkpoint_dir=str(tmp_path), eval_at_start=False, final_eval=False, eval_every_s=0,
                           time_budget_s=60, checkpoint_every_s=3600, batch_size=batch_size)
    checkpoint.write(config.checkpoint_path, checkpoint.Checkpoint(
        model=save(m), learner=learner.state_dict(), up_to=20, policy_version=5, warmed_up=True,
        recent_groups=list(recent_groups)))
    farm = ScriptedFarm(batches)
    return Trainer(farm, config), farm, m  # type: ignore[arg-type]


def test_a_restart_skips_the_batches_its_checkpoint_holds_and_acks_only_after_checkpointing(
        tmp_path: Path) -> None:
    m = model()
    batches = [informative_batch(m, 10, [1, 2], 0), informative_batch(m, 20, [3, 4], 0),
               informative_batch(m, 30, [5, 6], 0)]
    trainer, farm, _ = resumed_trainer(tmp_path, batches)
    summary = trainer.run()
    # 10 and 20 are the checkpoint's: acked unused. 30 is learned from (two updates), published, and acked
    # only once the final checkpoint holds it.
    assert summary["learner_step"] == 2 and summary["batches"] == 1 and summary["skipped_batches"] == 2
    assert summary["trajectories"] == 8 and summary["groups_used"] == 2
    assert farm.calls == ["publish", "get_policy", "ack 10", "ack 20", "publish", "ack 30"]
    assert [name for name, _ in farm.published] == ["tiny", "tiny"]
    assert farm.stream_kwargs == {"consumer": "grpo", "batch_size": 4, "whole_groups": True, "max_staleness": 2,
                                  "agent": "torch:tiny", "envs": ("arith",), "reconnect_s": 60.0, "tokens_only": True}
    saved = checkpoint.read(trainer.config.checkpoint_path)
    assert saved is not None and saved.up_to == 30 and saved.policy_version == 102
    assert saved.recent_groups == [5, 6]  # written before its ack: were the ack lost, a resend could straddle
    assert saved.learner["steps"] == 2
    lines = [json.loads(line) for line in trainer.config.metrics_file.read_text().splitlines()]
    assert [r["kind"] for r in lines] == ["publish", "step", "publish", "checkpoint"]
    assert [r["reason"] for r in lines if r["kind"] == "publish"] == ["resume", "step"]
    step = lines[1]
    assert step["up_to"] == 30 and step["groups_used"] == 2 and step["groups_dropped"] == 0
    assert step["pass_rate"] == 0.5 and step["pass_rate_by_level"] == {"1": 0.5, "2": 0.5}
    assert step["staleness_mean"] == 101 - 101 and step["updates"] == 2 and step["policy_version"] == 101
    for key in ("loss", "clip_fraction", "approx_kl", "grad_norm", "tokens", "time", "elapsed_s", "learner_step"):
        assert key in step


def test_small_stream_batches_are_gathered_into_one_learner_batch_and_acked_only_once_learned_from(
        tmp_path: Path) -> None:
    m = model()
    batches = [informative_batch(m, up_to, [up_to, up_to + 1], 0) for up_to in (30, 40, 50)]
    trainer, farm, _ = resumed_trainer(tmp_path, batches, batch_size=16)
    summary = trainer.run()
    # 30 and 40 make 16 trajectories: one learner batch. 50 is gathered, never learned from: not acked.
    assert summary["learner_step"] == 2 and summary["batches"] == 1 and summary["trajectories"] == 16
    assert farm.calls == ["publish", "get_policy", "publish", "ack 40"]
    step = [json.loads(line) for line in trainer.config.metrics_file.read_text().splitlines()][1]
    assert (step["kind"], step["up_to"], step["stream_batches"], step["rows"], step["groups"]) == ("step", 40, 2, 16, 4)


def test_a_batch_straddling_the_checkpoint_loses_the_groups_it_already_learned_from(tmp_path: Path) -> None:
    m = model()
    # The farm resends from an older ack and cuts its batch differently: groups 3 and 4 are the checkpoint's.
    trainer, farm, _ = resumed_trainer(tmp_path, [informative_batch(m, 40, [3, 4, 5], 0)], recent_groups=[3, 4])
    summary = trainer.run()
    assert summary["groups_used"] == 1 and summary["trajectories"] == 4 and farm.acks == [40]
    saved = checkpoint.read(trainer.config.checkpoint_path)
    assert saved is not None and saved.recent_groups == [3, 4, 5]  # kept until an ack after this one


def test_a_batch_without_signal_is_consumed_but_changes_and_publishes_nothing(tmp_path: Path) -> None:
    m = model()
    flat = informative_batch(m, 30, [5], 0)
    for t in flat.trajectories:
        t.reward, t.passed = 0.0, False
    trainer, farm, _ = resumed_trainer(tmp_path, [flat])
    summary = trainer.run()
    assert summary["learner_step"] == 0 and summary["groups_dropped"] == 1 and farm.calls == ["publish", "get_policy", "ack 30"]


# -- warm-up and evaluation through the client --------------------------------------------------------


def chain(seed: int, difficulty: int) -> tuple[str, str]:
    rng = random.Random(seed * 10 + difficulty)
    terms = [rng.randrange(10) for _ in range(difficulty + 2)]
    ops = [rng.choice("+-") for _ in terms[1:]]
    text, value = str(terms[0]), terms[0]
    for op, term in zip(ops, terms[1:], strict=True):
        text += f"{op}{term}"
        value = value + term if op == "+" else value - term
    return f"{text}=", str(value)


def test_reference_pairs_are_the_reference_on_training_seeds_and_the_warm_up_learns_them() -> None:
    farm = ScriptedFarm(answers=lambda env, agent, seed, level: (*chain(seed, level), True))
    pairs = reference_pairs(farm, "arith", (1, 2), 40)  # type: ignore[arg-type]
    assert [(q["env"], q["agent"], q["difficulty"], q["group_size"], q["rollouts"]) for q in farm.queued] == [
        ("arith", "reference", 1, 1, 40), ("arith", "reference", 2, 1, 40)]
    assert farm.queued[0]["seeds"] == list(range(40)) and len(pairs) == 80 and pairs[0] == chain(0, 1)
    m = model()
    result = warm_up(m, pairs[:4], target_accuracy=0.5, max_steps=150, batch=16, lr=3e-3, check_every=10)
    assert result.reached and result.accuracy >= 0.5 and result.steps <= 150


def test_evaluation_is_greedy_on_held_out_seeds_and_reports_per_level() -> None:
    farm = ScriptedFarm(answers=lambda env, agent, seed, level: (*chain(seed, level), seed % (level + 1) == 0))
    result = evaluate(farm, "tiny", seeds_per_level=12)  # type: ignore[arg-type]
    assert {(q["env"], q["agent"], q["group_size"]) for q in farm.queued} == {
        ("arith:heldout", "torch:tiny?temperature=0", 1)}
    assert [q["difficulty"] for q in farm.queued] == [1, 2] and farm.queued[1]["seeds"] == list(range(12))
    assert result.pass_rate == {1: 6 / 12, 2: 4 / 12} and result.trajectories == 24
    assert result.policy_version == 101 and result.policy_versions == {101: 24}
    assert farm.pages == [("torch:tiny?temperature=0", False)] * 2, "a pass rate needs no bodies: summaries are read"


class EvalWhileTraining(ScriptedFarm):
    """Streams a batch, then the rest only once a mid-training evaluation was queued (``hold_queueing``: its queueing
    waits until ``release``) or read back, the bank's level with it (else)."""

    def __init__(self, batches: Sequence[Batch], answers: Any, *, hold_queueing: bool) -> None:
        super().__init__(batches, answers)
        self.hold_queueing = hold_queueing
        self.asked = threading.Event()
        self.read = threading.Event()
        self.release = threading.Event()
        self.threads: set[str] = set()

    def batches(self, consumer: str, batch_size: int = 64, **kwargs: Any) -> Iterator[Batch]:
        first, *rest = super().batches(consumer, batch_size, **kwargs)
        yield first
        assert (self.asked if self.hold_queueing else self.read).wait(10)
        yield from rest

    def run(self, env: str, agent: str, rollouts: int = 0, group_size: int = 0, *, difficulty: int = 0,
            seeds: Sequence[int] = ()) -> dict[str, Any]:
        self.threads.add(threading.current_thread().name)
        self.asked.set()
        if self.hold_queueing:
            self.release.wait(10)
        return super().run(env, agent, rollouts, group_size, difficulty=difficulty, seeds=seeds)

    def status(self) -> dict[str, Any]:
        self.read.set()  # the evaluation's last call: its results are read by now
        return super().status()


@pytest.mark.parametrize("hold_queueing", [False, True], ids=["recorded", "stuck"])
def test_an_evaluation_while_training_is_waited_for_beside_the_loop_never_in_it(tmp_path: Path,
                                                                                  hold_queueing: bool) -> None:
    m = model()
    trainer, _, _ = resumed_trainer(tmp_path, [])
    farm = EvalWhileTraining([informative_batch(m, 30, [5, 6], 0), informative_batch(m, 40, [7, 8], 0),
                              informative_batch(m, 50, [9, 10], 0)],
                             answers=lambda env, agent, seed, level: ("", "", seed % 2 == 0), hold_queueing=hold_queueing)
    trainer.client = farm  # type: ignore[assignment]
    trainer.config = replace(trainer.config, eval_every_s=0.01, eval_seeds=4, eval_levels=(1,))
    started = time.monotonic()
    try:
        summary = trainer.run()
    finally:
        farm.release.set()
    # Stuck in queueing, the evaluation held up nothing: the loop learned from every batch, and let it go at the end.
    assert summary["batches"] == 3 and time.monotonic() - started < 8
    assert farm.threads == {"farm-trainer-eval"}
    evals = [json.loads(line) for line in trainer.config.metrics_file.read_text().splitlines()
             if json.loads(line)["kind"] == "eval"]
    if hold_queueing:
        assert evals == []
    else:
        assert evals and evals[0]["final"] is False and evals[0]["pass_rate_by_level"] == {"1": 0.5}
        assert evals[0]["bank_level"] == 2


def test_the_evaluation_environment_is_never_trained_on() -> None:
    with pytest.raises(ValueError, match="must not be trained on"):
        TrainerConfig(envs=("arith", "arith:heldout"))
    with pytest.raises(ValueError, match="must not be trained on"):
        TrainerConfig(warmup_env="arith:heldout")


class FailingFarm(ScriptedFarm):
    """Streams its batches, then fails (``fail``) or waits until ``release`` is set (an idle farm)."""

    def __init__(self, batches: Sequence[Batch], fail: bool) -> None:
        super().__init__(batches)
        self.fail = fail
        self.release = threading.Event()

    def batches(self, consumer: str, batch_size: int = 64, **kwargs: Any) -> Iterator[Batch]:
        yield from super().batches(consumer, batch_size, **kwargs)
        if self.fail:
            raise RuntimeError("the stream broke")
        self.release.wait(30)


def test_a_failed_stream_stops_the_trainer_and_acks_nothing_it_has_not_checkpointed(tmp_path: Path) -> None:
    m = model()
    trainer, _, _ = resumed_trainer(tmp_path, [])
    farm = trainer.client = FailingFarm([informative_batch(m, 30, [5, 6], 0)], fail=True)  # type: ignore[assignment]
    with pytest.raises(RuntimeError, match="the stream broke"):
        trainer.run()
    assert farm.calls == ["publish", "get_policy", "publish"] and farm.acks == []  # learned from 30, never acked it
    saved = checkpoint.read(trainer.config.checkpoint_path)
    assert saved is not None and saved.up_to == 20  # a restart gets 30 again, and learns from it once


def test_the_time_budget_holds_while_the_farm_sends_nothing(tmp_path: Path) -> None:
    trainer, _, _ = resumed_trainer(tmp_path, [])
    farm = trainer.client = FailingFarm([], fail=False)  # type: ignore[assignment]
    trainer.config = replace(trainer.config, time_budget_s=0.5)
    started = time.monotonic()
    try:
        summary = trainer.run()
    finally:
        farm.release.set()
    assert time.monotonic() - started < 5 and summary["batches"] == 0 and farm.acks == []


def test_the_command_line_maps_onto_the_config() -> None:
    args = parser().parse_args(["--addr", "farm:1", "--name", "small", "--env", "arith", "--env", "rg:chain_sum",
                                "--dir", "d", "--minutes", "2", "--batch-size", "64", "--max-staleness", "0",
                                "--kl", "0.1", "--eval-every-s", "0", "--eval-levels", "1,3"])
    config = config_from_args(args)
    assert (config.addr, config.name, config.agent_spec, config.envs, config.checkpoint_dir, config.time_budget_s,
            config.batch_size, config.max_staleness, config.grpo.kl_coef, config.eval_every_s, config.eval_levels) == (
        "farm:1", "small", "torch:small", ("arith", "rg:chain_sum"), "d", 120.0, 64, 0, 0.1, 0.0, (1, 3))
    assert config.metrics_file == Path("d") / "metrics.jsonl"
    assert config_from_args(parser().parse_args([])).eval_levels == (1, 2)
    for bad in ("0", "1,x", ""):
        with pytest.raises(SystemExit):
            parser().parse_args(["--eval-levels", bad])


def test_trajectories_outside_the_subscription_are_never_learned_from(tmp_path: Path) -> None:
    m = model()
    batch = informative_batch(m, 30, [5, 6], 0)
    for t in batch.trajectories[4:]:  # group 6: an evaluation's, had the farm let it through
        t.agent, t.env = "torch:tiny?temperature=0", "arith:heldout"
    trainer, _, _ = resumed_trainer(tmp_path, [batch])
    summary = trainer.run()
    assert summary["trajectories"] == 4 and summary["groups_used"] == 1
    step = [json.loads(line) for line in trainer.config.metrics_file.read_text().splitlines()][1]
    assert step["kind"] == "step" and step["ignored"] == 4 and step["batch_trajectories"] == 8


def test_a_fresh_trainer_warms_up_publishes_then_evaluates_and_a_restart_does_not_warm_up_again(
        tmp_path: Path) -> None:
    m = model()
    farm = ScriptedFarm([informative_batch(m, 10, [1, 2], 0)],
                        answers=lambda env, agent, seed, level: (*chain(seed, level), seed % 2 == 0))
    config = TrainerConfig(checkpoint_dir=str(tmp_path), lm=SMALL, warmup_seeds=8, warmup_target=0.0,
                           eval_seeds=6, eval_every_s=0, batch_size=8)
    summary = Trainer(farm, config).run()  # type: ignore[arg-type]
    assert [(q["env"], q["agent"]) for q in farm.queued] == [
        ("arith", "reference"), ("arith", "reference"),  # the warm-up: training seeds, levels 1 and 2
        ("arith:heldout", "torch:tiny?temperature=0"), ("arith:heldout", "torch:tiny?temperature=0"),  # start
        ("arith:heldout", "torch:tiny?temperature=0"), ("arith:heldout", "torch:tiny?temperature=0")]  # final
    kinds = [json.loads(line)["kind"] for line in config.metrics_file.read_text().splitlines()]
    assert kinds == ["warmup", "checkpoint", "publish", "eval", "step", "publish", "checkpoint", "eval"]
    assert summary["learner_step"] == 2 and summary["warmup"]["steps"] == 0
    assert summary["first_eval"]["pass_rate_by_level"] == {"1": 0.5, "2": 0.5}

    again = ScriptedFarm([], answers=farm.answers)
    summary = Trainer(again, replace(config, eval_at_start=False, final_eval=False)).run()  # type: ignore[arg-type]
    assert again.queued == [] and summary["warmup"] is None and summary["learner_step"] == 2
    assert json.loads(config.metrics_file.read_text().splitlines()[-2])["reason"] == "resume"
