"""Scaled dot-product attention (``ml.scaled_dot_product_attention``) and the attention modules
(``nn.MultiHeadAttention``, ``nn.TransformerEncoderLayer``): values against NumPy (and PyTorch where
installed), the hand-written vjps against finite differences, merged calls (with masks of their
own) equal to calls on their own, and errors that name the op."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from batching_check import assert_close, gradients_of, merged_and_alone
from op_cases import predict, value_of

import monadl as ml
from monadl import ArrayLayer, ArrayWeight, FloatLayer, nn
from monadl.do.graph import OP
from monadl.dsl.ops.attention import self_attention

F64 = np.ndarray[Any, np.dtype[np.float64]]


def uniform(seed: int, *shape: int) -> F64:
    return np.random.default_rng(seed).uniform(-1.5, 1.5, shape)


def reference(
    q: Any, k: Any, v: Any, mask: Any = None, causal: bool = False, heads: int = 1, scale: float | None = None
) -> Any:
    """Attention in plain NumPy, head by head."""
    d = q.shape[-1] // heads
    outs = []
    for h in range(heads):
        qh, kh, vh = (
            a[..., h * (a.shape[-1] // heads) : (h + 1) * (a.shape[-1] // heads)] for a in (q, k, v)
        )
        s = qh @ np.swapaxes(kh, -1, -2) * (d**-0.5 if scale is None else scale)
        if causal:
            s = np.where(np.tril(np.ones(s.shape[-2:], dtype=bool)), s, -np.inf)
        if mask is not None:
            s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
        p = np.exp(s - s.max(-1, keepdims=True))
        outs.append(p / p.sum(-1, keepdims=True) @ vh)
    return np.concatenate(outs, axis=-1)


MASK = np.random.default_rng(0).uniform(size=(3, 5)) < 0.6
MASK[:, 0] = True  # every query keeps a key
CROSS_MASK = np.random.default_rng(2).uniform(size=(6, 3)) < 0.6  # 6 queries, 3 keys
CROSS_MASK[:, 1] = True

CASES: dict[str, dict[str, Any]] = {
    "plain": {"shapes": ((3, 4), (5, 4), (5, 2))},
    "batched": {"shapes": ((2, 3, 4), (2, 5, 4), (2, 5, 6))},
    "broadcast keys": {"shapes": ((2, 3, 4), (5, 4), (5, 6))},
    "boolean mask": {"shapes": ((2, 3, 4), (2, 5, 4), (2, 5, 6)), "mask": MASK},
    "additive mask": {"shapes": ((2, 3, 4), (2, 5, 4), (2, 5, 6)), "mask": uniform(1, 2, 3, 5)},
    "causal": {"shapes": ((2, 4, 4), (2, 4, 4), (2, 4, 3)), "causal": True},
    "causal, more keys": {"shapes": ((3, 4), (5, 4), (5, 3)), "causal": True},
    "heads": {"shapes": ((2, 3, 8), (2, 5, 8), (2, 5, 6)), "heads": 2},
    "heads, masked per batch": {
        "shapes": ((2, 3, 8), (2, 5, 8), (2, 5, 4)),
        "heads": 2,
        "mask": np.stack([MASK, MASK[::-1]]),
    },
    "heads, causal, scale": {"shapes": ((4, 6), (4, 6), (4, 3)), "heads": 3, "causal": True, "scale": 0.3},
    "cross: more queries than keys, (Lq, Lk) mask, heads": {
        "shapes": ((2, 6, 8), (2, 3, 8), (2, 3, 4)),
        "heads": 2,
        "mask": CROSS_MASK,
    },
    "cross: more queries than keys, causal": {"shapes": ((2, 5, 4), (3, 4), (3, 6)), "causal": True},
}


def operands(case: dict[str, Any]) -> list[F64]:
    return [uniform(10 + i, *s) for i, s in enumerate(case["shapes"])]


def options(case: dict[str, Any]) -> dict[str, Any]:
    return {key: case[key] for key in ("causal", "heads", "scale") if key in case}


def assert_attention_merges(loss: Callable[[], FloatLayer]) -> None:
    """``loss()``'s three attention calls merge, and its value and gradients are those of the calls
    run alone."""
    merged, alone = merged_and_alone(loss)
    name = "scaled_dot_product_attention"
    assert merged.stats.kinds[name] < alone.stats.kinds[name] == 3


@pytest.mark.parametrize("name", list(CASES))
def test_the_values_are_numpys(name: str) -> None:
    case = CASES[name]
    q, k, v = operands(case)
    out = predict(ml.scaled_dot_product_attention(q, k, v, case.get("mask"), **options(case)))
    np.testing.assert_allclose(
        out, reference(q, k, v, case.get("mask"), **options(case)), rtol=1e-12, atol=1e-12
    )


@pytest.mark.parametrize("name", list(CASES))
def test_the_gradients_are_finite_differences(name: str) -> None:
    case = CASES[name]
    q, k, v = operands(case)
    out_shape = reference(q, k, v, case.get("mask"), **options(case)).shape
    probe = uniform(20, *out_shape)

    def loss(q: ArrayWeight, k: ArrayWeight, v: ArrayWeight) -> FloatLayer:
        return ml.sum(ml.scaled_dot_product_attention(q, k, v, case.get("mask"), **options(case)) * probe)

    ml.check_gradients(loss, q, k, v)


def test_the_values_and_gradients_are_pytorchs() -> None:
    torch = pytest.importorskip("torch")
    q, k, v = uniform(30, 2, 2, 3, 4), uniform(31, 2, 2, 5, 4), uniform(32, 2, 2, 5, 6)
    probe = uniform(33, 2, 2, 3, 6)
    weights = [ArrayWeight(a) for a in (q, k, v)]
    attended = ml.scaled_dot_product_attention(weights[0], weights[1], weights[2], MASK)
    value, gradients = ml.compute_gradients(ml.sum(attended * probe))
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=torch.tensor(MASK))
    loss = (out * torch.tensor(probe)).sum()
    loss.backward()
    assert value == pytest.approx(loss.item(), rel=1e-12)
    for weight, t in zip(weights, (tq, tk, tv), strict=True):
        np.testing.assert_allclose(gradients[weight], t.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("additive", [False, True])
@pytest.mark.parametrize("packed", [False, True])
def test_a_query_that_keeps_no_key_gives_zero_and_no_delta(additive: bool, packed: bool) -> None:
    """As PyTorch's: the row of a query whose every key is masked is 0 (not the softmax's 0 / 0),
    and it passes no delta to q, k or v; the other rows are as without it."""
    keep = np.ones((3, 3), dtype=bool)
    keep[1] = False
    mask: Any = np.where(keep, 0.0, -np.inf) if additive else keep
    qkv = uniform(1, 3, 6)
    probe = uniform(4, 3, 2)

    def attend(x: Any) -> ArrayLayer:
        if packed:
            return self_attention(x, mask)
        return ml.scaled_dot_product_attention(x[:, 0:2], x[:, 2:4], x[:, 4:6], mask)

    out = predict(attend(qkv))
    np.testing.assert_array_equal(out[1], [0.0, 0.0])
    rows = [0, 2]
    np.testing.assert_allclose(out[rows], reference(qkv[:, 0:2], qkv[:, 2:4], qkv[:, 4:6])[rows], rtol=1e-12)
    (g,) = ml.check_gradients(lambda w: ml.sum(attend(w) * probe), qkv)
    assert isinstance(g, np.ndarray)
    np.testing.assert_array_equal(g[1, 0:2], [0.0, 0.0])  # the query of no key gets no delta
    assert np.isfinite(g).all()


def test_a_query_that_keeps_no_key_is_pytorchs() -> None:
    torch = pytest.importorskip("torch")
    q, k, v = uniform(5, 2, 4, 2), uniform(6, 2, 3, 2), uniform(7, 2, 3, 3)
    keep = np.random.default_rng(8).uniform(size=(2, 4, 3)) < 0.5
    keep[0, 1] = keep[1, 3] = False
    probe = uniform(9, 2, 4, 3)
    weights = [ArrayWeight(a) for a in (q, k, v)]
    attended = ml.scaled_dot_product_attention(weights[0], weights[1], weights[2], keep)
    value, gradients = ml.compute_gradients(ml.sum(attended * probe))
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=torch.tensor(keep))
    loss = (out * torch.tensor(probe)).sum()
    loss.backward()
    assert value == pytest.approx(loss.item(), rel=1e-12)
    for weight, t in zip(weights, (tq, tk, tv), strict=True):
        np.testing.assert_allclose(gradients[weight], t.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_a_training_step_with_a_query_that_keeps_no_key_succeeds() -> None:
    """A padded query (its row of the mask all False) no longer makes the loss NaN: the step
    succeeds and changes the weights by finite amounts."""
    rng = np.random.default_rng(10)
    layer = nn.MultiHeadAttention.new(4, 2, seed=0, dtype=np.float64)
    x = rng.uniform(-1.0, 1.0, (2, 3, 4))
    keep = np.ones((2, 3, 3), dtype=bool)
    keep[1, 2] = False  # the last query of the second sequence keeps no key
    before = [np.array(w.data) for w in ml.weights_of(layer).values()]
    step = ml.sum(layer(x, mask=keep) * rng.uniform(-1.0, 1.0, (2, 3, 4))).train_blocking(ml.SGD(0.1))
    assert np.isfinite(value_of(step))
    after = [np.array(w.data) for w in ml.weights_of(layer).values()]
    assert all(np.isfinite(a).all() for a in after)
    assert any(not np.array_equal(a, b) for a, b in zip(after, before, strict=True))


@pytest.mark.parametrize("masked", [False, True])
def test_merged_calls_equal_calls_on_their_own(masked: bool) -> None:
    """Sequences attended to one by one, each with a mask of its own (of lower rank than the scores,
    which the merged call pads): merged into one call, values and gradients equal."""

    def loss() -> FloatLayer:
        weights = [ArrayWeight(uniform(40 + k, 2, 5, 8)) for k in range(3)]
        terms = []
        for k, x in enumerate(weights):
            mask = (
                (np.random.default_rng(k).uniform(size=(5, 5)) < 0.5) | np.eye(5, dtype=bool)
                if masked
                else None
            )
            out = ml.scaled_dot_product_attention(x * 1.0, x * 2.0, x * 0.5, mask, heads=2, causal=not masked)
            terms.append(ml.sum(out * uniform(50 + k, 2, 5, 8)))
        return ml.add_n(terms)

    assert_attention_merges(loss)


def test_masked_and_unmasked_calls_merge_apart() -> None:
    """Calls with a mask and calls without are one op whose mask is a parameter of the call: the
    unmasked calls merge with each other and the masked ones with theirs (masks stacked), never
    across; values and gradients are the calls' alone, and so are a replay's (the structure's
    second run, on other masks)."""

    def loss(seed: int) -> FloatLayer:
        weights = [ArrayWeight(uniform(70 + k, 2, 5, 8)) for k in range(4)]
        terms = []
        for k, x in enumerate(weights):
            keep = (np.random.default_rng(seed + k).uniform(size=(5, 5)) < 0.5) | np.eye(5, dtype=bool)
            mask = keep if k % 2 else None
            out = ml.scaled_dot_product_attention(x * 1.0, x * 2.0, x * 0.5, mask, heads=2)
            terms.append(ml.sum(out * uniform(80 + k, 2, 5, 8)))
        return ml.add_n(terms)

    name = "scaled_dot_product_attention"
    graph = loss(0).graph
    assert graph is not None
    ops = [graph.objs[r] for r, tag in enumerate(graph.tags) if tag == OP and graph.objs[r].name == name]
    assert len(ops) == 4 and all(op is ops[0] for op in ops)  # one primitive, masked or not
    merged, alone = merged_and_alone(lambda: loss(0))
    assert merged.stats.kinds[name] == 2 and alone.stats.kinds[name] == 4
    executor, interpreter = ml.Executor(), ml.Executor(replay=False)
    for seed in (0, 10):  # the second run replays the first's program, on masks of other values
        replayed = ml.compute_gradients(loss(seed), executor=executor)
        interpreted = ml.compute_gradients(loss(seed), executor=interpreter)
        assert_close(replayed[0], interpreted[0], "loss")
        for a, b in zip(replayed[1].values(), interpreted[1].values(), strict=True):
            assert_close(a, b, "gradient")
    assert executor.stats.replayed == 1 and executor.last_stats.kinds[name] == 2


def test_calls_of_different_ranks_do_not_merge() -> None:
    """A call whose keys broadcast (fewer axes than the queries) runs alone: stacked, its rows would
    meet the queries' batch axis."""
    k, v = ArrayWeight(uniform(60, 5, 4)), ArrayWeight(uniform(61, 5, 4))
    qs = [ArrayWeight(uniform(62 + j, 2, 3, 4)) for j in range(2)]
    loss = ml.add_n([ml.sum(ml.scaled_dot_product_attention(q * 1.0, k, v)) for q in qs])
    merged, alone = gradients_of(loss, True), gradients_of(loss, False)
    assert merged.stats.kinds["scaled_dot_product_attention"] == 2
    for a, b in zip(merged.gradients.values(), alone.gradients.values(), strict=True):
        assert_close(a, b, "gradient")


