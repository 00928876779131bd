"""The shipped ``nano`` base model: registry, both engines, corpus validity in the sandbox, probe set."""

from __future__ import annotations

import json
import random
import re

import pytest

from populora_core import UserError
from populora_core.api.components import AdapterRef, BaseModel, LoraSettings, SamplingParams

LORA = LoraSettings(rank=4, alpha=8.0, init_std=0.3)


def _registry():
    from populora_core import get_registry

    return get_registry()


@pytest.fixture(scope="module")
def nano() -> BaseModel:
    return _registry().base_model("nano")


@pytest.fixture(scope="module")
def executor():
    ex = _registry().get("executor", "sandbox").build({"workers": 2})
    yield ex
    ex.close()


@pytest.fixture(scope="module")
def tasks(executor):
    reg = _registry()
    out = {}
    for name in ("deduction", "abduction", "induction"):
        out[name] = reg.get("task", name).build({"style": "compact"}, executor=executor, rng=0, tasks=out)
    return out


def _engine(name: str, base: BaseModel, **params):
    return _registry().get("engine", name).build(params, base_model=base, lora=LORA, seed=0)


# --- the model ------------------------------------------------------------------------------------------


def test_nano_is_a_small_llama_with_a_stable_tokenizer(nano):
    from pathlib import Path

    from populora_nano.probe import load_probe
    from transformers import AutoConfig, AutoTokenizer

    path = Path(nano.path)
    assert nano.name == "nano" and nano.dtype == "float32"
    assert sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) <= 20 * 1024 * 1024
    assert any(path.glob("*.safetensors"))
    config = AutoConfig.from_pretrained(path)
    assert config.model_type == "llama"
    tok = AutoTokenizer.from_pretrained(path)
    task_text = load_probe()[0].program
    ids = tok(task_text)["input_ids"]
    assert tok.decode(ids) == task_text
    assert tok.eos_token_id is not None and tok.pad_token_id is not None


def test_nano_generates_through_the_hf_engine(nano, tasks):
    from populora_nano.probe import load_probe

    from populora_core.api.components import GenerationRequest

    problem = next(p for p in load_probe() if p.task_type == "deduction")
    engine = _engine("hf", nano)
    try:
        out = engine.generate(
            [GenerationRequest(tasks["deduction"].solver_prompt(problem))],
            SamplingParams(n=2, temperature=0.0, max_tokens=24, logprobs=True),
        )
    finally:
        engine.close()
    assert len(out) == 1 and len(out[0]) == 2
    first, second = out[0]
    assert first.token_ids and first.token_ids == second.token_ids  # greedy
    assert len(first.logprobs) == len(first.token_ids)
    assert "```output" in first.text  # the pretrained model answers in the compact format


@pytest.mark.slow
@pytest.mark.vllm
def test_nano_generates_through_the_vllm_engine(nano, tasks):
    pytest.importorskip("vllm")
    from populora_nano.probe import load_probe

    from populora_core.api.components import GenerationRequest

    problem = next(p for p in load_probe() if p.task_type == "abduction")
    prompt = tasks["abduction"].solver_prompt(problem)
    engine = _engine("vllm", nano)
    try:
        out = engine.generate(
            [GenerationRequest(prompt)], SamplingParams(n=1, temperature=0.0, max_tokens=24, logprobs=True)
        )
    finally:
        engine.close()
    comp = out[0][0]
    assert comp.token_ids and len(comp.logprobs) == len(comp.token_ids)
    assert "```input" in comp.text


def test_nano_is_registered_with_a_clear_error_for_params():
    comp = _registry().get("base_model", "nano")
    with pytest.raises(Exception, match=r"extra|unknown|not permitted"):
        comp.parse_params({"path": "/elsewhere"})


# --- the corpus generator ------------------------------------------------------------------------------------


def test_corpus_programs_are_deterministic_from_the_seed():
    from benchmarks.research.nano import corpus as C

    a = [C.random_program(random.Random(5)).code for _ in range(3)]
    b = [C.random_program(random.Random(5)).code for _ in range(3)]
    assert a == b
    rng = random.Random(1)
    codes = {C.random_program(rng).code for _ in range(200)}
    assert len(codes) > 150  # the grammar gives varied programs


