"""The registry of metric names: every name the trainers log (metrics.jsonl, TensorBoard, MLflow) and the service
reads (health rules, the worker, the API, the dashboard, the benchmarks), with what each is and how it is charted.

A metric's name is spelled here and nowhere else in the product: producers and consumers import the constants, so a
rename cannot blank a chart or silence a health rule unnoticed (tests/aligner/test_metrics.py pins the names users
see, and checks that a training run logs nothing this module does not hold). Plain Python with no imports beyond
the standard library: the worker and the dashboard load it without torch. The metrics themselves:
docs/training.md#metrics-and-samples.
"""

from __future__ import annotations

from dataclasses import dataclass

# A mismatch KL (k3, per token) above this makes the rollout correction worth switching on. A judgement, not a
# measured boundary: k3 ~ d^2 / 2, so 1e-3 is a per-token log ratio of ~0.045 rms, and a 500-token response's
# summed log ratio then spreads by ~1 (a factor e in its sequence ratio): the engine's samples are no longer the
# trainer's policy's (docs/training.md, "Rollout correction").
MISMATCH_KL_WORTH_CORRECTING = 1e-3

# Which trainer logs a metric.
REINFORCE, PPO, REWARD_MODEL = "reinforce", "ppo", "reward_model"
POLICY_TRAINERS = (REINFORCE, PPO)

# The groups (the slash groups the charts in TensorBoard and MLflow).
ROLLOUTS_PREFIX = "train_rollouts/"
OPTIM_PREFIX = "train_optim/"
VAL_PREFIX = "val/"
TIMERS_PREFIX = "timers/"
THROUGHPUT_PREFIX = "throughput/"
MEMORY_PREFIX = "memory/"
# The families measured of the machine: two runs of one config (resumed, on another number of ranks) differ in them.
MACHINE_PREFIXES = (TIMERS_PREFIX, THROUGHPUT_PREFIX, MEMORY_PREFIX)
RM_TRAIN_PREFIX = "train/"

