"""``monadl.interop``: PyTorch's ``state_dict`` into monadl's modules and back, in PyTorch's names and
layouts. Each module kind round-trips both ways, in float64 with tight tolerances: a PyTorch
module's weights loaded into the monadl one give its outputs; a monadl module trained a few steps,
exported and loaded into a PyTorch one (``strict=True``) gives the monadl module's outputs. The
safetensors path needs no PyTorch; a load that does not fit names the key and the shapes and
changes nothing."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import monadl as ml
from monadl import interop, nn
from monadl.interop import InteropError

RTOL, ATOL = 1e-10, 1e-12


def uniform(seed: int, *shape: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1.0, 1.0, shape)


def predict(layer: ml.ArrayLayer) -> np.ndarray:
    return np.asarray(ml.predict_blocking(layer).unwrap())


def values(model: object) -> dict[str, np.ndarray]:
    """Every weight's and buffer's value, by monadl's names."""
    found = {name: np.array(w.data) for name, w in ml.weights_of(model).items()}
    found.update({name: np.array(b.data) for name, b in ml.buffers_of(model).items() if hasattr(b, "data")})
    return found


# ----------------------------------------------------------------------------------- the module kinds


@dataclass(frozen=True)
class Case:
    """A monadl module and its PyTorch counterpart (of the same settings, float64), the inputs both
    run on, and how each runs (the monadl one as a layer, the PyTorch one as a NumPy array)."""

    mine: Callable[[int], Any]  # a seed -> the monadl module
    theirs: Callable[[Any], Any]  # torch -> the PyTorch module
    inputs: Callable[[], tuple[Any, ...]]
    run_mine: Callable[..., ml.ArrayLayer]
    run_theirs: Callable[..., Any]  # (torch, module, *inputs) -> a tensor


def call(module: Any, *inputs: Any) -> ml.ArrayLayer:
    result: ml.ArrayLayer = module(*inputs)
    return result


def torch_call(torch: Any, module: Any, *inputs: Any) -> Any:
    return module(*(torch.from_numpy(x) for x in inputs))


def sequence_outputs(module: nn.LSTM | nn.GRU, x: np.ndarray) -> ml.ArrayLayer:
    """Every step's output and every final ``h`` of a batch of equally long sequences, in one array
    (batch, length + layers * directions, features) as PyTorch's, the states padded to the width."""
    out = module([x[s] for s in range(x.shape[0])])
    rows = []
    for s, steps in enumerate(out.outputs):
        hs = [state[0] if isinstance(state, tuple) else state for state in out.states[s]]
        cs = [state[1] for state in out.states[s] if isinstance(state, tuple)]
        width = 2 * module.hidden if module.bidirectional else module.hidden
        finals = [ml.concatenate([h, h], axis=0) if width != module.hidden else h for h in [*hs, *cs]]
        rows.append(ml.stack([*steps, *finals]))
    return ml.stack(rows)