def test_errors_name_the_op() -> None:
    name = "scaled_dot_product_attention"
    q, k, v = uniform(1, 3, 4), uniform(2, 5, 4), uniform(3, 5, 2)
    with pytest.raises(ml.ShapeError, match=f"{name}: q .3, 4., k .5, 3., v .5, 2. do not fit"):
        predict(ml.scaled_dot_product_attention(q, uniform(2, 5, 3), v))
    with pytest.raises(ml.ShapeError, match=f"{name}: 3 heads do not divide"):
        predict(ml.scaled_dot_product_attention(q, k, v, heads=3))
    with pytest.raises(ml.ShapeError, match=rf"{name}: mask of shape \(4, 5\) does not broadcast"):
        predict(ml.scaled_dot_product_attention(q, k, v, np.ones((4, 5), dtype=bool)))
    with pytest.raises(ml.ShapeError, match=f"{name}: q, k and v must be arrays of 2 dimensions"):
        predict(ml.scaled_dot_product_attention(uniform(1, 4), k, v))
    with pytest.raises(TypeError, match=f"{name}: mask must be boolean or floating-point"):
        ml.scaled_dot_product_attention(q, k, v, np.ones((3, 5), dtype=np.int64))
    with pytest.raises(ValueError, match=f"{name}: heads must be positive"):
        ml.scaled_dot_product_attention(q, k, v, heads=0)
    with pytest.raises(TypeError, match=f"{name}: causal must be a bool"):
        ml.scaled_dot_product_attention(q, k, v, causal=1)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ modules


