"""``populora eval TARGET``: benchmark a run's population, an adapter or a base model."""

from __future__ import annotations

import datetime
from collections.abc import Collection
from pathlib import Path
from typing import Any

import click

from populora_core.api import UserError

from .prompts import CODE_TEMPLATES, MATH_TEMPLATES


def _kv(pairs: tuple[str, ...], option: str) -> dict[str, Any]:
    import yaml

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UserError(f"{option} expects KEY=VALUE, got {pair!r}")
        parsed = yaml.safe_load(value) if option != "--data" else value
        # YAML reads 2024-01-15 as a date; settings take dates as text
        out[key.strip()] = value if isinstance(parsed, datetime.date) else parsed
    return out


def parse_benchmarks(spec: str) -> dict[str, int | None]:
    """``a,b:20,all`` -> each benchmark and how many of its first problems to use (None: all), in order.

    Groups: ``all``/``paper`` (the paper's ten), ``shipped`` (data in installed packages). A name no plugin
    registered is an error that suggests the nearest one.
    """
    import difflib

    from populora_core.api import get_registry

    from .evaluators import PAPER_BENCHMARKS, SHIPPED_BENCHMARKS

    known = get_registry().names("evaluator")
    groups = {"all": PAPER_BENCHMARKS, "paper": PAPER_BENCHMARKS, "shipped": SHIPPED_BENCHMARKS}
    chosen: dict[str, int | None] = {}
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        name, colon, count = part.partition(":")
        limit = None
        if colon:
            if not count.strip().isdigit() or int(count) < 1:
                raise UserError(f"--benchmarks {part!r}: after ':' comes how many problems, e.g. {name}:20")
            limit = int(count)
        for member in groups.get(name.strip(), (name.strip(),)):
            if member not in known:
                near = difflib.get_close_matches(member, [*known, *groups], n=1)
                hint = f"did you mean {near[0]!r}? " if near else ""
                raise UserError(
                    f"--benchmarks: unknown benchmark {member!r}; {hint}known: {', '.join(known)} "
                    "(groups: all, shipped; `populora plugins` lists every evaluator)"
                )
            chosen.setdefault(member, limit)
    if not chosen:
        raise UserError(f"--benchmarks {spec!r} names no benchmark; e.g. --benchmarks all")
    return chosen


def build_evaluators(
    names: Collection[str],
    data_paths: dict[str, str],
    *,
    math_template: str | None,
    code_template: str | None,
    max_tokens: int | None,
    timeout_s: float | None,
    eval_params: dict[str, Any] | None = None,
) -> list[Any]:
    """Evaluators from the registry (so a plugin may replace or add one) with the CLI's settings."""
    from populora_core.api import get_registry

    registry = get_registry()
    per_bench: dict[str, dict[str, Any]] = {}
    for key, value in (eval_params or {}).items():
        bench_name, dot, field = key.partition(".")
        if not dot or not field:
            raise UserError(f"--eval-param expects BENCHMARK.KEY=VALUE, got {key!r}")
        per_bench.setdefault(bench_name, {})[field] = value
    unknown = sorted((set(data_paths) | set(per_bench)) - set(names))
    if unknown:
        raise UserError(f"--data/--eval-param name benchmark(s) not being evaluated: {', '.join(unknown)}")
    evaluators, errors = [], []
    for name in names:
        comp = registry.get("evaluator", name)
        category = comp.meta.get("category")
        raw: dict[str, Any] = {}
        if name in data_paths:
            raw["path"] = data_paths[name]
        template = math_template if category == "math" else code_template
        if template:
            raw["template"] = template
        if max_tokens:
            raw["max_tokens"] = max_tokens
        if timeout_s is not None and category == "code":
            raw["timeout_s"] = timeout_s
        taken = comp.params_model.model_fields
        raw = {k: v for k, v in raw.items() if k in taken}  # a flag for all benchmarks, to those that have it
        raw.update(per_bench.get(name, {}))
        evaluator = comp.build(raw)
        try:
            evaluator.items()  # load and check the data now: a bad file fails before any generation
        except UserError as exc:
            errors.append(str(exc))  # every benchmark's problem in one message
            continue
        evaluators.append(evaluator)
    if len(errors) > 1:
        raise UserError(f"{len(errors)} benchmarks have no usable data:\n" + "\n".join(f"- {e}" for e in errors))
    if errors:
        raise UserError(errors[0])
    return evaluators


