#!/usr/bin/env python3
"""Leave-one-source-out (and time-forward) evaluation of the calibrated step-time model.

    python scripts/crossval.py --by source --json          # every group held out in turn
    python scripts/crossval.py --by time --before 2025-06  # fit on sources published before, predict the rest
    python scripts/crossval.py --list-groups               # the group table, with every public run's group
    python scripts/crossval.py --quick                     # one small group, a reduced optimiser budget (CI)

Leave-one-run-out (`calibrate.py --loo`) over-states accuracy: runs of one source document share its software
release, recipes and measurement habits, so they predict each other. Here a group is one source document and
release (`GROUPS`, read from each run's `source` field by `group_of`). For each held-out set, the calibration
sequence (`calibration_sequence.SEQUENCE`, the calibrate.py commands behind today's system files) is replayed
without those runs, through calibrate.py's own `main`, into a temporary library of system files
(`PARAPLAN_LIBRARY`; problems/systems is never written), and the held-out runs are predicted with that library
by `paraplan validate`'s scorer (`optimizer.drivers.validate.score_runs`).

The folds start from the sequence rerun once on every run (`--base replay`): the shipped files are not a fixed
point of it on today's model (`--replay` prints where they move), and a fold should differ from its base only
by the runs it holds out. Within a fold, a step whose runs, base file and shape/transfer source the held-out
set leaves untouched is not rerun (each fit starts from fixed values, so a rerun reproduces its output). A fit
step left with no runs takes the priors of its parameters (`prior_value`); the runs of its GPU (and stack),
and of GPUs taking its tables by shape or transfer, are reported as `prior`.

The MoE host launch floor (`layer.MOE_HOST_FW_S`, calibrate_host.py) is refitted in every fold without the
held-out runs: its grid of errors (`HostFit`) is computed once, over every Megatron-Core MoE run, on the
fold's base system files (not refitted per fold: the floor moves a fit little, and a table per fold would take
an hour); each fold takes the grid value that fits its other runs best, and replays the sequence and predicts
with it. Not refitted: the allocator slack of calibrate_memory.py (memory only) and the H100 curve shape that
the H100 level is fitted on; these are leaks in favour of the model for the groups they were fitted on.

Errors are signed percentages of the measured step time, (predicted - measured) / measured x 100.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import calibration_sequence as seq  # noqa: E402

from optimizer.io.loader import LIBRARY_ENV, read_yaml, validate_model  # noqa: E402
from optimizer.io.runs import load_runs, stack_of  # noqa: E402

# One source document and release per group, matched in order on the run's `source` (case-insensitive regex);
# the first match wins. date: the document's publication month (YYYY-MM), for the time-forward split.
GROUPS: list[tuple[str, str, str, str]] = [
    # (pattern, group, date, what the group is)
    (
        r"narayanan et al\. 2021",
        "narayanan-2021",
        "2021-04",
        "Narayanan et al. 2021 (SC21, Megatron-LM PTD-P; arXiv April 2021), Table 1",
    ),
    (
        r"korthikanti et al\. 2022",
        "korthikanti-2022",
        "2022-05",
        "Korthikanti et al. 2022 (arXiv May 2022): Tables 3 and 5, the abstract, Sec. 6.3",
    ),
    (
        r"bigscience bloom-176b training",
        "bloom-2022",
        "2022-07",
        "BigScience BLOOM-176B training logs (bigscience-workshop/bigscience train/tr11-176B-ml)",
    ),
    (
        r"llm-foundry .*@061f2c7",
        "llm-foundry-061f2c7",
        "2023-10",
        "MosaicML llm-foundry scripts/train/benchmarking/README.md @061f2c7 (2023-10-17), every section",
    ),
    (
        r"jax-toolbox rosetta/rosetta/projects/maxtext/readme\.md @00f755e3",
        "jax-toolbox-maxtext-2405",
        "2024-05",
        "NVIDIA JAX-Toolbox MaxText README @00f755e3 (24.04 branch), Llama 2 7B on 8 H100",
    ),
    (
        r"dgxc-benchmarking maxtext/readme_70b\.md @35a9aec",
        "dgxc-maxtext-24.11",
        "2024-12",
        "NVIDIA dgxc-benchmarking v24.11.1 maxtext/README_70b.md (MaxText Llama 2 70B, 2024-12-09 image)",
    ),
    (
        r"dgxc-benchmarking maxtext/readme_70b\.md @8f5cbb3",
        "dgxc-maxtext-25.02",
        "2025-02",
        "NVIDIA dgxc-benchmarking v25.02 maxtext/README_70b.md (MaxText Llama 3 70B, JAX 25.01 image)",
    ),
    (
        r"dgxc-benchmarking (v24\.11\.1|llama3\.1/readme_\d+b\.md @143b90d)",
        "dgxc-benchmarking-24.11",
        "2024-11",
        "NVIDIA dgxc-benchmarking v24.11.1 READMEs, BF16 and FP8 tables"
        " (@143b90d: the same llama3.1 file version)",
    ),
    (
        r"dgxc-benchmarking qwen3/",
        "dgxc-benchmarking-qwen3",
        "2025-10",
        "NVIDIA dgxc-benchmarking qwen3/pretrain/README.md @1b172ed (Megatron-Bridge; month approximate)",
    ),
    (
        r"MLPerf Training v3\.1 closed, gpt3",
        "mlperf-training-3.1-gpt3",
        "2023-11",
        "MLPerf Training v3.1 closed, gpt3 (GPT-3 175B), NVIDIA, Azure+NVIDIA on 512-10,752 H100 (@d06288b)",
    ),
    (
        r"MLPerf Training v4\.0 closed, gpt3",
        "mlperf-training-4.0-gpt3",
        "2024-06",
        "MLPerf Training v4.0 closed, gpt3 (GPT-3 175B), NVIDIA on 512-11,616 H100 (@6fe9543)",
    ),
    (
        r"MLPerf Training v4\.1 closed, gpt3",
        "mlperf-training-4.1-gpt3",
        "2024-11",
        "MLPerf Training v4.1 closed, gpt3 (GPT-3 175B), NVIDIA and Oracle on 256-3,072 H100, 64 B200",
    ),
    (
        r"MLPerf Training v5\.0 closed, llama31_405b",
        "mlperf-training-5.0-405b",
        "2025-06",
        "MLPerf Training v5.0 closed, llama31_405b: NVIDIA (512-8,192 H100, 256/512 GB200),"
        " IBM+CoreWeave+NVIDIA (512-2,496 GB200), Nebius (512/1,024 H200) (@0fdc28f)",
    ),
    (
        r"MLPerf Training v5\.1 closed, llama31_405b",
        "mlperf-training-5.1-405b",
        "2025-11",
        "MLPerf Training v5.1 closed, llama31_405b: NVIDIA, University of Florida (@441d65f)",
    ),
    (
        r"MLPerf Training v5\.1",
        "mlperf-training-5.1",
        "2025-11",
        "MLPerf Training v5.1 closed, llama31_8b: every submitter with a system file (@441d65f)",
    ),
    (
        r"the llama 3 herd of models \(arxiv:2407\.21783",
        "llama3-herd-2407",
        "2024-07",
        "Llama Team, AI @ Meta, The Llama 3 Herd of Models (arXiv:2407.21783), Table 4, the 8K-token rows",
    ),
    (
        r"llama3_h100_202412_torchtitan",
        "torchtitan-h100-2412",
        "2024-12",
        "torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Tables 1-6",
    ),
    (
        r"llama3_8b_h200_2025-06_torchtitan",
        "torchtitan-h200-2506",
        "2025-06",
        "torchtitan benchmarks/llama3_8b_h200_2025-06_torchtitan.md (Trainy)",
    ),
    (
        r"asynctp_llama3_h100_2025-06_torchtitan",
        "torchtitan-asynctp-2506",
        "2025-06",
        "torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md (the PyTorch team)",
    ),
    (
        r"nemo 24\.07 performance summary",
        "nemo-24.07",
        "2024-09",
        "NeMo performance summary, NeMo 24.07 container (DGX-H100, FP8; NeMo docs @8e3d65dcfe)",
    ),
    (
        r"container nemo 25\.02",
        "nemo-25.02",
        "2025-02",
        "NeMo Framework performance summary, NeMo 25.02 container (DGX-B200)",
    ),
    (
        r"container nemo 25\.04",
        "nemo-25.04",
        "2025-04",
        "NeMo Framework performance summary, NeMo 25.04 container (DGX-GB200)",
    ),
    (
        r"25\.09 nemo container",
        "megatron-bridge-25.09",
        "2025-09",
        "Megatron-Bridge performance summary (archive), 25.09 NeMo container",
    ),
    (
        r"25\.11 nemo container",
        "megatron-bridge-25.11",
        "2025-11",
        "Megatron-Bridge performance summary (and its archive), 25.11 NeMo container",
    ),
    (
        r"26\.02 nemo container",
        "megatron-bridge-26.02",
        "2026-02",
        "Megatron-Bridge performance summary archive, 26.02 NeMo container",
    ),
    (
        r"26\.04\.01 nemo container",
        "megatron-bridge-26.04.01",
        "2026-04",
        "Megatron-Bridge performance summary archive, 26.04.01 NeMo container",
    ),
    (
        r"26\.06 nemo container",
        "megatron-bridge-26.06",
        "2026-06",
        "Megatron-Bridge performance summary archive, 26.06 NeMo container",
    ),
]
DATES = {g: d for _, g, d, _ in GROUPS}
QUICK_GROUP = "nemo-25.02"  # --quick: its refit is one clock factor on three B200 runs
QUICK_MAXITER = 12  # --quick: Nelder-Mead iterations per fit


def group_of(source: str) -> str:
    """The group (source document and release) of a run's `source` field; ValueError when no entry matches."""
    for pattern, group, _, _ in GROUPS:
        if re.search(pattern, source or "", re.IGNORECASE):
            return group
    raise ValueError(f"no group for source {source!r}: add it to GROUPS in scripts/crossval.py")


