"""DeepMind Control Suite tasks (the paper's D4PG benchmark) behind the small part of gymnasium's
interface that :class:`jobs.d4pg.acting.Actor` uses: ``observation_space``, ``action_space``,
``reset(seed=None) -> (o, info)``, ``step(a) -> (o, r, terminated, truncated, info)``.

Features, not pixels: the observation is the task's observation dictionary flattened in its own
key order into one float32 vector. A suite episode ends after a fixed number of steps (1000 for
``cartpole/swingup``) with discount 1, which is a truncation; an end with discount 0 is a
termination.

Optional: needs ``pip install "mujoco==3.17.0" dm-control`` (mujoco 4.0 breaks dm-control
1.0.50; ``make bench-full`` installs them). Local: nothing here communicates.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import numpy as np


def make_dmc_env(spec: str, seed: int = 0) -> "DMCEnv":
    """Load ``DOMAIN-TASK`` (e.g. ``cartpole-swingup``) from the suite, seeded with ``seed``.

    Raises:
        ValueError: ``spec`` is not ``DOMAIN-TASK``.
        ImportError: dm-control is not installed (the message says how to install it).
    """
    domain, sep, task = spec.partition("-")
    if not sep or not domain or not task:
        raise ValueError(f"a DeepMind Control Suite task is dmc:DOMAIN-TASK "
                         f"(dmc:cartpole-swingup), got dmc:{spec}")
    # Features only: no OpenGL context is needed, and probing for one (GLFW without a display)
    # prints a warning on every rank.
    os.environ.setdefault("MUJOCO_GL", "disabled")
    try:
        from dm_control import suite  # noqa: PLC0415
    except ImportError as e:
        raise ImportError(f"dmc:{spec} needs the DeepMind Control Suite: pip install "
                          f"\"mujoco==3.17.0\" dm-control (or make bench-full)") from e
    return DMCEnv(suite.load(domain, task, task_kwargs={"random": seed}))


class DMCEnv:
    """A suite environment seen through gymnasium's step/reset conventions."""

    def __init__(self, env: Any) -> None:
        import gymnasium  # noqa: PLC0415

        self.env = env
        spec = env.action_spec()
        self.action_space = gymnasium.spaces.Box(
            np.broadcast_to(spec.minimum, spec.shape).astype(np.float32),
            np.broadcast_to(spec.maximum, spec.shape).astype(np.float32), dtype=np.float32)
        size = sum(int(np.prod(s.shape)) for s in env.observation_spec().values())
        self.observation_space = gymnasium.spaces.Box(-np.inf, np.inf, (size,), np.float32)

    @staticmethod
    def _flatten(observation: dict) -> np.ndarray:
        return np.concatenate([np.asarray(v, np.float32).ravel() for v in observation.values()])

    def reset(self, seed: Optional[int] = None) -> tuple[np.ndarray, dict]:
        """Start an episode. The suite is seeded when it is loaded; ``seed`` is accepted for
        gymnasium's signature and ignored."""
        del seed
        return self._flatten(self.env.reset().observation), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        ts = self.env.step(np.asarray(action, np.float64))
        ended = ts.last()
        terminated = bool(ended and ts.discount == 0.0)
        return (self._flatten(ts.observation), float(ts.reward or 0.0), terminated,
                bool(ended and not terminated), {})
