"""csv-sum: sum a CSV column over filtered rows into ``total.txt``."""

from __future__ import annotations

import random
from decimal import Decimal
from types import MappingProxyType

from farmd.envs.shell.puzzle import Expect, Puzzle
from farmd.envs.shell.words import (
    PRODUCTS,
    REGIONS,
    quoted,
    sentence,
    text_lines,
)

_COLUMNS = ("id", "date", "region", "product", "amount", "qty")


def _csv_file(rng: random.Random, rows: list[dict[str, str]], d: int) -> bytes:
    columns = list(_COLUMNS)
    if d >= 3:
        rng.shuffle(columns)

    def pad(v: str) -> str:
        return f"{' ' * rng.randint(0, 2)}{v}{' ' * rng.randint(0, 2)}" if d >= 5 else v

    lines = [",".join(pad(c) for c in columns)] + [",".join(pad(r[c]) for c in columns) for r in rows]
    if d >= 4:
        for _ in range(rng.randint(1, 3)):
            lines.insert(rng.randint(0, len(lines)), rng.choice(("", f"# {sentence(rng, 2, 5)}")))
    return text_lines(lines)


def make(rng: random.Random, d: int) -> Puzzle:
    n_files, n_rows = [(1, 10), (1, 20), (1, 30), (3, 15), (4, 15)][d - 1]
    region = rng.choice(REGIONS) if d >= 2 else ""
    product = rng.choice(PRODUCTS) if d >= 5 else ""
    cents = d >= 3
    while True:
        files: dict[str, bytes] = {}
        every = Decimal(0)
        total = Decimal(0)
        matched = 0
        row_id = 1
        names = [f"sales/{n}.csv" for n in (["data"] if n_files == 1 else ["q1", "q2", "q3", "q4"][:n_files])]
        for name in names:
            rows = []
            for _ in range(n_rows):
                amount = Decimal(rng.randint(100, 50000)) / 100 if cents else Decimal(rng.randint(1, 500))
                if d >= 5 and rng.random() < 0.2:
                    amount = -amount  # a refund
                row = {"id": str(row_id), "date": f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
                       "region": rng.choice(REGIONS), "product": rng.choice(PRODUCTS),
                       "amount": f"{amount:.2f}" if cents else str(amount), "qty": str(rng.randint(1, 20))}
                rows.append(row)
                row_id += 1
                every += amount
                if (not region or row["region"] == region) and (not product or row["product"] == product):
                    total += amount
                    matched += 1
            files[name] = _csv_file(rng, rows, d)
        if matched >= 2 and total != 0 and (not region or total != every):
            break
    if d >= 5:
        files["sales/notes.txt"] = text_lines([f"target for {region}: {rng.randint(1000, 9999)}", sentence(rng)])
    where = "the rows"
    if region:
        where += f" whose `region` is exactly `{region}`"
    if product:
        where += f" and whose `product` is exactly `{product}`"
    rules = ["Every `.csv` file under `sales/` starts with a header line naming its columns, then has one row "
             "per line (no quoted fields)."]
    if d >= 3:
        rules.append("Columns may come in any order" + (", and each file has its own." if d >= 4 else "."))
    if d >= 4:
        rules.append("Lines that are blank or start with `#` are neither header nor rows.")
    if d >= 5:
        rules.append("Fields may have spaces around them; amounts may be negative.")
    goal = " ".join(rules) + f" Write the sum of the `amount` column over {where}, in every such file, to `total.txt`."
    fmt = f"{total:.2f}" if cents else str(total)
    code = (
        "import csv, decimal, glob, sys\n"
        "region, product = sys.argv[1:]\n"
        "t = decimal.Decimal(0)\n"
        "for p in sorted(glob.glob(\"sales/**/*.csv\", recursive=True)):\n"
        "    lines = [l for l in open(p) if l.strip() and not l.lstrip().startswith(\"#\")]\n"
        "    rows = csv.reader(lines)\n"
        "    head = [c.strip() for c in next(rows)]\n"
        "    for row in rows:\n"
        "        r = dict(zip(head, (c.strip() for c in row)))\n"
        "        if region in (\"\", r[\"region\"]) and product in (\"\", r[\"product\"]):\n"
        "            t += decimal.Decimal(r[\"amount\"])\n"
        "print(t)\n"
    )
    return Puzzle(
        family="csv-sum", goal=goal, finish="files", files=MappingProxyType(files),
        actions=(f"python3 -c {quoted(code)} {quoted(region)} {quoted(product)} > total.txt",),
        expected=MappingProxyType({"total.txt": Expect("number", f"{fmt}\n".encode())}),
        answer_format=("Finish by leaving `total.txt` holding the number alone (decimal notation, e.g. `12.5` or "
                       "`12.50`; no thousands separators). The final file state is checked; the final answer "
                       "text is ignored."),
    )
