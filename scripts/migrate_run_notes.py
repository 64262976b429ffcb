"""One-time migration: the facts `paraplan validate` used to read from a run's free-text `notes` (and the year
and a few phrases of its `source`), written as the typed fields of the run schema (`optimizer.schema.run`:
`software:` and `model.architecture:`).

Kept as documentation of how the typed facts of the published runs were first transcribed: every regex below
is
the one `optimizer/io/runs.py` applied to the notes before the facts were typed, with the same conditions, so
the
mapping of every run is unchanged. Records of `problems/runs/*.yaml` are rewritten in place through a
ruamel.yaml
round trip (comments kept); the records of a runs file the project does not own
(`../shared/calibration/*.yaml`)
get a sidecar `problems/runs/facts/<stem>.yaml` (run id -> facts) that `load_runs` merges. Running it again
stops at a project record that holds facts already and rewrites the sidecars.

    PYTHONPATH=. python scripts/migrate_run_notes.py [--dry-run]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import yaml  # noqa: E402
from grid_fit import round_trip  # noqa: E402

SHARED = ROOT.parent / "shared" / "calibration"
PROJECT_RUNS = ROOT / "problems" / "runs"
FACTS = PROJECT_RUNS / "facts"
FEATURE_FLASH_YEAR = 2023


def run_year(run: dict) -> int | None:
    years = [int(y) for y in re.findall(r"(?<!\d)(20[0-3]\d)(?!\d)", f"{run.get('source', '')}")]
    return min(years) if years else None


def framework_of(run: dict) -> str:
    """The framework, from the words the stack used to be read from (source and notes), the Megatron family
    told apart by the source's name for it."""
    txt = f"{run.get('source') or ''} {run.get('notes') or ''}".lower()
    if "torchtitan" in txt:
        return "torchtitan"
    if "llm-foundry" in txt or "composer" in txt:
        return "llm-foundry"
    if "deepspeed" in txt:
        return "deepspeed"
    src = f"{run.get('source') or ''}".lower()
    if "megatron-bridge" in src:
        return "megatron-bridge"
    if "nemo" in src:
        return "nemo"
    if "megatron-lm" in src or "megatron" in src:
        return "megatron-lm"
    return "megatron-core"


def facts_of(run: dict) -> tuple[dict, dict]:
    """(software facts, architecture facts) of one record, as the old notes-reading code resolved them."""
    notes = f"{run.get('notes') or ''}".lower()
    source = f"{run.get('source') or ''}"
    m, par = run["model"], run["parallel"]
    moe = bool(m.get("moe"))
    year = run_year(run)
    fw = framework_of(run)
    sw: dict = {"framework": fw}
    rel = re.search(r"(\d\d\.\d\d(?:\.\d+)?) NeMo Container", source)
    if rel:
        sw["release"] = f"NeMo {rel.group(1)}"
    if year is not None:
        sw["year"] = year
    # attention: as `_era` and `_attention` resolved it, written where the notes or the source named a kernel
    flash = ("flash" in notes) or year is None or year >= FEATURE_FLASH_YEAR
    attention = "flash" if flash else "standard"
    bench = "llm-foundry scripts/train/benchmarking" in source
    if flash and ("attn_impl triton" in notes or bench):
        attention = "flash-triton"
    if attention == "flash" and (
        "flashattention-2" in notes or (fw == "torchtitan" and not re.search(r"cudnn|fa3", notes))
    ):
        attention = "flash2"
    if re.search(r"flash|attn_impl triton|cudnn|fa3", notes) or bench:
        sw["attention"] = attention
    eager = "eager" in notes
    if eager:
        sw["eager"] = True
    if "not compiled" in notes and not eager:
        sw["fused_loss"] = False
    prec = par.get("precision") or ("fp16" if year is not None and year <= 2022 else "bf16")
    if prec == "fp8" and "current scaling" in notes:
        sw["fp8_recipe"] = "current"
    if re.search(r"full-iteration cuda graphs|cuda_graph_impl[ =]*full_iteration", notes):
        sw["cuda_graphs"] = "full"
    elif re.search(r"te cuda graphs", notes):
        sw["cuda_graphs"] = "partial"
    off = re.search(r"cpu_offloading_num_layers\s*=\s*(\d+)", notes)
    if off:
        sw["activation_offload_layers"] = int(off.group(1))
    disp = re.search(r"deepep|hybridep", notes)
    if moe and disp:
        sw["moe_dispatcher"] = disp.group(0)
    if moe and re.search(r"a2a overlap on", notes):
        sw["moe_a2a_overlap"] = True
    if moe and re.search(r"fused grouped mlp|op fuser", notes):
        sw["moe_fused_mlp"] = True
    mods = re.search(r"recompute_modules \[([^\]]*)\]", notes)
    if par.get("recompute") == "selective" and mods:
        sw["recompute_modules"] = re.findall(r"'([a-z_]+)'", mods.group(1))
    if re.search(r"tp[_ ]comm[_ ]overlap on|comm overlap on", notes):
        sw["tp_comm_overlap"] = True
    elif re.search(r"no async tp|tp[_ ]comm[_ ]overlap off|comm overlap (?:off|disabled)", notes):
        sw["tp_comm_overlap"] = False
    if "not overlapped" in notes:
        sw["dp_comm_overlap"] = False
    if ("performance summary" in source.lower() and prec != "fp16") or (
        prec == "bf16" and "gradients reduced in bf16" in notes
    ):
        sw["grad_reduce_dtype"] = "bf16"
    arch: dict = {}
    x = re.search(r"mla \(q_lora (\d+), kv_lora (\d+), qk_nope (\d+) \+ qk_rope (\d+), v_head (\d+)", notes)
    if x:
        q, kv, nope, rope, v = map(int, x.groups())
        arch["mla"] = {
            "q_lora_rank": q,
            "kv_lora_rank": kv,
            "qk_nope_head_dim": nope,
            "qk_rope_head_dim": rope,
            "v_head_dim": v,
        }
    dense = re.search(r"dense with ffn (\d+)", notes)
    if moe and dense:
        arch["dense_ffn"] = int(dense.group(1))
    win = re.search(r"(\d+)-token sliding-window attention and full attention \((\d+) each\)", notes)
    if win:
        arch["sliding_window"] = {"tokens": int(win.group(1)), "layers": int(win.group(2))}
    if "attention sinks" in notes:
        arch["attention_sinks"] = True
    clamp = re.search(r"clamped swiglu \(limit (\d+(?:\.\d+)?)\)", notes)
    if clamp:
        arch["activation_clamp"] = float(clamp.group(1))
    return sw, arch


