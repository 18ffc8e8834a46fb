"""transformers' MoE experts on scalemm's FP8 experts engine (scalemm.torch.moe.experts_forward).

transformers 5.x runs a model's experts (3D parameters: gate_up_proj (E, 2I, H), down_proj (E, H, I)) through
its experts registry, transformers.integrations.moe.ExpertsInterface. Once scalemm.torch and that module are
both imported, in either order, the registry has "scalemm_<recipe>" for every recipe of RECIPES that the engine
runs: "scalemm_blockwise" (activations and gradients 1x128, weights 128x128), "scalemm_rowwise" (a scale per
row; wgrad's operands a scale per feature over every token) and "scalemm_mxfp8" (1x32 E8M0 blocks, weights
32x32). rowwise and mxfp8 read the call's group sizes back to the host once per call, where the library's
grouped backends for them need host sizes (scalemm.torch.moe.HOST_SIZES_REASON; blockwise never does). A
recipe the engine does not run is not registered (asking for it is transformers' error listing the valid
names) and unregistered() says why. The names are selected with from_pretrained(..., experts_implementation="scalemm_blockwise"), from_config(cfg,
experts_implementation=...) or model.set_experts_implementation(...). Each trains the module's own bf16/fp32
parameters (forward, dgrad and wgrad in FP8). scalemm never imports transformers: if its experts module is
already loaded the names are registered at once, otherwise a one-shot import hook registers them right after
it executes, and removes itself.

A module whose shapes, dtype or device the recipe cannot take runs transformers' own grouped_mm instead, with
the reason on the module (experts_status(module)) and one warning per module. As in the rest of scalemm.torch,
CPU tensors run through the library's host emulator. A pre-quantized FP8 checkpoint's experts (finegrained FP8:
FP8 weights, no master weights) cannot train: the same names in its FP8ExpertsInterface refuse by name and say
how to load the checkpoint in bf16.
"""

from __future__ import annotations

import sys
import warnings

import torch

from .. import _core
from .._errors import UnsupportedError
from . import moe

RECIPES = ("blockwise", "rowwise", "mxfp8")  # the experts implementations, each registered where the engine runs it
# Features (H and I) the engine takes: each is the K of one grouped GEMM and the N of another, and the weights
# are quantized in whole 128x128 blocks.
FEATURE_MULTIPLE = 128
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_MOE = "transformers.integrations.moe"
_FP8 = "transformers.integrations.finegrained_fp8"


# ---- the adaptation: module -> engine arguments ---------------------------------------------------------

def _moe():
    return sys.modules[_MOE]


def _up(m):
    """(weight, bias) of the first projection: gate_up_proj for gated experts, up_proj otherwise."""
    name = "gate_up_proj" if m.has_gate else "up_proj"
    return getattr(m, name), (getattr(m, name + "_bias") if m.has_bias else None)


def _default_gate(m) -> bool:
    gate = m.__dict__.get("_apply_gate") or getattr(type(m), "_apply_gate", None)
    return gate is _moe()._default_apply_gate


def _is_silu(act) -> bool:
    return isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"


def _fused(m) -> bool:
    """Whether the engine's own SiLU(gate) * up runs: the module's gate is transformers' default (chunk into
    gate and up, act_fn(gate) * up) and its act_fn is SiLU. Any other gate runs unfused through apply_gate."""
    return m.has_gate and _default_gate(m) and _is_silu(m.act_fn)


def concatenated(t: torch.Tensor, axis: int) -> torch.Tensor:
    """Interleaved gate/up features [g0, u0, g1, u1, ...] along `axis` reordered as [g0, g1, ..., u0, u1, ...].
    A reshape of a permuted view: autograd maps the gradient back to the interleaved parameter."""
    axis %= t.dim()
    shape = list(t.shape)
    half = shape[axis] // 2
    pairs = t.reshape(shape[:axis] + [half, 2] + shape[axis + 1:])
    return pairs.transpose(axis, axis + 1).reshape(shape)