def run_files() -> list[Path]:
    """Every public runs file: ../shared/calibration/*.yaml when present, and problems/runs/*.yaml."""
    return sorted(seq.SHARED.glob("*.yaml")) + sorted((ROOT / "problems" / "runs").glob("*.yaml"))


def public_runs() -> list[tuple[Path, dict]]:
    """(file, record) of every public run, records as `load_runs` returns them."""
    return [(f, r) for f in run_files() for r in load_runs(str(f)).data]


# ------------------------------------------------------------------------------------------------- refitting


def _step_runs(step: seq.Step, kept: dict[str, list[dict]]) -> int:
    """How many runs of the step's GPU (and stack) its run files hold after holding out (`kept`: by file
    key)."""
    return sum(
        1
        for key in step.runs
        for r in kept.get(key, [])
        if r["hardware"]["gpu"] == step.gpu and (step.stack is None or stack_of(r) == step.stack)
    )


def _calibrate(args: list[str]) -> None:
    """calibrate.py's `main` on `args`, its output kept off stdout (echoed to stderr when it fails)."""
    import calibrate

    calibrate.SHAPE.clear()
    out = io.StringIO()
    old = sys.argv
    sys.argv = ["calibrate.py", *args]
    try:
        with contextlib.redirect_stdout(out):
            rc = calibrate.main()
    except BaseException:
        sys.stderr.write(out.getvalue())
        raise
    finally:
        sys.argv = old
    if rc:
        sys.stderr.write(out.getvalue())
        raise RuntimeError(f"calibrate.py {' '.join(args)} exited {rc}")


