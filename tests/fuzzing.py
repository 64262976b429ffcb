"""Mutated and hostile input files for the fuzz test (`tests/test_fuzz.py`) and `scripts/fuzz_problems.py`.

A case is the shipped file it came from, the bytes written, the command run on them and its --time-limit.
Every command that reads a file is fuzzed (evaluate, solve, check, whatif, procure, fleet, study, validate),
and every reader: problems, runs, procure, fleet and study files, and through a small problem's solve a
Hugging Face `config.json` and a library system or LLM file (found through $PARAPLAN_LIBRARY). Study and
fleet files are shrunk first (two points per axis, one or two jobs) to bound their work.

Mutations of the parsed YAML or JSON (a leaf or a subtree replaced by a hostile value, a key deleted or
added, a number scaled to the edge of its type) and of the raw text (binary bytes, invalid UTF-8,
truncation, hostile tags, alias bombs, recursive aliases, deep nesting, huge numbers). `run_case` runs the
CLI in-process under an alarm and classifies the outcome: ok (exit 0, 2, 3 or 4, and every error line
naming file:line), traceback, hang, an error without a line, or exit 3 (proven: nothing fits) after the
--time-limit passed where the same case without the limit finds a plan (`exit3_timed`).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import random
import re
import shlex
import shutil
import signal
import tempfile
import time
import traceback
from dataclasses import dataclass, field
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


# hostile JSON for a Hugging Face config.json (`optimizer.io.hf_config`)
RAW_JSON = [
    "[" * 100000 + "]" * 100000,
    '{"model_type": "llama", "hidden_size": ' + "9" * 5000 + "}",
    '{"model_type": "llama", "hidden_size": NaN, "num_hidden_layers": Infinity}',
    '{"model_type": "llama", "model_type": "gpt_neox"}',
    '{"model_type": "llama", "hidden_size": 1e400}',
    '{"model_type": "' + "x" * 300 + '"}',
    '{"model_type": "llama"}',
    '{"model_type": ["llama"]}',
    "[]",
    "null",
    '"llama"',
    "",
    "{",
    "\ufeff{}",
]

TIME_LIMITS = (0.01, 0.5, 5, None)  # --time-limit S of a case (None: the default, 60 s)
TIMED = ("solve", "procure", "fleet", "whatif")  # the commands that take --time-limit
LIBRARY = {"systems": "system", "llms": "llm"}  # library files fuzzed, through $PARAPLAN_LIBRARY
PLAIN = {"validate": "runs", "procure": "procure", "fleet": "fleet", "study": "study"}
SIDE = ("hf", "facts", *LIBRARY.values())  # readers reached through another file: a line of their own
CALIBRATION = ROOT.parent / "shared" / "calibration"  # the runs files whose facts problems/runs/facts holds


@dataclass
class Case:
    source: str  # the shipped file mutated
    command: str  # evaluate | solve | check | whatif | procure | fleet | study | validate
    data: bytes
    what: str  # the mutation, in words
    reader: str = (
        "problem"  # the file read: problem | runs | facts | procure | fleet | study | hf | system | llm
    )
    time_limit: float | None = None  # --time-limit S, where the command takes it
    files: dict = field(default_factory=dict)  # other files written beside it (name -> bytes)

    @property
    def label(self) -> str:
        return label_of(self.command, self.reader)

    @property
    def name(self) -> str:
        """Where the mutated bytes are written, in the case's folder."""
        if self.reader == "hf":
            return "config.json"
        if self.reader == "facts":
            return "facts/case.yaml"  # the sidecar facts of case.yaml (`optimizer.io.runs.facts_file`)
        if self.reader in LIBRARY.values():
            return f"lib/{self.reader}s/fuzz-{Path(self.source).stem}.yaml"
        return "case.yaml"

    def write(self, d: Path, time_limit: bool = True) -> tuple[list[str], dict[str, str]]:
        """Write the case's files in folder `d`; the CLI's arguments and the environment it runs in."""
        for name, data in [(self.name, self.data), *self.files.items()]:
            (d / name).parent.mkdir(parents=True, exist_ok=True)
            (d / name).write_bytes(data)
        args = [self.command, str(d / "case.yaml")]
        if self.command == "study":
            args += ["-o", str(d / "out.csv"), "--workers", "1"]
        if self.command == "whatif":
            args += ["--top", "2"]
        if self.time_limit is not None and time_limit:
            args += ["--time-limit", f"{self.time_limit:g}"]
        env = {"PARAPLAN_LIBRARY": str(d / "lib")} if self.reader in LIBRARY.values() else {}
        return args, env


