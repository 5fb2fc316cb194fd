"""The benchmarks' shared tiny model: the issue's Llama shape (hidden 128, 4 layers, 4 heads, vocab 512) and a
byte-level BPE tokenizer trained on a synthetic corpus, built offline. Imported by bench/rloo_step.py and
bench/reward_server.py (bench/trl_rloo_step.py runs in TRL's own environment and keeps its own copy).
"""

from __future__ import annotations

VOCAB = 512
SHAPE = dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4)


def bpe_tokenizer(corpus: list[str], vocab_size: int = VOCAB):
    """A byte-level BPE tokenizer with <pad>, <s> and </s>, wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        show_progress=False,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def llama_config(tokenizer, **extra):
    """The benchmark Llama's config for `tokenizer` (extra fields, e.g. num_labels=1, pass through)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB,
        max_position_embeddings=256,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **SHAPE,
        **extra,
    )
