"""One GPU report (tools/gpu_report.py): the detector and layer measurements a lent GPU is for,
each printed beside what the CPU predicted for it, and written the moment it is measured.

    python tools/gpu_report.py --output gpu_report/                  # on one H100/H200
    python tools/gpu_report.py --device cpu --dry-run --output /tmp/r # tiny sizes, under a minute

Sections, in this order, each skipped (and recorded as skipped) when what is left of
``--budget-s`` is less than its estimate:

0. predictions (on the CPU): each detector's peak memory at the GPU size, from the bytes autograd
   saves for backward (``torch.autograd.graph.saved_tensors_hooks``) in one forward of one image
   at two small sizes, fitted as a + b x pixels per image and extrapolated to the GPU's size and
   images, plus the parameter gradients; the backbone + FPN FLOPs of a step (fvcore's counter
   at the larger small size, scaled by pixels and images, x3 for forward + backward); the same
   saved-tensor count for the lambda layers at their GPU shapes. fvcore's tracer fails on the
   meta device (its conv shape checks get tensors), hence real tensors at small sizes.
a. lambda_r152_mask_rcnn vs r152_mask_rcnn, bf16 eager training step (targets: <= 1.15x the
   twin's time, <= 1.10x its peak memory).
b. the same with MODEL.LAMBDA_RESNET.COMPILE (target: <= 1.05x the compiled twin's time).
c. lambda_det's lambda layer against timm's at c4 and c5 of a 1024 input, bf16, eager (target:
   >= 2x timm's speed) and compiled with CUDA graphs (>= 3x).
d. fp32, the 101 pair, the largest batch that fits, and a torch profile of one LambdaResNet
   step (top kernels, the lambda layers' share) in profile.txt.

Times are interleaved rounds (:func:`benchmarks.harness.run_round_robin`), ratios medians of
per-round ratios, memory :func:`benchmarks.memory.peak_bytes`. Output: ``results.jsonl`` (one
JSON object per line, appended as each result comes) and ``summary.md`` (rewritten after each).
"""

import json
import subprocess
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from benchmarks.harness import Step, machine_description, paired_ratio
from benchmarks.memory import saved_bytes, saved_storage_bytes
from lambda_det.compat import CHECKOUT
from lambda_det.utils.atomic import atomic_write

RESULTS, SUMMARY, PROFILE = "results.jsonl", "summary.md", "profile.txt"
TINY = [  # the dry run's detectors: LambdaResNet-26 at a quarter width, lambda layers in c4/c5
    "MODEL.LAMBDA_RESNET.WIDTH_MULTIPLIER",
    "0.25",
    "MODEL.LAMBDA_RESNET.SCOPE",
    "3",
    "MODEL.LAMBDA_RESNET.PLACEMENT",
    "c4",
]
TINY_TWIN = "lambda_r26_shapes:MODEL.LAMBDA_RESNET.PLACEMENT=none"


@dataclass
class Plan:
    """What each section runs; :func:`gpu_plan` and :func:`dry_run_plan` are the two in use."""

    device: str
    pair_152: Tuple[str, str]  # (twin, lambda): the twin is the ratios' baseline
    pair_101: Tuple[str, str]
    opts: Sequence[str] = ()
    size: Optional[int] = None  # None: the config's training size
    images: int = 4
    prediction_sizes: Tuple[int, int] = (256, 384)
    layer_shapes: Sequence[str] = ("c4_1024", "c5_1024")
    layer_batch: int = 4
    warmup: int = 2
    rounds: int = 5
    max_batch: int = 16
    compile: bool = True  # sections b and c's compiled half
    budgets: Dict[str, float] = field(default_factory=dict)  # section -> estimated seconds


def gpu_plan(device: str = "cuda") -> Plan:
    return Plan(
        device,
        ("r152_mask_rcnn", "lambda_r152_mask_rcnn"),
        ("r101_mask_rcnn", "lambda_r101_mask_rcnn"),
        budgets={"predictions": 90, "a": 60, "b": 180, "c": 60, "d": 90},
    )


