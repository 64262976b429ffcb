"""Stage 1, load: YAML problem files -> typed `Problem`, with file:line:field errors.

A problem references reusable parts by name (``llm: gpt3-175b`` reads ``llms/gpt3-175b.yaml`` from the
library) or inlines them; ``system: {base: h100-sxm-80gb, hbm_gib: 120}`` reads the named file and
applies the overrides. Every value keeps the file and line it came from, so a validation error names
both: ``problems/x.yaml:14: system.hbm_gib: must be > 0``.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from optimizer.errors import ProblemError, ProblemErrors

Loc = tuple[str | int, ...]

LIBRARY_ENV = "PARAPLAN_LIBRARY"
KINDS = {"llm": "llms", "system": "systems", "catalog": "catalogs"}


@dataclass
class Sourced:
    """Plain YAML data plus, for every key path, the (file, line) it was read from."""

    data: Any
    where: dict[Loc, tuple[str, int]] = field(default_factory=dict)
    file: str = "<input>"

    def locate(self, loc: Loc) -> tuple[str, int | None]:
        """File and line of the longest prefix of `loc` that has a recorded position."""
        for n in range(len(loc), -1, -1):
            hit = self.where.get(tuple(loc[:n]))
            if hit:
                return hit
        return self.file, None

    def graft(self, prefix: Loc, other: Sourced) -> None:
        """Record `other`'s positions under `prefix` (it was read from another file)."""
        for k in [k for k in self.where if k[: len(prefix)] == prefix and len(k) > len(prefix)]:
            del self.where[k]
        for k, v in other.where.items():
            self.where[prefix + k] = v


