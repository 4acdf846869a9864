"""Small random-init configurations of real Hugging Face transformers models (default settings:
sdpa attention, default cache behaviour; dropout 0) and their inputs, for the real-model tests and
the benchmark. No weights are downloaded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import transformers as tf

tf.logging.set_verbosity_error()

VOCAB = 96


def _tokens(batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=gen)


def gpt2() -> torch.nn.Module:
    cfg = tf.GPT2Config(
        n_embd=32,
        n_layer=2,
        n_head=4,
        vocab_size=VOCAB,
        n_positions=64,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    return tf.GPT2LMHeadModel(cfg)


def gpt2_inputs(batch: int, gen: torch.Generator) -> dict[str, Any]:
    ids = _tokens(batch, 16, gen)
    return {"input_ids": ids, "labels": ids}


def bert() -> torch.nn.Module:
    cfg = tf.BertConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=3,
    )
    return tf.BertForSequenceClassification(cfg)


def bert_inputs(batch: int, gen: torch.Generator) -> dict[str, Any]:
    ids = _tokens(batch, 16, gen)
    mask = torch.ones(batch, 16, dtype=torch.long)
    for row in range(batch):  # padding of a different length in each row
        mask[row, 16 - 3 * row % 12 :] = 0
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "labels": torch.randint(0, 3, (batch,), generator=gen),
    }


def llama() -> torch.nn.Module:
    cfg = tf.LlamaConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        pad_token_id=0,
    )
    return tf.LlamaForCausalLM(cfg)


def llama_inputs(batch: int, gen: torch.Generator) -> dict[str, Any]:
    ids = _tokens(batch, 16, gen)
    return {"input_ids": ids, "labels": ids}


def vit() -> torch.nn.Module:
    cfg = tf.ViTConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        image_size=16,
        patch_size=4,
        num_labels=3,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return tf.ViTForImageClassification(cfg)


def image_inputs(size: int) -> Callable[[int, torch.Generator], dict[str, Any]]:
    def make(batch: int, gen: torch.Generator) -> dict[str, Any]:
        return {
            "pixel_values": torch.randn(batch, 3, size, size, generator=gen),
            "labels": torch.randint(0, 3, (batch,), generator=gen),
        }

    return make


def resnet() -> torch.nn.Module:
    cfg = tf.ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=3, layer_type="basic"
    )
    return tf.ResNetForImageClassification(cfg)


MODELS: dict[
    str, tuple[Callable[[], torch.nn.Module], Callable[[int, torch.Generator], dict[str, Any]]]
] = {
    "gpt2": (gpt2, gpt2_inputs),
    "bert": (bert, bert_inputs),
    "llama": (llama, llama_inputs),
    "vit": (vit, image_inputs(16)),
    "resnet": (resnet, image_inputs(32)),
}


def _seq2seq_inputs(batch: int, gen: torch.Generator) -> dict[str, Any]:
    return {"input_ids": _tokens(batch, 12, gen), "labels": _tokens(batch, 7, gen)}


def _classifier_inputs(batch: int, gen: torch.Generator) -> dict[str, Any]:
    ids = _tokens(batch, 12, gen)
    mask = torch.ones(batch, 12, dtype=torch.long)
    mask[-1, 8:] = 0
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "labels": torch.randint(0, 3, (batch,), generator=gen),
    }


def _audio_inputs(batch: int, gen: torch.Generator) -> dict[str, Any]:
    return {
        "input_values": torch.randn(batch, 400, generator=gen),
        "labels": torch.randint(0, 3, (batch,), generator=gen),
    }


def _segmentation_inputs(batch: int, gen: torch.Generator) -> dict[str, Any]:
    return {
        "pixel_values": torch.randn(batch, 3, 32, 32, generator=gen),
        "labels": torch.randint(0, 3, (batch, 32, 32), generator=gen),
    }


_SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)

# Architectures beyond the five above, each with what sets it apart: T5's learned relative position
# bias and encoder-decoder cache, Mistral's sliding-window cache, Mixtral's routed experts, BLOOM's
# ALiBi and custom GELU Function, Falcon's multi-query attention, Swin's shifted windows with
# computed padding, RoBERTa's cumsum position ids, SegFormer's bilinear upsampling (decode head and loss), BEiT's
# relative position bias resized bilinearly, wav2vec2's GroupNorm and weight norm, MobileViT's
# attention over unfolded patches, ConvNeXt's depthwise convolutions and LayerNorm over channels.
MORE: dict[
    str, tuple[Callable[[], torch.nn.Module], Callable[[int, torch.Generator], dict[str, Any]]]
] = {
    "t5": (
        lambda: tf.T5ForConditionalGeneration(
            tf.T5Config(
                vocab_size=VOCAB,
                d_model=32,
                d_kv=8,
                d_ff=64,
                num_layers=2,
                num_heads=4,
                dropout_rate=0.0,
                decoder_start_token_id=0,
            )
        ),
        _seq2seq_inputs,
    ),
    "mistral": (
        lambda: tf.MistralForCausalLM(
            tf.MistralConfig(vocab_size=VOCAB, **_SMALL, num_key_value_heads=2, sliding_window=8)
        ),
        llama_inputs,
    ),
    "bloom": (
        lambda: tf.BloomForCausalLM(
            tf.BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4)
        ),
        llama_inputs,
    ),
    "mixtral": (  # a mixture of experts: top-2 routing, tokens sorted, grouped expert GEMMs
        lambda: tf.MixtralForCausalLM(
            tf.MixtralConfig(
                vocab_size=VOCAB,
                **_SMALL,
                num_key_value_heads=2,
                num_local_experts=4,
                num_experts_per_tok=2,
            )
        ),
        llama_inputs,
    ),
    "falcon": (
        lambda: tf.FalconForCausalLM(
            tf.FalconConfig(
                vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4
            )
        ),
        llama_inputs,
    ),
    "swin": (
        lambda: tf.SwinForImageClassification(
            tf.SwinConfig(
                image_size=32,
                patch_size=4,
                embed_dim=16,
                depths=[1, 1],
                num_heads=[2, 4],
                window_size=4,
                num_labels=3,
                drop_path_rate=0.0,
                hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0,
            )
        ),
        image_inputs(32),
    ),
    "roberta": (
        lambda: tf.RobertaForSequenceClassification(
            tf.RobertaConfig(
                vocab_size=VOCAB,
                **_SMALL,
                num_labels=3,
                hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0,
            )
        ),
        _classifier_inputs,
    ),
    "segformer": (  # semantic segmentation: bilinear upsampling in the decode head and the loss
        lambda: tf.SegformerForSemanticSegmentation(
            tf.SegformerConfig(
                num_labels=3,
                num_encoder_blocks=2,
                depths=[1, 1],
                sr_ratios=[2, 1],
                hidden_sizes=[8, 16],
                num_attention_heads=[1, 2],
                decoder_hidden_size=16,
                drop_path_rate=0.0,
                hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0,
                classifier_dropout_prob=0.0,
            )
        ),
        _segmentation_inputs,
    ),
    "beit": (  # relative position bias, resized bilinearly to the window
        lambda: tf.BeitForImageClassification(
            tf.BeitConfig(
                image_size=32,
                patch_size=8,
                **_SMALL,
                num_labels=3,
                use_relative_position_bias=True,
                drop_path_rate=0.0,
                hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0,
            )
        ),
        image_inputs(32),
    ),
    "wav2vec2": (  # audio: GroupNorm over each channel, a weight-normed positional convolution
        lambda: tf.Wav2Vec2ForSequenceClassification(
            tf.Wav2Vec2Config(
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=64,
                num_labels=3,
                conv_dim=(16, 16),
                conv_stride=(5, 2),
                conv_kernel=(10, 3),
                num_conv_pos_embeddings=8,
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
        _audio_inputs,
    ),
    "mobilevit": (  # convolutions around transformer blocks over unfolded patches
        lambda: tf.MobileViTForImageClassification(
            tf.MobileViTConfig(
                image_size=32,
                num_labels=3,
                hidden_sizes=[16, 24, 32],
                neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64],
                hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0,
                classifier_dropout_prob=0.0,
            )
        ),
        image_inputs(32),
    ),
    "convnext": (
        lambda: tf.ConvNextForImageClassification(
            tf.ConvNextConfig(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, num_labels=3)
        ),
        image_inputs(32),
    ),
}


def build(name: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = (MODELS.get(name) or MORE[name])[0]()
    model.train()
    return model


def inputs(name: str, batch: int, seed: int) -> dict[str, Any]:
    return (MODELS.get(name) or MORE[name])[1](batch, torch.Generator().manual_seed(seed))
