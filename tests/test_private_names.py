"""No name private to torch, torchvision, detectron2, fvcore, timm or the standard library (a
leading underscore) is used outside lambda_det/compat/, but for the allow-list below."""

import ast
import sys

from conftest import REPO_ROOT

LIBRARIES = {"torch", "torchvision", "detectron2", "fvcore", "timm", "iopath"} | set(
    sys.stdlib_module_names if hasattr(sys, "stdlib_module_names") else ()
)

# Still used outside compat/ (file: private names), each for a reason; moving them to compat/ is
# open work (issue 44, point 3).
ALLOWED = {
    # os._exit: the documented way to end a process without cleanup (os module docs).
    "lambda_det/engine/interrupt.py": {"os._exit"},
    # argparse's append action, subclassed for --coco-dataset (argparse exports no action class).
    "lambda_det/cli/arguments.py": {"argparse._AppendAction"},
    # sympy functions of torch's symbolic sizes, which a .pt2's expressions name.
    "lambda_det/export/_archive.py": {"torch.utils._sympy.functions"},
    # the export's backed_size_oblivious setting; torch._dynamo.exc.UserError, what torch.export
    # raises for violated constraints.
    "lambda_det/export/program.py": {"torch.fx.experimental._config", "torch._dynamo"},
    # the base class of every batch norm, for isinstance.
    "lambda_det/modeling/blocks.py": {"torch.nn.modules.batchnorm._BatchNorm"},
    # timm's feature index helper (public in timm, but defined in a private module).
    "lambda_det/modeling/timm_models.py": {"timm.models._features.feature_take_indices"},
}


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def private_names(source: str) -> set:
    """The private library names ``source`` imports or reads through a module it imported."""
    tree, modules, found = ast.parse(source), {}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in LIBRARIES:
                    modules[alias.asname or alias.name.split(".")[0]] = (
                        alias.name if alias.asname else alias.name.split(".")[0]
                    )
                    if any(_private(part) for part in alias.name.split(".")):
                        found.add(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in LIBRARIES:
                for alias in node.names:
                    name = f"{node.module}.{alias.name}"
                    modules[alias.asname or alias.name] = name
                    if any(_private(part) for part in name.split(".")):
                        found.add(name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            chain, root = [], node
            while isinstance(root, ast.Attribute):
                chain.append(root.attr)
                root = root.value
            if isinstance(root, ast.Name) and root.id in modules:
                # The private part and what leads to it (torch._dynamo.config -> torch._dynamo).
                parts = [modules[root.id], *reversed(chain)]
                first = next(i for i, part in enumerate(parts) if _private(part.split(".")[-1]))
                found.add(".".join(parts[: first + 1]))
    return found


def test_private_names_of_libraries_stay_in_compat():
    used = {}
    for path in sorted((REPO_ROOT / "lambda_det").rglob("*.py")):
        relative = path.relative_to(REPO_ROOT).as_posix()
        if relative.startswith("lambda_det/compat/"):
            continue
        names = private_names(path.read_text())
        if names:
            used[relative] = names
    extra = {
        path: sorted(names - ALLOWED.get(path, set()))
        for path, names in used.items()
        if names - ALLOWED.get(path, set())
    }
    assert extra == {}, "private library names outside lambda_det/compat/: move them there"


def test_the_walk_finds_private_names():
    """The control: each form of use is found."""
    source = (
        "import torch\nimport torch.fx.experimental._config\nfrom timm.models._features import f\n"
        "import argparse as ap\nx = torch._dynamo.config\ny = ap._AppendAction\nz = torch.nn.ReLU\n"
    )
    assert private_names(source) == {
        "torch.fx.experimental._config",
        "timm.models._features.f",
        "torch._dynamo",
        "argparse._AppendAction",
    }
