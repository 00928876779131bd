"""``trr++`` trainer: advantages, isolation of the target adapter, learning, optimizer-state round trip."""

from __future__ import annotations

import math

import pytest

from populora_core import UserError
from populora_core.api.components import AdapterRef, BaseModel, GenerationRequest, LoraSettings, Rollout, SamplingParams

LORA = LoraSettings(rank=8, alpha=16.0, init_std=0.05, target_modules=("q_proj", "k_proj", "v_proj", "o_proj"))


def make(kind, name, base, **params):
    from populora_core import get_registry

    return get_registry().get(kind, name).build(params, base_model=base, lora=LORA, seed=0)


@pytest.fixture(scope="module")
def base(tiny_model_dir):
    return BaseModel(str(tiny_model_dir))


@pytest.fixture()
def adapters(base, tmp_path):
    from benchmarks.tiny_model import fresh_adapter

    return [fresh_adapter(base, f"m{i}@v0", LORA, seed=7 + i, out_dir=tmp_path / f"m{i}_v0") for i in range(3)]


def _rollouts(member, n=6, seed=0, groups=("deduction/solve", "abduction/propose")):
    import random

    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = [rng.randrange(3, 300) for _ in range(rng.randrange(3, 9))]
        comp = [rng.randrange(3, 300) for _ in range(rng.randrange(1, 7))]
        out.append(
            Rollout(
                member,
                groups[i % len(groups)],
                prompt,
                comp,
                [0.0] * len(comp),
                reward=float(rng.random() < 0.5) + 0.1 * i,
            )
        )
    return out


def _tensors(path):
    from populora_core.services.adapters import load_lora

    return {k: (f.A.clone(), f.B.clone()) for k, f in load_lora(path).items()}


def _same(a, b):
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k][0], b[k][0]) and torch.equal(a[k][1], b[k][1]) for k in a)


# --- advantages ------------------------------------------------------------------------------------


def test_advantages_equal_hand_computed_reference():
    from populora_trainers import TRRParams
    from populora_trainers.trr import trr_advantages

    g1, g2 = "deduction/solve", "induction/propose"
    rs = [
        Rollout("m", g1, [1], [5, 6], [], 1.0),
        Rollout("m", g1, [1], [5], [], 0.0),
        Rollout("m", g2, [1], [5, 6, 7], [], 0.3),
        Rollout("m", g1, [1], [5, 6, 7], [], 1.0),
        Rollout("m", g2, [1], [5], [], 0.9),
        Rollout("m", g1, [1], [], [], 5.0),
    ]
    adv = trr_advantages(rs, TRRParams(normalize="token"))
    # g1 tokens: 1,1 | 0 | 1,1,1 -> mean 5/6, unbiased var (5*(1/6)^2 + (5/6)^2) / 5 = 1/6
    s1 = math.sqrt(1 / 6 + 1e-8)
    # g2 tokens: .3,.3,.3 | .9 -> mean .45, var (3*.15^2 + .45^2)/3 = .09
    s2 = math.sqrt(0.09 + 1e-8)
    expected = [(1 - 5 / 6) / s1, (0 - 5 / 6) / s1, (0.3 - 0.45) / s2, (1 - 5 / 6) / s1, (0.9 - 0.45) / s2, 0.0]
    assert adv == pytest.approx(expected, rel=1e-9, abs=1e-12)
    seq = trr_advantages(rs, TRRParams(normalize="sequence"))  # every rollout counts once: g1 rewards 1, 0, 1
    m, v = 2 / 3, ((1 / 3) ** 2 * 2 + (2 / 3) ** 2) / 2
    assert seq[0] == pytest.approx((1 - m) / math.sqrt(v + 1e-8))
    assert trr_advantages(rs, TRRParams(normalize="none"))[:2] == [1.0, 0.0]
    # a group whose rewards are all equal gets zero advantages; a lone token is not a nan
    flat = trr_advantages(
        [
            Rollout("m", "a", [1], [2, 3], [], 0.5),
            Rollout("m", "a", [1], [2], [], 0.5),
            Rollout("m", "b", [1], [2], [], 1.0),
        ],
        TRRParams(),
    )
    assert flat == [0.0, 0.0, 0.0]


def test_prompt_baseline_centres_the_samples_that_share_a_prompt():
    from populora_trainers import TRRParams
    from populora_trainers.trr import prompt_centred_rewards, trr_advantages

    solve, propose, other = "deduction/solve", "deduction/propose", "abduction/solve"
    rs = [
        Rollout("m", solve, [1], [5, 6], [], 1.0),
        Rollout("m", solve, [1], [5], [], 1.0),
        Rollout("m", solve, [1], [7, 8, 9], [], -0.5),  # problem 1: two of three solved
        Rollout("m", solve, [2], [5], [], -0.5),
        Rollout("m", solve, [2], [6, 6], [], -0.5),  # all failed
        Rollout("m", propose, [1], [5, 5], [], 0.7),  # same prompt ids, other group: alone
        Rollout("m", other, [2], [5], [], 1.0),
    ]  # alone with its prompt: keeps its reward
    centred = [0.5, 0.5, -1.0, 0.0, 0.0, 0.7, 1.0]
    assert prompt_centred_rewards(rs) == pytest.approx(centred)
    assert trr_advantages(rs, TRRParams(normalize="none", baseline="prompt")) == pytest.approx(centred)
    # whitened by the scale only: solve's tokens 2x.5, 1x.5, 3x-1, 1x0, 2x0 -> unbiased second moment 3.75/8
    s = math.sqrt(3.75 / 8 + 1e-8)
    adv = trr_advantages(rs, TRRParams(normalize="token", baseline="prompt"))
    assert adv == pytest.approx([0.5 / s, 0.5 / s, -1.0 / s, 0.0, 0.0, 0.0, 0.0], rel=1e-12)
    assert adv[3:5] == [0.0, 0.0]  # exactly: an all-failed problem reinforces none of its answers
    with pytest.raises(ValueError, match=r"baseline"):
        TRRParams(baseline="problem")


def test_prompt_baseline_gives_all_same_problems_exactly_zero():
    """Token weighting and lone rollouts made the old second centring shift every all-same sample (+0.04 on
    nano's deduction solves): here all-solved and all-failed problems get exactly 0, informative ones keep
    their sign and order, and a lone rollout is measured against its group's mean raw reward (AZR's)."""
    from populora_trainers import TRRParams
    from populora_trainers.trr import trr_advantages

    g = "deduction/solve"
    rs = [
        Rollout("m", g, [1], [5] * 9, [], 1.0),
        Rollout("m", g, [1], [5], [], 0.0),
        Rollout("m", g, [1], [5, 5], [], 0.0),  # informative: one of three solved
        Rollout("m", g, [2], [5] * 4, [], 0.1),
        Rollout("m", g, [2], [5], [], 0.1),
        Rollout("m", g, [2], [5] * 7, [], 0.1),  # all the same (0.1 x 3 / 3 is not 0.1 in floats)
        Rollout("m", g, [3], [5, 5, 5], [], 1.0),
        Rollout("m", g, [3], [5], [], 1.0),  # all solved
        Rollout("m", g, [4], [5, 5], [], 0.0),  # alone with its prompt
    ]
    for normalize in ("token", "sequence"):
        adv = trr_advantages(rs, TRRParams(normalize=normalize, baseline="prompt"))
        assert adv[3:8] == [0.0] * 5
        assert adv[0] > 0 > adv[1] and adv[1] == adv[2]
    w = [9, 1, 2, 4, 1, 7, 3, 1, 2]
    mean = sum(wi * r.reward for wi, r in zip(w, rs)) / sum(w)  # the lone rollout's baseline
    diffs = [2 / 3, -1 / 3, -1 / 3, 0, 0, 0, 0, 0, -mean]
    s = math.sqrt(sum(wi * d * d for wi, d in zip(w, diffs)) / (sum(w) - 1) + 1e-8)
    assert trr_advantages(rs, TRRParams(normalize="token", baseline="prompt")) == pytest.approx(
        [d / s for d in diffs], rel=1e-12
    )