def prior_value(name: str) -> float | None:
    """The prior of a calibrate.py parameter: the System schema's default where it has one (the value of an
    uncalibrated file: the attention efficiency; None where the model derives the value when the file states
    none: `clock_scale` from the power cap, the attention tile overhead), else calibrate.py's fixed start
    (`START`: a curve level 0.6, HBM factor 1.0, precision factors 0.8, ...)."""
    import calibrate

    from optimizer.schema import System

    field = System.model_fields.get(name)
    if field is not None and (field.default is None or isinstance(field.default, float)):
        return None if field.default is None else float(field.default)
    return calibrate.START[name]


def _prior(step: seq.Step, library: Path) -> None:
    """Write the priors (`prior_value`) of the step's parameters into its system file: the fit of a step with
    no runs left."""
    import calibrate

    from optimizer.schema import System

    calibrate.SHAPE.clear()
    calibrate.FIT_STACK.clear()
    if step.stack:
        calibrate.FIT_STACK["stack"] = step.stack
    if step.shape:
        shape = validate_model(System, read_yaml(library / "systems" / f"{step.shape}.yaml"))
        calibrate.SHAPE.update(of=step.shape, curve=[list(map(float, pt)) for pt in shape.matrix_efficiency])
    names = [n for n in step.params.split(",") if n]
    x = {n: prior_value(n) for n in names}
    path = library / "systems" / f"{step.gpu}.yaml"
    with contextlib.redirect_stdout(io.StringIO()):
        # a derived one is written at calibrate.py's start (so that a clock fit's shape is written as it is),
        # then removed
        x_write = {n: calibrate.START[n] if v is None else v for n, v in x.items()}
        calibrate.write(path, x_write, [], "no runs: calibrate.py priors")
    derived = [n for n, v in x.items() if v is None]
    if derived:  # the model derives these where the file states none
        rt, doc = calibrate._load(path)
        for n in derived:
            doc.pop(n, None)
        calibrate._dump(rt, doc, path)


