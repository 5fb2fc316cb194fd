"""aligner/cli.py: the flags every config-reading command shares."""

from __future__ import annotations

import argparse

import pytest

from aligner.cli import build_parser

CONFIG_COMMANDS = {
    "train": ["--config", "c.yaml"],
    "try-reward": ["--config", "c.yaml"],
    "train-rm": ["--config", "c.yaml"],
    "serve-reward": [],
    "serve-critic": [],
}


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [action] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return action.choices


@pytest.mark.parametrize(("command", "required"), CONFIG_COMMANDS.items())
def test_set_is_repeatable_and_collects_overrides_in_order(command, required):
    parser = build_parser()
    args = parser.parse_args([command, *required, "--set", "a.b=1", "--set", "c=[x, y]"])
    assert args.overrides == ["a.b=1", "c=[x, y]"]
    assert parser.parse_args([command, *required]).overrides == []


def test_set_is_one_declaration_for_every_command():
    """Same flag, destination, metavar and help wording everywhere; only the example field differs."""
    flags = {}
    for command, sub in _subparsers(build_parser()).items():
        for action in sub._actions:
            if "--set" in action.option_strings:
                flags[command] = action
    assert set(flags) == set(CONFIG_COMMANDS)
    shapes = {(a.dest, a.metavar, type(a).__name__, a.help.split(", e.g.")[0]) for a in flags.values()}
    assert shapes == {("overrides", "KEY=VALUE", "_AppendAction", "override a config field (a YAML value)")}
