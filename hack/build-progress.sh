#!/usr/bin/env bash
# build-progress.sh OUT PKG: go build PKG into OUT, saying what it does as it goes. A first build
# from a fresh clone downloads the Go modules and compiles client-go, minutes on 2 cores; a
# screen of `go: downloading` lines followed by minutes of silence looks like a hang, so this
# prints one line per phase and a line every 50 packages compiled instead. Errors pass through
# unchanged; the exit status is go build's.
set -uo pipefail
GO=${GO:-go}
out=$1 pkg=$2
start=$SECONDS

# Listing the dependencies fetches the modules they come from (go: downloading ... on stderr).
echo "building $out from $pkg"
deps=$("$GO" list -deps "$pkg" 2> >(awk '
  /^go: downloading / { if (!d++) { print "  downloading Go modules (first run only)..."; fflush() }; next }
  { print; fflush() }
  END { if (d) printf "  downloaded %d modules\n", d }' >&2)) || exit $?
total=$(printf '%s\n' "$deps" | grep -c .)

echo "  compiling (up to $total packages; seconds when they are cached)..."
"$GO" build -v -o "$out" "$pkg" 2>&1 | {
  n=0
  while IFS= read -r line; do
    case $line in
    *[[:space:]:]*) printf '%s\n' "$line" ;; # an error or a go: message, not a package name
    *)
      n=$((n + 1))
      if ((n % 50 == 0)); then echo "  compiled $n of up to $total packages ($((SECONDS - start))s)"; fi
      ;;
    esac
  done
}
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] && echo "built $out in $((SECONDS - start))s"
exit "$rc"
