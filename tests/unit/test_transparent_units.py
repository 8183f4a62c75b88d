"""One-process tests of transparent mode's pure parts: sharding, reassembly, patch bookkeeping,
and the ``hpcrep run`` command line."""

import types

import keras
import numpy as np
import pytest
import tensorflow as tf

from hpcrep.errors import TransparentModeError
from hpcrep.launch import run_command
from hpcrep.tensorflow.presharded import is_presharded, mark_presharded
from hpcrep.tensorflow.transparent import even_steps, iteration, predict_share, sharding
from hpcrep.tensorflow.transparent.patching import PatchSet


def test_equal_steps_pads_a_short_rank_with_a_zero_weight_copy():
    x, y = np.arange(9 * 2).reshape(9, 2), np.arange(9)  # 2 ranks, batches of 4: 5 and 4 rows
    parts = [sharding.shard_arrays([x, y, None], r, 2, equal=True) for r in range(2)]
    got = [even_steps.equal_steps(*p, 9, r, 2, 4) for r, p in enumerate(parts)]
    assert got[0][1].tolist() == [0, 2, 4, 6, 8] and got[0][2].tolist() == [1] * 5
    assert got[1][1].tolist() == [1, 3, 5, 7, 1] and got[1][2].tolist() == [1, 1, 1, 1, 0]
    assert got[1][0].shape == (5, 2)
    same = even_steps.equal_steps(*parts[1], 9, 1, 2, 3)  # 2 steps either way: unchanged
    assert same[1].tolist() == [1, 3, 5, 7] and same[2] is None
    with pytest.warns(UserWarning, match=r"1 row\(s\) of the 9 are left out"):
        cut = even_steps.equal_steps(*parts[0], 9, 0, 2, 4, can_weight=False)
    assert cut[1].tolist() == [0, 2, 4, 6] and cut[2] is None


def test_arrays_are_shared_out_in_disjoint_strides_every_row_once():
    x, y = np.arange(10 * 2).reshape(10, 2), np.arange(10)
    shards = [sharding.shard_arrays([x, y, None], r, 4, equal=True) for r in range(4)]
    assert [list(s[1]) for s in shards] == [[0, 4, 8], [1, 5, 9], [2, 6], [3, 7]]
    assert all(s[2] is None and s[0].shape == (len(s[1]), 2) for s in shards)
    with pytest.raises(TransparentModeError, match="cannot be shared by 11 ranks"):
        sharding.shard_arrays([x], 0, 11, equal=True)
    with pytest.raises(TransparentModeError, match="different numbers of rows"):
        sharding.shard_arrays([x, y[:9]], 0, 2, equal=True)


def test_dataset_shards_have_equal_counts_even_of_unknown_length():
    ds = tf.data.Dataset.range(10)
    got = [list(sharding.shard_dataset(ds, r, 4, equal=True).as_numpy_iterator())
           for r in range(4)]
    assert got == [[0, 4], [1, 5], [2, 6], [3, 7]]
    unknown = ds.filter(lambda v: v < 9)  # 9 elements, cardinality unknown
    counts = []
    with pytest.warns(UserWarning, match=r"last 1 element\(s\) \(1 rows\) are left out"):
        shard = sharding.shard_dataset(unknown, 0, 4, equal=True,
                                       agree=lambda c: counts.append(c) or [3, 2, 2, 2])
    assert counts == [3] and list(shard.as_numpy_iterator()) == [0, 4]


def test_generators_and_pydatasets_deal_round_robin():
    assert [list(sharding.shard_generator(iter(range(10)), r, 4, equal=True))
            for r in range(4)] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert list(sharding.shard_generator(iter(range(10)), 1, 4, equal=False)) == [1, 5, 9]

    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return 10

        def __getitem__(self, i):
            return np.full((2, 1), i), np.zeros((2, 1))

    shard = sharding.ShardedPyDataset(Batches(), 2, 4, equal=True)
    assert len(shard) == 2 and [int(shard[i][0][0, 0]) for i in range(2)] == [2, 6]


def test_interleave_restores_the_original_order():
    # 7 batches of sizes 2,2,2,2,2,2,1 dealt to 3 ranks
    rows = np.arange(13)
    batches = np.split(rows, [2, 4, 6, 8, 10, 12])
    parts = [np.concatenate(batches[k::3]) for k in range(3)]
    pieces = [[len(b) for b in batches[k::3]] for k in range(3)]
    np.testing.assert_array_equal(sharding.interleave(parts, pieces), rows)