def engine_choice(
    recipe: dict[str, Any], engine: str | None, engine_params: dict[str, Any] | None
) -> tuple[str, dict[str, Any], str]:
    """The engine, its params and where they came from: the run's recipe unless ``--engine`` names another.

    ``--engine-param`` values go on top of the run's params (kept when ``--engine`` names the run's
    own engine); without a run, ``hf``.
    """
    spec = recipe.get("engine")
    run_name, run_params = (spec, {}) if isinstance(spec, str) else (None, {})
    if isinstance(spec, dict):
        run_name, run_params = spec.get("name"), dict(spec.get("params") or {})
    name = engine or run_name or "hf"
    origin = "--engine" if engine else ("run recipe" if run_name else "default")
    return name, {**(run_params if name == run_name else {}), **(engine_params or {})}, origin


def prefetch_data(benchmarks: str, data_paths: dict[str, str], eval_params: dict[str, Any]) -> list[dict[str, Any]]:
    """Load every benchmark's data as an evaluation would (hub data lands in the cache); its identity."""
    from .report import describe_dataset

    names = parse_benchmarks(benchmarks)
    evaluators = build_evaluators(
        names,
        data_paths,
        math_template=None,
        code_template=None,
        max_tokens=None,
        timeout_s=None,
        eval_params=eval_params,
    )
    identities = []
    for ev in evaluators:
        ident = ev.dataset()
        identities.append({"benchmark": ev.name, **ident})
        click.echo(f"{ev.name}: {describe_dataset(ident)}")
    return identities


def check_gold_data(
    benchmarks: str,
    data_paths: dict[str, str],
    eval_params: dict[str, Any],
    *,
    executor: str = "sandbox",
    executor_params: dict[str, Any] | None = None,
    timeout_s: float | None = None,
    limit: int | None = None,
    code_template: str | None = None,
    math_template: str | None = None,
) -> list[Any]:
    """Grade every benchmark's own gold through the real grader; print loaded / skipped / gold right.

    Returns the reports; the command exits 1 when a gold answer grades wrong for no known reason.
    """
    from .goldcheck import check_gold
    from .runner import make_executor

    names = parse_benchmarks(benchmarks)
    evaluators = build_evaluators(
        names,
        data_paths,
        math_template=math_template,
        code_template=code_template,
        max_tokens=None,
        timeout_s=timeout_s,
        eval_params=eval_params,
    )
    reports = check_gold(evaluators, lambda: make_executor(executor, executor_params), limit)
    for report in reports:
        click.echo(report.line())
        for note in report.skipped:
            click.echo(f"  skipped: {note}")
        for rid, why in report.excepted.items():
            click.echo(f"  known exception {rid}: {why}")
        for rid, why in report.failures.items():
            click.echo(f"  WRONG {rid}: {why}")
    return reports


