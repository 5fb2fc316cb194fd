"""One rank of the 2-process Megatron test (tests/aligner/modeling/test_megatron.py); rank 0 saves results to argv[1].

    .venv/bin/python -m torch.distributed.run --nproc_per_node 2 --master_port PORT \\
        tests/helpers/megatron_worker.py OUT.pt

Runs on the CPU over gloo under the torch.cuda shim: tensor parallel 2 (log-probs, gathered round trip, one
REINFORCE step), then tensor parallel 1 with data parallel 2 (log-probs, one step on half the batch per rank), then
pipeline parallel 2 (log-probs, gathered round trip, one step through Megatron's 1F1B schedule in 3 micro-batches;
untied, and tied with biases). The reference numbers come from the plain Hugging Face model on the same weights.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import megatron_shim  # noqa: E402
from architectures import TINY_SHAPE  # noqa: E402

megatron_shim.install()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from aligner.algorithms.reinforce import reinforce_loss  # noqa: E402
from aligner.modeling import megatron as mb  # noqa: E402
from aligner.modeling.batches import ResponseBatch  # noqa: E402
from aligner.modeling.logprobs import grouped_response_logprobs, response_logprobs  # noqa: E402

LR, MAX_GRAD_NORM, MICRO_BATCH = 1e-3, 0.05, 4


def tiny_llama(tied_and_biased: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=300,
        **TINY_SHAPE,
        tie_word_embeddings=tied_and_biased,
        attention_bias=tied_and_biased,
        mlp_bias=tied_and_biased,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        attn_implementation="eager",
    )
    model = LlamaForCausalLM(config)
    # Random norms and biases, so that a wrong mapping of them cannot hide behind their initial ones and zeros.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                p.normal_(0, 0.1)
    return model


def make_batch() -> tuple[ResponseBatch, torch.Tensor, torch.Tensor]:
    """3 prompts of lengths 6, 3, 4 (left-padded), 2 responses each of lengths 5, 3, 1, 4, 2, 5 (right-padded)."""
    g = torch.Generator().manual_seed(1)
    prompt_lengths, response_lengths = [6, 3, 4], [5, 3, 1, 4, 2, 5]
    p, t = max(prompt_lengths), max(response_lengths)
    prompt_ids = torch.randint(3, 300, (3, p), generator=g)
    prompt_mask = torch.arange(p)[None, :] >= p - torch.tensor(prompt_lengths)[:, None]
    prompt_ids = prompt_ids.masked_fill(~prompt_mask, 0)
    response_ids = torch.randint(3, 300, (6, t), generator=g)
    response_mask = torch.arange(t)[None, :] < torch.tensor(response_lengths)[:, None]
    response_ids = response_ids.masked_fill(~response_mask, 0)
    batch = ResponseBatch(prompt_ids, prompt_mask, torch.tensor([0, 0, 1, 1, 2, 2]), response_ids, response_mask)
    advantages = torch.randn(6, generator=g)
    return batch, advantages, response_mask.float()


def optimizer_for(params):
    return torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.01)


def hf_step(model, batch, advantages, loss_mask) -> tuple[float, float]:
    """The trainer's `optimise` on the plain HF model: micro-batches, global normaliser, clipping, AdamW."""
    model.train()
    optimizer = optimizer_for(model.parameters())
    normalizer = loss_mask.sum().clamp(min=1)
    total = 0.0
    for start in range(0, batch.response_ids.shape[0], MICRO_BATCH):
        rows = slice(start, start + MICRO_BATCH)
        sub = batch.subset(rows)
        logprobs = grouped_response_logprobs(model, sub)
        mask = loss_mask[rows, : logprobs.shape[1]]
        loss = reinforce_loss(logprobs, advantages[rows], mask, "token_mean", normalizer)
        loss.backward()
        total += loss.item()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
    optimizer.step()
    return total, grad_norm.item()


def megatron_logprobs(hf_model, tp: int, batch) -> tuple[object, torch.Tensor]:
    model = mb.build_megatron_model(hf_model.config, hf_model.state_dict(), tensor_model_parallel_size=tp)
    model.eval()
    with torch.no_grad():
        return model, mb.megatron_response_logprobs(model, batch)


