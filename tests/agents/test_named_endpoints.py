"""Model endpoints named in farm.toml, end to end: a real farmd, farmctl, and real HTTP servers playing models.

A job names an endpoint (``openai:MODEL@NAME``); it can never name a URL, so a caller with
the token cannot make farmd call an address of its choosing or send it a key.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from tests.agents.fake_endpoint import Reply, fake_endpoint

pytestmark = pytest.mark.sandbox

KEY = "sk-only-for-the-fake-endpoint"


def solve(request: dict[str, Any]) -> Reply:
    """A model that does chain sums right: the prompt reads ``... problem: 4 - 1 + 5 =``."""
    prompt = next(m["content"] for m in request["messages"] if m["role"] == "user")
    match = re.search(r"problem: ([-+ \d]+)=", prompt)
    assert match, prompt
    tokens = match.group(1).split()
    total = int(tokens[0])
    for sign, number in zip(tokens[1::2], tokens[2::2], strict=True):
        total += int(number) if sign == "+" else -int(number)
    return Reply.text(f"Adding up.\n<answer>{total}</answer>", token_ids=[7, total % 1000], prompt_token_ids=[1, 2],
                      logprobs=[-0.5, -0.25])


async def test_jobs_name_endpoints_from_the_config_never_urls(running_farm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    async with fake_endpoint(solve) as keyed, fake_endpoint(solve) as open_:
        config = tmp_path / "farm.toml"
        config.write_text(f'[endpoints.fake]\nurl = "{keyed.url}"\nkey_env = "FARM_TEST_FAKE_KEY"\n'
                          f"request_timeout_s = 20\nmax_attempts = 2\nseed = 5\n\n"
                          f'[endpoints.open]\nurl = "{open_.url}"\n')
        farm = running_farm("--workers", "2", "--config", str(config), env={**os.environ, "FARM_TEST_FAKE_KEY": KEY})

        async def farmctl(*args: str, check: bool = True) -> Any:
            return await asyncio.to_thread(farm.farmctl, *args, check=check)

        names = b"; configured: fake, open"
        for spec, why in [(f"openai:m@{keyed.url}", b"a URL in an agent spec is not accepted"),
                          ("openai:m@nowhere", b"no endpoint named 'nowhere'"),
                          ("openai:m@fake?timeout_s=86400", b"request_timeout_s in farm.toml's [endpoints.fake]"),
                          ("openai:m@fake?key_env=FARM_TEST_FAKE_KEY", b"key_env in farm.toml's [endpoints.fake]")]:
            refused = await farmctl("run", "--env", "rg:chain_sum", "--agent", spec, "--rollouts", "1", check=False)
            assert refused.returncode != 0 and b"INVALID_ARGUMENT" in refused.stderr, refused.stderr
            assert why in refused.stderr, refused.stderr
            assert names in refused.stderr or b"[endpoints.fake]" in why, refused.stderr
        queue = json.loads((await farmctl("status", "--json")).stdout)["queue"]
        assert queue["queued"] == queue["leased"] == queue["done"] == queue["failed"] == 0, "nothing was queued"
        assert keyed.calls == open_.calls == 0

        ran = json.loads((await farmctl("run", "--env", "rg:chain_sum", "--agent", "openai:m@fake?max_tokens=64",
                                        "--rollouts", "4", "--group-size", "2", "--wait", "--json")).stdout)
        assert (ran["done"], ran["passed"], ran["failed"]) == (4, 4, 0)
        assert keyed.calls == 4 and open_.calls == 0
        assert {h.get("authorization") for h in keyed.headers} == {f"Bearer {KEY}"}
        assert {r["model"] for r in keyed.requests} == {"m"} and {r["max_tokens"] for r in keyed.requests} == {64}

        await farmctl("run", "--env", "rg:chain_sum", "--agent", "openai:other@open", "--rollouts", "2", "--wait")
        assert open_.calls == 2 and keyed.calls == 4
        assert all("authorization" not in h for h in open_.headers), "a key goes only to its own endpoint"

        rows = json.loads((await farmctl("trajectories", "list", "--env", "rg:chain_sum", "--json")).stdout)
        assert sorted((r["agent"], r["reward"]) for r in rows) == (
            [("openai:m@fake?max_tokens=64", 1.0)] * 4 + [("openai:other@open", 1.0)] * 2)
        export = tmp_path / "all.jsonl"
        await farmctl("export", "--format", "jsonl", "--out", str(export))
        assert KEY not in export.read_text() and KEY not in farm.log.read_text()
        # What the model's server returned is stored with each trajectory, as served.
        records = [json.loads(line) for line in export.read_text().splitlines()]
        keyed_rows = [r for r in records if r["agent"].endswith("@fake?max_tokens=64")]
        assert len(keyed_rows) == 4
        for row in keyed_rows:
            (turn,) = row["turns"]
            assert (turn["token_ids"][0], turn["prompt_token_ids"], turn["logprobs"], turn["has_logprobs"]) == (
                7, [1, 2], [-0.5, -0.25], True)
            assert row["messages"][turn["message_index"]]["content"] == turn["completion"]
            # Each rollout samples with the endpoint's seed offset by its id: a group is not one sample repeated.
            assert (row["sampling"]["model"], row["sampling"]["seed"], row["sampling"]["max_tokens"]) == \
                ("m", 5 + row["id"], 64)
        assert sorted(r["seed"] for r in keyed.requests) == sorted(5 + row["id"] for row in keyed_rows)
