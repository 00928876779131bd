"""The recipe's typed schema: one pydantic model per section (unknown keys are errors), :class:`Recipe` the whole.

Reading a recipe file (overrides, both validation passes) is :func:`populora_core.recipe.validate.load_recipe`;
what a hook sees of the recipe is this model (``run.recipe``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from .components import LoraSettings
from .population import BETA

Role = Literal["teacher", "student", "both"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ComponentRef(_Strict):
    """A component by registered name (or ``package.module:attr``) plus its params."""

    name: str
    params: dict[str, Any] = Field(default_factory=dict)
    _parsed: Any = PrivateAttr(default=None)  # the plugin's params model, set when the registry validated it

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value

    def build_params(self) -> Any:
        """What the factory receives: the params parsed when the recipe was validated (parsed once, the same
        object a Ray worker gets), else the raw dict for a recipe read without a registry."""
        return self._parsed if self._parsed is not None else self.params


class WeightedOperator(ComponentRef):
    weight: float = Field(1.0, gt=0)


class PopulationSection(_Strict):
    teachers: int = Field(4, ge=1, description="adapters that propose problems")
    students: int = Field(4, ge=1, description="adapters that solve them (single_agent: unused, a teacher solves)")
    mode: Literal["population", "single_agent"] = Field(
        "population", description="single_agent: one adapter per slot plays both roles (AZR baseline)"
    )
    init_from: str | None = Field(
        None,
        description="start from existing adapters instead of fresh ones: a run directory (each role from that run's "
        "current members of the role, in turn) or a folder of PEFT adapter folders (all members, in turn); they "
        "must have the recipe's lora rank, alpha and target modules (`populora run --init-from`)",
    )

    cross_evaluation: bool = Field(
        True,
        description="a teacher's reward is the learnability of its MATCHED student's solve rate; false (an ablation): "
        "of its own, each teacher solving its valid proposals rollout.solver_samples times untrained, as the "
        "single agent does (students still solve and train on them)",
    )

    @property
    def single_agent(self) -> bool:
        """The AZR baseline: each adapter plays both roles, is matched with itself and never evolves. Every part
        of the run asks this, and only this, whether it is one."""
        return self.mode == "single_agent"

    @property
    def adapters(self) -> int:
        """Adapters the run trains: one per slot in a single-agent run, a teacher's and a student's otherwise."""
        return self.teachers if self.single_agent else self.teachers + self.students

    @model_validator(mode="after")
    def _single_agent_shape(self) -> PopulationSection:
        if self.single_agent and self.teachers != self.students:
            raise ValueError("single_agent mode needs teachers == students (one adapter plays both roles)")
        if self.single_agent and not self.cross_evaluation:
            raise ValueError("cross_evaluation: false is a population ablation; a single agent is its own student")
        return self


class RolloutSection(_Strict):
    """How much each member generates per step (AZR values in recipes/azr_7b.yaml)."""

    proposals_per_teacher: int = Field(8, ge=1, description="proposer prompts per teacher per task type")
    solver_samples: int = Field(8, ge=1, description="samples of the matched student per valid problem (AZR n=8)")
    buffer_problems_per_student: int = Field(
        0, ge=0, description="extra problems per task type from the buffer, solved once (AZR's solver batch)"
    )
    train_on_estimation: bool = Field(
        True, description="[choice] students train on the solve samples that estimate learnability"
    )
    temperature: float = Field(1.0, ge=0, description="sampling temperature of proposals and answers")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling of proposals and answers (1: off)")
    propose_max_tokens: int = Field(512, ge=1, description="longest proposal a teacher may generate")
    solve_max_tokens: int = Field(512, ge=1, description="longest answer a student may generate")
    max_prompt_tokens: int | None = Field(
        None,
        ge=1,
        description="prompts longer than this are not generated for (AZR's max_prompt_length): dropped "
        "deterministically, trained on by nobody, counted in the step metrics; None: no limit",
    )


class EvolutionSection(_Strict):
    every: int = Field(20, ge=0, description="replace every E steps; 0 disables evolution")
    selector: ComponentRef = Field(
        default_factory=lambda: ComponentRef(name="truncation"),
        description="who is replaced and who breeds, per sub-population (`populora keys evolution.selector`)",
    )
    operators: list[WeightedOperator] = Field(
        default_factory=lambda: [
            WeightedOperator(name="svd", weight=0.5),
            WeightedOperator(name="svd_structured", weight=0.5),
        ],
        description="LoRA weight-space operators a child is made with, drawn by weight among those that fit its "
        "parents (`populora keys evolution.operators`)",
    )
    child_rating: Literal["widen", "fresh", "inherit"] = Field(
        "widen",
        description="a child's first rating. widen: its parents' mean mu and mean sigma widened by child_sigma, so "
        "it starts where its parents stand but uncertain, and ready_after protects it until its own matches have "
        "narrowed it; inherit: its first parent's mu and sigma (the parent's certainty: child against veteran is "
        "then decided by noise); fresh: the rating prior, whose large sigma ranks every child last under "
        "mu - k*sigma (the youngest is then always the one replaced)",
    )
    child_sigma: float = Field(
        BETA,
        ge=0,
        description="with child_rating: widen, the uncertainty a child adds to its parents' sigma (in quadrature, "
        "capped at the matchmaker's prior sigma, 25/3 by default); default: TrueSkill's beta, one performance spread",
    )
    child_optimizer: Literal["fresh", "inherit"] = Field(
        "fresh", description="fresh: a child starts with no AdamW moments; inherit: a copy of its first parent's"
    )
    ready_after: int | None = Field(
        None,
        ge=0,
        description="PBT readiness: a member can be replaced only once it has played this many rated matches "
        "(a teacher plays one a step, a student one per teacher that drew it); None: twice the interval `every`, "
        "so a child sits out the first selection after its birth",
    )
    subpopulations: list[Role] = Field(
        default_factory=lambda: list[Role](["teacher", "student"]),
        description="the roles evolution selects within (each separately: teachers replace teachers)",
    )

    @property
    def readiness(self) -> int:
        """Rated matches a member must have played before selection may replace it."""
        return 2 * self.every if self.ready_after is None else self.ready_after


class CheckpointSection(_Strict):
    every: int = Field(10, ge=1, description="a complete checkpoint every N steps (and after the last)")
    keep: int = Field(2, ge=1, description="complete checkpoints kept on disk")
    stop_grace_s: float = Field(
        0.0,
        ge=0,
        description="on SIGTERM or SIGUSR1 (a scheduler's stop), the seconds the step in progress may take to "
        "finish before the stop checkpoints it (by the last step's duration; a step that has not begun to train "
        "when they run out is ended); 0: a step that has not begun to train is ended at once and the step before it "
        "checkpointed. Leave the scheduler's grace period minus a checkpoint's write time",
    )


class AdaptersSection(_Strict):
    """Which adapter versions stay on disk (each is a full fp32 PEFT directory: 323 MB at 7B rank 32)."""

    keep: Literal["all", "needed", "last"] = Field(
        "all",
        description="all: every version; needed: the living members' versions, every version a kept checkpoint "
        "restores, and the initial ones; last: 'needed' plus each member's last `last` versions",
    )
    last: int = Field(2, ge=1, description="with keep: last, versions kept per member besides the needed ones")


class ProbeSection(_Strict):
    """Held-out probe evaluation: greedy solver accuracy of every student (and the base) per task type, and with
    ``samples`` the per-sample accuracy of k answers at ``temperature`` beside it (every answer counts, so a
    problem gives k looks at a model instead of one)."""

    enabled: bool = Field(False, description="evaluate the probe set (probe.jsonl in the run directory)")
    every: int = Field(0, ge=0, description="also every N steps; 0: only before the first and after the last step")
    file: str = Field("", description="JSONL of Problem records; empty: the probe set shipped with the base model")
    problems_per_type: int | None = Field(
        None,
        ge=1,
        description="first N distinct problems of each task type (more than the file holds: an error); "
        "unset: all of them",
    )
    samples: int | None = Field(
        None,
        ge=1,
        description="also sample k answers per problem at temperature (per-sample accuracy); unset: greedy only",
    )
    temperature: float = Field(1.0, gt=0.0, description="sampling temperature of the probe's k answers")
    max_tokens: int = Field(256, ge=1, description="longest greedy answer per probe problem")


class SeedsSection(_Strict):
    """AZR's seed buffers: problems the base model proposed before training (``populora seed``).

    Without them every buffer starts from AZR's zero triplet alone and the first references teachers see are
    their own early proposals; AZR ships 256 per model (``azr.seed_dataset``).
    """

    enabled: bool = Field(False, description="fill each task's buffer with seed problems before step 1")
    file: str = Field("", description="JSONL of Problem records, e.g. written by populora seed")

    @model_validator(mode="after")
    def _file_when_enabled(self) -> SeedsSection:
        if self.enabled and not self.file:
            raise ValueError(
                "seeds.enabled is true but seeds.file is empty (make one with: populora seed RECIPE --out FILE)"
            )
        return self


class EvalSection(_Strict):
    """Defaults for ``populora eval RUN_DIR``: local data files of benchmarks that ship no data."""

    data: dict[str, str] = Field(
        default_factory=dict, description="benchmark name -> local file or directory (HumanEval+, LiveCodeBench, ...)"
    )


class RuntimeSection(_Strict):
    """Process settings (populora_core/services/runtime.py): ``cpu_isa`` applied by the ``populora`` command
    before torch loads, ``threads`` by ``start_run``/``resume_run`` (a run started from Python gets it too)."""

    cpu_isa: Literal["native", "avx2"] = Field(
        "native",
        description="[choice] avx2: torch, MKL and oneDNN take their AVX2 code paths on every x86 CPU, so a seed "
        "reproduces across CPUs (an AVX-512 box computes what an AVX2 box does); native: each library uses the "
        "CPU's widest instructions (results differ between CPUs). No effect on GPU kernels",
    )
    threads: int | None = Field(
        None,
        ge=1,
        description="torch's CPU threads in this process, and OMP/MKL threads in the processes it starts; set once "
        "at start, by the core only (results on the CPU depend on it). None: the environment's OMP_NUM_THREADS, "
        "else torch's default (the cores). 1 where an engine's parallel_batches or a trainer's parallel_updates "
        "spreads work over cores in threads of its own",
    )


#: The built-in cluster: today's single process, no cluster component (engine and trainer in the driver).
LOCAL_CLUSTER = "local"


class Recipe(_Strict):
    name: str = Field(
        description="the run's name (the default run directory is runs/<name>): letters, digits, '.', '_', '-', "
        "starting with a letter or digit"
    )
    seed: int = Field(0, description="every random draw of the run derives from it (populora_core.api.rng)")
    steps: int = Field(ge=1, description="co-evolution steps to run")
    base_model: ComponentRef = Field(
        description="the frozen base: a registered name (nano), a local directory or a hub id (org/name)"
    )
    lora: LoraSettings = Field(default_factory=LoraSettings)
    population: PopulationSection = Field(default_factory=PopulationSection)
    tasks: list[ComponentRef] = Field(
        default_factory=lambda: [ComponentRef(name=n) for n in ("deduction", "abduction", "induction")],
        min_length=1,
        description="the task types teachers propose and students solve (AZR's three)",
    )
    executor: ComponentRef = Field(
        default_factory=lambda: ComponentRef(name="sandbox"), description="runs model-written programs"
    )
    engine: ComponentRef = Field(
        default_factory=lambda: ComponentRef(name="hf"), description="generates proposals and answers"
    )
    trainer: ComponentRef = Field(
        default_factory=lambda: ComponentRef(name="trr++"), description="one policy update per member and step"
    )
    matchmaker: ComponentRef = Field(
        default_factory=lambda: ComponentRef(name="pfsp"), description="pairs teachers with students; keeps ratings"
    )
    rollout: RolloutSection = Field(default_factory=RolloutSection)
    evolution: EvolutionSection = Field(default_factory=EvolutionSection)
    sinks: list[ComponentRef] = Field(
        default_factory=list, description="metric sinks besides events.jsonl (tensorboard, wandb)"
    )
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection)
    adapters: AdaptersSection = Field(default_factory=AdaptersSection)
    seeds: SeedsSection = Field(default_factory=SeedsSection)
    probe: ProbeSection = Field(default_factory=ProbeSection)
    eval: EvalSection = Field(default_factory=EvalSection)
    runtime: RuntimeSection = Field(default_factory=RuntimeSection)
    cluster: ComponentRef = Field(
        default_factory=lambda: ComponentRef(name=LOCAL_CLUSTER),
        description="where the engine and the trainer run: local (this process) or a registered cluster (ray)",
    )

    @field_validator("name")
    @classmethod
    def _name_stays_in_runs(cls, name: str) -> str:
        from .names import SAFE_NAME

        if SAFE_NAME.fullmatch(name) is None:
            raise ValueError(
                f"{name!r} is not a safe run name: letters, digits, '.', '_', '-', starting with a letter or digit "
                "(it names the folder runs/<name>; --run-dir chooses any other place)"
            )
        return name

    @model_validator(mode="after")
    def _local_cluster_takes_no_params(self) -> Recipe:
        if self.cluster.name == LOCAL_CLUSTER and self.cluster.params:
            raise ValueError("cluster 'local' (this process) takes no params; name a cluster such as ray")
        return self

    def component_refs(self) -> list[tuple[str, str, ComponentRef]]:
        """(yaml path, kind, ref) of every component the recipe names."""
        refs: list[tuple[str, str, ComponentRef]] = [
            ("base_model", "base_model", self.base_model),
            ("executor", "executor", self.executor),
            ("engine", "engine", self.engine),
            ("trainer", "trainer", self.trainer),
            ("matchmaker", "matchmaker", self.matchmaker),
        ]
        if self.cluster.name != LOCAL_CLUSTER:
            refs.append(("cluster", "cluster", self.cluster))
        refs += [(f"tasks.{i}", "task", ref) for i, ref in enumerate(self.tasks)]
        refs += [(f"sinks.{i}", "sink", ref) for i, ref in enumerate(self.sinks)]
        if self.evolution.every:
            refs.append(("evolution.selector", "selector", self.evolution.selector))
            refs += [(f"evolution.operators.{i}", "operator", ref) for i, ref in enumerate(self.evolution.operators)]
        return refs
