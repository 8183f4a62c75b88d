#!/usr/bin/env bash
# Build hpcrep's compiled allreduce op for the MPI that VENV's mpi4py loads, when it is missing or
# was built for another TensorFlow, MPI or source (python -m hpcrep.tensorflow.native.build; one
# library per MPI: _hpcrep_ops.openmpi4.so for .venv, _hpcrep_ops.openmpi5.so for .venv-ulfm).
# A build that cannot be done leaves hpcrep on its Python path (said, not an error).
#   tools/native.sh VENV
set -euo pipefail
VENV=${1:?usage: tools/native.sh VENV}
quiet() { grep -av "^I0000\|^WARNING: All log\|cpu_feature_guard\|^To enable the following" || true; }
if ! TF_CPP_MIN_LOG_LEVEL=3 "$VENV/bin/python" -c "import sys; from hpcrep.tensorflow import native; sys.exit(native._unavailable_reason() is not None)" 2>/dev/null; then
  echo "native: building hpcrep's compiled allreduce op for $VENV (python -m hpcrep.tensorflow.native.build)"
  TF_CPP_MIN_LOG_LEVEL=3 "$VENV/bin/python" -m hpcrep.tensorflow.native.build 2>&1 | quiet
fi
