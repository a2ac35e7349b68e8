"""Shared by the tools/device/*.py scripts: edits of a copy of the source tree that fail loudly when the
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


def span_once(text, start, end, what):
    """(a, b): `start`'s one occurrence in text and the end of the first `end` after it; exits naming `what` unless
    `start` occurs exactly once and `end` follows it."""
    a = text.find(start)
    b = text.find(end, a) if a >= 0 else -1
    if text.count(start) != 1 or b < 0:
        tool = os.path.basename(sys.argv[0])
        sys.exit(f"{tool}: expected one '{what}' in the source (from {start.strip()[:40]!r} to {end.strip()[:40]!r}); "
                 "the code changed — update this script")
    return a, b + len(end)


def apply_edits(text, edits):
    """text after each (old, new, what) of `edits` in turn, each by replace_once."""
    for old, new, what in edits:
        text = replace_once(text, old, new, what)
    return text


def function_body(text, signature):
    """(start, end) of the body of the function whose declaration contains `signature`: from just after its opening
    brace to its closing brace, by counting braces (the kernels these scripts edit have none in strings)."""
    i = text.index("{", text.index(signature)) + 1
    depth = 1
    j = i
    while depth:
        c = text[j]
        depth += 1 if c == "{" else -1 if c == "}" else 0
        j += 1
    return i, j - 1
