"""Policies through a real farmd: written to a file as they arrive, served from it a chunk at a time,
and nothing left behind by an upload that fails, is cancelled or dies with its farmd."""

from __future__ import annotations

import hashlib
import io
import random
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from farm.v1 import farm_pb2, farm_pb2_grpc
from farm_client import FarmClient

from farmd.store.schema import MIGRATIONS
from tests.probe import LoopProbe
from tests.rss import MB, PeakRss


def uploads_in(data_dir: Path) -> list[str]:
    folder = data_dir / "policies"
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".")) if folder.exists() else []


def policy_files(data_dir: Path) -> list[str]:
    folder = data_dir / "policies"
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) if folder.exists() else []


def wait_for(predicate, timeout_s: float = 20) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.mark.clocked
def test_a_large_policy_streams_through_a_file(running_farm) -> None:  # type: ignore[no-untyped-def]
    farm = running_farm("--workers", "0")
    data = random.Random(7).randbytes(200 * MB)
    digest = hashlib.sha256(data).hexdigest()
    with FarmClient(farm.addr) as client:
        client.status()
        latencies: list[float] = []
        publishing = threading.Event()

        def ask_status() -> None:  # the API keeps answering while a policy streams in
            while not publishing.is_set():
                start = time.monotonic()
                client.status()
                latencies.append(time.monotonic() - start)
                time.sleep(0.02)

        asker = threading.Thread(target=ask_status)
        with PeakRss(farm.proc.pid) as publish_rss:
            asker.start()
            try:
                reply = client.publish_policy(data)
            finally:
                publishing.set()
                asker.join()
        assert reply == {"version": 1, "sha256": digest, "size": len(data), "name": ""}
        assert publish_rss.grew_mb < 50, f"farmd grew {publish_rss.grew_mb:.0f} MB taking a 200 MB policy"
        assert len(latencies) >= 5 and max(latencies) < 1.0, f"Status took up to {max(latencies):.2f}s"
        assert policy_files(farm.data_dir) == [digest] and uploads_in(farm.data_dir) == []
        assert hashlib.sha256((farm.data_dir / "policies" / digest).read_bytes()).hexdigest() == digest

        with PeakRss(farm.proc.pid) as get_rss:
            version, content, uri = client.get_policy(digest)
        assert (version, uri) == (1, "") and content == data
        assert get_rss.grew_mb < 50, f"farmd grew {get_rss.grew_mb:.0f} MB serving a 200 MB policy"
        del content

        assert client.publish_policy(data) == reply, "the same content is the same version"
        assert policy_files(farm.data_dir) == [digest] and uploads_in(farm.data_dir) == []
        assert client.get_policy()[0] == 1


