"""Model conversion: convert_to_float8 swaps a model's nn.Linear layers in place for Float8Linear ones (and sets
a transformers model's experts to scalemm's, hf_experts), and conversion_report says what became of each and why."""

from __future__ import annotations

from typing import Optional

import torch

from .. import _core
from . import hf_experts
from ._runtime import _NAMES
from .config import _FEATURE_MULTIPLE, _FSDP_FP8_BLOCK, AUTO_MIN_FEATURES, AUTO_MIN_GFLOP, LINEAR_RECIPES, _recipe_name
from .fsdp import Float8AllGatherWeight
from .linear import Float8Linear


def _ineligible(linear: torch.nn.Linear, recipe: str) -> Optional[str]:
    """Why `recipe` cannot take this layer's shapes, or None."""
    mult = _FEATURE_MULTIPLE[recipe]
    for name in ("in_features", "out_features"):
        v = getattr(linear, name)
        if v % mult:
            return f"{name} = {v} is not a multiple of {mult} ({recipe}: each is the K of one of the three GEMMs)"
    if linear.weight.dtype not in _NAMES:
        return f"weight dtype {linear.weight.dtype} (FP8 layers take bf16, f16 or f32 weights)"
    return None


def _auto_skip(linear: torch.nn.Linear) -> Optional[str]:
    i, o = linear.in_features, linear.out_features
    if min(i, o) < AUTO_MIN_FEATURES:
        return (f"auto: {i} x {o} has fewer than {AUTO_MIN_FEATURES} features on one side; its GEMMs are too small "
                f"to earn back FP8's per-call cost (measured slower than bf16)")
    return None


def convert_to_float8(model: torch.nn.Module, *, recipe: str = "blockwise", module_filter=None,
                      fsdp_float8_all_gather: bool = False, power_of_two_scales: bool = False) -> torch.nn.Module:
    """Swaps every eligible nn.Linear of `model` in place for a Float8Linear of `recipe` ("blockwise",
    "rowwise", "tensorwise" or "mxfp8") holding the same parameters (same device and dtype, not copied),
    and returns the model. A layer whose shapes the recipe cannot take stays nn.Linear.

    module_filter: None (every eligible layer), a callable (fqn, module) -> bool that says which to
    convert, or "auto": skip what was measured slower in FP8 than in bf16: layers with fewer than
    AUTO_MIN_FEATURES inputs or outputs stay nn.Linear, and converted layers run a call in FP8 only when
    its GEMMs reach AUTO_MIN_GFLOP (Float8Linear.min_gflop), else in the weight's dtype.
    conversion_report(model) lists every linear layer, what it became and why.
    The experts modules of a transformers model (its experts registry) are set to "scalemm_<recipe>" where
    scalemm has experts for the recipe; module_filter sees them as well (docs/python.md, "MoE models from
    transformers"); conversion_report lists them too.
    Only exact nn.Linear instances are converted (subclasses may carry behaviour a swap would lose).

    fsdp_float8_all_gather (blockwise and mxfp8): each converted layer's weight becomes a
    Float8AllGatherWeight, so that FSDP2 (fully_shard, applied afterwards) all-gathers the FP8 weight and
    its scales instead of the high-precision shard: about half the bytes of a bf16 all-gather, the same
    products bit for bit. Layers whose shards are not a multiple of 128 rows are gathered as before.

    power_of_two_scales: every scale a power of two (Float8Linear.power_of_two_scales on each converted
    layer, and the experts' power_of_two_scales); not with fsdp_float8_all_gather, whose gathered weights
    carry the default mode's scales."""
    recipe = _recipe_name(recipe)
    pow2 = _core.flag(power_of_two_scales, "power_of_two_scales")
    if pow2 and fsdp_float8_all_gather:
        raise _core.invalid("power_of_two_scales", "power-of-two scales on every operand", "False with "
                            "fsdp_float8_all_gather=True", "True", "The FP8 all-gathered weights carry the default "
                            "mode's scales; gather in bf16 (fsdp_float8_all_gather=False) for power-of-two scales.")
    if fsdp_float8_all_gather and recipe not in _FSDP_FP8_BLOCK:
        raise _core.invalid("fsdp_float8_all_gather", f"FP8 all-gather for recipe {recipe!r}",
                            " or ".join(f'recipe="{r}"' for r in _FSDP_FP8_BLOCK), f'recipe="{recipe}"',
                            "A rowwise weight's dgrad needs a scale per column of W (not in the gathered rows) and a "
                            "tensorwise one an amax over every shard; gather those in bf16 (the default).")
    if not (module_filter is None or module_filter == "auto" or callable(module_filter)):
        raise _core.invalid("module_filter", "which layers to convert", 'None, "auto" or a callable (fqn, module) -> bool',
                            repr(module_filter))
    if not isinstance(model, torch.nn.Module):
        raise _core.invalid("model", "a module to convert", "a torch.nn.Module", type(model).__name__)
    if isinstance(model, torch.nn.Linear) and type(model) is torch.nn.Linear:
        raise _core.invalid("model", "a model that contains linear layers (a bare nn.Linear cannot be swapped in "
                            "place)", "a container module", "nn.Linear", "Use Float8Linear.from_linear(layer, "
                            "recipe=...) instead.")
    swaps = {}  # id(old layer) -> its Float8Linear; decided once per layer, in module order
    for fqn, child in model.named_modules():
        if type(child) is not torch.nn.Linear:
            continue
        reason = _ineligible(child, recipe)
        if reason is None and module_filter == "auto":
            reason = _auto_skip(child)
        elif reason is None and module_filter is not None and not module_filter(fqn, child):
            reason = "module_filter returned False"
        if reason is None:
            swaps[id(child)] = new = Float8Linear.from_linear(child, recipe=recipe)
            if fsdp_float8_all_gather:
                w = child.weight
                new.weight = torch.nn.Parameter(Float8AllGatherWeight(w.data, recipe), requires_grad=w.requires_grad)
            if module_filter == "auto":
                new.min_gflop = AUTO_MIN_GFLOP
            if pow2:
                new.power_of_two_scales = True
        else:
            child._scalemm_not_converted = reason
    for parent in list(model.modules()):  # every place a layer is reachable from (a shared layer too)
        for name, child in list(parent.named_children()):
            if id(child) in swaps:
                setattr(parent, name, swaps[id(child)])
    hf_experts.convert_experts(model, recipe, module_filter, pow2)
    return model


