"""AP-by-object-size tables in the layout of the paper's Table 14, and a bar chart.

A run's results are read from ``eval_results.json`` (written by tools/train_net.py) or from
detectron2's ``metrics.json`` (the last logged ``bbox/AP``... values). COCO reports AP in percent;
APs/APm/APl are AP over objects of area < 32^2, 32^2..96^2 and > 96^2 pixels (maxDets 100).
"""

import json
import math
import os
from pathlib import Path
from typing import Dict, Mapping, Optional

from lambda_det.reports.plots import plot_ap_bars
from lambda_det.utils.errors import MissingFileError, UserError
from lambda_det.utils.text import read_text

__all__ = [
    "DETECTRON2_LSJ_BASELINES",
    "PAPER_TABLE_14",
    "SIZE_METRICS",
    "load_results",
    "format_ap_table",
    "plot_ap_by_size",
]

Results = Dict[str, Dict[str, float]]  # task ("bbox" / "segm") -> metric -> value

SIZE_METRICS = ("AP", "APs", "APm", "APl")
TASKS = (("bbox", "bb"), ("segm", "mask"))

# LambdaNetworks paper, Table 14: Mask R-CNN on COCO val2017, 1024x1024, from scratch.
PAPER_TABLE_14: Dict[str, Results] = {
    name: {"bbox": dict(zip(SIZE_METRICS, bbox)), "segm": dict(zip(SIZE_METRICS, segm))}
    for name, bbox, segm in [
        ("ResNet-101", (48.2, 29.9, 50.9, 64.9), (42.6, 24.2, 45.6, 60.0)),
        ("ResNet-101 + SE", (48.5, 29.9, 51.5, 65.3), (42.8, 24.0, 46.0, 60.2)),
        ("LambdaResNet-101", (49.4, 31.7, 52.2, 65.6), (43.5, 25.9, 46.5, 60.8)),
        ("ResNet-152", (48.9, 29.9, 51.8, 66.0), (43.2, 24.2, 46.1, 61.2)),
        ("ResNet-152 + SE", (49.4, 30.0, 52.3, 66.7), (43.5, 24.6, 46.8, 61.8)),
        ("LambdaResNet-152", (50.0, 31.8, 53.4, 67.0), (43.9, 25.5, 47.3, 62.0)),
    ]
}

# Reference rows, not the paper's: detectron2's from-scratch Mask R-CNN baselines with large-scale
# jitter (MODEL_ZOO.md, "New baselines using Large-Scale Jitter and Longer Training Schedule",
# configs/new_baselines/mask_rcnn_R_*_FPN_*ep_LSJ.py; one epoch = 118000 images). It quotes box
# and mask AP only, so their APs/m/l cells are empty.
DETECTRON2_LSJ_BASELINES: Dict[str, Results] = {
    f"R-{depth}-FPN LSJ {epochs} ep": {"bbox": {"AP": bbox}, "segm": {"AP": segm}}
    for depth, epochs, bbox, segm in [
        (50, 100, 44.6, 40.3),
        (50, 200, 46.3, 41.7),
        (50, 400, 47.4, 42.5),
        (101, 100, 46.4, 41.6),
        (101, 200, 48.0, 43.1),
        (101, 400, 48.9, 43.7),
    ]
}
REFERENCE_SUFFIX = "(detectron2 reference)"


def load_results(path: str, dataset: Optional[str] = None) -> Results:
    """Results of one run from a run folder, an ``eval_results.json`` or a ``metrics.json``.

    Args:
        dataset: which test dataset's results, when the run evaluated several (eval_results.json
            only; metrics.json keeps the last one).
    """
    path = Path(path)
    if path.is_dir():
        for name in ("eval_results.json", "metrics.json"):
            if (path / name).is_file():
                return load_results(str(path / name), dataset)
        raise MissingFileError(f"{path} has neither eval_results.json nor metrics.json")
    if not path.is_file():
        raise MissingFileError(f"no results file at {path}")
    fix = "pass a run's folder, its eval_results.json or its metrics.json"
    text = read_text(path, fix)
    if path.name == "metrics.json":  # one JSON object per line; keep the last value of each key
        results: Results = {}
        for line_number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise UserError(f"{path}:{line_number} is not JSON: {error}") from error
            if not isinstance(record, dict):
                raise UserError(f"{path}:{line_number} is not a JSON object: {fix}")
            for key, value in record.items():
                task, _, metric = key.partition("/")
                if task in ("bbox", "segm") and metric:
                    results.setdefault(task, {})[metric] = value
        if not results:
            raise UserError(f"{path} has no bbox/ or segm/ metrics: was the run evaluated?")
        return _checked(results, path)
    try:
        record = json.loads(text)
        per_dataset = record["results"]
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise UserError(
            f"{path} is not an eval_results.json written by train_net.py: {error}"
        ) from error
    if not isinstance(per_dataset, dict):
        raise UserError(
            f"{path} is not an eval_results.json written by train_net.py: its "
            f"'results' is {type(per_dataset).__name__}, not a mapping"
        )
    # {dataset: {task: metrics}} from DefaultTrainer.test, or {task: metrics} for one dataset.
    if any(task in per_dataset for task, _ in TASKS):
        return _checked(per_dataset, path)
    if dataset is None and len(per_dataset) == 1:
        return _checked(next(iter(per_dataset.values())), path)
    if dataset not in per_dataset:
        raise UserError(
            f"{path} has results for the datasets {sorted(per_dataset)}: name one "
            f"(got dataset={dataset!r})"
        )
    return _checked(per_dataset[dataset], path)


