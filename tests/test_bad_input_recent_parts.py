"""Bad input to the library's newer parts, table by table (one table per module): latent attention,
gated DeltaNet and the linear recurrences on an empty sequence, a hybrid with no full-attention
layer, NumPy numbers where Python's work, the verifiable rewards and their preference files, GRPO's
groups and rewards, and the experiments command's ``--out``.

A row is ``(name, call, expected)``: ``expected`` is ``(error class, regex of the message)`` for a
refusal, or a function that asserts what the call returned for an input that is legal."""

import io
import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import transformer_lib as tl
from transformer_lib import experiments
from transformer_lib._checks import check_int, check_probability, plain_number
from transformer_lib.data import verifiable as V
from transformer_lib.delta_net import GatedDeltaNet
from transformer_lib.evaluate import loss_units
from transformer_lib.latent_attention import LatentAttention
from transformer_lib.linear_attention import RECURRENT_FORMS, delta_rule, linear_attention
from transformer_lib.preference import group_advantages

NAN, INF = float("nan"), float("inf")


def check_row(call, expected):
    """Run one row: a refusal must raise its class with a matching message; otherwise the row's own
    function checks the result."""
    if isinstance(expected, tuple):
        error, pattern = expected
        with pytest.raises(error, match=pattern):
            call()
    else:
        expected(call())


def shape(*want):
    def check(got):
        assert tuple(got.shape) == want, tuple(got.shape)

    return check


# Empty sequences: an empty output of the right shape, a cache or state as it was --------------------


def seeded(layer_type, *args, **kwargs):
    torch.manual_seed(0)
    return layer_type(*args, **kwargs).double().eval()


B, D, H = 2, 16, 2
EMPTY = torch.zeros(B, 0, D, dtype=torch.float64)
FILLED = torch.randn(B, 3, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


def empty_output(layer, **kwargs):
    """``layer`` on an empty sequence: ``(output, weights)``, which must be empty."""
    return layer(EMPTY, EMPTY, EMPTY, **kwargs)


def output_and_weights(weights_shape):
    def check(got):
        out, weights = got
        assert out.shape == (B, 0, D) and out.dtype == torch.float64
        assert (weights is None) if weights_shape is None else weights.shape == weights_shape

    return check


def cache_kept(layer, **kwargs):
    """Three tokens through ``layer`` with a cache, then an empty step: the cache must not change."""
    cache = layer.new_cache()
    layer(FILLED, FILLED, FILLED, cache=cache, **kwargs)
    before = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in vars(cache).items()}
    out, _ = layer(EMPTY, EMPTY, EMPTY, cache=cache, **kwargs)
    return out, before, dict(vars(cache))


def unchanged(got):
    out, before, after = got
    assert out.shape == (B, 0, D)
    assert before.keys() == after.keys()
    for key, value in before.items():
        assert torch.equal(value, after[key]) if isinstance(value, torch.Tensor) else value == after[key], key


def latent_layer():
    return seeded(LatentAttention, D, H, kv_latent=8)


def delta_layer(mode):
    return seeded(GatedDeltaNet, D, H, mode=mode)


def mha_layer():
    return seeded(tl.MultiHeadAttention, D, H)


LATENT_ROWS = [
    ("multi-head attention, the reference", lambda: empty_output(mha_layer()), output_and_weights(None)),
    ("latent attention", lambda: empty_output(latent_layer()), output_and_weights(None)),
    (
        "latent attention, causal, weights",
        lambda: empty_output(latent_layer(), is_causal=True, need_weights=True),
        output_and_weights((B, H, 0, 0)),
    ),
    ("latent attention, folded", lambda: empty_output(latent_layer(), folded=True), output_and_weights(None)),
    ("latent attention, a cache of 3 tokens", lambda: cache_kept(latent_layer(), is_causal=True), unchanged),
    (
        "latent attention, attention_weights",
        lambda: latent_layer().attention_weights(EMPTY, EMPTY, EMPTY),
        shape(B, H, 0, 0),
    ),
]

