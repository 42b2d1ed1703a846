"""The escapes' Python payloads (function tasks; a shell escape runs one as a script).

One module per escape, named as the escape with ``_`` for ``-``, and ``prelude`` (the helpers every
payload starts with). Each is read as text (package data, ``farmd.intake.escapes.payload``) and handed
to the box from its payload line on; what stands above that line (imports of the prelude's helpers and
of ``given``'s names) is for ruff and mypy only. A body redefines the prelude's ``main`` (runs at import)
and ``on_call`` (runs at the first call). Importing one of these modules runs nothing: each only defines.
"""
