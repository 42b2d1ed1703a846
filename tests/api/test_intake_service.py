"""IntakeService through a real farmd: a submission is read as a bounded stream whatever its archive declares."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
from farm.v1 import intake_pb2, intake_pb2_grpc

from tests.intake import hostile_tars
from tests.probe import LoopProbe
from tests.rss import PeakRss


def _submit(addr: str, blob: bytes) -> grpc.RpcError | None:
    def chunks() -> Iterator[intake_pb2.SubmitRequest]:
        for start in range(0, len(blob), 60 * 1024):  # Submit's messages are at most 64 KiB
            yield intake_pb2.SubmitRequest(data=blob[start:start + 60 * 1024], contributor="mallory")

    with grpc.insecure_channel(addr) as channel:
        try:
            intake_pb2_grpc.IntakeServiceStub(channel).Submit(chunks(), timeout=60)
        except grpc.RpcError as exc:
            return exc
    return None


def test_an_archive_that_declares_gigabytes_costs_farmd_what_it_sent(running_farm) -> None:  # type: ignore[no-untyped-def]
    """Long names, long link names, pax headers and pax global headers declaring 256 MiB each (sent as
    kilobytes of gzip, bzip2, xz), and a gzip bomb: refused, each naming why, and farmd grows by a bounded few
    megabytes, not by what they declare."""
    farm = running_farm("--workers", "0")
    tars = hostile_tars.hostile(256 << 20)
    with PeakRss(farm.proc.pid) as rss, LoopProbe(farm.addr) as probe:
        for name, blob in tars.items():
            refused = _submit(farm.addr, blob)
            assert refused is not None and refused.code() == grpc.StatusCode.INVALID_ARGUMENT, (name, refused)
            assert "not a tarball farm reads" in (refused.details() or ""), (name, refused.details())
    assert rss.grew_mb < 64, f"farmd grew {rss.grew_mb:.0f} MB reading archives that declare 256 MiB each"
    assert probe.worst_s < 0.5, f"farmd's loop was held {probe.worst_s:.2f} s reading them"