def test_kind_of():
    assert sharding.kind_of(None) == "none"
    assert sharding.kind_of(np.ones(3)) == "arrays"
    assert sharding.kind_of({"a": np.ones(3)}) == "arrays"
    assert sharding.kind_of(tf.data.Dataset.range(3)) == "dataset"
    assert sharding.kind_of(mark_presharded(tf.data.Dataset.range(3))) == "presharded"
    assert sharding.kind_of(i for i in range(3)) == "generator"


def _policy(policy):
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = policy
    return options


def test_the_presharded_marker_is_tf_datas_auto_shard_policy_off():
    policy = tf.data.experimental.AutoShardPolicy
    plain = tf.data.Dataset.range(64)
    assert not is_presharded(plain)
    for other in (policy.AUTO, policy.DATA, policy.FILE, policy.HINT):
        assert not is_presharded(plain.with_options(_policy(other))), other
    user = plain.with_options(_policy(policy.OFF))  # what a user sets to opt out
    assert is_presharded(user)
    marked = mark_presharded(plain)
    assert is_presharded(marked) and mark_presharded(marked) is marked
    assert list(marked.as_numpy_iterator()) == list(range(64))  # the data is untouched


def test_the_marker_survives_the_transformations_of_an_input_pipeline():
    marked = mark_presharded(tf.data.Dataset.range(64))
    other = tf.data.Dataset.range(64)
    derived = {
        "map": marked.map(lambda v: v * 2), "batch": marked.batch(4),
        "prefetch": marked.prefetch(2), "shuffle": marked.shuffle(8, seed=0),
        "repeat": marked.repeat(), "take": marked.take(3), "skip": marked.skip(3),
        "filter": marked.filter(lambda v: v > 2), "unbatch": marked.batch(4).unbatch(),
        "cache": marked.cache(), "padded_batch": marked.padded_batch(4),
        "interleave": marked.interleave(lambda v: tf.data.Dataset.range(2)),
        "flat_map": marked.flat_map(lambda v: tf.data.Dataset.range(2)),
        "enumerate": marked.enumerate(), "zip": tf.data.Dataset.zip((other, marked)),
        "concatenate": other.concatenate(marked),
        "assert_cardinality": marked.apply(tf.data.experimental.assert_cardinality(64)),
        "chain": marked.map(lambda v: (v, v)).batch(4).prefetch(1).map(lambda a, b: a),
        "generator": mark_presharded(tf.data.Dataset.from_generator(
            lambda: iter(range(4)), output_signature=tf.TensorSpec((), tf.int64))).map(
                lambda v: v + 1).batch(2),
    }
    lost = [name for name, ds in derived.items() if not is_presharded(ds)]
    assert lost == [], f"tf.data dropped the marker in {lost}"
    assert sharding.kind_of(derived["chain"]) == "presharded"


def test_python_loops_leave_marked_datasets_whole():
    ds = tf.data.Dataset.range(8).batch(2)
    assert iteration.should_shard(ds, 2)
    assert not iteration.should_shard(mark_presharded(ds), 2)
    assert not iteration.should_shard(mark_presharded(tf.data.Dataset.range(8)).batch(2), 2)


def test_presharded_datasets_are_checked_for_equal_lengths_not_cut():
    ds = mark_presharded(tf.data.Dataset.range(10).batch(2))  # 5 batches
    seen = []

    def gather(counts):
        def agree(local):
            seen.append(local)
            return counts
        return agree

    assert sharding.check_presharded(ds, True, gather([5, 5, 5])) is ds
    assert sharding.check_presharded(ds, False, gather([1, 2])) is ds  # predict: not checked
    assert seen == [5]
    unknown = mark_presharded(tf.data.Dataset.range(10).filter(lambda v: v < 7))
    assert sharding.check_presharded(unknown, True, gather([7, 7])) is unknown
    assert seen == [5, 7]  # counted, since its cardinality is unknown
    with pytest.raises(TransparentModeError,
                       match=r"5 on rank\(s\) \[0, 2\]; 6 on rank\(s\) \[1\]"):
        sharding.check_presharded(ds, True, gather([5, 6, 5]))
    with pytest.raises(TransparentModeError,
                       match=r"infinite on rank\(s\) \[1\]; 5 on rank\(s\) \[0\]"):
        sharding.check_presharded(ds, True, gather([5, tf.data.INFINITE_CARDINALITY]))
    forever = mark_presharded(tf.data.Dataset.range(3).repeat())
    assert sharding.check_presharded(forever, True, gather([-1, -1])) is forever
    with pytest.raises(TransparentModeError, match="empty on every rank"):
        sharding.check_presharded(ds, True, gather([0, 0]))
    x, others, kind = sharding.shard_input(ds, [None], 0, 1, equal=True)  # one rank: as is
    assert (x, others, kind) == (ds, [None], "presharded")


