"""The demo's byte-level BPE tokenizer, trained on the task's texts, with a small chat template."""

from __future__ import annotations

from collections.abc import Iterable

from aligner.demo.sft import MAX_POSITIONS

ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
# Each message is "<|role|>\n{content}\n"; an assistant turn ends with EOS instead of the newline, which is what
# the policy learns to emit. With add_generation_prompt the prompt ends in "<|assistant|>\n".
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|assistant|>\n' + message['content'] + eos_token }}"
    "{% else %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)

VOCAB_SIZE = 512
TOKENIZER_CORPUS_SIZE = 8192


# ---------------------------------------------------------------------------------------------------------------
# Tokenizer and policy


def train_tokenizer(texts: Iterable[str]):
    """A byte-level BPE tokenizer (vocab <= 512) with BOS/EOS/PAD and role tokens and the chat template.

    Plain `tokenizer(text)` prepends BOS; the chat template writes its own BOS, so tokenize its output with
    `add_special_tokens=False` (as aligner.data does).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = [PAD, BOS, EOS, *ROLE_TOKENS]
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        extra_special_tokens=list(ROLE_TOKENS),
        chat_template=CHAT_TEMPLATE,
        model_max_length=MAX_POSITIONS,
        clean_up_tokenization_spaces=False,
    )
