"""``farmctl envs`` and ``farmctl agents``: the registries, listed locally, with no farmd."""

from __future__ import annotations

import json
from pathlib import Path

from farmd.agents.registry import FORMS
from farmd.envs import get, names
from tests.conftest import farmctl

ENV_FIELDS = {"name", "version", "verifier_version", "max_difficulty", "kind", "description"}


def test_envs_lists_every_environment_as_the_registry_has_it() -> None:
    rows = json.loads(farmctl("envs", "--json").stdout)
    assert [r["name"] for r in rows] == names()
    for r in rows:
        env = get(r["name"])
        assert set(r) == ENV_FIELDS and r["description"], r
        assert (r["version"], r["verifier_version"], r["max_difficulty"]) == \
            (env.version, env.verifier_version, env.max_difficulty)
        assert r["kind"] == env.generate(1, 1).kind, "the kind a listing says is the kind of task it makes"
    by_name = {r["name"]: r for r in rows}
    assert by_name["shell"]["kind"] == "actions" and by_name["py-func"]["kind"] == "submission"
    assert "Python function" in by_name["py-func"]["description"]
    human = farmctl("envs").stdout.decode()
    assert "rg:chain_sum" in human and "actions" in human and "submission" in human


def test_agents_lists_each_form_and_the_endpoints_a_config_names(tmp_path: Path) -> None:
    bare = {r["spec"]: r for r in json.loads(farmctl("agents", "--json").stdout)}
    heads = {spec.split(":")[0].split("[")[0] for spec in bare}
    assert {form.split(":")[0] for form in FORMS} <= heads, "every form the registry knows is listed"
    assert bare["reference"]["runnable"] and bare["random[:SEED]"]["runnable"] and bare["skilled:S"]["runnable"]
    openai = bare["openai:MODEL@NAME"]
    assert not openai["runnable"] and "[endpoints.NAME]" in openai["why_not"], "says how to configure one"
    torch = bare["torch:NAME[?temperature=T&max_tokens=N]"]
    assert torch["runnable"] and "published" in torch["description"], "a spec of a published policy line"

    cfg = tmp_path / "farm.toml"
    cfg.write_text('[endpoints.vllm]\nurl = "http://127.0.0.1:9/v1"\nmax_tokens = 512\n\n'
                   '[endpoints.backup]\nurl = "http://127.0.0.1:10/v1"\n')
    rows = json.loads(farmctl("--config", str(cfg), "agents", "--json").stdout)
    configured = {r["endpoint"]: r for r in rows if "endpoint" in r}
    assert set(configured) == {"vllm", "backup"}
    vllm = configured["vllm"]
    assert vllm["spec"] == "openai:MODEL@vllm" and vllm["runnable"] and vllm["url"] == "http://127.0.0.1:9/v1"
    assert vllm["max_tokens"] == 512
    assert "openai:MODEL@NAME" not in {r["spec"] for r in rows}
    human = farmctl("--config", str(cfg), "agents").stdout.decode()
    assert "openai:MODEL@vllm" in human and "http://127.0.0.1:9/v1" in human
