#!/usr/bin/env bash
# Checks cohort's C++ style; exits non-zero on any violation (CI runs it first, .ci/run).
#
#   ./scripts/lint.sh            both checks below
#   ./scripts/lint.sh --format   only the formatting check
#   ./scripts/lint.sh --names    only the naming check
#   ./scripts/lint.sh --help
#
# 1. Formatting: clang-format 14 with the root .clang-format, --dry-run -Werror, on every C++ file
#    of the repository (git ls-files '*.h' '*.cc', untracked ones too). Fix: clang-format-14 -i <file>...
# 2. Names: clang-tidy 14's readability-identifier-naming alone (its options come from .clang-tidy)
#    on the C++ files a change touches: those that differ between the base and the working tree,
#    plus untracked ones. The base is COHORT_LINT_BASE when set, else the merge-base with
#    origin/main when that branch exists, else HEAD~1; with no base (a first commit) the check is
#    skipped, and says so. clang-tidy reads build/compile_commands.json (COHORT_BUILD_DIR
#    overrides build/); a missing one is made by configuring the build (scripts/configure.sh, no
#    compiling).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

do_format=1
do_names=1
case "${1:-}" in
  "") ;;
  --format) do_names=0 ;;
  --names) do_format=0 ;;
  -h | --help)
    sed -n '2,17p' "$0"
    exit 0
    ;;
  *)
    echo "lint.sh: unknown argument '$1' (see --help)" >&2
    exit 2
    ;;
esac
if [[ $# -gt 1 ]]; then
  echo "lint.sh: one argument at most (see --help)" >&2
  exit 2
fi

# The tools, by their versioned names first: the style file is written for clang-format 14.
find_tool() {
  local t
  for t in "$1-14" "$1"; do
    if command -v "$t" >/dev/null; then
      echo "$t"
      return 0
    fi
  done
  echo "lint.sh: $1 (14) is not installed; run ./scripts/setup.sh" >&2
  return 1
}

failed=0

if [[ $do_format -eq 1 ]]; then
  clang_format=$(find_tool clang-format)
  mapfile -t files < <(git ls-files --cached --others --exclude-standard -- '*.h' '*.cc' |
    while IFS= read -r f; do [[ -f "$f" ]] && echo "$f"; done)
  echo "lint.sh: clang-format: checking ${#files[@]} files ($($clang_format --version | head -1))"
  log=$(mktemp)
  trap 'rm -f "$log"' EXIT
  if printf '%s\0' "${files[@]}" | xargs -0 -n 50 "$clang_format" --style=file --dry-run -Werror >"$log" 2>&1; then
    echo "lint.sh: clang-format: OK"
  else
    cat "$log"
    mapfile -t bad < <(sed -n 's/^\([^:]*\):[0-9]*:[0-9]*: error: code should be clang-formatted.*/\1/p' "$log" | sort -u)
    echo "lint.sh: clang-format: FAILED: ${#bad[@]} file(s) are not formatted as .clang-format says:" >&2
    printf '  %s\n' "${bad[@]}" >&2
    echo "lint.sh: fix with: $clang_format -i ${bad[*]}" >&2
    failed=1
  fi
fi

if [[ $do_names -eq 1 ]]; then
  clang_tidy=$(find_tool clang-tidy)
  base=""
  if [[ -n "${COHORT_LINT_BASE:-}" ]]; then
    base=$(git rev-parse --verify --quiet "${COHORT_LINT_BASE}^{commit}") || {
      echo "lint.sh: COHORT_LINT_BASE='$COHORT_LINT_BASE' is not a commit" >&2
      exit 2
    }
    why="COHORT_LINT_BASE=$COHORT_LINT_BASE"
  elif git rev-parse --verify --quiet origin/main >/dev/null && base=$(git merge-base HEAD origin/main 2>/dev/null); then
    why="the merge-base with origin/main"
  elif base=$(git rev-parse --verify --quiet 'HEAD~1^{commit}'); then
    why="HEAD~1"
  else
    base=""
  fi

  if [[ -z "$base" ]]; then
    echo "lint.sh: names: skipped: no base to compare with (a first commit, no origin/main, no COHORT_LINT_BASE)"
  else
    mapfile -t changed < <({
      git diff --name-only --diff-filter=d "$base" -- '*.h' '*.cc'
      git ls-files --others --exclude-standard -- '*.h' '*.cc'
    } | sort -u)
    echo "lint.sh: names: ${#changed[@]} changed C++ file(s) against $why ($(git rev-parse --short "$base"))"
    if [[ ${#changed[@]} -gt 0 ]]; then
      build=${COHORT_BUILD_DIR:-build}
      if [[ ! -f "$build/compile_commands.json" ]]; then
        echo "lint.sh: names: $build/compile_commands.json is missing: configuring $build (no compiling)"
        source scripts/configure.sh
        cohort_configure "$build" >/dev/null
      fi
      # Only the naming rule, with .clang-tidy's options; compiler warnings off (-w: the build
      # judges those). Headers are checked as their own translation units (clang-tidy infers
      # their flags from the sources beside them), and only the named files report (the header
      # filter matches nothing), so each changed file is checked once.
      tidy=("$clang_tidy" -p "$build" --quiet --checks='-*,readability-identifier-naming'
        --header-filter='^$' --extra-arg=-w)
      names_failed=0
      for f in "${changed[@]}"; do
        status=0
        out=$("${tidy[@]}" "$f" 2>&1) || status=$?
        if grep -q '\[readability-identifier-naming\]' <<<"$out"; then
          grep -v -E '^[0-9]+ (warning|error)s? (generated|treated as errors)\.?$' <<<"$out" >&2
          echo "lint.sh: names: FAILED: $f" >&2
          names_failed=1
        elif grep -q '\[clang-diagnostic-error\]' <<<"$out"; then
          # clang 14 rejects a little of the C++20 that GCC 12 builds (lambdas capturing
          # structured bindings, say); the names in everything else were still checked.
          echo "lint.sh: names: note: clang-tidy 14 could not parse all of $f; its other names were checked:"
          grep -E 'error: .*\[clang-diagnostic-error\]' <<<"$out" | sed 's/^/  /'
        elif [[ $status -ne 0 ]]; then
          echo "$out" >&2
          echo "lint.sh: names: FAILED: clang-tidy could not check $f (exit status $status)" >&2
          names_failed=1
        fi
      done
      if [[ $names_failed -eq 0 ]]; then
        echo "lint.sh: names: OK"
      else
        echo "lint.sh: names: FAILED: names must follow .clang-tidy's readability-identifier-naming rules" >&2
        failed=1
      fi
    fi
  fi
fi

if [[ $failed -ne 0 ]]; then
  echo "lint.sh: FAILED" >&2
  exit 1
fi
echo "lint.sh: all checks passed"