DELTA_NET_ROWS = [
    row
    for mode in tl.DELTA_MODES
    for row in [
        (f"{mode}", lambda mode=mode: empty_output(delta_layer(mode)), output_and_weights(None)),
        (
            f"{mode}, weights",
            lambda mode=mode: empty_output(delta_layer(mode), need_weights=True),
            output_and_weights((B, H, 0, 0)),
        ),
        (f"{mode}, a state of 3 tokens", lambda mode=mode: cache_kept(delta_layer(mode)), unchanged),
        (
            f"{mode}, attention_weights",
            lambda mode=mode: delta_layer(mode).attention_weights(EMPTY, EMPTY, EMPTY),
            shape(B, H, 0, 0),
        ),
    ]
]


def recurrence(function, form, **kwargs):
    """``function`` on an empty sequence from a random state: ``(out, state, initial state)``."""
    g = torch.Generator().manual_seed(2)
    q = torch.zeros(B, H, 0, 4, dtype=torch.float64)
    width = 5 if kwargs.get("normalize") else 4
    state = torch.randn(B, H, 4, width, dtype=torch.float64, generator=g)
    extra = (torch.zeros(B, H, 0, dtype=torch.float64),) if function is delta_rule else ()
    out, final = function(q, q, q, *extra, form=form, initial_state=state, **kwargs)
    return out, final, state


def state_kept(want_width):
    def check(got):
        out, final, state = got
        assert out.shape == (B, H, 0, want_width) and torch.equal(final, state)

    return check


LINEAR_ROWS = [
    (
        f"{function.__name__}, {form}{', normalised' if kwargs else ''}",
        lambda function=function, form=form, kwargs=kwargs: recurrence(function, form, **kwargs),
        state_kept(4),
    )
    for form in RECURRENT_FORMS
    for function, kwargs in ((linear_attention, {}), (linear_attention, {"normalize": True}), (delta_rule, {}))
]


@pytest.mark.parametrize("name, call, expected", LATENT_ROWS, ids=[r[0] for r in LATENT_ROWS])
def test_latent_attention_on_an_empty_sequence(name, call, expected):
    check_row(call, expected)


@pytest.mark.parametrize("name, call, expected", DELTA_NET_ROWS, ids=[r[0] for r in DELTA_NET_ROWS])
def test_gated_delta_net_on_an_empty_sequence(name, call, expected):
    check_row(call, expected)


@pytest.mark.parametrize("name, call, expected", LINEAR_ROWS, ids=[r[0] for r in LINEAR_ROWS])
def test_the_recurrences_on_an_empty_sequence(name, call, expected):
    check_row(call, expected)


@settings(max_examples=12, deadline=None)
@given(split=st.integers(0, 5), layer=st.sampled_from(["latent", *tl.DELTA_MODES]))
def test_an_empty_step_in_the_middle_of_decoding_changes_nothing(split, layer):
    # the outputs after [x[:split], (empty), x[split:]] equal those after [x[:split], x[split:]]
    x = torch.randn(B, 5, D, dtype=torch.float64, generator=torch.Generator().manual_seed(split))
    model = latent_layer() if layer == "latent" else delta_layer(layer)
    causal = {"is_causal": True}
    outs = []
    for steps in ([x[:, :split], x[:, split:]], [x[:, :split], EMPTY, x[:, split:]]):
        cache = model.new_cache()
        outs.append(torch.cat([model(s, s, s, cache=cache, **causal)[0] for s in steps], dim=1))
    torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=0)


# The documented spread of a NaN (linear_attention's docstring) ------------------------------------


