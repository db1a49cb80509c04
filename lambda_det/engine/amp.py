"""Mixed-precision training steps in float16 or bfloat16, on GPUs and on the CPU.

Detectron2 0.6's ``AMPTrainer`` autocasts to float16 on CUDA only and always scales the loss.
bfloat16 has float32's exponent range, so it needs no loss scaling; the lambda layers keep their
float32 islands (softmax, the lambda contractions) under either dtype.
"""

import logging
import time
from typing import Optional

import torch
from detectron2.config import CfgNode
from detectron2.engine import SimpleTrainer

from lambda_det.compat.internals import next_training_batch, write_step_metrics
from lambda_det.utils.errors import UserError
from lambda_det.utils.run_defaults import AMP_DTYPE

__all__ = ["MixedPrecisionTrainer", "AMP_DTYPES", "cpu_amp_warning", "warn_about_slow_cpu_amp"]

AMP_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}

logger = logging.getLogger(__name__)


def _has_fast_cpu_kernels(dtype: str) -> bool:
    """Whether oneDNN has native kernels for ``dtype`` on this CPU (float16: AVX-512 FP16 or
    AMX; bfloat16: AVX-512); without them it falls back to reference code."""
    check = {"float16": "_is_mkldnn_fp16_supported", "bfloat16": "_is_mkldnn_bf16_supported"}
    try:
        return bool(getattr(torch.ops.mkldnn, check[dtype])())
    except (AttributeError, RuntimeError):  # a torch without the query
        return False


def cpu_amp_warning(cfg) -> Optional[str]:
    """The warning for autocast training on a CPU without kernels for its dtype, where oneDNN
    runs the convolutions' backward in reference code, or None. ``cfg``: a yaml CfgNode or a
    LazyConfig. Measured per training iteration against float32: float16 14x to 17x (the
    tiny shapes model on an AVX2 host; an LSJ recipe), bfloat16 6.6x on the AVX2 host."""
    if isinstance(cfg, CfgNode):
        enabled, dtype = cfg.SOLVER.AMP.ENABLED, cfg.SOLVER.AMP.get("DTYPE", AMP_DTYPE)
        device, bfloat16, off = (
            cfg.MODEL.DEVICE,
            "SOLVER.AMP.DTYPE bfloat16",
            "SOLVER.AMP.ENABLED False",
        )
    else:
        amp = cfg.train.get("amp", {})
        enabled, dtype = amp.get("enabled", False), amp.get("dtype", AMP_DTYPE)
        device, bfloat16, off = (
            cfg.train.device,
            "train.amp.dtype=bfloat16",
            "train.amp.enabled=False",
        )
    if (
        not enabled
        or dtype not in AMP_DTYPES
        or torch.device(device).type != "cpu"
        or _has_fast_cpu_kernels(dtype)
    ):
        return None
    if dtype == "bfloat16":
        return (
            f"bfloat16 autocast on this CPU trains several times slower than float32 (6.6x "
            f"measured): it lacks AVX-512, which oneDNN's bfloat16 kernels need; train in "
            f"float32 with {off}"
        )
    choice = (
        f"bfloat16 is the CPU's choice: set {bfloat16}"
        if _has_fast_cpu_kernels("bfloat16")
        else f"this CPU lacks AVX-512, which oneDNN's bfloat16 kernels need, so train in "
        f"float32 with {off}"
    )
    return (
        f"float16 autocast on the CPU trains many times slower than float32 (14x to 17x "
        f"measured: without float16 kernels, oneDNN runs the convolutions' backward in "
        f"reference code); {choice}"
    )


def warn_about_slow_cpu_amp(cfg) -> None:
    """Log :func:`cpu_amp_warning` when there is one."""
    warning = cpu_amp_warning(cfg)
    if warning:
        logger.warning(warning)


class MixedPrecisionTrainer(SimpleTrainer):
    """Detectron2's ``SimpleTrainer`` step with the forward pass under ``torch.autocast``.

    Args:
        dtype: "float16" (with a ``GradScaler``, as detectron2's AMPTrainer) or "bfloat16" (no
            scaler).
        device_type: "cuda" or "cpu", the device the model runs on.
    """

    def __init__(
        self, model, data_loader, optimizer, dtype: str = AMP_DTYPE, device_type: str = "cuda"
    ):
        if dtype not in AMP_DTYPES:
            raise UserError(f"SOLVER.AMP.DTYPE must be one of {sorted(AMP_DTYPES)}, got {dtype!r}")
        super().__init__(model, data_loader, optimizer)
        self.dtype, self.device_type = AMP_DTYPES[dtype], device_type
        self.grad_scaler = (
            torch.amp.GradScaler(device_type) if self.dtype == torch.float16 else None
        )

    def run_step(self):
        assert self.model.training, "[MixedPrecisionTrainer] model was changed to eval mode!"
        start = time.perf_counter()
        data = next_training_batch(self)
        data_time = time.perf_counter() - start
        with torch.autocast(self.device_type, dtype=self.dtype):
            loss_dict = self.model(data)
            if isinstance(loss_dict, torch.Tensor):
                loss_dict = {"total_loss": loss_dict}
            losses = sum(loss_dict.values())
        self.optimizer.zero_grad()
        if self.grad_scaler is None:
            losses.backward()
        else:
            self.grad_scaler.scale(losses).backward()
        write_step_metrics(self, loss_dict, data_time)
        if self.grad_scaler is None:
            self.optimizer.step()
        else:
            self.grad_scaler.step(self.optimizer)
            self.grad_scaler.update()

    def state_dict(self):
        state = super().state_dict()
        if self.grad_scaler is not None:
            state["grad_scaler"] = self.grad_scaler.state_dict()
        return state

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        if self.grad_scaler is not None and "grad_scaler" in state_dict:
            self.grad_scaler.load_state_dict(state_dict["grad_scaler"])