def _block(key: str, facts: dict, indent: int) -> list[str]:
    """`key:` and its facts as block-style YAML lines at `indent` spaces (nested mappings in block style,
    lists in
    flow style)."""
    pad = " " * indent
    out = [f"{pad}{key}:\n"]
    for k, v in facts.items():
        if isinstance(v, dict):
            out += _block(k, v, indent + 2)
        else:
            text = yaml.safe_dump(v, default_flow_style=True, width=4096).strip()
            out.append(f"{pad}  {k}: {text.removesuffix(chr(10) + '...').removesuffix(' ...')}\n")
    return out


def migrate_project_file(path: Path, dry: bool) -> int:
    """Insert `software:` before each record's `tier:` and `architecture:` at the end of its `model:` block
    (before `hardware:`) as text, so that every other byte of the file, comments and line folding included,
    stays."""
    lines = path.read_text().splitlines(keepends=True)
    data = yaml.safe_load("".join(lines))
    starts = [i for i, ln in enumerate(lines) if ln.startswith("- id:")] + [len(lines)]
    assert len(starts) - 1 == len(data), path
    out = lines[: starts[0]]
    for rec, a, b in zip(data, starts, starts[1:], strict=False):  # starts holds one more (the end)
        seg = lines[a:b]
        assert not any(ln.startswith("  software:") for ln in seg), f"{rec['id']}: migrated already"
        sw, arch = facts_of(rec)
        hw = next(i for i, ln in enumerate(seg) if ln.startswith("  hardware:"))
        tier = next(i for i, ln in enumerate(seg) if ln.startswith("  tier:"))
        out += seg[:hw] + (_block("architecture", arch, 4) if arch else []) + seg[hw:tier]
        out += _block("software", sw, 2) + seg[tier:]
    text = "".join(out)
    check = yaml.safe_load(text)
    for rec, new in zip(data, check, strict=True):
        sw, arch = facts_of(rec)
        assert new["software"] == sw and new["model"].get("architecture", {}) == arch, rec["id"]
        new.pop("software")
        new["model"].pop("architecture", None)
        assert new == rec, f"{rec['id']}: a field other than the facts changed"
    if not dry:
        path.write_text(text)
    return len(data)


def write_sidecar(path: Path, dry: bool) -> int:
    from ruamel.yaml.comments import CommentedMap

    rt = round_trip()
    data = rt.load(path.read_text())
    out = CommentedMap()
    for rec in data:
        sw, arch = facts_of(rec)
        entry = {"software": sw}
        if arch:
            entry["architecture"] = arch
        out[rec["id"]] = entry
    head = (
        f"Typed facts of the runs of ../shared/calibration/{path.name} (a file the project does not own), "
        "run id ->\nsoftware and model architecture (optimizer.schema.run.RunFacts). Transcribed from each "
        "run's source\n(first from its notes by scripts/migrate_run_notes.py), reviewable, never fitted: "
        "load_runs merges them\ninto the records of that file; an id here that the file does not hold is an "
        "error."
    )
    out.yaml_set_start_comment(head)
    if not dry:
        FACTS.mkdir(exist_ok=True)
        with (FACTS / path.name).open("w") as f:
            rt.dump(out, f)
    return len(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args()
    for p in sorted(PROJECT_RUNS.glob("*.yaml")):
        print(f"{p.relative_to(ROOT)}: {migrate_project_file(p, a.dry_run)} records")
    for p in sorted(SHARED.glob("*.yaml")):
        print(f"facts/{p.name}: {write_sidecar(p, a.dry_run)} records")


if __name__ == "__main__":
    main()
