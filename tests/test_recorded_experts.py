"""The record chapter "Experts" reads (``transformer_lib.experiments.experts``): it holds every model
and seed at the module's settings, with the parameter counts the current code builds and loads
that are shares; the shipped checkpoint is seed 0's experts model; and seed 0, re-run, reproduces
the record (slow)."""

import math

import pytest
import torch

import transformer_lib as tl
from transformer_lib.experiments import experts as X
from transformer_lib.experiments import recorded
from transformer_lib.experiments.gpt import weights_sha256
from transformer_lib.experts import active_parameters, experts_layers


@pytest.fixture(scope="module")
def sweep():
    return recorded("experts")["sweep"]


def runs_of(sweep, name):
    return [r for r in sweep["runs"] if r["name"] == name]


def test_the_record_holds_every_model_and_seed_at_the_current_settings(sweep):
    assert sweep["settings"] == {**X.SETTINGS, **X.LLAMA}
    assert sweep["models"] == X.MODELS
    assert [(r["name"], r["seed"]) for r in sweep["runs"]] == [(n, s) for n in X.MODELS for s in X.SEEDS]
    for r in sweep["runs"]:
        assert r["bits_per_byte"] > 0 and r["final_loss"] > 0 and r["probe_loss"] > 0, r["name"]
        assert r["seconds_per_step"] > 0


def test_the_recorded_parameters_are_those_the_current_code_builds(sweep):
    for name in X.MODELS:
        model = tl.GPT(X.config(name))
        total, active = sum(p.numel() for p in model.parameters()), active_parameters(model)
        for r in runs_of(sweep, name):
            assert (r["params"], r["active_params"]) == (total, active), name


def test_the_dense_models_match_the_experts_in_active_and_in_total_parameters(sweep):
    # equal compute per token and equal memory, up to the router (d_model -> n_experts, per layer)
    s, e = X.SETTINGS, X.EXPERTS
    router = s["n_layers"] * s["d_model"] * e["n_experts"]
    params = {name: runs_of(sweep, name)[0] for name in X.MODELS}
    for name in ("experts", "experts_free", "experts_bias"):
        assert params[name]["active_params"] == params["dense_active"]["params"] + router
        assert params[name]["params"] == params["dense_total"]["params"] + router
        assert params[name]["active_params"] < params[name]["params"]
    for name in ("dense_active", "dense_total"):
        assert params[name]["active_params"] == params[name]["params"]


def test_the_recorded_loads_are_shares_of_the_assignments(sweep):
    s, e = X.SETTINGS, X.EXPERTS
    steps = [1, *range(s["load_every"], s["steps"] + 1, s["load_every"])]
    assignments = s["batch_size"] * s["context_len"] * e["top_k"]  # N k of one training batch
    for r in sweep["runs"]:
        if "experts" not in X.MODELS[r["name"]]:
            assert not {"shares", "held_out_shares", "max_share", "load_steps"} & set(r), r["name"]
            continue
        assert r["load_steps"] == steps
        assert len(r["shares"]) == len(r["held_out_shares"]) == s["n_layers"]
        for layer in r["shares"]:
            assert len(layer) == len(steps)
            for step in layer:
                assert len(step) == e["n_experts"] and math.fsum(step) == pytest.approx(1, abs=1e-12)
                # each share is a whole number of one batch's assignments, and no expert serves a
                # token twice: at most 1/k of them
                assert all(x * assignments == pytest.approx(round(x * assignments), abs=1e-9) for x in step)
                assert 0 <= min(step) and max(step) <= 1 / e["top_k"]
        for layer in r["held_out_shares"]:
            assert len(layer) == e["n_experts"] and math.fsum(layer) == pytest.approx(1, abs=1e-12)
            assert 0 <= min(layer) and max(layer) <= 1 / e["top_k"]
        assert r["max_share"] == max(max(layer) for layer in r["held_out_shares"])


