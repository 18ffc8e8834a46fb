"""PyTorch integration: custom ops with fake implementations, and FP8 linear layers with autograd.

    torch.ops.scalemm.scaled_mm     D = A B^T (what scalemm.scaled_mm runs for torch tensors under
                                    torch.compile; eager calls skip the dispatcher for speed)
    torch.ops.scalemm.scaled_grouped_mm
                                    the grouped (MoE) GEMM, group sizes as a list of ints in the graph
    torch.ops.scalemm.quantize      (data, scales, data_t, scales_t) of a (rows, K) tensor, FP8 recipes
    torch.ops.scalemm.quantize_nvfp4
                                    (data, scales, global, data_t, scales_t) for nvfp4
    Float8Linear                    nn.Linear in FP8 for one recipe: blockwise, rowwise, tensorwise, mxfp8
    Float8BlockwiseLinear, MXLinear Float8Linear with the recipe fixed (blockwise, mxfp8)
    Float8GroupedExperts            MoE experts (E, out, in) in blockwise FP8, group sizes on host or device
    convert_to_float8, conversion_report
                                    swap a model's nn.Linear layers in place, and say what became of each
    Float8AllGatherWeight           a layer weight that FSDP2 all-gathers in FP8 (convert_to_float8(...,
                                    fsdp_float8_all_gather=True))

Every op runs on its tensors' device and that device's current stream.

The fake implementations compute output shapes from the scale-layout contract, so
torch.compile(fullgraph=True) traces models that use these without graph breaks. Every call runs on
torch's current CUDA stream and allocates through torch, so CUDA-graph capture works once each shape
has run on the capture stream (the library allocates per-stream workspaces on first use; a call new
to a capturing stream raises UnsupportedError instead of breaking the capture).

The package, one concern per module (each imports only the ones before it; docs/python.md, "Package layout"):

    config       the recipe sets, the auto-filter constants and Float8LinearConfig (a leaf)
    _runtime     streams, tracing checks, dtype names, the bounded LRU of the prepared calls
    ops          the GEMM custom ops and their fakes, and the eager prepared paths
    quantizers   the quantizer custom ops (FP8, nvfp4, MoE tokens) and their fast path
    activations  the quantizers with GELU or SwiGLU fused in
    _autograd    what the layers' autograd functions share
    fsdp         FSDP2's FP8 weight all-gather
    linear       Float8Linear and its recipes' subclasses
    convert      convert_to_float8 and conversion_report
    experts      Float8GroupedExperts (above _autograd, beside linear)
    moe_ops      the MoE routing, gather-quantize and combine custom ops (fused kernels, torch fallbacks)
    moe          experts_forward: FP8 experts from transformers' experts arguments (above moe_ops)
    hf_experts   the "scalemm_<recipe>" experts registered in transformers' ExpertsInterface (above moe)
    ep           ExpertParallelExperts: expert parallelism with FP8 token dispatch (above experts)
    mlp          Float8MLP (above _autograd and fsdp)
"""

from .activations import quantize_activation, quantize_swiglu
from .config import AUTO_MIN_FEATURES, AUTO_MIN_GFLOP, LINEAR_RECIPES
from .convert import ConversionReport, conversion_report, convert_to_float8
from .experts import Float8GroupedExperts
from .moe import experts_forward
from .fsdp import Float8AllGatherWeight
from .linear import Float8BlockwiseLinear, Float8Linear, MXLinear
from .mlp import Float8MLP
from .ops import scaled_grouped_mm, scaled_mm
from .quantizers import quantize
from .ep import ExpertParallelExperts

__all__ = ["scaled_mm", "scaled_grouped_mm", "quantize", "quantize_activation", "quantize_swiglu", "Float8MLP",
           "Float8Linear", "Float8BlockwiseLinear", "MXLinear", "Float8GroupedExperts", "convert_to_float8",
           "conversion_report", "ConversionReport", "Float8AllGatherWeight", "LINEAR_RECIPES", "AUTO_MIN_FEATURES",
           "AUTO_MIN_GFLOP", "experts_forward", "ExpertParallelExperts"]
