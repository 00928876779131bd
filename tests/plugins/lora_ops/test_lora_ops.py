"""LoRA weight-space operators: exactness on delta W, shapes, seeds, B = 0 handling, PEFT round trip."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from populora_lora_ops import OPERATORS, DeltaMergeParams, ops
from populora_lora_ops import linalg as la
from populora_lora_ops.merge import dense_merge
from populora_lora_ops.parents import ZeroDeltaWarning
from populora_lora_ops.synthetic import trained_like

from populora_core.api import get_registry
from populora_core.api.errors import UserError
from populora_core.api.lora import LoraFactors, LoraWeights
from populora_core.services.adapters import load_lora, save_lora
from populora_core.services.operators import apply_operator

SHAPES = {
    "base_model.model.model.layers.0.self_attn.q_proj": (48, 48),
    "base_model.model.model.layers.0.self_attn.v_proj": (16, 48),
    "base_model.model.model.layers.0.mlp.down_proj": (48, 96),
    "base_model.model.model.layers.1.self_attn.q_proj": (48, 48),
    "base_model.model.model.layers.1.self_attn.v_proj": (16, 48),
    "base_model.model.model.layers.1.mlp.down_proj": (48, 96),
}
RANK = 6


def adapter(seed: int, rank: int = RANK, alpha: float = 12.0, dtype: torch.dtype = torch.float32) -> LoraWeights:
    return trained_like(SHAPES, rank, alpha, seed, dtype=dtype)


def run(name: str, parents: list[LoraWeights], seed: int = 0, **params: object) -> LoraWeights:
    fn_name, model, _ = OPERATORS[name]
    return getattr(ops, fn_name)(parents, model(**params), torch.Generator().manual_seed(seed))


def run_checked(name: str, parents: list[LoraWeights], seed: int = 0, **params: object) -> LoraWeights:
    """The operator as registered, through the core's checks (what the loop and ``populora evolve`` do)."""
    component = get_registry().get("operator", name)
    return apply_operator(component, component.parse_params(dict(params)), parents, seed)


def parents_for(name: str) -> list[LoraWeights]:
    fewest, _ = OPERATORS[name][2]
    return [adapter(1)] if fewest == 1 else [adapter(1), adapter(2)]


def rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.double() - ref.double()).norm() / ref.double().norm())


def dense_truncated(w: torch.Tensor, r: int) -> torch.Tensor:
    u, s, vh = torch.linalg.svd(w.float(), full_matrices=False)
    return (u[:, :r] * s[:r]) @ vh[:r]


# --- linear algebra -----------------------------------------------------------------------------


def test_canonical_svd_is_exact() -> None:
    f = adapter(3).modules["base_model.model.model.layers.0.mlp.down_proj"]
    u, s, vh = la.canonical(f.A, f.B, f.scale)
    assert rel((u * s) @ vh, f.delta()) < 1e-5
    dense = torch.linalg.svdvals(f.delta().double())[:RANK]
    assert torch.allclose(s.double(), dense, rtol=1e-4)
    assert torch.allclose(u.T @ u, torch.eye(RANK), atol=1e-5)
    assert torch.allclose(vh @ vh.T, torch.eye(RANK), atol=1e-5)


def test_refactor_keeps_delta_and_floors_a_rows() -> None:
    f = adapter(4).modules["base_model.model.model.layers.0.self_attn.q_proj"]
    u, s, vh = la.canonical(f.A, f.B, f.scale)
    s = s.clone()
    s[-2:] = 0.0
    a, b = la.refactor(u, s, vh, f.scale, RANK, a_floor=0.05)
    assert rel(f.scale * b @ a, (u * s) @ vh) < 1e-5
    assert float(a[-1].norm()) == pytest.approx(0.05, rel=1e-4)  # zero component still trainable
    assert float(b[:, -1].abs().max()) == 0.0


def _stack(p1: LoraWeights, p2: LoraWeights, k: str) -> list[la.Block]:
    return [(p.modules[k].B, p.modules[k].A, 0.5 * p.modules[k].scale) for p in (p1, p2)]


def _exact_truncated(stack: list[la.Block], r: int) -> torch.Tensor:
    w = sum(x * (b.double() @ a.double()) for b, a, x in stack)
    u, s, vh = torch.linalg.svd(w, full_matrices=False)
    return (u[:, :r] * s[:r]) @ vh[:r]


