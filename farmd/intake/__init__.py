"""Intake: what an environment must show before it may produce rewards.

Tier 1 (``checks``) are cheap ``check_*`` functions over the Environment API; tier 2
attacks a verifier with the exploit library (``exploits``) and measures it (``audit``).
Intake sits above envs and the verifier kit, so neither of them ever imports it. This package's own
import loads nothing: ``farmd.config`` reads ``farmd.intake.settings`` on every start, environments or not.
"""
