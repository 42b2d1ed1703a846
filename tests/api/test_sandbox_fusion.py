"""farmd's SandboxFusion API (``farmd serve --sandbox-fusion``), called with the ``sandbox-fusion`` client itself:
its ``run_code`` against a real farmd on port 0, each call in a real box. What a program does (exits, times out,
floods, forks, allocates, connects, writes outside, kills its own group) comes back as the caller's ``Failed``,
never as SandboxError, and farmd keeps answering; who may call, what is too large and what is malformed are
refused with SandboxFusion's (FastAPI's) status codes and shapes."""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests
from sandbox_fusion import CommandRunStatus, RunCodeRequest, RunCodeResponse, RunStatus, run_code

from tests.conftest import RunningFarm

pytestmark = pytest.mark.sandbox

TOKENS = {"trainer": "trainer-token-0123456789", "operator": "operator-token-0123456789",
          "environment": "environment-token-0123456789"}
MB = 1 << 20


class Request(RunCodeRequest):
    """SandboxFusion's server takes ``memory_limit_MB``; the 0.3.7 client's model lacks it (and drops unknown
    fields), so a caller that sets it declares it as the server's model does."""

    memory_limit_MB: int = -1


class Farm:
    def __init__(self, farm: RunningFarm) -> None:
        self.farm = farm
        info = json.loads((farm.data_dir / "farmd.json").read_text())
        self.addr: str = info["sandbox_fusion"]
        self.url = f"http://{self.addr}"
        self.endpoint = f"http://trainer:{TOKENS['trainer']}@{self.addr}"
        """What a SandboxFusion user sets (SANDBOX_FUSION_ENDPOINT): the client sends the token as basic auth."""

    def run(self, code: str, language: str = "python", **fields: Any) -> RunCodeResponse:
        # One attempt: a SandboxError raises at once instead of being retried into a pass.
        return run_code(Request(code=code, language=language, **fields), endpoint=self.endpoint, max_attempts=1,
                        client_timeout=120)

    def post(self, body: Any, token: str | None = TOKENS["trainer"], **kwargs: Any) -> requests.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if isinstance(body, bytes):
            return requests.post(f"{self.url}/run_code", data=body, headers=headers, timeout=60, **kwargs)
        return requests.post(f"{self.url}/run_code", json=body, headers=headers, timeout=60, **kwargs)

    def answers(self) -> None:
        """farmd is unharmed: a fresh call still runs."""
        resp = self.run("print(6 * 7)")
        assert resp.status == RunStatus.Success and resp.run_result is not None
        assert resp.run_result.stdout == "42\n"
        assert self.farm.proc.poll() is None


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Farm]:
    tmp = tmp_path_factory.mktemp("sandbox-fusion")
    toml = tmp / "farm.toml"
    # The listen address from [farm] (as atropos_listen), the credentials as any API's.
    toml.write_text('[farm]\nsandbox_fusion_listen = "127.0.0.1:0"\n' + "".join(
        f'\n[[credentials]]\nname = "{who}"\nroles = ["{who}"]\n'
        f'token_sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"\n' for who, token in TOKENS.items()))
    running = RunningFarm(tmp / "farm", "--workers", "0", "--config", str(toml))
    try:
        yield Farm(running)
    finally:
        running.stop()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# -- what SandboxFusion's documentation says run_code does -----------------------------------------------


def test_python_and_bash_run_and_answer_in_sandbox_fusions_shapes(farm: Farm) -> None:
    resp = farm.run("import sys\nprint('hello')\nprint('warn', file=sys.stderr)")
    assert resp.status == RunStatus.Success and resp.message == ""
    assert resp.compile_result is None, "python does not compile, as in SandboxFusion"
    assert resp.run_result is not None and resp.run_result.status == CommandRunStatus.Finished
    assert (resp.run_result.return_code, resp.run_result.stdout, resp.run_result.stderr) == (0, "hello\n", "warn\n")
    assert resp.run_result.execution_time is not None and 0 < resp.run_result.execution_time < 10

    resp = farm.run("echo from bash; echo err >&2; exit 0", language="bash")
    assert resp.status == RunStatus.Success and resp.run_result is not None
    assert (resp.run_result.stdout, resp.run_result.stderr) == ("from bash\n", "err\n")

    for code, language in (("import sys; sys.exit(3)", "python"), ("exit 3", "bash")):
        resp = farm.run(code, language=language)
        assert resp.status == RunStatus.Failed, "a non-zero exit is the caller's failure"
        assert resp.run_result is not None and resp.run_result.status == CommandRunStatus.Finished
        assert resp.run_result.return_code == 3


