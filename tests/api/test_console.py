"""The web console's HTTP side: the page, its assets and its calls, on a real farmd's port.

The console calls the same servicers as the gRPC API under the same role table: these check that a call
answers what gRPC answers, that every kind of caller is turned away where gRPC would turn it away (and a
farm with no credentials only reads), and that bad calls get a clear 4xx and never reach a service.
The page itself is driven in a real browser by ``test_console_browser``.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import httpx
import pytest
from farm.v1 import trajectory_pb2
from farm_client import FarmClient
from google.protobuf import struct_pb2

from farmd.api.console.gateway import _to_json
from farmd.config import Credential
from tests.api.conftest import InProcessFarm

TOKENS = {"op": ("op-token", "operator"), "tess": ("trainer-token", "trainer"), "rita": ("rita-token", "reviewer"),
          "ada": ("ada-token", "contributor")}


def credentials() -> tuple[Credential, ...]:
    return tuple(Credential(name, frozenset({role}), hashlib.sha256(token.encode()).hexdigest())
                 for name, (token, role) in TOKENS.items())


def call(farm: InProcessFarm, method: str, body: Any = None, who: str | None = None, *, raw: bytes | None = None,
         headers: dict[str, str] | None = None) -> httpx.Response:
    sent = {"Content-Type": "application/json", **(headers or {})}
    if who is not None:
        sent["Authorization"] = f"Bearer {TOKENS[who][0]}"
    return httpx.post(f"http://{farm.console}/api/v1/{method}", headers=sent,
                      content=raw if raw is not None else None, json=None if raw is not None else (body or {}))


@pytest.fixture
def farm(console_in_process) -> InProcessFarm:  # type: ignore[no-untyped-def]
    return console_in_process(credentials=credentials())  # type: ignore[no-any-return]


def test_a_call_answers_what_the_grpc_api_answers(farm: InProcessFarm) -> None:
    reply = call(farm, "FarmService/GetStatus", who="op")
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("application/json")
    page = reply.json()
    with FarmClient(farm.addr, token=TOKENS["op"][0]) as client:
        status = client.status()
    for key in ("node", "version", "workers", "max_boxes", "isolation_ok"):
        assert page[key] == status[key], key
    assert int(page["last_seq"]) == status["last_seq"] and int(page["policy_version"]) == status["policy_version"]
    assert {k: int(v) for k, v in page["queue"].items()} == status["queue"]

    history = call(farm, "FarmService/GetHistory", {"window": "600s", "buckets": 10}, who="tess").json()
    assert history["bucket"] == "60s" and history["samples"], "farmd samples itself from the start"
    assert int(history["samples"][-1]["policy_version"]) == 0
    curve = call(farm, "FarmService/GetLearningCurve", {}, who="tess").json()
    assert curve == {"agent": "", "points": [], "agents": []}, "no farm policy has produced anything yet"


def test_every_caller_is_held_to_the_grpc_role_table(farm: InProcessFarm) -> None:
    nobody = call(farm, "FarmService/GetStatus")
    assert nobody.status_code == 401 and nobody.json()["code"] == "UNAUTHENTICATED"
    stranger = call(farm, "FarmService/GetStatus", headers={"Authorization": "Bearer not-a-token"})
    assert stranger.status_code == 401 and "not one of the farm's credentials" in stranger.json()["message"]
    assert httpx.get(f"http://{farm.console}/api/v1/whoami").status_code == 401

    denied = call(farm, "IntakeService/ReviewSubmission", {"id": 1, "approve": True, "note": "ok"}, who="tess")
    assert denied.status_code == 403
    assert denied.json() == {"code": "PERMISSION_DENIED", "reason": "PERMISSION_DENIED", "message":
                             "credential 'tess' (trainer) may not call ReviewSubmission: it needs operator or reviewer"}
    assert call(farm, "FarmService/GetStatus", who="ada").status_code == 403, "a contributor reads no farm status"
    missing = call(farm, "IntakeService/ReviewSubmission", {"id": 99, "approve": True, "note": "ok"}, who="rita")
    assert missing.status_code == 404 and missing.json()["reason"] == "NOT_FOUND", "the reviewer got past the door"

    whoami = httpx.get(f"http://{farm.console}/api/v1/whoami", headers={"Authorization": "Bearer rita-token"})
    assert whoami.json() == {"credential": "rita", "roles": ["reviewer"], "farm_has_credentials": True,
                             "read_only": False}


def test_bad_calls_get_a_clear_4xx_and_reach_no_service(farm: InProcessFarm) -> None:
    def refused(response: httpx.Response, status: int, words: str) -> None:
        assert response.status_code == status, response.text
        assert words in response.json()["message"], response.json()

    refused(call(farm, "FarmService/Nope", who="op"), 501, "serves no method")
    refused(call(farm, "FarmService/StreamTrajectories", {"consumer": "x"}, who="op"), 501, "serves no method")
    refused(call(farm, "NodeService/Work", who="op"), 501, "serves no method")
    refused(call(farm, "FarmService/ListTrajectories", {"envv": "arith"}, who="op"), 400, "envv")
    refused(call(farm, "FarmService/ListTrajectories", raw=b"{not json", who="op"), 400, "ListTrajectoriesRequest")
    refused(call(farm, "FarmService/ListTrajectories", raw=b'{"env": "\xff\xfe"}', who="op"), 400, "UTF-8")
    refused(call(farm, "FarmService/ListTrajectories", {"min_reward": "NaN"}, who="op"), 400, "min_reward")
    refused(call(farm, "FarmService/GetHistory", {"window": "-5s"}, who="op"), 400, "negative")
    refused(call(farm, "FarmService/ListTrajectories", raw=b"{}", who="op", headers={"Content-Type": "text/plain"}),
            415, "JSON body")
    refused(call(farm, "FarmService/ListTrajectories", raw=b'{"env": "' + b"a" * (300 << 10) + b'"}', who="op"),
            413, "at most")
    assert call(farm, "FarmService/ListTrajectories", {"flag": "FLAG_TIMEOUT", "min_reward": 0.5}, who="op").json() \
        == {"trajectories": [], "next_page_token": "", "capped": False, "withdrawn_left_out": "0", "verdict_mark": "0"}


def test_a_farm_without_credentials_has_a_read_only_console(console_in_process) -> None:  # type: ignore[no-untyped-def]
    farm = console_in_process()
    assert httpx.get(f"http://{farm.console}/api/v1/whoami").json() == {
        "credential": None, "roles": [], "farm_has_credentials": False, "read_only": True}
    assert call(farm, "FarmService/GetStatus").status_code == 200
    for method, body in (("IntakeService/ReviewSubmission", {"id": 1, "approve": True}),
                         ("IntakeService/QuarantineSubmission", {"id": 1, "reason": "x"}),
                         ("FarmService/CreateRun", {"env": "arith", "agent": "reference", "rollouts": 1})):
        reply = call(farm, method, body)
        assert reply.status_code == 403 and reply.json()["reason"] == "READ_ONLY", method
    port = farm.console.rsplit(":", 1)[1]
    rebound = httpx.get(f"http://{farm.console}/", headers={"Host": f"farm.attacker.example:{port}"})
    assert rebound.status_code == 421, "a name pointed at this address by another site is not this console"
    assert httpx.get(f"http://localhost:{port}/api/v1/whoami").status_code == 200


def test_the_page_and_its_assets_run_nothing_but_themselves(farm: InProcessFarm) -> None:
    page = httpx.get(f"http://{farm.console}/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["x-content-type-options"] == "nosniff"
    assert '<script type="module" src="/static/app.js">' in page.text and "://" not in page.text, \
        "nothing fetched from elsewhere"
    for name, kind in (("app.js", "text/javascript"), ("plot.js", "text/javascript"), ("style.css", "text/css")):
        asset = httpx.get(f"http://{farm.console}/static/{name}")
        assert asset.status_code == 200 and asset.headers["content-type"].startswith(kind), name
        assert "//cdn" not in asset.text and "https://" not in asset.text, name
    for name in ("..%2Ffarmd.json", "gateway.py", "index.html"):
        assert httpx.get(f"http://{farm.console}/static/{name}").status_code == 404, name


def test_a_verdict_that_holds_an_infinity_still_reaches_the_page() -> None:
    details = struct_pb2.Struct()
    details.update({"speedup": math.inf, "nested": {"ratio": math.nan}, "ok": 1.5})
    record = trajectory_pb2.Trajectory(id=3, verdict_details=details)
    shown = _to_json(record)
    assert '"speedup": "inf"' in shown and '"ratio": "nan"' in shown and '"ok": 1.5' in shown