def nan_reaches(function, form):
    """The positions whose output is NaN after a NaN in position 5's value (T = 8, blocks of 4)."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 1, 8, 4, dtype=torch.float64, generator=g) for _ in range(3))
    v[0, 0, 5] = NAN
    extra = (torch.full((1, 1, 8), 0.5, dtype=torch.float64),) if function is delta_rule else ()
    out, _ = function(q, tl.l2_normalize(k), v, *extra, form=form, chunk_size=4)
    return torch.isnan(out[0, 0]).any(-1).nonzero().flatten().tolist()


def reached(positions):
    def check(got):
        assert got == positions, got

    return check


# the recurrence: forward from the NaN only; chunked: from its block's start (4) on; parallel: all
NAN_ROWS = [
    (f"{function.__name__}, {form}", lambda function=function, form=form: nan_reaches(function, form), reached(want))
    for function in (linear_attention, delta_rule)
    for form, want in (("recurrent", [5, 6, 7]), ("chunked", [4, 5, 6, 7]), ("parallel", list(range(8))))
]


@pytest.mark.parametrize("name, call, expected", NAN_ROWS, ids=[r[0] for r in NAN_ROWS])
def test_a_nan_spreads_as_the_linear_attention_docstring_says(name, call, expected):
    check_row(call, expected)


# A hybrid needs a full-attention layer; NumPy numbers are numbers ----------------------------------


def gpt_config(**changes):
    return tl.GPTConfig(11, **{"context_len": 8, "n_layers": 2, "n_heads": 2, "d_model": 8, **changes})


def loads_with_weights_only(config):
    """A checkpoint's config dict written and read back as ``load_checkpoint`` reads it."""
    buffer = io.BytesIO()
    torch.save({"config": config.to_dict()}, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)["config"], json.dumps(config.to_dict())


def python_numbers(**want):
    def check(got):
        stored = got[0] if isinstance(got, tuple) else got
        for name, value in want.items():
            held = stored[name] if isinstance(stored, dict) else getattr(stored, name)
            assert held == value and type(held) is type(value), (name, held)

    return check


def layer_kinds(model):
    return [type(layer.self_attn).__name__ for layer in model.layers]


HYBRID = dict(attention="gated_delta", positions="rotary", norm="rmsnorm", ffn="swiglu", bias=False)

CONFIG_ROWS = [
    (
        "full_every above n_layers",
        lambda: gpt_config(full_every=5, **HYBRID),
        (ValueError, r"full_every=5 .* a model of n_layers=2 would have none \(use at most 2\)"),
    ),
    (
        "full_every equal to n_layers: the last layer is full",
        lambda: layer_kinds(tl.GPT(gpt_config(full_every=2, **HYBRID)).decoder),
        lambda kinds: kinds == ["GatedDeltaNet", "MultiHeadAttention"],
    ),
    (
        "NumPy sizes and rates stored as Python's",
        lambda: loads_with_weights_only(
            gpt_config(n_layers=np.int64(2), dropout=np.float32(0.25), norm_eps=np.float32(0.5), d_ff=np.int64(12))
        ),
        lambda got: got[0]["n_layers"] == 2 and got[0]["dropout"] == 0.25 and got[0]["recipe"]["norm_eps"] == 0.5,
    ),
    ("a bool is still no size", lambda: gpt_config(d_model=True), (TypeError, r"d_model must be an int, got True")),
    (
        "TrainConfig: a NumPy learning rate",
        lambda: tl.TrainConfig(lr=np.float32(0.5), batch_size=np.int64(3)),
        python_numbers(lr=0.5, batch_size=3),
    ),
    (
        "TrainConfig: a NumPy NaN",
        lambda: tl.TrainConfig(lr=np.float64(NAN)),
        (TypeError, r"TrainConfig.lr must be a finite float, got np.float64\(nan\)"),
    ),
    (
        "TrainConfig: a NumPy float where an int belongs",
        lambda: tl.TrainConfig(batch_size=np.float32(3)),
        (TypeError, r"TrainConfig.batch_size must be a finite int, got np.float32\(3.0\)"),
    ),
    ("RMSNorm: a NumPy eps", lambda: tl.RMSNorm(8, eps=np.float32(0.5)), python_numbers(eps=0.5)),
    ("RMSNorm: eps inf", lambda: tl.RMSNorm(8, eps=INF), (ValueError, r"eps must be a number > 0 .* not inf, got inf")),
    (
        "RMSNorm: a NumPy NaN eps",
        lambda: tl.RMSNorm(8, eps=np.float32(NAN)),
        (ValueError, r"eps must be a number > 0 .*got np.float32\(nan\)"),
    ),
    ("check_int: a NumPy int", lambda: check_int(np.int64(3), "n"), lambda got: got is None),
    (
        "check_probability: a NumPy NaN",
        lambda: check_probability(np.float32(NAN), "dropout"),
        (ValueError, r"dropout must be a probability in \[0, 1\), got np.float32\(nan\)"),
    ),
    (
        "loss_units: a NumPy loss",
        lambda: loss_units(np.float32(2.0)),
        lambda got: got["loss"] == 2.0 and got["perplexity"] == pytest.approx(math.exp(2.0)),
    ),
    ("MCItem: a NumPy answer", lambda: tl.data.MCItem("a", ("x", "y"), np.int64(1)), lambda item: item.answer == 1),
]