def test_python_runs_as_python_file_runs_it(farm: Farm) -> None:
    resp = farm.run("import sys, threading\nassert __name__ == '__main__' and sys.argv[0].endswith('.py')\n"
                    "threading.Thread(target=lambda: print('thread done')).start()\nprint('main done')")
    assert resp.status == RunStatus.Success, resp
    assert resp.run_result is not None and sorted(resp.run_result.stdout.splitlines()) == ["main done", "thread done"]
    resp = farm.run("def f():\n    raise ValueError('boom')\nf()")
    assert resp.run_result is not None and resp.run_result.return_code == 1
    stderr = resp.run_result.stderr or ""
    assert stderr.startswith("Traceback (most recent call last):\n  File \"/box/_sandbox_fusion_main.py\", line 3")
    assert stderr.endswith("ValueError: boom\n")
    resp = farm.run("import sys; sys.exit('bad input')")
    assert resp.run_result is not None and (resp.run_result.return_code, resp.run_result.stderr) == (1, "bad input\n")
    resp = farm.run("import multiprocessing as mp\nif __name__ == '__main__':\n"
                    "    with mp.get_context('fork').Pool(2) as pool: print(sum(pool.map(abs, [-1, -2, 3])))")
    assert resp.status == RunStatus.Success and resp.run_result is not None and resp.run_result.stdout == "6\n", \
        "children the code waits for are not processes left behind"
    resp = farm.run("import os; os.kill(os.getpid(), 11)")
    assert resp.run_result is not None and resp.run_result.return_code == -11, "its own signal"


def test_stdin_reaches_the_program(farm: Farm) -> None:
    resp = farm.run("a = input(); b = input(); print(int(a) + int(b))", stdin="2\n40\n")
    assert resp.status == RunStatus.Success and resp.run_result is not None and resp.run_result.stdout == "42\n"
    resp = farm.run('read x; echo "got $x"; cat', language="bash", stdin="one\ntwo ünï\n")
    assert resp.run_result is not None and resp.run_result.stdout == "got one\ntwo ünï\n"
    resp = farm.run("import sys; print(repr(sys.stdin.read()))")
    assert resp.run_result is not None and resp.run_result.stdout == "''\n", "no stdin: an empty one"


def test_files_go_in_first_and_fetch_files_come_back(farm: Farm) -> None:
    code = ("import os\n"
            "data = open('data/in.txt').read()\n"
            "open('out.txt', 'w').write(data.upper())\n"
            "os.makedirs('deep/er', exist_ok=True)\n"
            "open('deep/er/bin', 'wb').write(bytes(range(256)))\n"
            "os.symlink('/etc/passwd', 'link.txt')\n"
            "print(sorted(os.listdir('.')))\n")
    resp = farm.run(code, files={"data/in.txt": b64(b"hello farm"), "skipped": None},
                    fetch_files=["out.txt", "deep/er/bin", "data/in.txt", "missing.txt", "link.txt"])
    assert resp.status == RunStatus.Success, resp
    assert resp.files.keys() == {"out.txt", "deep/er/bin", "data/in.txt"}, \
        "a path the program did not leave is absent, and a link is never followed"
    assert base64.b64decode(resp.files["out.txt"]) == b"HELLO FARM"
    assert base64.b64decode(resp.files["deep/er/bin"]) == bytes(range(256))
    resp = farm.run("cat in.bin | wc -c; printf abc > made", language="bash", files={"in.bin": b64(b"\0" * 1000)},
                    fetch_files=["made"])
    assert resp.run_result is not None and resp.run_result.stdout.strip() == "1000"
    assert base64.b64decode(resp.files["made"]) == b"abc"


