#!/usr/bin/env python
"""Train or evaluate a lambda_det model, in the shape of detectron2's tools/train_net.py.

    python tools/train_net.py --config lambda_r152_mask_rcnn.yaml --num-gpus 8
    python tools/train_net.py --config lambda_r152_mask_rcnn.yaml --eval-only MODEL.WEIGHTS model.pth
    python tools/train_net.py --config-file configs/Demo/lambda_r26_shapes.yaml MODEL.DEVICE cpu

``--num-gpus/--num-machines/--machine-rank/--dist-url`` go to detectron2's ``launch`` (with
``MODEL.DEVICE cpu``, ``--num-gpus N`` starts N gloo CPU processes instead); trailing
``KEY VALUE`` pairs override the config. A bare config name is looked up under configs/.

Unlike detectron2's script, it does not train over a finished run: training into an
OUTPUT_DIR that holds one needs ``--resume`` (continue) or ``--restart`` (start over; the
previous run is moved to OUTPUT_DIR/previous_<date-time>/). ``--eval-only`` needs weights that
fit the model (MODEL.WEIGHTS, or OUTPUT_DIR's last checkpoint with ``--resume``), and writes
OUTPUT_DIR/eval_results.json: evaluate into another OUTPUT_DIR to keep a training run's.
"""
import torch

import lambda_det.modeling  # noqa: F401  (registers the backbones)
import lambda_det.data  # noqa: F401  (registers the bundled datasets)
from lambda_det.engine import (
    Trainer, argument_parser, build_cfg, evaluation_weights, launch, load_weights_for_evaluation,
    prepare_output_dir, setup_cfg)


def main(args):
    cfg = setup_cfg(args)
    if args.eval_only:
        model = Trainer.build_model(cfg)
        load_weights_for_evaluation(model, cfg, resume=args.resume)
        return Trainer.test(cfg, model)
    trainer = Trainer(cfg)
    trainer.resume_or_load(resume=args.resume)
    return trainer.train()


if __name__ == "__main__":
    parser = argument_parser()
    args = parser.parse_args()
    print("Command Line Args:", args)
    # On the CPU, --num-gpus N starts N gloo processes (detectron2's launch needs CUDA and NCCL).
    cfg = build_cfg(args)
    try:  # before any process starts
        if args.eval_only:
            evaluation_weights(cfg, resume=args.resume)
        else:
            previous = prepare_output_dir(cfg.OUTPUT_DIR, resume=args.resume,
                                          restart=args.restart, machine_rank=args.machine_rank)
            if previous:
                print(f"--restart: moved the previous run to {previous}")
    except (FileExistsError, FileNotFoundError, ValueError) as error:
        parser.error(str(error))
    cpu = cfg.MODEL.DEVICE == "cpu" or not torch.cuda.is_available()
    launch(main, args.num_gpus, num_machines=args.num_machines, machine_rank=args.machine_rank,
           dist_url=args.dist_url, args=(args,), cpu=cpu)