def refit(
    held_runs: list[dict], library: Path, workdir: Path, maxiter: int | None = None, every_step: bool = False
) -> tuple[list[str], set[tuple[str, str | None]]]:
    """Replay the calibration sequence into `library` (a copy of problems/systems) with `held_runs` removed
    from every runs file (`every_step`: rerun the steps the held-out runs leave untouched too). Returns the
    commands rerun (for the log) and the (system, stack) pairs left on priors (a fit step with no runs, or
    tables taken from one by shape or transfer; stack None: every stack)."""
    import calibrate

    held = {r["id"] for r in held_runs}
    files, kept, removed = {}, {}, {}
    for key, path in seq.RUN_FILES.items():
        if not path.is_file():
            continue
        recs = load_runs(str(path)).data
        kept[key] = [r for r in recs if r["id"] not in held]
        removed[key] = {(r["hardware"]["gpu"], stack_of(r)) for r in recs if r["id"] in held}
        files[key] = path
        if len(kept[key]) < len(recs):
            # the kept records carry their typed facts already (load_runs merged the sidecar): a name of their
            # own, so that no sidecar file (runs/facts/<stem>.yaml) is merged into them a second time
            files[key] = workdir / f"{path.stem}.fold.yaml"
            files[key].write_text(yaml.safe_dump(kept[key], sort_keys=False, width=1000))
    dirty: set[str] = set()
    prior: set[tuple[str, str | None]] = set()
    done = []
    old_maxiter = calibrate.MAXITER
    if maxiter is not None:
        calibrate.MAXITER = maxiter
    try:
        for step in seq.SEQUENCE:
            touched = any(
                g == step.gpu and (step.stack is None or s == step.stack)
                for key in step.runs
                for g, s in removed.get(key, ())
            )
            base = () if step.transfer else (step.gpu,)
            if not every_step and not (touched and not step.transfer) and not dirty & set(step.reads + base):
                continue
            if step.transfer:
                _calibrate(seq.argv(step, files))
                prior |= {(t, st) for s, st in prior if s == step.gpu for t in step.transfer}
            elif _step_runs(step, kept) == 0:
                _prior(step, library)
                prior.add((step.gpu, step.stack))
            else:
                _calibrate(seq.argv(step, files))
                prior |= {(step.gpu, None) for s, st in prior if s == step.shape and st is None}
            dirty |= set(step.writes)
            done.append(" ".join(seq.argv(step, {k: Path(v.name) for k, v in files.items()})))
    finally:
        calibrate.MAXITER = old_maxiter
    return done, prior


# ------------------------------------------------------------------------------------------------- scoring


