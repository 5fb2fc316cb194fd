"""`generation.engine: hf`: sampling with transformers' `generate` on the training model.

For any causal LM transformers supports (Qwen2, Gemma, Mistral, ...), with the architecture's own cache (Gemma's
sliding-window layers included), where `TorchGenerator`'s decode steps through the model one transformers forward at
a time. It returns what `TorchGenerator` returns, row for row: the log-probs are of the policy's unmodified
distribution (generate's raw logits, `output_logits=True`, not its processed scores), a response ends at EOS or at an
end string (not before `min_new_tokens`), and the same seed gives the same samples.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from aligner.generation.generator import GenerationOutput, TorchGenerator, left_pad


class HFGenerator(TorchGenerator):
    """`TorchGenerator`'s interface and output, with each chunk of prompts sampled by `model.generate`.

    It shares the training module (`update_weights` as `TorchGenerator`'s). Every prompt is repeated once per sample
    before generate (prompt-major rows, as `TorchGenerator` lays them out), so greedy decoding and sampling take the
    same path.
    """

    def _generate_chunk(self, prompts, num_samples, generator, device) -> GenerationOutput:
        model = self.model
        # generate takes no torch.Generator: it samples from the device's global RNG, seeded here from the run's
        # generator (one draw per chunk) and restored afterwards, so other code's randomness is untouched.
        seed = int(torch.randint(2**62, (1,), generator=generator, device=device))
        prompt_ids, prompt_mask = left_pad(prompts, self.pad_id, device)
        prompt_ids = prompt_ids.repeat_interleave(num_samples, dim=0)
        prompt_mask = prompt_mask.repeat_interleave(num_samples, dim=0)
        stop = _ResponseEnds(self, prompt_ids.shape[1])
        was_training = model.training
        model.eval()
        try:
            with _seeded(device, seed), _only_these_settings(model):
                out = model.generate(
                    input_ids=prompt_ids,
                    attention_mask=prompt_mask.long(),
                    generation_config=self._hf_config(),
                    stopping_criteria=[stop],
                )
        finally:
            model.train(was_training)

        response_ids = out.sequences[:, prompt_ids.shape[1] :]
        response_mask = torch.arange(response_ids.shape[1], device=device)[None, :] < stop.lengths[:, None]
        logits = torch.stack(out.logits, dim=1)  # raw: before temperature, top-k/p, penalties and the EOS ban
        logprobs = logits.float().log_softmax(-1).gather(-1, response_ids[..., None]).squeeze(-1)
        return GenerationOutput(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            response_ids=response_ids.masked_fill(~response_mask, self.pad_id),
            response_mask=response_mask,
            logprobs=logprobs.masked_fill(~response_mask, 0.0),
            is_end=stop.ended,
            group_ids=torch.empty(0, dtype=torch.long),
            responses=self.tokenizer.batch_decode(
                [ids[m].tolist() for ids, m in zip(response_ids, response_mask)], skip_special_tokens=True
            ),
        )

    def _hf_config(self):
        from transformers import GenerationConfig as HFGenerationConfig

        cfg = self.config
        # Greedy decoding ignores temperature, top-k and top-p (transformers warns when they are given).
        sampling = {} if cfg.greedy else dict(temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p)
        return HFGenerationConfig(
            max_new_tokens=cfg.max_new_tokens,
            min_new_tokens=cfg.min_new_tokens or None,
            do_sample=not cfg.greedy,
            **sampling,  # top_k 0: no top-k filter (transformers' own default would be 50)
            repetition_penalty=cfg.repetition_penalty,
            eos_token_id=self.eos_ids.tolist(),
            pad_token_id=self.pad_id,
            return_dict_in_generate=True,
            output_logits=True,
        )


class _ResponseEnds:
    """A transformers stopping criterion with `TorchGenerator`'s rules: a row ends at an EOS token or, from
    `min_new_tokens` tokens on, when its text ends with an end string. It counts each row's length and whether it
    ended, which `generate`'s output does not say (a finished row is padded with the pad id, which may be EOS)."""

    def __init__(self, generator: TorchGenerator, prompt_len: int):
        self.generator, self.prompt_len, self.tokens = generator, prompt_len, []
        self.lengths = self.ended = self.finished = None

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        gen, cfg = self.generator, self.generator.config
        if self.finished is None:
            batch, device = input_ids.shape[0], input_ids.device
            self.finished = torch.zeros(batch, dtype=torch.bool, device=device)
            self.ended = torch.zeros(batch, dtype=torch.bool, device=device)
            self.lengths = torch.zeros(batch, dtype=torch.long, device=device)
        self.tokens.append(input_ids[:, -1])
        self.lengths += ~self.finished
        now_ended = ~self.finished & torch.isin(input_ids[:, -1], gen.eos_ids.to(input_ids.device))
        if cfg.end_strings and len(self.tokens) >= cfg.min_new_tokens:
            now_ended |= ~self.finished & gen._hits_end_string(self.tokens, self.lengths)
        self.ended |= now_ended
        self.finished |= now_ended
        return self.finished.clone()


@contextlib.contextmanager
def _seeded(device: torch.device, seed: int):
    """The CPU's and `device`'s global RNG seeded with `seed`, their states restored on exit."""
    accelerator = device.type != "cpu"
    with torch.random.fork_rng(
        devices=[device] if accelerator else [], device_type=device.type if accelerator else None
    ):
        torch.default_generator.manual_seed(seed)
        if accelerator:
            module = torch.get_device_module(device.type)
            with module.device(device):
                module.manual_seed(seed)
        yield


@contextlib.contextmanager
def _only_these_settings(model: nn.Module):
    """generate fills every setting the call leaves unset from the model's own generation_config.json (a Qwen
    checkpoint's sets top_k 20 and repetition_penalty 1.05, others min_p or typical_p): emptied for the call, so
    sampling follows `generation.*` alone."""
    from transformers import GenerationConfig as HFGenerationConfig

    owner = model.get_base_model() if hasattr(model, "get_base_model") else model  # a peft wrapper's base
    saved = owner.generation_config
    owner.generation_config = HFGenerationConfig()
    try:
        yield
    finally:
        owner.generation_config = saved
