#!/bin/sh
# The README's program is examples/minimal.c, byte for byte: the first ```c block under
# "## The API in a short program" in README.md must equal the file. Then runs the command
# it is given (make test: ./build/minimal data/tiny/e2b_like), so the program shown is the
# program built and run; tools/check_doc_links.py checks the docs' links too.   Usage: sh tools/check_readme_program.sh [COMMAND ARGS...]
set -e
out=$(mktemp)
trap 'rm -f "$out"' EXIT
awk '/^## The API in a short program/ { f = 1; next }
     f && /^## / { exit }
     f && !p && /^```c$/ { p = 1; next }
     p && /^```$/ { exit }
     p' README.md > "$out"
if [ ! -s "$out" ]; then
  echo "README.md: no \`\`\`c block under '## The API in a short program'"; exit 1
fi
if ! cmp -s "$out" examples/minimal.c; then
  echo "README.md's program differs from examples/minimal.c (diff README file):"
  diff "$out" examples/minimal.c || true
  exit 1
fi
echo "README.md's program is examples/minimal.c ($(wc -l < examples/minimal.c) lines)"
# and the links of README.md, docs/ and bench/HISTORY.md resolve (needs python3)
if command -v python3 >/dev/null; then python3 tools/check_doc_links.py
else echo "python3 absent: the links of the docs were not checked"; fi
if [ $# -gt 0 ]; then exec "$@"; fi