def _stats(rows: list[dict]) -> dict:
    errs = [r["error_pct"] for r in rows]
    return {
        "n": len(errs),
        "mape_pct": sum(map(abs, errs)) / len(errs) if errs else None,
        "mean_signed_error_pct": sum(errs) / len(errs) if errs else None,
    }


def _by(rows: list[dict], key: str) -> dict:
    keys = sorted({r[key] for r in rows})
    return {k: _stats([r for r in rows if r[key] == k]) for k in keys}


LONG_CONTEXT_TOKENS = 32768  # a run of at least this sequence is also reported as long_context


def kind_of(run: dict) -> str:
    """`moe` for a mixture-of-experts model, else `dense` (the kind a band is kept for)."""
    return "moe" if run["model"].get("moe") else "dense"


def _by_kind(rows: list[dict]) -> dict:
    """Figures per kind: dense, moe, and long_context (sequence >= LONG_CONTEXT_TOKENS, either kind)."""
    long_ids = {r["id"] for r in rows if r.get("seq_len", 0) >= LONG_CONTEXT_TOKENS}
    out = _by(rows, "kind")
    longs = [r for r in rows if r["id"] in long_ids]
    if longs:
        out["long_context"] = _stats(longs)
    return out


def predict_held(runs: list[dict], workdir: Path, prior: set[tuple[str, str | None]]) -> list[dict]:
    """Score `runs` with the system files of the library `PARAPLAN_LIBRARY` names (`paraplan validate`'s
    scorer); one row per run."""
    from optimizer.drivers.validate import score_runs
    from optimizer.io.runs import gpu_systems

    path = workdir / "held.yaml"
    path.write_text(yaml.safe_dump(runs, sort_keys=False, width=1000))
    scored = score_runs(str(path)).runs
    systems = gpu_systems()
    out = []
    for run, row in zip(runs, scored, strict=True):
        sysname, stack = systems.get(run["hardware"]["gpu"]), row.get("stack") or stack_of(run)
        out.append(
            {
                "id": run["id"],
                "group": group_of(run["source"]),
                "gpu": run["hardware"]["gpu"],
                "stack": stack,
                "status": row["status"],
                "reason": row["reason"],
                "error_pct": row["error_pct"],
                "calibration": "prior" if {(sysname, None), (sysname, stack)} & prior else "fitted",
                "kind": kind_of(run),
                "seq_len": run["model"]["seq_len"],
            }
        )
    return out


FITTED_FIELDS = (
    "matrix_efficiency",
    "hbm_efficiency",
    "matrix_efficiency_scale",
    "stack_matrix_scale",
    "clock_scale",
    "attention_efficiency",
    "attention_overhead_keys",
    "attention_overhead_keys_triton",
)


def _numbers(value) -> list[float]:
    """The numbers of a fitted field's value (a scalar, a table of pairs, a dict of factors), in order."""
    if isinstance(value, dict):
        return [float(v) for _, v in sorted(value.items())]
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _numbers(v)]
    return [] if value is None else [float(value)]


@contextlib.contextmanager
def library_from(systems: Path):
    """A temporary directory holding a library (`library/systems`, a copy of `systems`) that
    `PARAPLAN_LIBRARY` names while the block runs; yields (directory, library)."""
    with tempfile.TemporaryDirectory(prefix="crossval-") as tmp:
        tmp = Path(tmp)
        library = tmp / "library"
        shutil.copytree(systems, library / "systems")
        old = os.environ.get(LIBRARY_ENV)
        os.environ[LIBRARY_ENV] = str(library)
        try:
            yield tmp, library
        finally:
            if old is None:
                os.environ.pop(LIBRARY_ENV)
            else:
                os.environ[LIBRARY_ENV] = old


SHIPPED = ROOT / "problems" / "systems"