def dry_run_plan(device: str = "cpu") -> Plan:
    """Tiny sizes, one round: every section's code runs in seconds on the CPU. Compiling
    takes minutes there, so the compiled halves are recorded as skipped unless on a GPU."""
    return Plan(
        device,
        (TINY_TWIN, "lambda_r26_shapes"),
        (TINY_TWIN, "lambda_r26_shapes"),
        opts=TINY,
        size=96,
        images=1,
        prediction_sizes=(64, 96),  # c5 at 2 x 2 and 3 x 3: batch norm needs > 1 value
        layer_shapes=("c5_224",),
        layer_batch=1,
        warmup=0,
        rounds=1,
        max_batch=2,
        compile=device.startswith("cuda"),
        budgets={"predictions": 1, "a": 1, "b": 1, "c": 1, "d": 1},
    )


def git_commit(checkout: Path = CHECKOUT) -> Optional[str]:
    """HEAD of the checkout (with "+dirty" when files differ from it), or None without git."""
    try:
        head = subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


class Report:
    """Appends each record to results.jsonl and rewrites summary.md after each, so a run cut
    off at any point leaves what it measured."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.records: List[Dict[str, object]] = []
        self.lines: List[str] = ["# GPU report", ""]

    def add(self, record: Dict[str, object], line: Optional[str] = None) -> None:
        self.records.append(record)
        with open(self.folder / RESULTS, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
        if line is not None:
            print(line, flush=True)
            self.lines.append(line)
        atomic_write(self.folder / SUMMARY, "\n".join(self.lines) + "\n", "--output")


def _mib(value: Optional[float]) -> str:
    return "-" if value is None else f"{value / 2**20:.0f} MiB"


def target_line(name: str, value: Optional[float], limit: float, at_most: bool) -> Dict:
    """A target's record: met, missed, or not measured (value None)."""
    if value is None:
        verdict = "not measured"
    else:
        verdict = "met" if (value <= limit if at_most else value >= limit) else "missed"
    return {
        "kind": "target",
        "target": name,
        "value": value,
        "limit": limit,
        "at_most": at_most,
        "verdict": verdict,
    }


def _format_target(record: Dict) -> str:
    value = "-" if record["value"] is None else f"{record['value']:.3f}"
    sign = "<=" if record["at_most"] else ">="
    return f"- target {record['target']}: {value} ({sign} {record['limit']}): {record['verdict']}"


# ---- predictions on the CPU ----


def _detector_cfg(spec: str, opts: Sequence[str], device: str):
    from benchmarks.detector import parse_config_spec
    from lambda_det.run_config import load_config

    name, overrides = parse_config_spec(spec)
    return load_config(name, [*opts, *overrides, "MODEL.DEVICE", device])


def _saved_forward_bytes(model, batch, dtype: Optional[torch.dtype]) -> int:
    """Bytes autograd keeps for backward over one training forward (parameters excluded)."""
    from detectron2.utils.events import EventStorage

    with (
        EventStorage(),
        torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None),
    ):
        return saved_storage_bytes(lambda: model(batch), model.parameters())


def predict_detector(
    spec: str, opts: Sequence[str], precision: str, sizes: Tuple[int, int], size: int, images: int
) -> Dict[str, object]:
    """CPU predictions for one detector at ``images`` x ``size`` px (see the module's doc)."""
    from benchmarks.detector import PRECISIONS, synthetic_batch
    from benchmarks.modes import _fvcore_flops
    from lambda_det.engine.amp import AMP_DTYPES
    from lambda_det.engine.trainer import Trainer

    cfg = _detector_cfg(spec, opts, "cpu")
    torch.manual_seed(0)
    model = Trainer.build_model(cfg).train()
    dtype = AMP_DTYPES[PRECISIONS[precision]] if PRECISIONS[precision] else None
    cpu = torch.device("cpu")
    saved = [
        _saved_forward_bytes(model, synthetic_batch(cfg, 1, side, 4, cpu), dtype) for side in sizes
    ]
    per_pixel = (saved[1] - saved[0]) / (sizes[1] ** 2 - sizes[0] ** 2)
    per_image = saved[0] + per_pixel * (size**2 - sizes[0] ** 2)
    gradients = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    x = torch.zeros(1, 3, sizes[1], sizes[1])
    flops = _fvcore_flops(model.backbone, x)
    return {
        "kind": "prediction",
        "candidate": spec,
        "precision": precision,
        "size": size,
        "images": images,
        "saved_bytes_at": dict(zip(map(str, sizes), saved)),
        "saved_bytes_per_image": per_image,
        "gradient_bytes": gradients,
        "peak_bytes": images * per_image + gradients,
        "backbone_step_flops": None
        if flops is None
        else 3 * flops * images * (size / sizes[1]) ** 2,
    }


