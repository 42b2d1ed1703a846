"""Who may call what: named credentials, each holding roles, and the roles each method needs.

A call's token travels in its headers (``authorization: Bearer TOKEN``), so it is checked before a
byte of the request is read: a call with no token, an unknown one, or one whose roles do not reach
the method is turned away by a handler that reads nothing (``refusal``), and costs farmd its
headers, not its body. Tokens are compared as sha256 digests, the only form a credential keeps.

The roles: an ``operator`` runs the farm (every FarmService call); a ``trainer`` reads and acks
trajectories and publishes policies, but queues or cancels no run; a ``node`` works for the farm
(NodeService) and fetches the policies its jobs run, and reads nothing else. A ``contributor`` submits
environments, claims bounties and sees their own submissions and standing; a ``reviewer`` works the
review queue and may quarantine an accepted version. An ``environment`` pushes scored groups to the Atropos
API (``farmd.api.atropos``, which keeps its own table of paths and roles). Health checks and reflection are
open to anyone.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import grpc
from farm.v1 import farm_pb2, intake_pb2, node_pb2

from farmd.api.refuse import refusal
from farmd.config import Credential, token_sha256

log = logging.getLogger("farmd.api.auth")

# Health checks and reflection stay open so load balancers and grpcurl can see a node.
OPEN_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")

OPERATOR, TRAINER, NODE = "operator", "trainer", "node"
CONTRIBUTOR, REVIEWER = "contributor", "reviewer"
_FARM, _NODE_SERVICE, _INTAKE = "/farm.v1.FarmService/", "/farm.v1.NodeService/", "/farm.v1.IntakeService/"
_ANYONE_IN_INTAKE = frozenset({OPERATOR, CONTRIBUTOR, REVIEWER})

METHOD_ROLES: Mapping[str, frozenset[str]] = MappingProxyType({
    f"{_FARM}GetStatus": frozenset({OPERATOR, TRAINER}),
    f"{_FARM}CreateRun": frozenset({OPERATOR}),
    f"{_FARM}GetRun": frozenset({OPERATOR, TRAINER}),
    f"{_FARM}ListRuns": frozenset({OPERATOR, TRAINER}),
    f"{_FARM}CancelRun": frozenset({OPERATOR}),
    f"{_FARM}ListTrajectories": frozenset({OPERATOR, TRAINER}),
    f"{_FARM}GetTrajectory": frozenset({OPERATOR, TRAINER}),
    f"{_FARM}StreamTrajectories": frozenset({OPERATOR, TRAINER}),
    f"{_FARM}Ack": frozenset({OPERATOR, TRAINER}),
    f"{_FARM}PublishPolicy": frozenset({OPERATOR, TRAINER}),
    f"{_FARM}GetPolicy": frozenset({OPERATOR, TRAINER, NODE}),
    f"{_FARM}ListPolicies": frozenset({OPERATOR, TRAINER}),
    f"{_FARM}PinPolicy": frozenset({OPERATOR}),
    f"{_FARM}Rescore": frozenset({OPERATOR}),
    f"{_FARM}GetHistory": frozenset({OPERATOR, TRAINER}),
    f"{_FARM}GetLearningCurve": frozenset({OPERATOR, TRAINER}),
    f"{_FARM}ListNames": frozenset({OPERATOR}),
    f"{_FARM}ReassignName": frozenset({OPERATOR}),
    f"{_FARM}ClearNode": frozenset({OPERATOR}),
    f"{_FARM}ListVerdictChanges": frozenset({OPERATOR, TRAINER}),
    # A trainer that samples itself draws tasks and has completions judged and stored under its own agent name.
    f"{_FARM}SampleTasks": frozenset({OPERATOR, TRAINER}),
    f"{_FARM}Verify": frozenset({OPERATOR, TRAINER}),
    f"{_NODE_SERVICE}Work": frozenset({NODE}),
    # What a contributor sees of others' work is narrowed by the service itself (their own submissions).
    f"{_INTAKE}Submit": frozenset({OPERATOR, CONTRIBUTOR}),
    f"{_INTAKE}GetSubmission": _ANYONE_IN_INTAKE,
    f"{_INTAKE}ListSubmissions": _ANYONE_IN_INTAKE,
    f"{_INTAKE}ReviewSubmission": frozenset({OPERATOR, REVIEWER}),
    f"{_INTAKE}QuarantineSubmission": frozenset({OPERATOR, REVIEWER}),
    f"{_INTAKE}ListBounties": _ANYONE_IN_INTAKE,
    f"{_INTAKE}PostBounty": frozenset({OPERATOR}),
    f"{_INTAKE}ClaimBounty": frozenset({OPERATOR, CONTRIBUTOR}),
    f"{_INTAKE}GetContributor": _ANYONE_IN_INTAKE,
    f"{_INTAKE}GetFunnel": frozenset({OPERATOR, REVIEWER}),
    f"{_INTAKE}GetEnvironmentPackage": frozenset({OPERATOR, REVIEWER, NODE}),
})
"""The roles that may call each method: the one place this is decided."""

_SERVED = frozenset(f"/{service.full_name}/{method.name}"
                    for proto in (farm_pb2.DESCRIPTOR, node_pb2.DESCRIPTOR, intake_pb2.DESCRIPTOR)
                    for service in proto.services_by_name.values() for method in service.methods)
"""Every method of farm's services: one the table does not name is no role's, not every caller's."""

