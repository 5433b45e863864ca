"""The worker: what horovodrun starts on every slot (`python -m transientvod.worker.train`).

The training loop in named phases (train.py), what each worker sets up (setup.py), the digits
data and the ResNet, the elastic state with its commits and schedules, evaluation and the
cost meter. The user's own task plugs in through `transientvod.tasks`.
"""