def predict_layers(shapes: Sequence[str], batch: int) -> List[Dict[str, object]]:
    """Saved-tensor bytes of lambda_det's tiled lambda layer and timm's at the GPU shapes (real
    size, CPU, bf16 autocast), and the useful FLOPs both are credited with."""
    from benchmarks import candidates as layer_zoo
    from lambda_det.layers import LambdaLayer

    records = []
    for shape in shapes:
        height, width, channels = layer_zoo.SHAPES[shape]
        x = torch.randn(batch, channels, height, width, requires_grad=True)
        for name, build in (
            ("lambda_det tiled", lambda: LambdaLayer(channels, impl="tiled")),
            (layer_zoo.TIMM, lambda: layer_zoo._timm_layer(channels)),
        ):
            step = Step(build().train(), x, torch.bfloat16)
            records.append(
                {
                    "kind": "prediction",
                    "candidate": f"{name} {shape}",
                    "saved_bytes": saved_bytes(step),
                    "useful_flops": layer_zoo.useful_flops(height, width, channels, batch),
                }
            )
    return records


# ---- measurements ----


def measure_pair(plan: Plan, pair: Tuple[str, str], precision: str, mode: str, max_batch=0):
    """Rows of benchmarks.detector for (twin, lambda): ms per image, ratio to the twin, peak."""
    from benchmarks.detector import DetectorSettings, benchmark_detector

    settings = DetectorSettings(
        configs=list(pair),
        opts=list(plan.opts),
        ims_per_device=plan.images,
        precisions=[precision],
        modes=[mode],
        size=plan.size,
        device=plan.device,
        warmup=plan.warmup,
        rounds=plan.rounds,
        max_batch=max_batch,
    )
    return benchmark_detector(settings)["rows"]


def measure_layers(plan: Plan, compiled: bool) -> List[Dict[str, object]]:
    """lambda_det's tiled layer against timm's, per shape: medians and the per-round ratio."""
    from benchmarks import candidates as layer_zoo
    from benchmarks.modes import LayerSettings, benchmark_layers

    settings = LayerSettings(
        torch.device(plan.device),
        "bf16",
        tuple(plan.layer_shapes),
        ["lambda_det tiled", layer_zoo.TIMM],
        plan.layer_batch,
        repetitions=plan.rounds,
        warmup=plan.warmup + (2 if compiled else 0),
        compile="reduce-overhead" if compiled else None,
    )
    results = benchmark_layers(settings)
    rows = []
    for shape, table in results["shapes"].items():
        by_name = {row["name"]: row for row in table["rows"]}
        ours, timm = by_name["lambda_det tiled"], by_name[layer_zoo.TIMM]
        rows.append(
            {
                "shape": shape,
                "ms": None if ours["median_s"] is None else 1e3 * ours["median_s"],
                "timm_ms": None if timm["median_s"] is None else 1e3 * timm["median_s"],
                "speedup_vs_timm": paired_ratio(timm["times_s"], ours["times_s"]),
                "peak_bytes": ours["peak_bytes"],
                "timm_peak_bytes": timm["peak_bytes"],
            }
        )
    return rows


def profile_step(plan: Plan, spec: str, precision: str, path: Path) -> float:
    """One profiled step of ``spec``: the top kernels by device (or CPU) time into ``path``;
    returns the share of the step in the lambda layers."""
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.detector import DetectorStep, lambda_layer_share, synthetic_batch

    device = torch.device(plan.device)
    cfg = _detector_cfg(spec, plan.opts, plan.device)
    size = plan.size or cfg.INPUT.LSJ.IMAGE_SIZE
    torch.manual_seed(0)
    step = DetectorStep(cfg, synthetic_batch(cfg, plan.images, size, 4, device), precision)
    step()  # warm-up: cuDNN's choices, the optimizer's state
    on_gpu = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities) as profiler:
        step()
        if on_gpu:
            torch.cuda.synchronize(device)
    sort = "self_cuda_time_total" if on_gpu else "self_cpu_time_total"
    table = profiler.key_averages().table(sort_by=sort, row_limit=25)
    share = lambda_layer_share(step)
    atomic_write(
        path,
        f"{spec}, {precision}, {plan.images} x {size} px, {plan.device}\n"
        f"lambda layers' share of the step: {share:.1%}\n\n{table}\n",
        "--output",
    )
    return share


