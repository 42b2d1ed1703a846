"""An in-memory episode and an action task, for agent loops that need no box."""

from __future__ import annotations

from farmd.envs.base import Episode, Observation, Task


class ListEpisode(Episode):
    """Answers every command with a canned observation; ``done`` after ``max_steps`` commands."""

    def __init__(self, max_steps: int = 30) -> None:
        self.max_steps = max_steps
        self.commands: list[str] = []
        self.closed = False

    async def step(self, action: str) -> Observation:
        self.commands.append(action)
        return Observation(f"output of {action!r}", len(self.commands) % 2, done=len(self.commands) >= self.max_steps)

    async def close(self) -> None:
        self.closed = True


def action_task() -> Task:
    return Task(env="fake-shell", env_version="1", seed=1, difficulty=1, prompt="Count the files.", kind="actions",
                answer_format="Finish with the number alone.", metadata={"max_steps": 10})
