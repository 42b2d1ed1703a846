"""``farmctl task show``, ``farmctl verify`` and ``farmctl audit``: environments, locally, no daemon."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from farmd.cli.common import EXIT_INFRA, CliState, console, emit_json, fail, json_option, run_async
from farmd.cli.shown import plain, text
from farmd.envs import Attempt, VerifyContext, get, verify_safely
from farmd.envs.base import Environment
from farmd.errors import TaskError
from farmd.sandbox import Sandbox
from farmd.verifier.secret import VerifierKey


def _env(name: str) -> Environment:
    try:
        return get(name)
    except TaskError as exc:
        raise click.BadParameter(plain(exc, inline=False), param_hint="--env") from None


def _task_args(f: Any) -> Any:
    f = click.option("--difficulty", type=int, default=1, show_default=True, help="1 (easiest) and up.")(f)
    f = click.option("--seed", type=int, required=True, help="Which task.")(f)
    f = click.option("--env", "env_name", required=True, help="Environment, e.g. py-func, kernel, shell, rg:chain_sum.")(f)
    return f


@click.group("task")
def task_group() -> None:
    """Look at tasks."""


@task_group.command("show")
@_task_args
@json_option
def task_show(env_name: str, seed: int, difficulty: int, as_json: bool) -> None:
    """Print the public task as JSON: env, seed, difficulty, prompt, entry_point or answer_format, examples.

    It is JSON with or without --json; with it, so are errors.
    """
    env = _env(env_name)
    try:
        task = env.generate(seed, difficulty)
    except TaskError as exc:
        raise click.BadParameter(plain(exc, inline=False), param_hint="--difficulty") from None
    emit_json(task.public())


def _read_attempt(path: Path, kind: str) -> Attempt:
    text = path.read_text(encoding="utf-8", errors="surrogateescape")
    if kind == "actions":
        try:
            data = json.loads(text)
        except ValueError:
            return Attempt(actions=[line for line in text.splitlines() if line.strip()])
        if not isinstance(data, dict):
            raise click.BadParameter("an action attempt is a JSON object {\"actions\": [...], \"final\": \"...\"}")
        return Attempt(final=str(data.get("final", "")), actions=[str(a) for a in data.get("actions", [])])
    return Attempt(final=text)


@click.command("verify")
@_task_args
@click.option("--submission", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The attempt: code or answer text; for action tasks JSON {actions, final} or one command a line.")
@click.option("--reference", is_flag=True, help="Verify the environment's reference attempt instead.")
@click.option("--data", "data_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Farm data directory holding the verifier key (default: the config's, ./farm-data).")
@json_option
@click.pass_obj
def verify(state: CliState, env_name: str, seed: int, difficulty: int, submission: Path | None, reference: bool,
           data_dir: Path | None, as_json: bool) -> None:
    """Verify an attempt at a task and print the verdict as JSON. Needs no daemon.

    Exits 0 with a verdict whose status is ok (passed or not), 4 when the verifier
    could not judge (status error: not a score). The verdict is JSON with or without
    --json; with it, so are errors.
    """
    if reference == (submission is not None):
        raise click.UsageError("give exactly one of --submission FILE and --reference")
    env = _env(env_name)
    try:
        task = env.generate(seed, difficulty)
    except TaskError as exc:
        raise click.BadParameter(plain(exc, inline=False), param_hint="--difficulty") from None
    attempt = env.reference(task) if reference else _read_attempt(submission, task.kind)  # type: ignore[arg-type]
    key = VerifierKey.load_or_create(data_dir or state.config.data_dir)
    verdict = run_async(_verify(state, env, task, attempt, key))
    emit_json(verdict)
    sys.exit(0 if verdict["status"] == "ok" else EXIT_INFRA)


async def _verify(state: CliState, env: Environment, task: Any, attempt: Attempt, key: VerifierKey) -> dict[str, Any]:
    async with Sandbox(state.config.sandbox) as sandbox:
        verdict = await verify_safely(env, task, attempt, VerifyContext(sandbox=sandbox, key=key))
    return verdict.to_json()


@click.command("audit")
@click.option("--env", "env_name", required=True, help="Environment to audit.")
@click.option("--n", "n", type=click.IntRange(min=1), default=10, show_default=True, help="Seeds per difficulty.")
@click.option("--data", "data_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Farm data directory holding the verifier key.")
@json_option
@click.pass_obj
def audit(state: CliState, env_name: str, n: int, data_dir: Path | None, as_json: bool) -> None:
    """Recall on reference attempts and precision against the built-in exploit library, with counts."""
    from farmd.intake.audit import run_audit

    env = _env(env_name)
    key = VerifierKey.load_or_create(data_dir or state.config.data_dir)
    report = run_async(run_audit(env, n, key, state.config.sandbox, progress=not as_json))
    if as_json:
        emit_json(report)  # one document: its "errors" and the exit code say what failed
        if report["errors"]:
            sys.exit(EXIT_INFRA)
        return
    _print_audit(report)
    if report["errors"]:
        fail(f"{report['errors']} verifications ended in a verifier error", EXIT_INFRA)


def _print_audit(report: dict[str, Any]) -> None:
    from rich.table import Table
    from rich.text import Text

    out = console()
    # Environments and their exploits' descriptions may come from contributors: shown, never markup.
    out.print(Text.assemble(text(report["env"], "bold"), " verifier ", text(report["verifier_version"]),
                            f": {report['seeds_per_level']} seeds x {report['levels']} levels"))
    r = report["recall"]
    out.print(f"recall    {r['passed']}/{r['total']} reference attempts passed ({r['rate']:.3f})")
    p = report["precision"]
    out.print(f"precision {p['rate']:.3f}: {p['true_positives']} rewarded attempts were references, "
              f"{p['false_positives']} were exploits")
    table = Table("exploit", "attempts", "rewarded", "flagged as hack", "what it tries")
    for e in report["exploits"]:
        table.add_row(text(e["name"]), str(e["attempts"]), str(e["rewarded"]), str(e["flagged"]),
                      text(e["description"]))
    out.print(table)
