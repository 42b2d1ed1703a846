"""Word lists and the text helpers every puzzle family builds its files from.

Their order and contents are part of every task: changing either changes the tasks of every seed."""

from __future__ import annotations

import random
import re
import shlex

WHOLE_WORD = "as a whole word: not preceded or followed by a letter, digit or underscore"


_WORD_LIST = """
able acid aged also area army away baby back ball band bank base bath bear beat bell belt best bird blow blue
boat body bone book boot born boss both bowl burn bush busy cake call calm came camp card care case cash cast
cell chat chip city club coal coat code cold come cook cool cope copy core cost crew crop dark date dawn deal
dear debt deep desk dial diet disk dock door dose down draw drop dual dust duty each earn ease east easy edge
else even ever face fact fair fall farm fast fate fear feed feel file fill film find fine fire firm fish five
flat flow food foot form fort four free fuel full fund gain game gate gave gear gift girl give glad goal gold
golf gone good gray grew grow gulf hair half hall hand hang hard head hear heat held help here hero hide high
hill hire hold hole home hope host hour huge hung hunt idea inch into iron item jump jury just keen keep kept
kick kind king knee knew know lack lady laid lake land lane last late lead left less life lift like line link
list live load loan lock long look lord lose loss lost love luck made mail main make male many mark mass meal
mean meat meet menu mild milk mill mind mine miss mode mood moon more most move much must name navy near neck
need news next nice nine none nose note once only open oral over pace pack page paid pain pair palm park part
pass past path peak pick pink pipe plan play plot plug plus poll pool poor port post pull pure push race rail
rain rank rare rate read real rear rely rent rest rice rich ride ring rise risk road rock role roll roof room
root rose rule rush safe said sake sale salt same sand save seat seed seek seem seen self sell send sent ship
shop shot show shut sick side sign site size skin slip slow snow soft soil sold sole some song soon sort soul
spot star stay step stop such suit sure take tale talk tall tank tape task team tell tend term test text than
that them then they thin this thus tide till time tiny told tone took tool tour town tree trip true tune turn
twin type unit upon used user vary vast very view vote wage wait wake walk wall want ward warm wash wave ways
weak wear week well went were west what when wide wife wild will wind wine wing wire wise wish with wood word
wore work yard year your zero zone account answer branch bridge button camera castle center chance change
charge cheese choice circle client coffee column corner county credit damage dinner doctor dollar driver
energy engine escape estate family father figure finger flight flower forest friend future garden ground
growth health height island kitchen leader letter listen market master matter member memory method middle
minute mirror moment monkey mother motion number object office orange palace parent people period person
planet player pocket poetry police potato random reason record region report result river rubber safety
salary school screen season second secret sector signal silver simple single sister source spirit spring
square status stone street stress string summer supply survey switch system table tennis theory ticket
timber tongue travel trophy turkey valley vendor victim violin vision volume wallet window winner winter
wonder worker writer yellow
"""
WORDS = tuple(_WORD_LIST.split())
DIRS = ("notes", "misc", "old", "archive", "reports", "drafts", "team", "alpha", "beta", "work", "docs",
         "shared", "ops", "lab", "q1", "q2", "2023", "2024", "spare", "inbox2")
USERS = ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy", "mallory", "niaj",
          "olivia", "peggy", "rupert", "sybil", "trent", "victor", "walter")
SERVICES = ("auth", "payments", "search", "billing", "mailer", "api")
REGIONS = ("north", "south", "east", "west", "northwest", "southeast")
PRODUCTS = ("apples", "pears", "plums", "figs", "kiwis")
_ALNUM = "abcdefghijklmnopqrstuvwxyz0123456789"


def quoted(text: str) -> str:
    return shlex.quote(text)


def text_lines(lines: list[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode()


def sentence(rng: random.Random, lo: int = 4, hi: int = 9) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def insert_word(rng: random.Random, line: str, word: str) -> str:
    words = line.split(" ")
    words.insert(rng.randint(0, len(words)), word)
    return " ".join(words)


def whole_word(word: str) -> re.Pattern[str]:
    """What ``grep -w`` matches: ``word`` with no word character (letter, digit, underscore) either side."""
    return re.compile(rf"(?<![A-Za-z0-9_]){re.escape(word)}(?![A-Za-z0-9_])")


def layout(rng: random.Random, root: str, n_files: int, depth: int, exts: tuple[str, ...],
            hidden: bool = False, names: tuple[str, ...] = WORDS, unique_names: bool = False) -> list[str]:
    """``n_files`` distinct file paths under ``root``, in directories nested up to ``depth`` levels
    (with ``unique_names``, no two files share a name)."""
    dirs = [root]
    for _ in range(0 if depth <= 1 else max(1, n_files // 3)):
        parent = rng.choice([d for d in dirs if d.count("/") - root.count("/") < depth - 1])
        name = rng.choice(DIRS) + (f"-{rng.randint(1, 9)}" if rng.random() < 0.3 else "")
        if hidden and rng.random() < 0.2:
            name = "." + name
        if f"{parent}/{name}" not in dirs:
            dirs.append(f"{parent}/{name}")
    taken = set(dirs)
    files: list[str] = []
    while len(files) < n_files:
        name = rng.choice(names) + rng.choice(exts)
        if hidden and rng.random() < 0.1:
            name = "." + name
        path = f"{rng.choice(dirs)}/{name}"
        if path not in taken and not (unique_names and name in taken):
            taken.update((path, name))
            files.append(path)
    return files


def new_token(rng: random.Random) -> str:
    head = "".join(rng.choice("bcdfghjklmnpqrstvwxz") for _ in range(3))
    return f"{head}-{''.join(rng.choice(_ALNUM) for _ in range(5))}"


def one_off(rng: random.Random, token: str) -> str:
    """``token`` with one letter or digit changed."""
    spots = [i for i, c in enumerate(token) if c != "-"]
    i = rng.choice(spots)
    other = rng.choice([c for c in _ALNUM if c != token[i]])
    return token[:i] + other + token[i + 1:]
