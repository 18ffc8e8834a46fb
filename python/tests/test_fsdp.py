"""FSDP2 with FP8 weight all-gathers (convert_to_float8(..., fsdp_float8_all_gather=True)).

Host: which recipes take it, the wrapper surviving FSDP2's sharding ops, the padded high-precision
fallback. GPU: two shards quantized apart and gathered are the bytes of the whole weight, and a layer
running on the gathered weight gives the plain layer's output and gradients bit for bit; FSDP2 itself
on a one-rank NCCL group (which gathers nothing) trains the wrapped model exactly like the unsharded
one. The FP8 all-gather through FSDP2 runs on two GPUs: python/benchmarks/distributed.py fsdp2-fp8."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

import scalemm  # noqa: E402
import scalemm.torch as st  # noqa: E402
from oracle import seed  # noqa: E402

GPU = torch.cuda.is_available() and scalemm.has_gpu()
needs_gpu = pytest.mark.skipif(not GPU, reason="no usable CUDA device (torch.cuda.is_available() = "
                               f"{torch.cuda.is_available()}, scalemm: {scalemm.device()})")


class Mesh:
    """What fsdp_pre_all_gather asks of FSDP2's mesh."""

    def __init__(self, n):
        self.n = n

    def size(self):
        return self.n


class Policy:
    param_dtype = None


def model(device, dtype=torch.bfloat16):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(384, 512, bias=False), torch.nn.GELU(),
                               torch.nn.Linear(512, 256, bias=False)).to(device, dtype)


@pytest.mark.parametrize("recipe", ["blockwise", "mxfp8"])
def test_convert_wraps_the_weights_and_the_report_says_so(recipe):
    m = model("cpu")
    w0 = m[0].weight.detach().clone()
    st.convert_to_float8(m, recipe=recipe, fsdp_float8_all_gather=True)
    assert isinstance(m[0].weight, st.Float8AllGatherWeight) and isinstance(m[0].weight, torch.nn.Parameter)
    assert m[0].weight.requires_grad and m[0].weight.dtype == torch.bfloat16
    assert torch.equal(m[0].weight._tensor, w0)  # the values kept
    assert all("FSDP2 all-gathers its weight in FP8" in r["reason"] for r in st.conversion_report(m))


@pytest.mark.parametrize("recipe", ["rowwise", "tensorwise"])
def test_recipes_whose_weights_cannot_travel_in_fp8_are_refused_by_name(recipe):
    with pytest.raises(scalemm.InvalidArgumentError, match="fsdp_float8_all_gather"):
        st.convert_to_float8(model("meta"), recipe=recipe, fsdp_float8_all_gather=True)


def test_sharding_ops_keep_the_wrapper_and_uneven_shards_gather_padded_high_precision():
    w = torch.randn(300, 256)
    p = st.Float8AllGatherWeight(w, "blockwise")
    # What FSDP2 does to shard a parameter: a padded zero buffer, a narrowed copy, a flat view.
    pad = p.new_zeros((150, 256))
    assert isinstance(pad, st.Float8AllGatherWeight)
    shard = pad.narrow(0, 0, 150)
    shard.copy_(w[150:])
    assert isinstance(shard, st.Float8AllGatherWeight) and isinstance(pad.view(-1), st.Float8AllGatherWeight)
    assert torch.equal(pad._tensor, w[150:])
    assert not isinstance(p + 1, st.Float8AllGatherWeight)  # arithmetic: a plain tensor
    # 300 rows over 2 shards: 150 rows each, not a multiple of 128 -> the wrapped dtype, padded.
    small = st.Float8AllGatherWeight(w[:140], "blockwise")
    inputs, meta = small.fsdp_pre_all_gather(Mesh(2), torch.Size((300, 256)), (256, 1), None, Policy())
    assert meta is None and len(inputs) == 1 and inputs[0].shape == (150, 256) and inputs[0].dtype == torch.float32
    assert torch.equal(inputs[0][:140], w[:140]) and not inputs[0][140:].any()
    out, inner = small.fsdp_post_all_gather((inputs[0],), meta, torch.float32)
    assert out is inputs[0] and inner == (inputs[0],)


