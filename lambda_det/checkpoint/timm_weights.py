"""timm's weights for a timm backbone (:class:`lambda_det.modeling.timm_backbone.TimmBackbone`),
as ``MODEL.WEIGHTS``:

* ``timm://NAME`` (``timm://lambda_resnet26t.c1_in1k``): the file timm's pretrained loading
  reads for that model, from the Hugging Face hub cache timm fills (``HF_HUB_CACHE``; with
  ``HF_HUB_OFFLINE=1`` the cache alone), downloaded there when it is not;
* a local file of timm's (a state dict: ``.safetensors``, ``.pth``, ``.bin``).

Either is read like any weights file (:func:`lambda_det.checkpoint.load_checkpoint_file`: no
code runs from it) and is the backbone's weights under its prefix
(:func:`timm_state_dict_to_model`): the checkpointer then loads and counts them as it loads a
detectron2 checkpoint. Importing this module registers the ``timm://`` prefix with detectron2's
PathManager, as detectron2 registers ``detectron2://``.
"""

from typing import Any, Dict, Optional

from detectron2.utils.file_io import PathManager
from iopath.common.file_io import PathHandler

from lambda_det.modeling.timm_backbone import TimmBackbone, import_timm
from lambda_det.utils.errors import MissingFileError, UserError

__all__ = ["TIMM_PREFIX", "timm_hub_file", "timm_state_dict_to_model"]

TIMM_PREFIX = "timm://"
# The files of a timm model on the hub, in the order timm's own loading prefers them.
HUB_FILES = ("model.safetensors", "pytorch_model.bin")


def timm_hub_file(
    name: str, cache_dir: Optional[str] = None, local_files_only: bool = False
) -> str:
    """The local path of timm's weights file of model ``name`` (with its pretrained tag), from
    the hub cache, downloaded into it when missing and the hub can be reached.

    Raises:
        UserError: ``name`` is not a timm model with pretrained weights on the hub.
        MissingFileError: the file is not in the cache and cannot be downloaded.
    """
    import huggingface_hub
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError
    from timm.models import get_pretrained_cfg

    timm = import_timm()
    pretrained_cfg = get_pretrained_cfg(name) if timm.is_model(name) else None
    repo = getattr(pretrained_cfg, "hf_hub_id", None)
    if not repo:
        lambda_models = ", ".join(timm.list_models("*lambda*", pretrained=True))
        raise UserError(
            f"MODEL.WEIGHTS {TIMM_PREFIX}{name}: timm has no pretrained weights on the hub for "
            f"{name!r}; name one of timm.list_models(pretrained=True), e.g. {lambda_models}"
        )
    for filename in HUB_FILES:
        try:
            return huggingface_hub.hf_hub_download(
                repo, filename, cache_dir=cache_dir, local_files_only=local_files_only
            )
        except EntryNotFoundError:  # the repo has the other file
            continue
        except LocalEntryNotFoundError:  # offline, or the hub cannot be reached
            if filename != HUB_FILES[-1]:
                continue
    raise MissingFileError(
        f"MODEL.WEIGHTS {TIMM_PREFIX}{name}: timm's weights of {name} are not in the Hugging "
        f"Face hub cache and cannot be downloaded here: on a machine with network access run "
        f"python -c \"import timm; timm.create_model('{name}', pretrained=True)\" (it fills "
        f"the cache; copy ~/.cache/huggingface/hub or set HF_HUB_CACHE), or pass the file "
        f"itself: MODEL.WEIGHTS path/to/model.safetensors"
    )


class TimmHubHandler(PathHandler):
    """``timm://NAME`` in detectron2's PathManager: the local path of timm's weights of NAME."""

    def _get_supported_prefixes(self):
        return [TIMM_PREFIX]

    def _get_local_path(self, path: str, **kwargs) -> str:
        return timm_hub_file(path[len(TIMM_PREFIX) :])

    def _open(self, path: str, mode: str = "r", **kwargs):
        return PathManager.open(self._get_local_path(path), mode, **kwargs)


def _timm_backbone(model) -> Optional[tuple]:
    """(prefix, TimmBackbone) of the timm backbone in a detectron2 model, or None."""
    model = getattr(model, "module", model)  # DDP
    for name, module in model.named_modules():
        if isinstance(module, TimmBackbone):
            return f"{name}.model." if name else "model.", module
    return None


def timm_state_dict_to_model(model, checkpoint: Dict[str, Any]) -> Dict[str, Any]:
    """``checkpoint`` (``{"model": weights, ...}``) with its weights under the prefix of the
    model's timm backbone (``backbone.bottom_up.model.``) when they are a timm state dict: when
    the model has a timm backbone and the weights hold none of the model's own names but names
    of the timm model (``stem.conv1.conv.weight``). Anything else is returned as it is."""
    found = _timm_backbone(model)
    if found is None:
        return checkpoint
    prefix, backbone = found
    weights = checkpoint["model"]
    own = set(model.state_dict())
    if any(key in own for key in weights) or not any(
        key in weights for key in backbone.model.state_dict()
    ):
        return checkpoint
    return {**checkpoint, "model": {prefix + key: value for key, value in weights.items()}}


PathManager.register_handler(TimmHubHandler())  # once: a module is imported once per process
