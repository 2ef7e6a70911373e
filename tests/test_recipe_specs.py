"""The recipe's shape: a few block-wide fields and one small spec per kind of part, each kind's options
on its own spec, a per-layer pattern, flags made from the specs' fields, and a new kind of attention
or feed-forward network that works with every tool through one table row."""

import dataclasses

import pytest
import test_recipes_compose as compose
import torch
from torch import nn

import transformer_lib as tl
from transformer_lib import recipe
from transformer_lib.cli import train as train_command
from transformer_lib.train_config import MODEL_SETTINGS

BLOCK_WIDE = {"norm", "norm_eps", "bias", "tie_embeddings"}  # the choices every kind reads
ROLES = {"ffn": recipe.FEED_FORWARDS, "positions": recipe.POSITIONS, "attention": recipe.ATTENTIONS}


def test_the_recipe_has_at_most_ten_fields_and_none_that_belongs_to_one_kind():
    names = {f.name for f in dataclasses.fields(tl.BlockRecipe)}
    assert len(names) <= 10
    assert names == BLOCK_WIDE | set(ROLES) | {"layers"}
    for table in ROLES.values():
        for spec_type in set(table.values()):
            options = {f.name for f in dataclasses.fields(spec_type)}
            assert not options & names, f"{spec_type.__name__} has an option the recipe also has"


def test_every_kinds_option_is_a_flag_with_the_help_its_field_gives():
    flags = {o for action in train_command.build_parser()._actions for o in action.option_strings}
    for table in ROLES.values():
        for spec_type in set(table.values()):
            for f in dataclasses.fields(spec_type):
                if f.name == "scaling" or f.metadata.get("flat") == "attention":
                    continue  # the rescaling's own flags; a recurrence's kind is --attention's value
                name = f.metadata.get("flat") or (f"experts_{f.name}" if spec_type is tl.ExpertsSpec else f.name)
                if spec_type is tl.ExpertsSpec and f.name == "n_experts":
                    name = "experts"
                assert MODEL_SETTINGS[name].startswith(f.metadata["help"].split(" (default")[0]), name
                assert "--" + name.replace("_", "-") in flags, name
    for kind in recipe.ATTENTIONS:
        assert kind in recipe.FLAT_CHOICES["attention"]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"recipe": "llama", "kv_latent": 8}, "kv_latent=8 is latent attention's: attention is 'multi_head'"),
        ({"recipe": "latent", "sinks": True}, "sinks=True is multi_head attention's: attention is 'latent'"),
        ({"recipe": "llama", "sparse_k": 4}, "sparse_k=4 is sparse attention's"),
        ({"recipe": "llama", "activation": "gelu_tanh"}, "activation='gelu_tanh' is mlp ffn's: ffn is 'swiglu'"),
        ({"recipe": "llama", "full_every": 2}, "full_every=2 is linear or delta or gated_delta attention's"),
    ],
)
def test_an_option_given_to_a_kind_without_it_is_refused_by_name(changes, message):
    with pytest.raises(ValueError, match=message):
        tl.GPTConfig(20, **changes)


def test_a_spec_has_only_its_own_options():
    with pytest.raises(TypeError, match="kv_latent"):
        tl.MultiHeadSpec(kv_latent=8)
    with pytest.raises(ValueError, match="'kv_latent' is not an option of attention 'multi_head'"):
        tl.BlockRecipe(attention={"kind": "multi_head", "kv_latent": 8})


def test_a_pattern_makes_a_hybrid_the_same_as_full_every():
    pattern = dataclasses.replace(
        tl.LLAMA_BLOCK,
        attention=tl.RecurrenceSpec("gated_delta"),
        layers=(tl.LayerRule("1::2", attention=tl.MultiHeadSpec()),),
    )
    assert pattern == tl.as_recipe("llama", attention="gated_delta", full_every=2)
    model = tl.GPT(tl.GPTConfig(20, 16, 4, 2, 16, recipe=pattern))
    kinds = [type(layer.self_attn).__name__ for layer in model.decoder.layers]
    assert kinds == ["GatedDeltaNet", "MultiHeadAttention"] * 2
    assert pattern.flat()["full_every"] == 2


def test_a_pattern_that_no_flag_can_say_is_refused_by_name_where_flags_are_needed():
    odd = dataclasses.replace(tl.LLAMA_BLOCK, layers=(tl.LayerRule(":1", attention=tl.MultiHeadSpec(sinks=True)),))
    with pytest.raises(ValueError, match=r"the layer pattern \[':1'\] has no flat form"):
        odd.flat()
    with pytest.raises(ValueError, match="covers no layer of n_layers=2"):
        tl.GPTConfig(20, 16, 2, 2, 16, recipe=dataclasses.replace(odd, layers=(tl.LayerRule("5:", ffn="mlp"),)))


@pytest.mark.parametrize("where", ["3", "a:b", "-1:", "::0", 3])
def test_a_rule_names_its_layers_as_a_slice(where):
    with pytest.raises(ValueError, match="layers"):
        tl.LayerRule(where, ffn="mlp")


