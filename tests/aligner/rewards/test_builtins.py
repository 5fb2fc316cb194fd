import inspect

import pytest

from aligner.errors import ConfigError
from aligner.rewards.builtins import BUILTIN_REWARDS, builtin_for_target, validate_builtin_params
from aligner.rewards.local import import_callable


def test_the_catalogue_names():
    assert list(BUILTIN_REWARDS) == ["demo", "exact_match", "numeric_match", "regex_match", "length_penalty"]
    assert BUILTIN_REWARDS["demo"].target == "aligner.demo:reward"
    assert builtin_for_target("aligner.rewards.verifiable:numeric_match") is BUILTIN_REWARDS["numeric_match"]
    assert builtin_for_target("tests.helpers.rewards:letter_reward") is None


@pytest.mark.parametrize("name", list(BUILTIN_REWARDS))
def test_each_params_model_is_its_functions_keywords(name):
    reward = BUILTIN_REWARDS[name]
    keywords = {
        p.name: p.default
        for p in inspect.signature(import_callable(reward.target)).parameters.values()
        if p.kind is p.KEYWORD_ONLY
    }
    fields = {
        field: (inspect.Parameter.empty if info.is_required() else info.default)
        for field, info in reward.params.model_fields.items()
    }
    # Same names and the same defaults: the function called directly behaves as the catalogue says.
    assert fields == keywords


def test_defaults_are_filled_in_and_validation_is_idempotent():
    args = validate_builtin_params("numeric_match", {"tolerance": "0.5"})
    assert args == {"field": "answer", "tolerance": 0.5, "relative_tolerance": 0.0, "missing": 0.0}
    for name, params in [
        ("demo", {}),
        ("exact_match", {"extract": "boxed"}),
        ("numeric_match", {}),
        ("regex_match", {"pattern": r"\d+"}),
        ("length_penalty", {"target_length": 100}),
    ]:
        once = validate_builtin_params(name, params)
        assert validate_builtin_params(name, once) == once  # what the service stores validates again


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("numeric_match", {"tolerance": -1}, "reward.function_args.tolerance: Input should be greater than or equal"),
        ("numeric_match", {"tolerance": "nan"}, "reward.function_args.tolerance: Input should be a finite number"),
        ("numeric_match", {"tolerence": 0.1}, "reward.function_args.tolerence: unknown field"),
        ("exact_match", {"extract": "last_line"}, "reward.function_args.extract: Input should be 'response'"),
        ("exact_match", {"field": ""}, "reward.function_args.field: String should have at least 1 character"),
        ("regex_match", {}, "reward.function_args.pattern: required field is missing"),
        ("regex_match", {"pattern": "a" * 201}, "reward.function_args.pattern: is 201 characters long"),
        ("regex_match", {"pattern": "(a"}, "reward.function_args.pattern: is not a valid regular expression"),
        ("length_penalty", {"target_length": 10, "unit": "tokens"}, "reward.function_args.unit: Input should be"),
        ("length_penalty", {"target_length": -1}, "reward.function_args.target_length: Input should be greater"),
        ("demo", {"scale": 2}, "reward.function_args.scale: unknown field"),
        ("numeric_match", ["tolerance"], "reward.function_args: must map parameter names to values"),
        ("exact", {}, "unknown built-in reward 'exact'; the built-ins are demo, exact_match"),
    ],
)
def test_bad_params_name_the_field(name, params, message):
    with pytest.raises(ConfigError) as err:
        validate_builtin_params(name, params)
    assert message in str(err.value)


def test_every_bad_param_is_reported_on_its_own_line():
    with pytest.raises(ConfigError) as err:
        validate_builtin_params("length_penalty", {"coef": 0, "unit": "lines"})
    lines = str(err.value).splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "reward.function_args.target_length",
        "reward.function_args.coef",
        "reward.function_args.unit",
    ]
