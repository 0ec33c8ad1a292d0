#!/usr/bin/env bash
# Usage: tools/build-progress.sh OUT PACKAGE [go build flags...]
#
# Runs `go build -v -o OUT PACKAGE` and says how far it is: out of the
# packages PACKAGE may need, how many were compiled. A cold `make demo`
# compiles about 1,400 of them for minutes; a warm one, none. On a
# terminal it is one line, redrawn; elsewhere (CI logs) a line every 10%.
# What is not a package name (a compiler error) is printed as it comes.
set -euo pipefail
out="$1" pkg="$2"
shift 2

total="$(go list -deps "$@" "$pkg" | wc -l)"
compiled=0 reported=0 status=1
while IFS= read -r line; do
  if [[ "$line" =~ ^build-progress:\ go\ build\ exited\ ([0-9]+)$ ]]; then
    status="${BASH_REMATCH[1]}"
  elif [[ "$line" =~ ^[A-Za-z0-9._/~-]+$ ]]; then
    compiled=$((compiled + 1))
    if [ -t 1 ]; then
      printf '\r  %s: compiled %d of the %d packages it may need' "$pkg" "$compiled" "$total"
    elif [ $((compiled * 10 / total)) -gt "$reported" ]; then
      reported=$((compiled * 10 / total))
      printf '  %s: compiled %d of the %d packages it may need\n' "$pkg" "$compiled" "$total"
    fi
  else
    printf '\n%s\n' "$line"
  fi
done < <(
  status=0
  go build -v -o "$out" "$@" "$pkg" 2>&1 || status=$?
  echo "build-progress: go build exited $status"
)
if [ "$compiled" -gt 0 ]; then
  if [ -t 1 ]; then echo; else echo "  $pkg: compiled $compiled packages"; fi
fi
exit "$status"
