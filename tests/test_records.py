"""The trajectory record is written once: farmd's dataclass, the client's and the proto agree field for
field, convert both ways without loss, and a record is bounded before it is stored."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import threading
import typing

import farm_client.record as client_record
import pytest
from farm.v1 import trajectory_pb2
from farm_client.convert import enum_names, from_message, mismatched_fields, to_message

from farmd import flags as farm_flags
from farmd import records
from farmd.records import (
    MAX_CONVERSATION_CHARS,
    MAX_TOKEN_ENTRIES,
    ChatMessage,
    PosedTask,
    SamplingParams,
    Score,
    Step,
    Timings,
    ToolCall,
    Trajectory,
    Turn,
    Usage,
    from_plain,
    to_plain,
)


def _record_types(module: typing.Any) -> dict[str, type]:
    return {name: cls for name, cls in vars(module).items()
            if dataclasses.is_dataclass(cls) and isinstance(cls, type) and hasattr(trajectory_pb2, name)}


def test_records_client_and_proto_have_the_same_fields() -> None:
    ours, theirs = _record_types(records), _record_types(client_record)
    assert set(ours) == set(theirs) == {"PosedTask", "ToolCall", "ChatMessage", "Usage", "Turn", "SamplingParams",
                                        "Step", "Score", "Timings", "Trajectory"}
    for name, cls in ours.items():
        message = getattr(trajectory_pb2, name).DESCRIPTOR
        assert mismatched_fields(cls, message) == (set(), set()), name
        assert mismatched_fields(theirs[name], message) == (set(), set()), name
        assert [f.name for f in dataclasses.fields(cls)] == [f.name for f in dataclasses.fields(theirs[name])], name


def test_the_flag_enum_is_the_closed_set() -> None:
    assert set(enum_names(trajectory_pb2.DESCRIPTOR.enum_types_by_name["Flag"])) == set(farm_flags.ALL)


def full_record() -> Trajectory:
    return Trajectory(
        id=7, group_id=3, env="py-func", env_version="2", seed=-5, difficulty=2, agent="openai:m@local",
        policy_version=4, reward=0.5, passed=False, status="ok", reasons=["test 2 failed"],
        flags=["truncated", "no_answer"], verifier_version="3", final="def f(x): return x", node="n1", run_id=9,
        steps=[Step(action="ls", observation="a\nb", exit_code=0, duration=0.25, violations=["wall_time"]),
               Step(action="sleep 9", exit_code=None)],
        verdict_details={"tests": 10, "failed": 1, "speedup": 1.5},
        task=PosedTask(kind="actions", prompt="Do it.", entry_point="f", answer_format="ANSWER: x",
                       examples=[{"input": [1, 2], "output": 3}], metadata={"level": "two", "max_steps": 8}),
        messages=[ChatMessage("system", "be good"), ChatMessage("user", "Do it."),
                  ChatMessage("assistant", "", [ToolCall("c1", "run", '{"command": "ls"}')]),
                  ChatMessage("tool", "a\nb", tool_call_id="c1"), ChatMessage("assistant", "ANSWER: 3")],
        turns=[Turn(message_index=2, prompt_messages=2, completion="", prompt_token_ids=[1, 2, 3], token_ids=[4, 5],
                    logprobs=[-0.5, -0.25], has_logprobs=True, finish_reason="tool_calls",
                    usage=Usage(3, 2, 5, 1, 0), latency=0.125, choice_index=1),
               Turn(message_index=4, prompt_messages=4, completion="ANSWER: 3", finish_reason="length")],
        sampling=SamplingParams(model="m", temperature=0.75, top_p=0.5, max_tokens=64, seed=11, stop=["</s>"], n=8,
                                extra={"top_k": 20}),
        usage=Usage(prompt_tokens=10, completion_tokens=4, total_tokens=14, requests=2, retries=1),
        agent_error="out of turns",
        scores=[Score(verifier_version="4", reward=0.0, passed=False, status="ok", reasons=["r"],
                      flags=["suspected_hack"], scored_at=1_700_000_000.5)],
        timings=Timings(task=0.5, agent=1.25, verify=0.125, total=2.0), started_at=1_700_000_000.25,
        finished_at=1_700_000_002.25, seq=12)


def test_a_record_goes_over_the_wire_and_back_unchanged() -> None:
    sent = full_record()
    message = to_message(sent, trajectory_pb2.Trajectory())
    assert message.flags == [trajectory_pb2.FLAG_TRUNCATED, trajectory_pb2.FLAG_NO_ANSWER]
    assert message.status == trajectory_pb2.VERDICT_STATUS_OK
    assert message.turns[1].finish_reason == trajectory_pb2.FINISH_REASON_LENGTH
    assert message.finished_at.seconds == 1_700_000_002 and message.timings.agent.ToNanoseconds() == 1_250_000_000
    assert message.steps[0].HasField("exit_code") and not message.steps[1].HasField("exit_code")
    assert message.sampling.seed == 11 and message.sampling.HasField("seed")
    for cls in (Trajectory, client_record.Trajectory):
        got = from_message(trajectory_pb2.Trajectory.FromString(message.SerializeToString()), cls)
        assert to_plain(got) == to_plain(sent), cls  # logprobs chosen exact in float32
    unseeded = to_message(dataclasses.replace(sent, sampling=SamplingParams()), trajectory_pb2.Trajectory())
    assert not unseeded.sampling.HasField("seed") and from_message(unseeded, Trajectory).sampling.seed is None


def test_converters_compiled_on_many_threads_at_once_convert_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """farmd converts on its worker threads and a client on its own: the first records of a type, converted on
    several threads together, all come back whole (each converter is compiled once, by one of them)."""
    from farm_client import convert

    monkeypatch.setattr(convert, "_TO", {})
    monkeypatch.setattr(convert, "_FROM", {})
    compiled: list[tuple[type, typing.Any]] = []
    compile_from = convert._compile_from

    def counted(cls: type, descriptor: typing.Any) -> typing.Any:
        compiled.append((cls, descriptor))
        return compile_from(cls, descriptor)

    monkeypatch.setattr(convert, "_compile_from", counted)
    sent = full_record()
    barrier = threading.Barrier(8)

    def both_ways(_: int) -> dict[str, typing.Any]:
        barrier.wait()
        message = to_message(sent, trajectory_pb2.Trajectory())
        return to_plain(from_message(trajectory_pb2.Trajectory.FromString(message.SerializeToString()), Trajectory))

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        got = list(pool.map(both_ways, range(8)))
    assert got == [to_plain(sent)] * 8
    assert len(compiled) == len(set(compiled)) == len(convert._FROM), "each record type compiled once"


def test_plain_values_round_trip() -> None:
    sent = full_record()
    assert from_plain(Trajectory, to_plain(sent)) == sent
    assert from_plain(Trajectory, {**to_plain(sent), "turns": []}).turns == []


def test_sealing_bounds_the_conversation_and_the_tokens() -> None:
    base = full_record()
    long = "é" * (MAX_CONVERSATION_CHARS // 2)
    many = dataclasses.replace(base, messages=[ChatMessage("user", long) for _ in range(4)],
                               turns=[Turn(message_index=i, prompt_token_ids=list(range(MAX_TOKEN_ENTRIES // 4)),
                                           token_ids=[1] * 1000, logprobs=[-1.0] * 1000, has_logprobs=True)
                                      for i in range(4)])
    sealed = many.sealed()
    assert sum(len(m.content) for m in sealed.messages) <= MAX_CONVERSATION_CHARS
    assert [m.role for m in sealed.messages] == ["user"] * 4, "a message past the budget keeps its role"
    entries = sum(len(t.prompt_token_ids) + len(t.token_ids) + len(t.logprobs) for t in sealed.turns)
    assert entries <= MAX_TOKEN_ENTRIES
    # Earlier turns' prompts go first: the last turn's prompt holds them, and every completion keeps its tokens.
    assert sealed.turns[-1].prompt_token_ids and all(t.token_ids and t.has_logprobs for t in sealed.turns)
    assert "truncated" in sealed.flags
    assert "truncated" not in dataclasses.replace(base, flags=[]).sealed().flags, "a record within bounds is kept"


def test_sealing_repairs_text_everywhere_it_is_kept() -> None:
    bad = "\ud800"
    record = dataclasses.replace(full_record(), flags=[],
                                 messages=[ChatMessage("assistant", bad, [ToolCall("i", "run", bad)])],
                                 task=PosedTask(prompt=bad, metadata={"k": bad}),
                                 turns=[Turn(completion=bad, finish_reason="stop")])
    sealed = record.sealed()
    assert sealed.messages[0].content == "\ufffd" and sealed.messages[0].tool_calls[0].arguments == "\ufffd"
    assert sealed.task.prompt == "\ufffd" and sealed.task.metadata == {"k": "\ufffd"}
    assert sealed.turns[0].completion == "\ufffd" and sealed.flags == ["invalid_text"]
    to_message(sealed, trajectory_pb2.Trajectory()).SerializeToString()  # encodes: nothing left to refuse


@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_a_non_finite_logprob_survives_the_wire(value: float) -> None:
    # -inf is a legitimate sampling logprob (a token the sampler forced); it must not break a stream.
    record = dataclasses.replace(full_record(), turns=[Turn(token_ids=[1], logprobs=[-value], has_logprobs=True)])
    got = from_message(to_message(record, trajectory_pb2.Trajectory()), Trajectory)
    assert len(got.turns[0].logprobs) == 1


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_a_non_finite_number_in_a_verdicts_details_is_still_readable(value: float) -> None:
    # A verifier reports what an attempt's code returned: an infinity is data, and must not make the record
    # unreadable (json_format refuses non-finite numbers in a Struct).
    record = dataclasses.replace(full_record(), verdict_details={"claimed": [value, 1.5], "case": {"out": value}})
    got = from_message(to_message(record, trajectory_pb2.Trajectory()), Trajectory)
    claimed = got.verdict_details["claimed"]
    assert len(claimed) == 2 and claimed[1] == 1.5 and not math.isfinite(claimed[0])


def test_evolve_makes_what_dataclasses_replace_makes() -> None:
    t = Trajectory(id=7, group_id=2, env="arith", env_version="1", seed=3, difficulty=1, agent="torch:tiny",
                   policy_version=4, reward=1.0, passed=True, status="ok", reasons=[], flags=["x"], verifier_version="1",
                   turns=[Turn(token_ids=[1, 2], logprobs=[-0.5, -0.25], has_logprobs=True)])
    for changes in ({}, {"verdict_version": 3, "scores": []}, {"scores": [], "verdict_version": 3},
                    {"reward": 0.0, "passed": False, "flags": []}):
        made = records.evolve(t, **changes)
        assert made == dataclasses.replace(t, **changes) and type(made) is Trajectory and made is not t
    assert records.evolve(t).turns is t.turns, "a copy is shallow, as replace's is"
    job = records.Job(id=1, group_id=1, env="arith", seed=1, difficulty=1, agent="reference",
                      state=records.JobState.LEASED, attempts=1)
    assert records.evolve(job, policy_version=9) == dataclasses.replace(job, policy_version=9)  # frozen
    with pytest.raises(TypeError):
        records.evolve(t, no_such_field=1)

    @dataclasses.dataclass
    class Checked:
        a: int
        b: int = dataclasses.field(init=False, default=0)

        def __post_init__(self) -> None:
            self.b = 2 * self.a

    assert records.evolve(Checked(1), a=5).b == 10, "a post-init runs, as it does under replace"

    @dataclasses.dataclass
    class Named:
        evolved: int
        new_record: int = 0

    assert records.evolve(Named(1, 2), new_record=3) == Named(1, 3), "fields named as the copy's own names"


def test_a_record_is_made_by_position_only_where_its_constructor_takes_its_fields_so() -> None:
    assert all(client_record.takes_fields_in_order(cls) for cls in _record_types(client_record).values())

    @dataclasses.dataclass
    class WithInitVar:
        a: int
        scale: dataclasses.InitVar[int] = 1

    @dataclasses.dataclass
    class KeywordOnly:
        a: int
        b: int = dataclasses.field(default=0, kw_only=True)

    @dataclasses.dataclass
    class Computed:
        a: int
        b: int = dataclasses.field(init=False, default=0)

    for cls in (WithInitVar, KeywordOnly, Computed):
        assert not client_record.takes_fields_in_order(cls), cls
    assert records.evolve(KeywordOnly(1, b=2), a=3) == KeywordOnly(3, b=2), "replace's road where position fails"
