"""Run health: small rules over a run's metric series that raise alarms when RL fine-tuning goes wrong quietly.

Each rule reads some of the series the trainer logs (metrics.jsonl, one value per step; validation metrics at
validation steps) and returns an `Alarm` (its name, the step it judged at, a message with the numbers) or None.
`evaluate` runs every rule. The thresholds are the `health` section of the config (`aligner.config.HealthConfig`).

    validation_divergence  the training reward rises while a validation reward (val/rewards, or a gold reward
                           val/extra_rewards/<name>) falls from its best
    length_hacking         reward and response length correlate strongly, more than early in the run
    kl_growth              the KL to the initial policy grows too fast per step, or passes a ceiling
    zero_spread            most prompt groups have equal rewards: RLOO's advantages are zero, nothing is learnt
    nonfinite              NaN or infinity in the loss or the gradient norm
    ending_collapse        the share of responses that end properly collapses
    entropy_collapse       the policy's entropy per token falls to a small fraction of its early value

Rules over per-step metrics judge only once a metric has `min_points` values, so the first steps' noise never fires
them; `nonfinite` fires on the first bad value. A metric that is absent leaves its rule quiet. Pure Python (no
torch): the worker evaluates these rules as the metrics arrive (worker/health_monitor.py).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from aligner.config import HEALTH_RULES, HealthConfig
from aligner.metrics import ENTROPY, GOLD_REWARD_PREFIX, GRAD_NORM, LOSS, ROLLOUT_ENTROPY, TRAIN_REWARD, VAL_REWARD
from aligner.metrics import INIT_POLICY_KL as KL
from aligner.metrics import REWARD_LENGTH_CORR as LENGTH_CORR
from aligner.metrics import TRAIN_PROPERLY_ENDED as PROPERLY_ENDED
from aligner.metrics import ZERO_SPREAD_GROUPS as ZERO_SPREAD

# The metrics the rules read (aligner/metrics.py); gold rewards (GOLD_REWARD_PREFIX + name) are read too.
WATCHED_METRICS = (
    TRAIN_REWARD, VAL_REWARD, KL, LOSS, GRAD_NORM, PROPERLY_ENDED, LENGTH_CORR, ZERO_SPREAD, ROLLOUT_ENTROPY, ENTROPY
)  # fmt: skip
# The policy's entropy per token as each trainer logs it (REINFORCE estimates it from the sampled tokens, PPO's loss
# computes it): a run logs one of them.
ENTROPIES = (ROLLOUT_ENTROPY, ENTROPY)

Point = tuple[int, float]
Series = Mapping[str, Sequence[Point]]  # metric name -> [(step, value), ...] in step order


@dataclass(frozen=True)
class Alarm:
    name: str  # the rule's name
    step: int  # the step the rule judged at
    message: str  # what it saw, with the numbers


def watched(name: str) -> bool:
    """Whether a rule reads metric `name`: what a monitor has to keep of a run's metrics."""
    return name in WATCHED_METRICS or name.startswith(GOLD_REWARD_PREFIX)


# ------------------------------------------------------------------------------------------------- helpers
# Rules run after every step of a run that may be long: they read only the points they need, never a whole series.
def _first_finite(points: Sequence[Point], n: int) -> list[Point]:
    """The first `n` finite points (fewer when there are not so many)."""
    found = []
    for point in points:
        if math.isfinite(point[1]):
            found.append(point)
            if len(found) == n:
                break
    return found


def _last_finite(points: Sequence[Point], n: int, end: int | None = None) -> list[Point]:
    """The last `n` finite points of `points[:end]`, in step order (fewer when there are not so many)."""
    found = []
    for i in range(len(points) if end is None else end, 0, -1):
        if math.isfinite(points[i - 1][1]):
            found.append(points[i - 1])
            if len(found) == n:
                break
    return found[::-1]


def _mean(points: Sequence[Point]) -> float:
    return sum(value for _, value in points) / len(points)


def _slope(points: Sequence[Point]) -> float:
    """Least-squares slope of value over step (per step); 0 for fewer than two distinct steps."""
    n = len(points)
    mean_step = sum(step for step, _ in points) / n
    mean_value = _mean(points)
    var = sum((step - mean_step) ** 2 for step, _ in points)
    if var == 0:
        return 0.0
    return sum((step - mean_step) * (value - mean_value) for step, value in points) / var


