"""Hugging Face ``save_pretrained`` directories as packrat models (``--model hf:DIR``).

The directory's weights are loaded with the optional ``transformers`` package (``pip install
'packrat-serve[hf]'``); nothing is ever downloaded. Each model is wrapped in a small module that takes
the spec's inputs positionally (``input_ids, attention_mask[, token_type_ids]``) and returns
one tensor, so it traces (``script``) and compiles like the zoo's models:

- an encoder (BERT, DistilBERT, RoBERTa) whose config names a ``*ForSequenceClassification``
  architecture: task ``classification``, the logits ``(batch, num_labels)``; the config's
  ``id2label`` becomes the spec's labels file (TorchServe's ``index_to_name.json``);
- any other encoder: task ``embedding``, the last hidden states averaged over the attention
  mask ``(batch, hidden)``, the same however much right padding follows a text;
- GPT-2: task ``language-model``, the next-token logits of the last position ``(batch, vocab)``.
  Requests are padded on the left, so the position ids are counted from each row's first real
  token, which makes the logits the same as for the unpadded text.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import tempfile
from contextlib import contextmanager

import torch
from torch import nn

from packrat.errors import first_line
from packrat.models.spec import ModelSpec, token_inputs

ENCODERS = ("bert", "distilbert", "roberta")
DECODERS = ("gpt2",)
SUPPORTED = ENCODERS + DECODERS
DEFAULT_LENGTH = 128  # the sequence length when no --input-shape is given (at most the model's own limit)
# Models whose position ids start after the padding index (positions padding_idx + 1 ...):
# they take max_position_embeddings - (pad_token_id + 1) tokens.
OFFSET_POSITIONS = ("roberta",)
# Scaled-dot-product attention: traces (script mode), exports and compiles (compile mode) with
# the mask taken as an input, and is the faster kernel on CPU; "eager" (explicit softmax) works too.
ATTENTION = "sdpa"
LABELS_DIR = "packrat-hf-labels"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".index.json")  # model.safetensors, pytorch_model.bin, shards
INSTALL_HINT = "pip install 'packrat-serve[hf]'"


def from_pretrained_dir(path: str, input_shape: tuple[int, ...] | None) -> ModelSpec:
    """The ModelSpec of the save_pretrained directory `path`. input_shape, if given, is the
    sequence length as a 1-tuple (e.g. (64,)); otherwise min(128, the model's longest input)."""
    if not path.strip():
        raise ValueError("hf: needs a save_pretrained directory, e.g. hf:./my-bert")
    directory = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(directory):
        raise ValueError(f"Hugging Face model directory not found: {path}")
    config_file = os.path.join(directory, "config.json")
    if not os.path.isfile(config_file):
        raise ValueError(f"{path} is not a Hugging Face save_pretrained directory: it has no config.json")
    model_type = _model_type(config_file)
    if model_type not in SUPPORTED:
        raise ValueError(f"Hugging Face model {path} has model_type {model_type!r}: packrat serves "
                         f"{', '.join(SUPPORTED)}")
    transformers = _transformers(path)
    try:
        config = transformers.AutoConfig.from_pretrained(directory, local_files_only=True)
    except Exception as exc:  # transformers raises OSError, ValueError, KeyError... for a bad config
        raise ValueError(f"cannot read the Hugging Face config of {path}: {first_line(exc)}") from None

    task, class_name = _task(config, model_type, path)
    length = _length(config, model_type, input_shape, path)
    vocab_size = int(config.vocab_size)
    token_types = (_takes_token_types(transformers, class_name)
                   and int(getattr(config, "type_vocab_size", 0) or 0) > 1)
    labels = _labels_file(config, directory, config_file) if task == "classification" else None
    tokenizer = os.path.join(directory, "tokenizer.json")

    def build() -> nn.Module:
        return _load(directory, task, model_type)

    return ModelSpec(
        name=os.path.basename(directory),
        build=build,
        inputs=token_inputs(length, vocab_size, token_types=token_types),
        scriptable=True,
        task=task,
        description=f"Hugging Face {model_type} ({class_name}) from {path}",
        labels=labels,
        tokenizer=tokenizer if os.path.isfile(tokenizer) else None,
        sources=_sources(transformers, directory, class_name),
    )


class Classifier(nn.Module):
    """(input_ids, attention_mask[, token_type_ids]) -> logits (batch, num_labels)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.model(**_encoder_args(input_ids, attention_mask, token_type_ids)).logits


class Embedder(nn.Module):
    """(input_ids, attention_mask[, token_type_ids]) -> mean of the last hidden states over the
    mask (batch, hidden): the padding's states are left out, so padding changes nothing."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.model(**_encoder_args(input_ids, attention_mask, token_type_ids)).last_hidden_state
        mask = attention_mask.unsqueeze(-1)
        # where, not a product: a padding state that is not finite must not leak into the sum
        total = torch.where(mask != 0, hidden, torch.zeros_like(hidden)).sum(dim=1)
        count = mask.sum(dim=1).clamp(min=1).to(hidden.dtype)
        return total / count


class NextToken(nn.Module):
    """(input_ids, attention_mask) of left-padded prompts -> the last position's logits (batch, vocab)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # Positions count real tokens only, so a left-padded prompt sees the positions it would unpadded.
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=False, return_dict=True)
        return out.logits[:, -1, :]


def _encoder_args(input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  token_type_ids: torch.Tensor | None) -> dict:
    args = {"input_ids": input_ids, "attention_mask": attention_mask, "return_dict": True}
    if token_type_ids is not None:
        args["token_type_ids"] = token_type_ids
    return args


def _load(directory: str, task: str, model_type: str) -> nn.Module:
    """The wrapped model, its weights read from `directory`, float32, in eval mode."""
    transformers = _transformers(directory)
    auto = {"classification": transformers.AutoModelForSequenceClassification,
            "embedding": transformers.AutoModel,
            "language-model": transformers.AutoModelForCausalLM}[task]
    with _no_progress_bar(transformers):
        model = auto.from_pretrained(directory, local_files_only=True, attn_implementation=ATTENTION,
                                     **{_dtype_argument(transformers): torch.float32})
    model = model.float().eval()
    if model_type in DECODERS:
        model.config.use_cache = False  # one forward pass per request: no key/value cache to return
    wrapper = {"classification": Classifier, "embedding": Embedder, "language-model": NextToken}[task]
    return wrapper(model).eval()


def _transformers(path: str):
    try:
        import transformers
    except ImportError:
        raise ValueError(f"Hugging Face model {path} needs the optional transformers package: "
                         f"{INSTALL_HINT}") from None
    return transformers


def _model_type(config_file: str) -> str:
    try:
        with open(config_file, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {config_file}: {first_line(exc)}") from None
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if not isinstance(model_type, str):
        raise ValueError(f"{config_file} names no model_type: packrat serves {', '.join(SUPPORTED)}")
    return model_type


def _task(config, model_type: str, path: str) -> tuple[str, str]:
    """(task, the transformers class that is loaded) for this config."""
    from transformers.models.auto import modeling_auto

    architectures = list(getattr(config, "architectures", None) or [])
    if model_type in DECODERS:
        heads = [a for a in architectures if a not in ("GPT2LMHeadModel", "GPT2Model")]
        if heads:
            raise ValueError(f"Hugging Face model {path} is a {heads[0]}: packrat serves GPT-2 as a "
                             f"language model (GPT2LMHeadModel) only")
        return "language-model", modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]
    if any(a.endswith("ForSequenceClassification") for a in architectures):
        return "classification", modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES[model_type]
    return "embedding", modeling_auto.MODEL_MAPPING_NAMES[model_type]


def _length(config, model_type: str, input_shape: tuple[int, ...] | None, path: str) -> int:
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if limit is not None and model_type in OFFSET_POSITIONS:
        limit -= int(getattr(config, "pad_token_id", None) or 0) + 1
    if input_shape is None:
        return min(DEFAULT_LENGTH, limit) if limit else DEFAULT_LENGTH
    if len(input_shape) != 1 or int(input_shape[0]) < 1:
        raise ValueError(f"Hugging Face model {path} takes token ids: its input shape is the sequence "
                         f"length, one number such as 64, not {','.join(map(str, input_shape))}")
    length = int(input_shape[0])
    if limit and length > limit:
        raise ValueError(f"Hugging Face model {path} takes at most {limit} tokens, not {length}")
    return length


def _sources(transformers, directory: str, class_name: str) -> tuple[str, ...]:
    """What the compiled model depends on: the directory's config and weights (not its tokenizer
    or other files), this wrapper, and the transformers code that runs it (its __init__ holds
    the version)."""
    files = [os.path.join(directory, name) for name in sorted(os.listdir(directory))
             if name == "config.json" or name.endswith(WEIGHT_SUFFIXES)]
    code = [__file__, inspect.getsourcefile(transformers)]
    cls = getattr(transformers, class_name, None)
    if cls is not None:
        code.append(inspect.getsourcefile(cls))
    return tuple(files + [path for path in code if path])


def _takes_token_types(transformers, class_name: str) -> bool:
    cls = getattr(transformers, class_name, None)
    return cls is not None and "token_type_ids" in inspect.signature(cls.forward).parameters


def _labels_file(config, directory: str, config_file: str) -> str | None:
    """TorchServe's index_to_name.json from the config's id2label, written to a cache file under
    the temporary directory (never into the model's directory); None for the default LABEL_i names."""
    id2label = {int(k): str(v) for k, v in (getattr(config, "id2label", None) or {}).items()}
    if not id2label or all(name == f"LABEL_{i}" for i, name in id2label.items()):
        return None
    key = f"{directory}\0{os.stat(config_file).st_mtime_ns}".encode()
    folder = os.path.join(tempfile.gettempdir(), LABELS_DIR)
    target = os.path.join(folder, hashlib.sha256(key).hexdigest()[:32] + ".json")
    text = json.dumps({str(i): id2label[i] for i in sorted(id2label)}, ensure_ascii=False, indent=1)
    try:
        with open(target, encoding="utf-8") as f:
            if f.read() == text:
                return target
    except OSError:
        pass
    os.makedirs(folder, exist_ok=True)
    # Written beside and renamed into place: a concurrent reader sees the old file or the new one.
    fd, temporary = tempfile.mkstemp(dir=folder, suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(temporary, target)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    return target


def _dtype_argument(transformers) -> str:
    """from_pretrained's dtype keyword: `dtype` since transformers 4.56, `torch_dtype` before."""
    try:
        major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
    except ValueError:
        return "dtype"
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


@contextmanager
def _no_progress_bar(transformers):
    """Loading weights from a local directory needs no progress bar in every worker's log."""
    logging = transformers.utils.logging
    shown = logging.is_progress_bar_enabled()
    if shown:
        logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            logging.enable_progress_bar()
