"""Prompt styles and answer parsing of the AZR tasks (pure text; nothing executes)."""

from __future__ import annotations

import pytest
from populora_azr import prompts as P

from tests.azr_support import load_seeds

REFS = [
    ("def f(a):\n    return a", "'Hello world'", "'Hello world'"),
    ("def f(x, n):\n    return x * n", "'ab', 3", "'ababab'"),
]


@pytest.mark.parametrize("style", P.STYLES)
def test_code_proposal_round_trip(style):
    program = "def g(items):\n    return sorted(items)[::-1]"
    completion = P.format_code_proposal(program, "[3, 1, 2]", think="reverse sort")
    parsed = P.parse_code_proposal(completion, style)
    assert parsed.program == program and parsed.input == "[3, 1, 2]"
    assert P.check_format(completion, style)


def test_azr_style_needs_answer_tags_compact_does_not():
    bare = P.format_code_proposal("def f(a):\n    return a", "1")
    assert P.parse_code_proposal(bare, "compact").input == "1"
    with pytest.raises(P.ParseError):
        P.parse_code_proposal(bare, "azr")  # AZR parses only inside <answer>
    assert not P.check_format(bare, "azr")
    assert P.check_format("reasoning</think> <answer>x</answer> trailing text", "azr")
    assert not P.check_format("reasoning <answer>x</answer>", "azr")


def test_first_python_block_and_last_answer_are_used():
    text = (
        "</think><answer>old</answer> <answer>```python\ndef f(a):\n    return 1\n```\n"
        "```python\ndef f(a):\n    return 2\n```\n```input\n5\n```\n```input\n6\n```</answer>"
    )
    parsed = P.parse_code_proposal(text, "azr")
    assert parsed.program.endswith("return 1") and parsed.input == "5"


def test_missing_blocks_are_parse_errors():
    with pytest.raises(P.ParseError, match="input"):
        P.parse_code_proposal("```python\ndef f(a):\n    return a\n```", "compact")
    with pytest.raises(P.ParseError, match="python"):
        P.parse_code_proposal("```input\n1\n```", "compact")


def test_induction_keeps_last_n_inputs_and_needs_n():
    inputs = [str(i) for i in range(12)]
    got, msg = P.parse_induction_proposal(P.format_induction_proposal(inputs, "adds"), 10)
    assert got == inputs[-10:] and msg == "adds"
    with pytest.raises(P.ParseError, match="need 10"):
        P.parse_induction_proposal(P.format_induction_proposal(inputs[:9], "adds"), 10)


@pytest.mark.parametrize("tail", ["<message>sums things</message>", "# Message: sums things"])
def test_induction_message_fallbacks(tail):
    text = "\n".join(P.fence("input", str(i)) for i in range(10)) + "\n" + tail
    assert P.parse_induction_proposal(text, 10)[1] == "sums things"


@pytest.mark.parametrize(
    "answer,expected",
    [
        ("```output\n[1, 2]\n```", "[1, 2]"),
        ("# Output: 'abc'", "'abc'"),
        ("output(42)", "42"),
        ("<output>{'a': 1}</output>", "{'a': 1}"),
        ("The output is 7.", "7"),
        ("  3.5  ", "3.5"),
    ],
)
def test_solver_fallback_chain(answer, expected):
    assert P.parse_solver_answer("deduction", f"x</think><answer>{answer}</answer>", "azr") == expected


def test_solver_parsing_per_task():
    assert P.parse_solver_answer("abduction", P.format_solver_answer("abduction", "'a', 2")) == "'a', 2"
    prog = P.parse_solver_answer(
        "induction", "```python\ndef f(a):\n    return 0\n```\n```python\ndef f(a):\n    return a\n```"
    )
    assert prog.endswith("return a")
    assert P.parse_solver_answer("induction", "no code here") is None
    assert P.parse_solver_answer("deduction", "x</think> no answer tags", "azr") is None
    assert P.has_answer_block("deduction", P.format_solver_answer("deduction", "1"))
    assert not P.has_answer_block("deduction", "The output is 1")


def test_azr_prompts_have_the_r1_structure_and_references():
    p = P.code_proposer_prompt("deduction", REFS, style="azr", banned=["random", "os.path"])
    assert p.rstrip().endswith("Assistant: <think>") and "User: " in p
    assert "<snippet_0>" in p and "<snippet_1>" in p and "os.path" in p
    ind = P.induction_proposer_prompt("def f(a):\n    return a", n_inputs=10, style="azr")
    assert "10 inputs" in ind and "f(<one of your inputs goes here>)" in ind
    solver = P.induction_solver_prompt([("1", "1"), ("2", "2")], "identity", style="azr")
    assert "input_1" in solver and "output_0" in solver and "identity" in solver