def main() -> None:
    out_path = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    batch, advantages, loss_mask = make_batch()
    results: dict[str, object] = {"response_mask": batch.response_mask}

    hf = tiny_llama(tied_and_biased=False)
    tied = tiny_llama(tied_and_biased=True)
    input_ids, attention_mask = batch.sequences()
    hf.eval()
    with torch.no_grad():
        results["hf_logprobs"] = response_logprobs(hf, input_ids, attention_mask, batch.response_ids.shape[1])
        results["hf_tied_logprobs"] = response_logprobs(tied, input_ids, attention_mask, batch.response_ids.shape[1])
    stepped = copy.deepcopy(hf)
    results["hf_loss"], results["hf_grad_norm"] = hf_step(stepped, batch, advantages, loss_mask)
    results["hf_after_step"] = {k: v.detach().clone() for k, v in stepped.state_dict().items()}
    results["hf_state"] = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    stepped_tied = copy.deepcopy(tied)
    results["hf_tied_loss"], results["hf_tied_grad_norm"] = hf_step(stepped_tied, batch, advantages, loss_mask)
    results["hf_tied_after_step"] = {k: v.detach().clone() for k, v in stepped_tied.state_dict().items()}
    results["hf_tied_state"] = {k: v.detach().clone() for k, v in tied.state_dict().items()}

    # Tensor parallel 2: both ranks hold half of every sharded weight and see the same batch.
    mb.init_megatron_parallel(tensor_model_parallel_size=2, seed=0)
    model, results["tp2_logprobs"] = megatron_logprobs(hf, 2, batch)
    results["tp2_roundtrip"] = mb.model_to_hf_state_dict(model, hf.config)
    _, results["tp2_tied_logprobs"] = megatron_logprobs(tied, 2, batch)
    optimizer = optimizer_for(model.parameters())
    metrics = mb.megatron_reinforce_step(
        model, optimizer, batch, advantages, loss_mask, micro_batch_size=MICRO_BATCH, max_grad_norm=MAX_GRAD_NORM
    )
    results["tp2_loss"], results["tp2_grad_norm"] = metrics["train_optim/loss"], metrics["train_optim/grad_norm"]
    results["tp2_after_step"] = mb.model_to_hf_state_dict(model, hf.config)

    # Tensor parallel 1 and data parallel 2: each rank steps on its own half of the responses.
    mb.init_megatron_parallel(tensor_model_parallel_size=1, seed=0)
    model, results["tp1_logprobs"] = megatron_logprobs(hf, 1, batch)
    rows = slice(0, 3) if rank == 0 else slice(3, 6)
    half = batch.subset(rows)
    metrics = mb.megatron_reinforce_step(
        model,
        optimizer_for(model.parameters()),
        half,
        advantages[rows],
        loss_mask[rows, : half.response_ids.shape[1]],
        micro_batch_size=2,
        max_grad_norm=MAX_GRAD_NORM,
    )
    results["dp2_loss"], results["dp2_grad_norm"] = metrics["train_optim/loss"], metrics["train_optim/grad_norm"]
    results["dp2_after_step"] = mb.model_to_hf_state_dict(model, hf.config)

    # Pipeline parallel 2 (TP 1): rank 0 holds the embedding and layer 0, rank 1 layer 1, the final norm and the
    # output layer (with tied embeddings, Megatron's copy of the embedding). Micro-batches of 2: 3 in the schedule.
    mb.init_megatron_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=2, seed=0)
    for name, source in (("pp2", hf), ("pp2_tied", tied)):
        model = mb.build_megatron_model(source.config, source.state_dict(), pipeline_model_parallel_size=2)
        model.eval()
        with torch.no_grad():
            results[f"{name}_logprobs"] = mb.megatron_response_logprobs(model, batch, micro_batch_size=2)
        results[f"{name}_roundtrip"] = mb.model_to_hf_state_dict(model, source.config)
        metrics = mb.megatron_reinforce_step(
            model,
            optimizer_for(model.parameters()),
            batch,
            advantages,
            loss_mask,
            micro_batch_size=2,
            max_grad_norm=MAX_GRAD_NORM,
        )
        results[f"{name}_loss"], results[f"{name}_grad_norm"] = (
            metrics["train_optim/loss"],
            metrics["train_optim/grad_norm"],
        )
        results[f"{name}_after_step"] = mb.model_to_hf_state_dict(model, source.config)
        # What the last stage reported, seen on the first: the loss and norm are broadcast to every rank.
        results[f"{name}_rank_metrics"] = [None, None]
        dist.all_gather_object(results[f"{name}_rank_metrics"], metrics)
    # The last stage's copy of the tied embedding took the same step as the embedding on the first stage.
    copy_diff = 0.0
    if rank == 1:
        embedding = results["pp2_tied_after_step"]["model.embed_tokens.weight"]
        copy_diff = (model.output_layer.weight.detach() - embedding).abs().max().item()
    gathered = [None, None]
    dist.all_gather_object(gathered, copy_diff)
    results["pp2_tied_copy_diff"] = gathered[1]

    if rank == 0:
        torch.save(results, out_path)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
