"""graphtrain-stats compare's tolerance model on real runs: parity runs report no divergence over 20
AdamW steps (eager against GraphModule, eager at 1 against 2 threads; the GPT-style test model and
the transformers models), and planted 1e-3 perturbations are named at their step and module."""

import copy
import os
import shutil
import subprocess
import sys

import pytest
import torch

import graphtrain
import models
import real_models
from graphtrain.hooks import (
    StatisticsSubscriber,
    SubscriberBase,
    SubscriberManager,
    read_sidecar,
)
from graphtrain.stats import main

STEPS = 20


def _batch(name):
    if name == "gpt":
        return lambda step: (models.training_inputs("gpt", seed=step), {})
    return lambda step: ((), real_models.inputs(name, 4, step))


def _loss(out):
    return out if isinstance(out, torch.Tensor) else out.loss


def collect(model, name, out, *, wrap=False, threads=2, steps=STEPS, before=(), after=(), **dump):
    """Trains `model` with AdamW for `steps` steps, dumping statistics to `out`. Subscribers run
    in registration order: those `before` the dump change what it sees, those `after` do not."""
    batch = _batch(name)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        stats = StatisticsSubscriber(str(out), **dump)
        SubscriberManager().subscribe(model, [*before, stats, *after])
        fn = graphtrain.GraphModule(model) if wrap else model
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
        for step in range(steps):
            opt.zero_grad()
            args, kwargs = batch(step)
            _loss(fn(*args, **kwargs)).backward()
            opt.step()
    finally:
        torch.set_num_threads(previous)


def compare(a, b, capsys, *extra):
    code = main(["compare", "--baseline", str(a), "--candidate", str(b), *extra])
    return code, capsys.readouterr().out


def build(name):
    model = models.build("gpt") if name == "gpt" else real_models.build(name)
    return model.train()


@pytest.mark.parametrize("name", ["gpt", "gpt2", "bert", "llama", "vit", "resnet"])
def test_parity_runs_report_no_divergence(name, tmp_path, capsys):
    base = build(name)
    kw = {"parameter_gradients": True, "text": False}
    collect(copy.deepcopy(base), name, tmp_path / "e2", **kw)
    collect(copy.deepcopy(base), name, tmp_path / "gm", wrap=True, **kw)
    code, out = compare(tmp_path / "e2", tmp_path / "gm", capsys)
    assert code == 0, out
    if name in ("gpt", "bert"):  # thread counts change GEMM blocking and reduction order
        collect(copy.deepcopy(base), name, tmp_path / "e1", threads=1, **kw)
        code, out = compare(tmp_path / "e2", tmp_path / "e1", capsys)
        assert code == 0, out


class Scale(SubscriberBase):
    """Multiplies one module's output by 1 + 1e-3 at one step (forward). Before the dump's
    subscriber: the dump sees the scaled output."""

    def __init__(self, module, step):
        super().__init__(step, step + 1)
        self.module = module

    def post_forward_tensor_apply_impl(self, ctx, module, index, tensor):
        return tensor * (1 + 1e-3) if ctx.module_name == self.module else tensor


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * (1 + 1e-3)


class ScaleGrad(Scale):
    """Multiplies the gradient of one module's output by 1 + 1e-3 at one step (backward). After
    the dump's subscriber: the tensor it dumps the gradient of gets the scaled gradient."""

    def post_forward_tensor_apply_impl(self, ctx, module, index, tensor):
        return _ScaleGrad.apply(tensor) if ctx.module_name == self.module else tensor


