#!/usr/bin/env python3
"""Independent oracle for scalemm's number-format codecs (include/scalemm/formats.hpp).

Generates float32 inputs (every code value, every midpoint between adjacent codes, +-1 ulp around
each, both signs, the special values, and 10^6 seeded random bit patterns) and writes them together
with the oracle's encodings and decodings to a binary file that tests/formats/test_formats_oracle.cpp
reads. The oracle is ml_dtypes (FP8, FP4, E8M0 nearest, BF16) and numpy (FP16); E8M0 round-up and
round-down come from exact math (frexp). Saturating mode = clamp to +-max in numpy (NaN kept), then
cast, which is what PyTorch's to_fp8_saturated does.

Usage: oracle.py --out FILE [--seed N] [--random-count N]
The seed defaults to $SCALEMM_TEST_SEED, else a fresh one; it is printed and stored in the file.

File layout (little endian): magic b"SMMORCL1", u64 seed, u32 section count, then per section:
name (32 bytes, NUL padded ASCII), u32 element size in bytes (1, 2 or 4), u64 element count, data.
"""
import argparse
import os
import struct
import sys

try:
    import numpy as np
    import ml_dtypes
except ImportError as e:  # CI installs both; a missing oracle must fail the suite, never pass it.
    sys.stderr.write(
        "FATAL: the formats oracle needs numpy and ml_dtypes (pip install numpy ml_dtypes): %s\n" % e)
    sys.exit(2)

MAGIC = b"SMMORCL1"
F32 = np.float32
U32 = np.uint32

# Boundary sections are tagged so that failures can say where an input came from.
KIND_BOUNDARY = 0
KIND_RANDOM = 1


def f32(bits):
    return np.asarray(bits, dtype=U32).view(F32)


def bits(x):
    return np.asarray(x, dtype=F32).view(U32)


def code_values(dtype, codes):
    """float32 values of the given raw codes of an ml_dtypes / numpy dtype."""
    width = np.dtype(dtype).itemsize
    raw = np.asarray(codes, dtype=np.uint8 if width == 1 else np.uint16)
    return raw.view(dtype).astype(F32)


def around(values):
    """values and their float32 neighbours (+-1 ulp)."""
    v = np.asarray(values, dtype=F32)
    with np.errstate(over="ignore"):
        return np.concatenate([v, np.nextafter(v, F32(np.inf)), np.nextafter(v, F32(-np.inf))])


def ladder(finite_values, next_above_max):
    """Every finite value, every midpoint between neighbours (plus the overflow midpoint between
    max and the next value the format would have), each with its +-1 ulp neighbours."""
    v = np.unique(np.asarray(finite_values, dtype=np.float64))
    v = v[v >= 0]
    upper = np.append(v[1:], next_above_max)
    mid = (v + upper) / 2.0
    assert np.all(mid.astype(F32).astype(np.float64) == mid), "midpoint not exact in float32"
    both = np.concatenate([v.astype(F32), mid.astype(F32)])
    out = around(both)
    return np.concatenate([out, -out])


def boundary_inputs():
    parts = []
    # FP8 / FP4 / 16-bit formats: all non-negative finite codes.
    e4m3 = code_values(ml_dtypes.float8_e4m3fn, np.arange(0x00, 0x7F))
    parts.append(ladder(e4m3, 480.0))
    e5m2 = code_values(ml_dtypes.float8_e5m2, np.arange(0x00, 0x7C))
    parts.append(ladder(e5m2, 65536.0))
    e2m1 = code_values(ml_dtypes.float4_e2m1fn, np.arange(0, 8))
    parts.append(ladder(e2m1, 8.0))
    bf16 = code_values(ml_dtypes.bfloat16, np.arange(0x0000, 0x7F80))
    parts.append(ladder(bf16, 2.0 ** 128))
    f16 = code_values(np.float16, np.arange(0x0000, 0x7C00))
    parts.append(ladder(f16, 65536.0))
    # E8M0: powers of two 2^-127..2^127 (round up/down edges) and 1.5 * 2^k (nearest edges).
    k = np.arange(-127, 128, dtype=np.float64)
    p2 = np.concatenate([2.0 ** k, 1.5 * 2.0 ** k, 1.25 * 2.0 ** k])
    p2 = around(p2.astype(F32))
    parts.append(np.concatenate([p2, -p2]))
    # Special values and the rows of the measured CUDA table (numerics-and-reliability.md 2.8).
    specials = [
        0x00000000, 0x80000000, 0x7F800000, 0xFF800000,  # +-0, +-Inf
        0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF, 0xFFFFFFFF,  # NaNs
        0x7FA00000, 0x7FBFFFFF, 0x7FC00001, 0xFFA5A5A5,  # signalling and payload NaNs
        0x00000001, 0x80000001, 0x007FFFFF, 0x807FFFFF,  # float32 subnormal extremes
        0x00400000, 0x00400001, 0x003FFFFF, 0x00600000, 0x005FFFFF, 0x00600001,  # near 2^-127
        0x00800000, 0x80800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F000000, 0x7F000001,  # min normal, max
        0x7F400000, 0x7EFFFFFF, 0x3A800000,  # 1.5 * 2^127, 2^126 - ulp, 2^-10
        0x43E00000, 0x43E80000, 0x43E80001, 0x43E88000, 0x43EF8000, 0x47700000,  # 448, 464, ..., 61440
        0x3E800000, 0x3F400000, 0x40200000, 0x40A00000, 0x40A051EC,  # 0.25 0.75 2.5 5.0 5.01
    ]
    parts.append(f32(specials))
    return np.concatenate([bits(p) for p in parts]).astype(U32)