def _display(path: Path) -> str:
    """The path as the user would write it: relative to the working directory when inside it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return str(path)
    return str(path) if rel.startswith("..") else rel


MAX_FILE_BYTES = 4 * 2**20  # a problem, catalog or run file is kilobytes; more is not one
MAX_DEPTH = 32  # nesting of mappings and lists
MAX_VALUES = 200_000  # keys, items and scalars after alias expansion (an alias bomb expands to billions)
_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("map", "seq", "str", "int", "float", "bool", "null", "timestamp")}


def read_regular(p: Path, limit_bytes: int) -> bytes:
    """At most `limit_bytes` + 1 bytes of the regular file `p` (a byte over the limit says it is larger).
    A FIFO, device or directory is refused before anything is read: /dev/zero never ends and a FIFO with no
    writer blocks the open; opening without blocking and checking the opened file leaves no window between
    the check and the read. Raises OSError, or ValueError naming what `p` is."""
    fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = st.st_mode
            what = "a directory" if stat.S_ISDIR(kind) else "a FIFO" if stat.S_ISFIFO(kind) else "a device"
            raise ValueError(f"not a regular file ({what})")
        return f.read(limit_bytes + 1)


def read_yaml(path: str | os.PathLike) -> Sourced:
    """Parse one YAML file, keeping the line of every key and list item. Any bytes get a one-line error:
    too large, binary, not UTF-8, too deep, too many values, an unsupported tag."""
    try:
        p = Path(path)
        name = _display(p)
    except (TypeError, ValueError) as e:
        raise ProblemError(str(path)[:200], None, None, f"not a file name: {e}") from None
    try:
        raw = read_regular(p, MAX_FILE_BYTES)
    except FileNotFoundError:
        raise ProblemError(name, None, None, "no such file") from None
    except (OSError, ValueError) as e:
        raise ProblemError(name, None, None, f"cannot read: {getattr(e, 'strerror', None) or e}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ProblemError(name, None, None, f"file too large (at most {MAX_FILE_BYTES // 2**20} MiB)")
    if b"\0" in raw:
        raise ProblemError(
            name, raw[: raw.index(b"\0")].count(b"\n") + 1, None, "binary file (NUL byte), not YAML"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ProblemError(
            name,
            raw[: e.start].count(b"\n") + 1,
            None,
            f"not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})",
        ) from None
    return parse_yaml(text, name)


# libyaml's parser where PyYAML has it (its wheels do): the same events and nodes, with their lines, about
# 10x faster than the pure-Python one
_PARSER = yaml.CSafeLoader if getattr(yaml, "__with_libyaml__", False) else yaml.SafeLoader


def _check_depth(text: str, name: str) -> None:
    """Nesting depth from the parser's events (no recursion, unlike composing), so a deeply nested file gets
    a line, not a RecursionError."""
    depth = 0
    try:
        for ev in yaml.parse(text, Loader=_PARSER):
            if isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_DEPTH:
                    raise ProblemError(
                        name, ev.start_mark.line + 1, None, f"nested too deeply (at most {MAX_DEPTH} levels)"
                    )
            elif isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
    except yaml.MarkedYAMLError as e:
        if "nesting depth" in str(e.problem):  # libyaml's own limit, met while it scans ahead
            mark = e.problem_mark or e.context_mark
            raise ProblemError(
                name, mark.line + 1 if mark else None, None, f"nested too deeply (at most {MAX_DEPTH} levels)"
            ) from None
        return  # composing reports syntax errors with their line


def _construct(constructor: yaml.SafeLoader, n: yaml.Node, name: str, loc: Loc) -> Any:
    """The Python value of one node. An explicit tag on a value it does not fit (``!!bool maybe``,
    ``!!int x``, ``!!timestamp y``) makes PyYAML's constructors raise KeyError, ValueError or AttributeError;
    each is a one-line error at the node's line."""
    where = ".".join(map(str, loc)) or None
    line = n.start_mark.line + 1
    tag = "!!" + n.tag.rsplit(":", 1)[-1]
    if tag == "!!bool" and isinstance(n, yaml.ScalarNode) and n.value.lower() not in constructor.bool_values:
        raise ProblemError(name, line, where, f"invalid value: {n.value!r} is not a boolean")
    try:
        return constructor.construct_object(n, deep=True)
    except (yaml.YAMLError, ValueError, OverflowError) as e:
        raise ProblemError(name, line, where, f"invalid value: {str(e).splitlines()[0]}") from None
    except (KeyError, AttributeError, TypeError):
        raise ProblemError(
            name, line, where, f"invalid value: {str(n.value)[:40]!r} is not a {tag}"
        ) from None


