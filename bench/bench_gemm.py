"""sgemm on the GEMM shapes of the GPT bench model's training step (bench/configs.py "gpt": 16 x
64 tokens, width 128, 4 heads), forward and backward, with each BLAS this machine can have:

- OpenBLAS, Debian's pthread build (what graphtrain links, statically: the same library);
- MKL, from the `mkl` wheel (its libmkl_rt), sequential or with GNU OpenMP threads;
- oneDNN's dnnl_sgemm, Debian's libdnnl 2.6 (OpenMP);
- torch.matmul (PyTorch eager's own choice), for reference.

    .venv/bin/python bench/bench_gemm.py [--mkl PATH/libmkl_rt.so.3] [--dnnl PATH/libdnnl.so.2]

MKL: `.venv/bin/pip install mkl` puts libmkl_rt.so.3 in .venv/lib (found there by itself);
oneDNN: `apt-get install libdnnl-dev`. A library that is not found is left out of the table. Each
library and thread count runs in its own process. Prints GFLOP/s and writes
bench/results/gemm.md. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from machine import describe, run_worker  # noqa: E402

TOKENS, WIDTH, HEADS, SEQ, BATCH, VOCAB = 1024, 128, 4, 64, 16, 1000
HEAD = WIDTH // HEADS


def shapes() -> list[tuple[str, int, int, int, bool, bool, int]]:
    """(name, M, N, K, A transposed, B transposed, count per step): C[M, N] = op(A) op(B)."""
    out = []
    for name, n_in, n_out, per_step in (
        ("qkv", WIDTH, 3 * WIDTH, 2),
        ("attn proj", WIDTH, WIDTH, 2),
        ("mlp up", WIDTH, 4 * WIDTH, 2),
        ("mlp down", 4 * WIDTH, WIDTH, 2),
        ("lm head", WIDTH, VOCAB, 1),
    ):
        out.append((f"{name} fwd", TOKENS, n_out, n_in, False, True, per_step))  # x W^T
        out.append((f"{name} dX", TOKENS, n_in, n_out, False, False, per_step))  # dY W
        out.append((f"{name} dW", n_out, n_in, TOKENS, True, False, per_step))  # dY^T x
    heads = BATCH * HEADS * 2  # per head, both layers
    out.append(("attn QK^T", SEQ, SEQ, HEAD, False, True, heads))
    out.append(("attn PV", SEQ, HEAD, SEQ, False, False, heads))
    out.append(("attn dP = dO V^T", SEQ, SEQ, HEAD, False, True, heads))
    out.append(("attn dV = P^T dO", SEQ, HEAD, SEQ, True, False, heads))
    out.append(("attn dQ = dS K", SEQ, HEAD, SEQ, False, False, heads))
    out.append(("attn dK = dS^T Q", SEQ, HEAD, SEQ, True, False, heads))
    return out


ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112


def _cblas(lib: ctypes.CDLL):  # noqa: ANN202
    f = lib.cblas_sgemm
    f.restype = None
    i, fl, p = ctypes.c_int, ctypes.c_float, ctypes.c_void_p
    f.argtypes = [i, i, i, i, i, i, fl, p, i, p, i, fl, p, i]

    def gemm(m, n, k, ta, tb, a, b, c):  # noqa: ANN001, ANN202
        lda, ldb = (m if ta else k), (k if tb else n)
        f(ROW_MAJOR, TRANS if ta else NO_TRANS, TRANS if tb else NO_TRANS, m, n, k, 1.0,
          a, lda, b, ldb, 0.0, c, n)  # fmt: skip

    return gemm


def _dnnl(lib: ctypes.CDLL):  # noqa: ANN202
    f = lib.dnnl_sgemm
    f.restype = ctypes.c_int
    ch, d, fl, p = ctypes.c_char, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
    f.argtypes = [ch, ch, d, d, d, fl, p, d, p, d, fl, p, d]

    def gemm(m, n, k, ta, tb, a, b, c):  # noqa: ANN001, ANN202
        lda, ldb = (m if ta else k), (k if tb else n)
        f(b"T" if ta else b"N", b"T" if tb else b"N", m, n, k, 1.0, a, lda, b, ldb, 0.0, c, n)

    return gemm


def worker(library: str, path: str, threads: int) -> list[dict]:
    import numpy as np

    if library == "torch":
        import torch

        torch.set_num_threads(threads)

        def run(m, n, k, ta, tb):  # noqa: ANN001, ANN202
            a = torch.randn(k, m) if ta else torch.randn(m, k)
            b = torch.randn(n, k) if tb else torch.randn(k, n)
            a2, b2 = (a.t() if ta else a), (b.t() if tb else b)
            return lambda: torch.matmul(a2, b2)
    else:
        lib = ctypes.CDLL(path)
        if library == "OpenBLAS":
            lib.openblas_set_num_threads(threads)
            gemm = _cblas(lib)
        elif library == "MKL":
            lib.MKL_Set_Num_Threads(threads)
            gemm = _cblas(lib)
        else:
            gemm = _dnnl(lib)

        def run(m, n, k, ta, tb):  # noqa: ANN001, ANN202
            rng = np.random.default_rng(0)
            a = rng.standard_normal((k, m) if ta else (m, k), dtype=np.float32)
            b = rng.standard_normal((n, k) if tb else (k, n), dtype=np.float32)
            c = np.empty((m, n), dtype=np.float32)
            pa, pb, pc = a.ctypes.data, b.ctypes.data, c.ctypes.data
            keep = (a, b, c)  # the closure holds the arrays, not only their addresses
            return lambda: keep and gemm(m, n, k, ta, tb, pa, pb, pc)

    rows = []
    for name, m, n, k, ta, tb, count in shapes():
        call = run(m, n, k, ta, tb)
        flops = 2.0 * m * n * k
        reps = max(3, int(2e8 / flops))  # ~0.2 GFLOP per timing
        for _ in range(3):
            call()
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(reps):
                call()
            best = min(best, (time.perf_counter() - t0) / reps)
        rows.append({"name": name, "gflops": flops / best / 1e9, "ms_per_step": best * count * 1e3})
    return rows


def _find_mkl() -> str | None:
    for d in (Path(sys.prefix) / "lib", Path(sys.base_prefix) / "lib"):
        for name in ("libmkl_rt.so.3", "libmkl_rt.so.2", "libmkl_rt.so"):
            if (d / name).exists():
                return str(d / name)
    return None


def _find(paths: list[str]) -> str | None:
    return next((p for p in paths if p and os.path.exists(p)), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mkl", help="path of libmkl_rt.so (default: the venv's lib folder)")
    parser.add_argument("--dnnl", help="path of libdnnl.so.2 (default: Debian's)")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        library, path, threads = args.worker
        print(json.dumps(worker(library, path, int(threads))))
        return
    arch = "/usr/lib/x86_64-linux-gnu"
    libraries = {
        "OpenBLAS": _find(
            [f"{arch}/openblas-pthread/libopenblas.so.0", f"{arch}/libopenblas.so.0"]
        ),
        "MKL": _find([args.mkl or "", _find_mkl() or ""]),
        "oneDNN": _find([args.dnnl or "", f"{arch}/libdnnl.so.2", f"{arch}/libdnnl.so"]),
        "torch": "torch",
    }
    results: dict[tuple[str, int], list[dict]] = {}
    for library, path in libraries.items():
        if path is None:
            print(f"{library}: not found, left out (see the docstring)")
            continue
        for threads in (1, 2):
            env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
            env["MKL_THREADING_LAYER"] = "SEQUENTIAL" if threads == 1 else "GNU"
            rows = run_worker(__file__, [library, path, str(threads)], env)
            results[(library, threads)] = rows
            total = sum(r["ms_per_step"] for r in rows)
            print(
                f"{library:8s} {threads} thread(s): {total:6.2f} ms of GEMMs per step", flush=True
            )
    write(results, libraries)


def write(results: dict[tuple[str, int], list[dict]], libraries: dict) -> None:
    names = [s[0] for s in shapes()]
    dims = {s[0]: s[1:6] for s in shapes()}
    counts = {s[0]: s[6] for s in shapes()}
    cols = list(results)
    lines = [
        "# sgemm on the GPT bench model's GEMM shapes: OpenBLAS, MKL, oneDNN, torch",
        "",
        f"Machine: {describe()}",
        "",
        "Libraries: "
        + "; ".join(f"{k}: {v}" for k, v in libraries.items() if v)
        + ". Each library and thread count in its own process; GFLOP/s of the best of 5 timings "
        "(each ~0.2 GFLOP of repeated calls on the same operands). Shapes: the GEMMs of one "
        "training step of bench/configs.py's gpt (16 x 64 tokens, width 128, 4 heads, vocab "
        "1000): each linear layer's forward, input gradient and weight gradient, and the "
        "attention's per-head products (x count: calls per step).",
        "",
        "| GEMM | M x N x K (A^T, B^T) | x count | "
        + " | ".join(f"{lib} {t}t" for lib, t in cols)
        + " |",
        "|---|---|---|" + "---|" * len(cols),
    ]
    for name in names:
        m, n, k, ta, tb = dims[name]
        cells = []
        for col in cols:
            row = next(r for r in results[col] if r["name"] == name)
            cells.append(f"{row['gflops']:.0f}")
        t = "".join(x for x, on in (("A^T", ta), ("B^T", tb)) if on)
        lines.append(
            f"| {name} | {m} x {n} x {k}{' ' + t if t else ''} | {counts[name]} | "
            + " | ".join(cells)
            + " |"
        )
    totals = [sum(r["ms_per_step"] for r in results[c]) for c in cols]
    lines.append(
        "| **ms per step, all GEMMs** | | | " + " | ".join(f"**{x:.2f}**" for x in totals) + " |"
    )
    lines.append("")
    out = ROOT / "bench" / "results" / "gemm.md"
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