def ineligible(m, recipe: str):
    """Why `recipe` cannot run experts module `m` (its parameters' shapes, dtype, device), or None."""
    w, _ = _up(m)
    d = m.down_proj
    if m.is_transposed:  # (E, H, N) and (E, I, H)
        hidden, inter = w.shape[1], d.shape[1]
    else:  # (E, N, H) and (E, H, I)
        hidden, inter = w.shape[2], d.shape[2]
    if not m.has_gate:
        return "experts without a gate (up_proj): the engine runs gated experts (gate_up_proj, [gate | up])"
    mult = FEATURE_MULTIPLE
    for name, v in (("hidden size", hidden), ("intermediate size", inter)):
        if v % mult:
            return (f"{name} {v} is not a multiple of {mult} ({recipe}: each feature count is the K of one of the "
                    f"experts' GEMMs)")
    if w.dtype not in _DTYPES or d.dtype not in _DTYPES:
        return f"weight dtype {w.dtype} (the FP8 experts train bf16, f16 or f32 master weights)"
    if w.device.type not in ("cuda", "cpu"):
        return f"parameters on {w.device} (scalemm runs CUDA devices, and the CPU through its emulator)"
    return None


def _status(m, name: str, reason, fallback: bool):
    """Record on the module what its experts call runs; warn once per module and reason where the recipe
    cannot take it (fallback), not where convert_to_float8's filter chose bf16."""
    if torch.compiler.is_compiling() or getattr(m, "_scalemm_experts", None) == (name, reason):
        return
    m._scalemm_experts = (name, reason)
    if fallback:
        warnings.warn(f"{type(m).__name__}: experts_implementation={name!r} runs transformers' grouped_mm in "
                      f"{m.down_proj.dtype} for this module: {reason}", stacklevel=3)


def power_of_two_scales(m) -> bool:
    """Whether an experts module runs power-of-two scales (convert_to_float8(..., power_of_two_scales=True),
    or set_power_of_two_scales)."""
    return bool(getattr(m, "_scalemm_power_of_two_scales", False))


def set_power_of_two_scales(m, value: bool = True) -> None:
    """Every scale of the experts module's calls a power of two (the engine's power_of_two_scales)."""
    if not is_experts(m):
        raise _core.invalid("module", "an experts module of transformers' registry", "a module with "
                            "gate_up_proj/down_proj decorated with use_experts_implementation", type(m).__name__)
    m._scalemm_power_of_two_scales = bool(value)


def experts_status(m):
    """(implementation asked, reason it runs grouped_mm instead or None) of an experts module's last call."""
    return getattr(m, "_scalemm_experts", None)


def engine_recipes():
    """The recipes scalemm's experts engine (scalemm.torch.moe) runs."""
    return tuple(moe.RECIPES)


def _engine():
    return moe.experts_forward


class _Gate:
    """A gate as a callable object: dynamo takes the truth value of an object, not of a bound method or of a
    function made while tracing (a graph break under fullgraph)."""

    __slots__ = ("fn",)

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, up):
        return self.fn(up)


def run(m, hidden_states, top_k_index, top_k_weights, recipe: str):
    """One experts call of module `m` in `recipe`, or transformers' grouped_mm with a recorded reason."""
    name = f"scalemm_{recipe}"
    chosen = getattr(m, "_scalemm_not_converted", None)
    reason = chosen or ineligible(m, recipe)
    if reason is not None:  # chosen: convert_to_float8's module_filter kept it in bf16
        _status(m, name, reason, fallback=chosen is None)
        return _moe().grouped_mm_experts_forward(m, hidden_states, top_k_index, top_k_weights)
    _status(m, name, None, False)
    w, b = _up(m)
    apply_gate = None
    if m.has_gate and not m.is_concatenated and _default_gate(m):
        # Declared interleaved, gated by the default chunk: the engine's layout is [gate; up] halves.
        axis = -1 if m.is_transposed else 1
        w = concatenated(w, axis)
        b = concatenated(b, -1) if b is not None else None
    if not _fused(m):
        # The module's own gate (GPT-OSS's clamped one reads its interleaved layout itself) or activation.
        apply_gate = _Gate(m._apply_gate if m.has_gate else m.act_fn)
    return _engine()(hidden_states, top_k_index, top_k_weights, w, m.down_proj, num_experts=m.num_experts,
                     recipe=recipe, apply_gate=apply_gate, gate_up_bias=b,
                     down_bias=m.down_proj_bias if m.has_bias else None, is_transposed=m.is_transposed,
                     power_of_two_scales=power_of_two_scales(m))


