# Shared by the side-by-side benchmark scripts (bench_pipeline.sh, bench_dist_autograd.sh,
# bench_rpc.sh): building the one bench target, finding PyTorch, the header line, and collecting
# the JSON lines the programs print. Sourced, not run; set `root` first.
# shellcheck shell=bash

# Configures $1 (a build folder) when it has never been configured, then builds target $2.
bench_build() {
  local build="$1" target="$2"
  if [[ ! -f "$build/CMakeCache.txt" ]]; then
    # shellcheck source=scripts/configure.sh
    source "$root/scripts/configure.sh"
    cohort_configure "$build" >/dev/null
  fi
  nice -n 19 cmake --build "$build" -j "${JOBS:-1}" --target "$target"
}

# Prints 1 when PyTorch's side should run: NO_TORCH unset and $1 (a Python) imports module $2;
# else 0, saying why on stderr under the script's name $3.
bench_with_torch() {
  local py="$1" module="$2" name="$3"
  if [[ -n "${NO_TORCH:-}" ]]; then
    echo 0
  elif ! "$py" -c "import $module" 2>/dev/null; then
    echo "$name: $py has no $module; printing cohort's figures alone" >&2
    echo 0
  else
    echo 1
  fi
}

# The run's first line: when, on how many cores, under which load, at which commit.
bench_header() {
  echo "# $(date -u '+%F %T UTC'), $(nproc --all) cores, load $(cut -d' ' -f1-3 /proc/loadavg), commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
}

# Runs a program: its JSON lines ({...}) are echoed and appended to $results, with BENCH_EXTRA
# (when set, e.g. ', "round": 2') added inside each object; its other lines go to stderr.
bench_run() {
  "$@" | while IFS= read -r line; do
    [[ "$line" == \{* ]] || { echo "$line" >&2; continue; }
    if [[ -n "${BENCH_EXTRA:-}" ]]; then line="${line%\}}${BENCH_EXTRA}}"; fi
    echo "$line" | tee -a "$results"
  done
}