def parse_yaml(text: str, name: str = "<input>") -> Sourced:
    try:
        yaml.reader.Reader(text)  # printable characters only
    except yaml.reader.ReaderError as e:
        raise ProblemError(
            name,
            text[: e.position].count("\n") + 1,
            None,
            f"character #x{e.character:04x} is not allowed in YAML",
        ) from None
    _check_depth(text, name)
    loader = _PARSER(text)
    try:
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else None
        raise ProblemError(name, line, None, f"YAML syntax: {e.problem or e}") from None
    except yaml.YAMLError as e:
        raise ProblemError(name, None, None, f"YAML: {e}") from None
    except RecursionError:
        raise ProblemError(name, None, None, f"nested too deeply (at most {MAX_DEPTH} levels)") from None
    finally:
        loader.dispose()
    where: dict[Loc, tuple[str, int]] = {}
    if node is None:
        return Sourced(None, where, name)
    where[()] = (name, node.start_mark.line + 1)
    constructor = yaml.SafeLoader("")
    count = [0]

    def fail(n: yaml.Node, loc: Loc, msg: str):
        raise ProblemError(name, n.start_mark.line + 1, ".".join(map(str, loc)) or None, msg)

    def walk(n: yaml.Node, loc: Loc, path: tuple = ()) -> Any:
        count[0] += 1
        if count[0] > MAX_VALUES:
            fail(n, loc, f"more than {MAX_VALUES:,} values (aliases expanding without bound?)")
        if len(loc) > MAX_DEPTH:
            fail(n, loc, f"nested too deeply (at most {MAX_DEPTH} levels)")
        if id(n) in path:
            fail(n, loc, "an alias refers to itself (recursive YAML)")
        if n.tag not in _TAGS:
            fail(n, loc, f"unsupported YAML tag '{n.tag}' (plain mappings, lists, strings and numbers only)")
        path = path + (id(n),)
        if isinstance(n, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for k, v in n.value:
                if not isinstance(k, yaml.ScalarNode) or k.tag not in _TAGS:
                    fail(k, loc, "keys must be plain strings")
                key = _construct(constructor, k, name, loc)
                if not isinstance(key, (str, int)):
                    raise ProblemError(
                        name, k.start_mark.line + 1, ".".join(map(str, loc)) or None, "keys must be strings"
                    )
                if key in out:
                    raise ProblemError(
                        name, k.start_mark.line + 1, ".".join(map(str, loc + (key,))), "duplicate key"
                    )
                where[loc + (key,)] = (name, k.start_mark.line + 1)
                out[key] = walk(v, loc + (key,), path)
            return out
        if isinstance(n, yaml.SequenceNode):
            items = []
            for i, v in enumerate(n.value):
                where[loc + (i,)] = (name, v.start_mark.line + 1)
                items.append(walk(v, loc + (i,), path))
            return items
        if isinstance(n, yaml.ScalarNode) and n.tag.endswith((":int", ":float")) and len(n.value) > 64:
            fail(n, loc, f"number with {len(n.value)} characters (at most 64)")
        return _construct(constructor, n, name, loc)

    return Sourced(walk(node, ()), where, name)


# --------------------------------------------------------------------------------------------- library
def library_dirs(near: Path | None = None) -> list[Path]:
    """Directories searched for ``llms/``, ``systems/``, ``catalogs/`` (first hit wins).

    1. ``$PARAPLAN_LIBRARY`` (os.pathsep-separated);
    2. the referencing file's directory and its ancestors (a ``problems/`` tree, or one holding
       ``problems/``);
    3. ``./problems``; 4. the library installed with the package.
    """
    dirs: list[Path] = []
    env = os.environ.get(LIBRARY_ENV)
    if env:
        dirs += [Path(d) for d in env.split(os.pathsep) if d]
    if near is not None:
        for d in [near.resolve(), *near.resolve().parents]:
            dirs += [d, d / "problems"]
    dirs.append(Path.cwd() / "problems")
    dirs.append(Path(__file__).resolve().parent.parent / "problems")
    try:
        from importlib.util import find_spec

        spec = find_spec("paraplan_library")
        if spec is not None and spec.submodule_search_locations:
            dirs += [Path(p) for p in spec.submodule_search_locations]
    except (ImportError, ValueError):  # optional bundled copy
        pass
    return dirs


LIBRARY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")


def find_in_library(kind: str, name: str, near: Path | None = None) -> Path | None:
    """The library file of a name (None: none, or not a library name: letters, digits, '.', '_', '+', '-')."""
    if not isinstance(name, str) or not LIBRARY_NAME.match(name):
        return None
    sub = KINDS[kind]
    for d in library_dirs(near):
        cand = d / sub / f"{name}.yaml"
        try:
            if cand.is_file():
                return cand
        except (OSError, ValueError):
            continue
    return None


def available(kind: str, near: Path | None = None) -> list[str]:
    names: set[str] = set()
    for d in library_dirs(near):
        if (d / KINDS[kind]).is_dir():
            names |= {p.stem for p in (d / KINDS[kind]).glob("*.yaml")}
    return sorted(names)


def _deep_merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = _deep_merge(base.get(k), v) if k in base else v
        return out
    return over


def resolve_ref(doc: Sourced, loc: Loc, kind: str, near: Path | None) -> None:
    """Replace the value at `loc` (a name, a path, or ``{base: NAME, ...overrides}``) by its file's
    content."""
    parent = doc.data
    for k in loc[:-1]:
        parent = parent[k]
    value = parent[loc[-1]]
    overrides: dict | None = None
    if isinstance(value, dict) and "base" in value:
        overrides = {k: v for k, v in value.items() if k != "base"}
        value = value["base"]
    if not isinstance(value, str):
        return  # inline definition, validated as is
    file, line = doc.locate(loc)
    if kind == "llm" and value.endswith(".json"):  # a Hugging Face config.json (optimizer.io.hf_config)
        from optimizer.io.hf_config import resolve as resolve_hf

        tr = doc.data.get("training") if isinstance(doc.data, dict) else None
        seq = tr.get("seq_len") if isinstance(tr, dict) and isinstance(tr.get("seq_len"), int) else None
        data = resolve_hf(value, near, (file, line, ".".join(map(str, loc))), seq)
        parent[loc[-1]] = _deep_merge(data, overrides) if overrides else data
        return
    if value.endswith((".yaml", ".yml")):
        try:
            path = (near / value) if near is not None else Path(value)
            ok, there = path.is_file(), path.exists()
        except (OSError, ValueError):
            ok = there = False
        if not ok:
            what = "not a regular file (a folder, FIFO or device)" if there else "file not found"
            raise ProblemError(file, line, ".".join(map(str, loc)), f"{what}: {value[:200]}")
    else:
        found = find_in_library(kind, value, near)
        if found is None:
            names = ", ".join(available(kind, near)) or "none found"
            what = (
                f"unknown {kind} '{value}'"
                if LIBRARY_NAME.match(value)
                else (
                    f"'{value[:60]}' is not a library name (letters, digits, '.', '_', '+', '-') "
                    "nor a .yaml path"
                )
            )
            raise ProblemError(file, line, ".".join(map(str, loc)), f"{what} (known: {names})")
        path = found
    try:
        sub = read_yaml(path)
    except ProblemError as e:
        if e.line is not None:  # a place inside the file: that file's line says more
            raise
        raise ProblemError(file, line, ".".join(map(str, loc)), f"{value[:200]}: {e.message}") from None
    if not isinstance(sub.data, dict):
        raise ProblemError(sub.file, 1, None, f"a {kind} file must be a mapping")
    merged = sub.data
    keep = {k: v for k, v in doc.where.items() if k[: len(loc)] == loc and len(k) > len(loc)}
    doc.graft(loc, sub)
    if overrides:
        merged = _deep_merge(sub.data, overrides)
        for k, v in keep.items():  # overrides keep the lines of the referencing file
            if len(k) > len(loc) and k[len(loc)] != "base":
                doc.where[k] = v
    parent[loc[-1]] = merged


# --------------------------------------------------------------------------------------------- errors
# keys of the problem format that were renamed: the old name's error names the new one (see CHANGELOG.md)
RENAMED_KEYS = {"ep_dispatcher": "moe_dispatcher"}

_MESSAGES = {
    "greater_than": "must be > {gt}",
    "greater_than_equal": "must be >= {ge}",
    "less_than": "must be < {lt}",
    "less_than_equal": "must be <= {le} (the largest physically meaningful value)",
    "finite_number": "must be a finite number",
    "extra_forbidden": "unknown key",
    "missing": "required field is missing",
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be an integer",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "string_type": "must be a string",
    "dict_type": "must be a mapping",
    "list_type": "must be a list",
    "model_type": "must be a mapping",
    "model_attributes_type": "must be a mapping",
    "too_short": "needs at least {min_length} item(s)",
}


def _num(v: Any) -> Any:
    """A bound as a person writes it: 16,777,216 and 64, not 1.67772e+07 and 64.0."""
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e12:
        v = int(v)
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10000:
        return f"{v:,}"
    return f"{v:g}" if isinstance(v, float) else v


def _data_path(data: Any, loc: tuple) -> tuple[list, bool]:
    """The part of a pydantic error location that names keys and indices of `data` (pydantic also puts
    union members and validator names, such as 'int' or 'list[int]', in it), and whether any was dropped."""
    clean, node, dropped = [], data, False
    for x in loc:
        if isinstance(node, dict) and x in node:
            clean.append(x)
            node = node[x]
        elif isinstance(node, list) and isinstance(x, int) and 0 <= x < len(node):
            clean.append(x)
            node = node[x]
        elif isinstance(node, (dict, list)) and not clean and not isinstance(x, str):
            clean.append(x)
        elif isinstance(node, dict) and isinstance(x, str) and "[" not in x and x not in _UNION_TAGS:
            clean.append(x)  # a key the data lacks (a missing or unknown field): keep it, it names the field
            node = None
        else:
            dropped = True
    return clean, dropped


_UNION_TAGS = {"int", "bool", "str", "float", "Range", "list", "dict", "none", "is-instance", "nullable"}


def pydantic_errors(exc: Any, doc: Sourced, prefix: Loc = (), data: Any = None) -> ProblemErrors:
    """Turn a pydantic ValidationError into file:line:field errors: one per field, the messages of a union's
    alternatives joined."""
    out: list[ProblemError] = []
    merged: dict[tuple, int] = {}
    data = doc.data if data is None else data
    for err in exc.errors(include_url=False):
        raw = tuple(x for x in err["loc"] if not (isinstance(x, str) and x.startswith("function-")))
        path, union = _data_path(data, raw)
        clean: list[str | int] = list(prefix) + path
        kind = err["type"]
        ctx = err.get("ctx") or {}
        if kind in _MESSAGES:
            try:
                msg = _MESSAGES[kind].format(**{k: _num(v) for k, v in ctx.items()})
            except (KeyError, IndexError):
                msg = err["msg"]
        elif kind == "enum":
            msg = f"must be one of {ctx.get('expected', '')}".replace("'", "")
        elif kind == "value_error":
            msg = str(ctx.get("error", err["msg"]))
        else:
            msg = err["msg"]
        if kind == "extra_forbidden":
            msg = f"unknown key '{clean[-1]}'" if clean else msg
            if clean and clean[-1] in RENAMED_KEYS:
                msg += f" (renamed: write '{RENAMED_KEYS[clean[-1]]}')"
        file, line = doc.locate(tuple(clean))
        fieldpath = ".".join(str(x) for x in clean) or None
        key = tuple(clean)
        if union and key in merged:  # another alternative of the same union: one error, both messages
            prev = out[merged[key]]
            if msg not in prev.message:
                out[merged[key]] = ProblemError(file, line, fieldpath, f"{prev.message}; or {msg}")
            continue
        merged[key] = len(out)
        out.append(ProblemError(file, line, fieldpath, msg))
    return ProblemErrors(out)


def validate_model(model: Any, doc: Sourced, data: Any = None, prefix: Loc = ()) -> Any:
    from pydantic import ValidationError

    try:
        return model.model_validate(doc.data if data is None else data)
    except ValidationError as e:
        raise pydantic_errors(e, doc, prefix, data) from None


# --------------------------------------------------------------------------------------------- problems
def load_document(path: str | os.PathLike) -> Sourced:
    """Read a problem file and resolve its references (llm, system; catalog for procurement)."""
    return resolve_document(read_yaml(path), Path(path).parent)


def resolve_document(doc: Sourced, near: Path) -> Sourced:
    """Resolve a problem document's references (llm, system, catalog) relative to `near`."""
    if not isinstance(doc.data, dict):
        raise ProblemError(doc.file, 1, None, "a problem file must be a mapping")
    for kind in ("llm", "system", "catalog"):
        if kind in doc.data:
            resolve_ref(doc, (kind,), kind, near)
    return doc


def validate_problem(doc: Sourced):
    """A resolved problem document as a `Problem`, with the checks every problem gets (precision)."""
    from optimizer.rules.cross_field import precision_errors, raise_errors
    from optimizer.schema import Problem

    problem = validate_model(Problem, doc)
    problem._source = doc
    raise_errors(precision_errors(problem.system, problem.training.precision), doc)
    return problem


def load_problem(path: str | os.PathLike, require_execution: bool = False):
    """Load and validate a problem file (stages load + validate). The execution's integer rules are checked
    when the file writes an `execution` or the caller needs one (`evaluate`); `solve` searches knobs."""
    from optimizer.rules.cross_field import check_problem

    doc = load_document(path)
    problem = validate_problem(doc)
    if require_execution and "execution" not in doc.data:
        # evaluate scores a written plan; the schema's all-default execution (tp 1, pp 1, no sharding) is
        # no one's plan, and its answer ("1358 GiB per GPU") would read as the model's verdict
        raise ProblemError(
            str(path),
            1,
            "execution",
            "required field is missing: evaluate scores the execution the file writes (e.g. execution: "
            "{tp: 8, pp: 4, micro_batch: 1}); to find the fastest one, run `paraplan solve` on this file",
        )
    written = doc.data.get("execution")
    only_order = isinstance(written, dict) and set(written) <= {"rank_order"}  # how ranks go, not a plan
    if require_execution or ("execution" in doc.data and not only_order):
        check_problem(problem, doc)
    return problem


def load_problem_doc(path: str | os.PathLike):
    """The problem without its execution rules checked, and the execution keys the file writes (`check`)."""

    doc = load_document(path)
    problem = validate_problem(doc)
    written = doc.data.get("execution") if isinstance(doc.data.get("execution"), dict) else None
    return problem, written


def load_named(kind: str, name: str, model: Any):
    """Load one library file (an llm or a system) by name."""
    path = find_in_library(kind, name)
    if path is None:
        raise ProblemError(
            "<library>", None, kind, f"unknown {kind} '{name}' (known: {', '.join(available(kind))})"
        )
    doc = read_yaml(path)
    return validate_model(model, doc)


# --------------------------------------------------------------------------------------------- procurement
def _expand_variants(doc: Sourced, types_loc: Loc) -> None:
    """Node types with `variants` become one node type per variant: name `<type>-<variant>`, the type's fields
    overridden by the variant's, and the variant's `system` keys applied over the type's system."""
    parent = doc.data
    for k in types_loc:
        parent = parent[k]
    if not isinstance(parent, list):
        return
    out: list = []
    where: dict[Loc, tuple[str, int]] = {}
    n = len(types_loc)
    for i, nt in enumerate(parent):
        base_loc = types_loc + (i,)
        if not isinstance(nt, dict) or "variants" not in nt:
            j = len(out)
            out.append(nt)
            where.update(
                {types_loc + (j,) + k[n + 1 :]: v for k, v in doc.where.items() if k[: n + 1] == base_loc}
            )
            continue
        variants = nt["variants"]
        if not isinstance(variants, list) or not variants:
            file, line = doc.locate(base_loc + ("variants",))
            raise ProblemError(
                file, line, ".".join(map(str, base_loc + ("variants",))), "must be a non-empty list"
            )
        for vj, var in enumerate(variants):
            vloc = base_loc + ("variants", vj)
            if not isinstance(var, dict) or "name" not in var:
                file, line = doc.locate(vloc)
                raise ProblemError(file, line, ".".join(map(str, vloc)), "a variant needs a name")
            j = len(out)
            new = {k: v for k, v in nt.items() if k != "variants"}
            new.update({k: v for k, v in var.items() if k not in ("name", "system")})
            new["name"] = f"{nt.get('name', i)}-{var['name']}"
            if "system" in var:
                sys_over = var["system"] if isinstance(var["system"], dict) else {"base": var["system"]}
                base = nt.get("system")
                base = {"base": base} if isinstance(base, str) else dict(base or {})
                new["system"] = _deep_merge(base, sys_over) if "base" not in sys_over else sys_over
            out.append(new)
            for k, v in doc.where.items():
                if k[: n + 1] == base_loc and (len(k) == n + 1 or k[n + 1] != "variants"):
                    where[types_loc + (j,) + k[n + 1 :]] = v
            for k, v in doc.where.items():
                if k[: len(vloc)] == vloc:
                    where[types_loc + (j,) + k[len(vloc) :]] = v
    for k in [k for k in doc.where if k[:n] == types_loc and len(k) > n]:
        del doc.where[k]
    doc.where.update(where)
    grand = doc.data
    for k in types_loc[:-1]:
        grand = grand[k]
    grand[types_loc[-1]] = out


def load_procure_document(path: str | os.PathLike) -> Sourced:
    """Read a procurement problem and resolve its llm, its catalog and every node type's system."""
    doc = read_yaml(path)
    near = Path(path).parent
    if not isinstance(doc.data, dict):
        raise ProblemError(doc.file, 1, None, "a problem file must be a mapping")
    for kind in ("llm", "catalog"):
        if kind in doc.data:
            resolve_ref(doc, (kind,), kind, near)
    cat = doc.data.get("catalog")
    if isinstance(cat, dict) and isinstance(cat.get("node_types"), list):
        _expand_variants(doc, ("catalog", "node_types"))
        for i, nt in enumerate(doc.data["catalog"]["node_types"]):
            if isinstance(nt, dict) and "system" in nt:
                resolve_ref(doc, ("catalog", "node_types", i, "system"), "system", near)
    return doc


def load_procure(path: str | os.PathLike):
    """Load and validate a procurement problem (`paraplan procure`)."""
    from optimizer.rules.cross_field import precision_errors, raise_errors
    from optimizer.schema.procure import ProcureProblem

    doc = load_procure_document(path)
    pp = validate_model(ProcureProblem, doc)
    pp._source = doc
    raise_errors(
        [
            e
            for i, t in enumerate(pp.catalog.node_types)
            for e in precision_errors(t.system, pp.training.precision, f"catalog.node_types.{i}.system")
        ],
        doc,
    )
    return pp


def load_multisite(path: str | os.PathLike, doc: Sourced | None = None):
    """Load and validate a procurement across sites (a procurement file with `sites`): names that refer to
    nothing (a site's node type, a link's site) are file:line:field errors."""
    from optimizer.rules.cross_field import precision_errors, raise_errors
    from optimizer.schema.multisite import MultisiteProblem, reference_errors

    doc = doc or load_procure_document(path)
    mp = validate_model(MultisiteProblem, doc)
    mp._source = doc
    raise_errors(reference_errors(mp), doc)
    used = {n for s in mp.sites for n in s.node_types}
    raise_errors(
        [
            e
            for i, t in enumerate(mp.catalog.node_types)
            if t.name in used
            for e in precision_errors(t.system, mp.training.precision, f"catalog.node_types.{i}.system")
        ],
        doc,
    )
    return mp


def load_any_procure(path: str | os.PathLike):
    """A procurement problem: across sites when the file has `sites` (`load_multisite`), else of one site
    (`load_procure`)."""
    doc = load_procure_document(path)
    if isinstance(doc.data, dict) and "sites" in doc.data:
        return load_multisite(path, doc)
    return load_procure(path)


# --------------------------------------------------------------------------------------------- fleet
def load_fleet(path: str | os.PathLike):
    """Load and validate a fleet problem (`paraplan fleet`): the catalog, every node type's system and every
    job's llm are resolved like procurement's."""
    from optimizer.schema.fleet import FleetProblem

    doc = load_procure_document(path)
    near = Path(path).parent
    jobs = doc.data.get("jobs")
    if isinstance(jobs, list):
        for i, j in enumerate(jobs):
            if isinstance(j, dict) and "llm" in j:
                resolve_ref(doc, ("jobs", i, "llm"), "llm", near)
    fp = validate_model(FleetProblem, doc)
    fp._source = doc
    return fp
