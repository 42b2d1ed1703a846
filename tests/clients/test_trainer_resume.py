"""A trainer that dies and restarts against a real farm: it resumes from its checkpoint and its consumer
cursor, and of the trajectories it learned from, none is lost and none is learned from twice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from farm_client import FarmClient
from farm_trainer import checkpoint
from farm_trainer.loop import Trainer, TrainerConfig

from farmd.cli.main_job import CONSUMER, loop_toml

pytestmark = [pytest.mark.slow, pytest.mark.sandbox]


class Crash(Exception):
    """The trainer process dying mid-run (after learning from a batch, before checkpointing it)."""


def config(tmp_path: Path) -> TrainerConfig:
    # Every version is kept: with a staleness bound, what the crashed run learned from may fairly be left out
    # after the resume (a farm running behind sends groups at the bound's edge, and a batch is judged when
    # it is sent). How staleness counts across a resume is tested with the scheduler's policy lines.
    return TrainerConfig(consumer=CONSUMER, checkpoint_dir=str(tmp_path / "trainer"), batch_size=64, max_staleness=0,
                         checkpoint_every_s=3600.0, time_budget_s=120.0, warmup_seeds=300, eval_at_start=False,
                         final_eval=False, eval_every_s=0.0)


def test_a_restarted_trainer_loses_no_trajectory_and_learns_from_none_twice(tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                            running_farm) -> None:
    toml = tmp_path / "farm.toml"
    toml.write_text(loop_toml(workers=64, buffer=128))
    farm = running_farm("--config", str(toml))
    first: list[tuple[int, list[int]]] = []
    second: list[tuple[int, list[int]]] = []

    with FarmClient(farm.addr) as client:
        trainer = Trainer(client, config(tmp_path))
        learn, handle = trainer.learn, trainer.handle

        def learn_and_note(rows: list[Any], up_to: int, **kwargs: Any) -> dict[str, Any]:
            first.append((up_to, [t.id for t in rows]))
            return learn(rows, up_to, **kwargs)

        def handle_then_die(batch: Any) -> dict[str, Any] | None:
            record = handle(batch)
            if record is not None and len(first) == 3:
                trainer.save_checkpoint()  # learned from three batches: saved, then acked
            if len(first) == 5:
                raise Crash  # two more learned from, never saved
            return record

        trainer.learn = learn_and_note  # type: ignore[method-assign]
        trainer.handle = handle_then_die  # type: ignore[method-assign]
        with pytest.raises(Crash):
            trainer.run()
    saved = checkpoint.read(Path(config(tmp_path).checkpoint_path))
    assert saved is not None and saved.up_to == first[2][0]

    with FarmClient(farm.addr) as client:
        resumed = Trainer(client, config(tmp_path))
        relearn = resumed.learn

        def learn_a_few(rows: list[Any], up_to: int, **kwargs: Any) -> dict[str, Any]:
            second.append((up_to, [t.id for t in rows]))
            if len(second) == 4:
                resumed.stop()
            return relearn(rows, up_to, **kwargs)

        resumed.learn = learn_a_few  # type: ignore[method-assign]
        summary = resumed.run()
        assert summary  # it ran to its end: checkpointed and acked

    kept = {i for _, ids in first[:3] for i in ids}
    lost_with_the_crash = {i for _, ids in first[3:] for i in ids}
    relearned = [i for _, ids in second for i in ids]
    assert len(relearned) == len(set(relearned))
    assert not kept & set(relearned), "a trajectory the checkpoint had learned from was learned from again"
    assert lost_with_the_crash <= set(relearned), "what was learned after the checkpoint came again"
    assert second[0][0] > saved.up_to
    assert trainer.warmed_up and resumed.warmed_up
    kinds = [json.loads(line)["kind"] for line in (tmp_path / "trainer" / "metrics.jsonl").read_text().splitlines()]
    assert kinds.count("warmup") == 1, "the resumed trainer did not warm up again"
