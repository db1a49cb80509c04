"""The report of a backbone comparison: per variant, COCO AP over seeds (mean and sample
standard deviation), the paired difference to a baseline variant, parameters and training time
per iteration; as a dict (the JSON file), a markdown text and a bar chart with error bars.

A difference counts as "beyond the spread" only when |mean| > std of the per-seed paired
differences. That is a loose screen, not a significance test: with a few seeds it keeps the
report from ranking variants whose difference the seeds alone could produce.

A run without AP for a task (no predictions: detectron2 reports NaN, or no results for the
task) is named in the report and left out of that task's means and paired differences, whose
cells then say how many runs they rest on ("n=2 of 3"); the other runs still count.
"""

import json
import math
import statistics
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

from lambda_det.reports.ap_table import load_results
from lambda_det.reports.plots import plot_ap_bars
from lambda_det.utils.atomic import atomic_path
from lambda_det.utils.errors import UserError

__all__ = [
    "METRICS",
    "summarize",
    "format_comparison",
    "plot_comparison",
    "write_report",
    "REPORT_FILES",
    "mean_std",
    "median_iteration_time",
    "read_difference",
]

METRICS = ("AP", "AP50", "AP75", "APs", "APm", "APl")
REPORT_FILES = ("comparison.md", "comparison.json", "comparison.png")  # what write_report writes
TASK_LABELS = {"bbox": "box", "segm": "mask"}
ONE_SEED = "one seed: no spread, not a ranking"
WITHIN = "within the seed-to-seed spread"
NO_VALUE = "no value: no seed has it for both variants"


def _is_number(value) -> bool:
    return value is not None and not math.isnan(value)


def mean_std(values: Sequence[float]) -> Dict[str, Optional[float]]:
    """Mean and sample standard deviation (n - 1) of the values that are numbers, and their
    count n: NaN and None values are left out. The mean is NaN when none is left; std is None
    with fewer than two."""
    values = [value for value in values if _is_number(value)]
    n = len(values)
    if not n:
        return {"mean": math.nan, "std": None, "n": 0}
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if n > 1 else None,
        "n": n,
    }


def read_difference(mean: float, std: Optional[float]) -> str:
    """What a paired difference (variant - baseline) over seeds allows one to say."""
    if math.isnan(mean):
        return NO_VALUE
    if std is None:
        return ONE_SEED
    if abs(mean) <= std:
        return WITHIN
    return (
        "above the baseline, beyond the spread"
        if mean > 0
        else "below the baseline, beyond the spread"
    )


def median_iteration_time(run_dir: str) -> Optional[float]:
    """The median of the ``time`` entries (seconds per training iteration) in a run's
    metrics.json, or None when it logged none."""
    path = Path(run_dir) / "metrics.json"
    times = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # the last line of a run killed mid-write
                continue
            if isinstance(record, dict) and "time" in record:
                times.append(float(record["time"]))
    if not times:
        return None
    times.sort()
    middle = len(times) // 2
    return times[middle] if len(times) % 2 else (times[middle - 1] + times[middle]) / 2


def _statistics(per_seed: Mapping[str, float]) -> dict:
    """mean_std of the seeds' values, with "of" (how many seeds) and the values themselves."""
    return {**mean_std(list(per_seed.values())), "of": len(per_seed), "per_seed": dict(per_seed)}


def _has_ap(results: Mapping, task: str) -> bool:
    """Whether a run has an AP for ``task``: detectron2 gives NaN for every metric of a run
    without predictions, and no "segm" at all when none of them had a mask."""
    return _is_number(results.get(task, {}).get("AP"))


def _metric(results: Mapping, task: str, metric: str) -> float:
    """A run's value of ``metric``, NaN when the run has no AP for ``task``."""
    return results[task].get(metric, math.nan) if _has_ap(results, task) else math.nan


