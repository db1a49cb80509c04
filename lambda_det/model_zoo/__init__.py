"""The shipped configs (the paper's Table 14 recipes, detection variants, the demo), found by
name in a checkout or an installed package, like detectron2's ``model_zoo``::

    from lambda_det import model_zoo
    model_zoo.get_config_file("COCO-InstanceSegmentation/lambda_r152_mask_rcnn.yaml")
    cfg = model_zoo.get_config("lambda_r152_mask_rcnn")   # a unique file name is enough
    lazy = model_zoo.get_config("lambda_r152_mask_rcnn.py")  # the LazyConfig recipe

No pretrained weights exist: the paper's detection recipe trains from scratch.
"""
from pathlib import Path
from typing import List, Sequence

__all__ = ["get_config_file", "get_config", "list_configs", "config_root"]


def config_root() -> Path:
    """The folder of the shipped configs: inside the installed package (setup.py copies them
    there), or the checkout's configs/ for a source tree or an editable install."""
    packaged = Path(__file__).resolve().parent / "configs"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "configs"


def list_configs() -> List[str]:
    """Every shipped config, as paths relative to :func:`config_root`: the yaml configs (Base-*
    files included) and the LazyConfig .py recipes (LazyConfigs/, common/ pieces included)."""
    root = config_root()
    return sorted(str(path.relative_to(root)) for pattern in ("*.yaml", "*.py")
                  for path in root.rglob(pattern) if path.name != "__init__.py")


def get_config_file(name: str) -> str:
    """The path of a shipped config, given its path under configs/ or a unique file name, with
    or without ``.yaml`` (e.g. "lambda_r152_mask_rcnn"); a name ending in ``.py`` is a
    LazyConfig recipe (e.g. "lambda_r152_mask_rcnn.py").

    Raises:
        FileNotFoundError: no shipped config has that name, or several do (names them).
    """
    wanted = name if name.endswith((".yaml", ".py")) else name + ".yaml"
    root = config_root()
    matches = [relative for relative in list_configs()
               if relative == wanted or Path(relative).name == wanted]
    if len(matches) == 1:
        return str(root / matches[0])
    if matches:
        raise FileNotFoundError(f"config name {name!r} is ambiguous: give one of {matches}")
    shipped = [relative for relative in list_configs()
               if not Path(relative).name.startswith("Base") and "/common/" not in relative]
    raise FileNotFoundError(f"config {name!r} is neither a file nor a shipped config; shipped: "
                            f"{', '.join(shipped)}")


def get_config(name: str, opts: Sequence[str] = ()):
    """The config of a shipped config name or a file: a yaml config with lambda_det's defaults
    and ``KEY VALUE`` overrides (see :func:`lambda_det.config.load_config`; not frozen), or for a
    .py name a LazyConfig with ``key=value`` overrides (see
    :func:`lambda_det.lazy_config.load_lazy_config`)."""
    if name.endswith(".py"):
        from lambda_det.lazy_config import load_lazy_config

        return load_lazy_config(name, opts)
    from lambda_det.config import load_config

    return load_config(name, opts, freeze=False)