def random_inputs(rng, n):
    """n float32 bit patterns: 30% uniform bits, 55% in the formats' range (with truncated mantissas
    that hit ties), 15% specials (NaN payloads, +-Inf, +-0, subnormals, huge, tiny)."""
    n_uniform = n * 30 // 100
    n_range = n * 55 // 100
    n_special = n - n_uniform - n_range
    uniform = rng.integers(0, 2 ** 32, size=n_uniform, dtype=np.uint64).astype(U32)

    sign = rng.integers(0, 2, size=n_range, dtype=np.uint64).astype(U32) << U32(31)
    exp = rng.integers(127 - 30, 127 + 20, size=n_range, endpoint=True, dtype=np.uint64).astype(U32)
    man = rng.integers(0, 1 << 23, size=n_range, dtype=np.uint64).astype(U32)
    keep = rng.integers(0, 14, size=n_range, dtype=np.uint64).astype(U32)  # mantissa bits kept
    truncate = rng.random(n_range) < 0.35
    mask = (~((U32(1) << (U32(23) - keep)) - U32(1))) & U32(0x7FFFFF)
    man = np.where(truncate, man & mask, man).astype(U32)
    in_range = sign | (exp << U32(23)) | man

    kind = rng.integers(0, 6, size=n_special)
    s_sign = rng.integers(0, 2, size=n_special, dtype=np.uint64).astype(U32) << U32(31)
    s_man = rng.integers(0, 1 << 23, size=n_special, dtype=np.uint64).astype(U32)
    nan = U32(0x7F800000) | np.maximum(s_man, U32(1))  # NaN with a random payload (quiet or not)
    inf_zero = np.where(s_man & U32(1), U32(0x7F800000), U32(0))  # +-Inf or +-0
    subnormal = s_man  # exponent field 0
    huge_exp = rng.integers(0xE0, 0xFE, size=n_special, endpoint=True, dtype=np.uint64).astype(U32)
    tiny_exp = rng.integers(0x01, 0x30, size=n_special, endpoint=True, dtype=np.uint64).astype(U32)
    huge = (huge_exp << U32(23)) | s_man
    tiny = (tiny_exp << U32(23)) | s_man
    quiet_nan = U32(0x7FC00000) | (s_man & U32(0xFF))  # quiet NaN, small payload
    choices = np.stack([nan, inf_zero, subnormal, huge, tiny, quiet_nan])
    special = s_sign | choices[kind, np.arange(n_special)]

    out = np.concatenate([uniform, in_range, special.astype(U32)])
    rng.shuffle(out)
    return out


def cast(x, dtype):
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(dtype)


def saturate(x, maxval):
    """Clamp to +-max keeping NaN (np.clip propagates NaN), like PyTorch's to_fp8_saturated."""
    with np.errstate(invalid="ignore"):
        return np.clip(x, F32(-maxval), F32(maxval))


def u8(a):
    return np.ascontiguousarray(a).view(np.uint8)


def u16(a):
    return np.ascontiguousarray(a).view(np.uint16)


def e8m0_exact(x, round_up, satfinite):
    """E8M0 by exact math: code = ceil/floor(log2|x|) + 127 with the sign ignored, values at or
    below 2^-127 (and 0) -> 0, overflow and Inf -> 0xFE (satfinite) or 0xFF, NaN -> 0xFF."""
    with np.errstate(invalid="ignore"):
        a = np.abs(x.astype(np.float64))
    out = np.zeros(x.shape, dtype=np.int64)
    finite = np.isfinite(a) & (a > 0)
    m, e = np.frexp(np.where(finite, a, 1.0))  # a = m * 2^e, m in [0.5, 1)
    floor_log2 = e - 1
    exact = m == 0.5
    k = np.where(exact, floor_log2, floor_log2 + 1) if round_up else floor_log2
    code = np.where(finite, k + 127, 0)
    overflow_code = 0xFE if satfinite else 0xFF
    code = np.where(code > 254, overflow_code, np.maximum(code, 0))
    code = np.where(np.isinf(a), overflow_code, code)
    code = np.where(np.isnan(a), 0xFF, code)
    out[:] = code
    return out.astype(np.uint8)


