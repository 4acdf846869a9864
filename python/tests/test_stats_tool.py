"""graphtrain-stats merge and compare on real dumps of the GPT-style model (eager runs)."""

import copy
import subprocess
import sys

import torch

from graphtrain.hooks import StatisticsSubscriber, SubscriberBase, SubscriberManager
from graphtrain.stats import main
from models import build, training_inputs


class Perturb(SubscriberBase):
    """Scales one module's output at one step."""

    def __init__(self, module_name: str, step: int) -> None:
        super().__init__(step, step + 1)
        self.module_name = module_name

    def post_forward_tensor_apply_impl(self, ctx, module, index, tensor):
        return tensor * 1.01 if ctx.module_name == self.module_name else tensor


def dump(model, out, extra=(), steps=5):
    manager = SubscriberManager()
    # Subscribers run in registration order: a perturbation first, so the dump sees its result.
    manager.subscribe(model, [*extra, StatisticsSubscriber(str(out))])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(steps):
        opt.zero_grad()
        model(*training_inputs("gpt", seed=step)).backward()
        opt.step()


def test_identical_runs_agree_and_a_perturbation_is_found(tmp_path, capsys):
    base = build("gpt").train()
    dump(copy.deepcopy(base), tmp_path / "a")
    dump(copy.deepcopy(base), tmp_path / "b")
    assert (
        main(["compare", "--baseline", str(tmp_path / "a"), "--candidate", str(tmp_path / "b")])
        == 0
    )
    assert "no divergence" in capsys.readouterr().out
    dump(copy.deepcopy(base), tmp_path / "c", [Perturb("blocks.1.attn.proj", 3)])
    report = tmp_path / "report.html"
    code = main(
        [
            "compare",
            "--baseline",
            str(tmp_path / "a"),
            "--candidate",
            str(tmp_path / "c"),
            "--html",
            str(report),
        ]
    )
    out = capsys.readouterr().out
    assert code == 1
    assert "first divergence: step 3, module 'blocks.1.attn.proj'" in out and ", forward, " in out
    page = report.read_text()
    assert "first divergence: step 3" in page and "blocks.1.attn.proj" in page
    # self-contained: nothing loaded from elsewhere (the SVG namespace is a name, not a load)
    assert "http" not in page.replace("http://www.w3.org/2000/svg", "")
    assert " src=" not in page and "<link" not in page


class SkipFc1(StatisticsSubscriber):
    """A run that does not dump fc1's output (as if that module had not run)."""

    def post_forward_tensor_apply_impl(self, ctx, module, index, tensor):
        return (
            tensor
            if ctx.module_name == "fc1"
            else super().post_forward_tensor_apply_impl(ctx, module, index, tensor)
        )


def test_merge_lines_up_and_reports_missing(tmp_path, capsys):
    base = build("mlp").train()
    for name, kind in (("a", StatisticsSubscriber), ("b", SkipFc1)):
        m = copy.deepcopy(base)
        SubscriberManager().subscribe(m, [kind(str(tmp_path / name))])
        m(*training_inputs("mlp")[:1]).sum().backward()
    assert (
        main(
            [
                "merge",
                "--pt_dir",
                str(tmp_path / "a"),
                "--ort_dir",
                str(tmp_path / "b"),
                "--output_dir",
                str(tmp_path / "m"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "'Linear_1_0th_output_forward' is missing in the candidate run" in out
    a = (tmp_path / "m" / "step_0" / "baseline.txt").read_text().splitlines()
    b = (tmp_path / "m" / "step_0" / "candidate.txt").read_text().splitlines()
    headers = lambda lines: [x for x in lines if x.startswith("== ")]  # noqa: E731
    assert headers(a) == headers(b)
    assert (
        main(
            [
                "merge",
                "--baseline",
                str(tmp_path / "a"),
                "--candidate",
                str(tmp_path / "b"),
                "--output",
                str(tmp_path / "m"),
            ]
        )
        == 2
    )
    assert "--overwrite" in capsys.readouterr().err


def test_bad_input_exits_2_and_module_entry_point(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "graphtrain.stats",
            "compare",
            "--baseline",
            str(tmp_path / "none"),
            "--candidate",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "is not a folder of statistics dumps" in r.stderr
