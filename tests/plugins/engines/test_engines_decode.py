"""The ``hf`` engine's decode loop: per-row counter-based sampling, narrowing, shared prefill, the reference path."""

from __future__ import annotations

import pytest

from populora_core.api.components import GenerationRequest, LoraSettings, SamplingParams
from populora_core.services.modelhost import ModelHost
from tests.plugins.engines.test_engines import PROMPTS, _tokens, make_engine

LORA = LoraSettings(rank=8, alpha=16.0, init_std=0.3)


@pytest.fixture(scope="module")
def base(tiny_model_dir):
    from populora_core.api.components import BaseModel

    return BaseModel(str(tiny_model_dir))


@pytest.fixture(scope="module")
def adapters(base, tmp_path_factory):
    from benchmarks.tiny_model import fresh_adapter

    root = tmp_path_factory.mktemp("adapters")
    return [fresh_adapter(base, f"d{i}@v0", LORA, seed=200 + i, out_dir=root / f"d{i}_v0") for i in range(3)]


def test_uniforms_are_a_pure_function_of_key_and_step_and_look_uniform():
    import torch
    from populora_engines.decode import row_key, uniforms

    keys = torch.tensor([row_key(7, k, j) for k in range(200) for j in range(10)], dtype=torch.long)
    a, b = uniforms(keys, 3), uniforms(keys, 3)
    assert torch.equal(a, b) and not torch.equal(a, uniforms(keys, 4))
    assert torch.equal(uniforms(keys[5:9], 3), a[5:9])  # a row's value does not depend on the others
    table = uniforms(keys, list(range(6)))  # the decode loop's table: column t is step t's draws
    assert all(torch.equal(table[:, t], uniforms(keys, t)) for t in range(6))
    draws = torch.cat([uniforms(keys, t) for t in range(20)])
    assert bool(((draws > 0) & (draws < 1)).all())
    counts = torch.histc(draws.float(), bins=10, min=0, max=1)
    expected = draws.numel() / 10
    assert float(((counts - expected) ** 2 / expected).sum()) < 30  # chi-square, 9 dof: p ~ 4e-4
    assert abs(float(torch.corrcoef(torch.stack([draws[:-1], draws[1:]]))[0, 1])) < 0.02


def test_sample_draws_in_proportion_inside_the_nucleus_only():
    import torch
    from populora_engines.decode import row_key, sample, uniforms

    logits = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.07, 0.03]])).expand(20000, -1)
    u = uniforms(torch.tensor([row_key(1, i) for i in range(20000)], dtype=torch.long), 0)
    free = torch.bincount(sample(logits, 1.0, 1.0, u), minlength=5).double() / 20000
    assert free.tolist() == pytest.approx([0.5, 0.25, 0.15, 0.07, 0.03], abs=0.015)
    # top_p 0.8: the fewest tokens reaching 0.8 are the first three (0.9), renormalised
    nucleus = torch.bincount(sample(logits, 1.0, 0.8, u), minlength=5).double() / 20000
    assert nucleus[3:].sum() == 0
    assert nucleus[:3].tolist() == pytest.approx([0.5 / 0.9, 0.25 / 0.9, 0.15 / 0.9], abs=0.015)
    assert torch.equal(sample(logits[:3], 0.0, 1.0, u[:3]), torch.zeros(3, dtype=torch.long))  # greedy


def _sampled(out):
    return [[(c.token_ids, c.logprobs) for c in row] for row in out]