class ConversionReport(list):
    """conversion_report's rows (dicts: name, in_features, out_features, layer, recipe, reason); str() is a table."""

    def __str__(self):
        head = ("layer", "in x out", "is now", "why")
        rows = [(r["name"], f"{r['in_features']} x {r['out_features']}", r["layer"], r["reason"]) for r in self]
        w = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
        line = lambda cells: "  ".join(str(c).ljust(n) for c, n in zip(cells, w)).rstrip()  # noqa: E731
        return "\n".join([line(head), line(["-" * n for n in w])] + [line(r) for r in rows])


def conversion_report(model: torch.nn.Module) -> ConversionReport:
    """Every linear layer of `model` (nn.Linear, Float8Linear and subclasses of both) with what it is now
    and why: converted to which recipe, or the reason convert_to_float8 left it in high precision."""
    out = ConversionReport()
    for name, m in model.named_modules():
        if isinstance(m, Float8Linear):
            act, wgt = LINEAR_RECIPES[m.recipe]
            why = f"FP8 {m.recipe}: activations {act}, weights {wgt}" + (
                ", power-of-two scales" if m.power_of_two_scales else "")
            if m.min_gflop:
                why += f"; calls below {m.min_gflop:g} GFLOP per GEMM run in {m.weight.dtype} (auto)"
            if isinstance(m.weight, Float8AllGatherWeight) or isinstance(getattr(m.weight, "_local_tensor", None),
                                                                         Float8AllGatherWeight):
                why += "; FSDP2 all-gathers its weight in FP8"
            out.append(dict(name=name or "(model)", in_features=m.in_features, out_features=m.out_features,
                            layer=type(m).__name__, recipe=m.recipe, reason=why))
        elif isinstance(m, torch.nn.Linear):
            why = getattr(m, "_scalemm_not_converted", None)
            if why is None:
                why = ("a subclass of nn.Linear: not converted" if type(m) is not torch.nn.Linear
                       else "not converted (convert_to_float8 has not seen it)")
            out.append(dict(name=name or "(model)", in_features=m.in_features, out_features=m.out_features,
                            layer=type(m).__name__, recipe=None, reason=why))
    out.extend(hf_experts.report_rows(model))
    return out