# ------------------------------------------------------------------------------------------------- the names
# Rollouts (REINFORCE and PPO): means over the step's samples.
TRAIN_REWARD = "train_rollouts/rewards"
TRAIN_REWARD_WITH_KL = "train_rollouts/rewards_with_kl"
TRAIN_REWARD_WITH_KL_SUM = "train_rollouts/rewards_with_kl_sum"
INIT_POLICY_KL = "train_rollouts/init_policy_kl"
BASELINE = "train_rollouts/baseline"
TRAIN_RESPONSE_LENGTH = "train_rollouts/response_lengths"
TRAIN_PROPERLY_ENDED = "train_rollouts/fraction_of_samples_properly_ended"
# The policy's per-token entropy, estimated from the sampled tokens (-log pi(y_t)): no logits needed.
ROLLOUT_ENTROPY = "train_rollouts/entropy"
# Engine against trainer log-probs of the sampled tokens (aligner/algorithms/rollout_correction.py).
MISMATCH_KL = "train_rollouts/mismatch_kl"
MISMATCH_PPL_RATIO = "train_rollouts/mismatch_ppl_ratio"
ROLLOUT_CORRECTED = "train_rollouts/rollout_corrected"  # share truncated (tis) or masked (mis)
# reinforce.dynamic_sampling and the overlong penalty (DAPO)
DROPPED_GROUPS = "train_rollouts/dropped_groups"
SAMPLING_ROUNDS = "train_rollouts/sampling_rounds"
OVERLONG_PENALTY = "train_rollouts/overlong_penalty"
# Optimisation
LOSS = "train_optim/loss"
GRAD_NORM = "train_optim/grad_norm"
LR = "train_optim/lr"
IMPORTANCE_WEIGHT = "train_optim/importance_weight"
IMPORTANCE_WEIGHT_CAPPED = "train_optim/importance_weight_capped"
# The ratio to the rollout's policy (reinforce.policy_loss clip / cispo): its statistics and the clipped shares
RATIO_MEAN = "train_optim/ratio_mean"
RATIO_MIN = "train_optim/ratio_min"
RATIO_MAX = "train_optim/ratio_max"
CLIP_FRACTION_LOW = "train_optim/clip_fraction_low"
CLIP_FRACTION_HIGH = "train_optim/clip_fraction_high"
# Validation; each gold reward of `validation.extra_rewards` as GOLD_REWARD_PREFIX + its name
VAL_REWARD = "val/rewards"
VAL_RESPONSE_LENGTH = "val/response_lengths"
VAL_PROPERLY_ENDED = "val/fraction_of_samples_properly_ended"
# validation.num_samples_per_prompt (k) samples a prompt: the names are literal ("k", not its value).
VAL_PASS_AT_1 = "val/pass@1"
VAL_PASS_AT_K = "val/pass@k"
VAL_MEAN_AT_K = "val/mean@k"
GOLD_REWARD_PREFIX = "val/extra_rewards/"
# PPO and its critic (the critic server trains and answers; the PPO trainer logs)
VALUES = "train_rollouts/values"
RETURNS = "train_rollouts/returns"
CRITIC_LOSS = "train_optim/critic_loss"
CRITIC_WARMUP = "train_optim/critic_warmup"
CLIP_FRACTION = "train_optim/clip_fraction"
ENTROPY = "train_optim/entropy"
# Diagnostics of the rollouts (aligner/algorithms/diagnostics.py)
REWARD_LENGTH_CORR = "train_rollouts/reward_length_corr"
ZERO_SPREAD_GROUPS = "train_rollouts/frac_zero_std_groups"
# Throughput (NeMo-RL's definition)
TOKENS_PER_S = "throughput/tokens_per_s"
SAMPLES_PER_S = "throughput/samples_per_s"
# Timers: wall-clock seconds of a step by phase, and of the whole step (its slowest rank's)
TIMER_GENERATE = "timers/generate"
TIMER_GENERATE_WAIT = "timers/generate_wait"
TIMER_LOGPROBS = "timers/logprobs"
TIMER_INIT_LOGPROBS = "timers/init_logprobs"
TIMER_REWARD = "timers/reward"
TIMER_CRITIC_INFER = "timers/critic_infer"
TIMER_TRAIN = "timers/train"
TIMER_CRITIC_TRAIN = "timers/critic_train"
TIMER_REFIT = "timers/refit"
TIMER_VALIDATE = "timers/validate"
TIMER_STEP = "timers/step"
TIMER_WALL = "timers/wall"
MEMORY_PEAK = "memory/peak_gb"
MEMORY_REFIT_PEAK = "memory/refit_peak_gb"
# The reward-model trainer (aligner/trainers/reward_model.py)
RM_TRAIN_LOSS = "train/loss"
RM_TRAIN_ACCURACY = "train/accuracy"
RM_TRAIN_MARGIN = "train/margin"
RM_TRAIN_GRAD_NORM = "train/grad_norm"
RM_TRAIN_LR = "train/lr"
RM_VAL_LOSS = "val/loss"
RM_VAL_ACCURACY = "val/accuracy"
RM_VAL_MARGIN = "val/margin"


# ------------------------------------------------------------------------------------------------- the specs
@dataclass(frozen=True)
class MetricSpec:
    name: str  # as metrics.jsonl, TensorBoard, MLflow, the API and the dashboard spell it
    title: str  # what it is, in words
    unit: str  # of its values: the y-axis title of its chart
    by: tuple[str, ...]  # the trainers that log it
    chart: str | None = None  # the Job page chart that draws it (CHART_ORDER), None: none
    log: bool = False  # its chart may use a log y axis (when the user asks and every value is > 0)
    compare: bool = False  # offered on the Compare tab


@dataclass(frozen=True)
class Chart:
    """A Job page chart: its metrics in legend order, sharing the y axis's title (`unit`) and log hint."""

    title: str
    unit: str
    log: bool
    metrics: tuple[str, ...]


# The Job page's charts, in page order.
CHART_ORDER = (
    "Reward",
    "Reward with KL penalty",
    "KL to the initial policy",
    "Loss",
    "Grad norm",
    "Response length",
    "Fraction properly ended",
    "Reward-length correlation",
    "Groups with zero reward spread",
    "Pass@k",
    "Critic loss",
    "Value estimates",
    "Clip fraction",
    "Importance ratio",
    "Engine-trainer mismatch",
    "Entropy",
    "Throughput: tokens",
    "Throughput: samples",
    "Time per step",
)