def test_trainer_baseline_param_reaches_the_update(base, adapters, tmp_path):
    """Problem A: every sample wrong; problem B: every sample right. Task whitening pushes A's answers down
    and B's up; centred per prompt neither carries any gradient and the adapter is unchanged."""
    rollouts = [
        Rollout("m0", "deduction/solve", [9, 10 + p], [20 + j, 21], [0.0, 0.0], (-0.5, 1.0)[p])
        for p in range(2)
        for j in range(3)
    ]
    task = make("trainer", "trr++", base, lr=1e-2, entropy_coef=0.0).update(
        "m0", adapters[0], rollouts, tmp_path / "task"
    )
    assert task.grad_norm > 0
    prompt = make("trainer", "trr++", base, lr=1e-2, entropy_coef=0.0, baseline="prompt").update(
        "m0", adapters[0], rollouts, tmp_path / "prompt"
    )
    assert prompt.grad_norm == 0.0 and _same(_tensors(tmp_path / "prompt"), _tensors(adapters[0].path))


def test_advantages_match_verl_masked_whitening():
    """The same numbers from a padded token tensor, written the way veRL whitens (independent path)."""
    import torch
    from populora_trainers import TRRParams
    from populora_trainers.trr import trr_advantages

    rs = _rollouts("m", n=8, seed=3, groups=("g",))
    adv = trr_advantages(rs, TRRParams(normalize="token"))
    width = max(len(r.completion_token_ids) for r in rs)
    mask = torch.zeros(len(rs), width, dtype=torch.float64)
    values = torch.zeros(len(rs), width, dtype=torch.float64)
    for i, r in enumerate(rs):
        mask[i, : len(r.completion_token_ids)] = 1
        values[i, : len(r.completion_token_ids)] = r.reward
    mean = (values * mask).sum() / mask.sum()
    var = (((values - mean) ** 2) * mask).sum() / mask.sum() * (mask.sum() / (mask.sum() - 1))
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    for i in range(len(rs)):
        assert adv[i] == pytest.approx(float(whitened[i, 0]), rel=1e-9)


# --- updates ---------------------------------------------------------------------------------------


def _base_weights(host):
    """The base model's own parameters, named as before PEFT wrapped its linears (``base_layer``)."""
    return {
        n.replace(".base_layer", ""): p.detach().clone()
        for n, p in host.base_model.named_parameters()
        if ".lora_" not in n
    }


def test_update_changes_only_the_target_adapter(base, adapters, tmp_path):
    import torch

    from populora_core.services.modelhost import get_host

    host = get_host(base)
    engine = make("engine", "hf", base)
    engine.generate([GenerationRequest("def f", a) for a in adapters], SamplingParams(temperature=0, max_tokens=2))
    loaded = {
        a.name: {k: (x.clone(), y.clone()) for k, (x, y) in host.version(host.ensure(a)).items()} for a in adapters
    }
    base_before = _base_weights(host)
    files = {a.name: _tensors(a.path) for a in adapters}

    trainer = make("trainer", "trr++", base, lr=1e-2, micro_batch_size=2)
    stats = trainer.update("m1", adapters[1], _rollouts("m1"), tmp_path / "m1_v1")
    assert stats.tokens > 0 and stats.grad_norm > 0 and math.isfinite(stats.loss) and stats.entropy > 0

    new = _tensors(tmp_path / "m1_v1")
    assert not _same(new, files["m1@v0"])
    changed = [
        k
        for k in new
        if not torch.equal(new[k][0], files["m1@v0"][k][0]) or not torch.equal(new[k][1], files["m1@v0"][k][1])
    ]
    assert len(changed) == len(new)  # every module of the target moved
    for a in adapters:  # no version on disk or in memory changed
        assert _same(_tensors(a.path), files[a.name])
        now = host.version(host.ensure(a))
        assert all(
            torch.equal(now[k][0], loaded[a.name][k][0]) and torch.equal(now[k][1], loaded[a.name][k][1]) for k in now
        )
    base_after = _base_weights(host)
    assert base_after.keys() == base_before.keys()
    for n, p in base_after.items():
        assert torch.equal(p, base_before[n])
    assert not any(p.requires_grad for n, p in host.base_model.named_parameters() if ".lora_" not in n)
    with pytest.raises(UserError, match="immutable"):
        trainer.update("m1", adapters[1], _rollouts("m1"), tmp_path / "m1_v1")


def test_micro_batching_accumulates_exactly(base, adapters, tmp_path):
    import torch

    rollouts = _rollouts("m0", n=7, seed=4)
    big = make("trainer", "trr++", base, lr=1e-3, micro_batch_size=16)
    small = make("trainer", "trr++", base, lr=1e-3, micro_batch_size=2)
    s1 = big.update("m0", adapters[0], rollouts, tmp_path / "big")
    s2 = small.update("m0", adapters[0], rollouts, tmp_path / "small")
    assert s1.loss == pytest.approx(s2.loss, abs=1e-6) and s1.grad_norm == pytest.approx(s2.grad_norm, rel=1e-4)
    a, b = _tensors(tmp_path / "big"), _tensors(tmp_path / "small")
    assert all(torch.allclose(a[k][i], b[k][i], atol=1e-6) for k in a for i in (0, 1))


def test_epochs_take_clipped_optimizer_steps_over_the_same_rollouts(base, adapters, tmp_path):
    """epochs=E: E AdamW steps per update; from the second on, the ratio to the sampling policy is clipped."""
    rollouts = _rollouts("m0", n=8, seed=5)
    one = make("trainer", "trr++", base, lr=5e-2)
    three = make("trainer", "trr++", base, lr=5e-2, epochs=3, clip_eps=0.05)
    s1 = one.update("m0", adapters[0], rollouts, tmp_path / "one")
    s3 = three.update("m0", adapters[0], rollouts, tmp_path / "three")
    steps = lambda t: {int(v["step"]) for v in t._states["m0"]["optimizer"]["state"].values()}  # noqa: E731
    assert steps(one) == {1} and steps(three) == {3}
    assert s1.extra["clip_fraction"] == 0.0  # one epoch: the ratio is exactly 1
    assert 0.0 < s3.extra["clip_fraction"] <= 1.0  # the last epoch's tokens that left the clip range
    assert not _same(_tensors(tmp_path / "one"), _tensors(tmp_path / "three"))


def test_low_var_kl_is_schulmans_k3():
    import torch
    from populora_trainers.trr import low_var_kl

    logp = torch.tensor([-1.0, -2.0, -0.5])
    ref = torch.tensor([-1.0, -1.0, -3.0])
    expected = [math.exp(r - x) - (r - x) - 1 for x, r in zip(logp.tolist(), ref.tolist())]
    assert low_var_kl(logp, ref).tolist() == pytest.approx(expected)
    assert low_var_kl(logp, logp).tolist() == [0.0, 0.0, 0.0]


def test_kl_coef_pulls_the_adapter_back_towards_the_base(base, adapters, tmp_path):
    """Equal rewards leave only the KL term: successive updates lower the measured KL to the base."""
    rollouts = [
        Rollout("m1", r.group, r.prompt_token_ids, r.completion_token_ids, r.logprobs, 1.0)
        for r in _rollouts("m1", n=8, seed=6)
    ]
    trainer = make("trainer", "trr++", base, lr=3e-3, kl_coef=1.0)
    adapter, kls = adapters[1], []
    for step in range(3):
        stats = trainer.update("m1", adapter, rollouts, tmp_path / f"m1_v{step + 1}")
        kls.append(stats.extra["kl"])
        adapter = AdapterRef(f"m1@v{step + 1}", str(tmp_path / f"m1_v{step + 1}"))
    assert kls[0] > 0 and kls[2] < kls[1] < kls[0], kls
    assert "kl" not in make("trainer", "trr++", base).update("m1", adapters[1], rollouts, tmp_path / "m1_plain").extra


