"""Names that moved from lambda_det.config to lambda_det.run_config still import, with a warning
that names the new place."""

import pytest

import lambda_det.config
import lambda_det.run_config


@pytest.fixture(autouse=True)
def _forget_the_moved_names(monkeypatch):
    """Each test looks the names up afresh (the first look-up keeps them in the package)."""
    for name in lambda_det.config._MOVED_TO_RUN_CONFIG:
        monkeypatch.delitem(vars(lambda_det.config), name, raising=False)
    yield
    for name in lambda_det.config._MOVED_TO_RUN_CONFIG:
        vars(lambda_det.config).pop(name, None)


@pytest.mark.parametrize("name", ["get_cfg", "load_config"])
def test_a_moved_name_warns_once_and_is_the_new_one(name):
    with pytest.warns(DeprecationWarning) as warned:
        moved = getattr(lambda_det.config, name)
    assert moved is getattr(lambda_det.run_config, name)
    assert len(warned) == 1
    message = str(warned[0].message)
    assert "\n" not in message and f"lambda_det.run_config.{name}" in message


def test_from_import_of_a_moved_name_works():
    with pytest.warns(DeprecationWarning, match="lambda_det.run_config.get_cfg") as warned:
        from lambda_det.config import get_cfg
    assert len(warned) == 1
    assert get_cfg is lambda_det.run_config.get_cfg


def test_other_names_are_still_attribute_errors():
    with pytest.raises(AttributeError, match="no_such_name"):
        lambda_det.config.no_such_name