def torch_sequence_outputs(torch: Any, module: Any, x: np.ndarray) -> Any:
    outputs, state = module(torch.from_numpy(x))
    finals = list(state) if isinstance(state, tuple) else [state]
    width = outputs.shape[-1]
    padded = [f.repeat(1, 1, width // f.shape[-1]).transpose(0, 1) for f in finals]
    return torch.cat([outputs, *padded], dim=1)


def cell_outputs(module: nn.LSTMCell | nn.GRUCell, x: np.ndarray, h: np.ndarray) -> ml.ArrayLayer:
    if isinstance(module, nn.LSTMCell):
        h2, c2 = module(x, h, h * 0.5)
        return ml.concatenate([h2, c2], axis=-1)
    return module(x, h)


def torch_cell_outputs(torch: Any, module: Any, x: np.ndarray, h: np.ndarray) -> Any:
    if isinstance(module, torch.nn.LSTMCell):
        return torch.cat(
            module(torch.from_numpy(x), (torch.from_numpy(h), torch.from_numpy(h * 0.5))), dim=-1
        )
    return module(torch.from_numpy(x), torch.from_numpy(h))


def attention(module: nn.MultiHeadAttention, *inputs: Any) -> ml.ArrayLayer:
    return module(*inputs)


def torch_attention(torch: Any, module: Any, *inputs: np.ndarray) -> Any:
    tensors = [torch.from_numpy(x) for x in inputs]
    query, key, value = (tensors * 3)[:3] if len(tensors) == 1 else tensors
    return module(query, key, value, need_weights=False)[0]


def torch_encoder(torch: Any, module: Any, x: np.ndarray) -> Any:
    mask = torch.nn.Transformer.generate_square_subsequent_mask(x.shape[1], dtype=torch.float64)
    return module(torch.from_numpy(x), src_mask=mask, is_causal=True)


def torch_decoder(torch: Any, module: Any, x: np.ndarray, memory: np.ndarray) -> Any:
    mask = torch.nn.Transformer.generate_square_subsequent_mask(x.shape[1], dtype=torch.float64)
    return module(torch.from_numpy(x), torch.from_numpy(memory), tgt_mask=mask, tgt_is_causal=True)


F64 = np.float64

CASES: dict[str, Case] = {
    "Linear": Case(
        lambda s: nn.Linear.new(5, 3, seed=s, dtype=F64),
        lambda t: t.nn.Linear(5, 3),
        lambda: (uniform(1, 4, 5),),
        call,
        torch_call,
    ),
    "Linear-no-bias": Case(
        lambda s: nn.Linear.new(5, 3, seed=s, dtype=F64, bias=False),
        lambda t: t.nn.Linear(5, 3, bias=False),
        lambda: (uniform(1, 4, 5),),
        call,
        torch_call,
    ),
    "MLP": Case(
        lambda s: nn.MLP.new([5, 8, 6, 3], activation=ml.tanh, seed=s, dtype=F64),
        lambda t: t.nn.Sequential(
            t.nn.Linear(5, 8), t.nn.Tanh(), t.nn.Linear(8, 6), t.nn.Tanh(), t.nn.Linear(6, 3)
        ),
        lambda: (uniform(2, 4, 5),),
        call,
        torch_call,
    ),
    "Embedding": Case(
        lambda s: nn.Embedding.new(10, 4, seed=s, dtype=F64),
        lambda t: t.nn.Embedding(10, 4),
        lambda: (np.array([[1, 3, 3], [9, 0, 2]]),),
        call,
        torch_call,
    ),
    "Conv1d": Case(
        lambda s: nn.Conv1d.new(4, 6, 3, stride=2, padding=1, groups=2, seed=s, dtype=F64),
        lambda t: t.nn.Conv1d(4, 6, 3, stride=2, padding=1, groups=2),
        lambda: (uniform(3, 2, 4, 9),),
        call,
        torch_call,
    ),
    "Conv2d": Case(
        lambda s: nn.Conv2d.new(3, 4, (3, 2), padding=1, dilation=(1, 2), seed=s, dtype=F64),
        lambda t: t.nn.Conv2d(3, 4, (3, 2), padding=1, dilation=(1, 2)),
        lambda: (uniform(4, 2, 3, 6, 7),),
        call,
        torch_call,
    ),
    "BatchNorm1d": Case(
        lambda s: nn.BatchNorm1d.new(4, momentum=0.3, dtype=F64),
        lambda t: t.nn.BatchNorm1d(4, momentum=0.3),
        lambda: (uniform(5, 6, 4, 3),),
        call,
        torch_call,
    ),
    "BatchNorm2d": Case(
        lambda s: nn.BatchNorm2d.new(3, eps=1e-3, dtype=F64),
        lambda t: t.nn.BatchNorm2d(3, eps=1e-3),
        lambda: (uniform(6, 2, 3, 4, 5),),
        call,
        torch_call,
    ),
    "LayerNorm": Case(
        lambda s: nn.LayerNorm.new(6, eps=1e-4, dtype=F64),
        lambda t: t.nn.LayerNorm(6, eps=1e-4),
        lambda: (uniform(7, 2, 5, 6),),
        call,
        torch_call,
    ),
    "LSTM": Case(
        lambda s: nn.LSTM.new(3, 4, layers=2, bidirectional=True, seed=s, dtype=F64),
        lambda t: t.nn.LSTM(3, 4, num_layers=2, bidirectional=True, batch_first=True),
        lambda: (uniform(8, 2, 5, 3),),
        sequence_outputs,
        torch_sequence_outputs,
    ),
    "LSTM-one-layer": Case(
        lambda s: nn.LSTM.new(3, 5, seed=s, dtype=F64),
        lambda t: t.nn.LSTM(3, 5, batch_first=True),
        lambda: (uniform(9, 3, 4, 3),),
        sequence_outputs,
        torch_sequence_outputs,
    ),
    "GRU": Case(
        lambda s: nn.GRU.new(3, 4, layers=2, bidirectional=True, seed=s, dtype=F64),
        lambda t: t.nn.GRU(3, 4, num_layers=2, bidirectional=True, batch_first=True),
        lambda: (uniform(10, 2, 5, 3),),
        sequence_outputs,
        torch_sequence_outputs,
    ),
    "GRU-three-layers": Case(
        lambda s: nn.GRU.new(3, 2, layers=3, seed=s, dtype=F64),
        lambda t: t.nn.GRU(3, 2, num_layers=3, batch_first=True),
        lambda: (uniform(11, 2, 4, 3),),
        sequence_outputs,
        torch_sequence_outputs,
    ),
    "LSTMCell": Case(
        lambda s: nn.LSTMCell.new(3, 4, seed=s, dtype=F64),
        lambda t: t.nn.LSTMCell(3, 4),
        lambda: (uniform(12, 2, 3), uniform(13, 2, 4)),
        cell_outputs,
        torch_cell_outputs,
    ),
    "GRUCell": Case(
        lambda s: nn.GRUCell.new(3, 4, seed=s, dtype=F64),
        lambda t: t.nn.GRUCell(3, 4),
        lambda: (uniform(14, 2, 3), uniform(15, 2, 4)),
        cell_outputs,
        torch_cell_outputs,
    ),
    "MultiHeadAttention": Case(
        lambda s: nn.MultiHeadAttention.new(8, 2, seed=s, dtype=F64),
        lambda t: t.nn.MultiheadAttention(8, 2, batch_first=True),
        lambda: (uniform(16, 2, 5, 8),),
        attention,
        torch_attention,
    ),
    "MultiHeadAttention-kdim-vdim": Case(
        lambda s: nn.MultiHeadAttention.new(8, 4, kdim=6, vdim=3, seed=s, dtype=F64),
        lambda t: t.nn.MultiheadAttention(8, 4, kdim=6, vdim=3, batch_first=True),
        lambda: (uniform(17, 2, 5, 8), uniform(18, 2, 7, 6), uniform(19, 2, 7, 3)),
        attention,
        torch_attention,
    ),
    "MultiHeadAttention-no-bias": Case(
        lambda s: nn.MultiHeadAttention.new(6, 3, seed=s, dtype=F64, bias=False),
        lambda t: t.nn.MultiheadAttention(6, 3, bias=False, batch_first=True),
        lambda: (uniform(20, 2, 4, 6),),
        attention,
        torch_attention,
    ),
    "TransformerEncoderLayer": Case(
        lambda s: nn.TransformerEncoderLayer.new(8, 2, 12, seed=s, dtype=F64),
        lambda t: t.nn.TransformerEncoderLayer(8, 2, 12, dropout=0.0, batch_first=True),
        lambda: (uniform(21, 2, 5, 8),),
        lambda m, x: m(x, causal=True),
        torch_encoder,
    ),
    "TransformerEncoderLayer-norm-first": Case(
        lambda s: nn.TransformerEncoderLayer.new(8, 4, 16, norm_first=True, seed=s, dtype=F64),
        lambda t: t.nn.TransformerEncoderLayer(8, 4, 16, dropout=0.0, batch_first=True, norm_first=True),
        lambda: (uniform(22, 2, 5, 8),),
        lambda m, x: m(x, causal=True),
        torch_encoder,
    ),
    "ConvTranspose2d": Case(
        lambda s: nn.ConvTranspose2d.new(
            4, 6, (3, 2), stride=2, padding=1, output_padding=1, groups=2, seed=s, dtype=F64
        ),
        lambda t: t.nn.ConvTranspose2d(4, 6, (3, 2), stride=2, padding=1, output_padding=1, groups=2),
        lambda: (uniform(23, 2, 4, 3, 4),),
        call,
        torch_call,
    ),
    "GroupNorm": Case(
        lambda s: nn.GroupNorm.new(2, 6, eps=1e-4, dtype=F64),
        lambda t: t.nn.GroupNorm(2, 6, eps=1e-4),
        lambda: (uniform(24, 2, 6, 3, 2),),
        call,
        torch_call,
    ),
    "RMSNorm": Case(
        lambda s: nn.RMSNorm.new((3, 4), dtype=F64),
        lambda t: t.nn.RMSNorm((3, 4)),
        lambda: (uniform(25, 2, 3, 4),),
        call,
        torch_call,
    ),
    "Sequential": Case(
        lambda s: nn.Sequential(
            nn.Conv2d.new(2, 4, 3, padding=1, seed=s, dtype=F64),
            nn.GroupNorm.new(2, 4, dtype=F64),
            ml.relu,
            nn.AdaptiveAvgPool2d(2),
            nn.Flatten(),
            nn.Linear.new(16, 3, seed=s + 1, dtype=F64),
        ),
        lambda t: t.nn.Sequential(
            t.nn.Conv2d(2, 4, 3, padding=1),
            t.nn.GroupNorm(2, 4),
            t.nn.ReLU(),
            t.nn.AdaptiveAvgPool2d(2),
            t.nn.Flatten(),
            t.nn.Linear(16, 3),
        ),
        lambda: (uniform(26, 2, 2, 5, 4),),
        call,
        torch_call,
    ),
    "TransformerDecoderLayer": Case(
        lambda s: nn.TransformerDecoderLayer.new(8, 2, 12, seed=s, dtype=F64),
        lambda t: t.nn.TransformerDecoderLayer(8, 2, 12, batch_first=True),
        lambda: (uniform(27, 2, 5, 8), uniform(28, 2, 6, 8)),
        call,
        torch_decoder,
    ),
    "TransformerDecoderLayer-norm-first": Case(
        lambda s: nn.TransformerDecoderLayer.new(8, 4, 16, norm_first=True, dropout=0.0, seed=s, dtype=F64),
        lambda t: t.nn.TransformerDecoderLayer(8, 4, 16, dropout=0.0, batch_first=True, norm_first=True),
        lambda: (uniform(29, 2, 5, 8), uniform(30, 2, 3, 8)),
        call,
        torch_decoder,
    ),
}


@pytest.fixture
def torch() -> Any:
    module = pytest.importorskip("torch")
    module.manual_seed(0)
    return module


def perturbed(torch: Any, module: Any, seed: int) -> Any:
    """``module`` in float64, its parameters and float buffers moved off their initial values (biases
    0, norms' scales 1: a layout mistake would hide there), in evaluation mode."""
    module = module.double()
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for tensor in [*module.parameters(), *(b for b in module.buffers() if b.is_floating_point())]:
            tensor.add_(torch.from_numpy(rng.uniform(0.1, 0.5, tuple(tensor.shape))))
    return module.eval()


def train_a_few_steps(module: Any, case: Case, inputs: tuple[Any, ...]) -> None:
    probe = None
    for _ in range(3):
        out = case.run_mine(module, *inputs)
        if probe is None:
            probe = uniform(99, *predict(out).shape)
        result = ml.train_blocking(ml.sum(out * probe), ml.Adam(0.05))
        assert result.unwrap() == result.unwrap()  # a finite loss


@pytest.mark.parametrize("name", list(CASES))
def test_a_pytorch_modules_weights_loaded_give_its_outputs(torch: Any, name: str) -> None:
    case = CASES[name]
    theirs = perturbed(torch, case.theirs(torch), seed=1)
    if "BatchNorm" in name:  # running statistics of some batches, not the initial ones
        theirs.train()
        with torch.no_grad():
            for k in range(3):
                theirs(torch.from_numpy(uniform(30 + k, *case.inputs()[0].shape) * (k + 1)))
        theirs.eval()
    mine = case.mine(0)
    result = interop.load_state_dict(mine, theirs.state_dict())
    assert result == interop.LoadResult([], [])
    inputs = case.inputs()
    with torch.no_grad():
        expected = case.run_theirs(torch, theirs, *inputs).numpy()
    np.testing.assert_allclose(predict(case.run_mine(mine, *inputs)), expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", list(CASES))
def test_a_trained_monadl_module_exported_gives_its_outputs_in_pytorch(torch: Any, name: str) -> None:
    case = CASES[name]
    mine, inputs = case.mine(3), case.inputs()
    before = values(mine)
    train_a_few_steps(mine, case, inputs)
    changed = [k for k, v in values(mine).items() if not np.array_equal(v, before[k])]
    assert changed, "training changed nothing: the test would prove nothing"
    exported = interop.state_dict(mine)
    theirs = case.theirs(torch).double().eval()
    assert list(exported) == list(theirs.state_dict())  # PyTorch's names, in PyTorch's order
    theirs.load_state_dict({k: torch.from_numpy(v) for k, v in exported.items()}, strict=True)
    with torch.no_grad():
        expected = case.run_theirs(torch, theirs, *inputs).numpy()
    np.testing.assert_allclose(predict(case.run_mine(mine, *inputs)), expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    "name",
    [
        "LSTM",
        "GRU",
        "MultiHeadAttention-kdim-vdim",
        "BatchNorm2d",
        "MLP",
        "Sequential",
        "TransformerDecoderLayer",
    ],
)
def test_monadl_to_pytorch_to_monadl_gives_the_same_weights(torch: Any, name: str) -> None:
    case = CASES[name]
    mine = case.mine(4)
    train_a_few_steps(mine, case, case.inputs())
    theirs = case.theirs(torch).double()
    theirs.load_state_dict({k: torch.from_numpy(v) for k, v in interop.state_dict(mine).items()})
    again = case.mine(5)
    interop.load_state_dict(again, theirs.state_dict())
    for key, value in values(mine).items():
        np.testing.assert_array_equal(values(again)[key], value, err_msg=key)


def test_float32_weights_load_into_a_float64_model_and_export_in_its_dtype(torch: Any) -> None:
    theirs = torch.nn.Linear(3, 2)  # float32
    mine = nn.Linear.new(3, 2, dtype=np.float64)
    interop.load_state_dict(mine, theirs.state_dict())
    assert mine.w.data.dtype == np.float64
    np.testing.assert_array_equal(mine.w.data, theirs.weight.detach().numpy().T.astype(np.float64))
    assert {v.dtype for v in interop.state_dict(mine).values()} == {np.dtype(np.float64)}


def test_torch_tensors_that_need_gradients_or_are_bfloat16_load(torch: Any) -> None:
    mine = nn.Linear.new(3, 2)
    weight = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3) / 4
    bias = torch.tensor([0.5, -1.0], requires_grad=True)
    interop.load_state_dict(mine, {"weight": weight, "bias": bias})
    np.testing.assert_array_equal(mine.w.data, np.arange(6, dtype=np.float32).reshape(2, 3).T / 4)
    np.testing.assert_array_equal(mine.b.data if mine.b is not None else None, [0.5, -1.0])


def test_a_model_of_modules_is_named_as_pytorch_names_its_attributes(torch: Any) -> None:
    """A user's model of monadl modules in fields, lists and dicts loads the ``state_dict`` of the
    PyTorch model of the same attributes."""

    @dataclass(frozen=True, eq=False)
    class Model(ml.Module):
        embed: nn.Embedding
        blocks: list[nn.TransformerEncoderLayer]
        heads: dict[str, nn.Linear]
        scale: ml.ArrayWeight
        drop: ml.Dropout

        def __call__(self, ids: np.ndarray) -> ml.ArrayLayer:
            x = self.embed(ids)
            for block in self.blocks:
                x = block(x)
            return self.heads["out"](self.drop(x)) * self.scale

    class Theirs(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(11, 8)
            layer = torch.nn.TransformerEncoderLayer
            self.blocks = torch.nn.ModuleList(
                [layer(8, 2, 16, dropout=0.0, batch_first=True) for _ in range(2)]
            )
            self.heads = torch.nn.ModuleDict({"out": torch.nn.Linear(8, 3)})
            self.scale = torch.nn.Parameter(torch.ones(3))
            self.drop = torch.nn.Dropout(0.1)

        def forward(self, ids: Any) -> Any:
            x = self.embed(ids)
            for block in self.blocks:
                x = block(x)
            return self.heads["out"](self.drop(x)) * self.scale

    rng = np.random.default_rng(0)
    mine = Model(
        nn.Embedding.new(11, 8, seed=rng, dtype=F64),
        [nn.TransformerEncoderLayer.new(8, 2, 16, seed=rng, dtype=F64) for _ in range(2)],
        {"out": nn.Linear.new(8, 3, seed=rng, dtype=F64)},
        ml.ArrayWeight(np.ones(3)),
        ml.Dropout(0.1, seed=2),
    )
    theirs = perturbed(torch, Theirs(), seed=6)
    interop.load_state_dict(mine, theirs.state_dict())
    ids = np.array([[1, 4, 10, 0], [2, 2, 7, 5]])
    with torch.no_grad():
        expected = theirs(torch.from_numpy(ids)).numpy()
    np.testing.assert_allclose(predict(mine(ids)), expected, rtol=RTOL, atol=ATOL)
    # (the same keys; PyTorch lists a module's own parameters before its submodules')
    assert sorted(interop.state_dict(mine)) == sorted(theirs.state_dict())


# ------------------------------------------------------------------------------------- without torch


def test_importing_interop_imports_no_torch() -> None:
    code = "import monadl.interop, monadl, sys; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_safetensors_round_trip_needs_no_torch(tmp_path: Path) -> None:
    """A file written by :func:`save_safetensors` loads with torch made unimportable."""
    code = f"""
import sys
sys.modules["torch"] = None  # an import of torch fails
import numpy as np
from monadl import interop, nn
a = nn.LSTM.new(3, 4, layers=2, bidirectional=True, seed=0)
interop.save_safetensors({str(tmp_path / "lstm.safetensors")!r}, a)
b = nn.LSTM.new(3, 4, layers=2, bidirectional=True, seed=1)
assert interop.load_safetensors({str(tmp_path / "lstm.safetensors")!r}, b) == ([], [])
for (name, x), y in zip(a.weights().items(), b.weights().values()):
    assert np.array_equal(x.data, y.data), name
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_safetensors_file_holds_the_state_dict_with_pytorchs_format_tag(tmp_path: Path) -> None:
    from safetensors import safe_open

    model = nn.MLP.new([4, 5, 2], seed=1)
    path = tmp_path / "mlp.safetensors"
    interop.save_safetensors(path, model, metadata={"epoch": "3"})
    with safe_open(str(path), framework="numpy") as f:
        assert f.metadata() == {"format": "pt", "epoch": "3"}
        assert sorted(f.keys()) == ["0.bias", "0.weight", "2.bias", "2.weight"]
        np.testing.assert_array_equal(f.get_tensor("0.weight"), model.layers[0].w.data.T)
    with pytest.raises(TypeError, match="metadata must map str to str"):
        interop.save_safetensors(path, model, metadata={"epoch": 3})  # type: ignore[dict-item]


def test_a_safetensors_file_written_by_pytorch_loads(torch: Any, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    theirs = perturbed(torch, torch.nn.Conv2d(2, 3, 3), seed=2)
    path = tmp_path / "conv.safetensors"
    save_file(theirs.state_dict(), str(path))
    mine = nn.Conv2d.new(2, 3, 3, dtype=F64)
    interop.load_safetensors(path, mine)
    x = uniform(3, 1, 2, 5, 5)
    with torch.no_grad():
        expected = theirs(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(predict(mine(x)), expected, rtol=RTOL, atol=ATOL)


def test_a_file_that_is_no_safetensors_file_is_an_interop_error(tmp_path: Path) -> None:
    path = tmp_path / "junk.safetensors"
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    with pytest.raises(InteropError, match=r"junk\.safetensors: not a readable safetensors file"):
        interop.load_safetensors(path, nn.Linear.new(2, 2))
    with pytest.raises(FileNotFoundError):
        interop.load_safetensors(tmp_path / "missing.safetensors", nn.Linear.new(2, 2))


# -------------------------------------------------------------------------------------------- errors


def state_of(model: object) -> dict[str, Any]:
    """Every weight's data and optimizer state, and every buffer's value."""
    found: dict[str, Any] = {
        n: (np.array(w.data), w.optimizer_state) for n, w in ml.weights_of(model).items()
    }
    found.update({n: np.array(b.data) for n, b in ml.buffers_of(model).items() if hasattr(b, "data")})
    return found


def assert_unchanged(model: object, before: dict[str, Any]) -> None:
    after = state_of(model)
    assert after.keys() == before.keys()
    for name, value in before.items():
        if isinstance(value, tuple):
            np.testing.assert_array_equal(after[name][0], value[0], err_msg=name)
            assert after[name][1] is value[1], name
        else:
            np.testing.assert_array_equal(after[name], value, err_msg=name)


@dataclass(frozen=True, eq=False)
class Net(ml.Module):
    norm: nn.BatchNorm1d
    fc: nn.Linear
    rnn: nn.GRU


def net() -> Net:
    model = Net(nn.BatchNorm1d.new(3), nn.Linear.new(3, 2, seed=1), nn.GRU.new(2, 2, seed=2))
    loss = ml.sum(model.fc(model.norm(uniform(5, 4, 3))))
    ml.train_blocking(loss, ml.Adam(0.1)).unwrap()  # optimizer state a failed load must keep
    return model


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("fc.bias"), r"missing 'fc.bias' \(float32 \(2,\)\), for the model's Linear at 'fc'"),
        (lambda d: d.update(extra=np.zeros(2)), r"unexpected 'extra' \(float64 \(2,\)\)"),
        (
            lambda d: d.update({"fc.weight": np.zeros((3, 2))}),
            r"'fc.weight' has shape \(3, 2\), the model's Linear at 'fc' takes \(2, 3\) \(its transpose",
        ),
        (
            lambda d: d.update({"rnn.weight_ih_l0": np.zeros((4, 2))}),
            r"'rnn.weight_ih_l0' has shape \(4, 2\), the model's GRU at 'rnn' takes \(6, 2\)",
        ),
        (
            lambda d: d.update({"norm.running_var": np.array([1, 2, 3])}),
            r"'norm.running_var' is int64, the model's batch norm at 'norm' takes floats",
        ),
        (
            lambda d: d.update({"norm.num_batches_tracked": np.float32(2.0)}),
            r"'norm.num_batches_tracked' is float32, the model's batch norm at 'norm' takes integers",
        ),
        (
            lambda d: d.update({"rnn.bias_hh_l0": np.array([0, 1, np.nan, 0, 0, 0])}),
            r"'rnn.bias_hh_l0' holds NaN or infinite values \(allow_non_finite=True loads them\)",
        ),
    ],
    ids=["missing", "unexpected", "transposed", "shape", "dtype", "count-dtype", "nan"],
)
def test_a_state_dict_that_does_not_fit_is_an_error_naming_the_key_and_changes_nothing(
    change: Callable[[dict[str, Any]], object], message: str
) -> None:
    model, twin = net(), net()
    for w in ml.weights_of(twin).values():  # other values than the model's own
        w.data = np.asarray(w.data) + np.float32(1.0)
    given = interop.state_dict(twin)
    change(given)
    before = state_of(model)
    with pytest.raises(InteropError, match=message):
        interop.load_state_dict(model, given)
    assert_unchanged(model, before)
    assert issubclass(InteropError, ml.CheckpointError)


def test_every_problem_is_named_in_one_error() -> None:
    model = net()
    given = interop.state_dict(model)
    del given["fc.bias"], given["rnn.bias_ih_l0"]
    given["fc.weight"] = np.zeros((5, 5), dtype=np.float32)
    with pytest.raises(InteropError) as raised:
        interop.load_state_dict(model, given)
    text = str(raised.value)
    assert "load_state_dict: the state dict does not fit the model (strict=False loads" in text
    for fragment in ("missing 'fc.bias'", "missing 'rnn.bias_ih_l0'", "'fc.weight' has shape (5, 5)"):
        assert fragment in text


def test_not_strict_loads_the_parts_named_and_returns_the_keys_not_matched() -> None:
    model = net()
    source = net()
    for w in ml.weights_of(source).values():
        w.data = np.asarray(w.data) * np.float32(2.0) + np.float32(0.5)
    given = interop.state_dict(source)
    del given["fc.bias"]
    for key in [k for k in given if k.startswith("rnn.")]:
        del given[key]
    given["other.weight"] = np.zeros(1)
    rnn_before = state_of(model.rnn)
    result = interop.load_state_dict(model, given, strict=False)
    assert result.missing_keys == ["fc.bias", *[k for k in interop.state_dict(model) if k.startswith("rnn.")]]
    assert result.unexpected_keys == ["other.weight"]
    np.testing.assert_array_equal(model.fc.w.data, source.fc.w.data)
    np.testing.assert_array_equal(model.norm.running_var.data, source.norm.running_var.data)
    assert model.fc.b is not None and model.fc.b.optimizer_state is None  # its part was loaded
    assert_unchanged(model.rnn, rnn_before)  # a part none of whose keys came stays as it was


def test_a_load_drops_the_optimizer_state_of_what_it_loads() -> None:
    model = net()
    assert model.fc.w.optimizer_state is not None
    interop.load_state_dict(model, interop.state_dict(net()))
    assert all(w.optimizer_state is None for w in ml.weights_of(model).values())


def test_non_finite_values_load_when_allowed() -> None:
    model = nn.Linear.new(2, 2)
    given = {"weight": np.array([[np.inf, 0.0], [0.0, 1.0]]), "bias": np.zeros(2)}
    interop.load_state_dict(model, given, allow_non_finite=True)
    assert np.isinf(np.asarray(model.w.data)[0, 0])


def test_what_is_not_a_state_dict_is_refused() -> None:
    model = nn.Linear.new(2, 2)
    with pytest.raises(TypeError, match="load_state_dict: expected a mapping"):
        interop.load_state_dict(model, [("weight", np.zeros((2, 2)))])  # type: ignore[arg-type]
    with pytest.raises(InteropError, match="'weight' is a str, not an array or a torch tensor"):
        interop.load_state_dict(model, {"weight": "zeros", "bias": np.zeros(2)})


def test_an_attention_with_biases_on_some_projections_has_no_pytorch_form() -> None:
    full = nn.MultiHeadAttention.new(4, 2)
    partial = nn.MultiHeadAttention(full.qkv, nn.Linear(full.out.w), 2)
    with pytest.raises(InteropError, match="bias on every projection or on none"):
        interop.state_dict(partial)


def test_two_parts_of_one_pytorch_name_are_an_error() -> None:
    clash = {0: nn.Linear.new(2, 2), "0": nn.Linear.new(2, 2)}
    with pytest.raises(InteropError, match=r"two parts of the model have the PyTorch name .0\.weight."):
        interop.state_dict(clash)


def test_a_shared_module_is_named_once_and_a_shared_weight_takes_one_value() -> None:
    shared = nn.Linear.new(2, 2)
    model = [shared, shared]
    assert list(interop.state_dict(model)) == ["0.weight", "0.bias"]
    w = ml.ArrayWeight(np.ones((2, 2), dtype=np.float32))
    two = [nn.Linear(w), nn.Linear(w)]
    with pytest.raises(InteropError, match=r"a weight shared by .* gets two different values"):
        interop.load_state_dict(two, {"0.weight": np.zeros((2, 2)), "1.weight": np.eye(2)})
    interop.load_state_dict(two, {"0.weight": np.eye(2), "1.weight": np.eye(2)})
    np.testing.assert_array_equal(w.data, np.eye(2))


def test_a_prediction_beside_loads_sees_all_old_or_all_new_weights() -> None:
    """A load commits every weight at once: a prediction running beside it never mixes them."""
    model = nn.MLP.new([4, 4, 4], seed=0)
    x = np.eye(4, dtype=np.float32)
    old = interop.state_dict(model)
    new = {k: np.full_like(v, 0.5) for k, v in old.items()}
    expected = set()
    for weights in (old, new):
        interop.load_state_dict(model, weights)
        expected.add(predict(model(x)).tobytes())
    stop = threading.Event()

    def loads() -> None:
        while not stop.is_set():
            for weights in (old, new):
                interop.load_state_dict(model, weights)

    thread = threading.Thread(target=loads)
    thread.start()
    try:
        seen = {predict(model(x)).tobytes() for _ in range(200)}
    finally:
        stop.set()
        thread.join()
    assert seen <= expected


def test_a_model_of_another_namespace_exports_through_the_host_and_loads_onto_its_own() -> None:
    xp = pytest.importorskip("array_api_strict")
    model = nn.GRU.new(3, 2, seed=0).to(xp)
    exported = interop.state_dict(model)
    assert all(type(v) is np.ndarray for v in exported.values())
    source = nn.GRU.new(3, 2, seed=1)
    interop.load_state_dict(model, interop.state_dict(source))
    for (name, w), theirs in zip(model.weights().items(), source.weights().values(), strict=True):
        assert type(w.data) is not np.ndarray, name  # still the model's namespace
        np.testing.assert_array_equal(np.asarray(w.data), theirs.data, err_msg=name)


def test_a_tensor_numpy_cannot_hold_is_an_error_naming_its_key(torch: Any) -> None:
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this PyTorch has no float8")
    model = nn.Linear.new(2, 2)
    with pytest.raises(InteropError, match="'weight' cannot be read as a NumPy array"):
        interop.load_state_dict(
            model, {"weight": torch.zeros(2, 2).to(torch.float8_e4m3fn), "bias": np.zeros(2)}
        )