@pytest.mark.parametrize("name, call, expected", CONFIG_ROWS, ids=[r[0] for r in CONFIG_ROWS])
def test_configs_and_number_checks(name, call, expected):
    check_row(call, expected)


@settings(max_examples=40, deadline=None)
@given(
    value=st.one_of(st.integers(-(2**40), 2**40), st.floats(allow_nan=True, allow_infinity=True)),
    numpy_type=st.sampled_from([np.int8, np.int32, np.int64, np.uint16, np.float16, np.float32, np.float64]),
)
def test_plain_number_gives_pythons_number_of_the_same_value(value, numpy_type):
    with np.errstate(all="ignore"):
        if np.issubdtype(numpy_type, np.integer):
            info = np.iinfo(numpy_type)
            value = int(min(max(value, info.min), info.max)) if math.isfinite(value) else 0
        number = numpy_type(value)
    plain = plain_number(number)
    assert type(plain) is (int if np.issubdtype(numpy_type, np.integer) else float)
    assert plain == number or (math.isnan(plain) and np.isnan(number))
    assert plain_number(True) is True and plain_number("1") == "1" and plain_number(None) is None


# The verifiable rewards and their preference files ------------------------------------------------

GOOD = b'{"prompt": "a", "chosen": "b", "rejected": "c"}\n'


def read_with_line_2(tmp_path, line: bytes):
    path = tmp_path / "prefs.jsonl"
    path.write_bytes(GOOD + line)
    return lambda: V.read_preferences(path)


VERIFIABLE_ROWS = [
    (
        "wrong_date: 30 February",
        lambda _: lambda: V.wrong_date("2003-02-30", np.random.default_rng(0)),
        (ValueError, r"wrong_date needs a real date written yyyy-mm-dd, got '2003-02-30'"),
    ),
    (
        "char_reward: an empty target",
        lambda _: lambda: V.char_reward("", ""),
        (ValueError, r"char_reward needs a target date, got an empty one"),
    ),
    ("char_reward: an empty answer", lambda _: lambda: V.char_reward("", "2003-04-17"), lambda got: got == 0.0),
    (
        "read_preferences: not UTF-8",
        lambda p: read_with_line_2(p, b"\xff\xfe\n"),
        (ValueError, r"prefs.jsonl, line 2: not UTF-8 text \(byte 0xff at 0\)"),
    ),
    (
        "read_preferences: a JSON array",
        lambda p: read_with_line_2(p, b'["a", "b", "c"]\n'),
        (ValueError, r"prefs.jsonl, line 2: needs an object with the keys 'prompt', .*, got a JSON list"),
    ),
    (
        "read_preferences: the end token's spelling",
        lambda p: read_with_line_2(p, b'{"prompt": "a", "chosen": "b<|endoftext|>", "rejected": "c"}\n'),
        (ValueError, r"prefs.jsonl, line 2: .*spells the special token"),
    ),
    (
        "read_preferences: a lone surrogate",
        lambda p: read_with_line_2(p, b'{"prompt": "a", "chosen": "b", "rejected": "\\ud800"}\n'),
        (ValueError, r"prefs.jsonl, line 2: .*a lone surrogate"),
    ),
]