def test_cholesky_qr_is_exact_on_trained_like_parents() -> None:
    p1, p2 = adapter(1), adapter(2)
    for k in p1.modules:
        stack = _stack(p1, p2, k)
        (sv,) = la.svds([stack], RANK)
        assert sv.cholesky  # well-conditioned: the GEMM path, not the Householder fallback
        assert rel((sv.u() * sv.s) @ sv.vh(), _exact_truncated(stack, RANK)) < 1e-5


@pytest.mark.parametrize("case", ["duplicate", "nearly_parallel", "zero_b"])
def test_cholesky_qr_falls_back_to_householder_when_ill_conditioned(case: str) -> None:
    """Singular Grams (the same parent twice, B = 0) and ill-conditioned ones (nearly parallel B,
    cancelling A: Cholesky succeeds, the condition number is over MAX_GRAM_COND) take the
    Householder path, and the result stays exact."""
    p1 = adapter(1)
    k = "base_model.model.model.layers.0.mlp.down_proj"
    f = p1.modules[k]
    gen = torch.Generator().manual_seed(0)
    if case == "duplicate":
        g = LoraFactors(f.A.clone(), f.B.clone(), f.scale)
    elif case == "nearly_parallel":
        # 3e-3: in the middle of the noise levels (2e-3 to 5e-3) whose fp32 Gram Cholesky factors on AVX2 and
        # AVX-512 alike with a condition number over MAX_GRAM_COND (1e-3 fails to factor on AVX-512)
        b = f.B + 3e-3 * f.B.abs().mean() * torch.randn(f.B.shape, generator=gen)
        g = LoraFactors(-f.A + torch.randn(f.A.shape, generator=gen) / 10, b, f.scale)
    else:
        g = LoraFactors(torch.randn(f.A.shape, generator=gen), torch.zeros_like(f.B), f.scale)
    stack = [(f.B, f.A, f.scale), (g.B, g.A, g.scale)]
    (sv,) = la.svds([stack], RANK)
    assert not sv.cholesky
    assert rel((sv.u() * sv.s) @ sv.vh(), _exact_truncated(stack, RANK)) < 1e-5
    if case == "nearly_parallel":  # the threshold, not a failed factorization, chose Householder
        (forced,) = la.svds([stack], RANK, max_cond=float("inf"))
        assert forced.cholesky


@pytest.mark.parametrize("name", ["svd", "xes", "svd_subspace", "gaussian", "component_mask", "svd_structured"])
def test_batched_and_per_module_results_are_equal(name: str) -> None:
    """All modules in one batched call give the same child as one call per module (mutations draw
    module by module, so only the first module sees the same draws alone)."""
    parents = parents_for(name)
    whole = run(name, parents)
    names = list(parents[0].modules)
    for k in names[:1] if OPERATORS[name][2] == (1, 1) else names:
        alone = run(name, [p.with_modules({k: p.modules[k]}) for p in parents])
        assert torch.allclose(alone.modules[k].A, whole.modules[k].A, rtol=1e-5, atol=1e-6), k
        assert torch.allclose(alone.modules[k].B, whole.modules[k].B, rtol=1e-5, atol=1e-6), k


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_thread_count_does_not_change_the_child(name: str) -> None:
    """Modules run in parallel, one per worker: 1 or 3 workers give the same bytes."""
    parents = parents_for(name)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = run(name, parents, seed=3)
        torch.set_num_threads(3)
        three = run(name, parents, seed=3)
    finally:
        torch.set_num_threads(before)
    for k, f in one.items():
        assert torch.equal(f.A, three.modules[k].A) and torch.equal(f.B, three.modules[k].B), k


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_operators_run_on_the_parents_device(name: str, device: str) -> None:
    """The child lives where the parents do (a CPU generator drives CUDA parents alike), contiguous,
    and matches the child made from CPU parents."""
    cpu = parents_for(name)
    parents = [
        p.with_modules({k: LoraFactors(f.A.to(device), f.B.to(device), f.scale) for k, f in p.items()}) for p in cpu
    ]
    child = run(name, parents, seed=5)
    reference = run(name, cpu, seed=5)
    for k, f in child.items():
        assert f.A.device.type == device and f.B.device.type == device, k
        assert f.A.is_contiguous() and f.B.is_contiguous()
        assert rel(f.delta().cpu(), reference.modules[k].delta()) < 1e-4, k