# ---- A feed-forward network written here, outside the library: ReLU-gated, three matrices ----


class ReluGated(nn.Module):
    """``down(relu(gate(x)) * up(x))``: a gated network the library does not have."""

    part_role = "feed_forward"
    part_matrices = {"gate": "gate.weight", "in": "up.weight", "out": "down.weight"}

    def __init__(self, d_model, d_ff, bias):
        super().__init__()
        self.gate, self.up = nn.Linear(d_model, d_ff, bias=bias), nn.Linear(d_model, d_ff, bias=bias)
        self.down = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x):
        return self.down(torch.relu(self.gate(x)) * self.up(x))


@dataclasses.dataclass(frozen=True)
class ReluGatedSpec(tl.Spec):
    """The test's own kind of feed-forward network: a spec with its layer and one option."""

    kind = "relu_gated"
    d_ff: int = 24

    def layer(self, recipe_, d_model, d_ff=None):
        return ReluGated(d_model, self.d_ff if d_ff is None else d_ff, recipe_.bias)


@pytest.fixture
def new_kinds(monkeypatch):
    """The two new kinds, each one table row."""
    monkeypatch.setitem(recipe.FEED_FORWARDS, "relu_gated", ReluGatedSpec)
    monkeypatch.setitem(recipe.ATTENTIONS, "separate", compose.SeparateSpec)


EXPERTS_FROM_LAYER_1 = {"recipe": "llama", "layers": [{"layers": "1:", "ffn": {"kind": "relu_gated", "d_ff": 8}}]}
NEW_KINDS = {
    "new-ffn": {"recipe": "llama", "ffn": {"kind": "relu_gated"}},
    "new-ffn-from-layer-1": EXPERTS_FROM_LAYER_1,
    "new-attention": {"recipe": "llama", "attention": "separate"},
}


def test_a_stand_in_feed_forward_from_layer_k_on(new_kinds):
    model = compose.make(EXPERTS_FROM_LAYER_1)
    kinds = [type(layer.ff).__name__ for layer in model.decoder.layers]
    assert kinds == ["SwiGLU", "ReluGated"] and model.decoder.layers[1].ff.up.out_features == 8
    again = tl.GPTConfig(**model.config.to_dict())  # a checkpoint's dict names the kind
    assert again.recipe == model.config.recipe and isinstance(again.recipe.layers[0].ffn, ReluGatedSpec)


@pytest.mark.parametrize("name", list(NEW_KINDS))
def test_a_new_kind_works_with_every_tool(name, new_kinds, tmp_path):
    choices = NEW_KINDS[name]
    compose.test_train_resume_save_and_load(choices, tmp_path)
    compose.test_sampling_with_and_without_the_cache(choices)
    for method in tl.FINETUNE_METHODS:
        compose.test_finetuning_a_classifier_trains_what_the_method_says(choices, method)
    compose.test_lora_adapts_every_block_matrix_and_merges_exactly(choices)
    compose.test_capture_ablate_and_patch_heads(choices)


# A recipe as checkpoints stored it before the specs: every choice flat, the experts and the
# rescaling as their own dicts.
OLD_HYBRID = {
    "norm": "rmsnorm",
    "norm_eps": 1e-5,
    "ffn": "swiglu",
    "activation": "gelu",
    "d_ff": None,
    "positions": "rotary",
    "rotary_base": 10000.0,
    "attention": "gated_delta",
    "qk_norm": True,
    "bias": False,
    "tie_embeddings": True,
    "kv_latent": None,
    "q_latent": None,
    "rope_dim": None,
    "sparse_k": None,
    "sinks": False,
    "keep_first": 0,
    "full_every": 4,
    "experts": {"n_experts": 4, "top_k": 2},
    "rope_scaling": {"kind": "linear", "factor": 2.0},
}


def test_an_old_flat_checkpoint_loads_through_the_one_conversion():
    config = tl.GPTConfig(20, 16, 4, 2, 16, recipe=OLD_HYBRID)
    r = config.recipe
    assert r.attention == tl.RecurrenceSpec("gated_delta")
    assert r.layers == (tl.LayerRule("3::4", attention=tl.MultiHeadSpec(qk_norm=True)),)
    assert r.ffn == tl.ExpertsSpec(n_experts=4) and r.positions.scaling == tl.RopeScaling("linear", 2.0)
    assert r == tl.recipe_from_flat(OLD_HYBRID)
    stored = config.to_dict()["recipe"]  # what a checkpoint stores now: each spec with its kind
    assert stored["attention"] == {"kind": "gated_delta"} and stored["layers"][0]["layers"] == "3::4"
    assert tl.GPTConfig(**config.to_dict()).recipe == r
    assert {k: v for k, v in r.flat().items() if k not in ("experts", "rope_scaling")} == {
        k: v for k, v in OLD_HYBRID.items() if k not in ("experts", "rope_scaling")
    }
