"""ResNet-50 image classification (He et al. 2016) trained as in Goyal et al. (2017), data-parallel
with ``hvd.DistributedGradientTape``: :mod:`jobs.resnet.model` (networks, learning-rate schedule,
the compiled step), :mod:`jobs.resnet.train` (data, training loop, benchmark entry)."""
