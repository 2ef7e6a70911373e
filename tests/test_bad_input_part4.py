"""Bad input to Part IV's library (chapters "Tokens" to "Fine-tuning"): the tokenizer, bits per byte, the Llama
converters, LoRA, the classifier and the prompt/response files, and the fine-tuning command's
run folder. Each case names the exact error class and words its message must hold; where the
input is legal (NumPy numbers, pairs from a generator), the behaviour it must give."""

import json

import numpy as np
import pytest
import torch

import transformer_lib as tl
from tests.test_cli import offline_one_thread  # noqa: F401 (autouse: offline, one thread)
from transformer_lib import cli
from transformer_lib.data.instructions import encode_pair, read_pairs, write_pairs

NAN, INF = float("nan"), float("inf")
TEXT = "hello world, hello there. 123 abc!\n" * 5


def bpe(text=TEXT, vocab_size=280):
    return tl.train_bpe(text, vocab_size, specials=["<|endoftext|>"])


def gpt(vocab_size=11, context_len=8, **overrides):
    torch.manual_seed(0)
    return tl.GPT(tl.GPTConfig(vocab_size=vocab_size, context_len=context_len, n_layers=1, n_heads=2, d_model=8,
                               **overrides)).eval()  # fmt: skip


def bpb(ids=None, lengths=None, tokenizer=None):
    tok = tokenizer or bpe()
    model = gpt(vocab_size=tok.vocab_size)
    ids = torch.tensor(tok.encode(TEXT)) if ids is None else ids
    return tl.bits_per_byte(model, ids, tl.token_byte_lengths(tok) if lengths is None else lengths)


def adapted(rank=2, alpha=4.0):
    model = gpt()
    tl.add_lora(model, ["*.ff.net.0.weight"], rank=rank, alpha=alpha)
    return model


def merged_then_trained():
    model = adapted()
    tl.merge_lora(model)
    _, loss = model(IDS, IDS)
    loss.backward()


def classifier():
    return tl.GPTClassifier(gpt(), 3)


IDS = torch.tensor([[1, 2, 3]])
CHARS = tl.CharTokenizer.from_text(TEXT)
X = torch.randint(0, 11, (4, 6), generator=torch.Generator().manual_seed(0))
FULL = torch.full((4,), 6)
LABELS = torch.tensor([0, 1, 2, 0])
TASK = dict(texts=["a b", "c d", "e f", "g h"], labels=[0, 1, 1, 0], classes=["x", "y"], train=[0, 1], test=[2, 3])


def task(**changes):
    return tl.LabelledTexts(**{**TASK, **changes})


def run_classifier(**changes):
    tok = bpe("ROMEO: hello there\nJULIET: hi\n" * 20)
    return tl.classifier_run(gpt(vocab_size=tok.vocab_size), tok, task(**changes), "head", 0, steps=1)


