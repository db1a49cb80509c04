#!/usr/bin/env python
"""Train or evaluate a lambda_det model, in the shape of detectron2's tools/train_net.py.

    python tools/train_net.py --config lambda_r152_mask_rcnn --num-gpus 8
    python tools/train_net.py --config lambda_r152_mask_rcnn --eval-only MODEL.WEIGHTS model.pth
    python tools/train_net.py --config-file configs/Demo/lambda_r26_shapes.yaml MODEL.DEVICE cpu

``--num-gpus/--num-machines/--machine-rank/--dist-url`` go to detectron2's ``launch`` (with
``MODEL.DEVICE cpu``, ``--num-gpus N`` starts N gloo CPU processes instead); trailing
``KEY VALUE`` pairs override the config. ``--config`` also takes a shipped config's name.

Unlike detectron2's script:

* one run at a time per OUTPUT_DIR: a second training or evaluation into a folder that a run
  holds exits at once, naming the holder (an OS lock, released however the run ends);
* it does not train over a run: training into an OUTPUT_DIR that holds one needs ``--resume``
  (continue from its last checkpoint) or ``--restart`` (start over; the previous run's files are
  moved to OUTPUT_DIR/previous_<date-time>/); a run that stopped before its first checkpoint
  has nothing to resume from: ``--resume`` says so, ``--restart`` moves it aside;
* every setting, ``--num-gpus`` and MODEL.DEVICE are checked before launch, and a batch whose
  backbone alone cannot fit in memory (a lower bound counted on the meta device) is refused;
* weights load without running code from the file (``.pkl`` included); MODEL.WEIGHTS for
  training must hold every backbone weight, and ``--eval-only`` needs weights that fit the whole
  model (MODEL.WEIGHTS, or OUTPUT_DIR's last checkpoint with ``--resume``);
* ``--eval-only`` writes its config.yaml, log.txt, eval_results.json and inference/ into
  OUTPUT_DIR, or, when OUTPUT_DIR holds a run (a training's or an earlier evaluation's files),
  into a new OUTPUT_DIR/eval_<date-time>/ that it prints: the run's files stay as they are;
* ``--coco-dataset NAME JSON IMAGE_DIR`` (repeatable) registers a COCO-format dataset under
  NAME for DATASETS.TRAIN / TEST; the datasets and their images are checked before training;
* a mistake in the input (config, dataset, weights, OUTPUT_DIR) is one ``error: ...`` line and
  exit status 2; ``--debug`` shows its traceback. So is a disk that cannot be written: an
  OUTPUT_DIR that is read-only or full before the run, or a checkpoint that cannot be saved
  during it (the run stops at once, without its final evaluation).
"""
import sys

import lambda_det.data  # noqa: F401  (registers the bundled datasets)
import lambda_det.modeling  # noqa: F401  (registers the backbones)
from lambda_det.cli.train_net import main

if __name__ == "__main__":
    sys.exit(main())
