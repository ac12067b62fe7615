"""archspec.cli.options: the field -> flag tables through which the command line names its flags where the library
names its fields (issue 58 item 5).  A table entry whose flag the command does not have would tell a user to set an
option that does not exist; the parser is the independent reference."""

from __future__ import annotations

import argparse

import pytest

from archspec.cli.app import make_parser
from archspec.cli.options import options_for

COMMANDS = ["train", "search", "search masks", "table", "build", "export", "inspect", "two-phase", "tcnn"]


def _subparser(parser: argparse.ArgumentParser, words: list[str]) -> argparse.ArgumentParser:
    for word in words:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    return parser


@pytest.mark.parametrize("command", COMMANDS)
def test_every_flag_a_table_names_is_an_option_of_its_command(command: str) -> None:
    words = command.split()
    parser = _subparser(make_parser(), words)
    options = {s for action in parser._actions for s in action.option_strings}
    table = options_for(words[0], words[1] if len(words) > 1 else None)
    assert {flag for flag in table.values() if flag not in options} == set()


def test_the_check_sees_a_flag_the_command_lacks() -> None:
    parser = _subparser(make_parser(), ["train"])
    options = {s for action in parser._actions for s in action.option_strings}
    assert "--out" in options and "--budget-flops" not in options