def summarize(
    runs: Mapping[str, Mapping[int, str]],
    baseline: str,
    parameters: Mapping[str, Mapping[str, int]],
    overrides: Mapping[str, Sequence[str]],
    recipe: Mapping,
    dataset: Optional[str] = None,
) -> dict:
    """The comparison of finished runs, as a JSON-ready dict.

    Args:
        runs: variant name -> seed -> run folder (with eval_results.json); every variant has
            the same seeds. The first variant comes first in the report.
        baseline: the variant whose per-seed results the others are paired with.
        parameters: variant name -> {"parameters": n, "backbone_parameters": n}.
        overrides: variant name -> its config overrides (KEY VALUE ...).
        recipe: what all runs share (config file, overrides), reported as is.
        dataset: the test dataset to report, for runs that evaluated several.
    """
    seeds = sorted(next(iter(runs.values())))
    for name, by_seed in runs.items():
        if sorted(by_seed) != seeds:
            raise UserError(
                f"variant {name!r} has the seeds {sorted(by_seed)}, not {seeds}: "
                f"every variant needs the same seeds to pair them"
            )
    if baseline not in runs:
        raise UserError(f"baseline {baseline!r} is not one of the variants {list(runs)}")
    results = {
        name: {seed: load_results(folder, dataset) for seed, folder in by_seed.items()}
        for name, by_seed in runs.items()
    }
    # Tasks any run reports (a box-only detector has no "segm"; nor has a run without
    # predictions, which must not take the task away from the others).
    tasks = [
        task
        for task in TASK_LABELS
        if any(task in r for by_seed in results.values() for r in by_seed.values())
    ]
    if not tasks:
        raise UserError("the runs have no bbox or segm results to compare")
    left_out = [
        {"variant": name, "seed": seed, "task": task, "run": str(runs[name][seed])}
        for name, by_seed in results.items()
        for seed in seeds
        for task in tasks
        if not _has_ap(by_seed[seed], task)
    ]
    variants = {}
    for name, by_seed in runs.items():
        times = {str(seed): median_iteration_time(folder) for seed, folder in by_seed.items()}
        measured = any(t is not None for t in times.values())
        entry = {
            "overrides": list(overrides.get(name, ())),
            **dict(parameters.get(name, {})),
            "seconds_per_iteration": _statistics(times) if measured else None,
            "runs": {str(seed): str(folder) for seed, folder in by_seed.items()},
            "results": {},
            "difference": {},
        }
        for task in tasks:
            entry["results"][task] = {}
            for metric in METRICS:
                per_seed = {str(s): _metric(results[name][s], task, metric) for s in seeds}
                entry["results"][task][metric] = _statistics(per_seed)
        if name != baseline:
            for task in tasks:
                entry["difference"][task] = {}
                for metric in METRICS:
                    per_seed = {
                        str(s): _metric(results[name][s], task, metric)
                        - _metric(results[baseline][s], task, metric)
                        for s in seeds
                    }
                    stats = _statistics(per_seed)
                    stats["reading"] = read_difference(stats["mean"], stats["std"])
                    entry["difference"][task][metric] = stats
        variants[name] = entry
    return {
        "recipe": dict(recipe),
        "dataset": dataset,
        "seeds": seeds,
        "baseline": baseline,
        "tasks": tasks,
        "reading_rule": f"per-seed paired differences: |mean| <= std is "
        f"'{WITHIN}'; with one seed, '{ONE_SEED}'",
        "left_out": left_out,
        "variants": variants,
    }


def _value(stats: Optional[Mapping], signed: bool = False, digits: int = 1) -> str:
    """mean ± std, and "(n=2 of 3)" when runs were left out; "nan" when no run has a value."""
    if stats is None:
        return "–"
    mean, std = stats["mean"], stats["std"]
    if math.isnan(mean):
        return "nan"
    text = f"{mean:+.{digits}f}" if signed else f"{mean:.{digits}f}"
    if std is not None:
        text += f" ± {std:.{digits}f}"
    if stats["n"] < stats["of"]:
        text += f" (n={stats['n']} of {stats['of']})"
    return text


