"""hvd.callbacks.BackupAndRestore made from Keras's: same settings, and a user's subclass keeps
its own methods."""

import keras

from hpcrep.tensorflow._keras.backup_and_restore import BackupAndRestore


def test_a_users_backup_subclass_keeps_its_hooks():
    class Mine(keras.callbacks.BackupAndRestore):
        def note(self):
            return "mine"

    plain = BackupAndRestore.from_keras(keras.callbacks.BackupAndRestore("/tmp/x", save_freq=3))
    assert type(plain) is BackupAndRestore and plain.save_freq == 3
    assert BackupAndRestore.from_keras(plain) is plain
    mine = BackupAndRestore.from_keras(Mine("/tmp/y", double_checkpoint=True))
    assert isinstance(mine, BackupAndRestore) and isinstance(mine, Mine)
    assert mine.note() == "mine" and mine.double_checkpoint and mine.backup_dir == "/tmp/y"
    assert type(BackupAndRestore.from_keras(Mine("/tmp/z"))) is type(mine)  # one class per kind