# ---- module_filter="auto" --------------------------------------------------------------------------------

# "auto" converts the experts only where python/benchmarks/moe.py measured them faster than transformers'
# bf16 grouped_mm (H200, one layer forward + backward; docs/python.md): blockwise at every shape it ran (1.66x
# at DeepSeek-V3's, 1.21x at Mixtral's, 1.26x at Qwen3-30B-A3B's H 2048, I 768, whose first grouped GEMM is
# 206 GFLOP), so no size rule for it; rowwise nowhere (1.00x, 0.67x, 0.42x: its wgrad takes host sizes and
# runs per group); mxfp8 nowhere on Hopper (the exact emulation). Those two keep grouped_mm under "auto".
AUTO_SLOWER = {
    "rowwise": "auto: rowwise experts measured slower than bf16 grouped_mm (0.67x at Mixtral's shape, 0.42x at "
               "Qwen3-30B-A3B's, 1.00x at DeepSeek-V3's; H200); recipe=\"blockwise\" converts them",
    "mxfp8": "auto: mxfp8 experts run the exact emulation on this GPU, slower than bf16 grouped_mm; "
             "recipe=\"blockwise\" converts them",
}


def _auto_reason(recipe):
    if recipe == "mxfp8" and torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 10:
        return None  # native MX GEMMs: not measured slower
    return AUTO_SLOWER.get(recipe)


def _features(m):
    w, _ = _up(m)
    return (w.shape[1], m.down_proj.shape[1]) if m.is_transposed else (w.shape[2], m.down_proj.shape[2])


# ---- registration ----------------------------------------------------------------------------------------

def _implementation(recipe: str):
    def experts_forward(self, hidden_states, top_k_index, top_k_weights):
        return run(self, hidden_states, top_k_index, top_k_weights, recipe)

    experts_forward.__name__ = experts_forward.__qualname__ = f"scalemm_{recipe}_experts_forward"
    return experts_forward


def _refuse_prequantized(name: str):
    def experts_forward(self, hidden_states, top_k_index, top_k_weights):
        raise UnsupportedError(
            f"experts_implementation={name!r} on {type(self).__name__}: this model's experts were loaded from a "
            f"pre-quantized FP8 checkpoint (FP8 weights and their scales, no high-precision master weights), which "
            f"scalemm's experts do not train. Load it with quantization_config=FineGrainedFP8Config(dequantize=True) "
            f"for bf16 experts, which take {name!r}.")

    experts_forward.__name__ = experts_forward.__qualname__ = f"{name}_prequantized_refused"
    return experts_forward


_REGISTER = {_MOE: "ExpertsInterface", _FP8: "FP8ExpertsInterface"}
_unregistered = {}


def registered():
    """The recipes whose "scalemm_<recipe>" experts transformers gets: those of RECIPES the engine runs."""
    runs = engine_recipes()
    _unregistered.clear()
    for r in RECIPES:
        if r not in runs:
            _unregistered[r] = f"scalemm's experts engine runs {', '.join(runs)}; not {r} yet"
    return tuple(r for r in RECIPES if r in runs)


def unregistered():
    """{recipe: why its "scalemm_<recipe>" experts are not registered} (empty when the engine runs them all)."""
    registered()
    return dict(_unregistered)


def _register(module_name: str) -> None:
    interface = getattr(sys.modules.get(module_name), _REGISTER[module_name], None)
    if interface is None:  # a transformers without this interface: nothing to register in
        return
    for recipe in registered():
        name = f"scalemm_{recipe}"
        interface.register(name, _implementation(recipe) if module_name == _MOE else _refuse_prequantized(name))


class _Loader:
    """The module's own loader, registering the experts right after the module executes."""

    def __init__(self, loader, hook):
        self._loader, self._hook = loader, hook

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def exec_module(self, module):
        self._loader.exec_module(module)
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        self._hook.loaded(module.__name__)


