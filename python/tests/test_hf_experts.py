"""scalemm's experts in transformers' models (scalemm.torch.hf_experts): registration in both import orders, the
model-level selection, the fallback reasons, conversion; on the host the adaptation of each model's layout and gate
is checked against transformers' grouped_mm through a float64 engine of the engine's contract; on the GPU the FP8
experts against the bf16 grouped_mm path (outputs and every gradient, SQNR bounds), EP sentinels, empty experts,
CUDA-graph replay, torch.compile(fullgraph=True) and a sync-free step. Tiny random configs of Mixtral, Qwen2-MoE
(shared expert), Qwen3-MoE, DeepSeek-V3 (shared experts, grouped routing) and GPT-OSS (biases, transposed and
interleaved weights, its clamped gate)."""

from __future__ import annotations

import copy
import inspect
import json
import os
import subprocess
import sys
import warnings

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
tf = pytest.importorskip("transformers", reason="transformers is not installed")
moe = pytest.importorskip("transformers.integrations.moe", reason="this transformers has no experts registry")

import scalemm  # noqa: E402
import scalemm.torch as st  # noqa: E402
from scalemm.torch import hf_experts as hx  # noqa: E402
from oracle import seed  # noqa: E402
from torch_support import _sqnr as sqnr, needs_gpu, run_without_syncs  # noqa: E402

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(scalemm.__file__)))
MODELS = ["mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3", "gpt_oss"]


def config(kind, hidden=256, inter=256, experts=4, top_k=2):
    c = dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=256, hidden_size=hidden,
             num_experts_per_tok=top_k)
    if kind == "mixtral":
        return tf.MixtralConfig(**c, intermediate_size=inter, num_local_experts=experts)
    if kind == "qwen2_moe":
        return tf.Qwen2MoeConfig(**c, moe_intermediate_size=inter, intermediate_size=inter,
                                 shared_expert_intermediate_size=inter, num_experts=experts)
    if kind == "qwen3_moe":
        return tf.Qwen3MoeConfig(**c, moe_intermediate_size=inter, intermediate_size=inter, num_experts=experts,
                                 head_dim=64)
    if kind == "deepseek_v3":
        return tf.DeepseekV3Config(**c, moe_intermediate_size=inter, intermediate_size=inter,
                                   n_routed_experts=experts, n_group=1, topk_group=1, first_k_dense_replace=0,
                                   n_shared_experts=1, q_lora_rank=None, kv_lora_rank=64, qk_rope_head_dim=32,
                                   qk_nope_head_dim=32, v_head_dim=64)
    return tf.GptOssConfig(**c, intermediate_size=inter, num_local_experts=experts, head_dim=64,
                           layer_types=["full_attention"] * 2)


def model(kind, impl="grouped_mm", device="cpu", dtype=torch.float32, **shape):
    torch.manual_seed(seed(f"hf experts {kind} {shape}"))
    m = tf.AutoModelForCausalLM.from_config(config(kind, **shape), experts_implementation=impl)
    for p in m.parameters():  # some inits leave zeros (GPT-OSS's biases): every parameter random
        with torch.no_grad():
            p.copy_(torch.randn_like(p) * (p.shape[-1] ** -0.5 if p.dim() > 1 else 0.1))
    return m.to(device=device, dtype=dtype)


def experts_of(m):
    return [x for x in m.modules() if hx.is_experts(x)]


def routing(t, e, k, g, device, sentinel_rows=0, empty=()):
    """(top_k_index, top_k_weights): k distinct experts per token (none of `empty`), softmax weights; the last
    `sentinel_rows` tokens get expert id e (an expert-parallel sentinel) in every slot, weight 0 there."""
    allowed = torch.tensor([i for i in range(e) if i not in empty])
    scores = torch.rand(t, len(allowed), generator=g)
    idx = allowed[scores.topk(k, dim=-1).indices]
    w = torch.softmax(torch.randn(t, k, generator=g), dim=-1)
    if sentinel_rows:
        idx[-sentinel_rows:] = e
        w[-sentinel_rows:] = 0
    return idx.to(device), w.to(device)


