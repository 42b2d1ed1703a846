"""The ``farm.v1.Farm`` servicer."""

from __future__ import annotations

from typing import Any

import grpc
from farm.v1 import farm_pb2, farm_pb2_grpc

from farmd.node import NodeInfo


class FarmService(farm_pb2_grpc.FarmServicer):
    def __init__(self, node: NodeInfo) -> None:
        self._node = node

    async def Status(
        self, request: farm_pb2.StatusRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> farm_pb2.StatusReply:
        node = self._node
        return farm_pb2.StatusReply(
            version=node.version,
            node=node.name,
            uptime_s=node.uptime_s(),
            isolation_ok=node.isolation_ok,
            isolation=[
                farm_pb2.IsolationCheck(name=c.name, ok=c.ok, detail=c.detail, fix=c.fix) for c in node.isolation
            ],
            workers=node.workers,
            max_boxes=node.max_boxes,
        )
