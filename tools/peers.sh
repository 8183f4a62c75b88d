#!/usr/bin/env bash
# Build the benchmark's peers into ./.venv-peers (make peers): Horovod 0.28.1 from its sdist,
# against the same TensorFlow, Keras, mpi4py, numpy and h5py as ./.venv, with hpcrep installed
# editable, so `hpcrep bench` can run its 'horovod' synchroniser under .venv-peers/bin/python.
#
# Horovod 0.28.1 predates TF 2.16/Keras 3; against TF 2.21 it needs two source edits
#   horovod/tensorflow/xla_mpi_ops.cc:     #if TENSORFLOW_VERSION >= 2006000000  -> ... && HAVE_GPU
#   horovod/tensorflow/keras/callbacks.py: from keras import backend as K        -> K = keras.backend
# and, with GCC 12+, CXXFLAGS that include the standard headers its sources forget. Its Keras
# integration needs tf_keras (installed with --no-deps) and TF_USE_LEGACY_KERAS=1 at run time;
# horovod.tensorflow (grouped_allreduce, used by the benchmark) works on Keras 3 as it is.
#
# Idempotent: a stamp records what was built against (.venv's pinned versions, the recipe);
# when nothing changed it exits at once. About 5 minutes on 2 cores the first time.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/apt.sh
VENV=.venv-peers
HOROVOD_VERSION=0.28.1
RECIPE=1  # bump when the build below changes, so built trees are rebuilt
STAMP=$VENV/.peers-built

if [ ! -x .venv/bin/python ]; then
  echo "peers: .venv is missing: run 'make install' first" >&2
  exit 1
fi

# One build at a time: a second `make peers` waits for the first, then finds it up to date.
mkdir -p "$VENV"
exec 9>"$VENV/.lock"
flock 9

# What .venv holds (pins for the peers venv) and what is built: the stamp's content.
constraints=$(.venv/bin/python -m pip freeze --exclude-editable --disable-pip-version-check \
              | grep -v -E '^(#|-e |hpcrep)' | sort)
want=$(printf '%s\n%s\n' "horovod==$HOROVOD_VERSION recipe=$RECIPE" "$constraints")
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] \
   && "$VENV/bin/python" -c "import horovod" 2>/dev/null; then
  echo "peers: $VENV is up to date (Horovod $HOROVOD_VERSION)"
  exit 0
fi
rm -f "$STAMP"

# A C++ toolchain, CMake and MPI headers (root only; otherwise they must be there already).
apt_install_missing peers cmake g++ openmpi-bin libopenmpi-dev
for tool in cmake g++ mpicxx; do
  command -v "$tool" >/dev/null || { echo "peers: $tool not found (as root, make peers installs it)" >&2; exit 1; }
done

if [ ! -x "$VENV/bin/python" ]; then
  base=$(.venv/bin/python -c 'import sys; print(sys._base_executable)')
  echo "peers: creating $VENV with $("$base" --version)"
  "$base" -m venv "$VENV"
fi
pins=$(mktemp)
trap 'rm -f "$pins"' EXIT
printf '%s\n' "$constraints" > "$pins"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
echo "peers: pip install -e .[tensorflow,bench] with .venv's versions (cached wheels are quick)"
"${PIP[@]}" install -q -c "$pins" -e ".[tensorflow,bench]" setuptools wheel packaging \
  cloudpickle psutil pyyaml
tf_version=$("$VENV/bin/python" -c 'from importlib.metadata import version; print(version("tensorflow-cpu"))')
"${PIP[@]}" install -q --no-deps "tf_keras==${tf_version%.*}.*"

src=$VENV/src
mkdir -p "$src"
if [ ! -f "$src/horovod-$HOROVOD_VERSION.tar.gz" ]; then
  echo "peers: downloading the Horovod $HOROVOD_VERSION sdist"
  "${PIP[@]}" download -q --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$src"
fi
rm -rf "$src/horovod-$HOROVOD_VERSION"
tar xzf "$src/horovod-$HOROVOD_VERSION.tar.gz" -C "$src"
tree=$src/horovod-$HOROVOD_VERSION

# The two edits; each must change exactly the line it names, or the build stops here.
edit() {  # file old new
  local file=$tree/$1
  grep -qxF -- "$2" "$file" || { echo "peers: '$2' not found in $1: the sdist changed" >&2; exit 1; }
  OLD=$2 NEW=$3 "$VENV/bin/python" - "$file" <<'EOF'
import os, sys
path = sys.argv[1]
lines = open(path).read().split("\n")
lines = [os.environ["NEW"] if line == os.environ["OLD"] else line for line in lines]
open(path, "w").write("\n".join(lines))
EOF
}
edit horovod/tensorflow/xla_mpi_ops.cc "#if TENSORFLOW_VERSION >= 2006000000" \
     "#if TENSORFLOW_VERSION >= 2006000000 && HAVE_GPU"
edit horovod/tensorflow/keras/callbacks.py "    from keras import backend as K" \
     "    K = keras.backend"

echo "peers: building Horovod $HOROVOD_VERSION against TensorFlow $tf_version (about 5 min on 2 cores)"
start=$(date +%s)
log=$VENV/horovod-build.log
if ! CXXFLAGS="-include stdexcept -include string -include cstdint -include memory" \
     MAKEFLAGS="-j$(nproc)" \
     HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 \
     HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_GLOO=1 \
     "${PIP[@]}" install -v --no-build-isolation --no-deps "./$tree" > "$log" 2>&1; then
  tail -30 "$log" >&2
  echo "peers: Horovod build failed; full log in $log" >&2
  exit 1
fi
echo "peers: built in $(( $(date +%s) - start )) s"

# Check what the benchmark uses: horovod.tensorflow with MPI, and the legacy-Keras face.
TF_CPP_MIN_LOG_LEVEL=3 "$VENV/bin/python" - <<'EOF'
import horovod
import horovod.tensorflow as hvd
hvd.init()
assert hvd.mpi_built() and hvd.mpi_enabled(), "Horovod was built without MPI"
import tensorflow as tf
out = hvd.grouped_allreduce([tf.ones(3), tf.ones(2)], op=hvd.Average)
assert [float(t.numpy().sum()) for t in out] == [3.0, 2.0], out
print(f"peers: horovod {horovod.__version__} imports, MPI built, grouped_allreduce works")
EOF
TF_USE_LEGACY_KERAS=1 TF_CPP_MIN_LOG_LEVEL=3 "$VENV/bin/python" -c \
  "import horovod.tensorflow.keras as h; print('peers: horovod.tensorflow.keras imports with TF_USE_LEGACY_KERAS=1')"
printf '%s\n' "$want" > "$STAMP"
echo "peers: $VENV ready; make bench now times Horovod too"
