"""A group's rollouts make their task once: concurrent askers share one making, failures are not kept."""

from __future__ import annotations

import asyncio
import threading

import pytest

from farmd.envs import VerifyContext, get
from farmd.envs.task_cache import TaskCache
from farmd.errors import TaskError


@pytest.mark.parametrize("inline", [True, False], ids=["inline", "in-a-thread"])
async def test_a_group_asking_at_once_makes_its_task_once(inline: bool) -> None:
    env = get("arith")
    assert env.generates_inline, "arith's problems take microseconds: made on the event loop"
    made: list[int] = []
    threads: set[str] = set()
    generate = env.generate
    lock = threading.Lock()

    def counted(seed: int, difficulty: int):  # type: ignore[no-untyped-def]
        with lock:
            made.append(seed)
            threads.add(threading.current_thread().name)
        return generate(seed, difficulty)

    env.generate = counted  # type: ignore[method-assign]
    env.generates_inline = inline
    seed = 987_654 if inline else 987_655
    try:
        ctx = VerifyContext(sandbox=None, key=None)  # type: ignore[arg-type]
        tasks = await asyncio.gather(*(env.make_task(seed, 2, ctx) for _ in range(8)))
        again = await env.make_task(seed, 2, ctx)
    finally:
        del env.generate
        del env.generates_inline
    assert made == [seed], "one making for eight askers, and none for the next group"
    assert (threads == {threading.current_thread().name}) is inline
    assert all(t is tasks[0] for t in [*tasks, again]) and tasks[0] == generate(seed, 2)
    with pytest.raises(TaskError):
        await env.make_task(1, 99, ctx)


async def test_failures_are_not_kept_and_one_cancelled_asker_stops_no_one() -> None:
    cache: TaskCache[str] = TaskCache(kept=2)
    calls = 0
    gate = asyncio.Event()

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        await gate.wait()
        if calls == 1:
            raise RuntimeError("no")
        return f"made {calls}"

    first = [asyncio.ensure_future(cache.get("k", flaky)) for _ in range(3)]
    await asyncio.sleep(0)
    first[0].cancel()
    gate.set()
    results = await asyncio.gather(*first, return_exceptions=True)
    assert isinstance(results[0], asyncio.CancelledError)
    assert all(isinstance(r, RuntimeError) for r in results[1:]), "the others got the making's own outcome"
    assert await cache.get("k", flaky) == "made 2", "a failure is made again"
    assert await cache.get("k", flaky) == "made 2" and calls == 2
    for key in ("a", "b"):
        await cache.get(key, flaky)
    assert await cache.get("k", flaky) == "made 5", "the oldest was let go past its bound"