def test_balancing_keeps_the_loads_spread_and_its_absence_lets_a_layer_collapse(sweep):
    # what the chapter reads from the loads (balance is 1/8 = 0.125)
    for r in runs_of(sweep, "experts") + runs_of(sweep, "experts_bias"):
        assert r["max_share"] < 0.25, (r["name"], r["seed"])
    for r in runs_of(sweep, "experts_free"):
        assert r["max_share"] > 0.4, r["seed"]


def test_the_shipped_checkpoint_is_seed_0s_experts_model(sweep, one_thread):
    model, tokenizer = X.checkpoint_model()
    seed0 = next(r for r in runs_of(sweep, "experts") if r["seed"] == 0)
    assert isinstance(model, tl.GPT) and not model.training
    assert model.config == X.config("experts", tokenizer.vocab_size)
    assert {p.dtype for p in model.state_dict().values()} == {torch.float32}
    assert weights_sha256(model) == seed0["checkpoint_sha256"]  # bit for bit the recorded weights
    # float32 against the float64 model the record measured: a routing decision that another
    # CPU's rounding flips moves the loss of 512 tokens by about 1e-4, another model by 0.05
    val_ids = X.corpus()[2]
    assert X.probe_loss(model, val_ids) == pytest.approx(seed0["probe_loss"], abs=2e-3)
    layers = list(experts_layers(model).values())
    assert len(layers) == X.SETTINGS["n_layers"]
    assert all(
        int(layer.loads.sum()) == X.SETTINGS["probe_windows"] * X.SETTINGS["context_len"] * X.EXPERTS["top_k"]
        for layer in layers
    )


def test_the_checkpoint_does_not_load_into_a_dense_model():
    state = torch.load(X.CHECKPOINT, weights_only=True)
    with pytest.raises(RuntimeError, match="experts"):
        tl.GPT(X.config("dense_total")).load_state_dict(state)


def test_an_unknown_model_is_refused_by_name():
    with pytest.raises(ValueError, match="'sparse'.*dense_active"):
        X.config("sparse")


def reproduce(record: dict) -> None:
    """Seed 0 of ``experts`` and ``dense_active`` (about a minute on one core).

    The training runs in float64, and still a CPU that rounds differently moves the result: re-run
    on the recording machine (AMD EPYC, AVX-512) under four kernel settings, ATEN_CPU_CAPABILITY
    avx2 and the default avx512 with MKL_CBWR=COMPATIBLE gave the record to 4e-10 bits per byte,
    but the portable kernels (ATEN_CPU_CAPABILITY=default, with or without MKL_CBWR=COMPATIBLE,
    what scripts/test_other_kernels.sh runs) moved the experts model by 0.016 bits per byte, its
    final loss by 0.013 and its largest held-out share by 0.010 (a routing choice flipped during
    training: a training batch's shares differed by up to 0.31 at one logged step), and the
    dense model by 0.0007. So the test allows about twice the largest distance seen: 0.035 bits
    per byte and 0.03 nats, 0.03 on the largest share, well below the gaps the chapter reads
    (0.03-0.1 bits between the dense models and the mixtures; 0.16-0.19 against 0.44-0.46 for
    the largest share with and without balancing). The parameters must be equal."""
    for name in ("experts", "dense_active"):
        old = next(r for r in record["sweep"]["runs"] if (r["name"], r["seed"]) == (name, 0))
        fresh = X.run(name, 0)
        assert (fresh["params"], fresh["active_params"]) == (old["params"], old["active_params"]), name
        assert fresh["bits_per_byte"] == pytest.approx(old["bits_per_byte"], abs=0.035), name
        assert fresh["final_loss"] == pytest.approx(old["final_loss"], abs=0.03), name
        if "max_share" in old:
            assert fresh["max_share"] == pytest.approx(old["max_share"], abs=0.03), name
            assert fresh["load_steps"] == old["load_steps"]


@pytest.mark.slow
@pytest.mark.cpu_rounding
def test_a_re_run_of_seed_0_reproduces_the_record(one_thread):
    reproduce(recorded("experts"))