@pytest.mark.parametrize("name, make, expected", VERIFIABLE_ROWS, ids=[r[0] for r in VERIFIABLE_ROWS])
def test_verifiable_rewards_and_preference_files(name, make, expected, tmp_path):
    check_row(make(tmp_path), expected)


# GRPO: groups of rewards, and a reward function that returns no number -----------------------------


def per_group_loop(rewards, eps=1e-4):
    """What group_advantages computes, group by group in Python (float64)."""
    out = []
    for group in rewards:
        mean = sum(group) / len(group)
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / (len(group) - 1))
        out.append([0.0 if std == 0 else (r - mean) / (std + eps) for r in group])
    return out


@pytest.fixture(scope="module")
def tiny_policy():
    pairs = tl.date_pairs(4, seed=0)
    text = "".join(p + "\n=> " + r + "\n" for p, r in pairs) * 3
    tokenizer = tl.train_bpe(text, 270, specials=["<|endoftext|>"])
    torch.manual_seed(0)
    model = tl.GPT(tl.GPTConfig(tokenizer.vocab_size, context_len=64, n_layers=1, n_heads=2, d_model=8))
    return model.double(), tokenizer, pairs


def returns(value):
    def my_reward(answer, target):
        return value

    return my_reward


def grpo_with(reward):
    def call(policy):
        model, tokenizer, pairs = policy
        batches = tl.GRPOBatches(
            model, tokenizer, pairs, pairs, 2, reward=reward, beta=0, group_size=2, max_new_tokens=3, seed=0
        )
        return batches("train")

    return call


RAGGED = [[1.0, 0.0], [1.0, 0.0, 1.0]]
EVEN = [[1.0, 0.0, 0.5], [0.25, 0.25, 0.25], [0.0, 1.0, 1.0]]

PREFERENCE_ROWS = [
    (
        "ragged groups",
        lambda _: group_advantages(RAGGED),
        (ValueError, r"groups of sizes 2 \(group 0\) and 3 \(group 1\): score every answer"),
    ),
    (
        "one odd group among many",
        lambda _: group_advantages([[1.0, 0.0]] * 20 + [[1.0, 0.0, 1.0]]),
        (ValueError, r"groups of sizes 2 \(group 0\) and 3 \(group 20\)"),
    ),
    (
        "groups of one size equal a per-group loop",
        lambda _: group_advantages(EVEN),
        lambda got: torch.testing.assert_close(got, torch.tensor(per_group_loop(EVEN), dtype=torch.float64)),
    ),
    (
        "NumPy rewards and eps",
        lambda _: group_advantages(np.array(EVEN), eps=np.float32(1e-4)),
        lambda got: got.dtype == torch.float64 and got.shape == (3, 3),
    ),
    (
        "a reward that returns None",
        grpo_with(returns(None)),
        (ValueError, r"the reward my_reward\(.*\) must return a finite number, got None"),
    ),
    (
        "a reward that returns NaN",
        grpo_with(returns(NAN)),
        (ValueError, r"the reward my_reward\(.*\) must return a finite number, got nan"),
    ),
    (
        "a reward that returns a string",
        grpo_with(returns("1")),
        (ValueError, r"the reward my_reward\(.*\) must return a finite number, got '1'"),
    ),
    (
        "a reward that returns a NumPy number",
        grpo_with(returns(np.float32(0.5))),
        lambda batch: batch["rewards"].tolist() == [0.5] * 4,
    ),
]


@pytest.mark.parametrize("name, make, expected", PREFERENCE_ROWS, ids=[r[0] for r in PREFERENCE_ROWS])
def test_grpo_groups_and_rewards(name, make, expected, tiny_policy):
    check_row(lambda: make(tiny_policy), expected)


# The experiments command's --out -------------------------------------------------------------------


def no_training(chapter, calls):
    """``chapter``'s experiment with parts that train nothing and record one run per seed."""

    def part(name):
        def run(seeds, steps):
            calls.append(name)
            return {name: {"runs": [{"seed": s, "stub": True} for s in seeds]}}

        return run

    real = REAL_EXPERIMENT(chapter)
    return experiments.Experiment(chapter, {n: experiments.Part(part(n), p.seeds) for n, p in real.parts.items()})