def test_optimizer_state_round_trip_is_bit_exact(base, adapters, tmp_path):
    import torch

    trainer = make("trainer", "trr++", base, lr=1e-3)
    v1 = {m: AdapterRef(f"{m}@v1", str(tmp_path / f"{m}_v1")) for m in ("m0", "m2")}
    for m, a in (("m0", adapters[0]), ("m2", adapters[2])):
        trainer.update(m, a, _rollouts(m, seed=1), tmp_path / f"{m}_v1")
    trainer.copy_state("m0", "child")
    trainer.save_state(tmp_path / "ckpt")

    restored = make("trainer", "trr++", base, lr=1e-3)
    restored.load_state(tmp_path / "ckpt")
    assert restored.members() == trainer.members() == ["child", "m0", "m2"]
    for m in trainer.members():
        sa, sb = trainer._states[m]["optimizer"]["state"], restored._states[m]["optimizer"]["state"]
        assert sa.keys() == sb.keys()
        for i in sa:
            for k in sa[i]:
                assert torch.equal(sa[i][k], sb[i][k]), (m, i, k)
    # continuing from the restored state gives bit-identical next versions
    for m in ("m0", "m2"):
        trainer.update(m, v1[m], _rollouts(m, seed=2), tmp_path / f"{m}_v2a")
        restored.update(m, v1[m], _rollouts(m, seed=2), tmp_path / f"{m}_v2b")
        assert _same(_tensors(tmp_path / f"{m}_v2a"), _tensors(tmp_path / f"{m}_v2b"))
    # a fresh optimizer (no state) takes a different second step than the restored one
    fresh = make("trainer", "trr++", base, lr=1e-3)
    fresh.update("m0", v1["m0"], _rollouts("m0", seed=2), tmp_path / "m0_v2c")
    assert not _same(_tensors(tmp_path / "m0_v2a"), _tensors(tmp_path / "m0_v2c"))
    restored.forget("child")
    assert "child" not in restored.members()
    with pytest.raises(UserError, match="not found"):
        restored.load_state(tmp_path / "nowhere")


def test_state_is_one_file_per_member_with_a_manifest(base, adapters, tmp_path):
    from populora_core.services.trainer_state import read_manifest

    trainer = make("trainer", "trr++", base, lr=1e-3)
    for m, a in (("m0", adapters[0]), ("m2", adapters[2])):
        trainer.update(m, a, _rollouts(m, seed=1), tmp_path / f"{m}_v1")
    trainer.save_state(tmp_path / "ckpt")
    manifest = read_manifest(tmp_path / "ckpt", "trr++")
    assert manifest["members"] == {"m0": "members/m0.pt", "m2": "members/m2.pt"}
    # a worker loads only the members it owns; a state moves between trainers exactly
    part = make("trainer", "trr++", base, lr=1e-3)
    part.load_members(tmp_path / "ckpt", {"m2": manifest["members"]["m2"]})
    assert part.members() == ["m2"]
    other = make("trainer", "trr++", base, lr=1e-3)
    other.import_member("m0", trainer.export_member("m0"))
    assert other.export_member("nobody") is None
    old = make("trainer", "trr++", base, lr=1e-3)
    old.load_state(tmp_path / "ckpt")
    assert old.members() == ["m0", "m2"]
    for m in ("m0", "m2"):
        v1 = AdapterRef(f"{m}@v1", str(tmp_path / f"{m}_v1"))
        for who, t in (("a", trainer), ("b", old)):
            t.update(m, v1, _rollouts(m, seed=2), tmp_path / f"{m}_v2{who}")
        assert _same(_tensors(tmp_path / f"{m}_v2a"), _tensors(tmp_path / f"{m}_v2b"))
    other.update("m0", AdapterRef("m0@v1", str(tmp_path / "m0_v1")), _rollouts("m0", seed=2), tmp_path / "m0_v2c")
    assert _same(_tensors(tmp_path / "m0_v2a"), _tensors(tmp_path / "m0_v2c"))
    with pytest.raises(UserError, match="saved by trainer 'trr\\+\\+', not 'grpo'"):
        make("trainer", "grpo", base).load_state(tmp_path / "ckpt")


class _Payload:
    """Unpickling this runs ``touch MARKER``: a member file as a hostile checkpoint would hold it."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_a_member_file_with_a_pickled_payload_is_refused_unread(base, adapters, tmp_path):
    """Member files load with torch.load(weights_only=True): tensors and plain data only, whoever wrote them; and
    only from where the member's file belongs (a manifest cannot point a load elsewhere)."""
    import json
    import pickle

    import torch

    trainer = make("trainer", "trr++", base, lr=1e-3)
    trainer.update("m0", adapters[0], _rollouts("m0", seed=1), tmp_path / "m0_v1")
    trainer.save_state(tmp_path / "ckpt")
    marker = tmp_path / "PWNED"
    state = trainer.export_member("m0")
    torch.save({**state, "extra": {"payload": _Payload(marker)}}, tmp_path / "ckpt" / "members" / "m0.pt")
    restored = make("trainer", "trr++", base, lr=1e-3)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        restored.load_state(tmp_path / "ckpt")
    assert not marker.exists()
    torch.save(state, tmp_path / "elsewhere.pt")
    manifest = json.loads((tmp_path / "ckpt" / "manifest.json").read_text())
    manifest["members"]["m0"] = "../elsewhere.pt"
    (tmp_path / "ckpt" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(UserError, match=r"member 'm0' recorded at '../elsewhere.pt'"):
        restored.load_state(tmp_path / "ckpt")


def test_cosine_lr_decay_follows_each_members_own_optimizer_steps(base, adapters, tmp_path):
    from populora_trainers.state import scheduled_lr

    assert scheduled_lr(1e-3, 5, None) == 1e-3
    assert [scheduled_lr(1.0, k, 4, 0.2) for k in (0, 2, 4, 9)] == pytest.approx([1.0, 0.6, 0.2, 0.2])

    def lr_used(member):
        return trainer._states[member]["optimizer"]["param_groups"][0]["lr"]

    trainer = make(
        "trainer",
        "trr++",
        base,
        lr=1e-3,
        lr_decay_steps=2,
        lr_min_ratio=0.25,
        betas=[0.8, 0.95],
        eps=1e-6,
        weight_decay=0.05,
    )
    adapter, used = adapters[0], []
    for step in range(3):
        trainer.update("m0", adapter, _rollouts("m0", seed=step), tmp_path / f"m0_v{step + 1}")
        adapter = AdapterRef(f"m0@v{step + 1}", str(tmp_path / f"m0_v{step + 1}"))
        used.append(lr_used("m0"))
        if step == 0:
            trainer.copy_state("m0", "child")
    assert used == pytest.approx([1e-3, 0.625e-3, 0.25e-3])
    trainer.update("child", adapters[1], _rollouts("child", seed=9), tmp_path / "child_v1")
    assert lr_used("child") == pytest.approx(0.625e-3)  # the parent's count goes on, not a fresh schedule
    trainer.update("m2", adapters[2], _rollouts("m2", seed=9), tmp_path / "m2_v1")
    assert lr_used("m2") == pytest.approx(1e-3)
    group = trainer._states["m2"]["optimizer"]["param_groups"][0]  # the other hyper-parameters come from params too
    assert (group["betas"], group["eps"], group["weight_decay"]) == ((0.8, 0.95), 1e-6, 0.05)


def test_bad_rollouts_are_user_errors(base, adapters, tmp_path):
    trainer = make("trainer", "trr++", base)
    with pytest.raises(UserError, match="no rollouts"):
        trainer.update("m0", adapters[0], [], tmp_path / "x")
    with pytest.raises(UserError, match="belongs to member"):
        trainer.update("m0", adapters[0], _rollouts("m1"), tmp_path / "x")


def _target_mass(base, adapter, prompts, target):
    """Exact mean probability that the first completion token lies in ``target`` (no sampling noise)."""
    import torch
    from populora_engines.batched_lora import batched_adapters

    from populora_core.services.modelhost import get_host

    host = get_host(base)
    key = host.ensure(adapter)
    probs = []
    with torch.no_grad(), batched_adapters(host, [key]):
        for p in prompts:
            ids = torch.tensor([host.tokenizer(p)["input_ids"]])
            logits = host.model(input_ids=ids).logits[0, -1].float()
            probs.append(float(torch.softmax(logits, -1)[sorted(target)].sum()))
    return sum(probs) / len(probs)


@pytest.fixture(scope="module")
def peaky_base(tmp_path_factory):
    """The tiny model with a 10x lm_head: the random init's logits are nearly flat and, behind the final
    RMSNorm, no adapter could make them peaky enough to show learning."""
    import torch
    from transformers import AutoModelForCausalLM

    from benchmarks.tiny_model import build_tiny_model

    path = build_tiny_model(tmp_path_factory.mktemp("peaky"))
    model = AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        model.lm_head.weight.mul_(10)
    model.save_pretrained(path)
    return BaseModel(str(path))


@pytest.mark.slow
def test_repeated_updates_raise_a_toy_reward(peaky_base, tmp_path):
    """Reward = share of completion tokens in a fixed set X (32 of ~500 ids); rollouts sampled by hf."""
    from benchmarks.tiny_model import fresh_adapter

    base = peaky_base
    adapter = fresh_adapter(base, "toy@v0", LORA, seed=3, out_dir=tmp_path / "toy_v0")
    engine = make("engine", "hf", base)
    trainer = make("trainer", "trr++", base, lr=2e-2, entropy_coef=0.0)
    prompts = ["def f(x):", "The quick", "0123", "def f(a, b):"]
    target = set(range(100, 132))
    mass0 = _target_mass(base, adapter, prompts, target)
    rewards = []
    for step in range(10):
        out = engine.generate(
            [GenerationRequest(p, adapter) for p in prompts],
            SamplingParams(n=8, temperature=1.0, max_tokens=4, seed=step),
        )
        rollouts = [
            Rollout(
                "toy",
                "solve",
                c.prompt_token_ids,
                c.token_ids,
                c.logprobs,
                sum(t in target for t in c.token_ids) / max(1, len(c.token_ids)),
            )
            for row in out
            for c in row
        ]
        rewards.append(sum(r.reward for r in rollouts) / len(rollouts))
        stats = trainer.update("toy", adapter, rollouts, tmp_path / f"toy_v{step + 1}")
        assert math.isfinite(stats.loss)
        adapter = AdapterRef(f"toy@v{step + 1}", str(tmp_path / f"toy_v{step + 1}"))
    mass1 = _target_mass(base, adapter, prompts, target)
    assert mass1 > max(0.5, 3 * mass0), (mass0, mass1, rewards)
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.3, rewards


# --- grpo ------------------------------------------------------------------------------------------


def _grpo_rollouts(member, seed=0):
    """Two prompts x four completions: GRPO groups by prompt."""
    import random

    rng = random.Random(seed)
    out = []
    for prompt in ([5, 6, 7, 8], [9, 10, 11]):
        for _ in range(4):
            comp = [rng.randrange(3, 300) for _ in range(rng.randrange(2, 6))]
            out.append(Rollout(member, "solve", list(prompt), comp, [-5.0] * len(comp), reward=float(rng.random())))
    return out


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_grpo_one_step_through_trl_changes_only_its_adapter(base, adapters, tmp_path, loss_type):
    import torch

    from populora_core.services.modelhost import get_host

    host = get_host(base)
    files = {a.name: _tensors(a.path) for a in adapters}
    loaded = {
        a.name: {k: (x.clone(), y.clone()) for k, (x, y) in host.version(host.ensure(a)).items()} for a in adapters
    }
    trainer = make("trainer", "grpo", base, lr=1e-2, loss_type=loss_type, micro_batch_size=3)
    stats = trainer.update("m2", adapters[2], _grpo_rollouts("m2"), tmp_path / "m2_v1")
    assert trainer._trl is not None and type(trainer._trl).__name__ == "GRPOTrainer"
    assert stats.grad_norm > 0 and stats.tokens > 0 and math.isfinite(stats.loss)
    new = _tensors(tmp_path / "m2_v1")
    assert not _same(new, files["m2@v0"])
    for a in adapters:
        assert _same(_tensors(a.path), files[a.name])
        now = host.version(host.ensure(a))
        assert all(
            torch.equal(now[k][0], loaded[a.name][k][0]) and torch.equal(now[k][1], loaded[a.name][k][1]) for k in now
        )


def test_grpo_micro_batches_match_one_batch_and_advantages_follow_trl(base, adapters, tmp_path):
    import torch
    from populora_trainers import GRPOParams
    from populora_trainers.grpo import grpo_advantages

    rollouts = _grpo_rollouts("m0", seed=5)
    adv = torch.tensor(grpo_advantages(rollouts, GRPOParams(scale_rewards="group")))
    r = torch.tensor([x.reward for x in rollouts]).view(2, 4)
    expected = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).flatten()
    assert torch.allclose(adv, expected, atol=1e-6)
    for loss_type in ("dapo", "grpo", "bnpo"):
        whole = make("trainer", "grpo", base, lr=1e-3, loss_type=loss_type, micro_batch_size=8)
        split = make("trainer", "grpo", base, lr=1e-3, loss_type=loss_type, micro_batch_size=1)
        s1 = whole.update("m0", adapters[0], rollouts, tmp_path / f"{loss_type}_whole")
        s2 = split.update("m0", adapters[0], rollouts, tmp_path / f"{loss_type}_split")
        assert s1.grad_norm == pytest.approx(s2.grad_norm, rel=1e-4), loss_type
        a, b = _tensors(tmp_path / f"{loss_type}_whole"), _tensors(tmp_path / f"{loss_type}_split")
        assert all(torch.allclose(a[k][i], b[k][i], atol=1e-6) for k in a for i in (0, 1))