@pytest.mark.parametrize(
    "planted, direction", [(Scale, "forward"), (ScaleGrad, "backward")], ids=["output", "gradient"]
)
def test_a_planted_perturbation_is_named_at_its_step_and_module(
    planted, direction, tmp_path, capsys
):
    base = build("gpt")
    kw = {"parameter_gradients": True, "text": False}
    collect(copy.deepcopy(base), "gpt", tmp_path / "a", steps=8, **kw)
    # The candidate is a GraphModule run: the perturbation runs inside the graph's Hook nodes.
    target = "blocks.0.fc" if direction == "forward" else "blocks.1.attn.proj"
    collect(
        copy.deepcopy(base),
        "gpt",
        tmp_path / "b",
        wrap=True,
        steps=8,
        **{"before" if planted is Scale else "after": [planted(target, 5)]},
        **kw,
    )
    code, out = compare(tmp_path / "a", tmp_path / "b", capsys)
    assert code == 1, out
    first = next(line for line in out.splitlines() if line.startswith("first divergence"))
    assert first.startswith(f"first divergence: step 5, module '{target}', ") and (
        f", {direction}, " in first
    ), out
    assert "step 4: 0 of" in out  # nothing before


class FlipOne(SubscriberBase):
    """Flips the sign of the largest element of one parameter's gradient at one step."""

    def __init__(self, model, path, step):
        super().__init__(step, step + 1)
        self.step = 0
        param = model.get_parameter(path)
        param.register_post_accumulate_grad_hook(self._flip)

    def post_forward_outmost_module_apply_impl(self, ctx, module, args, outputs):
        self.step = ctx.step
        return args, outputs

    def _flip(self, param):
        if self.active(self.step):
            flat = param.grad.view(-1)
            k = flat.abs().argmax()
            flat[k] = -flat[k]


def test_a_one_element_sign_flip_in_a_gradient_is_caught_through_parameter_gradients(
    tmp_path, capsys
):
    base = build("gpt")
    path = "blocks.1.fc.weight"
    for grads in (False, True):
        a, b = tmp_path / f"a{grads}", tmp_path / f"b{grads}"
        collect(copy.deepcopy(base), "gpt", a, steps=3, parameter_gradients=grads)
        candidate = copy.deepcopy(base)
        # The flip's hook goes first: the dump sees the flipped gradient, as the optimizer does.
        flip = FlipOne(candidate, path, 2)
        collect(candidate, "gpt", b, steps=3, after=[flip], parameter_gradients=grads)
        code, out = compare(a, b, capsys)
        if not grads:  # module outputs and their gradients do not show it at that step
            assert code == 0, out
            continue
        assert code == 1, out
        assert f"first divergence: step 2, module 'blocks.1.fc', tensor {path}, " in out, out
        assert "parameter gradient" in out


def test_text_false_writes_the_sidecar_only_and_text_renders_the_same_files(tmp_path, capsys):
    base = build("gpt")
    collect(copy.deepcopy(base), "gpt", tmp_path / "t", steps=2, parameter_gradients=True)
    collect(
        copy.deepcopy(base), "gpt", tmp_path / "b", steps=2, parameter_gradients=True, text=False
    )
    files = sorted(os.listdir(tmp_path / "b" / "step_1"))
    assert files == ["order.txt", "statistics.bin"]
    assert main(["text", str(tmp_path / "b")]) == 0
    for step in ("step_0", "step_1"):
        names = sorted(os.listdir(tmp_path / "t" / step))
        assert names == sorted(os.listdir(tmp_path / "b" / step))
        assert any(n.endswith("_gradient") for n in names)
        for n in names:
            assert (tmp_path / "t" / step / n).read_bytes() == (
                tmp_path / "b" / step / n
            ).read_bytes(), n
    record = read_sidecar(str(tmp_path / "b" / "step_0" / "statistics.bin"))
    some = record["blocks.0.fc.weight_gradient"]
    assert some["module"] == "blocks.0.fc" and len(some["sample"]) == 256
    assert some["shape"] == list(base.blocks[0].fc.weight.shape)


