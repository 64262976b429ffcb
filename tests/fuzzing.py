"""Mutated and hostile input files for the fuzz test (`tests/test_fuzz.py`) and `scripts/fuzz_problems.py`.

A case is the shipped file it came from, the bytes written and the command run on them. Mutations of the
parsed YAML (a leaf or a subtree replaced by a hostile value, a key deleted or added, a number scaled to
the edge of its type) and of the raw text (binary bytes, invalid UTF-8, truncation, hostile tags, alias
bombs, recursive aliases, deep nesting, huge numbers). `run_case` runs the CLI in-process under an alarm
and classifies the outcome: ok (exit 0, 2, 3 or 4, and every error line naming file:line), traceback,
hang, or an error without a line.
"""

from __future__ import annotations

import contextlib
import copy
import io
import random
import re
import signal
import traceback
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]

HOSTILE = [
    0,
    -1,
    1,
    2**24 + 1,
    2**31,
    2**63,
    10**40,
    -(10**40),
    1.5,
    -0.0,
    1e308,
    -1e308,
    1e-300,
    float("inf"),
    float("-inf"),
    float("nan"),
    "8",
    "",
    "x" * 5000,
    "é∂ƒ",
    "../../etc/passwd",
    "/dev/zero",
    "a\u0000b",
    None,
    True,
    False,
    [],
    {},
    [1, 2, 3],
    {"a": 1},
    [[[]]],
    {"base": "nope"},
    "h100-sxm-80gb",
    "gpt3-175b",
    "bf16",
    "fp64",
    "selective",
    7,
    3,
    1000000,
    1e9,
    0.5,
]

RAW = [
    "!!python/object/apply:os.system ['echo pwned']\n",
    "x: !!python/name:os.system\n",
    "x: !custom {a: 1}\n",
    "a: &a ['lol', 'lol', 'lol', 'lol', 'lol', 'lol', 'lol', 'lol', 'lol']\n"
    "b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
    "d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\ne: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\n"
    "f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]\ng: [*f, *f, *f, *f, *f, *f, *f, *f, *f]\n",
    "a: &x [*x]\n",
    "x: " + "[" * 2000 + "]" * 2000 + "\n",
    "num_gpus: " + "9" * 10000 + "\n",
    "num_gpus: 0x" + "f" * 40 + "\n",
    "? [a, b]\n: 1\n",
    "a: 1\na: 2\n",
    "--- 1\n--- 2\n",
    "{",
    "",
    "\t\t- :\n",
]


@dataclass
class Case:
    source: str  # the shipped file mutated
    command: str  # evaluate | solve | check | procure | validate
    data: bytes
    what: str  # the mutation, in words


def seeds() -> list[tuple[Path, str]]:
    """Shipped input files and the command that reads each."""
    out = []
    for p in sorted((ROOT / "problems").rglob("*.yaml")):
        rel = p.relative_to(ROOT / "problems").parts
        if rel[0] in ("llms", "systems", "catalogs"):
            continue  # library parts: reached through the problems that name them
        text = p.read_text()
        data = yaml.safe_load(text)
        if isinstance(data, list):
            out.append((p, "validate"))
        elif isinstance(data, dict) and "procure" in data:
            out.append((p, "procure"))
        elif isinstance(data, dict):
            out.append((p, "solve"))
    return out


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


def _set(node, path, value):
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value


def _delete(node, path):
    for k in path[:-1]:
        node = node[k]
    del node[path[-1]]


class _Dumper(yaml.SafeDumper):
    pass


def _dump(data) -> str:
    try:
        return yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1000)
    except (yaml.YAMLError, ValueError, OverflowError):
        return repr(data)


