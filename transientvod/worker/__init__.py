"""The worker: what horovodrun starts on every slot (`python -m transientvod.worker.train`).

The training loop in named phases (train.py), what each worker sets up (setup.py), the elastic
state (state.py) with its commits (commit.py) and schedules (schedule.py), evaluation and the
cost meter's hooks (accounting.py). The task, the user's or the built-in ResNet on the digits
(tasks/resnet/), plugs in through `transientvod.tasks`.
"""