def _millions(count: Optional[int]) -> str:
    return "–" if count is None else f"{count / 1e6:.2f}"


def _short(overrides: Sequence[str]) -> str:
    pairs = [
        f"{key.replace('MODEL.LAMBDA_RESNET.', '')}={value}"
        for key, value in zip(overrides[::2], overrides[1::2])
    ]
    return ", ".join(pairs) or "(the base config)"


def _reading(summary: Mapping, name: str) -> str:
    """One sentence per variant: which differences to the baseline exceed the spread, and how
    many are within it, rest on one seed pair or have no value; "every difference is within
    the spread" only when each one is."""
    baseline, entry = summary["baseline"], summary["variants"][name]
    differences = [
        (f"{TASK_LABELS[task]} {metric}", stats)
        for task, by_metric in entry["difference"].items()
        for metric, stats in by_metric.items()
    ]
    headline = ", ".join(
        f"{TASK_LABELS[task]} AP {_value(entry['difference'][task]['AP'], signed=True)}"
        for task in summary["tasks"]
    )
    start = f"- **{name}** vs {baseline}: {headline}"
    if len(summary["seeds"]) == 1:
        return f"{start}. {ONE_SEED}: run more --seeds before reading a difference."
    beyond = [
        (label, stats)
        for label, stats in differences
        if stats["reading"].endswith("beyond the spread")
    ]
    by_reading: Dict[str, List[str]] = {}  # the others
    for label, stats in differences:
        if not stats["reading"].endswith("beyond the spread"):
            by_reading.setdefault(stats["reading"], []).append(label)
    within = by_reading.get(WITHIN, [])
    if len(within) == len(differences):
        return (
            f"{start}. Every difference is {WITHIN} (|mean| <= std over "
            f"{len(summary['seeds'])} seeds): these runs do not rank {name} and {baseline}."
        )
    others = [f"{len(within)} {'is' if len(within) == 1 else 'are'} {WITHIN}"] if within else []
    for kind, words in (
        (ONE_SEED, "rest on one seed pair (no spread)"),
        (NO_VALUE, "have no value, no seed having both runs' AP"),
    ):
        labels = by_reading.get(kind, [])
        if len(labels) == len(differences):
            others.append(f"all {len(labels)} {words}")
        elif labels:
            others.append(f"{len(labels)} {words}: {', '.join(labels)}")
    rest = "; ".join(others)
    if not beyond:
        return (
            f"{start}. No difference is beyond the spread: {rest}; these runs do not "
            f"rank {name} and {baseline}."
        )
    listed = ", ".join(f"{label} {_value(stats, signed=True)}" for label, stats in beyond)
    start = f"{start}. Beyond the spread (|mean| > std): {listed}"
    if len(beyond) + len(within) == len(differences):
        return f"{start}; the other {len(within)} differences are {WITHIN}."
    return f"{start}; of the other {len(differences) - len(beyond)} differences, {rest}."


def _left_out_lines(summary: Mapping) -> List[str]:
    """The runs without AP for a task, named: they are left out of that task's means."""
    runs: Dict[tuple, List[str]] = {}
    for item in summary.get("left_out", []):
        key = (item["variant"], item["seed"], item["run"])
        runs.setdefault(key, []).append(TASK_LABELS[item["task"]])
    if not runs:
        return []
    lines = [
        "",
        "## Runs without AP",
        "",
        "These runs had no predictions to evaluate for the tasks named: they are left out "
        "of those tasks' means and paired differences, whose cells give the count of runs "
        "(n=...).",
        "",
    ]
    lines += [
        f"- {variant} seed {seed}: no {' or '.join(tasks)} AP (`{run}`)"
        for (variant, seed, run), tasks in runs.items()
    ]
    return lines