@pytest.mark.parametrize("mixed_lora", ["bmm", "loop"])
def test_a_sampled_row_does_not_depend_on_its_batch(base, adapters, mixed_lora):
    """Alone, mixed with other adapters, in small or large batches, split across threads: the same sampled
    tokens and log-probs, bit for bit (per-row keys; prompts of different widths shifted by multiples of
    ALIGN)."""
    prompts = PROMPTS * 2 + ["one two three four five six seven eight nine ten", "a"]
    reqs = [GenerationRequest(p, adapters[i % 3] if i % 4 != 3 else None) for i, p in enumerate(prompts)]
    s = SamplingParams(n=3, temperature=1.0, top_p=0.9, max_tokens=12, seed=5, logprobs=True)
    big = make_engine("hf", base, mixed_lora=mixed_lora).generate(reqs, s)
    small = make_engine("hf", base, mixed_lora=mixed_lora, token_budget=40).generate(reqs, s)
    assert _sampled(big) == _sampled(small)
    assert len({tuple(c.token_ids) for c in big[0]}) > 1
    assert all(c.logprobs is not None for row in big for c in row)
    for threads in (2, 3):  # the rows split into runs decoded at once in threads through the one base
        engine = make_engine("hf", base, mixed_lora=mixed_lora, parallel_batches=threads)
        assert _sampled(engine.generate(reqs, s)) == _sampled(big)


@pytest.mark.parametrize("fused", [True, False])
def test_a_row_alone_or_among_few_rows_decodes_as_it_does_among_many(base, fused):
    """Tokens and log-probs, bit for bit, of prompts of different lengths decoded alone (a step of one row,
    where the CPU GEMMs take another kernel than for 4 rows and more), in parts of 2, 3 or 5, and all
    together (rows then finish one by one down to the last, with their batch's padding cut): a row's
    columns are shifted by multiples of ALIGN only, and its prompt attended over its own columns; the
    fillers up to MIN_ROWS never show in the results. Through the fused step and the model's forward."""
    import torch
    from populora_engines.decode import decode
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base.path).eval()
    lengths = [3, 4, 6, 11, 12, 17, 9, 5, 14, 16]  # neighbours differing by 1, 2, 5, 8, 9, ...
    prompts = [[(5 + 7 * r + 3 * i) % 50 + 3 for i in range(n)] for r, n in enumerate(lengths)]
    keys = [101 + r for r in range(len(prompts))]

    def rows(part):
        with torch.no_grad():
            out = decode(
                model,
                [prompts[r] for r in part],
                [keys[r] for r in part],
                max_tokens=32,
                temperature=1.0,
                top_p=1.0,
                eos_ids=[2],
                pad_id=0,
                device="cpu",
                logprobs=True,
                fused=fused,
            )
        assert out.logprobs is not None and len(out.tokens) == len(part)
        return list(zip(out.tokens, out.logprobs))

    everything = range(len(prompts))
    whole = rows(everything)
    assert len({len(tokens) for tokens, _ in whole}) > 2  # rows end at different steps
    for size in (1, 2, 3, 5):
        parts = [everything[i : i + size] for i in range(0, len(prompts), size)]
        assert [r for part in parts for r in rows(part)] == whole, size


def test_a_few_rows_loras_product_is_what_they_get_among_many():
    """The per-adapter products of ``mixed_lora: loop``: 1-3 rows alone equal the same rows among 8 (padded to
    MIN_ROWS), where the plain product of so few rows does not (so this can fail)."""
    import torch
    from populora_engines.batched_lora import _rows_independent_matmul

    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(8, 1, 8, generator=gen), torch.randn(8, 64, generator=gen)  # (rows, r) @ B^T
    many = _rows_independent_matmul(x, w)
    assert all(torch.equal(_rows_independent_matmul(x[:k], w), many[:k]) for k in (1, 2, 3))
    assert not all(torch.equal(x[:k] @ w, many[:k]) for k in (1, 2, 3))


