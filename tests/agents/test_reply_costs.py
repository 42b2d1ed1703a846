"""A model's reply costs farmd its length, never its shape, and never holds farmd's event loop: a real farmd
runs jobs against a server that answers with replies built to make a backtracking reader slow, or with 30 MB
of JSON, while farmd's loop is timed from outside (``tests.probe``)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from farm_client import FarmClient

from tests.probe import LoopProbe

pytestmark = [pytest.mark.sandbox, pytest.mark.clocked]  # they bound how long farmd's loop is held

STALL_S = 0.5
"""The longest a health check may wait on farmd's loop while the replies are read: 0.03-0.2 s here (two cores
shared with the model server, the boxes and other work), where 09d81bf held it for seconds: reading one long
reply, or parsing 30 MB of nested lists (9 s)."""

# A code block of 30,000 blank lines, then a fence that never opens: the shapes that made the fence regex and
# the ``^\\s*def`` search quadratic. It fits in the 64k characters an agent keeps of a reply.
LONG = "```python\n" + "\n" * 30_000 + "```\n" + "```" + "a" * 30_000


def reply(text: str, padding: int = 0) -> bytes:
    """A chat completion of ``text``; with ``padding``, that many one-item lists in a field nobody reads (what
    JSON is slowest to parse: a container per four bytes)."""
    choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
    return json.dumps({"id": "x", "object": "chat.completion", "model": "m", "choices": [choice],
                       "usage": {"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30},
                       "padding": [[0]] * padding}, separators=(",", ":")).encode()


class Server:
    """A model server answering every request with ``body`` (which a test may change between runs)."""

    def __init__(self, body: bytes) -> None:
        self.body = body


@contextmanager
def serving(body: bytes) -> Iterator[tuple[str, Server]]:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    server = Server(body)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", "0")))
            data = server.body
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    http.daemon_threads = True
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{http.server_address[1]}/v1", server
    finally:
        http.shutdown()
        http.server_close()
        thread.join()


def _run_all(client: FarmClient, envs: tuple[str, ...]) -> list[dict[str, Any]]:
    runs = [client.run(env, "openai:m@model", 4, group_size=2)["id"] for env in envs]
    deadline = time.monotonic() + 300
    while any(client.get_run(r)["state"] == "running" for r in runs):
        assert time.monotonic() < deadline, [client.get_run(r) for r in runs]
        time.sleep(0.2)
    return [client.get_run(r) for r in runs]


def _stall(running_farm: Any, tmp_path: Path, body: bytes, envs: tuple[str, ...]) -> tuple[LoopProbe, list[Any]]:
    """Jobs on ``envs`` against a server answering ``body``, farmd's loop timed meanwhile; a first round with a
    short answer makes farmd import what those jobs need (once, at a first job) before it is timed."""
    with serving(reply("no code here, no answer")) as (url, server):
        config = tmp_path / "farm.toml"
        config.write_text(f'[endpoints.model]\nurl = "{url}"\nmax_turns = 2\nmax_attempts = 1\n')
        farm = running_farm("--workers", "2", "--config", str(config))
        with FarmClient(farm.addr) as client:
            _run_all(client, envs)
            server.body = body
            with LoopProbe(farm.addr) as probe:
                done = _run_all(client, envs)
    return probe, done


def test_a_long_reply_is_read_in_time_linear_in_its_length(running_farm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A code task's reply is searched for its function, an action task's for its command and answer, an answer
    task's for its answer block: all in farmd's process, each in one pass over the reply."""
    probe, done = _stall(running_farm, tmp_path, reply(LONG), ("py-func", "shell", "rg:chain_sum"))
    assert all(r["done"] == 4 and r["passed"] == 0 for r in done), done
    assert probe.asked > 10 and probe.worst_s < STALL_S, \
        f"farmd's loop was held {probe.worst_s:.2f} s reading long replies ({probe.asked} checks)"


def test_thirty_megabytes_of_json_are_parsed_where_they_cannot_hold_the_loop(running_farm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    body = reply("<answer>0</answer>", padding=7_500_000)
    assert len(body) > 28 << 20
    probe, done = _stall(running_farm, tmp_path, body, ("rg:chain_sum",))
    assert all(r["done"] == 4 for r in done), done
    assert probe.asked > 10 and probe.worst_s < STALL_S, \
        f"farmd's loop was held {probe.worst_s:.2f} s parsing 30 MB replies ({probe.asked} checks)"
