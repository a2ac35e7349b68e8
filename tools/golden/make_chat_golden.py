#!/usr/bin/env python3
"""Golden outputs for Kestrel's chat-template renderer (core/chat), computed by Python's jinja2.

For every template in tests/data/chat_templates/*.jinja this script writes a GGUF with Kestrel's own writer
(`kestrel-mkmodel --preset golden-qwen35 --chat-template FILE`), reads `tokenizer.chat_template` back from that file
with tools/golden/gguf_read.py, and renders every conversation of tests/golden/chat/conversations.json with jinja2 in
the environment Hugging Face transformers renders chat templates in (ImmutableSandboxedEnvironment with
trim_blocks=True, lstrip_blocks=True, jinja2.ext.loopcontrols and a {% generation %} tag; tojson as
json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False); raise_exception raising
TemplateError). It also renders the small templates of tests/golden/chat/snippets.json in the same environment.
Outputs (or the exception a case raises) go to tests/golden/chat/expected/<template>.json and snippets.json, which
tests/golden/test_chat_golden.cpp compares with Kestrel's output byte for byte.

    cmake --build --preset release --target kestrel-mkmodel
    /usr/bin/python3 tools/golden/make_chat_golden.py --mkmodel build/release/bin/kestrel-mkmodel

Needs Debian's python3-jinja2 (3.1.x) and python3-numpy (for gguf_read.py). Run from the repository root.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf_read import GgufFile  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "tests/data/chat_templates"
GOLDEN = ROOT / "tests/golden/chat"
PRESET = "golden-qwen35"


class GenerationTag(jinja2.ext.Extension):
    """transformers' {% generation %} ... {% endgeneration %}: renders its body (assistant-mask tracking is not
    needed for the text)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_environment() -> jinja2.Environment:
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def render(env: jinja2.Environment, source: str, context: dict) -> dict:
    try:
        return {"output": env.from_string(source).render(**context)}
    except Exception as e:  # every failure is part of the expected behaviour
        return {"error": f"{type(e).__name__}: {e}"}


def template_from_gguf(mkmodel: str, template: Path, workdir: Path) -> str:
    gguf = workdir / (template.stem + ".gguf")
    subprocess.run([mkmodel, "--preset", PRESET, "--chat-template", str(template), "-o", str(gguf), "--quiet"],
                   check=True)
    f = GgufFile(str(gguf))
    try:
        source = f.metadata["tokenizer.chat_template"]
    finally:
        f.close()
    if source != template.read_text(encoding="utf-8"):
        raise SystemExit(f"{template}: the template read back from {gguf} differs from the file")
    return source


def producer() -> dict:
    return {"script": "tools/golden/make_chat_golden.py", "jinja2": jinja2.__version__,
            "python": platform.python_version()}


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mkmodel", required=True, help="path to kestrel-mkmodel")
    ap.add_argument("--out", default=str(GOLDEN / "expected"), help="folder for the expected outputs")
    args = ap.parse_args()
    env = make_environment()
    out = Path(args.out)
    conversations = json.loads((GOLDEN / "conversations.json").read_text(encoding="utf-8"))["cases"]
    with tempfile.TemporaryDirectory() as tmp:
        for template in sorted(TEMPLATES.glob("*.jinja")):
            source = template_from_gguf(args.mkmodel, template, Path(tmp))
            cases = [{"name": c["name"], **render(env, source, c["context"])} for c in conversations]
            write_json(out / (template.stem + ".json"), {
                "template": template.name,
                "template_sha256": hashlib.sha256(source.encode("utf-8")).hexdigest(),
                "gguf": {"writer": "kestrel-mkmodel", "preset": PRESET, "key": "tokenizer.chat_template"},
                "producer": producer(),
                "cases": cases,
            })
            errors = sum(1 for c in cases if "error" in c)
            print(f"{template.name}: {len(cases)} conversations, {errors} raise")
    snippets = json.loads((GOLDEN / "snippets.json").read_text(encoding="utf-8"))["cases"]
    cases = [{"name": s["name"], **render(env, s["template"], s["context"])} for s in snippets]
    write_json(out / "snippets.json", {"producer": producer(), "cases": cases})
    print(f"snippets: {len(cases)} templates, {sum(1 for c in cases if 'error' in c)} raise")
    return 0


if __name__ == "__main__":
    sys.exit(main())