# --- acceptance: shapes, exactness, symmetry, seeds, no no-ops ----------------------------------


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_rank_shapes_scale_dtype_preserved(name: str) -> None:
    parents = [
        p.with_modules({k: LoraFactors(f.A.bfloat16(), f.B.bfloat16(), f.scale) for k, f in p.items()})
        for p in parents_for(name)
    ]
    child = run(name, parents)
    assert set(child.modules) == set(parents[0].modules)
    assert child.config == parents[0].config
    for k, f in parents[0].items():
        g = child.modules[k]
        assert g.A.shape == f.A.shape and g.B.shape == f.B.shape
        assert g.A.dtype == torch.bfloat16 and g.B.dtype == torch.bfloat16
        assert g.scale == f.scale


def test_svd_weights_one_zero_returns_first_parent() -> None:
    p1, p2 = adapter(1), adapter(2)
    child = run("svd", [p1, p2], weights=[1.0, 0.0])
    for k, f in p1.items():
        assert rel(child.modules[k].delta(), f.delta()) < 1e-5


def test_svd_swap_symmetry() -> None:
    p1, p2 = adapter(1), adapter(2)
    a = run("svd", [p1, p2], weights=[0.7, 0.3])
    b = run("svd", [p2, p1], weights=[0.3, 0.7])
    for k in p1.modules:
        assert rel(a.modules[k].delta(), b.modules[k].delta()) < 1e-5
    x = run("xes", [p1, p2], fitness=[2.0, 1.0])
    y = run("xes", [p2, p1], fitness=[1.0, 2.0])
    for k in p1.modules:
        assert rel(x.modules[k].delta(), y.modules[k].delta()) < 1e-5


@pytest.mark.parametrize("weights", [[0.5, 0.5], [0.8, 0.4], [1.3, -0.3]])
def test_svd_matches_dense_fp32_reference(weights: list[float]) -> None:
    p1, p2 = adapter(1), adapter(2)
    child = run("svd", [p1, p2], weights=weights)
    for k, f in p1.items():
        ref = dense_truncated(weights[0] * f.delta() + weights[1] * p2.modules[k].delta(), RANK)
        assert rel(child.modules[k].delta(), ref) < 1e-4, k


def test_svd_three_parents_and_extrapolate_match_dense() -> None:
    ps = [adapter(1), adapter(2), adapter(5)]
    child = run("svd", ps, weights=[0.5, 0.3, 0.2])
    k = "base_model.model.model.layers.1.mlp.down_proj"
    ref = dense_truncated(sum(w * p.modules[k].delta() for w, p in zip([0.5, 0.3, 0.2], ps)), RANK)
    assert rel(child.modules[k].delta(), ref) < 1e-4
    ex = run("extrapolate", ps[:2], eta_low=1.25, eta_high=1.25)
    ref = dense_truncated(1.25 * ps[0].modules[k].delta() - 0.25 * ps[1].modules[k].delta(), RANK)
    assert rel(ex.modules[k].delta(), ref) < 1e-4


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_same_seed_same_bytes(name: str, tmp_path) -> None:
    parents = parents_for(name)
    save_lora(run(name, parents, seed=7), tmp_path / "a")
    save_lora(run(name, parents, seed=7), tmp_path / "b")
    a = (tmp_path / "a" / "adapter_model.safetensors").read_bytes()
    assert a == (tmp_path / "b" / "adapter_model.safetensors").read_bytes()
    random_ops = {
        "svd_structured",
        "layer_gaussian",
        "component_mask",
        "gaussian",
        "neftune",
        "dare",
        "della",
        "delta_merge",
        "layerwise",
        "extrapolate",
    }
    if name in random_ops:
        save_lora(run(name, parents, seed=8), tmp_path / "c")
        assert a != (tmp_path / "c" / "adapter_model.safetensors").read_bytes()


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_every_operator_changes_delta_w(name: str) -> None:
    parents = parents_for(name)
    child = run(name, parents)
    if name == "clone":  # X6 is a copy by definition: bit-identical, a new member to mutate later
        for k, f in parents[0].items():
            assert torch.equal(child.modules[k].A, f.A) and torch.equal(child.modules[k].B, f.B)
        return
    for p in parents:
        change = max(rel(child.modules[k].delta(), f.delta()) for k, f in p.items())
        assert change > 1e-3, f"{name} returned a parent unchanged"


