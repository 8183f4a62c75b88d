"""A plain single-process Keras script that makes its own directories and writes its own files,
as keras-io's guides do, run unchanged on every rank under ``python -m hpcrep``.

    own_files_job.py OUT

Run it from OUT: like keras-io's distributed-training guide it makes ``./ckpt`` if it is missing,
then many directories more, each with ``if not os.path.exists(d): os.makedirs(d)`` (or
``os.mkdir``) right after ``fit``, where the ranks leave their last collective together. Then it
writes, from every process, to the same paths: a PNG with PIL, a figure with matplotlib, an array
with ``np.save`` and ``np.savetxt``, a text file with ``open`` and one with ``pathlib``. What it
writes depends on its process id, so a test can tell whose file ended on disk; it reads its text
files back and fails if it does not get what it wrote. It prints its pid (rank 0's stdout alone
shows under ``python -m hpcrep``).
"""

import os
import pathlib

import keras
import matplotlib
import numpy as np
from PIL import Image

matplotlib.use("Agg")
import matplotlib.pyplot as plt

DIRS = 400

checkpoint_dir = "./ckpt"
if not os.path.exists(checkpoint_dir):
    os.makedirs(checkpoint_dir)

data = np.random.default_rng(0)
x = data.normal(size=(64, 4)).astype("float32")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0)

for i in range(DIRS):
    d = os.path.join(checkpoint_dir, f"epoch-{i}")
    if not os.path.exists(d):
        if i % 2:
            os.mkdir(d)
        else:
            os.makedirs(os.path.join(d, "logs"))

pid = os.getpid()
mine = np.random.default_rng(pid)
pixels = mine.integers(0, 256, size=(96, 128, 3), dtype=np.uint8)
Image.fromarray(pixels).save("generated_img_0.png")
plt.imshow(pixels)
plt.savefig("figure.png")
np.save("array.npy", mine.normal(size=200_000))
np.savetxt("values.txt", mine.normal(size=(50, 3)))
text = f"written by process {pid}\n" * 1000
with open("notes.txt", "w") as f:
    f.write(text)
pathlib.Path("notes2.txt").write_text(text)

with open("notes.txt") as f:
    back = f.read()
if back != text or pathlib.Path("notes2.txt").read_text() != text:
    raise SystemExit(f"process {pid} read back another process's text: {back[:40]!r}")
print(f"own_files_job: pid {pid}")
print(back.splitlines()[0])
