"""A tokenizer of E2B's size (262,144 entries) with Gemma 4's control tokens at their real ids.

Not Gemma 4's vocabulary: every id decodes (so any sampled id detokenizes) and any text encodes
(byte fallback), but the text pieces are letter strings, not trained ones. Layout, as Gemma's:
control tokens and <unusedN> placeholders below "\\n" (107) and from <|image> (255999) up; bytes,
ASCII and the letter pieces in between."""

from __future__ import annotations

import itertools
import string

from testkit import tiny_gemma4

from . import facts

LETTERS = string.ascii_lowercase
SPACE = "▁"  # SentencePiece's word boundary, which GemmaTokenizer's normalizer writes for " "


def _pieces():
    """Letter strings, shortest first, each with its merge: s = left + last letter (left already a piece)."""
    for length in itertools.count(1):
        for letters in itertools.product(LETTERS, repeat=length):
            word = "".join(letters)
            if length > 1:
                yield word, (word[:-1], word[-1])
            yield SPACE + word, (SPACE + word[:-1], word[-1])


def e2b_vocab() -> tuple[dict[str, int], list[tuple[str, str]]]:
    control, size = facts.control_ids(), facts.vocab_size()
    newline = tiny_gemma4.NEWLINE_ID
    # Gemma's text pieces stop where the multimodal markers begin; above them only placeholders.
    text_end = min(i for i in control.values() if i > newline)
    vocab = dict(control) | {"\n": newline}
    taken = set(vocab.values())
    placeholders = [i for i in range(size) if i not in taken and not newline < i < text_end]
    vocab.update({f"<unused{n}>": i for n, i in enumerate(placeholders)})
    free = (i for i in range(newline + 1, text_end) if i not in taken)
    # Byte fallback makes any UTF-8 text encodable; characters keep ASCII to one token each.
    for piece in [f"<0x{b:02X}>" for b in range(256)] + ["\t", SPACE] + [chr(c) for c in range(0x21, 0x7F)]:
        vocab[piece] = next(free)
    merges = []
    for (piece, merge), i in zip(_pieces(), free):
        vocab[piece] = i
        merges.append(merge)
    return vocab, merges


def build_tokenizer():
    return tiny_gemma4.build_tokenizer(e2b_vocab(), control_ids=facts.control_ids())
