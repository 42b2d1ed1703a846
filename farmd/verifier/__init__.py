"""The verifier kit: hidden tests in a box, canonical comparison outside it, verdicts.

Shared by the built-in environments and, later, by submitted ones. The rules it
keeps: hidden expected outputs never enter a box that runs the attempt's code; the
verdict is computed on the host; the attempt's stdout is never parsed for a
verdict; every way of not answering is a failure; a verifier error is never a
pass and never a zero that looks like a failed attempt.
"""

from farmd.verifier.secret import VerifierKey
from farmd.verifier.verdict import Verdict, errored, failed

__all__ = ["Verdict", "VerifierKey", "errored", "failed"]
