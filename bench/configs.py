"""Model sizes the benchmarks use: large enough that kernels, not per-op overhead, dominate."""

from __future__ import annotations

CONFIGS = {
    "mlp": dict(sizes=dict(d_in=512, hidden=1024, d_out=256), batch=256, seq=1),
    "encoder": dict(
        sizes=dict(vocab=1000, dim=128, heads=4, layers=2, max_len=128), batch=16, seq=64
    ),
    "gpt": dict(sizes=dict(vocab=1000, dim=128, heads=4, layers=2, max_len=128), batch=16, seq=64),
    "cnn": dict(sizes=dict(classes=10), batch=32, seq=1, image=32),
    # Hugging Face transformers models (random init), as users bring them: default settings.
    "hf-gpt2": dict(
        sizes=dict(n_embd=128, n_layer=2, n_head=4, vocab=1000), batch=16, seq=64, hf=True
    ),
    "hf-llama": dict(
        sizes=dict(hidden=128, ffn=344, n_layer=2, n_head=4, n_kv_head=2, vocab=1000),
        batch=16,
        seq=64,
        hf=True,
    ),
    "hf-resnet": dict(
        sizes=dict(hidden_sizes=[32, 64, 128], depths=[1, 1, 1]), batch=32, seq=1, image=32, hf=True
    ),
}


def hf_model(model: str):  # noqa: ANN201 - a transformers model
    """The transformers model of an `hf-` config, in training mode, dropout off."""
    import transformers as tf

    tf.logging.set_verbosity_error()
    s = CONFIGS[model]["sizes"]
    if model == "hf-gpt2":
        cfg = tf.GPT2Config(
            n_embd=s["n_embd"],
            n_layer=s["n_layer"],
            n_head=s["n_head"],
            vocab_size=s["vocab"],
            n_positions=256,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
        net = tf.GPT2LMHeadModel(cfg)
    elif model == "hf-llama":
        cfg = tf.LlamaConfig(
            vocab_size=s["vocab"],
            hidden_size=s["hidden"],
            intermediate_size=s["ffn"],
            num_hidden_layers=s["n_layer"],
            num_attention_heads=s["n_head"],
            num_key_value_heads=s["n_kv_head"],
            max_position_embeddings=256,
        )
        net = tf.LlamaForCausalLM(cfg)
    else:
        cfg = tf.ResNetConfig(
            embedding_size=32,
            hidden_sizes=s["hidden_sizes"],
            depths=s["depths"],
            num_labels=10,
            layer_type="basic",
        )
        net = tf.ResNetForImageClassification(cfg)
    return net.train()


def hf_inputs(model: str, seed: int) -> dict:
    import torch

    c = CONFIGS[model]
    gen = torch.Generator().manual_seed(seed)
    if model in ("hf-gpt2", "hf-llama"):
        ids = torch.randint(0, c["sizes"]["vocab"], (c["batch"], c["seq"]), generator=gen)
        return {"input_ids": ids, "labels": ids}
    return {
        "pixel_values": torch.randn(c["batch"], 3, c["image"], c["image"], generator=gen),
        "labels": torch.randint(0, 10, (c["batch"],), generator=gen),
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