def test_grpo_with_kl_to_a_reference_adapter(base, adapters, tmp_path):
    from populora_core.api.components import AdapterRef

    trainer = make("trainer", "grpo", base, lr=1e-2, beta=0.1, reference="initial", loss_type="grpo")
    trainer.update("m1", adapters[1], _grpo_rollouts("m1"), tmp_path / "m1_v1")
    stats = trainer.update(
        "m1", AdapterRef("m1@v1", str(tmp_path / "m1_v1")), _grpo_rollouts("m1", seed=1), tmp_path / "m1_v2"
    )
    assert stats.extra["kl"] > 0  # the second step is measured against m1@v0
    trainer.save_state(tmp_path / "ckpt")
    other = make("trainer", "grpo", base, beta=0.1, reference="initial")
    other.load_state(tmp_path / "ckpt")
    assert other._refs["m1"].name == "m1@v0"
    with pytest.raises(UserError, match="saved by trainer"):
        make("trainer", "trr++", base).load_state(tmp_path / "ckpt")


def test_loraplus_gives_b_factors_a_larger_first_adam_step(base, adapters, tmp_path):
    """Adam's first step moves every parameter with a gradient by about its lr: lr for A, lr_ratio_b x lr for B."""

    def largest_moves(lr_ratio_b):
        trainer = make("trainer", "trr++", base, lr=1e-3, lr_ratio_b=lr_ratio_b)
        out = tmp_path / f"ratio{lr_ratio_b}"
        trainer.update("m0", adapters[0], _rollouts("m0"), out)
        before, after = _tensors(adapters[0].path), _tensors(out)
        groups = len(trainer._states["m0"]["optimizer"]["param_groups"])
        return groups, tuple(max((after[k][i] - before[k][i]).abs().max().item() for k in before) for i in (0, 1))

    # without LoRA+ one group: the layout of optimizer states saved before the option, so old checkpoints resume
    groups, moves = largest_moves(1.0)
    assert groups == 1 and moves == pytest.approx((1e-3, 1e-3), rel=1e-2)
    groups, moves = largest_moves(4.0)
    assert groups == 2 and moves == pytest.approx((1e-3, 4e-3), rel=1e-2)


# --- memory: token-budget micro-batches, chunked log-probs, gradient checkpointing ----------------


def test_param_validation_of_the_memory_settings(base):
    from populora_trainers.forward import use_checkpointing

    for bad in ({"micro_batch_tokens": 0}, {"gradient_checkpointing": "yes"}, {"logprob_chunk_tokens": 0}):
        with pytest.raises(UserError, match=next(iter(bad))):
            make("trainer", "trr++", base, **bad)
    with pytest.raises(UserError, match="micro_batch_tokens"):
        make("trainer", "grpo", base, micro_batch_tokens=-5)
    with pytest.raises(UserError, match="logprob_chunk_tokens"):  # grpo's log-probs are TRL's fused LM head
        make("trainer", "grpo", base, logprob_chunk_tokens=1024)
    p = make("trainer", "trr++", base).params
    assert (p.micro_batch_tokens, p.gradient_checkpointing, p.logprob_chunk_tokens) == (None, "auto", 8192)
    assert make("trainer", "trr++", base, logprob_chunk_tokens=None).params.logprob_chunk_tokens is None
    assert make("trainer", "trr++", base, long_row_tokens="auto").params.long_row_tokens == "auto"  # as written
    with pytest.raises(UserError, match="long_row_tokens"):
        make("trainer", "trr++", base, long_row_tokens=0)
    assert use_checkpointing("auto", "cuda") and use_checkpointing("auto", "cuda:1") and use_checkpointing("on", "cpu")
    assert not use_checkpointing("auto", "cpu") and not use_checkpointing("off", "cuda")


