"""The tiny fixture vocabulary: token id N is the word "tN" (0-2 are special tokens).

Frontends that detokenize (vllm-rs, vllm-py) use the tokenizer in fixtures/tiny-model;
the reference frontend uses this rule directly, so stop strings mean the same everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable

SPECIAL = {0: "<unk>", 1: "<s>", 2: "</s>"}
EOS_TOKEN_ID = 2
BOS_TOKEN_ID = 1
# fixtures/tiny-model/config.json's vocab_size and max_position_embeddings (a test checks).
VOCAB_SIZE = 1000
MAX_POSITION_EMBEDDINGS = 2048
# A non-special token's text in a stream, `{id}` its id: the rule a port without a tokenizer
# applies (the driver protocol hands it over in init.model.token_text).
TEXT_TEMPLATE = " t{id}"


def token_text(token_id: int) -> str:
    return SPECIAL.get(token_id, f"t{token_id}")


def detokenize(token_ids: Iterable[int]) -> str:
    """Text as a word-level tokenizer with whitespace joining renders it (" t5 t6"); special
    tokens render as nothing (skip_special_tokens)."""
    return "".join(TEXT_TEMPLATE.format(id=t) for t in token_ids if t not in SPECIAL)