def drift(replayed: Path) -> dict[str, dict]:
    """Per system file the sequence writes, each fitted field (`FITTED_FIELDS`, the network efficiencies)
    whose value in `replayed` (a systems directory) differs from the shipped file's: the largest relative
    difference and both values. Empty where the sequence reproduces the file."""
    from optimizer.schema import System

    out = {}
    for name in dict.fromkeys(w for step in seq.SEQUENCE for w in step.writes):
        a, b = (
            validate_model(System, read_yaml(d / f"{name}.yaml")).model_dump(mode="json")
            for d in (SHIPPED, replayed)
        )
        a["networks"], b["networks"] = ([n["efficiency"] for n in d["networks"]] for d in (a, b))
        out[name] = {}
        for f in (*FITTED_FIELDS, "networks"):
            va, vb = _numbers(a.get(f)), _numbers(b.get(f))
            rel = (
                max((abs(x - y) / max(abs(x), 1e-9) for x, y in zip(va, vb, strict=True)), default=0.0)
                if len(va) == len(vb)
                else float("inf")
            )
            if rel > 1e-3:
                out[name][f] = {"relative_change": rel, "shipped": a.get(f), "replayed": b.get(f)}
    return out


@contextlib.contextmanager
def replayed_systems(maxiter: int | None = None):
    """Rerun every step of the sequence on every run (nothing held out); yields the systems directory written.
    The shipped files are not a fixed point of the sequence on today's model (`--replay` says where), so a
    fold starts from these, and a step it leaves untouched is what the sequence gives."""
    t0 = time.time()
    with library_from(SHIPPED) as (tmp, library):
        refit([], library, tmp, maxiter, every_step=True)
        print(
            f"crossval: the sequence replayed on every run [{time.time() - t0:.0f} s]",
            file=sys.stderr,
            flush=True,
        )
        yield library / "systems"


class HostFit:
    """The MoE host launch floor refitted without a fold's runs (module docstring): the signed errors of every
    Megatron-Core MoE public run at each of calibrate_host.py's grid values, on the system files in `base`."""

    def __init__(self, base: Path):
        import calibrate_host

        t0 = time.time()
        runs = calibrate_host.moe_runs([str(f) for f in run_files()])  # the runs the floor is fitted on
        with library_from(base):
            self.ids, self.err = calibrate_host.error_table(runs)
        self.grid_s = calibrate_host.GRID_MS * 1e-3
        print(
            f"crossval: MoE host floor's error grid on {len(self.ids)} runs [{time.time() - t0:.0f} s]",
            file=sys.stderr,
            flush=True,
        )

    def without(self, held_runs: list[dict]) -> float:
        """The floor (s) that fits the runs not in `held_runs` best (`grid_fit.best_row`)."""
        from grid_fit import best_row

        held = {r["id"] for r in held_runs}
        keep = [j for j, i in enumerate(self.ids) if i not in held]
        return float(self.grid_s[best_row(self.err[:, keep])])


@contextlib.contextmanager
def host_floor(value_s: float | None):
    """`layer.MOE_HOST_FW_S` set to `value_s` (None: as fitted) while the block runs."""
    import optimizer.model.layer as layer

    saved = layer.MOE_HOST_FW_S
    if value_s is not None:
        layer.MOE_HOST_FW_S = value_s
    try:
        yield
    finally:
        layer.MOE_HOST_FW_S = saved


def evaluate_fold(
    held_runs: list[dict], label: str, base: Path, maxiter: int | None = None, host: HostFit | None = None
) -> list[dict]:
    """Refit without `held_runs` (the system files, starting from those in `base`, into a temporary library,
    and with `host` the MoE host floor); then predict them with it."""
    host_s = host.without(held_runs) if host is not None else None
    with library_from(base) as (tmp, library), host_floor(host_s):
        t0 = time.time()
        done, prior = refit(held_runs, library, tmp, maxiter)
        rows = predict_held(held_runs, tmp, prior)
    ok = [r for r in rows if r["status"] == "ok" and r["error_pct"] is not None]
    st = _stats(ok)
    mape = f"{st['mape_pct']:.2f}%" if ok else "-"
    on_prior = sorted(s + (f"/{st}" if st else "") for s, st in prior)
    floor = "" if host_s is None else f", MoE host floor {host_s * 1e3:.2f} ms"
    print(
        f"crossval: {label}: {len(held_runs)} runs held out, {len(done)} steps refitted{floor}"
        f"{' (prior: ' + ', '.join(on_prior) + ')' if prior else ''}, MAPE {mape} "
        f"[{time.time() - t0:.0f} s]",
        file=sys.stderr,
        flush=True,
    )
    return rows