REAL_EXPERIMENT = experiments.experiment
STAMP = {"python": "3.11.7", "torch": "2.13.0", "transformer_lib": "0.1.0", "threads": 1}


def out_run(content, *flags):
    """``python -m transformer_lib.experiments what_attention_learns --parts fixed --seeds 0 --out mine.json`` on a
    file holding ``content``, through the command's main function: ``(exit status, stderr, the file
    after, parts run)``."""

    def call(tmp_path, monkeypatch, capsys):
        calls = []
        monkeypatch.setattr(experiments, "experiment", lambda name: no_training(name, calls))
        mine = tmp_path / "mine.json"
        mine.write_text(content)
        try:
            status = experiments.main(
                ["what_attention_learns", "--parts", "fixed", "--seeds", "0", "--out", str(mine), *flags]
            )
        except SystemExit as stop:
            status = stop.code
        return status, capsys.readouterr().err, mine.read_text(), calls

    return call


def refused(got):
    status, err, after, calls = got
    assert status == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "mine.json holds something other than a record of what_attention_learns" in err and "--force" in err
    assert calls == []  # before any training


def written(got):
    status, _, after, calls = got
    record = json.loads(after)
    assert status == 0 and calls == ["fixed"] and record["fixed"] == {"runs": [{"seed": 0, "stub": True}]}
    assert set(record) == {"versions", "fixed"}  # the user's file replaced, not merged into


def merged(got):
    status, _, after, calls = got
    record = json.loads(after)
    assert status == 0 and record["repeats"] == {"runs": []} and record["fixed"]["runs"][-1]["stub"]


USERS = {
    "settings only": {"settings": {"lr": 0.1}},
    "settings and a version string": {"settings": {}, "versions": "mine"},
    "a stamp of other fields": {"settings": {}, "versions": {"python": "3.11", "numpy": "2.0"}},
    "the stamp and a key of its own": {"versions": STAMP, "settings": {}, "notes": "mine"},
    "the old stamp of other types": {"fixed": 1, "torch": "x", "threads": "y"},
    "the stamp alone": {"versions": STAMP},
}
EXPERIMENT_ROWS = [
    *[(f"--out: {name}", out_run(json.dumps(content)), refused) for name, content in USERS.items()],
    ("--out: a JSON list", out_run("[1, 2]"), refused),
    ("--out: --force replaces a user's file", out_run(json.dumps(USERS["settings only"]), "--force"), written),
    (
        "--out: a record of what_attention_learns is merged into",
        out_run(json.dumps({"versions": STAMP, "repeats": {"runs": []}})),
        merged,
    ),
    (
        "--out: the older stamp is a record",
        out_run(json.dumps({"torch": "2.0", "threads": 1, "repeats": {"runs": []}})),
        merged,
    ),
]


@pytest.mark.parametrize("name, call, expected", EXPERIMENT_ROWS, ids=[r[0] for r in EXPERIMENT_ROWS])
def test_the_experiments_out_file(name, call, expected, tmp_path, monkeypatch, capsys):
    check_row(lambda: call(tmp_path, monkeypatch, capsys), expected)


@pytest.mark.parametrize("chapter", list(experiments.RECORDS))
def test_every_shipped_record_is_still_a_record_to_merge_into(chapter, tmp_path):
    experiment = REAL_EXPERIMENT(chapter)
    record = json.loads(experiments.record_path(chapter).read_text(encoding="utf-8"))
    assert experiments.recorder.is_record(experiment, record)
    assert experiments.recorder.check_out(experiment, None) is True  # the shipped file itself
    copy = tmp_path / "copy.json"
    copy.write_text(json.dumps(record))
    assert experiments.recorder.check_out(experiment, copy) is True  # and a copy given as --out
    assert experiments.recorder.check_request(experiment, seeds=[np.int64(0)])  # a NumPy seed is a seed