def ue4m3(x, satfinite):
    """Unsigned E4M3 (NVFP4 block scale): ml_dtypes float8_e4m3fn on the non-negative range; the
    sign bit is never written. Negative inputs: satfinite clamps to [0, 448] (-> 0x00);
    non-saturating makes them NaN 0x7F, as ml_dtypes' unsigned float8_e8m0fnu does."""
    if satfinite:
        with np.errstate(invalid="ignore"):
            y = np.clip(x, F32(0.0), F32(448.0))
        return u8(cast(y, ml_dtypes.float8_e4m3fn)) & np.uint8(0x7F)
    r = u8(cast(x, ml_dtypes.float8_e4m3fn)) & np.uint8(0x7F)
    negative = (bits(x) >> U32(31)).astype(bool) & (x != 0) & ~np.isnan(x)
    return np.where(negative, np.uint8(0x7F), r).astype(np.uint8)


def decode_table(dtype, ncodes):
    width = np.dtype(dtype).itemsize
    raw = np.arange(ncodes, dtype=np.uint8 if width == 1 else np.uint16)
    return bits(raw.view(dtype).astype(F32))


def build(seed, random_count):
    rng = np.random.default_rng(seed)
    boundary = boundary_inputs()
    rand = random_inputs(rng, random_count)
    inputs = np.concatenate([boundary, rand]).astype(U32)
    kind = np.concatenate([np.full(boundary.size, KIND_BOUNDARY, np.uint8),
                           np.full(rand.size, KIND_RANDOM, np.uint8)])
    x = f32(inputs)
    ax = np.abs(x)

    e4m3, e5m2, e2m1 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.float4_e2m1fn
    e8m0, bf16 = ml_dtypes.float8_e8m0fnu, ml_dtypes.bfloat16
    bf16_max = float(ml_dtypes.finfo(bf16).max)
    e8m0_max = 2.0 ** 127

    sections = [
        ("input", inputs),
        ("kind", kind),
        ("e4m3.sat", u8(cast(saturate(x, 448.0), e4m3))),
        ("e4m3.nosat", u8(cast(x, e4m3))),
        ("e5m2.sat", u8(cast(saturate(x, 57344.0), e5m2))),
        ("e5m2.nosat", u8(cast(x, e5m2))),
        ("e2m1.sat", u8(cast(saturate(x, 6.0), e2m1))),
        ("e2m1.nosat", u8(cast(x, e2m1))),
        ("ue4m3.sat", ue4m3(x, True)),
        ("ue4m3.nosat", ue4m3(x, False)),
        ("e8m0.nearest.sat", u8(cast(saturate(x, e8m0_max), e8m0))),
        ("e8m0.nearest.nosat", u8(cast(x, e8m0))),
        ("e8m0.nearest.sat.abs", u8(cast(saturate(ax, e8m0_max), e8m0))),
        ("e8m0.nearest.nosat.abs", u8(cast(ax, e8m0))),
        ("e8m0.up.sat", e8m0_exact(x, True, True)),
        ("e8m0.up.nosat", e8m0_exact(x, True, False)),
        ("e8m0.down.sat", e8m0_exact(x, False, True)),
        ("e8m0.down.nosat", e8m0_exact(x, False, False)),
        ("bf16.sat", u16(cast(saturate(x, bf16_max), bf16))),
        ("bf16.nosat", u16(cast(x, bf16))),
        ("f16.sat", u16(cast(saturate(x, 65504.0), np.float16))),
        ("f16.nosat", u16(cast(x, np.float16))),
        ("decode.e4m3", decode_table(e4m3, 256)),
        ("decode.e5m2", decode_table(e5m2, 256)),
        ("decode.e2m1", decode_table(e2m1, 16)),
        ("decode.e8m0", decode_table(e8m0, 256)),
        ("decode.bf16", decode_table(bf16, 65536)),
        ("decode.f16", decode_table(np.float16, 65536)),
    ]
    return sections, boundary.size


def write(path, seed, sections):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<QI", seed, len(sections)))
        for name, data in sections:
            data = np.ascontiguousarray(data)
            assert data.dtype.itemsize in (1, 2, 4) and len(name) < 32
            f.write(struct.pack("<32sIQ", name.encode("ascii"), data.dtype.itemsize, data.size))
            f.write(data.astype(data.dtype.newbyteorder("<"), copy=False).tobytes())
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--random-count", type=int, default=1_000_000)
    args = ap.parse_args()
    seed = args.seed
    if seed is None:
        env = os.environ.get("SCALEMM_TEST_SEED")
        seed = int(env) if env else int.from_bytes(os.urandom(4), "little")
    sections, n_boundary = build(seed, args.random_count)
    write(args.out, seed, sections)
    print("formats oracle: seed %d (replay with SCALEMM_TEST_SEED=%d); numpy %s, ml_dtypes %s; "
          "%d boundary + %d random inputs -> %s"
          % (seed, seed, np.__version__, ml_dtypes.__version__, n_boundary, args.random_count,
             args.out))


if __name__ == "__main__":
    main()
