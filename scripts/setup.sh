#!/usr/bin/env bash
# Installs every Debian (12, bookworm) package cohort's build, tests, examples and benchmarks need,
# then TensorBoard from PyPI into a virtual environment (below).
# Idempotent and quick when everything is present: dpkg-query decides, and apt-get runs only when
# something is missing. Needs root (or sudo) only in that case.
set -euo pipefail

packages=(
  # toolchain
  build-essential cmake ninja-build ccache
  # core: BLAS (OpenBLAS loaded at run time, cblas.h at build time), fmt, JSON, CLI parsing
  libopenblas-dev libfmt-dev nlohmann-json3-dev libcli11-dev
  # core: float32 GEMM through oneDNN's dnnl_sgemm, bfloat16 GEMM through its matmul primitive
  # (loaded at run time; without it cohort falls back to OpenBLAS and widens half types to float32,
  # see core/blas/blas.h and docs/benchmarks.md "GEMM"); the -dev package gives the C API's types
  libdnnl2 libdnnl-dev
  # tests
  libgtest-dev
  # PyTorch reference checks (run with /usr/bin/python3)
  python3 python3-torch python3-numpy
  # io::SummaryWriter (TensorBoard event files): protoc compiles core/io/proto/ at build time for
  # the protobuf lite runtime, linked privately into libcohort_core; python3-venv makes the
  # TensorBoard virtual environment the tests read the files back with
  libprotobuf-dev protobuf-compiler python3-venv
  # benchmark comparison (GEMM against BLIS as well as OpenBLAS)
  libblis-dev
  # distributed layers: gloo and MPI backends, TCP store on Boost.Asio, TensorPipe RPC agent
  libgloo-dev libopenmpi-dev openmpi-bin libboost-dev libtensorpipe-dev
  # RPC: HMAC-SHA256 and nonces for the hello's proof of the shared secret (rpc/hello_auth.h)
  libssl-dev
  # launcher tests (network namespaces)
  iproute2
  # a one-node Slurm for the Slurm test (scripts/slurm/local_cluster.sh; it runs with auth/none,
  # so munge comes along as a dependency but is never started)
  slurmctld slurmd slurm-client
  # scripts/lint.sh: formatting (the root .clang-format is written for 14) and the naming rules
  clang-format-14 clang-tidy-14
)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "installed" ]] || missing+=("$p")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup.sh: all ${#packages[@]} packages are installed"
else
  echo "setup.sh: installing ${missing[*]}"
  sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null; then
      sudo=(sudo)
    else
      echo "setup.sh: missing packages (${missing[*]}) and not root; run as root or install them" >&2
      exit 1
    fi
  fi
  export DEBIAN_FRONTEND=noninteractive
  # Another apt-get (a second checkout's setup, say) may hold the dpkg lock: wait for it.
  apt=("${sudo[@]}" apt-get -o DPkg::Lock::Timeout=600 -q)
  "${apt[@]}" update
  "${apt[@]}" install -y --no-install-recommends "${missing[@]}"
fi

# TensorBoard (PyPI, pinned in scripts/tensorboard-requirements.txt) in a virtual environment of
# its own, outside the checkout so that every clone and build shares it: the tests read the event
# files io::SummaryWriter writes with TensorBoard's own reader, and `$venv/bin/tensorboard --logdir
# DIR` shows a run. COHORT_PY_VENV names another place (set it for the build and the tests too).
# Made again only when the requirements file changed since; offline, setup.sh goes on and those
# tests skip, saying why.
venv=${COHORT_PY_VENV:-$HOME/.cache/cohort/tb-venv}
requirements=$(dirname "${BASH_SOURCE[0]}")/tensorboard-requirements.txt
stamp=$venv/.cohort-requirements
if [[ -x $venv/bin/python ]] && cmp -s "$requirements" "$stamp"; then
  echo "setup.sh: TensorBoard virtual environment at $venv is ready"
else
  echo "setup.sh: installing TensorBoard into the virtual environment at $venv"
  if /usr/bin/python3 -m venv "$venv" &&
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"; then
    cp "$requirements" "$stamp"
  else
    echo "setup.sh: could not install TensorBoard into $venv (offline?): the tests that read event" \
      "files with it will skip" >&2
  fi
fi
echo "setup.sh: done"
