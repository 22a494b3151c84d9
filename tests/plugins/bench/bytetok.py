"""A byte-level tokenizer built in process (no download), with a chat template, for bench tests."""

from __future__ import annotations

from typing import Any


def byte_tokenizer() -> Any:
    """Ids 0-2 are <unk>, <s>, </s>; every byte has its own id from 3 (259 ids in all)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{c: 3 + i for i, c in enumerate(sorted(alphabet))}}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    tokenizer.chat_template = "{% for m in messages %}<s>{{ m['content'] }}{% endfor %}"
    return tokenizer