def register(cli: Any) -> None:
    @cli.command("eval")
    @click.argument("target", required=False)
    @click.option(
        "--benchmarks",
        "-b",
        default="default",
        show_default=True,
        help="Comma list of benchmarks (NAME:N: its first N problems), or 'all' (the paper's ten) / 'shipped' "
        "(data offline); default: the base model's own set if it names one (nano: its held-out problems and 20 "
        "code problems, minutes on a CPU), else 'shipped'.",
    )
    @click.option(
        "--prefetch",
        default=None,
        metavar="BENCHMARKS",
        help="Only fetch these benchmarks' data into the cache (e.g. all) and print their identities; no TARGET.",
    )
    @click.option(
        "--check-gold",
        "check_gold",
        default=None,
        metavar="BENCHMARKS",
        help="Grade these benchmarks' own gold (canonical programs, gold answers) through the real grader; "
        "prints loaded / skipped / gold right per benchmark; no TARGET. Exit 1 if a gold grades wrong.",
    )
    @click.option("--engine", default=None, help="Rollout engine (hf, vllm); default: the run's engine, else hf.")
    @click.option("--engine-param", multiple=True, help="Engine setting KEY=VALUE (repeatable).")
    @click.option("--executor", default="sandbox", show_default=True, help="Executor for code grading.")
    @click.option("--executor-param", multiple=True, help="Executor setting KEY=VALUE (repeatable).")
    @click.option("--limit", type=int, default=None, help="Only the first N problems of each benchmark.")
    @click.option("--n", "n", type=int, default=1, show_default=True, help="Samples per problem (pass@k).")
    @click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy (AZR).")
    @click.option("--top-p", type=float, default=1.0, show_default=True)
    @click.option("--k", "ks", default="1", show_default=True, help="Comma list of k for pass@k.")
    @click.option("--seed", type=int, default=0, show_default=True)
    @click.option("--max-tokens", type=int, default=None, help="Override AZR's per-benchmark budgets.")
    @click.option(
        "--math-template",
        type=click.Choice(MATH_TEMPLATES),
        default=None,
        help="Math prompt template (default azr; qwen-boxed for non-AZR base models).",
    )
    @click.option(
        "--base-math-template",
        type=click.Choice(MATH_TEMPLATES),
        default=None,
        help="Math template for the bare base model only (AZR evaluates non-AZR bases with qwen-boxed).",
    )
    @click.option(
        "--code-template",
        type=click.Choice(CODE_TEMPLATES),
        default=None,
        help="Code prompt template (default: evalplus for HumanEval/MBPP, azr for LCB).",
    )
    @click.option("--timeout", "timeout_s", type=float, default=None, help="Seconds per code test (10).")
    @click.option("--baseline", type=click.Path(), default=None, help="Baseline run directory.")
    @click.option("--base-model", default=None, help="Override the base model (name, path or hub id).")
    @click.option(
        "--roles",
        type=click.Choice(["students", "teachers", "all"]),
        default="students",
        show_default=True,
        help="Which members of the final population to evaluate.",
    )
    @click.option("--data", "data", multiple=True, help="Local data file for a benchmark: NAME=PATH.")
    @click.option(
        "--eval-param",
        multiple=True,
        help="Evaluator setting BENCHMARK.KEY=VALUE, e.g. livecodebench.start_date=2023-05-01.",
    )
    @click.option("--dtype", default="auto", show_default=True, help="auto | float32 | bfloat16 | float16")
    @click.option(
        "--out",
        "out",
        type=click.Path(),
        default=None,
        help="Output directory (default: RUN/eval for a run, else ./eval/<target name>).",
    )
    @click.option("--no-cache", is_flag=True, help="Recompute even if cached results exist.")
    @click.option("--no-base", is_flag=True, help="Skip the bare base model (adapters and baseline only).")
    def eval_cmd(
        target: str | None,
        benchmarks: str,
        prefetch: str | None,
        check_gold: str | None,
        engine: str | None,
        engine_param: tuple[str, ...],
        executor: str,
        executor_param: tuple[str, ...],
        limit: int | None,
        n: int,
        temperature: float,
        top_p: float,
        ks: str,
        seed: int,
        max_tokens: int | None,
        math_template: str | None,
        base_math_template: str | None,
        code_template: str | None,
        timeout_s: float | None,
        baseline: str | None,
        base_model: str | None,
        roles: str,
        data: tuple[str, ...],
        eval_param: tuple[str, ...],
        dtype: str,
        out: str | None,
        no_cache: bool,
        no_base: bool,
    ) -> None:
        """Evaluate TARGET (run dir, adapter dir or base model) on the paper's benchmarks.

        \b
          populora eval runs/nano --benchmarks humaneval_plus,mbpp_plus --baseline runs/nano-single
          populora eval --prefetch humaneval_plus,gsm8k      # fetch and cache the data once, then offline
        """
        if prefetch:
            prefetch_data(prefetch, _kv(data, "--data"), _kv(eval_param, "--eval-param"))
            return
        if check_gold:
            reports = check_gold_data(
                check_gold,
                _kv(data, "--data"),
                _kv(eval_param, "--eval-param"),
                executor=executor,
                executor_params=_kv(executor_param, "--executor-param"),
                timeout_s=timeout_s,
                limit=limit,
                code_template=code_template,
                math_template=math_template,
            )
            if not all(r.ok for r in reports):
                raise SystemExit(1)
            return
        if not target:
            raise UserError(
                "populora eval needs a TARGET (run dir, adapter or base model), --prefetch or --check-gold BENCHMARKS"
            )
        run_eval(
            target=target,
            benchmarks=benchmarks,
            engine=engine,
            engine_params=_kv(engine_param, "--engine-param"),
            executor=executor,
            executor_params=_kv(executor_param, "--executor-param"),
            limit=limit,
            n=n,
            temperature=temperature,
            top_p=top_p,
            ks=ks,
            seed=seed,
            max_tokens=max_tokens,
            math_template=math_template,
            base_math_template=base_math_template,
            code_template=code_template,
            timeout_s=timeout_s,
            baseline=baseline,
            base_model=base_model,
            roles=roles,
            data=_kv(data, "--data"),
            eval_params=_kv(eval_param, "--eval-param"),
            dtype=dtype,
            out=out,
            no_cache=no_cache,
            no_base=no_base,
        )


