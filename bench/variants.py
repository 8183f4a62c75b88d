"""The public API the jobs' training steps are written against, with each benchmark variant
swapped in underneath.

A job's step is written once, with hpcrep's public API: ``hvd.DistributedGradientTape(tape)``
(ResNet-50, D4PG's learner) or an optimizer wrapped by ``Replicator.wrap_optimizer`` (SN-GAN).
The job takes the tape or optimizer wrapper as a parameter (by default hpcrep's), and
:func:`variant` gives the same two names for each benchmarked mode:

- ``hpcrep``: ``hpcrep.tensorflow.DistributedGradientTape`` and ``DistributedOptimizer``
  themselves, what users run;
- ``nosync``: the plain tape and optimizer, and local batch-norm statistics (the upper bound);
- ``mpi4py``: the raw baseline of :mod:`bench.sync` (one hand-written in-place
  ``MPI_Allreduce`` of a flat numpy buffer), called from inside the compiled step through one
  ``tf.numpy_function``, its results consumed by the same graph;
- ``horovod``: ``horovod.tensorflow.DistributedGradientTape`` (its Keras optimizer needs
  ``tf_keras``, so optimizers average through :mod:`bench.sync`'s horovod synchroniser);
- ``hpcrep_powersgdR`` (:mod:`bench.modes`): hpcrep's wrappers with
  ``compression=hvd.Compression.powersgd(rank=R)``. A PowerSGD object keeps state for one set of
  variables and must be the same object every step, while a tape is made per step (or per trace):
  so the tape wrapper keeps one PowerSGD per distinct set of sources (:class:`PerSourcesTape`;
  D4PG's learner asks one tape for two sets, and the self-check's probe has variables of its
  own), and the optimizer wrapper gives each optimizer its own;
- ``hpcrep_autotune``: hpcrep's wrappers with ``HPCREP_AUTOTUNE=1`` in effect while their
  exchange is traced (hpcrep reads the setting then), set only around that call
  (:class:`SettingTape`, :func:`setting_optimizer`), so the other variants in the same process
  stay untuned.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence

import keras
import tensorflow as tf

from bench import modes as bench_modes
from bench.sync import MODES, average_arrays, make_synchronizer

Average = Callable[[list], list]


@dataclasses.dataclass(frozen=True)
class Variant:
    """What a benchmark mode puts under a job's step.

    Attributes:
        name: the mode (one of :data:`bench.sync.MODES`).
        DistributedGradientTape: ``tape -> tape`` whose ``gradient()`` averages across ranks.
        DistributedOptimizer: ``optimizer -> optimizer`` whose ``apply`` averages first.
        sync_batch_norm: whether batch-norm statistics span the ranks.
        compression_rank: PowerSGD's rank R for a compressing variant (its averages are exact
            only for gradients whose mean has rank R or less: :mod:`bench.selfcheck`), else
            None.
    """

    name: str
    DistributedGradientTape: Callable[[tf.GradientTape], Any]
    DistributedOptimizer: Callable[[keras.optimizers.Optimizer], Any]
    sync_batch_norm: bool = True
    compression_rank: Optional[int] = None


def variant(mode: str) -> Variant:
    """Return the tape and optimizer wrappers of ``mode``.

    Raises:
        ValueError: ``mode`` is not one of :data:`bench.sync.MODES` or :mod:`bench.modes`'s
            extra variants.
    """
    rank = bench_modes.powersgd_rank(mode)
    if rank is not None:
        return _powersgd_variant(mode, rank)
    if mode == bench_modes.AUTOTUNE:
        import hpcrep.tensorflow as hvd  # noqa: PLC0415

        return Variant(mode, lambda tape: SettingTape(
            hvd.DistributedGradientTape(tape), "HPCREP_AUTOTUNE", "1"),
                       lambda optimizer: setting_optimizer(
                           hvd.DistributedOptimizer(optimizer), "HPCREP_AUTOTUNE", "1"))
    if mode == "hpcrep":
        import hpcrep.tensorflow as hvd  # noqa: PLC0415

        return Variant(mode, hvd.DistributedGradientTape, hvd.DistributedOptimizer)
    if mode == "nosync":
        return Variant(mode, lambda tape: tape, lambda optimizer: optimizer, False)
    if mode == "mpi4py":
        return Variant(mode, lambda tape: AveragingTape(tape, raw_mpi_average),
                       lambda optimizer: averaging_optimizer(optimizer, raw_mpi_average))
    if mode == "horovod":
        import horovod.tensorflow as horovod  # noqa: PLC0415

        horovod.init()
        average = make_synchronizer("horovod")
        return Variant(mode, lambda tape: TensorFlowSourcesTape(
            horovod.DistributedGradientTape(tape)),
                       lambda optimizer: averaging_optimizer(optimizer, average))
    raise ValueError(f"unknown synchronisation mode {mode!r}; expected one of {', '.join(MODES)}, "
                     f"{bench_modes.POWERSGD_PREFIX}R or {bench_modes.AUTOTUNE}")


def _powersgd_variant(mode: str, rank: int) -> Variant:
    """hpcrep's wrappers with PowerSGD of ``rank``: one PowerSGD per set of sources (tape) or
    per optimizer, each made with :data:`bench.modes.POWERSGD_SEED`."""
    import hpcrep.tensorflow as hvd  # noqa: PLC0415

    def make() -> Any:
        return hvd.Compression.powersgd(rank, seed=bench_modes.POWERSGD_SEED)

    compressions: dict = {}  # shared by every tape this variant wraps: the state lives here
    return Variant(mode, lambda tape: PerSourcesTape(
        tape, lambda c: hvd.DistributedGradientTape(tape, compression=c), compressions, make),
                   lambda optimizer: hvd.DistributedOptimizer(optimizer, compression=make()),
                   compression_rank=rank)


class PerSourcesTape:
    """A recorded tape whose ``gradient()`` goes through ``wrap(compression)``, with one
    ``compression`` per distinct set of sources: made by ``make()`` the first time that set
    (the ordered :func:`hpcrep.tensorflow.variables.variable_key` of each source) is asked for,
    kept in ``compressions`` (shared between tapes, so the next step's tape finds it), then
    reused. For stateful compressions such as PowerSGD, whose one object serves one set of
    variables and must be the same object every step."""

    def __init__(self, tape: tf.GradientTape, wrap: Callable[[Any], Any],
                 compressions: dict, make: Callable[[], Any]) -> None:
        self._tape, self._wrap, self._compressions, self._make = tape, wrap, compressions, make

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 unconnected_gradients: Any = tf.UnconnectedGradients.NONE) -> Any:
        """The averaged gradients through ``wrap`` with this set of sources' compression.

        Collective: every rank must call this, in the same order, with matching sources.
        """
        key = sources_key(sources)
        if key not in self._compressions:
            self._compressions[key] = self._make()
        return self._wrap(self._compressions[key]).gradient(
            target, sources, output_gradients, unconnected_gradients)


def sources_key(sources: Any) -> tuple:
    """The identity of a set of gradient sources: each (flattened) source's
    :func:`hpcrep.tensorflow.variables.variable_key`, in order. Local."""
    from hpcrep.tensorflow.variables import variable_key  # noqa: PLC0415

    return tuple(variable_key(s) for s in tf.nest.flatten(sources))


class SettingTape:
    """A distributed tape whose ``gradient()`` runs with the environment setting
    ``name=value`` (restored after): hpcrep reads its settings when the exchange is traced, so a
    step traced through this tape keeps them."""

    def __init__(self, tape: Any, name: str, value: str) -> None:
        self._tape, self._name, self._value = tape, name, value

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 unconnected_gradients: Any = tf.UnconnectedGradients.NONE) -> Any:
        """``tape.gradient`` with the setting in effect. Collective if ``tape``'s is."""
        from bench.allreduce import with_env  # noqa: PLC0415

        return with_env(self._name, self._value, self._tape.gradient)(
            target, sources, output_gradients, unconnected_gradients)


def setting_optimizer(optimizer: keras.optimizers.Optimizer, name: str,
                      value: str) -> keras.optimizers.Optimizer:
    """Make ``optimizer``'s ``apply`` run with the environment setting ``name=value`` (see
    :class:`SettingTape`); returns the same object."""
    from bench.allreduce import with_env  # noqa: PLC0415

    base = type(optimizer)

    def apply(self: Any, grads: Any, trainable_variables: Any = None) -> Any:
        return with_env(name, value, base.apply)(self, grads, trainable_variables)

    cls = type(base.__name__, (base,), {"apply": apply, "__module__": base.__module__})
    object.__setattr__(optimizer, "__class__", cls)
    return optimizer


def raw_mpi_average(grads: Sequence[Any]) -> list:
    """Average ``grads`` across ranks with :func:`bench.sync.average_arrays`, inside the graph.

    ``tf.IndexedSlices`` are densified first, as a hand-written baseline would.

    Collective: every rank must call this, in the same order, with matching gradients.
    """
    dense = [tf.convert_to_tensor(g) for g in grads]
    if not dense:
        return []
    out = tf.numpy_function(lambda *arrays: average_arrays(arrays), dense,
                            [tf.float32] * len(dense), stateful=True, name="raw_mpi_average")
    for o, g in zip(out, dense):
        o.set_shape(g.shape)
    return [tf.cast(o, g.dtype) for o, g in zip(out, dense)]


class AveragingTape:
    """A recorded ``tf.GradientTape`` whose ``gradient()`` passes the gradients through
    ``average`` (``None`` gradients stay ``None``)."""

    def __init__(self, tape: tf.GradientTape, average: Average) -> None:
        self._tape, self._average = tape, average

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 unconnected_gradients: Any = tf.UnconnectedGradients.NONE) -> Any:
        """Return the gradients of ``target`` with respect to ``sources``, averaged.

        Collective when ``average`` communicates: every rank must call this, in the same order.
        """
        grads = self._tape.gradient(target, sources, output_gradients, unconnected_gradients)
        return tf.nest.pack_sequence_as(grads, _average_present(
            tf.nest.flatten(grads, expand_composites=False), self._average))


