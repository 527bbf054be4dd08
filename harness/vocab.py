"""The tiny fixture vocabulary: token id N is the word "tN" (0-2 are special tokens).

Frontends that detokenize (vllm-rs, vllm-py) use the tokenizer in fixtures/tiny-model;
the reference frontend uses this rule directly, so stop strings mean the same everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable

SPECIAL = {0: "<unk>", 1: "<s>", 2: "</s>"}
EOS_TOKEN_ID = 2


def token_text(token_id: int) -> str:
    return SPECIAL.get(token_id, f"t{token_id}")


def detokenize(token_ids: Iterable[int]) -> str:
    """Text as a word-level tokenizer with whitespace joining renders it (" t5 t6")."""
    return "".join(" " + token_text(t) for t in token_ids if t not in SPECIAL)