def test_a_wrong_hash_stores_nothing(running_farm) -> None:  # type: ignore[no-untyped-def]
    farm = running_farm("--workers", "0")
    data = random.Random(8).randbytes(3 * MB + 17)
    with FarmClient(farm.addr) as client, grpc.insecure_channel(farm.addr) as channel:
        first = client.publish_policy(b"weights-1")
        stub = farm_pb2_grpc.FarmServiceStub(channel)
        wrong = hashlib.sha256(b"something else").hexdigest()
        chunks = [farm_pb2.PublishPolicyRequest(sha256=wrong, data=data[:MB])] + \
            [farm_pb2.PublishPolicyRequest(data=data[i:i + MB]) for i in range(MB, len(data), MB)]
        with pytest.raises(grpc.RpcError) as err:
            stub.PublishPolicy(iter(chunks), timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "hashes to" in (err.value.details() or "")
        assert policy_files(farm.data_dir) == [first["sha256"]] and uploads_in(farm.data_dir) == []
        for sha in (wrong, hashlib.sha256(data).hexdigest()):
            with pytest.raises(grpc.RpcError) as err:
                list(stub.GetPolicy(farm_pb2.GetPolicyRequest(sha256=sha), timeout=10))
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert client.status()["policy_version"] == 1 and client.get_policy()[0] == 1

        for bad in ("F" * 64, "../" * 21 + "x", "a" * 65):  # a hash is 64 lowercase hex digits, nothing else
            with pytest.raises(grpc.RpcError) as err:
                list(stub.GetPolicy(farm_pb2.GetPolicyRequest(sha256=bad), timeout=10))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            with pytest.raises(grpc.RpcError) as err:
                stub.PublishPolicy(iter([farm_pb2.PublishPolicyRequest(sha256=bad, data=b"x")]), timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as err:
            stub.PublishPolicy(iter([farm_pb2.PublishPolicyRequest(uri="s3://" + "x" * 5000)]), timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert policy_files(farm.data_dir) == [first["sha256"]] and uploads_in(farm.data_dir) == []


def _slow_upload(stub: farm_pb2_grpc.FarmStub, release: threading.Event) -> grpc.Future:
    """An upload that sends 3 MiB, then waits for ``release`` before it sends the rest. It declares the whole
    content's hash, as FarmClient does: gRPC's server sees a client's cancel as the end of the request stream,
    so without it a cancelled upload's first 3 MiB could be taken for the whole policy."""
    digest = hashlib.sha256(bytes(3 * MB) + b"end").hexdigest()

    def chunks() -> Iterator[farm_pb2.PublishPolicyRequest]:
        for i in range(3):
            yield farm_pb2.PublishPolicyRequest(data=bytes(MB), sha256=digest if i == 0 else "")
        release.wait(60)
        yield farm_pb2.PublishPolicyRequest(data=b"end")

    return stub.PublishPolicy.future(chunks(), timeout=60)


def test_a_failed_cancelled_or_crashed_upload_leaves_no_file(running_farm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config = tmp_path / "farm.toml"
    config.write_text(f"[farm]\nmax_policy_bytes = {5 * MB}\n")
    farm = running_farm("--workers", "0", "--config", str(config))
    with grpc.insecure_channel(farm.addr) as channel:
        stub = farm_pb2_grpc.FarmServiceStub(channel)
        too_big = (farm_pb2.PublishPolicyRequest(data=bytes(MB)) for _ in range(8))
        with pytest.raises(grpc.RpcError) as err:
            stub.PublishPolicy(too_big, timeout=30)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_policy_bytes" in (
            err.value.details() or "")
        assert uploads_in(farm.data_dir) == [] and policy_files(farm.data_dir) == []

        release = threading.Event()
        try:
            upload = _slow_upload(stub, release)
            wait_for(lambda: uploads_in(farm.data_dir) != [])
            upload.cancel()
            wait_for(lambda: uploads_in(farm.data_dir) == [])
        finally:
            release.set()

        release = threading.Event()
        try:
            upload = _slow_upload(stub, release)
            wait_for(lambda: uploads_in(farm.data_dir) != [])
            left = uploads_in(farm.data_dir)
            farm.stop(signal.SIGKILL)
        finally:
            release.set()
    assert uploads_in(farm.data_dir) == left, "a farmd killed mid-upload leaves its temporary file"
    time.sleep(2.1)  # a temporary is swept once nothing has written to it for a while
    again = running_farm("--workers", "0", data_dir=farm.data_dir)
    assert uploads_in(again.data_dir) == [] and policy_files(again.data_dir) == []
    assert "never finished" in again.log.read_text()
    with FarmClient(again.addr) as client:
        assert client.publish_policy(b"after")["version"] == 1


def test_a_policy_an_older_farmd_stored_as_a_blob_is_still_served(running_farm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    data_dir = tmp_path / "old"
    data_dir.mkdir()
    blob = random.Random(9).randbytes(3 * MB + 5)  # more than one chunk, the last one short
    digest = hashlib.sha256(blob).hexdigest()
    con = sqlite3.connect(data_dir / "farm.db")
    for version, script in enumerate(MIGRATIONS[:2], start=1):  # the schema as farmd had it then
        con.executescript(f"BEGIN; {script}; PRAGMA user_version={version}; COMMIT;")
    con.execute("INSERT INTO policies(version, sha256, size, blob, uri, created_at) VALUES (1, ?, ?, ?, NULL, 0)",
                (digest, len(blob), blob))
    con.commit()
    con.close()

    farm = running_farm("--workers", "0", data_dir=data_dir)
    with FarmClient(farm.addr) as client:
        assert client.get_policy(digest) == (1, blob, "")
        assert client.get_policy() == (1, blob, "")
        assert client.publish_policy(blob)["version"] == 1, "the same content, though it is in a blob"
        fresh = client.publish_policy(b"new weights")
        assert fresh["version"] == 2 and client.get_policy(fresh["sha256"]) == (2, b"new weights", "")
        uri_only = client.publish_policy(uri="s3://bucket/ckpt-3")
        assert client.get_policy(uri_only["sha256"]) == (3, b"", "s3://bucket/ckpt-3")
    assert policy_files(data_dir) == [fresh["sha256"]]


def test_a_policy_that_declares_more_than_it_holds_is_refused_when_it_is_published(running_farm) -> None:  # type: ignore[no-untyped-def]
    """Each class of size lie (a config of a gigabyte model, views of one element, storages larger than their
    records, records deflated a thousandfold, torch's legacy format) is refused at PublishPolicy, read from the
    upload's directory and pickle alone; no worker ever loads one, and farmd does not grow by what they declare."""
    torch = pytest.importorskip("torch")
    from farm_client import tinylm

    from tests.clients import policy_blobs

    farm = running_farm("--workers", "0")
    blobs = policy_blobs.hostile()
    with FarmClient(farm.addr) as client:
        client.status()
        with PeakRss(farm.proc.pid) as rss, LoopProbe(farm.addr) as probe:
            for name, blob in blobs.items():
                with pytest.raises(grpc.RpcError) as refused:
                    client.publish_policy(blob, name="tiny")
                details = refused.value.details() or ""
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, f"{name}: {details}"
                assert "farm-tinylm/1 policy, and no worker could load it" in details, f"{name}: {details}"
        assert rss.grew_mb < 64, f"farmd grew {rss.grew_mb:.0f} MB refusing policies that declare gigabytes"
        assert probe.worst_s < 0.5, f"farmd's loop was held {probe.worst_s:.2f} s checking them"
        assert policy_files(farm.data_dir) == [] and uploads_in(farm.data_dir) == []
        honest = tinylm.save(tinylm.TinyLM(tinylm.LMConfig()))
        assert client.publish_policy(honest, name="tiny")["version"] == 1
        other = io.BytesIO()
        torch.save({"weights": torch.zeros(3)}, other)
        assert client.publish_policy(other.getvalue(), name="served")["version"] == 2, \
            "a policy of another kind (an endpoint's) is stored as it is: no farm worker loads it"
        assert client.publish_policy(b"opaque", name="served")["version"] == 3
