"""farmd against real vLLM servers (its CPU build, ``make vllm-setup``), started once for this module.

Two servers of the loop's model (``farm_trainer.hf.build_model``), each serving it as ``policy`` and ``other``, each
behind a recording proxy (a real HTTP forwarder that keeps every chat request and the server's raw reply), form one
endpoint ``[endpoints.vllm]`` of two replicas that serves the policy line ``policy``. The checks:

- records carry exactly the token ids, prompt token ids and logprobs the server returned for that request, and a
  group's first requests go as one request with ``n`` and the first attempt's seed, each attempt its own choice;
- a published version reaches both servers without a restart: a greedy prompt then gives that version's output
  (computed by transformers from the same weights), and what is sampled from then on is stamped with it, read back
  from the server; another model on the same server is stamped 0;
- a replica killed mid-run loses no rollout and scores none 0.

Skipped, saying why, only when the vLLM venv is not built (``make test`` builds it).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from farm_client import FarmClient
from farm_client.record import Trajectory

from farmd.cli.vllm_server import VllmServer, ensure_model, vllm_python
from farmd.errors import VllmFailed

# The module's servers start inside its first test's time: two vLLM servers on two cores beside the rest of the
# suite took 141 s once (20-40 s alone), past pytest's 120 s; each server's own wait (240 s) says why first.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(360)]


class Proxy:
    """A forwarder on port 0 to one server's root: every request passes; chat requests and replies are kept."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.exchanges: list[tuple[dict[str, Any], dict[str, Any]]] = []
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self, method: str) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                try:
                    with httpx.Client(timeout=120) as http:
                        answer = http.request(method, proxy.upstream + self.path, content=body,
                                              headers={"content-type": "application/json"} if body else {})
                    status, data = answer.status_code, answer.content
                except httpx.HTTPError as exc:
                    status, data = 502, json.dumps({"error": str(exc)}).encode()
                if method == "POST" and self.path == "/v1/chat/completions" and status == 200:
                    with proxy.lock:
                        proxy.exchanges.append((json.loads(body), json.loads(data)))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._forward("GET")

            def do_POST(self) -> None:
                self._forward("POST")

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self.thread.start()

    def chats(self) -> int:
        with self.lock:
            return len(self.exchanges)

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


