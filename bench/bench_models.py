"""Training step of many Hugging Face transformers architectures (random init, bench-like sizes:
hidden 128, 2 layers, batch 16 x 64 tokens, or 16 images of 64 x 64): GraphModule against eager
and torch.compile at one thread, each runner in its own process. A survey for slow ops and
unsupported models on the models users bring, beside bench_training.py's fixed set; results go to
bench/results/real_models.md.

    python bench/bench_models.py [--models bert-mlm convnext ...] [--no-compile] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings
from typing import Any

V, B, T = 1000, 16, 64
HIDDEN = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512)
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _models() -> dict[str, tuple[Any, str]]:
    """name -> (a function making the model, its input kind)."""
    import transformers as tf

    return {
        "bert-mlm": (
            lambda: tf.BertForMaskedLM(tf.BertConfig(vocab_size=V, **HIDDEN, **NO_DROPOUT)),
            "lm",
        ),
        "roberta-cls": (
            lambda: tf.RobertaForSequenceClassification(
                tf.RobertaConfig(vocab_size=V, **HIDDEN, **NO_DROPOUT, num_labels=3)
            ),
            "cls",
        ),
        "distilbert-cls": (
            lambda: tf.DistilBertForSequenceClassification(
                tf.DistilBertConfig(
                    vocab_size=V,
                    dim=128,
                    n_layers=2,
                    n_heads=4,
                    hidden_dim=512,
                    dropout=0.0,
                    attention_dropout=0.0,
                    seq_classif_dropout=0.0,
                    num_labels=3,
                )
            ),
            "cls",
        ),
        "albert-mlm": (
            lambda: tf.AlbertForMaskedLM(
                tf.AlbertConfig(
                    vocab_size=V,
                    embedding_size=64,
                    **HIDDEN,
                    **NO_DROPOUT,
                    classifier_dropout_prob=0.0,
                )
            ),
            "lm",
        ),
        "electra-cls": (
            lambda: tf.ElectraForSequenceClassification(
                tf.ElectraConfig(
                    vocab_size=V, embedding_size=128, **HIDDEN, **NO_DROPOUT, num_labels=3
                )
            ),
            "cls",
        ),
        # problem_type set: DeBERTa's default loss branches on the labels' values (torch.export
        # cannot capture that; graphtrain's error names the line)
        "deberta-v2-cls": (
            lambda: tf.DebertaV2ForSequenceClassification(
                tf.DebertaV2Config(
                    vocab_size=V,
                    **HIDDEN,
                    **NO_DROPOUT,
                    num_labels=3,
                    problem_type="single_label_classification",
                )
            ),
            "cls",
        ),
        "opt": (
            lambda: tf.OPTForCausalLM(
                tf.OPTConfig(
                    vocab_size=V,
                    hidden_size=128,
                    num_hidden_layers=2,
                    num_attention_heads=4,
                    ffn_dim=512,
                    dropout=0.0,
                    attention_dropout=0.0,
                    word_embed_proj_dim=128,
                )
            ),
            "lm",
        ),
        "gpt-neox": (
            lambda: tf.GPTNeoXForCausalLM(
                tf.GPTNeoXConfig(vocab_size=V, **HIDDEN, hidden_dropout=0.0, attention_dropout=0.0)
            ),
            "lm",
        ),
        "phi": (
            lambda: tf.PhiForCausalLM(
                tf.PhiConfig(
                    vocab_size=V, **HIDDEN, resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0
                )
            ),
            "lm",
        ),
        "qwen2": (
            lambda: tf.Qwen2ForCausalLM(
                tf.Qwen2Config(vocab_size=V, **HIDDEN, num_key_value_heads=2)
            ),
            "lm",
        ),
        "gemma": (
            lambda: tf.GemmaForCausalLM(
                tf.GemmaConfig(vocab_size=V, **HIDDEN, num_key_value_heads=2, head_dim=32)
            ),
            "lm",
        ),
        "bloom": (
            lambda: tf.BloomForCausalLM(
                tf.BloomConfig(vocab_size=V, hidden_size=128, n_layer=2, n_head=4)
            ),
            "lm",
        ),
        "falcon": (
            lambda: tf.FalconForCausalLM(
                tf.FalconConfig(
                    vocab_size=V, hidden_size=128, num_hidden_layers=2, num_attention_heads=4
                )
            ),
            "lm",
        ),
        "gpt-j": (
            lambda: tf.GPTJForCausalLM(
                tf.GPTJConfig(
                    vocab_size=V,
                    n_embd=128,
                    n_layer=2,
                    n_head=4,
                    rotary_dim=16,
                    resid_pdrop=0.0,
                    embd_pdrop=0.0,
                    attn_pdrop=0.0,
                )
            ),
            "lm",
        ),
        "t5": (
            lambda: tf.T5ForConditionalGeneration(
                tf.T5Config(
                    vocab_size=V,
                    d_model=128,
                    d_kv=32,
                    d_ff=512,
                    num_layers=2,
                    num_heads=4,
                    dropout_rate=0.0,
                    decoder_start_token_id=0,
                )
            ),
            "seq2seq",
        ),
        "bart": (
            lambda: tf.BartForConditionalGeneration(
                tf.BartConfig(
                    vocab_size=V,
                    d_model=128,
                    encoder_layers=2,
                    decoder_layers=2,
                    encoder_attention_heads=4,
                    decoder_attention_heads=4,
                    encoder_ffn_dim=512,
                    decoder_ffn_dim=512,
                    dropout=0.0,
                    attention_dropout=0.0,
                    activation_dropout=0.0,
                )
            ),
            "seq2seq",
        ),
        "vit": (
            lambda: tf.ViTForImageClassification(
                tf.ViTConfig(image_size=64, patch_size=8, **HIDDEN, **NO_DROPOUT, num_labels=3)
            ),
            "image",
        ),
        "swin": (
            lambda: tf.SwinForImageClassification(
                tf.SwinConfig(
                    image_size=64,
                    patch_size=4,
                    embed_dim=32,
                    depths=[2, 2],
                    num_heads=[2, 4],
                    window_size=4,
                    num_labels=3,
                    drop_path_rate=0.0,
                    hidden_dropout_prob=0.0,
                    attention_probs_dropout_prob=0.0,
                )
            ),
            "image",
        ),
        "convnext": (
            lambda: tf.ConvNextForImageClassification(
                tf.ConvNextConfig(hidden_sizes=[32, 64], depths=[2, 2], num_stages=2, num_labels=3)
            ),
            "image",
        ),
        "mobilenet-v2": (
            lambda: tf.MobileNetV2ForImageClassification(
                tf.MobileNetV2Config(
                    image_size=64, depth_multiplier=0.5, num_labels=3, classifier_dropout_prob=0.0
                )
            ),
            "image",
        ),
        "beit": (  # relative position bias, drop path
            lambda: tf.BeitForImageClassification(
                tf.BeitConfig(
                    image_size=64,
                    patch_size=8,
                    **HIDDEN,
                    **NO_DROPOUT,
                    num_labels=3,
                    use_relative_position_bias=True,
                )
            ),
            "image",
        ),
        "segformer": (  # semantic segmentation: bilinear upsampling, drop path
            lambda: tf.SegformerForSemanticSegmentation(
                tf.SegformerConfig(
                    num_labels=3,
                    hidden_sizes=[16, 32, 64, 128],
                    decoder_hidden_size=64,
                    hidden_dropout_prob=0.0,
                    attention_probs_dropout_prob=0.0,
                    classifier_dropout_prob=0.0,
                )
            ),
            "segmentation",
        ),
        "wav2vec2": (
            lambda: tf.Wav2Vec2ForSequenceClassification(
                tf.Wav2Vec2Config(
                    hidden_size=64,
                    num_hidden_layers=2,
                    num_attention_heads=4,
                    intermediate_size=128,
                    num_labels=3,
                    conv_dim=(32, 32, 32),
                    conv_stride=(5, 2, 2),
                    conv_kernel=(10, 3, 3),
                    num_conv_pos_embeddings=16,
                    num_conv_pos_embedding_groups=4,
                    hidden_dropout=0.0,
                    attention_dropout=0.0,
                    activation_dropout=0.0,
                    feat_proj_dropout=0.0,
                    final_dropout=0.0,
                    layerdrop=0.0,
                    mask_time_prob=0.0,
                )
            ),
            "audio",
        ),
        "mixtral": (  # 4 experts, top 2
            lambda: tf.MixtralForCausalLM(
                tf.MixtralConfig(
                    vocab_size=V,
                    **HIDDEN,
                    num_key_value_heads=2,
                    num_local_experts=4,
                    num_experts_per_tok=2,
                )
            ),
            "lm",
        ),
    }


def _inputs(kind: str, seed: int) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(seed)

    def ids(t: int = T) -> torch.Tensor:
        return torch.randint(0, V, (B, t), generator=g)

    if kind == "lm":
        x = ids()
        return {"input_ids": x, "labels": x}
    if kind == "cls":
        return {
            "input_ids": ids(),
            "attention_mask": torch.ones(B, T, dtype=torch.long),
            "labels": torch.randint(0, 3, (B,), generator=g),
        }
    if kind == "seq2seq":
        return {"input_ids": ids(), "labels": ids(32)}
    if kind == "audio":  # 4000 samples: 199 frames after the feature extractor
        return {
            "input_values": torch.randn(B, 4000, generator=g),
            "labels": torch.randint(0, 3, (B,), generator=g),
        }
    if kind == "segmentation":
        return {
            "pixel_values": torch.randn(B, 3, 64, 64, generator=g),
            "labels": torch.randint(0, 3, (B, 64, 64), generator=g),
        }
    return {
        "pixel_values": torch.randn(B, 3, 64, 64, generator=g),
        "labels": torch.randint(0, 3, (B,), generator=g),
    }


def worker(runner: str, name: str, iters: int) -> dict[str, Any]:
    warnings.filterwarnings("ignore")
    import torch
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.set_num_threads(1)
    import graphtrain
    import graphtrain.optim
    from machine import median_ms

    make, kind = _models()[name]
    torch.manual_seed(0)
    net = make().train()
    batches = [_inputs(kind, s) for s in range(3)]
    if runner == "GraphModule":
        fn: Any = graphtrain.GraphModule(net)
        opt: Any = graphtrain.optim.AdamW(net.parameters(), lr=1e-4)
    else:
        fn = torch.compile(net) if runner == "torch.compile" else net
        opt = torch.optim.AdamW(net.parameters(), lr=1e-4)

    def step(i: int) -> None:
        opt.zero_grad(set_to_none=True)
        fn(**batches[i % 3]).loss.backward()
        opt.step()

    t0 = time.perf_counter()
    step(0)
    first = time.perf_counter() - t0
    for i in range(1, 5):
        step(i)
    return {"median_ms": median_ms(step, iters), "first_s": first}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="*", help="models to run (default: all)")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        runner, name, iters = args.worker
        print(json.dumps(worker(runner, name, int(iters))))
        return 0
    from machine import describe, write_results

    names = args.models or list(_models())
    iters = 8 if args.quick else 15
    runners = ["eager", "GraphModule"] + ([] if args.no_compile else ["torch.compile"])
    env = dict(os.environ, GRAPHTRAIN_NUM_THREADS="1", OMP_NUM_THREADS="1")
    rows = []
    for name in names:
        result: dict[str, Any] = {}
        for runner in runners:
            out = subprocess.run(
                [sys.executable, __file__, "--worker", runner, name, str(iters)],
                capture_output=True,
                text=True,
                env=env,
            )
            if out.returncode != 0:
                last = (out.stderr.strip().splitlines() or ["?"])[-1]
                result[runner] = {"error": last[:300]}
            else:
                result[runner] = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append((name, result))
        print(name, json.dumps(result), flush=True)
    lines = [
        "# Training step of transformers architectures: GraphModule vs eager and torch.compile",
        "",
        f"Machine: {describe()}",
        "",
        "One thread. One step = forward, backward and AdamW. Random init, hidden 128, 2 layers (or "
        "the nearest configuration), batch 16 x 64 tokens or 16 images of 64 x 64 (bench/"
        f"bench_models.py). Median of {iters} steps after 5; each runner in its own process. "
        "Ratio = the runner's step time / GraphModule's (> 1: GraphModule is faster). First "
        "step: seconds, capture or compilation included.",
        "",
        "| model | eager ms | GraphModule ms | vs eager | torch.compile ms | vs torch.compile "
        "| first step s (GraphModule) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, result in rows:
        g = result.get("GraphModule", {})
        cells = []
        for runner in ("eager", "GraphModule", "torch.compile"):
            r = result.get(runner)
            cells.append("" if r is None else "failed" if "error" in r else f"{r['median_ms']:.2f}")
        ratio = [
            f"{result[r]['median_ms'] / g['median_ms']:.2f}x"
            if "median_ms" in g and "median_ms" in result.get(r, {})
            else ""
            for r in ("eager", "torch.compile")
        ]
        first = f"{g['first_s']:.2f}" if "first_s" in g else ""
        lines.append(
            f"| {name} | {cells[0]} | {cells[1]} | {ratio[0]} | {cells[2]} | {ratio[1]} | {first} |"
        )
    failures = [(n, r, v["error"]) for n, res in rows for r, v in res.items() if "error" in v]
    if failures:
        lines += ["", "Failures:", ""] + [f"- {n} ({r}): {e}" for n, r, e in failures]
    write_results("real_models.md", lines + [""])
    return 0


if __name__ == "__main__":
    sys.exit(main())
