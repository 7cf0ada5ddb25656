#!/usr/bin/env python3
"""Checks README.md (ctest readme_check).

  python3 tests/docs/check_readme.py [README.md]

- at most 300 lines;
- no word that looks like a commit hash (7 to 40 hex digits with both digits and letters);
- every repository path it names exists: paths in inline code, in links and in shell code
  blocks whose first component is a top-level entry of the repository (core/, tools/, docs/,
  examples/, README.md, ...); build outputs (build/...) and placeholders (<...>, ...) are not
  paths of the repository;
- each "<!-- include: PATH -->" line is followed by a fenced block equal to PATH byte for byte.

Prints each problem as README.md:LINE: message and exits 1 if there is any.
"""
import os
import re
import sys

MAX_LINES = 300
HASH = re.compile(r"(?<![0-9A-Za-z_])[0-9a-f]{7,40}(?![0-9A-Za-z_])")
INCLUDE = re.compile(r"^<!--\s*include:\s*(\S+)\s*-->\s*$")
FENCE = re.compile(r"^(```+|~~~+)\s*([A-Za-z0-9_+-]*)")
LINK = re.compile(r"\]\(([^)\s]+)\)")
INLINE_CODE = re.compile(r"`([^`]+)`")
# Shell-like blocks whose words may be paths; C++ and CMake blocks are compiled or quoted, not run here.
SHELL_LANGS = {"", "sh", "bash", "shell", "console", "text"}


def top_level_entries(root):
    return {name for name in os.listdir(root) if not name.startswith(".") and name != "build"}


def candidate_paths(text, top):
    """Words of `text` that name a repository path: their first component is a top-level entry."""
    for raw in re.split(r"[\s,;=]+", text):
        word = raw.strip("\"'()[]{}:;,.`") if not raw.endswith("/") else raw.strip("\"'()[]{}:;,`")
        if word.startswith("./"):
            word = word[2:]
        if not word or any(c in word for c in "<>*$|?{}") or "..." in word or "…" in word:
            continue
        first = word.split("/", 1)[0]
        if first in top and ("/" in word or word == first):
            yield word


def check(readme_path):
    root = os.path.dirname(os.path.abspath(readme_path))
    name = os.path.basename(readme_path)
    with open(readme_path, "rb") as f:
        data = f.read()
    text = data.decode("utf-8")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    top = top_level_entries(root)
    problems = []

    def problem(line_no, message):
        problems.append(f"{name}:{line_no}: {message}")

    if len(lines) > MAX_LINES:
        problem(len(lines), f"{len(lines)} lines, more than {MAX_LINES}")

    def check_path(line_no, path):
        if not os.path.exists(os.path.join(root, path.split("#", 1)[0])):
            problem(line_no, f"names '{path}', which does not exist in the repository")

    in_block = False
    block_lang = ""
    fence = ""
    pending_include = None  # (line number, path) of an include marker not yet matched
    include = None  # [line number, path, collected lines] of the block being read
    for i, line in enumerate(lines, start=1):
        for match in HASH.finditer(line):
            word = match.group(0)
            if re.search(r"[0-9]", word) and re.search(r"[a-f]", word):
                problem(i, f"'{word}' looks like a commit hash")
        m = FENCE.match(line)
        if in_block:
            if m and line.strip().startswith(fence) and line.strip() == fence:
                in_block = False
                if include is not None:
                    body = "".join(l + "\n" for l in include[2])
                    target = os.path.join(root, include[1])
                    if not os.path.isfile(target):
                        problem(include[0], f"include '{include[1]}' does not exist")
                    else:
                        with open(target, "rb") as f:
                            if f.read() != body.encode("utf-8"):
                                problem(include[0], f"the block after this line differs from {include[1]}")
                    include = None
                continue
            if include is not None:
                include[2].append(line)
            elif block_lang in SHELL_LANGS:
                for path in candidate_paths(line.split("#", 1)[0], top):
                    check_path(i, path)
            continue
        if m:
            in_block = True
            fence = m.group(1)
            block_lang = m.group(2).lower()
            if pending_include is not None:
                include = [pending_include[0], pending_include[1], []]
                pending_include = None
            continue
        if pending_include is not None:
            if line.strip() == "":
                continue
            problem(pending_include[0], "an include line must be followed by a fenced code block")
            pending_include = None
        inc = INCLUDE.match(line)
        if inc:
            pending_include = (i, inc.group(1))
            continue
        for link in LINK.findall(line):
            if re.match(r"^[a-z]+:", link) or link.startswith("#"):
                continue
            check_path(i, link)
        for code in INLINE_CODE.findall(line):
            for path in candidate_paths(code, top):
                check_path(i, path)
    if in_block:
        problem(len(lines), "a fenced code block is not closed")
    if pending_include is not None:
        problem(pending_include[0], "an include line must be followed by a fenced code block")
    return problems


def main():
    readme = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..", "README.md")
    problems = check(readme)
    for p in problems:
        print(p)
    if problems:
        print(f"check_readme: {len(problems)} problem(s)")
        return 1
    print(f"check_readme: {readme} passes (lines, hashes, paths, includes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
