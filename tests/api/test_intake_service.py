"""IntakeService through a real farmd: a submission is read as a bounded stream whatever its archive declares."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import grpc
from farm.v1 import intake_pb2, intake_pb2_grpc
from farm_client.convert import money
from google.type import money_pb2

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


def test_a_bountys_money_is_exact_and_in_us_dollars(running_farm) -> None:  # type: ignore[no-untyped-def]
    """Payouts travel as google.type.Money: what was posted is read back to the cent, and an amount in another
    currency is refused as the caller's error, not taken for dollars."""
    farm = running_farm("--workers", "0")
    with grpc.insecure_channel(farm.addr) as channel:
        stub = intake_pb2_grpc.IntakeServiceStub(channel)
        posted = stub.PostBounty(intake_pb2.PostBountyRequest(
            domain="text", requirements="counting tasks", wanted=2, pay_min=money(0.3), pay_max=money(1234.56)),
            timeout=30).bounty
        assert (posted.pay_min, posted.pay_max) == (money(0.3), money(1234.56))
        assert (posted.pay_max.units, posted.pay_max.nanos, posted.pay_max.currency_code) == (1234, 560000000, "USD")
        euros = money_pb2.Money(currency_code="EUR", units=50)
        try:
            stub.PostBounty(intake_pb2.PostBountyRequest(domain="text", requirements="r", wanted=1, pay_min=euros,
                                                         pay_max=euros), timeout=30)
            raise AssertionError("a bounty in euros was taken")
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT and "farm's money is in USD" in (exc.details() or "")
        assert [b.id for b in stub.ListBounties(intake_pb2.ListBountiesRequest(), timeout=30).bounties] == [posted.id]


def test_a_package_that_is_not_what_its_hash_declares_is_refused_before_it_is_read(running_farm) -> None:  # type: ignore[no-untyped-def]
    """gRPC's server sees a client's cancel as the end of the request stream: a declared hash is what tells an
    upload cut short from a whole one, so a mismatch is refused as such and nothing is kept."""
    farm = running_farm("--workers", "0")
    blob = b"the first half of a package"
    with grpc.insecure_channel(farm.addr) as channel:
        stub = intake_pb2_grpc.IntakeServiceStub(channel)
        for declared, wanted in ((hashlib.sha256(blob + b" and its end").hexdigest(), "not the declared"),
                                 ("ABC", "64 lowercase hex digits")):
            try:
                stub.Submit(iter([intake_pb2.SubmitRequest(data=blob, contributor="mallory", sha256=declared)]),
                            timeout=30)
                raise AssertionError("a package unlike its declared hash was taken")
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT and wanted in (exc.details() or ""), exc
        try:  # the same bytes with their own hash are read, and refused only for what they are
            stub.Submit(iter([intake_pb2.SubmitRequest(data=blob, contributor="mallory",
                                                       sha256=hashlib.sha256(blob).hexdigest())]), timeout=30)
            raise AssertionError("a blob that is no package was taken")
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT and "not valid" in (exc.details() or ""), exc
        assert list(stub.ListSubmissions(intake_pb2.ListSubmissionsRequest(), timeout=30).submissions) == []
