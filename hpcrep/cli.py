"""The ``hpcrep`` command: one dispatcher, one module per subcommand.

Each subcommand lives in its own module that defines ``configure(parser)`` (add arguments to an
``argparse`` sub-parser) and ``main(args) -> int``. :func:`build_parser` imports every
subcommand's module to add its arguments (none of them imports TensorFlow at module level); a
module that cannot be imported because a dependency of its own is missing is left out, so a
missing optional dependency breaks only its command. A module that also defines
``forward(name, argv) -> int`` gets its arguments unparsed (``hpcrep bench`` and ``hpcrep report``
hand them to the benchmark of the source checkout, which hpcrep never imports:
:mod:`hpcrep.launch.checkout`).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Optional, Sequence

# command name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("hpcrep.launch.run_command", "run a script on N ranks (mpirun, or srun inside Slurm)"),
    "slurm": ("hpcrep.slurm.command", "render or submit a Slurm batch script"),
    "data": ("hpcrep.data.command", "convert arrays or Fashion-MNIST to sharded HDF5"),
    "bench": ("hpcrep.launch.checkout", "run the scaling benchmark of the source checkout"),
    "report": ("hpcrep.launch.checkout", "re-render a benchmark report from its JSON"),
    "analyze": ("hpcrep.analysis.command", "compute, exposed communication, overlap and "
                "stragglers of a timeline (HPCREP_TIMELINE)"),
    "doctor": ("hpcrep.launch.doctor.command", "check this site before a job: MPI, compiled op, "
               "ULFM, Slurm, cores, network, a 2-rank allreduce"),
}


def build_parser() -> argparse.ArgumentParser:
    """Return the top-level parser with every subcommand whose module imports."""
    parser = argparse.ArgumentParser(prog="hpcrep", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        p.set_defaults(_module=module_name)
        module = _load(module_name)
        if module is not None:
            module.configure(p)
    return parser


def _load(module_name: str):
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            return None  # command not built yet
        raise


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``hpcrep`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in COMMANDS:
        module = _load(COMMANDS[argv[0]][0])
        if module is not None and hasattr(module, "forward"):
            return int(module.forward(argv[0], argv[1:]))
    args = build_parser().parse_args(argv)
    module = _load(args._module)
    if module is None:
        print(f"hpcrep {args.command}: not available in this installation", file=sys.stderr)
        return 2
    return int(module.main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
