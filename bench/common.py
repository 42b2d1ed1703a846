"""What every bench module needs: a real farmd to measure, a trainer's drain of its stream, and the
closing lines of a report (goals met or not, and what limits each figure)."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import cast

import grpc
from farm_client import Batch, FarmClient
from farm_client.record import Trajectory
from rich.console import Console

from farmd.cli.local_farmd import LocalFarmd


@contextlib.contextmanager
def farmd(data: Path, workers: int, timeout_s: float = 60.0) -> Iterator[str]:
    """``farmd serve`` on port 0 with ``data``; yields its address; SIGTERM and wait on the way out."""
    env = {k: v for k, v in os.environ.items() if k != "FARM_TOKEN"}  # the client sends no token
    with LocalFarmd(data, "--workers", str(workers), log_path=data.parent / f"{data.name}.log", env=env,
                    start_timeout_s=timeout_s) as running:
        yield running.addr


def drain(client: FarmClient, consumer: str, count: int, batch_size: int, *, whole_groups: bool = False,
          tick: Callable[[int], None] | None = None, deadline_s: float = 300.0) -> list[Trajectory]:
    """Take ``count`` trajectories from ``consumer``'s stream, acking each batch as a trainer does.

    A stream waits for ever; after ``deadline_s`` (rollouts that failed for good never arrive) the
    client's channel is closed under it, and that is an error.
    """
    got: list[Trajectory] = []
    # A generator, whatever its annotation says: closing it cancels the RPC now, not at collection.
    stream = cast(Generator[Batch, None, None],
                  client.batches(consumer, batch_size=batch_size, whole_groups=whole_groups))
    watchdog = threading.Timer(deadline_s, client.close)
    watchdog.start()
    try:
        for batch in stream:
            got += batch.trajectories
            client.ack(batch)
            if tick:
                tick(len(batch))
            if len(got) >= count:
                break
    except grpc.RpcError as exc:
        raise RuntimeError(f"{consumer}: {len(got)} of {count} trajectories arrived in {deadline_s:g}s "
                           f"({exc.code().name})") from exc
    finally:
        watchdog.cancel()
        stream.close()
    return got


def verdicts(console: Console, met: Mapping[str, bool], limits: Sequence[str], *,
             goals: Mapping[str, str] | None = None, how: str = " (found by measuring parts of it apart, on "
             "this code)") -> None:
    """A report's last lines: each goal met or not (with what it asks, where given), then what limits
    each figure."""
    for name, ok in met.items():
        asked = f" ({goals[name]})" if goals and name in goals else ""
        console.print(f"  {'met' if ok else 'NOT met'}: {name}{asked}")
    console.print(f"What limits each figure{how}:")
    for line in limits:
        console.print(f"  - {line}")
