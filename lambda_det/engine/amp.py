"""Mixed-precision training steps in float16 or bfloat16, on GPUs and on the CPU.

Detectron2 0.6's ``AMPTrainer`` autocasts to float16 on CUDA only and always scales the loss.
bfloat16 has float32's exponent range, so it needs no loss scaling; the lambda layers keep their
float32 islands (softmax, the lambda contractions) under either dtype.
"""
import time

import torch

from detectron2.engine import SimpleTrainer

__all__ = ["MixedPrecisionTrainer", "AMP_DTYPES"]

AMP_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


class MixedPrecisionTrainer(SimpleTrainer):
    """Detectron2's ``SimpleTrainer`` step with the forward pass under ``torch.autocast``.

    Args:
        dtype: "float16" (with a ``GradScaler``, as detectron2's AMPTrainer) or "bfloat16" (no
            scaler).
        device_type: "cuda" or "cpu", the device the model runs on.
    """

    def __init__(self, model, data_loader, optimizer, dtype: str = "float16",
                 device_type: str = "cuda"):
        if dtype not in AMP_DTYPES:
            raise ValueError(f"SOLVER.AMP.DTYPE must be one of {sorted(AMP_DTYPES)}, got {dtype!r}")
        super().__init__(model, data_loader, optimizer)
        self.dtype, self.device_type = AMP_DTYPES[dtype], device_type
        self.grad_scaler = (torch.amp.GradScaler(device_type) if self.dtype == torch.float16
                            else None)

    def run_step(self):
        assert self.model.training, "[MixedPrecisionTrainer] model was changed to eval mode!"
        start = time.perf_counter()
        data = next(self._data_loader_iter)
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
        self._write_metrics(loss_dict, data_time)
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