def _timer(name: str, phase: str, by: tuple[str, ...] = POLICY_TRAINERS) -> MetricSpec:
    return MetricSpec(name, f"seconds of the step spent {phase}", "seconds", by, chart="Time per step")


# Every metric, in the order of the Compare tab's list and of each chart's legend.
_SPECS = (
    MetricSpec(TRAIN_REWARD, "train reward", "reward", POLICY_TRAINERS, chart="Reward", compare=True),
    MetricSpec(
        TRAIN_REWARD_WITH_KL,
        "train reward less the KL penalty (PPO: each sample's per-token rewards averaged over its tokens)",
        "reward - beta KL",
        POLICY_TRAINERS,
        chart="Reward with KL penalty",
        compare=True,
    ),
    MetricSpec(TRAIN_REWARD_WITH_KL_SUM, "reward less the summed per-token KL penalty", "reward - beta KL", (PPO,)),
    MetricSpec(
        INIT_POLICY_KL,
        "KL to the initial policy, per token",
        "KL",
        POLICY_TRAINERS,
        chart="KL to the initial policy",
        log=True,
        compare=True,
    ),
    MetricSpec(BASELINE, "the REINFORCE baseline, mean over the samples", "reward", (REINFORCE,)),
    MetricSpec(
        TRAIN_RESPONSE_LENGTH,
        "train response length",
        "tokens",
        POLICY_TRAINERS,
        chart="Response length",
        compare=True,
    ),
    MetricSpec(
        TRAIN_PROPERLY_ENDED,
        "share of train responses that ended with an end-of-sequence token",
        "fraction",
        POLICY_TRAINERS,
        chart="Fraction properly ended",
        compare=True,
    ),
    MetricSpec(LOSS, "policy loss", "loss", POLICY_TRAINERS, chart="Loss", log=True, compare=True),
    MetricSpec(
        GRAD_NORM, "gradient norm before clipping", "grad norm", POLICY_TRAINERS, chart="Grad norm", compare=True
    ),
    MetricSpec(LR, "learning rate", "learning rate", POLICY_TRAINERS, compare=True),
    MetricSpec(IMPORTANCE_WEIGHT, "mean per-token importance weight (async rollouts)", "weight", (REINFORCE,)),
    MetricSpec(
        IMPORTANCE_WEIGHT_CAPPED, "share of tokens whose importance weight was capped", "fraction", (REINFORCE,)
    ),
    MetricSpec(VAL_REWARD, "validation reward", "reward", POLICY_TRAINERS, chart="Reward", compare=True),
    MetricSpec(VAL_RESPONSE_LENGTH, "validation response length", "tokens", POLICY_TRAINERS, chart="Response length"),
    MetricSpec(
        VAL_PROPERLY_ENDED,
        "share of validation responses that ended with an end-of-sequence token",
        "fraction",
        POLICY_TRAINERS,
        chart="Fraction properly ended",
    ),
    MetricSpec(
        VAL_PASS_AT_1,
        "validation pass@1: a prompt's share of samples whose reward reaches validation.pass_threshold, mean",
        "fraction of prompts",
        POLICY_TRAINERS,
        chart="Pass@k",
        compare=True,
    ),
    MetricSpec(
        VAL_PASS_AT_K,
        "validation pass@k (k = validation.num_samples_per_prompt): a prompt with a passing sample, mean",
        "fraction of prompts",
        POLICY_TRAINERS,
        chart="Pass@k",
        compare=True,
    ),
    MetricSpec(
        VAL_MEAN_AT_K,
        "validation mean@k: a prompt's mean reward over its k samples, mean",
        "reward",
        POLICY_TRAINERS,
        compare=True,
    ),
    MetricSpec(
        VALUES, "critic's value estimates, mean over tokens", "value", (PPO,), chart="Value estimates", compare=True
    ),
    MetricSpec(RETURNS, "GAE returns, mean over tokens", "value", (PPO,)),
    MetricSpec(CRITIC_LOSS, "critic loss", "loss", (PPO,), chart="Critic loss", log=True, compare=True),
    MetricSpec(CRITIC_WARMUP, "1 on a step that trained the critic only", "flag", (PPO,)),
    MetricSpec(
        CLIP_FRACTION,
        "share of tokens whose gradient the ratio's clip removed (REINFORCE: policy_loss clip or cispo)",
        "fraction",
        POLICY_TRAINERS,
        chart="Clip fraction",
        compare=True,
    ),
    MetricSpec(
        CLIP_FRACTION_LOW,
        "share of tokens clipped below 1 - epsilon_low",
        "fraction",
        (REINFORCE,),
        chart="Clip fraction",
    ),
    MetricSpec(
        CLIP_FRACTION_HIGH,
        "share of tokens clipped above 1 + epsilon_high",
        "fraction",
        (REINFORCE,),
        chart="Clip fraction",
    ),
    MetricSpec(
        RATIO_MEAN,
        "mean ratio of the policy to the rollout's policy, over the tokens of the step's passes",
        "ratio",
        (REINFORCE,),
        chart="Importance ratio",
        compare=True,
    ),
    MetricSpec(RATIO_MIN, "smallest ratio to the rollout's policy", "ratio", (REINFORCE,), chart="Importance ratio"),
    MetricSpec(RATIO_MAX, "largest ratio to the rollout's policy", "ratio", (REINFORCE,), chart="Importance ratio"),
    MetricSpec(
        MISMATCH_KL,
        "KL (k3, per token) between the generation engine's log-probs of the samples and the trainer's",
        "KL",
        (REINFORCE,),
        chart="Engine-trainer mismatch",
        log=True,
        compare=True,
    ),
    MetricSpec(
        MISMATCH_PPL_RATIO,
        "the trainer's perplexity of the samples over the engine's (1: they agree)",
        "ratio",
        (REINFORCE,),
        compare=True,
    ),
    MetricSpec(
        ROLLOUT_CORRECTED,
        "share of tokens (or samples) whose rollout-correction weight was truncated (tis) or masked (mis)",
        "fraction",
        (REINFORCE,),
    ),
    MetricSpec(ENTROPY, "policy entropy per token", "nats per token", (PPO,), chart="Entropy", compare=True),
    MetricSpec(
        ROLLOUT_ENTROPY,
        "policy entropy per token, estimated as the mean -log pi of the sampled tokens",
        "nats per token",
        (REINFORCE,),
        chart="Entropy",
        compare=True,
    ),
    MetricSpec(
        REWARD_LENGTH_CORR,
        "correlation of reward and response length",
        "correlation",
        POLICY_TRAINERS,
        chart="Reward-length correlation",
        compare=True,
    ),
    MetricSpec(
        ZERO_SPREAD_GROUPS,
        "share of prompt groups whose rewards are all equal",
        "fraction of groups",
        POLICY_TRAINERS,
        chart="Groups with zero reward spread",
        compare=True,
    ),
    MetricSpec(
        DROPPED_GROUPS,
        "share of the step's sampled prompt groups dynamic sampling dropped (no reward spread)",
        "fraction of groups",
        (REINFORCE,),
        chart="Groups with zero reward spread",
        compare=True,
    ),
    MetricSpec(SAMPLING_ROUNDS, "extra rounds of prompts dynamic sampling drew", "rounds", (REINFORCE,)),
    MetricSpec(OVERLONG_PENALTY, "mean overlong penalty added to the rewards (DAPO)", "reward", (REINFORCE,)),
    MetricSpec(
        TOKENS_PER_S,
        "prompt and response tokens trained per second per process",
        "tokens/s per process",
        POLICY_TRAINERS,
        chart="Throughput: tokens",
    ),
    MetricSpec(SAMPLES_PER_S, "samples per second", "samples/s", POLICY_TRAINERS, chart="Throughput: samples"),
    _timer(TIMER_GENERATE, "generating"),
    _timer(TIMER_GENERATE_WAIT, "waiting for the background generation", (REINFORCE,)),
    _timer(TIMER_LOGPROBS, "on the policy's log-probs of the samples"),
    _timer(TIMER_INIT_LOGPROBS, "on the initial policy's log-probs"),
    _timer(TIMER_REWARD, "scoring"),
    _timer(TIMER_CRITIC_INFER, "waiting for the critic's values", (PPO,)),
    _timer(TIMER_TRAIN, "training the policy"),
    _timer(TIMER_CRITIC_TRAIN, "waiting for the critic's training", (PPO,)),
    _timer(TIMER_REFIT, "handing the new weights to the generation engine"),
    _timer(TIMER_VALIDATE, "validating"),
    _timer(TIMER_STEP, "in all (the slowest rank's)"),
    # Not charted (it is the step's time and then some): the run's speed, which the Job page shows.
    MetricSpec(
        TIMER_WALL,
        "seconds since the previous step's metrics were logged: the step, and the previous step's checkpoint and "
        "logging, which timers/step leaves out",
        "seconds",
        POLICY_TRAINERS,
    ),
    MetricSpec(
        MEMORY_PEAK,
        "the most memory a rank held during the step (the largest over ranks): on CUDA the allocator's peak, on "
        "the CPU the process's peak resident size so far",
        "GB",
        POLICY_TRAINERS,
    ),
    MetricSpec(
        MEMORY_REFIT_PEAK,
        "backend fsdp: the most gathered weight bytes held at once while the generation copy was refit",
        "GB",
        POLICY_TRAINERS,
    ),
    MetricSpec(RM_TRAIN_LOSS, "Bradley-Terry loss of the step's pairs", "loss", (REWARD_MODEL,)),
    MetricSpec(RM_TRAIN_ACCURACY, "share of the step's pairs ranked right", "fraction", (REWARD_MODEL,)),
    MetricSpec(RM_TRAIN_MARGIN, "mean chosen-less-rejected score of the step's pairs", "score", (REWARD_MODEL,)),
    MetricSpec(RM_TRAIN_GRAD_NORM, "gradient norm before clipping", "grad norm", (REWARD_MODEL,)),
    MetricSpec(RM_TRAIN_LR, "learning rate", "learning rate", (REWARD_MODEL,)),
    MetricSpec(RM_VAL_LOSS, "Bradley-Terry loss of the validation pairs", "loss", (REWARD_MODEL,)),
    MetricSpec(RM_VAL_ACCURACY, "share of the validation pairs ranked right", "fraction", (REWARD_MODEL,)),
    MetricSpec(RM_VAL_MARGIN, "mean chosen-less-rejected score of the validation pairs", "score", (REWARD_MODEL,)),
)
SPECS: dict[str, MetricSpec] = {s.name: s for s in _SPECS}
# Every gold reward's metric (GOLD_REWARD_PREFIX + the reward's name) is charted and judged alike.
GOLD_REWARD = MetricSpec(
    GOLD_REWARD_PREFIX + "<name>", "validation gold reward <name>", "reward", POLICY_TRAINERS, chart="Reward"
)
COMPARE_METRICS: tuple[str, ...] = tuple(s.name for s in _SPECS if s.compare)


