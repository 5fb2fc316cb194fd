"""The frozen reference policy for the KL penalty: a copy of the initial policy kept on the CPU (or the LoRA base)."""

from __future__ import annotations

import copy

import torch
from torch import nn

from aligner.modeling.batches import ResponseBatch
from aligner.modeling.logprobs import grouped_response_logprobs


class ReferencePolicy:
    """A frozen copy of the initial policy, kept in CPU memory and moved to the device only to compute log-probs.

    This is NeMo-Aligner's arrangement: on a GPU the reference costs no device memory between uses.
    """

    def __init__(self, policy: nn.Module):
        self.model = copy.deepcopy(policy).to("cpu").eval()
        self.model.requires_grad_(False)

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
