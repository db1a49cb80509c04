"""The results as markdown tables, and the layer mode's plot."""

from pathlib import Path
from typing import Dict, List

from lambda_det.utils.atomic import atomic_path


def _cell(value, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def markdown_table(title: str, header: List[str], rows: List[List[str]], left: int = 1) -> str:
    """A titled markdown table: the first ``left`` columns and a last "note" left-aligned."""
    align = ["---" if i < left or name == "note" else "---:" for i, name in enumerate(header)]
    lines = [title, "", *("| " + " | ".join(cells) + " |" for cells in [header] + [align] + rows)]
    return "\n".join(lines)


def format_shape_table(name: str, shape: Dict[str, object]) -> str:
    gemm = ", ".join(f"{key} {value:.0f} GFLOP/s" for key, value in shape["gemm_gflops"].items())
    rows = []
    for row in shape["rows"]:
        mib = [
            None if row[key] is None else row[key] / 2**20 for key in ("peak_bytes", "saved_bytes")
        ]
        rows.append(
            [
                row["name"],
                _cell(row["median_s"] and 1000 * row["median_s"], ".1f"),
                _cell(row.get("speedup_vs_timm"), ".2f"),
                _cell(row.get("speedup_vs_lucidrains"), ".2f"),
                _cell(row.get("useful_gflops"), ".1f"),
                _cell(row.get("percent_of_sgemm"), ".0f"),
                _cell(mib[0], ".1f"),
                _cell(mib[1], ".1f"),
                row["note"],
            ]
        )
    return markdown_table(
        f"### {name}: {shape['height']}x{shape['width']}x{shape['channels']} "
        f"(auto -> {shape['auto_impl']}; {gemm} in the same run)",
        [
            "implementation",
            "median ms",
            "x faster than timm",
            "x faster than lucidrains",
            "useful GFLOP/s",
            "% of sgemm",
            "peak MiB",
            "saved MiB",
            "note",
        ],
        rows,
    )


def format_layers(results: Dict[str, object]) -> str:
    return "\n\n".join(format_shape_table(name, shape) for name, shape in results["shapes"].items())


def format_blocks(results: Dict[str, object]) -> str:
    rows = [
        [
            row["name"],
            "x".join(map(str, row["input"][1:])),
            str(row["count"]),
            f"{row['lambda_s'] * 1000:.1f}",
            f"{row['conv_s'] * 1000:.1f}",
            f"{row['ratio']:.3f}",
            f"{row['count'] * (row['lambda_s'] - row['conv_s']) * 1000:+.0f}",
        ]
        for row in results["rows"]
    ]
    return markdown_table(
        f"### LambdaResNet-{results['depth']} lambda blocks vs conv blocks at "
        f"{results['image']}x{results['image']}, batch 1, forward + backward",
        [
            "block",
            "input",
            "in backbone",
            "lambda ms",
            "conv ms",
            "x conv time (per-round median)",
            "lambda - conv, all such blocks (ms)",
        ],
        rows,
        left=2,
    )


def format_backbone(results: Dict[str, object]) -> str:
    rows = [
        [
            row["name"],
            _cell(row["median_s"], ".2f"),
            _cell(row["ratio_to_baseline"], ".3f"),
            f"{row['parameters'] / 1e6:.1f}",
            _cell(row["fvcore_flops"] and row["fvcore_flops"] / 1e9, ".1f"),
            _cell(row["peak_bytes"] and row["peak_bytes"] / 2**20, ".0f"),
            _cell(row["saved_bytes"] and row["saved_bytes"] / 2**20, ".0f"),
            row["note"],
        ]
        for row in results["rows"]
    ]
    return markdown_table(
        f"### Backbones at {results['image']}x{results['image']}, batch 1, forward + backward "
        f"(sgemm {results['gemm_gflops']['sgemm']:.0f} GFLOP/s in the same run)",
        [
            "backbone",
            "median s",
            "x baseline time (median of per-round ratios)",
            "params (M)",
            "fvcore GFLOPs (fwd)",
            "peak MiB",
            "saved MiB",
            "note",
        ],
        rows,
    )


def format_report(results: Dict[str, object], tables: str) -> str:
    """The whole results.md: mode, command, machine, tables."""
    machine = "\n".join(f"- {key}: {value}" for key, value in results["machine"].items())
    device_type = results["device"].split(":")[0]
    return (
        f"## {results['mode']} benchmark, {device_type} {results['dtype']}\n\n"
        f"`{results['command']}`\n\n{machine}\n\n{tables}\n"
    )


def plot_layers(results: Dict[str, object], path: Path) -> None:
    """Time and peak memory per shape and candidate, as bars on log scales."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(results["shapes"])
    names = [row["name"] for row in results["shapes"][shapes[0]]["rows"]]
    figure, axes = plt.subplots(1, 2, figsize=(15, 5.5))
    bar = 0.8 / len(names)
    for index, name in enumerate(names):
        for axis, key, scale in ((axes[0], "median_s", 1000), (axes[1], "peak_bytes", 2**-20)):
            values = []
            for shape in shapes:
                row = next(r for r in results["shapes"][shape]["rows"] if r["name"] == name)
                values.append(row[key] * scale if row.get(key) else float("nan"))
            axis.bar([i + index * bar for i in range(len(shapes))], values, bar, label=name)
    for axis, label in ((axes[0], "forward + backward, median ms"), (axes[1], "peak MiB")):
        axis.set_yscale("log")
        axis.set_ylabel(label)
        axis.set_xticks([i + 0.4 - bar / 2 for i in range(len(shapes))])
        axis.set_xticklabels(shapes)
        axis.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    figure.suptitle(
        f"lambda layers, {results['device']} {results['dtype']}, batch "
        f"{results['batch']} (missing bar: skipped or OOM, see results.md)"
    )
    figure.tight_layout()
    with atomic_path(path) as temporary:
        figure.savefig(temporary, dpi=120, format="png")
    plt.close(figure)
