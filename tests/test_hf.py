"""Hugging Face save_pretrained directories (packrat.models.hf): tiny random-weight BERT,
DistilBERT, RoBERTa and GPT-2 saved into a temporary directory, nothing downloaded."""

from __future__ import annotations

import json
import os
import sys
import tempfile

import pytest
import torch

transformers = pytest.importorskip("transformers")
# Tracing Hugging Face code warns about its shape checks (constants for a fixed input shape).
pytestmark = [pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning"),
              pytest.mark.filterwarnings("ignore:`torch.jit.:DeprecationWarning"),
              pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing`:FutureWarning")]

from model_checks import marked, two_threads  # noqa: E402,F401 (autouse fixture)
from packrat.models.zoo import prepare, resolve  # noqa: E402
from packrat.models.hf import LABELS_DIR  # noqa: E402
from packrat.settings import Settings  # noqa: E402

VOCAB = 100
HIDDEN = 32
MAX_POSITIONS = 64
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "a", "cat"]
ATOL = 1e-4

# name -> (config class, config arguments, model class, task, takes token types, tokenizer saved)
ENCODER_ARGS = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=MAX_POSITIONS)
MODELS = {
    "bert-cls": ("BertConfig", dict(ENCODER_ARGS, id2label={0: "neg", 1: "pos"}, label2id={"neg": 0, "pos": 1}),
                 "BertForSequenceClassification", "classification", True, True),
    "bert": ("BertConfig", ENCODER_ARGS, "BertModel", "embedding", True, False),
    "distilbert": ("DistilBertConfig", dict(vocab_size=VOCAB, dim=HIDDEN, n_layers=2, n_heads=2, hidden_dim=64,
                                            max_position_embeddings=MAX_POSITIONS),
                   "DistilBertModel", "embedding", False, False),
    "distilbert-cls": ("DistilBertConfig", dict(vocab_size=VOCAB, dim=HIDDEN, n_layers=2, n_heads=2, hidden_dim=64,
                                                max_position_embeddings=MAX_POSITIONS, num_labels=3),
                       "DistilBertForSequenceClassification", "classification", False, False),
    "roberta": ("RobertaConfig", dict(ENCODER_ARGS, pad_token_id=1, bos_token_id=0, eos_token_id=2, type_vocab_size=1),
                "RobertaModel", "embedding", False, True),
    "gpt2": ("GPT2Config", dict(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=2, n_head=2, n_positions=MAX_POSITIONS,
                                bos_token_id=0, eos_token_id=0),
             "GPT2LMHeadModel", "language-model", False, True),
}
OUTPUT_WIDTH = {"bert-cls": 2, "bert": HIDDEN, "distilbert": HIDDEN, "distilbert-cls": 3, "roberta": HIDDEN,
                "gpt2": VOCAB}


def _tokenizer_json(path: str, first_id: int = 0) -> None:
    """A word-level tokenizer of WORDS, its ids from `first_id` (past the model's VOCAB: one that does not fit it)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {token: first_id + i for i, token in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *WORDS])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    tokenizer.save(path)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """{name: save_pretrained directory} of every model in MODELS."""
    root = tmp_path_factory.mktemp("hf")
    made = {}
    for name, (config_class, kwargs, model_class, _, _, with_tokenizer) in MODELS.items():
        torch.manual_seed(0)
        config = getattr(transformers, config_class)(**kwargs, architectures=[model_class])
        directory = root / name
        getattr(transformers, model_class)(config).eval().save_pretrained(directory)
        if with_tokenizer:
            _tokenizer_json(str(directory / "tokenizer.json"))
        made[name] = str(directory)
    return made


def _pad_id(name: str) -> int:
    return 1 if name == "roberta" else 0


def _batch(name: str, rows: list[list[int]], length: int, spec) -> tuple[torch.Tensor, ...]:
    """The spec's inputs for these token rows, padded to `length`: on the left for GPT-2, else on the right."""
    ids = torch.full((len(rows), length), _pad_id(name), dtype=torch.int64)
    mask = torch.zeros((len(rows), length), dtype=torch.int64)
    for i, row in enumerate(rows):
        where = slice(length - len(row), length) if spec.task == "language-model" else slice(0, len(row))
        ids[i, where] = torch.tensor(row)
        mask[i, where] = 1
    inputs = (ids, mask)
    if len(spec.inputs) == 3:
        inputs += (torch.zeros_like(ids),)
    return inputs


def _rows(seed: int, *lengths: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(4, VOCAB, (n,), generator=gen).tolist() for n in lengths]  # no pad or special ids


@pytest.mark.parametrize("name", list(MODELS))
def test_spec(hf_dir, name):
    _, _, model_class, task, token_types, with_tokenizer = MODELS[name]
    spec = resolve(f"hf:{hf_dir[name]}")
    assert spec.name == name and spec.task == task and spec.scriptable
    length = MAX_POSITIONS - 2 if name == "roberta" else MAX_POSITIONS  # RoBERTa's positions start at 2
    names = ["input_ids", "attention_mask"] + (["token_type_ids"] if token_types else [])
    assert [i.name for i in spec.inputs] == names
    assert all(i.shape == (length,) and i.dtype == "int64" for i in spec.inputs)
    assert spec.vocab_size == VOCAB
    assert spec.tokenizer == (os.path.join(hf_dir[name], "tokenizer.json") if with_tokenizer else None)
    assert model_class in spec.description and hf_dir[name] in spec.description
    if name != "bert-cls":
        assert spec.labels is None  # embeddings, language models, and LABEL_0.. names


def test_labels_written_outside_the_model_directory(hf_dir):
    before = sorted(os.listdir(hf_dir["bert-cls"]))
    spec = resolve(f"hf:{hf_dir['bert-cls']}")
    assert os.path.dirname(spec.labels) == os.path.join(tempfile.gettempdir(), LABELS_DIR)
    with open(spec.labels) as f:
        assert json.load(f) == {"0": "neg", "1": "pos"}
    assert resolve(f"hf:{hf_dir['bert-cls']}/").labels == spec.labels  # same directory, same file
    assert sorted(os.listdir(hf_dir["bert-cls"])) == before


def test_sequence_length(hf_dir):
    spec = resolve(f"hf:{hf_dir['bert-cls']}", (16,))
    assert [i.shape for i in spec.inputs] == [(16,)] * 3
    with pytest.raises(ValueError, match="at most 62 tokens"):
        resolve(f"hf:{hf_dir['roberta']}", (64,))
    with pytest.raises(ValueError, match="sequence length"):
        resolve(f"hf:{hf_dir['gpt2']}", (3, 16))


@pytest.mark.parametrize("length", [None, 16])
def test_the_text_a_profile_or_a_load_test_sends_fits_the_model(hf_dir, length):
    """The paragraph's 103 tokens did not fit a BERT of 64 positions: every served figure was a 413."""
    from packrat.codec.codec import Codec
    from packrat.codec.config import CodecConfig
    from packrat.codec.payloads import TEXT, payload_of
    from packrat.codec.text import TextEncoder

    spec = resolve(f"hf:{hf_dir['bert-cls']}", length and (length,))
    text = payload_of(spec, "text")[0].decode()
    tokenizer = TextEncoder(spec.tokenizer, spec.input_shape[0], False, False).tokenizer
    one_more = TEXT[:TEXT.index(" ", len(text) + 1)]  # the next word too
    assert TEXT.startswith(text + " ") and len(tokenizer.encode(one_more).ids) > spec.input_shape[0]
    Codec(CodecConfig.for_model(spec)).decode(text.encode(), "text/plain")  # no 413: it fits


@pytest.mark.integration
def test_a_short_text_model_is_profiled_and_one_whose_every_runtime_fails_exits_2(hf_dir, tmp_path, capsys):
    """A BERT of 64 positions gets its served figures (its text fits); with a tokenizer whose ids are
    past its vocabulary every served point fails, and the profile says so and exits 2 with the first
    failure's reason, where it said "no unmeasured point can change a plan" and exited 0 (a rerun alike)."""
    import shutil

    from packrat.cli.main import main
    from packrat.profiling.profiles import load

    argv = ["profile", "--threads", "1", "--batches", "1", "--iters", "3", "--warmup", "1", "--graph-mode", "eager",
            "--runtimes", "inductor", "--quiet"]
    assert main([*argv, "--model", f"hf:{hf_dir['bert-cls']}", "--out", str(tmp_path / "fits.csv")]) == 0
    profile = load(tmp_path / "fits.csv")
    assert profile.has_served and profile.payload == "text" and list(profile.points()) == [(1, 1, "inductor")]
    unfit = tmp_path / "unfit"
    shutil.copytree(hf_dir["bert-cls"], unfit)
    _tokenizer_json(str(unfit / "tokenizer.json"), first_id=VOCAB)
    capsys.readouterr()
    assert main([*argv, "--model", f"hf:{unfit}", "--out", str(tmp_path / "unfit.csv")]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("packrat profile: error: no point measured: every runtime failed; the first, inductor: ")
    assert "outside the model's vocabulary" in error, error


def test_errors(hf_dir, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="needs a save_pretrained directory"):
        resolve("hf:")
    with pytest.raises(ValueError, match="not found"):
        resolve(f"hf:{tmp_path / 'missing'}")
    with pytest.raises(ValueError, match="no config.json"):
        resolve(f"hf:{tmp_path}")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5"}))
    with pytest.raises(ValueError, match="'t5'.*bert, distilbert, roberta, gpt2"):
        resolve(f"hf:{tmp_path}")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2",
                                                      "architectures": ["GPT2ForSequenceClassification"]}))
    with pytest.raises(ValueError, match="GPT2ForSequenceClassification"):
        resolve(f"hf:{tmp_path}")
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if not installed
    with pytest.raises(ValueError, match=r"pip install 'packrat-serve\[hf\]'"):
        resolve(f"hf:{hf_dir['bert']}")


@pytest.mark.parametrize("name", list(MODELS))
def test_output_and_padding_invariance(hf_dir, name):
    """A text alone and unpadded gives what it gives padded in a batch beside a longer one."""
    spec = resolve(f"hf:{hf_dir[name]}", (12,))
    module, examples, used = prepare(spec, 3, "eager")
    with torch.no_grad():
        out = module(*examples)
        assert used == "eager" and out.shape == (3, OUTPUT_WIDTH[name]) and out.dtype == torch.float32
        short, long = _rows(1, 5, 9)
        padded = module(*_batch(name, [short, long], 12, spec))
        alone = [module(*_batch(name, [row], len(row), spec))[0] for row in (short, long)]
    assert torch.isfinite(padded).all()
    torch.testing.assert_close(padded[0], alone[0], atol=ATOL, rtol=0)
    torch.testing.assert_close(padded[1], alone[1], atol=ATOL, rtol=0)


# Compiling costs ~15 s a package on 2 cores: one model (token types) compiles here, one package
# (batch 1: the ladder of a larger batch would add a package per size), into this machine's cache
# (the saved directories are the same bytes every run, so later runs load it). The batches of 2
# below then run through it in chunks, each row compiled code.
@pytest.mark.parametrize(("name", "mode"), marked([("bert-cls", "script"), ("distilbert", "script"), ("roberta", "script"),
                                                   ("gpt2", "script"), ("bert-cls", "compile")],
                                                  pytest.mark.integration, {("bert-cls", "compile")}))
def test_graph_modes_match_eager(hf_dir, name, mode):
    spec = resolve(f"hf:{hf_dir[name]}", (16,))
    eager, examples, _ = prepare(spec, 2, "eager")
    graph, _, used = prepare(spec, 1 if mode == "compile" else 2, mode)
    assert used == mode
    # traced or exported on unpadded examples: a padded batch must still take its mask
    padded = _batch(name, _rows(2, 7, 16), 16, spec)
    with torch.no_grad():
        for inputs in (examples, padded):
            torch.testing.assert_close(graph(*inputs), eager(*inputs), atol=ATOL, rtol=0)


@pytest.mark.skipif(__import__("shutil").which("java") is None, reason="TorchServe needs Java 11+")
@pytest.mark.integration
def test_served_through_torchserve_with_text_and_named_inputs(hf_dir, tmp_path):
    """`packrat archive` ships the directory; text is tokenised with its tokenizer.json and
    answered with id2label's names; KServe v2 with named inputs gives the same logits as the
    model in this process, and a padded sample the answer it gets alone."""
    from packrat.deploy import torchserve
    from packrat.deploy import archive
    from packrat.codec.codec import Codec
    from packrat.codec.config import CodecConfig
    from packrat.codec.batch import answer_batch
    from test_formats_integration import post

    model = f"hf:{hf_dir['bert-cls']}"
    spec = resolve(model, (16,))
    profile = tmp_path / "profile.csv"
    profile.write_text("# mode: eager\nthreads,batch,latency_ms\n1,1,1.0\n1,2,2.0\n1,4,4.0\n")
    mar = archive.build(Settings(model, profiles=[profile], max_batch=4, input_shape=(16,), plan="fat"), tmp_path / "store")
    srv = torchserve.start(torchserve.Server(tmp_path / "run", "bert-cls", torchserve.Ports.free(), token_auth=True), mar,
                        timeout=180)
    try:
        status, body = post(srv, b"the quick brown fox", "text/plain")
        module, _, _ = prepare(spec, 1, "eager")
        (reply,) = answer_batch(module, Codec(CodecConfig.for_model(spec)), [(b"the quick brown fox", "text/plain")])
        assert status == 200 and {p["label"] for p in body["predictions"]} == {"neg", "pos"}
        want = json.loads(reply.body)["predictions"]
        assert [p["label"] for p in body["predictions"]] == [p["label"] for p in want]
        assert [p["score"] for p in body["predictions"]] == pytest.approx([p["score"] for p in want], abs=1e-5)
        ids = [2, 4, 5, 6, 3] + [0] * 11
        mask = [1] * 5 + [0] * 11
        entries = [{"name": "input_ids", "shape": [1, 16], "datatype": "INT64", "data": ids},
                   {"name": "attention_mask", "shape": [1, 16], "datatype": "INT64", "data": mask}]
        status, v2 = post(srv, json.dumps({"inputs": entries}).encode(), "application/json")
        assert status == 200, v2
        with torch.no_grad():
            alone = module(torch.tensor([ids[:5]]), torch.ones(1, 5, dtype=torch.int64), torch.zeros(1, 5, dtype=torch.int64))
        assert v2["outputs"][0]["data"] == pytest.approx(alone.flatten().tolist(), abs=1e-4)
    finally:
        torchserve.stop(srv)
