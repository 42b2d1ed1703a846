"""One farm at several addresses: its coordinators, dialled by grpc as one channel."""

from __future__ import annotations

import pytest
from farm_client.addresses import grpc_target


def test_one_address_is_dialled_as_given_and_several_as_one_list_of_one_family() -> None:
    assert grpc_target("farm.example:7431") == "farm.example:7431"  # grpc resolves it, and again on reconnects
    assert grpc_target("127.0.0.1:1,127.0.0.2:2") == "ipv4:127.0.0.1:1,127.0.0.2:2"
    assert grpc_target(["127.0.0.1:1", " 127.0.0.1:1 ", "localhost:3"]).startswith("ipv4:127.0.0.1:1,")
    assert grpc_target("[::1]:5,[::1]:6") == "ipv6:[::1]:5,[::1]:6"


@pytest.mark.parametrize("bad", ["", ",", "127.0.0.1:1,127.0.0.1", "127.0.0.1:1,[::1]:2", "127.0.0.1:1,h:x"])
def test_a_list_that_cannot_be_dialled_is_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        grpc_target(bad)
