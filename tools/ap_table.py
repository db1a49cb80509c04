#!/usr/bin/env python
"""Print runs' COCO AP by object size as a markdown table in the paper's Table 14 layout.

    python tools/ap_table.py output/r152_mask_rcnn output/lambda_r152_mask_rcnn \
        --baseline r152_mask_rcnn --paper --plot ap_by_size.png

A run is a training OUTPUT_DIR, its eval_results.json or its metrics.json; name a row with
NAME=PATH (default: the folder name; two runs cannot share a name).
"""
import argparse
import os
import sys
from pathlib import Path

from lambda_det.cli.arguments import add_debug_argument, reporting_user_errors
from lambda_det.evaluation.ap_table import format_ap_table, load_results, plot_ap_by_size  # noqa
from lambda_det.utils.atomic import OutputWriteError, check_writable_folder, reporting_write_errors


def run_name(spec: str):
    if "=" in spec and not os.path.exists(spec):
        name, path = spec.split("=", 1)
        return name, path
    path = Path(spec)
    folder = path if path.is_dir() else path.parent
    return folder.name, spec


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", metavar="[NAME=]PATH")
    parser.add_argument("--baseline", help="row name to show differences against")
    parser.add_argument("--paper", action="store_true", help="add the paper's Table 14 rows")
    parser.add_argument("--plot", metavar="PNG", help="also write a bar chart here")
    parser.add_argument("--output", metavar="MD", help="also write the table here")
    parser.add_argument("--dataset", help="the test dataset to report, for runs that evaluated "
                                          "several")
    add_debug_argument(parser, errors="a file that cannot be written")
    args = parser.parse_args(argv)
    with reporting_user_errors(args.debug, errors=(OutputWriteError,)):
        for option, path in (("--output", args.output), ("--plot", args.plot)):
            if path:
                check_writable_folder(os.path.dirname(os.path.abspath(path)), option)
        return report(parser, args)


def report(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    runs = {}
    for spec in args.runs:
        name, path = run_name(spec)
        if name in runs:
            parser.error(f"two runs are named {name!r} ({spec}): name the rows with NAME=PATH")
        try:
            runs[name] = load_results(path, args.dataset)
        except (FileNotFoundError, ValueError) as error:
            parser.error(str(error))
    table = format_ap_table(runs, baseline=args.baseline, paper=args.paper)
    print(table)
    if args.output:
        with reporting_write_errors(args.output, "--output"):
            Path(args.output).parent.mkdir(parents=True, exist_ok=True)
            Path(args.output).write_text(table + "\n")
    if args.plot:
        with reporting_write_errors(args.plot, "--plot"):
            print(f"wrote {plot_ap_by_size(runs, args.plot)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
