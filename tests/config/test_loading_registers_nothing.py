"""Loading a config registers no dataset: the tools register what a run reads
(lambda_det.data.register_datasets) before building its loaders."""

import json

import pytest
from conftest import CONFIGS, run_python
from detectron2.data import DatasetCatalog, MetadataCatalog

from lambda_det import model_zoo
from lambda_det.data import register_datasets
from lambda_det.run_config import load_config

CONFIG = str(CONFIGS / "Demo/lambda_r26_shapes.yaml")


@pytest.fixture
def triple(tmp_path):
    """A DATASETS.COCO_INSTANCES entry under a name of its own, unregistered afterwards."""
    name = "lambda_det_test_not_by_loading"
    yield [name, str(tmp_path / "instances.json"), str(tmp_path / "images")]
    if name in DatasetCatalog.list():
        DatasetCatalog.remove(name)
        MetadataCatalog.remove(name)


def test_loading_a_yaml_config_registers_no_dataset(triple):
    before = set(DatasetCatalog.list())
    overrides = ["DATASETS.COCO_INSTANCES", repr([triple])]
    cfg = load_config(CONFIG, overrides)
    model_zoo.get_config("lambda_r26_shapes", overrides)
    assert set(DatasetCatalog.list()) == before
    # Negative control: what the tools call registers the config's datasets.
    assert register_datasets(cfg) == [triple[0]]
    assert triple[0] in DatasetCatalog.list()
    assert MetadataCatalog.get(triple[0]).json_file == triple[1]


# In a fresh process: the bundled shapes datasets are not registered by an earlier test.
LOAD_BOTH_SYSTEMS = """
import json
from detectron2.data import DatasetCatalog
import lambda_det.data
from lambda_det.config.lazy import load_lazy_config
from lambda_det.run_config import load_config

before = set(DatasetCatalog.list())
cfg = load_config("lambda_r26_shapes")
load_lazy_config("lambda_r26_shapes.py")
loaded = set(DatasetCatalog.list())
lambda_det.data.register_datasets(cfg)
print(json.dumps([sorted(loaded - before), sorted(set(DatasetCatalog.list()) - loaded)]))
"""


@pytest.mark.slow
def test_importing_the_data_and_loading_either_config_system_register_nothing():
    result = run_python("-c", LOAD_BOTH_SYSTEMS)
    assert result.returncode == 0, result.stderr[-2000:]
    by_loading, by_registering = json.loads(result.stdout.splitlines()[-1])
    assert by_loading == []
    assert by_registering == ["lambda_det_shapes_train", "lambda_det_shapes_val"]
