"""Every farm error is sent with the status code and ErrorInfo reason its kind stands for, and a job's stored
error (``Kind: message``) is shown with the same: the errors that moved to ``farmd.errors`` kept theirs."""

from __future__ import annotations

import grpc
import pytest
from google.rpc.error_details_pb2 import ErrorInfo

from farmd import errors as E
from farmd.api.errors import failure_status, status_for

EXPECTED: list[tuple[BaseException, grpc.StatusCode, str]] = [
    (E.Refused("DATA_LOSS", "the policy's file is gone", "POLICY_CONTENT_LOST"), grpc.StatusCode.DATA_LOSS,
     "POLICY_CONTENT_LOST"),
    (E.Refused("NO_SUCH_CODE", "a handler's typo", "X"), grpc.StatusCode.INTERNAL, "INTERNAL"),
    (E.BudgetExhausted("64 streams open"), grpc.StatusCode.RESOURCE_EXHAUSTED, "CREDENTIAL_BUDGET"),
    (E.PackageError(["no manifest"]), grpc.StatusCode.INVALID_ARGUMENT, "BAD_SUBMISSION"),
    (E.AtroposInvalid(["group", 0], "scores and tokens differ in length"), grpc.StatusCode.INVALID_ARGUMENT,
     "INVALID_ARGUMENT"),
    (E.SeccompUnavailable("libseccomp could not be loaded"), grpc.StatusCode.FAILED_PRECONDITION, "NO_ISOLATION"),
    (E.CgroupUnavailable("cgroup v2: not mounted"), grpc.StatusCode.FAILED_PRECONDITION, "NO_ISOLATION"),
    (E.OffloadFailed("the worker process died"), grpc.StatusCode.UNAVAILABLE, "OFFLOAD_FAILED"),
    (E.LinkDown("not connected"), grpc.StatusCode.UNAVAILABLE, "COORDINATOR_UNAVAILABLE"),
    (E.RequestFailed("refused"), grpc.StatusCode.UNAVAILABLE, "COORDINATOR_UNAVAILABLE"),
    (E.ContributedError("generate", "crashed"), grpc.StatusCode.INTERNAL, "CONTRIBUTED_ENV_FAILED"),
    (E.CheckBudgetSpent("box seconds: 901 of 900"), grpc.StatusCode.INTERNAL, "CHECK_BUDGET_SPENT"),
    (E.AttackerError("no reply"), grpc.StatusCode.INTERNAL, "ATTACKER_UNAVAILABLE"),
    (E.GeneratorBug("a puzzle broke its invariant"), grpc.StatusCode.INTERNAL, "INTERNAL"),
    (E.TaskError("no environment 'gone'"), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_TASK"),
    (E.SandboxError("bwrap died"), grpc.StatusCode.UNAVAILABLE, "SANDBOX_UNAVAILABLE"),
]


@pytest.mark.parametrize(("error", "code", "reason"), EXPECTED, ids=lambda v: type(v).__name__)
def test_an_error_is_sent_with_its_kinds_code_and_reason(error: BaseException, code: grpc.StatusCode,
                                                         reason: str) -> None:
    assert status_for(error) == (code, reason)


@pytest.mark.parametrize(("error", "code", "reason"),
                         [e for e in EXPECTED if not isinstance(e[0], E.Refused)], ids=lambda v: type(v).__name__)
def test_a_jobs_stored_error_is_shown_with_its_kinds_code(error: BaseException, code: grpc.StatusCode,
                                                          reason: str) -> None:
    status = failure_status(f"{type(error).__name__}: {error}")
    info = ErrorInfo()
    assert status.details[0].Unpack(info) and info.domain == "farm"
    assert status.code == code.value[0], (type(error).__name__, status.code)