def test_an_infinity_in_one_run_only_is_a_divergence(tmp_path, capsys):
    from graphtrain._divergence import Tolerance, score

    x = torch.randn(1000)
    a = StatisticsSubscriber(str(tmp_path / "a"))
    b = StatisticsSubscriber(str(tmp_path / "b"))
    y = x.clone()
    y[7] = float("inf")
    a.dump(0, "t_forward", x)
    b.dump(0, "t_forward", y)
    ra = read_sidecar(str(tmp_path / "a" / "step_0" / "statistics.bin"))["t_forward"]
    rb = read_sidecar(str(tmp_path / "b" / "step_0" / "statistics.bin"))["t_forward"]
    v = score(ra, rb, Tolerance())
    assert v.diverges and v.statistic == "inf"
    # one element that is exactly 0 in one run and 1e-9 in the other is rounding, not divergence
    z = x.clone()
    z[3] = 0.0
    w = x.clone()
    w[3] = 1e-9
    c = StatisticsSubscriber(str(tmp_path / "c"))
    d = StatisticsSubscriber(str(tmp_path / "d"))
    c.dump(0, "t_forward", z)
    d.dump(0, "t_forward", w)
    rc = read_sidecar(str(tmp_path / "c" / "step_0" / "statistics.bin"))["t_forward"]
    rd = read_sidecar(str(tmp_path / "d" / "step_0" / "statistics.bin"))["t_forward"]
    assert rc["zero"] != rd["zero"] and not score(rc, rd, Tolerance()).diverges


CHROMIUM = shutil.which("chromium-headless-shell") or shutil.which("chromium")


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium-headless-shell")
def test_the_report_renders_in_a_browser_and_marks_the_first_divergence(tmp_path, capsys):
    base = build("gpt")
    collect(copy.deepcopy(base), "gpt", tmp_path / "a", steps=6, parameter_gradients=True)
    collect(
        copy.deepcopy(base),
        "gpt",
        tmp_path / "b",
        steps=6,
        before=[Scale("blocks.1.attn.proj", 3)],
        parameter_gradients=True,
    )
    report = tmp_path / "report.html"
    code, out = compare(tmp_path / "a", tmp_path / "b", capsys, "--html", str(report))
    assert code == 1 and f"report written to {report}" in out
    page = report.read_text()
    # self-contained: nothing loaded from elsewhere (the SVG namespace is a name, not a load)
    assert "http" not in page.replace("http://www.w3.org/2000/svg", "")
    assert " src=" not in page and "<link" not in page
    r = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=3000",
            "--dump-dom",
            report.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    dom = r.stdout
    errors = [line for line in r.stderr.splitlines() if "Uncaught" in line or "CONSOLE" in line]
    assert not errors, errors
    assert 'data-rendered="1"' in dom  # the script ran to its end
    # The first divergence: the cell of blocks.1.attn.proj's output at step 3, marked.
    import re

    cell = re.search(r'<td class="cell first[^"]*"[^>]*>', dom)
    assert cell, dom[:2000]
    tag = cell.group(0)
    assert 'data-step="3"' in tag and 'id="first-divergence"' in tag
    row = int(re.search(r'data-row="(\d+)"', tag).group(1))
    names = re.findall(r'<th class="name" title="([^"]+)"', dom)
    assert names[row].endswith("_forward") and "Linear" in names[row]
    assert "blocks.1.attn.proj" in dom  # the detail panel of the marked cell
    assert dom.count("<svg") >= 5  # the marked tensor's statistics over the steps, plotted


TRAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_gpt.py")


def train(*args, **env):
    base = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHTRAIN_")}
    r = subprocess.run(
        [sys.executable, TRAIN, *args],
        env={**base, **{f"GRAPHTRAIN_{k.upper()}": str(v) for k, v in env.items()}},
        capture_output=True,
        text=True,
        timeout=300,
    )
    return r


