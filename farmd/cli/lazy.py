"""A click group whose commands are imported when one is run, not when the program starts.

farmctl is started once per command by scripts and tests (hundreds of times in a suite); importing every
command's module (agents, environments, boxes, intake) cost a third of a second of each start, for the
one command that runs. ``--help`` still lists them all (it imports them to read their help).
"""

from __future__ import annotations

import importlib

import click


class LazyGroup(click.Group):
    def __init__(self, *args: object, lazy: dict[str, str], **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._lazy = lazy
        """A command's name -> ``module:attribute``."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self._lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self._lazy and cmd_name not in self.commands:
            module, _, attribute = self._lazy[cmd_name].partition(":")
            command = getattr(importlib.import_module(module), attribute)
            if not isinstance(command, click.Command) or command.name != cmd_name:
                raise RuntimeError(f"{self._lazy[cmd_name]} is not the command {cmd_name!r}")
            self.add_command(command)
        return super().get_command(ctx, cmd_name)
