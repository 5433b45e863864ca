"""Library mode: transientvod's pieces for a script that keeps its own Horovod elastic loop
(docs/library-mode.md). `transientvod train --config FILE --script my_train.py -- ARGS` runs it
with the spot machinery; `horovodrun python my_train.py` runs it with the defaults.

    optimizer.py  DistributedOptimizer: hvd.DistributedOptimizer's drop-in, through the exchange
    state.py      ElasticState: TorchState with durable checkpoints, notices, the bill and MLflow
    job.py        the job's config (JOB_CONFIG_ENV, set by the launcher) and its records

The names are imported from `transientvod` (its __init__ loads them when first used, so that
the CLI does not import torch and Horovod).
"""
