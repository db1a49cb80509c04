"""The shipped configs (configs/ in a checkout; ``lambda_det/model_zoo/configs`` in an installed
package, where setup.py copies them), found by name. :mod:`lambda_det.model_zoo` is their public
face; the config loaders resolve names here, so the config package needs no model zoo."""

from pathlib import Path
from typing import List

from lambda_det.utils.errors import MissingFileError

__all__ = ["config_root", "list_configs", "get_config_file"]


def config_root() -> Path:
    """The folder of the shipped configs: inside the installed package (setup.py copies them
    there), or the checkout's configs/ for a source tree or an editable install."""
    packaged = Path(__file__).resolve().parents[1] / "model_zoo" / "configs"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "configs"


def list_configs() -> List[str]:
    """Every shipped config, as paths relative to :func:`config_root`: the yaml configs (Base-*
    files included) and the LazyConfig .py recipes (LazyConfigs/, common/ pieces included)."""
    root = config_root()
    return sorted(
        str(path.relative_to(root))
        for pattern in ("*.yaml", "*.py")
        for path in root.rglob(pattern)
        if path.name != "__init__.py"
    )


def get_config_file(name: str) -> str:
    """The path of a shipped config, given its path under configs/ or a unique file name, with
    or without ``.yaml`` (e.g. "lambda_r152_mask_rcnn"); a name ending in ``.py`` is a
    LazyConfig recipe (e.g. "lambda_r152_mask_rcnn.py").

    Raises:
        FileNotFoundError: no shipped config has that name, or several do (names them).
    """
    wanted = name if name.endswith((".yaml", ".py")) else name + ".yaml"
    root = config_root()
    matches = [
        relative
        for relative in list_configs()
        if relative == wanted or Path(relative).name == wanted
    ]
    if len(matches) == 1:
        return str(root / matches[0])
    if matches:
        raise MissingFileError(f"config name {name!r} is ambiguous: give one of {matches}")
    shipped = [
        relative
        for relative in list_configs()
        if not Path(relative).name.startswith("Base") and "/common/" not in relative
    ]
    raise MissingFileError(
        f"config {name!r} is neither a file nor a shipped config; shipped: {', '.join(shipped)}"
    )
