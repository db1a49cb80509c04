"""Print runs' COCO AP by object size as a markdown table in the paper's Table 14 layout.

    python tools/ap_table.py output/r152_mask_rcnn output/lambda_r152_mask_rcnn \
        --baseline r152_mask_rcnn --paper --plot ap_by_size.png

A run is a training OUTPUT_DIR, its eval_results.json or its metrics.json; name a row with
NAME=PATH (default: the folder name; two runs cannot share a name). An existing --output or
--plot is replaced only with --overwrite, and never when it is a file of a run the table reads
(inference/ included) or of any other run.
"""

import argparse
import os
import sys
from pathlib import Path
from typing import Dict

from lambda_det.cli.arguments import add_debug_argument, reporting_user_errors
from lambda_det.cli.output_dir import run_files_in, run_owner
from lambda_det.reports.ap_table import format_ap_table, load_results, plot_ap_by_size
from lambda_det.utils.atomic import (
    atomic_write,
    check_output_file,
    check_writable_folder,
    file_identity,
    reporting_write_errors,
)
from lambda_det.utils.errors import UserError


def run_name(spec: str):
    if "=" in spec and not os.path.exists(spec):
        name, path = spec.split("=", 1)
        return name, path
    path = Path(spec)
    folder = path if path.is_dir() else path.parent
    return folder.name, spec


def runs_read(specs) -> Dict[str, str]:
    """Row name -> path of each run on the command line.

    Raises:
        ValueError: two runs have one name.
    """
    runs = {}
    for spec in specs:
        name, path = run_name(spec)
        if name in runs:
            raise UserError(f"two runs are named {name!r} ({spec}): name the rows with NAME=PATH")
        runs[name] = path
    return runs


def files_of_runs(runs: Dict[str, str]) -> Dict[str, str]:
    """What the table must never write over: each run's results file and the run's files
    beside it (a run folder's config.yaml, checkpoints, inference/, ...), as check_output_file's
    reads (a folder there: every file in it)."""
    files = {}
    for path in runs.values():
        folder = path if os.path.isdir(path) else os.path.dirname(path) or "."
        if folder != path:  # a results file (the folder itself may take the user's table)
            files[f"the run {path!r}"] = path
        for name in run_files_in(folder):
            held = os.path.join(folder, name)
            kind = f"a folder of the run {folder!r} ({name}/)" if os.path.isdir(held) else None
            files[kind or f"a file of the run {folder!r} ({name})"] = held
    return files


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", metavar="[NAME=]PATH")
    parser.add_argument("--baseline", help="row name to show differences against")
    parser.add_argument(
        "--paper",
        action="store_true",
        help="add the paper's Table 14 rows and, marked as reference rows, detectron2's "
        "from-scratch LSJ Mask R-CNN baselines (R-50/R-101, 100/200/400 epochs)",
    )
    parser.add_argument("--plot", metavar="PNG", help="also write a bar chart here")
    parser.add_argument("--output", metavar="MD", help="also write the table here")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --output or --plot (never a run's file)",
    )
    parser.add_argument(
        "--dataset", help="the test dataset to report, for runs that evaluated several"
    )
    add_debug_argument(parser, errors="a mistake in the runs or the output paths")
    args = parser.parse_args(argv)
    with reporting_user_errors(args.debug):
        runs = runs_read(args.runs)
        reads = files_of_runs(runs)
        outputs = [
            (option, path)
            for option, path in (("--output", args.output), ("--plot", args.plot))
            if path
        ]
        if len(outputs) == 2 and (
            os.path.abspath(args.output) == os.path.abspath(args.plot)
            or file_identity(args.output) in {file_identity(args.plot)} - {None}
        ):
            raise UserError(f"--output and --plot name one file ({args.output!r}): pass two")
        for option, path in outputs:
            check_output_file(path, args.overwrite, reads, option, owner=run_owner(path))
            check_writable_folder(os.path.dirname(os.path.abspath(path)), option)
        results = {name: load_results(path, args.dataset) for name, path in runs.items()}
        table = format_ap_table(results, baseline=args.baseline, paper=args.paper)
    print(table)
    with reporting_user_errors(args.debug):
        if args.output:
            with reporting_write_errors(args.output, "--output"):
                Path(args.output).parent.mkdir(parents=True, exist_ok=True)
            atomic_write(args.output, table + "\n", "--output")
        if args.plot:
            with reporting_write_errors(args.plot, "--plot"):
                print(f"wrote {plot_ap_by_size(results, args.plot)}")
    return 0


if __name__ == "__main__":  # python -m, from an installed package (no tools/)
    sys.exit(main())