def test_run_switches_disable_and_stats_dir_need_no_code_change(tmp_path, capsys):
    plain = train("--steps", "3", "--no-wrap")
    disabled = train("--steps", "3", "--captured-bug", "blocks.1.attn", disable=1)
    captured = train("--steps", "3", "--captured-bug", "blocks.1.attn")
    assert plain.returncode == disabled.returncode == captured.returncode == 0
    # a pass-through never captures: the module that misbehaves only when captured behaves
    assert disabled.stdout == plain.stdout != captured.stdout
    a = train("--steps", "5", disable=1, stats_dir=tmp_path / "a", stats_steps=3)
    b = train("--steps", "5", stats_dir=tmp_path / "b", stats_steps=3)
    assert a.returncode == b.returncode == 0, a.stderr + b.stderr
    for run in ("a", "b"):
        assert sorted(os.listdir(tmp_path / run)) == ["step_0", "step_1", "step_2"]
        names = (tmp_path / run / "step_0" / "order.txt").read_text().split()
        assert any(n.endswith("_gradient") for n in names)
    code, out = compare(tmp_path / "a", tmp_path / "b", capsys)
    assert code == 0, out
    again = train("--steps", "1", stats_dir=tmp_path / "a")
    assert again.returncode != 0
    assert f"GRAPHTRAIN_STATS_DIR: '{tmp_path / 'a'}' already holds files" in again.stderr


def bisect(tmp_path, *args, **env):
    base = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHTRAIN_")}
    r = subprocess.run(
        [sys.executable, "-m", "graphtrain.stats", "bisect", "--steps", "2"]
        + ["--out", str(tmp_path / "out"), "--", sys.executable, TRAIN, "--steps", "2", *args],
        env={**base, **{f"GRAPHTRAIN_{k.upper()}": str(v) for k, v in env.items()}},
        capture_output=True,
        text=True,
        timeout=600,
    )
    return r.returncode, r.stdout + r.stderr


def test_bisect_names_the_module_that_behaves_differently_when_captured(tmp_path):
    code, out = bisect(tmp_path, "--captured-bug", "blocks.1.attn.proj")
    assert code == 1, out
    verdict = out.strip().splitlines()[-1]
    assert verdict.startswith("verdict: cause: module 'blocks.1.attn.proj'"), out
    assert "ops in its graph: " in verdict and "FusedMatMul" in verdict
    assert "run 3: candidate, compute optimizer off: diverges" in out
    runs = sorted(os.listdir(tmp_path / "out"))
    assert runs[0] == "01-baseline" and runs[1] == "02-candidate"
    assert all((tmp_path / "out" / r / "output.txt").exists() for r in runs)
    assert (tmp_path / "out" / "02-candidate" / "dumps" / "step_1").is_dir()


def test_bisect_names_a_pass_made_wrong_on_purpose(tmp_path):
    # The break scales the first value the pass makes by 1.01: attention's output here
    # (fuse_elementwise's first value now feeds a LayerNorm, which normalizes the scale away).
    code, out = bisect(tmp_path, test_break_pass="recognize_attention")
    assert code == 1, out
    assert "compute optimizer off: agrees with the baseline" in out
    verdict = out.strip().splitlines()[-1]
    assert verdict.startswith("verdict: cause: graph pass 'recognize_attention'"), out


def test_bisect_at_parity_and_on_bad_input(tmp_path):
    code, out = bisect(tmp_path / "parity")
    assert code == 0 and "verdict: no divergence over 2 steps" in out, out
    code, out = bisect(tmp_path / "fails", "--fail")
    assert code == 2 and "the command fails in the baseline run (exit 1)" in out, out
    assert "training failed: no data" in out
    code, out = bisect(tmp_path / "plain", "--no-wrap")
    assert code == 2 and "the command wraps no GraphModule" in out, out
    (tmp_path / "used" / "out").mkdir(parents=True)
    (tmp_path / "used" / "out" / "x").write_text("")
    code, out = bisect(tmp_path / "used")
    assert code == 2 and "is not empty" in out, out