_SCHEME = "bearer "


def is_open(method: str) -> bool:
    """Whether ``method`` answers callers without a token."""
    return method.startswith(OPEN_PREFIXES)


def roles_for_method(method: str) -> frozenset[str] | None:
    """The roles that may call ``method``. None for a method farm's protos do not declare (health,
    reflection, or a name no service serves: any authenticated caller reaches its UNIMPLEMENTED
    answer); an empty set for one they declare that the table does not name, so a new RPC is no
    role's until it is given a row, rather than every caller's."""
    roles = METHOD_ROLES.get(method)
    if roles is None and method in _SERVED:
        return frozenset()
    return roles


def bearer_token(metadata: Sequence[tuple[str, str | bytes]] | None) -> str | None:
    """The token of the call's first ``authorization: Bearer ...`` header, if any."""
    for key, value in metadata or ():
        if key == "authorization" and isinstance(value, str) and value[:len(_SCHEME)].lower() == _SCHEME:
            return value[len(_SCHEME):].strip()
    return None


def credential_for(credentials: Iterable[Credential], metadata: Sequence[tuple[str, str | bytes]] | None
                   ) -> Credential | None:
    """The credential whose token a call carries; None for no token or an unknown one."""
    token = bearer_token(metadata)
    if not token:
        return None
    digest = token_sha256(token)
    found = None
    for credential in credentials:  # every one compared: no early exit to time
        if hmac.compare_digest(digest, credential.token_sha256):
            found = credential
    return found


def _method_name(method: str) -> str:
    return method.rsplit("/", 1)[-1]


def _listed(roles: Iterable[str], joiner: str) -> str:
    return joiner.join(sorted(roles))


class RoleInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Lets a call through when its token names a credential holding a role the method needs
    (``roles_for_method``); no credentials at all: every call, as with no authentication."""

    def __init__(self, credentials: Iterable[Credential]) -> None:
        self._credentials = tuple(credentials)
        self._unauthenticated = refusal(grpc.StatusCode.UNAUTHENTICATED,
                                        "this farm needs a token: pass one with --token-file or FARM_TOKEN",
                                        "UNAUTHENTICATED")
        self._denials: dict[tuple[str, str], grpc.RpcMethodHandler[Any, Any]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        method = details.method
        if not self._credentials or is_open(method):
            return await continuation(details)
        caller = self.caller(details.invocation_metadata)
        if caller is None:
            return self._unauthenticated
        needed = roles_for_method(method)
        if needed is None or caller.roles & needed:
            return await continuation(details)
        return self._denial(caller, method, needed)

    def caller(self, metadata: Sequence[tuple[str, str | bytes]] | None) -> Credential | None:
        """The credential whose token the call carries; None for no token or an unknown one."""
        return credential_for(self._credentials, metadata)

    def _denial(self, caller: Credential, method: str, needed: frozenset[str]) -> grpc.RpcMethodHandler[Any, Any]:
        """PERMISSION_DENIED naming the credential, its roles and what the method needs; built (and
        logged) once per credential and method."""
        key = (caller.name, method)
        denial = self._denials.get(key)
        if denial is not None:
            return denial
        name = _method_name(method)
        why = f"it needs {_listed(needed, ' or ')}" if needed else "farmd gives it to no role"
        detail = f"credential {caller.name!r} ({_listed(caller.roles, ', ')}) may not call {name}: {why}"
        denial = refusal(grpc.StatusCode.PERMISSION_DENIED, detail, "PERMISSION_DENIED")
        # Only methods farm declares get here (``roles_for_method``): a bounded cache, and log.
        log.info("%s", detail, extra={"event": "permission_denied", "credential": caller.name, "method": name})
        self._denials[key] = denial
        return denial
