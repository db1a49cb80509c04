"""COCO AP-by-size reporting (tables in the paper's Table 14 layout, bar charts)."""
from lambda_det.evaluation.ap_table import (
    PAPER_TABLE_14, SIZE_METRICS, format_ap_table, load_results, plot_ap_by_size)

__all__ = ["PAPER_TABLE_14", "SIZE_METRICS", "format_ap_table", "load_results", "plot_ap_by_size"]