def test_corpus_programs_are_valid_in_the_sandbox(executor, tasks):
    """Generated programs and inputs pass the AZR tasks' own validation with the same outputs."""
    from populora_azr import prompts as P

    from benchmarks.research.nano import corpus as C

    programs = C.generate_programs(12, random.Random(11), executor, chunk=24)
    assert len(programs) == 12
    completions, expected = [], []
    for prog in programs:
        assert len(prog.inputs) >= 10 and len(prog.inputs) == len(prog.outputs)
        completions.append(P.format_code_proposal(prog.code, prog.inputs[0]))
        expected.append(prog.outputs[0])
    for name in ("deduction", "abduction"):
        parsed = tasks[name].parse_proposals(completions, [None] * len(completions), "corpus")
        assert [p.error for p in parsed] == [None] * len(parsed)
        assert [p.outputs[0] for p in parsed] == expected
    ind = tasks["induction"].parse_proposals(
        [P.format_induction_proposal(p.inputs[:10], p.message) for p in programs],
        [{"program": p.code} for p in programs],
        "corpus",
    )
    assert [p.error for p in ind] == [None] * len(ind)
    assert [p.outputs for p in ind] == [p.outputs[:10] for p in programs]


def test_corpus_drops_inputs_that_fail(executor):
    from benchmarks.research.nano import corpus as C

    prog = C.Program("def f(xs):\n    return xs[0] * 2", ("list",), "double the first", 1)
    C.execute([prog], [["[3, 1]", "[]", "[3, 1]", "[5]"]], executor)
    assert prog.inputs == ["[3, 1]", "[5]"]  # the empty list raises, the duplicate is dropped
    assert prog.outputs == ["6", "10"]


def test_rendered_examples_use_the_compact_builders():
    from populora_azr import prompts as P

    from benchmarks.research.nano import corpus as C

    prog = C.Program(
        "def f(n):\n    return n + 3",
        ("int",),
        "add a number",
        1,
        inputs=[str(i) for i in range(10)],
        outputs=[str(i + 3) for i in range(10)],
    )
    examples = C.render_examples([prog], random.Random(0))
    kinds = {e.kind for e in examples}
    assert {"deduction/solve", "abduction/solve", "induction/solve"} <= kinds
    for e in examples:
        task = e.kind.split("/")[0]
        if e.kind.endswith("/solve"):
            answer = P.parse_solver_answer(task, e.completion, "compact")
            assert answer is not None and P.has_answer_block(task, e.completion, "compact")
        assert e.prompt.startswith(f"[{e.kind.replace('/', ':')}]")
        assert e.prompt.endswith("Answer:\n")
    ded = next(e for e in examples if e.kind == "deduction/solve")
    i = ded.prompt.split("```input\n")[1].split("\n```")[0]
    assert ded.prompt == P.deduction_solver_prompt(prog.code, i, style="compact")
    assert ded.completion == P.format_solver_answer("deduction", str(int(i) + 3))


def test_induction_proposal_rate_sets_how_many_programs_teach_message_writing():
    from benchmarks.research.nano import corpus as C

    progs = [
        C.Program(
            f"def f(n):\n    return n + {k}",
            ("int",),
            "add a number",
            1,
            inputs=[str(i) for i in range(10)],
            outputs=[str(i + k) for i in range(10)],
        )
        for k in range(20)
    ]

    def proposals(rate: float) -> list[str]:
        examples = C.render_examples(progs, random.Random(0), induction_propose_rate=rate)
        return [e.completion for e in examples if e.kind == "induction/propose"]

    assert proposals(0.0) == []
    every = proposals(1.0)
    assert len(every) == len(progs) and all("```message\nadd a number\n```" in c for c in every)
    assert 0 < len(proposals(0.3)) < len(progs)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--induction-proposals", "1.5"], "--induction-proposals: 1.5 is not a share between 0 and 1"),
        (["--hidden", "160", "--heads", "4"], "head_dim 40"),
    ],
)
def test_make_model_rejects_bad_flags_before_any_work(args, message, tmp_path, capsys):
    from benchmarks.research.nano.make_model import main

    with pytest.raises(SystemExit) as exc:
        main(["--out", str(tmp_path / "model"), *args])
    assert exc.value.code == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "model").exists()


# --- the probe set --------------------------------------------------------------------------------------------


def test_probe_file_loads_into_problems_the_tasks_grade(tasks):
    from populora_azr import prompts as P
    from populora_nano.probe import load_probe

    problems = load_probe()
    counts = {t: sum(p.task_type == t for p in problems) for t in tasks}
    assert counts == {"deduction": 200, "abduction": 200, "induction": 200}
    gold_field = {
        "deduction": lambda p: p.outputs[0],
        "abduction": lambda p: p.inputs[0],
        "induction": lambda p: p.program,
    }
    for name, task in tasks.items():
        sample = [p for p in problems if p.task_type == name][:6]
        for p in sample:
            assert p.valid and task.solver_prompt(p).startswith(f"[{name}:solve]")
            good = P.format_solver_answer(name, gold_field[name](p))
            wrong = P.format_solver_answer(
                name,
                {
                    "deduction": "'not it'",
                    "abduction": "None, None, None",
                    "induction": "def f(a, k=0):\n    return -1",
                }[name],
            )
            grades = task.grade(p, [good, wrong])
            assert [g.correct for g in grades] == [True, False], p.program
    ind = next(p for p in problems if p.task_type == "induction")
    shown, hidden = tasks["induction"].split(ind)
    assert len(shown) == 5 and len(hidden) == 5
    assert len({p.program for p in problems}) == len(problems)