def test_micro_batches_by_a_token_budget_keep_the_order_and_count_padding():
    from populora_trainers.batching import micro_batches

    def row(p, c):
        return (Rollout("m", "g", [1] * p, [2] * c, [], 0.0), (p, c))

    rows = [row(2, 3), row(4, 1), row(1, 6), row(30, 30), row(2, 2), row(2, 2), row(3, 1)]
    groups = micro_batches(rows, size=2, tokens=20)
    assert [r for g in groups for r in g] == rows  # consecutive runs, nothing reordered or lost
    for g in groups:
        width = max(len(r.prompt_token_ids) for r, _ in g) + max(len(r.completion_token_ids) for r, _ in g)
        assert len(g) * width <= 20 or len(g) == 1
    # (2,3)+(4,1): 2 x (4 + 3) = 14; + (1,6): 3 x (4 + 6) = 30 > 20; the 60-token row goes alone
    assert [[x for _, x in g] for g in groups] == [[(2, 3), (4, 1)], [(1, 6)], [(30, 30)], [(2, 2), (2, 2), (3, 1)]]
    assert [len(g) for g in micro_batches(rows, size=3)] == [3, 3, 1]  # None: micro_batch_size rows, as before
    same = micro_batches(rows, size=8, tokens=1000, same=lambda r: len(r[0].prompt_token_ids))
    assert [[x for _, x in g] for g in same] == [[(2, 3)], [(4, 1)], [(1, 6)], [(30, 30)], [(2, 2), (2, 2)], [(3, 1)]]


def test_a_long_row_gets_a_micro_batch_of_its_own_and_the_order_stays():
    from populora_trainers.batching import micro_batches

    def row(p, c):
        return (Rollout("m", "g", [1] * p, [2] * c, [], 0.0), (p, c))

    rows = [row(2, 3), row(4, 1), row(30, 30), row(2, 2), row(40, 1), row(2, 2), row(3, 1)]
    groups = micro_batches(rows, size=8, alone_from=41)
    assert [[x for _, x in g] for g in groups] == [[(2, 3), (4, 1)], [(30, 30)], [(2, 2)], [(40, 1)], [(2, 2), (3, 1)]]
    assert [len(g) for g in micro_batches(rows, size=8)] == [7]  # None: off
    joined = micro_batches(rows, size=8, joined=True, alone_from=41)  # joined: prompt + completion, 40 + 1 = 41
    assert [len(g) for g in joined] == [2, 1, 1, 1, 2]


def test_long_rows_reach_sdpa_without_a_mask_and_train_as_the_padded_batch_does(base, adapters, tmp_path, monkeypatch):
    """``long_row_tokens``: rows at or past it are trained one per micro-batch, so attention gets no mask (SDPA's
    fused causal kernel on CUDA); the loss is normalised over the whole update, so the result is the padded
    batch's up to fp32 rounding. ``auto`` leaves the CPU as it was."""
    import torch
    from populora_trainers.forward import long_row_threshold

    assert long_row_threshold("auto", "cpu") is None and long_row_threshold("auto", "cuda:0") == 2048
    rollouts = _rollouts("m0", n=6, seed=4)
    lengths = sorted(len(r.prompt_token_ids) + len(r.completion_token_ids) for r in rollouts)
    cut = lengths[3]  # the longer half go alone
    masks: list[bool] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        masks.append(kwargs.get("attn_mask") is None and bool(kwargs.get("is_causal")))
        return sdpa(*args, **kwargs)

    padded = make("trainer", "trr++", base, lr=1e-3, micro_batch_size=16, long_row_tokens=None)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    s1 = padded.update("m0", adapters[0], rollouts, tmp_path / "padded")
    assert masks and not any(masks)  # one padded micro-batch: masked attention
    masks.clear()
    alone = make("trainer", "trr++", base, lr=1e-3, micro_batch_size=16, long_row_tokens=cut)
    s2 = alone.update("m0", adapters[0], rollouts, tmp_path / "alone")
    layers = alone.host.base_model.config.num_hidden_layers
    long_rows = sum(n >= cut for n in lengths)
    assert sum(masks) == long_rows * layers  # each long row's forward: every layer unmasked
    assert s1.loss == pytest.approx(s2.loss, abs=1e-6) and s1.grad_norm == pytest.approx(s2.grad_norm, rel=1e-4)
    a, b = _tensors(tmp_path / "padded"), _tensors(tmp_path / "alone")
    assert all(torch.allclose(a[k][i], b[k][i], atol=1e-6) for k in a for i in (0, 1))


def _logprob_setup(base, adapter):
    """The host's PeftModel with ``adapter`` in the trainable scratch slot, and one packed micro-batch."""
    from populora_trainers.batching import pack

    from populora_core.services.modelhost import get_host

    trainer = make("trainer", "trr++", base)
    _, params = trainer._activate(adapter)
    host = get_host(base)
    batch = pack(_rollouts("m0", n=7, seed=11), int(host.tokenizer.pad_token_id), host.device)
    return host.peft, params, batch


@pytest.mark.parametrize(
    ("temperature", "terms"), [(1.0, ("logp", "ent")), (0.7, ("logp", "ent")), (1.0, ("logp",)), (1.3, ("ent",))]
)
def test_chunked_logprobs_equal_the_one_piece_computation(base, adapters, temperature, terms):
    """Values and gradients (through the log-probs, the entropy or both) within fp32 rounding, for chunks of one
    token, a few tokens and all but one position; padded positions are 0 on the chunked path."""
    import torch
    from populora_trainers.logprobs import token_logprobs

    model, params, batch = _logprob_setup(base, adapters[0])
    mask = batch["completion_mask"].bool()
    gen = torch.Generator().manual_seed(0)
    w, v = torch.randn(mask.shape, generator=gen), torch.randn(mask.shape, generator=gen)
    try:

        def run(chunk):
            for p in params.values():
                p.grad = None
            lp, ent = token_logprobs(model, batch, temperature, True, chunk)
            loss = 0.0
            if "logp" in terms:
                loss = loss + (lp * w * mask).sum()
            if "ent" in terms:
                loss = loss + (ent * v * mask).sum()
            loss.backward()
            return lp.detach(), ent.detach(), {n: p.grad.clone() for n, p in params.items()}

        lp0, ent0, g0 = run(None)
        rows, width = mask.shape
        for chunk in (1, 5, rows * width - 1):
            lp, ent, g = run(chunk)
            assert torch.allclose(lp[mask], lp0[mask], atol=2e-6, rtol=1e-6), chunk
            assert torch.allclose(ent[mask], ent0[mask], atol=2e-6, rtol=1e-6), chunk
            assert not lp[~mask].any() and not ent[~mask].any()
            for n in g0:
                assert torch.allclose(g[n], g0[n], atol=1e-6, rtol=1e-4), (chunk, n)
        with torch.no_grad():  # the reference / no-grad path, and entropy off
            lp, ent = token_logprobs(model, batch, temperature, False, 3)
        assert ent is None and torch.allclose(lp[mask], lp0[mask], atol=2e-6, rtol=1e-6)
    finally:
        for p in params.values():
            p.requires_grad_(False)
            p.grad = None


def test_chunked_logprobs_keep_one_chunks_logits_in_backward(base, adapters):
    """The backward recomputes each chunk's logits: autograd never holds a (tokens, vocab) tensor."""
    import torch
    from populora_trainers.logprobs import token_logprobs

    model, params, batch = _logprob_setup(base, adapters[0])
    vocab = model.get_base_model().get_output_embeddings().weight.shape[0]
    seen: list[tuple[int, ...]] = []

    def pack_hook(t):
        seen.append(tuple(t.shape))
        return t

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack_hook, lambda t: t):
            lp, ent = token_logprobs(model, batch, 1.0, True, 4)
        kept = [s for s in seen if s and s[-1] == vocab]
        assert all(s[0] <= 4 for s in kept), kept  # only chunk-sized logits (recomputation), none of the batch
        (lp.sum() + ent.sum()).backward()
        assert all(p.grad is not None for p in params.values())
    finally:
        for p in params.values():
            p.requires_grad_(False)
            p.grad = None


