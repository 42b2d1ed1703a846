"""Placeholder until the sandbox benchmark lands in the next commit."""


def main() -> None:
    raise SystemExit("the sandbox benchmark is being written")
