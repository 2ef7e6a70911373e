"""Chapter "Attention as a recurrence"'s associative recall task: the layout of a sequence, the answers it scores, the
checks of its settings, and an accuracy that a model reading the pairs can reach."""

import pytest
import torch

import transformer_lib as tl


def test_a_sequence_is_pairs_a_separator_then_queries_with_their_values():
    g = torch.Generator().manual_seed(0)
    n_keys, n_values = 20, 10
    batch = tl.data.recall_batch(8, 5, n_keys=n_keys, n_values=n_values, n_queries=3, generator=g)
    tokens = torch.cat([batch.idx, batch.targets[:, -1:]], dim=1)  # (B, T + 1)
    assert batch.idx.shape == batch.targets.shape == batch.loss_mask.shape == (8, 2 * 5 + 2 * 3)
    assert torch.equal(batch.targets[:, :-1], batch.idx[:, 1:])
    assert (tokens[:, 10] == n_keys + n_values).all()  # the separator
    assert tokens.max() < tl.data.recall_vocab_size(n_keys, n_values)
    for row, mask in zip(tokens, batch.loss_mask, strict=True):
        keys, values = row[0:10:2], row[1:10:2]
        assert len(set(keys.tolist())) == 5 and (keys < n_keys).all() and (values >= n_keys).all()
        stored = dict(zip(keys.tolist(), values.tolist(), strict=True))
        asked, answers = row[11::2], row[12::2]
        assert len(set(asked.tolist())) == 3
        assert all(stored[k] == v for k, v in zip(asked.tolist(), answers.tolist(), strict=True))
        assert mask.nonzero().flatten().tolist() == [11, 13, 15]  # the queried keys, whose target is the answer


def test_the_same_generator_state_gives_the_same_batch():
    a = tl.data.recall_batch(4, 6, generator=torch.Generator().manual_seed(3))
    b = tl.data.recall_batch(4, 6, generator=torch.Generator().manual_seed(3))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_an_oracle_that_reads_the_pairs_gets_every_answer_and_a_constant_one_few():
    batch = tl.data.recall_batch(16, 8, n_keys=32, n_values=32, generator=torch.Generator().manual_seed(1))
    V = tl.data.recall_vocab_size(32, 32)

    class Oracle(torch.nn.Module):  # looks each queried key up among the pairs before it
        def forward(self, idx):
            logits = torch.zeros(*idx.shape, V)
            for b, row in enumerate(idx):
                stored = dict(zip(row[0:16:2].tolist(), row[1:16:2].tolist(), strict=True))
                for t in range(17, idx.shape[1], 2):
                    logits[b, t, stored[int(row[t])]] = 1.0
            return logits, None

    class Constant(torch.nn.Module):
        def forward(self, idx):
            logits = torch.zeros(*idx.shape, V)
            logits[..., 32] = 1.0  # always the first value
            return logits, None

    assert tl.data.recall_accuracy(Oracle(), batch) == 1.0
    assert tl.data.recall_accuracy(Constant(), batch) < 0.3


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(batch_size=2, n_pairs=9, n_keys=8), ValueError, "n_pairs=9 distinct keys need n_keys >= n_pairs"),
        (dict(batch_size=2, n_pairs=4, n_queries=5), ValueError, "n_queries=5"),
        (dict(batch_size=0, n_pairs=4), ValueError, "batch_size"),
        (dict(batch_size=2, n_pairs=2.5), TypeError, "n_pairs"),
    ],
)
def test_bad_settings_are_refused_by_name(kwargs, error, match):
    with pytest.raises(error, match=match):
        tl.data.recall_batch(**kwargs)
    with pytest.raises(TypeError, match="RecallBatch"):
        tl.data.recall_accuracy(torch.nn.Identity(), (1, 2, 3))
