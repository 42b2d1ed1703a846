"""Intake: what an environment must show before it may produce rewards.

Tier 1 (``checks``) are cheap ``check_*`` functions over the Environment API; tier 2
attacks a verifier with the exploit library (``exploits``) and measures it (``audit``).
Intake sits above envs and the verifier kit, so neither of them ever imports it.
"""

from farmd.intake.checks import Finding, check_environment

__all__ = ["Finding", "check_environment"]
