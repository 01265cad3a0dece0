"""The wheel carries the train check: builder.train (shapes, the host side, the incheck package) and its
data file (verl_commands.yaml). Without them the installed build-env cannot even import its
commands (builder/commands/train_check.py imports builder.train)."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_wheel_lists_builder_train_and_its_data() -> None:
    tool = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert {"builder.train", "builder.train.incheck"} <= set(tool["packages"])
    data = tool["package-data"]
    shipped = [*data.get("builder.train", []), *(p.removeprefix("train/")
                                                for p in data.get("builder", [])
                                                if p.startswith("train/"))]
    assert any(Path("verl_commands.yaml").match(p) for p in shipped), shipped