class TensorFlowSourcesTape:
    """A tape that asks ``tape`` for gradients with respect to the ``tf.Variable`` behind each
    Keras 3 variable: Horovod's ``DistributedGradientTape`` keys gradients by ``source.ref()``,
    which Keras 3 variables lack (``AttributeError: 'Variable' object has no attribute 'ref'``).
    The gradients are the same, since reading a Keras variable reads its ``tf.Variable``."""

    def __init__(self, tape: Any) -> None:
        self._tape = tape

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 unconnected_gradients: Any = tf.UnconnectedGradients.NONE) -> Any:
        """``tape.gradient`` with Keras variables in ``sources`` replaced by their
        ``tf.Variable``. Collective if ``tape``'s is. Horovod's ``gradient`` has no
        ``unconnected_gradients`` (its fourth parameter is ``use_generic_names``): only the
        default, None for an unconnected source, is accepted."""
        if unconnected_gradients != tf.UnconnectedGradients.NONE:
            raise ValueError("Horovod's DistributedGradientTape returns None for unconnected "
                             "sources; unconnected_gradients cannot be changed")
        backing = tf.nest.map_structure(
            lambda s: s.value if isinstance(s, keras.Variable) else s, sources)
        return self._tape.gradient(target, backing, output_gradients=output_gradients)


def averaging_optimizer(optimizer: keras.optimizers.Optimizer,
                        average: Average) -> keras.optimizers.Optimizer:
    """Make ``optimizer`` pass its gradients through ``average`` in ``apply`` (Keras 3's one
    funnel where gradients meet variables); returns the same object."""
    base = type(optimizer)

    def apply(self: Any, grads: Any, trainable_variables: Any = None) -> Any:
        return base.apply(self, _average_present(list(grads), average), trainable_variables)

    cls = type(base.__name__, (base,), {"apply": apply, "__module__": base.__module__})
    object.__setattr__(optimizer, "__class__", cls)
    return optimizer


def _average_present(grads: list, average: Average) -> list:
    present = [i for i, g in enumerate(grads) if g is not None]
    out = list(grads)
    for i, g in zip(present, average([grads[i] for i in present])):
        out[i] = g
    return out
