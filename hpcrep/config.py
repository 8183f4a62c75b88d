"""The one table of ``HPCREP_*`` settings.

Nothing else in hpcrep reads ``os.environ`` for these names: ask :func:`get`. Each setting has a
name, a type, a default and a meaning; ``python -m hpcrep.config`` prints the table.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
from typing import Any, Callable, Optional, Sequence

from hpcrep.errors import ConfigError


def _parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected one of 1/0, true/false, yes/no, on/off; got {text!r}")


def _parse_native(text: str) -> str:
    value = text.strip().lower()
    if value not in ("auto", "on", "off"):
        raise ValueError(f"expected auto, on or off; got {text!r}")
    return value


def _parse_tf_log(text: str) -> str:
    value = text.strip().lower()
    if value not in ("quiet", "all"):
        raise ValueError(f"expected quiet or all; got {text!r}")
    return value


def _parse_param_store(text: str) -> str:
    value = text.strip().lower()
    if value not in ("auto", "window", "p2p"):
        raise ValueError(f"expected auto, window or p2p; got {text!r}")
    return value


def _parse_every(text: str) -> int:
    value = int(text.strip())
    if value < 0:
        raise ValueError(f"expected a number of steps >= 0 (0: off); got {text!r}")
    return value


def _parse_replica_action(text: str) -> str:
    value = text.strip().lower()
    if value not in ("warn", "abort", "rebroadcast"):
        raise ValueError(f"expected warn, abort or rebroadcast; got {text!r}")
    return value


def _parse_steps(text: str) -> Optional[tuple[int, Optional[int]]]:
    """Parse a step window ``A:B`` (steps A to B inclusive, from 0), ``A:`` or ``""`` (all)."""
    text = text.strip()
    if not text:
        return None
    first, sep, last = text.partition(":")
    if not sep or not first.strip().isdigit() or (last.strip() and not last.strip().isdigit()):
        raise ValueError(f"expected A:B (steps A to B, counted from 0) or A:; got {text!r}")
    a, b = int(first), int(last) if last.strip() else None
    if b is not None and b < a:
        raise ValueError(f"the window's last step {b} comes before its first {a}")
    return a, b


def _parse_bytes(text: str) -> int:
    """Parse ``"64MiB"``, ``"1048576"``, ``"4k"`` and the like into a number of bytes."""
    units = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20,
             "mb": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}
    value = text.strip().lower()
    digits = value.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = value[len(digits):].strip()
    if not digits or unit not in units:
        raise ValueError(f"expected a byte count such as 67108864, 64MiB or 4k; got {text!r}")
    return int(float(digits) * units[unit])


def _parse_compression(text: str) -> tuple[str, int, int]:
    """``none``, ``fp16``, ``powersgd:R`` or ``powersgd:R:W`` as ``(kind, rank, warm-up)``."""
    parts = text.strip().lower().split(":")
    if len(parts) == 1 and parts[0] in ("none", "fp16", ""):
        return (parts[0] or "none", 0, 0)
    if parts[0] == "powersgd" and len(parts) in (2, 3) and all(p.isdigit() for p in parts[1:]) \
            and int(parts[1]) >= 1:
        return ("powersgd", int(parts[1]), int(parts[2]) if len(parts) == 3 else 0)
    raise ValueError("expected none, fp16, powersgd:RANK or powersgd:RANK:WARMUP_STEPS "
                     f"(RANK >= 1); got {text!r}")


@dataclasses.dataclass(frozen=True)
class Range:
    """The legal values of a setting beyond what its type parses: ``holds(value)`` for a parsed
    value, and ``expected``, the words that name them in a message. Checked once at start
    (:mod:`hpcrep.config_check`), never by :func:`get`."""

    expected: str
    holds: Callable[[Any], bool]


def _count(low: int, off: str = "") -> Range:
    """A whole number >= ``low``; ``off`` says what 0 means, where it is allowed."""
    return Range(f"a whole number >= {low}" + (f" (0: {off})" if off else ""),
                 lambda v: v >= low)


def _seconds(off: str = "") -> Range:
    """Finite seconds > 0, or also 0 where ``off`` says what 0 means."""
    if off:
        return Range(f"a finite number of seconds >= 0 (0: {off})",
                     lambda v: math.isfinite(v) and v >= 0)
    return Range("a finite number of seconds > 0", lambda v: math.isfinite(v) and v > 0)


_BYTES = Range("a byte count >= 0 (0: off), such as 0, 4MiB or 16777216", lambda v: v >= 0)
_SHARE = Range("a finite share > 0 and <= 1", lambda v: math.isfinite(v) and 0 < v <= 1)
_LOG_LEVELS = Range("debug, info, warning or error",
                    lambda v: v.strip().lower() in ("debug", "info", "warning", "error"))
_RECOVERIES = Range("auto or relaunch", lambda v: v.strip().lower() in ("auto", "relaunch"))


@dataclasses.dataclass(frozen=True)
class Setting:
    """One ``HPCREP_*`` environment setting.

    ``same_on_all_ranks`` marks a setting whose value must be equal on every rank: one that
    changes which MPI calls a rank makes (a rank that plans other buckets or skips a check would
    hang the job, or fail only when the stall watchdog fires), or what the ranks compute from
    the same gradients. :func:`hpcrep.comm.init` checks these once, on every rank (see
    :func:`agreed_values` and :func:`disagreement`). ``legal`` narrows what ``parse`` accepts
    (ranges, finite numbers); :mod:`hpcrep.config_check` applies it before MPI starts.
    """

    name: str
    parse: Callable[[str], Any]
    default: Any
    meaning: str
    same_on_all_ranks: bool = False
    legal: Optional[Range] = None


SETTINGS: dict[str, Setting] = {s.name: s for s in [
    Setting("HPCREP_FUSION_THRESHOLD", _parse_bytes, 16 << 20,
            "Largest fusion buffer in bytes: grouped collectives pack tensors into buffers of at "
            "most this size (a larger tensor gets a buffer of its own). 0 disables packing. "
            "16 MiB, not Horovod's 64: on these machines ResNet-50's gradients reduce in 39 ms "
            "with 16 MiB buffers and 59 ms with 64 MiB ones (2 ranks; smaller buffers stay in "
            "cache between the packing copy and the reduction).",
            same_on_all_ranks=True, legal=_BYTES),
    Setting("HPCREP_ALLREDUCE_CHUNK", _parse_bytes, 4 << 20,
            "Largest single MPI_Allreduce in bytes: a bigger buffer (a fusion buffer, a bucket, "
            "one large tensor) is reduced in consecutive pieces of at most this size, on both "
            "allreduce paths alike, so they give the same bits. 0 reduces each buffer in one "
            "call. 4 MiB: across the test cluster's 2 Gb/s TCP link Open MPI moved 102 MB in "
            "pieces of 6-51 MB at 140-160 MB/s, in pieces of at most 5 MB at 240 MB/s (the link "
            "rate). Must be the same on every rank.",
            same_on_all_ranks=True, legal=_BYTES),
    Setting("HPCREP_CHECK_COLLECTIVES", _parse_bool, True,
            "Before each collective, agree on a 64-bit hash of the tensors' names, shapes and "
            "dtypes (one 16-byte allreduce), so that mismatched calls raise instead of hanging.",
            same_on_all_ranks=True),
    Setting("HPCREP_CHECK_REPLICAS", _parse_every, 100,
            "Replica canary: every this many optimizer steps (the outermost optimizer's "
            "iterations; DistributedGradientTape loops call hvd.check_replicas), check that "
            "every rank holds bitwise the same trainable variables and optimizer state (one "
            "checksum per variable, one small allreduce) and report on every rank which "
            "variables differ, on which ranks, by how much, and any NaN/inf. 0 turns it off "
            "(nothing is added to the step). Must be the same on every rank.",
            same_on_all_ranks=True, legal=_count(0, "off")),
    Setting("HPCREP_CHECK_REPLICAS_ACTION", _parse_replica_action, "warn",
            "What the replica canary does when trainable or optimizer-state variables differ "
            "across ranks: 'warn' prints the report; 'abort' raises ReplicaDivergenceError on "
            "every rank; 'rebroadcast' also assigns rank 0's values to every rank. Must be the "
            "same on every rank.",
            same_on_all_ranks=True),
    Setting("HPCREP_STALL_TIMEOUT", float, 600.0,
            "Seconds a collective may wait for the other ranks before the whole job is aborted "
            "with a report of the collective, its tensors and which ranks had not arrived (a "
            "warning is printed at half of it). A failed node or cut network link otherwise "
            "hangs the job until its time limit. 0 turns the watchdog off.",
            legal=_seconds("off")),
    Setting("HPCREP_FLIGHT_RECORDER", int, 256,
            "Flight recorder: each rank keeps its last this many collectives (kind, tensor names, "
            "dtypes and shapes, call number, communicator, the line of user code that issued it, "
            "start and end times) and writes them to hpcrep-flight-<job>/rank<r>.json when the "
            "stall watchdog fires, the mismatch check fails or the job aborts, with a summary "
            "on stderr naming the first call where the ranks' histories differ. 0 turns it off.",
            legal=_count(0, "off")),
    Setting("HPCREP_FLIGHT_DIR", str, "",
            "Directory the flight recorder writes its files to (hpcrep-flight-<job>-rank<r>"
            ".json); empty: the directory hpcrep-flight-<job> in each rank's working "
            "directory."),
    Setting("HPCREP_STRAGGLER_WINDOW", int, 100,
            "Straggler warning: over this many of the last collectives on the whole job (Python "
            "path), a rank that arrived last at HPCREP_STRAGGLER_SHARE of them, by a median of "
            "HPCREP_STRAGGLER_MIN_LATE seconds or more, is named once on stderr by rank 0. 0 "
            "turns the check off.",
            legal=_count(0, "off")),
    Setting("HPCREP_STRAGGLER_SHARE", float, 0.9,
            "Straggler warning: the share of the window's collectives a rank must arrive last "
            "at (by chance each of n ranks does 1/n). 0.9, not 0.8: on the test cluster at "
            "1 Gb/s, 2 ranks doing the same 102 MB allreduces, one rank came last at 80 of 100 "
            "by 23 ms (the big allreduce completes later on one side).",
            legal=_SHARE),
    Setting("HPCREP_STRAGGLER_MIN_LATE", float, 0.02,
            "Straggler warning: the median lateness in seconds, over the collectives it arrived "
            "last at, below which a rank is not named.",
            legal=_seconds("any lateness")),
    Setting("HPCREP_LAUNCHER_GRACE", float, 10.0,
            "Seconds hpcrep's launchers (hpcrep run, python -m hpcrep.launch.mpirun, "
            "tests/cluster/mpirun.sh) give mpirun to end by itself after a rank announced that "
            "it aborts the job (the stall watchdog, an unhandled exception); then they "
            "terminate mpirun and the processes it started on this machine, and exit with the "
            "rank's exit code. Open MPI 4.1's mpirun otherwise waits for the daemon of a node it "
            "cannot reach (a cut link) until the link returns. 0 runs mpirun unsupervised.",
            legal=_seconds("unsupervised")),
    Setting("HPCREP_ELASTIC_RECOVERY", str, "auto",
            "hpcrep run --elastic: how a job outlives a failed rank. auto: in place where an MPI "
            "with ULFM is at hand (the survivors shrink and go on in the same job; the MPI of "
            "hpcrep run's Python, else the project's .venv-ulfm that make ulfm builds, which "
            "hpcrep run then runs under), else by a relaunch from the last commit. relaunch: "
            "always relaunch.", legal=_RECOVERIES),
    Setting("HPCREP_TENSORBOARD", str, "",
            "Transparent mode: rank 0 writes hpcrep's per-step communication figures (exposed "
            "communication, overlap, bytes, bandwidth, stragglers) as TensorBoard scalars into "
            "DIR/hpcrep at every epoch's end (hvd.callbacks.CommunicationTensorBoard). A "
            "directory, or auto: the log_dir of the script's keras.callbacks.TensorBoard, beside "
            "its own runs. Empty: off, nothing recorded."),
    Setting("HPCREP_ULFM_DETECT_TIMEOUT", float, 5.0,
            "hpcrep run --elastic on an MPI with ULFM (Open MPI 5): seconds without a heartbeat "
            "after which ULFM's detector (a heartbeat every third of it, at most 1 s; MPI "
            "progress from a thread of hpcrep's) declares a rank failed, so that a stopped rank "
            "or a cut node is left behind like a dead one. The ranks of a cut node are declared "
            "one after another: a node with 2 ranks is left behind about 3 x this after the cut "
            "(docs/measurements.md). Shorter recovers sooner; too short declares a busy rank "
            "dead. 0 turns the detector off (only ranks whose process ends are found).",
            legal=_seconds("no detector")),
    Setting("HPCREP_MATCH_TIMEOUT", float, 30.0,
            "Compiled path: when ranks queue allreduces in different orders (independent ops of "
            "a TF1 graph), requests are matched by name; if no pending name is pending on every "
            "rank and no rank queues a new request for this many seconds, every pending request "
            "fails with CollectiveMismatchError on every rank (the names never meet) instead of "
            "hanging. Longer than the longest gap between a step's independent allreduces.",
            legal=_seconds()),
    Setting("HPCREP_HIERARCHICAL_ALLREDUCE", _parse_bool, False,
            "Allreduce fusion buffers hierarchically when ranks span several nodes and some node "
            "runs more than one: reduce-scatter within each node (shared memory), allreduce each "
            "share across nodes, allgather within the node (one leader per node when nodes "
            "differ), so each node's link carries one copy of the buffer. Off by default: at 2 "
            "nodes x 2 ranks on the test cluster it did not beat Open MPI's flat allreduce "
            "(ResNet-50's gradients: 1405 vs 1372 ms at 1 Gb/s, 373 vs 301 ms at 10 Gb/s). Must "
            "be the same on every rank (checked).",
            same_on_all_ranks=True),
    Setting("HPCREP_NATIVE", _parse_native, "auto",
            "Which path TensorFlow allreduces take: 'auto' the compiled op "
            "(hpcrep/tensorflow/native, built by make install) when it is built for this "
            "TensorFlow, else the Python path; 'on' requires the compiled op; 'off' always the "
            "Python path. `python -m hpcrep.tensorflow.native` says which is active. Must be "
            "the same on every rank.",
            same_on_all_ranks=True),
    Setting("HPCREP_NATIVE_SPIN_US", int, 100,
            "Compiled path: microseconds its communication thread looks for more work before "
            "sleeping (and half that, a waiting op for its result before leaving a callback). "
            "Waking a sleeping thread costs tens of microseconds, more than a small allreduce; "
            "0 never spins (for machines with more ranks than cores).",
            legal=_count(0, "never spin")),
    Setting("HPCREP_OVERLAP", _parse_bool, True,
            "Exchange gradients in buckets that start while the backward pass still runs "
            "(buckets formed from the last layer back, one allreduce each, in the same order on "
            "every rank). 0: one exchange after the whole backward pass, for comparison and "
            "debugging. Overlap needs the compiled path; the Python path holds a TensorFlow "
            "thread while it communicates. Must be the same on every rank.",
            same_on_all_ranks=True),
    Setting("HPCREP_AUTOTUNE", _parse_bool, False,
            "Tune the gradient exchange's fusion threshold and piece size while training, from "
            "measured step times (hpcrep/comm/autotune.py): rank 0 times each setting, all ranks "
            "switch at the same step, and a drift in step time starts a new search. Logs each "
            "choice on rank 0's stderr. Compiled path only. Must be the same on every rank.",
            same_on_all_ranks=True),
    Setting("HPCREP_AUTOTUNE_COMPRESSION", _parse_bool, False,
            "With HPCREP_AUTOTUNE: let the tuner also try float32 gradients sent and summed as "
            "float16 (as Compression.fp16; it changes results beyond summation order, so off "
            "unless allowed), and keep it if steps are faster. Must be the same on every rank.",
            same_on_all_ranks=True),
    Setting("HPCREP_AUTOTUNE_LOG", str, "",
            "With HPCREP_AUTOTUNE: a CSV file (rank 0 writes it) with every timed setting: step, "
            "fusion bytes, piece bytes, fp16 (0/1), median step ms. Empty: none."),
    Setting("HPCREP_AUTOTUNE_WARMUP", int, 2,
            "With HPCREP_AUTOTUNE: steps after each change of setting that are not timed.",
            legal=_count(0)),
    Setting("HPCREP_AUTOTUNE_STEPS", int, 5,
            "With HPCREP_AUTOTUNE: steps timed per setting (their median is its score).",
            legal=_count(1)),
    Setting("HPCREP_AUTOTUNE_WINDOW", int, 20,
            "With HPCREP_AUTOTUNE: once settled, steps per look at the step time; two looks 15 % "
            "slower than the chosen setting's score start a new search.",
            legal=_count(1)),
    Setting("HPCREP_THREADS", int, 0,
            "TensorFlow intra-op threads per rank; 0 means cores on this node // ranks on this "
            "node (at least 1).",
            legal=_count(0, "automatic")),
    Setting("HPCREP_INTER_OP_THREADS", int, 0,
            "TensorFlow inter-op threads per rank (independent ops run side by side); 0 means 2 "
            "where this node has a core to spare (more cores than ranks x intra-op threads), "
            "else 1. Gradient exchange overlaps the backward pass only with 2 or more: with 1, "
            "TensorFlow computes the last layers' weight gradients last, so every bucket is "
            "ready only at the end.",
            legal=_count(0, "automatic")),
    Setting("HPCREP_LOG_LEVEL", str, "warning",
            "Verbosity of hpcrep's own log: debug, info, warning or error.",
            legal=_LOG_LEVELS),
    Setting("HPCREP_TRANSPARENT_SCALE_LR", _parse_bool, False,
            "Transparent mode: multiply each optimizer's learning rate (or schedule) by the "
            "number of ranks when it first applies gradients (the global batch grew N-fold).",
            same_on_all_ranks=True),
    Setting("HPCREP_TRANSPARENT_ELASTIC", _parse_bool, False,
            "Transparent mode (python -m hpcrep --elastic sets it): where the job can outlive "
            "a rank (ULFM: Open MPI 5, mpirun --with-ft ulfm), fit commits the model and "
            "optimizer in memory at every epoch's end (and every "
            "HPCREP_ELASTIC_BATCHES_PER_COMMIT batches), and after a failed rank the survivors "
            "go back to that commit, reshard the input to the new number of ranks (the batch "
            "per rank stays; the global batch shrinks) and go on. With HPCREP_ELASTIC_DIR "
            "(hpcrep run --elastic sets both) each commit also goes there, with or without "
            "ULFM, and a fit that finds one resumes from it (a relaunch). Without either: a "
            "warning, and a failed rank ends the job as usual.", same_on_all_ranks=True),
    Setting("HPCREP_ELASTIC_BATCHES_PER_COMMIT", int, 0,
            "Transparent elastic fit (HPCREP_TRANSPARENT_ELASTIC): also commit after every N "
            "batches within an epoch, so that a failure loses at most N steps, not an epoch. "
            "Array input only (without steps_per_epoch): hpcrep then orders each epoch itself "
            "(a seeded permutation, or the rows in order with shuffle=False; global batches of "
            "ranks x batch_size rows) and the commit holds the rows done, so a fit resumed on "
            "any number of ranks trains each of the others exactly once "
            "(hpcrep/tensorflow/transparent/epoch_order.py). 0: at epoch ends only.",
            same_on_all_ranks=True, legal=_count(0, "at epoch ends only")),
    Setting("HPCREP_COMPRESSION", _parse_compression, ("none", 0, 0),
            "Transparent mode: how every optimizer's gradients travel. 'none'; 'fp16' (half "
            "the bytes, sums in float16); 'powersgd:R' or 'powersgd:R:W': PowerSGD rank-R "
            "factors of matrix gradients with error feedback, uncompressed for the first W "
            "exchanges (hpcrep/tensorflow/powersgd.py; each optimizer its own state). Must be "
            "the same on every rank.",
            same_on_all_ranks=True),
    Setting("HPCREP_SHARD_OPTIMIZER_STATE", _parse_bool, False,
            "Transparent mode: shard each Keras optimizer's state across the ranks (ZeRO stage "
            "1, as DistributedOptimizer(..., shard_optimizer_state=True)): each rank keeps "
            "1/size of the slots; gradients are reduce-scattered and the updated slices "
            "allgathered. Elementwise optimizers (SGD, Adam, AdamW, ...) only; others raise "
            "ShardedStateError. Must be the same on every rank.",
            same_on_all_ranks=True),
    Setting("HPCREP_CHECKPOINT_DIR", str, "",
            "Directory of HDF5 checkpoints for transparent mode (CheckpointCallback): each fit "
            "of the script resumes from its own newest good checkpoint there (keyed to the fit's "
            "ordinal and the model) and saves each epoch. One job per directory (rank 0 holds "
            "a lock on it). Empty disables."),
    Setting("HPCREP_PIN_GPU", _parse_bool, True,
            "Each rank sees only GPU local_rank % visible GPUs: hvd.init() and transparent mode "
            "set CUDA_VISIBLE_DEVICES (choosing among the entries it already holds, if set) "
            "before TensorFlow starts its devices. 0 leaves the devices alone."),
    Setting("HPCREP_CHECKPOINT_KEEP", int, 3,
            "How many checkpoints CheckpointCallback keeps (at least 1; 2+ allows fallback).",
            legal=_count(1)),
    Setting("HPCREP_ELASTIC_DIR", str, "",
            "Directory where hvd.elastic states also write each commit (rank 0), and from which "
            "a relaunched job's first sync resumes. Empty: commits stay in memory. Each commit "
            "is elastic-state-<id>.npz (arrays and plain attributes, never pickled; created "
            "0700 if missing); a commit is refused if it or the directory is writable by group "
            "or others (a sticky directory excepted for your own file) or owned by another "
            "user, and an old elastic-state-<id>.pkl is refused, never loaded: delete it."),
    Setting("HPCREP_ELASTIC_MAX_NP", int, 0,
            "In-process elastic (ULFM; hpcrep run --max-np sets it): after ranks were lost, grow "
            "the job back up to this many ranks at a commit of @hvd.elastic.run's state, "
            "spawning new ranks into free slots of the hosts the job still runs on "
            "(hpcrep/comm/grow.py); under hpcrep run, a lost host that answers again rejoins "
            "through a relaunch from the commit (hpcrep/comm/hosts_back.py). Transparent "
            "mode's fit grows only through such a relaunch (HPCREP_ELASTIC_RELAUNCH). 0: never "
            "grow.",
            same_on_all_ranks=True, legal=_count(0, "never grow")),
    Setting("HPCREP_ELASTIC_RELAUNCH", _parse_bool, False,
            "Set by hpcrep run --elastic on every rank: the launcher relaunches a job that "
            "stops at a commit to grow (hpcrep/comm/hosts_back.py), so transparent mode's fit "
            "may grow back that way (python -m hpcrep --elastic, HPCREP_ELASTIC_MAX_NP). Not "
            "for users to set: without hpcrep run nothing would relaunch the job.",
            same_on_all_ranks=True),
    Setting("HPCREP_ELASTIC_MIN_NP", int, 1,
            "In-process elastic (ULFM; hpcrep run --min-np sets it): if fewer ranks than this "
            "survive a failure, they stop (exit status 76) with a message instead of going on; "
            "the last commit stays in HPCREP_ELASTIC_DIR for a relaunch.",
            same_on_all_ranks=True, legal=_count(1)),
    Setting("HPCREP_GROW_CHILD", str, "",
            "Set by hpcrep on the ranks it spawns to grow a job (hpcrep/comm/grow.py): any "
            "non-empty value makes init join the job that spawned this process instead of "
            "starting one (hpcrep/comm/world.py reads it before MPI starts). Not for users."),
    Setting("HPCREP_PARAM_STORE", _parse_param_store, "auto",
            "Parameter store of the Replicator's asynchronous regime (SyncGroups): 'window' an "
            "MPI one-sided window on the store rank (MPI.Win.Allocate, passive-target locks); "
            "'p2p' a thread on the store rank that answers point-to-point requests (for MPIs "
            "without one-sided windows across the ranks, such as Open MPI 4.1 over TCP); "
            "'auto' the window where this MPI can create one over the job, else p2p. Must be "
            "the same on every rank.",
            same_on_all_ranks=True),
    Setting("HPCREP_TIMELINE", str, "",
            "File of the merged timeline: every rank records its collectives (queued, "
            "negotiation, packing, MPI, unpacking, returned; fusion), on both allreduce paths, "
            "and the training steps, on one clock; rank 0 writes one Chrome-trace JSON at "
            "shutdown or exit (chrome://tracing, Perfetto, `hpcrep analyze FILE`). Started by "
            "hvd.init(); hvd.start_timeline(path) does the same by hand. Empty: off (nothing "
            "recorded, no cost). Must be the same on every rank (starting and writing it "
            "communicate).",
            same_on_all_ranks=True),
    Setting("HPCREP_TIMELINE_STEPS", _parse_steps, None,
            "Step window of the timeline: 'A:B' keeps only training steps A to B (inclusive, "
            "counted from 0: Keras fit batches, Replicator steps, or DistributedOptimizer.apply "
            "/ DistributedGradientTape.gradient calls), 'A:' from A on; empty: every step. "
            "Keeps trace files small."),
    Setting("HPCREP_TIMELINE_MARK_CYCLES", _parse_bool, False,
            "Timeline: also record each cycle of the compiled path's communication thread "
            "(Horovod's mark_cycles)."),
    Setting("HPCREP_TF_LOG", _parse_tf_log, "quiet",
            "TensorFlow's own start-up lines in what hpcrep starts (python -m hpcrep, hpcrep "
            "run, hpcrep bench, python -m hpcrep.launch.mpirun): 'quiet' sets "
            "TF_CPP_MIN_LOG_LEVEL=2 for the ranks (INFO and WARNING lines hidden, errors still "
            "printed); 'all' sets TF_CPP_MIN_LOG_LEVEL=0. A TF_CPP_MIN_LOG_LEVEL you set "
            "yourself is never changed."),
]}

# HPCREP_* variables of the source checkout's tools, which hpcrep itself never reads: not
# settings, and not reported as unknown (hpcrep.config_check).
TOOL_VARIABLES: dict[str, str] = {
    "HPCREP_APT_EXTRA": "tools/install.sh: extra apt packages",
    "HPCREP_CLUSTER_DIR": "tests/cluster: the state directory of the test cluster",
    "HPCREP_CLUSTER_KEEP_ON_FAIL": "tests/cluster/up.sh: keep a cluster that failed to start",
    "HPCREP_HOROVOD_SUITE_MODE": "tools/horovod_suite.py: the mode of its child processes",
}


def get(name: str) -> Any:
    """Return the parsed value of setting ``name`` from the environment, or its default.

    Raises:
        ConfigError: ``name`` is not a known setting, or its value does not parse.
    """
    try:
        setting = SETTINGS[name]
    except KeyError:
        raise ConfigError(f"unknown hpcrep setting {name!r}; "
                          f"known: {', '.join(SETTINGS)}") from None
    raw = os.environ.get(name)
    if raw is None:
        return setting.default
    try:
        return setting.parse(raw)
    except ValueError as exc:
        raise ConfigError(f"{name}={raw!r} is invalid: {exc}. Meaning: {setting.meaning} "
                          f"Unset it to use the default ({setting.default!r}).") from None


@dataclasses.dataclass(frozen=True)
class Unparsable:
    """A setting's raw text that does not parse (stands in for its value in the agreement)."""

    raw: str

    def __str__(self) -> str:
        return f"{self.raw!r} (invalid)"