def _gathered(w, recipe, shards):
    """The unsharded parameter FSDP2 builds from `shards` FP8 all-gathers of w (concatenated along rows)."""
    pieces = [st.Float8AllGatherWeight(c, recipe).fsdp_pre_all_gather(Mesh(shards), w.shape, w.stride(), None,
                                                                      Policy()) for c in w.chunk(shards)]
    assert all(meta is not None for _, meta in pieces), "expected FP8 all-gather inputs"
    outputs = tuple(torch.cat(parts) for parts in zip(*(inputs for inputs, _ in pieces)))
    g, inner = st.Float8AllGatherWeight(w.chunk(shards)[0], recipe).fsdp_post_all_gather(outputs, pieces[0][1], w.dtype)
    assert inner == outputs
    g = torch.as_strided(g, w.shape, w.stride(), storage_offset=0)  # as FSDP2 does
    return torch.nn.Parameter(g), outputs


@needs_gpu
@pytest.mark.parametrize("fmt", ["cublaslt", "compact"])
@pytest.mark.parametrize("recipe", ["blockwise", "mxfp8"])
def test_fp8_gathered_weight_gives_the_plain_layers_bits(recipe, fmt):
    g = torch.Generator().manual_seed(seed(f"fsdp {recipe} {fmt}"))
    w = torch.randn(512, 384, generator=g).cuda().to(torch.bfloat16) * 0.05
    _, wgt = st.LINEAR_RECIPES[recipe]
    param, (data, scales) = _gathered(w, recipe, shards=2)
    # Two shards quantized apart are the whole weight's bytes.
    whole = st.quantize(w, wgt)
    assert torch.equal(data.view(torch.uint8), whole[0].view(torch.uint8))
    assert torch.equal(scales.view(torch.uint8), whole[1].view(torch.uint8))
    assert param.shape == w.shape and param.dtype == torch.bfloat16 and param.requires_grad
    # Other ops see the dequantized weight.
    deq = scalemm.dequantize(data, scales, wgt, out_dtype="bf16")
    assert torch.equal(param * 1, deq)
    # The layer on the gathered weight against the plain layer: output, dX and dW bit for bit.
    x = torch.randn(264, 384, generator=g).cuda().to(torch.bfloat16)
    dy = torch.randn(264, 512, generator=g).cuda().to(torch.bfloat16)
    plain = st.Float8Linear.from_linear(torch.nn.Linear(384, 512, bias=False, device="cuda", dtype=torch.bfloat16),
                                        recipe=recipe)
    plain.weight = torch.nn.Parameter(w.clone())
    plain.scale_format = fmt
    gathered = st.Float8Linear(384, 512, bias=False, device="cuda", dtype=torch.bfloat16, recipe=recipe)
    gathered.weight = param
    gathered.scale_format = fmt
    outs = []
    for layer in (plain, gathered):
        xi = x.clone().requires_grad_()
        y = layer(xi)
        y.backward(dy)
        outs.append((y, xi.grad, layer.weight.grad))
    for name, a, b in zip(("y", "dx", "dw"), *outs):
        assert type(b) is torch.Tensor and b.dtype == torch.bfloat16, name
        assert torch.equal(a, b), f"{name} differs between the plain and the FP8-gathered weight"


@needs_gpu
@pytest.mark.parametrize("recipe", ["blockwise", "mxfp8"])
def test_fully_shard_on_one_rank_trains_like_the_unsharded_model(recipe, tmp_path):
    """One rank: FSDP2's shortcut copies the shard (its first all-gather input) without communicating,
    so the wrapper hands it the high-precision shard; the layer quantizes it as an unwrapped one does."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=torch.device("cuda", 0))
    try:
        ref = st.convert_to_float8(model("cuda"), recipe=recipe)
        m = st.convert_to_float8(model("cuda"), recipe=recipe, fsdp_float8_all_gather=True)
        for layer in (m[0], m[2]):
            fully_shard(layer)
        fully_shard(m)
        seen = []
        for layer in (m[0], m[2]):
            layer.register_forward_pre_hook(lambda mod, args: seen.append(type(mod.weight).__name__))
        assert "FSDP2 all-gathers its weight in FP8" in st.conversion_report(m)[0]["reason"]
        opts = [torch.optim.SGD(x.parameters(), lr=0.5, momentum=0.9, foreach=True) for x in (ref, m)]
        x = torch.randn(256, 384, device="cuda", dtype=torch.bfloat16)
        for step in range(3):
            losses = []
            for net, opt in zip((ref, m), opts):
                loss = net(x).float().square().mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
                losses.append(loss.detach())
            assert torch.equal(*losses), f"step {step}: {losses[0].item()} against {losses[1].item()}"
        assert len(seen) == 6 and "_GatheredFloat8Weight" not in seen
        assert isinstance(m[0].weight._local_tensor, st.Float8AllGatherWeight)  # resharded after the step
    finally:
        dist.destroy_process_group()