def test_run_timeout_is_time_limit_exceeded(farm: Farm) -> None:
    for code, language in (("while True: pass", "python"), ("import time; print('started', flush=True); "
                                                            "time.sleep(60)", "python"), ("sleep 60", "bash")):
        started = time.monotonic()
        resp = farm.run(code, language=language, run_timeout=1)
        assert time.monotonic() - started < 15
        assert resp.status == RunStatus.Failed, "a timeout is the caller's failure, never a SandboxError"
        assert resp.run_result is not None and resp.run_result.status == CommandRunStatus.TimeLimitExceeded
        assert resp.run_result.return_code is None
    # The program's own time: the box's clock for run_timeout starts as the box does, a little before the program,
    # so a program stopped at 1 s has run a little under it (0.9996 s in one run).
    assert resp.run_result.execution_time is not None and resp.run_result.execution_time >= 0.9
    resp = farm.run("import time; print('started', flush=True); time.sleep(60)", run_timeout=1.5)
    assert resp.run_result is not None and resp.run_result.stdout == "started\n", "what it printed comes back"


def test_compile_errors_are_the_callers_failure(farm: Farm) -> None:
    resp = farm.run("def f(:\n    pass\n", compile_timeout=5)
    assert resp.status == RunStatus.Failed and resp.run_result is not None
    assert resp.run_result.return_code == 1 and "SyntaxError" in (resp.run_result.stderr or "")
    resp = farm.run("if then fi (", language="bash")
    assert resp.status == RunStatus.Failed and resp.run_result is not None and resp.run_result.return_code == 2


def test_memory_limit_mb_bounds_the_box(farm: Farm) -> None:
    grab = "b = bytearray({n} << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('held')"
    resp = farm.run(grab.format(n=200), memory_limit_MB=64)
    assert resp.status == RunStatus.Failed and resp.run_result is not None
    assert resp.run_result.status == CommandRunStatus.Finished and resp.run_result.return_code == -9, \
        "killed by the memory bound: its own signal, as a killed process reads in SandboxFusion"
    assert "memory" in resp.message
    resp = farm.run(grab.format(n=200), memory_limit_MB=400)
    assert resp.status == RunStatus.Success, "the caller's bound, not a fixed one"
    resp = farm.run(grab.format(n=640), memory_limit_MB=1024)
    assert resp.status == RunStatus.Success, "up to the ceiling a call may raise farm's default (512 MiB)"


# -- hostile programs: the caller's failure, farmd unharmed --------------------------------------------------


