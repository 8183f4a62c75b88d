"""One GPU per rank through the real entry points, on CPU: ``hvd.init()``, ``python -m hpcrep``
(transparent mode) and ``hpcrep run`` each leave local rank i with only entry ``i % n`` of a
user-set ``CUDA_VISIBLE_DEVICES`` (n entries); ``HPCREP_PIN_GPU=0`` leaves the list alone."""

import re
import subprocess
from pathlib import Path

import pytest

SCRIPT = str(Path(__file__).with_name("print_gpu.py"))


def seen(stderr: str) -> dict[str, str]:
    # Ranks write to one pipe: lines may run together, so match the pieces, not whole lines.
    return dict(re.findall(r"local_rank (\d+) sees ([0-9,]+|<unset>)", stderr))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("entry", ["hvd.init", "python -m hpcrep"])
def test_each_rank_keeps_one_of_the_users_gpus(entry, mpirun):
    command = [mpirun.python, SCRIPT, "explicit"] if entry == "hvd.init" else [
        mpirun.python, "-m", "hpcrep", SCRIPT, "plain"]
    done = mpirun.run(3, command, env={"CUDA_VISIBLE_DEVICES": "4,7"}, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert seen(done.stderr) == {"0": "4", "1": "7", "2": "4"}, done.stderr[-3000:]

    off = mpirun.run(2, command, env={"CUDA_VISIBLE_DEVICES": "4,7", "HPCREP_PIN_GPU": "0"},
                     timeout=240)
    assert off.returncode == 0, off.stderr[-3000:]
    assert seen(off.stderr) == {"0": "4,7", "1": "4,7"}, off.stderr[-3000:]


@pytest.mark.timeout(300)
def test_hpcrep_run_pins_too(mpirun):
    # --transparent: the script imports hpcrep.tensorflow (for its "explicit" case), which
    # would make hpcrep run start it as it is
    done = subprocess.run([mpirun.python, "-m", "hpcrep.cli", "run", "-n", "2", "--launcher",
                           "mpirun", "--transparent", SCRIPT, "plain"], capture_output=True,
                          text=True, env=mpirun.env({"CUDA_VISIBLE_DEVICES": "1,0"}), timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert seen(done.stderr) == {"0": "1", "1": "0"}, done.stderr[-3000:]
