"""Shared by the tools/device/*_phase_clocks.py scripts: edits of a copy of the source tree that fail loudly when the
code they expect has changed."""
import os
import sys


def replace_once(text, old, new, what):
    """text with its one occurrence of `old` replaced by `new`; exits naming `what` unless there is exactly one."""
    if text.count(old) != 1:
        tool = os.path.basename(sys.argv[0])
        sys.exit(f"{tool}: expected one '{what}' in the source, found {text.count(old)}; "
                 "the kernel changed — update this script")
    return text.replace(old, new)
