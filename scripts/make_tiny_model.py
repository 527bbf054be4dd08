"""Regenerate fixtures/tiny-model: a weightless tiny llama model directory for the real frontends.

Both real vLLM 0.33.0 frontends need a model directory only for its config and tokenizer (the
engines behind them are mocks or a stub executor, so there are no weights). Shipping the directory
in the repo means nothing is downloaded at test time.

Tokenizer design (verified against vllm-rs 0.33.0, which loads tokenizer.json with the "fastokens"
crate first and falls back to HF tokenizers with a WARNING if fastokens rejects it):

* fastokens implements only the BPE model, the Split/ByteLevel pre-tokenizers and the ByteLevel
  decoder; it rejects WordLevel, Whitespace, WhitespaceSplit and the WordPiece decoder. So this is
  a GPT-2-style byte-level BPE with an empty merge list and ``ignore_merges: true`` (a pre-token
  found whole in the vocabulary is one token). Pre-tokenizer: Split on ``\\s+`` (removed), then
  ByteLevel with ``add_prefix_space`` so every word gets its leading space (``Ġ``). HF tokenizers
  gives the same ids.
* Vocabulary: id 0 ``<unk>``, 1 ``<s>`` (bos), 2 ``</s>`` (eos), then id N is ``ĠtN`` (`` tN``)
  for N = 3..999. So token id N decodes to the text `` tN`` (leading space): ids [9, 10, 11] come
  back as " t9 t10 t11", streamed as " t9", " t10", " t11". Any whitespace-separated text of
  ``tN`` words encodes to those ids (``"t5 t6\\nt7"`` -> [5, 6, 7]). No BOS is added (no
  post-processor): a prompt's ids are exactly what was sent.
* Known divergence: fastokens ignores ``unk_token`` and rejects a text prompt with a word outside
  the vocabulary (vllm-rs answers HTTP 500 "character ... not in vocabulary"); HF tokenizers maps
  such a word to ``<unk>`` (id 0). Use only ``tN`` words in text prompts, or token-id prompts.
* tokenizer_config.json carries a trivial chat template (message contents joined by a space), so
  chat endpoints render ``[{"content": "t5 t6"}]`` to [5, 6].

The output is deterministic (fixed key order, LF line endings). Stdlib only.

Usage: python scripts/make_tiny_model.py [--out DIR] [--check]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "fixtures" / "tiny-model"

VOCAB_SIZE = 1000
UNK, BOS, EOS = "<unk>", "<s>", "</s>"
MAX_POSITIONS = 2048
SPACE = "\u0120"  # byte-level BPE's printable stand-in for the space byte ("Ġ")
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['content'] }}"
    "{% if not loop.last %} {% endif %}{% endfor %}"
)


def vocab() -> dict[str, int]:
    """The 1000-entry vocabulary: three special tokens, then ``ĠtN`` (text `` tN``) for id N."""
    words = {UNK: 0, BOS: 1, EOS: 2}
    words.update({f"{SPACE}t{i}": i for i in range(3, VOCAB_SIZE)})
    return words


def config() -> dict[str, object]:
    """A tiny llama config (no weights exist; only the shapes and ids matter)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "head_dim": 16,
        "hidden_act": "silu",
        "vocab_size": VOCAB_SIZE,
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-06,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "bfloat16",
    }


def tokenizer() -> dict[str, object]:
    """tokenizer.json loadable by both fastokens (vllm-rs) and HF tokenizers."""
    special = [
        {
            "id": i,
            "content": tok,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, tok in enumerate((UNK, BOS, EOS))
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": special,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": "\\s+"},
                    "behavior": "Removed",
                    "invert": False,
                },
                {
                    "type": "ByteLevel",
                    "add_prefix_space": True,
                    "trim_offsets": False,
                    "use_regex": False,
                },
            ],
        },
        "post_processor": None,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": True,
            "trim_offsets": True,
            "use_regex": True,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": UNK,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": False,
            "ignore_merges": True,
            "vocab": vocab(),
            "merges": [],
        },
    }


def tokenizer_config() -> dict[str, object]:
    """tokenizer_config.json: special tokens, max length and a trivial chat template."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": UNK,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POSITIONS,
        "chat_template": CHAT_TEMPLATE,
    }


def generation_config() -> dict[str, object]:
    """generation_config.json: only the special ids, so no sampling defaults are imposed."""
    return {"bos_token_id": 1, "eos_token_id": 2}


def render_files() -> dict[str, str]:
    """File name -> exact file text."""

    def dump(obj: object, indent: int | None = 2) -> str:
        return json.dumps(obj, indent=indent, ensure_ascii=False) + "\n"

    return {
        "config.json": dump(config()),
        "generation_config.json": dump(generation_config()),
        "tokenizer.json": dump(tokenizer()),
        "tokenizer_config.json": dump(tokenizer_config()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the files on disk differ; write nothing"
    )
    args = parser.parse_args(argv)
    out: Path = args.out
    files = render_files()
    if args.check:
        stale = [
            name
            for name, text in files.items()
            if not (out / name).is_file() or (out / name).read_text(encoding="utf-8") != text
        ]
        for name in stale:
            print(f"stale: {out / name}", file=sys.stderr)
        return 1 if stale else 0
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8", newline="\n")
    print(f"wrote {len(files)} files to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