def summary(rows: list[dict], extra: dict) -> dict:
    """The JSON object: overall figures over the scored runs, per group, per stack, per GPU, per
    calibration."""
    ok = [r for r in rows if r["status"] == "ok" and r["error_pct"] is not None]
    errs = [r["error_pct"] for r in ok]
    st = _stats(ok)
    groups = _by(ok, "group")
    return {
        **extra,
        "mape_pct": st["mape_pct"],
        "max_abs_error_pct": max(map(abs, errs)) if errs else None,
        "mean_signed_error_pct": st["mean_signed_error_pct"],
        "n_runs": len(ok),
        "group_mean_mape_pct": (sum(g["mape_pct"] for g in groups.values()) / len(groups))
        if groups
        else None,
        "n_not_scored": len(rows) - len(ok),
        "groups": groups,
        "by_stack": _by(ok, "stack"),
        "by_gpu": _by(ok, "gpu"),
        "by_kind": _by_kind(ok),
        "by_calibration": _by(ok, "calibration"),
        "runs": rows,
    }


BANDS_YAML = ROOT / "optimizer" / "model" / "bands.yaml"
BAND_COVERAGE = 0.8  # the band covers this share of the grouped errors of its scope
BAND_MIN_RUNS = 5  # fewer grouped errors than this: the next wider scope's band


def write_bands(rows: list[dict], path: Path = BANDS_YAML) -> None:
    """Write the grouped step-time errors of the scored `rows` by GPU type and stack, with the coverage and
    the fallback threshold, into `path` (optimizer/model/bands.py reads it; the bands are derived there)."""
    errors: dict[str, dict[str, dict[str, list[float]]]] = {}
    for r in rows:
        if r["status"] == "ok" and r["error_pct"] is not None:
            by_stack = errors.setdefault(r["gpu"], {}).setdefault(r["stack"], {})
            by_stack.setdefault(r["kind"], []).append(round(r["error_pct"], 2))
    doc = {
        "coverage": BAND_COVERAGE,
        "min_runs": BAND_MIN_RUNS,
        "errors": {
            g: {s: dict(sorted(k.items())) for s, k in sorted(v.items())} for g, v in sorted(errors.items())
        },
    }
    head = (
        "# Grouped (leave-one-source-out) step-time errors, %, of the public runs by GPU type, stack and\n"
        "# kind of model:\n"
        "# each run predicted by a fit that saw no run of its source. Written by\n"
        "# `python scripts/crossval.py --by source --write-bands`; do not edit. optimizer/model/bands.py\n"
        "# turns them into the +-% band each answer prints (covering `coverage` of its scope's errors).\n"
    )
    path.write_text(head + yaml.safe_dump(doc, sort_keys=False, width=110, default_flow_style=None))
    print(f"crossval: wrote {path}", file=sys.stderr)