# ---- the run ----


def _row_line(section: str, row: Dict, prediction: Optional[Dict]) -> str:
    ms = "-" if row["seconds_per_image"] is None else f"{row['seconds_per_image'] * 1e3:.1f}"
    predicted = "" if prediction is None else f" (CPU predicted {_mib(prediction['peak_bytes'])})"
    ratio = "-" if row["ratio"] is None else f"{row['ratio']:.3f}"
    return (
        f"- {section} {row['name']}: {ms} ms/image, x{ratio} twin, peak "
        f"{_mib(row['peak_bytes'])}{predicted}"
        + (f", largest batch {row['largest_batch']}" if row.get("largest_batch") else "")
        + (f", error {row['error']}" if row["error"] else "")
    )


def _pair_targets(section: str, rows, time_limit: float, memory_limit: Optional[float]):
    twin, ours = rows
    records = [target_line(f"{section} time x twin", ours["ratio"], time_limit, True)]
    if memory_limit is not None:
        memory = (
            ours["peak_bytes"] / twin["peak_bytes"]
            if ours["peak_bytes"] and twin["peak_bytes"]
            else None
        )
        records.append(target_line(f"{section} peak memory x twin", memory, memory_limit, True))
    return records


def run_report(plan: Plan, folder: Path, budget_s: float, dry_run: bool) -> Report:
    """Every section that fits in ``budget_s``, each result written as it comes."""
    began = time.monotonic()
    report = Report(folder)
    machine = machine_description(torch.device(plan.device))
    header = {
        "kind": "header",
        "dry_run": dry_run,
        "device": plan.device,
        "gpu": machine.get("gpu"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "commit": git_commit(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "budget_s": budget_s,
        "machine": machine,
    }
    report.add(
        header,
        f"{header['date']}, {plan.device} ({header['gpu'] or 'no GPU'}), torch "
        f"{header['torch']}, CUDA {header['cuda']}, commit {header['commit']}"
        + (", dry run (tiny sizes: no figure here says anything about a GPU)" if dry_run else ""),
    )
    predictions: Dict[Tuple[str, str], Dict] = {}

    def section(name: str, title: str, body: Callable[[], None]) -> None:
        left = budget_s - (time.monotonic() - began)
        estimate = plan.budgets.get(name, 0)
        if left < estimate:
            report.add(
                {"kind": "skipped", "section": name, "left_s": left, "estimate_s": estimate},
                f"- {name}: skipped, {left:.0f} s of the budget left, it needs ~{estimate:.0f} s",
            )
            return
        report.lines += ["", f"## {name}. {title}", ""]
        print(f"== {name}. {title}", flush=True)
        start = time.monotonic()
        body()
        report.add(
            {"kind": "section", "section": name, "seconds": time.monotonic() - start},
            f"({name} took {time.monotonic() - start:.0f} s)",
        )

    size = plan.size or 1024

    def predict() -> None:
        for pair, precision, images in (
            (plan.pair_152, "bf16", plan.images),
            (plan.pair_101, "fp32", plan.images),
        ):
            for spec in pair:
                if (spec, precision) in predictions:
                    continue
                record = predict_detector(
                    spec, plan.opts, precision, plan.prediction_sizes, size, images
                )
                predictions[(spec, precision)] = record
                flops = record["backbone_step_flops"]
                report.add(
                    record,
                    f"- predicted {spec} {precision}: peak {_mib(record['peak_bytes'])} at "
                    f"{images} x {size} px ({_mib(record['saved_bytes_per_image'])} saved per "
                    f"image), backbone+FPN step "
                    + ("-" if flops is None else f"{flops / 1e9:.1f} GFLOP"),
                )
        for record in predict_layers(plan.layer_shapes, plan.layer_batch):
            report.add(
                record,
                f"- predicted {record['candidate']}: saved {_mib(record['saved_bytes'])}, "
                f"useful {record['useful_flops'] / 1e9:.1f} GFLOP forward + backward",
            )

    def pair_section(name: str, pair, precision: str, mode: str, time_limit, memory_limit):
        rows = measure_pair(plan, pair, precision, mode)
        for row in rows:
            record = {"kind": "measurement", "section": name, **row}
            report.add(record, _row_line(name, row, predictions.get((row["config"], precision))))
        for record in _pair_targets(name, rows, time_limit, memory_limit):
            report.add(record, _format_target(record))

    def layers() -> None:
        for compiled, limit in ((False, 2.0), (True, 3.0)):
            label = "compiled" if compiled else "eager"
            if compiled and not plan.compile:
                report.add(
                    {"kind": "skipped", "section": "c compiled", "why": "dry run on the CPU"},
                    "- c compiled: skipped (compiling takes minutes on the CPU)",
                )
                continue
            for row in measure_layers(plan, compiled):
                report.add(
                    {"kind": "measurement", "section": f"c {label}", **row},
                    f"- c {label} {row['shape']}: {row['ms']:.2f} ms vs timm "
                    f"{row['timm_ms']:.2f} ms, peak {_mib(row['peak_bytes'])} vs timm "
                    f"{_mib(row['timm_peak_bytes'])}",
                )
                record = target_line(
                    f"c {label} {row['shape']} x timm speed", row["speedup_vs_timm"], limit, False
                )
                report.add(record, _format_target(record))

    def compiled_pair() -> None:
        if not plan.compile:
            report.add(
                {"kind": "skipped", "section": "b", "why": "dry run on the CPU"},
                "- b: skipped (compiling takes minutes on the CPU)",
            )
            return
        pair_section("b", plan.pair_152, "bf16", "compiled", 1.05, None)

    def fp32_101() -> None:
        rows = measure_pair(plan, plan.pair_101, "fp32", "eager", max_batch=plan.max_batch)
        for row in rows:
            report.add(
                {"kind": "measurement", "section": "d", **row},
                _row_line("d", row, predictions.get((row["config"], "fp32"))),
            )
        share = profile_step(plan, plan.pair_152[1], "bf16", folder / PROFILE)
        report.add(
            {"kind": "profile", "candidate": plan.pair_152[1], "lambda_share": share},
            f"- profile of one {plan.pair_152[1]} bf16 step: lambda layers {share:.1%} "
            f"(top kernels in {PROFILE})",
        )

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # detectron2's and torch's deprecation notes
        section("predictions", "CPU predictions at the GPU sizes", predict)
        section(
            "a",
            "152 pair, bf16, eager",
            lambda: pair_section("a", plan.pair_152, "bf16", "eager", 1.15, 1.10),
        )
        section("b", "152 pair, bf16, MODEL.LAMBDA_RESNET.COMPILE", compiled_pair)
        section("c", "lambda layer vs timm's, bf16", layers)
        section("d", "101 pair, fp32, largest batch; profile", fp32_101)
    report.add({"kind": "done", "seconds": time.monotonic() - began}, "")
    return report


def main(argv=None) -> int:
    import argparse

    from lambda_det.cli.arguments import add_debug_argument, reporting_user_errors
    from lambda_det.cli.output_dir import run_owner
    from lambda_det.utils.atomic import (
        check_output_file,
        check_writable_folder,
        reporting_write_errors,
    )
    from lambda_det.utils.errors import UserError

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True, help="folder for results.jsonl, summary.md")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes, one round")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=480,
        help="skip a section when less than its estimate is left (default 480: 8 minutes)",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace an earlier report in --output"
    )
    add_debug_argument(parser)
    args = parser.parse_args(argv)
    output = Path(args.output)
    with reporting_user_errors(args.debug):
        if not args.dry_run and torch.device(args.device).type != "cuda":
            raise UserError(
                f"--device {args.device}: the full report is for a GPU (1024 px, Mask R-CNN "
                "152); on the CPU pass --dry-run"
            )
        if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
            raise UserError(f"--device {args.device}, but torch sees no GPU: pass --device cpu")
        if args.budget_s <= 0:
            raise UserError(f"--budget-s must be > 0 seconds, got {args.budget_s}")
        for name in (RESULTS, SUMMARY, PROFILE):  # before minutes of measurements
            path = output / name
            check_output_file(path, args.overwrite, owner=run_owner(path))
        check_writable_folder(output, "--output")
        with reporting_write_errors(output, "--output"):
            output.mkdir(parents=True, exist_ok=True)
            for name in (RESULTS, PROFILE):  # results.jsonl is appended to: start it empty
                if (output / name).exists():
                    (output / name).unlink()
            plan = dry_run_plan(args.device) if args.dry_run else gpu_plan(args.device)
            run_report(plan, output, args.budget_s, args.dry_run)
    print(f"wrote {output / RESULTS} and {output / SUMMARY}")
    return 0