def test_probe_file_errors_name_the_file_and_line(tmp_path):
    from populora_nano.probe import load_probe

    bad = tmp_path / "probe.jsonl"
    bad.write_text(json.dumps({"task_type": "deduction", "program": "def f(a):\n    return a"}) + "\n")
    with pytest.raises(UserError, match=r"probe\.jsonl:1: not a Problem record"):
        load_probe(bad)
    bad.write_text("{not json\n")
    with pytest.raises(UserError, match=r"probe\.jsonl:1: not a Problem record \(Expecting"):
        load_probe(bad)
    with pytest.raises(UserError, match=r"problem file .*missing\.jsonl"):
        load_probe(tmp_path / "missing.jsonl")
    bad.write_text(json.dumps({"task_type": "sorting", "program": "x", "inputs": ["1"], "outputs": ["1"]}) + "\n")
    with pytest.raises(UserError, match="problem 1: unknown task_type 'sorting'"):
        load_probe(bad)


def test_evaluate_probe_reports_accuracy_and_validity_per_adapter(nano, tasks, tmp_path):
    from populora_nano.probe import evaluate_probe, load_probe

    from benchmarks.tiny_model import fresh_adapter

    problems = [
        p for t in ("deduction", "abduction", "induction") for p in [q for q in load_probe() if q.task_type == t][:3]
    ]
    adapter = fresh_adapter(nano, "s0@v0", LORA, seed=7, out_dir=tmp_path / "s0_v0")
    assert isinstance(adapter, AdapterRef)
    engine = _engine("hf", nano)
    try:
        result = evaluate_probe(engine, {"base": None, "s0": adapter}, tasks, problems, proposals=2)
    finally:
        engine.close()
    assert set(result) == {"base", "s0"}
    for row in result.values():
        assert set(row["solver_accuracy"]) == {"deduction", "abduction", "induction", "mean"}
        assert row["n"] == {"deduction": 3, "abduction": 3, "induction": 3}
        assert all(0.0 <= v <= 1.0 for v in row["solver_accuracy"].values())
        assert set(row["proposal_validity"]) == {"deduction", "abduction", "induction"}
    base = result["base"]["solver_accuracy"]
    assert base["mean"] == pytest.approx(sum(base[t] for t in ("deduction", "abduction", "induction")) / 3)


# --- the held-out evaluation set (``populora eval``'s default on nano) -----------------------------------------


def test_heldout_set_is_unseen_balanced_and_its_gold_grades_right_through_the_evaluator(executor):
    """``nano_heldout``: 50 problems per task type, none of them a probe program (the corpus's are excluded when it is
    drawn: python -m benchmarks.research.nano.make_heldout), types alternating so a limit stays balanced, gold answers
    graded right by the AZR tasks and wrong ones wrong; nano names it first in its default eval set."""
    from populora_azr import prompts as P
    from populora_nano.heldout import NanoHeldout
    from populora_nano.probe import load_probe

    registry = _registry()
    assert registry.base_model("nano").eval_benchmarks[0] == "nano_heldout"
    bench = registry.get("evaluator", "nano_heldout").build()
    assert isinstance(bench, NanoHeldout)
    items = bench.items()
    kinds = [item["problem"].task_type for item in items]
    assert {k: kinds.count(k) for k in set(kinds)} == {"deduction": 50, "abduction": 50, "induction": 50}
    assert kinds[:6] == ["deduction", "abduction", "induction"] * 2 and len(bench.items(9)) == 9
    heldout = {item["problem"].program for item in items}
    assert len(heldout) == 150 and not heldout & {p.program for p in load_probe()}
    gold = {"deduction": lambda p: p.outputs[0], "abduction": lambda p: p.inputs[0], "induction": lambda p: p.program}
    sample = [items[i] for i in range(0, 150, 5)]
    answers = [
        [P.format_solver_answer(it["problem"].task_type, gold[it["problem"].task_type](it["problem"])), ""]
        for it in sample
    ]
    assert all(bench.prompt(it).startswith(f"[{it['problem'].task_type}:solve]") for it in sample)
    assert bench.grade(sample, answers, executor) == [[True, False]] * len(sample)
    assert bench.dataset()["n_problems"] == 150 and bench.dataset()["source"] == "shipped"
