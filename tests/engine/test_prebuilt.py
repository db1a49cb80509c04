"""The model built before launch: the run draws the numbers it would have drawn had it built
the model itself, the checks read a meta-device copy of it, and what its build logged reaches
the run's log."""

import logging
import os
import random
import warnings

import numpy as np
import pytest
import torch
from conftest import TINY_BN_MODEL, overrides
from detectron2.utils.env import seed_all_rng
from torch import nn

from lambda_det.cli.checks import build_yaml_model, check_model
from lambda_det.engine.prebuilt import RandomState, build_before_launch
from lambda_det.engine.preflight import (
    evaluation_memory_lower_bound,
    training_memory_lower_bound,
)
from lambda_det.run_config import load_config

logger = logging.getLogger("lambda_det.tests.prebuilt")


def build_drawing_from_every_generator() -> nn.Module:
    """A model whose build draws from torch, numpy and random, as detectron2's builders may."""
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8))
    model.numpy_draw, model.python_draw = np.random.rand(), random.random()
    return model


def draws() -> tuple:
    """What a run draws after building its model (data order, augmentations, dropout)."""
    return torch.rand(3).tolist(), np.random.rand(3).tolist(), random.random()


def test_the_run_draws_what_it_would_have_drawn_had_it_built_the_model():
    seed_all_rng(7)  # as default_setup seeds rank 0
    built_in_the_run = build_drawing_from_every_generator()
    expected = draws()

    prebuilt = build_before_launch(build_drawing_from_every_generator, 7)
    seed_all_rng(7)  # the run's default_setup seeds again
    model = prebuilt.take()
    assert draws() == expected
    for name, tensor in built_in_the_run.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    assert (model.numpy_draw, model.python_draw) == (
        built_in_the_run.numpy_draw,
        built_in_the_run.python_draw,
    )
    # Without the state the build left, the run would draw the build's numbers again.
    seed_all_rng(7)
    assert draws() != expected


def test_a_negative_seed_is_drawn_before_the_build():
    seeds = {build_before_launch(nn.Identity, -1).seed for _ in range(3)}
    assert all(0 <= seed < 2**31 for seed in seeds) and len(seeds) == 3
    assert build_before_launch(nn.Identity, 5).seed == 5


def test_the_random_state_covers_the_hash_seed_of_started_processes(monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "1")
    state = RandomState.capture()
    os.environ["PYTHONHASHSEED"] = "2"
    state.restore()
    assert os.environ["PYTHONHASHSEED"] == "1"


@pytest.fixture(scope="module")
def tiny_detector_config():
    return load_config(
        "lambda_r26_shapes",
        overrides({**TINY_BN_MODEL, "MODEL.LAMBDA_RESNET.SCOPE": 3}),
    )


def test_the_checks_read_a_meta_copy_that_estimates_as_a_meta_build(tiny_detector_config):
    cfg = tiny_detector_config
    prebuilt = build_before_launch(lambda: build_yaml_model(cfg, "cpu"), 0)
    copy = prebuilt.meta_copy()
    built = check_model(cfg)
    assert {tensor.device.type for tensor in [*copy.parameters(), *copy.buffers()]} == {"meta"}
    assert {tensor.device.type for tensor in prebuilt.model.parameters()} == {"cpu"}
    assert [
        (name, parameter.shape, parameter.requires_grad)
        for name, parameter in copy.named_parameters()
    ] == [
        (name, parameter.shape, parameter.requires_grad)
        for name, parameter in prebuilt.model.named_parameters()
    ]
    assert training_memory_lower_bound(copy, 2, 64) == training_memory_lower_bound(built, 2, 64)
    assert evaluation_memory_lower_bound(copy, 64) == evaluation_memory_lower_bound(built, 64)


def logging_build() -> nn.Module:
    logger.info("built at width %d", 4)
    logger.debug("a detail")
    return nn.Identity()


@pytest.mark.parametrize("propagate", [True, False], ids=["unconfigured", "set up"])
def test_what_the_build_logs_reaches_the_runs_log_where_the_run_takes_the_model(propagate):
    """A logger that detectron2's ``setup_logger`` set up does not propagate; either way, the
    records wait for the run's handlers, and the loggers' levels still decide what they show."""
    package = logging.getLogger("lambda_det.tests")
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    saved = package.handlers[:], package.propagate, package.level
    package.handlers, package.propagate = [], propagate
    try:
        prebuilt = build_before_launch(logging_build, 0)
        assert package.handlers == [] and package.propagate is propagate  # as they were
        package.addHandler(handler)  # the run sets up its logging
        package.setLevel(logging.INFO)
        assert records == []
        prebuilt.take()
    finally:
        package.handlers, package.propagate = saved[:2]
        package.setLevel(saved[2])
    assert [record.getMessage() for record in records] == ["built at width 4"]


def test_what_the_build_sets_up_stays_set_up():
    package = logging.getLogger("lambda_det.tests.sets_up")
    handler = logging.NullHandler()

    def build_setting_up_logging():
        package.addHandler(handler)
        package.propagate = False
        return nn.Identity()

    try:
        build_before_launch(build_setting_up_logging, 0)
        assert package.handlers == [handler] and package.propagate is False
    finally:
        package.handlers, package.propagate = [], True


def test_what_a_failed_build_logged_is_logged_at_once():
    package = logging.getLogger("lambda_det.tests")
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    package.addHandler(handler)
    package.setLevel(logging.INFO)

    def failing_build():
        logging_build()
        raise ValueError("no such depth")

    try:
        with pytest.raises(ValueError, match="no such depth"):
            build_before_launch(failing_build, 0)
    finally:
        package.removeHandler(handler)
        package.setLevel(logging.NOTSET)
    assert [record.getMessage() for record in records] == ["built at width 4"]


def test_the_bytes_the_model_holds():
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8))
    prebuilt = build_before_launch(lambda: model, 0)
    # weights 32 + 8, BatchNorm 8 + 8 float32 and an int64 count
    assert prebuilt.nbytes() == (32 + 8 + 8 + 8 + 8 + 8) * 4 + 8


class WithTensorAttribute(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.scale = torch.ones(4)  # neither a parameter nor a buffer


@pytest.mark.parametrize(
    "build",
    [lambda: nn.utils.weight_norm(nn.Linear(4, 4)), WithTensorAttribute],
    ids=["refuses deepcopy", "tensor attribute"],
)
def test_a_model_without_a_meta_copy_says_so(build):
    """The checks then build the model on the meta device (tools/train_net.py)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # weight_norm's deprecation
        prebuilt = build_before_launch(build, 0)
    assert prebuilt.meta_copy() is None
    assert prebuilt.take() is prebuilt.model
