"""The three reference workloads of TF-Replicator (Buchlovsky et al. 2019), as importable code.

- :mod:`bench.models.resnet`: ResNet-50 image classification (He et al. 2016), SGD + momentum,
  learning rate scaled by the global batch with warm-up (Goyal et al. 2017);
- :mod:`bench.models.sngan`: class-conditional SN-GAN (Miyato & Koyama 2018);
- :mod:`bench.models.d4pg`: D4PG (Barth-Maron et al. 2018) on gymnasium ``Pendulum-v1``.

Every module imports TensorFlow; the distributed parts use ``hpcrep.tensorflow`` only.
"""