def test_a_call_split_in_parts_with_their_indices_draws_what_the_whole_call_draws(base, adapters):
    """The row_seeded contract a cluster relies on: a request's samples depend on its index in the logical
    call (``GenerationRequest.index``), not on its position in the part it was sent in."""
    from dataclasses import replace

    reqs = [GenerationRequest(p, adapters[i % 3] if i % 4 != 3 else None) for i, p in enumerate(PROMPTS * 2)]
    s = SamplingParams(n=2, temperature=1.0, top_p=0.95, max_tokens=10, seed=11)
    engine = make_engine("hf", base)
    assert engine.row_seeded and not make_engine("hf", base, decode="generate").row_seeded
    whole = engine.generate(reqs, s)
    cut = 3
    parts = [
        engine.generate([replace(r, index=i) for i, r in enumerate(reqs[:cut])], s),
        engine.generate([replace(r, index=i) for i, r in enumerate(reqs[cut:], start=cut)], s),
    ]
    assert _tokens(parts[0] + parts[1]) == _tokens(whole)
    unindexed = engine.generate(reqs[cut:], s)  # positions 0.. in its own call: other keys, other samples
    assert _tokens(unindexed) != _tokens(whole[cut:])


def test_the_loop_and_transformers_generate_agree_on_greedy_tokens_and_logprobs(base, adapters):
    reqs = [GenerationRequest(p, adapters[i % 3] if i % 5 != 4 else None) for i, p in enumerate(PROMPTS * 3)]
    s = SamplingParams(n=1, temperature=0.0, max_tokens=10, logprobs=True)
    loop = make_engine("hf", base, decode="loop").generate(reqs, s)
    reference = make_engine("hf", base, decode="generate").generate(reqs, s)
    assert _tokens(loop) == _tokens(reference)
    for a, b in zip(loop, reference):
        assert [c.finish_reason for c in a] == [c.finish_reason for c in b]
        assert a[0].logprobs == pytest.approx(b[0].logprobs, abs=1e-4)


def _decode(base, prompts, keys, adapter_keys, **kw):
    import torch
    from populora_engines.batched_lora import batched_adapters
    from populora_engines.decode import decode

    from populora_core.services.modelhost import get_host

    host = get_host(base)
    with torch.no_grad(), batched_adapters(host, adapter_keys) as rows:
        return decode(host.base_model, prompts, keys, pad_id=0, device=host.device, row_adapters=rows, **kw)


def test_narrowed_batches_and_shared_prefill_give_each_row_its_tokens_alone(base, adapters):
    """Rows that end early (a frequent token is EOS here) are dropped and padding columns cut: every row still
    gets what it gets decoded alone, and rows sharing a prompt prefill once with the same result."""
    from populora_engines.decode import row_key

    from populora_core.services.modelhost import get_host

    host = get_host(base)
    tok = host.tokenizer
    prompts = [tok(p)["input_ids"] for p in PROMPTS] * 2
    prompts += [prompts[0]] * 3  # three samples of one request
    names = [host.ensure(adapters[i % 3]) for i in range(len(prompts))]
    names[-3:] = [names[0]] * 3
    keys = [row_key("narrow", r) for r in range(len(prompts))]
    kw = dict(max_tokens=16, temperature=1.0, top_p=1.0, logprobs=True)
    free = _decode(base, prompts, keys, names, eos_ids=[], **kw)
    eos = [max(set(free.tokens[0]), key=free.tokens[0].count)]  # the first row's most frequent token
    together = _decode(base, prompts, keys, names, eos_ids=eos, **kw)
    lengths = [len(t) for t in together.tokens]
    assert len(set(lengths)) > 2 and min(lengths) < 16  # rows really ended at different steps
    for r in range(len(prompts)):
        alone = _decode(base, [prompts[r]], [keys[r]], [names[r]], eos_ids=eos, **kw)
        assert together.tokens[r] == alone.tokens[0]
        assert together.logprobs[r] == pytest.approx(alone.logprobs[0], abs=1e-4)
    first = list(range(len(prompts)))
    first[-3:] = [0, 0, 0]
    shared = _decode(base, prompts, keys, names, eos_ids=eos, prefill_row=first, **kw)
    assert shared.tokens == together.tokens
    assert shared.tokens[-3:] != [together.tokens[0]] * 3  # one prefill, three different samples