def test_default_settings_keep_small_micro_batches_in_one_piece(base, adapters, tmp_path):
    """The CPU quickstart's micro-batches (<= 8192 positions) take the one-piece path: bit-identical updates."""
    rollouts = _rollouts("m0", n=8, seed=4)
    default = make("trainer", "trr++", base, lr=1e-3, micro_batch_size=32)
    one_piece = make("trainer", "trr++", base, lr=1e-3, micro_batch_size=32, logprob_chunk_tokens=None)
    default.update("m0", adapters[0], rollouts, tmp_path / "default")
    one_piece.update("m0", adapters[0], rollouts, tmp_path / "one_piece")
    assert _same(_tensors(tmp_path / "default"), _tensors(tmp_path / "one_piece"))


def _capture_gradients(trainer):
    """The gradients each update of ``trainer`` steps with, captured before the clip and the AdamW step."""
    seen: dict[str, object] = {}
    step = trainer._step

    def spy(member_id, opt, params):
        seen.update({n: p.grad.clone() for n, p in params.items()})
        return step(member_id, opt, params)

    trainer._step = spy
    return seen


def test_token_budget_and_chunked_logprobs_match_one_batch(base, adapters, tmp_path):
    """Token-budget micro-batches and chunked log-probs (entropy and KL in the loss) give the one-batch gradient.

    The adapters are compared to 1% of an AdamW step: Adam's first step is about lr x sign(g), so an element
    whose gradient is near eps turns fp32 rounding of the gradient into a visible difference of the step."""
    import torch
    from populora_trainers.batching import micro_batches

    rollouts = _rollouts("m0", n=9, seed=8)
    assert len(micro_batches([(r,) for r in rollouts], 8, 24)) > 3  # the budget really splits
    common = dict(lr=1e-3, entropy_coef=0.01, kl_coef=0.1, temperature=0.8)
    whole = make("trainer", "trr++", base, micro_batch_size=16, **common)
    split = make("trainer", "trr++", base, micro_batch_tokens=24, logprob_chunk_tokens=3, **common)
    g1, g2 = _capture_gradients(whole), _capture_gradients(split)
    s1 = whole.update("m0", adapters[0], rollouts, tmp_path / "whole")
    s2 = split.update("m0", adapters[0], rollouts, tmp_path / "split")
    assert s1.loss == pytest.approx(s2.loss, abs=1e-6) and s1.grad_norm == pytest.approx(s2.grad_norm, rel=1e-5)
    assert s1.entropy == pytest.approx(s2.entropy, rel=1e-5)
    assert s1.extra["kl"] == pytest.approx(s2.extra["kl"], abs=1e-7)
    assert g1.keys() == g2.keys() and all(torch.allclose(g1[n], g2[n], rtol=1e-4, atol=1e-7) for n in g1)
    a, b = _tensors(tmp_path / "whole"), _tensors(tmp_path / "split")
    assert all(torch.allclose(a[k][i], b[k][i], atol=1e-5) for k in a for i in (0, 1))


def _count_layer_calls(host):
    """Calls of the first decoder layer (a pre-hook: checkpoint's recomputation stops before the layer returns)."""
    calls: list[int] = []
    layer = host.base_model.get_decoder().layers[0]
    return calls, layer.register_forward_pre_hook(lambda *args: calls.append(1))


@pytest.mark.parametrize("name", ["trr++", "grpo"])
def test_gradient_checkpointing_on_gives_the_same_update_and_is_off_afterwards(base, adapters, tmp_path, name):
    import torch

    from populora_core.services.modelhost import get_host

    host = get_host(base)
    rollouts = _grpo_rollouts("m0", seed=3) if name == "grpo" else _rollouts("m0", n=8, seed=3)
    engine = make("engine", "hf", base)
    request = [GenerationRequest("def f", adapters[0])]
    before = engine.generate(request, SamplingParams(temperature=0, max_tokens=4))[0][0].token_ids
    out, calls = {}, {}
    for setting in ("off", "on"):
        trainer = make("trainer", name, base, lr=1e-3, micro_batch_size=4, gradient_checkpointing=setting)
        counted, hook = _count_layer_calls(host)
        try:
            stats = trainer.update("m0", adapters[0], rollouts, tmp_path / setting)
        finally:
            hook.remove()
        out[setting], calls[setting] = (stats, _tensors(tmp_path / setting)), len(counted)
        assert not host.base_model.is_gradient_checkpointing  # switched on for the update only
        assert not getattr(host.base_model, "_require_grads_hooks", None)
    assert calls["on"] == 2 * calls["off"]  # every layer's forward runs again in backward: it is on
    assert out["on"][0].grad_norm == pytest.approx(out["off"][0].grad_norm, rel=1e-5)
    a, b = out["on"][1], out["off"][1]
    assert all(torch.allclose(a[k][i], b[k][i], atol=1e-7) for k in a for i in (0, 1))
    after = engine.generate(request, SamplingParams(temperature=0, max_tokens=4))[0][0].token_ids
    assert after == before  # generation from the shared base is unaffected


def test_grpo_token_budget_micro_batches_match_one_batch(base, adapters, tmp_path):
    """Same gradient as one batch (adapters to 1% of an AdamW step, as above) for the loss types' normalisers."""
    import torch
    from populora_trainers.batching import micro_batches

    rollouts = _grpo_rollouts("m0", seed=6)
    same = lambda r: len(r[0].prompt_token_ids)  # noqa: E731
    assert len(micro_batches([(r,) for r in rollouts], 8, 20, same)) > 2  # the budget really splits
    for loss_type in ("dapo", "bnpo"):
        whole = make("trainer", "grpo", base, lr=1e-3, loss_type=loss_type, micro_batch_size=8)
        split = make("trainer", "grpo", base, lr=1e-3, loss_type=loss_type, micro_batch_tokens=20)
        g1, g2 = _capture_gradients(whole), _capture_gradients(split)
        s1 = whole.update("m0", adapters[0], rollouts, tmp_path / f"{loss_type}_whole")
        s2 = split.update("m0", adapters[0], rollouts, tmp_path / f"{loss_type}_split")
        assert s1.grad_norm == pytest.approx(s2.grad_norm, rel=1e-5), loss_type
        assert all(torch.allclose(g1[n], g2[n], rtol=1e-4, atol=1e-7) for n in g1), loss_type
        a, b = _tensors(tmp_path / f"{loss_type}_whole"), _tensors(tmp_path / f"{loss_type}_split")
        assert all(torch.allclose(a[k][i], b[k][i], atol=1e-5) for k in a for i in (0, 1))


def test_gradient_checkpointing_accepts_yaml_on_and_off():
    """An unquoted ``on`` in a recipe is YAML's True: it must mean "on", not fail validation."""
    import yaml
    from populora_trainers import GRPOParams, TRRParams

    for model in (TRRParams, GRPOParams):
        assert model(**yaml.safe_load("gradient_checkpointing: on")).gradient_checkpointing == "on"
        assert model(**yaml.safe_load("gradient_checkpointing: off")).gradient_checkpointing == "off"
        assert model(gradient_checkpointing="auto").gradient_checkpointing == "auto"
        with pytest.raises(ValueError):
            model(gradient_checkpointing="sometimes")


@pytest.mark.parametrize("chunk", [None, 5])
def test_joined_layout_equals_the_split_layout(base, adapters, chunk):
    """Prompt and completion back to back, right padded: the split layout's log-probs, entropies and LoRA
    gradients within fp32 rounding, on fewer padded tokens (one piece and chunked)."""
    import torch
    from populora_trainers.logprobs import token_logprobs

    model, params, batch = _logprob_setup(base, adapters[0])
    mask = batch["completion_mask"].bool()
    assert len(set(batch["prompt_mask"].sum(1).tolist())) > 1  # the rows' prompts really differ in length
    w = torch.randn(mask.shape, generator=torch.Generator().manual_seed(1))
    try:

        def run(joined):
            for p in params.values():
                p.grad = None
            lp, ent = token_logprobs(model, batch, 0.9, True, chunk, joined)
            ((lp * w * mask).sum() + (ent * mask).sum()).backward()
            return lp.detach(), ent.detach(), {n: p.grad.clone() for n, p in params.items()}

        lp0, ent0, g0 = run(False)
        lp1, ent1, g1 = run(True)
        assert torch.allclose(lp1[mask], lp0[mask], atol=2e-5, rtol=1e-5)
        assert torch.allclose(ent1[mask], ent0[mask], atol=2e-5, rtol=1e-5)
        for n in g0:
            assert torch.allclose(g1[n], g0[n], atol=1e-5, rtol=1e-3), n
    finally:
        for p in params.values():
            p.requires_grad_(False)
            p.grad = None