# --- specific operators -------------------------------------------------------------------------


def test_component_mask_zeroes_ceil_rho_r_components() -> None:
    child = run("component_mask", [adapter(1)], rho=0.3)
    m = math.ceil(0.3 * RANK)
    for _, f in child.items():
        s = la.canonical(f.A, f.B, f.scale)[1]
        assert int((s > 1e-6 * s.max()).sum()) == RANK - m
        assert bool((f.A.norm(dim=1) > 0).all())  # masked components keep an A row


def test_svd_structured_keeps_spectrum_shape() -> None:
    parent = adapter(1)
    child = run("svd_structured", [parent], sigma=0.1, eps=0.0)
    for k, f in parent.items():
        s0 = la.canonical(f.A, f.B, f.scale)[1]
        s1 = la.canonical(child.modules[k].A, child.modules[k].B, f.scale)[1]
        ratio = torch.sort(s1).values / torch.sort(s0).values
        assert float(ratio.log().abs().max()) < 0.6  # log-normal with sigma 0.1 (sorting may pair shifts)


def test_layer_gaussian_touches_a_fraction_of_modules() -> None:
    parent = adapter(1)
    child = run("layer_gaussian", [parent], fraction=0.33)
    changed = [k for k, f in parent.items() if not torch.equal(child.modules[k].B, f.B)]
    assert len(changed) == round(0.33 * len(SHAPES))


def test_gaussian_noise_size_follows_eps() -> None:
    parent = adapter(1)
    small = run("gaussian", [parent], eps=0.05)
    large = run("gaussian", [parent], eps=0.5)
    for k, f in parent.items():
        assert rel(small.modules[k].delta(), f.delta()) < rel(large.modules[k].delta(), f.delta())


def test_neftune_changes_only_a_within_bound() -> None:
    parent = adapter(1)
    child = run("neftune", [parent], alpha=10.0)
    for k, f in parent.items():
        g = child.modules[k]
        assert torch.equal(g.B, f.B)
        bound = 10.0 / math.sqrt(f.A.shape[1] * RANK)
        assert float((g.A - f.A).abs().max()) <= bound * (1 + 1e-6)


def test_layerwise_copies_whole_modules_from_both_parents() -> None:
    p1, p2 = adapter(1), adapter(2)
    for granularity in ("module", "layer"):
        child = run("layerwise", [p1, p2], granularity=granularity)
        src = {}
        for k, g in child.items():
            same1 = torch.equal(g.A, p1.modules[k].A) and torch.equal(g.B, p1.modules[k].B)
            same2 = torch.equal(g.A, p2.modules[k].A) and torch.equal(g.B, p2.modules[k].B)
            assert same1 != same2
            src[k] = 1 if same1 else 2
        assert set(src.values()) == {1, 2}
        if granularity == "layer":
            for layer in ("0", "1"):
                assert len({v for k, v in src.items() if f".{layer}." in k}) == 1


def test_svd_subspace_takes_top_k_from_each_parent() -> None:
    p1, p2 = adapter(1), adapter(2)
    child = run("svd_subspace", [p1, p2], k_frac=0.5)
    k = RANK // 2
    for name, f in p1.items():
        u1, s1, v1 = torch.linalg.svd(f.delta().double(), full_matrices=False)
        u2, s2, v2 = torch.linalg.svd(p2.modules[name].delta().double(), full_matrices=False)
        ref = (u1[:, :k] * s1[:k]) @ v1[:k] + (u2[:, : RANK - k] * s2[: RANK - k]) @ v2[: RANK - k]
        assert rel(child.modules[name].delta(), ref) < 1e-4


def test_xes_weights_follow_fitness_z_scores() -> None:
    ps = [adapter(1), adapter(2), adapter(5)]
    child = run("xes", ps, step=0.5, fitness=[3.0, 1.0, 2.0])
    f = torch.tensor([3.0, 1.0, 2.0], dtype=torch.float64)
    z = (f - f.mean()) / f.std(unbiased=False)
    w = [1 / 3 + 0.5 * float(zi) / 3 for zi in z]
    k = "base_model.model.model.layers.0.mlp.down_proj"
    ref = dense_truncated(sum(wi * p.modules[k].delta() for wi, p in zip(w, ps)), RANK)
    assert rel(child.modules[k].delta(), ref) < 1e-4


