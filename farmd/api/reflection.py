"""Server reflection under both names clients ask for: ``grpc.reflection.v1`` and ``v1alpha``.

grpcurl, buf curl and Postman ask for v1 first; grpcio-reflection (1.85) serves only v1alpha.
The two protocols are the same messages under two package names (field for field: the v1 proto
is v1alpha's promoted), so v1 is served by v1alpha's servicer, each message carried across by
its bytes. The v1 descriptor is v1alpha's with the package renamed, added to the default pool,
so that reflection can describe the v1 service as well (``file_containing_symbol``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message
from grpc_reflection.v1alpha import _async as reflection_aio  # what reflection.aio re-exports
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

V1_SERVICE_NAME = "grpc.reflection.v1.ServerReflection"
V1ALPHA_SERVICE_NAME: str = reflection.SERVICE_NAME
_V1_FILE = "grpc/reflection/v1/reflection.proto"
_METHOD = "ServerReflectionInfo"


def _v1_file(pool: descriptor_pool.DescriptorPool) -> None:
    """Add the v1 reflection proto to ``pool``, unless something (a later grpcio-reflection) did."""
    try:
        pool.FindFileByName(_V1_FILE)
        return
    except KeyError:
        pass
    proto = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(proto)
    old, new = f".{proto.package}.", ".grpc.reflection.v1."
    proto.name, proto.package = _V1_FILE, "grpc.reflection.v1"
    proto.options.java_package = "io.grpc.reflection.v1"
    proto.options.go_package = "google.golang.org/grpc/reflection/grpc_reflection_v1"
    proto.options.ClearField("deprecated")  # v1alpha is; v1 is what replaces it
    for message in proto.message_type:
        for field in message.field:
            if field.type_name.startswith(old):
                field.type_name = new + field.type_name.removeprefix(old)
    for service in proto.service:
        for method in service.method:
            method.input_type = new + method.input_type.removeprefix(old)
            method.output_type = new + method.output_type.removeprefix(old)
    pool.Add(proto)


def v1_messages(pool: descriptor_pool.DescriptorPool | None = None) -> tuple[type[Message], type[Message]]:
    """The v1 ``ServerReflectionRequest`` and ``ServerReflectionResponse`` classes (for a client, too)."""
    pool = pool or descriptor_pool.Default()
    _v1_file(pool)
    return (message_factory.GetMessageClass(pool.FindMessageTypeByName("grpc.reflection.v1.ServerReflectionRequest")),
            message_factory.GetMessageClass(pool.FindMessageTypeByName("grpc.reflection.v1.ServerReflectionResponse")))


def enable_reflection(service_names: Iterable[str], server: grpc.aio.Server) -> None:
    """Serve reflection, v1 and v1alpha, for ``service_names`` (the reflection services are added)."""
    v1_request, v1_response = v1_messages()
    names = (*service_names, V1_SERVICE_NAME, V1ALPHA_SERVICE_NAME)
    servicer = reflection_aio.ReflectionServicer(names)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)

    async def v1(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        async def as_v1alpha() -> AsyncIterator[reflection_pb2.ServerReflectionRequest]:
            async for request in requests:
                yield reflection_pb2.ServerReflectionRequest.FromString(request.SerializeToString())

        async for response in servicer.ServerReflectionInfo(as_v1alpha(), context):
            yield v1_response.FromString(response.SerializeToString())

    handler = grpc.stream_stream_rpc_method_handler(
        v1, request_deserializer=v1_request.FromString, response_serializer=v1_response.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(V1_SERVICE_NAME, {_METHOD: handler}),))
