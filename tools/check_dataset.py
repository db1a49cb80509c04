#!/usr/bin/env python
"""Check datasets as tools/train_net.py does before training, and time the image checks.

    python tools/check_dataset.py coco_2017_train                  # a registered dataset
    python tools/check_dataset.py --coco-dataset mine data/train.json data/images mine
    python tools/check_dataset.py coco_2017_val --images full      # decode every image

Loads each dataset (annotation file, category ids, boxes, something to train on), then checks
its images (``--images``: as ``DATALOADER.CHECK_IMAGES``) and prints how many per second. A bad
input is one ``error: ...`` line and exit status 2.
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout as a script

import lambda_det.data  # noqa: E402,F401  (registers the bundled datasets)
from lambda_det.config import get_cfg  # noqa: E402
from lambda_det.data.checks import IMAGE_CHECKS, check_images, load_checked_dataset_dicts  # noqa
from lambda_det.data.coco import register_coco_datasets  # noqa: E402
from lambda_det.engine.cli import reporting_user_errors  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="+", metavar="NAME", help="registered dataset names")
    parser.add_argument("--coco-dataset", nargs=3, action="append", default=[],
                        metavar=("NAME", "JSON", "IMAGE_DIR"),
                        help="register a COCO-format dataset first (repeatable)")
    parser.add_argument("--images", choices=IMAGE_CHECKS, default="header",
                        help="what to read of each image (default: header)")
    parser.add_argument("--threads", type=int, help="threads for the image checks")
    args = parser.parse_args(argv)
    with reporting_user_errors():
        cfg = get_cfg()
        cfg.DATASETS.COCO_INSTANCES = [list(triple) for triple in args.coco_dataset]
        register_coco_datasets(cfg)
        start = time.perf_counter()
        dicts = load_checked_dataset_dicts(args.names, filter_empty=False)
        loaded = time.perf_counter()
        count = check_images(dicts, args.images, threads=args.threads)
        checked = time.perf_counter()
    print(f"{len(dicts)} images of {', '.join(args.names)}: annotations loaded and checked in "
          f"{loaded - start:.1f} s; {count} image files checked ({args.images}) in "
          f"{checked - loaded:.1f} s, {count / max(checked - loaded, 1e-9):.0f} images/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
