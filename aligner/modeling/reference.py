"""The frozen reference policy for the KL penalty: a copy of the initial policy kept on the CPU (or the LoRA base)."""

from __future__ import annotations

import torch
from torch import nn

from aligner.modeling.batches import ResponseBatch
from aligner.modeling.hf import frozen_copy
from aligner.modeling.logprobs import grouped_response_logprobs


class ReferencePolicy:
    """A frozen copy of the initial policy, kept in CPU memory and moved to the device only to compute log-probs.

    This is NeMo-Aligner's arrangement: on a GPU the reference costs no device memory between uses. With `dtype`
    (`model.precision: bf16-mixed`) the copy is kept in that dtype: half the memory, and computed at its speed.
    """

    def __init__(self, policy: nn.Module, dtype: torch.dtype | None = None):
        self.model = frozen_copy(policy, dtype, device="cpu")

    def logprobs(self, batch: ResponseBatch) -> torch.Tensor:
        device = batch.response_ids.device
        if device.type != "cpu":
            self.model.to(device)
        try:
            # Inference mode (cheaper per op than no_grad); the clone makes the result usable in autograd again.
            with torch.inference_mode():
                logprobs = grouped_response_logprobs(self.model, batch)
            return logprobs.clone()
        finally:
            if device.type != "cpu":
                self.model.to("cpu")

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()
