"""Build hpcrep's compiled allreduce op against the installed TensorFlow and MPI.

``python -m hpcrep.tensorflow.native.build`` compiles the C++ sources next to it (every ``*.cc``,
one object each, in parallel) and links them into ``_hpcrep_ops.<mpi>.so`` with the MPI C++
compiler wrapper (``mpicxx``: the one mpi4py was built with, else the one beside this Python, else
the one on ``PATH``) and TensorFlow's own compile and link flags (``tf.sysconfig``); no CMake.
``<mpi>`` names the MPI that this Python's mpi4py loads (:func:`hpcrep.comm.world.mpi_flavour`:
``openmpi4``, ``openmpi5``, ...), so one checkout holds a build per MPI (``.venv``'s Open MPI 4.1
and ``.venv-ulfm``'s Open MPI 5 each load their own). It writes ``_hpcrep_ops.<mpi>.json``
recording the TensorFlow version, the MPI and the hash of every source and header, which the loader
checks, so a library built for another TensorFlow, another MPI or from other sources is never
loaded. ``make install`` (and ``make ulfm`` for Open MPI 5) runs this; it exits 0 with a message
when no compiler or headers are found (hpcrep then uses its Python path) unless ``--require`` is
given.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Optional

HERE = os.path.dirname(os.path.abspath(__file__))


def running_mpi() -> tuple[str, str]:
    """Return (flavour, version line) of the MPI this Python's mpi4py loads. Local; does not
    initialise MPI when nothing has yet."""
    import mpi4py  # noqa: PLC0415

    if "mpi4py.MPI" not in sys.modules:
        mpi4py.rc.initialize = False  # MPI_Get_library_version is allowed before MPI_Init
    from hpcrep.comm import world  # noqa: PLC0415

    version = world.mpi_library_version()
    return world.mpi_flavour(version), version


def library_path(flavour: str) -> str:
    """Return the path of the op's library built for MPI ``flavour``."""
    return os.path.join(HERE, f"_hpcrep_ops.{flavour}.so")


def stamp_path(flavour: str) -> str:
    """Return the path of the stamp (JSON) of the library built for MPI ``flavour``."""
    return os.path.join(HERE, f"_hpcrep_ops.{flavour}.json")


def sources() -> list[str]:
    """Return the paths of the op's C++ sources and headers, sorted."""
    return sorted(glob.glob(os.path.join(HERE, "*.cc")) + glob.glob(os.path.join(HERE, "*.h")))


def source_hash() -> str:
    """Return the SHA-256 over every source and header, names included (what the stamp records)."""
    digest = hashlib.sha256()
    for path in sources():
        with open(path, "rb") as f:
            content = f.read()
        digest.update(f"{os.path.basename(path)} {len(content)}\n".encode())
        digest.update(content)
    return digest.hexdigest()


def find_mpicxx() -> Optional[str]:
    """Return the MPI C++ wrapper matching mpi4py's MPI, or None."""
    candidates = []
    try:
        import mpi4py  # noqa: PLC0415

        config = mpi4py.get_config()
        for key in ("mpicxx", "mpicc"):
            if config.get(key):
                candidates.append(config[key].split()[0].replace("mpicc", "mpicxx"))
    except ImportError:
        pass
    candidates.append(os.path.join(os.path.dirname(sys.executable), "mpicxx"))
    candidates.append("mpicxx")
    for c in candidates:
        path = shutil.which(c)
        if path:
            return path
    return None


def build(require: bool = False, verbose: bool = False) -> int:
    """Compile the op; return 0 on success or when skipping is allowed, 1 otherwise."""
    import tensorflow as tf  # noqa: PLC0415

    def skip(reason: str) -> int:
        print(f"hpcrep native: not built ({reason}); hpcrep uses its Python path.",
              file=sys.stderr)
        return 1 if require else 0

    flavour, mpi_version = running_mpi()
    mpicxx = find_mpicxx()
    if mpicxx is None:
        return skip("no MPI C++ compiler wrapper (mpicxx) found; install libopenmpi-dev")
    include = tf.sysconfig.get_include()
    if not os.path.exists(os.path.join(include, "tensorflow", "core", "framework", "op.h")):
        return skip(f"TensorFlow headers missing under {include}")
    compile_flags = ([mpicxx, "-c", "-fPIC", "-O2", "-std=c++17", "-w", f"-I{HERE}"]
                     + [f for f in tf.sysconfig.get_compile_flags() if not f.startswith("--std")])
    with tempfile.TemporaryDirectory(prefix="hpcrep-native-") as objects:
        units = [p for p in sources() if p.endswith(".cc")]
        commands = [compile_flags + [p, "-o", os.path.join(objects, os.path.basename(p) + ".o")]
                    for p in units]
        for cmd in commands if verbose else ():
            print(" ".join(cmd))
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            results = list(pool.map(lambda c: subprocess.run(c, capture_output=True, text=True),
                                    commands))
        failed = [(p, r) for p, r in zip(units, results) if r.returncode != 0]
        if failed:
            for path, result in failed:
                print(f"{os.path.basename(path)}:\n{result.stderr[-4000:]}", file=sys.stderr)
            return skip(f"compilation failed ({mpicxx})")
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=HERE)
        os.close(fd)
        link = ([mpicxx, "-shared", "-fPIC", "-o", tmp]
                + [c[-1] for c in commands] + tf.sysconfig.get_link_flags())
        if verbose:
            print(" ".join(link))
        result = subprocess.run(link, capture_output=True, text=True)
        if result.returncode != 0:
            os.unlink(tmp)
            print(result.stderr[-4000:], file=sys.stderr)
            return skip(f"linking failed ({mpicxx})")
    library, stamp_file = library_path(flavour), stamp_path(flavour)
    os.replace(tmp, library)  # atomic: a running process keeps the old inode
    stamp = {"tensorflow": tf.__version__, "source": source_hash(), "mpicxx": mpicxx,
             "mpi": flavour, "mpi_version": mpi_version}
    with open(stamp_file + ".tmp", "w") as f:
        json.dump(stamp, f)
    os.replace(stamp_file + ".tmp", stamp_file)
    print(f"hpcrep native: built {library} for TensorFlow {tf.__version__} and {mpi_version} "
          f"with {mpicxx}")
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--require", action="store_true",
                        help="fail (exit 1) instead of skipping when the op cannot be built")
    parser.add_argument("--verbose", action="store_true", help="print the compiler command")
    args = parser.parse_args(argv)
    return build(args.require, args.verbose)


if __name__ == "__main__":
    sys.exit(main())
