#!/usr/bin/env python3
"""Fails when a file under src/pagoda includes a module its own module may not see.

The allowed dependencies are written once, in docs/ARCHITECTURE.md, in the fenced
block marked `layering`: one line per module, `module: allowed modules...`. A
module is a folder under src/pagoda (backend/cpu and backend/cuda are modules of
their own; backend/cuda/attention belongs to backend/cuda). A module may always
include its own headers. Usage: check_layering.py [REPO_ROOT]
"""
import pathlib
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"pagoda/([^"]+)"', re.MULTILINE)


def module_of(relative_path: str) -> str:
    parts = relative_path.split("/")
    if parts[0] == "backend" and len(parts) > 2:
        return "backend/" + parts[1]
    return parts[0]


def read_rules(architecture_md: pathlib.Path) -> dict:
    text = architecture_md.read_text(encoding="utf-8")
    block = re.search(r"```layering\n(.*?)```", text, re.DOTALL)
    if not block:
        sys.exit(f"{architecture_md}: no ```layering block")
    rules = {}
    for line in block.group(1).splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, allowed = line.partition(":")
        rules[name.strip()] = set(allowed.split())
    return rules


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)
    rules = read_rules(root / "docs" / "ARCHITECTURE.md")
    src = root / "src" / "pagoda"
    violations = []
    for path in sorted(src.rglob("*")):
        if path.suffix not in {".h", ".cpp", ".cu", ".cuh"}:
            continue
        own = module_of(str(path.relative_to(src)))
        if own not in rules:
            violations.append(f"{path.relative_to(root)}: module '{own}' is not listed in the layering block")
            continue
        allowed = rules[own]
        for included in INCLUDE.findall(path.read_text(encoding="utf-8", errors="replace")):
            target = module_of(included)
            if target == own or "*" in allowed or target in allowed:
                continue
            violations.append(f"{path.relative_to(root)}: {own} includes pagoda/{included} ({target}), "
                              f"allowed: {' '.join(sorted(allowed)) or 'nothing'}")
    for v in violations:
        print(v)
    print(f"check_layering: {len(violations)} violation(s)")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