@pytest.mark.parametrize("refactor", ["randomized", "exact"])
def test_dense_merge_at_full_density_is_the_weighted_sum(refactor: str) -> None:
    """With nothing dropped the streamed merge must equal the exact svd crossover."""
    p1, p2 = adapter(1), adapter(2)
    exact = run("svd", [p1, p2], weights=[0.6, 0.4])
    for name in ("dare", "ties", "delta_merge"):
        extra = {"method": "random"} if name == "delta_merge" else {}
        child = run(
            name,
            [p1, p2],
            density=1.0,
            sign_election=False,
            rescale=False,
            weights=[0.6, 0.4],
            refactor=refactor,
            **extra,
        )
        for k in p1.modules:
            assert rel(child.modules[k].delta(), exact.modules[k].delta()) < 1e-4, (name, k)


def test_ties_sign_election_matches_peft_on_delta_w() -> None:
    """TIES at full density on dense delta W equals peft's ties() on the same tensors, then rank r."""
    from peft.utils.merge_utils import ties

    p1, p2 = adapter(1), adapter(2)
    child = run("ties", [p1, p2], density=1.0, refactor="exact")
    for k, f in p1.items():
        stacked = torch.stack([f.delta(), p2.modules[k].delta()])
        ref = dense_truncated(ties(stacked, torch.tensor([1.0, 1.0]), density=1.0), RANK)
        assert rel(child.modules[k].delta(), ref) < 1e-4


def one_parent(x_b: torch.Tensor, x_a: torch.Tensor) -> list[LoraFactors]:
    return [LoraFactors(x_a, x_b, 1.0)]


@pytest.mark.parametrize(
    "method,ranking",
    [("random", "normal"), ("magnitude", "normal"), ("magnitude", "exact"), ("della", "normal"), ("della", "exact")],
)
def test_sparsify_keeps_about_density(method: str, ranking: str) -> None:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(8, 2000, generator=gen) / 2000**0.5
    b = torch.randn(64, 8, generator=gen)
    x = b @ a
    p = DeltaMergeParams(method=method, density=0.3, epsilon=0.15, ranking=ranking, rescale=False, sign_election=False)
    kept = dense_merge(one_parent(b, a), [1.0], p, gen)
    frac = float((kept != 0).float().mean())
    assert abs(frac - 0.3) < 0.02
    assert torch.allclose(kept[kept != 0], x[kept != 0], rtol=1e-5, atol=1e-6)  # kept entries are untouched
    if method == "magnitude" and ranking == "exact":
        assert torch.equal((kept != 0).sum(1), torch.full((64,), 600))
    if method == "della":  # larger magnitudes survive more often
        big = x.abs() > x.abs().median(dim=1, keepdim=True).values
        assert float((kept != 0)[big].float().mean()) > float((kept != 0)[~big].float().mean()) + 0.1


def test_dare_is_unbiased_before_refactoring() -> None:
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(20, 500, generator=gen)
    b = torch.randn(200, 20, generator=gen) / 20**0.5
    p = DeltaMergeParams(method="random", density=0.3, sign_election=False)
    mean = sum(dense_merge(one_parent(b, a), [1.0], p, gen) for _ in range(200)) / 200
    assert rel(mean, b @ a) < 0.15  # std of the mean ~ sqrt((1-p)/p/200) = 0.108


def test_keep_decisions_are_independent_of_threads_and_seeded() -> None:
    ps = [adapter(1), adapter(2)]
    fs = [p.modules["base_model.model.model.layers.0.mlp.down_proj"] for p in ps]
    p = DeltaMergeParams(method="della")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = dense_merge(fs, [1.0, 1.0], p, torch.Generator().manual_seed(3))
        torch.set_num_threads(2)
        two = dense_merge(fs, [1.0, 1.0], p, torch.Generator().manual_seed(3))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)
    assert not torch.equal(one, dense_merge(fs, [1.0, 1.0], p, torch.Generator().manual_seed(4)))


# --- B = 0 (fresh adapters) and mismatches ------------------------------------------------------


def fresh(seed: int = 9) -> LoraWeights:
    p = adapter(seed)
    return p.with_modules({k: LoraFactors(f.A, torch.zeros_like(f.B), f.scale) for k, f in p.items()})