def _checked(results, path: Path) -> Results:
    """``results`` when each of its tasks (bbox, segm) maps metrics to numbers (or null: none
    measured), with the numbers as floats; else a ValueError naming the file and the value."""
    fix = "pass the eval_results.json or metrics.json that tools/train_net.py wrote"
    if not isinstance(results, dict):
        raise UserError(
            f"{path} holds {type(results).__name__} where results by task "
            f"(bbox, segm) belong: {fix}"
        )
    checked: Results = dict(results)
    for task, metrics in results.items():
        if task not in dict(TASKS):
            continue  # another evaluator's (sem_seg, ...): not shown
        if not isinstance(metrics, dict):
            raise UserError(f"{path}: {task} is {metrics!r}, not a mapping of metrics: {fix}")
        checked[task] = {}
        for metric, value in metrics.items():
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float))
            ):
                raise UserError(f"{path}: {task}/{metric} is {value!r}, not a number: {fix}")
            checked[task][metric] = None if value is None else float(value)
    return checked


def _number(value: Optional[float]) -> str:
    if value is None:
        return "–"
    return "nan" if math.isnan(value) else f"{value:.1f}"


def _delta(value: Optional[float], reference: Optional[float]) -> str:
    if value is None or reference is None or math.isnan(value) or math.isnan(reference):
        return "–"
    return f"{value - reference:+.1f}"


def format_ap_table(
    runs: Mapping[str, Results], baseline: Optional[str] = None, paper: bool = False
) -> str:
    """A markdown table: one row per run, bbox and mask AP and APs/APm/APl, like Table 14.

    Args:
        runs: row name -> results.
        baseline: a row name; every other row then shows its differences to it in parentheses.
        paper: append the paper's Table 14 rows, then detectron2's LSJ baselines as reference
            rows (what a modern from-scratch ResNet reaches).
    """
    rows = dict(runs)
    if paper:
        rows.update({f"{name} (paper)": results for name, results in PAPER_TABLE_14.items()})
        rows.update(
            {
                f"{name} {REFERENCE_SUFFIX}": results
                for name, results in DETECTRON2_LSJ_BASELINES.items()
            }
        )
    if baseline is not None and baseline not in rows:
        raise UserError(
            f"baseline {baseline!r} is not one of the rows {list(rows)}: pass one of them"
        )
    header = "| Backbone | AP bb | APs/m/l bb | AP mask | APs/m/l mask |"
    lines = [header, "|:--|--:|:-:|--:|:-:|"]
    for name, results in rows.items():
        cells = [name]
        reference = rows[baseline] if baseline is not None and name != baseline else None
        for task, _ in TASKS:
            metrics = results.get(task, {})
            values = [metrics.get(metric) for metric in SIZE_METRICS]
            ap = _number(values[0])
            sizes = " / ".join(_number(v) for v in values[1:])
            if reference is not None:
                ref = [reference.get(task, {}).get(metric) for metric in SIZE_METRICS]
                ap += f" ({_delta(values[0], ref[0])})"
                sizes += " (" + " / ".join(_delta(v, r) for v, r in zip(values[1:], ref[1:])) + ")"
            cells += [ap, sizes]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_ap_by_size(runs: Mapping[str, Results], path: str, title: str = "COCO AP by object size"):
    """Grouped bars (AP, APs, APm, APl) per run, one panel for boxes and one for masks
    (:func:`~lambda_det.reports.plots.plot_ap_bars`); the folder is made if needed."""
    panels = {
        f"{title}: {'boxes' if label == 'bb' else 'masks'}": {
            name: [
                (results.get(task, {}).get(metric, float("nan")), None) for metric in SIZE_METRICS
            ]
            for name, results in runs.items()
        }
        for task, label in TASKS
        if any(task in results for results in runs.values())
    }
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return plot_ap_bars(panels, SIZE_METRICS, path)
