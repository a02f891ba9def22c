"""GRPO pieces on hand-sized examples: advantages, the clipped loss, and the Trainer's bookkeeping
(stale rollouts, zero-advantage groups, micro-batching, checkpoints) on a micro Llama built in tmp."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pool.grpo import Trainer, group_advantages, grpo_loss
from tests.grpo_data import micro_llama, rollout

# --- advantages -------------------------------------------------------------------------------------


def test_group_advantages_normalise_per_group() -> None:
    gen = torch.Generator().manual_seed(0)
    groups = torch.tensor([7] * 5 + [3] * 8 + [11] * 2 + [4] * 3 + [9])  # non-contiguous ids, a singleton
    rewards = torch.rand(len(groups), generator=gen, dtype=torch.float64)
    rewards[13:15] = torch.tensor([0.3, 0.3])  # group 11: constant
    rewards[15:18] = 0.1  # group 4: constant, a value whose mean rounds (0.1 * 3 / 3)
    adv = group_advantages(rewards, groups)
    for g in (7, 3):
        a = adv[groups == g]
        assert abs(float(a.mean())) < 1e-9
        assert abs(float(a.std(unbiased=False)) - 1.0) < 1e-4  # population std (eps = 1e-6 aside)
    for g in (11, 4, 9):
        assert torch.equal(adv[groups == g], torch.zeros(int((groups == g).sum()), dtype=adv.dtype))
    # order within a group preserved: the best reward gets the largest advantage
    sel = groups == 3
    assert int(adv[sel].argmax()) == int(rewards[sel].argmax())
    assert group_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0])).tolist() == pytest.approx(
        [1.0, -1.0], rel=1e-5
    )
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(3), torch.zeros(2, dtype=torch.long))


# --- loss -------------------------------------------------------------------------------------------


def _ratios_example() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ratios = torch.tensor([[1.1, 1.5, 0.5, 5.0], [1.1, 1.5, 0.5, 5.0]], dtype=torch.float64)
    old = torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-2.5, -1.0, -0.7, -4.0]], dtype=torch.float64)
    return old + ratios.log(), old, torch.tensor([1.0, -1.0], dtype=torch.float64)


def test_loss_matches_hand_computation() -> None:
    """eps 0.2, delta 4. Per token min(r'*A, clip(r', .8, 1.2)*A) with r' = min(r, 4):
    A=+1: r 1.1 -> 1.1 | 1.5 -> 1.2 (clipped) | 0.5 -> 0.5 | 5 -> r'=4 -> 1.2 (clipped)
    A=-1: r 1.1 -> -1.1 | 1.5 -> -1.5 | 0.5 -> -0.8 (clipped) | 5 -> r'=4 -> -4.0 (delta; PPO alone: -5)
    loss = -(4.0 - 7.4) / 8 tokens = 0.425; 4 of 8 tokens have their gradient switched off."""
    lp, old, adv = _ratios_example()
    lp = lp.clone().requires_grad_(True)
    mask = torch.ones_like(lp)
    loss, stats = grpo_loss(lp, old, adv, mask)
    assert float(loss.detach()) == pytest.approx(0.425, abs=1e-9)
    assert stats["clip_frac"] == pytest.approx(0.5)
    assert stats["ratio_mean"] == pytest.approx((1.1 + 1.5 + 0.5 + 5.0) / 4)
    kl = [(r - 1) - torch.tensor(r).log().item() for r in (1.1, 1.5, 0.5, 5.0)]
    assert stats["approx_kl"] == pytest.approx(sum(kl) / 4)

    loss.backward()
    assert lp.grad is not None
    g = lp.grad / (1 / 8)  # d loss / d lp = -A * r / n_tokens where the unclipped branch is active
    expected = torch.tensor([[-1.1, 0.0, -0.5, 0.0], [1.1, 1.5, 0.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(g, expected, atol=1e-9)

    # without the delta bound (delta huge) the A<0, r=5 token gives -5 and keeps its gradient
    loss2, _ = grpo_loss(lp.detach(), old, adv, mask, delta=1e9)
    assert float(loss2) == pytest.approx(-(4.0 - 8.4) / 8, abs=1e-9)


def test_loss_at_ratio_one_is_policy_gradient() -> None:
    lp = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    adv = torch.tensor([0.7])
    loss, stats = grpo_loss(lp, lp.detach(), adv, torch.ones(1, 3))
    assert float(loss.detach()) == pytest.approx(-0.7)
    loss.backward()
    assert lp.grad is not None and torch.allclose(lp.grad, torch.full((1, 3), -0.7 / 3))
    assert stats["clip_frac"] == 0.0 and stats["ratio_mean"] == pytest.approx(1.0) and stats["approx_kl"] == 0.0


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_gradient_sign_moves_logprob(sign: float) -> None:
    logits = torch.nn.Parameter(torch.zeros(6))
    opt = torch.optim.SGD([logits], lr=0.5)
    tokens = torch.tensor([[2, 2, 4]])

    def token_logprobs() -> torch.Tensor:
        return torch.log_softmax(logits, -1)[tokens]

    before = token_logprobs().detach()
    loss, _ = grpo_loss(token_logprobs(), before, torch.tensor([sign]), torch.ones(1, 3))
    opt.zero_grad()
    loss.backward()
    opt.step()
    after = token_logprobs().detach()
    assert bool(((after - before) * sign > 0).all())


def test_masked_tokens_contribute_nothing() -> None:
    lp, old, adv = _ratios_example()
    mask = torch.tensor([[1, 1, 0, 1], [1, 0, 1, 1]], dtype=torch.float64)
    loss, stats = grpo_loss(lp, old, adv, mask)
    garbage = lp.clone()
    garbage[mask == 0] = 50.0  # ratio e^50 on masked tokens
    x = garbage.clone().requires_grad_(True)
    loss2, stats2 = grpo_loss(x, old, adv, mask)
    assert float(loss2.detach()) == pytest.approx(float(loss)) and stats2 == pytest.approx(stats)
    loss2.backward()
    assert x.grad is not None and bool((x.grad[mask == 0] == 0).all())
    # token-level: 6 unmasked tokens, (1.1 + 1.2 + 1.2) + (-1.1 - 0.8 - 4.0) = -2.4
    assert float(loss) == pytest.approx(2.4 / 6)


def test_kl_and_entropy_terms() -> None:
    lp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -2.0]])
    ent = torch.tensor([[2.0, 4.0]])
    base, _ = grpo_loss(lp, lp, torch.tensor([1.0]), torch.ones(1, 2))
    loss, stats = grpo_loss(
        lp, lp, torch.tensor([1.0]), torch.ones(1, 2), kl_coef=0.1, ref_logprobs=ref, entropy_coef=0.01, entropy=ent
    )
    k3 = (torch.exp(torch.tensor(-0.5)) + 0.5 - 1).item() / 2
    assert stats["kl_ref"] == pytest.approx(k3) and stats["entropy"] == pytest.approx(3.0)
    assert float(loss) == pytest.approx(float(base) + 0.1 * k3 - 0.01 * 3.0)
    with pytest.raises(ValueError):
        grpo_loss(lp, lp, torch.tensor([1.0]), torch.ones(1, 2), kl_coef=0.1)


# --- trainer ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def micro_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1-layer Llama with a 32-token vocabulary (no tokenizer: the trainer works on token ids)."""
    return micro_llama(tmp_path_factory.mktemp("micro"), layers=1)


