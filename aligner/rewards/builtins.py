"""Built-in rewards: the reward functions every user may pick by NAME, configured with data, never with code.

The training service lets a user choose a reward from a catalogue by name only (never a `module:callable`); these
are the entries every user gets. Each names its function (`target`) and a pydantic model of its parameters, which
arrive as `reward.function_args`:

    reward:
      function: aligner.rewards.verifiable:numeric_match     # BUILTIN_REWARDS["numeric_match"].target
      function_args: {tolerance: 0.01}

`validate_builtin_params(name, params)` checks a user's parameters (unknown keys are errors) and returns them with
every default filled in; `FunctionRewardClient` does the same for any `reward.function` that is a built-in's target,
so a config run with `aligner train` is checked as the service checks it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from aligner.config import validation_error_lines
from aligner.errors import ConfigError
from aligner.rewards.verifiable import (
    ANSWER_FIELD,
    DEFAULT_LENGTH_COEF,
    DEFAULT_MARKER,
    DEFAULT_TOLERANCE,
    MAX_PATTERN_LENGTH,
    Extract,
    LengthUnit,
    compile_pattern,
)

ARGS_PREFIX = "reward.function_args"


class Params(BaseModel):
    # A misspelt parameter silently ignored would be a reward with the wrong settings.
    model_config = ConfigDict(extra="forbid", frozen=True)


class DemoParams(Params):
    """The demo reward has no parameters."""


class AnswerParams(Params):
    field: str = Field(ANSWER_FIELD, min_length=1, description="Key of the prompt line holding the reference answer.")


class ExactMatchParams(AnswerParams):
    ignore_case: bool = Field(False, description="Compare casefolded.")
    extract: Extract = Field(
        "response",
        description="What of the response is compared: all of it, the text after the last `marker`, or the content "
        "of the last \\boxed{...}.",
    )
    marker: str = Field(DEFAULT_MARKER, min_length=1, description="With extract: marker, the answer follows it.")


class NumericMatchParams(AnswerParams):
    tolerance: float = Field(DEFAULT_TOLERANCE, ge=0, allow_inf_nan=False, description="Absolute tolerance.")
    relative_tolerance: float = Field(
        0.0, ge=0, allow_inf_nan=False, description="Tolerance relative to |answer|; the larger of the two applies."
    )
    missing: float = Field(0.0, allow_inf_nan=False, description="Reward of a response without a number.")


class RegexMatchParams(Params):
    pattern: str = Field(
        description=f"Regular expression (Python re syntax) searched in the response; at most {MAX_PATTERN_LENGTH} "
        "characters."
    )
    ignore_case: bool = Field(False, description="Match case-insensitively.")

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        compile_pattern(pattern)  # its ValueError says why
        return pattern


class LengthPenaltyParams(Params):
    target_length: int = Field(ge=0, description="Length without penalty, in `unit`s.")
    coef: float = Field(DEFAULT_LENGTH_COEF, gt=0, allow_inf_nan=False, description="Reward lost per unit beyond.")
    unit: LengthUnit = Field("chars", description="chars (characters) or words (whitespace-separated).")
    max_penalty: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="The reward never goes below -max_penalty; none: no floor."
    )


@dataclass(frozen=True)
class BuiltinReward:
    name: str
    target: str  # module:callable, as in reward.function
    description: str
    params: type[Params]


BUILTIN_REWARDS: dict[str, BuiltinReward] = {
    reward.name: reward
    for reward in (
        BuiltinReward(
            "demo",
            "aligner.demo:reward",
            "The demo task's reward: (kind - unkind adjectives) / adjectives of the response, 1 when all are kind, "
            "-1 when all are unkind; 0.5 less when it never names the prompt's subject. From -1.5 to 1.",
            DemoParams,
        ),
        BuiltinReward(
            "exact_match",
            "aligner.rewards.verifiable:exact_match",
            "1 when the response (or its part after a marker, or its last \\boxed{}) equals the prompt's answer.",
            ExactMatchParams,
        ),
        BuiltinReward(
            "numeric_match",
            "aligner.rewards.verifiable:numeric_match",
            "1 when the last number in the response is within a tolerance of the prompt's answer.",
            NumericMatchParams,
        ),
        BuiltinReward(
            "regex_match",
            "aligner.rewards.verifiable:regex_match",
            "1 when a regular expression matches the response.",
            RegexMatchParams,
        ),
        BuiltinReward(
            "length_penalty",
            "aligner.rewards.verifiable:length_penalty",
            "Minus coef per character (or word) beyond a target length.",
            LengthPenaltyParams,
        ),
    )
}


def builtin_for_target(target: str) -> BuiltinReward | None:
    """The built-in whose function is `target` (a reward.function), or None."""
    return next((reward for reward in BUILTIN_REWARDS.values() if reward.target == target), None)


def validate_builtin_params(name: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """`params` checked against built-in `name`'s parameters, with every default filled in.

    Raises ConfigError, one line per bad parameter: `reward.function_args.<field>: reason`.
    """
    reward = BUILTIN_REWARDS.get(name)
    if reward is None:
        raise ConfigError(f"unknown built-in reward {name!r}; the built-ins are {', '.join(BUILTIN_REWARDS)}")
    if not isinstance(params, Mapping):
        raise ConfigError(f"{ARGS_PREFIX}: must map parameter names to values, not be a {type(params).__name__}")
    try:
        return reward.params.model_validate(dict(params)).model_dump()
    except ValidationError as err:
        raise ConfigError("\n".join(validation_error_lines(err, ARGS_PREFIX))) from None
