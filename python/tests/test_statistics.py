"""The C++ tensor statistics behind StatisticsSubscriber: equal to numpy's (float64) over the
finite values, for sizes across bucket boundaries and every special case; bounded memory."""

import math

import numpy as np
import pytest
import torch

import graphtrain._C as C


def reference(x: np.ndarray) -> dict:
    v = x.astype(np.float64).ravel()
    finite = v[np.isfinite(v)]
    nan = math.nan
    return {
        "count": v.size,
        "finite": finite.size,
        "min": finite.min() if finite.size else nan,
        "max": finite.max() if finite.size else nan,
        "mean": finite.mean() if finite.size else nan,
        "std": finite.std(ddof=1) if finite.size > 1 else nan,
        "nan": int(np.isnan(v).sum()),
        "inf": int(np.isinf(v).sum()),
        "negative": int((v < 0).sum()),
        "positive": int((v > 0).sum()),
        "zero": int((v == 0).sum()),
        "first": v[:128].tolist(),
    }


def check(stats: dict, ref: dict, rtol: float = 1e-12) -> None:
    for key in ("count", "finite", "nan", "inf", "negative", "positive", "zero"):
        assert stats[key] == ref[key], key
    for key in ("min", "max", "mean", "std"):
        if math.isnan(ref[key]):
            assert math.isnan(stats[key]), key
        else:
            assert stats[key] == pytest.approx(ref[key], rel=rtol, abs=1e-12), key
    np.testing.assert_array_equal(stats["first"], ref["first"])


@pytest.mark.parametrize("size", [1, 2, 7, 8, 9, 1000, 3 * 65537 + 5])
@pytest.mark.parametrize("bucket", [1, 3, 8, 65536, 1 << 29])
def test_sizes_across_bucket_boundaries(size, bucket):
    x = np.random.default_rng(size).standard_normal(size).astype(np.float32) * 3 + 0.5
    check(C.tensor_stats(x, bucket), reference(x), rtol=1e-10)


def test_numerically_stable_with_a_large_offset():
    x = (1e6 + np.random.default_rng(0).standard_normal(200_001)).astype(np.float64)
    check(C.tensor_stats(x, 4096), reference(x), rtol=1e-9)


def test_special_values():
    nans = np.full((3, 4), np.nan, np.float32)
    s = C.tensor_stats(nans)
    check(s, reference(nans))
    infs = np.array([np.inf, -np.inf, np.inf], np.float32)
    check(C.tensor_stats(infs), reference(infs))
    mixed = np.array([1.0, np.nan, -2.0, np.inf, 0.0, 4.0], np.float32)
    check(C.tensor_stats(mixed, 2), reference(mixed))
    empty = np.zeros((0, 5), np.float32)
    s = C.tensor_stats(empty)
    assert s["count"] == 0 and s["first"] == [] and math.isnan(s["mean"])
    one = np.array([3.5], np.float32)
    s = C.tensor_stats(one)
    assert s["mean"] == 3.5 and math.isnan(s["std"])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_accumulates_wide(dtype):
    x = (torch.randn(70_000, generator=torch.Generator().manual_seed(1)) * 100).to(dtype)
    ref = reference(x.float().numpy())
    s = C.tensor_stats(x, 10_000)
    assert s["dtype"] == ("float16" if dtype == torch.float16 else "bfloat16")
    check(s, ref, rtol=1e-10)


def test_integer_and_bool_tensors():
    x = np.arange(-5, 6, dtype=np.int64)
    check(C.tensor_stats(x), reference(x))
    b = np.array([True, False, True])
    check(C.tensor_stats(b), reference(b.astype(np.float64)))


def _hwm_kib() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1])
    return 0


def test_memory_stays_bounded_for_a_huge_tensor():
    """2^28 float32 elements (1 GiB) with the default bucket: the statistics add a few numbers, not
    a copy. Measured as the growth of the process's peak resident memory."""
    x = np.ones(1 << 28, np.float32)
    x[::1000] = 2.0
    before = _hwm_kib()
    s = C.tensor_stats(x)
    grown_mib = (_hwm_kib() - before) / 1024
    print(f"peak memory grew by {grown_mib:.1f} MiB for a 1024 MiB tensor")
    assert s["count"] == 1 << 28 and s["max"] == 2.0
    assert grown_mib < 16