# One rank's values of the settings that must agree: (name, parsed value or Unparsable), in
# table order.
Values = tuple[tuple[str, Any], ...]


def agreed_values() -> Values:
    """Return this process's parsed value of every setting marked ``same_on_all_ranks``.

    Parsed values, not the raw text: a rank where a setting is unset and one where it is set to
    its default (``16MiB`` and ``16777216`` alike) agree. A value that does not parse is
    returned as :class:`Unparsable`, so that the ranks still compare (and every rank raises,
    never only the one with the bad value). Local.
    """
    out = []
    for s in SETTINGS.values():
        if s.same_on_all_ranks:
            try:
                out.append((s.name, get(s.name)))
            except ConfigError:
                out.append((s.name, Unparsable(os.environ.get(s.name, ""))))
    return tuple(out)


def digest(values: Values) -> int:
    """Return a 62-bit digest of ``values`` that is the same in every process (for a MAX
    allreduce of ``[d, -d]``). Local."""
    return int.from_bytes(hashlib.blake2b(repr(values).encode(), digest_size=8).digest(),
                          "little") >> 2


def ranks_text(ranks: Sequence[int]) -> str:
    """Return ``rank 3`` or ``ranks 0-2, 5``: sorted ranks, runs shortened. Local."""
    runs: list[list[int]] = []
    for r in sorted(ranks):
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    text = ", ".join(str(a) if a == b else f"{a}, {b}" if b == a + 1 else f"{a}-{b}"
                     for a, b in runs)
    return ("rank " if len(ranks) == 1 else "ranks ") + text


