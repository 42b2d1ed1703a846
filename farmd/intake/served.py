"""An approved version of a contributed environment, served as an ordinary environment: rollouts, the
``reference`` agent, rescoring and ``verify_safely`` use it as they use a built-in.

Its generator, reference and verifier are the contributor's code, so each call runs in a box
(``BoxedEnvironment``) and only the async ``make_task``/``make_reference`` can reach them: the sync
``generate``/``reference`` refuse. A verdict has a box of its own; a verifiers package makes its tasks and
references in one box that lives from call to call (``_maker``), since they come from seeds, never attempts.
It is named ``contrib:NAME@VERSION``, as the task bank and jobs name an approved version, so two versions can
be served side by side and every trajectory says which one made its task.

A verdict is the contributed verifier's, read strictly by ``BoxedEnvironment``. When that verifier fails
(``ContributedError``: it raised, hit a bound, answered out of shape) the failure goes to
``verify_safely``'s rule like any verifier bug: the attempt gets 0, flagged ``verifier_fault``, if the
task's reference is still judged a pass, and it is an infrastructure error if not. ``ContributedError``
is a ``FarmError``, which ``verify_safely`` would take for the farm's own failure (an error whatever the
attempt did, so an attempt that breaks the verifier would escape its 0); ``verify`` re-raises it as
``ContributedVerifierFailed``, which ``verify_safely`` judges as it judges a bug. The farm's own failures (a box that cannot start) stay
``FarmError``s: infrastructure.

A package in verifiers' form is served the same way (its boxes drive ``load_environment`` through
``vf_adapter``), as ``contrib:NAME@VERSION`` once approved, or as ``vf:NAME`` where an operator serves a local
one (``[verifiers]`` in farm.toml, ``farmd.intake.vf``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from farmd.envs.base import Attempt, SubmissionEnvironment, Task, VerifyContext
from farmd.errors import ContributedError, ContributedVerifierFailed, TaskError
from farmd.intake.boxed import MAX_FINAL_CHARS, BoxedEnvironment
from farmd.intake.package import Package
from farmd.verifier.verdict import Verdict, failed

_DIGEST_CHARS = 12
"""Of the package's digest in ``verifier_version``: enough to tell two packages apart."""
MAKER_CALLS_KEPT = 64
"""The newest calls a served version's task maker keeps (what they cost): it lives as long as the farm serves it."""


class ContributedEnvironment(SubmissionEnvironment):
    """``package`` (an approved version) as an environment; its boxes are the node's (``VerifyContext``)."""

    def __init__(self, package: Package, *, name: str | None = None) -> None:
        m = package.manifest
        self.package = package
        # An operator's own verifiers environment is served by the name farm.toml gives it (``vf:NAME``).
        self.name = name or f"{m.env_name}@{m.version}"
        self.version = m.version
        # The digest too: a score row (and rescoring, which skips what a verifier version has scored)
        # names the exact code that judged, even were other files ever approved under the same version.
        self.verifier_version = f"{m.version}+{package.digest[:_DIGEST_CHARS]}"
        self.max_difficulty = m.levels
        self.exploit_kind = m.kind
        self._makers: dict[int, BoxedEnvironment] = {}
        """Where tasks and references are made, by the node's sandbox (``_maker``)."""

    def _boxed(self, ctx: VerifyContext) -> BoxedEnvironment:
        # A verdict's box is its own (never batched): an attempt shares no process tree with another attempt.
        return BoxedEnvironment(self.package, ctx.sandbox, ctx.key, batch=False)

    def _maker(self, ctx: VerifyContext) -> BoxedEnvironment:
        """Where a task or a reference is made. Those are made from a seed alone, never from an attempt, so a
        verifiers package makes them in a box that lives from call to call (``BoxedEnvironment``'s batches:
        verifiers imported once, not once a task; each call in a child of its own, forked from the same imported
        state, so a task is what a fresh box would make). Other packages' calls have a box each either way."""
        maker = self._makers.get(id(ctx.sandbox))
        if maker is None or maker.sandbox is not ctx.sandbox or maker.key is not ctx.key:
            maker = BoxedEnvironment(self.package, ctx.sandbox, ctx.key, batch=True, keep_calls=MAKER_CALLS_KEPT)
            self._makers[id(ctx.sandbox)] = maker  # it holds the sandbox: the id is not reused while it is here
        return maker

    async def aclose(self) -> None:
        """Close the box its tasks are made in now (left alone, it closes after ``SESSION_IDLE_S`` idle)."""
        makers, self._makers = list(self._makers.values()), {}
        await asyncio.gather(*(m.aclose() for m in makers), return_exceptions=True)

    def generate(self, seed: int, difficulty: int) -> Task:
        raise TaskError(f"{self.name} makes its tasks in boxes: ask make_task(seed, difficulty, ctx)")

    def reference(self, task: Task) -> Attempt:
        raise TaskError(f"{self.name} makes its references in boxes: ask make_reference(task, ctx)")

    async def make_task(self, seed: int, difficulty: int, ctx: VerifyContext) -> Task:
        self.check_difficulty(difficulty)  # before a box is spent on it
        made = await self._maker(ctx).generate(seed, difficulty)
        return self.task(seed, difficulty, made.prompt, **_public_fields(made.public))

    async def make_reference(self, task: Task, ctx: VerifyContext) -> Attempt:
        self.check_difficulty(task.difficulty)
        return Attempt(final=await self._maker(ctx).reference(task.seed, task.difficulty))

    async def verify(self, task: Task, attempt: Attempt, ctx: VerifyContext) -> Verdict:
        v = self.verifier_version
        self.check_difficulty(task.difficulty)
        if len(attempt.final) > MAX_FINAL_CHARS:  # the box is handed at most this: never judge a cut answer
            return failed(v, f"the answer is {len(attempt.final)} characters; at most {MAX_FINAL_CHARS}")
        try:
            judged = await self._boxed(ctx).verify(task.seed, task.difficulty, attempt.final)
        except ContributedError as exc:
            raise ContributedVerifierFailed(str(exc)) from exc
        return Verdict(reward=judged.reward, passed=judged.passed, status="ok", verifier_version=v,
                       reasons=list(judged.reasons))

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "digest": self.package.digest, "kind": self.exploit_kind}


def _public_fields(public: dict[str, Any]) -> dict[str, Any]:
    """A contributed task's ``public`` as ``Task`` fields: the ones ``Task`` names (of the right type, else
    ``ContributedError``: a task of the wrong shape is never posed), the rest in ``metadata``."""
    rest = dict(public)
    fields: dict[str, Any] = {}
    for key in ("entry_point", "answer_format"):
        if key in rest:
            value = rest.pop(key)
            if not isinstance(value, str) or not value.strip():
                raise ContributedError("generate", f"public {key} must be text")
            fields[key] = value
    if "examples" in rest:
        examples = rest.pop("examples")
        if not isinstance(examples, list) or not all(isinstance(e, dict) for e in examples):
            raise ContributedError("generate", "public examples must be a list of objects")
        fields["examples"] = examples
    return {**fields, "metadata": rest}
