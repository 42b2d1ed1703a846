"""Shared by the recall tests: verify the reference attempt of many tasks, concurrently, in one sandbox."""

from __future__ import annotations

import asyncio

from farmd.envs import Environment, VerifyContext
from farmd.sandbox import Sandbox, SandboxConfig
from farmd.verifier import Verdict, VerifierKey


async def verify_references(env: Environment, seeds: range, levels: range, concurrency: int = 3,
                            warm_boxes: int = 2) -> list[tuple[int, int, Verdict]]:
    key = VerifierKey(b"recall-test-key-" + env.name.encode())
    limit = asyncio.Semaphore(concurrency)
    async with Sandbox(SandboxConfig(warm_boxes=warm_boxes)) as sandbox:
        ctx = VerifyContext(sandbox=sandbox, key=key)

        async def one(seed: int, level: int) -> tuple[int, int, Verdict]:
            async with limit:
                task = env.generate(seed, level)
                return seed, level, await env.verify(task, env.reference(task), ctx)

        return list(await asyncio.gather(*[one(s, d) for d in levels for s in seeds]))


def failures(results: list[tuple[int, int, Verdict]]) -> list[str]:
    return [f"seed {s} level {d}: {v.status} {v.reasons[:2]}" for s, d, v in results if not v.passed]
