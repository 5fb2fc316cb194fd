"""One rank of the vllm engine's torchrun test (tests/aligner/generation/test_vllm_engine.py):

    python -m torch.distributed.run --standalone --nproc_per_node 2 -m tests.helpers.vllm_worker POLICY_DIR OUT_DIR

Each rank starts its own engine on torchrun's process group and uses it on its own: rank 1 samples twice, rank 0
pushes changed weights first. Each writes its max log-prob error against its policy and what a sum over the group
gives after the engine closed (the group must outlive it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from aligner.config import GenerationConfig
from aligner.generation.vllm_engine import VllmGenerator
from aligner.modeling.hf import load_policy, load_tokenizer
from aligner.modeling.logprobs import grouped_response_logprobs


def main(policy_dir: str, out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tokenizer, policy = load_tokenizer(policy_dir), load_policy(policy_dir)
    config = GenerationConfig(max_new_tokens=6)
    gen = VllmGenerator(policy_dir, tokenizer, config, [tokenizer.eos_token_id], torch.float32, 32, seed=rank)
    prompts = [[5, 6, 7]] if rank == 0 else [[8, 9, 10, 11], [12, 13]]
    if rank == 0:
        with torch.no_grad():
            policy.lm_head.weight.mul_(3.0)
        gen.update_weights(policy)
    else:
        gen.generate(prompts, 2, seed=0)
    with torch.no_grad():
        out = gen.generate(prompts, 2, seed=rank)
        expected = grouped_response_logprobs(policy, out.response_batch()) * out.response_mask
    gen.close()
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    result = {"error": (expected - out.logprobs).abs().max().item(), "sum": total.item()}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