@pytest.mark.parametrize("norm_first", [False, True])
def test_the_encoder_layer_is_pytorchs(norm_first: bool) -> None:
    torch = pytest.importorskip("torch")
    from monadl.bench.models_torch import encoder_layer  # PyTorch's layer with monadl's weights

    rng = np.random.default_rng(3)
    layer = nn.TransformerEncoderLayer.new(8, 2, 12, norm_first=norm_first, seed=rng, dtype=np.float64)
    for w in layer.weights().values():  # biases and norms away from their initial 0 and 1
        data = np.asarray(w.data)
        w.data = data + rng.uniform(-0.2, 0.2, data.shape)
    x = uniform(70, 2, 5, 8)
    params = {name: np.asarray(w.data) for name, w in layer.weights().items()}
    t = encoder_layer(params, "", layer.attention.heads, norm_first=norm_first).eval()
    mask = np.triu(np.full((5, 5), -np.inf), 1)
    with torch.no_grad():
        expected = t(torch.tensor(x), src_mask=torch.tensor(mask), is_causal=True).numpy()
    np.testing.assert_allclose(predict(layer(x, causal=True)), expected, rtol=1e-10, atol=1e-12)
    with torch.no_grad():
        expected = t(torch.tensor(x), src_mask=torch.tensor(~MASK[:, :5].repeat(2, 0)[:5])).numpy()
    np.testing.assert_allclose(
        predict(layer(x, MASK[:, :5].repeat(2, 0)[:5])), expected, rtol=1e-10, atol=1e-12
    )