def test_joined_micro_batches_count_prompt_and_completion_together():
    """Budget rows x longest (prompt + completion): a long prompt with a short completion and a short prompt
    with a long completion fit where the split layout's longest prompt + longest completion does not."""
    from populora_trainers.batching import micro_batches

    from populora_core.api.components import Rollout

    def rollout(p, c):
        return (Rollout("m", "deduction/solve", [1] * p, [2] * c, [], 0.0),)

    rows = [rollout(10, 2), rollout(2, 10)]
    assert [len(g) for g in micro_batches(rows, 8, tokens=24)] == [1, 1]  # split: 2 x (10 + 10) > 24
    assert [len(g) for g in micro_batches(rows, 8, tokens=24, joined=True)] == [2]  # joined: 2 x 12


@pytest.mark.parametrize("name", ["trr++", "grpo"])
def test_fused_lora_forward_gives_peft_s_gradients_and_is_undone_after_the_update(base, adapters, tmp_path, name):
    """The fused LoRA forward (one addmm) against PEFT's layer forward: the same gradients within fp32 rounding,
    with the KL term's adapters-off reference in the loss, and PEFT's own forward back after the update."""
    import torch

    from populora_core.services.modelhost import get_host

    rollouts = _rollouts("m0", n=9, seed=5)
    common = dict(lr=1e-3, micro_batch_size=4)
    common.update(dict(kl_coef=0.1, entropy_coef=0.01) if name == "trr++" else dict(beta=0.1))
    fused = make("trainer", name, base, lora_forward="fused", **common)
    peft = make("trainer", name, base, lora_forward="peft", **common)
    g1, g2 = _capture_gradients(fused), _capture_gradients(peft)
    s1 = fused.update("m0", adapters[0], rollouts, tmp_path / "fused")
    s2 = peft.update("m0", adapters[0], rollouts, tmp_path / "peft")
    assert s1.loss == pytest.approx(s2.loss, abs=1e-6) and s1.grad_norm == pytest.approx(s2.grad_norm, rel=1e-5)
    assert g1.keys() == g2.keys() and all(torch.allclose(g1[n], g2[n], rtol=1e-4, atol=1e-7) for n in g1)
    from populora_trainers.forward import fused_layer_forward
    from populora_trainers.state import SCRATCH

    layers = [m for m in get_host(base).peft.modules() if hasattr(m, "lora_A")]
    assert layers and not any("forward" in vars(m) for m in layers)  # no instance forward left behind
    with get_host(base).training(layer_forward=fused_layer_forward(SCRATCH)):  # it really replaces every layer's
        assert all("forward" in vars(m) for m in layers)


@pytest.fixture(scope="module")
def base_bf16(tiny_model_dir):
    """The tiny base in bfloat16 on the CPU: the fused forward's 16-bit branch (the one a GPU runs)."""
    return BaseModel(str(tiny_model_dir), dtype="bfloat16")


def test_fused_lora_forward_on_a_16_bit_base_gives_peft_s_gradients_casting_each_input_once(
    base_bf16, tmp_path, monkeypatch
):
    """On a bf16 base (fp32 adapters) the fused forward gives PEFT's loss and gradients within bf16 rounding,
    and casts each layer input to fp32 once: q/k/v read one tensor, so with q, k, v and o targeted each layer
    makes two casts for four modules (PEFT makes four)."""
    import torch
    from populora_trainers import forward

    from benchmarks.tiny_model import fresh_adapter

    adapter = fresh_adapter(base_bf16, "m0@v0", LORA, seed=7, out_dir=tmp_path / "m0_v0")
    rollouts = _rollouts("m0", n=9, seed=5)
    fused = make("trainer", "trr++", base_bf16, lr=1e-3, micro_batch_size=4, lora_forward="fused")
    peft = make("trainer", "trr++", base_bf16, lr=1e-3, micro_batch_size=4, lora_forward="peft")
    assert fused.host.dtype == torch.bfloat16
    cast, calls, made = forward._cast, [], []

    def counted(x, dtype):
        out = cast(x, dtype)
        calls.append(1)
        if x.dtype != dtype and not any(out is m for m in made):
            made.append(out)
        return out

    monkeypatch.setattr(forward, "_cast", counted)
    g1, g2 = _capture_gradients(fused), _capture_gradients(peft)
    s1 = fused.update("m0", adapter, rollouts, tmp_path / "fused")
    assert calls and 2 * len(made) == len(calls)  # one cast for q/k/v, one for o, per layer and forward
    s2 = peft.update("m0", adapter, rollouts, tmp_path / "peft")
    assert s1.loss == pytest.approx(s2.loss, rel=1e-2, abs=1e-3)
    assert s1.grad_norm == pytest.approx(s2.grad_norm, rel=2e-2)
    assert g1.keys() == g2.keys()
    for n in g1:  # each factor's gradient as a whole: bf16 sums round differently element by element
        assert (g1[n] - g2[n]).norm() <= 3e-2 * g2[n].norm() + 1e-6, n


def test_one_cast_per_input_is_the_same_tensor_until_the_input_changes_or_the_cast_dies():
    """The cast cache returns the cast made for the module before only for the same, unchanged input while
    that cast is alive (kept by autograd for backward); the result equals a fresh cast bit for bit."""
    import gc
    import weakref

    import torch
    from populora_trainers.forward import _cast

    x = torch.randn(3, 8, dtype=torch.bfloat16)
    first = _cast(x, torch.float32)
    assert _cast(x, torch.float32) is first and torch.equal(first, x.to(torch.float32))
    assert _cast(x.clone(), torch.float32) is not first  # another tensor of equal values
    x32 = torch.randn(3, 8)
    assert _cast(x32, torch.float32) is x32  # fp32 (the CPU path): no cast, no cache
    again = _cast(x, torch.float32)
    assert again is not first  # the cache held the clone's cast, this is x's again
    x.add_(1)  # changed in place: its version moved
    changed = _cast(x, torch.float32)
    assert changed is not again and torch.equal(changed, x.to(torch.float32))
    probe = weakref.ref(changed)
    del changed, again, first
    gc.collect()
    assert probe() is None  # the cache keeps no cast alive
    with torch.inference_mode():  # inference tensors have no version counter: cast, not cached
        y = torch.randn(3, 8, dtype=torch.bfloat16)
        assert torch.equal(_cast(y, torch.float32), y.float())


def test_parallel_updates_in_threads_are_bit_identical_to_one_at_a_time(base, adapters, tmp_path):
    """Three members, two threads (each job in its own slot, each thread's fused forward adding its own):
    the adapters, the optimizer states and the stats (time aside) of three updates one after another, over
    two steps so the second loads saved moments; afterwards only the scratch slot is active, nothing trains."""
    import torch
    from populora_trainers.state import SCRATCH

    from populora_core.api.components import UpdateJob
    from populora_core.services.modelhost import get_host

    common = dict(lr=1e-2, micro_batch_size=4, entropy_coef=0.01)
    one = make("trainer", "trr++", base, **common)
    two = make("trainer", "trr++", base, parallel_updates=2, **common)
    runs = {}
    for label, trainer in (("one", one), ("two", two)):
        current = {f"m{i}": adapters[i] for i in range(3)}
        stats = []
        for step in range(2):
            jobs = [
                UpdateJob(
                    m, current[m], _rollouts(m, n=6 + 3 * i, seed=10 * step + i), tmp_path / label / f"{m}_{step}"
                )
                for i, m in enumerate(sorted(current))
            ]
            stats += trainer.update_many(jobs)
            current = {j.member_id: AdapterRef(f"{j.member_id}@v{step + 1}", str(j.out_dir)) for j in jobs}
        runs[label] = (current, stats)
    for m in runs["one"][0]:
        assert _same(_tensors(runs["one"][0][m].path), _tensors(runs["two"][0][m].path)), m
        a, b = one.export_member(m)["optimizer_state"], two.export_member(m)["optimizer_state"]
        assert a["names"] == b["names"]
        for sa, sb in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
            assert all(torch.equal(sa[k], sb[k]) for k in sa)
    for sa, sb in zip(runs["one"][1], runs["two"][1]):
        assert (sa.loss, sa.grad_norm, sa.entropy, sa.tokens, sa.extra) == (
            sb.loss,
            sb.grad_norm,
            sb.entropy,
            sb.tokens,
            sb.extra,
        )
    assert not _same(_tensors(runs["two"][0]["m0"].path), _tensors(adapters[0].path))  # it did train
    peft = get_host(base).peft
    assert list(peft.base_model.active_adapters) == [SCRATCH]
    assert not any(p.requires_grad for p in peft.parameters())