def disagreement(per_rank: Sequence[Values]) -> str:
    """Return why the ranks' values (``per_rank[r]`` is rank r's :func:`agreed_values`) may not
    be used together, or ``''`` if they agree.

    The message names each setting that differs, each distinct value and the ranks holding it,
    and how to fix it. Pure: the same text on every rank that is given the same list.
    """
    tables: dict[tuple[str, ...], list[int]] = {}
    for r, values in enumerate(per_rank):
        tables.setdefault(tuple(name for name, _ in values), []).append(r)
    if len(tables) > 1:
        return ("ranks run different versions of hpcrep: their tables of settings that must "
                "agree differ (" + "; ".join(f"{ranks_text(ranks)}: {', '.join(names)}"
                                             for names, ranks in tables.items())
                + "). Install the same hpcrep on every node.")
    problems = []
    for i, name in enumerate(next(iter(tables), ())):
        holders: dict[str, list[int]] = {}
        for r, values in enumerate(per_rank):
            value = values[i][1]
            shown = str(value) if isinstance(value, Unparsable) else repr(value)
            if value == SETTINGS[name].default:
                shown += " (the default)"
            holders.setdefault(shown, []).append(r)
        if len(holders) > 1:
            values_text = "; ".join(f"{ranks_text(ranks)}: {shown}"
                                    for shown, ranks in holders.items())
            problems.append(f"{name} differs between ranks ({values_text})")
    if not problems:
        return ""
    first = problems[0].split(" ", 1)[0]
    return ("hpcrep settings that must be the same on every rank are not: "
            + "; ".join(problems)
            + ". A rank with another value would make other MPI calls (a hang, or an MPI error "
            "found only by the stall watchdog) or compute other results. Set the same value on "
            f"every rank, e.g. `mpirun -x {first}=<value> ...` (export it in the job script, "
            "not per rank), or unset it everywhere for the default.")


def require_valid(values: Values) -> None:
    """Raise :class:`ConfigError` for the first :class:`Unparsable` value in ``values``. Local.

    Called after the ranks agreed, so that a bad value every rank shares raises on all of them.
    """
    for name, value in values:
        if isinstance(value, Unparsable):
            get(name)  # raises, with the setting's meaning and default


def describe() -> str:
    """Return the settings table as text: name, default, current value, meaning."""
    lines = []
    for s in SETTINGS.values():
        same = ", same on every rank (checked by init)" if s.same_on_all_ranks else ""
        legal = f"; legal: {s.legal.expected}" if s.legal else ""
        lines.append(f"{s.name} (default {s.default!r}, now {os.environ.get(s.name, '<unset>')}"
                     f"{same}{legal})\n    {s.meaning}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(describe())