@pytest.mark.parametrize("norm_first", [False, True])
def test_the_encoder_layer_gradients_are_finite_differences(norm_first: bool) -> None:
    layer = nn.TransformerEncoderLayer.new(4, 2, 6, norm_first=norm_first, seed=5)
    names = list(layer.weights())
    probe = uniform(80, 3, 4)

    def through(x: ArrayWeight, *weights: ArrayWeight) -> FloatLayer:
        built = nn.TransformerEncoderLayer(
            nn.MultiHeadAttention(nn.Linear(weights[0], weights[1]), nn.Linear(weights[2], weights[3]), 2),
            nn.LayerNorm(weights[4], weights[5]),
            nn.LayerNorm(weights[6], weights[7]),
            nn.Linear(weights[8], weights[9]),
            nn.Linear(weights[10], weights[11]),
            ml.relu,
            norm_first,
        )
        return ml.sum(built(x, causal=True) * probe)

    assert names == [
        "attention.qkv.w",
        "attention.qkv.b",
        "attention.out.w",
        "attention.out.b",
        "norm1.weight",
        "norm1.bias",
        "norm2.weight",
        "norm2.bias",
        "ff1.w",
        "ff1.b",
        "ff2.w",
        "ff2.b",
    ]
    rng = np.random.default_rng(6)
    values = [np.asarray(w.data) for w in layer.weights().values()]
    values = [a + rng.uniform(-0.3, 0.3, a.shape) for a in values]
    ml.check_gradients(through, uniform(81, 3, 4), *values)