def test_stop_strings_end_a_row_in_the_loop_as_in_generate(base, adapters):
    engine = make_engine("hf", base, decode="loop")
    reference = make_engine("hf", base, decode="generate")
    greedy = SamplingParams(temperature=0.0, max_tokens=16)
    req, free = next(
        (r, out)
        for a in adapters
        for p in PROMPTS
        for r in [[GenerationRequest(p, a)]]
        for out in [engine.generate(r, greedy)[0][0]]
        if out.finish_reason == "length"
    )
    text = free.text
    stop = next(  # a stop string that first occurs mid-way in the free-running text
        text[i : i + 2]
        for i in range(3, len(text) - 1)
        if text[i : i + 2].isprintable() and text.find(text[i : i + 2]) == i
    )
    cut = engine.generate(req, SamplingParams(temperature=0.0, max_tokens=16, stop=(stop,)))[0][0]
    assert cut == reference.generate(req, SamplingParams(temperature=0.0, max_tokens=16, stop=(stop,)))[0][0]
    assert cut.finish_reason == "stop" and free.text.startswith(cut.text) and stop not in cut.text


class _StubHost:
    """What RowAdapters and serving() read of a ModelHost, over a bare model and random LoRA versions."""

    def __init__(self, model, ranks, seed=0):
        import threading

        import torch

        self.base_model, self.peft = model, None
        self._mode_lock, self.mode, self._mode_depth, self._undo = threading.Lock(), None, 0, []
        self._linears = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
        gen = torch.Generator().manual_seed(seed)
        self._versions = {
            f"v{i}": {
                path: (
                    torch.randn(r, m.in_features, generator=gen) * 0.3,
                    torch.randn(m.out_features, r, generator=gen) * 0.3,
                )
                for path, m in self._linears.items()
                if path != "lm_head"
            }
            for i, r in enumerate(ranks)
        }

    def linears(self):
        return list(self._linears.values())

    # the real host's serving mode (hooks installed by the outermost block, from any thread)
    serving = ModelHost.serving
    _enter = ModelHost._enter
    _leave = ModelHost._leave
    _restore = ModelHost._restore

    def linear(self, path):
        return self._linears[path]

    def version(self, name):
        return self._versions[name]


