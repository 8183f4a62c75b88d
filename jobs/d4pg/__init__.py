"""D4PG (Barth-Maron et al. 2018): a data-parallel learner on ``hvd.DistributedGradientTape``
(:mod:`jobs.d4pg.learning`) fed by one actor per rank (:mod:`jobs.d4pg.acting`);
:mod:`jobs.d4pg.train` runs them."""
