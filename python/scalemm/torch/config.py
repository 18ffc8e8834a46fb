"""The layers' options and the recipe sets they take (a leaf: nothing here calls torch).

Float8LinearConfig names a Float8Linear's seven options and their defaults; the layer's class attributes
are those defaults, so that setting one on a layer (`layer.keep_saved = True`) or on a class
(`Float8Linear.cache_weight = True`) works as before, and `layer.config` is what its forward reads.
"""

from __future__ import annotations

import dataclasses
from typing import Tuple

from .. import _core

# The recipes a layer runs: (activations and gradients, weights). Rowwise and tensorwise run the
# forward GEMM with fast accumulation (their convention in torch and torchao: the output tolerates it,
# the gradients do not) and dgrad and wgrad exactly; block recipes accumulate exactly everywhere.
LINEAR_RECIPES = {"blockwise": ("block1x128", "block128x128"), "rowwise": ("rowwise", "rowwise"),
                  "tensorwise": ("tensorwise", "tensorwise"), "mxfp8": ("mxfp8", "mxfp8-32x32")}
_FAST_ACCUM_RECIPES = ("rowwise", "tensorwise")
# Feature counts a recipe's three GEMMs take: each is the K of one GEMM (in: forward, out: dgrad) and a
# row count of another, and cuBLASLt's FP8 kernels want K in multiples of 16; MX blocks are 32 wide.
_FEATURE_MULTIPLE = {"blockwise": 16, "rowwise": 16, "tensorwise": 16, "mxfp8": 32}

# Recipes whose weight can travel in FP8: each block of the weight lies within one shard when the shard
# rows are a multiple of the block, so quantizing a shard gives the bytes of quantizing the whole weight,
# and the dgrad operand (W along N) is the exact transpose of the gathered blocks. Rowwise weights need
# a scale per column of W for dgrad (not derivable from the gathered rows) and tensorwise an amax all-
# reduce before quantizing: those stay bf16 all-gathers.
_FSDP_FP8_BLOCK = {"blockwise": 128, "mxfp8": 128}  # shard rows: 128 for both (mxfp8-32x32's 128x4 tiles)

_EXPERT_RECIPES = {"blockwise": ("block1x128", "block128x128")}  # Float8GroupedExperts
_MLP_ACTIVATIONS = ("gelu_tanh", "swiglu")  # Float8MLP: GELU between two projections, or SwiGLU's three
_MLP_RECIPES = ("blockwise", "mxfp8")  # activations in 1D blocks: the fused quantizer's recipes

# module_filter="auto" (docs/python.md, "Training with scalemm"; numbers from python/benchmarks/training.py,
# H100, eager): FP8 pays a fixed cost per GEMM (quantizing both operands, host work) that a small GEMM
# does not earn back. MLP blocks measured faster than bf16 at 2*M*N*K = 962 and 481 GFLOP per GEMM and
# slower at 137 GFLOP (1.66 against 1.40 ms a step). So "auto" leaves layers with fewer than
# AUTO_MIN_FEATURES inputs or outputs in bf16, and converted layers run a call in FP8 only when its GEMMs
# reach AUTO_MIN_GFLOP (the token count is known per call), else through F.linear in the weight's dtype.
AUTO_MIN_FEATURES = 1024
AUTO_MIN_GFLOP = 256.0


def _recipe_name(recipe) -> str:
    if recipe not in LINEAR_RECIPES:
        raise _core.invalid("recipe", "a training recipe", ", ".join(f'"{r}"' for r in LINEAR_RECIPES), repr(recipe),
                            "Pick one of the names; each sets both the activation and the weight recipe.")
    return recipe


@dataclasses.dataclass(frozen=True)
class Float8LinearConfig:
    """A Float8Linear's options, as one value (layer.config). Each field is also a class attribute of
    Float8Linear, with the default below, that a layer or a subclass may override."""

    recipe: str = "blockwise"  # a LINEAR_RECIPES name: the activation and the weight recipe
    scale_format: str = "cublaslt"  # the quantizers write cuBLASLt's scale layout ("compact": the same products)
    cache_weight: bool = False  # keep the forward's weight quantization until the next optimizer step
    min_gflop: float = 0.0  # calls whose GEMMs are smaller run F.linear in the weight's dtype (convert "auto")
    fast_accum: bool = True  # rowwise, tensorwise: fast accumulation in the forward GEMM (False: exact everywhere)
    keep_saved: bool = False  # True: keep X^T's FP8 copy until the graph is freed (a second backward, retain_graph)
    power_of_two_scales: bool = False  # every scale a power of two (amax-pow2; TE's Float8BlockScaling constraint)

    @property
    def recipes(self) -> Tuple[str, str]:
        """(activation recipe, weight recipe)."""
        return LINEAR_RECIPES[self.recipe]

    @property
    def forward_fast_accum(self) -> bool:
        """Whether the forward GEMM accumulates fast: asked for, and the recipe's convention."""
        return self.fast_accum and self.recipe in _FAST_ACCUM_RECIPES


DEFAULTS = Float8LinearConfig()