def _random_model(kind, dtype=None, **config):
    """A tiny random causal LM (GQA: 4 query heads on 2 KV heads); ``config`` overrides the family's defaults."""
    import torch
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    torch.manual_seed(3)
    shape = dict(
        vocab_size=200,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    yarn = {"rope_type": "yarn", "factor": 2.0, "rope_theta": 10000.0}
    config_class, model_class, defaults = {
        "qwen2": (Qwen2Config, Qwen2ForCausalLM, dict(tie_word_embeddings=True)),  # q/k/v biases
        "mistral": (MistralConfig, MistralForCausalLM, dict(sliding_window=None)),
        "llama": (LlamaConfig, LlamaForCausalLM, {}),
        "llama-yarn": (LlamaConfig, LlamaForCausalLM, dict(rope_parameters=yarn)),  # attention_scaling != 1
    }[kind]
    model = model_class(config_class(**{**shape, **defaults, **config}))
    return model.to(dtype or torch.float32).eval()


def _fused_and_forward(model, host, adapter_keys, mode, monkeypatch, **kw):
    """decode() with the fused step and with the model's forward: (tokens, logprobs, every step's logits)."""
    import populora_engines.decode as decode_module
    import torch
    from populora_engines.batched_lora import batched_adapters

    runs = []
    for fused in (True, False):
        logits = []
        sample = decode_module.sample

        def recording(step_logits, *args, _sample=sample, _logits=logits):
            _logits.append(step_logits.clone())
            return _sample(step_logits, *args)

        monkeypatch.setattr(decode_module, "sample", recording)
        with torch.no_grad(), batched_adapters(host, adapter_keys, mode) as rows:
            out = decode_module.decode(model, row_adapters=rows, fused=fused, pad_id=0, device="cpu", **kw)
        monkeypatch.setattr(decode_module, "sample", sample)
        runs.append((out.tokens, out.logprobs, logits))
    return runs


def _assert_bitwise(runs):
    import torch

    (tokens, logps, logits), (ref_tokens, ref_logps, ref_logits) = runs
    assert tokens == ref_tokens and logps == ref_logps  # floats compared with ==: bit for bit
    assert len(logits) == len(ref_logits) and all(torch.equal(a, b) for a, b in zip(logits, ref_logits))


@pytest.mark.parametrize("kind", ["llama", "llama-yarn", "qwen2", "mistral", "llama-bf16", "nano"])
def test_the_fused_step_is_bit_identical_to_the_models_forward(kind, monkeypatch):
    """No adapters and mixed LoRA (bmm and loop), rows ending at different steps (narrowing), shared
    prefills, greedy and sampled, top-p: the same tokens, log-probs and logits, bit for bit."""
    import torch
    from populora_engines.batched_lora import BASE
    from populora_engines.decode import row_key
    from populora_engines.fused import fused_supported
    from transformers import AutoModelForCausalLM

    from populora_core import get_registry

    if kind == "nano":
        model = AutoModelForCausalLM.from_pretrained(get_registry().base_model("nano").path).eval()
    else:
        model = _random_model(kind.removesuffix("-bf16"), torch.bfloat16 if kind.endswith("bf16") else None)
    assert fused_supported(model)
    host = _StubHost(model, ranks=(4, 8))
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, vocab, (int(n),), generator=gen).tolist() for n in (5, 9, 9, 14, 3, 9)]
    prompts[2] = prompts[1]
    adapter_keys = ["v0", "v1", "v1", BASE, "v0", "v1"]
    keys = [row_key("fused", r) for r in range(len(prompts))]
    common = dict(prompts=prompts, keys=keys, max_tokens=12, logprobs=True)
    free = _fused_and_forward(
        model, host, [BASE] * 6, "bmm", monkeypatch, temperature=1.0, top_p=1.0, eos_ids=[], **common
    )
    _assert_bitwise(free)
    counts = torch.bincount(torch.tensor([t for row in free[0][0] for t in row]), minlength=vocab)
    eos = counts.argsort(descending=True)[:15].tolist()  # frequent tokens as EOS: rows end at different steps
    lengths = []
    for mode in ("bmm", "loop"):
        for temperature, top_p in ((1.0, 1.0), (0.0, 1.0), (0.8, 0.7)):
            runs = _fused_and_forward(
                model,
                host,
                adapter_keys,
                mode,
                monkeypatch,
                temperature=temperature,
                top_p=top_p,
                eos_ids=eos,
                prefill_row=[0, 1, 1, 3, 4, 5],
                **common,
            )
            _assert_bitwise(runs)
    lengths = {len(t) for t in runs[0][0]}
    assert len(lengths) > 1 and min(lengths) < 12  # the batch really narrowed


def test_the_hf_engine_decodes_through_the_fused_step_under_peft(base, adapters, monkeypatch, tmp_path):
    """The engine's real setting (a PEFT-wrapped base with a trainer slot, its adapters disabled while
    serving) runs the fused step, and gives bit for bit what the model's forward gives. On a copy of the
    base: its host is this test's own (the slot would otherwise stay in the session's shared host)."""
    import shutil

    import populora_engines.fused as fused_module

    from populora_core.api.components import BaseModel
    from populora_core.services.modelhost import get_host

    base = BaseModel(str(shutil.copytree(base.path, tmp_path / "base")))
    host = get_host(base)
    host.load_into("trainer_scratch", adapters[0])  # PEFT wraps the base's linears, as a trainer does
    assert host.peft is not None
    reqs = [GenerationRequest(p, adapters[i % 3] if i % 4 != 3 else None) for i, p in enumerate(PROMPTS * 2)]
    s = SamplingParams(n=2, temperature=1.0, top_p=0.9, max_tokens=12, seed=5, logprobs=True)
    built = []
    fused_step = fused_module.fused_step

    def spied(model):
        step = fused_step(model)
        built.append(step)
        return step

    monkeypatch.setattr(fused_module, "fused_step", spied)
    fused = make_engine("hf", base).generate(reqs, s)
    assert built and all(step is not None and step.adapters is not None for step in built)
    monkeypatch.setattr(fused_module, "fused_step", lambda model: None)
    forward = make_engine("hf", base).generate(reqs, s)
    assert _tokens(fused) == _tokens(forward)
    assert [[c.logprobs for c in row] for row in fused] == [[c.logprobs for c in row] for row in forward]