def _windows(series: Series, name: str, config: HealthConfig) -> tuple[list[Point], list[Point]] | None:
    """(the first `window` finite points, the last `window`) of a per-step metric, or None before `min_points`."""
    points = series.get(name, ())
    last = _last_finite(points, config.min_points)
    if len(last) < config.min_points:
        return None
    return _first_finite(points, config.window), last[-config.window :]


# ------------------------------------------------------------------------------------------------- the rules
def validation_divergence(series: Series, config: HealthConfig) -> Alarm | None:
    """The training reward rises while a validation reward falls.

    For val/rewards and each gold reward val/extra_rewards/<name>: the mean of its last `val_window` validation
    points has fallen at least `divergence_min_drop` below the best mean of `val_window` consecutive earlier points,
    while the mean training reward of the last `window` steps is at least `divergence_min_rise` above its mean over
    the `window` steps up to that best point. Means over several points, because one validation is noisy.
    """
    train = series.get(TRAIN_REWARD, ())
    recent = _last_finite(train, config.min_points)
    if len(recent) < config.min_points:
        return None
    recent_train = _mean(recent[-config.window :])
    names = [VAL_REWARD] + sorted(name for name in series if name.startswith(GOLD_REWARD_PREFIX))
    found, step = [], recent[-1][0]
    k = config.val_window
    for name in names:
        val = [point for point in series.get(name, ()) if math.isfinite(point[1])]  # one point per validation
        if len(val) < k + 1:
            continue
        means = [(_mean(val[i : i + k]), val[i + k - 1][0]) for i in range(len(val) - k + 1)]
        (last, last_step), (best, best_step) = means[-1], max(means[:-1])
        before_best = _last_finite(train, config.window, bisect.bisect_right(train, best_step, key=lambda p: p[0]))
        if not before_best:
            continue
        train_then = _mean(before_best)
        if best - last >= config.divergence_min_drop and recent_train - train_then >= config.divergence_min_rise:
            found.append(
                f"{name} fell from {best:.3g} (to step {best_step}) to {last:.3g} (to step {last_step}) while the "
                f"training reward rose from {train_then:.3g} to {recent_train:.3g}"
            )
            step = max(step, last_step)
    if not found:
        return None
    message = "; ".join(found) + f" (validation: means of {k} points; training: of {config.window} steps)"
    return Alarm("validation_divergence", step, message)


def length_hacking(series: Series, config: HealthConfig) -> Alarm | None:
    """Reward and response length correlate (train_rollouts/reward_length_corr): its mean over the last `window`
    steps is at least `length_corr_threshold` (and, when `length_corr_min_rise` > 0, that much above its first
    `window` steps' mean). The policy is likely earning reward by writing longer responses, not better ones."""
    windows = _windows(series, LENGTH_CORR, config)
    if windows is None:
        return None
    early, recent = _mean(windows[0]), _mean(windows[1])
    rose = config.length_corr_min_rise <= 0 or recent - early >= config.length_corr_min_rise
    if recent >= config.length_corr_threshold and rose:
        message = (
            f"reward-length correlation {recent:.2f} over the last {len(windows[1])} steps (was {early:.2f} early; "
            f"threshold {config.length_corr_threshold:g}): the reward may be paying for length"
        )
        return Alarm("length_hacking", windows[1][-1][0], message)
    return None


def kl_growth(series: Series, config: HealthConfig) -> Alarm | None:
    """The KL to the initial policy (train_rollouts/init_policy_kl) grows faster than `kl_max_slope` per step (least
    squares over the last `window` steps), or its mean over them is above `kl_max`."""
    windows = _windows(series, KL, config)
    if windows is None:
        return None
    recent = windows[1]
    slope, level = _slope(recent), _mean(recent)
    if slope > config.kl_max_slope:
        why = f"grows by {slope:.3g} per step over the last {len(recent)} steps (limit {config.kl_max_slope:g})"
    elif level > config.kl_max:
        why = f"is {level:.3g} on average over the last {len(recent)} steps (ceiling {config.kl_max:g})"
    else:
        return None
    return Alarm("kl_growth", recent[-1][0], f"KL to the initial policy {why}: the policy drifts fast")


