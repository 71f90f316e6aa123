"""Small demo tokenizers (Hugging Face tokenizer.json) for the text payload, built offline.

The zoo's BERT and GPT-2 have seeded random weights, so any tokenizer whose ids fit their
vocabularies serves them; these two are built from the payload paragraph in milliseconds,
with no download:

wordpiece  BERT-like: [PAD]=0, [UNK], [CLS], [SEP], [MASK], single characters and their ##
           continuations (any ASCII word encodes without [UNK]), then the paragraph's words;
           lower-cased, accents stripped, "[CLS] text [SEP]".
bpe        GPT-2-like byte-level BPE: <|endoftext|>=0 (also the pad token), the 256 byte symbols,
           then merges trained on the paragraph.

Both record their pad token in tokenizer.json's "padding" section.
"""
from __future__ import annotations

import string
from pathlib import Path

from packrat.codec.payloads import TEXT

KINDS = ("wordpiece", "bpe")
WORDPIECE_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
BPE_SPECIAL = "<|endoftext|>"
BPE_VOCAB_SIZE = 1024  # an upper bound: training stops when the paragraph has no pair left to merge


def demo_tokenizer_kind(model: str) -> str:
    """wordpiece for BERT-like encoders, bpe for GPT-2-like language models."""
    from packrat.models.zoo import resolve

    return "bpe" if resolve(model).task == "language-model" else "wordpiece"


def _wordpiece(text: str):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True, clean_text=True,
                                            handle_chinese_chars=True)
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    vocab: dict[str, int] = {}

    def add(token: str) -> None:
        vocab.setdefault(token, len(vocab))

    for token in WORDPIECE_SPECIALS:
        add(token)
    singles = string.ascii_lowercase + string.digits
    for char in singles + string.punctuation:
        add(char)
    for char in singles:
        add("##" + char)
    for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text)):
        add(word)
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizer
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.add_special_tokens(list(WORDPIECE_SPECIALS))  # already in the vocab: ids unchanged
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    tokenizer.enable_padding(pad_id=vocab["[PAD]"], pad_token="[PAD]")
    return tokenizer


def _bpe(text: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB_SIZE, min_frequency=1, show_progress=False,
                                  special_tokens=[BPE_SPECIAL], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([text], trainer)
    tokenizer.enable_padding(pad_id=tokenizer.token_to_id(BPE_SPECIAL), pad_token=BPE_SPECIAL)
    return tokenizer


def build_demo_tokenizer(out_dir: str | Path, kind: str, text: str = TEXT) -> Path:
    """Write OUT_DIR/tokenizer.json (kind "wordpiece" or "bpe", see the module doc); return its path."""
    if kind not in KINDS:
        raise ValueError(f"tokenizer kind must be one of {', '.join(KINDS)}, got {kind!r}")
    tokenizer = _wordpiece(text) if kind == "wordpiece" else _bpe(text)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "tokenizer.json"
    tokenizer.save(str(path), pretty=True)
    return path