def test_the_fused_step_falls_back_where_it_would_not_be_exact():
    """Hooks of others, PEFT adapters switched on, RoPE recomputed in the forward, sliding windows: the
    model's forward runs (``fused=True`` says so)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from populora_engines.decode import decode
    from populora_engines.fused import fused_step, fused_supported

    model = _random_model("llama")
    assert fused_step(model) is not None
    handle = model.model.layers[1].mlp.register_forward_hook(lambda module, args, output: output)
    assert fused_step(model) is None
    kw = dict(max_tokens=3, temperature=0.0, top_p=1.0, eos_ids=[], pad_id=0, device="cpu")
    with torch.no_grad(), pytest.raises(ValueError, match="does not apply"):
        decode(model, [[5, 6, 7]], [0], fused=True, **kw)
    with torch.no_grad():
        assert len(decode(model, [[5, 6, 7]], [0], **kw).tokens[0]) == 3  # the forward instead
    handle.remove()
    peft = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    assert fused_step(model) is None  # the LoRA layers add their delta in the forward
    q_proj = model.model.layers[0].self_attn.q_proj
    with peft.disable_adapter():
        step = fused_step(model)
        assert step is not None and step.layers[0].q is q_proj.base_layer
        q_proj.forward = q_proj.forward  # a forward patched onto the instance may compute anything
        assert fused_step(model) is None
    dynamic = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    assert not fused_supported(_random_model("llama", rope_parameters=dynamic))
    assert not fused_supported(_random_model("qwen2", use_sliding_window=True, sliding_window=8, max_window_layers=0))
    assert not fused_supported(_random_model("mistral", sliding_window=8))


def test_a_bare_cuda_device_loads_onto_the_current_device_not_local_rank(monkeypatch):
    """``cuda`` is torch's current device (where the host's other tensors go), whatever LOCAL_RANK says:
    transformers would read a bare ``cuda`` device_map as ``cuda:$LOCAL_RANK``. Fake CUDA: current device 2."""
    import torch

    from populora_core.services.device import load_kwargs

    monkeypatch.setenv("LOCAL_RANK", "5")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)
    assert load_kwargs("cuda", torch.bfloat16) == {"dtype": torch.bfloat16, "device_map": "cuda:2"}
    assert load_kwargs("cuda:1", torch.bfloat16)["device_map"] == "cuda:1"  # a named device stays


def test_an_accelerator_loads_the_base_straight_onto_it(tiny_model_dir):
    """On CUDA the weights are placed by ``device_map`` as they load (no host copy first); the same load, placed
    on the CPU, gives the plain load's weights (the path is real in this transformers, not only on a GPU)."""
    import torch
    from transformers import AutoModelForCausalLM

    from populora_core.services.device import load_kwargs

    assert load_kwargs("cuda:0", torch.bfloat16) == {"dtype": torch.bfloat16, "device_map": "cuda:0"}
    assert load_kwargs("cpu", torch.float32) == {"dtype": torch.float32}
    placed = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, device_map="cpu")
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, **load_kwargs("cpu", torch.float32))
    assert all(torch.equal(a, b) for a, b in zip(placed.state_dict().values(), plain.state_dict().values()))