def run_eval(
    *,
    target: str,
    benchmarks: str = "default",
    engine: str | None = None,
    engine_params: dict[str, Any] | None = None,
    executor: str = "sandbox",
    executor_params: dict[str, Any] | None = None,
    limit: int | None = None,
    n: int = 1,
    temperature: float = 0.0,
    top_p: float = 1.0,
    ks: str = "1",
    seed: int = 0,
    max_tokens: int | None = None,
    math_template: str | None = None,
    base_math_template: str | None = None,
    code_template: str | None = None,
    timeout_s: float | None = None,
    baseline: str | None = None,
    base_model: str | None = None,
    roles: str = "students",
    data: dict[str, str] | None = None,
    eval_params: dict[str, Any] | None = None,
    dtype: str = "auto",
    out: str | None = None,
    no_cache: bool = False,
    no_base: bool = False,
    quiet: bool = False,
) -> dict[str, Any]:
    """The ``populora eval`` command as a function (benchmarks and tests call it directly)."""
    from . import report
    from .runner import Evaluation, Settings
    from .target import resolve_target

    if n < 1:
        raise UserError("--n must be >= 1")
    if n > 1 and temperature == 0.0:
        raise UserError("--n > 1 with greedy decoding gives identical samples; set --temperature > 0")
    try:
        k_list = tuple(sorted({int(k) for k in ks.split(",") if k.strip()}))
    except ValueError:
        raise UserError(f"--k expects a comma list of integers, got {ks!r}") from None
    if not k_list or min(k_list) < 1 or max(k_list) > n:
        raise UserError(f"--k values must be between 1 and --n ({n}), got {ks!r}")
    resolved = resolve_target(
        target, base_model=base_model, roles=roles, baseline=baseline, dtype=dtype, include_base=not no_base
    )
    if benchmarks == "default":
        benchmarks = ",".join(resolved.base_model.eval_benchmarks) or "shipped"
        if not quiet:
            click.echo(f"benchmarks: {benchmarks} (this base's default; --benchmarks all: the paper's ten)", err=True)
    names = parse_benchmarks(benchmarks)
    data_paths = dict(((resolved.recipe.get("eval") or {}).get("data") or {}) if resolved.run_dir else {})
    data_paths = {
        k: str(
            (resolved.run_dir / v)
            if resolved.run_dir and not Path(v).is_absolute() and (resolved.run_dir / v).exists()
            else v
        )
        for k, v in data_paths.items()
        if k in names
    }
    data_paths.update(data or {})
    evaluators = build_evaluators(
        names,
        data_paths,
        math_template=math_template,
        code_template=code_template,
        max_tokens=max_tokens,
        timeout_s=timeout_s,
        eval_params=eval_params,
    )
    base_benches = {}
    math_names = [e.name for e in evaluators if e.category == "math"]
    if base_math_template and math_names:
        base_benches = {
            e.name: e
            for e in build_evaluators(
                math_names,
                {k: v for k, v in data_paths.items() if k in math_names},
                math_template=base_math_template,
                code_template=None,
                max_tokens=max_tokens,
                timeout_s=timeout_s,
                eval_params={k: v for k, v in (eval_params or {}).items() if k.split(".")[0] in math_names},
            )
        }
    if out is None:
        out_dir = (resolved.run_dir / "eval") if resolved.run_dir else Path("eval") / _stem(target)
    else:
        out_dir = Path(out)
    engine_name, engine_settings, engine_origin = engine_choice(resolved.recipe, engine, engine_params)
    settings = Settings(
        limit=limit,
        limits={name: count for name, count in names.items() if count is not None},
        n=n,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        ks=k_list,
        engine=engine_name,
        engine_params=engine_settings,
        engine_origin=engine_origin,
        executor=executor,
        executor_params=executor_params or {},
        use_cache=not no_cache,
    )
    results = Evaluation(resolved, evaluators, settings, out_dir, base_benches=base_benches).run()
    paths = report.write_all(results, out_dir)
    if not quiet:
        report.print_table(results)
        for note in results["notes"]:
            click.echo(f"note: {note}", err=True)
        click.echo(f"wrote {', '.join(str(p) for p in paths.values())}")
    return results


def _stem(target: str) -> str:
    name = Path(target.rstrip("/")).name or "model"
    return "".join(ch if ch.isalnum() or ch in "-_.@" else "_" for ch in name)