def mutate(rng: random.Random, path: Path, command: str) -> Case:
    text = path.read_text()
    rel = str(path.relative_to(ROOT))
    r = rng.random()
    if r < 0.25:  # raw text
        kind = rng.randrange(6)
        if kind == 0:
            snippet = rng.choice(RAW)
            return Case(rel, command, snippet.encode(), f"hostile YAML: {snippet[:40]!r}")
        if kind == 1:
            snippet = rng.choice(RAW)
            cut = rng.randrange(len(text) + 1)
            return Case(
                rel, command, (text[:cut] + "\n" + snippet).encode(), f"hostile YAML appended at {cut}"
            )
        if kind == 2:
            b = bytearray(text.encode())
            for _ in range(rng.randrange(1, 8)):
                b.insert(rng.randrange(len(b) + 1), rng.randrange(256))
            return Case(rel, command, bytes(b), "random bytes inserted")
        if kind == 3:
            return Case(rel, command, text.encode()[: rng.randrange(len(text) + 1)], "truncated")
        if kind == 4:
            return Case(rel, command, text.encode() + b"\n\xff\xfe\x00binary", "binary tail")
        return Case(rel, command, text.encode("utf-16"), "UTF-16 encoded")
    data = yaml.safe_load(text)
    paths = [p for p in _paths(data) if p]
    if not paths:
        return Case(rel, command, text.encode(), "unchanged")
    n = rng.randrange(1, 4)
    what = []
    for _ in range(n):
        paths = [p for p in _paths(data) if p]
        if not paths:
            break
        p = rng.choice(paths)
        op = rng.random()
        try:
            if op < 0.6:
                v = copy.deepcopy(rng.choice(HOSTILE))
                _set(data, p, v)
                what.append(f"{'.'.join(map(str, p))} = {str(v)[:30]!r}")
            elif op < 0.75:
                _delete(data, p)
                what.append(f"del {'.'.join(map(str, p))}")
            elif op < 0.9:
                parent = p[:-1]
                node = data
                for k in parent:
                    node = node[k]
                if isinstance(node, dict):
                    node[rng.choice(["typo_key", "tpp", "hbm_gb", "precison", "x"])] = copy.deepcopy(
                        rng.choice(HOSTILE)
                    )
                    what.append(f"unknown key under {'.'.join(map(str, parent)) or 'top'}")
            else:
                node = data
                for k in p[:-1]:
                    node = node[k]
                cur = node[p[-1]]
                if isinstance(cur, (int, float)) and not isinstance(cur, bool):
                    v = rng.choice([cur * 10 ** rng.randrange(1, 12), -cur, cur + 1, 0, cur / 3])
                    node[p[-1]] = v
                    what.append(f"{'.'.join(map(str, p))} scaled to {v}")
        except (KeyError, IndexError, TypeError):
            continue
    return Case(rel, command, _dump(data).encode("utf-8", "surrogatepass"), "; ".join(what) or "unchanged")


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang()


LINE_RE = re.compile(r"^error: (--[\w-]+|[^\s:][^:]*?:\d+): ")


@dataclass
class Outcome:
    kind: str  # ok | traceback | hang | no_line
    rc: int | None
    detail: str


def run_case(case: Case, folder: Path, limit_s: int = 60) -> Outcome:
    """Run the CLI on the case's bytes in-process, under an alarm of `limit_s` seconds."""
    from optimizer.cli import main

    path = folder / "case.yaml"
    path.write_bytes(case.data)
    args = [case.command, str(path)]
    if case.command in ("solve", "procure"):
        args += ["--time-limit", "20"]
    err, out = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(limit_s)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            rc = main(args)
    except Hang:
        return Outcome("hang", None, f"over {limit_s} s")
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 2
    except BaseException:  # noqa: BLE001 - the point: anything escaping main is a traceback
        return Outcome("traceback", None, traceback.format_exc(limit=-3))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    text = err.getvalue()
    if "Traceback" in text:
        return Outcome("traceback", rc, text[-2000:])
    if rc not in (0, 2, 3, 4):
        return Outcome("traceback", rc, f"exit {rc}: {text[-500:]}")
    if rc == 2:
        bad = [line for line in text.splitlines() if line.startswith("error: ") and not LINE_RE.match(line)]
        if bad:
            return Outcome("no_line", rc, bad[0][:300])
    return Outcome("ok", rc, "")
