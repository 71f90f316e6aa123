"""Text to the fixed-length row a text model reads (token ids, attention mask, token type ids),
with a Hugging Face tokenizer."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence

import torch

from packrat.errors import RequestError, first_line

PAD_TOKENS = ("[PAD]", "<pad>", "<|endoftext|>")  # BERT, T5/RoBERTa-style, GPT-2


class TextEncoder:
    """Tokenises, then pads to the model's length: on the left for language models (the
    next-token logits come from the last position), on the right otherwise."""

    def __init__(self, path: str, length: int, pad_left: bool, truncate: bool):
        from tokenizers import Tokenizer

        if os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(path):
            raise ValueError(f"tokenizer file not found: {path}")
        try:
            self.tokenizer = Tokenizer.from_file(path)
        except Exception as exc:  # the library raises plain Exception for bad files
            raise ValueError(f"cannot read tokenizer {path}: {first_line(exc)}") from None
        self.pad_id = _pad_id(self.tokenizer)
        self.length, self.pad_left, self.truncate = length, pad_left, truncate
        self._ready: dict = {}  # text -> its row or RequestError, while a batch is prepared()
        self.tokenizer.no_padding()  # padding is ours: its side depends on the task
        if truncate:  # the tokenizer's own truncation keeps special tokens such as [SEP]
            self.tokenizer.enable_truncation(length, direction="left" if pad_left else "right")
        else:
            self.tokenizer.no_truncation()

    def encode(self, text: str) -> dict[str, torch.Tensor]:
        """input_ids, attention_mask (1 on the text's tokens, 0 on the padding) and token_type_ids
        (the tokenizer's, 0 on the padding), each of the model's length. A text `prepared()` for
        its batch is not tokenised again."""
        ready = self._ready.get(text)
        if ready is not None:
            if isinstance(ready, RequestError):
                raise ready
            return dict(ready)  # the caller may take entries out of its row
        if not text.strip():
            raise _empty()
        return self._row(self.tokenizer.encode(text))

    @contextlib.contextmanager
    def prepared(self, texts: Sequence[str]):
        """Within the block, encode() answers these texts from one encode_batch call: a batch's
        texts tokenised together, each request still decoded (and failing) alone."""
        self._ready = dict(zip(texts, self.encode_batch(texts))) if texts else {}
        try:
            yield
        finally:
            self._ready = {}

    def encode_batch(self, texts: Sequence[str]) -> list[dict[str, torch.Tensor] | RequestError]:
        """encode's row for each text, through one call of the tokenizer (Rust, which may spread the
        texts over its threads). A text encode would refuse gets its RequestError in its place, not
        raised: one empty or too long text fails alone."""
        rows: list = [None if text.strip() else _empty() for text in texts]
        kept = [i for i, row in enumerate(rows) if row is None]
        for i, encoding in zip(kept, self.tokenizer.encode_batch([texts[i] for i in kept])):
            try:
                rows[i] = self._row(encoding)
            except RequestError as exc:
                rows[i] = exc
        return rows

    def _row(self, encoding) -> dict[str, torch.Tensor]:
        ids = encoding.ids
        if len(ids) > self.length:
            raise RequestError(413, f"text too long: {len(ids)} tokens, the model takes at most {self.length}")
        padding = self.length - len(ids)
        rows = {"input_ids": ids, "attention_mask": [1] * len(ids), "token_type_ids": list(encoding.type_ids)}
        fill = {"input_ids": self.pad_id, "attention_mask": 0, "token_type_ids": 0}
        return {name: torch.tensor(_padded(row, fill[name], padding, self.pad_left), dtype=torch.int64)
                for name, row in rows.items()}

    def token_text(self, token: int) -> str:
        return self.tokenizer.decode([token], skip_special_tokens=False)


def _empty() -> RequestError:
    return RequestError(400, "empty text: send the text to run the model on")


def _padded(row: list[int], value: int, count: int, left: bool) -> list[int]:
    pad = [value] * count
    return pad + row if left else row + pad


def _pad_id(tokenizer) -> int:
    """The tokenizer's own padding token if tokenizer.json names one, else a well-known one, else 0."""
    if tokenizer.padding:
        return int(tokenizer.padding["pad_id"])
    for token in PAD_TOKENS:
        found = tokenizer.token_to_id(token)
        if found is not None:
            return found
    return 0
