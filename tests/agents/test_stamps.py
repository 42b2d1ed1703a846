"""Only what a server says it sampled with is stamped on a trajectory, through a real farmd.

An endpoint that serves the policy line ``policy`` (a real HTTP server on port 0 standing in for vLLM, its weight
label scripted), a version of the line published: a trajectory of another model on the same server is stamped 0,
and so is one of the policy's model from a server that cannot say which weights it had; one whose server said
the version before and after is stamped with it. Before, every model of the endpoint took the line's newest
version, whatever the server had.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from farm_client import FarmClient

from tests.agents.fake_endpoint import Reply, threaded_endpoint


def _run(client: FarmClient, agent: str) -> list[Any]:
    run_id = client.run("arith", agent, 4, 2)["id"]
    deadline = time.monotonic() + 60
    while client.get_run(run_id)["state"] == "running":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    return client.trajectories(limit=4, full=True, run_id=run_id)


def test_only_a_version_the_server_said_is_stamped(running_farm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with threaded_endpoint(lambda r: Reply.text("7", token_ids=[5, 2], logprobs=[-0.5, -0.1])) as ep:
        config = tmp_path / "farm.toml"
        config.write_text(f'[endpoints.vllm]\nurl = "{ep.url}"\nserves = "policy"\nsync = "none"\n')
        farm = running_farm("--workers", "2", "--config", str(config))
        with FarmClient(farm.addr) as client:
            version = int(client.publish_policy(b"weights of some model", name="policy")["version"])
            assert {t.policy_version for t in _run(client, "openai:other@vllm")} == {0}
            assert {t.policy_version for t in _run(client, "openai:policy@vllm")} == {0}  # it cannot say
            ep.label = f"policy:{version}"  # the trainer loaded it and said so (sync = "none")
            assert {t.policy_version for t in _run(client, "openai:policy@vllm")} == {version}
            ep.label = "other-line:5"
            assert {t.policy_version for t in _run(client, "openai:policy@vllm")} == {0}
