"""COCO AP reporting: tables in the paper's Table 14 layout, bar charts, and the report of a
comparison over seeds (:mod:`.compare_report`). Nothing here trains or imports the trainer."""

from lambda_det.reports.ap_table import (
    DETECTRON2_LSJ_BASELINES,
    PAPER_TABLE_14,
    SIZE_METRICS,
    format_ap_table,
    load_results,
    plot_ap_by_size,
)
from lambda_det.reports.plots import plot_ap_bars

__all__ = [
    "DETECTRON2_LSJ_BASELINES",
    "PAPER_TABLE_14",
    "SIZE_METRICS",
    "format_ap_table",
    "load_results",
    "plot_ap_by_size",
    "plot_ap_bars",
]