def reader_of(path: Path, command: str) -> str:
    if path.name == "config.json":
        return "hf"
    if path.parent.name in LIBRARY:
        return LIBRARY[path.parent.name]
    if path.parent.name == "facts":
        return "facts"
    return PLAIN.get(command, "problem")


def label_of(command: str, reader: str) -> str:
    """A case's line in the counts: the command, and the reader where it is not the command's own file."""
    return f"{command}:{reader}" if reader in SIDE else command


def seeds() -> list[tuple[Path, str]]:
    """Shipped input files and the commands that read each: every problem through evaluate, solve, check and
    whatif; the library's systems and LLMs and the Hugging Face configs through a small problem's solve; the
    runs files' sidecar facts through validate of their runs file (where ../shared/calibration holds it)."""
    out = []
    for p in sorted((ROOT / "problems").rglob("*.yaml")):
        rel = p.relative_to(ROOT / "problems").parts
        if rel[0] in LIBRARY:
            out.append((p, "solve"))
            continue
        if rel[0] == "catalogs":
            continue  # reached through the procure and fleet files that name them
        if rel[:2] == ("runs", "facts"):
            out += [(p, "validate")] if (CALIBRATION / p.name).is_file() else []
            continue
        data = yaml.safe_load(p.read_text())
        if isinstance(data, list):
            out.append((p, "validate"))
        elif not isinstance(data, dict):
            continue
        elif "procure" in data or "sites" in data:
            out.append((p, "procure"))
        elif "fleet" in data:
            out.append((p, "fleet"))
        elif "axes" in data:
            out.append((p, "study"))
        else:
            out += [(p, c) for c in ("solve", "check", "evaluate", "whatif")]
    out += [(p, "solve") for p in sorted((ROOT / "problems" / "hf").glob("*/config.json"))]
    return out


def by_label(base: list[tuple[Path, str]]) -> dict[str, list[tuple[Path, str]]]:
    out: dict[str, list] = {}
    for path, command in base:
        out.setdefault(label_of(command, reader_of(path, command)), []).append((path, command))
    return dict(sorted(out.items()))


def draw(rng: random.Random, base: list[tuple[Path, str]]) -> tuple[Path, str]:
    """A seed: a command (with its reader) drawn uniformly, then one of its files, so that the single fleet
    file is drawn as often as the dozens of problems."""
    groups = by_label(base)
    return rng.choice(groups[rng.choice(sorted(groups))])


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


def _get(node, path):
    for k in path:
        node = node[k]
    return node


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _delete(node, path):
    for k in path[:-1]:
        node = node[k]
    del node[path[-1]]


class _Dumper(yaml.SafeDumper):
    pass


def _dump(data, fmt: str = "yaml") -> str:
    try:
        if fmt == "json":
            return json.dumps(data, indent=1, ensure_ascii=False)
        return yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1000)
    except (yaml.YAMLError, ValueError, OverflowError, TypeError):
        return repr(data)


def _shrink_study(data, path: Path, rng: random.Random) -> str:
    """At most two points per axis, a relative `base:` made absolute, a short time limit per point."""
    if not isinstance(data, dict):
        return ""
    if isinstance(data.get("base"), str):
        data["base"] = str((path.parent / data["base"]).resolve())
    for k, v in (data.get("axes") or {}).items():
        if isinstance(v, list):
            data["axes"][k] = v[:2]
        elif isinstance(v, dict) and isinstance(v.get("from"), int):
            v["to"] = v["from"] + v.get("step", 1)
    data["time_limit_s"] = rng.choice((0.01, 0.5, 5))
    return f"time_limit_s {data['time_limit_s']}"


def _shrink_fleet(data, path: Path, rng: random.Random) -> str:
    """One or two jobs, one node type, two sizes."""
    if not isinstance(data, dict):
        return ""
    data["jobs"] = data.get("jobs", [])[: rng.choice((1, 2))]
    data["types"] = data.get("types", [])[:1]
    if isinstance(data.get("fleet"), dict):
        data["fleet"]["sizes_nodes"] = data["fleet"].get("sizes_nodes", [])[:2]
    return f"{len(data['jobs'])} job(s)"


SHRINK = {"study": _shrink_study, "fleet": _shrink_fleet}