# ------------------------------------------------------------------------------------------------- helpers
def gold_reward(name: str) -> str:
    """The metric of gold reward `name` (validation.extra_rewards.<name>)."""
    return GOLD_REWARD_PREFIX + name


def is_gold_reward(name: str) -> bool:
    return name.startswith(GOLD_REWARD_PREFIX) and len(name) > len(GOLD_REWARD_PREFIX)


def spec(name: str) -> MetricSpec | None:
    """The spec of metric `name` (a gold reward's: GOLD_REWARD), None for a name no trainer logs."""
    if name in SPECS:
        return SPECS[name]
    return GOLD_REWARD if is_gold_reward(name) else None


def chart_of(name: str) -> str | None:
    """The title of the Job page chart that draws metric `name`; None: none does (or no trainer logs it)."""
    found = spec(name)
    return found.chart if found else None


def names(by: str | None = None) -> list[str]:
    """Every fixed metric name (gold rewards' are not fixed), or those trainer `by` logs, in registry order."""
    return [s.name for s in _SPECS if by is None or by in s.by]


def _charts() -> list[Chart]:
    """The Job page's charts in CHART_ORDER, each with its fixed metrics in legend order (a chart also draws the
    gold rewards whose spec names it: `spec(name).chart`)."""
    out = []
    for title in CHART_ORDER:
        members = [s for s in _SPECS if s.chart == title]
        out.append(Chart(title, members[0].unit, members[0].log, tuple(s.name for s in members)))
    return out


CHARTS: tuple[Chart, ...] = tuple(_charts())
