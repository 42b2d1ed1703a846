"""log-fields: pull fields of failed requests out of access logs."""

from __future__ import annotations

import random
from collections import Counter
from types import MappingProxyType

from farmd.envs.shell.puzzle import Expect, Puzzle
from farmd.envs.shell.words import (
    USERS,
    WORDS,
    text_lines,
)

_STATUSES = (200, 200, 200, 201, 204, 301, 304, 400, 401, 403, 404, 500, 500, 502, 503, 504)


def _access_line(rng: random.Random, req: str, status: int, user: str, shuffle: bool) -> str:
    fields = [f"req={req}", f"method={rng.choice(('GET', 'POST', 'PUT', 'DELETE'))}",
              f"path=/api/{rng.choice(WORDS)}/{rng.randint(1, 999)}", f"status={status}",
              f"ms={rng.randint(1, 999)}", f"user={user}"]
    if shuffle:
        rng.shuffle(fields)
    stamp = f"2024-03-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00Z"
    return " ".join([stamp, *fields])


def make(rng: random.Random, d: int) -> Puzzle:
    n_files, n_lines = [(1, 20), (1, 30), (3, 20), (4, 20), (5, 20)][d - 1]
    users = rng.sample(USERS, 6)
    only_500 = d <= 2
    while True:
        files: dict[str, bytes] = {}
        failed_ids: list[str] = []
        per_user: Counter[str] = Counter()
        names = ["logs/access.log"] if n_files == 1 else [f"logs/access-{i}.log" for i in range(1, n_files + 1)]
        for name in names:
            lines = []
            for _ in range(n_lines):
                req = "".join(rng.choice("0123456789abcdef") for _ in range(8))
                status, user = rng.choice(_STATUSES), rng.choice(users)
                lines.append(_access_line(rng, req, status, user, shuffle=d >= 2))
                if status == 500 or (not only_500 and 500 <= status <= 599):
                    failed_ids.append(req)
                    per_user[user] += 1
            files[name] = text_lines(lines)
        if d >= 3:
            files["logs/access.log.bak"] = text_lines([_access_line(rng, "deadbeef", 500, users[0], True)])
        if len(failed_ids) >= 2 and len(per_user) >= 2:
            break
    status_rule = "status is `500`" if only_500 else "status is in the 500s (500 to 599)"
    scope = "`logs/access.log`" if n_files == 1 else "the files under `logs/` whose name ends in `.log` (in name order)"
    extract = ("awk '{s = \"\"; for (i = 2; i <= NF; i++) { k = $i; sub(/=.*/, \"\", k); v = $i; sub(/^[^=]*=/, \"\", v); "
               "if (k == \"status\") s = v; else if (k == \"req\") r = v; else if (k == \"user\") u = v } "
               f"if (s ~ /{'^500$' if only_500 else '^5[0-9][0-9]$'}/) print {'u' if d >= 4 else 'r'} }}' "
               + ("logs/access.log" if n_files == 1 else "logs/*.log"))
    intro = (f"Each line of {scope} is a timestamp followed by `key=value` fields"
             + (" in any order" if d >= 2 else "") + f". A request failed when its {status_rule}. ")
    if d <= 3:
        out, lines_out = "failed.txt", failed_ids
        goal = intro + (f"Write the `req` value of every failed request to `{out}`, one per line, in the order "
                        "they appear" + (" (files in name order, then line by line)." if n_files > 1 else "."))
        action = f"{extract} > {out}"
    elif d == 4:
        out, lines_out = "users.txt", sorted(per_user)
        goal = intro + (f"Write every `user` that has at least one failed request to `{out}`, one per line, sorted "
                        "in byte order, without duplicates.")
        action = f"{extract} | LC_ALL=C sort -u > {out}"
    else:
        out = "report.txt"
        ranked = sorted(per_user.items(), key=lambda kv: (-kv[1], kv[0]))
        lines_out = [f"{u} {n}" for u, n in ranked]
        goal = intro + (f"For every `user` with at least one failed request, write a line `USER COUNT` (COUNT: that "
                        f"user's failed requests) to `{out}`, sorted by COUNT, largest first, then by USER in "
                        "byte order.")
        action = f"{extract} | LC_ALL=C sort | uniq -c | awk '{{print $2, $1}}' | LC_ALL=C sort -k2,2nr -k1,1 > {out}"
    return Puzzle(
        family="log-fields", goal=goal, finish="files", files=MappingProxyType(files), actions=(action,),
        expected=MappingProxyType({out: Expect("lines", text_lines(lines_out))}),
        answer_format=f"Finish by leaving `{out}` as described. The final file state is checked; the final "
                      "answer text is ignored.",
    )