# (name, call, error class, words the message must hold)
ERRORS = [
    # the tokenizer (chapter "Tokens"): what would lose text is refused
    ("bpe: an empty pattern", lambda: tl.train_bpe(TEXT, 270, pattern=""), ValueError, ["pattern ''", "empty string"]),
    ("bpe: a pattern of letters only", lambda: tl.train_bpe(TEXT, 270, pattern=r"\p{L}+"), ValueError,
     [r"'\\p{L}+'", "loses text", "' ' at index 5"]),
    ("bpe: a pattern that drops punctuation", lambda: tl.train_bpe(TEXT, 270, pattern=r"[a-z]+|\s+|\d+"), ValueError,
     ["loses text", "',' at index 11"]),
    ("bpe: a pattern with a capture group", lambda: tl.train_bpe(TEXT, 270, pattern=r"(\w)\w*|\W"), ValueError,
     ["loses text"]),
    ("bpe: a tokenizer whose pattern matches nothing", lambda: tl.BPETokenizer([], pattern="").encode("abc"),
     ValueError, ["empty string"]),
    ("bpe: a loaded pattern that drops text", lambda: tl.BPETokenizer([], pattern=r"\p{L}+").encode("a b"),
     ValueError, ["loses text", "' ' at index 1"]),
    ("bpe: specials as a string", lambda: tl.train_bpe(TEXT, 300, specials="<|endoftext|>"), TypeError,
     ["specials must be a list", "'<|endoftext|>'", "['<|endoftext|>']"]),
    ("bpe tokenizer: specials as a string", lambda: tl.BPETokenizer([], specials="<eos>"), TypeError,
     ["specials must be a list", "'<eos>'"]),
    # bits per byte (chapter "Tokens")
    ("bpb: a character tokenizer's lengths", lambda: bpb(lengths=tl.token_byte_lengths(CHARS)), ValueError,
     ["byte_lengths has shape (", "vocab_size=277", "another tokenizer"]),
    ("bpb: lengths one short", lambda: bpb(lengths=tl.token_byte_lengths(bpe())[:-1]), ValueError,
     ["(276,)", "vocab_size=277"]),
    ("bpb: ids as a list", lambda: bpb(ids=bpe().encode(TEXT)), TypeError, ["ids must be a tensor", "list"]),
    ("bpb: float ids", lambda: bpb(ids=torch.tensor(bpe().encode(TEXT)).float()), TypeError, ["ids", "float32"]),
    ("bpb: lengths as a list", lambda: bpb(lengths=[1] * 277), TypeError, ["byte_lengths must be a tensor"]),
    ("bpb: special tokens only", lambda: bpb(ids=torch.full((10,), bpe().eos_id)), ValueError,
     ["0 bytes", "special tokens only"]),
    ("bpb: one token", lambda: bpb(ids=torch.tensor([5])), ValueError, ["N >= 2", "(1,)"]),
    # LoRA (chapter "Fine-tuning")
    ("lora: alpha NaN", lambda: adapted(alpha=NAN), ValueError, ["alpha", "nan"]),
    ("lora: alpha inf", lambda: adapted(alpha=INF), ValueError, ["alpha", "finite", "inf"]),
    ("lora: alpha -inf", lambda: adapted(alpha=-INF), ValueError, ["alpha", "-inf"]),
    ("lora: alpha a string", lambda: adapted(alpha="8"), TypeError, ["alpha", "'8'", "str"]),
    ("lora: alpha a bool", lambda: adapted(alpha=True), TypeError, ["alpha", "True"]),
    ("lora: rank a NumPy float", lambda: adapted(rank=np.float64(2.0)), TypeError, ["rank", "2.0"]),
    ("lora: training after merge_lora", merged_then_trained, ValueError,
     ["merged LoRA adapter cannot be trained", "unmerge_lora", "remove_lora"]),
    # the classifier (chapter "Fine-tuning")
    ("classifier: lengths as a list", lambda: classifier()(X, lengths=[6, 6, 6, 6]), TypeError,
     ["lengths must be a tensor", "list"]),
    ("classifier: float lengths", lambda: classifier()(X, lengths=FULL.float()), TypeError, ["lengths", "float32"]),
    ("classifier: labels as a list", lambda: classifier()(X, [0, 1, 2, 0]), TypeError, ["labels must be a tensor"]),
    ("classifier: a label outside the classes", lambda: classifier()(X, torch.tensor([0, 1, 5, 2])), ValueError,
     ["labels", "[0, 3)", "5"]),
    ("accuracy: a label outside the classes", lambda: tl.accuracy(classifier(), X, FULL, torch.tensor([0, 1, 7, 2])),
     ValueError, ["[0, 3)", "[7]"]),
    ("accuracy: fewer labels than rows", lambda: tl.accuracy(classifier(), X, FULL, LABELS[:2]), ValueError,
     ["'ids': 4", "'labels': 2"]),
    ("accuracy: fewer lengths than rows", lambda: tl.accuracy(classifier(), X, FULL[:3], LABELS), ValueError,
     ["'lengths': 3"]),
    ("accuracy: zero rows", lambda: tl.accuracy(classifier(), X[:0], FULL[:0], LABELS[:0]), ValueError,
     ["no rows", "N = 0"]),
    ("accuracy: lengths as a list", lambda: tl.accuracy(classifier(), X, [6] * 4, LABELS), TypeError,
     ["lengths must be a tensor"]),
    ("class batches: fewer labels than rows", lambda: tl.ClassBatches((X, FULL, LABELS[:2]), (X, FULL, LABELS), 2),
     ValueError, ["the train split", "'labels': 2"]),
    ("class batches: zero validation rows", lambda: tl.ClassBatches((X, FULL, LABELS), (X[:0], FULL[:0], LABELS[:0]),
                                                                    2), ValueError, ["the val split", "no rows"]),
    ("class batches: lengths as a list", lambda: tl.ClassBatches((X, [6] * 4, LABELS), (X, FULL, LABELS), 2),
     TypeError, ["lengths must be a tensor"]),
    ("class batches: a split of two", lambda: tl.ClassBatches((X, FULL), (X, FULL, LABELS), 2), TypeError,
     ["(ids, lengths, labels)"]),
    ("task: a label outside the classes", lambda: task(labels=[0, 1, 2, 1]), ValueError, ["[0, 2)", "got 2"]),
    ("task: more labels than texts", lambda: task(labels=[0, 1, 1, 0, 1]), ValueError, ["4 texts but 5 labels"]),
    ("task: a split index past the texts", lambda: task(test=[2, 4]), ValueError, ["test split holds 4"]),
    ("classifier_run: one class", lambda: run_classifier(labels=[0] * 4, classes=["only"]), ValueError,
     ["1 class (['only'])", "at least 2"]),
    ("classifier_run: no test rows", lambda: run_classifier(test=[]), ValueError, ["test split holds no text"]),
    ("classifier_run: one class in training", lambda: run_classifier(labels=[0, 0, 1, 0]), ValueError,
     ["train split holds only the class ['x']", "at least 2 classes"]),
    ("window_loss: a stream as long as the context", lambda: tl.window_loss(gpt(), torch.arange(8) % 5), ValueError,
     ["context_len + 1 = 9", "(8,)"]),
    ("window_loss: a list", lambda: tl.window_loss(gpt(), list(range(20))), TypeError, ["tokens must be a tensor"]),
    # prompt/response pairs (chapter "Fine-tuning"): what read_pairs would refuse is never written
    ("write_pairs: dicts", lambda: write_pairs([{"prompt": "a", "response": "b"}], "never.jsonl"), TypeError,
     ["pairs[0] is a dict"]),
    ("write_pairs: a triple", lambda: write_pairs([("a", "b"), ("a", "b", "c")], "never.jsonl"), ValueError,
     ["pairs[1] has 3 items"]),
    ("write_pairs: a number", lambda: write_pairs([("a", 3)], "never.jsonl"), TypeError,
     ["pairs[0] has a response of type int"]),
    ("write_pairs: a string for a pair", lambda: write_pairs(["ab"], "never.jsonl"), TypeError, ["pairs[0] is a str"]),
    ("write_pairs: one dict of pairs", lambda: write_pairs({"a": "b"}, "never.jsonl"), TypeError,
     ["pairs must be a list", "dict"]),
    ("write_pairs: an empty response", lambda: write_pairs([("a", "")], "never.jsonl"), ValueError,
     ["empty response"]),
    ("write_pairs: the end token in a response", lambda: write_pairs([("a", "b<|endoftext|>")], "never.jsonl"),
     ValueError, ["response", "'<|endoftext|>'"]),
    ("write_pairs: a lone surrogate", lambda: write_pairs([("\ud800", "b")], "never.jsonl"), ValueError,
     ["prompt", "'\\ud800'", "lone surrogate"]),
    ("encode_pair: the end token in a prompt", lambda: encode_pair(bpe(), "a<|endoftext|>", "b"), ValueError,
     ["the prompt 'a<|endoftext|>", "special token"]),
]  # fmt: skip