@pytest.mark.parametrize("name", [n for n, v in OPERATORS.items() if v[2] == (1, 1) and n != "clone"])
def test_mutations_of_fresh_adapters_use_a_floor_or_warn(name: str) -> None:
    parent = fresh()
    child = run(name, [parent], floor_std=1e-4)
    changed = [k for k, f in child.items() if float(f.delta().abs().max()) > 0]
    assert changed, f"{name} left an untrained adapter unchanged"
    for k in changed:
        assert float(child.modules[k].delta().std()) < 1e-2
    with pytest.warns(ZeroDeltaWarning, match="B = 0"):
        same = run(name, [parent], zero_delta="warn")
    for _k, f in same.items():
        assert float(f.delta().abs().max()) == 0.0


def test_crossover_of_fresh_adapters_warns_and_stays_trainable() -> None:
    with pytest.warns(ZeroDeltaWarning, match="every parent"):
        child = run("svd", [fresh(1), fresh(2)])
    for _, f in child.items():
        assert float(f.B.abs().max()) == 0.0
        assert bool((f.A.norm(dim=1) > 0).all())  # the child can still learn (A is not zero)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ZeroDeltaWarning)
        run("svd", [adapter(1), adapter(2)])


@pytest.mark.parametrize("what", ["rank", "alpha", "targets", "shape"])
def test_mismatched_parents_are_refused(what: str) -> None:
    p1 = adapter(1)
    if what == "rank":
        p2, key = adapter(2, rank=4), "r"
    elif what == "alpha":
        p2, key = adapter(2, alpha=24.0), "lora_alpha"
    elif what == "targets":
        p2 = adapter(2)
        p2 = p2.with_modules({k: f for k, f in p2.items() if "v_proj" not in k})
        key = "the set of target modules"
    else:
        p2 = adapter(2)
        k0 = next(iter(p2.modules))
        f = p2.modules[k0]
        p2.modules[k0] = LoraFactors(f.A[:, :10], f.B, f.scale)
        key = "shape"
    for name in ("svd", "dare", "layerwise"):  # the core checks the parents against each other
        with pytest.raises(UserError, match=key):
            run_checked(name, [p1, p2])


@pytest.mark.parametrize(
    "name,count,arity",
    [
        ("gaussian", 2, "exactly 1 parent(s), got 2 (registered with min_parents=1, max_parents=1)"),
        ("clone", 3, "exactly 1 parent(s), got 3 (registered with min_parents=1, max_parents=1)"),
        ("svd", 1, "2 or more parent(s), got 1 (registered with min_parents=2, max_parents=None)"),
        ("extrapolate", 3, "exactly 2 parent(s), got 3 (registered with min_parents=2, max_parents=2)"),
        ("svd_subspace", 1, "exactly 2 parent(s), got 1 (registered with min_parents=2, max_parents=2)"),
    ],
)
def test_wrong_parent_count_is_refused_by_the_core_before_the_operator_runs(name, count, arity, monkeypatch) -> None:
    """The arity is the registration's alone: the core refuses a wrong count, naming the operator, its plugin and
    its arity, and the operator's function is never called."""
    fn_name, _, _ = OPERATORS[name]
    called: list[int] = []
    monkeypatch.setattr(ops, fn_name, lambda parents, params, generator: called.append(len(parents)))
    with pytest.raises(UserError) as err:
        run_checked(name, [adapter(seed) for seed in range(1, count + 1)])
    assert str(err.value) == f"operator {name!r} (plugin lora_ops) takes {arity}"
    assert called == []


def test_an_operators_own_parameter_checks_stay_its_own() -> None:
    with pytest.raises(UserError, match="weights has 3"):
        run_checked("svd", [adapter(1), adapter(2)], weights=[1, 2, 3])


def test_round_trip_through_peft_dir(tmp_path) -> None:
    child = run("svd", [adapter(1), adapter(2)])
    save_lora(child, tmp_path / "c")
    back = load_lora(tmp_path / "c")
    for k, f in child.items():
        assert torch.equal(back.modules[k].A, f.A) and torch.equal(back.modules[k].B, f.B)


def _uniform24(seed: int, n: int, start: int) -> torch.Tensor:
    """The kernel's keep-decision stream, rewritten in numpy (uint32 arithmetic wraps by definition)."""
    import numpy as np

    x = np.arange(start, start + n, dtype=np.uint64).astype(np.uint32) ^ np.uint32(seed)
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x7FEB352D)
    x = x ^ (x >> np.uint32(15))
    x = x * np.uint32(0x846CA68B)
    x = x ^ (x >> np.uint32(16))
    return torch.from_numpy((x >> np.uint32(8)).astype(np.int64))


