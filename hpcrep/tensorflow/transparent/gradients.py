"""Every Keras optimizer applies gradients averaged across ranks.

Keras 3's ``BaseOptimizer.apply`` is the one funnel where gradients meet variables
(``apply_gradients``, ``model.fit`` and custom loops, eager or inside ``tf.function``). The patch
turns an optimizer, the first time it applies gradients, into the very class
:func:`~hpcrep.tensorflow.DistributedOptimizer` builds (via
:func:`~hpcrep.tensorflow.optimizer.distribute_in_place`), so the averaging is the explicit API's
code, not a copy. On exit every converted optimizer gets its own class back.

Optimizers that override ``apply`` and delegate to an inner optimizer (``LossScaleOptimizer``)
average in the inner one.

With ``HPCREP_TRANSPARENT_SCALE_LR`` the rate is multiplied by the number of ranks at the same
moment (:mod:`hpcrep.tensorflow.lr_scale`, which also keeps the factor out of saved files).
"""

from __future__ import annotations

import weakref
from typing import Any

import keras

from hpcrep import comm, config
from hpcrep.tensorflow.lr_scale import scale_learning_rate
from hpcrep.tensorflow.optimizer import distribute_in_place, is_distributed
from hpcrep.tensorflow.transparent.patching import PatchSet, defining_class


def install(patches: PatchSet) -> None:
    """Patch ``apply`` of every Keras optimizer. Local."""
    owner = defining_class(keras.optimizers.Optimizer, "apply")
    original = vars(owner)["apply"]
    converted: "weakref.WeakKeyDictionary[Any, type]" = weakref.WeakKeyDictionary()
    scale = config.get("HPCREP_TRANSPARENT_SCALE_LR")

    def apply(self: Any, grads: Any, trainable_variables: Any = None) -> Any:
        if is_distributed(self):
            return original(self, grads, trainable_variables)
        converted[self] = distribute_in_place(self)
        if scale and comm.size() > 1:
            scale_learning_rate(self, comm.size())
        return self.apply(grads, trainable_variables)

    def restore_classes() -> None:
        for opt, cls in list(converted.items()):
            object.__setattr__(opt, "__class__", cls)
        converted.clear()

    patches.attr(owner, "apply", apply)
    patches.on_restore(restore_classes)
    patches.label("optimizer apply (gradients averaged)")
    patches.label(f"learning rate x{comm.size() if scale else 1}"
                  f"{'' if scale else ' (HPCREP_TRANSPARENT_SCALE_LR=1 for xN)'}")