def _weights(t: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in t.state_dict_for_inference().items()}


def test_stale_rollouts_are_rejected_and_never_trained(micro_model: Path) -> None:
    t = Trainer(micro_model, lr=1e-2, async_level=2)
    w0 = _weights(t)
    signal = [[1.0, 0.0, 0.5, 0.0]]
    flat = [[0.2, 0.2, 0.2]]
    files = [rollout(2, signal), rollout(3, flat), rollout(5, flat), rollout(6, signal)]  # current 5: 3..5 accepted
    stats = t.step(files, current_version=5)
    assert (stats.stale_rejected, stats.stale_samples, stats.files) == (2, 8, 2)
    assert (stats.samples_seen, stats.samples_trained, stats.zero_adv_dropped) == (6, 0, 6)
    assert stats.optimizer_steps == 0 and stats.tokens == 0
    assert stats.mean_reward == pytest.approx(0.2)
    assert all(torch.equal(w0[k], v) for k, v in _weights(t).items())  # the stale signal was not used

    stats = t.step([rollout(3, signal), rollout(1, signal)], current_version=5)
    assert (stats.stale_rejected, stats.samples_trained, stats.optimizer_steps) == (1, 4, 1)
    assert any(not torch.equal(w0[k], v) for k, v in _weights(t).items())


def test_zero_advantage_groups_dropped(micro_model: Path) -> None:
    t = Trainer(micro_model, lr=1e-3)
    f = rollout(0, [[0.5, 0.5, 0.5, 0.5], [1.0, 0.0, 0.0, 1.0], [0.0]])
    stats = t.step([f], current_version=0)
    assert (stats.samples_seen, stats.zero_adv_dropped, stats.samples_trained) == (9, 5, 4)
    assert stats.tokens == sum(len(s.completion_tokens) for s in f.samples if s.group == 1)
    assert stats.mean_reward == pytest.approx(4.0 / 9)
    # same (file, group) ids in two files are different groups: a 1.0 group and a 0.0 group stay flat
    stats = t.step([rollout(0, [[1.0, 1.0]]), rollout(0, [[0.0, 0.0]])], current_version=0)
    assert stats.samples_trained == 0 and stats.zero_adv_dropped == 4
    # first optimizer step: the recomputed old log-probs equal the current ones, ratio exactly 1
    stats = t.step([f], current_version=0)
    assert stats.ratio_mean == pytest.approx(1.0) and stats.clip_frac == 0.0 and stats.grad_norm > 0


