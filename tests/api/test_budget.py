"""What one credential may hold in a real farmd at once, across all its calls: open streams, unfinished pieces
and their bytes. A node credential that opens stream after stream, each holding records it never finishes,
is refused with RESOURCE_EXHAUSTED once it holds its budget; farmd stays small, and every other credential
is served meanwhile."""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from farm.v1 import farm_pb2, intake_pb2, intake_pb2_grpc, node_pb2, node_pb2_grpc
from farm_client import FarmClient
from grpc_status import rpc_status

from tests.probe import LoopProbe
from tests.rss import MB, PeakRss

TOKENS = {"fleet": "fleet-token-0123456789", "other": "other-node-token-0123456789",
          "trainer": "trainer-token-0123456789", "ada": "ada-token-0123456789", "bob": "bob-token-0123456789"}
ROLES = {"fleet": "node", "other": "node", "trainer": "trainer", "ada": "contributor", "bob": "contributor"}
STREAMS = 6
PENDING = 32 * MB
FLOOD_PENDING = 16 * MB
"""The flood's budget: farmd's peak growth is about 2.5 times what a credential holds (each held piece was also
the message it came in, and the allocator keeps some of those) plus about 17 MB, and 240 MB are offered."""
PIECE = 1000 * 1024


def farm_toml(tmp_path: Path, pending: int = PENDING) -> str:
    path = tmp_path / "farm.toml"
    path.write_text(f"[farm]\ncredential_streams = {STREAMS}\ncredential_pending_bytes = {pending}\n" + "".join(
        f'\n[[credentials]]\nname = "{who}"\nroles = ["{ROLES[who]}"]\n'
        f'token_sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"\n' for who, token in TOKENS.items()))
    return str(path)


