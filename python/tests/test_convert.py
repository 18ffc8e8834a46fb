"""convert_to_float8 and conversion_report (scalemm.torch.convert): the rules on the host, on CPU or meta
tensors; on a GPU the "auto" filter's bf16 small calls and a converted model that trains and compiles."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

import scalemm  # noqa: E402
import scalemm.torch as st  # noqa: E402
from torch_support import RECIPES, _sqnr, needs_gpu  # noqa: E402


class Odd(torch.nn.Linear):
    pass


def model(device="cpu", dtype=torch.float32):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(256, 1024),                                   # eligible everywhere, below "auto"
        torch.nn.Sequential(torch.nn.Linear(1024, 4096, bias=False),  # eligible, above "auto"
                            torch.nn.GELU(),
                            torch.nn.Linear(4096, 4096)),
        torch.nn.Linear(4096, 100),                                   # out 100: no recipe takes it
        torch.nn.Linear(48, 48),                                      # 48: a multiple of 16, not of 32
        Odd(64, 64),                                                  # a subclass: left alone
    ).to(device, dtype)


@pytest.mark.parametrize("recipe", RECIPES)
def test_convert_swaps_eligible_layers_in_place_and_keeps_the_parameters(recipe):
    m = model("meta", torch.bfloat16)
    before = {n: p for n, p in m.named_parameters()}
    out = st.convert_to_float8(m, recipe=recipe)
    assert out is m
    assert isinstance(m[0], st.Float8Linear) and m[0].recipe == recipe
    assert isinstance(m[1][0], st.Float8Linear) and isinstance(m[1][2], st.Float8Linear)
    assert type(m[2]) is torch.nn.Linear and type(m[4]) is Odd
    assert isinstance(m[3], st.Float8Linear) == (recipe != "mxfp8")
    after = dict(m.named_parameters())
    assert after.keys() == before.keys() and all(after[n] is before[n] for n in before)  # shared, not copied
    assert all(p.device.type == "meta" and p.dtype == torch.bfloat16 for p in after.values())
    rows = {r["name"]: r for r in st.conversion_report(m)}
    assert set(rows) == {"0", "1.0", "1.2", "2", "3", "4"}
    assert rows["0"]["recipe"] == recipe and rows["0"]["layer"] == "Float8Linear"
    assert "out_features = 100 is not a multiple of" in rows["2"]["reason"] and rows["2"]["recipe"] is None
    assert "subclass" in rows["4"]["reason"]
    text = str(st.conversion_report(m))
    assert text.splitlines()[0].split() == ["layer", "in", "x", "out", "is", "now", "why"] and "1.2" in text


def test_module_filter_callable_and_auto():
    seen = []
    m = st.convert_to_float8(model("meta"), module_filter=lambda fqn, mod: seen.append(fqn) or fqn != "1.2")
    assert seen == ["0", "1.0", "1.2", "3"]  # eligible layers only, in module order, by full name
    assert type(m[1][2]) is torch.nn.Linear and isinstance(m[1][0], st.Float8Linear)
    assert {r["name"]: r["reason"] for r in st.conversion_report(m)}["1.2"] == "module_filter returned False"
    m = st.convert_to_float8(model("meta"), recipe="rowwise", module_filter="auto")
    assert type(m[0]) is torch.nn.Linear and type(m[3]) is torch.nn.Linear  # 256 x 1024, 48 x 48
    assert isinstance(m[1][0], st.Float8Linear) and m[1][2].recipe == "rowwise"  # 1024 x 4096, 4096 x 4096
    assert m[1][0].min_gflop == st.AUTO_MIN_GFLOP
    rows = {r["name"]: r["reason"] for r in st.conversion_report(m)}
    assert "auto:" in rows["0"] and "GFLOP" in rows["1.0"]


def test_a_layer_reachable_from_two_places_is_swapped_in_both():
    shared = torch.nn.Linear(256, 256, device="meta")
    m = torch.nn.ModuleDict({"a": torch.nn.Sequential(shared), "b": torch.nn.Sequential(shared)})
    st.convert_to_float8(m)
    assert isinstance(m["a"][0], st.Float8Linear) and m["a"][0] is m["b"][0]  # still one layer
    assert m["a"][0].weight is shared.weight
    assert [r["name"] for r in st.conversion_report(m)] == ["a.0"]  # named_modules lists it once


def test_bad_arguments_are_named():
    with pytest.raises(scalemm.InvalidArgumentError, match="recipe"):
        st.convert_to_float8(model("meta"), recipe="fp8")
    with pytest.raises(scalemm.InvalidArgumentError, match="module_filter"):
        st.convert_to_float8(model("meta"), module_filter="fast")
    with pytest.raises(scalemm.InvalidArgumentError, match="model"):
        st.convert_to_float8(torch.nn.Linear(64, 64, device="meta"))
    with pytest.raises(scalemm.InvalidArgumentError, match="recipe"):
        st.Float8Linear(64, 64, device="meta", recipe="mx")
    assert "recipe=tensorwise" in repr(st.Float8Linear(64, 64, device="meta", recipe="tensorwise"))


@needs_gpu
def test_auto_runs_small_calls_in_bf16_and_large_ones_in_fp8():
    lin = torch.nn.Linear(1024, 4096, bias=False, device="cuda", dtype=torch.bfloat16)
    m = st.convert_to_float8(torch.nn.Sequential(lin), module_filter="auto")[0]
    small = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)  # 0.5 GFLOP per GEMM
    big = torch.randn(32768, 1024, device="cuda", dtype=torch.bfloat16)  # 275 GFLOP
    assert torch.equal(m(small), torch.nn.functional.linear(small, lin.weight))
    assert not torch.equal(m(big), torch.nn.functional.linear(big, lin.weight))  # FP8: not bf16's bits
    assert _sqnr(torch.nn.functional.linear(big, lin.weight), m(big)) > 25


@needs_gpu
def test_a_converted_model_trains_and_compiles():
    m = st.convert_to_float8(model("cuda", torch.bfloat16)[:2], recipe="blockwise")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    x = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    losses = []
    for _ in range(5):
        loss = m(x).float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    compiled = torch.compile(m, fullgraph=True)
    with torch.no_grad():
        a, b = compiled(x), m(x)
    assert _sqnr(b, a) > 40  # same math; the compiled graph quantizes the weight itself
