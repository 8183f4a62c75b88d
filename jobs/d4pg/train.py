"""D4PG with a data-parallel learner across ranks and one actor per rank (``hpcrep.tensorflow``).

Run on N ranks from the repository's top directory:
``mpirun -n N python -m jobs.d4pg [options]`` (or ``srun``).

- Training (default): every rank's actor steps its own ``--env`` (gymnasium ``Pendulum-v1``, or a
  DeepMind Control Suite task as ``dmc:DOMAIN-TASK`` when ``dm-control`` is installed) with
  the behaviour policy, feeding its replay; after ``--min-replay`` transitions the learner takes
  one data-parallel step (``hvd.DistributedGradientTape``) per environment step and pushes the
  policy to the actors every ``--actor-update-period`` learner steps. Rank 0 writes the episode
  returns (averaged over ranks) with the wall-clock second and environment step at which each
  episode ended to ``--result-json``; exits 1 if the mean of the last
  ``--last-episodes`` returns is below ``--min-return``.
- Benchmark (``--bench-json PATH``, what ``hpcrep bench`` runs): fills the replay with random
  actions, then times the same learner step with each variant in ``--modes`` underneath
  (:mod:`bench.variants`).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from bench.job import (Timed, add_bench_arguments, gradient_summary, parse_modes, run_modes,
                       weights_agree, write_result)
from bench.exposed import trace_path
from bench.sync import MODES


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="Pendulum-v1")
    p.add_argument("--env-steps", type=int, default=10_000, help="per rank")
    p.add_argument("--batch", type=int, default=256, help="per-rank learner batch")
    p.add_argument("--min-replay", type=int, default=1000)
    p.add_argument("--actor-update-period", type=int, default=100)
    p.add_argument("--n-step", type=int, default=5)
    p.add_argument("--sigma", type=float, default=0.3)
    p.add_argument("--actor-lr", type=float, help="default: D4PGConfig's")
    p.add_argument("--critic-lr", type=float, help="default: D4PGConfig's")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--deterministic", action="store_true",
                   help="enable TensorFlow op determinism: with --seed, a run is reproducible")
    p.add_argument("--sync", choices=list(MODES), default="hpcrep")
    p.add_argument("--min-return", type=float, default=-float("inf"))
    p.add_argument("--last-episodes", type=int, default=5)
    p.add_argument("--result-json")
    add_bench_arguments(p)
    return p.parse_args(argv)


def build(args, env, rank: int, distributed_tape=None):
    from jobs.d4pg.acting import Actor, Replay  # noqa: PLC0415
    from jobs.d4pg.learning import D4PGConfig, Learner  # noqa: PLC0415

    rates = {k: v for k, v in (("actor_lr", args.actor_lr), ("critic_lr", args.critic_lr))
             if v is not None}
    config = D4PGConfig(batch=args.batch, min_replay=args.min_replay, n_step=args.n_step,
                        actor_update_period=args.actor_update_period, sigma=args.sigma, **rates)
    obs_dim, act_dim = env.observation_space.shape[0], env.action_space.shape[0]
    learner = Learner(obs_dim, act_dim, config, distributed_tape)
    replay = Replay(config.replay_capacity, obs_dim, act_dim, seed=args.seed + rank)
    return learner, Actor(env, replay, config, seed=args.seed + rank), replay


def train(args: argparse.Namespace) -> int:
    import keras  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    import hpcrep.tensorflow as hvd  # noqa: PLC0415
    from bench.variants import variant  # noqa: PLC0415
    from jobs.d4pg.acting import make_env  # noqa: PLC0415

    rank, size = hvd.rank(), hvd.size()
    if args.deterministic:
        tf.config.experimental.enable_op_determinism()
    # Keras 3 initialisers draw from Keras's own seed generator, not TensorFlow's global seed:
    # this seeds Python, NumPy, TensorFlow and Keras together.
    keras.utils.set_random_seed(args.seed + rank)
    env = make_env(args.env, args.seed + rank)
    learner, actor, replay = build(args, env, rank, variant(args.sync).DistributedGradientTape)
    hvd.broadcast_variables(learner.variables, root_rank=0)
    actor.update(learner.policy_variables)
    returns, ended_at, start = [], [], time.time()
    for t in range(args.env_steps):
        finished = actor.step()
        if finished is not None:
            returns.append(finished)
            ended_at.append((time.time() - start, t + 1))
            if rank == 0 and len(returns) % 5 == 0:
                print(f"episode {len(returns)} (env step {t + 1}): return {returns[-1]:.1f}",
                      flush=True)
        if replay.size >= args.min_replay:  # same step on every rank: same env steps per rank
            learner.step(*replay.sample(args.batch))
            if learner.steps % args.actor_update_period == 0:
                actor.update(learner.policy_variables)
    mean_returns = hvd.allreduce(np.array(returns, np.float64), op=hvd.Average).numpy().tolist()
    last = float(np.mean(mean_returns[-args.last_episodes:]))
    # Every rank takes the same number of environment and learner steps, so an episode index
    # ends at the same step everywhere; rank 0's clock at that step stands for the job's.
    result = {"returns": mean_returns, "first_return": mean_returns[0], "last_mean_return": last,
              "episode_seconds": [s for s, _ in ended_at],
              "episode_env_steps": [t for _, t in ended_at],
              "learner_steps": learner.steps, "env_steps_per_rank": args.env_steps,
              "weights_agree": weights_agree(learner.trainable_variables),
              "seconds": time.time() - start, "ranks": size}
    if rank == 0:
        lists = ("returns", "episode_seconds", "episode_env_steps")
        print(json.dumps({k: v for k, v in result.items() if k not in lists}), flush=True)
    write_result(args.result_json, result)
    return 0 if last >= args.min_return else 1


def bench(args: argparse.Namespace, modes: list[str]) -> int:
    import hpcrep.tensorflow as hvd  # noqa: PLC0415
    from jobs.d4pg.acting import make_env  # noqa: PLC0415

    rank, size = hvd.rank(), hvd.size()
    env = make_env(args.env, args.seed + rank)
    learner, actor, replay = build(args, env, rank)
    for _ in range(max(args.min_replay, args.batch)):
        actor.step(random=True)

    def factory(v):
        from jobs.d4pg.learning import Learner  # noqa: PLC0415

        # The same learner step, v underneath.
        timed = Learner(env.observation_space.shape[0], env.action_space.shape[0],
                        learner.config, v.DistributedGradientTape)
        hvd.broadcast_variables(timed.variables, root_rank=0)

        return Timed(lambda: timed.step(*replay.sample(args.batch)), lambda: timed.variables,
                     lambda: timed.trainable_variables)

    runs = run_modes(factory, modes, args.rounds, args.steps, args.batch * size,
                     trace_file=trace_path(args.bench_json))
    for r in runs.values():
        r["learner_steps_per_s"] = 1e3 / r["step_ms"] if r.get("step_ms") else None
    write_result(args.bench_json, {
        "model": "d4pg", "unit": "transitions/s", "runs": runs,
        **gradient_summary(learner.trainable_variables),
        "syncs_per_step": 2,  # the critic's and the actor's gradients: two gradient() calls
        "config": vars(args)})
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    import hpcrep.tensorflow as hvd  # noqa: PLC0415

    hvd.init()
    if args.bench_json:
        return bench(args, parse_modes(args.modes, MODES))
    return train(args)
