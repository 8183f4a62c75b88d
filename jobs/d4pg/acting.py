"""D4PG's actors: each steps its own environment with a *behaviour* copy of the policy plus
Gaussian noise, and turns what it sees into N-step transitions in a uniform replay that the
learner samples (one actor per rank, in the learner's process). The learner overwrites the
behaviour policy every ``actor_update_period`` learner steps (the weight push of the paper's
actor/learner split). Acting is compiled (``tf.function``): eager acting costs 7-10 ms a step.

Naming follows Acme: ``o_tm1, a_tm1, r_t, d_t, o_t``.
"""

from __future__ import annotations

import collections
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from jobs.d4pg.learning import D4PGConfig, copy_variables, mlp


class Actor:
    """Acts in ``env`` with the behaviour policy and feeds ``replay`` through an N-step adder."""

    def __init__(self, env: Any, replay: "Replay", config: D4PGConfig, seed: int = 0) -> None:
        self.env, self.replay, self.config = env, replay, config
        obs_dim, act_dim = env.observation_space.shape[0], env.action_space.shape[0]
        self.policy = mlp(config.hidden, act_dim, "tanh")
        self.policy(tf.zeros((1, obs_dim)))
        self.adder = NStepAdder(config.n_step, config.discount)
        self.scale = float(env.action_space.high[0])
        self._sigma = tf.constant(config.sigma, tf.float32)
        self._act = tf.function(self._select_action, autograph=False,
                                input_signature=[tf.TensorSpec((obs_dim,), tf.float32),
                                                 tf.TensorSpec((), tf.float32)])
        self.o_tm1, _ = env.reset(seed=seed)
        self.episode_return = 0.0

    def _select_action(self, o_t: tf.Tensor, sigma: tf.Tensor) -> tf.Tensor:
        a = self.policy(o_t[None])[0]
        return tf.clip_by_value(a + sigma * tf.random.normal(tf.shape(a)), -1.0, 1.0)

    def update(self, policy_variables: Sequence[tf.Variable]) -> None:
        """Take the learner's policy. Local."""
        copy_variables(policy_variables, self.policy.variables)

    def step(self, random: bool = False) -> float | None:
        """Take one environment step (a uniformly random action if ``random``) and add what it
        completes to the replay; return the episode's return if it ended, else None. Local."""
        if random:
            a_tm1 = self.env.action_space.sample() / self.scale
        else:
            a_tm1 = self._act(tf.constant(self.o_tm1, tf.float32), self._sigma).numpy()
        o_t, r_t, terminated, truncated, _ = self.env.step(a_tm1 * self.scale)
        self.episode_return += float(r_t)
        for transition in self.adder.add(self.o_tm1, a_tm1, float(r_t), o_t, terminated,
                                         truncated):
            self.replay.add(*transition)
        self.o_tm1 = o_t
        if not (terminated or truncated):
            return None
        finished, self.episode_return = self.episode_return, 0.0
        self.o_tm1, _ = self.env.reset()
        return finished


class NStepAdder:
    """Turns a stream of steps into N-step transitions ``(o_tm1, a_tm1, R, d, o_t)``."""

    def __init__(self, n: int, discount: float) -> None:
        self.n, self.discount = n, discount
        self.buffer: collections.deque = collections.deque()

    def add(self, o_tm1, a_tm1, r_t: float, o_t, terminated: bool, truncated: bool) -> list:
        """Record one step; return the transitions it completes (several at an episode's end)."""
        self.buffer.append((o_tm1, a_tm1, r_t))
        out = []
        if len(self.buffer) == self.n:
            out.append(self._emit(o_t, terminated))
            self.buffer.popleft()
        if terminated or truncated:
            while self.buffer:
                out.append(self._emit(o_t, terminated))
                self.buffer.popleft()
        return out

    def _emit(self, o_t, terminated: bool) -> tuple:
        ret = sum(self.discount ** k * r for k, (_, _, r) in enumerate(self.buffer))
        d = 0.0 if terminated else self.discount ** len(self.buffer)
        o_tm1, a_tm1, _ = self.buffer[0]
        return o_tm1, a_tm1, ret, d, o_t


class Replay:
    """Uniform replay in preallocated numpy arrays."""

    def __init__(self, capacity: int, obs_dim: int, act_dim: int, seed: int = 0) -> None:
        self.o_tm1 = np.zeros((capacity, obs_dim), np.float32)
        self.a_tm1 = np.zeros((capacity, act_dim), np.float32)
        self.r_t = np.zeros(capacity, np.float32)
        self.d_t = np.zeros(capacity, np.float32)
        self.o_t = np.zeros((capacity, obs_dim), np.float32)
        self.capacity, self.size, self.next = capacity, 0, 0
        self.rng = np.random.default_rng(seed)

    def add(self, o_tm1, a_tm1, r_t: float, d_t: float, o_t) -> None:
        i = self.next
        self.o_tm1[i], self.a_tm1[i], self.r_t[i], self.d_t[i], self.o_t[i] = (
            o_tm1, a_tm1, r_t, d_t, o_t)
        self.next = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, batch: int) -> tuple:
        idx = self.rng.integers(0, self.size, batch)
        return self.o_tm1[idx], self.a_tm1[idx], self.r_t[idx], self.d_t[idx], self.o_t[idx]


def make_env(name: str, seed: int = 0):
    """A gymnasium environment, or ``dmc:DOMAIN-TASK`` (``dmc:cartpole-swingup``) from the
    DeepMind Control Suite (optional: ``pip install "mujoco==3.17.0" dm-control``) with the
    same interface (:mod:`jobs.d4pg.dmc`)."""
    if name.startswith("dmc:"):
        from jobs.d4pg.dmc import make_dmc_env  # noqa: PLC0415

        return make_dmc_env(name[len("dmc:"):], seed)
    import gymnasium  # noqa: PLC0415

    env = gymnasium.make(name)
    env.reset(seed=seed)
    return env
