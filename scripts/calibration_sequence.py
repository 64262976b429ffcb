"""The calibration sequence behind today's system files, as data: the ordered `scripts/calibrate.py` commands
that docs/calibration.md ("The commands behind today's files") lists in prose.

Each step is one calibrate.py invocation: a fit of `params` on the runs of `gpu` in `runs` (optionally one
software `stack`, optionally on the GEMM-efficiency curve of `shape` scaled by a level or taken as it is), or
a `transfer` of `gpu`'s fitted tables to same-die systems. Steps run in this order; a step whose `shape` or
`transfer` source is refitted must be rerun after it. `scripts/crossval.py` replays the sequence with runs
held out; `argv(step, files)` is the command line a step stands for, so the same list can drive a full
recalibration.

Run files are named by key (`RUN_FILES`) so that a caller can substitute filtered copies of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "calibration"

RUN_FILES = {  # key -> path of the runs file (calibration-run schema)
    "public": SHARED / "public_runs.yaml",
    "public_2025": SHARED / "public_runs_2025.yaml",
    "llmfoundry": ROOT / "problems" / "runs" / "llmfoundry-mpt.yaml",
    "torchtitan": ROOT / "problems" / "runs" / "torchtitan-h100-h200.yaml",
    "amd": ROOT / "problems" / "runs" / "amd-rocm.yaml",
    "maxtext": ROOT / "problems" / "runs" / "maxtext-dgxc.yaml",
    "maxtext_jt": ROOT / "problems" / "runs" / "maxtext-jax-toolbox.yaml",
}
R = ("public", "public_2025")  # the two shared files, "R" in docs/calibration.md


@dataclass(frozen=True)
class Step:
    """One calibrate.py command: fit `params` for `gpu` on `runs` (keys of RUN_FILES), or, with `transfer`,
    copy `gpu`'s fitted tables into the `transfer` systems."""

    gpu: str
    runs: tuple[str, ...] = ()
    params: str = "e1,e2,e3,hbm_scale,net0_eff,net1_eff"  # calibrate.py's default
    shape: str | None = None
    stack: str | None = None
    transfer: tuple[str, ...] = field(default=())

    @property
    def writes(self) -> tuple[str, ...]:
        """The system files this step writes."""
        return self.transfer or (self.gpu,)

    @property
    def reads(self) -> tuple[str, ...]:
        """The other system files whose fitted values this step takes (its shape or transfer source)."""
        if self.transfer:
            return (self.gpu,)
        return (self.shape,) if self.shape and self.shape != self.gpu else ()


SEQUENCE: list[Step] = [
    # A100: curve, HBM and networks on the 2021-22 Megatron runs; then the flash-attention efficiency on the
    # FSDP runs (second: a full refit drops the per-stack figure; the tile overhead is derived from it, not
    # fitted); the 40GB part (same die, same 400 W, slower HBM) takes the tables as they are
    Step("a100-sxm-80gb", ("public",)),
    Step("a100-sxm-80gb", ("public", "llmfoundry"), "attention_efficiency", stack="fsdp"),
    Step("a100-sxm-80gb", transfer=("a100-sxm-40gb", "a100-sxm-80gb-opa")),
    # H100: one level on its own curve's shape (FP8's factor is measured, not fitted); transfers
    Step("h100-sxm-80gb", R, "level", shape="h100-sxm-80gb"),
    # MaxText (XLA's GEMMs and fusions) on H100: one factor on the tables above, on its own runs; fitted after
    # their predictions were committed (problems/runs/predictions/maxtext-*.json)
    Step("h100-sxm-80gb", ("maxtext", "maxtext_jt"), "stack_scale", stack="maxtext"),
    Step("h100-sxm-80gb", transfer=("h800-sxm-80gb", "h200-sxm-141gb")),
    # H100 96GB (500 W): H100's curve as it is, one clock factor and FP8
    Step("h100-sxm-96gb", ("public", "torchtitan"), "clock_scale,fp8_scale", shape="h100-sxm-80gb"),
    # Blackwell racks, then the HGX parts from their rack parts (same die, lower power): one clock factor
    Step("gb300-nvl72", R, "level,hbm_scale,nvfp4_scale", shape="h100-sxm-80gb"),
    Step("gb200-nvl72", R, "e1,e2,e3,hbm_scale,nvfp4_scale"),
    Step("gb200-nvl72", transfer=("b200-sxm-180gb",)),
    Step("b200-sxm-180gb", R, "clock_scale", shape="gb200-nvl72"),
    Step("gb300-nvl72", transfer=("b300-sxm-270gb",)),
    Step("b300-sxm-270gb", R, "clock_scale", shape="gb300-nvl72"),
    # AMD MI355X: one level on its own prior curve, from MLPerf Training v5.1 (FP8 only: a separate FP8
    # factor is not identifiable); fitted after its predictions were committed (problems/runs/predictions)
    Step("mi355x", ("amd",), "level", shape="mi355x"),
]


def argv(step: Step, files: dict[str, Path] | None = None) -> list[str]:
    """The calibrate.py arguments of `step` (after the script name), with `files` (default RUN_FILES) for its
    run-file keys; `--write` included."""
    files = files or RUN_FILES
    if step.transfer:
        return ["--gpu", step.gpu, "--transfer", *step.transfer]
    out = [*(str(files[k]) for k in step.runs), "--gpu", step.gpu, "--params", step.params]
    if step.shape:
        out += ["--shape", step.shape]
    if step.stack:
        out += ["--stack", step.stack]
    return out + ["--write"]