class _ImportHook:
    """sys.meta_path finder for the transformers modules not yet imported; it finds nothing itself (the
    other finders do) and leaves sys.meta_path once every module it waits for is registered."""

    def __init__(self, names):
        self.pending = set(names)

    def find_spec(self, name, path=None, target=None):
        if name not in self.pending:
            return None
        for finder in list(sys.meta_path):
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None  # the usual import proceeds; nothing registered (no way to run after it)
        spec.loader = _Loader(spec.loader, self)
        return spec

    def loaded(self, name):
        self.pending.discard(name)
        try:
            _register(name)
        finally:
            if not self.pending:
                self.remove()

    def remove(self):
        while self in sys.meta_path:
            sys.meta_path.remove(self)


def install() -> None:
    """Register the scalemm experts in transformers' interfaces now where they are imported, and when they
    are imported otherwise."""
    for hook in [f for f in sys.meta_path if isinstance(f, _ImportHook)]:
        hook.remove()
    waiting = []
    for name in _REGISTER:
        if name in sys.modules:
            _register(name)
        else:
            waiting.append(name)
    if waiting:
        sys.meta_path.insert(0, _ImportHook(waiting))


# ---- conversion ------------------------------------------------------------------------------------------

def is_experts(m) -> bool:
    """Whether `m` is an experts module of transformers' registry (decorated with use_experts_implementation)."""
    return (_MOE in sys.modules and hasattr(m, "is_concatenated") and hasattr(m, "down_proj")
            and hasattr(getattr(m, "config", None), "_experts_implementation"))


def convert_experts(model, recipe: str, module_filter, power_of_two_scales: bool = False) -> int:
    """Set every experts module of a transformers `model` to "scalemm_<recipe>" (convert_to_float8's part for
    experts), with power-of-two scales if asked. Modules the filter leaves out keep the name but run
    grouped_mm, with the reason on the module; "auto" takes them for the recipes measured faster (above). Returns how many
    experts modules were found."""
    found = [(fqn, m) for fqn, m in model.named_modules() if is_experts(m)]
    if not found:
        return 0
    for _, m in found:
        m._scalemm_power_of_two_scales = bool(power_of_two_scales)
    why = None
    if recipe not in registered():
        why = _unregistered.get(recipe) or f"no scalemm experts for recipe {recipe!r} (they take {', '.join(RECIPES)})"
    elif any(_up(m)[0].element_size() == 1 for _, m in found):
        why = ("pre-quantized FP8 experts (no master weights to train); load with "
               "FineGrainedFP8Config(dequantize=True) for bf16 experts")
    if why is not None:
        for _, m in found:
            m._scalemm_not_converted = why
        return len(found)
    name = f"scalemm_{recipe}"
    for fqn, m in found:
        if module_filter == "auto":
            m._scalemm_not_converted = _auto_reason(recipe)
        else:
            chosen = module_filter is None or module_filter(fqn, m)
            m._scalemm_not_converted = None if chosen else "module_filter returned False"
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation(name)
    for _, m in found:  # experts whose config the model's setter does not reach (a bare module, a sub-model)
        if m.config._experts_implementation != name:
            m.config._experts_implementation = name
    return len(found)


def report_rows(model):
    """conversion_report's rows for the experts modules of `model`."""
    rows = []
    for fqn, m in model.named_modules():
        if not is_experts(m):
            continue
        impl = m.config._experts_implementation
        hidden, inter = _features(m)
        recipe = impl[len("scalemm_"):] if impl and impl.startswith("scalemm_") else None
        if recipe is None:
            why = getattr(m, "_scalemm_not_converted", None) or f"experts_implementation={impl!r} (not a scalemm one)"
            now = impl or "grouped_mm"
        else:
            why = getattr(m, "_scalemm_not_converted", None) or ineligible(m, recipe)
            now = "grouped_mm" if why else impl
            why = why or _converted_why(m, recipe)
        rows.append(dict(name=fqn or "(model)", in_features=hidden, out_features=inter,
                         layer=f"{type(m).__name__} ({m.num_experts} experts): {now}",
                         recipe=recipe if now == impl else None, reason=why))
    return rows


def _converted_why(m, recipe):
    gate = "the engine's SiLU(gate) * up" if _fused(m) else "the module's own gate"
    host = moe.HOST_SIZES_REASON.get(recipe)
    pow2 = ", power-of-two scales" if power_of_two_scales(m) else ""
    return f"FP8 {recipe} experts ({gate}{pow2})" + (f"; {host}" if host else "")


install()