def test_encoder_layers_merge_across_sequences() -> None:
    """One layer applied to several sequences of one length: its ops merge, the results equal."""

    def loss() -> FloatLayer:
        layer = nn.TransformerEncoderLayer.new(8, 2, 16, norm_first=True, seed=9, dtype=np.float64)
        xs = [uniform(90 + k, 6, 8) for k in range(3)]
        return ml.add_n([ml.sum(layer(x, causal=True) * uniform(95 + k, 6, 8)) for k, x in enumerate(xs)])

    merged, _ = merged_and_alone(loss)
    assert merged.stats.merged > 0
    assert merged.stats.kinds["self_attention"] == 1


def test_multi_head_attention_checks_its_shapes() -> None:
    mha = nn.MultiHeadAttention.new(8, 4, dtype=np.float32)
    assert list(mha.weights()) == ["qkv.w", "qkv.b", "out.w", "out.b"]
    assert mha.features == 8 and mha.qkv.w.data.dtype == np.float32
    with pytest.raises(ValueError, match="MultiHeadAttention: 3 heads do not divide 8 features"):
        nn.MultiHeadAttention.new(8, 3)
    with pytest.raises(ValueError, match="MultiHeadAttention: qkv of shape"):
        nn.MultiHeadAttention(nn.Linear.new(8, 8), nn.Linear.new(8, 8), 2)


# ------------------------------------------------------------------ packed q, k, v (the modules')


@pytest.mark.parametrize("masked", [False, True])
def test_self_attention_is_attention_of_its_thirds(masked: bool) -> None:
    qkv = uniform(100, 2, 5, 12)
    mask = (
        (np.random.default_rng(1).uniform(size=(2, 5, 5)) < 0.5) | np.eye(5, dtype=bool) if masked else None
    )
    q, k, v = qkv[..., :4], qkv[..., 4:8], qkv[..., 8:]
    expected = reference(q, k, v, mask, causal=not masked, heads=2)
    np.testing.assert_allclose(
        predict(self_attention(qkv, mask, causal=not masked, heads=2)), expected, rtol=1e-12, atol=1e-12
    )
    probe = uniform(101, 2, 5, 4)
    ml.check_gradients(lambda x: ml.sum(self_attention(x, mask, causal=not masked, heads=2) * probe), qkv)