def _problem_for(case: Case, source: dict, rng: random.Random) -> bytes:
    """The small problem that reads a fuzzed Hugging Face config or library file; the runs file of facts."""
    if case.reader == "facts":
        return (CALIBRATION / Path(case.source).name).read_bytes()
    if case.reader == "hf":
        llm = rng.choice(["config.json", "{base: config.json, layers: 4}"])
        seq = rng.choice(["", "  seq_len: 4096\n", "  seq_len: 4096\n"])
        return (
            f"llm: {llm}\nsystem: h100-sxm-80gb\nnum_gpus: {rng.choice((8, 64))}\n"
            f"training:\n  global_batch: 64\n  precision: bf16\n{seq}"
        ).encode()
    name = Path(case.name).stem
    if case.reader == "llm":
        return f"llm: {name}\nsystem: h100-sxm-80gb\nnum_gpus: 64\ntraining: {{global_batch: 64}}\n".encode()
    per_node = source.get("gpus_per_node") if isinstance(source, dict) else None
    n = 2 * per_node if isinstance(per_node, int) and 0 < per_node <= 128 else 16
    system = rng.choice([name, f"{{base: {name}, reserved_gib: 2}}"])
    return f"llm: llama3.1-8b\nsystem: {system}\nnum_gpus: {n}\ntraining: {{global_batch: 64}}\n".encode()


def _mutate_raw(rng: random.Random, text: str, fmt: str) -> tuple[bytes, str]:
    """The text made hostile: a hostile document, one appended, random bytes, truncation, a binary tail,
    UTF-16."""
    raw = RAW_JSON if fmt == "json" else RAW
    kind = rng.randrange(6)
    if kind == 0:
        snippet = rng.choice(raw)
        return snippet.encode(), f"hostile {fmt}: {snippet[:40]!r}"
    if kind == 1:
        snippet = rng.choice(raw)
        cut = rng.randrange(len(text) + 1)
        return (text[:cut] + "\n" + snippet).encode(), f"hostile {fmt} appended at {cut}"
    if kind == 2:
        b = bytearray(text.encode())
        for _ in range(rng.randrange(1, 8)):
            b.insert(rng.randrange(len(b) + 1), rng.randrange(256))
        return bytes(b), "random bytes inserted"
    if kind == 3:
        return text.encode()[: rng.randrange(len(text) + 1)], "truncated"
    if kind == 4:
        return text.encode() + b"\n\xff\xfe\x00binary", "binary tail"
    return text.encode("utf-16"), "UTF-16 encoded"


def _mutate_once(rng: random.Random, data, p: tuple, gentle: bool = False) -> str | None:
    """One change at path `p`: a hostile value, a deletion, an unknown key beside it, a number scaled (only
    that where `gentle`)."""
    op = 1.0 if gentle else rng.random()
    where = ".".join(map(str, p))
    if op < 0.6:
        v = copy.deepcopy(rng.choice(HOSTILE))
        _set(data, p, v)
        return f"{where} = {str(v)[:30]!r}"
    if op < 0.75:
        _delete(data, p)
        return f"del {where}"
    node = data
    for k in p[:-1]:
        node = node[k]
    if op < 0.9:
        if isinstance(node, dict):
            node[rng.choice(["typo_key", "tpp", "hbm_gb", "precison", "x"])] = copy.deepcopy(
                rng.choice(HOSTILE)
            )
            return f"unknown key under {'.'.join(map(str, p[:-1])) or 'top'}"
        return None
    cur = node[p[-1]]
    if _is_number(cur):
        v = rng.choice([cur * 10 ** rng.randrange(1, 12), -cur, cur + 1, 0, cur / 3])
        node[p[-1]] = v
        return f"{where} scaled to {v}"
    return None


def _mutate_tree(rng: random.Random, data) -> str:
    """One to three changes; one case in ten none and one in six only scaled numbers, so that it often stays
    a valid problem and reaches the solver (and its time limit)."""
    what = []
    r = rng.random()
    if r < 0.1:
        return "unchanged"
    gentle = r < 0.27
    for _ in range(rng.randrange(1, 4)):
        paths = [p for p in _paths(data) if p]
        if gentle:
            paths = [p for p in paths if _is_number(_get(data, p))]
        if not paths:
            break
        try:
            w = _mutate_once(rng, data, rng.choice(paths), gentle)
        except (KeyError, IndexError, TypeError):
            continue
        if w:
            what.append(w)
    return "; ".join(what) or "unchanged"