def test_micro_batches_equal_one_batch_and_checkpoint_loads(micro_model: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    files = [rollout(0, [[1.0, 0.0, 0.3, 0.9], [0.1, 0.2, 0.7]], seed=3)]
    a = Trainer(micro_model, lr=1e-3, micro_batch_size=1)
    b = Trainer(micro_model, lr=1e-3, micro_batch_size=16)
    sa, sb = a.step(files, 0), b.step(files, 0)
    assert sa.loss == pytest.approx(sb.loss, abs=1e-6) and sa.grad_norm == pytest.approx(sb.grad_norm, rel=1e-4)
    wa, wb = _weights(a), _weights(b)
    assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)

    c = Trainer(micro_model, lr=1e-3, mini_batches=3, micro_batch_size=2)
    sc = c.step(files, 0)
    assert sc.optimizer_steps == 3 and sc.samples_trained == 7 and sc.ratio_mean != 1.0

    folder = a.save(tmp_path / "ckpt")
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
    saved = load_file(str(folder / "model.safetensors"))
    assert set(saved) == set(wa) and all(torch.equal(saved[k], wa[k]) for k in wa)
    reloaded = AutoModelForCausalLM.from_pretrained(str(folder))
    assert all(torch.equal(v, wa[k]) for k, v in reloaded.state_dict().items())
    a.save(folder)  # replacing an existing checkpoint
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_old_logprobs_come_from_the_version_that_generated_the_sample(micro_model: Path, tmp_path: Path) -> None:
    """A sample of version 0 trained at version 1 gets its old log-probs from version 0's weights, so
    the first optimizer step's ratio is pi_1 / pi_0, not 1: the clip sees how far the last update
    already moved those tokens. A trainer restarted from version 1 does not have version 0's weights:
    it falls back to the current ones (ratio exactly 1, counted) until `remember` gives them back."""
    f0 = rollout(0, [[1.0, 0.0, 0.3, 0.9], [0.1, 0.2, 0.7]], seed=3)
    a = Trainer(micro_model, lr=1e-2, async_level=2)
    a.step([f0], 0)
    v1 = a.save(tmp_path / "v1")
    stale = a.step([f0], 1)
    assert stale.behaviour_fallback == 0 and stale.samples_trained == 7
    assert abs(stale.ratio_mean - 1.0) > 1e-3

    restarted = Trainer(v1, lr=1e-2, async_level=2)
    s = restarted.step([f0], 1)
    assert s.behaviour_fallback == 7 and s.ratio_mean == pytest.approx(1.0)

    told = Trainer(v1, lr=1e-2, async_level=2)
    told.remember(0, micro_model)
    s = told.step([f0], 1)
    assert s.behaviour_fallback == 0 and s.ratio_mean == pytest.approx(stale.ratio_mean, rel=1e-6)
    # versions no accepted sample can come from any more are forgotten
    told.step([f0], 2)
    told.step([rollout(3, [[1.0, 0.0]])], 3)
    assert sorted(told._history) == [1, 2, 3]


def test_optimizer_state_resumes_after_a_restart(micro_model: Path, tmp_path: Path) -> None:
    """A trainer restarted from a checkpoint and its saved AdamW state takes exactly the step the
    uninterrupted trainer takes; without the state (a fresh AdamW) the step differs."""
    f0 = rollout(0, [[1.0, 0.0, 0.3, 0.9], [0.1, 0.2, 0.7]], seed=3)
    f1 = rollout(1, [[0.0, 1.0, 0.4], [0.9, 0.1, 0.3, 0.6]], seed=4)
    straight = Trainer(micro_model, lr=1e-2, async_level=0)
    straight.step([f0], 0)
    straight.step([f1], 1)

    first = Trainer(micro_model, lr=1e-2, async_level=0)
    first.step([f0], 0)
    ckpt = first.save(tmp_path / "v1")
    assert first.save_optimizer(ckpt).name == "optimizer.pt"
    resumed = Trainer(ckpt, lr=1e-2, async_level=0)
    assert resumed.load_optimizer(ckpt)
    resumed.step([f1], 1)
    fresh = Trainer(ckpt, lr=1e-2, async_level=0)
    assert not fresh.load_optimizer(tmp_path)  # nothing saved there
    fresh.step([f1], 1)

    want, got, other = _weights(straight), _weights(resumed), _weights(fresh)
    assert all(torch.allclose(want[k], got[k], atol=1e-7) for k in want)
    assert any(not torch.allclose(want[k], other[k], atol=1e-4) for k in want)
    # a checkpoint written from a resumed trainer carries no stale optimizer file of its source
    assert not (resumed.save(tmp_path / "v2") / "optimizer.pt").exists()