HOSTILE = {
    "python fork bomb": ("import os\nwhile True:\n    try: os.fork()\n    except OSError: pass", "python"),
    "bash fork bomb": (":(){ :|:& };:", "bash"),
    "allocating past memory": ("x = []\nwhile True: x.append(bytearray(16 << 20)); x[-1][::4096] = b'1' * 4096",
                               "python"),
    "allocating in bash": ("a=x; while true; do a=$a$a; done", "bash"),
    "network, the internet": ("import socket; socket.create_connection(('1.1.1.1', 53), timeout=3)", "python"),
    "network, farmd's own port": ("import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3)",
                                  "python"),
    "network, bash": ("exec 3<>/dev/tcp/127.0.0.1/{port}", "bash"),
    "output flood": ("import sys\nwhile True: sys.stdout.write('x' * 65536)", "python"),
    "stderr flood in bash": ("yes flood >&2", "bash"),
    "killing its own process group": ("import os, signal; os.killpg(0, signal.SIGKILL)", "python"),
    "killing everything it can": ("kill -9 -1; sleep 5", "bash"),
    "killing itself": ("kill -SEGV $$", "bash"),
    "exiting 0 with a child left running": ("import os, time\nif os.fork() == 0:\n    time.sleep(60)", "python"),
    "os._exit(0) with a child left running": ("import os, time\nif os.fork() == 0:\n    time.sleep(60)\nos._exit(0)",
                                              "python"),
    "exec'ing away with a child left running": ("import os, time\nif os.fork() == 0:\n    time.sleep(60)\n"
                                                "os.execv('/bin/true', ['true'])", "python"),
    "exiting 0 with a job left running": ("sleep 60 &\nexit 0", "bash"),
    "exiting 0 with a daemon left running": ("import os, time\nif os.fork() == 0:\n    os.setsid()\n"
                                             "    if os.fork() == 0:\n        time.sleep(60)", "python"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_code_is_the_callers_failure(farm: Farm, name: str) -> None:
    code, language = HOSTILE[name]
    resp = farm.run(code.replace("{port}", farm.addr.rsplit(":", 1)[1]), language=language, run_timeout=5)
    assert resp.status == RunStatus.Failed, f"{name}: {resp}"
    assert resp.run_result is not None
    assert len(resp.run_result.stdout or "") + len(resp.run_result.stderr or "") <= 2 * 1024 * 1024 + 4096
    farm.answers()


def test_writing_outside_the_scratch_dir_leaves_the_host_untouched(farm: Farm, tmp_path: Path) -> None:
    host = tmp_path / "host.txt"
    host.write_text("original")
    host.chmod(0o666)
    for path in (host, farm.farm.data_dir / "farm.db", Path("/etc/hostname")):
        before = path.read_bytes()
        resp = farm.run(f"open({str(path)!r}, 'wb').write(b'pwned')")
        assert resp.status == RunStatus.Failed, resp
        resp = farm.run(f"echo pwned > {path}", language="bash")
        assert resp.status == RunStatus.Failed, resp
        assert path.read_bytes() == before
    resp = farm.run("ln -s /etc ./etc; echo x > ./etc/pwned", language="bash", fetch_files=["etc/hostname"])
    assert resp.status == RunStatus.Failed and resp.files == {}
    assert not Path("/etc/pwned").exists()


def test_an_output_flood_is_bounded_and_leaves_farmds_memory_alone(farm: Farm) -> None:
    proc = psutil.Process(farm.farm.proc.pid)
    farm.run("print(1)")
    before = proc.memory_info().rss
    for _ in range(4):
        resp = farm.run("import sys\nwhile True: sys.stdout.write('y' * (1 << 20))", run_timeout=5)
        assert resp.status == RunStatus.Failed and resp.run_result is not None
        assert len(resp.run_result.stdout or "") <= 1024 * 1024
        assert "output" in resp.message
    assert proc.memory_info().rss - before < 64 * MB
    farm.answers()


# -- who may call, and what is refused ----------------------------------------------------------------------


def test_a_call_needs_a_trainer_or_operator_token(farm: Farm) -> None:
    body = {"code": "print(1)", "language": "python"}
    refused = farm.post(body, token=None)
    assert refused.status_code == 401 and "token" in refused.json()["detail"]
    assert farm.post(body, token="not-a-token").status_code == 401
    wrong = farm.post(body, token=TOKENS["environment"])
    assert wrong.status_code == 403 and "environment" in wrong.json()["detail"]
    assert farm.post(body, token=TOKENS["operator"]).json()["status"] == "Success"
    with pytest.raises(Exception, match="401"):
        run_code(RunCodeRequest(code="print(1)", language="python"), endpoint=farm.url, max_attempts=1)
    with pytest.raises(Exception, match="403"):
        run_code(RunCodeRequest(code="print(1)", language="python"), max_attempts=1,
                 endpoint=f"http://env:{TOKENS['environment']}@{farm.addr}")


def test_an_oversized_body_is_refused_before_it_is_read(farm: Farm) -> None:
    host, port = farm.addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(f"POST /run_code HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKENS['trainer']}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {1 << 30}\r\n\r\n{{".encode())
        reply = s.recv(4096).decode(errors="replace")
    assert reply.startswith("HTTP/1.1 413"), "refused on the declared size, the gigabyte never sent"
    sent = farm.post(b'{"code": "' + b"#" * (17 * MB) + b'", "language": "python"}')
    assert sent.status_code == 413
    farm.answers()


MALFORMED: dict[str, tuple[Any, str]] = {
    "an unknown language": ({"code": "1", "language": "cpp"}, "language"),
    "no language": ({"code": "1"}, "language"),
    "no code": ({"language": "python"}, "code"),
    "code not a string": ({"code": 5, "language": "python"}, "code"),
    "a lone surrogate": ({"code": "\ud800", "language": "python"}, "code"),
    "stdin not a string": ({"code": "1", "language": "python", "stdin": ["a"]}, "stdin"),
    "a negative timeout": ({"code": "1", "language": "python", "run_timeout": -1}, "run_timeout"),
    "a zero timeout": ({"code": "1", "language": "python", "run_timeout": 0}, "run_timeout"),
    "a timeout past the ceiling": ({"code": "1", "language": "python", "run_timeout": 1e9}, "run_timeout"),
    "a timeout as text": ({"code": "1", "language": "python", "run_timeout": "10"}, "run_timeout"),
    "a timeout as a bool": ({"code": "1", "language": "python", "run_timeout": True}, "run_timeout"),
    "a compile timeout past the ceiling": ({"code": "1", "language": "python", "compile_timeout": 1e6},
                                           "compile_timeout"),
    "memory past the ceiling": ({"code": "1", "language": "python", "memory_limit_MB": 1 << 20}, "memory_limit_MB"),
    "memory as a float": ({"code": "1", "language": "python", "memory_limit_MB": 100.5}, "memory_limit_MB"),
    "a file above the scratch dir": ({"code": "1", "language": "python", "files": {"../x": "eA=="}}, "files"),
    "an absolute file": ({"code": "1", "language": "python", "files": {"/etc/x": "eA=="}}, "files"),
    "a file that is not base64": ({"code": "1", "language": "python", "files": {"a": "not base64!"}}, "files"),
    "a file over the code": ({"code": "1", "language": "python",
                              "files": {"_sandbox_fusion_main.py": "eA=="}}, "files"),
    "a file that is another's directory": ({"code": "1", "language": "python",
                                            "files": {"a": "eA==", "a/b": "eA=="}}, "files"),
    "files not an object": ({"code": "1", "language": "python", "files": ["a"]}, "files"),
    "too many files": ({"code": "1", "language": "python", "files": {f"f{i}": "" for i in range(300)}}, "files"),
    "a fetch above the scratch dir": ({"code": "1", "language": "python", "fetch_files": ["../../etc/passwd"]},
                                      "fetch_files"),
    "a fetch not a string": ({"code": "1", "language": "python", "fetch_files": [1]}, "fetch_files"),
    "a path of a megabyte": ({"code": "1", "language": "python", "files": {"a" * MB: "eA=="}}, "files"),
    "a misspelt field": ({"code": "1", "language": "python", "memory_limit_mb": 100}, "memory_limit_mb"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_fields_are_422_saying_where(farm: Farm, name: str) -> None:
    body, field = MALFORMED[name]
    resp = farm.post(json.dumps(body).encode())
    assert resp.status_code == 422, resp.text
    (detail,) = resp.json()["detail"]
    assert detail["loc"][:2] == ["body", field] and detail["msg"]
    assert len(resp.content) < 2000, "a refusal never echoes what it refuses at length"


def test_a_body_that_is_not_a_json_object_is_422(farm: Farm) -> None:
    for body in (b"{not json", b"[1, 2]", b"\xff\xfe", b"null", b'{"memory_limit_MB": ' + b"9" * 5000 + b"}",
                 b"[" * 100_000 + b"]" * 100_000):
        resp = farm.post(body)
        assert resp.status_code == 422 and resp.json()["detail"][0]["loc"] == ["body"]


def test_a_joined_node_refuses_the_flag(tmp_path: Path) -> None:
    """The API is a coordinator's, as the console and the Atropos API are: a worker node refuses it at start."""
    import asyncio

    from farmd.config import Config
    from farmd.daemon import Daemon
    from farmd.errors import ConfigError

    daemon = Daemon(Config(data_dir=tmp_path / "node", join="127.0.0.1:9", sandbox_fusion_listen="127.0.0.1:0"))
    with pytest.raises(ConfigError, match="--sandbox-fusion"):
        asyncio.run(daemon.start())


def test_boxes_at_once_are_capped_and_calls_past_the_waiting_room_are_429(farm: Farm) -> None:
    """At most MAX_RUNNING programs run at once; MAX_WAITING more calls wait; one more is refused with 429 (the
    client retries it), never queued without bound."""
    import concurrent.futures

    from farmd.api.sandbox_fusion import MAX_RUNNING, MAX_WAITING

    body = {"code": "import time\nprint(time.time())\ntime.sleep(1.5)\nprint(time.time())", "language": "python"}
    calls = MAX_RUNNING + MAX_WAITING + 6
    with concurrent.futures.ThreadPoolExecutor(calls) as pool:
        replies = list(pool.map(lambda _: farm.post(body), range(calls)))
    refused = [r for r in replies if r.status_code == 429]
    ran = [r.json() for r in replies if r.status_code == 200]
    assert refused and "waiting" in refused[0].json()["detail"]
    assert len(ran) + len(refused) == calls and len(ran) >= MAX_RUNNING
    assert all(r["status"] == "Success" for r in ran)
    windows = [tuple(map(float, r["run_result"]["stdout"].split())) for r in ran]
    most = max(sum(1 for s, e in windows if s <= t < e) for t, _ in windows)
    assert most <= MAX_RUNNING
    farm.answers()
