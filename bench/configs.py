"""Model sizes the benchmarks use: large enough that kernels, not per-op overhead, dominate."""

from __future__ import annotations

CONFIGS = {
    "mlp": dict(sizes=dict(d_in=512, hidden=1024, d_out=256), batch=256, seq=1),
    "encoder": dict(
        sizes=dict(vocab=1000, dim=128, heads=4, layers=2, max_len=128), batch=16, seq=64
    ),
    "gpt": dict(sizes=dict(vocab=1000, dim=128, heads=4, layers=2, max_len=128), batch=16, seq=64),
    "cnn": dict(sizes=dict(classes=10), batch=32, seq=1, image=32),
}


def example_kwargs(model: str) -> dict:
    cfg = CONFIGS[model]
    kw = dict(
        batch=cfg["batch"],
        seq=cfg["seq"],
        width=cfg["sizes"].get("d_in", 32),
        image=cfg.get("image", 16),
    )
    if "vocab" in cfg["sizes"]:
        kw["vocab"] = cfg["sizes"]["vocab"]
    return kw


def describe_models(models: list[str] | None = None) -> str:
    """'Models: ...' line of a results file: each model's batch, sequence and sizes."""
    parts = []
    for m in models or list(CONFIGS):
        c = CONFIGS[m]
        parts.append(
            f"{m}: batch {c['batch']}"
            + (f", seq {c['seq']}" if c["seq"] > 1 else "")
            + f", {c['sizes']}"
        )
    return f"Models: {', '.join(parts)}."
