"""graphtrain.optim.AdamW and SGD: drop-in for torch.optim's, with the same results step for step
(param groups, schedulers, state dicts both ways), on plain modules and on GraphModule."""

import copy

import pytest
import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

import graphtrain
from graphtrain.optim import SGD, AdamW


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(12, 32), nn.GELU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 3)
    )


def batches(n: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(16, 12, generator=g), torch.randn(16, 3, generator=g)) for _ in range(n)]


def train(model: nn.Module, opt: torch.optim.Optimizer, data, sched=None) -> list[float]:
    losses = []
    for x, y in data:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
        losses.append(loss.item())
    return losses


def assert_same_params(a: nn.Module, b: nn.Module, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=rtol, atol=atol, msg=lambda m, n=name: f"{n}: {m}")


def groups(model: nn.Module) -> list[dict]:
    params = list(model.parameters())
    return [{"params": params[:2], "lr": 3e-3}, {"params": params[2:], "weight_decay": 0.1}]


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(lr=1e-2),
        dict(lr=1e-2, weight_decay=0.0),
        dict(lr=1e-2, amsgrad=True),
        dict(lr=1e-2, maximize=True, betas=(0.8, 0.99), eps=1e-6),
    ],
)
def test_adamw_matches_torch(kwargs):
    ref, mine = make_model(), make_model()
    want = train(ref, torch.optim.AdamW(groups(ref), **kwargs), batches())
    got = train(mine, AdamW(groups(mine), **kwargs), batches())
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-6)
    assert_same_params(mine, ref)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(lr=0.05),
        dict(lr=0.05, momentum=0.9),
        dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
        dict(lr=0.05, momentum=0.5, dampening=0.3, maximize=True),
    ],
)
def test_sgd_matches_torch(kwargs):
    ref, mine = make_model(), make_model()
    want = train(ref, torch.optim.SGD(groups(ref), **kwargs), batches())
    got = train(mine, SGD(groups(mine), **kwargs), batches())
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-6)
    assert_same_params(mine, ref)


def test_scheduler_and_state_dict_move_between_torch_and_graphtrain():
    ref, mine = make_model(), make_model()
    data = batches(10)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt_mine = AdamW(mine.parameters(), lr=1e-2)
    sched_ref = torch.optim.lr_scheduler.StepLR(opt_ref, step_size=2, gamma=0.5)
    sched_mine = torch.optim.lr_scheduler.StepLR(opt_mine, step_size=2, gamma=0.5)
    train(ref, opt_ref, data[:5], sched_ref)
    train(mine, opt_mine, data[:5], sched_mine)
    assert opt_mine.param_groups[0]["lr"] == opt_ref.param_groups[0]["lr"] == 1e-2 * 0.25
    state = opt_mine.state_dict()
    assert set(state["state"][0]) == set(opt_ref.state_dict()["state"][0])
    for k, st in opt_ref.state_dict()["state"].items():  # the step counts as torch keeps them
        assert state["state"][k]["step"].dtype == st["step"].dtype == torch.float32
        assert state["state"][k]["step"].item() == st["step"].item() == 5
    # graphtrain's state continues in torch's optimizer, and torch's in graphtrain's.
    ref2, mine2 = copy.deepcopy(mine), copy.deepcopy(ref)
    to_torch = torch.optim.AdamW(ref2.parameters(), lr=1e-2)
    to_torch.load_state_dict(copy.deepcopy(state))  # loading shares the tensors it is given
    to_mine = AdamW(mine2.parameters(), lr=1e-2)
    to_mine.load_state_dict(copy.deepcopy(opt_ref.state_dict()))
    want = train(ref, opt_ref, data[5:])
    assert train(mine2, to_mine, data[5:]) == pytest.approx(want, rel=1e-5)
    assert train(ref2, to_torch, data[5:]) == pytest.approx(want, rel=1e-5)


def test_parameters_the_loop_cannot_take_step_through_torchs_formula():
    ref, mine = make_model().double(), make_model().double()  # float64: not fused
    want = train(
        ref,
        torch.optim.AdamW(ref.parameters(), lr=1e-2),
        [(x.double(), y.double()) for x, y in batches(4)],
    )
    got = train(
        mine, AdamW(mine.parameters(), lr=1e-2), [(x.double(), y.double()) for x, y in batches(4)]
    )
    assert got == pytest.approx(want, rel=1e-12)
    assert_same_params(mine, ref, rtol=1e-12, atol=1e-14)


def test_closure_and_no_grad_parameters():
    model = make_model()
    model[0].weight.requires_grad_(False)
    before = model[0].weight.clone()
    opt = AdamW(model.parameters(), lr=1e-2)
    x, y = batches(1)[0]

    def closure():
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert isinstance(loss, torch.Tensor)
    assert torch.equal(model[0].weight, before)
    assert model[0].weight not in opt.state


def test_graph_module_trains_with_the_fused_optimizer():
    ref, mine = make_model(), make_model()
    want = train(ref, torch.optim.AdamW(ref.parameters(), lr=1e-2), batches())
    gm = graphtrain.GraphModule(mine)
    got = train(gm, AdamW(gm.parameters(), lr=1e-2), batches())
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=1e-6)


def test_adamw_follows_what_changes_between_steps():
    """The fused step reuses what it found the step before only while it still holds: a parameter
    given new storage, a state tensor replaced, a gradient that stops being contiguous or goes
    missing, each step matches torch's AdamW doing the same."""

    def edits(model: nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
        w = model[2].weight
        if step == 3:  # new storage for a parameter (as tying or resharding code does)
            w.data = w.data.clone()
        if step == 4:  # a state tensor replaced
            opt.state[w]["exp_avg"] = opt.state[w]["exp_avg"] * 0.5
        if step == 5:  # a transposed (non-contiguous) gradient
            w.grad = w.grad.t().contiguous().t()
        if step == 6:  # no gradient for one parameter this step
            model[4].bias.grad = None

    def run(model: nn.Module, opt: torch.optim.Optimizer) -> list[float]:
        losses = []
        for i, (x, y) in enumerate(batches(9)):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            edits(model, opt, i)
            opt.step()
            losses.append(loss.item())
        return losses

    ref, mine = make_model(), make_model()
    want = run(ref, torch.optim.AdamW(ref.parameters(), lr=1e-2))
    assert run(mine, AdamW(mine.parameters(), lr=1e-2)) == pytest.approx(want, rel=1e-5)
    assert_same_params(mine, ref)


@pytest.mark.parametrize("make", [AdamW, SGD])
def test_step_hooks_and_zero_grad_behave_as_torchs(make):
    """Step pre- and post-hooks (the optimizer's and torch's global ones) run around each step, a
    pre-hook's returned arguments reach the step, and zero_grad(set_to_none=False) zeros in place."""
    model = make_model()
    opt = make(model.parameters(), lr=1e-2)
    calls = []
    x, y = batches(1)[0]

    def closure():
        calls.append("closure")
        return nn.functional.mse_loss(model(x), y)

    opt.register_step_pre_hook(
        lambda o, args, kwargs: calls.append("pre") or ((o,), {"closure": closure})
    )
    opt.register_step_post_hook(
        lambda o, args, kwargs: calls.append(("post", kwargs["closure"] is closure))
    )
    handle = register_optimizer_step_post_hook(lambda o, args, kwargs: calls.append("global post"))
    try:
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    finally:
        handle.remove()
    assert calls == ["pre", "closure", ("post", True), "global post"]
    grads = [p.grad for p in model.parameters()]
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is g and not g.any() for p, g in zip(model.parameters(), grads))
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())
