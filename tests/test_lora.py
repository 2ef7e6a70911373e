"""LoRA (chapter "Fine-tuning"): a zero adapter changes nothing, merged equals unmerged, unmerge restores
the weights bit for bit, gradients reach only the adapters, saved adapters load and refuse a
model of another shape, and the adapted model equals ``peft``'s LoRA on the same GPT-2."""

import pytest
import torch

import transformer_lib as tl
from tests.test_pretrained import SIZES, hf_gpt2, ids

peft = pytest.importorskip("peft")
pytestmark = pytest.mark.usefixtures("one_thread")

TARGETS = ["*.self_attn.in_proj_weight", "*.self_attn.out_proj.weight", "*.ff.net.*.weight"]


def small_gpt(seed=0, **overrides):
    torch.manual_seed(seed)
    sizes = dict(vocab_size=31, context_len=16, n_layers=2, d_model=32, n_heads=4)
    return tl.GPT(tl.GPTConfig(**{**sizes, **overrides})).double()


def randomise_b(model, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for lora in tl.lora_weights(model).values():
            lora.B.copy_(torch.randn(lora.B.shape, generator=g, dtype=lora.B.dtype))


@pytest.mark.parametrize("rank", [1, 4, 8])
@pytest.mark.parametrize("targets", [TARGETS, ["*.ff.net.0.weight"], ["decoder.layers.1.self_attn.in_proj_weight"]])
def test_a_new_adapter_changes_nothing_bitwise(rank, targets):
    model = small_gpt().eval()
    x = ids(T=16, vocab_size=31)
    before = model(x)[0]
    names = tl.add_lora(model, targets, rank=rank, alpha=2.0 * rank, seed=rank)
    assert names and torch.equal(model(x)[0], before)
    assert all(torch.count_nonzero(lora.A) > 0 and torch.count_nonzero(lora.B) == 0
               for lora in tl.lora_weights(model).values())  # fmt: skip


def adapted_gpt():
    """``(model with adapters whose B is random, its weights before them, inputs, its logits)``."""
    model = small_gpt().eval()
    frozen = {k: v.clone() for k, v in model.state_dict().items()}
    tl.add_lora(model, TARGETS, rank=4, alpha=8)
    randomise_b(model)
    x = ids(T=16, vocab_size=31)
    return model, frozen, x, model(x)[0]


def test_merged_equals_unmerged_and_unmerge_restores_the_weights_bitwise():
    model, frozen, x, unmerged = adapted_gpt()
    assert not torch.allclose(unmerged, small_gpt().eval()(x)[0])  # the adapter does change the model
    tl.merge_lora(model)
    assert torch.equal(model(x)[0], unmerged)
    weights = {n: p for n, p in model.named_parameters() if n.endswith(".original")}
    assert any(not torch.equal(p, frozen[n.replace(".parametrizations", "").removesuffix(".original")])
               for n, p in weights.items())  # fmt: skip
    tl.unmerge_lora(model)
    for n, p in model.named_parameters():
        if n.endswith(".original"):
            assert torch.equal(p, frozen[n.replace(".parametrizations", "").removesuffix(".original")]), n
    assert torch.equal(model(x)[0], unmerged)
    with pytest.raises(ValueError, match="not merged"):
        tl.unmerge_lora(model)
    tl.merge_lora(model)
    with pytest.raises(ValueError, match="already merged"):
        tl.merge_lora(model)
    tl.remove_lora(model)  # a plain model again, holding the merged weights
    assert not tl.lora_weights(model) and torch.equal(model(x)[0], unmerged)


def test_the_update_is_alpha_over_r_times_b_a():
    model = small_gpt()
    (name,) = tl.add_lora(model, ["decoder.layers.0.ff.net.0.weight"], rank=3, alpha=6)
    randomise_b(model)
    lora = tl.lora_weights(model)[name]
    w0 = model.decoder.layers[0].ff.net[0].parametrizations.weight.original
    torch.testing.assert_close(model.decoder.layers[0].ff.net[0].weight, w0 + 2.0 * lora.B @ lora.A, rtol=0, atol=0)


def test_gradients_reach_only_the_adapters_and_the_count_is_r_in_plus_out():
    model = small_gpt()
    names = tl.add_lora(model, TARGETS, rank=2, alpha=4)
    randomise_b(model)
    x = ids(T=16, vocab_size=31)
    _, loss = model(x, x)
    loss.backward()
    for n, p in model.named_parameters():
        adapter = n.endswith((".A", ".B"))
        assert p.requires_grad == adapter, n
        assert (p.grad is not None and p.grad.abs().sum() > 0) == adapter, n
    shapes = [tuple(p.shape) for n, p in model.named_parameters() if n.endswith(".original")]
    assert len(shapes) == len(names)
    assert tl.count_parameters(model) == sum(2 * (o + i) for o, i in shapes)


def test_saved_adapters_load_exactly_and_refuse_another_shape(tmp_path):
    model, base, x, want = adapted_gpt()
    path = tl.save_adapter(model, tmp_path / "adapter.pt", meta={"note": "test"})
    assert path.stat().st_size < sum(v.numel() for v in base.values()) * 8 / 3  # far less than the model
    fresh = small_gpt().eval()
    fresh.load_state_dict(base)
    assert tl.load_adapter(fresh, path) == list(tl.lora_weights(model))
    assert torch.equal(fresh(x)[0], want)
    with pytest.raises(ValueError, match=r"in_proj_weight of shape \(96, 32\), but this model's is \(192, 64\)"):
        tl.load_adapter(tl.GPT(tl.GPTConfig(vocab_size=31, context_len=16, n_layers=2, d_model=64)), path)
    with pytest.raises(ValueError, match="decoder.layers.1.* which this model does not have"):
        tl.load_adapter(small_gpt(n_layers=1), path)
    # an existing file holding something else is kept; the same adapter again is fine
    other = small_gpt()
    tl.add_lora(other, ["*.ff.net.0.weight"], rank=2, alpha=2)
    with pytest.raises(FileExistsError, match="adapter.pt exists"):
        tl.save_adapter(other, path)
    tl.save_adapter(model, path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    (tmp_path / "bad.pt").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="bad.pt"):
        tl.load_adapter(small_gpt(), tmp_path / "bad.pt")


@pytest.mark.parametrize(
    ("targets", "kwargs", "words"),
    [
        (["*.nothing"], {}, ["no parameter of the model matches '*.nothing'", "in_proj_weight"]),
        (["*.in_proj_bias"], {}, ["shape (96,)", "matrices only"]),
        (["lm_head.weight"], {}, ["tied weights"]),
        ("*.in_proj_weight", {}, ["list of parameter-name patterns"]),
        (["*.ff.net.0.weight"], {"rank": 0}, ["rank"]),
        (["*.ff.net.0.weight"], {"rank": 33}, ["rank 33 is above"]),
        (["*.ff.net.0.weight"], {"alpha": -1.0}, ["alpha must be a positive number", "-1.0"]),
    ],
)
def test_bad_targets_and_settings_are_named(targets, kwargs, words):
    with pytest.raises((ValueError, TypeError)) as e:
        tl.add_lora(small_gpt(), targets, **kwargs)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_an_adapted_weight_cannot_be_adapted_twice_and_an_unadapted_model_cannot_merge():
    model = small_gpt()
    tl.add_lora(model, ["*.ff.net.0.weight"], rank=2)
    with pytest.raises(ValueError, match="already has an adapter"):
        tl.add_lora(model, ["decoder.layers.0.ff.net.0.weight"], rank=2)
    with pytest.raises(ValueError, match="no LoRA adapters"):
        tl.merge_lora(small_gpt())


@pytest.mark.parametrize("rank", [2, 8])
def test_equal_to_peft_lora_on_gpt2_with_the_same_a_and_b(rank):
    """peft adapts GPT-2's Conv1D layers (weights stored (in, out)); the converter gives the book's
    GPT the same weights, and copying peft's A and B into the book's adapters gives the same logits."""
    hf = hf_gpt2()
    ours = tl.gpt_from_hf(hf)
    config = peft.LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules=["c_attn", "c_proj", "c_fc"], fan_in_fan_out=True,
        lora_dropout=0.0,
    )  # fmt: skip
    adapted = peft.get_peft_model(hf, config).eval()
    tl.add_lora(ours, TARGETS, rank=rank, alpha=2 * rank)
    g = torch.Generator().manual_seed(rank)
    ours_by_name = tl.lora_weights(ours)
    where = {"attn.c_attn": "self_attn.in_proj_weight", "attn.c_proj": "self_attn.out_proj.weight",
             "mlp.c_fc": "ff.net.0.weight", "mlp.c_proj": "ff.net.2.weight"}  # fmt: skip
    copied = 0
    for name, module in adapted.named_modules():
        if isinstance(module, peft.tuners.lora.LoraLayer) and hasattr(module, "lora_A"):
            layer = int(name.split(".h.")[1].split(".")[0])
            part = next(v for k, v in where.items() if name.endswith(k))
            lora = ours_by_name[f"decoder.layers.{layer}.{part}"]
            a, b = module.lora_A["default"].weight, module.lora_B["default"].weight
            with torch.no_grad():
                b.copy_(torch.randn(b.shape, generator=g, dtype=b.dtype))  # peft starts B at zero too
                torch.testing.assert_close(a.shape, lora.A.shape)
                lora.A.copy_(a)
                lora.B.copy_(b)
            copied += 1
    assert copied == 4 * SIZES["n_layer"]
    assert tl.count_parameters(ours) == sum(p.numel() for p in adapted.parameters() if p.requires_grad)
    x = ids()
    want = adapted(x).logits
    assert not torch.allclose(want, hf_gpt2()(x).logits)  # the adapters matter
    torch.testing.assert_close(ours(x)[0], want, rtol=1e-10, atol=1e-10)
    tl.merge_lora(ours)
    merged = adapted.merge_and_unload()
    torch.testing.assert_close(ours(x)[0], merged(x).logits, rtol=1e-10, atol=1e-10)
