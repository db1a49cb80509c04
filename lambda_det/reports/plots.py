"""One chart for COCO AP: grouped bars, one group per metric, one bar per run, one panel per task
(boxes, masks). The demo's and tools/ap_table.py's AP-by-size chart and the comparison over seeds
(mean with std error bars) are both drawn by :func:`plot_ap_bars`."""

import math
from typing import Mapping, Optional, Sequence, Tuple

from lambda_det.utils.atomic import atomic_path

__all__ = ["plot_ap_bars", "Bar"]

Bar = Tuple[float, Optional[float]]  # (AP, its std over seeds or None)


def _error_bar(mean: float, std: Optional[float]) -> Tuple[float, float]:
    """(lower, upper) error: the std, its lower end cut at 0 (AP is never below)."""
    std = std or 0.0
    return min(std, max(mean, 0.0)), std


def plot_ap_bars(
    panels: Mapping[str, Mapping[str, Sequence[Bar]]],
    metrics: Sequence[str],
    path: str,
    panel_width: float = 6.0,
) -> str:
    """Write a PNG (atomically) of one panel per ``panels`` entry (title -> run -> one
    ``(mean, std)`` per metric). A metric without a value (NaN) gets no bar rather than a bar at
    0. Bars with a std get error bars; bars without one are labelled with their value."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(
        1, len(panels), figsize=(panel_width * len(panels), 4.2), squeeze=False
    )
    for axis, (title, runs) in zip(axes[0], panels.items()):
        width = 0.8 / max(1, len(runs))
        for index, (name, values) in enumerate(runs.items()):
            offset = (index - (len(runs) - 1) / 2) * width
            shown = [
                (position, mean, std)
                for position, (mean, std) in enumerate(values)
                if not math.isnan(mean)
            ]
            errors = [_error_bar(mean, std) for _, mean, std in shown]
            with_std = any(std is not None for _, _, std in shown)
            bars = axis.bar(
                [position + offset for position, _, _ in shown],
                [mean for _, mean, _ in shown],
                width,
                label=name,
                yerr=list(zip(*errors)) if with_std and shown else None,
                capsize=3 if with_std else 0,
            )
            if not with_std:
                axis.bar_label(bars, labels=[f"{mean:.1f}" for _, mean, _ in shown], fontsize=7)
        axis.set_xticks(range(len(metrics)), metrics)
        axis.set_ylim(bottom=0)
        axis.set_ylabel("AP (%)")
        axis.set_title(title)
        axis.legend(fontsize=8)
    figure.tight_layout()
    with atomic_path(path) as temporary:
        figure.savefig(temporary, dpi=120, format="png")
    plt.close(figure)
    return path