def _folds(
    args, groups: list[str], by_group: dict[str, list[dict]], base: Path, maxiter: int | None
) -> tuple[list[dict], dict]:
    """The held-out folds of `--by source` (one per group) or `--by time` (every group dated `--before` or
    later, in one fold); returns the rows of the predicted runs and the split's description."""
    host = None if args.quick else HostFit(base)
    if args.by == "source":
        rows = []
        for i, g in enumerate(groups):
            rows += evaluate_fold(by_group[g], f"[{i + 1}/{len(groups)}] {g}", base, maxiter, host)
        return rows, {"split": "source"}
    later = [g for g in groups if DATES[g] >= args.before]
    held = [r for g in by_group if DATES[g] >= args.before for r in by_group[g]]
    rows = evaluate_fold(held, f"groups from {args.before} on", base, maxiter, host)
    return [r for r in rows if r["group"] in later], {
        "split": "time",
        "before": args.before,
        "fitted_on": [g for g in by_group if DATES[g] < args.before],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--by",
        choices=("source", "time"),
        default="source",
        help="source: hold out each group in turn; time: hold out every group dated --before or later",
    )
    ap.add_argument("--before", default="2025-06", help="--by time: fit on groups dated before this YYYY-MM")
    ap.add_argument(
        "--groups", help="comma-separated groups to hold out (--by source) or predict (--by time)"
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help=f"hold out {QUICK_GROUP} only, {QUICK_MAXITER} optimiser iterations per fit",
    )
    ap.add_argument(
        "--base",
        choices=("replay", "shipped"),
        help="the system files a fold starts from: the sequence rerun on every run (the default; "
        "shipped with --quick), or the shipped problems/systems (a step the fold leaves untouched "
        "keeps the shipped file)",
    )
    ap.add_argument(
        "--maxiter", type=int, help="Nelder-Mead iterations per fit (calibrate.py's default otherwise)"
    )
    ap.add_argument("--list-groups", action="store_true", help="print the group table and each group's runs")
    ap.add_argument(
        "--replay",
        action="store_true",
        help="rerun the whole sequence on every run and print how far each fitted system file moves "
        "from the shipped one (0: the sequence reproduces it)",
    )
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--write-bands",
        action="store_true",
        help="--by source over every group: write the grouped errors and the bands they give into "
        "optimizer/model/bands.yaml (the uncertainty check and procure print)",
    )
    args = ap.parse_args()
    if args.write_bands and (args.by != "source" or args.groups or args.quick):
        ap.error("--write-bands needs --by source over every group (no --groups, no --quick)")

    runs = public_runs()
    by_group: dict[str, list[dict]] = {}
    for _, r in runs:
        by_group.setdefault(group_of(r["source"]), []).append(r)
    if args.list_groups:
        for pattern, group, date, what in GROUPS:
            n = len(by_group.get(group, []))
            gpus = sorted({r["hardware"]["gpu"] for r in by_group.get(group, [])})
            print(
                f"{group:28s} {date}  {n:4d} runs  {what}"
                f"\n{'':28s} /{pattern}/  gpus: {', '.join(gpus) or '-'}"
            )
        return 0
    if args.replay:
        with replayed_systems(args.maxiter) as systems:
            moved = drift(systems)
        print(
            json.dumps(moved, indent=1)
            if args.json
            else "\n".join(
                f"{k:20s} "
                + (
                    "; ".join(
                        f"{f} {d['relative_change']:.1%} ({d['shipped']} -> {d['replayed']})"
                        for f, d in v.items()
                    )
                    or "reproduced"
                )
                for k, v in moved.items()
            )
        )
        return 0
    groups = [g for _, g, _, _ in GROUPS if g in by_group]
    maxiter = args.maxiter
    args.base = args.base or ("shipped" if args.quick else "replay")
    if args.quick:
        groups, maxiter = [QUICK_GROUP], maxiter or QUICK_MAXITER
    elif args.groups:
        groups = [g.strip() for g in args.groups.split(",") if g.strip()]
        unknown = [g for g in groups if g not in by_group]
        if unknown:
            ap.error(f"unknown or empty groups: {', '.join(unknown)} (see --list-groups)")

    with contextlib.ExitStack() as stack:
        base = stack.enter_context(replayed_systems(maxiter)) if args.base == "replay" else SHIPPED
        rows, extra = _folds(args, groups, by_group, base, maxiter)
    out = summary(rows, {**extra, "base": args.base, "maxiter": maxiter})
    if args.write_bands:
        write_bands(out["runs"])
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{'group':28s} {'n':>4s} {'MAPE':>8s} {'signed':>8s}")
    for g, st in out["groups"].items():
        print(f"{g:28s} {st['n']:4d} {st['mape_pct']:7.2f}% {st['mean_signed_error_pct']:+7.2f}%")
    print(
        f"{'all':28s} {out['n_runs']:4d} {out['mape_pct']:7.2f}% {out['mean_signed_error_pct']:+7.2f}%"
        f"  (max {out['max_abs_error_pct']:.2f}%; mean over groups {out['group_mean_mape_pct']:.2f}%)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
