"""``farmctl envs`` and ``farmctl agents``: what a run may name, read from the registries here, no daemon.

Both lists are derived, not kept: an environment's kind is whether it can start an episode (action
tasks) or not (one submission), and an agent form counts as runnable when the registry accepts an
example of it, so neither can drift from what farmd would do with the same name.
"""

from __future__ import annotations

import sys
from typing import Any

import click
from rich import box
from rich.table import Column, Table
from rich.text import Text

from farmd.agents.registry import NamedEndpoint, check_spec
from farmd.cli.common import CliState, console, emit_json, json_option
from farmd.cli.shown import text
from farmd.envs import Environment, get, kind_of, names
from farmd.errors import AgentSpecError

_AGENT_FORMS = (
    # (the form, an example the registry must accept for the form to be runnable, what it runs)
    ("reference", "reference", "the environment's reference attempt (it must pass)"),
    ("random[:SEED]", "random:1", "a plausible wrong attempt, the same for a task and seed"),
    ("skilled:S", "skilled:2.5", "a stand-in policy of skill S (levels run 1..5): the reference with "
                                 "probability 1/(1+e^(difficulty-S)), else a random attempt"),
    ("torch:NAME[?temperature=T&max_tokens=N]", "torch:tiny",
     "the newest version of the policy a trainer published as NAME (farm_client.tinylm), sampled on the "
     "worker in batches"),
    ("redteam:exploit|escape:NAME", "redteam:exploit:no-tags",
     "an adversary (farmctl redteam queues these): the exploit library's attempt NAME, or escape NAME tried from "
     "inside its box; flagged, and never counted in the task bank or the pass rates"),
)
_OPENAI = "a model behind an OpenAI-compatible API, at the endpoint farm.toml names [endpoints.{name}]"


def describe_env(env: Environment) -> dict[str, Any]:
    """name, version, verifier_version, max_difficulty, kind (submission or actions), description."""
    # The interface it implements, not a field it sets: it cannot claim a kind it does not play.
    kind = kind_of(env)
    return {**env.describe(), "kind": kind, "description": _summary(env)}


def _summary(env: Environment) -> str:
    """The environment's own words: its ``description``; else the first line of its module's docstring
    when that says what the environment is (the built-ins' begin ``name``: ...), or of its class's."""
    own = getattr(env, "description", None)
    if isinstance(own, str) and own:
        return own
    module = _first_line(sys.modules[type(env).__module__].__doc__)
    if module.startswith("``") and "``: " in module:
        return module.split("``: ", 1)[1].replace("``", "")
    return _first_line(type(env).__doc__).replace("``", "")


def _first_line(doc: str | None) -> str:
    return (doc or "").strip().split("\n", 1)[0]


def describe_agents(endpoints: tuple[NamedEndpoint, ...]) -> list[dict[str, Any]]:
    """Each agent form: ``spec``, ``runnable`` (the registry takes it here), ``description``, and why not."""
    rows = [_form(form, example, what, endpoints) for form, example, what in _AGENT_FORMS]
    for e in endpoints:
        row = _form(f"openai:MODEL@{e.name}", f"openai:model@{e.name}", _OPENAI.format(name=e.name), endpoints)
        rows.insert(-1, {**row, "endpoint": e.name, "url": ", ".join(e.urls), "max_tokens": e.max_tokens,
                         "max_turns": e.max_turns})
    if not endpoints:
        rows.insert(-1, _form("openai:MODEL@NAME", "openai:model@NAME", _OPENAI.format(name="NAME"), endpoints))
    return rows


def _form(spec: str, example: str, what: str, endpoints: tuple[NamedEndpoint, ...]) -> dict[str, Any]:
    try:
        check_spec(example, endpoints=endpoints)
    except AgentSpecError as exc:
        return {"spec": spec, "runnable": False, "description": what, "why_not": str(exc)}
    return {"spec": spec, "runnable": True, "description": what, "why_not": ""}


@click.command("envs")
@json_option
def envs(as_json: bool) -> None:
    """The environments a run may name: version, verifier version, levels, kind, what it is."""
    rows = [describe_env(get(name)) for name in names()]
    if as_json:
        emit_json(rows)
        return
    table = Table(Column("env", no_wrap=True), "version", "verifier", "levels", Column("kind", no_wrap=True),
                  Column("what it is", min_width=24, overflow="fold"), box=box.SIMPLE_HEAD)
    for r in rows:  # a contributed environment chose its own name and words: shown, never markup
        table.add_row(text(r["name"]), text(r["version"]), text(r["verifier_version"]), str(r["max_difficulty"]),
                      text(r["kind"]), text(r["description"]))
    console().print(table)


@click.command("agents")
@json_option
@click.pass_obj
def agents(state: CliState, as_json: bool) -> None:
    """The agent specs a run may name: openai ones by the endpoints of the --config given (farmd runs
    what its own config names)."""
    rows = describe_agents(state.config.endpoints)
    if as_json:
        emit_json(rows)
        return
    table = Table(Column("agent", no_wrap=True), "runnable", Column("what it runs", overflow="fold"),
                  box=box.SIMPLE_HEAD)
    for r in rows:
        what = text(r["description"])
        if r.get("url"):
            what.append_text(Text.assemble(" at ", text(r["url"])))
        if r["why_not"]:
            what.append_text(Text.assemble("\n", text(r["why_not"], "red")))
        table.add_row(text(r["spec"]), "yes" if r["runnable"] else "no", what)
    console().print(table)
