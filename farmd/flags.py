"""Flags: facts about an attempt worth filtering or inspecting trajectories by.

One closed set, written once: verdicts raise the verifier's flags, the rollout runner and the
trajectory record raise the ones about what was stored. A flag is never a score; it says why a
score is what it is, or what a stored record leaves out.
"""

from __future__ import annotations

SANDBOX_VIOLATION = "sandbox_violation"
"""A box that ran the attempt's code hit a bound or policy (see reasons)."""
SUSPECTED_HACK = "suspected_hack"
"""The attempt did something only an attempt at gaming the verifier does."""
TIMEOUT = "timeout"
"""The attempt ran out of time."""
NO_ANSWER = "no_answer"
"""There was nothing to verify (empty submission, no answer block)."""
UNPARSEABLE = "unparseable"
"""The submission could not be parsed or compiled (a syntax error, nesting too deep, an expression too
long): checked in the judge's box, never on the host."""
INVALID_TEXT = "invalid_text"
"""The attempt's text held what UTF-8 cannot encode (a lone surrogate); it was repaired with U+FFFD where
it entered the farm, and the attempt judged as repaired."""
VERIFIER_FAULT = "verifier_fault"
"""The verifier failed while judging this attempt but judges the task's reference soundly: whatever the
attempt did to it, the attempt gets 0 (a verifier error is never an escape from a 0)."""
RULE_BROKEN = "rule_broken"
"""The attempt broke a rule its task states (more actions than allowed, a command past its time, a forbidden import,
an argument modified, an answer not in the form asked for): reward 0 whatever else it got right; the reason names
the rule."""
TRUNCATED = "truncated"
"""Part of the attempt was cut to the farm's bounds: a model reply longer than the agent keeps (the
attempt judged is the reply as kept), or a stored field over the trajectory record's bounds (the
verdict was given on the whole attempt, only the record is cut)."""

QUARANTINED = "quarantined"
"""A later score: the environment version that judged this attempt was quarantined (a hack was found in its
verifier), so its reward is withdrawn (0) whatever it first was."""
WITHDRAWN = "withdrawn"
"""No trainer stream sends this trajectory again; consumers were told it was taken back."""

RED_TEAM_EXPLOIT = "red_team_exploit"
"""A red-team agent's attempt from the exploit library (its agent spec names which): wrong on purpose."""
RED_TEAM_ESCAPE = "red_team_escape"
"""A red-team agent's attempt to get out of its box (its agent spec names which): wrong on purpose."""

EXTERNAL_SCORE = "external_score"
"""Scored outside the farm: an Atropos environment pushed the attempt with its score, which farm's verifier never
judged (a trainer that trusts only farm's verdicts leaves these out)."""

UNREADABLE = "unreadable"
"""The stored record could not be read as one (a body that does not decode, a number out of its domain, JSON
nested too deep): what is served in its place is a stub with its ids and an error verdict (no score), its
reasons saying why, so every stream and listing goes on past it (``farmd.domain``)."""

ALL = (SANDBOX_VIOLATION, SUSPECTED_HACK, TIMEOUT, NO_ANSWER, UNPARSEABLE, INVALID_TEXT, VERIFIER_FAULT,
       RULE_BROKEN, TRUNCATED, QUARANTINED, WITHDRAWN, RED_TEAM_EXPLOIT, RED_TEAM_ESCAPE, EXTERNAL_SCORE, UNREADABLE)

OF_THE_ATTEMPT = (INVALID_TEXT, TRUNCATED, RED_TEAM_EXPLOIT, RED_TEAM_ESCAPE)
"""Facts about the attempt or its record, not about a verdict on it: every later verdict (a rescore, a check of a
node's verdict, a withdrawal) keeps them, so a red-team attempt stays one whoever judged it last."""
