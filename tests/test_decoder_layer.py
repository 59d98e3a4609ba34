"""``nn.TransformerDecoderLayer``: equal to PyTorch's with the weights copied (post-norm and
pre-norm, causal self-attention, a memory mask, ReLU and GELU), its gradients against finite
differences, sequences one by one merged equal to the calls alone and to one call on the batch,
and its dropout layers, used in training steps only."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from batching_check import merged_and_alone
from op_cases import predict

import monadl as ml
from monadl import ArrayWeight, FloatLayer, nn


def uniform(seed: int, *shape: int) -> Any:
    return np.random.default_rng(seed).uniform(-1.0, 1.0, shape)


def perturbed(layer: nn.TransformerDecoderLayer, seed: int) -> nn.TransformerDecoderLayer:
    """``layer`` with its weights moved off their initial values (biases 0, norms' scales 1)."""
    rng = np.random.default_rng(seed)
    for w in layer.weights().values():
        data = np.asarray(w.data)
        w.data = data + rng.uniform(-0.3, 0.3, data.shape)
    return layer


def torch_copy(torch: Any, layer: nn.TransformerDecoderLayer, activation: Any = "relu") -> Any:
    """PyTorch's layer (batch first, float64, in evaluation mode) with ``layer``'s weights copied
    by hand: PyTorch's linear weights are monadl's transposed, its ``in_proj`` monadl's ``qkv``."""
    theirs = torch.nn.TransformerDecoderLayer(
        layer.features,
        layer.attention.heads,
        layer.ff1.outputs,
        batch_first=True,
        norm_first=layer.norm_first,
        activation=activation,
    ).double()

    def data(w: ArrayWeight | None) -> Any:
        assert w is not None
        return np.asarray(w.data)

    def linear(mine: nn.Linear, t: Any) -> list[tuple[Any, Any]]:
        return [(t.weight, data(mine.w).T), (t.bias, data(mine.b))]

    def attention(mine: nn.MultiHeadAttention, t: Any) -> list[tuple[Any, Any]]:
        return [
            (t.in_proj_weight, data(mine.qkv.w).T),
            (t.in_proj_bias, data(mine.qkv.b)),
            *linear(mine.out, t.out_proj),
        ]

    pairs = [
        *attention(layer.attention, theirs.self_attn),
        *attention(layer.cross_attention, theirs.multihead_attn),
        *linear(layer.ff1, theirs.linear1),
        *linear(layer.ff2, theirs.linear2),
    ]
    for mine, t in ((layer.norm1, theirs.norm1), (layer.norm2, theirs.norm2), (layer.norm3, theirs.norm3)):
        pairs += [(t.weight, data(mine.weight)), (t.bias, data(mine.bias))]
    with torch.no_grad():
        for tensor, value in pairs:
            tensor.copy_(torch.tensor(np.asarray(value)))
    return theirs.eval()


@pytest.mark.parametrize("norm_first", [False, True])
def test_the_layer_is_pytorchs(norm_first: bool) -> None:
    torch = pytest.importorskip("torch")
    layer = perturbed(
        nn.TransformerDecoderLayer.new(8, 2, 12, norm_first=norm_first, seed=1, dtype=np.float64), 2
    )
    theirs = torch_copy(torch, layer)
    x, memory = uniform(3, 2, 5, 8), uniform(4, 2, 7, 8)
    keep = np.random.default_rng(5).uniform(size=(5, 7)) < 0.6
    keep[:, 0] = True  # (every query keeps a key: PyTorch's rows of none are NaN)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(5, dtype=torch.float64)
    with torch.no_grad():
        expected = theirs(
            torch.from_numpy(x), torch.from_numpy(memory), tgt_mask=causal, tgt_is_causal=True
        ).numpy()
        masked = theirs(
            torch.from_numpy(x),
            torch.from_numpy(memory),
            tgt_mask=causal,
            memory_mask=torch.from_numpy(~keep),
        ).numpy()
        free = theirs(torch.from_numpy(x), torch.from_numpy(memory)).numpy()
    np.testing.assert_allclose(predict(layer(x, memory)), expected, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(predict(layer(x, memory, memory_mask=keep)), masked, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(predict(layer(x, memory, causal=False)), free, rtol=1e-10, atol=1e-12)
    # a mask of the self-attention as well as the causal one: both apply
    extra = np.random.default_rng(6).uniform(size=(5, 5)) < 0.7
    np.fill_diagonal(extra, True)
    with torch.no_grad():
        both = theirs(
            torch.from_numpy(x),
            torch.from_numpy(memory),
            tgt_mask=torch.from_numpy(~(extra & np.tri(5, dtype=bool))),
        ).numpy()
    np.testing.assert_allclose(predict(layer(x, memory, extra)), both, rtol=1e-10, atol=1e-12)


def test_a_gelu_layer_is_pytorchs() -> None:
    """``ml.gelu`` is the tanh approximation: PyTorch's layer with ``gelu(approximate="tanh")``."""
    torch = pytest.importorskip("torch")
    layer = perturbed(
        nn.TransformerDecoderLayer.new(6, 3, 10, activation=ml.gelu, seed=7, dtype=np.float64), 8
    )
    theirs = torch_copy(torch, layer, lambda t: torch.nn.functional.gelu(t, approximate="tanh"))
    x, memory = uniform(9, 3, 4, 6), uniform(10, 3, 2, 6)
    with torch.no_grad():
        expected = theirs(
            torch.from_numpy(x),
            torch.from_numpy(memory),
            tgt_is_causal=True,
            tgt_mask=torch.nn.Transformer.generate_square_subsequent_mask(4, dtype=torch.float64),
        ).numpy()
    np.testing.assert_allclose(predict(layer(x, memory)), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("norm_first", [False, True])
def test_the_gradients_are_finite_differences(norm_first: bool) -> None:
    layer = perturbed(
        nn.TransformerDecoderLayer.new(
            4, 2, 6, dropout=0.0, norm_first=norm_first, seed=11, dtype=np.float64
        ),
        12,
    )
    names = list(layer.weights())
    assert names == [
        *(f"attention.{n}" for n in ("qkv.w", "qkv.b", "out.w", "out.b")),
        *(f"cross_attention.{n}" for n in ("qkv.w", "qkv.b", "out.w", "out.b")),
        *(f"norm{k}.{n}" for k in (1, 2, 3) for n in ("weight", "bias")),
        "ff1.w",
        "ff1.b",
        "ff2.w",
        "ff2.b",
    ]
    probe = uniform(13, 3, 4)
    keep = np.array([[1, 0], [0, 1], [1, 1]], dtype=bool)

    def through(x: ArrayWeight, memory: ArrayWeight, *w: ArrayWeight) -> FloatLayer:
        built = nn.TransformerDecoderLayer(
            nn.MultiHeadAttention(nn.Linear(w[0], w[1]), nn.Linear(w[2], w[3]), 2),
            nn.MultiHeadAttention(nn.Linear(w[4], w[5]), nn.Linear(w[6], w[7]), 2),
            nn.LayerNorm(w[8], w[9]),
            nn.LayerNorm(w[10], w[11]),
            nn.LayerNorm(w[12], w[13]),
            nn.Linear(w[14], w[15]),
            nn.Linear(w[16], w[17]),
            ml.tanh,
            norm_first,
        )
        return ml.sum(built(x, memory, memory_mask=keep) * probe)

    values = [np.asarray(w.data, dtype=np.float64) for w in layer.weights().values()]
    ml.check_gradients(through, uniform(14, 3, 4), uniform(15, 2, 4), *values)


def test_sequences_one_by_one_merge_and_equal_the_batch() -> None:
    """One layer on three (target, memory) pairs of one length each: its attention ops merge, the
    loss and gradients are those of the calls alone, and each output is its row of the batch's."""
    xs, memories = [uniform(20 + k, 5, 8) for k in range(3)], [uniform(30 + k, 6, 8) for k in range(3)]

    def loss() -> FloatLayer:
        layer = perturbed(nn.TransformerDecoderLayer.new(8, 2, 16, seed=16, dtype=np.float64), 17)
        return ml.add_n(
            [
                ml.sum(layer(ArrayWeight(x), m) * uniform(40 + k, 5, 8))
                for k, (x, m) in enumerate(zip(xs, memories, strict=True))
            ]
        )

    merged, alone = merged_and_alone(loss)
    assert merged.stats.kinds["self_attention"] == 1 and alone.stats.kinds["self_attention"] == 3
    assert merged.stats.kinds["scaled_dot_product_attention"] == 1
    layer = perturbed(nn.TransformerDecoderLayer.new(8, 2, 16, seed=16, dtype=np.float64), 17)
    batch = predict(layer(np.stack(xs), np.stack(memories)))
    for k in range(3):
        np.testing.assert_allclose(predict(layer(xs[k], memories[k])), batch[k], rtol=1e-12, atol=1e-12)


def test_dropout_acts_in_training_steps_only() -> None:
    layer = nn.TransformerDecoderLayer.new(8, 2, 16, dropout=0.5, seed=18, dtype=np.float64)
    assert all(
        isinstance(d, nn.Dropout) for d in (layer.dropout, layer.dropout1, layer.dropout2, layer.dropout3)
    )
    assert list(layer.buffers()) == [
        "dropout.generator",
        "dropout1.generator",
        "dropout2.generator",
        "dropout3.generator",
    ]
    x, memory = uniform(19, 2, 4, 8), uniform(20, 2, 3, 8)
    bare = nn.TransformerDecoderLayer(
        *(
            getattr(layer, f)
            for f in (
                "attention",
                "cross_attention",
                "norm1",
                "norm2",
                "norm3",
                "ff1",
                "ff2",
                "activation",
                "norm_first",
            )
        )
    )
    np.testing.assert_array_equal(
        predict(layer(x, memory)), predict(bare(x, memory))
    )  # a prediction drops nothing
    probe = uniform(21, 2, 4, 8)
    trained, _ = ml.compute_gradients(ml.sum(layer(x, memory) * probe))
    plain, _ = ml.compute_gradients(ml.sum(bare(x, memory) * probe))
    assert trained != pytest.approx(plain)
    none = nn.TransformerDecoderLayer.new(8, 2, 16, dropout=0.0, seed=18, dtype=np.float64)
    assert none.dropout is None and none.buffers() == {}
    for name, w in none.weights().items():  # the same weights, whatever the dropout: drawn first
        np.testing.assert_array_equal(w.data, layer.weights()[name].data)


def test_the_layer_checks_its_parts() -> None:
    with pytest.raises(
        ValueError,
        match="TransformerDecoderLayer: the self-attention has 8 features and the cross-attention 4",
    ):
        nn.TransformerDecoderLayer(
            nn.MultiHeadAttention.new(8, 2),
            nn.MultiHeadAttention.new(4, 2),
            nn.LayerNorm.new(8),
            nn.LayerNorm.new(8),
            nn.LayerNorm.new(8),
            nn.Linear.new(8, 16),
            nn.Linear.new(16, 8),
            ml.relu,
            False,
        )