def mutate(rng: random.Random, path: Path, command: str) -> Case:
    """A case from a shipped file: shrunk where its command is slow (study, fleet), then its text made
    hostile (a quarter of the cases) or its parsed tree changed in one to three places."""
    reader = reader_of(path, command)
    fmt = "json" if reader == "hf" else "yaml"
    text = path.read_text()
    rel = str(path.relative_to(ROOT))
    notes = []
    source = json.loads(text) if fmt == "json" else yaml.safe_load(text)
    if reader in SHRINK:
        notes.append(SHRINK[reader](source, path, rng))
        text = _dump(source)
    case = Case(rel, command, b"", "", reader, rng.choice(TIME_LIMITS) if command in TIMED else None)
    if reader in SIDE:
        case.files["case.yaml"] = _problem_for(case, source, rng)
    if rng.random() < 0.25:
        case.data, what = _mutate_raw(rng, text, fmt)
    else:
        data = json.loads(text) if fmt == "json" else yaml.safe_load(text)
        what = _mutate_tree(rng, data)
        case.data = _dump(data, fmt).encode("utf-8", "surrogatepass")
    case.what = "; ".join([*filter(None, notes), what])
    return case


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang()


LINE_RE = re.compile(r"^error: (--[\w-]+|[^\s:][^:]*?:\d+): ")
DEFECTS = ("traceback", "hang", "no_line", "exit3_timed")


@dataclass
class Outcome:
    kind: str  # ok | traceback | hang | no_line | exit3_timed
    rc: int | None
    detail: str
    seconds: float = 0.0
    note: str = ""  # on an ok case: "slow proof" where exit 3 came after the time limit and holds without it


@contextlib.contextmanager
def _environ(env: dict[str, str]):
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _run(args: list[str], env: dict[str, str], limit_s: int) -> Outcome:
    """The CLI in-process on `args` under an alarm of `limit_s` seconds, classified."""
    from optimizer.cli import main

    err, out = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(limit_s)
    t0 = time.perf_counter()
    try:
        with _environ(env), contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            rc = main(args)
    except Hang:
        return Outcome("hang", None, f"over {limit_s} s", time.perf_counter() - t0)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 2
    except BaseException:  # noqa: BLE001 - the point: anything escaping main is a traceback
        return Outcome("traceback", None, traceback.format_exc(limit=-3), time.perf_counter() - t0)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    s = time.perf_counter() - t0
    text = err.getvalue()
    if "Traceback" in text:
        return Outcome("traceback", rc, text[-2000:], s)
    if rc not in (0, 2, 3, 4):
        return Outcome("traceback", rc, f"exit {rc}: {text[-500:]}", s)
    if rc == 2:
        bad = [line for line in text.splitlines() if line.startswith("error: ") and not LINE_RE.match(line)]
        if bad:
            return Outcome("no_line", rc, bad[0][:300], s)
    return Outcome("ok", rc, "", s)


def run_case(case: Case, folder: Path, limit_s: int = 60) -> Outcome:
    """Run the CLI on the case in a fresh folder under `folder`, under an alarm of `limit_s` seconds. Exit 3
    (proven: nothing fits) after the case's --time-limit passed is run again without the limit: a plan
    found then makes it a defect (`exit3_timed`: a run that gave up must exit 4); exit 3 again, a slow
    proof (ok, noted)."""
    d = Path(tempfile.mkdtemp(dir=folder))
    try:
        out = _run(*case.write(d), limit_s)
        if out.kind == "ok" and out.rc == 3 and case.time_limit is not None and out.seconds > case.time_limit:
            again = _run(*case.write(d, time_limit=False), limit_s)
            if again.kind == "ok" and again.rc == 3:
                out.note = "slow proof"
            else:
                out = Outcome(
                    "exit3_timed",
                    3,
                    f"exit 3 after {out.seconds:.2f} s under --time-limit {case.time_limit:g}; without the "
                    f"limit: {again.kind}, exit {again.rc}",
                    out.seconds,
                )
        return out
    finally:
        shutil.rmtree(d, ignore_errors=True)


def reproduce(case: Case, d: Path) -> str:
    """Write the case's files in folder `d` (kept); the shell command that reruns it."""
    d.mkdir(parents=True, exist_ok=True)
    args, env = case.write(d)
    pre = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    return (pre + " " if pre else "") + "paraplan " + " ".join(shlex.quote(a) for a in args)
