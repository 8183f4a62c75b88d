"""Reading a merged timeline (``HPCREP_TIMELINE``): where each step's time went.

:mod:`hpcrep.analysis.trace` computes, from the Chrome-trace file rank 0 wrote, per step and rank
the compute time, the exposed communication, the overlap fraction, bytes and bandwidth per
collective and a straggler score per rank; :mod:`hpcrep.analysis.command` is ``hpcrep
analyze``; :mod:`hpcrep.analysis.plot` draws the PNG. numpy and matplotlib only: no TensorFlow.
"""

from hpcrep.analysis.trace import Analysis, StepFigures, analyze, load

__all__ = ["Analysis", "StepFigures", "analyze", "load"]
