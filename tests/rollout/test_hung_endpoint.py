"""A model server that hangs without answering does not stop the rest of the farm.

A worker of two slots, an endpoint whose server accepts every connection and never answers (its health checks
too), a default request timeout of 300 s, and forty of its jobs queued before anything else: the reference's
jobs on another environment still finish in seconds, because a model endpoint's jobs hold no rollout slot (their
own cap bounds them), and the hung server is found by its health checks and its jobs are no longer leased.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from farm_client import FarmClient

from tests.agents.fake_endpoint import Reply, fake_endpoint


@contextmanager
def hung_server() -> Iterator[str]:
    """A server on port 0 that reads every request and answers none (``/health`` included); its URL."""
    ready = threading.Event()
    stop: asyncio.Event | None = None
    url: list[str] = []

    async def serve() -> None:
        nonlocal stop
        stop = asyncio.Event()
        async with fake_endpoint(lambda request: Reply.hang()) as ep:
            ep.health = Reply.hang()
            url.append(ep.url)
            ready.set()
            await stop.wait()

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    ready.wait(10)
    try:
        yield url[0]
    finally:
        assert stop is not None
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()


def test_a_hung_server_does_not_stop_other_agents(running_farm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with hung_server() as url:
        config = tmp_path / "farm.toml"
        config.write_text(f'[endpoints.hung]\nurl = "{url}"\nmax_in_flight = 4\n')
        farm = running_farm("--workers", "2", "--config", str(config))
        with FarmClient(farm.addr) as client:
            stuck = client.run("arith", "openai:m@hung", 40, group_size=1)
            time.sleep(1.0)  # the hung endpoint's jobs are leased first, while its server still looks up
            started = time.monotonic()
            other = client.run("arith", "reference", 16, group_size=4)
            deadline = started + 60
            while client.get_run(other["id"])["state"] == "running":
                assert time.monotonic() < deadline, "the reference's jobs waited behind a hung model server"
                time.sleep(0.2)
            took = time.monotonic() - started
            done = client.get_run(other["id"])
            assert done["done"] == 16 and done["failed"] == 0, done
            assert took < 20, f"the reference's 16 rollouts took {took:.1f} s beside a hung server"
            hung = client.get_run(stuck["id"])
            assert hung["done"] == 0, "a server that never answers produced a trajectory"
            # Found by its health checks (two of 2 s each, a second apart), long before the 300 s request timeout.
            while "taken out" not in farm.log.read_text():
                assert time.monotonic() - started < 15, "the hung server was never found by its health checks"
                time.sleep(0.2)