# ---- registration ---------------------------------------------------------------------------------------

REGISTRATION = r"""
import json, sys
order = sys.argv[1]
if order == "scalemm_first":
    import scalemm.torch
    assert "transformers" not in sys.modules, "scalemm imported transformers"
    import transformers.integrations.moe as moe
else:
    import transformers.integrations.moe as moe
    import scalemm.torch
from scalemm.torch import hf_experts as hx
waiting = [sorted(f.pending) for f in sys.meta_path if isinstance(f, hx._ImportHook)]
import transformers.integrations.finegrained_fp8 as fp8
print(json.dumps(dict(
    experts=[k for k in moe.ALL_EXPERTS_FUNCTIONS.keys() if k.startswith("scalemm")],
    fp8=[k for k in fp8.ALL_FP8_EXPERTS_FUNCTIONS.keys() if k.startswith("scalemm")],
    waiting_after_moe=waiting,
    hooks_left=sum(isinstance(f, hx._ImportHook) for f in sys.meta_path),
    loader=type(moe.__loader__).__name__, spec_loader=type(moe.__spec__.loader).__name__)))
"""


@pytest.mark.parametrize("order", ["scalemm_first", "transformers_first"])
def test_registered_in_either_import_order(order):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([PYTHON_DIR, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", REGISTRATION, order], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    names = [f"scalemm_{r}" for r in hx.registered()]
    assert "scalemm_blockwise" in names
    assert got["experts"] == names and got["fp8"] == names
    assert got["hooks_left"] == 0  # the hook leaves sys.meta_path once both interfaces are registered
    if order == "scalemm_first":  # moe is in; the FP8 interface still awaited until its module is imported
        assert got["waiting_after_moe"] == [["transformers.integrations.finegrained_fp8"]]
    assert got["loader"] == got["spec_loader"] == "SourceFileLoader"  # the module keeps its own loader


def test_recipes_the_engine_does_not_run_are_not_registered(monkeypatch):
    runs = hx.engine_recipes()
    assert hx.registered() == tuple(r for r in hx.RECIPES if r in runs)
    for recipe, why in hx.unregistered().items():
        assert recipe not in runs and f"not {recipe} yet" in why
        with pytest.raises(ValueError, match=f"scalemm_{recipe}"):  # transformers' own check of the name
            model("mixtral", f"scalemm_{recipe}")
    with pytest.raises(ValueError, match="scalemm_tensorwise"):
        model("mixtral", "scalemm_tensorwise")
    monkeypatch.setattr(hx, "engine_recipes", lambda: ("blockwise", "mxfp8"))
    assert hx.registered() == ("blockwise", "mxfp8")


@pytest.mark.parametrize("kind", MODELS)
def test_models_run_scalemm_experts_on_the_host(kind):
    """from_config(..., experts_implementation=...) selects the scalemm experts, which run (CPU tensors: the
    library's emulator) near transformers' grouped_mm; set_experts_implementation switches back and forth."""
    m = model(kind, "scalemm_blockwise", dtype=torch.bfloat16)
    ref = copy.deepcopy(m)
    ref.set_experts_implementation("grouped_mm")
    assert m.get_experts_implementation()[""] == "scalemm_blockwise"
    x = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(seed(kind)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = m(x).logits
    assert not [w for w in caught if "grouped_mm" in str(w.message)]
    mods = experts_of(m)
    assert len(mods) == 2 and all(hx.experts_status(e) == ("scalemm_blockwise", None) for e in mods)
    s = sqnr(ref(x).logits, out)
    print(f"HF MODEL {kind} host: logits SQNR {s:.1f} dB against grouped_mm")
    assert s >= 15
    m.set_experts_implementation("grouped_mm")
    assert torch.equal(m(x).logits, ref(x).logits)


def test_fallback_runs_grouped_mm_with_the_reason():
    m = model("mixtral", "scalemm_blockwise", hidden=192, inter=160)
    ref = copy.deepcopy(m)
    ref.set_experts_implementation("grouped_mm")
    e = experts_of(m)[0]
    assert hx.ineligible(e, "blockwise").startswith("hidden size 192 is not a multiple of 128")
    x = torch.randint(0, 256, (2, 24))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = m(x).logits
        m(x)
    fallback = [str(w.message) for w in caught if "runs transformers' grouped_mm" in str(w.message)]
    assert len(fallback) == 2 and "hidden size 192" in fallback[0]  # once per module
    assert hx.experts_status(e) == ("scalemm_blockwise", hx.ineligible(e, "blockwise"))
    assert torch.equal(out, ref(x).logits)
    m = model("mixtral", hidden=256, inter=160)
    assert hx.ineligible(experts_of(m)[0], "blockwise").startswith("intermediate size 160 is not a multiple")


def test_prequantized_fp8_experts_are_refused_by_name():
    fp8 = pytest.importorskip("transformers.integrations.finegrained_fp8")
    fn = fp8.ALL_FP8_EXPERTS_FUNCTIONS.get_interface("scalemm_blockwise", None)
    e = experts_of(model("mixtral"))[0]
    with pytest.raises(scalemm.UnsupportedError, match=r"scalemm_blockwise.*pre-quantized.*dequantize=True"):
        fn(e, torch.zeros(4, 256), torch.zeros(4, 2, dtype=torch.long), torch.zeros(4, 2))


# ---- the adaptation, against grouped_mm through a float64 engine of the engine's contract ---------------

def reference_engine(hidden_states, top_k_index, top_k_weights, gate_up_proj, down_proj, *, num_experts,
                     recipe="blockwise", apply_gate=None, gate_up_bias=None, down_bias=None, is_transposed=False,
                     power_of_two_scales=False):
    """experts_forward's contract in float64, every token through every expert (no data-dependent shapes, so
    it traces): [gate | up] halves, SiLU(gate) * up unless apply_gate, ids >= num_experts contribute 0."""
    x = hidden_states.double()
    w1, w2 = gate_up_proj.double(), down_proj.double()
    up = torch.einsum("th,enh->ten", x, w1) if not is_transposed else torch.einsum("th,ehn->ten", x, w1)
    if gate_up_bias is not None:
        up = up + gate_up_bias.double()
    if apply_gate is None:
        gate, u = up.chunk(2, dim=-1)
        h = torch.nn.functional.silu(gate) * u
    else:
        h = apply_gate(up)
    y = torch.einsum("tei,ehi->teh", h, w2) if not is_transposed else torch.einsum("tei,eih->teh", h, w2)
    if down_bias is not None:
        y = y + down_bias.double()
    chosen = torch.nn.functional.one_hot(top_k_index.clamp(max=num_experts), num_experts + 1)[..., :num_experts]
    combine = torch.einsum("tk,tke->te", top_k_weights.double(), chosen.double())
    return torch.einsum("te,teh->th", combine, y).to(hidden_states.dtype)


def test_reference_engine_has_the_engine_signature():
    assert hx._engine() is st.experts_forward
    assert list(inspect.signature(st.experts_forward).parameters) == \
        list(inspect.signature(reference_engine).parameters)


class _Interleaved(torch.nn.Module):
    """Mixtral-like experts declared with interleaved gate/up rows and the default gate."""

    def __init__(self, config):
        super().__init__()
        self.num_experts, h, i = config.num_local_experts, config.hidden_size, config.intermediate_size
        self.gate_up_proj = torch.nn.Parameter(torch.randn(self.num_experts, 2 * i, h) / h ** 0.5)
        self.down_proj = torch.nn.Parameter(torch.randn(self.num_experts, h, i) / i ** 0.5)
        self.act_fn = torch.nn.SiLU()

    def forward(self, *args):
        raise AssertionError("the registry runs this module")


Interleaved = moe.use_experts_implementation(_Interleaved, is_concatenated=False)


def grads(module, args, out_grad, impl):
    module.config._experts_implementation = impl
    args = [a.detach().clone().requires_grad_(a.is_floating_point()) for a in args]
    module.zero_grad(set_to_none=True)
    out = module(*args)
    out.backward(out_grad)
    got = {"out": out.detach(), "hidden_states": args[0].grad, "top_k_weights": args[2].grad}
    got.update({n: p.grad for n, p in module.named_parameters()})
    return got


@pytest.mark.parametrize("kind", MODELS + ["interleaved"])
def test_adaptation_matches_grouped_mm(kind, monkeypatch):
    """Each module's layout flags, biases and gate reach the engine so that its result and every gradient
    (through the reorder of interleaved weights too) are transformers' grouped_mm's."""
    monkeypatch.setattr(hx, "_engine", lambda: reference_engine)
    if kind == "interleaved":
        cfg = tf.MixtralConfig(hidden_size=128, intermediate_size=128, num_local_experts=4)
        cfg._experts_implementation = "grouped_mm"
        e = Interleaved(cfg)
        # What the declared layout means: [g0, u0, g1, u1, ...]; grouped_mm's default gate reads halves, so
        # its reference is the same module with the rows de-interleaved.
        ref = copy.deepcopy(e)
        with torch.no_grad():
            ref.gate_up_proj.copy_(hx.concatenated(e.gate_up_proj, 1))
        ref.is_concatenated = True
    else:
        e = experts_of(model(kind))[0]
        ref = e
    g = torch.Generator().manual_seed(seed(f"adaptation {kind}"))
    h = e.down_proj.shape[1] if not e.is_transposed else e.down_proj.shape[2]
    t = 40
    idx, w = routing(t, e.num_experts, 2, g, "cpu", sentinel_rows=3, empty=(1,))
    args = [torch.randn(t, h, generator=g), idx, w]
    dy = torch.randn(t, h, generator=g)
    got = grads(e, args, dy, "scalemm_blockwise")
    want = grads(ref, args, dy, "grouped_mm")
    if kind == "interleaved":  # the interleaved parameter's gradient is the reference's, re-interleaved
        g2 = want["gate_up_proj"]
        want["gate_up_proj"] = torch.stack([g2[:, :128], g2[:, 128:]], dim=2).reshape(g2.shape)
    assert got.keys() == want.keys()
    for name in got:
        torch.testing.assert_close(got[name], want[name], rtol=2e-4, atol=2e-5, msg=name)
    assert torch.count_nonzero(got["down_proj"][1]) == 0  # an expert no token chose: zero gradient
    assert torch.count_nonzero(got["out"][-3:]) == 0  # tokens routed only to sentinels


def test_concatenated_reorders_values_and_gradient():
    w = torch.arange(2 * 6 * 3, dtype=torch.float64).reshape(2, 6, 3).requires_grad_()
    c = hx.concatenated(w, 1)
    assert torch.equal(c[:, :3], w[:, 0::2]) and torch.equal(c[:, 3:], w[:, 1::2])
    g = torch.randn_like(c)
    c.backward(g)
    assert torch.equal(w.grad[:, 0::2], g[:, :3]) and torch.equal(w.grad[:, 1::2], g[:, 3:])
    wt = w.detach().transpose(1, 2).contiguous()  # transposed layout: features last
    assert torch.equal(hx.concatenated(wt, -1), c.detach().transpose(1, 2))


# ---- conversion ------------------------------------------------------------------------------------------

def test_convert_to_float8_sets_the_experts_and_reports_every_module():
    m = st.convert_to_float8(model("qwen2_moe"), recipe="blockwise")
    assert m.get_experts_implementation()[""] == "scalemm_blockwise"
    rows = [r for r in st.conversion_report(m) if "Experts" in r["layer"]]
    assert [r["name"] for r in rows] == ["model.layers.0.mlp.experts", "model.layers.1.mlp.experts"]
    assert rows[0]["layer"] == "Qwen2MoeExperts (4 experts): scalemm_blockwise" and rows[0]["recipe"] == "blockwise"
    assert rows[0]["reason"] == "FP8 blockwise experts (the engine's SiLU(gate) * up)"
    assert "Qwen2MoeExperts" in str(st.conversion_report(m))

    # "auto" takes every experts module (measured faster in FP8 at every benchmarked shape); its small nn.Linear
    # layers stay bf16.
    m = st.convert_to_float8(model("gpt_oss", hidden=256, inter=128), recipe="blockwise", module_filter="auto")
    rows = [r for r in st.conversion_report(m) if "Experts" in r["layer"]]
    assert len(rows) == 2 and all(r["reason"] == "FP8 blockwise experts (the module's own gate)" for r in rows)
    assert all(r["layer"] == "GptOssExperts (4 experts): scalemm_blockwise" for r in rows)
    assert not any(type(x) is st.Float8Linear for x in m.modules())

    # Every recipe's experts: the name set on the model, what each module became and why (rowwise and mxfp8 read
    # their group sizes back once per call, which the reason says).
    assert hx.registered() == hx.RECIPES and hx.unregistered() == {}
    for recipe in hx.RECIPES:
        m = st.convert_to_float8(model("mixtral"), recipe=recipe)
        assert m.get_experts_implementation()[""] == f"scalemm_{recipe}"
        rows = [r for r in st.conversion_report(m) if "Experts" in r["layer"]]
        assert len(rows) == 2 and all(r["layer"] == f"MixtralExperts (4 experts): scalemm_{recipe}" and
                                      r["recipe"] == recipe for r in rows)
        host = st.moe.HOST_SIZES_REASON[recipe]
        assert all(r["reason"] == f"FP8 {recipe} experts (the engine's SiLU(gate) * up)" + (f"; {host}" if host else "")
                   for r in rows)
        assert (host is None) == (recipe == "blockwise")
    # "auto" keeps the experts of the recipes measured slower than bf16 on grouped_mm, and says so; the
    # module then runs transformers' own function (bit for bit grouped_mm's output).
    for recipe in ("rowwise", "mxfp8"):
        if recipe == "mxfp8" and hx._auto_reason("mxfp8") is None:
            continue  # a GPU with native MX GEMMs: auto converts them
        m = st.convert_to_float8(model("mixtral"), recipe=recipe, module_filter="auto")
        rows = [r for r in st.conversion_report(m) if "Experts" in r["layer"]]
        assert len(rows) == 2 and all(r["layer"] == "MixtralExperts (4 experts): grouped_mm" and r["recipe"] is None
                                      and r["reason"] == hx.AUTO_SLOWER[recipe] for r in rows)
        e = experts_of(m)[0]
        g = torch.Generator().manual_seed(seed("auto experts"))
        idx, w = routing(24, 4, 2, g, "cpu")
        x = torch.randn(24, 256, generator=g)
        assert torch.equal(e(x, idx, w), hx._moe().grouped_mm_experts_forward(e, x, idx, w))
    # power_of_two_scales reaches every experts module's calls and the report.
    m = st.convert_to_float8(model("mixtral"), recipe="blockwise", power_of_two_scales=True)
    mods = experts_of(m)
    assert all(hx.power_of_two_scales(e) for e in mods)
    assert all(r["reason"] == "FP8 blockwise experts (the engine's SiLU(gate) * up, power-of-two scales)"
               for r in st.conversion_report(m) if "Experts" in r["layer"])
    g = torch.Generator().manual_seed(seed("pow2 experts"))
    idx, w = routing(24, 4, 2, g, "cpu")
    x = torch.randn(24, 256, generator=g)
    e = mods[0]
    args = dict(num_experts=4, recipe="blockwise", gate_up_bias=None, down_bias=None, is_transposed=False)
    want = st.experts_forward(x, idx, w, e.gate_up_proj, e.down_proj, power_of_two_scales=True, **args)
    assert torch.equal(e(x, idx, w), want)
    assert not torch.equal(want, st.experts_forward(x, idx, w, e.gate_up_proj, e.down_proj, **args))
    hx.set_power_of_two_scales(e, False)
    assert not hx.power_of_two_scales(e)
    for recipe, why in hx.unregistered().items():
        m = st.convert_to_float8(model("mixtral"), recipe=recipe)
        rows = [r for r in st.conversion_report(m) if "Experts" in r["layer"]]
        assert len(rows) == 2 and all(r["reason"] == why for r in rows)
        assert m.get_experts_implementation()[""] == "grouped_mm"
    m = st.convert_to_float8(model("mixtral"), recipe="tensorwise")
    assert all("no scalemm experts for recipe 'tensorwise'" in r["reason"] for r in st.conversion_report(m)
               if "Experts" in r["layer"])


def test_module_filter_chooses_experts_modules():
    # Only the first experts module passes the filter (no nn.Linear: the test is about the experts).
    m = st.convert_to_float8(model("gpt_oss", dtype=torch.bfloat16), recipe="blockwise",
                             module_filter=lambda fqn, mod: fqn.endswith("0.mlp.experts"))
    e0, e1 = experts_of(m)
    assert e1._scalemm_not_converted == "module_filter returned False" and e0._scalemm_not_converted is None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m(torch.randint(0, 256, (1, 8)))
    assert not [w for w in caught if "grouped_mm" in str(w.message)]  # a choice, not a fallback: no warning
    assert hx.experts_status(e0) == ("scalemm_blockwise", None)
    assert hx.experts_status(e1) == ("scalemm_blockwise", "module_filter returned False")
    rows = {r["name"]: r for r in st.conversion_report(m)}
    assert rows["model.layers.0.mlp.experts"]["reason"] == "FP8 blockwise experts (the module's own gate)"
    assert rows["model.layers.1.mlp.experts"]["reason"] == "module_filter returned False"


@pytest.mark.parametrize("kind", ["mixtral", "gpt_oss"])
def test_the_adaptation_traces_under_compile_fullgraph(kind, monkeypatch):
    """The registry call, the module's flags and the reorder trace without a graph break (the engine's own
    trace: test_model_compiles_fullgraph_with_scalemm_experts on the GPU)."""
    monkeypatch.setattr(hx, "_engine", lambda: reference_engine)
    m = model(kind, "scalemm_blockwise")
    x = torch.randint(0, 256, (2, 16))
    f = torch.compile(m, fullgraph=True, backend="eager")
    torch.testing.assert_close(f(x).logits, m(x).logits, rtol=1e-5, atol=1e-5)


# ---- on the GPU ------------------------------------------------------------------------------------------

# SQNR floors (dB) against the bf16 grouped_mm path, for outputs and gradients of one experts call (two
# grouped GEMMs and a gate in FP8: each GEMM's quantization noise is ~28-30 dB for blockwise and rowwise e4m3,
# ~3 dB less with MX's power-of-two scales).
FLOOR = {"blockwise": 20.0, "rowwise": 20.0, "mxfp8": 17.0}


def gpu_experts(kind, dtype=torch.bfloat16, device="cuda"):
    return experts_of(model(kind, device=device, dtype=dtype))[0]


DEVICES = [pytest.param("cpu", id="host"), pytest.param("cuda", marks=needs_gpu, id="gpu")]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", hx.registered())
@pytest.mark.parametrize("kind", MODELS)
def test_experts_against_bf16_grouped_mm(kind, recipe, device):
    """One experts call, forward and backward, against the bf16 grouped_mm path: the output and the gradients of
    the hidden states, the routing weights and every parameter (host: the emulator, a few tokens)."""
    e = gpu_experts(kind, device=device)
    g = torch.Generator().manual_seed(seed(f"experts {kind} {recipe} {device}"))
    t = 1000 if device == "cuda" else 96
    idx, w = routing(t, e.num_experts, 2, g, device, sentinel_rows=5, empty=(2,))
    args = [torch.randn(t, 256, generator=g).to(device).bfloat16(), idx, w.bfloat16()]
    dy = torch.randn(t, 256, generator=g).to(device).bfloat16()
    got = grads(e, args, dy, f"scalemm_{recipe}")
    assert hx.experts_status(e) == (f"scalemm_{recipe}", None)
    want = grads(e, args, dy, "grouped_mm")
    report = {n: sqnr(want[n], got[n]) for n in want}
    print(f"HF EXPERTS {kind} {recipe} {device}: SQNR " + ", ".join(f"{n} {s:.1f}" for n, s in report.items()))
    for name, s in report.items():
        assert s >= FLOOR[recipe], (name, s)
        assert got[name].dtype == want[name].dtype, name
    assert torch.count_nonzero(got["down_proj"][2]) == 0 and torch.count_nonzero(got["gate_up_proj"][2]) == 0
    assert torch.count_nonzero(got["out"][-5:]) == 0 and torch.count_nonzero(got["hidden_states"][-5:]) == 0


@needs_gpu
@pytest.mark.parametrize("kind", ["mixtral", "gpt_oss"])
def test_experts_step_replays_bit_identically_in_a_cuda_graph(kind):
    """The experts' forward and backward captured once; replays with new routing in the captured buffers give
    the eager call's bits (outputs and every gradient)."""
    e = gpu_experts(kind)
    e.config._experts_implementation = "scalemm_blockwise"
    g = torch.Generator().manual_seed(seed(f"graph {kind}"))
    t = 512
    idx, w = routing(t, e.num_experts, 2, g, "cuda", sentinel_rows=4)
    x = torch.randn(t, 256, generator=g).cuda().bfloat16().requires_grad_()
    w = w.bfloat16().requires_grad_()
    dy = torch.randn(t, 256, generator=g).cuda().bfloat16()
    params = list(e.parameters())

    def step():
        out = e(x, idx, w)
        return [out, *torch.autograd.grad(out, [x, w, *params], dy)]

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=s):
            captured = step()
    torch.cuda.current_stream().wait_stream(s)
    for trial in range(3):
        idx.copy_(routing(t, e.num_experts, 2, g, "cuda", sentinel_rows=4 * trial, empty=(trial,))[0])
        graph.replay()
        replayed = [c.clone() for c in captured]
        eager = step()
        torch.cuda.synchronize()
        assert all(torch.equal(a, b) for a, b in zip(replayed, eager)), trial


@needs_gpu
@pytest.mark.parametrize("kind", ["mixtral", "gpt_oss"])
def test_model_compiles_fullgraph_with_scalemm_experts(kind):
    m = model(kind, "scalemm_blockwise", device="cuda", dtype=torch.bfloat16)
    x = torch.randint(0, 256, (2, 128), device="cuda")
    eager = m(x).logits
    f = torch.compile(m, fullgraph=True)
    out = f(x).logits
    out.float().square().mean().backward()
    assert sqnr(eager, out) >= 30, sqnr(eager, out)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters() if p.requires_grad)


@needs_gpu
@pytest.mark.parametrize("kind", ["qwen2_moe", "deepseek_v3"])
def test_moe_block_step_does_not_sync(kind):
    """Router, experts (and shared experts), backward and a fused AdamW step with no host synchronization."""
    m = model(kind, "scalemm_blockwise", device="cuda", dtype=torch.bfloat16)
    block = m.model.layers[0].mlp
    opt = torch.optim.AdamW(block.parameters(), lr=1e-4, fused=True)
    x = torch.randn(2, 256, 256, device="cuda", dtype=torch.bfloat16)

    def step():
        out = block(x)
        out = out[0] if isinstance(out, tuple) else out
        out.float().square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    run_without_syncs(step)


@needs_gpu
@pytest.mark.parametrize("kind", MODELS)
def test_model_training_step_against_bf16(kind):
    """A whole model's loss and logits with scalemm experts near the bf16 grouped_mm model's (the second layer's
    routing can differ for near-tied tokens, hence a lower floor than the experts' own)."""
    ref = model(kind, "grouped_mm", device="cuda", dtype=torch.bfloat16)
    m = copy.deepcopy(ref)
    st.convert_to_float8(m, recipe="blockwise")
    assert all(hx.experts_status(e) in (None, ("scalemm_blockwise", None)) for e in experts_of(m))
    x = torch.randint(0, 256, (2, 128), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    a, b = ref(x, labels=x), m(x, labels=x)
    a.loss.backward()
    b.loss.backward()
    assert all(hx.experts_status(e) == ("scalemm_blockwise", None) for e in experts_of(m))
    print(f"HF MODEL {kind}: loss bf16 {a.loss.item():.4f}, scalemm {b.loss.item():.4f}, logits SQNR "
          f"{sqnr(a.logits, b.logits):.1f} dB")
    assert abs(a.loss.item() - b.loss.item()) <= 0.02 * abs(a.loss.item())
    assert sqnr(a.logits, b.logits) >= 15