def format_comparison(summary: Mapping) -> str:
    """The markdown report: parameters and time, AP per task, paired differences, a reading."""
    seeds, baseline, variants = summary["seeds"], summary["baseline"], summary["variants"]
    recipe = summary["recipe"]
    lines = [
        "# Backbone comparison",
        "",
        f"Config `{recipe.get('config')}`"
        + (f" with `{' '.join(map(str, recipe['overrides']))}`" if recipe.get("overrides") else "")
        + f"; seeds {', '.join(map(str, seeds))}; baseline **{baseline}**"
        + (f"; test dataset {summary['dataset']}" if summary.get("dataset") else "")
        + ".",
        f"COCO AP (%), mean ± sample standard deviation over {len(seeds)} seed"
        f"{'s' if len(seeds) > 1 else ''} (one seed: no ±).",
        "",
        "| Variant | Overrides | Params (M) | Backbone params (M) | s / iter (median) |",
        "|:--|:--|--:|--:|--:|",
    ]
    for name, entry in variants.items():
        lines.append(
            f"| {name} | {_short(entry['overrides'])} | "
            f"{_millions(entry.get('parameters'))} | "
            f"{_millions(entry.get('backbone_parameters'))} | "
            f"{_value(entry['seconds_per_iteration'], digits=2)} |"
        )
    lines += _left_out_lines(summary)
    header = "| Variant | " + " | ".join(METRICS) + " |"
    rule = "|:--|" + "--:|" * len(METRICS)
    for task in summary["tasks"]:
        lines += ["", f"## {TASK_LABELS[task].capitalize()} AP", "", header, rule]
        for name, entry in variants.items():
            cells = [_value(entry["results"][task][m]) for m in METRICS]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    others = [name for name in variants if name != baseline]
    if others:
        lines += [
            "",
            f"## Paired difference to {baseline}",
            "",
            f"Per seed (variant - {baseline}, same seed), then mean ± std over seeds.",
            "",
            "| Variant | Task | " + " | ".join(METRICS) + " |",
            "|:--|:--|" + "--:|" * len(METRICS),
        ]
        for name in others:
            for task in summary["tasks"]:
                cells = [
                    _value(variants[name]["difference"][task][m], signed=True) for m in METRICS
                ]
                lines.append(f"| {name} | {TASK_LABELS[task]} | " + " | ".join(cells) + " |")
        lines += ["", "## Reading", ""]
        lines += [_reading(summary, name) for name in others]
        if len(seeds) > 1:
            lines += [
                "",
                "|mean| > std is a loose screen, not a significance test: more seeds "
                "narrow the spread.",
            ]
    return "\n".join(lines) + "\n"


def plot_comparison(summary: Mapping, path: str) -> str:
    """Bars per metric and variant (mean over seeds) with the std as error bars, cut at 0 (the
    table gives the full ± std); one panel per task (:func:`~.plots.plot_ap_bars`)."""
    seeds = len(summary["seeds"])
    panels = {
        f"{TASK_LABELS[task]} AP, mean ± std over {seeds} seed{'s' if seeds > 1 else ''}": {
            name: [
                (entry["results"][task][metric]["mean"], entry["results"][task][metric]["std"])
                for metric in METRICS
            ]
            for name, entry in summary["variants"].items()
        }
        for task in summary["tasks"]
    }
    return plot_ap_bars(panels, METRICS, path, panel_width=6.5)


def _write_text(path: Path, text: str) -> None:
    with atomic_path(path) as temporary, open(temporary, "w") as f:
        f.write(text)


def _strict_json(value):
    """NaN (COCO's AP for an empty size bucket) as null: NaN is not JSON."""
    if isinstance(value, dict):
        return {key: _strict_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_strict_json(item) for item in value]
    return None if isinstance(value, float) and math.isnan(value) else value


def write_report(summary: Mapping, folder: str) -> List[str]:
    """comparison.md, comparison.json and comparison.png in ``folder``; returns their paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    markdown, data, chart = (folder / name for name in REPORT_FILES)
    _write_text(markdown, format_comparison(summary))
    _write_text(data, json.dumps(_strict_json(summary), indent=2, allow_nan=False) + "\n")
    plot_comparison(summary, str(chart))
    return [str(markdown), str(data), str(chart)]