def test_patch_set_restores_own_and_inherited_attributes_in_reverse():
    class Base:
        def f(self):
            return "base"

    class Child(Base):
        def g(self):
            return "child"

    module = types.ModuleType("m")
    module.value = 1
    original_g = Child.g
    patches = PatchSet()
    patches.attr(Child, "f", lambda self: "patched")
    patches.attr(Child, "g", lambda self: "patched")
    patches.attr(module, "value", 2)
    order = []
    patches.on_restore(lambda: order.append("hook"))
    assert Child().f() == "patched" and module.value == 2
    patches.restore()
    assert "f" not in vars(Child) and Child().f() == "base"
    assert Child.g is original_g and module.value == 1 and order == ["hook"]


def test_run_command_uses_mpirun_outside_slurm_and_srun_inside(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import keras\n")
    options = run_command.parse(["-n", "4", str(script), "--epochs", "2"])
    argv = run_command.build_launch(options, environ={}).argv
    assert argv[1:3] == ["-n", "4"] and argv[-5:] == ["-m", "hpcrep", str(script), "--epochs",
                                                      "2"]
    options = run_command.parse([str(script)])
    inside = run_command.build_launch(options, environ={"SLURM_JOB_ID": "7"}).argv
    assert inside[0] == "srun" and inside[1] in ("--mpi=pmix", "--mpi=pmi2")
    assert "--ntasks" not in inside
    with pytest.raises(ValueError, match="number of ranks"):
        run_command.build_launch(options, environ={})


def test_inputs_with_fewer_elements_than_ranks_raise_or_come_back_whole():
    x, y = np.arange(6).reshape(3, 2), np.arange(3)
    for r in range(4):  # evaluate: the whole input on every rank
        got, (got_y,), _ = sharding.shard_input(x, [y], r, 4, equal=True, whole_if_short=True)
        assert got is x and got_y is y
    with pytest.raises(TransparentModeError, match="3 rows cannot be shared by 4 ranks"):
        sharding.shard_input(x, [y], 0, 4, equal=True)  # fit
    ds = tf.data.Dataset.range(3)
    assert sharding.shard_dataset(ds, 3, 4, equal=True, whole_if_short=True) is ds
    unknown = ds.filter(lambda v: True)
    assert sharding.shard_dataset(unknown, 3, 4, equal=True, agree=lambda c: [0],
                                  whole_if_short=True) is unknown
    empty = ds.filter(lambda v: False)  # nothing to fall back to: still an error
    with pytest.raises(TransparentModeError, match="for 4 ranks"):
        sharding.shard_dataset(empty, 0, 4, equal=True, agree=lambda c: [0], whole_if_short=True)
    assert [list(sharding.shard_generator(iter(range(3)), r, 4, equal=True, whole_if_short=True))
            for r in range(4)] == [[0, 1, 2]] * 4
    with pytest.raises(TransparentModeError, match="yielded 3 item"):
        list(sharding.shard_generator(iter(range(3)), 3, 4, equal=True))


def test_a_rank_with_an_empty_predict_share_predicts_a_stand_in():
    x = np.arange(6).reshape(3, 2)
    shares = [predict_share.shard_for_predict(x, r, 4) for r in range(4)]
    assert [s.stand_in for s in shares] == [False, False, False, True]
    assert [s.x.tolist() for s in shares] == [[[0, 1]], [[2, 3]], [[4, 5]], [[0, 1]]]
    none = predict_share.shard_for_predict(x[:0], 3, 4)  # nothing at all: Keras's own error
    assert not none.stand_in and none.x.shape == (0, 2)
    for ds in (tf.data.Dataset.range(3), tf.data.Dataset.range(3).filter(lambda v: True)):
        shares = [predict_share.shard_for_predict(ds, r, 4) for r in range(4)]
        assert [s.stand_in for s in shares] == [False, False, False, True]
        assert [list(s.x.as_numpy_iterator()) for s in shares] == [[0], [1], [2], [0]]
    shares = [predict_share.shard_for_predict(iter(range(3)), r, 4) for r in range(4)]
    assert [list(s.x) for s in shares] == [[0], [1], [2], [0]]  # consumed: stand_in is known
    assert [s.stand_in for s in shares] == [False, False, False, True]
    assert list(predict_share.shard_for_predict(iter(range(9)), 1, 4).x) == [1, 5]
    dropped = predict_share.drop({"a": np.ones((1, 2), np.float16)})
    assert dropped["a"].shape == (0, 2) and dropped["a"].dtype == np.float16
