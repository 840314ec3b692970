#!/usr/bin/env python3
"""Checks the Markdown links of README.md, docs/ and bench/HISTORY.md: every relative link must
name a file of the repository, and a #fragment a heading of that file (GitHub's anchor rule).
Also refuses absolute paths outside the repository (under the work, root, home or tmp top-level folders)
and checks that the README's map of docs/ links every docs/*.md.
Usage, from the repository root: python3 tools/check_doc_links.py   (exit 1 on a broken link)"""
import os, re, sys

def anchors(path):
    out, fence = set(), False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            fence = not fence
        if not fence and line.startswith("#"):
            t = line.lstrip("#").strip().lower()
            t = re.sub(r"[^\w\- ]", "", t).replace(" ", "-")
            out.add(t)
    return out

files = ["README.md", "bench/HISTORY.md"] + sorted("docs/" + f for f in os.listdir("docs") if f.endswith(".md"))
bad = 0
for f in files:
    text = open(f, encoding="utf-8").read()
    body = re.sub(r"```.*?```", "", text, flags=re.S)
    for m in re.finditer(r"\]\(([^)\s]+)\)", body):
        href = m.group(1)
        if re.match(r"[a-z]+://|mailto:", href):
            continue
        target, _, frag = href.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(f), target)) if target else f
        if not os.path.exists(dest):
            print(f"{f}: link to a missing file: {href}"); bad += 1
        elif frag and dest.endswith(".md") and frag not in anchors(dest):
            print(f"{f}: no heading for #{frag} in {dest}"); bad += 1
    for m in re.finditer(r"(?<![\w.])/(work|root|home|tmp)\b[^\s`)]*", text):
        print(f"{f}: a path outside the repository: {m.group(0)}"); bad += 1
readme = open("README.md", encoding="utf-8").read()
for f in files:
    if f.startswith("docs/") and f"]({f})" not in readme:
        print(f"README.md: the map of docs/ does not link {f}"); bad += 1
print(f"{len(files)} files checked, {bad} problems")
sys.exit(1 if bad else 0)
