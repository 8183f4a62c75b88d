"""D4PG's learner: Barth-Maron et al. (2018), *Distributed Distributional Deterministic Policy
Gradients*.

- Critic: a categorical distribution over ``atoms`` (51) evenly spaced returns in
  ``[v_min, v_max]``; its target is the target networks' distribution shifted by the N-step
  return, ``r_t + d_t z``, and mapped back onto the support by the L2 (Cramér) projection
  :func:`l2_project`.
- Actor: deterministic, trained by the deterministic policy gradient through the critic's mean.
- Target networks updated by Polyak averaging.
- Distributed: the learner is data-parallel: every rank samples its own replay, and the compiled
  step takes its gradients through ``hvd.DistributedGradientTape``, which averages them across
  ranks. The actors (:mod:`jobs.d4pg.acting`) feed the replay and receive the policy from
  :meth:`Learner.policy_variables` every ``actor_update_period`` learner steps.
- As in Acme, the compiled ``_step`` is kept apart from the Python :meth:`Learner.step`, which
  converts the batch and counts steps.

Naming follows Acme: ``o_tm1, a_tm1, r_t, d_t, o_t`` (``d_t`` is the discount to apply to the
bootstrap, ``gamma^N`` or 0 at a true termination).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import keras
import tensorflow as tf

import hpcrep.tensorflow as hvd


@dataclasses.dataclass
class D4PGConfig:
    """Hyper-parameters (defaults suit Pendulum-v1 on a CPU)."""

    atoms: int = 51
    v_min: float = -150.0
    v_max: float = 10.0
    discount: float = 0.99
    n_step: int = 5
    hidden: tuple = (256, 256)
    actor_lr: float = 1e-3  # 3e-4 learned Pendulum too slowly: 1 seed in 8 not by 5000 steps
    critic_lr: float = 1e-3
    tau: float = 0.005
    sigma: float = 0.3
    batch: int = 256
    replay_capacity: int = 100_000
    min_replay: int = 1000
    actor_update_period: int = 100
    reward_scale: float = 0.1


def l2_project(z_p: tf.Tensor, p: tf.Tensor, z_q: tf.Tensor) -> tf.Tensor:
    """Project distributions with atoms ``z_p`` (batch, n) and probabilities ``p`` (batch, n) onto
    the evenly spaced support ``z_q`` (m,), minimising the Cramér (L2 of CDFs) distance.

    Each source atom, clipped to ``[z_q[0], z_q[-1]]``, splits its mass between the two nearest
    target atoms in proportion to closeness (the triangle kernel ``max(0, 1 - |b - j|)``).
    """
    v_min, v_max = z_q[0], z_q[-1]
    delta = (v_max - v_min) / tf.cast(tf.shape(z_q)[0] - 1, z_q.dtype)
    b = (tf.clip_by_value(z_p, v_min, v_max) - v_min) / delta            # (batch, n)
    j = tf.cast(tf.range(tf.shape(z_q)[0]), z_q.dtype)                    # (m,)
    weights = tf.nn.relu(1.0 - tf.abs(b[:, :, None] - j[None, None, :]))   # (batch, n, m)
    return tf.reduce_sum(p[:, :, None] * weights, axis=1)


def mlp(hidden: tuple, out: int, activation: Optional[str] = None) -> keras.Sequential:
    """A multi-layer perceptron: ReLU ``hidden`` layers, then ``out`` units."""
    layers = [keras.layers.Dense(h, activation="relu") for h in hidden]
    return keras.Sequential(layers + [keras.layers.Dense(out, activation=activation)])


class Learner:
    """Critic, actor, their targets and optimizers, and one compiled data-parallel step.

    ``distributed_tape`` wraps the recorded tape of each step (default
    ``hvd.DistributedGradientTape``; the benchmark passes its variants, :mod:`bench.variants`).
    """

    def __init__(self, obs_dim: int, act_dim: int, config: Optional[D4PGConfig] = None,
                 distributed_tape: Optional[Callable[[tf.GradientTape], Any]] = None) -> None:
        c = self.config = config if config is not None else D4PGConfig()
        self.support = tf.linspace(c.v_min, c.v_max, c.atoms)
        self.actor = mlp(c.hidden, act_dim, "tanh")
        self.critic = mlp(c.hidden, c.atoms)
        self.target_actor = mlp(c.hidden, act_dim, "tanh")
        self.target_critic = mlp(c.hidden, c.atoms)
        o, a = tf.zeros((1, obs_dim)), tf.zeros((1, act_dim))
        for net in (self.actor, self.target_actor):
            net(o)
        for net in (self.critic, self.target_critic):
            net(tf.concat([o, a], 1))
        self.actor_opt = keras.optimizers.Adam(c.actor_lr)
        self.critic_opt = keras.optimizers.Adam(c.critic_lr)
        self.actor_opt.build(self.actor.trainable_variables)
        self.critic_opt.build(self.critic.trainable_variables)
        copy_variables(self.actor.variables, self.target_actor.variables)
        copy_variables(self.critic.variables, self.target_critic.variables)
        self._distributed_tape = distributed_tape or hvd.DistributedGradientTape
        self._compiled_step = tf.function(self._step, autograph=False)
        self.steps = 0

    @property
    def variables(self) -> list:
        """Learner state ranks must agree on at the start (nets, targets, optimizer slots)."""
        nets = (self.actor, self.critic, self.target_actor, self.target_critic)
        return [v for n in nets for v in n.variables] + list(self.actor_opt.variables) + list(
            self.critic_opt.variables)

    @property
    def trainable_variables(self) -> list:
        return list(self.critic.trainable_variables) + list(self.actor.trainable_variables)

    @property
    def policy_variables(self) -> list:
        """The policy the actors act with."""
        return list(self.actor.variables)

    def _step(self, o_tm1: tf.Tensor, a_tm1: tf.Tensor, r_t: tf.Tensor, d_t: tf.Tensor,
              o_t: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        with tf.GradientTape(persistent=True) as tape:
            logits_tm1 = self.critic(tf.concat([o_tm1, a_tm1], 1))
            a_t = self.target_actor(o_t)
            p_t = tf.nn.softmax(self.target_critic(tf.concat([o_t, a_t], 1)))
            z_t = r_t[:, None] + d_t[:, None] * self.support[None, :]
            target = tf.stop_gradient(l2_project(z_t, p_t, self.support))
            critic_loss = tf.reduce_mean(
                tf.nn.softmax_cross_entropy_with_logits(labels=target, logits=logits_tm1))
            dpg_a = self.actor(o_tm1)
            q = tf.reduce_sum(tf.nn.softmax(self.critic(tf.concat([o_tm1, dpg_a], 1)))
                              * self.support, axis=1)
            actor_loss = -tf.reduce_mean(q)
        tape = self._distributed_tape(tape)
        critic_vars, actor_vars = self.critic.trainable_variables, self.actor.trainable_variables
        # Two losses with their own variables: two averaged gradient sets (the actor's loss must
        # not move the critic).
        critic_grads = tape.gradient(critic_loss, critic_vars)
        actor_grads = tape.gradient(actor_loss, actor_vars)
        del tape
        self.critic_opt.apply(critic_grads, critic_vars)
        self.actor_opt.apply(actor_grads, actor_vars)
        polyak(self.actor.variables, self.target_actor.variables, self.config.tau)
        polyak(self.critic.variables, self.target_critic.variables, self.config.tau)
        return critic_loss, actor_loss

    def step(self, o_tm1: Any, a_tm1: Any, r_t: Any, d_t: Any, o_t: Any) -> tuple[float, float]:
        """One learner step on a batch of N-step transitions (reward not yet scaled); returns
        the critic and actor losses.

        Collective: every rank must call this, in the same order.
        """
        critic_loss, actor_loss = self._compiled_step(
            tf.constant(o_tm1), tf.constant(a_tm1),
            tf.constant(r_t * self.config.reward_scale), tf.constant(d_t), tf.constant(o_t))
        self.steps += 1
        return float(critic_loss), float(actor_loss)


def copy_variables(source: list, target: list) -> None:
    """Assign ``source``'s values to ``target`` (same structure)."""
    for s, t in zip(source, target):
        t.assign(s)


def polyak(source: list, target: list, tau: float) -> None:
    """Move ``target`` a fraction ``tau`` of the way towards ``source``."""
    for s, t in zip(source, target):
        t.assign(tau * s + (1.0 - tau) * t)
