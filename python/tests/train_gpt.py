"""A user's training script, for the tests of the run-level switches and of graphtrain-stats
bisect: the GPT-style test model wrapped in GraphModule, AdamW, a few steps.

    python train_gpt.py [--steps N] [--captured-bug MODULE] [--fail]

--captured-bug scales MODULE's output by 1.01 only while torch.export captures it (a module that
behaves differently when captured); --fail exits 1 at once (a broken command).
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import graphtrain  # noqa: E402
import models  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--captured-bug", default="")
    parser.add_argument("--no-wrap", action="store_true", help="do not use GraphModule")
    parser.add_argument("--fail", action="store_true")
    args = parser.parse_args()
    if args.fail:
        print("training failed: no data", file=sys.stderr)
        return 1
    model = models.build("gpt").train()
    if args.captured_bug:
        module = model.get_submodule(args.captured_bug)
        original = module.forward

        def forward(*a, **k):
            out = original(*a, **k)
            return out * 1.01 if torch.compiler.is_exporting() else out

        module.forward = forward
    net = model if args.no_wrap else graphtrain.GraphModule(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        opt.zero_grad()
        loss = net(*models.training_inputs("gpt", seed=step))
        loss.backward()
        opt.step()
        print(f"step {step}: loss {loss.item():.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
