#!/usr/bin/env bash
# The batch CLI's local mode at two revisions, interleaved in one call (issue 37's CPU proxy):
#   bash bench/cli_local_ab.sh BEFORE_REV AFTER_REV     (FILES=1000 ROUNDS=6 by default)
# Each revision is unpacked (git archive) into a folder of its own; each run is bench/cli_local_tree.py
# there (bench/cli_local.py's no-op engine: all but the model; FILES x 10 s WAV made once, txt+srt),
# the order alternated per round. Prints a line per run and the medians (wall and CPU seconds).
set -euo pipefail
BEFORE=${1:?before revision} AFTER=${2:?after revision}
FILES=${FILES:-1000} ROUNDS=${ROUNDS:-6}
PY=${PY:-$(pwd)/.venv/bin/python}
TREE_RUN=$(pwd)/bench/cli_local_tree.py  # this checkout's driver, run on each revision's tree
TMP=$(mktemp -d /tmp/cli-ab-XXXX)
trap 'rm -rf "$TMP"' EXIT
for rev in "$BEFORE" "$AFTER"; do mkdir -p "$TMP/$rev" && git archive "$rev" | tar -x -C "$TMP/$rev"; done
"$PY" -c "import sys; sys.path.insert(0, '$TMP/$AFTER')
from pathlib import Path; from bench.cli_local import make_files; make_files(Path('$TMP/src'), $FILES, 10.0)"
for round in $(seq 1 "$ROUNDS"); do
  if [ $((round % 2)) = 1 ]; then order="$BEFORE $AFTER"; else order="$AFTER $BEFORE"; fi
  for rev in $order; do
    rm -rf "$TMP/out"; mkdir -p "$TMP/out"
    echo "round $round $rev $("$PY" "$TREE_RUN" "$TMP/$rev" "$TMP/src" "$TMP/out" 2>&1 | grep '^files')"
  done
done | tee "$TMP/runs.txt"
"$PY" - "$TMP/runs.txt" <<'PYEOF'
import re, statistics as st, sys
runs = {}
for line in open(sys.argv[1]):
    m = re.search(r"round \d+ (\S+) files (\d+) start wall [\d.]+ cpu ([\d.]+) \| work wall ([\d.]+) cpu ([\d.]+)", line)
    if m:
        runs.setdefault(m[1], []).append((int(m[2]), float(m[3]), float(m[4]), float(m[5])))
for rev, rs in runs.items():
    print(f"{rev}: {len(rs)} runs, median files/s of work {st.median(n / w for n, _, w, _ in rs):.0f}, "
          f"work wall {st.median(w for _, _, w, _ in rs):.2f} s, work CPU {st.median(c for *_, c in rs):.2f} s, "
          f"start-up CPU {st.median(s for _, s, _, _ in rs):.2f} s")
PYEOF