class Servers:
    def __init__(self, model: Path, servers: list[VllmServer], proxies: list[Proxy]) -> None:
        self.model = model
        self.servers = servers
        self.proxies = proxies

    def config(self, tmp_path: Path, **settings: Any) -> Path:
        lines = ["[endpoints.vllm]", f"url = {json.dumps([p.url for p in self.proxies])}", 'serves = "policy"',
                 "max_tokens = 8", "health_timeout_s = 1.0"]
        lines += [f"{k} = {json.dumps(v)}" for k, v in settings.items()]
        path = tmp_path / "farm.toml"
        path.write_text("\n".join(lines) + "\n")
        return path

    def exchanges(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        return [e for p in self.proxies for e in p.exchanges]


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    if vllm_python() is None:
        pytest.skip("the vLLM venv is not built (make vllm-setup builds it; make test does)")
    where = tmp_path_factory.mktemp("vllm")
    model = ensure_model(where / "model")
    servers = [VllmServer(model, ("policy", "other"), where / f"vllm{i}.log", wait=False, max_num_seqs=16)
               for i in range(2)]
    proxies: list[Proxy] = []
    try:
        for server in servers:
            server.wait_ready()
        proxies = [Proxy(s.root) for s in servers]
        yield Servers(model, servers, proxies)
    except VllmFailed as exc:
        pytest.fail(f"vLLM did not start: {exc}")
    finally:
        for proxy in proxies:
            proxy.close()
        for server in servers:
            server.stop()


def _wait_run(client: FarmClient, run_id: int, timeout_s: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while (run := client.get_run(run_id))["state"] == "running":
        assert time.monotonic() < deadline, run
        time.sleep(0.2)
    return run


def _run(client: FarmClient, agent: str, rollouts: int, group_size: int = 4) -> tuple[dict[str, Any], list[Trajectory]]:
    run = _wait_run(client, client.run("arith", agent, rollouts, group_size)["id"])
    return run, client.trajectories(limit=rollouts, full=True, run_id=run["id"])


def test_records_carry_exactly_what_vllm_returned_and_a_group_is_one_request_with_n(
        vllm: Servers, running_farm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    farm = running_farm("--workers", "2", "--config", str(vllm.config(tmp_path, n=4, seed=1000)))
    seen = len(vllm.exchanges())
    with FarmClient(farm.addr) as client:
        run, rows = _run(client, "openai:policy@vllm", 16)
    assert run["done"] == 16 and run["failed"] == 0, run
    exchanges = vllm.exchanges()[seen:]
    by_seed = {request["seed"]: (request, reply) for request, reply in exchanges}
    assert len(by_seed) == len(exchanges), "two requests carried one seed"
    for t in rows:
        request, reply = by_seed[t.sampling.seed]
        turn = t.turns[0]
        choice = reply["choices"][turn.choice_index]
        assert request["n"] == t.sampling.n == 4 and request["model"] == "policy"
        assert request["logprobs"] is True and request["return_token_ids"] is True
        assert turn.token_ids == choice["token_ids"]
        assert turn.prompt_token_ids == reply["prompt_token_ids"]
        sent = [e["logprob"] for e in choice["logprobs"]["content"]]
        assert np.array_equal(np.float32(turn.logprobs), np.float32(sent))  # the record keeps them as float32
        assert t.policy_version == 0, "nothing was published: the server's label says no version of the line"
    # Every group was one request of four choices, each attempt its own, its seed the first attempt's (1000 + id).
    groups: dict[int, list[Trajectory]] = {}
    for t in rows:
        groups.setdefault(t.group_id, []).append(t)
    for members in groups.values():
        assert sorted(t.turns[0].choice_index for t in members) == [0, 1, 2, 3]
        assert {t.sampling.seed for t in members} == {1000 + min(t.id for t in members)}
    # The trainer's rows are these tokens, and its model gives them the logprobs the server sampled them with:
    # the importance ratio starts at 1.
    from farm_client.tensors import collate
    from farm_trainer.hf import HFPolicy
    from farm_trainer.hf_loop import hf_logprobs

    policy = HFPolicy.load(vllm.model)
    tensors = collate(rows, pad_id=policy.pad_id)
    with torch.no_grad():
        mine = hf_logprobs(policy.model, tensors.input_ids)
    mask = tensors.loss_mask > 0
    assert mask.sum() > 0 and torch.allclose(mine[mask], tensors.logprobs[mask], atol=1e-4)


def _greedy(policy: Any, prompt_ids: list[int], steps: int) -> list[int]:
    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(steps):
            logits = policy.model(input_ids=torch.tensor([ids])).logits[0, -1]
            ids.append(int(logits.argmax()))
            if ids[-1] == policy.eos_id:
                break
    return ids[len(prompt_ids):]


def _server_greedy(server: VllmServer, prompt: str) -> tuple[list[int], list[int]]:
    reply = httpx.post(server.url + "/chat/completions", timeout=60, json={
        "model": "policy", "messages": [{"role": "user", "content": prompt}], "max_tokens": 6, "temperature": 0,
        "return_token_ids": True}).json()
    return reply["prompt_token_ids"], reply["choices"][0]["token_ids"]


def _labels(vllm: Servers) -> list[str]:
    return [httpx.get(s.root + "/weight_info", timeout=10).json()["weight_version"] for s in vllm.servers]


def test_a_reload_changes_the_stamp_and_the_greedy_output(
        vllm: Servers, running_farm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from farm_trainer.hf import HFPolicy

    farm = running_farm("--workers", "2", "--config", str(vllm.config(tmp_path)))
    policy = HFPolicy.load(vllm.model)
    outputs = []
    with FarmClient(farm.addr) as client:
        for round_ in range(2):
            with torch.no_grad():
                generator = torch.Generator().manual_seed(round_)
                for p in policy.model.parameters():
                    p.add_(torch.randn(p.shape, generator=generator) * 0.2)
            version = int(client.publish_policy(policy.weights(), name="policy")["version"])
            deadline = time.monotonic() + 30
            while not all(label.startswith(f"policy:{version}:") and not label.endswith("loading")
                          for label in _labels(vllm)):
                assert time.monotonic() < deadline, f"version {version} did not reach both servers: {_labels(vllm)}"
                time.sleep(0.1)
            for server in vllm.servers:
                prompt_ids, sampled = _server_greedy(server, "4-1+5=")
                assert sampled == _greedy(policy, prompt_ids, 6), f"the server's greedy output is not v{version}'s"
            outputs.append(sampled)
            run, rows = _run(client, "openai:policy@vllm", 8)
            assert run["done"] == 8 and {t.policy_version for t in rows} == {version}, \
                ([t.policy_version for t in rows], [line for line in farm.log.read_text().splitlines()
                                                     if "endpoint" in line or "weight" in line][-30:])
            _, others = _run(client, "openai:other@vllm", 4)
            assert {t.policy_version for t in others} == {0}, "another model on the server took the line's version"
    assert outputs[0] != outputs[1], "two versions gave one greedy output: the reload changed nothing"


def test_a_replica_killed_mid_run_loses_no_rollout_and_scores_none_0(
        vllm: Servers, running_farm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    farm = running_farm("--workers", "2", "--config", str(vllm.config(tmp_path, max_in_flight=8)))
    with FarmClient(farm.addr) as client:
        run_id = client.run("arith", "openai:policy@vllm", 96, 1)["id"]
        victim = vllm.servers[1]
        deadline = time.monotonic() + 60
        while vllm.proxies[1].chats() < 8 or client.get_run(run_id)["done"] < 16:
            assert time.monotonic() < deadline, "the second replica was never asked"
            time.sleep(0.05)
        sockets = [p for p in victim.scratch.iterdir() if p.is_socket()]
        victim.signal(9)
        run = _wait_run(client, run_id)
        rows = client.trajectories(limit=200, full=True, run_id=run_id)
    # A killed server's engine sockets were in its own directory, which its stop removes: none is left in /tmp.
    assert sockets, "vLLM's sockets are not in the server's own directory"
    victim.stop()
    assert not victim.scratch.exists()
    assert run["done"] == 96 and run["failed"] == 0, run
    assert len(rows) == 96 and all(t.status == "ok" and t.turns and t.turns[0].token_ids for t in rows), \
        "a rollout was lost, or stored without the model's tokens"
    assert "taken out" in farm.log.read_text()
