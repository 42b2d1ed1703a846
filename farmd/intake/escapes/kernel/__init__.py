"""The escapes' numpy-only payloads (kernel tasks): numpy and the standard names, nothing else.

Laid out and handed over as ``python/``'s are (one module per escape, ``prelude`` first; the lines above
the payload line are for ruff and mypy only). A kernel importing anything but numpy and math is refused
before it runs, so these reach only for numpy's public API and, through libc's ``system()``, the escape's
shell commands.
"""
