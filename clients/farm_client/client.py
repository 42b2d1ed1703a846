"""A small gRPC client for trainers and scripts.

It speaks only the wire contract (``farm.v1``); the trainer-side streaming API
(batches, acks, policies) arrives with the daemon's scheduler and store.
"""

from __future__ import annotations

from typing import Any

import grpc
from farm.v1 import farm_pb2, farm_pb2_grpc


class FarmClient:
    """``FarmClient("host:port", token=None)``; use as a context manager or call ``close()``."""

    def __init__(self, addr: str, token: str | None = None, timeout_s: float = 10.0) -> None:
        self.addr = addr
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._timeout = timeout_s
        self._channel = grpc.insecure_channel(addr)
        self._stub = farm_pb2_grpc.FarmStub(self._channel)

    def status(self) -> dict[str, Any]:
        reply = self._stub.Status(farm_pb2.StatusRequest(), metadata=self._metadata, timeout=self._timeout)
        return {
            "version": reply.version,
            "node": reply.node,
            "uptime_s": reply.uptime_s,
            "isolation_ok": reply.isolation_ok,
            "isolation": [
                {"name": c.name, "ok": c.ok, "detail": c.detail, "fix": c.fix} for c in reply.isolation
            ],
            "workers": reply.workers,
            "max_boxes": reply.max_boxes,
        }

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> FarmClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
