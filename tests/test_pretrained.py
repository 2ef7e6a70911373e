"""Tests of transformer_lib/pretrained.py (chapter "Generation"): a GPT-2 in Hugging Face's layout, and a
nanoGPT checkpoint made from it, loaded into the book's GPT give the same logits (float64, no
download), and what the book's GPT cannot express is refused with a clear error. Also GPT-2's
tanh GELU in the feed-forward layer."""

import math

import pytest
import torch

import transformer_lib as tl

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread")

SIZES = dict(n_layer=2, n_head=4, n_embd=32, vocab_size=97, n_positions=64, bos_token_id=0, eos_token_id=0)
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def hf_gpt2(**overrides):
    """A small random GPT-2 in float64, eval mode, every weight and bias perturbed (none left at 0 or 1)."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(**{**SIZES, **overrides})
    model = transformers.GPT2LMHeadModel(config).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def ids(T=40, B=3, vocab_size=97):
    return torch.randint(0, vocab_size, (B, T), generator=torch.Generator().manual_seed(1))


def max_logit_diff(ours, hf, idx):
    with torch.no_grad():
        return (ours(idx)[0] - hf(idx).logits).abs().max().item()


def nanogpt_checkpoint(hf):
    """nanoGPT's own from_pretrained conversion: same key names, Conv1D weights transposed into nn.Linear's."""
    state = {}
    for key, value in hf.state_dict().items():
        state[key] = value.t().contiguous() if key.endswith(CONV1D) else value.clone()
    c = hf.config
    for i in range(c.n_layer):  # nanoGPT's non-flash path keeps its causal mask as a buffer
        state[f"transformer.h.{i}.attn.bias"] = torch.tril(torch.ones(c.n_positions, c.n_positions))[None, None]
    args = dict(n_layer=c.n_layer, n_head=c.n_head, n_embd=c.n_embd, block_size=c.n_positions, bias=True,
                vocab_size=c.vocab_size, dropout=0.0)  # fmt: skip
    return {"model": state, "model_args": args, "iter_num": 0, "best_val_loss": 9.9}


# ---------------------------------------------------------------- the tanh GELU


def test_gelu_tanh_feed_forward_equals_the_formula(gen):
    ff = tl.FeedForward(8, 16, activation="gelu_tanh").double()
    x = torch.randn(2, 5, 8, generator=gen, dtype=torch.float64)
    first, second = ff.net[0], ff.net[2]
    u = first(x)
    gelu = 0.5 * u * (1 + torch.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u**3)))
    torch.testing.assert_close(ff(x), second(gelu), rtol=1e-14, atol=1e-14)
    exact = tl.FeedForward(8, 16, activation="gelu").double()
    exact.load_state_dict(ff.state_dict())
    assert 0 < (exact(x) - ff(x)).abs().max() < 1e-2  # close to the exact GELU, not equal


def test_gpt_config_passes_its_activation_to_the_blocks():
    model = tl.GPT(tl.GPTConfig(vocab_size=11, n_layers=1, n_heads=2, d_model=8, activation="gelu_tanh"))
    assert model.decoder.layers[0].ff.net[1].approximate == "tanh"
    default = tl.GPT(tl.GPTConfig(vocab_size=11, n_layers=1, n_heads=2, d_model=8))
    assert default.decoder.layers[0].ff.net[1].approximate == "none"


# ---------------------------------------------------------------- GPT-2 from Hugging Face


def test_gpt2_logits_are_reproduced_in_float64():
    hf = hf_gpt2()
    ours = tl.gpt_from_hf(hf)
    assert ours.config == tl.GPTConfig(vocab_size=97, context_len=64, n_layers=2, n_heads=4, d_model=32,
                                       dropout=0.0, bias=True, activation="gelu_tanh")  # fmt: skip
    assert next(ours.parameters()).dtype == torch.float64 and not ours.training
    assert ours.lm_head.weight is ours.tok_embed.weight  # still tied
    assert max_logit_diff(ours, hf, ids()) < 1e-10
    assert max_logit_diff(ours, hf, ids(T=64, B=1)) < 1e-10  # the whole context


def test_the_mapping_is_needed_in_full():
    # each detail matters: with W_q and W_k swapped, or with the exact GELU, the logits differ
    hf = hf_gpt2()
    idx = ids()
    ours = tl.gpt_from_hf(hf)
    with torch.no_grad():
        layer = ours.decoder.layers[0].self_attn
        d = layer.d_model
        layer.in_proj_weight[:] = torch.cat([layer.in_proj_weight[d : 2 * d], layer.in_proj_weight[:d],
                                             layer.in_proj_weight[2 * d :]])  # fmt: skip
    assert max_logit_diff(ours, hf, idx) > 1e-3
    exact = tl.gpt_from_hf(hf_gpt2(activation_function="gelu"))
    assert max_logit_diff(exact, hf_gpt2(activation_function="gelu"), idx) < 1e-10  # exact GELU maps to "gelu"
    assert exact.config.activation == "gelu"
    assert max_logit_diff(exact, hf, idx) > 1e-6  # tanh vs exact GELU: a small but real difference


def test_gpt2_from_its_state_dict_needs_the_number_of_heads():
    hf = hf_gpt2()
    with pytest.raises(ValueError, match="n_heads"):
        tl.gpt_from_hf(hf.state_dict())
    ours = tl.gpt_from_hf(hf.state_dict(), n_heads=4)
    assert max_logit_diff(ours, hf, ids()) < 1e-10
    # the layout of the original GPT-2 files: no "transformer." prefix, causal-mask buffers, no lm_head
    bare = {k.removeprefix("transformer."): v for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    bare |= {f"h.{i}.attn.bias": torch.ones(1, 1, 64, 64) for i in range(2)}
    assert max_logit_diff(tl.gpt_from_hf(bare, n_heads=4), hf, ids()) < 1e-10


def test_gpt2_from_a_safetensors_file_and_a_save_pretrained_folder(tmp_path):
    from safetensors.torch import save_file

    hf = hf_gpt2()
    folder = tmp_path / "gpt2-tiny"
    hf.save_pretrained(folder)
    from_folder = tl.gpt_from_hf(folder)
    assert max_logit_diff(from_folder, hf, ids()) < 1e-10
    assert max_logit_diff(tl.gpt_from_hf(folder / "model.safetensors"), hf, ids()) < 1e-10  # config.json beside it
    alone = tmp_path / "alone.safetensors"
    save_file({k: v.contiguous() for k, v in hf.state_dict().items() if k != "lm_head.weight"}, str(alone))
    assert max_logit_diff(tl.gpt_from_hf(alone, n_heads=4), hf, ids()) < 1e-10
    # load_gpt2 with a local folder goes through from_pretrained: no network
    loaded = tl.load_gpt2(folder)
    assert max_logit_diff(loaded, hf, ids()) < 1e-10


@pytest.mark.parametrize(
    ("override", "word"),
    [
        (dict(layer_norm_epsilon=1e-6), "layer_norm_epsilon"),
        (dict(activation_function="relu"), "activation_function"),
        (dict(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx"),
        (dict(scale_attn_weights=False), "scale_attn_weights"),
        (dict(n_inner=48), "n_inner=48"),
    ],
)
def test_a_gpt2_configuration_the_book_cannot_express_is_refused(override, word):
    hf = hf_gpt2(**override)
    with pytest.raises(ValueError, match=word):
        tl.gpt_from_hf(hf)


def test_broken_gpt2_weights_are_refused_with_the_tensor_named(tmp_path):
    hf = hf_gpt2()
    state = hf.state_dict()
    missing = {k: v for k, v in state.items() if k != "transformer.h.1.mlp.c_fc.bias"}
    with pytest.raises(ValueError, match=r"missing tensors: h\.1\.mlp\.c_fc\.bias"):
        tl.gpt_from_hf(missing, n_heads=4)
    wrong = dict(state) | {"transformer.h.0.attn.c_attn.weight": state["transformer.h.0.attn.c_attn.weight"].t()}
    with pytest.raises(ValueError, match=r"h\.0\.attn\.c_attn\.weight has shape \(96, 32\), expected \(32, 96\)"):
        tl.gpt_from_hf(wrong, n_heads=4)
    extra = dict(state) | {"transformer.h.0.attn.rotary.weight": torch.zeros(3)}
    with pytest.raises(ValueError, match="unexpected tensors"):
        tl.gpt_from_hf(extra, n_heads=4)
    untied = dict(state) | {"lm_head.weight": state["lm_head.weight"] + 1}
    with pytest.raises(ValueError, match="ties"):
        tl.gpt_from_hf(untied, n_heads=4)
    with pytest.raises(ValueError, match="disagrees"):
        tl.gpt_from_hf(hf, n_heads=2)
    with pytest.raises(FileNotFoundError, match="config.json"):
        tl.gpt_from_hf(tmp_path)
    with pytest.raises(ValueError, match=".safetensors"):
        tl.gpt_from_hf(tmp_path / "model.bin")
    with pytest.raises(TypeError, match="int"):
        tl.gpt_from_hf(3)
    with pytest.raises(TypeError, match="GPT"):  # the book's own GPT is not a source
        tl.gpt_from_hf(tl.GPT(tl.GPTConfig(vocab_size=11, n_layers=1, n_heads=2, d_model=8)))


# ---------------------------------------------------------------- nanoGPT


def test_a_nanogpt_checkpoint_gives_the_logits_of_the_model_it_came_from():
    hf = hf_gpt2(activation_function="gelu")  # nanoGPT's GELU is the exact one
    ours = tl.gpt_from_nanogpt(nanogpt_checkpoint(hf))
    assert ours.config.activation == "gelu" and ours.config.context_len == 64
    assert max_logit_diff(ours, hf, ids()) < 1e-10


def test_a_compiled_nanogpt_checkpoint_and_a_ckpt_file(tmp_path):
    hf = hf_gpt2(activation_function="gelu")
    ckpt = nanogpt_checkpoint(hf)
    compiled = dict(ckpt, model={f"_orig_mod.{k}": v for k, v in ckpt["model"].items()})
    assert max_logit_diff(tl.gpt_from_nanogpt(compiled), hf, ids()) < 1e-10
    path = tmp_path / "ckpt.pt"
    torch.save(compiled, path)
    assert max_logit_diff(tl.gpt_from_nanogpt(path), hf, ids()) < 1e-10
    assert max_logit_diff(tl.gpt_from_nanogpt(str(path)), hf, ids()) < 1e-10


def test_a_nanogpt_checkpoint_without_biases():
    # nanoGPT's bias=False: no bias in any Linear or LayerNorm; written here from a book GPT in
    # nanoGPT's names, it must come back unchanged
    torch.manual_seed(0)
    config = tl.GPTConfig(vocab_size=50, context_len=16, n_layers=2, n_heads=2, d_model=16, bias=False)
    book = tl.GPT(config).double().eval()
    names = {"tok_embed.weight": "transformer.wte.weight", "pos_embed.embedding.weight": "transformer.wpe.weight",
             "decoder.norm.weight": "transformer.ln_f.weight", "lm_head.weight": "lm_head.weight"}  # fmt: skip
    parts = {"res_self.norm": "ln_1", "self_attn.in_proj_weight": "attn.c_attn", "self_attn.out_proj": "attn.c_proj",
             "res_ff.norm": "ln_2", "ff.net.0": "mlp.c_fc", "ff.net.2": "mlp.c_proj"}  # fmt: skip
    state = {}
    for key, value in book.state_dict().items():
        name = names.get(key)
        if name is None:
            i, rest = key.split(".", 3)[2:]
            part = next(p for p in parts if rest.startswith(p))
            name = f"transformer.h.{i}.{parts[part]}.weight"
        state[name] = value.clone()
    assert not any("bias" in k for k in state)
    args = dict(n_layer=2, n_head=2, n_embd=16, block_size=16, bias=False, vocab_size=50, dropout=0.0)
    back = tl.gpt_from_nanogpt({"model": state, "model_args": args})
    idx = ids(T=16, vocab_size=50)
    with torch.no_grad():
        assert (back(idx)[0] - book(idx)[0]).abs().max() == 0
    assert back.config.bias is False


def test_broken_nanogpt_checkpoints_are_refused(tmp_path):
    ckpt = nanogpt_checkpoint(hf_gpt2(activation_function="gelu"))
    with pytest.raises(ValueError, match="model_args"):
        tl.gpt_from_nanogpt({"model": ckpt["model"]})
    with pytest.raises(ValueError, match="block_size"):
        tl.gpt_from_nanogpt(dict(ckpt, model_args={k: v for k, v in ckpt["model_args"].items() if k != "block_size"}))
    with pytest.raises(ValueError, match=r"missing tensors: h\.0\.ln_1\.weight"):
        tl.gpt_from_nanogpt(dict(ckpt, model={k: v for k, v in ckpt["model"].items() if "h.0.ln_1.weight" not in k}))
    # a Hugging Face (Conv1D) layout passed as nanoGPT: the transposed shape is named
    with pytest.raises(ValueError, match=r"h\.0\.attn\.c_attn\.weight has shape \(32, 96\), expected \(96, 32\)"):
        tl.gpt_from_nanogpt(dict(ckpt, model=hf_gpt2().state_dict()))
    with pytest.raises(ValueError, match="bias"):  # biases in the file, bias=False in the arguments
        tl.gpt_from_nanogpt(dict(ckpt, model_args=ckpt["model_args"] | {"bias": False}))
    with pytest.raises(FileNotFoundError, match="ckpt.pt"):
        tl.gpt_from_nanogpt(tmp_path / "ckpt.pt")