def test_parallel_updates_need_the_fused_forward_and_no_kl(base):
    for bad in (dict(lora_forward="peft"), dict(kl_coef=0.1)):
        with pytest.raises(UserError, match="parallel_updates > 1 needs lora_forward: fused and kl_coef: 0"):
            make("trainer", "trr++", base, parallel_updates=2, **bad)


def test_parallel_updates_with_gradient_checkpointing_are_refused_naming_both_settings(base):
    """Checkpointing recomputes the forward on autograd's device thread, where the fused forward's per-thread
    adapter slot is unset: refused at build (on for CUDA under auto; forced on here on the CPU)."""
    with pytest.raises(UserError, match=r"parallel_updates: 2 with gradient checkpointing .*on cpu.*off"):
        make("trainer", "trr++", base, parallel_updates=2, gradient_checkpointing="on")
    make("trainer", "trr++", base, parallel_updates=2, gradient_checkpointing="auto")  # off on the CPU: allowed
    make("trainer", "trr++", base, parallel_updates=1, gradient_checkpointing="on")


@pytest.mark.parametrize(
    ("key", "value"), [("lr", -1.0), ("lr", 0.0), ("grad_clip", 0.0), ("micro_batch_size", 0), ("weight_decay", -0.1)]
)
def test_out_of_range_optimizer_settings_are_recipe_errors_naming_the_key(key, value):
    """`lr: -1` used to validate and train backwards; each optimizer setting has its range in the params model."""
    from tests.cli_helpers import REPO, run_cli

    result = run_cli("validate", str(REPO / "recipes" / "nano.yaml"), f"trainer.params.{key}={value}")
    assert result.returncode == 2 and f"trainer.params.{key}" in result.stderr and "Traceback" not in result.stderr


def test_the_host_owns_its_modes_and_refuses_overlap(base, adapters, tmp_path):
    """Generation and training take turns on the one base: the host's serving block (re-entrant, from any
    thread: the hf engine's parallel batches) and training block configure it and restore it, and a serving call
    during a training block (or the reverse) is an error, not a race on a shared model."""
    import threading

    from populora_core.services.modelhost import get_host

    host = get_host(base)
    trainer = make("trainer", "trr++", base, gradient_checkpointing="on")
    trainer.update("m0", adapters[0], _rollouts("m0"), tmp_path / "m0_v1")  # gives the host its PEFT slot
    calls = []

    def hook(module, args, output):
        calls.append(module)
        return output

    linears = host.linears()
    assert host.mode is None and not any(linear._forward_hooks for linear in linears)
    with host.training(checkpointing=True) as model:
        assert host.mode == "training" and model.training and host.base_model.is_gradient_checkpointing
        with pytest.raises(RuntimeError, match="a serving block while a training block is open"), host.serving(hook):
            pass
        with pytest.raises(RuntimeError, match="a training block while a training block is open"):
            with host.training():
                pass
        assert host.mode == "training"  # the refused blocks changed nothing
    assert host.mode is None and not host.peft.training and not host.base_model.is_gradient_checkpointing

    entered, release = threading.Barrier(3), threading.Event()

    def serve() -> None:
        with host.serving(hook):
            entered.wait(timeout=60)
            release.wait(timeout=60)

    lora_layers = [m for m in host.peft.modules() if hasattr(m, "lora_A")]
    assert lora_layers and not any(m.disable_adapters for m in lora_layers)
    threads = [threading.Thread(target=serve, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    entered.wait(timeout=60)  # both threads inside: one configuration, hooks installed once, PEFT's slots off
    assert host.mode == "serving" and all(list(linear._forward_hooks.values()) == [hook] for linear in linears)
    assert all(m.disable_adapters for m in lora_layers)
    with pytest.raises(RuntimeError, match="a training block while a serving block is open"), host.training():
        pass
    release.set()
    for t in threads:
        t.join()
    assert host.mode is None and not any(linear._forward_hooks for linear in linears)
    assert not any(m.disable_adapters for m in lora_layers)

    # a configuration that fails midway is undone as far as it got, and the host is free again
    real, calls_left = linears[1].register_forward_hook, []

    def failing(*args, **kwargs):
        calls_left.append(1)
        raise RuntimeError("hook refused")

    linears[1].register_forward_hook = failing
    try:
        with pytest.raises(RuntimeError, match="hook refused"), host.serving(hook):
            pass
    finally:
        linears[1].register_forward_hook = real
    assert calls_left and host.mode is None and not any(linear._forward_hooks for linear in linears)
    assert not any(m.disable_adapters for m in lora_layers)
    with host.training() as model:
        assert host.mode == "training"

    # the attention a serving block asks for is the host's to set and restore; a nested block asking for another
    # (or another hook) is refused, not a race on the one config
    from populora_engines.decode import decode_attention_name

    config, before = host.base_model.config, host.base_model.config._attn_implementation
    with host.serving(hook, attention=decode_attention_name()):
        assert config._attn_implementation == decode_attention_name()
        with host.serving(hook, attention=decode_attention_name()):  # the same: re-entrant
            pass
        with pytest.raises(RuntimeError, match="nested serving block asks for"), host.serving(hook):
            pass
        with pytest.raises(RuntimeError, match="nested serving block asks for"), host.serving(print):
            pass
        assert config._attn_implementation == decode_attention_name()
    assert config._attn_implementation == before and host.mode is None

    # a trainer's layer forward is installed by the host for the training block and removed after it
    def doubled(layer):
        return (lambda x: 2 * layer.get_base_layer()(x)) if layer is lora_layers[0] else None

    with host.training(layer_forward=doubled):
        assert "forward" in vars(lora_layers[0]) and not any("forward" in vars(m) for m in lora_layers[1:])
    assert not any("forward" in vars(m) for m in lora_layers)


def test_the_served_copy_is_written_beside_the_fp32_version_and_changes_nothing_else(base, adapters, tmp_path):
    """served_dtype: each new version also in bf16 (what vLLM on a GPU serves), in the same atomic write; its fp32
    files are those of the same update without it; auto writes no copy in a float32 run (the CPU)."""
    import torch
    from populora_trainers.state import served_dtype
    from safetensors.torch import load_file

    from populora_core.services.adapters import served_copy

    assert served_dtype("auto", torch.bfloat16) == "bfloat16" and served_dtype("auto", torch.float16) == "float16"
    assert served_dtype("auto", torch.float32) is None and served_dtype("none", torch.bfloat16) is None
    assert served_dtype("bfloat16", torch.float32) == "bfloat16"
    rollouts = _rollouts("m0")
    plain = make("trainer", "trr++", base, lr=1e-2)
    plain.update("m0", adapters[0], rollouts, tmp_path / "plain")
    assert plain.served_dtype is None and all(p.is_file() for p in (tmp_path / "plain").iterdir())
    served = make("trainer", "trr++", base, lr=1e-2, served_dtype="bfloat16")
    served.update("m0", adapters[0], rollouts, tmp_path / "served")
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        assert (tmp_path / "served" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes()
    copy = served_copy(tmp_path / "served", "bfloat16")
    assert (
        copy is not None
        and (copy / "adapter_config.json").read_text() == (tmp_path / "plain" / "adapter_config.json").read_text()
    )
    master, half = (
        load_file(str(tmp_path / "plain" / "adapter_model.safetensors")),
        load_file(str(copy / "adapter_model.safetensors")),
    )
    assert set(half) == set(master) and all(
        half[k].dtype == torch.bfloat16 and torch.equal(half[k], master[k].to(torch.bfloat16)) for k in half
    )