def reference_merge(
    fs: list[LoraFactors], weights: list[float], p: DeltaMergeParams, gen: torch.Generator
) -> torch.Tensor:
    """DARE / TIES / DELLA on dense delta W in eager torch, combined with PEFT's merge_utils."""
    from peft.utils.merge_utils import calculate_majority_sign_mask, disjoint_merge

    seeds = torch.randint(0, 1 << 32, (len(fs),), generator=gen, dtype=torch.int64).tolist()
    out = []
    for f, w, seed in zip(fs, weights, seeds):
        x = (f.B.float() * (f.scale * w)) @ f.A.float()
        d_in = x.shape[1]
        u = _uniform24(seed, x.numel(), 0).view(x.shape)
        rms = x.pow(2).mean(1).sqrt()
        if p.method == "random":
            t = max(1, round(p.density * 2**24))
            x = x * (u < t) * (2**24 / t if p.rescale else 1.0)
        elif p.method == "magnitude":
            if p.ranking == "exact":
                thr = torch.kthvalue(x.abs(), d_in - max(1, math.ceil(p.density * d_in)) + 1, dim=1).values
            else:
                thr = rms * math.sqrt(2.0) * float(torch.erfinv(torch.tensor(1.0 - p.density)))
            x = x * (x.abs() >= thr[:, None]) / (p.density if p.rescale else 1.0)
        else:
            if p.ranking == "exact":
                frac = torch.argsort(torch.argsort(x.abs(), dim=1), dim=1).float() / (d_in - 1)
            else:
                frac = torch.erf(x.abs() / (rms[:, None] * math.sqrt(2.0)))
            prob = p.density - p.epsilon + 2 * p.epsilon * frac
            x = x * (u.float() < prob * 2**24) / (prob if p.rescale else 1.0)
        out.append(x)
    stack = torch.stack(out)
    if p.sign_election:
        return disjoint_merge(stack, calculate_majority_sign_mask(stack, method=p.majority_sign_method))
    return stack.sum(0)


MERGE_CASES = [
    DeltaMergeParams(method="random", density=0.3, sign_election=False),
    DeltaMergeParams(method="magnitude", density=0.2, rescale=False),
    DeltaMergeParams(method="magnitude", density=0.2, ranking="exact", majority_sign_method="frequency"),
    DeltaMergeParams(method="della"),
    DeltaMergeParams(method="della", ranking="exact", sign_election=False),
]


@pytest.mark.parametrize("params", MERGE_CASES)
def test_compiled_merge_matches_eager_reference(params: DeltaMergeParams) -> None:
    ps = [adapter(1), adapter(2), adapter(5)]
    k = "base_model.model.model.layers.0.mlp.down_proj"
    fs = [p.modules[k] for p in ps]
    ours = dense_merge(fs, [0.6, 0.5, -0.2], params, torch.Generator().manual_seed(0))
    ref = reference_merge(fs, [0.6, 0.5, -0.2], params, torch.Generator().manual_seed(0))
    assert float((ours != 0).float().mean()) < 0.9  # something was dropped
    assert rel(ours, ref) < 1e-4


@pytest.mark.parametrize("params", MERGE_CASES)
def test_torch_merge_path_matches_the_kernel(params: DeltaMergeParams) -> None:
    """The torch ops that merge CUDA tensors keep the same entries as the CPU kernel (run here on CPU)."""
    from populora_lora_ops.merge import _merge_into

    ps = [adapter(1), adapter(2), adapter(5)]
    fs = [p.modules["base_model.model.model.layers.0.mlp.down_proj"] for p in ps]
    seeds = torch.tensor([11, 2**32 - 5, 77])
    kernel, eager = torch.empty(48, 96), torch.empty(48, 96)
    _merge_into(fs, [0.6, 0.5, -0.2], params, seeds, kernel, compiled=True)
    _merge_into(fs, [0.6, 0.5, -0.2], params, seeds, eager, compiled=False)
    assert torch.equal(kernel != 0, eager != 0)  # the same keep decisions
    assert rel(eager, kernel) < 1e-6