def zero_spread(series: Series, config: HealthConfig) -> Alarm | None:
    """The share of prompt groups whose rewards are all equal (train_rollouts/frac_zero_std_groups) averages at least
    `zero_spread_max` over the last `window` steps: those groups give RLOO zero advantages, no learning signal."""
    windows = _windows(series, ZERO_SPREAD, config)
    if windows is None:
        return None
    recent = windows[1]
    level = _mean(recent)
    if level < config.zero_spread_max:
        return None
    message = (
        f"{level:.0%} of prompt groups had equal rewards over the last {len(recent)} steps (limit "
        f"{config.zero_spread_max:.0%}): they give no learning signal (a task too hard or too easy, a constant reward)"
    )
    return Alarm("zero_spread", recent[-1][0], message)


def nonfinite(series: Series, config: HealthConfig) -> Alarm | None:
    """NaN or infinity in train_optim/loss or train_optim/grad_norm within the last `window` steps logged; it fires on
    the first such value (no minimum of points) and clears after `window` finite steps."""
    bad = []
    for name in (LOSS, GRAD_NORM):
        points = series.get(name, ())[-config.window :]
        first = next(((step, value) for step, value in points if not math.isfinite(value)), None)
        if first is not None:
            bad.append((first[0], name, first[1]))
    if not bad:
        return None
    step = min(b[0] for b in bad)
    message = "; ".join(f"{name} is {value} at step {at}" for at, name, value in sorted(bad))
    return Alarm("nonfinite", step, f"{message}: training has diverged")


def ending_collapse(series: Series, config: HealthConfig) -> Alarm | None:
    """The share of responses that end properly (train_rollouts/fraction_of_samples_properly_ended) collapses: its
    mean over the last `window` steps is below `ending_floor` and at least `ending_min_drop` below its first `window`
    steps' mean (responses run into max_new_tokens instead of ending)."""
    windows = _windows(series, PROPERLY_ENDED, config)
    if windows is None:
        return None
    early, recent = _mean(windows[0]), _mean(windows[1])
    if recent < config.ending_floor and early - recent >= config.ending_min_drop:
        message = (
            f"only {recent:.0%} of responses ended properly over the last {len(windows[1])} steps (was {early:.0%} "
            f"early; floor {config.ending_floor:.0%}): responses run into the length limit"
        )
        return Alarm("ending_collapse", windows[1][-1][0], message)
    return None


def entropy_collapse(series: Series, config: HealthConfig) -> Alarm | None:
    """The policy's entropy per token (train_rollouts/entropy for REINFORCE, train_optim/entropy for PPO) collapses:
    its mean over the last `window` steps is below `entropy_min_fraction` of its first `window` steps' mean. The
    policy then samples nearly the same answer every time: the groups lose their reward spread and nothing more is
    explored (DAPO's clip-higher is one remedy, a larger KL penalty or temperature others)."""
    for name in ENTROPIES:
        windows = _windows(series, name, config)
        if windows is None:
            continue
        early, recent = _mean(windows[0]), _mean(windows[1])
        if early > 0 and recent < config.entropy_min_fraction * early:
            message = (
                f"the policy's entropy ({name}) fell to {recent:.3g} nats per token over the last {len(windows[1])} "
                f"steps from {early:.3g} early ({recent / early:.0%}; floor {config.entropy_min_fraction:.0%} of the "
                "early value): the policy has stopped exploring"
            )
            return Alarm("entropy_collapse", windows[1][-1][0], message)
    return None


RULE_NAMES = HEALTH_RULES  # the names HealthConfig.pause_on accepts, in this order
RULES: dict[str, Callable[[Series, HealthConfig], Alarm | None]] = {
    rule.__name__: rule
    for rule in (
        validation_divergence,
        length_hacking,
        kl_growth,
        zero_spread,
        nonfinite,
        ending_collapse,
        entropy_collapse,
    )  # fmt: skip
}


def evaluate(series: Series, config: HealthConfig) -> list[Alarm]:
    """Every rule's alarm over `series`, in RULE_NAMES order; none when `config.enabled` is false."""
    if not config.enabled:
        return []
    return [alarm for rule in RULES.values() if (alarm := rule(series, config)) is not None]