def test_self_attention_calls_merge_with_masks_of_their_own() -> None:
    def loss() -> FloatLayer:
        terms = []
        for k in range(3):
            x = ArrayWeight(uniform(110 + k, 4, 6))
            mask = (np.random.default_rng(k).uniform(size=(4, 4)) < 0.5) | np.eye(4, dtype=bool)
            terms.append(ml.sum(self_attention(x * 1.0, mask, heads=2) * uniform(120 + k, 4, 2)))
        return ml.add_n(terms)

    merged, alone = merged_and_alone(loss)
    assert merged.stats.kinds["self_attention"] < alone.stats.kinds["self_attention"] == 3


def test_self_attention_errors_name_it() -> None:
    with pytest.raises(ml.ShapeError, match="self_attention: qkv must have 2 dimensions at least"):
        predict(self_attention(uniform(1, 3, 4)))


# ----------------------------------------------------------------------------------- cross-attention


def cross_module(kdim: int | None, vdim: int | None, seed: int = 3) -> nn.MultiHeadAttention:
    """A float64 module of 8 features and 2 heads, its weights (biases too) away from their draw."""
    mha = nn.MultiHeadAttention.new(8, 2, kdim=kdim, vdim=vdim, seed=seed, dtype=np.float64)
    rng = np.random.default_rng(seed)
    for w in mha.weights().values():
        data = np.asarray(w.data)
        w.data = data + rng.uniform(-0.2, 0.2, data.shape)
    return mha


def torch_attention(mha: nn.MultiHeadAttention, torch: Any) -> Any:
    """PyTorch's ``nn.MultiheadAttention`` with ``mha``'s weights: packed (``in_proj_weight``) or,
    with a ``kdim`` or ``vdim`` of their own, one projection each."""
    t = torch.nn.MultiheadAttention(
        mha.features,
        mha.heads,
        kdim=mha.kdim,
        vdim=mha.vdim,
        batch_first=True,
        dtype=torch.float64,
    )

    def tensor(w: Any) -> Any:
        return torch.tensor(np.asarray(w.data))

    with torch.no_grad():
        if mha.k is None or mha.v is None:
            t.in_proj_weight.copy_(tensor(mha.qkv.w).T)
            t.in_proj_bias.copy_(tensor(mha.qkv.b))
        else:
            t.q_proj_weight.copy_(tensor(mha.qkv.w).T)
            t.k_proj_weight.copy_(tensor(mha.k.w).T)
            t.v_proj_weight.copy_(tensor(mha.v.w).T)
            t.in_proj_bias.copy_(torch.cat([tensor(mha.qkv.b), tensor(mha.k.b), tensor(mha.v.b)]))
        t.out_proj.weight.copy_(tensor(mha.out.w).T)
        t.out_proj.bias.copy_(tensor(mha.out.b))
    return t


DIMS = [(None, None), (6, 10)]


@pytest.mark.parametrize(("kdim", "vdim"), DIMS)
@pytest.mark.parametrize("masking", ["none", "boolean", "causal"])
def test_cross_attention_values_and_gradients_are_pytorchs(
    kdim: int | None, vdim: int | None, masking: str
) -> None:
    """Queries of length 3 attending to keys and values of length 5, as PyTorch's layer does with
    the same weights: values, and gradients of the three inputs and of every weight."""
    torch = pytest.importorskip("torch")
    mha = cross_module(kdim, vdim)
    query, key, value = uniform(130, 2, 3, 8), uniform(131, 2, 5, mha.kdim), uniform(132, 2, 5, mha.vdim)
    probe = uniform(133, 2, 3, 8)
    mask = MASK if masking == "boolean" else None
    causal = masking == "causal"
    inputs = [ArrayWeight(a) for a in (query, key, value)]
    out = mha(inputs[0], inputs[1], inputs[2], mask, causal=causal)
    loss, gradients = ml.compute_gradients(ml.sum(out * probe))

    t = torch_attention(mha, torch)
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (query, key, value))
    if masking == "boolean":
        t_out, _ = t(tq, tk, tv, attn_mask=torch.tensor(~MASK), need_weights=False)  # True: masked out
    elif causal:
        drop = torch.tensor(np.triu(np.ones((3, 5), dtype=bool), 1))
        t_out, _ = t(tq, tk, tv, attn_mask=drop, need_weights=False)
    else:
        t_out, _ = t(tq, tk, tv, need_weights=False)
    t_loss = (t_out * torch.tensor(probe)).sum()
    t_loss.backward()
    assert loss == pytest.approx(t_loss.item(), rel=1e-12)
    for weight, tensor in zip(inputs, (tq, tk, tv), strict=True):
        np.testing.assert_allclose(gradients[weight], tensor.grad.numpy(), rtol=1e-9, atol=1e-12)
    if mha.k is None or mha.v is None:
        theirs = {"qkv.w": t.in_proj_weight.grad.T, "qkv.b": t.in_proj_bias.grad}
    else:
        e = mha.features
        theirs = {
            "qkv.w": t.q_proj_weight.grad.T,
            "qkv.b": t.in_proj_bias.grad[:e],
            "k.w": t.k_proj_weight.grad.T,
            "k.b": t.in_proj_bias.grad[e : 2 * e],
            "v.w": t.v_proj_weight.grad.T,
            "v.b": t.in_proj_bias.grad[2 * e :],
        }
    theirs |= {"out.w": t.out_proj.weight.grad.T, "out.b": t.out_proj.bias.grad}
    assert set(theirs) == set(mha.weights())
    for name, w in mha.weights().items():
        np.testing.assert_allclose(gradients[w], theirs[name].numpy(), rtol=1e-9, atol=1e-12, err_msg=name)


