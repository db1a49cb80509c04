"""Shared test helpers. Everything runs on the CPU with small shapes."""
import os
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
CONFIGS = REPO_ROOT / "configs"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def subprocess_env() -> dict:
    """The environment for a child interpreter: this one's, minus warning filters set by pytest."""
    env = dict(os.environ)
    env.pop("PYTHONWARNINGS", None)
    return env


@pytest.fixture(scope="session")
def datasets_root(tmp_path_factory) -> Path:
    """A DETECTRON2_DATASETS folder with the bundled shapes dataset, generated once per session."""
    from lambda_det.data.shapes import VERSION, ensure_shapes_dataset

    root = tmp_path_factory.mktemp("datasets")
    ensure_shapes_dataset(root / f"lambda_det_shapes_{VERSION}")
    return root