def raises(call, error, words):
    with pytest.raises(Exception) as caught:
        call()
    assert type(caught.value) is error, f"{type(caught.value).__name__}: {caught.value}"
    assert all(word in str(caught.value) for word in words), str(caught.value)


@pytest.mark.parametrize(("call", "error", "words"), [c[1:] for c in ERRORS], ids=[c[0] for c in ERRORS])
def test_bad_input_names_the_problem_and_the_value(call, error, words, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    raises(call, error, words)
    assert not (tmp_path / "never.jsonl").exists()


# The Llama converters (chapter "Today's block"): transformers' random Llama, its state dict and its config
def llama():
    transformers = pytest.importorskip("transformers")
    sizes = dict(vocab_size=20, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4)
    config = transformers.LlamaConfig(**sizes, num_key_value_heads=2, max_position_embeddings=16)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    return model.state_dict(), config.to_dict()


def without(key):
    state, config = llama()
    return tl.gpt_from_llama({k: v for k, v in state.items() if k != key}, config)


def with_config(**changes):
    state, config = llama()
    return tl.gpt_from_llama(state, {k: v for k, v in {**config, **changes}.items() if v is not None})


def llama_gpt():
    return tl.gpt_from_llama(*llama())


def lora_llama_gpt():
    model = llama_gpt()
    tl.add_lora(model, tl.lora_targets(model), rank=2, alpha=4.0)
    return model


LLAMA_ERRORS = [
    ("a layer's matrix missing", lambda: without("model.layers.1.mlp.up_proj.weight"), ValueError,
     ["model.layers.1.mlp.up_proj.weight", "layer 1's mlp.up_proj"]),
    ("a layer's norm missing", lambda: without("model.layers.0.input_layernorm.weight"), ValueError,
     ["layer 0's input_layernorm"]),
    ("the output head missing", lambda: without("lm_head.weight"), ValueError, ["no lm_head.weight"]),
    ("the final norm missing", lambda: without("model.norm.weight"), ValueError, ["no model.norm.weight"]),
    ("three layers in the config, two in the weights", lambda: with_config(num_hidden_layers=3), ValueError,
     ["num_hidden_layers=3", "2 layers"]),
    ("one layer in the config, two in the weights", lambda: with_config(num_hidden_layers=1), ValueError,
     ["num_hidden_layers=1", "2 layers"]),
    ("four key-value heads in the config, two in the weights", lambda: with_config(num_key_value_heads=4),
     ValueError, ["k_proj", "(8, 16)", "num_key_value_heads", "(16, 16)"]),
    ("eight heads without head_dim", lambda: with_config(num_attention_heads=8, head_dim=None), ValueError,
     ["k_proj", "num_attention_heads"]),
    ("two heads with head_dim 4", lambda: with_config(num_attention_heads=2), ValueError,
     ["head_dim=4", "num_attention_heads=2"]),
    ("another intermediate size", lambda: with_config(intermediate_size=32), ValueError,
     ["gate_proj", "intermediate_size", "(32, 16)"]),
    ("no rms_norm_eps", lambda: with_config(rms_norm_eps=None), ValueError, ["no rms_norm_eps"]),
    ("no hidden_size", lambda: with_config(hidden_size=None), ValueError, ["no hidden_size"]),
    ("back from a GPT with LoRA adapters", lambda: tl.llama_from_gpt(lora_llama_gpt()), ValueError,
     ["LoRA adapters", "remove_lora"]),
    ("back from a classifier", lambda: tl.llama_from_gpt(tl.GPTClassifier(llama_gpt(), 3)), TypeError,
     ["takes a GPT", "GPTClassifier", ".gpt"]),
]  # fmt: skip


@pytest.mark.parametrize(("call", "error", "words"), [c[1:] for c in LLAMA_ERRORS], ids=[c[0] for c in LLAMA_ERRORS])
def test_bad_llama_input_names_the_setting_or_the_tensor(call, error, words):
    raises(call, error, words)


def test_a_merged_adapter_is_for_inference_and_merged_weights_train_once_removed():
    model = adapted()
    x = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        tl.lora_weights(model)["decoder.layers.0.ff.net.0.weight"].B.fill_(0.1)
    unmerged = model(x)[0]
    tl.merge_lora(model)
    assert torch.equal(model(x)[0], unmerged)  # a forward with gradients on is allowed
    with torch.no_grad():
        assert torch.equal(model(x)[0], unmerged)
    model.requires_grad_(False)
    model.lm_head.requires_grad_(True)  # adapters frozen: the other weights train around them
    model(x, x)[1].backward()
    assert model.lm_head.weight.grad is not None
    tl.remove_lora(model)  # the merged weights, now plain ones, train
    model.requires_grad_(True)
    model(x, x)[1].backward()
    assert model.decoder.layers[0].ff.net[0].weight.grad is not None
    assert torch.equal(model(x)[0], unmerged)


def test_numpy_numbers_are_python_numbers_to_lora_and_its_files(tmp_path):
    model = gpt()
    names = tl.add_lora(model, ["*.ff.net.0.weight"], rank=np.int64(2), alpha=np.float32(4.0))
    lora = tl.lora_weights(model)[names[0]]
    assert (type(lora.rank), type(lora.alpha), lora.scale) == (int, float, 2.0)
    tl.save_adapter(model, tmp_path / "adapter.pt")  # loaded with weights_only=True: no NumPy inside
    assert tl.load_adapter(gpt(), tmp_path / "adapter.pt") == names
    assert tl.add_lora(gpt(), ["*.ff.net.0.weight"], rank=2, alpha=np.float64(4.0)) == names


def test_valid_input_keeps_its_behaviour(tmp_path):
    tok = bpe()
    assert tok.decode(tok.encode(TEXT)) == TEXT
    assert tl.BPETokenizer([], specials=("<eos>",)).specials == ("<eos>",)
    by_tokenizer = bpb(lengths=tok)  # the tokenizer itself stands for its byte lengths
    assert by_tokenizer == bpb()
    pairs = write_pairs(zip(["a", "b"], ["c", "d"], strict=True), tmp_path / "pairs.jsonl")  # a generator of pairs
    assert read_pairs(pairs) == [("a", "c"), ("b", "d")]
    assert tl.window_loss(gpt(), torch.arange(9) % 5, batches=2) > 0  # context_len + 1 tokens are enough


def bad_line(tmp_path, obj):
    path = tmp_path / "pairs.jsonl"
    good = json.dumps({"prompt": "x", "response": "y"})
    path.write_text(f"{good}\n{json.dumps(obj)}\n{good}\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("obj", "words"),
    [
        ({"prompt": "a<|endoftext|>", "response": "b"}, ["line 2", "prompt", "'<|endoftext|>'"]),
        ({"prompt": "a", "response": "b <|endoftext|>"}, ["line 2", "response", "'<|endoftext|>'"]),
        ({"prompt": "\ud800", "response": "b"}, ["line 2", "prompt", "'\\ud800'", "lone surrogate"]),
        ({"prompt": "a", "response": "b\udfff"}, ["line 2", "response", "index 1", "lone surrogate"]),
    ],
)
def test_a_pairs_file_that_cannot_be_encoded_is_refused_by_file_and_line(tmp_path, obj, words):
    path = bad_line(tmp_path, obj)
    with pytest.raises(ValueError) as caught:
        read_pairs(path)
    assert str(caught.value).startswith(f"{path}, line 2:") and all(w in str(caught.value) for w in words)


# The fine-tuning command: its base is never its own folder's checkpoint, an adapter file is named
# as one, and a killed save's temporary adapter file is cleaned like the checkpoint's
TINY = "--batch-size 4 --eval-interval 2 --eval-iters 1 --device cpu --no-progress --max-iters 2".split()


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    folder = tmp_path_factory.mktemp("base")
    (folder / "text.txt").write_text("ROMEO: But soft, what light through yonder window breaks?\nJULIET: Ay me!\n" * 30)
    shape = "--n-layers 1 --n-heads 2 --d-model 16 --context-len 32".split()
    args = ["train", *shape, *TINY, "--data", str(folder / "text.txt"), "--tokenizer", "bpe", "--vocab-size", "300"]
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    assert cli.main([*args, "--out-dir", str(folder / "bpe")]) == 0
    torch.set_num_threads(n)
    tl.write_pairs([(w, w[::-1]) for w in ("ROMEO", "JULIET", "light", "soft")], folder / "pairs.jsonl")
    return folder


def finetune(capsys, base, ckpt, out, *extra):
    capsys.readouterr()
    code = cli.main(["finetune", "--ckpt", str(ckpt), "--data", str(base / "pairs.jsonl"), "--out-dir", str(out),
                     *TINY, *extra])  # fmt: skip
    return code, capsys.readouterr().err


@pytest.mark.parametrize("ckpt", ["folder", "file"])
def test_the_base_folder_is_never_the_out_dir_even_with_force(base, tmp_path, capsys, ckpt):
    import shutil

    folder = shutil.copytree(base / "bpe", tmp_path / "base")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    given = folder if ckpt == "folder" else folder / "ckpt.pt"
    for extra in ([], ["--force"], ["--force", "--lora-rank", "2"]):  # without --force too: named as the base
        code, err = finetune(capsys, base, given, folder, *extra)
        assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
        assert f"holds the base checkpoint {folder / 'ckpt.pt'}" in err and "even with --force" in err, err
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before  # the base, untouched


def test_an_adapter_file_given_as_the_base_is_named_as_one(base, tmp_path, capsys):
    assert finetune(capsys, base, base / "bpe", tmp_path / "lora", "--lora-rank", "2")[0] == 0
    code, err = finetune(capsys, base, tmp_path / "lora" / "adapter.pt", tmp_path / "other")
    assert code == 2 and "is a LoRA adapter file" in err and str(base / "bpe" / "ckpt.pt") in err, err


def test_a_killed_saves_temporary_adapter_file_is_cleaned(base, tmp_path, capsys):
    out = tmp_path / "lora"
    assert finetune(capsys, base, base / "bpe", out, "--lora-rank", "2")[0] == 0
    orphans = [out / "adapter.pt.k1ll3d00.tmp", out / "ckpt.pt.k1ll3d00.tmp"]
    for orphan in orphans:
        orphan.write_bytes(b"half a file")
    assert cli.main(["finetune", "--resume", "--out-dir", str(out), "--max-iters", "4", "--no-progress"]) == 0
    assert not any(o.exists() for o in orphans) and (out / "adapter.pt").is_file()