def rebuilt(mha: nn.MultiHeadAttention, weights: tuple[ArrayWeight, ...]) -> nn.MultiHeadAttention:
    """A module of ``mha``'s layout on ``weights``, in the order of ``mha.weights()``."""
    linears = [nn.Linear(weights[i], weights[i + 1]) for i in range(0, len(weights), 2)]
    return nn.MultiHeadAttention(linears[0], linears[1], mha.heads, *linears[2:])


@pytest.mark.parametrize(("kdim", "vdim"), DIMS)
def test_cross_attention_gradients_are_finite_differences(kdim: int | None, vdim: int | None) -> None:
    """Lq (2) other than Lk (4), an additive (Lq, Lk) mask, keys and values that are one array (as a
    decoder's memory) where their features agree: every input's and weight's gradient."""
    mha = cross_module(kdim, vdim, seed=4)
    names = list(mha.weights())
    values = [np.asarray(w.data) for w in mha.weights().values()]
    bias = uniform(140, 2, 4)
    probe = uniform(141, 3, 2, 8)
    memory = uniform(142, 3, 4, mha.kdim)

    if kdim is None:

        def loss(query: ArrayWeight, memory: ArrayWeight, *weights: ArrayWeight) -> FloatLayer:
            return ml.sum(rebuilt(mha, weights)(query, memory, mask=bias) * probe)

        ml.check_gradients(loss, uniform(143, 3, 2, 8), memory, *values)
    else:

        def loss3(
            query: ArrayWeight, key: ArrayWeight, value: ArrayWeight, *weights: ArrayWeight
        ) -> FloatLayer:
            return ml.sum(rebuilt(mha, weights)(query, key, value, bias) * probe)

        ml.check_gradients(loss3, uniform(143, 3, 2, 8), memory, uniform(144, 3, 4, mha.vdim), *values)
    assert names[:4] == ["qkv.w", "qkv.b", "out.w", "out.b"]


@pytest.mark.parametrize(("kdim", "vdim"), DIMS)
def test_a_batch_equals_its_sequences_one_by_one(kdim: int | None, vdim: int | None) -> None:
    """A batch of 3 (one (Lq, Lk) mask for all) gives each sequence's result alone; and calls on the
    sequences, merged by dynamic batching, give the same values and gradients as run one by one."""
    mha = cross_module(kdim, vdim, seed=5)
    query, key, value = uniform(150, 3, 4, 8), uniform(151, 3, 6, mha.kdim), uniform(152, 3, 6, mha.vdim)
    keep = (np.random.default_rng(0).uniform(size=(4, 6)) < 0.6) | np.eye(4, 6, dtype=bool)
    batched = predict(mha(query, key, value, keep))
    for b in range(3):
        alone = predict(mha(query[b], key[b], value[b], keep))
        np.testing.assert_allclose(batched[b], alone, rtol=1e-12, atol=1e-12)

    def loss() -> FloatLayer:
        weights = [ArrayWeight(a) for a in (query, key, value)]
        return ml.add_n(
            [
                ml.sum(mha(weights[0][b], weights[1][b], weights[2][b], keep) * uniform(153 + b, 4, 8))
                for b in range(3)
            ]
        )

    assert_attention_merges(loss)


