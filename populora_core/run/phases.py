"""The phases of one step, each a function of what it reads that returns what it produced.

matchmaking -> teachers propose (every task type) -> validation in the executor -> matched students solve n
samples per valid problem (and AZR's buffer problems once) -> grading and rewards (a teacher's from its MATCHED
student's solve rate) -> rating updates -> one policy update per member -> the step's problems kept. The loop
(:mod:`.loop`) calls them in that order with the lifecycle hooks between; what a phase changes on members
(counters, ratings, versions) is on the population it is handed.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..api.components import Completion, GenerationRequest, Grade, Match, MatchOutcome, Problem, Rollout, UpdateJob
from ..api.errors import PluginError
from ..api.operators import count_matches
from ..api.population import Member, Population
from .assembly import Components
from .metrics import PhaseTimer, problem_records
from .proposals import Proposal


@dataclass
class Solved:
    """Graded answers per attempt (the student's rollouts, ``info["correct"]``), the requests the engine dropped
    by reason, and the (student id, problem signature) pairs the attempts covered."""

    answers: list[list[Rollout]] = field(default_factory=list)
    dropped: Counter[str] = field(default_factory=Counter)
    covered: list[tuple[str, str]] = field(default_factory=list)


def match(c: Components, population: Population, step: int) -> list[Match]:
    """Teacher -> student pairs: the matchmaker's, or each member with itself in a single-agent run. Exactly one
    match per teacher (the Matchmaker contract): a teacher's proposals go to one student and its reward is that
    student's rate."""
    if c.recipe.population.single_agent:
        return [Match(m.id, m.id, 0.5) for m in population.teachers]
    matches = c.matchmaker.pair(population.teachers, population.students, c.streams.rng(step, "match"))
    matchmaker = c.registry.get("matchmaker", c.recipe.matchmaker.name)
    check_one_match_per_teacher(matches, population, f"matchmaker {matchmaker.name!r} (plugin {matchmaker.plugin})")
    return matches


def check_hooked_matches(matches: Sequence[Match], population: Population, hook: Any) -> None:
    """The one-match rule again after the ``after_matchmaking`` hook (``hook``: its caller), which may replace
    entries: a hookimpl that breaks it is a :class:`PluginError` naming the hook and the plugins implementing it."""
    plugins = sorted({impl.plugin_name for impl in hook.get_hookimpls()})
    if plugins:
        where = f"hook after_matchmaking (plugin{'s' if len(plugins) > 1 else ''} {', '.join(plugins)})"
        check_one_match_per_teacher(matches, population, where)


def check_one_match_per_teacher(matches: Sequence[Match], population: Population, where: str) -> None:
    """Matches that give a teacher two matches or none, or pair a non-teacher or non-student, are a
    :class:`PluginError` naming ``where`` they came from and the member: the loop would otherwise drop a match or
    fail on a key."""
    teachers = {m.id for m in population.teachers}
    students = {m.id for m in population.students}
    count = Counter(m.teacher for m in matches)
    for match_ in matches:
        if match_.teacher not in teachers:
            raise PluginError(f"{where} matched {match_.teacher!r}, which is not a teacher")
        if match_.student not in students:
            raise PluginError(f"{where} matched teacher {match_.teacher!r} with {match_.student!r}, not a student")
    for teacher in sorted(teachers):
        if count[teacher] != 1:
            what = "no match" if not count[teacher] else f"{count[teacher]} matches"
            raise PluginError(f"{where} gave teacher {teacher!r} {what}; the contract is exactly one match per teacher")


def propose(c: Components, population: Population, step: int, timer: PhaseTimer) -> tuple[list[Proposal], Counter[str]]:
    """Every teacher's proposals for every task type, generated in one call and validated per task; with the
    requests the engine dropped, by reason."""
    cfg = c.recipe.rollout
    with timer("prompts"):
        proposals, requests = [], []
        for task_name, task in c.tasks.items():
            rng = c.streams.rng(step, f"propose/{task_name}")
            for teacher in population.teachers:
                for prompt, ctx in task.proposer_prompts(cfg.proposals_per_teacher, rng):
                    requests.append(GenerationRequest(prompt, c.adapter_ref(teacher)))
                    proposals.append(Proposal(task_name, teacher, ctx))
    with timer("generate_propose"):
        sampling = c.sampling(step, "sample/propose", n=1, max_tokens=cfg.propose_max_tokens, logprobs=True)
        completions = [completion for (completion,) in c.engine.generate(requests, sampling)]
    dropped: Counter[str] = Counter()
    with timer("validate"):
        problems = c.parse_proposals(
            [completion.text for completion in completions],
            [p.task for p in proposals],
            [p.ctx for p in proposals],
            [p.teacher.version_name for p in proposals],
        )
        for proposal, completion, problem in zip(proposals, completions, problems):
            if completion.dropped:
                problem.valid, problem.error = False, f"not generated: {completion.finish_reason}"
                dropped[completion.finish_reason] += 1
            proposal.completion, proposal.problem = completion, problem
    return proposals, dropped


def solve(
    c: Components,
    attempts: Sequence[tuple[str, Member, Problem]],
    step: int,
    stream: str,
    *,
    n: int,
    timer: PhaseTimer | None = None,
    phase: str = "generate_solve",
) -> Solved:
    """Each ``(task name, student, problem)``: ``n`` sampled answers of the student, graded by the task, per
    attempt in order; counts the student's tokens. ``stream`` names the sampling seed's phase."""
    solved = Solved()
    if not attempts:
        return solved
    timer = timer or PhaseTimer()
    with timer("prompts"):
        requests = [
            GenerationRequest(c.tasks[task_name].solver_prompt(problem), c.adapter_ref(student))
            for task_name, student, problem in attempts
        ]
    with timer(phase):
        sampling = c.sampling(step, stream, n=n, max_tokens=c.recipe.rollout.solve_max_tokens)
        answers = c.engine.generate(requests, sampling)
    with timer("grade"):
        kept = []
        for completions in answers:
            solved.dropped.update(completion.finish_reason for completion in completions if completion.dropped)
            kept.append([completion for completion in completions if not completion.dropped])
        grades = _grade_answers(c, attempts, kept)
        for (task_name, student, problem), completions, grades_of in zip(attempts, kept, grades, strict=True):
            student.counters.tokens += sum(len(x.token_ids) for x in completions)
            solved.covered.append((student.id, problem.signature))
            solved.answers.append(
                [
                    Rollout.of(student.id, f"{task_name}/solve", x, g.reward, correct=g.correct)
                    for x, g in zip(completions, grades_of)
                ]
            )
    return solved


def _grade_answers(
    c: Components, attempts: Sequence[tuple[str, Member, Problem]], kept: list[list[Completion]]
) -> list[list[Grade]]:
    """Each attempt's grades; one ``grade_many`` call per task, so a task checks a step's answers in one batch (an
    attempt whose answers were all dropped has none)."""
    grades = c.per_task(
        [task_name if kept[k] else None for k, (task_name, _, _) in enumerate(attempts)],
        lambda task, idx: task.grade_many([(attempts[k][2], [x.text for x in kept[k]]) for k in idx]),
    )
    return [grades_of or [] for grades_of in grades]


def solve_proposals(
    c: Components, population: Population, proposals: list[Proposal], matches: list[Match], step: int, timer: PhaseTimer
) -> Solved:
    """The matched student of each valid proposal's teacher answers it ``rollout.solver_samples`` times."""
    student_of = {m.teacher: m.student for m in matches}
    attempts = [
        (p.task, population.members[student_of[p.teacher.id]], p.problem)
        for p in proposals
        if p.valid and p.problem is not None
    ]
    return solve(c, attempts, step, "sample/solve", n=c.recipe.rollout.solver_samples, timer=timer)


def solve_own_proposals(
    c: Components, population: Population, proposals: list[Proposal], step: int, timer: PhaseTimer
) -> list[float | None]:
    """Cross-evaluation off (``population.cross_evaluation: false``): each teacher answers its own valid proposals
    ``rollout.solver_samples`` times; per valid proposal, in order, the share it got right (None when every answer
    was dropped). These answers train nobody: they only set the teacher's reward."""
    attempts = [(p.task, p.teacher, p.problem) for p in proposals if p.valid and p.problem is not None]
    own = solve(c, attempts, step, "sample/self", n=c.recipe.rollout.solver_samples, timer=timer)
    return [sum(r.info["correct"] for r in scored) / len(scored) if scored else None for scored in own.answers]


def solve_buffer(c: Components, population: Population, step: int, timer: PhaseTimer) -> Solved:
    """AZR's solver batch: buffer problems each student solves once (trained, not estimating)."""
    k = c.recipe.rollout.buffer_problems_per_student
    if not k:
        return Solved()
    attempts = []
    for task_name, task in c.tasks.items():
        for student in population.students:
            rng = c.streams.rng(step, f"buffer/{task_name}/{student.id}")
            attempts += [(task_name, student, problem) for problem in task.sample_problems(k, rng)]
    solved = solve(c, attempts, step, "sample/buffer", n=1, timer=timer, phase="generate_buffer")
    for answers in solved.answers:
        for rollout in answers:
            rollout.info["buffer"] = True
    return solved


def grade(
    c: Components,
    population: Population,
    proposals: list[Proposal],
    matches: list[Match],
    solved: Solved,
    own_rates: Sequence[float | None] | None = None,
) -> list[Rollout]:
    """Students' solve rates and rollouts, then each teacher's reward from its matched student's rate (from its own,
    ``own_rates`` per valid proposal, when cross-evaluation is off)."""
    student_of = {m.teacher: m.student for m in matches}
    rollouts: list[Rollout] = []
    valid = [(i, p) for i, p in enumerate(proposals) if p.valid]
    teacher_rate: dict[int, float | None] = {}
    for k, ((i, proposal), scored) in enumerate(zip(valid, solved.answers, strict=True)):
        # None when every answer was dropped: the teacher is rewarded as for an unusable problem
        proposal.solve_rate = sum(r.info["correct"] for r in scored) / len(scored) if scored else None
        population.members[student_of[proposal.teacher.id]].counters.estimation_rollouts += len(scored)
        teacher_rate[i] = proposal.solve_rate if own_rates is None else own_rates[k]
        if c.recipe.rollout.train_on_estimation:
            for r in scored:
                r.info["problem"] = i
            rollouts += scored
    for i, p in enumerate(proposals):
        assert p.problem is not None and p.completion is not None
        if p.completion.dropped:
            continue
        p.teacher.counters.tokens += len(p.completion.token_ids)
        reward = c.tasks[p.task].proposer_reward(p.problem, teacher_rate.get(i) if p.valid else None)
        rollouts.append(Rollout.of(p.teacher.id, f"{p.task}/propose", p.completion, reward, valid=p.valid, problem=i))
    return rollouts


def rate(c: Components, population: Population, matches: list[Match], proposals: list[Proposal]) -> list[MatchOutcome]:
    """Each match's outcome (the student's mean solve rate over its teacher's problems, and the rate of each
    proposal the teacher generated, None where it gave no usable problem); the matchmaker updates the ratings from
    them (a single-agent run keeps none)."""
    outcomes = []
    for m in matches:
        per_problem = [
            p.solve_rate if p.valid else None
            for p in proposals
            if p.teacher.id == m.teacher and p.completion is not None and not p.completion.dropped
        ]
        rates = [r for r in per_problem if r is not None]
        mean = statistics.fmean(rates) if rates else None
        outcomes.append(MatchOutcome(m.teacher, m.student, mean, m.expected_solve_rate, per_problem))
    if not c.recipe.population.single_agent:
        c.matchmaker.update_ratings(outcomes, population.members)
        count_matches(population.members, outcomes)
    return outcomes


def train(c: Components, population: Population, rollouts: list[Rollout]) -> dict[str, dict[str, Any]]:
    """One policy update per member that has rollouts; each writes the member's next version. Returns the
    update statistics per member id. The trainer gets the step's updates at once (``update_many``: a cluster runs
    them in parallel; the Protocol's default one member at a time)."""
    jobs: list[tuple[Member, UpdateJob]] = []
    for member in list(population.members.values()):
        own = [r for r in rollouts if r.member_id == member.id]
        if not own:
            continue
        parent = c.adapter_ref(member)
        member.version += 1
        jobs.append((member, UpdateJob(member.id, parent, own, c.run_dir.adapter_path(member.version_name))))
    results = c.trainer.update_many([job for _, job in jobs])
    stats: dict[str, dict[str, Any]] = {}
    for (member, job), result in zip(jobs, results, strict=True):
        member.counters.rollouts += len(job.rollouts)
        member.counters.trained_tokens += sum(len(r.completion_token_ids) for r in job.rollouts)
        member.counters.updates += 1
        stats[member.id] = asdict(result)
    return stats


def keep_problems(c: Components, proposals: list[Proposal], matches: list[Match], step: int) -> None:
    """Valid problems join their task's buffer; every proposal is recorded in ``tasks/problems.jsonl``."""
    for task_name, task in c.tasks.items():
        task.add_to_buffer([p.problem for p in proposals if p.task == task_name and p.valid and p.problem is not None])
    student_of = {m.teacher: m for m in matches}
    c.run_dir.append("tasks/problems.jsonl", problem_records(step, proposals, student_of, c.tasks))
