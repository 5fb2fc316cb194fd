"""A batch of responses grouped by prompt (each distinct prompt once), and positions over left-padded rows."""

from __future__ import annotations

from dataclasses import dataclass

import torch


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens only, so left padding does not shift them."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


@dataclass
class ResponseBatch:
    """B responses to G distinct prompts, each prompt stored once: the input of every log-prob computation."""

    prompt_ids: torch.Tensor  # [G, P] left-padded
    prompt_mask: torch.Tensor  # [G, P] bool
    group: torch.Tensor  # [B] the prompt (row of prompt_ids) each response answers
    response_ids: torch.Tensor  # [B, T] right-padded
    response_mask: torch.Tensor  # [B, T] bool

    def subset(self, rows: slice) -> ResponseBatch:
        """The responses `rows` with only their prompts, and without columns that are padding in every row."""
        used, group = torch.unique(self.group[rows], return_inverse=True)
        prompt_mask = self.prompt_mask[used]
        first = int(prompt_mask.any(0).long().argmax())
        response_mask = self.response_mask[rows]
        t = max(1, int(response_mask.sum(-1).max()))
        prompt_ids, prompt_mask = self.prompt_ids[used, first:], prompt_mask[:, first:]
        return ResponseBatch(prompt_ids, prompt_mask, group, self.response_ids[rows, :t], response_mask[:, :t])

    def sequences(self) -> tuple[torch.Tensor, torch.Tensor]:
        """[prompt | response] rows (input ids, attention mask), each prompt repeated for its responses."""
        return (
            torch.cat([self.prompt_ids[self.group], self.response_ids], dim=1),
            torch.cat([self.prompt_mask[self.group], self.response_mask], dim=1),
        )
