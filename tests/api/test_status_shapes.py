"""The farm's status crosses from the scheduler to the API as frozen dataclasses, each defined once beside its
owner, and every field of each reaches the wire: a field added to a shape and forgotten on the way out, or a
state the queue gains, fails here, not in an operator's status line.

A real scheduler on a real store, and the API's own translation; no server (the farms in test_farm_service.py
and the CLI's tests read the same replies end to end).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from farm.v1 import farm_pb2

from farmd.api import farm_service, history
from farmd.records import JobState
from farmd.scheduler import Scheduler, SchedulerConfig
from farmd.scheduler.delivery import ConsumerStatus
from farmd.scheduler.history import BankSample, History, Sample
from farmd.scheduler.nodes import Nodes, NodeStatus
from farmd.scheduler.scheduler import FarmPulse, FarmStatus, QueueCounts
from farmd.store import Store
from farmd.taskbank import BankStatus, Standing
from tests.scheduler.test_nodes import hello
from tests.scheduler.test_scheduler import LEVELS


@pytest.fixture
async def scheduler(tmp_path: Path) -> AsyncIterator[Scheduler]:
    store = await Store.open(tmp_path / "farm.db")
    made = await Scheduler.open(store, LEVELS, SchedulerConfig(group_size=2))
    yield made
    await made.stop()
    await store.close()


def _frozen(value: Any) -> None:
    assert dataclasses.is_dataclass(value) and not isinstance(value, type), type(value)
    field = dataclasses.fields(value)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, field, getattr(value, field))


def _distinct(cls: type[Any], start: int = 1, **given: Any) -> Any:
    """An instance of ``cls`` whose every field holds a value of its own (so a field lost on the way shows)."""
    values: dict[str, Any] = {}
    for i, f in enumerate(dataclasses.fields(cls), start):
        kind = str(f.type)
        if f.name in given:
            values[f.name] = given[f.name]
        elif kind.startswith("bool"):
            values[f.name] = True
        elif kind.startswith("str"):
            values[f.name] = f"{f.name}-{i}"
        elif "float" in kind:
            values[f.name] = i + 0.5
        elif "int" in kind and "tuple" not in kind:
            values[f.name] = i
        else:
            raise AssertionError(f"give {cls.__name__}.{f.name} ({kind}) a value")
    return cls(**values)


def _sent(message: Any, shape: Any, rename: dict[str, str] | None = None) -> None:
    """Every field of ``shape`` is set in ``message`` under its name, with its value."""
    for f in dataclasses.fields(shape):
        value = getattr(shape, f.name)
        name = (rename or {}).get(f.name, f.name)
        got = getattr(message, name)
        if hasattr(got, "ToNanoseconds"):
            assert got.ToNanoseconds() == round(value * 1e9), f.name
        elif isinstance(value, float):
            assert got == pytest.approx(value), f.name
        elif isinstance(value, tuple | dict):
            assert type(value)(got) == value, f.name
        else:
            assert got == value, f.name


async def test_status_and_pulse_are_frozen_shapes_all_the_way_down(scheduler: Scheduler) -> None:
    await scheduler.submit("rg:chain_sum", "reference", 4)
    status = await scheduler.status()
    assert isinstance(status, FarmStatus) and isinstance(status.pulse, FarmPulse)
    assert isinstance(status.pulse.queue, QueueCounts) and status.pulse.queue.queued == 4
    assert isinstance(status.pulse.bank, BankStatus) and isinstance(status.pulse.bank.totals, Standing)
    for shape in (status, status.pulse, status.pulse.queue, status.pulse.bank, status.pulse.bank.totals,
                  *status.pulse.bank.envs.values()):
        _frozen(shape)
    nodes = Nodes(scheduler, lost_after_s=30, local="coordinator",
                  local_status=lambda: _distinct(NodeStatus, state="connected", policy_versions=(1,), facts={}))
    nodes.join(hello("gpu-1"))
    rows = await nodes.status()
    assert [type(r) for r in rows] == [NodeStatus, NodeStatus] and rows[1].name == "gpu-1"
    for row in rows:
        _frozen(row)
    sample = await History(scheduler, nodes).sample()
    assert isinstance(sample, Sample) and all(isinstance(b, BankSample) for b in sample.bank)
    assert sample.nodes == 2 and sample.nodes_connected == 2
    _frozen(sample)


def test_the_queue_counts_every_job_state_and_nothing_else() -> None:
    assert {f.name for f in dataclasses.fields(QueueCounts)} == {s.value for s in JobState}
    assert set(farm_pb2.QueueCounts.DESCRIPTOR.fields_by_name) == {s.value for s in JobState}
    counts = QueueCounts.of({s.value: i for i, s in enumerate(JobState, 1)})
    _sent(history.queue_pb(counts), counts)
    assert QueueCounts.of({}) == QueueCounts()


def test_every_field_of_a_node_reaches_the_wire() -> None:
    node = _distinct(NodeStatus, state="quarantined", policy_versions=(3, 4), facts={"gpu": "h200"})
    message = farm_service._node_pb(node)
    assert message.state == farm_pb2.NODE_STATE_QUARANTINED
    _sent(message, dataclasses.replace(node, state=message.state))  # the state is the wire's enum


def test_every_field_of_a_consumer_reaches_the_wire() -> None:
    consumer = _distinct(ConsumerStatus, state="stalled")
    message = farm_service._consumer_pb(consumer)
    assert message.state == farm_pb2.CONSUMER_STATE_STALLED
    _sent(message, dataclasses.replace(consumer, state=message.state))


def test_every_field_of_a_standing_reaches_the_wire_and_a_missing_one_is_absent() -> None:
    standing = _distinct(Standing)
    _sent(farm_service._bank_pb("e", standing), standing)
    totals = Standing(tasks=1, in_band=0, easy=0, hard=1, retired=1, groups=2, sampled=3, band_occupancy=None,
                      fresh_share=0.5, informative_fraction=None)
    message = farm_service._bank_pb("", totals)
    assert not message.HasField("band_occupancy") and not message.HasField("level_pass_rate") and message.level == 0


def test_every_field_of_a_sample_reaches_the_wire() -> None:
    consumer = _distinct(ConsumerStatus, state="consuming")
    bank = _distinct(BankSample)
    queue = QueueCounts(queued=1, leased=2, done=3, failed=4, cancelled=5)
    sample = Sample(time=1.5, queue=queue, throughput_per_s=2.5, policy_version=3, last_seq=4, streams=5, nodes=6,
                    nodes_connected=7, consumers=(consumer,), bank=(bank,))
    message = history.sample_pb(sample)
    _sent(message.queue, queue)
    _sent(message.bank[0], bank)
    sent = message.consumers[0]
    assert set(farm_pb2.ConsumerSample.DESCRIPTOR.fields_by_name) <= {f.name for f in dataclasses.fields(consumer)}
    for name in farm_pb2.ConsumerSample.DESCRIPTOR.fields_by_name:
        assert getattr(sent, name) == pytest.approx(getattr(consumer, name)), name
    for name in ("throughput_per_s", "policy_version", "last_seq", "streams", "nodes", "nodes_connected"):
        assert getattr(message, name) == getattr(sample, name), name