def test_compact_prompts_show_real_references_and_the_skip_rule_keeps_them_short(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = load_seeds("7b_seed_io.jsonl")
    refs = [(r["snippet"], r["input"], r["output"]) for r in rows[:80]]
    lengths = []
    for k in range(0, 36, 6):
        for kind in ("deduction", "abduction"):
            shown = P.code_proposer_prompt(kind, refs[k : k + 6], style="compact")  # AZR: all six, as drawn
            assert shown.endswith("Answer:\n") and "Reference 6:" in shown
            assert all(program.strip("\n") in shown for program, _, _ in refs[k : k + 6])
            prompt = P.code_proposer_prompt(kind, refs[k : k + 6], style="compact", max_chars=P.COMPACT_MAX_CHARS)
            assert prompt.endswith("Answer:\n") and "Reference 1:" in prompt
            lengths.append(len(tok(prompt)["input_ids"]))
    assert max(lengths) < 512, lengths
    for row in load_seeds("7b_code_f_seed_io.jsonl")[:20]:
        pairs = list(zip(row["inputs"], row["outputs"], strict=True))[:5]
        prompt = P.induction_solver_prompt(pairs, row["message"][:200], style="compact")
        assert prompt.count("```input") >= 1
        if len(pairs[0][0]) + len(pairs[0][1]) < 200:  # the first pair is always shown, whatever its size
            assert len(tok(prompt)["input_ids"]) < 512


def test_compact_skip_rule_drops_references_that_do_not_fit():
    big = ("def f(a):\n" + "    a = a + 1\n" * 80 + "    return a", "1", "81")
    p = P.code_proposer_prompt("deduction", [big, REFS[1]], style="compact", max_chars=600)
    assert "Reference 1:" in p and "x * n" in p and "a = a + 1" not in p
    assert len(p) <= 600
    assert P.fit_references("deduction", [big, REFS[1]], 600) == [REFS[1]]


def test_compact_proposer_prompt_shows_every_reference_whatever_its_length():
    big = ("def f(a):\n" + "    a = a + 1\n" * 80 + "    return a", "1", "81")
    p = P.code_proposer_prompt("deduction", [big, REFS[1], REFS[0]], style="compact")
    assert p.index("a = a + 1") < p.index("x * n") < p.index("'Hello world'")  # in the order drawn
    assert [line for line in p.splitlines() if line.startswith("Reference")] == [f"Reference {i}:" for i in (1, 2, 3)]
    assert len(p) > 1000 and P.compact_proposer_chars([big, REFS[1], REFS[0]]) == len(p)


def test_the_nano_proposer_budget_fits_its_positions_and_the_typical_reference_its_programs():
    """900 characters leave room for a 160-token proposal in nano's 768 positions even at its densest text, and the
    typical reference validation sizes K by is no smaller than the references of nano's probe programs."""
    import json
    import random

    from populora_nano import MODEL_DIR, PROBE_FILE
    from transformers import AutoConfig, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(MODEL_DIR))
    positions = AutoConfig.from_pretrained(str(MODEL_DIR)).max_position_embeddings
    records = [json.loads(line) for line in PROBE_FILE.read_text().splitlines() if line.strip()]
    refs = [(r["program"], r["inputs"][0], r["outputs"][0]) for r in records if r["task_type"] != "induction"]
    rng = random.Random(0)
    prompts = [P.code_proposer_prompt(rng.choice(("deduction", "abduction")), rng.sample(refs, 6)) for _ in range(200)]
    density = min(len(p) / len(tok(p)["input_ids"]) for p in prompts)  # characters per token, the densest seen
    assert density > 2.0 and P.COMPACT_PROPOSER_MAX_CHARS / density + 160 <= positions, density
    assert max(len(tok(p)["input_ids"]) for p in prompts) + 160 <= positions  # even 6 references fit the positions
    typical = P.compact_proposer_chars([P.TYPICAL_REFERENCE] * 6)
    assert sum(map(len, prompts)) / len(prompts) <= typical
    assert P.compact_proposer_chars([P.ZERO_TRIPLET] * 6) < P.COMPACT_PROPOSER_MAX_CHARS < typical


def test_unknown_style_is_refused():
    with pytest.raises(ValueError, match="style"):
        P.deduction_solver_prompt("def f(a):\n    return a", "1", style="chatml")
