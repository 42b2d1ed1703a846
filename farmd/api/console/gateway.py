"""The console's calls: farm's gRPC services, reached over HTTP as JSON.

``POST /api/v1/SERVICE/METHOD`` with the request message as protobuf JSON calls the very servicer the
gRPC server calls, under the same role table (``farmd.api.auth``), and answers the reply message as
protobuf JSON (proto field names, defaults printed). Nothing here decides anything a gRPC caller could
not: a console is one more client of the same services, so what an operator sees on the page is what
``farmctl`` sees. Only unary methods are reached: streams (a trainer's batches, uploads, node work)
stay gRPC's.

A farm with no credentials answers gRPC callers as if everyone were an operator (it trusts its
network). Its console is read-only: a page anyone who reaches the port can load must not approve,
quarantine or queue anything.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message
from google.rpc.error_details_pb2 import ErrorInfo
from google.rpc.status_pb2 import Status

from farmd.api.auth import credential_for, roles_for_method
from farmd.api.errors import DETAILS_KEY, clean_detail
from farmd.config import Credential

READ_ONLY_METHODS = frozenset({
    "FarmService/GetStatus", "FarmService/GetRun", "FarmService/ListRuns", "FarmService/ListTrajectories",
    "FarmService/GetTrajectory", "FarmService/GetHistory", "FarmService/GetLearningCurve",
    "FarmService/ListVerdictChanges", "FarmService/ListPolicies",
    "IntakeService/GetSubmission", "IntakeService/ListSubmissions", "IntakeService/ListBounties",
    "IntakeService/GetContributor", "IntakeService/GetFunnel",
})
"""What the console of a farm with no credentials answers: looking, never acting."""

_PACKAGE = "farm.v1"
_HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400, grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403, grpc.StatusCode.NOT_FOUND: 404, grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.ABORTED: 409, grpc.StatusCode.RESOURCE_EXHAUSTED: 429, grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNIMPLEMENTED: 501, grpc.StatusCode.UNAVAILABLE: 503, grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
"""As grpc-gateway maps them, so an HTTP client of any kind can branch on the status alone."""


@dataclass(frozen=True)
class Answer:
    """An HTTP reply: its status and JSON body."""

    status: int
    body: str

    @staticmethod
    def error(code: grpc.StatusCode, message: str, reason: str | None = None) -> Answer:
        return Answer(_HTTP_STATUS.get(code, 500), json.dumps(
            {"code": code.name, "reason": reason or code.name, "message": clean_detail(message)}))


class _Aborted(grpc.aio.AbortError):
    def __init__(self, code: grpc.StatusCode, details: str, reason: str) -> None:
        super().__init__(details)
        self.code, self.details, self.reason = code, details, reason


class _Context:
    """What farm's servicers ask of a call's context, for a call that came over HTTP: its headers (the
    caller's token) and a way to end it with a status."""

    def __init__(self, authorization: str | None) -> None:
        self._metadata = (("authorization", authorization),) if authorization else ()

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    async def abort(self, code: grpc.StatusCode, details: str = "",
                    trailing_metadata: Iterable[tuple[str, str | bytes]] = ()) -> None:
        raise _Aborted(code, details, _reason(trailing_metadata) or code.name)


def _reason(metadata: Iterable[tuple[str, str | bytes]]) -> str | None:
    for key, value in metadata:
        if key == DETAILS_KEY and isinstance(value, bytes):
            status = Status.FromString(value)
            for detail in status.details:
                info = ErrorInfo()
                if detail.Unpack(info):
                    return info.reason
    return None


@dataclass(frozen=True)
class _Method:
    request: type[Message]
    call: Callable[[Message, Any], Awaitable[Message]]


class Gateway:
    """``services``: the servicers by service name (``FarmService``), as the gRPC server holds them."""

    def __init__(self, services: Mapping[str, Any], credentials: Iterable[Credential], *, max_calls: int = 32) -> None:
        self._credentials = tuple(credentials)
        self._methods: dict[str, _Method] = {}
        for name, servicer in services.items():
            descriptor = _service_descriptor(servicer, name)
            for method in descriptor.methods:
                if method.client_streaming or method.server_streaming:
                    continue
                request_type = _message_class(method.input_type)
                self._methods[f"{name}/{method.name}"] = _Method(request_type, getattr(servicer, method.name))
        self._calls = asyncio.Semaphore(max_calls)
        self._max_calls = max_calls

    @property
    def read_only(self) -> bool:
        return not self._credentials

    def caller(self, authorization: str | None) -> Credential | None:
        return credential_for(self._credentials, (("authorization", authorization),) if authorization else ())

    def whoami(self, authorization: str | None) -> Answer:
        caller = self.caller(authorization)
        if self._credentials and caller is None:
            return _unauthenticated(authorization)
        return Answer(200, json.dumps({
            "credential": caller.name if caller else None, "roles": sorted(caller.roles) if caller else [],
            "farm_has_credentials": bool(self._credentials), "read_only": self.read_only}))

    async def call(self, path: str, body: bytes, authorization: str | None) -> Answer:
        """One call: refused before its body is read when the caller may not make it."""
        refused = self.refusal(path, authorization)
        if refused is not None:
            return refused
        method = self._methods[path]
        if self._calls.locked():
            return Answer.error(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"the console is answering {self._max_calls} calls already: try again shortly")
        async with self._calls:
            try:
                request = await asyncio.to_thread(_parse, method.request, body)
            except ValueError as exc:
                return Answer.error(grpc.StatusCode.INVALID_ARGUMENT, f"not a {method.request.DESCRIPTOR.name}: {exc}")
            try:
                reply = await method.call(request, _Context(authorization))
            except _Aborted as aborted:
                return Answer.error(aborted.code, aborted.details, aborted.reason)
            return Answer(200, await asyncio.to_thread(_to_json, reply))

    def refusal(self, path: str, authorization: str | None) -> Answer | None:
        """Why this caller may not make this call (None: they may); decided from the headers alone."""
        if path not in self._methods:
            return Answer.error(grpc.StatusCode.UNIMPLEMENTED, f"the console serves no method {path!r}")
        if not self._credentials:
            if path in READ_ONLY_METHODS:
                return None
            return Answer.error(grpc.StatusCode.PERMISSION_DENIED,
                                "this farm has no credentials, so its console only reads: give the farm "
                                "[[credentials]] to act from the console (farmctl works as before)", "READ_ONLY")
        caller = self.caller(authorization)
        if caller is None:
            return _unauthenticated(authorization)
        needed = roles_for_method(f"/{_PACKAGE}.{path}") or frozenset()
        if caller.roles & needed:
            return None
        why = f"it needs {' or '.join(sorted(needed))}" if needed else "farmd gives it to no role"
        return Answer.error(grpc.StatusCode.PERMISSION_DENIED,
                            f"credential {caller.name!r} ({', '.join(sorted(caller.roles))}) may not call "
                            f"{path.rsplit('/', 1)[-1]}: {why}")


def _unauthenticated(authorization: str | None) -> Answer:
    message = ("this farm needs a token: enter one in the console's token box" if not authorization
               else "this token is not one of the farm's credentials")
    return Answer.error(grpc.StatusCode.UNAUTHENTICATED, message)


def _service_descriptor(servicer: Any, name: str) -> Any:
    from farm.v1 import farm_pb2, intake_pb2

    for proto in (farm_pb2.DESCRIPTOR, intake_pb2.DESCRIPTOR):
        if name in proto.services_by_name:
            return proto.services_by_name[name]
    raise ValueError(f"no service {name} in farm's protos ({type(servicer).__name__})")


def _message_class(descriptor: Any) -> type[Message]:
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(descriptor)


def _parse(kind: type[Message], body: bytes) -> Message:
    """The request: JSON of the message, unknown fields refused (a typo must not read as "no filter")."""
    try:
        text = body.decode("utf-8") if body.strip() else "{}"
    except UnicodeDecodeError as exc:
        raise ValueError("the body is not UTF-8") from exc
    try:
        return json_format.Parse(text, kind(), ignore_unknown_fields=False)
    except json_format.ParseError as exc:
        raise ValueError(str(exc)) from exc


def _to_json(reply: Message) -> str:
    """The reply as protobuf JSON. A verdict's details may hold an infinity or a NaN, which protobuf's
    JSON refuses inside a Struct: those become the strings "inf" and "nan" rather than fail the page."""
    try:
        return json_format.MessageToJson(reply, preserving_proto_field_name=True,
                                         always_print_fields_with_no_presence=True, indent=None)
    except json_format.SerializeToJsonError:
        copy = type(reply)()
        copy.CopyFrom(reply)
        _finite_values(copy)
        return json_format.MessageToJson(copy, preserving_proto_field_name=True,
                                         always_print_fields_with_no_presence=True, indent=None)


def _finite_values(message: Message) -> None:
    if message.DESCRIPTOR.full_name == "google.protobuf.Value" and message.WhichOneof("kind") == "number_value":
        number = message.number_value  # type: ignore[attr-defined]
        if not math.isfinite(number):
            message.string_value = repr(number)  # type: ignore[attr-defined]
        return
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        if field.message_type.GetOptions().map_entry:
            for item in value.values():
                if isinstance(item, Message):
                    _finite_values(item)
        elif field.is_repeated:
            for item in value:
                _finite_values(item)
        else:
            _finite_values(value)