def test_self_attention_keeps_its_fused_op() -> None:
    """``mha(x)`` and ``mha(x, x, x)`` run the fused ``self_attention``; keys equal to the queries
    but another array run the projections apart, with the same values."""
    mha = cross_module(None, None, seed=6)
    x = uniform(160, 2, 5, 8)
    ex = ml.Executor(batching=False)
    values = {}
    calls: dict[str, Callable[[], ArrayLayer]] = {
        "x": lambda: mha(x, causal=True),
        "x, x, x": lambda: mha(x, x, x, causal=True),
        "x, copy": lambda: mha(x, x.copy(), causal=True),
    }
    for name, call in calls.items():
        values[name] = call().predict_blocking(executor=ex).unwrap()
        fused = name != "x, copy"
        assert ex.last_stats.kinds.get("self_attention", 0) == (1 if fused else 0), name
        assert ex.last_stats.kinds.get("scaled_dot_product_attention", 0) == (0 if fused else 1), name
    np.testing.assert_array_equal(values["x"], values["x, x, x"])
    np.testing.assert_allclose(values["x, copy"], values["x"], rtol=1e-12, atol=1e-12)


def test_cross_attention_modules_check_their_shapes() -> None:
    mha = nn.MultiHeadAttention.new(8, 2, kdim=6, vdim=10)
    assert list(mha.weights()) == ["qkv.w", "qkv.b", "out.w", "out.b", "k.w", "k.b", "v.w", "v.b"]
    assert (mha.features, mha.kdim, mha.vdim) == (8, 6, 10)
    assert (mha.qkv.w.data.shape, mha.k.w.data.shape, mha.v.w.data.shape) == ((8, 8), (6, 8), (10, 8))  # type: ignore[union-attr]
    assert nn.MultiHeadAttention.new(8, 2, kdim=8).k is None  # kdim and vdim of features: packed
    with pytest.raises(ValueError, match="MultiHeadAttention: k and v are both projections or both None"):
        nn.MultiHeadAttention(nn.Linear.new(8, 8), nn.Linear.new(8, 8), 2, nn.Linear.new(6, 8))
    with pytest.raises(ValueError, match=r"MultiHeadAttention: projections q \(8, 8\), k \(6, 4\)"):
        nn.MultiHeadAttention(
            nn.Linear.new(8, 8), nn.Linear.new(8, 8), 2, nn.Linear.new(6, 4), nn.Linear.new(10, 8)
        )
    query = np.ones((3, 8), dtype=np.float32)
    with pytest.raises(ml.ShapeError, match="linear"):  # keys of 8 features for a kdim of 6
        predict(mha(query, np.ones((5, 8), dtype=np.float32), np.ones((5, 10), dtype=np.float32)))
    with pytest.raises(TypeError, match="MultiHeadAttention: key is a boolean array: pass a mask as mask="):
        nn.MultiHeadAttention.new(8, 2)(query, np.ones((3, 3), dtype=bool))


def test_cross_attention_reads_the_weights_data_of_each_run() -> None:
    """Training steps change the packed ``qkv`` the cross-attention's projections are sliced from:
    each step reads the weights as they are (as a module built afresh on them does)."""
    mha = cross_module(None, None, seed=7)
    query, memory = uniform(170, 3, 8), uniform(171, 5, 8)
    before = predict(mha(query, memory))
    for _ in range(3):
        assert ml.sum(mha(query, memory) ** 2.0).train_blocking(ml.SGD(0.1)).unwrap() > 0.0
    after = predict(mha(query, memory))
    fresh = nn.MultiHeadAttention(mha.qkv, mha.out, mha.heads)
    np.testing.assert_array_equal(after, predict(fresh(query, memory)))
    assert np.abs(after - before).max() > 1e-3
