"""edit-config: edit one section of an INI file; every other line must stay."""

from __future__ import annotations

import random
from types import MappingProxyType

from farmd.envs.shell.puzzle import Expect, Puzzle, ensure
from farmd.envs.shell.words import (
    USERS,
    WORDS,
    sentence,
    text_lines,
)

_SECTIONS: dict[str, tuple[str, ...]] = {
    "server": ("port", "host", "workers", "timeout"),
    "database": ("port", "host", "user", "pool"),
    "cache": ("size", "ttl", "host", "port"),
    "logging": ("level", "path", "rotate", "timeout"),
    "admin": ("port", "user", "timeout", "workers"),
    "host": ("cpus", "memory", "name"),
    "auth": ("timeout", "retries", "realm", "port"),
    "queue": ("workers", "size", "retries", "host"),
}
LEFT_ALONE = "Change nothing else"
_NUMERIC = frozenset({"port", "workers", "timeout", "pool", "size", "ttl", "rotate", "cpus", "memory", "retries"})


def _value(rng: random.Random, key: str) -> str:
    if key in _NUMERIC:
        return str(rng.randint(2, 9000))
    return {"host": f"{rng.choice(WORDS)}.local", "user": rng.choice(USERS), "path": f"/var/log/{rng.choice(WORDS)}",
            "level": rng.choice(("info", "debug", "warn")), "realm": rng.choice(WORDS).upper(),
            "name": rng.choice(WORDS)}[key]


def _ini(sections: list[tuple[str, list[tuple[str, str]]]], header: str) -> list[str]:
    lines = [f"# {header}", ""]
    for name, body in sections:
        lines.append(f"[{name}]")
        lines += [f"{k} = {v}" if k != "#" else v for k, v in body]
        lines.append("")
    return lines


def _config_sections(rng: random.Random, d: int) -> tuple[list[str], str, list[str]]:
    """Section names, the target section, and the numeric key of it to set literally."""
    while True:
        names = rng.sample(sorted(_SECTIONS), [2, 3, 4, 6, 6][d - 1])
        if d >= 5 and "host" not in names:
            names[-1] = "host"  # where the computed edit reads `cpus`
        target = rng.choice([n for n in names if n != "host"] or names)
        # At level 5 `workers` is the computed edit, so the literal edits are of other keys.
        keys = [k for k in _SECTIONS[target] if k in _NUMERIC and (d < 5 or k != "workers")]
        shared = [k for k in keys if any(k in _SECTIONS[n] for n in names if n != target)]
        if d in (2, 3) and not shared:
            continue  # the same key must appear in another section, to be left alone
        if (d == 4 and len(keys) < 2) or (d >= 5 and ("workers" not in _SECTIONS[target] or not keys)):
            continue
        return names, target, (shared if d >= 2 and shared else keys)


def _config_files(rng: random.Random, names: list[str], target: str, d: int) -> dict[str, list[str]]:
    """Which sections go in which file: one file up to level 3, three under `etc/conf.d/` beyond."""
    if d <= 3:
        return {"etc/app.ini": names}
    rng.shuffle(names)
    cut = sorted(rng.sample(range(1, len(names)), 2))
    parts = [names[:cut[0]], names[cut[0]:cut[1]], names[cut[1]:]]
    groups = {f"etc/conf.d/{i}0-{tag}.ini": part for i, (tag, part) in
              enumerate(zip(("base", "net", "extra"), parts, strict=True), 1)}
    home = next(p for p, g in groups.items() if target in g)
    if d >= 5 and "host" in groups[home]:  # [host] must live in another file: swap it for a section there
        other = next(p for p in groups if p != home)
        i = groups[home].index("host")
        groups[home][i], groups[other][0] = groups[other][0], groups[home][i]
    return groups


def _config_action(target: str, new: dict[str, str], d: int) -> str:
    exprs = []
    for k, v in new.items():
        if d >= 5 and k == "workers":  # double quotes: the shell computes the value
            exprs.append(f'-e "/^\\[{target}\\]/,/^\\[/ s/^workers = .*/workers = $((2 * c))/"')
        else:
            exprs.append(f"-e '/^\\[{target}\\]/,/^\\[/ s/^{k} = .*/{k} = {v}/'")
    if d <= 3:
        return f"sed -i {' '.join(exprs)} etc/app.ini"
    action = f"f=$(grep -l '^\\[{target}\\]' etc/conf.d/*.ini) && sed -i {' '.join(exprs)} \"$f\""
    if d >= 5:
        action = "c=$(sed -s -n '/^\\[host\\]/,/^\\[/ s/^cpus = //p' etc/conf.d/*.ini) && " + action
    return action


def make(rng: random.Random, d: int) -> Puzzle:
    names, target, candidates = _config_sections(rng, d)
    first = rng.choice(candidates)
    bodies: dict[str, list[tuple[str, str]]] = {}
    for n in names:
        bodies[n] = [(k, _value(rng, k)) for k in _SECTIONS[n]]
        rng.shuffle(bodies[n])
    old = dict(bodies[target])
    edited = [first]
    if d == 4:
        edited.append(rng.choice([k for k in _SECTIONS[target] if k in _NUMERIC and k != first]))
    new = {k: str(int(old[k]) + rng.randint(1, 500)) for k in edited}
    if d >= 5:
        cpus = int(dict(bodies["host"])["cpus"]) % 64 + 2
        bodies["host"] = [("#", f"# cpus = {cpus + 7}"), *((k, str(cpus) if k == "cpus" else v)
                                                           for k, v in bodies["host"])]
        new["workers"] = str(2 * cpus)
    if d >= 3:  # near misses in the target section: the key commented out, and a longer key
        body = bodies[target]
        body.insert(rng.randint(0, len(body)), ("#", f"# {first} = {rng.randint(2, 9000)}"))
        body.insert(rng.randint(0, len(body)),
                    (f"{first}_{rng.choice(('max', 'min', 'backup'))}", str(rng.randint(2, 9000))))
    files: dict[str, bytes] = {}
    final: dict[str, bytes] = {}
    for path, group in _config_files(rng, names, target, d).items():
        header = f"{path.rsplit('/', 1)[1]}: {sentence(rng, 2, 4)}"
        files[path] = text_lines(_ini([(n, bodies[n]) for n in group], header))
        after = [(n, [(k, new[k]) if n == target and k in new else (k, v) for k, v in bodies[n]]) for n in group]
        final[path] = text_lines(_ini(after, header))
    ensure(files != final, "edit-config: the edit must change something")
    changes = [f"`{k}` to `{v}`" for k, v in new.items() if not (d >= 5 and k == "workers")]
    if d >= 5:
        changes.append("`workers` to twice the value of `cpus` in section `[host]`")
    where = "`etc/app.ini`" if d <= 3 else "the INI files under `etc/conf.d/` (the one that has it)"
    goal = (f"In section `[{target}]` of {where}, set {' and '.join(changes)}. {LEFT_ALONE}: every other "
            "line of every file under `etc/` must stay as it is (spaces around `=` and at line ends do not "
            "matter), and leave no other files under `etc/`.")
    return Puzzle(
        family="edit-config", goal=goal, finish="files", files=MappingProxyType(files),
        actions=(_config_action(target, new, d),),
        expected=MappingProxyType({p: Expect("ini", c) for p, c in final.items()}), scope=("etc",),
        answer_format="Finish by leaving the edited files in place. The final state of `etc/` is checked; the "
                      "final answer text is ignored.",
        left_alone=LEFT_ALONE,
    )
