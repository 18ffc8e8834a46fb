"""Bad inputs raise the named scalemm.Error subclass, carry the status name and the full message, and
write nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import scalemm


def _ops(m=8, n=8, k=256, ra="block1x128", rb="block128x128"):
    rng = np.random.default_rng(1)
    da, sa = scalemm.quantize(rng.standard_normal((m, k)).astype(np.float32), ra)
    db, sb = scalemm.quantize(rng.standard_normal((n, k)).astype(np.float32), rb)
    return da, db, sa, sb


def test_unknown_recipe_lists_the_names():
    da, db, sa, sb = _ops()
    with pytest.raises(scalemm.InvalidArgumentError) as e:
        scalemm.scaled_mm(da, db, sa, sb, recipe_a="blockwise", recipe_b="block128x128")
    assert e.value.status == "SCALEMM_STATUS_INVALID_ARGUMENT"
    assert "recipe_a" in e.value.message and "block1x128" in e.value.message
    assert isinstance(e.value, ValueError)


def test_wrong_scale_shape_is_a_layout_error_naming_the_argument():
    da, db, sa, sb = _ops()
    with pytest.raises(scalemm.InvalidLayoutError) as e:
        scalemm.scaled_mm(da, db, sa, sb[:, :1].copy(), recipe_a="block1x128", recipe_b="block128x128")
    assert e.value.status == "SCALEMM_STATUS_INVALID_LAYOUT"
    assert "scale_b" in str(e.value) and "expected" in str(e.value)


def test_transposed_blockwise_scales_are_caught():
    # The classic silent bug: (L, R) row-major handed over as (R, L) compact.
    da, db, sa, sb = _ops(m=16, k=512)
    bad = np.ascontiguousarray(sa.T).T  # right shape, wrong strides
    with pytest.raises(scalemm.InvalidLayoutError) as e:
        scalemm.scaled_mm(da, db, bad, sb, recipe_a="block1x128", recipe_b="block128x128")
    assert "scale_a" in e.value.message


def test_nan_and_negative_scales_are_caught_on_the_host():
    da, db, sa, sb = _ops()
    bad = sa.copy()
    bad[0, 0] = -1.0
    with pytest.raises(scalemm.Error) as e:
        scalemm.scaled_mm(da, db, bad, sb, recipe_a="block1x128", recipe_b="block128x128")
    assert "f32-scale-non-positive" in e.value.message
    assert "f32-scale-non-positive" in [d.rule for d in scalemm.layouts.check(bad, "block1x128", 8, 256)]


def test_k_mismatch_and_rank():
    da, db, sa, sb = _ops()
    with pytest.raises(scalemm.InvalidArgumentError, match="share K"):
        scalemm.scaled_mm(da, db[:, :128].copy(), sa, sb, recipe_a="block1x128", recipe_b="block128x128")
    with pytest.raises(scalemm.InvalidArgumentError, match="rank 2"):
        scalemm.scaled_mm(da.reshape(-1), db, sa, sb, recipe_a="block1x128", recipe_b="block128x128")


def test_raw_bytes_need_a_dtype():
    da, db, sa, sb = _ops()
    with pytest.raises(scalemm.InvalidArgumentError, match="dtype_a"):
        scalemm.scaled_mm(da.view(np.uint8), db, sa, sb, recipe_a="block1x128", recipe_b="block128x128")
    with pytest.raises(scalemm.InvalidArgumentError, match="dtype_b"):
        scalemm.scaled_mm(da, db, sa, sb, recipe_a="block1x128", recipe_b="block128x128", dtype_b="e5m2")


def test_non_contiguous_data_and_float_data():
    da, db, sa, sb = _ops()
    with pytest.raises(scalemm.InvalidArgumentError, match="contiguous"):
        scalemm.scaled_mm(np.asfortranarray(da), db, sa, sb, recipe_a="block1x128", recipe_b="block128x128")
    with pytest.raises(scalemm.InvalidArgumentError, match="Quantize"):
        scalemm.scaled_mm(np.zeros((8, 256), np.float32), db, sa, sb, recipe_a="block1x128",
                          recipe_b="block128x128")


def test_scale_dtype_and_bad_options():
    da, db, sa, sb = _ops()
    with pytest.raises(scalemm.InvalidArgumentError, match="float32"):
        scalemm.scaled_mm(da, db, sa.astype(np.float16), sb, recipe_a="block1x128", recipe_b="block128x128")
    with pytest.raises(scalemm.InvalidArgumentError, match="out_dtype"):
        scalemm.scaled_mm(da, db, sa, sb, recipe_a="block1x128", recipe_b="block128x128", out_dtype="f64")
    with pytest.raises(scalemm.InvalidArgumentError, match="backend"):
        scalemm.scaled_mm(da, db, sa, sb, recipe_a="block1x128", recipe_b="block128x128", backend="fast")
    with pytest.raises(scalemm.InvalidArgumentError, match="scale_format"):
        scalemm.scaled_mm(da, db, sa, sb, recipe_a="block1x128", recipe_b="block128x128", scale_format="tiled")


def test_native_backend_without_a_gpu_is_unsupported():
    if scalemm.has_gpu():
        pytest.skip("this machine has a GPU: host arrays still cannot run natively, covered by the GPU tests")
    da, db, sa, sb = _ops()
    with pytest.raises(scalemm.UnsupportedError) as e:
        scalemm.scaled_mm(da, db, sa, sb, recipe_a="block1x128", recipe_b="block128x128", backend="native")
    assert e.value.status == "SCALEMM_STATUS_UNSUPPORTED" and "native" in e.value.message


def test_k_not_multiple_of_16_is_refused_and_nothing_written():
    rng = np.random.default_rng(2)
    da, sa = scalemm.quantize(rng.standard_normal((4, 40)).astype(np.float32), "rowwise")
    db, sb = scalemm.quantize(rng.standard_normal((4, 40)).astype(np.float32), "rowwise")
    try:
        d = scalemm.scaled_mm(da, db, sa, sb, recipe_a="rowwise", recipe_b="rowwise", out_dtype="f32")
    except scalemm.Error as e:
        assert "k" in e.message
    else:  # the reference emulator may accept any K: then it must be right
        ref = da.astype(np.float64) * sa.astype(np.float64) @ (db.astype(np.float64) * sb.astype(np.float64)).T
        assert np.allclose(d, ref, rtol=1e-5, atol=1e-6)


def test_nvfp4_global_scale_forms():
    rng = np.random.default_rng(3)
    da, (sa, ga) = scalemm.quantize(rng.standard_normal((4, 64)).astype(np.float32), "nvfp4")
    db, (sb, gb) = scalemm.quantize(rng.standard_normal((4, 64)).astype(np.float32), "nvfp4")
    d1 = scalemm.scaled_mm(da, db, (sa, ga), (sb, gb), recipe_a="nvfp4", recipe_b="nvfp4", out_dtype="f32")
    d2 = scalemm.scaled_mm(da, db, (sa, np.float32(ga)), (sb, np.array([gb], np.float32)), recipe_a="nvfp4",
                           recipe_b="nvfp4", out_dtype="f32")
    np.testing.assert_array_equal(d1, d2)
    with pytest.raises(scalemm.InvalidArgumentError, match="only for nvfp4"):
        xa, sxa = scalemm.quantize(rng.standard_normal((4, 64)).astype(np.float32), "mxfp8")
        scalemm.scaled_mm(xa, db, (sxa, 1.0), (sb, gb), recipe_a="mxfp8", recipe_b="nvfp4")
    with pytest.raises(scalemm.InvalidArgumentError, match="nvfp4"):
        scalemm.scaled_mm(da, db, (sa, ga), (sb, gb), recipe_a="nvfp4", recipe_b="nvfp4", dtype_a="e4m3")


def test_quantize_rejects_bad_sources():
    with pytest.raises(scalemm.InvalidArgumentError, match="high precision"):
        scalemm.quantize(np.zeros((4, 32), np.uint8), "mxfp8")
    with pytest.raises(scalemm.InvalidArgumentError, match="rank 2"):
        scalemm.quantize(np.zeros(32, np.float32), "mxfp8")
    with pytest.raises(scalemm.InvalidArgumentError, match="dtype"):
        scalemm.quantize(np.zeros((4, 32), np.float32), "mxfp8", dtype="e3m4")
    with pytest.raises(scalemm.InvalidArgumentError, match="array"):
        scalemm.scaled_mm([[1]], [[1]], 1.0, 1.0, recipe_a="tensorwise", recipe_b="tensorwise")


# ---- values that cannot be right (docs/reliability.md, "Values checked for what they can mean") -------

def test_scales_in_the_other_byte_order_are_refused_by_name():
    da, db, sa, sb = _ops()
    for bad, argument in ((sa.astype(sa.dtype.newbyteorder(">")), "scale_a"),
                          (sb.astype(sb.dtype.newbyteorder(">")), "scale_b")):
        args = (bad, sb) if argument == "scale_a" else (sa, bad)
        with pytest.raises(scalemm.InvalidArgumentError) as e:
            scalemm.scaled_mm(da, db, *args, recipe_a="block1x128", recipe_b="block128x128")
        assert e.value.message.startswith(argument + ":"), e.value.message
        assert "byte order" in e.value.message and "'>f4'" in e.value.message, e.value.message
        assert "newbyteorder('=')" in e.value.message, e.value.message
    # The fix the message prints works: the converted copy runs and matches the native call.
    big = sa.astype(">f4")
    fixed = big.astype(big.dtype.newbyteorder("="))
    d1 = scalemm.scaled_mm(da, db, fixed, sb, recipe_a="block1x128", recipe_b="block128x128", out_dtype="f32")
    d2 = scalemm.scaled_mm(da, db, sa, sb, recipe_a="block1x128", recipe_b="block128x128", out_dtype="f32")
    assert np.array_equal(d1, d2)
    with pytest.raises(scalemm.InvalidArgumentError, match="byte order"):
        scalemm.layouts.check(sa.astype(">f4"), "block1x128", 8, 256)


def _nvfp4_ops():
    rng = np.random.default_rng(5)
    da, (sa, ga) = scalemm.quantize(rng.standard_normal((4, 64)).astype(np.float32) * 30, "nvfp4")
    db, (sb, gb) = scalemm.quantize(rng.standard_normal((4, 64)).astype(np.float32) * 30, "nvfp4")
    return da, db, sa, ga, sb, gb


def test_nvfp4_scales_without_their_global_are_refused():
    da, db, sa, ga, sb, gb = _nvfp4_ops()
    assert ga != 1.0  # the case the pair guards against: a global of 1 would be silently wrong
    with pytest.raises(scalemm.InvalidArgumentError) as e:
        scalemm.scaled_mm(da, db, sa, (sb, gb), recipe_a="nvfp4", recipe_b="nvfp4")
    assert e.value.message.startswith("scale_a: nvfp4 scales are the pair (block_scales, global_decode_scale)")
    with pytest.raises(scalemm.InvalidArgumentError, match="scale_b: nvfp4 scales are the pair"):
        scalemm.scaled_mm(da, db, (sa, ga), sb, recipe_a="nvfp4", recipe_b="nvfp4")
    with pytest.raises(scalemm.InvalidArgumentError, match="scales: nvfp4 scales are the pair"):
        scalemm.dequantize(da, sa, "nvfp4")
    # Stating a global of 1 explicitly is allowed.
    scalemm.scaled_mm(da, db, (sa, 1.0), (sb, gb), recipe_a="nvfp4", recipe_b="nvfp4")


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf"), -float("inf"), 1e300])
def test_nvfp4_global_scales_that_cannot_be_meant_are_refused(bad):
    da, db, sa, ga, sb, gb = _nvfp4_ops()
    with pytest.raises(scalemm.InvalidArgumentError) as e:
        scalemm.scaled_mm(da, db, (sa, ga), (sb, bad), recipe_a="nvfp4", recipe_b="nvfp4")
    assert e.value.message.startswith("scale_b[1]: the NVFP4 global decode scale must be a positive finite float32")
    with pytest.raises(scalemm.InvalidArgumentError, match=r"scales\[1\]: the NVFP4 global"):
        scalemm.dequantize(da, (sa, np.float32(bad) if abs(bad) < 1e38 else bad), "nvfp4")


def test_a_subnormal_nvfp4_global_scale_is_a_number():
    da, db, sa, ga, sb, gb = _nvfp4_ops()
    d = scalemm.scaled_mm(da, db, (sa, 1e-40), (sb, gb), recipe_a="nvfp4", recipe_b="nvfp4", out_dtype="f32")
    assert np.all(np.isfinite(d))


def test_importing_the_source_folder_without_its_extension_says_so(tmp_path):
    """Python run from inside python/ imports the source folder, which has no compiled module unless one
    was built into it: the error names that, not the CUDA libraries."""
    import os
    import shutil
    import subprocess
    import sys

    src = os.path.dirname(scalemm.__file__)
    pkg = tmp_path / "scalemm"
    shutil.copytree(src, pkg, ignore=shutil.ignore_patterns("_scalemm*", "__pycache__"))
    p = subprocess.run([sys.executable, "-c", "import scalemm"], cwd=tmp_path, capture_output=True, text=True,
                       env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, timeout=120)
    assert p.returncode != 0
    assert "holds no compiled extension" in p.stderr and str(pkg) in p.stderr, p.stderr
    assert "Run Python from another folder" in p.stderr, p.stderr
    assert "LD_LIBRARY_PATH" not in p.stderr, p.stderr


# ---- GPU memory faults (docs/reliability.md, "GPU memory faults") -------------------------------------

def _gpu():
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    ok = torch.cuda.is_available() and scalemm.has_gpu()
    return ok, f"no usable CUDA device (torch.cuda.is_available() = {torch.cuda.is_available()})"


def _ran_in_own_process(request) -> bool:
    """Reruns the calling test alone in a new process and says whether it did (then the caller returns).
    A memory-limit test needs an allocator with nothing cached: after other tests, a free fragment of a
    segment that torch cannot release would serve the allocation the limit is meant to refuse."""
    if os.environ.get("SCALEMM_TEST_OWN_PROCESS"):
        return False
    # By absolute path, from this process's folder (inside python/, the source folder would shadow the install).
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        f"{request.node.path}::{request.node.name}"],
                       env={**os.environ, "SCALEMM_TEST_OWN_PROCESS": "1"}, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and " passed" in r.stdout, r.stdout[-4000:] + r.stderr[-2000:]
    return True


@pytest.mark.skipif(not _gpu()[0], reason=_gpu()[1])
def test_an_output_that_does_not_fit_raises_out_of_memory_and_the_next_call_runs(request):
    """The array layer (scalemm._core, which every non-torch caller and DLPack arrays go through; torch
    tensors take scalemm.torch) allocates the output through the framework: under a memory limit with no
    room for it, a scalemm.OutOfMemoryError names the buffer and its size."""
    if _ran_in_own_process(request):
        return
    import torch

    from scalemm import _core

    rng = np.random.default_rng(9)
    m, n, k = 1024, 1024, 512  # a 4 MiB output: torch's large-block pool, a segment of its own
    da, sa = scalemm.quantize(rng.standard_normal((m, k)).astype(np.float32), "block1x128")
    db, sb = scalemm.quantize(rng.standard_normal((n, k)).astype(np.float32), "block128x128")
    dev = torch.device("cuda")
    a = torch.from_numpy(da.view(np.uint8)).to(dev)
    b = torch.from_numpy(db.view(np.uint8)).to(dev)
    ta, tb = torch.from_numpy(sa).to(dev), torch.from_numpy(sb).to(dev)
    kw = dict(recipe_a="block1x128", recipe_b="block128x128", dtype_a="e4m3", dtype_b="e4m3", out_dtype="f32")
    want = _core.scaled_mm(a, b, ta, tb, **kw).cpu()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # a cached block would serve the output whatever the limit
    total = torch.cuda.get_device_properties(0).total_memory
    held = torch.cuda.memory_reserved()  # the limit counts reserved segments, not only live tensors
    torch.cuda.set_per_process_memory_fraction(min(1.0, (held + (1 << 20)) / total))
    try:
        with pytest.raises(scalemm.OutOfMemoryError) as e:
            _core.scaled_mm(a, b, ta, tb, **kw)
        assert e.value.message.startswith("the output: cannot allocate %d bytes" % (m * n * 4)), e.value.message
        assert isinstance(e.value.__cause__, torch.OutOfMemoryError)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    got = _core.scaled_mm(a, b, ta, tb, **kw).cpu()  # the same process, handle and inputs run again
    assert torch.equal(got, want)


@pytest.mark.skipif(not _gpu()[0], reason=_gpu()[1])
@pytest.mark.parametrize("recipe", ["blockwise", "tensorwise"])
def test_a_torch_layer_out_of_memory_leaves_its_parameters_and_the_next_step_exact(recipe, request):
    """scalemm.torch's layers allocate their buffers (quantized operands, outputs, gradients) through torch's
    caching allocator: under a memory limit with no room, a step raises torch's OutOfMemoryError (which names
    the size it tried), the parameters and their gradients are left as they were, and the same layer's next
    step, with the limit lifted, gives the bytes of a step that never failed."""
    if _ran_in_own_process(request):
        return
    import torch

    import scalemm.torch as st

    torch.manual_seed(11)
    lin = torch.nn.Linear(2048, 4096, bias=False, device="cuda", dtype=torch.bfloat16)
    layer = st.Float8Linear.from_linear(lin, recipe=recipe)
    x = torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def step():
        x.grad = layer.weight.grad = None
        layer(x).float().square().mean().backward()
        return layer.weight.grad.clone(), x.grad.clone()

    want = step()
    w0 = layer.weight.detach().clone()
    x.grad = layer.weight.grad = None
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    held = torch.cuda.memory_reserved()
    torch.cuda.set_per_process_memory_fraction(min(1.0, (held + (1 << 20)) / total))
    try:
        with pytest.raises(torch.OutOfMemoryError, match="Tried to allocate"):
            layer(x).float().square().mean().backward()
        torch.cuda.synchronize()
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    assert torch.equal(layer.weight.detach(), w0) and layer.weight.grad is None
    got = step()
    assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_torch_nvfp4_scales_without_their_global_are_refused_eager_and_traced():
    torch = pytest.importorskip("torch")
    from torch.fx.experimental.proxy_tensor import make_fx

    da, db, sa, ga, sb, gb = _nvfp4_ops()
    a, b = torch.from_numpy(da.view(np.uint8)), torch.from_numpy(db.view(np.uint8))
    ta, tb = torch.from_numpy(sa.view(np.uint8)), torch.from_numpy(sb.view(np.uint8))
    kw = dict(recipe_a="nvfp4", recipe_b="nvfp4", out_dtype="f32")
    with pytest.raises(scalemm.InvalidArgumentError, match="scale_a: nvfp4 scales are the pair"):
        scalemm.scaled_mm(a, b, ta, (tb, gb), **kw)
    # Traced (a dispatch mode: the custom op's path), where the bare scales used to become (scales, 1.0).
    with pytest.raises(scalemm.InvalidArgumentError, match="scale_b: nvfp4 scales are the pair"):
        make_fx(lambda x, y, s, t: scalemm.scaled_mm(x, y, (s, ga), t, **kw))(a, b, ta, tb)
