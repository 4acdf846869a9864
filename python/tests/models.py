"""Small real models used across the test suite: an MLP, a BERT-style encoder with a padding mask,
a GPT-style decoder with a causal mask and tied head, and a CNN with BatchNorm and pooling."""

from __future__ import annotations

import math

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, d_in: int = 32, hidden: int = 64, d_out: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        h = self.norm(h)
        h = nn.functional.gelu(self.fc2(h))
        return self.head(h)


class SelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q = q.reshape(b, s, self.heads, d // self.heads).transpose(1, 2)
        k = k.reshape(b, s, self.heads, d // self.heads).transpose(1, 2)
        v = v.reshape(b, s, self.heads, d // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads) + bias
        out = torch.softmax(att, dim=-1) @ v
        return self.proj(out.transpose(1, 2).reshape(b, s, d))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), bias)
        return x + self.out(nn.functional.gelu(self.fc(self.ln2(x))))


class Encoder(nn.Module):
    """BERT-style: token + position embeddings, blocks with a padding mask, a classifier."""

    def __init__(
        self,
        vocab: int = 50,
        dim: int = 32,
        heads: int = 4,
        layers: int = 2,
        max_len: int = 64,
        classes: int = 3,
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_len, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.cls = nn.Linear(dim, classes)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.tok(ids) + self.pos(pos)
        bias = (1.0 - mask[:, None, None, :].to(x.dtype)) * -1e4
        for blk in self.blocks:
            x = blk(x, bias)
        return self.cls(self.ln(x)[:, 0])


class GPT(nn.Module):
    """GPT-style decoder: causal self-attention, GELU MLP, residuals, tied output head, loss."""

    def __init__(
        self, vocab: int = 64, dim: int = 32, heads: int = 4, layers: int = 2, max_len: int = 64
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_len, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.tok.weight

    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        s = ids.shape[1]
        pos = torch.arange(s, device=ids.device)
        x = self.tok(ids) + self.pos(pos)
        causal = torch.triu(torch.full((s, s), float("-inf"), device=ids.device), diagonal=1)
        for blk in self.blocks:
            x = blk(x, causal)
        return self.head(self.ln(x))

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.logits(ids)
        return nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
        )


class CNN(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = torch.relu(self.bn2(self.conv2(x)))
        x = nn.functional.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


def example_inputs(
    name: str, batch: int = 4, seq: int = 12, seed: int = 0, width: int = 32, image: int = 16
) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    if name == "mlp":
        return (torch.randn(batch, width, generator=g),)
    if name == "encoder":
        ids = torch.randint(0, 50, (batch, seq), generator=g)
        lengths = torch.randint(1, seq + 1, (batch,), generator=g)
        mask = (torch.arange(seq)[None, :] < lengths[:, None]).to(torch.int64)
        return ids, mask
    if name == "gpt":
        return (
            torch.randint(0, 64, (batch, seq), generator=g),
            torch.randint(0, 64, (batch, seq), generator=g),
        )
    if name == "cnn":
        return (torch.randn(batch, 3, image, image, generator=g),)
    raise KeyError(name)


def build(name: str, seed: int = 0, **sizes: int) -> nn.Module:
    torch.manual_seed(seed)
    model = {"mlp": MLP, "encoder": Encoder, "gpt": GPT, "cnn": CNN}[name](**sizes)
    if name == "cnn":  # non-trivial running statistics for the eval-mode export
        model.train()
        with torch.no_grad():
            for i in range(3):
                model(*example_inputs("cnn", 8, seed=100 + i))
    return model.eval()


INPUT_NAMES = {"mlp": ["x"], "encoder": ["ids", "mask"], "gpt": ["ids", "targets"], "cnn": ["x"]}
DYNAMIC_AXES = {
    "mlp": {"x": {0: "batch"}},
    "encoder": {"ids": {0: "batch", 1: "seq"}, "mask": {0: "batch", 1: "seq"}},
    "gpt": {"ids": {0: "batch", 1: "seq"}, "targets": {0: "batch", 1: "seq"}},
    "cnn": {"x": {0: "batch"}},
}


def export(
    name: str,
    path: str,
    dynamic: bool = True,
    opset: int = 18,
    example: dict | None = None,
    **sizes: int,
) -> nn.Module:
    """Exports model `name` (built with `sizes`) to ONNX with torch's TorchScript-based exporter
    (no extra packages); `example` are keyword arguments of example_inputs."""
    import warnings

    model = build(name, **sizes)
    example = example_inputs(name, **(example or {}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            example,
            path,
            dynamo=False,
            opset_version=opset,
            input_names=INPUT_NAMES[name],
            output_names=["out"],
            dynamic_axes={**DYNAMIC_AXES[name], "out": {}} if dynamic else None,
        )
    return model


class WithLoss(nn.Module):
    """A model and its cross-entropy loss in one module, for exports that train."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        *args, labels = inputs
        return nn.functional.cross_entropy(self.model(*args), labels)


def training_inputs(
    name: str,
    batch: int = 4,
    seq: int = 12,
    seed: int = 0,
    width: int = 32,
    image: int = 16,
    vocab: int | None = None,
) -> tuple[torch.Tensor, ...]:
    """example_inputs plus labels, for the loss-producing form of each model."""
    inputs = example_inputs(name, batch, seq, seed, width, image)
    if vocab is not None and name in ("gpt", "encoder"):
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, vocab, (batch, seq), generator=g)
        inputs = (
            (ids, torch.randint(0, vocab, (batch, seq), generator=g))
            if name == "gpt"
            else (ids, inputs[1])
        )
    if name == "gpt":
        return inputs
    g = torch.Generator().manual_seed(seed + 1000)
    classes = {"mlp": 10, "encoder": 3, "cnn": 10}[name]
    return (*inputs, torch.randint(0, classes, (batch,), generator=g))


TRAINING_INPUT_NAMES = {
    "mlp": ["x", "labels"],
    "encoder": ["ids", "mask", "labels"],
    "gpt": ["ids", "targets"],
    "cnn": ["x", "labels"],
}


def training_model(name: str, seed: int = 0, **sizes: int) -> nn.Module:
    model = build(name, seed, **sizes)
    model.train()
    return model if name == "gpt" else WithLoss(model)


def export_training(
    name: str, path: str, seed: int = 0, example: dict | None = None, **sizes: int
) -> nn.Module:
    """Exports the loss-producing model in training mode, parameters kept as named initializers;
    `example` are keyword arguments of training_inputs."""
    import warnings

    model = training_model(name, seed, **sizes)
    names = TRAINING_INPUT_NAMES[name]
    axes = {n: {0: "batch"} for n in names}
    if name in ("encoder", "gpt"):
        for n in names:
            if n != "labels":
                axes[n] = {0: "batch", 1: "seq"}
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            training_inputs(name, **(example or {})),
            path,
            dynamo=False,
            opset_version=18,
            input_names=names,
            output_names=["loss"],
            dynamic_axes=axes,
            training=torch.onnx.TrainingMode.TRAINING,
            do_constant_folding=False,
        )
    model.load_state_dict(state)  # the export ran a forward: restore BatchNorm's statistics
    return model
