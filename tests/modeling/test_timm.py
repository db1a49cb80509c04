"""The LambdaResNet family in timm: build, train a few steps, convert, fine-tune a detector."""

import argparse
import re

import pytest
import torch

timm = pytest.importorskip("timm")

from conftest import exit_status, overrides, run_tool
from detectron2.modeling import build_model

import lambda_det.modeling.timm_models  # noqa: F401  (registers the models)
from lambda_det.checkpoint import load_weights
from lambda_det.cli import convert_timm_checkpoint, train_net
from lambda_det.run_config import load_config

SMALL = {"width_multiplier": 0.25, "scope": 3}
DETECTOR = overrides(
    {
        "MODEL.DEVICE": "cpu",
        "MODEL.LAMBDA_RESNET.WIDTH_MULTIPLIER": "0.25",
        "MODEL.LAMBDA_RESNET.SCOPE": "3",
    }
)


def test_every_variant_is_registered_and_builds():
    names = timm.list_models("*_det")
    assert len(names) == 4 * 8 and {"lambda_resnet152_det", "resnetrs101_se_det"} <= set(names)
    model = timm.create_model("lambda_resnet26_det", num_classes=3, **SMALL)
    assert model(torch.randn(2, 3, 64, 64)).shape == (2, 3)
    assert model.get_classifier() is model.linear and model.num_classes == 3
    assert model.pretrained_cfg["num_classes"] == 1000  # the cfg describes the ImageNet setup
    model.reset_classifier(5)
    assert model.eval()(torch.randn(1, 3, 32, 32)).shape == (1, 5)
    # The same backbone as the detector's, weight for weight.
    backbone = timm.create_model("resnetrs50_se_det", num_classes=10)
    assert backbone.depth == 50 and any("se." in name for name, _ in backbone.named_parameters())
    with pytest.raises(ValueError, match="no pretrained weights exist for lambda_resnet50_det"):
        timm.create_model("lambda_resnet50_det", pretrained=True)


def write_image_folder(root):
    from PIL import Image

    generator = torch.Generator().manual_seed(0)
    for label, colour in (("red", 0), ("blue", 2)):
        (root / label).mkdir(parents=True)
        for index in range(4):
            pixels = torch.randint(0, 80, (48, 48, 3), generator=generator, dtype=torch.uint8)
            pixels[..., colour] = 200
            Image.fromarray(pixels.numpy()).save(root / label / f"{index}.png")


@pytest.mark.slow
@pytest.mark.e2e
def test_timm_training_converts_into_detector_weights(tmp_path, datasets_root, shapes, capsys):
    from timm.data import create_dataset, create_loader
    from timm.optim import create_optimizer_v2

    write_image_folder(tmp_path / "images")
    torch.manual_seed(0)
    model = timm.create_model("lambda_resnet26_det", num_classes=2, **SMALL)
    loader = create_loader(
        create_dataset("", root=str(tmp_path / "images")),
        input_size=(3, 48, 48),
        batch_size=4,
        is_training=True,
        no_aug=True,
        num_workers=0,
        use_prefetcher=False,
        device=torch.device("cpu"),
    )
    optimizer = create_optimizer_v2(model, "sgd", lr=0.05, momentum=0.9)
    losses = []
    for _ in range(2):
        for images, labels in loader:
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    assert len(losses) == 4 and all(map(lambda value: value == value, losses))
    classifier = tmp_path / "model_best.pth.tar"  # the layout of timm's CheckpointSaver
    torch.save(
        {
            "epoch": 1,
            "arch": "lambda_resnet26_det",
            "state_dict": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "version": 2,
            "args": argparse.Namespace(model="lambda_resnet26_det", lr=0.05),
        },
        classifier,
    )

    # The conversion as a user runs it, a child process; the training and the refusal below
    # run the tools' main() in this process.
    converted = tmp_path / "detector_init.pth"
    argv = ["--config", "lambda_r26_shapes", classifier, converted, *DETECTOR]
    conversion = run_tool("convert_timm_checkpoint.py", *argv, datasets_root=datasets_root)
    assert conversion.returncode == 0, conversion.stderr[-3000:]
    # Every backbone weight loads, equal to the classifier's; the classifier is gone.
    detector = build_model(load_config("lambda_r26_shapes", DETECTOR))
    load_weights(detector, str(converted), require="backbone")
    trained = model.state_dict()
    backbone = detector.backbone.bottom_up.state_dict()
    assert set(backbone) == {name for name in trained if not name.startswith("linear.")}
    for name, value in backbone.items():
        assert torch.equal(value, trained[name]), name
    # A detection training step starts from it.
    training = [
        "--config",
        "lambda_r26_shapes",
        *DETECTOR,
        "SOLVER.IMS_PER_BATCH",
        "2",
        "SOLVER.MAX_ITER",
        "1",
        "DATALOADER.NUM_WORKERS",
        "0",
        "DATASETS.TEST",
        "()",
        "MODEL.WEIGHTS",
        str(converted),
        "OUTPUT_DIR",
        str(tmp_path / "detector"),
    ]
    assert train_net.main(training) == 0
    assert (tmp_path / "detector/model_final.pth").is_file()
    # The converter and the training count the same weights.
    written = re.search(r"wrote .*: (\d+) backbone weights", conversion.stdout).group(1)
    logged = capsys.readouterr()
    assert f"loaded {written} of {written} backbone weights" in logged.out + logged.err
    # A classifier of another depth is refused in one line, and nothing is written.
    other = ["--config", "lambda_r26_shapes", classifier, tmp_path / "other.pth", *DETECTOR]
    status, err = exit_status(
        convert_timm_checkpoint.main, [*other, "MODEL.LAMBDA_RESNET.DEPTH", "50"], capsys
    )
    assert status == 2 and "Traceback" not in err
    assert "error: the classifier is not the config's backbone" in err
    assert not (tmp_path / "other.pth").exists()