def _auth(who: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {TOKENS[who]}"),)


def _hello(name: str) -> node_pb2.WorkRequest:
    return node_pb2.WorkRequest(id=1, hello=node_pb2.NodeHello(
        name=name, owner=f"{name}:1:ab", capacity=1, version="0",
        isolation=[farm_pb2.IsolationCheck(name="bwrap", ok=True, detail="test")]))


def _piece(message_id: int, job_id: int) -> node_pb2.WorkRequest:
    return node_pb2.WorkRequest(id=message_id, results=node_pb2.ResultsRequest(parts=[node_pb2.ResultPart(
        job_id=job_id, owner="x:1:ab", data=b"\x01" * PIECE, last=False)]))


def _exhausted(exc: grpc.aio.AioRpcError) -> bool:
    status = rpc_status.from_call(exc)  # type: ignore[arg-type]
    return (exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and status is not None
            and "CREDENTIAL_BUDGET" in str(status.details))


async def _open(stub: node_pb2_grpc.NodeServiceStub, who: str, name: str
                ) -> grpc.aio.StreamStreamCall[node_pb2.WorkRequest, node_pb2.WorkResponse]:
    call = stub.Work(metadata=_auth(who))
    await call.write(_hello(name))
    reply = await call.read()
    assert reply.welcome.name == name, reply
    return call


async def _flood(addr: str, farm_pid: int) -> dict[str, object]:
    """Every stream the fleet credential may open, each sent unfinished records until it is refused."""
    seen: dict[str, object] = {}
    async with grpc.aio.insecure_channel(addr, options=[("grpc.max_send_message_length", 2 * MB)]) as channel:
        stub = node_pb2_grpc.NodeServiceStub(channel)
        calls = [await _open(stub, "fleet", f"flood-{i}") for i in range(STREAMS)]
        one_more = stub.Work(metadata=_auth("fleet"))
        # farmd refuses the call as it opens, before any hello: read its status without writing, since a write
        # racing farmd's end of the call fails locally and gRPC then keeps its own INTERNAL instead of farmd's.
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await asyncio.wait_for(one_more.read(), 30)
        assert _exhausted(refused.value), (refused.value.code(), refused.value.details())
        seen["streams_refusal"] = refused.value.details()
        with PeakRss(farm_pid) as rss, LoopProbe(addr) as probe:
            ended: list[str] = []
            message_id = 1
            for piece in range(40):  # 40 MB offered per stream: 240 MB in all, against a 16 MB budget
                for i, call in enumerate(calls):
                    if call.done():
                        continue
                    message_id += 1
                    try:
                        await call.write(_piece(message_id, 100 * i + piece // 8))
                        reply = await call.read()
                        assert not reply.error, reply.error
                    except grpc.aio.AioRpcError as exc:
                        assert _exhausted(exc), exc
                        ended.append(exc.details() or "")
            # What the credential still holds stays held: the streams left open keep their pieces.
            open_calls = [c for c in calls if not c.done()]
            seen["open"] = len(open_calls)
            # Others are served meanwhile: another node credential joins and holds pieces of its own.
            other = await _open(stub, "other", "other-node")
            await other.write(_piece(2, 7))
            assert not (await other.read()).error
            other.cancel()
        seen["ended"] = ended
        seen["grew_mb"] = rss.grew_mb
        seen["stall_s"] = probe.worst_s
        for call in open_calls:
            call.cancel()
    return seen


def test_a_credential_holds_at_most_its_budget_across_all_its_streams(tmp_path: Path, running_farm) -> None:  # type: ignore[no-untyped-def]
    farm = running_farm("--workers", "0", "--config", farm_toml(tmp_path, FLOOD_PENDING))
    seen = asyncio.run(_flood(farm.addr, farm.proc.pid))
    assert "credential 'fleet' has 6 streams open" in str(seen["streams_refusal"])
    ended = seen["ended"]
    assert isinstance(ended, list) and ended, "the flood was never refused"
    assert all("credential 'fleet' holds" in why and f"at most {FLOOD_PENDING} bytes" in why for why in ended), ended
    assert float(seen["grew_mb"]) < 100, f"farmd grew {seen['grew_mb']:.0f} MB holding one credential's pieces"  # type: ignore[arg-type]
    assert float(seen["stall_s"]) < 0.5, f"farmd's loop was held {seen['stall_s']:.2f} s"  # type: ignore[arg-type]
    with FarmClient(farm.addr, token=TOKENS["trainer"]) as trainer:
        assert trainer.status()["version"], "a trainer is served while a node credential is at its bounds"
    log = farm.log.read_text()
    assert "credential 'fleet' holds" in log and "Work refused" in log, "the operator is told"


def _held_submit(addr: str, who: str, release: threading.Event, sent: threading.Event, size: int
                 ) -> grpc.RpcError | intake_pb2.SubmitResponse:
    def requests() -> Iterator[intake_pb2.SubmitRequest]:
        chunk = 60 * 1024  # Submit's messages are at most 64 KiB
        for start in range(0, size, chunk):
            yield intake_pb2.SubmitRequest(data=b"\x00" * min(chunk, size - start))
        sent.set()
        release.wait(30)  # the upload stays open, holding what it sent

    with grpc.insecure_channel(addr) as channel:
        try:
            return intake_pb2_grpc.IntakeServiceStub(channel).Submit(requests(), metadata=_auth(who), timeout=60)
        except grpc.RpcError as exc:
            return exc


def test_uploads_held_open_count_against_their_credential_and_no_other(tmp_path: Path, running_farm) -> None:  # type: ignore[no-untyped-def]
    """Packages being uploaded are held whole until they end: a contributor's open uploads together hold at most
    its budget; past it the upload is refused, and another contributor uploads all the same."""
    farm = running_farm("--workers", "0", "--config", farm_toml(tmp_path))
    release = threading.Event()
    results: list[object] = []
    threads = []
    for _ in range(STREAMS):
        sent = threading.Event()
        thread = threading.Thread(target=lambda s=sent: results.append(  # type: ignore[misc]
            _held_submit(farm.addr, "ada", release, s, 7 * MB)))
        thread.start()
        threads.append((thread, sent))
    try:
        # 6 uploads of 7 MB each against 32 MB: those past it end; the others stay open, holding theirs.
        deadline = time.monotonic() + 30
        while not all(sent.is_set() or not thread.is_alive() for thread, sent in threads):
            assert time.monotonic() < deadline, "the uploads neither finished sending nor ended"
            time.sleep(0.05)
        # The client may have sent all of an upload into its buffers before farmd, reading it, refused it: that
        # refusal comes after its "sent", so the ones still open are counted once refusals have had time to land.
        time.sleep(1)
        refused = [r for r in results if isinstance(r, grpc.RpcError)]
        still_open = [sent for thread, sent in threads if thread.is_alive()]
        assert len(still_open) + len(results) == STREAMS and len(still_open) >= 4, (len(still_open), results)
        assert all(sent.is_set() for sent in still_open)
        assert refused and all(r.code() == grpc.StatusCode.RESOURCE_EXHAUSTED for r in refused), results  # type: ignore[attr-defined]
        assert "credential 'ada' holds" in (refused[0].details() or "")  # type: ignore[attr-defined]
        finished = threading.Event()
        finished.set()
        other = _held_submit(farm.addr, "bob", finished, threading.Event(), MB)
        assert isinstance(other, grpc.RpcError) and other.code() == grpc.StatusCode.INVALID_ARGUMENT, other
        assert "no farm-env.toml" in (other.details() or ""), "bob's upload was read and judged, not refused"
    finally:
        release.set()
        for thread, _ in threads:
            thread.join(60)
